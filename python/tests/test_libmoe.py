"""Tests of the libmoe Python package on one device: LIBMOE_TEST_DEVICE=cpu (default) or cuda.

Every function against a float64 computation within the derived bound of tests/bounds.py (SEMANTICS
section 4, composed for the MLP as specs/MLP.md derives it), gradients included; bad inputs raise and change
nothing; the struct mirrors against the C compiler's sizeof/offsetof (LIBMOE_ABI_PROGRAM); a small MoE layer
trained for a few steps with libmoe, checked at every step against a pure PyTorch float64 twin.

Run: tests/test_python.sh from the build folder (make check), or from the source tree
PYTHONPATH=python:python/tests LIBMOE_PATH=.libs python3 -m unittest -v test_libmoe"""
import math
import os
import subprocess
import unittest

import torch

import libmoe
from libmoe import _capi, _ops

import bounds
from bounds import within

DEVICE = torch.device(os.environ.get("LIBMOE_TEST_DEVICE", "cpu"))
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def block(B):
    """A test's MLP block size: the CUDA backend takes multiples of 16 (SEMANTICS section 3)."""
    return 16 if DEVICE.type == "cuda" else B


def rand(*shape, dtype=torch.float32, scale=1.0, gen=None):
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(dtype).to(DEVICE)


def routing_case(T, k, E, gen):
    """topk ids [T, k] with distinct experts per token (the MLP's rule), on DEVICE."""
    ids = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(T)]) if T else torch.zeros((0, k),
                                                                                                       dtype=torch.int64)
    return ids.to(DEVICE)


class TestAbi(unittest.TestCase):
    def test_struct_layouts_match_the_compiler(self):
        program = os.environ.get("LIBMOE_ABI_PROGRAM")
        if not program:
            self.skipTest("LIBMOE_ABI_PROGRAM (tests/python_abi) not given")
        lines = subprocess.run([program], capture_output=True, text=True, check=True).stdout.split("\n")
        seen = set()
        for line in filter(None, lines):
            struct, field, offset, size = line.split()
            cls = _capi.STRUCTS[struct]
            if field == "sizeof":
                self.assertEqual(ctypes_sizeof(cls), int(size), struct)
            else:
                self.assertEqual(getattr(cls, field).offset, int(offset), "%s.%s offset" % (struct, field))
                self.assertEqual(getattr(cls, field).size, int(size), "%s.%s size" % (struct, field))
                seen.add((struct, field))
        mirrored = {(s, f[0]) for s, cls in _capi.STRUCTS.items() for f in cls._fields_}
        self.assertEqual(seen, mirrored, "every mirrored field is checked, and only those")


def ctypes_sizeof(cls):
    import ctypes  # pylint: disable=import-outside-toplevel
    return ctypes.sizeof(cls)


class TestRouting(unittest.TestCase):
    def test_against_a_stable_sort(self):
        gen = torch.Generator().manual_seed(1)
        for T, k, E in ((0, 2, 3), (1, 1, 1), (7, 2, 5), (33, 4, 8)):
            ids = torch.randint(0, E, (T, k), generator=gen).to(DEVICE)
            m, g, s = libmoe.routing_from_topk(ids, E)
            flat = ids.reshape(-1).cpu()
            self.assertTrue(torch.equal(m.cpu(), torch.bincount(flat, minlength=E)))
            want = torch.tensor(sorted(range(T * k), key=lambda i: (int(flat[i]), i)), dtype=torch.int64)
            self.assertTrue(torch.equal(g.cpu(), want))
            self.assertTrue(torch.equal(s.cpu()[g.cpu()], torch.arange(T * k)))

    def test_bad_ids(self):
        with self.assertRaises(TypeError):
            libmoe.routing_from_topk(torch.zeros((2, 2), dtype=torch.int32, device=DEVICE), 3)
        with self.assertRaises(ValueError):
            libmoe.routing_from_topk(torch.zeros((4,), dtype=torch.int64, device=DEVICE), 3)
        if DEVICE.type == "cpu":   # CUDA checks the ids on the device (test_cuda_errors_via_synchronize)
            with self.assertRaisesRegex(libmoe.MoeError, "topk_ids"):
                libmoe.routing_from_topk(torch.tensor([[0, 5]], device=DEVICE), 3)


