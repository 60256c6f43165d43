// The ping-pong rows kernel with fp32 output (sm_90a; the MLP's down GEMM and, in the backward, dM and dX) on the
// fused gate/up kernel's schedule (gemm/pingpong_rows.cuh), and rows_f32_pingpong, which takes calls for it.
#include "common/cuda_check.cuh"
#include "common/launch.cuh"
#include "gemm/heuristics.cuh"
#include "gemm/pingpong_rows.cuh"
#include "gemm/rows.cuh"

namespace moe_gpu {
namespace {

// ------------------------------------------------------------------------------------------------
// The ping-pong rows kernel with fp32 output (moe_cuda_rows_gemm, out_dtype f32, overwrite): out = a . W[e] (the dX
// form, TRANS_B = 1) or a . W[e]^T (the forward form, TRANS_B = 0; the MLP backward's dM and dX) for the rows of
// each expert, on the gate/up kernel's schedule and ring (g_produce, g_consumers, g_mma_tile) with
// tiles of 128 rows x 128 columns (the two W boxes at t.j0 and t.j0 + 64), so that one warpgroup's epilogue (64 KiB of
// fp32 per tile) runs while the other's MMAs do.  The MLP forward's down GEMM (Mr . W_d -> Dr) is this GEMM; the
// 128 x 256 kernel (sm90_gemm_kernel) runs its epilogue with both warpgroups while the tensor cores wait.  Epilogue per
// m64 block: with all 64 rows in the expert, the accumulators go into four boxes {32 columns, 64 rows} (128-byte
// swizzle) stored by TMA through maps.out, the warpgroup's thread 0 first waiting for the previous block's stores to
// have read them; an expert's last, part-filled block stores its rows by float2 (the rows after it belong to the
// next expert).
// The MMAs are the 128 x 256 kernel's k16 steps in the same order, so the results are its bits.  The epilogue is not
// wholly hidden: without epilogues (MOE_SM90_SKIP=64 here, =1 there) this kernel gains less than the 128 x 256
// kernel does, but still gains (ncu; bench/RESULTS.md, "the down GEMM on a ping-pong kernel"); with long
// reductions its MMAs and loads are the slower (R_PINGPONG_MAX_N).
struct RowsF32Maps {
    CUtensorMap rows_a; // a [rows][reduction] (dX form: N, forward form: K), box {64, 128 rows}
    CUtensorMap w;      // W [E][N][K], box {64, 64, 1}
    CUtensorMap out;    // out as [1][rows][g.cols_j] fp32 (dX form: K, forward form: N), box {32 columns, 64 rows, 1}
};
// R_* / r_*: the f32 rows kernel's tile, ring and epilogue area.
constexpr int R_BN = 2 * G_BI;                  // output columns per tile
// The ring: one stage more than the gate/up kernel's, since this epilogue area is smaller.  The loads want depth,
// not the stores: a fifth stage gained a few percent, three stages with both m64 blocks' boxes lost far more
// (ncu, the kernel alone; bench/RESULTS.md, "the down GEMM on a ping-pong kernel").
constexpr int R_STAGES = G_STAGES + 1;
constexpr int R_EPI_OFFSET = R_STAGES * G_STAGE_BYTES;
constexpr int R_EPI_WG_BYTES = 4 * G_BOX_BYTES; // one m64 block's 64 rows x 128 fp32 columns
constexpr int R_BARRIER_OFFSET = R_EPI_OFFSET + 2 * R_EPI_WG_BYTES; // full[S], empty[S]
constexpr size_t R_SMEM_BYTES = 1024 /* alignment */ + R_BARRIER_OFFSET + 2 * R_STAGES * 8;
static_assert(R_SMEM_BYTES <= 232448, "shared memory of the f32 rows kernel");

#ifdef MOE_SM90A_DEVICE
// A warp's 16 rows (16 warp_in_wg ..) of an m64 block's accumulators d (m64n128: d[4 j + 2 h + c] is row
// lane / 4 + 8 h, column 8 j + 2 (lane % 4) + c) into the four fp32 boxes at box_addr (box j / 4 holds columns
// 32 (j / 4) ..; 128-byte rows, the 16-byte chunk k of row r at k ^ (r & 7)).
__device__ __forceinline__ void r_store_box_f32(uint32_t box_addr, int warp_in_wg, const float *d)
{
    const int lane = threadIdx.x % 32, q = lane % 4;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = 16 * warp_in_wg + lane / 4 + 8 * h;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int chunk = 2 * (j % 4) + q / 2;
            sts_f32x2(box_addr + (j / 4) * G_BOX_BYTES + r * 128 + ((chunk ^ (r & 7)) * 16) + (q & 1) * 8,
                      d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
        }
    }
}

// The same rows by float2 stores into out [rows][K] (row0: the block's first row; only its first count rows,
// only columns below K).
__device__ __forceinline__ void r_store_rows_f32(float *out, int64_t K, int64_t row0, int count, int64_t j0,
                                                 int warp_in_wg, const float *d)
{
    const int lane = threadIdx.x % 32, q = lane % 4;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = 16 * warp_in_wg + lane / 4 + 8 * h;
        if (r >= count)
            continue;
        float *dst = out + (row0 + r) * K;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int64_t col = j0 + 8 * j + 2 * q; // K % 8 == 0: col + 1 < K too, 8-byte aligned
            if (col < K)
                *reinterpret_cast<float2 *>(dst + col) = make_float2(d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
        }
    }
    __syncwarp(); // the stores diverge; the barriers after are .aligned
}
#endif

