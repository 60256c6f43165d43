/*
 * Grouped GEMM generators and the reference-vs-oracle properties (ops gemm-fwd, gemm-dx, gemm-dw,
 * gemm-dtopk, gemm-bwd).  Metamorphic and bad-input properties: pt_gemm_meta.c.  GPU: pt_gpu.c.
 */
#include "pt_gemm.h"

#include "oracle.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Work caps that keep one reference case (and its float64 oracle) in the tens of milliseconds. */
#define CAP_WEIGHTS ((int64_t)1 << 22) /* E*N*K elements */
#define CAP_MACS ((int64_t)1 << 23)    /* M*N*K multiply-adds */

const char *gop_name(enum gop op)
{
    static const char *const names[GOPS] = {"fwd", "dx", "dw", "dtopk"};
    return names[op];
}

int64_t gcase_x_rows(const gcase *g) { return g->opt.permute_x ? g->T : g->M; }

int64_t gop_out_count(const gcase *g, enum gop op)
{
    switch (op) {
    case GOP_FWD: return g->M * g->N;
    case GOP_DX: return (g->opt.reduce_topk ? g->T : g->M) * g->K;
    case GOP_DW: return g->E * g->N * g->K;
    default: return g->M;
    }
}

moe_dtype gop_out_dtype(const gcase *g, enum gop op)
{
    return (op == GOP_DW || op == GOP_DTOPK) && g->opt.dw_fp32 ? MOE_F32 : g->opt.dtype;
}

/* ---------------------------------------------------------------------------------------------------
 * generation
 * ------------------------------------------------------------------------------------------------- */
/* Group sizes around the blocked reference twin's tiles (MR = 6 rows, MB = 96 rows per work item). */
static const int64_t tile_groups[] = {0, 1, 5, 6, 7, 95, 96, 97};
/* N around NR = 16 / NB = 128 columns; K around 8 and the KB = 256 reduction block. */
static const int64_t tile_n[] = {15, 16, 17, 127, 128, 129};
static const int64_t tile_k[] = {7, 8, 9, 255, 256, 257};

static int64_t round_up8(int64_t v) { return (v + 7) / 8 * 8; }

