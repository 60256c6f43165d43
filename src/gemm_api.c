/* Public grouped GEMM entry points: validate every argument, then call the backend's table. */
#include "gemm_prepare.h"
#include "moe_backend.h"
#include "moe_ref.h"

#include <inttypes.h>
#include <stdint.h>

enum gemm_op { OP_FWD, OP_DX, OP_DW, OP_TOPK_GRAD, OP_BWD };

static const moe_gemm_options default_options; /* all zero: f32, no fusion, overwrite */

/* Validates dimensions, options and routing, and fills the problem description. */
static moe_status build_problem(const char *op, enum gemm_op which, const moe_dispatch *table,
                                const moe_routing *routing, int64_t N, int64_t K, const void *topk_weights,
                                const moe_gemm_options *opt, moe_gemm_problem *p)
{
    if (routing == NULL)
        return moe_fail(MOE_ERR_NULL_POINTER, "%s: routing is NULL", op);
    if (opt->dtype == MOE_E4M3 || opt->dtype == MOE_E5M2)
        return moe_fail(MOE_ERR_INVALID_DTYPE, "%s: options.dtype = %s: FP8 tensors need their scales, which "
                        "moe_gemm_fp8_fwd / moe_gemm_fp8_dx take", op, moe_dtype_name(opt->dtype));
    if (opt->dtype != MOE_F32 && opt->dtype != MOE_F16 && opt->dtype != MOE_BF16)
        return moe_fail(MOE_ERR_INVALID_DTYPE, "%s: options.dtype = %d, expected MOE_F32, MOE_F16 or MOE_BF16",
                        op, (int)opt->dtype);
    const int64_t T = routing->num_tokens, k = routing->topk, E = routing->num_experts;
    if (T < 0)
        return moe_fail(MOE_ERR_INVALID_SHAPE, "%s: routing.num_tokens = %" PRId64 ", expected >= 0", op, T);
    if (k < 0 || (k == 0 && T > 0))
        return moe_fail(MOE_ERR_INVALID_SHAPE, "%s: routing.topk = %" PRId64 ", expected >= 1 (0 only with "
                        "num_tokens = 0)", op, k);
    if (E < 1)
        return moe_fail(MOE_ERR_INVALID_SHAPE, "%s: routing.num_experts = %" PRId64 ", expected >= 1", op, E);
    if (N < 0 || K < 0)
        return moe_fail(MOE_ERR_INVALID_SHAPE, "%s: N = %" PRId64 ", K = %" PRId64 ", expected both >= 0", op,
                        N, K);
    /* each cause its own message, so that no bound is blamed on another; SIZE_MAX / 16 bounds the index
     * arrays and the per-expert scratch in bytes */
    int64_t M = 0, EN = 0, ENK = 0;
    if (!moe_mul_ok(T, k, &M))
        return moe_fail(MOE_ERR_OVERFLOW, "%s: T*k = %" PRId64 "*%" PRId64 " overflows 64 bits", op, T, k);
    if ((uint64_t)M > SIZE_MAX / 16)
        return moe_fail(MOE_ERR_OVERFLOW, "%s: T*k = %" PRId64 " rows exceeds SIZE_MAX / 16", op, M);
    if ((uint64_t)E > SIZE_MAX / 16)
        return moe_fail(MOE_ERR_OVERFLOW, "%s: routing.num_experts = %" PRId64 " exceeds SIZE_MAX / 16", op, E);
    if (!moe_mul_ok(E, N, &EN) || !moe_mul_ok(EN, K, &ENK))
        return moe_fail(MOE_ERR_OVERFLOW, "%s: E*N*K = %" PRId64 "*%" PRId64 "*%" PRId64 " overflows 64 bits", op,
                        E, N, K);

    /* options that do not belong to this op are refused, never ignored; except dw_fp32, the output dtype
     * of dW and d_topk_weights, which one options struct shared by a layer's calls carries to fwd and dX
     * too (moe_gemm_bwd's dX is checked against moe_gemm_dx with the same options) */
    if (opt->reduce_topk && which != OP_DX && which != OP_BWD)
        return moe_fail(MOE_ERR_INVALID_OPTION, "%s: options.reduce_topk applies to dX only", op);
    if ((opt->dx_only || opt->dw_only) && which != OP_BWD)
        return moe_fail(MOE_ERR_INVALID_OPTION, "%s: options.dx_only/dw_only apply to moe_gemm_bwd only", op);
    if (opt->dx_only && opt->dw_only)
        return moe_fail(MOE_ERR_INVALID_OPTION, "%s: options.dx_only and options.dw_only are both set", op);
    if (opt->allow_tf32 && opt->dtype != MOE_F32)
        return moe_fail(MOE_ERR_INVALID_OPTION, "%s: options.allow_tf32 applies to MOE_F32 only, dtype is %s",
                        op, moe_dtype_name(opt->dtype));
    if (opt->ref_scratch_bytes < 0)
        return moe_fail(MOE_ERR_INVALID_OPTION, "%s: options.ref_scratch_bytes = %" PRId64 ", expected >= 0 "
                        "(0: the default)", op, opt->ref_scratch_bytes);
    if (routing->m_sizes == NULL)
        return moe_fail(MOE_ERR_NULL_POINTER, "%s: routing.m_sizes is NULL", op);
    int need_gather = opt->permute_x || opt->permute_y || opt->reduce_topk || topk_weights != NULL ||
                      which == OP_TOPK_GRAD;
    if (need_gather && M > 0 && routing->gather_indices == NULL)
        return moe_fail(MOE_ERR_NULL_POINTER, "%s: routing.gather_indices is NULL but %s needs it", op,
                        opt->permute_x ? "permute_x" : opt->permute_y ? "permute_y"
                        : opt->reduce_topk ? "reduce_topk" : topk_weights != NULL ? "topk_weights"
                        : "the topk-weight gradient");
    moe_status aligned = moe_check_aligned(op, "routing.m_sizes", routing->m_sizes, 8, "int64");
    if (aligned == MOE_OK)
        aligned = moe_check_aligned(op, "routing.gather_indices", routing->gather_indices, 8, "int64");
    if (aligned != MOE_OK)
        return aligned;
    if (table->validates_routing_on_host) {
        moe_status status = moe_ref_check_routing(op, E, M, routing->m_sizes, routing->gather_indices,
                                                  need_gather || routing->gather_indices != NULL);
        if (status != MOE_OK)
            return status;
    }

    p->op = op;
    p->num_tokens = T;
    p->topk = k;
    p->num_experts = E;
    p->rows = M;
    p->N = N;
    p->K = K;
    p->m_sizes = routing->m_sizes;
    p->gather_indices = routing->gather_indices;
    p->dtype = opt->dtype;
    p->dw_dtype = opt->dw_fp32 ? MOE_F32 : opt->dtype;
    p->permute_x = opt->permute_x != 0;
    p->permute_y = opt->permute_y != 0;
    p->reduce_topk = opt->reduce_topk != 0;
    p->accumulate = opt->accumulate != 0;
    p->allow_tf32 = opt->allow_tf32 != 0;
    p->stream = opt->stream;
    p->ref_scratch_bytes = opt->ref_scratch_bytes ? opt->ref_scratch_bytes : MOE_REF_DEFAULT_SCRATCH_BYTES;
    return MOE_OK;
}

