// CUDA grouped GEMM: forward, dX, dW and the topk-weight gradient (SEMANTICS section 2).
//
// One call = (1) a routing check on the device, (2) one persistent tiled GEMM kernel, (3) for
// reduce_topk and the topk-weight gradient, a fixed-order reduction kernel.  Nothing is synchronised
// with the host; group sizes are read on the device.
//
// The three ops are one GEMM  C[i][j] = sum_q A(i,q) * B(q,j)  per expert with different operand
// layouts ("contiguous" = the dimension adjacent in memory):
//   fwd: i = expert row r, j = n, q = c:   A = X[xrow(r)][c]  (q contiguous), B = W[e][n][c] (q contiguous)
//   dX:  i = expert row r, j = c, q = n:   A = dY[yrow(r)][n] (q contiguous), B = W[e][n][c] (j contiguous)
//   dW:  i = n, j = c, q = expert row r:   A = dY[yrow(r)][n] (i contiguous), B = X[xrow(r)][c] (j contiguous)
// Output tiles are owned by exactly one CTA, which reduces over q in a fixed order: results are bitwise
// reproducible run to run (no float atomics anywhere).
//
// Paths (families): sm90 (gemm_sm90.cuh: Hopper, warp-specialised wgmma kernel fed by TMA and cp.async,
// 128 x 256 tiles; fwd, dX, dW), sm80 (tc_gemm_kernel: mma.sync m16n8k16 with ldmatrix on sm_80+, cp.async
// 4-stage pipeline, 128 x 128 tiles; also the topk-weight gradient), both for bf16/f16 inputs with fp32
// accumulation and N % 8 == 0, K % 8 == 0, 16-byte aligned tensors (dW with fused topk weights: w * dY
// split exactly into two bf16 terms for bf16, both MMA'd, and into two TF32 terms for f16, on the sm80 kernel
// only), and the sm80 family's TF32 kernel (tf32_gemm_kernel: f32 inputs with allow_tf32, every op, fused
// topk weights included, mma.sync m16n8k8); and SIMT (true fp32 FFMA; used for f32 inputs otherwise and
// for shapes the tensor-core paths cannot take).
#include <cuda.h> // CUtensorMap and its enums only; the encoder comes through cudaGetDriverEntryPointByVersion
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cudaTypedefs.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <initializer_list>
#include <type_traits>

#include "act_cuda.cuh"
#include "cp_async_cuda.cuh"
#include "cuda_check.cuh"
#include "dtype_cuda.cuh"
#include "gemm_cuda.cuh"
#include "warp_scan_cuda.cuh"

namespace {

// ------------------------------------------------------------------------------------------------
// Device-side routing check.  Each call owns a small workspace; its `status` word makes the GEMM
// kernels of the same call skip all work (never reading out of bounds); the first error is also
// copied to a sticky record read by moe_backend_synchronize().
// ------------------------------------------------------------------------------------------------
enum DeviceErrorKind : int {
    DEVICE_OK = 0,
    DEVICE_NEGATIVE_SIZE = 1,  // m_sizes[index] = value < 0
    DEVICE_SIZES_SUM = 2,      // sum of m_sizes = value != T*k
    DEVICE_GATHER_RANGE = 3,   // gather_indices[index] = value outside [0, M)
    DEVICE_GATHER_REPEAT = 4,  // gather_indices[index] = value repeats
};

struct DeviceError {
    int kind;
    int op;
    long long index;
    long long value;
};

__device__ DeviceError g_sticky_error;

struct Workspace {
    int64_t *offsets;     // [E+1] expert row offsets
    int64_t *tile_start;  // [E+1] first tile of each expert (row-tiled ops); paired sm90 kernel: first pair unit
    int64_t *lone_start;  // [E+1] first lone tile of each expert (paired sm90 kernel; all 0 otherwise)
    unsigned long long *tile_counter; // tiles taken after the CTAs' first (sm90 dynamic tiles), zeroed as status
    unsigned *seen;       // [M/32+1] permutation bitmap
    int *status;          // this call's status (DeviceErrorKind)
};

__device__ void report(int *status, int op, int kind, long long index, long long value)
{
    if (atomicCAS(status, 0, kind) == 0) {
        if (atomicCAS(&g_sticky_error.kind, 0, kind) == 0) {
            g_sticky_error.op = op;
            g_sticky_error.index = index;
            g_sticky_error.value = value;
        }
    }
}

// The tiles of an expert with m rows, in tile_start units: row tiles of rows_per_tile times col_tiles; for
// the paired sm90 kernel (paired != 0) the pairs of row tiles, the odd last row tile counted in lone_tiles.
__host__ __device__ __forceinline__ int64_t expert_tiles(int64_t m, int64_t rows_per_tile, int64_t col_tiles,
                                                         int paired, int64_t *lone_tiles)
{
    const int64_t row_tiles = (m + rows_per_tile - 1) / rows_per_tile;
    *lone_tiles = paired ? row_tiles % 2 * col_tiles : 0;
    return (paired ? row_tiles / 2 : row_tiles) * col_tiles;
}

// Inclusive prefix sums over the CTA (SIZES_THREADS threads) of three values per thread, in thread order;
// `totals` is shared scratch of 3 * 32 values.  Every thread of the CTA calls it (it synchronises).
constexpr int SIZES_THREADS = 1024;
__device__ __forceinline__ void block_inclusive_scan3(int64_t v[3], int64_t *totals)
{
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int c = 0; c < 3; c++)
        v[c] = warp_inclusive_sum(v[c]);
    if (lane == 31)
        for (int c = 0; c < 3; c++)
            totals[c * 32 + warp] = v[c];
    __syncthreads();
    if (warp == 0)
        for (int c = 0; c < 3; c++)
            totals[c * 32 + lane] = warp_inclusive_sum(totals[c * 32 + lane]); // inclusive over warps
    __syncthreads();
    if (warp > 0)
        for (int c = 0; c < 3; c++)
            v[c] += totals[c * 32 + warp - 1];
    __syncthreads(); // totals free for the next call
}

// One CTA of SIZES_THREADS threads, the first kernel of a call: zeroes the call's status word and the
// permutation bitmap (`seen_words` words, check_gather_kernel's; 0 without gather indices), then computes
// the prefix sums of m_sizes (offsets), the tile starts and the paired
// kernel's lone-tile starts, SIZES_THREADS experts per round (each thread loads its expert's size up
// front, then block scans).  The first expert e, in expert order, whose size is negative or whose
// prefix sum passes M is reported (as a sequential walk would; later experts are not looked at), else
// a total other than M.  Sizes are clipped to M + 1 inside the sums, so that they cannot overflow; a
// clipped size is an error at that expert or before it.  (This was one thread walking the experts, each
// iteration waiting for its size load, several times slower under ncu; bench/RESULTS.md,
// "the routing size check as one CTA of block scans".)
__global__ void __launch_bounds__(SIZES_THREADS) check_sizes_kernel(const int64_t *m_sizes, int64_t E, int64_t M,
                                                                  int64_t tiles_per_row_tile, int64_t rows_per_tile,
                                                                  int paired, int64_t seen_words, Workspace ws, int op)
{
    __shared__ int64_t totals[3 * 32];
    __shared__ int64_t first_bad; // smallest bad expert of the round, E when none
    if (blockIdx.x != 0)
        return;
    for (int64_t i = threadIdx.x; i < seen_words; i += SIZES_THREADS)
        ws.seen[i] = 0;
    if (threadIdx.x == 0)
        *ws.status = 0, *ws.tile_counter = 0, ws.offsets[0] = 0, ws.tile_start[0] = 0, ws.lone_start[0] = 0;
    int64_t carried[3] = {0, 0, 0}; // rows, tiles, lone tiles of the experts of earlier rounds
    for (int64_t e0 = 0; e0 < E; e0 += SIZES_THREADS) {
        const int64_t e = e0 + threadIdx.x;
        const int64_t m = e < E ? m_sizes[e] : 0;
        const int64_t clipped = m < 0 ? 0 : m > M ? M + 1 : m;
        int64_t lone = 0;
        const int64_t tiles = e < E && m >= 0 && m <= M ? expert_tiles(m, rows_per_tile, tiles_per_row_tile, paired, &lone) : 0;
        int64_t v[3] = {clipped, tiles, lone};
        if (threadIdx.x == 0)
            first_bad = E;
        block_inclusive_scan3(v, totals); // (its barriers also order first_bad's reset before the atomicMin)
        const int64_t rows_before = carried[0] + v[0] - clipped, rows_through = carried[0] + v[0];
        const bool bad = e < E && (m < 0 || rows_through > M);
        if (bad)
            atomicMin(reinterpret_cast<unsigned long long *>(&first_bad), (unsigned long long)e);
        __syncthreads();
        const int64_t stop = first_bad;
        if (e < E && e < stop) {
            ws.offsets[e + 1] = rows_through;
            ws.tile_start[e + 1] = carried[1] + v[1];
            ws.lone_start[e + 1] = carried[2] + v[2];
        }
        if (e == stop && stop < E) { // the sequential walk's message: the negative size, or the prefix sum it reached
            if (m < 0)
                report(ws.status, op, DEVICE_NEGATIVE_SIZE, e, m);
            else
                report(ws.status, op, DEVICE_SIZES_SUM, e, (long long)((unsigned long long)rows_before + (unsigned long long)m));
        }
        if (stop < E)
            return;
        // every thread takes the round's totals from the round's last thread
        __shared__ int64_t round_total[3];
        if (threadIdx.x == SIZES_THREADS - 1)
            for (int c = 0; c < 3; c++)
                round_total[c] = v[c];
        __syncthreads();
        for (int c = 0; c < 3; c++)
            carried[c] += round_total[c];
        __syncthreads();
    }
    if (threadIdx.x == 0 && carried[0] != M)
        report(ws.status, op, DEVICE_SIZES_SUM, E, carried[0]);
}

__global__ void check_gather_kernel(const int64_t *gather, int64_t M, Workspace ws, int op)
{
    for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < M; r += (int64_t)gridDim.x * blockDim.x) {
        int64_t s = gather[r];
        if (s < 0 || s >= M) {
            report(ws.status, op, DEVICE_GATHER_RANGE, r, s);
            continue;
        }
        unsigned bit = 1u << (s & 31);
        if (atomicOr(&ws.seen[s >> 5], bit) & bit)
            report(ws.status, op, DEVICE_GATHER_REPEAT, r, s);
    }
}

// ------------------------------------------------------------------------------------------------
// The problem as the kernels see it
// ------------------------------------------------------------------------------------------------
enum GemmOp : int { OP_FWD = 0, OP_DX = 1, OP_DW = 2, OP_TOPK_GRAD = 3 };

struct GemmArgs {
    int op;
    moe_dtype dtype;       // inputs
    moe_dtype out_dtype;   // output (dW / topk grad may be f32)
    int64_t T, k, E, M, N, K;
    int64_t rows_i, cols_j; // output tile space per expert: (rows_i = m_e or N) x cols_j
    const int64_t *gather;  // may be NULL
    int permute_x, permute_y, accumulate;
    const void *a;          // X (fwd, topk grad) or dY (dx, dw)
    const void *b;          // W (fwd, dx, topk grad) or X (dw)
    const void *weights;    // topk weights or NULL
    const void *dy;         // topk grad: dY
    void *out;              // Y, dX, dW, or an fp32 workspace
    int out_is_workspace;   // reduce_topk (fp32 [M][K] slot order) or topk grad partials
    int64_t partial_stride; // topk grad: partials per slot (number of j tiles)
    int tma_rows;           // sm90: the row operands are contiguous and come by TMA (see gemm_sm90.cuh)
    int tma_out;            // sm90: the output is written by TMA stores (overwritten, rows in tile order)
    int tma_out_wide;       // sm90, dW with a 16-bit output and tma_out: maps.out_wide (64-row boxes) encoded
    int dynamic_tiles;      // sm90_gemm_kernel without clusters, with tma_rows: later tiles from ws.tile_counter
    int full_blocks;        // sm90_gemm_kernel without clusters, fwd / dX, and the fused gate/up kernel (set for
                            // every call there): every m64 block issues its MMAs, also one past the expert's
                            // rows (never stored), so that all tiles take as long
    int sm90_skip;          // timing experiments only (MOE_SM90_SKIP): 1 stores, 2 MMAs, 4 loads (results wrong);
                            // 8 plain instead of streaming stores, 16 no L2 evict_last hint on W (results right);
                            // 32 the race probe of sm90_gemm_kernel (tests: a warpgroup late; results right);
                            // the fused gate/up kernels: 64 no epilogue, 128 no activation (results wrong)
    Workspace ws;
};

__device__ __forceinline__ int64_t slot_of(const GemmArgs &g, int64_t r) { return g.gather ? g.gather[r] : r; }
__device__ __forceinline__ int64_t x_row(const GemmArgs &g, int64_t r)
{
    return g.permute_x ? slot_of(g, r) / g.k : r;
}
__device__ __forceinline__ int64_t y_row(const GemmArgs &g, int64_t r) { return g.permute_y ? slot_of(g, r) : r; }
// The fused topk weight of expert-order row r (g.weights set), as fp32.
__device__ __forceinline__ float topk_weight(const GemmArgs &g, int64_t r)
{
    return load_as_float(g.dtype, g.weights, slot_of(g, r));
}

// Tile -> (expert, tile row, tile col).  Row-tiled ops (fwd, dx, topk grad) tile each expert's rows;
// dW tiles N x K for every expert.  Within an expert, consecutive tiles walk down the rows first, so
// CTAs running together share the same weight columns in L2.  dW walks the shorter of its two output
// dimensions first: a tile (n block, c block) reads its expert's rows of the two operands, a (m_e x N, the
// n side) and b (m_e x K); CTAs running together share one block of the dimension walked second, and each
// pass over it reads all of the other side's operand again, so the side that is read again should be the
// smaller (Mixtral-8x7B gate_up dW, N = 28672, K = 4096: n blocks first re-read its 59 MB of dY per expert,
// more than L2, for each of the 16 column blocks; column blocks first is faster there, and the shapes with
// N < K lose as much the other way; bench/RESULTS.md, "dW tile order, the shorter output dimension first").
struct TileCoord {
    int64_t e, i0, j0, rows; // rows: valid extent of i for this expert
};

// The row of A (fwd and the topk-weight gradient: X's, dX: dY's) that feeds row gi of row-tiled tile t, -1
// past the expert's rows.  dx: the op is dX.
__device__ __forceinline__ int64_t a_source_row(const GemmArgs &g, const TileCoord &t, int64_t gi, bool dx)
{
    if (gi >= t.rows)
        return -1;
    const int64_t r = g.ws.offsets[t.e] + gi;
    return dx ? y_row(g, r) : x_row(g, r);
}

