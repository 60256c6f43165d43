// Hopper (sm_90a) tensor-core path of gpu/gemm_cuda.cu, included by gemm_cuda.cu only.
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
//     g.full_blocks: gemm_cuda.cu's sm90_full_blocks).  bf16 dW with fused topk weights (WEIGHTED) takes
//     A = w * dY from registers: ldmatrix.trans, the exact two-term split of the sm80 kernel, wgmma on both
//     terms.
// Tiles are handed out statically (tile = blockIdx.x + i * gridDim.x) or, for fwd and dX with long reductions
// (g.dynamic_tiles, h_run_scheduler), dynamically in the same order from a per-call counter; within an expert
// consecutive tiles walk down the rows first, so CTAs running together share one block of W[e] in L2.  Each
// output tile is owned by one CTA that reduces in a fixed order: results are bitwise reproducible.
//
// Paired kernel (CLUSTER = 2; fwd and dX with 128-row tiles; the heuristic takes it for fwd when
// K >= H_PAIRED_REDUCTION with long experts, sm90_cluster_size in gemm_cuda.cu; autotune may take it for dX too):
// clusters of two CTAs take units of work (pair_unit_coord in gemm_cuda.cu).  A pair unit is two row tiles of
// one expert with the same W block: each CTA's producer loads half of that block by TMA multicast into both
// CTAs (box BN/2 n rows for fwd, half the 64 x 64 boxes for dX), so W crosses L2 -> SM once per pair.  Each
// CTA's full barrier expects the whole block's bytes; its empty barrier counts the consumer warps of both
// CTAs (a stage is refilled in both CTAs by either producer), so consumers arrive on both CTAs' empty
// barriers (mapa + remote arrive).  After the pair units come the lone tiles (an expert's odd last row
// tile), two per unit, of different experts, each CTA loading its own W block without multicast; a CTA
// without a tile still arrives on the barriers so its partner's producer never waits on it.
//
// dW ping-pong kernel (sm90_dw_pingpong_kernel, at the end of this file): for dW with short experts (at most
// H_DW_PINGPONG_ROWS rows on average, gemm_cuda.cu) each consumer warpgroup owns whole 128 x 128 tiles and the
// two take turns at the tensor cores, so one's epilogue overlaps the other's MMAs.
//
// Shared-memory layouts, 128-byte swizzle (16-byte chunk c of 128-byte row r sits at chunk c ^ (r & 7),
// the pattern TMA's SWIZZLE_128B writes into a 1024-byte aligned box):
//   K-major tile  [MN][K 64]:           (mn, k) at mn * 128 + swizzle; descriptor SBO = 1024 (next 8 MN
//                                       rows); k16 step = +32 bytes.
//   MN-major tile [MN/64][K 64][MN 64]: (k, mn) at (mn / 64) * 8192 + k * 128 + swizzle; descriptor
//                                       LBO = 8192 (next 64 MN), SBO = 1024 (next 8 K rows); k16 step = +2048.
// fwd: A K-major (X rows, box {64 k, BM rows}),  B K-major (W[e] rows n, box {64 k, BN n})       trans 0, 0
// dX:  A K-major (dY rows, box {64 n, BM rows}), B MN-major (W[e][n][c], BN/64 boxes {64 c, 64 n}) trans 0, 1
// dW:  A MN-major (dY rows, 2 boxes {64 n, 64 rows}), B MN-major (X rows, 4 boxes {64 c, 64 rows}) trans 1, 1
#ifndef LIBMOE_GEMM_SM90_CUH
#define LIBMOE_GEMM_SM90_CUH

// Tile shapes, BM x BN with BM * BN = 32768 (a stage holds 48 KiB either way):
//   128 x 256: each consumer warpgroup one m64n256 block.  What the heuristic takes for every op (dW: N x K
//              tiles, reduction over the expert's rows), paired for fwd when K >= H_PAIRED_REDUCTION with long
//              experts.
//   256 x 128: each consumer warpgroup two m64n128 blocks: one tile covers an expert of up to 256 rows, so
//              its W block is read from DRAM once.  It used to be the choice for small experts; since the
//              held-stage epilogue the paired 128-row kernel, which also reads a W block once for two row
//              tiles, beats it on every shape measured, and the unpaired 128-row kernel beats it where K is
//              short and for dX (H100; bench/RESULTS.md, "Tile rows after the held-stage epilogue" and
//              "fwd pairing for every K >= 4096").  It stays for autotune (moe_gemm_autotune) and
//              MOE_SM90_TILE_ROWS=256.
// fwd pairs CTAs from this K with long experts (sm90_cluster_size, gemm_cuda.cu; dX: autotune only)
constexpr int H_PAIRED_REDUCTION = 4096;

