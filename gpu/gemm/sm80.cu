// The sm80 family's bf16 / f16 kernel (mma.sync m16n8k16, ldmatrix, a 4-stage cp.async pipeline; every op,
// weighted dW included) and the family's launch.
#include "common/cuda_check.cuh"
#include "common/launch.cuh"
#include "gemm/plan.cuh"
#include "gemm/sm80.cuh"

namespace moe_gpu {
namespace {

// One k-step's operands into stage (sa, sb): A 128 x 32 and B 32 x 128, 512 chunks each, 4 per thread;
// chunks past the expert's rows, past N / K or past the reduction are zero-filled (never read from memory).
// All threads of the CTA call it (dW's row lookups are shared by warp shuffles).  WEIGHTED (dW): also the
// stage's 32 topk weights into q_weight (0 past the reduction), by plain shared-memory stores that the same
// barriers as the stage's tiles order.
template <typename T, int OP, bool WEIGHTED>
__device__ __forceinline__ void tc_load_stage(const GemmArgs &g, const TileCoord &t, int64_t q0, int64_t qlen,
                                              T *sa, T *sb, const int64_t *a_rows, float *q_weight)
{
    const T *A = static_cast<const T *>(g.a);
    const T *B = static_cast<const T *>(g.b);
    if constexpr (OP == OP_DW) {
        // Both operands [q][i] / [q][j]: thread tid copies chunk tid % 16 of rows q = tid / 16 + 8u (u < 4) of
        // both, the rows of dY and X of the expert's row q0 + q.  Those are 8 distinct rows per warp (u, and
        // h = lane / 16): lane 2u + h (< 8) looks them up once (under permute_x with a 64-bit division) and
        // the other lanes take them by shuffle, instead of every chunk repeating the lookup.
        const int lane = threadIdx.x % 32, ic = lane & 15;
        const int64_t base = g.ws.offsets[t.e];
        const int my_q = (threadIdx.x >> 5) * 2 + (lane & 1) + 8 * (lane >> 1); // lanes < 8: q of (u, h) = (lane / 2, lane % 2)
        int64_t my_y = 0, my_x = 0;
        if (lane < 8 && q0 + my_q < qlen) {
            my_y = y_row(g, base + q0 + my_q);
            my_x = x_row(g, base + q0 + my_q);
        }
        if (WEIGHTED && lane < 8)
            q_weight[my_q] = q0 + my_q < qlen ? topk_weight(g, base + q0 + my_q) : 0.0f;
        const bool a_col_ok = t.i0 + ic * 8 < g.N, b_col_ok = t.j0 + ic * 8 < g.cols_j;
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int q = (threadIdx.x >> 4) + 8 * u, from = 2 * u + (lane >> 4);
            const int64_t y = __shfl_sync(0xffffffffu, my_y, from), x = __shfl_sync(0xffffffffu, my_x, from);
            const bool q_ok = q0 + q < qlen, a_ok = q_ok && a_col_ok, b_ok = q_ok && b_col_ok;
            cp_async16(sa + tc_ic_offset(q, ic), a_ok ? A + y * g.N + t.i0 + ic * 8 : A, a_ok);
            cp_async16(sb + tc_ic_offset(q, ic), b_ok ? B + x * g.K + t.j0 + ic * 8 : B, b_ok);
        }
    } else {
#pragma unroll
        for (int u = 0; u < TC_BM * TC_BK / 8 / TC_THREADS; u++) { // A [row i][q]: row c / 4, chunk c % 4
            const int c = threadIdx.x + u * TC_THREADS, i = c >> 2, kc = c & 3;
            const bool ok = a_rows[i] >= 0 && q0 + kc * 8 < qlen;
            const int64_t lda = OP == OP_DX ? g.N : g.K;
            cp_async16(sa + tc_qc_offset(i, kc), ok ? A + a_rows[i] * lda + q0 + kc * 8 : A, ok);
        }
#pragma unroll
        for (int u = 0; u < TC_BN * TC_BK / 8 / TC_THREADS; u++) {
            const int c = threadIdx.x + u * TC_THREADS;
            if (OP == OP_FWD || OP == OP_TOPK_GRAD) { // B [n][q]: W[e] rows
                const int j = c >> 2, kc = c & 3;
                const bool ok = t.j0 + j < g.cols_j && q0 + kc * 8 < qlen;
                cp_async16(sb + tc_qc_offset(j, kc), ok ? B + (t.e * g.N + t.j0 + j) * g.K + q0 + kc * 8 : B, ok);
            } else { // dX: B [q][j] = W[e][q][j]
                const int q = c >> 4, jc = c & 15;
                const bool ok = q0 + q < qlen && t.j0 + jc * 8 < g.cols_j;
                cp_async16(sb + tc_ic_offset(q, jc), ok ? B + (t.e * g.N + q0 + q) * g.K + t.j0 + jc * 8 : B, ok);
            }
        }
    }
}

template <typename T, int OP, bool WEIGHTED = false>
__global__ void __launch_bounds__(TC_THREADS, 2) tc_gemm_kernel(GemmArgs g)
{
    static_assert(!WEIGHTED || OP == OP_DW, "fused topk weights in the reduction: dW only");
    extern __shared__ __align__(128) unsigned char smem[];
    T *pipe = reinterpret_cast<T *>(smem);
    float *tile_c = reinterpret_cast<float *>(smem);
    float *stage_weights = reinterpret_cast<float *>(smem + TC_PIPE_BYTES); // WEIGHTED: [TC_STAGES][TC_BK]
    const TcRowFacts facts = tc_row_facts(smem);
    int64_t *a_rows = facts.a_rows;
    if (*g.ws.status != 0)
        return;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int wi0 = (warp / 2) * 64, wj0 = (warp % 2) * 64; // this warp's 64 x 64 block of the tile
    constexpr bool A_QC = OP != OP_DW;                      // A q-contiguous (else i-contiguous)
    constexpr bool B_QC = OP == OP_FWD || OP == OP_TOPK_GRAD;
    const uint32_t pipe_addr = (uint32_t)__cvta_generic_to_shared(pipe);
    // This lane's ldmatrix row address in each fragment, as an element offset within a stage's tile, for
    // k16 half kh (0, 1) and m16 block u / n16 pair p (.trans delivers an 8 x 8 block stored as [q][i]
    // with the fragment layout of the [i][q] block, which is what the i/j-contiguous tiles need):
    //   A q-contiguous: matrices (rows 0-7, k 0-7), (8-15, k 0-7), (0-7, k 8-15), (8-15, k 8-15) = a0..a3:
    //     lane l gives row u*16 + (l & 15), chunk 2 kh + (l >> 4).
    //   A i-contiguous (.trans): the same matrices read as [q][i]: q = 16 kh + (l & 7) + 8 (l >> 4), i chunk
    //     (u*16 + 8 ((l >> 3) & 1)) / 8.
    //   B q-contiguous: matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15) = b0, b1
    //     of n8 tile 2p and of 2p + 1: lane l gives n p*16 + (l & 7) + 8 (l >> 4), chunk 2 kh + ((l >> 3) & 1).
    //   B j-contiguous (.trans): q = 16 kh + (l & 7) + 8 ((l >> 3) & 1), j chunk (p*16 + 8 (l >> 4)) / 8.
    auto a_offset = [&](int kh, int u) -> int {
        if (A_QC)
            return tc_qc_offset(wi0 + u * 16 + (lane & 15), 2 * kh + (lane >> 4));
        return tc_ic_offset(16 * kh + (lane & 7) + 8 * (lane >> 4), (wi0 + u * 16) / 8 + ((lane >> 3) & 1));
    };
    auto b_offset = [&](int kh, int p) -> int {
        if (B_QC)
            return tc_qc_offset(wj0 + p * 16 + (lane & 7) + 8 * (lane >> 4), 2 * kh + ((lane >> 3) & 1));
        return tc_ic_offset(16 * kh + (lane & 7) + 8 * ((lane >> 3) & 1), (wj0 + p * 16) / 8 + (lane >> 4));
    };

    const int64_t tiles = total_tiles(g, TC_BM, TC_BN);
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const TileCoord t = tile_coord(g, tile, TC_BM, TC_BN);
        float acc[4][8][4];
        const int64_t qlen = tc_start_tile<OP>(g, t, a_rows, acc);

        const int64_t steps = (qlen + TC_BK - 1) / TC_BK;
        auto load_stage = [&](int64_t step) { // k-step `step` into its ring slot
            const int s = (int)(step % TC_STAGES);
            tc_load_stage<T, OP, WEIGHTED>(g, t, step * TC_BK, qlen, pipe + (2 * s) * TC_TILE_ELEMS,
                                           pipe + (2 * s + 1) * TC_TILE_ELEMS, a_rows, stage_weights + s * TC_BK);
        };
        tc_prologue(steps, load_stage);
        // Fragments are double-buffered in registers: the k16 half kh + 1 (or the next step's first half) is
        // read from shared memory while the MMAs of half kh run, and the wait for the next step's stage sits
        // between the two halves, so the tensor cores have one half's MMAs queued across the barrier.
        uint32_t fa[2][4][4], fb[2][4][4];
        // WEIGHTED: the weights of this lane's four fragment rows q = 16 kh + 2 (lane % 4) + {0, 1} (+ 8)
        float fw[2][4];
        auto load_fragments = [&](int buf, int64_t step, int kh) {
            const int slot = (int)(step % TC_STAGES);
            const uint32_t sa = pipe_addr + (uint32_t)(2 * slot) * TC_TILE_ELEMS * 2;
            const uint32_t sb = sa + TC_TILE_ELEMS * 2;
#pragma unroll
            for (int u = 0; u < 4; u++)
                ldmatrix_x4<!A_QC>(fa[buf][u], sa + 2 * a_offset(kh, u));
#pragma unroll
            for (int p = 0; p < 4; p++)
                ldmatrix_x4<!B_QC>(fb[buf][p], sb + 2 * b_offset(kh, p));
            if (WEIGHTED) {
                const float *w = stage_weights + slot * TC_BK + 16 * kh + 2 * (lane % 4);
                const float2 w01 = *reinterpret_cast<const float2 *>(w), w89 = *reinterpret_cast<const float2 *>(w + 8);
                fw[buf][0] = w01.x, fw[buf][1] = w01.y, fw[buf][2] = w89.x, fw[buf][3] = w89.y;
            }
        };
        auto mma_fragments = [&](int buf) {
            if constexpr (WEIGHTED && std::is_same<T, __half>::value) {
                // f16: w * dY split into TF32 terms, two m16n8k8 TF32 MMAs per k16 half-step s (the k pair
                // 2t, 2t + 1 for s = 0 and 2t + 8, 2t + 9 for s = 1, t = lane % 4).  The reduction order inside
                // an MMA is permuted alike for A and B, as in the TF32 kernel: the lane's k = t is q = 2t + 8s
                // (the low halves of its f16 pairs) and its k = t + 4 is q = 2t + 1 + 8s (the high halves).
                // A (n, q) pairs: fa[u][2s] row g = lane / 4, fa[u][2s + 1] row g + 8; B (q, c): fb's word s.
#pragma unroll
                for (int s = 0; s < 2; s++) {
                    uint32_t b[8][2];
#pragma unroll
                    for (int v = 0; v < 8; v++) {
                        const uint32_t pair = fb[buf][v / 2][2 * (v % 2) + s];
                        const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&pair));
                        b[v][0] = __float_as_uint(f.x), b[v][1] = __float_as_uint(f.y); // f16: exact in TF32
                    }
#pragma unroll
                    for (int u = 0; u < 4; u++) {
                        uint32_t hi[4], lo[4]; // TF32 A fragments: (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4)
                        split_weighted_pair_tf32(fa[buf][u][2 * s], fw[buf][2 * s], fw[buf][2 * s + 1], hi[0], lo[0],
                                                 hi[2], lo[2]);
                        split_weighted_pair_tf32(fa[buf][u][2 * s + 1], fw[buf][2 * s], fw[buf][2 * s + 1], hi[1],
                                                 lo[1], hi[3], lo[3]);
#pragma unroll
                        for (int v = 0; v < 8; v++)
                            mma_m16n8k8_tf32(acc[u][v], hi, b[v]);
#pragma unroll
                        for (int v = 0; v < 8; v++)
                            mma_m16n8k8_tf32(acc[u][v], lo, b[v]);
                    }
                }
            } else {
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    if (WEIGHTED) { // a0, a1: k pair (fw 0, 1); a2, a3: k + 8 (fw 2, 3); the lo MMAs after the hi ones
                        uint32_t hi[4], lo[4];
#pragma unroll
                        for (int x = 0; x < 4; x++)
                            split_weighted_pair(fa[buf][u][x], fw[buf][x & 2], fw[buf][(x & 2) + 1], hi[x], lo[x]);
#pragma unroll
                        for (int v = 0; v < 8; v++)
                            mma_m16n8k16<T>(acc[u][v], hi, &fb[buf][v / 2][2 * (v % 2)]);
#pragma unroll
                        for (int v = 0; v < 8; v++)
                            mma_m16n8k16<T>(acc[u][v], lo, &fb[buf][v / 2][2 * (v % 2)]);
                    } else {
#pragma unroll
                        for (int v = 0; v < 8; v++)
                            mma_m16n8k16<T>(acc[u][v], fa[buf][u], &fb[buf][v / 2][2 * (v % 2)]);
                    }
                }
            }
        };
        static_assert(TC_BK == 32 && TC_STAGES >= 3, "two k16 halves per step; a slot to refill while two are read");
        cp_async_wait<TC_STAGES - 2>();
        __syncthreads(); // step 0's stage is in
        if (steps > 0)
            load_fragments(0, 0, 0);
        for (int64_t step = 0; step < steps; step++) {
            load_fragments(1, step, 1);
            mma_fragments(0);
            // step + 1's stage is in once at most the TC_STAGES - 3 groups committed after it are pending
            cp_async_wait<TC_STAGES - 3>();
            __syncthreads(); // ... and every warp holds its fragments of step - 1's slot, refilled here
            if (step + TC_STAGES - 1 < steps)
                load_stage(step + TC_STAGES - 1);
            cp_async_commit();
            if (step + 1 < steps)
                load_fragments(0, step + 1, 0);
            mma_fragments(1);
        }
        tc_finish_tile<OP>(g, t, acc, tile_c, facts, wi0, wj0);
    }
}

} // namespace

