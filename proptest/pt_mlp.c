/*
 * MLP properties (ops mlp and mlp-meta).  The expectation and its bound come from oracle/mlp_bound.c:
 * a float64 evaluation in running-error arithmetic, every intermediate quantity carrying a bound on the
 * error a correct float32, round-once implementation may have in it (the rules and their justification:
 * specs/MLP.md "Error bound"; how the fuzzer uses them: specs/PROPTEST.md).  On tiny cases the gradients
 * are also compared with float64 central finite differences, which validates the analytic expectation
 * itself.  This file only draws the cases from the choice stream.
 */
#include "pt.h"
#include "pt_gen.h"
#include "pt_mlp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MLP_CAP_WEIGHTS ((int64_t)1 << 21) /* E * H * 3I elements of w_gu + w_d */

static const int64_t block_sizes[] = {1, 2, 3, 4, 5, 8, 16, 128};

void pt_mlp_generate(pt_case *c, pt_mlp_draw *d)
{
    pt_source *s = c->src;
    memset(d, 0, sizeof *d);
    const int shape = pt_pick(s, 4);
    const int kind = pt_pick(s, PT_ROUTE_KINDS_FROM_TOPK);
    d->opt.dtype = (moe_dtype)pt_pick(s, 3);
    d->opt.activation = (moe_mlp_activation)pt_pick(s, MOE_MLP_ACTIVATION_COUNT);
    d->opt.affinity = (moe_mlp_affinity)pt_pick(s, 2);
    d->opt.bias = pt_bool(s);
    d->opt.padding = (moe_mlp_padding)pt_pick(s, 2);
    d->layout_mode = pt_pick(s, 3);
    d->clamp_mask = (int)pt_draw(s, 15);
    d->opt.accumulate = pt_bool(s);
    d->opt.grad_fp32 = pt_bool(s);
    const int overwrite = pt_bool(s);
    d->opt.block_size = block_sizes[pt_pick(s, s->size >= 30 ? 8 : 6)];
    const int topk_kind = pt_pick(s, 3);
    d->down_ckpt_in_bwd = d->opt.affinity == MOE_AFFINITY_ON_H || pt_bool(s);
    int64_t T, E, H, I, k = 1;
    const char *shape_name = "tiny";
    switch (shape) {
    case 0: E = pt_sized(s, 1, 6), T = pt_sized(s, 0, 10), H = pt_sized(s, 0, 6), I = pt_sized(s, 0, 5); break;
    case 1:
        shape_name = "odd";
        E = pt_sized(s, 1, 12), T = pt_sized(s, 0, 32), H = 2 * pt_sized(s, 0, 12) + 1, I = 2 * pt_sized(s, 0, 10) + 1;
        break;
    case 2:
        shape_name = "wide"; /* past the reference's 128-column and 64-deep tiles */
        E = pt_sized(s, 1, 3), T = pt_sized(s, 0, 8), H = 16 + pt_sized(s, 0, 184), I = 16 + pt_sized(s, 0, 120);
        break;
    default: {
        const pt_model *m = &pt_models[pt_pick(s, PT_MODELS)];
        shape_name = m->name;
        /* one of H, I at the model's size, the other small; E capped by the weight budget */
        const int full_h = pt_bool(s);
        H = full_h ? m->H : pt_int(s, 1, 8);
        I = full_h ? pt_int(s, 1, 8) : m->I;
        E = min64(m->E, max64(1, MLP_CAP_WEIGHTS / (3 * H * I)));
        T = pt_sized(s, 1, 4);
        k = m->k;
        break;
    }
    }
    int64_t *allowed = xmalloc((size_t)E * sizeof(int64_t));
    const int64_t A = pt_allowed_experts(kind, E, allowed);
    free(allowed);
    if (shape != 3)
        k = topk_kind == 0 ? 1 : topk_kind == 1 ? pt_int(s, 1, min64(A, 3)) : A;
    k = min64(k, A);
    d->opt.tensor_update_overwrite = overwrite && k == 1;
    d->T = T, d->E = E, d->k = k, d->H = H, d->I = I;
    d->ids = xmalloc((size_t)(T * k + 1) * sizeof(int64_t));
    pt_gen_topk_ids(s, kind, T, k, E, d->ids);
    d->seed = pt_draw(s, 0xffffffffu);
    /* drawn last, so that the reproducers recorded before the option existed (a missing choice reads as
     * 0) still make the same cases; f32 ignores it (specs/MLP.md "Rounded intermediates") */
    d->opt.float32_intermediates = !pt_bool(s);
    static const char *const modes[3] = {"dropless", "dropping", "shuffled"};
    pt_describe(c, "%s T=%lld E=%lld k=%lld H=%lld I=%lld B=%lld %s routing=%s %s affinity=%s%s pad=%s layout=%s "
                "clamps=%x%s%s%s%s%s",
                shape_name, (long long)T, (long long)E, (long long)k, (long long)H, (long long)I,
                (long long)d->opt.block_size, moe_dtype_name(d->opt.dtype), pt_routing_kind_name(kind),
                moe_mlp_activation_name(d->opt.activation), d->opt.affinity ? "I" : "H", d->opt.bias ? " bias" : "",
                d->opt.padding ? "row" : "skip", modes[d->layout_mode], d->clamp_mask,
                d->opt.accumulate ? " accumulate" : "", d->opt.grad_fp32 ? " grad_fp32" : "",
                d->opt.tensor_update_overwrite ? " overwrite" : "", d->down_ckpt_in_bwd ? "" : " no-down-ckpt",
                d->opt.float32_intermediates ? " float32-intermediates" : "");
}

