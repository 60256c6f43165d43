# bench/gpu.mk: the CUDA benchmark against cuBLAS (bench/moe_bench.c), built when CUDA is configured.
if MOE_CUDA
noinst_PROGRAMS += bench/moe-bench
bench_moe_bench_SOURCES = bench/moe_bench.c
bench_moe_bench_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS)
bench_moe_bench_LDADD = libmoe.la proptest/liboracle.la $(CUDA_LIBS) -lcublas -lm
else
EXTRA_DIST += bench/moe_bench.c
endif
EXTRA_DIST += bench/device-run.sh
