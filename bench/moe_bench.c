/* moe-bench: libmoe's CUDA grouped GEMM against cuBLAS in one process, on the shapes of ANCHORS.md.
 *
 * For each (model GEMM, op) it times, with CUDA events (warm-up, then the median of --repeat runs):
 *   libmoe       this project's kernel (plain expert-order layout, bf16, fp32 accumulation)
 *   cublas-loop  one cublasGemmEx per expert
 *   cublas-group cublasGemmGroupedBatchedEx (one group per expert)
 *   dense        one cublasGemmEx of the same total M x N x K: the practical ceiling
 * and prints TFLOP/s (2 M N K / time) with ratios, plus a CSV (--csv FILE).  Inputs are random (never zeros).
 * Checks of libmoe's output (poisoned with NaN before its first run, checked after its last one):
 *   always (every mode, --dtype and --topk-weights included): every element finite (output_finite, on the
 *     device); a row that fails ends "NONFINITE OUTPUT";
 *   bf16 without --topk-weights and without --libmoe-only: also 4096 sampled elements compared with
 *     cuBLAS's (cublas-loop's) output, relative difference <= 0.05; a row that fails ends "MISMATCH vs cuBLAS".
 * Every row is printed; then, if any row failed, a line on stderr counts the failures and the exit status
 * is 1 (0 when all rows pass, 77 without a CUDA device, 2 on a usage error; 1 also, at once, when a CUDA,
 * cuBLAS or libmoe call fails).
 *
 * usage: moe-bench [--tokens T] [--repeat R] [--shapes all|qwen3|mixtral|deepseek] [--ops fwd,dx,dw]
 *                  [--csv FILE] [--seed S] [--libmoe-only] [--autotune FILE | --tuned FILE] [--sync-each]
 *                  [--topk-weights] [--dtype bf16|f16|f32|tf32|e4m3|e5m2] [--w-transposed] [--codes-transposed]
 * --libmoe-only times libmoe alone (the cuBLAS columns print 0): for quick iterations on a kernel.
 * --topk-weights passes random topk weights (of --dtype) to libmoe's calls (fused into fwd's and dX's epilogues and
 * into dW's dY operand); cuBLAS, which has no such fusion, still runs without them, and the sample
 * comparison with cuBLAS is skipped (the finiteness check still runs).
 * --dtype f16 | f32 | tf32 times libmoe on f16 or f32 tensors (tf32: f32 with options.allow_tf32), with
 * --libmoe-only only (so only the finiteness check applies).
 * --dtype e4m3 | e5m2 times libmoe's FP8 GEMM (include/moe_fp8.h: fwd, dX, and dW on operands with 128 x 1
 * column scales) on random finite codes with float32 scales of 1, bf16 output, --libmoe-only only.
 * --w-transposed (FP8 only): dX reads W as W^T [E][K][N] (moe_fp8_options.w_transposed; the same random codes
 * and unit scales, viewed transposed).
 * --codes-transposed (FP8 only): dW reads X's and dY's codes transposed, [K][M] and [N][M]
 * (moe_fp8_options.codes_transposed: the form Hopper's FP8 tensor cores read; the same random codes, viewed transposed).
 * --autotune FILE times libmoe's heuristic choice first, then runs moe_gemm_autotune (--repeat runs per
 * candidate), which appends the choice to FILE, then times the heuristic and the tuned choice again, alternated
 * twice (moe_gemm_autotune_clear / moe_gemm_autotune_load of FILE), prints all five, and reports the last
 * tuned time in the table.  Each heuristic timing starts from an empty table, so that no line of FILE (of this
 * run or an earlier one) stands in for the heuristic.
 * --tuned FILE loads an autotune cache (moe_gemm_autotune_load) before timing.
 * Timing (time_median): as triton.testing.do_bench, which ANCHORS.md used: L2 flushed before each call,
 * no host synchronisation between calls; --sync-each waits for each call instead (the method of the older
 * measurements in bench/RESULTS.md). */
