#!/bin/bash
# FP8 dW on transposed codes (gpu/gemm/fp8_dw_sm90.cu, options.codes_transposed, switched on by MOE_FP8_DW_SM90=1)
# checked and timed in one device call, logging under $OUT (or ./out):
#   1. proptest/test_gpu_gemm_fp8_dw with the Hopper kernel on (its transposed-code cases run it where M % 16 == 0)
#      and off (copied back: the bits of the untransposed call), test_gpu_gemm_fp8_dw_bad (bad values found on the
#      device, transposed codes among them) and moe-fuzz gpu-gemm-fp8-dw with it on (FUZZ_SECONDS,
#      default 40), compute-sanitizer memcheck on 40 fuzz cases and on the test, racecheck on 6 fuzz cases, and
#      tests/test_python_cuda.sh (the Python package on CUDA tensors, grouped_gemm_fp8_train among them);
#   2. moe-bench --libmoe-only --ops dw, T = 4096, every shape, ROUNDS rounds (default 2) alternating: e4m3 on
#      transposed codes with the Hopper kernel, the same copied back for the portable kernel, e4m3 on codes as they
#      lie (the portable kernel), bf16.
# Checks first: a kernel that fails them is not timed.
# usage: bench/device-fp8-dw-sm90.sh TARBALL
set -u
out=${OUT:-$PWD/out}
tarball=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
build_targets="bench/moe-bench proptest/test_gpu_gemm_fp8_dw proptest/test_gpu_gemm_fp8_dw_bad proptest/moe-fuzz"
# shellcheck source=bench/device-build.sh
source "$(dirname "$0")/device-build.sh"
status=0
MOE_FP8_DW_SM90=1 timeout 200 ./proptest/test_gpu_gemm_fp8_dw > "$out/test_gpu_gemm_fp8_dw.txt" 2>&1
rc=$?; [ "$rc" = 0 ] || status=1
echo "== test_gpu_gemm_fp8_dw, Hopper kernel on (rc $rc)"; grep -E "cases|checks|FAIL" "$out/test_gpu_gemm_fp8_dw.txt" | tail -5
timeout 200 ./proptest/test_gpu_gemm_fp8_dw > "$out/test_gpu_gemm_fp8_dw_off.txt" 2>&1
rc=$?; [ "$rc" = 0 ] || status=1
echo "== test_gpu_gemm_fp8_dw, Hopper kernel off (rc $rc)"; grep -E "checks|FAIL" "$out/test_gpu_gemm_fp8_dw_off.txt" | tail -3
export MOE_FP8_DW_SM90=1
timeout 100 ./proptest/test_gpu_gemm_fp8_dw_bad > "$out/test_gpu_gemm_fp8_dw_bad.txt" 2>&1
rc=$?; [ "$rc" = 0 ] || status=1
echo "== test_gpu_gemm_fp8_dw_bad (rc $rc)"; tail -1 "$out/test_gpu_gemm_fp8_dw_bad.txt"
timeout 100 ./proptest/moe-fuzz --backend cuda --ops gpu-gemm-fp8-dw --seconds "${FUZZ_SECONDS:-40}" \
  > "$out/fuzz-gpu-gemm-fp8-dw.txt" 2>&1 || status=1
echo "== moe-fuzz gpu-gemm-fp8-dw"; tail -3 "$out/fuzz-gpu-gemm-fp8-dw.txt"
for tool in memcheck racecheck; do
  cases=40; [ "$tool" = racecheck ] && cases=6
  timeout 120 compute-sanitizer --tool "$tool" --error-exitcode 3 ./proptest/.libs/moe-fuzz --backend cuda --no-fork \
    --ops gpu-gemm-fp8-dw --cases "$cases" --seed 7 > "$out/$tool-gpu-gemm-fp8-dw.txt" 2>&1 || status=1
  echo "== $tool gpu-gemm-fp8-dw ($cases cases)"; tail -2 "$out/$tool-gpu-gemm-fp8-dw.txt"
done
test_bin=./proptest/.libs/test_gpu_gemm_fp8_dw; [ -x "$test_bin" ] || test_bin=./proptest/test_gpu_gemm_fp8_dw
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 "$test_bin" \
  > "$out/memcheck-test_gpu_gemm_fp8_dw.txt" 2>&1 || status=1
echo "== memcheck test_gpu_gemm_fp8_dw"; tail -2 "$out/memcheck-test_gpu_gemm_fp8_dw.txt"
# the Python package on CUDA tensors (tests/test_python_cuda.sh: grouped_gemm_fp8_train among them), the same
# build, with the Hopper dW kernel off as users get it by default
MOE_FP8_DW_SM90=0 timeout 300 make -j16 check TESTS=tests/test_python_cuda.sh VERIFY_TESTS= \
  > "$out/check-python-cuda.log" 2>&1 || status=1
cp tests/test_python_cuda.sh.log "$out/" 2>/dev/null || true
echo "== tests/test_python_cuda.sh"; grep -E '^(PASS|FAIL|SKIP|ERROR)' "$out/check-python-cuda.log" | tail -3
[ "$status" = 0 ] || { echo "checks failed: no timings"; exit 1; }
for round in $(seq 1 "${ROUNDS:-2}"); do
  for form in hopper copied plain bf16; do
    hopper=0
    case $form in
      hopper) args="--dtype e4m3 --codes-transposed"; hopper=1 ;;
      copied) args="--dtype e4m3 --codes-transposed" ;;
      plain) args="--dtype e4m3" ;;
      bf16) args="" ;;
    esac
    # shellcheck disable=SC2086
    MOE_FP8_DW_SM90=$hopper timeout 150 ./bench/moe-bench --tokens 4096 --repeat 20 --libmoe-only --ops dw $args \
      > "$out/bench_${form}_$round.log" 2>&1 || status=1
    echo "== round $round, dW $form"; grep -E "^(qwen|mixtral|deepseek)" "$out/bench_${form}_$round.log"
  done
done
exit "$status"
