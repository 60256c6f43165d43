#!/usr/bin/env python3
"""NKI blockwise_mm_bwd's test configurations at CPU size, with inputs laid out as NKI's test helpers make
them, and float64 goldens: the data of tests/test_cli_nki.sh.

    nki_bwmm_cases.py DIR

writes one folder per (configuration, padding convention), DIR/NAME/, holding

    in/            the kernel's inputs exactly as NKI's helpers (nki-library,
                   test/integration/nkilib/experimental/moe/test_bwmm_bwd_common.py) shape them:
                   hidden_states (T1, H), expert_affinities_masked (T1*E, 1), gate_up_proj_weight
                   (E, H, 2, I), down_proj_weight (E, I, H), the biases, token_position_to_id (N*B,) int32
                   and block_to_expert (N,) int32, output_hidden_states_grad (T1, H), and the checkpoints
                   gate_up_proj_act_checkpoint_T (N, 2, I, B) and down_proj_act_checkpoint (N, B, H) (none
                   with the affinity on I), where T1 = T + 1 with NKI's padding row (the row padding, empty
                   positions hold T; row T of every token tensor and of the affinities is zero) and T with
                   skip padding (-1);
    golden_fwd/    output, gate_up_proj_act_checkpoint_T, down_proj_act_checkpoint: the forward in float64
                   from the inputs' values;
    golden_bwd/    every gradient in float64, the backward of the checkpoints in in/ (the affinity gradient
                   in NKI's (T1*E, 1), zero in the padding row);
    flags          the moe flags of the configuration, one line;

and DIR/cases, the folder names, one a line, and DIR/skipped, the configurations libmoe cannot express, one
a line with the reason.  Floating files are float32; bf16 configurations hold bf16 values (rounded to
nearest even).  The inputs are built the way NKI's helpers build them (its router with seed 0, its block
layout with the padding blocks given to the last expert, its value ranges and its seed per configuration);
the code and the goldens are this project's own.
"""

import hashlib
import math
import os
import sys

import numpy as np

