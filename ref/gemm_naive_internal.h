/* The naive GEMM's internals shared by its files: ref/gemm_naive.c (the loops, proved for safety),
 * ref/gemm_naive_value.c (float functions whose contracts state their values: dW's element, the topk-weight
 * gradient's dot product and element, dX's reduce_topk sum and element, the finishing store),
 * ref/gemm_naive_dot.c (the dot products of the forward, dX and dW, the forward's and dX's per-row elements,
 * with error bounds too).  Value clauses (MOE_REF_VALUE_CLAUSE, moe_ref.h) exist only where MOE_REF_VALUES is
 * defined, in those two files' proofs (bounds, MOE_REF_BOUND_CLAUSE: gemm_naive_dot.c's): a float clause among a
 * goal's hypotheses makes it Z3's and cvc5's (CVC4 1.8 cannot read binary32); gemm_naive.c's index goals need CVC4.
 * x_row and y_row are here for gemm_naive_dw_dot; they are proved in gemm_naive.c's run. */
#ifndef LIBMOE_REF_GEMM_NAIVE_INTERNAL_H
#define LIBMOE_REF_GEMM_NAIVE_INTERNAL_H

#include "moe_ref.h"

/* The slot of expert-order row r (r itself when no gather indices are given). */
/*@ requires problem: gemm_problem_ok(p);
    requires row: 0 <= r < p->rows;
    terminates \true;
    assigns \nothing;
    ensures slot: 0 <= \result < p->rows && \result == gemm_slot(p, r); */
static inline int64_t slot_of_row(const moe_gemm_problem *p, int64_t r)
{
    return p->gather_indices != NULL ? p->gather_indices[r] : r;
}

/* Row of X read by expert-order row r. */
/*@ requires problem: gemm_problem_ok(p);
    requires row: 0 <= r < p->rows;
    terminates \true;
    assigns \nothing;
    ensures x_row: 0 <= \result < gemm_x_rows(p);
    ensures x_row_of: \result == gemm_x_row(p, r); */
static inline int64_t x_row(const moe_gemm_problem *p, int64_t r)
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
    ensures y_row: 0 <= \result < p->rows && \result == gemm_y_row(p, r); */
static inline int64_t y_row(const moe_gemm_problem *p, int64_t r)
{
    return p->permute_y ? slot_of_row(p, r) : r;
}

/* Applies the topk weight and accumulation of moe_ref.h's order, then stores with one rounding. */
/*@ requires dtype: dtype_ok(dtype);
    requires element: element_writable((char *)out, index, dtype);
    terminates \true;
    assigns ((char *)out)[byte_offset(index, dtype) .. byte_offset(index + 1, dtype) - 1];
    MOE_REF_VALUE_CLAUSE(ensures value_finish: dtype == MOE_F32 ==> same_float(loaded(dtype, (char *)out, index),
      accumulate != 0 ? f32_add(\old(loaded(dtype, (char *)out, index)), value) : value);) */
void gemm_naive_finish(moe_dtype dtype, void *out, int64_t index, float value, int accumulate);

/* sum_{c < K} x[xr][c] * w[w_row][c] in ascending c, from +0.0f: the accumulation of the forward's
 * y[.][n] and of the topk-weight gradient's y_n, with w viewed as [E * N][K] and w_row = e * N + n.
 *   x [x rows][K], w [E][N][K]
 * Its value (value_fwd_dot) is fdot; its error bound (bound_fwd_dot): for K <= 2^23, finite loaded
 * elements and sum |x_c w_c| <= 2^125 (fdot_strided_bound_premise at strides 1, 1, specs/gemm_value.acsl), the
 * result is finite and within gamma_k(K) sum |x_c w_c| + 4 K eta_f32 of the exact sum (lemma_fdot_strided_bound
 * proves it for fdot_strided). */
