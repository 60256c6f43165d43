#!/bin/bash
# A/B of the CUDA MLP's kernels on a GPU machine, in one call (bench/device-ab.sh's twin for the MLP): builds
# each variant from a `make dist` tarball (in parallel), runs proptest/test_gpu_mlp on every variant, then per
# shape and variant the kernels' times under ncu (one line per launch through bench/ncu-kernel-times.py:
# name, grid, us) and bench/mlp-gpu-time's medians.  Logs under $OUT (or ./out); the lines printed are also
# in $OUT/summary.log.
#
# usage: bench/device-ab-mlp.sh NAME=TARBALL[:NVCCFLAGS] ...
#   NAME       a label (letters, digits, '_')
#   TARBALL    a `make dist` tarball (e.g. of the base commit and of the change)
#   NVCCFLAGS  optional extra nvcc flags for this build (compile-time variants of one tarball, -DNAME=VALUE)
# environment:
#   AB_KERNELS   ncu's kernel-name regex ("gate_bwd"; empty skips ncu)
#   AB_LAUNCHES  launches profiled per (shape, variant) (3: with "gate_bwd", one per backward)
#   AB_SHAPES    ';'-separated mlp-gpu-time shapes "T E k H I" ("16384 128 8 2048 768;4096 8 2 4096 14336":
#                Qwen3-30B-A3B and Mixtral-8x7B of ANCHORS.md), all with B = 128 and bf16
#   AB_TEST      test_gpu_mlp's arguments ("20261122 96 16 0 2 8": seed, option-cross, fused, first fused,
#                many-experts and offset cases; empty skips the test)
#   AB_TIME      mlp-gpu-time repeats (10; 0 skips the timing)
#   AB_OPTIONS   mlp-gpu-time's activation and affinity ("silu h"; e.g. "gelu i": the gate kernels' GELU
#                instances and their general form); a tarball older than main 6c61953 ignores them (SiLU, H)
# Exit status 1 when a build, a test or a timing run failed.
# Example (bench/RESULTS.md, 2026-11-28, seventeenth session):
#   AB_KERNELS="gate_bwd|gather_rows" bench/device-ab-mlp.sh base=base.tar.gz new=new.tar.gz x=new.tar.gz:-DMY_KNOB=3
set -u
out=${OUT:-$PWD/out}
mkdir -p "$out"
summary=$out/summary.log
kernels=${AB_KERNELS-gate_bwd}
launches=${AB_LAUNCHES:-3}
shapes=${AB_SHAPES:-"16384 128 8 2048 768;4096 8 2 4096 14336"}
test_args=${AB_TEST-"20261122 96 16 0 2 8"}
repeats=${AB_TIME:-10}
options=${AB_OPTIONS:-"silu h"}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/ab-variants.sh"
[ $# -ge 1 ] || { sed -n '2,24p' "$0"; exit 2; }
say() { echo "$*" | tee -a "$summary"; }
jobs=$(( $(nproc) / $# )); [ "$jobs" -ge 1 ] || jobs=1
build() { # name tarball flags
  local dir=/tmp/ab-mlp-$1
  rm -rf "$dir" && mkdir -p "$dir" && tar -C "$dir" -xzf "$2" && cd "$dir"/libmoe-* &&
    ./configure --with-cuda=yes --with-cuda-arch="90a;80" --enable-werror NVCCFLAGS="$3" \
      > "$out/configure_$1.log" 2>&1 &&
    make -j"$jobs" > "$out/build_$1.log" 2>&1 &&
    make -j"$jobs" proptest/test_gpu_mlp bench/mlp-gpu-time >> "$out/build_$1.log" 2>&1
  echo "build $1: exit $?" | tee -a "$summary"
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$summary"
ab_build_variants build "$@"
status=0
grep -q ": exit [^0]" "$summary" && status=1
in_variant() { # name command...: runs in the variant's build tree, its library first
  local name=$1; shift
  (cd /tmp/ab-mlp-"$name"/libmoe-* && LD_LIBRARY_PATH=$PWD/.libs "$@")
}
if [ -n "$test_args" ]; then
  for name in "${names[@]}"; do
    in_variant "$name" ./proptest/test_gpu_mlp $test_args > "$out/test_$name.log" 2>&1 || status=1
    say "test $name ($test_args): $(tail -1 "$out/test_$name.log")"
  done
fi
IFS=';' read -r -a shape_list <<< "$shapes"
for shape in "${shape_list[@]}"; do
  if [ -n "$kernels" ]; then
    for name in "${names[@]}"; do
      say "== ncu $name, $shape ($options), kernels /$kernels/"
      in_variant "$name" ncu --csv --clock-control none --metrics gpu__time_duration.sum -k regex:"$kernels" \
        --launch-count "$launches" ./bench/mlp-gpu-time $shape 128 bf16 1 1 $options 2> "$out/ncu_stderr_$name.log" |
        python3 "$here/ncu-kernel-times.py" | tee -a "$summary"
    done
  fi
  if [ "$repeats" -gt 0 ]; then
    for name in "${names[@]}"; do
      line=$(in_variant "$name" ./bench/mlp-gpu-time $shape 128 bf16 "$repeats" 1 $options 2>&1 |
               tee -a "$out/time_$name.log" |
               awk '/^(forward|backward) *:/ { # "forward : median 2.926 ms (min ...) ... = 422.8 TFLOP/s"
                      name = $1; sub(":", "", name)
                      match($0, /median [0-9.]+ ms/); med = substr($0, RSTART + 7, RLENGTH - 10)
                      match($0, /= [0-9.]+ TFLOP/); tf = substr($0, RSTART + 2, RLENGTH - 8)
                      printf "%s %s ms %s TFLOP/s   ", name, med, tf }'
             exit "${PIPESTATUS[0]}") || status=1
      say "time $name, $shape ($options): $line"
    done
  fi
done
exit $status