// The kernel's TMA descriptors (one __grid_constant__ parameter; unused ones are zero): W [E][N][K] as 3-D
// (fwd: box {64 k, BN n}; dX: box {64 c, 64 n}); where rows are contiguous (g.tma_rows), the row operands
// as 2-D [M][cols]: rows_a (fwd: X, dX: dY, box {64, BM}; dW: dY, box {64, 64}), rows_b (dW: X, box
// {64, 64}); with g.tma_out the output as 3-D, box {128 bytes of columns, 8 rows, 1}: dW [E][N][K],
// fwd [1][M][N], dX [1][M][K].
struct Sm90Maps {
    CUtensorMap w, rows_a, rows_b, out;
    CUtensorMap out_wide; // dW with 16-bit output and TMA stores: dW [E][N][K], box {64 columns, 64 rows, 1}
};
__host__ __device__ constexpr int h_bn(int bm) { return 32768 / bm; }
constexpr int H_BK = 64, H_STAGES = 4;
constexpr int H_PRODUCERS = 128, H_CONSUMERS = 256, H_THREADS = H_PRODUCERS + H_CONSUMERS;
constexpr int H_STAGE_BYTES = (128 + 256) * H_BK * 2;                 // A then B, 48 KiB
// Epilogue area (1024-byte aligned), per consumer warp (at warp * H_EPI_WARP_BYTES) either the fp32
// staging buffer [16][H_EPI_LD] of h_store_warp_slice or the H_EPI_BOXES swizzled 1 KiB output boxes of
// h_store_warp_tma; one kernel launch uses one of the two.  With TMA stores, the stage of a tile's last
// k-step also lends each warp H_SPARE_BOXES more boxes (EpiSlots).
constexpr int H_EPI_OFFSET = H_STAGES * H_STAGE_BYTES;
constexpr int H_EPI_LD = 40; // 32 columns + 8: the float2 writes of a half-warp hit 32 distinct banks
constexpr int H_TMA_BOX_BYTES = 1024; // one output box: 8 rows of 128 bytes
constexpr int H_EPI_BOXES = 2, H_SPARE_BOXES = H_STAGE_BYTES / H_TMA_BOX_BYTES / (H_CONSUMERS / 32);
constexpr int H_EPI_WARP_BYTES = (16 * H_EPI_LD * 4 + H_TMA_BOX_BYTES - 1) / H_TMA_BOX_BYTES * H_TMA_BOX_BYTES;
constexpr int H_BARRIER_OFFSET = H_EPI_OFFSET + (H_CONSUMERS / 32) * H_EPI_WARP_BYTES; // full[S], empty[S]
constexpr int H_ROWS_OFFSET = H_BARRIER_OFFSET + 2 * H_STAGES * 8; // producer row table, int64 [512]
constexpr int H_WEIGHTS_OFFSET = H_ROWS_OFFSET + 512 * 8; // weighted dW: each stage's 64 topk weights, float [S][64]
// The dynamic tiles' shared memory (g.dynamic_tiles; after the weights or, WIDE, after the ring's barriers):
// the consumers' queue, H_TILE_QUEUE tile numbers (int64) then their full and empty mbarriers, then the
// scheduler's claimed tile (int64) and its request and done mbarriers.
constexpr int H_TILE_QUEUE = 4, H_TILE_QUEUE_BYTES = 3 * H_TILE_QUEUE * 8 + 3 * 8;
constexpr int H_QUEUE_OFFSET = H_WEIGHTS_OFFSET + H_STAGES * H_BK * 4;
constexpr size_t H_SMEM_BYTES = 1024 /* alignment */ + H_QUEUE_OFFSET + H_TILE_QUEUE_BYTES;
static_assert(H_EPI_OFFSET % 1024 == 0 && H_EPI_BOXES * H_TMA_BOX_BYTES <= H_EPI_WARP_BYTES, "epilogue area");
static_assert(H_SMEM_BYTES <= 232448, "shared memory of one CTA");
// The wide dW epilogue (sm90_gemm_kernel's WIDE: dW with every operand and the 16-bit output by TMA): the
// epilogue area is a ring of H_WIDE_RING boxes of 64 rows x 64 16-bit columns (8 KiB, maps.out_wide) per
// consumer warpgroup, and there is no producer row table (rows come by TMA).
constexpr int H_WIDE_BOX_BYTES = 64 * 128, H_WIDE_RING = 2;
constexpr int H_WIDE_BARRIER_OFFSET = H_EPI_OFFSET + (H_CONSUMERS / 128) * H_WIDE_RING * H_WIDE_BOX_BYTES;
constexpr int H_WIDE_QUEUE_OFFSET = H_WIDE_BARRIER_OFFSET + 2 * H_STAGES * 8;
constexpr size_t H_WIDE_SMEM_BYTES = 1024 /* alignment */ + H_WIDE_QUEUE_OFFSET + H_TILE_QUEUE_BYTES;
static_assert(H_WIDE_SMEM_BYTES <= 232448, "shared memory of one CTA (wide dW epilogue)");
constexpr int H_PRODUCER_REGS = 56, H_CONSUMER_REGS = 224;
static_assert(H_PRODUCER_REGS * H_PRODUCERS + H_CONSUMER_REGS * H_CONSUMERS <= 65536, "register file");

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MOE_SM90A_DEVICE 1
#endif

// Offset of (mn, 16-byte k chunk) in a K-major tile.
__device__ __forceinline__ uint32_t kmajor_offset(int mn, int kchunk)
{
    return (uint32_t)(mn * 128 + ((kchunk ^ (mn & 7)) * 16));
}

// Offset of (k, 16-byte mn chunk) in an MN-major tile.
__device__ __forceinline__ uint32_t mnmajor_offset(int k, int mnchunk)
{
    return (uint32_t)((mnchunk >> 3) * 8192 + k * 128 + (((mnchunk & 7) ^ (k & 7)) * 16));
}

__device__ __forceinline__ uint64_t smem_descriptor(uint32_t smem_addr, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)((smem_addr & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32) |
           (1ull << 62); // 128-byte swizzle
}

