/* Run-time checking of the ACSL float postconditions WP does not prove (specs/README.md): runs the naive
 * grouped GEMM forward (ref/gemm_naive.c) on random routings, every mode (permute_x, permute_y) and
 * dtype, and checks its `fwd_within_bound` clause with moe_ref_check_gemm_fwd_post (tests/contract_check.c,
 * written to mirror the ACSL of moe_ref.h / specs/gemm.acsl).  Then feeds the checker deliberately wrong
 * outputs (one element off by far more than the bound; one element left unwritten as NaN) and expects it to
 * report the named clause: a contract violation being caught.
 *
 * Usage: test_contracts [seed] */
#include "contract_check.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long failures;
static uint64_t rng_state;

static uint64_t next_random(void) /* splitmix64 */
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static int64_t random_below(int64_t n) { return (int64_t)(next_random() % (uint64_t)n); }

static void *xcalloc(size_t count, size_t size)
{
    void *p = calloc(count ? count : 1, size);
    if (p == NULL) {
        fprintf(stderr, "test_contracts: out of memory\n");
        exit(1);
    }
    return p;
}

/* Fills count elements of a dtype tensor with values uniform in [-1, 1), rounded to the dtype. */
static void *random_tensor(moe_dtype dtype, int64_t count)
{
    void *t = xcalloc((size_t)count, moe_dtype_size(dtype));
    for (int64_t i = 0; i < count; i++)
        moe_ref_store(dtype, t, i, (float)((double)random_below(1 << 20) / (1 << 19) - 1.0));
    return t;
}

/* One random problem, checked in every mode; with `demo`, also the two deliberate violations. */
static void run_case(uint64_t seed, moe_dtype dtype, int demo)
{
    rng_state = seed;
    const int64_t E = 1 + random_below(6), k = 1 + random_below(E < 3 ? E : 3), T = random_below(9);
    const int64_t N = 1 + random_below(7), K = random_below(40), M = T * k;
    int64_t *topk_ids = xcalloc((size_t)M, sizeof *topk_ids);
    for (int64_t t = 0; t < T; t++)       /* k distinct experts per token */
        for (int64_t j = 0; j < k; j++) {
            int64_t e, clash;
            do {
                e = random_below(E);
                clash = 0;
                for (int64_t q = 0; q < j; q++)
                    clash |= topk_ids[t * k + q] == e;
            } while (clash);
            topk_ids[t * k + j] = e;
        }
    int64_t *m_sizes = xcalloc((size_t)E, sizeof *m_sizes), *gather = xcalloc((size_t)M, sizeof *gather);
    if (moe_routing_from_topk(T, k, E, topk_ids, m_sizes, gather, NULL) != MOE_OK) {
        fprintf(stderr, "test_contracts: FAIL: routing (seed %" PRIu64 "): %s\n", seed, moe_last_error());
        failures++;
        return;
    }
    void *x = random_tensor(dtype, M * K), *w = random_tensor(dtype, E * N * K);
    void *y = xcalloc((size_t)(M * N), moe_dtype_size(dtype));
    char message[256];
    for (int mode = 0; mode < 4; mode++) {
        const moe_gemm_problem p = {.op = "test_contracts", .num_tokens = T, .topk = k, .num_experts = E,
                                    .rows = M, .N = N, .K = K, .m_sizes = m_sizes, .gather_indices = gather,
                                    .dtype = dtype, .dw_dtype = dtype, .permute_x = mode & 1,
                                    .permute_y = (mode >> 1) & 1};
        if (moe_ref_gemm_fwd_naive(&p, x, w, NULL, y) != MOE_OK) {
            fprintf(stderr, "test_contracts: FAIL: fwd (seed %" PRIu64 "): %s\n", seed, moe_last_error());
            failures++;
            continue;
        }
        long bad = moe_ref_check_gemm_fwd_post(&p, x, w, NULL, y, message, sizeof message);
        if (bad != 0) {
            fprintf(stderr, "test_contracts: FAIL: seed %" PRIu64 " %s mode %d: %ld violations, first: %s\n",
                    seed, moe_dtype_name(dtype), mode, bad, message);
            failures++;
        }
        if (!demo || M * N == 0)
            continue;
        /* violation 1: one element off by 1 + |value| (the bound is below 2^-7 |y| + 2^-18 K here) */
        const int64_t victim = random_below(M * N);
        const float good = moe_ref_load(dtype, y, victim);
        moe_ref_store(dtype, y, victim, good + 1.0f + fabsf(good));
        bad = moe_ref_check_gemm_fwd_post(&p, x, w, NULL, y, message, sizeof message);
        printf("test_contracts: injected y[%" PRId64 "] += 1 + |y| (%s, mode %d): checker says: %s\n",
               victim, moe_dtype_name(dtype), mode, message);
        if (bad != 1 || strncmp(message, "fwd_within_bound: ", 18) != 0) {
            fprintf(stderr, "test_contracts: FAIL: the wrong element was not reported as one fwd_within_bound "
                    "violation (%ld)\n", bad);
            failures++;
        }
        /* violation 2: the element left unwritten (NaN poison) */
        moe_ref_store(dtype, y, victim, NAN);
        bad = moe_ref_check_gemm_fwd_post(&p, x, w, NULL, y, message, sizeof message);
        if (bad != 1 || strncmp(message, "fwd_within_bound: ", 18) != 0) {
            fprintf(stderr, "test_contracts: FAIL: a NaN element was not reported (%ld)\n", bad);
            failures++;
        }
        moe_ref_store(dtype, y, victim, good);
    }
    /* outside the behaviour: the checker must refuse rather than pass */
    const moe_gemm_problem acc = {.op = "test_contracts", .num_tokens = T, .topk = k, .num_experts = E,
                                  .rows = M, .N = N, .K = K, .m_sizes = m_sizes, .gather_indices = gather,
                                  .dtype = dtype, .dw_dtype = dtype, .accumulate = 1};
    if (moe_ref_check_gemm_fwd_post(&acc, x, w, NULL, y, message, sizeof message) != -1) {
        fprintf(stderr, "test_contracts: FAIL: the checker accepted a problem outside its behaviour\n");
        failures++;
    }
    free(topk_ids);
    free(m_sizes);
    free(gather);
    free(x);
    free(w);
    free(y);
}

int main(int argc, char **argv)
{
    const uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 20240605u;
    const moe_dtype dtypes[] = {MOE_F32, MOE_F16, MOE_BF16};
    long cases = 0;
    for (int d = 0; d < 3; d++)
        for (uint64_t i = 0; i < 200; i++, cases++)
            run_case(seed + i, dtypes[d], i == 0 || i == 7);
    if (failures) {
        fprintf(stderr, "test_contracts: %ld failures (seed %" PRIu64 ")\n", failures, seed);
        return 1;
    }
    printf("test_contracts: ok: fwd_within_bound held on %ld random problems x 4 modes; the injected "
           "violations were caught\n", cases);
    return 0;
}
