/* moe-fuzz's gemm-fp8-dw op: FP8 dW's operands made by moe_quantize_fp8_columns from random sources (every row
 * source, topk weights or none, f32 or bf16, every value distribution; each value back from its code and scale
 * within the round trip's error), then moe_gemm_fp8_dw on the reference
 * backend against the float64 oracle within its bound (oracle_gemm_fp8_dw, specs/FP8.md sections 2 and 4); a
 * bad scale in a tile in use refused with dW untouched.
 *
 * gpu-gemm-fp8-dw (--backend cuda): the same case on the CUDA backend through device copies of every array, routing
 * included: the columns quantizer's codes and scales bit for bit the reference's, dW within the same bound (the
 * portable kernel's tile sums are float32), a bad scale reported by moe_backend_synchronize with dW untouched, and
 * a second run bitwise the first.
 *
 * Each case draws, last, options.codes_transposed: then both operands come from moe_quantize_fp8_columns_transposed
 * (codes [cols][M], the round trip read there), dW reads them so, the reference's result is bit for bit its dW on
 * the codes transposed back, and on CUDA the bound is that of the Hopper kernel's in-tile sums. */
#include "oracle_fp8.h"
#include "pt_gen.h"
#include "transpose.h"
#ifdef MOE_FUZZ_CUDA
#include "pt_cuda.h"
#endif

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define FP8_DW_CAP_MACS 1000000 /* the work of one case */
#define GPU_FP8_DW_CAP_MACS 4000000

#ifdef MOE_FUZZ_CUDA
static size_t scale_size(moe_fp8_scale_format format) { return format == MOE_FP8_SCALE_UE8M0 ? 1 : 4; }
#endif

/* moe_quantize_fp8_columns (or, with transposed, moe_quantize_fp8_columns_transposed: codes [cols][M]) on the
 * case's backend from host arrays into host codes and scales; on CUDA through device copies, then compared bit for
 * bit with the reference's ("columns-vs-ref"). */
static moe_status quantize_columns(pt_case *c, const moe_routing *routing, moe_dtype src_dtype, int64_t cols,
                                   const void *src, moe_fp8_row_source source, const float *topk, moe_dtype fp8,
                                   moe_fp8_scale_format format, int transposed, uint8_t *codes, void *scales)
{
    moe_status (*quantize)(moe_backend, const moe_routing *, moe_dtype, int64_t, const void *, moe_fp8_row_source,
                           const float *, moe_dtype, moe_fp8_scale_format, void *, void *, void *) =
        transposed ? moe_quantize_fp8_columns_transposed : moe_quantize_fp8_columns;
    if (c->backend != MOE_BACKEND_CUDA)
        return quantize(c->backend, routing, src_dtype, cols, src, source, topk, fp8, format, codes, scales, NULL);
#ifdef MOE_FUZZ_CUDA
    const int64_t T = routing->num_tokens, M = T * routing->topk, E = routing->num_experts;
    const size_t src_bytes = (size_t)((source == MOE_FP8_ROWS_TOKEN ? T : M) * cols) * moe_dtype_size(src_dtype);
    const size_t code_bytes = (size_t)(M * cols), scale_bytes = (size_t)(moe_fp8_column_scale_rows(M, E) * cols) *
                                                                scale_size(format);
    void *d_sizes = pt_device_copy(c, routing->m_sizes, (size_t)E * sizeof(int64_t));
    void *d_gather = pt_device_copy(c, routing->gather_indices, (size_t)M * sizeof(int64_t));
    void *d_src = pt_device_copy(c, src, src_bytes), *d_topk = topk ? pt_device_copy(c, topk, (size_t)M * 4) : NULL;
    void *d_codes = pt_device_copy(c, NULL, code_bytes), *d_scales = pt_device_copy(c, NULL, scale_bytes);
    moe_status st = MOE_ERR_DEVICE;
    if (c->outcome != PT_FAIL) {
        const moe_routing d_routing = {T, routing->topk, E, d_sizes, d_gather};
        st = quantize(MOE_BACKEND_CUDA, &d_routing, src_dtype, cols, d_src, source, d_topk, fp8, format, d_codes,
                      d_scales, NULL);
        if (st == MOE_OK)
            st = moe_backend_synchronize(MOE_BACKEND_CUDA, NULL);
        if (st == MOE_OK && pt_device_download(c, codes, d_codes, code_bytes) &&
            pt_device_download(c, scales, d_scales, scale_bytes)) {
            uint8_t *ref_codes = xmalloc(code_bytes + 1);
            void *ref_scales = xmalloc(scale_bytes + 4);
            const moe_status ref = quantize(MOE_BACKEND_REF, routing, src_dtype, cols, src, source, topk, fp8, format,
                                            ref_codes, ref_scales, NULL);
            if (ref != MOE_OK || memcmp(codes, ref_codes, code_bytes) != 0 ||
                memcmp(scales, ref_scales, scale_bytes) != 0)
                pt_fail(c, "columns-vs-ref", "the CUDA columns quantizer%s (%lld columns) differs from the "
                        "reference's (reference status %s)", transposed ? " (transposed)" : "", (long long)cols,
                        moe_strerror(ref));
            free(ref_codes), free(ref_scales);
        }
    }
    void *ps[] = {d_sizes, d_gather, d_src, d_topk, d_codes, d_scales};
    pt_device_free_all(ps, sizeof ps / sizeof ps[0]);
    return st;
#else
    (void)transposed;
    pt_fail(c, "backend", "moe-fuzz was built without CUDA");
    return MOE_ERR_NO_BACKEND;
#endif
}