void pt_mlp_draw_values(pt_case *c, pt_mlp_draw *d)
{
    d->value_dist = pt_pick(c->src, MT_VALUE_DISTS);
    /* large: 2^6..2^10 (pre-activations far past float32 exp's range: |g| ~ 64..1024 and more);
     * tiny: 2^-10..2^-20 (f16: subnormal and zero hidden rows) */
    d->value_log2 = d->value_dist == MT_VALUES_LARGE  ? (int)pt_int(c->src, 6, 10)
                    : d->value_dist == MT_VALUES_TINY ? -(int)pt_int(c->src, 10, 20)
                                                      : 0;
}

/* " values=..." of the built case (the scale actually used: f16 may lower it) */
void pt_mlp_describe_values(pt_case *c, const mt_case *m)
{
    if (m->value_dist == MT_VALUES_LARGE || m->value_dist == MT_VALUES_TINY)
        pt_describe(c, " values=%s(hidden*2^%d)", mt_value_dist_name(m->value_dist), m->value_log2);
    else if (m->value_dist != MT_VALUES_UNIFORM)
        pt_describe(c, " values=%s", mt_value_dist_name(m->value_dist));
}

/* Builds the test library's case (layout, inputs, clamp limits in gaps of the data). */
void pt_mlp_build(const pt_mlp_draw *d, const moe_mlp_options *opt, int layout_mode, mt_case *m)
{
    mt_case_init_routing(m, d->seed, d->T, d->E, d->k, d->H, d->I, d->ids, opt, layout_mode);
    mt_case_set_values(m, d->value_dist, d->value_log2, d->H > 16 || d->I > 16);
    if (d->clamp_mask)
        (void)mt_choose_clamps(m, d->clamp_mask); /* no gap wide enough: that limit stays unset */
}

/* Finite differences cost (parameters) x (one float64 forward): only on tiny cases. */
static int fd_affordable(const mt_case *m)
{
    const double params = (double)(m->E * m->H * 3 * m->I + m->T1 * m->H + m->T * m->E + m->E * (2 * m->I + m->H));
    const double forward = (double)(m->N * m->B) * (double)(3 * m->H * m->I + m->H + 1);
    return params * forward <= 4e6;
}

int64_t pt_mlp_run_checked(pt_case *c, const mt_case *m, int checks, int down_ckpt, mt_result *res, const char *what)
{
    mt_worst_ratio = 0.0;
    const int64_t bad = mt_run(m, checks, down_ckpt, res);
    pt_ratio(c, mt_worst_ratio);
    if (bad)
        pt_fail(c, "mlp-bound", "%s: %lld outputs outside the float64 running-error bound%s (details below)", what,
                (long long)bad, (checks & MT_CHECK_FD) ? " or the finite differences" : "");
    return bad;
}

