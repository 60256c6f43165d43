/* FP8 dW (moe_gemm_fp8_dw) and its columns quantizers (moe_quantize_fp8_columns, moe_quantize_fp8_columns_transposed)
 * on bad input, on MOE_BACKEND_REF; each refused call returns its status with a message naming the argument or the
 * element, and writes nothing:
 *
 *   - bad arguments of dW and of both quantizers (dtypes, options, NULL and misaligned pointers, sizes, routing,
 *     backend), each with the status and the message's words, the output unchanged; options.codes_transposed
 *     refused by the forward and dX (MOE_ERR_INVALID_OPTION, the message, nothing written), any non-zero value
 *     taken as 1 by dW; the transposed quantizer's bad arguments (each of the columns quantizer's, and qt NULL)
 *     named as its own;
 *   - bad values found by the backend reading the arrays: dW's scales in a tile in use (0, -1, NaN, Inf; a UE8M0
 *     255) named [row][column], a bad scale in a scale row no tile uses never read, m_sizes not summing to M,
 *     each again with codes_transposed; the columns quantizer's non-finite source value and a topk weight whose
 *     product overflows, named as the reference names them, and a bad routing.
 *
 * The same file built with -DMOE_TEST_CUDA (proptest/test_gpu_gemm_fp8_dw_bad) runs the bad values on
 * MOE_BACKEND_CUDA through device copies of every array (exits 77 where no device is visible): found on the
 * device, reported by moe_backend_synchronize, the output unchanged; the bad arguments are the same checks before
 * any backend runs.  The results' checks are tests/test_gemm_fp8_dw.c.
 *
 * Usage: test_gemm_fp8_dw_bad */
#include "fp8_ref.h"
#include "moe_backend.h"
#include "moe_fp8.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "check.h"
#include "fp8_dw_calls.h"

/* ---- bad arguments: status, a message naming the argument, nothing written ---- */

enum { BT = 3, BN = 130, BK = 129, BE = 2 };
static int64_t bad_sizes[BE] = {2, 1}, bad_gather[BT] = {2, 0, 1};
static uint8_t bad_xq[BT * BK], bad_dyq[BT * BN];
static float bad_xs[2 * BK], bad_dys[2 * BN], bad_dw[BE * BN * BK];

typedef struct dw_args {
    moe_backend backend;
    moe_routing routing;
    int64_t N, K;
    moe_fp8_tensor x, dy;
    void *dw;
    moe_fp8_options opt;
} dw_args;

static void expect_bad_dw(const char *what, const dw_args *a, moe_status want, const char *fragment)
{
    bad_dw[0] = 12345.0f;
    const moe_status st = moe_gemm_fp8_dw(a->backend, &a->routing, a->N, a->K, &a->x, &a->dy, a->dw, &a->opt);
    CHECK(st == want && strstr(moe_last_error(), fragment) != NULL, "%s: status %d (want %d), message \"%s\" (want "
          "\"%s\")", what, (int)st, (int)want, moe_last_error(), fragment);
    CHECK(bad_dw[0] == 12345.0f, "%s: dw changed", what);
}

/* options.codes_transposed given to the forward and dX (valid calls otherwise): MOE_ERR_INVALID_OPTION, a message
 * saying it applies to moe_gemm_fp8_dw only, nothing written. */
