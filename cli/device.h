/*
 * cli/device.h: the CUDA side of `moe --backend cuda` (built only when configure found CUDA; cli/call.c
 * uses it under MOE_CLI_CUDA).  Device buffers made here are registered and freed at exit too (an
 * atexit handler), so that die() leaves no device memory behind; device_free_all frees them earlier.
 * Every function returns 0 on success, or -1 with a message in err naming the array and the CUDA error.
 */
#ifndef LIBMOE_CLI_DEVICE_H
#define LIBMOE_CLI_DEVICE_H

#include <stddef.h>

/* 0 when a CUDA device can be used; otherwise -1 and why (e.g. "cudaGetDeviceCount: no CUDA-capable
 * device is detected"). */
int device_available(char *why, size_t why_size);

/* *dev = a new device buffer of `bytes` bytes (16 when bytes is 0, so it is a valid pointer), holding a
 * copy of host[0 .. bytes) when host is non-NULL, else every byte 0xFF (a float NaN poison, so that an
 * element the library leaves unwritten shows up in a comparison).  `name` names the array in errors. */
int device_upload(void **dev, const void *host, size_t bytes, const char *name, char *err, size_t err_size);

/* host[0 .. bytes) = dev[0 .. bytes). */
int device_download(void *host, const void *dev, size_t bytes, const char *name, char *err, size_t err_size);

/* Frees every buffer device_upload made (errors of cudaFree are not reported: a broken context was
 * reported by the call that broke it). */
void device_free_all(void);

#endif /* LIBMOE_CLI_DEVICE_H */