/* moe_gemm_fp8_dw on the case's backend from host arrays; dw (host) holds the old output and receives the new
 * (on CUDA through device copies, the status the call's or the synchronisation's). */
static moe_status run_dw(pt_case *c, const moe_routing *routing, int64_t N, int64_t K, const moe_fp8_tensor *x,
                         const moe_fp8_tensor *dy, void *dw, size_t dw_bytes, const moe_fp8_options *opt)
{
    if (c->backend != MOE_BACKEND_CUDA)
        return moe_gemm_fp8_dw(c->backend, routing, N, K, x, dy, dw, opt);
#ifdef MOE_FUZZ_CUDA
    const int64_t T = routing->num_tokens, M = T * routing->topk, E = routing->num_experts;
    const int64_t scale_rows = moe_fp8_column_scale_rows(M, E);
    const size_t sb = scale_size(opt->scale_format);
    void *d_sizes = pt_device_copy(c, routing->m_sizes, (size_t)E * sizeof(int64_t));
    void *d_gather = pt_device_copy(c, routing->gather_indices, (size_t)M * sizeof(int64_t));
    void *d_xc = pt_device_copy(c, x->data, (size_t)(M * K)), *d_xs = pt_device_copy(c, x->scales, (size_t)(scale_rows * K) * sb);
    void *d_dyc = pt_device_copy(c, dy->data, (size_t)(M * N));
    void *d_dys = pt_device_copy(c, dy->scales, (size_t)(scale_rows * N) * sb);
    void *d_dw = pt_device_copy(c, dw, dw_bytes);
    moe_status st = MOE_ERR_DEVICE;
    if (c->outcome != PT_FAIL) {
        const moe_routing d_routing = {T, routing->topk, E, d_sizes, d_gather};
        const moe_fp8_tensor d_x = {d_xc, d_xs, x->dtype}, d_dy = {d_dyc, d_dys, dy->dtype};
        st = moe_gemm_fp8_dw(MOE_BACKEND_CUDA, &d_routing, N, K, &d_x, &d_dy, d_dw, opt);
        if (st == MOE_OK)
            st = moe_backend_synchronize(MOE_BACKEND_CUDA, NULL);
        if (!pt_device_download(c, dw, d_dw, dw_bytes))
            st = MOE_ERR_DEVICE;
    }
    void *ps[] = {d_sizes, d_gather, d_xc, d_xs, d_dyc, d_dys, d_dw};
    pt_device_free_all(ps, sizeof ps / sizeof ps[0]);
    return st;
#else
    (void)N, (void)K, (void)x, (void)dy, (void)dw, (void)dw_bytes, (void)opt;
    pt_fail(c, "backend", "moe-fuzz was built without CUDA");
    return MOE_ERR_NO_BACKEND;
#endif
}

