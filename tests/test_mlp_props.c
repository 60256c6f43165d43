/* Metamorphic and regression properties of the blockwise MoE MLP reference:
 *   - the clamp masks are strict on the checkpointed value, exactly at the boundary (f32 and bf16,
 *     including a limit bf16 cannot represent);
 *   - AFFINITY_ON_H and AFFINITY_ON_I compute the same function (within the sum of both bounds);
 *   - the affinity gradient is <G, d> with d the forward's down checkpoint, and 0 outside the layout;
 *   - the same routing under block sizes 1, 2, 3, 5, 16, 128 gives the same outputs and gradients;
 *   - top-1 with tensor_update_overwrite gives bitwise the results of the default;
 *   - results are bitwise independent of the OpenMP thread count;
 *   - each NKI defect of SEMANTICS section 3: gate/up bias gradient has both halves (one thread too);
 *     B = 128 computes (nonzero, correct) gradients; odd E writes every affinity-gradient entry,
 *     the last T included; GELU and GELU_Tanh are not SiLU;
 *   - edge shapes: T = 0, T = 1, H = 0, I = 0, E much larger than T, all tokens on one expert,
 *     topk = E; and shapes past the reference's tile sizes.
 * usage: test_mlp_props [seed] */
#include "mlp_testlib.h"
#include "alloc.h"
#include "check.h"

#include <math.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static void set_threads(int n)
{
#ifdef _OPENMP
    omp_set_num_threads(n);
#else
    (void)n;
#endif
}

static void store(moe_dtype dt, void *base, int64_t i, double v)
{
    switch (dt) {
    case MOE_F16: ((uint16_t *)base)[i] = moe_f32_to_f16((float)v); return;
    case MOE_BF16: ((uint16_t *)base)[i] = moe_f32_to_bf16((float)v); return;
    case MOE_F32: ((float *)base)[i] = (float)v; return;
    case MOE_E4M3: ((uint8_t *)base)[i] = moe_f32_to_e4m3((float)v); return;
    case MOE_E5M2: ((uint8_t *)base)[i] = moe_f32_to_e5m2((float)v); return;
    }
}

/* Sets element i of an input (the dtype buffer and the double copy). */
static void set_in(const mt_case *c, void *buf, double *copy, int64_t i, double v)
{
    store(c->opt.dtype, buf, i, v);
    copy[i] = mt_load(c->opt.dtype, buf, i);
}

/* ---------------------------------------------------------------------------------------------------
 * strict masks at the boundary
 * ------------------------------------------------------------------------------------------------- */

/* One token, one expert, H = 2, I = 1, B = 1: g = 0.625 and u = 0.75 exactly (no bias). `which` picks the
 * limit (0 lin lo, 1 lin hi, 2 nl lo, 3 nl hi), set to `limit`.  Returns d_w_gu[h][c][0] for h = 0 and
 * the gate (c = 0) or up (c = 1) half belonging to the clamped quantity, and the checkpoint value. */
static void boundary_case(moe_dtype dt, int which, float limit, double *grad, double *ckpt, double *other_grad)
{
    moe_mlp_options o = {0};
    o.dtype = dt;
    o.block_size = 1;
    mt_case c;
    mt_case_init(&c, 77, 1, 1, 1, 2, 1, &o, MT_DROPLESS);
    /* w_gu[e][h][2][I]: gate column (c = 0), up column (c = 1) */
    const double x[2] = {0.5, 0.25}, wg[2] = {1.0, 0.5}, wu[2] = {1.0, 1.0}, wd[2] = {1.0, -0.5};
    for (int h = 0; h < 2; h++) {
        set_in(&c, c.hidden, c.x, h, x[h]);
        set_in(&c, c.w_gu, c.wgu, h * 2 + 0, wg[h]);
        set_in(&c, c.w_gu, c.wgu, h * 2 + 1, wu[h]);
        set_in(&c, c.w_d, c.wd, h, wd[h]);
        set_in(&c, c.G, c.g, h, 1.0);
    }
    set_in(&c, c.aff, c.A, 0, 1.0);
    int *has[4] = {&c.opt.has_linear_clamp_lower_limit, &c.opt.has_linear_clamp_upper_limit,
                   &c.opt.has_non_linear_clamp_lower_limit, &c.opt.has_non_linear_clamp_upper_limit};
    float *lim[4] = {&c.opt.linear_clamp_lower_limit, &c.opt.linear_clamp_upper_limit,
                     &c.opt.non_linear_clamp_lower_limit, &c.opt.non_linear_clamp_upper_limit};
    *has[which] = 1;
    *lim[which] = limit;
    mt_result r;
    /* the bound check only: finite differences are meaningless at a kink */
    CHECK(mt_run(&c, MT_CHECK_BOUND, 1, &r) == 0, "boundary case %s limit %d = %.9g", moe_dtype_name(dt), which,
          (double)limit);
    const int half = which >= 2 ? 0 : 1; /* non-linear clamps act on the gate */
    *grad = mt_load(dt, r.d_wgu, 0 * 2 + half);
    *other_grad = mt_load(dt, r.d_wgu, 0 * 2 + (1 - half));
    *ckpt = mt_load(dt, r.ckpt_gu, half); /* [N=1][2][I=1][B=1] */
    mt_result_free(&r);
    mt_case_free(&c);
}

