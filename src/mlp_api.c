/* Public blockwise MoE MLP entry points: validate every argument, then run the backend table's row
 * (moe_dispatch: the reference on host pointers, or the CUDA kernels on device pointers, where the layout's
 * contents are checked on the device and errors reported by moe_backend_synchronize). */
#include "mlp_ref.h"
#include "moe_activations.h"

#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static const moe_mlp_options default_options; /* all zero: f32, B = 128, SiLU, ON_H, skip padding */

/* ---- activations: the rows of backend/moe_activations.h ---- */

#define ACTIVATION_ROW(value, name, forward, derivative) {#value, name},
static const struct { const char *enum_name, *name; } activations[MOE_MLP_ACTIVATION_COUNT] = {
    MOE_MLP_ACTIVATIONS(ACTIVATION_ROW)
};
#undef ACTIVATION_ROW

/* "A, B, C or D" of the enum names (names = 0) or of the spellings (names = 1), for messages: its length (without
 * the NUL), written with the NUL into text [size] name by name as far as it fits (text may be NULL with size 0). */
static size_t join_activations(int names, char *text, size_t size)
{
    size_t used = 0;
    for (int a = 0; a < MOE_MLP_ACTIVATION_COUNT; a++) {
        const char *sep = a == 0 ? "" : a + 1 < MOE_MLP_ACTIVATION_COUNT ? ", " : " or ";
        const char *name = names ? activations[a].name : activations[a].enum_name;
        const size_t n = strlen(sep) + strlen(name);
        if (used + n < size)
            snprintf(text + used, size - used, "%s%s", sep, name);
        used += n;
    }
    return used;
}

/* A message's copy of the list (room for the enum names' list, the longer, of many more activations). */
enum { CHOICES_SIZE = 256 };

static const char *activation_choices(int names, char *text)
{
    text[0] = '\0';
    join_activations(names, text, CHOICES_SIZE);
    return text;
}

moe_status moe_mlp_activation_choices(char *text, size_t size)
{
    static const char op[] = "moe_mlp_activation_choices";
    moe_clear_error();
    if (text == NULL)
        return moe_fail(MOE_ERR_NULL_POINTER, "%s: text is NULL", op);
    const size_t need = join_activations(1, NULL, 0);
    if (need >= size)
        return moe_fail(MOE_ERR_INVALID_SHAPE, "%s: size = %zu, expected at least %zu (the names and the NUL)", op,
                        size, need + 1);
    join_activations(1, text, size);
    return MOE_OK;
}

const char *moe_mlp_activation_name(moe_mlp_activation activation)
{
    return (unsigned)activation < (unsigned)MOE_MLP_ACTIVATION_COUNT ? activations[activation].name : NULL;
}

moe_status moe_mlp_activation_from_name(const char *name, moe_mlp_activation *activation)
{
    static const char op[] = "moe_mlp_activation_from_name";
    moe_clear_error();
    if (activation == NULL)
        return moe_fail(MOE_ERR_NULL_POINTER, "%s: activation is NULL", op);
    if (name != NULL)
        for (int a = 0; a < MOE_MLP_ACTIVATION_COUNT; a++)
            if (strcmp(name, activations[a].name) == 0) {
                *activation = (moe_mlp_activation)a;
                return MOE_OK;
            }
    char choices[CHOICES_SIZE];
    return moe_fail(MOE_ERR_INVALID_OPTION, "%s: %s%s%s is not an activation, expected %s", op, name ? "\"" : "",
                    name ? name : "NULL", name ? "\"" : "", activation_choices(1, choices));
}

static const char *clamp_name(int which)
{
    static const char *const names[4] = {"linear_clamp_lower_limit", "linear_clamp_upper_limit",
                                         "non_linear_clamp_lower_limit", "non_linear_clamp_upper_limit"};
    return names[which];
}

