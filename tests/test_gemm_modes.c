/* Deterministic coverage of the grouped GEMM (SEMANTICS section 2) through the public API, reference
 * backend, checked against the float64 oracle (oracle/oracle.h):
 *
 *   every op      fwd, dx, dw, topk_weights_grad, bwd (dx+dw+dtopk, dx_only, dw_only)
 *   x every mode  plain, permute_x, permute_y, permute_x+permute_y
 *   x dtype       f32, f16, bf16
 *   x topk weights on/off  x accumulate on/off  x reduce_topk (dx, bwd)  x dw_fp32 (dw, dtopk, bwd)
 *   on edge routings (empty experts first / last / alternating, all slots on one expert, T = 0, T = 1,
 *   topk = 1, topk = E, E >> T) and N, K in {0, 1, 3, 7, 13}.
 *
 * Outputs are poisoned with NaN first (with accumulate: filled with old values), so an element the op
 * does not write fails.  Two input distributions:
 *   dist 1 (small powers of two and zero): every float32 operation is exact, so each output must be
 *          EXACTLY the oracle value rounded once to the output dtype;
 *   dist 0 (uniform in [-1, 1)): each output must be within the oracle's derived bound.
 * Also: experts with m_e == 0 get dW rows of exact +0 (unchanged with accumulate); moe_gemm_bwd equals
 * the single ops bit for bit and leaves the outputs it does not compute untouched (or accepts NULL);
 * a routing without gather_indices is accepted (and gives the same result) when nothing needs it.
 *
 * With -DMOE_TEST_BLOCKED the naive and blocked reference twins (ref/moe_ref.h) are also called
 * directly on every case above and on larger problems with group sizes around tile boundaries, and
 * must agree bit for bit.
 *
 * The matrix runs on one OpenMP thread unless OMP_NUM_THREADS is set (test_threads covers thread counts).
 *
 * Usage: test_gemm_modes [seed]    (each failure prints one line with the case that reproduces it) */
#include "moe.h"
#include "oracle.h"
#ifdef MOE_TEST_BLOCKED
#include "moe_ref.h"
#endif

#include <inttypes.h>
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "check.h"

static uint64_t seed;
static oracle_rng rng;

/* ---- one problem: routing, dims, dtype, inputs ---- */

typedef struct setup {
    const char *routing_name;
    int64_t T, k, E, M, N, K;
    const int64_t *m_sizes, *gather;
    moe_dtype dtype;
    int dist;
    void *x, *w, *dy, *tw; /* x has M rows (permute_x reads the first T) */
    /* scratch outputs, big enough for every op */
    void *out, *old, *out2, *out3, *old2, *old3;
    double *value, *bound;
} setup;

typedef struct combo {
    int mode; /* bit 0 permute_x, bit 1 permute_y */
    int weights, accumulate, reduce, dw_fp32;
    int variant; /* bwd: 0 dx+dw, 1 dx_only, 2 dw_only */
    int null_gather;
} combo;

static const char *describe(const setup *s, const combo *c, const char *op)
{
    static char text[512];
    static const char *modes[] = {"plain", "permute_x", "permute_y", "permute_x+permute_y"};
    static const char *variants[] = {"dx+dw", "dx_only", "dw_only"};
    snprintf(text, sizeof text,
             "op=%s routing=\"%s\" T=%" PRId64 " k=%" PRId64 " E=%" PRId64 " N=%" PRId64 " K=%" PRId64
             " dtype=%s dist=%d mode=%s weights=%d accumulate=%d reduce_topk=%d dw_fp32=%d%s%s%s seed=%llu",
             op, s->routing_name, s->T, s->k, s->E, s->N, s->K, moe_dtype_name(s->dtype), s->dist, modes[c->mode],
             c->weights, c->accumulate, c->reduce, c->dw_fp32, strcmp(op, "bwd") == 0 ? " variant=" : "",
             strcmp(op, "bwd") == 0 ? variants[c->variant] : "", c->null_gather ? " gather=NULL" : "",
             (unsigned long long)seed);
    return text;
}

static moe_gemm_options options_of(const setup *s, const combo *c)
{
    moe_gemm_options o;
    memset(&o, 0, sizeof o);
    o.dtype = s->dtype;
    o.permute_x = c->mode & 1;
    o.permute_y = (c->mode >> 1) & 1;
    o.accumulate = c->accumulate;
    return o;
}

static moe_routing routing_of(const setup *s, const combo *c)
{
    moe_routing r = {s->T, s->k, s->E, s->m_sizes, c->null_gather ? NULL : s->gather};
    return r;
}

/* Poisons the output (or, with accumulate, fills it with old values of the setup's distribution) and
 * copies it to `old`. */
