# bench/gpu.mk: the CUDA benchmark against cuBLAS (bench/moe_bench.c), built when CUDA is configured.
if MOE_CUDA
noinst_PROGRAMS += bench/moe-bench
bench_moe_bench_SOURCES = bench/moe_bench.c
bench_moe_bench_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS)
bench_moe_bench_LDADD = $(TESTLIB_LIBS) $(CUDA_LIBS) -lcublas
else
EXTRA_DIST += bench/moe_bench.c
endif
EXTRA_DIST += bench/device-fp8.sh bench/device-fp8-profile.sh bench/fp8_accum_probe.cu bench/device-run.sh bench/device-fuzz.sh bench/device-ab.sh bench/ab-variants.sh

# The CUDA blockwise MoE MLP timing (bench/mlp_gpu_time.c) and its device script.
if MOE_CUDA
noinst_PROGRAMS += bench/mlp-gpu-time
bench_mlp_gpu_time_SOURCES = bench/mlp_gpu_time.c
bench_mlp_gpu_time_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS)
bench_mlp_gpu_time_LDADD = $(TESTLIB_LIBS) $(CUDA_LIBS) -lcublas
else
EXTRA_DIST += bench/mlp_gpu_time.c
endif
EXTRA_DIST += bench/device-run-mlp.sh bench/device-ab-mlp.sh
# ncu --csv -> one line per kernel launch (name, grid, us): the per-kernel tables of bench/RESULTS.md
EXTRA_DIST += bench/ncu-kernel-times.py
# The peers in PyTorch (torch._grouped_mm, an eager MoE MLP) beside moe-bench and mlp-gpu-time, and the
# ratio table against the best peer of one run.
EXTRA_DIST += bench/peers.py bench/peer-table.py bench/device-peers.sh bench/device-build.sh
# libmoe's FP8 GEMM beside torch._scaled_grouped_mm (row-wise scales) and its own bf16 rate, one device call.
EXTRA_DIST += bench/device-fp8-peers.sh
# Mixtral-8x7B's GEMMs against cuBLAS under ncu; the A/B of a Hopper FP8 kernel switch with its stall profile.
EXTRA_DIST += bench/device-mixtral-profile.sh bench/device-fp8-ab.sh bench/device-fp8-wide.sh bench/device-fp8-dw.sh \
	bench/device-fp8-dw-sm90.sh