static const char *source_name(moe_fp8_row_source source)
{
    return source == MOE_FP8_ROWS_TOKEN ? "token" : source == MOE_FP8_ROWS_SLOT ? "slot" : "expert";
}

/* One operand: its source drawn, quantized with the columns quantizer into codes [M][cols] (with transposed,
 * the transposed quantizer's [cols][M]) and scales. */
typedef struct dw_operand {
    moe_fp8_row_source source;
    int transposed;
    void *src;
    uint8_t *codes;
    void *scales;
    moe_fp8_tensor t;
} dw_operand;

/* The quantizer's codes and scales give back each value (its source element, times its topk weight) within the
 * round trip's error (specs/FP8.md section 3): u_fp8 |v| + 4 2^-24 |v| + half the smallest subnormal times
 * the scale (the float32 scale and factor each rounded once: the 1.001) -- so a scale written to another row
 * than the GEMM reads, or codes of another tile, fail here. */
static void check_round_trip(pt_case *c, const dw_operand *o, const moe_routing *routing, int64_t cols,
                             moe_dtype src_dtype, const float *topk, moe_fp8_scale_format format)
{
    const moe_dtype fp8 = o->t.dtype;
    const double u8 = fp8 == MOE_E5M2 ? 0x1p-3 : 0x1p-4, half_subnormal = fp8 == MOE_E5M2 ? 0x1p-17 : 0x1p-10;
    int64_t first = 0;
    for (int64_t e = 0; e < routing->num_experts; e++) {
        const int64_t end = first + routing->m_sizes[e];
        for (int64_t r = first; r < end; r++) {
            const int64_t slot = routing->gather_indices[r];
            const int64_t row = o->source == MOE_FP8_ROWS_EXPERT ? r
                                : o->source == MOE_FP8_ROWS_SLOT ? slot : slot / routing->topk;
            const int64_t scale_row = first / 128 + e + (r - first) / 128;
            for (int64_t col = 0; col < cols; col++) {
                float v = (float)oracle_load(src_dtype, o->src, row * cols + col);
                if (topk != NULL)
                    v = topk[slot] * v;
                const uint8_t q = o->codes[o->transposed ? col * routing->num_tokens * routing->topk + r
                                                         : r * cols + col];
                const double decoded = fp8 == MOE_E5M2 ? moe_e5m2_to_f32(q) : moe_e4m3_to_f32(q);
                const int64_t si = scale_row * cols + col;
                const double scale = format == MOE_FP8_SCALE_UE8M0 ? ldexp(1.0, ((const uint8_t *)o->scales)[si] - 127)
                                                                   : (double)((const float *)o->scales)[si];
                const double err = fabs(decoded * scale - v);
                if (!(err <= (u8 + 0x1p-22) * fabs(v) + half_subnormal * scale * 1.001)) {
                    pt_fail(c, "round-trip", "%s rows, expert row %lld column %lld: %a -> code 0x%02x x scale %a = %a",
                            source_name(o->source), (long long)r, (long long)col, (double)v, q, scale,
                            decoded * scale);
                    return;
                }
            }
        }
        first = end;
    }
}

