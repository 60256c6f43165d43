// The MLP forward's gate/up GEMM with the activation in its epilogue (sm_90a), on the rows ping-pong schedule
// (gpu/gemm/pingpong_rows.cuh), and its entry moe_cuda_rows_gate_gemm (contract in gpu/mlp/gate_sm90.cuh).
//
// Unfused, the rows path writes the gate/up GEMM's fp32 rows [rows][2I] (805 MB at Qwen3-30B-A3B,
// T = 16384) and gate_act_kernel reads them back to form m and the transposed checkpoint (~830 us, memory
// bound at 1.76 TB/s).  Here a tile's 128 wgmma columns are the gate columns i0 .. i0 + 63 of W_gu and the
// up columns I + i0 .. I + i0 + 63 (two TMA boxes of the dX-form W map), so a consumer thread holds g and u
// of the same (row, i), and its epilogue writes m and the checkpoint directly:
//   - m: rounded into a 64 x 64 box per m64 block (as the wide dW epilogue, stmatrix) and stored by TMA
//     through maps.m_rows; an m64 block with rows past the expert's last row stores element pairs instead
//     (the rows after it belong to the next expert);
//   - the checkpoint gate_up_ckpt_T [n][2I][B] (slot-minor): stmatrix .trans writes the block's 64 rows x 64
//     columns transposed into two boxes [64 i][64 b] (gate, up; 128-byte swizzle) stored by TMA through
//     maps.ckpt, a 2-D view [n 2I][B], when the block's rows are the consecutive positions p .. p + n - 1
//     of one layout block with p % B + 64 <= B and p % 8 == 0 (then the box's positions after the last row
//     are padding of the same block, written +0: every real position of a block is a row of its expert, and
//     the rows of a block are consecutive in position order); otherwise (blocks of fewer than 64 positions,
//     dropping layouts with padding inside a block, shuffled slots, the last column tile when 64 does not
//     divide I) 2-byte stores.  p % 8: a TMA store whose innermost start coordinate is not 16-byte aligned
//     faults ("illegal instruction" at UTMASTG, found with shuffled layouts of test_gpu_mlp;
//     bench/RESULTS.md, "the MLP forward's gate/up GEMM with its activation fused"); dropless layouts start
//     every box at slot 0 or 64;
//   - the unscaled copy m0 (ON_I with a down checkpoint, which is computed from it): element pairs.
// The bias, clamps, activation and affinity scale are gate_act_kernel's expressions (gpu/common/act.cuh), in
// its order, so the results are its bits.
//
// Schedule: the dW ping-pong kernel's (gpu/gemm/sm90_dw_pingpong.cu): each consumer warpgroup owns whole 128 x 128 tiles
// (two m64n128 blocks), the CTA's tiles alternate between the two, and an ordering barrier lets a
// warpgroup start its MMAs only once the other has issued the previous tile's, so one warpgroup's
// epilogue (the activation's math and its stores) runs while the other's MMAs do.  Tried and slower: the
// activation in the 128 x 256 kernel's epilogue, where the tensor cores waited for it, with 2-byte transposed
// stores from registers (bench/RESULTS.md, "MLP forward: activation fused into the gate/up GEMM's epilogue");
// and 128 x 128 i tiles with m64n256 MMAs, both warpgroups on one tile (branch wip/gate-wide): its MMAs alone
// were faster than this kernel's (bound by the L2: a third more bytes per MMA here), but the activation, no
// longer hidden behind MMAs, cost more than that; it won only on a shape that runs unfused.  So the activation's
// math needs warps of its own beside 128 x 256 MMAs (bench/RESULTS.md, "the fused gate/up kernel, wide tiles tried").
//   Ring: G_STAGES stages of 32 KiB (the tile's 128 hidden rows {64 k, 128 rows}, K-major; W_gu's two
//   {64 c, 64 n} boxes, MN-major), filled by producer thread 0 in tile order.
//   Epilogue area: per warpgroup, per m64 block, three 8 KiB boxes (m, gate, up).  A warpgroup's thread 0
//   waits for the previous tile's TMA stores to have read them before the warpgroup writes them again.
//   Named barriers: 1 + w, warpgroup w's turn for MMAs; 3 + w, warpgroup w alone.
// Each output element is computed by one thread in a fixed order: bitwise reproducible.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/act.cuh"
#include "common/cuda_check.cuh"
#include "common/launch.cuh"
#include "gemm/heuristics.cuh"
#include "gemm/pingpong_rows.cuh"
#include "gemm/rows.cuh"
#include "mlp/gate_sm90.cuh"