void gcase_generate(pt_case *c, gcase *g, int restrictions)
{
    pt_source *s = c->src;
    memset(g, 0, sizeof *g);
    /* structure first: the shrinker reaches the simple kinds by zeroing these */
    g->shape_kind = pt_pick(s, 4);
    g->routing_kind = pt_pick(s, (restrictions & GEN_NEED_IDS) ? PT_ROUTE_KINDS_FROM_TOPK : PT_ROUTE_KINDS);
    g->opt.dtype = (moe_dtype)pt_pick(s, 3);
    g->dist = (restrictions & GEN_EXACT) ? PT_DIST_EXACT : pt_pick(s, PT_DISTS);
    g->opt.permute_x = pt_bool(s);
    g->opt.permute_y = pt_bool(s);
    g->weighted = pt_bool(s);
    g->opt.accumulate = pt_bool(s);
    g->opt.reduce_topk = pt_bool(s);
    g->opt.dw_fp32 = pt_bool(s);
    const int keep_gather = pt_bool(s); /* pass gather_indices even when no option needs it */
    const int topk_kind = pt_pick(s, 3);  /* 1 / small / E */
    int64_t T = 0, E = 1, N = 0, K = 0, k = 1;
    const char *shape = "tiny";
    switch (g->shape_kind) {
    case 0:
        E = pt_sized(s, 1, 8), T = pt_sized(s, 0, 16), N = pt_sized(s, 0, 12), K = pt_sized(s, 0, 12);
        break;
    case 1:
        shape = "odd";
        E = pt_sized(s, 1, 24), T = pt_sized(s, 0, 64);
        N = 2 * pt_sized(s, 0, 40) + 1, K = 2 * pt_sized(s, 0, 40) + 1;
        break;
    case 2: {
        shape = "tile";
        const int big = s->size >= 40; /* the 96/128/256 tiles only past size 40 */
        N = tile_n[pt_pick(s, big ? 6 : 3)], K = tile_k[pt_pick(s, big ? 6 : 3)];
        E = pt_sized(s, 1, 4);
        T = pt_sized(s, 0, 24);
        break;
    }
    default: {
        shape = "model";
        const pt_model *m = &pt_models[pt_pick(s, PT_MODELS)];
        const int which = pt_pick(s, 4); /* K = H, K = I, N = H, N = I; the other dimension small */
        const int64_t big = which % 2 ? m->I : m->H, small = pt_int(s, 1, 8);
        K = which < 2 ? big : small, N = which < 2 ? small : big;
        E = min64(m->E, max64(1, CAP_WEIGHTS / max64(1, N * K)));
        T = pt_sized(s, 1, 8);
        k = min64(m->k, E);
        pt_describe(c, "%s ", m->name);
        break;
    }
    }
    if (g->routing_kind == PT_ROUTE_E_MUCH_LARGER) {
        E = max64(E, pt_sized(s, 1, 256));
        E = min64(E, max64(1, CAP_WEIGHTS / max64(1, N * K)));
        T = min64(T, E / 8);
    }
    if (restrictions & GEN_GPU) {
        N = round_up8(N), K = round_up8(K);
        E = min64(E, max64(1, CAP_WEIGHTS / max64(1, N * K)));
    }
    int64_t *allowed = xmalloc((size_t)E * sizeof(int64_t));
    const int64_t A = g->routing_kind == PT_ROUTE_ARBITRARY ? E : pt_allowed_experts(g->routing_kind, E, allowed);
    free(allowed);
    if (g->shape_kind != 3)
        k = topk_kind == 0 ? 1 : topk_kind == 1 ? pt_int(s, 1, min64(A, 4)) : A;
    k = min64(k, A);
    /* cap the work: fewer tokens */
    const int64_t per_token = max64(1, k * max64(1, N) * max64(1, K));
    T = min64(T, CAP_MACS / per_token);
    g->T = T, g->E = E, g->N = N, g->K = K, g->k = k, g->M = T * k;
    const int64_t M = g->M;

    g->m_sizes = xmalloc((size_t)E * sizeof(int64_t));
    g->gather = xmalloc((size_t)(M + 1) * sizeof(int64_t));
    if (g->routing_kind == PT_ROUTE_ARBITRARY) {
        /* tile shapes: group sizes around the tiles; otherwise any composition of M */
        int64_t left = M;
        for (int64_t e = 0; e < E; e++) {
            int64_t m;
            if (e == E - 1)
                m = left;
            else if (g->shape_kind == 2)
                m = min64(left, tile_groups[pt_pick(s, 8)]);
            else
                m = pt_int(s, 0, left);
            g->m_sizes[e] = m;
            left -= m;
        }
        pt_permutation(s, M, g->gather);
    } else {
        g->ids = xmalloc((size_t)(M + 1) * sizeof(int64_t));
        pt_gen_topk_ids(s, g->routing_kind, T, k, E, g->ids);
        pt_stable_routing(M, E, g->ids, g->m_sizes, g->gather);
        /* the library's builder must agree with the stable sort computed here */
        int64_t *lib_m = xmalloc((size_t)E * sizeof(int64_t)), *lib_g = xmalloc((size_t)(M + 1) * sizeof(int64_t));
        moe_status st = moe_routing_from_topk(T, k, E, g->ids, lib_m, lib_g, NULL);
        if (st != MOE_OK)
            pt_fail(c, "routing-builder", "moe_routing_from_topk: %s (%s)", moe_strerror(st), moe_last_error());
        else if (memcmp(lib_m, g->m_sizes, (size_t)E * sizeof(int64_t)) != 0 ||
                 memcmp(lib_g, g->gather, (size_t)M * sizeof(int64_t)) != 0)
            pt_fail(c, "routing-builder", "moe_routing_from_topk differs from the stable sort by expert");
        free(lib_m);
        free(lib_g);
    }
    g->value_seed = pt_draw(s, 0xffffffffu);
    const int needs_gather = g->opt.permute_x || g->opt.permute_y || g->weighted || g->opt.reduce_topk;
    g->r = (moe_routing){T, k, E, g->m_sizes, (needs_gather || keep_gather) ? g->gather : NULL};
    pt_describe(c, "%s", shape);
    gcase_fill_values(g);
    gcase_describe(c, g);
}

