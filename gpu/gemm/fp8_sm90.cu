// The FP8 grouped GEMM's Hopper kernel (sm_90a): fwd and dX with the scales of include/moe_fp8.h on FP8 tensor
// cores (wgmma m64n128k32 on the e4m3 / e5m2 codes as they are), the contract of gemm/fp8.cu's portable kernel
// and of the reference (specs/FP8.md).
//
//   fwd: X codes [M or T][K] (1 x 128 scales), W codes [E][N][K] (128 x 128 blocks) -> Y [M][N]
//   dX:  dY codes [M][N] (1 x 128 scales), W codes [E][N][K]                       -> dX [M or T][K] (or fp32
//        slot rows for reduce_topk); or from W^T codes [E][K][N] (w_transposed: f.w_kn)
// Tiles of 128 rows x 128 columns; a k-step is one 128-element tile of the reduction (128 bytes of codes per
// row: exactly the 128-byte swizzle's row), so each k-step's four wgmma k32 give that tile's partial sums in
// fresh registers, promoted as the reference promotes them: acc = acc + part * (s_a(row) * s_w), two roundings
// (__fmul_rn / __fadd_rn: never contracted), tiles in ascending order.  What differs from the reference is only
// the sum of a tile's 128 products inside the tensor core (specs/FP8.md, "The accumulator of Hopper's FP8
// wgmma").  A producer warpgroup fills a ring of stages: A (X or dY) by TMA when its rows are the expert-order
// rows (rows past the expert belong to the next one and are never stored), or by cp.async from the gathered
// rows (fwd permute_x, dX permute_y; zeros past the expert); W's fwd box straight into the stage by TMA; dX's W
// box [n][c] by TMA into a staging buffer one step ahead, then transposed to [c][n] by the producers, since FP8
// wgmma reads no transposed operand (transpose_w_box); dX from W^T: W^T's box [c][n] straight into the stage, as
// the forward's.  Two consumer warpgroups each multiply 64 rows; the
// epilogue is store_output's (gemm/epilogue.cuh: topk weights, permute_y / permute_x, reduce_topk's
// workspace, accumulate, the rounding) two columns at a time, or, where the output's rows are in tile order and
// overwritten (g.tma_out), gemm/tma_store.cuh's: the rounded values in swizzled boxes of shared memory, written by
// TMA stores (gemm/heuristics.cu, fp8_sm90_tma_store).  Persistent CTAs take tiles in tile_coord's order.
// A step's scales: for fwd and dX from W^T the producers stage them in shared memory one step ahead; for dX from W
// each consumer thread reads its three from global memory (gemm/heuristics.cu, fp8_sm90_staged_scales, says why).
// Tiles of 128 x 256 where W's boxes go straight into the stage and the experts have rows for two row tiles on
// average (gemm/heuristics.cu, fp8_sm90_wide_tiles).
#include <cuda.h>

#include "common/cp_async.cuh"
#include "common/cuda_check.cuh"
#include "common/launch.cuh"
#include "gemm/epilogue.cuh"
#include "gemm/fp8.cuh"
#include "gemm/heuristics.cuh"
#include "gemm/sm90.cuh"
#include "gemm/tma_store.cuh"
#include "gemm/wgmma_fp8.cuh"

