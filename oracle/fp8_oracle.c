/* The float64 oracle of the FP8 grouped GEMM (fwd, dX) and its derived bound (specs/FP8.md section 4).
 * It shares no code with ref/: codes are decoded by the public conversions (tests/test_fp8_dtype checks them
 * against an independent model), UE8M0 scales by ldexp, and the sums run in double. */
#include "oracle_fp8.h"

#include <math.h>
#include <stdlib.h>

static int64_t tiles_of(int64_t n) { return (n + 127) / 128; }

static double code_value(moe_dtype dtype, const void *codes, int64_t i)
{
    const uint8_t code = ((const uint8_t *)codes)[i];
    return dtype == MOE_E5M2 ? (double)moe_e5m2_to_f32(code) : (double)moe_e4m3_to_f32(code);
}

static double scale_value(moe_fp8_scale_format format, const void *scales, int64_t i)
{
    if (format == MOE_FP8_SCALE_UE8M0)
        return ldexp(1.0, (int)((const uint8_t *)scales)[i] - 127);
    return (double)((const float *)scales)[i];
}

/* The float32 roundings on the way to an element whose reduction has length len (FP8.md section 4): at most
 * 127 adds within a tile, the scale product, the scale multiply, one add per tile into the accumulator. */
static int64_t promoted_roundings(int64_t len)
{
    return (len < 128 ? len : 128) + 2 + tiles_of(len);
}

/* One promoted dot product in double: its value, sum of |terms| (scales included) and underflow term. */
typedef struct dot {
    double value, magnitude, underflow;
} dot;

/* a: codes a_first + i * a_step, scales a_scale_first + t * a_scale_step; b likewise; len elements. */
static dot promoted_dot(moe_fp8_scale_format format, moe_dtype a_dtype, const void *a, const void *a_scales,
                        int64_t a_first, int64_t a_step, int64_t a_scale_first, int64_t a_scale_step,
                        moe_dtype b_dtype, const void *b, const void *b_scales, int64_t b_first, int64_t b_step,
                        int64_t b_scale_first, int64_t b_scale_step, int64_t len)
{
    dot d = {0.0, 0.0, 0.0};
    for (int64_t t = 0; t < tiles_of(len); t++) {
        double part = 0.0, part_magnitude = 0.0;
        for (int64_t i = t * 128; i < len && i < (t + 1) * 128; i++) {
            const double p = code_value(a_dtype, a, a_first + i * a_step) * code_value(b_dtype, b, b_first + i * b_step);
            part += p;
            part_magnitude += fabs(p);
        }
        const double s = scale_value(format, a_scales, a_scale_first + t * a_scale_step) *
                         scale_value(format, b_scales, b_scale_first + t * b_scale_step);
        d.value += s * part;
        d.magnitude += fabs(s) * part_magnitude;
        /* the scale product and the scale multiply may each underflow (absolute error <= 2^-150), the first
         * charged on the tile's sum (at most twice its magnitude: gamma(127) < 1) */
        d.underflow += 0x1p-150 * (2.0 * part_magnitude + 1.0);
    }
    return d;
}

/* The bound of oracle.h's form with the FP8 roundings, plus the underflow term (oracle_fp8.h): `roundings` are
 * the float32 roundings with the in-tile ones (float32 tiles), `len` the reduction's length. */
static double fp8_bound(moe_dtype out_dtype, int64_t roundings, int64_t len, int tile_acc_bits, double magnitude,
                        double underflow, double value)
{
    double accumulation;
    if (tile_acc_bits == ORACLE_FP8_TILE_F32) {
        accumulation = oracle_gamma(roundings) * magnitude + underflow * (1.0 + oracle_gamma(roundings));
    } else {
        const int64_t in_tile = len < 128 ? len : 128, groups = (in_tile + 31) / 32;
        const double g = oracle_gamma(roundings - in_tile), ge = (double)groups * 34.0 * ldexp(1.0, -tile_acc_bits);
        const double c = ge * (1.0 + ge);
        accumulation = g * magnitude + (1.0 + g) * (c * magnitude + (1.0 + c) * underflow);
    }
    return accumulation + oracle_output_rounding(out_dtype, fabs(value) + accumulation) +
           (double)roundings * 0x1p-52 * magnitude;
}

/* expert[r], slot[r] of every expert-order row (abort on no memory: a test helper). */
static void routing_rows(const moe_routing *routing, int64_t *expert, int64_t *slot)
{
    int64_t r = 0;
    for (int64_t e = 0; e < routing->num_experts; e++)
        for (int64_t i = 0; i < routing->m_sizes[e]; i++, r++) {
            expert[r] = e;
            slot[r] = routing->gather_indices ? routing->gather_indices[r] : r;
        }
}

static int64_t *rows_alloc(int64_t M)
{
    int64_t *p = malloc(((size_t)M + 1) * sizeof *p);
    if (p == NULL)
        abort();
    return p;
}