/*@ requires problem: gemm_problem_ok(p);
    requires x: tensor_readable((char *)x, gemm_x_rows(p) * p->K, p->dtype);
    requires w: tensor_readable((char *)w, p->num_experts * p->N * p->K, p->dtype);
    requires x_row: 0 <= xr < gemm_x_rows(p);
    requires w_row: 0 <= w_row < p->num_experts * p->N;
    terminates \true;
    assigns \nothing;
    MOE_REF_VALUE_CLAUSE(ensures value_fwd_dot: same_float(\result, fdot(p->dtype, (char *)x, xr * p->K, (char *)w, w_row * p->K, p->K));)
    MOE_REF_BOUND_CLAUSE(ensures bound_fwd_dot: fdot_strided_bound_premise(p->dtype, (char *)x, xr * p->K, 1, (char *)w, w_row * p->K, 1, p->K) ==>
        \is_finite(\result) &&
        \abs((real)\result - dot_exact_strided(p->dtype, (char *)x, xr * p->K, 1, (char *)w, w_row * p->K, 1, p->K)) <=
          gamma_k(p->K) * dot_abs_strided(p->dtype, (char *)x, xr * p->K, 1, (char *)w, w_row * p->K, 1, p->K) +
          4 * p->K * eta_f32;) */
float gemm_naive_fwd_dot(const moe_gemm_problem *p, const void *x, const void *w, int64_t xr, int64_t w_row);

/* sum_{n < N} dy[dyr][n] * w[e][n][c] in ascending n, from +0.0f: the accumulation of one dX element
 * (both the per-row and the reduce_topk forms), with w's column c read with stride K from w[e][0][c].
 *   dy [M][N], w [E][N][K]
 * Its value (value_dx_dot) is fdot_strided (strides 1 and K); its error bound (bound_dx_dot, proved in
 * ref/gemm_naive_dot.c's run, MOE_REF_BOUNDS): for N <= 2^23, finite loaded elements and sum |dy_n w_nc| <= 2^125
 * (fdot_strided_bound_premise), the result is finite and within gamma_k(N) sum |dy_n w_nc| + 4 N eta_f32 of the
 * exact sum (lemma_fdot_strided_bound). */
/*@ requires problem: gemm_problem_ok(p);
    requires dy: tensor_readable((char *)dy, p->rows * p->N, p->dtype);
    requires w: tensor_readable((char *)w, p->num_experts * p->N * p->K, p->dtype);
    requires expert: 0 <= e < p->num_experts;
    requires dy_row: 0 <= dyr < p->rows;
    requires column: 0 <= c < p->K;
    terminates \true;
    assigns \nothing;
    MOE_REF_VALUE_CLAUSE(ensures value_dx_dot: same_float(\result, fdot_strided(p->dtype, (char *)dy, dyr * p->N, 1,
      (char *)w, e * p->N * p->K + c, p->K, p->N));)
    MOE_REF_BOUND_CLAUSE(ensures bound_dx_dot: fdot_strided_bound_premise(p->dtype, (char *)dy, dyr * p->N, 1, (char *)w, e * p->N * p->K + c, p->K, p->N) ==>
        \is_finite(\result) &&
        \abs((real)\result - dot_exact_strided(p->dtype, (char *)dy, dyr * p->N, 1, (char *)w, e * p->N * p->K + c, p->K, p->N)) <=
          gamma_k(p->N) * dot_abs_strided(p->dtype, (char *)dy, dyr * p->N, 1, (char *)w, e * p->N * p->K + c, p->K, p->N) +
          4 * p->N * eta_f32;) */
float gemm_naive_dx_dot(const moe_gemm_problem *p, const void *dy, const void *w, int64_t e, int64_t dyr,
                        int64_t c);

/* sum over the rows r of expert e, ascending, of (wt(r) * dy[yrow(r)][n]) * x[xrow(r)][c], from +0.0f
 * (without topk weights the factor is dy alone): the accumulation of dw[e][n][c], fdw over the rows
 * offsets[e] .. offsets[e + 1] - 1 (specs/gemm_value.acsl).
 *   offsets [E + 1], x [x rows][K], dy [M][N], topk_weights [M] or NULL
 * Its error bound without topk weights (bound_dw_dot, proved in ref/gemm_naive_dot.c's run, MOE_REF_BOUNDS): for
 * m_e = offsets[e + 1] - offsets[e] <= 2^23 rows, finite loaded elements and sum |dy x| <= 2^125
 * (fdw_bound_premise), the result is finite and within gamma_k(m_e) sum |dy x| + 4 m_e eta_f32 of the exact
 * sum dw_exact (lemma_fdw_bound). */