namespace moe_gpu {
namespace {

// Q_BN: the columns of one wgmma (m64n128k32) and of a W block; a tile has Q_BN columns, or 2 Q_BN with WIDE (two
// W blocks per k-step, each consumer warpgroup's two column halves multiplied and promoted in turn)
constexpr int Q_BM = 128, Q_BN = 128, Q_BK = F8_TILE;
constexpr int Q_A_BYTES = Q_BM * Q_BK, Q_B_BYTES = Q_BN * Q_BK;
constexpr int Q_PRODUCERS = 128, Q_CONSUMERS = 256, Q_THREADS = Q_PRODUCERS + Q_CONSUMERS;
// The shared memory of the kernel: the ring of stages (6; 5 where the producers transpose W's boxes), for the
// transposition (TRANSPOSE_W: dX from W) two staging buffers of W boxes as TMA writes them ([n][c], before it), the barriers (full[S],
// empty[S], dX: staged[2]), the gathered rows of A (int64 [2][Q_BM], by tile parity), with staged scales each
// stage's scales as the producers decode them (float [S][Q_SCALES]: A's row i at i, W's block at Q_BM) and the
// coordinates of the tile each stage belongs to (TileCoord [S]), and the epilogue's boxes (g.tma_out: H_EPI_BOXES
// swizzled 1 KiB boxes per consumer warp, gemm/tma_store.cuh).
constexpr int Q_SCALES = Q_BM + 4; // a stage's scales, padded to 16 bytes
template <bool TRANSPOSE_W, bool WIDE> struct Fp8Smem {
    static constexpr int BN = WIDE ? 2 * Q_BN : Q_BN, B_BYTES = BN * Q_BK, STAGE_BYTES = Q_A_BYTES + B_BYTES;
    static constexpr int STAGES = TRANSPOSE_W ? 5 : WIDE ? 4 : 6;
    static constexpr int STAGING_OFFSET = STAGES * STAGE_BYTES;
    static constexpr int BARRIER_OFFSET = STAGING_OFFSET + (TRANSPOSE_W ? 2 * Q_B_BYTES : 0);
    static constexpr int ROWS_OFFSET = BARRIER_OFFSET + (2 * STAGES + 2) * 8;
    static constexpr int SCALES_OFFSET = ROWS_OFFSET + 2 * Q_BM * 8;
    static constexpr int TILES_OFFSET = SCALES_OFFSET + STAGES * Q_SCALES * 4;
    static constexpr int EPI_OFFSET = (TILES_OFFSET + STAGES * (int)sizeof(TileCoord) + 1023) / 1024 * 1024;
    static constexpr int EPI_WARP_BYTES = H_EPI_BOXES * H_TMA_BOX_BYTES;
    static constexpr size_t BYTES = 1024 /* alignment */ + EPI_OFFSET + (Q_CONSUMERS / 32) * EPI_WARP_BYTES;
    static_assert(BYTES <= 232448, "shared memory of one CTA");
};
static_assert(Q_BK == 128, "a k-step is one scale tile of 128 codes, one 128-byte swizzled row");
// Registers per thread (setmaxnreg); WIDE: the consumers hold 128 accumulators and 64 partial sums.  The split must
// fit the launch's registers (gemm/sm90.cuh, H_LAUNCH_REGS), or the consumers' setmaxnreg.inc waits forever.
template <bool WIDE> struct Fp8Regs {
    static constexpr int PRODUCER = WIDE ? 40 : 56, CONSUMER = WIDE ? 232 : 224;
    static_assert(PRODUCER * Q_PRODUCERS + CONSUMER * Q_CONSUMERS <= H_LAUNCH_REGS && Q_THREADS == H_THREADS,
                  "the launch's registers (gemm/sm90.cuh, H_LAUNCH_REGS)");
};

#ifdef MOE_SM90A_DEVICE
// The epilogue of one consumer thread's accumulators (gemm/epilogue.cuh's store_output, two columns at a time):
// acc[4 j + 2 h + x] is row row_in_tile + 8 h, column 8 j + 2 (lane % 4) + x of the tile.  Per element v = w * v
// (topk weights), then into reduce_topk's fp32 workspace as it is, or v = old + v (accumulate) and one rounding;
// a pair of columns is one 32-bit (16-bit outputs) or 64-bit (f32) store where the row length is even and the
// output aligned, else element by element.
template <int BN>
__device__ __forceinline__ void store_fragment(const GemmArgs &g, const TileCoord &t, int row_in_tile, int lane,
                                               const float *acc)
{
    int64_t out_row[2];
    float weight[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int64_t gi = t.i0 + row_in_tile + 8 * h, r = g.ws.offsets[t.e] + gi;
        out_row[h] = gi >= t.rows ? -1
                   : g.op == OP_FWD ? y_row(g, r)
                   : g.permute_x || g.out_is_workspace ? slot_of(g, r) : r;
        weight[h] = gi < t.rows && g.weights ? topk_weight(g, r) : 1.0f;
    }
    const int64_t ld = g.cols_j;
    const moe_dtype out_dtype = g.out_is_workspace ? MOE_F32 : g.out_dtype;
    const bool accumulate = g.accumulate && !g.out_is_workspace;
    const bool pairs = ld % 2 == 0 && (reinterpret_cast<uintptr_t>(g.out) & (out_dtype == MOE_F32 ? 7u : 3u)) == 0;
#pragma unroll
    for (int j = 0; j < BN / 8; j++) {
        const int64_t col = t.j0 + 8 * j + 2 * (lane % 4);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            if (out_row[h] < 0 || col >= ld)
                continue;
            float v[2] = {acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]};
            if (g.weights)
                v[0] = weight[h] * v[0], v[1] = weight[h] * v[1];
            const int64_t index = out_row[h] * ld + col;
            if (pairs) { // col + 1 < ld too: ld even, col even
                if (out_dtype == MOE_F32) {
                    float2 *word = reinterpret_cast<float2 *>(static_cast<float *>(g.out) + index);
                    if (accumulate) {
                        const float2 old = *word;
                        v[0] = old.x + v[0], v[1] = old.y + v[1];
                    }
                    *word = make_float2(v[0], v[1]);
                } else {
                    uint32_t *word = reinterpret_cast<uint32_t *>(static_cast<uint16_t *>(g.out) + index);
                    if (accumulate) {
                        float old[2];
                        unpack_word(out_dtype, *word, old);
                        v[0] = old[0] + v[0], v[1] = old[1] + v[1];
                    }
                    *word = pack_word(out_dtype, v[0], v[1]);
                }
            } else {
#pragma unroll
                for (int x = 0; x < 2; x++)
                    if (col + x < ld)
                        store_from_float(out_dtype, g.out, index + x,
                                         accumulate ? load_as_float(out_dtype, g.out, index + x) + v[x] : v[x]);
            }
        }
    }
}

