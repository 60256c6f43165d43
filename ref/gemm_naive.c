/* The grouped GEMM, naive twin: the readable definition (see moe_ref.h for the operation order).
 * One output element at a time; each OpenMP thread owns whole output rows. */
#include "gemm_naive_internal.h"

/* OpenMP directives as _Pragma (as in ref/gemm/ and ref/mlp/): the same compiled code as `#pragma omp`,
 * and Frama-C's parser, which rejects `#pragma omp` in statement position, reads it. */
#ifdef _OPENMP
#define NAIVE_OMP(directive) _Pragma(#directive)
#else
#define NAIVE_OMP(directive)
#endif

/* The out-of-memory failure of the naive kernels when their caller could not allocate the offsets. */
/*@ requires problem: \valid_read(p) && p->num_experts < INT64_MAX;
    terminates \true;
    assigns moe_error_model;
    ensures status: \result == MOE_ERR_OUT_OF_MEMORY; */
static moe_status no_offsets(const moe_gemm_problem *p)
{
    return moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: no memory for %lld expert offsets", p->op,
                    (long long)p->num_experts + 1);
}

/* The partition of the parallel loops below.  Each loop's body is a function (gemm_fwd_row, ...) whose
 * assigns clause names the span of the output that iteration i writes: W(i), a row of the output (one
 * element for the topk-weight gradient).  The lemmas prove that W(i) and W(j) are separated for i != j;
 * with a permutation of gather indices (what moe_routing_validate accepts) where the row goes through
 * them.  With the OpenMP fact that a `parallel for` whose iterations write disjoint locations and read no
 * location another iteration writes is equivalent to the sequential loop, WP's proof of the sequential
 * program covers the threaded one (specs/README.md, "The parallel loops"). */

/* Rows a != b of width n do not overlap. */
/*@ ghost
  /@ requires rows: 0 <= a && 0 <= b && a != b && 0 <= n;
     terminates \true;
     assigns \nothing;
     ensures apart: a * n + n <= b * n || b * n + n <= a * n; @/
  static void lemma_rows_apart(int64_t a, int64_t b, int64_t n)
  {
    if (a < b)
      lemma_mul_monotone(a + 1, b, n);
    else
      lemma_mul_monotone(b + 1, a, n);
  }
*/

/* The slots of rows r1 != r2 differ when the gather indices are injective. */
/*@ ghost
  /@ requires problem: gemm_problem_ok(p);
     requires rows: 0 <= r1 < p->rows && 0 <= r2 < p->rows && r1 != r2;
     requires permutation: p->gather_indices != \null ==> injective(p->gather_indices, p->rows);
     terminates \true;
     assigns \nothing;
     ensures apart: gemm_slot(p, r1) != gemm_slot(p, r2) && 0 <= gemm_slot(p, r1) && 0 <= gemm_slot(p, r2); @/
  static void lemma_slots_apart(const moe_gemm_problem *p, int64_t r1, int64_t r2)
  {
  }
*/

/* W(r) of gemm_fwd_rows (y row gemm_y_row(p, r): permuted = p->permute_y, width N) and of gemm_dx_rows (dx
 * row gemm_dx_row(p, r): permuted = p->permute_x, width K): the row of r, through its slot when permuted;
 * rows r1 != r2 write separated bytes. */
/*@ ghost
  /@ requires problem: gemm_problem_ok(p);
     requires rows: 0 <= r1 < p->rows && 0 <= r2 < p->rows && r1 != r2 && 0 <= width;
     requires permutation: p->gather_indices != \null ==> injective(p->gather_indices, p->rows);
     terminates \true;
     assigns \nothing;
     ensures apart: \let a = (permuted != 0 ? gemm_slot(p, r1) : r1); \let b = (permuted != 0 ? gemm_slot(p, r2) : r2);
       \separated(out + (byte_offset(a * width, d) .. byte_offset(a * width + width, d) - 1),
                  out + (byte_offset(b * width, d) .. byte_offset(b * width + width, d) - 1)); @/
  static void lemma_out_rows_through_slots_apart(const moe_gemm_problem *p, char *out, moe_dtype d, int permuted,
                                                 int64_t width, int64_t r1, int64_t r2)
  {
    lemma_slots_apart(p, r1, r2);
    if (permuted)
      lemma_rows_apart(p->gather_indices != 0 ? p->gather_indices[r1] : r1,
                       p->gather_indices != 0 ? p->gather_indices[r2] : r2, width);
    else
      lemma_rows_apart(r1, r2, width);
  }
*/

