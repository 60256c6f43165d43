#!/bin/sh
# make check's "a correct build never fails the fuzzer": the fixed-seed run (check-fuzz.sh) sees one seed;
# this one runs the fuzzer over a spread of 16 seeds, so that a generator that makes an invalid case out of
# a valid one, or an invalid case with two defects, is caught here and not by the nightly job.
#   gemm-bad (the invalid-argument generator, cheap): 400 cases a seed, 6400 in all.  Its two-defect bug
#     (an overlapping dw_fp32 output placed misaligned: regressions.txt) failed about 1 case in 1,240, so
#     6400 cases miss such a bug with probability e^(-6400/1240) < 1%; proptest/README.md has the
#     measurement.
#   every other reference op: 4 cases a seed, sizes up to 60.
# Each seed prints its own line; a failure prints the shrunk reproducer (proptest/README.md).
status=0
for i in 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f 10; do
    seed=0x5eed51$i
    ./proptest/moe-fuzz --seed "$seed" --cases 400 --ops gemm-bad --shrink-seconds 10 > fuzz-seeds.out 2>&1 &&
        ./proptest/moe-fuzz --seed "$seed" --cases 4 --max-size 60 --shrink-seconds 10 \
            --ops gemm-fwd,gemm-dx,gemm-dw,gemm-dtopk,gemm-bwd,gemm-meta,gemm-adjoint,mlp,mlp-meta,mlp-layout \
            >> fuzz-seeds.out 2>&1
    rc=$?
    if [ "$rc" = 0 ]; then
        echo "seed $seed: pass"
    else
        echo "seed $seed: FAIL (exit $rc)"
        cat fuzz-seeds.out
        status=1
    fi
done
rm -f fuzz-seeds.out
exit $status
