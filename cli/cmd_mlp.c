/*
 * cli/cmd_mlp.c: the blockwise MoE MLP commands mlp-fwd and mlp-bwd: their options and help, and the
 * folder of NKI-named files they read, check against each other and write.
 */
#include "cli.h"
#include "layouts.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OPT_MLP                                                                                        \
    {"--block-size", "B",                                                                              \
     "positions per block B >= 1. Default: token_position_to_id's length / the number of blocks (its "  \
     "second dimension when it is (N, B)); 128 when there are no blocks. When given, the files must "   \
     "agree with it."},                                                                                \
    {"--activation", "silu|gelu|gelu_tanh|swish",                                                      \
     "the gate's activation (NKI ActFnType): silu x*sigmoid(x) (default); gelu 0.5x(1 + erf(x/sqrt2)); " \
     "gelu_tanh the tanh approximation; swish x*sigmoid(1.702x) (the gpt-oss gate)."},               \
    {"--affinity-on", "h|i",                                                                           \
     "where the routing affinity a is applied: h (default, NKI's) out += a*d; i m = act(g)*u*a, out += " \
     "m . W_d + a*b_d (same function, other rounding)."},                                              \
    {"--bias", NULL,                                                                                   \
     "use the biases gate_up_proj_bias.npy (E, 2, I) and down_proj_bias.npy (E, H). Without it the "    \
     "bias files are not read, even when present."},                                                   \
    {"--clamp", "NL_LO,NL_HI,LIN_LO,LIN_HI",                                                           \
     "clamp limits (NKI ClampLimits): exactly four comma-separated fields, an empty field = no bound "  \
     "(e.g. --clamp ,7,-7,7 for gpt-oss). NL clamps the gate g (non-linear), LIN the up projection u "   \
     "(linear), after the bias; each set bound must be finite, lower <= upper. The backward passes a "  \
     "gradient only where lower < value < upper on the checkpointed value."},                          \
    {"--padding", "skip|row",                                                                          \
     "the padding mark of token_position_to_id: skip (default) -1; row T, and hidden_states, output, "  \
     "output_hidden_states_grad and hidden_states_grad have T + 1 rows (row T is never read and is "    \
     "written 0)."},                                                                                   \
    {"--no-accumulate", NULL,                                                                          \
     "NKI's is_tensor_update_accumulating=False (options.tensor_update_overwrite): a promise that "      \
     "each token occupies at most one position (top-1), checked against token_position_to_id. The "     \
     "results are bitwise the same as without it. (It has nothing to do with accumulating weight "     \
     "gradients: mlp-bwd always writes fresh gradients.)"},                                            \
    {"--intermediates", "rounded|float32",                                                             \
     "f16/bf16: rounded (the default) rounds the operands of the second-stage GEMMs once to the "       \
     "dtype, as NKI, torch and Unsloth keep them: m before the down projection, a*grad (the down "      \
     "projection's gradient) and the gate/up gradients dg, du; with --backend cuda every GEMM runs on " \
     "tensor cores. float32 (options.float32_intermediates) keeps them float32, the exact option. "      \
     "Give both mlp-fwd and mlp-bwd the same. No effect in f32."},                                     \
    {"--round-intermediates", NULL, "the same as --intermediates rounded (the default)."},             \
    {"--weight-layout", "NAME",                                                                        \
     "the layout of the weight files, and of their gradients: nki (default), linear, linear-split, "    \
     "hf-mixtral, hf-qwen3-moe or hf-llama4 (mlp-fwd --help lists their files); hf-gpt-oss is "        \
     "refused (its (up + 1) is not expressible)."},                                                    \
    OPT_DTYPE,                                                                                         \
    OPT_BACKEND,                                                                                       \
    OPT_RAW

static const opt mlp_fwd_opts[] = {
    {"--in", "DIR", "folder of the inputs, NKI's parameter names (see above)."},
    {"--out", "DIR",
     "folder to write output.npy and the checkpoints into (created if missing; may be --in, so that "
     "mlp-bwd --in finds the checkpoints there)."},
    OPT_MLP,
    {"--bound-out", "DIR",
     "also write, for every output, the derived bound on each element's error (float64, the output's shape "
     "and file name) into DIR, for `moe compare --bound DIR`: any correct float32 implementation, this "
     "reference and the CUDA backend included, is within it of the exact result from the rounded inputs."},
    {NULL, NULL, NULL},
};

static const opt mlp_bwd_opts[] = {
    {"--in", "DIR", "folder of the inputs, NKI's parameter names (see above)."},
    {"--out", "DIR", "folder to write the gradients into (created if missing)."},
    OPT_MLP,
    {"--grad-fp32", NULL,
     "write the weight and bias gradients rounded to float32 instead of the computation dtype "
     "(options.grad_fp32). Without it they are rounded to the computation dtype, also when written as "
     "float32."},
    {"--bound-out", "DIR",
     "also write, for every gradient, the derived bound on each element's error (float64, the gradient's "
     "shape and file name) into DIR, for `moe compare --bound DIR`; the exact result is the backward of the "
     "given checkpoints."},
    {NULL, NULL, NULL},
};

static int run_mlp_fwd(const args *a);
static int run_mlp_bwd(const args *a);

