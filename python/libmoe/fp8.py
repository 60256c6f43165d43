"""FP8 on torch tensors (specs/FP8.md): the DeepSeek-V3 quantizers (1 x 128 tiles, 128 x 128 blocks, and dW's
128 x 1 tiles along each expert's rows), the inverse of the first two, and the FP8 grouped GEMM forward, dX and
dW with those scales.  No autograd (fp8_train.py's grouped_gemm_fp8_train is the differentiable form): each
function is one library call on the tensors' device, CPU tensors on the reference and CUDA tensors on the kernels
(torch's current stream, without waiting; a bad value found on the device is raised by libmoe.synchronize()).

FP8 tensors are uint8 codes with their scales: float32 (scale_format "f32") or uint8 UE8M0 biased exponents
("ue8m0", scale 2^(b - 127)); the scales' dtype says which.  The codes' format is named by `fp8` ("e4m3", torch's
float8_e4m3fn, or "e5m2", torch's float8_e5m2: where torch has those dtypes, q.view(torch.float8_e4m3fn) is the
same tensor as torch sees it)."""
import ctypes
import math

import torch

from . import _capi
from ._tensors import (backend_of, check, check_devices, check_index, check_int, device_scope, moe_dtype, ptr,
                       stream_of)

FP8_FORMATS = {"e4m3": _capi.MOE_E4M3, "e5m2": _capi.MOE_E5M2}
SCALE_FORMATS = {"f32": _capi.MOE_FP8_SCALE_F32, "ue8m0": _capi.MOE_FP8_SCALE_UE8M0}
SCALE_DTYPES = {_capi.MOE_FP8_SCALE_F32: torch.float32, _capi.MOE_FP8_SCALE_UE8M0: torch.uint8}
WIDE_DTYPES = (torch.float32, torch.bfloat16)   # the quantizers' sources, the dequantizer's and the GEMM's outputs
SCALE_TENSOR_DTYPES = (torch.float32, torch.uint8)
ROW_SOURCES = {"expert": _capi.MOE_FP8_ROWS_EXPERT, "slot": _capi.MOE_FP8_ROWS_SLOT, "token": _capi.MOE_FP8_ROWS_TOKEN}


def tiles(n):
    """ceil(n / 128): the scales along a dimension of n elements."""
    return (n + _capi.MOE_FP8_TILE - 1) // _capi.MOE_FP8_TILE


def _choice(fn, name, value, table):
    if not isinstance(value, str) or value not in table:
        raise ValueError("%s: %s must be one of %s, got %r" % (fn, name, ", ".join(repr(k) for k in table), value))
    return table[value]


def _scale_format(scales):
    return _capi.MOE_FP8_SCALE_UE8M0 if scales.dtype == torch.uint8 else _capi.MOE_FP8_SCALE_F32


def _blocks_shape(fn, name, t):
    """(batches, rows, cols) of a blocks-layout tensor [R, C] or [B, R, C]."""
    if t.dim() not in (2, 3):
        raise ValueError("%s: %s has shape %s, expected (R, C) or (B, R, C)" % (fn, name, tuple(t.shape)))
    return (t.shape[0] if t.dim() == 3 else 1), t.shape[-2], t.shape[-1]


def _quantize(fn, x, fp8, scale_format, blocks):
    check_devices(fn, x=x)
    check(fn, "x", x, None, WIDE_DTYPES)
    fmt = _choice(fn, "fp8", fp8, FP8_FORMATS)
    sfmt = _choice(fn, "scale_format", scale_format, SCALE_FORMATS)
    if blocks:
        B, R, C = _blocks_shape(fn, "x", x)
        scale_shape = x.shape[:-2] + (tiles(R), tiles(C))
    else:
        if x.dim() < 1:
            raise ValueError("%s: x is a scalar, expected at least one dimension (the last is tiled)" % fn)
        C = x.shape[-1]
        R = math.prod(x.shape[:-1])
        scale_shape = x.shape[:-1] + (tiles(C),)
    device = x.device
    backend = backend_of(device)
    q = torch.empty(x.shape, dtype=torch.uint8, device=device)
    scales = torch.empty(scale_shape, dtype=SCALE_DTYPES[sfmt], device=device)
    with device_scope(device):
        if blocks:
            _capi.call("moe_quantize_fp8_blocks", backend, moe_dtype(x.dtype), B, R, C, ptr(x), fmt, sfmt, ptr(q),
                       ptr(scales), stream_of(device))
        else:
            _capi.call("moe_quantize_fp8_rows", backend, moe_dtype(x.dtype), R, C, ptr(x), fmt, sfmt, ptr(q),
                       ptr(scales), stream_of(device))
    return q, scales


