/*
 * ref/gemm/fwd_dw.c: the forward and the weight gradient of the blocked grouped GEMM: their drivers on the
 * caller's scratch (proved) and their allocating shells, the entry points of ref/moe_ref.h.  Both run
 * every work item in one parallel region (gemm_run_plain, setup.c).
 */
#include "gemm_internal.h"

/* The blocked forward on the caller's scratch (proved; moe_ref_gemm_fwd_blocked allocates it): offsets and
 * blocks as gemm_setup_in takes them.  RTE, assigns (the scratch, y's bytes), termination; the requires of
 * gemm_setup_in and gemm_run_plain.  Statuses: gemm_setup_in's, then gemm_run_plain's. */
/*@ requires problem: gemm_problem_ok(p);
    requires routing: gemm_routing_ok(p);
    requires tensors: gemm_fwd_tensors_ok(p, (char *)x, (char *)w, (char *)topk_weights, (char *)y);
    requires experts: p->num_experts < INT64_MAX;
    requires problem_apart: \separated(p, p->gather_indices + (0 .. p->rows - 1));
    requires scratch: blocked_scratch_ok(p, OP_FWD, offsets, blocks, (char *)y, byte_offset(p->rows * p->N, p->dtype));
    terminates \true;
    assigns offsets[0 .. p->num_experts], blocks[0 .. gemm_blocks(p, OP_FWD, p->num_experts)],
            ((char *)y)[0 .. byte_offset(p->rows * p->N, p->dtype) - 1], moe_error_model, __fc_heap_status;
    ensures status: offsets != \null && blocks != \null ? \result == MOE_OK || \result == MOE_ERR_OUT_OF_MEMORY
                                                        : \result == MOE_ERR_OUT_OF_MEMORY; */
static moe_status gemm_fwd_blocked_in(const moe_gemm_problem *p, const void *x, const void *w,
                                      const void *topk_weights, void *y, int64_t *offsets, a_block *blocks)
{
    gemm_setup st;
    const moe_status status = gemm_setup_in(p, OP_FWD, &st, offsets, blocks);
    if (status != MOE_OK)
        return status;
    /*@ assert field_T: p->num_tokens == \at(p->num_tokens, Pre); */
    /*@ assert field_k: p->topk == \at(p->topk, Pre); */
    /*@ assert field_E: p->num_experts == \at(p->num_experts, Pre); */
    /*@ assert field_M: p->rows == \at(p->rows, Pre); */
    /*@ assert field_N: p->N == \at(p->N, Pre); */
    /*@ assert field_K: p->K == \at(p->K, Pre); */
    /*@ assert fields: p->gather_indices == \at(p->gather_indices, Pre) && p->m_sizes == \at(p->m_sizes, Pre) &&
          p->permute_x == \at(p->permute_x, Pre) && p->reduce_topk == \at(p->reduce_topk, Pre); */
    /*@ assert gather: p->gather_indices != \null ==>
          \forall integer r; 0 <= r < p->rows ==> p->gather_indices[r] == \at(p->gather_indices[r], Pre); */
    /*@ assert kept_problem: gemm_problem_ok(p); */
    /*@ assert kept_x_rows: gemm_x_rows(p) == \at(gemm_x_rows(p), Pre) && p->dtype == \at(p->dtype, Pre); */
    /*@ assert kept_at: gemm_fwd_tensors_at((char *)x, (char *)w, (char *)topk_weights, (char *)y,
          \at(gemm_x_rows(p), Pre), \at(p->rows, Pre), \at(p->num_experts, Pre), \at(p->N, Pre), \at(p->K, Pre),
          \at(p->dtype, Pre), p, \at(p->gather_indices, Pre), \at(p->m_sizes, Pre)); */
    /*@ assert kept: gemm_problem_ok(p) &&
                     gemm_fwd_tensors_ok(p, (char *)x, (char *)w, (char *)topk_weights, (char *)y); */
    gemm_ctx g = {p, OP_FWD, x, w, topk_weights, NULL, y, st.offsets, gemm_pick_kernel(), NULL, 0, 0};
    /*@ assert g: g.p == p && g.kind == OP_FWD && g.a_src == x && g.b_src == w && g.topk_weights == topk_weights &&
                  g.out == y && g.offsets == offsets && g.kernel == &gemm_kernel_scalar && g.slot_values == \null &&
                  g.slot_width == 0; */
    /*@ assert kept_g: gemm_problem_ok(g.p) &&
          gemm_fwd_tensors_ok(g.p, (char *)g.a_src, (char *)g.b_src, (char *)g.topk_weights, (char *)g.out); */
    /*@ assert apart: \separated((char *)y + (0 .. byte_offset(p->rows * p->N, p->dtype) - 1), &g, p, &st,
          blocks + (0 .. st.block_count - 1), p->gather_indices + (0 .. p->rows - 1), offsets + (0 .. p->num_experts)); */
    /*@ assert out_kind: g.kind == OP_FWD && g.p->rows == p->rows && g.p->N == p->N && g.p->dtype == p->dtype; */
    /*@ assert out_count: out_count_at(g.kind, g.p->reduce_topk, g.p->rows, g.p->num_experts, g.p->N, g.p->K) ==
                          p->rows * p->N; */
    /*@ assert out_dtype: ctx_out_dtype(&g) == p->dtype; */
    /*@ assert out_bytes: ctx_out_bytes(&g) == byte_offset(p->rows * p->N, p->dtype); */
    return gemm_run_plain(&g, &st, p->N);
}

