/* The FP8 quantizers (moe_quantize_fp8_rows / _blocks) and their inverse (moe_dequantize_fp8), specs/FP8.md
 * section 3.  Expectations are computed here from the rule, in double where it is exact:
 *
 *   - each tile's scale: amax / max in float32 (amax floored at MOE_FP8_AMAX_FLOOR), or the power of two
 *     2^ceil(log2(that)) for UE8M0 (checked as: a power of two, >= the float32 scale, < twice it);
 *   - each code: the conversion of v * (max / amax) (float32), or v * 2^-e (UE8M0), by the public (tested)
 *     conversion; the tile's largest |v| maps to a code of magnitude >= max / (1 + 2^-3);
 *   - the dequantized value decode(q) * scale lies within u_fp8 |v| + 4 * 2^-24 |v| + half the smallest
 *     subnormal times the scale of v (the round trip's error);
 *   - dequantize is decode(q) * scale in float32, exactly, for every element;
 *   - a zero tile: scale MOE_FP8_AMAX_FLOOR / max, zero codes keeping the sign;
 *   - shapes not multiples of 128 (partial tiles), bf16 sources, both FP8 dtypes, both scale formats;
 *   - a tall case (27000 tiles: more tiles than one wave of the CUDA kernels' grid);
 *   - bad arguments (dtypes, format, shapes, NULLs, non-finite sources, bad scales for dequantize): the
 *     status, a message naming the argument, nothing written.
 *
 * The same file built with -DMOE_TEST_CUDA (proptest/test_gpu_fp8_quantize) runs MOE_BACKEND_CUDA on device
 * copies, where a bad value is reported by moe_backend_synchronize, checks its results by the same rules and
 * against the reference bit for bit, and exits 77 where no device is visible.
 *
 * Usage: test_fp8_quantize [seed] */
#include "moe_fp8.h"
#include "oracle.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "check.h"

#ifdef MOE_TEST_CUDA
#include "gpu_check.h"
static const moe_backend backend = MOE_BACKEND_CUDA;
static void *on_backend(const void *host, size_t bytes) { return to_device(host, bytes); }
static void from_backend(void *host, const void *on, size_t bytes) { to_host(host, on, bytes); }
static void backend_free(void *on) { cudaFree(on); }
#else
static const moe_backend backend = MOE_BACKEND_REF;
static void *on_backend(const void *host, size_t bytes)
{
    void *p = xmalloc(bytes);
    memcpy(p, host, bytes);
    return p;
}
static void from_backend(void *host, const void *on, size_t bytes) { memcpy(host, on, bytes); }
static void backend_free(void *on) { free(on); }
#endif

/* The status of a call plus, on the CUDA backend, what the device detected. */
static moe_status settle(moe_status status)
{
    return status != MOE_OK ? status : moe_backend_synchronize(backend, NULL);
}

/* The backend's quantization of src (host) into q and scales (host), through backend copies that start as
 * the host buffers' contents; the status of the call and its synchronisation. */
static moe_status quantize_on(int blocks, moe_dtype src_dtype, int64_t B, int64_t R, int64_t C, const void *src,
                              size_t src_bytes, moe_dtype fp8, moe_fp8_scale_format format, uint8_t *q,
                              void *scales, size_t scale_bytes)
{
    void *s_on = on_backend(src, src_bytes), *q_on = on_backend(q, (size_t)(B * R * C));
    void *scales_on = on_backend(scales, scale_bytes);
    const moe_status st = settle(
        blocks ? moe_quantize_fp8_blocks(backend, src_dtype, B, R, C, s_on, fp8, format, q_on, scales_on, NULL)
               : moe_quantize_fp8_rows(backend, src_dtype, R, C, s_on, fp8, format, q_on, scales_on, NULL));
    from_backend(q, q_on, (size_t)(B * R * C));
    from_backend(scales, scales_on, scale_bytes);
    backend_free(s_on), backend_free(q_on), backend_free(scales_on);
    return st;
}