static void test_boundaries(void)
{
    /* g = 0.625, u = 0.75 */
    const double value[4] = {0.75, 0.75, 0.625, 0.625};
    for (int which = 0; which < 4; which++) {
        const float v = (float)value[which];
        const int upper = which & 1;
        double grad, ckpt, other;
        /* the limit equals the (unclamped) value: strict inequality => zero gradient */
        boundary_case(MOE_F32, which, v, &grad, &ckpt, &other);
        CHECK(ckpt == v && grad == 0.0 && other != 0.0,
              "limit %d at the value: ckpt %.9g grad %.9g (want 0) other %.9g", which, ckpt, grad, other);
        /* one ulp inside the open interval: the gradient flows */
        boundary_case(MOE_F32, which, upper ? nextafterf(v, INFINITY) : nextafterf(v, -INFINITY), &grad, &ckpt,
                      &other);
        CHECK(ckpt == v && grad != 0.0, "limit %d one ulp away: ckpt %.9g grad %.9g (want nonzero)", which, ckpt,
              grad);
        /* clamped (limit well inside): the checkpoint holds the limit, zero gradient */
        const float inside = upper ? (float)(value[which] - 0.25) : (float)(value[which] + 0.25);
        boundary_case(MOE_F32, which, inside, &grad, &ckpt, &other);
        CHECK(ckpt == inside && grad == 0.0, "limit %d clamping: ckpt %.9g grad %.9g", which, ckpt, grad);
        /* bf16 with a limit bf16 cannot represent, rounded towards the open interval (upper 0.7 ->
         * 0.69921875 on u = 0.75, 0.45 -> 0.44921875 on g = 0.625; lower 0.8 -> 0.80078125): the
         * clamped value is checkpointed as round(limit) and must still count as clamped */
        static const float odd[4] = {0.8f, 0.7f, 0.8f, 0.45f};
        boundary_case(MOE_BF16, which, odd[which], &grad, &ckpt, &other);
        CHECK(ckpt == moe_bf16_to_f32(moe_f32_to_bf16(odd[which])) && ckpt != odd[which] && grad == 0.0,
              "bf16 limit %d = %.9g: ckpt %.9g grad %.9g (want round(limit), 0)", which, (double)odd[which], ckpt,
              grad);
        /* a non-representable limit that leaves the value free: the gradient flows */
        const float free_limit = upper ? 0.9f : 0.3f;
        boundary_case(MOE_BF16, which, free_limit, &grad, &ckpt, &other);
        CHECK(grad != 0.0 && ckpt == v, "bf16 limit %d = %.9g leaves the value free, grad %.9g", which,
              (double)free_limit, grad);
    }
}

/* ---------------------------------------------------------------------------------------------------
 * metamorphic properties
 * ------------------------------------------------------------------------------------------------- */
