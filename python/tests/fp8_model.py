"""Models of libmoe's FP8 ops on torch tensors, made here from the definitions (specs/FP8.md), sharing nothing with
the library:

    decode_table   the 256 values of a format, from its fields with ldexp
    encode         the saturating round-to-nearest-even conversion, by a search over the finite values
    quantize       the quantizers' scales and codes (section 3), in float32 as the rule states it
    dequantize     decode(q) * scale in float32, rounded to the output dtype
    gemm_fp8       the FP8 grouped GEMM's exact value in float64 and the bound of oracle/fp8_oracle.c (section 4),
                   as an EV of bounds.py
    quantize_columns, gemm_fp8_dw   dW's 128 x 1 quantizer (quantize's rule on each expert's rows, transposed) and
                   FP8 dW's value and bound
"""
import math

import torch

from bounds import EV

FORMATS = {"e4m3": (4, 3, 7), "e5m2": (5, 2, 15)}   # exponent bits, mantissa bits, bias
MAX = {"e4m3": 448.0, "e5m2": 57344.0}
AMAX_FLOOR = torch.tensor(1e-4, dtype=torch.float32)   # MOE_FP8_AMAX_FLOOR, a float32
TILE = 128
F64 = torch.float64
U = 2.0 ** -24
OUTPUT_ROUNDING = {torch.float32: (2.0 ** -24, 2.0 ** -150), torch.bfloat16: (2.0 ** -8, 2.0 ** -134)}


def tiles(n):
    return (n + TILE - 1) // TILE


def decode_table(fmt):
    """float64 [256]: the value of every code (NaN codes NaN, e5m2's Inf codes +-inf)."""
    ebits, mbits, bias = FORMATS[fmt]
    values = []
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        e, m = (code & 0x7f) >> mbits, code & ((1 << mbits) - 1)
        if fmt == "e4m3" and (code & 0x7f) == 0x7f:
            values.append(math.nan)
        elif fmt == "e5m2" and e == (1 << ebits) - 1:
            values.append(sign * math.inf if m == 0 else math.nan)
        elif e == 0:
            values.append(sign * math.ldexp(m, 1 - bias - mbits))
        else:
            values.append(sign * math.ldexp((1 << mbits) + m, e - bias - mbits))
    return torch.tensor(values, dtype=F64)


def decode(q, fmt):
    return decode_table(fmt)[q.cpu().long()]


def encode(v, fmt):
    """uint8 codes of float32 v (finite): the nearest finite value, ties to the even code, saturating at
    +-max; signed zeros kept."""
    table = decode_table(fmt)
    top = int((table[:128] == MAX[fmt]).nonzero()[0])   # the largest finite positive code
    positive = table[:top + 1]                            # increasing with the code
    a = v.to(F64).abs().clamp(max=MAX[fmt])
    hi = torch.searchsorted(positive, a).clamp(max=top)
    lo = (hi - 1).clamp(min=0)
    twice, mid = 2 * a, positive[lo] + positive[hi]      # both exact in float64
    code = torch.where(twice < mid, lo, torch.where(twice > mid, hi, torch.where(lo % 2 == 0, lo, hi)))
    return (code | torch.signbit(v.cpu()).long() * 0x80).to(torch.uint8)


def _tiled(x, tile_rows):
    """x [B, R, C] float32 -> [B, tiles(R), tiles(C), tile_rows * 128], zero padded (a tile's elements)."""
    B, R, C = x.shape
    tr, tc = tiles(R) if tile_rows == TILE else R, tiles(C)
    padded = torch.zeros((B, tr * tile_rows, tc * TILE), dtype=x.dtype)
    padded[:, :R, :C] = x
    return padded.reshape(B, tr, tile_rows, tc, TILE).permute(0, 1, 3, 2, 4).reshape(B, tr, tc, tile_rows * TILE)


def _per_element(s, R, C, tile_rows):
    """scales [B, tr, tc] -> [B, R, C], each element its tile's."""
    return s.repeat_interleave(tile_rows, 1)[:, :R].repeat_interleave(TILE, 2)[:, :, :C]


