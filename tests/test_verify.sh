#!/bin/sh
# make check: proves the reference's ACSL contracts with Frama-C/WP (specs/verify.sh); every goal must be
# proved (and, where VERIFY_SMOKE=1 runs them, every smoke test must pass).  Skipped (exit 77) when
# configure did not find Frama-C, why3, z3, cvc4, cvc5 and python3.
. "$srcdir/tests/verify_lib.sh"
verify_require test_verify
FRAMAC=$FRAMAC WHY3=$WHY3 PYTHON=$PYTHON exec sh "$srcdir/specs/verify.sh" "$srcdir" tests/verify-wp
