/* The reference backend's FP8 dW entries with transposed codes (include/moe_fp8.h: moe_gemm_fp8_dw's
 * options.codes_transposed, moe_quantize_fp8_columns_transposed), around the untransposed ones, whose arithmetic
 * they leave alone: the quantizer quantizes into a host scratch [M][cols] and writes the codes transposed; dW
 * transposes x's codes [K][M] and dy's [N][M] back into scratch [M][K] and [M][N] and runs the untransposed dW.
 * So both give the same bits as the untransposed calls.  The scratch is a copy of the codes (one byte each), the
 * operands' own size: it is allocated whole (options.ref_scratch_bytes bounds dX's reduce_topk float32 scratch
 * only, and the FP8 options carry no budget); when it cannot be had the call returns MOE_ERR_OUT_OF_MEMORY
 * before writing anything. */
#include "fp8_ref.h"
#include "moe_ref.h"

#include <stdlib.h>

/* dst[c][r] = src[r][c] for src [rows][cols] of bytes. */
static void transpose_bytes(const uint8_t *src, int64_t rows, int64_t cols, uint8_t *dst)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            dst[c * rows + r] = src[r * cols + c];
}

/* A scratch of rows * cols bytes (at least one), or NULL with the failure reported naming `what`. */
static uint8_t *scratch_codes(const char *op, const char *what, int64_t rows, int64_t cols)
{
    const size_t bytes = (size_t)rows * (size_t)cols;
    uint8_t *scratch = malloc(bytes > 0 ? bytes : 1);
    if (scratch == NULL)
        moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: no memory for the %lld x %lld scratch of %s's codes", op,
                 (long long)rows, (long long)cols, what);
    return scratch;
}

moe_status moe_ref_quantize_fp8_columns_entry(const moe_fp8_columns_problem *p, const void *src,
                                              const float *topk_weights, void *q, void *scales)
{
    if (!p->transposed)
        return moe_ref_quantize_fp8_columns(p, src, topk_weights, q, scales);
    const int64_t M = p->g.rows, cols = p->g.N;
    uint8_t *rows = scratch_codes(p->g.op, "qt", M, cols);
    if (rows == NULL)
        return MOE_ERR_OUT_OF_MEMORY;
    /* writes the scales only when it succeeds, and nothing can fail after it */
    const moe_status status = moe_ref_quantize_fp8_columns(p, src, topk_weights, rows, scales);
    if (status == MOE_OK)
        transpose_bytes(rows, M, cols, q);
    free(rows);
    return status;
}

moe_status moe_ref_gemm_fp8_dw_entry(const moe_fp8_problem *p, const moe_fp8_tensor *x, const moe_fp8_tensor *dy,
                                     void *dw)
{
    if (!p->codes_transposed)
        return moe_ref_gemm_fp8_dw_blocked(p, x, dy, dw);
    const int64_t M = p->g.rows, N = p->g.N, K = p->g.K;
    uint8_t *x_rows = scratch_codes(p->g.op, "x", M, K);
    uint8_t *dy_rows = x_rows != NULL ? scratch_codes(p->g.op, "dy", M, N) : NULL;
    moe_status status = MOE_ERR_OUT_OF_MEMORY;
    if (dy_rows != NULL) {
        transpose_bytes(x->data, K, M, x_rows);   /* [K][M] -> [M][K] */
        transpose_bytes(dy->data, N, M, dy_rows); /* [N][M] -> [M][N] */
        const moe_fp8_tensor x_plain = {x_rows, x->scales, x->dtype}, dy_plain = {dy_rows, dy->scales, dy->dtype};
        status = moe_ref_gemm_fp8_dw_blocked(p, &x_plain, &dy_plain, dw);
    }
    free(x_rows), free(dy_rows);
    return status;
}
