/* The float64 grouped GEMM oracle and its bounds; see oracle.h. */
#include "oracle.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

double oracle_gamma(int64_t length)
{
    double l = (double)length * 0x1p-24;
    return l / (1.0 - l);
}

double oracle_output_rounding(moe_dtype dtype, double value)
{
    double half_subnormal = dtype == MOE_F16 ? 0x1p-25 : dtype == MOE_BF16 ? 0x1p-134 : 0x1p-150;
    return moe_dtype_unit_roundoff(dtype) * fabs(value) + half_subnormal;
}

double oracle_overflow_threshold(moe_dtype dtype)
{
    /* the largest finite value plus half an ulp: at or past it, round-to-nearest gives Inf */
    switch (dtype) {
    case MOE_F16: return 65520.0;
    case MOE_BF16: return 0x1.ffp127;
    case MOE_E4M3: /* saturating conversions: no value overflows */
    case MOE_E5M2: return HUGE_VAL;
    case MOE_F32: break;
    }
    return 0x1.ffffffp127;
}

double oracle_load(moe_dtype dtype, const void *base, int64_t i)
{
    switch (dtype) {
    case MOE_F16: return (double)moe_f16_to_f32(((const uint16_t *)base)[i]);
    case MOE_BF16: return (double)moe_bf16_to_f32(((const uint16_t *)base)[i]);
    case MOE_E4M3: return (double)moe_e4m3_to_f32(((const uint8_t *)base)[i]);
    case MOE_E5M2: return (double)moe_e5m2_to_f32(((const uint8_t *)base)[i]);
    case MOE_F32: break;
    }
    return (double)((const float *)base)[i];
}

/* The relative error of one product when the call allows TF32 (f32 inputs only): each operand rounded to
 * nearest TF32 (10 explicit mantissa bits, unit roundoff 2^-11), so |fl(a) fl(b) - a b| <= (2^-10 + 2^-22) |a b|;
 * 0 otherwise. */
static double product_error(const moe_gemm_options *o)
{
    return o->allow_tf32 && o->dtype == MOE_F32 ? 0x1p-10 + 0x1p-22 : 0.0;
}

/* The bound of oracle.h for L roundings, magnitude sum S, exact value v and per-product relative error d
 * (TF32): the terms carry d S before the accumulation, whose gamma(L) then applies to (1 + d) S. */
static double element_bound(moe_dtype out_dtype, int64_t roundings, double magnitude, double value, double d)
{
    double accumulation = oracle_gamma(roundings) * magnitude * (1.0 + d) + d * magnitude;
    return accumulation + oracle_output_rounding(out_dtype, fabs(value) + accumulation) +
           (double)roundings * 0x1p-52 * magnitude;
}

/* Per-row routing facts computed once: expert, slot, X row and Y row of each expert-order row. */
typedef struct row_map {
    int64_t *expert;
    int64_t *slot;
} row_map;

static row_map map_rows(const moe_routing *routing)
{
    const int64_t M = routing->num_tokens * routing->topk;
    row_map map = {malloc(((size_t)M + 1) * sizeof(int64_t)), malloc(((size_t)M + 1) * sizeof(int64_t))};
    if (map.expert == NULL || map.slot == NULL)
        abort();
    int64_t r = 0;
    for (int64_t e = 0; e < routing->num_experts; e++)
        for (int64_t i = 0; i < routing->m_sizes[e]; i++, r++) {
            map.expert[r] = e;
            map.slot[r] = routing->gather_indices ? routing->gather_indices[r] : r;
        }
    return map;
}

static void free_rows(row_map *map)
{
    free(map->expert);
    free(map->slot);
}

static double weight_of(const moe_gemm_options *o, const void *topk_weights, int64_t slot)
{
    return topk_weights ? oracle_load(o->dtype, topk_weights, slot) : 1.0;
}