const command mlp_fwd_command = {
    "mlp-fwd",
    "--in DIR --out DIR [--block-size B] [--activation silu|gelu|gelu_tanh|swish] [--affinity-on h|i] "
    "[--bias] [--clamp NL_LO,NL_HI,LIN_LO,LIN_HI] [--padding skip|row] [--no-accumulate] "
    "[--intermediates rounded|float32] [--weight-layout NAME] [--dtype f32|f16|bf16] [--backend ref|cuda] "
    "[--raw] [--bound-out DIR]",
    "blockwise MoE MLP forward with checkpoints (moe_mlp_fwd, NKI blockwise_mm semantics)",
    "Per position p = n*B + b of block n, token t = token_position_to_id[p], expert e = "
    "block_to_expert[n], a = A[t*E + e]: g, u = x_t . W_gu[e] (+ b_gu[e]), clamped; m = act(g)*u; d = "
    "m . W_d[e] (+ b_d[e]); out_t += a*d (SEMANTICS section 3, specs/MLP.md). Padding positions are "
    "empty; rows of tokens in no block are 0.\n\n"
    "--in DIR holds (NKI's parameter names; T tokens, E experts, H hidden, I intermediate, N blocks of "
    "B positions; T1 = T + 1 with --padding row, else T):\n"
    "  hidden_states.npy (T1, H)\n"
    "  expert_affinities_masked.npy (T*E,), or NKI's (T*E, 1), or (T, E); with --padding row also NKI's "
    "((T+1)*E, 1), ((T+1)*E,) or (T + 1, E), the padding row zero (checked)\n"
    "  gate_up_proj_weight.npy (E, H, 2, I): [:, :, 0] gate, [:, :, 1] up\n"
    "  down_proj_weight.npy (E, I, H)\n"
    "  gate_up_proj_bias.npy (E, 2, I), down_proj_bias.npy (E, H): only with --bias\n"
    "  token_position_to_id.npy (N*B,) or (N, B), int32/int64: a token, or the padding mark\n"
    "  block_to_expert.npy (N,), int32/int64\n"
    "(`moe route --block-size B --topk-weights TW.npy` writes the last three). Extra trailing "
    "dimensions of size 1 are accepted everywhere (NKI's [N, 1] block_to_expert).\n"
    "--weight-layout names another layout of the weight files (mlp-bwd writes their gradients in it, "
    "each name + _grad):\n"
    "  linear: torch nn.Linear weights stacked: gate_up_proj_weight.npy (E, 2*I, H), gate rows first; "
    "down_proj_weight.npy (E, H, I); biases gate_up_proj_bias.npy (E, 2*I), down_proj_bias.npy (E, H)\n"
    "  linear-split: gate_proj_weight.npy and up_proj_weight.npy (E, I, H) each, down_proj_weight.npy "
    "(E, H, I); biases gate_proj_bias.npy, up_proj_bias.npy (E, I), down_proj_bias.npy (E, H)\n"
    "  hf-mixtral, hf-qwen3-moe: transformers' fused experts, gate_up_proj (E, 2*I, H) and down_proj "
    "(E, H, I), as linear; no biases\n"
    "  hf-llama4: Llama4TextExperts, gate_up_proj (E, H, 2*I) and down_proj (E, I, H); no biases\n"
    "(cli/README.md, \"Weight layouts\", says which models each expresses exactly). --out DIR gets:\n"
    "  output.npy (T1, H)\n"
    "  gate_up_proj_act_checkpoint_T.npy (N, 2, I, B): g and u after bias and clamp\n"
    "  down_proj_act_checkpoint.npy (N, B, H): d before the affinity\n"
    "in the computation dtype's values (float32 files unless --raw), and moe-options.txt: the options "
    "it ran with, which mlp-bwd and compare take as their defaults (cli/README.md). A moe-options.txt "
    "that moe route wrote into --in gives this command its defaults likewise. Every shape is checked "
    "against the others before anything is written.",
    mlp_fwd_opts, 0, run_mlp_fwd,
    "# the block layout and affinities of a layer's routing, then its forward, checkpoints left in mlp/\n"
    "moe route --topk-ids mlp/topk_ids.npy --experts 4 --block-size 4 \\\n"
    "    --topk-weights mlp/topk_weights.npy --out mlp\n"
    "moe mlp-fwd --in mlp --out mlp",
};

