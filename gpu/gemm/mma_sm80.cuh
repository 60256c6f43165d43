// mma.sync primitives of sm_80 and later (ldmatrix, the m16n8k16 and TF32 m16n8k8 MMAs) and the exact two-term
// splits of weighted dW's w * dY, shared by the sm80 family (gemm/sm80.cu, gemm/tf32.cu) and the sm90 kernel.
#ifndef LIBMOE_GPU_GEMM_MMA_SM80_CUH
#define LIBMOE_GPU_GEMM_MMA_SM80_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <type_traits>

#include "common/dtype.cuh"

namespace moe_gpu {

// Four 8 x 8 matrices of 16-bit elements from shared memory (this lane supplies one row address).
template <bool TRANS>
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], uint32_t addr)
{
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(addr));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(addr));
}

// d += a * b for one m16n8k16 tile (row-major A fragment, column-major B fragment, fp32 accumulators).
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float d[4], const uint32_t a[4], const uint32_t b[2])
{
    if (std::is_same<T, __half>::value)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// d += a * b for one m16n8k8 tile of TF32 operands (row-major A, column-major B, fp32 accumulators).
__device__ __forceinline__ void mma_m16n8k8_tf32(float d[4], const uint32_t a[4], const uint32_t b[2])
{
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Weighted bf16 dW: the bf16 pair a (element k in the low half, k + 1 in the high half) times the fp32 weights
// w0 (of k) and w1 (of k + 1) -> hi + lo exactly, each a bf16 pair (see the section comment).  p = w * a is
// exact (a product of two bf16 values); hi keeps p's upper 16 bits (truncation = round toward zero), the rest
// lo = p - hi is exact and has at most 8 significant bits, so its lower 16 bits are zero too.  An infinite p
// stays in hi (lo = 0, not inf - inf); a NaN p makes lo NaN (hi may truncate to an infinity), so the sum is
// NaN.  Exact for |p| >= 2^-118; below, lo is an fp32 subnormal whose bits under bf16's smallest subnormal
// are dropped (less than 2^-133 per product).
__device__ __forceinline__ void split_weighted_pair(uint32_t a, float w0, float w1, uint32_t &hi, uint32_t &lo)
{
    const float p0 = __uint_as_float(a << 16) * w0, p1 = __uint_as_float(a & 0xffff0000u) * w1;
    const float h0 = truncate_to_bf16(p0), h1 = truncate_to_bf16(p1);
    const float r0 = fabsf(p0) == INFINITY ? 0.0f : p0 - h0, r1 = fabsf(p1) == INFINITY ? 0.0f : p1 - h1;
    hi = __byte_perm(__float_as_uint(p0), __float_as_uint(p1), 0x7632); // upper halves: (p1, p0)
    lo = __byte_perm(__float_as_uint(r0), __float_as_uint(r1), 0x7632);
}

// Weighted f16 dW: the f16 pair a (element k low, k + 1 high) times the weights w0, w1 -> TF32 words hi + lo
// exactly, element by element (hi0, lo0 of k; hi1, lo1 of k + 1).  p = w * a is a product of two f16 values:
// at most 22 significant bits and |p| >= 2^-48, so exact in fp32, never subnormal and finite unless a is.  hi
// keeps p's sign, exponent and upper 10 fraction bits (truncation toward zero: TF32's 11 significant bits, the
// lower 13 bits zero); lo = p - hi is exact, has at most 22 - 11 significant bits and is a normal fp32 value,
// so it is a TF32 value as well.  An infinite p stays in hi (lo = 0); a NaN p makes lo NaN.  Unlike the bf16
// split there is no range limit: hi * x and lo * x (x an f16 value, exact in TF32) are exact in fp32.
__device__ __forceinline__ void split_weighted_pair_tf32(uint32_t a, float w0, float w1, uint32_t &hi0,
                                                         uint32_t &lo0, uint32_t &hi1, uint32_t &lo1)
{
    const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&a));
    const float p0 = f.x * w0, p1 = f.y * w1;
    hi0 = __float_as_uint(p0) & 0xffffe000u, hi1 = __float_as_uint(p1) & 0xffffe000u;
    lo0 = __float_as_uint(fabsf(p0) == INFINITY ? 0.0f : p0 - __uint_as_float(hi0));
    lo1 = __float_as_uint(fabsf(p1) == INFINITY ? 0.0f : p1 - __uint_as_float(hi1));
}

} // namespace moe_gpu

#endif
