/* Times the CUDA blockwise MoE MLP (MOE_BACKEND_CUDA), forward and backward, on one MoE layer (default:
 * Qwen3-30B-A3B, T = 4096 tokens, E = 128 experts, k = 8, H = 2048, I = 768, bf16, B = 128, dropless
 * layout from uniformly random distinct top-k routing, SiLU, affinity on H, no bias; data uniform in
 * [-1, 1) from proptest/oracle.c).  Each direction is
 * timed with CUDA events around single calls: `warmup` untimed calls, then `repeats` timed ones; the
 * median is reported with TFLOP/s from the routed pairs (forward 6*T*k*I*H, backward 12*T*k*I*H FLOPs;
 * padding positions are not counted).  The default memory pool keeps freed memory (release threshold
 * raised) so that the per-call workspace of cudaMallocAsync is not re-mapped every call.  Also checks
 * that every call reports no error and that two backward runs are bitwise equal (d_hidden, d_w_gu).
 *
 * usage: mlp-gpu-time [T E k H I B dtype(f32|f16|bf16) repeats] */
#include "moe.h"
#include "moe_mlp.h"
#include "oracle.h"

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

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (p == NULL) {
        fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

static oracle_rng rng = {20261122};

/* A device buffer of n elements of dtype: uniform in [-1, 1) (random != 0) or zero. */
static void *device_array(moe_dtype dt, int64_t n, int random)
{
    const size_t bytes = (size_t)n * moe_dtype_size(dt);
    void *dev = NULL;
    CUDA_TRY(cudaMalloc(&dev, bytes ? bytes : 16));
    if (random) {
        void *host = xmalloc(bytes);
        oracle_fill(&rng, dt, host, n, 0);
        CUDA_TRY(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
        free(host);
    } else {
        CUDA_TRY(cudaMemset(dev, 0, bytes));
    }
    return dev;
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

int main(int argc, char **argv)
{
    const int64_t T = argc > 1 ? atoll(argv[1]) : 4096, E = argc > 2 ? atoll(argv[2]) : 128;
    const int64_t k = argc > 3 ? atoll(argv[3]) : 8, H = argc > 4 ? atoll(argv[4]) : 2048;
    const int64_t I = argc > 5 ? atoll(argv[5]) : 768, B = argc > 6 ? atoll(argv[6]) : 128;
    const char *dname = argc > 7 ? argv[7] : "bf16";
    const int repeats = argc > 8 ? atoi(argv[8]) : 10, warmup = 2;
    const moe_dtype dt = strcmp(dname, "f32") == 0 ? MOE_F32 : strcmp(dname, "f16") == 0 ? MOE_F16 : MOE_BF16;
    if (!moe_backend_available(MOE_BACKEND_CUDA)) {
        printf("SKIP: no CUDA backend or device\n");
        return 77;
    }
    if (T < 1 || E < 1 || k < 1 || k > E || H < 1 || I < 1 || B < 1 || repeats < 1) {
        fprintf(stderr, "usage: mlp-gpu-time [T E k H I B dtype repeats] with 1 <= k <= E\n");
        return 2;
    }
    cudaMemPool_t pool;
    CUDA_TRY(cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t threshold = UINT64_MAX;
    CUDA_TRY(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));

    /* routing: k distinct experts per token, uniformly at random; weights uniform in (0, 1) */
    int64_t *topk = xmalloc((size_t)(T * k) * 8);
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++) {
            int64_t e, again;
            do {
                e = (int64_t)oracle_rng_below(&rng, (uint64_t)E);
                again = 0;
                for (int64_t q = 0; q < j; q++)
                    again |= topk[t * k + q] == e;
            } while (again);
            topk[t * k + j] = e;
        }
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
    for (int r = -warmup; r < repeats; r++) {
        CUDA_TRY(cudaEventRecord(start, NULL));
        TRY(moe_mlp_fwd(MOE_BACKEND_CUDA, &layout, H, I, x, d_aff, w_gu, w_d, NULL, NULL, out, ckgu, ckd, &o));
        CUDA_TRY(cudaEventRecord(stop, NULL));
        TRY(moe_backend_synchronize(MOE_BACKEND_CUDA, NULL));
        float ms = 0;
        CUDA_TRY(cudaEventElapsedTime(&ms, start, stop));
        if (r >= 0)
            ms_fwd[r] = ms;
        CUDA_TRY(cudaEventRecord(start, NULL));
        TRY(moe_mlp_bwd(MOE_BACKEND_CUDA, &layout, H, I, x, d_aff, w_gu, w_d, NULL, ckgu, ckd, G, dx, da, dwgu, dwd,
                        NULL, NULL, &o));
        CUDA_TRY(cudaEventRecord(stop, NULL));
        TRY(moe_backend_synchronize(MOE_BACKEND_CUDA, NULL));
        CUDA_TRY(cudaEventElapsedTime(&ms, start, stop));
        if (r >= 0)
            ms_bwd[r] = ms;
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
    const double flop_fwd = 6.0 * (double)(T * k) * (double)I * (double)H, flop_bwd = 2.0 * flop_fwd;
    printf("T=%lld E=%lld k=%lld H=%lld I=%lld B=%lld %s: N=%lld blocks (%lld positions for %lld routed pairs)\n",
           (long long)T, (long long)E, (long long)k, (long long)H, (long long)I, (long long)B, moe_dtype_name(dt),
           (long long)N, (long long)(N * B), (long long)(T * k));
    printf("forward : median %.3f ms (min %.3f, max %.3f) over %d runs = %.1f TFLOP/s\n", f, ms_fwd[0],
           ms_fwd[repeats - 1], repeats, flop_fwd / (f * 1e-3) / 1e12);
    printf("backward: median %.3f ms (min %.3f, max %.3f) over %d runs = %.1f TFLOP/s\n", b, ms_bwd[0],
           ms_bwd[repeats - 1], repeats, flop_bwd / (b * 1e-3) / 1e12);
    printf("backward outputs (d_hidden, d_w_gu) bitwise equal across runs: %s\n", identical ? "yes" : "NO");
    return identical ? 0 : 1;
}
