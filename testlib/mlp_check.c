/* The MLP test library's checker: runs the forward and backward (through the mt_mlp_fwd / mt_mlp_bwd hooks),
 * checks every output against the analytic expectation and the finite differences, and compares result
 * sets of two runs; see mlp_testlib.h. */
#include "mlp_internal.h"
#include "check.h"

#include <math.h>
#include <string.h>

double mt_worst_ratio;

/* ---------------------------------------------------------------------------------------------------
 * running the reference and checking
 * ------------------------------------------------------------------------------------------------- */
static void *talloc(moe_dtype dt, int64_t n)
{
    void *p = xmalloc((size_t)(n > 0 ? n : 1) * moe_dtype_size(dt));
    oracle_poison(dt, p, n);
    return p;
}

void mt_result_free(mt_result *r)
{
    void *ps[] = {r->out, r->ckpt_gu, r->ckpt_d, r->d_hidden, r->d_aff, r->d_wgu, r->d_wd, r->d_bgu, r->d_bd};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
        free(ps[i]);
    memset(r, 0, sizeof *r);
}

/* Compares got[i] with the analytic want[i] (within want.e) and, when fd is non-NULL, with the finite
 * difference fd[i] + base[i] (within want.e + the finite-difference error fd_err). */
static int64_t compare(const mt_case *c, const char *label, moe_dtype dt, const void *got, const ev *want,
                       const double *fd, const double *base, double fd_err, int64_t count, int checks)
{
    int64_t bad = 0;
    for (int64_t i = 0; i < count; i++) {
        const double gv = oracle_load(dt, got, i), wv = want[i].v, bound = want[i].e;
        const double fv = fd ? fd[i] + (base ? base[i] : 0.0) : wv;
        int fail = !isfinite(gv) && isfinite(wv);
        if ((checks & MT_CHECK_BOUND) && fabs(gv - wv) > bound)
            fail = 1;
        if (checks & MT_CHECK_BOUND) {
            double ratio = bound > 0 ? fabs(gv - wv) / bound : (gv == wv ? 0.0 : INFINITY);
            if (isnan(ratio))
                ratio = INFINITY;
            if (ratio > mt_worst_ratio)
                mt_worst_ratio = ratio;
        }
        if ((checks & MT_CHECK_FD) && fd) {
            if (fabs(gv - fv) > bound + fd_err)
                fail = 1;
            if (fabs(wv - fv) > fd_err)
                fail = 2;
        }
        if (fail) {
            if (bad < 6 && fd)
                fprintf(stderr,
                        "  %s[%lld]: got %.9g, analytic %.9g, finite difference %.9g, bound %.3g (+fd %.3g)%s "
                        "[seed %llu]\n",
                        label, (long long)i, gv, wv, fv, bound, fd_err,
                        fail == 2 ? " (analytic vs finite difference)" : "", (unsigned long long)c->seed);
            else if (bad < 6)
                fprintf(stderr, "  %s[%lld]: got %.9g, analytic %.9g, bound %.3g [seed %llu]\n", label, (long long)i,
                        gv, wv, bound, (unsigned long long)c->seed);
            bad++;
        }
    }
    return bad;
}

static void describe(const mt_case *c, FILE *f)
{
    const moe_mlp_options *o = &c->opt;
    fprintf(f, "case seed %llu: T=%lld E=%lld k=%lld H=%lld I=%lld B=%lld N=%lld dtype=%s act=%d aff=%s bias=%d "
            "pad=%s clamps=%d%d%d%d overwrite=%d accumulate=%d grad_fp32=%d float32_intermediates=%d values=%s "
            "(2^%d)\n",
            (unsigned long long)c->seed, (long long)c->T, (long long)c->E, (long long)c->k, (long long)c->H,
            (long long)c->I, (long long)c->B, (long long)c->N, moe_dtype_name(o->dtype), (int)o->activation,
            o->affinity ? "ON_I" : "ON_H", o->bias, o->padding ? "row" : "skip", o->has_linear_clamp_lower_limit,
            o->has_linear_clamp_upper_limit, o->has_non_linear_clamp_lower_limit,
            o->has_non_linear_clamp_upper_limit, o->tensor_update_overwrite, o->accumulate, o->grad_fp32,
            o->float32_intermediates, mt_value_dist_name(c->value_dist), c->value_log2);
}

