// Activations and clamps of the MLP on the device (the tile path, the rows path's gate kernels and the fused
// gate/up kernel, gpu/mlp/): one copy, so that every path computes the same bits.
#ifndef LIBMOE_GPU_COMMON_ACT_CUH
#define LIBMOE_GPU_COMMON_ACT_CUH

#include "moe_activations.h"

// The activation table's forward and derivative (backend/moe_activations.h), compiled for the device as
// ref/ compiles them for the host: the same float32 operation order (CUDA's math library and libm may
// differ by a few ulp).  act is a moe_mlp_activation (a template argument in the gate kernels).
static __device__ __forceinline__ float act_value(int act, float x)
{
    return moe_act_value((moe_mlp_activation)act, x);
}

static __device__ __forceinline__ float act_derivative(int act, float x)
{
    return moe_act_derivative((moe_mlp_activation)act, x);
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
