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

// 8 consecutive elements base[i .. i+7] as float (i a multiple of 8, base 16-byte aligned).
static __device__ __forceinline__ void load8(moe_dtype dtype, const void *base, int64_t i, float *v)
{
    if (dtype == MOE_F32) {
        const float4 a = *reinterpret_cast<const float4 *>(static_cast<const float *>(base) + i);
        const float4 b = *reinterpret_cast<const float4 *>(static_cast<const float *>(base) + i + 4);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        return;
    }
    const uint4 raw = *reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(base) + i);
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const unsigned short lo = (unsigned short)(words[u] & 0xffffu), hi = (unsigned short)(words[u] >> 16);
        if (dtype == MOE_F16) {
            v[2 * u] = __half2float(__ushort_as_half(lo)), v[2 * u + 1] = __half2float(__ushort_as_half(hi));
        } else {
            v[2 * u] = __bfloat162float(__ushort_as_bfloat16(lo)), v[2 * u + 1] = __bfloat162float(__ushort_as_bfloat16(hi));
        }
    }
}

// streaming: evict-first stores (st.global.cs), so that an output written once does not push the
// operands that other tiles still read out of L2.
static __device__ __forceinline__ void store8(moe_dtype dtype, void *base, int64_t i, const float *v, bool streaming = false)
{
    if (dtype == MOE_F32) {
        float4 *p = reinterpret_cast<float4 *>(static_cast<float *>(base) + i);
        const float4 lo = make_float4(v[0], v[1], v[2], v[3]), hi = make_float4(v[4], v[5], v[6], v[7]);
        if (streaming)
            __stcs(p, lo), __stcs(p + 1, hi);
        else
            p[0] = lo, p[1] = hi;
        return;
    }
    uint32_t words[4];
#pragma unroll
    for (int u = 0; u < 4; u++) {
        unsigned short lo, hi;
        if (dtype == MOE_F16) {
            lo = __half_as_ushort(__float2half_rn(v[2 * u])), hi = __half_as_ushort(__float2half_rn(v[2 * u + 1]));
        } else {
            lo = __bfloat16_as_ushort(__float2bfloat16_rn(v[2 * u]));
            hi = __bfloat16_as_ushort(__float2bfloat16_rn(v[2 * u + 1]));
        }
        words[u] = (uint32_t)lo | ((uint32_t)hi << 16);
    }
    uint4 *p = reinterpret_cast<uint4 *>(static_cast<uint16_t *>(base) + i);
    const uint4 packed = make_uint4(words[0], words[1], words[2], words[3]);
    if (streaming)
        __stcs(p, packed);
    else
        *p = packed;
}

#endif // LIBMOE_DTYPE_CUDA_CUH
