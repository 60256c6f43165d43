/* Times the CUDA blockwise MoE MLP (MOE_BACKEND_CUDA), forward and backward, on one MoE layer (default:
 * Qwen3-30B-A3B, T = 4096 tokens, E = 128 experts, k = 8, H = 2048, I = 768, bf16, B = 128, dropless
 * layout from uniformly random distinct top-k routing, SiLU, affinity on H, no bias; data uniform in
 * [-1, 1) from oracle/oracle.c, repeating every 2^24 elements).  Each direction is
 * timed with CUDA events around single calls: `warmup` untimed calls, then `repeats` timed ones; the
 * median is reported with TFLOP/s from the routed pairs (forward 6*T*k*I*H, backward 12*T*k*I*H FLOPs;
 * padding positions are not counted).  The default memory pool keeps freed memory (release threshold
 * raised) so that the per-call workspace of cudaMallocAsync is not re-mapped every call.  Also checks
 * that every call reports no error and that two backward runs are bitwise equal (d_hidden, d_w_gu).
 *
 * With the rounded intermediates (16-bit dtypes) the forward is timed a second time with MOE_MLP_FUSE_GATE=0 (the
 * gate/up GEMM and its activation as two kernels, and the down GEMM on the 128 x 256 kernel; on sm_90a the
 * first two are one by default where the experts are long enough, and at any size with MOE_MLP_FUSE_GATE=1
 * in the environment, and the down GEMM of a short I runs on the ping-pong rows kernel), and its outputs and
 * checkpoints are compared bit for bit with the default forward's.
 *
 * The 9th argument: 1 (the default for f16/bf16) the rounded intermediates, every GEMM on tensor cores;
 * 0 options.float32_intermediates: bf16 on split operands on the rows path, f16 and f32 on the tile path.
 * The 10th and 11th set the activation (default silu) and where the affinity is applied (h, the default,
 * or i): the kernels are compiled per activation, and the affinity on I takes the general form of the gate
 * kernels.
 *
 * In the same run (16-bit dtypes), the comparison: the GEMMs of an unfused composition alone, as
 * cuBLAS grouped calls (cublasGemmGroupedBatchedEx, one group per expert, over the routed rows sorted
 * by expert): forward = gate/up + down, backward = dM + dX + d_w_d + d_w_gu.  No gathers, activation,
 * checkpoints or token sums are timed for it, so its time is a lower bound of any such composition.
 * Then the ceilings: the same six GEMMs as dense cublasGemmEx calls over all T*k rows (no grouping: the
 * compute a perfect grouped GEMM could approach), and the device-to-device copy rate of cudaMemcpyAsync (the
 * rate the memory-bound steps could approach); bench/RESULTS.md and README.md turn them into floors.
 *
 * usage: mlp-gpu-time [T E k H I B dtype repeats round_intermediates(0|1) activation(silu|gelu|gelu_tanh|swish)
 *                     affinity_on(h|i)]
 * dtype: f32, f16, bf16 or an alias that moe_dtype_from_name takes (fp32, bfloat16, ...). */
#include "moe.h"
#include "moe_mlp.h"
#include "oracle.h"
#include "alloc.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CUDA_TRY(call)                                                                               \
    do {                                                                                             \
        cudaError_t err_ = (call);                                                                   \
        if (err_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(err_));                            \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)
