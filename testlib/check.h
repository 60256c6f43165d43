/*
 * The check macros of the test programs, in the two behaviours a test needs (the names of Catch2):
 *
 *   CHECK(cond, fmt, ...)    count and continue: counts a check and, when cond is false, a failure,
 *                            printing "file:line: FAIL: <message>" for the first CHECK_MAX_PRINTED failures
 *                            (define it before including this header to change it; the rest are only
 *                            counted).  A test that uses it ends with
 *                                printf("%ld checks, %ld failures\n", checks, failures); return failures ? 1 : 0;
 *   REQUIRE(cond, fmt, ...)  stop at the first failure: prints "file:line: <message>" and exits with status 1.
 *                            For what the rest of the program cannot go on without, and for the programs
 *                            whose first failure is their verdict (the GPU tests, the benchmarks, the MLP
 *                            test library).
 *   first_difference(a, b, count, size)  the first of count elements of size bytes where a and b differ bit
 *                            for bit, or -1: the twins' check (naive and blocked references agree bit for bit).
 */
#ifndef LIBMOE_TESTLIB_CHECK_H
#define LIBMOE_TESTLIB_CHECK_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef CHECK_MAX_PRINTED
#define CHECK_MAX_PRINTED 40
#endif

/* CHECK's counters, one pair per program (a program that only uses REQUIRE leaves them unused) */
static long failures __attribute__((unused)), checks __attribute__((unused));

#define CHECK(cond, ...)                                                                             \
    do {                                                                                             \
        checks++;                                                                                    \
        if (!(cond)) {                                                                               \
            if (++failures <= CHECK_MAX_PRINTED) {                                                   \
                fprintf(stderr, "%s:%d: FAIL: ", __FILE__, __LINE__);                                \
                fprintf(stderr, __VA_ARGS__);                                                        \
                fprintf(stderr, "\n");                                                               \
            }                                                                                        \
        }                                                                                            \
    } while (0)

#define REQUIRE(cond, ...)                                                                           \
    do {                                                                                             \
        if (!(cond)) {                                                                               \
            fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                                          \
            fprintf(stderr, __VA_ARGS__);                                                            \
            fprintf(stderr, "\n");                                                                   \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

static inline int64_t first_difference(const void *a, const void *b, int64_t count, size_t size)
{
    for (int64_t i = 0; i < count; i++)
        if (memcmp((const char *)a + (size_t)i * size, (const char *)b + (size_t)i * size, size) != 0)
            return i;
    return -1;
}

#endif /* LIBMOE_TESTLIB_CHECK_H */