#ifdef MOE_SM90A_DEVICE
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Shared-memory stores at 32-bit shared addresses (STS).  Through a generic pointer the compiler emits 64-bit
// generic stores (ST.E) with 64-bit address arithmetic (seen in the SASS); the MEMBAR.ALL.CTA before each proxy
// fence stays either way, it is how fence.proxy.async compiles (bench/RESULTS.md, "Epilogue stores through
// 32-bit shared addresses").
__device__ __forceinline__ void sts_b32(uint32_t addr, uint32_t v)
{
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void sts_f32x2(uint32_t addr, float a, float b)
{
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(a), "f"(b) : "memory");
}
__device__ __forceinline__ void sts_zero16(uint32_t addr)
{
    asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0) : "memory");
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Blocks until the barrier's phase of the given parity has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity)
{
    asm volatile("{\n.reg .pred done;\nMOE_WAIT_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra MOE_WAIT_%=;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Arrives on the barrier at the same shared-memory offset in cluster CTA `cta` (the paired kernel's consumers
// free a stage in both CTAs, since both CTAs' producers multicast into it).  Default semantics (release, CTA
// scope) as CUTLASS's ClusterBarrier::arrive: the stage was only read, by wgmmas already waited for, so the
// producer's wait needs no cluster-scope acquire; the .release.cluster/.acquire.cluster forms measured about
// twice as slow (bench/RESULTS.md, "paired sm90 kernel").
__device__ __forceinline__ void mbar_arrive_in_cta(uint32_t bar, uint32_t cta)
{
    asm volatile("{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
                 "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(bar), "r"(cta)
                 : "memory");
}
// Every thread of the cluster's CTAs: the cluster's barrier (release / acquire).
__device__ __forceinline__ void cluster_sync()
{
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ uint32_t cluster_register(int which)
{
    uint32_t v;
    if (which == 0)
        asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(v));
    else if (which == 1)
        asm volatile("mov.u32 %0, %%clusterid.x;\n" : "=r"(v));
    else
        asm volatile("mov.u32 %0, %%nclusterid.x;\n" : "=r"(v));
    return v;
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Arrives on the barrier once every cp.async this thread issued so far has landed (counted in the init).
__device__ __forceinline__ void cp_async_arrive_noinc(uint32_t bar)
{
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// TMA: the box at coordinates (c0 innermost, c1, c2) of a 3-D tensor map into shared memory at dst, with
// an L2 cache policy (createpolicy).
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap *map, uint32_t bar, int c0, int c1, int c2,
                                            uint64_t policy)
{
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
                 " [%0], [%1, {%3, %4, %5}], [%2], %6;\n"
                 ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "l"(policy)
                 : "memory");
}
// L2 policies for the W tiles: evict_last keeps a W block for the other row tiles of its expert, which
// read it a little later; evict_normal for the experiments that switch the hint off.
__device__ __forceinline__ uint64_t l2_policy(bool keep)
{
    uint64_t policy;
    if (keep)
        asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
    else
        asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;\n" : "=l"(policy));
    return policy;
}
// The same into the same shared-memory offset of every CTA of the cluster in cta_mask, completing bytes on
// each one's barrier at the offset bar.
__device__ __forceinline__ void tma_load_3d_multicast(uint32_t dst, const CUtensorMap *map, uint32_t bar, int c0,
                                                      int c1, int c2, uint16_t cta_mask, uint64_t policy)
{
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
                 ".L2::cache_hint [%0], [%1, {%3, %4, %5}], [%2], %6, %7;\n"
                 ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "h"(cta_mask),
                   "l"(policy)
                 : "memory");
}
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap *map, uint32_t bar, int c0, int c1)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n"
                 ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1)
                 : "memory");
}
// TMA store of the box at coordinates (c0, c1, c2) of a 3-D tensor map from shared memory at src, as one
// bulk async-group of this thread (bulk_wait_read / bulk_wait_all).
__device__ __forceinline__ void tma_store_3d(const CUtensorMap *map, uint32_t src, int c0, int c1, int c2,
                                             uint64_t policy)
{
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group.L2::cache_hint [%0, {%2, %3, %4}], [%1], %5;\n"
                 "cp.async.bulk.commit_group;\n"
                 ::"l"(reinterpret_cast<uint64_t>(map)), "r"(src), "r"(c0), "r"(c1), "r"(c2), "l"(policy)
                 : "memory");
}
// Waits until at most N of this thread's bulk async-groups still read their shared-memory source.
template <int N> __device__ __forceinline__ void bulk_wait_read()
{
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// Waits until all of this thread's bulk async-groups are complete (their writes done).
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
__device__ __forceinline__ uint64_t l2_evict_first_policy()
{
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
    return policy;
}
// Named barrier 1: the producer warpgroup alone; 2: the two consumer warpgroups.
__device__ __forceinline__ void producer_sync() { asm volatile("bar.sync 1, %0;\n" ::"n"(H_PRODUCERS) : "memory"); }
__device__ __forceinline__ void consumer_sync() { asm volatile("bar.sync 2, %0;\n" ::"n"(H_CONSUMERS) : "memory"); }

// The kernel's dynamic shared memory from its first 1024-byte boundary (the 128-byte swizzle's alignment; the
// launches ask for 1024 bytes more).
__device__ __forceinline__ unsigned char *dynamic_smem_1k()
{
    extern __shared__ unsigned char smem_raw[];
    return reinterpret_cast<unsigned char *>(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
}

// One dW k-step by TMA: A_BOXES boxes {64 n, 64 rows} of dY at sa and B_BOXES boxes {64 c, 64 rows} of X at
// sb (MN-major), rows row .. row + 63, completing their bytes on the stage's full barrier bar.
template <int A_BOXES, int B_BOXES>
__device__ __forceinline__ void h_load_dw_stage(const Sm90Maps &maps, uint32_t bar, uint32_t sa, uint32_t sb, int64_t i0,
                                                int64_t j0, int64_t row)
{
    mbar_arrive_expect_tx(bar, (A_BOXES + B_BOXES) * 8192);
#pragma unroll
    for (int a = 0; a < A_BOXES; a++)
        tma_load_2d(sa + a * 8192, &maps.rows_a, bar, (int)(i0 + 64 * a), (int)row);
#pragma unroll
    for (int a = 0; a < B_BOXES; a++)
        tma_load_2d(sb + a * 8192, &maps.rows_b, bar, (int)(j0 + 64 * a), (int)row);
}

// Two floats rounded to T (bf16 or f16) and packed in one 32-bit word, the first in the low half.
template <typename T> __device__ __forceinline__ uint32_t pack2_rn(float v0, float v1)
{
    if constexpr (std::is_same<T, __nv_bfloat16>::value) {
        const __nv_bfloat162 b2 = __floats2bfloat162_rn(v0, v1);
        return *reinterpret_cast<const uint32_t *>(&b2);
    } else {
        const __half2 h2 = __floats2half2_rn(v0, v1);
        return *reinterpret_cast<const uint32_t *>(&h2);
    }
}

// A warp's 16 rows (row0 .. row0 + 15, row0 a multiple of 8) of a 64-row output box of 64 16-bit columns
// (128-byte rows, 128-byte swizzle: the 16-byte chunk jj of row r sits at chunk jj ^ (r & 7)), from its m64
// accumulators d (wgmma layout: group j of 8 columns, lane's row lane / 4 + 8 h, columns 2 (lane % 4) + {0, 1}
// at d[4 j + 2 h + {0, 1}]) of column groups group0 .. group0 + 7, rounded to T.  By stmatrix, whose 8 x 8
// fragments are that layout: 4 instructions where 32-bit st.shared took 16 (faster on Mixtral gate_up dW, the
// other shapes the same; bench/RESULTS.md, "stmatrix for the 8 KiB boxes, and the ping-pong rule re-measured").
template <typename T>
__device__ __forceinline__ void h_store_box_rows(uint32_t box_addr, int row0, const float *d, int group0)
{
    const int lane = threadIdx.x % 32;
    // stmatrix .x4: four 8 x 8 matrices per instruction, matrix m = (h = m & 1, jj = 2 p + m / 2); lane l gives
    // the address of row l % 8 of matrix l / 8, and its register m holds its own two values of matrix m
    const int m = lane / 8, rr = lane % 8;
    const uint32_t lane_addr = box_addr + (row0 + rr + 8 * (m & 1)) * 128;
#pragma unroll
    for (int p = 0; p < 4; p++) {
        const int jj_lane = 2 * p + m / 2;
        const float *v = d + 4 * (group0 + 2 * p);
        asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                         lane_addr + ((jj_lane ^ rr) * 16)),
                     "r"(pack2_rn<T>(v[0], v[1])), "r"(pack2_rn<T>(v[2], v[3])), "r"(pack2_rn<T>(v[4], v[5])),
                     "r"(pack2_rn<T>(v[6], v[7]))
                     : "memory");
    }
}

