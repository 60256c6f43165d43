/*
 * The blockwise MoE MLP reference (ref/mlp/, ref/mlp_layout.c) and what the front end (src/mlp_api.c)
 * hands it.  Contract as in moe_backend.h: everything is validated before a kernel runs; each output
 * element is written exactly once, by one thread, in an order that does not depend on the thread count.
 *
 * Float32 operation order of the reference (acc starts at +0.0f; every sum, "dot" included, adds its
 * terms one by one in ascending index order):
 *
 *   forward, per slot s (token t, expert e, affinity a), slots of an expert in ascending position:
 *     gu[j]   = (sum_{h ascending} x[h] * W_gu[e][h][j]) + b_gu[e][j]        j < 2I (gate: j < I)
 *     g, u    clamped (gate: non-linear limits, up: linear limits); checkpointed (one rounding)
 *     m[i]    = act(g[i]) * u[i]                 (ON_I: then * a)
 *     d[h]    = (sum_{i ascending} m[i] * W_d[e][i][h]) + b_d[e][h]          (ON_I: + a * b_d[e][h])
 *     down checkpoint = d (ON_I: recomputed from the unscaled m)
 *     c[h]    = a * d[h]                         (ON_I: d[h] itself)
 *   out[t][h] = sum of c over the token's slots in ascending position, rounded once.
 *
 *   backward, per slot s, from the rounded checkpoints g, u (and d):
 *     dA      = dot(G, d)
 *     dD      = a * G
 *     ON_H:   m = act(g) * u,            dM[i] = dot(dD, W_d[e][i][:]),  dW_d uses (m, dD)
 *     ON_I:   m = (act(g) * u) * a,      dM[i] = a * dot(G, W_d[e][i][:]), dW_d uses (m, G)
 *     dg      = ((dM * u) * act'(g)) masked,  du = (dM * act(g)) masked
 *     dW_d[e][i][h]  = sum_{slots ascending} m[i] * dD[h] (ON_I: G[h]);   db_d[e][h] = sum dD[h]
 *     dW_gu[e][h][j] = sum_{slots ascending} x[h] * dgu[j];  db_gu[e][j] = sum dgu[j]
 *     dx_s[h] = dot(dgu, W_gu[e][h][:]);  d_hidden[t] = sum of dx_s over the token's slots, ascending
 *   with accumulate, a weight/bias gradient element is old + sum.  Every output is rounded once.
 *
 *   round_intermediates (f16/bf16; specs/MLP.md "Rounded intermediates"), rnd = round to the dtype:
 *     forward: m[i] = rnd(m[i]) after the line above (ON_I: rnd of the scaled m); the ON_I down
 *              checkpoint from rnd(act(g) * u)
 *     backward: ON_I without the down checkpoint: d from rnd(act(g) * u);  after the dA/dD loop
 *              m = rnd(m) (ON_I: rnd((act(g) * u) * a)) and dD = rnd(a * G);  dg = rnd(dg), du = rnd(du)
 */
#ifndef LIBMOE_MLP_REF_H
#define LIBMOE_MLP_REF_H

#include "moe_backend.h"
#include "moe_mlp.h"

#ifdef __FRAMAC__
#include "mlp_layout.acsl" /* specs/: the ACSL logic of block layouts (Frama-C only) */
#endif

#ifdef __FRAMAC__
#include <errno.h>  /* errno, in the assigns clauses of moe_ref_mlp_fwd / moe_ref_mlp_bwd */
#include <stdlib.h> /* __fc_heap_status, Frama-C's libc model of the heap (malloc, free) */
#include "mlp_problem.acsl" /* specs/: a validated MLP call, mlp_problem_ok and the tensors (Frama-C only) */
#endif

/* Checks a layout's dimensions and pointers (not its contents) for block size B: what the front end can
 * check of a device-resident layout (MOE_BACKEND_CUDA checks the contents on the device). */
/*@ requires layout: layout == \null || \valid_read(layout);
    terminates \true;
    assigns moe_error_model;
    ensures accepts_exactly_valid_shapes: \result == MOE_OK <==> layout_shape_ok(layout, B); */
moe_status moe_ref_mlp_check_layout_shape(const char *op, const moe_mlp_layout *layout, int64_t B);

