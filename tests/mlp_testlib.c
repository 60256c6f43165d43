/* Test support for the blockwise MoE MLP; see mlp_testlib.h and specs/MLP.md ("Error bound"). */
#include "mlp_testlib.h"
#include "alloc.h"
#include "check.h"

#include <float.h>
#include <math.h>
#include <string.h>

#define U32 0x1p-24
#define ETA32 0x1p-149       /* half the smallest float32 subnormal, rounded up */
#define L1_ACT 1.13          /* max |act'| over all four activations (SiLU/Swish 1.0998, GELU 1.1290) */
#define L2_ACT 0.86          /* max |act''| (SiLU 0.5, GELU 0.798, Swish 0.851) */
#define FD_STEP 0x1p-16
#define PI_ 3.14159265358979323846

static double *dalloc(int64_t n) { return xmalloc((size_t)(n > 0 ? n : 1) * sizeof(double)); }

double mt_load(moe_dtype dtype, const void *base, int64_t i) { return oracle_load(dtype, base, i); }

double mt_worst_ratio;

int64_t mt_count_wgu(const mt_case *c) { return c->E * c->H * 2 * c->I; }
int64_t mt_count_wd(const mt_case *c) { return c->E * c->I * c->H; }

/* ---------------------------------------------------------------------------------------------------
 * activations in float64
 * ------------------------------------------------------------------------------------------------- */
static double sigmoid64(double x) { return 1.0 / (1.0 + exp(-x)); }

static double act64(moe_mlp_activation a, double x)
{
    switch (a) {
    case MOE_ACT_SILU: return x * sigmoid64(x);
    case MOE_ACT_GELU: return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    case MOE_ACT_GELU_TANH: return 0.5 * x * (1.0 + tanh(sqrt(2.0 / PI_) * (x + 0.044715 * x * x * x)));
    case MOE_ACT_SWISH: return x * sigmoid64(1.702 * x);
    }
    abort();
}

static double dact64(moe_mlp_activation a, double x)
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

static double clamp64(double v, int has_lo, double lo, int has_hi, double hi)
{
    if (has_lo && v < lo)
        v = lo;
    if (has_hi && v > hi)
        v = hi;
    return v;
}

/* ---------------------------------------------------------------------------------------------------
 * case generation
 * ------------------------------------------------------------------------------------------------- */
static int is_tok(const mt_case *c, int64_t id) { return id >= 0 && id < c->T; }
static int64_t pos_expert(const mt_case *c, int64_t p) { return c->b2e[p / c->B]; }

static void make_layout(mt_case *c, int mode, oracle_rng *rng)
{
    moe_mlp_options o = c->opt;
    const moe_mlp_layout_kind kind = mode == MT_DROPPING ? MOE_MLP_DROPPING : MOE_MLP_DROPLESS;
    int64_t N = -1;
    REQUIRE(moe_mlp_layout_num_blocks(kind, c->T, c->k, c->E, c->topk_ids, &o, &N) == MOE_OK, "num_blocks: %s",
            moe_last_error());
    const int extra = mode == MT_SHUFFLED;
    c->N = N + extra;
    c->b2e = xmalloc((size_t)(c->N + 1) * sizeof(int64_t));
    c->ids = xmalloc((size_t)(c->N * c->B + 1) * sizeof(int64_t));
    REQUIRE(moe_mlp_layout_build(kind, c->T, c->k, c->E, c->topk_ids, NULL, N, c->b2e, c->ids, NULL, &c->dropped,
                                 &o) == MOE_OK,
            "build: %s", moe_last_error());
    if (extra) {
        const int64_t pad = o.padding == MOE_MLP_PAD_ROW ? c->T : -1, B = c->B;
        c->b2e[N] = (int64_t)oracle_rng_below(rng, (uint64_t)c->E);
        for (int64_t b = 0; b < B; b++)
            c->ids[N * B + b] = pad;
        /* permute blocks (Fisher-Yates) and shuffle slots inside each block */
        int64_t *tmp = xmalloc((size_t)B * sizeof(int64_t));
        for (int64_t n = c->N - 1; n > 0; n--) {
            int64_t m = (int64_t)oracle_rng_below(rng, (uint64_t)n + 1), te = c->b2e[n];
            c->b2e[n] = c->b2e[m];
            c->b2e[m] = te;
            memcpy(tmp, c->ids + n * B, (size_t)B * sizeof(int64_t));
            memcpy(c->ids + n * B, c->ids + m * B, (size_t)B * sizeof(int64_t));
            memcpy(c->ids + m * B, tmp, (size_t)B * sizeof(int64_t));
        }
        for (int64_t n = 0; n < c->N; n++)
            for (int64_t b = B - 1; b > 0; b--) {
                int64_t m = (int64_t)oracle_rng_below(rng, (uint64_t)b + 1), t = c->ids[n * B + b];
                c->ids[n * B + b] = c->ids[n * B + m];
                c->ids[n * B + m] = t;
            }
        free(tmp);
    }
    c->layout = (moe_mlp_layout){c->T, c->E, c->N, c->b2e, c->ids};
    REQUIRE(moe_mlp_layout_validate(&c->layout, &o) == MOE_OK, "validate: %s", moe_last_error());
}

static void fill(oracle_rng *rng, const mt_case *c, void **dst, double **copy, int64_t count)
{
    *dst = xmalloc((size_t)(count > 0 ? count : 1) * moe_dtype_size(c->opt.dtype));
    *copy = dalloc(count);
    oracle_fill(rng, c->opt.dtype, *dst, count, 0);
    for (int64_t i = 0; i < count; i++)
        (*copy)[i] = oracle_load(c->opt.dtype, *dst, i);
}

static void set_nan(const mt_case *c, void *dst, double *copy, int64_t i)
{
    oracle_poison(c->opt.dtype, (char *)dst + (size_t)i * moe_dtype_size(c->opt.dtype), 1);
    copy[i] = NAN;
}