static moe_mlp_options random_options(oracle_rng *rng, moe_dtype dt)
{
    moe_mlp_options o = {0};
    o.dtype = dt;
    o.activation = (moe_mlp_activation)oracle_rng_below(rng, 4);
    o.bias = (int)oracle_rng_below(rng, 2);
    o.padding = (moe_mlp_padding)oracle_rng_below(rng, 2);
    o.block_size = 1 + (int64_t)oracle_rng_below(rng, 4);
    o.float32_intermediates = !(dt != MOE_F32 && oracle_rng_below(rng, 2));
    return o;
}

static void test_affinity_placement(oracle_rng *rng)
{
    for (int trial = 0; trial < 24; trial++) {
        const moe_dtype dt = (moe_dtype)(trial % 3);
        moe_mlp_options o = random_options(rng, dt);
        const int clamps = (int)oracle_rng_below(rng, 16);
        mt_case ch, ci;
        const uint64_t seed = 5000 + (uint64_t)trial;
        o.affinity = MOE_AFFINITY_ON_H;
        mt_case_init(&ch, seed, 6, 4, 2, 5, 4, &o, MT_DROPLESS);
        o.affinity = MOE_AFFINITY_ON_I;
        mt_case_init(&ci, seed, 6, 4, 2, 5, 4, &o, MT_DROPLESS);
        if (clamps && (!mt_choose_clamps(&ch, clamps) || !mt_choose_clamps(&ci, clamps))) {
            mt_case_free(&ch), mt_case_free(&ci);
            continue;
        }
        mt_result rh, ri, ri2;
        CHECK(mt_run(&ch, MT_CHECK_FD | MT_CHECK_BOUND, 1, &rh) == 0, "ON_H trial %d", trial);
        CHECK(mt_run(&ci, MT_CHECK_FD | MT_CHECK_BOUND, 1, &ri) == 0, "ON_I trial %d", trial);
        CHECK(mt_run(&ci, MT_CHECK_FD | MT_CHECK_BOUND, 0, &ri2) == 0, "ON_I (no down ckpt) trial %d", trial);
        CHECK(mt_compare_results(&ch, &rh, &ci, &ri, "ON_H vs ON_I") == 0, "ON_H vs ON_I differ, trial %d", trial);
        CHECK(mt_compare_results(&ch, &rh, &ci, &ri2, "ON_H vs ON_I recomputing d") == 0,
              "ON_H vs ON_I (recomputed d) differ, trial %d", trial);
        mt_result_free(&rh), mt_result_free(&ri), mt_result_free(&ri2);
        mt_case_free(&ch), mt_case_free(&ci);
    }
}

/* d_affinities[t*E + e] = <G[t], d> with d the forward's own down checkpoint at the pair's position:
 * a dot product of length H from rounded inputs, so |got - <G, d>| <= gamma(H) sum |G d| + rounding. */
static void test_affinity_definition(oracle_rng *rng)
{
    for (int trial = 0; trial < 12; trial++) {
        moe_mlp_options o = random_options(rng, (moe_dtype)(trial % 3));
        o.affinity = (moe_mlp_affinity)(trial & 1);
        mt_case c;
        mt_case_init(&c, 6000 + (uint64_t)trial, 7, 5, 3, 9, 4, &o, trial % 3);
        mt_result r;
        CHECK(mt_run(&c, MT_CHECK_BOUND, 1, &r) == 0, "affinity definition trial %d", trial);
        const moe_dtype dt = c.opt.dtype;
        unsigned char *seen = calloc((size_t)(c.T * c.E + 1), 1);
        for (int64_t p = 0; p < c.N * c.B; p++) {
            const int64_t t = c.ids[p];
            if (t < 0 || t >= c.T)
                continue;
            const int64_t e = c.b2e[p / c.B];
            double v = 0.0, mag = 0.0;
            for (int64_t h = 0; h < c.H; h++) {
                const double d = mt_load(dt, r.ckpt_d, p * c.H + h);
                v += c.g[t * c.H + h] * d;
                mag += fabs(c.g[t * c.H + h] * d);
            }
            const double bound = oracle_gamma(c.H) * mag + oracle_output_rounding(dt, fabs(v) + oracle_gamma(c.H) * mag) +
                                 (double)c.H * 0x1p-52 * mag;
            const double got = mt_load(dt, r.d_aff, t * c.E + e);
            CHECK(fabs(got - v) <= bound, "dA[%lld][%lld] = %.9g, <G, d> = %.9g, bound %.3g", (long long)t,
                  (long long)e, got, v, bound);
            seen[t * c.E + e] = 1;
        }
        for (int64_t i = 0; i < c.T * c.E; i++)
            if (!seen[i])
                CHECK(mt_load(dt, r.d_aff, i) == 0.0, "dA[%lld] of a pair outside the layout is %g", (long long)i,
                      mt_load(dt, r.d_aff, i));
        free(seen);
        mt_result_free(&r), mt_case_free(&c);
    }
}

