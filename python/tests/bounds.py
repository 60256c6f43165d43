"""Float64 models of libmoe's ops on torch tensors with the derived error bounds the tests compare against.

The bound is the one of SEMANTICS section 4: a float32 sum of n terms (products or plain terms) in any
order is within gamma(n) * sum |terms| of the exact sum, gamma(n) = n u / (1 - n u), u = 2^-24; each
rounding to an output dtype adds u_out (|v| + e).  For the composite MLP the bounds compose by running
error analysis, the rules of specs/MLP.md "Error bound used by the tests" that testlib/mlp_bounds.c
implements in C: every quantity is carried as its exact float64 value v and a bound e on |computed - v|
(class EV).  Every rounding that an implementation may or may not make (a 16-bit checkpoint, the rounded
intermediates) is charged as u_dt (|v| + e) while v stays unrounded, so one bound covers both
intermediates="rounded" and "float32".  Two roundings are added to every sum's count to cover the CUDA
backend's split bf16 operands (specs/MLP.md, "Split operands on the GPU": up to 3 exact terms per
product, added after the per-term sums), and n 2^-52 * magnitude covers this float64 evaluation's own
rounding."""
import math

import torch

U32 = 2.0 ** -24
UNIT_ROUNDOFF = {torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}
# smallest subnormal / 2 of each dtype: the absolute error an underflow may add
ETA = {torch.float32: 2.0 ** -149, torch.float16: 2.0 ** -25, torch.bfloat16: 2.0 ** -134}
SPLIT_ROUNDINGS = 2
L1_ACT, L2_ACT = 1.13, 0.86   # max |act'|, max |act''| over the four activations (specs/MLP.md)
F64 = torch.float64


def gamma(n):
    n = n + SPLIT_ROUNDINGS
    return n * U32 / (1 - n * U32)


class EV:
    """A tensor of exact values v and error bounds e (both float64)."""

    def __init__(self, v, e=None):
        self.v = v.to(F64)
        self.e = torch.zeros_like(self.v) if e is None else e

    @property
    def mag(self):
        return self.v.abs() + self.e

    def __getitem__(self, idx):
        return EV(self.v[idx], self.e[idx])

    def map(self, fn):
        return EV(fn(self.v), fn(self.e))


def exact(t):
    return EV(t.detach())


def rnd(x, dtype):
    """A rounding to `dtype` that may happen (or not) at this point."""
    if dtype == torch.float32:
        return EV(x.v, x.e + U32 * x.mag + ETA[torch.float32])
    return EV(x.v, x.e + UNIT_ROUNDOFF[dtype] * x.mag + ETA[dtype])


def store(x, dtype):
    """The rounding of a float32 result to its output dtype (none when it is float32)."""
    return x if dtype == torch.float32 else rnd(x, dtype)


def mul(x, y):
    """fl32(x * y), elementwise."""
    prop = x.v.abs() * y.e + y.v.abs() * x.e + x.e * y.e
    v = x.v * y.v
    return EV(v, prop + U32 * (v.abs() + prop) + ETA[torch.float32])


def contract(eq, x, y, n, extra=None):
    """A float32 sum of products sum over the contracted index (einsum `eq`) with n terms per output, plus
    `extra` (an EV of plain terms added into the same sum, e.g. a bias), in any order."""
    v = torch.einsum(eq, x.v, y.v)
    mag = torch.einsum(eq, x.mag, y.mag)
    prop = torch.einsum(eq, x.v.abs(), y.e) + torch.einsum(eq, x.e, y.v.abs()) + torch.einsum(eq, x.e, y.e)
    if extra is not None:
        v, mag, prop, n = v + extra.v, mag + extra.mag, prop + extra.e, n + 1
    return EV(v, prop + gamma(n) * mag + n * (2.0 ** -52 * mag + ETA[torch.float32]))


def segment_sum(index, x, size, counts):
    """out[i] = float32 sum of the rows x[p] with index[p] == i (counts[i] of them, any order)."""
    shape = (size,) + tuple(x.v.shape[1:])
    v = torch.zeros(shape, dtype=F64).index_add_(0, index, x.v)
    mag = torch.zeros(shape, dtype=F64).index_add_(0, index, x.mag)
    prop = torch.zeros(shape, dtype=F64).index_add_(0, index, x.e)
    n = counts.to(F64).reshape((size,) + (1,) * (len(shape) - 1))
    g = (n + SPLIT_ROUNDINGS) * U32 / (1 - (n + SPLIT_ROUNDINGS) * U32)
    return EV(v, prop + g * mag + n * (2.0 ** -52 * mag + ETA[torch.float32]))