/*@ requires problem: gemm_problem_ok(p);
    requires offsets: gemm_offsets_ok(p, (int64_t *)offsets);
    requires x: tensor_readable((char *)x, gemm_x_rows(p) * p->K, p->dtype);
    requires dy: tensor_readable((char *)dy, p->rows * p->N, p->dtype);
    requires topk_weights: topk_weights != \null ==> tensor_readable((char *)topk_weights, p->rows, p->dtype);
    requires expert: 0 <= e < p->num_experts;
    requires feature: 0 <= n < p->N;
    requires column: 0 <= c < p->K;
    terminates \true;
    assigns \nothing;
    MOE_REF_VALUE_CLAUSE(ensures value_dw_dot: same_float(\result, fdw(p, (char *)x, (char *)dy, (char *)topk_weights,
      offsets[e], offsets[e + 1], n, c));)
    MOE_REF_BOUND_CLAUSE(ensures bound_dw_dot: topk_weights == \null &&
        fdw_bound_premise(p, (char *)x, (char *)dy, offsets[e], offsets[e + 1], n, c) ==>
        \is_finite(\result) &&
        \abs((real)\result - dw_exact(p, (char *)x, (char *)dy, offsets[e], offsets[e + 1], n, c)) <=
          gamma_k(offsets[e + 1] - offsets[e]) * dw_abs(p, (char *)x, (char *)dy, offsets[e], offsets[e + 1], n, c) +
          4 * (offsets[e + 1] - offsets[e]) * eta_f32;) */
float gemm_naive_dw_dot(const moe_gemm_problem *p, const int64_t *offsets, const void *x, const void *dy,
                        const void *topk_weights, int64_t e, int64_t n, int64_t c);

/* sum_{n < N} dy[dyr][n] * (x row xr . w row e * N + n) in ascending n, from +0.0f, each dot product
 * gemm_naive_fwd_dot's: the accumulation of the topk-weight gradient's element (ftopk_grad).
 *   x [x rows][K], w [E][N][K], dy [M][N] */
/*@ requires problem: gemm_problem_ok(p);
    requires x: tensor_readable((char *)x, gemm_x_rows(p) * p->K, p->dtype);
    requires w: tensor_readable((char *)w, p->num_experts * p->N * p->K, p->dtype);
    requires dy: tensor_readable((char *)dy, p->rows * p->N, p->dtype);
    requires expert: 0 <= e < p->num_experts;
    requires x_row: 0 <= xr < gemm_x_rows(p);
    requires dy_row: 0 <= dyr < p->rows;
    terminates \true;
    assigns \nothing;
    MOE_REF_VALUE_CLAUSE(ensures value_topk_grad_dot: same_float(\result, ftopk_grad(p, (char *)x, (char *)w, (char *)dy,
      xr, dyr, e * p->N, p->N));) */
float gemm_naive_topk_grad_dot(const moe_gemm_problem *p, const void *x, const void *w, const void *dy,
                               int64_t e, int64_t xr, int64_t dyr);

/* dX with reduce_topk, token t, column c: sum_{j < k} weight(t * k + j) * gemm_naive_dx_dot(row r_j) in
 * ascending j, from +0.0f, r_j = row_of_slot[t * k + j] and its expert (moe_ref_expert_of_row): the sum
 * gemm_dx_reduce_row stores (fdx_reduce).  row_of_slot [M]: the inverse of the gather indices. */
/*@ requires problem: gemm_problem_ok(p);
    requires dy: tensor_readable((char *)dy, p->rows * p->N, p->dtype);
    requires w: tensor_readable((char *)w, p->num_experts * p->N * p->K, p->dtype);
    requires topk_weights: topk_weights != \null ==> tensor_readable((char *)topk_weights, p->rows, p->dtype);
    requires offsets: gemm_offsets_ok(p, (int64_t *)offsets);
    requires row_of_slot: \valid_read(row_of_slot + (0 .. p->rows - 1)) &&
      in_range((int64_t *)row_of_slot, p->rows, 0, p->rows);
    requires token: 0 <= t < p->num_tokens;
    requires column: 0 <= c < p->K;
    terminates \true;
    assigns \nothing;
    MOE_REF_VALUE_CLAUSE(ensures value_dx_reduce_sum: same_float(\result, fdx_reduce(p, (int64_t *)offsets,
      (int64_t *)row_of_slot, (char *)dy, (char *)w, (char *)topk_weights, t, c, p->topk));) */