static void test_block_sizes(oracle_rng *rng)
{
    static const int64_t sizes[] = {1, 2, 3, 5, 16, 128};
    for (int trial = 0; trial < 6; trial++) {
        moe_mlp_options o = random_options(rng, (moe_dtype)(trial % 3));
        o.affinity = (moe_mlp_affinity)(trial & 1);
        mt_case cs[6];
        mt_result rs[6];
        for (int q = 0; q < 6; q++) {
            o.block_size = sizes[q];
            mt_case_init(&cs[q], 7000 + (uint64_t)trial, 9, 5, 3, 6, 3, &o, MT_DROPLESS);
            CHECK(mt_run(&cs[q], q == 5 ? MT_CHECK_BOUND : MT_CHECK_FD | MT_CHECK_BOUND, 1, &rs[q]) == 0,
                  "block size %lld, trial %d", (long long)sizes[q], trial);
        }
        for (int q = 1; q < 6; q++)
            CHECK(mt_compare_results(&cs[0], &rs[0], &cs[q], &rs[q], "block sizes") == 0,
                  "B = 1 vs B = %lld differ, trial %d", (long long)sizes[q], trial);
        for (int q = 0; q < 6; q++)
            mt_result_free(&rs[q]), mt_case_free(&cs[q]);
    }
}

static void test_overwrite(oracle_rng *rng)
{
    for (int trial = 0; trial < 12; trial++) {
        moe_mlp_options o = random_options(rng, (moe_dtype)(trial % 3));
        o.affinity = (moe_mlp_affinity)(trial & 1);
        mt_case ca, cb;
        mt_result ra, rb;
        mt_case_init(&ca, 9000 + (uint64_t)trial, 8, 4, 1, 5, 3, &o, trial % 3);
        o.tensor_update_overwrite = 1;
        mt_case_init(&cb, 9000 + (uint64_t)trial, 8, 4, 1, 5, 3, &o, trial % 3);
        CHECK(mt_run(&ca, MT_CHECK_FD | MT_CHECK_BOUND, 1, &ra) == 0, "top-1 accumulating, trial %d", trial);
        CHECK(mt_run(&cb, MT_CHECK_FD | MT_CHECK_BOUND, 1, &rb) == 0, "top-1 overwrite, trial %d", trial);
        CHECK(mt_results_identical(&ca, &ra, &rb, 1), "top-1: overwrite differs from accumulating, trial %d",
              trial);
        mt_result_free(&ra), mt_result_free(&rb), mt_case_free(&ca), mt_case_free(&cb);
    }
}

static void test_threads(oracle_rng *rng)
{
    for (int trial = 0; trial < 6; trial++) {
        moe_mlp_options o = random_options(rng, (moe_dtype)(trial % 3));
        o.affinity = (moe_mlp_affinity)(trial & 1);
        o.block_size = 4;
        o.float32_intermediates = trial < 3; /* f16 and bf16 once rounded, once float32 */
        mt_case c;
        /* past the reference's one-thread threshold (~2^18 multiply-adds) */
        mt_case_init(&c, 11000 + (uint64_t)trial, 48, 6, 3, 40, 24, &o, trial % 3);
        mt_result r1, r2, r3;
        set_threads(1);
        CHECK(mt_run(&c, MT_CHECK_BOUND, 1, &r1) == 0, "1 thread, trial %d", trial);
        set_threads(2);
        CHECK(mt_run(&c, MT_CHECK_BOUND, 1, &r2) == 0, "2 threads, trial %d", trial);
        set_threads(5);
        CHECK(mt_run(&c, MT_CHECK_BOUND, 1, &r3) == 0, "5 threads, trial %d", trial);
        CHECK(mt_results_identical(&c, &r1, &r2, 1) && mt_results_identical(&c, &r1, &r3, 1),
              "results depend on the thread count, trial %d", trial);
        mt_result_free(&r1), mt_result_free(&r2), mt_result_free(&r3), mt_case_free(&c);
    }
    set_threads(2);
}

