/*
 * cli/cmd_fp8.c: the FP8 commands (specs/FP8.md): fp8-quantize (moe_quantize_fp8_rows / _blocks) and
 * gemm-fp8-fwd, gemm-fp8-dx (moe_gemm_fp8_fwd / _dx on the CPU reference), with the oracle's bound.
 */
#include "cli.h"
#include "moe_fp8.h"
#include "oracle_fp8.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define OPT_FP8_FORMAT                                                                                 \
    {"--fp8", "e4m3|e5m2", "the FP8 format of the codes (default e4m3, DeepSeek-V3's)."}

static const opt fp8_quantize_opts[] = {
    {"--in", "A.npy",
     "the tensor to quantize: float16/32/64, or bf16 bit patterns with --dtype bf16. Rows: any shape, the "
     "last dimension C tiled by 128 (leading dimensions are rows). --blocks: (R, C) or (B, R, C)."},
    {"--blocks", NULL,
     "128 x 128 blocks (weights, moe_quantize_fp8_blocks) instead of 1 x 128 tiles (activations, "
     "moe_quantize_fp8_rows)."},
    OPT_FP8_FORMAT,
    {"--scales", "f32|ue8m0",
     "the scale format: f32 (default), scale = amax / max; ue8m0, 2^ceil(log2(amax / max)) stored as the "
     "biased exponent (uint8)."},
    {"--dtype", "f32|bf16",
     "the source's dtype: f32 (default) or bf16 (the values are rounded to bf16 on load; needed for uint16 "
     "bit-pattern files)."},
    {"--out", "DIR",
     "folder to write q.npy (uint8 codes, the shape of --in) and scales.npy (float32 or uint8: (rows, "
     "ceil(C/128)), or (ceil(R/128), ceil(C/128)) with a third leading dimension B for 3-D blocks) into."},
    {NULL, NULL, NULL},
};

#define OPT_FP8_ROUTING                                                                                \
    {"--m-sizes", "M.npy", "rows per expert, shape (E,), int32 or int64 (moe route writes it)."},      \
    {"--gather", "G.npy", "gather_indices (M,): needed by --permute-x, --permute-y, --topk-weights, --reduce-topk."}, \
    {"--topk", "K", "experts per token k (required with --gather; default 1)."},                       \
    {"--permute-x", NULL, "X is token order (T, K); for gemm-fp8-dx: dX is written in slot order."},  \
    {"--permute-y", NULL, "Y and dY are in slot order."},                                              \
    {"--topk-weights", "TW.npy", "routing weights (M,) or (T, k), floating, used as float32."},        \
    {"--out-dtype", "f32|bf16", "the output's dtype (default f32); written as float32 either way."},   \
    {"--bound-out", "B.npy",                                                                           \
     "also write the float64 oracle's error bound of every output element (specs/FP8.md section 4), "  \
     "for `moe compare --bound`."}

static const opt gemm_fp8_fwd_opts[] = {
    {"--x", "XQ.npy", "X's codes, uint8, (M, K) in expert order or (T, K) with --permute-x (fp8-quantize's q.npy)."},
    {"--x-scales", "XS.npy", "X's scales, (rows, ceil(K/128)), float32 or uint8 (UE8M0)."},
    {"--w", "WQ.npy", "W's codes, uint8, (E, N, K) (fp8-quantize --blocks)."},
    {"--w-scales", "WS.npy", "W's scales, (E, ceil(N/128), ceil(K/128)), of the same format as --x-scales."},
    OPT_FP8_FORMAT,
    {"--w-fp8", "e4m3|e5m2", "W's format when it differs from --fp8."},
    OPT_FP8_ROUTING,
    {"--out", "Y.npy", "where to write Y (M, N): expert order, or slot order with --permute-y."},
    OPT_RAW,
    {NULL, NULL, NULL},
};

