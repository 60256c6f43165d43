/*
 * libmoe: the blockwise Mixture-of-Experts MLP (NKI `blockwise_mm_bwd` semantics, extended).
 *
 * The exact math is SEMANTICS.md section 3; every decision it leaves open is written in specs/MLP.md.
 * The conventions of moe.h hold here too: dense row-major tensors of options.dtype (f16/bf16 as uint16_t
 * bit patterns), float32 accumulation with one rounding per output element, int64_t indices, host
 * pointers for MOE_BACKEND_REF and device pointers (the layout arrays too) for MOE_BACKEND_CUDA, every
 * argument validated before any output is touched, and on failure a
 * status other than MOE_OK with a message in moe_last_error() naming the argument, the index and what
 * was expected.  An all-zero moe_mlp_options (or a NULL pointer to one) is the default: f32, block
 * size 128, SiLU, affinity on H, skip padding (-1), no bias, no clamps, accumulating token updates,
 * gradients overwritten, f16/bf16 intermediates rounded to the dtype.
 *
 * Notation: T tokens, E experts, k experts per token, H hidden size, I intermediate size, B block size,
 * N blocks.  A "position" p = n*B + b is slot b of block n.  T1 = T + 1 with the pad-row convention
 * (MOE_MLP_PAD_ROW), T otherwise.
 *
 * Tensors (all of options.dtype unless stated):
 *   hidden                 [T1][H]        token activations (row T, if any, is never read)
 *   affinities             [T*E]          A[t*E + e], the masked routing weights; read only for the
 *                                         (token, expert) pairs the layout holds
 *   w_gu                   [E][H][2][I]   gate (index 0) and up (index 1) projections
 *   w_d                    [E][I][H]      down projection
 *   b_gu                   [E][2][I]      gate/up bias (options.bias)
 *   b_d                    [E][H]         down bias (options.bias)
 *   out                    [T1][H]        forward output; rows no block touches are +0
 *   gate_up_ckpt_T         [N][2][I][B]   clamped, biased, pre-activation g (0) and u (1) per position;
 *                                         padding positions hold +0
 *   down_ckpt              [N][B][H]      d = act(g)*u . W_d + b_d per position (before the affinity);
 *                                         padding positions hold +0
 *   out_grad               [T1][H]        upstream gradient (row T never read)
 *   d_hidden               [T1][H]        always overwritten; untouched tokens and row T get +0
 *   d_affinities           [T*E]          always overwritten; <G, d> for every pair of the layout, +0
 *                                         for every other pair
 *   d_w_gu, d_w_d, d_b_gu, d_b_d          shapes of w_gu, w_d, b_gu, b_d; float32 with
 *                                         options.grad_fp32; added into with options.accumulate
 */
#ifndef LIBMOE_MOE_MLP_H
#define LIBMOE_MOE_MLP_H

#include "moe.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The block size an all-zero options struct means. */
#define MOE_MLP_DEFAULT_BLOCK_SIZE 128

/* Activation of the gate (NKI ActFnType names); each has its exact derivative in the backward. */
typedef enum moe_mlp_activation {
    MOE_ACT_SILU = 0,       /* x * sigmoid(x) */
    MOE_ACT_GELU = 1,       /* 0.5 x (1 + erf(x / sqrt 2)) */
    MOE_ACT_GELU_TANH = 2,  /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
    MOE_ACT_SWISH = 3       /* x * sigmoid(1.702 x)  (the gpt-oss gate; NKI's "Swish") */
} moe_mlp_activation;
/* The number of activations: every value in [0, MOE_MLP_ACTIVATION_COUNT) is one. */
#define MOE_MLP_ACTIVATION_COUNT 4

/* The activation's name as the CLI and messages spell it ("silu", "gelu", "gelu_tanh", "swish"), or NULL
 * for a value that is none. */
