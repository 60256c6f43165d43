#!/usr/bin/env python3
"""The peers of libmoe's CUDA kernels, timed in PyTorch on the shapes of moe-bench and mlp-gpu-time.

  grouped GEMM  torch._grouped_mm (CUTLASS) fwd, dX and dW on ANCHORS.md's five GEMM shapes (bf16,
                T tokens, uniformly random distinct top-k routing, expert order); dW's group sizes
                rounded down to multiples of 8, which torch._grouped_mm needs there (ANCHORS.md)
  MoE MLP       an eager PyTorch MoE MLP on torch._grouped_mm with autograd (gather into expert order,
                gate/up GEMM, SiLU(g) * u, down GEMM, affinity on H, index_add back), forward and
                forward + backward, on mlp-gpu-time's shapes

Timing as bench/moe_bench.c and triton.testing.do_bench: CUDA events, warm-up, L2 flushed (a 256 MiB
buffer rewritten) before each run, the median of --repeat runs. TFLOP/s: 2 M N K for a GEMM (M = T k),
6 T k I H for the MLP forward and 12 T k I H for its backward (the backward's time is the forward +
backward time less the forward's). The peers' outputs are checked finite, and the MLP's down rows (before
the affinity) against float32 math on 8 sampled rows (relative difference <= 0.05), so that no time of a
wrong or empty computation is reported. bench/peer-table.py puts these beside libmoe's numbers.

usage: bench/peers.py [--tokens T] [--repeat R] [--gemm-csv FILE] [--mlp-csv FILE] [--skip-mlp]
       [--skip-gemm] [--mlp-shapes NAME,...]
Exit status: 0, 1 when a check fails, 77 without torch, CUDA or torch._grouped_mm.
"""
import argparse
import statistics
import sys

GEMM_SHAPES = [  # bench/moe_bench.c's table: (model, gemm, E, k, N, K)
    ("qwen3-30b-a3b", "gate_up", 128, 8, 1536, 2048),
    ("qwen3-30b-a3b", "down", 128, 8, 2048, 768),
    ("mixtral-8x7b", "gate_up", 8, 2, 28672, 4096),
    ("mixtral-8x7b", "down", 8, 2, 4096, 14336),
    ("deepseek-v3", "gate_up", 256, 8, 4096, 7168),
]
MLP_SHAPES = {  # name: (T, E, k, H, I), as bench/device-peers.sh passes them to mlp-gpu-time
    "qwen3-t4096": (4096, 128, 8, 2048, 768),
    "qwen3-t16384": (16384, 128, 8, 2048, 768),
    "mixtral-t4096": (4096, 8, 2, 4096, 14336),
    "gpt-oss-t4096": (4096, 128, 4, 2880, 2880),
    "e128k8-i512-t32768": (32768, 128, 8, 4096, 512),
}


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    return 1


def timer(torch, repeat):
    """time_median(fn): the median milliseconds of fn() (see time_medians)."""
    time_medians = interleaved_timer(torch, repeat)
    return lambda fn: time_medians([fn])[0]


def interleaved_timer(torch, repeat):
    """time_medians(fns): the median milliseconds of each fn() in fns, as moe-bench times a call: three warm-up
    calls of each, then `repeat` rounds, each timing every fn in turn: the L2 flushed (a 256 MiB buffer
    rewritten), CUDA events around the call alone, no host wait between calls.  Interleaving puts the fns
    under the same conditions (clocks, temperature).  time_medians.repeat is `repeat`; time_medians.pending,
    after a call: how many of the
    timed calls the GPU had not finished when the host had enqueued them all (near the count of calls: the
    host ran ahead of the GPU, so the host time a call takes before its launch never held the GPU up)."""
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    def time_medians(fns):
        for fn in fns:
            for _ in range(3):
                fn()
        starts = [[torch.cuda.Event(enable_timing=True) for _ in range(repeat)] for _ in fns]
        stops = [[torch.cuda.Event(enable_timing=True) for _ in range(repeat)] for _ in fns]
        for i in range(repeat):
            for j, fn in enumerate(fns):
                flush.fill_(i & 0xFF)
                starts[j][i].record()
                fn()
                stops[j][i].record()
        time_medians.pending = sum(not e.query() for row in stops for e in row)
        torch.cuda.synchronize()
        return [statistics.median(s.elapsed_time(e) for s, e in zip(row_s, row_e))
                for row_s, row_e in zip(starts, stops)]

    time_medians.pending, time_medians.repeat = 0, repeat
    return time_medians


