#!/bin/sh
# tests/test_gemm_modes on the reference's 16-byte micro-kernel (MOE_REF_KERNEL=v4): the kernel that
# non-AVX2 x86 and other CPUs run, whose second half of a 6-row tile (`rows > 3`) an AVX2 machine's
# own kernel choice never reaches (specs/THRESHOLDS.md).  Same checks, same seed.
MOE_REF_KERNEL=v4 exec ./tests/test_gemm_modes "$@"
