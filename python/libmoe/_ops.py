"""The differentiable ops: the grouped GEMM and the blockwise MLP.

Where the running torch has torch.library.custom_op (2.4 and later), the raw calls of _raw.py are
registered as the ops libmoe::gemm_fwd, libmoe::gemm_bwd, libmoe::mlp_fwd and libmoe::mlp_bwd, with fake
(meta) implementations and autograd formulas, so that torch.compile traces them and CUDA graphs capture
them.  On older torch (Debian's 1.13) the same raw calls run inside torch.autograd.Function subclasses.
Both paths share the setup_context and backward functions below, so they compute the same thing."""
import torch

from . import _raw

HAS_CUSTOM_OP = hasattr(torch.library, "custom_op") and hasattr(torch.library, "register_fake")

_GEMM_ARGS = ("x", "w", "m_sizes", "gather_indices", "topk_weights", "topk", "permute_x", "permute_y", "allow_tf32")
_MLP_ARGS = ("hidden", "affinities", "w_gu", "w_d", "b_gu", "b_d", "block_to_expert", "token_position_to_id",
             "block_size", "activation", "affinity_on_i", "pad_row", "clamps", "tensor_update_overwrite",
             "float32_intermediates", "checkpoints")


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
# Registration
# ------------------------------------------------------------------------------------------------------
if HAS_CUSTOM_OP:
    def _register(name, fn, fake):
        op = torch.library.custom_op("libmoe::" + name, mutates_args=())(fn)
        op.register_fake(fake)
        return op

    gemm_fwd_op = _register("gemm_fwd", _raw.gemm_fwd, _gemm_fwd_fake)
    gemm_bwd = _register("gemm_bwd", _raw.gemm_bwd, _gemm_bwd_fake)
    mlp_fwd_op = _register("mlp_fwd", _raw.mlp_fwd, _mlp_fwd_fake)
    mlp_bwd = _register("mlp_bwd", _raw.mlp_bwd, _mlp_bwd_fake)
    gemm_fwd_op.register_autograd(_gemm_backward, setup_context=_gemm_setup_context)
    mlp_fwd_op.register_autograd(_mlp_backward, setup_context=_mlp_setup_context)

    def gemm_apply(*args):
        return gemm_fwd_op(*args)

    def mlp_apply(*args):
        return mlp_fwd_op(*args)
else:
    gemm_bwd, mlp_bwd = _raw.gemm_bwd, _raw.mlp_bwd

    class GroupedGemmFunction(torch.autograd.Function):  # pylint: disable=abstract-method
        """The grouped GEMM forward with its backward (torch without custom_op)."""

        @staticmethod
        def forward(ctx, *args):  # pylint: disable=arguments-differ
            y = _raw.gemm_fwd(*args)
            _gemm_setup_context(ctx, args, y)
            return y

        @staticmethod
        def backward(ctx, grad_y):  # pylint: disable=arguments-differ
            return _gemm_backward(ctx, grad_y)

    class MlpFunction(torch.autograd.Function):  # pylint: disable=abstract-method
        """The blockwise MLP forward with its backward (torch without custom_op)."""

        @staticmethod
        def forward(ctx, *args):  # pylint: disable=arguments-differ
            outputs = _raw.mlp_fwd(*args)
            _mlp_setup_context(ctx, args, outputs)
            ctx.mark_non_differentiable(outputs[1], outputs[2])
            return outputs

        @staticmethod
        def backward(ctx, *grads):  # pylint: disable=arguments-differ
            return _mlp_backward(ctx, *grads)

    def gemm_apply(*args):
        return GroupedGemmFunction.apply(*args)

    def mlp_apply(*args):
        return MlpFunction.apply(*args)