/* W(i) of gemm_dx_reduce_rows (dx row i, width K) and of gemm_dw_rows (dw row i = e * N + n, width K):
 * rows i1 != i2 of width K write separated bytes. */
/*@ ghost
  /@ requires rows: 0 <= i1 && 0 <= i2 && i1 != i2 && 0 <= K;
     terminates \true;
     assigns \nothing;
     ensures apart: \separated(out + (byte_offset(i1 * K, d) .. byte_offset(i1 * K + K, d) - 1),
                               out + (byte_offset(i2 * K, d) .. byte_offset(i2 * K + K, d) - 1)); @/
  static void lemma_out_rows_apart(char *out, moe_dtype d, int64_t i1, int64_t i2, int64_t K)
  {
    lemma_rows_apart(i1, i2, K);
  }
*/

/* W(r) of gemm_topk_grad_rows: element gemm_slot(p, r); rows r1 != r2 write separated bytes. */
/*@ ghost
  /@ requires problem: gemm_problem_ok(p);
     requires rows: 0 <= r1 < p->rows && 0 <= r2 < p->rows && r1 != r2;
     requires permutation: p->gather_indices != \null ==> injective(p->gather_indices, p->rows);
     terminates \true;
     assigns \nothing;
     ensures apart: \separated(g + (byte_offset(gemm_slot(p, r1), p->dw_dtype) .. byte_offset(gemm_slot(p, r1) + 1, p->dw_dtype) - 1),
                               g + (byte_offset(gemm_slot(p, r2), p->dw_dtype) .. byte_offset(gemm_slot(p, r2) + 1, p->dw_dtype) - 1)); @/
  static void lemma_topk_grad_apart(const moe_gemm_problem *p, char *g, int64_t r1, int64_t r2)
  {
    lemma_slots_apart(p, r1, r2);
  }
*/

/* Row r of the forward, the body of gemm_fwd_rows' parallel loop: y row gemm_y_row(p, r), every n.  It
 * writes that row only (W(r), lemma_out_rows_through_slots_apart). */
/*@ requires problem: gemm_problem_ok(p);
    requires tensors: gemm_fwd_tensors_ok(p, (char *)x, (char *)w, (char *)topk_weights, (char *)y);
    requires offsets: gemm_offsets_ok(p, (int64_t *)offsets);
    requires separated: \separated((char *)y + (0 .. byte_offset(p->rows * p->N, p->dtype) - 1),
                                   offsets + (0 .. p->num_experts));
    requires row: 0 <= r < p->rows;
    terminates \true;
    assigns ((char *)y)[byte_offset(gemm_y_row(p, r) * p->N, p->dtype) ..
                        byte_offset(gemm_y_row(p, r) * p->N + p->N, p->dtype) - 1]; */
static void gemm_fwd_row(const moe_gemm_problem *p, const int64_t *offsets, const void *x, const void *w,
                         const void *topk_weights, void *y, int64_t r)
{
    const int64_t N = p->N;
    /*@ ghost const int64_t M = p->rows; */
    /*@ assert y: tensor_writable((char *)y, M * N, p->dtype); */
    const int64_t e = moe_ref_expert_of_row(p->num_experts, offsets, r);
    const int64_t xr = x_row(p, r), yr = y_row(p, r);
    /*@ ghost lemma_row_fits(yr, M, N); */
    /*@ loop invariant bounds: 0 <= n <= N;
        loop assigns n, ((char *)y)[byte_offset(yr * N, p->dtype) .. byte_offset(yr * N + N, p->dtype) - 1];
        loop variant N - n; */
    for (int64_t n = 0; n < N; n++) {
        /*@ ghost lemma_row_fits(e, p->num_experts, N); */
        gemm_naive_fwd_element(p, x, w, topk_weights, y, r, xr, e * N + n, yr * N + n);
    }
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
    const int64_t M = p->rows;
    /*@ ghost const int64_t N = p->N; */
    /*@ loop invariant bounds: 0 <= r <= M;
        loop assigns r, ((char *)y)[0 .. byte_offset(M * N, p->dtype) - 1];
        loop variant M - r; */
NAIVE_OMP(omp parallel for schedule(static))
    for (int64_t r = 0; r < M; r++) {
        /*@ ghost lemma_row_fits(p->permute_y ? (p->gather_indices != 0 ? p->gather_indices[r] : r) : r, M, N); */
        gemm_fwd_row(p, offsets, x, w, topk_weights, y, r);
    }
}

