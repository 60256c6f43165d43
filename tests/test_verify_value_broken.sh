#!/bin/sh
# make check: a changed rounding order must make the value proofs fail.  Copies the sources WP reads and
# plants two changes:
#   - gemm_naive_fwd_dot's accumulation (ref/gemm_naive_dot.c) adds each product to the running sum in double and rounds the sum
#     to float once, as a fused multiply-add would (the product is no longer rounded to binary32 before the
#     addition);
#   - gemm_naive_dx_dot (ref/gemm_naive_dot.c too) sums its products in reverse order (step n reads dy[dyr][N - 1 - n] and
#     w[e][N - 1 - n][c]: the same products, every index still inside its tensor, another order of the
#     binary32 additions);
# expects specs/verify.sh to fail on each one's loop invariant `value` (the sum equals fdot / fdot_strided,
# specs/gemm_value.acsl).  Skipped (exit 77) without Frama-C.
. "$srcdir/tests/verify_lib.sh"
verify_require test_verify_value_broken
set -eu
fail() { echo "test_verify_value_broken: FAIL: $*" >&2; exit 1; }
work=tests/verify-value-broken
verify_copy_tree "$work"
good='        acc += moe_ref_load(p->dtype, x, xr \* K + c) \* moe_ref_load(p->dtype, w, w_row \* K + c);'
bad='        acc = (float)((double)acc + (double)moe_ref_load(p->dtype, x, xr * K + c) * (double)moe_ref_load(p->dtype, w, w_row * K + c));'
dx_good_row='        const int64_t w_row = e \* N + n; \/\* row of w viewed as \[E \* N\]\[K\] \*\/'
dx_bad_row='        const int64_t w_row = e * N + (N - 1 - n); \/* reversed (planted) *\/'
dx_good='        acc += moe_ref_load(p->dtype, dy, dyr \* N + n) \* moe_ref_load(p->dtype, w, w_row \* K + c);'
dx_bad='        acc += moe_ref_load(p->dtype, dy, dyr * N + (N - 1 - n)) * moe_ref_load(p->dtype, w, w_row * K + c);'
sed -e "s/^$good\$/$bad/" -e "s/^$dx_good_row\$/$dx_bad_row/" -e "s/^$dx_good\$/$dx_bad/" \
    "$srcdir/ref/gemm_naive_dot.c" > "$work/tree/ref/gemm_naive_dot.c"
grep -q '(float)((double)acc + (double)moe_ref_load(p->dtype, x' "$work/tree/ref/gemm_naive_dot.c" ||
    fail "could not plant the change (did gemm_naive_fwd_dot change?)"
grep -q 'w_row = e \* N + (N - 1 - n); /\* reversed (planted)' "$work/tree/ref/gemm_naive_dot.c" &&
    grep -q 'moe_ref_load(p->dtype, dy, dyr \* N + (N - 1 - n)) \* moe_ref_load(p->dtype, w, w_row' "$work/tree/ref/gemm_naive_dot.c" ||
    fail "could not plant the reversed order (did gemm_naive_dx_dot change?)"
diff "$srcdir/ref/gemm_naive_dot.c" "$work/tree/ref/gemm_naive_dot.c" || true
if VERIFY_ONLY=gemm_naive_fwd_dot,gemm_naive_dx_dot FRAMAC=$FRAMAC WHY3=$WHY3 PYTHON=$PYTHON \
        sh "$srcdir/specs/verify.sh" "$work/tree" "$work/wp" > "$work/verify.log" 2>&1; then
    cat "$work/verify.log"
    fail "WP proved gemm_naive_fwd_dot's value with the product not rounded, and gemm_naive_dx_dot's reversed"
fi
cat "$work/verify.log"
grep -q "gemm_naive_fwd_dot_loop_invariant_value_preserved UNPROVED" "$work/wp/goals-unique.txt" ||
    fail "verify failed, but not on gemm_naive_fwd_dot's value invariant"
grep -q "gemm_naive_dx_dot_loop_invariant_value_preserved UNPROVED" "$work/wp/goals-unique.txt" ||
    fail "verify failed, but not on gemm_naive_dx_dot's value invariant"
echo "test_verify_value_broken: ok: the unrounded product and the reversed order are reported as unproved value goals"