static void bad_fwd_dx_codes_transposed(const moe_routing *routing)
{
    static uint8_t wq[BE * BN * BK];
    static float ws[BE * 2 * 2], out[BT * BN], kept[BT * BN];
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
        ws[i] = 0.25f;
    const moe_fp8_tensor x = {bad_xq, bad_xs, MOE_E4M3}, dy = {bad_dyq, bad_dys, MOE_E4M3}, w = {wq, ws, MOE_E4M3};
    for (int dx = 0; dx < 2; dx++)
        for (int flag = 0; flag < 3; flag++) { /* 0: the valid call; 1 and -1: refused */
            const moe_fp8_options opt = {.codes_transposed = flag == 2 ? -1 : flag};
            for (int i = 0; i < BT * BN; i++)
                out[i] = kept[i] = 12345.0f;
            const moe_status st = dx ? moe_gemm_fp8_dx(MOE_BACKEND_REF, routing, BN, BK, &dy, &w, NULL, out, &opt)
                                     : moe_gemm_fp8_fwd(MOE_BACKEND_REF, routing, BN, BK, &x, &w, NULL, out, &opt);
            const char *op = dx ? "moe_gemm_fp8_dx" : "moe_gemm_fp8_fwd";
            if (flag == 0) {
                CHECK(st == MOE_OK, "%s without codes_transposed: %s", op, moe_last_error());
                continue;
            }
            char fragment[160];
            snprintf(fragment, sizeof fragment, "%s: options.codes_transposed applies to moe_gemm_fp8_dw only", op);
            CHECK(st == MOE_ERR_INVALID_OPTION && strstr(moe_last_error(), fragment) != NULL, "%s with "
                  "codes_transposed = %d: status %d, message \"%s\"", op, opt.codes_transposed, (int)st,
                  moe_last_error());
            CHECK(memcmp(out, kept, sizeof out) == 0, "%s with codes_transposed: the output changed", op);
        }
}

static void bad_dw_arguments(void)
{
    for (size_t i = 0; i < sizeof bad_xs / sizeof bad_xs[0]; i++)
        bad_xs[i] = 1.0f;
    for (size_t i = 0; i < sizeof bad_dys / sizeof bad_dys[0]; i++)
        bad_dys[i] = 0.5f;
    const dw_args good = {MOE_BACKEND_REF, {BT, 1, BE, bad_sizes, bad_gather}, BN, BK, {bad_xq, bad_xs, MOE_E4M3},
                          {bad_dyq, bad_dys, MOE_E5M2}, bad_dw, {0}};
    dw_args a = good;
    CHECK(moe_gemm_fp8_dw(MOE_BACKEND_REF, &a.routing, BN, BK, &a.x, &a.dy, bad_dw, NULL) == MOE_OK, "good call: %s",
          moe_last_error());
#define BAD(what, change, status, fragment) (a = good, (change), expect_bad_dw(what, &a, status, fragment))
    BAD("out_dtype f16", a.opt.out_dtype = MOE_F16, MOE_ERR_INVALID_DTYPE, "moe_gemm_fp8_dw: options.out_dtype = f16");
    BAD("scale_format 3", a.opt.scale_format = (moe_fp8_scale_format)3, MOE_ERR_INVALID_OPTION,
        "options.scale_format = 3");
    BAD("permute_x", a.opt.permute_x = 1, MOE_ERR_INVALID_OPTION, "options.permute_x does not apply");
    BAD("permute_y", a.opt.permute_y = 1, MOE_ERR_INVALID_OPTION, "options.permute_y does not apply");
    BAD("w_transposed", a.opt.w_transposed = 1, MOE_ERR_INVALID_OPTION,
        "options.w_transposed applies to moe_gemm_fp8_dx only");
    BAD("reduce_topk", a.opt.reduce_topk = 1, MOE_ERR_INVALID_OPTION, "options.reduce_topk does not apply");
    BAD("x dtype bf16", a.x.dtype = MOE_BF16, MOE_ERR_INVALID_DTYPE, "x.dtype = bf16");
    BAD("dy dtype f32", a.dy.dtype = MOE_F32, MOE_ERR_INVALID_DTYPE, "dy.dtype = f32");
    BAD("x data NULL", a.x.data = NULL, MOE_ERR_NULL_POINTER, "x.data");
    BAD("dy scales NULL", a.dy.scales = NULL, MOE_ERR_NULL_POINTER, "dy.scales");
    BAD("dw NULL", a.dw = NULL, MOE_ERR_NULL_POINTER, "dw");
    BAD("f32 scales misaligned", a.dy.scales = (const char *)bad_dys + 2, MOE_ERR_MISALIGNED, "dy.scales");
    BAD("dw overlaps x.scales", a.dw = bad_xs, MOE_ERR_INVALID_OPTION, "overlap");
    BAD("K negative", a.K = -2, MOE_ERR_INVALID_SHAPE, "K = -2");
    BAD("routing NULL", a.routing.m_sizes = NULL, MOE_ERR_NULL_POINTER, "routing.m_sizes");
    BAD("no backend", a.backend = (moe_backend)7, MOE_ERR_NO_BACKEND, "backend 7 is not a libmoe backend");
    BAD("x data NULL, codes transposed", (a.opt.codes_transposed = 1, a.x.data = NULL), MOE_ERR_NULL_POINTER,
        "x.data");
    BAD("w_transposed with codes_transposed", (a.opt.codes_transposed = 1, a.opt.w_transposed = 1),
        MOE_ERR_INVALID_OPTION, "options.w_transposed applies to moe_gemm_fp8_dx only");
#undef BAD
    /* codes_transposed: any non-zero value is true, as the other flags */
    a = good;
    a.opt.codes_transposed = 2;
    CHECK(moe_gemm_fp8_dw(MOE_BACKEND_REF, &a.routing, BN, BK, &a.x, &a.dy, bad_dw, &a.opt) == MOE_OK,
          "codes_transposed = 2: %s", moe_last_error());
    bad_fwd_dx_codes_transposed(&good.routing);
    bad_dw[0] = 12345.0f;
    CHECK(moe_gemm_fp8_dw(MOE_BACKEND_REF, &good.routing, BN, BK, NULL, &good.dy, bad_dw, NULL) ==
          MOE_ERR_NULL_POINTER && strstr(moe_last_error(), "x is NULL") != NULL, "x NULL: %s", moe_last_error());
    CHECK(moe_gemm_fp8_dw(MOE_BACKEND_REF, &good.routing, BN, BK, &good.x, NULL, bad_dw, NULL) ==
          MOE_ERR_NULL_POINTER && strstr(moe_last_error(), "dy is NULL") != NULL, "dy NULL: %s", moe_last_error());
    CHECK(bad_dw[0] == 12345.0f, "a refused call wrote dw");
    CHECK(moe_fp8_column_scale_rows(BT, BE) == 2, "scale rows of M = 3, E = 2");
    CHECK(moe_fp8_column_scale_rows(0, 1) == 0 && moe_fp8_column_scale_rows(128, 1) == 1 &&
          moe_fp8_column_scale_rows(129, 1) == 2 && moe_fp8_column_scale_rows(-1, 1) == -1 &&
          moe_fp8_column_scale_rows(5, 0) == -1 && moe_fp8_column_scale_rows(INT64_MAX, INT64_MAX) == -1,
          "moe_fp8_column_scale_rows' edges");
}