/* Row r of the dX without reduce_topk, the body of gemm_dx_rows' parallel loop: dx row gemm_dx_row(p, r),
 * every c.  It writes that row only (W(r), lemma_out_rows_through_slots_apart). */
/*@ requires problem: gemm_problem_ok(p);
    requires tensors: gemm_dx_tensors_ok(p, (char *)dy, (char *)w, (char *)topk_weights, (char *)dx);
    requires per_row: p->reduce_topk == 0;
    requires offsets: gemm_offsets_ok(p, (int64_t *)offsets);
    requires separated: \separated((char *)dx + (0 .. byte_offset(p->rows * p->K, p->dtype) - 1),
                                   offsets + (0 .. p->num_experts));
    requires row: 0 <= r < p->rows;
    terminates \true;
    assigns ((char *)dx)[byte_offset(gemm_dx_row(p, r) * p->K, p->dtype) ..
                         byte_offset(gemm_dx_row(p, r) * p->K + p->K, p->dtype) - 1]; */
static void gemm_dx_per_row(const moe_gemm_problem *p, const int64_t *offsets, const void *dy, const void *w,
                            const void *topk_weights, void *dx, int64_t r)
{
    const int64_t K = p->K;
    /*@ ghost const int64_t M = p->rows; */
    /*@ assert dx: tensor_writable((char *)dx, M * K, p->dtype); */
    const int64_t e = moe_ref_expert_of_row(p->num_experts, offsets, r);
    const int64_t dyr = y_row(p, r);
    const int64_t dxr = p->permute_x ? slot_of_row(p, r) : r;
    /*@ assert dx_row: dxr == gemm_dx_row(p, r); */
    /*@ ghost lemma_row_fits(dxr, M, K); */
    /*@ loop invariant bounds: 0 <= c <= K;
        loop assigns c, ((char *)dx)[byte_offset(dxr * K, p->dtype) .. byte_offset(dxr * K + K, p->dtype) - 1];
        loop variant K - c; */
    for (int64_t c = 0; c < K; c++)
        gemm_naive_dx_element(p, dy, w, topk_weights, dx, r, e, dyr, c, dxr * K + c);
}

/* The loops of moe_ref_gemm_dx_naive without reduce_topk: dx row dxr(r) = permute_x ? g_r : r.
 *   offsets [E + 1], dy [M][N], w [E][N][K], topk_weights [M] or NULL (by slot), dx [M][K] out */
/*@ requires problem: gemm_problem_ok(p);
    requires tensors: gemm_dx_tensors_ok(p, (char *)dy, (char *)w, (char *)topk_weights, (char *)dx);
    requires per_row: p->reduce_topk == 0;
    requires offsets: gemm_offsets_ok(p, (int64_t *)offsets);
    requires separated: \separated((char *)dx + (0 .. byte_offset(p->rows * p->K, p->dtype) - 1),
                                   offsets + (0 .. p->num_experts));
    terminates \true;
    assigns ((char *)dx)[0 .. byte_offset(p->rows * p->K, p->dtype) - 1]; */
static void gemm_dx_rows(const moe_gemm_problem *p, const int64_t *offsets, const void *dy, const void *w,
                         const void *topk_weights, void *dx)
{
    const int64_t M = p->rows;
    /*@ ghost const int64_t K = p->K; */
    /*@ loop invariant bounds: 0 <= r <= M;
        loop assigns r, ((char *)dx)[0 .. byte_offset(M * K, p->dtype) - 1];
        loop variant M - r; */
NAIVE_OMP(omp parallel for schedule(static))
    for (int64_t r = 0; r < M; r++) {
        /*@ ghost lemma_row_fits(p->permute_x ? (p->gather_indices != 0 ? p->gather_indices[r] : r) : r, M, K); */
        gemm_dx_per_row(p, offsets, dy, w, topk_weights, dx, r);
    }
}

