// Hopper (sm_90a) primitives of the sm90 kernels (names H_* / h_*: Hopper): their shared constants, mbarriers,
// TMA loads and stores, wgmma and its shared-memory descriptors, the k-step MMAs and the swizzled box stores.
// Users: the 128 x 256 GEMM kernel (gemm/sm90.cu), the dW ping-pong kernel (gemm/sm90_dw_pingpong.cu), the rows
// ping-pong kernels (gemm/rows_f32_sm90.cu, mlp/gate_sm90.cu).
//
// the pattern TMA's SWIZZLE_128B writes into a 1024-byte aligned box):
//   K-major tile  [MN][K 64]:           (mn, k) at mn * 128 + swizzle; descriptor SBO = 1024 (next 8 MN
//                                       rows); k16 step = +32 bytes.
//   MN-major tile [MN/64][K 64][MN 64]: (k, mn) at (mn / 64) * 8192 + k * 128 + swizzle; descriptor
//                                       LBO = 8192 (next 64 MN), SBO = 1024 (next 8 K rows); k16 step = +2048.
// fwd: A K-major (X rows, box {64 k, BM rows}),  B K-major (W[e] rows n, box {64 k, BN n})       trans 0, 0
// dX:  A K-major (dY rows, box {64 n, BM rows}), B MN-major (W[e][n][c], BN/64 boxes {64 c, 64 n}) trans 0, 1
// dW:  A MN-major (dY rows, 2 boxes {64 n, 64 rows}), B MN-major (X rows, 4 boxes {64 c, 64 rows}) trans 1, 1
#ifndef LIBMOE_GPU_GEMM_SM90_CUH
#define LIBMOE_GPU_GEMM_SM90_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <type_traits>

#include "gemm/mma_sm80.cuh"
#include "gemm/tma.cuh"

namespace moe_gpu {

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
// The registers a launch of H_THREADS threads (one producer and two consumer warpgroups) holds: ptxas gives each
// thread 168 under __launch_bounds__(384, 1) (65536 / 384, down to a multiple of 8).  setmaxnreg only moves them between the
// warps: a consumer's setmaxnreg.inc waits until the producers' setmaxnreg.dec has released enough, so a split whose
// total exceeds this never gets past the .inc (the kernel hangs; bench/RESULTS.md, "Wide FP8 tiles: a split of the
// registers that hangs").
constexpr int H_LAUNCH_REGS = 65536 / H_THREADS / 8 * 8 * H_THREADS;
constexpr int H_PRODUCER_REGS = 56, H_CONSUMER_REGS = 224;
static_assert(H_PRODUCER_REGS * H_PRODUCERS + H_CONSUMER_REGS * H_CONSUMERS <= H_LAUNCH_REGS, "the launch's registers");

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
// Waits until at most PENDING of the warpgroup's committed wgmma groups are still running.
template <int PENDING> __device__ __forceinline__ void wgmma_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(PENDING) : "memory");
}
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
// Waits until at most PENDING of this thread's bulk async-groups still read their shared-memory source.
template <int PENDING> __device__ __forceinline__ void bulk_wait_read()
{
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(PENDING) : "memory");
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
// d += A(desc_a) * B(desc_b) for one 64 x MMA_N x 16 step (MMA_N = 256: d[128], MMA_N = 128: d[64]).
template <typename T, int MMA_N, int TRANS_A, int TRANS_B>
__device__ __forceinline__ void wgmma_m64k16(float *d, uint64_t desc_a, uint64_t desc_b, int scale_d)
{
    if constexpr (MMA_N == 256) {
        if constexpr (std::is_same<T, __nv_bfloat16>::value)
            MOE_WGMMA_M64N256K16("bf16");
        else
            MOE_WGMMA_M64N256K16("f16");
    } else {
        static_assert(MMA_N == 128, "wgmma m64n128 or m64n256");
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
// split_weighted_pair, gemm/mma_sm80.cuh) and issues the wgmma on both.  weights: the stage's 64 row weights.
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

__device__ __forceinline__ void named_sync(int id, int threads)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads)
{
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
#endif

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

} // namespace moe_gpu

#endif
