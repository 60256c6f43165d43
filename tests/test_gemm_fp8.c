/* The FP8 grouped GEMM reference (moe_gemm_fp8_fwd / _dx on MOE_BACKEND_REF) against the float64 oracle within
 * its derived bound (oracle/oracle_fp8.h, specs/FP8.md section 4), and its argument checks.
 *
 *   - random cases: shapes with K and N below, at and past multiples of 128 (partial tiles), every mode
 *     (permute_x, permute_y, topk weights, accumulate, reduce_topk for dX), both output dtypes, both scale
 *     formats, all four pairs of FP8 operand dtypes; scales that differ from tile to tile (a wrong scale
 *     index or a dropped promotion is far outside the bound: specs/FP8.md records the planted mutants);
 *   - the blocked twin that the reference backend runs (ref/gemm_fp8_blocked.c) bit for bit the readable
 *     definition (ref/gemm_fp8.c), on those cases and on larger ones (experts of more than one row block);
 *   - dX with options.w_transposed (w given as W^T, codes and scales transposed) bit for bit dX with W;
 *   - a case whose exact result is known: powers of two, every tile's sum exact;
 *   - NaN codes propagate to NaN outputs;
 *   - bad arguments: each rejected with its status and a message naming it, the output unchanged.
 * The CUDA kernels are checked against the same oracle by moe-fuzz's gpu-gemm-fp8 (proptest/pt_gpu_fp8.c).
 *
 * Usage: test_gemm_fp8 [seed] */
#include "fp8_ref.h"
#include "moe_backend.h"
#include "moe_fp8.h"
#include "oracle_fp8.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "transpose.h"

static int64_t tiles(int64_t n) { return (n + 127) / 128; }

typedef struct fp8_case {
    int64_t T, k, E, N, K;
    int64_t *ids, *m_sizes, *gather;
    moe_routing routing;
    moe_fp8_options opt;
    int dx;              /* 0: fwd, 1: dX */
    moe_fp8_tensor a, w; /* a: x (fwd) or dy (dX) */
    uint8_t *a_codes, *w_codes;  /* w_codes W [E][N][K] */
    void *a_scales, *w_scales;
    uint8_t *wt_codes;           /* dX with opt.w_transposed: W^T [E][K][N], which c->w points to; else NULL */
    void *wt_scales;
    float *topk;         /* or NULL */
    int64_t a_rows, out_count;
    void *out;
} fp8_case;

/* A random code that is not NaN (nor e5m2's Inf). */
static uint8_t finite_code(oracle_rng *rng, moe_dtype dtype)
{
    for (;;) {
        const uint8_t c = (uint8_t)oracle_rng_below(rng, 256);
        const float v = dtype == MOE_E5M2 ? moe_e5m2_to_f32(c) : moe_e4m3_to_f32(c);
        if (isfinite(v))
            return c;
    }
}

/* Scales that differ from tile to tile: 2^[-6, 6] times [1, 2) (float32), or biased exponents 121 .. 133. */
static void *random_scales(oracle_rng *rng, moe_fp8_scale_format format, int64_t count)
{
    if (format == MOE_FP8_SCALE_UE8M0) {
        uint8_t *s = malloc((size_t)count + 1);
        for (int64_t i = 0; i < count; i++)
            s[i] = (uint8_t)(121 + oracle_rng_below(rng, 13));
        return s;
    }
    float *s = malloc(((size_t)count + 1) * sizeof *s);
    for (int64_t i = 0; i < count; i++)
        s[i] = (float)ldexp(1.0 + 0.5 * (oracle_rng_symmetric(rng) + 1.0), (int)oracle_rng_below(rng, 13) - 6);
    return s;
}