/* Options every MLP entry point shares.  *B gets the resolved block size. */
static moe_status check_options(const char *op, const moe_mlp_options *o, int64_t *B)
{
    if (o->dtype == MOE_E4M3 || o->dtype == MOE_E5M2)
        return moe_fail(MOE_ERR_INVALID_DTYPE, "%s: options.dtype = %s: the MLP takes no FP8 tensors (they need "
                        "scales; only moe_gemm_fp8_fwd / moe_gemm_fp8_dx take them)", op, moe_dtype_name(o->dtype));
    if (o->dtype != MOE_F32 && o->dtype != MOE_F16 && o->dtype != MOE_BF16)
        return moe_fail(MOE_ERR_INVALID_DTYPE, "%s: options.dtype = %d, expected MOE_F32, MOE_F16 or MOE_BF16",
                        op, (int)o->dtype);
    if (o->block_size < 0)
        return moe_fail(MOE_ERR_INVALID_OPTION, "%s: options.block_size = %" PRId64
                        ", expected >= 1 (or 0 for the default %d)", op, o->block_size,
                        MOE_MLP_DEFAULT_BLOCK_SIZE);
    *B = o->block_size == 0 ? MOE_MLP_DEFAULT_BLOCK_SIZE : o->block_size;
    if ((unsigned)o->activation >= (unsigned)MOE_MLP_ACTIVATION_COUNT) {
        char choices[CHOICES_SIZE];
        return moe_fail(MOE_ERR_INVALID_OPTION, "%s: options.activation = %d, expected %s", op, (int)o->activation,
                        activation_choices(0, choices));
    }
    if ((unsigned)o->affinity > (unsigned)MOE_AFFINITY_ON_I)
        return moe_fail(MOE_ERR_INVALID_OPTION, "%s: options.affinity = %d, expected MOE_AFFINITY_ON_H or "
                        "MOE_AFFINITY_ON_I", op, (int)o->affinity);
    if ((unsigned)o->padding > (unsigned)MOE_MLP_PAD_ROW)
        return moe_fail(MOE_ERR_INVALID_OPTION, "%s: options.padding = %d, expected MOE_MLP_PAD_SKIP or "
                        "MOE_MLP_PAD_ROW", op, (int)o->padding);
    const int has[4] = {o->has_linear_clamp_lower_limit, o->has_linear_clamp_upper_limit,
                        o->has_non_linear_clamp_lower_limit, o->has_non_linear_clamp_upper_limit};
    const float limit[4] = {o->linear_clamp_lower_limit, o->linear_clamp_upper_limit,
                            o->non_linear_clamp_lower_limit, o->non_linear_clamp_upper_limit};
    for (int c = 0; c < 4; c++)
        if (has[c] && !isfinite(limit[c]))
            return moe_fail(MOE_ERR_INVALID_OPTION, "%s: options.%s = %g, expected a finite value", op,
                            clamp_name(c), (double)limit[c]);
    for (int c = 0; c < 4; c += 2)
        if (has[c] && has[c + 1] && !(limit[c] <= limit[c + 1]))
            return moe_fail(MOE_ERR_INVALID_OPTION, "%s: options.%s = %g > options.%s = %g, expected lower <= upper",
                            op, clamp_name(c), (double)limit[c], clamp_name(c + 1), (double)limit[c + 1]);
    return MOE_OK;
}

/* The layout's index arrays aligned to their int64 elements, checked before anything reads them (a NULL
 * layout or array is left to moe_ref_mlp_check_layout*, which names it). */
static moe_status check_layout_alignment(const char *op, const moe_mlp_layout *layout)
{
    if (layout == NULL)
        return MOE_OK;
    moe_status status = moe_check_aligned(op, "layout.block_to_expert", layout->block_to_expert, 8, "int64");
    if (status != MOE_OK)
        return status;
    return moe_check_aligned(op, "layout.token_position_to_id", layout->token_position_to_id, 8, "int64");
}

