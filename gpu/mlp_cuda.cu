// CUDA blockwise MoE MLP: forward with checkpoints and the full backward (SEMANTICS section 3,
// specs/MLP.md; the contract is in gpu/mlp_cuda.h).  The CPU reference (ref/mlp.c) is the oracle.
//
// Two paths share the layout check, the token lists and the reductions:
//   - the tile path (float32 intermediates, the default, for f16 and f32): the kernels listed below;
//   - the rows path (options.round_intermediates with f16/bf16, and bf16 without it on split operands):
//     every GEMM on the grouped GEMM's tensor-core kernels over the layout's real positions grouped by
//     expert; see "Rows path" and "Split operands" below.
//
// One call is a fixed sequence of kernels on options.stream, nothing synchronised with the host:
//
//   layout check (every call)
//     init_kernel          pair_pos[T*E] = tok_first[T] = NONE, the error reports = NONE
//     check_kernel         block_to_expert / token ids in range; pair_pos[t*E+e] = min position of the pair
//                          (integer atomicMin: the result does not depend on the schedule)
//     repeat_kernel        a position that is not its pair's minimum repeats the pair (and likewise for
//                          a token under tensor_update_overwrite); the smallest such position is reported
//     finalize_kernel      picks the first error in the reference's order (block_to_expert, ids, pairs,
//                          top-1), sets this call's status word and the sticky record; every later
//                          kernel returns at once when the status word is set, so nothing is written
//     expert_lists_kernel  expert_blocks: the blocks of each expert in ascending block order
//   forward
//     GateUp tiles         per block: X_b . W_gu[e] (gate and up columns of the same i in one tile), bias,
//                          clamp, gate_up_ckpt_T, m = act(g)*u (ON_I: *a) -> M scratch
//     Down tiles           per block: M . W_d[e], bias, down_ckpt, per-position contribution a*d (ON_I:
//                          d + a*b_d) -> contrib scratch; ON_I with a down checkpoint: a second pass from
//                          the unscaled m (M0) writes the checkpoint
//     token_lists_kernel   each token's positions (rows on the rows path) in ascending expert order
//     token_rows_kernel    out[t] = the contributions of t's positions summed in that order
//   backward
//     Dm tiles             per block: dM = (a*G) . W_d[e]^T (ON_I: a * (G . W_d^T)); epilogue from the
//                          rounded checkpoint: m -> M, masked dg, du -> dGU scratch
//     (ON_I without a down checkpoint: Down tiles from M0 recompute d -> Dre scratch)
//     dot_kernel           da[pos] = <G, d>
//     Dx tiles             per block: dGU . W_gu[e]^T -> contrib scratch (one row per position)
//     DwD / DwGu tiles     per expert: M^T . (a*G) and X^T . dGU over the expert's positions, in
//                          ascending position order; one CTA owns an output tile (no atomics)
//     bias_grad_kernel     db_d, db_gu: column sums over the expert's positions, ascending
//     token_rows_kernel    d_hidden rows (ascending expert order);  daff_kernel: d_affinities rows
//
// Every GEMM-shaped step runs through one SIMT fp32 tile engine (tile_kernel<Op>): 64 x 64 output
// tiles, K staged 16 deep through shared memory as float32 (inputs of any dtype converted on load),
// 256 threads each owning 4 x 4 outputs and accumulating with fp32 FMA in ascending k.  The Op supplies
// the tile decomposition, the two operand element loaders (gathers, affinity scaling, zero for padding)
// and the epilogue.  Each output element is produced by exactly one thread with a reduction order fixed
// by the layout, so results are bitwise reproducible.  (The rows path uses tensor cores for bf16/f16.)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <type_traits>

#include "act_cuda.cuh"
#include "cp_async_cuda.cuh"
#include "cuda_check.cuh"
#include "dtype_cuda.cuh"
#include "gemm_cuda.cuh"
#include "mlp_cuda.h"
#include "warp_scan_cuda.cuh"

namespace {

// ------------------------------------------------------------------------------------------------
// The call as the kernels see it
// ------------------------------------------------------------------------------------------------
constexpr long long NONE = LLONG_MAX; // "no position" in pair_pos / tok_first / the reports

enum ErrorKind : int { ERR_NONE = 0, ERR_EXPERT = 1, ERR_TOKEN = 2, ERR_PAIR = 3, ERR_TOP1 = 4 };
enum Report : int { REP_EXPERT = 0, REP_TOKEN = 1, REP_PAIR = 2, REP_TOP1 = 3, REPORTS = 4 };

struct DeviceError {
    int kind;        // ErrorKind
    int op;          // 0 = moe_mlp_fwd, 1 = moe_mlp_bwd
    long long index; // the block (ERR_EXPERT) or position
    long long value; // its block_to_expert / token id
    long long other; // ERR_PAIR, ERR_TOP1: the earlier position of the same pair / token
    long long expert;
    long long T, E, B, pad;
};

__device__ DeviceError g_mlp_sticky_error;

struct MlpArgs {
    moe_dtype dt;  // every tensor but the weight/bias gradients
    moe_dtype gdt; // d_w_gu, d_w_d, d_b_gu, d_b_d
    int64_t T, E, N, B, H, I, NB, token_rows, pad;
    int act, on_i, bias, accumulate, overwrite, op;
    int has_lin_lo, has_lin_hi, has_nl_lo, has_nl_hi;
    float lin_lo, lin_hi, nl_lo, nl_hi; // forward: the limits; backward: rounded to dt (mask limits)
    const int64_t *b2e, *ids;
    const void *hidden, *aff, *w_gu, *w_d, *b_gu, *b_d, *out_grad, *ckpt_gu_in, *ckpt_d_in;
    void *out, *ckpt_gu, *ckpt_d, *d_hidden, *d_aff, *d_wgu, *d_wd, *d_bgu, *d_bd;
    // workspace
    int *status;
    long long *reports;   // [REPORTS]
    long long *pair_pos;  // [T*E]
    long long *tok_first; // [T] (tensor_update_overwrite only)
    int64_t *expert_start;  // [E+1]
    int64_t *expert_blocks; // [N]
    float *M;       // [NB][I]  m as the down projection uses it (ON_I: scaled by a)
    float *M0;      // [NB][I]  unscaled m (ON_I: forward with a down checkpoint; backward recomputing d)
    float *contrib; // [NB][H]  per-position rows: a*d (forward), dX (backward)
    float *dGU;     // [NB][2I]
    float *Dre;     // [NB][H]  recomputed d (ON_I backward without a down checkpoint)
    float *da;      // [NB]
    // The rows path (options.round_intermediates, see "Rows path" below): the layout's real positions
    // grouped by expert, expert e owning rows row_offsets[e] .. row_offsets[e+1]-1
    int64_t *block_rows;  // [N]    real positions of each block
    int64_t *block_first; // [N]    the row of each block's first real position
    int64_t *row_offsets; // [E+1]
    int64_t *row_pos;     // [NB]   position of each row (rows past row_offsets[E] unused)
    int64_t *pos_row;     // [NB]   row of each position, -1 for padding; NULL on the tile path
    void *Xr, *Mr, *M0r, *Sr, *dGUr; // dt rows: hidden, m, unscaled m, down-gradient operand, (dg, du)
    float *GU, *Dr, *dMr;            // float32 rows: gate/up (unfused forward only, its own allocation),
                                     // down (then a*d or dX), dM
    int dre_bias;                    // rows path: Dre rows lack the down bias (dot_kernel adds it)
    // The split path (bf16 without round_intermediates, see "Split operands" below): the operands Mr, M0r and
    // dGUr hold three exact bf16 terms of each float32 value, and they and the GEMMs' float32 rows Dr and Dre
    // are indexed by term rows (term_rows_of: [3 NB][width]); otherwise one value rounded to dt per row
    int split;
    // backward: the affinity scales m (d_w_d's operand) and dM, and Sr is G (ON_I, and ON_H on split
    // operands), instead of Sr = rnd(a*G)
    int a_in_m;
    // Split path: term_offsets [E+1] = 3 row_offsets, the term rows' grouping by expert; the backward's X3, S3:
    // hidden and G at term rows (each row copied to its three), the weight gradients' other operands.  NULL
    // otherwise.
    int64_t *term_offsets;
    void *X3, *S3;
    int64_t *tok_count;              // [T]    positions of each token
    int64_t *tok_list;               // [T*E]  their rows (tile path: positions), ascending expert order
    int64_t *tok_expert;             // [T*E]  the expert of each
};

__device__ __forceinline__ int64_t token_of(const MlpArgs &g, int64_t pos)
{
    const int64_t id = g.ids[pos];
    return id >= 0 && id < g.T ? id : -1;
}

// ------------------------------------------------------------------------------------------------
// Layout check and lists
// ------------------------------------------------------------------------------------------------
__global__ void init_kernel(MlpArgs g)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x, first = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    for (int64_t i = first; i < g.T * g.E; i += stride)
        g.pair_pos[i] = NONE;
    if (g.tok_first != nullptr)
        for (int64_t i = first; i < g.T; i += stride)
            g.tok_first[i] = NONE;
    if (first < REPORTS)
        g.reports[first] = NONE;
    if (first == 0)
        *g.status = ERR_NONE;
}

__global__ void check_kernel(MlpArgs g)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x, first = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    for (int64_t n = first; n < g.N; n += stride)
        if (g.b2e[n] < 0 || g.b2e[n] >= g.E)
            atomicMin(&g.reports[REP_EXPERT], (long long)n);
    for (int64_t p = first; p < g.NB; p += stride) {
        const int64_t id = g.ids[p], e = g.b2e[p / g.B];
        if (id == g.pad)
            continue;
        if (id < 0 || id >= g.T) {
            atomicMin(&g.reports[REP_TOKEN], (long long)p);
            continue;
        }
        if (e < 0 || e >= g.E)
            continue;
        atomicMin(&g.pair_pos[id * g.E + e], (long long)p);
        if (g.tok_first != nullptr)
            atomicMin(&g.tok_first[id], (long long)p);
    }
}

__global__ void repeat_kernel(MlpArgs g)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x, first = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    for (int64_t p = first; p < g.NB; p += stride) {
        const int64_t id = g.ids[p], e = g.b2e[p / g.B];
        if (id < 0 || id >= g.T || e < 0 || e >= g.E)
            continue;
        if (g.pair_pos[id * g.E + e] != p)
            atomicMin(&g.reports[REP_PAIR], (long long)p);
        if (g.tok_first != nullptr && g.tok_first[id] != p)
            atomicMin(&g.reports[REP_TOP1], (long long)p);
    }
}

__global__ void finalize_kernel(MlpArgs g)
{
    if (threadIdx.x != 0 || blockIdx.x != 0)
        return;
    DeviceError err = {};
    for (int r = 0; r < REPORTS && err.kind == ERR_NONE; r++) {
        const long long at = g.reports[r];
        if (at == NONE)
            continue;
        err.kind = r + 1;
        err.index = at;
        if (r == REP_EXPERT) {
            err.value = g.b2e[at];
            continue;
        }
        err.value = g.ids[at];
        if (r == REP_PAIR) {
            err.expert = g.b2e[at / g.B];
            err.other = g.pair_pos[err.value * g.E + err.expert];
        } else if (r == REP_TOP1) {
            err.other = g.tok_first[err.value];
        }
    }
    *g.status = err.kind;
    if (err.kind == ERR_NONE)
        return;
    err.op = g.op, err.T = g.T, err.E = g.E, err.B = g.B, err.pad = g.pad;
    if (atomicCAS(&g_mlp_sticky_error.kind, 0, -1) == 0) { // claim the record, then publish it
        DeviceError *rec = &g_mlp_sticky_error;
        rec->op = err.op, rec->index = err.index, rec->value = err.value, rec->other = err.other;
        rec->expert = err.expert, rec->T = err.T, rec->E = err.E, rec->B = err.B, rec->pad = err.pad;
        __threadfence();
        atomicExch(&rec->kind, err.kind);
    }
}

// Called by one whole warp: counts[1 .. n] (counts[0] not read) become running totals, counts[e] = the sum
// of the counts 1 .. e given, counts[0] = 0; 32 entries at a time by a shuffle scan, where a serial sum by
// one thread waited on each global load in turn (expert_lists_kernel and row_offsets_kernel ran faster under
// ncu; bench/RESULTS.md, "the routing's prefix sums as warp scans").  The caller synchronises the CTA before and
// after.
__device__ __forceinline__ void warp_prefix_sum(int64_t *counts, int64_t n)
{
    const int lane = threadIdx.x % 32;
    int64_t carry = 0; // the sum of the entries before e0
    for (int64_t e0 = 0; e0 < n; e0 += 32) {
        const bool inside = e0 + lane < n;
        const int64_t sum = warp_inclusive_sum(inside ? counts[e0 + lane + 1] : 0);
        if (inside)
            counts[e0 + lane + 1] = carry + sum;
        carry += warp_last_lane(sum);
    }
    if (lane == 0)
        counts[0] = 0;
}

// One CTA of 32 warps.  expert_start[e] .. expert_start[e+1]-1 index expert_blocks, which lists the
// blocks of expert e in ascending order: a stable counting sort of the blocks by expert, without atomics.
// Warp w owns the w-th of 32 contiguous segments of the blocks and walks it 32 blocks at a time; the lanes
// holding blocks of one expert find each other by __match_any_sync, and the group's lowest lane counts them.
// Experts go in windows of LIST_WINDOW (one window up to E = 128), with per warp and expert of the window a
// count in shared memory (counts[w][e - e0]):
//   1. per window: the segments' counts; thread j sums expert e0 + j's over the warps into expert_start[e + 1];
//   2. expert_start becomes the running totals (warp_prefix_sum);
//   3. per window: the counts again (with one window, E <= LIST_WINDOW, pass 1's, still in shared memory),
//      turned by thread j into each segment's first index of expert e0 + j (expert_start[e] + the blocks of e
//      in earlier segments); each warp then places its blocks from there, a group's lanes in lane order.
// The kernel this replaced had each warp scan every block once per expert of its own (twice), an instruction
// stream of E * N / 32 ballots on one SM; this one is several times faster with many experts or many blocks and
// slightly slower with E = 8 (ncu, H200; bench/RESULTS.md, "the expert lists as a counting sort").
constexpr int LIST_THREADS = 1024, LIST_WARPS = LIST_THREADS / 32, LIST_WINDOW = 128;