namespace moe_gpu {
namespace {

struct GateMaps {
    CUtensorMap rows_a; // the hidden rows [rows][H], box {64 k, 128 rows}
    CUtensorMap w;      // W_gu [E][H][2I], box {64 c, 64 n, 1}
    CUtensorMap m_rows; // m [1][rows][I], box {64 i, 64 rows, 1}
    CUtensorMap ckpt;   // gate_up_ckpt_T as [1][n 2I][B], box {64 b, 64 rows, 1} (zero when ckpt is NULL)
};

// The epilogue's parameters on the device (MoeGateEpilogue with the flags the host decided).
struct GateArgs {
    int on_i, bias, ckpt_boxes; // ckpt_boxes: maps.ckpt encoded (B % 8 == 0, aligned)
    int64_t I, B, E;
    const int64_t *row_pos, *ids;
    const void *aff, *b_gu;
    int has_nl_lo, has_nl_hi, has_lin_lo, has_lin_hi;
    float nl_lo, nl_hi, lin_lo, lin_hi;
    void *m_rows, *ckpt, *m0_rows; // m0_rows: [rows][I] unscaled m, or NULL
};

constexpr int G_EPI_OFFSET = G_STAGES * G_STAGE_BYTES;
constexpr int G_EPI_WG_BYTES = 2 * 3 * G_BOX_BYTES; // two m64 blocks x (m, gate, up)
constexpr int G_BARRIER_OFFSET = G_EPI_OFFSET + 2 * G_EPI_WG_BYTES; // full[S], empty[S]
constexpr size_t G_SMEM_BYTES = 1024 /* alignment */ + G_BARRIER_OFFSET + 2 * G_STAGES * 8;
static_assert(G_EPI_OFFSET % 1024 == 0 && G_SMEM_BYTES <= 232448, "shared memory of the fused gate/up kernel");

#ifdef MOE_SM90A_DEVICE
// A warp's 16 rows (row0 .. row0 + 15 of a 64-row block) x 64 columns of its m64 accumulators d (column
// groups 0 .. 7, the layout of h_store_box_rows), rounded to T and written transposed into a box of 64
// rows (= columns) of 64 16-bit values (= the block's rows), 128-byte swizzled: the 8 rows of a fragment
// are one 16-byte chunk, (row0 / 8 + h) ^ (column & 7).  stmatrix .trans stores each 8 x 8 fragment
// transposed: lane l addresses row l % 8 of the stored matrix l / 8, i.e. column 8 j + l % 8.
template <typename T>
__device__ __forceinline__ void g_store_box_cols(uint32_t box_addr, int row0, const float *d)
{
    const int lane = threadIdx.x % 32;
    const int m = lane / 8, k = lane % 8, chunk = row0 / 8 + (m & 1);
#pragma unroll
    for (int p = 0; p < 4; p++) {
        const int j = 2 * p + m / 2;
        const float *v = d + 8 * p;
        asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                         box_addr + (8 * j + k) * 128 + ((chunk ^ k) * 16)),
                     "r"(pack2_rn<T>(v[0], v[1])), "r"(pack2_rn<T>(v[2], v[3])), "r"(pack2_rn<T>(v[4], v[5])),
                     "r"(pack2_rn<T>(v[6], v[7]))
                     : "memory");
    }
}
#endif

#ifdef MOE_SM90A_DEVICE
// An m64 block of a tile (rows t.i0 + block0 .. + 63 of expert t.e) as a consumer thread sees it: count, its
// real rows (0 .. 64); the positions of its first and last real rows; and the thread's two rows (16 warp +
// lane / 4 + 8 h): row0, its row h = 0 in the rows GEMM (row h is row0 + 8 h), pos[h] the position (-1: past
// the expert), aff[h] the affinity (ON_I; else 1).  Lane-divergent loads: the caller reconverges the warp.
struct GateBlockRows {
    int count;
    int64_t first_pos, last_pos, row0, pos[2];
    float aff[2];
};

