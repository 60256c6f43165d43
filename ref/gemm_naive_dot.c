/* The forward's, dX's and dW's dot products and elements (declared, with their contracts, in
 * gemm_naive_internal.h), in a file of their own because their proofs state error bounds (bound_fwd_dot,
 * bound_dx_dot, bound_dw_dot without topk weights; the elements' bound_fwd, bound_fwd_weighted, bound_dx,
 * bound_dx_weighted, bound_dw: MOE_REF_BOUNDS): a caller's goals would carry those clauses' real-valued sums over
 * the loaded elements among their hypotheses, where Z3 ran out of memory on the topk-weight gradient's value
 * invariant (ref/gemm_naive_value.c, which calls gemm_naive_fwd_dot; there gemm_naive_dx_reduce_sum calls
 * gemm_naive_dx_dot).  The elements and the dX and dW dot products moved here from gemm_naive_value.c with the
 * same operations, so that the elements' goals see the dot's bound clause.  The forward's and dX's dot products' bounds are lemma_fdot_strided_bound's
 * (specs/gemm_value.acsl), at strides 1, 1 (forward) and 1, K (dX); dW's is lemma_fdw_bound's (its rows go
 * through the row maps).  Proved with the value clauses (MOE_REF_VALUES) and the bounds'. */
#define MOE_REF_VALUES /* the value clauses of moe_ref.h and gemm_naive_internal.h, for this file's proofs */
#define MOE_REF_BOUNDS /* the bound clauses of the dot products and elements, for this file's proof */
#include "gemm_naive_internal.h"

float gemm_naive_fwd_dot(const moe_gemm_problem *p, const void *x, const void *w, int64_t xr, int64_t w_row)
{
    const int64_t K = p->K;
    /*@ ghost const int64_t x_rows = p->permute_x ? p->num_tokens : p->rows; */
    /*@ assert x_rows: x_rows == gemm_x_rows(p) && (x_rows == p->rows || x_rows == p->num_tokens); */
    /*@ assert x_fits: x_rows * K <= INT64_MAX; */
    /*@ ghost lemma_row_fits(xr, x_rows, K); */
    /*@ ghost lemma_row_fits(w_row, p->num_experts * p->N, K); */
    float acc = 0.0f;
    /*@ loop invariant bounds: 0 <= c <= K;
        loop invariant value: same_float(acc, fdot(p->dtype, (char *)x, xr * K, (char *)w, w_row * K, c));
        loop assigns c, acc;
        loop variant K - c; */
    for (int64_t c = 0; c < K; c++)
        acc += moe_ref_load(p->dtype, x, xr * K + c) * moe_ref_load(p->dtype, w, w_row * K + c);
    /*@ ghost lemma_fdot_strided_bound(p->dtype, (char *)x, xr * K, 1, (char *)w, w_row * K, 1, K); */
    return acc;
}

void gemm_naive_fwd_element(const moe_gemm_problem *p, const void *x, const void *w, const void *topk_weights,
                            void *y, int64_t r, int64_t xr, int64_t w_row, int64_t y_index)
{
    /*@ assert y: tensor_writable((char *)y, p->rows * p->N, p->dtype); */
    /*@ assert element: element_writable((char *)y, y_index, p->dtype); */
    /*@ assert weight: topk_weights != \null ==> element_readable((char *)topk_weights, gemm_slot(p, r), p->dtype); */
    float acc = gemm_naive_fwd_dot(p, x, w, xr, w_row);
    /*@ ghost float dot = acc; */
    if (topk_weights != NULL) {
        const float weight = moe_ref_load(p->dtype, topk_weights, slot_of_row(p, r));
        acc = weight * acc;
        /*@ assert product: same_float(acc, f32_mul(loaded(p->dtype, (char *)topk_weights, gemm_slot(p, r)), dot)); */
        /*@ assert weight_step: f32_weight_step(loaded(p->dtype, (char *)topk_weights, gemm_slot(p, r)), dot,
              dot_exact_strided(p->dtype, (char *)x, xr * p->K, 1, (char *)w, w_row * p->K, 1, p->K),
              gamma_k(p->K) * dot_abs_strided(p->dtype, (char *)x, xr * p->K, 1, (char *)w, w_row * p->K, 1, p->K) +
              4 * p->K * eta_f32); */
        /*@ assert weighted_bound: fdot_strided_bound_premise(p->dtype, (char *)x, xr * p->K, 1, (char *)w, w_row * p->K, 1, p->K) &&
              \is_finite(loaded(p->dtype, (char *)topk_weights, gemm_slot(p, r))) &&
              \abs((real)loaded(p->dtype, (char *)topk_weights, gemm_slot(p, r))) *
                (\abs(dot_exact_strided(p->dtype, (char *)x, xr * p->K, 1, (char *)w, w_row * p->K, 1, p->K)) +
                 gamma_k(p->K) * dot_abs_strided(p->dtype, (char *)x, xr * p->K, 1, (char *)w, w_row * p->K, 1, p->K) +
                 4 * p->K * eta_f32) <= 340282346638528859811704183484516925440.0 ==>
              \is_finite(acc) &&
              \abs((real)acc - (real)loaded(p->dtype, (char *)topk_weights, gemm_slot(p, r)) *
                               dot_exact_strided(p->dtype, (char *)x, xr * p->K, 1, (char *)w, w_row * p->K, 1, p->K)) <=
                (1 + unit_f32) * \abs((real)loaded(p->dtype, (char *)topk_weights, gemm_slot(p, r))) *
                  (gamma_k(p->K) * dot_abs_strided(p->dtype, (char *)x, xr * p->K, 1, (char *)w, w_row * p->K, 1, p->K) +
                   4 * p->K * eta_f32) +
                unit_f32 * \abs((real)loaded(p->dtype, (char *)topk_weights, gemm_slot(p, r)) *
                                 dot_exact_strided(p->dtype, (char *)x, xr * p->K, 1, (char *)w, w_row * p->K, 1, p->K)) +
                eta_f32; */
    }
    /*@ assert weighted: same_float(acc, fwd_weighted(p, (char *)x, (char *)w, (char *)topk_weights, r, xr, w_row)); */
    gemm_naive_finish(p->dtype, y, y_index, acc, p->accumulate);
}