/* ---------------------------------------------------------------------------------------------------
 * The rounded intermediates, the default, and options.float32_intermediates (specs/MLP.md, "Rounded
 * intermediates")
 * ------------------------------------------------------------------------------------------------- */

/* f32: the flag changes no bit (outputs, checkpoints, every gradient), in both affinity placements and
 * with the backward recomputing d. */
static void test_round_intermediates_f32(oracle_rng *rng)
{
    for (int trial = 0; trial < 6; trial++) {
        moe_mlp_options o = random_options(rng, MOE_F32);
        o.affinity = (moe_mlp_affinity)(trial & 1);
        o.accumulate = trial == 2;
        mt_case c;
        mt_case_init(&c, 18000 + (uint64_t)trial, 7, 4, 2, 6, 5, &o, trial % 3);
        const int down_in_bwd = trial != 3; /* trial 3: ON_I recomputing d */
        mt_result off, on;
        CHECK(mt_run(&c, MT_CHECK_BOUND, down_in_bwd, &off) == 0, "f32 without round_intermediates, trial %d", trial);
        c.opt.float32_intermediates = 0;
        CHECK(mt_run(&c, MT_CHECK_BOUND, down_in_bwd, &on) == 0, "f32 with round_intermediates, trial %d", trial);
        CHECK(mt_results_identical(&c, &off, &on, 1), "f32: round_intermediates changed a result, trial %d", trial);
        mt_result_free(&off), mt_result_free(&on), mt_case_free(&c);
    }
}

/* bf16, where the flag must change the results, each value derived by hand.  T = E = k = H = B = 1,
 * I = 2, SiLU, affinity on H, grad_fp32 (the gradients keep what the intermediates' rounding did):
 *   x = 1, gate weights 20, 20, up weights 1 + 2^-7, 1: g = 20, 20 and u = 1 + 2^-7, 1 exactly;
 *   act(20) = 20 sigmoid(20) is exactly 20 in float32 (1 + e^-20 rounds to 1), likewise act'(20) = 1;
 *   m = 20.15625, 20 (float32 exact); bf16 (ulp 1/8 on [16, 32)) holds 20.125 and 20, not 20.15625;
 *   W_d = 1, -1: d = m1 - m2 = 0.15625, or with the flag rnd(m1) - rnd(m2) = 0.125;
 *   a = 1 + 2^-7 (out = a d), G = 1 - 2^-8: a G = 1.003875732421875, rnd(a G) = 1.
 * Both the flag's and the default's results are checked: each one is a function of the option. */
