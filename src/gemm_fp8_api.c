/* Public FP8 grouped GEMM entry points, fwd, dX and dW (include/moe_fp8.h): validate every argument (the shared
 * GEMM checks of gemm_prepare.h, then the FP8 operands, their scales' extents and, for a host backend, their
 * values), then call the backend's table. */
#include "fp8_ref.h"
#include "gemm_prepare.h"

#include <inttypes.h>

static const moe_fp8_options default_fp8_options; /* f32 output, float32 scales, no fusion, overwrite */

static int is_fp8(moe_dtype d) { return d == MOE_E4M3 || d == MOE_E5M2; }

/* One FP8 operand: non-NULL, an FP8 dtype. */
static moe_status check_operand(const char *op, const char *name, const moe_fp8_tensor *t)
{
    if (t == NULL)
        return moe_fail(MOE_ERR_NULL_POINTER, "%s: %s is NULL", op, name);
    if (!is_fp8(t->dtype))
        return moe_fail(MOE_ERR_INVALID_DTYPE, "%s: %s.dtype = %s (%d), expected MOE_E4M3 or MOE_E5M2", op, name,
                        moe_dtype_name(t->dtype), (int)t->dtype);
    return MOE_OK;
}

/* The element type that sizes a scale array: float32, or one byte for UE8M0 (an FP8 dtype stands for it). */
static moe_dtype scale_element(moe_fp8_scale_format format)
{
    return format == MOE_FP8_SCALE_UE8M0 ? MOE_E4M3 : MOE_F32;
}

/* The options every FP8 GEMM reads: the output dtype and the scale format. */
static moe_status check_options(const char *op, const moe_fp8_options *options)
{
    if (options->out_dtype != MOE_F32 && options->out_dtype != MOE_BF16)
        return moe_fail(MOE_ERR_INVALID_DTYPE, "%s: options.out_dtype = %s (%d), expected MOE_F32 or MOE_BF16", op,
                        moe_dtype_name(options->out_dtype), (int)options->out_dtype);
    if (options->scale_format != MOE_FP8_SCALE_F32 && options->scale_format != MOE_FP8_SCALE_UE8M0)
        return moe_fail(MOE_ERR_INVALID_OPTION, "%s: options.scale_format = %d, expected MOE_FP8_SCALE_F32 (0) or "
                        "MOE_FP8_SCALE_UE8M0 (1)", op, (int)options->scale_format);
    return MOE_OK;
}

/* Everything fwd and dX share.  a is x (fwd) or dy (dX), a_rows its rows, a_cols its reduction length. */
static moe_status fp8_call(const char *op, int is_dx, moe_backend backend, const moe_routing *routing, int64_t N,
                           int64_t K, const moe_fp8_tensor *a, const moe_fp8_tensor *w, const float *topk_weights,
                           void *out, const moe_fp8_options *options)
{
    moe_clear_error();
    const char *a_name = is_dx ? "dy" : "x";
    if (options == NULL)
        options = &default_fp8_options;
    moe_status status = check_options(op, options);
    if (status == MOE_OK)
        status = check_operand(op, a_name, a);
    if (status == MOE_OK)
        status = check_operand(op, "w", w);
    if (status != MOE_OK)
        return status;
    if (!is_dx && options->w_transposed)
        return moe_fail(MOE_ERR_INVALID_OPTION, "%s: options.w_transposed applies to moe_gemm_fp8_dx only (the "
                        "forward reads W [E][N][K] as it is)", op);
    if (options->codes_transposed)
        return moe_fail(MOE_ERR_INVALID_OPTION, "%s: options.codes_transposed applies to moe_gemm_fp8_dw only (this "
                        "call reads %s's codes [rows][cols] as they are)", op, a_name);
    const moe_gemm_options gemm_options = {
        .dtype = options->out_dtype,
        .permute_x = options->permute_x,
        .permute_y = options->permute_y,
        .reduce_topk = options->reduce_topk,
        .accumulate = options->accumulate,
        .stream = options->stream,
    };
    const moe_dispatch *table;
    moe_fp8_problem p;
    status = moe_gemm_prepare(op, is_dx, backend, routing, N, K, topk_weights, &gemm_options, &table, &p.g);
    if (status != MOE_OK)
        return status;
    p.scale_format = options->scale_format;
    p.w_transposed = options->w_transposed != 0;
    p.codes_transposed = 0;
    const moe_gemm_problem *g = &p.g;
    const int64_t E = g->num_experts, tiles_n = moe_fp8_tiles(N), tiles_k = moe_fp8_tiles(K);
    /* W [E][N][K], or its transpose [E][K][N] (dX with w_transposed), and the block scales alike */
    const int64_t w_rows = p.w_transposed ? K : N, w_cols = p.w_transposed ? N : K;
    const int64_t w_tile_rows = moe_fp8_tiles(w_rows), w_tile_cols = moe_fp8_tiles(w_cols);
    const int64_t a_rows = is_dx ? g->rows : (g->permute_x ? g->num_tokens : g->rows);
    const int64_t a_cols = is_dx ? N : K, a_tiles = is_dx ? tiles_n : tiles_k;
    const int64_t out_rows = !is_dx ? g->rows : (g->reduce_topk ? g->num_tokens : g->rows);
    const int64_t out_cols = is_dx ? K : N;
    const moe_dtype scale_type = scale_element(options->scale_format);
    const moe_array_arg args[] = {
        {is_dx ? "dy.data" : "x.data", a->data, a_rows, a_cols, a->dtype, 0, 0},
        {is_dx ? "dy.scales" : "x.scales", a->scales, a_rows, a_tiles, scale_type, 0, 0},
        {"w.data", w->data, E * w_rows, w_cols, w->dtype, 0, 0},
        {"w.scales", w->scales, E * w_tile_rows, w_tile_cols, scale_type, 0, 0},
        {"topk_weights", topk_weights, topk_weights ? g->rows : 0, 1, MOE_F32, 0, 0},
        {is_dx ? "dx" : "y", out, out_rows, out_cols, g->dtype, 1, 0},
    };
    if ((status = moe_gemm_check_tensors(op, g, args, 6)) != MOE_OK)
        return status;
    if (table->validates_routing_on_host) { /* host pointers: the scales' values too */
        status = moe_ref_fp8_check_scales(op, args[1].name, p.scale_format, a->scales, a_rows * a_tiles, a_tiles);
        if (status == MOE_OK)
            status = moe_ref_fp8_check_scales(op, "w.scales", p.scale_format, w->scales, E * tiles_n * tiles_k,
                                              w_tile_cols);
        if (status != MOE_OK)
            return status;
    }
    return is_dx ? table->gemm_fp8_dx(&p, a, w, topk_weights, out) : table->gemm_fp8_fwd(&p, a, w, topk_weights, out);
}