// The expert whose range of a prefix-sum table holds x: the last e in [0, E) with starts[e] <= x (experts
// without tiles have starts[e] == starts[e + 1] and are skipped over).
__device__ __forceinline__ int64_t expert_of(const int64_t *starts, int64_t E, int64_t x)
{
    int64_t lo = 0, hi = E - 1;
    while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if (starts[mid] <= x)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

__device__ __forceinline__ TileCoord tile_coord(const GemmArgs &g, int64_t tile, int BM, int BN)
{
    TileCoord t;
    const int64_t col_tiles = (g.cols_j + BN - 1) / BN;
    if (g.op == OP_DW) {
        const int64_t row_tiles = (g.N + BM - 1) / BM;
        t.e = tile / (row_tiles * col_tiles);
        int64_t local = tile % (row_tiles * col_tiles);
        if (g.cols_j < g.N) { // column blocks first: the b side (m_e x K) is read again
            t.i0 = (local / col_tiles) * BM;
            t.j0 = (local % col_tiles) * BN;
        } else { // n blocks first: the a side (m_e x N) is read again
            t.i0 = (local % row_tiles) * BM;
            t.j0 = (local / row_tiles) * BN;
        }
        t.rows = g.N;
        return t;
    }
    t.e = expert_of(g.ws.tile_start, g.E, tile);
    const int64_t m = g.ws.offsets[t.e + 1] - g.ws.offsets[t.e];
    const int64_t row_tiles = (m + BM - 1) / BM;
    int64_t local = tile - g.ws.tile_start[t.e];
    t.i0 = (local % row_tiles) * BM;
    t.j0 = (local / row_tiles) * BN;
    t.rows = m;
    return t;
}

// The paired sm90 kernel (gemm_sm90.cuh: clusters of two CTAs), unit -> the tile of the CTA of cluster rank
// `rank`.  Units [0, tile_start[E]) are pairs of row tiles of one expert: rank r takes row tile 2p + r, and
// the cluster loads the W block both read once, by multicast (*multicast = true).  The units after them pair
// two lone tiles (an expert's odd last row tile, usually short), one per CTA, of different experts, each
// loading its own W block.  rows = 0: no tile (the last unit's rank 1 when the lone tiles are odd in number).
__device__ __forceinline__ __attribute__((unused)) TileCoord pair_unit_coord(const GemmArgs &g, int64_t unit, int rank, int BM, int BN,
                                                     bool *multicast)
{
    TileCoord t = {0, 0, 0, 0};
    const int64_t col_tiles = (g.cols_j + BN - 1) / BN;
    const int64_t pair_units = g.ws.tile_start[g.E];
    *multicast = unit < pair_units;
    if (unit < pair_units) {
        t.e = expert_of(g.ws.tile_start, g.E, unit);
        t.rows = g.ws.offsets[t.e + 1] - g.ws.offsets[t.e];
        const int64_t pairs = (t.rows + BM - 1) / BM / 2, local = unit - g.ws.tile_start[t.e];
        t.i0 = (local % pairs) * 2 * BM + rank * BM;
        t.j0 = (local / pairs) * BN;
        return t;
    }
    const int64_t lone = (unit - pair_units) * 2 + rank;
    if (lone >= g.ws.lone_start[g.E])
        return t;
    t.e = expert_of(g.ws.lone_start, g.E, lone);
    t.rows = g.ws.offsets[t.e + 1] - g.ws.offsets[t.e];
    t.i0 = (t.rows + BM - 1) / BM * BM - BM;
    t.j0 = (lone - g.ws.lone_start[t.e]) % col_tiles * BN;
    return t;
}

// Units of the paired kernel: the pairs, then the lone tiles two at a time.
__device__ __forceinline__ __attribute__((unused)) int64_t total_pair_units(const GemmArgs &g)
{
    return g.ws.tile_start[g.E] + (g.ws.lone_start[g.E] + 1) / 2;
}

__device__ __forceinline__ int64_t total_tiles(const GemmArgs &g, int BM, int BN)
{
    if (g.op == OP_DW)
        return g.E * ((g.N + BM - 1) / BM) * ((g.cols_j + BN - 1) / BN);
    return g.ws.tile_start[g.E];
}

// Reduction length of a tile: K (fwd, topk grad), N (dx), the expert's rows (dw).
__device__ __forceinline__ int64_t reduction_length(const GemmArgs &g, int64_t e)
{
    if (g.op == OP_DX)
        return g.N;
    if (g.op == OP_DW)
        return g.ws.offsets[e + 1] - g.ws.offsets[e];
    return g.K;
}

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
// in dtype_cuda.cuh.
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

// ------------------------------------------------------------------------------------------------
// SIMT fp32 path: 64 x 64 tiles, 256 threads each computing 4 x 4, BK = 16.  A(i, q) and B(q, j) are read
// as floats, 0 outside the tile's valid range:
//   fwd, topk grad: A = X[xrow(r)][q], B = W[e][j][q];  dX: A = dY[yrow(r)][q], B = W[e][q][j];
//   dW: A(n, r) = w(r) * dY[yrow(r)][n] (the weight multiply in fp32), B = X[xrow(r)][j].
// The rows are looked up once, not per element (under permute_x a lookup divides): per tile for the
// expert rows of fwd, dX and the topk grad (a_rows), per k-step for dW's rows (q_rows, q_weight).
// ------------------------------------------------------------------------------------------------
constexpr int SIMT_BM = 64, SIMT_BN = 64, SIMT_BK = 16, SIMT_THREADS = 256;

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

// ------------------------------------------------------------------------------------------------
// Tensor-core path for sm_80+ (Ampere, Ada, and Hopper when the sm90 family cannot take a call):
// 128 x 128 tiles, BK = 32, 4 warps (2 x 2), each warp 64 x 64 = 4 x 8 mma.sync.m16n8k16 tiles (fp32
// accumulators), operands from shared memory by ldmatrix (.trans for the operands whose tile dimension,
// not q, is contiguous), a 4-stage cp.async pipeline; two CTAs per SM (2 x 69.5 KiB of shared memory on sm_80
// and sm_90), so one's epilogue overlaps the other's MMAs.  Shared-memory tiles, 16-byte chunks XOR-swizzled
// so that the eight row addresses of an ldmatrix phase hit eight distinct bank groups (and cp.async writes
// stay conflict-free):
//   q-contiguous [128][32] (A of fwd and dX, B of fwd):   (row, chunk c) at row * 64 + (c ^ ((row >> 1) & 3)) * 16
//   i/j-contiguous [32][128] (A of dW, B of dX and dW):   (q, chunk c)   at q * 256 + (c ^ (q & 7)) * 16
// (bytes; 4 chunks of 8 elements per q-contiguous row, 16 per i/j-contiguous row).  After the reduction the
// accumulators go through an fp32 tile in shared memory (the pipeline's bytes) to the shared epilogues.
//
// bf16 dW with fused topk weights (WEIGHTED): A(n, r) = w(r) * dY[yrow(r)][n] is a product of two bf16
// values, exact in fp32 with a 16-bit significand, but not a bf16 value.  Each A fragment element is
// multiplied by its row's weight in registers and split exactly into two bf16 terms, hi = p truncated to
// bf16 (round toward zero: same sign as p, never overflows) and lo = p - hi (at most 8 significant bits, so
// exact in bf16), and every k16 step runs the MMAs twice, on hi and on lo: the sum is fl32(w * dY) times X,
// twice the MMAs, each product entering the accumulator as two terms whose magnitudes add up to its own
// (specs/DECISIONS.md, "Weighted dW on tensor cores", for the bound).  f16 dW with fused topk weights
// (WEIGHTED, T = __half) splits p into two TF32 terms instead (split_weighted_pair_tf32) and runs each k16
// half-step as two m16n8k8 TF32 MMAs per term, X's f16 fragments converted to TF32 in registers.  The weights
// of a stage's 32 rows sit in shared memory past the pipeline's bytes (the C tile's tail, free until the
// epilogue).
// ------------------------------------------------------------------------------------------------
constexpr int TC_BM = 128, TC_BN = 128, TC_BK = 32, TC_STAGES = 4, TC_THREADS = 128;
constexpr int TC_TILE_ELEMS = TC_BM * TC_BK; // one operand's stage: 8 KiB either layout
constexpr int TC_LDC = TC_BN + 8; // 8 mod 32 banks: a half-warp's float2 accumulator stores hit 32 distinct banks
constexpr size_t TC_PIPE_BYTES = (size_t)TC_STAGES * 2 * TC_TILE_ELEMS * 2;
constexpr size_t TC_C_BYTES = (size_t)TC_BM * TC_LDC * 4;
constexpr size_t TC_SMEM_BYTES = (TC_PIPE_BYTES > TC_C_BYTES ? TC_PIPE_BYTES : TC_C_BYTES) + TC_BM * 12;
static_assert(TC_BM == TC_BN && TC_BK == 32, "the swizzles and the load loops assume 128 x 128 x 32");
static_assert(TC_PIPE_BYTES + TC_STAGES * TC_BK * 4 <= TC_C_BYTES, "weighted dW: the stages' weights after the pipeline");

// Element offsets of 16-byte chunk c in the two swizzled tile layouts above.
__device__ __forceinline__ int tc_qc_offset(int row, int c) { return row * TC_BK + ((c ^ ((row >> 1) & 3)) << 3); }
__device__ __forceinline__ int tc_ic_offset(int q, int c) { return q * TC_BM + ((c ^ (q & 7)) << 3); }

// Four 8 x 8 matrices of 16-bit elements from shared memory (this lane supplies one row address).
template <bool TRANS>
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], uint32_t addr)
{
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(addr));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(addr));
}

// d += a * b for one m16n8k16 tile (row-major A fragment, column-major B fragment, fp32 accumulators).
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float d[4], const uint32_t a[4], const uint32_t b[2])
{
    if (std::is_same<T, __half>::value)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// d += a * b for one m16n8k8 tile of TF32 operands (row-major A, column-major B, fp32 accumulators).
__device__ __forceinline__ void mma_m16n8k8_tf32(float d[4], const uint32_t a[4], const uint32_t b[2])
{
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Weighted bf16 dW: the bf16 pair a (element k in the low half, k + 1 in the high half) times the fp32 weights
// w0 (of k) and w1 (of k + 1) -> hi + lo exactly, each a bf16 pair (see the section comment).  p = w * a is
// exact (a product of two bf16 values); hi keeps p's upper 16 bits (truncation = round toward zero), the rest
// lo = p - hi is exact and has at most 8 significant bits, so its lower 16 bits are zero too.  An infinite p
// stays in hi (lo = 0, not inf - inf); a NaN p makes lo NaN (hi may truncate to an infinity), so the sum is
// NaN.  Exact for |p| >= 2^-118; below, lo is an fp32 subnormal whose bits under bf16's smallest subnormal
// are dropped (less than 2^-133 per product).
__device__ __forceinline__ void split_weighted_pair(uint32_t a, float w0, float w1, uint32_t &hi, uint32_t &lo)
{
    const float p0 = __uint_as_float(a << 16) * w0, p1 = __uint_as_float(a & 0xffff0000u) * w1;
    const float h0 = truncate_to_bf16(p0), h1 = truncate_to_bf16(p1);
    const float r0 = fabsf(p0) == INFINITY ? 0.0f : p0 - h0, r1 = fabsf(p1) == INFINITY ? 0.0f : p1 - h1;
    hi = __byte_perm(__float_as_uint(p0), __float_as_uint(p1), 0x7632); // upper halves: (p1, p0)
    lo = __byte_perm(__float_as_uint(r0), __float_as_uint(r1), 0x7632);
}

// Weighted f16 dW: the f16 pair a (element k low, k + 1 high) times the weights w0, w1 -> TF32 words hi + lo
// exactly, element by element (hi0, lo0 of k; hi1, lo1 of k + 1).  p = w * a is a product of two f16 values:
// at most 22 significant bits and |p| >= 2^-48, so exact in fp32, never subnormal and finite unless a is.  hi
// keeps p's sign, exponent and upper 10 fraction bits (truncation toward zero: TF32's 11 significant bits, the
// lower 13 bits zero); lo = p - hi is exact, has at most 22 - 11 significant bits and is a normal fp32 value,
// so it is a TF32 value as well.  An infinite p stays in hi (lo = 0); a NaN p makes lo NaN.  Unlike the bf16
// split there is no range limit: hi * x and lo * x (x an f16 value, exact in TF32) are exact in fp32.
__device__ __forceinline__ void split_weighted_pair_tf32(uint32_t a, float w0, float w1, uint32_t &hi0,
                                                         uint32_t &lo0, uint32_t &hi1, uint32_t &lo1)
{
    const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&a));
    const float p0 = f.x * w0, p1 = f.y * w1;
    hi0 = __float_as_uint(p0) & 0xffffe000u, hi1 = __float_as_uint(p1) & 0xffffe000u;
    lo0 = __float_as_uint(fabsf(p0) == INFINITY ? 0.0f : p0 - __uint_as_float(hi0));
    lo1 = __float_as_uint(fabsf(p1) == INFINITY ? 0.0f : p1 - __uint_as_float(hi1));
}

// One k-step's operands into stage (sa, sb): A 128 x 32 and B 32 x 128, 512 chunks each, 4 per thread;
// chunks past the expert's rows, past N / K or past the reduction are zero-filled (never read from memory).
// All threads of the CTA call it (dW's row lookups are shared by warp shuffles).  WEIGHTED (dW): also the
// stage's 32 topk weights into q_weight (0 past the reduction), by plain shared-memory stores that the same
// barriers as the stage's tiles order.
template <typename T, int OP, bool WEIGHTED>
__device__ __forceinline__ void tc_load_stage(const GemmArgs &g, const TileCoord &t, int64_t q0, int64_t qlen,
                                              T *sa, T *sb, const int64_t *a_rows, float *q_weight)
{
    const T *A = static_cast<const T *>(g.a);
    const T *B = static_cast<const T *>(g.b);
    if constexpr (OP == OP_DW) {
        // Both operands [q][i] / [q][j]: thread tid copies chunk tid % 16 of rows q = tid / 16 + 8u (u < 4) of
        // both, the rows of dY and X of the expert's row q0 + q.  Those are 8 distinct rows per warp (u, and
        // h = lane / 16): lane 2u + h (< 8) looks them up once (under permute_x with a 64-bit division) and
        // the other lanes take them by shuffle, instead of every chunk repeating the lookup.
        const int lane = threadIdx.x % 32, ic = lane & 15;
        const int64_t base = g.ws.offsets[t.e];
        const int my_q = (threadIdx.x >> 5) * 2 + (lane & 1) + 8 * (lane >> 1); // lanes < 8: q of (u, h) = (lane / 2, lane % 2)
        int64_t my_y = 0, my_x = 0;
        if (lane < 8 && q0 + my_q < qlen) {
            my_y = y_row(g, base + q0 + my_q);
            my_x = x_row(g, base + q0 + my_q);
        }
        if (WEIGHTED && lane < 8)
            q_weight[my_q] = q0 + my_q < qlen ? topk_weight(g, base + q0 + my_q) : 0.0f;
        const bool a_col_ok = t.i0 + ic * 8 < g.N, b_col_ok = t.j0 + ic * 8 < g.cols_j;
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int q = (threadIdx.x >> 4) + 8 * u, from = 2 * u + (lane >> 4);
            const int64_t y = __shfl_sync(0xffffffffu, my_y, from), x = __shfl_sync(0xffffffffu, my_x, from);
            const bool q_ok = q0 + q < qlen, a_ok = q_ok && a_col_ok, b_ok = q_ok && b_col_ok;
            cp_async16(sa + tc_ic_offset(q, ic), a_ok ? A + y * g.N + t.i0 + ic * 8 : A, a_ok);
            cp_async16(sb + tc_ic_offset(q, ic), b_ok ? B + x * g.K + t.j0 + ic * 8 : B, b_ok);
        }
    } else {
#pragma unroll
        for (int u = 0; u < TC_BM * TC_BK / 8 / TC_THREADS; u++) { // A [row i][q]: row c / 4, chunk c % 4
            const int c = threadIdx.x + u * TC_THREADS, i = c >> 2, kc = c & 3;
            const bool ok = a_rows[i] >= 0 && q0 + kc * 8 < qlen;
            const int64_t lda = OP == OP_DX ? g.N : g.K;
            cp_async16(sa + tc_qc_offset(i, kc), ok ? A + a_rows[i] * lda + q0 + kc * 8 : A, ok);
        }
#pragma unroll
        for (int u = 0; u < TC_BN * TC_BK / 8 / TC_THREADS; u++) {
            const int c = threadIdx.x + u * TC_THREADS;
            if (OP == OP_FWD || OP == OP_TOPK_GRAD) { // B [n][q]: W[e] rows
                const int j = c >> 2, kc = c & 3;
                const bool ok = t.j0 + j < g.cols_j && q0 + kc * 8 < qlen;
                cp_async16(sb + tc_qc_offset(j, kc), ok ? B + (t.e * g.N + t.j0 + j) * g.K + q0 + kc * 8 : B, ok);
            } else { // dX: B [q][j] = W[e][q][j]
                const int q = c >> 4, jc = c & 15;
                const bool ok = q0 + q < qlen && t.j0 + jc * 8 < g.cols_j;
                cp_async16(sb + tc_ic_offset(q, jc), ok ? B + (t.e * g.N + q0 + q) * g.K + t.j0 + jc * 8 : B, ok);
            }
        }
    }
}