void oracle_gemm_fwd(const moe_routing *routing, int64_t N, int64_t K, const void *x, const void *w,
                     const void *topk_weights, const void *old_y, const moe_gemm_options *o,
                     double *value, double *bound)
{
    const int64_t M = routing->num_tokens * routing->topk;
    row_map map = map_rows(routing);
    for (int64_t r = 0; r < M; r++) {
        const int64_t e = map.expert[r], slot = map.slot[r];
        const int64_t xr = o->permute_x ? slot / routing->topk : r;
        const int64_t yr = o->permute_y ? slot : r;
        const double wt = weight_of(o, topk_weights, slot);
        for (int64_t n = 0; n < N; n++) {
            double sum = 0.0, magnitude = 0.0;
            for (int64_t c = 0; c < K; c++) {
                double term = oracle_load(o->dtype, x, xr * K + c) * oracle_load(o->dtype, w, (e * N + n) * K + c);
                sum += term;
                magnitude += fabs(term);
            }
            sum *= wt;
            magnitude *= fabs(wt);
            int64_t roundings = K + (topk_weights != NULL);
            if (o->accumulate) {
                double old = oracle_load(o->dtype, old_y, yr * N + n);
                sum += old;
                magnitude += fabs(old);
                roundings++;
            }
            value[yr * N + n] = sum;
            bound[yr * N + n] = element_bound(o->dtype, roundings, magnitude, sum, product_error(o));
        }
    }
    free_rows(&map);
}

void oracle_gemm_dx(const moe_routing *routing, int64_t N, int64_t K, const void *dy, const void *w,
                    const void *topk_weights, const void *old_dx, const moe_gemm_options *o,
                    double *value, double *bound)
{
    const int64_t T = routing->num_tokens, k = routing->topk, M = T * k;
    const int64_t out_rows = o->reduce_topk ? T : M;
    row_map map = map_rows(routing);
    for (int64_t i = 0; i < out_rows * K; i++)
        value[i] = bound[i] = 0.0; /* magnitudes collect in bound[] first */
    double *magnitude = bound;
    for (int64_t r = 0; r < M; r++) {
        const int64_t e = map.expert[r], slot = map.slot[r];
        const int64_t dyr = o->permute_y ? slot : r;
        const int64_t out = o->reduce_topk ? slot / k : o->permute_x ? slot : r;
        const double wt = weight_of(o, topk_weights, slot);
        for (int64_t c = 0; c < K; c++) {
            double sum = 0.0, mag = 0.0;
            for (int64_t n = 0; n < N; n++) {
                double term = oracle_load(o->dtype, dy, dyr * N + n) * oracle_load(o->dtype, w, (e * N + n) * K + c);
                sum += term;
                mag += fabs(term);
            }
            value[out * K + c] += wt * sum;
            magnitude[out * K + c] += fabs(wt) * mag;
        }
    }
    /* a dot of N, one weight multiply, k - 1 adds over the slots, one accumulate add */
    const int64_t roundings = N + (topk_weights != NULL) + (o->reduce_topk ? k - 1 : 0) + (o->accumulate != 0);
    for (int64_t i = 0; i < out_rows * K; i++) {
        double mag = magnitude[i];
        if (o->accumulate) {
            double old = oracle_load(o->dtype, old_dx, i);
            value[i] += old;
            mag += fabs(old);
        }
        bound[i] = element_bound(o->dtype, roundings, mag, value[i], product_error(o));
    }
    free_rows(&map);
}

/* oracle_gemm_dw and oracle_gemm_dw_split: split, whether the backend may add a bf16 or f16 row's fused
 * product w * dy as two terms (oracle.h). */
