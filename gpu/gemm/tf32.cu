// The sm80 family's TF32 kernel (f32 inputs with allow_tf32, every op; mma.sync m16n8k8) and its launch.
#include "common/cuda_check.cuh"
#include "gemm/plan.cuh"
#include "gemm/sm80.cuh"

namespace moe_gpu {
namespace {

// ------------------------------------------------------------------------------------------------
// TF32 path (f32 inputs with allow_tf32, fwd / dX / dW / topk grad; sm_80+): the sm80 kernel's 128 x 128
// tiles, 4 warps of 64 x 64 and 4 cp.async stages, with BK = 16 floats (the same bytes per stage) and
// mma.sync.m16n8k8 on TF32 operands (each element rounded by cvt.rna.tf32, to nearest: relative error at most
// 2^-11 per operand, which the oracle's TF32 term counts) with fp32 accumulators.  dW with fused topk weights
// (WEIGHTED) rounds fl32(w * dY) to TF32: the weight multiply is one more fp32 rounding, which the oracle
// counts as on every path.  The topk grad runs fwd's tiles and hands them to its fp32 dot with dY (epilogue).
// Operand tiles, in floats (a stage's operand takes TF_TILE_FLOATS, both layouts):
//   q-contiguous [128][16] (A of fwd, dX and topk grad, B of fwd and topk grad): element (row, q) at row * 16 + q,
//     unpadded: a quarter-warp's 16-byte reads cover rows 2r, 2r + 1 = 32 distinct banks;
//   i/j-contiguous [16][128] (A of dW, B of dX and dW): element (q, i) in row q, 4-float chunk (i / 4) ^ (2 ((q / 4) % 4))
//     (tf_ic_offset): a warp's fragment reads (q = 4t + j for t < 4, i = i0 + g for g < 8, i0 a multiple of 8) hit
//     chunks (i0 / 4 + g / 4) ^ 2t, 8 distinct ones, so 32 distinct banks; the cp.async writes stay conflict-free.
// The reduction order inside a 16-wide step is permuted the same way for both operands: lane (g = lane / 4,
// t = lane % 4) of k8 MMA s reads its k = t from q = 4t + 2s and its k = t + 4 from q = 4t + 2s + 1, so that
// one 16-byte read of a q-contiguous row (q = 4t .. 4t + 3) gives the lane its elements of both MMAs.
// ------------------------------------------------------------------------------------------------
constexpr int TF_BK = 16;
constexpr int TF_TILE_FLOATS = TF_BK * TC_BM; // either layout
constexpr size_t TF_PIPE_BYTES = (size_t)TC_STAGES * 2 * TF_TILE_FLOATS * 4;
static_assert(TF_PIPE_BYTES == TC_PIPE_BYTES,
              "the TF32 stages fit the sm80 kernel's shared memory (TC_SMEM_BYTES: pipeline or C tile, then row facts)");

__device__ __forceinline__ int tf_ic_offset(int q, int i) { return q * TC_BM + ((((i >> 2) ^ (((q >> 2) & 3) << 1))) << 2) + (i & 3); }

__device__ __forceinline__ uint32_t to_tf32(float x)
{
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}

// One k-step's operands (16 reduction rows) into stage (sa, sb), 16-byte chunks of 4 floats, 512 per operand,
// 4 per thread; zero-filled past the expert's rows, past N / K and past the reduction.  WEIGHTED (dW): also
// the stage's 16 topk weights into q_weight (0 past the reduction), as tc_load_stage does.
template <int OP, bool WEIGHTED>
__device__ __forceinline__ void tf_load_stage(const GemmArgs &g, const TileCoord &t, int64_t q0, int64_t qlen,
                                              float *sa, float *sb, const int64_t *a_rows, float *q_weight)
{
    const float *A = static_cast<const float *>(g.a);
    const float *B = static_cast<const float *>(g.b);
    if constexpr (OP == OP_DW) {
        // both [q][i]: thread tid copies chunk lane of row q = warp + 4u (u < 4); lane u of the warp looks up
        // the rows of dY and X for its q once and the warp shares them
        const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
        const int64_t base = g.ws.offsets[t.e];
        int64_t my_y = 0, my_x = 0;
        if (lane < 4 && q0 + warp + 4 * lane < qlen) {
            my_y = y_row(g, base + q0 + warp + 4 * lane);
            my_x = x_row(g, base + q0 + warp + 4 * lane);
        }
        if (WEIGHTED && lane < 4)
            q_weight[warp + 4 * lane] = q0 + warp + 4 * lane < qlen ? topk_weight(g, base + q0 + warp + 4 * lane) : 0.0f;
        const bool a_col_ok = t.i0 + lane * 4 < g.N, b_col_ok = t.j0 + lane * 4 < g.cols_j;
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int q = warp + 4 * u;
            const int64_t y = __shfl_sync(0xffffffffu, my_y, u), x = __shfl_sync(0xffffffffu, my_x, u);
            const bool q_ok = q0 + q < qlen, a_ok = q_ok && a_col_ok, b_ok = q_ok && b_col_ok;
            cp_async16(sa + tf_ic_offset(q, lane * 4), a_ok ? A + y * g.N + t.i0 + lane * 4 : A, a_ok);
            cp_async16(sb + tf_ic_offset(q, lane * 4), b_ok ? B + x * g.K + t.j0 + lane * 4 : B, b_ok);
        }
    } else {
        const int64_t lda = OP == OP_DX ? g.N : g.K;
#pragma unroll
        for (int u = 0; u < 4; u++) { // A [row i][q]: row c / 4, chunk c % 4
            const int c = threadIdx.x + u * TC_THREADS, i = c >> 2, kc = c & 3;
            const bool ok = a_rows[i] >= 0 && q0 + kc * 4 < qlen;
            cp_async16(sa + i * TF_BK + kc * 4, ok ? A + a_rows[i] * lda + q0 + kc * 4 : A, ok);
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int c = threadIdx.x + u * TC_THREADS;
            if (OP == OP_FWD || OP == OP_TOPK_GRAD) { // B [n][q]: W[e] rows
                const int j = c >> 2, kc = c & 3;
                const bool ok = t.j0 + j < g.cols_j && q0 + kc * 4 < qlen;
                cp_async16(sb + j * TF_BK + kc * 4, ok ? B + (t.e * g.N + t.j0 + j) * g.K + q0 + kc * 4 : B, ok);
            } else { // dX: B [q][j] = W[e][q][j]
                const int q = c >> 5, jc = c & 31;
                const bool ok = q0 + q < qlen && t.j0 + jc * 4 < g.cols_j;
                cp_async16(sb + tf_ic_offset(q, jc * 4), ok ? B + (t.e * g.N + q0 + q) * g.K + t.j0 + jc * 4 : B, ok);
            }
        }
    }
}

template <int OP, bool WEIGHTED = false>
__global__ void __launch_bounds__(TC_THREADS, 2) tf32_gemm_kernel(GemmArgs g)
{
    static_assert(!WEIGHTED || OP == OP_DW, "fused topk weights in the reduction: dW only");
    extern __shared__ __align__(128) unsigned char smem[];
    float *pipe = reinterpret_cast<float *>(smem);
    float *tile_c = reinterpret_cast<float *>(smem);
    float *stage_weights = reinterpret_cast<float *>(smem + TF_PIPE_BYTES); // WEIGHTED: [TC_STAGES][TC_BK]
    const TcRowFacts facts = tc_row_facts(smem);
    int64_t *a_rows = facts.a_rows;
    if (*g.ws.status != 0)
        return;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, gq = lane / 4, tq = lane % 4;
    const int wi0 = (warp / 2) * 64, wj0 = (warp % 2) * 64;
    constexpr bool A_QC = OP != OP_DW, B_QC = OP == OP_FWD || OP == OP_TOPK_GRAD;

    const int64_t tiles = total_tiles(g, TC_BM, TC_BN);
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const TileCoord t = tile_coord(g, tile, TC_BM, TC_BN);
        float acc[4][8][4];
        const int64_t qlen = tc_start_tile<OP>(g, t, a_rows, acc);

        const int64_t steps = (qlen + TF_BK - 1) / TF_BK;
        auto load_stage = [&](int64_t step) { // k-step `step` into its ring slot
            const int s = (int)(step % TC_STAGES);
            tf_load_stage<OP, WEIGHTED>(g, t, step * TF_BK, qlen, pipe + (2 * s) * TF_TILE_FLOATS,
                                        pipe + (2 * s + 1) * TF_TILE_FLOATS, a_rows, stage_weights + s * TC_BK);
        };
        tc_prologue(steps, load_stage);
        for (int64_t step = 0; step < steps; step++) {
            cp_async_wait<TC_STAGES - 2>();
            __syncthreads(); // this step's stage is in, and every warp is done with the slot refilled below
            if (step + TC_STAGES - 1 < steps)
                load_stage(step + TC_STAGES - 1);
            cp_async_commit();
            const int slot = (int)(step % TC_STAGES);
            const float *sa = pipe + (2 * slot) * TF_TILE_FLOATS, *sb = sa + TF_TILE_FLOATS;
            // fragments of both k8 MMAs (s = 0, 1): A a[u][s] = {(g, k t), (g + 8, k t), (g, k t + 4), (g + 8, k t + 4)}
            // of m16 block u; B b[v][s] = {(k t, n g), (k t + 4, n g)} of n8 block v; k t <-> q 4t + 2s, k t + 4 <-> 4t + 2s + 1
            uint32_t a[4][2][4], b[8][2][2];
            // WEIGHTED: the weights of this lane's q = 4t .. 4t + 3, multiplied into A (dY) in fp32 before its
            // TF32 rounding: fl32(w * dY), then cvt.rna as for any operand
            const float4 qw = WEIGHTED ? *reinterpret_cast<const float4 *>(stage_weights + slot * TC_BK + 4 * tq)
                                       : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
#pragma unroll
            for (int u = 0; u < 4; u++)
#pragma unroll
                for (int h = 0; h < 2; h++) { // rows g (h = 0) and g + 8
                    const int i = wi0 + 16 * u + gq + 8 * h;
                    float4 v;
                    if (A_QC)
                        v = *reinterpret_cast<const float4 *>(sa + i * TF_BK + 4 * tq);
                    else
                        v = make_float4(sa[tf_ic_offset(4 * tq, i)], sa[tf_ic_offset(4 * tq + 1, i)],
                                        sa[tf_ic_offset(4 * tq + 2, i)], sa[tf_ic_offset(4 * tq + 3, i)]);
                    if (WEIGHTED)
                        v.x *= qw.x, v.y *= qw.y, v.z *= qw.z, v.w *= qw.w;
                    a[u][0][h] = to_tf32(v.x), a[u][0][2 + h] = to_tf32(v.y);
                    a[u][1][h] = to_tf32(v.z), a[u][1][2 + h] = to_tf32(v.w);
                }
#pragma unroll
            for (int v = 0; v < 8; v++) {
                const int j = wj0 + 8 * v + gq;
                float4 w;
                if (B_QC)
                    w = *reinterpret_cast<const float4 *>(sb + j * TF_BK + 4 * tq);
                else
                    w = make_float4(sb[tf_ic_offset(4 * tq, j)], sb[tf_ic_offset(4 * tq + 1, j)],
                                    sb[tf_ic_offset(4 * tq + 2, j)], sb[tf_ic_offset(4 * tq + 3, j)]);
                b[v][0][0] = to_tf32(w.x), b[v][0][1] = to_tf32(w.y);
                b[v][1][0] = to_tf32(w.z), b[v][1][1] = to_tf32(w.w);
            }
#pragma unroll
            for (int s = 0; s < 2; s++)
#pragma unroll
                for (int u = 0; u < 4; u++)
#pragma unroll
                    for (int v = 0; v < 8; v++)
                        mma_m16n8k8_tf32(acc[u][v], a[u][s], b[v][s]);
        }
        tc_finish_tile<OP>(g, t, acc, tile_c, facts, wi0, wj0);
    }
}

} // namespace

moe_status launch_tf32(int op, const GemmArgs &g, int64_t max_tiles, cudaStream_t stream)
{
    return launch_sm80_family(op == OP_FWD ? tf32_gemm_kernel<OP_FWD>
                              : op == OP_DX ? tf32_gemm_kernel<OP_DX>
                              : op == OP_TOPK_GRAD ? tf32_gemm_kernel<OP_TOPK_GRAD>
                              : g.weights != nullptr ? tf32_gemm_kernel<OP_DW, true> : tf32_gemm_kernel<OP_DW>,
                              g, max_tiles, stream);
}

} // namespace moe_gpu
