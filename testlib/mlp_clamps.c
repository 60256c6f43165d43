/* The MLP test library's clamp placement: limits at quantiles of the data, in gaps wider than the error
 * bounds of the values around them; see mlp_testlib.h (mt_choose_clamps). */
#include "mlp_internal.h"

#include <math.h>
#include <stdlib.h>

/* ---------------------------------------------------------------------------------------------------
 * clamp placement
 * ------------------------------------------------------------------------------------------------- */
typedef struct vb {
    double v, e;
} vb;

static int cmp_vb(const void *a, const void *b)
{
    double x = ((const vb *)a)->v, y = ((const vb *)b)->v;
    return x < y ? -1 : x > y;
}

/* A limit near quantile q in a gap: returns 1 and *lim, with the share of values below it in *below. */
static int place_limit(const vb *s, int64_t n, double q, moe_dtype dt, double *lim, double *below)
{
    const double u = moe_dtype_unit_roundoff(dt);
    const int64_t target = (int64_t)(q * (double)(n - 1));
    for (int64_t off = 0; off < n; off++) {
        for (int sign = -1; sign <= 1; sign += 2) {
            const int64_t j = target + sign * off;
            if (j < 0 || j + 1 >= n || (off == 0 && sign == 1))
                continue;
            const double cand = round_dt(dt, 0.5 * (s[j].v + s[j + 1].v));
            const double m_lo = s[j].e + u * (fabs(s[j].v) + s[j].e) + 2 * u * fabs(cand) + 1e-3;
            const double m_hi = s[j + 1].e + u * (fabs(s[j + 1].v) + s[j + 1].e) + 2 * u * fabs(cand) + 1e-3;
            if (cand - s[j].v > m_lo && s[j + 1].v - cand > m_hi) {
                *lim = cand;
                *below = (double)(j + 1) / (double)n;
                return 1;
            }
        }
    }
    return 0;
}

int mt_choose_clamps(mt_case *c, int mask)
{
    const int64_t H = c->H, I = c->I, I2 = 2 * I, E = c->E, NB = c->N * c->B;
    int64_t n = 0;
    for (int64_t p = 0; p < NB; p++)
        n += is_tok(c, c->ids[p]);
    vb *vals[2] = {xmalloc((size_t)(n * I + 1) * sizeof(vb)), xmalloc((size_t)(n * I + 1) * sizeof(vb))};
    int64_t cnt = 0;
    for (int64_t p = 0; p < NB; p++) {
        const int64_t t = c->ids[p];
        if (!is_tok(c, t))
            continue;
        const int64_t e = pos_expert(c, p);
        for (int64_t j = 0; j < I2; j++) {
            acc_t s = {0};
            for (int64_t h = 0; h < H; h++)
                acc_prod(&s, ex(c->x[t * H + h]), ex(c->wgu[(e * H + h) * I2 + j]));
            if (c->opt.bias)
                acc_term(&s, ex(c->bgu[e * I2 + j]));
            const ev v = acc_done(&s);
            vals[j < I ? 1 : 0][cnt * I + (j % I)] = (vb){v.v, v.e};
        }
        cnt++;
        (void)E;
    }
    int ok = 1;
    for (int w = 0; w < 2 && ok; w++) { /* 0: linear (u), 1: non-linear (g) */
        qsort(vals[w], (size_t)(n * I), sizeof(vb), cmp_vb);
        double lo = 0, hi = 0, below_lo = 0, below_hi = 0;
        const int want_lo = mask & (w ? MT_NL_LO : MT_LIN_LO), want_hi = mask & (w ? MT_NL_HI : MT_LIN_HI);
        if (want_lo && !place_limit(vals[w], n * I, 0.25, c->opt.dtype, &lo, &below_lo))
            ok = 0;
        if (ok && want_hi && !place_limit(vals[w], n * I, 0.75, c->opt.dtype, &hi, &below_hi))
            ok = 0;
        if (ok && want_lo && want_hi && !(lo < hi))
            ok = 0;
        if (!ok)
            break;
        if (w == 0) {
            c->opt.has_linear_clamp_lower_limit = want_lo != 0, c->opt.linear_clamp_lower_limit = (float)lo;
            c->opt.has_linear_clamp_upper_limit = want_hi != 0, c->opt.linear_clamp_upper_limit = (float)hi;
            c->clamp_fraction[0] = want_lo ? below_lo : 0, c->clamp_fraction[1] = want_hi ? 1 - below_hi : 0;
        } else {
            c->opt.has_non_linear_clamp_lower_limit = want_lo != 0, c->opt.non_linear_clamp_lower_limit = (float)lo;
            c->opt.has_non_linear_clamp_upper_limit = want_hi != 0, c->opt.non_linear_clamp_upper_limit = (float)hi;
            c->clamp_fraction[2] = want_lo ? below_lo : 0, c->clamp_fraction[3] = want_hi ? 1 - below_hi : 0;
        }
    }
    free(vals[0]);
    free(vals[1]);
    return ok;
}
