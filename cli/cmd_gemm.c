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
};

const command gemm_dx_command = {
    "gemm-dx",
    "--dy DY.npy --w W.npy --m-sizes M.npy [--gather G.npy --topk K] [--permute-x] [--permute-y] "
    "[--topk-weights TW.npy] [--reduce-topk] [--dtype ...] [--allow-tf32] [--backend ...] --out DX.npy [--raw] [--bound-out B.npy]",
    "grouped GEMM input gradient: dX = dY . W[e] per expert (moe_gemm_dx)",
    "The routing flags describe the forward whose gradient this is: --permute-y reads dY in slot order, "
    "--permute-x writes dX in slot order, --topk-weights scales each dY source row.",
    gemm_dx_opts, 0, run_gemm_dx,
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
};

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
 * The oracle's bounds
 * ------------------------------------------------------------------------------------------------- */
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