class TestGroupedGemm(unittest.TestCase):
    MODES = [(px, py, tw) for px in (False, True) for py in (False, True) for tw in (False, True)]

    def run_case(self, T, k, E, N, K, dtype, px, py, tw, seed):
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, E, (T, k), generator=gen).to(DEVICE)
        m, g, _ = libmoe.routing_from_topk(ids, E)
        M = T * k
        x = rand(T if px else M, K, dtype=dtype, gen=gen).requires_grad_()
        w = rand(E, N, K, dtype=dtype, gen=gen, scale=0.5).requires_grad_()
        weights = (torch.rand(M, generator=gen, dtype=torch.float64).to(dtype).to(DEVICE).requires_grad_()
                   if tw else None)
        use_gather = px or py or tw
        y = libmoe.grouped_gemm(x, w, m, g if use_gather else None, k, permute_x=px, permute_y=py,
                                topk_weights=weights)
        dy = rand(M, N, dtype=dtype, gen=gen)
        y.backward(dy)
        Y, dX, dW, dtw = bounds.gemm_model(x.detach(), w.detach(), m, g, k, px, py,
                                            weights.detach() if tw else None, dy)
        what = " (T=%d k=%d E=%d N=%d K=%d %s px=%d py=%d tw=%d)" % (T, k, E, N, K, dtype, px, py, tw)
        within("Y", y, Y, what)
        within("dX", x.grad, dX, what)
        within("dW", w.grad, dW, what)
        if tw:
            within("d_topk_weights", weights.grad, dtw, what)

    def test_every_mode_and_dtype(self):
        seed = 10
        for dtype in DTYPES:
            for px, py, tw in self.MODES:
                seed += 1
                self.run_case(9, 2, 4, 16, 24, dtype, px, py, tw, seed)
        self.run_case(0, 2, 3, 8, 8, torch.float32, True, True, True, 3)    # no tokens
        self.run_case(5, 1, 1, 8, 16, torch.float32, True, False, False, 4)  # one expert, top-1

    def test_only_the_needed_gradients_are_computed(self):
        calls = []
        real = _capi.call

        def spy(name, *args):
            if name.startswith("moe_gemm_"):
                opts = args[-1]._obj   # ctypes.byref
                calls.append((name, opts.dx_only, opts.dw_only))
            return real(name, *args)
        gen = torch.Generator().manual_seed(5)
        ids = torch.randint(0, 3, (4, 2), generator=gen).to(DEVICE)
        m, g, _ = libmoe.routing_from_topk(ids, 3)
        _capi.call = spy
        try:
            for need_x, need_w, need_tw, want in (
                    (True, False, False, [("moe_gemm_bwd", 1, 0)]),
                    (False, True, False, [("moe_gemm_bwd", 0, 1)]),
                    (True, True, True, [("moe_gemm_bwd", 0, 0)]),
                    (True, False, True, [("moe_gemm_bwd", 1, 0), ("moe_gemm_topk_weights_grad", 0, 0)]),
                    (False, False, True, [("moe_gemm_topk_weights_grad", 0, 0)])):
                x = rand(4, 8, gen=gen).requires_grad_(need_x)
                w = rand(3, 8, 8, gen=gen).requires_grad_(need_w)
                tw = rand(8, gen=gen).requires_grad_(need_tw)
                y = libmoe.grouped_gemm(x, w, m, g, 2, permute_x=True, permute_y=True, topk_weights=tw)
                del calls[:]
                y.sum().backward()
                self.assertEqual(calls, want, (need_x, need_w, need_tw))
                self.assertEqual((x.grad is not None, w.grad is not None, tw.grad is not None),
                                 (need_x, need_w, need_tw))
        finally:
            _capi.call = real

    def test_bad_inputs_raise_and_change_nothing(self):
        gen = torch.Generator().manual_seed(6)
        ids = torch.randint(0, 3, (4, 2), generator=gen).to(DEVICE)
        m, g, _ = libmoe.routing_from_topk(ids, 3)
        x, w = rand(4, 8, gen=gen), rand(3, 5, 8, gen=gen)
        keep = [t.clone() for t in (x, w, m, g)]
        other = torch.device("meta")   # a device libmoe does not take
        second = torch.device("cpu") if DEVICE.type == "cuda" else other   # mixed devices
        cases = [
            (ValueError, "x is on meta: only cpu and cuda", lambda: libmoe.grouped_gemm(x.to(other), w, m, g, 2, permute_x=True)),
            (ValueError, "w is on %s" % second, lambda: libmoe.grouped_gemm(x, w.to(second), m, g, 2, permute_x=True)),
            (ValueError, "gather_indices is on %s" % second,
             lambda: libmoe.grouped_gemm(x, w, m, g.to(second), 2, permute_x=True)),
            (TypeError, "x has dtype torch.float64", lambda: libmoe.grouped_gemm(x.double(), w, m, g, 2, permute_x=True)),
            (TypeError, "x has dtype torch.bfloat16", lambda: libmoe.grouped_gemm(x.bfloat16(), w, m, g, 2, permute_x=True)),
            (ValueError, r"x has shape \(4, 7\)", lambda: libmoe.grouped_gemm(x[:, :7], w, m, g, 2, permute_x=True)),
            (ValueError, "w is not contiguous", lambda: libmoe.grouped_gemm(x, w.transpose(1, 2).contiguous()
                                                                             .transpose(1, 2), m, g, 2, permute_x=True)),
            (ValueError, "x is not contiguous", lambda: libmoe.grouped_gemm(rand(8, 4, gen=gen).t(), w, m, g, 2,
                                                                             permute_x=True)),
            (TypeError, "m_sizes has dtype torch.int32", lambda: libmoe.grouped_gemm(x, w, m.int(), g, 2, permute_x=True)),
            (ValueError, r"m_sizes has shape \(2,\)", lambda: libmoe.grouped_gemm(x, w, m[:2], g, 2, permute_x=True)),
            (ValueError, "gather_indices is required", lambda: libmoe.grouped_gemm(x, w, m, None, 2, permute_x=True)),
            (ValueError, r"gather_indices has shape", lambda: libmoe.grouped_gemm(x, w, m, g[:4], 2, permute_x=True)),
            (ValueError, "topk must be", lambda: libmoe.grouped_gemm(x, w, m, g, 0, permute_x=True)),
            (TypeError, "m_sizes must be a torch.Tensor", lambda: libmoe.grouped_gemm(x, w, [4, 2, 2], g, 2, permute_x=True)),
        ]
        if DEVICE.type == "cpu":   # contents: checked by the library on the host (CUDA: on the device)
            bad_m = m.clone()
            bad_m[0] += 1
            bad_g = g.clone()
            bad_g[0] = bad_g[1]
            cases += [(libmoe.MoeError, "m_sizes", lambda: libmoe.grouped_gemm(x, w, bad_m, g, 2, permute_x=True)),
                      (libmoe.MoeError, "gather_indices", lambda: libmoe.grouped_gemm(x, w, m, bad_g, 2, permute_x=True))]
        for exc, pattern, call in cases:
            with self.assertRaisesRegex(exc, pattern):
                call()
        for before, after in zip(keep, (x, w, m, g)):
            self.assertTrue(torch.equal(before, after))


