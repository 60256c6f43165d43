/* Run-time checks mirroring the ACSL float postconditions (see contract_check.h).  Each function below
 * carries the name of the ACSL logic function or predicate of specs/gemm.acsl it evaluates; the sums are
 * taken in float64 over the (already rounded) inputs read with moe_ref_load. */
#include "contract_check.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* gamma_k of specs/gemm.acsl: n u / (1 - n u), u = 2^-24 */
static double gamma_k(int64_t n)
{
    const double nu = (double)n * 0x1p-24;
    return nu / (1.0 - nu);
}

/* eta_out of a result in `dtype`: half its smallest subnormal (eta_f32 = 2^-150 in specs/gemm.acsl) */
static double eta_out(moe_dtype dtype)
{
    switch (dtype) {
    case MOE_F16: return 0x1p-25;
    case MOE_BF16: return 0x1p-134;
    case MOE_E4M3: return 0x1p-10;
    case MOE_E5M2: return 0x1p-17;
    case MOE_F32: break;
    }
    return 0x1p-150;
}

/* A real sum and the sum of its terms' magnitudes: the pairs (dot_strided, dot_strided_abs),
 * (dx_sum, dx_sum_abs), ... of specs/gemm.acsl, evaluated together. */
typedef struct {
    double sum, abs;
} real_sum;

static void add_term(real_sum *s, double term)
{
    s->sum += term;
    s->abs += fabs(term);
}

/* Adds factor * part: the sum scales by factor, the magnitudes by |factor|. */
static void add_scaled(real_sum *s, double factor, real_sum part)
{
    s->sum += factor * part.sum;
    s->abs += fabs(factor) * part.abs;
}

/* dot_strided / dot_strided_abs: sum_{i < n} a[ao + i as] * b[bo + i bs], both tensors in `dtype` */
static real_sum dot_strided(moe_dtype dtype, const void *a, int64_t ao, int64_t astride, const void *b,
                            int64_t bo, int64_t bstride, int64_t n)
{
    real_sum s = {0.0, 0.0};
    for (int64_t i = 0; i < n; i++)
        add_term(&s, (double)moe_ref_load(dtype, a, ao + i * astride) *
                     (double)moe_ref_load(dtype, b, bo + i * bstride));
    return s;
}

/* gemm_slot, gemm_x_row, gemm_y_row, gemm_dx_row of specs/gemm.acsl */
static int64_t gemm_slot(const moe_gemm_problem *p, int64_t r)
{
    return p->gather_indices == NULL ? r : p->gather_indices[r];
}

static int64_t gemm_x_row(const moe_gemm_problem *p, int64_t r)
{
    return p->permute_x ? gemm_slot(p, r) / p->topk : r;
}

static int64_t gemm_y_row(const moe_gemm_problem *p, int64_t r) { return p->permute_y ? gemm_slot(p, r) : r; }

static int64_t gemm_dx_row(const moe_gemm_problem *p, int64_t r) { return p->permute_x ? gemm_slot(p, r) : r; }

/* gemm_weight and gemm_weight_roundings: the topk weight of row r's slot (1 without weights) */
static double gemm_weight(const moe_gemm_problem *p, const void *topk_weights, int64_t r)
{
    return topk_weights == NULL ? 1.0 : (double)moe_ref_load(p->dtype, topk_weights, gemm_slot(p, r));
}

static int64_t gemm_weight_roundings(const void *topk_weights) { return topk_weights != NULL; }

/* gemm_expert_of_row: the first e with r < msum(m, e + 1) (offsets[e + 1] = msum(m, e + 1)) */
static int64_t gemm_expert_of_row(const moe_gemm_problem *p, const int64_t *offsets, int64_t r)
{
    int64_t e = 0;
    while (e < p->num_experts - 1 && r >= offsets[e + 1])
        e++;
    return e;
}

/* gemm_row_of_slot: the first expert-order row r with gemm_slot(p, r) == s (rows if none) */
static int64_t gemm_row_of_slot(const moe_gemm_problem *p, int64_t s)
{
    int64_t r = 0;
    while (r < p->rows && gemm_slot(p, r) != s)
        r++;
    return r;
}

/* The state of one clause's check: its name, the output tensor (after and, with accumulate, before the
 * call), the count and the first message. */
typedef struct {
    const char *clause;          /* the ACSL ensures name, the message's prefix */
    moe_dtype out_dtype;         /* the result's dtype: u_out and eta_out */
    const void *out;             /* the output after the call */
    const void *before;          /* with accumulate: the output before the call, else NULL */
    long violations;
    char *message;
    size_t capacity;
} clause_check;

/* within_dot_bound(yhat, y, sabs, n, u_out, eta_out) of specs/gemm.acsl, u_out and eta_out those of
 * out_dtype; *bound receives the right-hand side.  A non-finite y must be matched exactly (NaN with NaN,
 * Inf with the same Inf). */
