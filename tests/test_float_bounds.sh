#!/bin/sh
# make check: the float error lemmas of specs/float_bounds.mlw.  Gappa proves the per-operation bounds
# (mul_error, add_error) and Z3 the dot product's inductive step (dot_step, from them); then a bound planted
# one bit too tight (2^-25 for binary32's unit roundoff 2^-24) must not be proved.  Skipped (exit 77)
# without why3 (configure's) or where why3 does not detect Gappa (the Debian package gappa).
. "$srcdir/tests/verify_lib.sh"
verify_require test_float_bounds
set -eu
fail() { echo "test_float_bounds: FAIL: $*" >&2; exit 1; }
work=tests/float-bounds
rm -rf "$work"
mkdir -p "$work"
WHY3CONFIG=$work/why3.conf
export WHY3CONFIG
"$WHY3" config detect -C "$WHY3CONFIG" > "$work/detect.log" 2>&1 || { cat "$work/detect.log"; fail "why3 config detect failed"; }
if ! grep -q '^Found prover Gappa version [^ ]*, OK' "$work/detect.log"; then
    echo "test_float_bounds: why3 did not detect Gappa; skipping"
    exit 77
fi
# prove FILE PROVER GOAL...: why3's answer for each goal, one "GOAL RESULT" line each
prove() {
    file=$1 prover=$2
    shift 2
    for goal in "$@"; do
        "$WHY3" prove -P "$prover" -t 30 "$file" -T F32Bounds -G "$goal" > "$work/$goal.log" 2>&1 || true
        echo "$goal $(sed -n 's/^Prover result is: \([A-Za-z ]*\).*/\1/p' "$work/$goal.log" | head -1)"
    done
}
prove "$srcdir/specs/float_bounds.mlw" gappa mul_error add_error > "$work/results.txt"
prove "$srcdir/specs/float_bounds.mlw" z3 dot_step >> "$work/results.txt"
cat "$work/results.txt"
bad=$(awk '$2 != "Valid"' "$work/results.txt")
[ -z "$bad" ] || fail "not proved: $bad"
sed 's/constant u : real = 0x1p-24$/constant u : real = 0x1p-25/' "$srcdir/specs/float_bounds.mlw" > "$work/too_tight.mlw"
grep -q 'constant u : real = 0x1p-25$' "$work/too_tight.mlw" || fail "could not plant the tighter bound"
prove "$work/too_tight.mlw" gappa mul_error > "$work/planted.txt"
cat "$work/planted.txt"
grep -q '^mul_error Valid' "$work/planted.txt" && fail "Gappa proved the product's bound with u = 2^-25"
echo "test_float_bounds: ok: the per-operation bounds and the step are proved; a bound one bit too tight is not"
