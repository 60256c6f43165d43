/* moe-fuzz's gemm-fp8 op: the FP8 grouped GEMM (fwd or dX, every mode, both output dtypes, both scale formats,
 * all four operand dtype pairs, K and N on both sides of multiples of 128) on the reference backend against
 * the float64 oracle within its bound (oracle/oracle_fp8.h, specs/FP8.md section 4), and a failed call
 * (one bad scale) leaving the output untouched. */
#include "oracle_fp8.h"
#include "pt.h"
#include "pt_gen.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define FP8_CAP_MACS 3000000 /* the work of one case (the reference is one element at a time) */

static float code_value(moe_dtype d, uint8_t q) { return d == MOE_E5M2 ? moe_e5m2_to_f32(q) : moe_e4m3_to_f32(q); }

/* Codes: dist 0 exact small values (0, +-1, +-0.5, +-2: every tile sum exact), 1 any finite code. */
static void fill_codes(uint64_t *state, int dist, moe_dtype d, uint8_t *q, int64_t n)
{
    static const float exact[] = {0.0f, 1.0f, -1.0f, 0.5f, -0.5f, 2.0f, -2.0f};
    for (int64_t i = 0; i < n; i++) {
        uint64_t r = pt_mix((*state)++);
        if (dist == 0) {
            const float v = exact[r % 7];
            q[i] = d == MOE_E5M2 ? moe_f32_to_e5m2(v) : moe_f32_to_e4m3(v);
            continue;
        }
        do
            q[i] = (uint8_t)(r & 0xff), r = pt_mix(r);
        while (!isfinite(code_value(d, q[i])));
    }
}

/* Scales: float32 2^[-6, 6] times [1, 2) (dist 1) or 1 (dist 0); UE8M0 bytes 121 .. 133 (dist 1) or 127. */
static void *fill_scales(uint64_t *state, int dist, moe_fp8_scale_format format, int64_t n)
{
    if (format == MOE_FP8_SCALE_UE8M0) {
        uint8_t *s = xmalloc((size_t)n + 1);
        for (int64_t i = 0; i < n; i++)
            s[i] = (uint8_t)(dist ? 121 + pt_mix((*state)++) % 13 : 127);
        return s;
    }
    float *s = xmalloc(((size_t)n + 1) * sizeof *s);
    for (int64_t i = 0; i < n; i++) {
        const uint64_t r = pt_mix((*state)++);
        s[i] = dist ? ldexpf(1.0f + (float)(r >> 40) * 0x1p-24f, (int)(r % 13) - 6) : 1.0f;
    }
    return s;
}

