/* The promotion of the Hopper FP8 kernel against the oracle's Hopper bound (specs/FP8.md sections 4 and 5), on
 * the CPU model of what that kernel computes (fp8_hopper_model.h):
 *
 *   1. the model of the kernel (a fresh tensor-core partial per 128-tile, promoted in float32), with the measured
 *      accumulator and with the spare sum truncation the bound allows, stays within the oracle's Hopper bound
 *      (tile_acc_bits 13) on every element of every case: long reductions (K or N of 4096 and 7168, the ANCHORS
 *      shapes'), fwd and dX, operands quantized as DeepSeek-V3 does (1 x 128 and 128 x 128 tiles, amax / 448)
 *      from activations with outlier channels, with and without a direction shared by X and W;
 *   2. the mutant (the promotion dropped: the partial kept in the tensor core across the whole reduction, the
 *      scales applied once at the end) fails that bound where dropping the promotion matters:
 *      a. with scales equal along the reduction (row-wise scaling, the only one such a kernel gets right) the
 *         scales are right and only the accumulation differs: on outputs whose products share a sign (X and W
 *         sharing a direction, as large activations do) the running sum sets a grid that truncates every later
 *         product, and the error grows with the reduction's length past the bound;
 *      b. with the quantizer's tiled scales the last tile's scales cannot stand for the others'.
 * Prints, per case, the worst |err| / bound of each, and the bound's and the errors' size against the
 * magnitude of the exact value.  Deterministic (fixed seeds); under a second.
 *
 * Usage: test_fp8_promotion [--sweep]   (--sweep: the mutant against the share and the length, no mutant check) */
#include "fp8_hopper_model.h"
#include "moe_fp8.h"
#include "oracle_fp8.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "check.h"

#define ROWS 8  /* rows of the output (tokens of one expert) */
#define COLS 16 /* columns of the output */

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* About normal (the sum of four uniforms, centred, variance 1). */
static float normalish(uint64_t *state)
{
    double s = 0.0;
    for (int i = 0; i < 4; i++)
        s += (double)(mix((*state)++) >> 11) * 0x1p-53;
    return (float)((s - 2.0) * sqrt(3.0));
}

typedef struct promo_case {
    const char *name;
    int dx;          /* 0: fwd (reduction over K), 1: dX (reduction over N) */
    int64_t len;     /* the reduction's length */
    double shared;   /* 0..1: the weight of the direction X (dY) and W share */
    int tiled;       /* 1: the quantizer's 1 x 128 / 128 x 128 scales; 0: one scale per row (and per W block row) */
    int mutant_must_fail;
    uint64_t seed;
} promo_case;

/* The operands' values: a[ROWS][len] (X or dY), w[COLS][len] (W's rows for fwd, its columns for dX), each
 * channel c of a scaled by 30 on 1 channel in 64 (outliers), both with `shared` of a common direction d. */
static void make_values(const promo_case *pc, float *a, float *w)
{
    uint64_t state = pc->seed;
    float *d = xmalloc((size_t)pc->len * sizeof *d);
    for (int64_t c = 0; c < pc->len; c++)
        d[c] = normalish(&state);
    const float own = (float)sqrt(1.0 - pc->shared * pc->shared), shared = (float)pc->shared;
    for (int64_t r = 0; r < ROWS; r++)
        for (int64_t c = 0; c < pc->len; c++) {
            const float outlier = mix(pc->seed ^ (uint64_t)c) % 64 == 0 ? 30.0f : 1.0f;
            a[r * pc->len + c] = outlier * (shared * d[c] + own * normalish(&state));
        }
    for (int64_t n = 0; n < COLS; n++)
        for (int64_t c = 0; c < pc->len; c++)
            w[n * pc->len + c] = 0.02f * (shared * d[c] + own * normalish(&state));
    free(d);
}

/* Row-wise e4m3 quantization of v[rows][cols] (one scale amax / 448 per row, written to every tile of the row's
 * scales [rows][tiles]): the scaling of a kernel that applies its scales after the reduction. */
static void quantize_row_wise(const float *v, int64_t rows, int64_t cols, uint8_t *q, float *scales)
{
    const int64_t tiles = (cols + 127) / 128;
    for (int64_t r = 0; r < rows; r++) {
        float amax = 1e-4f;
        for (int64_t c = 0; c < cols; c++)
            amax = fmaxf(amax, fabsf(v[r * cols + c]));
        const float s = amax / 448.0f, factor = 448.0f / amax;
        for (int64_t c = 0; c < cols; c++)
            q[r * cols + c] = moe_f32_to_e4m3(v[r * cols + c] * factor);
        for (int64_t t = 0; t < tiles; t++)
            scales[r * tiles + t] = s;
    }
}

/* W's codes and block scales from its values wv[COLS][len]: fwd stores W as [N = COLS][K = len], dX as
 * [N = len][K = COLS] (its columns are the reduction). */
