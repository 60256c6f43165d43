"""The FP8 grouped GEMM with autograd, as DeepSeek-V3 trains its expert GEMMs (specs/FP8.md): every product of the
forward and the backward on FP8 codes, the quantization inside.

    forward   Y  = grouped_gemm_fp8(rows(x), blocks(w))
    dX        dX = grouped_gemm_fp8_dx(rows(dY), blocks(w))        (the forward's W codes and scales; on CUDA
                                                                   transposed, w_transposed: the same bits)
    dW        dW = grouped_gemm_fp8_dw(columns(x), columns(dY))    (128 x 1 tiles along each expert's rows)

rows: quantize_fp8_rows (1 x 128 tiles), blocks: quantize_fp8_blocks (128 x 128), columns: quantize_fp8_columns.
Each is one of fp8.py's calls, so the results are theirs bit for bit; nothing differentiates through the
quantization (the straight-through rule: the gradient of the quantized product is taken as the product's)."""
import torch

from . import fp8 as _fp8
from ._tensors import check_devices

_FN = "libmoe.grouped_gemm_fp8_train"


class _Fp8GemmFunction(torch.autograd.Function):  # pylint: disable=abstract-method
    """The forward's quantized operands saved: x (its columns for dW) and W's codes and scales (dX)."""

    @staticmethod
    def forward(ctx, x, w, m_sizes, gather_indices, topk, permute_x, permute_y, fmt, grad_fmt, scale_format,
                codes_transposed):  # pylint: disable=arguments-differ
        xq, xs = _fp8.quantize_fp8_rows(x, fmt, scale_format)
        wq, ws = _fp8.quantize_fp8_blocks(w, fmt, scale_format)
        y = _fp8.grouped_gemm_fp8(xq, xs, wq, ws, m_sizes, gather_indices, topk, permute_x=permute_x,
                                  permute_y=permute_y, fp8=fmt, out_dtype=x.dtype)
        ctx.save_for_backward(x, wq, ws, m_sizes, gather_indices)
        ctx.args = (w.dtype, topk, permute_x, permute_y, fmt, grad_fmt, scale_format, codes_transposed)
        return y

    @staticmethod
    def backward(ctx, dy):  # pylint: disable=arguments-differ
        x, wq, ws, m_sizes, gather_indices = ctx.saved_tensors
        w_dtype, topk, permute_x, permute_y, fmt, grad_fmt, scale_format, codes_transposed = ctx.args
        dy = dy.contiguous()
        dx = dw = None
        if ctx.needs_input_grad[0]:
            dyq, dys = _fp8.quantize_fp8_rows(dy, grad_fmt, scale_format)
            # on CUDA from W^T (the forward's codes and scales transposed): the same bits, and on sm_90a the
            # kernel transposes no W tile (grouped_gemm_fp8_dx's w_transposed)
            w_t = wq.device.type == "cuda"
            dx = _fp8.grouped_gemm_fp8_dx(dyq, dys, wq.transpose(1, 2).contiguous() if w_t else wq,
                                          ws.transpose(1, 2).contiguous() if w_t else ws, m_sizes, gather_indices,
                                          topk, permute_x=permute_x, permute_y=permute_y, reduce_topk=permute_x,
                                          fp8=grad_fmt, w_fp8=fmt, out_dtype=x.dtype, w_transposed=w_t)
        if ctx.needs_input_grad[1]:
            xc, xcs = _fp8.quantize_fp8_columns(x, m_sizes, gather_indices, topk,
                                                rows="token" if permute_x else "expert", fp8=fmt,
                                                scale_format=scale_format, transposed=codes_transposed)
            dyc, dycs = _fp8.quantize_fp8_columns(dy, m_sizes, gather_indices, topk,
                                                  rows="slot" if permute_y else "expert", fp8=grad_fmt,
                                                  scale_format=scale_format, transposed=codes_transposed)
            dw = _fp8.grouped_gemm_fp8_dw(xc, xcs, dyc, dycs, m_sizes, fp8=grad_fmt, x_fp8=fmt, out_dtype=w_dtype,
                                          codes_transposed=codes_transposed)
        return dx, dw, None, None, None, None, None, None, None, None, None


