# Sourced by the proof tests (tests/test_verify*.sh, tests/test_proof_reports.sh): what configure found for
# `make verify` (specs/verify-config.sh: FRAMAC, WHY3, PYTHON) and the steps they share.
. ./specs/verify-config.sh

# verify_require NAME: skip the test (exit 77) where configure did not find Frama-C and its provers.
verify_require() {
    if [ -z "$FRAMAC" ]; then
        echo "$1: Frama-C/why3/z3/cvc4/cvc5/python3 not configured; skipping"
        exit 77
    fi
}

# verify_copy_tree WORK: WORK emptied, then a writable copy of the sources WP reads in WORK/tree.
verify_copy_tree() {
    rm -rf "$1"
    mkdir -p "$1/tree"
    for dir in include backend src ref specs; do cp -R "$srcdir/$dir" "$1/tree/"; done
    chmod -R u+w "$1/tree"
}

# verify_bound_broken NAME FCT:CLAUSE:LEN...: the planted test of error bounds (tests/test_verify_bound_broken.sh,
# tests/test_verify_element_bound_broken.sh).  Copies the sources WP reads into tests/NAME's work folder and,
# in ref/gemm_naive_internal.h, makes each named bound clause (`ensures CLAUSE:` of function FCT, up to the
# `;)` that closes its MOE_REF_BOUND_CLAUSE) one rounding too tight: after the clause's `==>`, gamma_k(LEN)
# becomes gamma_k(LEN - 1), and a within_dot_bound's rounding count `LEN, unit_f32` becomes `LEN - 1, unit_f32`
# (exactly one change per clause, else the test fails: the clause changed).  Such a bound is false (LEN = 1:
# one rounded product is not within 4 eta_f32 of the exact one; with a weight, two roundings not within
# u |y| + eta_f32 of it).  Then proves the FCTs alone (VERIFY_ONLY) and requires the run to fail with exactly
# those clauses' goals unproved: were a clause's hypotheses contradictory, or the imported axioms
# (specs/float_bounds.mlw's FdotStepStatement, WeightStepStatement) inconsistent with WP's model, the planted
# clause would be proved; another goal unproved means the plant broke more than the clause.
verify_bound_broken() {
    name=$1
    shift
    work=tests/$(echo "$name" | sed 's/^test_//; s/_/-/g')
    header=ref/gemm_naive_internal.h
    verify_copy_tree "$work"
    cp "$srcdir/$header" "$work/planted.h"
    only=""
    for spec in "$@"; do
        fct=${spec%%:*}
        rest=${spec#*:}
        clause=${rest%%:*}
        len=${rest#*:}
        case ",$only," in *",$fct,"*) ;; *) only="$only${only:+,}$fct" ;; esac
        # the clause's lines: from `ensures CLAUSE:` in FCT's contract (the contract precedes the declaration
        # `FCT(`; clauses are found by name, each name once in the header) to its closing `;)`
        awk -v clause="ensures $clause:" -v len="$len" '
            function swap(s, from, to,    i, out) {
                out = ""
                while ((i = index(s, from)) > 0) { out = out substr(s, 1, i - 1) to; s = substr(s, i + length(from)); n++ }
                return out s }
            BEGIN { n = 0; inside = 0; after = 0 }
            index($0, clause) > 0 { inside = 1; after = 0; found++ }
            inside {
                line = $0
                if (!after && (i = index(line, "==>")) > 0) { after = 1; head = substr(line, 1, i + 2); line = substr(line, i + 3) }
                else head = ""
                if (after) {
                    line = swap(line, "gamma_k(" len ")", "gamma_k(" len " - 1)")
                    line = swap(line, len ", unit_f32", len " - 1, unit_f32")
                }
                $0 = head line
                if (index($0, ";)") > 0) inside = 0
            }
            { print }
            END { if (found != 1 || n != 1) { print "planted " n " changes in " found " clauses" > "/dev/stderr"; exit 1 } }' \
            "$work/planted.h" > "$work/planted.tmp" ||
            { echo "$name: FAIL: could not plant the change in $fct's $clause (did it change?)" >&2; exit 1; }
        mv "$work/planted.tmp" "$work/planted.h"
    done
    cp "$work/planted.h" "$work/tree/$header"
    diff "$srcdir/$header" "$work/tree/$header" || true
    if VERIFY_ONLY=$only FRAMAC=$FRAMAC WHY3=$WHY3 PYTHON=$PYTHON \
            sh "$srcdir/specs/verify.sh" "$work/tree" "$work/wp" > "$work/verify.log" 2>&1; then
        cat "$work/verify.log"
        echo "$name: FAIL: WP proved the bounds one rounding too tight ($*)" >&2
        exit 1
    fi
    cat "$work/verify.log"
    for spec in "$@"; do
        fct=${spec%%:*}
        rest=${spec#*:}
        clause=${rest%%:*}
        grep -q "_${fct}_ensures_${clause} UNPROVED\$" "$work/wp/goals-unique.txt" ||
            { echo "$name: FAIL: verify failed, but not on $fct's $clause" >&2; exit 1; }
    done
    unproved=$(grep -c " UNPROVED\$" "$work/wp/goals-unique.txt" || true)
    [ "$unproved" = $# ] ||
        { echo "$name: FAIL: $unproved goals unproved, where only the $# planted clauses should be" >&2; exit 1; }
    echo "$name: ok: the $# bounds one rounding too tight are reported as unproved goals, the only ones ($*)"
}
