/*
 * cli/cmd_gemm.c: the grouped GEMM commands gemm-fwd, gemm-dx and gemm-dw: their options and help, the
 * routing they read (--m-sizes, --gather), one library call each, and the oracle's bounds (--bound-out).
 */
#include "cli.h"
#include "oracle.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define OPT_TF32                                                                                       \
    {"--allow-tf32", NULL,                                                                             \
     "with --dtype f32: allow TF32 tensor cores on the CUDA backend (fwd, dx and dw without topk "      \
     "weights; the reference stays true fp32); --bound-out then includes TF32's rounding. Refused "     \
     "with f16 and bf16."}
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

static int run_gemm_fwd(const args *a);
static int run_gemm_dx(const args *a);
static int run_gemm_dw(const args *a);

const command gemm_fwd_command = {
    "gemm-fwd",
    "--x X.npy --w W.npy --m-sizes M.npy [--gather G.npy --topk K] [--permute-x] [--permute-y] "
    "[--topk-weights TW.npy] [--dtype f32|f16|bf16] [--allow-tf32] [--backend ref|cuda] --out Y.npy [--raw] [--bound-out B.npy]",
    "grouped GEMM forward: Y = X . W[e]^T per expert (moe_gemm_fwd)",
    "For expert-order row r of expert e: y_r = xsrc_r . W[e]^T, accumulated in float32 and rounded once "
    "(SEMANTICS section 2). Rows [off_e, off_e + m_e) belong to expert e.",
    gemm_fwd_opts, 0, run_gemm_fwd,
    "# recompute a step's expert-order output y from x (token order) and the routing route wrote\n"
    "moe gemm-fwd --x step/x.npy --w step/w.npy --m-sizes routing/m_sizes.npy \\\n"
    "    --gather routing/gather_indices.npy --topk 2 --permute-x \\\n"
    "    --out y_ref.npy --bound-out y_bound.npy",
};

const command gemm_dx_command = {
    "gemm-dx",
    "--dy DY.npy --w W.npy --m-sizes M.npy [--gather G.npy --topk K] [--permute-x] [--permute-y] "
    "[--topk-weights TW.npy] [--reduce-topk] [--dtype ...] [--allow-tf32] [--backend ...] --out DX.npy [--raw] [--bound-out B.npy]",
    "grouped GEMM input gradient: dX = dY . W[e] per expert (moe_gemm_dx)",
    "The routing flags describe the forward whose gradient this is: --permute-y reads dY in slot order, "
    "--permute-x writes dX in slot order, --topk-weights scales each dY source row.",
    gemm_dx_opts, 0, run_gemm_dx,
    "# the gradient of x (token order, summed over each token's 2 rows) from dy in expert order\n"
    "moe gemm-dx --dy step/dy.npy --w step/w.npy --m-sizes routing/m_sizes.npy \\\n"
    "    --gather routing/gather_indices.npy --topk 2 --permute-x --reduce-topk --out dx_ref.npy",
};

const command gemm_dw_command = {
    "gemm-dw",
    "--x X.npy --dy DY.npy --m-sizes M.npy [--gather G.npy --topk K] [--permute-x] [--permute-y] "
    "[--topk-weights TW.npy] [--dw-fp32] [--dtype ...] [--allow-tf32] [--backend ...] --out DW.npy "
    "[--w W.npy --out-topk-weights-grad DTW.npy] [--raw] [--bound-out B.npy]",
    "grouped GEMM weight gradient: dW[e] = sum over rows of dY^T (x) X (moe_gemm_dw)",
    "dW[e] sums, over the rows r of expert e, dysrc_r^T (x) xsrc_r, with the sources chosen by the "
    "forward's routing flags; float32 accumulation over all rows of the expert, one rounding.",
    gemm_dw_opts, 0, run_gemm_dw,
    "# the gradient of w, per expert\n"
    "moe gemm-dw --x step/x.npy --dy step/dy.npy --m-sizes routing/m_sizes.npy \\\n"
    "    --gather routing/gather_indices.npy --topk 2 --permute-x --out dw_ref.npy",
};

/* ---------------------------------------------------------------------------------------------------
 * Routing
 * ------------------------------------------------------------------------------------------------- */
/* (cli.h) */
void load_routing(const args *a, routing_in *ri)
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

void require_gather(const routing_in *ri, const char *flag)
{
    if (ri->gather == NULL)
        die("%s needs --gather G.npy --topk K (the routing's gather_indices)", flag);
}