// dX's B operand: W[e]'s box [n 128][c 128] as TMA wrote it (128-byte swizzle: byte (n, c) at n * 128 + 16 ((c /
// 16) ^ (n % 8)) + c % 16) into the stage's K-major tile [c 128][n 128] (byte (c, n) at c * 128 + 16 ((n / 16) ^ (c %
// 8)) + n % 16), which FP8 wgmma needs (it transposes no 8-bit operand).  Each of the 128 producer threads moves 8
// blocks of 4 x 4 bytes (4 n rows of one 32-bit column word -> 4 c rows of one n word, by byte permutes).  The
// block of lane L (bits L0..L4) in round idx = 8 warp + u: cb = L0..L3 | cb4, nb = (L4 ^ cb4) | (L1..L3 ^ d) | nb4
// (d = idx % 8, cb4 = idx / 8 % 2, nb4 = idx / 16): the 32 lanes of a load hit 32 banks, and so do those of a store.
__device__ __forceinline__ void transpose_w_box(uint32_t staging, uint32_t stage_b, int p)
{
    const int lane = p % 32, warp = p / 32;
#pragma unroll 1
    for (int u = 0; u < 8; u++) {
        const int idx = 8 * warp + u, d = idx & 7, cb4 = (idx >> 3) & 1, nb4 = idx >> 4;
        const int cb = (lane & 15) | cb4 << 4;
        const int nb = ((lane >> 4) ^ cb4) | ((((lane >> 1) & 7) ^ d) << 1) | nb4 << 4;
        uint32_t r[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int n = 4 * nb + i;
            asm volatile("ld.shared.b32 %0, [%1];\n"
                         : "=r"(r[i])
                         : "r"(staging + n * 128 + ((((cb >> 2) ^ (n & 7)) << 4) | ((cb & 3) << 2))));
        }
        const uint32_t t0 = __byte_perm(r[0], r[1], 0x5140), t1 = __byte_perm(r[0], r[1], 0x7362);
        const uint32_t t2 = __byte_perm(r[2], r[3], 0x5140), t3 = __byte_perm(r[2], r[3], 0x7362);
        const uint32_t o[4] = {__byte_perm(t0, t2, 0x5410), __byte_perm(t0, t2, 0x7632), __byte_perm(t1, t3, 0x5410),
                               __byte_perm(t1, t3, 0x7632)}; // o[j]: W[4 nb + 0..3][4 cb + j]
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int c = 4 * cb + j;
            sts_b32(stage_b + c * 128 + ((((nb >> 2) ^ (c & 7)) << 4) | ((nb & 3) << 2)), o[j]);
        }
    }
}

// The producers' position: a tile of this CTA (in tile_coord's order) and a k-step of it.
struct Fp8Cursor {
    int64_t tile, step, count; // count: tiles of this CTA before this one
    TileCoord t;
};
template <int BN> __device__ __forceinline__ void cursor_start(const GemmArgs &g, int64_t tiles, Fp8Cursor *c)
{
    c->tile = blockIdx.x, c->step = 0, c->count = 0;
    if (c->tile < tiles)
        c->t = tile_coord(g, c->tile, Q_BM, BN);
}
template <int BN>
__device__ __forceinline__ void cursor_next(const GemmArgs &g, int64_t tiles, int64_t steps, Fp8Cursor *c)
{
    if (++c->step < steps)
        return;
    c->step = 0, c->count++, c->tile += gridDim.x;
    if (c->tile < tiles)
        c->t = tile_coord(g, c->tile, Q_BM, BN);
}
#endif

