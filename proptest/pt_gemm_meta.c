/*
 * Grouped GEMM metamorphic properties (gemm-meta), adjoint identities (gemm-adjoint) and bad inputs
 * (gemm-bad).  "Bitwise" below means: the two calls perform the same float operations in the same order
 * on the same values, so any correct implementation that only moves data (gather, scatter, relabel)
 * gives identical bits.  Where the summation order legitimately changes (token relabelling reorders the
 * rows inside an expert for dW; reduce_topk rounds once instead of k times) the check is the sum of the
 * two oracle bounds, and exact equality on exactly representable data.
 */
#include "pt_gemm.h"

#include "oracle.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t esize(moe_dtype dt) { return moe_dtype_size(dt); }

static void copy_row(void *dst, int64_t drow, const void *src, int64_t srow, int64_t width, size_t es)
{
    memcpy((char *)dst + (size_t)(drow * width) * es, (const char *)src + (size_t)(srow * width) * es,
           (size_t)width * es);
}

static void *run_op(pt_case *c, const gcase *g, enum gop op, const char *what)
{
    void *old;
    void *out = gop_output(g, op, &old);
    free(old);
    moe_status st = gop_call(g, op, c->backend, out);
    if (st != MOE_OK)
        pt_fail(c, "status", "%s (%s) returned %s: %s", gop_name(op), what, moe_strerror(st), moe_last_error());
    return out;
}

/* Row-permuted bitwise comparison: a's row map[i] must equal b's row i. */
static void same_rows(pt_case *c, const void *a, const void *b, const int64_t *map, int64_t rows, int64_t width,
                      moe_dtype dt, const char *tag, const char *what)
{
    const size_t es = esize(dt), rb = (size_t)width * es;
    for (int64_t i = 0; i < rows; i++)
        if (memcmp((const char *)a + (size_t)map[i] * rb, (const char *)b + (size_t)i * rb, rb) != 0) {
            for (int64_t j = 0; j < width; j++)
                if (oracle_load(dt, a, map[i] * width + j) != oracle_load(dt, b, i * width + j) ||
                    memcmp((const char *)a + (size_t)(map[i] * width + j) * es, (const char *)b + (size_t)(i * width + j) * es, es)) {
                    pt_fail(c, tag, "%s: row %lld column %lld: %.9g vs %.9g (rows %lld and %lld must be bitwise equal)",
                            what, (long long)i, (long long)j, oracle_load(dt, a, map[i] * width + j),
                            oracle_load(dt, b, i * width + j), (long long)map[i], (long long)i);
                    return;
                }
        }
}

/* ---- relations 0 and 1: permute_x == explicit gather + plain; permute_y == plain + scatter ---- */
static void rel_permute(pt_case *c, gcase *g, int scatter_y)
{
    int *flag = scatter_y ? &g->opt.permute_y : &g->opt.permute_x;
    const char *tag = scatter_y ? "permute_y" : "permute_x";
    *flag = 1, g->opt.accumulate = 0, g->opt.reduce_topk = 0;
    g->r.gather_indices = g->gather;
    gcase_fill_values(g);
    const moe_dtype dt = g->opt.dtype;
    const size_t es = esize(dt);
    enum gop ops[3] = {GOP_FWD, GOP_DX, GOP_DW};
    void *fused[3];
    for (int i = 0; i < 3; i++)
        fused[i] = run_op(c, g, ops[i], tag);
    /* the explicit data movement into expert order: X[g_r / k] (permute_x) or dY[g_r] (permute_y) */
    void **moved = scatter_y ? &g->dy : &g->x;
    const int64_t width = scatter_y ? g->N : g->K;
    void *original = *moved;
    *moved = xmalloc((size_t)(g->M * width) * es);
    for (int64_t r = 0; r < g->M; r++)
        copy_row(*moved, r, original, scatter_y ? g->gather[r] : g->gather[r] / g->k, width, es);
    *flag = 0;
    /* the output whose rows the flag moves to slot order: Y (permute_y) or dX (permute_x) */
    const enum gop slot_op = scatter_y ? GOP_FWD : GOP_DX;
    for (int i = 0; i < 3 && c->outcome != PT_FAIL; i++) {
        void *plain = run_op(c, g, ops[i], "explicit gather, plain");
        char what[96];
        snprintf(what, sizeof what, "%s with %s vs plain on the gathered input%s", gop_name(ops[i]), tag,
                 ops[i] == slot_op ? " (slot row g_r vs row r)" : "");
        if (ops[i] == slot_op)
            same_rows(c, fused[i], plain, g->gather, g->M, ops[i] == GOP_FWD ? g->N : g->K, dt, tag, what);
        else
            gop_same_bits(c, g, ops[i], fused[i], plain, tag, what);
        free(plain);
    }
    free(original);
    for (int i = 0; i < 3; i++)
        free(fused[i]);
}

