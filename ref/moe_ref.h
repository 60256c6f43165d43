/*
 * The CPU reference: element access, routing helpers and the grouped GEMM in two twins.
 *
 * `*_naive` is the readable definition, one output element at a time.  `*_blocked` is the mildly
 * optimised twin (converted fp32 tiles, loops that vectorise across output elements).  Both perform,
 * for every output element, the SAME float32 operations in the SAME order, so they agree bit for bit;
 * tests/test_gemm_modes.c checks that.  The order, per output element (acc starts at +0.0f):
 *
 *   fwd  y[r][n]   : acc += x[xrow(r)][c] * W[e][n][c]           for c = 0 .. K-1
 *                    v = acc;  v = wt(r) * v (if topk weights);  v = old + v (if accumulate)
 *   dX   dx[r][c]  : acc += dy[yrow(r)][n] * W[e][n][c]          for n = 0 .. N-1
 *                    v = acc;  v = wt(r) * v;                    v = old + v
 *   dX with reduce_topk, row t: sum = 0; for j = 0 .. k-1: (acc of slot t*k+j as above, times its
 *                    weight) then sum += that;  v = sum;  v = old + v
 *   dW   dw[e][n][c]: acc += (wt(r) * dy[yrow(r)][n]) * x[xrow(r)][c]   for r in expert e, ascending
 *                    (without topk weights the factor is dy alone);  v = old + v
 *   dtopk[g_r]     : y_n = sum_c x[xrow(r)][c] * W[e][n][c] (ascending c), acc += dy[yrow(r)][n] * y_n
 *                    (ascending n);  v = old + v
 *
 * with xrow(r) = permute_x ? g_r / k : r, yrow(r) = permute_y ? g_r : r, dx row = permute_x ? g_r : r,
 * wt(r) = topk_weights[g_r].  The final v is rounded once to the output dtype.
 *
 * Parallelism: each OpenMP thread owns whole output rows (fwd, dX: rows; dW: (expert, n) rows), never
 * atomics, so results are the same for every thread count.
 */
#ifndef LIBMOE_REF_H
#define LIBMOE_REF_H

#include "moe_backend.h"

#include <string.h>

#ifdef __FRAMAC__
#include "routing.acsl" /* specs/: the ACSL logic of routings (Frama-C only) */
#include "gemm.acsl"    /* specs/: the grouped GEMM over the reals (Frama-C only) */
/* specs/: the float values the naive GEMM computes, only where they are proved (MOE_REF_VALUES, below):
 * its declarations change the text of every goal WP writes, hence the cache digests of the other files */
#ifdef MOE_REF_VALUES
#include "gemm_value.acsl"
#endif

/* The dtype functions of src/dtype.c (prototypes in include/moe.h, which carries no ACSL), redeclared with
 * their contracts for Frama-C only; Frama-C merges them with moe.h's prototypes.  WP proves all eight in
 * src/dtype.c (specs/verify.sh; moe_dtype_from_name through its string comparison `spells`, not strcmp),
 * relying on the trusted contracts of its bit casts float_bits / bits_float (memcpy between a float and a
 * uint32_t, which WP's typed model cannot follow).  The conversions' values
 * (round to nearest even, NaN and Inf kept) are not stated; tests/test_dtype checks them.  Gap: Frama-C 25's
 * RTE emits no assertion for a float -> unsigned cast, so the range of moe_f32_to_f16's
 * (uint16_t)(rounded - 0x1p23f) (0 .. 1024, argued in its comment) is not proved (specs/README.md). */
/*@ terminates \true;
    assigns \nothing;
    ensures size: dtype_ok(dtype) ==> \result == byte_offset(1, dtype);
    ensures fp8: fp8_dtype(dtype) ==> \result == 1;
    ensures unknown: !dtype_ok(dtype) && !fp8_dtype(dtype) ==> \result == 0; */
size_t moe_dtype_size(moe_dtype dtype);
/*@ terminates \true;
    assigns \result \from dtype;
    ensures name: \valid_read(\result); */
const char *moe_dtype_name(moe_dtype dtype);
/*@ requires name: name == \null || valid_read_string(name);
    requires dtype: dtype == \null || \valid(dtype);
    terminates \true;
    assigns *dtype, moe_error_model;
    ensures status: \result == MOE_OK || \result == MOE_ERR_NULL_POINTER || \result == MOE_ERR_INVALID_DTYPE;
    ensures known: \result == MOE_OK ==> dtype_ok(*dtype) || fp8_dtype(*dtype);
    ensures unchanged: \result != MOE_OK && dtype != \null ==> *dtype == \old(*dtype); */
