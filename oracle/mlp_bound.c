/* The float64 model of the blockwise MoE MLP's error bounds (oracle_mlp.h): the activations in float64,
 * and every output, checkpoint and gradient as its exact value (from the rounded inputs) and a bound on
 * the error a correct float32 implementation may have in it, composed from the dot-product bound of
 * SEMANTICS section 4 (specs/MLP.md, "Error bound", derives each rule). */
#include "oracle_mlp.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define PI_ 3.14159265358979323846

/* ---------------------------------------------------------------------------------------------------
 * the activations in float64
 * ------------------------------------------------------------------------------------------------- */
static double sigmoid64(double x) { return 1.0 / (1.0 + exp(-x)); }

double oracle_mlp_act64(moe_mlp_activation a, double x)
{
    switch (a) {
    case MOE_ACT_SILU: return x * sigmoid64(x);
    case MOE_ACT_GELU: return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    case MOE_ACT_GELU_TANH: return 0.5 * x * (1.0 + tanh(sqrt(2.0 / PI_) * (x + 0.044715 * x * x * x)));
    case MOE_ACT_SWISH: return x * sigmoid64(1.702 * x);
    }
    abort();
}

double oracle_mlp_dact64(moe_mlp_activation a, double x)
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

#define L1_ACT 1.13          /* max |act'| over all four activations (SiLU/Swish 1.0998, GELU 1.1290) */
#define L2_ACT 0.86          /* max |act''| (SiLU 0.5, GELU 0.798, Swish 0.851) */

static double largest_finite(moe_dtype dt) { return dt == MOE_F16 ? 65504.0 : (double)FLT_MAX; }

/* One rounding to a dtype (a float32 value stored as f32 is exact).
 *   exact_rounding = 0: the value stays the exact unrounded one and the rounding joins the bound,
 *     u_dt (|v| + e) + eta_dt: any correct implementation, whether it rounds here or not.
 *   exact_rounding = 1: the value is rounded (the spec's chain of rounded values) and the bound is the
 *     spread of the rounding over [v - e, v + e]: the implementation's float32 operand y lies in that
 *     interval and rounding is monotone, so round(y) lies between round(v - e) and round(v + e); where
 *     the interval holds no rounding boundary the bound is 0 and the rounded value is known exactly.
 *     Only an implementation that rounds exactly here meets it (MT_CHECK_EXACT_ROUNDING). */
static ev rnd_peak_at(double *rnd_peak, ev x, moe_dtype dt, int exact_rounding)
{
    if (dt == MOE_F32)
        return x;
    *rnd_peak = fmax(*rnd_peak, (fabs(x.v) + x.e) / largest_finite(dt));
    if (!exact_rounding)
        return (ev){x.v, x.e + moe_dtype_unit_roundoff(dt) * (fabs(x.v) + x.e) + (dt == MOE_F16 ? 0x1p-25 : 0x1p-134)};
    const double r = round_dt(dt, x.v), lo = round_dt(dt, x.v - x.e), hi = round_dt(dt, x.v + x.e);
    return (ev){r, fmax(r - lo, hi - r)};
}

/* act in float32 at a computed argument: Lipschitz part + evaluation error.  Each activation is
 * at most ~10 float32 operations and a libm call (<= 2 ulp) on quantities bounded by |x| + x^2;
 * 32 u (|x| + x^2) bounds their accumulated error with room to spare (specs/MLP.md). */
static ev act_ev(moe_mlp_activation a, ev g)
{
    const double x = fabs(g.v) + g.e;
    return (ev){oracle_mlp_act64(a, g.v), L1_ACT * g.e + 32.0 * U32 * (x + x * x) + ETA32};
}

/* act' in float32: SiLU, Swish and GELU are sums of products of O(1) factors (sigmoid, erf, exp) and
 * x, so their evaluation error is below 32 u (1 + |x|); GELU_Tanh's second term carries the cubic
 * 0.5 x (1 - t^2) c (1 + 0.134 x^2), whose absolute error grows like |x|^3 (bounded by 0.1 |x|^3
 * times the same 32 u). */
