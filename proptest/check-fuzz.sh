#!/bin/sh
# make check's run of moe-fuzz: every reference op on a fixed seed and a fixed number of cases (sizes
# growing 0..100, about 50 s on one core), after replaying every reproducer in
# proptest/regressions.txt.  Failures print shrunk reproducer lines; see proptest/README.md.
srcdir=${srcdir:-$(dirname "$0")/..}
exec ./proptest/moe-fuzz --seed 0x5eed2024 --cases "${MOE_FUZZ_CHECK_CASES:-120}" --shrink-seconds 20 \
    --regressions "$srcdir/proptest/regressions.txt"