// Shared by tc_gemm_kernel and tf32_gemm_kernel (the same tiles, warps and accumulator layout).
// The family's shared memory past the pipeline (which the C tile replaces after a tile's reduction): the
// per-row facts of a tile.
struct TcRowFacts {
    int64_t *a_rows;   // [TC_BM] A's source rows (fwd, dX, topk grad), then the output rows (epilogue)
    float *row_weight; // [TC_BM] the epilogue's topk weights
};
__device__ __forceinline__ TcRowFacts tc_row_facts(unsigned char *smem)
{
    int64_t *a_rows = reinterpret_cast<int64_t *>(smem + (TC_PIPE_BYTES > TC_C_BYTES ? TC_PIPE_BYTES : TC_C_BYTES));
    return TcRowFacts{a_rows, reinterpret_cast<float *>(a_rows + TC_BM)};
}

// A tile's start: the source rows of A for row-tiled ops (a_rows), zeroed accumulators; returns the length of
// the reduction.
template <int OP>
__device__ __forceinline__ int64_t tc_start_tile(const GemmArgs &g, const TileCoord &t, int64_t *a_rows,
                                                 float (&acc)[4][8][4])
{
    if (OP != OP_DW) {
        for (int i = threadIdx.x; i < TC_BM; i += TC_THREADS)
            a_rows[i] = a_source_row(g, t, t.i0 + i, OP == OP_DX);
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < 4; u++)
#pragma unroll
        for (int v = 0; v < 8; v++)
#pragma unroll
            for (int x = 0; x < 4; x++)
                acc[u][v][x] = 0.0f;
    return reduction_length(g, t.e);
}

// The pipeline's prologue: steps 0 .. TC_STAGES - 2 in flight (load_stage(s) issues step s into its slot, s),
// one cp.async group each, empty past the reduction.
template <typename LoadStage>
__device__ __forceinline__ void tc_prologue(int64_t steps, LoadStage load_stage)
{
#pragma unroll
    for (int s = 0; s < TC_STAGES - 1; s++) {
        if (s < steps)
            load_stage(s);
        cp_async_commit();
    }
}

// A tile's end: once every cp.async landed, the warp's 64 x 64 accumulators (m16n8 tile (u, v): rows
// wi0 + 16u + lane / 4 (+ 8 for x = 2, 3), columns wj0 + 8v + 2 (lane % 4) + {0, 1}) go to the fp32 C tile that
// replaces the pipeline's bytes, and the epilogue writes it out.
template <int OP>
__device__ __forceinline__ void tc_finish_tile(const GemmArgs &g, const TileCoord &t, const float (&acc)[4][8][4],
                                               float *tile_c, const TcRowFacts &facts, int wi0, int wj0)
{
    const int lane = threadIdx.x % 32;
    cp_async_wait<0>();
    __syncthreads(); // the pipeline's bytes become the C tile
#pragma unroll
    for (int u = 0; u < 4; u++)
#pragma unroll
        for (int v = 0; v < 8; v++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float *c = tile_c + (wi0 + 16 * u + lane / 4 + 8 * h) * TC_LDC + wj0 + 8 * v + 2 * (lane % 4);
                *reinterpret_cast<float2 *>(c) = make_float2(acc[u][v][2 * h], acc[u][v][2 * h + 1]);
            }
    __syncthreads();
    if (OP == OP_TOPK_GRAD)
        epilogue<TC_BM, TC_BN, TC_LDC>(g, t, tile_c);
    else
        epilogue_vectorised<TC_BM, TC_BN, TC_LDC>(g, t, tile_c, facts.a_rows, facts.row_weight);
    __syncthreads();
}

template <typename T, int OP, bool WEIGHTED = false>
__global__ void __launch_bounds__(TC_THREADS, 2) tc_gemm_kernel(GemmArgs g)
{
    static_assert(!WEIGHTED || OP == OP_DW, "fused topk weights in the reduction: dW only");
    extern __shared__ __align__(128) unsigned char smem[];
    T *pipe = reinterpret_cast<T *>(smem);
    float *tile_c = reinterpret_cast<float *>(smem);
    float *stage_weights = reinterpret_cast<float *>(smem + TC_PIPE_BYTES); // WEIGHTED: [TC_STAGES][TC_BK]
    const TcRowFacts facts = tc_row_facts(smem);
    int64_t *a_rows = facts.a_rows;
    if (*g.ws.status != 0)
        return;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int wi0 = (warp / 2) * 64, wj0 = (warp % 2) * 64; // this warp's 64 x 64 block of the tile
    constexpr bool A_QC = OP != OP_DW;                      // A q-contiguous (else i-contiguous)
    constexpr bool B_QC = OP == OP_FWD || OP == OP_TOPK_GRAD;
    const uint32_t pipe_addr = (uint32_t)__cvta_generic_to_shared(pipe);
    // This lane's ldmatrix row address in each fragment, as an element offset within a stage's tile, for
    // k16 half kh (0, 1) and m16 block u / n16 pair p (.trans delivers an 8 x 8 block stored as [q][i]
    // with the fragment layout of the [i][q] block, which is what the i/j-contiguous tiles need):
    //   A q-contiguous: matrices (rows 0-7, k 0-7), (8-15, k 0-7), (0-7, k 8-15), (8-15, k 8-15) = a0..a3:
    //     lane l gives row u*16 + (l & 15), chunk 2 kh + (l >> 4).
    //   A i-contiguous (.trans): the same matrices read as [q][i]: q = 16 kh + (l & 7) + 8 (l >> 4), i chunk
    //     (u*16 + 8 ((l >> 3) & 1)) / 8.
    //   B q-contiguous: matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15) = b0, b1
    //     of n8 tile 2p and of 2p + 1: lane l gives n p*16 + (l & 7) + 8 (l >> 4), chunk 2 kh + ((l >> 3) & 1).
    //   B j-contiguous (.trans): q = 16 kh + (l & 7) + 8 ((l >> 3) & 1), j chunk (p*16 + 8 (l >> 4)) / 8.
    auto a_offset = [&](int kh, int u) -> int {
        if (A_QC)
            return tc_qc_offset(wi0 + u * 16 + (lane & 15), 2 * kh + (lane >> 4));
        return tc_ic_offset(16 * kh + (lane & 7) + 8 * (lane >> 4), (wi0 + u * 16) / 8 + ((lane >> 3) & 1));
    };
    auto b_offset = [&](int kh, int p) -> int {
        if (B_QC)
            return tc_qc_offset(wj0 + p * 16 + (lane & 7) + 8 * (lane >> 4), 2 * kh + ((lane >> 3) & 1));
        return tc_ic_offset(16 * kh + (lane & 7) + 8 * ((lane >> 3) & 1), (wj0 + p * 16) / 8 + (lane >> 4));
    };

    const int64_t tiles = total_tiles(g, TC_BM, TC_BN);
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const TileCoord t = tile_coord(g, tile, TC_BM, TC_BN);
        float acc[4][8][4];
        const int64_t qlen = tc_start_tile<OP>(g, t, a_rows, acc);

        const int64_t steps = (qlen + TC_BK - 1) / TC_BK;
        auto load_stage = [&](int64_t step) { // k-step `step` into its ring slot
            const int s = (int)(step % TC_STAGES);
            tc_load_stage<T, OP, WEIGHTED>(g, t, step * TC_BK, qlen, pipe + (2 * s) * TC_TILE_ELEMS,
                                           pipe + (2 * s + 1) * TC_TILE_ELEMS, a_rows, stage_weights + s * TC_BK);
        };
        tc_prologue(steps, load_stage);
        // Fragments are double-buffered in registers: the k16 half kh + 1 (or the next step's first half) is
        // read from shared memory while the MMAs of half kh run, and the wait for the next step's stage sits
        // between the two halves, so the tensor cores have one half's MMAs queued across the barrier.
        uint32_t fa[2][4][4], fb[2][4][4];
        // WEIGHTED: the weights of this lane's four fragment rows q = 16 kh + 2 (lane % 4) + {0, 1} (+ 8)
        float fw[2][4];
        auto load_fragments = [&](int buf, int64_t step, int kh) {
            const int slot = (int)(step % TC_STAGES);
            const uint32_t sa = pipe_addr + (uint32_t)(2 * slot) * TC_TILE_ELEMS * 2;
            const uint32_t sb = sa + TC_TILE_ELEMS * 2;
#pragma unroll
            for (int u = 0; u < 4; u++)
                ldmatrix_x4<!A_QC>(fa[buf][u], sa + 2 * a_offset(kh, u));
#pragma unroll
            for (int p = 0; p < 4; p++)
                ldmatrix_x4<!B_QC>(fb[buf][p], sb + 2 * b_offset(kh, p));
            if (WEIGHTED) {
                const float *w = stage_weights + slot * TC_BK + 16 * kh + 2 * (lane % 4);
                const float2 w01 = *reinterpret_cast<const float2 *>(w), w89 = *reinterpret_cast<const float2 *>(w + 8);
                fw[buf][0] = w01.x, fw[buf][1] = w01.y, fw[buf][2] = w89.x, fw[buf][3] = w89.y;
            }
        };
        auto mma_fragments = [&](int buf) {
            if constexpr (WEIGHTED && std::is_same<T, __half>::value) {
                // f16: w * dY split into TF32 terms, two m16n8k8 TF32 MMAs per k16 half-step s (the k pair
                // 2t, 2t + 1 for s = 0 and 2t + 8, 2t + 9 for s = 1, t = lane % 4).  The reduction order inside
                // an MMA is permuted alike for A and B, as in the TF32 kernel: the lane's k = t is q = 2t + 8s
                // (the low halves of its f16 pairs) and its k = t + 4 is q = 2t + 1 + 8s (the high halves).
                // A (n, q) pairs: fa[u][2s] row g = lane / 4, fa[u][2s + 1] row g + 8; B (q, c): fb's word s.
#pragma unroll
                for (int s = 0; s < 2; s++) {
                    uint32_t b[8][2];
#pragma unroll
                    for (int v = 0; v < 8; v++) {
                        const uint32_t pair = fb[buf][v / 2][2 * (v % 2) + s];
                        const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&pair));
                        b[v][0] = __float_as_uint(f.x), b[v][1] = __float_as_uint(f.y); // f16: exact in TF32
                    }
#pragma unroll
                    for (int u = 0; u < 4; u++) {
                        uint32_t hi[4], lo[4]; // TF32 A fragments: (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4)
                        split_weighted_pair_tf32(fa[buf][u][2 * s], fw[buf][2 * s], fw[buf][2 * s + 1], hi[0], lo[0],
                                                 hi[2], lo[2]);
                        split_weighted_pair_tf32(fa[buf][u][2 * s + 1], fw[buf][2 * s], fw[buf][2 * s + 1], hi[1],
                                                 lo[1], hi[3], lo[3]);
#pragma unroll
                        for (int v = 0; v < 8; v++)
                            mma_m16n8k8_tf32(acc[u][v], hi, b[v]);
#pragma unroll
                        for (int v = 0; v < 8; v++)
                            mma_m16n8k8_tf32(acc[u][v], lo, b[v]);
                    }
                }
            } else {
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    if (WEIGHTED) { // a0, a1: k pair (fw 0, 1); a2, a3: k + 8 (fw 2, 3); the lo MMAs after the hi ones
                        uint32_t hi[4], lo[4];
#pragma unroll
                        for (int x = 0; x < 4; x++)
                            split_weighted_pair(fa[buf][u][x], fw[buf][x & 2], fw[buf][(x & 2) + 1], hi[x], lo[x]);
#pragma unroll
                        for (int v = 0; v < 8; v++)
                            mma_m16n8k16<T>(acc[u][v], hi, &fb[buf][v / 2][2 * (v % 2)]);
#pragma unroll
                        for (int v = 0; v < 8; v++)
                            mma_m16n8k16<T>(acc[u][v], lo, &fb[buf][v / 2][2 * (v % 2)]);
                    } else {
#pragma unroll
                        for (int v = 0; v < 8; v++)
                            mma_m16n8k16<T>(acc[u][v], fa[buf][u], &fb[buf][v / 2][2 * (v % 2)]);
                    }
                }
            }
        };
        static_assert(TC_BK == 32 && TC_STAGES >= 3, "two k16 halves per step; a slot to refill while two are read");
        cp_async_wait<TC_STAGES - 2>();
        __syncthreads(); // step 0's stage is in
        if (steps > 0)
            load_fragments(0, 0, 0);
        for (int64_t step = 0; step < steps; step++) {
            load_fragments(1, step, 1);
            mma_fragments(0);
            // step + 1's stage is in once at most the TC_STAGES - 3 groups committed after it are pending
            cp_async_wait<TC_STAGES - 3>();
            __syncthreads(); // ... and every warp holds its fragments of step - 1's slot, refilled here
            if (step + TC_STAGES - 1 < steps)
                load_stage(step + TC_STAGES - 1);
            cp_async_commit();
            if (step + 1 < steps)
                load_fragments(0, step + 1, 0);
            mma_fragments(1);
        }
        tc_finish_tile<OP>(g, t, acc, tile_c, facts, wi0, wj0);
    }
}

// ------------------------------------------------------------------------------------------------
// TF32 path (f32 inputs with allow_tf32, fwd / dX / dW / topk grad; sm_80+): the sm80 kernel's 128 x 128
// tiles, 4 warps of 64 x 64 and 4 cp.async stages, with BK = 16 floats (the same bytes per stage) and
// mma.sync.m16n8k8 on TF32 operands (each element rounded by cvt.rna.tf32, to nearest: relative error at most
// 2^-11 per operand, which the oracle's TF32 term counts) with fp32 accumulators.  dW with fused topk weights
// (WEIGHTED) rounds fl32(w * dY) to TF32: the weight multiply is one more fp32 rounding, which the oracle
// counts as on every path.  The topk grad runs fwd's tiles and hands them to its fp32 dot with dY (epilogue).
// Operand tiles, in floats (a stage's operand takes TF_TILE_FLOATS, both layouts):
//   q-contiguous [128][16] (A of fwd, dX and topk grad, B of fwd and topk grad): element (row, q) at row * 16 + q,
//     unpadded: a quarter-warp's 16-byte reads cover rows 2r, 2r + 1 = 32 distinct banks;
//   i/j-contiguous [16][128] (A of dW, B of dX and dW): element (q, i) in row q, 4-float chunk (i / 4) ^ (2 ((q / 4) % 4))
//     (tf_ic_offset): a warp's fragment reads (q = 4t + j for t < 4, i = i0 + g for g < 8, i0 a multiple of 8) hit
//     chunks (i0 / 4 + g / 4) ^ 2t, 8 distinct ones, so 32 distinct banks; the cp.async writes stay conflict-free.
// The reduction order inside a 16-wide step is permuted the same way for both operands: lane (g = lane / 4,
// t = lane % 4) of k8 MMA s reads its k = t from q = 4t + 2s and its k = t + 4 from q = 4t + 2s + 1, so that
// one 16-byte read of a q-contiguous row (q = 4t .. 4t + 3) gives the lane its elements of both MMAs.
// ------------------------------------------------------------------------------------------------
constexpr int TF_BK = 16;
constexpr int TF_TILE_FLOATS = TF_BK * TC_BM; // either layout
constexpr size_t TF_PIPE_BYTES = (size_t)TC_STAGES * 2 * TF_TILE_FLOATS * 4;
static_assert(TF_PIPE_BYTES == TC_PIPE_BYTES,
              "the TF32 stages fit the sm80 kernel's shared memory (TC_SMEM_BYTES: pipeline or C tile, then row facts)");

