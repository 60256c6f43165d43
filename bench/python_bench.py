#!/usr/bin/env python3
"""The Python package's cost on a GPU: (1) each grouped GEMM op of the ANCHORS.md shapes through libmoe's
Python entry (the op torch calls: libmoe.grouped_gemm for fwd, the backward op for dX and dW), through bare
ctypes calls of the C entry it calls, and of the C entry moe-bench calls, on the same tensors (moe-bench's
distribution, uniform in [-1, 1)), timed interleaved as bench/moe-bench times the C calls (bench/peers.py's
interleaved_timer: L2 flushed before each timed call, CUDA events around the call alone, no host wait between
calls; median of --repeat), beside moe-bench's own numbers when its CSV is given (--c-csv, from `moe-bench
--libmoe-only --csv FILE` on the same machine), with the host time one call takes to enqueue and how many
timed calls were still pending when the host had enqueued them all (the host ahead of the GPU: its time
before a launch is hidden); (2) one MoE layer's forward + backward
on an mlp-gpu-time shape, bf16: libmoe.moe_mlp on a prebuilt layout and libmoe.MoEExperts (layout built in
the step) against bench/peers.py's eager PyTorch MoE MLP on torch._grouped_mm (its expert order prebuilt).

usage: python3 bench/python_bench.py [--tokens T] [--repeat R] [--shapes all|qwen3|mixtral|deepseek]
                                     [--c-csv FILE] [--layer NAME|none]
Needs torch with CUDA and libmoe built with CUDA (LIBMOE_PATH, or run from the build tree)."""
import argparse
import csv
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import libmoe  # noqa: E402
import peers  # noqa: E402
import python_host  # noqa: E402
from libmoe import _capi, _ops  # noqa: E402


def host_us(fn):
    """Host microseconds per call to enqueue fn() (the device runs behind; waits outside the timed span)."""
    return python_host.host_us(fn, 50, sync=torch.cuda.synchronize)


