// The MLP forward's gate/up GEMM with its activation fused into the epilogue (sm_90a): its entry for the rows
// path (gpu/mlp/mlp.cu); the kernel is in gpu/mlp/gate_sm90.cu.
#ifndef LIBMOE_GPU_MLP_GATE_SM90_CUH
#define LIBMOE_GPU_MLP_GATE_SM90_CUH

#include "gemm/gemm.cuh"

// The MLP forward's gate/up GEMM with its elementwise step fused into the epilogue (gpu/mlp/gate_sm90.cu):
// r is the MOE_ROWS_A_W GEMM of the rows path (a = the gathered hidden rows [rows][H], b = W_gu [E][H][2I],
// N = H, K = 2I); instead of writing the fp32 gate/up rows to r->out (not touched), the kernel writes, per
// real row r (position row_pos[r] of block n = pos / B, b = pos % B, expert e), with g, u the row's two
// fp32 values of column i:
//   g' = clamp_nl(g + b_gu[e][i]), u' = clamp_lin(u + b_gu[e][I + i])   (bias optional, clamps optional)
//   m_rows[r][i] = rnd(act(g') * u' [* affinities[tok][e] with ON_I])
//   ckpt[n][i][b] = rnd(g'), ckpt[n][I + i][b] = rnd(u')               (when ckpt is not NULL)
// the operations and their order of gate_act_kernel (gpu/mlp/gate_rows.cu), so the results are the same bits.
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

#endif