float gemm_naive_dx_reduce_sum(const moe_gemm_problem *p, const int64_t *offsets, const int64_t *row_of_slot,
                               const void *dy, const void *w, const void *topk_weights, int64_t t, int64_t c);

/* One element of dX with reduce_topk: dx[dx_index], dx_index = t * K + c, = gemm_naive_dx_reduce_sum(t, c),
 * accumulated and stored by gemm_naive_finish (the body of gemm_dx_reduce_row's loop over c).  Its value
 * (f32, without accumulate): fdx_reduce over the token's k slots. */
/*@ requires problem: gemm_problem_ok(p);
    requires tensors: gemm_dx_tensors_ok(p, (char *)dy, (char *)w, (char *)topk_weights, (char *)dx);
    requires reduce: p->reduce_topk != 0;
    requires offsets: gemm_offsets_ok(p, (int64_t *)offsets);
    requires row_of_slot: \valid_read(row_of_slot + (0 .. p->rows - 1)) &&
      in_range((int64_t *)row_of_slot, p->rows, 0, p->rows);
    requires token: 0 <= t < p->num_tokens;
    requires column: 0 <= c < p->K;
    requires dx_index: dx_index == t * p->K + c;
    terminates \true;
    assigns ((char *)dx)[byte_offset(dx_index, p->dtype) .. byte_offset(dx_index + 1, p->dtype) - 1];
    MOE_REF_VALUE_CLAUSE(ensures value_dx_reduce: p->dtype == MOE_F32 && p->accumulate == 0 ==> same_float(
      loaded(p->dtype, (char *)dx, dx_index), \old(fdx_reduce(p, (int64_t *)offsets, (int64_t *)row_of_slot, (char *)dy,
      (char *)w, (char *)topk_weights, t, c, p->topk)));) */
void gemm_naive_dx_reduce_element(const moe_gemm_problem *p, const int64_t *offsets, const int64_t *row_of_slot,
                                  const void *dy, const void *w, const void *topk_weights, void *dx, int64_t t,
                                  int64_t c, int64_t dx_index);

/* One element of dX without reduce_topk: dx[dx_index] = weight(r) * gemm_naive_dx_dot(e, dyr, c), accumulated
 * and stored by gemm_naive_finish (the body of gemm_dx_per_row's loop over c).  Its value (f32, without
 * accumulate): dx_weighted (specs/gemm_value.acsl).  Its error bounds (f32, without accumulate; proved in
 * ref/gemm_naive_dot.c's run), the forward element's with N for K: without topk weights (bound_dx) the dot
 * product's (bound_dx_dot); with a finite weight wt (bound_dx_weighted), for |wt| (|dot_exact| + gamma_k(N)
 * dot_abs + 4 N eta_f32) <= the largest finite binary32, within_dot_bound of y = wt dot_exact, sabs = |wt|
 * dot_abs, u_out = unit_f32, eta_out = eta_f32 + (1 + unit_f32) |wt| 4 N eta_f32 (f32_weight_step). */