static ev dact_ev(moe_mlp_activation a, ev g)
{
    const double x = fabs(g.v) + g.e;
    const double cubic = a == MOE_ACT_GELU_TANH ? 0.1 * x * x * x : 0.0;
    return (ev){oracle_mlp_dact64(a, g.v), L2_ACT * g.e + 32.0 * U32 * (1.0 + x + cubic)};
}

/* ---------------------------------------------------------------------------------------------------
 * the analytic expectation of every output
 * ------------------------------------------------------------------------------------------------- */
static int is_tok(const oracle_mlp_problem *c, int64_t id) { return id >= 0 && id < c->T; }
static int64_t pos_expert(const oracle_mlp_problem *c, int64_t p) { return c->block_to_expert[p / c->B]; }

static double clamp64(double v, int has_lo, double lo, int has_hi, double hi)
{
    if (has_lo && v < lo)
        v = lo;
    if (has_hi && v > hi)
        v = hi;
    return v;
}

/* The clamp limits of the options: lin lo, lin hi, nl lo, nl hi. */
static void limits(const moe_mlp_options *o, int *has, double *lim)
{
    has[0] = o->has_linear_clamp_lower_limit, lim[0] = o->linear_clamp_lower_limit;
    has[1] = o->has_linear_clamp_upper_limit, lim[1] = o->linear_clamp_upper_limit;
    has[2] = o->has_non_linear_clamp_lower_limit, lim[2] = o->non_linear_clamp_lower_limit;
    has[3] = o->has_non_linear_clamp_upper_limit, lim[3] = o->non_linear_clamp_upper_limit;
}

static void *zalloc(size_t bytes)
{
    void *p = malloc(bytes > 0 ? bytes : 1);
    if (p == NULL) {
        fprintf(stderr, "oracle: out of memory (%zu bytes)\n", bytes);
        abort();
    }
    return p;
}

static ev *evalloc(int64_t n)
{
    ev *p = zalloc((size_t)(n > 0 ? n : 1) * sizeof(ev));
    for (int64_t i = 0; i < n; i++)
        p[i] = ex(0.0);
    return p;
}

void oracle_mlp_expect_free(oracle_mlp_expect *x)
{
    free(x->out), free(x->ckpt_gu), free(x->ckpt_d), free(x->dx), free(x->da), free(x->dwgu), free(x->dwd);
    free(x->dbgu), free(x->dbd);
}

/* The real positions (a token's) grouped by key, ascending within a group: list[first[k] .. first[k + 1]) for key
 * k in [0, keys), the key of position p being its token (by_token) or its expert.  The expectation's sums over a
 * token's or an expert's positions walk these lists, in the ascending position order of a scan over all
 * positions (the sums are the same), in O(positions) instead of O(keys x positions) (E = 700 took seconds). */
static void group_positions(const oracle_mlp_problem *c, int by_token, int64_t keys, int64_t **first, int64_t **list)
{
    const int64_t NB = c->N * c->B;
    int64_t *f = zalloc((size_t)(keys + 1) * sizeof(int64_t)), *l = zalloc((size_t)(NB + 1) * sizeof(int64_t));
    for (int64_t k = 0; k <= keys; k++)
        f[k] = 0;
    for (int64_t p = 0; p < NB; p++)
        if (is_tok(c, c->token_position_to_id[p]))
            f[(by_token ? c->token_position_to_id[p] : pos_expert(c, p)) + 1]++;
    for (int64_t k = 0; k < keys; k++)
        f[k + 1] += f[k];
    int64_t *next = zalloc((size_t)(keys + 1) * sizeof(int64_t));
    for (int64_t k = 0; k < keys; k++)
        next[k] = f[k];
    for (int64_t p = 0; p < NB; p++)
        if (is_tok(c, c->token_position_to_id[p]))
            l[next[by_token ? c->token_position_to_id[p] : pos_expert(c, p)]++] = p;
    free(next);
    *first = f, *list = l;
}

