// The rows path's row gathers: hidden or out_grad rows copied (or scaled by the affinity) from their tokens to the
// rows, with the affinity gradient's dot product fused into the out_grad gather when the down checkpoint is given.
#include "common/cuda_check.cuh"
#include "common/launch.cuh"
#include "mlp/steps.cuh"
#include "mlp/vec.cuh"

namespace moe_gpu {
namespace {

// dst[r][c] = src[token of r][c] (H columns, dtype dt), or rnd(a * src) with SCALE; dst or dst3 may be NULL, and
// dst3 (split backward) gets the same row at each of r's term rows (term_rows_of).  With DOT also
// da[pos of r] = <src[token], ckpt_d_in[pos]> (the backward's affinity gradient when the down checkpoint is
// given: dot_kernel's sum, in its order, without reading src again).  One warp per row.  Without DOT the
// rows are walked by token (tok_list, from token_lists_kernel), a token's rows one after the other, so that
// its src row comes from DRAM once and then from L1/L2; walked by row, in expert order, the k copies of a row
// are far apart in time (the X gather ran faster by token under ncu).  With DOT the walk by token was slower
// (its checkpoint reads and Sr writes, the bulk of its traffic, lose their row order), so it walks rows
// (bench/RESULTS.md, "the row gathers walked by token").  Per row, each lane handles the V-wide chunks
// lane*V + j*32*V (the order of
// dot_kernel's sum), BATCH of them loaded before any is stored.  What bounds these kernels is the number of
// rows in flight per SM (each row starts with a chain of dependent index loads): BATCH and the template
// flags keep each instance at <= 64 registers, 4 CTAs of 256 threads per SM (MOE_GATHER_MIN_CTAS, a
// compile-time knob for experiments; at 6 ptxas spills; bench/RESULTS.md,
// "MLP row gathers, dot fused into the Sr gather").  With 16-bit rows (V = 8) the values in flight are the raw
// 16-byte vectors, converted to fp32 at use: the scaled and dot instances went from 64 registers to 45-58, and the
// dY gather with the dot ran faster; a batch of 3 (MOE_GATHER_BATCH, 64 registers) or 4 (with
// MOE_GATHER_MIN_CTAS=3) was no faster (ncu, H200; bench/RESULTS.md, "raw vectors in the dY gather").
#ifndef MOE_GATHER_MIN_CTAS
#define MOE_GATHER_MIN_CTAS 4
#endif
#ifndef MOE_GATHER_BATCH
#define MOE_GATHER_BATCH 2
#endif
#ifndef MOE_GATHER_COPY_CTAS
#define MOE_GATHER_COPY_CTAS 2
#endif
template <int V, int BATCH, bool SCALE, bool DOT>
__global__ void __launch_bounds__(256, MOE_GATHER_MIN_CTAS) gather_rows_kernel(MlpArgs g, const void *__restrict__ src,
                                                                                 void *__restrict__ dst,
                                                                                 void *__restrict__ dst3)
{
    if (*g.status != ERR_NONE)
        return;
    const int lane = threadIdx.x % 32;
    const int64_t H = g.H, warps = (int64_t)gridDim.x * (blockDim.x / 32);
    const int64_t warp = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32;
    // Row r (at position pos, expert e) of token tok, with its affinity a when SCALE.
    auto gather_row = [&](int64_t r, int64_t pos, int64_t tok, int64_t e, float a) {
        int64_t first = 0, step = 0; // dst3's term rows of r
        if (dst3 != nullptr)
            term_rows_of(g, r, e, first, step);
        float sum = 0.0f;
        for (int64_t h0 = lane * (int64_t)V; h0 < H; h0 += 32 * V * BATCH) {
            if constexpr (V == 8 && !SCALE && !DOT) { // a plain copy of 16-byte chunks
                uint4 chunk[BATCH];
#pragma unroll
                for (int u = 0; u < BATCH; u++)
                    if (h0 + u * 32 * V < H)
                        chunk[u] = reinterpret_cast<const uint4 *>(src)[(tok * H + h0 + u * 32 * V) / 8];
#pragma unroll
                for (int u = 0; u < BATCH; u++)
                    if (h0 + u * 32 * V < H) {
                        if (dst != nullptr)
                            reinterpret_cast<uint4 *>(dst)[(r * H + h0 + u * 32 * V) / 8] = chunk[u];
                        if (dst3 != nullptr)
                            for (int p = 0; p < 3; p++)
                                reinterpret_cast<uint4 *>(dst3)[((first + p * step) * H + h0 + u * 32 * V) / 8] = chunk[u];
                    }
            } else if constexpr (V == 8) { // 16-bit rows, scaled or with the dot: raw vectors in flight
                uint4 vr[BATCH], dr[DOT ? BATCH : 1];
#pragma unroll
                for (int u = 0; u < BATCH; u++) {
                    const int64_t h = h0 + u * 32 * V;
                    if (h < H) {
                        vr[u] = reinterpret_cast<const uint4 *>(src)[(tok * H + h) / 8];
                        if (DOT)
                            dr[DOT ? u : 0] = reinterpret_cast<const uint4 *>(g.ckpt_d_in)[(pos * H + h) / 8];
                    }
                }
#pragma unroll
                for (int u = 0; u < BATCH; u++) {
                    const int64_t h = h0 + u * 32 * V;
                    if (h < H) {
                        float v[8], d[8];
                        unpack8(g.dt, vr[u], v);
                        if (DOT)
                            unpack8(g.dt, dr[DOT ? u : 0], d);
#pragma unroll
                        for (int c = 0; c < 8; c++) {
                            if (DOT)
                                sum = fmaf(v[c], d[c], sum);
                            if (SCALE)
                                v[c] = a * v[c];
                        }
                        if (dst != nullptr)
                            store_v<8>(g.dt, dst, r * H + h, v);
                        if (dst3 != nullptr)
                            for (int p = 0; p < 3; p++)
                                store_v<8>(g.dt, dst3, (first + p * step) * H + h, v);
                    }
                }
            } else {
                float v[BATCH][V], d[DOT ? BATCH : 1][V];
#pragma unroll
                for (int u = 0; u < BATCH; u++) {
                    const int64_t h = h0 + u * 32 * V;
                    if (h < H) {
                        load_v<V>(g.dt, src, tok * H + h, v[u]);
                        if (DOT)
                            load_v<V>(g.dt, g.ckpt_d_in, pos * H + h, d[DOT ? u : 0]);
                    }
                }
#pragma unroll
                for (int u = 0; u < BATCH; u++) {
                    const int64_t h = h0 + u * 32 * V;
                    if (h < H) {
#pragma unroll
                        for (int c = 0; c < V; c++) {
                            if (DOT)
                                sum = fmaf(v[u][c], d[DOT ? u : 0][c], sum);
                            if (SCALE)
                                v[u][c] = a * v[u][c];
                        }
                        if (dst != nullptr)
                            store_v<V>(g.dt, dst, r * H + h, v[u]);
                        if (dst3 != nullptr)
                            for (int p = 0; p < 3; p++)
                                store_v<V>(g.dt, dst3, (first + p * step) * H + h, v[u]);
                    }
                }
            }
        }
        if (DOT) {
            for (int off = 16; off > 0; off /= 2)
                sum += __shfl_xor_sync(0xffffffffu, sum, off);
            if (lane == 0)
                g.da[pos] = sum;
        }
    };
    if constexpr (DOT) { // by row
        const int64_t R = rows_total(g);
        for (int64_t r = warp; r < R; r += warps) {
            const int64_t pos = g.row_pos[r], tok = g.ids[pos];
            const int64_t e = SCALE || dst3 != nullptr ? g.b2e[pos / g.B] : 0;
            gather_row(r, pos, tok, e, SCALE ? load_as_float(g.dt, g.aff, tok * g.E + e) : 1.0f);
        }
    } else { // by token
        for (int64_t tok = warp; tok < g.T; tok += warps)
            for (int64_t j = 0; j < g.tok_count[tok]; j++) {
                const int64_t r = g.tok_list[tok * g.E + j];
                const int64_t e = SCALE || dst3 != nullptr ? g.tok_expert[tok * g.E + j] : 0;
                gather_row(r, g.row_pos[r], tok, e, SCALE ? load_as_float(g.dt, g.aff, tok * g.E + e) : 1.0f);
            }
    }
}

// gather_rows_kernel, with the affinity gradient's dot product when `dot` (the down checkpoint given).
// Needs the token lists (launch_token_lists).
template <int V, bool SCALE, bool DOT>
void launch_gather(const MlpArgs &g, const void *src, void *dst, void *dst3, cudaStream_t stream)
{
    // copy 8, scaled or with the dot MOE_GATHER_BATCH (2: <= 64 registers)
    constexpr int batch = V == 1 ? 4 : !SCALE && !DOT ? 8 : MOE_GATHER_BATCH;
    const auto kernel = gather_rows_kernel<V, batch, SCALE, DOT>;
    unsigned grid = resident_grid(kernel, 256, cdiv((DOT ? g.positions : g.T) * 32, 256));
    // The plain 16-bit copy runs at most MOE_GATHER_COPY_CTAS CTAs per SM (0: as many as fit, 4).  Fewer
    // rows in flight were faster: ncu on an H200, the X gather at Qwen3-30B-A3B T = 16384 and at gpt-oss-120b
    // T = 4096 ran fastest at 2 CTAs per SM, of 2, 3 and 4 (bench/RESULTS.md, "the copy gather at 2 CTAs per SM").
    if (V == 8 && !SCALE && !DOT && MOE_GATHER_COPY_CTAS > 0) {
        const int64_t cap = (int64_t)MOE_GATHER_COPY_CTAS * sm_count();
        if ((int64_t)grid > cap)
            grid = (unsigned)cap;
    }
    kernel<<<grid, 256, 0, stream>>>(g, src, dst, dst3);
}

template <int V>
void launch_gather_v(const MlpArgs &g, const void *src, void *dst, void *dst3, bool scale, bool dot, cudaStream_t stream)
{
    if (dot)
        scale ? launch_gather<V, true, true>(g, src, dst, dst3, stream) : launch_gather<V, false, true>(g, src, dst, dst3, stream);
    else
        scale ? launch_gather<V, true, false>(g, src, dst, dst3, stream)
              : launch_gather<V, false, false>(g, src, dst, dst3, stream);
}

} // namespace

// dst (rows, or NULL) and dst3 (term rows, or NULL: split backward) from src's token rows; see gather_rows_kernel.
moe_status gather_rows(const MlpArgs &g, const void *src, void *dst, void *dst3, bool scale, bool dot, cudaStream_t stream)
{
    if (g.positions > 0 && g.H > 0 && g.T > 0) {
        if (g.dt != MOE_F32 && g.H % 8 == 0 && aligned16(src) && aligned16(dst) && aligned16(dst3) &&
            (!dot || aligned16(g.ckpt_d_in)))
            launch_gather_v<8>(g, src, dst, dst3, scale, dot, stream);
        else
            launch_gather_v<1>(g, src, dst, dst3, scale, dot, stream);
    }
    MOE_CUDA_CHECK(cudaGetLastError());
    return MOE_OK;
}

} // namespace moe_gpu