/* ---- relation 2: reduce_topk == sum over j of the slot rows t*k + j ---- */
static void rel_reduce(pt_case *c, gcase *g)
{
    g->opt.accumulate = 0;
    g->r.gather_indices = g->gather;
    const moe_dtype dt = g->opt.dtype;
    g->opt.reduce_topk = 1;
    void *reduced = run_op(c, g, GOP_DX, "reduce_topk");
    const int64_t nr = g->T * g->K;
    double *vr = xmalloc((size_t)(nr + 1) * sizeof(double)), *br = xmalloc((size_t)(nr + 1) * sizeof(double));
    gop_oracle(g, GOP_DX, NULL, vr, br);
    g->opt.reduce_topk = 0;
    void *slots = run_op(c, g, GOP_DX, "slot rows");
    const int64_t ns = g->M * g->K;
    double *vs = xmalloc((size_t)(ns + 1) * sizeof(double)), *bs = xmalloc((size_t)(ns + 1) * sizeof(double));
    gop_oracle(g, GOP_DX, NULL, vs, bs);
    /* the output row of slot s: s itself with permute_x, else the expert-order row holding it */
    int64_t *row_of_slot = xmalloc((size_t)(g->M + 1) * sizeof(int64_t));
    for (int64_t r = 0; r < g->M; r++)
        row_of_slot[g->gather[r]] = g->opt.permute_x ? g->gather[r] : r;
    const int exact = g->dist == PT_DIST_EXACT && dt == MOE_F32;
    for (int64_t t = 0; t < g->T && c->outcome != PT_FAIL; t++)
        for (int64_t col = 0; col < g->K; col++) {
            double sum = 0.0, bound = br[t * g->K + col];
            int may_overflow = 0; /* a 16-bit slot row or the reduced value may round to an infinity */
            const double limit = oracle_overflow_threshold(dt);
            for (int64_t j = 0; j < g->k; j++) {
                const int64_t i = row_of_slot[t * g->k + j] * g->K + col;
                sum += oracle_load(dt, slots, i);
                bound += bs[i];
                may_overflow |= fabs(vs[i]) + bs[i] >= limit;
            }
            may_overflow |= fabs(vr[t * g->K + col]) + br[t * g->K + col] >= limit;
            const double got = oracle_load(dt, reduced, t * g->K + col), err = fabs(got - sum);
            if (got == sum) /* also the same infinity, where an f16 output overflowed */
                continue;
            /* one slot row rounded to +-inf (each within its own bound) while the float32 sum of the slots
             * rounds once to a finite value, or the other way round: the relation says nothing there */
            if (may_overflow && (isinf(got) || !isfinite(sum)))
                continue;
            bound += (double)g->k * 0x1p-52 * fabs(sum);
            pt_ratio(c, bound > 0 ? err / bound : (err > 0 ? INFINITY : 0));
            if (exact ? got != sum : !(err <= bound)) {
                pt_fail(c, "reduce_topk", "dX(reduce_topk)[%lld][%lld] = %.9g, sum of the slot rows = %.9g, |diff| %.3g, "
                        "%s %.3g", (long long)t, (long long)col, got, sum, err, exact ? "exact data, want 0; bound" : "bound", bound);
                break;
            }
        }
    free(vr), free(br), free(vs), free(bs), free(row_of_slot), free(reduced), free(slots);
}