__device__ __forceinline__ int tf_ic_offset(int q, int i) { return q * TC_BM + ((((i >> 2) ^ (((q >> 2) & 3) << 1))) << 2) + (i & 3); }

__device__ __forceinline__ uint32_t to_tf32(float x)
{
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}

// One k-step's operands (16 reduction rows) into stage (sa, sb), 16-byte chunks of 4 floats, 512 per operand,
// 4 per thread; zero-filled past the expert's rows, past N / K and past the reduction.  WEIGHTED (dW): also
// the stage's 16 topk weights into q_weight (0 past the reduction), as tc_load_stage does.
template <int OP, bool WEIGHTED>
__device__ __forceinline__ void tf_load_stage(const GemmArgs &g, const TileCoord &t, int64_t q0, int64_t qlen,
                                              float *sa, float *sb, const int64_t *a_rows, float *q_weight)
{
    const float *A = static_cast<const float *>(g.a);
    const float *B = static_cast<const float *>(g.b);
    if constexpr (OP == OP_DW) {
        // both [q][i]: thread tid copies chunk lane of row q = warp + 4u (u < 4); lane u of the warp looks up
        // the rows of dY and X for its q once and the warp shares them
        const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
        const int64_t base = g.ws.offsets[t.e];
        int64_t my_y = 0, my_x = 0;
        if (lane < 4 && q0 + warp + 4 * lane < qlen) {
            my_y = y_row(g, base + q0 + warp + 4 * lane);
            my_x = x_row(g, base + q0 + warp + 4 * lane);
        }
        if (WEIGHTED && lane < 4)
            q_weight[warp + 4 * lane] = q0 + warp + 4 * lane < qlen ? topk_weight(g, base + q0 + warp + 4 * lane) : 0.0f;
        const bool a_col_ok = t.i0 + lane * 4 < g.N, b_col_ok = t.j0 + lane * 4 < g.cols_j;
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int q = warp + 4 * u;
            const int64_t y = __shfl_sync(0xffffffffu, my_y, u), x = __shfl_sync(0xffffffffu, my_x, u);
            const bool q_ok = q0 + q < qlen, a_ok = q_ok && a_col_ok, b_ok = q_ok && b_col_ok;
            cp_async16(sa + tf_ic_offset(q, lane * 4), a_ok ? A + y * g.N + t.i0 + lane * 4 : A, a_ok);
            cp_async16(sb + tf_ic_offset(q, lane * 4), b_ok ? B + x * g.K + t.j0 + lane * 4 : B, b_ok);
        }
    } else {
        const int64_t lda = OP == OP_DX ? g.N : g.K;
#pragma unroll
        for (int u = 0; u < 4; u++) { // A [row i][q]: row c / 4, chunk c % 4
            const int c = threadIdx.x + u * TC_THREADS, i = c >> 2, kc = c & 3;
            const bool ok = a_rows[i] >= 0 && q0 + kc * 4 < qlen;
            cp_async16(sa + i * TF_BK + kc * 4, ok ? A + a_rows[i] * lda + q0 + kc * 4 : A, ok);
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int c = threadIdx.x + u * TC_THREADS;
            if (OP == OP_FWD || OP == OP_TOPK_GRAD) { // B [n][q]: W[e] rows
                const int j = c >> 2, kc = c & 3;
                const bool ok = t.j0 + j < g.cols_j && q0 + kc * 4 < qlen;
                cp_async16(sb + j * TF_BK + kc * 4, ok ? B + (t.e * g.N + t.j0 + j) * g.K + q0 + kc * 4 : B, ok);
            } else { // dX: B [q][j] = W[e][q][j]
                const int q = c >> 5, jc = c & 31;
                const bool ok = q0 + q < qlen && t.j0 + jc * 4 < g.cols_j;
                cp_async16(sb + tf_ic_offset(q, jc * 4), ok ? B + (t.e * g.N + q0 + q) * g.K + t.j0 + jc * 4 : B, ok);
            }
        }
    }
}

template <int OP, bool WEIGHTED = false>
__global__ void __launch_bounds__(TC_THREADS, 2) tf32_gemm_kernel(GemmArgs g)
{
    static_assert(!WEIGHTED || OP == OP_DW, "fused topk weights in the reduction: dW only");
    extern __shared__ __align__(128) unsigned char smem[];
    float *pipe = reinterpret_cast<float *>(smem);
    float *tile_c = reinterpret_cast<float *>(smem);
    float *stage_weights = reinterpret_cast<float *>(smem + TF_PIPE_BYTES); // WEIGHTED: [TC_STAGES][TC_BK]
    const TcRowFacts facts = tc_row_facts(smem);
    int64_t *a_rows = facts.a_rows;
    if (*g.ws.status != 0)
        return;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, gq = lane / 4, tq = lane % 4;
    const int wi0 = (warp / 2) * 64, wj0 = (warp % 2) * 64;
    constexpr bool A_QC = OP != OP_DW, B_QC = OP == OP_FWD || OP == OP_TOPK_GRAD;

    const int64_t tiles = total_tiles(g, TC_BM, TC_BN);
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const TileCoord t = tile_coord(g, tile, TC_BM, TC_BN);
        float acc[4][8][4];
        const int64_t qlen = tc_start_tile<OP>(g, t, a_rows, acc);

        const int64_t steps = (qlen + TF_BK - 1) / TF_BK;
        auto load_stage = [&](int64_t step) { // k-step `step` into its ring slot
            const int s = (int)(step % TC_STAGES);
            tf_load_stage<OP, WEIGHTED>(g, t, step * TF_BK, qlen, pipe + (2 * s) * TF_TILE_FLOATS,
                                        pipe + (2 * s + 1) * TF_TILE_FLOATS, a_rows, stage_weights + s * TC_BK);
        };
        tc_prologue(steps, load_stage);
        for (int64_t step = 0; step < steps; step++) {
            cp_async_wait<TC_STAGES - 2>();
            __syncthreads(); // this step's stage is in, and every warp is done with the slot refilled below
            if (step + TC_STAGES - 1 < steps)
                load_stage(step + TC_STAGES - 1);
            cp_async_commit();
            const int slot = (int)(step % TC_STAGES);
            const float *sa = pipe + (2 * slot) * TF_TILE_FLOATS, *sb = sa + TF_TILE_FLOATS;
            // fragments of both k8 MMAs (s = 0, 1): A a[u][s] = {(g, k t), (g + 8, k t), (g, k t + 4), (g + 8, k t + 4)}
            // of m16 block u; B b[v][s] = {(k t, n g), (k t + 4, n g)} of n8 block v; k t <-> q 4t + 2s, k t + 4 <-> 4t + 2s + 1
            uint32_t a[4][2][4], b[8][2][2];
            // WEIGHTED: the weights of this lane's q = 4t .. 4t + 3, multiplied into A (dY) in fp32 before its
            // TF32 rounding: fl32(w * dY), then cvt.rna as for any operand
            const float4 qw = WEIGHTED ? *reinterpret_cast<const float4 *>(stage_weights + slot * TC_BK + 4 * tq)
                                       : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
#pragma unroll
            for (int u = 0; u < 4; u++)
#pragma unroll
                for (int h = 0; h < 2; h++) { // rows g (h = 0) and g + 8
                    const int i = wi0 + 16 * u + gq + 8 * h;
                    float4 v;
                    if (A_QC)
                        v = *reinterpret_cast<const float4 *>(sa + i * TF_BK + 4 * tq);
                    else
                        v = make_float4(sa[tf_ic_offset(4 * tq, i)], sa[tf_ic_offset(4 * tq + 1, i)],
                                        sa[tf_ic_offset(4 * tq + 2, i)], sa[tf_ic_offset(4 * tq + 3, i)]);
                    if (WEIGHTED)
                        v.x *= qw.x, v.y *= qw.y, v.z *= qw.z, v.w *= qw.w;
                    a[u][0][h] = to_tf32(v.x), a[u][0][2 + h] = to_tf32(v.y);
                    a[u][1][h] = to_tf32(v.z), a[u][1][2 + h] = to_tf32(v.w);
                }
#pragma unroll
            for (int v = 0; v < 8; v++) {
                const int j = wj0 + 8 * v + gq;
                float4 w;
                if (B_QC)
                    w = *reinterpret_cast<const float4 *>(sb + j * TF_BK + 4 * tq);
                else
                    w = make_float4(sb[tf_ic_offset(4 * tq, j)], sb[tf_ic_offset(4 * tq + 1, j)],
                                    sb[tf_ic_offset(4 * tq + 2, j)], sb[tf_ic_offset(4 * tq + 3, j)]);
                b[v][0][0] = to_tf32(w.x), b[v][0][1] = to_tf32(w.y);
                b[v][1][0] = to_tf32(w.z), b[v][1][1] = to_tf32(w.w);
            }
#pragma unroll
            for (int s = 0; s < 2; s++)
#pragma unroll
                for (int u = 0; u < 4; u++)
#pragma unroll
                    for (int v = 0; v < 8; v++)
                        mma_m16n8k8_tf32(acc[u][v], a[u][s], b[v][s]);
        }
        tc_finish_tile<OP>(g, t, acc, tile_c, facts, wi0, wj0);
    }
}

#include "gemm_sm90.cuh"
#include "gate_sm90.cuh"

// ------------------------------------------------------------------------------------------------
// Fixed-order reductions: reduce_topk (dX[t] = sum_j slot rows) and the topk-weight gradient partials.
// ------------------------------------------------------------------------------------------------
__global__ void reduce_topk_kernel(const float *slots, int64_t T, int64_t k, int64_t K, void *dx, moe_dtype dtype,
                                   int accumulate, const int *status)
{
    if (*status != 0)
        return;
    for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < T * K; idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = idx / K, c = idx % K;
        float sum = 0.0f;
        for (int64_t j = 0; j < k; j++)
            sum += slots[(t * k + j) * K + c];
        if (accumulate)
            sum = load_as_float(dtype, dx, idx) + sum;
        store_from_float(dtype, dx, idx, sum);
    }
}

__global__ void reduce_partials_kernel(const float *partials, int64_t M, int64_t parts, void *out, moe_dtype dtype,
                                       int accumulate, const int *status)
{
    if (*status != 0)
        return;
    for (int64_t s = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; s < M; s += (int64_t)gridDim.x * blockDim.x) {
        float sum = 0.0f;
        for (int64_t p = 0; p < parts; p++)
            sum += partials[s * parts + p];
        if (accumulate)
            sum = load_as_float(dtype, out, s) + sum;
        store_from_float(dtype, out, s, sum);
    }
}

// ------------------------------------------------------------------------------------------------
// Host side
// ------------------------------------------------------------------------------------------------
int device_sm_count()
{
    int device = 0, sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
        return 132;
    return sms;
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

// The CTAs of sm90_gemm_kernel for fwd and dX in the static tile order (tile t on CTA t mod gridDim.x): a
// multiple of H_GRID_ALIGN, 128 of an H100's 132 SMs.  Tiles next to each other in the order share operands
// (an expert's row tiles one W block, its column tiles the rows), and the L2 -> SM traffic, which bounds these
// kernels (ncu: L2 throughput a large share of its peak at Qwen3-30B-A3B), depends on where and when they run:
// CTA b starting at tile 67 b mod 132 instead of b ran Qwen3 gate_up fwd much slower, with more L2 bytes
// (bench/RESULTS.md, "the grouped GEMMs are bound by L2 -> SM traffic").  Where: the L2 is two partitions, each
// holding what the SMs on its side read, and an H100 put CTAs 8j .. 8j + 7 of a launch on four SM pairs of one
// side (e.g. SMs 0, 1, 16, 17, 32, 33, 48, 49 for CTAs 8 .. 15; the sides as measured on two machines:
// bench/RESULTS.md, "Which SMs share an L2 partition").  When: tiles that share operands start together and
// walk their k-steps side by side, and the SMs then send fewer sectors to the L2 than the tiles load
// (bench/RESULTS.md, "the L2's two sides").  With 132 CTAs a wave's tiles shift by 4 against those groups of 8
// from one wave to the next; with 128 they do not, and Qwen3 T = 4096 ran gate_up and down fwd / dX a little
// faster with fewer L2 bytes; 120 CTAs lost.  Not for dynamic tiles (a CTA takes whichever tile comes next;
// Mixtral lost with 128) nor dW (slower with 128); bench/RESULTS.md, "A grid of a multiple of 8 CTAs".
// MOE_SM90_GRID=N caps the CTAs of every sm90 launch (A/B runs).
constexpr int64_t H_GRID_ALIGN = 8;
int64_t sm90_grid_cap(int64_t ctas)
{
    const char *env = getenv("MOE_SM90_GRID");
    const int64_t cap = env != NULL ? atoi(env) : 0;
    return cap > 0 && ctas > cap ? cap : ctas;
}

// Grid of a persistent kernel: per_sm CTAs per SM, no more than max_tiles (each CTA needs a tile), at least one.
unsigned persistent_grid(int64_t max_tiles, int per_sm = 1)
{
    int64_t grid = (int64_t)device_sm_count() * (per_sm > 0 ? per_sm : 1);
    if (grid > max_tiles)
        grid = max_tiles;
    return (unsigned)(grid < 1 ? 1 : grid);
}

// Kernel family for a call.  MOE_CUDA_KERNEL=auto (default) | sm80 | simt forces a family, so tests can
// exercise every path on one GPU; a forced family still falls back when it cannot take the shape.
// MOE_CUDA_KERNEL=sm90 is auto, except that a refused TMA descriptor is an error instead of a quiet
// fallback to sm80 (so a test run proves the Hopper path took its shapes).
enum KernelFamily { FAMILY_SIMT, FAMILY_SM80, FAMILY_SM90 };

// The sm_90a kernels exist only when the build targets 90a and the device is compute capability 9.0.
bool sm90_path_available()
{
#ifdef MOE_BUILD_SM90A
    int device = 0, major = 0, minor = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess)
        return false;
    return major == 9 && minor == 0;
#else
    return false;
#endif
}

// Whether the tensor-core path can take the problem's shape: 16-byte vectors along every contiguous
// dimension (loads and the vectorised epilogue).  plan_gemm adds the dtype rules: f32 only with allow_tf32
// (the TF32 kernel: every op), dW with fused topk weights for bf16 (on sm90 not the wide or ping-pong
// kernels) and f16 (the sm80 kernel only).
bool tensor_core_ok(const moe_gemm_problem *p, const void *a, const void *b, const void *out)
{
    if (p->N % 8 != 0 || p->K % 8 != 0 || !aligned16(a) || !aligned16(b) || !aligned16(out))
        return false;
    return true;
}

// TMA descriptor (cuTensorMapEncodeTiled, reached through the runtime's driver entry point) of a dense
// tensor (bf16, f16 or f32) of `rank` dimensions, dims[0] innermost, row strides in bytes for dims 1..,
// box `box` elements, with the 128-byte swizzle of gemm_sm90.cuh; loads past the edges fill zeros, stores
// past them are dropped.
// Returns false when the driver has no encoder or rejects the shape.
// The largest dimension a map takes is the hardware's 2^31 elements; MOE_SM90_TMA_MAX_DIM=n lowers it to n
// (tests: a small problem then crosses the refusals and their fallbacks, specs/THRESHOLDS.md).
static uint64_t tma_max_dim()
{
    const char *env = getenv("MOE_SM90_TMA_MAX_DIM");
    const long long n = env != nullptr ? atoll(env) : 0;
    return n > 0 && (uint64_t)n < (1ull << 31) ? (uint64_t)n : 1ull << 31;
}

