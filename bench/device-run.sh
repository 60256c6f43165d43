#!/bin/sh
# Builds libmoe from a `make dist` tarball on a GPU machine and runs, logging under $OUT (or ./out):
#   1. the GPU property test (proptest/test_gpu_gemm) at its fixed seed, for each kernel family, and
#      its --large case (E*N*K past 2^31),
#   2. a reduced batch of it under compute-sanitizer memcheck (and racecheck on a smaller one),
#   3. bench/moe-bench on the ANCHORS.md shapes (CSV in $OUT/bench.csv).
# usage: bench/device-run.sh TARBALL [steps]   steps: any of "test large sanitize bench" (default all)
# The GPU machine has no libtool: the tarball carries the generated configure and libtool scripts.
set -eu
tarball=$1
steps=${2:-"test large sanitize bench"}
out=${OUT:-$PWD/out}
mkdir -p "$out"
work=$(mktemp -d)
tar -C "$work" -xzf "$tarball"
cd "$work"/libmoe-*
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/device.txt"
./configure --with-cuda=yes --with-cuda-arch="90a;80" --enable-werror > "$out/configure.log" 2>&1 ||
  { tail -30 "$out/configure.log"; exit 1; }
make -j16 > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
make -j16 proptest/test_gpu_gemm bench/moe-bench >> "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
echo "SASS: $(cuobjdump -sass .libs/libmoe.so 2>/dev/null | grep -c HGMMA) HGMMA, $(cuobjdump -sass .libs/libmoe.so 2>/dev/null | grep -c HMMA) HMMA instructions"
export LD_LIBRARY_PATH="$PWD/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
status=0
case "$steps" in *test*)
  echo "== GPU properties"
  for family in auto sm80 simt; do
    echo "-- MOE_CUDA_KERNEL=$family"
    MOE_CUDA_KERNEL=$family ./proptest/test_gpu_gemm 20261122 ${MOE_GPU_TRIALS:-120} > "$out/test_gpu_gemm_$family.log" 2>&1 || status=1
    tail -6 "$out/test_gpu_gemm_$family.log"
  done
esac
case "$steps" in *large*)
  echo "== E*N*K > 2^31"
  ./proptest/test_gpu_gemm --large 5 2>&1 | tee "$out/test_gpu_large.log" | tail -5 || status=1
esac
case "$steps" in *sanitize*)
  echo "== compute-sanitizer memcheck (reduced batch)"
  compute-sanitizer --tool memcheck --error-exitcode 3 ./proptest/.libs/test_gpu_gemm 7 12 \
    > "$out/sanitizer.log" 2>&1 || status=1
  tail -5 "$out/sanitizer.log"
  echo "== compute-sanitizer racecheck (small batch)"
  compute-sanitizer --tool racecheck --error-exitcode 3 ./proptest/.libs/test_gpu_gemm 11 3 \
    > "$out/racecheck.log" 2>&1 || status=1
  tail -5 "$out/racecheck.log"
esac
case "$steps" in *bench*)
  echo "== benchmark"
  ./bench/moe-bench --tokens 4096 --repeat 20 --csv "$out/bench.csv" 2>&1 | tee "$out/bench.log" || status=1
esac
exit $status
