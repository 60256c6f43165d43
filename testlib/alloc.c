/* The allocation helpers of alloc.h. */
#include "alloc.h"

#include <stdio.h>
#include <stdlib.h>

void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (p == NULL) {
        fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
        exit(2);
    }
    return p;
}

void *xcalloc(size_t count, size_t size)
{
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (p == NULL) {
        fprintf(stderr, "out of memory (%zu x %zu bytes)\n", count, size);
        exit(2);
    }
    return p;
}
