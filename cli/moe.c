/*
 * moe: run libmoe's ops on NumPy .npy files and compare results (issue 6).
 *
 *   moe gemm-fwd | gemm-dx | gemm-dw | route | compare | mlp-fwd | mlp-bwd | autotune   (see `moe --help`)
 *
 * Exit codes: 0 success (compare: every tensor within its tolerance), 1 compare found a tensor over its
 * tolerance, 2 any error (bad usage, unreadable or refused file, refused call); errors go to stderr.
 */
#include "moe.h"
#include "moe_mlp.h"
#include "npy.h"
#include "oracle.h"
#include "outputs.h"
#ifdef MOE_CLI_CUDA
#include "device.h"
#endif

#include <dirent.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

enum { EXIT_MISMATCH = 1, EXIT_USAGE = 2 };
#define MAX_OPTS 32

/* ---------------------------------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------------------------------- */
static char current_command[32] = "moe";

static _Noreturn void die(const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "%s: ", current_command);
    vfprintf(stderr, fmt, args);
    fprintf(stderr, "\n");
    va_end(args);
    exit(EXIT_USAGE);
}

/* Every heap block the tool holds is owned by this registry and freed at exit (also after die()), so
 * that the tool is leak-free under AddressSanitizer: xmalloc and own() register, xrealloc moves, xfree
 * unregisters. */
static void **owned;
static size_t num_owned, cap_owned;

static void free_owned(void)
{
    for (size_t i = 0; i < num_owned; i++)
        free(owned[i]);
    free(owned);
    owned = NULL;
    num_owned = cap_owned = 0;
}

static void own(void *p)
{
    if (p == NULL)
        return;
    if (num_owned == cap_owned) {
        size_t cap = cap_owned ? 2 * cap_owned : 64;
        void **bigger = realloc(owned, cap * sizeof *owned);
        if (bigger == NULL) {
            free(p);
            die("out of memory");
        }
        if (owned == NULL)
            atexit(free_owned);
        owned = bigger;
        cap_owned = cap;
    }
    owned[num_owned++] = p;
}

/* The registry slot of p (the newest first: blocks are mostly freed soon after they are made). */
static size_t owned_slot(const void *p)
{
    for (size_t i = num_owned; i-- > 0;)
        if (owned[i] == p)
            return i;
    fprintf(stderr, "moe: internal error: freeing a block the tool does not own\n");
    abort();
}

static void xfree(void *p)
{
    if (p == NULL)
        return;
    const size_t i = owned_slot(p);
    owned[i] = owned[--num_owned];
    free(p);
}

static void *xmalloc(size_t count, size_t size)
{
    if (size != 0 && count > SIZE_MAX / size)
        die("out of memory (%zu x %zu bytes)", count, size);
    const size_t bytes = count * size;
    void *p = malloc(bytes ? bytes : 1);
    if (p == NULL)
        die("out of memory (%zu bytes)", bytes);
    own(p);
    return p;
}

static void *xrealloc(void *p, size_t count, size_t size)
{
    if (size != 0 && count > SIZE_MAX / size)
        die("out of memory (%zu x %zu bytes)", count, size);
    const size_t i = owned_slot(p), bytes = count * size;
    void *bigger = realloc(p, bytes != 0 ? bytes : 1);
    if (bigger == NULL)
        die("out of memory (%zu bytes)", bytes);
    owned[i] = bigger;
    return bigger;
}

/* a * b * c elements, refusing products past 64 bits (e.g. an (M, 0) input with a huge M) */
static size_t elements(int64_t a, int64_t b, int64_t c)
{
    if (a < 0 || b < 0 || c < 0 || (a != 0 && b > INT64_MAX / a) || (a * b != 0 && c > INT64_MAX / (a * b)) ||
        (uint64_t)(a * b * c) > SIZE_MAX / 8)
        die("an output of %lld x %lld x %lld elements is too large", (long long)a, (long long)b, (long long)c);
    return (size_t)(a * b * c);
}

/* ---------------------------------------------------------------------------------------------------
 * Commands and their options
 * ------------------------------------------------------------------------------------------------- */
typedef struct opt {
    const char *name; /* "--x" */
    const char *arg;  /* "X.npy", or NULL for a flag without value */
    const char *help;
} opt;

struct args;
typedef struct command {
    const char *name;
    const char *usage;   /* what follows "moe NAME" */
    const char *summary; /* one line */
    const char *details; /* paragraphs printed before the options */
    const opt *opts;     /* terminated by {NULL} */
    int positionals;     /* exact number of positional arguments */
    int (*run)(const struct args *);
} command;

typedef struct args {
    const command *cmd;
    const char *value[MAX_OPTS];
    const char *pos[4];
    int npos;
} args;

#define OPT_DTYPE                                                                                      \
    {"--dtype", "f32|f16|bf16",                                                                        \
     "the computation dtype: every input is converted to it on load (rounded once to nearest even), "   \
     "the library runs in it and the result is rounded to it. Default: f16 when every floating input is " \
     "a float16 .npy, else f32. Needed for uint16/void16 files, which hold bf16 (--dtype bf16) or f16 " \
     "(--dtype f16) bit patterns."}
#define OPT_TF32                                                                                       \
    {"--allow-tf32", NULL,                                                                             \
     "with --dtype f32: allow TF32 tensor cores on the CUDA backend (fwd, dx and dw without topk "      \
     "weights; the reference stays true fp32); --bound-out then includes TF32's rounding. Refused "     \
     "with f16 and bf16."}
#define OPT_BACKEND                                                                                    \
    {"--backend", "ref|cuda",                                                                          \
     "ref (default): the CPU reference. cuda: the library's CUDA kernels on the first GPU: every input " \
     "is copied to the device, every output buffer is filled with NaN bytes (0xFF) before the call and " \
     "copied back after it; an error the device detects (e.g. a bad routing index) is a refused call. " \
     "Exits with status 2 when this build has no CUDA backend or no CUDA device is visible."}
#define OPT_RAW                                                                                        \
    {"--raw", NULL,                                                                                    \
     "write outputs in the computation dtype instead of float32: f16 as float16 '<f2', bf16 as uint16 " \
     "'<u2' bit patterns (torch.from_numpy(a.view(np.int16)).view(torch.bfloat16) reads them)."}
#define OPT_BOUND_OUT                                                                                  \
    {"--bound-out", "B.npy",                                                                           \
     "also write, as float64 with the output's shape, the float64 oracle's error bound of every output " \
     "element (SEMANTICS section 4): a correct float32-accumulating implementation is within it of the " \
     "exact result from the same rounded inputs. Pass it to `moe compare --bound`."}
#define OPT_ROUTING                                                                                    \
    {"--m-sizes", "M.npy",                                                                             \
     "rows per expert, shape (E,), int32 or int64. E is the number of experts, M = sum = T*k the number " \
     "of routed rows."},                                                                               \
    {"--gather", "G.npy",                                                                              \
     "gather_indices, shape (M,), int32 or int64: expert-order row r holds slot G[r] = t*k + j, token " \
     "t = G[r] / k (moe route writes it). Needed by --permute-x, --permute-y, --topk-weights and "      \
     "--reduce-topk; give --topk with it."},                                                           \
    {"--topk", "K", "experts per token k >= 1 (required with --gather; default 1). T = M / k tokens."}, \
    {"--permute-x", NULL,                                                                              \
     "the forward gathered X on load: X is token order, shape (T, K), and row r reads X[G[r] / k]. "    \
     "For gemm-dx: dX is written in slot order (row G[r])."},                                          \
    {"--permute-y", NULL,                                                                              \
     "the forward scattered Y on store: Y and dY are in slot order, row r at G[r]."},                  \
    {"--topk-weights", "TW.npy",                                                                       \
     "routing weights in slot order, shape (M,) or (T, k): the forward scaled row r by TW[G[r]] "      \
     "(in float32 before the single rounding); gemm-dx and gemm-dw scale the dY source row the same way."}

static const opt gemm_fwd_opts[] = {
    {"--x", "X.npy",
     "input activations, shape (M, K) in expert order, or (T, K) with --permute-x. Leading dimensions "
     "may be split (e.g. (B, S, K) for T = B*S)."},
    {"--w", "W.npy", "expert weights, shape (E, N, K): Y row = X row . W[e]^T."},
    OPT_ROUTING,
    OPT_DTYPE,
    OPT_TF32,
    OPT_BACKEND,
    {"--out", "Y.npy", "where to write Y, shape (M, N): expert order, or slot order with --permute-y."},
    OPT_RAW,
    OPT_BOUND_OUT,
    {NULL, NULL, NULL},
};

static const opt gemm_dx_opts[] = {
    {"--dy", "DY.npy",
     "output gradient, shape (M, N): expert order, or slot order with --permute-y. Leading dimensions "
     "may be split."},
    {"--w", "W.npy", "expert weights, shape (E, N, K)."},
    OPT_ROUTING,
    {"--reduce-topk", NULL,
     "sum the k rows of each token: write dX of shape (T, K), dX[t] = sum_j dXslot[t*k + j] (needs --gather)."},
    OPT_DTYPE,
    OPT_TF32,
    OPT_BACKEND,
    {"--out", "DX.npy",
     "where to write dX, shape (M, K) (expert order, or slot order with --permute-x), or (T, K) with "
     "--reduce-topk."},
    OPT_RAW,
    OPT_BOUND_OUT,
    {NULL, NULL, NULL},
};

static const opt gemm_dw_opts[] = {
    {"--x", "X.npy", "the forward's input, shape (M, K), or (T, K) with --permute-x. Leading dimensions may be split."},
    {"--dy", "DY.npy", "output gradient, shape (M, N), slot order with --permute-y. Leading dimensions may be split."},
    OPT_ROUTING,
    {"--dw-fp32", NULL, "round dW (and the topk-weight gradient) to float32 instead of the computation dtype."},
    OPT_DTYPE,
    OPT_TF32,
    OPT_BACKEND,
    {"--out", "DW.npy", "where to write dW, shape (E, N, K); experts without rows get zeros."},
    {"--w", "W.npy", "expert weights, shape (E, N, K): only for --out-topk-weights-grad."},
    {"--out-topk-weights-grad", "DTW.npy",
     "also write the gradient of the fused topk weights, slot order: d[G[r]] = <dY source row "
     "(unweighted), X row . W[e]^T>. Needs --w and --gather. Shape (T, k), or the shape of --topk-weights."},
    OPT_RAW,
    OPT_BOUND_OUT,
    {NULL, NULL, NULL},
};

static const opt route_opts[] = {
    {"--topk-ids", "IDS.npy", "the router's choices, shape (T, k) (or (T,) for k = 1), int32 or int64, values in [0, E)."},
    {"--experts", "E", "the number of experts E >= 1."},
    {"--out", "DIR",
     "folder to write m_sizes.npy (E,), gather_indices.npy (M,) and scatter_indices.npy (M,) into, all "
     "int64; created if missing. gather_indices is the stable sort of the flattened ids by expert; "
     "scatter_indices its inverse."},
    {"--block-size", "B",
     "also write the blockwise layout of the MoE MLP (moe_mlp_layout_build) with blocks of B >= 1 "
     "positions: token_position_to_id.npy (N*B,) and block_to_expert.npy (N,), int64, the files "
     "`moe mlp-fwd` and `moe mlp-bwd` read. Blocks are ordered by expert, tokens ascend within an "
     "expert. Dropless (the default): ceil(m_e / B) blocks per expert, none for an expert without "
     "tokens; the last block of an expert is padded at the tail. Prints N."},
    {"--dropping", NULL,
     "dropping layout instead: exactly one block of capacity B per expert (N = E); an expert keeps its "
     "first B tokens in ascending order and drops the others. Prints the number of dropped (token, "
     "expert) pairs. B is --block-size, default 128."},
    {"--padding", "skip|row",
     "how an empty position of token_position_to_id is marked: skip (default) -1, row T (the MLP's "
     "token tensors then have T + 1 rows). Needs --block-size or --dropping."},
    {"--topk-weights", "TW.npy",
     "the router's weights, shape (T, k) (or (T*k,)), floating: also write expert_affinities_masked.npy "
     "(T*E,), A[t*E + e] = the weight of every (token, expert) pair the layout holds, 0 for every other "
     "pair (dropped pairs included). Float32 unless --raw. Needs --block-size or --dropping."},
    OPT_DTYPE,
    OPT_RAW,
    {NULL, NULL, NULL},
};