# ------------------------------------------------------------------------------------------------------
# Activations (SEMANTICS section 3) and their bounds at a computed argument (specs/MLP.md)
# ------------------------------------------------------------------------------------------------------
def act64(name, x):
    if name == "silu":
        return x * torch.sigmoid(x)
    if name == "swish":
        return x * torch.sigmoid(1.702 * x)
    if name == "gelu":
        return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
    c = math.sqrt(2 / math.pi)
    return 0.5 * x * (1 + torch.tanh(c * (x + 0.044715 * x ** 3)))


def dact64(name, x):
    if name in ("silu", "swish"):
        a = 1.0 if name == "silu" else 1.702
        s = torch.sigmoid(a * x)
        return s * (1 + a * x * (1 - s))
    if name == "gelu":
        return 0.5 * (1 + torch.erf(x / math.sqrt(2))) + x * torch.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    c = math.sqrt(2 / math.pi)
    t = torch.tanh(c * (x + 0.044715 * x ** 3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x)


def act_ev(name, g):
    x = g.mag
    return EV(act64(name, g.v), L1_ACT * g.e + 32 * U32 * (x + x * x) + ETA[torch.float32])


def dact_ev(name, g):
    x = g.mag
    cubic = 0.1 * x ** 3 if name == "gelu_tanh" else 0.0
    return EV(dact64(name, g.v), L2_ACT * g.e + 32 * U32 * (1 + x + cubic))


def within(name, got, want, detail=""):
    """Raises AssertionError naming the worst element when |got - want.v| > want.e anywhere."""
    diff = (got.detach().to("cpu", F64) - want.v).abs()
    bad = diff > want.e
    if bool(bad.any()):
        ratio = torch.where(want.e > 0, diff / want.e, torch.full_like(diff, math.inf))
        i = int(torch.argmax(ratio.reshape(-1)))
        idx, rest = [], i
        for extent in reversed(diff.shape):
            idx.insert(0, rest % extent)
            rest //= extent
        idx = tuple(idx)
        raise AssertionError("%s%s: element %s = %r, exact %r, |error| %.3g > bound %.3g (%d elements out)"
                             % (name, detail, idx, float(got.reshape(-1)[i]), float(want.v.reshape(-1)[i]),
                                float(diff.reshape(-1)[i]), float(want.e.reshape(-1)[i]), int(bad.sum())))
    return float((diff / want.e.clamp_min(1e-300)).max()) if diff.numel() else 0.0


# ------------------------------------------------------------------------------------------------------
# Grouped GEMM (SEMANTICS section 2)
# ------------------------------------------------------------------------------------------------------
def gemm_rows(x, m_sizes, gather, topk, permute_x):
    """Per expert-order row r: (expert of r, the x row it reads)."""
    E = m_sizes.numel()
    expert = torch.repeat_interleave(torch.arange(E), m_sizes.cpu())
    M = int(m_sizes.sum())
    src = (gather.cpu() // topk) if permute_x else torch.arange(M)
    return expert, src


def gemm_model(x, w, m_sizes, gather, topk, permute_x, permute_y, topk_weights, dy=None):
    """The forward Y and, with dy, (dX, dW, d_topk_weights) as EVs, each with its bound (dtype outputs)."""
    dtype = w.dtype
    X, W = exact(x.cpu()), exact(w.cpu())
    E, N, K = w.shape
    expert, src = gemm_rows(x, m_sizes, gather, topk, permute_x)
    M = expert.numel()
    g = gather.cpu() if gather is not None else torch.arange(M)
    slot = g if permute_y else torch.arange(M)       # where row r of Y (and of dY) lives
    Xr, Wr = X[src], W[expert]                         # [M, K], [M, N, K]
    y_r = contract("mk,mnk->mn", Xr, Wr, K)            # unrounded float32 rows
    tw = exact(topk_weights.cpu())[g] if topk_weights is not None else None
    if tw is not None:
        y_r = mul(y_r, EV(tw.v[:, None].expand_as(y_r.v), tw.e[:, None].expand_as(y_r.v)))
    Y = EV(torch.empty((M, N), dtype=F64), torch.empty((M, N), dtype=F64))
    Y.v[slot], Y.e[slot] = y_r.v, y_r.e
    Y = store(Y, dtype)
    if dy is None:
        return Y
    DY = exact(dy.cpu())[slot]                          # dY source rows, unweighted
    if tw is not None:
        DYw = mul(DY, EV(tw.v[:, None].expand_as(DY.v), tw.e[:, None].expand_as(DY.v)))
    else:
        DYw = DY
    dx_rows = contract("mn,mnk->mk", DYw, Wr, N * topk if permute_x else N)   # reduce_topk may sum flat
    if permute_x:   # reduce_topk: the k slot rows of each token summed in float32
        T = x.shape[0]
        token = g // topk
        dX = segment_sum(token, dx_rows, T, torch.bincount(token, minlength=T))
    else:
        dX = dx_rows
    counts = m_sizes.cpu()
    outer = EV(torch.einsum("mn,mk->mnk", DYw.v, Xr.v),
               torch.einsum("mn,mk->mnk", DYw.v.abs(), Xr.e) + torch.einsum("mn,mk->mnk", DYw.e, Xr.v.abs())
               + torch.einsum("mn,mk->mnk", DYw.e, Xr.e))
    dW = segment_sum(expert, outer, E, counts)
    dtw = None
    if tw is not None:   # <dY_src unweighted, y_r unrounded>: the products of y_r's K terms and N rows
        y_plain = contract("mk,mnk->mn", Xr, Wr, K)
        d_r = contract("mn,mn->m", DY, y_plain, N)
        dtw = EV(torch.empty(M, dtype=F64), torch.empty(M, dtype=F64))
        dtw.v[g], dtw.e[g] = d_r.v, d_r.e
        dtw = store(dtw, dtype)
    return Y, store(dX, dtype), store(dW, dtype), dtw


# ------------------------------------------------------------------------------------------------------
# Blockwise MoE MLP (SEMANTICS section 3)
# ------------------------------------------------------------------------------------------------------
def _rows(x, n):
    return EV(x.v[:, None].expand(-1, n), x.e[:, None].expand(-1, n))


def _clamp_mask(value, lo, hi):
    """(mask, ambiguous): mask = lo < v < hi at the exact values; ambiguous where the computed value's
    interval [v - e, v + e] straddles a limit, so that the implementation's mask may differ."""
    mask = torch.ones_like(value.v, dtype=torch.bool)
    amb = torch.zeros_like(mask)
    for limit, keep in ((lo, lambda v, l: v > l), (hi, lambda v, l: v < l)):
        if limit is None:
            continue
        mask &= keep(value.v, limit)
        amb |= (value.v - limit).abs() <= value.e
    return mask, amb


def _masked(x, mask, amb):
    """x where mask, 0 elsewhere; where the mask is ambiguous either may be computed."""
    v = torch.where(mask, x.v, torch.zeros_like(x.v))
    e = torch.where(amb, x.mag, torch.where(mask, x.e, torch.zeros_like(x.e)))
    return EV(v, e)


def mlp_pairs(layout, T):
    """The positions of a layout that hold a token: (token, expert) per such position."""
    b2e = layout.block_to_expert.cpu()
    pos = layout.token_position_to_id.cpu().reshape(b2e.numel(), layout.block_size)
    n_idx, b_idx = torch.nonzero((pos >= 0) & (pos < T), as_tuple=True)
    return pos[n_idx, b_idx], b2e[n_idx]


def mlp_model(hidden, aff, w_gu, w_d, b_gu, b_d, layout, activation="silu", affinity_on="H",
              clamp_linear=(None, None), clamp_non_linear=(None, None), out_grad=None):
    """The MLP's output and, with out_grad, every gradient, as EVs with their bounds (specs/MLP.md).
    Tensors in the library's layout; hidden [T1, H]; aff [T * E]."""
    dtype = w_gu.dtype
    T1, H = hidden.shape
    T = T1 - 1 if layout.pad_row else T1
    E, _, _, I = w_gu.shape
    tok, exp = mlp_pairs(layout, T)
    P = tok.numel()
    X = exact(hidden.cpu())[tok]                                  # [P, H]
    A = exact(aff.cpu().reshape(-1))[tok * E + exp]               # [P]
    Wg, Wu = exact(w_gu.cpu()[:, :, 0, :])[exp], exact(w_gu.cpu()[:, :, 1, :])[exp]   # [P, H, I]
    Wd = exact(w_d.cpu())[exp]                                    # [P, I, H]
    bias = b_gu is not None
    # An implementation may sum a token's pairs and each pair's products in one flat float32 sum: the sums
    # whose terms can be flattened across pairs (out, d_hidden) and across d's products (the affinity
    # gradient, d recomputed) are charged gamma of the flat sum's length at every level.
    counts_t = torch.bincount(tok, minlength=T1)
    kmax = int(counts_t.max()) if P else 1
    n_out, n_dx, n_d = (I + 2) * kmax, (2 * I + 1) * kmax, (I + 1) * (H + 1)
    g = contract("ph,phi->pi", X, Wg, H, exact(b_gu.cpu()[:, 0, :])[exp] if bias else None)
    u = contract("ph,phi->pi", X, Wu, H, exact(b_gu.cpu()[:, 1, :])[exp] if bias else None)
    g = EV(g.v.clamp(*clamp_non_linear) if any(c is not None for c in clamp_non_linear) else g.v, g.e)
    u = EV(u.v.clamp(*clamp_linear) if any(c is not None for c in clamp_linear) else u.v, u.e)
    g, u = rnd(g, dtype), rnd(u, dtype)            # the checkpoint (and the backward's operands)
    act = act_ev(activation, g)
    m = mul(act, u)
    bd = exact(b_d.cpu())[exp] if bias else None
    if affinity_on == "I":
        am = rnd(mul(m, _rows(A, I)), dtype)
        contrib = contract("pi,pih->ph", am, Wd, n_out, mul(bd, _rows(A, H)) if bias else None)
    else:
        contrib = mul(rnd(contract("pi,pih->ph", rnd(m, dtype), Wd, n_out, bd), dtype), _rows(A, H))
    out = store(segment_sum(tok, contrib, T1, counts_t), dtype)
    result = {"out": out}
    if out_grad is None:
        return result
    G = exact(out_grad.cpu())[tok]                                 # [P, H]
    d = contract("pi,pih->ph", rnd(m, dtype), Wd, n_d, bd)           # d, as checkpointed or recomputed
    d_aff_p = contract("ph,ph->p", G, rnd(d, dtype), n_d)
    d_aff = EV(torch.zeros(T * E, dtype=F64), torch.zeros(T * E, dtype=F64))
    d_aff.v[tok * E + exp], d_aff.e[tok * E + exp] = d_aff_p.v, d_aff_p.e
    dD = rnd(mul(G, _rows(A, H)), dtype)                           # a * G
    mm = rnd(mul(m, _rows(A, I)), dtype) if affinity_on == "I" else rnd(m, dtype)
    Gd = G if affinity_on == "I" else dD
    counts_e = torch.bincount(exp, minlength=E)
    outer = lambda a, b: EV(torch.einsum("pa,pb->pab", a.v, b.v),   # noqa: E731
                            torch.einsum("pa,pb->pab", a.v.abs(), b.e) + torch.einsum("pa,pb->pab", a.e, b.v.abs())
                            + torch.einsum("pa,pb->pab", a.e, b.e))
    d_w_d = segment_sum(exp, outer(mm, Gd), E, counts_e)
    dM = contract("ph,pih->pi", dD, Wd, H)
    mask_u, amb_u = _clamp_mask(u, *clamp_linear)
    mask_g, amb_g = _clamp_mask(g, *clamp_non_linear)
    du = rnd(_masked(mul(dM, act), mask_u, amb_u), dtype)
    dg = rnd(_masked(mul(mul(dM, u), dact_ev(activation, g)), mask_g, amb_g), dtype)
    d_wg = segment_sum(exp, outer(X, dg), E, counts_e)
    d_wu = segment_sum(exp, outer(X, du), E, counts_e)
    dx_p = contract("pi,phi->ph", dg, Wg, n_dx)
    dx_pu = contract("pi,phi->ph", du, Wu, n_dx)
    dx_p = EV(dx_p.v + dx_pu.v, dx_p.e + dx_pu.e + gamma(1) * (dx_p.mag + dx_pu.mag))
    d_hidden = segment_sum(tok, dx_p, T1, counts_t)
    result.update(d_hidden=store(d_hidden, dtype), d_affinities=store(d_aff, dtype),
                  d_w_gu=store(EV(torch.stack([d_wg.v, d_wu.v], 2), torch.stack([d_wg.e, d_wu.e], 2)), dtype),
                  d_w_d=store(d_w_d, dtype))
    if bias:
        result["d_b_gu"] = store(EV(torch.stack([segment_sum(exp, dg, E, counts_e).v, segment_sum(exp, du, E, counts_e).v], 1),
                                    torch.stack([segment_sum(exp, dg, E, counts_e).e, segment_sum(exp, du, E, counts_e).e], 1)), dtype)
        result["d_b_d"] = store(segment_sum(exp, dD, E, counts_e), dtype)
    return result
