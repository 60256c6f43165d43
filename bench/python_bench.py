#!/usr/bin/env python3
"""The Python package's cost on a GPU: (1) each grouped GEMM op of the ANCHORS.md shapes through libmoe's
Python entry (the op torch calls: libmoe.grouped_gemm for fwd, the backward op for dX and dW), timed as
bench/moe-bench times the C calls (triton.testing.do_bench's method: a 256 MB memset evicts L2 before each
timed call, CUDA events around the call alone, no host wait between calls; median of --repeat), beside
moe-bench's own numbers when its CSV is given (--c-csv, from `moe-bench --libmoe-only --csv FILE` on the same
machine), and the host time one call takes to enqueue (Python entry, and the bare ctypes call);
(2) one MoE layer's forward + backward step (router output given: ids and weights) with libmoe.MoEExperts
against the same layer in eager PyTorch on torch._grouped_mm (gather, gate/up, SiLU * up, down, weights,
scatter-add), both bf16, same method.

usage: python3 bench/python_bench.py [--tokens T] [--repeat R] [--shapes all|qwen3|mixtral|deepseek]
                                     [--c-csv FILE] [--layer MODEL|none] [--layer-tokens T]
Needs torch with CUDA and libmoe built with CUDA (LIBMOE_PATH, or run from the build tree)."""
import argparse
import csv
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch  # noqa: E402

import libmoe  # noqa: E402
from libmoe import _capi, _ops  # noqa: E402

SHAPES = [  # bench/moe_bench.c's table: model, gemm, E, k, N, K
    ("qwen3-30b-a3b", "gate_up", 128, 8, 1536, 2048),
    ("qwen3-30b-a3b", "down", 128, 8, 2048, 768),
    ("mixtral-8x7b", "gate_up", 8, 2, 28672, 4096),
    ("mixtral-8x7b", "down", 8, 2, 4096, 14336),
    ("deepseek-v3", "gate_up", 256, 8, 4096, 7168),
]
LAYERS = {"qwen3-30b-a3b": (128, 8, 2048, 768), "mixtral-8x7b": (8, 2, 4096, 14336)}   # E, k, H, I


def do_bench(fn, repeat):
    """Median milliseconds of fn() by triton.testing.do_bench's method (moe_bench.c's time_median)."""
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeat)]
    for start, end in events:
        flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


def host_us(fn, calls=50):
    """Host microseconds per call to enqueue fn() (the device runs behind; one wait at the end)."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def uniform_routing(T, k, E, gen):
    scores = torch.rand((T, E), generator=gen, device="cuda")
    return torch.topk(scores, k, dim=1).indices


def gemm_rows(c_rows, shapes, T, repeat):
    gen = torch.Generator(device="cuda").manual_seed(1)
    print("%-14s %-8s %-4s %6s %6s %6s | %9s %9s %7s | %8s %8s" % (
        "model", "gemm", "op", "M", "N", "K", "py TF/s", "C TF/s", "py/C", "py us", "ctypes us"))
    for model, gemm, E, k, N, K in shapes:
        M = T * k
        ids = uniform_routing(T, k, E, gen)
        m_sizes, _, _ = libmoe.routing_from_topk(ids, E)
        x = torch.rand((M, K), generator=gen, device="cuda").sub_(0.5).bfloat16()
        w = torch.rand((E, N, K), generator=gen, device="cuda").sub_(0.5).bfloat16()
        dy = torch.rand((M, N), generator=gen, device="cuda").sub_(0.5).bfloat16()
        for op in ("fwd", "dx", "dw"):
            if op == "fwd":
                def call():
                    with torch.no_grad():
                        return libmoe.grouped_gemm(x, w, m_sizes)
                bare = bare_call("moe_gemm_fwd", x, w, dy, m_sizes, T, k, E, N, K, op)
            else:
                need_dx = op == "dx"

                def call(need_dx=need_dx):
                    return _ops.gemm_bwd(x, w, dy, m_sizes, None, None, 1, False, False, False, need_dx, not need_dx,
                                         False)
                bare = bare_call("moe_gemm_bwd", x, w, dy, m_sizes, T, k, E, N, K, op)
            ms = do_bench(call, repeat)
            tflops = 2.0 * M * N * K / (ms * 1e-3) / 1e12
            c = c_rows.get((model, gemm, op))
            ratio = "%7.3f" % (tflops / c) if c else "      -"
            print("%-14s %-8s %-4s %6d %6d %6d | %9.1f %9s %7s | %8.1f %8.1f" % (
                model, gemm, op, M, N, K, tflops, "%.1f" % c if c else "-", ratio, host_us(call), host_us(bare)))
            sys.stdout.flush()


def bare_call(name, x, w, dy, m_sizes, T, k, E, N, K, op):
    """The C call alone through ctypes, its arguments made once (the floor of any Python entry)."""
    import ctypes  # pylint: disable=import-outside-toplevel
    routing = _capi.Routing(T * k, 1, E, m_sizes.data_ptr(), None)
    opts = _capi.GemmOptions(dtype=_capi.MOE_BF16, stream=torch.cuda.current_stream().cuda_stream)
    out_fwd = torch.empty((T * k, N), dtype=torch.bfloat16, device="cuda")
    out_dx = torch.empty((T * k, K), dtype=torch.bfloat16, device="cuda")
    out_dw = torch.empty((E, N, K), dtype=torch.bfloat16, device="cuda")
    fn = getattr(_capi.lib(), name)
    if op == "fwd":
        args = (_capi.MOE_BACKEND_CUDA, ctypes.byref(routing), N, K, x.data_ptr(), w.data_ptr(), None,
                out_fwd.data_ptr(), ctypes.byref(opts))
    else:
        opts.dx_only, opts.dw_only = int(op == "dx"), int(op == "dw")
        args = (_capi.MOE_BACKEND_CUDA, ctypes.byref(routing), N, K, x.data_ptr(), w.data_ptr(), dy.data_ptr(), None,
                out_dx.data_ptr() if op == "dx" else None, out_dw.data_ptr() if op == "dw" else None, None,
                ctypes.byref(opts))
    keep = (routing, opts, out_fwd, out_dx, out_dw)

    def call(keep=keep):
        if fn(*args) != 0:
            raise RuntimeError(_capi.lib().moe_last_error().decode())
    return call


def torch_layer(x, ids, weights, w_gu_nk, w_d_nk):
    """The MoE expert layer in eager PyTorch on torch._grouped_mm: w_gu_nk [E, 2I, H] and w_d_nk [E, H, I]
    (nn.Linear layout), passed transposed as _grouped_mm's [E, K, N]; no host synchronisation."""
    T, k = ids.shape
    E = w_gu_nk.shape[0]
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(E, dtype=torch.int64, device=x.device).index_add_(0, flat, torch.ones_like(flat))
    offs = torch.cumsum(counts, 0).to(torch.int32)
    token = order // k
    gu = torch._grouped_mm(x[token], w_gu_nk.transpose(-2, -1), offs=offs)  # pylint: disable=protected-access
    g, u = gu.chunk(2, dim=-1)
    d = torch._grouped_mm(torch.nn.functional.silu(g) * u, w_d_nk.transpose(-2, -1), offs=offs)  # noqa
    d = d * weights.reshape(-1)[order].unsqueeze(1)
    return torch.zeros_like(x).index_add_(0, token, d)