def routing(torch, gen, T, E, k):
    """k distinct experts per token, uniformly at random; the rows in expert order (stable)."""
    ids = torch.rand(T, E, generator=gen, device="cuda").argsort(dim=1)[:, :k]
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=E)
    return ids, order, counts


def offsets(torch, counts):
    return torch.cumsum(counts, 0).to(torch.int32)


def bench_gemm(torch, args, time_median, writer):
    status = 0
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    T = args.tokens
    for model, gemm, E, k, N, K in GEMM_SHAPES:
        _, _, counts = routing(torch, gen, T, E, k)
        M = T * k
        x = torch.randn(M, K, generator=gen, device="cuda").to(torch.bfloat16)
        w = (torch.randn(E, N, K, generator=gen, device="cuda") / K ** 0.5).to(torch.bfloat16)
        dy = torch.randn(M, N, generator=gen, device="cuda").to(torch.bfloat16)
        offs = offsets(torch, counts)
        # dW: every group a multiple of 8 rows (torch._grouped_mm's rule there), the rest left out
        counts8 = counts // 8 * 8
        offs8 = offsets(torch, counts8)
        M8 = int(counts8.sum())
        ops = {
            "fwd": (lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs), M),
            "dx": (lambda: torch._grouped_mm(dy, w, offs=offs), M),
            "dw": (lambda: torch._grouped_mm(dy[:M8].t(), x[:M8], offs=offs8), M8),
        }
        for op, (fn, rows) in ops.items():
            out = fn()
            if not bool(torch.isfinite(out).all()):
                status = fail(f"torch._grouped_mm {model} {gemm} {op}: non-finite output")
                continue
            ms = time_median(fn)
            tflops = 2.0 * rows * N * K / (ms * 1e-3) / 1e12
            print(f"{model:14s} {gemm:8s} {op:4s} M={rows:6d} N={N:6d} K={K:6d}  torch._grouped_mm "
                  f"{ms:8.3f} ms {tflops:7.1f} TFLOP/s", flush=True)
            writer.append(f"{model},{gemm},{op},{rows},{N},{K},{tflops:.1f}")
        del x, w, dy
        torch.cuda.empty_cache()
    return status


def eager_mlp(torch, F):
    """The MoE MLP as a PyTorch user writes it: x (T, H), gate/up (E, 2I, H), down (E, H, I)."""

    def down_rows(x, w_gu, w_d, tokens, offs):
        """d = (SiLU(g) * u) . W_d per row of expert order"""
        xs = x[tokens]                                                   # gather into expert order
        gu = torch._grouped_mm(xs, w_gu.transpose(-2, -1), offs=offs)   # (M, 2I)
        g, u = gu.chunk(2, dim=-1)
        return torch._grouped_mm(F.silu(g) * u, w_d.transpose(-2, -1), offs=offs)  # (M, H)

    def forward(x, a, w_gu, w_d, tokens, offs):
        d = down_rows(x, w_gu, w_d, tokens, offs)
        return torch.zeros_like(x).index_add(0, tokens, d * a[:, None])

    forward.down_rows = down_rows
    return forward


