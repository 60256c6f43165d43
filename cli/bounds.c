/*
 * cli/bounds.c: --bound-out DIR of mlp-fwd and mlp-bwd: for every output, the derived bound on the error
 * a correct float32 implementation may have in each element (oracle/oracle_mlp.h, the bound the MLP tests
 * hold the library to), written as a float64 .npy of the output's shape and name into DIR, so that
 * `moe compare --bound DIR` checks a result element by element.  The bound holds for every backend: bf16
 * without rounded intermediates allows the CUDA backend's split operands.
 */
#include "cli.h"
#include "layouts.h"
#include "oracle_mlp.h"

#include <stdint.h>
#include <string.h>

/* count elements of dtype as double (NULL stays NULL) */
static double *to_double(moe_dtype dtype, const void *data, int64_t count)
{
    if (data == NULL)
        return NULL;
    double *d = xmalloc(elements(count, 1, 1), sizeof *d);
    for (int64_t i = 0; i < count; i++)
        d[i] = oracle_load(dtype, data, i);
    return d;
}

/* The bounds of `count` elements of X's array, padded with zero bounds to `padded` elements, written to path. */
static void write_bound(const char *path, const ev *x, int64_t count, int64_t padded, int ndim, const int64_t *shape)
{
    double *b = xmalloc(elements(padded, 1, 1), sizeof *b);
    for (int64_t i = 0; i < padded; i++)
        b[i] = i < count ? x[i].e : 0.0;
    write_array(path, NPY_T_F64, ndim, shape, b);
    xfree(b);
}

/* count elements of dtype as double, or count zeros where data is NULL */
static double *to_double_or_zero(moe_dtype dtype, const void *data, int64_t count)
{
    if (data != NULL)
        return to_double(dtype, data, count);
    double *d = xmalloc(elements(count, 1, 1), sizeof *d);
    memset(d, 0, (size_t)count * sizeof *d);
    return d;
}

static void expect_of(const mlp_bound_in *in, int backward, oracle_mlp_expect *X)
{
    const moe_dtype dt = in->o->dtype;
    const int64_t I2 = 2 * in->I, NB = in->N * in->B;
    /* what a direction does not read (the forward: the gradient; the backward of given checkpoints: the
     * biases the forward adds) enters the oracle's other direction only, as zeros */
    const int bias = in->o->bias;
    const oracle_mlp_problem p = {
        in->T, in->T1, in->E, in->H, in->I, in->B, in->N, in->b2e, in->tpti, *in->o,
        to_double(dt, in->x, in->T1 * in->H), to_double(dt, in->A, in->T * in->E),
        to_double(dt, in->wgu, in->E * in->H * I2), to_double(dt, in->wd, in->E * in->I * in->H),
        bias ? to_double_or_zero(dt, in->bgu, in->E * I2) : NULL, bias ? to_double_or_zero(dt, in->bd, in->E * in->H) : NULL,
        to_double_or_zero(dt, in->g, in->T1 * in->H),
        backward ? to_double(dt, in->ckpt_gu, in->N * I2 * in->B) : NULL,
        backward ? to_double(dt, in->ckpt_d, NB * in->H) : NULL,
    };
    oracle_mlp_expect_compute(&p, NULL, NULL, NULL, NULL, 1, 0, 1, X);
}

void write_mlp_fwd_bounds(char *const *paths, const mlp_bound_in *in)
{
    oracle_mlp_expect X;
    expect_of(in, 0, &X);
    const int64_t s_y[2] = {in->T1, in->H}, s_gu[4] = {in->N, 2, in->I, in->B}, s_d[3] = {in->N, in->B, in->H};
    write_bound(paths[0], X.out, in->T1 * in->H, in->T1 * in->H, 2, s_y);
    write_bound(paths[1], X.ckpt_gu, in->N * 2 * in->I * in->B, in->N * 2 * in->I * in->B, 4, s_gu);
    write_bound(paths[2], X.ckpt_d, in->N * in->B * in->H, in->N * in->B * in->H, 3, s_d);
    oracle_mlp_expect_free(&X);
}

/* The bounds of X's array as plain doubles (count elements). */
static double *bounds_of(const ev *x, int64_t count)
{
    double *b = xmalloc(elements(count, 1, 1), sizeof *b);
    for (int64_t i = 0; i < count; i++)
        b[i] = x[i].e;
    return b;
}

void write_mlp_bwd_bounds(char *const *paths, char *const weight_paths[][2], const struct weight_layout *layout,
                          const mlp_bound_in *in, int aff_ndim, const int64_t *aff_shape, int64_t aff_count,
                          const int64_t *topk_ids, int64_t k)
{
    oracle_mlp_expect X;
    expect_of(in, 1, &X);
    const int64_t H = in->H, I = in->I, E = in->E;
    const int64_t s_h[2] = {in->T1, H}, dims[3] = {E, H, I};
    write_bound(paths[0], X.dx, in->T1 * H, in->T1 * H, 2, s_h);
    write_bound(paths[1], X.da, in->T * E, aff_count, aff_ndim, aff_shape);
    if (topk_ids != NULL) { /* the router's view: the same elements' bounds */
        double *da = bounds_of(X.da, in->T * E), *tk = xmalloc(elements(in->T, k, 1), sizeof *tk);
        topk_weights_grad(in->T, k, E, topk_ids, da, sizeof(double), tk);
        const int64_t s_tk[2] = {in->T, k};
        write_array(paths[2], NPY_T_F64, 2, s_tk, tk);
        xfree(da), xfree(tk);
    }
    const ev *grads[MLP_WEIGHTS] = {X.dwgu, X.dwd, X.dbgu, X.dbd};
    const int64_t counts[MLP_WEIGHTS] = {E * H * 2 * I, E * I * H, E * 2 * I, E * H};
    for (int w = 0; w < (in->o->bias ? MLP_WEIGHTS : B_GATE_UP); w++) {
        double *b = bounds_of(grads[w], counts[w]);
        weight_write_f64(layout, w, weight_paths[w], b, dims);
        xfree(b);
    }
    oracle_mlp_expect_free(&X);
}
