"""A bf16 MoE layer whose experts are nn.Linear modules (gate_proj, up_proj, down_proj, as transformers'
Qwen3MoeMLP and the Mixtral experts were before fusing), checked forward and backward against libmoe:
the weights are saved stacked as torch holds them, --weight-layout linear-split reads them.
Usage: python3 torch_moe_linear.py MOE FOLDER."""
import sys

import torch
import torch.nn.functional as F
from torch import nn

import torch_moe_check as check


class Expert(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = nn.Linear(check.H, check.I, bias=False)
        self.up_proj = nn.Linear(check.H, check.I, bias=False)
        self.down_proj = nn.Linear(check.I, check.H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def forward(experts, x, ids, tw):
    y = torch.zeros_like(x)
    for e, expert in enumerate(experts):
        t, j = torch.where(ids == e)
        y = y.index_add(0, t, expert(x[t]) * tw[t, j, None])
    return y


def weights(experts, grad):
    stack = lambda name: torch.stack([getattr(getattr(e, name).weight, "grad" if grad else "data") for e in experts])
    return {"gate_proj_weight": stack("gate_proj"), "up_proj_weight": stack("up_proj"),
            "down_proj_weight": stack("down_proj")}


torch.manual_seed(1)
check.run(sys.argv[1], nn.ModuleList(Expert() for _ in range(check.E)).to(torch.bfloat16), forward, weights,
          "linear-split", sys.argv[2])
