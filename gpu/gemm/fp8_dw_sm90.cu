// FP8 dW's Hopper kernel (sm_90a): moe_gemm_fp8_dw with options.codes_transposed, on FP8 tensor cores (wgmma
// m64n128k32), the contract of gemm/fp8_dw.cu's portable kernel and of the reference (specs/FP8.md, "dW"):
//
//   dw[e][n][c] = the promoted sum over expert e's 128-row tiles t, in ascending order, of
//                 part_t(n, c) * (sdy[s_t][n] * sx[s_t][c]),   s_t = offsets[e] / 128 + e + t,
//   dY^T codes [N][M] (a: rows n), X^T codes [K][M] (b: rows c), scales [scale rows][N] and [scale rows][K]
//
// FP8 wgmma reads only K-major operands, and dW reduces over the expert's rows, so it takes the transposed codes
// (moe_quantize_fp8_columns_transposed), whose rows are the reduction.  A k-step is one 128-row tile of the
// expert, rows r0 = offsets[e] + 128 t .. r0 + 127 of each of 128 rows n and 128 rows c.  Its four wgmma k32 give
// the tile's partial sums in fresh registers, promoted as the reference promotes them: acc = acc + part * (s_dy(n)
// * s_x(c)), three roundings (__fmul_rn, __fmul_rn, __fadd_rn: never contracted), tiles in ascending order.  Only
// the sum of a tile's products inside the tensor core differs from the reference (specs/FP8.md, "The accumulator
// of Hopper's FP8 wgmma"), which the oracle's bound covers.
//
// r0 has any alignment, and a TMA load's innermost coordinate must be a multiple of 16 bytes (else the TMA unit
// stops the kernel: bench/RESULTS.md, "The Hopper FP8 dW kernel's illegal instruction").  So thread 0 loads the
// aligned rows r0 & ~15 .. + 143 of the step's 128 rows n and 128 rows c by TMA into a dense staging buffer
// (two, the next step's load under way while this step's is read), and the producers write the tile's 128 codes
// of each row from byte r0 % 16 into the stage in wgmma's swizzled layout, codes past the expert's end as +0 in
// both operands (zeroing one would not do: NaN * 0 is NaN).  A short tile (rem < 128 rows) runs only the k32
// steps that hold its rows.
//
// A producer warpgroup fills a ring of stages (every producer thread writes one row of each operand and stages one
// scale of dY and one of X, read one step ahead); two consumer warpgroups each multiply 64 rows n of the 128 x 128
// output tile.  Persistent CTAs take the output tiles (e, n, c) in tile_coord's order; a tile of an expert without
// rows stores +0 (old + 0 with accumulate).  The epilogue writes two columns per 32- or 64-bit store (bf16 or
// f32), or element by element where K is odd or the output unaligned.
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
constexpr int D_STAGES = 4;
// A staging buffer: the TMA box {D_ROW_BYTES codes from r0 & ~15, 128 rows} of dY^T, then of X^T, dense.
constexpr int D_ROW_BYTES = D_BK + 16, D_STAGING_BYTES = (D_BM + D_BN) * D_ROW_BYTES;
// Shared memory: the ring of stages (A then B, 1024-byte aligned), the two staging buffers, each stage's scales
// (dY's of the tile's 128 n, then X's of its 128 c), the barriers full[S], empty[S], staged[2].
constexpr int D_STAGING_OFFSET = D_STAGES * D_STAGE_BYTES;
constexpr int D_SCALES_OFFSET = D_STAGING_OFFSET + 2 * D_STAGING_BYTES;
constexpr int D_SCALES = D_BM + D_BN;
constexpr int D_BARRIER_OFFSET = D_SCALES_OFFSET + D_STAGES * D_SCALES * 4;
constexpr size_t D_SMEM_BYTES = 1024 /* alignment */ + D_BARRIER_OFFSET + (2 * D_STAGES + 2) * 8;
static_assert(D_SMEM_BYTES <= 232448, "shared memory of one CTA");
static_assert(D_BK == 128, "a k-step is one scale tile of 128 codes, one 128-byte swizzled row");
static_assert(D_ROW_BYTES % 16 == 0 && D_STAGING_OFFSET % 128 == 0 && D_STAGING_BYTES % 128 == 0,
              "the staging boxes' rows and buffers 16- and 128-byte aligned");