void mt_case_init_routing(mt_case *c, uint64_t seed, int64_t T, int64_t E, int64_t k, int64_t H, int64_t I,
                          const int64_t *topk_ids, const moe_mlp_options *opt, int mode)
{
    memset(c, 0, sizeof *c);
    c->seed = seed;
    c->T = T, c->E = E, c->k = k, c->H = H, c->I = I;
    c->opt = *opt;
    c->B = opt->block_size ? opt->block_size : MOE_MLP_DEFAULT_BLOCK_SIZE;
    c->T1 = opt->padding == MOE_MLP_PAD_ROW ? T + 1 : T;
    oracle_rng rng = {seed ^ 0x5eedULL};
    c->topk_ids = xmalloc((size_t)(T * k + 1) * sizeof(int64_t));
    memcpy(c->topk_ids, topk_ids, (size_t)(T * k) * sizeof(int64_t));
    make_layout(c, mode, &rng);

    fill(&rng, c, &c->hidden, &c->x, c->T1 * H);
    fill(&rng, c, &c->aff, &c->A, T * E);
    fill(&rng, c, &c->w_gu, &c->wgu, E * H * 2 * I);
    fill(&rng, c, &c->w_d, &c->wd, E * I * H);
    fill(&rng, c, &c->b_gu, &c->bgu, E * 2 * I);
    fill(&rng, c, &c->b_d, &c->bd, E * H);
    fill(&rng, c, &c->G, &c->g, c->T1 * H);
    if (c->T1 > T)
        for (int64_t h = 0; h < H; h++) {
            set_nan(c, c->hidden, c->x, T * H + h);
            set_nan(c, c->G, c->g, T * H + h);
        }
    /* affinities of pairs outside the layout: NaN (never read) */
    unsigned char *used = calloc((size_t)(T * E + 1), 1);
    for (int64_t p = 0; p < c->N * c->B; p++)
        if (is_tok(c, c->ids[p]))
            used[c->ids[p] * E + pos_expert(c, p)] = 1;
    for (int64_t i = 0; i < T * E; i++)
        if (!used[i])
            set_nan(c, c->aff, c->A, i);
    free(used);
}

void mt_case_init(mt_case *c, uint64_t seed, int64_t T, int64_t E, int64_t k, int64_t H, int64_t I,
                  const moe_mlp_options *opt, int mode)
{
    oracle_rng rng = {seed};
    int64_t *ids = xmalloc((size_t)(T * k + 1) * sizeof(int64_t));
    int64_t *perm = xmalloc((size_t)E * sizeof(int64_t));
    for (int64_t t = 0; t < T; t++) {
        for (int64_t e = 0; e < E; e++)
            perm[e] = e;
        for (int64_t j = 0; j < k; j++) { /* partial Fisher-Yates: k distinct experts */
            int64_t m = j + (int64_t)oracle_rng_below(&rng, (uint64_t)(E - j)), te = perm[j];
            perm[j] = perm[m];
            perm[m] = te;
            ids[t * k + j] = perm[j];
        }
    }
    mt_case_init_routing(c, seed, T, E, k, H, I, ids, opt, mode);
    free(ids);
    free(perm);
}

void mt_case_free(mt_case *c)
{
    void *ps[] = {c->topk_ids, c->b2e, c->ids, c->hidden, c->aff, c->w_gu, c->w_d, c->b_gu, c->b_d, c->G,
                  c->x, c->A, c->wgu, c->wd, c->bgu, c->bd, c->g};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
        free(ps[i]);
    memset(c, 0, sizeof *c);
}

/* dst[map(i)] = src[i] for `count` elements of es bytes in blocks of `per` (map NULL: identity) */
static void move_blocks(const void *src, void *dst, size_t es, int64_t count, int64_t per, const int64_t *map)
{
    for (int64_t i = 0; i < count; i++) {
        const int64_t j = map ? map[i / per] * per + i % per : i;
        memcpy((char *)dst + (size_t)j * es, (const char *)src + (size_t)i * es, es);
    }
}

/* A copy of the buffer (es-byte elements, count of them) with src's elements moved by move_blocks and
 * elements [count, total) copied in place (the pad row). */
static void *relabelled_copy(const void *src, size_t es, int64_t count, int64_t total, int64_t per,
                             const int64_t *map)
{
    void *dst = xmalloc((size_t)(total > 0 ? total : 1) * es);
    move_blocks(src, dst, es, count, per, map);
    memcpy((char *)dst + (size_t)count * es, (const char *)src + (size_t)count * es, (size_t)(total - count) * es);
    return dst;
}

static void make_layout(mt_case *c, int mode, oracle_rng *rng);

void mt_case_relabel(const mt_case *src, const int64_t *token_map, const int64_t *expert_map, int rebuild_layout,
                     mt_case *dst)
{
    const int64_t T = src->T, E = src->E, k = src->k, H = src->H, I = src->I, NB = src->N * src->B;
    const size_t es = moe_dtype_size(src->opt.dtype), ds = sizeof(double);
    *dst = *src;
    dst->topk_ids = xmalloc((size_t)(T * k + 1) * sizeof(int64_t));
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++) {
            const int64_t e = src->topk_ids[t * k + j];
            dst->topk_ids[(token_map ? token_map[t] : t) * k + j] = expert_map ? expert_map[e] : e;
        }
    if (rebuild_layout) {
        oracle_rng rng = {src->seed ^ 0x5eedULL};
        make_layout(dst, MT_DROPLESS, &rng);
    } else {
        dst->b2e = xmalloc((size_t)(src->N + 1) * sizeof(int64_t));
        dst->ids = xmalloc((size_t)(NB + 1) * sizeof(int64_t));
        for (int64_t n = 0; n < src->N; n++)
            dst->b2e[n] = expert_map ? expert_map[src->b2e[n]] : src->b2e[n];
        for (int64_t p = 0; p < NB; p++) {
            const int64_t t = src->ids[p];
            dst->ids[p] = is_tok(src, t) && token_map ? token_map[t] : t; /* padding marks stay */
        }
        dst->layout = (moe_mlp_layout){T, E, src->N, dst->b2e, dst->ids};
    }
    /* token rows (the pad row T stays last), (token, expert) pairs, expert blocks */
    dst->hidden = relabelled_copy(src->hidden, es, T * H, src->T1 * H, H, token_map);
    dst->x = relabelled_copy(src->x, ds, T * H, src->T1 * H, H, token_map);
    dst->G = relabelled_copy(src->G, es, T * H, src->T1 * H, H, token_map);
    dst->g = relabelled_copy(src->g, ds, T * H, src->T1 * H, H, token_map);
    dst->aff = xmalloc((size_t)(T * E + 1) * es);
    dst->A = dalloc(T * E);
    for (int64_t t = 0; t < T; t++)
        for (int64_t e = 0; e < E; e++) {
            const int64_t j = (token_map ? token_map[t] : t) * E + (expert_map ? expert_map[e] : e);
            memcpy((char *)dst->aff + (size_t)j * es, (const char *)src->aff + (size_t)(t * E + e) * es, es);
            dst->A[j] = src->A[t * E + e];
        }
    const int64_t per[4] = {H * 2 * I, I * H, 2 * I, H};
    const void *sb[4] = {src->w_gu, src->w_d, src->b_gu, src->b_d};
    const double *sd[4] = {src->wgu, src->wd, src->bgu, src->bd};
    void **db[4] = {&dst->w_gu, &dst->w_d, &dst->b_gu, &dst->b_d};
    double **dd[4] = {&dst->wgu, &dst->wd, &dst->bgu, &dst->bd};
    for (int q = 0; q < 4; q++) {
        *db[q] = relabelled_copy(sb[q], es, E * per[q], E * per[q], per[q], expert_map);
        *dd[q] = relabelled_copy(sd[q], ds, E * per[q], E * per[q], per[q], expert_map);
    }
}