moe_status moe_dtype_from_name(const char *name, moe_dtype *dtype);
/*@ terminates \true;
    assigns \nothing;
    ensures f32: dtype == MOE_F32 ==> \result == 0x1p-24;
    ensures f16: dtype == MOE_F16 ==> \result == 0x1p-11;
    ensures bf16: dtype == MOE_BF16 ==> \result == 0x1p-8;
    ensures e4m3: dtype == MOE_E4M3 ==> \result == 0x1p-4;
    ensures e5m2: dtype == MOE_E5M2 ==> \result == 0x1p-3;
    ensures unknown: !dtype_ok(dtype) && !fp8_dtype(dtype) ==> \result == 0.0; */
double moe_dtype_unit_roundoff(moe_dtype dtype);
/*@ terminates \true;
    assigns \nothing; */
uint16_t moe_f32_to_bf16(float value);
/*@ terminates \true;
    assigns \nothing; */
float moe_bf16_to_f32(uint16_t bits);
/*@ terminates \true;
    assigns \nothing; */
uint16_t moe_f32_to_f16(float value);
/*@ terminates \true;
    assigns \nothing; */
float moe_f16_to_f32(uint16_t bits);
/*@ terminates \true;
    assigns \nothing; */
uint8_t moe_f32_to_e4m3(float value);
/*@ terminates \true;
    assigns \nothing; */
float moe_e4m3_to_f32(uint8_t bits);
/*@ terminates \true;
    assigns \nothing; */
uint8_t moe_f32_to_e5m2(float value);
/*@ terminates \true;
    assigns \nothing; */
float moe_e5m2_to_f32(uint8_t bits);
#endif

/* Value clauses: MOE_REF_VALUE_CLAUSE(ensures value...: ...;) in a contract is that clause in the files
 * that prove float values (they define MOE_REF_VALUES before including this header:
 * ref/gemm_naive_value.c, ref/gemm_naive_dot.c), and nothing elsewhere: a float clause among a goal's hypotheses brings binary32
 * into it, which CVC4 1.8 cannot read, and the other files' index goals need CVC4.  moe_ref_load's and
 * moe_ref_store's below are trusted as the rest of their contracts (specs/gemm_value.acsl: the load
 * returns loaded(dtype, base, i); the element then loads as stored(dtype, value)). */
#if defined(__FRAMAC__) && defined(MOE_REF_VALUES)
#define MOE_REF_VALUE_CLAUSE(...) __VA_ARGS__
#else
#define MOE_REF_VALUE_CLAUSE(...)
#endif
/* Bound clauses: MOE_REF_BOUND_CLAUSE(ensures bound...: ...;) is that clause only in the file that proves it
 * (it defines MOE_REF_BOUNDS too: ref/gemm_naive_dot.c, the forward's, dX's and dW's dots, the elements); its callers' goals go without it. */
#if defined(__FRAMAC__) && defined(MOE_REF_VALUES) && defined(MOE_REF_BOUNDS)
#define MOE_REF_BOUND_CLAUSE(...) __VA_ARGS__
#else
#define MOE_REF_BOUND_CLAUSE(...)
#endif

/* Reads element i of a tensor of the given dtype as float (exact).
 * Contract trusted, not proved: WP's typed memory model cannot follow the void * -> float * / uint16_t *
 * casts of the body; callers prove the element's bytes valid (specs/gemm.acsl).  Its result is named
 * loaded(dtype, base, i) (its value clause), the value the proved float values speak of. */
/*@ requires dtype: dtype_ok(dtype);
    requires element: element_readable((char *)base, i, dtype);
    terminates \true;
    assigns \nothing;
    MOE_REF_VALUE_CLAUSE(ensures value: same_float(\result, loaded(dtype, (char *)base, i));) */
static inline float moe_ref_load(moe_dtype dtype, const void *base, int64_t i)
{
    switch (dtype) {
    case MOE_F16: return moe_f16_to_f32(((const uint16_t *)base)[i]);
    case MOE_BF16: return moe_bf16_to_f32(((const uint16_t *)base)[i]);
    case MOE_E4M3: return moe_e4m3_to_f32(((const uint8_t *)base)[i]);
    case MOE_E5M2: return moe_e5m2_to_f32(((const uint8_t *)base)[i]);
    case MOE_F32: break;
    }
    return ((const float *)base)[i];
}

/* Writes element i of a tensor of the given dtype, rounding to nearest even.
 * Contract trusted, not proved (as moe_ref_load): it writes exactly the bytes of element i, and
 * moe_ref_load then reads stored(dtype, value) there (its value clause; value itself for f32). */
/*@ requires dtype: dtype_ok(dtype);
    requires element: element_writable((char *)base, i, dtype);
    terminates \true;
    assigns ((char *)base)[byte_offset(i, dtype) .. byte_offset(i + 1, dtype) - 1];
    MOE_REF_VALUE_CLAUSE(ensures value: same_float(loaded(dtype, (char *)base, i), stored(dtype, value));) */
