/*
 * ref/mlp/activations.h: the activations and clamps of the blockwise MoE MLP reference, static inline:
 * the forward (fwd.c) and the backward (bwd.c) call them per element, and each gets them inlined.  Their
 * contracts are proved in activations.c's run of specs/verify.sh (a function of a header is proved in the
 * run of a file that includes it).  Included after mlp_internal.h.
 */
#ifndef MOE_REF_MLP_ACTIVATIONS_H
#define MOE_REF_MLP_ACTIVATIONS_H

#include "mlp_internal.h"

#ifdef __FRAMAC__
/* The libm functions of the activations.  Frama-C's libc (math.h) specifies expf (assigns errno and its
 * result; no terminates clause) but not erff or tanhf: these contracts are trusted, not proved.  They
 * terminate; erff and tanhf are given errno as expf has it (C11 7.12.1 lets any of them report a range
 * error through errno), so that no contract here claims more than the C library promises.  expf's
 * termination is trusted through the pinned flag -wp-frama-c-stdlib-terminate (specs/verify.sh). */
/*@ terminates \true;
    assigns errno, \result \from x; */
float erff(float x);
/*@ terminates \true;
    assigns errno, \result \from x; */
float tanhf(float x);
#endif

/* Contracts: they terminate and write nothing but errno (expf may set ERANGE on overflow, C11 7.12.1);
 * the float results are checked by the property tests against the float64 oracle, not proved. */
/*@ terminates \true;
    assigns errno; */
static inline float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

static const float SWISH_ALPHA = 1.702f;
static const float SQRT_HALF = 0.70710678118654752440f;
static const float INV_SQRT_2PI = 0.39894228040143267794f;
static const float SQRT_2_OVER_PI = 0.79788456080286535588f;
static const float GELU_TANH_C = 0.044715f;

/*@ terminates \true;
    assigns errno;
    ensures identity: act != MOE_ACT_SILU && act != MOE_ACT_GELU && act != MOE_ACT_GELU_TANH &&
      act != MOE_ACT_SWISH ==> \result == x; */
static inline float act_value(moe_mlp_activation act, float x)
{
    switch (act) {
    case MOE_ACT_SILU: return x * sigmoidf_(x);
    case MOE_ACT_GELU: return 0.5f * x * (1.0f + erff(x * SQRT_HALF));
    case MOE_ACT_GELU_TANH: return 0.5f * x * (1.0f + tanhf(SQRT_2_OVER_PI * (x + GELU_TANH_C * x * x * x)));
    case MOE_ACT_SWISH: return x * sigmoidf_(SWISH_ALPHA * x);
    }
    return x;
}

/*@ terminates \true;
    assigns errno;
    ensures identity: act != MOE_ACT_SILU && act != MOE_ACT_GELU && act != MOE_ACT_GELU_TANH &&
      act != MOE_ACT_SWISH ==> \result == 1.0f; */
static inline float act_derivative(moe_mlp_activation act, float x)
{
    switch (act) {
    case MOE_ACT_SILU: {
        const float s = sigmoidf_(x);
        return s * (1.0f + x * (1.0f - s));
    }
    case MOE_ACT_GELU:
        return 0.5f * (1.0f + erff(x * SQRT_HALF)) + x * (INV_SQRT_2PI * expf(-0.5f * x * x));
    case MOE_ACT_GELU_TANH: {
        const float x2 = x * x;
        const float t = tanhf(SQRT_2_OVER_PI * (x + GELU_TANH_C * x2 * x));
        return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_TANH_C * x2);
    }
    case MOE_ACT_SWISH: {
        const float s = sigmoidf_(SWISH_ALPHA * x);
        return s * (1.0f + SWISH_ALPHA * x * (1.0f - s));
    }
    }
    return 1.0f;
}

/* Clamps keep NaN (a comparison with NaN is false).  Each limit applies only when its flag is set; a NaN
 * limit clamps nothing.  The comparisons are IEEE's (\lt_float, \le_float: false with a NaN operand);
 * same_float (specs/mlp.acsl) is IEEE equality or both NaN. */
/*@ terminates \true;
    assigns \nothing;
    ensures nan_kept: \is_NaN(v) ==> \is_NaN(\result);
    ensures unchanged: (has_lo == 0 || !\lt_float(v, lo)) && (has_hi == 0 || !\gt_float(v, hi)) ==>
      same_float(\result, v);
    ensures at_least_lo: has_lo != 0 && !\is_NaN(v) && !\is_NaN(lo) &&
      (has_hi == 0 || \is_NaN(hi) || \le_float(lo, hi)) ==> \le_float(lo, \result);
    ensures at_most_hi: has_hi != 0 && !\is_NaN(v) && !\is_NaN(hi) ==> \le_float(\result, hi);
    ensures a_limit: same_float(\result, v) || (has_lo != 0 && same_float(\result, lo)) ||
      (has_hi != 0 && same_float(\result, hi)); */
static inline float clamp_(float v, int has_lo, float lo, int has_hi, float hi)
{
    if (has_lo && v < lo)
        v = lo;
    if (has_hi && v > hi)
        v = hi;
    return v;
}

/* act_value with its contract reduced to termination and errno: with act_value's float postcondition
 * (`identity`) among the hypotheses, Z3 and CVC4 timed out on plain index goals of the loops that call it. */
/*@ terminates \true;
    assigns errno; */
static inline float act_of(moe_mlp_activation act, float x)
{
    return act_value(act, x);
}

/* act_derivative with its contract reduced to termination and errno (as act_of). */
/*@ terminates \true;
    assigns errno; */
static inline float act_derivative_of(moe_mlp_activation act, float x)
{
    return act_derivative(act, x);
}

#endif
