#!/usr/bin/env python3
"""The peers of libmoe's CUDA kernels, timed in PyTorch on the shapes of moe-bench and mlp-gpu-time.

  grouped GEMM  torch._grouped_mm (CUTLASS) fwd, dX and dW on ANCHORS.md's five GEMM shapes (bf16,
                T tokens, uniformly random distinct top-k routing, expert order); dW's group sizes
                rounded down to multiples of 8, which torch._grouped_mm needs there (ANCHORS.md)
  FP8 GEMM      (--fp8) torch._scaled_grouped_mm fwd and dX, e4m3 operands with row-wise float32 scales (one
                per row of X or dY, one per output column of W: its only FP8 granularity on sm_90, where
                libmoe's is 1 x 128 and 128 x 128), bf16 out, precise (use_fast_accum=False, CUTLASS's
                promotion) and fast accumulation (use_fast_accum=True) timed interleaved; rows in expert
                order; dX's W given as its own row-wise quantization of the transposed W (a row-wise W serves
                one product only), made before the timing; reported absent where torch lacks the op or the
                GPU is not sm_90
  MoE MLP       an eager PyTorch MoE MLP on torch._grouped_mm with autograd (gather into expert order,
                gate/up GEMM, SiLU(g) * u, down GEMM, affinity on H, index_add back), forward and
                forward + backward, on mlp-gpu-time's shapes

Timing as bench/moe_bench.c and triton.testing.do_bench: CUDA events, warm-up, L2 flushed (a 256 MiB
buffer rewritten) before each run, the median of --repeat runs. TFLOP/s: 2 M N K for a GEMM (M = T k),
6 T k I H for the MLP forward and 12 T k I H for its backward (the backward's time is the forward +
backward time less the forward's). The peers' outputs are checked finite, and the MLP's down rows (before
the affinity) against float32 math on 8 sampled rows (relative difference <= 0.05), so that no time of a
wrong or empty computation is reported; the FP8 outputs against float32 math on the dequantized operands on
8 sampled rows (relative difference <= 0.05). bench/peer-table.py puts these beside libmoe's numbers.

usage: bench/peers.py [--tokens T] [--repeat R] [--gemm-csv FILE] [--mlp-csv FILE] [--skip-mlp]
       [--skip-gemm] [--mlp-shapes NAME,...] [--models NAME,...] [--ops fwd,dx,dw] [--fp8 [--fp8-csv FILE]]
       [--dry-run]
--models and --ops restrict the GEMM shapes (GEMM_SHAPES' model names) and ops; --dry-run prints what would be
timed and exits without torch.
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


def selected_shapes(args):
    """GEMM_SHAPES of the models named by --models (all by default)."""
    return [s for s in GEMM_SHAPES if args.models is None or s[0] in args.models.split(",")]


def bench_gemm(torch, args, time_median, writer):
    status = 0
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    T = args.tokens
    for model, gemm, E, k, N, K in selected_shapes(args):
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
            if op not in args.ops.split(","):
                continue
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


FP8_OPS = ("fwd", "dx")


def fp8_absent(torch):
    """Why torch._scaled_grouped_mm's FP8 row-wise kernel cannot run here, or None."""
    if not hasattr(torch, "_scaled_grouped_mm") or not hasattr(torch, "float8_e4m3fn"):
        return f"torch {torch.__version__} has no torch._scaled_grouped_mm"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        return f"torch._scaled_grouped_mm's FP8 row-wise kernel runs on sm_90 only; this GPU is sm_{major}{minor}"
    return None