static const opt gemm_fp8_dx_opts[] = {
    {"--dy", "DYQ.npy", "dY's codes, uint8, (M, N), slot order with --permute-y."},
    {"--dy-scales", "DYS.npy", "dY's scales, (M, ceil(N/128)), float32 or uint8 (UE8M0)."},
    {"--w", "WQ.npy", "W's codes, uint8, (E, N, K): the forward's, with its scales."},
    {"--w-scales", "WS.npy", "W's scales, (E, ceil(N/128), ceil(K/128)), of the same format as --dy-scales."},
    OPT_FP8_FORMAT,
    {"--w-fp8", "e4m3|e5m2", "W's format when it differs from --fp8."},
    OPT_FP8_ROUTING,
    {"--reduce-topk", NULL, "write dX (T, K), each token's k rows summed in float32 (needs --gather)."},
    {"--out", "DX.npy", "where to write dX: (M, K) (slot order with --permute-x) or (T, K) with --reduce-topk."},
    OPT_RAW,
    {NULL, NULL, NULL},
};

static int run_fp8_quantize(const args *a);
static int run_gemm_fp8_fwd(const args *a);
static int run_gemm_fp8_dx(const args *a);

const command fp8_quantize_command = {
    "fp8-quantize",
    "--in A.npy [--blocks] [--fp8 e4m3|e5m2] [--scales f32|ue8m0] [--dtype f32|bf16] --out DIR",
    "FP8 codes and scales per 1 x 128 tile or 128 x 128 block (moe_quantize_fp8_rows / _blocks)",
    "DeepSeek-V3's recipe (specs/FP8.md section 3): per tile amax = max |v| (at least 1e-4), scale = amax / "
    "max (448 for e4m3), codes = the saturating round-to-nearest-even conversion of v * (max / amax). A NaN "
    "or Inf in the input is refused, naming the element.",
    fp8_quantize_opts, 0, run_fp8_quantize,
    "# the step's activations per 1 x 128 tile and its weights per 128 x 128 block, in e4m3\n"
    "moe fp8-quantize --in step/x.npy --out x8\n"
    "moe fp8-quantize --in step/w.npy --blocks --out w8",
};

const command gemm_fp8_fwd_command = {
    "gemm-fp8-fwd",
    "--x XQ.npy --x-scales XS.npy --w WQ.npy --w-scales WS.npy [--fp8 e4m3|e5m2] [--w-fp8 ...] --m-sizes M.npy "
    "[--gather G.npy --topk K] [--permute-x] [--permute-y] [--topk-weights TW.npy] [--out-dtype f32|bf16] "
    "--out Y.npy [--raw] [--bound-out B.npy]",
    "FP8 grouped GEMM forward with tile and block scales (moe_gemm_fp8_fwd, CPU reference)",
    "Each 128-element tile of K: the exact products of the codes summed in float32, times the product of "
    "the tile's two scales, added to a float32 accumulator (the promotion); one rounding of the output "
    "(specs/FP8.md section 2). The scale format (float32 or UE8M0) is that of the scale files.",
    gemm_fp8_fwd_opts, 0, run_gemm_fp8_fwd,
    "# the forward on the quantized step, with the oracle's bound of every element\n"
    "moe gemm-fp8-fwd --x x8/q.npy --x-scales x8/scales.npy --w w8/q.npy --w-scales w8/scales.npy \\\n"
    "    --m-sizes routing/m_sizes.npy --gather routing/gather_indices.npy --topk 2 --permute-x \\\n"
    "    --out y8.npy --bound-out y8_bound.npy",
};