static const opt compare_opts[] = {
    {"--dtype", "f32|f16|bf16|f64",
     "the dtype whose rounding the tolerance allows (and how uint16/void16 files are decoded: bf16 or "
     "f16 bit patterns). Default: f16 if either file is float16, f64 if both are float64, else f32 "
     "(float32 files holding bf16 results need --dtype bf16). Two integer files are compared exactly."},
    {"--reduction-length", "L",
     "also allow float32 accumulation over L terms: tolerance 2*(g(L)*m + u*(m + g(L)*m) + eta) with "
     "g(L) = L*2^-24/(1 - L*2^-24) and m = max(|a|,|b|), the bound of SEMANTICS section 4 with the sum "
     "of |terms| taken as m. That holds when the terms do not cancel; where they do, use --bound."},
    {"--bound", "B.npy|DIR",
     "per-element bounds written by a gemm command's --bound-out: tolerance 2*B (A and B are each "
     "within B of the exact result). With folders: DIR/NAME.npy where it exists."},
    {"--exact", NULL, "tolerance 0: every element must be equal (NaN equals NaN)."},
    {"--atol", "X", "absolute tolerance: tolerance atol + rtol*max(|a|,|b|) replaces the derived one."},
    {"--rtol", "X", "relative tolerance, with or without --atol."},
    {NULL, NULL, NULL},
};

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
    {"--round-intermediates", NULL,                                                                    \
     "f16/bf16 (options.round_intermediates): round the operands of the second-stage GEMMs once to "    \
     "the dtype, as NKI and torch keep them: m before the down projection, a*grad (the down "          \
     "projection's gradient) and the gate/up gradients dg, du. Give it to both mlp-fwd and mlp-bwd. "   \
     "No effect in f32. With --backend cuda: every GEMM on tensor cores (the fast path)."},           \
    OPT_DTYPE,                                                                                         \
    OPT_BACKEND,                                                                                       \
    OPT_RAW

static const opt mlp_fwd_opts[] = {
    {"--in", "DIR", "folder of the inputs, NKI's parameter names (see above)."},
    {"--out", "DIR",
     "folder to write output.npy and the checkpoints into (created if missing; may be --in, so that "
     "mlp-bwd --in finds the checkpoints there)."},
    OPT_MLP,
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
    {NULL, NULL, NULL},
};

static int run_gemm_fwd(const args *a);
static int run_gemm_dx(const args *a);
static int run_gemm_dw(const args *a);
static int run_route(const args *a);
static int run_compare(const args *a);
static int run_mlp_fwd(const args *a);
static int run_mlp_bwd(const args *a);
static int run_autotune(const args *a);


static const opt autotune_opts[] = {
    {"--op", "fwd|dx|dw", "the grouped GEMM to tune: moe_gemm_fwd, moe_gemm_dx or moe_gemm_dw."},
    {"--tokens", "T", "tokens T >= 1."},
    {"--topk", "K", "experts per token k, 1 <= k <= E (default 1): each token gets k distinct experts, uniformly at random."},
    {"--experts", "E", "experts E >= 1."},
    {"--n", "N", "the forward's output features N (a multiple of 8 for the tensor-core kernels)."},
    {"--k", "K", "the forward's input features K (a multiple of 8 for the tensor-core kernels)."},
    {"--dtype", "f32|f16|bf16", "the call's dtype (default bf16)."},
    {"--permute-x", NULL, "tune the call with X in token order (gather on load; dx: dX written in slot order)."},
    {"--permute-y", NULL, "tune the call with Y / dY in slot order."},
    {"--reduce-topk", NULL, "dx: tune the call that sums each token's k rows."},
    {"--topk-weights", NULL, "tune the call with fused topk weights (random, slot order)."},
    {"--dw-fp32", NULL, "dw: tune the call that writes dW in float32."},
    {"--allow-tf32", NULL, "with --dtype f32: tune the call that allows TF32 tensor cores."},
    {"--repeats", "R", "timed runs per candidate, 1 .. 1000 (default 20); the median decides."},
    {"--seed", "S", "seed of the random routing and data (default 1)."},
    {"--cache", "FILE",
     "the autotune cache file to append the choice to (created if missing); load it in the training process "
     "with moe_gemm_autotune_load(FILE)."},
    {NULL, NULL, NULL},
};

