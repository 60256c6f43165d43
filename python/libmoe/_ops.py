"""The differentiable ops: the grouped GEMM and the blockwise MLP.

The raw calls of _raw.py run inside torch.autograd.Function subclasses (GroupedGemmFunction, MlpFunction).
Where the running torch has torch.library.custom_op (2.4 and later), the same raw calls are also registered
as the ops libmoe::gemm_fwd, libmoe::gemm_bwd, libmoe::mlp_fwd and libmoe::mlp_bwd, with fake (meta)
implementations and the same autograd formulas, so that torch.compile traces them and CUDA graphs capture
them.  A call goes through the registered op where torch must see it (dispatched(): under torch.compile or
torch.export, inside a TorchDispatchMode, on a tensor subclass) and through the autograd function
otherwise, or, where autograd records nothing (no grad mode, no input that requires grad), the raw call
itself: a plain eager call then skips the dispatcher's Python layers and the autograd function's (tens of
microseconds a call; the numbers are in bench/RESULTS.md) and computes the same thing.  On older torch
(Debian's 1.13) no call takes the registered op (there is none)."""
import torch

from . import _raw

HAS_CUSTOM_OP = hasattr(torch.library, "custom_op") and hasattr(torch.library, "register_fake")

_GEMM_ARGS = ("x", "w", "m_sizes", "gather_indices", "topk_weights", "topk", "permute_x", "permute_y", "allow_tf32")
_MLP_ARGS = ("hidden", "affinities", "w_gu", "w_d", "b_gu", "b_d", "block_to_expert", "token_position_to_id",
             "block_size", "activation", "affinity_on_i", "pad_row", "clamps", "tensor_update_overwrite",
             "float32_intermediates", "checkpoints")
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
_dispatch_stack_depth = getattr(torch._C, "_len_torch_dispatch_stack", None)  # pylint: disable=protected-access


def dispatched(tensors):
    """Whether a call on `tensors` must go through the registered op: torch has custom ops, and torch.compile or
    torch.export traces the call, a TorchDispatchMode is active (FakeTensorMode, FlopCounterMode, ...; where
    this torch cannot tell, always), or a tensor is a subclass (FakeTensor, FunctionalTensor, DTensor, ...)."""
    if not HAS_CUSTOM_OP:
        return False
    if torch.compiler.is_compiling() or _dispatch_stack_depth is None or _dispatch_stack_depth():
        return True
    for t in tensors:
        if t is not None and type(t) not in _PLAIN_TENSORS:  # pylint: disable=unidiomatic-typecheck
            return True
    return False


# ------------------------------------------------------------------------------------------------------
# Fake implementations: the outputs' shapes from the inputs' (torch.compile)
# ------------------------------------------------------------------------------------------------------
def _gemm_fwd_fake(x, w, m_sizes, gather_indices, topk_weights, topk, permute_x, permute_y, allow_tf32):
    rows = x.shape[0] * topk if permute_x else x.shape[0]
    return w.new_empty((rows, w.shape[1]))


def _gemm_bwd_fake(x, w, dy, m_sizes, gather_indices, topk_weights, topk, permute_x, permute_y, allow_tf32,
                   need_dx, need_dw, need_dtopk):
    return (x.new_empty(x.shape if need_dx else (0,)), w.new_empty(w.shape if need_dw else (0,)),
            w.new_empty((dy.shape[0],) if need_dtopk else (0,)))


def _mlp_fwd_fake(hidden, affinities, w_gu, w_d, b_gu, b_d, block_to_expert, token_position_to_id, block_size,
                  activation, affinity_on_i, pad_row, clamps, tensor_update_overwrite, float32_intermediates,
                  checkpoints):
    N, I, H = block_to_expert.shape[0], w_gu.shape[3], w_gu.shape[1]
    return (hidden.new_empty(hidden.shape), w_gu.new_empty((N, 2, I, block_size) if checkpoints else (0,)),
            w_gu.new_empty((N, block_size, H) if checkpoints else (0,)))


def _mlp_bwd_fake(hidden, affinities, w_gu, w_d, b_d, gate_up_ckpt_T, down_ckpt, out_grad, block_to_expert,
                  token_position_to_id, block_size, activation, affinity_on_i, pad_row, bias, clamps,
                  tensor_update_overwrite, float32_intermediates):
    E, H, _, I = w_gu.shape
    return (hidden.new_empty(hidden.shape), affinities.new_empty(affinities.shape), w_gu.new_empty(w_gu.shape),
            w_d.new_empty(w_d.shape), w_gu.new_empty((E, 2, I) if bias else (0,)),
            w_gu.new_empty((E, H) if bias else (0,)))


# ------------------------------------------------------------------------------------------------------
# Autograd formulas, shared by both registrations
# ------------------------------------------------------------------------------------------------------
def _gemm_setup_context(ctx, inputs, output):
    x, w, m_sizes, gather, topk_weights, topk, permute_x, permute_y, allow_tf32 = inputs
    ctx.save_for_backward(x, w, m_sizes, gather, topk_weights)
    ctx.flags = (topk, permute_x, permute_y, allow_tf32)


def _gemm_backward(ctx, grad_y):
    x, w, m_sizes, gather, topk_weights = ctx.saved_tensors
    need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    need_dtopk = topk_weights is not None and ctx.needs_input_grad[4]
    grads = [None] * len(_GEMM_ARGS)
    if need_dx or need_dw or need_dtopk:
        dx, dw, dtw = gemm_bwd(x, w, grad_y.contiguous(), m_sizes, gather, topk_weights, *ctx.flags,
                               need_dx, need_dw, need_dtopk)
        grads[0], grads[1], grads[4] = (dx if need_dx else None, dw if need_dw else None,
                                        dtw if need_dtopk else None)
    return tuple(grads)


