#!/bin/bash
# Mixtral-8x7B (issue 54): libmoe's sm90 kernel against cuBLAS on the rows where cuBLAS is ahead, from the
# `make dist` tarball TARBALL (bench/device-build.sh), logging under $OUT:
#   1. moe-bench --shapes mixtral with its peers (cuBLAS per-expert loop, cuBLAS grouped), T = 4096;
#   2. per op, one moe-bench call under ncu, summarised per kernel name (ncu-OP.txt): each kernel's duration,
#      grid, cluster, registers, shared memory and SpeedOfLight throughputs; cuBLAS's kernel names carry its
#      tile and cluster shapes.
# usage: bench/device-mixtral-profile.sh TARBALL
set -u
R=$(cd "$(dirname "$0")/.." && pwd)
tarball=$1
out=${OUT:-$PWD/out}
build_targets="bench/moe-bench"
. "$R/bench/device-build.sh"
status=0
./bench/moe-bench --shapes mixtral --tokens 4096 --repeat 20 > "$out/bench-mixtral.txt" 2>&1 || status=1
echo "== moe-bench mixtral"; tail -8 "$out/bench-mixtral.txt"
for op in fwd dx dw; do
  timeout 150 ncu --clock-control none --section SpeedOfLight --section LaunchStats --print-summary per-kernel \
    -k 'regex:^(?!.*(memset|Memset|flush)).*$' \
    ./bench/.libs/moe-bench --shapes mixtral --tokens 4096 --repeat 1 --ops "$op" > "$out/ncu-$op.txt" 2>&1 || status=1
  echo "== ncu $op"; grep -E "^  [a-zA-Z_].*\(|Duration|Grid Size|Cluster Size|Registers Per|Dynamic Shared" "$out/ncu-$op.txt" | head -60
done
exit $status
