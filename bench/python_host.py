#!/usr/bin/env python3
"""The host time per call of libmoe's Python entries, on tensors so small that the library's own work is a few
microseconds (on the CPU the reference computes them; on CUDA the kernels run behind the host): what the
Python layers (checks, ctypes arguments, outputs, autograd, torch's dispatcher) add to the bare C call.
Each row is the minimum over --rounds of the mean over --calls calls (the minimum: a shared machine's other
work only ever adds time).

    grouped_gemm fwd, no grad     libmoe.grouped_gemm under torch.no_grad()
    grouped_gemm fwd, autograd    libmoe.grouped_gemm on x and w that require grad (records the graph)
    backward op dX / dW           the op the backward calls (libmoe._ops.gemm_bwd), one gradient each
    moe_mlp fwd, no grad          libmoe.moe_mlp under torch.no_grad() on a prebuilt layout
    ctypes moe_gemm_fwd           the C call alone through ctypes, its arguments made once (the floor)

usage: python3 bench/python_host.py [--device cpu|cuda] [--calls N] [--rounds R] [--clock wall|thread]
The package is this tree's (../python), the library LIBMOE_PATH's or the build tree's."""
import argparse
import ctypes
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch  # noqa: E402

import libmoe  # noqa: E402
from libmoe import _ops  # noqa: E402


CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}


def host_us(fn, calls, rounds=1, sync=None, clock=time.perf_counter):
    """Microseconds of host time per fn() call: the least, over `rounds`, of the mean over `calls` calls
    (sync, when given, waits for the device after each round, outside the timed span).  clock: wall time, or
    the thread's CPU time (time.thread_time: on a loaded machine, without the time other work held the CPU)."""
    best = float("inf")
    fn()
    for _ in range(rounds):
        if sync is not None:
            sync()
        t0 = clock()
        for _ in range(calls):
            fn()
        best = min(best, (clock() - t0) / calls * 1e6)
    if sync is not None:
        sync()
    return best


def cases(device, package=libmoe):
    """name -> a call of one Python entry (or the bare C call) on tiny tensors of `device`, of `package` (libmoe,
    or a copy of another version under another name, to compare two side by side)."""
    capi, ops = package._capi, package._ops  # pylint: disable=protected-access
    T, k, E, N, K = 4, 2, 2, 8, 8
    M = T * k
    gen = torch.Generator().manual_seed(1)
    ids = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(T)]).to(device)
    m_sizes, _, _ = package.routing_from_topk(ids, E)
    x = torch.rand((M, K), generator=gen).to(device)
    w = torch.rand((E, N, K), generator=gen).to(device)
    dy = torch.rand((M, N), generator=gen).to(device)
    x_grad, w_grad = x.clone().requires_grad_(), w.clone().requires_grad_()
    H, I, B = 8, 8, 4
    layout = package.mlp_layout(ids, E, B, torch.rand((T, k), generator=gen).to(device))
    hidden = torch.rand((T, H), generator=gen).to(device)
    w_gu, w_d = torch.rand((E, H, 2, I), generator=gen).to(device), torch.rand((E, I, H), generator=gen).to(device)

    def fwd():
        with torch.no_grad():
            return package.grouped_gemm(x, w, m_sizes)

    def mlp():
        with torch.no_grad():
            return package.moe_mlp(hidden, layout.affinities, w_gu, w_d, layout)

    routing = capi.Routing(M, 1, E, m_sizes.data_ptr(), None)
    backend = capi.MOE_BACKEND_CUDA if x.is_cuda else capi.MOE_BACKEND_REF
    options = capi.GemmOptions(dtype=capi.MOE_F32,
                                stream=torch.cuda.current_stream(x.device).cuda_stream if x.is_cuda else None)
    y = torch.empty((M, N), device=device)
    c_fwd = capi.lib().moe_gemm_fwd
    c_args = (backend, ctypes.byref(routing), N, K, x.data_ptr(), w.data_ptr(), None, y.data_ptr(),
              ctypes.byref(options))
    keep = (routing, options, y)
    return {
        "grouped_gemm fwd, no grad": fwd,
        "grouped_gemm fwd, autograd": lambda: package.grouped_gemm(x_grad, w_grad, m_sizes),
        "backward op dX": lambda: ops.gemm_bwd(x, w, dy, m_sizes, None, None, 1, False, False, False, True, False,
                                                False),
        "backward op dW": lambda: ops.gemm_bwd(x, w, dy, m_sizes, None, None, 1, False, False, False, False, True,
                                                False),
        "moe_mlp fwd, no grad": mlp,
        "ctypes moe_gemm_fwd": lambda keep=keep: c_fwd(*c_args),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                    help="wall time, or the thread's CPU time (a shared machine)")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not (torch.cuda.is_available() and libmoe.cuda_available()):
        print("python_host: needs torch with CUDA and a CUDA build of libmoe for --device cuda")
        return 77
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    print("torch %s (%s); libmoe %s; %s; host us per call (%s clock), least of %d rounds of %d calls"
          % (torch.__version__, "custom ops" if _ops.HAS_CUSTOM_OP else "autograd functions only",
             libmoe.library_path(), device, args.clock, args.rounds, args.calls))
    for name, fn in cases(device).items():
        print("  %-28s %8.1f" % (name, host_us(fn, args.calls, args.rounds, sync, CLOCKS[args.clock])), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