# NKI's test list for blockwise_mm_bwd (test_bwmm_bwd.py: TEST_PARAMS, then MIXED_GRAD_PARAMS, then the two
# rows only the list's earlier version has; a row the list holds twice once), the columns
# that change the math: H, T, E, B, TOPK, I, dtype, skip (0: padding row T, 1: skip -1), clamp limits as
# NKI's ClampLimits(linear upper, linear lower, non-linear upper, non-linear lower), bias, activation,
# affinity side, float32 weight gradients (the mixed-precision list).  The blocking and sharding columns
# change no value and are left out.
NONE4 = (None, None, None, None)
GPT = (7, -7, 7, -7)
NKI_TESTS = [
    (5120, 8192, 16, 512, 1, 256, "bf16", 0, NONE4, False, "silu", "h", False),
    (5120, 8192, 16, 256, 4, 1024, "bf16", 0, NONE4, False, "silu", "h", False),
    (5120, 8192, 128, 256, 1, 128, "bf16", 0, NONE4, False, "silu", "h", False),
    (6144, 4096, 16, 512, 4, 1024, "bf16", 0, NONE4, False, "silu", "h", False),
    (6144, 4096, 16, 512, 4, 128, "bf16", 0, NONE4, False, "silu", "h", False),
    (6144, 4096, 1, 512, 1, 128, "bf16", 0, GPT, False, "silu", "h", False),
    (2880, 4096, 2, 512, 2, 2880, "bf16", 0, GPT, True, "swish", "h", False),
    (2880, 4096, 2, 512, 2, 2880, "bf16", 1, GPT, True, "swish", "h", False),
    (2880, 4096, 2, 256, 2, 2880, "bf16", 1, GPT, True, "swish", "h", False),
    (4096, 4096, 2, 512, 2, 384, "bf16", 0, NONE4, False, "silu", "h", False),
    (4096, 4096, 4, 512, 2, 384, "bf16", 0, NONE4, False, "silu", "h", False),
    (4096, 4096, 4, 128, 2, 384, "bf16", 0, NONE4, False, "silu", "h", False),
    (4096, 4096, 4, 256, 2, 384, "bf16", 0, NONE4, False, "silu", "h", False),
    (4096, 4096, 4, 128, 2, 1536, "bf16", 0, NONE4, False, "silu", "h", False),
    (4096, 4096, 4, 256, 2, 1536, "bf16", 0, NONE4, False, "silu", "h", False),
    (2880, 4096, 2, 128, 2, 720, "bf16", 0, GPT, True, "swish", "h", False),
    (2048, 512, 2, 256, 2, 256, "bf16", 0, NONE4, False, "squared_relu", "h", False),
    (2048, 512, 2, 256, 1, 256, "bf16", 0, NONE4, False, "squared_relu", "h", False),
    (5120, 4096, 4, 128, 1, 2048, "bf16", 0, NONE4, False, "silu", "h", False),
    (5120, 4096, 4, 256, 1, 2048, "bf16", 0, NONE4, False, "silu", "h", False),
    (4096, 4096, 4, 128, 2, 384, "bf16", 0, NONE4, False, "silu", "i", False),
    (4096, 4096, 4, 256, 2, 384, "bf16", 0, NONE4, False, "silu", "i", False),
    (4096, 4096, 4, 128, 2, 1536, "bf16", 0, NONE4, False, "silu", "i", False),
    (4096, 4096, 4, 256, 2, 1536, "bf16", 0, NONE4, False, "silu", "i", False),
    (5120, 4096, 4, 128, 1, 2048, "bf16", 0, NONE4, False, "silu", "i", False),
    (5120, 4096, 4, 256, 1, 2048, "bf16", 0, NONE4, False, "silu", "i", False),
    (2880, 4096, 2, 128, 2, 2880, "bf16", 0, GPT, True, "swish", "i", False),
    (2048, 4096, 2, 128, 2, 768, "bf16", 0, NONE4, False, "silu", "i", False),
    (2048, 4096, 2, 128, 2, 192, "bf16", 0, NONE4, False, "silu", "i", False),
    (5120, 4096, 2, 128, 2, 8192, "bf16", 0, NONE4, False, "silu", "i", False),
    (5120, 4096, 2, 128, 2, 2048, "bf16", 0, NONE4, False, "silu", "i", False),
    (2048, 4096, 2, 128, 2, 1408, "bf16", 0, NONE4, False, "silu", "i", False),
    (2048, 4096, 2, 128, 2, 352, "bf16", 0, NONE4, False, "silu", "i", False),
    (2048, 512, 2, 512, 2, 256, "bf16", 0, NONE4, False, "silu", "i", False),
    (2048, 512, 2, 512, 2, 352, "bf16", 0, NONE4, False, "silu", "i", False),
    (2048, 16384, 64, 512, 6, 352, "bf16", 0, NONE4, False, "silu", "i", False),
    (3072, 8192, 32, 1024, 6, 720, "bf16", 0, GPT, True, "swish", "i", False),
    (4096, 4096, 2, 512, 2, 384, "bf16", 0, NONE4, False, "silu", "h", False),
    (2880, 4096, 2, 512, 2, 2880, "bf16", 1, GPT, True, "swish", "h", False),
    (2048, 512, 2, 512, 2, 256, "f32", 0, NONE4, False, "silu", "i", False),
    (2048, 4096, 2, 128, 2, 768, "f32", 0, NONE4, False, "silu", "i", False),
    (2880, 4096, 2, 128, 2, 720, "f32", 0, GPT, True, "swish", "h", False),
    # mixed precision: bf16 inputs, float32 weight gradients
    (2048, 4096, 2, 128, 2, 768, "bf16", 0, NONE4, False, "silu", "i", True),
    (2880, 4096, 2, 128, 2, 720, "bf16", 0, NONE4, False, "silu", "h", True),
    (2048, 4096, 2, 128, 2, 768, "bf16", 0, NONE4, False, "silu", "i", True),
    (2880, 4096, 2, 128, 2, 720, "bf16", 0, GPT, True, "swish", "h", True),
    # the earlier version's
    (2880, 4096, 2, 1024, 2, 2880, "bf16", 0, GPT, True, "swish", "h", False),
    (2880, 4096, 32, 1024, 4, 2880, "bf16", 1, GPT, True, "swish", "h", False),
]

