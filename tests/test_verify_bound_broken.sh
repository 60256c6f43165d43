#!/bin/sh
# make check: a bound one rounding too tight must make the bound proof fail.  Copies the sources WP reads
# and changes gemm_naive_fwd_dot's `bound_fwd_dot` (ref/gemm_naive_internal.h) to gamma_k(K - 1) for
# gamma_k(K), a bound that is false (K = 1: one rounded product is not within 4 eta of the exact one);
# expects specs/verify.sh to fail on that ensures clause.  Were the clause's hypotheses (fdot_bound_premise,
# specs/gemm_value.acsl) contradictory, or the imported step axiom (specs/float_bounds.mlw's
# FdotStepStatement) inconsistent with WP's model, the planted clause would be proved.  Skipped (exit 77)
# without Frama-C.
. "$srcdir/tests/verify_lib.sh"
verify_require test_verify_bound_broken
set -eu
fail() { echo "test_verify_bound_broken: FAIL: $*" >&2; exit 1; }
work=tests/verify-bound-broken
verify_copy_tree "$work"
good='          gamma_k(p->K) \* dot_abs_strided('
bad='          gamma_k(p->K - 1) * dot_abs_strided('
sed "s/^$good/$bad/" "$srcdir/ref/gemm_naive_internal.h" > "$work/tree/ref/gemm_naive_internal.h"
grep -q '^          gamma_k(p->K - 1) \* dot_abs_strided(' "$work/tree/ref/gemm_naive_internal.h" ||
    fail "could not plant the change (did bound_fwd_dot change?)"
diff "$srcdir/ref/gemm_naive_internal.h" "$work/tree/ref/gemm_naive_internal.h" || true
if VERIFY_ONLY=gemm_naive_fwd_dot FRAMAC=$FRAMAC WHY3=$WHY3 PYTHON=$PYTHON \
        sh "$srcdir/specs/verify.sh" "$work/tree" "$work/wp" > "$work/verify.log" 2>&1; then
    cat "$work/verify.log"
    fail "WP proved gemm_naive_fwd_dot's bound with gamma_k(K - 1)"
fi
cat "$work/verify.log"
grep -q "gemm_naive_fwd_dot_ensures_bound_fwd_dot UNPROVED" "$work/wp/goals-unique.txt" ||
    fail "verify failed, but not on gemm_naive_fwd_dot's bound_fwd_dot"
unproved=$(grep -c " UNPROVED$" "$work/wp/goals-unique.txt")
[ "$unproved" = 1 ] || fail "$unproved goals unproved, where only bound_fwd_dot should be"
echo "test_verify_bound_broken: ok: the bound with gamma_k(K - 1) is reported as an unproved goal, the only one"