static inline void moe_ref_store(moe_dtype dtype, void *base, int64_t i, float value)
{
    switch (dtype) {
    case MOE_F16: ((uint16_t *)base)[i] = moe_f32_to_f16(value); return;
    case MOE_BF16: ((uint16_t *)base)[i] = moe_f32_to_bf16(value); return;
    case MOE_E4M3: ((uint8_t *)base)[i] = moe_f32_to_e4m3(value); return;
    case MOE_E5M2: ((uint8_t *)base)[i] = moe_f32_to_e5m2(value); return;
    case MOE_F32: break;
    }
    ((float *)base)[i] = value;
}

/* Converts count elements starting at element `first` of a tensor to float.   out [count]
 * Proved by WP (in src/dtype.c's run) against moe_ref_load's trusted contract. */
/*@ requires dtype: dtype_ok(dtype);
    requires count: 0 <= first && 0 <= count && first + count <= INT64_MAX;
    requires elements: elements_readable((char *)base, first, count, dtype);
    requires out: \valid(out + (0 .. count - 1));
    requires separated: \separated(out + (0 .. count - 1),
      (char *)base + (byte_offset(first, dtype) .. byte_offset(first + count, dtype) - 1));
    terminates \true;
    assigns out[0 .. count - 1]; */
static inline void moe_ref_load_row(moe_dtype dtype, const void *base, int64_t first, int64_t count,
                                    float *out)
{
    /*@ loop invariant bounds: 0 <= i <= count;
        loop assigns i, out[0 .. count - 1];
        loop variant count - i; */
    for (int64_t i = 0; i < count; i++)
        out[i] = moe_ref_load(dtype, base, first + i);
}

/* ---- routing helpers (ref/routing.c) ---- */

/* Checks routing contents on the host: m_sizes[e] >= 0, sum == rows, and, when need_gather, that
 * gather_indices is a permutation of [0, rows).  `op` prefixes the message.
 * The allocating shell (ref/alloc_shells.c: callocs the scratch of moe_ref_check_routing_in, calls it,
 * frees it).  Contract stated, not proved (WP 25 has no model of calloc/free); it is the contract of
 * moe_ref_check_routing_in below, which WP proves, for a scratch that is NULL or fresh and zeroed. */
/*@ requires experts: num_experts >= 1;
    requires rows: rows >= 0;
    requires m_sizes: \valid_read(m_sizes + (0 .. num_experts - 1));
    requires gather: need_gather != 0 && rows > 0 ==> \valid_read(gather_indices + (0 .. rows - 1));
    terminates \true;
    assigns moe_error_model;
    ensures accepts_only_wellformed: \result == MOE_OK ==>
              routing_ok(m_sizes, num_experts, rows, gather_indices, need_gather);
    ensures accepts_wellformed: routing_ok(m_sizes, num_experts, rows, gather_indices, need_gather) ==>
              \result == MOE_OK || \result == MOE_ERR_OUT_OF_MEMORY; */
moe_status moe_ref_check_routing(const char *op, int64_t num_experts, int64_t rows, const int64_t *m_sizes,
                                 const int64_t *gather_indices, int need_gather);

/* moe_ref_check_routing on caller-provided scratch (proved):
 *   seen  [rows] bytes, zeroed (calloc), separated from m_sizes and gather_indices; or NULL: the caller
 *         could not allocate it, and the call fails with MOE_ERR_OUT_OF_MEMORY at the point where the
 *         permutation check needs it (after the m_sizes check; never when !need_gather or rows == 0). */
/*@ requires experts: num_experts >= 1;
    requires rows: rows >= 0;
    requires m_sizes: \valid_read(m_sizes + (0 .. num_experts - 1));
    requires gather: need_gather != 0 && rows > 0 ==> \valid_read(gather_indices + (0 .. rows - 1));
    requires seen: seen != \null && need_gather != 0 && rows > 0 ==>
      \valid(seen + (0 .. rows - 1)) && (\forall integer i; 0 <= i < rows ==> seen[i] == 0) &&
      \separated(seen + (0 .. rows - 1), gather_indices + (0 .. rows - 1), m_sizes + (0 .. num_experts - 1));
    terminates \true;
    assigns seen[0 .. rows - 1], moe_error_model;
    ensures accepts_only_wellformed: \result == MOE_OK ==>
              routing_ok(m_sizes, num_experts, rows, gather_indices, need_gather);
    ensures accepts_wellformed: routing_ok(m_sizes, num_experts, rows, gather_indices, need_gather) ==>
              \result == MOE_OK || (\result == MOE_ERR_OUT_OF_MEMORY && seen == \null);
    ensures out_of_memory: \result == MOE_ERR_OUT_OF_MEMORY ==> seen == \null && need_gather != 0 && rows > 0; */