# CPU size: T, H, I and B shrunk by these factors (E, k and every option kept)
SHRINK_T, SHRINK_H, SHRINK_I, SHRINK_B = 32, 64, 32, 16


def bf16(a):
    """float64/float32 -> the nearest bf16 values (ties to even), as float32."""
    b = np.ascontiguousarray(np.asarray(a, np.float32)).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32)


def to_dtype(a, dtype):
    return bf16(a) if dtype == "bf16" else np.asarray(a, np.float32)


def num_blocks(T, k, E, B):
    """NKI's get_n_blocks: enough blocks for any routing, the spare ones padding blocks."""
    return math.ceil((T * k - (E - 1)) / B) + E - 1


def nki_layout(T, k, E, B, N, skip):
    """The router and the block layout NKI's helpers make: k distinct experts per token drawn with seed 0;
    blocks by expert, tokens ascending; the padding blocks given to the last expert; empty positions hold -1
    (skip) or T (padding row)."""
    np.random.seed(0)
    router = np.zeros((T, k))
    for t in range(T):
        router[t] = np.random.choice(range(E), k, replace=False)
    chosen = np.zeros((T, E))
    for j in range(k):
        chosen += router[:, j:j + 1] == np.arange(E)[None, :]
    blocks = np.ceil(chosen.sum(0) / B).astype(np.int64)
    blocks[E - 1] += N - blocks.sum()
    block_to_expert = np.repeat(np.arange(E), blocks).astype(np.int32)
    first = np.concatenate([[0], np.cumsum(blocks)[:-1]]) * B  # the first position of each expert
    tpti = np.full(N * B, -1 if skip else T, np.int64)
    for e in range(E):
        tokens = np.nonzero(chosen[:, e])[0]
        tpti[first[e]:first[e] + len(tokens)] = tokens
    return chosen, tpti.astype(np.int32), block_to_expert


def act(name, x):
    return x / (1 + np.exp(-x)) if name == "silu" else x / (1 + np.exp(-1.702 * x))


def dact(name, x):
    c = 1.0 if name == "silu" else 1.702
    s = 1 / (1 + np.exp(-c * x))
    return s * (1 + c * x * (1 - s))


def clamp_masks(v, lo, hi):
    """1 where the backward passes the gradient: strictly inside the set limits."""
    m = np.ones_like(v)
    if lo is not None:
        m *= v > lo
    if hi is not None:
        m *= v < hi
    return m


def forward64(inp, cfg):
    """out, the gate/up values after bias and clamp (per position), d (per position), in float64."""
    x, A, wgu, wd, bgu, bd, tpti, b2e = (inp[k] for k in ("x", "A", "wgu", "wd", "bgu", "bd", "tpti", "b2e"))
    T, E, B, H, I = cfg["T"], cfg["E"], cfg["B"], cfg["H"], cfg["I"]
    lin_hi, lin_lo, nl_hi, nl_lo = cfg["clamp"]
    N = len(b2e)
    out = np.zeros((x.shape[0], H))
    gu = np.zeros((N, 2, I, B))
    d_all = np.zeros((N, B, H))
    for n in range(N):
        e = b2e[n]
        for b in range(B):
            t = tpti[n * B + b]
            if t < 0 or t >= T:
                continue
            g = x[t] @ wgu[e, :, 0, :] + (bgu[e, 0] if bgu is not None else 0)
            u = x[t] @ wgu[e, :, 1, :] + (bgu[e, 1] if bgu is not None else 0)
            g = np.clip(g, nl_lo, nl_hi) if (nl_lo is not None or nl_hi is not None) else g
            u = np.clip(u, lin_lo, lin_hi) if (lin_lo is not None or lin_hi is not None) else u
            gu[n, 0, :, b], gu[n, 1, :, b] = g, u
            d = (act(cfg["act"], g) * u) @ wd[e] + (bd[e] if bd is not None else 0)
            d_all[n, b] = d
            out[t] += A[t, e] * d
    return out, gu, d_all


