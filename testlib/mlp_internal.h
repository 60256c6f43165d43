/*
 * What the stages of the MLP test library share (mlp_testlib.h is its interface; nothing outside testlib/
 * includes this header): constants, small helpers on a case, the float64 activations and finite
 * differences (mlp_float64.c), the running-error arithmetic (here, inline) and the analytic expectation
 * built with it (mlp_bounds.c).
 */
#ifndef LIBMOE_MLP_INTERNAL_H
#define LIBMOE_MLP_INTERNAL_H

#include "mlp_testlib.h"
#include "alloc.h"

#include <math.h>

#define U32 0x1p-24
#define ETA32 0x1p-149       /* half the smallest float32 subnormal, rounded up */
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
double mt_act64(moe_mlp_activation a, double x);
double mt_dact64(moe_mlp_activation a, double x);

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

/* ---- running error arithmetic: every quantity as its exact value and a bound on its error ---- */
typedef struct ev {
    double v, e;
} ev;

typedef struct acc_t {
    double v, mag, prop;
    int64_t n;
    int64_t terms;    /* split operands: the terms each product becomes; 0 or 1: one */
    int stacked;      /* split operands: the terms in one sum (1), or summed per term and then added (0) */
    int64_t n_prod;   /* the products among the n terms */
    double split_abs; /* split operands: the terms' lost subnormal bits */
} acc_t;

static inline ev ex(double v) { return (ev){v, 0.0}; }

/* fl32(x*y) from computed operands */
static inline ev mul(ev x, ev y)
{
    const double prop = fabs(x.v) * y.e + fabs(y.v) * x.e + x.e * y.e;
    return (ev){x.v * y.v, prop + U32 * (fabs(x.v * y.v) + prop) + ETA32};
}

static inline void acc_prod(acc_t *a, ev x, ev y)
{
    a->v += x.v * y.v;
    a->mag += (fabs(x.v) + x.e) * (fabs(y.v) + y.e);
    a->prop += fabs(x.v) * y.e + fabs(y.v) * x.e + x.e * y.e;
    a->n++;
    a->n_prod++;
    if (a->terms > 1) /* each operand off by less than 2^-125 (specs/MLP.md, "Split operands on the GPU") */
        a->split_abs += 0x1p-125 * (fabs(x.v) + x.e + fabs(y.v) + y.e) + 0x1p-250;
}

/* The products of the sum `a` will be evaluated on split operands (specs/MLP.md, "Split operands on the
 * GPU"), each as `terms` exact products: summed per term, then the `terms` results added (stacked 0), or
 * all in one sum (stacked 1, the weight gradients).  With split = 0, or terms 1, nothing changes. */
static inline void acc_split(acc_t *a, int split, int64_t terms, int stacked)
{
    a->terms = split ? terms : 1;
    a->stacked = stacked;
}

static inline void acc_term(acc_t *a, ev x)
{
    a->v += x.v;
    a->mag += fabs(x.v) + x.e;
    a->prop += x.e;
    a->n++;
}

/* Any float32 summation order of n rounded terms: |error| <= gamma(n) * sum |terms| (SEMANTICS 4);
 * the last term bounds this double computation's own rounding; n*ETA32 bounds underflow.  On split
 * operands (acc_split) each product becomes `terms` exact products with the same magnitude sum: summed per
 * term, each passes through at most n + terms - 1 roundings (its term's n, then terms - 1 adds); summed in
 * one pass, the sum has n + (terms - 1) n_prod terms. */
static inline ev acc_done(const acc_t *a)
{
    const int64_t terms = a->terms > 1 ? a->terms : 1;
    const int64_t roundings = a->stacked ? a->n + (terms - 1) * a->n_prod : a->n + terms - 1;
    return (ev){a->v, a->prop + oracle_gamma(roundings) * a->mag + a->split_abs +
                          (double)a->n * (0x1p-52 * a->mag + (double)terms * ETA32)};
}

/* v rounded to float32, then to the dtype (round to nearest even both times): monotone in v, and the
 * dtype's rounding itself for a float32 v. */
static inline double round_dt(moe_dtype dt, double v)
{
    switch (dt) {
    case MOE_F16: return moe_f16_to_f32(moe_f32_to_f16((float)v));
    case MOE_BF16: return moe_bf16_to_f32(moe_f32_to_bf16((float)v));
    case MOE_F32: break;
    }
    return (float)v;
}

/* ---- the analytic expectation of every output (mlp_bounds.c) ---- */
typedef struct expect {
    ev *out, *ckpt_gu, *ckpt_d;   /* out [T1*H]; ckpt_gu [N*2I*B]; ckpt_d [N*B*H] */
    ev *dx, *da, *dwgu, *dwd, *dbgu, *dbd;
} expect;

/* old_*: the gradient buffers' contents before the call (accumulate), as double, or NULL.
 * exact_rounding: how every rounding to a dtype enters (mlp_bounds.c, rnd); split_backend: mt_split_operands. */
void mt_compute_expect(const mt_case *c, const double *old_wgu, const double *old_wd, const double *old_bgu,
                       const double *old_bd, int down_ckpt_in_bwd, int exact_rounding, int split_backend,
                       expect *X);
void mt_expect_free(expect *x);
/* The largest (|value| + bound) / largest finite over every rounding to f16/bf16 in the case's analytic
 * expectation (no accumulate contents: they add at most 1): mt_case_set_values keeps it below 1/4. */
double mt_expect_rnd_peak(const mt_case *c);

#endif /* LIBMOE_MLP_INTERNAL_H */