// Warp `warp`'s blocks of the window's experts: calls visit(n, e, group, lane_is_lowest) per chunk of 32 blocks
// for every lane holding block n of expert e in [e0, e0 + LIST_WINDOW) (group: the lanes of the chunk holding
// that expert's blocks).  Whole-warp calls only (every lane runs every chunk).
template <class Visit>
__device__ __forceinline__ void walk_segment(const MlpArgs &g, int warp, int64_t e0, Visit visit)
{
    const int lane = threadIdx.x % 32;
    const int64_t per_warp = (g.N + LIST_WARPS - 1) / LIST_WARPS;
    const int64_t begin = warp * per_warp, end = begin + per_warp < g.N ? begin + per_warp : g.N;
    for (int64_t n0 = begin; n0 < end; n0 += 32) {
        const int64_t n = n0 + lane;
        const int64_t e = n < end ? g.b2e[n] : -1;
        const bool inside = e >= e0 && e < e0 + LIST_WINDOW;
        const unsigned group = __match_any_sync(0xffffffffu, (unsigned long long)(inside ? e : -1));
        if (inside)
            visit(n, e, group, lane == __ffs(group) - 1);
        __syncwarp();
    }
}

__global__ void __launch_bounds__(LIST_THREADS) expert_lists_kernel(MlpArgs g)
{
    if (*g.status != ERR_NONE)
        return;
    __shared__ int64_t counts[LIST_WARPS][LIST_WINDOW];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, j = threadIdx.x;
    // this window's counts per warp (the CTA synchronised before and after)
    auto count_window = [&](int64_t e0) {
        for (int q = lane; q < LIST_WINDOW; q += 32)
            counts[warp][q] = 0;
        __syncwarp();
        walk_segment(g, warp, e0, [&](int64_t, int64_t e, unsigned group, bool lowest) {
            if (lowest)
                counts[warp][e - e0] += __popc(group);
        });
    };
    for (int64_t e0 = 0; e0 < g.E; e0 += LIST_WINDOW) {
        count_window(e0);
        __syncthreads();
        if (j < LIST_WINDOW && e0 + j < g.E) {
            int64_t total = 0;
            for (int w = 0; w < LIST_WARPS; w++)
                total += counts[w][j];
            g.expert_start[e0 + j + 1] = total;
        }
        __syncthreads();
    }
    if (warp == 0)
        warp_prefix_sum(g.expert_start, g.E);
    __syncthreads();
    for (int64_t e0 = 0; e0 < g.E; e0 += LIST_WINDOW) {
        if (g.E > LIST_WINDOW) // one window: pass 1's counts are still there (the prefix sum left them)
            count_window(e0);
        __syncthreads();
        if (j < LIST_WINDOW && e0 + j < g.E) {
            int64_t next = g.expert_start[e0 + j];
            for (int w = 0; w < LIST_WARPS; w++) {
                const int64_t c = counts[w][j];
                counts[w][j] = next;
                next += c;
            }
        }
        __syncthreads();
        walk_segment(g, warp, e0, [&](int64_t n, int64_t e, unsigned group, bool lowest) {
            int64_t &next = counts[warp][e - e0];
            g.expert_blocks[next + __popc(group & ((1u << lane) - 1u))] = n;
            __syncwarp(group);
            if (lowest)
                next += __popc(group);
        });
        __syncthreads();
    }
}

// ------------------------------------------------------------------------------------------------
// The tile engine
// ------------------------------------------------------------------------------------------------
constexpr int BM = 64, BN = 64, BK = 16, THREADS = 256;

// Per-tile facts.  Row-tiled ops (one block n, rows = slots i0.. of it): n, e, i0 = first slot, j0 =
// first output column, qlen = reduction length.  Expert ops (one expert e, rows = weight rows i0..,
// reduction over the expert's positions): eb0 = expert_start[e].
struct TileCoord {
    int64_t n, e, i0, j0, qlen, eb0;
};

// Positions of the tile's rows (row-tiled ops) or of the current reduction chunk (expert ops).
struct Rows {
    int64_t pos[BM]; // -1 past the end
    int64_t tok[BM]; // -1 for padding (or past the end)
    float a[BM];     // A[tok][e] (0 for padding)
};

__device__ __forceinline__ int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Row-tiled decomposition: per block ceil(B/BM) row tiles x col_tiles, column tiles fastest.
__device__ __forceinline__ TileCoord row_tile(const MlpArgs &g, int64_t tile, int64_t col_tiles, int64_t col_width,
                                              int64_t qlen)
{
    const int64_t row_tiles = cdiv(g.B, BM);
    TileCoord t;
    t.n = tile / (row_tiles * col_tiles);
    const int64_t local = tile % (row_tiles * col_tiles);
    t.i0 = local / col_tiles * BM;
    t.j0 = local % col_tiles * col_width;
    t.e = g.b2e[t.n];
    t.qlen = qlen;
    t.eb0 = 0;
    return t;
}

// Expert decomposition: per expert row_tiles x col_tiles, row tiles fastest.
__device__ __forceinline__ TileCoord expert_tile(const MlpArgs &g, int64_t tile, int64_t rows, int64_t cols)
{
    const int64_t row_tiles = cdiv(rows, BM), col_tiles = cdiv(cols, BN);
    TileCoord t;
    t.e = tile / (row_tiles * col_tiles);
    const int64_t local = tile % (row_tiles * col_tiles);
    t.i0 = local % row_tiles * BM;
    t.j0 = local / row_tiles * BN;
    t.n = -1;
    t.eb0 = g.expert_start[t.e];
    t.qlen = (g.expert_start[t.e + 1] - t.eb0) * g.B;
    return t;
}

