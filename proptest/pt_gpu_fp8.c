/*
 * GPU FP8 properties (--backend cuda).
 *
 * gpu-gemm-fp8: a case of pt_fp8.h runs on the CUDA backend with device copies of every array, routing included,
 * and
 *   1. with one invalid W scale, the call is accepted and moe_backend_synchronize reports MOE_ERR_INVALID_VALUE
 *      naming w.scales, with the output untouched;
 *   2. with valid scales, returns MOE_OK, synchronises without a device error, and agrees with the float64
 *      oracle within its derived bound (on a Hopper GPU, unless MOE_CUDA_KERNEL=sm80 or simt forces the portable
 *      kernel, the bound of FP8 wgmma's in-tile sums: gpu/gemm/fp8_sm90.cu may take the call);
 *   3. on exact codes (every tile sum exact in any order) equals the CPU reference bit for bit;
 *   4. a second run on identical inputs gives bitwise the same output.
 *
 * gpu-gemm-fp8-model (at the end of this file): the Hopper kernel's output bit for bit its CPU model's.
 *
 * gpu-fp8-quantize: moe_quantize_fp8_rows / _blocks and moe_dequantize_fp8 on the CUDA backend against the
 * reference (shapes on both sides of the 128 tiles, f32 and bf16 sources, e4m3 and e5m2, both scale formats;
 * values of a spread of magnitudes, zero tiles, float32 subnormals, and values of 8 significant bits, whose
 * scaled forms hit the conversion's halfway points under power-of-two factors), and
 *   1. the codes and scales equal the reference's bit for bit;
 *   2. the dequantization (any codes, NaN codes too) equals the reference's bit for bit (NaN as NaN);
 *   3. with a NaN or Inf in the source (or a bad scale to dequantize) the call is accepted, moe_backend_synchronize
 *      reports MOE_ERR_INVALID_VALUE with the reference's message for the first bad element, and no output
 *      byte changes.
 * One case in four is moe_quantize_fp8_columns instead (dW's 128 x 1 tiles per expert; random routings with empty
 * experts, every row source, topk weights or none): its codes and scales bit for bit the reference's, and a
 * non-finite value (after its weight) reported with the reference's message, no output byte changed.
 */
#include "oracle.h"
#include "pt_cuda.h"
#include "pt_fp8.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8_hopper_model.h"
#include "oracle_fp8.h"
#include "pt_gen.h"

#define GPU_FP8_CAP_MACS 20000000

/* Runs the case on the GPU from `init` into host `out`; 1 when the call and the synchronisation succeeded.
 * expect_bad: the call must instead be reported bad by the synchronisation (and out is the output then). */
static int gpu_fp8_run(pt_case *c, const fp8_case *f, const void *init, void *out, int expect_bad)
{
    int ok = 0;
    void *dm = pt_device_copy(c, f->m_sizes, (size_t)f->E * sizeof(int64_t));
    void *dg = pt_device_copy(c, f->gather, (size_t)f->M * sizeof(int64_t));
    void *dac = pt_device_copy(c, f->a_codes, f->a_code_bytes), *das = pt_device_copy(c, f->a_scales, f->a_scale_bytes);
    void *dwc = pt_device_copy(c, f->w_codes, f->w_code_bytes), *dws = pt_device_copy(c, f->w_scales, f->w_scale_bytes);
    void *dtw = f->topk ? pt_device_copy(c, f->topk, (size_t)f->M * sizeof(float)) : NULL;
    void *dout = pt_device_copy(c, init, f->out_bytes);
    if (c->outcome != PT_FAIL) {
        const moe_routing r = {f->T, f->k, f->E, dm, dg};
        const moe_fp8_tensor a = {dac, das, f->a.dtype}, w = {dwc, dws, f->w.dtype};
        moe_status st = fp8_case_call(f, MOE_BACKEND_CUDA, &r, &a, &w, dtw, dout);
        const char *op = f->dx ? "moe_gemm_fp8_dx" : "moe_gemm_fp8_fwd";
        if (st != MOE_OK) {
            pt_fail(c, "status", "gpu %s returned %s: %s", op, moe_strerror(st), moe_last_error());
        } else {
            st = moe_backend_synchronize(MOE_BACKEND_CUDA, NULL);
            if (expect_bad) {
                if (st != MOE_ERR_INVALID_VALUE || strstr(moe_last_error(), "w.scales[") == NULL)
                    pt_fail(c, "bad-scale", "gpu %s with w.scales[%lld] bad: moe_backend_synchronize gave %s, \"%s\"",
                            op, (long long)f->bad_scale, moe_strerror(st), moe_last_error());
                else
                    ok = pt_device_download(c, out, dout, f->out_bytes);
            } else if (st != MOE_OK) {
                pt_fail(c, "device-error", "gpu %s: moe_backend_synchronize: %s: %s", op, moe_strerror(st),
                        moe_last_error());
            } else {
                ok = pt_device_download(c, out, dout, f->out_bytes);
            }
        }
    }
    void *ps[] = {dm, dg, dac, das, dwc, dws, dtw, dout};
    pt_device_free_all(ps, sizeof ps / sizeof ps[0]);
    return ok;
}

