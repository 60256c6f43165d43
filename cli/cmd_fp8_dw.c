/*
 * cli/cmd_fp8_dw.c: FP8 dW (specs/FP8.md, "dW"): fp8-quantize --columns (moe_quantize_fp8_columns, 128 x 1 tiles
 * along each expert's rows; with --codes-transposed moe_quantize_fp8_columns_transposed) and the command
 * gemm-fp8-dw (moe_gemm_fp8_dw, --codes-transposed: options.codes_transposed), with the oracle's bound.
 */
#include "cli.h"
#include "moe_fp8.h"
#include "oracle_fp8.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static const opt gemm_fp8_dw_opts[] = {
    {"--x", "XQ.npy", "X's codes, uint8, (M, K) in expert-row order (fp8-quantize --columns' q.npy); (K, M) with "
     "--codes-transposed."},
    {"--x-scales", "XS.npy", "X's scales, (ceil(M/128) + E - 1, K), float32 or uint8 (UE8M0)."},
    {"--dy", "DYQ.npy", "dY's codes, uint8, (M, N) in expert-row order; (N, M) with --codes-transposed."},
    {"--dy-scales", "DYS.npy", "dY's scales, (ceil(M/128) + E - 1, N), of the same format as --x-scales."},
    {"--codes-transposed", NULL, "--x and --dy hold the codes transposed, (K, M) and (N, M) (fp8-quantize --columns "
     "--codes-transposed): the same result (the reference's bit for bit), and the form Hopper's FP8 tensor cores "
     "read (options.codes_transposed)."},
    {"--fp8", "e4m3|e5m2", "the FP8 format of dY's codes (default e4m3)."},
    {"--x-fp8", "e4m3|e5m2", "X's format when it differs from --fp8."},
    OPT_FP8_M_SIZES,
    {"--gather", "G.npy", "gather_indices (M,): not needed (the operands are in expert-row order); checked if given."},
    OPT_FP8_TOPK,
    OPT_FP8_OUT_DTYPE,
    OPT_BACKEND,
    {"--out", "DW.npy", "where to write dW (E, N, K)."},
    OPT_RAW,
    OPT_FP8_BOUND_OUT,
    {NULL, NULL, NULL},
};

static int run_gemm_fp8_dw(const args *a);

const command gemm_fp8_dw_command = {
    "gemm-fp8-dw",
    "--x XQ.npy --x-scales XS.npy --dy DYQ.npy --dy-scales DYS.npy [--codes-transposed] [--fp8 e4m3|e5m2] "
    "[--x-fp8 ...] --m-sizes M.npy "
    "[--gather G.npy --topk K] [--out-dtype f32|bf16] [--backend ref|cuda] --out DW.npy [--raw] [--bound-out B.npy]",
    "FP8 grouped GEMM weight gradient dW[e] = sum over expert e's rows of dY_r^T X_r (moe_gemm_fp8_dw)",
    "The reduction runs over each expert's rows in tiles of 128 (fp8-quantize --columns' tiles): the exact "
    "products of the codes summed in float32, times the product of the tile's two scales, added to a float32 "
    "accumulator; one rounding of the output. An expert without rows gets zeros. The operands are in "
    "expert-row order: the forward's gathers and topk weights are fp8-quantize --columns'.",
    gemm_fp8_dw_opts, 0, run_gemm_fp8_dw,
    "# dW of the step: x (token order) and dy, each quantized per 128 x 1 tile of each expert's rows\n"
    "moe fp8-quantize --in step/x.npy --columns --m-sizes routing/m_sizes.npy \\\n"
    "    --gather routing/gather_indices.npy --topk 2 --rows token --out xc\n"
    "moe fp8-quantize --in step/dy.npy --columns --m-sizes routing/m_sizes.npy --out dyc\n"
    "moe gemm-fp8-dw --x xc/q.npy --x-scales xc/scales.npy --dy dyc/q.npy --dy-scales dyc/scales.npy \\\n"
    "    --m-sizes routing/m_sizes.npy --out dw8.npy --bound-out dw8_bound.npy",
};

