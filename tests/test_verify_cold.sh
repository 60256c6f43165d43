#!/bin/sh
# make check: `make verify-cold`'s comparison (specs/verify_cold.py) on one function, moe_mul_ok.  Proves it
# without the cache (VERIFY_CACHE=none), then compares: with the run's own prover results (every goal sent
# to a prover has its digests there), with the committed specs/wp-cache.txt (what make verify-cold does),
# and twice where the comparison must fail, naming the goal: a cache that says a prover proved a smoke
# goal the run did not prove, and the run's results with one goal a prover proved marked unproved.
# Skipped (exit 77) without Frama-C.
. "$srcdir/tests/verify_lib.sh"
verify_require test_verify_cold
set -eu
fail() { echo "test_verify_cold: FAIL: $*" >&2; exit 1; }
compare() { "$PYTHON" "$srcdir/specs/verify_cold.py" "$@"; }
work=tests/verify-cold
rm -rf "$work"
mkdir -p "$work"
if ! VERIFY_SMOKE=1 VERIFY_ONLY=moe_mul_ok VERIFY_CACHE=none FRAMAC=$FRAMAC WHY3=$WHY3 PYTHON=$PYTHON \
        sh "$srcdir/specs/verify.sh" "$srcdir" "$work/wp" > "$work/verify.log" 2>&1; then
    cat "$work/verify.log"
    fail "the cold proof of moe_mul_ok failed"
fi
for f in wp-cache.txt digests.txt goals-unique.txt smoke-unique.txt; do
    [ -s "$work/wp/$f" ] || fail "the cold run wrote no $f"
done

# 1. The run against its own results: every goal sent to a prover found, none contradicted.
compare "$work/wp" "$work/wp/wp-cache.txt" > "$work/self.log" || { cat "$work/self.log"; fail "the run disagrees with its own cache"; }
cat "$work/self.log"
grep -q " 0 not in the cache" "$work/self.log" || fail "goals of the run were not found by digest in its own cache"
grep -q ": [1-9][0-9]* with the cache's result" "$work/self.log" || fail "no goal was matched by digest"

# 2. Against the committed cache (a goal changed since it was written only counts as not in the cache).
compare "$work/wp" "$srcdir/specs/wp-cache.txt" || fail "a goal specs/wp-cache.txt says proved is not proved cold"

# 3. A cache that says a prover proved a smoke goal (dead code) that the run did not prove.
smoke=$(awk '$2 == "moe_mul_ok" && $4 == "passed" { print $3; exit }' "$work/wp/smoke-unique.txt")
[ -n "$smoke" ] || fail "no passed smoke test of moe_mul_ok to plant"
awk -v g="$smoke" '$2 == g { print $4 }' "$work/wp/digests.txt" > "$work/planted-digests.txt"
[ -s "$work/planted-digests.txt" ] || fail "no digest for $smoke"
awk 'FNR == NR { planted[$1] = 1; next }
     ($1 in planted) { sub(/"verdict": "[a-z]*"/, "\"verdict\": \"valid\"") } { print }' \
    "$work/planted-digests.txt" "$work/wp/wp-cache.txt" > "$work/planted-cache.txt"
if compare "$work/wp" "$work/planted-cache.txt" > "$work/planted.log"; then
    cat "$work/planted.log"; fail "the comparison passed a cache that says $smoke was proved"
fi
grep -q "FAIL: src/errors.c: moe_mul_ok: smoke test $smoke: the cache says" "$work/planted.log" ||
    { cat "$work/planted.log"; fail "the comparison failed without naming $smoke"; }

# 4. The run's results with a goal a prover proved marked unproved, against the run's own cache.
goal=$(awk '{ print $2 }' "$work/wp/digests.txt" | grep -v _wp_smoke_ | head -1)
[ -n "$goal" ] || fail "no goal of moe_mul_ok went to a prover"
mkdir -p "$work/flipped"
cp "$work/wp/digests.txt" "$work/wp/smoke-unique.txt" "$work/flipped/"
awk -v g="$goal" '$3 == g { $4 = "UNPROVED" } { print }' "$work/wp/goals-unique.txt" > "$work/flipped/goals-unique.txt"
grep -q " $goal UNPROVED$" "$work/flipped/goals-unique.txt" || fail "could not mark $goal unproved"
if compare "$work/flipped" "$work/wp/wp-cache.txt" > "$work/flipped.log"; then
    cat "$work/flipped.log"; fail "the comparison passed a run that did not prove $goal"
fi
grep -q "FAIL: src/errors.c: moe_mul_ok: goal $goal: the cache says" "$work/flipped.log" ||
    { cat "$work/flipped.log"; fail "the comparison failed without naming $goal"; }
echo "test_verify_cold: ok: the cold run matches its cache and specs/wp-cache.txt; both planted contradictions fail, named"