static void scale_input(const mt_case *c, void *buf, double *copy, int64_t n, double factor)
{
    for (int64_t i = 0; i < n; i++) {
        if (isnan(copy[i]))
            continue;
        const float v = (float)(copy[i] * factor);
        switch (c->opt.dtype) {
        case MOE_F32: ((float *)buf)[i] = v; break;
        case MOE_F16: ((uint16_t *)buf)[i] = moe_f32_to_f16(v); break;
        case MOE_BF16: ((uint16_t *)buf)[i] = moe_f32_to_bf16(v); break;
        }
        copy[i] = oracle_load(c->opt.dtype, buf, i);
    }
}

/* 1/sqrt(fan_in), or its nearest power of two for exact values */
static double weight_scale(const mt_case *c, int64_t fan_in)
{
    const double f = 1.0 / sqrt((double)(fan_in > 1 ? fan_in : 1));
    return c->value_dist == MT_VALUES_EXACT ? ldexp(1.0, (int)lround(log2(f))) : f;
}

void mt_case_scale_weights(mt_case *c)
{
    scale_input(c, c->w_gu, c->wgu, c->E * c->H * 2 * c->I, weight_scale(c, c->H));
    scale_input(c, c->w_d, c->wd, c->E * c->I * c->H, weight_scale(c, c->I));
}

const char *mt_value_dist_name(int dist)
{
    static const char *const names[MT_VALUE_DISTS] = {"uniform", "exact", "large", "tiny"};
    return dist >= 0 && dist < MT_VALUE_DISTS ? names[dist] : "?";
}

/* Every non-NaN element of buf/copy (count of them) redrawn from {0, +-2^-4 .. +-2^0}. */
static void refill_exact(const mt_case *c, oracle_rng *rng, void *buf, double *copy, int64_t count)
{
    const size_t es = moe_dtype_size(c->opt.dtype);
    for (int64_t i = 0; i < count; i++)
        if (!isnan(copy[i])) {
            oracle_fill(rng, c->opt.dtype, (char *)buf + (size_t)i * es, 1, 1);
            copy[i] = oracle_load(c->opt.dtype, buf, i);
        }
}

static double largest_finite(moe_dtype dt) { return dt == MOE_F16 ? 65504.0 : (double)FLT_MAX; }

/* The largest (|value| + bound) / largest finite over every rounding to f16/bf16 in compute_expect since
 * the last reset (rnd records it): mt_case_set_values keeps it below 1/4. */
static double rnd_peak;

static double expect_rnd_peak(const mt_case *c);

void mt_case_set_values(mt_case *c, int dist, int log2_scale, int scale_weights)
{
    c->value_dist = dist;
    c->value_log2 = 0;
    if (dist == MT_VALUES_EXACT) {
        oracle_rng rng = {c->seed ^ 0xe8ac7ULL};
        refill_exact(c, &rng, c->hidden, c->x, c->T1 * c->H);
        refill_exact(c, &rng, c->aff, c->A, c->T * c->E);
        refill_exact(c, &rng, c->w_gu, c->wgu, mt_count_wgu(c));
        refill_exact(c, &rng, c->w_d, c->wd, mt_count_wd(c));
        refill_exact(c, &rng, c->b_gu, c->bgu, c->E * 2 * c->I);
        refill_exact(c, &rng, c->b_d, c->bd, c->E * c->H);
        refill_exact(c, &rng, c->G, c->g, c->T1 * c->H);
    }
    if (scale_weights)
        mt_case_scale_weights(c);
    if (dist != MT_VALUES_LARGE && dist != MT_VALUES_TINY)
        return;
    /* powers of two: exact unless an f16 input becomes subnormal (tiny), re-rounded then */
    const int64_t n = c->T1 * c->H;
    double *orig = dalloc(n);
    memcpy(orig, c->x, (size_t)n * sizeof(double));
    for (int s = log2_scale;; s += s > 0 ? -1 : 1) {
        memcpy(c->x, orig, (size_t)n * sizeof(double));
        scale_input(c, c->hidden, c->x, n, ldexp(1.0, s));
        c->value_log2 = s;
        if (dist == MT_VALUES_TINY || c->opt.dtype != MOE_F16 || s == 0)
            break;
        /* f16 and large: the expectation's own roundings must stay far from overflow */
        if (expect_rnd_peak(c) <= 0.25)
            break;
    }
    free(orig);
}

/* ---------------------------------------------------------------------------------------------------
 * the float64 forward (from SEMANTICS section 3) and its loss
 * ------------------------------------------------------------------------------------------------- */
static void limits(const mt_case *c, int *has, double *lim)
{
    has[0] = c->opt.has_linear_clamp_lower_limit, lim[0] = c->opt.linear_clamp_lower_limit;
    has[1] = c->opt.has_linear_clamp_upper_limit, lim[1] = c->opt.linear_clamp_upper_limit;
    has[2] = c->opt.has_non_linear_clamp_lower_limit, lim[2] = c->opt.non_linear_clamp_lower_limit;
    has[3] = c->opt.has_non_linear_clamp_upper_limit, lim[3] = c->opt.non_linear_clamp_upper_limit;
}

typedef struct params64 {
    double *x, *A, *wgu, *wd, *bgu, *bd;
} params64;

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
            m[i] = act64(c->opt.activation, g) * u;
        }
        for (int64_t h = 0; h < H; h++) {
            double d = c->opt.bias ? q->bd[e * H + h] : 0.0;
            for (int64_t i = 0; i < I; i++)
                d += m[i] * q->wd[(e * I + i) * H + h];
            out[t * H + h] += a * d;
        }
    }
}

static params64 case_params(const mt_case *c)
{
    return (params64){c->x, c->A, c->wgu, c->wd, c->bgu, c->bd};
}

