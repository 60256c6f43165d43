// The FP8 grouped GEMM's arguments as its kernels see them (gemm/fp8.cu: the fwd / dX call, the scale check and
// the portable kernel; gemm/fp8_dw.cu: the portable dW kernel; gemm/fp8_sm90.cu: the Hopper kernel), the scale
// lookup they share, and the portable kernels' pieces: their tile, the exact FP8 -> bf16 decoding, the 16-code
// loads into shared memory and the step of bf16 mma.sync (gemm/mma_sm80.cuh's).
#ifndef LIBMOE_GPU_GEMM_FP8_CUH
#define LIBMOE_GPU_GEMM_FP8_CUH

#include <cuda.h> // CUtensorMap
#include <cuda_runtime.h>
#include <stdint.h>

#include "gemm/args.cuh"
#include "gemm/epilogue.cuh"
#include "gemm/mma_sm80.cuh"

extern "C" {
#include "moe_fp8.h"
}

namespace moe_gpu {

constexpr int F8_TILE = MOE_FP8_TILE; // the scales' tile: 128 elements of the reduction, 128 x 128 W blocks

struct Fp8Args {
    GemmArgs g;              // op OP_FWD, OP_DX or OP_DW, dtype MOE_F32 (the topk weights), out_dtype, shapes, routing
    const uint8_t *a, *b;    // codes: a = X (fwd) or dY (dX, dW), b = W (fwd, dX) or X (dW)
    const void *a_scales, *b_scales;
    moe_dtype a_dtype, b_dtype;
    int ue8m0;               // scales are UE8M0 bytes (else float32)
    int w_kn;                // dX with w_transposed: b is W^T [E][K][N], its scales [E][tiles_k][tiles_n]
    int64_t tiles_n, tiles_k;
    int a_vec, b_vec;        // the operand's rows may be read 16 codes at a time (aligned, row length % 16 == 0)
    int sm90_wide;           // the Hopper kernel with tiles of 256 columns (fp8_sm90_plan sets it)
};

// The portable kernels' tile (gemm/fp8.cu, gemm/fp8_dw.cu): 128 x 128 outputs, 256 threads (8 warps of 64 x 32),
// reduction steps of 32; shared tiles [128][F8_LDS] bf16, the step's 32 values of a tile row contiguous.
constexpr int F8_BM = 128, F8_BN = 128, F8_BK = 32, F8_THREADS = 256;
constexpr int F8_LDS = F8_BK + 8; // shared row stride in bf16 elements: conflict-free 32-bit fragment loads

// The bf16 bits of FP8 code `code` (exact: every e4m3 and e5m2 value is a bf16 value), from its format's fields;
// NaN codes give a bf16 NaN, e5m2's Inf codes bf16's Inf.
__device__ __forceinline__ uint16_t fp8_to_bf16_bits(moe_dtype dtype, unsigned code)
{
    const unsigned sign = (code & 0x80u) << 8, mbits = dtype == MOE_E4M3 ? 3u : 2u, bias = dtype == MOE_E4M3 ? 7u : 15u;
    const unsigned exponent = (code & 0x7fu) >> mbits, mantissa = code & ((1u << mbits) - 1u);
    const unsigned top = 0x7fu >> mbits;
    if (dtype == MOE_E4M3 ? (code & 0x7fu) == 0x7fu : exponent == top)
        return (uint16_t)(sign | 0x7f80u | (dtype == MOE_E4M3 || mantissa ? 0x40u : 0u)); // NaN, or e5m2's Inf
    if (exponent == 0) { // subnormal: mantissa * 2^(1 - bias - mbits), exact in float and in bf16
        const float v = (float)mantissa * __int_as_float((int)(127 + 1 - bias - mbits) << 23);
        return (uint16_t)(sign | (__float_as_uint(v) >> 16));
    }
    return (uint16_t)(sign | (exponent + 127u - bias) << 7 | mantissa << (7u - mbits));
}

// 16 codes of a row starting at column q of `len` (0 past it, and all 0 for a NULL row) -> 16 bf16 values at
// dst[0], dst[stride], ... (decode: the 256-entry table of fp8_to_bf16_bits)
__device__ __forceinline__ void load16(const uint8_t *row, int64_t q, int64_t len, bool vec, const uint16_t *decode,
                                       uint16_t *dst, int stride)
{
    uint16_t v[16];
    if (row != nullptr && vec && q + 16 <= len) {
        const uint4 word = *reinterpret_cast<const uint4 *>(row + q);
        const uint32_t w[4] = {word.x, word.y, word.z, word.w};
#pragma unroll
        for (int u = 0; u < 16; u++)
            v[u] = decode[(w[u / 4] >> (8 * (u % 4))) & 0xffu];
    } else {
#pragma unroll
        for (int u = 0; u < 16; u++)
            v[u] = row != nullptr && q + u < len ? decode[row[q + u]] : (uint16_t)0;
    }
#pragma unroll
    for (int u = 0; u < 16; u++)
        dst[u * stride] = v[u];
}

// The warp's MMAs of one reduction step: sa [128][F8_LDS] holds A(i, q), sb [128][F8_LDS] holds B(q, j) as [j][q];
// the warp's 64 x 32 block at rows wm, columns wn accumulates into part (m16n8 tile (mt, nt): rows
// wm + 16 mt + lane / 4 (+ 8 for x = 2, 3), columns wn + 8 nt + 2 (lane % 4) + x % 2).
__device__ __forceinline__ void fp8_mma_step(const uint16_t (*sa)[F8_LDS], const uint16_t (*sb)[F8_LDS], int wm, int wn,
                                             float (&part)[4][4][4])
{
    const int lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
#pragma unroll
    for (int k16 = 0; k16 < F8_BK; k16 += 16) {
        uint32_t af[4][4], bf[4][2];
#pragma unroll
        for (int mt = 0; mt < 4; mt++) {
            const int r0 = wm + 16 * mt + gid, c0 = k16 + 2 * tig;
            af[mt][0] = *reinterpret_cast<const uint32_t *>(&sa[r0][c0]);
            af[mt][1] = *reinterpret_cast<const uint32_t *>(&sa[r0 + 8][c0]);
            af[mt][2] = *reinterpret_cast<const uint32_t *>(&sa[r0][c0 + 8]);
            af[mt][3] = *reinterpret_cast<const uint32_t *>(&sa[r0 + 8][c0 + 8]);
        }
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            const int n0 = wn + 8 * nt + gid, c0 = k16 + 2 * tig;
            bf[nt][0] = *reinterpret_cast<const uint32_t *>(&sb[n0][c0]);
            bf[nt][1] = *reinterpret_cast<const uint32_t *>(&sb[n0][c0 + 8]);
        }
#pragma unroll
        for (int mt = 0; mt < 4; mt++)
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
                mma_m16n8k16<__nv_bfloat16>(part[mt][nt], af[mt], bf[nt]);
    }
}

