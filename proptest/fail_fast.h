/*
 * CHECK(cond, fmt, ...) of the fail-fast test and benchmark programs: when cond is false it prints
 * "file:line: message" to stderr and exits with status 1.  (tests/check.h has the counting variant that
 * lets a unit test go on after a failure.)
 */
#ifndef LIBMOE_FAIL_FAST_H
#define LIBMOE_FAIL_FAST_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond, ...)                                                                             \
    do {                                                                                             \
        if (!(cond)) {                                                                               \
            fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                                          \
            fprintf(stderr, __VA_ARGS__);                                                            \
            fprintf(stderr, "\n");                                                                   \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

#endif /* LIBMOE_FAIL_FAST_H */