/* MOE_CUDA_KERNEL forces the portable FP8 kernel. */
static int portable_forced(void)
{
    const char *forced = getenv("MOE_CUDA_KERNEL");
    return forced != NULL && (strcmp(forced, "sm80") == 0 || strcmp(forced, "simt") == 0);
}

/* 1 when this GPU is of compute capability 9.0 (the Hopper FP8 kernel's), 0 when not, -1 when unknown. */
static int gpu_is_sm90(void)
{
    int device = 0, major = 0, minor = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess)
        return -1;
    return major == 9 && minor == 0;
}

/* The in-tile sums the bound assumes on this GPU (oracle_fp8.h): FP8 wgmma's on compute capability 9.0 unless the
 * portable kernel is forced, else float32's; unknown: the looser bound, never a false alarm. */
static int gpu_tile_acc_bits(void)
{
    return !portable_forced() && gpu_is_sm90() != 0 ? ORACLE_FP8_TILE_HOPPER_BITS : ORACLE_FP8_TILE_F32;
}

void pt_gpu_gemm_fp8(pt_case *c)
{
    fp8_case f;
    fp8_case_generate(c, &f, GPU_FP8_CAP_MACS);
    void *first = xmalloc(f.out_bytes + 4), *second = xmalloc(f.out_bytes + 4);
    if (f.bad_scale >= 0) {
        fp8_case_corrupt(&f, 1);
        if (gpu_fp8_run(c, &f, f.old, first, 1) && memcmp(first, f.old, f.out_bytes) != 0)
            pt_fail(c, "bad-scale", "a call reported bad changed the output");
        fp8_case_corrupt(&f, 0);
    }
    if (c->outcome != PT_FAIL && gpu_fp8_run(c, &f, f.old, first, 0)) {
        fp8_case_check(c, &f, first, "gpu", gpu_tile_acc_bits());
        fp8_case_check_exact(c, &f, first, "gpu-vs-ref", "the GPU");
        if (c->outcome != PT_FAIL && gpu_fp8_run(c, &f, f.old, second, 0) && memcmp(first, second, f.out_bytes) != 0)
            pt_fail(c, "determinism", "two GPU runs on identical inputs differ");
    }
    free(first), free(second);
    fp8_case_free(&f);
}

/* A source value (before the rounding to the source dtype): dist 0 a spread of magnitudes, 2^[-20, 20] by
 * 128-column stripe; 1 as 0 with every other stripe zero (of either sign); 2 float32 subnormals and tiny normals
 * with a few values near 2^100; 3 m / 16 * 2^e with |m| < 256 (8 significant bits) and e by stripe. */
static float source_value(uint64_t r, int dist, int64_t c)
{
    const int stripe_exponent = (int)(pt_mix((uint64_t)(c / 128) * 7919u + (uint64_t)dist) % 41) - 20;
    const float sign = (r & 1) ? -1.0f : 1.0f;
    const float unit = (float)((r >> 11) & 0xffffff) * 0x1p-24f; /* [0, 1) */
    switch (dist) {
    case 1:
        if ((c / 128) % 2 == 0)
            return sign * 0.0f;
        return sign * ldexpf(0.5f + unit, stripe_exponent);
    case 2:
        if ((r >> 40) % 16 == 0)
            return sign * ldexpf(1.0f + unit, 100);
        return sign * ldexpf(unit, -126 - (int)((r >> 50) % 24));
    case 3:
        return ldexpf((float)((int)((r >> 8) % 511) - 255) / 16.0f, stripe_exponent);
    default:
        return sign * ldexpf(0.5f + unit, stripe_exponent);
    }
}

