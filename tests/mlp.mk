# tests/mlp.mk: tests of the blockwise MoE MLP reference (issue 3).
# each on the MLP test library of testlib/ (case generator, float64 model and bounds, checker)
check_PROGRAMS += tests/test_mlp_grad
tests_test_mlp_grad_LDADD = $(TESTLIB_LIBS)
TESTS += tests/test_mlp_grad
check_PROGRAMS += tests/test_mlp_props
tests_test_mlp_props_LDADD = $(TESTLIB_LIBS)
TESTS += tests/test_mlp_props
check_PROGRAMS += tests/test_mlp_layout
tests_test_mlp_layout_LDADD = $(TESTLIB_LIBS)
TESTS += tests/test_mlp_layout
# a timing helper (not a test): forward + backward of a Qwen3-30B-A3B layer on the reference
noinst_PROGRAMS += tests/mlp_layer_time
tests_mlp_layer_time_SOURCES = tests/mlp_layer_time.c
tests_mlp_layer_time_LDADD = $(TESTLIB_LIBS)
