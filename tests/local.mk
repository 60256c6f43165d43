# tests/: unit tests run by `make check`.
TEST_LIBS = libmoe.la proptest/liboracle.la -lm
check_PROGRAMS += tests/test_gemm_oracle
tests_test_gemm_oracle_LDADD = $(TEST_LIBS)
TESTS += tests/test_gemm_oracle