bool encode_tensor_map(CUtensorMap *map, moe_dtype dtype, const void *base, int rank, const uint64_t *dims,
                       const uint64_t *strides, const uint32_t *box)
{
    static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
    static bool looked_up = false;
    if (!looked_up) {
        void *fn = nullptr;
        cudaDriverEntryPointQueryResult found;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) ==
                cudaSuccess && found == cudaDriverEntryPointSuccess)
            encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
        looked_up = true;
    }
    if (encode == nullptr)
        return false;
    cuuint64_t d[3], st[2];
    cuuint32_t b[3], element_strides[3] = {1, 1, 1};
    const uint64_t max_dim = tma_max_dim();
    for (int i = 0; i < rank; i++) {
        if (dims[i] == 0 || dims[i] > max_dim)
            return false;
        d[i] = dims[i], b[i] = box[i];
        if (i > 0)
            st[i - 1] = strides[i - 1];
    }
    const CUtensorMapDataType type = dtype == MOE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                   : dtype == MOE_F16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
    const CUresult r = encode(map, type,
                              (cuuint32_t)rank, const_cast<void *>(base), d, st, b, element_strides,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS;
}

// The sm90 kernel's tensor maps (Sm90Maps in gemm_sm90.cuh) for tiles of bm rows (the paired kernel, cluster 2,
// loads the forward's W stage in two boxes of half the columns); sets g->tma_rows when the row operands are
// contiguous and got their maps, g->tma_out when `out` (element type out_dtype) is overwritten with its rows
// in tile order and got its map.  False: no W map, take the sm80 family.
bool encode_sm90_maps(const moe_gemm_problem *p, int op, int bm, int cluster, bool tma_store_allowed, const void *a,
                      const void *b, const void *out, moe_dtype out_dtype, GemmArgs *g, Sm90Maps *maps)
{
    const uint64_t E = (uint64_t)p->num_experts, N = (uint64_t)p->N, K = (uint64_t)p->K, M = (uint64_t)p->rows;
    if (op != OP_DW && E > 0 && N > 0 && K > 0) { // an empty W is never read (no tiles or no k-steps)
        const uint64_t dims[3] = {K, N, E}, strides[2] = {K * 2, N * K * 2};
        const uint32_t box[3] = {(uint32_t)H_BK, op == OP_FWD ? (uint32_t)(h_bn(bm) / cluster) : 64u, 1};
        if (!encode_tensor_map(&maps->w, p->dtype, b, 3, dims, strides, box))
            return false;
    }
    g->tma_rows = 0;
    if (op == OP_FWD && !p->permute_x) {
        const uint64_t dims[2] = {K, M}, strides[1] = {K * 2};
        const uint32_t box[2] = {(uint32_t)H_BK, (uint32_t)bm};
        g->tma_rows = encode_tensor_map(&maps->rows_a, p->dtype, a, 2, dims, strides, box);
    } else if (op == OP_DX && !p->permute_y) {
        const uint64_t dims[2] = {N, M}, strides[1] = {N * 2};
        const uint32_t box[2] = {(uint32_t)H_BK, (uint32_t)bm};
        g->tma_rows = encode_tensor_map(&maps->rows_a, p->dtype, a, 2, dims, strides, box);
    } else if (op == OP_DW && !p->permute_x && !p->permute_y) {
        const uint64_t dims_a[2] = {N, M}, strides_a[1] = {N * 2}, dims_b[2] = {K, M}, strides_b[1] = {K * 2};
        const uint32_t box[2] = {64, (uint32_t)H_BK};
        g->tma_rows = encode_tensor_map(&maps->rows_a, p->dtype, a, 2, dims_a, strides_a, box) &&
                      encode_tensor_map(&maps->rows_b, p->dtype, b, 2, dims_b, strides_b, box);
    }
    g->tma_out = 0, g->tma_out_wide = 0;
    const char *off = getenv("MOE_SM90_TMA_OUT"); // =0: the register-store epilogue (A/B timing runs)
    const bool rows_in_order = op == OP_DW || (op == OP_FWD && !p->permute_y) ||
                               (op == OP_DX && !p->permute_x && !p->reduce_topk);
    if (rows_in_order && !p->accumulate && E > 0 && N > 0 && K > 0 && M > 0 && tma_store_allowed &&
        !(off != NULL && strcmp(off, "0") == 0)) {
        const uint64_t esize = out_dtype == MOE_F32 ? 4 : 2, cols = op == OP_FWD ? N : K;
        const uint64_t rows = op == OP_DW ? N : M, slabs = op == OP_DW ? E : 1;
        const uint64_t dims[3] = {cols, rows, slabs}, strides[2] = {cols * esize, rows * cols * esize};
        const uint32_t box[3] = {(uint32_t)(128 / esize), 8, 1};
        g->tma_out = encode_tensor_map(&maps->out, out_dtype, out, 3, dims, strides, box);
        if (g->tma_out && op == OP_DW && esize == 2) { // the ping-pong kernel's 8 KiB boxes
            const uint32_t wide_box[3] = {64, 64, 1};
            g->tma_out_wide = encode_tensor_map(&maps->out_wide, out_dtype, out, 3, dims, strides, wide_box);
        }
    }
    return true;
}

// An on/off override from the environment: 1 or 0 when the variable `name` is exactly "1" or "0", else -1 (unset
// or anything else: the caller's rule decides).
int env_switch(const char *name)
{
    const char *value = getenv(name);
    return value != NULL && (strcmp(value, "0") == 0 || strcmp(value, "1") == 0) ? value[0] - '0' : -1;
}

// GemmArgs::sm90_skip of every call, the grouped GEMM's and the MLP's rows GEMMs': MOE_SM90_SKIP, else 0.
int sm90_skip_from_env()
{
    const char *skip = getenv("MOE_SM90_SKIP");
    return skip != NULL ? atoi(skip) : 0;
}

// Dynamic tiles (gemm_sm90.cuh, h_run_scheduler: a CTA takes its next tile when its ring reaches it, not
// every gridDim.x-th) in sm90_gemm_kernel without clusters, where every operand comes by TMA, for fwd and dX
// with a reduction of at least H_DYNAMIC_REDUCTION.  There tiles are long and few per CTA, and an expert's last
// row tile, often short, unbalances the static order; where the reduction is short they cost time.  Measured
// on H100s (bench/RESULTS.md, the section ending "device tool): dynamic tiles"): DeepSeek-V3 dX and
// Mixtral-8x7B down dX (N = 4096) gain, DeepSeek-V3 T = 8192 fwd / dX most, with the pairing rule of
// sm90_cluster_size; Qwen3-30B-A3B (K = 2048, N = 1536 / 2048) loses in fwd and dX in every call, though its
// kernels read fewer bytes (ncu).  Why (see sm90_grid_cap): a dynamic tile goes to whichever CTA asks when it
// asks, so the tiles sharing a W block or rows run on both sides of the L2 (more sectors cross between its
// partitions) and at different moments (the SMs send every sector their tiles load, more than in the static
// order).  Claims kept on the claiming CTA's side of the L2 (the sides measured at run time) brought the
// crossings back to the static order's and two thirds of the Qwen3 loss with them, but no shape gained enough
// over this rule to keep them (bench/RESULTS.md, "Dynamic tiles by side").
// MOE_SM90_DYNAMIC=0|1 forces them off or on (where the kernel can take them).
constexpr int64_t H_DYNAMIC_REDUCTION = 4096;
bool sm90_dynamic_tiles(const moe_gemm_problem *p, int op)
{
    const int forced = env_switch("MOE_SM90_DYNAMIC");
    if (forced >= 0)
        return forced == 1;
    return (op == OP_FWD && p->K >= H_DYNAMIC_REDUCTION) || (op == OP_DX && p->N >= H_DYNAMIC_REDUCTION);
}

// Tiles of one length (GemmArgs::full_blocks; sm90_gemm_kernel without clusters, fwd and dX).  An m64 block
// whose rows all lie past the expert's end skips its MMAs, so an expert's short last row tile takes about half
// as long as a full one, and the CTA that ran it starts its next tile out of phase with the tiles that share
// its operands.  Tiles that share a W block or rows and start together walk their k-steps side by side, and
// their loads cost the L2 and DRAM less (the static order's SMs send fewer sectors to the L2 than their tiles
// load; bench/RESULTS.md, "the L2's two sides").  With long experts (H_FULL_BLOCK_ROWS rows or more on
// average) such blocks issue their MMAs anyway, at most 64 E extra rows of MMAs against the M rows (6%).  On
// H100s that ran Mixtral-8x7B T = 4096 gate_up fwd, gate_up dX (with fewer DRAM reads) and down dX faster, and
// Qwen3-30B-A3B T = 16384 gate_up; the MLP within its spread.  With shorter experts the extra MMAs cost more
// than the phase saves (Qwen3 T = 4096, DeepSeek-V3 T = 8192); bench/RESULTS.md, "Tiles of one length".
// MOE_SM90_FULL_BLOCKS=0|1 forces it off or on.
constexpr int64_t H_FULL_BLOCK_ROWS = 1024;
bool sm90_full_blocks(const moe_gemm_problem *p)
{
    const int forced = env_switch("MOE_SM90_FULL_BLOCKS");
    if (forced >= 0)
        return forced == 1;
    return p->num_experts > 0 && p->rows >= H_FULL_BLOCK_ROWS * p->num_experts;
}

// Tile rows of the sm90 kernel: the heuristic of gemm_sm90.cuh takes 128 for every shape.
// MOE_SM90_TILE_ROWS=128|256 overrides it for fwd and dX (tuning runs); a tuned choice (autotune table or the
// autotune driver's candidate; NULL: none) comes after the override.
int sm90_tile_rows(int op, const moe_tune_choice *tuned)
{
    if (op == OP_DW)
        return 128;
    const char *forced = getenv("MOE_SM90_TILE_ROWS");
    if (forced != NULL && (atoi(forced) == 128 || atoi(forced) == 256))
        return atoi(forced);
    if (tuned != NULL && tuned->kernel == MOE_TUNE_SM90 && (tuned->tile_rows == 128 || tuned->tile_rows == 256))
        return tuned->tile_rows;
    return 128;
}

// The paired kernel (clusters of two CTAs sharing W by multicast) for 128-row forward tiles when the
// reduction K has at least H_PAIRED_REDUCTION elements and the experts at least H_PAIRED_ROWS rows on average.
// Before dynamic tiles (sm90_dynamic_tiles) it took every K >= H_PAIRED_REDUCTION, where it won or tied on an
// H100 (MOE_SM90_CLUSTER=1 vs 2; bench/RESULTS.md, "fwd pairing for every K >= 4096").  With dynamic tiles the
// unpaired kernel wins where the experts are short and pairs still win on long experts (Mixtral T = 16384, 4096
// rows per expert; bench/RESULTS.md, the section ending "device tool): dynamic tiles").  Where K is short pairs
// lose (Qwen3 gate_up, K = 2048), and for dX on every shape (same sections), which keeps the
// kernel for autotune and MOE_SM90_CLUSTER=2.  MOE_SM90_CLUSTER=1|2 forces it off or on (tests, tuning runs).
constexpr int64_t H_PAIRED_ROWS = 2048;
int sm90_cluster_size(const moe_gemm_problem *p, int op, int bm, const moe_tune_choice *tuned)
{
    if (op == OP_DW || bm != 128)
        return 1;
    const char *forced = getenv("MOE_SM90_CLUSTER");
    if (forced != NULL && (atoi(forced) == 1 || atoi(forced) == 2))
        return atoi(forced);
    if (tuned != NULL && tuned->kernel == MOE_TUNE_SM90)
        return tuned->cluster == 2 ? 2 : 1;
    return op == OP_FWD && p->K >= H_PAIRED_REDUCTION && p->num_experts > 0 && p->rows / p->num_experts >= H_PAIRED_ROWS
               ? 2
               : 1;
}

// dW with every operand and the (16-bit) output by TMA takes the ping-pong kernel (gemm_sm90.cuh) when the
// experts are short (at most H_DW_PINGPONG_ROWS rows on average): there the epilogue is a large part of a
// tile's time and the other warpgroup's MMAs hide it.  With longer experts sm90_gemm_kernel's 128 x 256 tiles
// (m64n256 MMAs, a third less L2 -> SM traffic) with the wide epilogue win: measured on an H100, ping-pong ahead
// at 128 rows per expert (Qwen3-30B-A3B T = 2048, DeepSeek-V3 T = 4096), behind from 256 (Mixtral T = 1024 and
// up, Qwen3 T = 4096 and up, DeepSeek-V3 T = 8192); at 64 rows (Qwen3 T = 1024) slightly behind, at 32
// (DeepSeek-V3 T = 1024) even (bench/RESULTS.md, "stmatrix for the 8 KiB boxes, and the ping-pong rule re-measured").
// MOE_SM90_DW_PINGPONG=0|1 forces it off or on; a tuned sm90 choice (autotune table or the autotune driver's
// candidate; NULL: none) with dw_pingpong 0 or 1 comes after the override, the rule (from p's rows and
// experts) last.  plan_gemm asks only where the ping-pong kernel applies.
constexpr int64_t H_DW_PINGPONG_ROWS = 128;
bool sm90_dw_pingpong(const moe_gemm_problem *p, const moe_tune_choice *tuned)
{
    const int forced = env_switch("MOE_SM90_DW_PINGPONG");
    if (forced >= 0)
        return forced == 1;
    if (tuned != nullptr && tuned->kernel == MOE_TUNE_SM90 && tuned->dw_pingpong >= 0)
        return tuned->dw_pingpong == 1;
    return p->rows <= H_DW_PINGPONG_ROWS * p->num_experts;
}

// The other dW launches with every operand and the 16-bit output by TMA take sm90_gemm_kernel's wide
// epilogue (8 KiB output boxes, h_store_wg_wide) unless MOE_SM90_DW_WIDE=0.
bool sm90_dw_wide(void)
{
    const char *forced = getenv("MOE_SM90_DW_WIDE");
    return forced == NULL || strcmp(forced, "0") != 0;
}