static int within_dot_bound(double yhat, double y, double sabs, int64_t n, moe_dtype out_dtype, double *bound)
{
    const double u_out = moe_dtype_unit_roundoff(out_dtype);
    *bound = (1.0 + u_out) * gamma_k(n) * sabs + u_out * fabs(y) + eta_out(out_dtype);
    return isfinite(y) ? fabs(yhat - y) <= *bound : (isnan(y) ? isnan(yhat) : yhat == y);
}

/* within_update_bound of specs/gemm.acsl for output element `index` (flat): within_dot_bound of the exact
 * sum, or with accumulate of old + sum (old the element before the call: one more term, one more rounding).
 * The element's name (printf format and arguments, e.g. "dx[%lld][%lld]") goes into the message of the
 * first violation: "CLAUSE: element INDEX, NAME = ...". */
#if defined(__GNUC__)
__attribute__((format(printf, 5, 6)))
#endif
static void within_update_bound(clause_check *check, int64_t index, real_sum exact, int64_t roundings,
                                const char *element_format, ...)
{
    if (check->before != NULL) {
        add_term(&exact, moe_ref_load(check->out_dtype, check->before, index));
        roundings++;
    }
    const double yhat = moe_ref_load(check->out_dtype, check->out, index);
    double bound;
    if (within_dot_bound(yhat, exact.sum, exact.abs, roundings, check->out_dtype, &bound) ||
        check->violations++ > 0 || check->capacity == 0)
        return;
    char element[96];
    va_list args;
    va_start(args, element_format);
    vsnprintf(element, sizeof element, element_format, args);
    va_end(args);
    snprintf(check->message, check->capacity, "%s: element %lld, %s = %.9g, expected %.17g +- %.3g "
             "(%lld roundings, %s%s)", check->clause, (long long)index, element, yhat, exact.sum, bound,
             (long long)roundings, moe_dtype_name(check->out_dtype), check->before ? ", accumulate" : "");
}

/* Starts a check: clears the message and computes offsets[E + 1] = msum(m_sizes, e).  Returns NULL (the
 * checker then returns -1) with accumulate but no `before`, or out of memory. */
static int64_t *begin_check(clause_check *check, const moe_gemm_problem *p, const char *clause,
                            moe_dtype out_dtype, const void *out, const void *before, char *message,
                            size_t capacity)
{
    *check = (clause_check){.clause = clause, .out_dtype = out_dtype, .out = out,
                            .before = p->accumulate ? before : NULL, .message = message, .capacity = capacity};
    if (capacity > 0)
        message[0] = '\0';
    if (p->accumulate && before == NULL)
        return NULL;
    int64_t *offsets = malloc(((size_t)p->num_experts + 1) * sizeof *offsets);
    if (offsets != NULL)
        moe_ref_expert_offsets(p->num_experts, p->m_sizes, offsets);
    return offsets;
}

static long end_check(const clause_check *check, int64_t *offsets)
{
    free(offsets);
    return check->violations;
}

/* fwd_sum / fwd_sum_abs: weight(r) * dot_xw(x row of r, W[e][n]) */
static real_sum fwd_sum(const moe_gemm_problem *p, const void *x, const void *w, const void *topk_weights,
                        int64_t r, int64_t e, int64_t n)
{
    real_sum s = {0.0, 0.0};
    add_scaled(&s, gemm_weight(p, topk_weights, r),
               dot_strided(p->dtype, x, gemm_x_row(p, r) * p->K, 1, w, (e * p->N + n) * p->K, 1, p->K));
    return s;
}

long moe_ref_check_gemm_fwd_post(const moe_gemm_problem *p, const void *x, const void *w,
                                 const void *topk_weights, const void *y, const void *y_before, char *message,
                                 size_t capacity)
{
    clause_check check;
    int64_t *offsets = begin_check(&check, p, "fwd_within_bound", p->dtype, y, y_before, message, capacity);
    if (offsets == NULL)
        return -1;
    const int64_t N = p->N, roundings = p->K + gemm_weight_roundings(topk_weights);
    for (int64_t e = 0; e < p->num_experts; e++)
        for (int64_t r = offsets[e]; r < offsets[e + 1]; r++)
            for (int64_t n = 0; n < N; n++) {
                const int64_t yr = gemm_y_row(p, r);
                within_update_bound(&check, yr * N + n, fwd_sum(p, x, w, topk_weights, r, e, n), roundings,
                                    "y[%lld][%lld] (row %lld of expert %lld)", (long long)yr, (long long)n,
                                    (long long)r, (long long)e);
            }
    return end_check(&check, offsets);
}

/* dx_sum / dx_sum_abs: weight(r) * sum_n dy[yrow(r)][n] W[e][n][c] */
static real_sum dx_sum(const moe_gemm_problem *p, const void *dy, const void *w, const void *topk_weights,
                       int64_t r, int64_t e, int64_t c)
{
    real_sum s = {0.0, 0.0};
    add_scaled(&s, gemm_weight(p, topk_weights, r),
               dot_strided(p->dtype, dy, gemm_y_row(p, r) * p->N, 1, w, e * p->N * p->K + c, p->K, p->N));
    return s;
}