__device__ __forceinline__ GateBlockRows g_block_rows(const GemmArgs &g, const GateArgs &ep, const TileCoord &t,
                                                      int block0, int warp_in_wg)
{
    GateBlockRows r;
    const int64_t first = g.ws.offsets[t.e] + t.i0 + block0, left = t.rows - (t.i0 + block0);
    const int lane_row = 16 * warp_in_wg + (threadIdx.x % 32) / 4;
    r.count = left <= 0 ? 0 : left >= 64 ? 64 : (int)left;
    r.first_pos = r.count > 0 ? ep.row_pos[first] : 0;
    r.last_pos = r.count > 0 ? ep.row_pos[first + r.count - 1] : 0;
    r.row0 = first + lane_row;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        r.pos[h] = lane_row + 8 * h < r.count ? ep.row_pos[r.row0 + 8 * h] : -1;
        r.aff[h] = 1.0f;
        if (ep.on_i && r.pos[h] >= 0)
            r.aff[h] = load_as_float(g.dtype, ep.aff, ep.ids[r.pos[h]] * ep.E + t.e);
    }
    return r;
}

// The activation of one m64 block's 64 rows x 64 i (columns i0 .. i0 + 63 of expert e) in a consumer thread's
// registers.  dg, du: its 32 gate and 32 up accumulators (wgmma layout: dg[4 j + 2 h + c] is its row h,
// column i0 + 8 j + 2 (lane % 4) + c); pos[h]: the position of its row h (-1: past the expert), aff[h] that
// row's affinity (ON_I); row0: its row h = 0 in the rows GEMM (row h is row0 + 8 h).  Leaves m (scaled by the
// affinity with ON_I) in m[32] and the checkpoint's values in dg, du (the clamped gate and up; +0 on rows past
// the expert), and stores the unscaled copy m0 (ON_I with a down checkpoint) by element pairs.  PLAIN: the call
// has no bias, no clamp, the affinity on H and no m0 (launch_gate_up_act's `plain`), and those steps are compiled
// out (the epilogue's instructions are issued by the consumer warps while the other warpgroup's MMAs run, and are a
// co-bottleneck: the kernel ran faster without the activation, MOE_SM90_SKIP=128; bench/RESULTS.md,
// "the fused gate/up kernel, wide tiles tried").  The PLAIN instance ran faster than the general one on every shape
// measured (bench/RESULTS.md, "the fused gate/up kernel's PLAIN instance"); MOE_MLP_GATE_PLAIN=0 forces the general
// instance.
template <typename T, int ACT, bool PLAIN>
__device__ __forceinline__ void g_activate(const GemmArgs &g, const GateArgs &ep, int64_t e, int64_t i0, float *dg,
                                           float *du, float *m, const int64_t pos[2], const float aff[2], int64_t row0)
{
    const int q = threadIdx.x % 4;
    const int64_t I = ep.I;
    float m0_even = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int64_t i = i0 + 8 * j + 2 * q; // even
        float bg[2] = {0.0f, 0.0f}, bu[2] = {0.0f, 0.0f};
        if (!PLAIN && ep.bias && i < I) {
            bg[0] = load_as_float(g.dtype, ep.b_gu, e * 2 * I + i);
            bu[0] = load_as_float(g.dtype, ep.b_gu, e * 2 * I + I + i);
            if (i + 1 < I) {
                bg[1] = load_as_float(g.dtype, ep.b_gu, e * 2 * I + i + 1);
                bu[1] = load_as_float(g.dtype, ep.b_gu, e * 2 * I + I + i + 1);
            }
        }
#pragma unroll
        for (int c4 = 0; c4 < 4; c4++) {
            const int x = 4 * j + c4, h = c4 / 2, c = c4 & 1;
            float gv = dg[x], uv = du[x];
            if (!PLAIN) {
                if (ep.bias) {
                    gv = gv + bg[c];
                    uv = uv + bu[c];
                }
                gv = clamp_value(gv, ep.has_nl_lo, ep.nl_lo, ep.has_nl_hi, ep.nl_hi);
                uv = clamp_value(uv, ep.has_lin_lo, ep.lin_lo, ep.has_lin_hi, ep.lin_hi);
            }
            const float mv = act_value(ACT, gv) * uv;
            m[x] = !PLAIN && ep.on_i ? mv * aff[h] : mv;
            // the unscaled copy (ON_I with a down checkpoint): a pair per row, once both are known
            if (c == 0)
                m0_even = mv;
            else if (!PLAIN && ep.m0_rows != nullptr && pos[h] >= 0 && i < I)
                *reinterpret_cast<uint32_t *>(static_cast<T *>(ep.m0_rows) + (row0 + 8 * h) * I + i) =
                    pack2_rn<T>(m0_even, mv);
            // the checkpoint's values; +0 for the box's rows past the expert (padding positions)
            const bool real = pos[h] >= 0;
            dg[x] = real ? gv : 0.0f;
            du[x] = real ? uv : 0.0f;
        }
    }
    __syncwarp(); // after the lane-divergent stores of m0 (stmatrix in g_write_block is .aligned)
}