void pt_mlp(pt_case *c)
{
    pt_mlp_draw d;
    pt_mlp_generate(c, &d);
    pt_mlp_draw_values(c, &d);
    mt_case m;
    pt_mlp_build(&d, &d.opt, d.layout_mode, &m);
    /* f16/bf16: also every rounding of the spec in its exact place (checkpoints, round_intermediates,
     * outputs): MT_CHECK_EXACT_ROUNDING.  The finite differences assume |data| <= 1 (their third-
     * derivative bound, testlib/mlp_check.c): not for large values. */
    const int fd = fd_affordable(&m) && d.value_dist != MT_VALUES_LARGE;
    const int checks = MT_CHECK_BOUND | (fd ? MT_CHECK_FD : 0) | (m.opt.dtype != MOE_F32 ? MT_CHECK_EXACT_ROUNDING : 0);
    pt_mlp_describe_values(c, &m);
    pt_describe(c, " N=%lld%s", (long long)m.N, checks & MT_CHECK_FD ? " +fd" : "");
    pt_mlp_run_checked(c, &m, checks, d.down_ckpt_in_bwd, NULL, "mlp");
    mt_case_free(&m);
    free(d.ids);
}

/* Exact zeros in the weight/bias gradients of experts no position of the layout serves with a token. */
static void empty_expert_zero_grads(pt_case *c, const mt_case *m, const mt_result *r)
{
    const moe_dtype gdt = m->opt.grad_fp32 ? MOE_F32 : m->opt.dtype;
    unsigned char *served = xcalloc((size_t)m->E + 1, 1);
    for (int64_t p = 0; p < m->N * m->B; p++)
        if (m->ids[p] >= 0 && m->ids[p] < m->T)
            served[m->b2e[p / m->B]] = 1;
    const int64_t per[4] = {m->H * 2 * m->I, m->I * m->H, 2 * m->I, m->H};
    const void *bufs[4] = {r->d_wgu, r->d_wd, r->d_bgu, r->d_bd};
    static const char *const names[4] = {"d_w_gu", "d_w_d", "d_b_gu", "d_b_d"};
    for (int64_t e = 0; e < m->E && c->outcome != PT_FAIL; e++) {
        if (served[e])
            continue;
        for (int q = 0; q < 4 && c->outcome != PT_FAIL; q++) {
            if (bufs[q] == NULL)
                continue;
            for (int64_t i = e * per[q]; i < (e + 1) * per[q]; i++) {
                const double v = mt_load(gdt, bufs[q], i);
                if (v != 0.0 || signbit(v)) {
                    pt_fail(c, "empty-expert", "expert %lld serves no token but %s[%lld] = %.9g (want +0)", (long long)e,
                            names[q], (long long)i, v);
                    break;
                }
            }
        }
    }
    free(served);
}

/* Relabelling (relations 4, 5): the case with its experts (tokens) permuted by a drawn permutation,
 * checked against its own bound, gives every result at the permuted place: outputs, d_hidden,
 * d_affinities and the weight and bias gradients within the sum of both bounds.  A dropless case gets
 * the builder's layout of the relabelled routing (another position order, so other summation orders);
 * dropping and shuffled layouts are mapped position by position (a rebuilt dropping layout would drop
 * other pairs when tokens move). */
static void relabel_relation(pt_case *c, const pt_mlp_draw *d, const mt_case *m1, const mt_result *r1, int tokens,
                             int checks, const char *name)
{
    const int64_t n = tokens ? m1->T : m1->E;
    int64_t *perm = xmalloc((size_t)(n + 1) * sizeof(int64_t));
    pt_permutation(c->src, n, perm);
    int64_t moved = 0;
    for (int64_t i = 0; i < n; i++)
        moved += perm[i] != i;
    pt_describe(c, " (%lld of %lld %s moved)", (long long)moved, (long long)n, tokens ? "tokens" : "experts");
    mt_case m2;
    mt_result r2;
    mt_case_relabel(m1, tokens ? perm : NULL, tokens ? NULL : perm, d->layout_mode == MT_DROPLESS, &m2);
    pt_mlp_run_checked(c, &m2, checks, d->down_ckpt_in_bwd, &r2, name);
    const int64_t bad = mt_compare_relabelled(m1, r1, &m2, &r2, tokens ? perm : NULL, tokens ? NULL : perm, name);
    if (bad)
        pt_fail(c, name, "%lld results differ from the relabelled case's, at the permuted place, by more than the "
                "sum of both bounds (details below)", (long long)bad);
    mt_result_free(&r2);
    mt_case_free(&m2);
    free(perm);
}

