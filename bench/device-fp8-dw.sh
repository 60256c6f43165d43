#!/bin/bash
# The FP8 dW kernel (gpu/gemm/fp8_dw.cu) checked and timed against a base build in one device call, logging
# under $OUT (or ./out):
#   1. bench/device-ab.sh base=BASE new=TARBALL with AB_BENCH_ARGS="--ops dw --dtype e4m3" (every shape, T = 4096,
#      AB_ROUNDS rounds, default 2) and, in the same rounds, bf16 dW of the new build;
#   2. on the new build: proptest/test_gpu_gemm_fp8_dw (exact, random, quantized and many-tile cases) and
#      proptest/test_gpu_gemm_fp8_dw_bad (bad inputs),
#      moe-fuzz gpu-gemm-fp8-dw (FUZZ_SECONDS, default 40), compute-sanitizer memcheck on 40 fuzz cases and on the
#      test, racecheck (shared memory) on 6 fuzz cases.
# usage: bench/device-fp8-dw.sh TARBALL BASE_TARBALL
set -u
R=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$PWD/out}
mkdir -p "$out"
status=0
AB_TRIALS=0 AB_BENCH_ARGS="--ops dw --dtype e4m3" timeout 420 bash "$R/bench/device-ab.sh" base="$2" new="$1" ||
  status=1
cd /tmp/ab-new/libmoe-* || exit 1
export LD_LIBRARY_PATH=$PWD/.libs
echo "== bf16 dW (new build)"
./bench/moe-bench --tokens 4096 --repeat 20 --libmoe-only --ops dw > "$out/bench_bf16_dw.log" 2>&1 || status=1
grep -E "^(qwen|mixtral|deepseek)" "$out/bench_bf16_dw.log"
make -j16 proptest/test_gpu_gemm_fp8_dw proptest/test_gpu_gemm_fp8_dw_bad > "$out/build_test.log" 2>&1 || {
  tail -20 "$out/build_test.log"; exit 1; }
timeout 200 ./proptest/test_gpu_gemm_fp8_dw > "$out/test_gpu_gemm_fp8_dw.txt" 2>&1 || status=1
echo "== test_gpu_gemm_fp8_dw"; grep -E "cases|checks" "$out/test_gpu_gemm_fp8_dw.txt"
timeout 100 ./proptest/test_gpu_gemm_fp8_dw_bad > "$out/test_gpu_gemm_fp8_dw_bad.txt" 2>&1 || status=1
echo "== test_gpu_gemm_fp8_dw_bad"; tail -1 "$out/test_gpu_gemm_fp8_dw_bad.txt"
timeout 150 ./proptest/moe-fuzz --backend cuda --ops gpu-gemm-fp8-dw --seconds "${FUZZ_SECONDS:-40}" \
  > "$out/fuzz-gpu-gemm-fp8-dw.txt" 2>&1 || status=1
echo "== moe-fuzz gpu-gemm-fp8-dw"; tail -3 "$out/fuzz-gpu-gemm-fp8-dw.txt"
for tool in memcheck racecheck; do
  cases=40; [ "$tool" = racecheck ] && cases=6
  timeout 200 compute-sanitizer --tool "$tool" --error-exitcode 3 ./proptest/.libs/moe-fuzz --backend cuda --no-fork \
    --ops gpu-gemm-fp8-dw --cases "$cases" --seed 7 > "$out/$tool-gpu-gemm-fp8-dw.txt" 2>&1 || status=1
  echo "== $tool gpu-gemm-fp8-dw ($cases cases)"; tail -2 "$out/$tool-gpu-gemm-fp8-dw.txt"
done
test_bin=./proptest/.libs/test_gpu_gemm_fp8_dw; [ -x "$test_bin" ] || test_bin=./proptest/test_gpu_gemm_fp8_dw
timeout 300 compute-sanitizer --tool memcheck --error-exitcode 3 "$test_bin" \
  > "$out/memcheck-test_gpu_gemm_fp8_dw.txt" 2>&1 || status=1
echo "== memcheck test_gpu_gemm_fp8_dw"; tail -2 "$out/memcheck-test_gpu_gemm_fp8_dw.txt"
exit "$status"
