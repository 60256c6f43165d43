// FP8 dW's Hopper kernel (sm_90a): moe_gemm_fp8_dw with options.codes_transposed, on FP8 tensor cores (wgmma
// m64n128k32 on the codes as they are), the contract of gemm/fp8_dw.cu's portable kernel and of the reference
// (specs/FP8.md, "dW"):
//
//   dw[e][n][c] = the promoted sum over expert e's 128-row tiles t, in ascending order, of
//                 part_t(n, c) * (sdy[s_t][n] * sx[s_t][c]),   s_t = offsets[e] / 128 + e + t,
//   dY^T codes [N][M] (a: rows n), X^T codes [K][M] (b: rows c), scales [scale rows][N] and [scale rows][K]
//
// FP8 wgmma reads only K-major operands, and dW reduces over the expert's rows, so it takes the transposed codes
// (moe_quantize_fp8_columns_transposed), whose rows are the reduction.  A k-step is one 128-row tile of the
// expert: a TMA box of 128 codes (128 bytes: the 128-byte swizzle's row) of each of the tile's 128 rows n and 128
// rows c, at the tile's first expert row (anywhere: the boxes need no alignment).  Its four wgmma k32 give the
// tile's partial sums in fresh registers, promoted as the reference promotes them: acc = acc + part * (s_dy(n) *
// s_x(c)), three roundings (__fmul_rn, __fmul_rn, __fadd_rn: never contracted), tiles in ascending order.  Only the
// sum of a tile's products inside the tensor core differs from the reference (specs/FP8.md, "The accumulator of
// Hopper's FP8 wgmma"), which the oracle's bound covers.
//
// An expert's last tile may be short (rem < 128 rows): its k32 steps wholly past the expert are skipped, and in the
// one that straddles the end the codes past it (the next expert's, or TMA's zeros past M) are zeroed in shared
// memory in both operands before the wgmma reads them (zeroing one would not do: NaN * 0 is NaN), as the bf16 dW
// kernel's h_zero_tail_rows does for its row-major boxes.
//
// A producer warpgroup fills a ring of stages (thread 0's TMA; every producer thread stages one scale of dY and
// one of X, read one step ahead); two consumer warpgroups each multiply 64 rows n of the 128 x 128 output tile.
// Persistent CTAs take the output tiles (e, n, c) in tile_coord's order; a tile of an expert without rows stores
// +0 (old + 0 with accumulate).  The epilogue writes two columns per 32- or 64-bit store (bf16 or f32), or element
// by element where K is odd or the output unaligned.
#include <cuda.h>

#include "common/cuda_check.cuh"
#include "common/launch.cuh"
#include "fp8/column_tiles.cuh"
#include "gemm/epilogue.cuh"
#include "gemm/fp8.cuh"
#include "gemm/heuristics.cuh"
#include "gemm/sm90.cuh"
#include "gemm/wgmma_fp8.cuh"