class TestMlp(unittest.TestCase):
    def case(self, T, k, E, H, I, B, dtype, seed, bias=False, pad_row=False, dropping=False):
        gen = torch.Generator().manual_seed(seed)
        ids = routing_case(T, k, E, gen)
        weights = torch.rand((T, k), generator=gen, dtype=torch.float64).to(dtype).to(DEVICE)
        layout = libmoe.mlp_layout(ids, E, block(B), weights, dropping=dropping, pad_row=pad_row)
        T1 = T + 1 if pad_row else T
        tensors = dict(hidden=rand(T1, H, dtype=dtype, gen=gen), affinities=layout.affinities,
                       w_gu=rand(E, H, 2, I, dtype=dtype, gen=gen, scale=0.5),
                       w_d=rand(E, I, H, dtype=dtype, gen=gen, scale=0.5))
        if bias:
            tensors.update(b_gu=rand(E, 2, I, dtype=dtype, gen=gen, scale=0.3),
                           b_d=rand(E, H, dtype=dtype, gen=gen, scale=0.3))
        for t in tensors.values():
            t.requires_grad_()
        return ids, weights, layout, tensors, rand(T1, H, dtype=dtype, gen=gen)

    def check(self, T, k, E, H, I, B, dtype, seed, bias=False, pad_row=False, dropping=False, **opts):
        ids, weights, layout, t, out_grad = self.case(T, k, E, H, I, B, dtype, seed, bias, pad_row, dropping)
        if not dropping:
            self.check_layout(ids, weights, layout, E, block(B), pad_row)
        out = libmoe.moe_mlp(t["hidden"], t["affinities"], t["w_gu"], t["w_d"], layout, t.get("b_gu"), t.get("b_d"),
                             **opts)
        out.backward(out_grad)
        model_opts = {key: opts[key] for key in ("activation", "affinity_on", "clamp_linear", "clamp_non_linear")
                      if key in opts}
        want = bounds.mlp_model(t["hidden"].detach(), t["affinities"].detach(), t["w_gu"].detach(), t["w_d"].detach(),
                                t["b_gu"].detach() if bias else None, t["b_d"].detach() if bias else None, layout,
                                out_grad=out_grad, **model_opts)
        what = " (%s bias=%d pad_row=%d dropping=%d %s)" % (dtype, bias, pad_row, dropping, opts)
        within("out", out if not pad_row else out[:T], want["out"][:T] if pad_row else want["out"], what)
        if pad_row:
            self.assertTrue(bool((out[T] == 0).all()), "the pad row of out is +0")
        within("d_hidden", t["hidden"].grad[:T], want["d_hidden"][:T], what)
        within("d_affinities", t["affinities"].grad, want["d_affinities"], what)
        within("d_w_gu", t["w_gu"].grad, want["d_w_gu"], what)
        within("d_w_d", t["w_d"].grad, want["d_w_d"], what)
        if bias:
            within("d_b_gu", t["b_gu"].grad, want["d_b_gu"], what)
            within("d_b_d", t["b_d"].grad, want["d_b_d"], what)

    def check_layout(self, ids, weights, layout, E, B, pad_row):
        """A dropless layout made from the rules: blocks by expert, ceil(m_e / B) each, tokens ascending."""
        T = ids.shape[0]
        pad = T if pad_row else -1
        want_b2e, want_pos = [], []
        for e in range(E):
            tokens = [t for t in range(T) if e in ids[t].tolist()]
            for start in range(0, len(tokens), B):
                want_b2e.append(e)
                chunk = tokens[start:start + B]
                want_pos += chunk + [pad] * (B - len(chunk))
        used = len(want_b2e)
        got_b2e = layout.block_to_expert.cpu()
        got_pos = layout.token_position_to_id.cpu()
        self.assertEqual(got_b2e[:used].tolist(), want_b2e)
        self.assertEqual(got_pos[:used * B].tolist(), want_pos)
        self.assertTrue(bool((got_pos[used * B:] == pad).all()), "the capacity's extra blocks hold only padding")
        aff = torch.zeros(T, E, dtype=weights.dtype)
        aff.scatter_(1, ids.cpu(), weights.cpu())
        self.assertTrue(torch.equal(layout.affinities.cpu(), aff.reshape(-1)))

    def test_options(self):
        seed = 100
        for dtype in DTYPES:
            for activation in ("silu", "gelu", "gelu_tanh", "swish"):
                seed += 1
                self.check(11, 2, 4, 16, 8, 4, dtype, seed, activation=activation)
            seed += 1
            self.check(11, 2, 4, 16, 8, 4, dtype, seed, bias=True, affinity_on="I", intermediates="float32")
        self.check(9, 2, 3, 16, 8, 16, torch.float32, 7, bias=True, pad_row=True, affinity_on="I")
        self.check(9, 3, 4, 8, 8, 2, torch.bfloat16, 8, dropping=True, activation="gelu")
        self.check(7, 1, 3, 8, 8, 4, torch.float32, 9, tensor_update_overwrite=True)
        self.check(0, 2, 3, 8, 8, 4, torch.float32, 10)

    def test_intermediates_option_reaches_the_library(self):
        """bf16: rounding the second-stage operands changes the result (the bound covers both)."""
        _, _, layout, t, _ = self.case(16, 2, 4, 32, 16, 4, torch.bfloat16, 12)
        args = (t["hidden"], t["affinities"], t["w_gu"], t["w_d"], layout)
        with torch.no_grad():
            rounded = libmoe.moe_mlp(*args, intermediates="rounded")
            kept = libmoe.moe_mlp(*args, intermediates="float32")
        self.assertFalse(torch.equal(rounded, kept))

    def test_clamps(self):
        # limits inside gaps of the data so that no mask is ambiguous (the model widens the bound there)
        self.check(10, 2, 3, 16, 8, 4, torch.float32, 20, bias=True, clamp_linear=(-0.9, 0.8),
                   clamp_non_linear=(None, 0.7), activation="swish")
        self.check(10, 2, 3, 16, 8, 4, torch.bfloat16, 21, clamp_linear=(None, 1.0), clamp_non_linear=(-1.0, None))

    def test_linear_weight_layout(self):
        _, _, layout, t, out_grad = self.case(8, 2, 3, 8, 8, 4, torch.float32, 30)
        E, H, _, I = t["w_gu"].shape
        lin_gu = t["w_gu"].detach().permute(0, 2, 3, 1).reshape(E, 2 * I, H).clone().requires_grad_()
        lin_d = t["w_d"].detach().transpose(1, 2).contiguous().requires_grad_()
        out_nki = libmoe.moe_mlp(t["hidden"], t["affinities"], t["w_gu"], t["w_d"], layout)
        out_lin = libmoe.moe_mlp(t["hidden"], t["affinities"], lin_gu, lin_d, layout, weight_layout="linear")
        self.assertTrue(torch.equal(out_nki, out_lin))
        out_nki.backward(out_grad)
        out_lin.backward(out_grad)
        self.assertTrue(torch.equal(lin_gu.grad.reshape(E, 2, I, H).permute(0, 3, 1, 2), t["w_gu"].grad))
        self.assertTrue(torch.equal(lin_d.grad.transpose(1, 2), t["w_d"].grad))

    def test_bad_inputs_raise_and_change_nothing(self):
        _, _, layout, t, _ = self.case(6, 2, 3, 8, 8, 4, torch.float32, 40)
        h, a, wgu, wd = (t[n].detach() for n in ("hidden", "affinities", "w_gu", "w_d"))
        keep = [x.clone() for x in (h, a, wgu, wd, layout.block_to_expert, layout.token_position_to_id)]
        cases = [
            (ValueError, "hidden is on meta: only cpu and cuda", lambda: libmoe.moe_mlp(h.to("meta"), a, wgu, wd, layout)),
            (ValueError, "w_d is on %s" % ("cpu" if DEVICE.type == "cuda" else "meta"),
             lambda: libmoe.moe_mlp(h, a, wgu, wd.to("cpu" if DEVICE.type == "cuda" else "meta"), layout)),
            (TypeError, "w_d has dtype torch.float16", lambda: libmoe.moe_mlp(h, a, wgu, wd.half(), layout)),
            (ValueError, r"w_d has shape", lambda: libmoe.moe_mlp(h, a, wgu, wd[:, :3], layout)),
            (ValueError, "hidden is not contiguous", lambda: libmoe.moe_mlp(rand(8, 6).t(), a, wgu, wd, layout)),
            (ValueError, r"affinities has shape", lambda: libmoe.moe_mlp(h, a[:-1], wgu, wd, layout)),
            (ValueError, "b_gu and b_d", lambda: libmoe.moe_mlp(h, a, wgu, wd, layout, rand(3, 2, 8))),
            (ValueError, "activation must be", lambda: libmoe.moe_mlp(h, a, wgu, wd, layout, activation="relu")),
            (ValueError, "intermediates must be", lambda: libmoe.moe_mlp(h, a, wgu, wd, layout, intermediates="f64")),
            (ValueError, "weight_layout must be", lambda: libmoe.moe_mlp(h, a, wgu, wd, layout, weight_layout="hf")),
            (TypeError, "layout must be an MlpLayout", lambda: libmoe.moe_mlp(h, a, wgu, wd, None)),
            (libmoe.MoeError, "limit", lambda: libmoe.moe_mlp(h, a, wgu, wd, layout, clamp_linear=(1.0, -1.0))),
            (ValueError, "block_size must be", lambda: libmoe.mlp_layout(torch.zeros((2, 1), dtype=torch.int64,
                                                                                      device=DEVICE), 3, 0)),
        ]
        if DEVICE.type == "cpu":
            bad = layout.token_position_to_id.clone()
            bad[0] = 99
            bad_layout = layout._replace(token_position_to_id=bad)
            cases.append((libmoe.MoeError, "token_position_to_id", lambda: libmoe.moe_mlp(h, a, wgu, wd, bad_layout)))
            cases.append((libmoe.MoeError, "topk_ids", lambda: libmoe.mlp_layout(
                torch.tensor([[1, 1]], device=DEVICE), 3, 4)))
        for exc, pattern, call in cases:
            with self.assertRaisesRegex(exc, pattern):
                call()
        for before, after in zip(keep, (h, a, wgu, wd, layout.block_to_expert, layout.token_position_to_id)):
            self.assertTrue(torch.equal(before, after))