const command gemm_fp8_dx_command = {
    "gemm-fp8-dx",
    "--dy DYQ.npy --dy-scales DYS.npy --w WQ.npy --w-scales WS.npy [--fp8 e4m3|e5m2] [--w-fp8 ...] --m-sizes M.npy "
    "[--gather G.npy --topk K] [--permute-x] [--permute-y] [--topk-weights TW.npy] [--reduce-topk] "
    "[--out-dtype f32|bf16] --out DX.npy [--raw] [--bound-out B.npy]",
    "FP8 grouped GEMM input gradient dX = dY . W[e] with tile and block scales (moe_gemm_fp8_dx)",
    "The reduction runs over N in tiles of 128: dY's 1 x 128 tiles and W's 128 x 128 blocks (the forward's: "
    "one quantization of W serves both products).",
    gemm_fp8_dx_opts, 0, run_gemm_fp8_dx,
    "# the gradient of x (token order, each token's 2 rows summed) from the quantized dy\n"
    "moe fp8-quantize --in step/dy.npy --out dy8\n"
    "moe gemm-fp8-dx --dy dy8/q.npy --dy-scales dy8/scales.npy --w w8/q.npy --w-scales w8/scales.npy \\\n"
    "    --m-sizes routing/m_sizes.npy --gather routing/gather_indices.npy --topk 2 --permute-x --reduce-topk \\\n"
    "    --out dx8.npy",
};

static moe_dtype fp8_format(const args *a, const char *flag, moe_dtype fallback)
{
    const char *s = get(a, flag);
    if (s == NULL)
        return fallback;
    moe_dtype d;
    if (!parse_dtype(s, &d) || (d != MOE_E4M3 && d != MOE_E5M2))
        die("%s %s: expected e4m3 or e5m2", flag, s);
    return d;
}

static int run_fp8_quantize(const args *a)
{
    const char *in = need(a, "--in"), *dir = need(a, "--out");
    const int blocks = get(a, "--blocks") != NULL;
    const moe_dtype fp8 = fp8_format(a, "--fp8", MOE_E4M3);
    const char *scales_name = get(a, "--scales");
    moe_fp8_scale_format format = MOE_FP8_SCALE_F32;
    if (scales_name != NULL && strcmp(scales_name, "ue8m0") == 0)
        format = MOE_FP8_SCALE_UE8M0;
    else if (scales_name != NULL && strcmp(scales_name, "f32") != 0)
        die("--scales %s: expected f32 or ue8m0", scales_name);
    moe_dtype src_dtype = MOE_F32;
    if (get(a, "--dtype") != NULL && (!parse_dtype(get(a, "--dtype"), &src_dtype) ||
                                      (src_dtype != MOE_F32 && src_dtype != MOE_BF16)))
        die("--dtype %s: expected f32 or bf16", get(a, "--dtype"));
    static const char *const names[] = {"q.npy", "scales.npy"};
    char *p[2];
    add_outputs_in(dir, names, 2, p);
    claim_files(a, (const char *const[]){NULL}, (const char *const[]){"--in", NULL});

    npy_array arr;
    load(in, &arr);
    check_floating(in, &arr);
    if (npy_type_is_pattern(arr.h.type) && src_dtype != MOE_BF16)
        die("%s: holds %s 16-bit patterns; pass --dtype bf16 to say they are bf16", in, npy_type_name(arr.h.type));
    if (arr.h.ndim < 1 || (blocks && arr.h.ndim != 2 && arr.h.ndim != 3))
        die("%s: expected %s, found %s %s", in, blocks ? "a shape (R, C) or (B, R, C)" : "at least one dimension",
            shape_text(&arr.h), npy_type_name(arr.h.type));
    const int64_t C = arr.h.shape[arr.h.ndim - 1];
    const int64_t B = blocks && arr.h.ndim == 3 ? arr.h.shape[0] : 1;
    const int64_t R = C > 0 ? arr.h.count / C / B : (blocks ? arr.h.shape[arr.h.ndim - 2] : arr.h.count);
    void *src = convert(in, &arr, src_dtype);
    const int64_t tiles_r = blocks ? (R + 127) / 128 : R, tiles_c = (C + 127) / 128;
    uint8_t *q = xmalloc(elements(B, R, C), 1);
    void *scales = xmalloc(elements(B, tiles_r, tiles_c), format == MOE_FP8_SCALE_UE8M0 ? 1 : 4);
    const moe_status st = blocks ? moe_quantize_fp8_blocks(src_dtype, B, R, C, src, fp8, format, q, scales)
                                 : moe_quantize_fp8_rows(src_dtype, R, C, src, fp8, format, q, scales);
    if (st != MOE_OK)
        die("%s: %s", in, moe_last_error());
    make_dirs(dir);
    write_array(p[0], NPY_T_U8, arr.h.ndim, arr.h.shape, q);
    const int64_t s3[3] = {B, tiles_r, tiles_c};
    const int sdim = blocks ? arr.h.ndim : 2;
    write_array(p[1], format == MOE_FP8_SCALE_UE8M0 ? NPY_T_U8 : NPY_T_F32, sdim, sdim == 3 ? s3 : s3 + 1, scales);
    commit_outputs();
    return 0;
}