def quantize(x, fmt, scale_format, tile_rows, shape):
    """(codes uint8 of x's shape, scales float32 or uint8) of x viewed as [B, R, C] = shape (float32 arithmetic:
    amax over each tile floored at 1e-4, scale = amax / max, factor = max / amax; UE8M0: b = 127 + ceil(log2(amax
    / max)) and factor 2^(127 - b))."""
    B, R, C = shape
    x32 = x.detach().cpu().to(torch.float32).reshape(B, R, C)
    mx = torch.tensor(MAX[fmt], dtype=torch.float32)
    amax = torch.maximum(_tiled(x32, tile_rows).abs().amax(-1), AMAX_FLOOR)
    scale = amax / mx
    if scale_format == "ue8m0":
        mantissa, exponent = torch.frexp(scale)
        biased = 127 + torch.where(mantissa == 0.5, exponent - 1, exponent)
        factor = torch.pow(torch.tensor(2.0, dtype=F64), (127 - biased).to(F64)).to(torch.float32)
        scales = biased.to(torch.uint8)
    else:
        factor = mx / amax
        scales = scale
    q = encode(x32 * _per_element(factor, R, C, tile_rows), fmt)
    return q, scales


def scale_values(scales):
    """float64 values of float32 scales or UE8M0 bytes."""
    s = scales.detach().cpu()
    if s.dtype == torch.uint8:
        return torch.pow(torch.tensor(2.0, dtype=F64), s.to(F64) - 127)
    return s.to(F64)


def dequantize(q, scales, fmt, tile_rows, shape, dtype):
    """decode(q) * scale, the product in float32, rounded to dtype."""
    B, R, C = shape
    values = decode(q, fmt).to(torch.float32).reshape(B, R, C)
    s = scale_values(scales).to(torch.float32).reshape(B, tiles(R) if tile_rows == TILE else R, tiles(C))
    return (values * _per_element(s, R, C, tile_rows)).to(dtype)


def _promoted(a, sa, b, sb):
    """Per output element, from a [P, L], b [P, Q, L] (codes' values, float64) and the scales of each of their
    reduction tiles sa [P, t], sb [P, Q, t]: (value, magnitude, underflow) as oracle/fp8_oracle.c's promoted_dot
    sums them, each [P, Q]."""
    P, L = a.shape
    t = tiles(L)
    ap = torch.zeros((P, t * TILE), dtype=F64)
    ap[:, :L] = a
    bp = torch.zeros((P, b.shape[1], t * TILE), dtype=F64)
    bp[:, :, :L] = b
    ap, bp = ap.reshape(P, t, TILE), bp.reshape(P, -1, t, TILE)
    part = torch.einsum("ptc,pqtc->pqt", ap, bp)
    magnitude = torch.einsum("ptc,pqtc->pqt", ap.abs(), bp.abs())
    s = sa[:, None, :] * sb
    return ((s * part).sum(-1), (s.abs() * magnitude).sum(-1),
            (2.0 ** -150 * (2 * magnitude + 1)).sum(-1))


def gemm_fp8(a_q, a_s, w_q, w_s, m_sizes, gather, topk, permute_x, permute_y, topk_weights, dx, reduce_topk,
             fp8, w_fp8, out_dtype, tile_acc_bits=0):
    """The FP8 GEMM (fwd, or dX with dx) as EV(exact value, oracle bound) of the output's shape; tile_acc_bits as
    oracle/oracle_fp8.h's (0: float32 in-tile sums; 13: Hopper's FP8 wgmma)."""
    A, SA = decode(a_q, fp8), scale_values(a_s)
    W, SW = decode(w_q, w_fp8), scale_values(w_s)
    E, N, K = W.shape
    expert = torch.repeat_interleave(torch.arange(E), m_sizes.cpu())
    M = expert.numel()
    slot = gather.cpu() if gather is not None else torch.arange(M)
    tw = topk_weights.detach().cpu().to(F64)[slot] if topk_weights is not None else torch.ones(M, dtype=F64)
    if not dx:   # rows of X against W[e][n][:], tiles of K
        src = slot // topk if permute_x else torch.arange(M)
        n_block = torch.arange(N) // TILE
        value, mag, under = _promoted(A[src], SA[src], W[expert], SW[expert][:, n_block, :])
        length, out_rows, dest = K, M, slot if permute_y else torch.arange(M)
    else:        # rows of dY against W[e][:][c], tiles of N
        src = slot if permute_y else torch.arange(M)
        c_block = torch.arange(K) // TILE
        value, mag, under = _promoted(A[src], SA[src], W[expert].transpose(1, 2),
                                      SW[expert][:, :, c_block].transpose(1, 2))
        length = N
        out_rows = M // topk if reduce_topk else M
        dest = slot // topk if reduce_topk else (slot if permute_x else torch.arange(M))
    weighted = topk_weights is not None
    value, mag = tw[:, None] * value, tw.abs()[:, None] * mag
    under = tw.abs().clamp(min=1.0)[:, None] * under + (2.0 ** -150 if weighted else 0.0)
    cols = value.shape[1]
    total = [torch.zeros((out_rows, cols), dtype=F64).index_add_(0, dest, t) for t in (value, mag, under)]
    value, mag, under = total
    roundings = min(length, TILE) + 2 + tiles(length) + int(weighted) + (topk if dx and reduce_topk else 0)
    if tile_acc_bits == 0:
        g = roundings * U / (1 - roundings * U)
        acc = g * mag + under * (1 + g)
    else:   # the in-tile sums' c S instead of their roundings (oracle_fp8.h)
        in_tile = min(length, TILE)
        rest = roundings - in_tile
        g = rest * U / (1 - rest * U)
        ge = (in_tile + 31) // 32 * 34.0 * 2.0 ** -tile_acc_bits
        c = ge * (1 + ge)
        acc = g * mag + (1 + g) * (c * mag + (1 + c) * under)
    u_out, eta_out = OUTPUT_ROUNDING[out_dtype]
    return EV(value, acc + u_out * (value.abs() + acc) + eta_out + roundings * 2.0 ** -52 * mag)


