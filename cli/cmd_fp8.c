/*
 * cli/cmd_fp8.c: the FP8 commands (specs/FP8.md): fp8-quantize (moe_quantize_fp8_rows / _blocks; --columns is
 * cmd_fp8_dw.c's) and
 * gemm-fp8-fwd, gemm-fp8-dx (moe_gemm_fp8_fwd / _dx), on the backend --backend names, with the oracle's bound.
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
    {"--columns", NULL,
     "128 x 1 tiles along each expert's rows (gemm-fp8-dw's operands, moe_quantize_fp8_columns): --in is "
     "(rows, C), the routing is --m-sizes (and --gather, --topk); writes q.npy (M, C) in expert-row order and "
     "scales.npy (ceil(M/128) + E - 1, C), the tile of expert e beginning at expert row r0 in scale row "
     "r0 / 128 + e."},
    {"--rows", "expert|slot|token",
     "with --columns, where expert row r's values are: row r of --in (expert, the default), row G[r] (slot: "
     "dY of a forward with --permute-y) or row G[r] / k (token: X of a forward with --permute-x)."},
    {"--topk-weights", "TW.npy",
     "with --columns: routing weights (M,) or (T, k), used as float32; expert row r's values times TW[G[r]] "
     "before its tile's amax (dY of a forward with fused topk weights)."},
    {"--m-sizes", "M.npy", "with --columns: rows per expert, shape (E,), int32 or int64 (moe route writes it)."},
    {"--gather", "G.npy", "with --columns: gather_indices (M,), needed by --rows slot|token and --topk-weights."},
    {"--topk", "K", "with --columns: experts per token k (required with --gather; default 1)."},
    {"--codes-transposed", NULL,
     "with --columns: write the codes transposed, q.npy (C, M), q[c][r] expert row r's code of column c "
     "(moe_quantize_fp8_columns_transposed; gemm-fp8-dw --codes-transposed reads them); the scales as without."},
    OPT_FP8_FORMAT,
    {"--scales", "f32|ue8m0",
     "the scale format: f32 (default), scale = amax / max; ue8m0, 2^ceil(log2(amax / max)) stored as the "
     "biased exponent (uint8)."},
    {"--dtype", "f32|bf16",
     "the source's dtype: f32 (default) or bf16 (the values are rounded to bf16 on load; needed for uint16 "
     "bit-pattern files)."},
    OPT_BACKEND,
    {"--out", "DIR",
     "folder to write q.npy (uint8 codes, the shape of --in) and scales.npy (float32 or uint8: (rows, "
     "ceil(C/128)), or (ceil(R/128), ceil(C/128)) with a third leading dimension B for 3-D blocks) into."},
    {NULL, NULL, NULL},
};

#define OPT_FP8_ROUTING                                                                                \
    OPT_FP8_M_SIZES,                                                                                   \
    {"--gather", "G.npy", "gather_indices (M,): needed by --permute-x, --permute-y, --topk-weights, --reduce-topk."}, \
    OPT_FP8_TOPK,                                                                                      \
    {"--permute-x", NULL, "X is token order (T, K); for gemm-fp8-dx: dX is written in slot order."},  \
    {"--permute-y", NULL, "Y and dY are in slot order."},                                              \
    {"--topk-weights", "TW.npy", "routing weights (M,) or (T, k), floating, used as float32."},        \
    OPT_FP8_OUT_DTYPE,                                                                                 \
    OPT_FP8_BOUND_OUT

static const opt gemm_fp8_fwd_opts[] = {
    {"--x", "XQ.npy", "X's codes, uint8, (M, K) in expert order or (T, K) with --permute-x (fp8-quantize's q.npy)."},
    {"--x-scales", "XS.npy", "X's scales, (rows, ceil(K/128)), float32 or uint8 (UE8M0)."},
    {"--w", "WQ.npy", "W's codes, uint8, (E, N, K) (fp8-quantize --blocks)."},
    {"--w-scales", "WS.npy", "W's scales, (E, ceil(N/128), ceil(K/128)), of the same format as --x-scales."},
    OPT_FP8_FORMAT,
    {"--w-fp8", "e4m3|e5m2", "W's format when it differs from --fp8."},
    OPT_FP8_ROUTING,
    OPT_BACKEND,
    {"--out", "Y.npy", "where to write Y (M, N): expert order, or slot order with --permute-y."},
    OPT_RAW,
    {NULL, NULL, NULL},
};

static const opt gemm_fp8_dx_opts[] = {
    {"--dy", "DYQ.npy", "dY's codes, uint8, (M, N), slot order with --permute-y."},
    {"--dy-scales", "DYS.npy", "dY's scales, (M, ceil(N/128)), float32 or uint8 (UE8M0)."},
    {"--w", "WQ.npy", "W's codes, uint8, (E, N, K): the forward's, with its scales; with --w-transposed W^T's, (E, K, N)."},
    {"--w-scales", "WS.npy", "W's scales, (E, ceil(N/128), ceil(K/128)) (W^T's: (E, ceil(K/128), ceil(N/128))), of the "
     "same format as --dy-scales."},
    {"--w-transposed", NULL, "--w and --w-scales are W^T's (fp8-quantize --blocks of W^T): the same result, and on "
     "sm_90a a faster kernel."},
    OPT_FP8_FORMAT,
    {"--w-fp8", "e4m3|e5m2", "W's format when it differs from --fp8."},
    OPT_FP8_ROUTING,
    {"--reduce-topk", NULL, "write dX (T, K), each token's k rows summed in float32 (needs --gather)."},
    OPT_BACKEND,
    {"--out", "DX.npy", "where to write dX: (M, K) (slot order with --permute-x) or (T, K) with --reduce-topk."},
    OPT_RAW,
    {NULL, NULL, NULL},
};

static int run_fp8_quantize(const args *a);
static int run_gemm_fp8_fwd(const args *a);
static int run_gemm_fp8_dx(const args *a);

const command fp8_quantize_command = {
    "fp8-quantize",
    "--in A.npy [--blocks | --columns --m-sizes M.npy [--gather G.npy --topk K] [--rows expert|slot|token] "
    "[--topk-weights TW.npy] [--codes-transposed]] [--fp8 e4m3|e5m2] [--scales f32|ue8m0] [--dtype f32|bf16] [--backend ref|cuda] "
    "--out DIR",
    "FP8 codes and scales per 1 x 128 tile, 128 x 128 block or 128 x 1 expert tile (moe_quantize_fp8_*)",
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
    "[--backend ref|cuda] --out Y.npy [--raw] [--bound-out B.npy]",
    "FP8 grouped GEMM forward with tile and block scales (moe_gemm_fp8_fwd)",
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
    "--dy DYQ.npy --dy-scales DYS.npy --w WQ.npy --w-scales WS.npy [--w-transposed] [--fp8 e4m3|e5m2] [--w-fp8 ...] "
    "--m-sizes M.npy [--gather G.npy --topk K] [--permute-x] [--permute-y] [--topk-weights TW.npy] [--reduce-topk] "
    "[--out-dtype f32|bf16] [--backend ref|cuda] --out DX.npy [--raw] [--bound-out B.npy]",
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

moe_dtype fp8_format(const args *a, const char *flag, moe_dtype fallback)
{
    const char *s = get(a, flag);
    if (s == NULL)
        return fallback;
    moe_dtype d;
    if (!parse_dtype(s, &d) || (d != MOE_E4M3 && d != MOE_E5M2))
        die("%s %s: expected e4m3 or e5m2", flag, s);
    return d;
}

moe_dtype f32_or_bf16(const args *a, const char *flag)
{
    moe_dtype d = MOE_F32;
    if (get(a, flag) != NULL && (!parse_dtype(get(a, flag), &d) || (d != MOE_F32 && d != MOE_BF16)))
        die("%s %s: expected f32 or bf16", flag, get(a, flag));
    return d;
}

moe_fp8_scale_format fp8_scale_format(const args *a)
{
    const char *name = get(a, "--scales");
    if (name == NULL || strcmp(name, "f32") == 0)
        return MOE_FP8_SCALE_F32;
    if (strcmp(name, "ue8m0") != 0)
        die("--scales %s: expected f32 or ue8m0", name);
    return MOE_FP8_SCALE_UE8M0;
}

void load_fp8_source(const char *path, npy_array *arr, moe_dtype src_dtype)
{
    load(path, arr);
    check_floating(path, arr);
    if (npy_type_is_pattern(arr->h.type) && src_dtype != MOE_BF16)
        die("%s: holds %s 16-bit patterns; pass --dtype bf16 to say they are bf16", path, npy_type_name(arr->h.type));
}

static int run_fp8_quantize(const args *a)
{
    const int columns = get(a, "--columns") != NULL;
    if (columns && get(a, "--blocks") != NULL)
        die("--columns and --blocks: pick one tiling");
    if (columns)
        return run_fp8_quantize_columns(a);
    static const char *const columns_only[] = {"--rows", "--topk-weights", "--m-sizes", "--gather", "--topk",
                                               "--codes-transposed"};
    for (size_t i = 0; i < sizeof columns_only / sizeof columns_only[0]; i++)
        if (get(a, columns_only[i]) != NULL)
            die("%s applies to --columns only", columns_only[i]);
    const moe_backend backend = get_backend(a);
    const char *in = need(a, "--in"), *dir = need(a, "--out");
    const int blocks = get(a, "--blocks") != NULL;
    const moe_dtype fp8 = fp8_format(a, "--fp8", MOE_E4M3);
    const moe_fp8_scale_format format = fp8_scale_format(a);
    const moe_dtype src_dtype = f32_or_bf16(a, "--dtype");
    static const char *const names[] = {"q.npy", "scales.npy"};
    char *p[2];
    add_outputs_in(dir, names, 2, p);
    claim_files(a, (const char *const[]){NULL}, (const char *const[]){"--in", NULL});

    npy_array arr;
    load_fp8_source(in, &arr, src_dtype);
    if (arr.h.ndim < 1 || (blocks && arr.h.ndim != 2 && arr.h.ndim != 3))
        die("%s: expected %s, found %s %s", in, blocks ? "a shape (R, C) or (B, R, C)" : "at least one dimension",
            shape_text(&arr.h), npy_type_name(arr.h.type));
    const int64_t C = arr.h.shape[arr.h.ndim - 1];
    const int64_t B = blocks && arr.h.ndim == 3 ? arr.h.shape[0] : 1;
    const int64_t R = C > 0 ? arr.h.count / C / B : (blocks ? arr.h.shape[arr.h.ndim - 2] : arr.h.count);
    void *src = convert(in, &arr, src_dtype);
    const int64_t tiles_r = blocks ? (R + 127) / 128 : R, tiles_c = (C + 127) / 128;
    const size_t count = elements(B, R, C);
    const size_t scale_bytes = elements(B, tiles_r, tiles_c) * (format == MOE_FP8_SCALE_UE8M0 ? 1 : 4);
    uint8_t *q = xmalloc(count, 1);
    void *scales = xmalloc(scale_bytes, 1);
    char name[1200]; /* the call and the file, for a refusal's message */
    snprintf(name, sizeof name, "%s on %s", blocks ? "moe_quantize_fp8_blocks" : "moe_quantize_fp8_rows", in);
    lib_call c = {name, backend, 0, {{0}}};
    const void *src_on = call_in(&c, "src", src, count * moe_dtype_size(src_dtype));
    void *q_on = call_out(&c, "q", q, count), *scales_on = call_out(&c, "scales", scales, scale_bytes);
    call_end(&c, blocks ? moe_quantize_fp8_blocks(backend, src_dtype, B, R, C, src_on, fp8, format, q_on, scales_on,
                                                  NULL)
                        : moe_quantize_fp8_rows(backend, src_dtype, R, C, src_on, fp8, format, q_on, scales_on, NULL));
    make_dirs(dir);
    write_array(p[0], NPY_T_U8, arr.h.ndim, arr.h.shape, q);
    const int64_t s3[3] = {B, tiles_r, tiles_c};
    const int sdim = blocks ? arr.h.ndim : 2;
    write_array(p[1], format == MOE_FP8_SCALE_UE8M0 ? NPY_T_U8 : NPY_T_F32, sdim, sdim == 3 ? s3 : s3 + 1, scales);
    commit_outputs();
    return 0;
}

