/* cli/device.c: device buffers of `moe --backend cuda` (see device.h). */
#include "device.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#define MAX_BUFFERS 32

static void *buffers[MAX_BUFFERS];
static int num_buffers;

void device_free_all(void)
{
    for (int i = 0; i < num_buffers; i++)
        cudaFree(buffers[i]);
    num_buffers = 0;
}

static int failed(cudaError_t e, const char *what, const char *name, char *err, size_t err_size)
{
    snprintf(err, err_size, "%s of %s failed: %s (%s)", what, name, cudaGetErrorString(e), cudaGetErrorName(e));
    return -1;
}

int device_available(char *why, size_t why_size)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        snprintf(why, why_size, "cudaGetDeviceCount: %s", cudaGetErrorString(e));
        return -1;
    }
    if (count < 1) {
        snprintf(why, why_size, "cudaGetDeviceCount found no device");
        return -1;
    }
    return 0;
}

int device_upload(void **dev, const void *host, size_t bytes, const char *name, char *err, size_t err_size)
{
    static int cleanup_registered;
    *dev = NULL;
    if (num_buffers == MAX_BUFFERS) {
        snprintf(err, err_size, "internal error: more than %d device buffers (at %s)", MAX_BUFFERS, name);
        return -1;
    }
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 16);
    if (e != cudaSuccess)
        return failed(e, "cudaMalloc", name, err, err_size);
    /* registered after the first cudaMalloc, hence after the CUDA runtime's own exit handler: runs first */
    if (!cleanup_registered && atexit(device_free_all) == 0)
        cleanup_registered = 1;
    buffers[num_buffers++] = p;
    e = host != NULL ? cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice) : cudaMemset(p, 0xFF, bytes);
    if (e != cudaSuccess)
        return failed(e, host != NULL ? "cudaMemcpy to the device" : "cudaMemset", name, err, err_size);
    *dev = p;
    return 0;
}

int device_download(void *host, const void *dev, size_t bytes, const char *name, char *err, size_t err_size)
{
    cudaError_t e = cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess)
        return failed(e, "cudaMemcpy to the host", name, err, err_size);
    return 0;
}