moe_status moe_ref_check_routing_in(const char *op, int64_t num_experts, int64_t rows, const int64_t *m_sizes,
                                    const int64_t *gather_indices, int need_gather, unsigned char *seen);

/* Checks the dimensions of a routing: num_tokens >= 0, topk >= 1 (0 only with no tokens), num_experts >= 1,
 * and num_tokens * topk fits (as a count of int64 entries in a size_t); sets *rows = num_tokens * topk.
 * MOE_ERR_INVALID_SHAPE or MOE_ERR_OVERFLOW with a message prefixed by `op` otherwise.  Shared by
 * moe_ref_routing_from_topk (ref/alloc_shells.c), moe_routing_validate and moe_routing_build (src/routing_api.c). */
/*@ requires rows_valid: \valid(rows);
    terminates \true;
    assigns *rows, moe_error_model;
    ensures accepts_exactly_valid_dims: \result == MOE_OK <==> routing_dims_ok(num_tokens, topk, num_experts);
    ensures rows: \result == MOE_OK ==> *rows == num_tokens * topk; */
moe_status moe_ref_check_routing_dims(const char *op, int64_t num_tokens, int64_t topk, int64_t num_experts,
                                      int64_t *rows);

/* The checks of moe_routing_from_topk before its sort, in its order and with its messages: the dimensions
 * (moe_ref_check_routing_dims; *rows = T * k), m_sizes not NULL, topk_ids and gather_indices not NULL when
 * T * k > 0, E + 1 counters representable, and every id an expert in [0, E). */
/*@ requires rows_valid: \valid(rows);
    requires ids: num_tokens >= 0 && topk >= 0 && num_tokens * topk <= SIZE_MAX / 8 && topk_ids != \null ==>
      \valid_read(topk_ids + (0 .. num_tokens * topk - 1)) &&
      \separated(rows, topk_ids + (0 .. num_tokens * topk - 1));
    terminates \true;
    assigns *rows, moe_error_model;
    ensures accepts_exactly_valid: \result == MOE_OK <==>
      (routing_dims_ok(num_tokens, topk, num_experts) && m_sizes != \null &&
       (num_tokens * topk > 0 ==> topk_ids != \null && gather_indices != \null) && num_experts < SIZE_MAX / 8 &&
       in_range(topk_ids, num_tokens * topk, 0, num_experts));
    ensures rows: \result == MOE_OK ==> *rows == num_tokens * topk; */
moe_status moe_ref_routing_from_topk_check(const char *op, int64_t num_tokens, int64_t topk, int64_t num_experts,
                                          const int64_t *topk_ids, const int64_t *m_sizes,
                                          const int64_t *gather_indices, int64_t *rows);

/* The arrays of moe_routing_from_topk / moe_routing_build (host or device pointers, not read): topk_ids
 * [rows], m_sizes [num_experts], gather_indices [rows], scatter_indices [rows] or NULL, through
 * moe_check_arrays (NULL with elements, alignment, no output overlapping another array).  rows and
 * num_experts come from moe_ref_check_routing_dims.  Contract not stated: moe_check_arrays has none
 * (ref/alloc_shells.c, not proved). */
moe_status moe_ref_routing_arrays_check(const char *op, int64_t rows, int64_t num_experts, const int64_t *topk_ids,
                                        const int64_t *m_sizes, const int64_t *gather_indices,
                                        const int64_t *scatter_indices);

/* moe_routing_from_topk's host build (ref/alloc_shells.c), messages prefixed by op: the dimensions, the arrays
 * (moe_ref_routing_arrays_check), moe_ref_routing_from_topk_check, then moe_ref_counting_sort on a calloc'd
 * cursor array.  Not proved (it allocates); every step it calls is. */
moe_status moe_ref_routing_from_topk(const char *op, int64_t num_tokens, int64_t topk, int64_t num_experts,
                                     const int64_t *topk_ids, int64_t *m_sizes, int64_t *gather_indices,
                                     int64_t *scatter_indices);

/* The counting sort of moe_routing_from_topk (ref/alloc_shells.c), on arguments checked by
 * moe_ref_routing_from_topk_check; next is the scratch the shell callocs.
 *   topk_ids        [rows]   expert of each slot, in [0, E)
 *   m_sizes         [E]      out: slots per expert
 *   gather_indices  [rows]   out: slots sorted by expert, stably: a permutation of [0, rows) whose bucket
 *                            msum(m_sizes, e) .. + m_sizes[e] - 1 holds expert e's slots, ascending (proved:
 *                            `grouped`, `stable`, `permutation`)
 *   scatter_indices [rows]   out, may be NULL: the inverse of gather_indices (proved: `inverse`)
 *   next            [E + 1]  scratch (any contents): the next free row of each expert */
