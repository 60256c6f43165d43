// The sm90 family's 128 x 256 GEMM kernel (Hopper, sm_90a: warp-specialised, wgmma fed by TMA and cp.async;
// fwd, dX, dW) and launch_sm90, which also launches the dW ping-pong kernel (gemm/sm90_dw_pingpong.cu).
//
// A warp-specialised persistent kernel: one CTA per SM, 384 threads in three warpgroups.
//   warpgroup 0 (producer, 56 registers): fills a 4-stage shared-memory ring.  The weight tile W[e]
//     (fwd, dX) is a box of the 3-D tensor [E][N][K] loaded by TMA (cp.async.bulk.tensor), zero-filled
//     past N and K.  Rows of X / dY come by TMA too when they are contiguous (g.tma_rows: no permute on
//     that operand; 2-D maps over [rows][cols]); gathered rows (permute_x, permute_y) come by cp.async,
//     16 bytes per thread, zero-filled past the expert's rows.  dW's last, partial k-step comes in the
//     same 64-row TMA boxes as the others, and the consumers zero its rows past the expert
//     (h_zero_tail_rows) before their MMAs, so the producer never waits on a load.  With every operand
//     by TMA (g.tma_rows) only warp 0 of the warpgroup runs the ring.  Each stage has a `full` mbarrier
//     (one arrival per ring thread, for its cp.async, + thread 0's arrival, which carries the TMA byte
//     count) and an `empty` mbarrier (one arrival per consumer warp).
//   warpgroups 1 and 2 (consumers, 224 registers): warpgroup w computes half of the BM x BN output tile
//     (see the tile shapes below) with wgmma (128 fp32 accumulators per thread), then each warp writes
//     its rows through a small private fp32 staging buffer with 16-byte stores (topk weight,
//     accumulate, one rounding) while the producer is already loading the next tile; where the output
//     is overwritten and its rows are in tile order (g.tma_out: dW, fwd without permute_y, dX without
//     permute_x or reduce_topk), the warps round into swizzled shared-memory boxes that TMA stores, and
//     go on to the next tile's MMAs while the stores drain (fwd and dX borrow the stage of the tile's
//     last k-step for those boxes, once both warpgroups' MMAs are done with it, until the next tile's
//     second k-step; dW with every operand and a 16-bit output by TMA rounds each warpgroup's 64 x 256
//     half into 8 KiB boxes of 64 rows, h_store_wg_wide, the WIDE variant with its own shared-memory
//     layout).  An m64 block whose rows all lie past the expert's end issues no MMAs (unless
//     g.full_blocks: gemm/heuristics.cu's sm90_full_blocks).  bf16 dW with fused topk weights (WEIGHTED) takes
//     A = w * dY from registers: ldmatrix.trans, the exact two-term split of the sm80 kernel, wgmma on both
//     terms.
// Tiles are handed out statically (tile = blockIdx.x + i * gridDim.x) or, for fwd and dX with long reductions
// (g.dynamic_tiles, h_run_scheduler), dynamically in the same order from a per-call counter; within an expert
// consecutive tiles walk down the rows first, so CTAs running together share one block of W[e] in L2.  Each
// output tile is owned by one CTA that reduces in a fixed order: results are bitwise reproducible.
//
// Paired kernel (CLUSTER = 2; fwd and dX with 128-row tiles; the heuristic takes it for fwd when
// K >= H_PAIRED_REDUCTION with long experts, sm90_cluster_size in gemm/heuristics.cu; autotune may take it for dX too):
// clusters of two CTAs take units of work (pair_unit_coord in gemm/args.cuh).  A pair unit is two row tiles of
// one expert with the same W block: each CTA's producer loads half of that block by TMA multicast into both
// CTAs (box BN/2 n rows for fwd, half the 64 x 64 boxes for dX), so W crosses L2 -> SM once per pair.  Each
// CTA's full barrier expects the whole block's bytes; its empty barrier counts the consumer warps of both
// CTAs (a stage is refilled in both CTAs by either producer), so consumers arrive on both CTAs' empty
// barriers (mapa + remote arrive).  After the pair units come the lone tiles (an expert's odd last row
// tile), two per unit, of different experts, each CTA loading its own W block without multicast; a CTA
// without a tile still arrives on the barriers so its partner's producer never waits on it.
//
// dW ping-pong kernel (sm90_dw_pingpong_kernel, gemm/sm90_dw_pingpong.cu): for dW with short experts (at most
// H_DW_PINGPONG_ROWS rows on average, gemm/heuristics.cu) each consumer warpgroup owns whole 128 x 128 tiles and the
// two take turns at the tensor cores, so one's epilogue overlaps the other's MMAs.
//
// Shared-memory layouts, 128-byte swizzle (16-byte chunk c of 128-byte row r sits at chunk c ^ (r & 7),
#include "common/cp_async.cuh"
#include "common/cuda_check.cuh"
#include "common/launch.cuh"
#include "gemm/epilogue.cuh"
#include "gemm/heuristics.cuh"
#include "gemm/plan.cuh"
#include "gemm/sm90.cuh"
#include "gemm/sm90_dw_pingpong.cuh"
#include "gemm/tma_store.cuh"

