#!/bin/sh
# The CUDA blockwise MoE MLP on a GPU machine, from a `make dist` tarball, logging under $OUT (or ./out):
#   1. bench/mlp-gpu-time on Qwen3-30B-A3B (T = 4096, E = 128, k = 8, H = 2048, I = 768, B = 128, bf16),
#   2. proptest/test_gpu_mlp at its fixed seed (the full option cross, determinism, the fused gate/up kernel,
#      invalid layouts, many experts, tensors one element off),
#   3. a reduced batch of it under compute-sanitizer memcheck (and racecheck on a smaller one),
# each step limited to $MOE_STEP_TIMEOUT seconds (default 240).
# usage: bench/device-run-mlp.sh TARBALL [steps]   steps: any of "test sanitize time" (default all)
# (bench/device-run.sh does the same for the grouped GEMM.)
set -eu
tarball=$1
steps=${2:-"test sanitize time"}
out=${OUT:-$PWD/out}
build_targets="proptest/test_gpu_mlp bench/mlp-gpu-time"
. "$(dirname "$0")/device-build.sh"
status=0
limit=${MOE_STEP_TIMEOUT:-240}   # seconds per step
case "$steps" in *time*)
  echo "== timing"
  timeout "$limit" ./bench/mlp-gpu-time 4096 128 8 2048 768 128 bf16 ${MOE_GPU_MLP_REPEATS:-10} 2>&1 |
    tee "$out/mlp_time.log" || status=1
esac
case "$steps" in *test*)
  echo "== GPU MLP properties"
  timeout "$limit" ./proptest/test_gpu_mlp 20261122 ${MOE_GPU_MLP_CASES:-3072} > "$out/test_gpu_mlp.log" 2>&1 ||
    status=1
  tail -8 "$out/test_gpu_mlp.log"
esac
case "$steps" in *sanitize*)
  echo "== compute-sanitizer memcheck (reduced batch)"
  timeout "$limit" compute-sanitizer --tool memcheck --error-exitcode 3 ./proptest/.libs/test_gpu_mlp 7 \
    ${MOE_GPU_MLP_SANITIZE_CASES:-120} > "$out/sanitizer_mlp.log" 2>&1 || status=1
  tail -6 "$out/sanitizer_mlp.log"
  echo "== compute-sanitizer racecheck (small batch)"
  timeout "$limit" compute-sanitizer --tool racecheck --error-exitcode 3 ./proptest/.libs/test_gpu_mlp 11 \
    ${MOE_GPU_MLP_RACECHECK_CASES:-8} > "$out/racecheck_mlp.log" 2>&1 || status=1
  tail -4 "$out/racecheck_mlp.log"
esac
exit $status
