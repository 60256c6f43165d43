# specs/: semantics decisions, the ACSL logic and the Frama-C/WP proof run (issue 5).
EXTRA_DIST += specs/SEMANTICS.md specs/DECISIONS.md specs/README.md specs/VERIFY-SUMMARY.md specs/THRESHOLDS.md \
	specs/routing.acsl specs/arith.acsl specs/mlp_layout.acsl specs/gemm.acsl specs/gemm_blocked.acsl \
	specs/gemm_value.acsl specs/gemm_value.driver \
	specs/mlp.acsl specs/mlp_index.acsl specs/mlp_fwd.acsl specs/mlp_bwd.acsl specs/mlp_problem.acsl \
	specs/verify.sh specs/PROPTEST.md specs/wp-cache.txt
DISTCLEANFILES += specs/verify-config.sh

# make verify: prove every listed reference function with Frama-C/WP (specs/verify.sh has the pinned
# flags and the list), write the per-function summary to specs/VERIFY-SUMMARY.md and fail on any
# unproved goal.  The session, logs and why3 configuration stay in the build folder (specs/wp/).
# With VERIFY_ONLY (a partial run) the committed summary and cache are left as they are: the partial
# summary stays in specs/wp/VERIFY-SUMMARY.md.
if MOE_FRAMAC
verify:
	rm -f specs/wp/wp-cache.txt
	FRAMAC='$(FRAMAC)' WHY3='$(WHY3)' $(SHELL) $(srcdir)/specs/verify.sh $(srcdir) specs/wp specs/wp/VERIFY-SUMMARY.md
	@if [ -n "$(VERIFY_ONLY)$${VERIFY_ONLY:-}" ]; then \
	  echo "verify: VERIFY_ONLY: partial summary in specs/wp/VERIFY-SUMMARY.md ($(srcdir)/specs/ left as it is)"; \
	elif [ -w $(srcdir)/specs ]; then cp specs/wp/VERIFY-SUMMARY.md $(srcdir)/specs/VERIFY-SUMMARY.md && \
	  echo "verify: summary written to $(srcdir)/specs/VERIFY-SUMMARY.md"; fi
	@if [ -z "$(VERIFY_ONLY)$${VERIFY_ONLY:-}" ] && [ -w $(srcdir)/specs ] && [ -s specs/wp/wp-cache.txt ]; then \
	  cp specs/wp/wp-cache.txt $(srcdir)/specs/wp-cache.txt && \
	  echo "verify: the prover results of this run written to $(srcdir)/specs/wp-cache.txt"; fi
else
verify:
	@echo "make verify: configure did not find Frama-C, why3, z3 and cvc4 (see the configure summary)" >&2
	@exit 1
endif
.PHONY: verify

clean-local: clean-verify
clean-verify:
	-rm -rf specs/wp tests/verify-wp tests/verify-broken tests/verify-value-broken
.PHONY: clean-verify

# make check runs the proofs (skipped, exit 77, without Frama-C), the broken-bound demonstration and the
# changed-rounding-order one.
VERIFY_TESTS = tests/test_verify.sh tests/test_verify_broken.sh tests/test_verify_value_broken.sh
TESTS += $(VERIFY_TESTS)
EXTRA_DIST += $(VERIFY_TESTS)
