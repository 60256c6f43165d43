#!/bin/bash
# The Hopper FP8 kernel's dX from W^T (moe_fp8_options.w_transposed) and its wide tiles (MOE_FP8_SM90_WIDE_TILES=1,
# with MOE_FP8_SM90_STAGED_SCALES=1), checked and timed in one build from the `make dist` tarball TARBALL
# (bench/device-build.sh), logging under $OUT:
#   1. moe-fuzz --backend cuda: gpu-gemm-fp8 on the default plan, on the portable kernel (MOE_CUDA_KERNEL=sm80) and
#      with wide tiles; gpu-gemm-fp8-model (the Hopper kernel bit for bit its CPU model) default and wide;
#      compute-sanitizer memcheck on 30 gpu-gemm-fp8 cases with wide tiles (the fuzzer draws W^T for half the dX
#      cases);
#   2. moe-bench --libmoe-only, T = 4096, Qwen3-30B-A3B and DeepSeek-V3, two rounds: bf16 fwd and dX, e4m3 fwd and
#      dX from W, dX from W^T (scales unstaged and staged), and e4m3 fwd and dX from W^T with wide tiles.
# usage: bench/device-fp8-wide.sh TARBALL
set -u
R=$(cd "$(dirname "$0")/.." && pwd)
tarball=$1
out=${OUT:-$PWD/out}
build_targets="proptest/moe-fuzz bench/moe-bench"
. "$R/bench/device-build.sh"
f(){ timeout 100 ./proptest/moe-fuzz --backend cuda --seed 1 "$@" 2>&1 | tail -3; }
W="MOE_FP8_SM90_WIDE_TILES=1 MOE_FP8_SM90_STAGED_SCALES=1"
echo "== fuzz default"; f --ops gpu-gemm-fp8 --seconds 25
echo "== fuzz sm80"; MOE_CUDA_KERNEL=sm80 f --ops gpu-gemm-fp8 --seconds 15
echo "== fuzz wide"; env $W timeout 100 ./proptest/moe-fuzz --backend cuda --seed 2 --ops gpu-gemm-fp8 --seconds 25 2>&1 | tail -3
echo "== model"; MOE_CUDA_KERNEL=sm90 f --ops gpu-gemm-fp8-model --seconds 15
echo "== model wide"; env $W MOE_CUDA_KERNEL=sm90 timeout 100 ./proptest/moe-fuzz --backend cuda --seed 3 --ops gpu-gemm-fp8-model --seconds 20 2>&1 | tail -3
echo "== memcheck wide"; env $W timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 ./proptest/.libs/moe-fuzz --backend cuda --no-fork --ops gpu-gemm-fp8 --cases 30 --seed 7 2>&1 | tail -2
b(){ timeout 60 ./bench/moe-bench --libmoe-only --tokens 4096 --repeat 10 "$@" 2>&1 | grep -E "gate_up|down"; }
for r in 1 2; do for s in qwen3 deepseek; do
echo "== $s r$r bf16"; b --dtype bf16 --shapes $s --ops fwd,dx
echo "== e4m3"; b --dtype e4m3 --shapes $s --ops fwd,dx
echo "== e4m3 W^T"; b --dtype e4m3 --w-transposed --shapes $s --ops dx
echo "== e4m3 W^T staged"; MOE_FP8_SM90_STAGED_SCALES=1 b --dtype e4m3 --w-transposed --shapes $s --ops dx
echo "== e4m3 wide fwd, W^T dx"; env $W timeout 60 ./bench/moe-bench --libmoe-only --tokens 4096 --repeat 10 --dtype e4m3 --w-transposed --shapes $s --ops fwd,dx 2>&1 | grep -E "gate_up|down"
done; done