// STAGE_BYTES / 8192 blocks, zeroed by THREADS threads (c in [0, THREADS)); the caller then synchronises them.
template <int STAGE_BYTES, int THREADS>
__device__ __forceinline__ void h_zero_tail_rows_of(uint32_t stage_addr, int rows_left, int c)
{
    constexpr int BLOCKS = STAGE_BYTES / 8192, CHUNKS = BLOCKS * 8; // 16-byte chunks per k row, all blocks
    for (int idx = c; idx < (H_BK - rows_left) * CHUNKS; idx += THREADS) {
        const int row = rows_left + idx / CHUNKS, block = (idx % CHUNKS) / 8, chunk = idx % 8;
        sts_zero16(stage_addr + block * 8192 + row * 128 + chunk * 16);
    }
    fence_proxy_async();
}

// dW's last, partial k-step (rows_left < 64 rows of the expert): the stage's 64-row TMA boxes hold, at rows
// rows_left .. 63 of each of its six 64 x 128-byte MN-major blocks (two of dY, four of X), the next expert's
// rows (zeros past M).  Every consumer thread (c in [0, 256)) zeroes its share of those rows in both operands
// (zeroing one would not do: Inf * 0 is NaN), fences them for the async proxy, and the two warpgroups meet
// before either's MMAs read the stage.  Called after the stage's full barrier (the TMA writes are done) and
// while the previous k-step's MMAs still run.
__device__ __forceinline__ void h_zero_tail_rows(uint32_t stage_addr, int rows_left, int c)
{
    h_zero_tail_rows_of<H_STAGE_BYTES, H_CONSUMERS>(stage_addr, rows_left, c);
    consumer_sync();
}