const char *moe_mlp_activation_name(moe_mlp_activation activation);
/* The activation of a name (moe_mlp_activation_name's spelling); MOE_ERR_INVALID_OPTION, naming the choices,
 * for any other (NULL included), *activation unchanged. */
moe_status moe_mlp_activation_from_name(const char *name, moe_mlp_activation *activation);

/* Where the routing affinity a = A[t*E + e] is applied. */
typedef enum moe_mlp_affinity {
    MOE_AFFINITY_ON_H = 0,  /* out += a * d                                     (NKI default) */
    MOE_AFFINITY_ON_I = 1   /* m = act(g)*u*a; out += m . W_d + a*b_d  (same function, other rounding) */
} moe_mlp_affinity;

/* How an empty position of token_position_to_id is marked. */
typedef enum moe_mlp_padding {
    MOE_MLP_PAD_SKIP = 0,   /* id -1; tensors indexed by token have T rows */
    MOE_MLP_PAD_ROW = 1     /* id T; hidden, out, out_grad and d_hidden have T + 1 rows */
} moe_mlp_padding;

/* How the layout builder packs tokens into blocks. */
typedef enum moe_mlp_layout_kind {
    MOE_MLP_DROPLESS = 0,   /* ceil(m_e / B) blocks per expert (none for an expert without tokens) */
    MOE_MLP_DROPPING = 1    /* exactly one block per expert (N = E); tokens past capacity B dropped */
} moe_mlp_layout_kind;

typedef struct moe_mlp_options {
    moe_dtype dtype;                 /* dtype of every tensor (gradients: see grad_fp32) */
    int64_t block_size;              /* B >= 1; 0 means MOE_MLP_DEFAULT_BLOCK_SIZE */
    moe_mlp_activation activation;
    moe_mlp_affinity affinity;
    moe_mlp_padding padding;
    int bias;                        /* b_gu/b_d used (fwd) and d_b_gu/d_b_d produced (bwd) */
    /* Clamp limits (NKI ClampLimits).  Each bound is used only when its has_ flag is set; a set bound
     * must be finite, and with both bounds of a pair set, lower <= upper.  The forward clamps
     * u ("linear") and g ("non-linear") after the bias; the backward zeroes the gradient of an element
     * unless lower < value < upper (strict) on the checkpointed value. */
    int has_linear_clamp_lower_limit;
    int has_linear_clamp_upper_limit;
    int has_non_linear_clamp_lower_limit;
    int has_non_linear_clamp_upper_limit;
    float linear_clamp_lower_limit;
    float linear_clamp_upper_limit;
    float non_linear_clamp_lower_limit;
    float non_linear_clamp_upper_limit;
    /* NKI is_tensor_update_accumulating = false.  The caller promises each token occupies at most one
     * position (top-1); the layout check enforces it.  Results are identical to the default. */
    int tensor_update_overwrite;
    int accumulate;                  /* moe_mlp_bwd: add d_w_gu, d_w_d, d_b_gu, d_b_d into the caller's
                                        buffers (float32 add, one rounding); d_hidden and d_affinities
                                        are always overwritten */
    int grad_fp32;                   /* moe_mlp_bwd: d_w_gu, d_w_d, d_b_gu, d_b_d are float32 */
    /* f16/bf16, the default (0): the operands of the second-stage GEMMs are rounded once to options.dtype,
     * as NKI, torch and Unsloth keep them: m before the down projection (forward, and the backward's d_w_d),
     * a*G (the down-projection gradient, also summed for d_b_d) and dg/du (before d_hidden, d_w_gu and
     * d_b_gu) (specs/MLP.md, "Rounded intermediates").  MOE_BACKEND_CUDA then runs every GEMM on tensor
     * cores, each once.  On sm_90a, with 256 or more positions per expert on average, the forward's gate/up
     * GEMM carries the activation in its epilogue (same bits); the environment variable
     * MOE_MLP_FUSE_GATE=0 runs them as two kernels, =1 fuses them at any size and makes a call the fused
     * kernel cannot take fail with MOE_ERR_UNSUPPORTED (for tests and timing).
     * 1: those intermediates stay float32, the exact option (specs/MLP.md, "Rounded intermediates", says
     * why the default rounds); MOE_BACKEND_CUDA then runs bf16 on tensor cores too, each float32 operand as three
     * exact bf16 terms (up to three GEMMs where the default needs one; specs/MLP.md, "Split operands on
     * the GPU"), and f16 on its fp32 SIMT kernels.  No effect for f32. */
    int float32_intermediates;
    void *stream;                    /* MOE_BACKEND_CUDA: the cudaStream_t to run on (NULL = default) */
} moe_mlp_options;

