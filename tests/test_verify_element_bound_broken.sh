#!/bin/sh
# make check: the forward element's bounds one rounding too tight must make their proofs fail.  Copies the
# sources WP reads and changes gemm_naive_fwd_element's `bound_fwd` (ref/gemm_naive_internal.h) to gamma_k(K - 1)
# for gamma_k(K), and its `bound_fwd_weighted` to within_dot_bound at K - 1 for K: both bounds are false (K = 1:
# one rounded product is not within 4 eta of the exact one; with a weight, two roundings are not within
# u |y| + eta of it); expects specs/verify.sh to fail on exactly those two ensures clauses.  Were the
# clauses' hypotheses contradictory, or the imported axioms (specs/float_bounds.mlw's FdotStepStatement,
# WeightStepStatement) inconsistent with WP's model, the planted clauses would be proved.  Skipped (exit 77)
# without Frama-C.
. "$srcdir/tests/verify_lib.sh"
verify_require test_verify_element_bound_broken
set -eu
fail() { echo "test_verify_element_bound_broken: FAIL: $*" >&2; exit 1; }
work=tests/verify-element-bound-broken
verify_copy_tree "$work"
good='          gamma_k(p->K) \* \\old(dot_abs_strided('
bad='          gamma_k(p->K - 1) * \\old(dot_abs_strided('
good_w='          p->K, unit_f32,$'
bad_w='          p->K - 1, unit_f32,'
sed -e "s/^$good/$bad/" -e "s/^$good_w/$bad_w/" "$srcdir/ref/gemm_naive_internal.h" > "$work/tree/ref/gemm_naive_internal.h"
grep -q '^          gamma_k(p->K - 1) \* \\old(dot_abs_strided(' "$work/tree/ref/gemm_naive_internal.h" ||
    fail "could not plant the change in bound_fwd (did it change?)"
grep -q '^          p->K - 1, unit_f32,$' "$work/tree/ref/gemm_naive_internal.h" ||
    fail "could not plant the change in bound_fwd_weighted (did it change?)"
diff "$srcdir/ref/gemm_naive_internal.h" "$work/tree/ref/gemm_naive_internal.h" || true
if VERIFY_ONLY=gemm_naive_fwd_element FRAMAC=$FRAMAC WHY3=$WHY3 PYTHON=$PYTHON \
        sh "$srcdir/specs/verify.sh" "$work/tree" "$work/wp" > "$work/verify.log" 2>&1; then
    cat "$work/verify.log"
    fail "WP proved gemm_naive_fwd_element's bounds with K - 1"
fi
cat "$work/verify.log"
grep -q "gemm_naive_fwd_element_ensures_bound_fwd UNPROVED" "$work/wp/goals-unique.txt" ||
    fail "verify failed, but not on gemm_naive_fwd_element's bound_fwd"
grep -q "gemm_naive_fwd_element_ensures_bound_fwd_weighted UNPROVED" "$work/wp/goals-unique.txt" ||
    fail "verify failed, but not on gemm_naive_fwd_element's bound_fwd_weighted"
unproved=$(grep -c " UNPROVED$" "$work/wp/goals-unique.txt")
[ "$unproved" = 2 ] || fail "$unproved goals unproved, where only bound_fwd and bound_fwd_weighted should be"
echo "test_verify_element_bound_broken: ok: the element's bounds at K - 1 are reported as unproved goals, the only two"
