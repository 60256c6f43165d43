#include "transpose.h"

#include <string.h>

#include "alloc.h"

void *transpose_batches(const void *src, int64_t batches, int64_t rows, int64_t cols, size_t size)
{
    unsigned char *dst = xmalloc((size_t)(batches * rows * cols) * size);
    for (int64_t b = 0; b < batches; b++)
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++)
                memcpy(dst + ((b * cols + j) * rows + i) * size,
                       (const unsigned char *)src + ((b * rows + i) * cols + j) * size, size);
    return dst;
}
