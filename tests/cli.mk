# tests/cli.mk: tests of the moe command-line tool (issue 6).
# test_cli_npy: unit tests of cli/npy.c, and the helper the scripts use to make .npy files (no numpy);
# its genmlp mode makes MLP cases with the MLP test library (testlib/mlp_testlib.h).
check_PROGRAMS += tests/test_cli_npy
tests_test_cli_npy_SOURCES = tests/test_cli_npy.c cli/npy.c cli/npy.h
tests_test_cli_npy_LDADD = $(TESTLIB_LIBS)
tests_test_cli_npy_LDFLAGS = $(AM_LDFLAGS) -no-install
CLI_SH_TESTS = tests/test_cli_ops.sh tests/test_cli_mlp.sh tests/test_cli_compare.sh tests/test_cli_errors.sh \
	tests/test_cli_cuda.sh tests/test_cli_atomic.sh
TESTS += tests/test_cli_npy $(CLI_SH_TESTS)
EXTRA_DIST += $(CLI_SH_TESTS) tests/test_cli_lib.sh