def quantize_rows(torch, v):
    """e4m3 codes of v (..., rows, cols) and float32 dequantization scales, one per row: amax / 448."""
    v = v.float()
    scale = v.abs().amax(dim=-1).clamp_min(1e-12) / 448.0
    return (v / scale[..., None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn), scale


def fp8_sample_rel(torch, gen, out, a, a_scale, b, b_scale, offs):
    """The largest relative difference of 8 sampled output rows r (of expert e) from float32 math on the
    dequantized operands: out[r] = (b[e] * b_scale[e]) . (a[r] * a_scale[r])."""
    rel = 0.0
    for r in torch.randint(0, out.shape[0], (8,), generator=gen, device="cuda").tolist():
        e = int(torch.searchsorted(offs.to(torch.int64), torch.tensor(r, device="cuda"), right=True))
        want = (b[e].float() * b_scale[e][:, None]) @ (a[r].float() * a_scale[r])
        rel = max(rel, ((out[r].float() - want).abs().max() / want.abs().max().clamp_min(1e-30)).item())
    return rel


def bench_fp8(torch, args, time_medians, writer):
    """torch._scaled_grouped_mm fwd and dX (module docstring), precise and fast accumulation interleaved."""
    status = 0
    T = args.tokens
    ops = [op for op in FP8_OPS if op in args.ops.split(",")]
    absent = fp8_absent(torch)
    if absent:
        print("ABSENT: " + absent, flush=True)
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    for model, gemm, E, k, N, K in selected_shapes(args):
        M = T * k
        if absent:
            writer.extend(f"{model},{gemm},{op},{M},{N},{K},absent,absent" for op in ops)
            continue
        _, _, counts = routing(torch, gen, T, E, k)
        offs = offsets(torch, counts)
        # W [E][N][K] row-wise along K (fwd) and, for dX, its transpose [E][K][N] row-wise along N
        w_q = torch.empty(E, N, K, dtype=torch.float8_e4m3fn, device="cuda")
        wt_q = torch.empty(E, K, N, dtype=torch.float8_e4m3fn, device="cuda")
        w_s = torch.empty(E, N, device="cuda")
        wt_s = torch.empty(E, K, device="cuda")
        for e in range(E):  # one expert at a time: DeepSeek-V3's W is 30 GB in float32
            w = torch.randn(N, K, generator=gen, device="cuda") / K ** 0.5
            w_q[e], w_s[e] = quantize_rows(torch, w)
            wt_q[e], wt_s[e] = quantize_rows(torch, w.t())
            del w
        x_q, x_s = quantize_rows(torch, torch.randn(M, K, generator=gen, device="cuda"))
        dy_q, dy_s = quantize_rows(torch, torch.randn(M, N, generator=gen, device="cuda"))
        operands = {"fwd": (x_q, x_s, w_q, w_s), "dx": (dy_q, dy_s, wt_q, wt_s)}
        for op in ops:
            a, a_s, b, b_s = operands[op]

            def call(fast, a=a, a_s=a_s, b=b, b_s=b_s):
                return torch._scaled_grouped_mm(a, b.transpose(-2, -1), a_s, b_s, offs=offs,
                                                out_dtype=torch.bfloat16, use_fast_accum=fast)

            try:
                out = call(False)
            except (RuntimeError, TypeError, ValueError) as err:  # no kernel in this build, a refused layout or call
                print(f"ABSENT: torch._scaled_grouped_mm {model} {gemm} {op}: {str(err).splitlines()[0]}", flush=True)
                writer.append(f"{model},{gemm},{op},{M},{N},{K},absent,absent")
                continue
            rel = fp8_sample_rel(torch, gen, out, a, a_s, b, b_s, offs)
            if not bool(torch.isfinite(out).all()) or not rel <= 0.05:
                status = fail(f"torch._scaled_grouped_mm {model} {gemm} {op}: non-finite output or sampled rows off "
                              f"by {rel:.3g} (> 0.05)")
                continue
            del out
            ms, ms_fast = time_medians([lambda: call(False), lambda: call(True)])
            tf, tf_fast = (2.0 * M * N * K / (t * 1e-3) / 1e12 for t in (ms, ms_fast))
            print(f"{model:14s} {gemm:8s} {op:4s} M={M:6d} N={N:6d} K={K:6d}  torch._scaled_grouped_mm e4m3 "
                  f"row-wise {ms:8.3f} ms {tf:7.1f} TFLOP/s, fast_accum {ms_fast:8.3f} ms {tf_fast:7.1f} TFLOP/s "
                  f"(sample check {rel:.2g})", flush=True)
            writer.append(f"{model},{gemm},{op},{M},{N},{K},{tf:.1f},{tf_fast:.1f}")
        del w_q, wt_q, x_q, dy_q
        torch.cuda.empty_cache()
    return status


def dry_run(args):
    """What a run with these arguments would time (no torch needed)."""
    if not args.skip_gemm:
        for model, gemm, E, k, N, K in selected_shapes(args):
            for op in args.ops.split(","):
                print(f"torch._grouped_mm bf16 {model} {gemm} {op} T={args.tokens} E={E} k={k} N={N} K={K}")
    if args.fp8:
        for model, gemm, E, k, N, K in selected_shapes(args):
            for op in FP8_OPS:
                if op in args.ops.split(","):
                    print(f"torch._scaled_grouped_mm e4m3 row-wise (precise, fast_accum) {model} {gemm} {op} "
                          f"T={args.tokens} E={E} k={k} N={N} K={K}")
    if not args.skip_mlp:
        for name in args.mlp_shapes.split(","):
            print(f"eager MLP {name} {MLP_SHAPES[name]}")
    return 0


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
    p.add_argument("--models", help="comma list of GEMM_SHAPES' models (default: all)")
    p.add_argument("--ops", default="fwd,dx,dw", help="the GEMM ops (default: fwd,dx,dw)")
    p.add_argument("--fp8", action="store_true", help="also torch._scaled_grouped_mm (fwd, dX)")
    p.add_argument("--fp8-csv")
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args()
    models = {s[0] for s in GEMM_SHAPES}
    for name in args.models.split(",") if args.models else []:
        if name not in models:
            p.error(f"--models: unknown model {name}; known: {', '.join(sorted(models))}")
    for op in args.ops.split(","):
        if op not in ("fwd", "dx", "dw"):
            p.error(f"--ops: unknown op {op}; known: fwd, dx, dw")
    for name in args.mlp_shapes.split(",") if not args.skip_mlp else []:
        if name not in MLP_SHAPES:
            p.error(f"--mlp-shapes: unknown shape {name}; known: {', '.join(MLP_SHAPES)}")
    if args.fp8_csv and not args.fp8:
        p.error("--fp8-csv needs --fp8")
    if args.dry_run:
        return dry_run(args)
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
    if args.fp8:
        rows = []
        status |= bench_fp8(torch, args, interleaved_timer(torch, args.repeat), rows)
        if args.fp8_csv:
            with open(args.fp8_csv, "w") as f:
                f.write("model,gemm,op,M,N,K,torch_scaled_grouped_mm_tflops,torch_scaled_grouped_mm_fast_accum_tflops\n"
                        + "".join(r + "\n" for r in rows))
    if not args.skip_mlp:
        rows = []
        status |= bench_mlp(torch, args, time_median, rows)
        if args.mlp_csv:
            with open(args.mlp_csv, "w") as f:
                f.write("shape,T,E,k,H,I,torch_fwd_tflops,torch_bwd_tflops\n" + "".join(r + "\n" for r in rows))
    return status


if __name__ == "__main__":
    sys.exit(main())