static void bad_columns_arguments(void)
{
    enum { T = 3, k = 2, E = 2, M = T * k, C = 5 };
    int64_t m_sizes[E] = {4, 2}, gather[M] = {0, 2, 3, 5, 1, 4};
    const moe_routing routing = {T, k, E, m_sizes, gather}, no_gather = {T, k, E, m_sizes, NULL};
    float src[M * C], topk[M] = {1, 1, 1, 1, 1, 1};
    for (int i = 0; i < M * C; i++)
        src[i] = (float)i - 7.0f;
    static uint8_t q[M * C];
    static float scales[3 * C];
    CHECK(moe_fp8_column_scale_rows(M, E) == 2, "scale rows");
    struct {
        const char *what;
        const moe_routing *routing;
        moe_dtype src_dtype;
        int64_t cols;
        const void *src;
        int source;
        const float *topk;
        moe_dtype fp8;
        int format;
        void *q, *scales;
        moe_backend backend;
        moe_status want;
        const char *fragment;
    } bad[] = {
        {"src dtype f16", &routing, MOE_F16, C, src, 0, NULL, MOE_E4M3, 0, q, scales, MOE_BACKEND_REF,
         MOE_ERR_INVALID_DTYPE, "moe_quantize_fp8_columns: src_dtype = f16"},
        {"fp8 dtype bf16", &routing, MOE_F32, C, src, 0, NULL, MOE_BF16, 0, q, scales, MOE_BACKEND_REF,
         MOE_ERR_INVALID_DTYPE, "fp8_dtype = bf16"},
        {"format 2", &routing, MOE_F32, C, src, 0, NULL, MOE_E4M3, 2, q, scales, MOE_BACKEND_REF,
         MOE_ERR_INVALID_OPTION, "scale_format = 2"},
        {"source 3", &routing, MOE_F32, C, src, 3, NULL, MOE_E4M3, 0, q, scales, MOE_BACKEND_REF,
         MOE_ERR_INVALID_OPTION, "source = 3"},
        {"routing NULL", NULL, MOE_F32, C, src, 0, NULL, MOE_E4M3, 0, q, scales, MOE_BACKEND_REF,
         MOE_ERR_NULL_POINTER, "routing is NULL"},
        {"token rows without gather", &no_gather, MOE_F32, C, src, 2, NULL, MOE_E4M3, 0, q, scales, MOE_BACKEND_REF,
         MOE_ERR_NULL_POINTER, "routing.gather_indices is NULL but source MOE_FP8_ROWS_TOKEN needs it"},
        {"weights without gather", &no_gather, MOE_F32, C, src, 0, topk, MOE_E4M3, 0, q, scales, MOE_BACKEND_REF,
         MOE_ERR_NULL_POINTER, "but topk_weights needs it"},
        {"cols negative", &routing, MOE_F32, -1, src, 0, NULL, MOE_E4M3, 0, q, scales, MOE_BACKEND_REF,
         MOE_ERR_INVALID_SHAPE, "moe_quantize_fp8_columns: cols = -1, expected >= 0"},
        {"src NULL", &routing, MOE_F32, C, NULL, 0, NULL, MOE_E4M3, 0, q, scales, MOE_BACKEND_REF,
         MOE_ERR_NULL_POINTER, "src"},
        {"scales NULL", &routing, MOE_F32, C, src, 0, NULL, MOE_E4M3, 0, q, NULL, MOE_BACKEND_REF,
         MOE_ERR_NULL_POINTER, "scales"},
        {"q overlaps src", &routing, MOE_F32, C, src, 0, NULL, MOE_E4M3, 0, src, scales, MOE_BACKEND_REF,
         MOE_ERR_INVALID_OPTION, "overlap"},
        {"scales misaligned", &routing, MOE_F32, C, src, 0, NULL, MOE_E4M3, 0, q, (char *)scales + 1,
         MOE_BACKEND_REF, MOE_ERR_MISALIGNED, "scales"},
        {"no backend", &routing, MOE_F32, C, src, 0, NULL, MOE_E4M3, 0, q, scales, (moe_backend)7,
         MOE_ERR_NO_BACKEND, "backend 7"},
    };
    /* each refused by both quantizers, the transposed one naming itself */
    static const char plain_name[] = "moe_quantize_fp8_columns:";
    for (size_t i = 0; i < 2 * (sizeof bad / sizeof bad[0]); i++) {
        const size_t b = i / 2;
        const int transposed = (int)(i % 2);
        columns_fn *quantize = transposed ? moe_quantize_fp8_columns_transposed : moe_quantize_fp8_columns;
        char fragment[200];
        if (transposed && strncmp(bad[b].fragment, plain_name, sizeof plain_name - 1) == 0)
            snprintf(fragment, sizeof fragment, "moe_quantize_fp8_columns_transposed:%s",
                     bad[b].fragment + sizeof plain_name - 1);
        else
            snprintf(fragment, sizeof fragment, "%s", bad[b].fragment);
        memset(q, 0xab, sizeof q);
        scales[0] = 12345.0f;
        const moe_status st = quantize(bad[b].backend, bad[b].routing, bad[b].src_dtype, bad[b].cols, bad[b].src,
                                       (moe_fp8_row_source)bad[b].source, bad[b].topk, bad[b].fp8,
                                       (moe_fp8_scale_format)bad[b].format, bad[b].q, bad[b].scales, NULL);
        CHECK(st == bad[b].want && strstr(moe_last_error(), fragment) != NULL, "%s%s: status %d (want %d), "
              "message \"%s\" (want \"%s\")", bad[b].what, transposed ? " (transposed)" : "", (int)st,
              (int)bad[b].want, moe_last_error(), fragment);
        CHECK(q[0] == 0xab && scales[0] == 12345.0f, "%s%s: an output changed", bad[b].what,
              transposed ? " (transposed)" : "");
    }
    /* the transposed quantizer's codes NULL: named qt */
    scales[0] = 12345.0f;
    const moe_status st = moe_quantize_fp8_columns_transposed(MOE_BACKEND_REF, &routing, MOE_F32, C, src,
                                                              MOE_FP8_ROWS_SLOT, topk, MOE_E4M3, MOE_FP8_SCALE_F32,
                                                              NULL, scales, NULL);
    CHECK(st == MOE_ERR_NULL_POINTER && strstr(moe_last_error(), "moe_quantize_fp8_columns_transposed: qt") != NULL,
          "qt NULL: status %d, message \"%s\"", (int)st, moe_last_error());
    CHECK(scales[0] == 12345.0f, "qt NULL: scales changed");
}

