#!/bin/bash
# The FP8 GEMM on a Hopper GPU, logging under $OUT (or ./out):
#   1. bench/fp8_accum_probe.cu (standalone): what FP8 wgmma keeps of a sum (fp8-accum-probe.txt);
#   2. the library from the `make dist` tarball TARBALL (bench/device-build.sh), then moe-fuzz's gpu-gemm-fp8 for
#      FUZZ_SECONDS (default 60) with the default plan (the Hopper kernel takes the forward on sm_90a) and with
#      MOE_CUDA_KERNEL=sm80 (the portable kernel for every call), gpu-fp8-quantize for 20 s, gpu-gemm-fp8-model
#      (the Hopper kernel bit for bit its CPU model) for MODEL_SECONDS (default 30), and memcheck on
#      SANITIZE_CASES (default 40) cases of gpu-gemm-fp8 and gpu-fp8-quantize;
#   3. moe-bench --libmoe-only at T = 4096, fwd and dX, bf16 beside e4m3, and e4m3 dX from W^T (--w-transposed)
#      (shapes: SHAPES, default qwen3 and deepseek).
# usage: bench/device-fp8.sh TARBALL
set -u
R=$(cd "$(dirname "$0")/.." && pwd)
tarball=$1
out=${OUT:-$PWD/out}
mkdir -p "$out"
nvcc -gencode=arch=compute_90a,code=sm_90a -o /tmp/fp8-accum-probe "$R/bench/fp8_accum_probe.cu" &&
  /tmp/fp8-accum-probe > "$out/fp8-accum-probe.txt" 2>&1
echo "probe exit $?"
build_targets="proptest/moe-fuzz bench/moe-bench"
. "$R/bench/device-build.sh"
status=0
for kernel in auto sm80; do
  MOE_CUDA_KERNEL=$kernel ./proptest/moe-fuzz --backend cuda --ops gpu-gemm-fp8 --seconds "${FUZZ_SECONDS:-60}" \
    --seed 1 > "$out/fuzz-fp8-$kernel.log" 2>&1 || status=1
  echo "== fuzz gpu-gemm-fp8, MOE_CUDA_KERNEL=$kernel"; tail -6 "$out/fuzz-fp8-$kernel.log"
done
./proptest/moe-fuzz --backend cuda --ops gpu-fp8-quantize --seconds 20 --seed 1 > "$out/fuzz-fp8-quantize.log" 2>&1 ||
  status=1
echo "== fuzz gpu-fp8-quantize"; tail -4 "$out/fuzz-fp8-quantize.log"
MOE_CUDA_KERNEL=sm90 ./proptest/moe-fuzz --backend cuda --ops gpu-gemm-fp8-model --seconds "${MODEL_SECONDS:-30}" --seed 1 \
  > "$out/fuzz-fp8-model.log" 2>&1 || status=1
echo "== fuzz gpu-gemm-fp8-model (the Hopper kernel bit for bit its CPU model)"; tail -6 "$out/fuzz-fp8-model.log"
compute-sanitizer --tool memcheck --error-exitcode 3 ./proptest/.libs/moe-fuzz --backend cuda --no-fork \
  --ops gpu-gemm-fp8,gpu-fp8-quantize --cases "${SANITIZE_CASES:-40}" --seed 7 > "$out/sanitizer-fp8.log" 2>&1 || status=1
echo "== memcheck"; tail -3 "$out/sanitizer-fp8.log"
for shapes in ${SHAPES:-qwen3 deepseek}; do
  for dtype in bf16 e4m3; do
    ./bench/moe-bench --libmoe-only --dtype "$dtype" --shapes "$shapes" --tokens 4096 --repeat 10 --ops fwd,dx \
      > "$out/bench-$shapes-$dtype.txt" 2>&1 || status=1
    echo "== moe-bench $shapes $dtype"; tail -8 "$out/bench-$shapes-$dtype.txt"
  done
  ./bench/moe-bench --libmoe-only --dtype e4m3 --w-transposed --shapes "$shapes" --tokens 4096 --repeat 10 --ops dx \
    > "$out/bench-$shapes-e4m3-wt.txt" 2>&1 || status=1
  echo "== moe-bench $shapes e4m3 dX from W^T"; tail -6 "$out/bench-$shapes-e4m3-wt.txt"
done
exit $status
