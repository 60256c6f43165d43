// CUDA grouped GEMM entry points (gpu/gemm_cuda.cu); same contract as the reference (moe_ref.h).
#ifndef LIBMOE_GEMM_CUDA_CUH
#define LIBMOE_GEMM_CUDA_CUH

extern "C" {
#include "moe_internal.h"
}

moe_status moe_cuda_gemm_fwd(const moe_gemm_problem *p, const void *x, const void *w,
                             const void *topk_weights, void *y);
moe_status moe_cuda_gemm_dx(const moe_gemm_problem *p, const void *dy, const void *w,
                            const void *topk_weights, void *dx);
moe_status moe_cuda_gemm_dw(const moe_gemm_problem *p, const void *x, const void *dy,
                            const void *topk_weights, void *dw);
moe_status moe_cuda_gemm_topk_weights_grad(const moe_gemm_problem *p, const void *x, const void *w,
                                           const void *dy, void *d_topk_weights);

// Waits for the stream, then reports (and clears) the first routing error detected on the device.
moe_status moe_cuda_synchronize(void *stream);

#endif
