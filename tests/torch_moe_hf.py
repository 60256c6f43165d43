"""A bf16 MoE layer with transformers' fused expert module (MixtralExperts, which Qwen3MoeExperts
inherits: gate_up_proj (E, 2I, H), F.linear then chunk(2) into gate and up; down_proj (E, H, I)),
written here in that layout, checked forward and backward against libmoe with --weight-layout
hf-mixtral.  Usage: python3 torch_moe_hf.py MOE FOLDER."""
import sys

import torch
import torch.nn.functional as F
from torch import nn

import torch_moe_check as check


class MixtralExperts(nn.Module):
    def __init__(self, E, H, I):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.randn(E, 2 * I, H) / 8)
        self.down_proj = nn.Parameter(torch.randn(E, H, I) / 8)

    def forward(self, x, ids, tw):
        y = torch.zeros_like(x)
        for e in range(self.gate_up_proj.shape[0]):
            t, j = torch.where(ids == e)
            gate, up = F.linear(x[t], self.gate_up_proj[e]).chunk(2, dim=-1)
            y = y.index_add(0, t, F.linear(F.silu(gate) * up, self.down_proj[e]) * tw[t, j, None])
        return y


def weights(experts, grad):
    pick = lambda p: p.grad if grad else p
    return {"gate_up_proj_weight": pick(experts.gate_up_proj), "down_proj_weight": pick(experts.down_proj)}


torch.manual_seed(1)
check.run(sys.argv[1], MixtralExperts(check.E, check.H, check.I).to(torch.bfloat16),
          lambda m, x, ids, tw: m(x, ids, tw), weights, "hf-mixtral", sys.argv[2])
