// The ping-pong schedule of the rows kernels (names G_* / g_*, after the fused gate/up kernel that introduced it):
// the ring of 128-row tiles filled by one TMA thread, and the two consumer warpgroups taking whole tiles in turn.
// Users: mlp/gate_sm90.cu (the fused gate/up kernel) and gemm/rows_f32_sm90.cu (the f32 rows kernel).
#ifndef LIBMOE_GPU_GEMM_PINGPONG_ROWS_CUH
#define LIBMOE_GPU_GEMM_PINGPONG_ROWS_CUH

#include "gemm/args.cuh"
#include "gemm/sm90.cuh"

namespace moe_gpu {

// Tiles of G_BM rows and G_BI columns (the gate/up kernel: 64 i, gate and up; the f32 kernel: two boxes of 64
// columns), G_STAGES stages of 32 KiB: the tile's rows {64 k, 128 rows} then two W boxes of 8 KiB.
constexpr int G_BM = 128, G_BI = 64, G_STAGES = 4;
constexpr int G_A_BYTES = G_BM * H_BK * 2, G_STAGE_BYTES = G_A_BYTES + 2 * G_BI * H_BK * 2; // 16 + 16 KiB
constexpr int G_BOX_BYTES = 64 * 128;

#ifdef MOE_SM90A_DEVICE
// The ring of the ping-pong rows kernels (this one and sm90_rows_f32_kernel below), filled by the producer
// warpgroup's thread 0 in tile order: per tile (tile_cols output columns from t.j0) `steps` k-steps of the
// tile's 128 rows {64 k, 128 rows} (K-major, rows_a) and two W boxes at output columns t.j0 and t.j0 + second
// (the gate/up kernel: I, the up columns of the same i; the f32 kernel: 64).  W is [E][N][K] with boxes
// {64, 64, 1}: TRANS_B = 1 (the dX form, out = a . W[e], reduction N) reads them as {64 c, 64 n} (MN-major B),
// TRANS_B = 0 (the forward form, out = a . W[e]^T, reduction K) as {64 k, 64 n} (K-major B; the two boxes make
// one 128-row K-major operand).  Rows past the expert's last one belong to the next expert (or lie past the
// tensor: zeros); their results are never stored.
template <int STAGES = G_STAGES, int TRANS_B = 1>
__device__ __forceinline__ void g_produce(const GemmArgs &g, const CUtensorMap *rows_a, const CUtensorMap *w,
                                          int tile_cols, int64_t second, int64_t tiles, int64_t steps,
                                          uint32_t smem_base, uint32_t full_bar, uint32_t empty_bar)
{
    const uint64_t w_policy = l2_policy(true);
    uint32_t it = 0;
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const TileCoord t = tile_coord(g, tile, G_BM, tile_cols);
        const int64_t base = g.ws.offsets[t.e];
        for (int64_t step = 0; step < steps; step++, it++) {
            const int s = (int)(it % STAGES);
            const uint32_t bar = full_bar + 8 * s, sa = smem_base + s * G_STAGE_BYTES, sb = sa + G_A_BYTES;
            const int q0 = (int)(step * H_BK);
            mbar_wait(empty_bar + 8 * s, ((it / STAGES) & 1) ^ 1);
            mbar_arrive_expect_tx(bar, G_STAGE_BYTES);
            tma_load_2d(sa, rows_a, bar, q0, (int)(base + t.i0));
            if (TRANS_B) {
                tma_load_3d(sb, w, bar, (int)t.j0, q0, (int)t.e, w_policy);
                tma_load_3d(sb + G_BOX_BYTES, w, bar, (int)(second + t.j0), q0, (int)t.e, w_policy);
            } else {
                tma_load_3d(sb, w, bar, q0, (int)t.j0, (int)t.e, w_policy);
                tma_load_3d(sb + G_BOX_BYTES, w, bar, q0, (int)(second + t.j0), (int)t.e, w_policy);
            }
        }
    }
}