/* A random case of 1 .. max_tokens tokens. */
static void make_case(fp8_case *c, oracle_rng *rng, int max_tokens)
{
    static const int64_t lengths[] = {1, 7, 64, 127, 128, 129, 200, 256, 300, 385};
    c->T = 1 + (int64_t)oracle_rng_below(rng, (uint64_t)max_tokens);
    c->E = 1 + (int64_t)oracle_rng_below(rng, 4);
    c->k = 1 + (int64_t)oracle_rng_below(rng, (uint64_t)c->E);
    c->N = lengths[oracle_rng_below(rng, 10)];
    c->K = lengths[oracle_rng_below(rng, 10)];
    const int64_t M = c->T * c->k;
    c->ids = malloc((size_t)M * sizeof(int64_t));
    c->m_sizes = malloc((size_t)c->E * sizeof(int64_t));
    c->gather = malloc((size_t)M * sizeof(int64_t));
    oracle_topk_ids(rng, c->T, c->k, c->E, c->ids);
    REQUIRE(moe_routing_from_topk(c->T, c->k, c->E, c->ids, c->m_sizes, c->gather, NULL) == MOE_OK, "routing: %s",
            moe_last_error());
    c->routing = (moe_routing){c->T, c->k, c->E, c->m_sizes, c->gather};
    memset(&c->opt, 0, sizeof c->opt);
    c->opt.out_dtype = oracle_rng_below(rng, 2) ? MOE_BF16 : MOE_F32;
    c->opt.scale_format = oracle_rng_below(rng, 2) ? MOE_FP8_SCALE_UE8M0 : MOE_FP8_SCALE_F32;
    c->opt.permute_x = (int)oracle_rng_below(rng, 2);
    c->opt.permute_y = (int)oracle_rng_below(rng, 2);
    c->opt.accumulate = (int)oracle_rng_below(rng, 2);
    c->dx = (int)oracle_rng_below(rng, 2);
    c->opt.reduce_topk = c->dx && oracle_rng_below(rng, 2);
    c->a.dtype = oracle_rng_below(rng, 3) ? MOE_E4M3 : MOE_E5M2;
    c->w.dtype = oracle_rng_below(rng, 3) ? MOE_E4M3 : MOE_E5M2;
    const int64_t reduce = c->dx ? c->N : c->K;
    c->a_rows = c->dx ? M : (c->opt.permute_x ? c->T : M);
    c->a_codes = malloc((size_t)(c->a_rows * reduce) + 1);
    c->w_codes = malloc((size_t)(c->E * c->N * c->K) + 1);
    for (int64_t i = 0; i < c->a_rows * reduce; i++)
        c->a_codes[i] = finite_code(rng, c->a.dtype);
    for (int64_t i = 0; i < c->E * c->N * c->K; i++)
        c->w_codes[i] = finite_code(rng, c->w.dtype);
    c->a_scales = random_scales(rng, c->opt.scale_format, c->a_rows * tiles(reduce));
    c->w_scales = random_scales(rng, c->opt.scale_format, c->E * tiles(c->N) * tiles(c->K));
    c->a.data = c->a_codes, c->a.scales = c->a_scales;
    c->w.data = c->w_codes, c->w.scales = c->w_scales;
    c->wt_codes = NULL, c->wt_scales = NULL;
    c->opt.w_transposed = c->dx && oracle_rng_below(rng, 2);
    if (c->opt.w_transposed) { /* W^T's codes and its blocks' scales */
        const size_t scale_size = c->opt.scale_format == MOE_FP8_SCALE_UE8M0 ? 1 : sizeof(float);
        c->wt_codes = transpose_batches(c->w_codes, c->E, c->N, c->K, 1);
        c->wt_scales = transpose_batches(c->w_scales, c->E, tiles(c->N), tiles(c->K), scale_size);
        c->w.data = c->wt_codes, c->w.scales = c->wt_scales;
    }
    c->topk = NULL;
    if (oracle_rng_below(rng, 2)) {
        c->topk = malloc((size_t)M * sizeof(float));
        for (int64_t i = 0; i < M; i++)
            c->topk[i] = (float)(0.05 + 0.5 * (oracle_rng_symmetric(rng) + 1.0));
    }
    c->out_count = c->dx ? (c->opt.reduce_topk ? c->T : M) * c->K : M * c->N;
    c->out = malloc((size_t)c->out_count * 4 + 4);
    oracle_fill(rng, c->opt.out_dtype, c->out, c->out_count, 0);
}