/* ---------------------------------------------------------------------------------------------------
 * Checking the routing options and the operands
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

void check_topk_weights(const char *path, const npy_array *tw, const routing_in *ri)
{
    const npy_header *h = &tw->h;
    if (!((h->ndim == 1 && h->shape[0] == ri->M) ||
          (h->ndim == 2 && h->shape[0] == ri->T && h->shape[1] == ri->k)))
        die("%s: expected topk weights of shape (%lld,) or (%lld, %lld) (M = T*k slots), found %s %s", path,
            (long long)ri->M, (long long)ri->T, (long long)ri->k, shape_text(h), npy_type_name(h->type));
}

/* Why an operand has the rows it must have, for its error: T tokens with `flag` (permuted), else M rows. */
static const char *rows_why(const routing_in *ri, int permuted, const char *flag, char *buf, size_t size)
{
    if (permuted)
        snprintf(buf, size, "T = %lld tokens because of %s", (long long)ri->T, flag);
    else
        snprintf(buf, size, "M = %lld rows, the sum of %s", (long long)ri->M, ri->m_path);
    return buf;
}

/* ---------------------------------------------------------------------------------------------------
 * The steps every gemm command takes
 * ------------------------------------------------------------------------------------------------- */
/* moe_gemm_fwd, moe_gemm_dx, moe_gemm_dw, and the oracle's functions of the same three ops */
typedef moe_status (*gemm_function)(moe_backend backend, const moe_routing *routing, int64_t N, int64_t K,
                                    const void *a, const void *b, const void *topk_weights, void *out,
                                    const moe_gemm_options *options);
typedef void (*oracle_function)(const moe_routing *routing, int64_t N, int64_t K, const void *a, const void *b,
                                const void *topk_weights, const void *old_out, const moe_gemm_options *options,
                                double *value, double *bound);

/* One grouped GEMM op, out = op(a, b) as moe.h's moe_gemm_op names them: fwd y = op(x, w), dx dx = op(dy, w),
 * dw dw = op(x, dy). */
typedef struct gemm_op {
    const char *name;                       /* the library function's, for messages */
    gemm_function function;
    oracle_function oracle;                 /* the bounds of --bound-out */
    const char *a_opt, *b_opt;              /* the options naming a and b */
    const char *a_name, *b_name, *out_name; /* the arrays, for device errors */
    const char *w_opt, *w_out_opt;          /* gemm-dw only: --w and the output it serves, else NULL */
} gemm_op;

/* The inputs of a gemm command, in the order it loads them. */
enum gemm_input { GEMM_A, GEMM_B, GEMM_TW, GEMM_W, GEMM_INPUTS };

/* A gemm command from its options to its converted inputs. */
typedef struct gemm_cmd {
    const gemm_op *op;
    lib_call call;
    const char *out; /* --out */
    routing_in ri;
    moe_gemm_options o;
    const char *path[GEMM_INPUTS]; /* NULL: not given (--topk-weights, gemm-dw's --w) */
    npy_array arr[GEMM_INPUTS];
    void *data[GEMM_INPUTS];    /* a, b and the topk weights in o.dtype, once gemm_run converted them */
    size_t bytes[GEMM_INPUTS];  /* of data[i] */
} gemm_cmd;

/* Starts a gemm command: the backend, every file it writes and reads claimed before any is read, the
 * routing loaded and the routing options parsed. */
static void gemm_begin(const args *a, const gemm_op *op, gemm_cmd *g)
{
    memset(g, 0, sizeof *g);
    g->op = op;
    g->call = (lib_call){op->name, get_backend(a), 0, {{0}}};
    g->path[GEMM_A] = need(a, op->a_opt);
    g->path[GEMM_B] = need(a, op->b_opt);
    g->out = need(a, "--out");
    g->path[GEMM_TW] = get(a, "--topk-weights");
    g->path[GEMM_W] = op->w_opt ? get(a, op->w_opt) : NULL;
    claim_files(a, (const char *const[]){"--out", "--bound-out", op->w_out_opt, NULL},
                (const char *const[]){op->a_opt, op->b_opt, "--m-sizes", "--gather", "--topk-weights", op->w_opt,
                                      NULL});
    load_routing(a, &g->ri);
    gemm_options(a, &g->ri, &g->o);
}

/* Loads the inputs given and chooses the computation dtype from them. */
static void gemm_load(const args *a, gemm_cmd *g)
{
    const npy_array *arrays[GEMM_INPUTS] = {NULL};
    for (int i = 0; i < GEMM_INPUTS; i++)
        if (g->path[i] != NULL) {
            load(g->path[i], &g->arr[i]);
            arrays[i] = &g->arr[i];
        }
    g->o.dtype = choose_dtype(a, arrays, g->path, GEMM_INPUTS);
}