/* Checks the op's tensors, and that no output overlaps another argument, the routing arrays included
 * (a kernel reading gather_indices must never see them overwritten). */
moe_status moe_gemm_check_tensors(const char *op, const moe_gemm_problem *p, const moe_array_arg *args, int count)
{
    enum { MAX_ARGS = 8 };
    moe_array_arg all[MAX_ARGS + 2];
    for (int i = 0; i < count; i++)
        all[i] = args[i];
    all[count] = (moe_array_arg){"routing.m_sizes", p->m_sizes, p->num_experts, 1, MOE_F32, 0, 1};
    all[count + 1] = (moe_array_arg){"routing.gather_indices", p->gather_indices,
                                  p->gather_indices != NULL ? p->rows : 0, 1, MOE_F32, 0, 1};
    return moe_check_arrays(op, all, count + 2);
}

static const moe_dispatch *backend_table(const char *op, moe_backend backend)
{
    const moe_dispatch *table = moe_dispatch_for(backend);
    if (backend != MOE_BACKEND_REF && backend != MOE_BACKEND_CUDA) { /* as the MLP's entry points say it */
        moe_fail(MOE_ERR_NO_BACKEND, "%s: backend %d is not a libmoe backend", op, (int)backend);
        return NULL;
    }
    if (table == NULL) {
        moe_fail(MOE_ERR_NO_BACKEND, "%s: backend %d (%s) was not built into this libmoe", op, (int)backend,
                 moe_backend_name(backend));
        return NULL;
    }
    if (!table->available()) {
        moe_fail(MOE_ERR_NO_BACKEND, "%s: backend %s is built in but cannot run here (no device?)", op,
                 table->name);
        return NULL;
    }
    return table;
}

