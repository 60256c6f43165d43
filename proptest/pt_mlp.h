/*
 * The MLP case generator of pt_mlp.c, shared by the CPU ops (mlp, mlp-meta) and the GPU op gpu-mlp
 * (pt_gpu_mlp.c).  The case and its float64 bound come from testlib/mlp_testlib.h.
 */
#ifndef LIBMOE_PT_MLP_H
#define LIBMOE_PT_MLP_H

#include "pt.h"
#include "mlp_testlib.h"

typedef struct pt_mlp_draw {
    int64_t T, E, k, H, I;
    int64_t *ids;        /* [T*k + 1] the routing (malloc'd; free with free()) */
    moe_mlp_options opt; /* every option of the case */
    int layout_mode;     /* MT_DROPLESS / MT_DROPPING / MT_SHUFFLED */
    int clamp_mask;      /* MT_LIN_LO | ... : the clamp limits to place */
    uint64_t seed;       /* the inputs' seed */
    int down_ckpt_in_bwd; /* the backward gets the down checkpoint (always with ON_H) */
    int value_dist;      /* enum mt_value_dist (pt_mlp_draw_values; 0, uniform, unless drawn) */
    int value_log2;      /* the scale 2^s of hidden for MT_VALUES_LARGE / MT_VALUES_TINY */
} pt_mlp_draw;

/* Draws a case from c's choice stream (shape, routing, every option) and describes it in c->desc. */
void pt_mlp_generate(pt_case *c, pt_mlp_draw *d);
/* Draws the value distribution of d (mt_case_set_values): the ops mlp and gpu-mlp call it after
 * everything else they draw, so reproducers made before it existed (a missing choice reads as 0, the
 * uniform distribution) keep their cases. */
void pt_mlp_draw_values(pt_case *c, pt_mlp_draw *d);
/* Appends " values=..." (the distribution and the scale the built case m uses) to c's description. */
void pt_mlp_describe_values(pt_case *c, const mt_case *m);
/* Builds the test library's case of d with options opt and layout mode layout_mode (inputs, layout,
 * clamp limits placed in gaps of the data).  Free with mt_case_free. */
void pt_mlp_build(const pt_mlp_draw *d, const moe_mlp_options *opt, int layout_mode, mt_case *m);
/* mt_run with c's bookkeeping: the worst |error|/bound goes to pt_ratio, mismatches fail the case with
 * tag "mlp-bound" (labelled `what`).  Returns the number of mismatches. */
int64_t pt_mlp_run_checked(pt_case *c, const mt_case *m, int checks, int down_ckpt, mt_result *res, const char *what);

/* One call of the MLP layout builders (pt_mlp_layout.c): the routing, the layout kind and the options
 * (dtype, block size, padding), and the capacity in blocks that moe_mlp_layout_build_on gets. */
typedef struct pt_layout_call {
    moe_mlp_layout_kind kind;
    int64_t T, k, E;
    const int64_t *topk_ids;  /* [T*k], host */
    const void *topk_weights; /* [T*k] of opt.dtype or NULL, host */
    int64_t capacity;
    moe_mlp_options opt;
} pt_layout_call;

/* moe_mlp_layout_build_on of some backend on host arrays (outputs: block_to_expert [capacity],
 * token_position_to_id [capacity * B], affinities [T*E] or NULL, num_dropped, num_blocks_used): the
 * reference's directly, the CUDA backend's through device copies (pt_gpu_mlp.c). */
typedef moe_status (*pt_layout_build_on_fn)(pt_case *c, const pt_layout_call *call, int64_t *block_to_expert,
                                            int64_t *token_position_to_id, void *affinities, int64_t *num_dropped,
                                            int64_t *num_blocks_used);
/* The mlp-layout property (pt_mlp_layout.c's header) with build_on as the backend's builder (NULL: the
 * reference's). */
void pt_mlp_layout_with(pt_case *c, pt_layout_build_on_fn build_on);
void pt_mlp_layout(pt_case *c);

#endif /* LIBMOE_PT_MLP_H */