// g_activate, or (timing experiments: MOE_SM90_SKIP & 128, results wrong) m = the gate accumulators.
template <typename T, int ACT, bool PLAIN>
__device__ __forceinline__ void g_activate_or_skip(const GemmArgs &g, const GateArgs &ep, int64_t e, int64_t i0,
                                                   float *dg, float *du, float *m, const int64_t pos[2],
                                                   const float aff[2], int64_t row0)
{
    if (g.sm90_skip & 128) {
#pragma unroll
        for (int x = 0; x < 32; x++)
            m[x] = dg[x];
    } else {
        g_activate<T, ACT, PLAIN>(g, ep, e, i0, dg, du, m, pos, aff, row0);
    }
}

// Writes what g_activate left for one m64 block (columns i0 .. i0 + 63; the same pos and row0): the checkpoint
// into the block's gate and up boxes (box_m + 8 KiB, box_m + 16 KiB) when ckpt_box, else by 2-byte stores;
// m into box_m when the block has 64 rows (full), else by element pairs.  The boxes leave by g_store_boxes
// once every warp of the warpgroup has written them.
template <typename T>
__device__ __forceinline__ void g_write_block(const GemmArgs &g, const GateArgs &ep, int64_t i0, const float *dg,
                                              const float *du, const float *m, const int64_t pos[2], int64_t row0,
                                              bool ckpt_box, bool full, uint32_t box_m, int warp_in_wg)
{
    const int q = threadIdx.x % 4;
    const int64_t I = ep.I, B = ep.B;
    if (ep.ckpt != nullptr) {
        if (ckpt_box) {
            g_store_box_cols<T>(box_m + G_BOX_BYTES, 16 * warp_in_wg, dg);
            g_store_box_cols<T>(box_m + 2 * G_BOX_BYTES, 16 * warp_in_wg, du);
        } else {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                if (pos[h] < 0)
                    continue;
                const int64_t n = pos[h] / B, ckpt0 = n * 2 * I * B + (pos[h] - n * B);
#pragma unroll
                for (int j = 0; j < 8; j++)
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        const int64_t i = i0 + 8 * j + 2 * q + c;
                        if (i < I) {
                            store_from_float(g.dtype, ep.ckpt, ckpt0 + i * B, dg[4 * j + 2 * h + c]);
                            store_from_float(g.dtype, ep.ckpt, ckpt0 + (I + i) * B, du[4 * j + 2 * h + c]);
                        }
                    }
            }
        }
    }
    __syncwarp(); // after the checkpoint's per-row stores
    if (full) {
        h_store_box_rows<T>(box_m, 16 * warp_in_wg, m, 0);
    } else {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            if (pos[h] < 0)
                continue;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int64_t i = i0 + 8 * j + 2 * q;
                if (i < I) // I % 8 == 0: i + 1 < I too; the pair is 4-byte aligned
                    *reinterpret_cast<uint32_t *>(static_cast<T *>(ep.m_rows) + (row0 + 8 * h) * I + i) =
                        pack2_rn<T>(m[4 * j + 2 * h], m[4 * j + 2 * h + 1]);
            }
        }
    }
    __syncwarp(); // the per-row stores above diverge; stmatrix and the barriers after are .aligned
}