static void free_case(fp8_case *c)
{
    free(c->ids), free(c->m_sizes), free(c->gather), free(c->a_codes), free(c->w_codes);
    free(c->a_scales), free(c->w_scales), free(c->topk), free(c->out), free(c->wt_codes), free(c->wt_scales);
}

static moe_status run_case(const fp8_case *c, moe_backend backend, void *out)
{
    return c->dx ? moe_gemm_fp8_dx(backend, &c->routing, c->N, c->K, &c->a, &c->w, c->topk, out, &c->opt)
                 : moe_gemm_fp8_fwd(backend, &c->routing, c->N, c->K, &c->a, &c->w, c->topk, out, &c->opt);
}

static void describe(const fp8_case *c, char *buf, size_t len)
{
    snprintf(buf, len, "%s T=%lld k=%lld E=%lld N=%lld K=%lld %sx%s out=%s scales=%s px=%d py=%d topk=%d acc=%d "
             "reduce=%d", c->dx ? (c->opt.w_transposed ? "dx(W^T)" : "dx") : "fwd", (long long)c->T, (long long)c->k, (long long)c->E, (long long)c->N,
             (long long)c->K, moe_dtype_name(c->a.dtype), moe_dtype_name(c->w.dtype), moe_dtype_name(c->opt.out_dtype),
             c->opt.scale_format ? "ue8m0" : "f32", c->opt.permute_x, c->opt.permute_y, c->topk != NULL,
             c->opt.accumulate, c->opt.reduce_topk);
}

/* The reference backend's result `blocked` (its blocked twin) against the readable definition, ref/gemm_fp8.c, run
 * on the same old output `old`: bit for bit. */
static void check_twin(const fp8_case *c, const void *old, const void *blocked, const char *what)
{
    const moe_fp8_problem p = {
        .g = {.op = "test_gemm_fp8", .num_tokens = c->T, .topk = c->k, .num_experts = c->E, .rows = c->T * c->k,
              .N = c->N, .K = c->K, .m_sizes = c->m_sizes, .gather_indices = c->gather, .dtype = c->opt.out_dtype,
              .dw_dtype = c->opt.out_dtype, .permute_x = c->opt.permute_x, .permute_y = c->opt.permute_y,
              .reduce_topk = c->opt.reduce_topk, .accumulate = c->opt.accumulate},
        .scale_format = c->opt.scale_format,
        .w_transposed = c->opt.w_transposed};
    const size_t size = moe_dtype_size(c->opt.out_dtype), bytes = (size_t)c->out_count * size;
    void *naive = malloc(bytes + 4);
    REQUIRE(naive != NULL, "no memory for %zu bytes", bytes);
    memcpy(naive, old, bytes);
    const moe_status st = c->dx ? moe_ref_gemm_fp8_dx(&p, &c->a, &c->w, c->topk, naive)
                                : moe_ref_gemm_fp8_fwd(&p, &c->a, &c->w, c->topk, naive);
    const int64_t differs = st == MOE_OK ? first_difference(naive, blocked, c->out_count, size) : -1;
    CHECK(st == MOE_OK && differs < 0, "%s: the twins differ at element %lld (naive status %d)", what,
          (long long)differs, (int)st);
    free(naive);
}

/* The reference backend on c (its blocked twin) and, on the same old output, the readable definition: bit for
 * bit.  Returns the backend's status. */
static moe_status run_reference(fp8_case *c, const char *what)
{
    const size_t bytes = (size_t)c->out_count * moe_dtype_size(c->opt.out_dtype);
    void *old = malloc(bytes + 4);
    REQUIRE(old != NULL, "no memory for %zu bytes", bytes);
    memcpy(old, c->out, bytes);
    const moe_status st = run_case(c, MOE_BACKEND_REF, c->out);
    if (st == MOE_OK)
        check_twin(c, old, c->out, what);
    if (st == MOE_OK && c->opt.w_transposed) { /* the same call on W itself: bit for bit */
        fp8_case on_w = *c;
        on_w.opt.w_transposed = 0;
        on_w.w.data = c->w_codes, on_w.w.scales = c->w_scales;
        const moe_status st_w = run_case(&on_w, MOE_BACKEND_REF, old);
        const int64_t differs = st_w == MOE_OK ? first_difference(old, c->out, c->out_count,
                                                                  moe_dtype_size(c->opt.out_dtype)) : -1;
        CHECK(st_w == MOE_OK && differs < 0, "%s: dX from W^T and from W differ at element %lld (status %d)", what,
              (long long)differs, (int)st_w);
    }
    free(old);
    return st;
}

