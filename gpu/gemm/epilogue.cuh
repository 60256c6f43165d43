// The GEMM's epilogues: an fp32 tile in shared memory -> the op's output (topk weight, accumulate, one
// rounding), element by element (SIMT, the topk-weight gradient) or 8 columns at a time (tensor-core families).
#ifndef LIBMOE_GPU_GEMM_EPILOGUE_CUH
#define LIBMOE_GPU_GEMM_EPILOGUE_CUH

#include "common/dtype.cuh"
#include "gemm/args.cuh"

namespace moe_gpu {

// ------------------------------------------------------------------------------------------------
// Epilogue: one fp32 tile in shared memory -> the op's output, in the order of moe_ref.h
// (v = acc; v = w * v; v = old + v; round once).
// ------------------------------------------------------------------------------------------------
// One output element (i, j) of a tile with its fp32 accumulator value: applies the topk weight and
// accumulate and rounds once, into the op's output (or the fp32 reduction workspace).
__device__ __forceinline__ void store_output(const GemmArgs &g, const TileCoord &t, int64_t gi, int64_t gj, float v)
{
    if (gi >= t.rows || gj >= g.cols_j)
        return;
    int64_t out_index;
    if (g.op == OP_DW) {
        out_index = (t.e * g.N + gi) * g.K + gj;
    } else {
        const int64_t r = g.ws.offsets[t.e] + gi;
        if (g.weights)
            v = topk_weight(g, r) * v;
        if (g.op == OP_FWD) {
            out_index = y_row(g, r) * g.N + gj;
        } else { // dX: expert order, or slot order under permute_x or into the reduce workspace
            const int64_t row = (g.permute_x || g.out_is_workspace) ? slot_of(g, r) : r;
            out_index = row * g.K + gj;
        }
    }
    if (g.out_is_workspace) {
        static_cast<float *>(g.out)[out_index] = v;
        return;
    }
    if (g.accumulate)
        v = load_as_float(g.out_dtype, g.out, out_index) + v;
    store_from_float(g.out_dtype, g.out, out_index, v);
}

// Vectorised epilogue for the tensor-core families: the fp32 tile is in shared memory (row stride
// LDC floats); per-row facts are computed once per tile into `row_out` / `row_weight` (shared), then
// each thread writes 8 consecutive columns of a row with one 16-byte store (two for fp32 outputs).
// Needs cols_j % 8 == 0 and a 16-byte aligned output (tensor_core_ok checks both); load8 / store8 are
// in common/dtype.cuh.
//
// Finishes 8 consecutive outputs at `index` of g.out (element type out_dtype) from their fp32 values v:
// v = w * v (when weighted), v = old + v (accumulate, not into a workspace), one rounding, 16-byte store.
__device__ __forceinline__ void finish8(const GemmArgs &g, float *v, bool weighted, float w, moe_dtype out_dtype,
                                        int64_t index)
{
    if (weighted) {
#pragma unroll
        for (int u = 0; u < 8; u++)
            v[u] = w * v[u];
    }
    if (g.accumulate && !g.out_is_workspace) {
        float old[8];
        load8(out_dtype, g.out, index, old);
#pragma unroll
        for (int u = 0; u < 8; u++)
            v[u] = old[u] + v[u];
    }
    store8(out_dtype, g.out, index, v, !(g.sm90_skip & 8));
}

template <int BM, int BN, int LDC>
__device__ void epilogue_vectorised(const GemmArgs &g, const TileCoord &t, const float *tile_c, int64_t *row_out,
                                    float *row_weight)
{
    static_assert(LDC % 4 == 0, "float4 reads of the tile's rows");
    const int64_t ld = g.op == OP_FWD ? g.N : g.K;
    for (int i = threadIdx.x; i < BM; i += blockDim.x) {
        const int64_t gi = t.i0 + i;
        if (gi >= t.rows) {
            row_out[i] = -1;
            continue;
        }
        if (g.op == OP_DW) {
            row_out[i] = t.e * g.N + gi;
            row_weight[i] = 1.0f;
            continue;
        }
        const int64_t r = g.ws.offsets[t.e] + gi;
        row_out[i] = g.op == OP_FWD ? y_row(g, r) : (g.permute_x || g.out_is_workspace) ? slot_of(g, r) : r;
        row_weight[i] = g.weights ? topk_weight(g, r) : 1.0f;
    }
    __syncthreads();
    const moe_dtype out_dtype = g.out_is_workspace ? MOE_F32 : g.out_dtype;
    for (int c = threadIdx.x; c < BM * (BN / 8); c += blockDim.x) {
        const int i = c / (BN / 8), j = (c % (BN / 8)) * 8;
        const int64_t out_row = row_out[i], gj = t.j0 + j;
        if (out_row < 0 || gj >= g.cols_j)
            continue;
        // two 16-byte reads (j is a multiple of 8, rows start 16-byte aligned)
        const float4 lo = *reinterpret_cast<const float4 *>(tile_c + i * LDC + j);
        const float4 hi = *reinterpret_cast<const float4 *>(tile_c + i * LDC + j + 4);
        float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
        finish8(g, v, g.weights && g.op != OP_DW, row_weight[i], out_dtype, out_row * ld + gj);
    }
}

template <int BM, int BN, int LDC>
__device__ void epilogue(const GemmArgs &g, const TileCoord &t, const float *tile_c)
{
    const int64_t base = g.op == OP_DW ? 0 : g.ws.offsets[t.e];
    if (g.op == OP_TOPK_GRAD) {
        // partial[slot][tile column] = sum_j dY[yrow(r)][j] * y[r][j] over this tile's columns, ascending j
        for (int i = threadIdx.x; i < BM; i += blockDim.x) {
            if (t.i0 + i >= t.rows)
                continue;
            const int64_t r = base + t.i0 + i;
            const int64_t dyr = y_row(g, r);
            float acc = 0.0f;
            for (int j = 0; j < BN && t.j0 + j < g.cols_j; j++)
                acc += load_as_float(g.dtype, g.dy, dyr * g.N + t.j0 + j) * tile_c[i * LDC + j];
            static_cast<float *>(g.out)[slot_of(g, r) * g.partial_stride + t.j0 / BN] = acc;
        }
        return;
    }
    for (int idx = threadIdx.x; idx < BM * BN; idx += blockDim.x) {
        const int i = idx / BN, j = idx % BN;
        store_output(g, t, t.i0 + i, t.j0 + j, tile_c[i * LDC + j]);
    }
}

} // namespace moe_gpu

#endif
