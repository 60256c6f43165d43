"""What tests/torch_moe_linear.py and tests/torch_moe_hf.py share: the router, running a bf16 MoE layer
forward and backward in PyTorch, saving its tensors as a user would (values as float32, `.float()`),
and checking them against libmoe through the `moe` CLI.

The expert weights are saved as the module holds them and `--weight-layout` tells moe their layout:
no script converts a layout.  Tolerance: torch's bf16 layer rounds every intermediate to bf16 (g, u,
act(g), m, d, the weighted output, each index_add; the backward likewise) and libmoe rounds the same
operands once (--intermediates rounded, the default), so the two differ by a few roundings of
intermediates: each element may differ by 8 bf16 rounding units (u = 2^-8) of itself plus 8 units of
its tensor's largest element in float64 (which covers cancellation in the sums).  A planted bug (each token's two routing
weights swapped) must fail that check.
"""
import copy
import os
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F

T, E, K, H, I = 16, 4, 2, 64, 32   # tokens, experts, top-k, hidden, intermediate
TOL = 8 * 2.0 ** -8                # 8 bf16 rounding units


def save(folder, name, t):
    np.save(os.path.join(folder, name + ".npy"), t.detach().float().numpy() if t.is_floating_point() else t.numpy())


def run(moe, experts, forward, weights, layout, folder):
    """experts: the bf16 module; forward(experts, x, ids, tw): the layer's output; weights(experts,
    grad): its weight tensors (or their gradients) by moe's file name for `layout`.  Runs the step
    forward and backward, saves it into folder/step (inputs) and folder/torch (results), runs moe route,
    mlp-fwd and mlp-bwd --weight-layout layout, compares, and exits 1 on a mismatch."""
    torch.manual_seed(0)
    step, want, got = (os.path.join(folder, d) for d in ("step", "torch", "libmoe"))
    for d in (step, want, got):
        os.makedirs(d, exist_ok=True)
    x = torch.randn(T, H).to(torch.bfloat16).requires_grad_()
    probs = F.softmax(x.detach().float() @ torch.randn(H, E), dim=-1)   # the router: top-k, renormalised
    tw, ids = torch.topk(probs, K)
    tw = (tw / tw.sum(-1, keepdim=True)).to(torch.bfloat16).requires_grad_()
    g = torch.randn(T, H).to(torch.bfloat16)                            # the gradient of the output
    for name, t in {**weights(experts, False), "hidden_states": x, "topk_ids": ids, "topk_weights": tw,
                    "output_hidden_states_grad": g}.items():
        save(step, name, t)

    y = forward(experts, x, ids, tw)                                    # the step under test
    y.backward(g)
    results = {"output": y, "hidden_states_grad": x.grad, "topk_weights_grad": tw.grad,
               **{n + "_grad": t for n, t in weights(experts, True).items()}}
    for name, t in results.items():
        save(want, name, t)
    save(want, "output_bug", forward(experts, x, ids, tw.flip(-1)))     # a planted bug

    e64 = copy.deepcopy(experts).double()                               # float64: each tensor's scale
    x64, tw64 = x.detach().double().requires_grad_(), tw.detach().double().requires_grad_()
    y64 = forward(e64, x64, ids, tw64)
    y64.backward(g.double())
    exact = {"output": y64, "hidden_states_grad": x64.grad, "topk_weights_grad": tw64.grad,
             **{n + "_grad": t for n, t in weights(e64, True).items()}}

    moe_ = lambda *a: subprocess.run([moe, *a], stdout=subprocess.DEVNULL).returncode
    flags = ["--weight-layout", layout, "--dtype", "bf16"]
    if (moe_("route", "--topk-ids", f"{step}/topk_ids.npy", "--experts", str(E), "--block-size", "4",
             "--topk-weights", f"{step}/topk_weights.npy", "--dtype", "bf16", "--out", step)
            or moe_("mlp-fwd", "--in", step, "--out", step, *flags) or moe_("mlp-bwd", "--in", step, "--out", got, *flags)):
        sys.exit("moe route, mlp-fwd or mlp-bwd failed")
    compare = lambda a, b, name: subprocess.run(
        [moe, "compare", a, b, "--dtype", "bf16", "--rtol", str(TOL), "--atol", str(TOL * float(exact[name].abs().max()))]
    ).returncode
    failed = compare(f"{step}/output.npy", f"{want}/output.npy", "output")
    for name in results:
        if name != "output":
            failed |= compare(f"{got}/{name}.npy", f"{want}/{name}.npy", name)
    if compare(f"{step}/output.npy", f"{want}/output_bug.npy", "output") != 1:
        print("FAIL: the planted bug (each token's routing weights swapped) passed the check")
        failed = 1
    sys.exit(1 if failed else 0)