const command mlp_bwd_command = {
    "mlp-bwd",
    "--in DIR --out DIR [--block-size B] [--activation ...] [--affinity-on h|i] [--bias] [--clamp ...] "
    "[--padding skip|row] [--no-accumulate] [--intermediates ...] [--weight-layout NAME] [--grad-fp32] "
    "[--dtype ...] [--backend ...] [--raw] [--bound-out DIR]",
    "blockwise MoE MLP backward from the forward's checkpoints (moe_mlp_bwd)",
    "Every gradient of SEMANTICS section 3 (NKI blockwise_mm_bwd), from the checkpoints the forward "
    "wrote, with the options the forward ran with: those of its moe-options.txt in --in (mlp-fwd writes it "
    "beside its outputs) are the defaults, --dtype included, and a flag with another value is refused. "
    "Without that file give the forward's options, --dtype included: the forward writes float32 files unless "
    "--raw, and without --dtype float32 inputs mean an f32 run (a warning names --dtype bf16 when every value "
    "is a bf16 value).\n\n"
    "--in DIR holds the forward's inputs (hidden_states.npy, expert_affinities_masked.npy, "
    "gate_up_proj_weight.npy, down_proj_weight.npy, token_position_to_id.npy, block_to_expert.npy; "
    "gate_up_proj_bias.npy is not needed, down_proj_bias.npy only with --bias --affinity-on i and no "
    "down checkpoint) and:\n"
    "  output_hidden_states_grad.npy (T1, H): the gradient of output\n"
    "  gate_up_proj_act_checkpoint_T.npy (N, 2, I, B)\n"
    "  down_proj_act_checkpoint.npy (N, B, H): optional with --affinity-on i (then recomputed)\n"
    "--out DIR gets:\n"
    "  hidden_states_grad.npy (T1, H): 0 for tokens in no block and for row T\n"
    "  expert_affinities_masked_grad.npy: the shape of expert_affinities_masked.npy; <grad, d> for "
    "every pair of the layout, 0 for every other (and for NKI's padding row)\n"
    "  topk_weights_grad.npy (T, k): when --in holds router_topk_ids.npy (route --topk-weights writes "
    "it): the same gradient in the router's order, [t][j] = expert_affinities_masked_grad[t*E + "
    "router_topk_ids[t][j]]\n"
    "  gate_up_proj_weight_grad.npy (E, H, 2, I), down_proj_weight_grad.npy (E, I, H)\n"
    "  gate_up_proj_bias_grad.npy (E, 2, I), down_proj_bias_grad.npy (E, H): with --bias\n"
    "  (with --weight-layout: the layout's files, each name + _grad, in its shapes)\n"
    "  moe-options.txt: the options it ran with (compare takes its dtype)\n"
    "Gradients are written fresh (the library's options.accumulate is not offered: add them up with "
    "NumPy).",
    mlp_bwd_opts, 0, run_mlp_bwd,
    "# every gradient from mlp-fwd's checkpoints and mlp/output_hidden_states_grad.npy\n"
    "moe mlp-bwd --in mlp --out grads",
};

/* ---------------------------------------------------------------------------------------------------
 * The MLP options (--block-size and --padding also for route)
 * ------------------------------------------------------------------------------------------------- */
int64_t parse_block_size(const args *a)
{
    const char *s = get(a, "--block-size");
    return s ? parse_int_arg("--block-size", s, 1) : MOE_MLP_DEFAULT_BLOCK_SIZE;
}

moe_mlp_padding parse_padding(const args *a)
{
    const char *s = get(a, "--padding");
    if (s == NULL || strcmp(s, "skip") == 0)
        return MOE_MLP_PAD_SKIP;
    if (strcmp(s, "row") == 0)
        return MOE_MLP_PAD_ROW;
    die("--padding %s: expected skip (empty positions hold -1) or row (they hold T)", s);
}

/* --clamp NL_LO,NL_HI,LIN_LO,LIN_HI into o's clamp limits (an empty field sets none). */
static void parse_clamp(const char *s, moe_mlp_options *o)
{
    static const char *const names[4] = {"NL_LO", "NL_HI", "LIN_LO", "LIN_HI"};
    float v[4] = {0};
    int has[4] = {0};
    const char *p = s;
    for (int f = 0; f < 4; f++) {
        const char *comma = strchr(p, ',');
        if ((f < 3 && comma == NULL) || (f == 3 && comma != NULL))
            die("--clamp %s: expected exactly 4 comma-separated fields NL_LO,NL_HI,LIN_LO,LIN_HI (an empty field "
                "= no bound, e.g. ,7,-7,7)", s);
        const size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char buf[64];
        if (len >= sizeof buf)
            die("--clamp %s: field %s is too long", s, names[f]);
        memcpy(buf, p, len);
        buf[len] = '\0';
        if (len > 0) {
            char *end;
            v[f] = strtof(buf, &end);
            if (*end != '\0' || end == buf || !isfinite(v[f]))
                die("--clamp %s: field %s = '%s' is not a finite number (an empty field = no bound)", s, names[f], buf);
            has[f] = 1;
        }
        p = comma ? comma + 1 : p + len;
    }
    for (int pair = 0; pair < 4; pair += 2)
        if (has[pair] && has[pair + 1] && v[pair] > v[pair + 1])
            die("--clamp %s: %s = %g is above %s = %g", s, names[pair], (double)v[pair], names[pair + 1],
                (double)v[pair + 1]);
    o->has_non_linear_clamp_lower_limit = has[0];
    o->has_non_linear_clamp_upper_limit = has[1];
    o->has_linear_clamp_lower_limit = has[2];
    o->has_linear_clamp_upper_limit = has[3];
    o->non_linear_clamp_lower_limit = v[0];
    o->non_linear_clamp_upper_limit = v[1];
    o->linear_clamp_lower_limit = v[2];
    o->linear_clamp_upper_limit = v[3];
}

