# tests/: unit tests run by `make check`, each linked with testlib/ (TESTLIB_LIBS: the test helpers, the
# oracle, libmoe).
check_PROGRAMS += tests/test_gemm_oracle
tests_test_gemm_oracle_LDADD = $(TESTLIB_LIBS)
TESTS += tests/test_gemm_oracle

# The foundation unit tests: conversions, routing, every GEMM op x mode x dtype x option on edge routings,
# argument validation, thread-count independence.
check_PROGRAMS += tests/test_tables tests/test_dtype tests/test_routing tests/test_gemm_modes tests/test_bad_input tests/test_threads
TESTS += tests/test_tables tests/test_dtype tests/test_routing tests/test_gemm_modes tests/test_bad_input tests/test_threads
tests_test_tables_LDADD = $(TESTLIB_LIBS)
tests_test_dtype_LDADD = $(TESTLIB_LIBS)
tests_test_routing_LDADD = $(TESTLIB_LIBS)
tests_test_gemm_modes_LDADD = $(TESTLIB_LIBS)
tests_test_bad_input_LDADD = $(TESTLIB_LIBS)
tests_test_threads_LDADD = $(TESTLIB_LIBS)
# Also compare the naive and blocked reference twins bit for bit (ref/gemm/, the blocked twin):
tests_test_gemm_modes_CPPFLAGS = $(AM_CPPFLAGS) -DMOE_TEST_BLOCKED
# and again on the 16-byte micro-kernel, which an AVX2 machine would otherwise never run
TESTS += tests/test_gemm_modes_v4.sh
EXTRA_DIST += tests/test_gemm_modes_v4.sh
# libmoe.so exports the public moe_* API only (libmoe_la_LDFLAGS' -export-symbols-regex)
TESTS += tests/test_exports.sh
EXTRA_DIST += tests/test_exports.sh

# FP8 (specs/FP8.md): the e4m3 / e5m2 conversions against an independent model
check_PROGRAMS += tests/test_fp8_dtype
tests_test_fp8_dtype_LDADD = $(TESTLIB_LIBS)
TESTS += tests/test_fp8_dtype
# the FP8 grouped GEMM reference against its oracle and bound, its argument checks; the quantizers
check_PROGRAMS += tests/test_gemm_fp8
tests_test_gemm_fp8_LDADD = $(TESTLIB_LIBS)
TESTS += tests/test_gemm_fp8
# FP8 dW and its columns quantizers: results against the oracle (test_gemm_fp8_dw), bad arguments and values
# (test_gemm_fp8_dw_bad); both call through tests/fp8_dw_calls.h
check_PROGRAMS += tests/test_gemm_fp8_dw
tests_test_gemm_fp8_dw_SOURCES = tests/test_gemm_fp8_dw.c tests/fp8_dw_calls.h
tests_test_gemm_fp8_dw_LDADD = $(TESTLIB_LIBS)
TESTS += tests/test_gemm_fp8_dw
check_PROGRAMS += tests/test_gemm_fp8_dw_bad
tests_test_gemm_fp8_dw_bad_SOURCES = tests/test_gemm_fp8_dw_bad.c tests/fp8_dw_calls.h
tests_test_gemm_fp8_dw_bad_LDADD = $(TESTLIB_LIBS)
TESTS += tests/test_gemm_fp8_dw_bad
check_PROGRAMS += tests/test_fp8_quantize
tests_test_fp8_quantize_LDADD = $(TESTLIB_LIBS)
TESTS += tests/test_fp8_quantize

# Run-time checks of the ACSL float postconditions (issue 5): contract_check.c mirrors the clauses of
# specs/gemm.acsl / ref/moe_ref.h; test_contracts runs them and shows a violation being caught.
check_PROGRAMS += tests/test_contracts
TESTS += tests/test_contracts
tests_test_contracts_SOURCES = tests/test_contracts.c tests/contract_check.c tests/contract_check.h
tests_test_contracts_LDADD = $(TESTLIB_LIBS)
# the builders on a backend (moe_routing_build, moe_mlp_layout_build_on) against the host builders;
# proptest/test_gpu_builders runs the same source on MOE_BACKEND_CUDA
check_PROGRAMS += tests/test_builders
tests_test_builders_LDADD = $(TESTLIB_LIBS)
TESTS += tests/test_builders

# The autotune cache format and process table (src/autotune.c), and moe_gemm_autotune's argument checks;
# proptest/test_gpu_autotune tunes real calls on a GPU.
check_PROGRAMS += tests/test_autotune
TESTS += tests/test_autotune
tests_test_autotune_LDADD = $(TESTLIB_LIBS)

# The blockwise MoE MLP reference (issue 3), each test on the MLP test library (testlib/mlp_testlib.h).
check_PROGRAMS += tests/test_mlp_grad tests/test_mlp_props tests/test_mlp_layout
TESTS += tests/test_mlp_grad tests/test_mlp_props tests/test_mlp_layout
tests_test_mlp_grad_LDADD = $(TESTLIB_LIBS)
tests_test_mlp_props_LDADD = $(TESTLIB_LIBS)
tests_test_mlp_layout_LDADD = $(TESTLIB_LIBS)
# a timing helper (not a test): forward + backward of a Qwen3-30B-A3B layer on the reference
noinst_PROGRAMS += tests/mlp_layer_time
tests_mlp_layer_time_LDADD = $(TESTLIB_LIBS)

# The moe command-line tool (issue 6).
# test_cli_npy: unit tests of cli/npy.c, and the helper the scripts use to make .npy files (no numpy);
# its genmlp mode makes MLP cases with the MLP test library.
check_PROGRAMS += tests/test_cli_npy
tests_test_cli_npy_SOURCES = tests/test_cli_npy.c tests/cli_fixtures.c tests/cli_fixtures.h cli/npy.c cli/npy.h
tests_test_cli_npy_LDADD = $(TESTLIB_LIBS)
tests_test_cli_npy_LDFLAGS = $(AM_LDFLAGS) -no-install
CLI_SH_TESTS = tests/test_cli_ops.sh tests/test_cli_mlp.sh tests/test_cli_options.sh tests/test_cli_nki.sh \
	tests/test_cli_compare.sh tests/test_cli_errors.sh tests/test_cli_cuda.sh tests/test_cli_atomic.sh \
	tests/test_cli_layouts.sh tests/test_cli_help.sh tests/test_cli_torch.sh tests/test_cli_fp8.sh
TESTS += tests/test_cli_npy $(CLI_SH_TESTS)
EXTRA_DIST += $(CLI_SH_TESTS) tests/test_cli_lib.sh tests/nki_bwmm_cases.py tests/torch_moe_check.py \
	tests/torch_moe_linear.py tests/torch_moe_hf.py