void mt_forward64(const mt_case *c, double *out)
{
    double *m = dalloc(c->I);
    params64 q = case_params(c);
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

/* Central differences of L over every element of `arr` (NaN elements: never read, gradient 0). */
static void fd_array(const mt_case *c, params64 *q, double *arr, int64_t count, double *grad, double *out,
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

/* ---------------------------------------------------------------------------------------------------
 * running error arithmetic
 * ------------------------------------------------------------------------------------------------- */
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

static ev ex(double v) { return (ev){v, 0.0}; }

/* fl32(x*y) from computed operands */
static ev mul(ev x, ev y)
{
    const double prop = fabs(x.v) * y.e + fabs(y.v) * x.e + x.e * y.e;
    return (ev){x.v * y.v, prop + U32 * (fabs(x.v * y.v) + prop) + ETA32};
}

static void acc_prod(acc_t *a, ev x, ev y)
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
static void acc_split(acc_t *a, int split, int64_t terms, int stacked)
{
    a->terms = split ? terms : 1;
    a->stacked = stacked;
}

static void acc_term(acc_t *a, ev x)
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
static ev acc_done(const acc_t *a)
{
    const int64_t terms = a->terms > 1 ? a->terms : 1;
    const int64_t roundings = a->stacked ? a->n + (terms - 1) * a->n_prod : a->n + terms - 1;
    return (ev){a->v, a->prop + oracle_gamma(roundings) * a->mag + a->split_abs +
                          (double)a->n * (0x1p-52 * a->mag + (double)terms * ETA32)};
}

/* v rounded to float32, then to the dtype (round to nearest even both times): monotone in v, and the
 * dtype's rounding itself for a float32 v. */
static double round_dt(moe_dtype dt, double v)
{
    switch (dt) {
    case MOE_F16: return moe_f16_to_f32(moe_f32_to_f16((float)v));
    case MOE_BF16: return moe_bf16_to_f32(moe_f32_to_bf16((float)v));
    case MOE_F32: break;
    }
    return (float)v;
}

/* One rounding to a dtype (a float32 value stored as f32 is exact).
 *   exact_rounding = 0: the value stays the exact unrounded one and the rounding joins the bound,
 *     u_dt (|v| + e) + eta_dt: any correct implementation, whether it rounds here or not.
 *   exact_rounding = 1: the value is rounded (the spec's chain of rounded values) and the bound is the
 *     spread of the rounding over [v - e, v + e]: the implementation's float32 operand y lies in that
 *     interval and rounding is monotone, so round(y) lies between round(v - e) and round(v + e); where
 *     the interval holds no rounding boundary the bound is 0 and the rounded value is known exactly.
 *     Only an implementation that rounds exactly here meets it (MT_CHECK_EXACT_ROUNDING). */
static ev rnd(ev x, moe_dtype dt, int exact_rounding)
{
    if (dt == MOE_F32)
        return x;
    rnd_peak = fmax(rnd_peak, (fabs(x.v) + x.e) / largest_finite(dt));
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
    return (ev){act64(a, g.v), L1_ACT * g.e + 32.0 * U32 * (x + x * x) + ETA32};
}

/* act' in float32: SiLU, Swish and GELU are sums of products of O(1) factors (sigmoid, erf, exp) and
 * x, so their evaluation error is below 32 u (1 + |x|); GELU_Tanh's second term carries the cubic
 * 0.5 x (1 - t^2) c (1 + 0.134 x^2), whose absolute error grows like |x|^3 (bounded by 0.1 |x|^3
 * times the same 32 u). */
static ev dact_ev(moe_mlp_activation a, ev g)
{
    const double x = fabs(g.v) + g.e;
    const double cubic = a == MOE_ACT_GELU_TANH ? 0.1 * x * x * x : 0.0;
    return (ev){dact64(a, g.v), L2_ACT * g.e + 32.0 * U32 * (1.0 + x + cubic)};
}

/* ---------------------------------------------------------------------------------------------------
 * the analytic expectation of every output
 * ------------------------------------------------------------------------------------------------- */
typedef struct expect {
    ev *out, *ckpt_gu, *ckpt_d;   /* out [T1*H]; ckpt_gu [N*2I*B]; ckpt_d [N*B*H] */
    ev *dx, *da, *dwgu, *dwd, *dbgu, *dbd;
} expect;

static ev *evalloc(int64_t n)
{
    ev *p = xmalloc((size_t)(n > 0 ? n : 1) * sizeof(ev));
    for (int64_t i = 0; i < n; i++)
        p[i] = ex(0.0);
    return p;
}

static void expect_free(expect *x)
{
    free(x->out), free(x->ckpt_gu), free(x->ckpt_d), free(x->dx), free(x->da), free(x->dwgu), free(x->dwd);
    free(x->dbgu), free(x->dbd);
}

/* The real positions (a token's) grouped by key, ascending within a group: list[first[k] .. first[k + 1]) for key
 * k in [0, keys), the key of position p being its token (by_token) or its expert.  The expectation's sums over a
 * token's or an expert's positions walk these lists, in the ascending position order of a scan over all
 * positions (the sums are the same), in O(positions) instead of O(keys x positions) (E = 700 took seconds). */
static void group_positions(const mt_case *c, int by_token, int64_t keys, int64_t **first, int64_t **list)
{
    const int64_t NB = c->N * c->B;
    int64_t *f = xmalloc((size_t)(keys + 1) * sizeof(int64_t)), *l = xmalloc((size_t)(NB + 1) * sizeof(int64_t));
    for (int64_t k = 0; k <= keys; k++)
        f[k] = 0;
    for (int64_t p = 0; p < NB; p++)
        if (is_tok(c, c->ids[p]))
            f[(by_token ? c->ids[p] : pos_expert(c, p)) + 1]++;
    for (int64_t k = 0; k < keys; k++)
        f[k + 1] += f[k];
    int64_t *next = xmalloc((size_t)(keys + 1) * sizeof(int64_t));
    for (int64_t k = 0; k < keys; k++)
        next[k] = f[k];
    for (int64_t p = 0; p < NB; p++)
        if (is_tok(c, c->ids[p]))
            l[next[by_token ? c->ids[p] : pos_expert(c, p)]++] = p;
    free(next);
    *first = f, *list = l;
}

/* old_*: the gradient buffers' contents before the call (accumulate), as double, or NULL.
 * exact_rounding: how every rounding to a dtype enters (rnd). */
static void compute_expect(const mt_case *c, const double *old_wgu, const double *old_wd, const double *old_bgu,
                           const double *old_bd, int down_ckpt_in_bwd, int exact_rounding, int split_backend,
                           expect *X)
{
    const int64_t H = c->H, I = c->I, I2 = 2 * I, E = c->E, B = c->B, NB = c->N * c->B, T = c->T;
    const moe_dtype dt = c->opt.dtype, gdt = c->opt.grad_fp32 ? MOE_F32 : dt;
    const int on_i = c->opt.affinity == MOE_AFFINITY_ON_I, bias = c->opt.bias;
    /* options.round_intermediates: the operands of the second-stage GEMMs are rounded to dt (specs/MLP.md,
     * "Rounded intermediates"); `inter` is dt then, float32 (no rounding) otherwise */
    const moe_dtype inter = c->opt.round_intermediates ? dt : MOE_F32;
    /* split operands (mt_split_operands): m, a*m and (dg, du) as 3 bf16 terms.  There ON_H's backward moves
     * the affinity as ON_I does, dM = a * (G . W_d^T) and d_w_d += (a*m)^T . G, which the ON_H bound below
     * covers: its a*G carries the product's rounding u |a G| into every term that the other form's single
     * product rounding (of a times the sum, or a*m) can reach (specs/MLP.md) */
    const int split = split_backend && dt == MOE_BF16 && !c->opt.round_intermediates;
    const int xr = exact_rounding;
    const moe_mlp_activation act = c->opt.activation;
    int has[4];
    double lim[4];
    limits(c, has, lim);
    X->out = evalloc(c->T1 * H), X->ckpt_gu = evalloc(c->N * I2 * B), X->ckpt_d = evalloc(NB * H);
    X->dx = evalloc(c->T1 * H), X->da = evalloc(T * E), X->dwgu = evalloc(E * H * I2), X->dwd = evalloc(E * I * H);
    X->dbgu = evalloc(E * I2), X->dbd = evalloc(E * H);

    /* per position quantities */
    ev *c_out = evalloc(NB * H), *dx_s = evalloc(NB * H), *dgu = evalloc(NB * I2), *mw = evalloc(NB * I);
    ev *dsrc = evalloc(NB * H), *dD = evalloc(NB * H);
    ev *gF = evalloc(I2), *gB = evalloc(I2), *mF = evalloc(I), *mF0 = evalloc(I), *mB0 = evalloc(I);
    ev *d_bwd = evalloc(H), *dM = evalloc(I);
    /* round_intermediates: the unscaled m as the down checkpoint (forward) and the recomputed d
     * (backward) multiply it */
    ev *mF0r = evalloc(I), *mB0r = evalloc(I);
    int *free_mask = xmalloc((size_t)(I2 + 1) * sizeof(int));
    for (int64_t p = 0; p < NB; p++) {
        const int64_t t = c->ids[p];
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
            free_mask[j] = (!has[lo] || lim[lo] < v.v) && (!has[lo + 1] || v.v < lim[lo + 1]);
            gF[j] = v;
            gB[j] = rnd(v, dt, xr);
            X->ckpt_gu[(blk * I2 + j) * B + b] = gB[j];
        }
        for (int64_t i = 0; i < I; i++) {
            /* forward: m from the unrounded g, u (ON_I: times a), then the down projection's operand */
            mF0[i] = mul(act_ev(act, gF[i]), gF[I + i]);
            mF[i] = rnd(on_i ? mul(mF0[i], ex(a)) : mF0[i], inter, xr);
            mF0r[i] = rnd(mF0[i], inter, xr);
            /* backward: m from the rounded checkpoints; dW_d's operand (ON_I: a*m) */
            mB0[i] = mul(act_ev(act, gB[i]), gB[I + i]);
            mB0r[i] = rnd(mB0[i], inter, xr);
            mw[p * I + i] = rnd(on_i ? mul(mB0[i], ex(a)) : mB0[i], inter, xr);
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
            const ev dfwd = acc_done(&s), ckpt = rnd(acc_done(&s0), dt, xr);
            X->ckpt_d[p * H + h] = ckpt;
            c_out[p * H + h] = on_i ? dfwd : mul(ex(a), dfwd);
            d_bwd[h] = (on_i && !down_ckpt_in_bwd) ? acc_done(&sb) : ckpt;
            dD[p * H + h] = rnd(mul(ex(a), ex(c->g[t * H + h])), inter, xr);
            dsrc[p * H + h] = on_i ? ex(c->g[t * H + h]) : dD[p * H + h];
        }
        {
            acc_t s = {0};
            for (int64_t h = 0; h < H; h++)
                acc_prod(&s, ex(c->g[t * H + h]), d_bwd[h]);
            X->da[t * E + e] = rnd(acc_done(&s), dt, xr);
        }
        for (int64_t i = 0; i < I; i++) {
            acc_t s = {0};
            for (int64_t h = 0; h < H; h++)
                acc_prod(&s, dsrc[p * H + h], ex(c->wd[(e * I + i) * H + h]));
            dM[i] = on_i ? mul(ex(a), acc_done(&s)) : acc_done(&s);
            dgu[p * I2 + i] = free_mask[i] ? rnd(mul(mul(dM[i], gB[I + i]), dact_ev(act, gB[i])), inter, xr) : ex(0.0);
            dgu[p * I2 + I + i] = free_mask[I + i] ? rnd(mul(dM[i], act_ev(act, gB[i])), inter, xr) : ex(0.0);
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
            X->out[t * H + h] = rnd(acc_done(&so), dt, xr);
            X->dx[t * H + h] = rnd(acc_done(&sx), dt, xr);
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
                X->dwd[(e * I + i) * H + h] = rnd(acc_done(&s), gdt, xr);
            }
        for (int64_t h = 0; h < H; h++)
            for (int64_t j = 0; j < I2; j++) {
                acc_t s = {0};
                acc_split(&s, split, 3, 1);
                for (int64_t q = expert_first[e]; q < expert_first[e + 1]; q++) {
                    const int64_t p = expert_pos[q];
                    acc_prod(&s, ex(c->x[c->ids[p] * H + h]), dgu[p * I2 + j]);
                }
                if (old_wgu)
                    acc_term(&s, ex(old_wgu[(e * H + h) * I2 + j]));
                X->dwgu[(e * H + h) * I2 + j] = rnd(acc_done(&s), gdt, xr);
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
                X->dbd[e * H + h] = rnd(acc_done(&s), gdt, xr);
            }
            for (int64_t j = 0; j < I2; j++) {
                acc_t s = {0};
                for (int64_t q = expert_first[e]; q < expert_first[e + 1]; q++) {
                    const int64_t p = expert_pos[q];
                    acc_term(&s, dgu[p * I2 + j]);
                }
                if (old_bgu)
                    acc_term(&s, ex(old_bgu[e * I2 + j]));
                X->dbgu[e * I2 + j] = rnd(acc_done(&s), gdt, xr);
            }
        }
    }
    free(c_out), free(dx_s), free(dgu), free(mw), free(dsrc), free(dD), free(gF), free(gB), free(mF);
    free(mF0), free(mB0), free(d_bwd), free(dM), free(free_mask), free(mF0r), free(mB0r);
    free(token_first), free(token_pos), free(expert_first), free(expert_pos);
}

