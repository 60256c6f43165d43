/* The helper modes of test_cli_npy (tests/cli_fixtures.c), each returning the process's exit status. */
#ifndef LIBMOE_TESTS_CLI_FIXTURES_H
#define LIBMOE_TESTS_CLI_FIXTURES_H

#include <stdint.h>

int mk(int argc, char **argv);                                 /* mk FILE DESCR SHAPE [v1|v2|v3] VALUE... */
int info(const char *path);                                    /* info FILE */
int relayout(int argc, char **argv);                           /* relayout IN OUT AXES SHAPE [PART PARTS] */
int gen(const char *dir, uint64_t seed, const char *dtype_name);     /* gen DIR SEED DTYPE */
int gen_mlp(const char *dir, uint64_t seed, const char *dtype_name); /* genmlp DIR SEED DTYPE */

#endif