/* The backend's dequantization of host q and scales into host out (a backend copy of out's contents). */
static moe_status dequantize_on(moe_dtype fp8, moe_fp8_scale_format format, int tile_rows, int64_t B, int64_t R,
                                int64_t C, const uint8_t *q, const void *scales, size_t scale_bytes,
                                moe_dtype out_dtype, void *out)
{
    const size_t out_bytes = (size_t)(B * R * C) * (out_dtype == MOE_F32 ? 4 : 2);
    void *q_on = on_backend(q, (size_t)(B * R * C)), *scales_on = on_backend(scales, scale_bytes);
    void *out_on = on_backend(out, out_bytes);
    const moe_status st = settle(moe_dequantize_fp8(backend, fp8, format, tile_rows, B, R, C, q_on, scales_on,
                                                    out_dtype, out_on, NULL));
    from_backend(out, out_on, out_bytes);
    backend_free(q_on), backend_free(scales_on), backend_free(out_on);
    return st;
}

static double decode(moe_dtype d, uint8_t q) { return d == MOE_E5M2 ? moe_e5m2_to_f32(q) : moe_e4m3_to_f32(q); }
static uint8_t encode(moe_dtype d, float v) { return d == MOE_E5M2 ? moe_f32_to_e5m2(v) : moe_f32_to_e4m3(v); }

/* One quantization of [B][R][C] values, checked by the rule (and, on the CUDA backend, against the reference
 * bit for bit); B, R, C drawn from small sizes on both sides of 128 when `tall_rows` is 0. */
