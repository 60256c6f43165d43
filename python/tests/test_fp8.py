"""Tests of the package's FP8 functions (libmoe/fp8.py) on one device: LIBMOE_TEST_DEVICE=cpu (default) or cuda.

The quantizers and the dequantizer against fp8_model's rule, bit for bit (codes by a search over a format's
values, scales and products in float32); the FP8 GEMM forward and dX, every mode, both scale formats and output
dtypes, mixed operand formats, against the float64 value within the oracle's bound (oracle/fp8_oracle.c,
recomputed in fp8_model); on CUDA, the device's quantizers and the GEMM on exact codes equal the reference's bit
for bit; bad inputs raise and change nothing.

Run: tests/test_python.sh from the build folder (make check), or from the source tree
PYTHONPATH=python:python/tests LIBMOE_PATH=.libs python3 -m unittest -v test_fp8"""
import os
import unittest

import torch

import libmoe
import fp8_model
from bounds import within

DEVICE = torch.device(os.environ.get("LIBMOE_TEST_DEVICE", "cpu"))
# The in-tile sums of the GEMM's bound: FP8 wgmma's on a Hopper GPU (gpu/gemm/fp8_sm90.cu may take the call) unless
# MOE_CUDA_KERNEL forces the portable kernel, else float32's (oracle/oracle_fp8.h)
TILE_ACC_BITS = (13 if DEVICE.type == "cuda" and torch.cuda.get_device_capability(DEVICE) == (9, 0)
                 and os.environ.get("MOE_CUDA_KERNEL") not in ("sm80", "simt") else 0)
FORMATS = ("e4m3", "e5m2")
SCALE_FORMATS = ("f32", "ue8m0")


def spread(shape, gen, dtype=torch.float32):
    """Random values whose magnitude changes by powers of two along the last dimension (so that tiles get
    different scales), on DEVICE."""
    v = torch.randn(*shape, generator=gen, dtype=torch.float64)
    v = v * torch.pow(2.0, torch.randint(-6, 7, (shape[-1],), generator=gen).to(torch.float64))
    return v.to(dtype).to(DEVICE)


