// The FP8 grouped GEMM's arguments as its kernels see them (gemm/fp8.cu: the call, the scale check and the
// portable kernel; gemm/fp8_sm90.cu: the Hopper kernel), and the scale lookup both kernels share.
#ifndef LIBMOE_GPU_GEMM_FP8_CUH
#define LIBMOE_GPU_GEMM_FP8_CUH

#include <cuda.h> // CUtensorMap
#include <cuda_runtime.h>
#include <stdint.h>

#include "gemm/args.cuh"

extern "C" {
#include "moe_fp8.h"
}

namespace moe_gpu {

constexpr int F8_TILE = MOE_FP8_TILE; // the scales' tile: 128 elements of the reduction, 128 x 128 W blocks

struct Fp8Args {
    GemmArgs g;              // op OP_FWD or OP_DX, dtype MOE_F32 (the topk weights), out_dtype, shapes, routing
    const uint8_t *a, *b;    // codes: a = X (fwd) or dY (dX), b = W
    const void *a_scales, *b_scales;
    moe_dtype a_dtype, b_dtype;
    int ue8m0;               // scales are UE8M0 bytes (else float32)
    int64_t tiles_n, tiles_k;
    int a_vec, b_vec;        // the operand's rows may be read 16 codes at a time (aligned, row length % 16 == 0)
};

// Scale i of an operand: float32, or UE8M0 byte b as 2^(b - 127) (b = 0 is 2^-127, a float32 subnormal).
__device__ __forceinline__ float fp8_scale(const Fp8Args &f, const void *scales, int64_t i)
{
    if (f.ue8m0)
        return ldexpf(1.0f, (int)static_cast<const uint8_t *>(scales)[i] - 127);
    return static_cast<const float *>(scales)[i];
}

// The scale of A's row `row` (a source row, >= 0) for reduction tile tq, and W's for (expert e, reduction tile
// tq, output column j of the tile's 128-column block); fwd: W block (n / 128, k tile), dX: (n tile, c / 128).
__device__ __forceinline__ float fp8_a_scale(const Fp8Args &f, int64_t row, int64_t tq)
{
    return fp8_scale(f, f.a_scales, row * (f.g.op == OP_DX ? f.tiles_n : f.tiles_k) + tq);
}
__device__ __forceinline__ float fp8_w_scale(const Fp8Args &f, int64_t e, int64_t tq, int64_t j)
{
    return fp8_scale(f, f.b_scales, f.g.op == OP_DX ? (e * f.tiles_n + tq) * f.tiles_k + j / F8_TILE
                                                    : (e * f.tiles_n + j / F8_TILE) * f.tiles_k + tq);
}

// The Hopper kernel (gemm/fp8_sm90.cu) and its TMA descriptors (W [E][N][K] codes; A [M][K or N] codes unless
// permute_x / permute_y gathers its rows).  fp8_sm90_plan: whether the call is its shape (sm_90a built and
// present, fwd or dX, K % 16 == 0 and for dX N % 16 == 0, the codes 16-byte aligned) and, if so, whether the
// driver accepted the maps (*maps).
struct Fp8Sm90Maps {
    CUtensorMap w, a;
};
enum Fp8Sm90Plan { FP8_SM90_NOT_ITS_SHAPE, FP8_SM90_TAKES, FP8_SM90_MAPS_REFUSED };
Fp8Sm90Plan fp8_sm90_plan(const Fp8Args &f, Fp8Sm90Maps *maps);
moe_status launch_fp8_sm90(const Fp8Args &f, const Fp8Sm90Maps &maps, int64_t max_tiles, cudaStream_t stream);

} // namespace moe_gpu

#endif
