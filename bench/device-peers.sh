#!/bin/bash
# libmoe and its peers in one device call, from a `make dist` tarball, logging under $OUT (or ./out):
#   1. bench/moe-bench on ANCHORS.md's GEMM shapes (libmoe, cuBLAS per-expert loop, cuBLAS grouped, dense),
#   2. bench/mlp-gpu-time on each MLP shape of bench/peers.py, rounded intermediates (the default) and float32,
#   3. bench/peers.py: torch._grouped_mm and an eager PyTorch MoE MLP on the same shapes (where torch imports),
#   4. bench/peer-table.py: the ratio table ($OUT/peer-table.md), each row against the best peer of this run.
# usage: bench/device-peers.sh TARBALL     (MOE_PEERS_MLP_SHAPES: a comma list of bench/peers.py's MLP names)
# The exit status is that of the steps' checks; a row behind its best peer is listed, not an error.
set -eu
tarball=$1
out=${OUT:-$PWD/out}
build_targets="bench/moe-bench bench/mlp-gpu-time"
. "$(dirname "$0")/device-build.sh"
mkdir -p "$out/mlp"
status=0
echo "== moe-bench"
./bench/moe-bench --tokens 4096 --repeat 20 --csv "$out/moe-bench.csv" > "$out/moe-bench.log" 2>&1 || status=1
tail -3 "$out/moe-bench.log"
shapes=${MOE_PEERS_MLP_SHAPES:-qwen3-t4096,qwen3-t16384,mixtral-t4096,gpt-oss-t4096,e128k8-i512-t32768}
echo "== mlp-gpu-time ($shapes)"
for name in ${shapes//,/ }; do
  args=$(python3 -c "import sys; sys.path.insert(0, 'bench'); import importlib; p = importlib.import_module('peers'); print(*p.MLP_SHAPES['$name'])")
  set -- $args   # T E k H I
  for mode in rounded float32; do
    flag=1; [ "$mode" = float32 ] && flag=0
    timeout 240 ./bench/mlp-gpu-time "$1" "$2" "$3" "$4" "$5" 128 bf16 10 "$flag" > "$out/mlp/$name.$mode.log" 2>&1 ||
      { status=1; tail -5 "$out/mlp/$name.$mode.log"; }
    echo "$name $mode: $(grep -E '^(forward|backward)' "$out/mlp/$name.$mode.log" | sed 's/ median.*=/ =/' | tr '\n' ' ')"
  done
done
echo "== peers (PyTorch)"
peers=0
python3 bench/peers.py --gemm-csv "$out/peers-gemm.csv" --mlp-csv "$out/peers-mlp.csv" --mlp-shapes "$shapes" \
  > "$out/peers.log" 2>&1 || peers=$?
tail -4 "$out/peers.log"
[ "$peers" = 0 ] || [ "$peers" = 77 ] || status=1
echo "== the ratio table"
if [ "$peers" = 0 ]; then
  python3 bench/peer-table.py --moe-bench "$out/moe-bench.csv" --peers-gemm "$out/peers-gemm.csv" \
    --mlp-dir "$out/mlp" --peers-mlp "$out/peers-mlp.csv" | tee "$out/peer-table.md"
else
  python3 bench/peer-table.py --moe-bench "$out/moe-bench.csv" | tee "$out/peer-table.md"
fi
exit $status