/*@ requires problem: gemm_problem_ok(p);
    requires tensors: gemm_dx_tensors_ok(p, (char *)dy, (char *)w, (char *)topk_weights, (char *)dx);
    requires per_row: p->reduce_topk == 0;
    requires row: 0 <= r < p->rows;
    requires expert: 0 <= e < p->num_experts;
    requires dy_row: 0 <= dyr < p->rows;
    requires column: 0 <= c < p->K;
    requires dx_index: 0 <= dx_index < p->rows * p->K;
    terminates \true;
    assigns ((char *)dx)[byte_offset(dx_index, p->dtype) .. byte_offset(dx_index + 1, p->dtype) - 1];
    MOE_REF_VALUE_CLAUSE(ensures value_dx: p->dtype == MOE_F32 && p->accumulate == 0 ==> same_float(
      loaded(p->dtype, (char *)dx, dx_index), \old(dx_weighted(p, (char *)dy, (char *)w, (char *)topk_weights, r, e, dyr, c)));)
    MOE_REF_BOUND_CLAUSE(ensures bound_dx: p->dtype == MOE_F32 && p->accumulate == 0 && topk_weights == \null &&
        \old(fdot_strided_bound_premise(p->dtype, (char *)dy, dyr * p->N, 1, (char *)w, e * p->N * p->K + c, p->K, p->N)) ==>
        \is_finite(loaded(p->dtype, (char *)dx, dx_index)) &&
        \abs((real)loaded(p->dtype, (char *)dx, dx_index) -
              \old(dot_exact_strided(p->dtype, (char *)dy, dyr * p->N, 1, (char *)w, e * p->N * p->K + c, p->K, p->N))) <=
          gamma_k(p->N) * \old(dot_abs_strided(p->dtype, (char *)dy, dyr * p->N, 1, (char *)w, e * p->N * p->K + c, p->K, p->N)) +
          4 * p->N * eta_f32;)
    MOE_REF_BOUND_CLAUSE(ensures bound_dx_weighted: p->dtype == MOE_F32 && p->accumulate == 0 && topk_weights != \null &&
        \old(fdot_strided_bound_premise(p->dtype, (char *)dy, dyr * p->N, 1, (char *)w, e * p->N * p->K + c, p->K, p->N)) &&
        \is_finite(\old(loaded(p->dtype, (char *)topk_weights, gemm_slot(p, r)))) &&
        \abs((real)\old(loaded(p->dtype, (char *)topk_weights, gemm_slot(p, r)))) *
          (\abs(\old(dot_exact_strided(p->dtype, (char *)dy, dyr * p->N, 1, (char *)w, e * p->N * p->K + c, p->K, p->N))) +
           gamma_k(p->N) * \old(dot_abs_strided(p->dtype, (char *)dy, dyr * p->N, 1, (char *)w, e * p->N * p->K + c, p->K, p->N)) +
           4 * p->N * eta_f32) <= 340282346638528859811704183484516925440.0 ==>
        \is_finite(loaded(p->dtype, (char *)dx, dx_index)) &&
        within_dot_bound((real)loaded(p->dtype, (char *)dx, dx_index),
          (real)\old(loaded(p->dtype, (char *)topk_weights, gemm_slot(p, r))) *
            \old(dot_exact_strided(p->dtype, (char *)dy, dyr * p->N, 1, (char *)w, e * p->N * p->K + c, p->K, p->N)),
          \abs((real)\old(loaded(p->dtype, (char *)topk_weights, gemm_slot(p, r)))) *
            \old(dot_abs_strided(p->dtype, (char *)dy, dyr * p->N, 1, (char *)w, e * p->N * p->K + c, p->K, p->N)),
          p->N, unit_f32,
          eta_f32 + (1 + unit_f32) * \abs((real)\old(loaded(p->dtype, (char *)topk_weights, gemm_slot(p, r)))) *
            (4 * p->N * eta_f32));) */
void gemm_naive_dx_element(const moe_gemm_problem *p, const void *dy, const void *w, const void *topk_weights,
                           void *dx, int64_t r, int64_t e, int64_t dyr, int64_t c, int64_t dx_index);

/* One element of dW: dw[dw_index] = gemm_naive_dw_dot(e, n, c), accumulated and stored by gemm_naive_finish
 * in dw_dtype (the body of gemm_dw_row's loop over c).  Its value (dw_dtype f32, without accumulate): fdw
 * over expert e's rows.  Its error bound (dw_dtype f32, without accumulate, without topk weights; proved in
 * ref/gemm_naive_dot.c's run): the dot product's (bound_dw_dot), the element stored as it is. */