/* Element i of a source of dtype f32 or bf16 set to v (rounded to bf16). */
static void set_source(void *src, moe_dtype dtype, int64_t i, float v)
{
    if (dtype == MOE_F32)
        ((float *)src)[i] = v;
    else
        ((uint16_t *)src)[i] = moe_f32_to_bf16(v);
}

/* 1 when the two dequantized outputs agree bit for bit, NaN matching NaN; else the case fails naming the first
 * difference. */
static int same_dequantized(pt_case *c, moe_dtype out_dtype, const void *gpu, const void *ref, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        const float g = oracle_load(out_dtype, gpu, i), r = oracle_load(out_dtype, ref, i);
        const int same = out_dtype == MOE_F32 ? memcmp((const float *)gpu + i, (const float *)ref + i, 4) == 0
                                              : ((const uint16_t *)gpu)[i] == ((const uint16_t *)ref)[i];
        if (!same && !(isnan(g) && isnan(r))) {
            pt_fail(c, "dequantize-vs-ref", "dequantized [%lld]: GPU %a, reference %a", (long long)i, (double)g,
                    (double)r);
            return 0;
        }
    }
    return 1;
}

/* The text of a reference message after its function's name ("src[...] = nan, expected ..."). */
static const char *message_body(const char *message)
{
    const char *colon = strstr(message, ": ");
    return colon ? colon + 2 : message;
}

