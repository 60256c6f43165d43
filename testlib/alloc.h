/* Allocations of the test, fuzz and benchmark programs that never return NULL: out of memory prints the
 * size and ends the program with exit status 2.  A request of 0 bytes gets a valid (1-byte) block. */
#ifndef LIBMOE_TESTLIB_ALLOC_H
#define LIBMOE_TESTLIB_ALLOC_H

#include <stddef.h>

void *xmalloc(size_t bytes);
void *xcalloc(size_t count, size_t size); /* zeroed */

#endif /* LIBMOE_TESTLIB_ALLOC_H */