static void test_round_intermediates_bf16(void)
{
    for (int flag = 0; flag <= 1; flag++) {
        moe_mlp_options o = {0};
        o.dtype = MOE_BF16;
        o.block_size = 1;
        o.grad_fp32 = 1;
        o.float32_intermediates = !flag; /* flag: the rounded intermediates */
        mt_case c;
        mt_case_init(&c, 19000, 1, 1, 1, 1, 2, &o, MT_DROPLESS);
        /* w_gu[e][h][2][I]: gate i = 0, 1 then up i = 0, 1 */
        const double wgu[4] = {20.0, 20.0, 1.0 + 0x1p-7, 1.0}, wd[2] = {1.0, -1.0};
        for (int j = 0; j < 4; j++)
            set_in(&c, c.w_gu, c.wgu, j, wgu[j]);
        for (int i = 0; i < 2; i++)
            set_in(&c, c.w_d, c.wd, i, wd[i]);
        set_in(&c, c.hidden, c.x, 0, 1.0);
        set_in(&c, c.aff, c.A, 0, 1.0 + 0x1p-7);
        set_in(&c, c.G, c.g, 0, 1.0 - 0x1p-8);
        mt_result r;
        CHECK(mt_run(&c, MT_CHECK_BOUND | MT_CHECK_EXACT_ROUNDING, 1, &r) == 0, "bf16 hand case, flag %d", flag);
        const double aG = (1.0 + 0x1p-7) * (1.0 - 0x1p-8), u1 = 1.0 + 0x1p-7;
        const double dD = flag ? 1.0 : aG;          /* the down-projection gradient operand */
        const double m1 = flag ? 20.125 : 20.15625; /* dW_d's operand (from the checkpoints) */
        const double du1 = flag ? 20.0 : (float)(dD * 20.0), dg1 = flag ? u1 : (float)(dD * u1);
        /* out = rnd(a d): a * 0.125 = 0.1259765625 -> 0.1259765625 (bf16 exact); a * 0.15625 =
         * 0.157470703125 -> 0.1572265625 */
        const double want_out = flag ? 0.1259765625 : 0.1572265625;
        const double got_out = mt_load(MOE_BF16, r.out, 0);
        CHECK(got_out == want_out, "bf16 round_intermediates=%d: out %.12g, want %.12g (d = %s)", flag, got_out,
              want_out, flag ? "rnd(m1) - rnd(m2)" : "m1 - m2");
        /* d_w_d[e][i][h] (float32): m_i * dD; i = 0 */
        const double got_wd = mt_load(MOE_F32, r.d_wd, 0), want_wd = (float)(m1 * dD);
        CHECK(got_wd == want_wd, "bf16 round_intermediates=%d: d_w_d[0] %.12g, want %.12g", flag, got_wd, want_wd);
        /* d_w_gu[e][h][c][i] (float32, x = 1): gate i = 0 is dg1, up i = 0 is du1 */
        const double got_g = mt_load(MOE_F32, r.d_wgu, 0), got_u = mt_load(MOE_F32, r.d_wgu, 2);
        CHECK(got_g == dg1 && got_u == du1, "bf16 round_intermediates=%d: d_w_gu gate %.12g up %.12g, want %.12g %.12g",
              flag, got_g, got_u, dg1, du1);
        mt_result_free(&r), mt_case_free(&c);
    }
}

/* ---------------------------------------------------------------------------------------------------
 * the NKI defects
 * ------------------------------------------------------------------------------------------------- */
static int all_zero(moe_dtype dt, const void *p, int64_t first, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (mt_load(dt, p, first + i) != 0.0)
            return 0;
    return 1;
}

static void test_bias_halves(void)
{
    for (int threads = 1; threads <= 2; threads++) {
        set_threads(threads);
        for (int dti = 0; dti < 3; dti++) {
            moe_mlp_options o = {0};
            o.dtype = (moe_dtype)dti;
            o.bias = 1;
            o.block_size = 4;
            mt_case c;
            mt_case_init(&c, 12000 + (uint64_t)dti, 7, 3, 2, 4, 5, &o, MT_DROPLESS);
            mt_result r;
            CHECK(mt_run(&c, MT_CHECK_FD | MT_CHECK_BOUND, 1, &r) == 0, "bias grads, %d threads", threads);
            for (int64_t e = 0; e < c.E; e++) {
                /* an expert with tokens has a nonzero gate half AND a nonzero up half */
                int has_tokens = 0;
                for (int64_t p = 0; p < c.N * c.B; p++)
                    has_tokens |= c.b2e[p / c.B] == e && c.ids[p] >= 0 && c.ids[p] < c.T;
                if (!has_tokens)
                    continue;
                CHECK(!all_zero(c.opt.dtype, r.d_bgu, (e * 2 + 0) * c.I, c.I), "expert %lld: gate bias grad all 0",
                      (long long)e);
                CHECK(!all_zero(c.opt.dtype, r.d_bgu, (e * 2 + 1) * c.I, c.I), "expert %lld: up bias grad all 0",
                      (long long)e);
            }
            mt_result_free(&r), mt_case_free(&c);
        }
    }
    set_threads(2);
}

