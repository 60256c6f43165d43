// CUDA grouped GEMM entry points (gpu/gemm_cuda.cu); same contract as the reference (moe_ref.h).
#ifndef LIBMOE_GEMM_CUDA_CUH
#define LIBMOE_GEMM_CUDA_CUH

extern "C" {
#include "moe_backend.h"
}

moe_status moe_cuda_gemm_fwd(const moe_gemm_problem *p, const void *x, const void *w,
                             const void *topk_weights, void *y);
moe_status moe_cuda_gemm_dx(const moe_gemm_problem *p, const void *dy, const void *w,
                            const void *topk_weights, void *dx);
moe_status moe_cuda_gemm_dw(const moe_gemm_problem *p, const void *x, const void *dy,
                            const void *topk_weights, void *dw);
moe_status moe_cuda_gemm_topk_weights_grad(const moe_gemm_problem *p, const void *x, const void *w,
                                           const void *dy, void *d_topk_weights);

// Internal to gpu/ (the MLP composes its GEMMs from it): a grouped GEMM whose rows are already grouped
// by expert and contiguous (expert e owns rows offsets[e] .. offsets[e+1]-1), with no routing check.
// The offsets are trusted (another kernel of the same call computed them on the device) and every
// kernel returns at once, writing nothing, while *status != 0 (the caller's device status word).
// Shapes (dense row-major, tensors 16-byte aligned for the tensor-core families):
//   MOE_ROWS_A_WT  out[rows][N] = a[rows][K] . W[e]^T      b = W [E][N][K]   (the forward's form)
//   MOE_ROWS_A_W   out[rows][K] = a[rows][N] . W[e]         b = W [E][N][K]   (the dX form)
//   MOE_ROWS_AT_B  out[e][N][K] = sum_r a[r][N]^T b[r][K]   over e's rows; +0 for an expert without rows
// a and b are of `dtype`, out of `out_dtype` (overwritten, or old + sum with accumulate).  The kernel
// family follows run_gemm's rules (MOE_CUDA_KERNEL included), except that MOE_ROWS_A_W and MOE_ROWS_A_WT
// with a short reduction and an fp32 output they overwrite may go to the ping-pong rows kernel
// (gpu/gate_sm90.cuh, rows_f32_pingpong in gemm_cuda.cu), with the same bits; deterministic.
enum MoeRowsOp { MOE_ROWS_A_WT = 0, MOE_ROWS_A_W = 1, MOE_ROWS_AT_B = 2 };
struct MoeRowsGemm {
    const char *name;       // for messages
    int op;                 // MoeRowsOp
    moe_dtype dtype, out_dtype;
    int64_t E, rows, N, K;  // rows: the extent of the row buffers (>= offsets[E])
    const int64_t *offsets; // [E+1] device
    const int *status;      // device
    const void *a, *b;
    void *out;
    int accumulate;
    void *stream;           // cudaStream_t
};
moe_status moe_cuda_rows_gemm(const MoeRowsGemm *r);

// The MLP forward's gate/up GEMM with its elementwise step fused into the epilogue (gpu/gate_sm90.cuh):
// r is the MOE_ROWS_A_W GEMM of the rows path (a = the gathered hidden rows [rows][H], b = W_gu [E][H][2I],
// N = H, K = 2I); instead of writing the fp32 gate/up rows to r->out (not touched), the kernel writes, per
// real row r (position row_pos[r] of block n = pos / B, b = pos % B, expert e), with g, u the row's two
// fp32 values of column i:
//   g' = clamp_nl(g + b_gu[e][i]), u' = clamp_lin(u + b_gu[e][I + i])   (bias optional, clamps optional)
//   m_rows[r][i] = rnd(act(g') * u' [* affinities[tok][e] with ON_I])
//   ckpt[n][i][b] = rnd(g'), ckpt[n][I + i][b] = rnd(u')               (when ckpt is not NULL)
// the operations and their order of gate_act_kernel (gpu/mlp_cuda.cu), so the results are the same bits.
//   m0_rows[r][i] = rnd(act(g') * u')                                   (when m0_rows is not NULL)
// It may also write +0 at padding positions of ckpt (their value anyway).
struct MoeGateEpilogue {
    int act;                                 // moe_mlp_activation
    int on_i;                                // scale m by the row's affinity
    int64_t I, B, num_blocks, num_experts;   // num_experts: the affinity rows' length
    const int64_t *row_pos, *ids;            // [rows], [num_blocks * B] device
    const void *affinities;                  // [T][E] (read with on_i)
    const void *bias;                        // [E][2I] or NULL
    int has_nl_lo, has_nl_hi, has_lin_lo, has_lin_hi;
    float nl_lo, nl_hi, lin_lo, lin_hi;
    void *m_rows;                            // [rows][I]
    void *ckpt;                              // [num_blocks][2I][B] or NULL
    void *m0_rows;                           // [rows][I] or NULL: the unscaled m (ON_I, down checkpoint)
};
// *taken = 1: launched (the status says whether the launch went well); *taken = 0: this call does not fit
// the fused kernel (no sm_90a device, f32, I or H not a multiple of 8, a tensor not 16-byte aligned, a
// tensor map that cannot be encoded, MOE_CUDA_KERNEL=sm80|simt or MOE_MLP_FUSE_GATE=0 in the environment)
// or would be slower there (fewer than G_FUSE_MIN_ROWS rows per expert on average): nothing was launched,
// and the caller runs moe_cuda_rows_gemm and its own elementwise kernel.  MOE_MLP_FUSE_GATE=1 makes the
// fused kernel required (for tests and timing): the size rule is skipped, and a call that does not fit the
// kernel fails with MOE_ERR_UNSUPPORTED and the reason instead.
moe_status moe_cuda_rows_gate_gemm(const MoeRowsGemm *r, const MoeGateEpilogue *epi, int *taken);

// Waits for the stream, then reports (and clears) the first routing error detected on the device.
moe_status moe_cuda_synchronize(void *stream);

#endif
