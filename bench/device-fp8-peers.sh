#!/bin/bash
# libmoe's FP8 GEMM beside its peers in one device call (issue 53's targets), from a `make dist` tarball,
# logging under $OUT (or ./out):
#   1. bench/moe-bench --libmoe-only at T = 4096, fwd, dX and dW, bf16 and e4m3 (codes of random values, scales of 1,
#      bf16 out), and e4m3 dX from W^T (--w-transposed; op "dx-wt" in the tables), on the FP8 shapes of
#      ANCHORS.md: Qwen3-30B-A3B gate_up and down, DeepSeek-V3 gate_up;
#   2. bench/peers.py --fp8 on the same shapes, fwd and dX: torch._grouped_mm (bf16) and torch._scaled_grouped_mm
#      (e4m3, row-wise scales: a coarser scaling than libmoe's 1 x 128 / 128 x 128; precise and fast_accum),
#      rows in expert order, L2 flushed, medians of REPEAT runs; absent (not an error) where torch lacks the op
#      or the GPU is not sm_90;
#   3. bench/peer-table.py: the bf16 table and the FP8 ratio table ($OUT/fp8-peer-table.md).
# usage: bench/device-fp8-peers.sh TARBALL    (REPEAT: timed runs per call, default 20)
#        bench/device-fp8-peers.sh --dry-run  (no GPU, no build: the commands and peers.py's plan)
# The exit status is that of the steps' checks; a row short of a target is listed, not an error.
set -eu
R=$(cd "$(dirname "$0")/.." && pwd)
repeat=${REPEAT:-20}
models=qwen3-30b-a3b,deepseek-v3   # bench/peers.py's names of moe-bench's --shapes qwen3 and deepseek
exec 3>&1   # the dry run's command lines go here, past the commands' own redirections
run() { if [ "$dry" = 1 ]; then echo "+ $*" >&3; else "$@"; fi; }
dry=0
if [ "${1:-}" = --dry-run ]; then
  dry=1
  out=${OUT:-$(mktemp -d)}
  mkdir -p "$out"
else
  tarball=${1:?usage: bench/device-fp8-peers.sh TARBALL | --dry-run}
  # shellcheck disable=SC2034 # both read by device-build.sh
  out=${OUT:-$PWD/out}
  build_targets="bench/moe-bench"
  # shellcheck source=bench/device-build.sh
  . "$R/bench/device-build.sh"
fi
status=0
for dtype in bf16 e4m3; do
  for shapes in qwen3 deepseek; do
    echo "== moe-bench $shapes $dtype"
    run ./bench/moe-bench --libmoe-only --dtype "$dtype" --shapes "$shapes" --tokens 4096 --repeat "$repeat" \
      --ops fwd,dx,dw --csv "$out/moe-bench-$shapes-$dtype.csv" > "$out/moe-bench-$shapes-$dtype.log" 2>&1 || status=1
    [ "$dry" = 1 ] || tail -6 "$out/moe-bench-$shapes-$dtype.log"
  done
  # one CSV per dtype: the first file's header, every file's rows
  run awk 'FNR > 1 || NR == 1' "$out/moe-bench-qwen3-$dtype.csv" "$out/moe-bench-deepseek-$dtype.csv" \
    > "$out/moe-bench-$dtype.csv" || status=1
done
for shapes in qwen3 deepseek; do
  echo "== moe-bench $shapes e4m3 dX from W^T"
  run ./bench/moe-bench --libmoe-only --dtype e4m3 --w-transposed --shapes "$shapes" --tokens 4096 --repeat "$repeat" \
    --ops dx --csv "$out/moe-bench-$shapes-e4m3-wt.csv" > "$out/moe-bench-$shapes-e4m3-wt.log" 2>&1 || status=1
  [ "$dry" = 1 ] || tail -3 "$out/moe-bench-$shapes-e4m3-wt.log"
  # its rows into the e4m3 CSV, as op dx-wt (the op column is moe-bench's third)
  [ "$dry" = 1 ] || awk -F, -v OFS=, 'FNR > 1 { $3 = $3 "-wt"; print }' "$out/moe-bench-$shapes-e4m3-wt.csv" \
    >> "$out/moe-bench-e4m3.csv" || status=1
done
echo "== peers (PyTorch)"
peers=0
if [ "$dry" = 1 ]; then
  python3 "$R/bench/peers.py" --dry-run --skip-mlp --models "$models" --ops fwd,dx --fp8
else
  python3 "$R/bench/peers.py" --skip-mlp --models "$models" --ops fwd,dx --repeat "$repeat" --fp8 \
    --gemm-csv "$out/peers-gemm.csv" --fp8-csv "$out/peers-fp8.csv" > "$out/peers.log" 2>&1 || peers=$?
  cat "$out/peers.log"
fi
[ "$peers" = 0 ] || [ "$peers" = 77 ] || status=1
echo "== the ratio tables"
if [ "$peers" = 0 ]; then
  run python3 "$R/bench/peer-table.py" --moe-bench "$out/moe-bench-bf16.csv" --peers-gemm "$out/peers-gemm.csv" \
    --moe-bench-fp8 "$out/moe-bench-e4m3.csv" --peers-fp8 "$out/peers-fp8.csv" > "$out/fp8-peer-table.md" || status=1
else
  run python3 "$R/bench/peer-table.py" --moe-bench "$out/moe-bench-bf16.csv" \
    --moe-bench-fp8 "$out/moe-bench-e4m3.csv" > "$out/fp8-peer-table.md" || status=1
fi
[ "$dry" = 1 ] || cat "$out/fp8-peer-table.md"
exit $status