static void prepare_output(const setup *s, moe_dtype dtype, void *out, void *old, int64_t count, int accumulate)
{
    if (accumulate)
        oracle_fill(&rng, dtype, out, count, s->dist);
    else
        oracle_poison(dtype, out, count);
    memcpy(old, out, (size_t)count * moe_dtype_size(dtype));
}

static double round_to(moe_dtype dtype, float v)
{
    switch (dtype) {
    case MOE_F16: return (double)moe_f16_to_f32(moe_f32_to_f16(v));
    case MOE_BF16: return (double)moe_bf16_to_f32(moe_f32_to_bf16(v));
    case MOE_E4M3: return (double)moe_e4m3_to_f32(moe_f32_to_e4m3(v));
    case MOE_E5M2: return (double)moe_e5m2_to_f32(moe_f32_to_e5m2(v));
    case MOE_F32: break;
    }
    return (double)v;
}

/* Compares an output with the oracle: exact (dist 1) or within the bound.  One line per failing call. */
static void check_against_oracle(const setup *s, const combo *c, const char *op, const char *label, moe_dtype dtype,
                                 const void *out, const double *value, const double *bound, int64_t count)
{
    if (s->dist == 1) {
        for (int64_t i = 0; i < count; i++) {
            const float as_float = (float)value[i];
            if ((double)as_float != value[i]) {
                CHECK(0, "%s[%" PRId64 "]: oracle value %.17g is not exact in float32 (test assumption broken): %s",
                      label, i, value[i], describe(s, c, op));
                return;
            }
            const double want = round_to(dtype, as_float), got = oracle_load(dtype, out, i);
            if (!(got == want)) {
                CHECK(0, "%s[%" PRId64 "] = %.9g, expected exactly %.9g (of %" PRId64 " elements): %s", label, i, got,
                      want, count, describe(s, c, op));
                return;
            }
        }
        checks++;
        return;
    }
    if (oracle_compare(label, dtype, out, value, bound, count, NULL, 0, NULL) == 0) {
        checks++;
        return;
    }
    for (int64_t i = 0; i < count; i++) {
        const double got = oracle_load(dtype, out, i);
        if (!(fabs(got - value[i]) <= bound[i]) &&
            !(isinf(got) && (got > 0) == (value[i] > 0) &&
              fabs(value[i]) + bound[i] >= oracle_overflow_threshold(dtype))) {
            CHECK(0, "%s[%" PRId64 "] = %.9g, expected %.17g +- %.3g (of %" PRId64 " elements): %s", label, i, got,
                  value[i], bound[i], count, describe(s, c, op));
            return;
        }
    }
}

#ifdef MOE_TEST_BLOCKED
/* The validated problem the front end would hand the backend. */
static moe_gemm_problem problem_of(const setup *s, const combo *c, const moe_gemm_options *o)
{
    moe_gemm_problem p;
    memset(&p, 0, sizeof p);
    p.op = "test_gemm_modes";
    p.num_tokens = s->T;
    p.topk = s->k;
    p.num_experts = s->E;
    p.rows = s->M;
    p.N = s->N;
    p.K = s->K;
    p.m_sizes = s->m_sizes;
    p.gather_indices = c->null_gather ? NULL : s->gather;
    p.dtype = s->dtype;
    p.dw_dtype = o->dw_fp32 ? MOE_F32 : s->dtype;
    p.permute_x = o->permute_x;
    p.permute_y = o->permute_y;
    p.reduce_topk = o->reduce_topk;
    p.accumulate = o->accumulate;
    p.ref_scratch_bytes = o->ref_scratch_bytes ? o->ref_scratch_bytes : MOE_REF_DEFAULT_SCRATCH_BYTES;
    return p;
}

enum { TWIN_FWD, TWIN_DX, TWIN_DW, TWIN_TOPK };