def backward64(inp, cfg, ckpt_gu, ckpt_d):
    """Every gradient from the given checkpoints, in float64 (d recomputed from ckpt_gu when ckpt_d is None)."""
    x, A, G, wgu, wd, bd, tpti, b2e = (inp[k] for k in ("x", "A", "G", "wgu", "wd", "bd", "tpti", "b2e"))
    T, E, B, H, I = cfg["T"], cfg["E"], cfg["B"], cfg["H"], cfg["I"]
    lin_hi, lin_lo, nl_hi, nl_lo = cfg["clamp"]
    dx, dA = np.zeros(x.shape), np.zeros(A.shape)
    dwgu, dwd = np.zeros(wgu.shape), np.zeros(wd.shape)
    dbgu, dbd = np.zeros((E, 2, I)), np.zeros((E, H))
    for n in range(len(b2e)):
        e = b2e[n]
        for b in range(B):
            t = tpti[n * B + b]
            if t < 0 or t >= T:
                continue
            g, u = ckpt_gu[n, 0, :, b], ckpt_gu[n, 1, :, b]
            m = act(cfg["act"], g) * u
            d = ckpt_d[n, b] if ckpt_d is not None else m @ wd[e] + (bd[e] if bd is not None else 0)
            a = A[t, e]
            dA[t, e] = G[t] @ d
            dm = a * (wd[e] @ G[t])
            dg = dm * u * dact(cfg["act"], g) * clamp_masks(g, nl_lo, nl_hi)
            du = dm * act(cfg["act"], g) * clamp_masks(u, lin_lo, lin_hi)
            dwd[e] += np.outer(m, a * G[t])
            dbd[e] += a * G[t]
            dwgu[e, :, 0, :] += np.outer(x[t], dg)
            dwgu[e, :, 1, :] += np.outer(x[t], du)
            dbgu[e, 0] += dg
            dbgu[e, 1] += du
            dx[t] += wgu[e, :, 0, :] @ dg + wgu[e, :, 1, :] @ du
    return dx, dA, dwgu, dwd, dbgu, dbd


def save(folder, name, a):
    os.makedirs(folder, exist_ok=True)
    np.save(os.path.join(folder, name + ".npy"), a)


