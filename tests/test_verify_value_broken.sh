#!/bin/sh
# make check: a changed rounding order must make the value proof fail.  Copies the sources WP reads and
# changes fwd_dot's accumulation (ref/gemm_naive.c) so that each product is added to the running sum in
# double and the sum rounded to float once, as a fused multiply-add would (the product is no longer rounded
# to binary32 before the addition); expects specs/verify.sh to fail on fwd_dot's loop invariant `value`
# (the sum equals fdot, specs/gemm_value.acsl).  Skipped (exit 77) without Frama-C.
. ./specs/verify-config.sh
if [ -z "$FRAMAC" ]; then
    echo "test_verify_value_broken: Frama-C/why3/z3/cvc4 not configured; skipping"
    exit 77
fi
set -eu
work=tests/verify-value-broken
rm -rf "$work"
mkdir -p "$work/tree"
for dir in include backend src ref specs; do cp -R "$srcdir/$dir" "$work/tree/"; done
chmod -R u+w "$work/tree"
good='        acc += moe_ref_load(p->dtype, x, xr \* K + c) \* moe_ref_load(p->dtype, w, w_row \* K + c);'
bad='        acc = (float)((double)acc + (double)moe_ref_load(p->dtype, x, xr * K + c) * (double)moe_ref_load(p->dtype, w, w_row * K + c));'
sed "s/^$good\$/$bad/" "$srcdir/ref/gemm_naive.c" > "$work/tree/ref/gemm_naive.c"
if ! grep -q '(float)((double)acc + (double)moe_ref_load(p->dtype, x' "$work/tree/ref/gemm_naive.c"; then
    echo "test_verify_value_broken: FAIL: could not plant the change (did fwd_dot change?)" >&2
    exit 1
fi
diff "$srcdir/ref/gemm_naive.c" "$work/tree/ref/gemm_naive.c" || true
if VERIFY_ONLY=fwd_dot FRAMAC=$FRAMAC WHY3=$WHY3 \
        sh "$srcdir/specs/verify.sh" "$work/tree" "$work/wp" > "$work/verify.log" 2>&1; then
    cat "$work/verify.log"
    echo "test_verify_value_broken: FAIL: WP proved fwd_dot's value with the product not rounded" >&2
    exit 1
fi
cat "$work/verify.log"
if ! grep -q "fwd_dot_loop_invariant_value_preserved UNPROVED" "$work/wp/goals-unique.txt"; then
    echo "test_verify_value_broken: FAIL: verify failed, but not on fwd_dot's value invariant" >&2
    exit 1
fi
echo "test_verify_value_broken: ok: the unrounded product is reported as an unproved value goal"