def bench_mlp(torch, args, time_median, writer):
    import torch.nn.functional as F
    status = 0
    forward = eager_mlp(torch, F)
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    for name in args.mlp_shapes.split(","):
        if name not in MLP_SHAPES:
            return fail(f"--mlp-shapes: unknown shape {name}; known: {', '.join(MLP_SHAPES)}")
        T, E, k, H, I = MLP_SHAPES[name]
        ids, order, counts = routing(torch, gen, T, E, k)
        tokens = (order // k)
        weights = torch.rand(T, k, generator=gen, device="cuda")
        a = weights.reshape(-1)[order].to(torch.bfloat16)
        offs = offsets(torch, counts)
        x = torch.randn(T, H, generator=gen, device="cuda").to(torch.bfloat16).requires_grad_()
        w_gu = (torch.randn(E, 2 * I, H, generator=gen, device="cuda") / H ** 0.5).to(torch.bfloat16)
        w_d = (torch.randn(E, H, I, generator=gen, device="cuda") / I ** 0.5).to(torch.bfloat16)
        w_gu.requires_grad_()
        w_d.requires_grad_()
        a.requires_grad_()
        grad = torch.randn(T, H, generator=gen, device="cuda").to(torch.bfloat16)

        out = forward(x, a, w_gu, w_d, tokens, offs)
        # the down rows checked on 8 sampled rows of expert order against float32 math
        with torch.no_grad():
            got = forward.down_rows(x, w_gu, w_d, tokens, offs)
            rel = 0.0
            for r in torch.randint(0, T * k, (8,), generator=gen, device="cuda").tolist():
                e = int(torch.searchsorted(offs.to(torch.int64), torch.tensor(r, device="cuda"), right=True))
                g, u = (w_gu[e].float() @ x[tokens[r]].float()).chunk(2)
                want = w_d[e].float() @ (F.silu(g) * u)
                rel = max(rel, ((got[r].float() - want).abs().max() / want.abs().max().clamp_min(1e-30)).item())
            del got
        if not bool(torch.isfinite(out).all()) or not rel <= 0.05:
            status = fail(f"eager MLP {name}: non-finite output or sampled rows off by {rel:.3g} (> 0.05)")
            continue

        def fwd():
            with torch.no_grad():
                forward(x, a, w_gu, w_d, tokens, offs)

        def fwd_bwd():
            y = forward(x, a, w_gu, w_d, tokens, offs)
            torch.autograd.backward(y, grad)

        ms_f = time_median(fwd)
        ms_fb = time_median(fwd_bwd)
        x.grad = w_gu.grad = w_d.grad = a.grad = None
        flops = 2.0 * T * k * I * H
        tf_f = 3 * flops / (ms_f * 1e-3) / 1e12
        tf_b = 6 * flops / ((ms_fb - ms_f) * 1e-3) / 1e12
        print(f"{name:20s} T={T} E={E} k={k} H={H} I={I}  eager torch: forward {ms_f:.3f} ms {tf_f:.1f} "
              f"TFLOP/s, backward {ms_fb - ms_f:.3f} ms {tf_b:.1f} TFLOP/s (sample check {rel:.2g})", flush=True)
        writer.append(f"{name},{T},{E},{k},{H},{I},{tf_f:.1f},{tf_b:.1f}")
        del x, w_gu, w_d, a, grad, out
        torch.cuda.empty_cache()
    return status


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--gemm-csv")
    p.add_argument("--mlp-csv")
    p.add_argument("--skip-gemm", action="store_true")
    p.add_argument("--skip-mlp", action="store_true")
    p.add_argument("--mlp-shapes", default=",".join(MLP_SHAPES))
    args = p.parse_args()
    try:
        import torch
    except ImportError:
        print("SKIP: no torch")
        return 77
    if not torch.cuda.is_available() or not hasattr(torch, "_grouped_mm"):
        print("SKIP: no CUDA device or no torch._grouped_mm in torch " + torch.__version__)
        return 77
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}", flush=True)
    time_median = timer(torch, args.repeat)
    status = 0
    if not args.skip_gemm:
        rows = []
        status |= bench_gemm(torch, args, time_median, rows)
        if args.gemm_csv:
            with open(args.gemm_csv, "w") as f:
                f.write("model,gemm,op,M,N,K,torch_grouped_mm_tflops\n" + "".join(r + "\n" for r in rows))
    if not args.skip_mlp:
        rows = []
        status |= bench_mlp(torch, args, time_median, rows)
        if args.mlp_csv:
            with open(args.mlp_csv, "w") as f:
                f.write("shape,T,E,k,H,I,torch_fwd_tflops,torch_bwd_tflops\n" + "".join(r + "\n" for r in rows))
    return status


if __name__ == "__main__":
    sys.exit(main())
