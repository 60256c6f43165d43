# gpu/: CUDA kernels for the same ops as ref/, selected with MOE_BACKEND_CUDA.
# .cu files become libtool objects through build-aux/nvcc-lt (libtool does not know nvcc).
MOE_CUDA_SRCS = gpu/cuda_backend.cu gpu/gemm_cuda.cu
MOE_CUDA_HDRS = gpu/act_cuda.cuh gpu/cp_async_cuda.cuh gpu/cuda_check.cuh gpu/dtype_cuda.cuh gpu/gemm_cuda.cuh gpu/gate_sm90.cuh \
	gpu/gemm_sm90.cuh gpu/warp_scan_cuda.cuh
# the blockwise MoE MLP (gpu/mlp_cuda.h is C, included by src/mlp_api.c)
MOE_CUDA_SRCS += gpu/mlp_cuda.cu
MOE_CUDA_HDRS += gpu/mlp_cuda.h
# routing and MLP layouts built on the device (gpu/routing_cuda.h is C, included by src/)
MOE_CUDA_SRCS += gpu/routing_cuda.cu
MOE_CUDA_HDRS += gpu/routing_cuda.h
EXTRA_DIST += build-aux/nvcc-lt $(MOE_CUDA_SRCS) $(MOE_CUDA_HDRS)

if MOE_CUDA
MOE_CUDA_OBJECTS = $(MOE_CUDA_SRCS:.cu=.lo)
libmoe_la_LIBADD += $(MOE_CUDA_OBJECTS) $(CUDA_LIBS)
EXTRA_libmoe_la_DEPENDENCIES = $(MOE_CUDA_OBJECTS)
$(MOE_CUDA_OBJECTS): $(MOE_CUDA_HDRS) $(top_srcdir)/include/moe.h $(top_srcdir)/backend/moe_backend.h
endif

NVCC_COMPILE = $(NVCC) -std=c++17 -O3 $(CUDA_GENCODE) -I$(top_srcdir)/include -I$(top_srcdir)/backend \
	-I$(top_builddir) $(MOE_NVCC_WARNFLAGS) $(NVCCFLAGS)
AM_V_NVCC = $(am__v_NVCC_@AM_V@)
am__v_NVCC_ = $(am__v_NVCC_@AM_DEFAULT_V@)
am__v_NVCC_0 = @echo "  NVCC    " $@;
am__v_NVCC_1 =
SUFFIXES = .cu .lo
.cu.lo:
	$(AM_V_NVCC)$(SHELL) $(top_srcdir)/build-aux/nvcc-lt $@ $(NVCC_COMPILE) -c $<

mostlyclean-local: mostlyclean-cuda
mostlyclean-cuda:
	-rm -rf gpu/.libs gpu/*.o gpu/*.lo
.PHONY: mostlyclean-cuda

if MOE_CUDA
gpu/mlp_cuda.lo gpu/routing_cuda.lo: $(top_srcdir)/backend/moe_backend.h $(top_srcdir)/include/moe_mlp.h
endif
