// The MLP tile path (float32 intermediates, f16 and f32 by default): the GEMM-shaped steps of the forward and the
// backward as Ops of the SIMT tile engine (gpu/mlp/tile_engine.cuh), with their epilogues, and their launches.
#include "common/act.cuh"
#include "common/cuda_check.cuh"
#include "mlp/steps.cuh"
#include "mlp/tile_engine.cuh"

namespace moe_gpu {
namespace {

// ---- forward: gate/up projection.  A tile covers 32 values of i: columns 0..31 the gate (j = i),
// 32..63 the up projection (j = I + i), so that the thread owning g[i] also owns u[i].
struct OpGateUp {
    static constexpr bool A_QC = true, B_QC = false, EXPERT = false;
    static __device__ MlpTile coord(const MlpArgs &g, int64_t tile) { return row_tile(g, tile, cdiv(g.I, 32), 32, g.H); }
    static __device__ float a(const MlpArgs &g, const MlpTile &, const MlpTileRows &rows, int i, int64_t h, int)
    {
        return rows.tok[i] >= 0 ? load_as_float(g.dt, g.hidden, rows.tok[i] * g.H + h) : 0.0f;
    }
    static __device__ float b(const MlpArgs &g, const MlpTile &t, const MlpTileRows &, int64_t h, int c, int)
    {
        const int64_t i = t.j0 + (c & 31);
        if (i >= g.I)
            return 0.0f;
        return load_as_float(g.dt, g.w_gu, (t.e * g.H + h) * 2 * g.I + (c < 32 ? i : g.I + i));
    }
    static __device__ void epilogue(const MlpArgs &g, const MlpTile &t, const MlpTileRows &rows, const float (&acc)[4][4],
                                    int tx, int ty)
    {
        const int64_t I = g.I, I2 = 2 * g.I;
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int r = ty + 16 * u;
            const int64_t b = t.i0 + r, pos = rows.pos[r], tok = rows.tok[r];
            if (b >= g.B)
                continue;
#pragma unroll
            for (int v = 0; v < 2; v++) {
                const int64_t i = t.j0 + tx + 16 * v;
                if (i >= I)
                    continue;
                const int64_t ck_g = (t.n * I2 + i) * g.B + b, ck_u = (t.n * I2 + I + i) * g.B + b;
                if (tok < 0) { // padding: checkpoints +0, nothing else
                    if (g.ckpt_gu != nullptr) {
                        store_from_float(g.dt, g.ckpt_gu, ck_g, 0.0f);
                        store_from_float(g.dt, g.ckpt_gu, ck_u, 0.0f);
                    }
                    continue;
                }
                float gv = acc[u][v], uv = acc[u][v + 2];
                if (g.bias) {
                    gv = gv + load_as_float(g.dt, g.b_gu, t.e * I2 + i);
                    uv = uv + load_as_float(g.dt, g.b_gu, t.e * I2 + I + i);
                }
                gv = clamp_value(gv, g.has_nl_lo, g.nl_lo, g.has_nl_hi, g.nl_hi);
                uv = clamp_value(uv, g.has_lin_lo, g.lin_lo, g.has_lin_hi, g.lin_hi);
                if (g.ckpt_gu != nullptr) {
                    store_from_float(g.dt, g.ckpt_gu, ck_g, gv);
                    store_from_float(g.dt, g.ckpt_gu, ck_u, uv);
                }
                float m = act_value(g.act, gv) * uv;
                if (g.on_i) {
                    if (g.M0 != nullptr)
                        g.M0[pos * I + i] = m;
                    m = m * rows.a[r];
                }
                g.M[pos * I + i] = m;
            }
        }
    }
};

// ---- down projection M . W_d[e] (forward and the backward's recomputation of d)
enum DownMode : int { DOWN_FORWARD = 0, DOWN_CKPT_FROM_M0 = 1, DOWN_RECOMPUTE = 2 };

template <int MODE>
struct OpDown {
    static constexpr bool A_QC = true, B_QC = false, EXPERT = false;
    static __device__ MlpTile coord(const MlpArgs &g, int64_t tile) { return row_tile(g, tile, cdiv(g.H, SIMT_BN), SIMT_BN, g.I); }
    static __device__ float a(const MlpArgs &g, const MlpTile &, const MlpTileRows &rows, int i, int64_t q, int)
    {
        if (rows.tok[i] < 0)
            return 0.0f;
        const float *m = MODE == DOWN_FORWARD ? g.M : g.M0;
        return m[rows.pos[i] * g.I + q];
    }
    static __device__ float b(const MlpArgs &g, const MlpTile &t, const MlpTileRows &, int64_t q, int j, int)
    {
        const int64_t h = t.j0 + j;
        return h < g.H ? load_as_float(g.dt, g.w_d, (t.e * g.I + q) * g.H + h) : 0.0f;
    }
    static __device__ void epilogue(const MlpArgs &g, const MlpTile &t, const MlpTileRows &rows, const float (&acc)[4][4],
                                    int tx, int ty)
    {
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int r = ty + 16 * u;
            const int64_t b = t.i0 + r, pos = rows.pos[r], tok = rows.tok[r];
            if (b >= g.B)
                continue;
            const float a = rows.a[r];
#pragma unroll
            for (int v = 0; v < 4; v++) {
                const int64_t h = t.j0 + tx + 16 * v;
                if (h >= g.H)
                    continue;
                const float bd = g.bias ? load_as_float(g.dt, g.b_d, t.e * g.H + h) : 0.0f;
                const float d = g.bias ? acc[u][v] + bd : acc[u][v];
                if (MODE == DOWN_RECOMPUTE) {
                    if (tok >= 0)
                        g.Dre[pos * g.H + h] = d;
                } else if (MODE == DOWN_CKPT_FROM_M0) {
                    store_from_float(g.dt, g.ckpt_d, pos * g.H + h, tok >= 0 ? d : 0.0f);
                } else if (!g.on_i) {
                    if (g.ckpt_d != nullptr)
                        store_from_float(g.dt, g.ckpt_d, pos * g.H + h, tok >= 0 ? d : 0.0f);
                    if (tok >= 0)
                        g.contrib[pos * g.H + h] = a * d;
                } else if (tok >= 0) {
                    g.contrib[pos * g.H + h] = g.bias ? acc[u][v] + a * bd : acc[u][v];
                }
            }
        }
    }
};

