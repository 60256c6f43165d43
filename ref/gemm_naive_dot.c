/* The forward's dot product (declared, with its contract, in gemm_naive_internal.h), in a file of its own
 * because its proof states its error bound (bound_fwd_dot, MOE_REF_BOUNDS): a caller's goals would carry that
 * clause's real-valued sums over the loaded elements among their hypotheses, where Z3 ran out of memory on the
 * topk-weight gradient's value invariant.  Proved with the value clauses (MOE_REF_VALUES) and the bound's. */
#define MOE_REF_VALUES /* the value clauses of moe_ref.h and gemm_naive_internal.h, for this file's proofs */
#define MOE_REF_BOUNDS /* gemm_naive_fwd_dot's bound clause, for this file's proof */
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
    /*@ ghost lemma_fdot_bound(p->dtype, (char *)x, xr * K, (char *)w, w_row * K, K); */
    return acc;
}
