#!/bin/sh
# make check: a smoke test that fails must fail the proof, naming the function and the line.  Copies the
# sources WP reads, plants in moe_mul_ok (src/errors.c) a branch that its first test already excludes
# (`if (a < 0) return 0;` after the return for a < 0: unreachable, and harmless to every other goal), and
# expects specs/verify.sh to fail on that function's smoke test at the planted line, with every goal
# proved.  Skipped (exit 77) without Frama-C.
. "$srcdir/tests/verify_lib.sh"
verify_require test_verify_smoke
set -eu
fail() { echo "test_verify_smoke: FAIL: $*" >&2; exit 1; }
work=tests/verify-smoke
verify_copy_tree "$work"
good='^    if (a != 0 \&\& b > INT64_MAX \/ a)$'
sed "/$good/{N;s/\$/\n    if (a < 0)\n        return 0;/;}" "$srcdir/src/errors.c" > "$work/tree/src/errors.c"
line=$(grep -n '^    if (a < 0)$' "$work/tree/src/errors.c" | cut -d: -f1)
[ -n "$line" ] || fail "could not plant the branch (did moe_mul_ok change?)"
diff "$srcdir/src/errors.c" "$work/tree/src/errors.c" || true
if VERIFY_SMOKE=1 VERIFY_ONLY=moe_mul_ok FRAMAC=$FRAMAC WHY3=$WHY3 PYTHON=$PYTHON \
        sh "$srcdir/specs/verify.sh" "$work/tree" "$work/wp" > "$work/verify.log" 2>&1; then
    cat "$work/verify.log"
    fail "the proof passed with an unreachable branch"
fi
cat "$work/verify.log"
grep -q " UNPROVED$" "$work/wp/goals-unique.txt" && fail "a goal failed: the planted branch should change only the smoke tests"
grep -q "^  moe_mul_ok: unreachable code at src/errors.c:$((line + 1)) (typed_moe_mul_ok_wp_smoke_dead_code_" "$work/verify.log" ||
    fail "the run failed without naming moe_mul_ok's unreachable code at src/errors.c:$((line + 1))"
echo "test_verify_smoke: ok: the unreachable branch fails the proof, named with its function and line"