static void quantize_w(const promo_case *pc, const float *wv, uint8_t *q, float *scales)
{
    const int64_t N = pc->dx ? pc->len : COLS, K = pc->dx ? COLS : pc->len;
    float *w = xmalloc((size_t)(N * K) * sizeof *w);
    for (int64_t n = 0; n < COLS; n++)
        for (int64_t c = 0; c < pc->len; c++)
            w[pc->dx ? c * K + n : n * K + c] = wv[n * pc->len + c];
    if (pc->tiled) {
        const moe_status st = moe_quantize_fp8_blocks(MOE_BACKEND_REF, MOE_F32, 1, N, K, w, MOE_E4M3,
                                                      MOE_FP8_SCALE_F32, q, scales, NULL);
        REQUIRE(st == MOE_OK, "moe_quantize_fp8_blocks: %s", moe_last_error());
    } else {
        /* COLS <= 128: W is one block row (fwd) or one block column (dX), so one scale for every block, equal
         * along the reduction */
        const int64_t blocks = ((N + 127) / 128) * ((K + 127) / 128);
        float amax = 1e-4f;
        for (int64_t i = 0; i < N * K; i++)
            amax = fmaxf(amax, fabsf(w[i]));
        for (int64_t i = 0; i < N * K; i++)
            q[i] = moe_f32_to_e4m3(w[i] * (448.0f / amax));
        for (int64_t b = 0; b < blocks; b++)
            scales[b] = amax / 448.0f;
    }
    free(w);
}

typedef struct worst {
    double ratio;       /* max |err| / bound */
    double rel_err;     /* max |err| / |value| */
} worst;

static worst compare(const float *out, const double *value, const double *bound, int64_t count)
{
    worst w = {0.0, 0.0};
    for (int64_t i = 0; i < count; i++) {
        const double err = fabs((double)out[i] - value[i]);
        w.ratio = fmax(w.ratio, bound[i] > 0 ? err / bound[i] : (err > 0 ? INFINITY : 0.0));
        if (value[i] != 0.0)
            w.rel_err = fmax(w.rel_err, err / fabs(value[i]));
    }
    return w;
}

static void run_case(const promo_case *pc)
{
    const int64_t len = pc->len, tiles = (len + 127) / 128;
    const int64_t N = pc->dx ? len : COLS, K = pc->dx ? COLS : len, count = ROWS * COLS;
    float *av = xmalloc((size_t)(ROWS * len) * sizeof *av), *wv = xmalloc((size_t)(COLS * len) * sizeof *wv);
    make_values(pc, av, wv);
    uint8_t *aq = xmalloc((size_t)(ROWS * len)), *wq = xmalloc((size_t)(N * K));
    float *as = xmalloc((size_t)(ROWS * tiles) * sizeof *as);
    float *ws = xmalloc((size_t)(((N + 127) / 128) * ((K + 127) / 128)) * sizeof *ws);
    if (pc->tiled) {
        const moe_status st = moe_quantize_fp8_rows(MOE_BACKEND_REF, MOE_F32, ROWS, len, av, MOE_E4M3,
                                                    MOE_FP8_SCALE_F32, aq, as, NULL);
        REQUIRE(st == MOE_OK, "moe_quantize_fp8_rows: %s", moe_last_error());
    } else {
        quantize_row_wise(av, ROWS, len, aq, as);
    }
    quantize_w(pc, wv, wq, ws);

    int64_t m_sizes[1] = {ROWS};
    const moe_routing routing = {ROWS, 1, 1, m_sizes, NULL};
    const moe_fp8_tensor a = {aq, as, MOE_E4M3}, w = {wq, ws, MOE_E4M3};
    const moe_fp8_options opt = {0};
    double *value = xmalloc((size_t)count * sizeof *value), *bound = xmalloc((size_t)count * sizeof *bound);
    if (pc->dx)
        oracle_gemm_fp8_dx(&routing, N, K, &a, &w, NULL, NULL, &opt, ORACLE_FP8_TILE_HOPPER_BITS, value, bound);
    else
        oracle_gemm_fp8_fwd(&routing, N, K, &a, &w, NULL, NULL, &opt, ORACLE_FP8_TILE_HOPPER_BITS, value, bound);

    static const fp8_hopper_model models[] = {{1, 0}, {1, 1}, {0, 0}};
    worst got[3];
    float *out = xmalloc((size_t)count * sizeof *out);
    for (int m = 0; m < 3; m++) {
        if (pc->dx)
            fp8_hopper_model_dx(&models[m], &routing, N, K, &a, &w, NULL, out, &opt);
        else
            fp8_hopper_model_fwd(&models[m], &routing, N, K, &a, &w, NULL, out, &opt);
        got[m] = compare(out, value, bound, count);
    }
    double bound_rel = 0.0;
    for (int64_t i = 0; i < count; i++)
        if (value[i] != 0.0)
            bound_rel = fmax(bound_rel, bound[i] / fabs(value[i]));
    printf("%-34s %-3s %5lld  %-6s %.2f | %6.3f %6.3f | %8.3f | %9.2e %9.2e %9.2e\n", pc->name, pc->dx ? "dX" : "fwd",
           (long long)len, pc->tiled ? "tiled" : "row", pc->shared, got[0].ratio, got[1].ratio, got[2].ratio,
           bound_rel, got[0].rel_err, got[2].rel_err);
    CHECK(got[0].ratio <= 1.0, "%s: the kernel's model (measured accumulator) at %.3f of the bound", pc->name,
          got[0].ratio);
    CHECK(got[1].ratio <= 1.0, "%s: the kernel's model (with the spare sum truncation) at %.3f of the bound",
          pc->name, got[1].ratio);
    if (pc->mutant_must_fail)
        CHECK(got[2].ratio > 1.0, "%s: the mutant without promotion stays within the bound (%.3f of it)", pc->name,
              got[2].ratio);
    free(av), free(wv), free(aq), free(wq), free(as), free(ws), free(value), free(bound), free(out);
}