static void one_case(oracle_rng *rng, int blocks, moe_dtype src_dtype, moe_dtype fp8, moe_fp8_scale_format format,
                     int64_t tall_rows)
{
    static const int64_t lengths[] = {1, 5, 127, 128, 129, 300};
    const int64_t B = blocks ? 1 + (int64_t)oracle_rng_below(rng, 2) : 1;
    const int64_t R = tall_rows ? tall_rows : lengths[oracle_rng_below(rng, 6)];
    const int64_t C = tall_rows ? 260 : lengths[oracle_rng_below(rng, 6)];
    const int tile_rows = blocks ? 128 : 1;
    const int64_t tr = (R + tile_rows - 1) / tile_rows, tc = (C + 127) / 128, n = B * R * C, ns = B * tr * tc;
    const size_t src_size = src_dtype == MOE_F32 ? 4 : 2;
    void *src = malloc((size_t)n * src_size + 4);
    oracle_fill(rng, src_dtype, src, n, 2);
    if (oracle_rng_below(rng, 2)) /* a zero tile: the first one */
        for (int64_t r = 0; r < (tile_rows < R ? tile_rows : R); r++)
            for (int64_t c = 0; c < (128 < C ? 128 : C); c++)
                memset((char *)src + (size_t)(r * C + c) * src_size, 0, src_size);
    const size_t scale_bytes = (size_t)ns * (format == MOE_FP8_SCALE_UE8M0 ? 1 : 4);
    uint8_t *q = xcalloc((size_t)n + 1, 1);
    void *scales = xcalloc((size_t)ns * 4 + 4, 1);
    float *back = xcalloc((size_t)n + 1, 4);
    const moe_status st = quantize_on(blocks, src_dtype, B, R, C, src, (size_t)n * src_size, fp8, format, q, scales,
                                      scale_bytes);
    REQUIRE(st == MOE_OK, "quantize: %s", moe_last_error());
    REQUIRE(dequantize_on(fp8, format, tile_rows, B, R, C, q, scales, scale_bytes, MOE_F32, back) == MOE_OK,
            "dequantize: %s", moe_last_error());
#ifdef MOE_TEST_CUDA
    { /* the reference's codes and scales, and its dequantization to bf16, bit for bit */
        uint8_t *q_ref = xmalloc((size_t)n + 1);
        void *scales_ref = xmalloc(scale_bytes + 1);
        uint16_t *half_gpu = xcalloc((size_t)n + 1, 2), *half_ref = xcalloc((size_t)n + 1, 2);
        REQUIRE((blocks ? moe_quantize_fp8_blocks(MOE_BACKEND_REF, src_dtype, B, R, C, src, fp8, format, q_ref,
                                                  scales_ref, NULL)
                        : moe_quantize_fp8_rows(MOE_BACKEND_REF, src_dtype, R, C, src, fp8, format, q_ref, scales_ref,
                                                NULL)) == MOE_OK, "reference quantize: %s", moe_last_error());
        CHECK(memcmp(q, q_ref, (size_t)n) == 0 && memcmp(scales, scales_ref, scale_bytes) == 0,
              "codes or scales differ from the reference (B %lld R %lld C %lld blocks %d %s %s)", (long long)B,
              (long long)R, (long long)C, blocks, moe_dtype_name(fp8), format ? "ue8m0" : "f32");
        REQUIRE(dequantize_on(fp8, format, tile_rows, B, R, C, q, scales, scale_bytes, MOE_BF16, half_gpu) == MOE_OK,
                "dequantize to bf16: %s", moe_last_error());
        REQUIRE(moe_dequantize_fp8(MOE_BACKEND_REF, fp8, format, tile_rows, B, R, C, q, scales, MOE_BF16, half_ref,
                                   NULL) == MOE_OK, "reference dequantize: %s", moe_last_error());
        CHECK(memcmp(half_gpu, half_ref, (size_t)n * 2) == 0, "bf16 dequantization differs from the reference");
        free(q_ref), free(scales_ref), free(half_gpu), free(half_ref);
    }
#endif
    const float max = fp8 == MOE_E5M2 ? 57344.0f : 448.0f;
    const double u8 = moe_dtype_unit_roundoff(fp8), half_subnormal = fp8 == MOE_E5M2 ? 0x1p-17 : 0x1p-10;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < tr; i++)
            for (int64_t j = 0; j < tc; j++) {
                float amax = MOE_FP8_AMAX_FLOOR;
                for (int64_t r = i * tile_rows; r < R && r < (i + 1) * tile_rows; r++)
                    for (int64_t c = j * 128; c < C && c < (j + 1) * 128; c++)
                        amax = fmaxf(amax, fabsf((float)oracle_load(src_dtype, src, (b * R + r) * C + c)));
                const int64_t si = (b * tr + i) * tc + j;
                const float f32_scale = amax / max;
                double scale;
                float factor;
                if (format == MOE_FP8_SCALE_UE8M0) {
                    const int biased = ((uint8_t *)scales)[si];
                    scale = ldexp(1.0, biased - 127);
                    CHECK(scale >= f32_scale && scale < 2.0 * f32_scale, "UE8M0 scale 2^%d for amax/max %a",
                          biased - 127, (double)f32_scale);
                    factor = (float)(1.0 / scale);
                } else {
                    scale = ((float *)scales)[si];
                    CHECK(scale == f32_scale, "scale [%lld] = %a, expected %a", (long long)si, scale,
                          (double)f32_scale);
                    factor = max / amax;
                }
                double peak = 0.0;
                for (int64_t r = i * tile_rows; r < R && r < (i + 1) * tile_rows; r++)
                    for (int64_t c = j * 128; c < C && c < (j + 1) * 128; c++) {
                        const int64_t e = (b * R + r) * C + c;
                        const float v = (float)oracle_load(src_dtype, src, e);
                        CHECK(q[e] == encode(fp8, v * factor), "code [%lld] of %a: 0x%02x, expected 0x%02x",
                              (long long)e, (double)v, q[e], encode(fp8, v * factor));
                        CHECK(back[e] == (float)(decode(fp8, q[e]) * (float)scale), "dequantized [%lld] = %a",
                              (long long)e, (double)back[e]);
                        const double err = fabs((double)back[e] - v);
                        CHECK(err <= (u8 + 0x1p-22) * fabs(v) + half_subnormal * scale * 1.001,
                              "round trip [%lld]: %a -> %a (%s %s)", (long long)e, (double)v, (double)back[e],
                              moe_dtype_name(fp8), format ? "ue8m0" : "f32");
                        if (fabs(decode(fp8, q[e])) > peak)
                            peak = fabs(decode(fp8, q[e]));
                    }
                if (amax > MOE_FP8_AMAX_FLOOR && format == MOE_FP8_SCALE_F32)
                    CHECK(peak >= max / 1.125, "tile [%lld]: largest code %g, expected about %g", (long long)si, peak,
                          (double)max);
            }
    free(src), free(q), free(scales), free(back);
}