/* Checks a layout's dimensions, pointers and contents for block size B and the padding convention;
 * with `overwrite`, also that each token occupies at most one position.  `op` prefixes messages.
 * The allocating shell (ref/alloc_shells.c): the shape check, then the scratch of
 * moe_ref_mlp_check_layout_in, which does the rest.  Contract stated, not proved (WP 25 has no model of
 * allocation): moe_ref_mlp_check_layout_shape's and moe_ref_mlp_check_layout_in's, which WP proves, for
 * scratch that is NULL or fresh. */
/*@ requires layout: layout == \null || \valid_read(layout);
    requires arrays: layout_shape_ok(layout, B) ==>
      \valid_read(layout->block_to_expert + (0 .. layout->num_blocks - 1)) &&
      \valid_read(layout->token_position_to_id + (0 .. layout->num_blocks * B - 1));
    terminates \true;
    assigns moe_error_model;
    ensures accepts_only_wellformed: \result == MOE_OK ==> layout_shape_ok(layout, B) &&
      layout_ok(layout->block_to_expert, layout->token_position_to_id, layout->num_tokens, layout->num_experts,
                layout->num_blocks, B, padding == MOE_MLP_PAD_ROW ? layout->num_tokens : -1, overwrite);
    ensures accepts_wellformed: layout_shape_ok(layout, B) &&
      layout_ok(layout->block_to_expert, layout->token_position_to_id, layout->num_tokens, layout->num_experts,
                layout->num_blocks, B, padding == MOE_MLP_PAD_ROW ? layout->num_tokens : -1, overwrite) ==>
      \result == MOE_OK || \result == MOE_ERR_OUT_OF_MEMORY; */
moe_status moe_ref_mlp_check_layout(const char *op, const moe_mlp_layout *layout, int64_t B,
                                    moe_mlp_padding padding, int overwrite);

/* moe_ref_mlp_check_layout after its shape check, on caller-provided scratch (ref/mlp_layout.c, proved:
 * RTE, assigns, termination, `entries`, `accepts_wellformed` and `rejects_malformed`): the entries (every block's
 * expert in [0, E), every position a token in [0, T) or the padding mark), each (token, expert) pair at
 * most once, and with `overwrite` each token at most once.  Scratch, any contents, in allocations of its
 * own (`layout_scratch_ok`), all given or MOE_ERR_OUT_OF_MEMORY after the entries check:
 *   counts [E], start [E + 1], order [N], seen_expert [T], seen_pos [T] */
/*@ requires layout: \valid_read(layout) && layout_shape_ok(layout, B);
    requires arrays: \valid_read(layout->block_to_expert + (0 .. layout->num_blocks - 1)) &&
      \valid_read(layout->token_position_to_id + (0 .. layout->num_blocks * B - 1));
    requires scratch: counts != \null && start != \null && order != \null && seen_expert != \null &&
      seen_pos != \null ==> layout_scratch_ok(layout, B, counts, start, order, seen_expert, seen_pos);
    terminates \true;
    assigns counts[0 .. layout->num_experts - 1], start[0 .. layout->num_experts],
      order[0 .. layout->num_blocks - 1], seen_expert[0 .. layout->num_tokens - 1],
      seen_pos[0 .. layout->num_tokens - 1], moe_error_model;
    ensures entries: \result == MOE_OK ==>
      layout_entries_ok(layout->block_to_expert, layout->token_position_to_id, layout->num_tokens,
                        layout->num_experts, layout->num_blocks, B,
                        padding == MOE_MLP_PAD_ROW ? layout->num_tokens : -1);
    ensures accepts_wellformed: \result == MOE_OK ==>
      layout_ok(layout->block_to_expert, layout->token_position_to_id, layout->num_tokens, layout->num_experts,
                layout->num_blocks, B, padding == MOE_MLP_PAD_ROW ? layout->num_tokens : -1, overwrite);
    ensures rejects_malformed: \result != MOE_OK && counts != \null && start != \null && order != \null &&
      seen_expert != \null && seen_pos != \null ==>
      !layout_ok(layout->block_to_expert, layout->token_position_to_id, layout->num_tokens, layout->num_experts,
                 layout->num_blocks, B, padding == MOE_MLP_PAD_ROW ? layout->num_tokens : -1, overwrite);
    ensures out_of_memory: \result == MOE_ERR_OUT_OF_MEMORY ==> counts == \null || start == \null ||
      order == \null || seen_expert == \null || seen_pos == \null; */
moe_status moe_ref_mlp_check_layout_in(const char *op, const moe_mlp_layout *layout, int64_t B,
                                       moe_mlp_padding padding, int overwrite, int64_t *counts, int64_t *start,
                                       int64_t *order, int64_t *seen_expert, int64_t *seen_pos);

