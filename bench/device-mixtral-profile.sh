#!/bin/bash
# Mixtral-8x7B (issue 54): libmoe's sm90 kernel against cuBLAS on the rows where cuBLAS is ahead, from the
# `make dist` tarball TARBALL (bench/device-build.sh), logging under $OUT:
#   1. moe-bench --shapes mixtral with its peers (cuBLAS per-expert loop, cuBLAS grouped), T = 4096;
#   2. per op, one moe-bench call under ncu, summarised per kernel name (ncu-OP.txt): each kernel's duration,
#      grid, cluster, registers, shared memory and SpeedOfLight throughputs; cuBLAS's kernel names carry its
#      tile and cluster shapes;
#   3. with FP8=1 first: the FP8 Hopper kernel against its model (moe-fuzz gpu-gemm-fp8-model, 30 s), FP8 dW
#      beside bf16 dW (moe-bench --libmoe-only, Qwen3-30B-A3B and DeepSeek-V3, T = 4096), and last
#      the FP8 kernel on Qwen3-30B-A3B gate_up fwd under ncu's WarpStateStats and SourceCounters, with the stall
#      samples per SASS instruction (fp8-source.csv: ncu --page source).
# usage: bench/device-mixtral-profile.sh TARBALL
set -u
R=$(cd "$(dirname "$0")/.." && pwd)
tarball=$1
out=${OUT:-$PWD/out}
build_targets="bench/moe-bench"
. "$R/bench/device-build.sh"
status=0
if [ "${FP8:-0}" = 1 ]; then
  MOE_CUDA_KERNEL=sm90 timeout 120 ./proptest/moe-fuzz --backend cuda --ops gpu-gemm-fp8-model --seconds 30 \
    > "$out/fuzz-fp8-model.txt" 2>&1 || status=1
  echo "== moe-fuzz gpu-gemm-fp8-model (sm90)"; tail -6 "$out/fuzz-fp8-model.txt"
  for dtype in bf16 e4m3; do
    ./bench/moe-bench --libmoe-only --dtype "$dtype" --tokens 4096 --repeat 10 --ops dw --csv "$out/dw-$dtype.csv" \
      > "$out/bench-dw-$dtype.txt" 2>&1 || status=1
    echo "== moe-bench dW $dtype"; tail -7 "$out/bench-dw-$dtype.txt"
  done
fi
./bench/moe-bench --shapes mixtral --tokens 4096 --repeat 20 > "$out/bench-mixtral.txt" 2>&1 || status=1
echo "== moe-bench mixtral"; tail -8 "$out/bench-mixtral.txt"
for op in fwd dx dw; do
  timeout 150 ncu --clock-control none --section SpeedOfLight --section LaunchStats --print-summary per-kernel \
    -k 'regex:^(?!.*(memset|Memset|flush)).*$' \
    ./bench/.libs/moe-bench --shapes mixtral --tokens 4096 --repeat 1 --ops "$op" > "$out/ncu-$op.txt" 2>&1 || status=1
  echo "== ncu $op"; grep -E "^  [a-zA-Z_].*\(|Duration|Grid Size|Cluster Size|Registers Per|Dynamic Shared" "$out/ncu-$op.txt" | head -60
done
if [ "${FP8:-0}" = 1 ]; then
  timeout 150 ncu --clock-control none -k regex:fp8_sm90 --launch-skip 1 --launch-count 1 --section WarpStateStats \
    --section SourceCounters --import-source no -o "$out/fp8-qwen3-fwd" \
    ./bench/.libs/moe-bench --libmoe-only --dtype e4m3 --shapes qwen3 --tokens 4096 --repeat 1 --ops fwd \
    > "$out/ncu-fp8.txt" 2>&1 || status=1
  ncu --import "$out/fp8-qwen3-fwd.ncu-rep" --page source --print-source sass --csv > "$out/fp8-source.csv" 2>&1 ||
    status=1
  ncu --import "$out/fp8-qwen3-fwd.ncu-rep" --page details > "$out/fp8-details.txt" 2>&1 || status=1
  echo "== ncu fp8 qwen3 fwd"; grep -E "Stall|Warp Cycles|Issued" "$out/fp8-details.txt" | head -20
fi
exit $status
