/* The FP8 quantizers (rows, blocks, and dW's columns per expert) and their inverse (specs/FP8.md section 3), on
 * validated arguments. */
#include "fp8_ref.h"
#include "moe_ref.h"

#include <inttypes.h>
#include <math.h>

/* Scales first .. first + count - 1 of an array whose rows hold per_row scales. */
static moe_status check_scale_range(const char *op, const char *name, moe_fp8_scale_format format, const void *scales,
                                    int64_t first, int64_t count, int64_t per_row)
{
    for (int64_t i = first; i < first + count; i++) {
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

moe_status moe_ref_fp8_check_scales(const char *op, const char *name, moe_fp8_scale_format format,
                                    const void *scales, int64_t count, int64_t per_row)
{
    return check_scale_range(op, name, format, scales, 0, count, per_row);
}

moe_status moe_ref_fp8_check_column_scales(const char *op, const char *name, moe_fp8_scale_format format,
                                           const void *scales, int64_t num_experts, const int64_t *m_sizes,
                                           int64_t cols)
{
    int64_t first = 0; /* the expert's first row */
    for (int64_t e = 0; e < num_experts; e++) {
        const int64_t scale_row = moe_fp8_dw_scale_row(first, e), tiles = moe_fp8_tiles(m_sizes[e]);
        const moe_status status = check_scale_range(op, name, format, scales, scale_row * cols, tiles * cols, cols);
        if (status != MOE_OK)
            return status;
        first += m_sizes[e];
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

/* The scale rule of every tile (specs/FP8.md section 3), the one definition: stores scale s of a tile whose
 * floored amax is `amax` (amax / max_format, or its UE8M0 power of two) and returns the factor each value is
 * multiplied by before the conversion (max_format / amax, or the exact inverse of the power of two). */
static float store_tile_scale(moe_dtype fp8_dtype, moe_fp8_scale_format format, float amax, void *scales,
                              int64_t s)
{
    const float max = format_max(fp8_dtype), scale = amax / max;
    if (format == MOE_FP8_SCALE_UE8M0) {
        ((uint8_t *)scales)[s] = ue8m0_ceil(scale);
        return 1.0f / moe_fp8_scale(format, scales, s); /* exact: a power of two */
    }
    ((float *)scales)[s] = scale;
    return max / amax;
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
                const float factor = store_tile_scale(fp8_dtype, format, amax, scales, (b * tiles_r + tr) * tiles_c + tc);
                for (int64_t r = r0; r < r1; r++)
                    for (int64_t c = c0; c < c1; c++) {
                        const int64_t i = base + r * cols + c;
                        ((uint8_t *)q)[i] = encode(fp8_dtype, moe_ref_load(src_dtype, src, i) * factor);
                    }
            }
    return MOE_OK;
}

/* The source row of expert row r of a columns quantization. */
static int64_t column_source_row(const moe_fp8_columns_problem *p, int64_t r)
{
    const int64_t slot = moe_ref_fp8_slot_of_row(&p->g, r);
    return p->source == MOE_FP8_ROWS_EXPERT ? r : p->source == MOE_FP8_ROWS_SLOT ? slot : slot / p->g.topk;
}

/* The value expert row r, column c stands for: the source element, times its slot's topk weight if any. */
static float column_value(const moe_fp8_columns_problem *p, const void *src, const float *topk_weights, int64_t r,
                          int64_t c)
{
    const float v = moe_ref_load(p->src_dtype, src, column_source_row(p, r) * p->g.N + c);
    return topk_weights != NULL ? topk_weights[moe_ref_fp8_slot_of_row(&p->g, r)] * v : v;
}

moe_status moe_ref_quantize_fp8_columns(const moe_fp8_columns_problem *p, const void *src, const float *topk_weights,
                                        void *q, void *scales)
{
    const moe_gemm_problem *g = &p->g;
    const int64_t M = g->rows, E = g->num_experts, cols = g->N;
    for (int64_t r = 0; r < M; r++)
        for (int64_t c = 0; c < cols; c++) {
            const float v = column_value(p, src, topk_weights, r, c);
            if (isfinite(v))
                continue;
            const int64_t row = column_source_row(p, r), slot = moe_ref_fp8_slot_of_row(g, r);
            if (topk_weights == NULL)
                return moe_fail(MOE_ERR_INVALID_VALUE, "%s: src[%" PRId64 "][%" PRId64 "] = %g, expected a finite "
                                "value", g->op, row, c, (double)v);
            return moe_fail(MOE_ERR_INVALID_VALUE, "%s: topk_weights[%" PRId64 "] * src[%" PRId64 "][%" PRId64 "] = "
                            "%g * %g = %g, expected a finite value", g->op, slot, row, c, (double)topk_weights[slot],
                            (double)moe_ref_load(p->src_dtype, src, row * cols + c), (double)v);
        }
    const int64_t scale_rows = moe_fp8_column_scale_rows(M, E);
    for (int64_t i = 0; i < scale_rows * cols; i++) /* the rows no tile uses: an empty tile's scale */
        store_tile_scale(p->fp8_dtype, p->scale_format, MOE_FP8_AMAX_FLOOR, scales, i);
    int64_t first = 0; /* the expert's first row */
    for (int64_t e = 0; e < E; e++) {
        const int64_t end = first + g->m_sizes[e];
        for (int64_t r0 = first; r0 < end; r0 += MOE_FP8_TILE) {
            const int64_t r1 = end - r0 < MOE_FP8_TILE ? end : r0 + MOE_FP8_TILE;
            for (int64_t c = 0; c < cols; c++) {
                float amax = MOE_FP8_AMAX_FLOOR;
                for (int64_t r = r0; r < r1; r++)
                    amax = fmaxf(amax, fabsf(column_value(p, src, topk_weights, r, c)));
                const float factor = store_tile_scale(p->fp8_dtype, p->scale_format, amax, scales,
                                                      moe_fp8_dw_scale_row(r0, e) * cols + c);
                for (int64_t r = r0; r < r1; r++)
                    ((uint8_t *)q)[r * cols + c] = encode(p->fp8_dtype, column_value(p, src, topk_weights, r, c) * factor);
            }
        }
        first = end;
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
