/* Thread-count independence (moe_backend.h kernel contract: "results do not depend on the thread count
 * or on scheduling"): every op gives bitwise identical outputs with 1 and 2 OpenMP threads.
 *
 * Ops: fwd, dx (with/without reduce_topk), dw (with/without dw_fp32), topk_weights_grad, bwd (dx+dw+dtopk,
 * dx_only, dw_only); every mode (plain, permute_x, permute_y, both) x accumulate on/off, with topk
 * weights on in half of them (each mode sees weights on and off), x dtype f32/f16/bf16, on a moderate
 * random problem (T=64, k=4, E=8, N=40, K=56) and another with every third expert empty, and (one
 * dtype each) on small edge problems where threads outnumber rows (T=0, T=1, E >> T).
 *
 * Without OpenMP the library is single-threaded: the test still runs every op once (status checks)
 * and says that the comparison is trivial.
 *
 * Usage: test_threads [seed] */
#include "moe.h"
#include "oracle.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "alloc.h"
#include "check.h"

#ifdef _OPENMP
static const int thread_counts[] = {1, 2};
#else
static const int thread_counts[] = {1};
#endif
enum { N_COUNTS = (int)(sizeof thread_counts / sizeof thread_counts[0]) };

static void set_threads(int n)
{
#ifdef _OPENMP
    omp_set_dynamic(0);
    omp_set_num_threads(n);
    CHECK(omp_get_max_threads() == n, "omp_set_num_threads(%d) gave %d threads", n, omp_get_max_threads());
#else
    (void)n;
#endif
}

static uint64_t seed;

typedef struct problem {
    const char *name;
    int64_t T, k, E, M, N, K;
    int64_t *m_sizes, *gather;
    moe_dtype dtype;
    void *x, *w, *dy, *tw;
} problem;

enum op { OP_FWD, OP_DX, OP_DW, OP_TOPK, OP_BWD };
static const char *const OP_NAMES[] = {"fwd", "dx", "dw", "topk_weights_grad", "bwd"};

typedef struct combo {
    enum op op;
    int mode, weights, accumulate, reduce, dw_fp32, variant;
} combo;

static const char *describe(const problem *p, const combo *c)
{
    static char text[400];
    static const char *variants[] = {"dx+dw", "dx_only", "dw_only"};
    snprintf(text, sizeof text,
             "op=%s problem=\"%s\" T=%" PRId64 " k=%" PRId64 " E=%" PRId64 " N=%" PRId64 " K=%" PRId64
             " dtype=%s permute_x=%d permute_y=%d weights=%d accumulate=%d reduce_topk=%d dw_fp32=%d%s%s seed=%llu",
             OP_NAMES[c->op], p->name, p->T, p->k, p->E, p->N, p->K, moe_dtype_name(p->dtype), c->mode & 1,
             c->mode >> 1, c->weights, c->accumulate, c->reduce, c->dw_fp32, c->op == OP_BWD ? " variant=" : "",
             c->op == OP_BWD ? variants[c->variant] : "", (unsigned long long)seed);
    return text;
}

/* Output sizes (bytes) of a call: [0] dx or y or dtopk (single ops), [1] dw, [2] dtopk (bwd). */
typedef struct outputs {
    size_t bytes[3];
    unsigned char *buf[3];
} outputs;

static void output_sizes(const problem *p, const combo *c, size_t bytes[3])
{
    const size_t es = moe_dtype_size(p->dtype), dws = c->dw_fp32 ? 4 : es;
    const size_t dx_bytes = (size_t)((c->reduce ? p->T : p->M) * p->K) * es;
    bytes[0] = bytes[1] = bytes[2] = 0;
    switch (c->op) {
    case OP_FWD: bytes[0] = (size_t)(p->M * p->N) * es; break;
    case OP_DX: bytes[0] = dx_bytes; break;
    case OP_DW: bytes[0] = (size_t)(p->E * p->N * p->K) * dws; break;
    case OP_TOPK: bytes[0] = (size_t)p->M * dws; break;
    case OP_BWD:
        bytes[0] = dx_bytes;
        bytes[1] = (size_t)(p->E * p->N * p->K) * dws;
        bytes[2] = (size_t)p->M * dws;
        break;
    }
}