/* Runs the naive and the blocked twin on the same old contents; they must agree bit for bit. */
static void check_twins(const setup *s, const combo *c, const moe_gemm_options *o, int which, const void *old,
                        int64_t count, moe_dtype out_dtype)
{
    static const char *names[] = {"fwd", "dx", "dw", "topk_weights_grad"};
    const moe_gemm_problem p = problem_of(s, c, o);
    const size_t bytes = (size_t)count * moe_dtype_size(out_dtype);
    const void *weights = c->weights ? s->tw : NULL;
    void *a = xmalloc(bytes), *b = xmalloc(bytes);
    memcpy(a, old, bytes);
    memcpy(b, old, bytes);
    moe_status sa = MOE_OK, sb = MOE_OK;
    switch (which) {
    case TWIN_FWD:
        sa = moe_ref_gemm_fwd_naive(&p, s->x, s->w, weights, a);
        sb = moe_ref_gemm_fwd_blocked(&p, s->x, s->w, weights, b);
        break;
    case TWIN_DX:
        sa = moe_ref_gemm_dx_naive(&p, s->dy, s->w, weights, a);
        sb = moe_ref_gemm_dx_blocked(&p, s->dy, s->w, weights, b);
        break;
    case TWIN_DW:
        sa = moe_ref_gemm_dw_naive(&p, s->x, s->dy, weights, a);
        sb = moe_ref_gemm_dw_blocked(&p, s->x, s->dy, weights, b);
        break;
    default:
        sa = moe_ref_gemm_topk_weights_grad(&p, s->x, s->w, s->dy, a);
        sb = moe_ref_gemm_topk_weights_grad_blocked(&p, s->x, s->w, s->dy, b);
        break;
    }
    CHECK(sa == MOE_OK && sb == MOE_OK, "twins %s: naive %d, blocked %d (%s): %s", names[which], (int)sa, (int)sb,
          moe_last_error(), describe(s, c, names[which]));
    const int64_t i = sa == MOE_OK && sb == MOE_OK ? first_difference(a, b, count, moe_dtype_size(out_dtype)) : -1;
    if (i >= 0) {
        CHECK(0, "twins %s differ at element %" PRId64 ": naive %.9g, blocked %.9g: %s", names[which], i,
              oracle_load(out_dtype, a, i), oracle_load(out_dtype, b, i), describe(s, c, names[which]));
    } else {
        checks++;
    }
    free(a);
    free(b);
}
#endif

/* ---- the single ops ---- */

static void run_fwd(setup *s, const combo *c)
{
    moe_gemm_options o = options_of(s, c);
    const moe_routing r = routing_of(s, c);
    const void *weights = c->weights ? s->tw : NULL;
    const int64_t count = s->M * s->N;
    prepare_output(s, s->dtype, s->out, s->old, count, c->accumulate);
    moe_status st = moe_gemm_fwd(MOE_BACKEND_REF, &r, s->N, s->K, s->x, s->w, weights, s->out, &o);
    CHECK(st == MOE_OK, "moe_gemm_fwd = %d (%s): %s", (int)st, moe_last_error(), describe(s, c, "fwd"));
    if (st != MOE_OK)
        return;
    oracle_gemm_fwd(&r, s->N, s->K, s->x, s->w, weights, s->old, &o, s->value, s->bound);
    check_against_oracle(s, c, "fwd", "y", s->dtype, s->out, s->value, s->bound, count);
#ifdef MOE_TEST_BLOCKED
    check_twins(s, c, &o, TWIN_FWD, s->old, count, s->dtype);
#endif
}

static void run_dx(setup *s, const combo *c)
{
    moe_gemm_options o = options_of(s, c);
    o.reduce_topk = c->reduce;
    const moe_routing r = routing_of(s, c);
    const void *weights = c->weights ? s->tw : NULL;
    const int64_t count = (c->reduce ? s->T : s->M) * s->K;
    prepare_output(s, s->dtype, s->out, s->old, count, c->accumulate);
    moe_status st = moe_gemm_dx(MOE_BACKEND_REF, &r, s->N, s->K, s->dy, s->w, weights, s->out, &o);
    CHECK(st == MOE_OK, "moe_gemm_dx = %d (%s): %s", (int)st, moe_last_error(), describe(s, c, "dx"));
    if (st != MOE_OK)
        return;
    oracle_gemm_dx(&r, s->N, s->K, s->dy, s->w, weights, s->old, &o, s->value, s->bound);
    check_against_oracle(s, c, "dx", "dx", s->dtype, s->out, s->value, s->bound, count);
#ifdef MOE_TEST_BLOCKED
    check_twins(s, c, &o, TWIN_DX, s->old, count, s->dtype);
#endif
}

/* Experts with m_e == 0: dW rows exactly +0, or unchanged with accumulate. */
static void check_empty_experts(const setup *s, const combo *c, const char *op, moe_dtype dtype, const void *dw,
                                const void *old)
{
    const size_t es = moe_dtype_size(dtype);
    const size_t row_bytes = (size_t)(s->N * s->K) * es;
    for (int64_t e = 0; e < s->E; e++) {
        if (s->m_sizes[e] != 0 || row_bytes == 0)
            continue;
        const unsigned char *got = (const unsigned char *)dw + (size_t)e * row_bytes;
        int ok = 1;
        if (c->accumulate)
            ok = memcmp(got, (const unsigned char *)old + (size_t)e * row_bytes, row_bytes) == 0;
        else
            for (size_t i = 0; i < row_bytes; i++)
                ok &= got[i] == 0;
        CHECK(ok, "dw[%" PRId64 "] of an empty expert is not %s: %s", e,
              c->accumulate ? "unchanged" : "exact +0", describe(s, c, op));
    }
}

