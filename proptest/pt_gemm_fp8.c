/* moe-fuzz's gemm-fp8 op: the FP8 grouped GEMM case of pt_fp8.h on the reference backend against the float64
 * oracle within its bound (oracle/oracle_fp8.h, specs/FP8.md section 4), and a failed call (one bad scale)
 * leaving the output untouched; and the case's generator and checks, which gpu-gemm-fp8 (pt_gpu_fp8.c) shares. */
#include "oracle_fp8.h"
#include "pt_fp8.h"
#include "pt_gen.h"
#include "transpose.h"

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

void fp8_case_generate(pt_case *c, fp8_case *f, int64_t cap_macs) { fp8_case_generate_aligned(c, f, cap_macs, 1); }

void fp8_case_generate_aligned(pt_case *c, fp8_case *f, int64_t cap_macs, int64_t align)
{
    pt_source *s = c->src;
    memset(f, 0, sizeof *f);
    const int dx = f->dx = pt_bool(s);
    /* aligned cases (gpu-gemm-fp8-model) are never empty: an empty one would be discarded */
    const int64_t least = align > 1;
    int64_t E = 1 + pt_sized(s, 0, 6), T = pt_sized(s, least, 16);
    const int64_t N = align * pt_sized(s, least, 400 / align), K = align * pt_sized(s, least, 400 / align);
    const int kind = pt_pick(s, PT_ROUTE_KINDS_FROM_TOPK - 1); /* not E_MUCH_LARGER's shape arrangement */
    int64_t *allowed = xmalloc((size_t)E * sizeof(int64_t));
    const int64_t A = pt_allowed_experts(kind == PT_ROUTE_E_MUCH_LARGER ? PT_ROUTE_UNIFORM : kind, E, allowed);
    free(allowed);
    const int64_t k = min64(pt_int(s, 1, 4), A);
    T = min64(T, cap_macs / max64(1, k * max64(1, N) * max64(1, K)));
    const int64_t M = T * k;
    moe_fp8_options *opt = &f->opt;
    opt->out_dtype = pt_bool(s) ? MOE_BF16 : MOE_F32;
    opt->scale_format = pt_bool(s) ? MOE_FP8_SCALE_UE8M0 : MOE_FP8_SCALE_F32;
    opt->permute_x = pt_bool(s);
    opt->permute_y = pt_bool(s);
    opt->accumulate = pt_bool(s);
    opt->reduce_topk = dx && pt_bool(s);
    f->weighted = pt_bool(s);
    const moe_dtype a_dtype = pt_bool(s) ? MOE_E5M2 : MOE_E4M3, w_dtype = pt_bool(s) ? MOE_E5M2 : MOE_E4M3;
    f->code_dist = pt_pick(s, 2), f->scale_dist = pt_pick(s, 2);
    uint64_t state = pt_draw(s, UINT32_MAX);
    pt_describe(c, "gemm-fp8 %s T=%lld k=%lld E=%lld N=%lld K=%lld %s x %s -> %s scales=%s px=%d py=%d topk=%d acc=%d "
                "reduce=%d codes=%s scales=%s", dx ? "dx" : "fwd", (long long)T, (long long)k, (long long)E,
                (long long)N, (long long)K, moe_dtype_name(a_dtype), moe_dtype_name(w_dtype),
                moe_dtype_name(opt->out_dtype), opt->scale_format ? "ue8m0" : "f32", opt->permute_x, opt->permute_y,
                f->weighted, opt->accumulate, opt->reduce_topk, f->code_dist ? "any" : "exact",
                f->scale_dist ? "tiled" : "one");
    f->T = T, f->k = k, f->E = E, f->N = N, f->K = K, f->M = M;

    int64_t *ids = xmalloc((size_t)(M + 1) * sizeof(int64_t));
    f->m_sizes = xmalloc((size_t)E * sizeof(int64_t));
    f->gather = xmalloc((size_t)(M + 1) * sizeof(int64_t));
    pt_gen_topk_ids(s, kind == PT_ROUTE_E_MUCH_LARGER ? PT_ROUTE_UNIFORM : kind, T, k, E, ids);
    pt_stable_routing(M, E, ids, f->m_sizes, f->gather);
    free(ids);
    f->routing = (moe_routing){T, k, E, f->m_sizes, f->gather};

    const int64_t tiles_n = (N + 127) / 128, tiles_k = (K + 127) / 128;
    const int64_t a_rows = dx ? M : (opt->permute_x ? T : M), a_cols = dx ? N : K, a_tiles = dx ? tiles_n : tiles_k;
    const size_t scale_size = opt->scale_format == MOE_FP8_SCALE_UE8M0 ? 1 : sizeof(float);
    f->a_code_bytes = (size_t)(a_rows * a_cols), f->w_code_bytes = (size_t)(E * N * K);
    f->a_scale_bytes = (size_t)(a_rows * a_tiles) * scale_size, f->w_scale_bytes = (size_t)(E * tiles_n * tiles_k) * scale_size;
    f->a_codes = xmalloc(f->a_code_bytes + 1), f->w_codes = xmalloc(f->w_code_bytes + 1);
    fill_codes(&state, f->code_dist, a_dtype, f->a_codes, a_rows * a_cols);
    fill_codes(&state, f->code_dist, w_dtype, f->w_codes, E * N * K);
    f->a_scales = fill_scales(&state, f->scale_dist, opt->scale_format, a_rows * a_tiles);
    f->w_scales = fill_scales(&state, f->scale_dist, opt->scale_format, E * tiles_n * tiles_k);
    f->a = (moe_fp8_tensor){f->a_codes, f->a_scales, a_dtype};
    f->w = (moe_fp8_tensor){f->w_codes, f->w_scales, w_dtype};
    if (f->weighted) {
        f->topk = xmalloc(((size_t)M + 1) * sizeof *f->topk);
        for (int64_t i = 0; i < M; i++)
            f->topk[i] = 0.05f + (float)(pt_mix(state++) >> 40) * 0x1p-24f;
    }
    f->out_count = dx ? (opt->reduce_topk ? T : M) * K : M * N;
    f->out_bytes = (size_t)f->out_count * moe_dtype_size(opt->out_dtype);
    f->old = xmalloc(f->out_bytes + 4);
    pt_fill(state, 0, PT_DIST_UNIFORM, opt->out_dtype, f->old, f->out_count);
    const int64_t w_scale_count = E * tiles_n * tiles_k;
    f->bad_scale = w_scale_count > 0 ? (int64_t)(pt_mix(state++) % (uint64_t)w_scale_count) : -1;
    /* dX from W^T (options.w_transposed): W's codes and block scales transposed per expert (drawn last, so that
     * the draws before keep their meaning for the regression file's cases) */
    opt->w_transposed = dx && pt_bool(s);
    if (opt->w_transposed) {
        uint8_t *codes = transpose_batches(f->w_codes, E, N, K, 1);
        void *scales = transpose_batches(f->w_scales, E, tiles_n, tiles_k, scale_size);
        free(f->w_codes), free(f->w_scales);
        f->w_codes = codes, f->w_scales = scales;
        f->w = (moe_fp8_tensor){f->w_codes, f->w_scales, w_dtype};
        pt_describe(c, " w=W^T");
    }
}