float gemm_naive_dx_dot(const moe_gemm_problem *p, const void *dy, const void *w, int64_t e, int64_t dyr,
                        int64_t c)
{
    const int64_t N = p->N, K = p->K;
    /*@ ghost lemma_row_fits(e, p->num_experts, N); */
    /*@ ghost lemma_row_fits(dyr, p->rows, N); */
    float acc = 0.0f;
    /*@ loop invariant bounds: 0 <= n <= N;
        loop invariant value: same_float(acc, fdot_strided(p->dtype, (char *)dy, dyr * N, 1, (char *)w, e * N * K + c, K, n));
        loop assigns n, acc;
        loop variant N - n; */
    for (int64_t n = 0; n < N; n++) {
        const int64_t w_row = e * N + n; /* row of w viewed as [E * N][K] */
        /*@ ghost lemma_row_fits(w_row, p->num_experts * N, K); */
        acc += moe_ref_load(p->dtype, dy, dyr * N + n) * moe_ref_load(p->dtype, w, w_row * K + c);
    }
    /*@ ghost
      if (N > 0) {
        const int64_t w_row0 = e * N; // w's row of (e, 0), viewed as [E * N][K]
        lemma_row_fits(w_row0, p->num_experts * N, K);
        lemma_fdot_strided_bound(p->dtype, (char *)dy, dyr * N, 1, (char *)w, w_row0 * K + c, K, N);
      }
    */
    return acc;
}