/*@ requires dims: 0 <= rows && 1 <= num_experts && rows <= INT64_MAX / 2 && num_experts <= INT64_MAX / 2;
    requires ids: \valid_read(topk_ids + (0 .. rows - 1)) && in_range(topk_ids, rows, 0, num_experts);
    requires m_sizes: \valid(m_sizes + (0 .. num_experts - 1));
    requires gather: \valid(gather_indices + (0 .. rows - 1));
    requires scatter: scatter_indices == \null || \valid(scatter_indices + (0 .. rows - 1));
    requires next: \valid(next + (0 .. num_experts));
    requires separated: \separated(topk_ids + (0 .. rows - 1), m_sizes + (0 .. num_experts - 1),
                                   gather_indices + (0 .. rows - 1), next + (0 .. num_experts));
    requires separated_scatter: scatter_indices != \null ==> \separated(scatter_indices + (0 .. rows - 1),
                                   topk_ids + (0 .. rows - 1), m_sizes + (0 .. num_experts - 1),
                                   gather_indices + (0 .. rows - 1), next + (0 .. num_experts));
    terminates \true;
    assigns m_sizes[0 .. num_experts - 1], gather_indices[0 .. rows - 1], next[0 .. num_experts];
    assigns scatter_indices[0 .. rows - 1];
    ensures counts: \forall integer e; 0 <= e < num_experts ==> m_sizes[e] == count_eq(topk_ids, rows, e);
    ensures sizes_ok: sizes_ok(m_sizes, num_experts, rows);
    ensures gather_range: \old(in_range(gather_indices, rows, 0, rows)) ==> in_range(gather_indices, rows, 0, rows);
    ensures grouped: \forall integer e, q; 0 <= e < num_experts && msum(m_sizes, e) <= q < msum(m_sizes, e) + m_sizes[e] ==>
      0 <= gather_indices[q] < rows && topk_ids[gather_indices[q]] == e;
    ensures stable: \forall integer e, q; 0 <= e < num_experts && msum(m_sizes, e) <= q && q + 1 < msum(m_sizes, e) + m_sizes[e] ==>
      gather_indices[q] < gather_indices[q + 1];
    ensures permutation: is_permutation(gather_indices, rows);
    ensures value_routing_ok: routing_ok(m_sizes, num_experts, rows, gather_indices, 1);
    ensures inverse: scatter_indices != \null ==> \forall integer j; 0 <= j < rows ==>
      0 <= scatter_indices[j] < rows && gather_indices[scatter_indices[j]] == j; */
void moe_ref_counting_sort(int64_t rows, int64_t num_experts, const int64_t *topk_ids, int64_t *m_sizes,
                           int64_t *gather_indices, int64_t *scatter_indices, int64_t *next);

/* offsets[E+1]: offsets[e] = sum_{j<e} m_sizes[j].  The caller guarantees a validated routing. */
/*@ requires experts: 0 <= num_experts < INT64_MAX;
    requires m_sizes: \valid_read(m_sizes + (0 .. num_experts - 1));
    requires offsets: \valid(offsets + (0 .. num_experts));
    requires separated: \separated(m_sizes + (0 .. num_experts - 1), offsets + (0 .. num_experts));
    requires validated: sizes_nonneg(m_sizes, num_experts) && msum(m_sizes, num_experts) <= INT64_MAX;
    terminates \true;
    assigns offsets[0 .. num_experts] \from m_sizes[0 .. num_experts - 1];
    ensures prefix_sums: \forall integer e; 0 <= e <= num_experts ==> offsets[e] == \old(msum(m_sizes, e));
    ensures sorted: sorted_offsets(offsets, num_experts); */
void moe_ref_expert_offsets(int64_t num_experts, const int64_t *m_sizes, int64_t *offsets);

/* The expert owning expert-order row r (offsets[e] <= r < offsets[e+1]; empty experts skipped). */
/*@ requires experts: num_experts >= 1;
    requires offsets: \valid_read(offsets + (0 .. num_experts));
    requires sorted: sorted_offsets(offsets, num_experts);
    requires row: offsets[0] <= row < offsets[num_experts];
    terminates \true;
    assigns \nothing;
    ensures expert: 0 <= \result < num_experts;
    ensures owns_row: offsets[\result] <= row < offsets[\result + 1]; */
int64_t moe_ref_expert_of_row(int64_t num_experts, const int64_t *offsets, int64_t row);

/* ---- the grouped GEMM, naive twin (ref/gemm_naive.c) ---- */
/* The preconditions are what the front end (src/gemm_api.c) checks.  This function is the allocating shell
 * (ref/alloc_shells.c, not proved: WP 25 has no model of allocation) of moe_ref_gemm_fwd_naive_in below,
 * which WP proves (every index in bounds, no overflow, writes only the offsets and y).
 * The float postcondition below (behaviour `f32`: fp32 tensors; topk weights and accumulate included) is
 * not proved by WP: tests/contract_check.c mirrors it clause by clause (moe_ref_check_gemm_fwd_post) and
 * tests/test_contracts checks it at run time, for every dtype (inputs read through moe_ref_load, u_out and
 * eta_out of the output dtype). */