/* The builders behind moe_mlp_layout_num_blocks / moe_mlp_layout_build (arguments checked there). */
/* The dimensions of topk_ids[T][k] for E experts (T >= 0, 1 <= k <= E when T > 0, no overflow of T*k
 * and T*E); what can be checked of device-resident ids. */
/*@ terminates \true;
    assigns moe_error_model;
    ensures accepts_exactly_valid_shapes: \result == MOE_OK <==> topk_shape_ok(T, k, E); */
moe_status moe_ref_mlp_check_topk_shape(const char *op, int64_t T, int64_t k, int64_t E);

/* The allocating shells (ref/alloc_shells.c).  Each checks what the size of its scratch depends on (the
 * shapes), allocates the scratch, calls the proved function below with it (NULL when the allocation failed)
 * and frees it.  Contracts stated, not proved (WP 25 has no model of allocation): those of the proved
 * functions below for scratch that is NULL or fresh. */
/*@ requires ids: topk_shape_ok(T, k, E) && topk_ids != \null ==> \valid_read(topk_ids + (0 .. T * k - 1));
    terminates \true;
    assigns moe_error_model;
    ensures accepts_only_wellformed: \result == MOE_OK ==>
      topk_shape_ok(T, k, E) && (T * k == 0 || topk_ids != \null) && topk_ok(topk_ids, T, k, E);
    ensures accepts_wellformed: topk_shape_ok(T, k, E) && (T * k == 0 || topk_ids != \null) &&
      topk_ok(topk_ids, T, k, E) ==> \result == MOE_OK || \result == MOE_ERR_OUT_OF_MEMORY; */
moe_status moe_ref_mlp_check_topk(const char *op, int64_t T, int64_t k, int64_t E, const int64_t *topk_ids);
/*@ requires dims: topk_shape_ok(T, k, E) && 1 <= B;
    requires ids: \valid_read(topk_ids + (0 .. T * k - 1)) && in_range(topk_ids, T * k, 0, E);
    terminates \true;
    assigns \nothing;
    ensures dropping: kind == MOE_MLP_DROPPING ==> \result == E;
    ensures dropless: kind != MOE_MLP_DROPPING ==>
      \result == -1 || (\result == topk_blocks(topk_ids, T * k, E, B) && 0 <= \result <= T * k); */
int64_t moe_ref_mlp_count_blocks(moe_mlp_layout_kind kind, int64_t T, int64_t k, int64_t E, int64_t B,
                                 const int64_t *topk_ids);
/*@ requires args: build_layout_args_ok(kind, T, k, E, B, dtype, topk_ids, (char *)topk_weights, N, block_to_expert,
      token_position_to_id, (char *)affinities, num_dropped);
    requires topk: topk_ok(topk_ids, T, k, E);
    terminates \true;
    assigns block_to_expert[0 .. N - 1], token_position_to_id[0 .. N * B - 1],
      ((char *)affinities)[0 .. byte_offset(T * E, dtype) - 1], *num_dropped, moe_error_model;
    ensures status: \result == MOE_OK || \result == MOE_ERR_OUT_OF_MEMORY;
    ensures value_layout_ok: \result == MOE_OK ==> layout_ok(block_to_expert, token_position_to_id, T, E, N, B,
      padding == MOE_MLP_PAD_ROW ? T : -1, 0); */
moe_status moe_ref_mlp_build_layout(const char *op, moe_mlp_layout_kind kind, int64_t T, int64_t k,
                                    int64_t E, int64_t B, moe_mlp_padding padding, moe_dtype dtype,
                                    const int64_t *topk_ids, const void *topk_weights, int64_t N,
                                    int64_t *block_to_expert, int64_t *token_position_to_id, void *affinities,
                                    int64_t *num_dropped);

/* moe_ref_mlp_check_topk after its shape check, on caller-provided scratch (ref/mlp_layout.c, proved):
 * topk_ids not NULL when it has entries, then every id an expert in [0, E), distinct within a token.
 *   last [E]  scratch (any contents), or NULL: not allocated, MOE_ERR_OUT_OF_MEMORY after the NULL check */