/*@ requires problem: gemm_problem_ok(p);
    requires tensors: gemm_dw_tensors_ok(p, (char *)x, (char *)dy, (char *)topk_weights, (char *)dw);
    requires offsets: gemm_offsets_ok(p, (int64_t *)offsets);
    requires expert: 0 <= e < p->num_experts;
    requires feature: 0 <= n < p->N;
    requires column: 0 <= c < p->K;
    requires dw_index: 0 <= dw_index < p->num_experts * p->N * p->K;
    terminates \true;
    assigns ((char *)dw)[byte_offset(dw_index, p->dw_dtype) .. byte_offset(dw_index + 1, p->dw_dtype) - 1];
    MOE_REF_VALUE_CLAUSE(ensures value_dw: p->dw_dtype == MOE_F32 && p->accumulate == 0 ==> same_float(
      loaded(p->dw_dtype, (char *)dw, dw_index),
      \old(fdw(p, (char *)x, (char *)dy, (char *)topk_weights, offsets[e], offsets[e + 1], n, c)));)
    MOE_REF_BOUND_CLAUSE(ensures bound_dw: p->dw_dtype == MOE_F32 && p->accumulate == 0 && topk_weights == \null &&
        \old(fdw_bound_premise(p, (char *)x, (char *)dy, offsets[e], offsets[e + 1], n, c)) ==>
        \is_finite(loaded(p->dw_dtype, (char *)dw, dw_index)) &&
        \abs((real)loaded(p->dw_dtype, (char *)dw, dw_index) -
              \old(dw_exact(p, (char *)x, (char *)dy, offsets[e], offsets[e + 1], n, c))) <=
          gamma_k(offsets[e + 1] - offsets[e]) *
            \old(dw_abs(p, (char *)x, (char *)dy, offsets[e], offsets[e + 1], n, c)) +
          4 * (offsets[e + 1] - offsets[e]) * eta_f32;) */
void gemm_naive_dw_element(const moe_gemm_problem *p, const int64_t *offsets, const void *x, const void *dy,
                           const void *topk_weights, void *dw, int64_t e, int64_t n, int64_t c, int64_t dw_index);

/* One element of the topk-weight gradient: d_topk_weights[gemm_slot(p, r)] = gemm_naive_topk_grad_dot(e, xr,
 * dyr), accumulated and stored by gemm_naive_finish in dw_dtype (the tail of gemm_topk_grad_row).  Its value
 * (dw_dtype f32, without accumulate): ftopk_grad. */
/*@ requires problem: gemm_problem_ok(p);
    requires tensors: gemm_topk_grad_tensors_ok(p, (char *)x, (char *)w, (char *)dy, (char *)d_topk_weights);
    requires row: 0 <= r < p->rows;
    requires expert: 0 <= e < p->num_experts;
    requires x_row: 0 <= xr < gemm_x_rows(p);
    requires dy_row: 0 <= dyr < p->rows;
    terminates \true;
    assigns ((char *)d_topk_weights)[byte_offset(gemm_slot(p, r), p->dw_dtype) ..
                                     byte_offset(gemm_slot(p, r) + 1, p->dw_dtype) - 1];
    MOE_REF_VALUE_CLAUSE(ensures value_topk_grad: p->dw_dtype == MOE_F32 && p->accumulate == 0 ==> same_float(
      loaded(p->dw_dtype, (char *)d_topk_weights, gemm_slot(p, r)),
      \old(ftopk_grad(p, (char *)x, (char *)w, (char *)dy, xr, dyr, e * p->N, p->N)));)
    MOE_REF_VALUE_CLAUSE(ensures value_topk_grad_accumulate: p->dw_dtype == MOE_F32 && p->accumulate != 0 ==> same_float(
      loaded(p->dw_dtype, (char *)d_topk_weights, gemm_slot(p, r)),
      f32_add(\old(loaded(p->dw_dtype, (char *)d_topk_weights, gemm_slot(p, r))),
              \old(ftopk_grad(p, (char *)x, (char *)w, (char *)dy, xr, dyr, e * p->N, p->N))));) */
void gemm_naive_topk_grad_element(const moe_gemm_problem *p, const void *x, const void *w, const void *dy,
                                  void *d_topk_weights, int64_t r, int64_t e, int64_t xr, int64_t dyr);

/* One element of the forward: y[y_index] = weight(r) * (x row xr . w row w_row), accumulated and stored
 * by gemm_naive_finish.  Its value (f32, without accumulate): the rounded operation sequence fwd_weighted
 * (specs/gemm_value.acsl); gemm_naive_finish's own contract states the accumulate case's one more binary32 addition.
 * Its error bound (f32, without accumulate; proved in ref/gemm_naive_dot.c's run, MOE_REF_BOUNDS): without
 * topk weights (bound_fwd), the dot product's (bound_fwd_dot); with a finite weight wt (bound_fwd_weighted),
 * for |wt| (|dot_exact| + gamma_k(K) dot_abs + 4 K eta_f32) <= the largest finite binary32, the stored
 * value is finite and within_dot_bound (specs/gemm.acsl, SEMANTICS section 4's form) of y = wt dot_exact,
 * sabs = |wt| dot_abs, u_out = unit_f32 and eta_out = eta_f32 + (1 + unit_f32) |wt| 4 K eta_f32 (the
 * dot's underflow terms, weighted): f32_weight_step (specs/float_bounds.mlw's WeightStepStatement). */