def _bound(value, mag, under, roundings, out_dtype):
    """oracle/fp8_oracle.c's bound with float32 in-tile sums, `roundings` per element (a tensor)."""
    g = roundings * U / (1 - roundings * U)
    acc = g * mag + under * (1 + g)
    u_out, eta_out = OUTPUT_ROUNDING[out_dtype]
    return acc + u_out * (value.abs() + acc) + eta_out + roundings * 2.0 ** -52 * mag


def column_scale_rows(M, E):
    return tiles(M) + E - 1


def quantize_columns(x, m_sizes, gather, topk, rows, topk_weights, fmt, scale_format):
    """moe_quantize_fp8_columns' (codes [M, C], scales [tiles(M) + E - 1, C]): expert row r's values (row r, g_r
    or g_r / topk of x, times topk_weights[g_r] in float32), each expert's rows quantized as quantize's 1 x 128
    tiles of the transposed segment; rows no tile uses get a zero tile's scale."""
    sizes = [int(v) for v in m_sizes.cpu()]
    M, E, C = sum(sizes), len(sizes), x.shape[1]
    slot = gather.cpu() if gather is not None else torch.arange(M)
    src = {"expert": torch.arange(M), "slot": slot, "token": slot // topk}[rows]
    v = x.detach().cpu().to(torch.float32)[src]
    if topk_weights is not None:
        v = topk_weights.detach().cpu()[slot][:, None] * v
    _, empty = quantize(torch.zeros(1, 1), fmt, scale_format, 1, (1, 1, 1))
    q = torch.zeros((M, C), dtype=torch.uint8)
    scales = empty.reshape(1).repeat(column_scale_rows(M, E) * C).reshape(-1, C)
    first = 0
    for e, m in enumerate(sizes):
        if m:
            qe, se = quantize(v[first:first + m].t().contiguous(), fmt, scale_format, 1, (1, C, m))
            q[first:first + m] = qe.reshape(C, m).t()
            row = first // TILE + e
            scales[row:row + tiles(m)] = se.reshape(C, tiles(m)).t()
        first += m
    return q, scales


def gemm_fp8_dw(x_q, x_s, dy_q, dy_s, m_sizes, fp8, x_fp8, out_dtype):
    """FP8 dW as EV(exact value [E, N, K], oracle bound): per expert, its 128-row tiles' exact sums times the
    tile's scales (scale row first / 128 + e + t) in float64."""
    X, SX = decode(x_q, x_fp8), scale_values(x_s)
    DY, SDY = decode(dy_q, fp8), scale_values(dy_s)
    sizes = [int(v) for v in m_sizes.cpu()]
    E, N, K = len(sizes), DY.shape[1], X.shape[1]
    value, bound = torch.zeros((E, N, K), dtype=F64), torch.zeros((E, N, K), dtype=F64)
    first = 0
    for e, m in enumerate(sizes):
        row = first // TILE + e
        a, sa = DY[first:first + m].t(), SDY[row:row + tiles(m)].t()                # [N, m], [N, t]
        b = X[first:first + m].t()[None].expand(N, K, m)                             # [N, K, m]
        sb = SX[row:row + tiles(m)].t()[None].expand(N, K, tiles(m))                 # [N, K, t]
        v, mag, under = _promoted(a, sa, b, sb) if m else (torch.zeros(N, K, dtype=F64),) * 3
        value[e] = v
        bound[e] = _bound(v, mag, under, min(m, TILE) + 2 + tiles(m), out_dtype)
        first += m
    return EV(value, bound)
