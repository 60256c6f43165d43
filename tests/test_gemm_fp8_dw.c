/* FP8 dW (moe_gemm_fp8_dw) and its 128 x 1 quantizer (moe_quantize_fp8_columns) on MOE_BACKEND_REF, against the
 * float64 oracle within its derived bound (oracle_gemm_fp8_dw, specs/FP8.md sections 2 and 4):
 *
 *   - the quantizer: every tile of every expert against moe_quantize_fp8_rows on the same values laid out as
 *     one row (the gathered, weighted column tile), so both share one scale rule; the unused scale rows hold
 *     an empty tile's scale; every source mode (expert, slot, token order) and topk weights;
 *   - dW on random codes and scales: experts of 0 .. 300 rows (partial last tiles, several tiles, empty
 *     experts), N and K below, at and past 128, both output dtypes, both scale formats, all four operand dtype
 *     pairs, accumulate; the scale rows no tile uses hold -1 (never read);
 *   - dW on quantized operands (the training step's chain) within the same bound;
 *   - in every case, the blocked twin that the reference backend runs (ref/gemm_fp8_blocked.c) bit for bit the
 *     readable definition (ref/gemm_fp8.c);
 *   - an exact case: powers of two, two experts whose tiles restart at their own offsets;
 *   - planted mutants the check must reject: one tile's scale dropped (replaced by 1), the tiles numbered
 *     without the per-expert restart;
 *   - transposed codes (options.codes_transposed, moe_quantize_fp8_columns_transposed): the transposed quantizer's
 *     codes exactly the transpose of moe_quantize_fp8_columns' and its scales the same bytes, for every source
 *     mode, with and without topk weights, both FP8 dtypes and both scale formats (24 cases), and in each quantized
 *     case; dW with codes_transposed on the transposed codes bit for bit dW on the plain codes in every random case,
 *     every quantized case (on the transposed quantizer's codes) and eight chosen shapes (M % 16 == 0 and not, empty
 *     experts, experts starting at rows that are not multiples of 16, partial last tiles, N and K multiples of 128
 *     and not, M = 0, accumulate, both output dtypes and scale formats, the four operand dtype pairs), the chosen
 *     ones also against the oracle reading the transposed codes.
 *
 * Bad arguments and bad values: tests/test_gemm_fp8_dw_bad.c.
 *
 * The same file built with -DMOE_TEST_CUDA (proptest/test_gpu_gemm_fp8_dw) runs both calls on MOE_BACKEND_CUDA with
 * device copies of every array, routing included (exits 77 where no device is visible): the exact case, the random
 * cases on codes and on quantized operands within the same bound (the portable kernel sums a tile in float32, in
 * another order), the columns quantizer bit for bit the reference's, and two cases of more output tiles than the
 * GPU has SMs (the persistent kernel's walk over several tiles per CTA).  There, dW with codes_transposed (every
 * random, quantized and chosen case, the two many-tile cases, and one of the Hopper kernel's shape, E = 4,
 * M = 1024, N = 384, K = 512) is checked within the oracle's bound of the Hopper kernel's in-tile sums
 * (ORACLE_FP8_TILE_HOPPER_BITS, which covers the portable kernel's float32 ones), a second call bitwise the
 * first, and unless MOE_FP8_DW_SM90=1 switches the Hopper kernel on (gpu/gemm/heuristics.cu), bit for bit dW on the
 * untransposed codes; the transposed quantizer bit for bit the reference's.
 *
 * Usage: test_gemm_fp8_dw [seed] */
#include "fp8_ref.h"
#include "moe_backend.h"
#include "moe_fp8.h"
#include "oracle_fp8.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "check.h"
#include "transpose.h"

#include "fp8_dw_calls.h"

/* A random routing with M = T * k rows; T from 1 .. 6 or, one time in three, 100 .. 300 (experts of more than
 * one tile). */
typedef struct routed {
    int64_t T, k, E;
    int64_t *ids, *m_sizes, *gather;
    moe_routing routing;
} routed;

static void make_routing(routed *r, oracle_rng *rng)
{
    r->E = 1 + (int64_t)oracle_rng_below(rng, 5);
    r->k = 1 + (int64_t)oracle_rng_below(rng, (uint64_t)(r->E < 2 ? r->E : 2));
    r->T = oracle_rng_below(rng, 3) ? 1 + (int64_t)oracle_rng_below(rng, 6) : 100 + (int64_t)oracle_rng_below(rng, 201);
    const int64_t M = r->T * r->k;
    r->ids = xmalloc((size_t)M * sizeof(int64_t));
    r->m_sizes = xmalloc((size_t)r->E * sizeof(int64_t));
    r->gather = xmalloc((size_t)M * sizeof(int64_t));
    oracle_topk_ids(rng, r->T, r->k, r->E, r->ids);
    REQUIRE(moe_routing_from_topk(r->T, r->k, r->E, r->ids, r->m_sizes, r->gather, NULL) == MOE_OK, "routing: %s",
            moe_last_error());
    r->routing = (moe_routing){r->T, r->k, r->E, r->m_sizes, r->gather};
}

static void free_routing(routed *r) { free(r->ids), free(r->m_sizes), free(r->gather); }

/* N and K: below, at and past multiples of 128 (smaller with many rows, so that a case costs little). */
static int64_t random_length(oracle_rng *rng, int64_t M)
{
    static const int64_t lengths[] = {1, 7, 64, 127, 128, 129, 200, 257};
    return lengths[oracle_rng_below(rng, M > 100 ? 6 : 8)];
}

static uint8_t finite_code(oracle_rng *rng, moe_dtype dtype)
{
    for (;;) {
        const uint8_t c = (uint8_t)oracle_rng_below(rng, 256);
        if (isfinite(dtype == MOE_E5M2 ? moe_e5m2_to_f32(c) : moe_e4m3_to_f32(c)))
            return c;
    }
}