/* Every mlp option but the dtype (chosen from the files). */
static void mlp_options(const args *a, moe_mlp_options *o)
{
    memset(o, 0, sizeof *o);
    o->block_size = parse_block_size(a);
    const char *s = get(a, "--activation");
    o->activation = MOE_ACT_SILU;
    if (s != NULL && moe_mlp_activation_from_name(s, &o->activation) != MOE_OK) {
        char choices[256];
        if (moe_mlp_activation_choices(choices, sizeof choices) != MOE_OK)
            die("--activation %s: %s", s, moe_last_error());
        die("--activation %s: expected %s", s, choices);
    }
    s = get(a, "--affinity-on");
    if (s == NULL || strcmp(s, "h") == 0 || strcmp(s, "H") == 0)
        o->affinity = MOE_AFFINITY_ON_H;
    else if (strcmp(s, "i") == 0 || strcmp(s, "I") == 0)
        o->affinity = MOE_AFFINITY_ON_I;
    else
        die("--affinity-on %s: expected h (out += a*d) or i (m = act(g)*u*a)", s);
    o->padding = parse_padding(a);
    o->bias = get(a, "--bias") != NULL;
    if ((s = get(a, "--clamp")) != NULL)
        parse_clamp(s, o);
    o->tensor_update_overwrite = get(a, "--no-accumulate") != NULL;
    s = get(a, "--intermediates");
    if (s != NULL && strcmp(s, "float32") == 0) {
        if (get(a, "--round-intermediates") != NULL)
            die("--intermediates float32 and --round-intermediates contradict each other: give one");
        o->float32_intermediates = 1;
    } else if (s != NULL && strcmp(s, "rounded") != 0)
        die("--intermediates %s: expected rounded (the default) or float32", s);
}

/* f16/bf16: ", intermediates rounded to bf16" (the default) or ", float32 intermediates"; f32: "". */
static const char *intermediates_note(const moe_mlp_options *o)
{
    if (o->dtype == MOE_F32)
        return "";
    if (o->float32_intermediates)
        return ", float32 intermediates";
    return o->dtype == MOE_BF16 ? ", intermediates rounded to bf16" : ", intermediates rounded to f16";
}

/* ---------------------------------------------------------------------------------------------------
 * Reading the --in folder
 * ------------------------------------------------------------------------------------------------- */
enum mlp_file {
    F_HIDDEN, F_AFF, F_WGU, F_WD, F_BGU, F_BD, F_TPTI, F_B2E, F_OUT_GRAD, F_CKPT_GU, F_CKPT_D, F_TOPK_IDS, F_COUNT
};
static const char *const mlp_file_names[F_COUNT] = {
    "hidden_states.npy", "expert_affinities_masked.npy", "gate_up_proj_weight.npy", "down_proj_weight.npy",
    "gate_up_proj_bias.npy", "down_proj_bias.npy", "token_position_to_id.npy", "block_to_expert.npy",
    "output_hidden_states_grad.npy", "gate_up_proj_act_checkpoint_T.npy", "down_proj_act_checkpoint.npy", "router_topk_ids.npy",
};
/* The index arrays among them (int64 after loading). */
static int is_index_file(int f) { return f == F_TPTI || f == F_B2E || f == F_TOPK_IDS; }

typedef struct mlp_in {
    moe_mlp_options o;
    char *path[F_COUNT];
    npy_array arr[F_COUNT];
    int have[F_COUNT];
    void *data[F_COUNT]; /* converted: floats to o.dtype, indices to int64 */
    size_t bytes[F_COUNT]; /* of data[f] */
    moe_backend backend;
    int64_t T, T1, E, H, I, N, B;
    int aff_ndim; /* the shape of expert_affinities_masked.npy, which its gradient gets */
    int aff_pad_row; /* it has NKI's padding row (T + 1 rows, zero in row T) */
    int64_t aff_shape[NPY_MAX_DIMS];
    moe_mlp_layout layout;
    const weight_layout *weights;       /* --weight-layout */
    char *weight_path[MLP_WEIGHTS][2];  /* its files */
    int64_t k;                          /* with router_topk_ids.npy: the router's (T, k) order */
} mlp_in;

/* The slot of each weight in mlp_in's files. */
static const int weight_file[MLP_WEIGHTS] = {F_WGU, F_WD, F_BGU, F_BD};

/* Loads the files of --in marked in `want` (2: required, 1: read when present), checks every shape
 * against the others, converts them to the computation dtype (floats) or int64 (indices), and validates
 * the layout.  m->o holds the parsed mlp options (mlp_options); the dtype and block size are set here.
 * Nothing is written. */