#define TRY(call)                                                                                    \
    do {                                                                                             \
        moe_status st_ = (call);                                                                     \
        if (st_ != MOE_OK) {                                                                         \
            fprintf(stderr, "%s: %s (%s)\n", #call, moe_strerror(st_), moe_last_error());            \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

static oracle_rng rng = {20261122};

/* Random device data repeats with this period (elements): drawing every element on the host took over a
 * minute per call for gpt-oss-120b's 3.2 G weights; the kernels' traffic and arithmetic do not depend on the
 * values' period. */
#define RANDOM_PERIOD ((int64_t)1 << 24)

/* A device buffer of n elements of dtype: uniform in [-1, 1) (random != 0; the first RANDOM_PERIOD drawn,
 * then copied along the buffer) or zero. */
static void *device_array(moe_dtype dt, int64_t n, int random)
{
    const size_t es = moe_dtype_size(dt), bytes = (size_t)n * es;
    void *dev = NULL;
    CUDA_TRY(cudaMalloc(&dev, bytes ? bytes : 16));
    if (random) {
        const int64_t drawn = n < RANDOM_PERIOD ? n : RANDOM_PERIOD;
        void *host = xmalloc((size_t)drawn * es);
        oracle_fill(&rng, dt, host, drawn, 0);
        CUDA_TRY(cudaMemcpy(dev, host, (size_t)drawn * es, cudaMemcpyHostToDevice));
        free(host);
        for (int64_t filled = drawn; filled < n;) { /* doubling copies of what is there */
            const int64_t chunk = filled < n - filled ? filled : n - filled;
            CUDA_TRY(cudaMemcpy((char *)dev + (size_t)filled * es, dev, (size_t)chunk * es, cudaMemcpyDeviceToDevice));
            filled += chunk;
        }
    } else {
        CUDA_TRY(cudaMemset(dev, 0, bytes));
    }
    return dev;
}

static int cmp_float(const void *a, const void *b);

#define CUBLAS_TRY(call)                                                                             \
    do {                                                                                             \
        cublasStatus_t st_ = (call);                                                                 \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                                          \
            fprintf(stderr, "%s: cuBLAS status %d\n", #call, (int)st_);                              \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

/* One cublasGemmGroupedBatchedEx call of E groups (one per expert), column-major: expert e computes
 * C_e (m x n) = op(A_e) (m x k) . op(B_e) (k x n).  Sizes are host arrays; the arrays of operand
 * pointers live on the device (dA, dB, dC, copied by grouped_upload). */
typedef struct grouped_gemm {
    int count;
    cublasOperation_t *ta, *tb;
    int *m, *n, *k, *lda, *ldb, *ldc, *group_size;
    float *alpha, *beta;
    const void **A, **B;
    void **C;
    const void **dA, **dB;
    void **dC;
} grouped_gemm;

static grouped_gemm grouped_new(int count)
{
    grouped_gemm g;
    g.count = count;
    g.ta = xmalloc(sizeof(cublasOperation_t) * (size_t)count), g.tb = xmalloc(sizeof(cublasOperation_t) * (size_t)count);
    g.m = xmalloc(sizeof(int) * (size_t)count), g.n = xmalloc(sizeof(int) * (size_t)count);
    g.k = xmalloc(sizeof(int) * (size_t)count), g.lda = xmalloc(sizeof(int) * (size_t)count);
    g.ldb = xmalloc(sizeof(int) * (size_t)count), g.ldc = xmalloc(sizeof(int) * (size_t)count);
    g.group_size = xmalloc(sizeof(int) * (size_t)count);
    g.alpha = xmalloc(sizeof(float) * (size_t)count), g.beta = xmalloc(sizeof(float) * (size_t)count);
    g.A = xmalloc(sizeof(void *) * (size_t)count), g.B = xmalloc(sizeof(void *) * (size_t)count);
    g.C = xmalloc(sizeof(void *) * (size_t)count);
    return g;
}

static void grouped_free(grouped_gemm *g)
{
    free(g->ta), free(g->tb), free(g->m), free(g->n), free(g->k), free(g->lda), free(g->ldb), free(g->ldc);
    free(g->group_size), free(g->alpha), free(g->beta), free((void *)g->A), free((void *)g->B), free(g->C);
    CUDA_TRY(cudaFree((void *)g->dA));
    CUDA_TRY(cudaFree((void *)g->dB));
    CUDA_TRY(cudaFree(g->dC));
}

static void grouped_upload(grouped_gemm *g)
{
    const size_t bytes = sizeof(void *) * (size_t)g->count;
    CUDA_TRY(cudaMalloc((void **)&g->dA, bytes));
    CUDA_TRY(cudaMalloc((void **)&g->dB, bytes));
    CUDA_TRY(cudaMalloc((void **)&g->dC, bytes));
    CUDA_TRY(cudaMemcpy((void *)g->dA, g->A, bytes, cudaMemcpyHostToDevice));
    CUDA_TRY(cudaMemcpy((void *)g->dB, g->B, bytes, cudaMemcpyHostToDevice));
    CUDA_TRY(cudaMemcpy(g->dC, g->C, bytes, cudaMemcpyHostToDevice));
}

static void grouped_set(grouped_gemm *g, int e, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n,
                        int64_t k, const void *A, int64_t lda, const void *B, int64_t ldb, void *C, int64_t ldc)
{
    g->ta[e] = ta, g->tb[e] = tb, g->m[e] = (int)m, g->n[e] = (int)n, g->k[e] = (int)k;
    g->A[e] = A, g->lda[e] = (int)lda, g->B[e] = B, g->ldb[e] = (int)ldb, g->C[e] = C, g->ldc[e] = (int)ldc;
    g->group_size[e] = 1, g->alpha[e] = 1.0f, g->beta[e] = 0.0f;
}

static void grouped_run(cublasHandle_t handle, const grouped_gemm *g, cudaDataType type)
{
    CUBLAS_TRY(cublasGemmGroupedBatchedEx(handle, g->ta, g->tb, g->m, g->n, g->k, g->alpha, g->dA, type, g->lda,
                                          g->dB, type, g->ldb, g->beta, g->dC, type, g->ldc, g->count,
                                          g->group_size, CUBLAS_COMPUTE_32F));
}

/* The same product as one dense cublasGemmEx: g's first group (time_cublas with dense: one group of all the rows). */
static void dense_run(cublasHandle_t handle, const grouped_gemm *g, cudaDataType type)
{
    CUBLAS_TRY(cublasGemmEx(handle, g->ta[0], g->tb[0], g->m[0], g->n[0], g->k[0], g->alpha, g->A[0], type, g->lda[0],
                            g->B[0], type, g->ldb[0], g->beta, g->C[0], type, g->ldc[0], CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
}

/* The grouped calls of one direction, in order: calls[0 .. count-1], all on the default stream; with dense,
 * each as one cublasGemmEx of its first group. */
typedef struct grouped_calls {
    cublasHandle_t handle;
    const grouped_gemm *calls;
    int count;
    cudaDataType type;
    int dense;
} grouped_calls;

static void run_grouped_calls(const void *context)
{
    const grouped_calls *c = context;
    for (int q = 0; q < c->count; q++)
        (c->dense ? dense_run : grouped_run)(c->handle, &c->calls[q], c->type);
}

/* Milliseconds between the events start and stop recorded on the default stream around work(context),
 * after waiting for stop. */
static float timed_ms(cudaEvent_t start, cudaEvent_t stop, void (*work)(const void *context), const void *context)
{
    float ms = 0;
    CUDA_TRY(cudaEventRecord(start, NULL));
    work(context);
    CUDA_TRY(cudaEventRecord(stop, NULL));
    CUDA_TRY(cudaEventSynchronize(stop));
    CUDA_TRY(cudaEventElapsedTime(&ms, start, stop));
    return ms;
}

/* The cuBLAS comparison (see the top comment): median forward and backward milliseconds.  With dense, the
 * compute ceiling instead: the same six products, each as one dense cublasGemmEx over all M rows (expert 0's
 * weights; E is taken as 1 once the rows are counted). */
static void time_cublas(moe_dtype dt, int64_t E, int64_t H, int64_t I, const int64_t *m_sizes, int dense, int repeats,
                        double *ms_fwd, double *ms_bwd)
{
    int64_t M = 0;
    for (int64_t e = 0; e < E; e++)
        M += m_sizes[e];
    if (dense)
        E = 1;
    const size_t es = moe_dtype_size(dt);
    const char *X = device_array(dt, M * H, 1), *S = device_array(dt, M * H, 1);
    const char *Mi = device_array(dt, M * I, 1), *dGU = device_array(dt, M * 2 * I, 1);
    const char *Wgu = device_array(dt, E * H * 2 * I, 1), *Wd = device_array(dt, E * I * H, 1);
    char *GU = device_array(dt, M * 2 * I, 0), *D = device_array(dt, M * H, 0), *dM = device_array(dt, M * I, 0);
    char *dX = device_array(dt, M * H, 0), *dWd = device_array(dt, E * I * H, 0);
    char *dWgu = device_array(dt, E * H * 2 * I, 0);
    grouped_gemm fwd[2] = {grouped_new((int)E), grouped_new((int)E)};
    grouped_gemm bwd[4] = {grouped_new((int)E), grouped_new((int)E), grouped_new((int)E), grouped_new((int)E)};
    const cublasOperation_t N_ = CUBLAS_OP_N, T_ = CUBLAS_OP_T;
    int64_t r0 = 0;
    for (int64_t e = 0; e < E; e++) {
        const int64_t m = dense ? M : m_sizes[e];
        const size_t wgu = (size_t)(e * H * 2 * I) * es, wd = (size_t)(e * I * H) * es;
        /* row-major P [r][c] is column-major P^T (c x r, ld c) */
        grouped_set(&fwd[0], (int)e, N_, N_, 2 * I, m, H, Wgu + wgu, 2 * I, X + r0 * H * es, H, GU + r0 * 2 * I * es, 2 * I);
        grouped_set(&fwd[1], (int)e, N_, N_, H, m, I, Wd + wd, H, Mi + r0 * I * es, I, D + r0 * H * es, H);
        grouped_set(&bwd[0], (int)e, T_, N_, I, m, H, Wd + wd, H, S + r0 * H * es, H, dM + r0 * I * es, I);
        grouped_set(&bwd[1], (int)e, T_, N_, H, m, 2 * I, Wgu + wgu, 2 * I, dGU + r0 * 2 * I * es, 2 * I,
                    dX + r0 * H * es, H);
        grouped_set(&bwd[2], (int)e, N_, T_, H, I, m, S + r0 * H * es, H, Mi + r0 * I * es, I, dWd + wd, H);
        grouped_set(&bwd[3], (int)e, N_, T_, 2 * I, H, m, dGU + r0 * 2 * I * es, 2 * I, X + r0 * H * es, H,
                    dWgu + wgu, 2 * I);
        r0 += m;
    }
    for (int q = 0; q < 2; q++)
        grouped_upload(&fwd[q]);
    for (int q = 0; q < 4; q++)
        grouped_upload(&bwd[q]);
    cublasHandle_t handle;
    CUBLAS_TRY(cublasCreate(&handle));
    const cudaDataType type = dt == MOE_F16 ? CUDA_R_16F : CUDA_R_16BF;
    cudaEvent_t start, stop;
    CUDA_TRY(cudaEventCreate(&start));
    CUDA_TRY(cudaEventCreate(&stop));
    float *tf = xmalloc(sizeof(float) * (size_t)repeats), *tb = xmalloc(sizeof(float) * (size_t)repeats);
    const grouped_calls fwd_calls = {handle, fwd, 2, type, dense}, bwd_calls = {handle, bwd, 4, type, dense};
    for (int r = -2; r < repeats; r++) {
        const float ms_f = timed_ms(start, stop, run_grouped_calls, &fwd_calls);
        if (r >= 0)
            tf[r] = ms_f;
        const float ms_b = timed_ms(start, stop, run_grouped_calls, &bwd_calls);
        if (r >= 0)
            tb[r] = ms_b;
    }
    qsort(tf, (size_t)repeats, sizeof(float), cmp_float);
    qsort(tb, (size_t)repeats, sizeof(float), cmp_float);
    *ms_fwd = tf[repeats / 2], *ms_bwd = tb[repeats / 2];
    free(tf), free(tb);
    for (int q = 0; q < 2; q++)
        grouped_free(&fwd[q]);
    for (int q = 0; q < 4; q++)
        grouped_free(&bwd[q]);
    CUBLAS_TRY(cublasDestroy(handle));
    const void *bufs[] = {X, S, Mi, dGU, Wgu, Wd, GU, D, dM, dX, dWd, dWgu};
    for (size_t q = 0; q < sizeof bufs / sizeof bufs[0]; q++)
        CUDA_TRY(cudaFree((void *)bufs[q]));
}

/* Device-to-device copy rate in TB/s (bytes read plus bytes written over the median time of `repeats`
 * cudaMemcpyAsync calls of a 1 GiB buffer, after two untimed ones): the memory-bound steps' ceiling.  0 when
 * the two buffers do not fit beside the MLP's (the caller says so). */
static double copy_tb_per_s(int repeats)
{
    const size_t bytes = (size_t)1 << 30;
    void *src = NULL, *dst = NULL;
    if (cudaMalloc(&src, bytes) != cudaSuccess || cudaMalloc(&dst, bytes) != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the allocation error */
        if (src != NULL)
            CUDA_TRY(cudaFree(src));
        return 0.0;
    }
    CUDA_TRY(cudaMemset(src, 0x5a, bytes));
    cudaEvent_t start, stop;
    CUDA_TRY(cudaEventCreate(&start));
    CUDA_TRY(cudaEventCreate(&stop));
    float *ms = xmalloc(sizeof(float) * (size_t)repeats);
    for (int r = -2; r < repeats; r++) {
        float t = 0;
        CUDA_TRY(cudaEventRecord(start, NULL));
        CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, NULL));
        CUDA_TRY(cudaEventRecord(stop, NULL));
        CUDA_TRY(cudaEventSynchronize(stop));
        CUDA_TRY(cudaEventElapsedTime(&t, start, stop));
        if (r >= 0)
            ms[r] = t;
    }
    qsort(ms, (size_t)repeats, sizeof(float), cmp_float);
    const double rate = 2.0 * (double)bytes / (ms[repeats / 2] * 1e-3) / 1e12;
    free(ms);
    CUDA_TRY(cudaEventDestroy(start));
    CUDA_TRY(cudaEventDestroy(stop));
    CUDA_TRY(cudaFree(src));
    CUDA_TRY(cudaFree(dst));
    return rate;
}

static int cmp_float(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static unsigned char *download(const void *dev, size_t bytes)
{
    unsigned char *host = xmalloc(bytes);
    CUDA_TRY(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
    return host;
}

/* The device arrays and options of the timed calls. */
typedef struct mlp_call {
    const moe_mlp_layout *layout;
    int64_t H, I;
    const void *x, *aff, *w_gu, *w_d, *G;
    void *out, *ckgu, *ckd, *dx, *da, *dwgu, *dwd;
    const moe_mlp_options *o;
} mlp_call;

/* Milliseconds of one forward (both checkpoints written), CUDA events around the call. */
static float time_fwd(const mlp_call *c, cudaEvent_t start, cudaEvent_t stop)
{
    float ms = 0;
    CUDA_TRY(cudaEventRecord(start, NULL));
    TRY(moe_mlp_fwd(MOE_BACKEND_CUDA, c->layout, c->H, c->I, c->x, c->aff, c->w_gu, c->w_d, NULL, NULL, c->out,
                    c->ckgu, c->ckd, c->o));
    CUDA_TRY(cudaEventRecord(stop, NULL));
    TRY(moe_backend_synchronize(MOE_BACKEND_CUDA, NULL));
    CUDA_TRY(cudaEventElapsedTime(&ms, start, stop));
    return ms;
}

/* Milliseconds of one backward from the forward's checkpoints. */
static float time_bwd(const mlp_call *c, cudaEvent_t start, cudaEvent_t stop)
{
    float ms = 0;
    CUDA_TRY(cudaEventRecord(start, NULL));
    TRY(moe_mlp_bwd(MOE_BACKEND_CUDA, c->layout, c->H, c->I, c->x, c->aff, c->w_gu, c->w_d, NULL, c->ckgu, c->ckd,
                    c->G, c->dx, c->da, c->dwgu, c->dwd, NULL, NULL, c->o));
    CUDA_TRY(cudaEventRecord(stop, NULL));
    TRY(moe_backend_synchronize(MOE_BACKEND_CUDA, NULL));
    CUDA_TRY(cudaEventElapsedTime(&ms, start, stop));
    return ms;
}

/* The index of `name` in the NULL-terminated `names`, or -1. */
static int name_index(const char *name, const char *const *names)
{
    for (int i = 0; names[i] != NULL; i++)
        if (strcmp(name, names[i]) == 0)
            return i;
    return -1;
}

int main(int argc, char **argv)
{
    static const char *const affinity_names[] = {"h", "i", NULL}; /* moe_mlp_affinity */
    const int64_t T = argc > 1 ? atoll(argv[1]) : 4096, E = argc > 2 ? atoll(argv[2]) : 128;
    const int64_t k = argc > 3 ? atoll(argv[3]) : 8, H = argc > 4 ? atoll(argv[4]) : 2048;
    const int64_t I = argc > 5 ? atoll(argv[5]) : 768, B = argc > 6 ? atoll(argv[6]) : 128;
    moe_dtype dt = MOE_BF16;
    const int dtype_known = moe_dtype_from_name(argc > 7 ? argv[7] : "bf16", &dt) == MOE_OK;
    const int repeats = argc > 8 ? atoi(argv[8]) : 10, warmup = 2;
    moe_mlp_activation activation = MOE_ACT_SILU;
    const int act_known = moe_mlp_activation_from_name(argc > 10 ? argv[10] : "silu", &activation) == MOE_OK;
    const int affinity_index = name_index(argc > 11 ? argv[11] : "h", affinity_names);
    if (T < 1 || E < 1 || k < 1 || k > E || H < 1 || I < 1 || B < 1 || repeats < 1 || !dtype_known ||
        !act_known || affinity_index < 0 || argc > 12) {
        fprintf(stderr, "usage: mlp-gpu-time [T E k H I B dtype(f32|f16|bf16) repeats round_intermediates(0|1) "
                        "activation(silu|gelu|gelu_tanh|swish) affinity_on(h|i)] with 1 <= k <= E\n");
        return 2;
    }
    const int round_intermediates = argc > 9 ? atoi(argv[9]) != 0 : dt != MOE_F32;
    if (!moe_backend_available(MOE_BACKEND_CUDA)) {
        printf("SKIP: no CUDA backend or device\n");
        return 77;
    }
    cudaMemPool_t pool;
    CUDA_TRY(cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t threshold = UINT64_MAX;
    CUDA_TRY(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));

    /* routing: k distinct experts per token, uniformly at random; weights uniform in (0, 1) */
    int64_t *topk = xmalloc((size_t)(T * k) * 8);
    oracle_topk_ids(&rng, T, k, E, topk);
    void *weights = xmalloc((size_t)(T * k) * moe_dtype_size(dt));
    oracle_fill(&rng, dt, weights, T * k, 0);
    for (int64_t i = 0; i < T * k; i++) /* |w|: affinities are positive */
        if (dt == MOE_F32)
            ((float *)weights)[i] = fabsf(((float *)weights)[i]);
        else
            ((uint16_t *)weights)[i] &= 0x7fffu;
    moe_mlp_options o = {0};
    o.dtype = dt;
    o.block_size = B;
    o.float32_intermediates = !round_intermediates;
    o.activation = activation;
    o.affinity = (moe_mlp_affinity)affinity_index;
    int64_t N = 0;
    TRY(moe_mlp_layout_num_blocks(MOE_MLP_DROPLESS, T, k, E, topk, &o, &N));
    int64_t *b2e = xmalloc((size_t)N * 8), *ids = xmalloc((size_t)(N * B) * 8);
    void *aff = xmalloc((size_t)(T * E) * moe_dtype_size(dt));
    TRY(moe_mlp_layout_build(MOE_MLP_DROPLESS, T, k, E, topk, weights, N, b2e, ids, aff, NULL, &o));

    moe_mlp_layout layout = {T, E, N, NULL, NULL};
    int64_t *d_b2e = NULL, *d_ids = NULL;
    void *d_aff = NULL;
    CUDA_TRY(cudaMalloc((void **)&d_b2e, (size_t)N * 8));
    CUDA_TRY(cudaMalloc((void **)&d_ids, (size_t)(N * B) * 8));
    CUDA_TRY(cudaMalloc(&d_aff, (size_t)(T * E) * moe_dtype_size(dt)));
    CUDA_TRY(cudaMemcpy(d_b2e, b2e, (size_t)N * 8, cudaMemcpyHostToDevice));
    CUDA_TRY(cudaMemcpy(d_ids, ids, (size_t)(N * B) * 8, cudaMemcpyHostToDevice));
    CUDA_TRY(cudaMemcpy(d_aff, aff, (size_t)(T * E) * moe_dtype_size(dt), cudaMemcpyHostToDevice));
    layout.block_to_expert = d_b2e, layout.token_position_to_id = d_ids;

    void *x = device_array(dt, T * H, 1), *G = device_array(dt, T * H, 1);
    void *w_gu = device_array(dt, E * H * 2 * I, 1), *w_d = device_array(dt, E * I * H, 1);
    void *out = device_array(dt, T * H, 0), *ckgu = device_array(dt, N * 2 * I * B, 0);
    void *ckd = device_array(dt, N * B * H, 0), *dx = device_array(dt, T * H, 0);
    void *da = device_array(dt, T * E, 0), *dwgu = device_array(dt, E * H * 2 * I, 0);
    void *dwd = device_array(dt, E * I * H, 0);

    cudaEvent_t start, stop;
    CUDA_TRY(cudaEventCreate(&start));
    CUDA_TRY(cudaEventCreate(&stop));
    float *ms_fwd = xmalloc((size_t)repeats * sizeof(float)), *ms_bwd = xmalloc((size_t)repeats * sizeof(float));
    unsigned char *first_dx = NULL, *first_dwgu = NULL;
    int identical = 1;
    const size_t dx_bytes = (size_t)(T * H) * moe_dtype_size(dt), dwgu_bytes = (size_t)(E * H * 2 * I) * moe_dtype_size(dt);
    const mlp_call call = {&layout, H, I, x, d_aff, w_gu, w_d, G, out, ckgu, ckd, dx, da, dwgu, dwd, &o};
    for (int r = -warmup; r < repeats; r++) {
        const float f_ms = time_fwd(&call, start, stop), b_ms = time_bwd(&call, start, stop);
        if (r >= 0)
            ms_fwd[r] = f_ms, ms_bwd[r] = b_ms;
        if (r == -warmup) {
            first_dx = download(dx, dx_bytes);
            first_dwgu = download(dwgu, dwgu_bytes);
        } else if (r == repeats - 1) {
            unsigned char *a = download(dx, dx_bytes), *b = download(dwgu, dwgu_bytes);
            identical = memcmp(a, first_dx, dx_bytes) == 0 && memcmp(b, first_dwgu, dwgu_bytes) == 0;
            free(a);
            free(b);
        }
    }
    qsort(ms_fwd, (size_t)repeats, sizeof(float), cmp_float);
    qsort(ms_bwd, (size_t)repeats, sizeof(float), cmp_float);
    const double f = ms_fwd[repeats / 2], b = ms_bwd[repeats / 2];

    /* The rows path's forward again with the gate/up GEMM and its activation as two kernels and the down
     * GEMM on the 128 x 256 kernel (MOE_MLP_FUSE_GATE=0; on sm_90a with long enough experts, or with
     * MOE_MLP_FUSE_GATE=1 in the environment, the default run takes the fused and ping-pong kernels;
     * elsewhere both runs are the same): its median, and whether its outputs are bitwise those of the
     * default forward. */
    double f_unfused = 0;
    float *ms_unfused = xmalloc((size_t)repeats * sizeof(float));
    int fwd_identical = 1;
    const int compare_fusion = round_intermediates && dt != MOE_F32;
    if (compare_fusion) {
        const size_t out_bytes = (size_t)(T * H) * moe_dtype_size(dt);
        const size_t ckgu_bytes = (size_t)(N * 2 * I * B) * moe_dtype_size(dt), ckd_bytes = (size_t)(N * B * H) * moe_dtype_size(dt);
        unsigned char *fused_out = download(out, out_bytes), *fused_ckgu = download(ckgu, ckgu_bytes);
        unsigned char *fused_ckd = download(ckd, ckd_bytes);
        const char *saved = getenv("MOE_MLP_FUSE_GATE");
        char *saved_copy = saved != NULL ? strdup(saved) : NULL;
        if (setenv("MOE_MLP_FUSE_GATE", "0", 1) != 0) {
            fprintf(stderr, "setenv failed\n");
            exit(1);
        }
        for (int r = -warmup; r < repeats; r++) {
            const float ms = time_fwd(&call, start, stop);
            if (r >= 0)
                ms_unfused[r] = ms;
        }
        if (saved_copy != NULL ? setenv("MOE_MLP_FUSE_GATE", saved_copy, 1) != 0 : unsetenv("MOE_MLP_FUSE_GATE") != 0) {
            fprintf(stderr, "setenv failed\n");
            exit(1);
        }
        free(saved_copy);
        unsigned char *a = download(out, out_bytes), *c = download(ckgu, ckgu_bytes), *d = download(ckd, ckd_bytes);
        fwd_identical = memcmp(a, fused_out, out_bytes) == 0 && memcmp(c, fused_ckgu, ckgu_bytes) == 0 &&
                        memcmp(d, fused_ckd, ckd_bytes) == 0;
        free(a), free(c), free(d), free(fused_out), free(fused_ckgu), free(fused_ckd);
        qsort(ms_unfused, (size_t)repeats, sizeof(float), cmp_float);
        f_unfused = ms_unfused[repeats / 2];
    }
    const double flop_fwd = 6.0 * (double)(T * k) * (double)I * (double)H, flop_bwd = 2.0 * flop_fwd;
    printf("T=%lld E=%lld k=%lld H=%lld I=%lld B=%lld %s %s, affinity on %s: N=%lld blocks (%lld positions for %lld "
           "routed pairs)\n",
           (long long)T, (long long)E, (long long)k, (long long)H, (long long)I, (long long)B, moe_dtype_name(dt),
           moe_mlp_activation_name(activation), affinity_index == MOE_AFFINITY_ON_I ? "I" : "H", (long long)N, (long long)(N * B),
           (long long)(T * k));
    printf("intermediates: %s\n", round_intermediates && dt != MOE_F32
                                      ? "rounded to the dtype (round_intermediates: rows path, tensor-core GEMMs)"
                                      : dt == MOE_BF16 ? "float32, split into exact bf16 terms (rows path, tensor-core GEMMs)"
                                                       : "float32 (tile path)");
    printf("forward : median %.3f ms (min %.3f, max %.3f) over %d runs = %.1f TFLOP/s\n", f, ms_fwd[0],
           ms_fwd[repeats - 1], repeats, flop_fwd / (f * 1e-3) / 1e12);
    printf("backward: median %.3f ms (min %.3f, max %.3f) over %d runs = %.1f TFLOP/s\n", b, ms_bwd[0],
           ms_bwd[repeats - 1], repeats, flop_bwd / (b * 1e-3) / 1e12);
    printf("backward outputs (d_hidden, d_w_gu) bitwise equal across runs: %s\n", identical ? "yes" : "NO");
    if (compare_fusion)
        printf("forward with MOE_MLP_FUSE_GATE=0: median %.3f ms = %.1f TFLOP/s (default / this speed %.2fx); "
               "outputs and checkpoints bitwise equal: %s\n", f_unfused, flop_fwd / (f_unfused * 1e-3) / 1e12,
               f_unfused / f, fwd_identical ? "yes" : "NO");
    if (dt != MOE_F32) {
        int64_t *m_sizes = xmalloc((size_t)E * 8);
        for (int64_t e = 0; e < E; e++)
            m_sizes[e] = 0;
        for (int64_t i = 0; i < T * k; i++)
            m_sizes[topk[i]]++;
        double cf = 0, cb = 0, df = 0, db = 0;
        time_cublas(dt, E, H, I, m_sizes, 0, repeats, &cf, &cb);
        printf("cuBLAS grouped GEMMs alone (lower bound of an unfused composition): forward %.3f ms = %.1f TFLOP/s, "
               "backward %.3f ms = %.1f TFLOP/s; libmoe / cuBLAS speed: forward %.2fx, backward %.2fx\n",
               cf, flop_fwd / (cf * 1e-3) / 1e12, cb, flop_bwd / (cb * 1e-3) / 1e12, cf / f, cb / b);
        time_cublas(dt, E, H, I, m_sizes, 1, repeats, &df, &db);
        const double copy = copy_tb_per_s(repeats);
        printf("ceilings: the same GEMMs as dense cuBLAS calls over all %lld rows: forward %.3f ms = %.1f TFLOP/s, "
               "backward %.3f ms = %.1f TFLOP/s; ", (long long)(T * k), df, flop_fwd / (df * 1e-3) / 1e12, db,
               flop_bwd / (db * 1e-3) / 1e12);
        if (copy > 0)
            printf("device-to-device copy %.2f TB/s (read + written)\n", copy);
        else
            printf("device-to-device copy not measured (no room for two 1 GiB buffers)\n");
        free(m_sizes);
    }
    return identical && fwd_identical ? 0 : 1;
}
