/* Times the blockwise MoE MLP reference, forward + backward, on one MoE layer (default: Qwen3-30B-A3B,
 * T = 512 tokens, E = 128 experts, k = 8, H = 2048, I = 768, bf16, B = 128, dropless layout, SiLU,
 * affinity on H, no bias).  Not a test: built by `make check` as a helper, run by hand.
 *
 * usage: mlp_layer_time [T E k H I B dtype(f32|f16|bf16) repeats] */
#include "moe.h"
#include "moe_mlp.h"
#include "alloc.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ULL;
static uint64_t next(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* uniform in [-scale, scale) rounded to dtype */
static void fill(moe_dtype dt, void *p, int64_t n, double scale)
{
    for (int64_t i = 0; i < n; i++) {
        const float v = (float)(scale * ((double)(next() >> 11) * 0x1p-52 - 1.0));
        switch (dt) {
        case MOE_F32: ((float *)p)[i] = v; break;
        case MOE_F16: ((uint16_t *)p)[i] = moe_f32_to_f16(v); break;
        case MOE_BF16: ((uint16_t *)p)[i] = moe_f32_to_bf16(v); break;
        case MOE_E4M3: ((uint8_t *)p)[i] = moe_f32_to_e4m3(v); break;
        case MOE_E5M2: ((uint8_t *)p)[i] = moe_f32_to_e5m2(v); break;
        }
    }
}

static double checksum(moe_dtype dt, const void *p, int64_t n)
{
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double v = dt == MOE_F32 ? ((const float *)p)[i]
                   : dt == MOE_F16 ? moe_f16_to_f32(((const uint16_t *)p)[i])
                                   : moe_bf16_to_f32(((const uint16_t *)p)[i]);
        s += fabs(v);
    }
    return s;
}