void gemm_naive_dx_element(const moe_gemm_problem *p, const void *dy, const void *w, const void *topk_weights,
                           void *dx, int64_t r, int64_t e, int64_t dyr, int64_t c, int64_t dx_index)
{
    /*@ assert dx: tensor_writable((char *)dx, p->rows * p->K, p->dtype); */
    /*@ assert element: element_writable((char *)dx, dx_index, p->dtype); */
    /*@ assert weight: topk_weights != \null ==> element_readable((char *)topk_weights, gemm_slot(p, r), p->dtype); */
    float acc = gemm_naive_dx_dot(p, dy, w, e, dyr, c);
    /*@ ghost float dot = acc; */
    if (topk_weights != NULL) {
        acc = moe_ref_load(p->dtype, topk_weights, slot_of_row(p, r)) * acc;
        /*@ assert product: same_float(acc, f32_mul(loaded(p->dtype, (char *)topk_weights, gemm_slot(p, r)), dot)); */
        /*@ assert weight_step: f32_weight_step(loaded(p->dtype, (char *)topk_weights, gemm_slot(p, r)), dot,
              dot_exact_strided(p->dtype, (char *)dy, dyr * p->N, 1, (char *)w, e * p->N * p->K + c, p->K, p->N),
              gamma_k(p->N) * dot_abs_strided(p->dtype, (char *)dy, dyr * p->N, 1, (char *)w, e * p->N * p->K + c, p->K, p->N) + 4 * p->N * eta_f32); */
        /*@ assert weighted_bound: fdot_strided_bound_premise(p->dtype, (char *)dy, dyr * p->N, 1, (char *)w, e * p->N * p->K + c, p->K, p->N) &&
              \is_finite(loaded(p->dtype, (char *)topk_weights, gemm_slot(p, r))) &&
              \abs((real)loaded(p->dtype, (char *)topk_weights, gemm_slot(p, r))) *
                (\abs(dot_exact_strided(p->dtype, (char *)dy, dyr * p->N, 1, (char *)w, e * p->N * p->K + c, p->K, p->N)) +
                 gamma_k(p->N) * dot_abs_strided(p->dtype, (char *)dy, dyr * p->N, 1, (char *)w, e * p->N * p->K + c, p->K, p->N) +
                 4 * p->N * eta_f32) <= 340282346638528859811704183484516925440.0 ==>
              \is_finite(acc) &&
              \abs((real)acc - (real)loaded(p->dtype, (char *)topk_weights, gemm_slot(p, r)) *
                               dot_exact_strided(p->dtype, (char *)dy, dyr * p->N, 1, (char *)w, e * p->N * p->K + c, p->K, p->N)) <=
                (1 + unit_f32) * \abs((real)loaded(p->dtype, (char *)topk_weights, gemm_slot(p, r))) *
                  (gamma_k(p->N) * dot_abs_strided(p->dtype, (char *)dy, dyr * p->N, 1, (char *)w, e * p->N * p->K + c, p->K, p->N) +
                   4 * p->N * eta_f32) +
                unit_f32 * \abs((real)loaded(p->dtype, (char *)topk_weights, gemm_slot(p, r)) *
                                 dot_exact_strided(p->dtype, (char *)dy, dyr * p->N, 1, (char *)w, e * p->N * p->K + c, p->K, p->N)) +
                eta_f32; */
    }
    /*@ assert weighted: same_float(acc, dx_weighted(p, (char *)dy, (char *)w, (char *)topk_weights, r, e, dyr, c)); */
    gemm_naive_finish(p->dtype, dx, dx_index, acc, p->accumulate);
}

float gemm_naive_dw_dot(const moe_gemm_problem *p, const int64_t *offsets, const void *x, const void *dy,
                        const void *topk_weights, int64_t e, int64_t n, int64_t c)
{
    const int64_t N = p->N, K = p->K;
    /*@ ghost const int64_t x_rows = p->permute_x ? p->num_tokens : p->rows; */
    /*@ assert x_rows: x_rows == gemm_x_rows(p) && (x_rows == p->rows || x_rows == p->num_tokens); */
    /*@ assert x_fits: x_rows * K <= INT64_MAX; */
    /*@ assert rows_of_e: 0 <= offsets[e] <= offsets[e + 1] <= p->rows; */
    float acc = 0.0f;
    /*@ loop invariant bounds: offsets[e] <= r <= offsets[e + 1];
        loop invariant value: same_float(acc, fdw(p, (char *)x, (char *)dy, (char *)topk_weights, offsets[e], r, n, c));
        loop invariant plain: topk_weights == \null ==> same_float(acc, fdw_plain(p, (char *)x, (char *)dy, offsets[e], r, n, c));
        loop assigns r, acc;
        loop variant offsets[e + 1] - r; */
    for (int64_t r = offsets[e]; r < offsets[e + 1]; r++) {
        const int64_t yr = y_row(p, r), xr = x_row(p, r);
        /*@ ghost lemma_row_fits(yr, p->rows, N); */
        /*@ ghost lemma_row_fits(xr, x_rows, K); */
        float dy_value = moe_ref_load(p->dtype, dy, yr * N + n);
        if (topk_weights != NULL)
            dy_value = moe_ref_load(p->dtype, topk_weights, slot_of_row(p, r)) * dy_value;
        /*@ assert factor: same_float(dy_value, dw_factor(p, (char *)dy, (char *)topk_weights, r, n)); */
        acc += dy_value * moe_ref_load(p->dtype, x, xr * K + c);
    }
    /*@ ghost lemma_fdw_bound(p, (char *)x, (char *)dy, offsets[e], offsets[e + 1], n, c); */
    return acc;
}

void gemm_naive_dw_element(const moe_gemm_problem *p, const int64_t *offsets, const void *x, const void *dy,
                           const void *topk_weights, void *dw, int64_t e, int64_t n, int64_t c, int64_t dw_index)
{
    /*@ assert dw: tensor_writable((char *)dw, p->num_experts * p->N * p->K, p->dw_dtype); */
    /*@ assert element: element_writable((char *)dw, dw_index, p->dw_dtype); */
    gemm_naive_finish(p->dw_dtype, dw, dw_index, gemm_naive_dw_dot(p, offsets, x, dy, topk_weights, e, n, c), p->accumulate);
}