def torch_moe_layer(hidden, ids, weights, w_gu, w_d):
    """A pure PyTorch MoE expert layer (SiLU gate, NKI weight layout): the same function as MoEExperts."""
    out = torch.zeros_like(hidden)
    for j in range(ids.shape[1]):
        e = ids[:, j]
        g = torch.einsum("th,thi->ti", hidden, w_gu[e, :, 0, :])
        u = torch.einsum("th,thi->ti", hidden, w_gu[e, :, 1, :])
        d = torch.einsum("ti,tih->th", torch.nn.functional.silu(g) * u, w_d[e])
        out = out + weights[:, j:j + 1] * d
    return out


class TestLayer(unittest.TestCase):
    def test_training_steps_track_pure_pytorch(self):
        """A small MoE layer (router + libmoe experts) trained for a few SGD steps in float32; at every step a
        pure PyTorch float64 twin evaluates the same parameters: libmoe's loss and every gradient must be
        within the derived bound (the MLP model's, carried through the loss) of the twin's, and the twin's
        gradients must equal the bound model's exact values (two float64 computations of one function)."""
        torch.manual_seed(0)
        T, H, I, E, k, steps, lr = 24, 16, 8, 4, 2, 5, 0.002
        layer = libmoe.MoEExperts(E, H, I, block_size=block(8), device=DEVICE)
        x = torch.randn(T, H, device=DEVICE)
        target = torch.randn(T, H, device=DEVICE)
        router = torch.randn(H, E, device=DEVICE)
        opt = torch.optim.SGD(layer.parameters(), lr=lr)
        losses = []
        for _ in range(steps):
            probs = torch.softmax(x @ router, dim=-1)
            weights, ids = torch.topk(probs, k, dim=-1)
            out = layer(x, ids, weights)
            diff = out - target
            loss = (diff * diff).sum()
            opt.zero_grad()
            loss.backward()
            # the twin, in float64 from the same parameters and routing
            w_gu = layer.w_gu.detach().double().cpu().requires_grad_()
            w_d = layer.w_d.detach().double().cpu().requires_grad_()
            out64 = torch_moe_layer(x.double().cpu(), ids.cpu(), weights.double().cpu(), w_gu, w_d)
            loss64 = ((out64 - target.double().cpu()) ** 2).sum()
            loss64.backward()
            # the bound of libmoe's out, through the loss: |d(loss)| <= sum 2|diff| e + e^2 + the float32 sum
            layout = libmoe.mlp_layout(ids, E, block(8))
            aff = torch.zeros(T, E, device=DEVICE).scatter(1, ids, weights).reshape(-1)
            want = bounds.mlp_model(x, aff, layer.w_gu.detach(), layer.w_d.detach(), None, None, layout,
                                    out_grad=2 * diff.detach())
            e_out = want["out"].e
            self.assertLessEqual((out.detach().cpu().double() - out64.detach()).abs().sub(e_out).max().item(), 0.0)
            d64 = (out64.detach() - target.double().cpu()).abs()
            loss_bound = (2 * d64 * e_out + e_out ** 2).sum() + bounds.gamma(T * H + 1) * ((d64 + e_out) ** 2).sum()
            self.assertLessEqual(abs(loss.item() - loss64.item()), loss_bound.item(), "step %d loss" % len(losses))
            # gradients: libmoe's backward of its own out_grad, against the model at that out_grad
            within("d_w_gu", layer.w_gu.grad, want["d_w_gu"], " step %d" % len(losses))
            within("d_w_d", layer.w_d.grad, want["d_w_d"], " step %d" % len(losses))
            losses.append((loss.item(), loss64.item()))
            opt.step()
        self.assertLess(losses[-1][0], losses[0][0], "the loss goes down: %s" % losses)