/* rnd_peak of the case's analytic expectation (no accumulate contents: they add at most 1) */
static double expect_rnd_peak(const mt_case *c)
{
    expect X;
    rnd_peak = 0.0;
    compute_expect(c, NULL, NULL, NULL, NULL, 1, 0, 0, &X);
    expect_free(&X);
    return rnd_peak;
}

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

/* ---------------------------------------------------------------------------------------------------
 * running the reference and checking
 * ------------------------------------------------------------------------------------------------- */
static void *talloc(moe_dtype dt, int64_t n)
{
    void *p = xmalloc((size_t)(n > 0 ? n : 1) * moe_dtype_size(dt));
    oracle_poison(dt, p, n);
    return p;
}

void mt_result_free(mt_result *r)
{
    void *ps[] = {r->out, r->ckpt_gu, r->ckpt_d, r->d_hidden, r->d_aff, r->d_wgu, r->d_wd, r->d_bgu, r->d_bd};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
        free(ps[i]);
    memset(r, 0, sizeof *r);
}

/* Compares got[i] with the analytic want[i] (within want.e) and, when fd is non-NULL, with the finite
 * difference fd[i] + base[i] (within want.e + the finite-difference error fd_err). */
static int64_t compare(const mt_case *c, const char *label, moe_dtype dt, const void *got, const ev *want,
                       const double *fd, const double *base, double fd_err, int64_t count, int checks)
{
    int64_t bad = 0;
    for (int64_t i = 0; i < count; i++) {
        const double gv = oracle_load(dt, got, i), wv = want[i].v, bound = want[i].e;
        const double fv = fd ? fd[i] + (base ? base[i] : 0.0) : wv;
        int fail = !isfinite(gv) && isfinite(wv);
        if ((checks & MT_CHECK_BOUND) && fabs(gv - wv) > bound)
            fail = 1;
        if (checks & MT_CHECK_BOUND) {
            double ratio = bound > 0 ? fabs(gv - wv) / bound : (gv == wv ? 0.0 : INFINITY);
            if (isnan(ratio))
                ratio = INFINITY;
            if (ratio > mt_worst_ratio)
                mt_worst_ratio = ratio;
        }
        if ((checks & MT_CHECK_FD) && fd) {
            if (fabs(gv - fv) > bound + fd_err)
                fail = 1;
            if (fabs(wv - fv) > fd_err)
                fail = 2;
        }
        if (fail) {
            if (bad < 6 && fd)
                fprintf(stderr,
                        "  %s[%lld]: got %.9g, analytic %.9g, finite difference %.9g, bound %.3g (+fd %.3g)%s "
                        "[seed %llu]\n",
                        label, (long long)i, gv, wv, fv, bound, fd_err,
                        fail == 2 ? " (analytic vs finite difference)" : "", (unsigned long long)c->seed);
            else if (bad < 6)
                fprintf(stderr, "  %s[%lld]: got %.9g, analytic %.9g, bound %.3g [seed %llu]\n", label, (long long)i,
                        gv, wv, bound, (unsigned long long)c->seed);
            bad++;
        }
    }
    return bad;
}

