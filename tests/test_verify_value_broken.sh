#!/bin/sh
# make check: a changed rounding order must make the value proof fail.  Copies the sources WP reads and
# changes gemm_naive_fwd_dot's accumulation (ref/gemm_naive_value.c) so that each product is added to the
# running sum in double and the sum rounded to float once, as a fused multiply-add would (the product is
# no longer rounded to binary32 before the addition); expects specs/verify.sh to fail on the loop
# invariant `value` (the sum equals fdot, specs/gemm_value.acsl).  Skipped (exit 77) without Frama-C.
. "$srcdir/tests/verify_lib.sh"
verify_require test_verify_value_broken
set -eu
fail() { echo "test_verify_value_broken: FAIL: $*" >&2; exit 1; }
work=tests/verify-value-broken
verify_copy_tree "$work"
good='        acc += moe_ref_load(p->dtype, x, xr \* K + c) \* moe_ref_load(p->dtype, w, w_row \* K + c);'
bad='        acc = (float)((double)acc + (double)moe_ref_load(p->dtype, x, xr * K + c) * (double)moe_ref_load(p->dtype, w, w_row * K + c));'
sed "s/^$good\$/$bad/" "$srcdir/ref/gemm_naive_value.c" > "$work/tree/ref/gemm_naive_value.c"
grep -q '(float)((double)acc + (double)moe_ref_load(p->dtype, x' "$work/tree/ref/gemm_naive_value.c" ||
    fail "could not plant the change (did gemm_naive_fwd_dot change?)"
diff "$srcdir/ref/gemm_naive_value.c" "$work/tree/ref/gemm_naive_value.c" || true
if VERIFY_ONLY=gemm_naive_fwd_dot FRAMAC=$FRAMAC WHY3=$WHY3 PYTHON=$PYTHON \
        sh "$srcdir/specs/verify.sh" "$work/tree" "$work/wp" > "$work/verify.log" 2>&1; then
    cat "$work/verify.log"
    fail "WP proved gemm_naive_fwd_dot's value with the product not rounded"
fi
cat "$work/verify.log"
grep -q "gemm_naive_fwd_dot_loop_invariant_value_preserved UNPROVED" "$work/wp/goals-unique.txt" ||
    fail "verify failed, but not on gemm_naive_fwd_dot's value invariant"
echo "test_verify_value_broken: ok: the unrounded product is reported as an unproved value goal"