// d += A(desc_a) * B(desc_b) for one 64 x 256 x 16 step (scale_d = 0 would start from zero).
#define MOE_WGMMA_M64N256K16(TY) \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n" \
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY " " \
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, %131, %132;\n}\n" \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
                   "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
                   "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
                   "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
                   "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127]) \
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_A), "n"(TRANS_B))
// d += A(a, registers: the m16n8k16 A fragment of each warp's 16 rows) * B(desc_b) for one 64 x 256 x 16 step.
#define MOE_WGMMA_M64N256K16_RS(TY) \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n" \
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY " " \
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, %133;\n}\n" \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127]) \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(TRANS_B))
#define MOE_WGMMA_M64N128K16(TY) \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " \
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, %67, %68;\n}\n" \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_A), "n"(TRANS_B))
// d += A(desc_a) * B(desc_b) for one 64 x N x 16 step (N = 256: d[128], N = 128: d[64]).
template <typename T, int N, int TRANS_A, int TRANS_B>
__device__ __forceinline__ void wgmma_m64k16(float *d, uint64_t desc_a, uint64_t desc_b, int scale_d)
{
    if constexpr (N == 256) {
        if constexpr (std::is_same<T, __nv_bfloat16>::value)
            MOE_WGMMA_M64N256K16("bf16");
        else
            MOE_WGMMA_M64N256K16("f16");
    } else {
        static_assert(N == 128, "wgmma m64n128 or m64n256");
        if constexpr (std::is_same<T, __nv_bfloat16>::value)
            MOE_WGMMA_M64N128K16("bf16");
        else
            MOE_WGMMA_M64N128K16("f16");
    }
}
// d += A(a in registers) * B(desc_b), 64 x 256 x 16, bf16 (weighted dW only).
template <int TRANS_B>
__device__ __forceinline__ void wgmma_m64n256k16_rs_bf16(float *d, const uint32_t a[4], uint64_t desc_b)
{
    MOE_WGMMA_M64N256K16_RS("bf16");
}
#undef MOE_WGMMA_M64N256K16
#undef MOE_WGMMA_M64N256K16_RS
#undef MOE_WGMMA_M64N128K16

// One k-step (H_BK) of MMAs for the first NB m64 blocks of a consumer warpgroup: A blocks of 64 rows
// (K-major) or 64 n (MN-major) at a_addr + 8192 b, B at b_addr.
template <typename T, int NB, int BN, int TRANS_A, int TRANS_B, int MB>
__device__ __forceinline__ void h_mma_step(float (&d)[MB][BN / 2], uint32_t a_addr, uint32_t b_addr, bool by_cp_async)
{
    if (by_cp_async)
        fence_proxy_async(); // the stage came through cp.async (generic proxy); wgmma reads via the async proxy
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < H_BK / 16; kk++) {
        const uint64_t db = TRANS_B == 0 ? smem_descriptor(b_addr + kk * 32, 16, 1024)
                                         : smem_descriptor(b_addr + kk * 2048, 8192, 1024);
#pragma unroll
        for (int h = 0; h < NB; h++) {
            const uint32_t block = a_addr + h * 8192;
            const uint64_t da = TRANS_A == 0 ? smem_descriptor(block + kk * 32, 16, 1024)
                                             : smem_descriptor(block + kk * 2048, 8192, 1024);
            wgmma_m64k16<T, BN, TRANS_A, TRANS_B>(d[h], da, db, 1);
        }
    }
    wgmma_commit();
}

// Weighted bf16 dW: one k-step (H_BK rows) of the warpgroup's m64 block with A = w * dY from registers.  The
// A block is MN-major ([64 rows q][64 n], 128-byte rows, 16-byte chunk c of row q at c ^ (q & 7)); each warp
// reads its 16 n of each k16 by ldmatrix.x4.trans into the m16n8k16 A fragment (the wgmma register layout:
// warp w holds rows 16w .. 16w + 15 of the m64 block), scales and splits it exactly into hi + lo (sm80's
// split_weighted_pair, gemm_cuda.cu) and issues the wgmma on both.  weights: the stage's 64 row weights.
// Waits for its own MMAs before it returns (the A registers are read asynchronously).
template <int TRANS_B>
__device__ __forceinline__ void h_mma_step_weighted(float *d, uint32_t a_addr, uint32_t b_addr, const float *weights,
                                                    int warp_in_wg, int lane, bool by_cp_async)
{
    uint32_t hi[H_BK / 16][4], lo[H_BK / 16][4];
    const int mi = lane >> 3; // the 8 x 8 matrix this lane addresses: (n + 8 (mi & 1), q + 8 (mi >> 1))
#pragma unroll
    for (int kk = 0; kk < H_BK / 16; kk++) {
        const int q = kk * 16 + 8 * (mi >> 1) + (lane & 7), chunk = 2 * warp_in_wg + (mi & 1);
        uint32_t a[4];
        ldmatrix_x4<true>(a, a_addr + q * 128 + ((chunk ^ (q & 7)) << 4));
        // a0, a1: rows q = kk * 16 + 2 (lane % 4) + {0, 1}; a2, a3: the same + 8
        const float2 w01 = *reinterpret_cast<const float2 *>(weights + kk * 16 + 2 * (lane % 4));
        const float2 w89 = *reinterpret_cast<const float2 *>(weights + kk * 16 + 8 + 2 * (lane % 4));
        split_weighted_pair(a[0], w01.x, w01.y, hi[kk][0], lo[kk][0]);
        split_weighted_pair(a[1], w01.x, w01.y, hi[kk][1], lo[kk][1]);
        split_weighted_pair(a[2], w89.x, w89.y, hi[kk][2], lo[kk][2]);
        split_weighted_pair(a[3], w89.x, w89.y, hi[kk][3], lo[kk][3]);
    }
    if (by_cp_async)
        fence_proxy_async(); // B came through cp.async (generic proxy); wgmma reads it via the async proxy
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < H_BK / 16; kk++) {
        const uint64_t db = smem_descriptor(b_addr + kk * 2048, 8192, 1024);
        wgmma_m64n256k16_rs_bf16<TRANS_B>(d, hi[kk], db);
        wgmma_m64n256k16_rs_bf16<TRANS_B>(d, lo[kk], db);
    }
    wgmma_commit();
    wgmma_wait<0>();
}

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

