/* The routing entry points: moe_routing_from_topk (the host build), moe_routing_validate (proved: specs/verify.sh
 * lists it) and moe_routing_build, the build on a backend (host arrays for MOE_BACKEND_REF, device arrays and a
 * stream for MOE_BACKEND_CUDA, gpu/routing/builders.cu) through the backend table's routing_build row. */
#include "moe_backend.h"
#include "moe_ref.h"

#include <inttypes.h>

moe_status moe_routing_from_topk(int64_t num_tokens, int64_t topk, int64_t num_experts,
                                 const int64_t *topk_ids, int64_t *m_sizes, int64_t *gather_indices,
                                 int64_t *scatter_indices)
{
    moe_clear_error();
    return moe_ref_routing_from_topk("moe_routing_from_topk", num_tokens, topk, num_experts, topk_ids, m_sizes,
                                     gather_indices, scatter_indices);
}

/* The arrays may be NULL (each NULL check below is reachable); where not NULL, they hold what the routing's
 * dimensions say.  The acceptance is routing_ok, what moe_ref_counting_sort proves of its output. */
/*@ requires routing: routing == \null || \valid_read(routing);
    requires arrays: routing != \null ==>
      (routing->m_sizes != \null ==> \valid_read(routing->m_sizes + (0 .. routing->num_experts - 1))) &&
      (routing->gather_indices != \null ==>
         \valid_read(routing->gather_indices + (0 .. routing->num_tokens * routing->topk - 1)));
    terminates \true;
    assigns moe_error_model;
    ensures null_routing: routing == \null ==> \result == MOE_ERR_NULL_POINTER;
    ensures null_m_sizes: routing != \null && routing_dims_ok(routing->num_tokens, routing->topk, routing->num_experts) &&
      routing->m_sizes == \null ==> \result == MOE_ERR_NULL_POINTER;
    ensures null_gather: routing != \null && routing_dims_ok(routing->num_tokens, routing->topk, routing->num_experts) &&
      routing->m_sizes != \null && require_gather != 0 && routing->num_tokens * routing->topk > 0 &&
      routing->gather_indices == \null ==> \result == MOE_ERR_NULL_POINTER;
    ensures accepts_only_wellformed: \result == MOE_OK ==> routing != \null && routing->m_sizes != \null &&
      routing_ok(routing->m_sizes, routing->num_experts, routing->num_tokens * routing->topk, routing->gather_indices,
                 (require_gather != 0 || routing->gather_indices != \null ? 1 : 0));
    ensures accepts_wellformed: routing != \null &&
      routing_dims_ok(routing->num_tokens, routing->topk, routing->num_experts) && routing->m_sizes != \null &&
      (require_gather != 0 && routing->num_tokens * routing->topk > 0 ==> routing->gather_indices != \null) &&
      routing_ok(routing->m_sizes, routing->num_experts, routing->num_tokens * routing->topk, routing->gather_indices,
                 (require_gather != 0 || routing->gather_indices != \null ? 1 : 0)) ==>
      \result == MOE_OK || \result == MOE_ERR_MISALIGNED || \result == MOE_ERR_OUT_OF_MEMORY; */
moe_status moe_routing_validate(const moe_routing *routing, int require_gather)
{
    static const char op[] = "moe_routing_validate";
    moe_clear_error();
    if (routing == NULL)
        return moe_fail(MOE_ERR_NULL_POINTER, "%s: routing is NULL", op);
    int64_t rows = 0;
    moe_status status = moe_ref_check_routing_dims(op, routing->num_tokens, routing->topk, routing->num_experts,
                                                   &rows);
    if (status != MOE_OK)
        return status;
    if (routing->m_sizes == NULL)
        return moe_fail(MOE_ERR_NULL_POINTER, "%s: routing.m_sizes is NULL", op);
    int need_gather = require_gather || routing->gather_indices != NULL;
    if (need_gather && rows > 0 && routing->gather_indices == NULL)
        return moe_fail(MOE_ERR_NULL_POINTER, "%s: routing.gather_indices is NULL with T*k = %" PRId64 " > 0",
                        op, rows);
    /* before the arrays are read */
    status = moe_check_aligned(op, "routing.m_sizes", routing->m_sizes, 8, "int64");
    if (status != MOE_OK)
        return status;
    status = moe_check_aligned(op, "routing.gather_indices", routing->gather_indices, 8, "int64");
    if (status != MOE_OK)
        return status;
    return moe_ref_check_routing(op, routing->num_experts, rows, routing->m_sizes, routing->gather_indices,
                                 need_gather);
}

moe_status moe_routing_build(moe_backend backend, int64_t num_tokens, int64_t topk, int64_t num_experts,
                             const int64_t *topk_ids, int64_t *m_sizes, int64_t *gather_indices,
                             int64_t *scatter_indices, void *stream)
{
    static const char op[] = "moe_routing_build";
    moe_clear_error();
    const moe_dispatch *table = moe_dispatch_for(backend);
    if (table == NULL || !table->available())
        return moe_fail(MOE_ERR_NO_BACKEND, "%s: backend %d (%s) is not available here", op, (int)backend,
                        moe_backend_name(backend));
    const moe_routing_problem p = {op, num_tokens, topk, num_experts, stream};
    if (table->validates_routing_on_host) /* the host row checks everything itself */
        return table->routing_build(&p, topk_ids, m_sizes, gather_indices, scatter_indices);
    /* the dimension checks of moe_routing_from_topk (proved), a tighter size bound for the device arrays,
     * then no overlaps (device arrays are not read here) */
    int64_t rows = 0;
    moe_status status = moe_ref_check_routing_dims(op, num_tokens, topk, num_experts, &rows);
    if (status != MOE_OK)
        return status;
    if ((uint64_t)rows > SIZE_MAX / 16)
        return moe_fail(MOE_ERR_OVERFLOW, "%s: num_tokens * topk = %" PRId64 " * %" PRId64 " = %" PRId64
                        " rows is too large for the CUDA builder (past SIZE_MAX / 16)", op, num_tokens, topk, rows);
    if ((uint64_t)num_experts > SIZE_MAX / 16)
        return moe_fail(MOE_ERR_OVERFLOW, "%s: num_experts = %" PRId64 " is too large for the CUDA builder (past "
                        "SIZE_MAX / 16)", op, num_experts);
    status = moe_ref_routing_arrays_check(op, rows, num_experts, topk_ids, m_sizes, gather_indices, scatter_indices);
    if (status != MOE_OK)
        return status;
    return table->routing_build(&p, topk_ids, m_sizes, gather_indices, scatter_indices);
}