// OP: OP_FWD or OP_DX; TA, TB: the codes of A (X or dY) and W (0 e4m3, 1 e5m2); GATHER: A's rows by cp.async from
// the gathered rows (fwd with permute_x, dX with permute_y), else by TMA (maps.a).  WT (dX only): W is given as
// W^T (f.w_kn).  A step's W box: fwd, and dX from W^T, by TMA straight into the stage (K-major: rows n or c, 128
// codes of the reduction), dX from W by TMA into a staging buffer, one step ahead, then transposed by the producers
// (transpose_w_box).  STAGED: the producers read each step's scales (producer p A's
// row p, producer 0 also W's), one step ahead, into the stage's scales in shared memory, and the consumers read
// their three there, and the tile's coordinates from the stage of its first k-step (producer 0 writes each
// stage's); else each consumer thread reads its own scales from global memory before the stage's wait, and
// searches the tile's coordinates itself (tile_coord).  WIDE (STAGED, A by TMA, W's boxes straight into the stage):
// tiles of 2 Q_BN columns, a k-step's W box two blocks (two W scales, staged by producers 0 and 1), each consumer
// warpgroup's two halves of 64 x 128 multiplied and promoted in turn (one set of partial sums): half the bytes from
// the L2 per multiply-add of the 128-column tiles.
template <int OP, int TA, int TB, bool GATHER, bool STAGED, bool WT, bool WIDE>
__global__ void __launch_bounds__(Q_THREADS, 1) fp8_sm90_kernel(const Fp8Args f, const __grid_constant__ Fp8Sm90Maps maps)
{
#ifdef MOE_SM90A_DEVICE
    constexpr bool DX = OP == OP_DX, TRANSPOSE_W = DX && !WT;
    static_assert(DX || !WT, "W^T is dX's form only");
    static_assert(!WIDE || (!TRANSPOSE_W && STAGED && !GATHER), "wide tiles: staged scales, A by TMA, W untransposed");
    using L = Fp8Smem<TRANSPOSE_W, WIDE>;
    constexpr int BN = L::BN, HALVES = WIDE ? 2 : 1;
    const GemmArgs &g = f.g;
    unsigned char *smem = dynamic_smem_1k();
    const uint32_t smem_base = (uint32_t)__cvta_generic_to_shared(smem);
    const uint32_t full_bar = smem_base + L::BARRIER_OFFSET, empty_bar = full_bar + L::STAGES * 8;
    const uint32_t staged_bar = empty_bar + L::STAGES * 8; // dX: staged[2]
    int64_t *row_table = reinterpret_cast<int64_t *>(smem + L::ROWS_OFFSET);
    float *stage_scales = reinterpret_cast<float *>(smem + L::SCALES_OFFSET); // [S][Q_SCALES], STAGED
    TileCoord *stage_tiles = reinterpret_cast<TileCoord *>(smem + L::TILES_OFFSET); // [S], STAGED
    if (*g.ws.status != 0) // the routing or a scale was refused: nothing is read or written
        return;
    if (threadIdx.x == 0) {
        for (int s = 0; s < L::STAGES; s++) {
            // thread 0's arrival (expect_tx); with GATHER each producer's cp.async arrival; TRANSPOSE_W each
            // producer's arrival after its part of the transposition; STAGED each producer's after its scale's store
            const int producer_arrivals = (GATHER ? 1 : 0) + (TRANSPOSE_W ? 1 : 0) + (STAGED ? 1 : 0);
            mbar_init(full_bar + 8 * s, 1 + producer_arrivals * Q_PRODUCERS);
            mbar_init(empty_bar + 8 * s, Q_CONSUMERS / 32);
        }
        mbar_init(staged_bar, 1);
        mbar_init(staged_bar + 8, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        fence_proxy_async();
    }
    __syncthreads();
    const int64_t qlen = DX ? g.N : g.K; // the reduction
    const int64_t tiles = total_tiles(g, Q_BM, BN), steps = (qlen + Q_BK - 1) / Q_BK;

    if (threadIdx.x < Q_PRODUCERS) {
        // ------------------------------------------------------------------ producer warpgroup
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Fp8Regs<WIDE>::PRODUCER));
        const int p = threadIdx.x;
        if (!GATHER && !TRANSPOSE_W && !STAGED && p > 0) // every load is thread 0's TMA
            return;
        const uint64_t w_policy = l2_policy(true); // a W block is read again by the expert's other row tiles
        // a step's W box: fwd (k q0, n j0) and dX from W^T (n q0, c j0) into the stage; dX from W (c j0, n q0) into
        // a staging buffer
        auto load_w = [&](const Fp8Cursor &c, uint32_t dst, uint32_t bar) {
            const int q0 = (int)(c.step * Q_BK);
            tma_load_3d(dst, &maps.w, bar, TRANSPOSE_W ? (int)c.t.j0 : q0, TRANSPOSE_W ? q0 : (int)c.t.j0, (int)c.t.e,
                        w_policy);
        };
        Fp8Cursor cur, next;
        cursor_start<BN>(g, tiles, &cur);
        next = cur;
        cursor_next<BN>(g, tiles, steps, &next);
        // STAGED: this thread's scales of a cursor's step (A's row p of the tile, and for p = 0 W's block, WIDE p = 1
        // W's second block), read one step ahead of the stage they go into; rows past the expert and a second block
        // past the output's columns get 0 (never stored)
        int64_t scale_row = -1; // A's source row p of the cursor's tile
        auto step_scales = [&](const Fp8Cursor &c, float *sa, float *sw) {
            if (c.step == 0)
                scale_row = a_source_row(g, c.t, c.t.i0 + p, DX);
            *sa = scale_row >= 0 ? fp8_a_scale(f, scale_row, c.step) : 0.0f;
            const int64_t w_col = c.t.j0 + (WIDE && p == 1 ? Q_BN : 0);
            *sw = p < HALVES && w_col < g.cols_j ? fp8_w_scale(f, c.t.e, c.step, w_col) : 0.0f;
        };
        float sa_cur = 0.0f, sw_cur = 0.0f;
        if (STAGED && cur.tile < tiles && steps > 0)
            step_scales(cur, &sa_cur, &sw_cur);
        if (TRANSPOSE_W && p == 0 && cur.tile < tiles && steps > 0) {
            mbar_arrive_expect_tx(staged_bar, Q_B_BYTES);
            load_w(cur, smem_base + L::STAGING_OFFSET, staged_bar);
        }
        for (uint32_t it = 0; cur.tile < tiles && steps > 0; it++, cur = next, cursor_next<BN>(g, tiles, steps, &next)) {
            const int s = (int)(it % L::STAGES);
            const uint32_t bar = full_bar + 8 * s;
            const uint32_t sa_addr = smem_base + s * L::STAGE_BYTES, sb_addr = sa_addr + Q_A_BYTES;
            const int q0 = (int)(cur.step * Q_BK);
            int64_t *tile_rows = row_table + (cur.count & 1) * Q_BM; // by tile parity: the last tile's may be in use
            if (GATHER && cur.step == 0) {
                for (int i = p; i < Q_BM; i += Q_PRODUCERS)
                    tile_rows[i] = a_source_row(g, cur.t, cur.t.i0 + i, DX);
                producer_sync();
            }
            if (TRANSPOSE_W && p == 0 && next.tile < tiles) { // the next step's W box, into the other staging buffer
                const uint32_t nb = staged_bar + 8 * ((it + 1) & 1);
                mbar_arrive_expect_tx(nb, Q_B_BYTES);
                load_w(next, smem_base + L::STAGING_OFFSET + ((it + 1) & 1) * Q_B_BYTES, nb);
            }
            float sa_next = 0.0f, sw_next = 0.0f;
            if (STAGED && next.tile < tiles)
                step_scales(next, &sa_next, &sw_next);
            mbar_wait(empty_bar + 8 * s, ((it / L::STAGES) & 1) ^ 1);
            if (STAGED) {
                float *scales = stage_scales + s * Q_SCALES;
                scales[p] = sa_cur;
                if (p < HALVES)
                    scales[Q_BM + p] = sw_cur;
                mbar_arrive(bar); // release: the consumers' wait on the full barrier sees the stores
                sa_cur = sa_next, sw_cur = sw_next;
            }
            if (p == 0) {
                if (STAGED)
                    stage_tiles[s] = cur.t; // seen by the consumers after their wait, as the scales (the arrive releases)
                mbar_arrive_expect_tx(bar, (GATHER ? 0 : Q_A_BYTES) + (TRANSPOSE_W ? 0 : L::B_BYTES));
                if (!GATHER)
                    tma_load_2d(sa_addr, &maps.a, bar, q0, (int)(g.ws.offsets[cur.t.e] + cur.t.i0));
                if (!TRANSPOSE_W)
                    load_w(cur, sb_addr, bar);
            }
            if (GATHER) { // thread p copies 16-code chunk p % 8 of rows p / 8 + 16 u
                const int kc = p & 7;
                const bool k_ok = q0 + kc * 16 < qlen;
                unsigned char *sa = smem + s * L::STAGE_BYTES;
#pragma unroll
                for (int u = 0; u < Q_BM / 16; u++) {
                    const int i = (p >> 3) + 16 * u;
                    const int64_t row = tile_rows[i];
                    const bool ok = row >= 0 && k_ok;
                    cp_async16(sa + kmajor_offset(i, kc), ok ? f.a + row * qlen + q0 + kc * 16 : f.a, ok);
                }
                cp_async_arrive_noinc(bar);
            }
            if (TRANSPOSE_W) {
                mbar_wait(staged_bar + 8 * (it & 1), (it / 2) & 1);
                transpose_w_box(smem_base + L::STAGING_OFFSET + (it & 1) * Q_B_BYTES, sb_addr, p);
                fence_proxy_async(); // the transposed box is read by wgmma (the async proxy)
                mbar_arrive(bar);
                producer_sync(); // the staging buffer is read before thread 0 loads into it again (next step)
            }
        }
    } else {
        // ------------------------------------------------------------------ consumer warpgroups
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Fp8Regs<WIDE>::CONSUMER));
        const int wg = threadIdx.x / 128 - 1, warp_in_wg = threadIdx.x % 128 / 32, lane = threadIdx.x % 32;
        const int row_in_tile = wg * 64 + warp_in_wg * 16 + lane / 4; // and row_in_tile + 8 (the wgmma layout)
        // g.tma_out: this warp's boxes, used in turn; a tile's first box waits until the previous tile's stores
        // have read all of them (gemm/tma_store.cuh)
        EpiSlots slots;
        slots.own_addr = smem_base + L::EPI_OFFSET + (threadIdx.x / 32 - Q_PRODUCERS / 32) * L::EPI_WARP_BYTES;
        slots.spare_addr = 0, slots.count = H_EPI_BOXES, slots.used = 0, slots.next = 0;
        const uint64_t out_policy = l2_evict_first_policy();
        uint32_t it = 0;
        float part[64];
