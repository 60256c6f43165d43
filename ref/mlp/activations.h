/*
 * ref/mlp/activations.h: the activations and clamps of the blockwise MoE MLP reference, static inline:
 * the forward (fwd.c) and the backward (bwd.c) call them per element, and each gets them inlined.  The
 * activations are the table's of backend/moe_activations.h, through act_of and act_derivative_of.  Their
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

/* The formulas are the activation table's (backend/moe_activations.h: moe_act_value, moe_act_derivative and
 * the functions of its rows, each with its contract there), one copy for the reference, the GPU and the tests;
 * WP proves them in activations.c's run, as it proves every function of this header. */
#include "moe_activations.h"

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

/* moe_act_value with its contract reduced to termination and errno: with moe_act_value's float postcondition
 * (`identity`) among the hypotheses, Z3 and CVC4 timed out on plain index goals of the loops that call it. */
/*@ terminates \true;
    assigns errno; */
static inline float act_of(moe_mlp_activation act, float x)
{
    return moe_act_value(act, x);
}

/* moe_act_derivative with its contract reduced to termination and errno (as act_of). */
/*@ terminates \true;
    assigns errno; */
static inline float act_derivative_of(moe_mlp_activation act, float x)
{
    return moe_act_derivative(act, x);
}

#endif
