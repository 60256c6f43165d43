/*
 * The helper modes of test_cli_npy that the tests/test_cli_*.sh scripts call to make their files (no numpy
 * needed): mk, info, relayout, gen and genmlp (tests/test_cli_npy.c's header lists their arguments).
 */
#include "moe.h"
#include "moe_mlp.h"
#include "../cli/npy.h"
#include "mlp_testlib.h"
#include "oracle.h"
#include "alloc.h"
#include "check.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "cli_fixtures.h"

static int parse_descr_arg(const char *descr, npy_type *type)
{
    for (int t = 0; t < NPY_T_COUNT; t++)
        if (strcmp(descr, npy_type_descr((npy_type)t)) == 0) {
            *type = (npy_type)t;
            return 1;
        }
    return 0;
}

int mk(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: test_cli_npy mk FILE DESCR SHAPE [v1|v2|v3] VALUE...\n");
        return 2;
    }
    npy_type type;
    if (!parse_descr_arg(argv[2], &type)) {
        fprintf(stderr, "mk: unknown descr %s\n", argv[2]);
        return 2;
    }
    int64_t shape[NPY_MAX_DIMS], count = 1;
    int ndim = 0;
    for (const char *p = argv[3]; *p;) {
        char *end;
        shape[ndim] = strtoll(p, &end, 10);
        count *= shape[ndim++];
        p = *end == ',' ? end + 1 : end;
        if (end == p && *p) {
            fprintf(stderr, "mk: bad shape %s\n", argv[3]);
            return 2;
        }
    }
    int first = 4, version = 1;
    if (argc > 4 && argv[4][0] == 'v' && argv[4][1] >= '1' && argv[4][1] <= '3' && argv[4][2] == '\0') {
        version = argv[4][1] - '0';
        first = 5;
    }
    const int nvalues = argc - first;
    if (count > 0 && nvalues == 0) {
        fprintf(stderr, "mk: no values\n");
        return 2;
    }
    unsigned char *data = xmalloc((size_t)count * npy_type_size(type));
    for (int64_t i = 0; i < count; i++) {
        const char *s = argv[first + i % nvalues];
        const double v = strtod(s, NULL);
        const long long iv = strtoll(s, NULL, 0);
        switch (type) {
        case NPY_T_F16: ((uint16_t *)data)[i] = npy_f64_to_f16(v); break;
        case NPY_T_F32: ((float *)data)[i] = npy_f64_to_f32(v); break;
        case NPY_T_F64: ((double *)data)[i] = v; break;
        case NPY_T_I32: ((int32_t *)data)[i] = (int32_t)iv; break;
        case NPY_T_I64: ((int64_t *)data)[i] = (int64_t)iv; break;
        case NPY_T_U16:
        case NPY_T_V2: ((uint16_t *)data)[i] = (uint16_t)iv; break;
        case NPY_T_U8: data[i] = (unsigned char)iv; break;
        case NPY_T_COUNT: break;
        }
    }
    char err[NPY_ERROR_SIZE];
    int rc = npy_write(argv[1], type, ndim, shape, data, version, err, sizeof err);
    free(data);
    if (rc != 0) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    return 0;
}

