/*
 * The MLP case generator of pt_mlp.c, shared by the CPU ops (mlp, mlp-meta) and the GPU op gpu-mlp
 * (pt_gpu_mlp.c).  The case and its float64 bound come from tests/mlp_testlib.c.
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
} pt_mlp_draw;

/* Draws a case from c's choice stream (shape, routing, every option) and describes it in c->desc. */
void pt_mlp_generate(pt_case *c, pt_mlp_draw *d);
/* Builds the test library's case of d with options opt and layout mode layout_mode (inputs, layout,
 * clamp limits placed in gaps of the data).  Free with mt_case_free. */
void pt_mlp_build(const pt_mlp_draw *d, const moe_mlp_options *opt, int layout_mode, mt_case *m);
/* mt_run with c's bookkeeping: the worst |error|/bound goes to pt_ratio, mismatches fail the case with
 * tag "mlp-bound" (labelled `what`).  Returns the number of mismatches. */
int64_t pt_mlp_run_checked(pt_case *c, const mt_case *m, int checks, int down_ckpt, mt_result *res, const char *what);

#endif /* LIBMOE_PT_MLP_H */