def quantize_fp8_rows(x, fp8="e4m3", scale_format="f32"):
    """(q, scales) of x [..., C] (float32 or bfloat16) per 1 x 128 tile of its last dimension (activations):
    q uint8 of x's shape, scales [..., ceil(C/128)] (float32, or uint8 with scale_format "ue8m0").  Per tile,
    amax = max(|v|, 1e-4), scale = amax / max_format (448 for e4m3, 57344 for e5m2; UE8M0: the power of two
    2^ceil(log2(that))), each code the saturating round-to-nearest-even conversion of v / scale as
    moe_quantize_fp8_rows computes it.  A NaN or Inf in x raises MoeError (CUDA: from libmoe.synchronize())
    and writes nothing."""
    return _quantize("libmoe.quantize_fp8_rows", x, fp8, scale_format, False)


def quantize_fp8_blocks(w, fp8="e4m3", scale_format="f32"):
    """(q, scales) of w [R, C] or [B, R, C] per 128 x 128 block (weights: [E, N, K] serves the FP8 GEMM's
    forward and dX): q uint8 of w's shape, scales [(B,) ceil(R/128), ceil(C/128)].  The rule of
    quantize_fp8_rows, amax over the block (moe_quantize_fp8_blocks)."""
    return _quantize("libmoe.quantize_fp8_blocks", w, fp8, scale_format, True)


def dequantize_fp8(q, scales, fp8="e4m3", *, blocks=False, dtype=torch.float32):
    """decode(q) * scale in float32, rounded to `dtype` (float32 or bfloat16), of codes q and scales in the
    layout of quantize_fp8_rows (blocks=False) or quantize_fp8_blocks (blocks=True); moe_dequantize_fp8.
    A bad scale (float32: not finite and > 0; UE8M0: 255) raises MoeError (CUDA: from libmoe.synchronize())."""
    fn = "libmoe.dequantize_fp8"
    check_devices(fn, q=q, scales=scales)
    check(fn, "q", q, None, (torch.uint8,))
    fmt = _choice(fn, "fp8", fp8, FP8_FORMATS)
    if dtype not in WIDE_DTYPES:
        raise TypeError("%s: dtype %s, expected torch.float32 or torch.bfloat16" % (fn, dtype))
    if blocks:
        B, R, C = _blocks_shape(fn, "q", q)
        check(fn, "scales", scales, q.shape[:-2] + (tiles(R), tiles(C)), SCALE_TENSOR_DTYPES, q.device)
        tile_rows = _capi.MOE_FP8_TILE
    else:
        if q.dim() < 1:
            raise ValueError("%s: q is a scalar, expected at least one dimension (the last is tiled)" % fn)
        B, R, C = 1, math.prod(q.shape[:-1]), q.shape[-1]
        check(fn, "scales", scales, q.shape[:-1] + (tiles(C),), SCALE_TENSOR_DTYPES, q.device)
        tile_rows = 1
    device = q.device
    backend = backend_of(device)
    out = torch.empty(q.shape, dtype=dtype, device=device)
    with device_scope(device):
        _capi.call("moe_dequantize_fp8", backend, fmt, _scale_format(scales), tile_rows, B, R, C, ptr(q),
                   ptr(scales), moe_dtype(dtype), ptr(out), stream_of(device))
    return out