int info(const char *path)
{
    npy_array a;
    char err[NPY_ERROR_SIZE], shape[512];
    if (npy_read(path, &a, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    printf("%s %s\n", npy_type_descr(a.h.type), npy_format_shape(shape, sizeof shape, a.h.ndim, a.h.shape));
    npy_free(&a);
    return 0;
}

/* Parses "a,b,c" into at most NPY_MAX_DIMS numbers; returns their count, or -1. */
static int parse_list(const char *text, int64_t *v)
{
    int n = 0;
    for (const char *p = text; *p && n < NPY_MAX_DIMS;) {
        char *end;
        v[n++] = strtoll(p, &end, 10);
        if (end == p)
            return -1;
        p = *end == ',' ? end + 1 : end;
    }
    return n;
}

/* relayout IN OUT AXES SHAPE [PART PARTS]: IN's array transposed by AXES (numpy's transpose), written
 * to OUT with SHAPE (a reshape: the same count); with PART and PARTS only part PART of PARTS equal
 * consecutive pieces of the transposed elements (SHAPE is the piece's).  The tests' own layout
 * conversion, written apart from cli/layouts.c. */
int relayout(int argc, char **argv)
{
    npy_array a;
    char err[NPY_ERROR_SIZE];
    int64_t axes[NPY_MAX_DIMS], shape[NPY_MAX_DIMS];
    if (npy_read(argv[0], &a, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    const int naxes = parse_list(argv[2], axes), ndim = parse_list(argv[3], shape);
    const int64_t part = argc == 6 ? strtoll(argv[4], NULL, 10) : 0, parts = argc == 6 ? strtoll(argv[5], NULL, 10) : 1;
    if (naxes != a.h.ndim || ndim < 0 || parts < 1 || part < 0 || part >= parts) {
        fprintf(stderr, "relayout: %d axes for %d dimensions, or a bad shape or part\n", naxes, a.h.ndim);
        return 2;
    }
    int64_t count = 1, stride[NPY_MAX_DIMS], size[NPY_MAX_DIMS], idx[NPY_MAX_DIMS] = {0};
    for (int d = 0; d < ndim; d++)
        count *= shape[d];
    if (count * parts != a.h.count) {
        fprintf(stderr, "relayout: shape %s holds %lld elements, %lld expected\n", argv[3], (long long)count,
                (long long)(a.h.count / parts));
        return 2;
    }
    for (int d = 0; d < naxes; d++) { /* output axis d walks input axis axes[d] */
        size[d] = a.h.shape[axes[d]];
        stride[d] = 1;
        for (int e = (int)axes[d] + 1; e < a.h.ndim; e++)
            stride[d] *= a.h.shape[e];
    }
    const size_t es = npy_type_size(a.h.type);
    unsigned char *out = xmalloc((size_t)count * es + 1);
    for (int64_t p = 0; p < a.h.count; p++) {
        int64_t q = 0;
        for (int d = 0; d < naxes; d++)
            q += idx[d] * stride[d];
        if (p / count == part)
            memcpy(out + (size_t)(p % count) * es, (const unsigned char *)a.data + (size_t)q * es, es);
        for (int d = naxes - 1; d >= 0; d--) {
            if (++idx[d] < size[d])
                break;
            idx[d] = 0;
        }
    }
    const int rc = npy_write(argv[1], a.h.type, ndim, shape, out, 1, err, sizeof err);
    free(out);
    npy_free(&a);
    if (rc != 0)
        fprintf(stderr, "%s\n", err);
    return rc != 0 ? 2 : 0;
}

static void save(const char *dir, const char *name, npy_type type, int ndim, const int64_t *shape, const void *data)
{
    char path[1024], err[NPY_ERROR_SIZE];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (npy_write(path, type, ndim, shape, data, 2, err, sizeof err) != 0) { /* format 2.0: the CLI reads it */
        fprintf(stderr, "%s\n", err);
        exit(2);
    }
}

/* Saves a result of dtype as float32 (what the CLI writes without --raw), and with raw as the dtype. */
static void save_result(const char *dir, const char *name, moe_dtype dtype, int raw, int ndim, const int64_t *shape,
                        const void *data)
{
    int64_t count = 1;
    for (int d = 0; d < ndim; d++)
        count *= shape[d];
    if (raw) {
        save(dir, name, dtype == MOE_F32 ? NPY_T_F32 : dtype == MOE_F16 ? NPY_T_F16 : NPY_T_U16, ndim, shape, data);
        return;
    }
    float *f = xmalloc((size_t)count * 4);
    for (int64_t i = 0; i < count; i++)
        f[i] = (float)oracle_load(dtype, data, i);
    save(dir, name, NPY_T_F32, ndim, shape, f);
    free(f);
}

static int parse_dtype_name(const char *name, moe_dtype *dtype)
{
    static const char *const names[] = {"f32", "f16", "bf16"};
    static const moe_dtype dtypes[] = {MOE_F32, MOE_F16, MOE_BF16};
    for (int i = 0; i < 3; i++)
        if (strcmp(name, names[i]) == 0) {
            *dtype = dtypes[i];
            return 1;
        }
    return 0;
}

static void must(moe_status status, const char *what)
{
    if (status != MOE_OK) {
        fprintf(stderr, "gen: %s: %s\n", what, moe_last_error());
        exit(2);
    }
}

/*
 * gen DIR SEED DTYPE: T = 7 tokens, k = 2, E = 4 experts (expert 3 gets no rows), N = 5, K = 6.
 * Inputs, in the form the CLI reads for DTYPE (float32 '<f4' for f32, float16 '<f2' for f16, uint16
 * bf16 patterns '<u2' for bf16):
 *   ids.npy (T,k) int32, m_sizes.npy (E,) int32, gather.npy (M,) int64, x_tok.npy (T,K) [split as
 *   (7,1,6)], x_exp.npy (M,K), w.npy (E,N,K), dy.npy (M,N), tw.npy (T,k)
 * plus float32 / float64 copies that are NOT representable in DTYPE (x_tok_f32.npy, w_f64.npy: the CLI
 * rounds them on load) and the routing the library builds (route_m_sizes/gather/scatter.npy, int64).
 * Expected outputs of the library called directly, for every PX PY TW in {0,1}^3 (permute_x,
 * permute_y, topk weights), float32 like the CLI writes:
 *   y_PXPYTW.npy  dx_PXPYTW.npy  dxr_PXPYTW.npy (reduce_topk)  dw_PXPYTW.npy  dwf_PXPYTW.npy (dw_fp32)
 *   dtw_PXPYTW.npy (topk-weight gradient, (T,k))
 * and y_raw_111.npy (--raw), y_bound_111.npy (the oracle bound, float64), y_rounded_000.npy (from the
 * rounded float32/float64 copies, with x_tok_f32 and permute_x: named y_rounded_100.npy).
 */
int gen(const char *dir, uint64_t seed, const char *dtype_name)
{
    moe_dtype dtype;
    if (!parse_dtype_name(dtype_name, &dtype)) {
        fprintf(stderr, "gen: unknown dtype %s\n", dtype_name);
        return 2;
    }
    mkdir(dir, 0777);
    enum { T = 7, k = 2, E = 4, N = 5, K = 6, M = T * k };
    oracle_rng rng = {seed};
    int32_t ids[M], m32[E];
    int64_t ids64[M], m_sizes[E], gather[M], scatter[M];
    for (int s = 0; s < M; s++)
        ids64[s] = ids[s] = (int32_t)oracle_rng_below(&rng, E - 1); /* expert E-1 gets no rows */
    must(moe_routing_from_topk(T, k, E, ids64, m_sizes, gather, scatter), "routing");
    for (int e = 0; e < E; e++)
        m32[e] = (int32_t)m_sizes[e];
    const int64_t s_ids[2] = {T, k}, s_e[1] = {E}, s_m[1] = {M};
    save(dir, "ids.npy", NPY_T_I32, 2, s_ids, ids);
    save(dir, "m_sizes.npy", NPY_T_I32, 1, s_e, m32);
    save(dir, "gather.npy", NPY_T_I64, 1, s_m, gather);
    save(dir, "route_m_sizes.npy", NPY_T_I64, 1, s_e, m_sizes);
    save(dir, "route_gather_indices.npy", NPY_T_I64, 1, s_m, gather);
    save(dir, "route_scatter_indices.npy", NPY_T_I64, 1, s_m, scatter);

    const size_t es = moe_dtype_size(dtype);
    void *x_tok = xmalloc(T * K * es), *x_exp = xmalloc(M * K * es), *w = xmalloc(E * N * K * es);
    void *dy = xmalloc(M * N * es), *tw = xmalloc(M * es);
    oracle_fill(&rng, dtype, x_tok, T * K, 0);
    oracle_fill(&rng, dtype, x_exp, M * K, 2);
    oracle_fill(&rng, dtype, w, E * N * K, 0);
    oracle_fill(&rng, dtype, dy, M * N, 0);
    oracle_fill(&rng, dtype, tw, M, 0);
    const npy_type in_type = dtype == MOE_F32 ? NPY_T_F32 : dtype == MOE_F16 ? NPY_T_F16 : NPY_T_U16;
    const int64_t s_xtok[3] = {T, 1, K}, s_xexp[2] = {M, K}, s_w[3] = {E, N, K}, s_dy[2] = {M, N};
    save(dir, "x_tok.npy", in_type, 3, s_xtok, x_tok);
    save(dir, "x_exp.npy", in_type, 2, s_xexp, x_exp);
    save(dir, "w.npy", in_type, 3, s_w, w);
    save(dir, "dy.npy", in_type, 2, s_dy, dy);
    save(dir, "tw.npy", in_type, 2, s_ids, tw);

    void *out = xmalloc(E * N * K * 4 + M * K * 4 + 64);
    char name[64];
    moe_routing routing = {T, k, E, m_sizes, gather};
    for (int combo = 0; combo < 8; combo++) {
        moe_gemm_options o = {0};
        o.dtype = dtype;
        o.permute_x = combo >> 2 & 1;
        o.permute_y = combo >> 1 & 1;
        const void *weights = combo & 1 ? tw : NULL;
        const void *x = o.permute_x ? x_tok : x_exp;
        const char *tag = (const char *[]){"000", "001", "010", "011", "100", "101", "110", "111"}[combo];
        const int64_t s_y[2] = {M, N}, s_dx[2] = {M, K}, s_dxr[2] = {T, K};

        must(moe_gemm_fwd(MOE_BACKEND_REF, &routing, N, K, x, w, weights, out, &o), "fwd");
        snprintf(name, sizeof name, "y_%s.npy", tag);
        save_result(dir, name, dtype, 0, 2, s_y, out);
        if (combo == 7) {
            save_result(dir, "y_raw_111.npy", dtype, 1, 2, s_y, out);
            double *value = xmalloc(M * N * 8), *bound = xmalloc(M * N * 8);
            oracle_gemm_fwd(&routing, N, K, x, w, weights, NULL, &o, value, bound);
            save(dir, "y_bound_111.npy", NPY_T_F64, 2, s_y, bound);
            free(value);
            free(bound);
        }

        must(moe_gemm_dx(MOE_BACKEND_REF, &routing, N, K, dy, w, weights, out, &o), "dx");
        snprintf(name, sizeof name, "dx_%s.npy", tag);
        save_result(dir, name, dtype, 0, 2, s_dx, out);
        o.reduce_topk = 1;
        must(moe_gemm_dx(MOE_BACKEND_REF, &routing, N, K, dy, w, weights, out, &o), "dx reduce");
        snprintf(name, sizeof name, "dxr_%s.npy", tag);
        save_result(dir, name, dtype, 0, 2, s_dxr, out);
        o.reduce_topk = 0;

        must(moe_gemm_dw(MOE_BACKEND_REF, &routing, N, K, x, dy, weights, out, &o), "dw");
        snprintf(name, sizeof name, "dw_%s.npy", tag);
        save_result(dir, name, dtype, 0, 3, s_w, out);
        must(moe_gemm_topk_weights_grad(MOE_BACKEND_REF, &routing, N, K, x, w, dy, out, &o), "dtw");
        snprintf(name, sizeof name, "dtw_%s.npy", tag);
        save_result(dir, name, dtype, 0, 2, s_ids, out);
        o.dw_fp32 = 1;
        must(moe_gemm_dw(MOE_BACKEND_REF, &routing, N, K, x, dy, weights, out, &o), "dw fp32");
        snprintf(name, sizeof name, "dwf_%s.npy", tag);
        save_result(dir, name, MOE_F32, 0, 3, s_w, out);
    }

    /* float32 / float64 copies off the dtype's grid; the expected output uses the single rounding */
    float *x_f32 = xmalloc(T * K * 4);
    double *w_f64 = xmalloc(E * N * K * 8);
    void *x_r = xmalloc(T * K * es), *w_r = xmalloc(E * N * K * es);
    for (int i = 0; i < T * K; i++) {
        x_f32[i] = (float)oracle_rng_symmetric(&rng);
        if (dtype == MOE_F32)
            ((float *)x_r)[i] = x_f32[i];
        else
            ((uint16_t *)x_r)[i] = dtype == MOE_F16 ? npy_f64_to_f16(x_f32[i]) : npy_f64_to_bf16(x_f32[i]);
    }
    for (int i = 0; i < E * N * K; i++) {
        w_f64[i] = oracle_rng_symmetric(&rng);
        if (dtype == MOE_F32)
            ((float *)w_r)[i] = npy_f64_to_f32(w_f64[i]);
        else
            ((uint16_t *)w_r)[i] = dtype == MOE_F16 ? npy_f64_to_f16(w_f64[i]) : npy_f64_to_bf16(w_f64[i]);
    }
    const int64_t s_xt2[2] = {T, K}, s_y[2] = {M, N};
    save(dir, "x_tok_f32.npy", NPY_T_F32, 2, s_xt2, x_f32);
    save(dir, "w_f64.npy", NPY_T_F64, 3, s_w, w_f64);
    moe_gemm_options o = {0};
    o.dtype = dtype;
    o.permute_x = 1;
    must(moe_gemm_fwd(MOE_BACKEND_REF, &routing, N, K, x_r, w_r, NULL, out, &o), "fwd rounded");
    save_result(dir, "y_rounded_100.npy", dtype, 0, 2, s_y, out);

    free(x_tok), free(x_exp), free(w), free(dy), free(tw), free(out);
    free(x_f32), free(w_f64), free(x_r), free(w_r);
    return 0;
}

/* ---------------------------------------------------------------------------------------------------
 * genmlp: blockwise MoE MLP cases for tests/test_cli_mlp.sh
 * ------------------------------------------------------------------------------------------------- */
/* One set of mlp options; every option of `moe route`, `moe mlp-fwd` and `moe mlp-bwd` is in one. */
typedef struct mlp_cli_case {
    const char *name;
    int64_t k;                      /* experts per token */
    int dropping;                   /* moe route --dropping */
    moe_mlp_activation activation;
    moe_mlp_affinity affinity;
    moe_mlp_padding padding;
    int bias;
    int clamp_mask;                 /* MT_LIN_LO | ... : the limits set (mt_choose_clamps) */
    int overwrite;                  /* --no-accumulate (top-1 only) */
    int grad_fp32;
    int no_down_ckpt;               /* the backward runs without down_proj_act_checkpoint.npy (ON_I) */
    int nki_shapes;                 /* in/ holds the layout in NKI's shapes: (N, B), (N, 1), (T*E, 1) */
    int give_block_size;            /* pass --block-size to the mlp commands (else inferred) */
    int round_intermediates;        /* --round-intermediates (no effect in f32) */
} mlp_cli_case;

static const mlp_cli_case mlp_cli_cases[] = {
    {"1_base", 2, 0, MOE_ACT_SILU, MOE_AFFINITY_ON_H, MOE_MLP_PAD_SKIP, 0, 0, 0, 0, 0, 0, 0, 0},
    {"2_gelu_bias_on_i_row", 2, 0, MOE_ACT_GELU, MOE_AFFINITY_ON_I, MOE_MLP_PAD_ROW, 1, 0, 0, 0, 0, 0, 1, 0},
    {"3_gelu_tanh_clamp_dropping", 2, 1, MOE_ACT_GELU_TANH, MOE_AFFINITY_ON_H, MOE_MLP_PAD_SKIP, 0,
     MT_NL_HI | MT_LIN_LO | MT_LIN_HI, 0, 1, 0, 0, 1, 0},
    {"4_swish_clamp_recompute", 2, 0, MOE_ACT_SWISH, MOE_AFFINITY_ON_I, MOE_MLP_PAD_ROW, 1, MT_NL_LO | MT_NL_HI, 0, 0,
     1, 0, 1, 0},
    {"5_top1_no_accumulate_nki", 1, 0, MOE_ACT_SILU, MOE_AFFINITY_ON_H, MOE_MLP_PAD_SKIP, 1, 0, 1, 1, 0, 1, 0, 0},
    {"6_round_intermediates", 2, 0, MOE_ACT_GELU, MOE_AFFINITY_ON_H, MOE_MLP_PAD_ROW, 1, MT_LIN_LO, 0, 0, 0, 0, 1, 1},
};

/* The library's forward and backward outputs for one options struct. */
typedef struct mlp_outputs {
    void *out, *ckpt_gu, *ckpt_d, *d_hidden, *d_aff, *d_wgu, *d_wd, *d_bgu, *d_bd;
} mlp_outputs;

static void mlp_outputs_run(const mt_case *c, const moe_mlp_options *opt, int down_ckpt_in_bwd, mlp_outputs *r)
{
    const size_t es = moe_dtype_size(opt->dtype), gs = opt->grad_fp32 ? 4 : es;
    const int64_t T1 = c->T1, H = c->H, I = c->I, E = c->E, N = c->N, B = c->B;
    r->out = xmalloc((size_t)(T1 * H) * es);
    r->ckpt_gu = xmalloc((size_t)(N * 2 * I * B) * es);
    r->ckpt_d = xmalloc((size_t)(N * B * H) * es);
    r->d_hidden = xmalloc((size_t)(T1 * H) * es);
    r->d_aff = xmalloc((size_t)(c->T * E) * es);
    r->d_wgu = xmalloc((size_t)(E * H * 2 * I) * gs);
    r->d_wd = xmalloc((size_t)(E * I * H) * gs);
    r->d_bgu = opt->bias ? xmalloc((size_t)(E * 2 * I) * gs) : NULL;
    r->d_bd = opt->bias ? xmalloc((size_t)(E * H) * gs) : NULL;
    moe_mlp_options fwd = *opt;
    fwd.grad_fp32 = 0;
    const void *b_gu = opt->bias ? c->b_gu : NULL, *b_d = opt->bias ? c->b_d : NULL;
    must(moe_mlp_fwd(MOE_BACKEND_REF, &c->layout, H, I, c->hidden, c->aff, c->w_gu, c->w_d, b_gu, b_d, r->out,
                     r->ckpt_gu, r->ckpt_d, &fwd), "mlp fwd");
    must(moe_mlp_bwd(MOE_BACKEND_REF, &c->layout, H, I, c->hidden, c->aff, c->w_gu, c->w_d, b_d, r->ckpt_gu,
                     down_ckpt_in_bwd ? r->ckpt_d : NULL, c->G, r->d_hidden, r->d_aff, r->d_wgu, r->d_wd, r->d_bgu,
                     r->d_bd, opt), "mlp bwd");
}

static void mlp_outputs_free(mlp_outputs *r)
{
    void *ps[] = {r->out, r->ckpt_gu, r->ckpt_d, r->d_hidden, r->d_aff, r->d_wgu, r->d_wd, r->d_bgu, r->d_bd};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
        free(ps[i]);
}

/* Fails gen unless turning off the option `what` changes the output or a gradient: a CLI that dropped
 * the option would then go unnoticed by the bit-for-bit comparison. */
static void require_effect(const mt_case *c, const mlp_outputs *with, const moe_mlp_options *without,
                           int down_ckpt_in_bwd, const char *what)
{
    mlp_outputs r;
    mlp_outputs_run(c, without, down_ckpt_in_bwd, &r);
    const size_t es = moe_dtype_size(c->opt.dtype), gs = c->opt.grad_fp32 ? 4 : es;
    const int same = memcmp(r.out, with->out, (size_t)(c->T1 * c->H) * es) == 0 &&
                     memcmp(r.d_hidden, with->d_hidden, (size_t)(c->T1 * c->H) * es) == 0 &&
                     memcmp(r.d_wgu, with->d_wgu, (size_t)mt_count_wgu(c) * gs) == 0;
    mlp_outputs_free(&r);
    if (same) {
        fprintf(stderr, "genmlp: %s has no effect on this case (seed %llu): choose another seed\n", what,
                (unsigned long long)c->seed);
        exit(2);
    }
}

static void make_dir(const char *dir, const char *sub, char *path, size_t size)
{
    snprintf(path, size, "%s/%s", dir, sub);
    if (mkdir(path, 0777) != 0 && errno != EEXIST) {
        perror(path);
        exit(2);
    }
}


/* --clamp NL_LO,NL_HI,LIN_LO,LIN_HI of the options (an empty field for an unset limit). */
static void clamp_flag(const moe_mlp_options *o, char *buf, size_t size)
{
    const int has[4] = {o->has_non_linear_clamp_lower_limit, o->has_non_linear_clamp_upper_limit,
                        o->has_linear_clamp_lower_limit, o->has_linear_clamp_upper_limit};
    const float lim[4] = {o->non_linear_clamp_lower_limit, o->non_linear_clamp_upper_limit,
                          o->linear_clamp_lower_limit, o->linear_clamp_upper_limit};
    size_t n = (size_t)snprintf(buf, size, " --clamp ");
    for (int f = 0; f < 4; f++) {
        if (has[f])
            n += (size_t)snprintf(buf + n, size - n, "%.9g", (double)lim[f]); /* round-trips the float */
        if (f < 3)
            n += (size_t)snprintf(buf + n, size - n, ",");
    }
}

/*
 * genmlp DIR SEED DTYPE: for every case of mlp_cli_cases, T = 7 tokens, E = 4 experts, H = 5, I = 3,
 * B = 3, in DIR/CASE/:
 *   ids.npy (T,k) int32, tw.npy (T,k): the routing `moe route` gets
 *   layout/  token_position_to_id.npy, block_to_expert.npy, expert_affinities_masked.npy: what
 *            `moe route --block-size 3 [--dropping] [--padding row] --topk-weights tw.npy` must write
 *            (moe_mlp_layout_build called directly)
 *   in/      hidden_states.npy, gate_up_proj_weight.npy, down_proj_weight.npy, output_hidden_states_grad.npy,
 *            the biases with --bias, and for nki_shapes the layout in NKI's shapes (the other cases take
 *            route's); hidden row T and the affinities of pairs outside the layout are NaN (never read)
 *   want_fwd/ output.npy and the two checkpoints, want_bwd/ every gradient: the library's results,
 *            float32 files like the CLI writes
 *   case.sh  route_flags, mlp_flags, bwd_flags, no_down_ckpt, n_bwd (gradients written): the CLI flags
 * Inputs are '<f4' (f32), '<f2' (f16) or '<u2' bf16 patterns (bf16).  Every option a case sets is
 * checked to change the results (require_effect).
 */
int gen_mlp(const char *dir, uint64_t seed, const char *dtype_name)
{
    moe_dtype dtype;
    if (!parse_dtype_name(dtype_name, &dtype)) {
        fprintf(stderr, "genmlp: unknown dtype %s\n", dtype_name);
        return 2;
    }
    mkdir(dir, 0777);
    enum { T = 7, E = 4, H = 5, I = 3, B = 3 };
    const npy_type in_type = dtype == MOE_F32 ? NPY_T_F32 : dtype == MOE_F16 ? NPY_T_F16 : NPY_T_U16;
    const size_t es = moe_dtype_size(dtype);
    for (size_t ci = 0; ci < sizeof mlp_cli_cases / sizeof mlp_cli_cases[0]; ci++) {
        const mlp_cli_case *cc = &mlp_cli_cases[ci];
        char cdir[1024], sub[1100], flags[512];
        make_dir(dir, cc->name, cdir, sizeof cdir);
        moe_mlp_options opt = {0};
        opt.dtype = dtype;
        opt.block_size = B;
        opt.activation = cc->activation;
        opt.affinity = cc->affinity;
        opt.padding = cc->padding;
        opt.bias = cc->bias;
        opt.tensor_update_overwrite = cc->overwrite;
        opt.float32_intermediates = !cc->round_intermediates;
        mt_case c;
        mt_case_init(&c, seed + ci, T, E, cc->k, H, I, &opt, cc->dropping ? MT_DROPPING : MT_DROPLESS);
        mt_case_scale_weights(&c);
        if (cc->clamp_mask && !mt_choose_clamps(&c, cc->clamp_mask)) {
            fprintf(stderr, "genmlp: %s: no clamp limits fit the data (seed %llu)\n", cc->name,
                    (unsigned long long)seed);
            return 2;
        }
        c.opt.grad_fp32 = cc->grad_fp32;
        const int64_t k = cc->k, NB = c.N * B, TE = (int64_t)T * E;

        /* the routing and the layout `moe route` must build from it */
        int32_t ids32[T * 2];
        void *tw = xmalloc((size_t)(T * k) * es);
        oracle_rng rng = {seed ^ (0x7717 + ci)};
        oracle_fill(&rng, dtype, tw, T * k, 0); /* dropped pairs keep these */
        for (int64_t s = 0; s < T * k; s++) {
            ids32[s] = (int32_t)c.topk_ids[s];
            const int64_t a = s / k * E + c.topk_ids[s];
            if (!isnan(c.A[a]))
                memcpy((char *)tw + s * (int64_t)es, (const char *)c.aff + a * (int64_t)es, es);
        }
        int64_t *b2e = xmalloc((size_t)c.N * 8), *tpti = xmalloc((size_t)NB * 8), dropped = 0;
        void *aff = xmalloc((size_t)TE * es);
        must(moe_mlp_layout_build(cc->dropping ? MOE_MLP_DROPPING : MOE_MLP_DROPLESS, T, k, E, c.topk_ids, tw, c.N,
                                  b2e, tpti, aff, &dropped, &c.opt), "layout");
        if (memcmp(b2e, c.b2e, (size_t)c.N * 8) != 0 || memcmp(tpti, c.ids, (size_t)NB * 8) != 0) {
            fprintf(stderr, "genmlp: %s: the layout differs from the test library's\n", cc->name);
            return 2;
        }
        if (cc->dropping && dropped == 0) {
            fprintf(stderr, "genmlp: %s: no pair dropped (seed %llu)\n", cc->name, (unsigned long long)seed);
            return 2;
        }
        const int64_t s_tk[2] = {T, k}, s_nb[1] = {NB}, s_n[1] = {c.N}, s_te[1] = {TE};
        save(cdir, "ids.npy", NPY_T_I32, 2, s_tk, ids32);
        save(cdir, "tw.npy", in_type, 2, s_tk, tw);
        make_dir(cdir, "layout", sub, sizeof sub);
        save(sub, "token_position_to_id.npy", NPY_T_I64, 1, s_nb, tpti);
        save(sub, "block_to_expert.npy", NPY_T_I64, 1, s_n, b2e);
        save_result(sub, "expert_affinities_masked.npy", dtype, 0, 1, s_te, aff);

        /* the inputs */
        make_dir(cdir, "in", sub, sizeof sub);
        const int64_t s_h[2] = {c.T1, H}, s_wgu[4] = {E, H, 2, I}, s_wd[3] = {E, I, H}, s_bgu[3] = {E, 2, I},
                      s_bd[2] = {E, H};
        save(sub, "hidden_states.npy", in_type, 2, s_h, c.hidden);
        save(sub, "gate_up_proj_weight.npy", in_type, 4, s_wgu, c.w_gu);
        save(sub, "down_proj_weight.npy", in_type, 3, s_wd, c.w_d);
        save(sub, "output_hidden_states_grad.npy", in_type, 2, s_h, c.G);
        if (cc->bias) {
            save(sub, "gate_up_proj_bias.npy", in_type, 3, s_bgu, c.b_gu);
            save(sub, "down_proj_bias.npy", in_type, 2, s_bd, c.b_d);
        }
        const int64_t s_aff_nki[2] = {TE, 1};
        if (cc->nki_shapes) {
            int32_t *tpti32 = xmalloc((size_t)NB * 4), *b2e32 = xmalloc((size_t)c.N * 4);
            for (int64_t p = 0; p < NB; p++)
                tpti32[p] = (int32_t)tpti[p];
            for (int64_t n = 0; n < c.N; n++)
                b2e32[n] = (int32_t)b2e[n];
            const int64_t s_n_b[2] = {c.N, B}, s_n1[2] = {c.N, 1};
            save(sub, "token_position_to_id.npy", NPY_T_I32, 2, s_n_b, tpti32);
            save(sub, "block_to_expert.npy", NPY_T_I32, 2, s_n1, b2e32);
            save(sub, "expert_affinities_masked.npy", in_type, 2, s_aff_nki, c.aff);
            free(tpti32), free(b2e32);
        }

        /* the library's results, and the options are shown to matter */
        const int down_in_bwd = !cc->no_down_ckpt;
        mlp_outputs r;
        mlp_outputs_run(&c, &c.opt, down_in_bwd, &r);
        moe_mlp_options off = c.opt;
        if (cc->activation != MOE_ACT_SILU) {
            off.activation = MOE_ACT_SILU;
            require_effect(&c, &r, &off, down_in_bwd, "--activation");
            off = c.opt;
        }
        if (cc->bias) {
            off.bias = 0;
            require_effect(&c, &r, &off, down_in_bwd, "--bias");
            off = c.opt;
        }
        if (cc->clamp_mask) {
            off.has_linear_clamp_lower_limit = off.has_linear_clamp_upper_limit = 0;
            off.has_non_linear_clamp_lower_limit = off.has_non_linear_clamp_upper_limit = 0;
            require_effect(&c, &r, &off, down_in_bwd, "--clamp");
            off = c.opt;
        }
        if (cc->round_intermediates && dtype != MOE_F32) { /* f32: no effect by definition */
            off.float32_intermediates = 1;
            require_effect(&c, &r, &off, down_in_bwd, "--round-intermediates");
            off = c.opt;
        }
        const moe_dtype gdt = cc->grad_fp32 ? MOE_F32 : dtype;
        const int64_t s_gu[4] = {c.N, 2, I, B}, s_d[3] = {c.N, B, H};
        make_dir(cdir, "want_fwd", sub, sizeof sub);
        save_result(sub, "output.npy", dtype, 0, 2, s_h, r.out);
        save_result(sub, "gate_up_proj_act_checkpoint_T.npy", dtype, 0, 4, s_gu, r.ckpt_gu);
        save_result(sub, "down_proj_act_checkpoint.npy", dtype, 0, 3, s_d, r.ckpt_d);
        make_dir(cdir, "want_bwd", sub, sizeof sub);
        save_result(sub, "hidden_states_grad.npy", dtype, 0, 2, s_h, r.d_hidden);
        if (cc->nki_shapes)
            save_result(sub, "expert_affinities_masked_grad.npy", dtype, 0, 2, s_aff_nki, r.d_aff);
        else
            save_result(sub, "expert_affinities_masked_grad.npy", dtype, 0, 1, s_te, r.d_aff);
        save_result(sub, "gate_up_proj_weight_grad.npy", gdt, 0, 4, s_wgu, r.d_wgu);
        save_result(sub, "down_proj_weight_grad.npy", gdt, 0, 3, s_wd, r.d_wd);
        if (cc->bias) {
            save_result(sub, "gate_up_proj_bias_grad.npy", gdt, 0, 3, s_bgu, r.d_bgu);
            save_result(sub, "down_proj_bias_grad.npy", gdt, 0, 2, s_bd, r.d_bd);
        }

        /* the CLI flags of this case */
        snprintf(sub, sizeof sub, "%s/case.sh", cdir);
        FILE *f = fopen(sub, "w");
        if (f == NULL) {
            perror(sub);
            return 2;
        }
        const char *pad = cc->padding == MOE_MLP_PAD_ROW ? " --padding row" : "";
        fprintf(f, "# written by test_cli_npy genmlp: the moe flags of case %s\n", cc->name);
        fprintf(f, "route_flags='--block-size %d%s%s'\n", B, cc->dropping ? " --dropping" : "", pad);
        int n = snprintf(flags, sizeof flags, "--activation %s --affinity-on %s%s%s", moe_mlp_activation_name(cc->activation),
                         cc->affinity == MOE_AFFINITY_ON_I ? "i" : "h", pad, cc->bias ? " --bias" : "");
        if (cc->give_block_size)
            n += snprintf(flags + n, sizeof flags - (size_t)n, " --block-size %d", B);
        if (cc->overwrite)
            n += snprintf(flags + n, sizeof flags - (size_t)n, " --no-accumulate");
        if (cc->clamp_mask)
            clamp_flag(&c.opt, flags + n, sizeof flags - (size_t)n);
        if (!cc->round_intermediates) /* the rounded intermediates are the default */
            snprintf(flags + strlen(flags), sizeof flags - strlen(flags), " --intermediates float32");
        fprintf(f, "mlp_flags='%s'\n", flags);
        fprintf(f, "bwd_flags='%s'\n", cc->grad_fp32 ? "--grad-fp32" : "");
        fprintf(f, "no_down_ckpt=%d\n", cc->no_down_ckpt);
        fprintf(f, "n_bwd=%d\n", cc->bias ? 6 : 4);
        fclose(f);

        mlp_outputs_free(&r);
        free(tw), free(b2e), free(tpti), free(aff);
        mt_case_free(&c);
    }
    return 0;
}

