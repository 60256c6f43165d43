/* Public FP8 quantization entry points (include/moe_fp8.h): the rows and blocks quantizers, dW's columns
 * quantizer and the dequantizer.  Each validates every argument (and, for a backend on host pointers, the
 * scales' values of a dequantization), then calls the backend's table. */
#include "fp8_ref.h"
#include "gemm_prepare.h"

#include <inttypes.h>

/* The dtypes and the scale format every quantization call takes. */
static moe_status check_formats(const char *op, const char *wide_name, moe_dtype wide_dtype, moe_dtype fp8_dtype,
                                moe_fp8_scale_format format)
{
    if (wide_dtype != MOE_F32 && wide_dtype != MOE_BF16)
        return moe_fail(MOE_ERR_INVALID_DTYPE, "%s: %s_dtype = %s (%d), expected MOE_F32 or MOE_BF16", op, wide_name,
                        moe_dtype_name(wide_dtype), (int)wide_dtype);
    if (fp8_dtype != MOE_E4M3 && fp8_dtype != MOE_E5M2)
        return moe_fail(MOE_ERR_INVALID_DTYPE, "%s: fp8_dtype = %s (%d), expected MOE_E4M3 or MOE_E5M2", op,
                        moe_dtype_name(fp8_dtype), (int)fp8_dtype);
    if (format != MOE_FP8_SCALE_F32 && format != MOE_FP8_SCALE_UE8M0)
        return moe_fail(MOE_ERR_INVALID_OPTION, "%s: scale_format = %d, expected MOE_FP8_SCALE_F32 (0) or "
                        "MOE_FP8_SCALE_UE8M0 (1)", op, (int)format);
    return MOE_OK;
}

/* The checks the three calls share: dtypes, format, dimensions, the arrays (sizes, NULLs, alignment,
 * overlaps).  src is the full-precision side (input of quantize, output of dequantize). */
static moe_status check_call(const char *op, moe_backend backend, int dequantize, moe_dtype wide_dtype, int tile_rows,
                             int64_t batches, int64_t rows, int64_t cols, const void *wide, moe_dtype fp8_dtype,
                             moe_fp8_scale_format format, const void *q, const void *scales, void *stream,
                             const moe_dispatch **table, moe_fp8_quantize_problem *p)
{
    const char *wide_name = dequantize ? "out" : "src";
    *table = moe_dispatch_for(backend);
    if (*table == NULL || !(*table)->available())
        return moe_fail(MOE_ERR_NO_BACKEND, "%s: backend %d (%s) is not available here", op, (int)backend,
                        moe_backend_name(backend));
    moe_status formats = check_formats(op, wide_name, wide_dtype, fp8_dtype, format);
    if (formats != MOE_OK)
        return formats;
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
    *p = (moe_fp8_quantize_problem){op, wide_dtype, fp8_dtype, format, tile_rows, batches, rows, cols, stream};
    return moe_check_arrays(op, args, 3);
}

static moe_status quantize(const char *op, moe_backend backend, moe_dtype src_dtype, int tile_rows, int64_t batches,
                           int64_t rows, int64_t cols, const void *src, moe_dtype fp8_dtype,
                           moe_fp8_scale_format format, void *q, void *scales, void *stream)
{
    moe_clear_error();
    const moe_dispatch *table;
    moe_fp8_quantize_problem p;
    moe_status status = check_call(op, backend, 0, src_dtype, tile_rows, batches, rows, cols, src, fp8_dtype, format, q,
                                   scales, stream, &table, &p);
    if (status != MOE_OK)
        return status;
    return table->fp8_quantize(&p, src, q, scales);
}

moe_status moe_quantize_fp8_rows(moe_backend backend, moe_dtype src_dtype, int64_t rows, int64_t cols,
                                 const void *src, moe_dtype fp8_dtype, moe_fp8_scale_format scale_format, void *q,
                                 void *scales, void *stream)
{
    return quantize("moe_quantize_fp8_rows", backend, src_dtype, 1, 1, rows, cols, src, fp8_dtype, scale_format, q,
                    scales, stream);
}

moe_status moe_quantize_fp8_blocks(moe_backend backend, moe_dtype src_dtype, int64_t batches, int64_t rows,
                                   int64_t cols, const void *src, moe_dtype fp8_dtype,
                                   moe_fp8_scale_format scale_format, void *q, void *scales, void *stream)
{
    return quantize("moe_quantize_fp8_blocks", backend, src_dtype, MOE_FP8_TILE, batches, rows, cols, src, fp8_dtype,
                    scale_format, q, scales, stream);
}

moe_status moe_dequantize_fp8(moe_backend backend, moe_dtype fp8_dtype, moe_fp8_scale_format scale_format,
                              int tile_rows, int64_t batches, int64_t rows, int64_t cols, const void *q,
                              const void *scales, moe_dtype out_dtype, void *out, void *stream)
{
    static const char op[] = "moe_dequantize_fp8";
    moe_clear_error();
    const moe_dispatch *table;
    moe_fp8_quantize_problem p;
    moe_status status = check_call(op, backend, 1, out_dtype, tile_rows, batches, rows, cols, out, fp8_dtype,
                                   scale_format, q, scales, stream, &table, &p);
    if (status != MOE_OK)
        return status;
    if (table->validates_routing_on_host) { /* host pointers: the scales' values too */
        const int64_t tiles_r = rows / tile_rows + (rows % tile_rows != 0), tiles_c = moe_fp8_tiles(cols);
        status = moe_ref_fp8_check_scales(op, "scales", scale_format, scales, batches * tiles_r * tiles_c, tiles_c);
        if (status != MOE_OK)
            return status;
    }
    return table->fp8_dequantize(&p, q, scales, out);
}