static const command commands[] = {
    {"gemm-fwd",
     "--x X.npy --w W.npy --m-sizes M.npy [--gather G.npy --topk K] [--permute-x] [--permute-y] "
     "[--topk-weights TW.npy] [--dtype f32|f16|bf16] [--allow-tf32] [--backend ref|cuda] --out Y.npy [--raw] [--bound-out B.npy]",
     "grouped GEMM forward: Y = X . W[e]^T per expert (moe_gemm_fwd)",
     "For expert-order row r of expert e: y_r = xsrc_r . W[e]^T, accumulated in float32 and rounded once "
     "(SEMANTICS section 2). Rows [off_e, off_e + m_e) belong to expert e.",
     gemm_fwd_opts, 0, run_gemm_fwd},
    {"gemm-dx",
     "--dy DY.npy --w W.npy --m-sizes M.npy [--gather G.npy --topk K] [--permute-x] [--permute-y] "
     "[--topk-weights TW.npy] [--reduce-topk] [--dtype ...] [--allow-tf32] [--backend ...] --out DX.npy [--raw] [--bound-out B.npy]",
     "grouped GEMM input gradient: dX = dY . W[e] per expert (moe_gemm_dx)",
     "The routing flags describe the forward whose gradient this is: --permute-y reads dY in slot order, "
     "--permute-x writes dX in slot order, --topk-weights scales each dY source row.",
     gemm_dx_opts, 0, run_gemm_dx},
    {"gemm-dw",
     "--x X.npy --dy DY.npy --m-sizes M.npy [--gather G.npy --topk K] [--permute-x] [--permute-y] "
     "[--topk-weights TW.npy] [--dw-fp32] [--dtype ...] [--allow-tf32] [--backend ...] --out DW.npy "
     "[--w W.npy --out-topk-weights-grad DTW.npy] [--raw] [--bound-out B.npy]",
     "grouped GEMM weight gradient: dW[e] = sum over rows of dY^T (x) X (moe_gemm_dw)",
     "dW[e] sums, over the rows r of expert e, dysrc_r^T (x) xsrc_r, with the sources chosen by the "
     "forward's routing flags; float32 accumulation over all rows of the expert, one rounding.",
     gemm_dw_opts, 0, run_gemm_dw},
    {"route",
     "--topk-ids IDS.npy --experts E [--block-size B] [--dropping] [--padding skip|row] "
     "[--topk-weights TW.npy [--dtype ...] [--raw]] --out DIR",
     "routing arrays and MLP block layouts from the router's top-k choices",
     "Writes the routing the gemm commands read (moe_routing_from_topk: --m-sizes DIR/m_sizes.npy "
     "--gather DIR/gather_indices.npy --topk k). With --block-size or --dropping also the blockwise layout "
     "the mlp commands read (moe_mlp_layout_build: token_position_to_id.npy, block_to_expert.npy, and "
     "with --topk-weights expert_affinities_masked.npy), and prints the number of blocks N and, for "
     "--dropping, the number of dropped (token, expert) pairs.",
     route_opts, 0, run_route},
    {"compare", "A B [--dtype f32|f16|bf16|f64] [--reduction-length L | --bound B.npy | --exact | --atol X --rtol X]",
     "compare two .npy files, or every .npy file of folder A with the same name in folder B",
     "Prints per tensor its shape, the max abs error |a-b|, the max relative error |a-b|/max(|a|,|b|), "
     "the worst element (the largest |a-b| / tolerance) with both values, and a verdict. Exit status 1 "
     "when any tensor has an element over its tolerance, differs in shape, or is missing from B.\n\n"
     "Default tolerance, per element: |a-b| <= 2*(u*max(|a|,|b|) + eta), u the dtype's unit roundoff "
     "(2^-24 f32, 2^-11 f16, 2^-8 bf16, 2^-53 f64) and eta half its smallest subnormal. Why: two correct "
     "results of one computation are each the rounding of (nearly) the same exact value, so they may "
     "differ by one rounding each, never more; that is the loosest claim that holds without knowing "
     "how the values were computed. It suits 16-bit results, where one output rounding outweighs the "
     "float32 accumulation error. For float32 results of long reductions use --reduction-length L, or "
     "better --bound with the per-element bound a gemm command writes with --bound-out (it knows the "
     "sum of |terms| and so is exact where terms cancel).\n\n"
     "NaN equals NaN at the same place; a NaN against a number, and an Inf against anything else, fail. "
     "Files in B that A does not have are listed and not compared.",
     compare_opts, 2, run_compare},
    {"mlp-fwd",
     "--in DIR --out DIR [--block-size B] [--activation silu|gelu|gelu_tanh|swish] [--affinity-on h|i] "
     "[--bias] [--clamp NL_LO,NL_HI,LIN_LO,LIN_HI] [--padding skip|row] [--no-accumulate] "
     "[--round-intermediates] [--dtype f32|f16|bf16] [--backend ref|cuda] [--raw]",
     "blockwise MoE MLP forward with checkpoints (moe_mlp_fwd, NKI blockwise_mm semantics)",
     "Per position p = n*B + b of block n, token t = token_position_to_id[p], expert e = "
     "block_to_expert[n], a = A[t*E + e]: g, u = x_t . W_gu[e] (+ b_gu[e]), clamped; m = act(g)*u; d = "
     "m . W_d[e] (+ b_d[e]); out_t += a*d (SEMANTICS section 3, specs/MLP.md). Padding positions are "
     "empty; rows of tokens in no block are 0.\n\n"
     "--in DIR holds (NKI's parameter names; T tokens, E experts, H hidden, I intermediate, N blocks of "
     "B positions; T1 = T + 1 with --padding row, else T):\n"
     "  hidden_states.npy (T1, H)\n"
     "  expert_affinities_masked.npy (T*E,), or NKI's (T*E, 1), or (T, E)\n"
     "  gate_up_proj_weight.npy (E, H, 2, I): [:, :, 0] gate, [:, :, 1] up\n"
     "  down_proj_weight.npy (E, I, H)\n"
     "  gate_up_proj_bias.npy (E, 2, I), down_proj_bias.npy (E, H): only with --bias\n"
     "  token_position_to_id.npy (N*B,) or (N, B), int32/int64: a token, or the padding mark\n"
     "  block_to_expert.npy (N,), int32/int64\n"
     "(`moe route --block-size B --topk-weights TW.npy` writes the last three). Extra trailing "
     "dimensions of size 1 are accepted everywhere (NKI's [N, 1] block_to_expert). --out DIR gets:\n"
     "  output.npy (T1, H)\n"
     "  gate_up_proj_act_checkpoint_T.npy (N, 2, I, B): g and u after bias and clamp\n"
     "  down_proj_act_checkpoint.npy (N, B, H): d before the affinity\n"
     "in the computation dtype's values (float32 files unless --raw). Every shape is checked against "
     "the others before anything is written.",
     mlp_fwd_opts, 0, run_mlp_fwd},
    {"mlp-bwd",
     "--in DIR --out DIR [--block-size B] [--activation ...] [--affinity-on h|i] [--bias] [--clamp ...] "
     "[--padding skip|row] [--no-accumulate] [--round-intermediates] [--grad-fp32] [--dtype ...] [--backend ...] "
     "[--raw]",
     "blockwise MoE MLP backward from the forward's checkpoints (moe_mlp_bwd)",
     "Every gradient of SEMANTICS section 3 (NKI blockwise_mm_bwd), from the checkpoints the forward "
     "wrote; give the options the forward ran with, --dtype included: the forward writes float32 files "
     "unless --raw, and without --dtype float32 inputs mean an f32 run.\n\n"
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
     "every pair of the layout, 0 for every other\n"
     "  gate_up_proj_weight_grad.npy (E, H, 2, I), down_proj_weight_grad.npy (E, I, H)\n"
     "  gate_up_proj_bias_grad.npy (E, 2, I), down_proj_bias_grad.npy (E, H): with --bias\n"
     "Gradients are written fresh (the library's options.accumulate is not offered: add them up with "
     "NumPy).",
     mlp_bwd_opts, 0, run_mlp_bwd},
    {"autotune",
     "--op fwd|dx|dw --tokens T [--topk K] --experts E --n N --k K [--dtype ...] [--permute-x] [--permute-y] "
     "[--reduce-topk] [--topk-weights] [--dw-fp32] [--allow-tf32] [--repeats R] [--seed S] --cache FILE",
     "time the CUDA kernel candidates of one grouped GEMM shape and cache the fastest (moe_gemm_autotune)",
     "Makes a uniformly random routing of T tokens to k distinct experts of E and random inputs (uniform "
     "in [-1, 1), rounded to the dtype) on the first GPU, runs moe_gemm_autotune on that call, prints how "
     "many distinct configurations it timed and the one it kept, and appends the choice to --cache. The choice is keyed by the GPU's name, the op, the dtypes, the flags and (E, T*k, "
     "N, K): a training process that calls moe_gemm_autotune_load(FILE) then runs every call of that key "
     "with it. Needs a CUDA build and device (exit 2 otherwise). MOE_AUTOTUNE_VERBOSE=1 prints each "
     "candidate's median.",
     autotune_opts, 0, run_autotune},
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

static const char general_help[] =
    "Files: NumPy .npy, format 1.0, 2.0 or 3.0, little-endian, C order. Floating inputs may be float16,\n"
    "float32 or float64 (converted to the computation dtype, rounded once to nearest even), or uint16 /\n"
    "2-byte void (ml_dtypes.bfloat16) bit patterns with --dtype bf16 or --dtype f16. Index inputs are\n"
    "int32 or int64. Fortran order, big-endian data, object (pickled) and structured arrays are refused,\n"
    "as is any file whose shape or dtype does not fit, with a message naming the file, the expected and\n"
    "the found shape and dtype.\n"
    "Outputs are float32 (bf16 and f16 results convert exactly) unless --raw asks for the computation\n"
    "dtype; index outputs are int64.\n"
    "Inputs must be regular files (a folder, FIFO or device is refused at once). A command writes all its\n"
    "outputs or none: each goes to a temporary file beside it, and all are renamed into place once every\n"
    "one is complete, so a command that fails changes no existing file. Two outputs naming one file, an\n"
    "output naming an input, and an output that exists but is no regular file are refused before\n"
    "anything is read.\n"
    "\n"
    "Exit status: 0 success; 1 `moe compare` found a difference over its tolerance; 2 an error (usage,\n"
    "an unreadable or refused file, a call the library refused). Errors go to stderr.\n";

/* ---------------------------------------------------------------------------------------------------
 * Help
 * ------------------------------------------------------------------------------------------------- */
/* Prints text word-wrapped to `width` columns.  The cursor is at column `column`; it moves to `indent`
 * first if it is left of it, and every further line starts at `indent`.  A '\n' in text breaks the line. */
static void print_wrapped(FILE *out, const char *text, int column, int indent, int width)
{
    if (column < indent) {
        fprintf(out, "%*s", indent - column, "");
        column = indent;
    }
    const char *p = text;
    int line_start = 1;
    while (*p) {
        if (*p == '\n') {
            fprintf(out, "\n%*s", indent, "");
            column = indent;
            line_start = 1;
            p++;
            continue;
        }
        if (*p == ' ') {
            p++;
            continue;
        }
        size_t len = strcspn(p, " \n");
        if (!line_start && column + 1 + (int)len > width) {
            fprintf(out, "\n%*s", indent, "");
            column = indent;
            line_start = 1;
        }
        if (!line_start) {
            fputc(' ', out);
            column++;
        }
        fwrite(p, 1, len, out);
        column += (int)len;
        line_start = 0;
        p += len;
    }
    fputc('\n', out);
}

static void print_command_help(FILE *out, const command *c)
{
    char head[64];
    int n = snprintf(head, sizeof head, "usage: moe %s ", c->name);
    fputs(head, out);
    print_wrapped(out, c->usage, n, 8, 100);
    fprintf(out, "\n");
    print_wrapped(out, c->summary, 0, 2, 100);
    fprintf(out, "\n");
    print_wrapped(out, c->details, 0, 2, 100);
    if (c->opts[0].name != NULL)
        fprintf(out, "\noptions:\n");
    for (const opt *o = c->opts; o->name != NULL; o++) {
        char left[64];
        n = snprintf(left, sizeof left, "  %s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
        fputs(left, out);
        const int column = 30;
        if (n + 2 > column) {
            fputc('\n', out);
            n = 0;
        }
        print_wrapped(out, o->help, n, column, 100);
    }
    fprintf(out, "  %-28s%s\n", "--help, -h", "print this help and exit");
}

static void print_usage(FILE *out)
{
    fprintf(out, "usage: moe COMMAND [options]       (moe COMMAND --help for one command)\n\ncommands:\n");
    for (size_t i = 0; i < NCOMMANDS; i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
}

static void print_full_help(FILE *out)
{
    fprintf(out, "moe %d.%d.%d: run libmoe's ops on NumPy .npy files with the CPU reference, and compare results.\n\n",
            LIBMOE_VERSION_MAJOR, LIBMOE_VERSION_MINOR, LIBMOE_VERSION_PATCH);
    print_usage(out);
    fprintf(out, "\n%s", general_help);
    for (size_t i = 0; i < NCOMMANDS; i++) {
        fprintf(out, "\n----------------------------------------------------------------------------------------------------\n");
        print_command_help(out, &commands[i]);
    }
}

/* ---------------------------------------------------------------------------------------------------
 * Argument parsing
 * ------------------------------------------------------------------------------------------------- */
static int opt_index(const command *c, const char *name)
{
    for (int i = 0; c->opts[i].name != NULL; i++)
        if (strcmp(c->opts[i].name, name) == 0)
            return i;
    return -1;
}

/* The value of an option (or "" for a given flag), NULL when absent. */
static const char *get(const args *a, const char *name)
{
    int i = opt_index(a->cmd, name);
    if (i < 0) {
        fprintf(stderr, "internal error: %s has no option %s\n", a->cmd->name, name);
        abort();
    }
    return a->value[i];
}

static const char *need(const args *a, const char *name)
{
    const char *v = get(a, name);
    if (v == NULL) {
        int i = opt_index(a->cmd, name);
        die("missing required option %s %s (see moe %s --help)", name, a->cmd->opts[i].arg, a->cmd->name);
    }
    if (v[0] == '\0') /* an empty folder name would put "/NAME" files at the root */
        die("option %s is empty (see moe %s --help)", name, a->cmd->name);
    return v;
}

static void parse_args(const command *c, int argc, char **argv, args *a)
{
    memset(a, 0, sizeof *a);
    a->cmd = c;
    int only_positional = 0;
    for (int i = 0; i < argc; i++) {
        const char *s = argv[i];
        if (!only_positional && (strcmp(s, "--help") == 0 || strcmp(s, "-h") == 0)) {
            print_command_help(stdout, c);
            exit(0);
        }
        if (!only_positional && strcmp(s, "--") == 0) {
            only_positional = 1;
            continue;
        }
        if (!only_positional && s[0] == '-' && s[1] != '\0') {
            char name[64];
            const char *eq = strchr(s, '=');
            size_t len = eq ? (size_t)(eq - s) : strlen(s);
            if (len >= sizeof name)
                len = sizeof name - 1;
            memcpy(name, s, len);
            name[len] = '\0';
            int k = opt_index(c, name);
            if (k < 0)
                die("unknown option '%s' (see moe %s --help)", name, c->name);
            if (a->value[k] != NULL)
                die("option %s is given twice", name);
            if (c->opts[k].arg == NULL) {
                if (eq != NULL)
                    die("option %s takes no value", name);
                a->value[k] = "";
            } else if (eq != NULL) {
                a->value[k] = eq + 1;
            } else {
                if (i + 1 >= argc)
                    die("option %s needs a value: %s %s", name, name, c->opts[k].arg);
                a->value[k] = argv[++i];
            }
            continue;
        }
        if (a->npos >= c->positionals)
            die("unexpected argument '%s' (see moe %s --help)", s, c->name);
        a->pos[a->npos++] = s;
    }
    if (a->npos != c->positionals)
        die("expected %d file or folder arguments, got %d (see moe %s --help)", c->positionals, a->npos, c->name);
}

static int64_t parse_int_arg(const char *flag, const char *s, int64_t min)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (s[0] == '\0' || *end != '\0' || errno != 0 || v < min)
        die("%s %s: expected an integer >= %lld", flag, s, (long long)min);
    return (int64_t)v;
}

static double parse_double_arg(const char *flag, const char *s)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (s[0] == '\0' || *end != '\0' || errno != 0 || !(v >= 0) || isinf(v))
        die("%s %s: expected a finite number >= 0", flag, s);
    return v;
}

/* 1 and *dtype set when s names a dtype (moe_dtype_from_name: f32, f16, bf16 and their aliases), else 0. */
static int parse_dtype(const char *s, moe_dtype *dtype)
{
    return moe_dtype_from_name(s, dtype) == MOE_OK;
}

#ifdef MOE_CLI_CUDA
/* Dies unless a CUDA device is usable, with "<prefix>no CUDA device available (<why>)<suffix>". */
static void require_cuda_device(const char *prefix, const char *suffix)
{
    char why[512];
    if (device_available(why, sizeof why) != 0)
        die("%sno CUDA device available (%s)%s", prefix, why, suffix);
    if (!moe_backend_available(MOE_BACKEND_CUDA))
        die("%sno CUDA device available (moe_backend_available says no)%s", prefix, suffix);
}
#endif

/* The backend --backend names; dies when it is cuda and this build or this machine cannot run it. */
static moe_backend get_backend(const args *a)
{
    const char *b = get(a, "--backend");
    if (b == NULL || strcmp(b, "ref") == 0)
        return MOE_BACKEND_REF;
    if (strcmp(b, "cuda") != 0)
        die("--backend %s: expected ref or cuda", b);
#ifndef MOE_CLI_CUDA
    die("--backend cuda: this build has no CUDA backend (configure --with-cuda where the CUDA toolkit is "
        "installed); use --backend ref");
#else
    require_cuda_device("--backend cuda: ", "; use --backend ref");
    return MOE_BACKEND_CUDA;
#endif
}

/* ---------------------------------------------------------------------------------------------------
 * Loading and checking arrays
 * ------------------------------------------------------------------------------------------------- */
static char *shape_text(const npy_header *h)
{
    static char buf[4][512];
    static int next;
    char *b = buf[next++ % 4];
    return npy_format_shape(b, sizeof buf[0], h->ndim, h->shape);
}

static void load(const char *path, npy_array *array)
{
    char err[NPY_ERROR_SIZE];
    if (npy_read(path, array, err, sizeof err) != 0)
        die("%s", err);
    own(array->data);
}

/* Frees what load() read. */
static void release(npy_array *array)
{
    xfree(array->data);
    array->data = NULL;
}

/* Refuses an array that is not [rows][cols] (split leading dimensions allowed when `split`). */
static void check_matrix(const char *path, const npy_array *array, int64_t rows, int64_t cols, int split,
                         const char *why)
{
    const npy_header *h = &array->h;
    int ok = h->ndim >= 2 && h->shape[h->ndim - 1] == cols && (split || h->ndim == 2);
    if (ok) /* the leading dimensions multiply to count / cols */
        ok = cols == 0 ? h->ndim == 2 && h->shape[0] == rows : h->count / cols == rows;
    if (!ok)
        die("%s: expected shape (%lld, %lld)%s (%s), found %s %s", path, (long long)rows, (long long)cols,
            split ? " (leading dimensions may be split)" : "", why, shape_text(h), npy_type_name(h->type));
}

static void check_floating(const char *path, const npy_array *array)
{
    if (npy_type_is_int(array->h.type))
        die("%s: expected a floating-point array (float16, float32, float64, or uint16 bit patterns), found %s %s",
            path, shape_text(&array->h), npy_type_name(array->h.type));
}

static void *convert(const char *path, const npy_array *array, moe_dtype dtype)
{
    char err[NPY_ERROR_SIZE];
    void *out = xmalloc((size_t)array->h.count, moe_dtype_size(dtype));
    if (npy_to_dtype(array, path, dtype, out, NULL, err, sizeof err) != 0)
        die("%s", err);
    return out;
}

static int64_t *convert_int(const char *path, const npy_array *array)
{
    char err[NPY_ERROR_SIZE];
    int64_t *out = xmalloc((size_t)array->h.count, sizeof *out);
    if (npy_to_int64(array, path, out, err, sizeof err) != 0)
        die("%s, shape %s", err, shape_text(&array->h));
    return out;
}

/* The computation dtype: --dtype, else f16 when every floating input is float16, else f32. */
static moe_dtype choose_dtype(const args *a, const npy_array *const *arrays, const char *const *paths, int n)
{
    moe_dtype dtype = MOE_F32;
    const char *s = get(a, "--dtype");
    if (s != NULL) {
        if (!parse_dtype(s, &dtype))
            die("--dtype %s: expected f32, f16 or bf16", s);
        return dtype;
    }
    int all_f16 = 1, any = 0;
    for (int i = 0; i < n; i++) {
        if (arrays[i] == NULL)
            continue;
        check_floating(paths[i], arrays[i]);
        if (npy_type_is_pattern(arrays[i]->h.type))
            die("%s: holds %s 16-bit patterns; pass --dtype bf16 (bfloat16 bit patterns) or --dtype f16 to "
                "say what they are", paths[i], npy_type_name(arrays[i]->h.type));
        all_f16 &= arrays[i]->h.type == NPY_T_F16;
        any = 1;
    }
    return any && all_f16 ? MOE_F16 : MOE_F32;
}

/* ---------------------------------------------------------------------------------------------------
 * Claiming the files a command writes and reads, before it reads any (outputs.h)
 * ------------------------------------------------------------------------------------------------- */
/* Every file the command writes.  A command that fails (die) leaves every existing file as it was: the
 * outputs are written to temporary files, which discard_outputs removes at exit, and only
 * commit_outputs puts them in place. */
static output_set outputs;

static void discard_outputs(void) { outputs_discard(&outputs); }

static char *join_path(const char *dir, const char *name);

/* Registers path (NULL: none) as an output; refuses a file that another output names already. */
static void add_output(const char *path)
{
    char err[OUTPUTS_ERROR_SIZE];
    if (path != NULL && outputs_add(&outputs, path, err, sizeof err) != 0)
        die("%s", err);
}

/* Registers dir/names[i] for i < n as outputs; paths[i] gets dir/names[i]. */
static void add_outputs_in(const char *dir, const char *const *names, int n, char **paths)
{
    for (int i = 0; i < n; i++) {
        paths[i] = join_path(dir, names[i]);
        add_output(paths[i]);
    }
}

/* Refuses an input (NULL: none) that is also an output (register the outputs first). */
static void check_input(const char *path)
{
    char err[OUTPUTS_ERROR_SIZE];
    if (path != NULL && outputs_check_input(&outputs, path, err, sizeof err) != 0)
        die("%s", err);
}

/* Registers the files the options `outs` name as outputs, then checks those `ins` name as inputs
 * (NULL-terminated lists of option names; an option not given names no file). */
static void claim_files(const args *a, const char *const *outs, const char *const *ins)
{
    for (; *outs != NULL; outs++)
        add_output(get(a, *outs));
    for (; *ins != NULL; ins++)
        check_input(get(a, *ins));
}

/* ---------------------------------------------------------------------------------------------------
 * Routing
 * ------------------------------------------------------------------------------------------------- */
typedef struct routing_in {
    const char *m_path, *g_path;
    int64_t E, T, k, M;
    int64_t *m_sizes, *gather;
    moe_routing r;
} routing_in;

static void load_routing(const args *a, routing_in *ri)
{
    memset(ri, 0, sizeof *ri);
    ri->m_path = need(a, "--m-sizes");
    ri->g_path = get(a, "--gather");
    const char *topk = get(a, "--topk");
    if (ri->g_path != NULL && topk == NULL)
        die("--gather needs --topk K (experts per token: row r's token is G[r] / k)");
    ri->k = topk ? parse_int_arg("--topk", topk, 1) : 1;

    npy_array m;
    load(ri->m_path, &m);
    if (m.h.ndim != 1 || m.h.count < 1)
        die("%s: expected m_sizes of shape (E,) with E >= 1 experts, found %s %s", ri->m_path, shape_text(&m.h),
            npy_type_name(m.h.type));
    ri->E = m.h.count;
    ri->m_sizes = convert_int(ri->m_path, &m);
    release(&m);
    for (int64_t e = 0; e < ri->E; e++) {
        if (ri->m_sizes[e] < 0)
            die("%s: m_sizes[%lld] = %lld, expected >= 0", ri->m_path, (long long)e, (long long)ri->m_sizes[e]);
        if (ri->m_sizes[e] > INT64_MAX / 16 - ri->M)
            die("%s: the sum of m_sizes overflows", ri->m_path);
        ri->M += ri->m_sizes[e];
    }
    if (ri->M % ri->k != 0)
        die("%s: the rows sum to M = %lld, which --topk %lld does not divide (M = T*k)", ri->m_path,
            (long long)ri->M, (long long)ri->k);
    ri->T = ri->M / ri->k;

    if (ri->g_path != NULL) {
        npy_array g;
        load(ri->g_path, &g);
        if (g.h.ndim != 1 || g.h.count != ri->M)
            die("%s: expected gather_indices of shape (%lld,) (M = the sum of %s), found %s %s", ri->g_path,
                (long long)ri->M, ri->m_path, shape_text(&g.h), npy_type_name(g.h.type));
        ri->gather = convert_int(ri->g_path, &g);
        release(&g);
    }
    ri->r = (moe_routing){ri->T, ri->k, ri->E, ri->m_sizes, ri->gather};
    if (ri->gather != NULL && moe_routing_validate(&ri->r, 1) != MOE_OK)
        die("%s: %s", ri->g_path, moe_last_error());
}

static void require_gather(const routing_in *ri, const char *flag)
{
    if (ri->gather == NULL)
        die("%s needs --gather G.npy --topk K (the routing's gather_indices)", flag);
}

/* ---------------------------------------------------------------------------------------------------
 * Writing results
 * ------------------------------------------------------------------------------------------------- */
/* Writes an array into the temporary file of output `path` (add_output registered it); the file is put
 * in place by commit_outputs. */
static void write_array(const char *path, npy_type type, int ndim, const int64_t *shape, const void *data)
{
    char err[OUTPUTS_ERROR_SIZE], note[OUTPUTS_ERROR_SIZE], text[512];
    FILE *f = outputs_open(&outputs, path, err, sizeof err);
    if (f == NULL || npy_write_stream(f, path, type, ndim, shape, data, 0, err, sizeof err) != 0)
        die("%s", err);
    snprintf(note, sizeof note, "wrote %s: shape %s %s", path, npy_format_shape(text, sizeof text, ndim, shape),
             npy_type_name(type));
    if (outputs_close(&outputs, path, note, err, sizeof err) != 0)
        die("%s", err);
}

/* Puts every output of the command in place (all of them written: outputs_commit) and says what it
 * wrote.  Every command that writes calls it once, after its last write_array. */
static void commit_outputs(void)
{
    char err[OUTPUTS_ERROR_SIZE];
    if (outputs_commit(&outputs, err, sizeof err) != 0)
        die("%s", err);
    for (size_t i = 0; i < outputs.count; i++)
        if (outputs.file[i].note != NULL)
            printf("%s\n", outputs.file[i].note);
    outputs_discard(&outputs);
}

/* Writes a result of `dtype` as float32, or as the dtype itself with --raw. */
static void write_result(const args *a, const char *path, moe_dtype dtype, const void *data, int ndim,
                         const int64_t *shape)
{
    int64_t count = 1;
    for (int i = 0; i < ndim; i++)
        count *= shape[i];
    if (dtype == MOE_F32 || get(a, "--raw") != NULL) {
        write_array(path, dtype == MOE_F32 ? NPY_T_F32 : dtype == MOE_F16 ? NPY_T_F16 : NPY_T_U16, ndim, shape, data);
        return;
    }
    float *f = xmalloc((size_t)count, sizeof *f);
    for (int64_t i = 0; i < count; i++) {
        uint16_t bits = ((const uint16_t *)data)[i];
        f[i] = dtype == MOE_F16 ? moe_f16_to_f32(bits) : moe_bf16_to_f32(bits);
    }
    write_array(path, NPY_T_F32, ndim, shape, f);
    xfree(f);
}

static void library_failed(const char *call, moe_status status)
{
    die("%s refused the call: %s (%s)", call, moe_last_error(), moe_strerror(status));
}

/* One library call on the chosen backend.  With MOE_BACKEND_REF the arrays are the host buffers
 * themselves.  With MOE_BACKEND_CUDA (device pointers for every array, the routing and layout arrays
 * too) call_in gives a device copy of an input and call_out a device buffer of NaN bytes (0xFF) for an
 * output: no call of this tool accumulates into its outputs, so none has contents to upload.  call_end
 * reports a refused call, waits for the device (an error it detected is a refused call too), copies
 * the outputs back to their host buffers and frees every device buffer (die() frees them at exit). */
#define MAX_CALL_OUTPUTS 8
typedef struct call_output {
    const char *name;
    void *host, *dev;
    size_t bytes;
} call_output;
typedef struct lib_call {
    const char *name; /* the library function */
    moe_backend backend;
    int num_out;
    call_output out[MAX_CALL_OUTPUTS];
} lib_call;

static void *to_device(const lib_call *c, const void *host, size_t bytes, const char *name)
{
#ifdef MOE_CLI_CUDA
    char err[512];
    void *dev;
    if (device_upload(&dev, host, bytes, name, err, sizeof err) != 0)
        die("%s: %s", c->name, err);
    return dev;
#else
    (void)host, (void)bytes, (void)name;
    die("%s: internal error: no CUDA backend in this build", c->name);
#endif
}

/* The pointer to pass for input `name` (host[0 .. bytes)); NULL stays NULL. */
static const void *call_in(const lib_call *c, const char *name, const void *host, size_t bytes)
{
    if (host == NULL || c->backend == MOE_BACKEND_REF)
        return host;
    return to_device(c, host, bytes, name);
}

/* The pointer to pass for output `name`, which call_end leaves in host[0 .. bytes); NULL stays NULL. */
static void *call_out(lib_call *c, const char *name, void *host, size_t bytes)
{
    if (host == NULL || c->backend == MOE_BACKEND_REF)
        return host;
    if (c->num_out == MAX_CALL_OUTPUTS)
        die("%s: internal error: more than %d outputs", c->name, MAX_CALL_OUTPUTS);
    void *dev = to_device(c, NULL, bytes, name);
    c->out[c->num_out++] = (call_output){name, host, dev, bytes};
    return dev;
}

/* The routing to pass: its m_sizes and gather_indices through call_in. */
static moe_routing call_routing(const lib_call *c, const moe_routing *r)
{
    moe_routing on = *r;
    on.m_sizes = call_in(c, "m_sizes", r->m_sizes, elements(r->num_experts, 1, 1) * sizeof(int64_t));
    on.gather_indices = call_in(c, "gather_indices", r->gather_indices,
                                elements(r->num_tokens, r->topk, 1) * sizeof(int64_t));
    return on;
}

static void call_end(lib_call *c, moe_status status)
{
    if (status != MOE_OK)
        library_failed(c->name, status);
    if (c->backend == MOE_BACKEND_REF)
        return;
#ifdef MOE_CLI_CUDA
    status = moe_backend_synchronize(MOE_BACKEND_CUDA, NULL);
    if (status != MOE_OK)
        die("%s (CUDA) refused the call: %s (%s)", c->name, moe_last_error(), moe_strerror(status));
    char err[512];
    for (int i = 0; i < c->num_out; i++)
        if (device_download(c->out[i].host, c->out[i].dev, c->out[i].bytes, c->out[i].name, err, sizeof err) != 0)
            die("%s: %s", c->name, err);
    device_free_all();
    c->num_out = 0;
#endif
}

/* The float64 oracle's bound of every output element, written as float64 (--bound-out). */
enum oracle_op { ORACLE_FWD, ORACLE_DX, ORACLE_DW };
static void write_bound(const args *a, enum oracle_op op, const routing_in *ri, int64_t N, int64_t K,
                        const void *in0, const void *in1, const void *tw, const moe_gemm_options *o, int ndim,
                        const int64_t *shape)
{
    const char *path = get(a, "--bound-out");
    if (path == NULL)
        return;
    int64_t count = 1;
    for (int i = 0; i < ndim; i++)
        count *= shape[i];
    double *value = xmalloc((size_t)count, sizeof(double)), *bound = xmalloc((size_t)count, sizeof(double));
    if (op == ORACLE_FWD)
        oracle_gemm_fwd(&ri->r, N, K, in0, in1, tw, NULL, o, value, bound);
    else if (op == ORACLE_DX)
        oracle_gemm_dx(&ri->r, N, K, in0, in1, tw, NULL, o, value, bound);
    else
        oracle_gemm_dw_split(&ri->r, N, K, in0, in1, tw, NULL, o, value, bound);
    write_array(path, NPY_T_F64, ndim, shape, bound);
    xfree(value);
    xfree(bound);
}

/* ---------------------------------------------------------------------------------------------------
 * Grouped GEMM commands
 * ------------------------------------------------------------------------------------------------- */
static void gemm_options(const args *a, const routing_in *ri, moe_gemm_options *o)
{
    memset(o, 0, sizeof *o);
    o->permute_x = get(a, "--permute-x") != NULL;
    o->permute_y = get(a, "--permute-y") != NULL;
    if (o->permute_x)
        require_gather(ri, "--permute-x");
    if (o->permute_y)
        require_gather(ri, "--permute-y");
    if (get(a, "--topk-weights") != NULL)
        require_gather(ri, "--topk-weights");
    o->allow_tf32 = get(a, "--allow-tf32") != NULL; /* the library refuses it for a 16-bit dtype */
}

static void check_weights(const char *path, const npy_array *w, int64_t E, const char *m_path)
{
    if (w->h.ndim != 3 || w->h.shape[0] != E)
        die("%s: expected expert weights of shape (E, N, K) with E = %lld (the length of %s), found %s %s", path,
            (long long)E, m_path, shape_text(&w->h), npy_type_name(w->h.type));
}

static void check_weights_nk(const char *path, const npy_array *w, int64_t E, int64_t N, int64_t K,
                             const char *why)
{
    if (w->h.ndim != 3 || w->h.shape[0] != E || w->h.shape[1] != N || w->h.shape[2] != K)
        die("%s: expected expert weights of shape (%lld, %lld, %lld) (%s), found %s %s", path, (long long)E,
            (long long)N, (long long)K, why, shape_text(&w->h), npy_type_name(w->h.type));
}

static void check_topk_weights(const char *path, const npy_array *tw, const routing_in *ri)
{
    const npy_header *h = &tw->h;
    if (!((h->ndim == 1 && h->shape[0] == ri->M) ||
          (h->ndim == 2 && h->shape[0] == ri->T && h->shape[1] == ri->k)))
        die("%s: expected topk weights of shape (%lld,) or (%lld, %lld) (M = T*k slots), found %s %s", path,
            (long long)ri->M, (long long)ri->T, (long long)ri->k, shape_text(h), npy_type_name(h->type));
}

static const char *rows_why(const routing_in *ri, int permuted, const char *flag, char *buf, size_t size)
{
    if (permuted)
        snprintf(buf, size, "T = %lld tokens because of %s", (long long)ri->T, flag);
    else
        snprintf(buf, size, "M = %lld rows, the sum of %s", (long long)ri->M, ri->m_path);
    return buf;
}

static int run_gemm_fwd(const args *a)
{
    lib_call c = {"moe_gemm_fwd", get_backend(a), 0, {{0}}};
    const char *x_path = need(a, "--x"), *w_path = need(a, "--w"), *out = need(a, "--out");
    const char *tw_path = get(a, "--topk-weights");
    claim_files(a, (const char *const[]){"--out", "--bound-out", NULL},
                (const char *const[]){"--x", "--w", "--m-sizes", "--gather", "--topk-weights", NULL});
    routing_in ri;
    load_routing(a, &ri);
    moe_gemm_options o;
    gemm_options(a, &ri, &o);

    npy_array x, w, tw = {0};
    load(x_path, &x);
    load(w_path, &w);
    if (tw_path)
        load(tw_path, &tw);
    const npy_array *arrays[] = {&x, &w, tw_path ? &tw : NULL};
    const char *paths[] = {x_path, w_path, tw_path};
    o.dtype = choose_dtype(a, arrays, paths, 3);

    check_weights(w_path, &w, ri.E, ri.m_path);
    const int64_t N = w.h.shape[1], K = w.h.shape[2];
    char why[1024], buf[256];
    snprintf(why, sizeof why, "%s; K = %lld from %s", rows_why(&ri, o.permute_x, "--permute-x", buf, sizeof buf),
             (long long)K, w_path);
    check_matrix(x_path, &x, o.permute_x ? ri.T : ri.M, K, 1, why);
    if (tw_path)
        check_topk_weights(tw_path, &tw, &ri);

    void *xd = convert(x_path, &x, o.dtype), *wd = convert(w_path, &w, o.dtype);
    void *twd = tw_path ? convert(tw_path, &tw, o.dtype) : NULL;
    const size_t es = moe_dtype_size(o.dtype);
    void *y = xmalloc(elements(ri.M, N, 1), es);
    const moe_routing r = call_routing(&c, &ri.r);
    call_end(&c, moe_gemm_fwd(c.backend, &r, N, K, call_in(&c, "x", xd, elements(x.h.count, es, 1)),
                              call_in(&c, "w", wd, elements(ri.E, N, K) * es),
                              call_in(&c, "topk_weights", twd, elements(ri.M, es, 1)),
                              call_out(&c, "y", y, elements(ri.M, N, 1) * es), &o));
    const int64_t shape[2] = {ri.M, N};
    write_result(a, out, o.dtype, y, 2, shape);
    write_bound(a, ORACLE_FWD, &ri, N, K, xd, wd, twd, &o, 2, shape);
    commit_outputs();
    return 0;
}

static int run_gemm_dx(const args *a)
{
    lib_call c = {"moe_gemm_dx", get_backend(a), 0, {{0}}};
    const char *dy_path = need(a, "--dy"), *w_path = need(a, "--w"), *out = need(a, "--out");
    const char *tw_path = get(a, "--topk-weights");
    claim_files(a, (const char *const[]){"--out", "--bound-out", NULL},
                (const char *const[]){"--dy", "--w", "--m-sizes", "--gather", "--topk-weights", NULL});
    routing_in ri;
    load_routing(a, &ri);
    moe_gemm_options o;
    gemm_options(a, &ri, &o);
    o.reduce_topk = get(a, "--reduce-topk") != NULL;
    if (o.reduce_topk)
        require_gather(&ri, "--reduce-topk");

    npy_array dy, w, tw = {0};
    load(dy_path, &dy);
    load(w_path, &w);
    if (tw_path)
        load(tw_path, &tw);
    const npy_array *arrays[] = {&dy, &w, tw_path ? &tw : NULL};
    const char *paths[] = {dy_path, w_path, tw_path};
    o.dtype = choose_dtype(a, arrays, paths, 3);

    check_weights(w_path, &w, ri.E, ri.m_path);
    const int64_t N = w.h.shape[1], K = w.h.shape[2];
    char why[1024];
    snprintf(why, sizeof why, "M = %lld rows, the sum of %s; N = %lld from %s", (long long)ri.M, ri.m_path,
             (long long)N, w_path);
    check_matrix(dy_path, &dy, ri.M, N, 1, why);
    if (tw_path)
        check_topk_weights(tw_path, &tw, &ri);

    void *dyd = convert(dy_path, &dy, o.dtype), *wd = convert(w_path, &w, o.dtype);
    void *twd = tw_path ? convert(tw_path, &tw, o.dtype) : NULL;
    const int64_t rows = o.reduce_topk ? ri.T : ri.M;
    const size_t es = moe_dtype_size(o.dtype);
    void *dx = xmalloc(elements(rows, K, 1), es);
    const moe_routing r = call_routing(&c, &ri.r);
    call_end(&c, moe_gemm_dx(c.backend, &r, N, K, call_in(&c, "dy", dyd, elements(ri.M, N, 1) * es),
                             call_in(&c, "w", wd, elements(ri.E, N, K) * es),
                             call_in(&c, "topk_weights", twd, elements(ri.M, es, 1)),
                             call_out(&c, "dx", dx, elements(rows, K, 1) * es), &o));
    const int64_t shape[2] = {rows, K};
    write_result(a, out, o.dtype, dx, 2, shape);
    write_bound(a, ORACLE_DX, &ri, N, K, dyd, wd, twd, &o, 2, shape);
    commit_outputs();
    return 0;
}

static int run_gemm_dw(const args *a)
{
    lib_call c = {"moe_gemm_dw", get_backend(a), 0, {{0}}};
    const char *x_path = need(a, "--x"), *dy_path = need(a, "--dy"), *out = need(a, "--out");
    const char *tw_path = get(a, "--topk-weights"), *w_path = get(a, "--w");
    const char *dtw_out = get(a, "--out-topk-weights-grad");
    claim_files(a, (const char *const[]){"--out", "--bound-out", "--out-topk-weights-grad", NULL},
                (const char *const[]){"--x", "--dy", "--m-sizes", "--gather", "--topk-weights", "--w", NULL});
    routing_in ri;
    load_routing(a, &ri);
    moe_gemm_options o;
    gemm_options(a, &ri, &o);
    o.dw_fp32 = get(a, "--dw-fp32") != NULL;
    if (dtw_out != NULL && w_path == NULL)
        die("--out-topk-weights-grad needs --w W.npy (it recomputes X . W[e]^T)");
    if (dtw_out != NULL)
        require_gather(&ri, "--out-topk-weights-grad");
    if (w_path != NULL && dtw_out == NULL)
        die("--w is only used by --out-topk-weights-grad; give both or neither");

    npy_array x, dy, tw = {0}, w = {0};
    load(x_path, &x);
    load(dy_path, &dy);
    if (tw_path)
        load(tw_path, &tw);
    if (w_path)
        load(w_path, &w);
    const npy_array *arrays[] = {&x, &dy, tw_path ? &tw : NULL, w_path ? &w : NULL};
    const char *paths[] = {x_path, dy_path, tw_path, w_path};
    o.dtype = choose_dtype(a, arrays, paths, 4);

    if (x.h.ndim < 2)
        die("%s: expected a matrix of shape (rows, K), found %s %s", x_path, shape_text(&x.h), npy_type_name(x.h.type));
    if (dy.h.ndim < 2)
        die("%s: expected a matrix of shape (M, N), found %s %s", dy_path, shape_text(&dy.h), npy_type_name(dy.h.type));
    const int64_t K = x.h.shape[x.h.ndim - 1], N = dy.h.shape[dy.h.ndim - 1];
    char why[1024], buf[256];
    snprintf(why, sizeof why, "%s", rows_why(&ri, o.permute_x, "--permute-x", buf, sizeof buf));
    check_matrix(x_path, &x, o.permute_x ? ri.T : ri.M, K, 1, why);
    snprintf(why, sizeof why, "M = %lld rows, the sum of %s", (long long)ri.M, ri.m_path);
    check_matrix(dy_path, &dy, ri.M, N, 1, why);
    if (tw_path)
        check_topk_weights(tw_path, &tw, &ri);
    if (w_path) {
        snprintf(why, sizeof why, "E from %s, N from %s, K from %s", ri.m_path, dy_path, x_path);
        check_weights_nk(w_path, &w, ri.E, N, K, why);
    }

    void *xd = convert(x_path, &x, o.dtype), *dyd = convert(dy_path, &dy, o.dtype);
    void *twd = tw_path ? convert(tw_path, &tw, o.dtype) : NULL;
    const moe_dtype dw_dtype = o.dw_fp32 ? MOE_F32 : o.dtype;
    const size_t es = moe_dtype_size(o.dtype), dws = moe_dtype_size(dw_dtype);
    const size_t x_bytes = elements(x.h.count, es, 1), dy_bytes = elements(ri.M, N, 1) * es;
    void *dw = xmalloc(elements(ri.E, N, K), dws);
    moe_routing r = call_routing(&c, &ri.r);
    call_end(&c, moe_gemm_dw(c.backend, &r, N, K, call_in(&c, "x", xd, x_bytes), call_in(&c, "dy", dyd, dy_bytes),
                             call_in(&c, "topk_weights", twd, elements(ri.M, es, 1)),
                             call_out(&c, "dw", dw, elements(ri.E, N, K) * dws), &o));
    const int64_t shape[3] = {ri.E, N, K};
    write_result(a, out, dw_dtype, dw, 3, shape);
    write_bound(a, ORACLE_DW, &ri, N, K, xd, dyd, twd, &o, 3, shape);

    if (dtw_out != NULL) {
        void *wd = convert(w_path, &w, o.dtype);
        void *dtw = xmalloc((size_t)ri.M, dws);
        lib_call g = {"moe_gemm_topk_weights_grad", c.backend, 0, {{0}}};
        r = call_routing(&g, &ri.r);
        call_end(&g, moe_gemm_topk_weights_grad(g.backend, &r, N, K, call_in(&g, "x", xd, x_bytes),
                                                call_in(&g, "w", wd, elements(ri.E, N, K) * es),
                                                call_in(&g, "dy", dyd, dy_bytes),
                                                call_out(&g, "d_topk_weights", dtw, elements(ri.M, dws, 1)), &o));
        int64_t tshape[2] = {ri.T, ri.k};
        int tndim = 2;
        if (tw_path && tw.h.ndim == 1) {
            tshape[0] = ri.M;
            tndim = 1;
        }
        write_result(a, dtw_out, dw_dtype, dtw, tndim, tshape);
    }
    commit_outputs();
    return 0;
}

/* ---------------------------------------------------------------------------------------------------
 * route
 * ------------------------------------------------------------------------------------------------- */
static char *join_path(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = xmalloc(n, 1);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static void make_dirs(const char *path)
{
    char *copy = join_path(path, "");
    for (char *p = copy + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        struct stat st;
        if (mkdir(copy, 0777) != 0 && (errno != EEXIST || stat(copy, &st) != 0 || !S_ISDIR(st.st_mode)))
            die("%s: cannot create the folder: %s", copy, strerror(errno == EEXIST ? ENOTDIR : errno));
        *p = '/';
    }
    xfree(copy);
}

static int is_regular(const char *path);
static int is_dir(const char *path);

/* ---------------------------------------------------------------------------------------------------
 * Shapes with NKI's trailing 1s, and the MLP options
 * ------------------------------------------------------------------------------------------------- */
/* h's shape is dims (ndim of them), possibly followed by extra dimensions of size 1. */
static int shape_is(const npy_header *h, int ndim, const int64_t *dims)
{
    if (h->ndim < ndim)
        return 0;
    for (int d = 0; d < ndim; d++)
        if (h->shape[d] != dims[d])
            return 0;
    for (int d = ndim; d < h->ndim; d++)
        if (h->shape[d] != 1)
            return 0;
    return 1;
}

static void check_shape(const char *path, const npy_array *arr, int ndim, const int64_t *dims, const char *what,
                        const char *why)
{
    if (shape_is(&arr->h, ndim, dims))
        return;
    char want[512];
    die("%s: expected %s of shape %s (%s), found %s %s", path, what, npy_format_shape(want, sizeof want, ndim, dims),
        why, shape_text(&arr->h), npy_type_name(arr->h.type));
}

static void check_index_array(const char *path, const npy_array *arr)
{
    if (!npy_type_is_int(arr->h.type))
        die("%s: expected an int32 or int64 array, found %s %s", path, shape_text(&arr->h), npy_type_name(arr->h.type));
}

static int64_t parse_block_size(const args *a)
{
    const char *s = get(a, "--block-size");
    return s ? parse_int_arg("--block-size", s, 1) : MOE_MLP_DEFAULT_BLOCK_SIZE;
}

static moe_mlp_padding parse_padding(const args *a)
{
    const char *s = get(a, "--padding");
    if (s == NULL || strcmp(s, "skip") == 0)
        return MOE_MLP_PAD_SKIP;
    if (strcmp(s, "row") == 0)
        return MOE_MLP_PAD_ROW;
    die("--padding %s: expected skip (empty positions hold -1) or row (they hold T)", s);
}

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
    if (s == NULL || strcmp(s, "silu") == 0)
        o->activation = MOE_ACT_SILU;
    else if (strcmp(s, "gelu") == 0)
        o->activation = MOE_ACT_GELU;
    else if (strcmp(s, "gelu_tanh") == 0)
        o->activation = MOE_ACT_GELU_TANH;
    else if (strcmp(s, "swish") == 0)
        o->activation = MOE_ACT_SWISH;
    else
        die("--activation %s: expected silu, gelu, gelu_tanh or swish", s);
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
    o->round_intermediates = get(a, "--round-intermediates") != NULL;
}

/* ", intermediates rounded to bf16" when options.round_intermediates takes effect (f16/bf16), else "". */
static const char *rounded_note(const moe_mlp_options *o)
{
    if (!o->round_intermediates || o->dtype == MOE_F32)
        return "";
    return o->dtype == MOE_BF16 ? ", intermediates rounded to bf16" : ", intermediates rounded to f16";
}

/* ---------------------------------------------------------------------------------------------------
 * route
 * ------------------------------------------------------------------------------------------------- */
static int run_route(const args *a)
{
    const char *ids_path = need(a, "--topk-ids"), *dir = need(a, "--out");
    const int64_t E = parse_int_arg("--experts", need(a, "--experts"), 1);
    const int blockwise = get(a, "--block-size") != NULL || get(a, "--dropping") != NULL;
    const char *tw_path = get(a, "--topk-weights");
    if (!blockwise) {
        static const char *const layout_only[] = {"--padding", "--topk-weights", "--dtype", "--raw"};
        for (size_t i = 0; i < sizeof layout_only / sizeof layout_only[0]; i++)
            if (get(a, layout_only[i]) != NULL)
                die("%s belongs to the blockwise layout: give --block-size B (or --dropping) too", layout_only[i]);
    } else if (tw_path == NULL && (get(a, "--dtype") != NULL || get(a, "--raw") != NULL)) {
        die("%s is for expert_affinities_masked.npy: give --topk-weights TW.npy too",
            get(a, "--dtype") != NULL ? "--dtype" : "--raw");
    }
    moe_mlp_options mo = {0};
    mo.block_size = parse_block_size(a);
    mo.padding = parse_padding(a);
    const moe_mlp_layout_kind kind = get(a, "--dropping") != NULL ? MOE_MLP_DROPPING : MOE_MLP_DROPLESS;
    /* the routing; with the blockwise layout two files more, and the affinities with --topk-weights */
    static const char *const names[] = {"m_sizes.npy",         "gather_indices.npy",
                                        "scatter_indices.npy", "token_position_to_id.npy",
                                        "block_to_expert.npy", "expert_affinities_masked.npy"};
    char *p[6];
    add_outputs_in(dir, names, blockwise ? 5 + (tw_path != NULL) : 3, p);
    claim_files(a, (const char *const[]){NULL}, (const char *const[]){"--topk-ids", "--topk-weights", NULL});

    npy_array ids;
    load(ids_path, &ids);
    if (ids.h.ndim != 1 && ids.h.ndim != 2)
        die("%s: expected topk ids of shape (T, k) or (T,), found %s %s", ids_path, shape_text(&ids.h),
            npy_type_name(ids.h.type));
    const int64_t T = ids.h.shape[0], k = ids.h.ndim == 2 ? ids.h.shape[1] : 1;
    if (k < 1 && T > 0)
        die("%s: expected topk ids of shape (T, k) with k >= 1, found %s %s", ids_path, shape_text(&ids.h),
            npy_type_name(ids.h.type));
    int64_t *topk_ids = convert_int(ids_path, &ids);
    const int64_t M = T * k;
    int64_t *m_sizes = xmalloc((size_t)E, sizeof(int64_t));
    int64_t *gather = xmalloc((size_t)M, sizeof(int64_t)), *scatter = xmalloc((size_t)M, sizeof(int64_t));
    moe_status st = moe_routing_from_topk(T, k, E, topk_ids, m_sizes, gather, scatter);
    if (st != MOE_OK)
        die("%s: %s (--experts %lld)", ids_path, moe_last_error(), (long long)E);

    /* the blockwise layout: everything is checked and built before the first file is written */
    npy_array tw = {0};
    void *twd = NULL, *aff = NULL;
    int64_t N = 0, dropped = 0, *b2e = NULL, *tpti = NULL;
    if (blockwise) {
        if (tw_path != NULL) {
            load(tw_path, &tw);
            const npy_array *arrays[] = {&tw};
            const char *paths[] = {tw_path};
            mo.dtype = choose_dtype(a, arrays, paths, 1);
            check_floating(tw_path, &tw);
            const int64_t flat[1] = {M}, tk[2] = {T, k};
            if (!shape_is(&tw.h, 1, flat) && !shape_is(&tw.h, 2, tk))
                die("%s: expected topk weights of shape (%lld, %lld) or (%lld,) (those of %s), found %s %s", tw_path,
                    (long long)T, (long long)k, (long long)M, ids_path, shape_text(&tw.h), npy_type_name(tw.h.type));
            twd = convert(tw_path, &tw, mo.dtype);
            aff = xmalloc(elements(T, E, 1), moe_dtype_size(mo.dtype));
        }
        st = moe_mlp_layout_num_blocks(kind, T, k, E, topk_ids, &mo, &N);
        if (st != MOE_OK)
            die("%s: %s", ids_path, moe_last_error());
        b2e = xmalloc((size_t)N, sizeof *b2e);
        tpti = xmalloc(elements(N, mo.block_size, 1), sizeof *tpti);
        st = moe_mlp_layout_build(kind, T, k, E, topk_ids, twd, N, b2e, tpti, aff, &dropped, &mo);
        if (st != MOE_OK)
            die("%s: %s", ids_path, moe_last_error());
    }

    make_dirs(dir);
    write_array(p[0], NPY_T_I64, 1, &E, m_sizes);
    write_array(p[1], NPY_T_I64, 1, &M, gather);
    write_array(p[2], NPY_T_I64, 1, &M, scatter);
    const int64_t NB = N * mo.block_size, TE = T * E;
    if (blockwise) {
        write_array(p[3], NPY_T_I64, 1, &NB, tpti);
        write_array(p[4], NPY_T_I64, 1, &N, b2e);
        if (aff != NULL)
            write_result(a, p[5], mo.dtype, aff, 1, &TE);
    }
    commit_outputs();
    printf("routing: T = %lld tokens, k = %lld, E = %lld experts, M = %lld rows (use --topk %lld)\n", (long long)T,
           (long long)k, (long long)E, (long long)M, (long long)k);
    if (!blockwise)
        return 0;
    int64_t empty = 0;
    for (int64_t i = 0; i < NB; i++)
        empty += tpti[i] < 0 || tpti[i] >= T;
    printf("blocks: N = %lld blocks of B = %lld positions (%s, padding %s: empty positions hold %lld), %lld of "
           "%lld positions empty (use --block-size %lld%s)\n",
           (long long)N, (long long)mo.block_size, kind == MOE_MLP_DROPPING ? "dropping" : "dropless",
           mo.padding == MOE_MLP_PAD_ROW ? "row" : "skip", mo.padding == MOE_MLP_PAD_ROW ? (long long)T : -1LL,
           (long long)empty, (long long)NB, (long long)mo.block_size,
           mo.padding == MOE_MLP_PAD_ROW ? " --padding row" : "");
    if (kind == MOE_MLP_DROPPING)
        printf("dropped: %lld (token, expert) pairs past the capacity of %lld tokens per expert\n", (long long)dropped,
               (long long)mo.block_size);
    return 0;
}

/* ---------------------------------------------------------------------------------------------------
 * mlp-fwd, mlp-bwd
 * ------------------------------------------------------------------------------------------------- */
enum mlp_file {
    F_HIDDEN, F_AFF, F_WGU, F_WD, F_BGU, F_BD, F_TPTI, F_B2E, F_OUT_GRAD, F_CKPT_GU, F_CKPT_D, F_COUNT
};
static const char *const mlp_file_names[F_COUNT] = {
    "hidden_states.npy", "expert_affinities_masked.npy", "gate_up_proj_weight.npy", "down_proj_weight.npy",
    "gate_up_proj_bias.npy", "down_proj_bias.npy", "token_position_to_id.npy", "block_to_expert.npy",
    "output_hidden_states_grad.npy", "gate_up_proj_act_checkpoint_T.npy", "down_proj_act_checkpoint.npy",
};

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
    int64_t aff_shape[NPY_MAX_DIMS];
    moe_mlp_layout layout;
} mlp_in;

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
    for (int f = 0; f < F_COUNT; f++) {
        m->path[f] = join_path(dir, mlp_file_names[f]);
        if (want[f] != 0)
            check_input(m->path[f]);
    }
    for (int f = 0; f < F_COUNT; f++) {
        if (want[f] == 2 || (want[f] == 1 && is_regular(m->path[f]))) {
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
        if (f == F_TPTI || f == F_B2E) {
            check_index_array(m->path[f], &m->arr[f]);
            continue;
        }
        check_floating(m->path[f], &m->arr[f]);
        floats[nf] = &m->arr[f];
        float_paths[nf++] = m->path[f];
    }
    m->o.dtype = choose_dtype(a, floats, float_paths, nf);

    /* E, H, I from gate_up_proj_weight; N from block_to_expert; B from token_position_to_id or --block-size */
    const npy_header *wgu = &m->arr[F_WGU].h;
    const char *pw = m->path[F_WGU];
    if (wgu->ndim < 4 || wgu->shape[2] != 2 || !shape_is(wgu, 4, wgu->shape))
        die("%s: expected gate_up_proj_weight of shape (E, H, 2, I), found %s %s", pw, shape_text(wgu),
            npy_type_name(wgu->type));
    m->E = wgu->shape[0], m->H = wgu->shape[1], m->I = wgu->shape[3];
    if (m->E < 1)
        die("%s: expected at least one expert (E >= 1), found %s %s", pw, shape_text(wgu), npy_type_name(wgu->type));
    char why[1024];
    snprintf(why, sizeof why, "E, I and H from %s", pw);
    const int64_t s_wd[3] = {m->E, m->I, m->H};
    check_shape(m->path[F_WD], &m->arr[F_WD], 3, s_wd, "down_proj_weight", why);

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
    if (m->T > 0 && m->E > INT64_MAX / m->T)
        die("%s: T*E overflows", phs);

    const int64_t te[1] = {m->T * m->E}, t_e[2] = {m->T, m->E};
    const npy_header *ah = &m->arr[F_AFF].h;
    if (!shape_is(ah, 1, te) && !shape_is(ah, 2, t_e))
        die("%s: expected expert_affinities_masked of shape (%lld,), (%lld, 1) or (%lld, %lld) (T*E with T = %lld "
            "tokens from %s%s, E = %lld from %s), found %s %s", m->path[F_AFF], (long long)te[0], (long long)te[0],
            (long long)m->T, (long long)m->E, (long long)m->T, phs, row ? " less the padding row" : "",
            (long long)m->E, pw, shape_text(ah), npy_type_name(ah->type));
    m->aff_ndim = ah->ndim;
    memcpy(m->aff_shape, ah->shape, sizeof m->aff_shape);
    if (m->have[F_BGU]) {
        const int64_t s[3] = {m->E, 2, m->I};
        snprintf(why, sizeof why, "E and I from %s", pw);
        check_shape(m->path[F_BGU], &m->arr[F_BGU], 3, s, "gate_up_proj_bias", why);
    }
    if (m->have[F_BD]) {
        const int64_t s[2] = {m->E, m->H};
        snprintf(why, sizeof why, "E and H from %s", pw);
        check_shape(m->path[F_BD], &m->arr[F_BD], 2, s, "down_proj_bias", why);
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
        const int is_index = f == F_TPTI || f == F_B2E;
        m->bytes[f] = elements(m->arr[f].h.count, is_index ? sizeof(int64_t) : moe_dtype_size(m->o.dtype), 1);
        if (is_index)
            m->data[f] = convert_int(m->path[f], &m->arr[f]);
        else
            m->data[f] = convert(m->path[f], &m->arr[f], m->o.dtype);
        release(&m->arr[f]);
        m->arr[f].data = NULL;
    }
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

/* The files both directions read: the forward's inputs (biases only with --bias). */
static void mlp_begin(const args *a, mlp_in *m, int *want)
{
    memset(m, 0, sizeof *m);
    m->backend = get_backend(a);
    mlp_options(a, &m->o);
    want[F_HIDDEN] = want[F_AFF] = want[F_WGU] = want[F_WD] = want[F_TPTI] = want[F_B2E] = 2;
}

static int run_mlp_fwd(const args *a)
{
    const char *out = need(a, "--out");
    mlp_in m;
    int want[F_COUNT] = {0};
    mlp_begin(a, &m, want);
    static const char *const names[] = {"output.npy", "gate_up_proj_act_checkpoint_T.npy",
                                        "down_proj_act_checkpoint.npy"};
    char *p[3];
    add_outputs_in(out, names, 3, p);
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
    commit_outputs();
    printf("mlp-fwd: T = %lld tokens, E = %lld experts, H = %lld, I = %lld, N = %lld blocks of B = %lld, %s%s\n",
           (long long)m.T, (long long)m.E, (long long)m.H, (long long)m.I, (long long)m.N, (long long)m.B,
           moe_dtype_name(m.o.dtype), rounded_note(&m.o));
    return 0;
}

static int run_mlp_bwd(const args *a)
{
    const char *out = need(a, "--out");
    mlp_in m;
    int want[F_COUNT] = {0};
    mlp_begin(a, &m, want);
    static const char *const names[] = {"hidden_states_grad.npy",    "expert_affinities_masked_grad.npy",
                                        "gate_up_proj_weight_grad.npy", "down_proj_weight_grad.npy",
                                        "gate_up_proj_bias_grad.npy", "down_proj_bias_grad.npy"};
    char *p[6];
    add_outputs_in(out, names, m.o.bias ? 6 : 4, p);
    want[F_OUT_GRAD] = want[F_CKPT_GU] = 2;
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
    const size_t n_wd = elements(m.E, m.I, m.H), n_bgu = elements(m.E, 2, m.I), n_bd = elements(m.E, m.H, 1);
    void *dh = xmalloc(n_h, es), *da = xmalloc(n_a, es), *dwgu = xmalloc(n_wgu, gs), *dwd = xmalloc(n_wd, gs);
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
    const int64_t s_h[2] = {m.T1, m.H}, s_wgu[4] = {m.E, m.H, 2, m.I}, s_wd[3] = {m.E, m.I, m.H};
    const int64_t s_bgu[3] = {m.E, 2, m.I}, s_bd[2] = {m.E, m.H};
    write_result(a, p[0], m.o.dtype, dh, 2, s_h);
    write_result(a, p[1], m.o.dtype, da, m.aff_ndim, m.aff_shape);
    write_result(a, p[2], gdt, dwgu, 4, s_wgu);
    write_result(a, p[3], gdt, dwd, 3, s_wd);
    if (bias) {
        write_result(a, p[4], gdt, dbgu, 3, s_bgu);
        write_result(a, p[5], gdt, dbd, 2, s_bd);
    }
    commit_outputs();
    printf("mlp-bwd: T = %lld tokens, E = %lld experts, H = %lld, I = %lld, N = %lld blocks of B = %lld, %s%s%s%s\n",
           (long long)m.T, (long long)m.E, (long long)m.H, (long long)m.I, (long long)m.N, (long long)m.B,
           moe_dtype_name(m.o.dtype), rounded_note(&m.o), m.o.grad_fp32 ? ", weight gradients float32" : "",
           m.have[F_CKPT_D] ? "" : ", d recomputed (no down checkpoint)");
    return 0;
}

/* ---------------------------------------------------------------------------------------------------
 * compare
 * ------------------------------------------------------------------------------------------------- */
typedef enum tol_mode { TOL_ROUNDING, TOL_REDUCTION, TOL_BOUND, TOL_EXACT, TOL_ABSREL } tol_mode;

typedef struct compare_cfg {
    int have_dtype;
    const char *dtype_name; /* f32 f16 bf16 f64 */
    tol_mode mode;
    int64_t length;
    double atol, rtol;
    const char *bound; /* file or folder */
} compare_cfg;

typedef struct tol_dtype {
    const char *name;
    double u, eta;
    moe_dtype pattern; /* how uint16 patterns decode */
    int exact;
} tol_dtype;

static tol_dtype dtype_by_name(const char *name)
{
    if (strcmp(name, "f64") == 0 || strcmp(name, "float64") == 0)
        return (tol_dtype){"f64", 0x1p-53, 0x1p-1074, MOE_BF16, 0};
    moe_dtype d;
    if (!parse_dtype(name, &d))
        die("--dtype %s: expected f32, f16, bf16 or f64", name);
    return (tol_dtype){moe_dtype_name(d), moe_dtype_unit_roundoff(d), oracle_output_rounding(d, 0.0), d, 0};
}

static tol_dtype infer_compare_dtype(const compare_cfg *cfg, const char *pa, const npy_array *a, const char *pb,
                                     const npy_array *b)
{
    if (npy_type_is_int(a->h.type) && npy_type_is_int(b->h.type))
        return (tol_dtype){"int", 0, 0, MOE_BF16, 1};
    const int patterns = npy_type_is_pattern(a->h.type) || npy_type_is_pattern(b->h.type);
    if (cfg->have_dtype) {
        tol_dtype dt = dtype_by_name(cfg->dtype_name);
        if (!patterns || strcmp(dt.name, "bf16") == 0 || strcmp(dt.name, "f16") == 0)
            return dt;
    }
    if (patterns)
        die("%s: holds %s 16-bit patterns; pass --dtype bf16 or --dtype f16 to say what they are",
            npy_type_is_pattern(a->h.type) ? pa : pb,
            npy_type_name(npy_type_is_pattern(a->h.type) ? a->h.type : b->h.type));
    if (a->h.type == NPY_T_F16 || b->h.type == NPY_T_F16)
        return dtype_by_name("f16");
    if (a->h.type == NPY_T_F64 && b->h.type == NPY_T_F64)
        return dtype_by_name("f64");
    return dtype_by_name("f32");
}

static int is_regular(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static void print_index(int64_t flat, const npy_header *h)
{
    int64_t idx[NPY_MAX_DIMS];
    for (int d = h->ndim - 1; d >= 0; d--) {
        idx[d] = h->shape[d] ? flat % h->shape[d] : 0;
        flat = h->shape[d] ? flat / h->shape[d] : 0;
    }
    printf("[");
    for (int d = 0; d < h->ndim; d++)
        printf("%s%lld", d ? ", " : "", (long long)idx[d]);
    printf("]");
}

static int is_bf16_value(double v)
{
    return isnan(v) || (double)moe_bf16_to_f32(npy_f64_to_bf16(v)) == v;
}

/* Compares one pair; prints its report; returns 0 when within tolerance, 1 otherwise. */
static int compare_pair(const compare_cfg *cfg, const char *label, const char *pa, const char *pb, const char *pbound)
{
    npy_array A, B, bound = {0};
    load(pa, &A);
    load(pb, &B);
    int same_shape = A.h.ndim == B.h.ndim;
    for (int d = 0; same_shape && d < A.h.ndim; d++)
        same_shape = A.h.shape[d] == B.h.shape[d];
    if (!same_shape) {
        printf("%s\n", label);
        printf("  shape          %s %s in A, %s %s in B\n  verdict        FAIL (shapes differ)\n", shape_text(&A.h),
               npy_type_name(A.h.type), shape_text(&B.h), npy_type_name(B.h.type));
        release(&A);
        release(&B);
        return 1;
    }
    const tol_dtype dt = infer_compare_dtype(cfg, pa, &A, pb, &B);
    tol_mode mode = dt.exact ? TOL_EXACT : cfg->mode;
    if (mode == TOL_BOUND && pbound == NULL)
        mode = TOL_ROUNDING;
    if (mode == TOL_BOUND) {
        load(pbound, &bound);
        int ok = bound.h.ndim == A.h.ndim && npy_type_is_float(bound.h.type);
        for (int d = 0; ok && d < A.h.ndim; d++)
            ok = bound.h.shape[d] == A.h.shape[d];
        if (!ok)
            die("%s: expected a floating-point bound of shape %s (the shape of %s), found %s %s", pbound,
                shape_text(&A.h), pa, shape_text(&bound.h), npy_type_name(bound.h.type));
    }
    const double g = mode == TOL_REDUCTION ? oracle_gamma(cfg->length) : 0.0;
    printf("%s\n", label);

    printf("  shape          %s", shape_text(&A.h));
    if (A.h.type != B.h.type)
        printf(" (%s in A, %s in B)", npy_type_name(A.h.type), npy_type_name(B.h.type));
    printf("\n  tolerance      ");
    switch (mode) {
    case TOL_EXACT: printf("exact (%s)\n", dt.exact ? "integer arrays" : "--exact"); break;
    case TOL_ROUNDING: printf("%s: 2*(u*max(|a|,|b|) + eta), u = %g, eta = %g\n", dt.name, dt.u, dt.eta); break;
    case TOL_REDUCTION:
        printf("%s, length %lld: 2*(g*m + u*(m + g*m) + eta), m = max(|a|,|b|), g = gamma(%lld) = %.6g, u = %g\n",
               dt.name, (long long)cfg->length, (long long)cfg->length, g, dt.u);
        break;
    case TOL_BOUND: printf("2 * bound from %s\n", pbound); break;
    case TOL_ABSREL: printf("atol + rtol*max(|a|,|b|), atol = %g, rtol = %g\n", cfg->atol, cfg->rtol); break;
    }

    double max_abs = 0, max_rel = 0, worst_ratio = -1, worst_diff = -1, worst_tol = 0;
    int64_t worst = 0, over = 0;
    int all_bf16 = 1;
    for (int64_t i = 0; i < A.h.count; i++) {
        const double x = npy_get(&A, i, dt.pattern), y = npy_get(&B, i, dt.pattern);
        double diff, rel;
        if (x == y || (isnan(x) && isnan(y))) {
            diff = 0;
            rel = 0;
        } else {
            diff = fabs(x - y);
            if (isnan(diff))
                diff = INFINITY;
            const double m = fmax(fabs(x), fabs(y));
            rel = isinf(diff) ? INFINITY : diff / m;
        }
        const double m = fmax(fabs(x), fabs(y));
        double tol = 0;
        switch (mode) {
        case TOL_EXACT: tol = 0; break;
        case TOL_ROUNDING: tol = 2 * (dt.u * m + dt.eta); break;
        case TOL_REDUCTION: tol = 2 * (g * m + dt.u * (m + g * m) + dt.eta); break;
        case TOL_BOUND: tol = 2 * npy_get(&bound, i, MOE_BF16); break;
        case TOL_ABSREL: tol = cfg->atol + cfg->rtol * m; break;
        }
        if (isnan(tol))
            tol = 0;
        const int exceeds = isinf(diff) || !(diff <= tol);
        const double ratio = diff == 0 ? 0 : isinf(diff) || tol == 0 ? INFINITY : diff / tol;
        over += exceeds;
        if (ratio > worst_ratio || (ratio == worst_ratio && diff > worst_diff)) {
            worst_ratio = ratio;
            worst_diff = diff;
            worst_tol = tol;
            worst = i;
        }
        max_abs = fmax(max_abs, diff);
        max_rel = fmax(max_rel, rel);
        all_bf16 &= is_bf16_value(x) && is_bf16_value(y);
    }
    const int digits = strcmp(dt.name, "f64") == 0 ? 17 : 9;
    printf("  max abs error  %.6e\n  max rel error  %.6e\n", max_abs, max_rel);
    if (A.h.count > 0) {
        printf("  worst element  ");
        print_index(worst, &A.h);
        printf("  a = ");
        printf("%.*g", digits, npy_get(&A, worst, dt.pattern));
        printf("  b = ");
        printf("%.*g", digits, npy_get(&B, worst, dt.pattern));
        printf("  |a-b| = %.6e  tolerance = %.6e\n", worst_diff, worst_tol);
    } else {
        printf("  worst element  none (empty)\n");
    }
    printf("  verdict        %s (%lld of %lld elements over the tolerance)\n", over ? "FAIL" : "PASS", (long long)over,
           (long long)A.h.count);
    if (over && !cfg->have_dtype && mode == TOL_ROUNDING && strcmp(dt.name, "f32") == 0 && all_bf16)
        printf("  hint           every value of both files is a bf16 value: if these are bf16 results, pass "
               "--dtype bf16\n");
    else if (over && mode == TOL_ROUNDING && (strcmp(dt.name, "f32") == 0 || strcmp(dt.name, "f64") == 0))
        printf("  hint           %s results of a sum taken in another order may differ by more than one "
               "rounding: pass --reduction-length L (the sum's length), or --bound with a gemm command's "
               "--bound-out\n", dt.name);
    release(&A);
    release(&B);
    if (mode == TOL_BOUND)
        release(&bound);
    return over ? 1 : 0;
}

static int name_cmp(const void *x, const void *y) { return strcmp(*(char *const *)x, *(char *const *)y); }

/* The sorted names of the regular *.npy files in a folder. */
static char **list_npy(const char *dir, size_t *count)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        die("%s: cannot open the folder: %s", dir, strerror(errno));
    size_t n = 0, cap = 16;
    char **names = xmalloc(cap, sizeof *names);
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        size_t len = strlen(ent->d_name);
        if (len < 5 || strcmp(ent->d_name + len - 4, ".npy") != 0)
            continue;
        char *full = join_path(dir, ent->d_name);
        int regular = is_regular(full);
        xfree(full);
        if (!regular)
            continue;
        if (n == cap) {
            cap *= 2;
            names = xrealloc(names, cap, sizeof *names);
        }
        names[n] = xmalloc(len + 1, 1);
        memcpy(names[n++], ent->d_name, len + 1);
    }
    closedir(d);
    qsort(names, n, sizeof *names, name_cmp);
    *count = n;
    return names;
}