/* The scale rows expert e's tiles use: first / 128 + e onwards, tiles(m) of them. */
static int64_t first_scale_row(const moe_routing *routing, int64_t e, int64_t *first_row)
{
    int64_t first = 0;
    for (int64_t i = 0; i < e; i++)
        first += routing->m_sizes[i];
    *first_row = first;
    return first / 128 + e;
}

/* Random scales for the rows in use (2^[-6, 6] times [1, 2), or biased exponents 121 .. 133); -1 (or 255,
 * UE8M0's NaN) in the rows no tile uses, which nothing may read. */
static void *random_column_scales(oracle_rng *rng, moe_fp8_scale_format format, const moe_routing *routing,
                                  int64_t cols)
{
    const int64_t rows = moe_fp8_column_scale_rows(routing->num_tokens * routing->topk, routing->num_experts);
    void *s = xmalloc((size_t)(rows * cols) * scale_bytes(format));
    for (int64_t i = 0; i < rows * cols; i++) {
        if (format == MOE_FP8_SCALE_UE8M0)
            ((uint8_t *)s)[i] = 255;
        else
            ((float *)s)[i] = -1.0f;
    }
    for (int64_t e = 0; e < routing->num_experts; e++) {
        int64_t first;
        const int64_t row0 = first_scale_row(routing, e, &first), used = (routing->m_sizes[e] + 127) / 128;
        for (int64_t i = row0 * cols; i < (row0 + used) * cols; i++) {
            if (format == MOE_FP8_SCALE_UE8M0)
                ((uint8_t *)s)[i] = (uint8_t)(121 + oracle_rng_below(rng, 13));
            else
                ((float *)s)[i] = (float)ldexp(1.0 + 0.5 * (oracle_rng_symmetric(rng) + 1.0),
                                               (int)oracle_rng_below(rng, 13) - 6);
        }
    }
    return s;
}

/* Runs dW and checks it against the oracle; returns |err| / bound at worst (and counts the elements outside
 * in *outside when not NULL, without failing: the mutants' use). */
static double check_dw(const char *what, const moe_routing *routing, int64_t N, int64_t K, const moe_fp8_tensor *x,
                       const moe_fp8_tensor *dy, const moe_fp8_tensor *oracle_x, const moe_fp8_tensor *oracle_dy,
                       const moe_fp8_options *opt, oracle_rng *rng, int64_t *outside)
{
    const int64_t count = routing->num_experts * N * K;
    void *dw = xmalloc((size_t)count * 4);
    double *value = xmalloc((size_t)count * sizeof(double)), *bound = xmalloc((size_t)count * sizeof(double));
    oracle_fill(rng, opt->out_dtype, dw, count, 0);
    oracle_gemm_fp8_dw(routing, N, K, oracle_x, oracle_dy, dw, opt, ORACLE_FP8_TILE_F32, value, bound);
#ifndef MOE_TEST_CUDA
    const size_t bytes = (size_t)count * moe_dtype_size(opt->out_dtype);
    void *naive = xmalloc(bytes);
    memcpy(naive, dw, bytes);
#endif
    const moe_status st = dw_on(routing, N, K, x, dy, dw, opt);
    CHECK(st == MOE_OK, "%s: status %d: %s", what, (int)st, moe_last_error());
#ifndef MOE_TEST_CUDA
    /* the reference backend runs the blocked twin: the readable definition must give the same bits */
    const moe_fp8_problem p = {
        .g = {.op = "test_gemm_fp8_dw", .num_tokens = routing->num_tokens, .topk = routing->topk,
              .num_experts = routing->num_experts, .rows = routing->num_tokens * routing->topk, .N = N, .K = K,
              .m_sizes = routing->m_sizes, .gather_indices = routing->gather_indices, .dtype = opt->out_dtype,
              .dw_dtype = opt->out_dtype, .accumulate = opt->accumulate},
        .scale_format = opt->scale_format};
    const moe_status naive_st = moe_ref_gemm_fp8_dw(&p, x, dy, naive);
    const int64_t differs = st == MOE_OK && naive_st == MOE_OK
                                ? first_difference(naive, dw, count, moe_dtype_size(opt->out_dtype)) : -1;
    CHECK(naive_st == MOE_OK && differs < 0, "%s: the twins differ at element %lld (status %d)", what,
          (long long)differs, (int)naive_st);
    free(naive);
#endif
    double ratio = 0.0;
    const int64_t bad = oracle_compare(what, opt->out_dtype, dw, value, bound, count, outside ? NULL : stdout, 3,
                                       &ratio);
    if (outside != NULL)
        *outside = bad;
    else
        CHECK(bad == 0, "%s: %lld elements outside the bound", what, (long long)bad);
    free(dw), free(value), free(bound);
    return ratio;
}

/* Whether t [cols][rows] is the transpose of codes [rows][cols]. */
static int is_transpose(const uint8_t *t, const uint8_t *codes, int64_t rows, int64_t cols)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            if (t[c * rows + r] != codes[r * cols + c])
                return 0;
    return 1;
}

#ifdef MOE_TEST_CUDA
#define TRANSPOSED_TILE_BITS ORACLE_FP8_TILE_HOPPER_BITS /* the wgmma kernel's in-tile sums (covers float32's) */
#else
#define TRANSPOSED_TILE_BITS ORACLE_FP8_TILE_F32
#endif

/* dW with options.codes_transposed on x_t [K][M] and dy_t [N][M] (the transposes of x's and dy's codes, the same
 * scales) from a random old dW: on the reference bit for bit dW on x and dy; on CUDA within the oracle's bound
 * (the Hopper kernel's in-tile sums: it may run the wgmma kernel), a second call bitwise the first, and unless
 * MOE_FP8_DW_SM90=1 switches the Hopper kernel on, bit for bit dW on x and dy (the codes are copied back for the
 * portable kernel).  With
 * `oracle` (always on CUDA) also against the oracle reading the transposed codes (its codes_transposed). */
