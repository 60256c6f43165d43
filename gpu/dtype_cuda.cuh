// Element loads and stores of the CUDA kernels: every tensor is f32, f16 or bf16 (moe_dtype), read as
// float and written back with one round-to-nearest-even conversion (NaN and Inf kept; the cuda_fp16 /
// cuda_bf16 _rn conversions are RNE), the same rounding as the CPU reference (ref/dtype.c).
#ifndef LIBMOE_DTYPE_CUDA_CUH
#define LIBMOE_DTYPE_CUDA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "moe.h"

// base[i] of a tensor of `dtype`, as float.
static __device__ __forceinline__ float load_as_float(moe_dtype dtype, const void *base, int64_t i)
{
    if (dtype == MOE_F32)
        return static_cast<const float *>(base)[i];
    if (dtype == MOE_F16)
        return __half2float(static_cast<const __half *>(base)[i]);
    return __bfloat162float(static_cast<const __nv_bfloat16 *>(base)[i]);
}

// base[i] = v rounded once (RNE) to `dtype`.
static __device__ __forceinline__ void store_from_float(moe_dtype dtype, void *base, int64_t i, float v)
{
    if (dtype == MOE_F32)
        static_cast<float *>(base)[i] = v;
    else if (dtype == MOE_F16)
        static_cast<__half *>(base)[i] = __float2half_rn(v);
    else
        static_cast<__nv_bfloat16 *>(base)[i] = __float2bfloat16_rn(v);
}

#endif // LIBMOE_DTYPE_CUDA_CUH