/*@ requires problem: gemm_problem_ok(p);
    requires routing: \valid_read(p->m_sizes + (0 .. p->num_experts - 1)) &&
      sizes_ok(p->m_sizes, p->num_experts, p->rows);
    requires tensors: gemm_fwd_tensors_ok(p, (char *)x, (char *)w, (char *)topk_weights, (char *)y);
    behavior f32:
      assumes f32: p->dtype == MOE_F32;
      ensures fwd_within_bound: \forall integer r, n, e; 0 <= r < p->rows && 0 <= n < p->N &&
        0 <= e < p->num_experts && msum(p->m_sizes, e) <= r < msum(p->m_sizes, e + 1) ==>
        within_update_bound(p, (real)((float *)y)[gemm_y_row(p, r) * p->N + n],
          \old((real)((float *)y)[gemm_y_row(p, r) * p->N + n]),
          fwd_sum(p, (float *)x, (float *)w, (float *)topk_weights, r, e, n),
          fwd_sum_abs(p, (float *)x, (float *)w, (float *)topk_weights, r, e, n),
          p->K + gemm_weight_roundings((float *)topk_weights), unit_f32, eta_f32); */
moe_status moe_ref_gemm_fwd_naive(const moe_gemm_problem *p, const void *x, const void *w,
                                  const void *topk_weights, void *y);

/* The backward kernels: preconditions as the forward's (what src/gemm_api.c checks: dx_tensors,
 * dw_tensors, topk_grad_tensors).  As for the forward, these are the allocating shells (ref/alloc_shells.c)
 * of the `_in` functions below, which WP proves (moe_ref_expert_offsets, gemm_dx_rows, gemm_dx_reduce_rows,
 * invert_gather, gemm_dw_rows, gemm_topk_grad_rows and the dot helpers in ref/gemm_naive.c: every index in
 * bounds, no overflow, writes only the scratch and the output).  Their float postconditions (behaviours `*_f32`: fp32 tensors; topk weights and
 * accumulate included, each one more rounding) are not proved by WP either: tests/contract_check.c
 * mirrors them clause by clause (moe_ref_check_gemm_dx_post, moe_ref_check_gemm_dw_post,
 * moe_ref_check_gemm_topk_grad_post) and tests/test_contracts checks them at run time for every dtype.
 * The roundings per term (the n of gamma_k(n)) are derived in specs/gemm.acsl. */
/*@ requires problem: gemm_problem_ok(p);
    requires routing: \valid_read(p->m_sizes + (0 .. p->num_experts - 1)) &&
      sizes_ok(p->m_sizes, p->num_experts, p->rows);
    requires gather: p->reduce_topk != 0 && p->gather_indices != \null ==>
      is_permutation(p->gather_indices, p->rows);
    requires tensors: gemm_dx_tensors_ok(p, (char *)dy, (char *)w, (char *)topk_weights, (char *)dx);
    behavior per_row_f32:
      assumes per_row: p->dtype == MOE_F32 && p->reduce_topk == 0;
      ensures dx_within_bound: \forall integer r, c, e; 0 <= r < p->rows && 0 <= c < p->K &&
        0 <= e < p->num_experts && msum(p->m_sizes, e) <= r < msum(p->m_sizes, e + 1) ==>
        within_update_bound(p, (real)((float *)dx)[gemm_dx_row(p, r) * p->K + c],
          \old((real)((float *)dx)[gemm_dx_row(p, r) * p->K + c]),
          dx_sum(p, (float *)dy, (float *)w, (float *)topk_weights, r, e, c),
          dx_sum_abs(p, (float *)dy, (float *)w, (float *)topk_weights, r, e, c),
          p->N + gemm_weight_roundings((float *)topk_weights), unit_f32, eta_f32);
    behavior reduce_f32:
      assumes reduce: p->dtype == MOE_F32 && p->reduce_topk != 0;
      ensures dx_reduce_within_bound: \forall integer t, c; 0 <= t < p->num_tokens && 0 <= c < p->K ==>
        within_update_bound(p, (real)((float *)dx)[t * p->K + c], \old((real)((float *)dx)[t * p->K + c]),
          dx_reduce_sum(p, (float *)dy, (float *)w, (float *)topk_weights, t, c, p->topk),
          dx_reduce_sum_abs(p, (float *)dy, (float *)w, (float *)topk_weights, t, c, p->topk),
          p->N + gemm_weight_roundings((float *)topk_weights) + p->topk - 1, unit_f32, eta_f32); */