// The TMA stores (one thread) of the boxes g_write_block wrote for one m64 block: m when the block is full
// (rows m_row0 .. m_row0 + 63; the map clips columns past I), the gate and up boxes of the checkpoint when
// ckpt_box (the block's positions start at first_pos).
__device__ __forceinline__ void g_store_boxes(const GateMaps &maps, const GateArgs &ep, uint32_t box_m, int64_t i0,
                                              int64_t m_row0, bool full, bool ckpt_box, int64_t first_pos,
                                              uint64_t policy)
{
    if (full)
        tma_store_3d(&maps.m_rows, box_m, (int)i0, (int)m_row0, 0, policy);
    if (ep.ckpt != nullptr && ckpt_box) {
        const int64_t n = first_pos / ep.B, b0 = first_pos - n * ep.B;
        tma_store_3d(&maps.ckpt, box_m + G_BOX_BYTES, (int)b0, (int)(n * 2 * ep.I + i0), 0, policy);
        tma_store_3d(&maps.ckpt, box_m + 2 * G_BOX_BYTES, (int)b0, (int)(n * 2 * ep.I + ep.I + i0), 0, policy);
    }
}

// Whether the checkpoint of an m64 block (rows: its real rows, 1 .. 64; positions first_pos .. last_pos)
// and columns i0 .. i0 + 63 goes by TMA boxes (see the file header).
__device__ __forceinline__ bool g_ckpt_by_box(const GateArgs &ep, int rows, int64_t first_pos, int64_t last_pos,
                                              int64_t i0)
{
    return ep.ckpt_boxes && rows > 0 && last_pos - first_pos == rows - 1 && first_pos % ep.B + 64 <= ep.B &&
           first_pos % 8 == 0 && i0 + 64 <= ep.I;
}

#endif

template <typename T, int ACT, bool PLAIN>
__global__ void __launch_bounds__(H_THREADS, 1)
    sm90_gate_up_kernel(const GemmArgs g, const GateArgs ep, const __grid_constant__ GateMaps maps)
{
#ifdef MOE_SM90A_DEVICE
    unsigned char *smem = dynamic_smem_1k();
    const uint32_t smem_base = (uint32_t)__cvta_generic_to_shared(smem);
    const uint32_t full_bar = smem_base + G_BARRIER_OFFSET, empty_bar = full_bar + G_STAGES * 8;
    if (*g.ws.status != 0)
        return;
    h_init_pingpong_barriers<G_STAGES>(full_bar, empty_bar);
    const int64_t tiles = total_tiles(g, G_BM, G_BI); // g.cols_j = I: column tiles of 64 i
    const int64_t steps = (g.N + H_BK - 1) / H_BK;    // the reduction: H
    if (threadIdx.x < H_PRODUCERS) {
        // ------------------------------------------------------------------ producer: thread 0 alone
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(H_PRODUCER_REGS));
        if (threadIdx.x == 0)
            g_produce(g, &maps.rows_a, &maps.w, G_BI, ep.I, tiles, steps, smem_base, full_bar, empty_bar);
    } else {
        // ------------------------------------------------------------------ consumer warpgroups
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(H_CONSUMER_REGS));
        const int wg = threadIdx.x / 128 - 1, lane_in_wg = threadIdx.x % 128;
        const int warp_in_wg = lane_in_wg / 32;
        const uint32_t epi_base = smem_base + G_EPI_OFFSET + wg * G_EPI_WG_BYTES;
        const uint64_t out_policy = l2_evict_first_policy();
        g_consumers<T>(g, G_BI, tiles, steps, smem_base, full_bar, empty_bar, [&](const TileCoord &t, auto mma) {
            const int64_t base = g.ws.offsets[t.e];
            // per m64 block b: its rows (read before the MMAs so that their latency hides behind them), and
            // whether its checkpoint goes by TMA boxes
            GateBlockRows rows[2];
            bool ckpt_box[2];
#pragma unroll
            for (int b = 0; b < 2; b++) {
                rows[b] = g_block_rows(g, ep, t, 64 * b, warp_in_wg);
                ckpt_box[b] = g_ckpt_by_box(ep, rows[b].count, rows[b].first_pos, rows[b].last_pos, t.j0);
            }
            // the loads above are lane-divergent (rows past the expert, ON_I); bar.sync and wgmma are .aligned,
            // so the warp reconverges first
            __syncwarp();
            float d[2][G_BI]; // m64n128 per block: columns 0 .. 63 gate, 64 .. 127 up
            mma(d, rows[1].count > 0);
            if (g.sm90_skip & 64) // timing experiments: no epilogue (results wrong)
                return;
            // ---- epilogue: the boxes are reused one tile later: thread 0 first waits until the previous
            // tile's stores have read them
            if (lane_in_wg == 0)
                bulk_wait_read<0>();
            __syncwarp();
            named_sync(3 + wg, 128);
#pragma unroll
            for (int b = 0; b < 2; b++) {
                const GateBlockRows &r = rows[b];
                if (r.count == 0)
                    continue;
                float m[32];
                g_activate_or_skip<T, ACT, PLAIN>(g, ep, t.e, t.j0, d[b], d[b] + 32, m, r.pos, r.aff, r.row0);
                g_write_block<T>(g, ep, t.j0, d[b], d[b] + 32, m, r.pos, r.row0, ckpt_box[b], r.count == 64,
                                 epi_base + b * 3 * G_BOX_BYTES, warp_in_wg);
            }
            fence_proxy_async(); // the boxes' generic-proxy writes before the TMA (async proxy) reads them
            named_sync(3 + wg, 128);
            if (lane_in_wg == 0)
#pragma unroll
                for (int b = 0; b < 2; b++)
                    g_store_boxes(maps, ep, epi_base + b * 3 * G_BOX_BYTES, t.j0, base + t.i0 + 64 * b,
                                  rows[b].count == 64, ckpt_box[b], rows[b].first_pos, out_policy);
        });
    }