// Fills rows.{pos,tok,a}[i] for the slots i0 + i (i < count) of block n (row ops).
__device__ __forceinline__ void fill_block_rows(const MlpArgs &g, const TileCoord &t, Rows &rows)
{
    for (int i = threadIdx.x; i < BM; i += blockDim.x) {
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

// Fills rows for the reduction chunk q0 .. q0+BK-1 of an expert op (q = local position index).
__device__ __forceinline__ void fill_expert_chunk(const MlpArgs &g, const TileCoord &t, int64_t q0, Rows &rows)
{
    for (int q = threadIdx.x; q < BK; q += blockDim.x) {
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
//   coord(g, tile)      the TileCoord of a tile (the host computes the tile count)
//   EXPERT              true: fill_expert_chunk per K chunk (rows = the chunk); false: fill_block_rows once
//   a(g, t, rows, i, q, ql), b(g, t, rows, q, j, ql)   operands as float (0 outside), ql = q - q0
//   epilogue(g, t, rows, acc, tx, ty)   thread (tx, ty) owns rows ty + 16u, columns tx + 16v
template <class Op>
__global__ void __launch_bounds__(THREADS) tile_kernel(MlpArgs g, int64_t tiles)
{
    __shared__ float sa[BK][BM + 4];
    __shared__ float sb[BK][BN + 4];
    __shared__ Rows rows;
    if (*g.status != ERR_NONE)
        return;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const TileCoord t = Op::coord(g, tile);
        if (!Op::EXPERT)
            fill_block_rows(g, t, rows);
        float acc[4][4] = {};
        for (int64_t q0 = 0; q0 < t.qlen; q0 += BK) {
            if (Op::EXPERT)
                fill_expert_chunk(g, t, q0, rows);
            __syncthreads();
            for (int idx = threadIdx.x; idx < BK * BM; idx += THREADS) {
                const int i = Op::A_QC ? idx / BK : idx % BM, q = Op::A_QC ? idx % BK : idx / BM;
                sa[q][i] = q0 + q < t.qlen ? Op::a(g, t, rows, i, q0 + q, q) : 0.0f;
            }
            for (int idx = threadIdx.x; idx < BK * BN; idx += THREADS) {
                const int j = Op::B_QC ? idx / BK : idx % BN, q = Op::B_QC ? idx % BK : idx / BN;
                sb[q][j] = q0 + q < t.qlen ? Op::b(g, t, rows, q0 + q, j, q) : 0.0f;
            }
            __syncthreads();
#pragma unroll
            for (int q = 0; q < BK; q++) {
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

// ---- forward: gate/up projection.  A tile covers 32 values of i: columns 0..31 the gate (j = i),
// 32..63 the up projection (j = I + i), so that the thread owning g[i] also owns u[i].
struct OpGateUp {
    static constexpr bool A_QC = true, B_QC = false, EXPERT = false;
    static __device__ TileCoord coord(const MlpArgs &g, int64_t tile) { return row_tile(g, tile, cdiv(g.I, 32), 32, g.H); }
    static __device__ float a(const MlpArgs &g, const TileCoord &, const Rows &rows, int i, int64_t h, int)
    {
        return rows.tok[i] >= 0 ? load_as_float(g.dt, g.hidden, rows.tok[i] * g.H + h) : 0.0f;
    }
    static __device__ float b(const MlpArgs &g, const TileCoord &t, const Rows &, int64_t h, int c, int)
    {
        const int64_t i = t.j0 + (c & 31);
        if (i >= g.I)
            return 0.0f;
        return load_as_float(g.dt, g.w_gu, (t.e * g.H + h) * 2 * g.I + (c < 32 ? i : g.I + i));
    }
    static __device__ void epilogue(const MlpArgs &g, const TileCoord &t, const Rows &rows, const float (&acc)[4][4],
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
    static __device__ TileCoord coord(const MlpArgs &g, int64_t tile) { return row_tile(g, tile, cdiv(g.H, BN), BN, g.I); }
    static __device__ float a(const MlpArgs &g, const TileCoord &, const Rows &rows, int i, int64_t q, int)
    {
        if (rows.tok[i] < 0)
            return 0.0f;
        const float *m = MODE == DOWN_FORWARD ? g.M : g.M0;
        return m[rows.pos[i] * g.I + q];
    }
    static __device__ float b(const MlpArgs &g, const TileCoord &t, const Rows &, int64_t q, int j, int)
    {
        const int64_t h = t.j0 + j;
        return h < g.H ? load_as_float(g.dt, g.w_d, (t.e * g.I + q) * g.H + h) : 0.0f;
    }
    static __device__ void epilogue(const MlpArgs &g, const TileCoord &t, const Rows &rows, const float (&acc)[4][4],
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

// dD = a * G (ON_H: the down-projection gradient input; ON_I: db_d's terms), or G itself (ON_I's dM and
// dW_d input).
__device__ __forceinline__ float scaled_grad(const MlpArgs &g, int64_t tok, float a, int64_t h, bool scale)
{
    const float G = load_as_float(g.dt, g.out_grad, tok * g.H + h);
    return scale ? a * G : G;
}

// ---- backward: dM = dD . W_d[e]^T, then the gate/up gradients in the epilogue
struct OpDm {
    static constexpr bool A_QC = true, B_QC = true, EXPERT = false;
    static __device__ TileCoord coord(const MlpArgs &g, int64_t tile) { return row_tile(g, tile, cdiv(g.I, BN), BN, g.H); }
    static __device__ float a(const MlpArgs &g, const TileCoord &, const Rows &rows, int i, int64_t h, int)
    {
        return rows.tok[i] >= 0 ? scaled_grad(g, rows.tok[i], rows.a[i], h, !g.on_i) : 0.0f;
    }
    static __device__ float b(const MlpArgs &g, const TileCoord &t, const Rows &, int64_t h, int j, int)
    {
        const int64_t i = t.j0 + j;
        return i < g.I ? load_as_float(g.dt, g.w_d, (t.e * g.I + i) * g.H + h) : 0.0f;
    }
    static __device__ void epilogue(const MlpArgs &g, const TileCoord &t, const Rows &rows, const float (&acc)[4][4],
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
    static __device__ TileCoord coord(const MlpArgs &g, int64_t tile) { return row_tile(g, tile, cdiv(g.H, BN), BN, 2 * g.I); }
    static __device__ float a(const MlpArgs &g, const TileCoord &, const Rows &rows, int i, int64_t j, int)
    {
        return rows.tok[i] >= 0 ? g.dGU[rows.pos[i] * 2 * g.I + j] : 0.0f;
    }
    static __device__ float b(const MlpArgs &g, const TileCoord &t, const Rows &, int64_t j, int c, int)
    {
        const int64_t h = t.j0 + c;
        return h < g.H ? load_as_float(g.dt, g.w_gu, (t.e * g.H + h) * 2 * g.I + j) : 0.0f;
    }
    static __device__ void epilogue(const MlpArgs &g, const TileCoord &t, const Rows &rows, const float (&acc)[4][4],
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

// One weight-gradient element: overwritten, or round(old + sum) with accumulate.
__device__ __forceinline__ void store_grad(const MlpArgs &g, void *dst, int64_t index, float v)
{
    if (g.accumulate)
        v = load_as_float(g.gdt, dst, index) + v;
    store_from_float(g.gdt, dst, index, v);
}

// ---- backward: dW_d[e] = M^T . dD over the expert's positions (ON_I: (a*m)^T . G)
struct OpDwD {
    static constexpr bool A_QC = false, B_QC = false, EXPERT = true;
    static __device__ TileCoord coord(const MlpArgs &g, int64_t tile) { return expert_tile(g, tile, g.I, g.H); }
    static __device__ float a(const MlpArgs &g, const TileCoord &t, const Rows &rows, int i, int64_t, int ql)
    {
        const int64_t iw = t.i0 + i;
        return rows.tok[ql] >= 0 && iw < g.I ? g.M[rows.pos[ql] * g.I + iw] : 0.0f;
    }
    static __device__ float b(const MlpArgs &g, const TileCoord &t, const Rows &rows, int64_t, int j, int ql)
    {
        const int64_t h = t.j0 + j;
        return rows.tok[ql] >= 0 && h < g.H ? scaled_grad(g, rows.tok[ql], rows.a[ql], h, !g.on_i) : 0.0f;
    }
    static __device__ void epilogue(const MlpArgs &g, const TileCoord &t, const Rows &, const float (&acc)[4][4], int tx,
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
    static __device__ TileCoord coord(const MlpArgs &g, int64_t tile) { return expert_tile(g, tile, g.H, 2 * g.I); }
    static __device__ float a(const MlpArgs &g, const TileCoord &t, const Rows &rows, int i, int64_t, int ql)
    {
        const int64_t h = t.i0 + i;
        return rows.tok[ql] >= 0 && h < g.H ? load_as_float(g.dt, g.hidden, rows.tok[ql] * g.H + h) : 0.0f;
    }
    static __device__ float b(const MlpArgs &g, const TileCoord &t, const Rows &rows, int64_t, int j, int ql)
    {
        const int64_t jj = t.j0 + j;
        return rows.tok[ql] >= 0 && jj < 2 * g.I ? g.dGU[rows.pos[ql] * 2 * g.I + jj] : 0.0f;
    }
    static __device__ void epilogue(const MlpArgs &g, const TileCoord &t, const Rows &, const float (&acc)[4][4], int tx,
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

// ------------------------------------------------------------------------------------------------
// Element-wise kernels
// ------------------------------------------------------------------------------------------------
#define GRID_STRIDE(var, count)                                                                     \
    for (int64_t var = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; var < (count);               \
         var += (int64_t)gridDim.x * blockDim.x)

// V consecutive elements (V = 8: 16-byte vectors, needs aligned tensors and 8 | the row length; V = 4:
// 4-element vectors, aligned to 4 elements (16 bytes for f32), 4 | the row length; V = 1).
template <int V> __device__ __forceinline__ void load_v(moe_dtype dt, const void *base, int64_t i, float *v)
{
    if (V == 8)
        load8(dt, base, i, v);
    else if (V == 4)
        load4(dt, base, i, v);
    else
        v[0] = load_as_float(dt, base, i);
}
template <int V> __device__ __forceinline__ void store_v(moe_dtype dt, void *base, int64_t i, const float *v)
{
    if (V == 8)
        store8(dt, base, i, v);
    else if (V == 4)
        store4(dt, base, i, v);
    else
        store_from_float(dt, base, i, v[0]);
}

// Split path: expert e's rows repeated three times over as its term rows 3 off[e] .. 3 off[e+1] (off =
// row_offsets): term p of row r at first + p * step, first = r + 2 off[e], step = off[e+1] - off[e].
__device__ __forceinline__ void term_rows_of(const MlpArgs &g, int64_t r, int64_t e, int64_t &first, int64_t &step)
{
    const int64_t lo = g.row_offsets[e];
    first = r + 2 * lo, step = g.row_offsets[e + 1] - lo;
}

// V float32 values of row r (expert e) of a GEMM's output rows from column h (rows of `width`): the row, or on
// the split path the sum of its term rows' values, (t0 + t1) + t2.
template <int V>
__device__ __forceinline__ void load_row_v(const MlpArgs &g, const float *base, int64_t r, int64_t e, int64_t width,
                                           int64_t h, float *c)
{
    if (!g.split) {
        load_v<V>(MOE_F32, base, r * width + h, c);
        return;
    }
    int64_t first, step;
    term_rows_of(g, r, e, first, step);
    float t1[V], t2[V];
    load_v<V>(MOE_F32, base, first * width + h, c);
    load_v<V>(MOE_F32, base, (first + step) * width + h, t1);
    load_v<V>(MOE_F32, base, (first + 2 * step) * width + h, t2);
#pragma unroll
    for (int u = 0; u < V; u++)
        c[u] = (c[u] + t1[u]) + t2[u];
}

// tok_count[t] and tok_list[t*E ..]: the rows of token t's positions (pos_row, or the positions on the
// tile path) in ascending expert order, one warp per token with ballots over pair_pos.
__global__ void token_lists_kernel(MlpArgs g)
{
    if (*g.status != ERR_NONE)
        return;
    const int lane = threadIdx.x % 32;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
    for (int64_t t = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32; t < g.T; t += warps) {
        int64_t next = 0;
        for (int64_t e0 = 0; e0 < g.E; e0 += 32) {
            const long long pos = e0 + lane < g.E ? g.pair_pos[t * g.E + e0 + lane] : NONE;
            const unsigned bits = __ballot_sync(0xffffffffu, pos != NONE);
            if (pos != NONE) {
                const int64_t j = t * g.E + next + __popc(bits & ((1u << lane) - 1u));
                g.tok_list[j] = g.pos_row != nullptr ? g.pos_row[pos] : (int64_t)pos;
                g.tok_expert[j] = e0 + lane;
            }
            next += __popc(bits);
        }
        if (lane == 0)
            g.tok_count[t] = next;
    }
}

// The token sums' walk: for every token t < token_rows and V-wide chunk h of H (grid-stride),
// dst[t][h ..] = the sum over j = 0 .. tok_count[t] - 1 (ascending expert order) of what
// contribution(t, j, h, c) leaves in c[V] (its first term taken as is: no +0 added); +0 for tokens in no
// block and for the pad row.
template <int V, class Contribution>
__device__ __forceinline__ void token_sums(const MlpArgs &g, void *dst, Contribution contribution)
{
    const int64_t H = g.H, chunks = H / V;
    GRID_STRIDE(idx, g.token_rows * chunks)
    {
        const int64_t t = idx / chunks, h = idx % chunks * V;
        float acc[V];
        for (int u = 0; u < V; u++)
            acc[u] = 0.0f;
        if (t < g.T) {
            const int64_t count = g.tok_count[t];
            for (int64_t j = 0; j < count; j++) {
                float c[V];
                contribution(t, j, h, c);
                for (int u = 0; u < V; u++)
                    acc[u] = j == 0 ? c[u] : acc[u] + c[u];
            }
        }
        store_v<V>(g.dt, dst, t * H + h, acc);
    }
}

// dst[t][h] = sum over the token's positions in ascending expert order of rows[row][h].  (out in the
// forward, d_hidden in the backward.)  V-wide chunks of h (V = 8: 16-byte stores of 16-bit
// dst; token_rows picks it when H % 8 == 0 and both tensors are 16-byte aligned; faster than one element per
// thread under ncu: bench/RESULTS.md, "the backward's gate_bwd and token sums").
template <int V>
__global__ void token_rows_kernel(MlpArgs g, const float *rows, void *dst)
{
    if (*g.status != ERR_NONE)
        return;
    token_sums<V>(g, dst, [&](int64_t t, int64_t j, int64_t h, float *c) {
        load_row_v<V>(g, rows, g.tok_list[t * g.E + j], g.split ? g.tok_expert[t * g.E + j] : 0, g.H, h, c);
    });
}

// Rows path forward: out[t][h] = sum over the token's positions (ascending expert order) of its
// contribution from the down GEMM's row D: ON_H a*(D + b_d), ON_I D + a*b_d.  V-wide chunks of h.
// With write_ckpt (ON_H with a down checkpoint) it also writes the checkpoint rnd(D + b_d) of each
// position it reads, so D is read once (down_ckpt_kernel does this for ON_I, from Dre).
template <int V>
__global__ void token_out_kernel(MlpArgs g, int write_ckpt)
{
    if (*g.status != ERR_NONE)
        return;
    const int64_t H = g.H;
    token_sums<V>(g, g.out, [&](int64_t t, int64_t j, int64_t h, float *c) {
        const int64_t row = g.tok_list[t * g.E + j], e = g.tok_expert[t * g.E + j];
        const float a = load_as_float(g.dt, g.aff, t * g.E + e);
        float bd[V];
        load_row_v<V>(g, g.Dr, row, e, H, h, c);
        if (write_ckpt) { // ON_H
            if (g.bias) {
                load_v<V>(g.dt, g.b_d, e * H + h, bd);
                for (int u = 0; u < V; u++)
                    c[u] = c[u] + bd[u];
            }
            store_v<V>(g.dt, g.ckpt_d, g.row_pos[row] * H + h, c);
            for (int u = 0; u < V; u++)
                c[u] = a * c[u];
        } else if (g.bias) {
            load_v<V>(g.dt, g.b_d, e * H + h, bd);
            for (int u = 0; u < V; u++)
                c[u] = g.on_i ? c[u] + a * bd[u] : a * (c[u] + bd[u]);
        } else if (!g.on_i) {
            for (int u = 0; u < V; u++)
                c[u] = a * c[u];
        }
    });
}

// da[pos] = <G[tok], d[pos]>, d from the down checkpoint or recomputed in float32 (ON_I without one: the
// tile path keeps it by position with the bias, the rows path by row without it).  One warp per
// position, lanes over V-wide strided chunks of h then a fixed butterfly: deterministic.
template <int V>
__global__ void dot_kernel(MlpArgs g)
{
    if (*g.status != ERR_NONE)
        return;
    const int lane = threadIdx.x % 32;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32), H = g.H;
    for (int64_t pos = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32; pos < g.NB; pos += warps) {
        const int64_t tok = token_of(g, pos);
        if (tok < 0)
            continue;
        const int64_t d_row = g.pos_row != nullptr ? g.pos_row[pos] : pos, e = g.b2e[pos / g.B];
        float sum = 0.0f;
        for (int64_t h = lane * (int64_t)V; h < H; h += 32 * V) {
            float G[V], d[V];
            load_v<V>(g.dt, g.out_grad, tok * H + h, G);
            if (g.ckpt_d_in != nullptr) {
                load_v<V>(g.dt, g.ckpt_d_in, pos * H + h, d);
            } else {
                load_row_v<V>(g, g.Dre, d_row, e, H, h, d);
                if (g.dre_bias) {
                    float bd[V];
                    load_v<V>(g.dt, g.b_d, e * H + h, bd);
                    for (int u = 0; u < V; u++)
                        d[u] = d[u] + bd[u];
                }
            }
            for (int u = 0; u < V; u++)
                sum = fmaf(G[u], d[u], sum);
        }
        for (int off = 16; off > 0; off /= 2)
            sum += __shfl_xor_sync(0xffffffffu, sum, off);
        if (lane == 0)
            g.da[pos] = sum;
    }
}

// d_affinities[t*E + e] = da of the pair's position, +0 for pairs outside the layout.
__global__ void daff_kernel(MlpArgs g)
{
    if (*g.status != ERR_NONE)
        return;
    GRID_STRIDE(idx, g.T * g.E)
    {
        const long long pos = g.pair_pos[idx];
        store_from_float(g.dt, g.d_aff, idx, pos == NONE ? 0.0f : g.da[pos]);
    }
}

// db_d[e][h] = sum a*G[tok][h], db_gu[e][j] = sum dGU[pos][j], over the expert's positions ascending.
__global__ void bias_grad_kernel(MlpArgs g)
{
    if (*g.status != ERR_NONE)
        return;
    const int64_t cols = g.H + 2 * g.I;
    GRID_STRIDE(idx, g.E * cols)
    {
        const int64_t e = idx / cols, c = idx % cols;
        float sum = 0.0f;
        for (int64_t q = g.expert_start[e]; q < g.expert_start[e + 1]; q++) {
            const int64_t n = g.expert_blocks[q];
            for (int64_t b = 0; b < g.B; b++) {
                const int64_t pos = n * g.B + b, tok = token_of(g, pos);
                if (tok < 0)
                    continue;
                sum = sum + (c < g.H ? scaled_grad(g, tok, load_as_float(g.dt, g.aff, tok * g.E + e), c, true)
                                     : g.dGU[pos * 2 * g.I + (c - g.H)]);
            }
        }
        if (c < g.H)
            store_grad(g, g.d_bd, e * g.H + c, sum);
        else
            store_grad(g, g.d_bgu, e * 2 * g.I + (c - g.H), sum);
    }
}

// ------------------------------------------------------------------------------------------------
// Rows path (options.round_intermediates with f16/bf16; bf16 without it on split operands, below): every GEMM
// on the grouped GEMM's kernels
// (gemm_cuda.cuh, moe_cuda_rows_gemm: wgmma/TMA on sm_90a, mma on sm_80+), the MLP's own work in
// elementwise kernels between them.  The layout's real positions are numbered as "rows" grouped by
// expert (the expert's blocks in ascending order, ascending slot within a block; padding positions get
// no row), so each GEMM is a plain grouped GEMM over contiguous row ranges:
//
//   forward    Xr = hidden rows;  GU = Xr . W_gu (f32);  gate_act: bias, clamps, gate_up_ckpt_T,
//              Mr = rnd(act(g)*u [*a]);  Dr = Mr . W_d (f32);  token_out: bias, a*d summed per token
//              -> out, and ON_H's down_ckpt on the way (ON_I's: down_ckpt from Dre = rnd(m) . W_d).
//              On sm_90a with long enough experts the gate/up GEMM and gate_act are one kernel
//              (gpu/gate_sm90.cuh, G_FUSE_MIN_ROWS): the fp32 GU rows are neither written nor read, same
//              bits (MOE_MLP_FUSE_GATE=0 turns it off, =1 forces it); there the down GEMM, when I is short
//              (R_PINGPONG_MAX_N), runs on the same schedule with its fp32 epilogue beside the other
//              warpgroup's MMAs (sm90_rows_f32_kernel; MOE_MLP_FUSE_GATE=0 turns it off too)
//   backward   Xr;  Sr = rnd(a*G) (ON_I: G);  dMr = Sr . W_d^T (f32);  gate_bwd (from the checkpoint):
//              Mr = rnd(m [*a]), dGUr = rnd(dg, du);  [ON_I without down_ckpt: Dre = rnd(m) . W_d];
//              dot/daff -> d_affinities;  dXr = dGUr . W_gu^T (f32) -> token_rows -> d_hidden;
//              d_w_d = Mr^T . Sr;  d_w_gu = Xr^T . dGUr;  bias sums over the expert's rows.  dMr and dXr
//              take the ping-pong rows kernel under the down GEMM's rules (a reduction, H or 2 I, of at
//              most R_PINGPONG_MAX_N)
//
// rnd = one rounding to the call's dtype (specs/MLP.md, "Rounded intermediates"); on the split path (below) no
// rounding: Mr, M0r and dGUr hold exact terms at term rows, the GEMMs that read them run over term rows, Dr and
// Dre hold one float32 row per term, and the backward's d_w_d and d_w_gu read S3 and X3 (G and X at term rows)
// instead of Sr and Xr.  Every kernel returns at once while the call's status word is set.  Deterministic: no
// atomics on values.
// ------------------------------------------------------------------------------------------------
__device__ __forceinline__ float round_dev(moe_dtype dtype, float v)
{
    if (dtype == MOE_F16)
        return __half2float(__float2half_rn(v));
    if (dtype == MOE_BF16)
        return __bfloat162float(__float2bfloat16_rn(v));
    return v;
}

// Split operands (bf16 without round_intermediates; specs/MLP.md, "Split operands on the GPU"): the
// float32 intermediates stay unrounded, so each operand the GEMMs read is stored as exact bf16 terms
// (store_terms_v) at the row's three "term rows" (term_rows_of), and every GEMM that reads such an operand
// runs once over the term rows (term_offsets): a GEMM with a float32 output (the forward's down projection
// and its checkpoint's, the recomputed d, dX) gives each term its own output row, which the next kernel
// sums, (t0 + t1) + t2 (load_row_v); a weight gradient reduces over the term rows, the three terms of a row
// as three rows of the reduction with the other operand's row (X3, S3) copied beside each.
//   A float32 value v (24 significant bits) is hi + mid + lo: hi = v truncated to bf16 (its upper 16 bits: round
// toward zero, so hi has v's sign and |hi| <= |v|), r = v - hi (exact, the lower 16 bits), mid = r truncated the
// same way, lo = r - mid (exact, at most 8 significant bits).  Every term has v's sign, so |hi| + |mid| + |lo| =
// |v| and a GEMM's magnitude sum is unchanged; each product of a term with a bf16 value is exact in float32,
// and the float32 sums of hi + mid + lo (the bias gradients) give v back.  An infinite v stays in hi (the rest
// 0, not inf - inf); a NaN v makes the others NaN.  Exact for |v| >= 2^-110; below, lo falls into bf16's
// subnormal range and drops bits under 2^-133.
//   The backward keeps G, a bf16 tensor, as the down projection's gradient operand in both placements
// (a_in_m): dM = a * (G . W_d^T) and d_w_d = (a*m)^T . G, one term of G where a*G would need two (it has up
// to 16 significant bits).
//   One GEMM per term, accumulating in the float32 output, goes through the sm90 kernel's read-modify-write
// epilogue, a costly extra pass per term; running each GEMM once over the term rows made the weight gradients,
// then the float32-output GEMMs, faster (H200; bench/RESULTS.md, "where the split backward's time goes" and
// "every split GEMM over term rows").
// The 3 terms above of v, term p at base + i + p * stride (bf16 elements).
template <int V>
__device__ __forceinline__ void store_terms_v(void *base, int64_t stride, int64_t i, const float *v)
{
    float hi[V], mid[V], lo[V];
#pragma unroll
    for (int u = 0; u < V; u++) {
        hi[u] = truncate_to_bf16(v[u]);
        const float r = fabsf(v[u]) == INFINITY ? 0.0f : v[u] - hi[u];
        mid[u] = truncate_to_bf16(r);
        lo[u] = r - mid[u];
    }
    __nv_bfloat16 *terms = static_cast<__nv_bfloat16 *>(base);
    store_v<V>(MOE_BF16, terms, i, hi);
    store_v<V>(MOE_BF16, terms + stride, i, mid);
    store_v<V>(MOE_BF16, terms + 2 * stride, i, lo);
}

__device__ __forceinline__ int64_t warp_id_global() { return (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32; }
__device__ __forceinline__ int64_t warps_in_grid() { return (int64_t)gridDim.x * (blockDim.x / 32); }
__device__ __forceinline__ int64_t rows_total(const MlpArgs &g) { return g.row_offsets[g.E]; }

// block_rows[n] = the real positions of block n (one warp per block).
__global__ void block_rows_kernel(MlpArgs g)
{
    if (*g.status != ERR_NONE)
        return;
    const int lane = threadIdx.x % 32;
    for (int64_t n = warp_id_global(); n < g.N; n += warps_in_grid()) {
        int64_t count = 0;
        for (int64_t b0 = 0; b0 < g.B; b0 += 32) {
            const bool real = b0 + lane < g.B && token_of(g, n * g.B + b0 + lane) >= 0;
            count += __popc(__ballot_sync(0xffffffffu, real));
        }
        if (lane == 0)
            g.block_rows[n] = count;
    }
}

// row_offsets[e] and block_first[n] (one CTA; each thread walks its experts' block lists in order).
__global__ void __launch_bounds__(LIST_THREADS) row_offsets_kernel(MlpArgs g)
{
    if (*g.status != ERR_NONE)
        return;
    for (int64_t e = threadIdx.x; e < g.E; e += blockDim.x) {
        int64_t total = 0;
        for (int64_t q = g.expert_start[e]; q < g.expert_start[e + 1]; q++) {
            const int64_t n = g.expert_blocks[q];
            g.block_first[n] = total;
            total += g.block_rows[n];
        }
        g.row_offsets[e + 1] = total;
    }
    __syncthreads();
    if (threadIdx.x < 32)
        warp_prefix_sum(g.row_offsets, g.E);
    __syncthreads();
    for (int64_t e = threadIdx.x; e < g.E; e += blockDim.x)
        for (int64_t q = g.expert_start[e]; q < g.expert_start[e + 1]; q++)
            g.block_first[g.expert_blocks[q]] += g.row_offsets[e];
}

// row_pos and pos_row (one warp per block, ballots in slot order).
__global__ void row_maps_kernel(MlpArgs g)
{
    if (*g.status != ERR_NONE)
        return;
    const int lane = threadIdx.x % 32;
    for (int64_t n = warp_id_global(); n < g.N; n += warps_in_grid()) {
        int64_t next = g.block_first[n];
        for (int64_t b0 = 0; b0 < g.B; b0 += 32) {
            const int64_t pos = n * g.B + b0 + lane;
            const bool inside = b0 + lane < g.B;
            const bool real = inside && token_of(g, pos) >= 0;
            const unsigned bits = __ballot_sync(0xffffffffu, real);
            if (inside) {
                const int64_t row = real ? next + __popc(bits & ((1u << lane) - 1u)) : -1;
                g.pos_row[pos] = row;
                if (real)
                    g.row_pos[row] = pos;
            }
            next += __popc(bits);
        }
    }
}

// term_offsets[e] = 3 row_offsets[e] (split path).
__global__ void term_offsets_kernel(MlpArgs g)
{
    if (*g.status != ERR_NONE)
        return;
    for (int64_t e = threadIdx.x; e <= g.E; e += blockDim.x)
        g.term_offsets[e] = 3 * g.row_offsets[e];
}

__device__ __forceinline__ float row_affinity(const MlpArgs &g, int64_t pos)
{
    return load_as_float(g.dt, g.aff, token_of(g, pos) * g.E + g.b2e[pos / g.B]);
}

// An operand of row r (expert e), V values from column col of a row of `width`: rounded once to dt at row r, or
// on the split path its terms at r's term rows.
template <int V>
__device__ __forceinline__ void store_operand_v(const MlpArgs &g, moe_dtype dt, void *base, int64_t r, int64_t e,
                                                int64_t width, int64_t col, const float *v)
{
    if (!g.split) {
        store_v<V>(dt, base, r * width + col, v);
        return;
    }
    int64_t first, step;
    term_rows_of(g, r, e, first, step);
    store_terms_v<V>(base, step * width, first * width + col, v);
}

// The operand of store_operand_v as float32: the value, or the sum of its terms (exact: the value itself).
__device__ __forceinline__ float load_operand(const MlpArgs &g, const void *base, int64_t r, int64_t e, int64_t width,
                                              int64_t col)
{
    if (!g.split)
        return load_as_float(g.dt, base, r * width + col);
    int64_t first, step;
    term_rows_of(g, r, e, first, step);
    const __nv_bfloat16 *terms = static_cast<const __nv_bfloat16 *>(base);
    return __bfloat162float(terms[first * width + col]) + __bfloat162float(terms[(first + step) * width + col]) +
           __bfloat162float(terms[(first + 2 * step) * width + col]);
}

// What the elementwise kernels need of a row, computed once per row (64-bit divisions are costly).
struct RowInfo {
    int64_t pos, e, tok;
    int64_t ckpt; // gate_up_ckpt_T index of (half 0, i = 0) for this position: n*2*I*B + b
    float a;      // A[tok][e]
};

// With `expert_affinity` false, e, tok and a are left zero (two dependent loads fewer).
__device__ __forceinline__ RowInfo row_info(const MlpArgs &g, int64_t r, bool expert_affinity)
{
    RowInfo ri = {};
    ri.pos = g.row_pos[r];
    const int64_t n = ri.pos / g.B, b = ri.pos - n * g.B;
    ri.ckpt = n * 2 * g.I * g.B + b;
    if (expert_affinity) {
        ri.e = g.b2e[n];
        ri.tok = g.ids[ri.pos];
        ri.a = load_as_float(g.dt, g.aff, ri.tok * g.E + ri.e);
    }
    return ri;
}


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

// Tiles of 32 rows x GATE_SPAN intermediate columns, walked 32 columns at a time; CTA (32, 8).  The
// checkpoint [N][2][I][B] is read or written with lanes along the slot, everything else with lanes
// along i, through shared memory.
constexpr int RT = 32, GATE_SPAN = 256;

// A chunk's elements with lanes along i, V consecutive i per thread (V = 4 needs 4 | I): RT / V threads
// per row of the chunk, 8 V rows per pass, LANE_PASSES<V> passes; element(pass, row, col, r, i) for each row
// inside R and i < I (row, col: the first of the V in the tile; r, i: in R x I).
template <int V> constexpr int LANE_PASSES = RT / (8 * V);
template <int V, class Element>
__device__ __forceinline__ void chunk_lanes_along_i(int64_t R, int64_t I, int64_t r0, int64_t i0, Element element)
{
    constexpr int PER_ROW = RT / V;
    static_assert(LANE_PASSES<V> * 8 * V == RT, "V divides RT / 8");
    const int t = threadIdx.y * RT + threadIdx.x, col = t % PER_ROW * V;
#pragma unroll
    for (int pass = 0; pass < LANE_PASSES<V>; pass++) {
        const int rr = t / PER_ROW + pass * 8 * V;
        const int64_t r = r0 + rr, i = i0 + col;
        if (r >= R || i >= I)
            continue;
        element(pass, rr, col, r, i);
    }
}

// The gate kernels are compiled per dtype (DT, a moe_dtype) and activation (ACT, a moe_mlp_activation),
// which must equal g.dt and g.act (launch_gate_kernel): with both switched at run time per element they
// issued about twice the instructions the memory traffic needs (ncu; bench/RESULTS.md,
// "MLP elementwise profile, gate kernels per dtype and activation").  The gate kernels are speed-critical: time any
// change to them per kernel (ncu gpu__time_duration; bench/RESULTS.md has the history).
//
// Forward epilogue of the gate/up GEMM: bias, clamps, the checkpoint, Mr = rnd(act(g)*u [*a]) and
// (ON_I with a down checkpoint) M0r = rnd(act(g)*u).  Grid-stride over the tiles (RT rows from r0,
// GATE_SPAN columns from i_first), each walked RT columns (a chunk from i0) at a time.  Warp ty = 0 loads
// the RowInfo of a tile's rows into info when the tile starts.  In a chunk, thread (tx, ty) has column
// i0 + tx of rows r0 + ty, r0 + ty + 8, ... (lanes along i), whose gate and up values go through gs / us to
// the checkpoint stores with lanes along the slot (row r0 + tx, columns ty, ty + 8, ...).
//
// Measured (ncu, H200; bench/RESULTS.md, "gate_act's loads first"):
// - The chunk's fp32 loads are all issued before its first store, which the compiler may not move them past
//   (Mr may alias GU for all it knows): faster at Qwen3-30B-A3B T = 16384 unfused and gpt-oss-120b T = 4096.
//   Loading the next chunk's values during this one's work gained less (at 64 registers); the GENERAL split
//   of gate_bwd with unrolled checkpoint stores lost.
// - What bounds it is issue, not load latency: at gpt-oss, SM throughput well above DRAM throughput, many
//   cycles per issued instruction at 34 warps per SM (5 CTAs).
// - 4 consecutive i per thread and slot-pair words (as gate_bwd_kernel): slower, with both and with the words
//   alone (bench/RESULTS.md, "4 consecutive i per thread, checkpoint slot pairs").
template <int DT, int ACT>
__global__ void __launch_bounds__(RT * 8) gate_act_kernel(MlpArgs g)
{
    constexpr moe_dtype dt = static_cast<moe_dtype>(DT);
    constexpr int P = RT / 8; // rows per thread in a chunk
    if (*g.status != ERR_NONE)
        return;
    __shared__ float gs[RT][RT + 1], us[RT][RT + 1];
    __shared__ RowInfo info[RT];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t R = rows_total(g), I = g.I, spans = (I + GATE_SPAN - 1) / GATE_SPAN;
    for (int64_t tile = blockIdx.x; tile < (R + RT - 1) / RT * spans; tile += gridDim.x) {
        const int64_t r0 = tile / spans * RT, i_first = tile % spans * GATE_SPAN;
        const int64_t i_end = i_first + GATE_SPAN < I ? i_first + GATE_SPAN : I;
        __syncthreads(); // the previous chunk's checkpoint stores have read info
        if (ty == 0 && r0 + tx < R)
            info[tx] = row_info(g, r0 + tx, g.bias || g.on_i || g.split);
        for (int64_t i0 = i_first; i0 < i_end; i0 += RT) {
            float gv[P], uv[P]; // 0 outside R x I
#pragma unroll
            for (int p = 0; p < P; p++) {
                const int64_t r = r0 + ty + 8 * p, i = i0 + tx;
                const bool inside = r < R && i < I;
                gv[p] = inside ? g.GU[r * 2 * I + i] : 0.0f;
                uv[p] = inside ? g.GU[r * 2 * I + I + i] : 0.0f;
            }
            __syncthreads(); // info is written; the previous chunk's checkpoint stores have read gs and us
#pragma unroll
            for (int p = 0; p < P; p++) {
                const int row = ty + 8 * p;
                const int64_t r = r0 + row, i = i0 + tx;
                if (r >= R || i >= I)
                    continue;
                const int64_t e = info[row].e;
                float gp = gv[p], up = uv[p];
                if (g.bias) {
                    gp = gp + load_as_float(dt, g.b_gu, e * 2 * I + i);
                    up = up + load_as_float(dt, g.b_gu, e * 2 * I + I + i);
                }
                gp = clamp_value(gp, g.has_nl_lo, g.nl_lo, g.has_nl_hi, g.nl_hi);
                up = clamp_value(up, g.has_lin_lo, g.lin_lo, g.has_lin_hi, g.lin_hi);
                const float m = act_value(ACT, gp) * up, mr = g.on_i ? m * info[row].a : m;
                store_operand_v<1>(g, dt, g.Mr, r, info[row].e, I, i, &mr);
                if (g.M0r != nullptr)
                    store_operand_v<1>(g, dt, g.M0r, r, info[row].e, I, i, &m);
                gs[row][tx] = gp, us[row][tx] = up;
            }
            __syncthreads();
            if (g.ckpt_gu != nullptr && r0 + tx < R) {
                for (int col = ty; col < RT && i0 + col < I; col += 8) {
                    const int64_t i = i0 + col;
                    store_from_float(dt, g.ckpt_gu, info[tx].ckpt + i * g.B, gs[tx][col]);
                    store_from_float(dt, g.ckpt_gu, info[tx].ckpt + (I + i) * g.B, us[tx][col]);
                }
            }
        }
    }
}

// +0 at the padding positions of the checkpoints, before the epilogues write the real ones.  Work items over
// the whole grid, per block with padding: its gate_up_ckpt_T slab [2][I][B] (contiguous; 16-byte stores when
// vec) in segments of ZERO_SEGMENT elements, then its down_ckpt padding rows (16-byte stores when vec_d) in
// groups of ZERO_ROWS positions.  (It was one CTA per block, which left most of the device idle and ran slower
// under ncu; bench/RESULTS.md, "MLP zero_padding_kernel over the whole grid".)
constexpr int64_t ZERO_SEGMENT = 8192, ZERO_ROWS = 16;
// Work items of one block: its gate_up_ckpt_T segments (zero_gu_items), then its down_ckpt row groups.
__host__ __device__ inline int64_t zero_gu_items(const MlpArgs &g)
{
    return g.ckpt_gu != nullptr ? (2 * g.I * g.B + ZERO_SEGMENT - 1) / ZERO_SEGMENT : 0;
}
__host__ __device__ inline int64_t zero_items_per_block(const MlpArgs &g)
{
    return zero_gu_items(g) + (g.ckpt_d != nullptr ? (g.B + ZERO_ROWS - 1) / ZERO_ROWS : 0);
}

__global__ void zero_padding_kernel(MlpArgs g, int vec, int vec_d)
{
    if (*g.status != ERR_NONE)
        return;
    const int64_t slab = 2 * g.I * g.B, per_block = zero_items_per_block(g), gu_items = zero_gu_items(g);
    for (int64_t item = blockIdx.x; item < g.N * per_block; item += gridDim.x) {
        const int64_t n = item / per_block, part = item % per_block;
        if (g.block_rows[n] == g.B)
            continue;
        if (part < gu_items) { // elements begin .. end - 1 of block n's slab (multiples of 8 when vec)
            const int64_t begin = part * ZERO_SEGMENT, end = begin + ZERO_SEGMENT < slab ? begin + ZERO_SEGMENT : slab;
            const int64_t first = n * slab;
            if (vec) {
                uint4 *p = reinterpret_cast<uint4 *>(static_cast<uint16_t *>(g.ckpt_gu) + first);
                for (int64_t q = begin / 8 + threadIdx.x; q < end / 8; q += blockDim.x)
                    p[q] = make_uint4(0, 0, 0, 0);
            } else {
                for (int64_t q = begin + threadIdx.x; q < end; q += blockDim.x)
                    store_from_float(g.dt, g.ckpt_gu, first + q, 0.0f);
            }
        } else { // positions r0 .. r0 + rows - 1 of block n: rows of H elements, 8 at a time when vec_d
            const int64_t r0 = (part - gu_items) * ZERO_ROWS, rows = g.B - r0 < ZERO_ROWS ? g.B - r0 : ZERO_ROWS;
            const int64_t per_row = vec_d ? g.H / 8 : g.H;
            for (int64_t q = threadIdx.x; q < rows * per_row; q += blockDim.x) {
                const int64_t pos = n * g.B + r0 + q / per_row, c = q % per_row;
                if (g.pos_row[pos] >= 0)
                    continue;
                if (vec_d)
                    reinterpret_cast<uint4 *>(g.ckpt_d)[pos * per_row + c] = make_uint4(0, 0, 0, 0);
                else
                    store_from_float(g.dt, g.ckpt_d, pos * g.H + c, 0.0f);
            }
        }
    }
}

// The down checkpoint from the down GEMM's rows: ON_H rnd(D + b_d), ON_I rnd(Dre + b_d) (Dre = M0r . W_d).
// Launched for ON_I only: token_out_kernel writes ON_H's while it forms the contributions to out.  One
// CTA per row.
template <int V>
__global__ void down_ckpt_kernel(MlpArgs g)
{
    if (*g.status != ERR_NONE)
        return;
    const int64_t R = rows_total(g), H = g.H;
    const float *D = g.on_i ? g.Dre : g.Dr;
    for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
        const int64_t pos = g.row_pos[r], e = g.b2e[pos / g.B];
        for (int64_t h = threadIdx.x * (int64_t)V; h < H; h += (int64_t)blockDim.x * V) {
            float d[V], bd[V];
            load_row_v<V>(g, D, r, e, H, h, d);
            if (g.bias) {
                load_v<V>(g.dt, g.b_d, e * H + h, bd);
                for (int u = 0; u < V; u++)
                    d[u] = d[u] + bd[u];
            }
            store_v<V>(g.dt, g.ckpt_d, pos * H + h, d);
        }
    }
}

// A checkpoint value from the 32-bit word of shared memory that holds it: the word itself (f32), or its half
// at bit `shift` (0 or 16; f16 and bf16).
template <int DT>
__device__ __forceinline__ float ckpt_word_value(uint32_t word, int shift)
{
    if constexpr (DT == MOE_F32)
        return __uint_as_float(word);
    else if constexpr (DT == MOE_F16)
        return __half2float(__ushort_as_half((unsigned short)(word >> shift)));
    else
        return __uint_as_float((word >> shift) << 16);
}

// Backward: from the checkpoint and dMr, Mr = rnd(m [*a]) (d_w_d's operand), M0r = rnd(m) (when d is
// recomputed), dGUr = (rnd(dg), rnd(du)) with the strict clamp masks on the checkpointed values.  Compiled
// per dtype and activation as gate_act_kernel; V = 4 (4 | I) moves 4 consecutive i per thread.
//   The loads are asynchronous and one chunk ahead: chunk c + 1's dMr values and checkpoint columns are copied
// into shared memory (cp.async) while chunk c is computed from the other of two stages.  Loaded synchronously,
// chunk by chunk, the kernel was bound by latency (ncu on an H200: DRAM well below its peak, few eligible warps
// per scheduler; bench/RESULTS.md, "the backward's gate_bwd and token sums" and
// "gate_bwd's loads one chunk ahead by cp.async").
//   The checkpoint is read with lanes along the slot, one 4-byte copy per (row, i, gate or up): of a 16-bit
// dtype, the aligned 32-bit word that holds the row's element (`words`, ckpt_words: a 4-byte aligned
// checkpoint and B even; the word's other half is the neighbouring slot's and goes unused), from which
// compute() takes the half at bit 16 * (slot & 1).  (It read two rows' elements as one word where they were
// consecutive slots at an even index, and the others by 2-byte loads: those waited in the issuing thread and
// made a large share of the kernel's stall samples; the words ran faster under ncu on an H200: bench/RESULTS.md,
// "gate_bwd's checkpoint reads all asynchronous".)  Without `words` (a checkpoint aligned to 2 bytes only, or
// B odd) the 16-bit elements are loaded
// synchronously into the low halves.  It is instantiated for f16 and bf16 only (launch_gate_kernel: the rows
// path takes no f32); its ES == 4 branches keep the template whole for f32.
//   Instructions are kept few, for the kernel was bound in part by issuing them (ncu source counters of the words
// form: stalls "not selected" and "selected" a large share of the samples): a whole chunk's checkpoint copies are
// one unrolled run (RT / 8 per thread, far fewer instructions than as a loop); the chunks of a call without
// clamps, the affinity on m (a_in_m: ON_I, split operands) or M0r (GENERAL false) skip those steps' tests; a
// tile's start reads the affinity's chain (ids, b2e, affinities) only with a_in_m.  That cut the executed
// instructions by about a third and ran faster (ncu, H200; bench/RESULTS.md,
// "gate_bwd issues fewer instructions").
// Issuing the next tile's first chunk before the current tile's last is computed (no idle tile start) measured
// slower each time, through the instructions it added (bench/RESULTS.md,
// "the next tile's first chunk issued early" and "lean against lean with the tile-ahead stream").
// Staging: dm_s [stage][row][col] float32; ck_s [stage][gate, up][col][row] the 32-bit words (RT + 1 per
// column: the copies' lanes along row and compute's (8 column groups x 4 rows) both free of bank conflicts).
// MOE_GATE_BWD_MIN_CTAS, a compile-time knob for experiments: the CTAs per SM asked of ptxas.  Unset, ptxas
// picks 57 registers for the bf16 SiLU V = 4 instance (4 CTAs per SM); 5 forces 48 without spills there and
// was slower (bench/RESULTS.md, "lean, at its own 57 registers and forced to 48").
#ifdef MOE_GATE_BWD_MIN_CTAS
#define MOE_GATE_BWD_BOUNDS __launch_bounds__(RT * 8, MOE_GATE_BWD_MIN_CTAS)
#else
#define MOE_GATE_BWD_BOUNDS __launch_bounds__(RT * 8)
#endif
template <int DT, int ACT, int V>
__global__ void MOE_GATE_BWD_BOUNDS gate_bwd_kernel(MlpArgs g, bool words)
{
    constexpr moe_dtype dt = static_cast<moe_dtype>(DT);
    constexpr int ES = dt == MOE_F32 ? 4 : 2;
    if (*g.status != ERR_NONE)
        return;
    __shared__ __align__(16) float dm_s[2][RT][RT];
    __shared__ uint32_t ck_s[2][2][RT][RT + 1];
    __shared__ RowInfo info[RT];
    const int64_t R = rows_total(g), I = g.I, B = g.B, spans = (I + GATE_SPAN - 1) / GATE_SPAN;
    const int64_t i_stride = B * ES, half_stride = I * B * ES; // bytes from (i) to (i + 1), from gate to up
    const int tx = threadIdx.x, ty = threadIdx.y;
    const unsigned char *ck_row = nullptr; // this thread's checkpoint row (tile row tx) at i = 0, gate half
    // chunk (r0, i0) into stage `stage`: the elements compute() below reads, and no others
    auto issue = [&](int stage, int64_t r0, int64_t i0) {
        chunk_lanes_along_i<V>(R, I, r0, i0, [&](int, int row, int col, int64_t r, int64_t i) {
            if constexpr (V == 4)
                cp_async16(&dm_s[stage][row][col], g.dMr + r * I + i, true);
            else
                cp_async4(&dm_s[stage][row][col], g.dMr + r * I + i);
        });
        if (ck_row == nullptr) { // this thread's row lies past R: no checkpoint to copy
        } else if ((ES == 4 || words) && i0 + RT <= I) { // a whole chunk: RT / 8 columns, unrolled
            const unsigned char *gate = ck_row + (i0 + ty) * i_stride;
            const int64_t step = 8 * i_stride;
#pragma unroll
            for (int j = 0; j < RT / 8; j++) {
                cp_async4(&ck_s[stage][0][ty + 8 * j][tx], gate + j * step);
                cp_async4(&ck_s[stage][1][ty + 8 * j][tx], gate + j * step + half_stride);
            }
        } else {
            for (int ii = ty; ii < RT && i0 + ii < I; ii += 8) {
                const unsigned char *gate = ck_row + (i0 + ii) * i_stride, *up = gate + half_stride;
                if (ES == 4 || words) {
                    cp_async4(&ck_s[stage][0][ii][tx], gate);
                    cp_async4(&ck_s[stage][1][ii][tx], up);
                } else {
                    ck_s[stage][0][ii][tx] = *reinterpret_cast<const uint16_t *>(gate);
                    ck_s[stage][1][ii][tx] = *reinterpret_cast<const uint16_t *>(up);
                }
            }
        }
        cp_async_commit();
    };
    // GENERAL (a std::bool_constant): false for a call without clamps, the affinity on m or M0r, whose chunks
    // then run without those steps' tests and arithmetic
    auto compute_as = [&](auto GENERAL, int stage, int64_t r0, int64_t i0) {
        constexpr bool general = decltype(GENERAL)::value;
        chunk_lanes_along_i<V>(R, I, r0, i0, [&](int, int row, int col, int64_t r, int64_t i) {
            const float a = general && g.a_in_m ? info[row].a : 1.0f;
            const int shift = ES == 2 && words ? 16 * (int)(info[row].ckpt & 1) : 0;
            float m[V], dg[V], du[V];
#pragma unroll
            for (int v = 0; v < V; v++) {
                const float gv = ckpt_word_value<DT>(ck_s[stage][0][col + v][row], shift);
                const float uv = ckpt_word_value<DT>(ck_s[stage][1][col + v][row], shift);
                const float act = act_value(ACT, gv);
                m[v] = act * uv;
                const float dm = general && g.a_in_m ? a * dm_s[stage][row][col + v] : dm_s[stage][row][col + v];
                const bool pass_u = !general || ((!g.has_lin_lo || g.lin_lo < uv) && (!g.has_lin_hi || uv < g.lin_hi));
                const bool pass_g = !general || ((!g.has_nl_lo || g.nl_lo < gv) && (!g.has_nl_hi || gv < g.nl_hi));
                du[v] = pass_u ? dm * act : 0.0f;
                dg[v] = pass_g ? dm * uv * act_derivative(ACT, gv) : 0.0f;
            }
            const int64_t e = info[row].e; // loaded where the split path needs it (a_in_m)
            if (general && g.M0r != nullptr)
                store_operand_v<V>(g, dt, g.M0r, r, e, I, i, m);
            if (general && g.a_in_m)
#pragma unroll
                for (int v = 0; v < V; v++)
                    m[v] = a * m[v];
            store_operand_v<V>(g, dt, g.Mr, r, e, I, i, m);
            store_operand_v<V>(g, dt, g.dGUr, r, e, 2 * I, i, dg);
            store_operand_v<V>(g, dt, g.dGUr, r, e, 2 * I, I + i, du);
        });
    };
    const bool general = g.a_in_m || g.M0r != nullptr || g.has_lin_lo || g.has_lin_hi || g.has_nl_lo || g.has_nl_hi;
    auto compute = [&](int stage, int64_t r0, int64_t i0) {
        if (general)
            compute_as(std::true_type{}, stage, r0, i0);
        else
            compute_as(std::false_type{}, stage, r0, i0);
    };
    const unsigned char *ckpt = static_cast<const unsigned char *>(g.ckpt_gu_in);
    for (int64_t tile = blockIdx.x; tile < (R + RT - 1) / RT * spans; tile += gridDim.x) {
        const int64_t r0 = tile / spans * RT, i_first = tile % spans * GATE_SPAN;
        const int64_t i_end = i_first + GATE_SPAN < I ? i_first + GATE_SPAN : I;
        // the previous tile's last chunk ended with a barrier: info and both stages are free
        if (ty == 0 && r0 + tx < R) // the affinity (two more dependent loads) only where it is used
            info[tx] = row_info(g, r0 + tx, g.a_in_m);
        __syncthreads();
        ck_row = nullptr;
        if (r0 + tx < R) {
            const int64_t c = info[tx].ckpt; // its aligned word's at c & ~1 (every element of the row: B even)
            ck_row = ckpt + (ES == 2 && words ? c & ~(int64_t)1 : c) * ES;
        }
        issue(0, r0, i_first);
        int stage = 0;
        for (int64_t i0 = i_first; i0 < i_end; i0 += RT, stage ^= 1) {
            if (i0 + RT < i_end) { // the next chunk into the other stage (last read by the chunk before this one)
                issue(stage ^ 1, r0, i0 + RT);
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
            __syncthreads(); // every thread's copies of this chunk have landed
            compute(stage, r0, i0);
            __syncthreads(); // this stage is read before the next chunk but one refills it
        }
    }
}

// db_d[e][h] = sum of rnd(a*G) (split: a*G) over the expert's rows, db_gu[e][j] = sum of dGUr (split: of its
// terms' sums), ascending rows.
__global__ void rows_bias_grad_kernel(MlpArgs g)
{
    if (*g.status != ERR_NONE)
        return;
    const int64_t cols = g.H + 2 * g.I;
    GRID_STRIDE(idx, g.E * cols)
    {
        const int64_t e = idx / cols, c = idx % cols;
        float sum = 0.0f;
        for (int64_t r = g.row_offsets[e]; r < g.row_offsets[e + 1]; r++) {
            if (c >= g.H) {
                sum = sum + load_operand(g, g.dGUr, r, e, 2 * g.I, c - g.H);
            } else if (!g.a_in_m) {
                sum = sum + load_as_float(g.dt, g.Sr, r * g.H + c); // already rnd(a*G)
            } else {
                const float aG = row_affinity(g, g.row_pos[r]) * load_as_float(g.dt, g.Sr, r * g.H + c);
                sum = sum + (g.split ? aG : round_dev(g.dt, aG));
            }
        }
        if (c < g.H)
            store_grad(g, g.d_bd, e * g.H + c, sum);
        else
            store_grad(g, g.d_bgu, e * 2 * g.I + (c - g.H), sum);
    }
}

// ------------------------------------------------------------------------------------------------
// Host side
// ------------------------------------------------------------------------------------------------
int sm_count()
{
    int device = 0, sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
        return 132;
    return sms;
}

unsigned grid_for(int64_t work, int64_t per_block, int64_t cap)
{
    int64_t blocks = (work + per_block - 1) / per_block;
    if (blocks > cap)
        blocks = cap;
    return (unsigned)(blocks < 1 ? 1 : blocks);
}

// Grid of a grid-stride kernel: `wanted` CTAs, but no more than fit on the device at once.  A larger grid
// leaves a partial last wave whose CTAs, each with a full share of the work, run at the end on a part of
// the device (ncu on an H100: gate_bwd_kernel's 1056 CTAs were 1.33 waves).  A failed occupancy query
// leaves its error for the caller's cudaGetLastError check.
template <class Kernel>
unsigned resident_grid(Kernel kernel, int threads, int64_t wanted)
{
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0) != cudaSuccess || per_sm < 1)
        per_sm = 1;
    return grid_for(wanted, 1, (int64_t)sm_count() * per_sm);
}

// Host copies of the tile counts (the device functions above compute the same).
int64_t host_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <class Op>
moe_status launch_tiles(const MlpArgs &g, int64_t tiles, cudaStream_t stream)
{
    if (tiles <= 0)
        return MOE_OK;
    tile_kernel<Op><<<resident_grid(tile_kernel<Op>, THREADS, tiles), THREADS, 0, stream>>>(g, tiles);
    MOE_CUDA_CHECK(cudaGetLastError());
    return MOE_OK;
}

float round_to(moe_dtype dtype, float v)
{
    if (dtype == MOE_F16)
        return __half2float(__float2half_rn(v));
    if (dtype == MOE_BF16)
        return __bfloat162float(__float2bfloat16_rn(v));
    return v;
}

// The call's device workspace: one allocation, carved in 256-byte aligned pieces.
struct Carver {
    size_t bytes = 0;
    size_t take(int64_t count, size_t elem)
    {
        const size_t at = bytes;
        bytes += ((size_t)(count > 0 ? count : 0) * elem + 255) / 256 * 256;
        return at;
    }
};

MlpArgs base_args(const moe_mlp_problem *p, int op)
{
    MlpArgs g = {};
    g.dt = p->dtype, g.gdt = p->grad_dtype;
    g.T = p->T, g.E = p->E, g.N = p->N, g.B = p->B, g.H = p->H, g.I = p->I, g.NB = p->N * p->B;
    g.token_rows = p->token_rows;
    g.pad = p->padding == MOE_MLP_PAD_ROW ? p->T : -1;
    g.act = (int)p->activation, g.on_i = p->affinity == MOE_AFFINITY_ON_I, g.bias = p->bias;
    g.accumulate = p->accumulate, g.overwrite = p->overwrite, g.op = op;
    g.has_lin_lo = p->has_lin_lo, g.has_lin_hi = p->has_lin_hi, g.has_nl_lo = p->has_nl_lo, g.has_nl_hi = p->has_nl_hi;
    g.lin_lo = p->lin_lo, g.lin_hi = p->lin_hi, g.nl_lo = p->nl_lo, g.nl_hi = p->nl_hi;
    g.b2e = p->block_to_expert, g.ids = p->token_position_to_id;
    return g;
}

// The rows path's choices: split operands (bf16 without round_intermediates), the affinity on m (a_in_m).
void set_rows_path(MlpArgs &g, bool split)
{
    g.split = split;
    g.a_in_m = g.on_i || split;
}

// Runs the layout check and the expert lists (the first kernels of every call).
moe_status launch_layout(const MlpArgs &g, cudaStream_t stream)
{
    const int64_t cap = (int64_t)sm_count() * 8;
    const int64_t most = g.T * g.E > g.NB ? g.T * g.E : g.NB;
    init_kernel<<<grid_for(most > (int64_t)REPORTS ? most : (int64_t)REPORTS, 256, cap), 256, 0, stream>>>(g);
    check_kernel<<<grid_for(g.NB > g.N ? g.NB : g.N, 256, cap), 256, 0, stream>>>(g);
    repeat_kernel<<<grid_for(g.NB, 256, cap), 256, 0, stream>>>(g);
    finalize_kernel<<<1, 32, 0, stream>>>(g);
    expert_lists_kernel<<<1, LIST_THREADS, 0, stream>>>(g);
    MOE_CUDA_CHECK(cudaGetLastError());
    return MOE_OK;
}

// ------------------------------------------------------------------------------------------------
// Rows path, host side
// ------------------------------------------------------------------------------------------------
bool aligned_to(const void *p, uintptr_t bytes) { return ((uintptr_t)p & (bytes - 1)) == 0; }
bool aligned16(const void *p) { return aligned_to(p, 16); }

// Whether gate_bwd_kernel may read each 16-bit checkpoint element through the aligned 32-bit word that holds
// it, taking the half of the element's slot parity: a 16-bit dtype, a 4-byte aligned checkpoint (so that every
// such word lies inside it: a (block, half, i) run of B elements starts at an even index), and B even, so that
// the element of slot b at (half, i), index n*2*I*B + (half*I + i)*B + b, has b's parity for every half and i.
bool ckpt_words(const MlpArgs &g, moe_dtype dt, const void *ckpt)
{
    return dt != MOE_F32 && aligned_to(ckpt, 4) && g.B % 2 == 0;
}

moe_status launch_rows_layout(const MlpArgs &g, cudaStream_t stream)
{
    const int64_t cap = (int64_t)sm_count() * 8;
    block_rows_kernel<<<grid_for(g.N * 32, 256, cap), 256, 0, stream>>>(g);
    row_offsets_kernel<<<1, LIST_THREADS, 0, stream>>>(g);
    row_maps_kernel<<<grid_for(g.N * 32, 256, cap), 256, 0, stream>>>(g);
    if (g.term_offsets != nullptr)
        term_offsets_kernel<<<1, 256, 0, stream>>>(g);
    MOE_CUDA_CHECK(cudaGetLastError());
    return MOE_OK;
}

// One grouped GEMM over the rows, or with term_rows over the split backward's term rows (shapes: gemm_cuda.cuh,
// MoeRowsGemm).
moe_status rows_gemm(const MlpArgs &g, const char *name, int op, moe_dtype out_dtype, int64_t N, int64_t K,
                     const void *a, const void *b, void *out, int accumulate, cudaStream_t stream, bool term_rows = false)
{
    MoeRowsGemm r = {};
    r.name = name, r.op = op, r.dtype = g.dt, r.out_dtype = out_dtype;
    r.E = g.E, r.rows = term_rows ? 3 * g.NB : g.NB, r.N = N, r.K = K;
    r.offsets = term_rows ? g.term_offsets : g.row_offsets, r.status = g.status;
    r.a = a, r.b = b, r.out = out, r.accumulate = accumulate, r.stream = stream;
    return moe_cuda_rows_gemm(&r);
}

// The forward's gate/up GEMM fused with gate_act_kernel's work (moe_cuda_rows_gate_gemm): *fused = 0 when
// the call does not fit it (nothing launched).
moe_status gate_up_fused(const MlpArgs &g, int *fused, cudaStream_t stream)
{
    if (g.split) { // the fused epilogue stores m rounded; split operands take gate_act_kernel
        *fused = 0;
        return MOE_OK;
    }
    MoeRowsGemm r = {};
    r.name = "moe_mlp_fwd (gate/up, fused)", r.op = MOE_ROWS_A_W, r.dtype = g.dt, r.out_dtype = g.dt;
    r.E = g.E, r.rows = g.NB, r.N = g.H, r.K = 2 * g.I;
    r.offsets = g.row_offsets, r.status = g.status;
    r.a = g.Xr, r.b = g.w_gu, r.out = nullptr, r.accumulate = 0, r.stream = stream;
    MoeGateEpilogue e = {};
    e.act = g.act, e.on_i = g.on_i;
    e.I = g.I, e.B = g.B, e.num_blocks = g.N, e.num_experts = g.E;
    e.row_pos = g.row_pos, e.ids = g.ids, e.affinities = g.aff, e.bias = g.bias ? g.b_gu : nullptr;
    e.has_nl_lo = g.has_nl_lo, e.has_nl_hi = g.has_nl_hi, e.has_lin_lo = g.has_lin_lo, e.has_lin_hi = g.has_lin_hi;
    e.nl_lo = g.nl_lo, e.nl_hi = g.nl_hi, e.lin_lo = g.lin_lo, e.lin_hi = g.lin_hi;
    e.m_rows = g.Mr, e.ckpt = g.ckpt_gu, e.m0_rows = g.M0r;
    return moe_cuda_rows_gate_gemm(&r, &e, fused);
}

// gather_rows_kernel, with the affinity gradient's dot product when `dot` (the down checkpoint given).
// Needs the token lists (launch_token_lists).
template <int V, bool SCALE, bool DOT>
void launch_gather(const MlpArgs &g, const void *src, void *dst, void *dst3, cudaStream_t stream)
{
    // copy 8, scaled or with the dot MOE_GATHER_BATCH (2: <= 64 registers)
    constexpr int batch = V == 1 ? 4 : !SCALE && !DOT ? 8 : MOE_GATHER_BATCH;
    const auto kernel = gather_rows_kernel<V, batch, SCALE, DOT>;
    unsigned grid = resident_grid(kernel, 256, host_cdiv((DOT ? g.NB : g.T) * 32, 256));
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

// dst (rows, or NULL) and dst3 (term rows, or NULL: split backward) from src's token rows; see gather_rows_kernel.
moe_status gather_rows(const MlpArgs &g, const void *src, void *dst, void *dst3, bool scale, bool dot, cudaStream_t stream)
{
    if (g.NB > 0 && g.H > 0 && g.T > 0) {
        if (g.dt != MOE_F32 && g.H % 8 == 0 && aligned16(src) && aligned16(dst) && aligned16(dst3) &&
            (!dot || aligned16(g.ckpt_d_in)))
            launch_gather_v<8>(g, src, dst, dst3, scale, dot, stream);
        else
            launch_gather_v<1>(g, src, dst, dst3, scale, dot, stream);
    }
    MOE_CUDA_CHECK(cudaGetLastError());
    return MOE_OK;
}

// dot_kernel with 16-byte vectors when every operand allows them.
moe_status launch_dot(const MlpArgs &g, cudaStream_t stream)
{
    if (g.NB == 0)
        return MOE_OK;
    const int64_t wanted = host_cdiv(g.NB * 32, 256);
    const bool vec = g.H % 8 == 0 && aligned16(g.out_grad) &&
                     (g.ckpt_d_in != nullptr ? aligned16(g.ckpt_d_in) : !g.dre_bias || aligned16(g.b_d));
    if (vec)
        dot_kernel<8><<<resident_grid(dot_kernel<8>, 256, wanted), 256, 0, stream>>>(g);
    else
        dot_kernel<1><<<resident_grid(dot_kernel<1>, 256, wanted), 256, 0, stream>>>(g);
    MOE_CUDA_CHECK(cudaGetLastError());
    return MOE_OK;
}

template <class Kernel>
unsigned gate_tiles_grid(const MlpArgs &g, Kernel kernel)
{
    return resident_grid(kernel, RT * 8, host_cdiv(g.NB, RT) * host_cdiv(g.I, GATE_SPAN));
}

// Calls launch(dt, act) with std::integral_constant values of the call's dtype and activation, so that
// it can name the gate kernel compiled for them (gate_act_kernel / gate_bwd_kernel<DT, ACT>).  Instantiated
// for f16 and bf16 only: the rows path, the only caller, takes no f32 (mlp_api.c clears round_intermediates
// for it), and the f32 instances cost compile time for kernels never launched.  Another dtype or an unknown
// activation launches nothing and fails (neither can come through the front end's checks).
template <class Launch>
moe_status launch_gate_kernel(const MlpArgs &g, const char *op, Launch launch)
{
    auto with_act = [&](auto dt) -> moe_status {
        switch (g.act) {
        case MOE_ACT_SILU: launch(dt, std::integral_constant<int, MOE_ACT_SILU>{}); return MOE_OK;
        case MOE_ACT_GELU: launch(dt, std::integral_constant<int, MOE_ACT_GELU>{}); return MOE_OK;
        case MOE_ACT_GELU_TANH: launch(dt, std::integral_constant<int, MOE_ACT_GELU_TANH>{}); return MOE_OK;
        case MOE_ACT_SWISH: launch(dt, std::integral_constant<int, MOE_ACT_SWISH>{}); return MOE_OK;
        }
        return moe_fail(MOE_ERR_INVALID_OPTION, "%s: activation %d has no gate kernel", op, (int)g.act);
    };
    switch (g.dt) {
    case MOE_F16: return with_act(std::integral_constant<int, MOE_F16>{});
    case MOE_BF16: return with_act(std::integral_constant<int, MOE_BF16>{});
    default:
        return moe_fail(MOE_ERR_UNSUPPORTED, "%s: the rows path's gate kernels take f16 and bf16, not %s", op,
                        moe_dtype_name(g.dt));
    }
}

// The rows path's buffers, in elements (dt ones, then float32 ones); all zero on the tile path.
struct RowsSizes {
    bool active, term_rows;                // term_rows: the split path's term_offsets
    int64_t xr, mr, m0r, sr, dgur, x3, s3; // dt
    int64_t dr, dmr;                       // float32
};

// Allocates the workspace, points g at it, runs the layout kernels and body(g), frees (stream-ordered).
template <class Body>
moe_status with_workspace(const moe_mlp_problem *p, MlpArgs &g, int64_t nM, int64_t nM0, int64_t nContrib,
                          int64_t nDGU, int64_t nDre, int64_t nDa, const RowsSizes &rs, Body body)
{
    cudaStream_t stream = static_cast<cudaStream_t>(p->stream);
    Carver c;
    const size_t o_status = c.take(1 + REPORTS, 8); // status word, then the reports at +8
    const size_t o_pairs = c.take(g.T * g.E, 8);
    const size_t o_first = c.take(g.overwrite ? g.T : 0, 8);
    const size_t o_start = c.take(g.E + 1, 8);
    const size_t o_blocks = c.take(g.N, 8);
    const size_t o_M = c.take(nM, 4), o_M0 = c.take(nM0, 4), o_contrib = c.take(nContrib, 4);
    const size_t o_dgu = c.take(nDGU, 4), o_dre = c.take(nDre, 4), o_da = c.take(nDa, 4);
    const size_t es = moe_dtype_size(g.dt);
    const int64_t rows_n = rs.active ? g.N : 0, rows_nb = rs.active ? g.NB : 0;
    const size_t o_brows = c.take(rows_n, 8), o_bfirst = c.take(rows_n, 8), o_roff = c.take(rs.active ? g.E + 1 : 0, 8);
    const size_t o_rpos = c.take(rows_nb, 8), o_prow = c.take(rows_nb, 8);
    const size_t o_tcount = c.take(g.T, 8), o_tlist = c.take(g.T * g.E, 8), o_texp = c.take(g.T * g.E, 8);
    const size_t o_xr = c.take(rs.xr, es), o_mr = c.take(rs.mr, es), o_m0r = c.take(rs.m0r, es);
    const size_t o_sr = c.take(rs.sr, es), o_dgur = c.take(rs.dgur, es);
    const size_t o_x3 = c.take(rs.x3, es), o_s3 = c.take(rs.s3, es);
    const size_t o_toff = c.take(rs.term_rows ? g.E + 1 : 0, 8);
    const size_t o_dr = c.take(rs.dr, 4), o_dmr = c.take(rs.dmr, 4);
    unsigned char *ws = nullptr;
    cudaError_t err = cudaMallocAsync(&ws, c.bytes, stream);
    if (err != cudaSuccess)
        return moe_fail(err == cudaErrorMemoryAllocation ? MOE_ERR_OUT_OF_MEMORY : MOE_ERR_DEVICE,
                        "%s: cudaMallocAsync of the %zu-byte workspace failed: %s", p->op, c.bytes,
                        cudaGetErrorString(err));
    g.status = reinterpret_cast<int *>(ws + o_status);
    g.reports = reinterpret_cast<long long *>(ws + o_status + 8);
    g.pair_pos = reinterpret_cast<long long *>(ws + o_pairs);
    g.tok_first = g.overwrite ? reinterpret_cast<long long *>(ws + o_first) : nullptr;
    g.expert_start = reinterpret_cast<int64_t *>(ws + o_start);
    g.expert_blocks = reinterpret_cast<int64_t *>(ws + o_blocks);
    g.M = reinterpret_cast<float *>(ws + o_M);
    g.M0 = nM0 > 0 ? reinterpret_cast<float *>(ws + o_M0) : nullptr;
    g.contrib = reinterpret_cast<float *>(ws + o_contrib);
    g.dGU = reinterpret_cast<float *>(ws + o_dgu);
    g.Dre = reinterpret_cast<float *>(ws + o_dre);
    g.da = reinterpret_cast<float *>(ws + o_da);
    g.tok_count = reinterpret_cast<int64_t *>(ws + o_tcount);
    g.tok_list = reinterpret_cast<int64_t *>(ws + o_tlist);
    g.tok_expert = reinterpret_cast<int64_t *>(ws + o_texp);
    if (rs.active) {
        g.block_rows = reinterpret_cast<int64_t *>(ws + o_brows);
        g.block_first = reinterpret_cast<int64_t *>(ws + o_bfirst);
        g.row_offsets = reinterpret_cast<int64_t *>(ws + o_roff);
        g.row_pos = reinterpret_cast<int64_t *>(ws + o_rpos);
        g.pos_row = reinterpret_cast<int64_t *>(ws + o_prow);
        g.Xr = ws + o_xr, g.Mr = ws + o_mr, g.M0r = rs.m0r > 0 ? ws + o_m0r : nullptr;
        g.Sr = ws + o_sr, g.dGUr = ws + o_dgur;
        if (rs.term_rows) {
            g.term_offsets = reinterpret_cast<int64_t *>(ws + o_toff);
            g.X3 = rs.x3 > 0 ? ws + o_x3 : nullptr, g.S3 = rs.s3 > 0 ? ws + o_s3 : nullptr;
        }
        g.Dr = reinterpret_cast<float *>(ws + o_dr);
        g.dMr = reinterpret_cast<float *>(ws + o_dmr);
    }
    moe_status status = launch_layout(g, stream);
    if (status == MOE_OK && rs.active)
        status = launch_rows_layout(g, stream);
    if (status == MOE_OK)
        status = body(g, stream);
    err = cudaFreeAsync(ws, stream);
    if (status == MOE_OK && err != cudaSuccess)
        status = moe_fail(MOE_ERR_DEVICE, "%s: cudaFreeAsync failed: %s", p->op, cudaGetErrorString(err));
    return status;
}

// tok_count, tok_list, tok_expert (token_lists_kernel) for the kernels that walk tokens.
void launch_token_lists(const MlpArgs &g, cudaStream_t stream)
{
    if (g.T > 0)
        token_lists_kernel<<<resident_grid(token_lists_kernel, 256, host_cdiv(g.T * 32, 256)), 256, 0, stream>>>(g);
}

// Needs the token lists (launch_token_lists).
moe_status token_rows(const MlpArgs &g, const float *rows, void *dst, cudaStream_t stream)
{
    if (g.token_rows * g.H == 0)
        return MOE_OK;
    if (g.H % 8 == 0 && aligned16(rows) && aligned16(dst))
        token_rows_kernel<8><<<resident_grid(token_rows_kernel<8>, 256, host_cdiv(g.token_rows * g.H / 8, 256)), 256, 0,
                               stream>>>(g, rows, dst);
    else
        token_rows_kernel<1><<<resident_grid(token_rows_kernel<1>, 256, host_cdiv(g.token_rows * g.H, 256)), 256, 0,
                               stream>>>(g, rows, dst);
    MOE_CUDA_CHECK(cudaGetLastError());
    return MOE_OK;
}

} // namespace

// Forward.  Writes: out (all token_rows rows), gate_up_ckpt_T and down_ckpt when given (every position).
moe_status moe_cuda_mlp_fwd(const moe_mlp_problem *p, const void *hidden, const void *affinities, const void *w_gu,
                            const void *w_d, const void *b_gu, const void *b_d, void *out, void *gate_up_ckpt_T,
                            void *down_ckpt)
{
    MlpArgs g = base_args(p, 0);
    g.hidden = hidden, g.aff = affinities, g.w_gu = w_gu, g.w_d = w_d, g.b_gu = b_gu, g.b_d = b_d;
    g.out = out, g.ckpt_gu = gate_up_ckpt_T, g.ckpt_d = down_ckpt;
    const int64_t NB = g.NB, H = g.H, I = g.I;
    const bool ckpt_from_m0 = g.on_i && down_ckpt != nullptr;
    const bool split = p->dtype == MOE_BF16 && !p->round_intermediates;
    if (p->round_intermediates || split) {
        set_rows_path(g, split);
        RowsSizes rs = {};
        // no fp32 gate/up rows in the workspace: the fused kernel does without them, and the unfused path
        // allocates them itself (805 MB at Qwen3-30B-A3B, T = 16384).  Split: Mr, M0r, Dr and Dre by term rows.
        const int64_t nr = split ? 3 * NB : NB;
        rs.active = true, rs.term_rows = split, rs.xr = NB * H, rs.mr = nr * I, rs.m0r = ckpt_from_m0 ? nr * I : 0;
        rs.dr = nr * H;
        return with_workspace(p, g, 0, 0, 0, 0, ckpt_from_m0 ? nr * H : 0, 0, rs,
                              [&](const MlpArgs &a, cudaStream_t stream) -> moe_status {
            launch_token_lists(a, stream);
            moe_status s = gather_rows(a, a.hidden, a.Xr, nullptr, false, false, stream);
            if (s != MOE_OK)
                return s;
            if ((a.ckpt_gu != nullptr || a.ckpt_d != nullptr) && NB > 0)
                zero_padding_kernel<<<grid_for(a.N * zero_items_per_block(a), 1, (int64_t)sm_count() * 8), 256, 0,
                                      stream>>>(a, (I * a.B) % 4 == 0 && aligned16(a.ckpt_gu),
                                                H % 8 == 0 && aligned16(a.ckpt_d));
            MOE_CUDA_CHECK(cudaGetLastError());
            // the gate/up GEMM with the elementwise step in its epilogue where the sm_90a kernel takes the call;
            // otherwise the GEMM's fp32 rows (allocated here, stream-ordered) and gate_act_kernel
            int fused = 0;
            s = gate_up_fused(a, &fused, stream);
            if (s == MOE_OK && !fused && NB > 0) {
                MlpArgs u = a;
                cudaError_t err = cudaMallocAsync(reinterpret_cast<void **>(&u.GU), (size_t)(NB * 2 * I) * 4, stream);
                if (err != cudaSuccess)
                    return moe_fail(err == cudaErrorMemoryAllocation ? MOE_ERR_OUT_OF_MEMORY : MOE_ERR_DEVICE,
                                    "moe_mlp_fwd: cudaMallocAsync of the %lld-byte gate/up rows failed: %s",
                                    (long long)(NB * 2 * I * 4), cudaGetErrorString(err));
                s = rows_gemm(u, "moe_mlp_fwd (gate/up)", MOE_ROWS_A_W, MOE_F32, H, 2 * I, u.Xr, u.w_gu, u.GU, 0, stream);
                if (s == MOE_OK && NB * I > 0)
                    s = launch_gate_kernel(u, "moe_mlp_fwd", [&](auto dt, auto act) {
                        const auto kernel = gate_act_kernel<decltype(dt)::value, decltype(act)::value>;
                        kernel<<<gate_tiles_grid(u, kernel), dim3(RT, 8), 0, stream>>>(u);
                    });
                err = cudaFreeAsync(u.GU, stream);
                if (s == MOE_OK && err != cudaSuccess)
                    s = moe_fail(MOE_ERR_DEVICE, "moe_mlp_fwd: cudaFreeAsync failed: %s", cudaGetErrorString(err));
            }
            if (s != MOE_OK)
                return s;
            MOE_CUDA_CHECK(cudaGetLastError());
            s = rows_gemm(a, "moe_mlp_fwd (down)", MOE_ROWS_A_W, MOE_F32, I, H, a.Mr, a.w_d, a.Dr, 0, stream, a.split);
            if (s == MOE_OK && ckpt_from_m0)
                s = rows_gemm(a, "moe_mlp_fwd (down checkpoint)", MOE_ROWS_A_W, MOE_F32, I, H, a.M0r, a.w_d, a.Dre, 0,
                              stream, a.split);
            if (s != MOE_OK)
                return s;
            const bool vec = H % 8 == 0 && (!a.bias || aligned16(a.b_d));
            const int ckpt_in_token_out = !a.on_i && a.ckpt_d != nullptr;
            if (NB * H > 0 && a.ckpt_d != nullptr && !ckpt_in_token_out) {
                if (vec && aligned16(a.ckpt_d))
                    down_ckpt_kernel<8><<<resident_grid(down_ckpt_kernel<8>, 256, NB), 256, 0, stream>>>(a);
                else
                    down_ckpt_kernel<1><<<resident_grid(down_ckpt_kernel<1>, 256, NB), 256, 0, stream>>>(a);
            }
            if (a.token_rows * H > 0) {
                const int64_t wanted = host_cdiv(a.token_rows * H, 256);
                if (vec && aligned16(a.out) && (!ckpt_in_token_out || aligned16(a.ckpt_d)))
                    token_out_kernel<8><<<resident_grid(token_out_kernel<8>, 256, wanted), 256, 0, stream>>>(a, ckpt_in_token_out);
                else
                    token_out_kernel<1><<<resident_grid(token_out_kernel<1>, 256, wanted), 256, 0, stream>>>(a, ckpt_in_token_out);
            }
            MOE_CUDA_CHECK(cudaGetLastError());
            return MOE_OK;
        });
    }
    return with_workspace(p, g, NB * I, ckpt_from_m0 ? NB * I : 0, NB * H, 0, 0, 0, RowsSizes{},
                          [&](const MlpArgs &a, cudaStream_t stream) -> moe_status {
        const int64_t rt = host_cdiv(a.B, BM);
        moe_status s = launch_tiles<OpGateUp>(a, a.N * rt * host_cdiv(I, 32), stream);
        if (s == MOE_OK)
            s = launch_tiles<OpDown<DOWN_FORWARD>>(a, a.N * rt * host_cdiv(H, BN), stream);
        if (s == MOE_OK && ckpt_from_m0)
            s = launch_tiles<OpDown<DOWN_CKPT_FROM_M0>>(a, a.N * rt * host_cdiv(H, BN), stream);
        if (s == MOE_OK) {
            launch_token_lists(a, stream);
            s = token_rows(a, a.contrib, a.out, stream);
        }
        return s;
    });
}

// Backward.  Writes: d_hidden (all rows), d_affinities (all T*E), d_w_gu, d_w_d, d_b_gu, d_b_d (every
// element; old + sum with accumulate).
moe_status moe_cuda_mlp_bwd(const moe_mlp_problem *p, const void *hidden, const void *affinities, const void *w_gu,
                            const void *w_d, const void *b_d, const void *gate_up_ckpt_T, const void *down_ckpt,
                            const void *out_grad, void *d_hidden, void *d_affinities, void *d_w_gu, void *d_w_d,
                            void *d_b_gu, void *d_b_d)
{
    MlpArgs g = base_args(p, 1);
    // the masks compare the checkpointed value with the limit as the checkpoint stores it (specs/MLP.md)
    g.lin_lo = round_to(p->dtype, p->lin_lo), g.lin_hi = round_to(p->dtype, p->lin_hi);
    g.nl_lo = round_to(p->dtype, p->nl_lo), g.nl_hi = round_to(p->dtype, p->nl_hi);
    g.hidden = hidden, g.aff = affinities, g.w_gu = w_gu, g.w_d = w_d, g.b_d = b_d;
    g.ckpt_gu_in = gate_up_ckpt_T, g.ckpt_d_in = down_ckpt, g.out_grad = out_grad;
    g.d_hidden = d_hidden, g.d_aff = d_affinities, g.d_wgu = d_w_gu, g.d_wd = d_w_d, g.d_bgu = d_b_gu, g.d_bd = d_b_d;
    const int64_t NB = g.NB, H = g.H, I = g.I, E = g.E;
    const bool recompute = down_ckpt == nullptr; // ON_I only (the front end checked)
    const bool split = p->dtype == MOE_BF16 && !p->round_intermediates;
    if (p->round_intermediates || split) {
        set_rows_path(g, split);
        RowsSizes rs = {};
        // split: Mr, M0r, dGUr, Dr and Dre by term rows, X and G copied to them for the weight gradients (the
        // X rows themselves are not needed)
        const int64_t nr = split ? 3 * NB : NB;
        rs.active = true, rs.term_rows = split, rs.xr = split ? 0 : NB * H, rs.sr = NB * H;
        rs.mr = nr * I, rs.m0r = recompute ? nr * I : 0, rs.dgur = nr * 2 * I, rs.dmr = NB * I, rs.dr = nr * H;
        rs.x3 = split ? 3 * NB * H : 0, rs.s3 = rs.x3;
        g.dre_bias = recompute && g.bias;
        return with_workspace(p, g, 0, 0, 0, 0, recompute ? nr * H : 0, NB, rs,
                              [&](const MlpArgs &a, cudaStream_t stream) -> moe_status {
            const int64_t cap = (int64_t)sm_count() * 16;
            launch_token_lists(a, stream);
            moe_status s = gather_rows(a, a.hidden, a.split ? nullptr : a.Xr, a.X3, false, false, stream);
            if (s == MOE_OK) // da too, from the checkpoint
                s = gather_rows(a, a.out_grad, a.Sr, a.S3, !a.a_in_m, !recompute, stream);
            if (s == MOE_OK)
                s = rows_gemm(a, "moe_mlp_bwd (dM)", MOE_ROWS_A_WT, MOE_F32, I, H, a.Sr, a.w_d, a.dMr, 0, stream);
            if (s != MOE_OK)
                return s;
            if (NB * I > 0)
                s = launch_gate_kernel(a, "moe_mlp_bwd", [&](auto dt, auto act) {
                    const bool words = ckpt_words(a, static_cast<moe_dtype>(decltype(dt)::value), a.ckpt_gu_in);
                    const auto kernel = I % 4 == 0 ? gate_bwd_kernel<decltype(dt)::value, decltype(act)::value, 4>
                                                   : gate_bwd_kernel<decltype(dt)::value, decltype(act)::value, 1>;
                    kernel<<<gate_tiles_grid(a, kernel), dim3(RT, 8), 0, stream>>>(a, words);
                });
            if (s != MOE_OK)
                return s;
            MOE_CUDA_CHECK(cudaGetLastError());
            if (recompute) {
                s = rows_gemm(a, "moe_mlp_bwd (d recomputed)", MOE_ROWS_A_W, MOE_F32, I, H, a.M0r, a.w_d, a.Dre, 0,
                              stream, a.split);
                if (s != MOE_OK)
                    return s;
            }
            if (recompute) {
                s = launch_dot(a, stream);
                if (s != MOE_OK)
                    return s;
            }
            if (a.T * E > 0)
                daff_kernel<<<grid_for(a.T * E, 256, cap), 256, 0, stream>>>(a);
            MOE_CUDA_CHECK(cudaGetLastError());
            s = rows_gemm(a, "moe_mlp_bwd (dX)", MOE_ROWS_A_WT, MOE_F32, H, 2 * I, a.dGUr, a.w_gu, a.Dr, 0, stream,
                          a.split);
            if (s == MOE_OK)
                s = token_rows(a, a.Dr, a.d_hidden, stream);
            if (s == MOE_OK)
                s = rows_gemm(a, "moe_mlp_bwd (d_w_d)", MOE_ROWS_AT_B, a.gdt, I, H, a.Mr, a.split ? a.S3 : a.Sr, a.d_wd,
                              a.accumulate, stream, a.split);
            if (s == MOE_OK)
                s = rows_gemm(a, "moe_mlp_bwd (d_w_gu)", MOE_ROWS_AT_B, a.gdt, H, 2 * I, a.split ? a.X3 : a.Xr, a.dGUr,
                              a.d_wgu, a.accumulate, stream, a.split);
            if (s == MOE_OK && a.bias && E * (H + 2 * I) > 0) {
                rows_bias_grad_kernel<<<grid_for(E * (H + 2 * I), 256, cap), 256, 0, stream>>>(a);
                MOE_CUDA_CHECK(cudaGetLastError());
            }
            return s;
        });
    }
    return with_workspace(p, g, NB * I, recompute ? NB * I : 0, NB * H, NB * 2 * I, recompute ? NB * H : 0, NB,
                          RowsSizes{}, [&](const MlpArgs &a, cudaStream_t stream) -> moe_status {
        const int64_t rt = host_cdiv(a.B, BM), cap = (int64_t)sm_count() * 16;
        moe_status s = launch_tiles<OpDm>(a, a.N * rt * host_cdiv(I, BN), stream);
        if (s == MOE_OK && recompute)
            s = launch_tiles<OpDown<DOWN_RECOMPUTE>>(a, a.N * rt * host_cdiv(H, BN), stream);
        if (s != MOE_OK)
            return s;
        s = launch_dot(a, stream);
        if (s != MOE_OK)
            return s;
        if (a.T * E > 0)
            daff_kernel<<<grid_for(a.T * E, 256, cap), 256, 0, stream>>>(a);
        MOE_CUDA_CHECK(cudaGetLastError());
        s = launch_tiles<OpDx>(a, a.N * rt * host_cdiv(H, BN), stream);
        if (s == MOE_OK) {
            launch_token_lists(a, stream);
            s = token_rows(a, a.contrib, a.d_hidden, stream);
        }
        if (s == MOE_OK)
            s = launch_tiles<OpDwD>(a, E * host_cdiv(I, BM) * host_cdiv(H, BN), stream);
        if (s == MOE_OK)
            s = launch_tiles<OpDwGu>(a, E * host_cdiv(H, BM) * host_cdiv(2 * I, BN), stream);
        if (s == MOE_OK && a.bias && E * (H + 2 * I) > 0) {
            bias_grad_kernel<<<grid_for(E * (H + 2 * I), 256, cap), 256, 0, stream>>>(a);
            MOE_CUDA_CHECK(cudaGetLastError());
        }
        return s;
    });
}

moe_status moe_cuda_mlp_take_error(void)
{
    DeviceError record;
    MOE_CUDA_CHECK(cudaMemcpyFromSymbol(&record, g_mlp_sticky_error, sizeof record));
    if (record.kind == ERR_NONE)
        return MOE_OK;
    const DeviceError cleared = {};
    MOE_CUDA_CHECK(cudaMemcpyToSymbol(g_mlp_sticky_error, &cleared, sizeof cleared));
    const char *op = record.op == 0 ? "moe_mlp_fwd" : "moe_mlp_bwd";
    static const char where[] = "(CUDA, detected on the device; the call wrote nothing)";
    switch (record.kind) {
    case ERR_EXPERT:
        return moe_fail(MOE_ERR_INVALID_INDEX, "%s %s: layout.block_to_expert[%lld] = %lld, expected an expert in "
                        "[0, %lld)", op, where, record.index, record.value, record.E);
    case ERR_TOKEN:
        return moe_fail(MOE_ERR_INVALID_INDEX, "%s %s: layout.token_position_to_id[%lld] = %lld (block %lld, slot "
                        "%lld), expected a token in [0, %lld) or the padding mark %lld of %s", op, where,
                        record.index, record.value, record.index / record.B, record.index % record.B, record.T,
                        record.pad, record.pad < 0 ? "MOE_MLP_PAD_SKIP" : "MOE_MLP_PAD_ROW");
    case ERR_PAIR:
        return moe_fail(MOE_ERR_INVALID_ROUTING, "%s %s: layout.token_position_to_id[%lld] and [%lld] both place "
                        "token %lld with expert %lld, expected each (token, expert) pair at most once", op, where,
                        record.other, record.index, record.value, record.expert);
    case ERR_TOP1:
        return moe_fail(MOE_ERR_INVALID_OPTION, "%s %s: options.tensor_update_overwrite is set but token %lld sits "
                        "at layout.token_position_to_id[%lld] and [%lld], expected each token at most once (top-1)",
                        op, where, record.value, record.other, record.index);
    }
    return moe_fail(MOE_ERR_DEVICE, "%s %s: unknown device error record %d", op, where, record.kind);
}