/* Backend, options, layout and dimensions; fills the problem and *table (the backend's table). */
static moe_status prepare(const char *op, moe_backend backend, const moe_mlp_layout *layout, int64_t H,
                          int64_t I, const moe_mlp_options **opt, moe_mlp_problem *p, const moe_dispatch **table)
{
    moe_clear_error();
    if (*opt == NULL)
        *opt = &default_options;
    const moe_mlp_options *o = *opt;
    if (backend != MOE_BACKEND_REF && backend != MOE_BACKEND_CUDA)
        return moe_fail(MOE_ERR_NO_BACKEND, "%s: backend %d is not a libmoe backend", op, (int)backend);
    *table = moe_dispatch_for(backend);
    if (*table == NULL)
        return moe_fail(MOE_ERR_NO_BACKEND, "%s: backend %s was not built into this libmoe", op,
                        moe_backend_name(backend));
    if (!(*table)->available())
        return moe_fail(MOE_ERR_NO_BACKEND, "%s: backend %s is built in but cannot run here (no device?)", op,
                        moe_backend_name(backend));
    int64_t B = 0;
    moe_status status = check_options(op, o, &B);
    if (status != MOE_OK)
        return status;
    if (H < 0 || I < 0)
        return moe_fail(MOE_ERR_INVALID_SHAPE, "%s: hidden_size = %" PRId64 ", intermediate_size = %" PRId64
                        ", expected both >= 0", op, H, I);
    status = check_layout_alignment(op, layout);
    if (status != MOE_OK)
        return status;
    /* a device layout's contents are checked on the device (gpu/mlp/layout_check.cu) */
    status = (*table)->validates_routing_on_host
                 ? moe_ref_mlp_check_layout(op, layout, B, o->padding, o->tensor_update_overwrite != 0)
                 : moe_ref_mlp_check_layout_shape(op, layout, B);
    if (status != MOE_OK)
        return status;
    const int64_t T = layout->num_tokens, E = layout->num_experts, N = layout->num_blocks;
    int64_t I2 = 0, EH = 0, EI2 = 0, EHI2 = 0, NB = 0, NBH = 0, NBI2 = 0;
    /* each bound its own message, so that a size bound is not blamed on the products; SIZE_MAX / 64 bounds a
     * row of H or 2I elements in the reference's scratch, in bytes */
    if (!moe_mul_ok(I, 2, &I2) || (uint64_t)I2 > SIZE_MAX / 64 || (uint64_t)H > SIZE_MAX / 64)
        return moe_fail(MOE_ERR_OVERFLOW, "%s: hidden_size = %" PRId64 " or 2 * intermediate_size = 2 * %" PRId64
                        " exceeds SIZE_MAX / 64", op, H, I);
    if (!moe_mul_ok(E, H, &EH) || !moe_mul_ok(E, I2, &EI2) || !moe_mul_ok(EH, I2, &EHI2))
        return moe_fail(MOE_ERR_OVERFLOW, "%s: E*H*2I = %" PRId64 "*%" PRId64 "*2*%" PRId64 " overflows 64 bits", op,
                        E, H, I);
    if (!moe_mul_ok(N, B, &NB) || !moe_mul_ok(NB, H, &NBH) || !moe_mul_ok(NB, I2, &NBI2))
        return moe_fail(MOE_ERR_OVERFLOW, "%s: N*B*max(H, 2I) with N = %" PRId64 ", B = %" PRId64 ", H = %" PRId64
                        ", I = %" PRId64 " overflows 64 bits", op, N, B, H, I);

    p->op = op;
    p->T = T;
    p->E = E;
    p->N = N;
    p->B = B;
    p->H = H;
    p->I = I;
    p->token_rows = o->padding == MOE_MLP_PAD_ROW ? T + 1 : T;
    p->block_to_expert = layout->block_to_expert;
    p->token_position_to_id = layout->token_position_to_id;
    p->dtype = o->dtype;
    p->grad_dtype = o->grad_fp32 ? MOE_F32 : o->dtype;
    p->activation = o->activation;
    p->affinity = o->affinity;
    p->bias = o->bias != 0;
    p->accumulate = o->accumulate != 0;
    p->has_lin_lo = o->has_linear_clamp_lower_limit != 0;
    p->has_lin_hi = o->has_linear_clamp_upper_limit != 0;
    p->has_nl_lo = o->has_non_linear_clamp_lower_limit != 0;
    p->has_nl_hi = o->has_non_linear_clamp_upper_limit != 0;
    p->lin_lo = o->linear_clamp_lower_limit;
    p->lin_hi = o->linear_clamp_upper_limit;
    p->nl_lo = o->non_linear_clamp_lower_limit;
    p->nl_hi = o->non_linear_clamp_upper_limit;
    p->overwrite = o->tensor_update_overwrite != 0;
    p->round_intermediates = o->float32_intermediates == 0 && o->dtype != MOE_F32;
    p->padding = o->padding;
    p->stream = o->stream;
    return MOE_OK;
}

