// The FP8 grouped GEMM's Hopper kernel (sm_90a): the forward, Y = X . W[e]^T per expert with the scales of
// include/moe_fp8.h, on FP8 tensor cores (wgmma m64n128k32, e4m3 / e5m2 codes as they are, no decoding), the
// contract of gemm/fp8.cu's portable kernel and of the reference (specs/FP8.md).
//
//   X codes [M or T][K] (1 x 128 scales), W codes [E][N][K] (128 x 128 block scales), Y [M][N] bf16/f16/f32
// Tiles of 128 rows x 128 columns; a k-step is one 128-element tile of the reduction (128 bytes of codes per
// row: exactly the 128-byte swizzle's row), so each k-step's four wgmma k32 give that tile's partial sums in
// fresh registers, promoted as the reference promotes them: acc = acc + part * (s_x(row) * s_w), two roundings
// (__fmul_rn / __fadd_rn: never contracted), tiles in ascending order.  What differs from the reference is only
// the sum of a tile's 128 products inside the tensor core (specs/FP8.md, "The accumulator of Hopper's FP8
// wgmma").  A producer warpgroup fills a ring of Q_STAGES stages: W by TMA (3-D map, box {128 k, 128 n, 1});
// X by TMA when its rows are the expert-order rows (2-D map; rows past the expert belong to the next one and
// are never stored), or by cp.async from the gathered rows with permute_x (zeros past the expert).  Two
// consumer warpgroups each multiply 64 rows; the epilogue is the GEMM's (gemm/epilogue.cuh: topk weights,
// permute_y, accumulate, the rounding).  Persistent CTAs take tiles in the static order of tile_coord.
#include <cuda.h>

#include "common/cp_async.cuh"
#include "common/cuda_check.cuh"
#include "common/launch.cuh"
#include "gemm/epilogue.cuh"
#include "gemm/fp8.cuh"
#include "gemm/heuristics.cuh"
#include "gemm/sm90.cuh"