static void mlp_load(const args *a, mlp_in *m, const int *want)
{
    const char *dir = need(a, "--in");
    if (!is_dir(dir))
        die("--in %s: not a folder (it holds the .npy files named after NKI's parameters, see moe %s --help)", dir,
            a->cmd->name);
    for (int f = 0; f < F_COUNT; f++)
        m->path[f] = join_path(dir, mlp_file_names[f]);
    for (int w = 0; w < MLP_WEIGHTS; w++) { /* the weights' files are the layout's */
        const int f = weight_file[w];
        char names[2][WEIGHT_NAME_SIZE];
        const int n = weight_file_names(m->weights, w, "", names);
        for (int i = 0; i < n; i++)
            m->weight_path[w][i] = join_path(dir, names[i]);
        if (n > 0)
            m->path[f] = m->weight_path[w][0];
        for (int i = 0; i < n && want[f] != 0; i++)
            check_input(m->weight_path[w][i]);
    }
    for (int f = 0; f < F_COUNT; f++)
        if (want[f] != 0 && f != F_WGU && f != F_WD && f != F_BGU && f != F_BD)
            check_input(m->path[f]);
    int64_t dims[3] = {0}; /* E, H, I */
    for (int w = 0; w < MLP_WEIGHTS; w++) {
        const int f = weight_file[w];
        if (want[f] == 2) {
            weight_read(m->weights, w, m->weight_path[w], m->path[F_WGU], dims, &m->arr[f]);
            m->have[f] = 1;
        }
    }
    for (int f = 0; f < F_COUNT; f++) {
        if (!m->have[f] && (want[f] == 2 || (want[f] == 1 && is_regular(m->path[f])))) {
            load(m->path[f], &m->arr[f]);
            m->have[f] = 1;
        }
    }
    const npy_array *floats[F_COUNT];
    const char *float_paths[F_COUNT];
    int nf = 0;
    for (int f = 0; f < F_COUNT; f++) {
        if (!m->have[f])
            continue;
        if (is_index_file(f)) {
            check_index_array(m->path[f], &m->arr[f]);
            continue;
        }
        check_floating(m->path[f], &m->arr[f]);
        floats[nf] = &m->arr[f];
        float_paths[nf++] = m->path[f];
    }
    m->o.dtype = choose_dtype(a, floats, float_paths, nf);
    if (get(a, "--dtype") == NULL && m->o.dtype == MOE_F32)
        warn_if_16bit_valued(a, floats, nf, dir);

    /* E, H, I from the gate/up weight (weight_read checked the other weights against them); N from
     * block_to_expert; B from token_position_to_id or --block-size */
    const char *pw = m->path[F_WGU];
    m->E = dims[0], m->H = dims[1], m->I = dims[2];
    if (m->E < 1)
        die("%s: expected at least one expert (E >= 1), found E = 0 (--weight-layout %s)", pw,
            weight_layout_name(m->weights));
    char why[1024];

    const npy_header *b2e = &m->arr[F_B2E].h;
    if (b2e->ndim < 1 || !shape_is(b2e, 1, b2e->shape))
        die("%s: expected block_to_expert of shape (N,) or (N, 1), found %s %s", m->path[F_B2E], shape_text(b2e),
            npy_type_name(b2e->type));
    m->N = b2e->shape[0];
    const npy_header *tp = &m->arr[F_TPTI].h;
    const char *ptp = m->path[F_TPTI];
    const int given_b = get(a, "--block-size") != NULL;
    if (given_b)
        m->B = m->o.block_size;
    else if (m->N > 0 && tp->ndim >= 2 && tp->shape[0] == m->N && tp->shape[1] >= 1 && shape_is(tp, 2, tp->shape))
        m->B = tp->shape[1]; /* (N, B) */
    else if (m->N > 0 && tp->ndim >= 1 && tp->shape[0] > 0 && tp->shape[0] % m->N == 0 && shape_is(tp, 1, tp->shape))
        m->B = tp->shape[0] / m->N; /* (N*B,) */
    else
        m->B = MOE_MLP_DEFAULT_BLOCK_SIZE;
    m->o.block_size = m->B;
    const int64_t nb[1] = {m->N * m->B}, n_b[2] = {m->N, m->B};
    (void)elements(m->N, m->B, 1); /* refuses N*B past 64 bits */
    if (!given_b && m->N > 0 && !shape_is(tp, 1, nb) && !shape_is(tp, 2, n_b))
        die("%s: expected token_position_to_id of shape (N*B,) or (N, B) with N = %lld blocks from %s and a "
            "block size B >= 1, found %s %s", ptp, (long long)m->N, m->path[F_B2E], shape_text(tp),
            npy_type_name(tp->type));
    if (!shape_is(tp, 1, nb) && !shape_is(tp, 2, n_b))
        die("%s: expected token_position_to_id of shape (%lld,) or (%lld, %lld) (N = %lld blocks from %s, B = %lld %s), "
            "found %s %s", ptp, (long long)nb[0], (long long)m->N, (long long)m->B, (long long)m->N, m->path[F_B2E],
            (long long)m->B, given_b ? "from --block-size" : "(the default: there are no blocks)", shape_text(tp),
            npy_type_name(tp->type));

    /* T from hidden_states */
    const npy_header *hs = &m->arr[F_HIDDEN].h;
    const char *phs = m->path[F_HIDDEN];
    const int row = m->o.padding == MOE_MLP_PAD_ROW;
    if (hs->ndim < 2 || hs->shape[1] != m->H || !shape_is(hs, 2, hs->shape) || (row && hs->shape[0] < 1))
        die("%s: expected hidden_states of shape (%s, %lld) (H = %lld from %s%s), found %s %s", phs,
            row ? "T + 1" : "T", (long long)m->H, (long long)m->H, pw,
            row ? "; with --padding row, row T is the padding row" : "", shape_text(hs), npy_type_name(hs->type));
    m->T1 = hs->shape[0];
    m->T = m->T1 - row;
    if (m->T1 > 0 && m->E > INT64_MAX / m->T1)
        die("%s: T*E overflows", phs); /* (T + 1)*E with the padding row */

    const npy_header *ah = &m->arr[F_AFF].h;
    m->aff_pad_row = mlp_affinities_pad_row(m->path[F_AFF], &m->arr[F_AFF], m->T, m->E, row, m->o.dtype, phs, pw);
    m->aff_ndim = ah->ndim;
    memcpy(m->aff_shape, ah->shape, sizeof m->aff_shape);
    if (m->have[F_TOPK_IDS]) { /* route --topk-weights wrote it: the router's order of each token's experts */
        const npy_header *ih = &m->arr[F_TOPK_IDS].h;
        m->k = ih->ndim >= 2 ? ih->shape[1] : 1;
        const int64_t s[2] = {m->T, m->k};
        snprintf(why, sizeof why, "T = %lld tokens from %s, k >= 1 experts each", (long long)m->T, phs);
        if (ih->ndim < 1 || m->k < 1 || !(shape_is(ih, 2, s) || (ih->ndim == 1 && ih->shape[0] == m->T)))
            die("%s: expected router_topk_ids of shape (%lld, k) (%s), found %s %s", m->path[F_TOPK_IDS],
                (long long)m->T, why, shape_text(ih), npy_type_name(ih->type));
    }
    if (m->have[F_OUT_GRAD]) {
        snprintf(why, sizeof why, "the shape of %s", phs);
        const int64_t s[2] = {m->T1, m->H};
        check_shape(m->path[F_OUT_GRAD], &m->arr[F_OUT_GRAD], 2, s, "output_hidden_states_grad", why);
    }
    if (m->have[F_CKPT_GU]) {
        snprintf(why, sizeof why, "N from %s, I from %s, B = %lld", m->path[F_B2E], pw, (long long)m->B);
        const int64_t s[4] = {m->N, 2, m->I, m->B};
        check_shape(m->path[F_CKPT_GU], &m->arr[F_CKPT_GU], 4, s, "gate_up_proj_act_checkpoint_T", why);
    }
    if (m->have[F_CKPT_D]) {
        snprintf(why, sizeof why, "N from %s, B = %lld, H from %s", m->path[F_B2E], (long long)m->B, pw);
        const int64_t s[3] = {m->N, m->B, m->H};
        check_shape(m->path[F_CKPT_D], &m->arr[F_CKPT_D], 3, s, "down_proj_act_checkpoint", why);
    }

    for (int f = 0; f < F_COUNT; f++) {
        if (!m->have[f])
            continue;
        const int is_index = is_index_file(f);
        m->bytes[f] = elements(m->arr[f].h.count, is_index ? sizeof(int64_t) : moe_dtype_size(m->o.dtype), 1);
        if (is_index)
            m->data[f] = convert_int(m->path[f], &m->arr[f]);
        else
            m->data[f] = convert(m->path[f], &m->arr[f], m->o.dtype);
        release(&m->arr[f]);
        m->arr[f].data = NULL;
    }
    if (m->have[F_TOPK_IDS])
        check_topk_ids(m->path[F_TOPK_IDS], m->T, m->k, m->E, m->data[F_TOPK_IDS]);
    m->layout = (moe_mlp_layout){m->T, m->E, m->N, m->data[F_B2E], m->data[F_TPTI]};
    if (moe_mlp_layout_validate(&m->layout, &m->o) != MOE_OK)
        die("%s, %s: %s", ptp, m->path[F_B2E], moe_last_error());
}