#pragma unroll
        for (int i = 0; i < 64; i++)
            part[i] = 0.0f; // overwritten by each k-step's first wgmma (scale_d = 0)
        for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
            // the tile's coordinates: STAGED, from the stage of its first k-step (the producers' search, not a
            // second one here); else searched here, for the rows whose scales are read before the stage's wait
            TileCoord t = {0, 0, 0, 0};
            int64_t row0 = -1, row1 = -1;
            if (!STAGED || steps == 0) {
                t = tile_coord(g, tile, Q_BM, BN);
                row0 = a_source_row(g, t, t.i0 + row_in_tile, DX);
                row1 = a_source_row(g, t, t.i0 + row_in_tile + 8, DX);
            }
            float acc[64 * HALVES]; // half h's columns at 64 h
#pragma unroll
            for (int i = 0; i < 64 * HALVES; i++)
                acc[i] = 0.0f;
            for (int64_t step = 0; step < steps; step++, it++) {
                const int s = (int)(it % L::STAGES);
                // this tile's scales: STAGED, the stage's (after the wait); else read before the wait so that
                // their latency hides behind it
                float sw = 0.0f, sw1 = 0.0f, sa0 = 0.0f, sa1 = 0.0f; // sw1: WIDE's second W block
                if (!STAGED) {
                    sw = fp8_w_scale(f, t.e, step, t.j0);
                    sa0 = row0 >= 0 ? fp8_a_scale(f, row0, step) : 0.0f;
                    sa1 = row1 >= 0 ? fp8_a_scale(f, row1, step) : 0.0f;
                }
                mbar_wait(full_bar + 8 * s, (it / L::STAGES) & 1);
                if (STAGED) {
                    if (step == 0)
                        t = stage_tiles[s];
                    const float *scales = stage_scales + s * Q_SCALES;
                    sw = scales[Q_BM], sa0 = scales[row_in_tile], sa1 = scales[row_in_tile + 8];
                    if (WIDE)
                        sw1 = scales[Q_BM + 1];
                }
                const uint32_t sa_addr = smem_base + s * L::STAGE_BYTES + wg * (Q_A_BYTES / 2);
                const uint32_t sb_addr = smem_base + s * L::STAGE_BYTES + Q_A_BYTES;
                if (GATHER)
                    fence_proxy_async(); // the rows came through cp.async (generic proxy); wgmma reads via the async proxy
#pragma unroll
                for (int h = 0; h < HALVES; h++) { // half h: the stage's W rows Q_BN h .. Q_BN h + 127
                    wgmma_fence(); // after the previous half's promotion read `part`
#pragma unroll
                    for (int kk = 0; kk < Q_BK / 32; kk++)
                        wgmma_fp8_m64n128k32<TA, TB>(part, smem_descriptor(sa_addr + kk * 32, 16, 1024),
                                                     smem_descriptor(sb_addr + h * Q_B_BYTES + kk * 32, 16, 1024),
                                                     kk > 0);
                    wgmma_commit();
                    wgmma_wait<0>();
                    if (h == HALVES - 1) {
                        __syncwarp();
                        if (lane == 0)
                            mbar_arrive(empty_bar + 8 * s); // the stage is read: the producer may refill it
                    }
                    // promotion, the reference's two roundings per element
                    const float w_scale = h == 0 ? sw : sw1;
                    const float scale0 = __fmul_rn(sa0, w_scale), scale1 = __fmul_rn(sa1, w_scale);
#pragma unroll
                    for (int i = 0; i < 64; i++)
                        acc[64 * h + i] = __fadd_rn(acc[64 * h + i], __fmul_rn(part[i], i % 4 < 2 ? scale0 : scale1));
                }
            }
            if (g.tma_out) {
                const int64_t warp_row0 = t.i0 + wg * 64 + warp_in_wg * 16; // the warp's first row in the expert
                float row_weight[2] = {1.0f, 1.0f};
#pragma unroll
                for (int h = 0; h < 2; h++)
                    if (g.weights && warp_row0 + lane / 4 + 8 * h < t.rows)
                        row_weight[h] = topk_weight(g, g.ws.offsets[t.e] + warp_row0 + lane / 4 + 8 * h);
                slots.used = slots.count;
                // the output is f32 or bf16 (include/moe_fp8.h)
                if (g.out_dtype == MOE_F32)
                    h_store_warp_tma<__nv_bfloat16, OP, BN, 4>(g, t, acc, slots, warp_row0, g.ws.offsets[t.e] + warp_row0, 0,
                                                                row_weight, g.weights != nullptr, &maps.out, out_policy);
                else
                    h_store_warp_tma<__nv_bfloat16, OP, BN, 2>(g, t, acc, slots, warp_row0, g.ws.offsets[t.e] + warp_row0, 0,
                                                                row_weight, g.weights != nullptr, &maps.out, out_policy);
            } else {
                store_fragment<BN>(g, t, row_in_tile, lane, acc);
            }
        }
        if (g.tma_out && lane == 0)
            bulk_wait_all(); // the boxes stay in use until TMA has read them
    }
