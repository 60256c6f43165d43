/*
 * Device-memory helpers of the GPU properties (pt_gpu.c: gpu-gemm, pt_gpu_mlp.c: gpu-mlp).  Every CUDA
 * call goes through pt_cuda_ok, which turns an error into the case's failure (tag "cuda"), so a case
 * never continues on a failed copy.
 */
#ifndef LIBMOE_PT_CUDA_H
#define LIBMOE_PT_CUDA_H

#include "pt.h"

#include <cuda_runtime_api.h>
#include <stddef.h>

/* 1 when err is cudaSuccess; otherwise fails the case ("cuda": what and the CUDA message) and gives 0. */
int pt_cuda_ok(pt_case *c, cudaError_t err, const char *what);
/* A device buffer of `bytes` bytes (16 when bytes is 0, so that every buffer is a valid pointer) holding
 * a copy of host[0 .. bytes) (uninitialised when host is NULL); NULL (and the case failed) on error. */
void *pt_device_copy(pt_case *c, const void *host, size_t bytes);
/* Copies bytes from a device buffer to host; 1 on success, 0 (case failed) on error. */
int pt_device_download(pt_case *c, void *host, const void *dev, size_t bytes);
/* cudaFree of every non-NULL pointer of ptrs[0 .. count) (errors of cudaFree are not reported: the case
 * has its verdict already and a later CUDA call reports a broken context). */
void pt_device_free_all(void *const *ptrs, size_t count);

#endif /* LIBMOE_PT_CUDA_H */