static void check_dw_transposed(const char *what, const moe_routing *routing, int64_t N, int64_t K,
                                const moe_fp8_tensor *x, const moe_fp8_tensor *dy, const moe_fp8_tensor *x_t,
                                const moe_fp8_tensor *dy_t, const moe_fp8_options *opt, int oracle, oracle_rng *rng)
{
    const int64_t count = routing->num_experts * N * K;
    const size_t bytes = (size_t)count * moe_dtype_size(opt->out_dtype);
    moe_fp8_options t_opt = *opt;
    t_opt.codes_transposed = 1;
    void *old = xmalloc(bytes + 4), *got = xmalloc(bytes + 4), *again = xmalloc(bytes + 4);
    oracle_fill(rng, opt->out_dtype, old, count, 0);
    memcpy(got, old, bytes);
    memcpy(again, old, bytes);
    moe_status st = dw_on(routing, N, K, x_t, dy_t, got, &t_opt);
    CHECK(st == MOE_OK, "%s, codes transposed: status %d: %s", what, (int)st, moe_last_error());
#ifdef MOE_TEST_CUDA
    (void)oracle;
    st = dw_on(routing, N, K, x_t, dy_t, again, &t_opt);
    CHECK(st == MOE_OK && memcmp(got, again, bytes) == 0, "%s, codes transposed: a second call differs (status %d)",
          what, (int)st);
    const char *hopper = getenv("MOE_FP8_DW_SM90");
    if (hopper == NULL || strcmp(hopper, "1") != 0) { /* copied back for the portable kernel: the plain call's bits */
        memcpy(again, old, bytes);
        st = dw_on(routing, N, K, x, dy, again, opt);
        const int64_t differs =
            st == MOE_OK ? first_difference(again, got, count, moe_dtype_size(opt->out_dtype)) : -1;
        CHECK(st == MOE_OK && differs < 0, "%s, codes transposed (the portable kernel): differs from dW on the "
              "untransposed codes at element %lld (status %d)", what, (long long)differs, (int)st);
    }
    oracle = 1;
#else
    st = dw_on(routing, N, K, x, dy, again, opt);
    const int64_t differs = st == MOE_OK ? first_difference(again, got, count, moe_dtype_size(opt->out_dtype)) : -1;
    CHECK(st == MOE_OK && differs < 0, "%s, codes transposed: differs from dW on the untransposed codes at element "
          "%lld (status %d)", what, (long long)differs, (int)st);
#endif
    if (oracle) {
        double *value = xmalloc((size_t)count * sizeof(double) + 8);
        double *bound = xmalloc((size_t)count * sizeof(double) + 8);
        oracle_gemm_fp8_dw(routing, N, K, x_t, dy_t, old, &t_opt, TRANSPOSED_TILE_BITS, value, bound);
        char label[300];
        snprintf(label, sizeof label, "%s, codes transposed", what);
        double ratio = 0.0;
        const int64_t bad = oracle_compare(label, opt->out_dtype, got, value, bound, count, stdout, 3, &ratio);
        CHECK(bad == 0, "%s: %lld elements outside the bound", label, (long long)bad);
        free(value), free(bound);
    }
    free(old), free(got), free(again);
}

/* What every random case draws: the routing, N and K, the options (output dtype, scale format, accumulate) and
 * the operands' FP8 dtypes; `what` describes it. */
typedef struct dw_case {
    routed r;
    int64_t M, N, K;
    moe_fp8_options opt;
    moe_fp8_tensor x, dy;
    int transposed_oracle; /* check_dw_transposed's `oracle` */
    char what[160];
} dw_case;

static void make_dw_case(dw_case *c, oracle_rng *rng)
{
    make_routing(&c->r, rng);
    c->M = c->r.T * c->r.k;
    c->N = random_length(rng, c->M);
    c->K = random_length(rng, c->M);
    memset(&c->opt, 0, sizeof c->opt);
    c->opt.out_dtype = oracle_rng_below(rng, 2) ? MOE_BF16 : MOE_F32;
    c->opt.scale_format = oracle_rng_below(rng, 2) ? MOE_FP8_SCALE_UE8M0 : MOE_FP8_SCALE_F32;
    c->opt.accumulate = (int)oracle_rng_below(rng, 2);
    c->x = (moe_fp8_tensor){NULL, NULL, oracle_rng_below(rng, 3) ? MOE_E4M3 : MOE_E5M2};
    c->dy = (moe_fp8_tensor){NULL, NULL, oracle_rng_below(rng, 3) ? MOE_E4M3 : MOE_E5M2};
    c->transposed_oracle = 0;
    snprintf(c->what, sizeof c->what, "dw T=%lld k=%lld E=%lld N=%lld K=%lld %sx%s out=%s scales=%s acc=%d",
             (long long)c->r.T, (long long)c->r.k, (long long)c->r.E, (long long)c->N, (long long)c->K,
             moe_dtype_name(c->dy.dtype), moe_dtype_name(c->x.dtype), moe_dtype_name(c->opt.out_dtype),
             c->opt.scale_format ? "ue8m0" : "f32", c->opt.accumulate);
}

/* count random cases of one kind; returns the worst |err| / bound. */
static double random_cases(oracle_rng *rng, int count, double (*run)(dw_case *c, oracle_rng *rng))
{
    double worst = 0.0;
    for (int i = 0; i < count; i++) {
        dw_case c;
        make_dw_case(&c, rng);
        const double ratio = run(&c, rng);
        worst = ratio > worst ? ratio : worst;
        free_routing(&c.r);
    }
    return worst;
}

