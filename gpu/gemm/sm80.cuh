// The sm80 family's tiles, shared-memory layout and tile frame (start, pipeline prologue, finish), common to its
// bf16 / f16 kernel (gemm/sm80.cu) and its TF32 kernel (gemm/tf32.cu).
#ifndef LIBMOE_GPU_GEMM_SM80_CUH
#define LIBMOE_GPU_GEMM_SM80_CUH

#include <stddef.h>

#include "common/cp_async.cuh"
#include "gemm/args.cuh"
#include "gemm/epilogue.cuh"
#include "gemm/mma_sm80.cuh"

namespace moe_gpu {

// ------------------------------------------------------------------------------------------------
// The sm80 family (names TC_* / tc_*: tensor cores by mma.sync) for sm_80+ (Ampere, Ada, and Hopper when the sm90
// family cannot take a call): the bf16 / f16 kernel (gemm/sm80.cu) and the TF32 kernel (gemm/tf32.cu).
// 128 x 128 tiles, BK = 32, 4 warps (2 x 2), each warp 64 x 64 = 4 x 8 mma.sync.m16n8k16 tiles (fp32
// accumulators), operands from shared memory by ldmatrix (.trans for the operands whose tile dimension,
// not q, is contiguous), a 4-stage cp.async pipeline; two CTAs per SM (2 x 69.5 KiB of shared memory on sm_80
// and sm_90), so one's epilogue overlaps the other's MMAs.  Shared-memory tiles, 16-byte chunks XOR-swizzled
// so that the eight row addresses of an ldmatrix phase hit eight distinct bank groups (and cp.async writes
// stay conflict-free):
//   q-contiguous [128][32] (A of fwd and dX, B of fwd):   (row, chunk c) at row * 64 + (c ^ ((row >> 1) & 3)) * 16
//   i/j-contiguous [32][128] (A of dW, B of dX and dW):   (q, chunk c)   at q * 256 + (c ^ (q & 7)) * 16
// (bytes; 4 chunks of 8 elements per q-contiguous row, 16 per i/j-contiguous row).  After the reduction the
// accumulators go through an fp32 tile in shared memory (the pipeline's bytes) to the shared epilogues.
//
// bf16 dW with fused topk weights (WEIGHTED): A(n, r) = w(r) * dY[yrow(r)][n] is a product of two bf16
// values, exact in fp32 with a 16-bit significand, but not a bf16 value.  Each A fragment element is
// multiplied by its row's weight in registers and split exactly into two bf16 terms, hi = p truncated to
// bf16 (round toward zero: same sign as p, never overflows) and lo = p - hi (at most 8 significant bits, so
// exact in bf16), and every k16 step runs the MMAs twice, on hi and on lo: the sum is fl32(w * dY) times X,
// twice the MMAs, each product entering the accumulator as two terms whose magnitudes add up to its own
// (specs/DECISIONS.md, "Weighted dW on tensor cores", for the bound).  f16 dW with fused topk weights
// (WEIGHTED, T = __half) splits p into two TF32 terms instead (split_weighted_pair_tf32) and runs each k16
// half-step as two m16n8k8 TF32 MMAs per term, X's f16 fragments converted to TF32 in registers.  The weights
// of a stage's 32 rows sit in shared memory past the pipeline's bytes (the C tile's tail, free until the
// epilogue).
// ------------------------------------------------------------------------------------------------
constexpr int TC_BM = 128, TC_BN = 128, TC_BK = 32, TC_STAGES = 4, TC_THREADS = 128;
constexpr int TC_TILE_ELEMS = TC_BM * TC_BK; // one operand's stage: 8 KiB either layout
constexpr int TC_LDC = TC_BN + 8; // 8 mod 32 banks: a half-warp's float2 accumulator stores hit 32 distinct banks
constexpr size_t TC_PIPE_BYTES = (size_t)TC_STAGES * 2 * TC_TILE_ELEMS * 2;
constexpr size_t TC_C_BYTES = (size_t)TC_BM * TC_LDC * 4;
constexpr size_t TC_SMEM_BYTES = (TC_PIPE_BYTES > TC_C_BYTES ? TC_PIPE_BYTES : TC_C_BYTES) + TC_BM * 12;
static_assert(TC_BM == TC_BN && TC_BK == 32, "the swizzles and the load loops assume 128 x 128 x 32");
static_assert(TC_PIPE_BYTES + TC_STAGES * TC_BK * 4 <= TC_C_BYTES, "weighted dW: the stages' weights after the pipeline");

// Element offsets of 16-byte chunk c in the two swizzled tile layouts above.
__device__ __forceinline__ int tc_qc_offset(int row, int c) { return row * TC_BK + ((c ^ ((row >> 1) & 3)) << 3); }
__device__ __forceinline__ int tc_ic_offset(int q, int c) { return q * TC_BM + ((c ^ (q & 7)) << 3); }

// Shared by tc_gemm_kernel and tf32_gemm_kernel (the same tiles, warps and accumulator layout).
// The family's shared memory past the pipeline (which the C tile replaces after a tile's reduction): the
// per-row facts of a tile.
struct TcRowFacts {
    int64_t *a_rows;   // [TC_BM] A's source rows (fwd, dX, topk grad), then the output rows (epilogue)
    float *row_weight; // [TC_BM] the epilogue's topk weights
};
__device__ __forceinline__ TcRowFacts tc_row_facts(unsigned char *smem)
{
    int64_t *a_rows = reinterpret_cast<int64_t *>(smem + (TC_PIPE_BYTES > TC_C_BYTES ? TC_PIPE_BYTES : TC_C_BYTES));
    return TcRowFacts{a_rows, reinterpret_cast<float *>(a_rows + TC_BM)};
}

// A tile's start: the source rows of A for row-tiled ops (a_rows), zeroed accumulators; returns the length of
// the reduction.
template <int OP>
__device__ __forceinline__ int64_t tc_start_tile(const GemmArgs &g, const TileCoord &t, int64_t *a_rows,
                                                 float (&acc)[4][8][4])
{
    if (OP != OP_DW) {
        for (int i = threadIdx.x; i < TC_BM; i += TC_THREADS)
            a_rows[i] = a_source_row(g, t, t.i0 + i, OP == OP_DX);
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < 4; u++)
#pragma unroll
        for (int v = 0; v < 8; v++)
#pragma unroll
            for (int x = 0; x < 4; x++)
                acc[u][v][x] = 0.0f;
    return reduction_length(g, t.e);
}

// The pipeline's prologue: steps 0 .. TC_STAGES - 2 in flight (load_stage(s) issues step s into its slot, s),
// one cp.async group each, empty past the reduction.
template <typename LoadStage>
__device__ __forceinline__ void tc_prologue(int64_t steps, LoadStage load_stage)
{
#pragma unroll
    for (int s = 0; s < TC_STAGES - 1; s++) {
        if (s < steps)
            load_stage(s);
        cp_async_commit();
    }
}

// A tile's end: once every cp.async landed, the warp's 64 x 64 accumulators (m16n8 tile (u, v): rows
// wi0 + 16u + lane / 4 (+ 8 for x = 2, 3), columns wj0 + 8v + 2 (lane % 4) + {0, 1}) go to the fp32 C tile that
// replaces the pipeline's bytes, and the epilogue writes it out.
template <int OP>
__device__ __forceinline__ void tc_finish_tile(const GemmArgs &g, const TileCoord &t, const float (&acc)[4][8][4],
                                               float *tile_c, const TcRowFacts &facts, int wi0, int wj0)
{
    const int lane = threadIdx.x % 32;
    cp_async_wait<0>();
    __syncthreads(); // the pipeline's bytes become the C tile
#pragma unroll
    for (int u = 0; u < 4; u++)
#pragma unroll
        for (int v = 0; v < 8; v++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float *c = tile_c + (wi0 + 16 * u + lane / 4 + 8 * h) * TC_LDC + wj0 + 8 * v + 2 * (lane % 4);
                *reinterpret_cast<float2 *>(c) = make_float2(acc[u][v][2 * h], acc[u][v][2 * h + 1]);
            }
    __syncthreads();
    if (OP == OP_TOPK_GRAD)
        epilogue<TC_BM, TC_BN, TC_LDC>(g, t, tile_c);
    else
        epilogue_vectorised<TC_BM, TC_BN, TC_LDC>(g, t, tile_c, facts.a_rows, facts.row_weight);
    __syncthreads();
}

} // namespace moe_gpu

#endif
