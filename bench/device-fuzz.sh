#!/bin/bash
# Builds libmoe from a `make dist` tarball on a GPU machine and runs, logging under $OUT (or ./out):
#   1. make check (every CPU and GPU test; no Frama-C there: test_verify skips), or with the step "gpu" the
#      GPU tests alone;
#   2. the GPU fuzz ops SANITIZE_OPS (default gpu-gemm-fp8) for a short batch under compute-sanitizer memcheck;
#   3. moe-fuzz --backend cuda for FUZZ_SECONDS (default 240) on seed FUZZ_SEED, the GPU ops FUZZ_OPS (default
#      every one).
# usage: bench/device-fuzz.sh TARBALL [steps]   steps: any of "check gpu sanitize fuzz" (default "check
#   sanitize fuzz").  A build left in /tmp/libmoe-build by an earlier call on the same machine is reused.
set -eu
tarball=$1
steps=${2:-"check sanitize fuzz"}
out=${OUT:-$PWD/out}
mkdir -p "$out"
work=/tmp/libmoe-build
if [ ! -x "$work/proptest/moe-fuzz" ]; then
  rm -rf "$work" && mkdir -p "$work"
  tar -C "$work" --strip-components=1 -xzf "$tarball"
  cd "$work"
  nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$out/device.txt"
  ./configure --with-cuda=yes --with-cuda-arch="90a;80" --enable-werror > configure.out 2>&1 ||
    { tail -30 configure.out; exit 1; }
  make -j16 > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
else
  cd "$work"
fi
export LD_LIBRARY_PATH="$PWD/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
status=0
case "$steps" in *check*)
  echo "== make check"
  make -j16 check VERIFY_TESTS= > "$out/check.log" 2>&1 || status=1
  grep -E '^(PASS|FAIL|ERROR|SKIP|XFAIL|XPASS):|^# ' "$out/check.log" | tail -40
  cp test-suite.log "$out/test-suite.log" 2>/dev/null || true
esac
case "$steps" in *gpu*)
  echo "== the GPU tests"
  make -j16 check VERIFY_TESTS= TESTS="proptest/test_gpu_gemm proptest/test_gpu_mlp proptest/test_gpu_builders \
    proptest/test_gpu_autotune proptest/test_gpu_fp8_quantize tests/test_cli_cuda.sh" > "$out/check-gpu.log" 2>&1 ||
    status=1
  grep -E '^(PASS|FAIL|ERROR|SKIP):' "$out/check-gpu.log"
  cat proptest/test_gpu_gemm.log proptest/test_gpu_mlp.log proptest/test_gpu_builders.log \
    proptest/test_gpu_fp8_quantize.log > "$out/gpu-tests.log" || true
esac
case "$steps" in *sanitize*)
  echo "== compute-sanitizer memcheck: ${SANITIZE_OPS:-gpu-gemm-fp8} (a small batch)"
  compute-sanitizer --tool memcheck --error-exitcode 3 ./proptest/.libs/moe-fuzz --backend cuda --no-fork \
    --ops "${SANITIZE_OPS:-gpu-gemm-fp8}" --cases "${SANITIZE_CASES:-60}" --seed 7 > "$out/sanitizer.log" 2>&1 || status=1
  tail -4 "$out/sanitizer.log"
esac
case "$steps" in *fuzz*)
  echo "== moe-fuzz --backend cuda --seconds ${FUZZ_SECONDS:-240} --seed ${FUZZ_SEED:-0x5eed6001}"
  ./proptest/moe-fuzz --backend cuda --seconds "${FUZZ_SECONDS:-240}" --seed "${FUZZ_SEED:-0x5eed6001}" ${FUZZ_OPS:+--ops "$FUZZ_OPS"} \
    --regressions proptest/regressions.txt > "$out/fuzz_cuda_${FUZZ_SEED:-0x5eed6001}.log" 2>&1 || status=1
  tail -12 "$out/fuzz_cuda_${FUZZ_SEED:-0x5eed6001}.log"
esac
exit $status