def gemm_rows(c_rows, shapes, T, time_medians):
    """Each op timed three ways on the same tensors, interleaved (peers.interleaved_timer): the Python entry,
    the C entry it calls through bare ctypes, and the C entry moe-bench calls (moe_gemm_dx / moe_gemm_dw
    with moe-bench's routing struct) through bare ctypes; beside moe-bench's own number (another process,
    its own data and routing)."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    print("TFLOP/s (2 M N K over the median time); py: the Python entry; same: its C call (moe_gemm_fwd or "
          "moe_gemm_bwd with dx_only / dw_only) through bare ctypes; bench: moe-bench's C call (moe_gemm_fwd, "
          "moe_gemm_dx, moe_gemm_dw) through bare ctypes; C: moe-bench's CSV; host us: enqueue time per call; "
          "pending: timed calls unfinished when the host had enqueued all %d" % (3 * time_medians.repeat))
    print("%-14s %-8s %-4s %6s %6s %6s | %7s %7s %7s %7s | %7s %7s | %7s %7s | %7s" % (
        "model", "gemm", "op", "M", "N", "K", "py", "same", "bench", "C", "py/same", "py/C", "py us", "same us",
        "pending"))
    for model, gemm, E, k, N, K in shapes:
        M = T * k
        _, _, m_sizes = peers.routing(torch, gen, T, E, k)
        # moe-bench's distribution: uniform in [-1, 1)
        x = torch.rand((M, K), generator=gen, device="cuda").mul_(2).sub_(1).bfloat16()
        w = torch.rand((E, N, K), generator=gen, device="cuda").mul_(2).sub_(1).bfloat16()
        dy = torch.rand((M, N), generator=gen, device="cuda").mul_(2).sub_(1).bfloat16()
        for op in ("fwd", "dx", "dw"):
            if op == "fwd":
                def call():
                    with torch.no_grad():
                        return libmoe.grouped_gemm(x, w, m_sizes)
            else:
                def call(need_dx=op == "dx"):
                    return _ops.gemm_bwd(x, w, dy, m_sizes, None, None, 1, False, False, False, need_dx, not need_dx,
                                         False)
            same = bare_call(op, False, x, w, dy, m_sizes, T, k, E, N, K)
            bench = bare_call(op, True, x, w, dy, m_sizes, T, k, E, N, K)
            ms = time_medians([call, same, bench])
            py, py_same, py_bench = (2.0 * M * N * K / (t * 1e-3) / 1e12 for t in ms)
            c = c_rows.get((model, gemm, op))
            print("%-14s %-8s %-4s %6d %6d %6d | %7.1f %7.1f %7.1f %7s | %7.3f %7s | %7.1f %7.1f | %7d" % (
                model, gemm, op, M, N, K, py, py_same, py_bench, "%.1f" % c if c else "-", py / py_same,
                "%.3f" % (py / c) if c else "-", host_us(call), host_us(same), time_medians.pending))
            sys.stdout.flush()


def bare_call(op, as_moe_bench, x, w, dy, m_sizes, T, k, E, N, K):
    """The C call alone through ctypes, its arguments made once (the floor of any Python entry): the call the
    Python entry makes (moe_gemm_fwd, or moe_gemm_bwd with dx_only / dw_only; routing (T k, 1, E), as
    grouped_gemm with topk = 1 builds it), or, as_moe_bench, the call moe-bench makes (moe_gemm_fwd,
    moe_gemm_dx, moe_gemm_dw; routing (T, k, E))."""
    import ctypes  # pylint: disable=import-outside-toplevel
    routing = _capi.Routing(T, k, E, m_sizes.data_ptr(), None) if as_moe_bench else \
        _capi.Routing(T * k, 1, E, m_sizes.data_ptr(), None)
    opts = _capi.GemmOptions(dtype=_capi.MOE_BF16, stream=torch.cuda.current_stream().cuda_stream)
    out = torch.empty({"fwd": (T * k, N), "dx": (T * k, K), "dw": (E, N, K)}[op], dtype=torch.bfloat16,
                      device="cuda")
    lib = _capi.lib()
    for name in ("moe_gemm_dx", "moe_gemm_dw"):   # not called by the package, so not declared by _capi: the
        fn = getattr(lib, name)                    # prototype of moe_gemm_fwd, whose arguments have the same types
        fn.restype, fn.argtypes = _capi.PROTOTYPES["moe_gemm_fwd"]
    cuda, r, o = _capi.MOE_BACKEND_CUDA, ctypes.byref(routing), ctypes.byref(opts)
    if op == "fwd":
        fn, args = lib.moe_gemm_fwd, (cuda, r, N, K, x.data_ptr(), w.data_ptr(), None, out.data_ptr(), o)
    elif as_moe_bench:
        fn, args = ((lib.moe_gemm_dx, (cuda, r, N, K, dy.data_ptr(), w.data_ptr(), None, out.data_ptr(), o))
                    if op == "dx" else
                    (lib.moe_gemm_dw, (cuda, r, N, K, x.data_ptr(), dy.data_ptr(), None, out.data_ptr(), o)))
    else:
        opts.dx_only, opts.dw_only = int(op == "dx"), int(op == "dw")
        fn, args = lib.moe_gemm_bwd, (cuda, r, N, K, x.data_ptr(), w.data_ptr(), dy.data_ptr(), None,
                                      out.data_ptr() if op == "dx" else None, out.data_ptr() if op == "dw" else None,
                                      None, o)
    keep = (routing, opts, out)

    def call(keep=keep):
        if fn(*args) != 0:
            raise RuntimeError(_capi.lib().moe_last_error().decode())
    return call


def layer_step(name, time_median):
    """Forward + backward of one MoE layer of mlp-gpu-time's shape `name` (bench/peers.py's MLP_SHAPES)."""
    import torch.nn.functional as F  # pylint: disable=import-outside-toplevel
    T, E, k, H, I = peers.MLP_SHAPES[name]
    gen = torch.Generator(device="cuda").manual_seed(2)
    ids, order, counts = peers.routing(torch, gen, T, E, k)
    weights = torch.rand(T, k, generator=gen, device="cuda").to(torch.bfloat16)
    x = torch.randn(T, H, generator=gen, device="cuda").to(torch.bfloat16).requires_grad_()
    grad = torch.randn(T, H, generator=gen, device="cuda").to(torch.bfloat16)
    layer = libmoe.MoEExperts(E, H, I, dtype=torch.bfloat16, device="cuda")
    ids = ids.contiguous()  # peers.routing gives a view
    layout = libmoe.mlp_layout(ids, E, layer.block_size, weights)
    affinities = layout.affinities.clone().requires_grad_()
    # the eager peer on the same weights, in nn.Linear's layout, its expert order prebuilt
    eager = peers.eager_mlp(torch, F)
    w_gu_nk = layer.w_gu.detach().permute(0, 2, 3, 1).reshape(E, 2 * I, H).contiguous().requires_grad_()
    w_d_nk = layer.w_d.detach().transpose(1, 2).contiguous().requires_grad_()
    tokens, offs = order // k, peers.offsets(torch, counts)
    a = weights.reshape(-1)[order].clone().requires_grad_()
    steps = {
        "libmoe.moe_mlp": lambda: libmoe.moe_mlp(x, affinities, layer.w_gu, layer.w_d, layout).backward(grad),
        "libmoe.MoEExperts": lambda: layer(x, ids, weights).backward(grad),
        "eager torch._grouped_mm": lambda: eager(x, a, w_gu_nk, w_d_nk, tokens, offs).backward(grad),
    }
    flops = 18.0 * T * k * H * I   # forward 6 T k H I, backward 12 T k H I
    print("\nMoE layer forward + backward, %s (T=%d E=%d k=%d H=%d I=%d), bf16, median ms and TFLOP/s of 18 T k H I:"
          % (name, T, E, k, H, I))
    for label, fn in steps.items():
        ms = time_median(fn)
        print("  %-24s %8.3f ms %7.1f TFLOP/s" % (label, ms, flops / (ms * 1e-3) / 1e12), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--shapes", default="all")
    ap.add_argument("--c-csv", help="moe-bench --libmoe-only --csv FILE of the same machine")
    ap.add_argument("--layer", default="qwen3-t4096", help="%s or none" % ", ".join(peers.MLP_SHAPES))
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
    shapes = [s for s in peers.GEMM_SHAPES if args.shapes == "all" or s[0].startswith(args.shapes)]
    time_medians = peers.interleaved_timer(torch, args.repeat)
    gemm_rows(c_rows, shapes, args.tokens, time_medians)
    if args.layer != "none":
        layer_step(args.layer, peers.timer(torch, args.repeat))
    return 0


if __name__ == "__main__":
    sys.exit(main())
