# ref/: the plain-C11 OpenMP CPU reference of every op.
libmoe_la_SOURCES += ref/routing.c ref/gemm_naive.c ref/gemm_naive_dot.c ref/gemm_naive_value.c ref/alloc_shells.c ref/ref_backend.c
noinst_HEADERS += ref/moe_ref.h ref/ref_threads.h ref/ref_bf16.h ref/gemm_naive_internal.h

# ref/gemm/: the grouped GEMM's blocked twin, the one the public API runs (gemm_internal.h has the design).
libmoe_la_SOURCES += ref/gemm/kernels.c ref/gemm/tiles.c ref/gemm/setup.c ref/gemm/fwd_dw.c ref/gemm/dx.c \
	ref/gemm/topk.c
noinst_HEADERS += ref/gemm/gemm_internal.h ref/gemm/convert.h

# The blockwise MoE MLP reference (issue 3): the block layouts (ref/mlp_layout.c) and ref/mlp/, the forward
# and backward (mlp_internal.h has the structure).
include_HEADERS += include/moe_mlp.h
libmoe_la_SOURCES += src/mlp_api.c ref/mlp_layout.c ref/mlp/tiles.c ref/mlp/activations.c ref/mlp/slot_index.c \
	ref/mlp/workspace.c ref/mlp/fwd.c ref/mlp/bwd.c
noinst_HEADERS += ref/mlp_ref.h ref/mlp/mlp_internal.h ref/mlp/activations.h
EXTRA_DIST += specs/MLP.md

# FP8 grouped GEMM and quantization (specs/FP8.md): the scale and code access (fp8_ref.h), the readable
# reference of fwd, dX and dW (gemm_fp8.c), its blocked twin that the reference backend runs
# (gemm_fp8_blocked.c), the row, block and column quantizers (fp8_quantize.c), dW's and the column quantizer's
# transposed codes around them (fp8_transposed.c).
include_HEADERS += include/moe_fp8.h
libmoe_la_SOURCES += src/gemm_fp8_api.c src/fp8_quantize_api.c ref/gemm_fp8.c ref/gemm_fp8_blocked.c \
    ref/fp8_quantize.c ref/fp8_transposed.c
noinst_HEADERS += ref/fp8_ref.h
EXTRA_DIST += specs/FP8.md