void oracle_gemm_fp8_fwd(const moe_routing *routing, int64_t N, int64_t K, const moe_fp8_tensor *x,
                         const moe_fp8_tensor *w, const float *topk_weights, const void *old_y,
                         const moe_fp8_options *o, int tile_acc_bits, double *value, double *bound)
{
    const int64_t M = routing->num_tokens * routing->topk, tk = tiles_of(K), tn = tiles_of(N);
    int64_t *expert = rows_alloc(M), *slot = rows_alloc(M);
    routing_rows(routing, expert, slot);
    for (int64_t r = 0; r < M; r++) {
        const int64_t e = expert[r];
        const int64_t xr = o->permute_x ? slot[r] / routing->topk : r;
        const int64_t yr = o->permute_y ? slot[r] : r;
        const double wt = topk_weights ? (double)topk_weights[slot[r]] : 1.0;
        for (int64_t n = 0; n < N; n++) {
            dot d = promoted_dot(o->scale_format, x->dtype, x->data, x->scales, xr * K, 1, xr * tk, 1, w->dtype,
                                 w->data, w->scales, (e * N + n) * K, 1, (e * tn + n / 128) * tk, 1, K);
            double v = wt * d.value, magnitude = fabs(wt) * d.magnitude;
            const double underflow = fmax(1.0, fabs(wt)) * d.underflow + (topk_weights ? 0x1p-150 : 0.0);
            const int64_t i = yr * N + n;
            if (o->accumulate) {
                const double old = oracle_load(o->out_dtype, old_y, i);
                v += old;
                magnitude += fabs(old);
            }
            value[i] = v;
            bound[i] = fp8_bound(o->out_dtype, promoted_roundings(K) + (topk_weights != NULL) + (o->accumulate != 0),
                                 K, tile_acc_bits, magnitude, underflow, v);
        }
    }
    free(expert);
    free(slot);
}

void oracle_gemm_fp8_dx(const moe_routing *routing, int64_t N, int64_t K, const moe_fp8_tensor *dy,
                        const moe_fp8_tensor *w, const float *topk_weights, const void *old_dx,
                        const moe_fp8_options *o, int tile_acc_bits, double *value, double *bound)
{
    const int64_t T = routing->num_tokens, k = routing->topk, M = T * k, tk = tiles_of(K), tn = tiles_of(N);
    const int64_t out_rows = o->reduce_topk ? T : M;
    int64_t *expert = rows_alloc(M), *slot = rows_alloc(M);
    routing_rows(routing, expert, slot);
    double *magnitude = malloc(((size_t)(out_rows * K) + 1) * sizeof *magnitude);
    double *underflow = malloc(((size_t)(out_rows * K) + 1) * sizeof *underflow);
    if (magnitude == NULL || underflow == NULL)
        abort();
    for (int64_t i = 0; i < out_rows * K; i++)
        value[i] = magnitude[i] = underflow[i] = 0.0;
    for (int64_t r = 0; r < M; r++) {
        const int64_t e = expert[r];
        const int64_t dyr = o->permute_y ? slot[r] : r;
        const int64_t out = o->reduce_topk ? slot[r] / k : o->permute_x ? slot[r] : r;
        const double wt = topk_weights ? (double)topk_weights[slot[r]] : 1.0;
        for (int64_t c = 0; c < K; c++) {
            /* W's column (e, ., c), or with w_transposed W^T's row (e, c) */
            dot d = o->w_transposed
                        ? promoted_dot(o->scale_format, dy->dtype, dy->data, dy->scales, dyr * N, 1, dyr * tn, 1,
                                       w->dtype, w->data, w->scales, (e * K + c) * N, 1, (e * tk + c / 128) * tn, 1, N)
                        : promoted_dot(o->scale_format, dy->dtype, dy->data, dy->scales, dyr * N, 1, dyr * tn, 1,
                                       w->dtype, w->data, w->scales, e * N * K + c, K, e * tn * tk + c / 128, tk, N);
            value[out * K + c] += wt * d.value;
            magnitude[out * K + c] += fabs(wt) * d.magnitude;
            underflow[out * K + c] += fmax(1.0, fabs(wt)) * d.underflow + (topk_weights ? 0x1p-150 : 0.0);
        }
    }
    /* the promoted dot, one weight multiply, k - 1 adds over the slots (k with the first into +0), one
     * accumulate add */
    const int64_t roundings = promoted_roundings(N) + (topk_weights != NULL) + (o->reduce_topk ? k : 0) +
                              (o->accumulate != 0);
    for (int64_t i = 0; i < out_rows * K; i++) {
        if (o->accumulate) {
            const double old = oracle_load(o->out_dtype, old_dx, i);
            value[i] += old;
            magnitude[i] += fabs(old);
        }
        bound[i] = fp8_bound(o->out_dtype, roundings, N, tile_acc_bits, magnitude[i], underflow[i], value[i]);
    }
    free(magnitude);
    free(underflow);
    free(expert);
    free(slot);
}

void oracle_gemm_fp8_dw(const moe_routing *routing, int64_t N, int64_t K, const moe_fp8_tensor *x,
                        const moe_fp8_tensor *dy, const void *old_dw, const moe_fp8_options *o, int tile_acc_bits,
                        double *value, double *bound)
{
    const int64_t M = routing->num_tokens * routing->topk;
    const int t = o->codes_transposed != 0; /* x's codes [K][M], dy's [N][M] */
    int64_t first = 0; /* expert e's first row */
    for (int64_t e = 0; e < routing->num_experts; e++) {
        const int64_t m = routing->m_sizes[e], scale_row = first / 128 + e;
        for (int64_t n = 0; n < N; n++)
            for (int64_t c = 0; c < K; c++) {
                dot d = promoted_dot(o->scale_format, dy->dtype, dy->data, dy->scales,
                                     t ? n * M + first : first * N + n, t ? 1 : N, scale_row * N + n, N, x->dtype,
                                     x->data, x->scales, t ? c * M + first : first * K + c, t ? 1 : K,
                                     scale_row * K + c, K, m);
                const int64_t i = (e * N + n) * K + c;
                double v = d.value, magnitude = d.magnitude;
                if (o->accumulate) {
                    const double old = oracle_load(o->out_dtype, old_dw, i);
                    v += old;
                    magnitude += fabs(old);
                }
                value[i] = v;
                bound[i] = fp8_bound(o->out_dtype, promoted_roundings(m) + (o->accumulate != 0), m, tile_acc_bits,
                                     magnitude, d.underflow, v);
            }
        first += m;
    }
}
