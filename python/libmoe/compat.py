"""Call-compatible entry points, so that existing code switches with one import:

    from libmoe.compat import grouped_gemm   # instead of Unsloth's grouped_gemm.interface
    from libmoe.compat import grouped_mm     # instead of torch._grouped_mm(x, w, offs)
"""
import torch

from .gemm import grouped_gemm as _grouped_gemm


def grouped_gemm(X, W, m_sizes, topk, gather_indices=None, permute_x=False, permute_y=False, topk_weights=None,
                 fuse_mul_post=False, kernel_config_fwd=None, kernel_config_bwd_dX=None, kernel_config_bwd_dW=None,
                 autotune=False, is_first_gemm=True, dX_only=False, dW_only=False):
    """Unsloth's grouped_gemm(X, W, m_sizes, topk, gather_indices, permute_x, permute_y, topk_weights,
    fuse_mul_post, ...) on libmoe.  X is viewed as (-1, K); m_sizes and gather_indices may be int32 or int64;
    W is (E, N, K).  The kernel configs, autotune and is_first_gemm choose Triton kernels in Unsloth and are
    accepted and ignored here.  dX_only / dW_only leave the other gradient out (None).

    Differences, each a superset of Unsloth's behaviour: topk_weights (applied when fuse_mul_post) are
    multiplied in float32 before the single rounding and are differentiable (Unsloth: after rounding,
    inference only); permute_x and permute_y may be combined; with permute_x the gradient of X is the
    per-token sum [num_tokens, K]."""
    del kernel_config_fwd, kernel_config_bwd_dX, kernel_config_bwd_dW, autotune, is_first_gemm
    if (permute_x or permute_y) and gather_indices is None:
        raise ValueError("libmoe.compat.grouped_gemm: gather_indices is required when permute_x or permute_y")
    if fuse_mul_post and topk_weights is None:
        raise ValueError("libmoe.compat.grouped_gemm: topk_weights is required when fuse_mul_post")
    if dX_only and dW_only:
        raise ValueError("libmoe.compat.grouped_gemm: dX_only and dW_only exclude each other")
    X = X.reshape(-1, X.shape[-1])
    m_sizes = m_sizes.reshape(-1).to(torch.int64)
    if gather_indices is not None:
        gather_indices = gather_indices.reshape(-1).to(torch.int64)
    weights = topk_weights.reshape(-1) if fuse_mul_post else None
    if dX_only:
        W = W.detach()
    if dW_only:
        X = X.detach()
    return _grouped_gemm(X, W, m_sizes, gather_indices, topk, permute_x=permute_x, permute_y=permute_y,
                         topk_weights=weights)


def grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """torch._grouped_mm's 2D x 3D form on libmoe: mat_a [M, K] (rows grouped by expert), mat_b [E, K, N],
    offs [E] (int32 or int64) the cumulative end row of each group, offs[-1] == M (checked by the library;
    on CUDA through libmoe.synchronize()).  Returns [M, N], differentiable in mat_a and mat_b.
    mat_b is read as W = mat_b.transpose(-2, -1) [E, N, K]: free when mat_b is the transpose of a contiguous
    [E, N, K] weight (the usual w.transpose(-2, -1) argument), a copy otherwise.  bias and an out_dtype
    other than mat_a's are not supported (ValueError).  Unlike torch._grouped_mm, no group size need be a
    multiple of 8 or 16."""
    if offs is None or mat_a.dim() != 2 or mat_b.dim() != 3:
        raise ValueError("libmoe.compat.grouped_mm: only the (x [M, K], w [E, K, N], offs [E]) form is supported")
    if bias is not None:
        raise ValueError("libmoe.compat.grouped_mm: bias is not supported")
    if out_dtype is not None and out_dtype != mat_a.dtype:
        raise ValueError("libmoe.compat.grouped_mm: out_dtype must be mat_a's dtype (%s)" % mat_a.dtype)
    if offs.dim() != 1 or offs.shape[0] != mat_b.shape[0]:
        raise ValueError("libmoe.compat.grouped_mm: offs must be [E] = [%d], got %s"
                         % (mat_b.shape[0], tuple(offs.shape)))
    offs = offs.to(torch.int64)
    m_sizes = torch.diff(offs, prepend=offs.new_zeros(1))
    return _grouped_gemm(mat_a, mat_b.transpose(-2, -1).contiguous(), m_sizes)