/* One FP8 operand from its codes file and its scales file; *format is set by (or checked against) the
 * scales' type. */
static moe_fp8_tensor load_operand(const char *codes_path, const char *scales_path, moe_dtype dtype, int ndim,
                                   const int64_t *shape, const int64_t *scale_shape, int *format)
{
    npy_array q, s;
    load(codes_path, &q);
    load(scales_path, &s);
    if (q.h.type != NPY_T_U8 || !shape_is(&q.h, ndim, shape)) {
        char expected[128];
        die("%s: expected FP8 codes, uint8 of shape %s, found %s %s", codes_path,
            npy_format_shape(expected, sizeof expected, ndim, shape), shape_text(&q.h), npy_type_name(q.h.type));
    }
    const int this_format = s.h.type == NPY_T_U8 ? MOE_FP8_SCALE_UE8M0 : s.h.type == NPY_T_F32 ? MOE_FP8_SCALE_F32 : -1;
    if (this_format < 0 || !shape_is(&s.h, ndim, scale_shape)) {
        char expected[128];
        die("%s: expected scales, float32 or uint8 (UE8M0) of shape %s, found %s %s", scales_path,
            npy_format_shape(expected, sizeof expected, ndim, scale_shape), shape_text(&s.h), npy_type_name(s.h.type));
    }
    if (*format >= 0 && *format != this_format)
        die("%s: %s scales, but the other operand's are %s: one format per call", scales_path,
            npy_type_name(s.h.type), *format == MOE_FP8_SCALE_UE8M0 ? "uint8 (UE8M0)" : "float32");
    *format = this_format;
    return (moe_fp8_tensor){q.data, s.data, dtype};
}