/* dW on the caller's scratch (proved; as gemm_fwd_blocked_in). */
/*@ requires problem: gemm_problem_ok(p);
    requires routing: gemm_routing_ok(p);
    requires tensors: gemm_dw_tensors_ok(p, (char *)x, (char *)dy, (char *)topk_weights, (char *)dw);
    requires experts: p->num_experts < INT64_MAX;
    requires problem_apart: \separated(p, p->gather_indices + (0 .. p->rows - 1));
    requires scratch: blocked_scratch_ok(p, OP_DW, offsets, blocks, (char *)dw,
                                         byte_offset(p->num_experts * p->N * p->K, p->dw_dtype));
    terminates \true;
    assigns offsets[0 .. p->num_experts], blocks[0 .. gemm_blocks(p, OP_DW, p->num_experts)],
            ((char *)dw)[0 .. byte_offset(p->num_experts * p->N * p->K, p->dw_dtype) - 1], moe_error_model,
            __fc_heap_status;
    ensures status: offsets != \null && blocks != \null ? \result == MOE_OK || \result == MOE_ERR_OUT_OF_MEMORY
                                                        : \result == MOE_ERR_OUT_OF_MEMORY; */
static moe_status gemm_dw_blocked_in(const moe_gemm_problem *p, const void *x, const void *dy,
                                     const void *topk_weights, void *dw, int64_t *offsets, a_block *blocks)
{
    gemm_setup st;
    const moe_status status = gemm_setup_in(p, OP_DW, &st, offsets, blocks);
    if (status != MOE_OK)
        return status;
    /*@ assert field_T: p->num_tokens == \at(p->num_tokens, Pre); */
    /*@ assert field_k: p->topk == \at(p->topk, Pre); */
    /*@ assert field_E: p->num_experts == \at(p->num_experts, Pre); */
    /*@ assert field_M: p->rows == \at(p->rows, Pre); */
    /*@ assert field_N: p->N == \at(p->N, Pre); */
    /*@ assert field_K: p->K == \at(p->K, Pre); */
    /*@ assert fields: p->gather_indices == \at(p->gather_indices, Pre) && p->m_sizes == \at(p->m_sizes, Pre) &&
          p->permute_x == \at(p->permute_x, Pre) && p->reduce_topk == \at(p->reduce_topk, Pre); */
    /*@ assert gather: p->gather_indices != \null ==>
          \forall integer r; 0 <= r < p->rows ==> p->gather_indices[r] == \at(p->gather_indices[r], Pre); */
    /*@ assert kept_problem: gemm_problem_ok(p); */
    /*@ assert kept_x_rows: gemm_x_rows(p) == \at(gemm_x_rows(p), Pre) && p->dtype == \at(p->dtype, Pre) &&
                            p->dw_dtype == \at(p->dw_dtype, Pre); */
    /*@ assert kept_at: gemm_dw_tensors_at((char *)x, (char *)dy, (char *)topk_weights, (char *)dw,
          \at(gemm_x_rows(p), Pre), \at(p->rows, Pre), \at(p->num_experts, Pre), \at(p->N, Pre), \at(p->K, Pre),
          \at(p->dtype, Pre), \at(p->dw_dtype, Pre), p, \at(p->gather_indices, Pre), \at(p->m_sizes, Pre)); */
    /*@ assert kept: gemm_problem_ok(p) &&
                     gemm_dw_tensors_ok(p, (char *)x, (char *)dy, (char *)topk_weights, (char *)dw); */
    gemm_ctx g = {p, OP_DW, dy, x, topk_weights, NULL, dw, st.offsets, gemm_pick_kernel(), NULL, 0, 0};
    /*@ assert g: g.p == p && g.kind == OP_DW && g.a_src == dy && g.b_src == x && g.topk_weights == topk_weights &&
                  g.out == dw && g.offsets == offsets && g.kernel == &gemm_kernel_scalar && g.slot_values == \null &&
                  g.slot_width == 0; */
    /*@ assert kept_g: gemm_problem_ok(g.p) &&
          gemm_dw_tensors_ok(g.p, (char *)g.b_src, (char *)g.a_src, (char *)g.topk_weights, (char *)g.out); */
    /*@ assert apart: \separated((char *)dw + (0 .. byte_offset(p->num_experts * p->N * p->K, p->dw_dtype) - 1), &g,
          p, &st, blocks + (0 .. st.block_count - 1), p->gather_indices + (0 .. p->rows - 1),
          offsets + (0 .. p->num_experts)); */
    /*@ assert out_kind: g.kind == OP_DW && g.p->num_experts == p->num_experts && g.p->N == p->N &&
                         g.p->K == p->K && g.p->dw_dtype == p->dw_dtype; */
    /*@ assert out_count: out_count_at(g.kind, g.p->reduce_topk, g.p->rows, g.p->num_experts, g.p->N, g.p->K) ==
                          p->num_experts * p->N * p->K; */
    /*@ assert out_dtype: ctx_out_dtype(&g) == p->dw_dtype; */
    /*@ assert out_bytes: ctx_out_bytes(&g) == byte_offset(p->num_experts * p->N * p->K, p->dw_dtype); */
    return gemm_run_plain(&g, &st, p->K);
}

