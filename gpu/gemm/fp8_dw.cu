// FP8 dW on CUDA (moe_gemm_fp8_dw; the exact math is specs/FP8.md, "dW"), the portable kernel for every GPU from
// sm_80: dw[e][n][c] = the promoted sum over expert e's 128-row tiles t, in ascending order, of
//   part_t(n, c) * (sdy[s_t][n] * sx[s_t][c]),   s_t = offsets[e] / 128 + e + t (gpu/fp8/column_tiles.cuh),
// part_t the tile's fp32 tensor-core sum of dY[r][n] * X[r][c] over its rows r.  The operands are reduction-major
// (rows are tokens), so each 32-row step of both is read 16 codes of a row at a time, decoded exactly to bf16 and
// stored transposed in shared memory ([n][q] and [c][q], as gpu/gemm/fp8.cu stores dX's W), then multiplied by
// mma.sync m16n8k16 with fp32 accumulation.  At the end of each tile, acc += part * (s_dy(n) * s_x(c)) with the
// reference's two roundings (its promoted_dot: the scale product, then the multiply and the add, never fused).
// Only the order of a tile's (exact) products differs from the reference, which the oracle's bound allows.
//
// 128 x 128 output tiles (n, c) of each expert, 256 threads (8 warps of 64 x 32), persistent CTAs.  The expert
// offsets come from the routing check on the device (no host sync); the scales of the tiles in use are checked
// there too, before the kernel: a bad one is reported by moe_backend_synchronize and nothing is written.  An
// expert without rows gets +0 (old + 0 with accumulate), as in the reference; the output goes through the GEMM's
// epilogue (gemm/epilogue.cuh: accumulate, one rounding to f32 or bf16).
#include "common/cuda_check.cuh"
#include "common/launch.cuh"
#include "fp8/column_tiles.cuh"
#include "gemm/epilogue.cuh"
#include "gemm/fp8.cuh"
#include "gemm/gemm.cuh"
#include "gemm/plan.cuh"

namespace moe_gpu {
namespace {

static_assert(F8_THREADS == F8_BM + F8_BN, "one thread per scale of the output tile's n and c at the promotion");

__global__ void __launch_bounds__(F8_THREADS) fp8_dw_kernel(Fp8Args f)
{
    __shared__ uint16_t decode_a[256], decode_b[256];
    __shared__ __align__(16) uint16_t sa[F8_BM][F8_LDS]; // dY(q, n) of the step stored as [n][q]
    __shared__ __align__(16) uint16_t sb[F8_BN][F8_LDS]; // X(q, c) of the step stored as [c][q]
    __shared__ float a_scale[F8_BM], b_scale[F8_BN];      // the tile's scales of the n and c of the output tile
    const GemmArgs &g = f.g;
    if (*g.ws.status != 0)
        return;
    for (int i = threadIdx.x; i < 256; i += F8_THREADS) {
        decode_a[i] = fp8_to_bf16_bits(f.a_dtype, (unsigned)i);
        decode_b[i] = fp8_to_bf16_bits(f.b_dtype, (unsigned)i);
    }
    const int warp = threadIdx.x / 32;
    const int wm = warp % 2 * 64, wn = warp / 2 * 32;
    const int64_t tiles = total_tiles(g, F8_BM, F8_BN);
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const TileCoord t = tile_coord(g, tile, F8_BM, F8_BN); // i0: n, j0: c
        const int64_t first = g.ws.offsets[t.e], end = g.ws.offsets[t.e + 1];
        const int64_t scale_row0 = column_first_scale_row(g.ws.offsets, t.e);
        float acc[4][4][4] = {}, part[4][4][4] = {};
        for (int64_t q_begin = first, s_row = scale_row0; q_begin < end; q_begin += F8_TILE, s_row++) {
            const int64_t q_end = end - q_begin < F8_TILE ? end : q_begin + F8_TILE;
            for (int64_t q0 = q_begin; q0 < q_end; q0 += F8_BK) {
                __syncthreads(); // the decode tables written; the previous step's tiles read
                { // row q of the step (zero past the tile), 16 consecutive columns of each operand
                    const int q = threadIdx.x / 8, c16 = threadIdx.x % 8 * 16;
                    const int64_t r = q0 + q;
                    const uint8_t *dy_row = r < q_end ? f.a + r * g.N : nullptr;
                    const uint8_t *x_row = r < q_end ? f.b + r * g.K : nullptr;
                    load16(dy_row, t.i0 + c16, g.N, f.a_vec, decode_a, &sa[c16][q], F8_LDS);
                    load16(x_row, t.j0 + c16, g.K, f.b_vec, decode_b, &sb[c16][q], F8_LDS);
                }
                __syncthreads();
                fp8_mma_step(sa, sb, wm, wn, part);
            }
            // promotion: acc += part * (s_dy(n) * s_x(c)), the reference's two roundings
            if (threadIdx.x < F8_BM) {
                const int64_t n = t.i0 + threadIdx.x;
                a_scale[threadIdx.x] = n < g.N ? fp8_scale(f, f.a_scales, s_row * g.N + n) : 0.0f;
            } else {
                const int64_t c = t.j0 + threadIdx.x - F8_BM;
                b_scale[threadIdx.x - F8_BM] = c < g.K ? fp8_scale(f, f.b_scales, s_row * g.K + c) : 0.0f;
            }
            __syncthreads();
            fp8_promote(acc, part, a_scale, b_scale, 1, wm, wn);
            __syncthreads(); // the scales are read before the next tile writes them
        }
        fp8_store(g, t, acc, wm, wn);
    }
}

} // namespace
} // namespace moe_gpu