static double *to_double(moe_dtype dt, const void *src, int64_t n)
{
    double *d = dalloc(n);
    for (int64_t i = 0; i < n; i++)
        d[i] = oracle_load(dt, src, i);
    return d;
}

/* With accumulate: the starting contents of d_w_gu, d_w_d, d_b_gu, d_b_d (the non-NULL ones of bufs, of
 * the gradient dtype), random from the case's seed, written into bufs and returned as doubles in old
 * (free them); without accumulate old stays NULL. */
static void start_grads(const mt_case *c, void *bufs[4], double *old[4])
{
    const int64_t H = c->H, I = c->I, I2 = 2 * c->I, E = c->E;
    const moe_dtype gdt = c->opt.grad_fp32 ? MOE_F32 : c->opt.dtype;
    if (!c->opt.accumulate)
        return;
    oracle_rng rng = {c->seed * 7 + 3};
    const int64_t counts[4] = {E * H * I2, E * I * H, E * I2, E * H};
    for (int q = 0; q < 4; q++)
        if (bufs[q]) {
            oracle_fill(&rng, gdt, bufs[q], counts[q], 0);
            old[q] = to_double(gdt, bufs[q], counts[q]);
        }
}

/* Every output of r against the expectation X (labels get `suffix`); fd[6] (d_hidden, d_affinities,
 * d_w_gu, d_w_d, d_b_gu, d_b_d, or NULL each) the finite differences, old[4] the gradients' starting
 * contents (accumulate) or NULL. */
static int64_t compare_all(const mt_case *c, const mt_result *r, const expect *X, const double *const fd[6],
                           double *const old[4], double fd_err, int checks, const char *suffix)
{
    const int64_t H = c->H, I = c->I, I2 = 2 * I, E = c->E, NB = c->N * c->B, T = c->T;
    const moe_dtype dt = c->opt.dtype, gdt = c->opt.grad_fp32 ? MOE_F32 : dt;
    const int bchk = checks & MT_CHECK_BOUND;
    struct {
        const char *name;
        moe_dtype dt;
        const void *got;
        const ev *want;
        const double *fd, *base;
        int64_t n;
        int checks;
    } items[] = {
        {"out", dt, r->out, X->out, NULL, NULL, c->T1 * H, bchk},
        /* checkpoints: analytic value within bound (padding positions exactly +0 via a zero bound) */
        {"gate_up_ckpt_T", dt, r->ckpt_gu, X->ckpt_gu, NULL, NULL, c->N * I2 * c->B, bchk},
        {"down_ckpt", dt, r->ckpt_d, X->ckpt_d, NULL, NULL, NB * H, bchk},
        {"d_hidden", dt, r->d_hidden, X->dx, fd[0], NULL, c->T1 * H, checks},
        {"d_affinities", dt, r->d_aff, X->da, fd[1], NULL, T * E, checks},
        {"d_w_gu", gdt, r->d_wgu, X->dwgu, fd[2], old[0], E * H * I2, checks},
        {"d_w_d", gdt, r->d_wd, X->dwd, fd[3], old[1], E * I * H, checks},
        {"d_b_gu", gdt, r->d_bgu, X->dbgu, fd[4], old[2], c->opt.bias ? E * I2 : 0, checks},
        {"d_b_d", gdt, r->d_bd, X->dbd, fd[5], old[3], c->opt.bias ? E * H : 0, checks},
    };
    int64_t bad = 0;
    for (size_t k = 0; k < sizeof items / sizeof items[0]; k++) {
        char label[64];
        snprintf(label, sizeof label, "%s%s", items[k].name, suffix);
        bad += compare(c, label, items[k].dt, items[k].got, items[k].want, items[k].fd, items[k].base, fd_err,
                       items[k].n, items[k].checks);
    }
    return bad;
}

mt_fwd_fn mt_mlp_fwd = moe_mlp_fwd;
mt_bwd_fn mt_mlp_bwd = moe_mlp_bwd;
moe_backend mt_backend = MOE_BACKEND_REF;
int mt_split_operands = 0;

