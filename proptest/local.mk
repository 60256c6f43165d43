# proptest/: the float64 oracle and error bounds (used by tests/ and bench/), and the property tests.
noinst_LTLIBRARIES += proptest/liboracle.la
proptest_liboracle_la_SOURCES = proptest/oracle.c proptest/oracle.h

# GPU properties: built and run when CUDA is configured; exit 77 (skip) where no device is visible.
if MOE_CUDA
check_PROGRAMS += proptest/test_gpu_gemm
proptest_test_gpu_gemm_SOURCES = proptest/test_gpu_gemm.c
proptest_test_gpu_gemm_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS)
proptest_test_gpu_gemm_LDADD = libmoe.la proptest/liboracle.la $(CUDA_LIBS) -lm
TESTS += proptest/test_gpu_gemm
else
EXTRA_DIST += proptest/test_gpu_gemm.c
endif