static void run_dw(setup *s, const combo *c)
{
    moe_gemm_options o = options_of(s, c);
    o.dw_fp32 = c->dw_fp32;
    const moe_routing r = routing_of(s, c);
    const void *weights = c->weights ? s->tw : NULL;
    const moe_dtype out_dtype = c->dw_fp32 ? MOE_F32 : s->dtype;
    const int64_t count = s->E * s->N * s->K;
    prepare_output(s, out_dtype, s->out, s->old, count, c->accumulate);
    moe_status st = moe_gemm_dw(MOE_BACKEND_REF, &r, s->N, s->K, s->x, s->dy, weights, s->out, &o);
    CHECK(st == MOE_OK, "moe_gemm_dw = %d (%s): %s", (int)st, moe_last_error(), describe(s, c, "dw"));
    if (st != MOE_OK)
        return;
    oracle_gemm_dw(&r, s->N, s->K, s->x, s->dy, weights, s->old, &o, s->value, s->bound);
    check_against_oracle(s, c, "dw", "dw", out_dtype, s->out, s->value, s->bound, count);
    check_empty_experts(s, c, "dw", out_dtype, s->out, s->old);
#ifdef MOE_TEST_BLOCKED
    check_twins(s, c, &o, TWIN_DW, s->old, count, out_dtype);
#endif
}

static void run_topk_grad(setup *s, const combo *c)
{
    moe_gemm_options o = options_of(s, c);
    o.dw_fp32 = c->dw_fp32;
    const moe_routing r = routing_of(s, c);
    const moe_dtype out_dtype = c->dw_fp32 ? MOE_F32 : s->dtype;
    const int64_t count = s->M;
    prepare_output(s, out_dtype, s->out, s->old, count, c->accumulate);
    moe_status st = moe_gemm_topk_weights_grad(MOE_BACKEND_REF, &r, s->N, s->K, s->x, s->w, s->dy, s->out, &o);
    CHECK(st == MOE_OK, "moe_gemm_topk_weights_grad = %d (%s): %s", (int)st, moe_last_error(),
          describe(s, c, "topk_weights_grad"));
    if (st != MOE_OK)
        return;
    oracle_gemm_topk_weights_grad(&r, s->N, s->K, s->x, s->w, s->dy, s->old, &o, s->value, s->bound);
    check_against_oracle(s, c, "topk_weights_grad", "dtopk", out_dtype, s->out, s->value, s->bound, count);
#ifdef MOE_TEST_BLOCKED
    check_twins(s, c, &o, TWIN_TOPK, s->old, count, out_dtype);
#endif
}

/* moe_gemm_bwd against the single ops: equal bits for what it computes, untouched bytes (or NULL
 * accepted) for what it does not. */