// Launches the sm90 kernel of op with bm-row tiles and clusters of `cluster` CTAs; pingpong (plan_gemm's
// Plan::dw_pingpong: dW with every operand and a 16-bit output by TMA) takes sm90_dw_pingpong_kernel.
template <typename T>
moe_status launch_sm90(int op, int bm, int cluster, bool pingpong, const GemmArgs &g, const Sm90Maps &maps,
                       int64_t max_tiles, cudaStream_t stream)
{
    const bool weighted_dw = op == OP_DW && g.weights != nullptr; // bf16 only (plan_gemm); never wide or ping-pong
    const bool wide = op == OP_DW && !pingpong && !weighted_dw && g.tma_rows && g.tma_out_wide && sm90_dw_wide();
    auto kernel = pingpong ? sm90_dw_pingpong_kernel<T>
                : wide ? sm90_gemm_kernel<T, OP_DW, 128, 1, true>
                : op == OP_DW ? sm90_gemm_kernel<T, OP_DW, 128, 1>
                : op == OP_FWD ? (bm == 256 ? sm90_gemm_kernel<T, OP_FWD, 256, 1>
                                  : cluster == 2 ? sm90_gemm_kernel<T, OP_FWD, 128, 2> : sm90_gemm_kernel<T, OP_FWD, 128, 1>)
                               : (bm == 256 ? sm90_gemm_kernel<T, OP_DX, 256, 1>
                                  : cluster == 2 ? sm90_gemm_kernel<T, OP_DX, 128, 2> : sm90_gemm_kernel<T, OP_DX, 128, 1>);
    if constexpr (std::is_same<T, __nv_bfloat16>::value)
        if (weighted_dw)
            kernel = sm90_gemm_kernel<T, OP_DW, 128, 1, false, true>;
    const size_t smem_bytes = pingpong ? P_SMEM_BYTES : wide ? H_WIDE_SMEM_BYTES : H_SMEM_BYTES;
    if (pingpong) // its tiles are 128 x 128: up to twice as many as max_tiles counts
        max_tiles = g.E * ((g.N + P_BM - 1) / P_BM) * ((g.cols_j + P_BN - 1) / P_BN);
    MOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_bytes));
    cudaLaunchConfig_t config = {};
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = (unsigned)cluster, attribute[0].val.clusterDim.y = 1, attribute[0].val.clusterDim.z = 1;
    config.blockDim = dim3(H_THREADS);
    config.dynamicSmemBytes = smem_bytes;
    config.stream = stream;
    config.attrs = attribute;
    config.numAttrs = cluster > 1 ? 1 : 0; // the unpaired kernel: an ordinary launch, no cluster attribute
    // persistent: one CTA per SM, or as many clusters as can be resident (a cluster's CTAs share a GPC, and a
    // GPC with an odd number of free SMs leaves one idle); max_tiles bounds the units either way
    int64_t ctas = device_sm_count();
    if (cluster > 1) {
        config.gridDim = dim3((unsigned)(ctas / cluster * cluster));
        int clusters = 0;
        MOE_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
        ctas = (int64_t)(clusters > 0 ? clusters : 1) * cluster;
    }
    // fwd and dX in the static tile order: a multiple of H_GRID_ALIGN CTAs (sm90_grid_cap's comment)
    if (op != OP_DW && cluster == 1 && !g.dynamic_tiles && ctas >= H_GRID_ALIGN)
        ctas = ctas / H_GRID_ALIGN * H_GRID_ALIGN;
    ctas = sm90_grid_cap(ctas);
    if (ctas > max_tiles * cluster)
        ctas = max_tiles * cluster;
    config.gridDim = dim3((unsigned)(ctas < cluster ? cluster : ctas));
    MOE_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, g, maps));
    return MOE_OK;
}

// Launches a kernel of the sm80 family (tc_gemm_kernel, tf32_gemm_kernel: TC_THREADS threads, TC_SMEM_BYTES of
// shared memory) persistently, as many CTAs per SM as fit.
moe_status launch_sm80_family(void (*kernel)(GemmArgs), const GemmArgs &g, int64_t max_tiles, cudaStream_t stream)
{
    MOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)TC_SMEM_BYTES));
    // the largest shared-memory carveout, so that two CTAs (2 x 70 KiB) fit on an sm_80 SM next to its L1
    MOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, (int)cudaSharedmemCarveoutMaxShared));
    int per_sm = 0;
    MOE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, TC_THREADS, TC_SMEM_BYTES));
    kernel<<<persistent_grid(max_tiles, per_sm), TC_THREADS, TC_SMEM_BYTES, stream>>>(g);
    MOE_CUDA_CHECK(cudaGetLastError());
    return MOE_OK;
}

template <typename T>
moe_status launch_tc(int op, const GemmArgs &g, int64_t max_tiles, cudaStream_t stream)
{
    auto kernel = op == OP_FWD ? tc_gemm_kernel<T, OP_FWD>
                : op == OP_DX ? tc_gemm_kernel<T, OP_DX>
                : op == OP_DW ? tc_gemm_kernel<T, OP_DW> : tc_gemm_kernel<T, OP_TOPK_GRAD>;
    if (op == OP_DW && g.weights != nullptr) // bf16: two bf16 terms; f16: two TF32 terms
        kernel = tc_gemm_kernel<T, OP_DW, true>;
    return launch_sm80_family(kernel, g, max_tiles, stream);
}

moe_status launch_tf32(int op, const GemmArgs &g, int64_t max_tiles, cudaStream_t stream)
{
    return launch_sm80_family(op == OP_FWD ? tf32_gemm_kernel<OP_FWD>
                              : op == OP_DX ? tf32_gemm_kernel<OP_DX>
                              : op == OP_TOPK_GRAD ? tf32_gemm_kernel<OP_TOPK_GRAD>
                              : g.weights != nullptr ? tf32_gemm_kernel<OP_DW, true> : tf32_gemm_kernel<OP_DW>,
                              g, max_tiles, stream);
}

moe_status launch_simt(const GemmArgs &g, int64_t max_tiles, cudaStream_t stream)
{
    simt_gemm_kernel<<<persistent_grid(max_tiles, 4), SIMT_THREADS, 0, stream>>>(g);
    MOE_CUDA_CHECK(cudaGetLastError());
    return MOE_OK;
}

// Which kernel family runs a call, with its tile shape and (sm90) tensor maps.
struct Plan {
    KernelFamily family;
    int bm, bn;
    int cluster; // sm90: 2 for the paired kernel (fwd, dX with 128-row tiles), else 1
    int dw_pingpong; // sm90 dW with every operand and a 16-bit output by TMA: 1 sm90_dw_pingpong_kernel, else 0
    Sm90Maps maps; // sm90: TMA descriptors (unused ones stay zero)
};

// Autotuning (src/autotune.c): the configuration the autotune driver forces on this thread's calls, and
// the key and configuration of this thread's most recent plan (what the driver reads back).
thread_local const moe_tune_choice *tune_forced = nullptr;
thread_local bool tune_planned = false;
thread_local moe_tune_key tune_last_key;
thread_local moe_tune_choice tune_last_choice;

// The current device's name for tune keys ('|' replaced, truncated), cached per thread and device.
const char *device_name_for_tuning()
{
    thread_local int cached_device = -1;
    thread_local char name[MOE_TUNE_DEVICE_CHARS];
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess)
        return "unknown";
    if (device != cached_device) {
        cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, device) != cudaSuccess)
            return "unknown";
        const size_t length = strnlen(prop.name, sizeof prop.name);
        const size_t kept = length < sizeof name - 1 ? length : sizeof name - 1; // truncated, as the key allows
        memcpy(name, prop.name, kept);
        name[kept] = '\0';
        for (char *c = name; *c != '\0'; c++)
            if (*c == '|' || *c == '\n' || *c == '\r')
                *c = '/';
        cached_device = device;
    }
    return name;
}

void tune_key_of(const moe_gemm_problem *p, int op, moe_dtype out_dtype, bool weighted, moe_tune_key *key)
{
    memset(key, 0, sizeof *key);
    snprintf(key->device, sizeof key->device, "%s", device_name_for_tuning());
    key->op = op;
    key->dtype = p->dtype, key->out_dtype = out_dtype;
    key->permute_x = p->permute_x != 0, key->permute_y = p->permute_y != 0, key->reduce_topk = p->reduce_topk != 0;
    key->weighted = weighted, key->allow_tf32 = p->allow_tf32 != 0;
    key->E = p->num_experts, key->M = p->rows, key->N = p->N, key->K = p->K;
}

// Picks the family for op over problem p (a, b, out: the operands as run_gemm names them) and fills
// plan (tile shape, cluster, tensor maps, the sm90 dW kernel) and g->tma_rows.  Order of authority: the
// MOE_CUDA_KERNEL / MOE_SM90_* environment overrides, then the autotune driver's forced candidate, then the
// autotune table, then the shape heuristic.  Fails only when MOE_CUDA_KERNEL=sm90 forces a refused TMA
// descriptor.
moe_status plan_gemm(const moe_gemm_problem *p, int op, const void *a, const void *b, const void *out,
                     moe_dtype out_dtype, bool weighted, GemmArgs *g, Plan *plan)
{
    const char *forced = getenv("MOE_CUDA_KERNEL");
    const bool forced_family = forced != NULL && (strcmp(forced, "simt") == 0 || strcmp(forced, "sm80") == 0);
    moe_tune_key key;
    const bool tunable = op != OP_TOPK_GRAD;
    if (tunable)
        tune_key_of(p, op, out_dtype, weighted, &key);
    moe_tune_choice table_choice;
    const moe_tune_choice *tuned = !tunable ? nullptr
                                 : tune_forced != nullptr ? tune_forced
                                 : moe_tune_table_used() && moe_tune_lookup(&key, &table_choice) ? &table_choice
                                 : nullptr;
    // dW with fused topk weights: the two-term split of w * dY, into bf16 terms on the sm90 and sm80 kernels for
    // bf16, into TF32 terms on the sm80 kernel for f16 (no sm90 kernel); f32 with allow_tf32: fl32(w * dY)
    // rounded to TF32 like any operand
    const bool weighted_dw = op == OP_DW && weighted;
    // f32: true fp32 (SIMT) unless the caller allows TF32, which the TF32 kernel (sm80 family) uses for every op
    const bool f32_ok = p->dtype != MOE_F32 || p->allow_tf32;
    // A tuned "simt" binds nothing: the autotune records it only where no tensor-core kernel took the call (no
    // candidate is SIMT), which a call of the same key may not share (16-byte alignment is not in the key) and
    // a later libmoe may have changed (f16 weighted dW and f32 weighted dW with allow_tf32 were SIMT before
    // the change of bench/RESULTS.md, "weighted dW on tensor cores for f16 and for f32 with allow_tf32")
    const bool use_tc = tensor_core_ok(p, a, b, out) && f32_ok && !(forced != NULL && strcmp(forced, "simt") == 0);
    const bool want_sm80 = (forced != NULL && strcmp(forced, "sm80") == 0) ||
                           (!forced_family && tuned != nullptr && tuned->kernel == MOE_TUNE_SM80);
    plan->family = !use_tc ? FAMILY_SIMT
                 : op != OP_TOPK_GRAD && p->dtype != MOE_F32 && !(weighted_dw && p->dtype == MOE_F16) &&
                           sm90_path_available() && !want_sm80 ? FAMILY_SM90
                 : FAMILY_SM80;
    memset(&plan->maps, 0, sizeof plan->maps);
    g->tma_rows = 0, g->tma_out = 0, g->tma_out_wide = 0;
    const int sm90_bm = sm90_tile_rows(op, tuned);
    plan->cluster = plan->family == FAMILY_SM90 ? sm90_cluster_size(p, op, sm90_bm, tuned) : 1;
    const bool tma_store_allowed = tuned == nullptr || tuned->kernel != MOE_TUNE_SM90 || tuned->tma_store != 0;
    if (plan->family == FAMILY_SM90 &&
        !encode_sm90_maps(p, op, sm90_bm, plan->cluster, tma_store_allowed, a, b, out, out_dtype, g, &plan->maps)) {
        if (forced != NULL && strcmp(forced, "sm90") == 0) // tests: the Hopper path must take every shape it can
            return moe_fail(MOE_ERR_DEVICE, "%s: MOE_CUDA_KERNEL=sm90 but the TMA descriptors were refused", p->op);
        plan->family = FAMILY_SM80;
        plan->cluster = 1;
    }
    plan->dw_pingpong = plan->family == FAMILY_SM90 && op == OP_DW && !weighted_dw && g->tma_rows && g->tma_out_wide &&
                        sm90_dw_pingpong(p, tuned);
    g->dynamic_tiles = plan->family == FAMILY_SM90 && plan->cluster == 1 && (op == OP_FWD || op == OP_DX) &&
                       g->tma_rows && sm90_dynamic_tiles(p, op);
    g->full_blocks = plan->family == FAMILY_SM90 && plan->cluster == 1 && (op == OP_FWD || op == OP_DX) &&
                     sm90_full_blocks(p);
    plan->bm = plan->family == FAMILY_SM90 ? sm90_bm : use_tc ? TC_BM : SIMT_BM;
    plan->bn = plan->family == FAMILY_SM90 ? h_bn(sm90_bm) : use_tc ? TC_BN : SIMT_BN;
    if (tunable) {
        tune_planned = true;
        tune_last_key = key;
        tune_last_choice.kernel = plan->family == FAMILY_SM90 ? MOE_TUNE_SM90
                                : plan->family == FAMILY_SM80 ? MOE_TUNE_SM80 : MOE_TUNE_SIMT;
        tune_last_choice.tile_rows = plan->bm;
        tune_last_choice.cluster = plan->cluster;
        tune_last_choice.tma_store = g->tma_out != 0;
        tune_last_choice.dw_pingpong = plan->dw_pingpong;
        tune_last_choice.median_us = 0.0;
    }
    return MOE_OK;
}

// Launches the planned GEMM kernel (g complete); max_tiles bounds the persistent grid.
moe_status launch_plan(const Plan &plan, int op, const GemmArgs &g, int64_t max_tiles, cudaStream_t stream)
{
    if (max_tiles <= 0 || g.cols_j <= 0)
        return MOE_OK;
    if (plan.family == FAMILY_SM90)
        return g.dtype == MOE_BF16
                   ? launch_sm90<__nv_bfloat16>(op, plan.bm, plan.cluster, plan.dw_pingpong != 0, g, plan.maps, max_tiles, stream)
                   : launch_sm90<__half>(op, plan.bm, plan.cluster, plan.dw_pingpong != 0, g, plan.maps, max_tiles, stream);
    if (plan.family == FAMILY_SM80)
        return g.dtype == MOE_BF16 ? launch_tc<__nv_bfloat16>(op, g, max_tiles, stream)
             : g.dtype == MOE_F16  ? launch_tc<__half>(op, g, max_tiles, stream)
                                   : launch_tf32(op, g, max_tiles, stream);
    return launch_simt(g, max_tiles, stream);
}

// Upper bound of the tile count (the grid of a persistent launch).
int64_t max_tiles_of(int op, int64_t E, int64_t M, int64_t N, int bm, int64_t col_tiles)
{
    return op == OP_DW ? E * ((N + bm - 1) / bm) * col_tiles : (M / bm + E) * col_tiles;
}

