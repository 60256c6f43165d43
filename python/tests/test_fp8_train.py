"""Tests of grouped_gemm_fp8_train (libmoe/fp8_train.py) on one device: LIBMOE_TEST_DEVICE=cpu (default) or cuda.

- Its output and gradients are the explicit FP8 calls' (quantize, then grouped_gemm_fp8 / _dx / _dw) bit for bit,
  in every routing mode (expert order, permute_x, permute_y, both), both scale formats, mixed formats for the
  gradient, float32 and bfloat16 tensors, codes_transposed or not.
- On values that FP8 holds exactly (integers of magnitude at most 7 with UE8M0 scales: every code, scale and
  product exact, and a tile's sum, at most 128 * 49 < 2^13 units of its products, exact in float32 and in Hopper's
  FP8 accumulator, which keeps 13 bits below the leading one: specs/FP8.md section 4), they equal float64
  autograd of the same grouped GEMM exactly: the meaning of every routing mode, not only the wiring of the calls.
- Only the gradients requires_grad asks for are computed; bad inputs raise and change nothing.

Run: tests/test_python.sh from the build folder (make check), or from the source tree
PYTHONPATH=python:python/tests LIBMOE_PATH=.libs python3 -m unittest -v test_fp8_train"""
import os
import unittest

import torch

import libmoe

DEVICE = torch.device(os.environ.get("LIBMOE_TEST_DEVICE", "cpu"))
MODES = ((False, False), (True, False), (False, True), (True, True))   # (permute_x, permute_y)


def routing(T, k, E, gen):
    """m_sizes and gather_indices of a random top-k routing on DEVICE, expert E - 1 without rows."""
    ids = torch.stack([torch.randperm(E - 1, generator=gen)[:k] for _ in range(T)])
    m, g, _ = libmoe.routing_from_topk(ids, E)
    return m.to(DEVICE), g.to(DEVICE)


def explicit(x, w, dy, m, g, k, px, py, fmt, grad_fmt, sfmt, transposed):
    """Y, dX and dW by the explicit FP8 calls, as grouped_gemm_fp8_train's docstring states them."""
    xq, xs = libmoe.quantize_fp8_rows(x, fmt, sfmt)
    wq, ws = libmoe.quantize_fp8_blocks(w, fmt, sfmt)
    y = libmoe.grouped_gemm_fp8(xq, xs, wq, ws, m, g, k, permute_x=px, permute_y=py, fp8=fmt, out_dtype=x.dtype)
    dyq, dys = libmoe.quantize_fp8_rows(dy, grad_fmt, sfmt)
    dx = libmoe.grouped_gemm_fp8_dx(dyq, dys, wq, ws, m, g, k, permute_x=px, permute_y=py, reduce_topk=px,
                                    fp8=grad_fmt, w_fp8=fmt, out_dtype=x.dtype)
    xc, xcs = libmoe.quantize_fp8_columns(x, m, g, k, rows="token" if px else "expert", fp8=fmt, scale_format=sfmt,
                                          transposed=transposed)
    dyc, dycs = libmoe.quantize_fp8_columns(dy, m, g, k, rows="slot" if py else "expert", fp8=grad_fmt,
                                            scale_format=sfmt, transposed=transposed)
    dw = libmoe.grouped_gemm_fp8_dw(xc, xcs, dyc, dycs, m, fp8=grad_fmt, x_fp8=fmt, out_dtype=w.dtype,
                                    codes_transposed=transposed)
    return y, dx, dw


def train(x, w, dy, m, g, k, px, py, **kw):
    """Y, x.grad and w.grad of grouped_gemm_fp8_train with upstream gradient dy."""
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = libmoe.grouped_gemm_fp8_train(x, w, m, g, k, permute_x=px, permute_y=py, **kw)
    y.backward(dy)
    return y.detach(), x.grad, w.grad