static void describe(const mt_case *c, FILE *f)
{
    const moe_mlp_options *o = &c->opt;
    fprintf(f, "case seed %llu: T=%lld E=%lld k=%lld H=%lld I=%lld B=%lld N=%lld dtype=%s act=%d aff=%s bias=%d "
            "pad=%s clamps=%d%d%d%d overwrite=%d accumulate=%d grad_fp32=%d round_intermediates=%d values=%s "
            "(2^%d)\n",
            (unsigned long long)c->seed, (long long)c->T, (long long)c->E, (long long)c->k, (long long)c->H,
            (long long)c->I, (long long)c->B, (long long)c->N, moe_dtype_name(o->dtype), (int)o->activation,
            o->affinity ? "ON_I" : "ON_H", o->bias, o->padding ? "row" : "skip", o->has_linear_clamp_lower_limit,
            o->has_linear_clamp_upper_limit, o->has_non_linear_clamp_lower_limit,
            o->has_non_linear_clamp_upper_limit, o->tensor_update_overwrite, o->accumulate, o->grad_fp32,
            o->round_intermediates, mt_value_dist_name(c->value_dist), c->value_log2);
}

static double *to_double(moe_dtype dt, const void *src, int64_t n)
{
    double *d = dalloc(n);
    for (int64_t i = 0; i < n; i++)
        d[i] = oracle_load(dt, src, i);
    return d;
}

/* With accumulate: the starting contents of d_w_gu, d_w_d, d_b_gu, d_b_d (the non-NULL ones of bufs, of
 * the gradient dtype), random from the case's seed, written into bufs and returned as doubles in old
 * (free them); without accumulate old stays NULL. */
static void start_grads(const mt_case *c, void *bufs[4], double *old[4])
{
    const int64_t H = c->H, I = c->I, I2 = 2 * c->I, E = c->E;
    const moe_dtype gdt = c->opt.grad_fp32 ? MOE_F32 : c->opt.dtype;
    if (!c->opt.accumulate)
        return;
    oracle_rng rng = {c->seed * 7 + 3};
    const int64_t counts[4] = {E * H * I2, E * I * H, E * I2, E * H};
    for (int q = 0; q < 4; q++)
        if (bufs[q]) {
            oracle_fill(&rng, gdt, bufs[q], counts[q], 0);
            old[q] = to_double(gdt, bufs[q], counts[q]);
        }
}

/* Every output of r against the expectation X (labels get `suffix`); fd[6] (d_hidden, d_affinities,
 * d_w_gu, d_w_d, d_b_gu, d_b_d, or NULL each) the finite differences, old[4] the gradients' starting
 * contents (accumulate) or NULL. */
static int64_t compare_all(const mt_case *c, const mt_result *r, const expect *X, const double *const fd[6],
                           double *const old[4], double fd_err, int checks, const char *suffix)
{
    const int64_t H = c->H, I = c->I, I2 = 2 * I, E = c->E, NB = c->N * c->B, T = c->T;
    const moe_dtype dt = c->opt.dtype, gdt = c->opt.grad_fp32 ? MOE_F32 : dt;
    const int bchk = checks & MT_CHECK_BOUND;
    struct {
        const char *name;
        moe_dtype dt;
        const void *got;
        const ev *want;
        const double *fd, *base;
        int64_t n;
        int checks;
    } items[] = {
        {"out", dt, r->out, X->out, NULL, NULL, c->T1 * H, bchk},
        /* checkpoints: analytic value within bound (padding positions exactly +0 via a zero bound) */
        {"gate_up_ckpt_T", dt, r->ckpt_gu, X->ckpt_gu, NULL, NULL, c->N * I2 * c->B, bchk},
        {"down_ckpt", dt, r->ckpt_d, X->ckpt_d, NULL, NULL, NB * H, bchk},
        {"d_hidden", dt, r->d_hidden, X->dx, fd[0], NULL, c->T1 * H, checks},
        {"d_affinities", dt, r->d_aff, X->da, fd[1], NULL, T * E, checks},
        {"d_w_gu", gdt, r->d_wgu, X->dwgu, fd[2], old[0], E * H * I2, checks},
        {"d_w_d", gdt, r->d_wd, X->dwd, fd[3], old[1], E * I * H, checks},
        {"d_b_gu", gdt, r->d_bgu, X->dbgu, fd[4], old[2], c->opt.bias ? E * I2 : 0, checks},
        {"d_b_d", gdt, r->d_bd, X->dbd, fd[5], old[3], c->opt.bias ? E * H : 0, checks},
    };
    int64_t bad = 0;
    for (size_t k = 0; k < sizeof items / sizeof items[0]; k++) {
        char label[64];
        snprintf(label, sizeof label, "%s%s", items[k].name, suffix);
        bad += compare(c, label, items[k].dt, items[k].got, items[k].want, items[k].fd, items[k].base, fd_err,
                       items[k].n, items[k].checks);
    }
    return bad;
}

