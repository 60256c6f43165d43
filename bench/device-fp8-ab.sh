#!/bin/bash
# The A/B of a Hopper FP8 kernel switch in one build, from a `make dist` tarball TARBALL (bench/device-build.sh),
# logging under $OUT:
#   1. moe-fuzz --backend cuda on gpu-gemm-fp8 (FUZZ_SECONDS, default 40) and gpu-gemm-fp8-model (30 s, the
#      Hopper kernel) with the switch on (SWITCH=1); compute-sanitizer's memcheck on 40 gpu-gemm-fp8 cases and
#      proptest/test_gpu_gemm (the bf16 / f16 / f32 GEMM's properties and its TMA-store race probe), switch on;
#   2. moe-bench --libmoe-only --dtype e4m3, fwd and dX, Qwen3-30B-A3B and DeepSeek-V3, T = 4096: the switch 0 and 1
#      alternated, two rounds (ab-SHAPE-VALUE-ROUND.txt);
#   3. FP8 dW beside bf16 dW (moe-bench --libmoe-only --ops dw, every shape);
#   4. ncu on one launch of the Hopper kernel (Qwen3 gate_up fwd, the switch on): WarpStateStats, SourceCounters,
#      and the stall samples per SASS instruction (fp8-source.csv).
# usage: SWITCH=MOE_FP8_SM90_STAGED_SCALES bench/device-fp8-ab.sh TARBALL
set -u
R=$(cd "$(dirname "$0")/.." && pwd)
tarball=$1
out=${OUT:-$PWD/out}
switch=${SWITCH:?the environment variable to A/B, as SWITCH=NAME}
build_targets="bench/moe-bench proptest/test_gpu_gemm"
. "$R/bench/device-build.sh"
status=0
# gpu-gemm-fp8 on the default plan; the model op on the Hopper kernel (MOE_CUDA_KERNEL=sm90)
env "$switch=1" timeout 150 ./proptest/moe-fuzz --backend cuda --ops gpu-gemm-fp8 --seconds "${FUZZ_SECONDS:-40}" \
  > "$out/fuzz-gpu-gemm-fp8.txt" 2>&1 || status=1
env "$switch=1" MOE_CUDA_KERNEL=sm90 timeout 150 ./proptest/moe-fuzz --backend cuda --ops gpu-gemm-fp8-model \
  --seconds 30 > "$out/fuzz-gpu-gemm-fp8-model.txt" 2>&1 || status=1
for name in gpu-gemm-fp8 gpu-gemm-fp8-model; do echo "== moe-fuzz $name ($switch=1)"; tail -4 "$out/fuzz-$name.txt"; done
env "$switch=1" timeout 200 compute-sanitizer --tool memcheck --error-exitcode 3 ./proptest/.libs/moe-fuzz --backend cuda \
  --no-fork --ops gpu-gemm-fp8 --cases 40 --seed 7 > "$out/memcheck-gpu-gemm-fp8.txt" 2>&1 || status=1
echo "== memcheck gpu-gemm-fp8 ($switch=1)"; tail -2 "$out/memcheck-gpu-gemm-fp8.txt"
env "$switch=1" timeout 200 ./proptest/test_gpu_gemm > "$out/test_gpu_gemm.txt" 2>&1 || status=1
echo "== test_gpu_gemm ($switch=1)"; tail -3 "$out/test_gpu_gemm.txt"
for round in 1 2; do
  for value in 0 1; do
    for shapes in qwen3 deepseek; do
      env "$switch=$value" ./bench/moe-bench --libmoe-only --dtype e4m3 --shapes "$shapes" --tokens 4096 --repeat 10 \
        --ops fwd,dx > "$out/ab-$shapes-$value-$round.txt" 2>&1 || status=1
      echo "== $switch=$value $shapes round $round"; grep -E "gate_up|down" "$out/ab-$shapes-$value-$round.txt"
    done
  done
done
for dtype in bf16 e4m3; do
  env "$switch=1" ./bench/moe-bench --libmoe-only --dtype "$dtype" --tokens 4096 --repeat 10 --ops dw \
    > "$out/dw-$dtype.txt" 2>&1 || status=1
  echo "== moe-bench dW $dtype"; grep -E "gate_up|down" "$out/dw-$dtype.txt"
done
env "$switch=1" timeout 150 ncu --clock-control none -k regex:fp8_sm90 --launch-skip 1 --launch-count 1 \
  --section WarpStateStats --section SourceCounters --import-source no -o "$out/fp8-qwen3-fwd" \
  ./bench/.libs/moe-bench --libmoe-only --dtype e4m3 --shapes qwen3 --tokens 4096 --repeat 1 --ops fwd \
  > "$out/ncu-fp8.txt" 2>&1 || status=1
ncu --import "$out/fp8-qwen3-fwd.ncu-rep" --page source --print-source sass --csv > "$out/fp8-source.csv" 2>&1 ||
  status=1
ncu --import "$out/fp8-qwen3-fwd.ncu-rep" --page details > "$out/fp8-details.txt" 2>&1 || status=1
echo "== ncu fp8 qwen3 fwd ($switch=1)"; grep -E "Stall|Warp Cycles|Issued" "$out/fp8-details.txt" | head -20
exit $status