static moe_status run(const problem *p, const combo *c, unsigned char *const out[3])
{
    moe_gemm_options o;
    memset(&o, 0, sizeof o);
    o.dtype = p->dtype;
    o.permute_x = c->mode & 1;
    o.permute_y = c->mode >> 1;
    o.accumulate = c->accumulate;
    o.reduce_topk = c->reduce;
    o.dw_fp32 = c->dw_fp32;
    o.dx_only = c->op == OP_BWD && c->variant == 1;
    o.dw_only = c->op == OP_BWD && c->variant == 2;
    const moe_routing r = {p->T, p->k, p->E, p->m_sizes, p->gather};
    const void *tw = c->weights ? p->tw : NULL;
    switch (c->op) {
    case OP_FWD: return moe_gemm_fwd(MOE_BACKEND_REF, &r, p->N, p->K, p->x, p->w, tw, out[0], &o);
    case OP_DX: return moe_gemm_dx(MOE_BACKEND_REF, &r, p->N, p->K, p->dy, p->w, tw, out[0], &o);
    case OP_DW: return moe_gemm_dw(MOE_BACKEND_REF, &r, p->N, p->K, p->x, p->dy, tw, out[0], &o);
    case OP_TOPK: return moe_gemm_topk_weights_grad(MOE_BACKEND_REF, &r, p->N, p->K, p->x, p->w, p->dy, out[0], &o);
    case OP_BWD:
        return moe_gemm_bwd(MOE_BACKEND_REF, &r, p->N, p->K, p->x, p->w, p->dy, tw, out[0], out[1],
                            c->weights ? out[2] : NULL, &o);
    }
    return MOE_OK;
}

/* One combination at every thread count; outputs must agree bit for bit with the 1-thread run. */
static void compare_counts(const problem *p, const combo *c, oracle_rng *rng)
{
    size_t bytes[3];
    output_sizes(p, c, bytes);
    unsigned char *old[3], *first[3], *out[3];
    for (int i = 0; i < 3; i++) {
        old[i] = xmalloc(bytes[i]), first[i] = xmalloc(bytes[i]), out[i] = xmalloc(bytes[i]);
        /* old contents: data (read with accumulate) or NaN-ish bytes (overwritten otherwise) */
        for (size_t b = 0; b < bytes[i]; b++)
            old[i][b] = c->accumulate ? (unsigned char)(oracle_rng_next(rng) & 0x3f) : 0xff;
    }
    for (int t = 0; t < N_COUNTS; t++) {
        set_threads(thread_counts[t]);
        unsigned char *const *dst = t == 0 ? first : out;
        for (int i = 0; i < 3; i++)
            memcpy(dst[i], old[i], bytes[i]);
        const moe_status st = run(p, c, dst);
        CHECK(st == MOE_OK, "%d threads: status %d (%s): %s", thread_counts[t], (int)st, moe_last_error(),
              describe(p, c));
        if (t == 0 || st != MOE_OK)
            continue;
        for (int i = 0; i < 3; i++)
            if (memcmp(first[i], out[i], bytes[i]) != 0) {
                size_t b = 0;
                while (first[i][b] == out[i][b])
                    b++;
                static const char *names[] = {"first output", "dw", "d_topk_weights"};
                CHECK(0, "%s differs between 1 and %d threads at byte %zu: %s", names[i], thread_counts[t], b,
                      describe(p, c));
            }
    }
    for (int i = 0; i < 3; i++)
        free(old[i]), free(first[i]), free(out[i]);
}

static void run_problem(problem *p, oracle_rng *rng)
{
    combo c;
    memset(&c, 0, sizeof c);
    for (c.mode = 0; c.mode < 4; c.mode++)
        for (c.accumulate = 0; c.accumulate < 2; c.accumulate++) {
            c.weights = (c.mode ^ c.accumulate) & 1; /* every mode with weights on and off */
            c.reduce = c.dw_fp32 = c.variant = 0;
            c.op = OP_FWD;
            compare_counts(p, &c, rng);
            c.op = OP_DX;
            for (c.reduce = 0; c.reduce < 2; c.reduce++)
                compare_counts(p, &c, rng);
            c.reduce = 0;
            c.op = OP_DW;
            for (c.dw_fp32 = 0; c.dw_fp32 < 2; c.dw_fp32++)
                compare_counts(p, &c, rng);
            c.dw_fp32 = 0;
            c.op = OP_TOPK; /* takes no topk weights; dw_fp32 on with accumulate */
            c.dw_fp32 = c.accumulate;
            compare_counts(p, &c, rng);
            c.dw_fp32 = 0;
            c.op = OP_BWD;
            for (c.variant = 0; c.variant < 3; c.variant++) {
                c.reduce = c.variant != 2 && c.mode == 3; /* reduce_topk once per variant that has dX */
                c.dw_fp32 = c.variant == 0 && c.accumulate;
                compare_counts(p, &c, rng);
            }
            c.variant = 0;
        }
}

