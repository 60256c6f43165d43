/*
 * What the stages of the MLP test library share (mlp_testlib.h is its interface; nothing outside testlib/
 * includes this header): small helpers on a case, the float64 finite differences (mlp_float64.c), and
 * the analytic expectation of a case (mlp_bounds.c), which is the oracle's (oracle/oracle_mlp.h: the
 * running-error arithmetic, the float64 activations, every output's value and bound).
 */
#ifndef LIBMOE_MLP_INTERNAL_H
#define LIBMOE_MLP_INTERNAL_H

#include "mlp_testlib.h"
#include "alloc.h"
#include "oracle_mlp.h"

#include <math.h>

#define FD_STEP 0x1p-16

static inline double *dalloc(int64_t n) { return xmalloc((size_t)(n > 0 ? n : 1) * sizeof(double)); }

static inline int is_tok(const mt_case *c, int64_t id) { return id >= 0 && id < c->T; }
static inline int64_t pos_expert(const mt_case *c, int64_t p) { return c->b2e[p / c->B]; }

static inline double clamp64(double v, int has_lo, double lo, int has_hi, double hi)
{
    if (has_lo && v < lo)
        v = lo;
    if (has_hi && v > hi)
        v = hi;
    return v;
}

/* The clamp limits of the case's options: lin lo, lin hi, nl lo, nl hi. */
static inline void limits(const mt_case *c, int *has, double *lim)
{
    has[0] = c->opt.has_linear_clamp_lower_limit, lim[0] = c->opt.linear_clamp_lower_limit;
    has[1] = c->opt.has_linear_clamp_upper_limit, lim[1] = c->opt.linear_clamp_upper_limit;
    has[2] = c->opt.has_non_linear_clamp_lower_limit, lim[2] = c->opt.non_linear_clamp_lower_limit;
    has[3] = c->opt.has_non_linear_clamp_upper_limit, lim[3] = c->opt.non_linear_clamp_upper_limit;
}

/* ---- the float64 model (mlp_float64.c) ---- */
#define mt_act64 oracle_mlp_act64
#define mt_dact64 oracle_mlp_dact64

/* The parameters the float64 forward reads (the case's own arrays, or copies being perturbed). */
typedef struct params64 {
    double *x, *A, *wgu, *wd, *bgu, *bd;
} params64;

static inline params64 mt_case_params(const mt_case *c)
{
    return (params64){c->x, c->A, c->wgu, c->wd, c->bgu, c->bd};
}

/* Central differences of L = <G, out> over every element of `arr` (NaN elements: never read, gradient 0);
 * out [T1*H] and m [I] are scratch. */
void mt_fd_array(const mt_case *c, params64 *q, double *arr, int64_t count, double *grad, double *out, double *m);

/* ---- the analytic expectation of every output (mlp_bounds.c: oracle_mlp_expect_compute of the case) ---- */
typedef oracle_mlp_expect expect;

/* old_*: the gradient buffers' contents before the call (accumulate), as double, or NULL; the other
 * arguments as oracle_mlp_expect_compute's (split_backend: mt_split_operands). */
void mt_compute_expect(const mt_case *c, const double *old_wgu, const double *old_wd, const double *old_bgu,
                       const double *old_bd, int down_ckpt_in_bwd, int exact_rounding, int split_backend,
                       expect *X);
#define mt_expect_free oracle_mlp_expect_free
/* The largest (|value| + bound) / largest finite over every rounding to f16/bf16 in the case's analytic
 * expectation (no accumulate contents: they add at most 1): mt_case_set_values keeps it below 1/4. */
double mt_expect_rnd_peak(const mt_case *c);

#endif /* LIBMOE_MLP_INTERNAL_H */
