#!/bin/bash
# Where the Hopper FP8 kernel's time goes: the library from the `make dist` tarball TARBALL (bench/device-build.sh),
# moe-bench's e4m3 rows beside bf16 (T = 4096, fwd and dX), then ncu's SpeedOfLight, WarpStateStats,
# SchedulerStats, MemoryWorkloadAnalysis and ComputeWorkloadAnalysis sections on one launch of the FP8 kernel
# per (shape, op) (ncu_SHAPE_OP.txt under $OUT), and SourceCounters (the stalls per instruction) on
# DeepSeek-V3's forward.  usage: bench/device-fp8-profile.sh TARBALL
set -u
R=$(cd "$(dirname "$0")/.." && pwd)
tarball=$1
out=${OUT:-$PWD/out}
build_targets="bench/moe-bench"
. "$R/bench/device-build.sh"
status=0
for shapes in qwen3 deepseek; do
  for dtype in bf16 e4m3; do
    ./bench/moe-bench --libmoe-only --dtype "$dtype" --shapes "$shapes" --tokens 4096 --repeat 10 --ops fwd,dx \
      > "$out/bench-$shapes-$dtype.txt" 2>&1 || status=1
    echo "== moe-bench $shapes $dtype"; tail -6 "$out/bench-$shapes-$dtype.txt"
  done
done
sections="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis"
sections="$sections --section ComputeWorkloadAnalysis --section LaunchStats --section Occupancy"
for shapes in qwen3 deepseek; do
  for op in fwd dx; do
    extra=
    [ "$shapes-$op" = deepseek-fwd ] && extra="--section SourceCounters"
    # shellcheck disable=SC2086
    timeout 200 ncu --clock-control none -k regex:fp8_sm90 --launch-skip 1 --launch-count 1 $sections $extra \
      ./bench/.libs/moe-bench --libmoe-only --dtype e4m3 --shapes "$shapes" --tokens 4096 --repeat 1 --ops "$op" \
      > "$out/ncu_${shapes}_$op.txt" 2>&1 || status=1
    echo "== ncu $shapes $op"; grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|Issue Slots Busy|No Eligible" "$out/ncu_${shapes}_$op.txt" | head -8
  done
done
exit $status
