/* The grouped GEMM, naive twin: the readable definition (see moe_ref.h for the operation order).
 * One output element at a time; each OpenMP thread owns whole output rows. */
#include "moe_ref.h"

#include <stdlib.h>

/* OpenMP directives as _Pragma (as in gemm_blocked.c and mlp.c): the same compiled code as `#pragma omp`,
 * and Frama-C's parser, which rejects `#pragma omp` in statement position, reads it. */
#ifdef _OPENMP
#define NAIVE_OMP(directive) _Pragma(#directive)
#else
#define NAIVE_OMP(directive)
#endif

/* offsets[E+1] of a validated problem, or NULL after recording MOE_ERR_OUT_OF_MEMORY. */
static int64_t *expert_offsets(const moe_gemm_problem *p)
{
    int64_t *offsets = malloc(((size_t)p->num_experts + 1) * sizeof *offsets);
    if (offsets == NULL) {
        moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: no memory for %lld expert offsets", p->op,
                 (long long)p->num_experts + 1);
        return NULL;
    }
    moe_ref_expert_offsets(p->num_experts, p->m_sizes, offsets);
    return offsets;
}

/* The slot of expert-order row r (r itself when no gather indices are given). */
static int64_t slot_of_row(const moe_gemm_problem *p, int64_t r)
{
    return p->gather_indices != NULL ? p->gather_indices[r] : r;
}

/* Row of X read by expert-order row r. */
static int64_t x_row(const moe_gemm_problem *p, int64_t r)
{
    return p->permute_x ? slot_of_row(p, r) / p->topk : r;
}

/* Row of Y written (forward) or of dY read (backward) for expert-order row r. */
static int64_t y_row(const moe_gemm_problem *p, int64_t r)
{
    return p->permute_y ? slot_of_row(p, r) : r;
}

/* Applies the topk weight and accumulation of moe_ref.h's order, then stores with one rounding. */
static void finish(moe_dtype dtype, void *out, int64_t index, float value, int accumulate)
{
    if (accumulate)
        value = moe_ref_load(dtype, out, index) + value;
    moe_ref_store(dtype, out, index, value);
}

moe_status moe_ref_gemm_fwd_naive(const moe_gemm_problem *p, const void *x, const void *w,
                                  const void *topk_weights, void *y)
{
    const int64_t M = p->rows, N = p->N, K = p->K;
    int64_t *offsets = expert_offsets(p);
    if (offsets == NULL)
        return MOE_ERR_OUT_OF_MEMORY;
NAIVE_OMP(omp parallel for schedule(static))
    for (int64_t r = 0; r < M; r++) {
        const int64_t e = moe_ref_expert_of_row(p->num_experts, offsets, r);
        const int64_t xr = x_row(p, r), yr = y_row(p, r);
        for (int64_t n = 0; n < N; n++) {
            float acc = 0.0f;
            for (int64_t c = 0; c < K; c++)
                acc += moe_ref_load(p->dtype, x, xr * K + c) * moe_ref_load(p->dtype, w, (e * N + n) * K + c);
            if (topk_weights != NULL)
                acc = moe_ref_load(p->dtype, topk_weights, slot_of_row(p, r)) * acc;
            finish(p->dtype, y, yr * N + n, acc, p->accumulate);
        }
    }
    free(offsets);
    return MOE_OK;
}

