/* moe_gemm_autotune on a GPU (skipped with exit 77 where no CUDA device is visible).  For fwd, dX and dW
 * in several modes, weighted bf16 and f16 dW and f32 with allow_tf32 (weighted dW too) included (random
 * routing, random data, outputs poisoned with NaN before every call):
 *   1. the tuning succeeds, times at least one candidate, and leaves in `out` a result within the float64
 *      oracle's bound;
 *   2. a plain call afterwards plans the tuned configuration (the sm90 dW kernel included: the dW cases have
 *      experts longer and shorter than the rule's H_DW_PINGPONG_ROWS) and gives bitwise the same output;
 *   3. after moe_gemm_autotune_clear the call plans the heuristic's choice again, and after
 *      moe_gemm_autotune_load of the cache file the tuned one; the file holds one line per tuning;
 *   4. a table entry naming the SIMT kernel leaves a call that a tensor-core kernel can take to the
 *      heuristic's plan;
 *   5. an invalid routing on the device is reported by the tuning as MOE_ERR_INVALID_ROUTING.
 * usage: test_gpu_autotune [seed] */
#include "moe.h"
#include "moe_backend.h"
#include "oracle.h"
#include "alloc.h"
#include "gpu_check.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct tune_case {
    const char *name;
    moe_gemm_op op;
    moe_dtype dtype;
    int permute_x, permute_y, reduce_topk, weights, dw_fp32;
    int64_t T, k, E, N, K;
    int allow_tf32;
} tune_case;

static const tune_case cases[] = {
    {"fwd bf16", MOE_GEMM_FWD, MOE_BF16, 0, 0, 0, 0, 0, 1024, 2, 8, 256, 192, 0},
    {"fwd f16 permute_x weights", MOE_GEMM_FWD, MOE_F16, 1, 0, 0, 1, 0, 600, 2, 6, 128, 264, 0},
    {"dx bf16", MOE_GEMM_DX, MOE_BF16, 0, 0, 0, 0, 0, 1024, 2, 8, 192, 256, 0},
    {"dx bf16 permute_y reduce_topk", MOE_GEMM_DX, MOE_BF16, 0, 1, 1, 0, 0, 512, 4, 16, 136, 128, 0},
    {"dw bf16", MOE_GEMM_DW, MOE_BF16, 0, 0, 0, 0, 0, 1024, 2, 8, 256, 128, 0},
    {"dw bf16 short experts", MOE_GEMM_DW, MOE_BF16, 0, 0, 0, 0, 0, 256, 2, 8, 256, 128, 0}, /* the rule: ping-pong */
    {"dw bf16 -> f32", MOE_GEMM_DW, MOE_BF16, 0, 0, 0, 0, 1, 700, 2, 5, 128, 136, 0},
    {"dw bf16 permute_y weights", MOE_GEMM_DW, MOE_BF16, 0, 1, 0, 1, 0, 512, 2, 8, 128, 256, 0}, /* the split, sm90 or sm80 */
    {"dw f16 permute_x weights", MOE_GEMM_DW, MOE_F16, 1, 0, 0, 1, 0, 512, 2, 8, 136, 128, 0}, /* the TF32 split, sm80 */
    {"fwd f32 allow_tf32", MOE_GEMM_FWD, MOE_F32, 0, 0, 0, 0, 0, 512, 2, 8, 128, 128, 1}, /* the TF32 kernel */
    {"dw f32 allow_tf32 permute_y weights", MOE_GEMM_DW, MOE_F32, 0, 1, 0, 1, 0, 384, 2, 8, 136, 128, 1}, /* TF32 */
};

static int same_plan(const moe_tune_choice *a, const moe_gemm_tuning *b)
{
    static const char *const kernels[] = {"simt", "sm80", "sm90"};
    return strcmp(kernels[a->kernel], b->kernel) == 0 && a->tile_rows == b->tile_rows && a->cluster == b->cluster &&
           a->tma_store == b->tma_store && a->dw_pingpong == b->dw_pingpong;
}

/* Two plans alike in every field a call follows (not the timing). */
static int same_choice(const moe_tune_choice *a, const moe_tune_choice *b)
{
    return a->kernel == b->kernel && a->tile_rows == b->tile_rows && a->cluster == b->cluster &&
           a->tma_store == b->tma_store && a->dw_pingpong == b->dw_pingpong;
}