static void test_block_128(void)
{
    for (int dti = 0; dti < 3; dti++) {
        moe_mlp_options o = {0}; /* block_size 0 = the default 128 */
        o.dtype = (moe_dtype)dti;
        o.bias = dti == 1;
        o.affinity = (moe_mlp_affinity)(dti == 2);
        mt_case c;
        mt_case_init(&c, 13000 + (uint64_t)dti, 20, 3, 2, 6, 4, &o, dti == 2 ? MT_DROPPING : MT_DROPLESS);
        CHECK(c.B == 128, "default block size %lld", (long long)c.B);
        mt_result r;
        CHECK(mt_run(&c, MT_CHECK_FD | MT_CHECK_BOUND, 1, &r) == 0, "B = 128, %s", moe_dtype_name(o.dtype));
        CHECK(!all_zero(c.opt.dtype, r.d_hidden, 0, c.T * c.H) && !all_zero(c.opt.dtype, r.d_wgu, 0, mt_count_wgu(&c)) &&
                  !all_zero(c.opt.dtype, r.d_wd, 0, mt_count_wd(&c)) && !all_zero(c.opt.dtype, r.d_aff, 0, c.T * c.E),
              "B = 128: a gradient is all zero");
        mt_result_free(&r), mt_case_free(&c);
    }
}

static void test_odd_experts(void)
{
    static const int64_t experts[] = {1, 3, 5, 7};
    for (int q = 0; q < 4; q++) {
        moe_mlp_options o = {0};
        o.dtype = (moe_dtype)(q % 3);
        o.block_size = 3;
        mt_case c;
        const int64_t E = experts[q], T = 9;
        mt_case_init(&c, 14000 + (uint64_t)q, T, E, E < 2 ? 1 : 2, 4, 3, &o, MT_DROPLESS);
        mt_result r;
        /* mt_run poisons d_affinities with NaN and checks every entry (0 for pairs outside the layout) */
        CHECK(mt_run(&c, MT_CHECK_FD | MT_CHECK_BOUND, 1, &r) == 0, "E = %lld", (long long)E);
        int64_t nonzero_tail = 0;
        for (int64_t i = 0; i < T * E; i++) {
            const double v = mt_load(c.opt.dtype, r.d_aff, i);
            CHECK(isfinite(v), "E = %lld: d_affinities[%lld] not written (%g)", (long long)E, (long long)i, v);
            if (i >= T * E - T)
                nonzero_tail += v != 0.0;
        }
        CHECK(nonzero_tail > 0, "E = %lld: the last T affinity-grad entries are all zero", (long long)E);
        mt_result_free(&r), mt_case_free(&c);
    }
}

static void test_activations_differ(void)
{
    for (int dti = 0; dti < 3; dti++) {
        mt_case cs[4];
        mt_result rs[4];
        for (int a = 0; a < 4; a++) {
            moe_mlp_options o = {0};
            o.dtype = (moe_dtype)dti;
            o.activation = (moe_mlp_activation)a;
            o.block_size = 2;
            /* larger |g| so that GELU and its tanh approximation separate beyond the bf16 bound */
            mt_case_init(&cs[a], 15000 + (uint64_t)dti, 6, 3, 2, 12, 6, &o, MT_DROPLESS);
            CHECK(mt_run(&cs[a], MT_CHECK_FD | MT_CHECK_BOUND, 1, &rs[a]) == 0, "activation %d", a);
        }
        for (int a = 0; a < 4; a++)
            for (int b = a + 1; b < 4; b++) {
                if (dti != MOE_F32 && a == MOE_ACT_GELU && b == MOE_ACT_GELU_TANH)
                    continue; /* the tanh approximation is within ~1e-3 of GELU: f32 only */
                /* the two runs must differ by more than both bounds together somewhere */
                const int64_t diff = mt_compare_results(&cs[a], &rs[a], &cs[b], &rs[b], NULL);
                CHECK(diff > 0, "activation %d and %d give the same results (%s)", a, b, moe_dtype_name((moe_dtype)dti));
            }
        for (int a = 0; a < 4; a++)
            mt_result_free(&rs[a]), mt_case_free(&cs[a]);
    }
}

/* ---------------------------------------------------------------------------------------------------
 * edge shapes
 * ------------------------------------------------------------------------------------------------- */
