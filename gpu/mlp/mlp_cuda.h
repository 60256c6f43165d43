/*
 * CUDA blockwise MoE MLP (gpu/mlp/mlp.cu): the launchers behind moe_mlp_fwd / moe_mlp_bwd with
 * MOE_BACKEND_CUDA (the rows mlp_fwd and mlp_bwd of gpu/cuda_backend.cu's table).
 *
 * Contract (besides moe_backend.h's):
 *   - Every pointer (tensors and the layout arrays in p) is a device pointer; the work is queued on
 *     p->stream (a cudaStream_t, NULL = the default stream) and the call returns without waiting.
 *   - The front end has checked options, dimensions, pointers and overlaps.  The layout's contents
 *     (block_to_expert and token ids in range, each (token, expert) pair at most once, each token at most
 *     once with tensor_update_overwrite) are checked on the device first; on a violation every later
 *     kernel of the call does nothing (no output byte is written) and the error is reported by
 *     moe_backend_synchronize(MOE_BACKEND_CUDA, stream) (moe_cuda_mlp_take_error).
 *   - Outputs as the reference (specs/MLP.md): out, d_hidden, d_affinities and both checkpoints are
 *     overwritten in full (padding positions / untouched rows / pairs outside the layout +0); d_w_gu,
 *     d_w_d, d_b_gu, d_b_d are overwritten, or with p->accumulate become round(old + sum).
 *   - Deterministic: no float atomics; every sum has an order fixed by the layout (see gpu/mlp/mlp.cu).
 *   - p->round_intermediates (f16/bf16 only) selects the rows path: the second-stage GEMM operands are
 *     rounded to the dtype (specs/MLP.md, "Rounded intermediates") and every GEMM runs on the grouped
 *     GEMM's kernels (moe_cuda_rows_gemm).  bf16 without it takes the rows path on split operands (the
 *     float32 operands as exact bf16 terms; specs/MLP.md, "Split operands on the GPU"); f16 and f32
 *     without it take the float32-intermediate tile path.
 */
#ifndef LIBMOE_MLP_CUDA_H
#define LIBMOE_MLP_CUDA_H

#include "moe_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

moe_status moe_cuda_mlp_fwd(const moe_mlp_problem *p, const void *hidden, const void *affinities,
                            const void *w_gu, const void *w_d, const void *b_gu, const void *b_d, void *out,
                            void *gate_up_ckpt_T, void *down_ckpt);
moe_status moe_cuda_mlp_bwd(const moe_mlp_problem *p, const void *hidden, const void *affinities,
                            const void *w_gu, const void *w_d, const void *b_d, const void *gate_up_ckpt_T,
                            const void *down_ckpt, const void *out_grad, void *d_hidden, void *d_affinities,
                            void *d_w_gu, void *d_w_d, void *d_b_gu, void *d_b_d);

/* After the stream has been synchronised: the first layout error the MLP kernels detected since the
 * previous call (then forgotten), as a status with its message; MOE_OK if none. */
moe_status moe_cuda_mlp_take_error(void);

#ifdef __cplusplus
}
#endif

#endif /* LIBMOE_MLP_CUDA_H */