static void run_bwd(setup *s, const combo *c)
{
    const moe_routing r = routing_of(s, c);
    const void *weights = c->weights ? s->tw : NULL;
    const moe_dtype dw_dtype = c->dw_fp32 ? MOE_F32 : s->dtype;
    const int64_t dx_count = (c->reduce ? s->T : s->M) * s->K, dw_count = s->E * s->N * s->K, dt_count = s->M;
    const size_t dx_bytes = (size_t)dx_count * moe_dtype_size(s->dtype);
    const size_t dw_bytes = (size_t)dw_count * moe_dtype_size(dw_dtype);
    const size_t dt_bytes = (size_t)dt_count * moe_dtype_size(dw_dtype);
    const int want_dx = c->variant != 2, want_dw = c->variant != 1, want_dt = want_dw && c->weights;

    /* old contents of the three outputs; the single ops' results go to `out`-side copies */
    prepare_output(s, s->dtype, s->old, s->out, dx_count, c->accumulate);
    prepare_output(s, dw_dtype, s->old2, s->out2, dw_count, c->accumulate);
    prepare_output(s, dw_dtype, s->old3, s->out3, dt_count, c->accumulate);

    moe_gemm_options o = options_of(s, c);
    o.dw_fp32 = c->dw_fp32;
    moe_status st;
    /* the single ops (s->out, s->out2, s->out3 start as copies of the old contents) */
    if (want_dx) {
        o.reduce_topk = c->reduce;
        st = moe_gemm_dx(MOE_BACKEND_REF, &r, s->N, s->K, s->dy, s->w, weights, s->out, &o);
        CHECK(st == MOE_OK, "single dx = %d (%s): %s", (int)st, moe_last_error(), describe(s, c, "bwd"));
        o.reduce_topk = 0;
    }
    if (want_dw) {
        st = moe_gemm_dw(MOE_BACKEND_REF, &r, s->N, s->K, s->x, s->dy, weights, s->out2, &o);
        CHECK(st == MOE_OK, "single dw = %d (%s): %s", (int)st, moe_last_error(), describe(s, c, "bwd"));
    }
    if (want_dt) {
        st = moe_gemm_topk_weights_grad(MOE_BACKEND_REF, &r, s->N, s->K, s->x, s->w, s->dy, s->out3, &o);
        CHECK(st == MOE_OK, "single topk grad = %d (%s): %s", (int)st, moe_last_error(), describe(s, c, "bwd"));
    }

    /* bwd into fresh copies of the old contents; outputs it does not compute are passed NULL in some
     * variants and a buffer that must stay untouched in others */
    unsigned char *bdx = xmalloc(dx_bytes), *bdw = xmalloc(dw_bytes), *bdt = xmalloc(dt_bytes);
    memcpy(bdx, s->old, dx_bytes);
    memcpy(bdw, s->old2, dw_bytes);
    memcpy(bdt, s->old3, dt_bytes);
    o.reduce_topk = c->reduce;
    o.dx_only = c->variant == 1;
    o.dw_only = c->variant == 2;
    void *arg_dx = bdx, *arg_dw = bdw, *arg_dt = c->weights ? bdt : NULL;
    if (c->variant == 1 && !c->accumulate)
        arg_dw = NULL; /* dx_only: dW may be NULL; d_topk_weights given must stay untouched */
    if (c->variant == 2 && !c->accumulate)
        arg_dx = NULL; /* dw_only: dX may be NULL */
    st = moe_gemm_bwd(MOE_BACKEND_REF, &r, s->N, s->K, s->x, s->w, s->dy, weights, arg_dx, arg_dw, arg_dt, &o);
    CHECK(st == MOE_OK, "moe_gemm_bwd = %d (%s): %s", (int)st, moe_last_error(), describe(s, c, "bwd"));
    if (st == MOE_OK) {
        CHECK(memcmp(bdx, want_dx ? s->out : s->old, dx_bytes) == 0, "bwd dx %s: %s",
              want_dx ? "differs from moe_gemm_dx" : "was touched though not computed", describe(s, c, "bwd"));
        CHECK(memcmp(bdw, want_dw ? s->out2 : s->old2, dw_bytes) == 0, "bwd dw %s: %s",
              want_dw ? "differs from moe_gemm_dw" : "was touched though not computed", describe(s, c, "bwd"));
        CHECK(memcmp(bdt, want_dt ? s->out3 : s->old3, dt_bytes) == 0, "bwd d_topk_weights %s: %s",
              want_dt ? "differs from moe_gemm_topk_weights_grad" : "was touched though not computed",
              describe(s, c, "bwd"));
        if (want_dw)
            check_empty_experts(s, c, "bwd", dw_dtype, bdw, s->old2);
    }
    free(bdx);
    free(bdw);
    free(bdt);
}

/* Every option combination on one setup. */
static void run_setup(setup *s)
{
    combo c;
    memset(&c, 0, sizeof c);
    for (c.mode = 0; c.mode < 4; c.mode++)
        for (c.weights = 0; c.weights < 2; c.weights++)
            for (c.accumulate = 0; c.accumulate < 2; c.accumulate++) {
                c.reduce = c.dw_fp32 = c.variant = 0;
                /* nothing needs gather_indices in plain mode without weights: also try it absent */
                c.null_gather = c.mode == 0 && !c.weights && s->dist == 0;
                run_fwd(s, &c);
                for (c.dw_fp32 = 0; c.dw_fp32 < 2; c.dw_fp32++)
                    run_dw(s, &c);
                c.dw_fp32 = 0;
                for (c.reduce = 0; c.reduce < 2; c.reduce++) {
                    c.null_gather = c.mode == 0 && !c.weights && !c.reduce && s->dist == 0;
                    run_dx(s, &c);
                }
                c.reduce = 0;
                c.null_gather = 0;
                if (!c.weights)
                    for (c.dw_fp32 = 0; c.dw_fp32 < 2; c.dw_fp32++)
                        run_topk_grad(s, &c);
                /* bwd is compared bit for bit with the single ops (checked above), so one
                 * distribution is enough */
                if (s->dist != 1)
                    continue;
                for (c.variant = 0; c.variant < 3; c.variant++)
                    for (c.reduce = 0; c.reduce < 2; c.reduce++)
                        for (c.dw_fp32 = 0; c.dw_fp32 < 2; c.dw_fp32++) {
                            if (c.variant == 2 && c.reduce)
                                continue; /* rejected: reduce_topk without dX (test_bad_input) */
                            if (c.variant == 1 && c.dw_fp32)
                                continue; /* dw_fp32 means nothing without dW */
                            run_bwd(s, &c);
                        }
            }
}

/* ---- routings ---- */

typedef struct routing_case {
    const char *name;
    int64_t T, k, E;
    int kind;
} routing_case;

enum { R_RANDOM, R_EMPTY_FIRST, R_EMPTY_LAST, R_ALTERNATING, R_ONE_EXPERT, R_TOPK_E };