static void bad_arguments(void)
{
    float src[4 * 130], scales[8];
    uint8_t q[4 * 130], q_keep[4 * 130];
    for (int i = 0; i < 4 * 130; i++)
        src[i] = (float)i;
    memset(q, 0xab, sizeof q);
    memset(scales, 0, sizeof scales);
    memcpy(q_keep, q, sizeof q);
#define EXPECT(call, status, fragment)                                                                           \
    do {                                                                                                         \
        const moe_status st_ = (call);                                                                           \
        CHECK(st_ == (status) && strstr(moe_last_error(), fragment) != NULL, "%s: status %d, message \"%s\"",  \
              #call, (int)st_, moe_last_error());                                                                \
        CHECK(memcmp(q, q_keep, sizeof q) == 0 && scales[0] == 0.0f && scales[7] == 0.0f, "%s wrote its outputs",  \
              #call);                                                                                            \
    } while (0)
#define ROWS(...) moe_quantize_fp8_rows(backend, __VA_ARGS__, NULL)
#define BLOCKS(...) moe_quantize_fp8_blocks(backend, __VA_ARGS__, NULL)
    /* the front end's checks, the same on both backends (host arrays: a refused call reads none) */
    EXPECT(ROWS(MOE_F16, 4, 130, src, MOE_E4M3, 0, q, scales), MOE_ERR_INVALID_DTYPE, "src_dtype = f16");
    EXPECT(ROWS(MOE_F32, 4, 130, src, MOE_BF16, 0, q, scales), MOE_ERR_INVALID_DTYPE, "fp8_dtype = bf16");
    EXPECT(ROWS(MOE_F32, 4, 130, src, MOE_E4M3, (moe_fp8_scale_format)7, q, scales), MOE_ERR_INVALID_OPTION,
           "scale_format = 7");
    EXPECT(ROWS(MOE_F32, -1, 130, src, MOE_E4M3, 0, q, scales), MOE_ERR_INVALID_SHAPE, "rows = -1");
    EXPECT(BLOCKS(MOE_F32, 1, 4, 130, NULL, MOE_E4M3, 0, q, scales), MOE_ERR_NULL_POINTER, "src");
    EXPECT(ROWS(MOE_F32, 4, 130, src, MOE_E4M3, 0, q, NULL), MOE_ERR_NULL_POINTER, "scales");
    EXPECT(ROWS(MOE_F32, 4, 130, src, MOE_E4M3, 0, src, scales), MOE_ERR_INVALID_OPTION, "overlap");
    EXPECT(moe_quantize_fp8_rows((moe_backend)9, MOE_F32, 4, 130, src, MOE_E4M3, 0, q, scales, NULL),
           MOE_ERR_NO_BACKEND, "moe_quantize_fp8_rows: backend 9 (?) is not available here");
    if (!moe_backend_available(MOE_BACKEND_CUDA)) {
        EXPECT(moe_quantize_fp8_blocks(MOE_BACKEND_CUDA, MOE_F32, 1, 4, 130, src, MOE_E4M3, 0, q, scales, NULL),
               MOE_ERR_NO_BACKEND, "backend 1 (cuda) is not available here");
        EXPECT(moe_dequantize_fp8(MOE_BACKEND_CUDA, MOE_E4M3, 0, 1, 1, 4, 130, q, scales, MOE_F32, src, NULL),
               MOE_ERR_NO_BACKEND, "moe_dequantize_fp8: backend 1 (cuda) is not available here");
    }
    /* values, on the backend's copies (CUDA: found on the device, reported by the synchronisation): the first
     * bad element in the host's order is named, nothing is written */
    src[2 * 130 + 129] = NAN;
    src[3 * 130] = INFINITY;
    EXPECT(quantize_on(0, MOE_F32, 1, 4, 130, src, sizeof src, MOE_E4M3, 0, q, scales, 4 * 2 * 4),
           MOE_ERR_INVALID_VALUE, "src[0][2][129] = nan, expected a finite value");
    src[2 * 130 + 129] = -INFINITY;
    EXPECT(quantize_on(1, MOE_F32, 2, 2, 130, src, sizeof src, MOE_E5M2, 1, q, scales, 2 * 2),
           MOE_ERR_INVALID_VALUE, "src[1][0][129] = -inf");
    src[2 * 130 + 129] = 1.0f;
    src[3 * 130] = 1.0f;
    float out[4 * 130], out_keep[4 * 130];
    for (int i = 0; i < 4 * 130; i++)
        out[i] = 7.0f;
    memcpy(out_keep, out, sizeof out);
    float bad_scales[8] = {1, 1, 1, 1, 1, -2, 1, 0};
    CHECK(dequantize_on(MOE_E4M3, 0, 1, 1, 4, 130, q, bad_scales, sizeof bad_scales, MOE_F32, out) ==
                  MOE_ERR_INVALID_VALUE && strstr(moe_last_error(), "scales[2][1] = -2") != NULL &&
              memcmp(out, out_keep, sizeof out) == 0, "dequantize bad scale: %s", moe_last_error());
    const uint8_t bad_ue8m0[4] = {127, 130, 255, 255};
    CHECK(dequantize_on(MOE_E5M2, 1, 128, 2, 2, 130, q, bad_ue8m0, sizeof bad_ue8m0, MOE_BF16, out) ==
                  MOE_ERR_INVALID_VALUE && strstr(moe_last_error(), "scales[1][0] = 255 (UE8M0's NaN)") != NULL &&
              memcmp(out, out_keep, sizeof out) == 0, "dequantize UE8M0 255: %s", moe_last_error());
#define DEQUANTIZE(...) moe_dequantize_fp8(backend, __VA_ARGS__, NULL)
    CHECK(DEQUANTIZE(MOE_E4M3, 0, 1, 2, 4, 130, q, bad_scales, MOE_F32, out) == MOE_ERR_INVALID_SHAPE &&
          strstr(moe_last_error(), "batches = 2 with tile_rows 1") != NULL, "dequantize rows batches: %s",
          moe_last_error());
    CHECK(DEQUANTIZE(MOE_E4M3, 0, 64, 1, 4, 130, q, bad_scales, MOE_F32, out) == MOE_ERR_INVALID_OPTION &&
          strstr(moe_last_error(), "tile_rows = 64") != NULL, "dequantize tile_rows: %s", moe_last_error());
    CHECK(DEQUANTIZE(MOE_E4M3, 0, 1, 1, 4, 130, q, bad_scales, MOE_E4M3, out) == MOE_ERR_INVALID_DTYPE &&
          strstr(moe_last_error(), "out_dtype = e4m3") != NULL && out[0] == 7.0f, "dequantize out dtype: %s",
          moe_last_error());
#undef ROWS
#undef BLOCKS
#undef DEQUANTIZE
#undef EXPECT
}

int main(int argc, char **argv)
{
    const uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 20261206;
    if (!moe_backend_available(backend)) {
        printf("SKIP: backend %s not available (no CUDA device)\n", moe_backend_name(backend));
        return 77;
    }
    printf("seed %llu, backend %s\n", (unsigned long long)seed, moe_backend_name(backend));
    oracle_rng rng = {seed};
    for (int i = 0; i < 200; i++)
        one_case(&rng, i & 1, oracle_rng_below(&rng, 2) ? MOE_BF16 : MOE_F32,
                 oracle_rng_below(&rng, 2) ? MOE_E5M2 : MOE_E4M3,
                 oracle_rng_below(&rng, 2) ? MOE_FP8_SCALE_UE8M0 : MOE_FP8_SCALE_F32, 0);
    one_case(&rng, 0, MOE_BF16, MOE_E4M3, MOE_FP8_SCALE_F32, 9000); /* 27000 tiles */
    printf("201 random quantizations (rows and blocks)\n");
    bad_arguments();
    printf("%ld checks, %ld failures\n", checks, failures);
    return failures ? 1 : 0;
}
