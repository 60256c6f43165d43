// The launchers of the MLP's compile units, called in sequence by the forward and the backward (gpu/mlp/mlp.cu).
#ifndef LIBMOE_GPU_MLP_STEPS_CUH
#define LIBMOE_GPU_MLP_STEPS_CUH

#include <cuda_runtime.h>

#include "mlp/args.cuh"

namespace moe_gpu {

// gpu/mlp/layout_check.cu: the layout check and the expert lists (the first kernels of every call).
moe_status launch_layout(const MlpArgs &g, cudaStream_t stream);

// gpu/mlp/tile_ops.cu: the tile path's GEMM-shaped steps.
moe_status tile_path_fwd(const MlpArgs &a, bool ckpt_from_m0, cudaStream_t stream);
moe_status tile_path_dm(const MlpArgs &a, bool recompute, cudaStream_t stream);
moe_status tile_path_dx(const MlpArgs &a, cudaStream_t stream);
moe_status tile_path_dw(const MlpArgs &a, cudaStream_t stream);

// gpu/mlp/elementwise.cu (launch_token_out, token_rows: after launch_token_lists).
void launch_token_lists(const MlpArgs &g, cudaStream_t stream);
moe_status token_rows(const MlpArgs &g, const float *rows, void *dst, cudaStream_t stream);
moe_status launch_dot(const MlpArgs &g, cudaStream_t stream);
void launch_zero_padding(const MlpArgs &a, cudaStream_t stream);
void launch_down_ckpt(const MlpArgs &a, bool vec, cudaStream_t stream);
void launch_token_out(const MlpArgs &a, bool vec, int ckpt_in_token_out, cudaStream_t stream);
void launch_daff(const MlpArgs &a, int64_t cap, cudaStream_t stream);
void launch_bias_grad(const MlpArgs &a, int64_t cap, cudaStream_t stream);
void launch_rows_bias_grad(const MlpArgs &a, int64_t cap, cudaStream_t stream);

// gpu/mlp/rows_layout.cu: the rows path's rows (after launch_layout).
moe_status launch_rows_layout(const MlpArgs &g, cudaStream_t stream);

// gpu/mlp/gather.cu: dst (rows, or NULL) and dst3 (term rows, or NULL) from src's token rows (after
// launch_token_lists).
moe_status gather_rows(const MlpArgs &g, const void *src, void *dst, void *dst3, bool scale, bool dot,
                       cudaStream_t stream);

// gpu/mlp/gate_rows.cu: the rows path's gate kernels.
moe_status launch_gate_act(const MlpArgs &u, cudaStream_t stream);
moe_status launch_gate_bwd(const MlpArgs &a, cudaStream_t stream);

} // namespace moe_gpu

#endif