/* Cases of up to 48 tokens (experts of up to 48 rows: several of the blocked twin's 16-row blocks), twins only. */
static void twin_cases(oracle_rng *rng, int count)
{
    for (int i = 0; i < count; i++) {
        fp8_case c;
        make_case(&c, rng, 48);
        char what[256];
        describe(&c, what, sizeof what);
        const moe_status st = run_reference(&c, what);
        CHECK(st == MOE_OK, "twin case %d (%s): status %d: %s", i, what, (int)st, moe_last_error());
        free_case(&c);
    }
}

/* The reference against the oracle on random cases; returns the worst |err| / bound seen. */
static double random_cases(oracle_rng *rng, int count)
{
    double worst = 0.0;
    for (int i = 0; i < count; i++) {
        fp8_case c;
        make_case(&c, rng, 6);
        double *value = malloc((size_t)c.out_count * sizeof(double) + 8);
        double *bound = malloc((size_t)c.out_count * sizeof(double) + 8);
        if (c.dx)
            oracle_gemm_fp8_dx(&c.routing, c.N, c.K, &c.a, &c.w, c.topk, c.out, &c.opt, ORACLE_FP8_TILE_F32, value, bound);
        else
            oracle_gemm_fp8_fwd(&c.routing, c.N, c.K, &c.a, &c.w, c.topk, c.out, &c.opt, ORACLE_FP8_TILE_F32, value, bound);
        char what[256];
        describe(&c, what, sizeof what);
        const moe_status st = run_reference(&c, what);
        CHECK(st == MOE_OK, "case %d (%s): status %d: %s", i, what, (int)st, moe_last_error());
        double ratio = 0.0;
        const int64_t bad = oracle_compare(what, c.opt.out_dtype, c.out, value, bound, c.out_count, stdout, 3, &ratio);
        CHECK(bad == 0, "case %d (%s): %lld elements outside the bound", i, what, (long long)bad);
        if (ratio > worst)
            worst = ratio;
        free(value), free(bound);
        free_case(&c);
    }
    return worst;
}

/* Exact values: one expert, K = 300 (three tiles), x codes 1.0, w codes 2.0, tile scales 2^t (x) and 2^-t (w),
 * so that each tile adds 2 * len_t: y = 2 * 300 = 600 exactly.  A dropped promotion that scaled the whole sum
 * by one tile's scales gives the same here; the random cases catch that. */
static void exact_case(void)
{
    enum { K = 300, N = 2, T = 3 };
    int64_t m_sizes[1] = {T}, gather[T] = {0, 1, 2};
    const moe_routing routing = {T, 1, 1, m_sizes, gather};
    uint8_t xq[T * K], wq[N * K];
    memset(xq, moe_f32_to_e4m3(1.0f), sizeof xq);
    memset(wq, moe_f32_to_e4m3(2.0f), sizeof wq);
    float xs[T * 3], ws[1 * 3];
    for (int r = 0; r < T; r++)
        for (int t = 0; t < 3; t++)
            xs[r * 3 + t] = ldexpf(1.0f, t);
    for (int t = 0; t < 3; t++)
        ws[t] = ldexpf(1.0f, -t);
    const moe_fp8_tensor x = {xq, xs, MOE_E4M3}, w = {wq, ws, MOE_E4M3};
    float y[T * N];
    CHECK(moe_gemm_fp8_fwd(MOE_BACKEND_REF, &routing, N, K, &x, &w, NULL, y, NULL) == MOE_OK, "exact case: %s",
          moe_last_error());
    for (int i = 0; i < T * N; i++)
        CHECK(y[i] == 600.0f, "exact case: y[%d] = %g, expected 600", i, (double)y[i]);
    /* a NaN code in x row 1 gives NaN in that row only */
    xq[1 * K + 5] = 0x7f;
    CHECK(moe_gemm_fp8_fwd(MOE_BACKEND_REF, &routing, N, K, &x, &w, NULL, y, NULL) == MOE_OK, "NaN case: %s",
          moe_last_error());
    CHECK(y[0] == 600.0f && isnan(y[2]) && isnan(y[3]) && y[4] == 600.0f, "NaN code: y = %g %g %g %g", (double)y[0],
          (double)y[2], (double)y[3], (double)y[4]);
}