// The shared-memory boxes a consumer warp writes its TMA-stored output through: its own H_EPI_BOXES boxes of
// the epilogue area, and while the warp holds the stage of its tile's last k-step (the consumer loop below),
// H_SPARE_BOXES more in that stage.  With a held stage the warp writes the boxes in turn and, when every box
// is used, lane 0 waits (bulk_wait_read<0>) until all are free again.  For dW (no held stage) its two own boxes
// are a ring: before reusing a box lane 0 waits only until the older of its two stores has read its box
// (bulk_wait_read<1>), so one store is always in flight (a small gain on dW; bench/RESULTS.md,
// "dW: the two epilogue boxes as a ring").
struct EpiSlots {
    uint32_t own_addr, spare_addr; // shared addresses; spare_addr is used only when count > H_EPI_BOXES
    int count, used; // used: boxes written since the last wait (dW's ring: stores that may still read theirs)
    int next;        // dW's ring: the own box to write next
};

// The same slice when the output is written by TMA stores (g.tma_out: no accumulate, output rows in
// tile order): per 128 bytes of columns and 8 rows, the warp rounds its values (times the row's topk
// weight when weighted) into a swizzled 1 KiB box of shared memory (the next free one of `slots`) and
// lane 0 issues a TMA store of it, which runs on while the warp goes on; the map clips columns past
// cols_j (and dW's rows past N).  row0: the slice's first row in the tile space (dW: n; fwd, dX: the
// expert's row gi); map_row0, map_c2: its coordinates in the output map (dW: n, e; fwd, dX: offsets[e] +
// gi, 0).  For fwd and dX an 8-row group that reaches past the expert's last row (its rows past it
// belong to the next expert) is stored element by element instead.  ESIZE: bytes of an output element
// (4: f32; 2: T, the input type, bf16 or f16).
template <typename T, int OP, int BN, int ESIZE>
__device__ __forceinline__ void h_store_warp_tma(const GemmArgs &g, const TileCoord &t, const float *d, EpiSlots &slots,
                                                 int64_t row0, int64_t map_row0, int map_c2, const float *row_weight,
                                                 bool weighted, const CUtensorMap *map, uint64_t policy)
{
    constexpr int BOX_COLS = 128 / ESIZE, GROUPS = BOX_COLS / 8; // columns, 8-column groups j of d per box
    const int lane = threadIdx.x % 32, r = lane / 4, q = lane % 4;
#pragma unroll
    for (int c = 0; c < BN / BOX_COLS; c++) {
        const int64_t col0 = t.j0 + c * BOX_COLS;
        if (col0 >= g.cols_j)
            break;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int64_t first = row0 + 8 * h;
            if (first >= t.rows)
                continue;
            const float w = weighted ? row_weight[h] : 1.0f;
            if (OP != OP_DW && first + 8 > t.rows) { // the expert's last rows: element stores, no TMA
                if (first + r < t.rows) {
                    const int64_t out_row = map_row0 + 8 * h + r;
#pragma unroll
                    for (int jj = 0; jj < GROUPS; jj++) {
                        const int64_t col = col0 + 8 * jj + 2 * q;
                        if (col >= g.cols_j)
                            break;
                        const float *v = d + 4 * (c * GROUPS + jj) + 2 * h;
                        store_from_float(g.out_dtype, g.out, out_row * g.cols_j + col, weighted ? w * v[0] : v[0]);
                        store_from_float(g.out_dtype, g.out, out_row * g.cols_j + col + 1, weighted ? w * v[1] : v[1]);
                    }
                }
                continue;
            }
            int k;
            if (OP == OP_DW) { // a ring of the own boxes: wait only for the oldest store
                if (slots.used == slots.count) {
                    if (lane == 0)
                        bulk_wait_read<H_EPI_BOXES - 1>();
                    __syncwarp();
                    slots.used = slots.count - 1;
                }
                slots.used++;
                k = slots.next;
                slots.next = slots.next + 1 == H_EPI_BOXES ? 0 : slots.next + 1;
            } else { // own and spare boxes: used in turn, then all waited for at once
                if (slots.used == slots.count) {
                    if (lane == 0)
                        bulk_wait_read<0>();
                    __syncwarp();
                    slots.used = 0;
                }
                k = slots.used++;
            }
            const uint32_t box_addr = k < H_EPI_BOXES ? slots.own_addr + k * H_TMA_BOX_BYTES
                                                      : slots.spare_addr + (k - H_EPI_BOXES) * H_TMA_BOX_BYTES;
#pragma unroll
            for (int jj = 0; jj < GROUPS; jj++) {
                float v0 = d[4 * (c * GROUPS + jj) + 2 * h], v1 = d[4 * (c * GROUPS + jj) + 2 * h + 1];
                if (weighted)
                    v0 = w * v0, v1 = w * v1;
                if constexpr (ESIZE == 4) { // 16-byte chunk (2 jj + q / 2) of row r, swizzled
                    sts_f32x2(box_addr + r * 128 + (((2 * jj + q / 2) ^ r) * 16) + 8 * (q & 1), v0, v1);
                } else {
                    sts_b32(box_addr + r * 128 + ((jj ^ r) * 16) + 4 * q, pack2_rn<T>(v0, v1));
                }
            }
            fence_proxy_async(); // the box's generic-proxy writes before the TMA (async proxy) reads it
            __syncwarp();
            if (lane == 0)
                tma_store_3d(map, box_addr, (int)col0, (int)(map_row0 + 8 * h), map_c2, policy);
        }
    }
}