/* dW on random codes and scales; then on their transposes with options.codes_transposed. */
static double gemm_case(dw_case *cp, oracle_rng *rng)
{
    dw_case c = *cp; /* its operands filled here */
    const int64_t M = c.M, N = c.N, K = c.K;
    uint8_t *xq = xmalloc((size_t)(M * K)), *dyq = xmalloc((size_t)(M * N));
    for (int64_t j = 0; j < M * K; j++)
        xq[j] = finite_code(rng, c.x.dtype);
    for (int64_t j = 0; j < M * N; j++)
        dyq[j] = finite_code(rng, c.dy.dtype);
    void *xs = random_column_scales(rng, c.opt.scale_format, &c.r.routing, K);
    void *dys = random_column_scales(rng, c.opt.scale_format, &c.r.routing, N);
    c.x.data = xq, c.x.scales = xs, c.dy.data = dyq, c.dy.scales = dys;
    const double ratio = check_dw(c.what, &c.r.routing, N, K, &c.x, &c.dy, &c.x, &c.dy, &c.opt, rng, NULL);
    uint8_t *xt = transpose_batches(xq, 1, M, K, 1), *dyt = transpose_batches(dyq, 1, M, N, 1);
    const moe_fp8_tensor x_t = {xt, xs, c.x.dtype}, dy_t = {dyt, dys, c.dy.dtype};
    check_dw_transposed(c.what, &c.r.routing, N, K, &c.x, &c.dy, &x_t, &dy_t, &c.opt, c.transposed_oracle, rng);
    free(xq), free(dyq), free(xs), free(dys), free(xt), free(dyt);
    return ratio;
}

#ifdef MOE_TEST_CUDA
/* dW with more output tiles than any GPU has SMs (16 experts x 3 x 5 or 4 of 128 x 128), so that each persistent
 * CTA of the kernel walks several output tiles and loads the next one's first step while it finishes the last
 * one's: experts 3 and 9 without rows (their tiles are stored +0 in passing), the others of 1 .. ~200 rows; K = 520
 * (X read code by code) and K = 512 (16 codes at a time).  Device-only: on the reference it adds nothing to the
 * random cases but time. */
static double many_tiles_cases(oracle_rng *rng)
{
    double worst = 0.0;
    static const int64_t lengths_k[] = {520, 512};
    for (int i = 0; i < 2; i++) {
        dw_case c;
        c.r.T = 700, c.r.k = 2, c.r.E = 16;
        const int64_t M = c.r.T * c.r.k;
        c.r.ids = xmalloc((size_t)M * sizeof(int64_t));
        c.r.m_sizes = xmalloc((size_t)c.r.E * sizeof(int64_t));
        c.r.gather = xmalloc((size_t)M * sizeof(int64_t));
        for (int64_t t = 0; t < c.r.T; t++) { /* two distinct experts of 16, never 3 or 9, skewed towards the low ones */
            int64_t a, b;
            do
                a = (int64_t)oracle_rng_below(rng, 1 + oracle_rng_below(rng, 16));
            while (a == 3 || a == 9);
            do
                b = (int64_t)oracle_rng_below(rng, 16);
            while (b == 3 || b == 9 || b == a);
            c.r.ids[2 * t] = a, c.r.ids[2 * t + 1] = b;
        }
        REQUIRE(moe_routing_from_topk(c.r.T, c.r.k, c.r.E, c.r.ids, c.r.m_sizes, c.r.gather, NULL) == MOE_OK,
                "routing: %s", moe_last_error());
        c.r.routing = (moe_routing){c.r.T, c.r.k, c.r.E, c.r.m_sizes, c.r.gather};
        c.M = M, c.N = 384, c.K = lengths_k[i];
        memset(&c.opt, 0, sizeof c.opt);
        c.opt.out_dtype = i ? MOE_BF16 : MOE_F32;
        c.opt.accumulate = i;
        c.x = (moe_fp8_tensor){NULL, NULL, MOE_E4M3};
        c.dy = (moe_fp8_tensor){NULL, NULL, i ? MOE_E5M2 : MOE_E4M3};
        c.transposed_oracle = 1;
        snprintf(c.what, sizeof c.what, "dw many tiles T=700 k=2 E=16 (3, 9 empty) N=384 K=%lld acc=%d",
                 (long long)c.K, i);
        const double ratio = gemm_case(&c, rng);
        worst = ratio > worst ? ratio : worst;
        free_routing(&c.r);
    }
    return worst;
}
#endif

/* Quantizes src with moe_quantize_fp8_columns and checks every tile against moe_quantize_fp8_rows on the tile's
 * values laid out as one row; the unused scale rows against an empty tile's scale. */
