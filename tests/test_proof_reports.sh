#!/bin/sh
# make check: the generated proof reports (specs/proof_reports.py, issue 52).  The committed
# specs/PROOF-TABLE.md and specs/TRUSTED.md must be what the generator writes from the committed sources and
# summary (`make proof-reports` rewrites them); and on a copy of the sources, a planted contract must change
# them: stated only and in TRUSTED.md while no target lists it, "value proved, bound proved" once
# verify.sh's targets do, with the counts of the summary; an admit, a check and an axiomatic block
# planted in the copy must be listed in TRUSTED.md.  Skipped (exit 77) without python3.
. "$srcdir/tests/verify_lib.sh"
python=${PYTHON:-python3}
if [ "$python" = ":" ] || ! "$python" -c "import sys" > /dev/null 2>&1; then
    echo "test_proof_reports: no python3; skipping"
    exit 77
fi
set -eu
fail() { echo "test_proof_reports: FAIL: $*" >&2; exit 1; }
gen() { # SRCDIR SUMMARY OUTDIR
    mkdir -p "$3"
    "$python" "$srcdir/specs/proof_reports.py" --srcdir "$1" --summary "$2" --table "$3/PROOF-TABLE.md" \
        --trusted "$3/TRUSTED.md"
}
work=tests/proof-reports
verify_copy_tree "$work"

# 1. The committed reports are current.
"$python" "$srcdir/specs/proof_reports.py" --srcdir "$srcdir" --summary "$srcdir/specs/VERIFY-SUMMARY.md" --check ||
    fail "specs/PROOF-TABLE.md or specs/TRUSTED.md is stale (the diff above; make proof-reports rewrites them)"

# 2. A contract planted in a copy of the sources, with a reason in the comment before it.
cat >> "$work/tree/src/errors.c" << 'PLANT'

/* Planted by tests/test_proof_reports.sh: its reason. */
/*@ terminates \true;
    assigns \nothing;
    ensures value_one: \result == 1;
    ensures bound_small: \result <= 2; */
int planted_contract(void)
{
    //@ check planted_check: 1 == 1;
    //@ admit planted_admit: 2 == 2;
    return 1;
}
/*@ axiomatic Planted { logic integer planted_zero; axiom planted_axiom: planted_zero == 0; } */
PLANT
line=$(grep -n '^/\*@ terminates \\true;$' "$work/tree/src/errors.c" | tail -1 | cut -d: -f1)
gen "$work/tree" "$srcdir/specs/VERIFY-SUMMARY.md" "$work/stated"
grep -qF -- "- \`planted_contract\` (src/errors.c:$line): Planted by tests/test_proof_reports.sh: its reason." \
    "$work/stated/TRUSTED.md" || fail "TRUSTED.md lacks the planted stated-only contract at src/errors.c:$line"
grep -qF "| src/errors.c:$line | planted_contract | stated only | - | - |" "$work/stated/PROOF-TABLE.md" ||
    fail "PROOF-TABLE.md lacks the planted contract as stated only"
for what in "check planted_check (src/errors.c:$((line + 6)))" "admit planted_admit (src/errors.c:$((line + 7)))" \
            "axiomatic Planted (src/errors.c:$((line + 10)))" "axiom planted_axiom (src/errors.c:$((line + 10)))"; do
    grep -qF -- "- $what" "$work/stated/TRUSTED.md" || fail "TRUSTED.md lacks: $what"
done
if "$python" "$srcdir/specs/proof_reports.py" --srcdir "$work/tree" --summary "$srcdir/specs/VERIFY-SUMMARY.md" \
        --check > "$work/check.log" 2>&1; then
    fail "--check passed on reports that lack the planted contract"
fi
grep -q "planted_contract" "$work/check.log" || fail "--check's diff does not show the planted contract"

# 3. The same function added to verify.sh's targets (src/errors.c's line), then with a summary row.
sed 's/^src\/errors\.c:moe_mul_ok"$/src\/errors.c:moe_mul_ok,planted_contract"/' "$srcdir/specs/verify.sh" \
    > "$work/tree/specs/verify.sh"
grep -q 'moe_mul_ok,planted_contract"$' "$work/tree/specs/verify.sh" || fail "could not add the target (did src/errors.c's line change?)"
gen "$work/tree" "$srcdir/specs/VERIFY-SUMMARY.md" "$work/listed"
grep -qF "| src/errors.c | planted_contract | value proved, bound proved | no result in the summary | - |" \
    "$work/listed/PROOF-TABLE.md" || fail "PROOF-TABLE.md does not class the listed function as value and bound proved"