/* The pointer to pass for input file f of m (NULL when absent). */
static const void *mlp_in_arg(const lib_call *c, const mlp_in *m, int f)
{
    return call_in(c, mlp_file_names[f], m->data[f], m->bytes[f]);
}

/* m's layout with its arrays through call_in. */
static moe_mlp_layout mlp_call_layout(const lib_call *c, const mlp_in *m)
{
    moe_mlp_layout on = m->layout;
    on.block_to_expert = mlp_in_arg(c, m, F_B2E);
    on.token_position_to_id = mlp_in_arg(c, m, F_TPTI);
    return on;
}

/* m's problem for the bounds of --bound-out (bounds.c). */
static mlp_bound_in mlp_bound_problem(const mlp_in *m)
{
    return (mlp_bound_in){m->T, m->T1, m->E, m->H, m->I, m->B, m->N, m->data[F_B2E], m->data[F_TPTI], &m->o,
                          m->data[F_HIDDEN], m->data[F_AFF], m->data[F_WGU], m->data[F_WD], m->data[F_BGU],
                          m->data[F_BD], m->data[F_OUT_GRAD], m->data[F_CKPT_GU], m->data[F_CKPT_D]};
}

/* The files both directions read: the forward's inputs (biases only with --bias). */
static void mlp_begin(const args *a, mlp_in *m, int *want)
{
    memset(m, 0, sizeof *m);
    m->backend = get_backend(a);
    mlp_options(a, &m->o);
    m->weights = parse_weight_layout(get(a, "--weight-layout"));
    char names[2][WEIGHT_NAME_SIZE];
    if (m->o.bias && weight_file_names(m->weights, B_GATE_UP, "", names) == 0)
        die("--bias: --weight-layout %s has no biases (its model has none); nn.Linear biases are --weight-layout "
            "linear or linear-split", weight_layout_name(m->weights));
    want[F_HIDDEN] = want[F_AFF] = want[F_WGU] = want[F_WD] = want[F_TPTI] = want[F_B2E] = 2;
}

/* ---------------------------------------------------------------------------------------------------
 * mlp-fwd, mlp-bwd
 * ------------------------------------------------------------------------------------------------- */