/* ---- bad arguments: status, a message naming the argument, the output unchanged ---- */

typedef struct bad_args {
    moe_backend backend;
    moe_routing routing;
    int64_t N, K;
    moe_fp8_tensor x, w;
    const float *topk;
    void *y;
    moe_fp8_options opt;
    int dx;
} bad_args;

static void expect_bad(const char *what, const bad_args *a, moe_status want, const char *fragment)
{
    float *y = a->y;
    const float before = y[0];
    const moe_status st = a->dx ? moe_gemm_fp8_dx(a->backend, &a->routing, a->N, a->K, &a->x, &a->w, a->topk, a->y,
                                                  &a->opt)
                                : moe_gemm_fp8_fwd(a->backend, &a->routing, a->N, a->K, &a->x, &a->w, a->topk, a->y,
                                                   &a->opt);
    CHECK(st == want && strstr(moe_last_error(), fragment) != NULL, "%s: status %d (want %d), message \"%s\" (want "
          "\"%s\")", what, (int)st, (int)want, moe_last_error(), fragment);
    CHECK(memcmp(&before, y, sizeof before) == 0, "%s: the output changed", what);
}

static void bad_arguments(void)
{
    enum { T = 2, N = 130, K = 129 };
    int64_t m_sizes[2] = {1, 1}, gather[T] = {1, 0};
    static uint8_t xq[T * K], wq[2 * N * K];
    static float xs[T * 2], ws[2 * 2 * 2], y[T * N], topk[T] = {0.5f, 0.25f};
    static uint8_t ue[2 * 2 * 2];
    for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++)
        xs[i] = 1.0f;
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
        ws[i] = 0.5f;
    memset(ue, 127, sizeof ue);
    y[0] = 12345.0f;
    const bad_args good = {MOE_BACKEND_REF, {T, 1, 2, m_sizes, gather}, N, K, {xq, xs, MOE_E4M3},
                           {wq, ws, MOE_E4M3}, topk, y, {0}, 0};
    bad_args a = good;
    a.opt.out_dtype = MOE_F32;
    /* the good call succeeds (and then y is restored) */
    CHECK(moe_gemm_fp8_fwd(MOE_BACKEND_REF, &a.routing, N, K, &a.x, &a.w, topk, y, &a.opt) == MOE_OK, "good call: %s",
          moe_last_error());
    y[0] = 12345.0f;