moe_status moe_ref_gemm_dx_naive(const moe_gemm_problem *p, const void *dy, const void *w,
                                 const void *topk_weights, void *dx);
/*@ requires problem: gemm_problem_ok(p);
    requires routing: \valid_read(p->m_sizes + (0 .. p->num_experts - 1)) &&
      sizes_ok(p->m_sizes, p->num_experts, p->rows);
    requires tensors: gemm_dw_tensors_ok(p, (char *)x, (char *)dy, (char *)topk_weights, (char *)dw);
    behavior f32:
      assumes f32: p->dtype == MOE_F32 && p->dw_dtype == MOE_F32;
      ensures dw_within_bound: \forall integer e, n, c; 0 <= e < p->num_experts && 0 <= n < p->N &&
        0 <= c < p->K ==>
        within_update_bound(p, (real)((float *)dw)[(e * p->N + n) * p->K + c],
          \old((real)((float *)dw)[(e * p->N + n) * p->K + c]),
          dw_sum(p, (float *)x, (float *)dy, (float *)topk_weights,
                 msum(p->m_sizes, e), msum(p->m_sizes, e + 1), n, c),
          dw_sum_abs(p, (float *)x, (float *)dy, (float *)topk_weights,
                     msum(p->m_sizes, e), msum(p->m_sizes, e + 1), n, c),
          msum(p->m_sizes, e + 1) - msum(p->m_sizes, e) + gemm_weight_roundings((float *)topk_weights),
          unit_f32, eta_f32); */
moe_status moe_ref_gemm_dw_naive(const moe_gemm_problem *p, const void *x, const void *dy,
                                 const void *topk_weights, void *dw);
/*@ requires problem: gemm_problem_ok(p);
    requires routing: \valid_read(p->m_sizes + (0 .. p->num_experts - 1)) &&
      sizes_ok(p->m_sizes, p->num_experts, p->rows);
    requires tensors: gemm_topk_grad_tensors_ok(p, (char *)x, (char *)w, (char *)dy, (char *)d_topk_weights);
    behavior f32:
      assumes f32: p->dtype == MOE_F32 && p->dw_dtype == MOE_F32;
      ensures topk_grad_within_bound: \forall integer r, e; 0 <= r < p->rows && 0 <= e < p->num_experts &&
        msum(p->m_sizes, e) <= r < msum(p->m_sizes, e + 1) ==>
        within_update_bound(p, (real)((float *)d_topk_weights)[gemm_slot(p, r)],
          \old((real)((float *)d_topk_weights)[gemm_slot(p, r)]),
          topk_grad_sum(p, (float *)x, (float *)w, (float *)dy, r, e, p->N),
          topk_grad_sum_abs(p, (float *)x, (float *)w, (float *)dy, r, e, p->N),
          p->N + p->K, unit_f32, eta_f32); */
moe_status moe_ref_gemm_topk_weights_grad(const moe_gemm_problem *p, const void *x, const void *w,
                                          const void *dy, void *d_topk_weights);

/* The naive kernels on caller-provided scratch (ref/gemm_naive.c), proved by WP: RTE (every index in
 * bounds, no overflow), assigns (the scratch and the output's bytes only), termination; no float property
 * (the float clauses above are the shells').  The shells above allocate the scratch (ref/alloc_shells.c):
 *   offsets      [E + 1] int64, any contents (it becomes moe_ref_expert_offsets of m_sizes), or NULL:
 *                not allocated, MOE_ERR_OUT_OF_MEMORY and nothing written
 *   row_of_slot  [M] int64, dX with reduce_topk only (else not read, may be NULL): zeroed (calloc), or
 *                NULL: MOE_ERR_OUT_OF_MEMORY after the offsets are written, the output not */
/*@ requires problem: gemm_problem_ok(p);
    requires routing: \valid_read(p->m_sizes + (0 .. p->num_experts - 1)) &&
      sizes_ok(p->m_sizes, p->num_experts, p->rows);
    requires tensors: gemm_fwd_tensors_ok(p, (char *)x, (char *)w, (char *)topk_weights, (char *)y);
    requires experts: p->num_experts < INT64_MAX;
    requires offsets: offsets != \null ==>
      gemm_scratch_ok(p, offsets, p->num_experts + 1, (char *)y, byte_offset(p->rows * p->N, p->dtype));
    terminates \true;
    assigns offsets[0 .. p->num_experts], ((char *)y)[0 .. byte_offset(p->rows * p->N, p->dtype) - 1],
      moe_error_model;
    ensures status: offsets != \null ? \result == MOE_OK : \result == MOE_ERR_OUT_OF_MEMORY; */
moe_status moe_ref_gemm_fwd_naive_in(const moe_gemm_problem *p, const void *x, const void *w,
                                     const void *topk_weights, void *y, int64_t *offsets);