/*@ requires shape: topk_shape_ok(T, k, E);
    requires ids: topk_ids != \null ==> \valid_read(topk_ids + (0 .. T * k - 1));
    requires last: last != \null ==> \valid(last + (0 .. E - 1)) &&
      \separated(last + (0 .. E - 1), topk_ids + (0 .. T * k - 1));
    terminates \true;
    assigns last[0 .. E - 1], moe_error_model;
    ensures accepts_exactly_wellformed: \result == MOE_OK <==>
      last != \null && (T * k == 0 || topk_ids != \null) && \old(topk_ok(topk_ids, T, k, E));
    ensures out_of_memory: \result == MOE_ERR_OUT_OF_MEMORY ==> last == \null; */
moe_status moe_ref_mlp_check_topk_in(const char *op, int64_t T, int64_t k, int64_t E, const int64_t *topk_ids,
                                     int64_t *last);

/* moe_ref_mlp_count_blocks on caller-provided scratch (ref/mlp_layout.c, proved): E for MOE_MLP_DROPPING,
 * else the blocks of the dropless layout, topk_blocks = sum_e ceil(count_e / B).
 *   m [E]  scratch (any contents; the counts per expert), or NULL: not allocated, -1 (dropless only) */
/*@ requires dims: 0 <= T && 0 <= k && 1 <= E && 1 <= B && T * k <= INT64_MAX;
    requires ids: \valid_read(topk_ids + (0 .. T * k - 1)) && in_range(topk_ids, T * k, 0, E);
    requires m: m != \null ==> \valid(m + (0 .. E - 1)) && \separated(m + (0 .. E - 1), topk_ids + (0 .. T * k - 1));
    terminates \true;
    assigns m[0 .. E - 1];
    ensures dropping: kind == MOE_MLP_DROPPING ==> \result == E;
    ensures no_memory: kind != MOE_MLP_DROPPING && m == \null ==> \result == -1;
    ensures dropless: kind != MOE_MLP_DROPPING && m != \null ==>
      \result == topk_blocks(topk_ids, T * k, E, B) && 0 <= \result <= T * k; */
int64_t moe_ref_mlp_count_blocks_in(moe_mlp_layout_kind kind, int64_t T, int64_t k, int64_t E, int64_t B,
                                    const int64_t *topk_ids, int64_t *m);

/* moe_ref_mlp_build_layout on caller-provided scratch (ref/mlp_layout.c, proved: RTE, every store inside the
 * layout's arrays and the affinities, assigns, termination, and value_layout_ok: the layout passes the layout
 * rules, layout_ok without overwrite, what moe_ref_mlp_check_layout_in accepts): the counts, the blocks
 * (assign_blocks_*), then padding marks everywhere and the pairs placed in token order (place_tokens).
 * topk_ok: distinct experts per token (the front end checks it before the build: moe_ref_mlp_check_topk).
 *   m [E], cursor [E]  scratch (any contents), or NULL: not allocated, MOE_ERR_OUT_OF_MEMORY, nothing written
 *   N                  the block count: E for MOE_MLP_DROPPING, else topk_blocks (moe_ref_mlp_count_blocks) */
/*@ requires args: build_layout_args_ok(kind, T, k, E, B, dtype, topk_ids, (char *)topk_weights, N, block_to_expert,
      token_position_to_id, (char *)affinities, num_dropped);
    requires scratch: m != \null && cursor != \null ==> \valid(m + (0 .. E - 1)) && \valid(cursor + (0 .. E - 1)) &&
      \separated(m + (0 .. E - 1), cursor + (0 .. E - 1), topk_ids + (0 .. T * k - 1),
                 block_to_expert + (0 .. N - 1), token_position_to_id + (0 .. N * B - 1), num_dropped);
    requires topk: topk_ok(topk_ids, T, k, E);
    terminates \true;
    assigns m[0 .. E - 1], cursor[0 .. E - 1], block_to_expert[0 .. N - 1], token_position_to_id[0 .. N * B - 1],
      ((char *)affinities)[0 .. byte_offset(T * E, dtype) - 1], *num_dropped, moe_error_model;
    ensures status: m != \null && cursor != \null ? \result == MOE_OK : \result == MOE_ERR_OUT_OF_MEMORY;
    ensures value_layout_ok: \result == MOE_OK ==> layout_ok(block_to_expert, token_position_to_id, T, E, N, B,
      padding == MOE_MLP_PAD_ROW ? T : -1, 0); */
moe_status moe_ref_mlp_build_layout_in(const char *op, moe_mlp_layout_kind kind, int64_t T, int64_t k,
                                       int64_t E, int64_t B, moe_mlp_padding padding, moe_dtype dtype,
                                       const int64_t *topk_ids, const void *topk_weights, int64_t N,
                                       int64_t *block_to_expert, int64_t *token_position_to_id,
                                       void *affinities, int64_t *num_dropped, int64_t *m, int64_t *cursor);