/* Checks the op's tensors (moe_check_arrays), with the layout's two index arrays as inputs: no output may
 * overlap them either, since the kernels read the layout throughout. */
static moe_status check_with_layout(const char *op, const moe_mlp_problem *p, const moe_mlp_layout *layout,
                                    const moe_array_arg *args, int count)
{
    enum { MAX_ARGS = 16 };
    moe_array_arg all[MAX_ARGS + 2];
    if (count > MAX_ARGS)
        return moe_fail(MOE_ERR_INVALID_SHAPE, "%s: internal error: %d array arguments, at most %d", op, count,
                        MAX_ARGS);
    for (int i = 0; i < count; i++)
        all[i] = args[i];
    all[count] = (moe_array_arg){"layout.block_to_expert", layout->block_to_expert, p->N, 1, p->dtype, 0, 1};
    all[count + 1] = (moe_array_arg){"layout.token_position_to_id", layout->token_position_to_id, p->N * p->B, 1,
                                     p->dtype, 0, 1};
    return moe_check_arrays(op, all, count + 2);
}

moe_status moe_mlp_fwd(moe_backend backend, const moe_mlp_layout *layout, int64_t hidden_size,
                       int64_t intermediate_size, const void *hidden, const void *affinities,
                       const void *w_gu, const void *w_d, const void *b_gu, const void *b_d, void *out,
                       void *gate_up_ckpt_T, void *down_ckpt, const moe_mlp_options *options)
{
    static const char op[] = "moe_mlp_fwd";
    moe_mlp_problem p;
    const moe_dispatch *table = NULL;
    moe_status status = prepare(op, backend, layout, hidden_size, intermediate_size, &options, &p, &table);
    if (status != MOE_OK)
        return status;
    if (options->accumulate)
        return moe_fail(MOE_ERR_INVALID_OPTION, "%s: options.accumulate applies to moe_mlp_bwd only", op);
    if (options->grad_fp32)
        return moe_fail(MOE_ERR_INVALID_OPTION, "%s: options.grad_fp32 applies to moe_mlp_bwd only", op);
    if (!p.bias && (b_gu != NULL || b_d != NULL))
        return moe_fail(MOE_ERR_INVALID_OPTION, "%s: %s is given but options.bias is 0 (expected NULL)", op,
                        b_gu != NULL ? "b_gu" : "b_d");
    const int64_t H = p.H, I = p.I, E = p.E, NB = p.N * p.B;
    const moe_array_arg args[] = {
        {"hidden", hidden, p.token_rows, H, p.dtype, 0, 0},
        {"affinities", affinities, p.T, E, p.dtype, 0, 0},
        {"w_gu", w_gu, E * H, 2 * I, p.dtype, 0, 0},
        {"w_d", w_d, E * I, H, p.dtype, 0, 0},
        {"b_gu", b_gu, p.bias ? E : 0, 2 * I, p.dtype, 0, 0},
        {"b_d", b_d, p.bias ? E : 0, H, p.dtype, 0, 0},
        {"out", out, p.token_rows, H, p.dtype, 1, 0},
        {"gate_up_ckpt_T", gate_up_ckpt_T, gate_up_ckpt_T ? p.N * 2 * I : 0, p.B, p.dtype, 1, 0},
        {"down_ckpt", down_ckpt, down_ckpt ? NB : 0, H, p.dtype, 1, 0},
    };
    status = check_with_layout(op, &p, layout, args, (int)(sizeof args / sizeof args[0]));
    if (status != MOE_OK)
        return status;
    return table->mlp_fwd(&p, hidden, affinities, w_gu, w_d, b_gu, b_d, out, gate_up_ckpt_T, down_ckpt);
}