/* Everything the five entry points share: options default, table, problem. */
static moe_status prepare(const char *op, enum gemm_op which, moe_backend backend, const moe_routing *routing,
                          int64_t N, int64_t K, const void *topk_weights, const moe_gemm_options **opt,
                          const moe_dispatch **table, moe_gemm_problem *p)
{
    moe_clear_error();
    if (*opt == NULL)
        *opt = &default_options;
    *table = backend_table(op, backend);
    if (*table == NULL)
        return MOE_ERR_NO_BACKEND;
    return build_problem(op, which, *table, routing, N, K, topk_weights, *opt, p);
}

moe_status moe_gemm_prepare(const char *op, int is_dx, moe_backend backend, const moe_routing *routing, int64_t N,
                            int64_t K, const void *topk_weights, const moe_gemm_options *options,
                            const moe_dispatch **table, moe_gemm_problem *p)
{
    return prepare(op, is_dx ? OP_DX : OP_FWD, backend, routing, N, K, topk_weights, &options, table, p);
}

static int64_t x_rows(const moe_gemm_problem *p) { return p->permute_x ? p->num_tokens : p->rows; }

moe_status moe_gemm_fwd(moe_backend backend, const moe_routing *routing, int64_t N, int64_t K,
                        const void *x, const void *w, const void *topk_weights, void *y,
                        const moe_gemm_options *options)
{
    static const char op[] = "moe_gemm_fwd";
    const moe_dispatch *table;
    moe_gemm_problem p;
    moe_status status = prepare(op, OP_FWD, backend, routing, N, K, topk_weights, &options, &table, &p);
    if (status != MOE_OK)
        return status;
    const moe_array_arg args[] = {
        {"x", x, x_rows(&p), K, p.dtype, 0, 0},
        {"w", w, p.num_experts * N, K, p.dtype, 0, 0},
        {"topk_weights", topk_weights, topk_weights ? p.rows : 0, 1, p.dtype, 0, 0},
        {"y", y, p.rows, N, p.dtype, 1, 0},
    };
    status = moe_gemm_check_tensors(op, &p, args, 4);
    return status != MOE_OK ? status : table->gemm_fwd(&p, x, w, topk_weights, y);
}

static moe_status dx_tensors(const char *op, const moe_gemm_problem *p, const void *dy, const void *w,
                             const void *topk_weights, const void *dx)
{
    const moe_array_arg args[] = {
        {"dy", dy, p->rows, p->N, p->dtype, 0, 0},
        {"w", w, p->num_experts * p->N, p->K, p->dtype, 0, 0},
        {"topk_weights", topk_weights, topk_weights ? p->rows : 0, 1, p->dtype, 0, 0},
        {"dx", dx, p->reduce_topk ? p->num_tokens : p->rows, p->K, p->dtype, 1, 0},
    };
    return moe_gemm_check_tensors(op, p, args, 4);
}

static moe_status dw_tensors(const char *op, const moe_gemm_problem *p, const void *x, const void *dy,
                             const void *topk_weights, const void *dw)
{
    const moe_array_arg args[] = {
        {"x", x, x_rows(p), p->K, p->dtype, 0, 0},
        {"dy", dy, p->rows, p->N, p->dtype, 0, 0},
        {"topk_weights", topk_weights, topk_weights ? p->rows : 0, 1, p->dtype, 0, 0},
        {"dw", dw, p->num_experts * p->N, p->K, p->dw_dtype, 1, 0},
    };
    return moe_gemm_check_tensors(op, p, args, 4);
}

static moe_status topk_grad_tensors(const char *op, const moe_gemm_problem *p, const void *x, const void *w,
                                    const void *dy, const void *d_topk_weights)
{
    const moe_array_arg args[] = {
        {"x", x, x_rows(p), p->K, p->dtype, 0, 0},
        {"w", w, p->num_experts * p->N, p->K, p->dtype, 0, 0},
        {"dy", dy, p->rows, p->N, p->dtype, 0, 0},
        {"d_topk_weights", d_topk_weights, p->rows, 1, p->dw_dtype, 1, 0},
    };
    return moe_gemm_check_tensors(op, p, args, 4);
}

moe_status moe_gemm_dx(moe_backend backend, const moe_routing *routing, int64_t N, int64_t K,
                       const void *dy, const void *w, const void *topk_weights, void *dx,
                       const moe_gemm_options *options)
{
    static const char op[] = "moe_gemm_dx";
    const moe_dispatch *table;
    moe_gemm_problem p;
    moe_status status = prepare(op, OP_DX, backend, routing, N, K, topk_weights, &options, &table, &p);
    if (status == MOE_OK)
        status = dx_tensors(op, &p, dy, w, topk_weights, dx);
    return status != MOE_OK ? status : table->gemm_dx(&p, dy, w, topk_weights, dx);
}

