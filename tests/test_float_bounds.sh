#!/bin/sh
# make check: the dot product's error bound in specs/float_bounds.mlw.  Gappa proves the per-operation bounds
# (mul_error, add_error), Z3 the inductive step and its lemma functions (dot_step, mul_step, dot_step_at),
# CVC4 the real-number facts (module Gamma), cvc5 the induction over n (module FdotBound: fdot_bound_ind, and
# fdot_bound, FdotBoundStatement's axiom, as its clone's lemma) and the loop's step without sequences (module
# FdotStep: dot_step_k; module FdotStepProof: fdot_step, FdotStepStatement's axiom that specs/gemm_value.driver
# imports into WP's goals, as its clone's lemma, the one goal given whole), and the forward's weighted element:
# CVC4 its real-number facts (module WeightReal), Z3 its step (WeightStep: weight_step_at), cvc5 weight_step
# (WeightStepStatement's axiom, imported by specs/gemm_value.driver, in WeightStepProof, given whole); every
# other goal after Why3's split_vc.
# Then two planted failures must not be proved: the product's bound one bit too tight (u = 2^-25 for
# binary32's 2^-24), and fdot_bound_ind with gamma one term short (gamma (n - 1)).  Skipped
# (exit 77) without why3 (configure's) or where why3 does not detect Gappa (the Debian package gappa).
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
for prover in Z3 CVC4; do
    grep -q "^Found prover $prover version [^ ]*, OK" "$work/detect.log" || fail "why3 did not detect $prover"
done
. "$srcdir/specs/why3_cvc5.sh"
why3_add_cvc5 "$srcdir" "$work" || fail "cannot register cvc5"
# prove FILE PROVER MODULE GOAL...: why3's answer (timeout $timeout s) for each goal of MODULE (every goal of it without GOAL),
# split into its sub-goals, one "MODULE GOAL:LINE RESULT" line per sub-goal; a goal with no answer is
# reported as "none".  With split=none, the goals are given to the prover whole (no split_vc).
prove() {
    file=$1 prover=$2 module=$3
    shift 3
    log=$work/$(basename "$file" .mlw)-$module-$prover.log
    set -- $(for goal in "$@"; do printf -- '-G %s ' "$goal"; done)
    trans="-a split_vc"
    [ "${split:-}" != none ] || trans=""
    # shellcheck disable=SC2086
    "$WHY3" prove -P "$prover" -t "$timeout" $trans "$file" -T "$module" "$@" > "$log" 2>&1 || true
    awk -v m="$module" '/^Goal |^Sub-goal / { goal = $NF; sub(/\.$/, "", goal) }
        /^File / { line = ($3 == "line") ? $4 : "-"; sub(/,$/, "", line) }
        /^Prover result is: / { n++; print m, goal ":" line, $4 }
        END { if (n == 0) print m, "none", "none" }' "$log"
}
mlw=$srcdir/specs/float_bounds.mlw
# 60 s a goal, as specs/verify.sh: the slowest take 20 s on a loaded machine (bench/RESULTS.md, issue 52)
timeout=60
{
    prove "$mlw" gappa F32Bounds mul_error add_error
    prove "$mlw" z3 F32Bounds dot_step "mul_step'vc" "dot_step_at'vc"
    prove "$mlw" cvc4 Gamma
    prove "$mlw" cvc5 FdotDefs
    prove "$mlw" cvc5 FdotBound
    prove "$mlw" cvc5 FdotStep
    prove "$mlw" cvc4 WeightReal
    prove "$mlw" z3 WeightStep
    split=none
    prove "$mlw" cvc5 FdotStepProof
    prove "$mlw" cvc5 WeightStepProof
    split=
} > "$work/results.txt"
cat "$work/results.txt"
bad=$(awk '$3 != "Valid"' "$work/results.txt")
[ -z "$bad" ] || fail "not proved: $bad"
grep -q "^FdotBound fdot_bound_ind'vc" "$work/results.txt" || fail "no goal of fdot_bound_ind was proved"
grep -q "^FdotBound fdot_bound:" "$work/results.txt" || fail "FdotBoundStatement's axiom was not proved in FdotBound"
grep -q "^FdotStep dot_step_k'vc" "$work/results.txt" || fail "no goal of dot_step_k was proved"
grep -q "^FdotStepProof fdot_step:" "$work/results.txt" || fail "FdotStepStatement's axiom was not proved in FdotStepProof"
grep -q "^WeightStep weight_step_at'vc" "$work/results.txt" || fail "no goal of weight_step_at was proved"
grep -q "^WeightStepProof weight_step:" "$work/results.txt" || fail "WeightStepStatement's axiom was not proved in WeightStepProof"
# planted: the product's bound one bit too tight (both plants are false, so no timeout proves them; 10 s a goal,
# about twice the slowest goal that Gappa and cvc5 prove above, keeps the planted runs short)
timeout=10
sed 's/constant u : real = 0x1p-24$/constant u : real = 0x1p-25/' "$mlw" > "$work/too_tight.mlw"
grep -q 'constant u : real = 0x1p-25$' "$work/too_tight.mlw" || fail "could not plant the tighter bound"
prove "$work/too_tight.mlw" gappa F32Bounds mul_error > "$work/planted.txt"
# planted: the induction's bound with gamma one term short
sed 's/^\(    ensures { abs (t.real (fdot a b n) -\. dot_exact a b n) <=\. \)gamma n /\1gamma (n - 1) /' "$mlw" > "$work/short.mlw"
grep -q 'ensures { abs (t.real (fdot a b n) -. dot_exact a b n) <=. gamma (n - 1) ' "$work/short.mlw" ||
    fail "could not plant the shorter gamma"
prove "$work/short.mlw" cvc5 FdotBound "fdot_bound_ind'vc" >> "$work/planted.txt"
cat "$work/planted.txt"
# unproved: some sub-goal of MODULE in planted.txt has another answer than Valid
unproved() { awk -v m="$1" '$1 == m && $3 != "Valid" { found = 1 } END { exit !found }' "$work/planted.txt"; }
unproved F32Bounds || fail "Gappa proved the product's bound with u = 2^-25"
unproved FdotBound || fail "cvc5 proved fdot_bound_ind with gamma (n - 1)"
echo "test_float_bounds: ok: the per-operation bounds, the step, the induction and the weighted element's step are proved; a bound one bit too tight and gamma one term short are not"