/* ---- bad values, found by the backend reading the arrays (the reference on the host, CUDA on the device and
 * reported by moe_backend_synchronize): the status, a message naming the element, nothing written ---- */

/* dW's scales: a bad one in a tile in use (named [row][column] by both backends), a bad routing; a bad scale in a
 * row no tile uses is never read. */
static void expect_dw_values(const char *what, const moe_routing *routing, const void *xs, const void *dys,
                             moe_fp8_scale_format format, moe_status want, const char *fragment)
{
    enum { N = 130, K = 129 };
    static uint8_t xq[3 * K], dyq[3 * N];
    static float dw[2 * N * K], kept[2 * N * K];
    for (int i = 0; i < 2 * N * K; i++)
        dw[i] = kept[i] = (float)(i % 7);
    const moe_fp8_tensor x = {xq, xs, MOE_E4M3}, dy = {dyq, dys, MOE_E5M2};
    for (int transposed = 0; transposed < 2; transposed++) { /* and with options.codes_transposed (the same codes) */
        const moe_fp8_options opt = {.scale_format = format, .accumulate = 1, .codes_transposed = transposed};
        const moe_status st = dw_on(routing, N, K, &x, &dy, dw, &opt);
        CHECK(st == want && (fragment == NULL || strstr(moe_last_error(), fragment) != NULL), "%s%s: status %d (want "
              "%d), message \"%s\" (want \"%s\")", what, transposed ? " (codes transposed)" : "", (int)st, (int)want,
              moe_last_error(), fragment ? fragment : "");
        if (want != MOE_OK)
            CHECK(memcmp(dw, kept, sizeof dw) == 0, "%s%s: dw changed", what, transposed ? " (codes transposed)" : "");
    }
}

