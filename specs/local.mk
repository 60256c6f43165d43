# specs/: semantics decisions, the ACSL logic and the Frama-C/WP proof run (issue 5).
EXTRA_DIST += specs/SEMANTICS.md specs/DECISIONS.md specs/README.md specs/VERIFY-SUMMARY.md specs/THRESHOLDS.md \
	specs/routing.acsl specs/arith.acsl specs/mlp_layout.acsl specs/gemm.acsl specs/gemm_blocked.acsl \
	specs/gemm_value.acsl specs/gemm_value.driver specs/float_bounds.mlw \
	specs/mlp.acsl specs/mlp_index.acsl specs/mlp_fwd.acsl specs/mlp_bwd.acsl specs/mlp_problem.acsl \
	specs/verify.sh specs/PROPTEST.md specs/wp-cache.txt specs/cvc5.drv specs/why3_cvc5.sh specs/proof_reports.py specs/verify_cold.py \
	specs/PROOF-TABLE.md specs/TRUSTED.md
DISTCLEANFILES += specs/verify-config.sh

# make verify: prove every listed reference function with Frama-C/WP (specs/verify.sh has the pinned
# flags and the list), write the per-function summary to specs/VERIFY-SUMMARY.md, the reports
# specs/PROOF-TABLE.md and specs/TRUSTED.md (specs/proof_reports.py), and fail on any unproved goal or
# failed smoke test.  The session, logs and why3 configuration stay in the build folder (specs/wp/).
# With VERIFY_ONLY (a partial run) the committed summary, reports and cache are left as they are: the
# partial ones stay in specs/wp/.
# make verify-cold: the same proof with no cache (VERIFY_CACHE=none: every goal goes to the provers), in
# specs/wp-cold/, then specs/verify_cold.py: a goal that specs/wp-cache.txt says proved and this run does
# not prove fails it, named.  Hours on two cores; not part of make check (tests/test_verify_cold.sh checks
# the comparison on one function).  VERIFY_ONLY restricts it as it does make verify.
# make proof-reports: rewrites specs/PROOF-TABLE.md and specs/TRUSTED.md from the sources and the committed
# summary, without a proof (after a contract changed; make check fails while they are stale).
if MOE_FRAMAC
verify:
	rm -f specs/wp/wp-cache.txt
	FRAMAC='$(FRAMAC)' WHY3='$(WHY3)' PYTHON='$(PYTHON)' $(SHELL) $(srcdir)/specs/verify.sh $(srcdir) specs/wp specs/wp/VERIFY-SUMMARY.md
	@if [ -n "$(VERIFY_ONLY)$${VERIFY_ONLY:-}" ]; then \
	  echo "verify: VERIFY_ONLY: partial summary and reports in specs/wp/ ($(srcdir)/specs/ left as it is)"; \
	elif [ -w $(srcdir)/specs ]; then \
	  for f in VERIFY-SUMMARY.md PROOF-TABLE.md TRUSTED.md; do cp specs/wp/$$f $(srcdir)/specs/$$f || exit 1; done && \
	  echo "verify: summary and reports written to $(srcdir)/specs/"; fi
	@if [ -z "$(VERIFY_ONLY)$${VERIFY_ONLY:-}" ] && [ -w $(srcdir)/specs ] && [ -s specs/wp/wp-cache.txt ]; then \
	  cp specs/wp/wp-cache.txt $(srcdir)/specs/wp-cache.txt && \
	  echo "verify: the prover results of this run written to $(srcdir)/specs/wp-cache.txt"; fi
verify-cold:
	rm -rf specs/wp-cold
	status=0; \
	VERIFY_CACHE=none FRAMAC='$(FRAMAC)' WHY3='$(WHY3)' PYTHON='$(PYTHON)' \
	  $(SHELL) $(srcdir)/specs/verify.sh $(srcdir) specs/wp-cold specs/wp-cold/VERIFY-SUMMARY.md || status=1; \
	$(PYTHON) $(srcdir)/specs/verify_cold.py specs/wp-cold $(srcdir)/specs/wp-cache.txt || status=1; \
	exit $$status
else
verify verify-cold:
	@echo "make $@: configure did not find Frama-C, why3, z3, cvc4, cvc5 and python3 (see the configure summary)" >&2
	@exit 1
endif
.PHONY: verify verify-cold

if HAVE_PYTHON
proof-reports:
	$(PYTHON) $(srcdir)/specs/proof_reports.py --srcdir $(srcdir) --summary $(srcdir)/specs/VERIFY-SUMMARY.md \
	  --table $(srcdir)/specs/PROOF-TABLE.md --trusted $(srcdir)/specs/TRUSTED.md
else
proof-reports:
	@echo "make proof-reports: configure found no python3" >&2
	@exit 1
endif
.PHONY: proof-reports

clean-local: clean-verify
clean-verify:
	-rm -rf specs/wp specs/wp-cold tests/verify-wp tests/verify-broken tests/verify-value-broken tests/verify-bound-broken tests/verify-element-bound-broken tests/verify-smoke tests/verify-cold tests/proof-reports tests/float-bounds
.PHONY: clean-verify

# make check runs the proofs (skipped, exit 77, without Frama-C), the broken-bound (the dot's and the element's), changed-rounding-order,
# too-tight float bound and dead-code demonstrations, verify-cold's comparison on one function, the float
# error lemmas (with Gappa); and, with Python only, the reports' generator and staleness.
VERIFY_TESTS = tests/test_verify.sh tests/test_verify_broken.sh tests/test_verify_value_broken.sh \
	tests/test_verify_bound_broken.sh tests/test_verify_element_bound_broken.sh tests/test_verify_smoke.sh tests/test_verify_cold.sh tests/test_float_bounds.sh
TESTS += $(VERIFY_TESTS) tests/test_proof_reports.sh
EXTRA_DIST += $(VERIFY_TESTS) tests/test_proof_reports.sh tests/verify_lib.sh