/* ---- relations 3 and 4: relabelling experts or tokens permutes the results ---- */
static void rebuild_routing(gcase *g)
{
    pt_stable_routing(g->M, g->E, g->ids, g->m_sizes, g->gather);
}

static void rel_relabel(pt_case *c, gcase *g, int tokens)
{
    g->opt.permute_x = g->opt.permute_y = 1, g->opt.accumulate = 0;
    g->r.gather_indices = g->gather;
    gcase_fill_values(g);
    const moe_dtype dt = g->opt.dtype;
    const size_t es = esize(dt);
    enum gop ops[4] = {GOP_FWD, GOP_DX, GOP_DW, GOP_DTOPK};
    void *before[4];
    for (int i = 0; i < 4; i++)
        before[i] = run_op(c, g, ops[i], "original labels");
    const int64_t n = tokens ? g->T : g->E;
    int64_t *perm = xmalloc((size_t)(n + 1) * sizeof(int64_t));
    pt_permutation(c->src, n, perm);
    int64_t *slot_map = xmalloc((size_t)(g->M + 1) * sizeof(int64_t)); /* new slot -> old slot */
    if (tokens) {
        /* token t becomes perm[t]: its row of X, its k ids, dY rows and weights move with it */
        int64_t *ids = xmalloc((size_t)(g->M + 1) * sizeof(int64_t));
        void *x = xmalloc((size_t)(g->T * g->K) * es), *dy = xmalloc((size_t)(g->M * g->N) * es);
        void *tw = g->tw ? xmalloc((size_t)g->M * es) : NULL;
        for (int64_t t = 0; t < g->T; t++) {
            copy_row(x, perm[t], g->x, t, g->K, es);
            for (int64_t j = 0; j < g->k; j++) {
                const int64_t from = t * g->k + j, to = perm[t] * g->k + j;
                ids[to] = g->ids[from];
                slot_map[to] = from;
                copy_row(dy, to, g->dy, from, g->N, es);
                if (tw)
                    copy_row(tw, to, g->tw, from, 1, es);
            }
        }
        free(g->ids), free(g->x), free(g->dy), free(g->tw);
        g->ids = ids, g->x = x, g->dy = dy, g->tw = tw;
    } else {
        /* expert e becomes perm[e]: W[perm[e]] = old W[e] */
        void *w = xmalloc((size_t)(g->E * g->N * g->K) * es);
        for (int64_t e = 0; e < g->E; e++)
            copy_row(w, perm[e], g->w, e, g->N * g->K, es);
        for (int64_t s = 0; s < g->M; s++)
            g->ids[s] = perm[g->ids[s]], slot_map[s] = s;
        free(g->w);
        g->w = w;
    }
    rebuild_routing(g);
    const char *tag = tokens ? "relabel-tokens" : "relabel-experts";
    for (int i = 0; i < 4 && c->outcome != PT_FAIL; i++) {
        void *after = run_op(c, g, ops[i], "relabelled");
        const enum gop op = ops[i];
        if (op == GOP_FWD) {
            same_rows(c, before[i], after, slot_map, g->M, g->N, dt, tag, "Y slot rows");
        } else if (op == GOP_DTOPK) {
            same_rows(c, before[i], after, slot_map, g->M, 1, gop_out_dtype(g, op), tag, "d_topk_weights");
        } else if (op == GOP_DX) {
            if (g->opt.reduce_topk && tokens) {
                int64_t *tok = xmalloc((size_t)(g->T + 1) * sizeof(int64_t)); /* new token -> old */
                for (int64_t t = 0; t < g->T; t++)
                    tok[perm[t]] = t;
                same_rows(c, before[i], after, tok, g->T, g->K, dt, tag, "dX(reduce_topk) token rows");
                free(tok);
            } else if (g->opt.reduce_topk) {
                gop_same_bits(c, g, op, before[i], after, tag, "dX(reduce_topk)");
            } else {
                same_rows(c, before[i], after, slot_map, g->M, g->K, dt, tag, "dX slot rows");
            }
        } else if (!tokens) {
            int64_t *inv = xmalloc((size_t)(g->E + 1) * sizeof(int64_t));
            for (int64_t e = 0; e < g->E; e++)
                inv[perm[e]] = e;
            same_rows(c, before[i], after, inv, g->E, g->N * g->K, gop_out_dtype(g, op), tag, "dW[perm[e]] vs dW[e]");
            free(inv);
        } else {
            /* token relabelling reorders the rows inside an expert: within both bounds (equal on exact data) */
            const int64_t cnt = gop_out_count(g, op);
            const moe_dtype odt = gop_out_dtype(g, op);
            double *v = xmalloc((size_t)(cnt + 1) * sizeof(double)), *b = xmalloc((size_t)(cnt + 1) * sizeof(double));
            gop_oracle(g, op, NULL, v, b);
            for (int64_t q = 0; q < cnt; q++) {
                const double x0 = oracle_load(odt, before[i], q), x1 = oracle_load(odt, after, q), err = fabs(x0 - x1);
                const int exact = g->dist == PT_DIST_EXACT;
                if (x0 == x1) /* also the same infinity, where an f16 output overflowed */
                    continue;
                pt_ratio(c, b[q] > 0 ? err / (2 * b[q]) : INFINITY);
                if (exact || !(err <= 2 * b[q])) {
                    pt_fail(c, tag, "dW[%lld]: %.9g before, %.9g after relabelling tokens, |diff| %.3g > %s %.3g",
                            (long long)q, x0, x1, err, exact ? "0 on exact data; bound" : "twice the bound", 2 * b[q]);
                    break;
                }
            }
            free(v), free(b);
        }
        free(after);
    }
    for (int i = 0; i < 4; i++)
        free(before[i]);
    free(perm), free(slot_map);
}