// ---- backward: dM = dD . W_d[e]^T, then the gate/up gradients in the epilogue
struct OpDm {
    static constexpr bool A_QC = true, B_QC = true, EXPERT = false;
    static __device__ MlpTile coord(const MlpArgs &g, int64_t tile) { return row_tile(g, tile, cdiv(g.I, SIMT_BN), SIMT_BN, g.H); }
    static __device__ float a(const MlpArgs &g, const MlpTile &, const MlpTileRows &rows, int i, int64_t h, int)
    {
        return rows.tok[i] >= 0 ? scaled_grad(g, rows.tok[i], rows.a[i], h, !g.on_i) : 0.0f;
    }
    static __device__ float b(const MlpArgs &g, const MlpTile &t, const MlpTileRows &, int64_t h, int j, int)
    {
        const int64_t i = t.j0 + j;
        return i < g.I ? load_as_float(g.dt, g.w_d, (t.e * g.I + i) * g.H + h) : 0.0f;
    }
    static __device__ void epilogue(const MlpArgs &g, const MlpTile &t, const MlpTileRows &rows, const float (&acc)[4][4],
                                    int tx, int ty)
    {
        const int64_t I = g.I, I2 = 2 * g.I;
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int r = ty + 16 * u;
            const int64_t b = t.i0 + r, pos = rows.pos[r], tok = rows.tok[r];
            if (b >= g.B || tok < 0)
                continue;
            const float a = rows.a[r];
#pragma unroll
            for (int v = 0; v < 4; v++) {
                const int64_t i = t.j0 + tx + 16 * v;
                if (i >= I)
                    continue;
                const float dm = g.on_i ? a * acc[u][v] : acc[u][v];
                const float gv = load_as_float(g.dt, g.ckpt_gu_in, (t.n * I2 + i) * g.B + b);
                const float uv = load_as_float(g.dt, g.ckpt_gu_in, (t.n * I2 + I + i) * g.B + b);
                const float ag = act_value(g.act, gv);
                const float m0 = ag * uv;
                if (g.M0 != nullptr)
                    g.M0[pos * I + i] = m0;
                g.M[pos * I + i] = g.on_i ? m0 * a : m0;
                const bool g_free = (!g.has_nl_lo || g.nl_lo < gv) && (!g.has_nl_hi || gv < g.nl_hi);
                const bool u_free = (!g.has_lin_lo || g.lin_lo < uv) && (!g.has_lin_hi || uv < g.lin_hi);
                g.dGU[pos * I2 + i] = g_free ? (dm * uv) * act_derivative(g.act, gv) : 0.0f;
                g.dGU[pos * I2 + I + i] = u_free ? dm * ag : 0.0f;
            }
        }
    }
};