/* row_of_slot[gather_indices[r]] = r for r = 0 .. M-1: with a permutation, the inverse of the gather
 * indices (two-sided: gather_indices[row_of_slot[s]] == s too, `converse`, through the pigeonhole lemma
 * of specs/routing.acsl).  row_of_slot [M]: in, every entry a row in [0, M) (the caller zeroes it); out,
 * the inverse. */
/*@ requires problem: gemm_problem_ok(p);
    requires gather: p->rows > 0 ==> p->gather_indices != \null;
    requires row_of_slot: \valid(row_of_slot + (0 .. p->rows - 1)) && in_range(row_of_slot, p->rows, 0, p->rows);
    requires separated: \separated(row_of_slot + (0 .. p->rows - 1), p, p->gather_indices + (0 .. p->rows - 1));
    terminates \true;
    assigns row_of_slot[0 .. p->rows - 1];
    ensures rows: in_range(row_of_slot, p->rows, 0, p->rows);
    ensures inverse: p->rows > 0 && is_permutation(p->gather_indices, p->rows) ==>
      \forall integer r; 0 <= r < p->rows ==> row_of_slot[p->gather_indices[r]] == r;
    ensures converse: p->rows > 0 && is_permutation(p->gather_indices, p->rows) ==>
      \forall integer s; 0 <= s < p->rows ==> p->gather_indices[row_of_slot[s]] == s; */
static void invert_gather(const moe_gemm_problem *p, int64_t *row_of_slot)
{
    const int64_t M = p->rows;
    /*@ loop invariant bounds: 0 <= r <= M;
        loop invariant rows: in_range(row_of_slot, M, 0, M);
        loop invariant inverse: M > 0 && is_permutation(p->gather_indices, M) ==>
          \forall integer j; 0 <= j < r ==> row_of_slot[p->gather_indices[j]] == j;
        loop assigns r, row_of_slot[0 .. M - 1];
        loop variant M - r; */
    for (int64_t r = 0; r < M; r++)
        row_of_slot[p->gather_indices[r]] = r;
    /*@ ghost lemma_inverse_converse((int64_t *)p->gather_indices, row_of_slot, M); */
}

/* Token t of the dX with reduce_topk, the body of gemm_dx_reduce_rows' parallel loop: dx row t, every c.
 * It writes that row only (W(t), lemma_out_rows_apart). */
/*@ requires problem: gemm_problem_ok(p);
    requires tensors: gemm_dx_tensors_ok(p, (char *)dy, (char *)w, (char *)topk_weights, (char *)dx);
    requires reduce: p->reduce_topk != 0;
    requires offsets: gemm_offsets_ok(p, (int64_t *)offsets);
    requires row_of_slot: \valid_read(row_of_slot + (0 .. p->rows - 1)) &&
      in_range((int64_t *)row_of_slot, p->rows, 0, p->rows);
    requires separated: \separated((char *)dx + (0 .. byte_offset(p->num_tokens * p->K, p->dtype) - 1),
                                   offsets + (0 .. p->num_experts), row_of_slot + (0 .. p->rows - 1));
    requires token: 0 <= t < p->num_tokens;
    terminates \true;
    assigns ((char *)dx)[byte_offset(t * p->K, p->dtype) .. byte_offset(t * p->K + p->K, p->dtype) - 1]; */
static void gemm_dx_reduce_row(const moe_gemm_problem *p, const int64_t *offsets, const int64_t *row_of_slot,
                               const void *dy, const void *w, const void *topk_weights, void *dx, int64_t t)
{
    const int64_t K = p->K;
    /*@ ghost const int64_t T = p->num_tokens; */
    /*@ assert dx: tensor_writable((char *)dx, T * K, p->dtype); */
    /*@ ghost lemma_row_fits(t, T, K); */
    /*@ loop invariant bounds: 0 <= c <= K;
        loop assigns c, ((char *)dx)[byte_offset(t * K, p->dtype) .. byte_offset(t * K + K, p->dtype) - 1];
        loop variant K - c; */
    for (int64_t c = 0; c < K; c++)
        gemm_naive_dx_reduce_element(p, offsets, row_of_slot, dy, w, topk_weights, dx, t, c, t * K + c);
}