static void check_columns(const char *what, const routed *r, int64_t cols, moe_dtype src_dtype, const void *src,
                          moe_fp8_row_source source, const float *topk, moe_dtype fp8_dtype,
                          moe_fp8_scale_format format, const uint8_t *q, const void *scales)
{
    const int64_t M = r->T * r->k, rows = moe_fp8_column_scale_rows(M, r->E);
    const size_t sb = scale_bytes(format);
    unsigned char *used = calloc((size_t)rows + 1, 1);
    float tile[128];
    uint8_t tile_q[128], tile_scale[4];
    int64_t mismatches = 0;
    for (int64_t e = 0; e < r->E; e++) {
        int64_t first;
        const int64_t row0 = first_scale_row(&r->routing, e, &first), end = first + r->m_sizes[e];
        for (int64_t r0 = first, t = 0; r0 < end; r0 += 128, t++) {
            const int64_t len = end - r0 < 128 ? end - r0 : 128;
            used[row0 + t] = 1;
            for (int64_t c = 0; c < cols; c++) {
                for (int64_t i = 0; i < len; i++) {
                    const int64_t row = r0 + i, slot = r->gather[row];
                    const int64_t src_row = source == MOE_FP8_ROWS_EXPERT ? row
                                            : source == MOE_FP8_ROWS_SLOT ? slot : slot / r->k;
                    const float v = src_dtype == MOE_F32 ? ((const float *)src)[src_row * cols + c]
                                                         : moe_bf16_to_f32(((const uint16_t *)src)[src_row * cols + c]);
                    tile[i] = topk != NULL ? topk[slot] * v : v;
                }
                REQUIRE(moe_quantize_fp8_rows(MOE_BACKEND_REF, MOE_F32, 1, len, tile, fp8_dtype, format, tile_q,
                                              tile_scale, NULL) == MOE_OK, "%s: rows quantizer: %s", what,
                        moe_last_error());
                int same = memcmp(tile_scale, (const char *)scales + ((row0 + t) * cols + c) * sb, sb) == 0;
                for (int64_t i = 0; i < len; i++)
                    same = same && tile_q[i] == q[(r0 + i) * cols + c];
                mismatches += !same;
            }
        }
    }
    CHECK(mismatches == 0, "%s: %lld tiles differ from the rows quantizer's", what, (long long)mismatches);
    /* an empty tile's scale: the rows quantizer's on a zero row */
    const float zero = 0.0f;
    REQUIRE(moe_quantize_fp8_rows(MOE_BACKEND_REF, MOE_F32, 1, 1, &zero, fp8_dtype, format, tile_q, tile_scale, NULL) ==
            MOE_OK, "zero row: %s", moe_last_error());
    int64_t unused_bad = 0;
    for (int64_t row = 0; row < rows; row++)
        for (int64_t c = 0; !used[row] && c < cols; c++)
            unused_bad += memcmp(tile_scale, (const char *)scales + (row * cols + c) * sb, sb) != 0;
    CHECK(unused_bad == 0, "%s: %lld unused scales are not an empty tile's", what, (long long)unused_bad);
    free(used);
}

/* The quantizer on random sources (every mode), then dW on its operands within the bound. */
static double quantized_case(dw_case *cp, oracle_rng *rng)
{
    const dw_case c = *cp;
    const int64_t M = c.M, N = c.N, K = c.K;
    const routed r = c.r;
    const moe_fp8_options opt = c.opt;
    moe_fp8_tensor x = c.x, dy = c.dy;
    const moe_dtype src_dtype = oracle_rng_below(rng, 2) ? MOE_BF16 : MOE_F32;
    const moe_fp8_row_source x_source = oracle_rng_below(rng, 2) ? MOE_FP8_ROWS_TOKEN : MOE_FP8_ROWS_EXPERT;
    const moe_fp8_row_source dy_source = oracle_rng_below(rng, 2) ? MOE_FP8_ROWS_SLOT : MOE_FP8_ROWS_EXPERT;
    const int64_t x_rows = x_source == MOE_FP8_ROWS_TOKEN ? r.T : M;
    void *x_src = xmalloc((size_t)(x_rows * K) * 4), *dy_src = xmalloc((size_t)(M * N) * 4);
    oracle_fill(rng, src_dtype, x_src, x_rows * K, (int)oracle_rng_below(rng, 3));
    oracle_fill(rng, src_dtype, dy_src, M * N, (int)oracle_rng_below(rng, 3));
    float *topk = NULL;
    if (oracle_rng_below(rng, 2)) {
        topk = xmalloc((size_t)M * sizeof(float));
        for (int64_t j = 0; j < M; j++)
            topk[j] = (float)(0.05 + 0.5 * (oracle_rng_symmetric(rng) + 1.0));
    }
    const int64_t srows = moe_fp8_column_scale_rows(M, r.E);
    const size_t sb = scale_bytes(opt.scale_format);
    uint8_t *xq = xmalloc((size_t)(M * K)), *dyq = xmalloc((size_t)(M * N));
    void *xs = xmalloc((size_t)(srows * K) * sb), *dys = xmalloc((size_t)(srows * N) * sb);
    char what[300];
    snprintf(what, sizeof what, "quantized %s %s x_src=%d dy_src=%d topk=%d", c.what, moe_dtype_name(src_dtype),
             (int)x_source, (int)dy_source, topk != NULL);
    moe_status st = columns_on(&r.routing, src_dtype, K, x_src, x_source, NULL, x.dtype, opt.scale_format, 0, xq, xs);
    CHECK(st == MOE_OK, "%s: quantize x: %s", what, moe_last_error());
    st = columns_on(&r.routing, src_dtype, N, dy_src, dy_source, topk, dy.dtype, opt.scale_format, 0, dyq, dys);
    CHECK(st == MOE_OK, "%s: quantize dy: %s", what, moe_last_error());
    check_columns(what, &r, K, src_dtype, x_src, x_source, NULL, x.dtype, opt.scale_format, xq, xs);
    check_columns(what, &r, N, src_dtype, dy_src, dy_source, topk, dy.dtype, opt.scale_format, dyq, dys);
    x.data = xq, x.scales = xs, dy.data = dyq, dy.scales = dys;
    const double ratio = check_dw(what, &r.routing, N, K, &x, &dy, &x, &dy, &opt, rng, NULL);
    /* the transposed quantizer's codes and scales, and dW on them with options.codes_transposed */
    uint8_t *xt = xmalloc((size_t)(M * K) + 1), *dyt = xmalloc((size_t)(M * N) + 1);
    void *xts = xmalloc((size_t)(srows * K) * sb + 1), *dyts = xmalloc((size_t)(srows * N) * sb + 1);
    st = columns_on(&r.routing, src_dtype, K, x_src, x_source, NULL, x.dtype, opt.scale_format, 1, xt, xts);
    CHECK(st == MOE_OK, "%s: quantize x transposed: %s", what, moe_last_error());
    st = columns_on(&r.routing, src_dtype, N, dy_src, dy_source, topk, dy.dtype, opt.scale_format, 1, dyt, dyts);
    CHECK(st == MOE_OK, "%s: quantize dy transposed: %s", what, moe_last_error());
    CHECK(is_transpose(xt, xq, M, K) && is_transpose(dyt, dyq, M, N) &&
          memcmp(xts, xs, (size_t)(srows * K) * sb) == 0 && memcmp(dyts, dys, (size_t)(srows * N) * sb) == 0,
          "%s: the transposed quantizer's codes are not the transpose of the columns quantizer's, or its scales "
          "differ", what);
    const moe_fp8_tensor x_t = {xt, xts, x.dtype}, dy_t = {dyt, dyts, dy.dtype};
    check_dw_transposed(what, &r.routing, N, K, &x, &dy, &x_t, &dy_t, &opt, 0, rng);
    free(x_src), free(dy_src), free(topk), free(xq), free(dyq), free(xs), free(dys);
    free(xt), free(dyt), free(xts), free(dyts);
    return ratio;
}