void fp8_case_corrupt(fp8_case *f, int bad)
{
    if (f->bad_scale < 0)
        return;
    if (f->opt.scale_format == MOE_FP8_SCALE_UE8M0)
        ((uint8_t *)f->w_scales)[f->bad_scale] = bad ? 255 : 127;
    else
        ((float *)f->w_scales)[f->bad_scale] = bad ? -0.0f : 1.0f;
}

moe_status fp8_case_call(const fp8_case *f, moe_backend backend, const moe_routing *routing, const moe_fp8_tensor *a,
                         const moe_fp8_tensor *w, const float *topk, void *out)
{
    return f->dx ? moe_gemm_fp8_dx(backend, routing, f->N, f->K, a, w, topk, out, &f->opt)
                 : moe_gemm_fp8_fwd(backend, routing, f->N, f->K, a, w, topk, out, &f->opt);
}

void fp8_case_check(pt_case *c, const fp8_case *f, const void *out, const char *who, int tile_acc_bits)
{
    double *value = xmalloc(((size_t)f->out_count + 1) * sizeof(double));
    double *bound = xmalloc(((size_t)f->out_count + 1) * sizeof(double));
    if (f->dx)
        oracle_gemm_fp8_dx(&f->routing, f->N, f->K, &f->a, &f->w, f->topk, f->old, &f->opt, tile_acc_bits, value, bound);
    else
        oracle_gemm_fp8_fwd(&f->routing, f->N, f->K, &f->a, &f->w, f->topk, f->old, &f->opt, tile_acc_bits, value, bound);
    for (int64_t i = 0; i < f->out_count; i++) {
        const double got = oracle_load(f->opt.out_dtype, out, i), err = fabs(got - value[i]);
        if (!(err <= bound[i])) {
            pt_fail(c, "bound", "%s %s[%lld]: got %.9g, want %.17g, |err| %.3g > bound %.3g", who, f->dx ? "dx" : "y",
                    (long long)i, got, value[i], err, bound[i]);
            break;
        }
        if (bound[i] > 0)
            pt_ratio(c, err / bound[i]);
    }
    free(value), free(bound);
}