static void gemm_dw(const moe_routing *routing, int64_t N, int64_t K, const void *x, const void *dy,
                    const void *topk_weights, const void *old_dw, const moe_gemm_options *o, int split,
                    double *value, double *bound)
{
    const moe_dtype out_dtype = o->dw_fp32 ? MOE_F32 : o->dtype;
    row_map map = map_rows(routing);
    int64_t first = 0;
    for (int64_t e = 0; e < routing->num_experts; e++) {
        const int64_t count = routing->m_sizes[e];
        for (int64_t n = 0; n < N; n++)
            for (int64_t c = 0; c < K; c++) {
                double sum = 0.0, mag = 0.0;
                for (int64_t r = first; r < first + count; r++) {
                    const int64_t slot = map.slot[r];
                    const int64_t xr = o->permute_x ? slot / routing->topk : r;
                    const int64_t dyr = o->permute_y ? slot : r;
                    double term = weight_of(o, topk_weights, slot) * oracle_load(o->dtype, dy, dyr * N + n) *
                                  oracle_load(o->dtype, x, xr * K + c);
                    sum += term;
                    mag += fabs(term);
                }
                const int64_t i = (e * N + n) * K + c;
                /* fused weights: one for the weight multiply; where the backend splits the exact bf16 or f16
                 * product w * dy into hi + lo (the CUDA tensor-core kernels, DECISIONS.md), each row may enter
                 * the sum as two terms */
                const int two_terms = split && topk_weights != NULL && o->dtype != MOE_F32;
                int64_t roundings = (two_terms ? 2 * count : count) + (topk_weights != NULL);
                if (o->accumulate) {
                    double old = oracle_load(out_dtype, old_dw, i);
                    sum += old;
                    mag += fabs(old);
                    roundings++;
                }
                value[i] = sum;
                bound[i] = element_bound(out_dtype, roundings, mag, sum, product_error(o));
            }
        first += count;
    }
    free_rows(&map);
}

void oracle_gemm_dw(const moe_routing *routing, int64_t N, int64_t K, const void *x, const void *dy,
                    const void *topk_weights, const void *old_dw, const moe_gemm_options *o,
                    double *value, double *bound)
{
    gemm_dw(routing, N, K, x, dy, topk_weights, old_dw, o, 0, value, bound);
}

void oracle_gemm_dw_split(const moe_routing *routing, int64_t N, int64_t K, const void *x, const void *dy,
                          const void *topk_weights, const void *old_dw, const moe_gemm_options *o,
                          double *value, double *bound)
{
    gemm_dw(routing, N, K, x, dy, topk_weights, old_dw, o, 1, value, bound);
}

void oracle_gemm_topk_weights_grad(const moe_routing *routing, int64_t N, int64_t K, const void *x,
                                   const void *w, const void *dy, const void *old_d,
                                   const moe_gemm_options *o, double *value, double *bound)
{
    const moe_dtype out_dtype = o->dw_fp32 ? MOE_F32 : o->dtype;
    const int64_t M = routing->num_tokens * routing->topk;
    row_map map = map_rows(routing);
    for (int64_t r = 0; r < M; r++) {
        const int64_t e = map.expert[r], slot = map.slot[r];
        const int64_t xr = o->permute_x ? slot / routing->topk : r;
        const int64_t dyr = o->permute_y ? slot : r;
        /* y_n carries up to g(K) (1 + d) sum|x w| + d sum|x w| of error into a dot of length N (d: TF32's
         * product error with allow_tf32, as element_bound charges it; dY enters that dot unrounded) */
        const double d = product_error(o);
        double sum = 0.0, mag = 0.0, inherited = 0.0;
        for (int64_t n = 0; n < N; n++) {
            double y = 0.0, ymag = 0.0;
            for (int64_t c = 0; c < K; c++) {
                double term = oracle_load(o->dtype, x, xr * K + c) * oracle_load(o->dtype, w, (e * N + n) * K + c);
                y += term;
                ymag += fabs(term);
            }
            double g = oracle_load(o->dtype, dy, dyr * N + n);
            double y_error = oracle_gamma(K) * (1.0 + d) * ymag + d * ymag + K * 0x1p-52 * ymag;
            sum += g * y;
            mag += fabs(g) * (fabs(y) + y_error);
            inherited += fabs(g) * y_error;
        }
        int64_t roundings = N;
        if (o->accumulate) {
            double old = oracle_load(out_dtype, old_d, slot);
            sum += old;
            mag += fabs(old);
            roundings++;
        }
        value[slot] = sum;
        bound[slot] = element_bound(out_dtype, roundings, mag, sum, 0.0) + inherited; /* the outer dot: fp32 */
    }
    free_rows(&map);
}