def _gemm_fp8(fn, dx, a_name, a, a_scales, w, w_scales, m_sizes, gather_indices, topk, permute_x, permute_y,
              topk_weights, reduce_topk, fp8, w_fp8, out_dtype, w_transposed=False):
    """Checks an FP8 GEMM call (a = x or dy; w is W^T [E, K, N] with w_transposed), allocates the output and
    calls the library."""
    check_devices(fn, **{a_name: a, a_name + "_scales": a_scales, "w": w, "w_scales": w_scales, "m_sizes": m_sizes,
                         "gather_indices": gather_indices, "topk_weights": topk_weights})
    check(fn, "w", w, (None, None, None), (torch.uint8,))
    device = w.device
    if w_transposed:
        E, K, N = w.shape
        check(fn, "w_scales", w_scales, (E, tiles(K), tiles(N)), SCALE_TENSOR_DTYPES, device)
    else:
        E, N, K = w.shape
        check(fn, "w_scales", w_scales, (E, tiles(N), tiles(K)), SCALE_TENSOR_DTYPES, device)
    length = N if dx else K   # the reduction
    check(fn, a_name, a, (None, length), (torch.uint8,), device)
    check(fn, a_name + "_scales", a_scales, (a.shape[0], tiles(length)), (w_scales.dtype,), device)
    check_index(fn, "m_sizes", m_sizes, (E,), device)
    check_int(fn, "topk", topk, 1)
    a_fmt = _choice(fn, "fp8", fp8, FP8_FORMATS)
    w_fmt = _choice(fn, "w_fp8", w_fp8 if w_fp8 is not None else fp8, FP8_FORMATS)
    if out_dtype not in WIDE_DTYPES:
        raise TypeError("%s: out_dtype %s, expected torch.float32 or torch.bfloat16" % (fn, out_dtype))
    M = a.shape[0] * topk if permute_x and not dx else a.shape[0]
    if M % topk:
        raise ValueError("%s: %s has %d rows, not a multiple of topk = %d" % (fn, a_name, M, topk))
    if (permute_x or permute_y or topk_weights is not None or reduce_topk) and gather_indices is None:
        raise ValueError("%s: gather_indices is required with permute_x, permute_y, topk_weights or reduce_topk" % fn)
    check_index(fn, "gather_indices", gather_indices, (M,), device, optional=True)
    check(fn, "topk_weights", topk_weights, (M,), (torch.float32,), device, optional=True)
    T = M // topk
    out_shape = (T if reduce_topk else M, K) if dx else (M, N)
    out = torch.empty(out_shape, dtype=out_dtype, device=device)
    routing = _capi.Routing(T, topk, E, ptr(m_sizes), ptr(gather_indices))
    a_t = _capi.Fp8Tensor(ptr(a), ptr(a_scales), a_fmt)
    w_t = _capi.Fp8Tensor(ptr(w), ptr(w_scales), w_fmt)
    options = _capi.Fp8Options(out_dtype=moe_dtype(out_dtype), scale_format=_scale_format(w_scales),
                               permute_x=int(permute_x), permute_y=int(permute_y), reduce_topk=int(reduce_topk),
                               stream=stream_of(device), w_transposed=int(w_transposed))
    with device_scope(device):
        _capi.call("moe_gemm_fp8_dx" if dx else "moe_gemm_fp8_fwd", backend_of(device), ctypes.byref(routing), N, K,
                   ctypes.byref(a_t), ctypes.byref(w_t), ptr(topk_weights), ptr(out), ctypes.byref(options))
    return out


def grouped_gemm_fp8(x, x_scales, w, w_scales, m_sizes, gather_indices=None, topk=1, *, permute_x=False,
                     permute_y=False, topk_weights=None, fp8="e4m3", w_fp8=None, out_dtype=torch.float32):
    """Y = the FP8 grouped GEMM forward (moe_gemm_fp8_fwd; specs/FP8.md section 2), not differentiable.

    x, x_scales    codes uint8 [M, K] (expert order), or [T, K] with permute_x; scales [rows, ceil(K/128)]
                   (quantize_fp8_rows)
    w, w_scales    codes uint8 [E, N, K]; scales [E, ceil(N/128), ceil(K/128)] (quantize_fp8_blocks), of
                   x_scales' dtype (one scale format per call)
    m_sizes, gather_indices, topk, permute_x, permute_y   as for grouped_gemm
    topk_weights   float32 [M] in slot order: row r times topk_weights[g_r] before the rounding
    fp8, w_fp8     the codes' formats, "e4m3" or "e5m2" (w_fp8 defaults to fp8)
    out_dtype      torch.float32 or torch.bfloat16
    Per 128-element tile of K the exact products are summed in float32, times the product of the tile's two
    scales, into a float32 accumulator; one rounding to out_dtype.  Returns Y [M, N] (slot order with
    permute_y).  A bad scale raises MoeError (CUDA: from libmoe.synchronize())."""
    return _gemm_fp8("libmoe.grouped_gemm_fp8", False, "x", x, x_scales, w, w_scales, m_sizes, gather_indices,
                     topk, bool(permute_x), bool(permute_y), topk_weights, False, fp8, w_fp8, out_dtype)


