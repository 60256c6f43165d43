"""The library's calls on torch tensors, without autograd: each checks its arguments (shapes, dtypes, devices,
contiguity: TypeError/ValueError naming the argument), allocates its outputs with torch, and calls the C
function on the tensors' device: MOE_BACKEND_REF on host tensors, MOE_BACKEND_CUDA on device tensors and
torch's current stream, without waiting (errors the device finds in the routing or layout contents are
reported by libmoe.synchronize()).  A failed C call raises MoeError with moe_last_error()'s text.

The signatures are what torch.library.custom_op reads (_ops.py registers these as libmoe::* ops)."""
import ctypes
import math
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import _capi
from ._tensors import (backend_of, check_float, check_index, check_int, device_scope, moe_dtype, ptr,
                       stream_of)

_EMPTY_SHAPE = (0,)
NO_CLAMPS = [math.nan] * 4   # the clamps argument of the MLP calls: NaN is an absent bound


def _empty(like):
    return like.new_empty(_EMPTY_SHAPE)


# ------------------------------------------------------------------------------------------------------
# Routing
# ------------------------------------------------------------------------------------------------------
def routing_from_topk(topk_ids: Tensor, num_experts: int) -> Tuple[Tensor, Tensor, Tensor]:
    """(m_sizes [E], gather_indices [T*k], scatter_indices [T*k]) of topk_ids [T, k] (int64), by
    moe_routing_build on the ids' device (CUDA: on the current stream, ids checked on the device)."""
    fn = "libmoe.routing_from_topk"
    check_int(fn, "num_experts", num_experts, 1)
    check_index(fn, "topk_ids", topk_ids, (None, None), None)
    device = topk_ids.device
    T, k = topk_ids.shape
    backend = backend_of(device)
    m_sizes = topk_ids.new_empty((num_experts,))
    gather = topk_ids.new_empty((T * k,))
    scatter = topk_ids.new_empty((T * k,))
    with device_scope(device):
        _capi.call("moe_routing_build", backend, T, k, num_experts, ptr(topk_ids), ptr(m_sizes), ptr(gather),
                   ptr(scatter), stream_of(device))
    return m_sizes, gather, scatter


