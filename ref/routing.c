/* Routing builders and validators (SEMANTICS section 1), host memory. */
#include "moe_ref.h"

#include <inttypes.h>
#include <stdlib.h>

moe_status moe_ref_check_routing(const char *op, int64_t num_experts, int64_t rows, const int64_t *m_sizes,
                                 const int64_t *gather_indices, int need_gather)
{
    int64_t total = 0;
    for (int64_t e = 0; e < num_experts; e++) {
        if (m_sizes[e] < 0)
            return moe_fail(MOE_ERR_INVALID_ROUTING, "%s: routing.m_sizes[%" PRId64 "] = %" PRId64
                            ", expected >= 0", op, e, m_sizes[e]);
        if (m_sizes[e] > rows - total)
            return moe_fail(MOE_ERR_INVALID_ROUTING, "%s: routing.m_sizes[0..%" PRId64 "] sums past T*k = %"
                            PRId64 " (expected sum(m_sizes) == T*k)", op, e, rows);
        total += m_sizes[e];
    }
    if (total != rows)
        return moe_fail(MOE_ERR_INVALID_ROUTING, "%s: sum(routing.m_sizes) = %" PRId64
                        ", expected T*k = %" PRId64, op, total, rows);
    if (!need_gather || rows == 0)
        return MOE_OK;

    unsigned char *seen = calloc((size_t)rows / 8 + 1, 1);
    if (seen == NULL)
        return moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: no memory for the %" PRId64
                        "-bit permutation check of routing.gather_indices", op, rows);
    moe_status status = MOE_OK;
    for (int64_t r = 0; r < rows; r++) {
        int64_t slot = gather_indices[r];
        if (slot < 0 || slot >= rows) {
            status = moe_fail(MOE_ERR_INVALID_ROUTING, "%s: routing.gather_indices[%" PRId64 "] = %" PRId64
                              ", expected a slot in [0, %" PRId64 ")", op, r, slot, rows);
            break;
        }
        unsigned char bit = (unsigned char)(1u << (slot & 7));
        if (seen[slot >> 3] & bit) {
            status = moe_fail(MOE_ERR_INVALID_ROUTING, "%s: routing.gather_indices[%" PRId64 "] = %" PRId64
                              " repeats an earlier entry (expected a permutation of [0, %" PRId64 "))",
                              op, r, slot, rows);
            break;
        }
        seen[slot >> 3] |= bit;
    }
    free(seen);
    return status;
}

void moe_ref_expert_offsets(int64_t num_experts, const int64_t *m_sizes, int64_t *offsets)
{
    offsets[0] = 0;
    for (int64_t e = 0; e < num_experts; e++)
        offsets[e + 1] = offsets[e] + m_sizes[e];
}

int64_t moe_ref_expert_of_row(int64_t num_experts, const int64_t *offsets, int64_t row)
{
    /* the last e with offsets[e] <= row: binary search over [0, E) */
    int64_t lo = 0, hi = num_experts - 1;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        if (offsets[mid] <= row)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

static moe_status check_routing_dims(const char *op, int64_t num_tokens, int64_t topk, int64_t num_experts,
                                     int64_t *rows)
{
    if (num_tokens < 0)
        return moe_fail(MOE_ERR_INVALID_SHAPE, "%s: num_tokens = %" PRId64 ", expected >= 0", op, num_tokens);
    if (topk < 0 || (topk == 0 && num_tokens > 0))
        return moe_fail(MOE_ERR_INVALID_SHAPE, "%s: topk = %" PRId64 ", expected >= 1", op, topk);
    if (num_experts < 1)
        return moe_fail(MOE_ERR_INVALID_SHAPE, "%s: num_experts = %" PRId64 ", expected >= 1", op,
                        num_experts);
    if (!moe_mul_ok(num_tokens, topk, rows) || (uint64_t)*rows > SIZE_MAX / sizeof(int64_t))
        return moe_fail(MOE_ERR_OVERFLOW, "%s: num_tokens * topk = %" PRId64 " * %" PRId64
                        " overflows", op, num_tokens, topk);
    return MOE_OK;
}

moe_status moe_routing_from_topk(int64_t num_tokens, int64_t topk, int64_t num_experts,
                                 const int64_t *topk_ids, int64_t *m_sizes, int64_t *gather_indices,
                                 int64_t *scatter_indices)
{
    static const char op[] = "moe_routing_from_topk";
    moe_clear_error();
    int64_t rows = 0;
    moe_status status = check_routing_dims(op, num_tokens, topk, num_experts, &rows);
    if (status != MOE_OK)
        return status;
    if (m_sizes == NULL)
        return moe_fail(MOE_ERR_NULL_POINTER, "%s: m_sizes is NULL", op);
    if (rows > 0 && (topk_ids == NULL || gather_indices == NULL))
        return moe_fail(MOE_ERR_NULL_POINTER, "%s: %s is NULL with T*k = %" PRId64 " > 0", op,
                        topk_ids == NULL ? "topk_ids" : "gather_indices", rows);
    if ((uint64_t)num_experts >= SIZE_MAX / sizeof(int64_t))
        return moe_fail(MOE_ERR_OVERFLOW, "%s: num_experts = %" PRId64 " too large", op, num_experts);
    for (int64_t s = 0; s < rows; s++)
        if (topk_ids[s] < 0 || topk_ids[s] >= num_experts)
            return moe_fail(MOE_ERR_INVALID_INDEX, "%s: topk_ids[%" PRId64 "][%" PRId64 "] = %" PRId64
                            ", expected an expert in [0, %" PRId64 ")", op, s / topk, s % topk,
                            topk_ids[s], num_experts);

    /* counting sort by expert: stable because slots are visited in ascending order */
    int64_t *next = calloc((size_t)num_experts + 1, sizeof *next);
    if (next == NULL)
        return moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: no memory for %" PRId64 " expert counters", op,
                        num_experts);
    for (int64_t e = 0; e < num_experts; e++)
        m_sizes[e] = 0;
    for (int64_t s = 0; s < rows; s++)
        m_sizes[topk_ids[s]]++;
    moe_ref_expert_offsets(num_experts, m_sizes, next);
    for (int64_t s = 0; s < rows; s++) {
        int64_t r = next[topk_ids[s]]++;
        gather_indices[r] = s;
        if (scatter_indices != NULL)
            scatter_indices[s] = r;
    }
    free(next);
    return MOE_OK;
}

moe_status moe_routing_validate(const moe_routing *routing, int require_gather)
{
    static const char op[] = "moe_routing_validate";
    moe_clear_error();
    if (routing == NULL)
        return moe_fail(MOE_ERR_NULL_POINTER, "%s: routing is NULL", op);
    int64_t rows = 0;
    moe_status status = check_routing_dims(op, routing->num_tokens, routing->topk, routing->num_experts, &rows);
    if (status != MOE_OK)
        return status;
    if (routing->m_sizes == NULL)
        return moe_fail(MOE_ERR_NULL_POINTER, "%s: routing.m_sizes is NULL", op);
    int need_gather = require_gather || routing->gather_indices != NULL;
    if (need_gather && rows > 0 && routing->gather_indices == NULL)
        return moe_fail(MOE_ERR_NULL_POINTER, "%s: routing.gather_indices is NULL with T*k = %" PRId64 " > 0",
                        op, rows);
    return moe_ref_check_routing(op, routing->num_experts, rows, routing->m_sizes, routing->gather_indices,
                                 need_gather);
}
