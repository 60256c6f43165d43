# tests/: unit tests run by `make check`.
TEST_LIBS = libmoe.la proptest/liboracle.la -lm
check_PROGRAMS += tests/test_gemm_oracle
tests_test_gemm_oracle_LDADD = $(TEST_LIBS)
TESTS += tests/test_gemm_oracle

# The foundation unit tests: conversions, routing, every GEMM op x mode x dtype x option on edge routings,
# argument validation, thread-count independence.
check_PROGRAMS += tests/test_tables tests/test_dtype tests/test_routing tests/test_gemm_modes tests/test_bad_input tests/test_threads
TESTS += tests/test_tables tests/test_dtype tests/test_routing tests/test_gemm_modes tests/test_bad_input tests/test_threads
tests_test_tables_LDADD = $(TEST_LIBS)
tests_test_dtype_LDADD = $(TEST_LIBS)
tests_test_routing_LDADD = $(TEST_LIBS)
tests_test_gemm_modes_LDADD = $(TEST_LIBS)
tests_test_bad_input_LDADD = $(TEST_LIBS)
tests_test_threads_LDADD = $(TEST_LIBS)
# Also compare the naive and blocked reference twins bit for bit (needs ref/gemm_blocked.c):
tests_test_gemm_modes_CPPFLAGS = $(AM_CPPFLAGS) -DMOE_TEST_BLOCKED
# and again on the 16-byte micro-kernel, which an AVX2 machine would otherwise never run
TESTS += tests/test_gemm_modes_v4.sh
EXTRA_DIST += tests/test_gemm_modes_v4.sh
noinst_HEADERS += tests/check.h

# Run-time checks of the ACSL float postconditions (issue 5): contract_check.c mirrors the clauses of
# specs/gemm.acsl / ref/moe_ref.h; test_contracts runs them and shows a violation being caught.
check_PROGRAMS += tests/test_contracts
TESTS += tests/test_contracts
tests_test_contracts_SOURCES = tests/test_contracts.c tests/contract_check.c tests/contract_check.h
tests_test_contracts_LDADD = $(TEST_LIBS)
# the builders on a backend (moe_routing_build, moe_mlp_layout_build_on) against the host builders;
# proptest/test_gpu_builders runs the same source on MOE_BACKEND_CUDA
check_PROGRAMS += tests/test_builders
tests_test_builders_SOURCES = tests/test_builders.c tests/check.h
tests_test_builders_LDADD = libmoe.la
TESTS += tests/test_builders

# The autotune cache format and process table (src/autotune.c), and moe_gemm_autotune's argument checks;
# proptest/test_gpu_autotune tunes real calls on a GPU.
check_PROGRAMS += tests/test_autotune
TESTS += tests/test_autotune
tests_test_autotune_SOURCES = tests/test_autotune.c tests/check.h
tests_test_autotune_LDADD = libmoe.la