if grep -q "planted_contract" "$work/listed/TRUSTED.md"; then fail "TRUSTED.md still lists the proved function"; fi
{ cat "$srcdir/specs/VERIFY-SUMMARY.md"; echo "| src/errors.c | planted_contract | 4 / 4 | 3 / 3 |"; } > "$work/summary.md"
gen "$work/tree" "$work/summary.md" "$work/counted"
grep -qF "| src/errors.c | planted_contract | value proved, bound proved | 4 / 4 | 3 / 3 |" "$work/counted/PROOF-TABLE.md" ||
    fail "PROOF-TABLE.md does not show the summary's counts"
# 3b. Clauses inside ref/moe_ref.h's clause macros count only where the target's file enables them (as in its
# proof): planted in src/errors.c (no MOE_REF_VALUES, no MOE_REF_BOUNDS), a contract whose value and bound
# clauses are MOE_REF_VALUE_CLAUSE / MOE_REF_BOUND_CLAUSE is "safety proved"; with the file defining
# MOE_REF_VALUES, "value proved"; with MOE_REF_BOUNDS too, "value proved, bound proved".
cat >> "$work/tree/src/errors.c" << 'PLANT'

/*@ terminates \true;
    assigns \nothing;
    MOE_REF_VALUE_CLAUSE(ensures value_two: \result == 2;)
    MOE_REF_BOUND_CLAUSE(ensures bound_three: \result <= 3;) */
int planted_macro(void);
PLANT
sed 's/^src\/errors\.c:moe_mul_ok"$/src\/errors.c:moe_mul_ok,planted_contract,planted_macro"/' "$srcdir/specs/verify.sh" \
    > "$work/tree/specs/verify.sh"
cp "$work/tree/src/errors.c" "$work/errors.c.planted"
for defines in "" "MOE_REF_VALUES" "MOE_REF_VALUES MOE_REF_BOUNDS"; do
    { for d in $defines; do echo "#define $d"; done; cat "$work/errors.c.planted"; } > "$work/tree/src/errors.c"
    case $defines in
        "") want="safety proved" ;;
        MOE_REF_VALUES) want="value proved" ;;
        *) want="value proved, bound proved" ;;
    esac
    gen "$work/tree" "$srcdir/specs/VERIFY-SUMMARY.md" "$work/macro"
    grep -qF "| src/errors.c | planted_macro | $want | no result in the summary | - |" "$work/macro/PROOF-TABLE.md" ||
        fail "PROOF-TABLE.md does not class the clause-macro contract as $want where src/errors.c defines: ${defines:-nothing}"
done
cp "$work/errors.c.planted" "$work/tree/src/errors.c"
# 4. A contract in an #ifdef branch of a macro Frama-C's preprocessing leaves undefined (the vector kernels'):
# "outside Frama-C's parse"; the #else branch's contract (what Frama-C reads) stays plain stated only.
cat >> "$work/tree/src/errors.c" << 'PLANT'
#ifdef MOE_HAVE_VECTOR_EXT
/*@ assigns \nothing; */
int planted_vector(void);
#else
/*@ assigns \nothing; */
int planted_scalar(void);
#endif
PLANT
gen "$work/tree" "$srcdir/specs/VERIFY-SUMMARY.md" "$work/unparsed"
grep -qE "\| src/errors.c:[0-9]+ \| planted_vector \| stated only, outside Frama-C's parse \(MOE_HAVE_VECTOR_EXT\) \|" \
    "$work/unparsed/PROOF-TABLE.md" || fail "PROOF-TABLE.md does not class the #ifdef MOE_HAVE_VECTOR_EXT contract as outside Frama-C's parse"
grep -qE "\| src/errors.c:[0-9]+ \| planted_scalar \| stated only \|" "$work/unparsed/PROOF-TABLE.md" ||
    fail "PROOF-TABLE.md does not class the #else branch's contract as plain stated only"
grep -qE "planted_vector\` \(src/errors.c:[0-9]+, outside Frama-C's parse: MOE_HAVE_VECTOR_EXT\)" "$work/unparsed/TRUSTED.md" ||
    fail "TRUSTED.md does not mark the #ifdef contract as outside Frama-C's parse"
echo "test_proof_reports: ok: the committed reports are current; a planted contract, its target and its clauses change them; clause macros count where their file enables them; a contract Frama-C does not parse is marked"