#else
    (void)g, (void)ep, (void)maps; // compiled for another target: never launched (see sm90_path_available)
#endif
}

// The fused gate/up kernel of dtype T for the activation act (moe_cuda_rows_gate_gemm); its PLAIN instance
// when plain (no bias, no clamp, not on_i, no m0_rows).
template <typename T, int ACT>
moe_status launch_gate_up_act(const GemmArgs &g, const GateArgs &ep, bool plain, const GateMaps &maps,
                              int64_t max_tiles, cudaStream_t stream)
{
    auto kernel = plain ? sm90_gate_up_kernel<T, ACT, true> : sm90_gate_up_kernel<T, ACT, false>;
    MOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)G_SMEM_BYTES));
    kernel<<<(unsigned)sm90_grid_cap((int64_t)persistent_grid(max_tiles)), H_THREADS, G_SMEM_BYTES, stream>>>(g, ep, maps);
    MOE_CUDA_CHECK(cudaGetLastError());
    return MOE_OK;
}

template <typename T>
moe_status launch_gate_up(int act, const GemmArgs &g, const GateArgs &ep, bool plain, const GateMaps &maps,
                          int64_t max_tiles, cudaStream_t stream)
{
    switch ((moe_mlp_activation)act) { // a case per row of the activation table
#define GATE_UP_CASE(value, name, forward, derivative) \
    case value: return launch_gate_up_act<T, value>(g, ep, plain, maps, max_tiles, stream);
        MOE_MLP_ACTIVATIONS(GATE_UP_CASE)
#undef GATE_UP_CASE
    }
    return moe_fail(MOE_ERR_INVALID_OPTION, "moe_mlp_fwd: activation %d has no fused gate/up kernel", act);
}

} // namespace
} // namespace moe_gpu

using namespace moe_gpu;