// Runs one op end to end on the stream: workspace, routing check, GEMM, reduction.
moe_status run_gemm(const moe_gemm_problem *p, int op, const void *a, const void *b, const void *weights,
                    const void *dy, void *out)
{
    cudaStream_t stream = static_cast<cudaStream_t>(p->stream);
    const int64_t E = p->num_experts, M = p->rows;
    const int64_t cols_j = op == OP_FWD || op == OP_TOPK_GRAD ? p->N : p->K;
    GemmArgs g = {};
    Plan plan;
    const moe_dtype out_dtype = (op == OP_DW || op == OP_TOPK_GRAD) ? p->dw_dtype : p->dtype;
    moe_status status = plan_gemm(p, op, a, b, out, out_dtype, weights != NULL, &g, &plan);
    if (status != MOE_OK)
        return status;
    const int BM = plan.bm;
    const int64_t col_tiles = (cols_j + plan.bn - 1) / plan.bn;
    const int reduce = op == OP_DX && p->reduce_topk;

    // workspace: offsets, tile starts, bitmap, status, and the fp32 buffer of a reduction
    const int64_t bitmap_words = M / 32 + 1;
    const int64_t partials = op == OP_TOPK_GRAD ? M * col_tiles : reduce ? M * p->K : 0;
    size_t bytes = (size_t)(3 * (E + 1) + 1) * 8 + (size_t)bitmap_words * 4 + 16;
    bytes = (bytes + 255) / 256 * 256;
    const size_t partial_offset = bytes;
    bytes += (size_t)partials * 4;
    unsigned char *ws = nullptr;
    MOE_CUDA_CHECK(cudaMallocAsync(&ws, bytes, stream));
    Workspace w;
    w.offsets = reinterpret_cast<int64_t *>(ws);
    w.tile_start = w.offsets + (E + 1);
    w.lone_start = w.tile_start + (E + 1);
    w.tile_counter = reinterpret_cast<unsigned long long *>(w.lone_start + (E + 1));
    w.seen = reinterpret_cast<unsigned *>(w.tile_counter + 1);
    w.status = reinterpret_cast<int *>(w.seen + bitmap_words);
    do {
        const bool check_gather = p->gather_indices != NULL && M > 0;
        check_sizes_kernel<<<1, SIZES_THREADS, 0, stream>>>(p->m_sizes, E, M, col_tiles, BM, plan.cluster > 1,
                                                            check_gather ? bitmap_words : 0, w, op);
        if (check_gather)
            check_gather_kernel<<<(unsigned)((M + 255) / 256 < 1024 ? (M + 255) / 256 : 1024), 256, 0, stream>>>(
                p->gather_indices, M, w, op);
        cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess) {
            status = moe_fail(MOE_ERR_DEVICE, "%s: routing check launch failed: %s", p->op, cudaGetErrorString(err));
            break;
        }

        g.op = op;
        g.dtype = p->dtype;
        g.out_dtype = out_dtype;
        g.T = p->num_tokens, g.k = p->topk, g.E = E, g.M = M, g.N = p->N, g.K = p->K;
        g.cols_j = cols_j;
        g.gather = p->gather_indices;
        g.permute_x = p->permute_x, g.permute_y = p->permute_y, g.accumulate = p->accumulate;
        g.a = a, g.b = b, g.weights = weights, g.dy = dy;
        g.out = (op == OP_TOPK_GRAD || reduce) ? static_cast<void *>(ws + partial_offset) : out;
        g.out_is_workspace = op == OP_TOPK_GRAD || reduce;
        g.partial_stride = col_tiles;
        g.sm90_skip = sm90_skip_from_env();
        g.ws = w;
        status = launch_plan(plan, op, g, max_tiles_of(op, E, M, p->N, BM, col_tiles), stream);
        if (status != MOE_OK)
            break;
        const unsigned blocks = 1024;
        if (reduce && p->num_tokens * p->K > 0) {
            reduce_topk_kernel<<<blocks, 256, 0, stream>>>(static_cast<const float *>(g.out), p->num_tokens, p->topk,
                                                           p->K, out, p->dtype, p->accumulate, w.status);
        } else if (op == OP_TOPK_GRAD && M > 0) {
            reduce_partials_kernel<<<blocks, 256, 0, stream>>>(static_cast<const float *>(g.out), M, col_tiles, out,
                                                               p->dw_dtype, p->accumulate, w.status);
        }
        err = cudaGetLastError();
        if (err != cudaSuccess)
            status = moe_fail(MOE_ERR_DEVICE, "%s: reduction launch failed: %s", p->op, cudaGetErrorString(err));
    } while (0);
    cudaError_t err = cudaFreeAsync(ws, stream);
    if (status == MOE_OK && err != cudaSuccess)
        status = moe_fail(MOE_ERR_DEVICE, "%s: cudaFreeAsync failed: %s", p->op, cudaGetErrorString(err));
    return status;
}

// Tile starts of a rows GEMM from trusted offsets: one warp, 32 experts at a time, shuffle prefix sums.
// (paired: also the lone tiles' starts, as check_sizes_kernel.)
__global__ void rows_tiles_kernel(const int64_t *offsets, int64_t E, int64_t col_tiles, int64_t rows_per_tile,
                                  int paired, int64_t *tile_start, int64_t *lone_start,
                                  unsigned long long *tile_counter, const int *status)
{
    if (blockIdx.x != 0 || threadIdx.x >= 32 || *status != 0)
        return;
    const int lane = threadIdx.x;
    int64_t carried = 0, carried_lone = 0;
    if (lane == 0)
        tile_start[0] = 0, lone_start[0] = 0, *tile_counter = 0;
    for (int64_t e0 = 0; e0 < E; e0 += 32) {
        const int64_t e = e0 + lane;
        int64_t lone = 0;
        int64_t tiles = e < E ? expert_tiles(offsets[e + 1] - offsets[e], rows_per_tile, col_tiles, paired, &lone) : 0;
        tiles = warp_inclusive_sum(tiles), lone = warp_inclusive_sum(lone);
        if (e < E)
            tile_start[e + 1] = carried + tiles, lone_start[e + 1] = carried_lone + lone;
        carried += warp_last_lane(tiles);
        carried_lone += warp_last_lane(lone);
    }
}

// The fused gate/up kernel of dtype T for the activation act (moe_cuda_rows_gate_gemm); its PLAIN instance
// when plain (no bias, no clamp, not on_i, no m0_rows).
template <typename T, int ACT>
moe_status launch_gate_up_act(const GemmArgs &g, const GateArgs &ep, bool plain, const GateMaps &maps,
                              int64_t max_tiles, cudaStream_t stream)
{
    auto kernel = plain ? sm90_gate_up_kernel<T, ACT, true> : sm90_gate_up_kernel<T, ACT, false>;
    MOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)G_SMEM_BYTES));
    kernel<<<(unsigned)sm90_grid_cap((int64_t)persistent_grid(max_tiles)), H_THREADS, G_SMEM_BYTES, stream>>>(g, ep, maps);
    MOE_CUDA_CHECK(cudaGetLastError());
    return MOE_OK;
}

template <typename T>
moe_status launch_gate_up(int act, const GemmArgs &g, const GateArgs &ep, bool plain, const GateMaps &maps,
                          int64_t max_tiles, cudaStream_t stream)
{
    switch (act) {
    case MOE_ACT_SILU: return launch_gate_up_act<T, MOE_ACT_SILU>(g, ep, plain, maps, max_tiles, stream);
    case MOE_ACT_GELU: return launch_gate_up_act<T, MOE_ACT_GELU>(g, ep, plain, maps, max_tiles, stream);
    case MOE_ACT_GELU_TANH: return launch_gate_up_act<T, MOE_ACT_GELU_TANH>(g, ep, plain, maps, max_tiles, stream);
    default: return launch_gate_up_act<T, MOE_ACT_SWISH>(g, ep, plain, maps, max_tiles, stream);
    }
}

// The frame of every rows GEMM: the tile starts of r's experts (rows_tiles_kernel: col_tiles column tiles,
// rows_per_tile rows, paired or not) in a stream-ordered allocation, launch(tile_start, lone_start), the
// allocation freed.  The launch's status is returned, or the frame's own failure.
template <class Launch>
moe_status with_tile_starts(const MoeRowsGemm *r, int64_t col_tiles, int64_t rows_per_tile, bool paired,
                            Launch launch)
{
    cudaStream_t stream = static_cast<cudaStream_t>(r->stream);
    int64_t *tile_start = nullptr;
    // tile_start, lone_start, the tile counter
    MOE_CUDA_CHECK(cudaMallocAsync(&tile_start, (size_t)((r->E + 1) * 2 + 1) * 8, stream));
    int64_t *const lone_start = tile_start + (r->E + 1);
    unsigned long long *const tile_counter = reinterpret_cast<unsigned long long *>(lone_start + (r->E + 1));
    rows_tiles_kernel<<<1, 32, 0, stream>>>(r->offsets, r->E, col_tiles, rows_per_tile, paired, tile_start,
                                            lone_start, tile_counter, r->status);
    moe_status status = MOE_OK;
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess)
        status = moe_fail(MOE_ERR_DEVICE, "%s: tile start launch failed: %s", r->name, cudaGetErrorString(err));
    if (status == MOE_OK)
        status = launch(tile_start, lone_start, tile_counter);
    err = cudaFreeAsync(tile_start, stream);
    if (status == MOE_OK && err != cudaSuccess)
        status = moe_fail(MOE_ERR_DEVICE, "%s: cudaFreeAsync failed: %s", r->name, cudaGetErrorString(err));
    return status;
}

// GemmArgs of a rows GEMM (op, dtypes, shapes, operands, offsets and status from r; cols_j, the tile starts
// and the tile counter from the caller).
GemmArgs rows_gemm_args(const MoeRowsGemm *r, int op, int64_t cols_j, int64_t *tile_start, int64_t *lone_start,
                        unsigned long long *tile_counter)
{
    GemmArgs g = {};
    g.op = op;
    g.dtype = r->dtype, g.out_dtype = r->out_dtype;
    g.T = r->rows, g.k = 1, g.E = r->E, g.M = r->rows, g.N = r->N, g.K = r->K;
    g.cols_j = cols_j;
    g.accumulate = r->accumulate;
    g.a = r->a, g.b = r->b, g.out = r->out;
    g.sm90_skip = sm90_skip_from_env();
    g.ws.offsets = const_cast<int64_t *>(r->offsets);
    g.ws.tile_start = tile_start;
    g.ws.lone_start = lone_start;
    g.ws.tile_counter = tile_counter;
    g.ws.seen = nullptr;
    g.ws.status = const_cast<int *>(r->status);
    return g;
}

// Why the fused MLP kernel (moe_cuda_rows_gate_gemm) does not take a call (NULL: it does).  form_ok: r is the
// GEMM the kernel fuses; H, I: the MLP's (positive multiples of 8 required); outs: the epilogue's outputs (NULL
// entries skipped); required: MOE_MLP_FUSE_GATE=1 (no size rule).  The f32 rows kernel on the same schedule
// (rows_f32_pingpong) takes its calls under these rules too.
const char *gate_fusion_refusal(const MoeRowsGemm *r, bool form_ok, int64_t H, int64_t I, bool required,
                                std::initializer_list<const void *> outs)
{
    const char *fuse = getenv("MOE_MLP_FUSE_GATE"), *forced = getenv("MOE_CUDA_KERNEL");
    if (fuse != NULL && strcmp(fuse, "0") == 0)
        return "MOE_MLP_FUSE_GATE=0";
    if (forced != NULL && (strcmp(forced, "simt") == 0 || strcmp(forced, "sm80") == 0))
        return "MOE_CUDA_KERNEL forces another kernel family";
    if (!form_ok || r->accumulate)
        return "not the GEMM the kernel fuses"; // a caller's mistake: the MLP never passes one
    if (r->dtype == MOE_F32)
        return "f32 (the kernel is for f16 and bf16)";
    if (r->E <= 0 || r->rows <= 0 || H <= 0 || I <= 0)
        return "no rows";
    if (H % 8 != 0 || I % 8 != 0)
        return "H or I not a multiple of 8";
    bool aligned = aligned16(r->a) && aligned16(r->b);
    for (const void *out : outs)
        aligned = aligned && (out == nullptr || aligned16(out));
    if (!aligned)
        return "an operand not 16-byte aligned";
    if (!sm90_path_available())
        return "no sm_90a device";
    if (!required && r->rows < G_FUSE_MIN_ROWS * r->E)
        return "short experts (the unfused kernels are faster)";
    return NULL;
}

bool gate_fusion_required()
{
    const char *fuse = getenv("MOE_MLP_FUSE_GATE");
    return fuse != NULL && strcmp(fuse, "1") == 0;
}

// The ping-pong rows kernel with fp32 output (sm90_rows_f32_kernel, gate_sm90.cuh) for r, or *taken = 0 (r goes
// to the planned kernels): it takes the dX and forward forms with an fp32 output it overwrites and 16-bit
// operands, on sm_90a, under the fused gate/up kernel's rules (gate_fusion_refusal: long experts, N and K multiples
// of 8, 16-byte alignment), and a reduction of at most R_PINGPONG_MAX_N.  MOE_SM90_ROWS_PINGPONG=0 turns it off
// and =1 drops both size rules, as MOE_MLP_FUSE_GATE=1 does; MOE_MLP_FUSE_GATE=0 and MOE_CUDA_KERNEL=simt|sm80 turn
// it off too, so that the MLP's unfused path is the 128 x 256 kernel's (mlp-gpu-time and test_gpu_mlp compare the
// two bit for bit).
moe_status rows_f32_pingpong(const MoeRowsGemm *r, int *taken)
{
    *taken = 0;
    const int sw = env_switch("MOE_SM90_ROWS_PINGPONG");
    if (sw == 0)
        return MOE_OK;
    const bool required = sw == 1 || gate_fusion_required(), dx_form = r->op == OP_DX;
    const int64_t reduction = dx_form ? r->N : r->K, out_cols = dx_form ? r->K : r->N;
    const bool form_ok = (dx_form || r->op == OP_FWD) && r->out_dtype == MOE_F32;
    if (gate_fusion_refusal(r, form_ok, reduction, out_cols, required, {r->out}) != NULL ||
        (!required && reduction > R_PINGPONG_MAX_N))
        return MOE_OK;
    RowsF32Maps maps = {};
    const uint64_t es = 2, N = (uint64_t)r->N, K = (uint64_t)r->K, rows = (uint64_t)r->rows, E = (uint64_t)r->E;
    const uint64_t red = (uint64_t)reduction, cols = (uint64_t)out_cols;
    const uint64_t dims_a[2] = {red, rows}, strides_a[1] = {red * es};
    const uint32_t box_a[2] = {(uint32_t)H_BK, (uint32_t)G_BM};
    const uint64_t dims_w[3] = {K, N, E}, strides_w[2] = {K * es, N * K * es};
    const uint32_t box_w[3] = {64, 64, 1};
    const uint64_t dims_o[3] = {cols, rows, 1}, strides_o[2] = {cols * 4, rows * cols * 4};
    const uint32_t box_o[3] = {32, 64, 1};
    if (!encode_tensor_map(&maps.rows_a, r->dtype, r->a, 2, dims_a, strides_a, box_a) ||
        !encode_tensor_map(&maps.w, r->dtype, r->b, 3, dims_w, strides_w, box_w) ||
        !encode_tensor_map(&maps.out, MOE_F32, r->out, 3, dims_o, strides_o, box_o))
        return MOE_OK;
    *taken = 1;
    cudaStream_t stream = static_cast<cudaStream_t>(r->stream);
    const int64_t col_tiles = (out_cols + R_BN - 1) / R_BN;
    return with_tile_starts(r, col_tiles, G_BM, false, [&](int64_t *tile_start, int64_t *lone_start,
                                                            unsigned long long *tile_counter) {
        GemmArgs g = rows_gemm_args(r, r->op, out_cols, tile_start, lone_start, tile_counter);
        g.full_blocks = env_switch("MOE_SM90_FULL_BLOCKS") != 0; // tiles of one length, as the gate/up kernel's
        const int64_t max_tiles = (r->rows / G_BM + r->E) * col_tiles;
        auto kernel = r->dtype == MOE_BF16
                          ? (dx_form ? sm90_rows_f32_kernel<__nv_bfloat16, 1> : sm90_rows_f32_kernel<__nv_bfloat16, 0>)
                          : (dx_form ? sm90_rows_f32_kernel<__half, 1> : sm90_rows_f32_kernel<__half, 0>);
        MOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)R_SMEM_BYTES));
        kernel<<<(unsigned)sm90_grid_cap((int64_t)persistent_grid(max_tiles)), H_THREADS, R_SMEM_BYTES, stream>>>(g,
                                                                                                                  maps);
        MOE_CUDA_CHECK(cudaGetLastError());
        return MOE_OK;
    });
}

} // namespace