static void bad_dw_values(void)
{
    enum { N = 130, K = 129 };
    int64_t sizes[2] = {2, 1}, bad_sum[2] = {3, 1}, empty_second[2] = {3, 0};
    const moe_routing routing = {3, 1, 2, sizes, NULL}; /* scale rows 0 (expert 0) and 1 (expert 1: 2 / 128 + 1) */
    static float xs[2 * K], dys[2 * N];
    static uint8_t xs_ue[2 * K], dys_ue[2 * N];
    for (int i = 0; i < 2 * K; i++)
        xs[i] = 1.0f, xs_ue[i] = 127;
    for (int i = 0; i < 2 * N; i++)
        dys[i] = 0.5f, dys_ue[i] = 126;
    expect_dw_values("valid scales", &routing, xs, dys, MOE_FP8_SCALE_F32, MOE_OK, NULL);
    xs[1 * K + 5] = 0.0f;
    expect_dw_values("x scale 0", &routing, xs, dys, MOE_FP8_SCALE_F32, MOE_ERR_INVALID_VALUE, "x.scales[1][5]");
    xs[1 * K + 5] = 1.0f;
    dys[7] = -1.0f;
    expect_dw_values("dy scale -1", &routing, xs, dys, MOE_FP8_SCALE_F32, MOE_ERR_INVALID_VALUE, "dy.scales[0][7]");
    dys[7] = 0.5f;
    dys[N + 3] = NAN;
    expect_dw_values("dy scale NaN", &routing, xs, dys, MOE_FP8_SCALE_F32, MOE_ERR_INVALID_VALUE, "dy.scales[1][3]");
    dys[N + 3] = 0.5f;
    xs[K - 1] = INFINITY;
    expect_dw_values("x scale Inf", &routing, xs, dys, MOE_FP8_SCALE_F32, MOE_ERR_INVALID_VALUE, "x.scales[0][128]");
    xs[K - 1] = 1.0f;
    dys_ue[N + 1] = 255;
    expect_dw_values("UE8M0 255", &routing, xs_ue, dys_ue, MOE_FP8_SCALE_UE8M0, MOE_ERR_INVALID_VALUE,
                     "dy.scales[1][1]");
    /* the second expert without rows: scale row 1 (3 / 128 + 1) is no tile's, its 255 never read */
    const moe_routing with_empty = {3, 1, 2, empty_second, NULL};
    expect_dw_values("UE8M0 255 in an unused row", &with_empty, xs_ue, dys_ue, MOE_FP8_SCALE_UE8M0, MOE_OK, NULL);
    dys_ue[N + 1] = 126;
    dys[N + 2] = -1.0f;
    expect_dw_values("-1 in an unused row", &with_empty, xs, dys, MOE_FP8_SCALE_F32, MOE_OK, NULL);
    dys[N + 2] = 0.5f;
    const moe_routing bad_routing = {3, 1, 2, bad_sum, NULL};
    expect_dw_values("m_sizes summing to 4", &bad_routing, xs, dys, MOE_FP8_SCALE_F32, MOE_ERR_INVALID_ROUTING,
                     "m_sizes");
}

