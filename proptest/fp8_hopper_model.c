/* The CPU model of the Hopper FP8 kernel and of its promotion-dropped mutant (fp8_hopper_model.h).  The wgmma
 * sums run in double on values that are exact there (grid values of at most 21 bits); everything the kernel
 * does in float32 (the promotion, the topk weight, accumulate, reduce_topk) is done in float32 in the
 * reference's order (ISO C: no contraction). */
#include "fp8_hopper_model.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define TILE 128
#define GROUP 32 /* the k of one wgmma */
#define KEPT_BITS 13 /* below the leading bit (ORACLE_FP8_TILE_HOPPER_BITS) */

/* One operand of a dot product: element i is code first + i * step, its tile t's scale scale_first + t * scale_step. */
typedef struct stream {
    moe_dtype dtype;
    const uint8_t *codes;
    int64_t first, step;
    const void *scales;
    int64_t scale_first, scale_step;
} stream;

static double decode(const stream *s, int64_t i)
{
    const uint8_t q = s->codes[s->first + i * s->step];
    return s->dtype == MOE_E5M2 ? (double)moe_e5m2_to_f32(q) : (double)moe_e4m3_to_f32(q);
}

/* The exponent of code i's value v != 0 as the tensor core sees it: floor(log2 |v|) for a normal value, the
 * format's least normal exponent for a subnormal (e4m3 -6, e5m2 -14). */
static int exponent_of(const stream *s, double v)
{
    const int least = s->dtype == MOE_E5M2 ? -14 : -6;
    int e;
    frexp(v, &e); /* |v| = m 2^e, m in [0.5, 1) */
    return e - 1 > least ? e - 1 : least;
}

static float scale_of(moe_fp8_scale_format format, const stream *s, int64_t t)
{
    const int64_t i = s->scale_first + t * s->scale_step;
    if (format == MOE_FP8_SCALE_UE8M0)
        return ldexpf(1.0f, (int)((const uint8_t *)s->scales)[i] - 127);
    return ((const float *)s->scales)[i];
}

/* v truncated toward zero to a multiple of unit (a power of two): exact in double. */
static double truncate_to(double v, double unit) { return trunc(v / unit) * unit; }

/* One wgmma k32 on one output element: c + the n (<= 32) products p (the rest of the 32 are zero codes), product i
 * of operands with exponents summing to pe[i] (exponent_of).  The grid is 2^(E - 13), E the largest of c's
 * exponent (its leading bit) and the products' exponent sums: a product's significand (of 1.xxx times 1.xxx) may
 * reach [2, 4), one bit above its exponent sum, and keeps that bit (measured: bench/RESULTS.md, "the model of the
 * kernel fails on dX"). */
static double wgmma_group(double c, const double *p, const int *pe, int n, int sum_trunc)
{
    double plain = c;
    int big = INT_MIN, e;
    if (c != 0.0) {
        frexp(c, &e);
        big = e - 1;
    }
    for (int i = 0; i < n; i++) {
        plain += p[i];
        if (p[i] != 0.0 && pe[i] > big)
            big = pe[i];
    }
    if (!isfinite(plain) || big == INT_MIN)
        return plain; /* NaN and Inf propagate; all terms zero */
    const double unit = ldexp(1.0, big - KEPT_BITS);
    double sum = truncate_to(c, unit);
    for (int i = 0; i < n; i++)
        sum += truncate_to(p[i], unit);
    if (sum_trunc && sum != 0.0) {
        frexp(sum, &e);
        sum = truncate_to(sum, ldexp(1.0, e - 1 - KEPT_BITS));
    }
    if ((double)(float)sum != sum) { /* 33 terms below 2^(E+2) on the grid 2^(E-13): at most 21 bits */
        fprintf(stderr, "fp8_hopper_model: a wgmma sum %.17g is not a float32\n", sum);
        abort();
    }
    return sum;
}

/* The kernel's value of one element before the topk weight: the promoted (or, for the mutant, unpromoted) dot
 * product of a and b over len elements. */
static float hopper_dot(const fp8_hopper_model *m, moe_fp8_scale_format format, const stream *a, const stream *b,
                        int64_t len)
{
    const int64_t tiles = (len + TILE - 1) / TILE;
    float acc = 0.0f, scale = 0.0f;
    double part = 0.0;
    for (int64_t t = 0; t < tiles; t++) {
        if (m->promote)
            part = 0.0; /* each k-step's first wgmma starts from scale_d = 0 */
        for (int64_t g = 0; g < TILE / GROUP; g++) {
            double p[GROUP];
            int pe[GROUP], n = 0;
            for (int64_t i = t * TILE + g * GROUP; i < len && n < GROUP; i++, n++) {
                const double va = decode(a, i), vb = decode(b, i);
                p[n] = va * vb; /* exact: at most 8 significant bits */
                pe[n] = p[n] != 0.0 ? exponent_of(a, va) + exponent_of(b, vb) : 0;
            }
            part = wgmma_group(part, p, pe, n, m->sum_trunc);
        }
        scale = scale_of(format, a, t) * scale_of(format, b, t);
        if (m->promote) {
            const float scaled = (float)part * scale;
            acc = acc + scaled;
        }
    }
    if (!m->promote && tiles > 0)
        acc = (float)part * scale; /* the last tile's scales */
    return acc;
}

