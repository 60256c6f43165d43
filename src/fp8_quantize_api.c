/* Public FP8 quantization entry points (include/moe_fp8.h): validate every argument, then run the host
 * quantizer of ref/fp8_quantize.c. */
#include "fp8_ref.h"

#include <inttypes.h>

/* The checks the three calls share: dtypes, format, dimensions, the arrays (sizes, NULLs, alignment,
 * overlaps).  src is the full-precision side (input of quantize, output of dequantize). */
static moe_status check_call(const char *op, int dequantize, moe_dtype wide_dtype, int tile_rows, int64_t batches,
                             int64_t rows, int64_t cols, const void *wide, moe_dtype fp8_dtype,
                             moe_fp8_scale_format format, const void *q, const void *scales)
{
    const char *wide_name = dequantize ? "out" : "src";
    if (wide_dtype != MOE_F32 && wide_dtype != MOE_BF16)
        return moe_fail(MOE_ERR_INVALID_DTYPE, "%s: %s_dtype = %s (%d), expected MOE_F32 or MOE_BF16", op, wide_name,
                        moe_dtype_name(wide_dtype), (int)wide_dtype);
    if (fp8_dtype != MOE_E4M3 && fp8_dtype != MOE_E5M2)
        return moe_fail(MOE_ERR_INVALID_DTYPE, "%s: fp8_dtype = %s (%d), expected MOE_E4M3 or MOE_E5M2", op,
                        moe_dtype_name(fp8_dtype), (int)fp8_dtype);
    if (format != MOE_FP8_SCALE_F32 && format != MOE_FP8_SCALE_UE8M0)
        return moe_fail(MOE_ERR_INVALID_OPTION, "%s: scale_format = %d, expected MOE_FP8_SCALE_F32 (0) or "
                        "MOE_FP8_SCALE_UE8M0 (1)", op, (int)format);
    if (tile_rows != 1 && tile_rows != MOE_FP8_TILE)
        return moe_fail(MOE_ERR_INVALID_OPTION, "%s: tile_rows = %d, expected 1 (rows) or 128 (blocks)", op,
                        tile_rows);
    if (batches < 0 || rows < 0 || cols < 0)
        return moe_fail(MOE_ERR_INVALID_SHAPE, "%s: batches = %" PRId64 ", rows = %" PRId64 ", cols = %" PRId64
                        ", expected all >= 0", op, batches, rows, cols);
    if (tile_rows == 1 && batches != 1)
        return moe_fail(MOE_ERR_INVALID_SHAPE, "%s: batches = %" PRId64 " with tile_rows 1, expected 1", op,
                        batches);
    int64_t batch_rows = 0, count = 0;
    if (!moe_mul_ok(batches, rows, &batch_rows) || !moe_mul_ok(batch_rows, cols, &count))
        return moe_fail(MOE_ERR_OVERFLOW, "%s: batches*rows*cols = %" PRId64 "*%" PRId64 "*%" PRId64
                        " overflows 64 bits", op, batches, rows, cols);
    const int64_t tiles_r = rows / tile_rows + (rows % tile_rows != 0);
    const moe_array_arg args[] = {
        {wide_name, wide, batch_rows, cols, wide_dtype, dequantize, 0},
        {"q", q, batch_rows, cols, fp8_dtype, !dequantize, 0},
        {"scales", scales, batches * tiles_r, moe_fp8_tiles(cols),
         format == MOE_FP8_SCALE_UE8M0 ? MOE_E4M3 : MOE_F32, !dequantize, 0},
    };
    return moe_check_arrays(op, args, 3);
}

static moe_status quantize(const char *op, moe_dtype src_dtype, int tile_rows, int64_t batches, int64_t rows,
                           int64_t cols, const void *src, moe_dtype fp8_dtype, moe_fp8_scale_format format, void *q,
                           void *scales)
{
    moe_clear_error();
    moe_status status = check_call(op, 0, src_dtype, tile_rows, batches, rows, cols, src, fp8_dtype, format, q,
                                   scales);
    if (status != MOE_OK)
        return status;
    return moe_ref_quantize_fp8(op, src_dtype, tile_rows, batches, rows, cols, src, fp8_dtype, format, q, scales);
}

moe_status moe_quantize_fp8_rows(moe_dtype src_dtype, int64_t rows, int64_t cols, const void *src,
                                 moe_dtype fp8_dtype, moe_fp8_scale_format scale_format, void *q, void *scales)
{
    return quantize("moe_quantize_fp8_rows", src_dtype, 1, 1, rows, cols, src, fp8_dtype, scale_format, q, scales);
}

moe_status moe_quantize_fp8_blocks(moe_dtype src_dtype, int64_t batches, int64_t rows, int64_t cols,
                                   const void *src, moe_dtype fp8_dtype, moe_fp8_scale_format scale_format, void *q,
                                   void *scales)
{
    return quantize("moe_quantize_fp8_blocks", src_dtype, MOE_FP8_TILE, batches, rows, cols, src, fp8_dtype,
                    scale_format, q, scales);
}

moe_status moe_dequantize_fp8(moe_dtype fp8_dtype, moe_fp8_scale_format scale_format, int tile_rows,
                              int64_t batches, int64_t rows, int64_t cols, const void *q, const void *scales,
                              moe_dtype out_dtype, void *out)
{
    static const char op[] = "moe_dequantize_fp8";
    moe_clear_error();
    moe_status status = check_call(op, 1, out_dtype, tile_rows, batches, rows, cols, out, fp8_dtype, scale_format, q,
                                   scales);
    if (status != MOE_OK)
        return status;
    const int64_t tiles_r = rows / tile_rows + (rows % tile_rows != 0), tiles_c = moe_fp8_tiles(cols);
    status = moe_ref_fp8_check_scales(op, "scales", scale_format, scales, batches * tiles_r * tiles_c, tiles_c);
    if (status != MOE_OK)
        return status;
    moe_ref_dequantize_fp8(fp8_dtype, scale_format, tile_rows, batches, rows, cols, q, scales, out_dtype, out);
    return MOE_OK;
}