long moe_ref_check_gemm_dx_post(const moe_gemm_problem *p, const void *dy, const void *w,
                                const void *topk_weights, const void *dx, const void *dx_before, char *message,
                                size_t capacity)
{
    clause_check check;
    int64_t *offsets = begin_check(&check, p, p->reduce_topk ? "dx_reduce_within_bound" : "dx_within_bound",
                                   p->dtype, dx, dx_before, message, capacity);
    if (offsets == NULL)
        return -1;
    const int64_t K = p->K, roundings = p->N + gemm_weight_roundings(topk_weights);
    if (!p->reduce_topk) {
        for (int64_t e = 0; e < p->num_experts; e++)
            for (int64_t r = offsets[e]; r < offsets[e + 1]; r++)
                for (int64_t c = 0; c < K; c++) {
                    const int64_t dxr = gemm_dx_row(p, r);
                    within_update_bound(&check, dxr * K + c, dx_sum(p, dy, w, topk_weights, r, e, c),
                                        roundings, "dx[%lld][%lld] (row %lld of expert %lld)", (long long)dxr,
                                        (long long)c, (long long)r, (long long)e);
                }
        return end_check(&check, offsets);
    }
    for (int64_t t = 0; t < p->num_tokens; t++)
        for (int64_t c = 0; c < K; c++) {
            real_sum reduced = {0.0, 0.0}; /* dx_reduce_sum / dx_reduce_sum_abs over j < k */
            for (int64_t j = 0; j < p->topk; j++) {
                const int64_t r = gemm_row_of_slot(p, t * p->topk + j);
                const int64_t e = gemm_expert_of_row(p, offsets, r);
                add_scaled(&reduced, 1.0, dx_sum(p, dy, w, topk_weights, r, e, c));
            }
            within_update_bound(&check, t * K + c, reduced, roundings + p->topk - 1,
                                "dx[%lld][%lld] (reduce_topk over %lld slots)", (long long)t, (long long)c,
                                (long long)p->topk);
        }
    return end_check(&check, offsets);
}

long moe_ref_check_gemm_dw_post(const moe_gemm_problem *p, const void *x, const void *dy,
                                const void *topk_weights, const void *dw, const void *dw_before, char *message,
                                size_t capacity)
{
    clause_check check;
    int64_t *offsets = begin_check(&check, p, "dw_within_bound", p->dw_dtype, dw, dw_before, message, capacity);
    if (offsets == NULL)
        return -1;
    const int64_t N = p->N, K = p->K;
    for (int64_t e = 0; e < p->num_experts; e++) {
        const int64_t roundings = offsets[e + 1] - offsets[e] + gemm_weight_roundings(topk_weights);
        for (int64_t n = 0; n < N; n++)
            for (int64_t c = 0; c < K; c++) {
                real_sum exact = {0.0, 0.0}; /* dw_sum / dw_sum_abs over the rows of expert e */
                for (int64_t r = offsets[e]; r < offsets[e + 1]; r++) /* dw_term */
                    add_term(&exact, gemm_weight(p, topk_weights, r) *
                                     (double)moe_ref_load(p->dtype, dy, gemm_y_row(p, r) * N + n) *
                                     (double)moe_ref_load(p->dtype, x, gemm_x_row(p, r) * K + c));
                within_update_bound(&check, (e * N + n) * K + c, exact, roundings, "dw[%lld][%lld][%lld]",
                                    (long long)e, (long long)n, (long long)c);
            }
    }
    return end_check(&check, offsets);
}

long moe_ref_check_gemm_topk_grad_post(const moe_gemm_problem *p, const void *x, const void *w,
                                       const void *dy, const void *d_topk_weights,
                                       const void *d_topk_weights_before, char *message, size_t capacity)
{
    clause_check check;
    int64_t *offsets = begin_check(&check, p, "topk_grad_within_bound", p->dw_dtype, d_topk_weights,
                                   d_topk_weights_before, message, capacity);
    if (offsets == NULL)
        return -1;
    const int64_t N = p->N, K = p->K;
    for (int64_t e = 0; e < p->num_experts; e++)
        for (int64_t r = offsets[e]; r < offsets[e + 1]; r++) {
            real_sum exact = {0.0, 0.0}; /* topk_grad_sum / topk_grad_sum_abs over n < N */
            for (int64_t n = 0; n < N; n++) /* dy[yrow(r)][n] * y_n, y_n = dot_xw (dot_abs) */
                add_scaled(&exact, moe_ref_load(p->dtype, dy, gemm_y_row(p, r) * N + n),
                           dot_strided(p->dtype, x, gemm_x_row(p, r) * K, 1, w, (e * N + n) * K, 1, K));
            const int64_t slot = gemm_slot(p, r);
            within_update_bound(&check, slot, exact, N + K, "d_topk_weights[%lld] (row %lld of expert %lld)",
                                (long long)slot, (long long)r, (long long)e);
        }
    return end_check(&check, offsets);
}