moe_status moe_gemm_dw(moe_backend backend, const moe_routing *routing, int64_t N, int64_t K,
                       const void *x, const void *dy, const void *topk_weights, void *dw,
                       const moe_gemm_options *options)
{
    static const char op[] = "moe_gemm_dw";
    const moe_dispatch *table;
    moe_gemm_problem p;
    moe_status status = prepare(op, OP_DW, backend, routing, N, K, topk_weights, &options, &table, &p);
    if (status == MOE_OK)
        status = dw_tensors(op, &p, x, dy, topk_weights, dw);
    return status != MOE_OK ? status : table->gemm_dw(&p, x, dy, topk_weights, dw);
}

moe_status moe_gemm_topk_weights_grad(moe_backend backend, const moe_routing *routing, int64_t N,
                                      int64_t K, const void *x, const void *w, const void *dy,
                                      void *d_topk_weights, const moe_gemm_options *options)
{
    static const char op[] = "moe_gemm_topk_weights_grad";
    const moe_dispatch *table;
    moe_gemm_problem p;
    moe_status status = prepare(op, OP_TOPK_GRAD, backend, routing, N, K, NULL, &options, &table, &p);
    if (status == MOE_OK)
        status = topk_grad_tensors(op, &p, x, w, dy, d_topk_weights);
    return status != MOE_OK ? status : table->gemm_topk_weights_grad(&p, x, w, dy, d_topk_weights);
}

moe_status moe_gemm_bwd(moe_backend backend, const moe_routing *routing, int64_t N, int64_t K,
                        const void *x, const void *w, const void *dy, const void *topk_weights,
                        void *dx, void *dw, void *d_topk_weights, const moe_gemm_options *options)
{
    static const char op[] = "moe_gemm_bwd";
    const moe_dispatch *table;
    moe_gemm_problem p;
    moe_status status = prepare(op, OP_BWD, backend, routing, N, K, topk_weights, &options, &table, &p);
    if (status != MOE_OK)
        return status;
    const int want_dx = !options->dw_only;
    const int want_dw = !options->dx_only;
    const int want_dtopk = want_dw && topk_weights != NULL && d_topk_weights != NULL;
    if (d_topk_weights != NULL && topk_weights == NULL)
        return moe_fail(MOE_ERR_INVALID_OPTION, "%s: d_topk_weights is given but topk_weights is NULL", op);
    if (!want_dx && p.reduce_topk)
        return moe_fail(MOE_ERR_INVALID_OPTION, "%s: options.reduce_topk is set but dw_only skips dX", op);

    /* validate every output before writing any */
    if (want_dx && (status = dx_tensors(op, &p, dy, w, topk_weights, dx)) != MOE_OK)
        return status;
    if (want_dw && (status = dw_tensors(op, &p, x, dy, topk_weights, dw)) != MOE_OK)
        return status;
    if (want_dtopk && (status = topk_grad_tensors(op, &p, x, w, dy, d_topk_weights)) != MOE_OK)
        return status;
    /* the outputs of one call must not overlap each other, nor an input another of its products reads (dW
     * reads x after dX is written: dx == x would compute dW from dX).
     * Outputs not computed and inputs not read count as empty. */
    const int64_t x_read = want_dw || want_dtopk ? x_rows(&p) : 0;
    const int64_t w_read = want_dx || want_dtopk ? p.num_experts * N : 0;
    const moe_array_arg outs[] = {
        {"x", x, x_read, K, p.dtype, 0, 0},
        {"w", w, w_read, K, p.dtype, 0, 0},
        {"dy", dy, p.rows, N, p.dtype, 0, 0},
        {"topk_weights", topk_weights, topk_weights ? p.rows : 0, 1, p.dtype, 0, 0},
        {"dx", dx, want_dx ? (p.reduce_topk ? p.num_tokens : p.rows) : 0, K, p.dtype, 1, 0},
        {"dw", dw, want_dw ? p.num_experts * N : 0, K, p.dw_dtype, 1, 0},
        {"d_topk_weights", d_topk_weights, want_dtopk ? p.rows : 0, 1, p.dw_dtype, 1, 0},
    };
    if ((status = moe_gemm_check_tensors(op, &p, outs, 7)) != MOE_OK)
        return status;

    if (want_dx && (status = table->gemm_dx(&p, dy, w, topk_weights, dx)) != MOE_OK)
        return status;
    if (want_dw && (status = table->gemm_dw(&p, x, dy, topk_weights, dw)) != MOE_OK)
        return status;
    if (want_dtopk)
        status = table->gemm_topk_weights_grad(&p, x, w, dy, d_topk_weights);
    return status;
}