/* (oracle_mlp.h) */
void oracle_mlp_expect_compute(const oracle_mlp_problem *c, const double *old_wgu, const double *old_wd,
                               const double *old_bgu, const double *old_bd, int down_ckpt_in_bwd,
                               int exact_rounding, int split_backend, oracle_mlp_expect *X)
{
    const int64_t H = c->H, I = c->I, I2 = 2 * I, E = c->E, B = c->B, NB = c->N * c->B, T = c->T;
    const moe_dtype dt = c->opt.dtype, gdt = c->opt.grad_fp32 ? MOE_F32 : dt;
    const int on_i = c->opt.affinity == MOE_AFFINITY_ON_I, bias = c->opt.bias;
    /* The rounded intermediates (options.float32_intermediates = 0): the operands of the second-stage GEMMs
     * are rounded to dt (specs/MLP.md, "Rounded intermediates"); `inter` is dt then, float32 (no rounding)
     * otherwise */
    const moe_dtype inter = c->opt.float32_intermediates ? MOE_F32 : dt;
    /* split operands (mt_split_operands): m, a*m and (dg, du) as 3 bf16 terms.  There ON_H's backward moves
     * the affinity as ON_I does, dM = a * (G . W_d^T) and d_w_d += (a*m)^T . G, which the ON_H bound below
     * covers: its a*G carries the product's rounding u |a G| into every term that the other form's single
     * product rounding (of a times the sum, or a*m) can reach (specs/MLP.md) */
    const int split = split_backend && dt == MOE_BF16 && c->opt.float32_intermediates;
    const int xr = exact_rounding;
    const moe_mlp_activation act = c->opt.activation;
    /* the backward's checkpoints given (moe mlp-bwd): exact values, the clamp mask read off them */
    const int given = c->ckpt_gu != NULL;
    X->rnd_peak = 0.0;
#define RND(x, dtype, exact) rnd_peak_at(&X->rnd_peak, (x), (dtype), (exact))
    int has[4];
    double lim[4];
    limits(&c->opt, has, lim);
    X->out = evalloc(c->T1 * H), X->ckpt_gu = evalloc(c->N * I2 * B), X->ckpt_d = evalloc(NB * H);
    X->dx = evalloc(c->T1 * H), X->da = evalloc(T * E), X->dwgu = evalloc(E * H * I2), X->dwd = evalloc(E * I * H);
    X->dbgu = evalloc(E * I2), X->dbd = evalloc(E * H);

    /* per position quantities */
    ev *c_out = evalloc(NB * H), *dx_s = evalloc(NB * H), *dgu = evalloc(NB * I2), *mw = evalloc(NB * I);
    ev *dsrc = evalloc(NB * H), *dD = evalloc(NB * H);
    ev *gF = evalloc(I2), *gB = evalloc(I2), *mF = evalloc(I), *mF0 = evalloc(I), *mB0 = evalloc(I);
    ev *d_bwd = evalloc(H), *dM = evalloc(I);
    /* rounded intermediates: the unscaled m as the down checkpoint (forward) and the recomputed d
     * (backward) multiply it */
    ev *mF0r = evalloc(I), *mB0r = evalloc(I);
    int *free_mask = zalloc((size_t)(I2 + 1) * sizeof(int));
    for (int64_t p = 0; p < NB; p++) {
        const int64_t t = c->token_position_to_id[p];
        if (!is_tok(c, t))
            continue;
        const int64_t e = pos_expert(c, p), blk = p / B, b = p % B;
        const double a = c->A[t * E + e];
        for (int64_t j = 0; j < I2; j++) {
            acc_t s = {0};
            for (int64_t h = 0; h < H; h++)
                acc_prod(&s, ex(c->x[t * H + h]), ex(c->wgu[(e * H + h) * I2 + j]));
            if (bias)
                acc_term(&s, ex(c->bgu[e * I2 + j]));
            ev v = acc_done(&s);
            const int lo = j < I ? 2 : 0;
            v.v = clamp64(v.v, has[lo], lim[lo], has[lo + 1], lim[lo + 1]);
            gF[j] = v;
            X->ckpt_gu[(blk * I2 + j) * B + b] = RND(v, dt, xr);
            gB[j] = given ? ex(c->ckpt_gu[(blk * I2 + j) * B + b]) : X->ckpt_gu[(blk * I2 + j) * B + b];
            const double at = given ? gB[j].v : v.v; /* the value the backward's clamp mask reads */
            free_mask[j] = (!has[lo] || lim[lo] < at) && (!has[lo + 1] || at < lim[lo + 1]);
        }
        for (int64_t i = 0; i < I; i++) {
            /* forward: m from the unrounded g, u (ON_I: times a), then the down projection's operand */
            mF0[i] = mul(act_ev(act, gF[i]), gF[I + i]);
            mF[i] = RND(on_i ? mul(mF0[i], ex(a)) : mF0[i], inter, xr);
            mF0r[i] = RND(mF0[i], inter, xr);
            /* backward: m from the rounded checkpoints; dW_d's operand (ON_I: a*m) */
            mB0[i] = mul(act_ev(act, gB[i]), gB[I + i]);
            mB0r[i] = RND(mB0[i], inter, xr);
            mw[p * I + i] = RND(on_i ? mul(mB0[i], ex(a)) : mB0[i], inter, xr);
        }
        for (int64_t h = 0; h < H; h++) {
            acc_t s = {0}, s0 = {0}, sb = {0};
            acc_split(&s, split, 3, 0), acc_split(&s0, split, 3, 0), acc_split(&sb, split, 3, 0);
            for (int64_t i = 0; i < I; i++) {
                acc_prod(&s, mF[i], ex(c->wd[(e * I + i) * H + h]));
                acc_prod(&s0, mF0r[i], ex(c->wd[(e * I + i) * H + h]));
                acc_prod(&sb, mB0r[i], ex(c->wd[(e * I + i) * H + h]));
            }
            if (bias) {
                acc_term(&s, on_i ? mul(ex(a), ex(c->bd[e * H + h])) : ex(c->bd[e * H + h]));
                acc_term(&s0, ex(c->bd[e * H + h]));
                acc_term(&sb, ex(c->bd[e * H + h]));
            }
            const ev dfwd = acc_done(&s), ckpt = RND(acc_done(&s0), dt, xr);
            X->ckpt_d[p * H + h] = ckpt;
            c_out[p * H + h] = on_i ? dfwd : mul(ex(a), dfwd);
            if (given)
                d_bwd[h] = c->ckpt_d != NULL ? ex(c->ckpt_d[p * H + h]) : acc_done(&sb);
            else
                d_bwd[h] = (on_i && !down_ckpt_in_bwd) ? acc_done(&sb) : ckpt;
            dD[p * H + h] = RND(mul(ex(a), ex(c->g[t * H + h])), inter, xr);
            dsrc[p * H + h] = on_i ? ex(c->g[t * H + h]) : dD[p * H + h];
        }
        {
            acc_t s = {0};
            for (int64_t h = 0; h < H; h++)
                acc_prod(&s, ex(c->g[t * H + h]), d_bwd[h]);
            X->da[t * E + e] = RND(acc_done(&s), dt, xr);
        }
        for (int64_t i = 0; i < I; i++) {
            acc_t s = {0};
            for (int64_t h = 0; h < H; h++)
                acc_prod(&s, dsrc[p * H + h], ex(c->wd[(e * I + i) * H + h]));
            dM[i] = on_i ? mul(ex(a), acc_done(&s)) : acc_done(&s);
            dgu[p * I2 + i] = free_mask[i] ? RND(mul(mul(dM[i], gB[I + i]), dact_ev(act, gB[i])), inter, xr) : ex(0.0);
            dgu[p * I2 + I + i] = free_mask[I + i] ? RND(mul(dM[i], act_ev(act, gB[i])), inter, xr) : ex(0.0);
        }
        for (int64_t h = 0; h < H; h++) {
            acc_t s = {0};
            acc_split(&s, split, 3, 0);
            for (int64_t j = 0; j < I2; j++)
                acc_prod(&s, dgu[p * I2 + j], ex(c->wgu[(e * H + h) * I2 + j]));
            dx_s[p * H + h] = acc_done(&s);
        }
    }

    int64_t *token_first, *token_pos, *expert_first, *expert_pos;
    group_positions(c, 1, T, &token_first, &token_pos);
    group_positions(c, 0, E, &expert_first, &expert_pos);
    /* token rows */
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++) {
            acc_t so = {0}, sx = {0};
            for (int64_t q = token_first[t]; q < token_first[t + 1]; q++) {
                const int64_t p = token_pos[q];
                acc_term(&so, c_out[p * H + h]);
                acc_term(&sx, dx_s[p * H + h]);
            }
            X->out[t * H + h] = RND(acc_done(&so), dt, xr);
            X->dx[t * H + h] = RND(acc_done(&sx), dt, xr);
        }
    /* expert rows (positions of an expert in any order: the bound does not depend on it) */
    for (int64_t e = 0; e < E; e++) {
        for (int64_t i = 0; i < I; i++)
            for (int64_t h = 0; h < H; h++) {
                acc_t s = {0};
                acc_split(&s, split, 3, 1);
                for (int64_t q = expert_first[e]; q < expert_first[e + 1]; q++) {
                    const int64_t p = expert_pos[q];
                    acc_prod(&s, mw[p * I + i], dsrc[p * H + h]);
                }
                if (old_wd)
                    acc_term(&s, ex(old_wd[(e * I + i) * H + h]));
                X->dwd[(e * I + i) * H + h] = RND(acc_done(&s), gdt, xr);
            }
        for (int64_t h = 0; h < H; h++)
            for (int64_t j = 0; j < I2; j++) {
                acc_t s = {0};
                acc_split(&s, split, 3, 1);
                for (int64_t q = expert_first[e]; q < expert_first[e + 1]; q++) {
                    const int64_t p = expert_pos[q];
                    acc_prod(&s, ex(c->x[c->token_position_to_id[p] * H + h]), dgu[p * I2 + j]);
                }
                if (old_wgu)
                    acc_term(&s, ex(old_wgu[(e * H + h) * I2 + j]));
                X->dwgu[(e * H + h) * I2 + j] = RND(acc_done(&s), gdt, xr);
            }
        if (bias) {
            for (int64_t h = 0; h < H; h++) {
                acc_t s = {0};
                for (int64_t q = expert_first[e]; q < expert_first[e + 1]; q++) {
                    const int64_t p = expert_pos[q];
                    acc_term(&s, dD[p * H + h]);
                }
                if (old_bd)
                    acc_term(&s, ex(old_bd[e * H + h]));
                X->dbd[e * H + h] = RND(acc_done(&s), gdt, xr);
            }
            for (int64_t j = 0; j < I2; j++) {
                acc_t s = {0};
                for (int64_t q = expert_first[e]; q < expert_first[e + 1]; q++) {
                    const int64_t p = expert_pos[q];
                    acc_term(&s, dgu[p * I2 + j]);
                }
                if (old_bgu)
                    acc_term(&s, ex(old_bgu[e * I2 + j]));
                X->dbgu[e * I2 + j] = RND(acc_done(&s), gdt, xr);
            }
        }
    }
    free(c_out), free(dx_s), free(dgu), free(mw), free(dsrc), free(dD), free(gF), free(gB), free(mF);
    free(mF0), free(mB0), free(d_bwd), free(dM), free(free_mask), free(mF0r), free(mB0r);
    free(token_first), free(token_pos), free(expert_first), free(expert_pos);
#undef RND
}