static moe_fp8_row_source row_source(const args *a, const routing_in *ri)
{
    const char *s = get(a, "--rows");
    if (s == NULL || strcmp(s, "expert") == 0)
        return MOE_FP8_ROWS_EXPERT;
    if (strcmp(s, "slot") != 0 && strcmp(s, "token") != 0)
        die("--rows %s: expected expert, slot or token", s);
    require_gather(ri, "--rows slot|token");
    return strcmp(s, "slot") == 0 ? MOE_FP8_ROWS_SLOT : MOE_FP8_ROWS_TOKEN;
}

int run_fp8_quantize_columns(const args *a)
{
    static const char fn[] = "moe_quantize_fp8_columns";
    lib_call c = {fn, get_backend(a), 0, {{0}}};
    const char *in = need(a, "--in"), *dir = need(a, "--out"), *tw_path = get(a, "--topk-weights");
    const moe_dtype fp8 = fp8_format(a, "--fp8", MOE_E4M3);
    const moe_fp8_scale_format format = fp8_scale_format(a);
    const moe_dtype src_dtype = f32_or_bf16(a, "--dtype");
    static const char *const names[] = {"q.npy", "scales.npy"};
    char *p[2];
    add_outputs_in(dir, names, 2, p);
    claim_files(a, (const char *const[]){NULL},
                (const char *const[]){"--in", "--m-sizes", "--gather", "--topk-weights", NULL});
    routing_in ri;
    load_routing(a, &ri);
    const moe_fp8_row_source source = row_source(a, &ri);
    if (tw_path != NULL)
        require_gather(&ri, "--topk-weights");
    const int transposed = get(a, "--codes-transposed") != NULL;
    if (transposed)
        c.name = "moe_quantize_fp8_columns_transposed";

    npy_array arr;
    load_fp8_source(in, &arr, src_dtype);
    const int64_t rows = source == MOE_FP8_ROWS_TOKEN ? ri.T : ri.M;
    if (arr.h.ndim != 2 || arr.h.shape[0] != rows)
        die("%s: expected a shape (%lld, C) (%s rows: %s), found %s %s", in, (long long)rows,
            source == MOE_FP8_ROWS_TOKEN ? "token" : source == MOE_FP8_ROWS_SLOT ? "slot" : "expert",
            source == MOE_FP8_ROWS_TOKEN ? "T = M / k" : "M, the sum of m_sizes", shape_text(&arr.h),
            npy_type_name(arr.h.type));
    const int64_t C = arr.h.shape[1], scale_rows = moe_fp8_column_scale_rows(ri.M, ri.E);
    void *src = convert(in, &arr, src_dtype);
    float *tw = NULL;
    if (tw_path != NULL) {
        npy_array t;
        load(tw_path, &t);
        check_floating(tw_path, &t);
        check_topk_weights(tw_path, &t, &ri);
        tw = convert(tw_path, &t, MOE_F32);
    }
    const size_t count = elements(ri.M, C, 1);
    const size_t scale_bytes = elements(scale_rows, C, format == MOE_FP8_SCALE_UE8M0 ? 1 : 4);
    uint8_t *q = xmalloc(count, 1);
    void *scales = xmalloc(scale_bytes, 1);
    const moe_routing r = call_routing(&c, &ri.r);
    const void *src_on = call_in(&c, "src", src, elements(rows, C, moe_dtype_size(src_dtype)));
    const float *tw_on = call_in(&c, "topk_weights", tw, elements(ri.M, sizeof(float), 1));
    void *q_on = call_out(&c, "q", q, count), *scales_on = call_out(&c, "scales", scales, scale_bytes);
    call_end(&c, (transposed ? moe_quantize_fp8_columns_transposed : moe_quantize_fp8_columns)(
                     c.backend, &r, src_dtype, C, src_on, source, tw_on, fp8, format, q_on, scales_on, NULL));
    make_dirs(dir);
    const int64_t q_shape[2] = {transposed ? C : ri.M, transposed ? ri.M : C}, s_shape[2] = {scale_rows, C};
    write_array(p[0], NPY_T_U8, 2, q_shape, q);
    write_array(p[1], format == MOE_FP8_SCALE_UE8M0 ? NPY_T_U8 : NPY_T_F32, 2, s_shape, scales);
    commit_outputs();
    return 0;
}

/* The width of an operand: its codes file's second dimension (N of dy, K of x), or its first with transposed
 * codes (C, M). */