void gcase_describe(pt_case *c, const gcase *g)
{
    pt_describe(c, " T=%lld k=%lld E=%lld N=%lld K=%lld %s routing=%s values=%s%s%s%s%s%s%s%s%s",
                (long long)g->T, (long long)g->k, (long long)g->E, (long long)g->N, (long long)g->K,
                moe_dtype_name(g->opt.dtype), pt_routing_kind_name(g->routing_kind), pt_dist_name(g->dist),
                g->opt.permute_x ? " permute_x" : "", g->opt.permute_y ? " permute_y" : "",
                g->weighted ? " topk_weights" : "", g->opt.accumulate ? " accumulate" : "",
                g->opt.reduce_topk ? " reduce_topk" : "", g->opt.dw_fp32 ? " dw_fp32" : "",
                g->opt.allow_tf32 ? " allow_tf32" : "", g->r.gather_indices ? "" : " no-gather");
}

void gcase_fill_values(gcase *g)
{
    const moe_dtype dt = g->opt.dtype;
    const size_t es = moe_dtype_size(dt);
    free(g->x), free(g->w), free(g->dy), free(g->tw);
    const int64_t xr = gcase_x_rows(g);
    g->x = xmalloc((size_t)(xr * g->K) * es);
    g->w = xmalloc((size_t)(g->E * g->N * g->K) * es);
    g->dy = xmalloc((size_t)(g->M * g->N) * es);
    g->tw = NULL;
    pt_fill(g->value_seed, 0, g->dist, dt, g->x, xr * g->K);
    pt_fill(g->value_seed, 1, g->dist, dt, g->w, g->E * g->N * g->K);
    pt_fill(g->value_seed, 2, g->dist, dt, g->dy, g->M * g->N);
    if (g->weighted) {
        g->tw = xmalloc((size_t)g->M * es);
        pt_fill(g->value_seed, 3, g->dist == PT_DIST_EXACT ? PT_DIST_EXACT : PT_DIST_UNIFORM, dt, g->tw, g->M);
    }
}

void gcase_free(gcase *g)
{
    void *ps[] = {g->ids, g->m_sizes, g->gather, g->x, g->w, g->dy, g->tw};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
        free(ps[i]);
    memset(g, 0, sizeof *g);
}

/* ---------------------------------------------------------------------------------------------------
 * calling, oracle, checks
 * ------------------------------------------------------------------------------------------------- */
moe_status gop_call(const gcase *g, enum gop op, moe_backend backend, void *out)
{
    const void *tw = g->weighted ? g->tw : NULL;
    /* a case's options hold every flag; each op gets the ones that apply to it */
    moe_gemm_options o = g->opt;
    o.reduce_topk = op == GOP_DX && o.reduce_topk;
    o.dw_fp32 = (op == GOP_DW || op == GOP_DTOPK) && o.dw_fp32;
    switch (op) {
    case GOP_FWD: return moe_gemm_fwd(backend, &g->r, g->N, g->K, g->x, g->w, tw, out, &o);
    case GOP_DX: return moe_gemm_dx(backend, &g->r, g->N, g->K, g->dy, g->w, tw, out, &o);
    case GOP_DW: return moe_gemm_dw(backend, &g->r, g->N, g->K, g->x, g->dy, tw, out, &o);
    default: return moe_gemm_topk_weights_grad(backend, &g->r, g->N, g->K, g->x, g->w, g->dy, out, &o);
    }
}