/* gpu-fp8-quantize's columns case: moe_quantize_fp8_columns on the device against the reference. */
static void gpu_fp8_quantize_columns(pt_case *c)
{
    pt_source *s = c->src;
    static const int64_t edges[] = {1, 2, 127, 128, 129, 255, 256, 300};
    const int64_t E = 1 + pt_sized(s, 0, 6), T = pt_sized(s, 0, 300), k = min64(pt_int(s, 1, 3), E), M = T * k;
    const int64_t C = pt_bool(s) ? edges[pt_pick(s, 8)] : pt_sized(s, 1, 300);
    const moe_fp8_row_source source = (moe_fp8_row_source)pt_pick(s, 3);
    const int weighted = pt_bool(s), dist = pt_pick(s, 4), bad = pt_pick(s, 4) == 0;
    const moe_dtype src_dtype = pt_bool(s) ? MOE_BF16 : MOE_F32, fp8 = pt_bool(s) ? MOE_E5M2 : MOE_E4M3;
    const moe_fp8_scale_format format = pt_bool(s) ? MOE_FP8_SCALE_UE8M0 : MOE_FP8_SCALE_F32;
    int64_t *ids = xmalloc((size_t)(M + 1) * sizeof(int64_t)), *m_sizes = xmalloc((size_t)E * sizeof(int64_t));
    int64_t *gather = xmalloc((size_t)(M + 1) * sizeof(int64_t));
    pt_gen_topk_ids(s, PT_ROUTE_UNIFORM, T, k, E, ids);
    pt_stable_routing(M, E, ids, m_sizes, gather);
    uint64_t state = pt_draw(s, UINT32_MAX);
    pt_describe(c, "gpu-fp8-quantize columns T=%lld k=%lld E=%lld C=%lld rows=%d topk=%d %s -> %s scales=%s dist=%d "
                "bad=%d", (long long)T, (long long)k, (long long)E, (long long)C, (int)source, weighted,
                moe_dtype_name(src_dtype), moe_dtype_name(fp8), format ? "ue8m0" : "f32", dist, bad);
    const int64_t rows = source == MOE_FP8_ROWS_TOKEN ? T : M, n = rows * C;
    const int64_t scale_count = moe_fp8_column_scale_rows(M, E) * C;
    const size_t src_size = moe_dtype_size(src_dtype), scale_bytes = (size_t)scale_count * (format ? 1 : 4);
    void *src = xmalloc((size_t)n * src_size + 4), *scales = xmalloc(scale_bytes + 4), *ref_scales = xmalloc(scale_bytes + 4);
    uint8_t *q = xmalloc((size_t)(M * C) + 1), *ref_q = xmalloc((size_t)(M * C) + 1);
    float *topk = weighted ? xmalloc((size_t)(M + 1) * sizeof(float)) : NULL;
    for (int64_t i = 0; i < n; i++)
        set_source(src, src_dtype, i, source_value(pt_mix(state++), dist, i % C));
    for (int64_t i = 0; weighted && i < M; i++)
        topk[i] = 0.05f + (float)(pt_mix(state++) >> 40) * 0x1p-24f;
    if (bad && n > 0) { /* a non-finite value, or (weighted) a weight that overflows a value */
        const int64_t at = (int64_t)(pt_mix(state++) % (uint64_t)n);
        if (weighted && M > 0 && pt_mix(state++) % 2)
            topk[pt_mix(state++) % (uint64_t)M] = 3e38f;
        else
            set_source(src, src_dtype, at, src_dtype == MOE_F32 ? NAN : INFINITY);
    }
    const moe_routing routing = {T, k, E, m_sizes, gather};
    const moe_status ref_st = moe_quantize_fp8_columns(MOE_BACKEND_REF, &routing, src_dtype, C, src, source, topk, fp8,
                                                       format, ref_q, ref_scales, NULL);
    char ref_message[1024];
    snprintf(ref_message, sizeof ref_message, "%s", message_body(moe_last_error()));
    if (ref_st != MOE_OK && ref_st != MOE_ERR_INVALID_VALUE)
        pt_fail(c, "status", "reference columns quantize returned %s: %s", moe_strerror(ref_st), moe_last_error());
    memset(q, 0xa5, (size_t)(M * C) + 1);
    memset(scales, 0xa5, scale_bytes + 4);
    void *d_sizes = pt_device_copy(c, m_sizes, (size_t)E * sizeof(int64_t));
    void *d_gather = pt_device_copy(c, gather, (size_t)M * sizeof(int64_t));
    void *d_src = pt_device_copy(c, src, (size_t)n * src_size);
    void *d_topk = topk ? pt_device_copy(c, topk, (size_t)M * sizeof(float)) : NULL;
    void *d_q = pt_device_copy(c, q, (size_t)(M * C)), *d_scales = pt_device_copy(c, scales, scale_bytes);
    if (c->outcome != PT_FAIL) {
        const moe_routing d_routing = {T, k, E, d_sizes, d_gather};
        moe_status st = moe_quantize_fp8_columns(MOE_BACKEND_CUDA, &d_routing, src_dtype, C, d_src, source, d_topk, fp8,
                                                 format, d_q, d_scales, NULL);
        if (st == MOE_OK)
            st = moe_backend_synchronize(MOE_BACKEND_CUDA, NULL);
        if (st != ref_st || (st != MOE_OK && strstr(moe_last_error(), ref_message) == NULL))
            pt_fail(c, "columns-status", "the GPU gave %s, \"%s\"; the reference %s, \"%s\"", moe_strerror(st),
                    moe_last_error(), moe_strerror(ref_st), ref_message);
        uint8_t *got_q = xmalloc((size_t)(M * C) + 1);
        void *got_scales = xmalloc(scale_bytes + 4);
        if (c->outcome != PT_FAIL && pt_device_download(c, got_q, d_q, (size_t)(M * C)) &&
            pt_device_download(c, got_scales, d_scales, scale_bytes)) {
            const void *want_q = ref_st == MOE_OK ? (const void *)ref_q : q; /* refused: the poison unchanged */
            const void *want_scales = ref_st == MOE_OK ? ref_scales : scales;
            if (memcmp(got_q, want_q, (size_t)(M * C)) != 0 || memcmp(got_scales, want_scales, scale_bytes) != 0)
                pt_fail(c, "columns-vs-ref", ref_st == MOE_OK ? "codes or scales differ from the reference's"
                                                              : "a call reported bad changed its outputs");
        }
        free(got_q), free(got_scales);
    }
    void *ps[] = {d_sizes, d_gather, d_src, d_topk, d_q, d_scales};
    pt_device_free_all(ps, sizeof ps / sizeof ps[0]);
    free(ids), free(m_sizes), free(gather), free(src), free(scales), free(ref_scales), free(q), free(ref_q), free(topk);
}