static const routing_case routings[] = {
    {"random", 5, 2, 4, R_RANDOM},
    {"empty first expert", 6, 2, 4, R_EMPTY_FIRST},
    {"empty last expert", 6, 2, 4, R_EMPTY_LAST},
    {"alternating empty experts", 5, 2, 6, R_ALTERNATING},
    {"all slots on one expert, k=1", 7, 1, 3, R_ONE_EXPERT},
    {"all slots on one expert, k=3", 4, 3, 3, R_ONE_EXPERT},
    {"T=0", 0, 2, 3, R_RANDOM},
    {"T=1", 1, 2, 3, R_RANDOM},
    {"topk=1", 6, 1, 4, R_RANDOM},
    {"topk=E", 4, 3, 3, R_TOPK_E},
    {"E>>T", 2, 2, 16, R_RANDOM},
};

static void make_ids(const routing_case *rc, int64_t *ids)
{
    const int64_t M = rc->T * rc->k, E = rc->E;
    for (int64_t s = 0; s < M; s++) {
        int64_t e = (int64_t)oracle_rng_below(&rng, (uint64_t)E);
        switch (rc->kind) {
        case R_EMPTY_FIRST: e = 1 + (int64_t)oracle_rng_below(&rng, (uint64_t)E - 1); break;
        case R_EMPTY_LAST: e = (int64_t)oracle_rng_below(&rng, (uint64_t)E - 1); break;
        case R_ALTERNATING: e = 1 + 2 * (int64_t)oracle_rng_below(&rng, (uint64_t)E / 2); break;
        case R_ONE_EXPERT: e = E / 2; break;
        case R_TOPK_E: e = s % rc->k; break;
        default: break;
        }
        ids[s] = e;
    }
    if (rc->kind == R_TOPK_E) /* every token picks every expert, in a random order */
        for (int64_t t = 0; t < rc->T; t++)
            for (int64_t j = rc->k - 1; j > 0; j--) {
                int64_t o = (int64_t)oracle_rng_below(&rng, (uint64_t)j + 1), tmp = ids[t * rc->k + j];
                ids[t * rc->k + j] = ids[t * rc->k + o], ids[t * rc->k + o] = tmp;
            }
}

static void alloc_setup(setup *s)
{
    const int64_t M = s->M, N = s->N, K = s->K, E = s->E;
    const size_t es = moe_dtype_size(s->dtype);
    s->x = xmalloc((size_t)(M * K) * es);
    s->w = xmalloc((size_t)(E * N * K) * es);
    s->dy = xmalloc((size_t)(M * N) * es);
    s->tw = xmalloc((size_t)M * es);
    oracle_fill(&rng, s->dtype, s->x, M * K, s->dist);
    oracle_fill(&rng, s->dtype, s->w, E * N * K, s->dist);
    oracle_fill(&rng, s->dtype, s->dy, M * N, s->dist);
    oracle_fill(&rng, s->dtype, s->tw, M, s->dist);
    int64_t biggest = E * N * K;
    if (M * N > biggest)
        biggest = M * N;
    if (M * K > biggest)
        biggest = M * K;
    if (M > biggest)
        biggest = M;
    const size_t bytes = (size_t)biggest * 4;
    s->out = xmalloc(bytes), s->old = xmalloc(bytes), s->out2 = xmalloc(bytes), s->out3 = xmalloc(bytes);
    s->old2 = xmalloc(bytes), s->old3 = xmalloc(bytes);
    s->value = xmalloc((size_t)biggest * 8), s->bound = xmalloc((size_t)biggest * 8);
}

static void free_setup(setup *s)
{
    free(s->x), free(s->w), free(s->dy), free(s->tw), free(s->out), free(s->old), free(s->out2), free(s->out3);
    free(s->old2), free(s->old3), free(s->value), free(s->bound);
}