static void make_operand(pt_case *c, dw_operand *o, const moe_routing *routing, int64_t cols, moe_dtype src_dtype,
                         int dist, moe_fp8_row_source source, const float *topk, moe_fp8_scale_format format,
                         uint64_t seed, int tensor)
{
    const int64_t M = routing->num_tokens * routing->topk;
    const int64_t rows = source == MOE_FP8_ROWS_TOKEN ? routing->num_tokens : M;
    const int64_t scale_rows = moe_fp8_column_scale_rows(M, routing->num_experts);
    o->source = source;
    o->src = xmalloc((size_t)(rows * cols) * 4 + 4);
    pt_fill(seed, tensor, dist, src_dtype, o->src, rows * cols);
    o->codes = xmalloc((size_t)(M * cols) + 1);
    o->scales = xmalloc((size_t)(scale_rows * cols) * (format == MOE_FP8_SCALE_UE8M0 ? 1 : 4) + 4);
    const moe_status st = quantize_columns(c, routing, src_dtype, cols, o->src, source, topk, o->t.dtype, format,
                                           o->transposed, o->codes, o->scales);
    if (st != MOE_OK)
        pt_fail(c, "quantize", "moe_quantize_fp8_columns%s (%s rows, %lld columns) returned %s: %s",
                o->transposed ? "_transposed" : "", source_name(source), (long long)cols, moe_strerror(st),
                moe_last_error());
    o->t.data = o->codes, o->t.scales = o->scales;
    if (st == MOE_OK)
        check_round_trip(c, o, routing, cols, src_dtype, topk, format);
}

static void free_operand(dw_operand *o) { free(o->src), free(o->codes), free(o->scales); }

/* A used scale of dy (the first tile of the first expert with rows, column n) set bad (or back). */
static void corrupt(const moe_routing *routing, const moe_fp8_options *opt, dw_operand *dy, int64_t N, int64_t n,
                    int bad, float *kept)
{
    int64_t first = 0, e = 0;
    while (routing->m_sizes[e] == 0)
        first += routing->m_sizes[e++];
    const int64_t i = (first / 128 + e) * N + n;
    if (opt->scale_format == MOE_FP8_SCALE_UE8M0) {
        uint8_t *s = dy->scales;
        if (bad)
            *kept = s[i], s[i] = 255;
        else
            s[i] = (uint8_t)*kept;
    } else {
        float *s = dy->scales;
        if (bad)
            *kept = s[i], s[i] = -0.0f;
        else
            s[i] = *kept;
    }
}

/* The reference's dW on transposed codes (got, from old) bit for bit its dW on the codes transposed back
 * ("transposed-vs-plain"). */
static void check_untransposed(pt_case *c, const moe_routing *routing, int64_t N, int64_t K, const dw_operand *x,
                               const dw_operand *dy, const void *old, const void *got, size_t bytes,
                               const moe_fp8_options *opt)
{
    const int64_t M = routing->num_tokens * routing->topk;
    uint8_t *x_codes = transpose_batches(x->codes, 1, K, M, 1), *dy_codes = transpose_batches(dy->codes, 1, N, M, 1);
    const moe_fp8_tensor x_plain = {x_codes, x->scales, x->t.dtype}, dy_plain = {dy_codes, dy->scales, dy->t.dtype};
    moe_fp8_options plain = *opt;
    plain.codes_transposed = 0;
    void *want = xmalloc(bytes + 4);
    memcpy(want, old, bytes);
    const moe_status st = moe_gemm_fp8_dw(c->backend, routing, N, K, &x_plain, &dy_plain, want, &plain);
    if (st != MOE_OK || memcmp(want, got, bytes) != 0)
        pt_fail(c, "transposed-vs-plain", "dW on transposed codes differs from dW on the same codes untransposed "
                "(status %s)", moe_strerror(st));
    free(x_codes), free(dy_codes), free(want);
}