moe_status moe_mlp_bwd(moe_backend backend, const moe_mlp_layout *layout, int64_t hidden_size,
                       int64_t intermediate_size, const void *hidden, const void *affinities,
                       const void *w_gu, const void *w_d, const void *b_d, const void *gate_up_ckpt_T,
                       const void *down_ckpt, const void *out_grad, void *d_hidden, void *d_affinities,
                       void *d_w_gu, void *d_w_d, void *d_b_gu, void *d_b_d, const moe_mlp_options *options)
{
    static const char op[] = "moe_mlp_bwd";
    moe_mlp_problem p;
    const moe_dispatch *table = NULL;
    moe_status status = prepare(op, backend, layout, hidden_size, intermediate_size, &options, &p, &table);
    if (status != MOE_OK)
        return status;
    const int64_t H = p.H, I = p.I, E = p.E, NB = p.N * p.B;
    const int on_i = p.affinity == MOE_AFFINITY_ON_I;
    if (!on_i && down_ckpt == NULL && NB * H > 0)
        return moe_fail(MOE_ERR_NULL_POINTER, "%s: down_ckpt is NULL, expected the forward's down checkpoint "
                        "(only MOE_AFFINITY_ON_I can do without it)", op);
    if (!p.bias && (d_b_gu != NULL || d_b_d != NULL))
        return moe_fail(MOE_ERR_INVALID_OPTION, "%s: %s is given but options.bias is 0 (expected NULL)", op,
                        d_b_gu != NULL ? "d_b_gu" : "d_b_d");
    const int need_b_d = p.bias && on_i && down_ckpt == NULL;
    const moe_array_arg args[] = {
        {"hidden", hidden, p.token_rows, H, p.dtype, 0, 0},
        {"affinities", affinities, p.T, E, p.dtype, 0, 0},
        {"w_gu", w_gu, E * H, 2 * I, p.dtype, 0, 0},
        {"w_d", w_d, E * I, H, p.dtype, 0, 0},
        {"b_d", need_b_d ? b_d : NULL, need_b_d ? E : 0, H, p.dtype, 0, 0},
        {"gate_up_ckpt_T", gate_up_ckpt_T, p.N * 2 * I, p.B, p.dtype, 0, 0},
        {"down_ckpt", down_ckpt, down_ckpt ? NB : 0, H, p.dtype, 0, 0},
        {"out_grad", out_grad, p.token_rows, H, p.dtype, 0, 0},
        {"d_hidden", d_hidden, p.token_rows, H, p.dtype, 1, 0},
        {"d_affinities", d_affinities, p.T, E, p.dtype, 1, 0},
        {"d_w_gu", d_w_gu, E * H, 2 * I, p.grad_dtype, 1, 0},
        {"d_w_d", d_w_d, E * I, H, p.grad_dtype, 1, 0},
        {"d_b_gu", d_b_gu, p.bias ? E : 0, 2 * I, p.grad_dtype, 1, 0},
        {"d_b_d", d_b_d, p.bias ? E : 0, H, p.grad_dtype, 1, 0},
    };
    status = check_with_layout(op, &p, layout, args, (int)(sizeof args / sizeof args[0]));
    if (status != MOE_OK)
        return status;
    return table->mlp_bwd(&p, hidden, affinities, w_gu, w_d, b_d, gate_up_ckpt_T, down_ckpt, out_grad, d_hidden,
                          d_affinities, d_w_gu, d_w_d, d_b_gu, d_b_d);
}

/* ---- layouts ---- */

moe_status moe_mlp_layout_validate(const moe_mlp_layout *layout, const moe_mlp_options *options)
{
    static const char op[] = "moe_mlp_layout_validate";
    moe_clear_error();
    if (options == NULL)
        options = &default_options;
    int64_t B = 0;
    moe_status status = check_options(op, options, &B);
    if (status != MOE_OK)
        return status;
    status = check_layout_alignment(op, layout);
    if (status != MOE_OK)
        return status;
    return moe_ref_mlp_check_layout(op, layout, B, options->padding, options->tensor_update_overwrite != 0);
}