#ifdef MOE_TEST_BLOCKED
/* Larger problems whose group sizes and N, K sit around likely tile sizes, every option, both twins. */
static void blocked_big_problems(void)
{
    static const int64_t groups[] = {1, 15, 16, 17, 0, 31, 32, 33, 63, 64, 65, 0, 3}; /* sum 340 */
    static const int64_t dims[][2] = {{65, 33}, {16, 64}, {31, 17}, {1, 100}, {100, 1}};
    const int64_t E = (int64_t)(sizeof groups / sizeof groups[0]);
    int64_t M = 0;
    for (int64_t e = 0; e < E; e++)
        M += groups[e];
    const int64_t k = 2, T = M / k;
    CHECK(T * k == M, "tile-boundary groups sum to %" PRId64 ", not a multiple of k = %" PRId64, M, k);
    int64_t *ids = xmalloc((size_t)M * 8), *m_sizes = xmalloc((size_t)E * 8), *gather = xmalloc((size_t)M * 8);
    int64_t s_next = 0;
    for (int64_t e = 0; e < E; e++)
        for (int64_t i = 0; i < groups[e]; i++)
            ids[s_next++] = e;
    for (int64_t i = M - 1; i > 0; i--) { /* random (non-uniform) gather order */
        int64_t o = (int64_t)oracle_rng_below(&rng, (uint64_t)i + 1), tmp = ids[i];
        ids[i] = ids[o], ids[o] = tmp;
    }
    CHECK(moe_routing_from_topk(T, k, E, ids, m_sizes, gather, NULL) == MOE_OK, "big routing: %s", moe_last_error());
    for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++)
        for (int dt = 0; dt < 3; dt++) {
            setup s;
            memset(&s, 0, sizeof s);
            s.routing_name = "tile-boundary groups";
            s.T = T, s.k = k, s.E = E, s.M = M, s.N = dims[d][0], s.K = dims[d][1];
            s.m_sizes = m_sizes, s.gather = gather, s.dtype = (moe_dtype)dt, s.dist = d % 2 ? 2 : 0;
            alloc_setup(&s);
            combo c;
            memset(&c, 0, sizeof c);
            for (c.mode = 0; c.mode < 4; c.mode++)
                for (c.weights = 0; c.weights < 2; c.weights++)
                    for (c.accumulate = 0; c.accumulate < 2; c.accumulate++) {
                        moe_gemm_options o = options_of(&s, &c);
                        prepare_output(&s, s.dtype, s.out, s.old, M * s.N, c.accumulate);
                        check_twins(&s, &c, &o, TWIN_FWD, s.old, M * s.N, s.dtype);
                        for (c.reduce = 0; c.reduce < 2; c.reduce++) {
                            o.reduce_topk = c.reduce;
                            const int64_t count = (c.reduce ? T : M) * s.K;
                            prepare_output(&s, s.dtype, s.out, s.old, count, c.accumulate);
                            check_twins(&s, &c, &o, TWIN_DX, s.old, count, s.dtype);
                        }
                        c.reduce = 0;
                        o.reduce_topk = 0;
                        for (c.dw_fp32 = 0; c.dw_fp32 < 2; c.dw_fp32++) {
                            o.dw_fp32 = c.dw_fp32;
                            const moe_dtype out_dtype = c.dw_fp32 ? MOE_F32 : s.dtype;
                            prepare_output(&s, out_dtype, s.out, s.old, E * s.N * s.K, c.accumulate);
                            check_twins(&s, &c, &o, TWIN_DW, s.old, E * s.N * s.K, out_dtype);
                        }
                        c.dw_fp32 = 0;
                    }
            free_setup(&s);
        }
    free(ids), free(m_sizes), free(gather);
    printf("blocked twins: tile-boundary problems done\n");
}
#endif

/* dX with reduce_topk under scratch budgets around its column-chunk thresholds (options.ref_scratch_bytes,
 * 128-column chunks): all of K in one chunk, just under it, exactly one 128-column chunk, under that (the
 * one-chunk floor), a budget of 1 byte.  Every budget must give the default's bits (the chunks only split
 * the columns; each token sums its slots in the same order), within the oracle's bound. */