#endif
}

template <int OP, int TA, int TB, bool STAGED, bool WT, bool WIDE> void *kernel_for(bool gather)
{
    if constexpr (WIDE) // A by TMA only (fp8_sm90_plan)
        return reinterpret_cast<void *>(fp8_sm90_kernel<OP, TA, TB, false, STAGED, WT, true>);
    else
        return gather ? reinterpret_cast<void *>(fp8_sm90_kernel<OP, TA, TB, true, STAGED, WT, false>)
                      : reinterpret_cast<void *>(fp8_sm90_kernel<OP, TA, TB, false, STAGED, WT, false>);
}
template <int OP, bool STAGED, bool WT, bool WIDE> void *kernel_for(int ta, int tb, bool gather)
{
    return ta ? (tb ? kernel_for<OP, 1, 1, STAGED, WT, WIDE>(gather) : kernel_for<OP, 1, 0, STAGED, WT, WIDE>(gather))
              : (tb ? kernel_for<OP, 0, 1, STAGED, WT, WIDE>(gather) : kernel_for<OP, 0, 0, STAGED, WT, WIDE>(gather));
}
// The instantiations launched: per op (fwd, dX from W, dX from W^T), staged scales or not, and with staged scales
// on W's boxes as they are (fwd, dX from W^T) wide tiles or not
template <int OP, bool WT> void *kernel_for(int ta, int tb, bool gather, bool staged, bool wide)
{
    if constexpr (OP == OP_FWD || WT)
        if (wide)
            return kernel_for<OP, true, WT, true>(ta, tb, gather);
    return staged ? kernel_for<OP, true, WT, false>(ta, tb, gather) : kernel_for<OP, false, WT, false>(ta, tb, gather);
}

} // namespace