namespace moe_gpu {
namespace {

constexpr int Q_BM = 128, Q_BN = 128, Q_BK = F8_TILE, Q_STAGES = 6;
constexpr int Q_A_BYTES = Q_BM * Q_BK, Q_B_BYTES = Q_BN * Q_BK, Q_STAGE_BYTES = Q_A_BYTES + Q_B_BYTES;
constexpr int Q_PRODUCERS = 128, Q_CONSUMERS = 256, Q_THREADS = Q_PRODUCERS + Q_CONSUMERS;
constexpr int Q_BARRIER_OFFSET = Q_STAGES * Q_STAGE_BYTES;        // full[S], empty[S]
constexpr int Q_ROWS_OFFSET = Q_BARRIER_OFFSET + 2 * Q_STAGES * 8; // gathered X rows, int64 [2][Q_BM] by tile parity
constexpr size_t Q_SMEM_BYTES = 1024 /* alignment */ + Q_ROWS_OFFSET + 2 * Q_BM * 8;
static_assert(Q_BK == 128, "a k-step is one scale tile of 128 codes, one 128-byte swizzled row");
static_assert(Q_SMEM_BYTES <= 232448, "shared memory of one CTA");
constexpr int Q_PRODUCER_REGS = 40, Q_CONSUMER_REGS = 232;
static_assert(Q_PRODUCER_REGS * Q_PRODUCERS + Q_CONSUMER_REGS * Q_CONSUMERS <= 65536, "register file");

#ifdef MOE_SM90A_DEVICE
// d (+)= A(desc_a) * B(desc_b), 64 x 128 x 32 FP8 (scale_d = 0: d = A * B).
#define MOE_WGMMA_FP8_M64N128K32(TA, TB) \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" \
                 "wgmma.mma_async.sync.aligned.m64n128k32.f32." TA "." TB " " \
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n" \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d))
// The PTX type names of the operands' codes: 0 e4m3, 1 e5m2.
template <int TA, int TB>
__device__ __forceinline__ void wgmma_fp8_m64n128k32(float *d, uint64_t desc_a, uint64_t desc_b, int scale_d)
{
    if constexpr (TA == 0 && TB == 0)
        MOE_WGMMA_FP8_M64N128K32("e4m3", "e4m3");
    else if constexpr (TA == 0 && TB == 1)
        MOE_WGMMA_FP8_M64N128K32("e4m3", "e5m2");
    else if constexpr (TA == 1 && TB == 0)
        MOE_WGMMA_FP8_M64N128K32("e5m2", "e4m3");
    else
        MOE_WGMMA_FP8_M64N128K32("e5m2", "e5m2");
}
#undef MOE_WGMMA_FP8_M64N128K32
#endif

// TA, TB: the codes of X and W (0 e4m3, 1 e5m2); GATHER: X's rows by cp.async from the gathered rows
// (permute_x), else by TMA (maps.a).
template <int TA, int TB, bool GATHER>
__global__ void __launch_bounds__(Q_THREADS, 1) fp8_sm90_kernel(const Fp8Args f, const __grid_constant__ Fp8Sm90Maps maps)
{
#ifdef MOE_SM90A_DEVICE
    const GemmArgs &g = f.g;
    unsigned char *smem = dynamic_smem_1k();
    const uint32_t smem_base = (uint32_t)__cvta_generic_to_shared(smem);
    const uint32_t full_bar = smem_base + Q_BARRIER_OFFSET, empty_bar = full_bar + Q_STAGES * 8;
    int64_t *row_table = reinterpret_cast<int64_t *>(smem + Q_ROWS_OFFSET);
    if (*g.ws.status != 0) // the routing or a scale was refused: nothing is read or written
        return;
    if (threadIdx.x == 0) {
        for (int s = 0; s < Q_STAGES; s++) {
            // thread 0's arrival (expect_tx), and with GATHER each producer's cp.async arrival
            mbar_init(full_bar + 8 * s, GATHER ? Q_PRODUCERS + 1 : 1);
            mbar_init(empty_bar + 8 * s, Q_CONSUMERS / 32);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        fence_proxy_async();
    }
    __syncthreads();
    const int64_t tiles = total_tiles(g, Q_BM, Q_BN), steps = (g.K + Q_BK - 1) / Q_BK;

    if (threadIdx.x < Q_PRODUCERS) {
        // ------------------------------------------------------------------ producer warpgroup
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Q_PRODUCER_REGS));
        const int p = threadIdx.x;
        if (!GATHER && p > 0) // every load is thread 0's TMA
            return;
        const uint64_t w_policy = l2_policy(true); // a W block is read again by the expert's other row tiles
        uint32_t it = 0; // k-steps issued over all of this CTA's tiles (the consumers count the same)
        int64_t tile_count = 0;
        for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x, tile_count++) {
            const TileCoord t = tile_coord(g, tile, Q_BM, Q_BN);
            const int64_t base = g.ws.offsets[t.e];
            int64_t *tile_rows = row_table + (tile_count & 1) * Q_BM; // by tile parity: the last tile's may be in use
            if (GATHER) {
                for (int i = p; i < Q_BM; i += Q_PRODUCERS)
                    tile_rows[i] = a_source_row(g, t, t.i0 + i, false);
                producer_sync();
            }
            for (int64_t step = 0; step < steps; step++, it++) {
                const int s = (int)(it % Q_STAGES);
                const uint32_t bar = full_bar + 8 * s;
                mbar_wait(empty_bar + 8 * s, ((it / Q_STAGES) & 1) ^ 1);
                const uint32_t sa_addr = smem_base + s * Q_STAGE_BYTES, sb_addr = sa_addr + Q_A_BYTES;
                const int q0 = (int)(step * Q_BK);
                if (p == 0) {
                    mbar_arrive_expect_tx(bar, (GATHER ? 0 : Q_A_BYTES) + Q_B_BYTES);
                    if (!GATHER)
                        tma_load_2d(sa_addr, &maps.a, bar, q0, (int)(base + t.i0));
                    tma_load_3d(sb_addr, &maps.w, bar, q0, (int)t.j0, (int)t.e, w_policy);
                }
                if (GATHER) { // thread p copies 16-code chunk p % 8 of rows p / 8 + 16 u
                    const int kc = p & 7;
                    const bool k_ok = q0 + kc * 16 < g.K;
                    unsigned char *sa = smem + s * Q_STAGE_BYTES;
#pragma unroll
                    for (int u = 0; u < Q_BM / 16; u++) {
                        const int i = (p >> 3) + 16 * u;
                        const int64_t row = tile_rows[i];
                        const bool ok = row >= 0 && k_ok;
                        cp_async16(sa + kmajor_offset(i, kc), ok ? f.a + row * g.K + q0 + kc * 16 : f.a, ok);
                    }
                    cp_async_arrive_noinc(bar);
                }
            }
        }
    } else {
        // ------------------------------------------------------------------ consumer warpgroups
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Q_CONSUMER_REGS));
        const int wg = threadIdx.x / 128 - 1, warp_in_wg = threadIdx.x % 128 / 32, lane = threadIdx.x % 32;
        const int row_in_tile = wg * 64 + warp_in_wg * 16 + lane / 4; // and row_in_tile + 8 (the wgmma layout)
        uint32_t it = 0;
        float part[64];
#pragma unroll
        for (int i = 0; i < 64; i++)
            part[i] = 0.0f; // overwritten by each k-step's first wgmma (scale_d = 0)
        for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
            const TileCoord t = tile_coord(g, tile, Q_BM, Q_BN);
            const int64_t row0 = a_source_row(g, t, t.i0 + row_in_tile, false);
            const int64_t row1 = a_source_row(g, t, t.i0 + row_in_tile + 8, false);
            float acc[64];
