/*
 * The float64 model of the blockwise MoE MLP's error bounds (SEMANTICS section 3, specs/MLP.md "Error
 * bound"): every output, checkpoint and gradient as its exact value (from the same rounded inputs) and a
 * bound on the error a correct float32 implementation may have in it, composed from the dot-product
 * bound of SEMANTICS section 4.  Linked by the tests (testlib/ builds its MLP checks on it) and the
 * CLI (`moe mlp-fwd --bound-out`, `moe mlp-bwd --bound-out`).  oracle/mlp_bound.c; the running-error
 * arithmetic is here, inline.
 */
#ifndef LIBMOE_ORACLE_MLP_H
#define LIBMOE_ORACLE_MLP_H

#include "moe.h"
#include "moe_mlp.h"
#include "oracle.h"

#include <math.h>
#include <stdint.h>

#define U32 0x1p-24
#define ETA32 0x1p-149       /* half the smallest float32 subnormal, rounded up */

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
    case MOE_E4M3: return moe_e4m3_to_f32(moe_f32_to_e4m3((float)v));
    case MOE_E5M2: return moe_e5m2_to_f32(moe_f32_to_e5m2((float)v));
    case MOE_F32: break;
    }
    return (float)v;
}

/* ---- the activations in float64 ---- */
double oracle_mlp_act64(moe_mlp_activation a, double x);
double oracle_mlp_dact64(moe_mlp_activation a, double x);

/* ---- one MLP problem, every tensor as double (the values of options.dtype) ----
 * Positions p = n*B + b of block n; a position holding no token (id outside [0, T)) is padding.  A, x
 * and g may hold NaN where no position reads them. */
typedef struct oracle_mlp_problem {
    int64_t T, T1, E, H, I, B, N;
    const int64_t *block_to_expert;      /* [N] */
    const int64_t *token_position_to_id; /* [N*B] */
    moe_mlp_options opt;                 /* dtype, activation, affinity, bias, clamps, grad_fp32,
                                            float32_intermediates */
    const double *x, *A, *wgu, *wd, *bgu, *bd; /* hidden [T1*H], affinities [T*E], weights, biases (or NULL) */
    const double *g;                     /* out_grad [T1*H] */
    /* The backward's checkpoints as given (moe mlp-bwd: from files), or NULL: the forward's own, carried
     * with their bounds from the inputs (a test that runs the forward and then the backward). */
    const double *ckpt_gu;               /* [N*2I*B] */
    const double *ckpt_d;                /* [N*B*H], or NULL: d recomputed (affinity on I) */
} oracle_mlp_problem;

/* The expectation of every output: out [T1*H]; ckpt_gu [N*2I*B]; ckpt_d [N*B*H]; dx [T1*H]; da [T*E];
 * dwgu, dwd, dbgu, dbd the weights' and biases' shapes.  rnd_peak: the largest (|value| + bound) /
 * largest finite over every rounding to f16/bf16 on the way. */
typedef struct oracle_mlp_expect {
    ev *out, *ckpt_gu, *ckpt_d;
    ev *dx, *da, *dwgu, *dwd, *dbgu, *dbd;
    double rnd_peak;
} oracle_mlp_expect;

/* Computes X for problem p.
 *   old_*: the gradient buffers' contents before the call (options.accumulate), or NULL;
 *   down_ckpt_in_bwd: without given checkpoints, whether the backward reads the forward's down checkpoint
 *     (0: d recomputed, affinity on I);
 *   exact_rounding: how every rounding to a dtype enters: 0 the rounding joins the bound (any correct
 *     implementation), 1 the value is rounded and the bound is the rounding's spread (only an
 *     implementation that rounds exactly there);
 *   split_backend: bf16 with float32 intermediates may run on split operands (the CUDA backend:
 *     specs/MLP.md, "Split operands on the GPU"), whose extra roundings the bound then allows. */
void oracle_mlp_expect_compute(const oracle_mlp_problem *p, const double *old_wgu, const double *old_wd,
                               const double *old_bgu, const double *old_bd, int down_ckpt_in_bwd,
                               int exact_rounding, int split_backend, oracle_mlp_expect *X);
void oracle_mlp_expect_free(oracle_mlp_expect *X);

#endif /* LIBMOE_ORACLE_MLP_H */
