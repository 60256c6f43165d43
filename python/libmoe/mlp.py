"""The blockwise MoE MLP (NKI blockwise_mm semantics, SEMANTICS section 3) on torch tensors: its block
layout from a router's choices, and the forward with its backward as one differentiable function."""
import collections
import math

import torch

from . import _capi, _ops, _raw
from ._tensors import check_devices

WEIGHT_LAYOUTS = ("nki", "linear")

MlpLayout = collections.namedtuple("MlpLayout", "block_to_expert token_position_to_id affinities num_dropped "
                                                "block_size pad_row")
MlpLayout.__doc__ = """A block layout (moe_mlp_layout) and what its builder gave with it.
    block_to_expert       [N] int64
    token_position_to_id  [N * block_size] int64, -1 (or T with pad_row) for an empty position
    affinities            [T * E] of topk_weights' dtype: the routing weight of each placed (token, expert)
                          pair, 0 elsewhere (None when the layout was built without weights)
    num_dropped           [1] int64 tensor: pairs dropped past capacity (dropping layouts)"""


def mlp_layout(topk_ids, num_experts, block_size=128, topk_weights=None, *, dropping=False, pad_row=False):
    """The block layout of a router's choices topk_ids [T, k] (int64, no expert twice in a row), built on the
    ids' device: dropless (ceil(m_e / B) blocks per expert) or dropping (one block per expert, tokens past
    capacity dropped).  On CUDA the layout has the capacity moe_mlp_layout_max_blocks gives (no host
    round trip); the blocks past the used ones hold only padding, which the MLP skips."""
    b2e, pos, aff, dropped = _raw.mlp_layout(topk_ids, topk_weights, num_experts, block_size, bool(dropping),
                                             bool(pad_row))
    return MlpLayout(b2e, pos, aff if topk_weights is not None else None, dropped, block_size, bool(pad_row))


def to_nki_layout(w_gu, w_d, weight_layout):
    """The library's (NKI's) weights from `weight_layout`:
      "nki"     w_gu [E, H, 2, I] (index 0 gate, 1 up), w_d [E, I, H]: returned as they are;
      "linear"  nn.Linear's (out_features, in_features) per expert, as Hugging Face MoE blocks stack them:
                w_gu [E, 2I, H] (rows 0..I-1 the gate projection, I..2I-1 the up projection), w_d [E, H, I];
                converted by a permute and .contiguous() (a copy, differentiable: the gradients come back in
                the linear layout)."""
    if weight_layout == "nki":
        return w_gu, w_d
    if weight_layout != "linear":
        raise ValueError("libmoe: weight_layout must be one of %s, got %r" % (WEIGHT_LAYOUTS, weight_layout))
    if not isinstance(w_gu, torch.Tensor) or w_gu.dim() != 3 or w_gu.shape[1] % 2:
        raise ValueError("libmoe: weight_layout='linear': w_gu must be [E, 2I, H], got %s"
                         % (tuple(w_gu.shape) if isinstance(w_gu, torch.Tensor) else type(w_gu).__name__))
    if not isinstance(w_d, torch.Tensor) or w_d.dim() != 3:
        raise ValueError("libmoe: weight_layout='linear': w_d must be [E, H, I]")
    E, I2, H = w_gu.shape
    return (w_gu.reshape(E, 2, I2 // 2, H).permute(0, 3, 1, 2).contiguous(),
            w_d.permute(0, 2, 1).contiguous())


def _activation(name):
    if name not in _capi.ACTIVATIONS:
        raise ValueError("libmoe: activation must be one of %s, got %r" % (sorted(_capi.ACTIVATIONS), name))
    return _capi.ACTIVATIONS[name]


def moe_mlp(hidden, affinities, w_gu, w_d, layout, b_gu=None, b_d=None, *, activation="silu",
            affinity_on="H", clamp_linear=(None, None), clamp_non_linear=(None, None),
            tensor_update_overwrite=False, intermediates="rounded", weight_layout="nki"):
    """out = the blockwise MoE MLP of hidden, differentiable in hidden, affinities, w_gu, w_d, b_gu, b_d.

    hidden       [T, H] ([T + 1, H] with layout.pad_row; row T is never read)
    affinities   [T * E] (or [T, E], flattened), A[t*E + e] the routing weight of (token t, expert e); read
                 only for the pairs the layout holds
    w_gu, w_d    the expert weights in `weight_layout` (to_nki_layout: "nki" [E, H, 2, I] and [E, I, H], or
                 "linear" [E, 2I, H] and [E, H, I])
    layout       an MlpLayout (mlp_layout)
    b_gu, b_d    optional biases [E, 2, I] and [E, H] (both or neither)
    activation   "silu", "gelu", "gelu_tanh" or "swish" (x * sigmoid(1.702 x))
    affinity_on  "H" (out += a * d) or "I" (m = act(g) * u * a)
    clamp_linear, clamp_non_linear   (lower, upper) bounds on u and g after the bias, None for no bound
    tensor_update_overwrite          NKI's is_tensor_update_accumulating = False (top-1 layouts only)
    intermediates "rounded" (16-bit dtypes: the second-stage GEMM operands rounded to the dtype, as NKI,
                 PyTorch and Unsloth do; the fast CUDA path) or "float32" (kept in float32)
    Every tensor has one dtype (float32, float16 or bfloat16) and one device.  The backward is one
    moe_mlp_bwd call, which computes every gradient together (requires_grad only selects what is returned);
    the checkpoints are kept only when a gradient may be needed."""
    if affinity_on not in ("H", "I"):
        raise ValueError("libmoe.moe_mlp: affinity_on must be 'H' or 'I', got %r" % (affinity_on,))
    if intermediates not in ("rounded", "float32"):
        raise ValueError("libmoe.moe_mlp: intermediates must be 'rounded' or 'float32', got %r" % (intermediates,))
    if not isinstance(layout, MlpLayout):
        raise TypeError("libmoe.moe_mlp: layout must be an MlpLayout (libmoe.mlp_layout), got %s"
                        % type(layout).__name__)
    check_devices("libmoe.moe_mlp", hidden=hidden, affinities=affinities, w_gu=w_gu, w_d=w_d, b_gu=b_gu, b_d=b_d,
                  block_to_expert=layout.block_to_expert, token_position_to_id=layout.token_position_to_id)
    w_gu, w_d = to_nki_layout(w_gu, w_d, weight_layout)
    if isinstance(affinities, torch.Tensor) and affinities.dim() == 2:
        affinities = affinities.reshape(-1)
    clamps = [math.nan if c is None else float(c) for c in (*clamp_linear, *clamp_non_linear)]
    tensors = (hidden, affinities, w_gu, w_d, b_gu, b_d)
    checkpoints = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)
    out, _, _ = _ops.mlp_apply(hidden, affinities, w_gu, w_d, b_gu, b_d, layout.block_to_expert,
                               layout.token_position_to_id, layout.block_size, _activation(activation),
                               affinity_on == "I", layout.pad_row, clamps, bool(tensor_update_overwrite),
                               intermediates == "float32", checkpoints)
    return out