int64_t oracle_compare(const char *label, moe_dtype dtype, const void *out, const double *value,
                       const double *bound, int64_t count, FILE *report, int max_reports,
                       double *worst_ratio)
{
    int64_t mismatches = 0;
    double worst = 0.0;
    for (int64_t i = 0; i < count; i++) {
        double got = oracle_load(dtype, out, i);
        double err = fabs(got - value[i]);
        int bad = !(err <= bound[i]); /* NaN fails */
        /* rounding overflows to Inf of the value's sign once |value| may reach the threshold */
        if (bad && isinf(got) && (got > 0) == (value[i] > 0) && fabs(value[i]) + bound[i] >= oracle_overflow_threshold(dtype))
            bad = 0, err = 0;
        double ratio = bound[i] > 0 ? err / bound[i] : (err == 0 ? 0 : INFINITY);
        if (isnan(got))
            ratio = INFINITY;
        if (ratio > worst)
            worst = ratio;
        if (bad) {
            if (report != NULL && mismatches < max_reports)
                fprintf(report, "  %s[%lld]: got %.9g, want %.17g, |err| %.3g > bound %.3g\n", label,
                        (long long)i, got, value[i], err, bound[i]);
            mismatches++;
        }
    }
    if (worst_ratio != NULL)
        *worst_ratio = worst;
    return mismatches;
}

uint64_t oracle_rng_next(oracle_rng *rng)
{
    uint64_t z = (rng->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t oracle_rng_below(oracle_rng *rng, uint64_t bound)
{
    return bound <= 1 ? 0 : oracle_rng_next(rng) % bound;
}

double oracle_rng_symmetric(oracle_rng *rng)
{
    return (double)(oracle_rng_next(rng) >> 11) * 0x1p-52 - 1.0;
}

static void store(moe_dtype dtype, void *base, int64_t i, float v)
{
    switch (dtype) {
    case MOE_F16: ((uint16_t *)base)[i] = moe_f32_to_f16(v); return;
    case MOE_BF16: ((uint16_t *)base)[i] = moe_f32_to_bf16(v); return;
    case MOE_E4M3: ((uint8_t *)base)[i] = moe_f32_to_e4m3(v); return;
    case MOE_E5M2: ((uint8_t *)base)[i] = moe_f32_to_e5m2(v); return;
    case MOE_F32: break;
    }
    ((float *)base)[i] = v;
}

void oracle_fill(oracle_rng *rng, moe_dtype dtype, void *base, int64_t count, int distribution)
{
    for (int64_t i = 0; i < count; i++) {
        double v;
        switch (distribution) {
        case 1: { /* 0, +-2^-3 .. +-2^0: products and short sums stay exact in every dtype */
            uint64_t pick = oracle_rng_below(rng, 9);
            v = pick == 0 ? 0.0 : ldexp(pick & 1 ? 1.0 : -1.0, -(int)(pick / 2));
            break;
        }
        case 2:
            v = oracle_rng_symmetric(rng) * ldexp(1.0, (int)oracle_rng_below(rng, 17) - 8);
            break;
        default:
            v = oracle_rng_symmetric(rng);
            break;
        }
        store(dtype, base, i, (float)v);
    }
}

void oracle_topk_ids(oracle_rng *rng, int64_t T, int64_t k, int64_t E, int64_t *ids)
{
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++) {
            int64_t e, repeated;
            do {
                e = (int64_t)oracle_rng_below(rng, (uint64_t)E);
                repeated = 0;
                for (int64_t i = 0; i < j; i++)
                    repeated |= ids[t * k + i] == e;
            } while (repeated);
            ids[t * k + j] = e;
        }
}

void oracle_poison(moe_dtype dtype, void *base, int64_t count)
{
    for (int64_t i = 0; i < count; i++)
        store(dtype, base, i, NAN);
}
