// The CUDA backend's dispatch table and host glue (device pointers, options.stream).
#include "cuda_check.cuh"
#include "gemm_cuda.cuh"

static int cuda_available(void)
{
    int count = 0;
    return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

extern "C" const moe_dispatch moe_cuda_dispatch = {
    "cuda",
    cuda_available,
    moe_cuda_gemm_fwd,
    moe_cuda_gemm_dx,
    moe_cuda_gemm_dw,
    moe_cuda_gemm_topk_weights_grad,
    0, /* routing lives on the device: checked there */
};
