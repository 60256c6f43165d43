# testlib/: the helpers the test programs share (tests/, proptest/, and the GPU benchmarks' fail-fast checks):
#   check.h       the check macros: CHECK counts and continues, REQUIRE stops at the first failure;
#   alloc.h       xmalloc / xcalloc, which never return NULL;
#   transpose.h   transpose_batches (W^T from W for FP8 dX's w_transposed);
#   gpu_check.h   CUDA_CHECK and checked device copies of the stand-alone GPU programs;
#   mlp_testlib.h the MLP test library: case generator, float64 model, error bounds, clamps, checker
#                 (mlp_*.c, one file per stage; mlp_internal.h is what they share).
noinst_LTLIBRARIES += testlib/libtestlib.la
testlib_libtestlib_la_SOURCES = testlib/alloc.c testlib/alloc.h testlib/check.h testlib/transpose.c testlib/transpose.h \
	testlib/mlp_testlib.h testlib/mlp_internal.h testlib/mlp_case.c testlib/mlp_float64.c testlib/mlp_bounds.c \
	testlib/mlp_clamps.c testlib/mlp_check.c
noinst_HEADERS += testlib/gpu_check.h
# what a test program links (in this order: each part uses the ones after it)
TESTLIB_LIBS = testlib/libtestlib.la oracle/liboracle.la libmoe.la -lm