namespace moe_gpu {
namespace {

constexpr int D_BM = 128, D_BN = 128, D_BK = F8_TILE; // output rows n, columns c; a k-step is one 128-row tile
constexpr int D_A_BYTES = D_BM * D_BK, D_B_BYTES = D_BN * D_BK, D_STAGE_BYTES = D_A_BYTES + D_B_BYTES;
constexpr int D_PRODUCERS = 128, D_CONSUMERS = 256, D_THREADS = D_PRODUCERS + D_CONSUMERS;
constexpr int D_STAGES = 6;
// Shared memory: the ring of stages (A then B, 1024-byte aligned), each stage's scales (dY's of the tile's 128 n,
// then X's of its 128 c), the barriers full[S], empty[S].
constexpr int D_SCALES_OFFSET = D_STAGES * D_STAGE_BYTES;
constexpr int D_SCALES = D_BM + D_BN;
constexpr int D_BARRIER_OFFSET = D_SCALES_OFFSET + D_STAGES * D_SCALES * 4;
constexpr size_t D_SMEM_BYTES = 1024 /* alignment */ + D_BARRIER_OFFSET + 2 * D_STAGES * 8;
static_assert(D_SMEM_BYTES <= 232448, "shared memory of one CTA");
static_assert(D_BK == 128, "a k-step is one scale tile of 128 codes, one 128-byte swizzled row");
static_assert(D_PRODUCERS == D_BM && D_PRODUCERS == D_BN, "one producer thread per scale of n and of c");
static_assert(D_THREADS == H_THREADS && D_CONSUMERS == H_CONSUMERS, "consumer_sync's count (gemm/sm90.cuh)");
// Registers per thread (setmaxnreg): the consumers hold 64 accumulators and 64 partial sums.
constexpr int D_PRODUCER_REGS = 56, D_CONSUMER_REGS = 224;
static_assert(D_PRODUCER_REGS * D_PRODUCERS + D_CONSUMER_REGS * D_CONSUMERS <= H_LAUNCH_REGS,
              "the launch's registers (gemm/sm90.cuh, H_LAUNCH_REGS)");

#ifdef MOE_SM90A_DEVICE
// An output tile and its expert's rows [first, end): ceil((end - first) / 128) k-steps, from scale row scale0.
struct DwTile {
    TileCoord t; // e, i0 = n0, j0 = c0
    int64_t first, end, scale0, steps;
};
__device__ __forceinline__ DwTile dw_tile(const GemmArgs &g, int64_t tile)
{
    DwTile d;
    d.t = tile_coord(g, tile, D_BM, D_BN);
    d.first = g.ws.offsets[d.t.e], d.end = g.ws.offsets[d.t.e + 1];
    d.scale0 = column_first_scale_row(g.ws.offsets, d.t.e);
    d.steps = (d.end - d.first + D_BK - 1) / D_BK;
    return d;
}

// The consumers' share of a short tile's straddling k32 step: in the stage's A and B (128 rows each, K-major,
// 128-byte swizzle: byte q of row i at i * 128 + 16 ((q / 16) ^ (i % 8)) + q % 16), bytes rem .. kend - 1 of
// every row (thread c of 256 takes row c % 128 of A for c < 128, of B otherwise) become code 0 (+0); then the
// fence for the async proxy, and both warpgroups meet before either's wgmma reads the stage.
__device__ __forceinline__ void zero_tail_codes(uint32_t stage_addr, int rem, int kend, int c)
{
    const int row = c % D_BM;
    const uint32_t base = stage_addr + (c < D_BM ? 0 : D_A_BYTES) + row * 128;
    for (int q = rem; q < kend; q++)
        asm volatile("st.shared.u8 [%0], %1;\n" ::"r"(base + ((((q >> 4) ^ (row & 7)) << 4) | (q & 15))), "r"(0)
                     : "memory");
    fence_proxy_async();
    consumer_sync();
}

// A warpgroup's partial sums of one tile: its 64 rows of A (at a_addr) times B's 128 rows, over the tile's first
// KSTEPS k32 steps (the codes of the rows the tile has), into fresh registers; waits for them.
template <int TA, int TB, int KSTEPS>
__device__ __forceinline__ void tile_mma(float *part, uint32_t a_addr, uint32_t b_addr)
{
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KSTEPS; kk++)
        wgmma_fp8_m64n128k32<TA, TB>(part, smem_descriptor(a_addr + kk * 32, 16, 1024),
                                     smem_descriptor(b_addr + kk * 32, 16, 1024), kk > 0);
    wgmma_commit();
    wgmma_wait<0>();
}

// The epilogue of one consumer thread's accumulators: acc[4 j + 2 h + x] is row n0 + row_in_tile + 8 h, column
// c0 + 8 j + 2 (lane % 4) + x of dw[e]; v = old + v with accumulate, one rounding to out_dtype; a pair of columns
// is one 32-bit (bf16) or 64-bit (f32) store where K is even and the output 8-byte aligned.
__device__ __forceinline__ void store_dw_fragment(const GemmArgs &g, const TileCoord &t, int row_in_tile, int lane,
                                                  const float *acc)
{
    const bool pairs = g.K % 2 == 0 && (reinterpret_cast<uintptr_t>(g.out) & 7u) == 0;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int64_t n = t.i0 + row_in_tile + 8 * h;
        if (n >= g.N)
            continue;
        const int64_t row_index = (t.e * g.N + n) * g.K;
#pragma unroll
        for (int j = 0; j < D_BN / 8; j++) {
            const int64_t c = t.j0 + 8 * j + 2 * (lane % 4);
            if (c >= g.K)
                continue;
            float v[2] = {acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]};
            const int64_t index = row_index + c;
            if (pairs) { // c + 1 < K too: K even, c even
                if (g.out_dtype == MOE_F32) {
                    float2 *word = reinterpret_cast<float2 *>(static_cast<float *>(g.out) + index);
                    if (g.accumulate) {
                        const float2 old = *word;
                        v[0] = old.x + v[0], v[1] = old.y + v[1];
                    }
                    *word = make_float2(v[0], v[1]);
                } else {
                    uint32_t *word = reinterpret_cast<uint32_t *>(static_cast<uint16_t *>(g.out) + index);
                    if (g.accumulate) {
                        float old[2];
                        unpack_word(g.out_dtype, *word, old);
                        v[0] = old[0] + v[0], v[1] = old[1] + v[1];
                    }
                    *word = pack_word(g.out_dtype, v[0], v[1]);
                }
            } else {
#pragma unroll
                for (int x = 0; x < 2; x++)
                    if (c + x < g.K)
                        store_from_float(g.out_dtype, g.out, index + x,
                                         g.accumulate ? load_as_float(g.out_dtype, g.out, index + x) + v[x] : v[x]);
            }
        }
    }
}
#endif