static void make_problem(problem *p, const char *name, int64_t T, int64_t k, int64_t E, int64_t N, int64_t K,
                         int64_t empty_mod, moe_dtype dtype, oracle_rng *rng)
{
    memset(p, 0, sizeof *p);
    p->name = name;
    p->T = T, p->k = k, p->E = E, p->M = T * k, p->N = N, p->K = K, p->dtype = dtype;
    int64_t *ids = xmalloc((size_t)p->M * 8);
    for (int64_t s = 0; s < p->M; s++) {
        int64_t e = (int64_t)oracle_rng_below(rng, (uint64_t)E);
        if (empty_mod > 1 && e % empty_mod == 0) /* leave every empty_mod-th expert empty */
            e = (e + 1) % E;
        ids[s] = e;
    }
    p->m_sizes = xmalloc((size_t)E * 8), p->gather = xmalloc((size_t)p->M * 8);
    const moe_status st = moe_routing_from_topk(T, k, E, ids, p->m_sizes, p->gather, NULL);
    CHECK(st == MOE_OK, "routing of %s: %s", name, moe_last_error());
    free(ids);
    const size_t es = moe_dtype_size(dtype);
    p->x = xmalloc((size_t)(p->M * K) * es), p->w = xmalloc((size_t)(E * N * K) * es);
    p->dy = xmalloc((size_t)(p->M * N) * es), p->tw = xmalloc((size_t)p->M * es);
    oracle_fill(rng, dtype, p->x, p->M * K, 0);
    oracle_fill(rng, dtype, p->w, E * N * K, 0);
    oracle_fill(rng, dtype, p->dy, p->M * N, 0);
    oracle_fill(rng, dtype, p->tw, p->M, 0);
}

static void free_problem(problem *p)
{
    free(p->m_sizes), free(p->gather), free(p->x), free(p->w), free(p->dy), free(p->tw);
}

int main(int argc, char **argv)
{
    seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 20261126;
    printf("seed %llu\n", (unsigned long long)seed);
#ifdef _OPENMP
    printf("OpenMP: comparing 1 and 2 threads\n");
#else
    printf("OpenMP disabled: the library is single-threaded; running every op on 1 thread only, the "
           "comparison is trivial\n");
#endif
    oracle_rng rng = {seed};
    for (int dt = 0; dt < 3; dt++) {
        static const struct {
            const char *name;
            int64_t T, k, E, N, K, empty_mod;
        } shapes[] = {
            {"moderate", 64, 4, 8, 40, 56, 0},
            {"moderate, every 3rd expert empty", 48, 2, 9, 24, 17, 3},
            {"T=1", 1, 2, 3, 9, 5, 0},
            {"E>>T", 3, 2, 64, 7, 11, 0},
            {"T=0", 0, 3, 4, 6, 5, 0},
        };
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            /* the moderate problems in every dtype; each small edge problem in one dtype (rotating), which
             * keeps the number of 2-thread calls (slow on a loaded 2-core machine) down */
            if (s >= 2 && (int)(s % 3) != dt)
                continue;
            problem p;
            make_problem(&p, shapes[s].name, shapes[s].T, shapes[s].k, shapes[s].E, shapes[s].N, shapes[s].K,
                         shapes[s].empty_mod, (moe_dtype)dt, &rng);
            const long before = failures;
            run_problem(&p, &rng);
            printf("%-4s %-34s T=%2" PRId64 " k=%" PRId64 " E=%2" PRId64 " N=%2" PRId64 " K=%2" PRId64 ": %s\n",
                   moe_dtype_name(p.dtype), p.name, p.T, p.k, p.E, p.N, p.K, failures == before ? "ok" : "FAILED");
            free_problem(&p);
        }
    }
    printf("%ld checks, %ld failures\n", checks, failures);
    if (failures) {
        printf("FAILED (seed %llu)\n", (unsigned long long)seed);
        return 1;
    }
    return 0;
}
