/*
 * The MLP's activations, one table: each row is the enum value, its name, its forward and its derivative.
 * The CPU reference (ref/mlp/activations.h), the CUDA kernels (gpu/common/act.cuh), the front end's names and
 * checks (src/mlp_api.c), the CLI and the tests read it: one copy of the formulas.  Their contracts are here;
 * WP proves them (termination, errno only) in ref/mlp/activations.c's run of specs/verify.sh.  The tests'
 * float64 twins are kept apart on purpose (testlib/mlp_float64.c).
 *
 * Adding an activation: a value in include/moe_mlp.h (and MOE_MLP_ACTIVATION_COUNT, checked below against the
 * table), a row below with its two functions, each with its contract, and their names in specs/verify.sh's list of
 * ref/mlp/activations.c.  Every switch on an activation lists the rows and has no default, so -Wswitch (an error
 * with --enable-werror) names a switch that misses one; the CUDA kernels are instantiated per row
 * (MOE_MLP_ACTIVATIONS), and tests/test_mlp_grad and proptest/test_gpu_mlp run every value below
 * MOE_MLP_ACTIVATION_COUNT on every backend.
 */
#ifndef LIBMOE_ACTIVATIONS_H
#define LIBMOE_ACTIVATIONS_H

#include "moe_mlp.h"

#include <math.h>

/* static inline for C (Frama-C included: WP proves static inline functions as any other), host and device for
 * CUDA */
#if defined(__CUDACC__)
#define MOE_ACT_FN static __host__ __device__ __forceinline__
#else
#define MOE_ACT_FN static inline
#endif

/* X(value, name, forward, derivative) for each activation, in enum order. */
#define MOE_MLP_ACTIVATIONS(X)                                               \
    X(MOE_ACT_SILU, "silu", moe_act_silu, moe_act_silu_grad)                 \
    X(MOE_ACT_GELU, "gelu", moe_act_gelu, moe_act_gelu_grad)                 \
    X(MOE_ACT_GELU_TANH, "gelu_tanh", moe_act_gelu_tanh, moe_act_gelu_tanh_grad) \
    X(MOE_ACT_SWISH, "swish", moe_act_swish, moe_act_swish_grad)

/* The table has a row for every activation (a compile-time check for C and C++ alike). */
#define MOE_ACT_COUNT_ROW(value, name, forward, derivative) +1
typedef char moe_activation_table_complete[(0 MOE_MLP_ACTIVATIONS(MOE_ACT_COUNT_ROW)) == MOE_MLP_ACTIVATION_COUNT ? 1 : -1];
#undef MOE_ACT_COUNT_ROW

#define MOE_ACT_SWISH_ALPHA 1.702f
#define MOE_ACT_SQRT_HALF 0.70710678118654752440f
#define MOE_ACT_INV_SQRT_2PI 0.39894228040143267794f
#define MOE_ACT_SQRT_2_OVER_PI 0.79788456080286535588f
#define MOE_ACT_GELU_TANH_C 0.044715f

/* The forward and derivative functions: they terminate and write nothing but errno (expf may set ERANGE
 * on overflow, C11 7.12.1); their float results are checked by the property tests against the float64
 * oracle, not proved. */
/*@ terminates \true;
    assigns errno; */
MOE_ACT_FN float moe_act_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/*@ terminates \true;
    assigns errno; */
MOE_ACT_FN float moe_act_silu(float x) { return x * moe_act_sigmoid(x); }
/*@ terminates \true;
    assigns errno; */
MOE_ACT_FN float moe_act_silu_grad(float x)
{
    const float s = moe_act_sigmoid(x);
    return s * (1.0f + x * (1.0f - s));
}

/*@ terminates \true;
    assigns errno; */
MOE_ACT_FN float moe_act_gelu(float x) { return 0.5f * x * (1.0f + erff(x * MOE_ACT_SQRT_HALF)); }
/*@ terminates \true;
    assigns errno; */
MOE_ACT_FN float moe_act_gelu_grad(float x)
{
    return 0.5f * (1.0f + erff(x * MOE_ACT_SQRT_HALF)) + x * (MOE_ACT_INV_SQRT_2PI * expf(-0.5f * x * x));
}

/*@ terminates \true;
    assigns errno; */
MOE_ACT_FN float moe_act_gelu_tanh(float x)
{
    return 0.5f * x * (1.0f + tanhf(MOE_ACT_SQRT_2_OVER_PI * (x + MOE_ACT_GELU_TANH_C * x * x * x)));
}
/*@ terminates \true;
    assigns errno; */
MOE_ACT_FN float moe_act_gelu_tanh_grad(float x)
{
    const float x2 = x * x;
    const float t = tanhf(MOE_ACT_SQRT_2_OVER_PI * (x + MOE_ACT_GELU_TANH_C * x2 * x));
    return 0.5f * (1.0f + t) +
           0.5f * x * (1.0f - t * t) * MOE_ACT_SQRT_2_OVER_PI * (1.0f + 3.0f * MOE_ACT_GELU_TANH_C * x2);
}

/*@ terminates \true;
    assigns errno; */
MOE_ACT_FN float moe_act_swish(float x) { return x * moe_act_sigmoid(MOE_ACT_SWISH_ALPHA * x); }
/*@ terminates \true;
    assigns errno; */
MOE_ACT_FN float moe_act_swish_grad(float x)
{
    const float s = moe_act_sigmoid(MOE_ACT_SWISH_ALPHA * x);
    return s * (1.0f + MOE_ACT_SWISH_ALPHA * x * (1.0f - s));
}

/* act(x) of the table's row; x itself for a value that is none (the front end refuses those). */
/*@ terminates \true;
    assigns errno;
    ensures identity: act != MOE_ACT_SILU && act != MOE_ACT_GELU && act != MOE_ACT_GELU_TANH &&
      act != MOE_ACT_SWISH ==> \result == x; */
MOE_ACT_FN float moe_act_value(moe_mlp_activation act, float x)
{
    switch (act) {
#define MOE_ACT_VALUE_CASE(value, name, forward, derivative) \
    case value: return forward(x);
        MOE_MLP_ACTIVATIONS(MOE_ACT_VALUE_CASE)
#undef MOE_ACT_VALUE_CASE
    }
    return x;
}

/* act'(x) of the table's row; 1 for a value that is none. */
/*@ terminates \true;
    assigns errno;
    ensures identity: act != MOE_ACT_SILU && act != MOE_ACT_GELU && act != MOE_ACT_GELU_TANH &&
      act != MOE_ACT_SWISH ==> \result == 1.0f; */
MOE_ACT_FN float moe_act_derivative(moe_mlp_activation act, float x)
{
    switch (act) {
#define MOE_ACT_DERIVATIVE_CASE(value, name, forward, derivative) \
    case value: return derivative(x);
        MOE_MLP_ACTIVATIONS(MOE_ACT_DERIVATIVE_CASE)
#undef MOE_ACT_DERIVATIVE_CASE
    }
    return 1.0f;
}

#endif /* LIBMOE_ACTIVATIONS_H */