#define TRY(call)                                                                                    \
    do {                                                                                             \
        moe_status st_ = (call);                                                                     \
        if (st_ != MOE_OK) {                                                                         \
            fprintf(stderr, "%s: %s (%s)\n", #call, moe_strerror(st_), moe_last_error());            \
            return 1;                                                                                \
        }                                                                                            \
    } while (0)

int main(int argc, char **argv)
{
    int64_t T = 512, E = 128, k = 8, H = 2048, I = 768, B = 128;
    moe_dtype dt = MOE_BF16;
    int repeats = 1;
    if (argc > 1) T = atoll(argv[1]);
    if (argc > 2) E = atoll(argv[2]);
    if (argc > 3) k = atoll(argv[3]);
    if (argc > 4) H = atoll(argv[4]);
    if (argc > 5) I = atoll(argv[5]);
    if (argc > 6) B = atoll(argv[6]);
    if (argc > 7) dt = !strcmp(argv[7], "f32") ? MOE_F32 : !strcmp(argv[7], "f16") ? MOE_F16 : MOE_BF16;
    if (argc > 8) repeats = atoi(argv[8]);
    const size_t es = moe_dtype_size(dt);
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif

    /* routing: k distinct uniform experts per token, weights uniform in [0, 1/k) */
    int64_t *ids = xcalloc((size_t)(T * k), sizeof(int64_t));
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++) {
            int dup;
            do {
                ids[t * k + j] = (int64_t)(next() % (uint64_t)E);
                dup = 0;
                for (int64_t q = 0; q < j; q++)
                    dup |= ids[t * k + q] == ids[t * k + j];
            } while (dup);
        }
    void *topw = xcalloc((size_t)(T * k), es);
    fill(dt, topw, T * k, 1.0 / (double)k);
    for (int64_t i = 0; i < T * k; i++) /* make them positive */
        if (dt == MOE_F32)
            ((float *)topw)[i] = fabsf(((float *)topw)[i]);
        else
            ((uint16_t *)topw)[i] &= 0x7FFF;
    moe_mlp_options o = {0};
    o.dtype = dt;
    o.block_size = B;
    int64_t N = 0;
    TRY(moe_mlp_layout_num_blocks(MOE_MLP_DROPLESS, T, k, E, ids, &o, &N));
    int64_t *b2e = xcalloc((size_t)N, sizeof(int64_t)), *pos = xcalloc((size_t)(N * B), sizeof(int64_t));
    void *aff = xcalloc((size_t)(T * E), es);
    TRY(moe_mlp_layout_build(MOE_MLP_DROPLESS, T, k, E, ids, topw, N, b2e, pos, aff, NULL, &o));
    const moe_mlp_layout layout = {T, E, N, b2e, pos};

    void *x = xcalloc((size_t)(T * H), es), *wgu = xcalloc((size_t)(E * H * 2 * I), es);
    void *wd = xcalloc((size_t)(E * I * H), es), *out = xcalloc((size_t)(T * H), es);
    void *ckgu = xcalloc((size_t)(N * 2 * I * B), es), *ckd = xcalloc((size_t)(N * B * H), es);
    void *G = xcalloc((size_t)(T * H), es), *dx = xcalloc((size_t)(T * H), es), *da = xcalloc((size_t)(T * E), es);
    void *dwgu = xcalloc((size_t)(E * H * 2 * I), es), *dwd = xcalloc((size_t)(E * I * H), es);
    fill(dt, x, T * H, 1.0);
    fill(dt, wgu, E * H * 2 * I, 1.0 / sqrt((double)H));
    fill(dt, wd, E * I * H, 1.0 / sqrt((double)I));
    fill(dt, G, T * H, 1.0);

    printf("layer T=%lld E=%lld k=%lld H=%lld I=%lld B=%lld %s, N=%lld blocks (%lld positions, %lld routed), "
           "%d OpenMP threads\n",
           (long long)T, (long long)E, (long long)k, (long long)H, (long long)I, (long long)B, moe_dtype_name(dt),
           (long long)N, (long long)(N * B), (long long)(T * k), threads);
    const double flop_fwd = 2.0 * (double)(T * k) * (double)(3 * H * I);
    const double flop_bwd = 2.0 * (double)(T * k) * (double)(6 * H * I) + 2.0 * (double)(T * k) * (double)H;
    double best_f = 1e30, best_b = 1e30;
    for (int r = 0; r < repeats; r++) {
        double t0 = now();
        TRY(moe_mlp_fwd(MOE_BACKEND_REF, &layout, H, I, x, aff, wgu, wd, NULL, NULL, out, ckgu, ckd, &o));
        double t1 = now();
        TRY(moe_mlp_bwd(MOE_BACKEND_REF, &layout, H, I, x, aff, wgu, wd, NULL, ckgu, ckd, G, dx, da, dwgu, dwd, NULL,
                        NULL, &o));
        double t2 = now();
        best_f = t1 - t0 < best_f ? t1 - t0 : best_f;
        best_b = t2 - t1 < best_b ? t2 - t1 : best_b;
        printf("run %d: forward %.2f s, backward %.2f s, total %.2f s\n", r, t1 - t0, t2 - t1, t2 - t0);
    }
    printf("best: forward %.2f s (%.1f GFLOP/s), backward %.2f s (%.1f GFLOP/s), forward+backward %.2f s\n", best_f,
           flop_fwd / best_f * 1e-9, best_b, flop_bwd / best_b * 1e-9, best_f + best_b);
    printf("checksums: |out| %.6g  |dx| %.6g  |dA| %.6g  |dW_gu| %.6g  |dW_d| %.6g\n", checksum(dt, out, T * H),
           checksum(dt, dx, T * H), checksum(dt, da, T * E), checksum(dt, dwgu, E * H * 2 * I),
           checksum(dt, dwd, E * I * H));
    free(ids), free(topw), free(b2e), free(pos), free(aff), free(x), free(wgu), free(wd), free(out), free(ckgu);
    free(ckd), free(G), free(dx), free(da), free(dwgu), free(dwd);
    return 0;
}
