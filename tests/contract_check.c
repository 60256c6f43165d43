/* Run-time checks mirroring the ACSL float postconditions (see contract_check.h). */
#include "contract_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* gamma_k of specs/gemm.acsl: K u / (1 - K u), u = 2^-24 */
static double gamma_k(int64_t K)
{
    const double ku = (double)K * 0x1p-24;
    return ku / (1.0 - ku);
}

/* gemm_slot, gemm_x_row, gemm_y_row of specs/gemm.acsl */
static int64_t gemm_slot(const moe_gemm_problem *p, int64_t r)
{
    return p->gather_indices == NULL ? r : p->gather_indices[r];
}

long moe_ref_check_gemm_fwd_post(const moe_gemm_problem *p, const void *x, const void *w,
                                 const void *topk_weights, const void *y, char *message, size_t capacity)
{
    if (capacity > 0)
        message[0] = '\0';
    if (topk_weights != NULL || p->accumulate) /* outside the behaviour plain_f32 */
        return -1;
    int64_t *offsets = malloc(((size_t)p->num_experts + 1) * sizeof *offsets);
    if (offsets == NULL)
        return -1;
    moe_ref_expert_offsets(p->num_experts, p->m_sizes, offsets); /* offsets[e] = msum(m_sizes, e) */
    const double u_out = moe_dtype_unit_roundoff(p->dtype);
    const int64_t N = p->N, K = p->K;
    long violations = 0;
    for (int64_t e = 0; e < p->num_experts; e++) {
        for (int64_t r = offsets[e]; r < offsets[e + 1]; r++) {
            const int64_t slot = gemm_slot(p, r);
            const int64_t xr = p->permute_x ? slot / p->topk : r, yr = p->permute_y ? slot : r;
            for (int64_t n = 0; n < N; n++) {
                double dot = 0.0, dot_abs = 0.0; /* dot_xw and dot_abs of specs/gemm.acsl */
                for (int64_t c = 0; c < K; c++) {
                    const double term = (double)moe_ref_load(p->dtype, x, xr * K + c) *
                                        (double)moe_ref_load(p->dtype, w, (e * N + n) * K + c);
                    dot += term;
                    dot_abs += fabs(term);
                }
                const double yhat = (double)moe_ref_load(p->dtype, y, yr * N + n);
                const double bound = gamma_k(K) * dot_abs + u_out * fabs(dot);
                /* within_dot_bound; non-finite values must match exactly (NaN with NaN) */
                const int ok = isfinite(dot) ? fabs(yhat - dot) <= bound
                                             : (isnan(dot) ? isnan(yhat) : yhat == dot);
                if (!ok && violations++ == 0 && capacity > 0)
                    snprintf(message, capacity, "fwd_within_bound: y[%lld][%lld] = %.9g, expected %.17g "
                             "+- %.3g (row %lld of expert %lld, K = %lld, %s)", (long long)yr, (long long)n,
                             yhat, dot, bound, (long long)r, (long long)e, (long long)K,
                             moe_dtype_name(p->dtype));
            }
        }
    }
    free(offsets);
    return violations;
}