def layer_step(model, T, repeat):
    E, k, H, I = LAYERS[model]
    gen = torch.Generator(device="cuda").manual_seed(2)
    ids = uniform_routing(T, k, E, gen)
    weights = torch.rand((T, k), generator=gen, device="cuda").bfloat16()
    x = torch.randn((T, H), generator=gen, device="cuda").bfloat16().requires_grad_()
    grad = torch.randn((T, H), generator=gen, device="cuda").bfloat16()
    layer = libmoe.MoEExperts(E, H, I, dtype=torch.bfloat16, device="cuda")
    w_gu_nk = layer.w_gu.detach().permute(0, 2, 3, 1).reshape(E, 2 * I, H).contiguous().requires_grad_()
    w_d_nk = layer.w_d.detach().transpose(1, 2).contiguous().requires_grad_()
    flops = 18.0 * T * k * H * I   # forward 6 T k H I, backward 12 T k H I

    def ours():
        layer(x, ids, weights).backward(grad)

    def theirs():
        torch_layer(x, ids, weights, w_gu_nk, w_d_nk).backward(grad)
    print("\nMoE layer forward + backward, %s, T = %d, bf16 (median of %d, ms and TFLOP/s of 18 T k H I):"
          % (model, T, repeat))
    for name, fn in (("libmoe.MoEExperts", ours), ("eager torch._grouped_mm", theirs)):
        try:
            ms = do_bench(fn, repeat)
            print("  %-24s %8.3f ms %7.1f TFLOP/s" % (name, ms, flops / (ms * 1e-3) / 1e12))
        except (RuntimeError, AttributeError) as err:
            print("  %-24s failed: %s" % (name, str(err).split("\n")[0]))
        sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--shapes", default="all")
    ap.add_argument("--c-csv", help="moe-bench --libmoe-only --csv FILE of the same machine")
    ap.add_argument("--layer", default="qwen3-30b-a3b", help="%s or none" % ", ".join(LAYERS))
    ap.add_argument("--layer-tokens", type=int, default=4096)
    args = ap.parse_args()
    if not (torch.cuda.is_available() and libmoe.cuda_available()):
        print("python_bench: needs torch with CUDA and a CUDA build of libmoe")
        return 77
    print("device: %s; torch %s; libmoe %s" % (torch.cuda.get_device_name(), torch.__version__, libmoe.library_path()))
    c_rows = {}
    if args.c_csv:
        with open(args.c_csv, newline="") as f:
            for row in csv.DictReader(f):
                c_rows[(row["model"], row["gemm"], row["op"])] = float(row["libmoe_tflops"])
    shapes = [s for s in SHAPES if args.shapes == "all" or s[0].startswith(args.shapes)]
    gemm_rows(c_rows, shapes, args.tokens, args.repeat)
    if args.layer != "none":
        layer_step(args.layer, args.layer_tokens, args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