int64_t moe_fp8_column_scale_rows(int64_t rows, int64_t num_experts)
{
    if (rows < 0 || num_experts < 1)
        return -1;
    const int64_t tiles = rows / MOE_FP8_TILE + (rows % MOE_FP8_TILE != 0);
    return num_experts - 1 <= INT64_MAX - tiles ? tiles + num_experts - 1 : -1;
}

/* moe_quantize_fp8_columns (transposed 0: codes q [M][cols]) and moe_quantize_fp8_columns_transposed (1: codes
 * [cols][M]), named `op`: the same checks, the same table entry (the problem's `transposed` says which). */
static moe_status quantize_columns(const char *op, int transposed, moe_backend backend, const moe_routing *routing,
                                   moe_dtype src_dtype, int64_t cols, const void *src, moe_fp8_row_source source,
                                   const float *topk_weights, moe_dtype fp8_dtype, moe_fp8_scale_format scale_format,
                                   void *q, void *scales, void *stream)
{
    moe_clear_error();
    moe_status status = check_formats(op, "src", src_dtype, fp8_dtype, scale_format);
    if (status != MOE_OK)
        return status;
    if (source != MOE_FP8_ROWS_EXPERT && source != MOE_FP8_ROWS_SLOT && source != MOE_FP8_ROWS_TOKEN)
        return moe_fail(MOE_ERR_INVALID_OPTION, "%s: source = %d, expected MOE_FP8_ROWS_EXPERT (0), MOE_FP8_ROWS_SLOT "
                        "(1) or MOE_FP8_ROWS_TOKEN (2)", op, (int)source);
    if (cols < 0)
        return moe_fail(MOE_ERR_INVALID_SHAPE, "%s: cols = %" PRId64 ", expected >= 0", op, cols);
    if (routing == NULL)
        return moe_fail(MOE_ERR_NULL_POINTER, "%s: routing is NULL", op);
    if ((source != MOE_FP8_ROWS_EXPERT || topk_weights != NULL) && routing->gather_indices == NULL &&
        routing->num_tokens > 0 && routing->topk > 0)
        return moe_fail(MOE_ERR_NULL_POINTER, "%s: routing.gather_indices is NULL but %s needs it", op,
                        source == MOE_FP8_ROWS_TOKEN ? "source MOE_FP8_ROWS_TOKEN"
                        : source == MOE_FP8_ROWS_SLOT ? "source MOE_FP8_ROWS_SLOT" : "topk_weights");
    /* the rest of the routing as the GEMM checks it */
    const moe_gemm_options gemm_options = {
        .dtype = src_dtype,
        .permute_x = source == MOE_FP8_ROWS_TOKEN,
        .permute_y = source == MOE_FP8_ROWS_SLOT,
        .stream = stream,
    };
    const moe_dispatch *table;
    moe_fp8_columns_problem p;
    if ((status = moe_gemm_prepare(op, 0, backend, routing, cols, 0, topk_weights, &gemm_options, &table, &p.g)) !=
        MOE_OK)
        return status;
    p.src_dtype = src_dtype;
    p.fp8_dtype = fp8_dtype;
    p.scale_format = scale_format;
    p.source = source;
    p.transposed = transposed;
    const int64_t M = p.g.rows;
    const moe_array_arg args[] = {
        {"src", src, source == MOE_FP8_ROWS_TOKEN ? p.g.num_tokens : M, cols, src_dtype, 0, 0},
        {"topk_weights", topk_weights, topk_weights != NULL ? M : 0, 1, MOE_F32, 0, 0},
        {transposed ? "qt" : "q", q, transposed ? cols : M, transposed ? M : cols, fp8_dtype, 1, 0},
        {"scales", scales, moe_fp8_column_scale_rows(M, p.g.num_experts), cols,
         scale_format == MOE_FP8_SCALE_UE8M0 ? MOE_E4M3 : MOE_F32, 1, 0},
    };
    if ((status = moe_gemm_check_tensors(op, &p.g, args, 4)) != MOE_OK)
        return status;
    return table->fp8_quantize_columns(&p, src, topk_weights, q, scales);
}

moe_status moe_quantize_fp8_columns(moe_backend backend, const moe_routing *routing, moe_dtype src_dtype,
                                    int64_t cols, const void *src, moe_fp8_row_source source,
                                    const float *topk_weights, moe_dtype fp8_dtype,
                                    moe_fp8_scale_format scale_format, void *q, void *scales, void *stream)
{
    return quantize_columns("moe_quantize_fp8_columns", 0, backend, routing, src_dtype, cols, src, source,
                            topk_weights, fp8_dtype, scale_format, q, scales, stream);
}

moe_status moe_quantize_fp8_columns_transposed(moe_backend backend, const moe_routing *routing, moe_dtype src_dtype,
                                               int64_t cols, const void *src, moe_fp8_row_source source,
                                               const float *topk_weights, moe_dtype fp8_dtype,
                                               moe_fp8_scale_format scale_format, void *qt, void *scales,
                                               void *stream)
{
    return quantize_columns("moe_quantize_fp8_columns_transposed", 1, backend, routing, src_dtype, cols, src, source,
                            topk_weights, fp8_dtype, scale_format, qt, scales, stream);
}
