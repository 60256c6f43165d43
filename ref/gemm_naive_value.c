/* The naive GEMM's float functions (declared, with their contracts, in gemm_naive_internal.h): the finishing
 * store; the topk-weight gradient's dot product and element, and dX's reduce_topk sum and element (the dot
 * products of the forward, dX and dW and the forward's, dX's per-row and dW's elements, with their error
 * bounds, are ref/gemm_naive_dot.c's).  Their proofs state the values they
 * compute (specs/gemm_value.acsl), so this file is proved with moe_ref_load's and moe_ref_store's value
 * clauses (MOE_REF_VALUES); ref/gemm_naive.c, which calls them, is proved without. */
#define MOE_REF_VALUES /* the value clauses of moe_ref.h and gemm_naive_internal.h, for this file's proofs */
#include "gemm_naive_internal.h"

void gemm_naive_finish(moe_dtype dtype, void *out, int64_t index, float value, int accumulate)
{
    if (accumulate)
        value = moe_ref_load(dtype, out, index) + value;
    moe_ref_store(dtype, out, index, value);
}

float gemm_naive_topk_grad_dot(const moe_gemm_problem *p, const void *x, const void *w, const void *dy,
                               int64_t e, int64_t xr, int64_t dyr)
{
    const int64_t N = p->N;
    /*@ ghost lemma_row_fits(e, p->num_experts, N); */
    /*@ ghost lemma_row_fits(dyr, p->rows, N); */
    float acc = 0.0f;
    /*@ loop invariant bounds: 0 <= n <= N;
        loop invariant value: same_float(acc, ftopk_grad(p, (char *)x, (char *)w, (char *)dy, xr, dyr, e * N, n));
        loop assigns n, acc;
        loop variant N - n; */
    for (int64_t n = 0; n < N; n++)
        acc += moe_ref_load(p->dtype, dy, dyr * N + n) * gemm_naive_fwd_dot(p, x, w, xr, e * N + n);
    return acc;
}

void gemm_naive_topk_grad_element(const moe_gemm_problem *p, const void *x, const void *w, const void *dy,
                                  void *d_topk_weights, int64_t r, int64_t e, int64_t xr, int64_t dyr)
{
    /*@ assert d_topk_weights: tensor_writable((char *)d_topk_weights, p->rows, p->dw_dtype); */
    /*@ assert element: element_writable((char *)d_topk_weights, gemm_slot(p, r), p->dw_dtype); */
    const float acc = gemm_naive_topk_grad_dot(p, x, w, dy, e, xr, dyr);
    gemm_naive_finish(p->dw_dtype, d_topk_weights, slot_of_row(p, r), acc, p->accumulate);
}

/* The expert that owns row r is expert_from(offsets, E, r, 0) (specs/gemm_value.acsl): with sorted offsets
 * the experts before e end at or before offsets[e] <= r. */
/*@ ghost
  /@ requires experts: E >= 1;
     requires offsets: \valid_read(offsets + (0 .. E)) && sorted_offsets((int64_t *)offsets, E);
     requires owns: 0 <= e < E && offsets[e] <= r < offsets[e + 1];
     terminates \true;
     assigns \nothing;
     ensures unique: expert_from((int64_t *)offsets, E, r, 0) == e; @/
  static void lemma_expert_unique(const int64_t *offsets, int64_t E, int64_t r, int64_t e)
  {
    /@ loop invariant bounds: 0 <= i <= e;
       loop invariant same: expert_from((int64_t *)offsets, E, r, 0) == expert_from((int64_t *)offsets, E, r, i);
       loop assigns i;
       loop variant e - i; @/
    for (int64_t i = 0; i < e; i++) {
      /@ assert past: offsets[i + 1] <= offsets[e] && i < E - 1; @/
    }
  }
*/

float gemm_naive_dx_reduce_sum(const moe_gemm_problem *p, const int64_t *offsets, const int64_t *row_of_slot,
                               const void *dy, const void *w, const void *topk_weights, int64_t t, int64_t c)
{
    const int64_t k = p->topk;
    /*@ ghost lemma_row_fits(t, p->num_tokens, k); */
    float sum = 0.0f;
    /*@ loop invariant bounds: 0 <= j <= k;
        loop invariant value: same_float(sum, fdx_reduce(p, (int64_t *)offsets, (int64_t *)row_of_slot, (char *)dy,
                                                           (char *)w, (char *)topk_weights, t, c, j));
        loop assigns j, sum;
        loop variant k - j; */
    for (int64_t j = 0; j < k; j++) {
        const int64_t r = row_of_slot[t * k + j];
        const int64_t e = moe_ref_expert_of_row(p->num_experts, offsets, r);
        /*@ ghost lemma_expert_unique(offsets, p->num_experts, r, e); */
        float acc = gemm_naive_dx_dot(p, dy, w, e, y_row(p, r), c);
        if (topk_weights != NULL)
            acc = moe_ref_load(p->dtype, topk_weights, t * k + j) * acc;
        /*@ assert term: same_float(acc, dx_reduce_term(p, (int64_t *)offsets, (int64_t *)row_of_slot, (char *)dy,
                                                         (char *)w, (char *)topk_weights, t * k + j, c)); */
        sum += acc;
    }
    return sum;
}

void gemm_naive_dx_reduce_element(const moe_gemm_problem *p, const int64_t *offsets, const int64_t *row_of_slot,
                                  const void *dy, const void *w, const void *topk_weights, void *dx, int64_t t,
                                  int64_t c, int64_t dx_index)
{
    /*@ assert dx: tensor_writable((char *)dx, p->num_tokens * p->K, p->dtype); */
    /*@ ghost lemma_row_fits(t, p->num_tokens, p->K); */
    /*@ assert element: element_writable((char *)dx, dx_index, p->dtype); */
    gemm_naive_finish(p->dtype, dx, dx_index, gemm_naive_dx_reduce_sum(p, offsets, row_of_slot, dy, w, topk_weights, t, c),
                      p->accumulate);
}