/* The columns quantizer's values, after the weight: the first non-finite one in expert-row order named as the
 * reference names it, nothing written; a bad routing. */
static void bad_columns_values(void)
{
    enum { T = 3, k = 2, E = 2, M = T * k, C = 5 };
    int64_t m_sizes[E] = {4, 2}, bad_sum[E] = {4, 3}, gather[M] = {0, 2, 3, 5, 1, 4};
    const moe_routing routing = {T, k, E, m_sizes, gather};
    float src[M * C], topk[M] = {1, 1, 1, 1, 1, 1};
    for (int i = 0; i < M * C; i++)
        src[i] = (float)i - 7.0f;
    uint8_t q[M * C];
    float scales[2 * C];
    memset(q, 0xab, sizeof q);
    scales[0] = 12345.0f;
    src[3 * C + 1] = NAN; /* expert row 3 reads it (expert order) */
    src[4 * C + 0] = INFINITY;
    moe_status st = columns_on(&routing, MOE_F32, C, src, MOE_FP8_ROWS_EXPERT, NULL, MOE_E4M3, MOE_FP8_SCALE_F32, 0,
                               q, scales);
    CHECK(st == MOE_ERR_INVALID_VALUE && strstr(moe_last_error(), "src[3][1] = nan, expected a finite value"),
          "NaN source: %d %s", (int)st, moe_last_error());
    src[3 * C + 1] = 0.0f;
    src[4 * C + 0] = 0.0f;
    topk[4] = 1e38f; /* slot 4 is expert row 5, which reads src row 5 (expert order): 1e38 * 18 overflows */
    st = columns_on(&routing, MOE_F32, C, src, MOE_FP8_ROWS_EXPERT, topk, MOE_E4M3, MOE_FP8_SCALE_F32, 0, q, scales);
    CHECK(st == MOE_ERR_INVALID_VALUE && strstr(moe_last_error(), "topk_weights[4] * src[5][0] = 1e+38 * 18 = inf"),
          "overflowing weight: %d %s", (int)st, moe_last_error());
    topk[4] = 1.0f;
    const moe_routing bad_routing = {T, k, E, bad_sum, gather};
    st = columns_on(&bad_routing, MOE_F32, C, src, MOE_FP8_ROWS_SLOT, topk, MOE_E4M3, MOE_FP8_SCALE_F32, 0, q, scales);
    CHECK(st == MOE_ERR_INVALID_ROUTING && strstr(moe_last_error(), "m_sizes") != NULL, "bad routing: %d %s", (int)st,
          moe_last_error());
    uint8_t q_kept[M * C];
    memset(q_kept, 0xab, sizeof q_kept);
    CHECK(memcmp(q, q_kept, sizeof q) == 0 && scales[0] == 12345.0f, "a refused quantization wrote");
}

int main(void)
{
    if (!moe_backend_available(backend)) {
        printf("SKIP: backend %s not available (no CUDA device)\n", moe_backend_name(backend));
        return 77;
    }
    printf("backend %s\n", moe_backend_name(backend));
    bad_dw_arguments();
    bad_columns_arguments();
    bad_dw_values();
    bad_columns_values();
    printf("%ld checks, %ld failures\n", checks, failures);
    return failures ? 1 : 0;
}
