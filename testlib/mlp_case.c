/* The MLP test library's case generator: random routings and layouts (dropless, dropping, shuffled),
 * inputs of every value distribution, relabelled copies, weight scaling; see mlp_testlib.h. */
#include "mlp_internal.h"
#include "check.h"

#include <math.h>
#include <string.h>

double mt_load(moe_dtype dtype, const void *base, int64_t i) { return oracle_load(dtype, base, i); }

int64_t mt_count_wgu(const mt_case *c) { return c->E * c->H * 2 * c->I; }
int64_t mt_count_wd(const mt_case *c) { return c->E * c->I * c->H; }

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
        case MOE_E4M3: ((uint8_t *)buf)[i] = moe_f32_to_e4m3(v); break;
        case MOE_E5M2: ((uint8_t *)buf)[i] = moe_f32_to_e5m2(v); break;
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
        if (mt_expect_rnd_peak(c) <= 0.25)
            break;
    }
    free(orig);
}