/* The loops of moe_ref_gemm_dx_naive with reduce_topk: token t owns dx row t and sums its k slots in
 * order j = 0 .. k-1 (each slot's dX accumulation times its weight).
 *   offsets [E + 1], row_of_slot [M] (invert_gather), dy [M][N], w [E][N][K], topk_weights [M] or NULL,
 *   dx [T][K] out */
/*@ requires problem: gemm_problem_ok(p);
    requires tensors: gemm_dx_tensors_ok(p, (char *)dy, (char *)w, (char *)topk_weights, (char *)dx);
    requires reduce: p->reduce_topk != 0;
    requires offsets: gemm_offsets_ok(p, (int64_t *)offsets);
    requires row_of_slot: \valid_read(row_of_slot + (0 .. p->rows - 1)) &&
      in_range((int64_t *)row_of_slot, p->rows, 0, p->rows);
    requires separated: \separated((char *)dx + (0 .. byte_offset(p->num_tokens * p->K, p->dtype) - 1),
                                   offsets + (0 .. p->num_experts), row_of_slot + (0 .. p->rows - 1));
    terminates \true;
    assigns ((char *)dx)[0 .. byte_offset(p->num_tokens * p->K, p->dtype) - 1]; */
static void gemm_dx_reduce_rows(const moe_gemm_problem *p, const int64_t *offsets, const int64_t *row_of_slot,
                                const void *dy, const void *w, const void *topk_weights, void *dx)
{
    const int64_t T = p->num_tokens;
    /*@ ghost const int64_t k = p->topk, K = p->K; */
    /*@ assert dx: tensor_writable((char *)dx, T * K, p->dtype); */
    /*@ loop invariant bounds: 0 <= t <= T;
        loop assigns t, ((char *)dx)[0 .. byte_offset(T * K, p->dtype) - 1];
        loop variant T - t; */
NAIVE_OMP(omp parallel for schedule(static))
    for (int64_t t = 0; t < T; t++) {
        /*@ ghost lemma_row_fits(t, T, K); */
        gemm_dx_reduce_row(p, offsets, row_of_slot, dy, w, topk_weights, dx, t);
    }
}

/* Row en = e * N + n of dW, the body of gemm_dw_rows' parallel loop: dw[e][n][0 .. K - 1].  It writes that
 * row only (W(en), lemma_out_rows_apart). */
/*@ requires problem: gemm_problem_ok(p);
    requires tensors: gemm_dw_tensors_ok(p, (char *)x, (char *)dy, (char *)topk_weights, (char *)dw);
    requires offsets: gemm_offsets_ok(p, (int64_t *)offsets);
    requires separated: \separated((char *)dw + (0 .. byte_offset(p->num_experts * p->N * p->K, p->dw_dtype) - 1),
                                   offsets + (0 .. p->num_experts));
    requires row: 0 <= en < p->num_experts * p->N;
    terminates \true;
    assigns ((char *)dw)[byte_offset(en * p->K, p->dw_dtype) .. byte_offset(en * p->K + p->K, p->dw_dtype) - 1]; */
static void gemm_dw_row(const moe_gemm_problem *p, const int64_t *offsets, const void *x, const void *dy,
                        const void *topk_weights, void *dw, int64_t en)
{
    const int64_t N = p->N, K = p->K;
    /*@ ghost const int64_t E = p->num_experts; */
    /*@ assert dw: tensor_writable((char *)dw, E * N * K, p->dw_dtype); */
    /*@ assert features: N >= 1; */
    /*@ ghost lemma_div_below(en, E, N); */
    /*@ ghost lemma_row_fits(en, E * N, K); */
    const int64_t e = en / N, n = en % N;
    /*@ loop invariant bounds: 0 <= c <= K;
        loop assigns c, ((char *)dw)[byte_offset(en * K, p->dw_dtype) .. byte_offset(en * K + K, p->dw_dtype) - 1];
        loop variant K - c; */
    for (int64_t c = 0; c < K; c++)
        gemm_naive_dw_element(p, offsets, x, dy, topk_weights, dw, e, n, c, en * K + c);
}

