/*
 * ref/gemm/convert.h: the exact conversions of the blocked grouped GEMM and its row loads and stores, as
 * static inline functions: the packs (tiles.c), the reduce_topk sums (dx.c) and the topk gradient (topk.c)
 * call them per row segment, and each gets them inlined as before the split.  Included after
 * gemm_internal.h.
 */
#ifndef MOE_REF_GEMM_CONVERT_H
#define MOE_REF_GEMM_CONVERT_H

#include "gemm_internal.h"

/* ---- exact conversions to float32, inlined (the same bits as moe_bf16_to_f32 / moe_f16_to_f32) ---- */

static inline float bits_to_float(uint32_t bits)
{
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

/* bf16_to_f32 (and f32_to_bf16, below): ref/ref_bf16.h */

static inline float f16_to_float(uint16_t bits)
{
    const uint32_t sign = (uint32_t)(bits & 0x8000u) << 16;
    const uint32_t exponent = (bits >> 10) & 0x1fu;
    const uint32_t mantissa = bits & 0x3ffu;
    if (exponent == 0x1fu)
        return bits_to_float(sign | 0x7f800000u | (mantissa << 13));
    if (exponent == 0) {
        float magnitude = (float)mantissa * 0x1p-24f;
        uint32_t magnitude_bits;
        memcpy(&magnitude_bits, &magnitude, sizeof magnitude_bits);
        return bits_to_float(sign | magnitude_bits);
    }
    return bits_to_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

/* float -> f16, round to nearest even: the same bits as moe_f32_to_f16 (float -> bf16: f32_to_bf16 of
 * ref/ref_bf16.h) */
static inline uint16_t float_to_f16(float value)
{
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    const uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    const uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
    if (magnitude >= 0x477ff000u)
        return (uint16_t)(sign | 0x7c00u);
    if (magnitude < 0x38800000u) {
        float scaled = bits_to_float(magnitude) * 0x1p24f;
        volatile float rounded = scaled + 0x1p23f;
        return (uint16_t)(sign | (uint16_t)(rounded - 0x1p23f));
    }
    uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
    rounded -= 112u << 23;
    return (uint16_t)(sign | (rounded >> 13));
}

/* for (i = 0; i < count; i++) BODY, as 8-wide chunks plus a tail: GCC's -O2 vectoriser takes loops
 * of a known trip count, so the chunks become SIMD code (the operations per element are unchanged). */
#define MOE_FOR_CHUNKED(i, count, BODY)                                                             \
    do {                                                                                           \
        const int64_t moe_count_ = (count);                                                        \
        int64_t moe_base_ = 0;                                                                     \
        for (; moe_base_ + 8 <= moe_count_; moe_base_ += 8)                                        \
            for (int moe_u_ = 0; moe_u_ < 8; moe_u_++) {                                           \
                const int64_t i = moe_base_ + moe_u_;                                              \
                BODY;                                                                              \
            }                                                                                      \
        for (; moe_base_ < moe_count_; moe_base_++) {                                              \
            const int64_t i = moe_base_;                                                           \
            BODY;                                                                                  \
        }                                                                                          \
    } while (0)

/* out[i * stride] = element (first + i) of src as float, for i < count.
 * Contract trusted, not proved (as moe_ref_load's): WP's typed model cannot follow the casts of src to
 * uint16_t * / float * nor the memcpy; callers prove the source bytes and the out lanes valid. */
/*@ requires dtype: dtype_ok(dtype);
    requires span: 0 <= first && 0 <= count && 1 <= stride;
    requires src: count == 0 ||
                  \valid_read((char *)src + (byte_offset(first, dtype) .. byte_offset(first + count, dtype) - 1));
    requires out: count == 0 || \valid(out + (0 .. (count - 1) * stride));
    terminates \true;
    assigns out[0 .. (count - 1) * stride]; */
static inline void load_span(moe_dtype dtype, const void *src, int64_t first, int64_t count, float *out,
                             int64_t stride)
{
    switch (dtype) {
    case MOE_BF16: {
        const uint16_t *s = (const uint16_t *)src + first;
        if (stride == 1)
            MOE_FOR_CHUNKED(i, count, out[i] = bf16_to_f32(s[i]));
        else
            for (int64_t i = 0; i < count; i++)
                out[i * stride] = bf16_to_f32(s[i]);
        return;
    }
    case MOE_F16: {
        const uint16_t *s = (const uint16_t *)src + first;
        for (int64_t i = 0; i < count; i++)
            out[i * stride] = f16_to_float(s[i]);
        return;
    }
    case MOE_F32:
    case MOE_E4M3: /* unreachable: dtype_ok excludes FP8, which only the FP8 entry points take */
    case MOE_E5M2:
        break;
    }
    const float *s = (const float *)src + first;
    if (stride == 1)
        memcpy(out, s, (size_t)count * sizeof *out);
    else
        for (int64_t i = 0; i < count; i++)
            out[i * stride] = s[i];
}

/* The tail of moe_ref.h for count consecutive elements of out from base: v = old + v with
 * accumulate, then one rounding (gemm_naive_value.c's gemm_naive_finish, conversions inlined).
 * Contract trusted, not proved (as moe_ref_store's): WP's typed model cannot follow the casts of out to
 * uint16_t * / float * nor the memcpy, so the contract speaks of out's bytes (elements base ..
 * base + count - 1); callers prove those bytes writable and the writes inside their own ranges. */
/*@ requires dtype: dtype_ok(dtype);
    requires span: 0 <= base && 0 <= count;
    requires out: count == 0 ||
                  \valid((char *)out + (byte_offset(base, dtype) .. byte_offset(base + count, dtype) - 1));
    requires v: count == 0 || \valid_read(v + (0 .. count - 1));
    requires separated: \separated((char *)out + (byte_offset(base, dtype) .. byte_offset(base + count, dtype) - 1),
                                   v + (0 .. count - 1));
    terminates \true;
    assigns ((char *)out)[byte_offset(base, dtype) .. byte_offset(base + count, dtype) - 1]; */
static inline void store_row(moe_dtype dtype, void *out, int64_t base, const float *v, int64_t count,
                             int accumulate)
{
    switch (dtype) {
    case MOE_BF16: {
        uint16_t *o = (uint16_t *)out + base;
        if (accumulate)
            MOE_FOR_CHUNKED(j, count, o[j] = f32_to_bf16(bf16_to_f32(o[j]) + v[j]));
        else
            MOE_FOR_CHUNKED(j, count, o[j] = f32_to_bf16(v[j]));
        return;
    }
    case MOE_F16: {
        uint16_t *o = (uint16_t *)out + base;
        if (accumulate)
            for (int64_t j = 0; j < count; j++)
                o[j] = float_to_f16(f16_to_float(o[j]) + v[j]);
        else
            for (int64_t j = 0; j < count; j++)
                o[j] = float_to_f16(v[j]);
        return;
    }
    case MOE_F32:
    case MOE_E4M3: /* unreachable: dtype_ok excludes FP8, which only the FP8 entry points take */
    case MOE_E5M2:
        break;
    }
    float *o = (float *)out + base;
    if (accumulate)
        MOE_FOR_CHUNKED(j, count, o[j] = o[j] + v[j]);
    else
        memcpy(o, v, (size_t)count * sizeof *o);
}

#endif
