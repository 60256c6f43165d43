// Element loads and stores of the CUDA kernels: every tensor is f32, f16 or bf16 (moe_dtype), read as
// float and written back with one round-to-nearest-even conversion (NaN and Inf kept; the cuda_fp16 /
// cuda_bf16 _rn conversions are RNE), the same rounding as the CPU reference (src/dtype.c).
#ifndef LIBMOE_GPU_COMMON_DTYPE_CUH
#define LIBMOE_GPU_COMMON_DTYPE_CUH

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

// v truncated to bf16 (its upper 16 bits: round toward zero, so the result has v's sign and |result| <= |v|;
// an infinity stays itself, a NaN may become an infinity), as float.  The first term of the exact bf16 splits
// (the GEMM's weighted dW, gpu/gemm/mma_sm80.cuh; the MLP's split operands, gpu/mlp/gate_rows.cu): v minus it
// is exact in float32.
static __device__ __forceinline__ float truncate_to_bf16(float v)
{
    return __uint_as_float(__float_as_uint(v) & 0xffff0000u);
}

// v rounded once (RNE) to `dtype` and back to float (host and device).
static __host__ __device__ __forceinline__ float round_to_dtype(moe_dtype dtype, float v)
{
    if (dtype == MOE_F16)
        return __half2float(__float2half_rn(v));
    if (dtype == MOE_BF16)
        return __bfloat162float(__float2bfloat16_rn(v));
    return v;
}

// Two 16-bit elements (f16 or bf16) in one 32-bit word, the first in the low half, and back.
static __device__ __forceinline__ void unpack_word(moe_dtype dtype, uint32_t word, float *v)
{
    const unsigned short lo = (unsigned short)(word & 0xffffu), hi = (unsigned short)(word >> 16);
    if (dtype == MOE_F16) {
        v[0] = __half2float(__ushort_as_half(lo)), v[1] = __half2float(__ushort_as_half(hi));
    } else {
        v[0] = __bfloat162float(__ushort_as_bfloat16(lo)), v[1] = __bfloat162float(__ushort_as_bfloat16(hi));
    }
}
static __device__ __forceinline__ uint32_t pack_word(moe_dtype dtype, float a, float b)
{
    unsigned short lo, hi;
    if (dtype == MOE_F16) {
        lo = __half_as_ushort(__float2half_rn(a)), hi = __half_as_ushort(__float2half_rn(b));
    } else {
        lo = __bfloat16_as_ushort(__float2bfloat16_rn(a)), hi = __bfloat16_as_ushort(__float2bfloat16_rn(b));
    }
    return (uint32_t)lo | ((uint32_t)hi << 16);
}

// Eight 16-bit elements (f16 or bf16) in one 16-byte vector, as loaded by load8, as float.
static __device__ __forceinline__ void unpack8(moe_dtype dtype, uint4 raw, float *v)
{
    unpack_word(dtype, raw.x, v), unpack_word(dtype, raw.y, v + 2);
    unpack_word(dtype, raw.z, v + 4), unpack_word(dtype, raw.w, v + 6);
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
    unpack8(dtype, *reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(base) + i), v);
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
    uint4 *p = reinterpret_cast<uint4 *>(static_cast<uint16_t *>(base) + i);
    const uint4 packed = make_uint4(pack_word(dtype, v[0], v[1]), pack_word(dtype, v[2], v[3]),
                                    pack_word(dtype, v[4], v[5]), pack_word(dtype, v[6], v[7]));
    if (streaming)
        __stcs(p, packed);
    else
        *p = packed;
}

// 4 consecutive elements base[i .. i+3] as float and back (i a multiple of 4; base 16-byte aligned for
// f32, 8-byte aligned for f16 / bf16).
static __device__ __forceinline__ void load4(moe_dtype dtype, const void *base, int64_t i, float *v)
{
    if (dtype == MOE_F32) {
        const float4 a = *reinterpret_cast<const float4 *>(static_cast<const float *>(base) + i);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
        return;
    }
    const uint2 raw = *reinterpret_cast<const uint2 *>(static_cast<const uint16_t *>(base) + i);
    unpack_word(dtype, raw.x, v), unpack_word(dtype, raw.y, v + 2);
}
static __device__ __forceinline__ void store4(moe_dtype dtype, void *base, int64_t i, const float *v)
{
    if (dtype == MOE_F32)
        *reinterpret_cast<float4 *>(static_cast<float *>(base) + i) = make_float4(v[0], v[1], v[2], v[3]);
    else
        *reinterpret_cast<uint2 *>(static_cast<uint16_t *>(base) + i) =
            make_uint2(pack_word(dtype, v[0], v[1]), pack_word(dtype, v[2], v[3]));
}

#endif // LIBMOE_GPU_COMMON_DTYPE_CUH
