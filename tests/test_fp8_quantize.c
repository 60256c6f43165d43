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
 *   - bad arguments (dtypes, format, shapes, NULLs, non-finite sources, bad scales for dequantize): the
 *     status, a message naming the argument, nothing written.
 *
 * Usage: test_fp8_quantize [seed] */
#include "moe_fp8.h"
#include "oracle.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

static double decode(moe_dtype d, uint8_t q) { return d == MOE_E5M2 ? moe_e5m2_to_f32(q) : moe_e4m3_to_f32(q); }
static uint8_t encode(moe_dtype d, float v) { return d == MOE_E5M2 ? moe_f32_to_e5m2(v) : moe_f32_to_e4m3(v); }

static void one_case(oracle_rng *rng, int blocks, moe_dtype src_dtype, moe_dtype fp8, moe_fp8_scale_format format)
{
    static const int64_t lengths[] = {1, 5, 127, 128, 129, 300};
    const int64_t B = blocks ? 1 + (int64_t)oracle_rng_below(rng, 2) : 1;
    const int64_t R = lengths[oracle_rng_below(rng, 6)], C = lengths[oracle_rng_below(rng, 6)];
    const int tile_rows = blocks ? 128 : 1;
    const int64_t tr = (R + tile_rows - 1) / tile_rows, tc = (C + 127) / 128, n = B * R * C, ns = B * tr * tc;
    const size_t src_size = src_dtype == MOE_F32 ? 4 : 2;
    void *src = malloc((size_t)n * src_size + 4);
    oracle_fill(rng, src_dtype, src, n, 2);
    if (oracle_rng_below(rng, 2)) /* a zero tile: the first one */
        for (int64_t r = 0; r < (tile_rows < R ? tile_rows : R); r++)
            for (int64_t c = 0; c < (128 < C ? 128 : C); c++)
                memset((char *)src + (size_t)(r * C + c) * src_size, 0, src_size);
    uint8_t *q = malloc((size_t)n + 1);
    void *scales = malloc((size_t)ns * 4 + 4);
    float *back = malloc((size_t)n * 4 + 4);
    const moe_status st = blocks ? moe_quantize_fp8_blocks(src_dtype, B, R, C, src, fp8, format, q, scales)
                                 : moe_quantize_fp8_rows(src_dtype, R, C, src, fp8, format, q, scales);
    REQUIRE(st == MOE_OK, "quantize: %s", moe_last_error());
    REQUIRE(moe_dequantize_fp8(fp8, format, tile_rows, B, R, C, q, scales, MOE_F32, back) == MOE_OK, "dequantize: %s",
            moe_last_error());
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
    uint8_t q[4 * 130];
    for (int i = 0; i < 4 * 130; i++)
        src[i] = (float)i;
    memset(q, 0xab, sizeof q);
    memset(scales, 0, sizeof scales);
    const uint8_t q_before = q[0];
#define EXPECT(call, status, fragment)                                                                           \
    do {                                                                                                         \
        const moe_status st_ = (call);                                                                           \
        CHECK(st_ == (status) && strstr(moe_last_error(), fragment) != NULL, "%s: status %d, message \"%s\"",  \
              #call, (int)st_, moe_last_error());                                                                \
        CHECK(q[0] == q_before && scales[0] == 0.0f, "%s wrote its outputs", #call);                            \
    } while (0)
    EXPECT(moe_quantize_fp8_rows(MOE_F16, 4, 130, src, MOE_E4M3, 0, q, scales), MOE_ERR_INVALID_DTYPE,
           "src_dtype = f16");
    EXPECT(moe_quantize_fp8_rows(MOE_F32, 4, 130, src, MOE_BF16, 0, q, scales), MOE_ERR_INVALID_DTYPE,
           "fp8_dtype = bf16");
    EXPECT(moe_quantize_fp8_rows(MOE_F32, 4, 130, src, MOE_E4M3, (moe_fp8_scale_format)7, q, scales),
           MOE_ERR_INVALID_OPTION, "scale_format = 7");
    EXPECT(moe_quantize_fp8_rows(MOE_F32, -1, 130, src, MOE_E4M3, 0, q, scales), MOE_ERR_INVALID_SHAPE, "rows = -1");
    EXPECT(moe_quantize_fp8_blocks(MOE_F32, 1, 4, 130, NULL, MOE_E4M3, 0, q, scales), MOE_ERR_NULL_POINTER, "src");
    EXPECT(moe_quantize_fp8_rows(MOE_F32, 4, 130, src, MOE_E4M3, 0, q, NULL), MOE_ERR_NULL_POINTER, "scales");
    EXPECT(moe_quantize_fp8_rows(MOE_F32, 4, 130, src, MOE_E4M3, 0, src, scales), MOE_ERR_INVALID_OPTION,
           "overlap");
    src[2 * 130 + 129] = NAN;
    EXPECT(moe_quantize_fp8_rows(MOE_F32, 4, 130, src, MOE_E4M3, 0, q, scales), MOE_ERR_INVALID_VALUE,
           "src[0][2][129] = nan, expected a finite value");
    src[2 * 130 + 129] = -INFINITY;
    EXPECT(moe_quantize_fp8_blocks(MOE_F32, 2, 2, 130, src, MOE_E5M2, 1, q, scales), MOE_ERR_INVALID_VALUE,
           "src[1][0][129] = -inf");
    src[2 * 130 + 129] = 1.0f;
    float out[4 * 130];
    out[0] = 7.0f;
    float bad_scales[8] = {1, 1, 1, 1, 1, -2, 1, 1};
    CHECK(moe_dequantize_fp8(MOE_E4M3, 0, 1, 1, 4, 130, q, bad_scales, MOE_F32, out) == MOE_ERR_INVALID_VALUE &&
          strstr(moe_last_error(), "scales[2][1] = -2") != NULL && out[0] == 7.0f, "dequantize bad scale: %s",
          moe_last_error());
    CHECK(moe_dequantize_fp8(MOE_E4M3, 0, 1, 2, 4, 130, q, bad_scales, MOE_F32, out) == MOE_ERR_INVALID_SHAPE &&
          strstr(moe_last_error(), "batches = 2 with tile_rows 1") != NULL, "dequantize rows batches: %s",
          moe_last_error());
    CHECK(moe_dequantize_fp8(MOE_E4M3, 0, 64, 1, 4, 130, q, bad_scales, MOE_F32, out) == MOE_ERR_INVALID_OPTION &&
          strstr(moe_last_error(), "tile_rows = 64") != NULL, "dequantize tile_rows: %s", moe_last_error());
    CHECK(moe_dequantize_fp8(MOE_E4M3, 0, 1, 1, 4, 130, q, bad_scales, MOE_E4M3, out) == MOE_ERR_INVALID_DTYPE &&
          strstr(moe_last_error(), "out_dtype = e4m3") != NULL && out[0] == 7.0f, "dequantize out dtype: %s",
          moe_last_error());
#undef EXPECT
}

int main(int argc, char **argv)
{
    const uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 20261206;
    printf("seed %llu\n", (unsigned long long)seed);
    oracle_rng rng = {seed};
    for (int i = 0; i < 200; i++)
        one_case(&rng, i & 1, oracle_rng_below(&rng, 2) ? MOE_BF16 : MOE_F32,
                 oracle_rng_below(&rng, 2) ? MOE_E5M2 : MOE_E4M3,
                 oracle_rng_below(&rng, 2) ? MOE_FP8_SCALE_UE8M0 : MOE_FP8_SCALE_F32);
    printf("200 random quantizations (rows and blocks)\n");
    bad_arguments();
    printf("%ld checks, %ld failures\n", checks, failures);
    return failures ? 1 : 0;
}