/* The transposed quantizer against the columns quantizer on the same random sources: its codes exactly the
 * transpose, its scales the same bytes, for every source mode, with and without topk weights, both FP8 dtypes and
 * both scale formats (24 cases; on CUDA each call is also the reference's bit for bit, columns_on). */
static void transposed_quantizer_cases(oracle_rng *rng)
{
    int64_t failed = 0;
    for (int mode = 0; mode < 24; mode++) {
        const moe_fp8_row_source source = (moe_fp8_row_source)(mode % 3);
        const int weighted = mode / 3 % 2;
        const moe_dtype fp8 = mode / 6 % 2 ? MOE_E5M2 : MOE_E4M3;
        const moe_fp8_scale_format format = mode / 12 ? MOE_FP8_SCALE_UE8M0 : MOE_FP8_SCALE_F32;
        routed r;
        make_routing(&r, rng);
        const int64_t M = r.T * r.k, cols = random_length(rng, M), rows = source == MOE_FP8_ROWS_TOKEN ? r.T : M;
        const int64_t srows = moe_fp8_column_scale_rows(M, r.E);
        const size_t sb = scale_bytes(format), scale_size = (size_t)(srows * cols) * sb;
        const moe_dtype src_dtype = oracle_rng_below(rng, 2) ? MOE_BF16 : MOE_F32;
        void *src = xmalloc((size_t)(rows * cols) * 4 + 4);
        oracle_fill(rng, src_dtype, src, rows * cols, (int)oracle_rng_below(rng, 3));
        float *topk = weighted ? xmalloc((size_t)M * sizeof(float) + 4) : NULL;
        for (int64_t j = 0; weighted && j < M; j++)
            topk[j] = (float)(0.05 + 0.5 * (oracle_rng_symmetric(rng) + 1.0));
        uint8_t *q = xmalloc((size_t)(M * cols) + 1), *qt = xmalloc((size_t)(M * cols) + 1);
        void *s = xmalloc(scale_size + 1), *st_ = xmalloc(scale_size + 1);
        memset(qt, 0xab, (size_t)(M * cols) + 1);
        memset(st_, 0xab, scale_size + 1);
        char what[200];
        snprintf(what, sizeof what, "transposed quantizer T=%lld k=%lld E=%lld cols=%lld source=%d topk=%d %s %s %s",
                 (long long)r.T, (long long)r.k, (long long)r.E, (long long)cols, (int)source, weighted,
                 moe_dtype_name(src_dtype), moe_dtype_name(fp8), format ? "ue8m0" : "f32");
        const moe_status plain = columns_on(&r.routing, src_dtype, cols, src, source, topk, fp8, format, 0, q, s);
        const moe_status transposed = columns_on(&r.routing, src_dtype, cols, src, source, topk, fp8, format, 1, qt,
                                                 st_);
        CHECK(plain == MOE_OK && transposed == MOE_OK, "%s: status %d, %d: %s", what, (int)plain, (int)transposed,
              moe_last_error());
        const int same = is_transpose(qt, q, M, cols) && memcmp(s, st_, scale_size) == 0;
        CHECK(same, "%s: codes not the transpose of moe_quantize_fp8_columns', or the scales differ", what);
        failed += !same;
        free(src), free(topk), free(q), free(qt), free(s), free(st_);
        free_routing(&r);
    }
    printf("24 transposed quantizations (3 sources x topk or not x 2 dtypes x 2 scale formats): %lld differ\n",
           (long long)failed);
}

/* dW on codes_transposed in chosen shapes: M % 16 == 0 and not, experts of 0 rows, partial last tiles, N and K
 * multiples of 128 and not, accumulate, both output dtypes and scale formats, the four operand dtype pairs; each
 * also against the oracle reading the transposed codes. */
