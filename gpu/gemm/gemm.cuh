// The CUDA grouped GEMM's entry points (gpu/gemm/gemm.cu; same contract as the reference, moe_ref.h) and the
// rows GEMMs the MLP composes its GEMMs from (gpu/gemm/rows.cu).
#ifndef LIBMOE_GPU_GEMM_GEMM_CUH
#define LIBMOE_GPU_GEMM_GEMM_CUH

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

// The FP8 grouped GEMM (fwd and dX: gpu/gemm/fp8.cu; dW: gpu/gemm/fp8_dw.cu; same contract as the reference,
// ref/fp8_ref.h), and the report of a bad scale its device check found (after the stream is synchronised; MOE_OK
// when none).
moe_status moe_cuda_gemm_fp8_fwd(const moe_fp8_problem *p, const moe_fp8_tensor *x, const moe_fp8_tensor *w,
                                 const float *topk_weights, void *y);
moe_status moe_cuda_gemm_fp8_dx(const moe_fp8_problem *p, const moe_fp8_tensor *dy, const moe_fp8_tensor *w,
                                const float *topk_weights, void *dx);
moe_status moe_cuda_gemm_fp8_dw(const moe_fp8_problem *p, const moe_fp8_tensor *x, const moe_fp8_tensor *dy,
                                void *dw);
moe_status moe_cuda_fp8_take_error(void);

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
// (gpu/gemm/rows_f32_sm90.cu), with the same bits; deterministic.
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

// Waits for the stream, then reports (and clears) the first routing error detected on the device
// (gpu/gemm/routing_check.cu).
moe_status moe_cuda_synchronize(void *stream);

#endif