#define BAD(what, change, status, fragment) (a = good, (change), expect_bad(what, &a, status, fragment))
    BAD("out_dtype f16", a.opt.out_dtype = MOE_F16, MOE_ERR_INVALID_DTYPE, "options.out_dtype = f16");
    BAD("out_dtype e4m3", a.opt.out_dtype = MOE_E4M3, MOE_ERR_INVALID_DTYPE, "options.out_dtype = e4m3");
    BAD("scale_format 2", a.opt.scale_format = (moe_fp8_scale_format)2, MOE_ERR_INVALID_OPTION,
        "options.scale_format = 2");
    BAD("x dtype bf16", a.x.dtype = MOE_BF16, MOE_ERR_INVALID_DTYPE, "x.dtype = bf16");
    BAD("w dtype f32", a.w.dtype = MOE_F32, MOE_ERR_INVALID_DTYPE, "w.dtype = f32");
    BAD("dy dtype 9", (a.dx = 1, a.x.dtype = (moe_dtype)9), MOE_ERR_INVALID_DTYPE, "dy.dtype = ? (9)");
    BAD("x data NULL", a.x.data = NULL, MOE_ERR_NULL_POINTER, "x.data");
    BAD("x scales NULL", a.x.scales = NULL, MOE_ERR_NULL_POINTER, "x.scales");
    BAD("w scales NULL", a.w.scales = NULL, MOE_ERR_NULL_POINTER, "w.scales");
    BAD("x scale 0", xs[3] = 0.0f, MOE_ERR_INVALID_VALUE, "x.scales[1][1] = 0, expected finite and > 0");
    xs[3] = 1.0f;
    BAD("x scale -1", xs[0] = -1.0f, MOE_ERR_INVALID_VALUE, "x.scales[0][0] = -1");
    xs[0] = 1.0f;
    BAD("w scale NaN", ws[5] = NAN, MOE_ERR_INVALID_VALUE, "w.scales[2][1] = nan");
    ws[5] = 0.5f;
    BAD("w scale Inf", ws[7] = INFINITY, MOE_ERR_INVALID_VALUE, "w.scales[3][1] = inf");
    ws[7] = 0.5f;
    BAD("dy scale Inf", (a.dx = 1, xs[2] = INFINITY), MOE_ERR_INVALID_VALUE, "dy.scales[1][0] = inf");
    xs[2] = 1.0f;
    ue[6] = 255;
    BAD("UE8M0 255", (a.opt.scale_format = MOE_FP8_SCALE_UE8M0, a.x.scales = ue, a.w.scales = ue),
        MOE_ERR_INVALID_VALUE, "w.scales[3][0] = 255 (UE8M0's NaN)");
    ue[6] = 127;
    BAD("f32 scales misaligned", a.x.scales = (const char *)xs + 1, MOE_ERR_MISALIGNED, "x.scales");
    BAD("y overlaps w.scales", a.y = ws, MOE_ERR_INVALID_OPTION, "overlap");
    BAD("N negative", a.N = -1, MOE_ERR_INVALID_SHAPE, "N = -1");
    BAD("permute_x without gather", (a.routing.gather_indices = NULL, a.opt.permute_x = 1, a.topk = NULL),
        MOE_ERR_NULL_POINTER, "permute_x");
    BAD("reduce_topk on fwd", a.opt.reduce_topk = 1, MOE_ERR_INVALID_OPTION, "reduce_topk applies to dX only");
    BAD("w_transposed on fwd", a.opt.w_transposed = 1, MOE_ERR_INVALID_OPTION,
        "options.w_transposed applies to moe_gemm_fp8_dx only");
    BAD("W^T scale NaN", (a.dx = 1, a.opt.w_transposed = 1, ws[3] = NAN), MOE_ERR_INVALID_VALUE,
        "w.scales[1][1] = nan");
    ws[3] = 0.5f;
    BAD("bad routing", m_sizes[0] = 2, MOE_ERR_INVALID_ROUTING, "m_sizes");
    m_sizes[0] = 1;
#undef BAD
    const moe_fp8_tensor x = good.x;
    CHECK(moe_gemm_fp8_fwd(MOE_BACKEND_REF, &good.routing, N, K, NULL, &x, NULL, y, NULL) == MOE_ERR_NULL_POINTER &&
          strstr(moe_last_error(), "x is NULL") != NULL, "x NULL: %s", moe_last_error());
    CHECK(moe_gemm_fp8_dx(MOE_BACKEND_REF, &good.routing, N, K, &x, NULL, NULL, y, NULL) == MOE_ERR_NULL_POINTER &&
          strstr(moe_last_error(), "w is NULL") != NULL, "w NULL: %s", moe_last_error());
    CHECK(y[0] == 12345.0f, "a refused call wrote y");
}

int main(int argc, char **argv)
{
    const uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 20261206;
    printf("seed %llu\n", (unsigned long long)seed);
    oracle_rng rng = {seed};
    exact_case();
    const double worst = random_cases(&rng, 300);
    printf("300 random cases: worst |err| / bound %.3g\n", worst);
    twin_cases(&rng, 40);
    printf("40 larger cases: the blocked twin against the definition\n");
    bad_arguments();
    printf("%ld checks, %ld failures\n", checks, failures);
    return failures ? 1 : 0;
}
