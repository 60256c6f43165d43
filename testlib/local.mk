# testlib/: the helpers the test programs share (tests/, proptest/, and the GPU benchmarks' fail-fast checks):
#   check.h      the check macros: CHECK counts and continues, REQUIRE stops at the first failure;
#   alloc.h      xmalloc / xcalloc, which never return NULL;
#   gpu_check.h  CUDA_CHECK and checked device copies of the stand-alone GPU programs.
noinst_LTLIBRARIES += testlib/libtestlib.la
testlib_libtestlib_la_SOURCES = testlib/alloc.c testlib/alloc.h testlib/check.h
noinst_HEADERS += testlib/gpu_check.h
# what a test program links (in this order: each part uses the ones after it)
TESTLIB_LIBS = testlib/libtestlib.la oracle/liboracle.la libmoe.la -lm