/* ---- relation 5: accumulating into zero twice gives 2x the plain result (exact data, f32) ---- */
static void rel_accumulate_twice(pt_case *c, gcase *g)
{
    g->opt.dtype = MOE_F32; /* 2 round(v) == round(round(v) + v) needs exact f32 sums */
    g->dist = PT_DIST_EXACT;
    g->r.gather_indices = g->gather;
    gcase_fill_values(g);
    enum gop ops[4] = {GOP_FWD, GOP_DX, GOP_DW, GOP_DTOPK};
    for (int i = 0; i < 4 && c->outcome != PT_FAIL; i++) {
        const enum gop op = ops[i];
        g->opt.accumulate = 0;
        void *once = run_op(c, g, op, "overwrite");
        const int64_t cnt = gop_out_count(g, op);
        const moe_dtype dt = gop_out_dtype(g, op);
        float *twice = xcalloc((size_t)cnt + 1, sizeof(float)); /* +0 in f32 */
        g->opt.accumulate = 1;
        for (int rep = 0; rep < 2; rep++) {
            moe_status st = gop_call(g, op, c->backend, twice);
            if (st != MOE_OK)
                pt_fail(c, "status", "%s accumulate returned %s: %s", gop_name(op), moe_strerror(st), moe_last_error());
        }
        for (int64_t q = 0; q < cnt && c->outcome != PT_FAIL; q++)
            if (twice[q] != 2.0f * (float)oracle_load(dt, once, q))
                pt_fail(c, "accumulate-twice", "%s[%lld]: accumulated twice into 0 gives %.9g, want 2 x %.9g", gop_name(op),
                        (long long)q, twice[q], oracle_load(dt, once, q));
        free(once);
        free(twice);
    }
}