static moe_status check_kind(const char *op, moe_mlp_layout_kind kind)
{
    if (kind != MOE_MLP_DROPLESS && kind != MOE_MLP_DROPPING)
        return moe_fail(MOE_ERR_INVALID_OPTION, "%s: kind = %d, expected MOE_MLP_DROPLESS or MOE_MLP_DROPPING",
                        op, (int)kind);
    return MOE_OK;
}

/* What moe_mlp_layout_num_blocks and moe_mlp_layout_build check first: the options (options not NULL;
 * *B gets the resolved block size), the kind, and the routing topk_ids [num_tokens * topk] (shape and
 * expert ids in [0, num_experts), distinct per token). */
static moe_status check_routing(const char *op, moe_mlp_layout_kind kind, int64_t num_tokens, int64_t topk,
                                int64_t num_experts, const int64_t *topk_ids, const moe_mlp_options *options,
                                int64_t *B)
{
    moe_status status = check_options(op, options, B);
    if (status == MOE_OK)
        status = check_kind(op, kind);
    if (status == MOE_OK) /* before the ids are read */
        status = moe_check_aligned(op, "topk_ids", topk_ids, 8, "int64");
    if (status == MOE_OK)
        status = moe_ref_mlp_check_topk(op, num_tokens, topk, num_experts, topk_ids);
    return status;
}

/* The int64 output of moe_mlp_layout_num_blocks and moe_mlp_layout_max_blocks: not NULL, 8-byte aligned
 * (checked before it is written). */
static moe_status check_num_blocks_output(const char *op, const int64_t *num_blocks)
{
    if (num_blocks == NULL)
        return moe_fail(MOE_ERR_NULL_POINTER, "%s: num_blocks is NULL", op);
    return moe_check_aligned(op, "num_blocks", num_blocks, 8, "int64");
}

moe_status moe_mlp_layout_num_blocks(moe_mlp_layout_kind kind, int64_t num_tokens, int64_t topk,
                                     int64_t num_experts, const int64_t *topk_ids,
                                     const moe_mlp_options *options, int64_t *num_blocks)
{
    static const char op[] = "moe_mlp_layout_num_blocks";
    moe_clear_error();
    if (options == NULL)
        options = &default_options;
    int64_t B = 0;
    moe_status status = check_routing(op, kind, num_tokens, topk, num_experts, topk_ids, options, &B);
    if (status != MOE_OK)
        return status;
    status = check_num_blocks_output(op, num_blocks);
    if (status != MOE_OK)
        return status;
    int64_t N = moe_ref_mlp_count_blocks(kind, num_tokens, topk, num_experts, B, topk_ids);
    if (N < 0)
        return moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: no memory for %" PRId64 " experts", op, num_experts);
    *num_blocks = N;
    return MOE_OK;
}

/* The layout builders' affinities: topk_weights ([num_tokens * topk], options.dtype) and affinities
 * ([num_tokens * num_experts], options.dtype) are given together or not at all. */
static moe_status check_weights_pairing(const char *op, const void *topk_weights, const void *affinities)
{
    if ((topk_weights == NULL) != (affinities == NULL))
        return moe_fail(MOE_ERR_NULL_POINTER, "%s: %s is NULL but %s is not, expected both or neither", op,
                        topk_weights == NULL ? "topk_weights" : "affinities",
                        topk_weights == NULL ? "affinities" : "topk_weights");
    return MOE_OK;
}

/* The arrays of a layout builder (moe_mlp_layout_build, moe_mlp_layout_build_on), after its options, kind,
 * routing shape and num_blocks are checked.  *NB gets num_blocks * B.
 *   T, k, E              num_tokens, topk, num_experts (T * k and T * E known to fit in int64)
 *   B                    the resolved block size
 *   max_positions        the largest num_blocks * B the builder takes (SIZE_MAX / its bytes per position)
 *   dtype                options.dtype, the element type of topk_weights and affinities
 *   topk_ids             [T * k] int64 input
 *   topk_weights         [T * k] input or NULL
 *   num_blocks           N, the blocks the layout holds
 *   block_to_expert      [N] int64 output
 *   token_position_to_id [N * B] int64 output
 *   affinities           [T * E] output or NULL
 *   num_dropped          [1] int64 output or NULL
 *   num_blocks_used      [1] int64 output or NULL (moe_mlp_layout_build has none: NULL) */
