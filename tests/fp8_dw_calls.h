/* The calls of FP8 dW's tests (tests/test_gemm_fp8_dw.c, tests/test_gemm_fp8_dw_bad.c) on the test's backend:
 * MOE_BACKEND_REF, or MOE_BACKEND_CUDA where the file is built with -DMOE_TEST_CUDA (proptest/test_gpu_gemm_fp8_dw,
 * proptest/test_gpu_gemm_fp8_dw_bad), from host arrays. */
#ifndef MOE_TESTS_FP8_DW_CALLS_H
#define MOE_TESTS_FP8_DW_CALLS_H

#include "moe_backend.h"
#include "moe_fp8.h"

#include <stdint.h>
#include <string.h>

#include "alloc.h"
#include "check.h"

#ifdef MOE_TEST_CUDA
#include "gpu_check.h"
static const moe_backend backend = MOE_BACKEND_CUDA;
#else
static const moe_backend backend = MOE_BACKEND_REF;
#endif

static inline size_t scale_bytes(moe_fp8_scale_format format) { return format == MOE_FP8_SCALE_UE8M0 ? 1 : 4; }

/* moe_gemm_fp8_dw on the test's backend from host arrays: dw [E][N][K] (host) is the output's old contents and
 * receives the result; on CUDA through device copies of every array, the status the call's or the
 * synchronisation's (dw copied back either way: a refused call must leave it unchanged). */
static inline moe_status dw_on(const moe_routing *routing, int64_t N, int64_t K, const moe_fp8_tensor *x,
                               const moe_fp8_tensor *dy, void *dw, const moe_fp8_options *opt)
{
#ifdef MOE_TEST_CUDA
    const int64_t E = routing->num_experts, M = routing->num_tokens * routing->topk;
    const int64_t srows = moe_fp8_column_scale_rows(M, E);
    const size_t sb = scale_bytes(opt ? opt->scale_format : MOE_FP8_SCALE_F32);
    const size_t dw_bytes = (size_t)(E * N * K) * (opt && opt->out_dtype == MOE_BF16 ? 2 : 4);
    int64_t *d_sizes = to_device(routing->m_sizes, (size_t)E * sizeof(int64_t));
    int64_t *d_gather = routing->gather_indices ? to_device(routing->gather_indices, (size_t)M * sizeof(int64_t))
                                                : NULL;
    const moe_routing d_routing = {routing->num_tokens, routing->topk, E, d_sizes, d_gather};
    const moe_fp8_tensor d_x = {to_device(x->data, (size_t)(M * K)), to_device(x->scales, (size_t)(srows * K) * sb),
                                x->dtype};
    const moe_fp8_tensor d_dy = {to_device(dy->data, (size_t)(M * N)),
                                 to_device(dy->scales, (size_t)(srows * N) * sb), dy->dtype};
    void *d_dw = to_device(dw, dw_bytes);
    moe_status st = moe_gemm_fp8_dw(backend, &d_routing, N, K, &d_x, &d_dy, d_dw, opt);
    if (st == MOE_OK)
        st = moe_backend_synchronize(backend, NULL);
    to_host(dw, d_dw, dw_bytes);
    cudaFree(d_sizes), cudaFree(d_gather), cudaFree((void *)d_x.data), cudaFree((void *)d_x.scales);
    cudaFree((void *)d_dy.data), cudaFree((void *)d_dy.scales), cudaFree(d_dw);
    return st;
#else
    return moe_gemm_fp8_dw(backend, routing, N, K, x, dy, dw, opt);
#endif
}

/* moe_quantize_fp8_columns and moe_quantize_fp8_columns_transposed: the same arguments. */
typedef moe_status columns_fn(moe_backend, const moe_routing *, moe_dtype, int64_t, const void *, moe_fp8_row_source,
                              const float *, moe_dtype, moe_fp8_scale_format, void *, void *, void *);

/* moe_quantize_fp8_columns (or, with transposed, moe_quantize_fp8_columns_transposed) on the test's backend from
 * host arrays (q [M][cols], or [cols][M], and scales receive the result; on CUDA through device copies, and then
 * also checked bit for bit against the reference's codes and scales). */
static inline moe_status columns_on(const moe_routing *routing, moe_dtype src_dtype, int64_t cols, const void *src,
                                    moe_fp8_row_source source, const float *topk, moe_dtype fp8,
                                    moe_fp8_scale_format format, int transposed, uint8_t *q, void *scales)
{
    columns_fn *quantize = transposed ? moe_quantize_fp8_columns_transposed : moe_quantize_fp8_columns;
#ifdef MOE_TEST_CUDA
    const int64_t E = routing->num_experts, T = routing->num_tokens, M = T * routing->topk;
    const int64_t srows = moe_fp8_column_scale_rows(M, E);
    const size_t scale_size = (size_t)(srows * cols) * scale_bytes(format);
    const size_t src_bytes = (size_t)((source == MOE_FP8_ROWS_TOKEN ? T : M) * cols) * (src_dtype == MOE_F32 ? 4 : 2);
    int64_t *d_sizes = to_device(routing->m_sizes, (size_t)E * sizeof(int64_t));
    int64_t *d_gather = routing->gather_indices ? to_device(routing->gather_indices, (size_t)M * sizeof(int64_t))
                                                : NULL;
    const moe_routing d_routing = {T, routing->topk, E, d_sizes, d_gather};
    void *d_src = to_device(src, src_bytes), *d_topk = topk ? to_device(topk, (size_t)M * sizeof(float)) : NULL;
    void *d_q = to_device(q, (size_t)(M * cols)), *d_scales = to_device(scales, scale_size);
    moe_status st = quantize(backend, &d_routing, src_dtype, cols, d_src, source, d_topk, fp8, format, d_q, d_scales,
                             NULL);
    if (st == MOE_OK)
        st = moe_backend_synchronize(backend, NULL);
    to_host(q, d_q, (size_t)(M * cols));
    to_host(scales, d_scales, scale_size);
    cudaFree(d_sizes), cudaFree(d_gather), cudaFree(d_src), cudaFree(d_topk), cudaFree(d_q), cudaFree(d_scales);
    if (st == MOE_OK) {
        uint8_t *ref_q = xmalloc((size_t)(M * cols));
        void *ref_scales = xmalloc(scale_size);
        REQUIRE(quantize(MOE_BACKEND_REF, routing, src_dtype, cols, src, source, topk, fp8, format, ref_q, ref_scales,
                         NULL) == MOE_OK, "reference columns: %s", moe_last_error());
        CHECK(memcmp(q, ref_q, (size_t)(M * cols)) == 0 && memcmp(scales, ref_scales, scale_size) == 0,
              "columns quantizer%s (M %lld E %lld cols %lld source %d topk %d %s %s): codes or scales differ from the "
              "reference's", transposed ? " (transposed)" : "", (long long)M, (long long)E, (long long)cols,
              (int)source, topk != NULL, moe_dtype_name(fp8), format ? "ue8m0" : "f32");
        free(ref_q), free(ref_scales);
    }
    return st;
#else
    return quantize(backend, routing, src_dtype, cols, src, source, topk, fp8, format, q, scales, NULL);
#endif
}

#endif