#pragma unroll
            for (int i = 0; i < 64; i++)
                acc[i] = 0.0f;
            for (int64_t step = 0; step < steps; step++, it++) {
                const int s = (int)(it % Q_STAGES);
                // this tile's scales, read before the wait so that their latency hides behind it
                const float sw = fp8_w_scale(f, t.e, step, t.j0);
                const float sx0 = row0 >= 0 ? fp8_a_scale(f, row0, step) : 0.0f;
                const float sx1 = row1 >= 0 ? fp8_a_scale(f, row1, step) : 0.0f;
                mbar_wait(full_bar + 8 * s, (it / Q_STAGES) & 1);
                const uint32_t sa_addr = smem_base + s * Q_STAGE_BYTES + wg * (Q_A_BYTES / 2);
                const uint32_t sb_addr = smem_base + s * Q_STAGE_BYTES + Q_A_BYTES;
                if (GATHER)
                    fence_proxy_async(); // the rows came through cp.async (generic proxy); wgmma reads via the async proxy
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < Q_BK / 32; kk++)
                    wgmma_fp8_m64n128k32<TA, TB>(part, smem_descriptor(sa_addr + kk * 32, 16, 1024),
                                                 smem_descriptor(sb_addr + kk * 32, 16, 1024), kk > 0);
                wgmma_commit();
                wgmma_wait<0>();
                __syncwarp();
                if (lane == 0)
                    mbar_arrive(empty_bar + 8 * s); // the stage is read: the producer may refill it
                // promotion, the reference's two roundings per element
                const float scale0 = __fmul_rn(sx0, sw), scale1 = __fmul_rn(sx1, sw);
#pragma unroll
                for (int i = 0; i < 64; i++)
                    acc[i] = __fadd_rn(acc[i], __fmul_rn(part[i], i % 4 < 2 ? scale0 : scale1));
            }
            // d[4 j + 2 h + x]: row row_in_tile + 8 h, column 8 j + 2 (lane % 4) + x
#pragma unroll
            for (int i = 0; i < 64; i++)
                store_output(g, t, t.i0 + row_in_tile + 8 * (i % 4 / 2), t.j0 + 8 * (i / 4) + 2 * (lane % 4) + i % 2,
                             acc[i]);
        }
    }
#endif
}

template <int TA, int TB> void *kernel_for(bool gather)
{
    return gather ? reinterpret_cast<void *>(fp8_sm90_kernel<TA, TB, true>)
                  : reinterpret_cast<void *>(fp8_sm90_kernel<TA, TB, false>);
}

} // namespace

Fp8Sm90Plan fp8_sm90_plan(const Fp8Args &f, Fp8Sm90Maps *maps)
{
    const GemmArgs &g = f.g;
    *maps = Fp8Sm90Maps{};
    if (g.op != OP_FWD || !sm90_path_available() || g.K % 16 != 0 || !aligned16(f.a) || !aligned16(f.b))
        return FP8_SM90_NOT_ITS_SHAPE;
    const uint64_t w_dims[3] = {(uint64_t)g.K, (uint64_t)g.N, (uint64_t)g.E};
    const uint64_t w_strides[2] = {(uint64_t)g.K, (uint64_t)(g.N * g.K)};
    const uint32_t box[3] = {Q_BK, Q_BN, 1};
    if (!encode_tensor_map(&maps->w, f.b_dtype, f.b, 3, w_dims, w_strides, box))
        return FP8_SM90_MAPS_REFUSED;
    if (g.permute_x)
        return FP8_SM90_TAKES; // X's rows are gathered by cp.async
    const uint64_t a_dims[2] = {(uint64_t)g.K, (uint64_t)g.M}, a_strides[1] = {(uint64_t)g.K};
    return encode_tensor_map(&maps->a, f.a_dtype, f.a, 2, a_dims, a_strides, box) ? FP8_SM90_TAKES
                                                                                   : FP8_SM90_MAPS_REFUSED;
}

moe_status launch_fp8_sm90(const Fp8Args &f, const Fp8Sm90Maps &maps, int64_t max_tiles, cudaStream_t stream)
{
    const int ta = f.a_dtype == MOE_E5M2, tb = f.b_dtype == MOE_E5M2;
    const bool gather = f.g.permute_x != 0;
    void *kernel = ta ? (tb ? kernel_for<1, 1>(gather) : kernel_for<1, 0>(gather))
                      : (tb ? kernel_for<0, 1>(gather) : kernel_for<0, 0>(gather));
    MOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)Q_SMEM_BYTES));
    const unsigned grid = persistent_grid(max_tiles, 1);
    void *args[2] = {const_cast<Fp8Args *>(&f), const_cast<Fp8Sm90Maps *>(&maps)};
    MOE_CUDA_CHECK(cudaLaunchKernel(kernel, dim3(grid), dim3(Q_THREADS), args, Q_SMEM_BYTES, stream));
    return MOE_OK;
}

} // namespace moe_gpu