static void test_edges(oracle_rng *rng)
{
    struct {
        int64_t T, E, k, H, I;
        int one_expert;
    } shapes[] = {
        {0, 3, 2, 4, 3, 0}, {1, 1, 1, 1, 1, 0}, {1, 4, 4, 3, 2, 0}, {5, 3, 2, 0, 3, 0}, {5, 3, 2, 4, 0, 0},
        {3, 40, 2, 4, 2, 0}, {10, 4, 1, 4, 3, 1}, {6, 4, 4, 3, 3, 0},
    };
    for (size_t q = 0; q < sizeof shapes / sizeof shapes[0]; q++) {
        for (int variant = 0; variant < 4; variant++) {
            moe_mlp_options o = random_options(rng, (moe_dtype)(variant % 3));
            o.affinity = (moe_mlp_affinity)(variant & 1);
            o.accumulate = variant == 3;
            mt_case c;
            const uint64_t seed = 16000 + q * 10 + (uint64_t)variant;
            if (shapes[q].one_expert) {
                int64_t *ids = xmalloc((size_t)(shapes[q].T * shapes[q].k) * sizeof(int64_t));
                for (int64_t i = 0; i < shapes[q].T * shapes[q].k; i++)
                    ids[i] = 2;
                mt_case_init_routing(&c, seed, shapes[q].T, shapes[q].E, shapes[q].k, shapes[q].H, shapes[q].I, ids,
                                     &o, variant == 2 ? MT_DROPPING : MT_DROPLESS);
                free(ids);
            } else {
                mt_case_init(&c, seed, shapes[q].T, shapes[q].E, shapes[q].k, shapes[q].H, shapes[q].I, &o,
                             variant % 3);
            }
            CHECK(mt_run(&c, MT_CHECK_FD | MT_CHECK_BOUND, 1, NULL) == 0, "edge shape %zu variant %d", q, variant);
            mt_case_free(&c);
        }
    }
}

/* Shapes past the reference's tile sizes (128 output columns, 64-deep panels, 64-row gradient chunks,
 * more than 64 slots per expert), checked against the analytic bound only (finite differences over
 * ~10^5 parameters would be slow; the analytic expectation is validated against them above). */
static void test_large_shapes(oracle_rng *rng)
{
    struct {
        int64_t T, E, k, H, I, B;
    } shapes[] = {{150, 2, 2, 130, 70, 64}, {40, 3, 1, 200, 33, 16}, {90, 1, 1, 65, 129, 128}};
    for (size_t q = 0; q < sizeof shapes / sizeof shapes[0]; q++) {
        moe_mlp_options o = random_options(rng, (moe_dtype)(q % 3));
        o.block_size = shapes[q].B;
        o.affinity = (moe_mlp_affinity)(q & 1);
        o.bias = 1;
        o.accumulate = q == 1;
        o.grad_fp32 = q == 2;
        mt_case c;
        mt_case_init(&c, 17000 + q, shapes[q].T, shapes[q].E, shapes[q].k, shapes[q].H, shapes[q].I, &o,
                     (int)(q % 3));
        mt_case_scale_weights(&c);
        if (!mt_choose_clamps(&c, (int)(3 + 4 * q) & 15))
            CHECK(0, "large shape %zu: no clamp placement", q);
        CHECK(mt_run(&c, MT_CHECK_BOUND, (int)(q != 1), NULL) == 0, "large shape %zu", q);
        mt_case_free(&c);
    }
}

int main(int argc, char **argv)
{
    const uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 20260302;
    oracle_rng rng = {seed};
    set_threads(2);
    test_boundaries();
    test_affinity_placement(&rng);
    test_affinity_definition(&rng);
    test_block_sizes(&rng);
    test_overwrite(&rng);
    test_threads(&rng);
    test_round_intermediates_f32(&rng);
    test_round_intermediates_bf16();
    test_bias_halves();
    test_block_128();
    test_odd_experts();
    test_activations_differ();
    test_edges(&rng);
    test_large_shapes(&rng);
    printf("seed %llu: %lld failures\n", (unsigned long long)seed, (long long)failures);
    return failures == 0 ? 0 : 1;
}
