# proptest/: the property tests (the fuzzer moe-fuzz and the GPU property programs).

# moe-fuzz: the property-based testing engine, generators and properties (proptest/README.md).
bin_PROGRAMS += proptest/moe-fuzz
proptest_moe_fuzz_SOURCES = proptest/moe_fuzz.c proptest/pt.h proptest/pt_engine.c proptest/pt_gen.c \
	proptest/pt_gen.h proptest/pt_gemm.c proptest/pt_gemm.h proptest/pt_gemm_meta.c proptest/pt_gemm_fp8.c proptest/pt_gemm_fp8_dw.c proptest/pt_fp8.h proptest/pt_gemm_fp8_model.c proptest/fp8_hopper_model.c proptest/fp8_hopper_model.h proptest/pt_mlp.c proptest/pt_mlp.h proptest/pt_mlp_layout.c
proptest_moe_fuzz_CPPFLAGS = $(AM_CPPFLAGS)
proptest_moe_fuzz_LDADD = $(TESTLIB_LIBS)
# make check: a fixed-seed budget plus the committed regression file
TESTS += proptest/check-fuzz.sh
# and over a spread of seeds: a correct build never fails the fuzzer (proptest/README.md)
TESTS += proptest/check-fuzz-seeds.sh
EXTRA_DIST += proptest/check-fuzz.sh proptest/check-fuzz-seeds.sh proptest/regressions.txt proptest/README.md
# the Hopper FP8 kernel's CPU model against the oracle's Hopper bound, and its mutant without promotion
# failing it (specs/FP8.md section 5)
check_PROGRAMS += proptest/test_fp8_promotion
proptest_test_fp8_promotion_SOURCES = proptest/test_fp8_promotion.c proptest/fp8_hopper_model.c proptest/fp8_hopper_model.h
proptest_test_fp8_promotion_LDADD = $(TESTLIB_LIBS)
TESTS += proptest/test_fp8_promotion
# mutation testing (proptest/README.md, "Mutation testing"): shipped, not run by make check (too slow)
EXTRA_DIST += proptest/mutants.sh

# GPU properties: built and run when CUDA is configured; exit 77 (skip) where no device is visible.
if MOE_CUDA
proptest_moe_fuzz_SOURCES += proptest/pt_gpu.c proptest/pt_gpu_mlp.c proptest/pt_gpu_fp8.c proptest/pt_cuda.h
proptest_moe_fuzz_CPPFLAGS += $(CUDA_CPPFLAGS) -DMOE_FUZZ_CUDA
proptest_moe_fuzz_LDADD += $(CUDA_LIBS)
check_PROGRAMS += proptest/test_gpu_gemm
proptest_test_gpu_gemm_SOURCES = proptest/test_gpu_gemm.c
proptest_test_gpu_gemm_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS)
proptest_test_gpu_gemm_LDADD = $(TESTLIB_LIBS) $(CUDA_LIBS)
TESTS += proptest/test_gpu_gemm
# the shared test tests/test_builders.c again, on MOE_BACKEND_CUDA (-DMOE_TEST_CUDA)
check_PROGRAMS += proptest/test_gpu_builders
proptest_test_gpu_builders_SOURCES = tests/test_builders.c
proptest_test_gpu_builders_CPPFLAGS = $(AM_CPPFLAGS) -DMOE_TEST_CUDA $(CUDA_CPPFLAGS)
proptest_test_gpu_builders_LDADD = $(TESTLIB_LIBS) $(CUDA_LIBS)
TESTS += proptest/test_gpu_builders
# the shared test tests/test_fp8_quantize.c again, on MOE_BACKEND_CUDA (-DMOE_TEST_CUDA): the device quantizers
check_PROGRAMS += proptest/test_gpu_fp8_quantize
proptest_test_gpu_fp8_quantize_SOURCES = tests/test_fp8_quantize.c
proptest_test_gpu_fp8_quantize_CPPFLAGS = $(AM_CPPFLAGS) -DMOE_TEST_CUDA $(CUDA_CPPFLAGS)
proptest_test_gpu_fp8_quantize_LDADD = $(TESTLIB_LIBS) $(CUDA_LIBS)
TESTS += proptest/test_gpu_fp8_quantize
# the shared tests tests/test_gemm_fp8_dw.c and tests/test_gemm_fp8_dw_bad.c again, on MOE_BACKEND_CUDA
# (-DMOE_TEST_CUDA): FP8 dW and its quantizer, their results and their bad values found on the device
check_PROGRAMS += proptest/test_gpu_gemm_fp8_dw
proptest_test_gpu_gemm_fp8_dw_SOURCES = tests/test_gemm_fp8_dw.c tests/fp8_dw_calls.h
proptest_test_gpu_gemm_fp8_dw_CPPFLAGS = $(AM_CPPFLAGS) -DMOE_TEST_CUDA $(CUDA_CPPFLAGS)
proptest_test_gpu_gemm_fp8_dw_LDADD = $(TESTLIB_LIBS) $(CUDA_LIBS)
TESTS += proptest/test_gpu_gemm_fp8_dw
check_PROGRAMS += proptest/test_gpu_gemm_fp8_dw_bad
proptest_test_gpu_gemm_fp8_dw_bad_SOURCES = tests/test_gemm_fp8_dw_bad.c tests/fp8_dw_calls.h
proptest_test_gpu_gemm_fp8_dw_bad_CPPFLAGS = $(AM_CPPFLAGS) -DMOE_TEST_CUDA $(CUDA_CPPFLAGS)
proptest_test_gpu_gemm_fp8_dw_bad_LDADD = $(TESTLIB_LIBS) $(CUDA_LIBS)
TESTS += proptest/test_gpu_gemm_fp8_dw_bad
# moe_gemm_autotune on real calls: correct results, the table used, the cache file read back
check_PROGRAMS += proptest/test_gpu_autotune
proptest_test_gpu_autotune_SOURCES = proptest/test_gpu_autotune.c
proptest_test_gpu_autotune_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS)
proptest_test_gpu_autotune_LDADD = $(TESTLIB_LIBS) $(CUDA_LIBS)
TESTS += proptest/test_gpu_autotune
else
EXTRA_DIST += proptest/test_gpu_gemm.c proptest/pt_gpu.c proptest/pt_gpu_mlp.c proptest/pt_gpu_fp8.c proptest/pt_cuda.h proptest/test_gpu_autotune.c
endif

# GPU blockwise MoE MLP properties (gpu/mlp/), on the MLP test library of testlib/ with the
# GPU behind its mt_mlp_fwd/mt_mlp_bwd hooks; exit 77 (skip) where no device is visible.
if MOE_CUDA
check_PROGRAMS += proptest/test_gpu_mlp
proptest_test_gpu_mlp_SOURCES = proptest/test_gpu_mlp.c
proptest_test_gpu_mlp_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS)
proptest_test_gpu_mlp_LDADD = $(TESTLIB_LIBS) $(CUDA_LIBS)
TESTS += proptest/test_gpu_mlp
else
EXTRA_DIST += proptest/test_gpu_mlp.c
endif