void gop_oracle(const gcase *g, enum gop op, const void *old, double *value, double *bound)
{
    /* the oracle reads gather_indices; give it the full routing */
    moe_routing r = g->r;
    r.gather_indices = g->gather;
    const void *tw = g->weighted ? g->tw : NULL;
    switch (op) {
    case GOP_FWD: oracle_gemm_fwd(&r, g->N, g->K, g->x, g->w, tw, old, &g->opt, value, bound); break;
    case GOP_DX: oracle_gemm_dx(&r, g->N, g->K, g->dy, g->w, tw, old, &g->opt, value, bound); break;
    case GOP_DW:
        if (g->split_backend)
            oracle_gemm_dw_split(&r, g->N, g->K, g->x, g->dy, tw, old, &g->opt, value, bound);
        else
            oracle_gemm_dw(&r, g->N, g->K, g->x, g->dy, tw, old, &g->opt, value, bound);
        break;
    default: oracle_gemm_topk_weights_grad(&r, g->N, g->K, g->x, g->w, g->dy, old, &g->opt, value, bound); break;
    }
}

void *gop_output(const gcase *g, enum gop op, void **old)
{
    const moe_dtype dt = gop_out_dtype(g, op);
    const int64_t n = gop_out_count(g, op);
    const size_t bytes = (size_t)n * moe_dtype_size(dt);
    void *out = xmalloc(bytes);
    *old = NULL;
    if (g->opt.accumulate) {
        pt_fill(g->value_seed, 10 + (int)op, g->dist == PT_DIST_EXACT ? PT_DIST_EXACT : PT_DIST_UNIFORM, dt, out, n);
        *old = xmalloc(bytes);
        memcpy(*old, out, bytes);
    } else {
        oracle_poison(dt, out, n);
    }
    return out;
}

void gop_check(pt_case *c, const gcase *g, enum gop op, const void *old, const void *out, const char *what)
{
    const int64_t n = gop_out_count(g, op);
    const moe_dtype dt = gop_out_dtype(g, op);
    double *value = xmalloc((size_t)n * sizeof(double)), *bound = xmalloc((size_t)n * sizeof(double));
    gop_oracle(g, op, old, value, bound);
    char *report = NULL;
    size_t report_len = 0;
    FILE *f = open_memstream(&report, &report_len);
    double worst = 0.0;
    const int64_t bad = oracle_compare(what, dt, out, value, bound, n, f, 4, &worst);
    fclose(f);
    pt_ratio(c, worst);
    if (bad)
        pt_fail(c, "oracle-bound", "%s: %lld of %lld elements outside the oracle bound:\n%s", what, (long long)bad,
                (long long)n, report);
    free(report);
    if (g->dist == PT_DIST_EXACT) {
        /* every float32 operation is exact: the result is the oracle value rounded once */
        int64_t wrong = 0;
        for (int64_t i = 0; i < n; i++) {
            const double want = pt_round_to(dt, value[i]), got = oracle_load(dt, out, i);
            if (!(got == want)) {
                if (wrong < 3)
                    pt_fail(c, "exact", "%s[%lld]: got %.9g, the exact result rounded once is %.9g", what,
                            (long long)i, got, want);
                wrong++;
            }
        }
        if (wrong)
            pt_fail(c, "exact", "%s: %lld elements differ on exactly representable data", what, (long long)wrong);
    }
    if (op == GOP_DW && !g->opt.accumulate) {
        /* experts without rows: exact zeros */
        for (int64_t e = 0; e < g->E; e++)
            if (g->m_sizes[e] == 0)
                for (int64_t i = e * g->N * g->K; i < (e + 1) * g->N * g->K; i++)
                    if (oracle_load(dt, out, i) != 0.0 || signbit(oracle_load(dt, out, i))) {
                        pt_fail(c, "empty-expert", "%s: expert %lld has no rows but dW[%lld] = %.9g (want +0)", what,
                                (long long)e, (long long)i, oracle_load(dt, out, i));
                        break;
                    }
    }
    free(value);
    free(bound);
}