static void transposed_dw_cases(oracle_rng *rng)
{
    static const struct {
        int64_t E, m_sizes[5], N, K;
        int bf16, ue8m0, accumulate;
        moe_dtype dy, x;
    } cases[] = {
        {3, {32, 0, 96}, 128, 256, 0, 0, 0, MOE_E4M3, MOE_E4M3},       /* M = 128, an empty expert */
        {4, {130, 0, 77, 1}, 129, 200, 1, 1, 1, MOE_E5M2, MOE_E4M3},   /* M = 208 = 13 * 16, partial tiles */
        {2, {300, 5}, 7, 128, 0, 1, 1, MOE_E4M3, MOE_E5M2},            /* M = 305, three tiles and one */
        {5, {0, 0, 17, 0, 0}, 257, 64, 1, 0, 0, MOE_E5M2, MOE_E5M2},   /* M = 17, one expert of rows */
        {3, {0, 16, 0}, 1, 1, 0, 0, 1, MOE_E4M3, MOE_E4M3},            /* M = 16, N = K = 1 */
        {2, {0, 0}, 16, 32, 0, 1, 1, MOE_E4M3, MOE_E5M2},              /* M = 0: zeros, or the old values */
        {2, {256, 128}, 384, 130, 1, 0, 1, MOE_E4M3, MOE_E4M3},        /* M = 384, whole tiles */
        {4, {20, 37, 130, 69}, 200, 136, 0, 0, 0, MOE_E5M2, MOE_E4M3}, /* M = 256, experts from rows 20, 57, 187 */
#ifdef MOE_TEST_CUDA
        {4, {300, 0, 468, 256}, 384, 512, 0, 1, 1, MOE_E4M3, MOE_E5M2}, /* M = 1024: the Hopper kernel's size */
#endif
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dw_case c;
        c.r.E = cases[i].E, c.r.k = 1, c.r.T = 0;
        c.r.ids = NULL;
        c.r.m_sizes = xmalloc((size_t)c.r.E * sizeof(int64_t));
        for (int64_t e = 0; e < c.r.E; e++)
            c.r.T += c.r.m_sizes[e] = cases[i].m_sizes[e];
        c.r.gather = NULL;
        c.r.routing = (moe_routing){c.r.T, 1, c.r.E, c.r.m_sizes, NULL};
        c.M = c.r.T, c.N = cases[i].N, c.K = cases[i].K;
        memset(&c.opt, 0, sizeof c.opt);
        c.opt.out_dtype = cases[i].bf16 ? MOE_BF16 : MOE_F32;
        c.opt.scale_format = cases[i].ue8m0 ? MOE_FP8_SCALE_UE8M0 : MOE_FP8_SCALE_F32;
        c.opt.accumulate = cases[i].accumulate;
        c.x = (moe_fp8_tensor){NULL, NULL, cases[i].x};
        c.dy = (moe_fp8_tensor){NULL, NULL, cases[i].dy};
        c.transposed_oracle = 1;
        snprintf(c.what, sizeof c.what, "dw fixed case %zu M=%lld E=%lld N=%lld K=%lld %sx%s out=%s scales=%s acc=%d",
                 i, (long long)c.M, (long long)c.r.E, (long long)c.N, (long long)c.K, moe_dtype_name(c.dy.dtype),
                 moe_dtype_name(c.x.dtype), moe_dtype_name(c.opt.out_dtype), c.opt.scale_format ? "ue8m0" : "f32",
                 c.opt.accumulate);
        gemm_case(&c, rng);
        free_routing(&c.r);
    }
    printf("%zu fixed dW cases on transposed codes\n", sizeof cases / sizeof cases[0]);
}

/* Two experts of 130 and 300 rows: x codes 1, dy codes 2, the scales of each scale row inverse powers of two in
 * x and dy, so each tile adds 2 * its rows: dW[0] = 260, dW[1] = 600 exactly (expert 1's tiles take scale rows
 * 2, 3, 4 = 130 / 128 + 1 onwards; the mutants below check that numbering).  Then an empty expert between
 * them: zeros, or the old values with accumulate. */
/* Scale row i: 2^-exponent[i] in each of x's K columns, 2^exponent[i] in each of dy's N. */
static void inverse_scales(int rows, const int *exponent, int K, float *xs, int N, float *dys)
{
    for (int row = 0; row < rows; row++) {
        for (int c = 0; c < K; c++)
            xs[row * K + c] = ldexpf(1.0f, -exponent[row]);
        for (int n = 0; n < N; n++)
            dys[row * N + n] = ldexpf(1.0f, exponent[row]);
    }
}

static void exact_case(void)
{
    enum { M = 430, N = 2, K = 3, E = 2 };
    int64_t m_sizes[E] = {130, 300};
    const moe_routing routing = {M, 1, E, m_sizes, NULL};
    const int64_t srows = moe_fp8_column_scale_rows(M, E);
    CHECK(srows == 5, "scale rows of M = 430, E = 2: %lld, expected 5", (long long)srows);
    static uint8_t xq[M * K], dyq[M * N];
    memset(xq, moe_f32_to_e4m3(1.0f), sizeof xq);
    memset(dyq, moe_f32_to_e4m3(2.0f), sizeof dyq);
    float xs[5 * K], dys[5 * N];
    static const int row_exponent[5] = {0, 1, 1, 2, 3}; /* rows 0, 1: expert 0's tiles; 2, 3, 4: expert 1's */
    inverse_scales(5, row_exponent, K, xs, N, dys);
    const moe_fp8_tensor x = {xq, xs, MOE_E4M3}, dy = {dyq, dys, MOE_E4M3};
    float dw[E * N * K];
    CHECK(dw_on(&routing, N, K, &x, &dy, dw, NULL) == MOE_OK, "exact case: %s", moe_last_error());
    for (int i = 0; i < E * N * K; i++)
        CHECK(dw[i] == (i < N * K ? 260.0f : 600.0f), "exact case: dw[%d] = %g, expected %g", i, (double)dw[i],
              i < N * K ? 260.0 : 600.0);
    /* an empty expert gets zeros; with accumulate its old values stay */
    int64_t empty_sizes[3] = {130, 0, 300};
    const moe_routing with_empty = {M, 1, 3, empty_sizes, NULL};
    CHECK(moe_fp8_column_scale_rows(M, 3) == 6, "scale rows of M = 430, E = 3");
    float xs3[6 * K], dys3[6 * N], dw3[3 * N * K];
    static const int row_exponent3[6] = {0, 1, 5, 1, 2, 3}; /* row 2 unused: the empty expert's (130 / 128 + 1) */
    inverse_scales(6, row_exponent3, K, xs3, N, dys3);
    /* expert 2 begins at row 130: scale row 130 / 128 + 2 = 3 */
    const moe_fp8_tensor x3 = {xq, xs3, MOE_E4M3}, dy3 = {dyq, dys3, MOE_E4M3};
    for (int i = 0; i < 3 * N * K; i++)
        dw3[i] = 7.0f;
    const moe_fp8_options accumulate = {.accumulate = 1};
    CHECK(dw_on(&with_empty, N, K, &x3, &dy3, dw3, &accumulate) == MOE_OK, "empty expert: %s", moe_last_error());
    for (int i = 0; i < 3 * N * K; i++) {
        const float want = i < N * K ? 267.0f : i < 2 * N * K ? 7.0f : 607.0f;
        CHECK(dw3[i] == want, "empty expert, accumulate: dw[%d] = %g, expected %g", i, (double)dw3[i], (double)want);
    }
    CHECK(dw_on(&with_empty, N, K, &x3, &dy3, dw3, NULL) == MOE_OK, "empty expert: %s", moe_last_error());
    for (int i = N * K; i < 2 * N * K; i++)
        CHECK(dw3[i] == 0.0f && !signbit(dw3[i]), "empty expert: dw[%d] = %g, expected +0", i, (double)dw3[i]);
}