// Consumer warpgroup wg's MMAs of its tile (the CTA's local-th; my_tiles in all) from the ring: d = the tile's
// 128 rows x 128 columns (two m64n128 blocks; the second only when second_block or g.full_blocks).  Waits for its
// turn (the other warpgroup has issued the previous tile's MMAs), hands the turn on after its last k-step's
// MMAs are issued, and returns with them complete and every stage it read freed; it runs on over the stages.
// TRANS_B: g_produce's.
template <typename T, int STAGES = G_STAGES, int TRANS_B = 1>
__device__ __forceinline__ void g_mma_tile(const GemmArgs &g, float (&d)[2][G_BI], bool second_block, int64_t steps,
                                           uint32_t &it, int wg, int64_t local, int64_t my_tiles, uint32_t smem_base,
                                           uint32_t full_bar, uint32_t empty_bar)
{
    const int lane = threadIdx.x % 32;
    if (local > 0)
        named_sync(1 + wg, 256); // the other warpgroup has issued the previous tile's MMAs
#pragma unroll
    for (int b = 0; b < 2; b++)
#pragma unroll
        for (int i = 0; i < G_BI; i++)
            d[b][i] = 0.0f;
    for (int64_t step = 0; step < steps; step++, it++) {
        const int s = (int)(it % STAGES);
        const uint32_t stage = smem_base + s * G_STAGE_BYTES;
        mbar_wait(full_bar + 8 * s, (it / STAGES) & 1);
        // tiles of one length (g.full_blocks, set for every call unless MOE_SM90_FULL_BLOCKS=0): the second
        // m64 block issues its MMAs also when its rows all lie past the expert's end (never stored), so the
        // tile of an expert's last few rows takes as long as the others and the tiles that share its W
        // block stay in phase: faster, with fewer DRAM reads, on every shape measured (ncu, the gate/up kernel
        // alone; bench/RESULTS.md, "the fused gate/up kernel, wide tiles tried").
        if (second_block || g.full_blocks)
            h_mma_step<T, 2, 2 * G_BI, 0, TRANS_B>(d, stage, stage + G_A_BYTES, false);
        else
            h_mma_step<T, 1, 2 * G_BI, 0, TRANS_B>(d, stage, stage + G_A_BYTES, false);
        wgmma_wait<1>();
        if (step > 0 && lane == 0)
            mbar_arrive(empty_bar + 8 * ((it - 1) % STAGES));
    }
    // the other warpgroup's turn: its MMAs queue behind this tile's last ones (no drain in between)
    if (local + 1 < my_tiles)
        named_arrive(1 + (1 - wg), 256);
    wgmma_wait<0>();
    if (steps > 0 && lane == 0)
        mbar_arrive(empty_bar + 8 * ((it - 1) % STAGES));
}

// The consumer warpgroups' loop of the ping-pong rows kernels: the CTA's tiles (tile_cols columns each) in
// order, warpgroup wg taking every other one (its ring position runs on over the other's k-steps).  For each of
// its own it calls tile(t, mma), where mma(d, second_block) runs g_mma_tile into d; at the end it waits for
// the warpgroup's TMA stores to have completed.  TRANS_B: g_produce's.
template <typename T, class Tile, int STAGES = G_STAGES, int TRANS_B = 1>
__device__ __forceinline__ void g_consumers(const GemmArgs &g, int tile_cols, int64_t tiles, int64_t steps,
                                            uint32_t smem_base, uint32_t full_bar, uint32_t empty_bar, Tile tile)
{
    const int wg = threadIdx.x / 128 - 1;
    const int64_t my_tiles = tiles > blockIdx.x ? (tiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
    uint32_t it = 0;
    int64_t local = 0;
    for (int64_t tile_index = blockIdx.x; tile_index < tiles; tile_index += gridDim.x, local++) {
        if ((local & 1) != wg) { // the other warpgroup's tile: its stages are not ours
            it += (uint32_t)steps;
            continue;
        }
        tile(tile_coord(g, tile_index, G_BM, tile_cols), [&](float(&d)[2][G_BI], bool second_block) {
            g_mma_tile<T, STAGES, TRANS_B>(g, d, second_block, steps, it, wg, local, my_tiles, smem_base, full_bar,
                                           empty_bar);
        });
    }
    if (threadIdx.x % 128 == 0)
        bulk_wait_all(); // the epilogue's boxes stay in use until TMA has read them
}
#endif

} // namespace moe_gpu

#endif