// Launches a kernel of the sm80 family (tc_gemm_kernel, tf32_gemm_kernel: TC_THREADS threads, TC_SMEM_BYTES of
// shared memory) persistently, as many CTAs per SM as fit.
moe_status launch_sm80_family(void (*kernel)(GemmArgs), const GemmArgs &g, int64_t max_tiles, cudaStream_t stream)
{
    MOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)TC_SMEM_BYTES));
    // the largest shared-memory carveout, so that two CTAs (2 x 70 KiB) fit on an sm_80 SM next to its L1
    MOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, (int)cudaSharedmemCarveoutMaxShared));
    int per_sm = 0;
    MOE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, TC_THREADS, TC_SMEM_BYTES));
    kernel<<<persistent_grid(max_tiles, per_sm), TC_THREADS, TC_SMEM_BYTES, stream>>>(g);
    MOE_CUDA_CHECK(cudaGetLastError());
    return MOE_OK;
}

template <typename T>
moe_status launch_tc(int op, const GemmArgs &g, int64_t max_tiles, cudaStream_t stream)
{
    auto kernel = op == OP_FWD ? tc_gemm_kernel<T, OP_FWD>
                : op == OP_DX ? tc_gemm_kernel<T, OP_DX>
                : op == OP_DW ? tc_gemm_kernel<T, OP_DW> : tc_gemm_kernel<T, OP_TOPK_GRAD>;
    if (op == OP_DW && g.weights != nullptr) // bf16: two bf16 terms; f16: two TF32 terms
        kernel = tc_gemm_kernel<T, OP_DW, true>;
    return launch_sm80_family(kernel, g, max_tiles, stream);
}

template moe_status launch_tc<__nv_bfloat16>(int op, const GemmArgs &g, int64_t max_tiles, cudaStream_t stream);
template moe_status launch_tc<__half>(int op, const GemmArgs &g, int64_t max_tiles, cudaStream_t stream);

} // namespace moe_gpu