def make_case(root, nki, skip):
    H0, T0, E, B0, k, I0, dtype, _, clamp, bias, act_name, aff, grad_fp32 = nki
    T, H, I, B = T0 // SHRINK_T, max(2, H0 // SHRINK_H), max(2, I0 // SHRINK_I), max(2, B0 // SHRINK_B)
    N = num_blocks(T, k, E, B)
    cfg = {"T": T, "E": E, "B": B, "H": H, "I": I, "clamp": clamp, "act": act_name}
    chosen, tpti, b2e = nki_layout(T, k, E, B, N, skip)
    # NKI's seed per configuration, its value ranges, its padding row
    key = f"{T}_{k}_{B}_{E}_{I}_{H}_{bool(skip)}"
    np.random.seed(int(hashlib.sha256(key.encode()).hexdigest(), 16) % (2 ** 32))
    wd = to_dtype(np.random.uniform(-0.1, 0.1, size=[E, I, H]), dtype)
    wgu = to_dtype(np.random.uniform(-0.1, 0.1, size=[E, H, 2, I]), dtype)
    bd = bgu = None
    if bias:
        bd = to_dtype(np.random.uniform(-0.1, 0.1, size=[E, H]), dtype)
        bgu = to_dtype(np.random.uniform(-0.1, 0.1, size=[E, 2, I]), dtype)
    T1 = T if skip else T + 1
    A = np.random.random_sample([T1, E])
    A[:T] *= chosen
    A[T:] = 0
    x = np.random.random_sample([T1, H])
    G = np.random.uniform(-1.0, 1.0, size=[T1, H])
    x[T:] = 0
    G[T:] = 0
    A, x, G = to_dtype(A, dtype), to_dtype(x, dtype), to_dtype(G, dtype)
    f64 = lambda a: None if a is None else a.astype(np.float64)
    inp = {"x": f64(x), "A": f64(A), "G": f64(G), "wgu": f64(wgu), "wd": f64(wd), "bgu": f64(bgu), "bd": f64(bd),
           "tpti": tpti.astype(np.int64), "b2e": b2e.astype(np.int64)}
    out, gu, d = forward64(inp, cfg)
    # the checkpoints NKI's helper hands the backward: the forward's, in the dtype (none for d with the
    # affinity on I)
    ckpt_gu = to_dtype(gu, dtype)
    ckpt_d = to_dtype(d, dtype) if aff == "h" else None
    dx, dA, dwgu, dwd, dbgu, dbd = backward64(inp, cfg, f64(ckpt_gu), f64(ckpt_d))

    name = (f"{len(os.listdir(root)):02d}_H{H}_T{T}_E{E}_B{B}_k{k}_I{I}_{dtype}_{'skip' if skip else 'row'}"
            f"_{act_name}_{aff}{'_clamp' if clamp != NONE4 else ''}{'_bias' if bias else ''}"
            f"{'_gradfp32' if grad_fp32 else ''}")
    case = os.path.join(root, name)
    f32 = lambda a: np.asarray(a, np.float32)
    ins = {"hidden_states": x, "expert_affinities_masked": A.reshape(-1, 1), "gate_up_proj_weight": wgu,
           "down_proj_weight": wd, "token_position_to_id": tpti, "block_to_expert": b2e,
           "output_hidden_states_grad": G, "gate_up_proj_act_checkpoint_T": ckpt_gu}
    if ckpt_d is not None:
        ins["down_proj_act_checkpoint"] = ckpt_d
    if bias:
        ins["gate_up_proj_bias"], ins["down_proj_bias"] = bgu, bd
    for k_, a in ins.items():
        save(os.path.join(case, "in"), k_, a if a.dtype.kind == "i" else f32(a))
    for k_, a in {"output": out, "gate_up_proj_act_checkpoint_T": gu, "down_proj_act_checkpoint": d}.items():
        save(os.path.join(case, "golden_fwd"), k_, a)
    bwd = {"hidden_states_grad": dx, "expert_affinities_masked_grad": dA.reshape(-1, 1),
           "gate_up_proj_weight_grad": dwgu, "down_proj_weight_grad": dwd}
    if bias:
        bwd["gate_up_proj_bias_grad"], bwd["down_proj_bias_grad"] = dbgu, dbd
    for k_, a in bwd.items():
        save(os.path.join(case, "golden_bwd"), k_, a)
    lin_hi, lin_lo, nl_hi, nl_lo = clamp
    text = lambda v: "" if v is None else repr(float(v))
    flags = [f"--dtype {dtype}", f"--padding {'skip' if skip else 'row'}", f"--block-size {B}",
             f"--activation {act_name}", f"--affinity-on {aff}"]
    if clamp != NONE4:
        flags.append(f"--clamp {text(nl_lo)},{text(nl_hi)},{text(lin_lo)},{text(lin_hi)}")
    if bias:
        flags.append("--bias")
    if k == 1:
        flags.append("--no-accumulate")  # NKI: is_tensor_update_accumulating = top_k != 1
    if dtype != "f32":
        flags.append("--intermediates rounded")  # what NKI computes (the default, spelled out)
    bwd_flags = ["--grad-fp32"] if grad_fp32 else []
    with open(os.path.join(case, "flags"), "w") as f:
        f.write(" ".join(flags) + "\n")
    with open(os.path.join(case, "bwd_flags"), "w") as f:
        f.write(" ".join(bwd_flags) + "\n")
    return name


def main():
    root = sys.argv[1]
    os.makedirs(root, exist_ok=True)
    names, skipped, seen = [], [], set()
    for nki in NKI_TESTS:
        if nki[10] == "squared_relu":
            skipped.append(f"{nki}: libmoe has no squared-ReLU activation")
            continue
        for skip in (0, 1):  # both padding conventions, whichever the configuration names
            shrunk = (nki[0] // SHRINK_H, nki[1] // SHRINK_T, nki[2], nki[3] // SHRINK_B, nki[4], nki[5] // SHRINK_I) \
                + tuple(nki[6:7]) + tuple(nki[8:]) + (skip,)
            if shrunk in seen:  # the same case at CPU size (NKI lists some twice, or differing in blocking only)
                continue
            seen.add(shrunk)
            names.append(make_case(root, nki, skip))
    with open(os.path.join(root, "cases"), "w") as f:
        f.write("".join(n + "\n" for n in names))
    with open(os.path.join(root, "skipped"), "w") as f:
        f.write("".join(s + "\n" for s in skipped))


if __name__ == "__main__":
    main()