static_assert(D_PRODUCERS == D_BM && D_PRODUCERS == D_BN, "one producer thread per row n and row c");
static_assert(D_THREADS == H_THREADS && D_CONSUMERS == H_CONSUMERS && D_PRODUCERS == H_PRODUCERS,
              "producer_sync's count (gemm/sm90.cuh)");
// Registers per thread (setmaxnreg): the consumers hold 64 accumulators and 64 partial sums.
constexpr int D_PRODUCER_REGS = 80, D_CONSUMER_REGS = 208;
static_assert(D_PRODUCER_REGS * D_PRODUCERS + D_CONSUMER_REGS * D_CONSUMERS <= H_LAUNCH_REGS,
              "the launch's registers (gemm/sm90.cuh, H_LAUNCH_REGS)");

#ifdef MOE_SM90A_DEVICE
// An output tile (expert e, rows n0 .., columns c0 ..) and its expert's rows [first, end): ceil((end - first) / 128)
// k-steps, from scale row scale0; 32-bit (fp8_dw_sm90_plan: M < 2^31 - 144, so every row and scale row index fits)
// to leave the producers' registers to their rows.
struct DwTile {
    int e, n0, c0, first, end, scale0, steps;
};
__device__ __forceinline__ DwTile dw_tile(const GemmArgs &g, int64_t tile)
{
    const TileCoord t = tile_coord(g, tile, D_BM, D_BN);
    DwTile d;
    d.e = (int)t.e, d.n0 = (int)t.i0, d.c0 = (int)t.j0;
    d.first = (int)g.ws.offsets[t.e], d.end = (int)g.ws.offsets[t.e + 1];
    d.scale0 = (int)column_first_scale_row(g.ws.offsets, t.e);
    d.steps = (d.end - d.first + D_BK - 1) / D_BK;
    return d;
}

// The byte mask of a 4-code word whose first code is the tile's code j, of a tile of rem codes: codes j .. rem - 1
// kept, the rest +0.
__device__ __forceinline__ uint32_t tail_mask(int j, int rem)
{
    const int keep = rem - j;
    return keep >= 4 ? 0xffffffffu : keep <= 0 ? 0u : (1u << (8 * keep)) - 1u;
}

// 16 bytes of shared memory at addr (16-byte aligned), loaded and stored.
__device__ __forceinline__ uint4 lds128(uint32_t addr)
{
    uint4 v;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
    return v;
}
__device__ __forceinline__ void sts128(uint32_t addr, uint4 v)
{
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}

// One row of one operand into the stage: the tile's codes 0 .. 127, from byte `shift` (r0 % 16) of the staging
// row at `src` (D_ROW_BYTES codes from r0 & ~15), into row `row` of the stage's operand at `dst` (K-major, 128-byte
// swizzle: kmajor_offset), codes rem .. 127 as +0.  Q = shift / 4, a template parameter so that the words stay in
// registers; each 16-code chunk is two aligned 16-byte loads (this one and the next) shifted right by `shift` bytes.
template <int Q>
__device__ __forceinline__ void stage_row(uint32_t src, uint32_t dst, int row, int shift, int rem)
{
    const int bits = 8 * (shift & 3);
    uint4 lo = lds128(src);
#pragma unroll
    for (int kc = 0; kc < D_BK / 16; kc++) {
        const uint4 hi = lds128(src + 16 * (kc + 1));
        const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
        uint4 out;
        out.x = __funnelshift_r(w[Q], w[Q + 1], bits) & tail_mask(16 * kc, rem);
        out.y = __funnelshift_r(w[Q + 1], w[Q + 2], bits) & tail_mask(16 * kc + 4, rem);
        out.z = __funnelshift_r(w[Q + 2], w[Q + 3], bits) & tail_mask(16 * kc + 8, rem);
        out.w = __funnelshift_r(w[Q + 3], w[Q + 4], bits) & tail_mask(16 * kc + 12, rem);
        sts128(dst + kmajor_offset(row, kc), out);
        lo = hi;
    }
}