// TA, TB: the codes of dY and X (0 e4m3, 1 e5m2).
template <int TA, int TB>
__global__ void __launch_bounds__(D_THREADS, 1) fp8_dw_sm90_kernel(const Fp8Args f, const __grid_constant__ Fp8Sm90Maps maps)
{
#ifdef MOE_SM90A_DEVICE
    const GemmArgs &g = f.g;
    unsigned char *smem = dynamic_smem_1k();
    const uint32_t smem_base = (uint32_t)__cvta_generic_to_shared(smem);
    const uint32_t full_bar = smem_base + D_BARRIER_OFFSET, empty_bar = full_bar + D_STAGES * 8;
    float *stage_scales = reinterpret_cast<float *>(smem + D_SCALES_OFFSET); // [S][D_SCALES]
    if (*g.ws.status != 0) // the routing or a scale was refused: nothing is read or written
        return;
    if (threadIdx.x == 0) {
        for (int s = 0; s < D_STAGES; s++) {
            mbar_init(full_bar + 8 * s, 1 + D_PRODUCERS); // thread 0's expect_tx, each producer's scales
            mbar_init(empty_bar + 8 * s, D_CONSUMERS / 32);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        fence_proxy_async();
    }
    __syncthreads();
    const int64_t tiles = total_tiles(g, D_BM, D_BN);

    if (threadIdx.x < D_PRODUCERS) {
        // ------------------------------------------------------------------ producer warpgroup
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(D_PRODUCER_REGS));
        const int p = threadIdx.x;
        // the (tile, step) pairs of this CTA in order, tiles without rows skipped; `next` one step ahead, whose
        // scales this thread reads before the stage of the current one is free
        int64_t tile = blockIdx.x, step = 0;
        DwTile cur = {}, nxt = {};
        auto advance = [&](int64_t *tl, int64_t *st, DwTile *d) { // to the first step at or after (tl, st)
            for (; *tl < tiles; *tl += gridDim.x, *st = 0) {
                *d = dw_tile(g, *tl);
                if (*st < d->steps)
                    return;
            }
        };
        advance(&tile, &step, &cur);
        int64_t ntile = tile, nstep = step + 1;
        if (tile < tiles)
            advance(&ntile, &nstep, &nxt);
        auto scales_of = [&](const DwTile &d, int64_t st, float *sa, float *sb) {
            const int64_t row = d.scale0 + st, n = d.t.i0 + p, c = d.t.j0 + p;
            *sa = n < g.N ? fp8_scale(f, f.a_scales, row * g.N + n) : 0.0f;
            *sb = c < g.K ? fp8_scale(f, f.b_scales, row * g.K + c) : 0.0f;
        };
        float sa = 0.0f, sb = 0.0f;
        if (tile < tiles)
            scales_of(cur, step, &sa, &sb);
        for (uint32_t it = 0; tile < tiles; it++) {
            const int s = (int)(it % D_STAGES);
            const uint32_t bar = full_bar + 8 * s, stage = smem_base + s * D_STAGE_BYTES;
            float sa_next = 0.0f, sb_next = 0.0f;
            if (ntile < tiles)
                scales_of(nxt, nstep, &sa_next, &sb_next);
            mbar_wait(empty_bar + 8 * s, ((it / D_STAGES) & 1) ^ 1);
            float *scales = stage_scales + s * D_SCALES;
            scales[p] = sa, scales[D_BM + p] = sb;
            mbar_arrive(bar); // release: the consumers' wait on the full barrier sees the stores
            if (p == 0) {
                const int r0 = (int)(cur.first + step * D_BK);
                mbar_arrive_expect_tx(bar, D_STAGE_BYTES);
                tma_load_2d(stage, &maps.a, bar, r0, (int)cur.t.i0);
                tma_load_2d(stage + D_A_BYTES, &maps.w, bar, r0, (int)cur.t.j0);
            }
            sa = sa_next, sb = sb_next;
            tile = ntile, step = nstep, cur = nxt;
            if (ntile < tiles) {
                nstep++;
                advance(&ntile, &nstep, &nxt);
            }
        }
    } else {
        // ------------------------------------------------------------------ consumer warpgroups
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(D_CONSUMER_REGS));
        const int c = threadIdx.x - D_PRODUCERS, wg = c / 128, lane = threadIdx.x % 32;
        const int row_in_tile = wg * 64 + c % 128 / 32 * 16 + lane / 4; // and row_in_tile + 8 (the wgmma layout)
        uint32_t it = 0;
        float part[64];
#pragma unroll
        for (int i = 0; i < 64; i++)
            part[i] = 0.0f; // overwritten by each k-step's first wgmma (scale_d = 0)
        for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
            const DwTile d = dw_tile(g, tile);
            float acc[64];
#pragma unroll
            for (int i = 0; i < 64; i++)
                acc[i] = 0.0f;
            for (int64_t step = 0; step < d.steps; step++, it++) {
                const int s = (int)(it % D_STAGES);
                const uint32_t stage = smem_base + s * D_STAGE_BYTES;
                const int rem = (int)min((int64_t)D_BK, d.end - d.first - step * D_BK); // the tile's rows, 1 .. 128
                const int ksteps = (rem + 31) / 32;
                mbar_wait(full_bar + 8 * s, (it / D_STAGES) & 1);
                if (rem % 32 != 0)
                    zero_tail_codes(stage, rem, 32 * ksteps, c);
                const uint32_t a_addr = stage + wg * (D_A_BYTES / 2), b_addr = stage + D_A_BYTES;
                switch (ksteps) { // one straight sequence per count (a wgmma under a branch would be serialised)
                case 1: tile_mma<TA, TB, 1>(part, a_addr, b_addr); break;
                case 2: tile_mma<TA, TB, 2>(part, a_addr, b_addr); break;
                case 3: tile_mma<TA, TB, 3>(part, a_addr, b_addr); break;
                default: tile_mma<TA, TB, 4>(part, a_addr, b_addr); break;
                }
                // the stage's scales, then the stage is released to the producers
                const float *scales = stage_scales + s * D_SCALES;
                const float sa0 = scales[row_in_tile], sa1 = scales[row_in_tile + 8];
                float sb[32];
#pragma unroll
                for (int j = 0; j < D_BN / 8; j++) {
                    const float2 v = *reinterpret_cast<const float2 *>(scales + D_BM + 8 * j + 2 * (lane % 4));
                    sb[2 * j] = v.x, sb[2 * j + 1] = v.y;
                }
                __syncwarp();
                if (lane == 0)
                    mbar_arrive(empty_bar + 8 * s);
                // promotion, the reference's roundings per element
#pragma unroll
                for (int i = 0; i < 64; i++) {
                    const float scale = __fmul_rn(i % 4 < 2 ? sa0 : sa1, sb[i / 4 * 2 + i % 2]);
                    acc[i] = __fadd_rn(acc[i], __fmul_rn(part[i], scale));
                }
            }
            store_dw_fragment(g, d.t, row_in_tile, lane, acc);
        }
    }