/* The float64 oracle's bound of every output element, written as float64 (--bound-out). */
static void write_bound(const args *a, const gemm_cmd *g, int64_t N, int64_t K, int ndim, const int64_t *shape)
{
    const char *path = get(a, "--bound-out");
    if (path == NULL)
        return;
    int64_t count = 1;
    for (int i = 0; i < ndim; i++)
        count *= shape[i];
    double *value = xmalloc((size_t)count, sizeof(double)), *bound = xmalloc((size_t)count, sizeof(double));
    g->op->oracle(&g->ri.r, N, K, g->data[GEMM_A], g->data[GEMM_B], g->data[GEMM_TW], NULL, &g->o, value, bound);
    write_array(path, NPY_T_F64, ndim, shape, bound);
    xfree(value);
    xfree(bound);
}

/* Converts a, b and the topk weights to the computation dtype, runs the op on the chosen backend into an
 * output of out_dtype and `shape` (2 or 3 dimensions), and writes it to --out, and its bounds to --bound-out.
 * The caller checked the shapes and commits the outputs. */
static void gemm_run(const args *a, gemm_cmd *g, int64_t N, int64_t K, moe_dtype out_dtype, int ndim,
                     const int64_t *shape)
{
    const size_t es = moe_dtype_size(g->o.dtype);
    for (int i = GEMM_A; i <= GEMM_TW; i++)
        if (g->path[i] != NULL) {
            g->data[i] = convert(g->path[i], &g->arr[i], g->o.dtype);
            g->bytes[i] = elements(g->arr[i].h.count, es, 1);
        }
    const size_t count = elements(shape[0], shape[1], ndim == 3 ? shape[2] : 1), out_es = moe_dtype_size(out_dtype);
    void *out = xmalloc(count, out_es);
    lib_call *c = &g->call;
    const moe_routing r = call_routing(c, &g->ri.r);
    call_end(c, g->op->function(c->backend, &r, N, K, call_in(c, g->op->a_name, g->data[GEMM_A], g->bytes[GEMM_A]),
                                call_in(c, g->op->b_name, g->data[GEMM_B], g->bytes[GEMM_B]),
                                call_in(c, "topk_weights", g->data[GEMM_TW], g->bytes[GEMM_TW]),
                                call_out(c, g->op->out_name, out, count * out_es), &g->o));
    write_result(a, g->out, out_dtype, out, ndim, shape);
    write_bound(a, g, N, K, ndim, shape);
}

/* ---------------------------------------------------------------------------------------------------
 * gemm-fwd, gemm-dx, gemm-dw
 * ------------------------------------------------------------------------------------------------- */
static const gemm_op gemm_fwd_op = {"moe_gemm_fwd", moe_gemm_fwd, oracle_gemm_fwd, "--x", "--w", "x", "w", "y",
                                    NULL, NULL};
static const gemm_op gemm_dx_op = {"moe_gemm_dx", moe_gemm_dx, oracle_gemm_dx, "--dy", "--w", "dy", "w", "dx",
                                   NULL, NULL};
static const gemm_op gemm_dw_op = {"moe_gemm_dw", moe_gemm_dw, oracle_gemm_dw_split, "--x", "--dy", "x", "dy", "dw",
                                   "--w", "--out-topk-weights-grad"};

static int run_gemm_fwd(const args *a)
{
    gemm_cmd g;
    gemm_begin(a, &gemm_fwd_op, &g);
    gemm_load(a, &g);
    const char *x_path = g.path[GEMM_A], *w_path = g.path[GEMM_B], *tw_path = g.path[GEMM_TW];
    const npy_array *x = &g.arr[GEMM_A], *w = &g.arr[GEMM_B];

    check_weights(w_path, w, g.ri.E, g.ri.m_path);
    const int64_t N = w->h.shape[1], K = w->h.shape[2];
    char why[1024], buf[256];
    snprintf(why, sizeof why, "%s; K = %lld from %s", rows_why(&g.ri, g.o.permute_x, "--permute-x", buf, sizeof buf),
             (long long)K, w_path);
    check_matrix(x_path, x, g.o.permute_x ? g.ri.T : g.ri.M, K, 1, why);
    if (tw_path)
        check_topk_weights(tw_path, &g.arr[GEMM_TW], &g.ri);

    const int64_t shape[2] = {g.ri.M, N};
    gemm_run(a, &g, N, K, g.o.dtype, 2, shape);
    commit_outputs();
    return 0;
}

