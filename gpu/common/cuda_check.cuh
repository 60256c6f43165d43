// Host-side CUDA error handling for gpu/: every CUDA call goes through MOE_CUDA_CHECK, which records
// the failing call, file and line for moe_last_error() and returns MOE_ERR_DEVICE from the caller.
#ifndef LIBMOE_GPU_COMMON_CUDA_CHECK_CUH
#define LIBMOE_GPU_COMMON_CUDA_CHECK_CUH

#include <cuda_runtime.h>

extern "C" {
#include "moe_backend.h"
}

#define MOE_CUDA_CHECK(call)                                                                       \
    do {                                                                                           \
        cudaError_t moe_cuda_err_ = (call);                                                        \
        if (moe_cuda_err_ != cudaSuccess)                                                          \
            return moe_fail_at(__FILE__, __LINE__, MOE_ERR_DEVICE, "%s: %s failed: %s (%s:%d)",    \
                               "cuda", #call, cudaGetErrorString(moe_cuda_err_), __FILE__, __LINE__); \
    } while (0)

#endif
