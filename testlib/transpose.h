/* The test programs' transposition of a batch of matrices (W^T from W, and its block scales, for FP8 dX with
 * options.w_transposed): a new array, from xmalloc. */
#ifndef LIBMOE_TESTLIB_TRANSPOSE_H
#define LIBMOE_TESTLIB_TRANSPOSE_H

#include <stddef.h>
#include <stdint.h>

/* dst[b][j][i] = src[b][i][j] for `batches` matrices [rows][cols] of `size`-byte elements. */
void *transpose_batches(const void *src, int64_t batches, int64_t rows, int64_t cols, size_t size);

#endif /* LIBMOE_TESTLIB_TRANSPOSE_H */
