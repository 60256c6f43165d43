// The sm90 dW ping-pong kernel (dW with short experts: each consumer warpgroup owns whole 128 x 128 tiles and
// the two take turns at the tensor cores); launched by launch_sm90 (gemm/sm90.cu).
#include "gemm/sm90_dw_pingpong.cuh"

namespace moe_gpu {
namespace {

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

} // namespace

template <typename T> Sm90Kernel sm90_dw_pingpong_entry() { return sm90_dw_pingpong_kernel<T>; }
template Sm90Kernel sm90_dw_pingpong_entry<__nv_bfloat16>();
template Sm90Kernel sm90_dw_pingpong_entry<__half>();

} // namespace moe_gpu