// ---- backward: per-position dX = dGU . W_gu[e]^T
struct OpDx {
    static constexpr bool A_QC = true, B_QC = true, EXPERT = false;
    static __device__ MlpTile coord(const MlpArgs &g, int64_t tile) { return row_tile(g, tile, cdiv(g.H, SIMT_BN), SIMT_BN, 2 * g.I); }
    static __device__ float a(const MlpArgs &g, const MlpTile &, const MlpTileRows &rows, int i, int64_t j, int)
    {
        return rows.tok[i] >= 0 ? g.dGU[rows.pos[i] * 2 * g.I + j] : 0.0f;
    }
    static __device__ float b(const MlpArgs &g, const MlpTile &t, const MlpTileRows &, int64_t j, int c, int)
    {
        const int64_t h = t.j0 + c;
        return h < g.H ? load_as_float(g.dt, g.w_gu, (t.e * g.H + h) * 2 * g.I + j) : 0.0f;
    }
    static __device__ void epilogue(const MlpArgs &g, const MlpTile &t, const MlpTileRows &rows, const float (&acc)[4][4],
                                    int tx, int ty)
    {
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int r = ty + 16 * u;
            if (t.i0 + r >= g.B || rows.tok[r] < 0)
                continue;
#pragma unroll
            for (int v = 0; v < 4; v++) {
                const int64_t h = t.j0 + tx + 16 * v;
                if (h < g.H)
                    g.contrib[rows.pos[r] * g.H + h] = acc[u][v];
            }
        }
    }
};

// ---- backward: dW_d[e] = M^T . dD over the expert's positions (ON_I: (a*m)^T . G)
struct OpDwD {
    static constexpr bool A_QC = false, B_QC = false, EXPERT = true;
    static __device__ MlpTile coord(const MlpArgs &g, int64_t tile) { return expert_tile(g, tile, g.I, g.H); }
    static __device__ float a(const MlpArgs &g, const MlpTile &t, const MlpTileRows &rows, int i, int64_t, int ql)
    {
        const int64_t iw = t.i0 + i;
        return rows.tok[ql] >= 0 && iw < g.I ? g.M[rows.pos[ql] * g.I + iw] : 0.0f;
    }
    static __device__ float b(const MlpArgs &g, const MlpTile &t, const MlpTileRows &rows, int64_t, int j, int ql)
    {
        const int64_t h = t.j0 + j;
        return rows.tok[ql] >= 0 && h < g.H ? scaled_grad(g, rows.tok[ql], rows.a[ql], h, !g.on_i) : 0.0f;
    }
    static __device__ void epilogue(const MlpArgs &g, const MlpTile &t, const MlpTileRows &, const float (&acc)[4][4], int tx,
                                    int ty)
    {
#pragma unroll
        for (int u = 0; u < 4; u++)
#pragma unroll
            for (int v = 0; v < 4; v++) {
                const int64_t i = t.i0 + ty + 16 * u, h = t.j0 + tx + 16 * v;
                if (i < g.I && h < g.H)
                    store_grad(g, g.d_wd, (t.e * g.I + i) * g.H + h, acc[u][v]);
            }
    }
};

