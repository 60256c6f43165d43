// The GEMM's SIMT family: true fp32 FFMA for every op and dtype (f32 without allow_tf32, and the shapes the
// tensor-core families cannot take), and its launch.
#include "common/cuda_check.cuh"
#include "common/launch.cuh"
#include "common/simt_tile.cuh"
#include "gemm/epilogue.cuh"
#include "gemm/plan.cuh"

namespace moe_gpu {
namespace {

// ------------------------------------------------------------------------------------------------
// SIMT fp32 path: 64 x 64 tiles, 256 threads each computing 4 x 4, BK = 16.  A(i, q) and B(q, j) are read
// as floats, 0 outside the tile's valid range:
//   fwd, topk grad: A = X[xrow(r)][q], B = W[e][j][q];  dX: A = dY[yrow(r)][q], B = W[e][q][j];
//   dW: A(n, r) = w(r) * dY[yrow(r)][n] (the weight multiply in fp32), B = X[xrow(r)][j].
// The rows are looked up once, not per element (under permute_x a lookup divides): per tile for the
// expert rows of fwd, dX and the topk grad (a_rows), per k-step for dW's rows (q_rows, q_weight).
// ------------------------------------------------------------------------------------------------

__global__ void __launch_bounds__(SIMT_THREADS) simt_gemm_kernel(GemmArgs g)
{
    __shared__ float tile_a[SIMT_BK][SIMT_BM];
    __shared__ float tile_b[SIMT_BK][SIMT_BN];
    __shared__ float tile_c[SIMT_BM * (SIMT_BN + 1)];
    __shared__ int64_t a_rows[SIMT_BM];     // fwd, dX, topk grad: A's source row per tile row, -1 past the expert
    __shared__ int64_t q_rows[2][SIMT_BK];  // dW: the k-step's rows of dY and of X, -1 past the expert
    __shared__ float q_weight[SIMT_BK];     // dW: their topk weights (1 without)
    if (*g.ws.status != 0)
        return;
    const int64_t tiles = total_tiles(g, SIMT_BM, SIMT_BN);
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const bool dw = g.op == OP_DW;
    const int64_t lda = g.op == OP_DX ? g.N : g.K;
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const TileCoord t = tile_coord(g, tile, SIMT_BM, SIMT_BN);
        const int64_t qlen = reduction_length(g, t.e), base = g.ws.offsets[t.e];
        if (!dw && threadIdx.x < SIMT_BM)
            a_rows[threadIdx.x] = a_source_row(g, t, t.i0 + threadIdx.x, g.op == OP_DX);
        float acc[4][4] = {};
        for (int64_t q0 = 0; q0 < qlen; q0 += SIMT_BK) {
            if (dw && threadIdx.x < SIMT_BK) {
                const int64_t q = q0 + threadIdx.x, r = base + q;
                const bool in = q < qlen;
                q_rows[0][threadIdx.x] = in ? y_row(g, r) : -1;
                q_rows[1][threadIdx.x] = in ? x_row(g, r) : -1;
                q_weight[threadIdx.x] = in && g.weights ? topk_weight(g, r) : 1.0f;
            }
            __syncthreads(); // the row tables are written (and the previous k-step's tiles are read)
            for (int idx = threadIdx.x; idx < SIMT_BK * SIMT_BM; idx += SIMT_THREADS) {
                const int q = idx / SIMT_BM, i = idx % SIMT_BM;
                const int64_t gq = q0 + q, gi = t.i0 + i, gj = t.j0 + i;
                float a = 0.0f, b = 0.0f;
                if (dw) {
                    const int64_t yr = q_rows[0][q], xr = q_rows[1][q];
                    if (yr >= 0 && gi < t.rows)
                        a = q_weight[q] * load_as_float(g.dtype, g.a, yr * g.N + gi);
                    if (xr >= 0 && gj < g.cols_j)
                        b = load_as_float(g.dtype, g.b, xr * g.K + gj);
                } else {
                    if (a_rows[i] >= 0 && gq < qlen)
                        a = load_as_float(g.dtype, g.a, a_rows[i] * lda + gq);
                    if (gj < g.cols_j && gq < qlen)
                        b = load_as_float(g.dtype, g.b, g.op == OP_DX ? (t.e * g.N + gq) * g.K + gj : (t.e * g.N + gj) * g.K + gq);
                }
                tile_a[q][i] = a;
                tile_b[q][i] = b;
            }
            __syncthreads();
#pragma unroll
            for (int q = 0; q < SIMT_BK; q++) {
                float a[4], b[4];
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    a[u] = tile_a[q][ty + 16 * u];
                    b[u] = tile_b[q][tx + 16 * u];
                }
#pragma unroll
                for (int u = 0; u < 4; u++)
#pragma unroll
                    for (int v = 0; v < 4; v++)
                        acc[u][v] += a[u] * b[v];
            }
        }
#pragma unroll
        for (int u = 0; u < 4; u++)
#pragma unroll
            for (int v = 0; v < 4; v++)
                tile_c[(ty + 16 * u) * (SIMT_BN + 1) + tx + 16 * v] = acc[u][v];
        __syncthreads();
        epilogue<SIMT_BM, SIMT_BN, SIMT_BN + 1>(g, t, tile_c);
        __syncthreads(); // tile_c, the k-steps' tiles and the row tables are read before the next tile writes them
    }
}

} // namespace

moe_status launch_simt(const GemmArgs &g, int64_t max_tiles, cudaStream_t stream)
{
    simt_gemm_kernel<<<persistent_grid(max_tiles, 4), SIMT_THREADS, 0, stream>>>(g);
    MOE_CUDA_CHECK(cudaGetLastError());
    return MOE_OK;
}

} // namespace moe_gpu