/* gemm-fp8-fwd (dx 0) and gemm-fp8-dx (dx 1). */
static int run_gemm_fp8(const args *a, int dx)
{
    const char *a_opt = dx ? "--dy" : "--x", *as_opt = dx ? "--dy-scales" : "--x-scales";
    const char *a_path = need(a, a_opt), *as_path = need(a, as_opt);
    const char *w_path = need(a, "--w"), *ws_path = need(a, "--w-scales"), *out = need(a, "--out");
    const char *tw_path = get(a, "--topk-weights");
    claim_files(a, (const char *const[]){"--out", "--bound-out", NULL},
                (const char *const[]){a_opt, as_opt, "--w", "--w-scales", "--m-sizes", "--gather", "--topk-weights",
                                      NULL});
    routing_in ri;
    load_routing(a, &ri);
    moe_fp8_options o;
    memset(&o, 0, sizeof o);
    o.permute_x = get(a, "--permute-x") != NULL;
    o.permute_y = get(a, "--permute-y") != NULL;
    o.reduce_topk = dx && get(a, "--reduce-topk") != NULL;
    static const char *const needs_gather[] = {"--permute-x", "--permute-y", "--topk-weights", "--reduce-topk"};
    for (size_t i = 0; i < (dx ? 4u : 3u); i++) /* --reduce-topk: gemm-fp8-dx only */
        if (get(a, needs_gather[i]) != NULL)
            require_gather(&ri, needs_gather[i]);
    o.out_dtype = MOE_F32;
    if (get(a, "--out-dtype") != NULL && (!parse_dtype(get(a, "--out-dtype"), &o.out_dtype) ||
                                          (o.out_dtype != MOE_F32 && o.out_dtype != MOE_BF16)))
        die("--out-dtype %s: expected f32 or bf16", get(a, "--out-dtype"));
    const moe_dtype a_fp8 = fp8_format(a, "--fp8", MOE_E4M3), w_fp8 = fp8_format(a, "--w-fp8", a_fp8);

    /* W's shape gives N and K */
    npy_array wh;
    load(w_path, &wh);
    if (wh.h.ndim != 3 || wh.h.shape[0] != ri.E)
        die("%s: expected FP8 codes of shape (E, N, K) with E = %lld (the length of %s), found %s %s", w_path,
            (long long)ri.E, ri.m_path, shape_text(&wh.h), npy_type_name(wh.h.type));
    const int64_t N = wh.h.shape[1], K = wh.h.shape[2], tn = (N + 127) / 128, tk = (K + 127) / 128;
    release(&wh);
    int format = -1;
    const int64_t a_rows = dx ? ri.M : (o.permute_x ? ri.T : ri.M), a_cols = dx ? N : K;
    const int64_t a_shape[2] = {a_rows, a_cols}, as_shape[2] = {a_rows, dx ? tn : tk};
    const int64_t w_shape[3] = {ri.E, N, K}, ws_shape[3] = {ri.E, tn, tk};
    const moe_fp8_tensor at = load_operand(a_path, as_path, a_fp8, 2, a_shape, as_shape, &format);
    const moe_fp8_tensor wt = load_operand(w_path, ws_path, w_fp8, 3, w_shape, ws_shape, &format);
    o.scale_format = (moe_fp8_scale_format)format;
    float *tw = NULL;
    if (tw_path != NULL) {
        npy_array t;
        load(tw_path, &t);
        check_floating(tw_path, &t);
        check_topk_weights(tw_path, &t, &ri);
        tw = convert(tw_path, &t, MOE_F32);
    }
    const int64_t out_shape[2] = {dx ? (o.reduce_topk ? ri.T : ri.M) : ri.M, dx ? K : N};
    const size_t count = elements(out_shape[0], out_shape[1], 1);
    void *y = xmalloc(count, moe_dtype_size(o.out_dtype));
    const moe_status st = dx ? moe_gemm_fp8_dx(MOE_BACKEND_REF, &ri.r, N, K, &at, &wt, tw, y, &o)
                             : moe_gemm_fp8_fwd(MOE_BACKEND_REF, &ri.r, N, K, &at, &wt, tw, y, &o);
    if (st != MOE_OK)
        library_failed(dx ? "moe_gemm_fp8_dx" : "moe_gemm_fp8_fwd", st);
    write_result(a, out, o.out_dtype, y, 2, out_shape);
    const char *bound_path = get(a, "--bound-out");
    if (bound_path != NULL) {
        double *value = xmalloc(count, sizeof(double)), *bound = xmalloc(count, sizeof(double));
        if (dx)
            oracle_gemm_fp8_dx(&ri.r, N, K, &at, &wt, tw, NULL, &o, value, bound);
        else
            oracle_gemm_fp8_fwd(&ri.r, N, K, &at, &wt, tw, NULL, &o, value, bound);
        write_array(bound_path, NPY_T_F64, 2, out_shape, bound);
    }
    commit_outputs();
    return 0;
}

static int run_gemm_fp8_fwd(const args *a) { return run_gemm_fp8(a, 0); }
static int run_gemm_fp8_dx(const args *a) { return run_gemm_fp8(a, 1); }
