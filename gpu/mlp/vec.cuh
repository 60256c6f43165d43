// V-wide element access of the MLP's elementwise kernels (16-byte vectors where the tensors allow them) and the
// rows path's operand rows: one value rounded to the dtype, or on the split path its exact bf16 terms.
#ifndef LIBMOE_GPU_MLP_VEC_CUH
#define LIBMOE_GPU_MLP_VEC_CUH

#include "common/dtype.cuh"
#include "mlp/args.cuh"

namespace moe_gpu {

// V consecutive elements (V = 8: 16-byte vectors, needs aligned tensors and 8 | the row length; V = 4:
// 4-element vectors, aligned to 4 elements (16 bytes for f32), 4 | the row length; V = 1).
template <int V> __device__ __forceinline__ void load_v(moe_dtype dt, const void *base, int64_t i, float *v)
{
    if (V == 8)
        load8(dt, base, i, v);
    else if (V == 4)
        load4(dt, base, i, v);
    else
        v[0] = load_as_float(dt, base, i);
}
template <int V> __device__ __forceinline__ void store_v(moe_dtype dt, void *base, int64_t i, const float *v)
{
    if (V == 8)
        store8(dt, base, i, v);
    else if (V == 4)
        store4(dt, base, i, v);
    else
        store_from_float(dt, base, i, v[0]);
}

// Split path: expert e's rows repeated three times over as its term rows 3 off[e] .. 3 off[e+1] (off =
// row_offsets): term p of row r at first + p * step, first = r + 2 off[e], step = off[e+1] - off[e].
__device__ __forceinline__ void term_rows_of(const MlpArgs &g, int64_t r, int64_t e, int64_t &first, int64_t &step)
{
    const int64_t lo = g.row_offsets[e];
    first = r + 2 * lo, step = g.row_offsets[e + 1] - lo;
}

// V float32 values of row r (expert e) of a GEMM's output rows from column h (rows of `width`): the row, or on
// the split path the sum of its term rows' values, (t0 + t1) + t2.
template <int V>
__device__ __forceinline__ void load_row_v(const MlpArgs &g, const float *base, int64_t r, int64_t e, int64_t width,
                                           int64_t h, float *c)
{
    if (!g.split) {
        load_v<V>(MOE_F32, base, r * width + h, c);
        return;
    }
    int64_t first, step;
    term_rows_of(g, r, e, first, step);
    float t1[V], t2[V];
    load_v<V>(MOE_F32, base, first * width + h, c);
    load_v<V>(MOE_F32, base, (first + step) * width + h, t1);
    load_v<V>(MOE_F32, base, (first + 2 * step) * width + h, t2);
#pragma unroll
    for (int u = 0; u < V; u++)
        c[u] = (c[u] + t1[u]) + t2[u];
}

// Split operands (bf16 without round_intermediates; specs/MLP.md, "Split operands on the GPU"): the
// float32 intermediates stay unrounded, so each operand the GEMMs read is stored as exact bf16 terms
// (store_terms_v) at the row's three "term rows" (term_rows_of), and every GEMM that reads such an operand
// runs once over the term rows (term_offsets): a GEMM with a float32 output (the forward's down projection
// and its checkpoint's, the recomputed d, dX) gives each term its own output row, which the next kernel
// sums, (t0 + t1) + t2 (load_row_v); a weight gradient reduces over the term rows, the three terms of a row
// as three rows of the reduction with the other operand's row (X3, S3) copied beside each.
//   A float32 value v (24 significant bits) is hi + mid + lo: hi = v truncated to bf16 (its upper 16 bits: round
// toward zero, so hi has v's sign and |hi| <= |v|), r = v - hi (exact, the lower 16 bits), mid = r truncated the
// same way, lo = r - mid (exact, at most 8 significant bits).  Every term has v's sign, so |hi| + |mid| + |lo| =
// |v| and a GEMM's magnitude sum is unchanged; each product of a term with a bf16 value is exact in float32,
// and the float32 sums of hi + mid + lo (the bias gradients) give v back.  An infinite v stays in hi (the rest
// 0, not inf - inf); a NaN v makes the others NaN.  Exact for |v| >= 2^-110; below, lo falls into bf16's
// subnormal range and drops bits under 2^-133.
//   The backward keeps G, a bf16 tensor, as the down projection's gradient operand in both placements
// (a_in_m): dM = a * (G . W_d^T) and d_w_d = (a*m)^T . G, one term of G where a*G would need two (it has up
// to 16 significant bits).
//   One GEMM per term, accumulating in the float32 output, goes through the sm90 kernel's read-modify-write
// epilogue, a costly extra pass per term; running each GEMM once over the term rows made the weight gradients,
// then the float32-output GEMMs, faster (H200; bench/RESULTS.md, "where the split backward's time goes" and
// "every split GEMM over term rows").
// The 3 terms above of v, term p at base + i + p * stride (bf16 elements).
template <int V>
__device__ __forceinline__ void store_terms_v(void *base, int64_t stride, int64_t i, const float *v)
{
    float hi[V], mid[V], lo[V];
#pragma unroll
    for (int u = 0; u < V; u++) {
        hi[u] = truncate_to_bf16(v[u]);
        const float r = fabsf(v[u]) == INFINITY ? 0.0f : v[u] - hi[u];
        mid[u] = truncate_to_bf16(r);
        lo[u] = r - mid[u];
    }
    __nv_bfloat16 *terms = static_cast<__nv_bfloat16 *>(base);
    store_v<V>(MOE_BF16, terms, i, hi);
    store_v<V>(MOE_BF16, terms + stride, i, mid);
    store_v<V>(MOE_BF16, terms + 2 * stride, i, lo);
}

__device__ __forceinline__ float row_affinity(const MlpArgs &g, int64_t pos)
{
    return load_as_float(g.dt, g.aff, token_of(g, pos) * g.E + g.b2e[pos / g.B]);
}

// An operand of row r (expert e), V values from column col of a row of `width`: rounded once to dt at row r, or
// on the split path its terms at r's term rows.
template <int V>
__device__ __forceinline__ void store_operand_v(const MlpArgs &g, moe_dtype dt, void *base, int64_t r, int64_t e,
                                                int64_t width, int64_t col, const float *v)
{
    if (!g.split) {
        store_v<V>(dt, base, r * width + col, v);
        return;
    }
    int64_t first, step;
    term_rows_of(g, r, e, first, step);
    store_terms_v<V>(base, step * width, first * width + col, v);
}

// The operand of store_operand_v as float32: the value, or the sum of its terms (exact: the value itself).
__device__ __forceinline__ float load_operand(const MlpArgs &g, const void *base, int64_t r, int64_t e, int64_t width,
                                              int64_t col)
{
    if (!g.split)
        return load_as_float(g.dt, base, r * width + col);
    int64_t first, step;
    term_rows_of(g, r, e, first, step);
    const __nv_bfloat16 *terms = static_cast<const __nv_bfloat16 *>(base);
    return __bfloat162float(terms[first * width + col]) + __bfloat162float(terms[(first + step) * width + col]) +
           __bfloat162float(terms[(first + 2 * step) * width + col]);
}

} // namespace moe_gpu

#endif
