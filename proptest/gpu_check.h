/*
 * Fail-fast helpers of the stand-alone GPU programs (proptest/test_gpu_gemm.c, proptest/test_gpu_autotune.c,
 * bench/moe_bench.c): CHECK prints "file:line: message" and exits with status 1; CUDA_CHECK does so for a
 * CUDA runtime call that fails; xmalloc never returns NULL; to_device / to_host copy through checked calls.
 * (The property engine's GPU cases use pt_cuda.h instead: there a failure ends the case, not the program.)
 */
#ifndef LIBMOE_GPU_CHECK_H
#define LIBMOE_GPU_CHECK_H

#include "fail_fast.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#define CUDA_CHECK(call)                                                                             \
    do {                                                                                             \
        cudaError_t err_ = (call);                                                                   \
        CHECK(err_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(err_));                      \
    } while (0)

static inline void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    CHECK(p != NULL, "out of memory");
    return p;
}

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

#endif /* LIBMOE_GPU_CHECK_H */
