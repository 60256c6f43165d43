/*
 * The blockwise MoE MLP reference (ref/mlp.c, ref/mlp_layout.c) and what the front end (src/mlp_api.c)
 * hands it.  Contract as in moe_internal.h: everything is validated before a kernel runs; each output
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

#include "moe_internal.h"
#include "moe_mlp.h"

#ifdef __FRAMAC__
#include "mlp_layout.acsl" /* specs/: the ACSL logic of block layouts (Frama-C only) */
#endif

/* A validated MLP call. */
typedef struct moe_mlp_problem {
    const char *op;
    int64_t T;                 /* tokens */
    int64_t E;                 /* experts */
    int64_t N;                 /* blocks */
    int64_t B;                 /* block size (resolved: never 0) */
    int64_t H;
    int64_t I;
    int64_t token_rows;        /* rows of hidden/out/out_grad/d_hidden: T, or T + 1 with MOE_MLP_PAD_ROW */
    const int64_t *block_to_expert;
    const int64_t *token_position_to_id;
    moe_dtype dtype;           /* every tensor but the weight/bias gradients */
    moe_dtype grad_dtype;      /* d_w_gu, d_w_d, d_b_gu, d_b_d */
    moe_mlp_activation activation;
    moe_mlp_affinity affinity;
    int bias;
    int accumulate;
    int has_lin_lo, has_lin_hi, has_nl_lo, has_nl_hi;
    float lin_lo, lin_hi, nl_lo, nl_hi;
    int overwrite;             /* options.tensor_update_overwrite (checked by the layout check) */
    int round_intermediates;   /* options.round_intermediates with a 16-bit dtype (0 for f32) */
    moe_mlp_padding padding;
    void *stream;              /* MOE_BACKEND_CUDA: the cudaStream_t */
} moe_mlp_problem;

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
    ensures accepts_exactly_valid_shapes: \result == MOE_OK <==> layout != \null &&
      layout->num_tokens >= 0 && layout->num_experts >= 1 && layout->num_blocks >= 0 && B >= 1 &&
      layout->num_blocks * B <= INT64_MAX && layout->num_tokens * layout->num_experts <= INT64_MAX &&
      layout->num_tokens < INT64_MAX && layout->num_blocks * B <= SIZE_MAX / 16 &&
      layout->num_tokens <= SIZE_MAX / 16 && layout->num_experts <= SIZE_MAX / 16 &&
      (layout->num_blocks > 0 ==> layout->block_to_expert != \null) &&
      (layout->num_blocks * B > 0 ==> layout->token_position_to_id != \null); */
moe_status moe_ref_mlp_check_layout_shape(const char *op, const moe_mlp_layout *layout, int64_t B);

/* Checks a layout's dimensions, pointers and contents for block size B and the padding convention;
 * with `overwrite`, also that each token occupies at most one position.  `op` prefixes messages. */
moe_status moe_ref_mlp_check_layout(const char *op, const moe_mlp_layout *layout, int64_t B,
                                    moe_mlp_padding padding, int overwrite);

/* The builders behind moe_mlp_layout_num_blocks / moe_mlp_layout_build (arguments checked there). */
/* The dimensions of topk_ids[T][k] for E experts (T >= 0, 1 <= k <= E when T > 0, no overflow of T*k
 * and T*E); what can be checked of device-resident ids. */
moe_status moe_ref_mlp_check_topk_shape(const char *op, int64_t T, int64_t k, int64_t E);
moe_status moe_ref_mlp_check_topk(const char *op, int64_t T, int64_t k, int64_t E, const int64_t *topk_ids);
int64_t moe_ref_mlp_count_blocks(moe_mlp_layout_kind kind, int64_t T, int64_t k, int64_t E, int64_t B,
                                 const int64_t *topk_ids);
moe_status moe_ref_mlp_build_layout(const char *op, moe_mlp_layout_kind kind, int64_t T, int64_t k,
                                    int64_t E, int64_t B, moe_mlp_padding padding, moe_dtype dtype,
                                    const int64_t *topk_ids, const void *topk_weights, int64_t N,
                                    int64_t *block_to_expert, int64_t *token_position_to_id, void *affinities,
                                    int64_t *num_dropped);

/* The reference forward and backward (shapes in moe_mlp.h).  The preconditions are what the front end
 * (src/mlp_api.c) checks, plus mlp_outputs_apart (specs/mlp_problem.acsl: the outputs do not overlap the
 * problem or the layout's arrays, which moe_check_arrays is not given).  Contracts stated, NOT proved by
 * WP: these shells allocate (the slot index, the per-slot scratch, the per-thread arenas) and free, and
 * WP 25 has no model of allocation (\fresh, \freeable and the allocates/frees clauses are not
 * implemented); they also run OpenMP regions, which Frama-C does not see (ref/mlp.c under Frama-C is the
 * single-thread program).  WP proves the loop kernels they call (ref/mlp.c: build_index's cores, gather_rows,
 * mm_nn, mm_wn, transpose, store_grad, ...).  The float values are tested (tests/test_mlp*, proptest/
 * against the float64 oracle), not stated.  errno: the activations call expf, erff, tanhf. */
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