/* The property on c->backend (the reference, or CUDA for gpu-gemm-fp8-dw), cases of at most cap_macs. */
static void fp8_dw_property(pt_case *c, int64_t cap_macs)
{
    pt_source *s = c->src;
    const int64_t E = 1 + pt_sized(s, 0, 6), N = pt_sized(s, 0, 300), K = pt_sized(s, 0, 300);
    const int kind = pt_pick(s, PT_ROUTE_KINDS_FROM_TOPK - 1); /* not E_MUCH_LARGER's shape arrangement */
    int64_t *allowed = xmalloc((size_t)E * sizeof(int64_t));
    const int64_t A = pt_allowed_experts(kind == PT_ROUTE_E_MUCH_LARGER ? PT_ROUTE_UNIFORM : kind, E, allowed);
    free(allowed);
    const int64_t k = min64(pt_int(s, 1, 4), A);
    const int64_t T = min64(pt_sized(s, 0, 400), cap_macs / max64(1, k * max64(1, N) * max64(1, K)));
    const int64_t M = T * k;
    moe_fp8_options opt = {0};
    opt.out_dtype = pt_bool(s) ? MOE_BF16 : MOE_F32;
    opt.scale_format = pt_bool(s) ? MOE_FP8_SCALE_UE8M0 : MOE_FP8_SCALE_F32;
    opt.accumulate = pt_bool(s);
    const moe_dtype src_dtype = pt_bool(s) ? MOE_BF16 : MOE_F32;
    const moe_fp8_row_source x_source = pt_bool(s) ? MOE_FP8_ROWS_TOKEN : MOE_FP8_ROWS_EXPERT;
    const moe_fp8_row_source dy_source = pt_bool(s) ? MOE_FP8_ROWS_SLOT : MOE_FP8_ROWS_EXPERT;
    const int weighted = pt_bool(s), x_dist = pt_pick(s, PT_DISTS), dy_dist = pt_pick(s, PT_DISTS);
    dw_operand x = {.t.dtype = pt_bool(s) ? MOE_E5M2 : MOE_E4M3}, dy = {.t.dtype = pt_bool(s) ? MOE_E5M2 : MOE_E4M3};
    uint64_t state = pt_draw(s, UINT32_MAX);
    pt_describe(c, "%s T=%lld k=%lld E=%lld N=%lld K=%lld %s -> dy %s (%s rows, %s) x %s (%s rows, %s) -> %s "
                "scales=%s topk=%d acc=%d", c->backend == MOE_BACKEND_CUDA ? "gpu-gemm-fp8-dw" : "gemm-fp8-dw", (long long)T, (long long)k, (long long)E, (long long)N, (long long)K,
                moe_dtype_name(src_dtype), moe_dtype_name(dy.t.dtype), source_name(dy_source), pt_dist_name(dy_dist),
                moe_dtype_name(x.t.dtype), source_name(x_source), pt_dist_name(x_dist), moe_dtype_name(opt.out_dtype),
                opt.scale_format ? "ue8m0" : "f32", weighted, opt.accumulate);

    int64_t *ids = xmalloc((size_t)(M + 1) * sizeof(int64_t));
    int64_t *m_sizes = xmalloc((size_t)E * sizeof(int64_t)), *gather = xmalloc((size_t)(M + 1) * sizeof(int64_t));
    pt_gen_topk_ids(s, kind == PT_ROUTE_E_MUCH_LARGER ? PT_ROUTE_UNIFORM : kind, T, k, E, ids);
    pt_stable_routing(M, E, ids, m_sizes, gather);
    free(ids);
    const moe_routing routing = {T, k, E, m_sizes, gather};
    /* dW on transposed codes (options.codes_transposed, the transposed quantizer's): drawn last, so that the draws
     * before keep their meaning for the regression file's cases */
    opt.codes_transposed = pt_bool(s);
    x.transposed = dy.transposed = opt.codes_transposed;
    if (opt.codes_transposed)
        pt_describe(c, " codes=transposed");
    float *topk = NULL;
    if (weighted) {
        topk = xmalloc(((size_t)M + 1) * sizeof *topk);
        for (int64_t i = 0; i < M; i++)
            topk[i] = 0.05f + (float)(pt_mix(state++) >> 40) * 0x1p-24f;
    }
    make_operand(c, &x, &routing, K, src_dtype, x_dist, x_source, NULL, opt.scale_format, state, 1);
    make_operand(c, &dy, &routing, N, src_dtype, dy_dist, dy_source, topk, opt.scale_format, state, 2);

    const int64_t count = E * N * K;
    const size_t bytes = (size_t)count * moe_dtype_size(opt.out_dtype);
    void *old = xmalloc(bytes + 4), *dw = xmalloc(bytes + 4);
    pt_fill(state, 3, PT_DIST_UNIFORM, opt.out_dtype, old, count);
    memcpy(dw, old, bytes);
    /* a bad dy scale first (when a tile is in use): refused, dW untouched */
    if (M > 0 && N > 0) {
        float kept = 0.0f;
        const int64_t n = (int64_t)(pt_mix(state++) % (uint64_t)N);
        corrupt(&routing, &opt, &dy, N, n, 1, &kept);
        const moe_status st = run_dw(c, &routing, N, K, &x.t, &dy.t, dw, bytes, &opt);
        if (st != MOE_ERR_INVALID_VALUE || strstr(moe_last_error(), "dy.scales[") == NULL)
            pt_fail(c, "bad-scale", "dy column %lld's first scale bad: status %s, message \"%s\"", (long long)n,
                    moe_strerror(st), moe_last_error());
        else if (memcmp(dw, old, bytes) != 0)
            pt_fail(c, "bad-scale", "a refused call changed dW");
        corrupt(&routing, &opt, &dy, N, n, 0, &kept);
    }
    const moe_status st = c->outcome == PT_FAIL ? MOE_OK : run_dw(c, &routing, N, K, &x.t, &dy.t, dw, bytes, &opt);
    if (c->outcome == PT_FAIL) {
        /* the quantizer or the bad-scale call failed already */
    } else if (st != MOE_OK) {
        pt_fail(c, "status", "moe_gemm_fp8_dw returned %s: %s", moe_strerror(st), moe_last_error());
    } else {
        double *value = xmalloc(((size_t)count + 1) * sizeof(double));
        double *bound = xmalloc(((size_t)count + 1) * sizeof(double));
        /* on CUDA, transposed codes may run the Hopper kernel: the bound of its wgmma in-tile sums (which covers
         * the portable kernel's float32 ones) */
        const int tile_bits = c->backend == MOE_BACKEND_CUDA && opt.codes_transposed ? ORACLE_FP8_TILE_HOPPER_BITS
                                                                                     : ORACLE_FP8_TILE_F32;
        oracle_gemm_fp8_dw(&routing, N, K, &x.t, &dy.t, old, &opt, tile_bits, value, bound);
        for (int64_t i = 0; i < count; i++) {
            const double got = oracle_load(opt.out_dtype, dw, i), err = fabs(got - value[i]);
            if (!(err <= bound[i])) {
                pt_fail(c, "bound", "dw[%lld]: got %.9g, want %.17g, |err| %.3g > bound %.3g", (long long)i, got,
                        value[i], err, bound[i]);
                break;
            }
            if (bound[i] > 0)
                pt_ratio(c, err / bound[i]);
        }
        free(value), free(bound);
        if (c->backend != MOE_BACKEND_CUDA && opt.codes_transposed && c->outcome != PT_FAIL)
            check_untransposed(c, &routing, N, K, &x, &dy, old, dw, bytes, &opt);
        if (c->backend == MOE_BACKEND_CUDA && c->outcome != PT_FAIL) { /* a second run, bitwise the first */
            void *again = xmalloc(bytes + 4);
            memcpy(again, old, bytes);
            if (run_dw(c, &routing, N, K, &x.t, &dy.t, again, bytes, &opt) != MOE_OK || memcmp(again, dw, bytes) != 0)
                pt_fail(c, "determinism", "two GPU runs on identical inputs differ (or the second failed: %s)",
                        moe_last_error());
            free(again);
        }
    }
    free_operand(&x), free_operand(&dy);
    free(m_sizes), free(gather), free(topk), free(old), free(dw);
}

void pt_gemm_fp8_dw(pt_case *c); /* the op table's (pt_gemm.c) */
void pt_gemm_fp8_dw(pt_case *c) { fp8_dw_property(c, FP8_DW_CAP_MACS); }

void pt_gpu_gemm_fp8_dw(pt_case *c); /* the op table's, with CUDA */
void pt_gpu_gemm_fp8_dw(pt_case *c) { fp8_dw_property(c, GPU_FP8_DW_CAP_MACS); }
