/* Run-time checking of the ACSL float postconditions WP does not prove (specs/README.md): runs the four
 * naive grouped GEMM kernels (ref/gemm_naive.c: fwd, dX, dW, topk-weight gradient) on random routings, in
 * every mode each takes (permute_x, permute_y, topk weights, reduce_topk, accumulate) and every dtype (dW and the
 * topk-weight gradient also into fp32 results, dw_fp32), and checks each one's clause (`fwd_within_bound`,
 * `dx_within_bound` / `dx_reduce_within_bound`, `dw_within_bound`, `topk_grad_within_bound`) with the
 * checkers of tests/contract_check.c, written to mirror the ACSL of moe_ref.h / specs/gemm.acsl.  Outputs
 * start as NaN (with accumulate: random, and the checker gets a copy of the old values), so an element the
 * kernel leaves unwritten is a violation.  Then feeds each checker
 * deliberately wrong outputs (one element off by far more than the bound; one element NaN) and expects it
 * to report exactly that element under the clause's name: a contract violation being caught.
 *
 * Runs on one OpenMP thread unless OMP_NUM_THREADS is set (results do not depend on the thread count;
 * test_threads covers that): 19200 tiny kernel calls (the modes without accumulate) took 30 s with the
 * default thread count on the loaded 2-core build machine, 0.2 s on one thread.
 *
 * Usage: test_contracts [seed] */
#include "contract_check.h"
#include "alloc.h"

#include <inttypes.h>
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
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

/* Fills count elements of a dtype tensor with values uniform in [-1, 1), rounded to the dtype. */
static void *random_tensor(moe_dtype dtype, int64_t count)
{
    void *t = xcalloc((size_t)count, moe_dtype_size(dtype));
    for (int64_t i = 0; i < count; i++)
        moe_ref_store(dtype, t, i, (float)((double)random_below(1 << 20) / (1 << 19) - 1.0));
    return t;
}

enum { PERMUTE_X = 1, PERMUTE_Y = 2, WEIGHTS = 4, REDUCE_TOPK = 8, ACCUMULATE = 16 };

/* The tensors of one random problem, and the roles the kernels' arguments take from them. */
enum role { ROLE_X, ROLE_W, ROLE_DY, ROLE_WEIGHTS };

typedef moe_status (*kernel_fn)(const moe_gemm_problem *p, const void *a, const void *b, const void *c,
                                void *out);
typedef long (*check_fn)(const moe_gemm_problem *p, const void *a, const void *b, const void *c,
                         const void *out, const void *out_before, char *message, size_t capacity);

/* One naive kernel, its three inputs (in argument order), the option bits it takes, and its checker. */
typedef struct {
    const char *name;
    kernel_fn run;
    check_fn check;
    enum role inputs[3];
    unsigned options;
} gemm_op;

static const gemm_op ops[] = {
    {"fwd", moe_ref_gemm_fwd_naive, moe_ref_check_gemm_fwd_post, {ROLE_X, ROLE_W, ROLE_WEIGHTS},
     PERMUTE_X | PERMUTE_Y | WEIGHTS | ACCUMULATE},
    {"dx", moe_ref_gemm_dx_naive, moe_ref_check_gemm_dx_post, {ROLE_DY, ROLE_W, ROLE_WEIGHTS},
     PERMUTE_X | PERMUTE_Y | WEIGHTS | REDUCE_TOPK | ACCUMULATE},
    {"dw", moe_ref_gemm_dw_naive, moe_ref_check_gemm_dw_post, {ROLE_X, ROLE_DY, ROLE_WEIGHTS},
     PERMUTE_X | PERMUTE_Y | WEIGHTS | ACCUMULATE},
    {"topk_grad", moe_ref_gemm_topk_weights_grad, moe_ref_check_gemm_topk_grad_post, {ROLE_X, ROLE_W, ROLE_DY},
     PERMUTE_X | PERMUTE_Y | ACCUMULATE},
};
enum { NUM_OPS = sizeof ops / sizeof ops[0] };