class TestQuantize(unittest.TestCase):
    def check_quantize(self, x, fmt, sfmt, blocks):
        fn = libmoe.quantize_fp8_blocks if blocks else libmoe.quantize_fp8_rows
        q, s = fn(x, fmt, sfmt)
        shape = ((x.shape[0] if x.dim() == 3 else 1, x.shape[-2], x.shape[-1]) if blocks
                 else (1, x.numel() // x.shape[-1] if x.shape[-1] else 0, x.shape[-1]))
        tile_rows = 128 if blocks else 1
        want_q, want_s = fp8_model.quantize(x, fmt, sfmt, tile_rows, shape)
        what = " (%s %s %s %s blocks=%d)" % (tuple(x.shape), x.dtype, fmt, sfmt, blocks)
        self.assertEqual(q.dtype, torch.uint8)
        self.assertEqual(s.dtype, torch.uint8 if sfmt == "ue8m0" else torch.float32)
        self.assertEqual(tuple(q.shape), tuple(x.shape))
        self.assertTrue(torch.equal(s.cpu().reshape(want_s.shape), want_s), "scales" + what)
        self.assertTrue(torch.equal(q.cpu().reshape(want_q.shape), want_q), "codes" + what)
        for dtype in (torch.float32, torch.bfloat16):
            back = libmoe.dequantize_fp8(q, s, fmt, blocks=blocks, dtype=dtype)
            want = fp8_model.dequantize(q, s, fmt, tile_rows, shape, dtype)
            self.assertTrue(torch.equal(back.cpu().reshape(want.shape), want), "dequantized to %s%s" % (dtype, what))
        if DEVICE.type == "cuda":   # the device's quantizer is the reference's, bit for bit
            q_ref, s_ref = fn(x.cpu(), fmt, sfmt)
            self.assertTrue(torch.equal(q.cpu(), q_ref) and torch.equal(s.cpu(), s_ref), "cuda vs reference" + what)
        return q, s

    def test_rows_and_blocks_follow_the_rule(self):
        gen = torch.Generator().manual_seed(70)
        i = 0
        for shape, blocks in (((3, 130), False), ((2, 5, 300), False), ((1, 1), False), ((4, 0), False),
                              ((129, 200), True), ((2, 130, 7), True), ((1, 128, 128), True)):
            for dtype in (torch.float32, torch.bfloat16):
                i += 1
                x = spread(shape, gen, dtype)
                if i % 3 == 0 and x.numel():   # a zero tile: the floor's scale, zero codes
                    x.reshape(-1, x.shape[-1])[0, :] = 0
                self.check_quantize(x, FORMATS[i % 2], SCALE_FORMATS[i // 2 % 2], blocks)

    def test_saturation_and_ties(self):
        """A tile with amax 448 (scale and factor 1): its largest value is the largest code; values halfway
        between two e4m3 values go to the even code (17 between 16 and 18, -19 between 18 and 20, 1.5 * 2^-9
        between the first two subnormals, 15.5 between 15 and 16); -0 keeps its sign."""
        x = torch.tensor([[448.0, 17.0, -19.0, 1.5 * 2.0 ** -9, -0.0, 15.5]], device=DEVICE)
        q, s = self.check_quantize(x, "e4m3", "f32", False)
        self.assertEqual(s.item(), 1.0)
        self.assertEqual(q.cpu().tolist(), [[0x7e, 0x58, 0xda, 0x02, 0x80, 0x58]])

    def test_dequantize_any_codes_and_scales(self):
        gen = torch.Generator().manual_seed(71)
        for fmt in FORMATS:
            table = fp8_model.decode_table(fmt)
            finite = torch.nonzero(torch.isfinite(table)).reshape(-1)
            q = finite[torch.randint(0, finite.numel(), (3, 2, 260), generator=gen)].to(torch.uint8).to(DEVICE)
            for sfmt, scales in (("f32", torch.rand((3, 1, 3), generator=gen) * 100 + 1e-3),
                                 ("ue8m0", torch.randint(0, 255, (3, 1, 3), generator=gen).to(torch.uint8))):
                back = libmoe.dequantize_fp8(q, scales.to(DEVICE), fmt, blocks=True, dtype=torch.bfloat16)
                want = fp8_model.dequantize(q, scales, fmt, 128, (3, 2, 260), torch.bfloat16)
                self.assertTrue(torch.equal(back.cpu(), want), "%s %s" % (fmt, sfmt))

    @unittest.skipUnless(hasattr(torch, "float8_e4m3fn"), "this torch has no float8 dtypes")
    def test_codes_are_torchs_float8(self):
        gen = torch.Generator().manual_seed(72)
        x = spread((4, 256), gen)
        for fmt, dtype in (("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)):
            q, s = libmoe.quantize_fp8_rows(x, fmt)
            torch_values = q.view(dtype).to(torch.float32).cpu()
            self.assertTrue(torch.equal(torch_values, fp8_model.decode(q, fmt).to(torch.float32)), fmt)

    def test_bad_inputs_raise_and_change_nothing(self):
        gen = torch.Generator().manual_seed(73)
        x = spread((4, 130), gen)
        q, s = libmoe.quantize_fp8_rows(x)
        keep = [t.clone() for t in (x, q, s)]
        other = torch.device("meta")
        cases = [
            (TypeError, "x has dtype torch.float64", lambda: libmoe.quantize_fp8_rows(x.double())),
            (TypeError, "x has dtype torch.float16", lambda: libmoe.quantize_fp8_blocks(x.half())),
            (ValueError, "x is on meta", lambda: libmoe.quantize_fp8_rows(x.to(other))),
            (ValueError, "x is not contiguous", lambda: libmoe.quantize_fp8_rows(x.t())),
            (ValueError, r"x has shape \(520,\), expected \(R, C\)", lambda: libmoe.quantize_fp8_blocks(x.reshape(-1))),
            (ValueError, "fp8 must be one of 'e4m3', 'e5m2', got 'e3m4'", lambda: libmoe.quantize_fp8_rows(x, "e3m4")),
            (ValueError, "scale_format must be one of", lambda: libmoe.quantize_fp8_rows(x, "e4m3", "f16")),
            (TypeError, "q has dtype torch.float32", lambda: libmoe.dequantize_fp8(x, s)),
            (ValueError, r"scales has shape \(4, 1\), expected \(4, 2\)", lambda: libmoe.dequantize_fp8(q, s[:, :1])),
            (TypeError, "scales has dtype torch.float16", lambda: libmoe.dequantize_fp8(q, s.half())),
            (ValueError, r"scales has shape \(4, 2\), expected \(1, 2\)", lambda: libmoe.dequantize_fp8(q, s, blocks=True)),
            (TypeError, "dtype torch.float16, expected", lambda: libmoe.dequantize_fp8(q, s, dtype=torch.float16)),
            (ValueError, "scales is on", lambda: libmoe.dequantize_fp8(q, s.to("cpu" if DEVICE.type == "cuda" else other))),
        ]
        if DEVICE.type == "cpu":   # values: checked by the library on the host (CUDA: on the device, below)
            nan = x.clone()
            nan[2, 129] = float("nan")
            bad = s.clone()
            bad[3, 1] = -1.0
            cases += [(libmoe.MoeError, r"src\[0\]\[2\]\[129\] = nan", lambda: libmoe.quantize_fp8_rows(nan)),
                      (libmoe.MoeError, r"scales\[3\]\[1\] = -1", lambda: libmoe.dequantize_fp8(q, bad))]
        for exc, pattern, call in cases:
            with self.assertRaisesRegex(exc, pattern):
                call()
        for before, after in zip(keep, (x, q, s)):
            self.assertTrue(torch.equal(before, after))

    @unittest.skipUnless(DEVICE.type == "cuda", "needs a CUDA device")
    def test_cuda_bad_values_via_synchronize(self):
        libmoe.synchronize(DEVICE)
        x = spread((3, 200), torch.Generator().manual_seed(74))
        x[1, 150] = float("inf")
        x[2, 3] = float("nan")
        libmoe.quantize_fp8_rows(x)
        with self.assertRaisesRegex(libmoe.MoeError, r"moe_quantize_fp8_rows .*src\[0\]\[1\]\[150\] = inf"):
            libmoe.synchronize(DEVICE)
        q = torch.zeros((3, 200), dtype=torch.uint8, device=DEVICE)
        s = torch.full((3, 2), 255, dtype=torch.uint8, device=DEVICE)
        libmoe.dequantize_fp8(q, s)
        with self.assertRaisesRegex(libmoe.MoeError, r"moe_dequantize_fp8 .*scales\[0\]\[0\] = 255"):
            libmoe.synchronize(DEVICE)
        libmoe.synchronize(DEVICE)   # the error was forgotten


def gemm_case(T, k, E, N, K, dx, px, py, tw, reduce, fmt, w_fmt, sfmt, out_dtype, seed):
    """The quantized operands of one FP8 GEMM case (quantized on DEVICE) and libmoe's result and the model's."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, E, (T, k), generator=gen).to(DEVICE)
    m, g, _ = libmoe.routing_from_topk(ids, E)
    M = T * k
    a = spread((M if dx or not px else T, N if dx else K), gen)
    w = spread((E, N, K), gen) * 0.25
    aq, a_s = libmoe.quantize_fp8_rows(a, fmt, sfmt)
    wq, w_s = libmoe.quantize_fp8_blocks(w, w_fmt, sfmt)
    weights = torch.rand(M, generator=gen).to(DEVICE) if tw else None
    gather = g if px or py or tw or reduce else None
    if dx:
        got = libmoe.grouped_gemm_fp8_dx(aq, a_s, wq, w_s, m, gather, k, permute_x=px, permute_y=py,
                                         topk_weights=weights, reduce_topk=reduce, fp8=fmt, w_fp8=w_fmt,
                                         out_dtype=out_dtype)
    else:
        got = libmoe.grouped_gemm_fp8(aq, a_s, wq, w_s, m, gather, k, permute_x=px, permute_y=py, topk_weights=weights,
                                      fp8=fmt, w_fp8=w_fmt, out_dtype=out_dtype)
    want = fp8_model.gemm_fp8(aq, a_s, wq, w_s, m, gather, k, px, py, weights, dx, reduce, fmt, w_fmt, out_dtype,
                              TILE_ACC_BITS)
    return got, want


class TestGemmFp8(unittest.TestCase):
    def test_every_mode_against_the_bound(self):
        seed = 80
        for dx in (False, True):
            for px in (False, True):
                for py in (False, True):
                    for tw in (False, True):
                        seed += 1
                        fmt, w_fmt = FORMATS[seed % 2], FORMATS[seed // 2 % 2]
                        sfmt, out_dtype = SCALE_FORMATS[seed // 4 % 2], (torch.float32, torch.bfloat16)[seed // 3 % 2]
                        reduce = dx and px and seed % 2 == 0
                        got, want = gemm_case(7, 2, 3, 130, 200, dx, px, py, tw, reduce, fmt, w_fmt, sfmt, out_dtype,
                                              seed)
                        what = " (dx=%d px=%d py=%d tw=%d reduce=%d %s/%s %s %s)" % (
                            dx, px, py, tw, reduce, fmt, w_fmt, sfmt, out_dtype)
                        self.assertEqual(got.dtype, out_dtype)
                        self.assertEqual(tuple(got.shape), tuple(want.v.shape), what)
                        self.assertTrue(bool(torch.isfinite(got).all()), "finite" + what)
                        within("fp8 gemm", got, want, what)

    def test_one_tile_and_many(self):
        for N, K, seed in ((1, 1, 90), (128, 129, 91), (257, 64, 92)):
            for dx in (False, True):
                got, want = gemm_case(5, 1, 2, N, K, dx, False, False, False, False, "e4m3", "e4m3", "f32",
                                      torch.float32, seed)
                within("fp8 gemm N=%d K=%d dx=%d" % (N, K, dx), got, want)

    def test_dx_from_w_transposed_is_dx_from_w(self):
        """quantize_fp8_blocks of W^T gives W's codes and scales transposed, and dX from them (w_transposed) is
        dX from W bit for bit, in every mode."""
        gen = torch.Generator().manual_seed(95)
        T, k, E, N, K = 6, 2, 3, 200, 300
        ids = torch.randint(0, E, (T, k), generator=gen).to(DEVICE)
        m, g, _ = libmoe.routing_from_topk(ids, E)
        w = spread((E, N, K), gen)
        wq, ws = libmoe.quantize_fp8_blocks(w)
        wtq, wts = libmoe.quantize_fp8_blocks(w.transpose(1, 2).contiguous())
        self.assertTrue(torch.equal(wtq, wq.transpose(1, 2)))
        self.assertTrue(torch.equal(wts, ws.transpose(1, 2)))
        dyq, dys = libmoe.quantize_fp8_rows(spread((T * k, N), gen))
        tw = torch.rand(T * k, generator=gen).to(DEVICE)
        for px, py, reduce in ((False, False, False), (True, True, False), (True, False, True)):
            args = dict(permute_x=px, permute_y=py, topk_weights=tw, reduce_topk=reduce, out_dtype=torch.bfloat16)
            want = libmoe.grouped_gemm_fp8_dx(dyq, dys, wq, ws, m, g, k, **args)
            got = libmoe.grouped_gemm_fp8_dx(dyq, dys, wtq, wts, m, g, k, w_transposed=True, **args)
            self.assertTrue(torch.equal(got, want), "px=%d py=%d reduce=%d" % (px, py, reduce))
        with self.assertRaises(ValueError):   # W^T's scales must be [E, ceil(K/128), ceil(N/128)]
            libmoe.grouped_gemm_fp8_dx(dyq, dys, wtq, ws, m, g, k, w_transposed=True)

    @unittest.skipUnless(DEVICE.type == "cuda", "needs a CUDA device")
    def test_cuda_equals_the_reference_on_exact_codes(self):
        """Codes of small integers and power-of-two scales: every tile sum is exact in any order, so the GPU's
        order of the products cannot show and the result must equal the reference's bit for bit."""
        gen = torch.Generator().manual_seed(93)
        T, k, E, N, K = 9, 2, 3, 200, 300
        ids = torch.randint(0, E, (T, k), generator=gen)
        m, g, _ = libmoe.routing_from_topk(ids, E)
        small = torch.tensor([0x00, 0x38, 0x40, 0x44, 0xb8, 0xc0], dtype=torch.uint8)   # 0, 1, 2, 3, -1, -2 in e4m3
        xq = small[torch.randint(0, 6, (T, K), generator=gen)]
        wq = small[torch.randint(0, 6, (E, N, K), generator=gen)]
        xs = torch.randint(120, 134, (T, 3), generator=gen).to(torch.uint8)
        ws = torch.randint(120, 134, (E, 2, 3), generator=gen).to(torch.uint8)
        tw = torch.tensor([0.5, 0.25, 1.0, 2.0])[torch.randint(0, 4, (T * k,), generator=gen)]
        args = dict(permute_x=True, permute_y=True, topk_weights=tw, out_dtype=torch.bfloat16)
        cpu = libmoe.grouped_gemm_fp8(xq, xs, wq, ws, m, g, k, **args)
        on = lambda t: t.to(DEVICE)   # noqa: E731
        cuda = libmoe.grouped_gemm_fp8(on(xq), on(xs), on(wq), on(ws), on(m), on(g), k, permute_x=True,
                                       permute_y=True, topk_weights=on(tw), out_dtype=torch.bfloat16)
        self.assertTrue(torch.equal(cuda.cpu(), cpu))
        dyq = small[torch.randint(0, 6, (T * k, N), generator=gen)]
        dys = torch.randint(120, 134, (T * k, 2), generator=gen).to(torch.uint8)
        args = dict(permute_x=True, permute_y=True, topk_weights=tw, reduce_topk=True, out_dtype=torch.float32)
        cpu = libmoe.grouped_gemm_fp8_dx(dyq, dys, wq, ws, m, g, k, **args)
        args["topk_weights"] = on(tw)
        cuda = libmoe.grouped_gemm_fp8_dx(on(dyq), on(dys), on(wq), on(ws), on(m), on(g), k, **args)
        self.assertTrue(torch.equal(cuda.cpu(), cpu))

    def test_bad_inputs_raise_and_change_nothing(self):
        gen = torch.Generator().manual_seed(94)
        ids = torch.randint(0, 3, (4, 2), generator=gen).to(DEVICE)
        m, g, _ = libmoe.routing_from_topk(ids, 3)
        xq, xs = libmoe.quantize_fp8_rows(spread((4, 140), gen))
        wq, ws = libmoe.quantize_fp8_blocks(spread((3, 20, 140), gen))
        dyq, dys = libmoe.quantize_fp8_rows(spread((8, 20), gen))
        tw = torch.rand(8, generator=gen).to(DEVICE)
        keep = [t.clone() for t in (xq, xs, wq, ws, dyq, dys, m, g, tw)]
        second = torch.device("cpu") if DEVICE.type == "cuda" else torch.device("meta")
        fwd = lambda **kw: libmoe.grouped_gemm_fp8(kw.get("x", xq), kw.get("xs", xs), kw.get("w", wq),  # noqa: E731
                                                   kw.get("ws", ws), kw.get("m", m), kw.get("g", g), 2,
                                                   permute_x=kw.get("px", True), topk_weights=kw.get("tw"),
                                                   fp8=kw.get("fp8", "e4m3"), out_dtype=kw.get("out", torch.float32))
        dx = lambda **kw: libmoe.grouped_gemm_fp8_dx(kw.get("dy", dyq), kw.get("dys", dys), wq, ws, m,  # noqa: E731
                                                     kw.get("g", g), 2, reduce_topk=kw.get("reduce", True))
        cases = [
            (TypeError, "x has dtype torch.float32, expected torch.uint8", lambda: fwd(x=xq.float())),
            (TypeError, "w has dtype torch.int8", lambda: fwd(w=wq.to(torch.int8))),
            (ValueError, r"x has shape \(4, 139\), expected \(\*, 140\)", lambda: fwd(x=xq[:, :139].contiguous())),
            (ValueError, r"w has shape \(60, 140\)", lambda: fwd(w=wq.reshape(60, 140))),
            (ValueError, r"x_scales has shape \(4, 1\), expected \(4, 2\)", lambda: fwd(xs=xs[:, :1].contiguous())),
            (ValueError, r"w_scales has shape \(3, 1, 1\), expected \(3, 1, 2\)", lambda: fwd(ws=ws[:, :, :1].contiguous())),
            (TypeError, "x_scales has dtype torch.uint8, expected torch.float32", lambda: fwd(xs=xs.to(torch.uint8))),
            (TypeError, "w_scales has dtype torch.float64", lambda: fwd(ws=ws.double())),
            (ValueError, "x_scales is on %s" % second, lambda: fwd(xs=xs.to(second))),
            (ValueError, "w_scales is on %s" % second, lambda: fwd(ws=ws.to(second))),
            (ValueError, "x is not contiguous", lambda: fwd(x=xq.repeat(1, 2)[:, ::2])),
            (TypeError, "topk_weights has dtype torch.bfloat16", lambda: fwd(tw=tw.bfloat16())),
            (ValueError, r"topk_weights has shape \(4,\)", lambda: fwd(tw=tw[:4])),
            (TypeError, "out_dtype torch.float16", lambda: fwd(out=torch.float16)),
            (ValueError, "fp8 must be one of", lambda: fwd(fp8="e4m3fn")),
            (ValueError, "gather_indices is required", lambda: fwd(g=None)),
            (TypeError, "m_sizes has dtype torch.int32", lambda: fwd(m=m.int())),
            (ValueError, "gather_indices is required", lambda: dx(g=None)),
            (ValueError, r"dy_scales has shape \(8, 2\), expected \(8, 1\)", lambda: dx(dys=xs.repeat(2, 1))),
        ]
        if DEVICE.type == "cpu":   # scale values: checked by the library on the host (CUDA: on the device, below)
            bad = ws.clone()
            bad[2, 0, 1] = 0.0
            cases.append((libmoe.MoeError, r"w.scales\[2\]\[1\] = 0", lambda: fwd(ws=bad)))
        for exc, pattern, call in cases:
            with self.assertRaisesRegex(exc, pattern):
                call()
        for before, after in zip(keep, (xq, xs, wq, ws, dyq, dys, m, g, tw)):
            self.assertTrue(torch.equal(before, after))

    @unittest.skipUnless(DEVICE.type == "cuda", "needs a CUDA device")
    def test_cuda_bad_scale_via_synchronize(self):
        libmoe.synchronize(DEVICE)
        gen = torch.Generator().manual_seed(95)
        ids = torch.randint(0, 3, (4, 2), generator=gen).to(DEVICE)
        m, g, _ = libmoe.routing_from_topk(ids, 3)
        xq, xs = libmoe.quantize_fp8_rows(spread((4, 140), gen))
        wq, ws = libmoe.quantize_fp8_blocks(spread((3, 20, 140), gen))
        ws[1, 0, 1] = -1.0
        libmoe.grouped_gemm_fp8(xq, xs, wq, ws, m, g, 2, permute_x=True)
        with self.assertRaisesRegex(libmoe.MoeError, r"w.scales\[1\]\[1\]"):
            libmoe.synchronize(DEVICE)
        libmoe.synchronize(DEVICE)


def dw_case(T, k, E, N, K, x_rows, dy_rows, tw, fmt, x_fmt, sfmt, out_dtype, seed, empty_expert=False):
    """FP8 dW's operands quantized by libmoe.quantize_fp8_columns (checked against the model bit for bit) and
    libmoe's dW and the model's."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, E - 1 if empty_expert else E, (T, k), generator=gen)
    m, g, _ = libmoe.routing_from_topk(ids, E)
    M = T * k
    x = spread((T if x_rows == "token" else M, K), gen)
    dy = spread((M, N), gen)
    weights = torch.rand(M, generator=gen) + 0.05 if tw else None
    gather = g if x_rows != "expert" or dy_rows != "expert" or tw else None
    xq, xs = libmoe.quantize_fp8_columns(x, m, gather, k, rows=x_rows, fp8=x_fmt, scale_format=sfmt)
    dyq, dys = libmoe.quantize_fp8_columns(dy, m, gather, k, rows=dy_rows, topk_weights=weights, fp8=fmt,
                                           scale_format=sfmt)
    for got, want, what in zip((xq, xs, dyq, dys),
                               fp8_model.quantize_columns(x, m, gather, k, x_rows, None, x_fmt, sfmt) +
                               fp8_model.quantize_columns(dy, m, gather, k, dy_rows, weights, fmt, sfmt),
                               ("x codes", "x scales", "dy codes", "dy scales")):
        if not torch.equal(got, want):
            raise AssertionError("quantize_fp8_columns: %s differ from the model's (seed %d)" % (what, seed))
    got = libmoe.grouped_gemm_fp8_dw(xq, xs, dyq, dys, m, fp8=fmt, x_fp8=x_fmt, out_dtype=out_dtype)
    return got, fp8_model.gemm_fp8_dw(xq, xs, dyq, dys, m, fmt, x_fmt, out_dtype)


@unittest.skipUnless(DEVICE.type == "cpu", "CPU tensors (CUDA: TestDwOnCuda)")
class TestGemmFp8Dw(unittest.TestCase):
    def test_every_source_against_the_bound(self):
        seed = 100
        for x_rows in ("expert", "token"):
            for dy_rows in ("expert", "slot"):
                for tw in (False, True):
                    seed += 1
                    fmt, x_fmt = FORMATS[seed % 2], FORMATS[seed // 2 % 2]
                    sfmt, out_dtype = SCALE_FORMATS[seed // 4 % 2], (torch.float32, torch.bfloat16)[seed // 3 % 2]
                    got, want = dw_case(150, 2, 3, 130, 129, x_rows, dy_rows, tw, fmt, x_fmt, sfmt, out_dtype, seed)
                    what = " (x %s, dy %s, tw=%d, %s/%s %s %s)" % (x_rows, dy_rows, tw, fmt, x_fmt, sfmt, out_dtype)
                    self.assertEqual(got.dtype, out_dtype)
                    self.assertEqual(tuple(got.shape), (3, 130, 129), what)
                    within("fp8 dw", got, want, what)

    def test_empty_expert_and_one_row(self):
        got, _ = dw_case(5, 1, 3, 7, 9, "expert", "expert", False, "e4m3", "e4m3", "f32", torch.float32, 110,
                         empty_expert=True)
        self.assertTrue(bool((got[2] == 0).all()), "the expert without rows")
        got, want = dw_case(1, 1, 1, 1, 1, "expert", "expert", False, "e4m3", "e4m3", "f32", torch.float32, 111)
        within("fp8 dw, one row", got, want)

    def test_dw_from_transposed_codes_is_dw(self):
        """quantize_fp8_columns(..., transposed=True) gives the codes transposed and the same scales, and dW from
        them (codes_transposed) is dW from the untransposed codes bit for bit, in every mode; the transposed
        shapes are checked."""
        gen = torch.Generator().manual_seed(113)
        T, k, E, N, K = 70, 2, 4, 130, 200
        ids = torch.randint(0, E - 1, (T, k), generator=gen)   # expert E - 1 without rows
        m, g, _ = libmoe.routing_from_topk(ids, E)
        x, dy = spread((T, K), gen), spread((T * k, N), gen)
        tw = torch.rand(T * k, generator=gen) + 0.05
        for sfmt, fmt, out_dtype in (("f32", "e4m3", torch.float32), ("ue8m0", "e5m2", torch.bfloat16)):
            xq, xs = libmoe.quantize_fp8_columns(x, m, g, k, rows="token", scale_format=sfmt)
            xtq, xts = libmoe.quantize_fp8_columns(x, m, g, k, rows="token", scale_format=sfmt, transposed=True)
            dyq, dys = libmoe.quantize_fp8_columns(dy, m, g, k, rows="slot", topk_weights=tw, fp8=fmt,
                                                   scale_format=sfmt)
            dytq, dyts = libmoe.quantize_fp8_columns(dy, m, g, k, rows="slot", topk_weights=tw, fp8=fmt,
                                                     scale_format=sfmt, transposed=True)
            self.assertEqual(tuple(xtq.shape), (K, T * k))
            self.assertTrue(torch.equal(xtq, xq.t()) and torch.equal(dytq, dyq.t()), sfmt)
            self.assertTrue(torch.equal(xts, xs) and torch.equal(dyts, dys), sfmt)
            want = libmoe.grouped_gemm_fp8_dw(xq, xs, dyq, dys, m, fp8=fmt, x_fp8="e4m3", out_dtype=out_dtype)
            got = libmoe.grouped_gemm_fp8_dw(xtq, xts, dytq, dyts, m, fp8=fmt, x_fp8="e4m3", out_dtype=out_dtype,
                                             codes_transposed=True)
            self.assertEqual(tuple(got.shape), (E, N, K))
            self.assertTrue(torch.equal(got, want), "%s %s %s" % (sfmt, fmt, out_dtype))
        untransposed = r"dy has shape \(%d, %d\), expected \(\*, %d\)" % (T * k, N, T * k)
        with self.assertRaisesRegex(ValueError, untransposed):
            libmoe.grouped_gemm_fp8_dw(xtq, xts, dyq, dys, m, codes_transposed=True)

    def test_bad_inputs_raise_and_change_nothing(self):
        gen = torch.Generator().manual_seed(112)
        ids = torch.randint(0, 3, (4, 2), generator=gen)
        m, g, _ = libmoe.routing_from_topk(ids, 3)
        x, dy = spread((4, 140), gen), spread((8, 20), gen)
        xq, xs = libmoe.quantize_fp8_columns(x, m, g, 2, rows="token")
        dyq, dys = libmoe.quantize_fp8_columns(dy, m, g, 2, rows="slot")
        self.assertEqual(tuple(xs.shape), (libmoe.column_scale_rows(8, 3), 140))
        self.assertEqual(libmoe.column_scale_rows(8, 3), 3)
        keep = [t.clone() for t in (x, dy, xq, xs, dyq, dys, m, g)]
        quant = lambda **kw: libmoe.quantize_fp8_columns(kw.get("x", x), kw.get("m", m),  # noqa: E731
                                                         kw.get("g", g), 2, rows=kw.get("rows", "token"),
                                                         topk_weights=kw.get("tw"))
        dw = lambda **kw: libmoe.grouped_gemm_fp8_dw(kw.get("xq", xq), kw.get("xs", xs), kw.get("dyq", dyq),  # noqa: E731
                                                     kw.get("dys", dys), kw.get("m", m),
                                                     out_dtype=kw.get("out", torch.float32))
        nan = x.clone()
        nan[3, 7] = float("nan")
        bad_scale = xs.clone()
        bad_scale[0, 5] = -1.0
        cases = [
            (ValueError, "rows must be one of", lambda: quant(rows="tokens")),
            (ValueError, "gather_indices is required", lambda: quant(g=None)),
            (TypeError, "x has dtype torch.float64", lambda: quant(x=x.double())),
            (ValueError, r"topk_weights has shape \(4,\)", lambda: quant(tw=torch.ones(4))),
            (libmoe.MoeError, r"src\[3\]\[7\] = nan", lambda: quant(x=nan)),
            (TypeError, "x has dtype torch.float32, expected torch.uint8", lambda: dw(xq=xq.float())),
            (ValueError, r"dy has shape \(7, 20\), expected \(8, \*\)", lambda: dw(dyq=dyq[:7].contiguous())),
            (ValueError, r"x_scales has shape \(2, 140\), expected \(3, 140\)", lambda: dw(xs=xs[:2].contiguous())),
            (TypeError, "dy_scales has dtype torch.uint8, expected torch.float32", lambda: dw(dys=dys.to(torch.uint8))),
            (TypeError, "out_dtype torch.float16", lambda: dw(out=torch.float16)),
            (libmoe.MoeError, r"x.scales\[0\]\[5\] = -1", lambda: dw(xs=bad_scale)),
        ]
        for exc, pattern, call in cases:
            with self.assertRaisesRegex(exc, pattern):
                call()
        for before, after in zip(keep, (x, dy, xq, xs, dyq, dys, m, g)):
            self.assertTrue(torch.equal(before, after))


class TestDwOnCuda(unittest.TestCase):
    @unittest.skipUnless(DEVICE.type == "cuda", "needs a CUDA device")
    def test_cuda_dw_against_the_reference(self):
        """The columns quantizer on CUDA tensors bit for bit the CPU's, dW within the model's bound (both scale
        formats, both output dtypes, partial tiles, an expert without rows); a bad scale raised by synchronize."""
        libmoe.synchronize(DEVICE)
        gen = torch.Generator().manual_seed(120)
        ids = torch.randint(0, 3, (150, 2), generator=gen)   # experts 0 .. 2: expert 3 has no rows
        m, g, _ = libmoe.routing_from_topk(ids, 4)
        x, dy = spread((150, 129), gen).cpu(), spread((300, 130), gen).cpu()
        tw = torch.rand(300, generator=gen) + 0.05
        on = lambda t: t.to(DEVICE)   # noqa: E731
        for sfmt in SCALE_FORMATS:
            xq, xs = libmoe.quantize_fp8_columns(x, m, g, 2, rows="token", scale_format=sfmt)
            dyq, dys = libmoe.quantize_fp8_columns(dy, m, g, 2, rows="slot", topk_weights=tw, fp8="e5m2",
                                                   scale_format=sfmt)
            cxq, cxs = libmoe.quantize_fp8_columns(on(x), on(m), on(g), 2, rows="token", scale_format=sfmt)
            cdyq, cdys = libmoe.quantize_fp8_columns(on(dy), on(m), on(g), 2, rows="slot", topk_weights=on(tw),
                                                     fp8="e5m2", scale_format=sfmt)
            libmoe.synchronize(DEVICE)
            for got, want, what in zip((cxq, cxs, cdyq, cdys), (xq, xs, dyq, dys), ("x q", "x s", "dy q", "dy s")):
                self.assertTrue(torch.equal(got.cpu(), want), "cuda vs reference: %s %s" % (what, sfmt))
            for out_dtype in (torch.float32, torch.bfloat16):
                got = libmoe.grouped_gemm_fp8_dw(cxq, cxs, cdyq, cdys, on(m), fp8="e5m2", x_fp8="e4m3",
                                                 out_dtype=out_dtype)
                libmoe.synchronize(DEVICE)
                within("cuda fp8 dw", got, fp8_model.gemm_fp8_dw(xq, xs, dyq, dys, m, "e5m2", "e4m3", out_dtype),
                       " (%s %s)" % (sfmt, out_dtype))
        bad = cxs.clone()
        bad[0, 5] = 255
        libmoe.grouped_gemm_fp8_dw(cxq, bad, cdyq, cdys, on(m), fp8="e5m2", x_fp8="e4m3")
        with self.assertRaisesRegex(libmoe.MoeError, r"x.scales\[0\]\[5\]"):
            libmoe.synchronize(DEVICE)
        libmoe.synchronize(DEVICE)


if __name__ == "__main__":
    unittest.main()
