/* The MLP test library's float64 model, written from SEMANTICS section 3 independently of ref/mlp/ (the activations
 * and their derivatives are the oracle's, oracle/mlp_bound.c): the forward, the loss L = <G, out> and its central
 * finite differences (the gradients every test checks against); see mlp_testlib.h. */
#include "mlp_internal.h"

#include <math.h>
#include <stdlib.h>

/* ---------------------------------------------------------------------------------------------------
 * the float64 forward (from SEMANTICS section 3) and its loss
 * ------------------------------------------------------------------------------------------------- */
static void forward64(const mt_case *c, const params64 *q, double *out, double *m)
{
    const int64_t H = c->H, I = c->I, E = c->E;
    int has[4];
    double lim[4];
    limits(c, has, lim);
    for (int64_t i = 0; i < c->T1 * H; i++)
        out[i] = 0.0;
    for (int64_t p = 0; p < c->N * c->B; p++) {
        const int64_t t = c->ids[p];
        if (!is_tok(c, t))
            continue;
        const int64_t e = pos_expert(c, p);
        const double a = q->A[t * E + e];
        for (int64_t i = 0; i < I; i++) {
            double g = c->opt.bias ? q->bgu[(e * 2 + 0) * I + i] : 0.0;
            double u = c->opt.bias ? q->bgu[(e * 2 + 1) * I + i] : 0.0;
            for (int64_t h = 0; h < H; h++) {
                g += q->x[t * H + h] * q->wgu[((e * H + h) * 2 + 0) * I + i];
                u += q->x[t * H + h] * q->wgu[((e * H + h) * 2 + 1) * I + i];
            }
            g = clamp64(g, has[2], lim[2], has[3], lim[3]);
            u = clamp64(u, has[0], lim[0], has[1], lim[1]);
            m[i] = mt_act64(c->opt.activation, g) * u;
        }
        for (int64_t h = 0; h < H; h++) {
            double d = c->opt.bias ? q->bd[e * H + h] : 0.0;
            for (int64_t i = 0; i < I; i++)
                d += m[i] * q->wd[(e * I + i) * H + h];
            out[t * H + h] += a * d;
        }
    }
}

void mt_forward64(const mt_case *c, double *out)
{
    double *m = dalloc(c->I);
    params64 q = mt_case_params(c);
    forward64(c, &q, out, m);
    free(m);
}

static double loss64(const mt_case *c, const params64 *q, double *out, double *m)
{
    forward64(c, q, out, m);
    double L = 0.0;
    for (int64_t i = 0; i < c->T * c->H; i++)
        L += c->g[i] * out[i];
    return L;
}

/* Central differences of L (mlp_internal.h). */
void mt_fd_array(const mt_case *c, params64 *q, double *arr, int64_t count, double *grad, double *out,
                 double *m)
{
    for (int64_t i = 0; i < count; i++) {
        const double old = arr[i];
        if (isnan(old)) {
            grad[i] = 0.0;
            continue;
        }
        arr[i] = old + FD_STEP;
        const double lp = loss64(c, q, out, m);
        arr[i] = old - FD_STEP;
        const double lm = loss64(c, q, out, m);
        arr[i] = old;
        grad[i] = (lp - lm) / (2.0 * FD_STEP);
    }
}