int gop_same_bits(pt_case *c, const gcase *g, enum gop op, const void *a, const void *b, const char *tag,
                  const char *what)
{
    const moe_dtype dt = gop_out_dtype(g, op);
    const int64_t n = gop_out_count(g, op);
    const size_t es = moe_dtype_size(dt);
    for (int64_t i = 0; i < n; i++)
        if (memcmp((const char *)a + (size_t)i * es, (const char *)b + (size_t)i * es, es) != 0) {
            pt_fail(c, tag, "%s: element %lld differs: %.9g vs %.9g (bitwise equality expected)", what, (long long)i,
                    oracle_load(dt, a, i), oracle_load(dt, b, i));
            return 0;
        }
    return 1;
}

/* ---------------------------------------------------------------------------------------------------
 * ops: reference vs oracle
 * ------------------------------------------------------------------------------------------------- */

/* dX with reduce_topk: the reference's scratch budget (options.ref_scratch_bytes) around its column-chunk
 * thresholds: the default (one chunk at these sizes), all of K exactly, one byte less, exactly one
 * 128-column chunk, one byte, or any budget up to all of K.  Drawn last in the ops that call it, so that
 * reproducers recorded before it (a missing choice reads as 0: the default) make the same cases. */
static void draw_scratch_budget(pt_case *c, gcase *g)
{
    if (!g->opt.reduce_topk || g->M == 0 || g->K == 0)
        return;
    const int64_t all = 4 * g->M * g->K, one_nb = 4 * g->M * 128;
    const int64_t budgets[5] = {0, all, all - 1, one_nb, 1};
    const int pick = pt_pick(c->src, 6);
    g->opt.ref_scratch_bytes = pick < 5 ? budgets[pick] : pt_int(c->src, 1, all);
    if (g->opt.ref_scratch_bytes)
        pt_describe(c, " ref_scratch_bytes=%lld", (long long)g->opt.ref_scratch_bytes);
}

static void run_single(pt_case *c, enum gop op)
{
    gcase g;
    gcase_generate(c, &g, 0);
    if (op == GOP_DTOPK && g.r.gather_indices == NULL)
        g.r.gather_indices = g.gather; /* the topk-weight gradient needs it */
    if (op != GOP_DX)
        g.opt.reduce_topk = 0; /* only for the description */
    if (op != GOP_DW && op != GOP_DTOPK)
        g.opt.dw_fp32 = 0;
    /* through the single entry point or moe_gemm_bwd with dx_only / dw_only */
    const int via_bwd = (op == GOP_DX || op == GOP_DW) && pt_bool(c->src);
    if (via_bwd)
        pt_describe(c, " via moe_gemm_bwd");
    if (op == GOP_DX)
        draw_scratch_budget(c, &g);
    void *old;
    void *out = gop_output(&g, op, &old);
    moe_status st;
    if (via_bwd) {
        moe_gemm_options o = g.opt;
        o.dx_only = op == GOP_DX, o.dw_only = op == GOP_DW;
        st = moe_gemm_bwd(c->backend, &g.r, g.N, g.K, g.x, g.w, g.dy, g.weighted ? g.tw : NULL,
                          op == GOP_DX ? out : NULL, op == GOP_DW ? out : NULL, NULL, &o);
    } else {
        st = gop_call(&g, op, c->backend, out);
    }
    if (st != MOE_OK)
        pt_fail(c, "status", "%s returned %s: %s", gop_name(op), moe_strerror(st), moe_last_error());
    else
        gop_check(c, &g, op, old, out, gop_name(op));
    free(out);
    free(old);
    gcase_free(&g);
}

