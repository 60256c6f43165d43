// Activations and clamps of the MLP on the device (the tile path, the rows path's gate kernels and the fused
// gate/up kernel, gpu/mlp/): one copy, so that every path computes the same bits.
#ifndef LIBMOE_GPU_COMMON_ACT_CUH
#define LIBMOE_GPU_COMMON_ACT_CUH

extern "C" {
#include "moe_mlp.h"
}

static __device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

static constexpr float SWISH_ALPHA = 1.702f;
static constexpr float SQRT_HALF = 0.70710678118654752440f;
static constexpr float INV_SQRT_2PI = 0.39894228040143267794f;
static constexpr float SQRT_2_OVER_PI = 0.79788456080286535588f;
static constexpr float GELU_TANH_C = 0.044715f;

// The formulas of ref/mlp.c (same float32 operation order; libm differs by <= 2 ulp).
static __device__ __forceinline__ float act_value(int act, float x)
{
    switch (act) {
    case MOE_ACT_SILU: return x * sigmoid(x);
    case MOE_ACT_GELU: return 0.5f * x * (1.0f + erff(x * SQRT_HALF));
    case MOE_ACT_GELU_TANH: return 0.5f * x * (1.0f + tanhf(SQRT_2_OVER_PI * (x + GELU_TANH_C * x * x * x)));
    default: return x * sigmoid(SWISH_ALPHA * x);
    }
}

static __device__ __forceinline__ float act_derivative(int act, float x)
{
    switch (act) {
    case MOE_ACT_SILU: {
        const float s = sigmoid(x);
        return s * (1.0f + x * (1.0f - s));
    }
    case MOE_ACT_GELU: return 0.5f * (1.0f + erff(x * SQRT_HALF)) + x * (INV_SQRT_2PI * expf(-0.5f * x * x));
    case MOE_ACT_GELU_TANH: {
        const float x2 = x * x;
        const float t = tanhf(SQRT_2_OVER_PI * (x + GELU_TANH_C * x2 * x));
        return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_TANH_C * x2);
    }
    default: {
        const float s = sigmoid(SWISH_ALPHA * x);
        return s * (1.0f + SWISH_ALPHA * x * (1.0f - s));
    }
    }
}

// Comparisons keep NaN (not clamped).
static __device__ __forceinline__ float clamp_value(float v, int has_lo, float lo, int has_hi, float hi)
{
    if (has_lo && v < lo)
        v = lo;
    if (has_hi && v > hi)
        v = hi;
    return v;
}

#endif
