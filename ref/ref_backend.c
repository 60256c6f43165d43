/* The reference backend's table (host pointers, routing and layouts checked on the host first): every row
 * of moe_dispatch.  Every grouped GEMM op runs the blocked twin (ref/gemm/; FP8: ref/gemm_fp8_blocked.c), which
 * agrees bit for bit with the naive twin (ref/gemm_naive.c; FP8: ref/gemm_fp8.c), the readable definition.  FP8
 * dW and the columns quantizer go through ref/fp8_transposed.c's entries (transposed codes). */
#include "mlp_ref.h"
#include "fp8_ref.h"
#include "moe_ref.h"

#include <inttypes.h>

static int ref_available(void) { return 1; }

/* The host build of moe_routing_from_topk, which validates the topk ids and every array itself (and names
 * itself in messages). */
static moe_status ref_routing_build(const moe_routing_problem *p, const int64_t *topk_ids, int64_t *m_sizes,
                                    int64_t *gather_indices, int64_t *scatter_indices)
{
    (void)p->op;
    return moe_ref_routing_from_topk("moe_routing_from_topk", p->T, p->k, p->E, topk_ids, m_sizes, gather_indices,
                                     scatter_indices);
}

/* The host builder on the routing's own block count, then the capacity's tail: padding blocks of expert
 * E-1. */
static moe_status ref_mlp_layout_build(const moe_layout_problem *p, const int64_t *topk_ids,
                                       const void *topk_weights, int64_t *block_to_expert,
                                       int64_t *token_position_to_id, void *affinities, int64_t *num_dropped,
                                       int64_t *num_blocks_used)
{
    moe_status status = moe_ref_mlp_check_topk(p->op, p->T, p->k, p->E, topk_ids);
    if (status != MOE_OK)
        return status;
    const int64_t used = moe_ref_mlp_count_blocks(p->kind, p->T, p->k, p->E, p->B, topk_ids);
    if (used < 0)
        return moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: no memory for %" PRId64 " experts", p->op, p->E);
    status = moe_ref_mlp_build_layout(p->op, p->kind, p->T, p->k, p->E, p->B, p->padding, p->dtype, topk_ids,
                                      topk_weights, used, block_to_expert, token_position_to_id, affinities,
                                      num_dropped);
    if (status != MOE_OK)
        return status;
    for (int64_t n = used; n < p->num_blocks; n++)
        block_to_expert[n] = p->E - 1;
    for (int64_t q = used * p->B; q < p->num_blocks * p->B; q++)
        token_position_to_id[q] = p->pad;
    if (num_blocks_used != NULL)
        *num_blocks_used = used;
    return MOE_OK;
}

static moe_status ref_fp8_quantize(const moe_fp8_quantize_problem *p, const void *src, void *q, void *scales)
{
    return moe_ref_quantize_fp8(p->op, p->wide_dtype, p->tile_rows, p->batches, p->rows, p->cols, src, p->fp8_dtype,
                                p->scale_format, q, scales);
}

static moe_status ref_fp8_dequantize(const moe_fp8_quantize_problem *p, const void *q, const void *scales, void *out)
{
    moe_ref_dequantize_fp8(p->fp8_dtype, p->scale_format, p->tile_rows, p->batches, p->rows, p->cols, q, scales,
                           p->wide_dtype, out);
    return MOE_OK;
}

const moe_dispatch moe_ref_dispatch = {
    .name = "ref",
    .available = ref_available,
    .gemm_fwd = moe_ref_gemm_fwd_blocked,
    .gemm_dx = moe_ref_gemm_dx_blocked,
    .gemm_dw = moe_ref_gemm_dw_blocked,
    .gemm_topk_weights_grad = moe_ref_gemm_topk_weights_grad_blocked,
    .mlp_fwd = moe_ref_mlp_fwd,
    .mlp_bwd = moe_ref_mlp_bwd,
    .routing_build = ref_routing_build,
    .mlp_layout_build = ref_mlp_layout_build,
    .gemm_fp8_fwd = moe_ref_gemm_fp8_fwd_blocked,
    .gemm_fp8_dx = moe_ref_gemm_fp8_dx_blocked,
    .gemm_fp8_dw = moe_ref_gemm_fp8_dw_entry,
    .fp8_quantize_columns = moe_ref_quantize_fp8_columns_entry,
    .fp8_quantize = ref_fp8_quantize,
    .fp8_dequantize = ref_fp8_dequantize,
    .validates_routing_on_host = 1,
};