/*@ requires problem: gemm_problem_ok(p);
    requires routing: \valid_read(p->m_sizes + (0 .. p->num_experts - 1)) &&
      sizes_ok(p->m_sizes, p->num_experts, p->rows);
    requires tensors: gemm_dx_tensors_ok(p, (char *)dy, (char *)w, (char *)topk_weights, (char *)dx);
    requires experts: p->num_experts < INT64_MAX;
    requires offsets: offsets != \null ==>
      gemm_scratch_ok(p, offsets, p->num_experts + 1, (char *)dx, byte_offset(gemm_dx_rows(p) * p->K, p->dtype));
    requires row_of_slot: p->reduce_topk != 0 && row_of_slot != \null ==>
      gemm_scratch_ok(p, row_of_slot, p->rows, (char *)dx, byte_offset(gemm_dx_rows(p) * p->K, p->dtype)) &&
      in_range(row_of_slot, p->rows, 0, p->rows) &&
      (offsets != \null ==> \separated(row_of_slot + (0 .. p->rows - 1), offsets + (0 .. p->num_experts)));
    terminates \true;
    assigns offsets[0 .. p->num_experts], row_of_slot[0 .. p->rows - 1],
      ((char *)dx)[0 .. byte_offset(gemm_dx_rows(p) * p->K, p->dtype) - 1], moe_error_model;
    ensures status: offsets != \null && (p->reduce_topk == 0 || row_of_slot != \null) ?
      \result == MOE_OK : \result == MOE_ERR_OUT_OF_MEMORY; */
moe_status moe_ref_gemm_dx_naive_in(const moe_gemm_problem *p, const void *dy, const void *w,
                                    const void *topk_weights, void *dx, int64_t *offsets, int64_t *row_of_slot);
/*@ requires problem: gemm_problem_ok(p);
    requires routing: \valid_read(p->m_sizes + (0 .. p->num_experts - 1)) &&
      sizes_ok(p->m_sizes, p->num_experts, p->rows);
    requires tensors: gemm_dw_tensors_ok(p, (char *)x, (char *)dy, (char *)topk_weights, (char *)dw);
    requires experts: p->num_experts < INT64_MAX;
    requires offsets: offsets != \null ==>
      gemm_scratch_ok(p, offsets, p->num_experts + 1, (char *)dw,
                      byte_offset(p->num_experts * p->N * p->K, p->dw_dtype));
    terminates \true;
    assigns offsets[0 .. p->num_experts],
      ((char *)dw)[0 .. byte_offset(p->num_experts * p->N * p->K, p->dw_dtype) - 1], moe_error_model;
    ensures status: offsets != \null ? \result == MOE_OK : \result == MOE_ERR_OUT_OF_MEMORY; */
moe_status moe_ref_gemm_dw_naive_in(const moe_gemm_problem *p, const void *x, const void *dy,
                                    const void *topk_weights, void *dw, int64_t *offsets);
/*@ requires problem: gemm_problem_ok(p);
    requires routing: \valid_read(p->m_sizes + (0 .. p->num_experts - 1)) &&
      sizes_ok(p->m_sizes, p->num_experts, p->rows);
    requires tensors: gemm_topk_grad_tensors_ok(p, (char *)x, (char *)w, (char *)dy, (char *)d_topk_weights);
    requires experts: p->num_experts < INT64_MAX;
    requires offsets: offsets != \null ==>
      gemm_scratch_ok(p, offsets, p->num_experts + 1, (char *)d_topk_weights, byte_offset(p->rows, p->dw_dtype));
    terminates \true;
    assigns offsets[0 .. p->num_experts], ((char *)d_topk_weights)[0 .. byte_offset(p->rows, p->dw_dtype) - 1],
      moe_error_model;
    ensures status: offsets != \null ? \result == MOE_OK : \result == MOE_ERR_OUT_OF_MEMORY; */
moe_status moe_ref_gemm_topk_weights_grad_in(const moe_gemm_problem *p, const void *x, const void *w,
                                             const void *dy, void *d_topk_weights, int64_t *offsets);

/* ---- the grouped GEMM, blocked twin (ref/gemm/): same contract, same bits ---- */
moe_status moe_ref_gemm_fwd_blocked(const moe_gemm_problem *p, const void *x, const void *w,
                                    const void *topk_weights, void *y);
moe_status moe_ref_gemm_dx_blocked(const moe_gemm_problem *p, const void *dy, const void *w,
                                   const void *topk_weights, void *dx);
moe_status moe_ref_gemm_dw_blocked(const moe_gemm_problem *p, const void *x, const void *dy,
                                   const void *topk_weights, void *dw);
moe_status moe_ref_gemm_topk_weights_grad_blocked(const moe_gemm_problem *p, const void *x, const void *w,
                                                  const void *dy, void *d_topk_weights);

#endif /* LIBMOE_REF_H */