static moe_status plain_call(const tune_case *c, const moe_routing *r, const void *a, const void *b, const void *tw,
                             void *out, const moe_gemm_options *o)
{
    switch (c->op) {
    case MOE_GEMM_FWD: return moe_gemm_fwd(MOE_BACKEND_CUDA, r, c->N, c->K, a, b, tw, out, o);
    case MOE_GEMM_DX: return moe_gemm_dx(MOE_BACKEND_CUDA, r, c->N, c->K, a, b, tw, out, o);
    case MOE_GEMM_DW: return moe_gemm_dw(MOE_BACKEND_CUDA, r, c->N, c->K, a, b, tw, out, o);
    }
    return MOE_ERR_INVALID_OPTION;
}

static int count_lines(const char *path)
{
    FILE *f = fopen(path, "r");
    REQUIRE(f != NULL, "cannot read %s", path);
    int lines = 0, ch;
    while ((ch = fgetc(f)) != EOF)
        lines += ch == '\n';
    fclose(f);
    return lines;
}

int main(int argc, char **argv)
{
    const uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 20261123;
    printf("seed %llu\n", (unsigned long long)seed);
    if (!moe_backend_available(MOE_BACKEND_CUDA)) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    oracle_rng rng = {seed};
    char cache[] = "/tmp/libmoe-autotune-XXXXXX";
    const int fd = mkstemp(cache);
    REQUIRE(fd >= 0, "mkstemp failed");
    close(fd);
    moe_gemm_autotune_clear();
    int tunings = 0;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const tune_case *c = &cases[ci];
        const int64_t T = c->T, k = c->k, E = c->E, N = c->N, K = c->K, M = T * k;
        int64_t *ids = xmalloc((size_t)M * 8), *m_sizes = xmalloc((size_t)E * 8), *gather = xmalloc((size_t)M * 8);
        for (int64_t i = 0; i < M; i++) /* skewed: expert 0 gets about a quarter of the rows */
            ids[i] = oracle_rng_below(&rng, 4) == 0 ? 0 : (int64_t)oracle_rng_below(&rng, (uint64_t)E);
        REQUIRE(moe_routing_from_topk(T, k, E, ids, m_sizes, gather, NULL) == MOE_OK, "%s", moe_last_error());
        const moe_routing host_routing = {T, k, E, m_sizes, gather};
        int64_t *dev_sizes = to_device(m_sizes, (size_t)E * 8), *dev_gather = to_device(gather, (size_t)M * 8);
        const moe_routing dev_routing = {T, k, E, dev_sizes, dev_gather};

        const size_t es = moe_dtype_size(c->dtype);
        const moe_dtype out_dtype = c->op == MOE_GEMM_DW && c->dw_fp32 ? MOE_F32 : c->dtype;
        const int64_t x_rows = c->permute_x ? T : M;
        const int64_t a_count = c->op == MOE_GEMM_DX ? M * N : x_rows * K;
        const int64_t b_count = c->op == MOE_GEMM_DW ? M * N : E * N * K;
        const int64_t out_count = c->op == MOE_GEMM_FWD ? M * N : c->op == MOE_GEMM_DW ? E * N * K
                                : c->reduce_topk ? T * K : M * K;
        void *a = xmalloc((size_t)a_count * es), *b = xmalloc((size_t)b_count * es), *tw = xmalloc((size_t)M * es);
        oracle_fill(&rng, c->dtype, a, a_count, 0);
        oracle_fill(&rng, c->dtype, b, b_count, 0);
        oracle_fill(&rng, c->dtype, tw, M, 0);
        void *dev_a = to_device(a, (size_t)a_count * es), *dev_b = to_device(b, (size_t)b_count * es);
        void *dev_tw = c->weights ? to_device(tw, (size_t)M * es) : NULL;
        const size_t out_bytes = (size_t)out_count * moe_dtype_size(out_dtype);
        void *dev_out = NULL;
        CUDA_CHECK(cudaMalloc(&dev_out, out_bytes));
        void *out = xmalloc(out_bytes), *again = xmalloc(out_bytes);

        moe_gemm_options o;
        memset(&o, 0, sizeof o);
        o.dtype = c->dtype, o.dw_fp32 = c->dw_fp32, o.permute_x = c->permute_x, o.permute_y = c->permute_y;
        o.reduce_topk = c->reduce_topk, o.allow_tf32 = c->allow_tf32;

        /* the heuristic's plan, before any tuning of this key */
        moe_tune_key key;
        moe_tune_choice heuristic, planned;
        REQUIRE(plain_call(c, &dev_routing, dev_a, dev_b, dev_tw, dev_out, &o) == MOE_OK, "%s", moe_last_error());
        REQUIRE(moe_cuda_tune_last(&key, &heuristic), "%s: no plan recorded", c->name);
        /* 16-bit inputs, and f32 with allow_tf32, with N, K multiples of 8 always have a tensor-core kernel,
         * weighted dW included */
        REQUIRE((c->dtype == MOE_F32 && !c->allow_tf32) || heuristic.kernel != MOE_TUNE_SIMT,
                "%s: planned on the SIMT kernel", c->name);

        /* 1. tune: out holds a correct result */
        CUDA_CHECK(cudaMemset(dev_out, 0xff, out_bytes)); /* NaN poison */
        moe_gemm_tuning chosen;
        moe_status st = moe_gemm_autotune(c->op, &dev_routing, N, K, dev_a, dev_b, dev_tw, dev_out, &o, 3, cache,
                                          &chosen);
        REQUIRE(st == MOE_OK, "%s: autotune: %s (%s)", c->name, moe_strerror(st), moe_last_error());
        tunings++;
        REQUIRE(chosen.candidates >= 1 && chosen.median_us > 0.0, "%s: %d candidates, %.3f us", c->name,
                chosen.candidates, chosen.median_us);
        printf("%-32s %d candidates; chosen %s rows %d cluster %d tma_store %d dw_pingpong %d: %.1f us (heuristic: "
               "%s rows %d cluster %d tma_store %d dw_pingpong %d)\n", c->name, chosen.candidates, chosen.kernel,
               chosen.tile_rows, chosen.cluster, chosen.tma_store, chosen.dw_pingpong, chosen.median_us,
               heuristic.kernel == MOE_TUNE_SM90 ? "sm90" : heuristic.kernel == MOE_TUNE_SM80 ? "sm80" : "simt",
               heuristic.tile_rows, heuristic.cluster, heuristic.tma_store, heuristic.dw_pingpong);
        CUDA_CHECK(cudaMemcpy(out, dev_out, out_bytes, cudaMemcpyDeviceToHost));
        double *value = xmalloc((size_t)out_count * sizeof(double)), *bound = xmalloc((size_t)out_count * sizeof(double));
        const moe_routing *hr = &host_routing;
        if (c->op == MOE_GEMM_FWD)
            oracle_gemm_fwd(hr, N, K, a, b, c->weights ? tw : NULL, NULL, &o, value, bound);
        else if (c->op == MOE_GEMM_DX)
            oracle_gemm_dx(hr, N, K, a, b, c->weights ? tw : NULL, NULL, &o, value, bound);
        else
            oracle_gemm_dw_split(hr, N, K, a, b, c->weights ? tw : NULL, NULL, &o, value, bound);
        const int64_t bad = oracle_compare(c->name, out_dtype, out, value, bound, out_count, stderr, 5, NULL);
        REQUIRE(bad == 0, "%s: %lld elements of the tuned call outside the oracle's bound", c->name, (long long)bad);

        /* 2. a plain call now plans the tuned configuration, bit for bit the same output */
        CUDA_CHECK(cudaMemset(dev_out, 0xff, out_bytes));
        REQUIRE(plain_call(c, &dev_routing, dev_a, dev_b, dev_tw, dev_out, &o) == MOE_OK, "%s", moe_last_error());
        REQUIRE(moe_backend_synchronize(MOE_BACKEND_CUDA, NULL) == MOE_OK, "%s", moe_last_error());
        REQUIRE(moe_cuda_tune_last(&key, &planned) && same_plan(&planned, &chosen), "%s: the tuned choice is not used",
                c->name);
        CUDA_CHECK(cudaMemcpy(again, dev_out, out_bytes, cudaMemcpyDeviceToHost));
        REQUIRE(memcmp(out, again, out_bytes) == 0, "%s: the tuned plain call differs from the tuning's result", c->name);

        /* 3. clear -> heuristic; load -> tuned */
        moe_gemm_autotune_clear();
        REQUIRE(plain_call(c, &dev_routing, dev_a, dev_b, dev_tw, dev_out, &o) == MOE_OK, "%s", moe_last_error());
        REQUIRE(moe_cuda_tune_last(&key, &planned) && same_choice(&planned, &heuristic),
                "%s: after clear the heuristic's plan is not back", c->name);
        REQUIRE(moe_gemm_autotune_load(cache) == MOE_OK, "load: %s", moe_last_error());
        REQUIRE(count_lines(cache) == tunings, "%s: %d lines in the cache after %d tunings", c->name, count_lines(cache),
                tunings);
        REQUIRE(plain_call(c, &dev_routing, dev_a, dev_b, dev_tw, dev_out, &o) == MOE_OK, "%s", moe_last_error());
        REQUIRE(moe_cuda_tune_last(&key, &planned) && same_plan(&planned, &chosen), "%s: the loaded choice is not used",
                c->name);

        /* 4. a "simt" entry for the key (as an older libmoe recorded for weighted f16 dW, or a tuning of a
         *    call whose tensors were not 16-byte aligned) leaves the call to the heuristic's tensor-core plan */
        if (heuristic.kernel != MOE_TUNE_SIMT) {
            char simt_path[] = "/tmp/libmoe-autotune-simt-XXXXXX", line[600];
            const int simt_fd = mkstemp(simt_path);
            REQUIRE(simt_fd >= 0, "mkstemp failed");
            const moe_tune_choice simt = {MOE_TUNE_SIMT, 64, 1, 0, 0, 1.0};
            moe_tune_format_line(&key, &simt, line, sizeof line);
            FILE *f = fdopen(simt_fd, "w");
            REQUIRE(f != NULL && fprintf(f, "%s\n", line) > 0 && fclose(f) == 0, "cannot write %s", simt_path);
            REQUIRE(moe_gemm_autotune_load(simt_path) == MOE_OK, "load %s: %s", simt_path, moe_last_error());
            unlink(simt_path);
            REQUIRE(plain_call(c, &dev_routing, dev_a, dev_b, dev_tw, dev_out, &o) == MOE_OK, "%s", moe_last_error());
            REQUIRE(moe_cuda_tune_last(&key, &planned) && same_choice(&planned, &heuristic),
                    "%s: a simt entry moved the call off the heuristic's plan (to %s)", c->name,
                    planned.kernel == MOE_TUNE_SIMT ? "simt" : "another tensor-core plan");
        }

        /* 5. an invalid routing (sizes that do not add up) on the device */
        if (ci == 0) {
            int64_t *bad_sizes = xmalloc((size_t)E * 8);
            memcpy(bad_sizes, m_sizes, (size_t)E * 8);
            bad_sizes[E - 1] += 1;
            int64_t *dev_bad = to_device(bad_sizes, (size_t)E * 8);
            const moe_routing bad_routing = {T, k, E, dev_bad, dev_gather};
            st = moe_gemm_autotune(c->op, &bad_routing, N, K, dev_a, dev_b, dev_tw, dev_out, &o, 2, NULL, NULL);
            REQUIRE(st == MOE_ERR_INVALID_ROUTING && strstr(moe_last_error(), "moe_gemm_autotune:") != NULL &&
                        strstr(moe_last_error(), "m_sizes") != NULL,
                    "bad routing: %s (%s)", moe_strerror(st), moe_last_error());
            CUDA_CHECK(cudaFree(dev_bad));
            free(bad_sizes);
        }

        free(value), free(bound), free(out), free(again), free(a), free(b), free(tw);
        free(ids), free(m_sizes), free(gather);
        CUDA_CHECK(cudaFree(dev_a));
        CUDA_CHECK(cudaFree(dev_b));
        CUDA_CHECK(cudaFree(dev_out));
        if (dev_tw)
            CUDA_CHECK(cudaFree(dev_tw));
        CUDA_CHECK(cudaFree(dev_sizes));
        CUDA_CHECK(cudaFree(dev_gather));
    }
    unlink(cache);
    moe_gemm_autotune_clear();
    printf("test_gpu_autotune: %d tunings, PASS\n", tunings);
    return 0;
}