static moe_status check_layout_arrays(const char *op, int64_t T, int64_t k, int64_t E, int64_t B,
                                      uint64_t max_positions, moe_dtype dtype, const int64_t *topk_ids,
                                      const void *topk_weights, int64_t num_blocks, const int64_t *block_to_expert,
                                      const int64_t *token_position_to_id, const void *affinities,
                                      const int64_t *num_dropped, const int64_t *num_blocks_used, int64_t *NB)
{
    if (!moe_mul_ok(num_blocks, B, NB))
        return moe_fail(MOE_ERR_OVERFLOW, "%s: num_blocks * B = %" PRId64 " * %" PRId64 " overflows 64 bits", op,
                        num_blocks, B);
    if ((uint64_t)*NB > max_positions)
        return moe_fail(MOE_ERR_OVERFLOW, "%s: num_blocks * B = %" PRId64 " positions, more than the %" PRIu64
                        " whose arrays this builder can address", op, *NB, max_positions);
    const int64_t M = T * k, TE = T * E;
    const moe_array_arg args[] = {
        {"topk_ids", topk_ids, M, 1, MOE_F32, 0, 1},
        {"topk_weights", topk_weights, topk_weights ? M : 0, 1, dtype, 0, 0},
        {"block_to_expert", block_to_expert, num_blocks, 1, MOE_F32, 1, 1},
        {"token_position_to_id", token_position_to_id, *NB, 1, MOE_F32, 1, 1},
        {"affinities", affinities, affinities ? TE : 0, 1, dtype, 1, 0},
        {"num_dropped", num_dropped, num_dropped ? 1 : 0, 1, MOE_F32, 1, 1},
        {"num_blocks_used", num_blocks_used, num_blocks_used ? 1 : 0, 1, MOE_F32, 1, 1},
    };
    return moe_check_arrays(op, args, (int)(sizeof args / sizeof args[0]));
}

moe_status moe_mlp_layout_build(moe_mlp_layout_kind kind, int64_t num_tokens, int64_t topk,
                                int64_t num_experts, const int64_t *topk_ids, const void *topk_weights,
                                int64_t num_blocks, int64_t *block_to_expert, int64_t *token_position_to_id,
                                void *affinities, int64_t *num_dropped, const moe_mlp_options *options)
{
    static const char op[] = "moe_mlp_layout_build";
    moe_clear_error();
    if (options == NULL)
        options = &default_options;
    int64_t B = 0;
    moe_status status = check_routing(op, kind, num_tokens, topk, num_experts, topk_ids, options, &B);
    if (status != MOE_OK)
        return status;
    status = check_weights_pairing(op, topk_weights, affinities);
    if (status != MOE_OK)
        return status;
    const int64_t N = moe_ref_mlp_count_blocks(kind, num_tokens, topk, num_experts, B, topk_ids);
    if (N < 0)
        return moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: no memory for %" PRId64 " experts", op, num_experts);
    if (num_blocks != N)
        return moe_fail(MOE_ERR_INVALID_SHAPE, "%s: num_blocks = %" PRId64 ", expected %" PRId64
                        " (moe_mlp_layout_num_blocks) for this routing and block size %" PRId64, op, num_blocks,
                        N, B);
    int64_t NB = 0;
    status = check_layout_arrays(op, num_tokens, topk, num_experts, B, SIZE_MAX / 8, options->dtype, topk_ids,
                                 topk_weights, N, block_to_expert, token_position_to_id, affinities, num_dropped,
                                 NULL, &NB);
    if (status != MOE_OK)
        return status;
    return moe_ref_mlp_build_layout(op, kind, num_tokens, topk, num_experts, B, options->padding,
                                    options->dtype, topk_ids, topk_weights, N, block_to_expert,
                                    token_position_to_id, affinities, num_dropped);
}