moe_status moe_ref_gemm_dx_naive(const moe_gemm_problem *p, const void *dy, const void *w,
                                 const void *topk_weights, void *dx)
{
    const int64_t M = p->rows, N = p->N, K = p->K;
    int64_t *offsets = expert_offsets(p);
    if (offsets == NULL)
        return MOE_ERR_OUT_OF_MEMORY;
    if (!p->reduce_topk) {
NAIVE_OMP(omp parallel for schedule(static))
        for (int64_t r = 0; r < M; r++) {
            const int64_t e = moe_ref_expert_of_row(p->num_experts, offsets, r);
            const int64_t dyr = y_row(p, r);
            const int64_t dxr = p->permute_x ? slot_of_row(p, r) : r;
            for (int64_t c = 0; c < K; c++) {
                float acc = 0.0f;
                for (int64_t n = 0; n < N; n++)
                    acc += moe_ref_load(p->dtype, dy, dyr * N + n) * moe_ref_load(p->dtype, w, (e * N + n) * K + c);
                if (topk_weights != NULL)
                    acc = moe_ref_load(p->dtype, topk_weights, slot_of_row(p, r)) * acc;
                finish(p->dtype, dx, dxr * K + c, acc, p->accumulate);
            }
        }
        free(offsets);
        return MOE_OK;
    }

    /* reduce_topk: token t owns output row t and sums its k slots in order j = 0 .. k-1 */
    int64_t *row_of_slot = malloc((size_t)M * sizeof *row_of_slot + 1);
    if (row_of_slot == NULL) {
        free(offsets);
        return moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: no memory for the inverse of gather_indices", p->op);
    }
    for (int64_t r = 0; r < M; r++)
        row_of_slot[p->gather_indices[r]] = r;
    const int64_t T = p->num_tokens, k = p->topk;
NAIVE_OMP(omp parallel for schedule(static))
    for (int64_t t = 0; t < T; t++) {
        for (int64_t c = 0; c < K; c++) {
            float sum = 0.0f;
            for (int64_t j = 0; j < k; j++) {
                const int64_t r = row_of_slot[t * k + j];
                const int64_t e = moe_ref_expert_of_row(p->num_experts, offsets, r);
                const int64_t dyr = y_row(p, r);
                float acc = 0.0f;
                for (int64_t n = 0; n < N; n++)
                    acc += moe_ref_load(p->dtype, dy, dyr * N + n) * moe_ref_load(p->dtype, w, (e * N + n) * K + c);
                if (topk_weights != NULL)
                    acc = moe_ref_load(p->dtype, topk_weights, t * k + j) * acc;
                sum += acc;
            }
            finish(p->dtype, dx, t * K + c, sum, p->accumulate);
        }
    }
    free(row_of_slot);
    free(offsets);
    return MOE_OK;
}

moe_status moe_ref_gemm_dw_naive(const moe_gemm_problem *p, const void *x, const void *dy,
                                 const void *topk_weights, void *dw)
{
    const int64_t E = p->num_experts, N = p->N, K = p->K;
    int64_t *offsets = expert_offsets(p);
    if (offsets == NULL)
        return MOE_ERR_OUT_OF_MEMORY;
    /* each thread owns whole (expert, n) rows of dW */
NAIVE_OMP(omp parallel for schedule(static))
    for (int64_t en = 0; en < E * N; en++) {
        const int64_t e = en / N, n = en % N;
        for (int64_t c = 0; c < K; c++) {
            float acc = 0.0f;
            for (int64_t r = offsets[e]; r < offsets[e + 1]; r++) {
                float dy_value = moe_ref_load(p->dtype, dy, y_row(p, r) * N + n);
                if (topk_weights != NULL)
                    dy_value = moe_ref_load(p->dtype, topk_weights, slot_of_row(p, r)) * dy_value;
                acc += dy_value * moe_ref_load(p->dtype, x, x_row(p, r) * K + c);
            }
            finish(p->dw_dtype, dw, en * K + c, acc, p->accumulate);
        }
    }
    free(offsets);
    return MOE_OK;
}

moe_status moe_ref_gemm_topk_weights_grad(const moe_gemm_problem *p, const void *x, const void *w,
                                          const void *dy, void *d_topk_weights)
{
    const int64_t M = p->rows, N = p->N, K = p->K;
    int64_t *offsets = expert_offsets(p);
    if (offsets == NULL)
        return MOE_ERR_OUT_OF_MEMORY;
NAIVE_OMP(omp parallel for schedule(static))
    for (int64_t r = 0; r < M; r++) {
        const int64_t e = moe_ref_expert_of_row(p->num_experts, offsets, r);
        const int64_t xr = x_row(p, r), dyr = y_row(p, r);
        float acc = 0.0f;
        for (int64_t n = 0; n < N; n++) {
            float y_value = 0.0f;
            for (int64_t c = 0; c < K; c++)
                y_value += moe_ref_load(p->dtype, x, xr * K + c) * moe_ref_load(p->dtype, w, (e * N + n) * K + c);
            acc += moe_ref_load(p->dtype, dy, dyr * N + n) * y_value;
        }
        finish(p->dw_dtype, d_topk_weights, slot_of_row(p, r), acc, p->accumulate);
    }
    free(offsets);
    return MOE_OK;
}
