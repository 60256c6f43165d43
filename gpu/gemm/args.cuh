// The grouped GEMM as its kernels see it: the op and its operands (GemmArgs), the call's device workspace and
// the tile decomposition (tile -> expert, tile row, tile column) that every kernel family shares.
#ifndef LIBMOE_GPU_GEMM_ARGS_CUH
#define LIBMOE_GPU_GEMM_ARGS_CUH

#include <stdint.h>

#include "common/dtype.cuh"

extern "C" {
#include "moe_backend.h"
}

namespace moe_gpu {

// Each call owns a small device workspace; its `status` word makes the GEMM kernels of the same call skip all
// work (never reading out of bounds) once the routing check (gemm/routing_check.cu) found an error.
struct Workspace {
    int64_t *offsets;     // [E+1] expert row offsets
    int64_t *tile_start;  // [E+1] first tile of each expert (row-tiled ops); paired sm90 kernel: first pair unit
    int64_t *lone_start;  // [E+1] first lone tile of each expert (paired sm90 kernel; all 0 otherwise)
    unsigned long long *tile_counter; // tiles taken after the CTAs' first (sm90 dynamic tiles), zeroed as status
    unsigned *seen;       // [M/32+1] permutation bitmap
    int *status;          // this call's status (RoutingErrorKind, gemm/routing_check.cu)
};

// The tiles of an expert with m rows, in tile_start units: row tiles of rows_per_tile times col_tiles; for
// the paired sm90 kernel (paired != 0) the pairs of row tiles, the odd last row tile counted in lone_tiles.
__host__ __device__ __forceinline__ int64_t expert_tiles(int64_t m, int64_t rows_per_tile, int64_t col_tiles,
                                                         int paired, int64_t *lone_tiles)
{
    const int64_t row_tiles = (m + rows_per_tile - 1) / rows_per_tile;
    *lone_tiles = paired ? row_tiles % 2 * col_tiles : 0;
    return (paired ? row_tiles / 2 : row_tiles) * col_tiles;
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
    int tma_rows;           // sm90: the row operands are contiguous and come by TMA (see gemm/sm90.cu)
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

// The paired sm90 kernel (gemm/sm90.cu: clusters of two CTAs), unit -> the tile of the CTA of cluster rank
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

} // namespace moe_gpu

#endif