moe_status moe_cuda_rows_gate_gemm(const MoeRowsGemm *r, const MoeGateEpilogue *epi, int *taken)
{
    *taken = 0;
    const bool required = gate_fusion_required();
    const int64_t E = r->E, rows = r->rows, H = r->N, I = epi->I, B = epi->B, blocks = epi->num_blocks;
    const char *why = gate_fusion_refusal(r, r->op == MOE_ROWS_A_W && r->K == 2 * I, H, I, required,
                                          {epi->m_rows, epi->m0_rows});
    GateMaps maps = {};
    const uint64_t es = 2;
    if (why == NULL) {
        const uint64_t dims_a[2] = {(uint64_t)H, (uint64_t)rows}, strides_a[1] = {(uint64_t)H * es};
        const uint32_t box_a[2] = {(uint32_t)H_BK, (uint32_t)G_BM};
        const uint64_t dims_w[3] = {(uint64_t)(2 * I), (uint64_t)H, (uint64_t)E},
                       strides_w[2] = {(uint64_t)(2 * I) * es, (uint64_t)(H * 2 * I) * es};
        const uint64_t dims_m[3] = {(uint64_t)I, (uint64_t)rows, 1},
                       strides_m[2] = {(uint64_t)I * es, (uint64_t)(rows * I) * es};
        const uint32_t box_64[3] = {64, 64, 1};
        if (!encode_tensor_map(&maps.rows_a, r->dtype, r->a, 2, dims_a, strides_a, box_a) ||
            !encode_tensor_map(&maps.w, r->dtype, r->b, 3, dims_w, strides_w, box_64) ||
            !encode_tensor_map(&maps.m_rows, r->dtype, epi->m_rows, 3, dims_m, strides_m, box_64))
            why = "a tensor map was refused";
    }
    if (why != NULL)
        return required ? moe_fail(MOE_ERR_UNSUPPORTED, "%s: MOE_MLP_FUSE_GATE=1 but the fused kernel cannot take "
                                                        "this call: %s", r->name, why)
                        : MOE_OK;
    GateArgs ep = {};
    if (epi->ckpt != nullptr && B % 8 == 0 && aligned16(epi->ckpt) && blocks > 0) {
        const uint64_t dims_c[3] = {(uint64_t)B, (uint64_t)(blocks * 2 * I), 1},
                       strides_c[2] = {(uint64_t)B * es, (uint64_t)(blocks * 2 * I * B) * es};
        const uint32_t box_64[3] = {64, 64, 1};
        ep.ckpt_boxes = encode_tensor_map(&maps.ckpt, r->dtype, epi->ckpt, 3, dims_c, strides_c, box_64);
    }
    ep.on_i = epi->on_i, ep.bias = epi->bias != nullptr;
    ep.I = I, ep.B = B, ep.E = epi->num_experts;
    ep.row_pos = epi->row_pos, ep.ids = epi->ids, ep.aff = epi->affinities, ep.b_gu = epi->bias;
    ep.has_nl_lo = epi->has_nl_lo, ep.has_nl_hi = epi->has_nl_hi, ep.has_lin_lo = epi->has_lin_lo;
    ep.has_lin_hi = epi->has_lin_hi;
    ep.nl_lo = epi->nl_lo, ep.nl_hi = epi->nl_hi, ep.lin_lo = epi->lin_lo, ep.lin_hi = epi->lin_hi;
    ep.m_rows = epi->m_rows, ep.ckpt = epi->ckpt, ep.m0_rows = epi->m0_rows;
    // MOE_MLP_GATE_PLAIN=0: the general instance for every call (A/B runs)
    const bool plain = !ep.on_i && !ep.bias && !ep.has_nl_lo && !ep.has_nl_hi && !ep.has_lin_lo && !ep.has_lin_hi &&
                       ep.m0_rows == nullptr && env_switch("MOE_MLP_GATE_PLAIN") != 0;

    cudaStream_t stream = static_cast<cudaStream_t>(r->stream);
    const int64_t col_tiles = (I + G_BI - 1) / G_BI;
    *taken = 1;
    return with_tile_starts(r, col_tiles, G_BM, false, [&](int64_t *tile_start, int64_t *lone_start,
                                                                     unsigned long long *tile_counter) {
        // the dX form: out = a . W[e], reduction over N = H; column tiles of 64 i (gate and up)
        GemmArgs g = rows_gemm_args(r, OP_DX, I, tile_start, lone_start, tile_counter);
        g.out_dtype = r->dtype, g.out = nullptr;
        g.full_blocks = env_switch("MOE_SM90_FULL_BLOCKS") != 0; // tiles of one length (see the file header): always
        const int64_t max_tiles = (rows / G_BM + E) * col_tiles;
        return r->dtype == MOE_BF16 ? launch_gate_up<__nv_bfloat16>(epi->act, g, ep, plain, maps, max_tiles, stream)
                                    : launch_gate_up<__half>(epi->act, g, ep, plain, maps, max_tiles, stream);
    });
}
