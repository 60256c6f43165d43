/* The MLP test library's float64 model, written from SEMANTICS section 3 independently of ref/mlp/: the
 * activations and their derivatives, the forward, the loss L = <G, out> and its central finite
 * differences (the gradients every test checks against); see mlp_testlib.h. */
#include "mlp_internal.h"

#include <math.h>
#include <stdlib.h>

#define PI_ 3.14159265358979323846

/* ---------------------------------------------------------------------------------------------------
 * activations in float64
 * ------------------------------------------------------------------------------------------------- */
static double sigmoid64(double x) { return 1.0 / (1.0 + exp(-x)); }

double mt_act64(moe_mlp_activation a, double x)
{
    switch (a) {
    case MOE_ACT_SILU: return x * sigmoid64(x);
    case MOE_ACT_GELU: return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    case MOE_ACT_GELU_TANH: return 0.5 * x * (1.0 + tanh(sqrt(2.0 / PI_) * (x + 0.044715 * x * x * x)));
    case MOE_ACT_SWISH: return x * sigmoid64(1.702 * x);
    }
    abort();
}

double mt_dact64(moe_mlp_activation a, double x)
{
    switch (a) {
    case MOE_ACT_SILU: {
        double s = sigmoid64(x);
        return s * (1.0 + x * (1.0 - s));
    }
    case MOE_ACT_GELU: return 0.5 * (1.0 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2.0 * PI_);
    case MOE_ACT_GELU_TANH: {
        double c = sqrt(2.0 / PI_), t = tanh(c * (x + 0.044715 * x * x * x));
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
    }
    case MOE_ACT_SWISH: {
        double s = sigmoid64(1.702 * x);
        return s * (1.0 + 1.702 * x * (1.0 - s));
    }
    }
    abort();
}

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