def grouped_gemm_fp8_dx(dy, dy_scales, w, w_scales, m_sizes, gather_indices=None, topk=1, *, permute_x=False,
                        permute_y=False, topk_weights=None, reduce_topk=False, fp8="e4m3", w_fp8=None,
                        out_dtype=torch.float32, w_transposed=False):
    """dX = dY . W[e] per expert on FP8 operands (moe_gemm_fp8_dx), the reduction over N in tiles of 128.

    dy, dy_scales  codes uint8 [M, N] (slot order with permute_y); scales [M, ceil(N/128)]
    w, w_scales    the forward's (one quantization of W serves both products); with w_transposed, W^T: codes
                   [E, K, N] and scales [E, ceil(K/128), ceil(N/128)], as quantize_fp8_blocks(W.transpose(1, 2))
                   gives them (the same codes and scales transposed; the result is the same bit for bit, and
                   on sm_90a faster: the kernel transposes no W tile)
    permute_x      dX rows in slot order; reduce_topk: dX [T, K], each token's k rows summed in float32
    The other arguments as for grouped_gemm_fp8.  Returns dX [M, K], or [T, K] with reduce_topk."""
    return _gemm_fp8("libmoe.grouped_gemm_fp8_dx", True, "dy", dy, dy_scales, w, w_scales, m_sizes,
                     gather_indices, topk, bool(permute_x), bool(permute_y), topk_weights, bool(reduce_topk), fp8,
                     w_fp8, out_dtype, bool(w_transposed))


def column_scale_rows(rows, num_experts):
    """The scale rows of a grouped_gemm_fp8_dw operand of `rows` expert-order rows and num_experts experts,
    ceil(rows / 128) + num_experts - 1 (moe_fp8_column_scale_rows): the tile of expert e beginning at expert row
    r0 has scale row r0 / 128 + e, for every routing."""
    return _capi.lib().moe_fp8_column_scale_rows(rows, num_experts)