void pt_gemm_fp8(pt_case *c)
{
    pt_source *s = c->src;
    const int dx = pt_bool(s);
    int64_t E = 1 + pt_sized(s, 0, 6), T = pt_sized(s, 0, 16);
    const int64_t N = pt_sized(s, 0, 400), K = pt_sized(s, 0, 400);
    const int kind = pt_pick(s, PT_ROUTE_KINDS_FROM_TOPK - 1); /* not E_MUCH_LARGER's shape arrangement */
    int64_t *allowed = xmalloc((size_t)E * sizeof(int64_t));
    const int64_t A = pt_allowed_experts(kind == PT_ROUTE_E_MUCH_LARGER ? PT_ROUTE_UNIFORM : kind, E, allowed);
    free(allowed);
    const int64_t k = min64(pt_int(s, 1, 4), A);
    T = min64(T, FP8_CAP_MACS / max64(1, k * max64(1, N) * max64(1, K)));
    const int64_t M = T * k;
    moe_fp8_options opt;
    memset(&opt, 0, sizeof opt);
    opt.out_dtype = pt_bool(s) ? MOE_BF16 : MOE_F32;
    opt.scale_format = pt_bool(s) ? MOE_FP8_SCALE_UE8M0 : MOE_FP8_SCALE_F32;
    opt.permute_x = pt_bool(s);
    opt.permute_y = pt_bool(s);
    opt.accumulate = pt_bool(s);
    opt.reduce_topk = dx && pt_bool(s);
    const int weighted = pt_bool(s);
    const moe_dtype a_dtype = pt_bool(s) ? MOE_E5M2 : MOE_E4M3, w_dtype = pt_bool(s) ? MOE_E5M2 : MOE_E4M3;
    const int code_dist = pt_pick(s, 2), scale_dist = pt_pick(s, 2);
    uint64_t state = pt_draw(s, UINT32_MAX);
    pt_describe(c, "gemm-fp8 %s T=%lld k=%lld E=%lld N=%lld K=%lld %s x %s -> %s scales=%s px=%d py=%d topk=%d acc=%d "
                "reduce=%d codes=%s scales=%s", dx ? "dx" : "fwd", (long long)T, (long long)k, (long long)E,
                (long long)N, (long long)K, moe_dtype_name(a_dtype), moe_dtype_name(w_dtype),
                moe_dtype_name(opt.out_dtype), opt.scale_format ? "ue8m0" : "f32", opt.permute_x, opt.permute_y,
                weighted, opt.accumulate, opt.reduce_topk, code_dist ? "any" : "exact", scale_dist ? "tiled" : "one");

    int64_t *ids = xmalloc((size_t)(M + 1) * sizeof(int64_t)), *m_sizes = xmalloc((size_t)E * sizeof(int64_t));
    int64_t *gather = xmalloc((size_t)(M + 1) * sizeof(int64_t));
    pt_gen_topk_ids(s, kind == PT_ROUTE_E_MUCH_LARGER ? PT_ROUTE_UNIFORM : kind, T, k, E, ids);
    pt_stable_routing(M, E, ids, m_sizes, gather);
    const moe_routing routing = {T, k, E, m_sizes, gather};

    const int64_t tiles_n = (N + 127) / 128, tiles_k = (K + 127) / 128;
    const int64_t a_rows = dx ? M : (opt.permute_x ? T : M), a_cols = dx ? N : K, a_tiles = dx ? tiles_n : tiles_k;
    uint8_t *a_codes = xmalloc((size_t)(a_rows * a_cols) + 1), *w_codes = xmalloc((size_t)(E * N * K) + 1);
    fill_codes(&state, code_dist, a_dtype, a_codes, a_rows * a_cols);
    fill_codes(&state, code_dist, w_dtype, w_codes, E * N * K);
    void *a_scales = fill_scales(&state, scale_dist, opt.scale_format, a_rows * a_tiles);
    void *w_scales = fill_scales(&state, scale_dist, opt.scale_format, E * tiles_n * tiles_k);
    const moe_fp8_tensor a = {a_codes, a_scales, a_dtype}, w = {w_codes, w_scales, w_dtype};
    float *topk = NULL;
    if (weighted) {
        topk = xmalloc(((size_t)M + 1) * sizeof *topk);
        for (int64_t i = 0; i < M; i++)
            topk[i] = 0.05f + (float)(pt_mix(state++) >> 40) * 0x1p-24f;
    }
    const int64_t out_count = dx ? (opt.reduce_topk ? T : M) * K : M * N;
    const size_t out_bytes = (size_t)out_count * moe_dtype_size(opt.out_dtype);
    void *out = xmalloc(out_bytes + 4), *old = xmalloc(out_bytes + 4);
    pt_fill(state, 0, PT_DIST_UNIFORM, opt.out_dtype, out, out_count);
    memcpy(old, out, out_bytes);

    /* a bad scale first (when there is one): refused, the output untouched */
    const int64_t w_scale_count = E * tiles_n * tiles_k;
    if (w_scale_count > 0) {
        const int64_t bad = (int64_t)(pt_mix(state++) % (uint64_t)w_scale_count);
        if (opt.scale_format == MOE_FP8_SCALE_UE8M0)
            ((uint8_t *)w_scales)[bad] = 255;
        else
            ((float *)w_scales)[bad] = -0.0f;
        const moe_status st = dx ? moe_gemm_fp8_dx(c->backend, &routing, N, K, &a, &w, topk, out, &opt)
                                 : moe_gemm_fp8_fwd(c->backend, &routing, N, K, &a, &w, topk, out, &opt);
        if (st != MOE_ERR_INVALID_VALUE || strstr(moe_last_error(), "w.scales[") == NULL)
            pt_fail(c, "bad-scale", "w.scales[%lld] bad: status %s, message \"%s\"", (long long)bad, moe_strerror(st),
                    moe_last_error());
        else if (memcmp(out, old, out_bytes) != 0)
            pt_fail(c, "bad-scale", "a refused call changed the output");
        if (opt.scale_format == MOE_FP8_SCALE_UE8M0)
            ((uint8_t *)w_scales)[bad] = 127;
        else
            ((float *)w_scales)[bad] = 1.0f;
    }
    double *value = xmalloc(((size_t)out_count + 1) * sizeof(double));
    double *bound = xmalloc(((size_t)out_count + 1) * sizeof(double));
    if (dx)
        oracle_gemm_fp8_dx(&routing, N, K, &a, &w, topk, old, &opt, value, bound);
    else
        oracle_gemm_fp8_fwd(&routing, N, K, &a, &w, topk, old, &opt, value, bound);
    const moe_status st = dx ? moe_gemm_fp8_dx(c->backend, &routing, N, K, &a, &w, topk, out, &opt)
                             : moe_gemm_fp8_fwd(c->backend, &routing, N, K, &a, &w, topk, out, &opt);
    if (st != MOE_OK) {
        pt_fail(c, "status", "%s returned %s: %s", dx ? "moe_gemm_fp8_dx" : "moe_gemm_fp8_fwd", moe_strerror(st),
                moe_last_error());
    } else {
        for (int64_t i = 0; i < out_count; i++) {
            const double got = oracle_load(opt.out_dtype, out, i), err = fabs(got - value[i]);
            if (!(err <= bound[i])) {
                pt_fail(c, "bound", "%s[%lld]: got %.9g, want %.17g, |err| %.3g > bound %.3g", dx ? "dx" : "y",
                        (long long)i, got, value[i], err, bound[i]);
                break;
            }
            if (bound[i] > 0)
                pt_ratio(c, err / bound[i]);
        }
    }
    free(ids), free(m_sizes), free(gather), free(a_codes), free(w_codes), free(a_scales), free(w_scales);
    free(topk), free(out), free(old), free(value), free(bound);
}