using namespace moe_gpu;

// The call on the stream: workspace, the routing check (the expert offsets), the scale checks of the tiles in use,
// the kernel.
moe_status moe_cuda_gemm_fp8_dw(const moe_fp8_problem *fp, const moe_fp8_tensor *x, const moe_fp8_tensor *dy,
                                void *dw)
{
    const moe_gemm_problem *p = &fp->g;
    cudaStream_t stream = static_cast<cudaStream_t>(p->stream);
    const int64_t E = p->num_experts, M = p->rows, N = p->N, K = p->K;
    Fp8Args f = {};
    GemmArgs &g = f.g;
    g.op = OP_DW;
    g.dtype = MOE_F32; // no topk weights: the quantizer applied them
    g.out_dtype = p->dtype;
    g.T = p->num_tokens, g.k = p->topk, g.E = E, g.M = M, g.N = N, g.K = K;
    g.rows_i = N, g.cols_j = K;
    g.accumulate = p->accumulate;
    g.out = dw;
    f.a = static_cast<const uint8_t *>(dy->data), f.b = static_cast<const uint8_t *>(x->data);
    f.a_scales = dy->scales, f.b_scales = x->scales;
    f.a_dtype = dy->dtype, f.b_dtype = x->dtype;
    f.ue8m0 = fp->scale_format == MOE_FP8_SCALE_UE8M0;
    f.tiles_n = cdiv(N, F8_TILE), f.tiles_k = cdiv(K, F8_TILE);
    f.a_vec = aligned16(dy->data) && N % 16 == 0;
    f.b_vec = aligned16(x->data) && K % 16 == 0;
    const int64_t col_tiles = cdiv(K, F8_BN), scale_rows = cdiv(M, F8_TILE) + E - 1;

    unsigned char *ws = nullptr;
    float *unused = nullptr;
    MOE_CUDA_CHECK(alloc_call_workspace(E, M, 0, stream, &ws, &g.ws, &unused));
    moe_status status = MOE_OK;
    launch_routing_check(p, ROUTING_OP_FP8_DW, col_tiles, F8_BM, false, M / 32 + 1, g.ws, stream);
    cudaError_t err = launch_fp8_scale_check(x->scales, scale_rows * K, K, E, f.ue8m0, 0, ROUTING_OP_FP8_DW, g.ws,
                                             stream);
    if (err == cudaSuccess)
        err = launch_fp8_scale_check(dy->scales, scale_rows * N, N, E, f.ue8m0, 1, ROUTING_OP_FP8_DW, g.ws, stream);
    const int64_t max_tiles = max_tiles_of(OP_DW, E, M, N, F8_BM, col_tiles);
    if (err == cudaSuccess && max_tiles > 0) {
        fp8_dw_kernel<<<persistent_grid(max_tiles, 1), F8_THREADS, 0, stream>>>(f);
        err = cudaGetLastError();
    }
    if (err != cudaSuccess)
        status = moe_fail(MOE_ERR_DEVICE, "%s: kernel launch failed: %s", p->op, cudaGetErrorString(err));
    return free_call_workspace(p->op, ws, stream, status);
}
