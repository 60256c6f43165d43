// The TMA-store epilogue of one consumer warp (wgmma's m64 accumulator layout, 16 rows of a tile): its values
// rounded into swizzled 1 KiB boxes of shared memory and written by TMA stores.  Users: the 128 x 256 GEMM kernel
// (gemm/sm90.cu, g.tma_out) and the FP8 Hopper kernel (gemm/fp8_sm90.cu, g.tma_out).
#ifndef LIBMOE_GPU_GEMM_TMA_STORE_CUH
#define LIBMOE_GPU_GEMM_TMA_STORE_CUH

#include "gemm/epilogue.cuh"
#include "gemm/sm90.cuh"

namespace moe_gpu {

#ifdef MOE_SM90A_DEVICE
// The shared-memory boxes a consumer warp writes its TMA-stored output through: its own H_EPI_BOXES boxes of
// the epilogue area, and while the warp holds the stage of its tile's last k-step (gemm/sm90.cu's consumer loop),
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
#endif

} // namespace moe_gpu

#endif