/*@ requires problem: gemm_problem_ok(p);
    requires tensors: gemm_fwd_tensors_ok(p, (char *)x, (char *)w, (char *)topk_weights, (char *)y);
    requires row: 0 <= r < p->rows;
    requires x_row: 0 <= xr < gemm_x_rows(p);
    requires w_row: 0 <= w_row < p->num_experts * p->N;
    requires y_index: 0 <= y_index < p->rows * p->N;
    terminates \true;
    assigns ((char *)y)[byte_offset(y_index, p->dtype) .. byte_offset(y_index + 1, p->dtype) - 1];
    MOE_REF_VALUE_CLAUSE(ensures value_fwd: p->dtype == MOE_F32 && p->accumulate == 0 ==> same_float(
      loaded(p->dtype, (char *)y, y_index), \old(fwd_weighted(p, (char *)x, (char *)w, (char *)topk_weights, r, xr, w_row)));)
    MOE_REF_BOUND_CLAUSE(ensures bound_fwd: p->dtype == MOE_F32 && p->accumulate == 0 && topk_weights == \null &&
        \old(fdot_strided_bound_premise(p->dtype, (char *)x, xr * p->K, 1, (char *)w, w_row * p->K, 1, p->K)) ==>
        \is_finite(loaded(p->dtype, (char *)y, y_index)) &&
        \abs((real)loaded(p->dtype, (char *)y, y_index) -
              \old(dot_exact_strided(p->dtype, (char *)x, xr * p->K, 1, (char *)w, w_row * p->K, 1, p->K))) <=
          gamma_k(p->K) * \old(dot_abs_strided(p->dtype, (char *)x, xr * p->K, 1, (char *)w, w_row * p->K, 1, p->K)) +
          4 * p->K * eta_f32;)
    MOE_REF_BOUND_CLAUSE(ensures bound_fwd_weighted: p->dtype == MOE_F32 && p->accumulate == 0 && topk_weights != \null &&
        \old(fdot_strided_bound_premise(p->dtype, (char *)x, xr * p->K, 1, (char *)w, w_row * p->K, 1, p->K)) &&
        \is_finite(\old(loaded(p->dtype, (char *)topk_weights, gemm_slot(p, r)))) &&
        \abs((real)\old(loaded(p->dtype, (char *)topk_weights, gemm_slot(p, r)))) *
          (\abs(\old(dot_exact_strided(p->dtype, (char *)x, xr * p->K, 1, (char *)w, w_row * p->K, 1, p->K))) +
           gamma_k(p->K) * \old(dot_abs_strided(p->dtype, (char *)x, xr * p->K, 1, (char *)w, w_row * p->K, 1, p->K)) +
           4 * p->K * eta_f32) <= 340282346638528859811704183484516925440.0 ==>
        \is_finite(loaded(p->dtype, (char *)y, y_index)) &&
        within_dot_bound((real)loaded(p->dtype, (char *)y, y_index),
          (real)\old(loaded(p->dtype, (char *)topk_weights, gemm_slot(p, r))) *
            \old(dot_exact_strided(p->dtype, (char *)x, xr * p->K, 1, (char *)w, w_row * p->K, 1, p->K)),
          \abs((real)\old(loaded(p->dtype, (char *)topk_weights, gemm_slot(p, r)))) *
            \old(dot_abs_strided(p->dtype, (char *)x, xr * p->K, 1, (char *)w, w_row * p->K, 1, p->K)),
          p->K, unit_f32,
          eta_f32 + (1 + unit_f32) * \abs((real)\old(loaded(p->dtype, (char *)topk_weights, gemm_slot(p, r)))) *
            (4 * p->K * eta_f32));) */
void gemm_naive_fwd_element(const moe_gemm_problem *p, const void *x, const void *w, const void *topk_weights,
                            void *y, int64_t r, int64_t xr, int64_t w_row, int64_t y_index);

#endif