void pt_gemm_meta(pt_case *c)
{
    const int relation = pt_pick(c->src, 6);
    static const char *const names[6] = {"permute_x", "permute_y", "reduce_topk", "relabel-experts",
                                         "relabel-tokens", "accumulate-twice"};
    pt_describe(c, "relation %s: ", names[relation]);
    gcase g;
    gcase_generate(c, &g, (relation == 3 || relation == 4) ? GEN_NEED_IDS : 0);
    switch (relation) {
    case 0: rel_permute(c, &g, 0); break;
    case 1: rel_permute(c, &g, 1); break;
    case 2: rel_reduce(c, &g); break;
    case 3: rel_relabel(c, &g, 0); break;
    case 4: rel_relabel(c, &g, 1); break;
    default: rel_accumulate_twice(c, &g); break;
    }
    gcase_free(&g);
}

/* ---------------------------------------------------------------------------------------------------
 * adjoint identities: <dY, fwd(X)> == <dX, X> and <dY, fwd_W(X)> == <dW, W>
 * ------------------------------------------------------------------------------------------------- */
void pt_gemm_adjoint(pt_case *c)
{
    gcase g;
    gcase_generate(c, &g, 0);
    g.opt.accumulate = 0;
    if (!g.opt.permute_x)
        g.opt.reduce_topk = 0; /* [T][K] dX pairs with token-order X only */
    if (g.opt.dtype == MOE_F16 && (g.dist == PT_DIST_LARGE || g.dist == PT_DIST_WIDE))
        g.dist = PT_DIST_UNIFORM; /* these overflow f16 outputs; see the discard below */
    g.r.gather_indices = g.gather;
    gcase_fill_values(&g);
    const moe_dtype dt = g.opt.dtype, wdt = gop_out_dtype(&g, GOP_DW);
    void *y = run_op(c, &g, GOP_FWD, "adjoint"), *dx = run_op(c, &g, GOP_DX, "adjoint"), *dw = run_op(c, &g, GOP_DW, "adjoint");
    const int64_t ny = gop_out_count(&g, GOP_FWD), nx = gop_out_count(&g, GOP_DX), nw = gop_out_count(&g, GOP_DW);
    double *v = xmalloc((size_t)(ny + nx + nw + 1) * sizeof(double)), *b = xmalloc((size_t)(ny + nx + nw + 1) * sizeof(double));
    gop_oracle(&g, GOP_FWD, NULL, v, b);
    gop_oracle(&g, GOP_DX, NULL, v + ny, b + ny);
    gop_oracle(&g, GOP_DW, NULL, v + ny + nx, b + ny + nx);
    /* the identity needs finite outputs: a case whose exact result may round to Inf is not applicable
     * (gemm-fwd/dx/dw check such outputs) */
    for (int64_t i = 0; i < ny + nx + nw; i++)
        if (!(fabs(v[i]) + b[i] < oracle_overflow_threshold(i < ny + nx ? dt : wdt))) {
            pt_discard(c, "an output may overflow its dtype; the adjoint identity needs finite outputs");
            break;
        }
    if (c->outcome == PT_DISCARD) {
        free(v), free(b), free(y), free(dx), free(dw);
        gcase_free(&g);
        return;
    }
    /* <dY, Y>: dY has Y's layout in every mode */
    double dyy = 0, dyy_mag = 0, dyy_err = 0;
    for (int64_t i = 0; i < ny; i++) {
        const double d = oracle_load(dt, g.dy, i), yy = oracle_load(dt, y, i);
        dyy += d * yy, dyy_mag += fabs(d * yy), dyy_err += fabs(d) * b[i];
    }
    /* <dX, X>: X row of dX row i */
    double dxx = 0, dxx_mag = 0, dxx_err = 0;
    for (int64_t i = 0; i < nx; i++) {
        const int64_t row = i / g.K, col = i % g.K;
        const int64_t xrow = g.opt.permute_x && !g.opt.reduce_topk ? row / g.k : row;
        const double d = oracle_load(dt, dx, i), xx = oracle_load(dt, g.x, xrow * g.K + col);
        dxx += d * xx, dxx_mag += fabs(d * xx), dxx_err += fabs(xx) * b[ny + i];
    }
    double dww = 0, dww_mag = 0, dww_err = 0;
    for (int64_t i = 0; i < nw; i++) {
        const double d = oracle_load(wdt, dw, i), ww = oracle_load(dt, g.w, i);
        dww += d * ww, dww_mag += fabs(d * ww), dww_err += fabs(ww) * b[ny + nx + i];
    }
    /* float64 evaluation of each inner product and of the exact identity's two sides */
    const double eval = 0x1p-52 * (double)(ny + nx + nw + 4) * (dyy_mag + dxx_mag + dww_mag);
    const double bx = dyy_err + dxx_err + eval, bw = dyy_err + dww_err + eval;
    const double ex = fabs(dyy - dxx), ew = fabs(dyy - dww);
    pt_ratio(c, bx > 0 ? ex / bx : (ex > 0 ? INFINITY : 0));
    pt_ratio(c, bw > 0 ? ew / bw : (ew > 0 ? INFINITY : 0));
    if (c->outcome != PT_FAIL && !(ex <= bx))
        pt_fail(c, "adjoint-x", "<dY, fwd(X)> = %.17g but <dX, X> = %.17g: |diff| %.3g > bound %.3g", dyy, dxx, ex, bx);
    if (c->outcome != PT_FAIL && !(ew <= bw))
        pt_fail(c, "adjoint-w", "<dY, fwd_W(X)> = %.17g but <dW, W> = %.17g: |diff| %.3g > bound %.3g", dyy, dww, ew, bw);
    free(v), free(b), free(y), free(dx), free(dw);
    gcase_free(&g);
}