__device__ __forceinline__ void named_sync(int id, int threads)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads)
{
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
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
// slower than the static order while reading fewer bytes, which is why gemm_cuda.cu's sm90_dynamic_tiles takes
// them only for long reductions; bench/RESULTS.md, the section ending "device tool): dynamic tiles".  The
// cause, found later: a claimed tile runs where and when a CTA asks, not beside the tiles it shares data with;
// gemm_cuda.cu's sm90_dynamic_tiles.)  Thread 0 then hands the tile number to the consumers: number tile_count
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

// ------------------------------------------------------------------------------------------------------------
// dW ping-pong kernel (the dW launches whose operands and output all go by TMA: no permute, no accumulate;
// MOE_SM90_DW_PINGPONG=0 falls back to sm90_gemm_kernel).  dW's reduction is one expert's rows, so a tile has
// only a few k-steps (4 at Qwen3-30B-A3B, T = 4096) and a large output: in sm90_gemm_kernel both consumer
// warpgroups share one 128 x 256 tile, so the tensor cores idle while they write it.  Here each consumer
// warpgroup owns whole 128 x 128 tiles (two m64n128 blocks, the same 128 fp32 accumulators per thread): the
// CTA's tiles alternate between the warpgroups (local tile i to warpgroup i % 2), and an ordering barrier
// lets a warpgroup start its MMAs only when the other has issued the MMAs of the previous tile, so one
// warpgroup's MMAs run while the other writes its tile.
//   Ring: P_STAGES stages of 32 KiB (dY 2 boxes {64 n, 64 rows}, X 2 boxes {64 c, 64 rows}, MN-major as in
//   sm90_gemm_kernel), filled in tile order by producer thread 0; a warpgroup steps its ring position over the
//   other's tiles (it knows their k-step counts), so the ring is consumed in the order it is filled.  Each
//   stage's empty barrier counts the 4 warps of the warpgroup that owns it.
//   Named barriers: 1 + w, warpgroup w's turn for MMAs (the other warpgroup's 128 threads arrive, w's 128
//   wait); 3 + w, warpgroup w alone (the tail rows of a partial last k-step, as h_zero_tail_rows).
//   Epilogue: the warpgroup rounds its tile into four 8 KiB boxes of its own epilogue area (64 rows x 64
//   16-bit columns each, the 64-row map maps.out_wide) and its thread 0 stores them by TMA; the 1 KiB boxes of
//   h_store_warp_tma gained nothing here (bench/RESULTS.md, "dW ping-pong kernel for short experts").  Each output
//   tile is owned by one warpgroup, which reduces in a fixed order: bitwise reproducible, as sm90_gemm_kernel.
constexpr int P_BM = 128, P_BN = 128, P_STAGES = 5;
constexpr int P_A_BYTES = P_BM * H_BK * 2, P_STAGE_BYTES = P_A_BYTES + P_BN * H_BK * 2; // 32 KiB
constexpr int P_EPI_OFFSET = P_STAGES * P_STAGE_BYTES;
constexpr int P_BOX_BYTES = H_WIDE_BOX_BYTES;                // 64 rows of 64 16-bit columns
constexpr int P_EPI_WG_BYTES = (P_BM / 64) * (P_BN / 64) * P_BOX_BYTES; // a warpgroup's whole tile, 32 KiB
constexpr int P_BARRIER_OFFSET = P_EPI_OFFSET + 2 * P_EPI_WG_BYTES; // full[S], empty[S]
constexpr size_t P_SMEM_BYTES = 1024 /* alignment */ + P_BARRIER_OFFSET + 2 * P_STAGES * 8;
static_assert(P_EPI_OFFSET % 1024 == 0 && P_SMEM_BYTES <= 232448, "shared memory of the ping-pong kernel");

#ifdef MOE_SM90A_DEVICE
// The stage barriers of a kernel whose producer is thread 0 alone (TMA) and whose consumer warpgroups take
// whole tiles in turn (the ping-pong schedule): full[s] waits for thread 0's arrival with the byte count,
// empty[s] for the owning warpgroup's four warps.  Thread 0 initialises them; then the CTA synchronises.
template <int STAGES>
__device__ __forceinline__ void h_init_pingpong_barriers(uint32_t full_bar, uint32_t empty_bar)
{
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(full_bar + 8 * s, 1);
            mbar_init(empty_bar + 8 * s, H_CONSUMERS / 32 / 2);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        fence_proxy_async();
    }
    __syncthreads();
}
#endif