/* The allocating shells (not proved): gemm_setup_alloc, the proved `_in` function, gemm_setup_free. */
moe_status moe_ref_gemm_fwd_blocked(const moe_gemm_problem *p, const void *x, const void *w,
                                    const void *topk_weights, void *y)
{
    int64_t *offsets;
    a_block *blocks;
    gemm_setup_alloc(p, OP_FWD, &offsets, &blocks);
    const moe_status status = gemm_fwd_blocked_in(p, x, w, topk_weights, y, offsets, blocks);
    gemm_setup_free(offsets, blocks);
    return status;
}

moe_status moe_ref_gemm_dw_blocked(const moe_gemm_problem *p, const void *x, const void *dy,
                                   const void *topk_weights, void *dw)
{
    /* dw [E][N][K] has no element: nothing to write (allocating and walking its E * ceil(N / 96) blocks
     * would take 20 s and 8 GB at N = 2^35 with K = 0, and fail for memory at 2^40) */
    if (p->N == 0 || p->K == 0)
        return MOE_OK;
    int64_t *offsets;
    a_block *blocks;
    gemm_setup_alloc(p, OP_DW, &offsets, &blocks);
    const moe_status status = gemm_dw_blocked_in(p, x, dy, topk_weights, dw, offsets, blocks);
    gemm_setup_free(offsets, blocks);
    return status;
}