class TestCompat(unittest.TestCase):
    def test_unsloth_grouped_gemm_is_grouped_gemm(self):
        gen = torch.Generator().manual_seed(50)
        ids = torch.randint(0, 3, (6, 2), generator=gen).to(DEVICE)
        m, g, _ = libmoe.routing_from_topk(ids, 3)
        x, w, tw = rand(6, 8, gen=gen), rand(3, 8, 8, gen=gen), rand(12, gen=gen)
        for px, py, fuse in ((True, False, False), (False, True, True), (True, True, False)):
            xs = x if px else rand(12, 8, gen=gen)
            got = libmoe.compat.grouped_gemm(xs, w, m.int(), 2, g.int(), permute_x=px, permute_y=py,
                                             topk_weights=tw, fuse_mul_post=fuse, autotune=True)
            want = libmoe.grouped_gemm(xs, w, m, g, 2, permute_x=px, permute_y=py, topk_weights=tw if fuse else None)
            self.assertTrue(torch.equal(got, want))
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        libmoe.compat.grouped_gemm(xg, wg, m, 2, g, permute_x=True, dX_only=True).sum().backward()
        self.assertIsNotNone(xg.grad)
        self.assertIsNone(wg.grad)

    def test_grouped_mm_form(self):
        gen = torch.Generator().manual_seed(51)
        sizes = torch.tensor([3, 0, 5, 2])
        offs = torch.cumsum(sizes, 0).to(torch.int32).to(DEVICE)
        x = rand(10, 16, gen=gen).requires_grad_()
        w_enk = rand(4, 8, 16, gen=gen)
        w = w_enk.transpose(1, 2).requires_grad_()        # [E, K, N] as torch._grouped_mm takes it
        y = libmoe.compat.grouped_mm(x, w, offs)
        dy = rand(10, 8, gen=gen)
        y.backward(dy)
        Y, dX, dW, _ = bounds.gemm_model(x.detach(), w_enk, sizes.to(DEVICE), None, 1, False, False, None, dy)
        within("grouped_mm Y", y, Y)
        within("grouped_mm dX", x.grad, dX)
        within("grouped_mm dW", w.grad.transpose(1, 2), dW)
        with self.assertRaisesRegex(ValueError, "bias"):
            libmoe.compat.grouped_mm(x, w, offs, bias=rand(4, 8))
        if DEVICE.type == "cuda" and hasattr(torch, "_grouped_mm"):
            wb = w.detach().bfloat16()   # [E, K, N], the transpose of a contiguous [E, N, K]
            offs8 = torch.tensor([16, 16, 32, 64], dtype=torch.int32, device=DEVICE)   # groups of 16 rows
            xb = rand(64, 16, dtype=torch.bfloat16, gen=gen)
            ours = libmoe.compat.grouped_mm(xb, wb, offs8)
            theirs = torch._grouped_mm(xb, wb, offs=offs8)   # pylint: disable=protected-access
            Y = bounds.gemm_model(xb, wb.transpose(1, 2), torch.tensor([16, 0, 16, 32], device=DEVICE), None, 1,
                                  False, False, None)
            within("grouped_mm vs the model", ours, Y)
            within("torch._grouped_mm vs the model", theirs, Y)


