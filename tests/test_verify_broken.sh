#!/bin/sh
# make check: a deliberately broken bound must make the proof fail.  Copies the sources WP reads, makes the
# loop of moe_ref_expert_offsets (ref/routing.c) run one step further, so that it writes offsets[E + 1],
# one element past its [E + 1] range, and expects specs/verify.sh to fail on that function with an
# unproved memory-access goal.  Skipped (exit 77) without Frama-C.
. "$srcdir/tests/verify_lib.sh"
verify_require test_verify_broken
set -eu
work=tests/verify-broken
verify_copy_tree "$work"
good='^    for (int64_t e = 0; e < num_experts; e++)$'
sed "/$good/{N;s/e < num_experts; e++)\(\n        offsets\[e + 1\]\)/e <= num_experts; e++)\1/;}" \
    "$srcdir/ref/routing.c" > "$work/tree/ref/routing.c"
if ! grep -A1 'e <= num_experts; e++)$' "$work/tree/ref/routing.c" | grep -q 'offsets\[e + 1\] = offsets\[e\]'; then
    echo "test_verify_broken: FAIL: could not inject the bug (did moe_ref_expert_offsets change?)" >&2
    exit 1
fi
diff "$srcdir/ref/routing.c" "$work/tree/ref/routing.c" || true
if VERIFY_ONLY=moe_ref_expert_offsets FRAMAC=$FRAMAC WHY3=$WHY3 PYTHON=$PYTHON \
        sh "$srcdir/specs/verify.sh" "$work/tree" "$work/wp" > "$work/verify.log" 2>&1; then
    cat "$work/verify.log"
    echo "test_verify_broken: FAIL: WP proved the out-of-bounds write" >&2
    exit 1
fi
cat "$work/verify.log"
if ! grep -q "moe_ref_expert_offsets_assert_rte_mem_access.* UNPROVED" "$work/wp/goals-unique.txt"; then
    echo "test_verify_broken: FAIL: verify failed, but not on the out-of-bounds access" >&2
    exit 1
fi
echo "test_verify_broken: ok: the write one past offsets[] is reported as an unproved goal"
