/*
 * Fail-fast CUDA helpers of the stand-alone GPU programs (proptest/test_gpu_*.c, bench/moe_bench.c):
 * CUDA_CHECK REQUIREs a CUDA runtime call to succeed; to_device / to_host copy through checked calls.
 * (The property engine's GPU cases use proptest/pt_cuda.h instead: there a failure ends the case, not the
 * program.)
 */
#ifndef LIBMOE_TESTLIB_GPU_CHECK_H
#define LIBMOE_TESTLIB_GPU_CHECK_H

#include "check.h"

#include <cuda_runtime_api.h>
#include <stddef.h>

#define CUDA_CHECK(call)                                                                             \
    do {                                                                                             \
        cudaError_t err_ = (call);                                                                   \
        REQUIRE(err_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(err_));                     \
    } while (0)

/* A device copy of host[0 .. bytes) (a 16-byte buffer when bytes is 0, so every pointer is valid). */
static inline void *to_device(const void *host, size_t bytes)
{
    void *dev = NULL;
    CUDA_CHECK(cudaMalloc(&dev, bytes ? bytes : 16));
    if (bytes)
        CUDA_CHECK(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
    return dev;
}

static inline void to_host(void *host, const void *dev, size_t bytes)
{
    if (bytes)
        CUDA_CHECK(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
}

#endif /* LIBMOE_TESTLIB_GPU_CHECK_H */