/* The loops of moe_ref_gemm_dw_naive: each thread owns whole (expert, n) rows of dW.
 *   offsets [E + 1], x [x rows][K], dy [M][N], topk_weights [M] or NULL, dw [E][N][K] out (dw_dtype) */
/*@ requires problem: gemm_problem_ok(p);
    requires tensors: gemm_dw_tensors_ok(p, (char *)x, (char *)dy, (char *)topk_weights, (char *)dw);
    requires offsets: gemm_offsets_ok(p, (int64_t *)offsets);
    requires separated: \separated((char *)dw + (0 .. byte_offset(p->num_experts * p->N * p->K, p->dw_dtype) - 1),
                                   offsets + (0 .. p->num_experts));
    terminates \true;
    assigns ((char *)dw)[0 .. byte_offset(p->num_experts * p->N * p->K, p->dw_dtype) - 1]; */
static void gemm_dw_rows(const moe_gemm_problem *p, const int64_t *offsets, const void *x, const void *dy,
                         const void *topk_weights, void *dw)
{
    const int64_t E = p->num_experts, N = p->N;
    /*@ ghost const int64_t K = p->K; */
    /*@ assert dw: tensor_writable((char *)dw, E * N * K, p->dw_dtype); */
    /*@ loop invariant bounds: 0 <= en <= E * N;
        loop assigns en, ((char *)dw)[0 .. byte_offset(E * N * K, p->dw_dtype) - 1];
        loop variant E * N - en; */
NAIVE_OMP(omp parallel for schedule(static))
    for (int64_t en = 0; en < E * N; en++) {
        /*@ ghost lemma_row_fits(en, E * N, K); */
        gemm_dw_row(p, offsets, x, dy, topk_weights, dw, en);
    }
}

/* Row r of the topk-weight gradient, the body of gemm_topk_grad_rows' parallel loop: the one element
 * d_topk_weights[gemm_slot(p, r)] (W(r), lemma_topk_grad_apart). */
/*@ requires problem: gemm_problem_ok(p);
    requires tensors: gemm_topk_grad_tensors_ok(p, (char *)x, (char *)w, (char *)dy, (char *)d_topk_weights);
    requires offsets: gemm_offsets_ok(p, (int64_t *)offsets);
    requires separated: \separated((char *)d_topk_weights + (0 .. byte_offset(p->rows, p->dw_dtype) - 1),
                                   offsets + (0 .. p->num_experts));
    requires row: 0 <= r < p->rows;
    terminates \true;
    assigns ((char *)d_topk_weights)[byte_offset(gemm_slot(p, r), p->dw_dtype) ..
                                     byte_offset(gemm_slot(p, r) + 1, p->dw_dtype) - 1]; */
static void gemm_topk_grad_row(const moe_gemm_problem *p, const int64_t *offsets, const void *x,
                               const void *w, const void *dy, void *d_topk_weights, int64_t r)
{
    /*@ ghost const int64_t M = p->rows; */
    /*@ assert d_topk_weights: tensor_writable((char *)d_topk_weights, M, p->dw_dtype); */
    const int64_t e = moe_ref_expert_of_row(p->num_experts, offsets, r);
    const int64_t xr = x_row(p, r), dyr = y_row(p, r);
    gemm_naive_topk_grad_element(p, x, w, dy, d_topk_weights, r, e, xr, dyr);
}

/* The loops of moe_ref_gemm_topk_weights_grad: d_topk_weights[g_r] = sum_n dy[yrow(r)][n] * y_n with
 * y_n = gemm_naive_fwd_dot(x row of r, w[e][n]).
 *   offsets [E + 1], x [x rows][K], w [E][N][K], dy [M][N], d_topk_weights [M] out (dw_dtype, by slot) */
/*@ requires problem: gemm_problem_ok(p);
    requires tensors: gemm_topk_grad_tensors_ok(p, (char *)x, (char *)w, (char *)dy, (char *)d_topk_weights);
    requires offsets: gemm_offsets_ok(p, (int64_t *)offsets);
    requires separated: \separated((char *)d_topk_weights + (0 .. byte_offset(p->rows, p->dw_dtype) - 1),
                                   offsets + (0 .. p->num_experts));
    terminates \true;
    assigns ((char *)d_topk_weights)[0 .. byte_offset(p->rows, p->dw_dtype) - 1]; */