static int64_t operand_cols(const char *path, const routing_in *ri, int transposed)
{
    npy_array h;
    load(path, &h);
    if (h.h.ndim != 2 || h.h.shape[transposed ? 1 : 0] != ri->M)
        die("%s: expected FP8 codes of shape %s with M = %lld (the sum of %s), found %s %s", path,
            transposed ? "(C, M) (--codes-transposed)" : "(M, C)", (long long)ri->M, ri->m_path, shape_text(&h.h),
            npy_type_name(h.h.type));
    const int64_t cols = h.h.shape[transposed ? 0 : 1];
    release(&h);
    return cols;
}

static int run_gemm_fp8_dw(const args *a)
{
    static const char fn[] = "moe_gemm_fp8_dw";
    lib_call c = {fn, get_backend(a), 0, {{0}}};
    const char *x_path = need(a, "--x"), *xs_path = need(a, "--x-scales");
    const char *dy_path = need(a, "--dy"), *dys_path = need(a, "--dy-scales"), *out = need(a, "--out");
    claim_files(a, (const char *const[]){"--out", "--bound-out", NULL},
                (const char *const[]){"--x", "--x-scales", "--dy", "--dy-scales", "--m-sizes", "--gather", NULL});
    routing_in ri;
    load_routing(a, &ri);
    moe_fp8_options o;
    memset(&o, 0, sizeof o);
    o.out_dtype = f32_or_bf16(a, "--out-dtype");
    o.codes_transposed = get(a, "--codes-transposed") != NULL;
    const int t = o.codes_transposed;
    const moe_dtype dy_fp8 = fp8_format(a, "--fp8", MOE_E4M3), x_fp8 = fp8_format(a, "--x-fp8", dy_fp8);
    const int64_t N = operand_cols(dy_path, &ri, t), K = operand_cols(x_path, &ri, t);
    const int64_t scale_rows = moe_fp8_column_scale_rows(ri.M, ri.E);
    int format = -1;
    const int64_t x_shape[2] = {t ? K : ri.M, t ? ri.M : K}, xs_shape[2] = {scale_rows, K};
    const int64_t dy_shape[2] = {t ? N : ri.M, t ? ri.M : N}, dys_shape[2] = {scale_rows, N};
    const moe_fp8_tensor dyt = load_fp8_operand(dy_path, dys_path, dy_fp8, 2, dy_shape, dys_shape, &format);
    const moe_fp8_tensor xt = load_fp8_operand(x_path, xs_path, x_fp8, 2, x_shape, xs_shape, &format);
    o.scale_format = (moe_fp8_scale_format)format;
    const int64_t out_shape[3] = {ri.E, N, K};
    const size_t count = elements(ri.E, N, K), out_bytes = count * moe_dtype_size(o.out_dtype);
    void *dw = xmalloc(count, moe_dtype_size(o.out_dtype));
    const size_t scale_size = format == MOE_FP8_SCALE_UE8M0 ? 1 : 4;
    const moe_routing r = call_routing(&c, &ri.r);
    const moe_fp8_tensor x_on = {call_in(&c, "x", xt.data, elements(ri.M, K, 1)),
                                 call_in(&c, "x-scales", xt.scales, elements(scale_rows, K, scale_size)), xt.dtype};
    const moe_fp8_tensor dy_on = {call_in(&c, "dy", dyt.data, elements(ri.M, N, 1)),
                                  call_in(&c, "dy-scales", dyt.scales, elements(scale_rows, N, scale_size)),
                                  dyt.dtype};
    void *dw_on = call_out(&c, "dw", dw, out_bytes);
    call_end(&c, moe_gemm_fp8_dw(c.backend, &r, N, K, &x_on, &dy_on, dw_on, &o));
    write_result(a, out, o.out_dtype, dw, 3, out_shape);
    const char *bound_path = get(a, "--bound-out");
    if (bound_path != NULL) {
        double *value = xmalloc(count, sizeof(double)), *bound = xmalloc(count, sizeof(double));
        // on CUDA, transposed codes may run the Hopper kernel: the bound of its wgmma in-tile sums
        const int tile_bits = c.backend == MOE_BACKEND_CUDA && t ? ORACLE_FP8_TILE_HOPPER_BITS : ORACLE_FP8_TILE_F32;
        oracle_gemm_fp8_dw(&ri.r, N, K, &xt, &dyt, NULL, &o, tile_bits, value, bound);
        write_array(bound_path, NPY_T_F64, 3, out_shape, bound);
    }
    commit_outputs();
    return 0;
}
