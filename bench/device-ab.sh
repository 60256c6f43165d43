#!/bin/bash
# A/B timing of kernel variants on a GPU machine, in one call: builds each variant from a `make dist`
# tarball (in parallel), runs the strict Hopper property test on every variant but the first, then
# bench/moe-bench (libmoe alone, do_bench timing) on each variant in turn, alternated for several rounds,
# so that every variant sees the same machine state.  Logs under $OUT (or ./out); prints one line per
# (variant, round) with TFLOP/s per shape and op.
#
# usage: bench/device-ab.sh NAME=TARBALL[:NVCCFLAGS] ...
#   NAME       a label (letters, digits, '_')
#   TARBALL    a `make dist` tarball (e.g. of the base commit and of the change)
#   NVCCFLAGS  optional extra nvcc flags for this build (compile-time variants of one tarball, -DNAME=VALUE)
# environment: AB_ROUNDS (2), AB_BENCH_ARGS (extra moe-bench arguments, e.g. "--ops dw --shapes qwen3"),
#   AB_TRIALS (strict sm90 property-test trials per variant, 30; 0 skips it).
# The first variant is the base: it is timed but not tested (it is the landed code).
# Example (the method of bench/RESULTS.md, 2026-11-24; `x` builds the change with a macro it reads):
#   AB_BENCH_ARGS="--ops dw" bench/device-ab.sh base=base.tar.gz new=new.tar.gz x=new.tar.gz:-DMY_VARIANT=1
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/ab-variants.sh"
out=${OUT:-$PWD/out}
mkdir -p "$out"
rounds=${AB_ROUNDS:-2}
trials=${AB_TRIALS:-30}
[ $# -ge 1 ] || { sed -n '2,16p' "$0"; exit 2; }
jobs=$(( $(nproc) / $# )); [ "$jobs" -ge 1 ] || jobs=1
build() { # name tarball flags
  local dir=/tmp/ab-$1
  rm -rf "$dir" && mkdir -p "$dir" && tar -C "$dir" -xzf "$2" && cd "$dir"/libmoe-* &&
    ./configure --with-cuda=yes --with-cuda-arch="90a;80" --enable-werror NVCCFLAGS="$3" > "$out/configure_$1.log" 2>&1 &&
    make -j"$jobs" > "$out/build_$1.log" 2>&1 &&
    make -j"$jobs" proptest/test_gpu_gemm bench/moe-bench >> "$out/build_$1.log" 2>&1
  echo "build $1: exit $?"
}
ab_build_variants build "$@"
status=0
for name in "${names[@]:1}"; do
  [ "$trials" -gt 0 ] || break
  (cd /tmp/ab-"$name"/libmoe-* && LD_LIBRARY_PATH=$PWD/.libs MOE_CUDA_KERNEL=sm90 \
     ./proptest/test_gpu_gemm 20261124 "$trials" > "$out/test_$name.log" 2>&1) || status=1
  echo "test $name: $(tail -1 "$out/test_$name.log")"
done
for round in $(seq 1 "$rounds"); do
  for name in "${names[@]}"; do
    line=$(cd /tmp/ab-"$name"/libmoe-* && LD_LIBRARY_PATH=$PWD/.libs ./bench/moe-bench --tokens 4096 --repeat 20 \
             --libmoe-only ${AB_BENCH_ARGS:-} 2>&1 | tee -a "$out/bench_$name.log" |
             awk '/^(qwen|mixtral|deepseek)/ {printf "%s %s %s %s  ", $1, $2, $3, $8}'
           exit "${PIPESTATUS[0]}") || status=1 # moe-bench's status: 1 when an output failed its checks
    echo "$name round $round: $line"
  done
done
exit $status