// f(mt, nt, x, i, j) for each accumulator element of the warp's block (fp8_mma_step's layout): m16n8 tile (mt, nt),
// element x, tile row i and tile column j.
template <class F>
__device__ __forceinline__ void fp8_for_each_element(int wm, int wn, F f)
{
    const int lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
#pragma unroll
    for (int mt = 0; mt < 4; mt++)
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int x = 0; x < 4; x++)
                f(mt, nt, x, wm + 16 * mt + gid + 8 * (x / 2), wn + 8 * nt + 2 * tig + x % 2);
}

// The promotion of the warp's block at the end of a reduction tile: acc += part * (row_scale[i] *
// col_scale[j * col_step]) for tile row i and column j, with the reference's two roundings (__fmul_rn, then
// __fmul_rn and __fadd_rn: never contracted into an FMA); col_step 0 reads one scale for every column.  part is
// zeroed for the next tile.
__device__ __forceinline__ void fp8_promote(float (&acc)[4][4][4], float (&part)[4][4][4], const float *row_scale,
                                            const float *col_scale, int col_step, int wm, int wn)
{
    fp8_for_each_element(wm, wn, [&](int mt, int nt, int x, int i, int j) {
        const float scale = __fmul_rn(row_scale[i], col_scale[col_step * j]);
        acc[mt][nt][x] = __fadd_rn(acc[mt][nt][x], __fmul_rn(part[mt][nt][x], scale));
        part[mt][nt][x] = 0.0f;
    });
}

// The warp's block of a finished output tile t through the GEMM's epilogue (store_output: topk weight, accumulate,
// one rounding; rows and columns past the tile's extent skipped).
__device__ __forceinline__ void fp8_store(const GemmArgs &g, const TileCoord &t, const float (&acc)[4][4][4], int wm,
                                          int wn)
{
    fp8_for_each_element(wm, wn, [&](int mt, int nt, int x, int i, int j) {
        store_output(g, t, t.i0 + i, t.j0 + j, acc[mt][nt][x]);
    });
}

// The scale check of one operand (gemm/fp8.cu), queued after the routing check of the call's workspace ws:
// `count` scales, float32 finite and > 0 or UE8M0 not 255; a bad one sets *ws.status (the GEMM kernel then
// writes nothing) and is reported by moe_backend_synchronize, naming op (ROUTING_OP_FP8_*) and the operand
// (0: x (fwd, dW) or dy (dX); 1: w (fwd, dX) or dy (dW)) with the scale's [row][column] for rows of `per_row`.
// column_experts > 0 (dW, E): only the rows of 128 x 1 tiles in use are checked (gpu/fp8/column_tiles.cuh,
// from ws.offsets), as the reference checks them; 0: all.
cudaError_t launch_fp8_scale_check(const void *scales, int64_t count, int64_t per_row, int64_t column_experts,
                                   int ue8m0, int operand, int op, const Workspace &ws, cudaStream_t stream);