template <typename T, int TRANS_B>
__global__ void __launch_bounds__(H_THREADS, 1)
    sm90_rows_f32_kernel(const GemmArgs g, const __grid_constant__ RowsF32Maps maps)
{
#ifdef MOE_SM90A_DEVICE
    unsigned char *smem = dynamic_smem_1k();
    const uint32_t smem_base = (uint32_t)__cvta_generic_to_shared(smem);
    const uint32_t full_bar = smem_base + R_BARRIER_OFFSET, empty_bar = full_bar + R_STAGES * 8;
    if (*g.ws.status != 0)
        return;
    h_init_pingpong_barriers<R_STAGES>(full_bar, empty_bar);
    const int64_t tiles = total_tiles(g, G_BM, R_BN);                // g.cols_j: the output's columns
    const int64_t steps = (reduction_length(g, 0) + H_BK - 1) / H_BK; // N (dX form) or K: every expert's
    if (threadIdx.x < H_PRODUCERS) {
        // ------------------------------------------------------------------ producer: thread 0 alone
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(H_PRODUCER_REGS));
        if (threadIdx.x == 0)
            g_produce<R_STAGES, TRANS_B>(g, &maps.rows_a, &maps.w, R_BN, G_BI, tiles, steps, smem_base, full_bar,
                                         empty_bar);
    } else {
        // ------------------------------------------------------------------ consumer warpgroups
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(H_CONSUMER_REGS));
        const int wg = threadIdx.x / 128 - 1, lane_in_wg = threadIdx.x % 128, warp_in_wg = lane_in_wg / 32;
        const uint32_t epi_base = smem_base + R_EPI_OFFSET + wg * R_EPI_WG_BYTES;
        const uint64_t out_policy = l2_evict_first_policy();
        auto tile = [&](const TileCoord &t, auto mma) {
            int count[2]; // the real rows of each m64 block
#pragma unroll
            for (int b = 0; b < 2; b++) {
                const int64_t left = t.rows - (t.i0 + 64 * b);
                count[b] = left <= 0 ? 0 : left >= 64 ? 64 : (int)left;
            }
            float d[2][G_BI];
            mma(d, count[1] > 0);
            if (g.sm90_skip & 64) // timing experiments: no epilogue (results wrong)
                return;
            const int64_t base = g.ws.offsets[t.e];
#pragma unroll
            for (int b = 0; b < 2; b++) {
                const int64_t row0 = base + t.i0 + 64 * b;
                if (count[b] == 64) {
                    if (lane_in_wg == 0)
                        bulk_wait_read<0>(); // the previous block's stores have read the boxes
                    __syncwarp();
                    named_sync(3 + wg, 128);
                    r_store_box_f32(epi_base, warp_in_wg, d[b]);
                    fence_proxy_async(); // the boxes' generic-proxy writes before the TMA (async proxy) reads them
                    named_sync(3 + wg, 128);
                    if (lane_in_wg == 0)
#pragma unroll
                        for (int k = 0; k < 4; k++)
                            if (t.j0 + 32 * k < g.cols_j)
                                tma_store_3d(&maps.out, epi_base + k * G_BOX_BYTES, (int)(t.j0 + 32 * k), (int)row0, 0,
                                             out_policy);
                } else if (count[b] > 0) {
                    r_store_rows_f32(static_cast<float *>(g.out), g.cols_j, row0, count[b], t.j0, warp_in_wg, d[b]);
                }
            }
        };
        g_consumers<T, decltype(tile), R_STAGES, TRANS_B>(g, R_BN, tiles, steps, smem_base, full_bar, empty_bar, tile);
    }