def grouped_gemm_fp8_train(x, w, m_sizes, gather_indices=None, topk=1, *, permute_x=False, permute_y=False,
                           fp8="e4m3", grad_fp8=None, scale_format="f32", codes_transposed=False):
    """Y = the grouped GEMM of x and w with every product on FP8 codes (DeepSeek-V3's recipe), differentiable in
    x and w.

    x              float32 or bfloat16, [T, K] (token order) with permute_x, else [M, K] (expert order)
    w              float32 or bfloat16 [E, N, K]
    m_sizes, gather_indices, topk, permute_x, permute_y   as for grouped_gemm (gather_indices required with
                   permute_x or permute_y)
    fp8            x's and w's codes, "e4m3" (default) or "e5m2"
    grad_fp8       dY's codes in the backward (default: fp8; "e5m2" is the older hybrid recipe)
    scale_format   "f32" or "ue8m0", for every operand
    codes_transposed   dW's operands quantized transposed (quantize_fp8_columns(..., transposed=True)): the same
                   result, the form Hopper's FP8 tensor cores read
    Forward: x per 1 x 128 tile (quantize_fp8_rows), w per 128 x 128 block (quantize_fp8_blocks), Y =
    grouped_gemm_fp8 of them in x's dtype, [M, N] (slot order with permute_y).  Backward, only the gradients
    requires_grad asks for: dY per 1 x 128 tile and the forward's W codes give dX (grouped_gemm_fp8_dx; with
    permute_x each token's k rows summed, reduce_topk, so dX has x's shape), in x's dtype; x and dY per 128 x 1
    tile along each expert's rows (quantize_fp8_columns) give dW (grouped_gemm_fp8_dw), in w's dtype.  Saves x and
    W's codes and scales.  The routing weights are not fused (grouped_gemm_fp8's topk_weights would enter the
    quantized product): multiply Y's rows by them in torch, which differentiates that product itself.  Not a
    registered custom op: torch.compile breaks the graph here.  A NaN or Inf in x, w
    or dY raises MoeError (CUDA tensors: from libmoe.synchronize())."""
    check_devices(_FN, x=x, w=w, m_sizes=m_sizes, gather_indices=gather_indices)
    if (permute_x or permute_y) and gather_indices is None:
        raise ValueError("%s: gather_indices is required with permute_x or permute_y" % _FN)
    for name, t in (("x", x), ("w", w)):   # tensors (check_devices)
        if t.dtype not in _fp8.WIDE_DTYPES:
            raise TypeError("%s: %s has dtype %s, expected torch.float32 or torch.bfloat16" % (_FN, name, t.dtype))
    if x.dim() != 2 or w.dim() != 3 or x.shape[1] != w.shape[2]:
        raise ValueError("%s: x has shape %s and w %s, expected (rows, K) and (E, N, K)" % (
            _FN, tuple(x.shape), tuple(w.shape)))
    grad_fp8 = grad_fp8 if grad_fp8 is not None else fp8
    _fp8._choice(_FN, "fp8", fp8, _fp8.FP8_FORMATS)  # pylint: disable=protected-access
    _fp8._choice(_FN, "grad_fp8", grad_fp8, _fp8.FP8_FORMATS)  # pylint: disable=protected-access
    _fp8._choice(_FN, "scale_format", scale_format, _fp8.SCALE_FORMATS)  # pylint: disable=protected-access
    return _Fp8GemmFunction.apply(x.contiguous(), w.contiguous(), m_sizes, gather_indices, int(topk), bool(permute_x),
                                  bool(permute_y), fp8, grad_fp8, scale_format, bool(codes_transposed))