/* The capacity bound of moe_mlp_layout_max_blocks after the options (B resolved) and kind are checked. */
static moe_status max_blocks_for(const char *op, moe_mlp_layout_kind kind, int64_t T, int64_t k, int64_t E,
                                 int64_t B, int64_t *num_blocks)
{
    const moe_status status = moe_ref_mlp_check_topk_shape(op, T, k, E);
    if (status != MOE_OK)
        return status;
    const int64_t M = T * k; /* checked */
    if (kind == MOE_MLP_DROPPING) {
        *num_blocks = E;
    } else if (B == 1 || E > (INT64_MAX - M) / (B - 1)) {
        *num_blocks = M; /* every block holds at least one pair */
    } else {
        const int64_t bound = (M + E * (B - 1)) / B;
        *num_blocks = bound < M ? bound : M;
    }
    return MOE_OK;
}

/* Options, kind and shapes of the capacity entry points; *B the resolved block size, *capacity the bound. */
static moe_status layout_capacity(const char *op, moe_mlp_layout_kind kind, int64_t T, int64_t k, int64_t E,
                                  const moe_mlp_options *options, int64_t *B, int64_t *capacity)
{
    moe_status status = check_options(op, options, B);
    if (status == MOE_OK)
        status = check_kind(op, kind);
    if (status == MOE_OK)
        status = max_blocks_for(op, kind, T, k, E, *B, capacity);
    return status;
}

moe_status moe_mlp_layout_max_blocks(moe_mlp_layout_kind kind, int64_t num_tokens, int64_t topk,
                                     int64_t num_experts, const moe_mlp_options *options, int64_t *num_blocks)
{
    static const char op[] = "moe_mlp_layout_max_blocks";
    moe_clear_error();
    const moe_status status = check_num_blocks_output(op, num_blocks);
    if (status != MOE_OK)
        return status;
    int64_t B = 0;
    return layout_capacity(op, kind, num_tokens, topk, num_experts, options ? options : &default_options, &B,
                           num_blocks);
}

moe_status moe_mlp_layout_build_on(moe_backend backend, moe_mlp_layout_kind kind, int64_t num_tokens, int64_t topk,
                                   int64_t num_experts, const int64_t *topk_ids, const void *topk_weights,
                                   int64_t num_blocks, int64_t *block_to_expert, int64_t *token_position_to_id,
                                   void *affinities, int64_t *num_dropped, int64_t *num_blocks_used,
                                   const moe_mlp_options *options)
{
    static const char op[] = "moe_mlp_layout_build_on";
    moe_clear_error();
    if (options == NULL)
        options = &default_options;
    int64_t B = 0, capacity = 0;
    moe_status status = layout_capacity(op, kind, num_tokens, topk, num_experts, options, &B, &capacity);
    if (status != MOE_OK)
        return status;
    const moe_dispatch *table = moe_dispatch_for(backend);
    if (table == NULL || !table->available())
        return moe_fail(MOE_ERR_NO_BACKEND, "%s: backend %d (%s) is not available here", op, (int)backend,
                        moe_backend_name(backend));
    if (num_blocks < capacity)
        return moe_fail(MOE_ERR_INVALID_SHAPE, "%s: num_blocks = %" PRId64 ", expected at least %" PRId64
                        " (moe_mlp_layout_max_blocks) so that every routing fits", op, num_blocks, capacity);
    status = check_weights_pairing(op, topk_weights, affinities);
    if (status != MOE_OK)
        return status;
    int64_t NB = 0;
    status = check_layout_arrays(op, num_tokens, topk, num_experts, B, SIZE_MAX / 16, options->dtype, topk_ids,
                                 topk_weights, num_blocks, block_to_expert, token_position_to_id, affinities,
                                 num_dropped, num_blocks_used, &NB);
    if (status != MOE_OK)
        return status;
    const moe_layout_problem p = {op, kind, num_tokens, topk, num_experts, B, num_blocks, options->padding,
                                  options->padding == MOE_MLP_PAD_ROW ? num_tokens : -1, options->dtype,
                                  options->stream};
    return table->mlp_layout_build(&p, topk_ids, topk_weights, block_to_expert, token_position_to_id, affinities,
                                   num_dropped, num_blocks_used);
}