moe_status moe_gemm_fp8_fwd(moe_backend backend, const moe_routing *routing, int64_t N, int64_t K,
                            const moe_fp8_tensor *x, const moe_fp8_tensor *w, const float *topk_weights, void *y,
                            const moe_fp8_options *options)
{
    return fp8_call("moe_gemm_fp8_fwd", 0, backend, routing, N, K, x, w, topk_weights, y, options);
}

moe_status moe_gemm_fp8_dx(moe_backend backend, const moe_routing *routing, int64_t N, int64_t K,
                           const moe_fp8_tensor *dy, const moe_fp8_tensor *w, const float *topk_weights, void *dx,
                           const moe_fp8_options *options)
{
    return fp8_call("moe_gemm_fp8_dx", 1, backend, routing, N, K, dy, w, topk_weights, dx, options);
}

moe_status moe_gemm_fp8_dw(moe_backend backend, const moe_routing *routing, int64_t N, int64_t K,
                           const moe_fp8_tensor *x, const moe_fp8_tensor *dy, void *dw,
                           const moe_fp8_options *options)
{
    static const char op[] = "moe_gemm_fp8_dw";
    moe_clear_error();
    if (options == NULL)
        options = &default_fp8_options;
    moe_status status = check_options(op, options);
    if (status != MOE_OK)
        return status;
    const char *gathering = options->permute_x ? "permute_x" : options->permute_y ? "permute_y"
                            : options->reduce_topk ? "reduce_topk" : NULL;
    if (gathering != NULL)
        return moe_fail(MOE_ERR_INVALID_OPTION, "%s: options.%s does not apply: dW's operands are in expert-row "
                        "order (moe_quantize_fp8_columns gathers their rows)", op, gathering);
    if (options->w_transposed)
        return moe_fail(MOE_ERR_INVALID_OPTION, "%s: options.w_transposed applies to moe_gemm_fp8_dx only (dW "
                        "writes W [E][N][K])", op);
    if ((status = check_operand(op, "x", x)) != MOE_OK || (status = check_operand(op, "dy", dy)) != MOE_OK)
        return status;
    const moe_gemm_options gemm_options = {
        .dtype = options->out_dtype,
        .accumulate = options->accumulate,
        .stream = options->stream,
    };
    const moe_dispatch *table;
    moe_fp8_problem p;
    if ((status = moe_gemm_prepare(op, 0, backend, routing, N, K, NULL, &gemm_options, &table, &p.g)) != MOE_OK)
        return status;
    p.scale_format = options->scale_format;
    p.w_transposed = 0;
    p.codes_transposed = options->codes_transposed != 0;
    const moe_gemm_problem *g = &p.g;
    const int64_t M = g->rows, E = g->num_experts, scale_rows = moe_fp8_column_scale_rows(M, E);
    const moe_dtype scale_type = scale_element(options->scale_format);
    const int t = p.codes_transposed; /* the codes [K][M] and [N][M] */
    const moe_array_arg args[] = {
        {"x.data", x->data, t ? K : M, t ? M : K, x->dtype, 0, 0},
        {"x.scales", x->scales, scale_rows, K, scale_type, 0, 0},
        {"dy.data", dy->data, t ? N : M, t ? M : N, dy->dtype, 0, 0},
        {"dy.scales", dy->scales, scale_rows, N, scale_type, 0, 0},
        {"dw", dw, E * N, K, g->dtype, 1, 0},
    };
    if ((status = moe_gemm_check_tensors(op, g, args, 5)) != MOE_OK)
        return status;
    if (table->validates_routing_on_host) { /* host pointers: the scales of the tiles in use */
        status = moe_ref_fp8_check_column_scales(op, "dy.scales", p.scale_format, dy->scales, E, g->m_sizes, N);
        if (status == MOE_OK)
            status = moe_ref_fp8_check_column_scales(op, "x.scales", p.scale_format, x->scales, E, g->m_sizes, K);
        if (status != MOE_OK)
            return status;
    }
    return table->gemm_fp8_dw(&p, x, dy, dw);
}