/* The clause an op's checker reports for problem p. */
static const char *clause_of(const gemm_op *op, const moe_gemm_problem *p)
{
    if (op->run == moe_ref_gemm_fwd_naive)
        return "fwd_within_bound";
    if (op->run == moe_ref_gemm_dx_naive)
        return p->reduce_topk ? "dx_reduce_within_bound" : "dx_within_bound";
    return op->run == moe_ref_gemm_dw_naive ? "dw_within_bound" : "topk_grad_within_bound";
}

/* Elements of the op's output and their dtype. */
static int64_t output_count(const gemm_op *op, const moe_gemm_problem *p, moe_dtype *dtype)
{
    *dtype = p->dtype;
    if (op->run == moe_ref_gemm_fwd_naive)
        return p->rows * p->N;
    if (op->run == moe_ref_gemm_dx_naive)
        return (p->reduce_topk ? p->num_tokens : p->rows) * p->K;
    *dtype = p->dw_dtype;
    return op->run == moe_ref_gemm_dw_naive ? p->num_experts * p->N * p->K : p->rows;
}

/* Requires the checker to report exactly one violation, of `clause`, at output element `victim` (flat
 * index): the message must start "CLAUSE: element VICTIM,". */
static void expect_one(const char *what, long bad, const char *clause, int64_t victim, const char *message)
{
    char expected[96];
    const int length = snprintf(expected, sizeof expected, "%s: element %" PRId64 ",", clause, victim);
    if (bad != 1 || strncmp(message, expected, (size_t)length) != 0) {
        fprintf(stderr, "test_contracts: FAIL: %s was not reported as one %s violation (%ld): %s\n", what,
                clause, bad, message);
        failures++;
    }
}

/* Runs op on p in one mode, checks its clause, and (with `demo`) injects the two violations. */
static void run_op(uint64_t seed, const gemm_op *op, const moe_gemm_problem *p, void *const tensors[4],
                   unsigned mode, int demo)
{
    static int shown[NUM_OPS][3]; /* one printed detection per op and dtype, in the op's fullest mode */
    const void *args[3];
    for (int i = 0; i < 3; i++)
        args[i] = op->inputs[i] == ROLE_WEIGHTS && !(mode & WEIGHTS) ? NULL : tensors[op->inputs[i]];
    moe_dtype out_dtype;
    const int64_t count = output_count(op, p, &out_dtype);
    /* With accumulate the output starts random (kept in `before`), else poisoned with NaN: an element the
     * kernel leaves unwritten fails the clause. */
    void *out = (mode & ACCUMULATE) ? random_tensor(out_dtype, count)
                                    : xcalloc((size_t)count, moe_dtype_size(out_dtype));
    void *before = NULL;
    if (mode & ACCUMULATE) {
        before = xcalloc((size_t)count, moe_dtype_size(out_dtype));
        memcpy(before, out, (size_t)count * moe_dtype_size(out_dtype));
    } else {
        for (int64_t i = 0; i < count; i++)
            moe_ref_store(out_dtype, out, i, NAN);
    }
    const char *clause = clause_of(op, p);
    char message[320];
    if (op->run(p, args[0], args[1], args[2], out) != MOE_OK) {
        fprintf(stderr, "test_contracts: FAIL: %s (seed %" PRIu64 "): %s\n", op->name, seed, moe_last_error());
        failures++;
        free(out);
        free(before);
        return;
    }
    long bad = op->check(p, args[0], args[1], args[2], out, before, message, sizeof message);
    if (bad != 0) {
        fprintf(stderr, "test_contracts: FAIL: %s seed %" PRIu64 " %s mode %u: %ld violations, first: %s\n",
                op->name, seed, moe_dtype_name(p->dtype), mode, bad, message);
        failures++;
    }
    if (demo && count > 0) {
        /* violation 1: one element off by 1 + |value| (every bound here is below 2^-7 |value| + 2^-9) */
        const int64_t victim = random_below(count);
        const float good = moe_ref_load(out_dtype, out, victim);
        moe_ref_store(out_dtype, out, victim, good + 1.0f + fabsf(good));
        bad = op->check(p, args[0], args[1], args[2], out, before, message, sizeof message);
        expect_one("an element off by 1 + |value|", bad, clause, victim, message);
        const int d = p->dtype == MOE_F32 ? 0 : p->dtype == MOE_F16 ? 1 : 2;
        if (mode == op->options && !shown[op - ops][d]++)
            printf("test_contracts: injected %s element %" PRId64 " += 1 + |value| (%s, mode %u): checker "
                   "says: %s\n", op->name, victim, moe_dtype_name(p->dtype), mode, message);
        /* violation 2: the element NaN (as if unwritten) */
        moe_ref_store(out_dtype, out, victim, NAN);
        bad = op->check(p, args[0], args[1], args[2], out, before, message, sizeof message);
        expect_one("a NaN element", bad, clause, victim, message);
    }
    /* accumulate without the output before the call: the checker must refuse rather than pass */
    if ((mode & ACCUMULATE) && op->check(p, args[0], args[1], args[2], out, NULL, message, sizeof message) != -1) {
        fprintf(stderr, "test_contracts: FAIL: the %s checker accepted accumulate without the old output\n",
                op->name);
        failures++;
    }
    free(out);
    free(before);
}