mt_fwd_fn mt_mlp_fwd = moe_mlp_fwd;
mt_bwd_fn mt_mlp_bwd = moe_mlp_bwd;
moe_backend mt_backend = MOE_BACKEND_REF;
int mt_split_operands = 0;

int64_t mt_run(const mt_case *c, int checks, int down_ckpt_in_bwd, mt_result *res)
{
    const int64_t H = c->H, I = c->I, I2 = 2 * I, E = c->E, NB = c->N * c->B, T = c->T;
    const moe_dtype dt = c->opt.dtype, gdt = c->opt.grad_fp32 ? MOE_F32 : dt;
    const int bias = c->opt.bias;
    mt_result r;
    r.out = talloc(dt, c->T1 * H);
    r.ckpt_gu = talloc(dt, c->N * I2 * c->B);
    r.ckpt_d = talloc(dt, NB * H);
    r.d_hidden = talloc(dt, c->T1 * H);
    r.d_aff = talloc(dt, T * E);
    r.d_wgu = talloc(gdt, E * H * I2);
    r.d_wd = talloc(gdt, E * I * H);
    r.d_bgu = bias ? talloc(gdt, E * I2) : NULL;
    r.d_bd = bias ? talloc(gdt, E * H) : NULL;
    double *old[4] = {NULL, NULL, NULL, NULL};
    void *bufs[4] = {r.d_wgu, r.d_wd, r.d_bgu, r.d_bd};
    start_grads(c, bufs, old);

    moe_mlp_options fo = c->opt;
    fo.accumulate = 0;
    fo.grad_fp32 = 0;
    moe_status st = mt_mlp_fwd(mt_backend, &c->layout, H, I, c->hidden, c->aff, c->w_gu, c->w_d,
                               bias ? c->b_gu : NULL, bias ? c->b_d : NULL, r.out, r.ckpt_gu, r.ckpt_d, &fo);
    if (st != MOE_OK) {
        describe(c, stderr);
        REQUIRE(0, "moe_mlp_fwd: %s (%s)", moe_strerror(st), moe_last_error());
    }
    st = mt_mlp_bwd(mt_backend, &c->layout, H, I, c->hidden, c->aff, c->w_gu, c->w_d,
                    bias ? c->b_d : NULL, r.ckpt_gu, down_ckpt_in_bwd ? r.ckpt_d : NULL, c->G, r.d_hidden,
                    r.d_aff, r.d_wgu, r.d_wd, r.d_bgu, r.d_bd, &c->opt);
    if (st != MOE_OK) {
        describe(c, stderr);
        REQUIRE(0, "moe_mlp_bwd: %s (%s)", moe_strerror(st), moe_last_error());
    }

    expect X;
    compute_expect(c, old[0], old[1], old[2], old[3], down_ckpt_in_bwd, 0, mt_split_operands, &X);

    /* finite differences of L = <G, out> */
    double *fd_x = NULL, *fd_a = NULL, *fd_wgu = NULL, *fd_wd = NULL, *fd_bgu = NULL, *fd_bd = NULL;
    double fd_err = 0.0;
    if (checks & MT_CHECK_FD) {
        params64 q = case_params(c); /* its arrays are perturbed and restored */
        double *out = dalloc(c->T1 * H), *m = dalloc(I);
        fd_x = dalloc(c->T1 * H), fd_a = dalloc(T * E), fd_wgu = dalloc(E * H * I2), fd_wd = dalloc(E * I * H);
        fd_bgu = dalloc(E * I2), fd_bd = dalloc(E * H);
        fd_array(c, &q, q.x, c->T1 * H, fd_x, out, m);
        fd_array(c, &q, q.A, T * E, fd_a, out, m);
        fd_array(c, &q, q.wgu, E * H * I2, fd_wgu, out, m);
        fd_array(c, &q, q.wd, E * I * H, fd_wd, out, m);
        if (bias) {
            fd_array(c, &q, q.bgu, E * I2, fd_bgu, out, m);
            fd_array(c, &q, q.bd, E * H, fd_bd, out, m);
        }
        /* finite-difference error: the rounding of L (depth ~ H + 3I + k terms, magnitude Lmag) divided
         * by the step, plus the truncation step^2/6 * |L'''|; for data in [-1, 1) every third
         * derivative is a sum of at most k*H*I terms each below 8 (specs/MLP.md) */
        double lmag = 0.0;
        for (int64_t i = 0; i < T * H; i++)
            lmag += fabs(c->g[i]) * (fabs(X.out[i].v) + 1.0);
        fd_err = 4.0 * (double)(H + 3 * I + c->k + 8) * 0x1p-53 * lmag / FD_STEP +
                 (double)(c->k * (H + 1) * (I + 1)) * 8.0 / 6.0 * FD_STEP * FD_STEP;
        free(out);
        free(m);
    }

    const double *fds[6] = {fd_x, fd_a, fd_wgu, fd_wd, fd_bgu, fd_bd};
    int64_t bad = compare_all(c, &r, &X, fds, old, fd_err, checks, "");
    if (checks & MT_CHECK_EXACT_ROUNDING) {
        expect XR;
        const double *no_fd[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
        compute_expect(c, old[0], old[1], old[2], old[3], down_ckpt_in_bwd, 1, mt_split_operands, &XR);
        /* mt_worst_ratio stays the first bound's: here a correct result that rounded to the other
         * neighbour of a boundary inside the interval sits at ratio 1 exactly */
        const double worst = mt_worst_ratio;
        bad += compare_all(c, &r, &XR, no_fd, old, 0.0, MT_CHECK_BOUND, " (exact roundings)");
        mt_worst_ratio = worst;
        expect_free(&XR);
    }
    if (bad)
        describe(c, stderr);
    expect_free(&X);
    free(fd_x), free(fd_a), free(fd_wgu), free(fd_wd), free(fd_bgu), free(fd_bd);
    for (int q = 0; q < 4; q++)
        free(old[q]);
    r.split_operands = mt_split_operands;
    if (res)
        *res = r;
    else
        mt_result_free(&r);
    return bad;
}

/* Where element i of a result tensor of c1 sits in c2's labelling (token_map / expert_map NULL: the
 * same labels).  kind 0: token rows of `per` elements; 1: (token, expert) pairs [T][E]; 2: expert
 * blocks of `per` elements. */
static int64_t relabelled_index(int kind, int64_t per, int64_t E, const int64_t *token_map, const int64_t *expert_map,
                                int64_t i)
{
    switch (kind) {
    case 0: return token_map ? token_map[i / per] * per + i % per : i;
    case 1: return (token_map ? token_map[i / E] : i / E) * E + (expert_map ? expert_map[i % E] : i % E);
    default: return expert_map ? expert_map[i / per] * per + i % per : i;
    }
}

static int64_t compare_results_mapped(const mt_case *c1, const mt_result *r1, const mt_case *c2, const mt_result *r2,
                                      const int64_t *token_map, const int64_t *expert_map, const char *what)
{
    /* with accumulate, each result started from mt_run's contents for its case (the rounding of
     * old + sum is part of the bound) */
    expect X1, X2;
    double *old1[4] = {NULL, NULL, NULL, NULL}, *old2[4] = {NULL, NULL, NULL, NULL};
    const moe_dtype gdt1 = c1->opt.grad_fp32 ? MOE_F32 : c1->opt.dtype;
    const moe_dtype gdt2 = c2->opt.grad_fp32 ? MOE_F32 : c2->opt.dtype;
    const int64_t n1[4] = {mt_count_wgu(c1), mt_count_wd(c1), c1->opt.bias ? c1->E * 2 * c1->I : 0,
                           c1->opt.bias ? c1->E * c1->H : 0};
    const int64_t n2[4] = {mt_count_wgu(c2), mt_count_wd(c2), c2->opt.bias ? c2->E * 2 * c2->I : 0,
                           c2->opt.bias ? c2->E * c2->H : 0};
    void *tmp1[4], *tmp2[4];
    for (int q = 0; q < 4; q++) {
        tmp1[q] = q < 2 || c1->opt.bias ? talloc(gdt1, n1[q]) : NULL;
        tmp2[q] = q < 2 || c2->opt.bias ? talloc(gdt2, n2[q]) : NULL;
    }
    start_grads(c1, tmp1, old1);
    start_grads(c2, tmp2, old2);
    compute_expect(c1, old1[0], old1[1], old1[2], old1[3], 1, 0, r1->split_operands, &X1);
    compute_expect(c2, old2[0], old2[1], old2[2], old2[3], 1, 0, r2->split_operands, &X2);
    for (int q = 0; q < 4; q++) {
        free(tmp1[q]), free(tmp2[q]);
        free(old1[q]), free(old2[q]);
    }
    const int64_t H = c1->H, I2 = 2 * c1->I, E = c1->E, T = c1->T;
    const moe_dtype dt = c1->opt.dtype, gdt = c1->opt.grad_fp32 ? MOE_F32 : dt;
    struct {
        const char *name;
        moe_dtype dt;
        const void *a, *b;
        const ev *ea, *eb;
        int64_t n;
        int kind;    /* relabelled_index */
        int64_t per;
    } items[] = {
        {"out", dt, r1->out, r2->out, X1.out, X2.out, T * H, 0, H},
        {"d_hidden", dt, r1->d_hidden, r2->d_hidden, X1.dx, X2.dx, T * H, 0, H},
        {"d_affinities", dt, r1->d_aff, r2->d_aff, X1.da, X2.da, T * E, 1, E},
        {"d_w_gu", gdt, r1->d_wgu, r2->d_wgu, X1.dwgu, X2.dwgu, E * H * I2, 2, H * I2},
        {"d_w_d", gdt, r1->d_wd, r2->d_wd, X1.dwd, X2.dwd, E * c1->I * H, 2, c1->I * H},
        {"d_b_gu", gdt, r1->d_bgu, r2->d_bgu, X1.dbgu, X2.dbgu, c1->opt.bias ? E * I2 : 0, 2, I2},
        {"d_b_d", gdt, r1->d_bd, r2->d_bd, X1.dbd, X2.dbd, c1->opt.bias ? E * H : 0, 2, H},
    };
    int64_t bad = 0;
    for (size_t k = 0; k < sizeof items / sizeof items[0]; k++)
        for (int64_t i = 0; i < items[k].n; i++) {
            const int64_t j = relabelled_index(items[k].kind, items[k].per, E, token_map, expert_map, i);
            const double a = oracle_load(items[k].dt, items[k].a, i), b = oracle_load(items[k].dt, items[k].b, j);
            const double bound = items[k].ea[i].e + items[k].eb[j].e;
            if (!(fabs(a - b) <= bound)) {
                if (bad < 6 && what != NULL)
                    fprintf(stderr, "  %s: %s[%lld] vs [%lld]: %.9g vs %.9g, |diff| %.3g > bound %.3g [seed %llu]\n",
                            what, items[k].name, (long long)i, (long long)j, a, b, fabs(a - b), bound,
                            (unsigned long long)c1->seed);
                bad++;
            }
        }
    expect_free(&X1);
    expect_free(&X2);
    return bad;
}

int64_t mt_compare_results(const mt_case *c1, const mt_result *r1, const mt_case *c2, const mt_result *r2,
                           const char *what)
{
    return compare_results_mapped(c1, r1, c2, r2, NULL, NULL, what);
}

int64_t mt_compare_relabelled(const mt_case *c1, const mt_result *r1, const mt_case *c2, const mt_result *r2,
                              const int64_t *token_map, const int64_t *expert_map, const char *what)
{
    return compare_results_mapped(c1, r1, c2, r2, token_map, expert_map, what);
}

int mt_results_identical(const mt_case *c, const mt_result *r1, const mt_result *r2, int with_ckpts)
{
    const size_t es = moe_dtype_size(c->opt.dtype);
    const size_t gs = c->opt.grad_fp32 ? 4 : es;
    const int64_t H = c->H, I2 = 2 * c->I, E = c->E;
#define SAME(a, b, bytes) (memcmp((a), (b), (bytes)) == 0)
    int same = SAME(r1->out, r2->out, (size_t)(c->T1 * H) * es) &&
               SAME(r1->d_hidden, r2->d_hidden, (size_t)(c->T1 * H) * es) &&
               SAME(r1->d_aff, r2->d_aff, (size_t)(c->T * E) * es) &&
               SAME(r1->d_wgu, r2->d_wgu, (size_t)(E * H * I2) * gs) &&
               SAME(r1->d_wd, r2->d_wd, (size_t)(E * c->I * H) * gs);
    if (c->opt.bias)
        same = same && SAME(r1->d_bgu, r2->d_bgu, (size_t)(E * I2) * gs) && SAME(r1->d_bd, r2->d_bd, (size_t)(E * H) * gs);
    if (with_ckpts)
        same = same && SAME(r1->ckpt_gu, r2->ckpt_gu, (size_t)(c->N * I2 * c->B) * es) &&
               SAME(r1->ckpt_d, r2->ckpt_d, (size_t)(c->N * c->B * H) * es);
#undef SAME
    return same;
}