void pt_mlp_meta(pt_case *c)
{
    /* relations appended at the end keep the recorded choices of the older ones */
    const int relation = pt_pick(c->src, 6);
    static const char *const names[6] = {"block-size", "affinity-H-vs-I", "empty-expert", "overwrite",
                                         "relabel-experts", "relabel-tokens"};
    pt_describe(c, "relation %s: ", names[relation]);
    pt_mlp_draw d;
    pt_mlp_generate(c, &d);
    d.opt.accumulate = 0; /* the comparisons below bound the two results without prior gradient contents */
    moe_mlp_options o1 = d.opt, o2 = d.opt;
    int mode1 = d.layout_mode, mode2 = d.layout_mode;
    switch (relation) {
    case 0: /* the same routing in blocks of another size */
        o2.block_size = block_sizes[pt_pick(c->src, 8)];
        mode1 = mode2 = MT_DROPLESS; /* dropping drops a B-dependent set of pairs */
        pt_describe(c, " vs B=%lld", (long long)o2.block_size);
        break;
    case 1:
        o1.affinity = MOE_AFFINITY_ON_H, o2.affinity = MOE_AFFINITY_ON_I;
        d.down_ckpt_in_bwd = 1;
        break;
    case 3:
        if (d.k != 1) {
            pt_discard(c, "overwrite needs top-1 routing");
            free(d.ids);
            return;
        }
        o1.tensor_update_overwrite = 0, o2.tensor_update_overwrite = 1;
        break;
    default: break;
    }
    mt_case m1, m2;
    mt_result r1, r2;
    pt_mlp_build(&d, &o1, mode1, &m1);
    const int checks = MT_CHECK_BOUND | (d.opt.dtype != MOE_F32 ? MT_CHECK_EXACT_ROUNDING : 0);
    pt_mlp_run_checked(c, &m1, checks, d.down_ckpt_in_bwd, &r1, names[relation]);
    if (relation == 2) {
        empty_expert_zero_grads(c, &m1, &r1);
    } else if (relation >= 4) {
        relabel_relation(c, &d, &m1, &r1, relation == 5, checks, names[relation]);
    } else {
        /* the second case has the same inputs: the clamp limits of the first are reused */
        pt_mlp_build(&d, &o2, mode2, &m2);
        m2.opt.has_linear_clamp_lower_limit = m1.opt.has_linear_clamp_lower_limit;
        m2.opt.has_linear_clamp_upper_limit = m1.opt.has_linear_clamp_upper_limit;
        m2.opt.has_non_linear_clamp_lower_limit = m1.opt.has_non_linear_clamp_lower_limit;
        m2.opt.has_non_linear_clamp_upper_limit = m1.opt.has_non_linear_clamp_upper_limit;
        m2.opt.linear_clamp_lower_limit = m1.opt.linear_clamp_lower_limit;
        m2.opt.linear_clamp_upper_limit = m1.opt.linear_clamp_upper_limit;
        m2.opt.non_linear_clamp_lower_limit = m1.opt.non_linear_clamp_lower_limit;
        m2.opt.non_linear_clamp_upper_limit = m1.opt.non_linear_clamp_upper_limit;
        pt_mlp_run_checked(c, &m2, checks, d.down_ckpt_in_bwd, &r2, names[relation]);
        if (relation == 3) {
            if (!mt_results_identical(&m1, &r1, &r2, 1))
                pt_fail(c, "overwrite", "top-1 with tensor_update_overwrite differs bitwise from accumulating updates");
        } else {
            const int64_t bad = mt_compare_results(&m1, &r1, &m2, &r2, names[relation]);
            if (bad)
                pt_fail(c, names[relation], "%lld outputs differ by more than the sum of both bounds (details below)",
                        (long long)bad);
        }
        mt_result_free(&r2);
        mt_case_free(&m2);
    }
    mt_result_free(&r1);
    mt_case_free(&m1);
    free(d.ids);
}