/* A block layout: which expert each block serves and which token sits at each position.
 *   block_to_expert       [N]    values in [0, E)
 *   token_position_to_id  [N*B]  a token id in [0, T), or the padding mark (-1 or T, options.padding)
 * Each (token, expert) pair occupies at most one position. */
typedef struct moe_mlp_layout {
    int64_t num_tokens;                   /* T >= 0 */
    int64_t num_experts;                  /* E >= 1 */
    int64_t num_blocks;                   /* N >= 0 */
    const int64_t *block_to_expert;
    const int64_t *token_position_to_id;
} moe_mlp_layout;

/* ----------------------------------------------------------------------------------------------------
 * Layout builders from routing (host memory).  topk_ids[T][k] holds each token's experts, values in
 * [0, E), no expert twice in one row.  Blocks are ordered by expert; within an expert tokens ascend.
 * -------------------------------------------------------------------------------------------------- */

/* *num_blocks = N the builder of `kind` produces: sum_e ceil(m_e / B) (dropless) or E (dropping). */
moe_status moe_mlp_layout_num_blocks(moe_mlp_layout_kind kind, int64_t num_tokens, int64_t topk,
                                     int64_t num_experts, const int64_t *topk_ids,
                                     const moe_mlp_options *options, int64_t *num_blocks);

/* Fills a layout of `kind`:
 *   num_blocks             N; must equal what moe_mlp_layout_num_blocks reports
 *   block_to_expert        [N] out
 *   token_position_to_id   [N*B] out; empty positions get the padding mark of options.padding
 *   topk_weights           [T][k] or NULL, options.dtype
 *   affinities             [T*E] out or NULL (NULL exactly when topk_weights is NULL), options.dtype:
 *                          A[t*E + e] = topk_weights[t][j] for every pair placed in a block, 0 for
 *                          every other pair (including dropped ones)
 *   num_dropped            out or NULL: pairs dropped past capacity (always 0 for dropless) */
moe_status moe_mlp_layout_build(moe_mlp_layout_kind kind, int64_t num_tokens, int64_t topk,
                                int64_t num_experts, const int64_t *topk_ids, const void *topk_weights,
                                int64_t num_blocks, int64_t *block_to_expert, int64_t *token_position_to_id,
                                void *affinities, int64_t *num_dropped, const moe_mlp_options *options);

/* *num_blocks = an upper bound of N over every routing of T tokens with k distinct experts each:
 * dropless min(T*k, (T*k + E*(B-1)) / B), dropping E.  The capacity moe_mlp_layout_build_on needs. */
moe_status moe_mlp_layout_max_blocks(moe_mlp_layout_kind kind, int64_t num_tokens, int64_t topk,
                                     int64_t num_experts, const moe_mlp_options *options, int64_t *num_blocks);

/* moe_mlp_layout_build on a backend, with num_blocks a capacity (>= moe_mlp_layout_max_blocks) so that no
 * host round trip is needed to size the layout.  Blocks 0 .. U-1 are exactly moe_mlp_layout_build's
 * layout (U = moe_mlp_layout_num_blocks of the routing); blocks U .. num_blocks-1 serve expert E-1 and
 * hold only padding (the MLP reads nothing for them).  num_blocks_used (or NULL) receives U; num_dropped
 * as for moe_mlp_layout_build.  MOE_BACKEND_REF: host arrays, stream ignored.  MOE_BACKEND_CUDA: every
 * array (num_blocks_used and num_dropped too) on the device, queued on options.stream without waiting;
 * the ids are checked on the device (in range, distinct within a token) and on a violation nothing is
 * written and moe_backend_synchronize reports the host builder's status and message. */