namespace moe_gpu {
namespace {

#ifdef MOE_SM90A_DEVICE

// Writes a consumer warp's 16 x BN slice of an m64 block: d[4j + 2h + {0, 1}] is (row lane/4 + 8h of the
// warp, column 8j + 2(lane%4) + {0, 1}).  Per 32-column chunk the warp stages its fp32 values in shared
// memory (`stage`, 16 x H_EPI_LD floats), then each lane writes 8 consecutive columns of output row
// out_row[h] (-1: none) with 16-byte stores.  Order of moe_ref.h: v = acc; v = w * v; v = old + v; one rounding.
template <int BN>
__device__ __forceinline__ void h_store_warp_slice(const GemmArgs &g, const TileCoord &t, const float *d, float *stage,
                                                   const int64_t *out_row, const float *row_weight, bool weighted)
{
    const int lane = threadIdx.x % 32;
    const int64_t ld = g.op == OP_FWD ? g.N : g.K;
    const moe_dtype out_dtype = g.out_is_workspace ? MOE_F32 : g.out_dtype;
#pragma unroll
    for (int c = 0; c < BN / 32; c++) {
        if (t.j0 + 32 * c >= g.cols_j)
            break;
        __syncwarp();
#pragma unroll
        for (int jj = 0; jj < 4; jj++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                *reinterpret_cast<float2 *>(stage + (lane / 4 + 8 * h) * H_EPI_LD + 8 * jj + 2 * (lane % 4)) =
                    make_float2(d[4 * (4 * c + jj) + 2 * h], d[4 * (4 * c + jj) + 2 * h + 1]);
        __syncwarp();
        const int64_t gj = t.j0 + 32 * c + 8 * (lane % 4);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            if (out_row[h] < 0 || gj >= g.cols_j)
                continue;
            const float *src = stage + (lane / 4 + 8 * h) * H_EPI_LD + 8 * (lane % 4);
            const float4 lo = *reinterpret_cast<const float4 *>(src), hi = *reinterpret_cast<const float4 *>(src + 4);
            float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
            finish8(g, v, weighted, row_weight[h], out_dtype, out_row[h] * ld + gj);
        }
    }
}

// The wide dW epilogue of consumer warpgroup wg (all its 128 threads call it): its 64 x 256 slice of the
// 128 x 256 tile (rows t.i0 + 64 wg .., columns t.j0 ..; d: this thread's m64n256 accumulators) rounded into
// four 8 KiB boxes of 64 columns, written in turn into the warpgroup's ring of two (ring_addr; next_slot runs
// on across tiles), each stored by TMA through maps.out_wide by the warpgroup's thread 0 (the map clips rows
// past N and columns past K).  A box is overwritten two boxes after its store was issued; thread 0 waits for
// its stores to have read their boxes (bulk_wait_read<0>: the previous box's, which ran while this one was
// written) before the warpgroup barrier that precedes the next store, so after that barrier the other box
// of the ring is free.  Named barrier 3 + wg: the warpgroup alone.
template <typename T>
__device__ __forceinline__ void h_store_wg_wide(const GemmArgs &g, const TileCoord &t, const float *d, int wg,
                                                uint32_t ring_addr, int &next_slot, const CUtensorMap *map,
                                                uint64_t policy)
{
    const int lane_in_wg = threadIdx.x % 128, warp_in_wg = lane_in_wg / 32;
    const int64_t row0 = t.i0 + 64 * wg;
    if (row0 >= g.N) // the same for the whole warpgroup
        return;
#pragma unroll
    for (int c = 0; c < 4; c++) {
        const int64_t col0 = t.j0 + 64 * c;
        if (col0 >= g.cols_j)
            break;
        const uint32_t box_addr = ring_addr + next_slot * H_WIDE_BOX_BYTES;
        next_slot ^= 1;
        h_store_box_rows<T>(box_addr, warp_in_wg * 16, d, 8 * c);
        fence_proxy_async(); // the box's generic-proxy writes before the TMA (async proxy) reads it
        if (lane_in_wg == 0)
            bulk_wait_read<0>();
        named_sync(3 + wg, 128);
        if (lane_in_wg == 0)
            tma_store_3d(map, box_addr, (int)col0, (int)row0, (int)t.e, policy);
    }
}

// Dynamic tiles (sm90_gemm_kernel with g.dynamic_tiles and every operand by TMA).  A CTA's first tile is
// blockIdx.x, as in the static order; each later one is gridDim.x + the next value of the call's tile counter
// (zeroed by the call's first kernel), so that a CTA whose tiles were short (an expert's last row tile) takes
// more of them and none waits at the end for a CTA that drew several long ones.  Tiles are still taken in
// tile order (L2 sharing as in the static order), and each is reduced by one CTA in a fixed order: results
// stay bitwise reproducible.  The claim is the atomic of a scheduler, lane 0 of producer warp 1 (idle when
// every operand comes by TMA): producer thread 0 asks for the next tile (the request barrier) when it issues
// the current tile's last H_STAGES k-steps (at once for a tile without k-steps) and takes the answer (the done
// barrier) when it reaches that tile, so the atomic's latency is off the ring's path.  (The claim made by thread
// 0 itself, at the tile's start or H_STAGES k-steps ahead, measured the same: all three ran Qwen3-30B-A3B
// slower than the static order while reading fewer bytes, which is why gemm/heuristics.cu's sm90_dynamic_tiles takes
// them only for long reductions; bench/RESULTS.md, the section ending "device tool): dynamic tiles".  The
// cause, found later: a claimed tile runs where and when a CTA asks, not beside the tiles it shares data with;
// gemm/heuristics.cu's sm90_dynamic_tiles.)  Thread 0 then hands the tile number to the consumers: number tile_count
// of a CTA goes into slot tile_count % H_TILE_QUEUE once the consumers took the number that slot held before
// (its empty barrier).
__device__ __forceinline__ void h_publish_tile(volatile int64_t *queue_tiles, uint32_t tile_full_bar,
                                               uint32_t tile_empty_bar, int64_t tile_count, int64_t tile)
{
    const int q = (int)(tile_count % H_TILE_QUEUE);
    const uint32_t round = (uint32_t)(tile_count / H_TILE_QUEUE);
    mbar_wait(tile_empty_bar + 8 * q, (round & 1) ^ 1);
    queue_tiles[q] = tile;
    mbar_arrive(tile_full_bar + 8 * q); // release: the consumers' wait on it acquires the slot's value
}

// The scheduler (one thread, see above): answers each request of producer thread 0 with a claimed tile
// number, until it claims one past the last tile (the producer stops there and asks no more).
__device__ __forceinline__ void h_run_scheduler(const GemmArgs &g, int64_t tiles, volatile int64_t *claimed_tile,
                                                uint32_t request_bar, uint32_t done_bar)
{
    for (uint32_t n = 0;; n++) {
        mbar_wait(request_bar, n & 1);
        const int64_t tile = (int64_t)gridDim.x + (int64_t)atomicAdd(g.ws.tile_counter, 1ull);
        *claimed_tile = tile;
        mbar_arrive(done_bar); // release: the producer's wait on it acquires the tile number
        if (tile >= tiles)
            return;
    }
}

// The consumers' tile number tile_count: every consumer thread waits for its slot; each warp's lane 0 frees
// the slot once the warp has read it.
__device__ __forceinline__ int64_t h_take_tile(volatile int64_t *queue_tiles, uint32_t tile_full_bar,
                                               uint32_t tile_empty_bar, int64_t tile_count, int lane)
{
    const int q = (int)(tile_count % H_TILE_QUEUE);
    mbar_wait(tile_full_bar + 8 * q, (uint32_t)(tile_count / H_TILE_QUEUE) & 1);
    const int64_t tile = queue_tiles[q];
    __syncwarp();
    if (lane == 0)
        mbar_arrive(tile_empty_bar + 8 * q);
    return tile;
}

#endif

// CLUSTER = 2: the paired kernel (file header).  Its CTAs walk their k-steps in lockstep (every unit has the
// same number: K for fwd, N for dX), since a stage is refilled only when the consumers of both released it.
// WIDE: dW with the wide epilogue (h_store_wg_wide; launched only with g.tma_rows and g.tma_out_wide), its
// own shared-memory layout (H_WIDE_SMEM_BYTES).  WEIGHTED: bf16 dW with fused topk weights: the producer
// also writes each stage's 64 row weights (H_WEIGHTS_OFFSET, before its arrival on the stage's full barrier)
// and the consumers take A = w * dY through registers (h_mma_step_weighted).
template <typename T, int OP, int BM, int CLUSTER, bool WIDE = false, bool WEIGHTED = false>
__global__ void __launch_bounds__(H_THREADS, 1)
    sm90_gemm_kernel(const GemmArgs g, const __grid_constant__ Sm90Maps maps)
{
#ifdef MOE_SM90A_DEVICE
    static_assert(!WIDE || (OP == OP_DW && BM == 128 && CLUSTER == 1), "the wide epilogue: dW");
    static_assert(!WEIGHTED || (OP == OP_DW && !WIDE && std::is_same<T, __nv_bfloat16>::value),
                  "weighted: bf16 dW without the wide epilogue (its own shared-memory layout)");
    unsigned char *smem = dynamic_smem_1k();
    float *stage_weights = reinterpret_cast<float *>(smem + H_WEIGHTS_OFFSET); // WEIGHTED: [H_STAGES][H_BK]
    const uint32_t smem_base = (uint32_t)__cvta_generic_to_shared(smem);
    const uint32_t full_bar = smem_base + (WIDE ? H_WIDE_BARRIER_OFFSET : H_BARRIER_OFFSET), empty_bar = full_bar + H_STAGES * 8;
    int64_t *row_table = WIDE ? nullptr : reinterpret_cast<int64_t *>(smem + H_ROWS_OFFSET);
    // dynamic tiles (h_run_scheduler and h_publish_tile above): the consumers' queue of H_TILE_QUEUE slots, each
    // with a full barrier (thread 0's arrival) and an empty one (one arrival per consumer warp); the scheduler's
    // answer and its request and done barriers (one arrival each)
    const int queue_offset = WIDE ? H_WIDE_QUEUE_OFFSET : H_QUEUE_OFFSET;
    volatile int64_t *queue_tiles = reinterpret_cast<volatile int64_t *>(smem + queue_offset);
    volatile int64_t *claimed_tile = queue_tiles + 3 * H_TILE_QUEUE;
    const uint32_t tile_full_bar = smem_base + queue_offset + H_TILE_QUEUE * 8, tile_empty_bar = tile_full_bar + H_TILE_QUEUE * 8;
    const uint32_t request_bar = tile_empty_bar + H_TILE_QUEUE * 8 + 8, done_bar = request_bar + 8;
    const bool dynamic = CLUSTER == 1 && g.dynamic_tiles && g.tma_rows;
    constexpr int TRANS_A = OP == OP_DW ? 1 : 0;
    constexpr int TRANS_B = OP == OP_FWD ? 0 : 1;
    constexpr int BN = h_bn(BM);
    constexpr int A_BYTES = BM * H_BK * 2, B_BYTES = BN * H_BK * 2;
    constexpr int M_BLOCKS = BM / 128; // m64 blocks per consumer warpgroup
    static_assert(A_BYTES + B_BYTES == H_STAGE_BYTES, "stage size");
    static_assert(CLUSTER == 1 || (CLUSTER == 2 && OP != OP_DW && BM == 128), "the paired kernel: fwd and dX, 128 rows");
    if (*g.ws.status != 0) // the same word for both CTAs of a cluster: both return
        return;
    // Producer threads that run the ring: all 128 when rows come by cp.async; with every operand by TMA only
    // thread 0 issues loads, so warp 0 alone runs it and warps 1-3 wait at the kernel's end instead of
    // polling the barriers beside the consumers.
    const int loaders = g.tma_rows ? 32 : H_PRODUCERS;
    if (threadIdx.x == 0) {
        for (int s = 0; s < H_STAGES; s++) {
            mbar_init(full_bar + 8 * s, loaders + 1); // the loaders' (cp.async) arrivals + thread 0's (expect_tx) arrival
            mbar_init(empty_bar + 8 * s, CLUSTER * H_CONSUMERS / 32);
        }
        for (int q = 0; q < H_TILE_QUEUE; q++) {
            mbar_init(tile_full_bar + 8 * q, 1);
            mbar_init(tile_empty_bar + 8 * q, H_CONSUMERS / 32);
        }
        mbar_init(request_bar, 1);
        mbar_init(done_bar, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        fence_proxy_async();
    }
    if (CLUSTER > 1)
        cluster_sync(); // the partner's barriers are initialised before anything arrives on them
    else
        __syncthreads();
    const int64_t tiles = CLUSTER > 1 ? total_pair_units(g) : total_tiles(g, BM, BN);
    const int rank = CLUSTER > 1 ? (int)cluster_register(0) : 0;
    const int64_t first_tile = CLUSTER > 1 ? cluster_register(1) : blockIdx.x;
    const int64_t tile_stride = CLUSTER > 1 ? cluster_register(2) : gridDim.x;
    // the tile of this CTA for a tile (paired kernel: unit) number; *multicast: W comes by multicast (pair unit)
    auto coord = [&](int64_t tile, bool *multicast) -> TileCoord {
        *multicast = false;
        return CLUSTER > 1 ? pair_unit_coord(g, tile, rank, BM, BN, multicast) : tile_coord(g, tile, BM, BN);
    };

    if (threadIdx.x < H_PRODUCERS) {
        // ------------------------------------------------------------------ producer warpgroup
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(H_PRODUCER_REGS));
        const int p = threadIdx.x;
        const T *A = static_cast<const T *>(g.a);
        const T *B = static_cast<const T *>(g.b);
        const uint64_t w_policy = l2_policy(!(g.sm90_skip & 16));
        uint32_t it = 0; // k-steps issued by this CTA over all its tiles (the consumers count the same)
        if (dynamic && p == 32 && first_tile < tiles)
            h_run_scheduler(g, tiles, claimed_tile, request_bar, done_bar);
        int64_t tile = first_tile;
        for (int64_t tile_count = 0; p < loaders; tile_count++) {
            if (dynamic) { // (loaders == 32: warp 0)
                if (p == 0) {
                    if (tile_count > 0) {
                        mbar_wait(done_bar, (uint32_t)(tile_count - 1) & 1);
                        tile = *claimed_tile;
                    }
                    h_publish_tile(queue_tiles, tile_full_bar, tile_empty_bar, tile_count, tile);
                }
                tile = __shfl_sync(0xffffffffu, tile, 0);
            } else if (tile_count > 0) {
                tile += tile_stride;
            }
            if (tile >= tiles)
                break;
            bool multicast;
            const TileCoord t = coord(tile, &multicast);
            // no rows (no loads, no MMAs): only the idle CTA of the paired kernel's last lone-tile unit
            const bool has_rows = CLUSTER == 1 || t.i0 < t.rows;
            const int64_t qlen = reduction_length(g, t.e);
            const int64_t steps = (qlen + H_BK - 1) / H_BK;
            if (dynamic && p == 0 && steps == 0)
                mbar_arrive(request_bar); // no k-step to ask at: the scheduler claims the next tile now
            const int64_t base = g.ws.offsets[t.e];
            // fwd, dX with gathered rows: source rows of A for this tile (-1 past m_e), double-buffered by
            // tile parity
            int64_t *tile_rows = row_table + (tile_count & 1) * BM;
            if (OP != OP_DW && !g.tma_rows) {
                for (int i = p; i < BM; i += H_PRODUCERS) {
                    const int64_t gi = t.i0 + i;
                    tile_rows[i] = gi < t.rows ? (OP == OP_DX ? y_row(g, base + gi) : x_row(g, base + gi)) : -1;
                }
                producer_sync();
            }
            for (int64_t step = 0; step < steps; step++, it++) {
                const int s = (int)(it % H_STAGES);
                const uint32_t bar = full_bar + 8 * s;
                if (dynamic && p == 0 && step == (steps > H_STAGES ? steps - H_STAGES : 0))
                    mbar_arrive(request_bar); // the scheduler claims the next tile
                mbar_wait(empty_bar + 8 * s, ((it / H_STAGES) & 1) ^ 1);
                unsigned char *sa = smem + s * H_STAGE_BYTES, *sb = sa + A_BYTES;
                const uint32_t sa_addr = smem_base + s * H_STAGE_BYTES, sb_addr = sa_addr + A_BYTES;
                const int64_t q0 = step * H_BK;
                if (g.sm90_skip & 4) {
                    cp_async_arrive_noinc(bar);
                    if (p == 0)
                        mbar_arrive(bar);
                    continue;
                }
                // dW reads 64-row steps of the expert by TMA in 64-row boxes (the consumers zero the rows of
                // the last step past the expert), or by cp.async when the rows are gathered
                const bool dw_by_tma = OP == OP_DW && (WIDE || g.tma_rows);
                if (p == 0) {
                    if (OP == OP_FWD || OP == OP_DX) {
                        // W: fwd boxes of BN / CLUSTER n-rows ({64 k, BN / CLUSTER n}, K-major), dX boxes {64 c,
                        // 64 n} (MN-major); paired kernel, pair unit: this CTA loads part `rank` into both CTAs
                        const bool rows_by_tma = g.tma_rows && has_rows;
                        const uint32_t a_bytes = rows_by_tma ? A_BYTES : 0, b_bytes = has_rows ? B_BYTES : 0;
                        if (a_bytes + b_bytes > 0)
                            mbar_arrive_expect_tx(bar, a_bytes + b_bytes);
                        else
                            mbar_arrive(bar);
                        if (rows_by_tma) // rows base + i0 ..: rows past m_e belong to the next expert, never stored
                            tma_load_2d(sa_addr, &maps.rows_a, bar, (int)q0, (int)(base + t.i0));
                        constexpr int W_BOXES = OP == OP_FWD ? CLUSTER : BN / 64;
                        constexpr int W_BOX_BYTES = B_BYTES / W_BOXES;
                        constexpr int PART_BOXES = W_BOXES / CLUSTER; // boxes of one CTA's part of a pair unit
#pragma unroll
                        for (int a = 0; a < W_BOXES; a++) { // unrolled: the unpaired kernel's loads are straight-line
                            if (!has_rows || (multicast && a / PART_BOXES != rank))
                                continue;
                            const uint32_t dst = sb_addr + a * W_BOX_BYTES;
                            const int c0 = OP == OP_FWD ? (int)q0 : (int)(t.j0 + 64 * a);
                            const int c1 = OP == OP_FWD ? (int)(t.j0 + a * (BN / W_BOXES)) : (int)q0;
                            if (multicast)
                                tma_load_3d_multicast(dst, &maps.w, bar, c0, c1, (int)t.e, (1u << CLUSTER) - 1, w_policy);
                            else
                                tma_load_3d(dst, &maps.w, bar, c0, c1, (int)t.e, w_policy);
                        }
                    } else if (dw_by_tma) {
                        h_load_dw_stage<BM / 64, BN / 64>(maps, bar, sa_addr, sb_addr, t.i0, t.j0, base + q0);
                    } // dW by cp.async: thread 0 arrives after the producers' barrier below
                }
                if (OP != OP_DW && !g.tma_rows && has_rows) { // A K-major, BM rows x 8 chunks: thread p copies chunk p % 8 of BM/16 rows
                    const int kc = p & 7;
                    const int64_t lda = OP == OP_DX ? g.N : g.K;
                    const bool k_ok = q0 + kc * 8 < qlen;
#pragma unroll
                    for (int u = 0; u < BM / 16; u++) {
                        const int i = (p >> 3) + 16 * u;
                        const int64_t row = tile_rows[i];
                        const bool ok = row >= 0 && k_ok;
                        cp_async16(sa + kmajor_offset(i, kc), ok ? A + row * lda + q0 + kc * 8 : A, ok);
                    }
                } else if (OP == OP_DW && !WIDE && !g.tma_rows) {
                    static_assert(OP != OP_DW || (BM == 128 && BN == 256), "dW's cp.async layout");
                    int64_t *rows = row_table + s * 128; // [0, 64): dY rows, [64, 128): X rows of this k-step
                    const int64_t q = q0 + (p & 63);
                    rows[p] = q < qlen ? (p < 64 ? y_row(g, base + q) : x_row(g, base + q)) : -1;
                    if (WEIGHTED && p < 64)
                        stage_weights[s * H_BK + p] = q < qlen ? topk_weight(g, base + q) : 0.0f;
                    producer_sync();
                    if (p == 0) // after the barrier: its release covers the weights the other producers wrote
                        mbar_arrive(bar);
#pragma unroll
                    for (int u = 0; u < 8; u++) { // A MN-major [k 64][n 128]: 16 chunks per k row
                        const int c = p + H_PRODUCERS * u, k = c >> 4, mc = c & 15;
                        const int64_t row = rows[k];
                        const bool ok = row >= 0 && t.i0 + mc * 8 < g.N;
                        cp_async16(sa + mnmajor_offset(k, mc), ok ? A + row * g.N + t.i0 + mc * 8 : A, ok);
                    }
#pragma unroll
                    for (int u = 0; u < 16; u++) { // B MN-major [k 64][c 256]: 32 chunks per k row
                        const int c = p + H_PRODUCERS * u, k = c >> 5, mc = c & 31;
                        const int64_t row = rows[64 + k];
                        const bool ok = row >= 0 && t.j0 + mc * 8 < g.cols_j;
                        cp_async16(sb + mnmajor_offset(k, mc), ok ? B + row * g.K + t.j0 + mc * 8 : B, ok);
                    }
                }
                if (WEIGHTED && g.tma_rows) // each of warp 0's lanes: two rows' weights, before its own arrival
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int64_t q = q0 + p + 32 * h;
                        stage_weights[s * H_BK + p + 32 * h] = q < qlen ? topk_weight(g, base + q) : 0.0f;
                    }
                if (g.tma_rows)
                    mbar_arrive(bar);
                else
                    cp_async_arrive_noinc(bar);
            }
        }
    } else {
        // ------------------------------------------------------------------ consumer warpgroups
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(H_CONSUMER_REGS));
        const int wg = threadIdx.x / 128 - 1, lane_in_wg = threadIdx.x % 128;
        const int warp_in_wg = lane_in_wg / 32, lane = lane_in_wg % 32;
        const int consumer_warp = threadIdx.x / 32 - H_PRODUCERS / 32;
        float *epi_stage = reinterpret_cast<float *>(smem + H_EPI_OFFSET + consumer_warp * H_EPI_WARP_BYTES);
        EpiSlots slots;
        slots.used = 0, slots.next = 0; // dW's ring: no store in flight yet
        int wide_slot = 0;              // WIDE: the warpgroup's ring box to write next
        slots.own_addr = smem_base + H_EPI_OFFSET + consumer_warp * H_EPI_WARP_BYTES;
        const uint64_t out_policy = l2_evict_first_policy();
        // fwd and dX with TMA stores: the consumers keep the stage of a tile's last k-step (`held`) as spare
        // output boxes, so that a warp writes its whole slice without waiting for its stores, and give it back
        // to the producer once their stores have read it: after the next tile's second k-step is issued (the
        // producer meanwhile fills the other three stages), or at once when that tile has fewer steps.  Not
        // dW: its tiles have only 4-5 k-steps (the expert's rows), and there the fourth stage for the next
        // tile is worth more than the waits, even when the stage goes back after the first k-step
        // (bench/RESULTS.md, "Epilogue boxes: batches, a whole slice per warp, the held last stage").
        constexpr bool HOLD_LAST_STAGE = OP != OP_DW;
        int held = -1;
        uint32_t it = 0;
        // a stage goes back to the producer of every CTA that loads into it
        auto release = [&](uint32_t stage) {
            if (lane != 0)
                return;
            if (CLUSTER > 1) {
#pragma unroll
                for (int c = 0; c < CLUSTER; c++)
                    mbar_arrive_in_cta(empty_bar + 8 * stage, (uint32_t)c);
            } else {
                mbar_arrive(empty_bar + 8 * stage);
            }
        };
        auto release_held = [&]() {
            if (lane == 0)
                bulk_wait_read<0>();
            __syncwarp();
            release((uint32_t)held);
            held = -1;
        };
        for (int64_t tile_count = 0;; tile_count++) {
            const int64_t tile = dynamic ? h_take_tile(queue_tiles, tile_full_bar, tile_empty_bar, tile_count, lane)
                                         : first_tile + tile_count * tile_stride;
            if (tile >= tiles)
                break;
            bool multicast;
            const TileCoord t = coord(tile, &multicast);
            const int64_t qlen = reduction_length(g, t.e);
            const int64_t steps = (qlen + H_BK - 1) / H_BK;
            // an m64 block whose rows are all past the expert's last row skips its MMAs (the other blocks
            // then have the tensor cores to themselves), unless g.full_blocks keeps every tile as long; the
            // stages are still released
            bool active[M_BLOCKS];
#pragma unroll
            for (int h = 0; h < M_BLOCKS; h++)
                active[h] = OP == OP_DW || g.full_blocks || t.i0 + (wg * M_BLOCKS + h) * 64 < t.rows;
            float d[M_BLOCKS][BN / 2];
#pragma unroll
            for (int h = 0; h < M_BLOCKS; h++)
#pragma unroll
                for (int i = 0; i < BN / 2; i++)
                    d[h][i] = 0.0f;
            // race probe (tests only, MOE_SM90_SKIP & 32): the second warpgroup issues each tile's last MMAs
            // ~20 us late, so that the first reaches its epilogue long before they have read the stage
            const bool late_last_step = (g.sm90_skip & 32) && wg == 1;
            for (int64_t step = 0; step < steps; step++, it++) {
                const int s = (int)(it % H_STAGES);
                mbar_wait(full_bar + 8 * s, (it / H_STAGES) & 1);
                if (late_last_step && step == steps - 1)
                    for (int i = 0; i < 40; i++)
                        __nanosleep(500);
                if (OP == OP_DW && g.tma_rows && qlen - step * H_BK < H_BK)
                    h_zero_tail_rows(smem_base + s * H_STAGE_BYTES, (int)(qlen - step * H_BK), threadIdx.x - H_PRODUCERS);
                if (!(g.sm90_skip & 2)) {
                    const uint32_t a_addr = smem_base + s * H_STAGE_BYTES + wg * M_BLOCKS * 8192;
                    const uint32_t b_addr = smem_base + s * H_STAGE_BYTES + A_BYTES;
                    // one straight-line batch per pattern of active blocks (a wgmma under a per-block
                    // condition makes ptxas serialise them all)
                    if constexpr (WEIGHTED)
                        h_mma_step_weighted<TRANS_B>(d[0], a_addr, b_addr, stage_weights + s * H_BK, warp_in_wg, lane,
                                                     !g.tma_rows);
                    else if (active[M_BLOCKS - 1])
                        h_mma_step<T, M_BLOCKS, BN, TRANS_A, TRANS_B>(d, a_addr, b_addr, !g.tma_rows);
                    else if (M_BLOCKS > 1 && active[0])
                        h_mma_step<T, 1, BN, TRANS_A, TRANS_B>(d, a_addr, b_addr, !g.tma_rows);
                }
                wgmma_wait<1>(); // the previous k-step's group is done: its stage goes back to the producer
                if (step > 0)
                    release((it - 1) % H_STAGES);
                if (held >= 0 && (step == 1 || step == steps - 1))
                    release_held();
            }
            if (held >= 0)
                release_held();
            wgmma_wait<0>();
            const bool hold = HOLD_LAST_STAGE && g.tma_out && steps > 0 && !(g.sm90_skip & 1);
            if (steps > 0 && !hold)
                release((it - 1) % H_STAGES);
            // The spare boxes of the held stage overlay the operands both warpgroups' MMAs of its k-step read
            // (consumer warp c writes KiB 6c .. 6c + 5 of it: the first warpgroup's warps the second's A rows and
            // B's first 8 KiB, the second's the rest of B), so no warp writes one before both warpgroups' MMAs
            // are done (wgmma_wait<0> above waits for the warpgroup's own only).  Without this barrier a
            // warpgroup that ran ahead overwrote the other's operands: NaN in rows 64 .. 127 of a tile under
            // compute-sanitizer's racecheck, and test_gpu_gemm's race probe fails (bench/RESULTS.md,
            // "a race in the TMA-store epilogue, found and closed").  Placing the wait before a warp's first box
            // in B instead, with the boxes in the warpgroup's own A rows first, was slower on Qwen3-30B-A3B
            // (same section).
            if (hold)
                consumer_sync(); // named barrier 2: barrier 1 is the producers' (producer_sync)
            held = hold ? (int)((it - 1) % H_STAGES) : -1;
            slots.spare_addr = smem_base + (hold ? held * H_STAGE_BYTES : 0) + consumer_warp * H_SPARE_BOXES * H_TMA_BOX_BYTES;
            slots.count = hold ? H_EPI_BOXES + H_SPARE_BOXES : H_EPI_BOXES;
            // fwd, dX: the first box waits for the stores of the previous tile to have read theirs; dW: the
            // ring runs on across tiles
            if (OP != OP_DW)
                slots.used = slots.count;

            if constexpr (WIDE) {
                if (!(g.sm90_skip & 1))
                    h_store_wg_wide<T>(g, t, d[0], wg, smem_base + H_EPI_OFFSET + wg * H_WIDE_RING * H_WIDE_BOX_BYTES,
                                       wide_slot, &maps.out_wide, out_policy);
                continue;
            }
            // epilogue: each warp writes its 16 rows of each m64 block
            const bool weighted = OP != OP_DW && g.weights != nullptr;
#pragma unroll
            for (int b = 0; b < M_BLOCKS; b++) {
                const int r0 = (wg * M_BLOCKS + b) * 64 + warp_in_wg * 16 + lane / 4;
                int64_t out_row[2];
                float row_weight[2] = {1.0f, 1.0f};
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int64_t gi = t.i0 + r0 + 8 * h;
                    if (gi >= t.rows) {
                        out_row[h] = -1;
                    } else if (OP == OP_DW) {
                        out_row[h] = t.e * g.N + gi;
                    } else {
                        const int64_t r = g.ws.offsets[t.e] + gi;
                        out_row[h] = OP == OP_FWD ? y_row(g, r) : (g.permute_x || g.out_is_workspace) ? slot_of(g, r) : r;
                        if (weighted)
                            row_weight[h] = topk_weight(g, r);
                    }
                }
                if (g.sm90_skip & 1)
                    continue;
                if (g.tma_out) {
                    const int64_t row0 = t.i0 + (wg * M_BLOCKS + b) * 64 + warp_in_wg * 16;
                    const int64_t map_row0 = OP == OP_DW ? row0 : g.ws.offsets[t.e] + row0;
                    const int map_c2 = OP == OP_DW ? (int)t.e : 0;
                    if (g.out_dtype == MOE_F32)
                        h_store_warp_tma<T, OP, BN, 4>(g, t, d[b], slots, row0, map_row0, map_c2, row_weight, weighted,
                                                    &maps.out, out_policy);
                    else
                        h_store_warp_tma<T, OP, BN, 2>(g, t, d[b], slots, row0, map_row0, map_c2, row_weight, weighted,
                                                    &maps.out, out_policy);
                } else {
                    h_store_warp_slice<BN>(g, t, d[b], epi_stage, out_row, row_weight, weighted);
                }
            }
        }
        if (g.tma_out && lane == 0)
            bulk_wait_all(); // the boxes stay in use until TMA has read them
    }
    if (CLUSTER > 1)
        cluster_sync(); // no CTA leaves while its partner may still arrive on its barriers