// ---- backward: dW_gu[e] = X^T . dGU over the expert's positions
struct OpDwGu {
    static constexpr bool A_QC = false, B_QC = false, EXPERT = true;
    static __device__ MlpTile coord(const MlpArgs &g, int64_t tile) { return expert_tile(g, tile, g.H, 2 * g.I); }
    static __device__ float a(const MlpArgs &g, const MlpTile &t, const MlpTileRows &rows, int i, int64_t, int ql)
    {
        const int64_t h = t.i0 + i;
        return rows.tok[ql] >= 0 && h < g.H ? load_as_float(g.dt, g.hidden, rows.tok[ql] * g.H + h) : 0.0f;
    }
    static __device__ float b(const MlpArgs &g, const MlpTile &t, const MlpTileRows &rows, int64_t, int j, int ql)
    {
        const int64_t jj = t.j0 + j;
        return rows.tok[ql] >= 0 && jj < 2 * g.I ? g.dGU[rows.pos[ql] * 2 * g.I + jj] : 0.0f;
    }
    static __device__ void epilogue(const MlpArgs &g, const MlpTile &t, const MlpTileRows &, const float (&acc)[4][4], int tx,
                                    int ty)
    {
#pragma unroll
        for (int u = 0; u < 4; u++)
#pragma unroll
            for (int v = 0; v < 4; v++) {
                const int64_t h = t.i0 + ty + 16 * u, j = t.j0 + tx + 16 * v;
                if (h < g.H && j < 2 * g.I)
                    store_grad(g, g.d_wgu, (t.e * g.H + h) * 2 * g.I + j, acc[u][v]);
            }
    }
};

template <class Op>
moe_status launch_tiles(const MlpArgs &g, int64_t tiles, cudaStream_t stream)
{
    if (tiles <= 0)
        return MOE_OK;
    tile_kernel<Op><<<resident_grid(tile_kernel<Op>, SIMT_THREADS, tiles), SIMT_THREADS, 0, stream>>>(g, tiles);
    MOE_CUDA_CHECK(cudaGetLastError());
    return MOE_OK;
}

} // namespace

// The tile path forward's GEMMs: gate/up, down and (ckpt_from_m0: ON_I with a down checkpoint) the
// checkpoint's down pass from the unscaled m.
moe_status tile_path_fwd(const MlpArgs &a, bool ckpt_from_m0, cudaStream_t stream)
{
    const int64_t H = a.H, I = a.I;
    const int64_t rt = cdiv(a.B, SIMT_BM);
    moe_status s = launch_tiles<OpGateUp>(a, a.num_blocks * rt * cdiv(I, 32), stream);
    if (s == MOE_OK)
        s = launch_tiles<OpDown<DOWN_FORWARD>>(a, a.num_blocks * rt * cdiv(H, SIMT_BN), stream);
    if (s == MOE_OK && ckpt_from_m0)
        s = launch_tiles<OpDown<DOWN_CKPT_FROM_M0>>(a, a.num_blocks * rt * cdiv(H, SIMT_BN), stream);
    return s;
}

// The tile path backward's dM (with the gate/up gradients) and, when recompute, d recomputed from the unscaled m.
moe_status tile_path_dm(const MlpArgs &a, bool recompute, cudaStream_t stream)
{
    const int64_t H = a.H, I = a.I;
    const int64_t rt = cdiv(a.B, SIMT_BM);
    moe_status s = launch_tiles<OpDm>(a, a.num_blocks * rt * cdiv(I, SIMT_BN), stream);
    if (s == MOE_OK && recompute)
        s = launch_tiles<OpDown<DOWN_RECOMPUTE>>(a, a.num_blocks * rt * cdiv(H, SIMT_BN), stream);
    return s;
}

// The tile path backward's per-position dX rows.
moe_status tile_path_dx(const MlpArgs &a, cudaStream_t stream)
{
    const int64_t rt = cdiv(a.B, SIMT_BM);
    return launch_tiles<OpDx>(a, a.num_blocks * rt * cdiv(a.H, SIMT_BN), stream);
}

// The tile path backward's weight gradients d_w_d and d_w_gu.
moe_status tile_path_dw(const MlpArgs &a, cudaStream_t stream)
{
    const int64_t H = a.H, I = a.I, E = a.E;
    moe_status s = launch_tiles<OpDwD>(a, E * cdiv(I, SIMT_BM) * cdiv(H, SIMT_BN), stream);
    if (s == MOE_OK)
        s = launch_tiles<OpDwGu>(a, E * cdiv(H, SIMT_BM) * cdiv(2 * I, SIMT_BN), stream);
    return s;
}

} // namespace moe_gpu