void fp8_case_free(fp8_case *f)
{
    free(f->m_sizes), free(f->gather), free(f->a_codes), free(f->w_codes), free(f->a_scales), free(f->w_scales);
    free(f->topk), free(f->old);
}

void pt_gemm_fp8(pt_case *c)
{
    fp8_case f;
    fp8_case_generate(c, &f, FP8_CAP_MACS);
    void *out = xmalloc(f.out_bytes + 4);
    memcpy(out, f.old, f.out_bytes);
    /* a bad scale first (when there is one): refused, the output untouched */
    if (f.bad_scale >= 0) {
        fp8_case_corrupt(&f, 1);
        const moe_status st = fp8_case_call(&f, c->backend, &f.routing, &f.a, &f.w, f.topk, out);
        if (st != MOE_ERR_INVALID_VALUE || strstr(moe_last_error(), "w.scales[") == NULL)
            pt_fail(c, "bad-scale", "w.scales[%lld] bad: status %s, message \"%s\"", (long long)f.bad_scale,
                    moe_strerror(st), moe_last_error());
        else if (memcmp(out, f.old, f.out_bytes) != 0)
            pt_fail(c, "bad-scale", "a refused call changed the output");
        fp8_case_corrupt(&f, 0);
    }
    const moe_status st = fp8_case_call(&f, c->backend, &f.routing, &f.a, &f.w, f.topk, out);
    if (st != MOE_OK)
        pt_fail(c, "status", "%s returned %s: %s", f.dx ? "moe_gemm_fp8_dx" : "moe_gemm_fp8_fwd", moe_strerror(st),
                moe_last_error());
    else
        fp8_case_check(c, &f, out, "ref", ORACLE_FP8_TILE_F32);
    free(out);
    fp8_case_free(&f);
}

void fp8_case_check_exact(pt_case *c, const fp8_case *f, const void *out, const char *tag, const char *who)
{
    if (f->code_dist != 0)
        return;
    void *ref = xmalloc(f->out_bytes + 4);
    memcpy(ref, f->old, f->out_bytes);
    const moe_status st = fp8_case_call(f, MOE_BACKEND_REF, &f->routing, &f->a, &f->w, f->topk, ref);
    if (st != MOE_OK)
        pt_fail(c, "status", "reference returned %s: %s", moe_strerror(st), moe_last_error());
    else if (memcmp(out, ref, f->out_bytes) != 0)
        pt_fail(c, tag, "%s and the CPU reference differ on exact codes", who);
    free(ref);
}
