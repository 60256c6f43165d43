/* The failure counter, CHECK macro and allocation helper shared by the C tests of tests/.
 *
 * CHECK(cond, fmt, ...) counts a check and, when cond is false, a failure, printing
 * "file:line: FAIL: <message>" for the first CHECK_MAX_PRINTED failures (define it before including
 * this header to change it; the rest are only counted).  A test ends with
 *     printf("%ld checks, %ld failures\n", checks, failures); return failures ? 1 : 0;
 * xmalloc never returns NULL: out of memory ends the test with exit status 2 (a hard error). */
#ifndef LIBMOE_TESTS_CHECK_H
#define LIBMOE_TESTS_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#ifndef CHECK_MAX_PRINTED
#define CHECK_MAX_PRINTED 40
#endif

static long failures, checks;

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

static inline void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (p == NULL) {
        fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
        exit(2);
    }
    return p;
}

#endif /* LIBMOE_TESTS_CHECK_H */