moe_status moe_cuda_rows_gemm(const MoeRowsGemm *r)
{
    static_assert((int)MOE_ROWS_A_WT == (int)OP_FWD && (int)MOE_ROWS_A_W == (int)OP_DX && (int)MOE_ROWS_AT_B == (int)OP_DW,
                  "op numbering");
    int taken = 0;
    const moe_status pingpong = rows_f32_pingpong(r, &taken);
    if (taken || pingpong != MOE_OK)
        return pingpong;
    cudaStream_t stream = static_cast<cudaStream_t>(r->stream);
    const int op = r->op;
    moe_gemm_problem p = {};
    p.op = r->name;
    p.num_tokens = r->rows, p.topk = 1, p.num_experts = r->E, p.rows = r->rows, p.N = r->N, p.K = r->K;
    p.dtype = r->dtype, p.dw_dtype = r->out_dtype, p.accumulate = r->accumulate, p.stream = r->stream;
    GemmArgs planned = {};
    Plan plan;
    moe_status status = plan_gemm(&p, op, r->a, r->b, r->out, r->out_dtype, false, &planned, &plan);
    if (status != MOE_OK)
        return status;
    const int64_t cols_j = op == OP_FWD ? r->N : r->K;
    const int64_t col_tiles = (cols_j + plan.bn - 1) / plan.bn;
    return with_tile_starts(r, col_tiles, plan.bm, plan.cluster > 1, [&](int64_t *tile_start, int64_t *lone_start,
                                                                               unsigned long long *tile_counter) {
        GemmArgs g = rows_gemm_args(r, op, cols_j, tile_start, lone_start, tile_counter);
        // what plan_gemm decided (tensor-map flags, dynamic tiles)
        g.tma_rows = planned.tma_rows, g.tma_out = planned.tma_out, g.tma_out_wide = planned.tma_out_wide;
        g.dynamic_tiles = planned.dynamic_tiles, g.full_blocks = planned.full_blocks;
        g.partial_stride = col_tiles;
        return launch_plan(plan, op, g, max_tiles_of(op, r->E, r->rows, r->N, plan.bm, col_tiles), stream);
    });
}

moe_status moe_cuda_rows_gate_gemm(const MoeRowsGemm *r, const MoeGateEpilogue *epi, int *taken)
{
    *taken = 0;
    const bool required = gate_fusion_required();
    const int64_t E = r->E, rows = r->rows, H = r->N, I = epi->I, B = epi->B, blocks = epi->num_blocks;
    const char *why = gate_fusion_refusal(r, r->op == MOE_ROWS_A_W && r->K == 2 * I, H, I, required,
                                          {epi->m_rows, epi->m0_rows});
    GateMaps maps = {};
    const uint64_t es = 2;
    if (why == NULL) {
        const uint64_t dims_a[2] = {(uint64_t)H, (uint64_t)rows}, strides_a[1] = {(uint64_t)H * es};
        const uint32_t box_a[2] = {(uint32_t)H_BK, (uint32_t)G_BM};
        const uint64_t dims_w[3] = {(uint64_t)(2 * I), (uint64_t)H, (uint64_t)E},
                       strides_w[2] = {(uint64_t)(2 * I) * es, (uint64_t)(H * 2 * I) * es};
        const uint64_t dims_m[3] = {(uint64_t)I, (uint64_t)rows, 1},
                       strides_m[2] = {(uint64_t)I * es, (uint64_t)(rows * I) * es};
        const uint32_t box_64[3] = {64, 64, 1};
        if (!encode_tensor_map(&maps.rows_a, r->dtype, r->a, 2, dims_a, strides_a, box_a) ||
            !encode_tensor_map(&maps.w, r->dtype, r->b, 3, dims_w, strides_w, box_64) ||
            !encode_tensor_map(&maps.m_rows, r->dtype, epi->m_rows, 3, dims_m, strides_m, box_64))
            why = "a tensor map was refused";
    }
    if (why != NULL)
        return required ? moe_fail(MOE_ERR_UNSUPPORTED, "%s: MOE_MLP_FUSE_GATE=1 but the fused kernel cannot take "
                                                        "this call: %s", r->name, why)
                        : MOE_OK;
    GateArgs ep = {};
    if (epi->ckpt != nullptr && B % 8 == 0 && aligned16(epi->ckpt) && blocks > 0) {
        const uint64_t dims_c[3] = {(uint64_t)B, (uint64_t)(blocks * 2 * I), 1},
                       strides_c[2] = {(uint64_t)B * es, (uint64_t)(blocks * 2 * I * B) * es};
        const uint32_t box_64[3] = {64, 64, 1};
        ep.ckpt_boxes = encode_tensor_map(&maps.ckpt, r->dtype, epi->ckpt, 3, dims_c, strides_c, box_64);
    }
    ep.on_i = epi->on_i, ep.bias = epi->bias != nullptr;
    ep.I = I, ep.B = B, ep.E = epi->num_experts;
    ep.row_pos = epi->row_pos, ep.ids = epi->ids, ep.aff = epi->affinities, ep.b_gu = epi->bias;
    ep.has_nl_lo = epi->has_nl_lo, ep.has_nl_hi = epi->has_nl_hi, ep.has_lin_lo = epi->has_lin_lo;
    ep.has_lin_hi = epi->has_lin_hi;
    ep.nl_lo = epi->nl_lo, ep.nl_hi = epi->nl_hi, ep.lin_lo = epi->lin_lo, ep.lin_hi = epi->lin_hi;
    ep.m_rows = epi->m_rows, ep.ckpt = epi->ckpt, ep.m0_rows = epi->m0_rows;
    // MOE_MLP_GATE_PLAIN=0: the general instance for every call (A/B runs)
    const bool plain = !ep.on_i && !ep.bias && !ep.has_nl_lo && !ep.has_nl_hi && !ep.has_lin_lo && !ep.has_lin_hi &&
                       ep.m0_rows == nullptr && env_switch("MOE_MLP_GATE_PLAIN") != 0;

    cudaStream_t stream = static_cast<cudaStream_t>(r->stream);
    const int64_t col_tiles = (I + G_BI - 1) / G_BI;
    *taken = 1;
    return with_tile_starts(r, col_tiles, G_BM, false, [&](int64_t *tile_start, int64_t *lone_start,
                                                                     unsigned long long *tile_counter) {
        // the dX form: out = a . W[e], reduction over N = H; column tiles of 64 i (gate and up)
        GemmArgs g = rows_gemm_args(r, OP_DX, I, tile_start, lone_start, tile_counter);
        g.out_dtype = r->dtype, g.out = nullptr;
        g.full_blocks = env_switch("MOE_SM90_FULL_BLOCKS") != 0; // tiles of one length (gate_sm90.cuh): always
        const int64_t max_tiles = (rows / G_BM + E) * col_tiles;
        return r->dtype == MOE_BF16 ? launch_gate_up<__nv_bfloat16>(epi->act, g, ep, plain, maps, max_tiles, stream)
                                    : launch_gate_up<__half>(epi->act, g, ep, plain, maps, max_tiles, stream);
    });
}

moe_status moe_cuda_gemm_fwd(const moe_gemm_problem *p, const void *x, const void *w, const void *topk_weights,
                             void *y)
{
    return run_gemm(p, OP_FWD, x, w, topk_weights, nullptr, y);
}

moe_status moe_cuda_gemm_dx(const moe_gemm_problem *p, const void *dy, const void *w, const void *topk_weights,
                            void *dx)
{
    return run_gemm(p, OP_DX, dy, w, topk_weights, nullptr, dx);
}

moe_status moe_cuda_gemm_dw(const moe_gemm_problem *p, const void *x, const void *dy, const void *topk_weights,
                            void *dw)
{
    return run_gemm(p, OP_DW, dy, x, topk_weights, nullptr, dw);
}

moe_status moe_cuda_gemm_topk_weights_grad(const moe_gemm_problem *p, const void *x, const void *w, const void *dy,
                                           void *d_topk_weights)
{
    return run_gemm(p, OP_TOPK_GRAD, x, w, nullptr, dy, d_topk_weights);
}

static const char *device_error_text(int kind)
{
    switch (kind) {
    case DEVICE_NEGATIVE_SIZE: return "routing.m_sizes[%lld] = %lld, expected >= 0";
    case DEVICE_SIZES_SUM: return "routing.m_sizes[0..%lld] sums to %lld, expected T*k";
    case DEVICE_GATHER_RANGE: return "routing.gather_indices[%lld] = %lld, expected a slot in [0, T*k)";
    case DEVICE_GATHER_REPEAT: return "routing.gather_indices[%lld] = %lld repeats an earlier entry";
    }
    return "unknown device error %lld %lld";
}

moe_status moe_cuda_synchronize(void *stream)
{
    MOE_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
    DeviceError record;
    MOE_CUDA_CHECK(cudaMemcpyFromSymbol(&record, g_sticky_error, sizeof record));
    if (record.kind == DEVICE_OK)
        return MOE_OK;
    const DeviceError cleared = {};
    MOE_CUDA_CHECK(cudaMemcpyToSymbol(g_sticky_error, &cleared, sizeof cleared));
    static const char *const ops[] = {"moe_gemm_fwd", "moe_gemm_dx", "moe_gemm_dw", "moe_gemm_topk_weights_grad"};
    char detail[256];
    snprintf(detail, sizeof detail, device_error_text(record.kind), record.index, record.value);
    return moe_fail(MOE_ERR_INVALID_ROUTING, "%s (CUDA, detected on the device; the call wrote nothing): %s",
                    record.op >= 0 && record.op < 4 ? ops[record.op] : "?", detail);
}

// ------------------------------------------------------------------------------------------------
// Autotuning hooks (the driver is src/autotune.c)
// ------------------------------------------------------------------------------------------------
// (declared in moe_backend.h under MOE_HAVE_CUDA, which this file's compile does not see: hence the
// explicit C linkage)
extern "C" {
void moe_cuda_tune_force(const moe_tune_choice *choice) { tune_forced = choice; }

int moe_cuda_tune_last(moe_tune_key *key, moe_tune_choice *choice)
{
    if (!tune_planned)
        return 0;
    *key = tune_last_key;
    *choice = tune_last_choice;
    return 1;
}

// Events are recorded around each call and read after the last round: one synchronisation for the whole timing.
// The candidates are timed in rounds: each round runs every candidate once, in turn, so that every candidate
// sees the same spread of the GPU's clock and thermal state (as bench/device-ab.sh alternates its variants)
// instead of one block of runs each.  Each timed call follows a rewrite of `flush` (flush_bytes, several times
// the L2), so that it starts with none of its operands in L2, as in a training step, where other work runs
// between two calls of one GEMM, and as bench/moe-bench times (after triton.testing.do_bench).  Timed in blocks,
// back to back and then also with the flush, the autotune took the dW ping-pong kernel at Mixtral-8x7B down
// (T = 4096), which moe-bench, alternating the two kernels, times slower than the rule's; in rounds it takes
// the rule's (H200; bench/RESULTS.md, "the heuristic's knobs on an H200").
static moe_status time_rounds_with(cudaStream_t stream, moe_status (*run)(void *, int), void *context, int candidates,
                                   int repeats, cudaEvent_t *events, void *flush, size_t flush_bytes, double *median_us)
{
    for (int c = 0; c < candidates; c++) { // warm-up
        const moe_status status = run(context, c);
        if (status != MOE_OK)
            return status;
    }
    for (int r = 0; r < repeats; r++)
        for (int c = 0; c < candidates; c++) {
            cudaEvent_t *pair = events + 2 * ((int64_t)c * repeats + r);
            MOE_CUDA_CHECK(cudaMemsetAsync(flush, (r * candidates + c) & 0xff, flush_bytes, stream));
            MOE_CUDA_CHECK(cudaEventRecord(pair[0], stream));
            const moe_status status = run(context, c);
            if (status != MOE_OK)
                return status;
            MOE_CUDA_CHECK(cudaEventRecord(pair[1], stream));
        }
    MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    double *ms = static_cast<double *>(malloc((size_t)repeats * sizeof(double)));
    if (ms == nullptr)
        return moe_fail(MOE_ERR_OUT_OF_MEMORY, "moe_gemm_autotune: no memory for %d timings", repeats);
    for (int c = 0; c < candidates; c++) {
        for (int r = 0; r < repeats; r++) {
            const cudaEvent_t *pair = events + 2 * ((int64_t)c * repeats + r);
            float elapsed = 0.0f;
            const cudaError_t err = cudaEventElapsedTime(&elapsed, pair[0], pair[1]);
            if (err != cudaSuccess) {
                free(ms);
                return moe_fail(MOE_ERR_DEVICE, "moe_gemm_autotune: cudaEventElapsedTime failed: %s",
                                cudaGetErrorString(err));
            }
            ms[r] = elapsed;
        }
        for (int i = 1; i < repeats; i++) // insertion sort: repeats <= 1000
            for (int j = i; j > 0 && ms[j - 1] > ms[j]; j--) {
                const double t = ms[j];
                ms[j] = ms[j - 1], ms[j - 1] = t;
            }
        median_us[c] = 1000.0 * (repeats % 2 ? ms[repeats / 2] : 0.5 * (ms[repeats / 2 - 1] + ms[repeats / 2]));
    }
    free(ms);
    return MOE_OK;
}

moe_status moe_cuda_time_rounds(void *stream, moe_status (*run)(void *context, int candidate), void *context,
                                int candidates, int repeats, double *median_us)
{
    if (repeats < 1 || repeats > 1000)
        return moe_fail(MOE_ERR_INVALID_OPTION, "moe_gemm_autotune: repeats = %d, expected 1 .. 1000", repeats);
    if (candidates < 1 || candidates > 64)
        return moe_fail(MOE_ERR_INVALID_OPTION, "moe_gemm_autotune: %d candidates, expected 1 .. 64", candidates);
    const size_t event_count = (size_t)2 * candidates * repeats;
    cudaEvent_t *events = static_cast<cudaEvent_t *>(calloc(event_count, sizeof(cudaEvent_t)));
    if (events == nullptr)
        return moe_fail(MOE_ERR_OUT_OF_MEMORY, "moe_gemm_autotune: no memory for %zu events", event_count);
    moe_status status = MOE_OK;
    size_t created = 0;
    for (; created < event_count; created++) {
        const cudaError_t err = cudaEventCreate(&events[created]);
        if (err != cudaSuccess) {
            status = moe_fail(MOE_ERR_DEVICE, "moe_gemm_autotune: cudaEventCreate failed: %s", cudaGetErrorString(err));
            break;
        }
    }
    // the L2 flush buffer: four times the device's L2 (200-240 MB on an H100 / H200)
    void *flush = nullptr;
    size_t flush_bytes = 0;
    if (status == MOE_OK) {
        int device = 0, l2_bytes = 0;
        cudaError_t err = cudaGetDevice(&device);
        if (err == cudaSuccess)
            err = cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device);
        if (err != cudaSuccess)
            status = moe_fail(MOE_ERR_DEVICE, "moe_gemm_autotune: the L2 size query failed: %s",
                              cudaGetErrorString(err));
        flush_bytes = 4 * (size_t)(l2_bytes > 0 ? l2_bytes : 1 << 20);
        if (status == MOE_OK && (err = cudaMalloc(&flush, flush_bytes)) != cudaSuccess) {
            flush = nullptr;
            status = moe_fail(err == cudaErrorMemoryAllocation ? MOE_ERR_OUT_OF_MEMORY : MOE_ERR_DEVICE,
                              "moe_gemm_autotune: no device memory for the %zu-byte buffer that flushes the L2 "
                              "before each timed call (four times the L2): %s",
                              flush_bytes, cudaGetErrorString(err));
        }
    }
    if (status == MOE_OK)
        status = time_rounds_with(static_cast<cudaStream_t>(stream), run, context, candidates, repeats, events, flush,
                                  flush_bytes, median_us);
    if (flush != nullptr) {
        const cudaError_t err = cudaFree(flush); // synchronises with the timed calls
        if (err != cudaSuccess && status == MOE_OK)
            status = moe_fail(MOE_ERR_DEVICE, "moe_gemm_autotune: cudaFree of the L2 flush buffer failed: %s",
                              cudaGetErrorString(err));
    }
    for (size_t i = 0; i < created; i++)
        cudaEventDestroy(events[i]); // best effort: a failure here changes no result
    free(events);
    return status;
}

} // extern "C"
