# gpu/: CUDA kernels for the same ops as ref/, selected with MOE_BACKEND_CUDA.
# .cu files become libtool objects through build-aux/nvcc-lt (libtool does not know nvcc); object basenames
# are unique across the subfolders (libtool's static archive keeps basenames).
#   common/   dtype, activations, cp.async, warp scans, error checks, the sticky device-error record, launch helpers
#   gemm/     the grouped GEMM: one file per kernel family, the plan and its heuristics, the entry points
#   mlp/      the blockwise MLP: layout check, tile path, elementwise and rows-path kernels, the fused gate kernel
#   routing/  the device builders of routings and MLP layouts
#   fp8/      the FP8 quantizers (rows, blocks, dW's columns) and their inverse; dW's 128 x 1 tiles
MOE_CUDA_SRCS = gpu/cuda_backend.cu
MOE_CUDA_HDRS = gpu/common/act.cuh gpu/common/cp_async.cuh gpu/common/cuda_check.cuh gpu/common/device_error.cuh \
	gpu/common/dtype.cuh gpu/common/launch.cuh gpu/common/simt_tile.cuh gpu/common/warp_scan.cuh
# the grouped GEMM (gpu/gemm/gemm.cuh: its entry points and the rows GEMMs of the MLP)
MOE_CUDA_SRCS += gpu/gemm/gemm.cu gpu/gemm/routing_check.cu gpu/gemm/plan.cu gpu/gemm/heuristics.cu gpu/gemm/tma.cu \
	gpu/gemm/tune.cu gpu/gemm/simt.cu gpu/gemm/sm80.cu gpu/gemm/tf32.cu gpu/gemm/sm90.cu gpu/gemm/sm90_dw_pingpong.cu \
	gpu/gemm/rows.cu gpu/gemm/rows_f32_sm90.cu gpu/gemm/fp8.cu gpu/gemm/fp8_dw.cu gpu/gemm/fp8_dw_sm90.cu gpu/gemm/fp8_sm90.cu
MOE_CUDA_HDRS += gpu/gemm/gemm.cuh gpu/gemm/args.cuh gpu/gemm/epilogue.cuh gpu/gemm/fp8.cuh gpu/gemm/heuristics.cuh gpu/gemm/mma_sm80.cuh \
	gpu/gemm/pingpong_rows.cuh gpu/gemm/plan.cuh gpu/gemm/rows.cuh gpu/gemm/sm80.cuh gpu/gemm/sm90.cuh \
	gpu/gemm/sm90_dw_pingpong.cuh gpu/gemm/tma.cuh gpu/gemm/tma_store.cuh gpu/gemm/tune.cuh gpu/gemm/wgmma_fp8.cuh
# the blockwise MoE MLP (gpu/mlp/mlp_cuda.h is C, included by gpu/cuda_backend.cu)
MOE_CUDA_SRCS += gpu/mlp/mlp.cu gpu/mlp/layout_check.cu gpu/mlp/tile_ops.cu gpu/mlp/elementwise.cu \
	gpu/mlp/rows_layout.cu gpu/mlp/gather.cu gpu/mlp/gate_rows.cu gpu/mlp/gate_sm90.cu
MOE_CUDA_HDRS += gpu/mlp/mlp_cuda.h gpu/mlp/args.cuh gpu/mlp/gate_sm90.cuh gpu/mlp/steps.cuh gpu/mlp/tile_engine.cuh \
	gpu/mlp/vec.cuh
# routing and MLP layouts built on the device (gpu/routing/builders.h is C)
MOE_CUDA_SRCS += gpu/routing/builders.cu
MOE_CUDA_HDRS += gpu/routing/builders.h
# FP8 quantization and dequantization on the device (gpu/fp8/quantize.h is C)
MOE_CUDA_SRCS += gpu/fp8/quantize.cu
MOE_CUDA_HDRS += gpu/fp8/quantize.h gpu/fp8/column_tiles.cuh
EXTRA_DIST += build-aux/nvcc-lt $(MOE_CUDA_SRCS) $(MOE_CUDA_HDRS)

if MOE_CUDA
MOE_CUDA_OBJECTS = $(MOE_CUDA_SRCS:.cu=.lo)
libmoe_la_LIBADD += $(MOE_CUDA_OBJECTS) $(CUDA_LIBS)
EXTRA_libmoe_la_DEPENDENCIES = $(MOE_CUDA_OBJECTS)
$(MOE_CUDA_OBJECTS): $(MOE_CUDA_HDRS) $(top_srcdir)/include/moe.h $(top_srcdir)/backend/moe_backend.h \
	$(top_srcdir)/include/moe_mlp.h $(top_srcdir)/include/moe_fp8.h $(top_srcdir)/backend/moe_activations.h
endif

NVCC_COMPILE = $(NVCC) -std=c++17 -O3 $(CUDA_GENCODE) -I$(top_srcdir)/include -I$(top_srcdir)/backend \
	-I$(top_srcdir)/gpu -I$(top_builddir) $(MOE_NVCC_WARNFLAGS) $(NVCCFLAGS)
AM_V_NVCC = $(am__v_NVCC_@AM_V@)
am__v_NVCC_ = $(am__v_NVCC_@AM_DEFAULT_V@)
am__v_NVCC_0 = @echo "  NVCC    " $@;
am__v_NVCC_1 =
SUFFIXES = .cu .lo
.cu.lo:
	$(AM_V_NVCC)$(SHELL) $(top_srcdir)/build-aux/nvcc-lt $@ $(NVCC_COMPILE) -c $<

mostlyclean-local: mostlyclean-cuda
mostlyclean-cuda:
	-rm -rf gpu/.libs gpu/*/.libs gpu/*.o gpu/*/*.o gpu/*.lo gpu/*/*.lo
.PHONY: mostlyclean-cuda
