/* The allocating shells of ref/routing.c, ref/gemm_naive.c and ref/mlp_layout.c.
 *
 * WP 25 has no model of malloc/calloc/free (\fresh, \freeable, allocates/frees are not implemented), so
 * the functions of those three files take their scratch from the caller and are all proved
 * (specs/verify.sh).  Each function here only allocates that scratch, calls the proved function and frees
 * it; a scratch the allocation did not give is passed as NULL (or reported here, where the proved function
 * does not take it), and the out-of-memory status and message are the ones the library always gave.  Not
 * in the proof list; their contracts are stated on the prototypes (ref/moe_ref.h, ref/mlp_ref.h). */
#include "mlp_ref.h"
#include "moe_ref.h"

#include <inttypes.h>
#include <stdlib.h>

moe_status moe_ref_check_routing(const char *op, int64_t num_experts, int64_t rows, const int64_t *m_sizes,
                                 const int64_t *gather_indices, int need_gather)
{
    /* seen [rows] bytes, zeroed: only for the permutation check (rows >= 0 and rows * 8 fits a size_t:
     * every caller has checked the routing's dimensions) */
    unsigned char *seen = need_gather && rows > 0 ? calloc((size_t)rows, 1) : NULL;
    const moe_status status = moe_ref_check_routing_in(op, num_experts, rows, m_sizes, gather_indices,
                                                       need_gather, seen);
    free(seen);
    return status;
}

moe_status moe_ref_routing_arrays_check(const char *op, int64_t rows, int64_t num_experts, const int64_t *topk_ids,
                                        const int64_t *m_sizes, const int64_t *gather_indices,
                                        const int64_t *scatter_indices)
{
    const moe_array_arg args[] = {
        {"topk_ids", topk_ids, rows, 1, MOE_F32, 0, 1},
        {"m_sizes", m_sizes, num_experts, 1, MOE_F32, 1, 1},
        {"gather_indices", gather_indices, rows, 1, MOE_F32, 1, 1},
        {"scatter_indices", scatter_indices, scatter_indices ? rows : 0, 1, MOE_F32, 1, 1},
    };
    return moe_check_arrays(op, args, (int)(sizeof args / sizeof args[0]));
}

moe_status moe_ref_routing_from_topk(const char *op, int64_t num_tokens, int64_t topk, int64_t num_experts,
                                     const int64_t *topk_ids, int64_t *m_sizes, int64_t *gather_indices,
                                     int64_t *scatter_indices)
{
    int64_t rows = 0;
    /* alignment and overlaps (an output overlapping topk_ids would rewrite the ids the sort indexes with),
     * before the ids are read; NULL arrays are left to the check below, which names them */
    moe_status status = moe_ref_check_routing_dims(op, num_tokens, topk, num_experts, &rows);
    if (status == MOE_OK && m_sizes != NULL && (rows == 0 || (topk_ids != NULL && gather_indices != NULL)))
        status = moe_ref_routing_arrays_check(op, rows, num_experts, topk_ids, m_sizes, gather_indices,
                                              scatter_indices);
    if (status == MOE_OK)
        status = moe_ref_routing_from_topk_check(op, num_tokens, topk, num_experts, topk_ids, m_sizes,
                                                 gather_indices, &rows);
    if (status != MOE_OK)
        return status;
    /* next [E + 1]: the counting sort's cursors (E + 1 <= SIZE_MAX / 8, checked) */
    int64_t *next = calloc((size_t)num_experts + 1, sizeof *next);
    if (next == NULL)
        return moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: no memory for %" PRId64 " expert counters", op,
                        num_experts);
    moe_ref_counting_sort(rows, num_experts, topk_ids, m_sizes, gather_indices, scatter_indices, next);
    free(next);
    return MOE_OK;
}

/* The naive GEMM kernels: run (an `_in` kernel) with offsets [E + 1] (E + 1 <= SIZE_MAX / 8: src/gemm_api.c
 * checks E <= SIZE_MAX / 16).  fwd, dW and the topk-weight gradient take the same arguments. */
typedef moe_status (*naive_kernel)(const moe_gemm_problem *p, const void *a, const void *b, const void *c,
                                   void *out, int64_t *offsets);

/*@ requires problem: \valid_read(p) && 0 <= p->num_experts <= SIZE_MAX / 16;
    terminates \true;
    assigns __fc_heap_status;
    ensures offsets: \result == \null || \valid(\result + (0 .. p->num_experts)); */
static int64_t *offsets_alloc(const moe_gemm_problem *p)
{
    return malloc(((size_t)p->num_experts + 1) * sizeof(int64_t));
}

/* Contract stated (no assigns clause: those of the kernel run): run is one of the three kernels, whose
 * contracts (ref/moe_ref.h) hold for offsets fresh or NULL. */
/*@ requires kernel: run == moe_ref_gemm_fwd_naive_in || run == moe_ref_gemm_dw_naive_in ||
      run == moe_ref_gemm_topk_weights_grad_in;
    requires problem: \valid_read(p) && 0 <= p->num_experts <= SIZE_MAX / 16;
    terminates \true; */
