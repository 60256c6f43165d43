// The MLP tile path's SIMT fp32 tile engine (tile_kernel<Op>): 64 x 64 output tiles of a GEMM-shaped step whose
// Op supplies the tile decomposition, the operand loaders and the epilogue (gpu/mlp/tile_ops.cu).
#ifndef LIBMOE_GPU_MLP_TILE_ENGINE_CUH
#define LIBMOE_GPU_MLP_TILE_ENGINE_CUH

#include "common/launch.cuh"
#include "common/simt_tile.cuh"
#include "mlp/args.cuh"

namespace moe_gpu {

// ------------------------------------------------------------------------------------------------
// The tile engine
// ------------------------------------------------------------------------------------------------

// Per-tile facts.  Row-tiled ops (one block n, rows = slots i0.. of it): n, e, i0 = first slot, j0 =
// first output column, qlen = reduction length.  Expert ops (one expert e, rows = weight rows i0..,
// reduction over the expert's positions): eb0 = expert_start[e].
struct MlpTile {
    int64_t n, e, i0, j0, qlen, eb0;
};

// Positions of the tile's rows (row-tiled ops) or of the current reduction chunk (expert ops).
struct MlpTileRows {
    int64_t pos[SIMT_BM]; // -1 past the end
    int64_t tok[SIMT_BM]; // -1 for padding (or past the end)
    float a[SIMT_BM];     // A[tok][e] (0 for padding)
};

// Row-tiled decomposition: per block ceil(B/SIMT_BM) row tiles x col_tiles, column tiles fastest.
__device__ __forceinline__ MlpTile row_tile(const MlpArgs &g, int64_t tile, int64_t col_tiles, int64_t col_width,
                                              int64_t qlen)
{
    const int64_t row_tiles = cdiv(g.B, SIMT_BM);
    MlpTile t;
    t.n = tile / (row_tiles * col_tiles);
    const int64_t local = tile % (row_tiles * col_tiles);
    t.i0 = local / col_tiles * SIMT_BM;
    t.j0 = local % col_tiles * col_width;
    t.e = g.b2e[t.n];
    t.qlen = qlen;
    t.eb0 = 0;
    return t;
}

// Expert decomposition: per expert row_tiles x col_tiles, row tiles fastest.
__device__ __forceinline__ MlpTile expert_tile(const MlpArgs &g, int64_t tile, int64_t rows, int64_t cols)
{
    const int64_t row_tiles = cdiv(rows, SIMT_BM), col_tiles = cdiv(cols, SIMT_BN);
    MlpTile t;
    t.e = tile / (row_tiles * col_tiles);
    const int64_t local = tile % (row_tiles * col_tiles);
    t.i0 = local % row_tiles * SIMT_BM;
    t.j0 = local / row_tiles * SIMT_BN;
    t.n = -1;
    t.eb0 = g.expert_start[t.e];
    t.qlen = (g.expert_start[t.e + 1] - t.eb0) * g.B;
    return t;
}

// Fills rows.{pos,tok,a}[i] for the slots i0 + i (i < count) of block n (row ops).
__device__ __forceinline__ void fill_block_rows(const MlpArgs &g, const MlpTile &t, MlpTileRows &rows)
{
    for (int i = threadIdx.x; i < SIMT_BM; i += blockDim.x) {
        const int64_t b = t.i0 + i;
        int64_t pos = -1, tok = -1;
        float a = 0.0f;
        if (b < g.B) {
            pos = t.n * g.B + b;
            tok = token_of(g, pos);
            if (tok >= 0)
                a = load_as_float(g.dt, g.aff, tok * g.E + t.e);
        }
        rows.pos[i] = pos, rows.tok[i] = tok, rows.a[i] = a;
    }
}

// Fills rows for the reduction chunk q0 .. q0+SIMT_BK-1 of an expert op (q = local position index).
__device__ __forceinline__ void fill_expert_chunk(const MlpArgs &g, const MlpTile &t, int64_t q0, MlpTileRows &rows)
{
    for (int q = threadIdx.x; q < SIMT_BK; q += blockDim.x) {
        const int64_t qq = q0 + q;
        int64_t pos = -1, tok = -1;
        float a = 0.0f;
        if (qq < t.qlen) {
            pos = g.expert_blocks[t.eb0 + qq / g.B] * g.B + qq % g.B;
            tok = token_of(g, pos);
            if (tok >= 0)
                a = load_as_float(g.dt, g.aff, tok * g.E + t.e);
        }
        rows.pos[q] = pos, rows.tok[q] = tok, rows.a[q] = a;
    }
}

// Op interface (all static __device__):
//   A_QC, B_QC          whether A(i, q) / B(q, j) is contiguous along q (picks the coalescing order)
//   coord(g, tile)      the MlpTile of a tile (the host computes the tile count)
//   EXPERT              true: fill_expert_chunk per K chunk (rows = the chunk); false: fill_block_rows once
//   a(g, t, rows, i, q, ql), b(g, t, rows, q, j, ql)   operands as float (0 outside), ql = q - q0
//   epilogue(g, t, rows, acc, tx, ty)   thread (tx, ty) owns rows ty + 16u, columns tx + 16v
template <class Op>
__global__ void __launch_bounds__(SIMT_THREADS) tile_kernel(MlpArgs g, int64_t tiles)
{
    __shared__ float sa[SIMT_BK][SIMT_BM + 4];
    __shared__ float sb[SIMT_BK][SIMT_BN + 4];
    __shared__ MlpTileRows rows;
    if (*g.status != ERR_NONE)
        return;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const MlpTile t = Op::coord(g, tile);
        if (!Op::EXPERT)
            fill_block_rows(g, t, rows);
        float acc[4][4] = {};
        for (int64_t q0 = 0; q0 < t.qlen; q0 += SIMT_BK) {
            if (Op::EXPERT)
                fill_expert_chunk(g, t, q0, rows);
            __syncthreads();
            for (int idx = threadIdx.x; idx < SIMT_BK * SIMT_BM; idx += SIMT_THREADS) {
                const int i = Op::A_QC ? idx / SIMT_BK : idx % SIMT_BM, q = Op::A_QC ? idx % SIMT_BK : idx / SIMT_BM;
                sa[q][i] = q0 + q < t.qlen ? Op::a(g, t, rows, i, q0 + q, q) : 0.0f;
            }
            for (int idx = threadIdx.x; idx < SIMT_BK * SIMT_BN; idx += SIMT_THREADS) {
                const int j = Op::B_QC ? idx / SIMT_BK : idx % SIMT_BN, q = Op::B_QC ? idx % SIMT_BK : idx / SIMT_BN;
                sb[q][j] = q0 + q < t.qlen ? Op::b(g, t, rows, q0 + q, j, q) : 0.0f;
            }
            __syncthreads();
#pragma unroll
            for (int q = 0; q < SIMT_BK; q++) {
                float av[4], bv[4];
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    av[u] = sa[q][ty + 16 * u];
                    bv[u] = sb[q][tx + 16 * u];
                }
#pragma unroll
                for (int u = 0; u < 4; u++)
#pragma unroll
                    for (int v = 0; v < 4; v++)
                        acc[u][v] = fmaf(av[u], bv[v], acc[u][v]);
            }
            __syncthreads();
        }
        __syncthreads(); // rows visible to the epilogue (also when qlen == 0)
        Op::epilogue(g, t, rows, acc, tx, ty);
        __syncthreads(); // rows are refilled by the next tile
    }
}

} // namespace moe_gpu

#endif
