"""The grouped GEMM of an MoE layer (SEMANTICS section 2) as a differentiable function on torch tensors."""
from . import _ops
from ._tensors import check_devices


def grouped_gemm(x, w, m_sizes, gather_indices=None, topk=1, *, permute_x=False, permute_y=False,
                 topk_weights=None, allow_tf32=False):
    """Y = the grouped GEMM of x and w, differentiable in x, w and topk_weights.

    x              [T, K] (token order) with permute_x, else [M, K] (expert order); M = T * topk
    w              [E, N, K], the experts' weights; x and w share one dtype (float32, float16, bfloat16)
    m_sizes        [E] int64, rows per expert (summing to M; checked by the library, on the device for CUDA)
    gather_indices [M] int64, expert-order row r holds slot gather_indices[r] (routing_from_topk makes it);
                   required with permute_x, permute_y or topk_weights
    topk           experts per token (k)
    permute_x      gather x's rows on load (x is token order)
    permute_y      scatter Y's rows to slot order on store (Y[g_r] = row r)
    topk_weights   [M] slot order, the dtype of x: row r is scaled by topk_weights[g_r] before the single
                   rounding
    allow_tf32     CUDA, float32: TF32 tensor cores
    Returns Y [M, N] (expert order, or slot order with permute_y).

    Backward: one moe_gemm_bwd call gives dX, dW and the topk-weight gradient, computing only what
    requires_grad asks for (dx_only / dw_only).  With permute_x the library sums each token's k slot rows
    of dX (reduce_topk) in float32 before rounding, so x's gradient has x's shape [T, K].
    CPU tensors run the reference, CUDA tensors the kernels on torch.cuda.current_stream(), without
    host synchronisation: a routing whose contents are wrong is reported by libmoe.synchronize()."""
    check_devices("libmoe.grouped_gemm", x=x, w=w, m_sizes=m_sizes, gather_indices=gather_indices,
                  topk_weights=topk_weights)
    return _ops.gemm_apply(x, w, m_sizes, gather_indices, topk_weights, int(topk), bool(permute_x),
                           bool(permute_y), bool(allow_tf32))