/* Registers the backward's outputs in dir (--out, or --bound-out): the gradients of the token tensors (p; with
 * topk the router's (T, k) view too) and of the weights in m's layout (wp: its names + "_grad"). */
static void add_bwd_outputs(const char *dir, const mlp_in *m, int topk, char **p, char *wp[][2])
{
    static const char *const names[] = {"hidden_states_grad.npy", "expert_affinities_masked_grad.npy",
                                        "topk_weights_grad.npy"};
    add_outputs_in(dir, names, 2 + topk, p);
    for (int w = 0; w < (m->o.bias ? MLP_WEIGHTS : B_GATE_UP); w++) {
        char wn[2][WEIGHT_NAME_SIZE];
        const char *wnames[2] = {wn[0], wn[1]};
        add_outputs_in(dir, wnames, weight_file_names(m->weights, w, "_grad", wn), wp[w]);
    }
}

static int run_mlp_fwd(const args *given)
{
    args with_file = *given; /* the flags, and a routing's options file in --in as their defaults */
    mlp_apply_run_options(&with_file, 1);
    const args *a = &with_file;
    const char *out = need(a, "--out");
    mlp_in m;
    int want[F_COUNT] = {0};
    mlp_begin(a, &m, want);
    static const char *const names[] = {"output.npy", "gate_up_proj_act_checkpoint_T.npy",
                                        "down_proj_act_checkpoint.npy"};
    char *p[3], *opts_file;
    add_outputs_in(out, names, 3, p);
    add_outputs_in(out, (const char *const[]){RUN_OPTIONS_FILE}, 1, &opts_file);
    const char *bound_dir = get(a, "--bound-out");
    char *bp[3];
    if (bound_dir != NULL)
        add_outputs_in(bound_dir, names, 3, bp);
    if (m.o.bias)
        want[F_BGU] = want[F_BD] = 2;
    mlp_load(a, &m, want);
    const size_t es = moe_dtype_size(m.o.dtype);
    const size_t n_y = elements(m.T1, m.H, 1), n_gu = elements(m.N, 2 * m.I, m.B), n_d = elements(m.N, m.B, m.H);
    void *y = xmalloc(n_y, es), *ckpt_gu = xmalloc(n_gu, es), *ckpt_d = xmalloc(n_d, es);
    lib_call c = {"moe_mlp_fwd", m.backend, 0, {{0}}};
    const moe_mlp_layout layout = mlp_call_layout(&c, &m);
    call_end(&c, moe_mlp_fwd(c.backend, &layout, m.H, m.I, mlp_in_arg(&c, &m, F_HIDDEN), mlp_in_arg(&c, &m, F_AFF),
                             mlp_in_arg(&c, &m, F_WGU), mlp_in_arg(&c, &m, F_WD), mlp_in_arg(&c, &m, F_BGU),
                             mlp_in_arg(&c, &m, F_BD), call_out(&c, "output", y, n_y * es),
                             call_out(&c, "gate_up_proj_act_checkpoint_T", ckpt_gu, n_gu * es),
                             call_out(&c, "down_proj_act_checkpoint", ckpt_d, n_d * es), &m.o));
    make_dirs(out);
    const int64_t s_y[2] = {m.T1, m.H}, s_gu[4] = {m.N, 2, m.I, m.B}, s_d[3] = {m.N, m.B, m.H};
    write_result(a, p[0], m.o.dtype, y, 2, s_y);
    write_result(a, p[1], m.o.dtype, ckpt_gu, 4, s_gu);
    write_result(a, p[2], m.o.dtype, ckpt_d, 3, s_d);
    mlp_write_run_options(opts_file, "mlp-fwd", &m.o, weight_layout_name(m.weights));
    if (bound_dir != NULL) {
        make_dirs(bound_dir);
        const mlp_bound_in in = mlp_bound_problem(&m);
        write_mlp_fwd_bounds(bp, &in);
    }
    commit_outputs();
    printf("mlp-fwd: T = %lld tokens, E = %lld experts, H = %lld, I = %lld, N = %lld blocks of B = %lld, %s%s\n",
           (long long)m.T, (long long)m.E, (long long)m.H, (long long)m.I, (long long)m.N, (long long)m.B,
           moe_dtype_name(m.o.dtype), intermediates_note(&m.o));
    return 0;
}