// Scale i of an operand: float32, or UE8M0 byte b as 2^(b - 127): the float32 with exponent field b for b >= 1,
// 2^-127 (a subnormal, bits 0x00400000) for b = 0, as ref/fp8_ref.h's moe_fp8_scale builds it.
__device__ __forceinline__ float fp8_scale(const Fp8Args &f, const void *scales, int64_t i)
{
    if (f.ue8m0) {
        const unsigned b = static_cast<const uint8_t *>(scales)[i];
        return __uint_as_float(b != 0 ? b << 23 : 0x00400000u);
    }
    return static_cast<const float *>(scales)[i];
}

// The scale of A's row `row` (a source row, >= 0) for reduction tile tq, and W's for (expert e, reduction tile
// tq, output column j of the tile's 128-column block); fwd: W block (n / 128, k tile), dX: (n tile, c / 128), dX
// from W^T: W^T's block (c / 128, n tile).
__device__ __forceinline__ float fp8_a_scale(const Fp8Args &f, int64_t row, int64_t tq)
{
    return fp8_scale(f, f.a_scales, row * (f.g.op == OP_DX ? f.tiles_n : f.tiles_k) + tq);
}
__device__ __forceinline__ float fp8_w_scale(const Fp8Args &f, int64_t e, int64_t tq, int64_t j)
{
    if (f.w_kn)
        return fp8_scale(f, f.b_scales, (e * f.tiles_k + j / F8_TILE) * f.tiles_n + tq);
    return fp8_scale(f, f.b_scales, f.g.op == OP_DX ? (e * f.tiles_n + tq) * f.tiles_k + j / F8_TILE
                                                    : (e * f.tiles_n + j / F8_TILE) * f.tiles_k + tq);
}

// The Hopper kernel (gemm/fp8_sm90.cu) and its TMA descriptors (W [E][N][K] codes, or W^T [E][K][N] for dX with
// w_kn; A [M][K or N] codes unless permute_x / permute_y gathers its rows).  fp8_sm90_plan: whether the call is its shape (sm_90a built and
// present, fwd or dX, K % 16 == 0 and for dX N % 16 == 0, the codes 16-byte aligned) and, if so, whether the
// driver accepted the maps (*maps); it sets f->g.tma_out where the kernel writes the output by TMA stores
// (fp8_sm90_tma_store, gemm/heuristics.cu: the rows in tile order and overwritten, and the driver took maps->out),
// and f->sm90_wide where it takes tiles of 256 columns (fp8_sm90_wide_tiles; the routing check then counts tiles
// of 256 columns).
struct Fp8Sm90Maps {
    CUtensorMap w, a;
    CUtensorMap out; // with f->g.tma_out: the output in gemm/tma_store.cuh's boxes
};
enum Fp8Sm90Plan { FP8_SM90_NOT_ITS_SHAPE, FP8_SM90_TAKES, FP8_SM90_MAPS_REFUSED };
Fp8Sm90Plan fp8_sm90_plan(Fp8Args *f, Fp8Sm90Maps *maps);
moe_status launch_fp8_sm90(const Fp8Args &f, const Fp8Sm90Maps &maps, int64_t max_tiles, cudaStream_t stream);
// One persistent launch of a Hopper FP8 kernel (kernel(f, maps)), its dynamic shared memory allowed first.
moe_status launch_fp8_sm90_kernel(void *kernel, const Fp8Args &f, const Fp8Sm90Maps &maps, int64_t max_tiles,
                                  int threads, size_t smem_bytes, cudaStream_t stream);

// dW's Hopper kernel (gemm/fp8_dw_sm90.cu) on the transposed codes (options.codes_transposed: f.a = dY^T [N][M],
// f.b = X^T [K][M]).  fp8_dw_sm90_plan: whether the call is its shape (sm_90a built and present, 0 < M < 2^31 - 144,
// M % 16 == 0: the rows' stride in bytes, the codes 16-byte aligned) and the driver took the maps (maps->a: dY^T,
// maps->w: X^T); else the caller runs the portable kernel.
bool fp8_dw_sm90_plan(const Fp8Args &f, Fp8Sm90Maps *maps);
moe_status launch_fp8_dw_sm90(const Fp8Args &f, const Fp8Sm90Maps &maps, int64_t max_tiles, cudaStream_t stream);

} // namespace moe_gpu

#endif