#else
    (void)g, (void)maps; // compiled for another target: never launched (see sm90_path_available)
#endif
}

} // namespace

// The ping-pong rows kernel with fp32 output (sm90_rows_f32_kernel above) for r, or *taken = 0 (r goes
// to the planned kernels): it takes the dX and forward forms with an fp32 output it overwrites and 16-bit
// operands, on sm_90a, under the fused gate/up kernel's rules (gate_fusion_refusal: long experts, N and K multiples
// of 8, 16-byte alignment), and a reduction of at most R_PINGPONG_MAX_N.  MOE_SM90_ROWS_PINGPONG=0 turns it off
// and =1 drops both size rules, as MOE_MLP_FUSE_GATE=1 does; MOE_MLP_FUSE_GATE=0 and MOE_CUDA_KERNEL=simt|sm80 turn
// it off too, so that the MLP's unfused path is the 128 x 256 kernel's (mlp-gpu-time and test_gpu_mlp compare the
// two bit for bit).
moe_status rows_f32_pingpong(const MoeRowsGemm *r, int *taken)
{
    *taken = 0;
    const int sw = env_switch("MOE_SM90_ROWS_PINGPONG");
    if (sw == 0)
        return MOE_OK;
    const bool required = sw == 1 || gate_fusion_required(), dx_form = r->op == OP_DX;
    const int64_t reduction = dx_form ? r->N : r->K, out_cols = dx_form ? r->K : r->N;
    const bool form_ok = (dx_form || r->op == OP_FWD) && r->out_dtype == MOE_F32;
    if (gate_fusion_refusal(r, form_ok, reduction, out_cols, required, {r->out}) != NULL ||
        (!required && reduction > R_PINGPONG_MAX_N))
        return MOE_OK;
    RowsF32Maps maps = {};
    const uint64_t es = 2, N = (uint64_t)r->N, K = (uint64_t)r->K, rows = (uint64_t)r->rows, E = (uint64_t)r->E;
    const uint64_t red = (uint64_t)reduction, cols = (uint64_t)out_cols;
    const uint64_t dims_a[2] = {red, rows}, strides_a[1] = {red * es};
    const uint32_t box_a[2] = {(uint32_t)H_BK, (uint32_t)G_BM};
    const uint64_t dims_w[3] = {K, N, E}, strides_w[2] = {K * es, N * K * es};
    const uint32_t box_w[3] = {64, 64, 1};
    const uint64_t dims_o[3] = {cols, rows, 1}, strides_o[2] = {cols * 4, rows * cols * 4};
    const uint32_t box_o[3] = {32, 64, 1};
    if (!encode_tensor_map(&maps.rows_a, r->dtype, r->a, 2, dims_a, strides_a, box_a) ||
        !encode_tensor_map(&maps.w, r->dtype, r->b, 3, dims_w, strides_w, box_w) ||
        !encode_tensor_map(&maps.out, MOE_F32, r->out, 3, dims_o, strides_o, box_o))
        return MOE_OK;
    *taken = 1;
    cudaStream_t stream = static_cast<cudaStream_t>(r->stream);
    const int64_t col_tiles = (out_cols + R_BN - 1) / R_BN;
    return with_tile_starts(r, col_tiles, G_BM, false, [&](int64_t *tile_start, int64_t *lone_start,
                                                            unsigned long long *tile_counter) {
        GemmArgs g = rows_gemm_args(r, r->op, out_cols, tile_start, lone_start, tile_counter);
        g.full_blocks = env_switch("MOE_SM90_FULL_BLOCKS") != 0; // tiles of one length, as the gate/up kernel's
        const int64_t max_tiles = (r->rows / G_BM + r->E) * col_tiles;
        auto kernel = r->dtype == MOE_BF16
                          ? (dx_form ? sm90_rows_f32_kernel<__nv_bfloat16, 1> : sm90_rows_f32_kernel<__nv_bfloat16, 0>)
                          : (dx_form ? sm90_rows_f32_kernel<__half, 1> : sm90_rows_f32_kernel<__half, 0>);
        MOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)R_SMEM_BYTES));
        kernel<<<(unsigned)sm90_grid_cap((int64_t)persistent_grid(max_tiles)), H_THREADS, R_SMEM_BYTES, stream>>>(g,
                                                                                                                  maps);
        MOE_CUDA_CHECK(cudaGetLastError());
        return MOE_OK;
    });
}

} // namespace moe_gpu