static moe_status with_offsets(naive_kernel run, const moe_gemm_problem *p, const void *a, const void *b,
                               const void *c, void *out)
{
    int64_t *offsets = offsets_alloc(p);
    const moe_status status = run(p, a, b, c, out, offsets);
    free(offsets);
    return status;
}

moe_status moe_ref_gemm_fwd_naive(const moe_gemm_problem *p, const void *x, const void *w,
                                  const void *topk_weights, void *y)
{
    return with_offsets(moe_ref_gemm_fwd_naive_in, p, x, w, topk_weights, y);
}

moe_status moe_ref_gemm_dx_naive(const moe_gemm_problem *p, const void *dy, const void *w,
                                 const void *topk_weights, void *dx)
{
    int64_t *offsets = offsets_alloc(p);
    /* row_of_slot [M], zeroed, with reduce_topk only; one entry more: calloc(0) may return NULL */
    int64_t *row_of_slot = p->reduce_topk ? calloc((size_t)p->rows + 1, sizeof(int64_t)) : NULL;
    const moe_status status = moe_ref_gemm_dx_naive_in(p, dy, w, topk_weights, dx, offsets, row_of_slot);
    free(row_of_slot);
    free(offsets);
    return status;
}

moe_status moe_ref_gemm_dw_naive(const moe_gemm_problem *p, const void *x, const void *dy,
                                 const void *topk_weights, void *dw)
{
    return with_offsets(moe_ref_gemm_dw_naive_in, p, x, dy, topk_weights, dw);
}

moe_status moe_ref_gemm_topk_weights_grad(const moe_gemm_problem *p, const void *x, const void *w,
                                          const void *dy, void *d_topk_weights)
{
    return with_offsets(moe_ref_gemm_topk_weights_grad_in, p, x, w, dy, d_topk_weights);
}

/* The layout functions' scratch: n + 1 int64 entries (one more: malloc(0) may return NULL), n <= SIZE_MAX / 16
 * (the shape checks). */
/*@ requires n: 0 <= n <= SIZE_MAX / 16;
    terminates \true;
    assigns __fc_heap_status;
    ensures scratch: \result == \null || \valid(\result + (0 .. n)); */
static int64_t *experts_alloc(int64_t n)
{
    return malloc(((size_t)n + 1) * sizeof(int64_t));
}

moe_status moe_ref_mlp_check_layout(const char *op, const moe_mlp_layout *layout, int64_t B,
                                    moe_mlp_padding padding, int overwrite)
{
    const moe_status shape = moe_ref_mlp_check_layout_shape(op, layout, B);
    if (shape != MOE_OK)
        return shape;
    const int64_t T = layout->num_tokens, E = layout->num_experts, N = layout->num_blocks;
    int64_t *counts = experts_alloc(E), *start = experts_alloc(E + 1), *order = experts_alloc(N);
    int64_t *seen_expert = experts_alloc(T), *seen_pos = experts_alloc(T);
    const moe_status status = moe_ref_mlp_check_layout_in(op, layout, B, padding, overwrite, counts, start, order,
                                                          seen_expert, seen_pos);
    free(counts);
    free(start);
    free(order);
    free(seen_expert);
    free(seen_pos);
    return status;
}

moe_status moe_ref_mlp_check_topk(const char *op, int64_t T, int64_t k, int64_t E, const int64_t *topk_ids)
{
    const moe_status shape = moe_ref_mlp_check_topk_shape(op, T, k, E);
    if (shape != MOE_OK)
        return shape;
    int64_t *last = experts_alloc(E);
    const moe_status status = moe_ref_mlp_check_topk_in(op, T, k, E, topk_ids, last);
    free(last);
    return status;
}

/* The callers have checked the routing (moe_ref_mlp_check_topk): E is a valid shape. */
int64_t moe_ref_mlp_count_blocks(moe_mlp_layout_kind kind, int64_t T, int64_t k, int64_t E, int64_t B,
                                 const int64_t *topk_ids)
{
    int64_t *m = kind == MOE_MLP_DROPPING ? NULL : experts_alloc(E);
    const int64_t N = moe_ref_mlp_count_blocks_in(kind, T, k, E, B, topk_ids, m);
    free(m);
    return N;
}

/* The callers have checked the routing, the kind, N (moe_ref_mlp_count_blocks) and the arrays. */
moe_status moe_ref_mlp_build_layout(const char *op, moe_mlp_layout_kind kind, int64_t T, int64_t k,
                                    int64_t E, int64_t B, moe_mlp_padding padding, moe_dtype dtype,
                                    const int64_t *topk_ids, const void *topk_weights, int64_t N,
                                    int64_t *block_to_expert, int64_t *token_position_to_id, void *affinities,
                                    int64_t *num_dropped)
{
    int64_t *m = experts_alloc(E), *cursor = experts_alloc(E);
    const moe_status status = moe_ref_mlp_build_layout_in(op, kind, T, k, E, B, padding, dtype, topk_ids,
                                                          topk_weights, N, block_to_expert, token_position_to_id,
                                                          affinities, num_dropped, m, cursor);
    free(m);
    free(cursor);
    return status;
}