void pt_gpu_fp8_quantize(pt_case *c)
{
    pt_source *s = c->src;
    if (pt_pick(s, 4) == 3) {
        gpu_fp8_quantize_columns(c);
        return;
    }
    static const int64_t edges[] = {1, 2, 127, 128, 129, 255, 256, 300};
    const int blocks = pt_bool(s);
    const int64_t B = blocks ? pt_int(s, 1, 3) : 1;
    const int64_t R = pt_bool(s) ? edges[pt_pick(s, 8)] : pt_sized(s, 1, 700);
    const int64_t C = pt_bool(s) ? edges[pt_pick(s, 8)] : pt_sized(s, 1, 700);
    const moe_dtype src_dtype = pt_bool(s) ? MOE_BF16 : MOE_F32, fp8 = pt_bool(s) ? MOE_E5M2 : MOE_E4M3;
    const moe_fp8_scale_format format = pt_bool(s) ? MOE_FP8_SCALE_UE8M0 : MOE_FP8_SCALE_F32;
    const moe_dtype out_dtype = pt_bool(s) ? MOE_BF16 : MOE_F32;
    const int dist = pt_pick(s, 4), bad = pt_pick(s, 3); /* bad: 0 none, 1 a non-finite source, 2 a bad scale */
    uint64_t state = pt_draw(s, UINT32_MAX);
    const int tile_rows = blocks ? MOE_FP8_TILE : 1;
    const int64_t n = B * R * C, tiles = B * ((R + tile_rows - 1) / tile_rows) * ((C + 127) / 128);
    pt_describe(c, "gpu-fp8-quantize %s B=%lld R=%lld C=%lld %s -> %s scales=%s out=%s dist=%d bad=%d",
                blocks ? "blocks" : "rows", (long long)B, (long long)R, (long long)C, moe_dtype_name(src_dtype),
                moe_dtype_name(fp8), format ? "ue8m0" : "f32", moe_dtype_name(out_dtype), dist, bad);
    const size_t src_size = moe_dtype_size(src_dtype), out_size = moe_dtype_size(out_dtype);
    const size_t scale_bytes = (size_t)tiles * (format == MOE_FP8_SCALE_UE8M0 ? 1 : 4);
    void *src = xmalloc((size_t)n * src_size + 4), *scales = xmalloc(scale_bytes + 4);
    void *ref_scales = xmalloc(scale_bytes + 4);
    uint8_t *q = xmalloc((size_t)n + 1), *ref_q = xmalloc((size_t)n + 1), *codes = xmalloc((size_t)n + 1);
    void *out = xmalloc((size_t)n * out_size + 4), *ref_out = xmalloc((size_t)n * out_size + 4);
    for (int64_t i = 0; i < n; i++) {
        set_source(src, src_dtype, i, source_value(pt_mix(state++), dist, i % C));
        codes[i] = (uint8_t)pt_mix(state++);
    }
    int64_t bad_at = -1;
    if (bad == 1 && n > 0) { /* one non-finite source value, and maybe a second one later */
        bad_at = (int64_t)(pt_mix(state++) % (uint64_t)n);
        const float bad_value = pt_mix(state++) % 2 ? NAN : (pt_mix(state++) % 2 ? INFINITY : -INFINITY);
        for (int64_t at = bad_at; at < n; at += 1 + (int64_t)(pt_mix(state++) % (uint64_t)n)) {
            set_source(src, src_dtype, at, bad_value);
        }
    }
    /* the reference, on the host */
    moe_status ref_st = blocks ? moe_quantize_fp8_blocks(MOE_BACKEND_REF, src_dtype, B, R, C, src, fp8, format, ref_q,
                                                         ref_scales, NULL)
                               : moe_quantize_fp8_rows(MOE_BACKEND_REF, src_dtype, R, C, src, fp8, format, ref_q,
                                                       ref_scales, NULL);
    char ref_message[1024];
    snprintf(ref_message, sizeof ref_message, "%s", message_body(moe_last_error()));
    if ((ref_st != MOE_OK) != (bad_at >= 0))
        pt_fail(c, "status", "reference quantize returned %s: %s", moe_strerror(ref_st), moe_last_error());
    /* the device, its outputs starting as poison */
    memset(q, 0xa5, (size_t)n + 1);
    memset(scales, 0xa5, scale_bytes + 4);
    void *d_src = pt_device_copy(c, src, (size_t)n * src_size), *d_q = pt_device_copy(c, q, (size_t)n);
    void *d_scales = pt_device_copy(c, scales, scale_bytes);
    if (c->outcome != PT_FAIL) {
        moe_status st = blocks ? moe_quantize_fp8_blocks(MOE_BACKEND_CUDA, src_dtype, B, R, C, d_src, fp8, format, d_q,
                                                         d_scales, NULL)
                               : moe_quantize_fp8_rows(MOE_BACKEND_CUDA, src_dtype, R, C, d_src, fp8, format, d_q,
                                                       d_scales, NULL);
        if (st == MOE_OK)
            st = moe_backend_synchronize(MOE_BACKEND_CUDA, NULL);
        if (bad_at >= 0) {
            if (st != MOE_ERR_INVALID_VALUE || strstr(moe_last_error(), ref_message) == NULL)
                pt_fail(c, "bad-source", "a non-finite source at %lld: the GPU gave %s, \"%s\"; the reference \"%s\"",
                        (long long)bad_at, moe_strerror(st), moe_last_error(), ref_message);
        } else if (st != MOE_OK) {
            pt_fail(c, "device-error", "gpu quantize: %s: %s", moe_strerror(st), moe_last_error());
        }
        uint8_t *poison_q = xmalloc((size_t)n + 1);
        void *poison_scales = xmalloc(scale_bytes + 4);
        memcpy(poison_q, q, (size_t)n), memcpy(poison_scales, scales, scale_bytes);
        if (c->outcome != PT_FAIL && pt_device_download(c, q, d_q, (size_t)n) &&
            pt_device_download(c, scales, d_scales, scale_bytes)) {
            if (bad_at >= 0) {
                if (memcmp(q, poison_q, (size_t)n) != 0 || memcmp(scales, poison_scales, scale_bytes) != 0)
                    pt_fail(c, "bad-source", "a call reported bad changed its outputs");
            } else {
                for (int64_t i = 0; i < n && c->outcome != PT_FAIL; i++)
                    if (q[i] != ref_q[i])
                        pt_fail(c, "quantize-vs-ref", "code [%lld] of %a: GPU 0x%02x, reference 0x%02x", (long long)i,
                                (double)oracle_load(src_dtype, src, i), q[i], ref_q[i]);
                if (c->outcome != PT_FAIL && memcmp(scales, ref_scales, scale_bytes) != 0)
                    pt_fail(c, "quantize-vs-ref", "the scales differ from the reference's");
            }
        }
        free(poison_q), free(poison_scales);
    }
    /* the dequantization of any codes with the reference's scales (or, bad 2, one scale made invalid) */
    if (c->outcome != PT_FAIL && bad_at < 0 && n > 0) {
        int64_t bad_scale = -1;
        if (bad == 2) {
            bad_scale = (int64_t)(pt_mix(state++) % (uint64_t)tiles);
            if (format == MOE_FP8_SCALE_UE8M0)
                ((uint8_t *)ref_scales)[bad_scale] = 255;
            else
                ((float *)ref_scales)[bad_scale] = pt_mix(state++) % 2 ? -0.0f : INFINITY;
        }
        const moe_status st_ref = moe_dequantize_fp8(MOE_BACKEND_REF, fp8, format, tile_rows, B, R, C, codes,
                                                     ref_scales, out_dtype, ref_out, NULL);
        snprintf(ref_message, sizeof ref_message, "%s", message_body(moe_last_error()));
        memset(out, 0xa5, (size_t)n * out_size);
        void *d_codes = pt_device_copy(c, codes, (size_t)n), *d_s = pt_device_copy(c, ref_scales, scale_bytes);
        void *d_out = pt_device_copy(c, out, (size_t)n * out_size);
        if (c->outcome != PT_FAIL) {
            moe_status st = moe_dequantize_fp8(MOE_BACKEND_CUDA, fp8, format, tile_rows, B, R, C, d_codes, d_s,
                                               out_dtype, d_out, NULL);
            if (st == MOE_OK)
                st = moe_backend_synchronize(MOE_BACKEND_CUDA, NULL);
            void *gpu_out = xmalloc((size_t)n * out_size + 4);
            if (bad_scale >= 0) {
                if (st_ref != MOE_ERR_INVALID_VALUE || st != MOE_ERR_INVALID_VALUE ||
                    strstr(moe_last_error(), ref_message) == NULL)
                    pt_fail(c, "bad-scale", "scale %lld made invalid: the reference gave %s, the GPU %s, \"%s\" "
                            "(the reference: \"%s\")", (long long)bad_scale, moe_strerror(st_ref), moe_strerror(st),
                            moe_last_error(), ref_message);
                else if (pt_device_download(c, gpu_out, d_out, (size_t)n * out_size) &&
                         memcmp(gpu_out, out, (size_t)n * out_size) != 0)
                    pt_fail(c, "bad-scale", "a dequantization reported bad changed its output");
            } else if (st != MOE_OK || st_ref != MOE_OK) {
                pt_fail(c, "device-error", "dequantize: GPU %s, reference %s: %s", moe_strerror(st),
                        moe_strerror(st_ref), moe_last_error());
            } else if (pt_device_download(c, gpu_out, d_out, (size_t)n * out_size)) {
                same_dequantized(c, out_dtype, gpu_out, ref_out, n);
            }
            free(gpu_out);
        }
        void *ps[] = {d_codes, d_s, d_out};
        pt_device_free_all(ps, 3);
    }
    void *ps[] = {d_src, d_q, d_scales};
    pt_device_free_all(ps, 3);
    free(src), free(scales), free(ref_scales), free(q), free(ref_q), free(codes), free(out), free(ref_out);
}