static void op_fwd(pt_case *c) { run_single(c, GOP_FWD); }
static void op_dx(pt_case *c) { run_single(c, GOP_DX); }
static void op_dw(pt_case *c) { run_single(c, GOP_DW); }
static void op_dtopk(pt_case *c) { run_single(c, GOP_DTOPK); }

/* moe_gemm_bwd computing dX, dW and (with topk weights) their gradient in one call. */
static void op_bwd(pt_case *c)
{
    gcase g;
    gcase_generate(c, &g, 0);
    draw_scratch_budget(c, &g);
    void *old_dx, *old_dw, *old_dt = NULL;
    void *dx = gop_output(&g, GOP_DX, &old_dx), *dw = gop_output(&g, GOP_DW, &old_dw), *dt = NULL;
    if (g.weighted)
        dt = gop_output(&g, GOP_DTOPK, &old_dt);
    moe_status st = moe_gemm_bwd(c->backend, &g.r, g.N, g.K, g.x, g.w, g.dy, g.weighted ? g.tw : NULL, dx, dw, dt, &g.opt);
    if (st != MOE_OK) {
        pt_fail(c, "status", "moe_gemm_bwd returned %s: %s", moe_strerror(st), moe_last_error());
    } else {
        gop_check(c, &g, GOP_DX, old_dx, dx, "bwd.dx");
        gop_check(c, &g, GOP_DW, old_dw, dw, "bwd.dw");
        if (dt)
            gop_check(c, &g, GOP_DTOPK, old_dt, dt, "bwd.d_topk_weights");
    }
    free(dx), free(dw), free(dt), free(old_dx), free(old_dw), free(old_dt);
    gcase_free(&g);
}

void pt_gemm_meta(pt_case *c);
void pt_gemm_adjoint(pt_case *c);
void pt_gemm_bad(pt_case *c);
void pt_gemm_fp8(pt_case *c);
void pt_gemm_fp8_hopper_model(pt_case *c);
void pt_gpu_gemm_fp8_model(pt_case *c);
void pt_gemm_fp8_dw(pt_case *c);
void pt_gpu_gemm_fp8_dw(pt_case *c);
void pt_gpu_gemm_fp8(pt_case *c);
void pt_gpu_fp8_quantize(pt_case *c);
void pt_mlp(pt_case *c);
void pt_mlp_meta(pt_case *c);
void pt_mlp_layout(pt_case *c);
#ifdef MOE_FUZZ_CUDA
void pt_gpu_gemm(pt_case *c);
void pt_gpu_mlp(pt_case *c);
void pt_gpu_mlp_layout(pt_case *c);
#endif