int64_t mt_run(const mt_case *c, int checks, int down_ckpt_in_bwd, mt_result *res)
{
    const int64_t H = c->H, I = c->I, I2 = 2 * I, E = c->E, NB = c->N * c->B, T = c->T;
    const moe_dtype dt = c->opt.dtype, gdt = c->opt.grad_fp32 ? MOE_F32 : dt;
    const int bias = c->opt.bias;
    mt_result r;
    r.out = talloc(dt, c->T1 * H);
    r.ckpt_gu = talloc(dt, c->N * I2 * c->B);
    r.ckpt_d = talloc(dt, NB * H);
    r.d_hidden = talloc(dt, c->T1 * H);
    r.d_aff = talloc(dt, T * E);
    r.d_wgu = talloc(gdt, E * H * I2);
    r.d_wd = talloc(gdt, E * I * H);
    r.d_bgu = bias ? talloc(gdt, E * I2) : NULL;
    r.d_bd = bias ? talloc(gdt, E * H) : NULL;
    double *old[4] = {NULL, NULL, NULL, NULL};
    void *bufs[4] = {r.d_wgu, r.d_wd, r.d_bgu, r.d_bd};
    start_grads(c, bufs, old);

    moe_mlp_options fo = c->opt;
    fo.accumulate = 0;
    fo.grad_fp32 = 0;
    moe_status st = mt_mlp_fwd(mt_backend, &c->layout, H, I, c->hidden, c->aff, c->w_gu, c->w_d,
                               bias ? c->b_gu : NULL, bias ? c->b_d : NULL, r.out, r.ckpt_gu, r.ckpt_d, &fo);
    if (st != MOE_OK) {
        describe(c, stderr);
        REQUIRE(0, "moe_mlp_fwd: %s (%s)", moe_strerror(st), moe_last_error());
    }
    st = mt_mlp_bwd(mt_backend, &c->layout, H, I, c->hidden, c->aff, c->w_gu, c->w_d,
                    bias ? c->b_d : NULL, r.ckpt_gu, down_ckpt_in_bwd ? r.ckpt_d : NULL, c->G, r.d_hidden,
                    r.d_aff, r.d_wgu, r.d_wd, r.d_bgu, r.d_bd, &c->opt);
    if (st != MOE_OK) {
        describe(c, stderr);
        REQUIRE(0, "moe_mlp_bwd: %s (%s)", moe_strerror(st), moe_last_error());
    }

    expect X;
    mt_compute_expect(c, old[0], old[1], old[2], old[3], down_ckpt_in_bwd, 0, mt_split_operands, &X);

    /* finite differences of L = <G, out> */
    double *fd_x = NULL, *fd_a = NULL, *fd_wgu = NULL, *fd_wd = NULL, *fd_bgu = NULL, *fd_bd = NULL;
    double fd_err = 0.0;
    if (checks & MT_CHECK_FD) {
        params64 q = mt_case_params(c); /* its arrays are perturbed and restored */
        double *out = dalloc(c->T1 * H), *m = dalloc(I);
        fd_x = dalloc(c->T1 * H), fd_a = dalloc(T * E), fd_wgu = dalloc(E * H * I2), fd_wd = dalloc(E * I * H);
        fd_bgu = dalloc(E * I2), fd_bd = dalloc(E * H);
        mt_fd_array(c, &q, q.x, c->T1 * H, fd_x, out, m);
        mt_fd_array(c, &q, q.A, T * E, fd_a, out, m);
        mt_fd_array(c, &q, q.wgu, E * H * I2, fd_wgu, out, m);
        mt_fd_array(c, &q, q.wd, E * I * H, fd_wd, out, m);
        if (bias) {
            mt_fd_array(c, &q, q.bgu, E * I2, fd_bgu, out, m);
            mt_fd_array(c, &q, q.bd, E * H, fd_bd, out, m);
        }
        /* finite-difference error: the rounding of L (depth ~ H + 3I + k terms, magnitude Lmag) divided
         * by the step, plus the truncation step^2/6 * |L'''|; for data in [-1, 1) every third
         * derivative is a sum of at most k*H*I terms each below 8 (specs/MLP.md) */
        double lmag = 0.0;
        for (int64_t i = 0; i < T * H; i++)
            lmag += fabs(c->g[i]) * (fabs(X.out[i].v) + 1.0);
        fd_err = 4.0 * (double)(H + 3 * I + c->k + 8) * 0x1p-53 * lmag / FD_STEP +
                 (double)(c->k * (H + 1) * (I + 1)) * 8.0 / 6.0 * FD_STEP * FD_STEP;
        free(out);
        free(m);
    }

    const double *fds[6] = {fd_x, fd_a, fd_wgu, fd_wd, fd_bgu, fd_bd};
    int64_t bad = compare_all(c, &r, &X, fds, old, fd_err, checks, "");
    if (checks & MT_CHECK_EXACT_ROUNDING) {
        expect XR;
        const double *no_fd[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
        mt_compute_expect(c, old[0], old[1], old[2], old[3], down_ckpt_in_bwd, 1, mt_split_operands, &XR);
        /* mt_worst_ratio stays the first bound's: here a correct result that rounded to the other
         * neighbour of a boundary inside the interval sits at ratio 1 exactly */
        const double worst = mt_worst_ratio;
        bad += compare_all(c, &r, &XR, no_fd, old, 0.0, MT_CHECK_BOUND, " (exact roundings)");
        mt_worst_ratio = worst;
        mt_expect_free(&XR);
    }
    if (bad)
        describe(c, stderr);
    mt_expect_free(&X);
    free(fd_x), free(fd_a), free(fd_wgu), free(fd_wd), free(fd_bgu), free(fd_bd);
    for (int q = 0; q < 4; q++)
        free(old[q]);
    r.split_operands = mt_split_operands;
    if (res)
        *res = r;
    else
        mt_result_free(&r);
    return bad;
}

/* Where element i of a result tensor of c1 sits in c2's labelling (token_map / expert_map NULL: the
 * same labels).  kind 0: token rows of `per` elements; 1: (token, expert) pairs [T][E]; 2: expert
 * blocks of `per` elements. */
static int64_t relabelled_index(int kind, int64_t per, int64_t E, const int64_t *token_map, const int64_t *expert_map,
                                int64_t i)
{
    switch (kind) {
    case 0: return token_map ? token_map[i / per] * per + i % per : i;
    case 1: return (token_map ? token_map[i / E] : i / E) * E + (expert_map ? expert_map[i % E] : i % E);
    default: return expert_map ? expert_map[i / per] * per + i % per : i;
    }
}

static int64_t compare_results_mapped(const mt_case *c1, const mt_result *r1, const mt_case *c2, const mt_result *r2,
                                      const int64_t *token_map, const int64_t *expert_map, const char *what)
{
    /* with accumulate, each result started from mt_run's contents for its case (the rounding of
     * old + sum is part of the bound) */
    expect X1, X2;
    double *old1[4] = {NULL, NULL, NULL, NULL}, *old2[4] = {NULL, NULL, NULL, NULL};
    const moe_dtype gdt1 = c1->opt.grad_fp32 ? MOE_F32 : c1->opt.dtype;
    const moe_dtype gdt2 = c2->opt.grad_fp32 ? MOE_F32 : c2->opt.dtype;
    const int64_t n1[4] = {mt_count_wgu(c1), mt_count_wd(c1), c1->opt.bias ? c1->E * 2 * c1->I : 0,
                           c1->opt.bias ? c1->E * c1->H : 0};
    const int64_t n2[4] = {mt_count_wgu(c2), mt_count_wd(c2), c2->opt.bias ? c2->E * 2 * c2->I : 0,
                           c2->opt.bias ? c2->E * c2->H : 0};
    void *tmp1[4], *tmp2[4];
    for (int q = 0; q < 4; q++) {
        tmp1[q] = q < 2 || c1->opt.bias ? talloc(gdt1, n1[q]) : NULL;
        tmp2[q] = q < 2 || c2->opt.bias ? talloc(gdt2, n2[q]) : NULL;
    }
    start_grads(c1, tmp1, old1);
    start_grads(c2, tmp2, old2);
    mt_compute_expect(c1, old1[0], old1[1], old1[2], old1[3], 1, 0, r1->split_operands, &X1);
    mt_compute_expect(c2, old2[0], old2[1], old2[2], old2[3], 1, 0, r2->split_operands, &X2);
    for (int q = 0; q < 4; q++) {
        free(tmp1[q]), free(tmp2[q]);
        free(old1[q]), free(old2[q]);
    }
    const int64_t H = c1->H, I2 = 2 * c1->I, E = c1->E, T = c1->T;
    const moe_dtype dt = c1->opt.dtype, gdt = c1->opt.grad_fp32 ? MOE_F32 : dt;
    struct {
        const char *name;
        moe_dtype dt;
        const void *a, *b;
        const ev *ea, *eb;
        int64_t n;
        int kind;    /* relabelled_index */
        int64_t per;
    } items[] = {
        {"out", dt, r1->out, r2->out, X1.out, X2.out, T * H, 0, H},
        {"d_hidden", dt, r1->d_hidden, r2->d_hidden, X1.dx, X2.dx, T * H, 0, H},
        {"d_affinities", dt, r1->d_aff, r2->d_aff, X1.da, X2.da, T * E, 1, E},
        {"d_w_gu", gdt, r1->d_wgu, r2->d_wgu, X1.dwgu, X2.dwgu, E * H * I2, 2, H * I2},
        {"d_w_d", gdt, r1->d_wd, r2->d_wd, X1.dwd, X2.dwd, E * c1->I * H, 2, c1->I * H},
        {"d_b_gu", gdt, r1->d_bgu, r2->d_bgu, X1.dbgu, X2.dbgu, c1->opt.bias ? E * I2 : 0, 2, I2},
        {"d_b_d", gdt, r1->d_bd, r2->d_bd, X1.dbd, X2.dbd, c1->opt.bias ? E * H : 0, 2, H},
    };
    int64_t bad = 0;
    for (size_t k = 0; k < sizeof items / sizeof items[0]; k++)
        for (int64_t i = 0; i < items[k].n; i++) {
            const int64_t j = relabelled_index(items[k].kind, items[k].per, E, token_map, expert_map, i);
            const double a = oracle_load(items[k].dt, items[k].a, i), b = oracle_load(items[k].dt, items[k].b, j);
            const double bound = items[k].ea[i].e + items[k].eb[j].e;
            if (!(fabs(a - b) <= bound)) {
                if (bad < 6 && what != NULL)
                    fprintf(stderr, "  %s: %s[%lld] vs [%lld]: %.9g vs %.9g, |diff| %.3g > bound %.3g [seed %llu]\n",
                            what, items[k].name, (long long)i, (long long)j, a, b, fabs(a - b), bound,
                            (unsigned long long)c1->seed);
                bad++;
            }
        }
    mt_expect_free(&X1);
    mt_expect_free(&X2);
    return bad;
}

int64_t mt_compare_results(const mt_case *c1, const mt_result *r1, const mt_case *c2, const mt_result *r2,
                           const char *what)
{
    return compare_results_mapped(c1, r1, c2, r2, NULL, NULL, what);
}

int64_t mt_compare_relabelled(const mt_case *c1, const mt_result *r1, const mt_case *c2, const mt_result *r2,
                              const int64_t *token_map, const int64_t *expert_map, const char *what)
{
    return compare_results_mapped(c1, r1, c2, r2, token_map, expert_map, what);
}

int mt_results_identical(const mt_case *c, const mt_result *r1, const mt_result *r2, int with_ckpts)
{
    const size_t es = moe_dtype_size(c->opt.dtype);
    const size_t gs = c->opt.grad_fp32 ? 4 : es;
    const int64_t H = c->H, I2 = 2 * c->I, E = c->E;
#define SAME(a, b, bytes) (memcmp((a), (b), (bytes)) == 0)
    int same = SAME(r1->out, r2->out, (size_t)(c->T1 * H) * es) &&
               SAME(r1->d_hidden, r2->d_hidden, (size_t)(c->T1 * H) * es) &&
               SAME(r1->d_aff, r2->d_aff, (size_t)(c->T * E) * es) &&
               SAME(r1->d_wgu, r2->d_wgu, (size_t)(E * H * I2) * gs) &&
               SAME(r1->d_wd, r2->d_wd, (size_t)(E * c->I * H) * gs);
    if (c->opt.bias)
        same = same && SAME(r1->d_bgu, r2->d_bgu, (size_t)(E * I2) * gs) && SAME(r1->d_bd, r2->d_bd, (size_t)(E * H) * gs);
    if (with_ckpts)
        same = same && SAME(r1->ckpt_gu, r2->ckpt_gu, (size_t)(c->N * I2 * c->B) * es) &&
               SAME(r1->ckpt_d, r2->ckpt_d, (size_t)(c->N * c->B * H) * es);
#undef SAME
    return same;
}