class TestReadme(unittest.TestCase):
    def test_the_readme_example_trains(self):
        """README.md's Python example, run as it stands (on this test's device)."""
        readme = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "README.md")
        with open(readme) as f:
            text = f.read()
        section = text[text.index("## Python"):]
        code = section[section.index("```python\n") + len("```python\n"):section.index("```\n", 10)]
        code = code.replace('dev = 256, 512, 256, 8, 2, "cuda"', 'dev = 256, 512, 256, 8, 2, "%s"' % DEVICE)
        self.assertIn(str(DEVICE), code)
        torch.manual_seed(0)
        scope = {}
        exec(compile(code, "README.md (Python)", "exec"), scope)  # pylint: disable=exec-used
        self.assertTrue(math.isfinite(scope["loss"].item()))


class TestCallPaths(unittest.TestCase):
    """A plain eager call takes the autograd function where autograd records it and the raw call where it does
    not (libmoe._ops: the registered op's dispatch is left to the calls torch must see)."""

    def test_eager_calls_skip_the_dispatcher(self):
        gen = torch.Generator().manual_seed(70)
        ids = routing_case(6, 2, 3, gen)
        m, g, _ = libmoe.routing_from_topk(ids, 3)
        x, w = rand(6, 8, gen=gen).requires_grad_(), rand(3, 4, 8, gen=gen).requires_grad_()
        y = libmoe.grouped_gemm(x, w, m, g, 2, permute_x=True)
        self.assertEqual(type(y.grad_fn).__name__, "GroupedGemmFunctionBackward")
        with torch.no_grad():
            y_raw = libmoe.grouped_gemm(x, w, m, g, 2, permute_x=True)
        self.assertIsNone(y_raw.grad_fn)
        self.assertFalse(y_raw.requires_grad)
        self.assertTrue(torch.equal(y.detach(), y_raw))
        y_plain = libmoe.grouped_gemm(x.detach(), w.detach(), m, g, 2, permute_x=True)   # nothing requires grad
        self.assertIsNone(y_plain.grad_fn)
        self.assertTrue(torch.equal(y_plain, y_raw))


