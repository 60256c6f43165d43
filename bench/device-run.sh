#!/bin/bash
# Builds libmoe from a `make dist` tarball on a GPU machine and runs, logging under $OUT (or ./out):
#   1. the GPU property test (proptest/test_gpu_gemm) at its fixed seed, for each kernel family, and
#      its --large case (E*N*K past 2^31),
#   2. a reduced batch of it under compute-sanitizer memcheck (and racecheck on a smaller one),
#   3. bench/moe-bench on the ANCHORS.md shapes (CSV in $OUT/bench.csv).
# usage: bench/device-run.sh TARBALL [steps]   steps: any of "test large sanitize bench quick profile" (default
#   "test large sanitize bench"); "quick" times libmoe alone on the same shapes (moe-bench --libmoe-only),
#   MOE_BENCH_ARGS adds arguments to either benchmark (e.g. "--shapes qwen3"); "profile" runs Nsight
#   Compute on one GEMM launch per op of Qwen3-30B-A3B gate_up ($OUT/ncu_OP.txt); "sweep" repeats the
#   quick benchmark once per VAR=VALUE word of MOE_SWEEP (kernel experiments, e.g. "MOE_SM90_SKIP=1").
# The GPU machine has no libtool: the tarball carries the generated configure and libtool scripts.
set -eu
tarball=$1
steps=${2:-"test large sanitize bench"}
out=${OUT:-$PWD/out}
build_targets="proptest/test_gpu_gemm bench/moe-bench"
. "$(dirname "$0")/device-build.sh"
status=0
case "$steps" in *test*)
  echo "== GPU properties"
  for family in ${MOE_FAMILIES:-auto sm80 simt}; do
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
  ./bench/moe-bench --tokens 4096 --repeat 20 --csv "$out/bench.csv" ${MOE_BENCH_ARGS:-} 2>&1 | tee "$out/bench.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1 # moe-bench's own status: 1 when a row's output failed its checks
esac
case "$steps" in *quick*)
  echo "== benchmark, libmoe alone"
  ./bench/moe-bench --tokens 4096 --repeat 20 --libmoe-only ${MOE_BENCH_ARGS:-} 2>&1 | tee "$out/quick.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
esac
case "$steps" in *sweep*)
  for setting in ${MOE_SWEEP:-}; do
    echo "== benchmark, libmoe alone, $setting"
    env "$setting" ./bench/moe-bench --tokens 4096 --repeat 10 --libmoe-only ${MOE_BENCH_ARGS:-} \
      > "$out/sweep_one.log" 2>&1 || status=1
    cat "$out/sweep_one.log" >> "$out/sweep.log"
    grep -E "^(qwen|mixtral|deepseek)|FAIL" "$out/sweep_one.log" || true
  done
esac
case "$steps" in *profile*)
  echo "== ncu, Qwen3-30B-A3B gate_up"
  for op in ${MOE_PROFILE_OPS:-fwd dx dw}; do
    ncu --clock-control none -k regex:gemm_kernel --launch-skip 1 --launch-count 1 --section SpeedOfLight \
      --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section WarpStateStats \
      --metrics dram__bytes_read.sum,dram__bytes_write.sum,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_membar_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio \
      ./bench/.libs/moe-bench --shapes qwen3 --ops $op --repeat 1 --libmoe-only > "$out/ncu_$op.txt" 2>&1 || status=1
    echo "-- $op"
    grep -E "Duration|DRAM Throughput|L2 Hit Rate|Warp Cycles Per Issued|dram__|stalled" "$out/ncu_$op.txt" | head -20
  done
esac
exit $status