#else
    (void)g, (void)maps; // compiled for another target: never launched (see sm90_path_available)
#endif
}

} // namespace

// Launches the sm90 kernel of op with bm-row tiles and clusters of `cluster` CTAs; pingpong (plan_gemm's
// Plan::dw_pingpong: dW with every operand and a 16-bit output by TMA) takes sm90_dw_pingpong_kernel.
template <typename T>
moe_status launch_sm90(int op, int bm, int cluster, bool pingpong, const GemmArgs &g, const Sm90Maps &maps,
                       int64_t max_tiles, cudaStream_t stream)
{
    const bool weighted_dw = op == OP_DW && g.weights != nullptr; // bf16 only (plan_gemm); never wide or ping-pong
    const bool wide = op == OP_DW && !pingpong && !weighted_dw && g.tma_rows && g.tma_out_wide && sm90_dw_wide();
    auto kernel = pingpong ? sm90_dw_pingpong_entry<T>()
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
    int64_t ctas = sm_count();
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

template moe_status launch_sm90<__nv_bfloat16>(int op, int bm, int cluster, bool pingpong, const GemmArgs &g,
                                               const Sm90Maps &maps, int64_t max_tiles, cudaStream_t stream);
template moe_status launch_sm90<__half>(int op, int bm, int cluster, bool pingpong, const GemmArgs &g,
                                        const Sm90Maps &maps, int64_t max_tiles, cudaStream_t stream);

} // namespace moe_gpu