template <typename T>
__global__ void __launch_bounds__(H_THREADS, 1)
    sm90_dw_pingpong_kernel(const GemmArgs g, const __grid_constant__ Sm90Maps maps)
{
#ifdef MOE_SM90A_DEVICE
    unsigned char *smem = dynamic_smem_1k();
    const uint32_t smem_base = (uint32_t)__cvta_generic_to_shared(smem);
    const uint32_t full_bar = smem_base + P_BARRIER_OFFSET, empty_bar = full_bar + P_STAGES * 8;
    if (*g.ws.status != 0)
        return;
    h_init_pingpong_barriers<P_STAGES>(full_bar, empty_bar);
    const int64_t tiles = total_tiles(g, P_BM, P_BN);
    if (threadIdx.x < H_PRODUCERS) {
        // ------------------------------------------------------------------ producer: thread 0 alone
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(H_PRODUCER_REGS));
        if (threadIdx.x != 0)
            return;
        uint32_t it = 0;
        for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
            const TileCoord t = tile_coord(g, tile, P_BM, P_BN);
            const int64_t qlen = reduction_length(g, t.e), base = g.ws.offsets[t.e];
            for (int64_t q0 = 0; q0 < qlen; q0 += H_BK, it++) {
                const int s = (int)(it % P_STAGES);
                const uint32_t bar = full_bar + 8 * s, sa = smem_base + s * P_STAGE_BYTES, sb = sa + P_A_BYTES;
                mbar_wait(empty_bar + 8 * s, ((it / P_STAGES) & 1) ^ 1);
                if (g.sm90_skip & 4) {
                    mbar_arrive(bar);
                    continue;
                }
                h_load_dw_stage<P_BM / 64, P_BN / 64>(maps, bar, sa, sb, t.i0, t.j0, base + q0);
            }
        }
    } else {
        // ------------------------------------------------------------------ consumer warpgroups
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(H_CONSUMER_REGS));
        const int wg = threadIdx.x / 128 - 1, lane_in_wg = threadIdx.x % 128;
        const int warp_in_wg = lane_in_wg / 32, lane = lane_in_wg % 32;
        const uint32_t epi_base = smem_base + P_EPI_OFFSET + wg * P_EPI_WG_BYTES;
        const uint64_t out_policy = l2_evict_first_policy();
        const int64_t my_tiles = tiles > blockIdx.x ? (tiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
        uint32_t it = 0;
        int64_t local = 0;
        for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x, local++) {
            const TileCoord t = tile_coord(g, tile, P_BM, P_BN);
            const int64_t qlen = reduction_length(g, t.e);
            const int64_t steps = (qlen + H_BK - 1) / H_BK;
            if ((local & 1) != wg) { // the other warpgroup's tile: its stages are not ours
                it += (uint32_t)steps;
                continue;
            }
            if (local > 0)
                named_sync(1 + wg, 256); // the other warpgroup has issued the previous tile's MMAs
            float d[2][P_BN / 2];
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int i = 0; i < P_BN / 2; i++)
                    d[h][i] = 0.0f;
            for (int64_t step = 0; step < steps; step++, it++) {
                const int s = (int)(it % P_STAGES);
                const uint32_t stage = smem_base + s * P_STAGE_BYTES;
                mbar_wait(full_bar + 8 * s, (it / P_STAGES) & 1);
                if (qlen - step * H_BK < H_BK) { // the expert's last rows: zero the next expert's rows
                    h_zero_tail_rows_of<P_STAGE_BYTES, 128>(stage, (int)(qlen - step * H_BK), lane_in_wg);
                    named_sync(3 + wg, 128);
                }
                if (!(g.sm90_skip & 2))
                    h_mma_step<T, 2, P_BN, 1, 1>(d, stage, stage + P_A_BYTES, false);
                wgmma_wait<1>();
                if (step > 0 && lane == 0)
                    mbar_arrive(empty_bar + 8 * ((it - 1) % P_STAGES));
            }
            // the other warpgroup's turn: its MMAs queue behind this tile's last ones (no drain in between)
            if (local + 1 < my_tiles)
                named_arrive(1 + (1 - wg), 256);
            wgmma_wait<0>();
            if (steps > 0 && lane == 0)
                mbar_arrive(empty_bar + 8 * ((it - 1) % P_STAGES));
            if (g.sm90_skip & 1)
                continue;
            // epilogue: the tile rounded into its four 8 KiB boxes (m64 block b, 64 columns c; 128-byte swizzle,
            // as h_store_warp_tma's 1 KiB boxes), then thread 0 of the warpgroup stores them by TMA (the map
            // clips rows past N and columns past K).  The boxes are reused one tile later: thread 0 first
            // waits until the previous tile's stores have read them.
            if (lane_in_wg == 0)
                bulk_wait_read<0>();
            named_sync(3 + wg, 128);
#pragma unroll
            for (int b = 0; b < 2; b++)
#pragma unroll
                for (int c = 0; c < P_BN / 64; c++)
                    h_store_box_rows<T>(epi_base + (b * (P_BN / 64) + c) * P_BOX_BYTES, warp_in_wg * 16, d[b], 8 * c);
            fence_proxy_async(); // the boxes' generic-proxy writes before the TMA (async proxy) reads them
            named_sync(3 + wg, 128);
            if (lane_in_wg == 0) {
#pragma unroll
                for (int b = 0; b < 2; b++)
#pragma unroll
                    for (int c = 0; c < P_BN / 64; c++)
                        if (t.j0 + 64 * c < g.cols_j && t.i0 + 64 * b < g.N)
                            tma_store_3d(&maps.out_wide, epi_base + (b * (P_BN / 64) + c) * P_BOX_BYTES,
                                         (int)(t.j0 + 64 * c), (int)(t.i0 + 64 * b), (int)t.e, out_policy);
            }
        }
        if (lane_in_wg == 0)
            bulk_wait_all(); // the boxes stay in use until TMA has read them
    }
#else
    (void)g, (void)maps; // compiled for another target: never launched (see sm90_path_available)
#endif
}

#endif