static int run_gemm_dx(const args *a)
{
    gemm_cmd g;
    gemm_begin(a, &gemm_dx_op, &g);
    g.o.reduce_topk = get(a, "--reduce-topk") != NULL;
    if (g.o.reduce_topk)
        require_gather(&g.ri, "--reduce-topk");
    gemm_load(a, &g);
    const char *dy_path = g.path[GEMM_A], *w_path = g.path[GEMM_B], *tw_path = g.path[GEMM_TW];
    const npy_array *dy = &g.arr[GEMM_A], *w = &g.arr[GEMM_B];

    check_weights(w_path, w, g.ri.E, g.ri.m_path);
    const int64_t N = w->h.shape[1], K = w->h.shape[2];
    char why[1024];
    snprintf(why, sizeof why, "M = %lld rows, the sum of %s; N = %lld from %s", (long long)g.ri.M, g.ri.m_path,
             (long long)N, w_path);
    check_matrix(dy_path, dy, g.ri.M, N, 1, why);
    if (tw_path)
        check_topk_weights(tw_path, &g.arr[GEMM_TW], &g.ri);

    const int64_t shape[2] = {g.o.reduce_topk ? g.ri.T : g.ri.M, K};
    gemm_run(a, &g, N, K, g.o.dtype, 2, shape);
    commit_outputs();
    return 0;
}

static int run_gemm_dw(const args *a)
{
    gemm_cmd g;
    gemm_begin(a, &gemm_dw_op, &g);
    const char *x_path = g.path[GEMM_A], *dy_path = g.path[GEMM_B], *tw_path = g.path[GEMM_TW];
    const char *w_path = g.path[GEMM_W], *dtw_out = get(a, "--out-topk-weights-grad");
    g.o.dw_fp32 = get(a, "--dw-fp32") != NULL;
    if (dtw_out != NULL && w_path == NULL)
        die("--out-topk-weights-grad needs --w W.npy (it recomputes X . W[e]^T)");
    if (dtw_out != NULL)
        require_gather(&g.ri, "--out-topk-weights-grad");
    if (w_path != NULL && dtw_out == NULL)
        die("--w is only used by --out-topk-weights-grad; give both or neither");
    gemm_load(a, &g);
    const npy_array *x = &g.arr[GEMM_A], *dy = &g.arr[GEMM_B], *tw = &g.arr[GEMM_TW];

    if (x->h.ndim < 2)
        die("%s: expected a matrix of shape (rows, K), found %s %s", x_path, shape_text(&x->h),
            npy_type_name(x->h.type));
    if (dy->h.ndim < 2)
        die("%s: expected a matrix of shape (M, N), found %s %s", dy_path, shape_text(&dy->h),
            npy_type_name(dy->h.type));
    const int64_t K = x->h.shape[x->h.ndim - 1], N = dy->h.shape[dy->h.ndim - 1];
    char why[1024], buf[256];
    snprintf(why, sizeof why, "%s", rows_why(&g.ri, g.o.permute_x, "--permute-x", buf, sizeof buf));
    check_matrix(x_path, x, g.o.permute_x ? g.ri.T : g.ri.M, K, 1, why);
    snprintf(why, sizeof why, "M = %lld rows, the sum of %s", (long long)g.ri.M, g.ri.m_path);
    check_matrix(dy_path, dy, g.ri.M, N, 1, why);
    if (tw_path)
        check_topk_weights(tw_path, tw, &g.ri);
    if (w_path) {
        snprintf(why, sizeof why, "E from %s, N from %s, K from %s", g.ri.m_path, dy_path, x_path);
        check_weights_nk(w_path, &g.arr[GEMM_W], g.ri.E, N, K, why);
    }

    const moe_dtype dw_dtype = g.o.dw_fp32 ? MOE_F32 : g.o.dtype;
    const int64_t shape[3] = {g.ri.E, N, K};
    gemm_run(a, &g, N, K, dw_dtype, 3, shape);

    if (dtw_out != NULL) {
        /* the gradient of the fused topk weights, a second library call on the same inputs */
        const size_t es = moe_dtype_size(g.o.dtype), dws = moe_dtype_size(dw_dtype);
        void *wd = convert(w_path, &g.arr[GEMM_W], g.o.dtype);
        void *dtw = xmalloc((size_t)g.ri.M, dws);
        lib_call c = {"moe_gemm_topk_weights_grad", g.call.backend, 0, {{0}}};
        const moe_routing r = call_routing(&c, &g.ri.r);
        call_end(&c, moe_gemm_topk_weights_grad(c.backend, &r, N, K, call_in(&c, "x", g.data[GEMM_A], g.bytes[GEMM_A]),
                                                call_in(&c, "w", wd, elements(g.ri.E, N, K) * es),
                                                call_in(&c, "dy", g.data[GEMM_B], g.bytes[GEMM_B]),
                                                call_out(&c, "d_topk_weights", dtw, elements(g.ri.M, dws, 1)), &g.o));
        int64_t tshape[2] = {g.ri.T, g.ri.k};
        int tndim = 2;
        if (tw_path && tw->h.ndim == 1) {
            tshape[0] = g.ri.M;
            tndim = 1;
        }
        write_result(a, dtw_out, dw_dtype, dtw, tndim, tshape);
    }
    commit_outputs();
    return 0;
}
