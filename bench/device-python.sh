#!/bin/bash
# The Python package on a GPU machine, from a `make dist` tarball, logging under $OUT (or ./out):
#   1. make check of the Python tests: tests/test_python.sh (CPU tensors) and tests/test_python_cuda.sh
#      (CUDA tensors, CUDA graphs, torch.compile, the device-side error reports);
#   2. bench/moe-bench --libmoe-only on the ANCHORS.md shapes (the C entry), then bench/python_bench.py on
#      the same shapes (the Python entry, beside the C numbers) and one MoE layer step against eager
#      torch._grouped_mm; bench/python_host.py --device cuda (host time per call of each Python entry).
# usage: bench/device-python.sh TARBALL [steps]   steps: any of "test bench" (default both)
set -eu
tarball=$1
steps=${2:-"test bench"}
out=${OUT:-$PWD/out}
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
build_targets="bench/moe-bench"
. "$(dirname "$0")/device-build.sh"
status=0
case "$steps" in *test*)
  echo "== make check (Python tests)"
  make -j16 check TESTS="tests/test_python.sh tests/test_python_cuda.sh" VERIFY_TESTS= > "$out/check.log" 2>&1 ||
    status=1
  cp tests/test_python.sh.log tests/test_python_cuda.sh.log "$out/" 2>/dev/null || true
  grep -E '^(PASS|FAIL|SKIP|ERROR)' "$out/check.log" || tail -40 "$out/check.log"
  tail -25 tests/test_python_cuda.sh.log
esac
case "$steps" in *bench*)
  echo "== moe-bench --libmoe-only, then python_bench.py"
  ./bench/moe-bench --libmoe-only --tokens 4096 --repeat 20 --csv "$out/c.csv" \
    > "$out/moe-bench.txt" 2>&1 || { status=1; tail -20 "$out/moe-bench.txt"; }
  LIBMOE_PATH="$PWD/.libs/libmoe.so" python3 bench/python_bench.py --tokens 4096 --repeat 20 --c-csv "$out/c.csv" \
    2>&1 | tee "$out/python-bench.txt" || status=1
  echo "== python_host.py: host us per call on tiny CUDA tensors"
  LIBMOE_PATH="$PWD/.libs/libmoe.so" python3 bench/python_host.py --device cuda 2>&1 | tee "$out/python-host.txt" ||
    status=1
esac
exit $status