class TestFp8Train(unittest.TestCase):
    def test_is_the_explicit_calls(self):
        gen = torch.Generator().manual_seed(7)
        T, k, E, N, K = 90, 2, 4, 200, 150   # partial tiles of 128 along N, K and the experts' rows
        m, g = routing(T, k, E, gen)
        case = 0
        for px, py in MODES:
            for sfmt, fmt, grad_fmt, dtype, transposed in (("f32", "e4m3", "e4m3", torch.float32, False),
                                                           ("ue8m0", "e4m3", "e5m2", torch.bfloat16, True),
                                                           ("f32", "e5m2", "e4m3", torch.bfloat16, False),
                                                           ("ue8m0", "e4m3", "e4m3", torch.float32, True)):
                case += 1
                x = torch.randn(T if px else T * k, K, generator=gen).to(dtype).to(DEVICE)
                w = (torch.randn(E, N, K, generator=gen) * 0.1).to(dtype).to(DEVICE)
                dy = torch.randn(T * k, N, generator=gen).to(dtype).to(DEVICE)
                what = "permute_x=%d permute_y=%d %s %s/%s %s transposed=%d" % (px, py, sfmt, fmt, grad_fmt, dtype,
                                                                              transposed)
                got = train(x, w, dy, m, g, k, px, py, fp8=fmt, grad_fp8=grad_fmt, scale_format=sfmt,
                            codes_transposed=transposed)
                want = explicit(x, w, dy, m, g, k, px, py, fmt, grad_fmt, sfmt, transposed)
                for name, a, b in zip(("y", "dx", "dw"), got, want):
                    self.assertEqual(a.dtype, b.dtype, name + ", " + what)
                    self.assertEqual(tuple(a.shape), tuple(b.shape), name + ", " + what)
                    self.assertTrue(torch.equal(a, b), name + ", " + what)
                self.assertEqual(tuple(got[1].shape), tuple(x.shape), what)

    def test_exact_values_are_float64_autograd(self):
        gen = torch.Generator().manual_seed(8)
        T, k, E, N, K = 70, 2, 4, 130, 140
        m, g = routing(T, k, E, gen)
        sizes = m.cpu().tolist()
        expert_of = torch.repeat_interleave(torch.arange(E), torch.tensor(sizes))  # expert of each expert-order row
        ints = lambda *shape: torch.randint(-7, 8, shape, generator=gen).to(torch.float32)  # noqa: E731
        for px, py in MODES:
            for fmt in ("e4m3", "e5m2"):
                x, w, dy = ints(T if px else T * k, K), ints(E, N, K), ints(T * k, N)
                got = train(x.to(DEVICE), w.to(DEVICE), dy.to(DEVICE), m, g, k, px, py, fp8=fmt,
                            scale_format="ue8m0")
                x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
                gi = g.cpu()
                rows = x64[gi // k] if px else x64                       # expert-order rows of X
                y_exp = torch.einsum("rk,rnk->rn", rows, w64[expert_of])  # expert-order rows of Y
                y64 = torch.empty_like(y_exp).index_copy(0, gi, y_exp) if py else y_exp
                y64.backward(dy.double())
                what = "permute_x=%d permute_y=%d %s" % (px, py, fmt)
                for name, a, b in zip(("y", "dx", "dw"), got, (y64.detach(), x64.grad, w64.grad)):
                    self.assertTrue(torch.equal(a.cpu().double(), b), name + ", " + what)

    def test_only_the_gradients_asked_for(self):
        gen = torch.Generator().manual_seed(9)
        T, k, E, N, K = 20, 2, 3, 40, 130
        m, g = routing(T, k, E, gen)
        x, w = torch.randn(T, K, generator=gen).to(DEVICE), torch.randn(E, N, K, generator=gen).to(DEVICE)
        dy = torch.randn(T * k, N, generator=gen).to(DEVICE)
        _, dx, dw = explicit(x, w, dy, m, g, k, True, False, "e4m3", "e4m3", "f32", False)
        for x_grad, w_grad in ((True, False), (False, True)):
            xl, wl = x.clone().requires_grad_(x_grad), w.clone().requires_grad_(w_grad)
            libmoe.grouped_gemm_fp8_train(xl, wl, m, g, k, permute_x=True).backward(dy)
            self.assertTrue(torch.equal(xl.grad, dx) if x_grad else xl.grad is None)
            self.assertTrue(torch.equal(wl.grad, dw) if w_grad else wl.grad is None)
        with torch.no_grad():
            y = libmoe.grouped_gemm_fp8_train(x.clone().requires_grad_(), w, m, g, k, permute_x=True)
        self.assertFalse(y.requires_grad)

    def test_bad_inputs_raise_and_change_nothing(self):
        gen = torch.Generator().manual_seed(10)
        T, k, E, N, K = 6, 2, 3, 20, 30
        m, g = routing(T, k, E, gen)
        x, w = torch.randn(T, K, generator=gen).to(DEVICE), torch.randn(E, N, K, generator=gen).to(DEVICE)
        nan = x.clone()
        nan[2, 3] = float("nan")
        keep = [t.clone() for t in (x, w, m, g)]
        fn = "libmoe.grouped_gemm_fp8_train"

        def call(**kw):
            y = libmoe.grouped_gemm_fp8_train(kw.get("x", x), kw.get("w", w), m, kw.get("g", g), k, permute_x=True,
                                              fp8=kw.get("fp8", "e4m3"), grad_fp8=kw.get("grad_fp8"),
                                              scale_format=kw.get("sfmt", "f32"))
            libmoe.synchronize(DEVICE)
            return y
        cases = [
            (ValueError, fn + ": gather_indices is required with permute_x", lambda: call(g=None)),
            (TypeError, fn + ": x has dtype torch.float16, expected torch.float32 or torch.bfloat16",
             lambda: call(x=x.half())),
            (TypeError, fn + ": w must be a torch.Tensor, got list", lambda: call(w=[1.0])),
            (ValueError, fn + ": fp8 must be one of", lambda: call(fp8="e4m4")),
            (ValueError, fn + ": grad_fp8 must be one of", lambda: call(grad_fp8="fp8")),
            (ValueError, fn + ": scale_format must be one of", lambda: call(sfmt="e8m0")),
            (ValueError, fn + r": x has shape \(6, 29\) and w \(3, 20, 30\), expected \(rows, K\) and \(E, N, K\)",
             lambda: call(x=x[:, :29].contiguous())),
            (libmoe.MoeError, r"moe_quantize_fp8_rows: src\[0\]\[2\]\[3\] = nan", lambda: call(x=nan)),
        ]
        for exc, pattern, bad in cases:
            with self.assertRaisesRegex(exc, pattern):
                bad()
        for before, after in zip(keep, (x, w, m, g)):
            self.assertTrue(torch.equal(before, after))


if __name__ == "__main__":
    unittest.main()