moe_status moe_mlp_layout_build_on(moe_backend backend, moe_mlp_layout_kind kind, int64_t num_tokens, int64_t topk,
                                   int64_t num_experts, const int64_t *topk_ids, const void *topk_weights,
                                   int64_t num_blocks, int64_t *block_to_expert, int64_t *token_position_to_id,
                                   void *affinities, int64_t *num_dropped, int64_t *num_blocks_used,
                                   const moe_mlp_options *options);

/* Checks a caller-made host layout against options (block size, padding convention,
 * tensor_update_overwrite): dimensions, block_to_expert in range, every id a token or the padding mark,
 * each (token, expert) pair at most once, and with tensor_update_overwrite each token at most once.
 * moe_mlp_fwd and moe_mlp_bwd run the same check (MOE_BACKEND_REF). */
moe_status moe_mlp_layout_validate(const moe_mlp_layout *layout, const moe_mlp_options *options);

/* ----------------------------------------------------------------------------------------------------
 * Forward and backward.  MOE_BACKEND_CUDA (gpu/mlp/) takes device pointers, runs on
 * options.stream and returns without waiting; it checks the layout's contents on the device and, on a
 * violation, writes nothing and reports the reference's status and message through
 * moe_backend_synchronize(MOE_BACKEND_CUDA, stream).  Results have the reference's contract (not its
 * bits: the float32 summation orders differ) and are bitwise reproducible run to run.  No output may
 * overlap another argument, the layout's two arrays included (refused with MOE_ERR_INVALID_OPTION).
 * -------------------------------------------------------------------------------------------------- */

/* out = the blockwise MoE MLP of hidden.  b_gu and b_d must be given exactly when options.bias is set.
 * gate_up_ckpt_T and down_ckpt may each be NULL (not written, e.g. for inference).  options.accumulate
 * and options.grad_fp32 belong to the backward and are refused here. */
moe_status moe_mlp_fwd(moe_backend backend, const moe_mlp_layout *layout, int64_t hidden_size,
                       int64_t intermediate_size, const void *hidden, const void *affinities,
                       const void *w_gu, const void *w_d, const void *b_gu, const void *b_d, void *out,
                       void *gate_up_ckpt_T, void *down_ckpt, const moe_mlp_options *options);

/* Every gradient of SEMANTICS section 3 from the forward's checkpoints.
 *   gate_up_ckpt_T   required
 *   down_ckpt        required with MOE_AFFINITY_ON_H; with MOE_AFFINITY_ON_I optional (when NULL, d
 *                    is recomputed in float32 from gate_up_ckpt_T, w_d and b_d for the affinity grad)
 *   b_d              read only with options.bias, MOE_AFFINITY_ON_I and down_ckpt == NULL (required
 *                    then, otherwise ignored and may be NULL)
 *   d_b_gu, d_b_d    given exactly when options.bias is set
 * All other inputs and outputs are required (NULL only when empty). */
moe_status moe_mlp_bwd(moe_backend backend, const moe_mlp_layout *layout, int64_t hidden_size,
                       int64_t intermediate_size, const void *hidden, const void *affinities,
                       const void *w_gu, const void *w_d, const void *b_d, const void *gate_up_ckpt_T,
                       const void *down_ckpt, const void *out_grad, void *d_hidden, void *d_affinities,
                       void *d_w_gu, void *d_w_d, void *d_b_gu, void *d_b_d, const moe_mlp_options *options);

#ifdef __cplusplus
}
#endif

#endif /* LIBMOE_MOE_MLP_H */
