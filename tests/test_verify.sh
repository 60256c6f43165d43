#!/bin/sh
# make check: proves the reference's ACSL contracts with Frama-C/WP (specs/verify.sh); every goal must be
# proved.  Skipped (exit 77) when configure did not find Frama-C, why3, z3 and cvc4.
. ./specs/verify-config.sh
if [ -z "$FRAMAC" ]; then
    echo "test_verify: Frama-C/why3/z3/cvc4 not configured; skipping"
    exit 77
fi
FRAMAC=$FRAMAC WHY3=$WHY3 exec sh "$srcdir/specs/verify.sh" "$srcdir" tests/verify-wp
