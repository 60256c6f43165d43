# bench/: benchmarks (CPU reference here; the CUDA benchmark joins with gpu/).
# ref-bench: every grouped GEMM op of the CPU reference on a real model shape, timed and checked against
# the float64 oracle bound (README "main job": ./bench/ref-bench --model qwen3-30b-a3b --tokens 256).
# noinst: it also calls the naive twins (ref/moe_ref.h) directly for --twin naive.
noinst_PROGRAMS += bench/ref-bench
bench_ref_bench_SOURCES = bench/ref-bench.c
bench_ref_bench_LDADD = libmoe.la oracle/liboracle.la -lm
EXTRA_DIST += bench/RESULTS.md
