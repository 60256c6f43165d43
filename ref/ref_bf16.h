/*
 * ref/ref_bf16.h: bf16 <-> float32, inlined for the hot loops of ref/gemm_blocked.c and ref/mlp.c: the same
 * bits as moe_bf16_to_f32 / moe_f32_to_bf16 of src/dtype.c (widening is exact; narrowing rounds to nearest
 * even, NaN kept quiet), which tests/test_dtype checks on every pattern.  static inline: each file gets its own
 * copy.
 *
 * Contracts trusted, not proved (as moe_ref_load's): WP's typed model cannot follow memcpy between a uint32_t
 * and a float (a reinterpretation of the bits); each is a pure function of its argument.
 */
#ifndef MOE_REF_BF16_H
#define MOE_REF_BF16_H

#include <stdint.h>
#include <string.h>

/*@ terminates \true;
    assigns \nothing; */
static inline float bf16_to_f32(uint16_t bits)
{
    uint32_t u = (uint32_t)bits << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/*@ terminates \true;
    assigns \nothing; */
static inline uint16_t f32_to_bf16(float value)
{
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((bits >> 16) | 0x0040u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

#endif