moe_fp8_tensor load_fp8_operand(const char *codes_path, const char *scales_path, moe_dtype dtype, int ndim,
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
    const char *fn = dx ? "moe_gemm_fp8_dx" : "moe_gemm_fp8_fwd";
    lib_call c = {fn, get_backend(a), 0, {{0}}};
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
    routing_flags(a, &ri, &o.permute_x, &o.permute_y, dx ? &o.reduce_topk : NULL);
    o.w_transposed = dx && get(a, "--w-transposed") != NULL;
    o.out_dtype = f32_or_bf16(a, "--out-dtype");
    const moe_dtype a_fp8 = fp8_format(a, "--fp8", MOE_E4M3), w_fp8 = fp8_format(a, "--w-fp8", a_fp8);

    /* W's shape (or W^T's) gives N and K */
    npy_array wh;
    load(w_path, &wh);
    if (wh.h.ndim != 3 || wh.h.shape[0] != ri.E)
        die("%s: expected FP8 codes of shape %s with E = %lld (the length of %s), found %s %s", w_path,
            o.w_transposed ? "(E, K, N)" : "(E, N, K)", (long long)ri.E, ri.m_path, shape_text(&wh.h),
            npy_type_name(wh.h.type));
    const int64_t N = wh.h.shape[o.w_transposed ? 2 : 1], K = wh.h.shape[o.w_transposed ? 1 : 2];
    const int64_t tn = (N + 127) / 128, tk = (K + 127) / 128;
    release(&wh);
    int format = -1;
    const int64_t a_rows = dx ? ri.M : (o.permute_x ? ri.T : ri.M), a_cols = dx ? N : K;
    const int64_t a_shape[2] = {a_rows, a_cols}, as_shape[2] = {a_rows, dx ? tn : tk};
    const int64_t w_shape[3] = {ri.E, o.w_transposed ? K : N, o.w_transposed ? N : K};
    const int64_t ws_shape[3] = {ri.E, o.w_transposed ? tk : tn, o.w_transposed ? tn : tk};
    const moe_fp8_tensor at = load_fp8_operand(a_path, as_path, a_fp8, 2, a_shape, as_shape, &format);
    const moe_fp8_tensor wt = load_fp8_operand(w_path, ws_path, w_fp8, 3, w_shape, ws_shape, &format);
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
    const size_t count = elements(out_shape[0], out_shape[1], 1), out_bytes = count * moe_dtype_size(o.out_dtype);
    void *y = xmalloc(count, moe_dtype_size(o.out_dtype));
    const size_t scale_size = format == MOE_FP8_SCALE_UE8M0 ? 1 : 4;
    const moe_routing r = call_routing(&c, &ri.r);
    const moe_fp8_tensor a_on = {call_in(&c, a_opt + 2, at.data, elements(a_rows, a_cols, 1)),
                                 call_in(&c, as_opt + 2, at.scales, elements(as_shape[0], as_shape[1], scale_size)),
                                 at.dtype};
    const moe_fp8_tensor w_on = {call_in(&c, "w", wt.data, elements(ri.E, N, K)),
                                 call_in(&c, "w-scales", wt.scales, elements(ri.E, tn, tk) * scale_size), wt.dtype};
    const float *tw_on = call_in(&c, "topk_weights", tw, elements(ri.M, sizeof(float), 1));
    void *y_on = call_out(&c, dx ? "dx" : "y", y, out_bytes);
    call_end(&c, dx ? moe_gemm_fp8_dx(c.backend, &r, N, K, &a_on, &w_on, tw_on, y_on, &o)
                    : moe_gemm_fp8_fwd(c.backend, &r, N, K, &a_on, &w_on, tw_on, y_on, &o));
    write_result(a, out, o.out_dtype, y, 2, out_shape);
    const char *bound_path = get(a, "--bound-out");
    if (bound_path != NULL) {
        double *value = xmalloc(count, sizeof(double)), *bound = xmalloc(count, sizeof(double));
        // on CUDA the bound of FP8 wgmma's in-tile sums (the Hopper kernel's), which covers the float32 ones too
        const int tile_bits = c.backend == MOE_BACKEND_CUDA ? ORACLE_FP8_TILE_HOPPER_BITS : ORACLE_FP8_TILE_F32;
        if (dx)
            oracle_gemm_fp8_dx(&ri.r, N, K, &at, &wt, tw, NULL, &o, tile_bits, value, bound);
        else
            oracle_gemm_fp8_fwd(&ri.r, N, K, &at, &wt, tw, NULL, &o, tile_bits, value, bound);
        write_array(bound_path, NPY_T_F64, 2, out_shape, bound);
    }
    commit_outputs();
    return 0;
}

static int run_gemm_fp8_fwd(const args *a) { return run_gemm_fp8(a, 0); }
static int run_gemm_fp8_dx(const args *a) { return run_gemm_fp8(a, 1); }