static void reduce_chunk_budgets(void)
{
    static const int64_t widths[] = {129, 300, 385};
    const int64_t T = 37, k = 3, E = 5, M = T * k, N = 9;
    int64_t *ids = xmalloc((size_t)M * 8), *m_sizes = xmalloc((size_t)E * 8), *gather = xmalloc((size_t)M * 8);
    for (int64_t t = 0; t < T; t++) /* k distinct experts per token, skewed towards expert 0 */
        for (int64_t j = 0; j < k; j++)
            ids[t * k + j] = (t % 2 ? j : (t + j) % E);
    CHECK(moe_routing_from_topk(T, k, E, ids, m_sizes, gather, NULL) == MOE_OK, "chunk routing: %s", moe_last_error());
    for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++)
        for (int dt = 0; dt < 3; dt += 2) {
            setup s;
            memset(&s, 0, sizeof s);
            s.routing_name = "reduce_topk chunks";
            s.T = T, s.k = k, s.E = E, s.M = M, s.N = N, s.K = widths[wi];
            s.m_sizes = m_sizes, s.gather = gather, s.dtype = (moe_dtype)dt, s.dist = 0;
            alloc_setup(&s);
            const int64_t K = s.K, count = T * K, one_chunk = M * K * 4, nb_chunk = M * 128 * 4;
            const size_t bytes = (size_t)count * moe_dtype_size(s.dtype);
            const int64_t budgets[] = {one_chunk, one_chunk - 1, nb_chunk + 4 * M, nb_chunk, nb_chunk - 1, 1};
            combo c;
            memset(&c, 0, sizeof c);
            c.reduce = 1;
            for (c.weights = 0; c.weights < 2; c.weights++)
                for (c.accumulate = 0; c.accumulate < 2; c.accumulate++) {
                    moe_gemm_options o = options_of(&s, &c);
                    o.reduce_topk = 1;
                    const moe_routing r = routing_of(&s, &c);
                    const void *weights = c.weights ? s.tw : NULL;
                    prepare_output(&s, s.dtype, s.out2, s.old, count, c.accumulate);
                    moe_status st = moe_gemm_dx(MOE_BACKEND_REF, &r, N, K, s.dy, s.w, weights, s.out2, &o);
                    CHECK(st == MOE_OK, "chunks: default budget: %s: %s", moe_last_error(), describe(&s, &c, "dx"));
                    oracle_gemm_dx(&r, N, K, s.dy, s.w, weights, s.old, &o, s.value, s.bound);
                    check_against_oracle(&s, &c, "dx", "dx (default budget)", s.dtype, s.out2, s.value, s.bound, count);
                    for (size_t b = 0; b < sizeof budgets / sizeof budgets[0]; b++) {
                        o.ref_scratch_bytes = budgets[b];
                        memcpy(s.out, s.old, bytes); /* the same prior contents as the default's call */
                        st = moe_gemm_dx(MOE_BACKEND_REF, &r, N, K, s.dy, s.w, weights, s.out, &o);
                        CHECK(st == MOE_OK, "chunks: budget %" PRId64 ": %s: %s", budgets[b], moe_last_error(),
                              describe(&s, &c, "dx"));
                        CHECK(st != MOE_OK || memcmp(s.out, s.out2, bytes) == 0,
                              "chunks: ref_scratch_bytes = %" PRId64 " changes dX (K = %" PRId64 "): %s", budgets[b],
                              K, describe(&s, &c, "dx"));
                        checks++;
#ifdef MOE_TEST_BLOCKED
                        check_twins(&s, &c, &o, TWIN_DX, s.old, count, s.dtype);
#endif
                    }
                }
            free_setup(&s);
        }
    free(ids), free(m_sizes), free(gather);
    printf("reduce_topk column chunks under scratch budgets: done\n");
}

int main(int argc, char **argv)
{
    seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 20261125;
    printf("seed %llu\n", (unsigned long long)seed);
    rng.state = seed;
#ifdef _OPENMP
    /* thread-count independence is test_threads' job; thousands of tiny calls are much faster on one
     * thread.  Set OMP_NUM_THREADS to run this matrix with more. */
    if (getenv("OMP_NUM_THREADS") == NULL)
        omp_set_num_threads(1);
    printf("OpenMP threads: %d\n", omp_get_max_threads());
#endif
#ifdef MOE_TEST_BLOCKED
    printf("naive/blocked twin comparison: on\n");
#else
    printf("naive/blocked twin comparison: off (build with -DMOE_TEST_BLOCKED)\n");
#endif
    static const int64_t dims[][2] = {{1, 1}, {3, 7}, {7, 13}, {13, 3}, {1, 13}, {13, 1}, {0, 3}, {3, 0}};
    const size_t n_routings = sizeof routings / sizeof routings[0], n_dims = sizeof dims / sizeof dims[0];
    for (size_t ri = 0; ri < n_routings; ri++) {
        const routing_case *rc = &routings[ri];
        const int64_t M = rc->T * rc->k;
        int64_t *ids = xmalloc((size_t)M * 8), *m_sizes = xmalloc((size_t)rc->E * 8), *gather = xmalloc((size_t)M * 8);
        make_ids(rc, ids);
        moe_status st = moe_routing_from_topk(rc->T, rc->k, rc->E, ids, m_sizes, gather, NULL);
        CHECK(st == MOE_OK, "routing \"%s\": %s", rc->name, moe_last_error());
        const long before = failures;
        for (size_t di = 0; di < n_dims; di++)
            for (int dt = 0; dt < 3; dt++)
                for (int dist = 1; dist >= 0; dist--) {
                    setup s;
                    memset(&s, 0, sizeof s);
                    s.routing_name = rc->name;
                    s.T = rc->T, s.k = rc->k, s.E = rc->E, s.M = M, s.N = dims[di][0], s.K = dims[di][1];
                    s.m_sizes = m_sizes, s.gather = gather, s.dtype = (moe_dtype)dt, s.dist = dist;
                    alloc_setup(&s);
                    run_setup(&s);
                    free_setup(&s);
                }
        printf("routing %-32s T=%2" PRId64 " k=%" PRId64 " E=%2" PRId64 ": %s\n", rc->name, rc->T, rc->k, rc->E,
               failures == before ? "ok" : "FAILED");
        free(ids), free(m_sizes), free(gather);
    }
    reduce_chunk_budgets();
#ifdef MOE_TEST_BLOCKED
    blocked_big_problems();
#endif
    printf("%ld checks, %ld failures\n", checks, failures);
    if (failures) {
        printf("FAILED (seed %llu)\n", (unsigned long long)seed);
        return 1;
    }
    return 0;
}