/* The mutant's worst ratio against the shared direction's weight and the reduction's length (row-wise scales),
 * printed by --sweep (specs/FP8.md section 5 shows it); the model's checks still apply. */
static void sweep(void)
{
    static const int64_t lens[] = {1024, 2048, 4096, 7168};
    static const double shares[] = {0.0, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0};
    uint64_t seed = 0x5eed1000;
    for (int dx = 0; dx < 2; dx++)
        for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++)
            for (size_t i = 0; i < sizeof shares / sizeof shares[0]; i++) {
                const promo_case pc = {"sweep", dx, lens[l], shares[i], 0, 0, seed++};
                run_case(&pc);
            }
}

int main(int argc, char **argv)
{
    static const promo_case cases[] = {
        /* independent operands (products of both signs): the mutant's truncations cancel, within the bound */
        {"independent, row-wise scales", 0, 7168, 0.0, 0, 0, 0x5eed0001},
        {"independent, row-wise scales", 1, 7168, 0.0, 0, 0, 0x5eed0002},
        /* a direction shared by X (dY) and W: same-sign products, the running sum large against each product;
         * the mutant's error grows with the share and the length (--sweep) */
        {"shared direction 0.5, row-wise", 0, 7168, 0.5, 0, 0, 0x5eed0003},
        {"shared direction 0.8, row-wise", 0, 4096, 0.8, 0, 1, 0x5eed0004},
        {"shared direction 0.8, row-wise", 0, 7168, 0.8, 0, 1, 0x5eed0005},
        {"shared direction 0.8, row-wise", 1, 4096, 0.8, 0, 1, 0x5eed0006},
        {"shared direction 0.8, row-wise", 1, 7168, 0.8, 0, 1, 0x5eed0007},
        {"aligned, row-wise", 0, 7168, 1.0, 0, 1, 0x5eed0008},
        {"aligned, row-wise", 1, 7168, 1.0, 0, 1, 0x5eed0009},
        {"aligned, short reduction, row-wise", 0, 1024, 1.0, 0, 0, 0x5eed000a},
        /* DeepSeek-V3's tiled scales: the last tile's scales are wrong for the others */
        {"tiled scales (quantizer)", 0, 7168, 0.0, 1, 1, 0x5eed000b},
        {"tiled scales (quantizer)", 1, 4096, 0.0, 1, 1, 0x5eed000c},
        {"tiled scales, shared direction 0.8", 0, 7168, 0.8, 1, 1, 0x5eed000d},
        {"tiled scales, shared direction 0.8", 1, 7168, 0.8, 1, 1, 0x5eed000e},
    };
    const int do_sweep = argc > 1 && strcmp(argv[1], "--sweep") == 0;
    REQUIRE(argc == 1 || do_sweep, "usage: %s [--sweep]", argv[0]);
    printf("worst |err| / (the oracle's Hopper bound) of the kernel's model (measured accumulator; with the spare\n"
           "sum truncation) and of the mutant without promotion, on %d x %d outputs of e4m3 operands; then the\n"
           "bound and the errors (kernel, mutant) relative to |value|, worst over the outputs\n\n", ROWS, COLS);
    printf("%-34s %-3s %5s  %-6s %4s | %6s %6s | %8s | %9s %9s %9s\n", "case", "op", "len", "scales", "shr", "kernel",
           "+trunc", "mutant", "bound/|v|", "kern/|v|", "mut/|v|");
    if (do_sweep)
        sweep();
    else
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            run_case(&cases[i]);
    printf("%ld checks, %ld failures\n", checks, failures);
    return failures ? 1 : 0;
}