static int run_compare(const args *a)
{
    compare_cfg cfg = {0};
    cfg.mode = TOL_ROUNDING;
    const char *s = get(a, "--dtype");
    if (s != NULL) {
        (void)dtype_by_name(s); /* refuses a bad name now */
        cfg.have_dtype = 1;
        cfg.dtype_name = s;
    }
    int modes = 0;
    if ((s = get(a, "--reduction-length")) != NULL) {
        cfg.length = parse_int_arg("--reduction-length", s, 1);
        if (cfg.length >= (int64_t)1 << 24)
            die("--reduction-length %s: gamma(L) needs L < 2^24", s);
        cfg.mode = TOL_REDUCTION;
        modes++;
    }
    if ((cfg.bound = get(a, "--bound")) != NULL) {
        cfg.mode = TOL_BOUND;
        modes++;
    }
    if (get(a, "--exact") != NULL) {
        cfg.mode = TOL_EXACT;
        modes++;
    }
    const char *atol = get(a, "--atol"), *rtol = get(a, "--rtol");
    if (atol != NULL || rtol != NULL) {
        cfg.atol = atol ? parse_double_arg("--atol", atol) : 0;
        cfg.rtol = rtol ? parse_double_arg("--rtol", rtol) : 0;
        cfg.mode = TOL_ABSREL;
        modes++;
    }
    if (modes > 1)
        die("choose one of --reduction-length, --bound, --exact and --atol/--rtol");

    const char *pa = a->pos[0], *pb = a->pos[1];
    if (is_dir(pa) || is_dir(pb)) {
        if (!is_dir(pa) || !is_dir(pb))
            die("%s: compare takes two files or two folders; %s is a %s", is_dir(pa) ? pb : pa,
                is_dir(pa) ? pa : pb, "folder");
        if (cfg.bound != NULL && !is_dir(cfg.bound))
            die("%s: with two folders, --bound must be a folder too", cfg.bound);
        size_t na, nb;
        char **names_a = list_npy(pa, &na), **names_b = list_npy(pb, &nb);
        if (na == 0)
            die("%s: no .npy files in the folder", pa);
        int failed = 0, compared = 0, missing = 0;
        for (size_t i = 0; i < na; i++) {
            char *fa = join_path(pa, names_a[i]), *fb = join_path(pb, names_a[i]);
            char *fbound = cfg.bound ? join_path(cfg.bound, names_a[i]) : NULL;
            if (!is_regular(fb)) {
                printf("%s\n  verdict        FAIL (missing from %s)\n", names_a[i], pb);
                missing++;
                failed++;
            } else {
                char label[1024];
                snprintf(label, sizeof label, "%s", names_a[i]);
                failed += compare_pair(&cfg, label, fa, fb, fbound && is_regular(fbound) ? fbound : NULL);
                compared++;
            }
            xfree(fa), xfree(fb), xfree(fbound);
        }
        for (size_t j = 0; j < nb; j++)
            if (bsearch(&names_b[j], names_a, na, sizeof *names_a, name_cmp) == NULL)
                printf("%s\n  only in %s, not compared\n", names_b[j], pb);
        printf("\nsummary: %d tensor(s) compared, %d over the tolerance or differing in shape, %d missing from %s\n",
               compared, failed - missing, missing, pb);
        return failed ? EXIT_MISMATCH : 0;
    }
    if (cfg.bound != NULL && is_dir(cfg.bound))
        die("%s: with two files, --bound must be a file", cfg.bound);
    char label[2048];
    snprintf(label, sizeof label, "%s vs %s", pa, pb);
    return compare_pair(&cfg, label, pa, pb, cfg.bound) ? EXIT_MISMATCH : 0;
}