/* ---------------------------------------------------------------------------------------------------
 * bad inputs
 * ------------------------------------------------------------------------------------------------- */
enum defect {
    D_SUM_MISMATCH, D_NEGATIVE_SIZE, D_GATHER_DUPLICATE, D_GATHER_RANGE, D_DTYPE, D_N_NEGATIVE, D_K_NEGATIVE,
    D_T_NEGATIVE, D_E_NOT_POSITIVE, D_TOPK_ZERO, D_NULL_TENSOR, D_NULL_GATHER, D_REDUCE_OUTSIDE_DX, D_TF32_HALF,
    D_OUT_OVERLAPS_IN, D_BACKEND, D_DX_ONLY_OUTSIDE_BWD, D_SCRATCH_NEGATIVE, DEFECTS
};

void pt_gemm_bad(pt_case *c)
{
    pt_source *s = c->src;
    const enum defect want = (enum defect)pt_pick(s, DEFECTS);
    const enum gop op = (enum gop)pt_pick(s, GOPS);
    gcase g;
    gcase_generate(c, &g, 0);
    g.opt.accumulate = 0, g.opt.allow_tf32 = 0;
    if (op != GOP_DX)
        g.opt.reduce_topk = 0;
    if (op == GOP_DTOPK)
        g.r.gather_indices = g.gather;
    gcase_fill_values(&g);
    void *old;
    void *out = gop_output(&g, op, &old);
    free(old);
    const int64_t cnt = gop_out_count(&g, op);
    const size_t out_bytes = (size_t)cnt * moe_dtype_size(gop_out_dtype(&g, op));
    memset(out, 0xa5, out_bytes);
    const size_t es = moe_dtype_size(g.opt.dtype);
    /* the op's first tensor input: dY for dX, X otherwise (checked unchanged afterwards) */
    void *in = op == GOP_DX ? g.dy : g.x;
    const size_t in_bytes = (size_t)(op == GOP_DX ? g.M * g.N : gcase_x_rows(&g) * g.K) * es;
    void *in_copy = xmalloc(in_bytes);
    memcpy(in_copy, in, in_bytes);
    int64_t *m_copy = xmalloc((size_t)g.E * sizeof(int64_t)), *g_copy = xmalloc((size_t)(g.M + 1) * sizeof(int64_t));

    enum defect d = want;
    const int needs_gather = g.opt.permute_x || g.opt.permute_y || g.weighted || g.opt.reduce_topk || op == GOP_DTOPK;
    /* a defect the case cannot carry falls back to a sum mismatch, which every case can */
    if ((d == D_GATHER_DUPLICATE && g.M < 2) || (d == D_GATHER_RANGE && g.M < 1) || (d == D_TOPK_ZERO && g.T < 1) ||
        (d == D_NULL_GATHER && (!needs_gather || g.M == 0)) || (d == D_REDUCE_OUTSIDE_DX && op == GOP_DX) ||
        (d == D_NULL_TENSOR && in_bytes == 0) || (d == D_OUT_OVERLAPS_IN && (cnt == 0 || in_bytes == 0)))
        d = D_SUM_MISMATCH;
    moe_routing r = g.r;
    moe_gemm_options o = g.opt;
    int64_t N = g.N, K = g.K;
    moe_backend backend = c->backend;
    const void *x = g.x, *w = g.w, *dy = g.dy;
    void *target = out;
    moe_status expect = MOE_ERR_INVALID_ROUTING;
    const char *mention = NULL;
    const int64_t e = pt_int(s, 0, g.E - 1);
    switch (d) {
    case D_SUM_MISMATCH: g.m_sizes[e] += 1 + (int64_t)pt_draw(s, 3); mention = "m_sizes"; break;
    case D_NEGATIVE_SIZE:
        g.m_sizes[e] = -1 - (int64_t)pt_draw(s, 3);
        mention = "m_sizes";
        break;
    case D_GATHER_DUPLICATE: {
        const int64_t i = pt_int(s, 0, g.M - 1), j = (i + 1 + pt_int(s, 0, g.M - 2)) % g.M;
        g.gather[i] = g.gather[j];
        r.gather_indices = g.gather;
        mention = "gather_indices";
        break;
    }
    case D_GATHER_RANGE: {
        const int64_t i = pt_int(s, 0, g.M - 1);
        g.gather[i] = pt_bool(s) ? g.M + (int64_t)pt_draw(s, 5) : -1 - (int64_t)pt_draw(s, 5);
        r.gather_indices = g.gather;
        mention = "gather_indices";
        break;
    }
    case D_DTYPE: o.dtype = (moe_dtype)(pt_bool(s) ? 3 + (int)pt_draw(s, 100) : -1); expect = MOE_ERR_INVALID_DTYPE; mention = "dtype"; break;
    case D_N_NEGATIVE: N = -1 - (int64_t)pt_draw(s, 7); expect = MOE_ERR_INVALID_SHAPE; mention = "N"; break;
    case D_K_NEGATIVE: K = -1 - (int64_t)pt_draw(s, 7); expect = MOE_ERR_INVALID_SHAPE; mention = "K"; break;
    case D_T_NEGATIVE: r.num_tokens = -1 - (int64_t)pt_draw(s, 7); expect = MOE_ERR_INVALID_SHAPE; mention = "num_tokens"; break;
    case D_E_NOT_POSITIVE: r.num_experts = -(int64_t)pt_draw(s, 3); expect = MOE_ERR_INVALID_SHAPE; mention = "num_experts"; break;
    case D_TOPK_ZERO: r.topk = 0; expect = MOE_ERR_INVALID_SHAPE; mention = "topk"; break;
    case D_NULL_TENSOR:
        expect = MOE_ERR_NULL_POINTER;
        if (op == GOP_DX)
            dy = NULL, mention = "dy";
        else
            x = NULL, mention = "x";
        break;
    case D_NULL_GATHER: r.gather_indices = NULL; expect = MOE_ERR_NULL_POINTER; mention = "gather_indices"; break;
    case D_REDUCE_OUTSIDE_DX: o.reduce_topk = 1; r.gather_indices = g.gather; expect = MOE_ERR_INVALID_OPTION; mention = "reduce_topk"; break;
    case D_TF32_HALF: o.dtype = pt_bool(s) ? MOE_BF16 : MOE_F16; o.allow_tf32 = 1; expect = MOE_ERR_INVALID_OPTION; mention = "allow_tf32"; break;
    case D_OUT_OVERLAPS_IN: {
        /* the output starts inside the first input, at an offset aligned to both element sizes (a
         * 4-byte dw_fp32 output one 2-byte element in would be a second defect: MOE_ERR_MISALIGNED) */
        const size_t out_es = moe_dtype_size(gop_out_dtype(&g, op)), align = out_es > es ? out_es : es;
        target = (char *)in + in_bytes / 2 / align * align;
        expect = MOE_ERR_INVALID_OPTION;
        mention = "overlap";
        break;
    }
    case D_BACKEND: backend = (moe_backend)(7 + (int)pt_draw(s, 9)); expect = MOE_ERR_NO_BACKEND; break;
    case D_DX_ONLY_OUTSIDE_BWD: o.dx_only = 1; expect = MOE_ERR_INVALID_OPTION; mention = "dx_only"; break;
    case D_SCRATCH_NEGATIVE:
        o.ref_scratch_bytes = -1 - (int64_t)pt_draw(s, 1000);
        expect = MOE_ERR_INVALID_OPTION;
        mention = "ref_scratch_bytes";
        break;
    default: break;
    }
    memcpy(m_copy, g.m_sizes, (size_t)g.E * sizeof(int64_t));
    memcpy(g_copy, g.gather, (size_t)g.M * sizeof(int64_t));
    pt_describe(c, " defect=%d op=%s", (int)d, gop_name(op));
    moe_status st;
    const void *tw = g.weighted ? g.tw : NULL;
    switch (op) {
    case GOP_FWD: st = moe_gemm_fwd(backend, &r, N, K, x, w, tw, target, &o); break;
    case GOP_DX: st = moe_gemm_dx(backend, &r, N, K, dy, w, tw, target, &o); break;
    case GOP_DW: st = moe_gemm_dw(backend, &r, N, K, x, dy, tw, target, &o); break;
    default: st = moe_gemm_topk_weights_grad(backend, &r, N, K, x, w, dy, target, &o); break;
    }
    if (st != expect)
        pt_fail(c, "bad-status", "defect %d on %s: status %s (%s), expected %s", (int)d, gop_name(op), moe_strerror(st),
                moe_last_error(), moe_strerror(expect));
    else if (moe_last_error()[0] == '\0')
        pt_fail(c, "bad-message", "defect %d on %s: %s but moe_last_error() is empty", (int)d, gop_name(op), moe_strerror(st));
    else if (mention && strstr(moe_last_error(), mention) == NULL)
        pt_fail(c, "bad-message", "defect %d on %s: message '%s' does not mention '%s'", (int)d, gop_name(op), moe_last_error(), mention);
    for (size_t i = 0; i < out_bytes; i++)
        if (((unsigned char *)out)[i] != 0xa5) {
            pt_fail(c, "bad-wrote", "defect %d on %s: output byte %zu changed by a rejected call", (int)d, gop_name(op), i);
            break;
        }
    if (memcmp(in_copy, in, in_bytes) != 0)
        pt_fail(c, "bad-wrote", "defect %d on %s: an input changed in a rejected call", (int)d, gop_name(op));
    if (memcmp(m_copy, g.m_sizes, (size_t)g.E * sizeof(int64_t)) != 0 || memcmp(g_copy, g.gather, (size_t)g.M * sizeof(int64_t)) != 0)
        pt_fail(c, "bad-wrote", "defect %d on %s: the routing changed", (int)d, gop_name(op));
    free(out), free(in_copy), free(m_copy), free(g_copy);
    gcase_free(&g);
}