#include "moe.h"
#include "moe_fp8.h"
#include "oracle.h"
#include "alloc.h"
#include "gpu_check.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CUBLAS_CHECK(call)                                                                           \
    do {                                                                                             \
        cublasStatus_t st_ = (call);                                                                 \
        REQUIRE(st_ == CUBLAS_STATUS_SUCCESS, "%s: cuBLAS status %d", #call, (int)st_);              \
    } while (0)

typedef struct shape {
    const char *model, *gemm;
    int64_t E, k, N, K;
} shape;

static const shape shapes[] = {
    {"qwen3-30b-a3b", "gate_up", 128, 8, 1536, 2048},
    {"qwen3-30b-a3b", "down", 128, 8, 2048, 768},
    {"mixtral-8x7b", "gate_up", 8, 2, 28672, 4096},
    {"mixtral-8x7b", "down", 8, 2, 4096, 14336},
    {"deepseek-v3", "gate_up", 256, 8, 4096, 7168},
};

enum op { FWD, DX, DW };
static const char *const op_names[] = {"fwd", "dx", "dw"};

typedef struct bench_ctx {
    cublasHandle_t handle;
    cudaEvent_t *starts, *stops; /* [repeat] */
    int repeat;
    int sync_each;               /* --sync-each */
    void *flush;                 /* FLUSH_BYTES of device memory, rewritten to evict L2 before each run */
} bench_ctx;

#define FLUSH_BYTES ((size_t)256 << 20) /* as triton.testing.do_bench; the H100's L2 is 50 MB */

static int compare_floats(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

typedef void (*run_fn)(void *state);

/* Median milliseconds of one fn(state) call, timed as triton.testing.do_bench times the anchors of
 * ANCHORS.md: after three warm-up calls, each timed call follows a 256 MB memset that evicts L2, an event
 * pair brackets the call alone, and the host does not wait between calls (it enqueues ahead, as in a
 * training step), so a call's host-side work overlaps the GPU's previous work; one synchronisation at the
 * end.  With --sync-each the host instead waits for every call before the next one is enqueued (no flush):
 * the host-side work of a call then lies inside its own interval. */
static float time_median(bench_ctx *ctx, run_fn fn, void *state)
{
    for (int i = 0; i < 3; i++)
        fn(state);
    CUDA_CHECK(cudaDeviceSynchronize());
    float *ms = malloc(sizeof(float) * (size_t)ctx->repeat);
    REQUIRE(ms != NULL, "out of memory");
    for (int i = 0; i < ctx->repeat; i++) {
        if (!ctx->sync_each)
            CUDA_CHECK(cudaMemsetAsync(ctx->flush, i & 0xff, FLUSH_BYTES, 0));
        CUDA_CHECK(cudaEventRecord(ctx->starts[i], 0));
        fn(state);
        CUDA_CHECK(cudaEventRecord(ctx->stops[i], 0));
        if (ctx->sync_each)
            CUDA_CHECK(cudaEventSynchronize(ctx->stops[i]));
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < ctx->repeat; i++)
        CUDA_CHECK(cudaEventElapsedTime(&ms[i], ctx->starts[i], ctx->stops[i]));
    qsort(ms, (size_t)ctx->repeat, sizeof(float), compare_floats);
    float median = ms[ctx->repeat / 2];
    free(ms);
    return median;
}

typedef struct problem {
    bench_ctx *ctx;
    enum op op;
    int64_t E, M, N, K;
    const int64_t *m_sizes; /* host */
    moe_routing dev_routing;
    void *x, *w, *dy;       /* device, of dtype: X [M][K], W [E][N][K], dY [M][N] */
    void *topk_w;           /* device [M] (slot order): libmoe's fused topk weights (--topk-weights), or NULL */
    moe_dtype dtype;        /* of x, w, dy, out, topk_w (--dtype; cuBLAS runs only for bf16) */
    int allow_tf32;         /* --dtype tf32: f32 tensors with options.allow_tf32 */
    int fp8;                /* --dtype e4m3 | e5m2: x, w, dy hold FP8 codes with the scales below; out is bf16 */
    int w_transposed;       /* --w-transposed: FP8 dX reads w as W^T [E][K][N] */
    int codes_transposed;   /* --codes-transposed: FP8 dW reads x and dy as [K][M] and [N][M] */
    void *x_scales, *w_scales, *dy_scales; /* device float32 [M][K/128], [E][N/128][K/128], [M][N/128] */
    void *x_column_scales, *dy_column_scales; /* dW's: float32 [moe_fp8_column_scale_rows(M, E)][K], [..][N] */
    void *out;              /* device, of dtype (bf16 for FP8), max of the three outputs */
    /* grouped cuBLAS */
    const void **A, **B;
    void **C;
    int *gm, *gn, *gk, *glda, *gldb, *gldc, *gsize;
    cublasOperation_t *ta, *tb;
    float *alphas, *betas;
} problem;

static void run_libmoe_fp8(problem *p)
{
    moe_fp8_options o = {0};
    o.out_dtype = MOE_BF16;
    o.w_transposed = p->op == DX && p->w_transposed;
    o.codes_transposed = p->op == DW && p->codes_transposed;
    const moe_fp8_tensor x = {p->x, p->x_scales, p->dtype}, w = {p->w, p->w_scales, p->dtype};
    const moe_fp8_tensor dy = {p->dy, p->dy_scales, p->dtype};
    const moe_fp8_tensor x_columns = {p->x, p->x_column_scales, p->dtype};
    const moe_fp8_tensor dy_columns = {p->dy, p->dy_column_scales, p->dtype};
    const moe_routing *r = &p->dev_routing;
    const moe_status st = p->op == FWD ? moe_gemm_fp8_fwd(MOE_BACKEND_CUDA, r, p->N, p->K, &x, &w, NULL, p->out, &o)
                          : p->op == DX ? moe_gemm_fp8_dx(MOE_BACKEND_CUDA, r, p->N, p->K, &dy, &w, NULL, p->out, &o)
                                        : moe_gemm_fp8_dw(MOE_BACKEND_CUDA, r, p->N, p->K, &x_columns, &dy_columns,
                                                          p->out, &o);
    REQUIRE(st == MOE_OK, "libmoe: %s", moe_last_error());
}

static void run_libmoe(void *state)
{
    problem *p = state;
    if (p->fp8) {
        run_libmoe_fp8(p);
        return;
    }
    moe_gemm_options o = {0};
    o.dtype = p->dtype;
    o.allow_tf32 = p->allow_tf32;
    moe_status st;
    if (p->op == FWD)
        st = moe_gemm_fwd(MOE_BACKEND_CUDA, &p->dev_routing, p->N, p->K, p->x, p->w, p->topk_w, p->out, &o);
    else if (p->op == DX)
        st = moe_gemm_dx(MOE_BACKEND_CUDA, &p->dev_routing, p->N, p->K, p->dy, p->w, p->topk_w, p->out, &o);
    else
        st = moe_gemm_dw(MOE_BACKEND_CUDA, &p->dev_routing, p->N, p->K, p->x, p->dy, p->topk_w, p->out, &o);
    REQUIRE(st == MOE_OK, "libmoe: %s", moe_last_error());
}

/* One column-major GEMM of expert e's block for the op (row-major tensors seen transposed). */
static void expert_gemm(problem *p, cublasHandle_t h, int64_t row0, int64_t rows, int64_t e, const void *x,
                        const void *w, const void *dy, void *out)
{
    const float one = 1.0f, zero = 0.0f;
    const char *X = x, *W = w, *DY = dy;
    char *OUT = out;
    const int64_t N = p->N, K = p->K;
    if (p->op == FWD) /* Y^T (N x m) = W (T of K x N) . X^T (K x m) */
        CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)rows, (int)K, &one, W + e * N * K * 2,
                                  CUDA_R_16BF, (int)K, X + row0 * K * 2, CUDA_R_16BF, (int)K, &zero,
                                  OUT + row0 * N * 2, CUDA_R_16BF, (int)N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    else if (p->op == DX) /* dX^T (K x m) = W^T (K x N) . dY^T (N x m) */
        CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, (int)K, (int)rows, (int)N, &one, W + e * N * K * 2,
                                  CUDA_R_16BF, (int)K, DY + row0 * N * 2, CUDA_R_16BF, (int)N, &zero,
                                  OUT + row0 * K * 2, CUDA_R_16BF, (int)K, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    else /* dW^T (K x N) = X^T (K x m) . dY (m x N) */
        CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_T, (int)K, (int)N, (int)rows, &one, X + row0 * K * 2,
                                  CUDA_R_16BF, (int)K, DY + row0 * N * 2, CUDA_R_16BF, (int)N, &zero,
                                  OUT + e * N * K * 2, CUDA_R_16BF, (int)K, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

static void run_cublas_loop(void *state)
{
    problem *p = state;
    int64_t row0 = 0;
    for (int64_t e = 0; e < p->E; e++) {
        if (p->m_sizes[e] > 0 || p->op == DW)
            expert_gemm(p, p->ctx->handle, row0, p->m_sizes[e], e, p->x, p->w, p->dy, p->out);
        row0 += p->m_sizes[e];
    }
}

static void run_dense(void *state)
{
    problem *p = state;
    problem dense = *p;
    dense.E = 1;
    if (p->op == DW) /* one GEMM with reduction over all M rows into one N x K */
        expert_gemm(&dense, p->ctx->handle, 0, p->M, 0, p->x, p->w, p->dy, p->out);
    else
        expert_gemm(&dense, p->ctx->handle, 0, p->M, 0, p->x, p->w, p->dy, p->out);
}

static void setup_grouped(problem *p)
{
    const int64_t E = p->E, N = p->N, K = p->K;
    /* host arrays of the per-group arguments; A, B, C (the groups' pointers) live on the device, below */
    const size_t ints = sizeof(int) * (size_t)E, ptrs = sizeof(void *) * (size_t)E;
    p->gm = xmalloc(ints), p->gn = xmalloc(ints), p->gk = xmalloc(ints);
    p->glda = xmalloc(ints), p->gldb = xmalloc(ints), p->gldc = xmalloc(ints), p->gsize = xmalloc(ints);
    p->ta = xmalloc(sizeof(cublasOperation_t) * (size_t)E), p->tb = xmalloc(sizeof(cublasOperation_t) * (size_t)E);
    p->alphas = xmalloc(sizeof(float) * (size_t)E), p->betas = xmalloc(sizeof(float) * (size_t)E);
    const void **hA = xmalloc(ptrs), **hB = xmalloc(ptrs);
    void **hC = xmalloc(ptrs);
    int64_t row0 = 0;
    const char *X = p->x, *W = p->w, *DY = p->dy;
    char *OUT = p->out;
    for (int64_t e = 0; e < E; e++) {
        const int64_t m = p->m_sizes[e];
        p->gsize[e] = 1, p->alphas[e] = 1.0f, p->betas[e] = 0.0f;
        if (p->op == FWD) {
            p->ta[e] = CUBLAS_OP_T, p->tb[e] = CUBLAS_OP_N, p->gm[e] = (int)N, p->gn[e] = (int)m, p->gk[e] = (int)K;
            hA[e] = W + e * N * K * 2, p->glda[e] = (int)K, hB[e] = X + row0 * K * 2, p->gldb[e] = (int)K;
            hC[e] = OUT + row0 * N * 2, p->gldc[e] = (int)N;
        } else if (p->op == DX) {
            p->ta[e] = CUBLAS_OP_N, p->tb[e] = CUBLAS_OP_N, p->gm[e] = (int)K, p->gn[e] = (int)m, p->gk[e] = (int)N;
            hA[e] = W + e * N * K * 2, p->glda[e] = (int)K, hB[e] = DY + row0 * N * 2, p->gldb[e] = (int)N;
            hC[e] = OUT + row0 * K * 2, p->gldc[e] = (int)K;
        } else {
            p->ta[e] = CUBLAS_OP_N, p->tb[e] = CUBLAS_OP_T, p->gm[e] = (int)K, p->gn[e] = (int)N, p->gk[e] = (int)m;
            hA[e] = X + row0 * K * 2, p->glda[e] = (int)K, hB[e] = DY + row0 * N * 2, p->gldb[e] = (int)N;
            hC[e] = OUT + e * N * K * 2, p->gldc[e] = (int)K;
        }
        row0 += m;
    }
    CUDA_CHECK(cudaMalloc((void **)&p->A, ptrs));
    CUDA_CHECK(cudaMalloc((void **)&p->B, ptrs));
    CUDA_CHECK(cudaMalloc((void **)&p->C, ptrs));
    CUDA_CHECK(cudaMemcpy(p->A, hA, ptrs, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(p->B, hB, ptrs, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(p->C, hC, ptrs, cudaMemcpyHostToDevice));
    free(hA), free(hB), free(hC);
}

static void run_cublas_grouped(void *state)
{
    problem *p = state;
    CUBLAS_CHECK(cublasGemmGroupedBatchedEx(p->ctx->handle, p->ta, p->tb, p->gm, p->gn, p->gk, p->alphas,
                                            (const void *const *)p->A, CUDA_R_16BF, p->glda,
                                            (const void *const *)p->B, CUDA_R_16BF, p->gldb, p->betas,
                                            (void *const *)p->C, CUDA_R_16BF, p->gldc, (int)p->E, p->gsize,
                                            CUBLAS_COMPUTE_32F));
}

static void free_grouped(problem *p)
{
    CUDA_CHECK(cudaFree(p->A)); CUDA_CHECK(cudaFree(p->B)); CUDA_CHECK(cudaFree(p->C));
    free(p->gm), free(p->gn), free(p->gk), free(p->glda), free(p->gldb), free(p->gldc), free(p->gsize);
    free(p->ta), free(p->tb), free(p->alphas), free(p->betas);
}

/* Random data of dtype (never zeros): one 8 Mi-element random block per dtype, repeated over the tensor (the
 * largest weights, 15 GB for DeepSeek-V3 in bf16, would take minutes to draw element by element). */
static void fill_device(oracle_rng *rng, void *dev, int64_t count, moe_dtype dtype)
{
    const int64_t chunk = 1 << 23;
    static unsigned char *block[3] = {NULL, NULL, NULL}; /* by moe_dtype */
    const size_t es = moe_dtype_size(dtype);
    if (block[dtype] == NULL) {
        block[dtype] = malloc((size_t)(chunk + 4096) * es);
        REQUIRE(block[dtype] != NULL, "out of memory");
        oracle_fill(rng, dtype, block[dtype], chunk + 4096, 0);
    }
    for (int64_t first = 0; first < count; first += chunk) {
        int64_t n = count - first < chunk ? count - first : chunk;
        /* shift each repeat so that rows of different experts do not see the same values */
        CUDA_CHECK(cudaMemcpy((char *)dev + first * es, block[dtype] + (first / chunk * 7919) % 4096 * es,
                              (size_t)n * es, cudaMemcpyHostToDevice));
    }
}

/* Random finite FP8 codes (NaN codes replaced by finite ones; e5m2's Inf too), as fill_device repeats a block. */
static void fill_codes_device(oracle_rng *rng, void *dev, int64_t count, moe_dtype dtype)
{
    const int64_t chunk = 1 << 23;
    static unsigned char *block = NULL;
    if (block == NULL) {
        block = malloc((size_t)chunk + 4096);
        REQUIRE(block != NULL, "out of memory");
        for (int64_t i = 0; i < chunk + 4096; i++) {
            unsigned char b = (unsigned char)oracle_rng_below(rng, 256);
            const int special = dtype == MOE_E4M3 ? (b & 0x7f) == 0x7f : (b & 0x7c) == 0x7c;
            block[i] = special ? (unsigned char)(b & 0xbf) : b;
        }
    }
    for (int64_t first = 0; first < count; first += chunk) {
        int64_t n = count - first < chunk ? count - first : chunk;
        CUDA_CHECK(cudaMemcpy((char *)dev + first, block + (first / chunk * 7919) % 4096, (size_t)n,
                              cudaMemcpyHostToDevice));
    }
}

/* A device array of count float32 ones (the FP8 scales). */
static void *device_ones(int64_t count)
{
    float *host = xmalloc((size_t)count * sizeof *host + 4);
    for (int64_t i = 0; i < count; i++)
        host[i] = 1.0f;
    void *dev;
    CUDA_CHECK(cudaMalloc(&dev, (size_t)count * sizeof *host + 4));
    CUDA_CHECK(cudaMemcpy(dev, host, (size_t)count * sizeof *host, cudaMemcpyHostToDevice));
    free(host);
    return dev;
}

/* Whether all count elements of dtype at dev (libmoe's output) are finite, checked on the device: the
 * 4096-element sample of sample_difference would usually miss one unwritten (NaN-poisoned) tile, and
 * copying a whole output to the host (15 GB for DeepSeek-V3's dW in bf16) would take longer than the
 * timing.  The dot product of the output with itself (fp32 accumulation) is NaN or Inf as soon as one
 * element is: squares are never negative, so an Inf cannot cancel.  It is also Inf if the squares overflow
 * fp32: one square beyond |x| ~ 1.8e19, or a chunk of 2^30 squares beyond an RMS of ~5.6e14; such an
 * output is reported as non-finite too, rightly: here outputs are sums of products of random values in
 * [-1, 1], so |x| is at most the reduction length (~1e5).  cuBLAS's n is an int (the DeepSeek-V3 dW
 * output has 7.5e9 elements), hence chunks of at most 2^30 elements.  The result lands in host memory (the
 * default pointer mode), so each call returns once its dot product is done.  f16, whose dot products would
 * overflow at 65504, is copied to the host in chunks and its exponent fields read there instead. */
static int output_finite(cublasHandle_t handle, const void *dev, int64_t count, moe_dtype dtype)
{
    if (dtype == MOE_F16) {
        const int64_t chunk = (int64_t)1 << 26;
        uint16_t *host = malloc((size_t)chunk * 2);
        REQUIRE(host != NULL, "out of memory");
        int finite = 1;
        for (int64_t first = 0; first < count && finite; first += chunk) {
            const int64_t n = count - first < chunk ? count - first : chunk;
            CUDA_CHECK(cudaMemcpy(host, (const uint16_t *)dev + first, (size_t)n * 2, cudaMemcpyDeviceToHost));
            for (int64_t i = 0; i < n; i++)
                finite &= (host[i] & 0x7C00u) != 0x7C00u; /* exponent all ones: Inf or NaN */
        }
        free(host);
        return finite;
    }
    const int64_t chunk = (int64_t)1 << 30;
    const int f32 = dtype == MOE_F32;
    const cudaDataType type = f32 ? CUDA_R_32F : CUDA_R_16BF; /* bf16: the result is bf16 too (cuBLAS's rule) */
    const size_t es = f32 ? 4 : 2;
    for (int64_t first = 0; first < count; first += chunk) {
        const int n = (int)(count - first < chunk ? count - first : chunk);
        const void *x = (const char *)dev + (size_t)first * es;
        float dot;
        if (f32) {
            CUBLAS_CHECK(cublasDotEx(handle, n, x, type, 1, x, type, 1, &dot, CUDA_R_32F, CUDA_R_32F));
        } else {
            uint16_t bits;
            CUBLAS_CHECK(cublasDotEx(handle, n, x, type, 1, x, type, 1, &bits, CUDA_R_16BF, CUDA_R_32F));
            dot = moe_bf16_to_f32(bits);
        }
        if (!isfinite(dot))
            return 0;
    }
    return 1;
}

/* Worst relative difference between libmoe's bf16 output a and cuBLAS's b on 4096 sampled elements (a's
 * finiteness is output_finite's job; a NaN difference, from a non-finite b, is not counted). */
static double sample_difference(const void *a, const void *b, int64_t count, oracle_rng *rng)
{
    double worst = 0;
    for (int s = 0; s < 4096 && count > 0; s++) {
        int64_t i = (int64_t)oracle_rng_below(rng, (uint64_t)count);
        uint16_t va, vb;
        CUDA_CHECK(cudaMemcpy(&va, (const char *)a + i * 2, 2, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(&vb, (const char *)b + i * 2, 2, cudaMemcpyDeviceToHost));
        double x = moe_bf16_to_f32(va), y = moe_bf16_to_f32(vb);
        double d = fabs(x - y) / (fabs(y) + 1e-3);
        if (d > worst)
            worst = d;
    }
    return worst;
}

int main(int argc, char **argv)
{
    int64_t T = 4096;
    int repeat = 20;
    uint64_t seed = 20261122;
    const char *which = "all", *ops = "fwd,dx,dw", *csv_path = NULL;
    int libmoe_only = 0;
    const char *autotune_path = NULL, *tuned_path = NULL;
    int sync_each = 0, topk_weights = 0, w_transposed = 0, codes_transposed = 0;
    const char *dtype_name = "bf16";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokens") && i + 1 < argc) T = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--repeat") && i + 1 < argc) repeat = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--shapes") && i + 1 < argc) which = argv[++i];
        else if (!strcmp(argv[i], "--ops") && i + 1 < argc) ops = argv[++i];
        else if (!strcmp(argv[i], "--csv") && i + 1 < argc) csv_path = argv[++i];
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--libmoe-only")) libmoe_only = 1;
        else if (!strcmp(argv[i], "--autotune") && i + 1 < argc) autotune_path = argv[++i];
        else if (!strcmp(argv[i], "--tuned") && i + 1 < argc) tuned_path = argv[++i];
        else if (!strcmp(argv[i], "--sync-each")) sync_each = 1;
        else if (!strcmp(argv[i], "--topk-weights")) topk_weights = 1;
        else if (!strcmp(argv[i], "--w-transposed")) w_transposed = 1;
        else if (!strcmp(argv[i], "--codes-transposed")) codes_transposed = 1;
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) dtype_name = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--tokens T] [--repeat R] [--shapes all|qwen3|mixtral|deepseek] "
                            "[--ops fwd,dx,dw] [--csv FILE] [--seed S] [--libmoe-only] "
                            "[--autotune FILE | --tuned FILE] [--sync-each] [--topk-weights] "
                            "[--dtype bf16|f16|f32|tf32|e4m3|e5m2] [--w-transposed] [--codes-transposed]\n",
                    argv[0]);
            return 2;
        }
    }
    const int allow_tf32 = strcmp(dtype_name, "tf32") == 0;
    moe_dtype dtype = MOE_F32;
    if (!allow_tf32 && moe_dtype_from_name(dtype_name, &dtype) != MOE_OK) {
        fprintf(stderr, "moe-bench: --dtype is bf16, f16, f32, tf32 (f32 with allow_tf32), e4m3 or e5m2, got '%s'\n",
                dtype_name);
        return 2;
    }
    const int fp8 = dtype == MOE_E4M3 || dtype == MOE_E5M2;
    if ((w_transposed || codes_transposed) && !fp8) {
        fprintf(stderr, "moe-bench: --%s is an FP8 form (--dtype e4m3 or e5m2)\n",
                w_transposed ? "w-transposed" : "codes-transposed");
        return 2;
    }
    if (fp8 && (topk_weights || autotune_path != NULL)) {
        fprintf(stderr, "moe-bench: --dtype %s runs without --topk-weights and --autotune\n", dtype_name);
        return 2;
    }
    if (dtype != MOE_BF16 && !libmoe_only) {
        fprintf(stderr, "moe-bench: --dtype %s times libmoe alone: add --libmoe-only\n", dtype_name);
        return 2;
    }
    const size_t es = moe_dtype_size(dtype);
    const moe_dtype out_dtype = fp8 ? MOE_BF16 : dtype; /* of the outputs */
    const size_t out_es = moe_dtype_size(out_dtype);
    printf("seed %llu\n", (unsigned long long)seed);
    if (!moe_backend_available(MOE_BACKEND_CUDA)) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    if (tuned_path != NULL)
        REQUIRE(moe_gemm_autotune_load(tuned_path) == MOE_OK, "%s", moe_last_error());
    struct cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs; T = %lld, %s, median of %d runs (%s)\n", prop.name, prop.multiProcessorCount,
           (long long)T, allow_tf32 ? "f32 with allow_tf32" : dtype_name, repeat,
           sync_each ? "host waits for each call" : "L2 flushed before each call, no host waits");
    if (topk_weights)
        printf("libmoe with fused topk weights (random, of the dtype); cuBLAS without them, its output not compared\n");
    bench_ctx ctx = {0};
    REQUIRE(repeat >= 1, "--repeat %d: expected >= 1", repeat);
    ctx.repeat = repeat;
    ctx.sync_each = sync_each;
    CUBLAS_CHECK(cublasCreate(&ctx.handle));
    ctx.starts = malloc(sizeof(cudaEvent_t) * (size_t)repeat);
    ctx.stops = malloc(sizeof(cudaEvent_t) * (size_t)repeat);
    REQUIRE(ctx.starts != NULL && ctx.stops != NULL, "out of memory");
    for (int i = 0; i < repeat; i++) {
        CUDA_CHECK(cudaEventCreate(&ctx.starts[i]));
        CUDA_CHECK(cudaEventCreate(&ctx.stops[i]));
    }
    CUDA_CHECK(cudaMalloc(&ctx.flush, FLUSH_BYTES));
    FILE *csv = csv_path ? fopen(csv_path, "w") : NULL;
    if (csv)
        fprintf(csv, "model,gemm,op,M,N,K,libmoe_tflops,cublas_loop_tflops,cublas_grouped_tflops,dense_tflops\n");
    printf("%-14s %-8s %-4s %6s %6s %6s | %8s %8s %8s %8s | %6s %6s\n", "model", "gemm", "op", "M", "N", "K",
           "libmoe", "cub-loop", "cub-grp", "dense", "/best", "/dense");
    oracle_rng rng = {seed};
    /* a failed check marks its row and the table goes on (every row printed); the exit status tells at the end */
    int rows = 0, failed_rows = 0, nonfinite_rows = 0, mismatch_rows = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const shape *sh = &shapes[s];
        if (strcmp(which, "all") && strncmp(sh->model, which, strlen(which)))
            continue;
        const int64_t E = sh->E, k = sh->k, N = sh->N, K = sh->K, M = T * k;
        int64_t *ids = xmalloc((size_t)M * 8), *m_sizes = xmalloc((size_t)E * 8), *gather = xmalloc((size_t)M * 8);
        oracle_topk_ids(&rng, T, k, E, ids); /* k distinct experts per token, uniformly at random */
        REQUIRE(moe_routing_from_topk(T, k, E, ids, m_sizes, gather, NULL) == MOE_OK, "%s", moe_last_error());
        problem p = {0};
        p.ctx = &ctx, p.E = E, p.M = M, p.N = N, p.K = K, p.m_sizes = m_sizes;
        int64_t *dev_sizes, *dev_gather;
        CUDA_CHECK(cudaMalloc((void **)&dev_sizes, (size_t)E * 8));
        CUDA_CHECK(cudaMalloc((void **)&dev_gather, (size_t)M * 8));
        CUDA_CHECK(cudaMemcpy(dev_sizes, m_sizes, (size_t)E * 8, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(dev_gather, gather, (size_t)M * 8, cudaMemcpyHostToDevice));
        p.dev_routing = (moe_routing){T, k, E, dev_sizes, dev_gather};
        const int64_t out_elems = E * N * K > M * (N > K ? N : K) ? E * N * K : M * (N > K ? N : K);
        p.dtype = dtype, p.allow_tf32 = allow_tf32, p.fp8 = fp8, p.w_transposed = w_transposed;
        p.codes_transposed = codes_transposed;
        CUDA_CHECK(cudaMalloc(&p.x, (size_t)(M * K) * es));
        CUDA_CHECK(cudaMalloc(&p.w, (size_t)(E * N * K) * es));
        CUDA_CHECK(cudaMalloc(&p.dy, (size_t)(M * N) * es));
        CUDA_CHECK(cudaMalloc(&p.out, (size_t)out_elems * out_es));
        if (topk_weights) {
            CUDA_CHECK(cudaMalloc(&p.topk_w, (size_t)M * es));
            fill_device(&rng, p.topk_w, M, dtype);
        }
        void *check;
        CUDA_CHECK(cudaMalloc(&check, (size_t)out_elems * out_es));
        if (fp8) {
            const int64_t tiles_n = (N + MOE_FP8_TILE - 1) / MOE_FP8_TILE, tiles_k = (K + MOE_FP8_TILE - 1) / MOE_FP8_TILE;
            fill_codes_device(&rng, p.x, M * K, dtype);
            fill_codes_device(&rng, p.w, E * N * K, dtype);
            fill_codes_device(&rng, p.dy, M * N, dtype);
            p.x_scales = device_ones(M * tiles_k), p.w_scales = device_ones(E * tiles_n * tiles_k);
            p.dy_scales = device_ones(M * tiles_n);
            const int64_t column_rows = moe_fp8_column_scale_rows(M, E);
            p.x_column_scales = device_ones(column_rows * K), p.dy_column_scales = device_ones(column_rows * N);
        } else {
            fill_device(&rng, p.x, M * K, dtype);
            fill_device(&rng, p.w, E * N * K, dtype);
            fill_device(&rng, p.dy, M * N, dtype);
        }
        for (int op = FWD; op <= DW; op++) {
            if (!strstr(ops, op_names[op]))
                continue;
            p.op = op;
            const int64_t count = op == FWD ? M * N : op == DX ? M * K : E * N * K;
            CUDA_CHECK(cudaMemset(p.out, 0xff, (size_t)count * out_es)); /* NaN poison */
            const double flops = 2.0 * (double)M * (double)N * (double)K;
            if (autotune_path != NULL)
                moe_gemm_autotune_clear(); /* the heuristic's choice, not an entry of an earlier row (reloaded below) */
            float t_moe = time_median(&ctx, run_libmoe, &p);
            if (autotune_path != NULL) {
                moe_gemm_options o = {0};
                o.dtype = dtype;
                o.allow_tf32 = allow_tf32;
                const void *a = op == DX ? p.dy : p.x, *b = op == DW ? p.dy : p.w;
                moe_gemm_tuning chosen;
                REQUIRE(moe_gemm_autotune((moe_gemm_op)op, &p.dev_routing, N, K, a, b, p.topk_w, p.out, &o, repeat,
                                          autotune_path, &chosen) == MOE_OK, "%s", moe_last_error());
                /* the heuristic and the tuned choice again, alternated, in the machine state the autotune's runs
                 * left (timed only before it, the heuristic ran in another: up to 10% apart on an H200) */
                const float t_before = t_moe;
                float t_heuristic[2], t_tuned[2];
                for (int round = 0; round < 2; round++) {
                    moe_gemm_autotune_clear();
                    t_heuristic[round] = time_median(&ctx, run_libmoe, &p);
                    REQUIRE(moe_gemm_autotune_load(autotune_path) == MOE_OK, "%s", moe_last_error());
                    t_tuned[round] = time_median(&ctx, run_libmoe, &p);
                }
                t_moe = t_tuned[1];
                printf("  autotune %s %s %s: %d candidates, chosen %s rows %d cluster %d tma_store %d dw_pingpong %d; "
                       "heuristic %.1f before, then alternated: heuristic %.1f, %.1f / tuned %.1f, %.1f TFLOP/s\n",
                       sh->model, sh->gemm, op_names[op], chosen.candidates, chosen.kernel, chosen.tile_rows,
                       chosen.cluster, chosen.tma_store, chosen.dw_pingpong, flops / t_before / 1e9,
                       flops / t_heuristic[0] / 1e9, flops / t_heuristic[1] / 1e9, flops / t_tuned[0] / 1e9,
                       flops / t_tuned[1] / 1e9);
            }
            CUDA_CHECK(cudaMemcpy(check, p.out, (size_t)count * out_es, cudaMemcpyDeviceToDevice));
            REQUIRE(moe_backend_synchronize(MOE_BACKEND_CUDA, NULL) == MOE_OK, "%s", moe_last_error());
            /* on check, libmoe's output as its last timed run left it: the cuBLAS runs below overwrite p.out */
            const int finite = output_finite(ctx.handle, check, count, out_dtype);
            double diff = 0, tf_loop = 0, tf_group = 0, tf_dense = 0;
            if (!libmoe_only) {
                float t_loop = time_median(&ctx, run_cublas_loop, &p);
                if (!topk_weights) /* p.out: cublas-loop's output (the grouped and dense runs come after) */
                    diff = sample_difference(check, p.out, count, &rng);
                setup_grouped(&p);
                float t_group = time_median(&ctx, run_cublas_grouped, &p);
                free_grouped(&p);
                float t_dense = time_median(&ctx, run_dense, &p);
                tf_loop = flops / t_loop / 1e9, tf_group = flops / t_group / 1e9, tf_dense = flops / t_dense / 1e9;
            }
            const double tf_moe = flops / t_moe / 1e9;
            const double best = tf_loop > tf_group ? tf_loop : tf_group;
            const int mismatch = diff > 0.05;
            printf("%-14s %-8s %-4s %6lld %6lld %6lld | %8.1f %8.1f %8.1f %8.1f | %6.2f %6.2f%s%s\n", sh->model,
                   sh->gemm, op_names[op], (long long)M, (long long)N, (long long)K, tf_moe, tf_loop, tf_group,
                   tf_dense, best > 0 ? tf_moe / best : 0.0, tf_dense > 0 ? tf_moe / tf_dense : 0.0,
                   !finite ? "  NONFINITE OUTPUT" : "", mismatch ? "  MISMATCH vs cuBLAS" : "");
            fflush(stdout);
            rows++;
            nonfinite_rows += !finite, mismatch_rows += mismatch, failed_rows += !finite || mismatch;
            if (csv)
                fprintf(csv, "%s,%s,%s,%lld,%lld,%lld,%.1f,%.1f,%.1f,%.1f\n", sh->model, sh->gemm, op_names[op],
                        (long long)M, (long long)N, (long long)K, tf_moe, tf_loop, tf_group, tf_dense);
        }
        CUDA_CHECK(cudaFree(p.x)); CUDA_CHECK(cudaFree(p.w)); CUDA_CHECK(cudaFree(p.dy)); CUDA_CHECK(cudaFree(p.out));
        CUDA_CHECK(cudaFree(check)); CUDA_CHECK(cudaFree(dev_sizes)); CUDA_CHECK(cudaFree(dev_gather));
        CUDA_CHECK(cudaFree(p.topk_w)); /* NULL without --topk-weights */
        CUDA_CHECK(cudaFree(p.x_scales)); CUDA_CHECK(cudaFree(p.w_scales)); CUDA_CHECK(cudaFree(p.dy_scales));
        CUDA_CHECK(cudaFree(p.x_column_scales)); CUDA_CHECK(cudaFree(p.dy_column_scales));
        free(ids), free(m_sizes), free(gather);
    }
    if (csv)
        fclose(csv);
    for (int i = 0; i < repeat; i++) {
        CUDA_CHECK(cudaEventDestroy(ctx.starts[i]));
        CUDA_CHECK(cudaEventDestroy(ctx.stops[i]));
    }
    free(ctx.starts), free(ctx.stops);
    CUDA_CHECK(cudaFree(ctx.flush));
    cublasDestroy(ctx.handle);
    if (failed_rows > 0) {
        fprintf(stderr, "moe-bench: FAIL: %d of %d rows: %d with a non-finite libmoe output (NaN or Inf, or squares "
                        "beyond fp32's range), %d with a mismatch vs cuBLAS (sampled relative difference > 0.05)\n",
                failed_rows, rows, nonfinite_rows, mismatch_rows);
        return 1;
    }
    return 0;
}