/* ---------------------------------------------------------------------------------------------------
 * main
 * ------------------------------------------------------------------------------------------------- */
/* ---------------------------------------------------------------------------------------------------
 * autotune
 * ------------------------------------------------------------------------------------------------- */
static int run_autotune(const args *a)
{
    const char *op_name = need(a, "--op"), *cache = need(a, "--cache");
    moe_gemm_op op;
    if (strcmp(op_name, "fwd") == 0)
        op = MOE_GEMM_FWD;
    else if (strcmp(op_name, "dx") == 0)
        op = MOE_GEMM_DX;
    else if (strcmp(op_name, "dw") == 0)
        op = MOE_GEMM_DW;
    else
        die("--op %s: expected fwd, dx or dw", op_name);
    const int64_t T = parse_int_arg("--tokens", need(a, "--tokens"), 1);
    const int64_t E = parse_int_arg("--experts", need(a, "--experts"), 1);
    const int64_t k = get(a, "--topk") ? parse_int_arg("--topk", get(a, "--topk"), 1) : 1;
    const int64_t N = parse_int_arg("--n", need(a, "--n"), 1), K = parse_int_arg("--k", need(a, "--k"), 1);
    const int64_t repeats = get(a, "--repeats") ? parse_int_arg("--repeats", get(a, "--repeats"), 1) : 20;
    const int64_t seed = get(a, "--seed") ? parse_int_arg("--seed", get(a, "--seed"), 0) : 1;
    if (k > E)
        die("--topk %lld: a token's experts are distinct, so k <= E = %lld", (long long)k, (long long)E);
    if (repeats > 1000)
        die("--repeats %lld: expected 1 .. 1000", (long long)repeats);
    moe_gemm_options o;
    memset(&o, 0, sizeof o);
    o.dtype = MOE_BF16;
    if (get(a, "--dtype") && !parse_dtype(get(a, "--dtype"), &o.dtype))
        die("--dtype %s: expected f32, f16 or bf16", get(a, "--dtype"));
    o.permute_x = get(a, "--permute-x") != NULL, o.permute_y = get(a, "--permute-y") != NULL;
    o.reduce_topk = get(a, "--reduce-topk") != NULL, o.dw_fp32 = get(a, "--dw-fp32") != NULL;
    o.allow_tf32 = get(a, "--allow-tf32") != NULL;
    const int weighted = get(a, "--topk-weights") != NULL;
    if (o.reduce_topk && op != MOE_GEMM_DX)
        die("--reduce-topk: only with --op dx");
    if (o.dw_fp32 && op != MOE_GEMM_DW)
        die("--dw-fp32: only with --op dw");
    /* the CUDA backend, as --backend cuda demands it */
#ifndef MOE_CLI_CUDA
    (void)cache, (void)N, (void)K, (void)seed, (void)weighted, (void)T;
    die("this build has no CUDA backend (configure --with-cuda where the CUDA toolkit is installed)");
#else
    require_cuda_device("", "");
    lib_call c = {"moe_gemm_autotune", MOE_BACKEND_CUDA, 0, {{0}}};
    const int64_t M = (int64_t)elements(T, k, 1);
    oracle_rng rng = {(uint64_t)seed};
    int64_t *ids = xmalloc(elements(M, 1, 1), sizeof(int64_t));
    oracle_topk_ids(&rng, T, k, E, ids); /* k <= E: checked above */
    int64_t *m_sizes = xmalloc(elements(E, 1, 1), sizeof(int64_t)), *gather = xmalloc(elements(M, 1, 1), sizeof(int64_t));
    moe_status st = moe_routing_from_topk(T, k, E, ids, m_sizes, gather, NULL);
    if (st != MOE_OK)
        library_failed("moe_routing_from_topk", st);
    const moe_routing host_routing = {T, k, E, m_sizes, gather};
    const moe_routing r = call_routing(&c, &host_routing);
    const size_t es = moe_dtype_size(o.dtype);
    /* a and b of the op (moe.h, moe_gemm_op): fwd x, w; dx dy, w; dw x, dy */
    const int64_t x_rows = o.permute_x ? T : M;
    const int64_t a_count = (int64_t)(op == MOE_GEMM_DX ? elements(M, N, 1) : elements(x_rows, K, 1));
    const int64_t b_count = (int64_t)(op == MOE_GEMM_DW ? elements(M, N, 1) : elements(E, N, K));
    const int64_t out_count = (int64_t)(op == MOE_GEMM_FWD ? elements(M, N, 1) : op == MOE_GEMM_DW ? elements(E, N, K)
                                        : elements(o.reduce_topk ? T : M, K, 1));
    const size_t out_es = op == MOE_GEMM_DW && o.dw_fp32 ? 4 : es;
    void *host_a = xmalloc((size_t)a_count, es), *host_b = xmalloc((size_t)b_count, es);
    void *host_tw = weighted ? xmalloc((size_t)M, es) : NULL;
    oracle_fill(&rng, o.dtype, host_a, a_count, 0);
    oracle_fill(&rng, o.dtype, host_b, b_count, 0);
    if (weighted)
        oracle_fill(&rng, o.dtype, host_tw, M, 0);
    const void *dev_a = call_in(&c, op == MOE_GEMM_DX ? "dy" : "x", host_a, (size_t)a_count * es);
    const void *dev_b = call_in(&c, op == MOE_GEMM_DW ? "dy" : "w", host_b, (size_t)b_count * es);
    const void *dev_tw = call_in(&c, "topk_weights", host_tw, (size_t)M * es);
    void *dev_out = to_device(&c, NULL, (size_t)out_count * out_es, "out");
    xfree(host_a), xfree(host_b);
    if (host_tw)
        xfree(host_tw);
    moe_gemm_tuning chosen;
    st = moe_gemm_autotune(op, &r, N, K, dev_a, dev_b, dev_tw, dev_out, &o, (int)repeats, cache, &chosen);
    call_end(&c, st);
    const double flops = 2.0 * (double)M * (double)N * (double)K;
    printf("%s E=%lld T=%lld k=%lld (M=%lld) N=%lld K=%lld %s: %d configurations timed; kept %s, tile rows %d, "
           "cluster %d, TMA store %d, dW ping-pong %d: median %.1f us (%.1f TFLOP/s); appended to %s\n",
           op_name, (long long)E, (long long)T, (long long)k, (long long)M, (long long)N, (long long)K,
           moe_dtype_name(o.dtype), chosen.candidates, chosen.kernel, chosen.tile_rows, chosen.cluster,
           chosen.tma_store, chosen.dw_pingpong, chosen.median_us, chosen.median_us > 0 ? flops / chosen.median_us / 1e6 : 0.0, cache);
    return 0;
#endif
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        print_usage(stderr);
        fprintf(stderr, "\nmoe --help documents every command and option.\n");
        return EXIT_USAGE;
    }
    const char *name = argv[1];
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0 || strcmp(name, "help") == 0) {
        if (argc > 2 && strcmp(name, "help") == 0) {
            for (size_t i = 0; i < NCOMMANDS; i++)
                if (strcmp(commands[i].name, argv[2]) == 0) {
                    print_command_help(stdout, &commands[i]);
                    return 0;
                }
            die("unknown command '%s' (see moe --help)", argv[2]);
        }
        print_full_help(stdout);
        return 0;
    }
    if (strcmp(name, "--version") == 0) {
        printf("moe (libmoe) %d.%d.%d\n", LIBMOE_VERSION_MAJOR, LIBMOE_VERSION_MINOR, LIBMOE_VERSION_PATCH);
        return 0;
    }
    for (size_t i = 0; i < NCOMMANDS; i++) {
        if (strcmp(commands[i].name, name) != 0)
            continue;
        snprintf(current_command, sizeof current_command, "moe %s", name);
        args a;
        parse_args(&commands[i], argc - 2, argv + 2, &a);
        atexit(discard_outputs);
        int status = commands[i].run(&a);
        if (outputs.count != 0)
            die("internal error: %s was written but not committed", outputs.file[0].path);
        if (fflush(stdout) != 0)
            die("cannot write to standard output");
        return status;
    }
    die("unknown command '%s' (see moe --help)", name);
}