/* The reference forward and backward (shapes in moe_mlp.h).  The preconditions are what the front end
 * (src/mlp_api.c) checks, plus mlp_outputs_apart (specs/mlp_problem.acsl: the outputs do not overlap the
 * problem or the layout's arrays, which moe_check_arrays is not given).  Contracts stated, NOT proved by
 * WP: these shells allocate (the slot index, the per-slot scratch, the per-thread arenas) and free, and
 * WP 25 has no model of allocation (\fresh, \freeable and the allocates/frees clauses are not
 * implemented); they also run OpenMP regions, which Frama-C does not see (ref/mlp/ under Frama-C is the
 * single-thread program).  WP proves what they call (ref/mlp/: the slot index's cores, the tile GEMMs,
 * store_grad, ...): the forward's and the backward's whole computation after the allocations (fwd_experts,
 * fwd_tokens, bwd_experts, bwd_tokens: every index in bounds, no overflow, assigns, termination;
 * specs/VERIFY-SUMMARY.md lists them), not their float values (specs/README.md).  The
 * float values are tested (tests/test_mlp*, proptest/ against the float64 oracle), not stated.  errno: the
 * activations call expf, erff, tanhf. */
/*@ requires problem: mlp_problem_ok(p);
    requires tensors: mlp_fwd_tensors_ok(p, (char *)hidden, (char *)affinities, (char *)w_gu, (char *)w_d,
      (char *)b_gu, (char *)b_d, (char *)out, (char *)gate_up_ckpt_T, (char *)down_ckpt);
    terminates \true;
    assigns ((char *)out)[0 .. byte_offset(p->token_rows * p->H, p->dtype) - 1],
      ((char *)gate_up_ckpt_T)[0 .. (gate_up_ckpt_T == \null ? 0 : byte_offset(p->N * (2 * p->I) * p->B, p->dtype)) - 1],
      ((char *)down_ckpt)[0 .. (down_ckpt == \null ? 0 : byte_offset(p->N * p->B * p->H, p->dtype)) - 1],
      moe_error_model, errno, __fc_heap_status;
    ensures status: \result == MOE_OK || \result == MOE_ERR_OUT_OF_MEMORY; */
moe_status moe_ref_mlp_fwd(const moe_mlp_problem *p, const void *hidden, const void *affinities,
                           const void *w_gu, const void *w_d, const void *b_gu, const void *b_d, void *out,
                           void *gate_up_ckpt_T, void *down_ckpt);
/*@ requires problem: mlp_problem_ok(p);
    requires tensors: mlp_bwd_tensors_ok(p, (char *)hidden, (char *)affinities, (char *)w_gu, (char *)w_d,
      (char *)b_d, (char *)gate_up_ckpt_T, (char *)down_ckpt, (char *)out_grad, (char *)d_hidden,
      (char *)d_affinities, (char *)d_w_gu, (char *)d_w_d, (char *)d_b_gu, (char *)d_b_d);
    terminates \true;
    assigns ((char *)d_hidden)[0 .. byte_offset(p->token_rows * p->H, p->dtype) - 1],
      ((char *)d_affinities)[0 .. byte_offset(p->T * p->E, p->dtype) - 1],
      ((char *)d_w_gu)[0 .. byte_offset(p->E * p->H * (2 * p->I), p->grad_dtype) - 1],
      ((char *)d_w_d)[0 .. byte_offset(p->E * p->I * p->H, p->grad_dtype) - 1],
      ((char *)d_b_gu)[0 .. byte_offset(p->bias != 0 ? p->E * (2 * p->I) : 0, p->grad_dtype) - 1],
      ((char *)d_b_d)[0 .. byte_offset(p->bias != 0 ? p->E * p->H : 0, p->grad_dtype) - 1],
      moe_error_model, errno, __fc_heap_status;
    ensures status: \result == MOE_OK || \result == MOE_ERR_OUT_OF_MEMORY; */
moe_status moe_ref_mlp_bwd(const moe_mlp_problem *p, const void *hidden, const void *affinities,
                           const void *w_gu, const void *w_d, const void *b_d, const void *gate_up_ckpt_T,
                           const void *down_ckpt, const void *out_grad, void *d_hidden, void *d_affinities,
                           void *d_w_gu, void *d_w_d, void *d_b_gu, void *d_b_d);

#endif /* LIBMOE_MLP_REF_H */
