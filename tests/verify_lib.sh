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