static void gemm_topk_grad_rows(const moe_gemm_problem *p, const int64_t *offsets, const void *x,
                                const void *w, const void *dy, void *d_topk_weights)
{
    const int64_t M = p->rows;
    /*@ assert d_topk_weights: tensor_writable((char *)d_topk_weights, M, p->dw_dtype); */
    /*@ loop invariant bounds: 0 <= r <= M;
        loop assigns r, ((char *)d_topk_weights)[0 .. byte_offset(M, p->dw_dtype) - 1];
        loop variant M - r; */
NAIVE_OMP(omp parallel for schedule(static))
    for (int64_t r = 0; r < M; r++)
        gemm_topk_grad_row(p, offsets, x, w, dy, d_topk_weights, r);
}

/* The naive kernels on caller-provided scratch (contracts in moe_ref.h); ref/alloc_shells.c allocates it
 * for moe_ref_gemm_fwd_naive and the others.  offsets [E + 1] becomes moe_ref_expert_offsets of
 * p->m_sizes; NULL (not allocated) fails with MOE_ERR_OUT_OF_MEMORY before anything is written. */
moe_status moe_ref_gemm_fwd_naive_in(const moe_gemm_problem *p, const void *x, const void *w,
                                     const void *topk_weights, void *y, int64_t *offsets)
{
    if (offsets == NULL)
        return no_offsets(p);
    moe_ref_expert_offsets(p->num_experts, p->m_sizes, offsets);
    gemm_fwd_rows(p, offsets, x, w, topk_weights, y);
    return MOE_OK;
}

/* row_of_slot [M] (reduce_topk only): zeroed on entry (calloc), so that every entry is a row in [0, M)
 * before invert_gather overwrites them all (a permutation writes each slot once): the precondition of
 * gemm_dx_reduce_rows without a pigeonhole argument; NULL (not allocated) fails with
 * MOE_ERR_OUT_OF_MEMORY before anything but the offsets is written. */
moe_status moe_ref_gemm_dx_naive_in(const moe_gemm_problem *p, const void *dy, const void *w,
                                    const void *topk_weights, void *dx, int64_t *offsets, int64_t *row_of_slot)
{
    if (offsets == NULL)
        return no_offsets(p);
    moe_ref_expert_offsets(p->num_experts, p->m_sizes, offsets);
    if (!p->reduce_topk) {
        gemm_dx_rows(p, offsets, dy, w, topk_weights, dx);
        return MOE_OK;
    }
    if (row_of_slot == NULL)
        return moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: no memory for the inverse of gather_indices", p->op);
    invert_gather(p, row_of_slot);
    /*@ assert offsets_kept: sorted_offsets(offsets, p->num_experts) && offsets[0] == 0 &&
          offsets[p->num_experts] == p->rows; */
    gemm_dx_reduce_rows(p, offsets, row_of_slot, dy, w, topk_weights, dx);
    return MOE_OK;
}

moe_status moe_ref_gemm_dw_naive_in(const moe_gemm_problem *p, const void *x, const void *dy,
                                    const void *topk_weights, void *dw, int64_t *offsets)
{
    if (offsets == NULL)
        return no_offsets(p);
    moe_ref_expert_offsets(p->num_experts, p->m_sizes, offsets);
    /* the dims of dW as before the offsets were written: with them the provers find that the call's
     * assigns and separation clauses, which multiply them, are the contract's */
    /*@ assert fields: p->num_experts == \at(p->num_experts, Pre) && p->N == \at(p->N, Pre) &&
          p->K == \at(p->K, Pre); */
    gemm_dw_rows(p, offsets, x, dy, topk_weights, dw);
    return MOE_OK;
}

moe_status moe_ref_gemm_topk_weights_grad_in(const moe_gemm_problem *p, const void *x, const void *w,
                                             const void *dy, void *d_topk_weights, int64_t *offsets)
{
    if (offsets == NULL)
        return no_offsets(p);
    moe_ref_expert_offsets(p->num_experts, p->m_sizes, offsets);
    gemm_topk_grad_rows(p, offsets, x, w, dy, d_topk_weights);
    return MOE_OK;
}