#endif
}

template <int TA> void *dw_kernel_for(int tb)
{
    return tb ? reinterpret_cast<void *>(fp8_dw_sm90_kernel<TA, 1>) : reinterpret_cast<void *>(fp8_dw_sm90_kernel<TA, 0>);
}

} // namespace

bool fp8_dw_sm90_plan(const Fp8Args &f, Fp8Sm90Maps *maps)
{
    const GemmArgs &g = f.g;
    *maps = Fp8Sm90Maps{};
    if (!sm90_path_available() || g.M % 16 != 0 || g.M == 0 || g.M > INT32_MAX || !aligned16(f.a) || !aligned16(f.b))
        return false;
    // dY^T [N][M] and X^T [K][M]: boxes {128 rows of the reduction, 128 rows n or c}, K-major as the stage wants them
    const uint64_t a_dims[2] = {(uint64_t)g.M, (uint64_t)g.N}, b_dims[2] = {(uint64_t)g.M, (uint64_t)g.K};
    const uint64_t strides[1] = {(uint64_t)g.M};
    const uint32_t box[2] = {D_BK, D_BM};
    return encode_tensor_map(&maps->a, f.a_dtype, f.a, 2, a_dims, strides, box) &&
           encode_tensor_map(&maps->w, f.b_dtype, f.b, 2, b_dims, strides, box);
}

moe_status launch_fp8_dw_sm90(const Fp8Args &f, const Fp8Sm90Maps &maps, int64_t max_tiles, cudaStream_t stream)
{
    void *kernel = f.a_dtype == MOE_E5M2 ? dw_kernel_for<1>(f.b_dtype == MOE_E5M2)
                                         : dw_kernel_for<0>(f.b_dtype == MOE_E5M2);
    return launch_fp8_sm90_kernel(kernel, f, maps, max_tiles, D_THREADS, D_SMEM_BYTES, stream);
}

} // namespace moe_gpu