static float load_out(moe_dtype dtype, const void *out, int64_t i)
{
    return dtype == MOE_BF16 ? moe_bf16_to_f32(((const uint16_t *)out)[i]) : ((const float *)out)[i];
}

/* v = old + v with accumulate, then one rounding to the output dtype. */
static void finish(const moe_fp8_options *o, void *out, int64_t i, float v)
{
    if (o->accumulate)
        v = load_out(o->out_dtype, out, i) + v;
    if (o->out_dtype == MOE_BF16)
        ((uint16_t *)out)[i] = moe_f32_to_bf16(v);
    else
        ((float *)out)[i] = v;
}

/* expert[r] and slot[r] of every expert-order row (abort on no memory: a test helper). */
static void rows_of(const moe_routing *routing, int64_t **expert, int64_t **slot)
{
    const int64_t M = routing->num_tokens * routing->topk;
    *expert = malloc(((size_t)M + 1) * sizeof **expert);
    *slot = malloc(((size_t)M + 1) * sizeof **slot);
    if (*expert == NULL || *slot == NULL)
        abort();
    int64_t r = 0;
    for (int64_t e = 0; e < routing->num_experts; e++)
        for (int64_t i = 0; i < routing->m_sizes[e]; i++, r++)
            (*expert)[r] = e, (*slot)[r] = routing->gather_indices ? routing->gather_indices[r] : r;
}

void fp8_hopper_model_fwd(const fp8_hopper_model *m, const moe_routing *routing, int64_t N, int64_t K,
                          const moe_fp8_tensor *x, const moe_fp8_tensor *w, const float *topk_weights, void *y,
                          const moe_fp8_options *o)
{
    const int64_t M = routing->num_tokens * routing->topk, tk = (K + TILE - 1) / TILE, tn = (N + TILE - 1) / TILE;
    int64_t *expert, *slot;
    rows_of(routing, &expert, &slot);
    for (int64_t r = 0; r < M; r++) {
        const int64_t e = expert[r], xr = o->permute_x ? slot[r] / routing->topk : r;
        const int64_t yr = o->permute_y ? slot[r] : r;
        for (int64_t n = 0; n < N; n++) {
            const stream a = {x->dtype, x->data, xr * K, 1, x->scales, xr * tk, 1};
            const stream b = {w->dtype, w->data, (e * N + n) * K, 1, w->scales, (e * tn + n / TILE) * tk, 1};
            float v = hopper_dot(m, o->scale_format, &a, &b, K);
            if (topk_weights != NULL)
                v = topk_weights[slot[r]] * v;
            finish(o, y, yr * N + n, v);
        }
    }
    free(expert), free(slot);
}

void fp8_hopper_model_dx(const fp8_hopper_model *m, const moe_routing *routing, int64_t N, int64_t K,
                         const moe_fp8_tensor *dy, const moe_fp8_tensor *w, const float *topk_weights, void *dx,
                         const moe_fp8_options *o)
{
    const int64_t k = routing->topk, M = routing->num_tokens * k, tk = (K + TILE - 1) / TILE;
    const int64_t tn = (N + TILE - 1) / TILE;
    int64_t *expert, *slot;
    rows_of(routing, &expert, &slot);
    /* each slot's value (times its weight), by slot; reduce_topk sums a token's k slots in ascending j */
    float *slot_value = malloc(((size_t)(M * K) + 1) * sizeof *slot_value);
    if (slot_value == NULL)
        abort();
    for (int64_t r = 0; r < M; r++) {
        const int64_t e = expert[r], dyr = o->permute_y ? slot[r] : r;
        for (int64_t c = 0; c < K; c++) {
            const stream a = {dy->dtype, dy->data, dyr * N, 1, dy->scales, dyr * tn, 1};
            /* W's column (e, ., c), or with w_transposed W^T's row (e, c) */
            const stream b = o->w_transposed
                                 ? (stream){w->dtype, w->data, (e * K + c) * N, 1, w->scales, (e * tk + c / TILE) * tn, 1}
                                 : (stream){w->dtype, w->data, e * N * K + c, K, w->scales, e * tn * tk + c / TILE, tk};
            float v = hopper_dot(m, o->scale_format, &a, &b, N);
            if (topk_weights != NULL)
                v = topk_weights[slot[r]] * v;
            if (o->reduce_topk)
                slot_value[slot[r] * K + c] = v;
            else
                finish(o, dx, (o->permute_x ? slot[r] : r) * K + c, v);
        }
    }
    if (o->reduce_topk)
        for (int64_t t = 0; t < routing->num_tokens; t++)
            for (int64_t c = 0; c < K; c++) {
                float sum = 0.0f;
                for (int64_t j = 0; j < k; j++)
                    sum += slot_value[(t * k + j) * K + c];
                finish(o, dx, t * K + c, sum);
            }
    free(slot_value), free(expert), free(slot);
}