/* gpu-gemm-fp8-model: where the Hopper kernel takes the call (compute capability 9.0, K and, for dX, N multiples
 * of 16, MOE_CUDA_KERNEL not forcing the portable kernel), the GPU's output equals the CPU model of that kernel
 * (fp8_hopper_model.h, the accumulator measured by bench/fp8_accum_probe.cu) bit for bit: a test of the model,
 * every wgmma of the case against it.  Elsewhere the case is discarded.  Run it with MOE_CUDA_KERNEL=sm90, so
 * that refused TMA descriptors fail instead of falling back to the portable kernel. */
#define GPU_FP8_MODEL_CAP_MACS 4000000 /* the model's CPU time */

void pt_gpu_gemm_fp8_model(pt_case *c)
{
    fp8_case f;
    fp8_case_generate_aligned(c, &f, GPU_FP8_MODEL_CAP_MACS, 16);
    if (portable_forced() || gpu_is_sm90() != 1 || f.M == 0 || f.N == 0 || f.K == 0) {
        pt_discard(c, "the Hopper FP8 kernel does not take this call here");
        fp8_case_free(&f);
        return;
    }
    void *got = xmalloc(f.out_bytes + 4), *want = xmalloc(f.out_bytes + 4);
    if (gpu_fp8_run(c, &f, f.old, got, 0)) {
        const fp8_hopper_model model = {1, 1}; /* the sum truncation too: seen on an H200 (fp8_hopper_model.h) */
        memcpy(want, f.old, f.out_bytes);
        if (f.dx)
            fp8_hopper_model_dx(&model, &f.routing, f.N, f.K, &f.a, &f.w, f.topk, want, &f.opt);
        else
            fp8_hopper_model_fwd(&model, &f.routing, f.N, f.K, &f.a, &f.w, f.topk, want, &f.opt);
        const size_t size = moe_dtype_size(f.opt.out_dtype);
        for (int64_t i = 0; i < f.out_count; i++)
            if (memcmp((char *)got + i * size, (char *)want + i * size, size) != 0) {
                pt_fail(c, "gpu-vs-model", "%s[%lld]: GPU %.9g, the model %.9g", f.dx ? "dx" : "y", (long long)i,
                        oracle_load(f.opt.out_dtype, got, i), oracle_load(f.opt.out_dtype, want, i));
                break;
            }
    }
    free(got), free(want);
    fp8_case_free(&f);
}