Fp8Sm90Plan fp8_sm90_plan(Fp8Args *fp, Fp8Sm90Maps *maps)
{
    const Fp8Args &f = *fp;
    const GemmArgs &g = f.g;
    *maps = Fp8Sm90Maps{};
    fp->g.tma_out = 0;
    const bool dx = g.op == OP_DX;
    // wide tiles (gemm/heuristics.cu, fp8_sm90_wide_tiles): W's boxes as they are (fwd, dX from W^T), staged
    // scales, A by TMA; W boxes of 2 Q_BN rows
    fp->sm90_wide = (!dx || f.w_kn) && !(dx ? g.permute_y : g.permute_x) && fp8_sm90_staged_scales(g.op, f.w_kn) &&
                    fp8_sm90_wide_tiles(g.op, g.M, g.E);
    const int64_t qlen = dx ? g.N : g.K; // A's rows: [rows][qlen]
    if ((g.op != OP_FWD && !dx) || !sm90_path_available() || g.K % 16 != 0 || (dx && g.N % 16 != 0) ||
        !aligned16(f.a) || !aligned16(f.b))
        return FP8_SM90_NOT_ITS_SHAPE;
    // W [E][N][K]: fwd boxes {128 k, 128 n} (K-major as the stage wants them), dX {128 c, 128 n} (transposed
    // by the producers); W^T [E][K][N] (dX, w_kn): boxes {128 n, 128 c}, as the stage wants them
    const uint64_t w_rows = f.w_kn ? g.K : g.N, w_cols = f.w_kn ? g.N : g.K;
    const uint64_t w_dims[3] = {w_cols, w_rows, (uint64_t)g.E};
    const uint64_t w_strides[2] = {w_cols, w_rows * w_cols};
    const uint32_t box[3] = {Q_BK, Q_BN, 1}, w_box[3] = {Q_BK, fp->sm90_wide ? 2u * Q_BN : Q_BN, 1};
    if (!encode_tensor_map(&maps->w, f.b_dtype, f.b, 3, w_dims, w_strides, w_box))
        return FP8_SM90_MAPS_REFUSED;
    if (!(dx ? g.permute_y : g.permute_x)) { // else A's rows are gathered by cp.async
        const uint64_t a_dims[2] = {(uint64_t)qlen, (uint64_t)g.M}, a_strides[1] = {(uint64_t)qlen};
        if (!encode_tensor_map(&maps->a, f.a_dtype, f.a, 2, a_dims, a_strides, box))
            return FP8_SM90_MAPS_REFUSED;
    }
    // the output by TMA stores: its rows in tile order (fwd without permute_y; dX without permute_x and not into
    // reduce_topk's workspace) and overwritten; where the driver refuses the map, the register epilogue
    const bool rows_in_order = dx ? !g.permute_x && !g.out_is_workspace : !g.permute_y;
    if (rows_in_order && !g.accumulate && g.M > 0 && fp8_sm90_tma_store(g.op))
        fp->g.tma_out = encode_out_boxes_map(&maps->out, g.out_dtype, g.out, (uint64_t)g.cols_j, (uint64_t)g.M, 1);
    return FP8_SM90_TAKES;
}