def _mlp_setup_context(ctx, inputs, output):
    (hidden, affinities, w_gu, w_d, b_gu, b_d, block_to_expert, token_position_to_id, block_size, activation,
     affinity_on_i, pad_row, clamps, overwrite, f32_intermediates, _) = inputs
    _, ckpt_gu, ckpt_d = output
    ctx.save_for_backward(hidden, affinities, w_gu, w_d, b_d, ckpt_gu, ckpt_d, block_to_expert,
                          token_position_to_id)
    ctx.flags = (block_size, activation, affinity_on_i, pad_row, b_gu is not None, list(clamps), overwrite,
                 f32_intermediates)


def _mlp_backward(ctx, grad_out, _grad_ckpt_gu, _grad_ckpt_d):
    hidden, affinities, w_gu, w_d, b_d, ckpt_gu, ckpt_d, block_to_expert, position_to_id = ctx.saved_tensors
    grads = [None] * len(_MLP_ARGS)
    if any(ctx.needs_input_grad[:6]):
        d = mlp_bwd(hidden, affinities, w_gu, w_d, b_d, ckpt_gu, ckpt_d, grad_out.contiguous(), block_to_expert,
                    position_to_id, *ctx.flags)
        bias = ctx.flags[4]
        for i, g in enumerate((d[0], d[1], d[2], d[3], d[4] if bias else None, d[5] if bias else None)):
            grads[i] = g if ctx.needs_input_grad[i] else None
    return tuple(grads)


# ------------------------------------------------------------------------------------------------------
# The autograd functions (every torch) and the registered ops (torch with custom_op)
# ------------------------------------------------------------------------------------------------------
class GroupedGemmFunction(torch.autograd.Function):  # pylint: disable=abstract-method
    """The grouped GEMM forward with its backward, on the raw call."""

    @staticmethod
    def forward(ctx, *args):  # pylint: disable=arguments-differ
        y = _raw.gemm_fwd(*args)
        _gemm_setup_context(ctx, args, y)
        return y

    @staticmethod
    def backward(ctx, grad_y):  # pylint: disable=arguments-differ
        return _gemm_backward(ctx, grad_y)


class MlpFunction(torch.autograd.Function):  # pylint: disable=abstract-method
    """The blockwise MLP forward with its backward, on the raw call."""

    @staticmethod
    def forward(ctx, *args):  # pylint: disable=arguments-differ
        outputs = _raw.mlp_fwd(*args)
        _mlp_setup_context(ctx, args, outputs)
        ctx.mark_non_differentiable(outputs[1], outputs[2])
        return outputs

    @staticmethod
    def backward(ctx, *grads):  # pylint: disable=arguments-differ
        return _mlp_backward(ctx, *grads)


def _needs_grad(tensors):
    """Whether autograd records a call on `tensors`: grad mode on and a tensor that requires grad."""
    if torch.is_grad_enabled():
        for t in tensors:
            if t is not None and t.requires_grad:
                return True
    return False


def _entry(raw, function, registered, tensor_count, doc):
    """A call of the arguments of `raw`, whose first tensor_count arguments are its tensors: `registered` (the
    op) where dispatched() says so; else `function` (the autograd function on raw, None for a backward) where
    autograd records the call; else `raw` itself (what the autograd function would run, less its cost)."""
    def call(*args):
        tensors = args[:tensor_count]
        if dispatched(tensors):
            return registered(*args)
        if function is not None and _needs_grad(tensors):
            return function.apply(*args)
        return raw(*args)
    call.__doc__ = doc
    return call


if HAS_CUSTOM_OP:
    def _register(name, fn, fake):
        op = torch.library.custom_op("libmoe::" + name, mutates_args=())(fn)
        op.register_fake(fake)
        return op

    gemm_fwd_op = _register("gemm_fwd", _raw.gemm_fwd, _gemm_fwd_fake)
    gemm_bwd_op = _register("gemm_bwd", _raw.gemm_bwd, _gemm_bwd_fake)
    mlp_fwd_op = _register("mlp_fwd", _raw.mlp_fwd, _mlp_fwd_fake)
    mlp_bwd_op = _register("mlp_bwd", _raw.mlp_bwd, _mlp_bwd_fake)
    gemm_fwd_op.register_autograd(_gemm_backward, setup_context=_gemm_setup_context)
    mlp_fwd_op.register_autograd(_mlp_backward, setup_context=_mlp_setup_context)
else:
    gemm_fwd_op = gemm_bwd_op = mlp_fwd_op = mlp_bwd_op = None

gemm_apply = _entry(_raw.gemm_fwd, GroupedGemmFunction, gemm_fwd_op, 5,
                    "The differentiable grouped GEMM (the arguments of _raw.gemm_fwd).")
gemm_bwd = _entry(_raw.gemm_bwd, None, gemm_bwd_op, 6,
                  "The grouped GEMM's backward op (the arguments of _raw.gemm_bwd).")
mlp_apply = _entry(_raw.mlp_fwd, MlpFunction, mlp_fwd_op, 8,
                   "The differentiable blockwise MLP (the arguments of _raw.mlp_fwd).")
mlp_bwd = _entry(_raw.mlp_bwd, None, mlp_bwd_op, 10, "The blockwise MLP's backward op (the arguments of _raw.mlp_bwd).")
