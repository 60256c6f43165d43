/* Run-time checks of the ACSL float postconditions that WP does not prove (specs/gemm.acsl, the
 * contracts of the naive grouped GEMM kernels in ref/moe_ref.h).  Each check re-evaluates one named
 * `ensures` clause in float64 and, on a violation, writes a message that starts with the clause name.
 *
 * The clauses (behaviours `*f32` in ref/moe_ref.h) speak of fp32 tensors; the checks extend them to every
 * dtype: inputs are read with moe_ref_load (exactly the values the kernel read), and u_out and eta_out are
 * those of the result's dtype (p->dtype for y and dx, p->dw_dtype for dw and d_topk_weights).  Every
 * element must satisfy within_dot_bound: |got - s| <= (1 + u_out) gamma_k(n) sum|terms| + u_out |s| +
 * eta_out, with s the float64 sum of the clause's terms and n the roundings per term derived in
 * specs/gemm.acsl.
 *
 * Common arguments: p, a validated problem (src/gemm_api.c) without accumulate; the tensors of the call,
 * in the shapes of moe.h; message [capacity], out: the first violation ("dx_within_bound: dx[3][1] = ...").
 * Each returns the number of violated elements (0: the postcondition holds), or -1 if p is outside the
 * clause's behaviour or memory ran out. */
#ifndef LIBMOE_TESTS_CONTRACT_CHECK_H
#define LIBMOE_TESTS_CONTRACT_CHECK_H

#include "moe_ref.h"

#include <stddef.h>

/* `fwd_within_bound` of moe_ref_gemm_fwd_naive: y[yrow(r)][n] against wt(r) sum_c x[xrow(r)][c] W[e][n][c],
 * K + w roundings (w = 1 with topk weights).
 * x [rows of X][K], w [E][N][K], topk_weights [M] or NULL, y and y_before [M][N]. */
long moe_ref_check_gemm_fwd_post(const moe_gemm_problem *p, const void *x, const void *w,
                                 const void *topk_weights, const void *y, const void *y_before, char *message,
                                 size_t capacity);

/* `dx_within_bound` (without reduce_topk: dx[dxrow(r)][c] against wt(r) sum_n dy[yrow(r)][n] W[e][n][c],
 * N + w roundings) or `dx_reduce_within_bound` (with reduce_topk: dx[t][c] against the sum of that over the
 * rows of slots t k .. t k + k - 1, N + w + k - 1 roundings) of moe_ref_gemm_dx_naive; w = 1 with weights.
 * dy [M][N], w [E][N][K], topk_weights [M] or NULL, dx and dx_before [M][K] or with reduce_topk [T][K]. */
long moe_ref_check_gemm_dx_post(const moe_gemm_problem *p, const void *dy, const void *w,
                                const void *topk_weights, const void *dx, const void *dx_before, char *message,
                                size_t capacity);

/* `dw_within_bound` of moe_ref_gemm_dw_naive: dw[e][n][c] against sum over the rows r of expert e of
 * wt(r) dy[yrow(r)][n] x[xrow(r)][c], m_e + w roundings.
 * x [rows of X][K], dy [M][N], topk_weights [M] or NULL, dw and dw_before [E][N][K] in p->dw_dtype. */
long moe_ref_check_gemm_dw_post(const moe_gemm_problem *p, const void *x, const void *dy,
                                const void *topk_weights, const void *dw, const void *dw_before, char *message,
                                size_t capacity);

/* `topk_grad_within_bound` of moe_ref_gemm_topk_weights_grad: d_topk_weights[g_r] against
 * sum_n dy[yrow(r)][n] sum_c x[xrow(r)][c] W[e][n][c], N + K roundings.
 * x [rows of X][K], w [E][N][K], dy [M][N], d_topk_weights and d_topk_weights_before [M] in p->dw_dtype
 * (by slot). */
long moe_ref_check_gemm_topk_grad_post(const moe_gemm_problem *p, const void *x, const void *w,
                                       const void *dy, const void *d_topk_weights,
                                       const void *d_topk_weights_before, char *message, size_t capacity);

#endif /* LIBMOE_TESTS_CONTRACT_CHECK_H */