def quantize_fp8_columns(x, m_sizes, gather_indices=None, topk=1, *, rows="expert", topk_weights=None, fp8="e4m3",
                         scale_format="f32", transposed=False):
    """(q, scales) of x per 128 x 1 tile along each expert's rows, grouped_gemm_fp8_dw's operands
    (moe_quantize_fp8_columns; specs/FP8.md, "dW").

    x              float32 or bfloat16 [rows, C]: expert row r reads row r (rows="expert", [M, C]), row g_r
                   (rows="slot", [M, C]: dY of a forward with permute_y) or row g_r / topk (rows="token", [T, C]:
                   X of a forward with permute_x)
    m_sizes, gather_indices, topk   the routing (gather_indices needed by "slot", "token" and topk_weights)
    topk_weights   float32 [M] in slot order, or None: expert row r's values times topk_weights[g_r] (float32)
                   before its tile's amax, as the forward's fused weights enter dW
    Each expert's rows are tiled from its own offset (its last tile partial); per tile of each column the rule
    of quantize_fp8_rows.  Returns q uint8 [M, C] in expert-row order and scales [column_scale_rows(M, E), C]
    (float32, or uint8 with "ue8m0"); rows no tile uses hold an empty tile's scale.  With transposed, q is
    uint8 [C, M], q[c, r] expert row r's code of column c (moe_quantize_fp8_columns_transposed: the same codes
    transposed, the same scales), what grouped_gemm_fp8_dw(..., codes_transposed=True) reads.  A NaN or Inf value
    raises MoeError and writes nothing (on CUDA tensors: raised by libmoe.synchronize(), as the routing's
    errors)."""
    fn = "libmoe.quantize_fp8_columns"
    check_devices(fn, x=x, m_sizes=m_sizes, gather_indices=gather_indices, topk_weights=topk_weights)
    check(fn, "x", x, (None, None), WIDE_DTYPES)
    device = x.device
    check_index(fn, "m_sizes", m_sizes, (None,), device)
    check_int(fn, "topk", topk, 1)
    source = _choice(fn, "rows", rows, ROW_SOURCES)
    fmt = _choice(fn, "fp8", fp8, FP8_FORMATS)
    sfmt = _choice(fn, "scale_format", scale_format, SCALE_FORMATS)
    E = m_sizes.shape[0]
    if E < 1:
        raise ValueError("%s: m_sizes is empty, expected one entry per expert" % fn)
    M = x.shape[0] * topk if source == _capi.MOE_FP8_ROWS_TOKEN else x.shape[0]
    if M % topk:
        raise ValueError("%s: x has %d rows, not a multiple of topk = %d" % (fn, M, topk))
    if (source != _capi.MOE_FP8_ROWS_EXPERT or topk_weights is not None) and gather_indices is None:
        raise ValueError("%s: gather_indices is required with rows \"slot\" or \"token\" and with topk_weights" % fn)
    check_index(fn, "gather_indices", gather_indices, (M,), device, optional=True)
    check(fn, "topk_weights", topk_weights, (M,), (torch.float32,), device, optional=True)
    C = x.shape[1]
    q = torch.empty((C, M) if transposed else (M, C), dtype=torch.uint8, device=device)
    scales = torch.empty((column_scale_rows(M, E), C), dtype=SCALE_DTYPES[sfmt], device=device)
    routing = _capi.Routing(M // topk, topk, E, ptr(m_sizes), ptr(gather_indices))
    with device_scope(device):
        _capi.call("moe_quantize_fp8_columns_transposed" if transposed else "moe_quantize_fp8_columns",
                   backend_of(device), ctypes.byref(routing), moe_dtype(x.dtype), C,
                   ptr(x), source, ptr(topk_weights), fmt, sfmt, ptr(q), ptr(scales), stream_of(device))
    return q, scales


def grouped_gemm_fp8_dw(x, x_scales, dy, dy_scales, m_sizes, *, fp8="e4m3", x_fp8=None, out_dtype=torch.float32,
                        codes_transposed=False):
    """dW[e] = sum over the rows r of expert e of dy_r^T x_r on FP8 operands (moe_gemm_fp8_dw; specs/FP8.md,
    "dW"), not differentiable.

    x, x_scales    codes uint8 [M, K] and scales [column_scale_rows(M, E), K] (quantize_fp8_columns)
    dy, dy_scales  codes uint8 [M, N] and scales [column_scale_rows(M, E), N], of x_scales' dtype
    m_sizes        int64 [E]: the rows of each expert (the operands are in expert-row order: the forward's
                   permute_x, permute_y and topk weights are quantize_fp8_columns')
    fp8, x_fp8     the codes' formats, dY's and X's ("e4m3" or "e5m2"; x_fp8 defaults to fp8)
    out_dtype      torch.float32 or torch.bfloat16
    codes_transposed   x and dy hold the codes transposed, uint8 [K, M] and [N, M] (quantize_fp8_columns(...,
                   transposed=True)), the scales as above: the same result (the reference's bit for bit), and the
                   form Hopper's FP8 tensor cores read (options.codes_transposed)
    Per tile of 128 rows of an expert the exact products are summed in float32, times the product of the
    tile's two scales, into a float32 accumulator; one rounding.  Returns dW [E, N, K]; an expert without rows
    gets zeros.  A bad scale in a tile in use raises MoeError (on CUDA tensors: raised by libmoe.synchronize())."""
    fn = "libmoe.grouped_gemm_fp8_dw"
    check_devices(fn, x=x, x_scales=x_scales, dy=dy, dy_scales=dy_scales, m_sizes=m_sizes)
    check(fn, "x", x, (None, None), (torch.uint8,))
    device = x.device
    if codes_transposed:
        K, M = x.shape
        check(fn, "dy", dy, (None, M), (torch.uint8,), device)
        N = dy.shape[0]
    else:
        M, K = x.shape
        check(fn, "dy", dy, (M, None), (torch.uint8,), device)
        N = dy.shape[1]
    check_index(fn, "m_sizes", m_sizes, (None,), device)
    E = m_sizes.shape[0]
    if E < 1:
        raise ValueError("%s: m_sizes is empty, expected one entry per expert" % fn)
    rows = column_scale_rows(M, E)
    check(fn, "x_scales", x_scales, (rows, K), SCALE_TENSOR_DTYPES, device)
    check(fn, "dy_scales", dy_scales, (rows, N), (x_scales.dtype,), device)
    dy_fmt = _choice(fn, "fp8", fp8, FP8_FORMATS)
    x_fmt = _choice(fn, "x_fp8", x_fp8 if x_fp8 is not None else fp8, FP8_FORMATS)
    if out_dtype not in WIDE_DTYPES:
        raise TypeError("%s: out_dtype %s, expected torch.float32 or torch.bfloat16" % (fn, out_dtype))
    out = torch.empty((E, N, K), dtype=out_dtype, device=device)
    routing = _capi.Routing(M, 1, E, ptr(m_sizes), None)
    x_t = _capi.Fp8Tensor(ptr(x), ptr(x_scales), x_fmt)
    dy_t = _capi.Fp8Tensor(ptr(dy), ptr(dy_scales), dy_fmt)
    options = _capi.Fp8Options(out_dtype=moe_dtype(out_dtype), scale_format=_scale_format(x_scales),
                               stream=stream_of(device), codes_transposed=int(bool(codes_transposed)))
    with device_scope(device):
        _capi.call("moe_gemm_fp8_dw", backend_of(device), ctypes.byref(routing), N, K, ctypes.byref(x_t),
                   ctypes.byref(dy_t), ptr(out), ctypes.byref(options))
    return out
