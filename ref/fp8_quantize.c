/* The FP8 tile and block quantizers and their inverse (specs/FP8.md section 3), on validated arguments. */
#include "fp8_ref.h"
#include "moe_ref.h"

#include <inttypes.h>
#include <math.h>

moe_status moe_ref_fp8_check_scales(const char *op, const char *name, moe_fp8_scale_format format,
                                    const void *scales, int64_t count, int64_t per_row)
{
    for (int64_t i = 0; i < count; i++) {
        if (format == MOE_FP8_SCALE_UE8M0) {
            if (((const uint8_t *)scales)[i] == 255)
                return moe_fail(MOE_ERR_INVALID_VALUE, "%s: %s[%" PRId64 "][%" PRId64 "] = 255 (UE8M0's NaN), "
                                "expected a biased exponent 0 .. 254", op, name, i / per_row, i % per_row);
            continue;
        }
        const float s = ((const float *)scales)[i];
        if (!(s > 0.0f) || isinf(s))
            return moe_fail(MOE_ERR_INVALID_VALUE, "%s: %s[%" PRId64 "][%" PRId64 "] = %g, expected finite and > 0",
                            op, name, i / per_row, i % per_row, (double)s);
    }
    return MOE_OK;
}

static float format_max(moe_dtype fp8_dtype) { return fp8_dtype == MOE_E5M2 ? 57344.0f : 448.0f; }

static uint8_t encode(moe_dtype fp8_dtype, float v)
{
    return fp8_dtype == MOE_E5M2 ? moe_f32_to_e5m2(v) : moe_f32_to_e4m3(v);
}

/* The UE8M0 byte of 2^ceil(log2(s)) for a float32 s > 0: frexpf's exponent, less one when s is a power of
 * two.  s >= MOE_FP8_AMAX_FLOOR / 57344 > 2^-30 and s <= FLT_MAX / 448, so the byte lies in 97 .. 247. */
static uint8_t ue8m0_ceil(float s)
{
    int exponent;
    const float mantissa = frexpf(s, &exponent); /* s = mantissa * 2^exponent, mantissa in [0.5, 1) */
    return (uint8_t)(127 + (mantissa == 0.5f ? exponent - 1 : exponent));
}

moe_status moe_ref_quantize_fp8(const char *op, moe_dtype src_dtype, int tile_rows, int64_t batches, int64_t rows,
                                int64_t cols, const void *src, moe_dtype fp8_dtype, moe_fp8_scale_format format,
                                void *q, void *scales)
{
    const int64_t count = batches * rows * cols;
    for (int64_t i = 0; i < count; i++) {
        const float v = moe_ref_load(src_dtype, src, i);
        if (!isfinite(v))
            return moe_fail(MOE_ERR_INVALID_VALUE, "%s: src[%" PRId64 "][%" PRId64 "][%" PRId64 "] = %g, expected "
                            "a finite value", op, i / (rows * cols), i / cols % rows, i % cols, (double)v);
    }
    const int64_t tiles_r = (rows + tile_rows - 1) / tile_rows, tiles_c = moe_fp8_tiles(cols);
    const float max = format_max(fp8_dtype);
    for (int64_t b = 0; b < batches; b++)
        for (int64_t tr = 0; tr < tiles_r; tr++)
            for (int64_t tc = 0; tc < tiles_c; tc++) {
                const int64_t r0 = tr * tile_rows, r1 = rows - r0 < tile_rows ? rows : r0 + tile_rows;
                const int64_t c0 = tc * MOE_FP8_TILE, c1 = cols - c0 < MOE_FP8_TILE ? cols : c0 + MOE_FP8_TILE;
                const int64_t base = b * rows * cols;
                float amax = MOE_FP8_AMAX_FLOOR;
                for (int64_t r = r0; r < r1; r++)
                    for (int64_t c = c0; c < c1; c++)
                        amax = fmaxf(amax, fabsf(moe_ref_load(src_dtype, src, base + r * cols + c)));
                const int64_t s = (b * tiles_r + tr) * tiles_c + tc;
                const float scale = amax / max;
                float factor; /* what each value is multiplied by before the conversion */
                if (format == MOE_FP8_SCALE_UE8M0) {
                    const uint8_t biased = ue8m0_ceil(scale);
                    ((uint8_t *)scales)[s] = biased;
                    factor = 1.0f / moe_fp8_scale(format, scales, s); /* exact: a power of two */
                } else {
                    ((float *)scales)[s] = scale;
                    factor = max / amax;
                }
                for (int64_t r = r0; r < r1; r++)
                    for (int64_t c = c0; c < c1; c++) {
                        const int64_t i = base + r * cols + c;
                        ((uint8_t *)q)[i] = encode(fp8_dtype, moe_ref_load(src_dtype, src, i) * factor);
                    }
            }
    return MOE_OK;
}

void moe_ref_dequantize_fp8(moe_dtype fp8_dtype, moe_fp8_scale_format format, int tile_rows, int64_t batches,
                            int64_t rows, int64_t cols, const void *q, const void *scales, moe_dtype out_dtype,
                            void *out)
{
    const int64_t tiles_r = (rows + tile_rows - 1) / tile_rows, tiles_c = moe_fp8_tiles(cols);
    for (int64_t b = 0; b < batches; b++)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) {
                const int64_t i = (b * rows + r) * cols + c;
                const int64_t s = (b * tiles_r + r / tile_rows) * tiles_c + c / MOE_FP8_TILE;
                moe_ref_store(out_dtype, out, i, moe_fp8_load(fp8_dtype, q, i) * moe_fp8_scale(format, scales, s));
            }
}