/* Planted mutants: the reference fed scales that a broken implementation would read must fail the oracle's
 * check on the true scales.  (a) one tile's dY scale dropped (read as 1); (b) the tiles numbered without the
 * per-expert restart (expert e's tile t read from scale row (first_e + 128 t) / 128). */
static void mutants(oracle_rng *rng)
{
    enum { E = 3, N = 5, K = 4 };
    int64_t m_sizes[E] = {150, 0, 140}; /* expert 2's tiles: scale rows 150 / 128 + 2 = 3, 4; unrestarted: 1, 2 */
    const int64_t M = 290;
    const moe_routing routing = {M, 1, E, m_sizes, NULL};
    const int64_t srows = moe_fp8_column_scale_rows(M, E);
    uint8_t *xq = xmalloc((size_t)(M * K)), *dyq = xmalloc((size_t)(M * N));
    for (int64_t i = 0; i < M * K; i++)
        xq[i] = finite_code(rng, MOE_E4M3);
    for (int64_t i = 0; i < M * N; i++)
        dyq[i] = finite_code(rng, MOE_E4M3);
    float *xs = random_column_scales(rng, MOE_FP8_SCALE_F32, &routing, K);
    float *dys = random_column_scales(rng, MOE_FP8_SCALE_F32, &routing, N);
    for (int64_t i = 0; i < srows * N; i++) /* dy's scales at least 2, so that 1 is a change; none unused */
        dys[i] = dys[i] > 0.0f ? 2.0f + dys[i] : 3.0f;
    for (int64_t i = 0; i < srows * K; i++)
        xs[i] = xs[i] > 0.0f ? xs[i] : 0.75f;
    const moe_fp8_tensor x = {xq, xs, MOE_E4M3}, dy = {dyq, dys, MOE_E4M3};
    const moe_fp8_options opt = {0};
    int64_t outside = -1;
    check_dw("mutants' base", &routing, N, K, &x, &dy, &x, &dy, &opt, rng, &outside);
    CHECK(outside == 0, "the unmutated call: %lld elements outside", (long long)outside);
    /* (a) */
    float *dropped = xmalloc((size_t)(srows * N) * sizeof(float));
    memcpy(dropped, dys, (size_t)(srows * N) * sizeof(float));
    dropped[4 * N + 2] = 1.0f; /* expert 2's second tile, column n = 2 */
    const moe_fp8_tensor dy_dropped = {dyq, dropped, MOE_E4M3};
    check_dw("mutant: a dropped tile scale", &routing, N, K, &x, &dy_dropped, &x, &dy, &opt, rng, &outside);
    CHECK(outside > 0, "a dropped tile scale passed the check");
    printf("mutant, a dropped tile scale: %lld elements outside the bound\n", (long long)outside);
    /* (b): expert 2 reads rows 1, 2 instead of 3, 4 */
    float *xs_b = xmalloc((size_t)(srows * K) * sizeof(float)), *dys_b = xmalloc((size_t)(srows * N) * sizeof(float));
    memcpy(xs_b, xs, (size_t)(srows * K) * sizeof(float));
    memcpy(dys_b, dys, (size_t)(srows * N) * sizeof(float));
    memcpy(xs_b + 3 * K, xs + 1 * K, 2 * K * sizeof(float));
    memcpy(dys_b + 3 * N, dys + 1 * N, 2 * N * sizeof(float));
    const moe_fp8_tensor x_b = {xq, xs_b, MOE_E4M3}, dy_b = {dyq, dys_b, MOE_E4M3};
    check_dw("mutant: tiles without the expert restart", &routing, N, K, &x_b, &dy_b, &x, &dy, &opt, rng, &outside);
    CHECK(outside > 0, "tiles without the expert restart passed the check");
    printf("mutant, tiles without the expert restart: %lld elements outside the bound\n", (long long)outside);
    free(xq), free(dyq), free(xs), free(dys), free(dropped), free(xs_b), free(dys_b);
}

int main(int argc, char **argv)
{
    const uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 20261207;
    if (!moe_backend_available(backend)) {
        printf("SKIP: backend %s not available (no CUDA device)\n", moe_backend_name(backend));
        return 77;
    }
    printf("seed %llu, backend %s\n", (unsigned long long)seed, moe_backend_name(backend));
    oracle_rng rng = {seed};
    exact_case();
    mutants(&rng);
    const double worst_codes = random_cases(&rng, 80, gemm_case);
    printf("80 random dW cases: worst |err| / bound %.3g\n", worst_codes);
    const double worst_quantized = random_cases(&rng, 40, quantized_case);
    printf("40 quantized dW cases: worst |err| / bound %.3g\n", worst_quantized);
#ifdef MOE_TEST_CUDA
    printf("2 dW cases of 240 and 192 output tiles (and on their codes transposed): worst |err| / bound %.3g\n",
           many_tiles_cases(&rng));
#endif
    transposed_quantizer_cases(&rng);
    transposed_dw_cases(&rng);
    printf("%ld checks, %ld failures\n", checks, failures);
    return failures ? 1 : 0;
}