/* One random problem, every op in every mode it takes; with `demo`, also the deliberate violations. */
static void run_case(uint64_t seed, moe_dtype dtype, int demo)
{
    rng_state = seed;
    const int64_t E = 1 + random_below(6), k = 1 + random_below(E < 3 ? E : 3), T = random_below(9);
    const int64_t N = 1 + random_below(7), K = random_below(40), M = T * k;
    const moe_dtype dw_dtype = random_below(2) ? MOE_F32 : dtype; /* dw_fp32 half of the time */
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
    /* x [M][K] (enough for the T rows of permute_x), w [E][N][K], dy [M][N], topk weights [M] */
    void *tensors[4] = {random_tensor(dtype, M * K), random_tensor(dtype, E * N * K),
                        random_tensor(dtype, M * N), random_tensor(dtype, M)};
    for (int o = 0; o < NUM_OPS; o++)
        for (unsigned mode = 0; mode < 32; mode++) {
            if ((mode & ~ops[o].options) != 0)
                continue;
            const moe_gemm_problem p = {.op = "test_contracts", .num_tokens = T, .topk = k, .num_experts = E,
                                        .rows = M, .N = N, .K = K, .m_sizes = m_sizes, .gather_indices = gather,
                                        .dtype = dtype, .dw_dtype = dw_dtype, .permute_x = (mode & PERMUTE_X) != 0,
                                        .permute_y = (mode & PERMUTE_Y) != 0,
                                        .reduce_topk = (mode & REDUCE_TOPK) != 0,
                                        .accumulate = (mode & ACCUMULATE) != 0,
                                        .ref_scratch_bytes = MOE_REF_DEFAULT_SCRATCH_BYTES};
            run_op(seed, &ops[o], &p, tensors, mode, demo);
        }
    free(topk_ids);
    free(m_sizes);
    free(gather);
    for (int i = 0; i < 4; i++)
        free(tensors[i]);
}

int main(int argc, char **argv)
{
    const uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 20240605u;
#ifdef _OPENMP
    if (getenv("OMP_NUM_THREADS") == NULL)
        omp_set_num_threads(1);
#endif
    const moe_dtype dtypes[] = {MOE_F32, MOE_F16, MOE_BF16};
    long cases = 0;
    for (int d = 0; d < 3; d++)
        for (uint64_t i = 0; i < 200; i++, cases++)
            run_case(seed + i, dtypes[d], i < 8);
    if (failures) {
        fprintf(stderr, "test_contracts: %ld failures (seed %" PRIu64 ")\n", failures, seed);
        return 1;
    }
    printf("test_contracts: ok: fwd_within_bound (16 modes), dx_within_bound and dx_reduce_within_bound "
           "(32 modes), dw_within_bound (16 modes), topk_grad_within_bound (8 modes) held on %ld random "
           "problems; every injected violation was caught\n", cases);
    return 0;
}
