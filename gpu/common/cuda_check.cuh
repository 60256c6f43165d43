// Host-side CUDA error handling for gpu/: every CUDA call goes through MOE_CUDA_CHECK, which records
// the failing call, file and line for moe_last_error() and returns MOE_ERR_DEVICE from the caller; a call's
// stream-ordered workspace is freed by free_call_workspace, which keeps the call's first error.
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

namespace moe_gpu {

// Frees a call's workspace (cudaFreeAsync on its stream) and returns `status`, or MOE_ERR_DEVICE naming op
// when the free failed and status was MOE_OK.
inline moe_status free_call_workspace(const char *op, void *base, cudaStream_t stream, moe_status status)
{
    const cudaError_t err = cudaFreeAsync(base, stream);
    if (status == MOE_OK && err != cudaSuccess)
        return moe_fail(MOE_ERR_DEVICE, "%s: cudaFreeAsync failed: %s", op, cudaGetErrorString(err));
    return status;
}

} // namespace moe_gpu

#endif