# ------------------------------------------------------------------------------------------------------
# Grouped GEMM
# ------------------------------------------------------------------------------------------------------
def _gemm_setup(fn, x, w, m_sizes, gather_indices, topk_weights, topk, permute_x, permute_y):
    """Checks a grouped GEMM call; returns (backend, routing, M, N, K, options without stream)."""
    check_float(fn, "w", w, (None, None, None), None)
    device = w.device
    E, N, K = w.shape
    check_float(fn, "x", x, (None, K), device, dtype=w.dtype)
    check_index(fn, "m_sizes", m_sizes, (E,), device)
    check_int(fn, "topk", topk, 1)
    rows = x.shape[0]
    M = rows * topk if permute_x else rows
    if M % topk:
        raise ValueError("%s: x has %d rows, not a multiple of topk = %d" % (fn, rows, topk))
    needs_gather = permute_x or permute_y or topk_weights is not None
    if needs_gather and gather_indices is None:
        raise ValueError("%s: gather_indices is required with permute_x, permute_y or topk_weights" % fn)
    check_index(fn, "gather_indices", gather_indices, (M,), device, optional=True)
    check_float(fn, "topk_weights", topk_weights, (M,), device, dtype=w.dtype, optional=True)
    routing = _capi.Routing(M // topk, topk, E, ptr(m_sizes), ptr(gather_indices))
    options = _capi.GemmOptions(dtype=moe_dtype(w.dtype), permute_x=int(permute_x), permute_y=int(permute_y))
    options.stream = stream_of(device)
    return backend_of(device), routing, M, N, K, options


def gemm_fwd(x: Tensor, w: Tensor, m_sizes: Tensor, gather_indices: Optional[Tensor],
             topk_weights: Optional[Tensor], topk: int, permute_x: bool, permute_y: bool,
             allow_tf32: bool) -> Tensor:
    """moe_gemm_fwd: Y [M, N] of x ([T, K] with permute_x, else [M, K]) and w [E, N, K]."""
    backend, routing, M, N, K, options = _gemm_setup("libmoe.gemm_fwd", x, w, m_sizes, gather_indices,
                                                     topk_weights, topk, permute_x, permute_y)
    options.allow_tf32 = int(allow_tf32)
    y = w.new_empty((M, N))
    with device_scope(w.device):
        _capi.call("moe_gemm_fwd", backend, ctypes.byref(routing), N, K, ptr(x), ptr(w), ptr(topk_weights), ptr(y),
                   ctypes.byref(options))
    return y


def gemm_bwd(x: Tensor, w: Tensor, dy: Tensor, m_sizes: Tensor, gather_indices: Optional[Tensor],
             topk_weights: Optional[Tensor], topk: int, permute_x: bool, permute_y: bool, allow_tf32: bool,
             need_dx: bool, need_dw: bool, need_dtopk: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """The backward of gemm_fwd: (dx, dw, d_topk_weights), each an empty tensor where not asked for.
    dx has x's shape: with permute_x the library sums each token's slot rows (reduce_topk).  dX and dW come
    from one moe_gemm_bwd call (dx_only / dw_only when one is not needed); the topk-weight gradient from
    that call too, or from moe_gemm_topk_weights_grad when dW is not needed."""
    fn = "libmoe.gemm_bwd"
    backend, routing, M, N, K, options = _gemm_setup(fn, x, w, m_sizes, gather_indices, topk_weights, topk,
                                                     permute_x, permute_y)
    check_float(fn, "dy", dy, (M, N), w.device, dtype=w.dtype)
    if need_dtopk and topk_weights is None:
        raise ValueError("%s: the topk-weight gradient needs topk_weights" % fn)
    options.allow_tf32 = int(allow_tf32)
    dx = torch.empty_like(x) if need_dx else _empty(x)   # x and w are contiguous: so are these
    dw = torch.empty_like(w) if need_dw else _empty(w)
    dtw = w.new_empty((M,)) if need_dtopk else _empty(w)
    with device_scope(w.device):
        if need_dx or need_dw:
            options.dx_only, options.dw_only = int(not need_dw), int(not need_dx)
            options.reduce_topk = int(permute_x and need_dx)
            dtw_out = ptr(dtw) if need_dtopk and need_dw else None
            _capi.call("moe_gemm_bwd", backend, ctypes.byref(routing), N, K, ptr(x), ptr(w), ptr(dy),
                       ptr(topk_weights), ptr(dx) if need_dx else None, ptr(dw) if need_dw else None, dtw_out,
                       ctypes.byref(options))
        if need_dtopk and not need_dw:
            options.dx_only = options.dw_only = options.reduce_topk = 0
            _capi.call("moe_gemm_topk_weights_grad", backend, ctypes.byref(routing), N, K, ptr(x), ptr(w), ptr(dy),
                       ptr(dtw), ctypes.byref(options))
    return dx, dw, dtw


# ------------------------------------------------------------------------------------------------------
# Blockwise MoE MLP
# ------------------------------------------------------------------------------------------------------
def mlp_options(dtype, block_size, activation, affinity_on_i, pad_row, bias, clamps, tensor_update_overwrite,
                float32_intermediates, stream):
    """moe_mlp_options from the Python options.  clamps: (linear lower, linear upper, non-linear lower,
    non-linear upper), each a float, NaN for no bound (custom_op's schema has no list of optional floats)."""
    o = _capi.MlpOptions(dtype=moe_dtype(dtype), block_size=block_size, activation=activation,
                         affinity=_capi.MOE_AFFINITY_ON_I if affinity_on_i else _capi.MOE_AFFINITY_ON_H,
                         padding=_capi.MOE_MLP_PAD_ROW if pad_row else _capi.MOE_MLP_PAD_SKIP, bias=int(bias),
                         tensor_update_overwrite=int(tensor_update_overwrite),
                         float32_intermediates=int(float32_intermediates), stream=stream)
    names = ("linear_clamp_lower_limit", "linear_clamp_upper_limit", "non_linear_clamp_lower_limit",
             "non_linear_clamp_upper_limit")
    for name, value in zip(names, clamps):
        if not math.isnan(value):
            setattr(o, "has_" + name, 1)
            setattr(o, name, float(value))
    return o


def mlp_layout(topk_ids: Tensor, topk_weights: Optional[Tensor], num_experts: int, block_size: int,
               dropping: bool, pad_row: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(block_to_expert [N], token_position_to_id [N*B], affinities [T*E] (empty without topk_weights),
    num_dropped [1]) of topk_ids [T, k].  CPU: moe_mlp_layout_build, its exact N.  CUDA: moe_mlp_layout_build_on with N the capacity
    moe_mlp_layout_max_blocks gives (no host round trip); the blocks past the used ones hold only padding."""
    fn = "libmoe.mlp_layout"
    check_int(fn, "num_experts", num_experts, 1)
    check_int(fn, "block_size", block_size, 1)
    check_index(fn, "topk_ids", topk_ids, (None, None), None)
    device = topk_ids.device
    T, k = topk_ids.shape
    check_float(fn, "topk_weights", topk_weights, (T, k), device, optional=True)
    backend = backend_of(device)
    dtype = topk_weights.dtype if topk_weights is not None else torch.float32
    kind = _capi.MOE_MLP_DROPPING if dropping else _capi.MOE_MLP_DROPLESS
    options = mlp_options(dtype, block_size, 0, False, pad_row, False, NO_CLAMPS, False, False,
                          stream_of(device))
    blocks = ctypes.c_int64(0)
    if backend == _capi.MOE_BACKEND_REF:
        _capi.call("moe_mlp_layout_num_blocks", kind, T, k, num_experts, ptr(topk_ids), ctypes.byref(options),
                   ctypes.byref(blocks))
    else:
        _capi.call("moe_mlp_layout_max_blocks", kind, T, k, num_experts, ctypes.byref(options), ctypes.byref(blocks))
    N = blocks.value
    block_to_expert = torch.empty((N,), dtype=torch.int64, device=device)
    position_to_id = torch.empty((N * block_size,), dtype=torch.int64, device=device)
    affinities = (torch.empty((T * num_experts,), dtype=dtype, device=device) if topk_weights is not None
                  else torch.empty((0,), dtype=dtype, device=device))
    dropped = torch.empty((1,), dtype=torch.int64, device=device)
    arrays = (ptr(block_to_expert), ptr(position_to_id), ptr(affinities) if topk_weights is not None else None,
              ptr(dropped))
    if backend == _capi.MOE_BACKEND_REF:
        _capi.call("moe_mlp_layout_build", kind, T, k, num_experts, ptr(topk_ids), ptr(topk_weights), N, *arrays,
                   ctypes.byref(options))
    else:
        with device_scope(device):
            _capi.call("moe_mlp_layout_build_on", backend, kind, T, k, num_experts, ptr(topk_ids), ptr(topk_weights),
                       N, *arrays, None, ctypes.byref(options))
    return block_to_expert, position_to_id, affinities, dropped


def _mlp_setup(fn, hidden, affinities, w_gu, w_d, b_gu, b_d, block_to_expert, token_position_to_id, block_size,
               pad_row):
    """Checks the tensors common to the forward and the backward; returns (backend, layout, T1, H, I)."""
    check_float(fn, "w_gu", w_gu, (None, None, 2, None), None)
    device, dtype = w_gu.device, w_gu.dtype
    E, H, _, I = w_gu.shape
    check_float(fn, "w_d", w_d, (E, I, H), device, dtype)
    check_float(fn, "hidden", hidden, (None, H), device, dtype)
    T1 = hidden.shape[0]
    T = T1 - 1 if pad_row else T1
    if T < 0:
        raise ValueError("%s: hidden has no rows; the pad-row convention needs T + 1 rows" % fn)
    check_float(fn, "affinities", affinities, (T * E,), device, dtype)
    check_float(fn, "b_gu", b_gu, (E, 2, I), device, dtype, optional=True)
    check_float(fn, "b_d", b_d, (E, H), device, dtype, optional=True)
    check_int(fn, "block_size", block_size, 1)
    check_index(fn, "block_to_expert", block_to_expert, (None,), device)
    N = block_to_expert.shape[0]
    check_index(fn, "token_position_to_id", token_position_to_id, (N * block_size,), device)
    layout = _capi.MlpLayout(T, E, N, ptr(block_to_expert), ptr(token_position_to_id))
    return backend_of(device), layout, T1, H, I, N


def mlp_fwd(hidden: Tensor, affinities: Tensor, w_gu: Tensor, w_d: Tensor, b_gu: Optional[Tensor],
            b_d: Optional[Tensor], block_to_expert: Tensor, token_position_to_id: Tensor, block_size: int,
            activation: int, affinity_on_i: bool, pad_row: bool, clamps: List[float],
            tensor_update_overwrite: bool, float32_intermediates: bool,
            checkpoints: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """moe_mlp_fwd: (out [T1, H], gate_up_ckpt_T [N, 2, I, B], down_ckpt [N, B, H]); the checkpoints are
    empty tensors when `checkpoints` is False (inference)."""
    fn = "libmoe.mlp_fwd"
    backend, layout, T1, H, I, N = _mlp_setup(fn, hidden, affinities, w_gu, w_d, b_gu, b_d, block_to_expert,
                                              token_position_to_id, block_size, pad_row)
    if (b_gu is None) != (b_d is None):
        raise ValueError("%s: b_gu and b_d are given together or not at all" % fn)
    opts = mlp_options(w_gu.dtype, block_size, activation, affinity_on_i, pad_row, b_gu is not None, clamps,
                       tensor_update_overwrite, float32_intermediates, stream_of(w_gu.device))
    out = w_gu.new_empty((T1, H))
    ckpt_gu = w_gu.new_empty((N, 2, I, block_size)) if checkpoints else _empty(w_gu)
    ckpt_d = w_gu.new_empty((N, block_size, H)) if checkpoints else _empty(w_gu)
    with device_scope(w_gu.device):
        _capi.call("moe_mlp_fwd", backend, ctypes.byref(layout), H, I, ptr(hidden), ptr(affinities), ptr(w_gu),
                   ptr(w_d), ptr(b_gu), ptr(b_d), ptr(out), ptr(ckpt_gu) if checkpoints else None,
                   ptr(ckpt_d) if checkpoints else None, ctypes.byref(opts))
    return out, ckpt_gu, ckpt_d


def mlp_bwd(hidden: Tensor, affinities: Tensor, w_gu: Tensor, w_d: Tensor, b_d: Optional[Tensor],
            gate_up_ckpt_T: Tensor, down_ckpt: Tensor, out_grad: Tensor, block_to_expert: Tensor,
            token_position_to_id: Tensor, block_size: int, activation: int, affinity_on_i: bool, pad_row: bool,
            bias: bool, clamps: List[float], tensor_update_overwrite: bool,
            float32_intermediates: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """moe_mlp_bwd: (d_hidden, d_affinities, d_w_gu, d_w_d, d_b_gu, d_b_d), the bias gradients empty
    without `bias`.  Every gradient is computed (the library's backward makes them together)."""
    fn = "libmoe.mlp_bwd"
    backend, layout, T1, H, I, N = _mlp_setup(fn, hidden, affinities, w_gu, w_d, None, b_d, block_to_expert,
                                              token_position_to_id, block_size, pad_row)
    device, dtype = w_gu.device, w_gu.dtype
    check_float(fn, "gate_up_ckpt_T", gate_up_ckpt_T, (N, 2, I, block_size), device, dtype)
    check_float(fn, "down_ckpt", down_ckpt, (N, block_size, H), device, dtype)
    check_float(fn, "out_grad", out_grad, (T1, H), device, dtype)
    opts = mlp_options(dtype, block_size, activation, affinity_on_i, pad_row, bias, clamps,
                       tensor_update_overwrite, float32_intermediates, stream_of(device))
    d_hidden = torch.empty_like(hidden)
    d_aff = torch.empty_like(affinities)
    d_w_gu = torch.empty_like(w_gu)
    d_w_d = torch.empty_like(w_d)
    E = w_gu.shape[0]
    d_b_gu = w_gu.new_empty((E, 2, I)) if bias else _empty(w_gu)
    d_b_d = w_gu.new_empty((E, H)) if bias else _empty(w_gu)
    with device_scope(device):
        _capi.call("moe_mlp_bwd", backend, ctypes.byref(layout), H, I, ptr(hidden), ptr(affinities), ptr(w_gu),
                   ptr(w_d), ptr(b_d) if bias else None, ptr(gate_up_ckpt_T), ptr(down_ckpt), ptr(out_grad),
                   ptr(d_hidden), ptr(d_aff), ptr(d_w_gu), ptr(d_w_d), ptr(d_b_gu) if bias else None,
                   ptr(d_b_d) if bias else None, ctypes.byref(opts))
    return d_hidden, d_aff, d_w_gu, d_w_d, d_b_gu, d_b_d
