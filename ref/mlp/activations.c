/*
 * ref/mlp/activations.c: the roundings of the rounded intermediates (specs/MLP.md, "Rounded
 * intermediates"): a value, or a row in place, rounded to the dtype and back.  The activations and clamps
 * themselves are in activations.h (inlined into the loops that call them); specs/verify.sh proves them in
 * the run of this file.
 */
#include "mlp_internal.h"
#include "activations.h"

/* (contracts on the prototypes in mlp_internal.h) */
float mlp_round_to(moe_dtype dtype, float v)
{
    switch (dtype) {
    case MOE_F16: return moe_f16_to_f32(moe_f32_to_f16(v));
    case MOE_BF16: return moe_bf16_to_f32(moe_f32_to_bf16(v));
    case MOE_F32:
    case MOE_E4M3: /* unreachable: the MLP refuses FP8 (check_options) */
    case MOE_E5M2:
        break;
    }
    return v;
}

void mlp_round_row(moe_dtype dtype, float *v, int64_t count)
{
    switch (dtype) {
    case MOE_F32:
    case MOE_E4M3: /* unreachable: dtype_ok excludes FP8, which only the FP8 entry points take */
    case MOE_E5M2:
        return;
    case MOE_BF16:
        /*@ loop invariant bounds: 0 <= i <= count;
            loop assigns i, v[0 .. count - 1];
            loop variant count - i; */
        for (int64_t i = 0; i < count; i++)
            v[i] = bf16_to_f32(f32_to_bf16(v[i]));
        return;
    case MOE_F16:
        /*@ loop invariant bounds: 0 <= i <= count;
            loop assigns i, v[0 .. count - 1];
            loop variant count - i; */
        for (int64_t i = 0; i < count; i++)
            v[i] = moe_f16_to_f32(moe_f32_to_f16(v[i]));
        return;
    }
}