const pt_op pt_ops[] = {
    {"gemm-fwd", "forward vs the float64 oracle (every mode, dtype, routing kind, value distribution)", 0, op_fwd},
    {"gemm-dx", "dX vs the oracle (also through moe_gemm_bwd dx_only; reduce_topk)", 0, op_dx},
    {"gemm-dw", "dW vs the oracle; experts without rows get exact +0 (also via moe_gemm_bwd dw_only)", 0, op_dw},
    {"gemm-dtopk", "topk-weight gradient vs the oracle", 0, op_dtopk},
    {"gemm-bwd", "moe_gemm_bwd: dX, dW and the topk-weight gradient in one call vs the oracle", 0, op_bwd},
    {"gemm-meta", "metamorphic: permute_x/permute_y == explicit gather/scatter, reduce_topk == sum of slot rows, "
                  "expert and token relabelling, accumulate twice == 2x", 0, pt_gemm_meta},
    {"gemm-adjoint", "<dY, fwd(X)> == <dX, X> and <dY, fwd_W(X)> == <dW, W> in float64 within the bounds", 0,
     pt_gemm_adjoint},
    {"gemm-bad", "one invalid argument: the right status, a message, every output byte untouched", 0, pt_gemm_bad},
    {"mlp", "MLP forward + backward vs the float64 running-error bound (specs/MLP.md), finite differences on "
            "tiny cases", 0, pt_mlp},
    {"mlp-meta", "MLP: block size independence, affinity on H == on I, top-1 overwrite == accumulate, experts "
                 "without tokens get exact zero gradients", 0, pt_mlp_meta},
    {"mlp-layout", "MLP layout builders (num_blocks, max_blocks, build, build_on; both kinds and paddings) vs a "
                   "layout made from the rules; an invalid id refused with every output untouched", 0, pt_mlp_layout},
#ifdef MOE_FUZZ_CUDA
    {"gpu-gemm", "CUDA vs reference and oracle for every op/mode/dtype; bitwise equal on exact values; "
                 "bitwise deterministic on repeat", 1, pt_gpu_gemm},
    {"gpu-mlp", "CUDA MLP fwd+bwd (every option) vs the float64 bound and the CPU reference; bitwise deterministic; "
                "invalid device layouts reported by moe_backend_synchronize, outputs untouched", 1, pt_gpu_mlp},
    {"gpu-mlp-layout", "the CUDA layout builder (build_on) vs a layout made from the rules, both kinds and paddings; "
                       "an invalid id reported by moe_backend_synchronize with every output untouched", 1,
     pt_gpu_mlp_layout},
#endif
    /* last: an op added at the end keeps the case streams of the ops before it (each case's seed follows the
     * op's index), so the fixed-seed runs (check-fuzz.sh, the recorded long runs) stay those they were */
    {"gemm-fp8", "FP8 fwd / dX (every mode, output dtype, scale format, operand dtype pair; partial tiles) vs the "
                 "float64 oracle within the promotion bound (specs/FP8.md); a bad scale refused, output untouched", 0,
     pt_gemm_fp8},
#ifdef MOE_FUZZ_CUDA
    {"gpu-gemm-fp8", "CUDA FP8 fwd / dX (every mode, dtype, scale format) vs the float64 bound; bitwise equal to the "
                     "reference on exact codes and deterministic; a bad scale reported by moe_backend_synchronize, "
                     "output untouched", 1, pt_gpu_gemm_fp8},
    {"gpu-fp8-quantize", "CUDA FP8 quantizers and dequantizer (rows, blocks, dW's columns, both formats and scale "
                         "formats, f32 and bf16) bitwise equal to the reference; a non-finite source or a bad scale reported by "
                         "moe_backend_synchronize with the reference's message, outputs untouched", 1,
     pt_gpu_fp8_quantize},
#endif
    {"gemm-fp8-hopper-model", "the Hopper FP8 kernel's CPU model (measured wgmma accumulator, promotion every 128) "
                              "vs the float64 oracle within its Hopper bound; bitwise the reference on exact codes",
     0, pt_gemm_fp8_hopper_model},
#ifdef MOE_FUZZ_CUDA
    {"gpu-gemm-fp8-model", "the Hopper FP8 kernel bit for bit its CPU model (the measured wgmma accumulator) where it "
                           "takes the call; run with MOE_CUDA_KERNEL=sm90", 1, pt_gpu_gemm_fp8_model},
#endif
    {"gemm-fp8-dw", "FP8 dW on operands of the 128 x 1 quantizer (every row source, topk weights, f32 / bf16 "
                    "sources, both scale formats, partial and empty experts; each value back within the round "
                    "trip's error) vs the float64 oracle within the promotion bound; a bad scale refused, dW "
                    "untouched", 0, pt_gemm_fp8_dw},
#ifdef MOE_FUZZ_CUDA
    {"gpu-gemm-fp8-dw", "CUDA FP8 dW and its 128 x 1 quantizer (the gemm-fp8-dw cases on the device): the quantizer "
                        "bitwise the reference's, dW within the float32 promotion bound and deterministic; a bad scale "
                        "reported by moe_backend_synchronize, dW untouched", 1, pt_gpu_gemm_fp8_dw},
#endif
    {NULL, NULL, 0, NULL},
};