moe_status launch_fp8_sm90(const Fp8Args &f, const Fp8Sm90Maps &maps, int64_t max_tiles, cudaStream_t stream)
{
    const int ta = f.a_dtype == MOE_E5M2, tb = f.b_dtype == MOE_E5M2;
    const bool dx = f.g.op == OP_DX, gather = dx ? f.g.permute_y != 0 : f.g.permute_x != 0;
    const bool staged = fp8_sm90_staged_scales(f.g.op, f.w_kn), wide = f.sm90_wide != 0;
    void *kernel = !dx ? kernel_for<OP_FWD, false>(ta, tb, gather, staged, wide)
                 : f.w_kn ? kernel_for<OP_DX, true>(ta, tb, gather, staged, wide)
                          : kernel_for<OP_DX, false>(ta, tb, gather, staged, false);
    // the epilogue's boxes only with TMA stores: what a launch leaves of the SM's shared memory is the L1 cache's,
    // through which dX's consumers read their scales
    const size_t epi_bytes = f.g.tma_out ? 0 : (Q_CONSUMERS / 32) * Fp8Smem<false, false>::EPI_WARP_BYTES;
    const size_t smem_bytes = (dx && !f.w_kn ? Fp8Smem<true, false>::BYTES
                               : wide        ? Fp8Smem<false, true>::BYTES
                                             : Fp8Smem<false, false>::BYTES) - epi_bytes;
    return launch_fp8_sm90_kernel(kernel, f, maps, max_tiles, Q_THREADS, smem_bytes, stream);
}

moe_status launch_fp8_sm90_kernel(void *kernel, const Fp8Args &f, const Fp8Sm90Maps &maps, int64_t max_tiles,
                                  int threads, size_t smem_bytes, cudaStream_t stream)
{
    MOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_bytes));
    void *args[2] = {const_cast<Fp8Args *>(&f), const_cast<Fp8Sm90Maps *>(&maps)};
    MOE_CUDA_CHECK(cudaLaunchKernel(kernel, dim3(persistent_grid(max_tiles, 1)), dim3(threads), args, smem_bytes,
                                    stream));
    return MOE_OK;
}

} // namespace moe_gpu