// Producer p's share of a step: row p of dY^T's box and row p of X^T's box, from the staging buffer into the stage
// (shared-memory addresses).
template <int Q>
__device__ __forceinline__ void stage_rows(uint32_t staging, uint32_t stage, int p, int shift, int rem)
{
    stage_row<Q>(staging + p * D_ROW_BYTES, stage, p, shift, rem);
    stage_row<Q>(staging + (D_BM + p) * D_ROW_BYTES, stage + D_A_BYTES, p, shift, rem);
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
    const uint32_t staged_bar = empty_bar + D_STAGES * 8; // staged[2]: a staging buffer's boxes landed
    float *stage_scales = reinterpret_cast<float *>(smem + D_SCALES_OFFSET); // [S][D_SCALES]
    if (*g.ws.status != 0) // the routing or a scale was refused: nothing is read or written
        return;
    if (threadIdx.x == 0) {
        for (int s = 0; s < D_STAGES; s++) {
            mbar_init(full_bar + 8 * s, D_PRODUCERS); // each producer's arrival after its rows and scales
            mbar_init(empty_bar + 8 * s, D_CONSUMERS / 32);
        }
        mbar_init(staged_bar, 1); // thread 0's expect_tx
        mbar_init(staged_bar + 8, 1);
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
        int64_t tile = blockIdx.x;
        int step = 0;
        DwTile cur = {}, nxt = {};
        auto advance = [&](int64_t *tl, int *st, DwTile *d) { // to the first step at or after (tl, st)
            for (; *tl < tiles; *tl += gridDim.x, *st = 0) {
                *d = dw_tile(g, *tl);
                if (*st < d->steps)
                    return;
            }
        };
        advance(&tile, &step, &cur);
        int64_t ntile = tile;
        int nstep = step + 1;
        if (tile < tiles)
            advance(&ntile, &nstep, &nxt);
        auto scales_of = [&](const DwTile &d, int st, float *sa, float *sb) {
            const int64_t row = d.scale0 + st, n = d.n0 + p, c = d.c0 + p;
            *sa = n < g.N ? fp8_scale(f, f.a_scales, row * g.N + n) : 0.0f;
            *sb = c < g.K ? fp8_scale(f, f.b_scales, row * g.K + c) : 0.0f;
        };
        // thread 0: a step's boxes, rows r0 & ~15 .. + D_ROW_BYTES - 1 of its 128 rows n and 128 rows c (the
        // innermost coordinate 16-byte aligned), into staging buffer `buffer`
        auto load_staging = [&](const DwTile &d, int st, int buffer) {
            const uint32_t bar = staged_bar + 8 * buffer, dst = smem_base + D_STAGING_OFFSET + buffer * D_STAGING_BYTES;
            const int r_aligned = (d.first + st * D_BK) & ~15;
            mbar_arrive_expect_tx(bar, D_STAGING_BYTES);
            tma_load_2d(dst, &maps.a, bar, r_aligned, d.n0);
            tma_load_2d(dst + D_BM * D_ROW_BYTES, &maps.w, bar, r_aligned, d.c0);
        };
        float sa = 0.0f, sb = 0.0f;
        if (tile < tiles) {
            scales_of(cur, step, &sa, &sb);
            if (p == 0)
                load_staging(cur, step, 0);
        }
        for (uint32_t it = 0; tile < tiles; it++) {
            const int s = (int)(it % D_STAGES), buf = (int)(it & 1);
            // the next step's boxes into the other buffer, read in the previous step (its producer_sync is past)
            if (p == 0 && ntile < tiles)
                load_staging(nxt, nstep, buf ^ 1);
            float sa_next = 0.0f, sb_next = 0.0f;
            if (ntile < tiles)
                scales_of(nxt, nstep, &sa_next, &sb_next);
            mbar_wait(staged_bar + 8 * buf, (it >> 1) & 1);
            mbar_wait(empty_bar + 8 * s, ((it / D_STAGES) & 1) ^ 1);
            float *scales = stage_scales + s * D_SCALES;
            scales[p] = sa, scales[D_BM + p] = sb;
            const int r0 = cur.first + step * D_BK;
            const int shift = r0 & 15, rem = min(D_BK, cur.end - r0); // rem: 1 .. 128
            const uint32_t staging = smem_base + D_STAGING_OFFSET + buf * D_STAGING_BYTES;
            const uint32_t stage = smem_base + s * D_STAGE_BYTES;
            switch (shift >> 2) { // the same for the whole CTA (the expert's first row)
            case 0: stage_rows<0>(staging, stage, p, shift, rem); break;
            case 1: stage_rows<1>(staging, stage, p, shift, rem); break;
            case 2: stage_rows<2>(staging, stage, p, shift, rem); break;
            default: stage_rows<3>(staging, stage, p, shift, rem); break;
            }
            fence_proxy_async();      // the rows were written by the generic proxy; wgmma reads by the async one
            mbar_arrive(full_bar + 8 * s); // release: the consumers' wait on the full barrier sees the stores
            producer_sync();          // buffer buf read by every producer before thread 0 loads into it again
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
            for (int step = 0; step < d.steps; step++, it++) {
                const int s = (int)(it % D_STAGES);
                const uint32_t stage = smem_base + s * D_STAGE_BYTES;
                const int rem = min(D_BK, d.end - d.first - step * D_BK); // the tile's rows, 1 .. 128
                const int ksteps = (rem + 31) / 32;
                mbar_wait(full_bar + 8 * s, (it / D_STAGES) & 1); // codes past the expert's end are +0 there
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
            store_dw_fragment(g, TileCoord{d.e, d.n0, d.c0, 0}, row_in_tile, lane, acc);
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
    // M % 16 == 0 and the codes 16-byte aligned: every row of dY^T and X^T starts 16-byte aligned (TMA's global
    // strides); M < 2^31 - D_ROW_BYTES: the kernel's row indices and box coordinates are 32-bit
    if (!sm90_path_available() || g.M % 16 != 0 || g.M == 0 || g.M >= INT32_MAX - D_ROW_BYTES || !aligned16(f.a) ||
        !aligned16(f.b))
        return false;
    // dY^T [N][M] and X^T [K][M]: boxes {D_ROW_BYTES codes of the reduction, 128 rows n or c} into the staging
    // buffers, unswizzled (the producers read them)
    const uint64_t a_dims[2] = {(uint64_t)g.M, (uint64_t)g.N}, b_dims[2] = {(uint64_t)g.M, (uint64_t)g.K};
    const uint64_t strides[1] = {(uint64_t)g.M};
    const uint32_t box[2] = {D_ROW_BYTES, D_BM};
    return encode_unswizzled_tensor_map(&maps->a, f.a_dtype, f.a, 2, a_dims, strides, box) &&
           encode_unswizzled_tensor_map(&maps->w, f.b_dtype, f.b, 2, b_dims, strides, box);
}

moe_status launch_fp8_dw_sm90(const Fp8Args &f, const Fp8Sm90Maps &maps, int64_t max_tiles, cudaStream_t stream)
{
    void *kernel = f.a_dtype == MOE_E5M2 ? dw_kernel_for<1>(f.b_dtype == MOE_E5M2)
                                         : dw_kernel_for<0>(f.b_dtype == MOE_E5M2);
    return launch_fp8_sm90_kernel(kernel, f, maps, max_tiles, D_THREADS, D_SMEM_BYTES, stream);
}

} // namespace moe_gpu