@unittest.skipUnless(_ops.HAS_CUSTOM_OP, "this torch has no torch.library.custom_op (plain autograd functions)")
class TestCustomOps(unittest.TestCase):
    def test_dispatch_modes_see_the_registered_op(self):
        from torch.utils._python_dispatch import TorchDispatchMode  # pylint: disable=import-outside-toplevel

        class Record(TorchDispatchMode):
            def __init__(self):
                super().__init__()
                self.ops = []

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                self.ops.append(str(func))
                return func(*args, **(kwargs or {}))
        gen = torch.Generator().manual_seed(71)
        ids = routing_case(6, 2, 3, gen)
        m, g, _ = libmoe.routing_from_topk(ids, 3)
        x, w = rand(6, 8, gen=gen), rand(3, 4, 8, gen=gen)
        eager = libmoe.grouped_gemm(x, w, m, g, 2, permute_x=True)
        with Record() as record:
            seen = libmoe.grouped_gemm(x, w, m, g, 2, permute_x=True)
        self.assertIn("libmoe.gemm_fwd.default", record.ops)
        self.assertTrue(torch.equal(eager, seen))
        with Record() as record:
            libmoe.grouped_gemm(x, w, m, g, 2, permute_x=True)
            dx, _, _ = _ops.gemm_bwd(x, w, eager, m, g, None, 2, True, False, False, True, False, False)
        self.assertIn("libmoe.gemm_bwd.default", record.ops)
        self.assertEqual(dx.shape, x.shape)

    def test_opcheck_and_compile(self):
        gen = torch.Generator().manual_seed(60)
        ids = torch.randint(0, 3, (5, 2), generator=gen).to(DEVICE)
        m, g, _ = libmoe.routing_from_topk(ids, 3)
        x, w, tw = rand(5, 8, gen=gen), rand(3, 8, 8, gen=gen), rand(10, gen=gen)
        args = (x, w, m, g, tw, 2, True, True, False)
        torch.library.opcheck(torch.ops.libmoe.gemm_fwd.default, args,
                              test_utils=("test_schema", "test_faketensor"))

        def step(x, w, tw):
            return libmoe.grouped_gemm(x, w, m, g, 2, permute_x=True, permute_y=True, topk_weights=tw)
        compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
        xs = [t.clone().requires_grad_() for t in (x, w, tw)]
        xc = [t.clone().requires_grad_() for t in (x, w, tw)]
        step(*xs).square().sum().backward()
        compiled(*xc).square().sum().backward()
        for a, b in zip(xs, xc):
            self.assertTrue(torch.equal(a.grad, b.grad))

        # the MLP, its layout built outside the compiled function (the builders are ctypes calls)
        _, _, layout, t, out_grad = TestMlp().case(9, 2, 3, 16, 8, 4, torch.float32, 62, bias=True)
        mlp_args = (t["hidden"].detach(), t["affinities"].detach(), t["w_gu"].detach(), t["w_d"].detach(),
                    t["b_gu"].detach(), t["b_d"].detach(), layout.block_to_expert, layout.token_position_to_id,
                    layout.block_size, 1, False, False, [float("nan"), 1.5, -2.0, float("nan")], False, False, True)
        torch.library.opcheck(torch.ops.libmoe.mlp_fwd.default, mlp_args, test_utils=("test_schema", "test_faketensor"))

        def mlp_step(h, wgu, wd):
            return libmoe.moe_mlp(h, t["affinities"].detach(), wgu, wd, layout, activation="gelu",
                                  clamp_linear=(None, 1.5))
        compiled_mlp = torch.compile(mlp_step, backend="aot_eager", fullgraph=True)
        eager_in = [t[n].detach().clone().requires_grad_() for n in ("hidden", "w_gu", "w_d")]
        comp_in = [t[n].detach().clone().requires_grad_() for n in ("hidden", "w_gu", "w_d")]
        mlp_step(*eager_in).backward(out_grad)
        compiled_mlp(*comp_in).backward(out_grad)
        for a, b in zip(eager_in, comp_in):
            self.assertTrue(torch.equal(a.grad, b.grad))


