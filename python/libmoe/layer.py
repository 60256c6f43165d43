"""An MoE expert layer (nn.Module) on the blockwise MLP: it takes a router's (T, k) ids and weights."""
import math

import torch

from . import mlp as _mlp


class MoEExperts(torch.nn.Module):
    """The experts of an MoE layer: out[t] = sum_j w[t, j] * expert_{ids[t, j]}(hidden[t]), each expert a
    gated MLP down(act(gate(x)) * up(x)) (+ biases), computed by libmoe's blockwise MLP (forward and backward).

    Parameters, in the library's (NKI's) layout: w_gu [E, H, 2, I] (gate index 0, up index 1) and w_d
    [E, I, H]; with bias, b_gu [E, 2, I] and b_d [E, H].  Initialised as nn.Linear initialises its weight
    (uniform in +-1/sqrt(fan_in)), biases zero.  load_linear_weights() takes nn.Linear / Hugging Face
    stacked weights ([E, 2I, H] and [E, H, I]).

    forward(hidden [T, H], topk_ids [T, k] int64, topk_weights [T, k]) -> [T, H]: the layout is built from
    the ids on their device; the routing weights are differentiable (their gradient is the library's
    affinity gradient at each chosen pair)."""

    def __init__(self, num_experts, hidden_size, intermediate_size, *, activation="silu", bias=False,
                 block_size=128, intermediates="rounded", dtype=None, device=None):
        super().__init__()
        E, H, I = num_experts, hidden_size, intermediate_size
        self.num_experts, self.block_size = E, block_size
        self.activation, self.intermediates = activation, intermediates
        kw = {"dtype": dtype, "device": device}
        self.w_gu = torch.nn.Parameter(torch.empty((E, H, 2, I), **kw))
        self.w_d = torch.nn.Parameter(torch.empty((E, I, H), **kw))
        self.b_gu = torch.nn.Parameter(torch.zeros((E, 2, I), **kw)) if bias else None
        self.b_d = torch.nn.Parameter(torch.zeros((E, H), **kw)) if bias else None
        with torch.no_grad():
            self.w_gu.uniform_(-1 / math.sqrt(H), 1 / math.sqrt(H))
            self.w_d.uniform_(-1 / math.sqrt(I), 1 / math.sqrt(I))

    @torch.no_grad()
    def load_linear_weights(self, w_gu, w_d):
        """Copies nn.Linear-layout weights (w_gu [E, 2I, H]: gate rows then up rows; w_d [E, H, I])."""
        nki_gu, nki_d = _mlp.to_nki_layout(w_gu, w_d, "linear")
        self.w_gu.copy_(nki_gu)
        self.w_d.copy_(nki_d)

    def forward(self, hidden, topk_ids, topk_weights):  # pylint: disable=arguments-differ
        T = hidden.shape[0]
        layout = _mlp.mlp_layout(topk_ids, self.num_experts, self.block_size)
        affinities = torch.zeros((T, self.num_experts), dtype=hidden.dtype, device=hidden.device)
        affinities = affinities.scatter(1, topk_ids, topk_weights.to(hidden.dtype))
        return _mlp.moe_mlp(hidden.contiguous(), affinities.reshape(-1), self.w_gu, self.w_d, layout,
                            self.b_gu, self.b_d, activation=self.activation, intermediates=self.intermediates)
