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
/*@ requires problem: gemm_problem_ok(p);
    requires row: 0 <= r < p->rows;
    terminates \true;
    assigns \nothing;
    ensures slot: 0 <= \result < p->rows; */
static int64_t slot_of_row(const moe_gemm_problem *p, int64_t r)
{
    return p->gather_indices != NULL ? p->gather_indices[r] : r;
}

/* Row of X read by expert-order row r. */
/*@ requires problem: gemm_problem_ok(p);
    requires row: 0 <= r < p->rows;
    terminates \true;
    assigns \nothing;
    ensures x_row: 0 <= \result < gemm_x_rows(p); */
static int64_t x_row(const moe_gemm_problem *p, int64_t r)
{
    if (!p->permute_x)
        return r;
    const int64_t slot = slot_of_row(p, r);
    /*@ ghost lemma_div_below(slot, p->num_tokens, p->topk); */
    return slot / p->topk;
}

/* Row of Y written (forward) or of dY read (backward) for expert-order row r. */
/*@ requires problem: gemm_problem_ok(p);
    requires row: 0 <= r < p->rows;
    terminates \true;
    assigns \nothing;
    ensures y_row: 0 <= \result < p->rows; */
static int64_t y_row(const moe_gemm_problem *p, int64_t r)
{
    return p->permute_y ? slot_of_row(p, r) : r;
}

/* Applies the topk weight and accumulation of moe_ref.h's order, then stores with one rounding. */
/*@ requires dtype: dtype_ok(dtype);
    requires element: element_writable((char *)out, index, dtype);
    terminates \true;
    assigns ((char *)out)[byte_offset(index, dtype) .. byte_offset(index + 1, dtype) - 1]; */
static void finish(moe_dtype dtype, void *out, int64_t index, float value, int accumulate)
{
    if (accumulate)
        value = moe_ref_load(dtype, out, index) + value;
    moe_ref_store(dtype, out, index, value);
}

/* The loops of moe_ref_gemm_fwd_naive on a validated problem, given its expert offsets.
 *   offsets      [E + 1]          moe_ref_expert_offsets of p->m_sizes
 *   x            [x rows][K]      x rows = T with permute_x, else M
 *   w            [E][N][K]
 *   topk_weights [M] or NULL      indexed by slot
 *   y            [M][N]           out */
/*@ requires problem: gemm_problem_ok(p);
    requires tensors: gemm_fwd_tensors_ok(p, (char *)x, (char *)w, (char *)topk_weights, (char *)y);
    requires offsets: gemm_offsets_ok(p, (int64_t *)offsets);
    requires separated: \separated((char *)y + (0 .. byte_offset(p->rows * p->N, p->dtype) - 1),
                                   offsets + (0 .. p->num_experts));
    terminates \true;
    assigns ((char *)y)[0 .. byte_offset(p->rows * p->N, p->dtype) - 1]; */
static void gemm_fwd_rows(const moe_gemm_problem *p, const int64_t *offsets, const void *x, const void *w,
                          const void *topk_weights, void *y)
{
    const int64_t M = p->rows, N = p->N, K = p->K;
    /*@ ghost const int64_t x_rows = p->permute_x ? p->num_tokens : M; */
    /*@ assert x_rows: x_rows == gemm_x_rows(p) && (x_rows == M || x_rows == p->num_tokens); */
    /*@ assert x_fits: x_rows * K <= INT64_MAX; */
    /*@ assert x: tensor_readable((char *)x, gemm_x_rows(p) * K, p->dtype); */
    /*@ assert w: tensor_readable((char *)w, p->num_experts * N * K, p->dtype); */
    /*@ assert y: tensor_writable((char *)y, M * N, p->dtype); */
    /*@ loop invariant bounds: 0 <= r <= M;
        loop assigns r, ((char *)y)[0 .. byte_offset(M * N, p->dtype) - 1];
        loop variant M - r; */
NAIVE_OMP(omp parallel for schedule(static))
    for (int64_t r = 0; r < M; r++) {
        const int64_t e = moe_ref_expert_of_row(p->num_experts, offsets, r);
        const int64_t xr = x_row(p, r), yr = y_row(p, r);
        /*@ loop invariant bounds: 0 <= n <= N;
            loop assigns n, ((char *)y)[0 .. byte_offset(M * N, p->dtype) - 1];
            loop variant N - n; */
        for (int64_t n = 0; n < N; n++) {
            /*@ ghost lemma_row_fits(e, p->num_experts, N); */
            const int64_t w_row = e * N + n; /* row of w viewed as [E * N][K] */
            /*@ ghost lemma_row_fits(w_row, p->num_experts * N, K); */
            /*@ ghost lemma_row_fits(xr, x_rows, K); */
            /*@ ghost lemma_row_fits(yr, M, N); */
            float acc = 0.0f;
            /*@ loop invariant bounds: 0 <= c <= K;
                loop assigns c, acc;
                loop variant K - c; */
            for (int64_t c = 0; c < K; c++)
                acc += moe_ref_load(p->dtype, x, xr * K + c) * moe_ref_load(p->dtype, w, w_row * K + c);
            if (topk_weights != NULL)
                acc = moe_ref_load(p->dtype, topk_weights, slot_of_row(p, r)) * acc;
            finish(p->dtype, y, yr * N + n, acc, p->accumulate);
        }
    }
}

/* Not proved by WP (it allocates offsets); gemm_fwd_rows, its loops, is. */
moe_status moe_ref_gemm_fwd_naive(const moe_gemm_problem *p, const void *x, const void *w,
                                  const void *topk_weights, void *y)
{
    int64_t *offsets = expert_offsets(p);
    if (offsets == NULL)
        return MOE_ERR_OUT_OF_MEMORY;
    gemm_fwd_rows(p, offsets, x, w, topk_weights, y);
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