static int run_mlp_bwd(const args *given)
{
    args with_file = *given; /* the flags, and the forward's options file in --in as their defaults */
    mlp_apply_run_options(&with_file, 0);
    const args *a = &with_file;
    const char *out = need(a, "--out");
    mlp_in m;
    int want[F_COUNT] = {0};
    mlp_begin(a, &m, want);
    char *p[3], *wp[MLP_WEIGHTS][2], *opts_file; /* the weight gradients' files: the layout's names + "_grad" */
    char *ids = join_path(need(a, "--in"), mlp_file_names[F_TOPK_IDS]);
    const int topk = is_regular(ids); /* route --topk-weights wrote the router's order: also the (T, k) view */
    add_bwd_outputs(out, &m, topk, p, wp);
    add_outputs_in(out, (const char *const[]){RUN_OPTIONS_FILE}, 1, &opts_file);
    const char *bound_dir = get(a, "--bound-out");
    char *bp[3], *bwp[MLP_WEIGHTS][2];
    if (bound_dir != NULL)
        add_bwd_outputs(bound_dir, &m, topk, bp, bwp);
    want[F_OUT_GRAD] = want[F_CKPT_GU] = 2;
    want[F_TOPK_IDS] = topk ? 2 : 0;
    xfree(ids);
    if (m.o.affinity == MOE_AFFINITY_ON_I) {
        /* the down checkpoint is optional: without it d is recomputed, which needs the down bias */
        char *ckpt_d = join_path(need(a, "--in"), mlp_file_names[F_CKPT_D]);
        want[F_CKPT_D] = 1;
        if (m.o.bias && !is_regular(ckpt_d))
            want[F_BD] = 2;
        xfree(ckpt_d);
    } else {
        want[F_CKPT_D] = 2;
    }
    mlp_load(a, &m, want);
    m.o.grad_fp32 = get(a, "--grad-fp32") != NULL;
    const moe_dtype gdt = m.o.grad_fp32 ? MOE_F32 : m.o.dtype;
    const int bias = m.o.bias;
    const size_t es = moe_dtype_size(m.o.dtype), gs = moe_dtype_size(gdt);
    const size_t n_h = elements(m.T1, m.H, 1), n_a = elements(m.T, m.E, 1), n_wgu = elements(m.E, m.H, 2 * m.I);
    const size_t n_a_file = elements(m.aff_pad_row ? m.T1 : m.T, m.E, 1); /* with the padding row: its 0s */
    const size_t n_wd = elements(m.E, m.I, m.H), n_bgu = elements(m.E, 2, m.I), n_bd = elements(m.E, m.H, 1);
    void *dh = xmalloc(n_h, es), *da = xmalloc(n_a_file, es), *dwgu = xmalloc(n_wgu, gs), *dwd = xmalloc(n_wd, gs);
    memset((char *)da + n_a * es, 0, (n_a_file - n_a) * es); /* the padding row's gradient: +0 */
    void *dbgu = bias ? xmalloc(n_bgu, gs) : NULL;
    void *dbd = bias ? xmalloc(n_bd, gs) : NULL;
    lib_call c = {"moe_mlp_bwd", m.backend, 0, {{0}}};
    const moe_mlp_layout layout = mlp_call_layout(&c, &m);
    call_end(&c, moe_mlp_bwd(c.backend, &layout, m.H, m.I, mlp_in_arg(&c, &m, F_HIDDEN), mlp_in_arg(&c, &m, F_AFF),
                             mlp_in_arg(&c, &m, F_WGU), mlp_in_arg(&c, &m, F_WD), mlp_in_arg(&c, &m, F_BD),
                             mlp_in_arg(&c, &m, F_CKPT_GU), mlp_in_arg(&c, &m, F_CKPT_D),
                             mlp_in_arg(&c, &m, F_OUT_GRAD), call_out(&c, "hidden_states_grad", dh, n_h * es),
                             call_out(&c, "expert_affinities_masked_grad", da, n_a * es),
                             call_out(&c, "gate_up_proj_weight_grad", dwgu, n_wgu * gs),
                             call_out(&c, "down_proj_weight_grad", dwd, n_wd * gs),
                             call_out(&c, "gate_up_proj_bias_grad", dbgu, n_bgu * gs),
                             call_out(&c, "down_proj_bias_grad", dbd, n_bd * gs), &m.o));
    make_dirs(out);
    const int64_t s_h[2] = {m.T1, m.H}, dims[3] = {m.E, m.H, m.I};
    write_result(a, p[0], m.o.dtype, dh, 2, s_h);
    write_result(a, p[1], m.o.dtype, da, m.aff_ndim, m.aff_shape);
    if (topk) {
        void *dtw = xmalloc(elements(m.T, m.k, 1), es);
        topk_weights_grad(m.T, m.k, m.E, m.data[F_TOPK_IDS], da, es, dtw);
        const int64_t s_tw[2] = {m.T, m.k};
        write_result(a, p[2], m.o.dtype, dtw, 2, s_tw);
    }
    const void *grads[MLP_WEIGHTS] = {dwgu, dwd, dbgu, dbd};
    for (int w = 0; w < (bias ? MLP_WEIGHTS : B_GATE_UP); w++)
        weight_write(a, m.weights, w, wp[w], gdt, grads[w], dims);
    mlp_write_run_options(opts_file, "mlp-bwd", &m.o, weight_layout_name(m.weights));
    if (bound_dir != NULL) {
        make_dirs(bound_dir);
        const mlp_bound_in in = mlp_bound_problem(&m);
        write_mlp_bwd_bounds(bp, bwp, m.weights, &in, m.aff_ndim, m.aff_shape, (int64_t)n_a_file,
                             topk ? m.data[F_TOPK_IDS] : NULL, m.k);
    }
    commit_outputs();
    printf("mlp-bwd: T = %lld tokens, E = %lld experts, H = %lld, I = %lld, N = %lld blocks of B = %lld, %s%s%s%s\n",
           (long long)m.T, (long long)m.E, (long long)m.H, (long long)m.I, (long long)m.N, (long long)m.B,
           moe_dtype_name(m.o.dtype), intermediates_note(&m.o), m.o.grad_fp32 ? ", weight gradients float32" : "",
           m.have[F_CKPT_D] ? "" : ", d recomputed (no down checkpoint)");
    return 0;
}