@unittest.skipUnless(DEVICE.type == "cuda", "needs a CUDA device")
class TestCuda(unittest.TestCase):
    def test_cuda_graph_capture(self):
        gen = torch.Generator().manual_seed(61)
        ids = routing_case(64, 2, 4, gen)
        m, g, _ = libmoe.routing_from_topk(ids, 4)
        x, w = rand(64, 64, dtype=torch.bfloat16, gen=gen), rand(4, 64, 64, dtype=torch.bfloat16, gen=gen)
        eager = libmoe.grouped_gemm(x, w, m, g, 2, permute_x=True)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            libmoe.grouped_gemm(x, w, m, g, 2, permute_x=True)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = libmoe.grouped_gemm(x, w, m, g, 2, permute_x=True)
        graph.replay()
        torch.cuda.synchronize()
        self.assertTrue(torch.equal(eager, captured))
        # the MoE layer's forward (the layout built on the device, then the MLP) under capture too
        layer = libmoe.MoEExperts(4, 64, 32, block_size=16, dtype=torch.bfloat16, device=DEVICE)
        weights = torch.rand((64, 2), generator=gen).to(torch.bfloat16).to(DEVICE)
        with torch.no_grad():
            eager = layer(x, ids, weights)
            with torch.cuda.stream(stream):
                layer(x, ids, weights)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                captured = layer(x, ids, weights)
        graph.replay()
        torch.cuda.synchronize()
        self.assertTrue(torch.equal(eager, captured))

    def test_cuda_errors_via_synchronize(self):
        libmoe.synchronize(DEVICE)
        libmoe.routing_from_topk(torch.tensor([[0, 7]], device=DEVICE), 3)
        with self.assertRaisesRegex(libmoe.MoeError, "topk_ids"):
            libmoe.synchronize(DEVICE)
        m = torch.tensor([3, 0], device=DEVICE)     # sums to 3, not 2
        libmoe.grouped_gemm(rand(2, 8), rand(2, 8, 8), m)
        with self.assertRaisesRegex(libmoe.MoeError, "m_sizes"):
            libmoe.synchronize(DEVICE)
        libmoe.synchronize(DEVICE)                   # the error was forgotten


if __name__ == "__main__":
    unittest.main()
