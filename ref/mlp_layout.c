/* Block layouts of the blockwise MoE MLP: the host-side check of a caller-made layout and the builders
 * from topk routing (specs/MLP.md, "Layouts"). */
#include "mlp_ref.h"
#include "moe_ref.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static const char *padding_name(moe_mlp_padding padding)
{
    return padding == MOE_MLP_PAD_ROW ? "MOE_MLP_PAD_ROW" : "MOE_MLP_PAD_SKIP";
}

moe_status moe_ref_mlp_check_layout_shape(const char *op, const moe_mlp_layout *layout, int64_t B)
{
    if (layout == NULL)
        return moe_fail(MOE_ERR_NULL_POINTER, "%s: layout is NULL", op);
    const int64_t T = layout->num_tokens, E = layout->num_experts, N = layout->num_blocks;
    if (T < 0)
        return moe_fail(MOE_ERR_INVALID_SHAPE, "%s: layout.num_tokens = %" PRId64 ", expected >= 0", op, T);
    if (E < 1)
        return moe_fail(MOE_ERR_INVALID_SHAPE, "%s: layout.num_experts = %" PRId64 ", expected >= 1", op, E);
    if (N < 0)
        return moe_fail(MOE_ERR_INVALID_SHAPE, "%s: layout.num_blocks = %" PRId64 ", expected >= 0", op, N);
    if (B < 1)
        return moe_fail(MOE_ERR_INVALID_OPTION, "%s: block size %" PRId64 ", expected >= 1", op, B);
    int64_t NB = 0, TE = 0;
    if (!moe_mul_ok(N, B, &NB) || !moe_mul_ok(T, E, &TE) || T == INT64_MAX ||
        (uint64_t)NB > SIZE_MAX / 16 || (uint64_t)T > SIZE_MAX / 16 || (uint64_t)E > SIZE_MAX / 16)
        return moe_fail(MOE_ERR_OVERFLOW, "%s: layout.num_blocks * B = %" PRId64 " * %" PRId64
                        " or num_tokens * num_experts = %" PRId64 " * %" PRId64 " overflows", op, N, B, T, E);
    if (N > 0 && layout->block_to_expert == NULL)
        return moe_fail(MOE_ERR_NULL_POINTER, "%s: layout.block_to_expert is NULL but num_blocks = %" PRId64,
                        op, N);
    if (NB > 0 && layout->token_position_to_id == NULL)
        return moe_fail(MOE_ERR_NULL_POINTER, "%s: layout.token_position_to_id is NULL but has %" PRId64
                        " positions", op, NB);
    return MOE_OK;
}

moe_status moe_ref_mlp_check_layout(const char *op, const moe_mlp_layout *layout, int64_t B,
                                    moe_mlp_padding padding, int overwrite)
{
    const moe_status shape = moe_ref_mlp_check_layout_shape(op, layout, B);
    if (shape != MOE_OK)
        return shape;
    const int64_t T = layout->num_tokens, E = layout->num_experts, N = layout->num_blocks, NB = N * B;
    const int64_t *b2e = layout->block_to_expert, *ids = layout->token_position_to_id;
    for (int64_t n = 0; n < N; n++)
        if (b2e[n] < 0 || b2e[n] >= E)
            return moe_fail(MOE_ERR_INVALID_INDEX, "%s: layout.block_to_expert[%" PRId64 "] = %" PRId64
                            ", expected an expert in [0, %" PRId64 ")", op, n, b2e[n], E);
    const int64_t pad = padding == MOE_MLP_PAD_ROW ? T : -1;
    for (int64_t p = 0; p < NB; p++) {
        const int64_t id = ids[p];
        if (id != pad && (id < 0 || id >= T))
            return moe_fail(MOE_ERR_INVALID_INDEX, "%s: layout.token_position_to_id[%" PRId64 "] = %" PRId64
                            " (block %" PRId64 ", slot %" PRId64 "), expected a token in [0, %" PRId64
                            ") or the padding mark %" PRId64 " of %s", op, p, id, p / B, p % B, T, pad,
                            padding_name(padding));
    }

    /* each (token, expert) pair at most once: visit the blocks expert by expert and remember, per token,
     * the last expert it was seen with and where */
    int64_t *start = calloc((size_t)E + 1, sizeof(int64_t));
    int64_t *order = malloc(((size_t)N + 1) * sizeof(int64_t));
    int64_t *seen_expert = malloc(((size_t)T + 1) * sizeof(int64_t));
    int64_t *seen_pos = malloc(((size_t)T + 1) * sizeof(int64_t));
    moe_status status = MOE_OK;
    if (start == NULL || order == NULL || seen_expert == NULL || seen_pos == NULL) {
        status = moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: no memory to check a layout of %" PRId64 " tokens and %"
                          PRId64 " blocks", op, T, N);
        goto done;
    }
    for (int64_t n = 0; n < N; n++)
        start[b2e[n] + 1]++;
    for (int64_t e = 0; e < E; e++)
        start[e + 1] += start[e];
    for (int64_t n = 0; n < N; n++)
        order[start[b2e[n]]++] = n; /* start[e] now ends expert e's run */
    for (int64_t t = 0; t < T; t++)
        seen_expert[t] = -1;
    for (int64_t q = 0; q < N && status == MOE_OK; q++) {
        const int64_t n = order[q], e = b2e[n];
        for (int64_t b = 0; b < B; b++) {
            const int64_t p = n * B + b, t = ids[p];
            if (t == pad)
                continue;
            if (seen_expert[t] == e) {
                status = moe_fail(MOE_ERR_INVALID_ROUTING, "%s: layout.token_position_to_id[%" PRId64
                                  "] and [%" PRId64 "] both place token %" PRId64 " with expert %" PRId64
                                  ", expected each (token, expert) pair at most once", op, seen_pos[t], p, t, e);
                break;
            }
            seen_expert[t] = e;
            seen_pos[t] = p;
        }
    }
    if (status == MOE_OK && overwrite) {
        for (int64_t t = 0; t < T; t++)
            seen_pos[t] = -1;
        for (int64_t p = 0; p < NB; p++) {
            const int64_t t = ids[p];
            if (t == pad)
                continue;
            if (seen_pos[t] >= 0) {
                status = moe_fail(MOE_ERR_INVALID_OPTION, "%s: options.tensor_update_overwrite is set but token %"
                                  PRId64 " sits at layout.token_position_to_id[%" PRId64 "] and [%" PRId64
                                  "], expected each token at most once (top-1)", op, t, seen_pos[t], p);
                break;
            }
            seen_pos[t] = p;
        }
    }
done:
    free(start);
    free(order);
    free(seen_expert);
    free(seen_pos);
    return status;
}

moe_status moe_ref_mlp_check_topk(const char *op, int64_t T, int64_t k, int64_t E, const int64_t *topk_ids)
{
    if (T < 0)
        return moe_fail(MOE_ERR_INVALID_SHAPE, "%s: num_tokens = %" PRId64 ", expected >= 0", op, T);
    if (k < 0 || (k == 0 && T > 0))
        return moe_fail(MOE_ERR_INVALID_SHAPE, "%s: topk = %" PRId64 ", expected >= 1", op, k);
    if (E < 1)
        return moe_fail(MOE_ERR_INVALID_SHAPE, "%s: num_experts = %" PRId64 ", expected >= 1", op, E);
    if (k > E)
        return moe_fail(MOE_ERR_INVALID_SHAPE, "%s: topk = %" PRId64 " > num_experts = %" PRId64
                        ", expected distinct experts per token", op, k, E);
    int64_t M = 0, TE = 0;
    if (!moe_mul_ok(T, k, &M) || !moe_mul_ok(T, E, &TE) || (uint64_t)M > SIZE_MAX / 16 ||
        (uint64_t)TE > SIZE_MAX / 16 || (uint64_t)E > SIZE_MAX / 16)
        return moe_fail(MOE_ERR_OVERFLOW, "%s: num_tokens * topk = %" PRId64 " * %" PRId64
                        " or num_tokens * num_experts overflows", op, T, k);
    if (M > 0 && topk_ids == NULL)
        return moe_fail(MOE_ERR_NULL_POINTER, "%s: topk_ids is NULL but has %" PRId64 " entries", op, M);
    int64_t *last = malloc(((size_t)E + 1) * sizeof(int64_t));
    if (last == NULL)
        return moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: no memory for %" PRId64 " experts", op, E);
    for (int64_t e = 0; e < E; e++)
        last[e] = -1;
    moe_status status = MOE_OK;
    for (int64_t t = 0; t < T && status == MOE_OK; t++) {
        for (int64_t j = 0; j < k; j++) {
            const int64_t e = topk_ids[t * k + j];
            if (e < 0 || e >= E) {
                status = moe_fail(MOE_ERR_INVALID_INDEX, "%s: topk_ids[%" PRId64 "][%" PRId64 "] = %" PRId64
                                  ", expected an expert in [0, %" PRId64 ")", op, t, j, e, E);
                break;
            }
            if (last[e] == t) {
                status = moe_fail(MOE_ERR_INVALID_ROUTING, "%s: topk_ids[%" PRId64 "][%" PRId64 "] = %" PRId64
                                  " repeats an expert of the same token, expected distinct experts per token",
                                  op, t, j, e);
                break;
            }
            last[e] = t;
        }
    }
    free(last);
    return status;
}

static void count_per_expert(int64_t T, int64_t k, int64_t E, const int64_t *ids, int64_t *m)
{
    for (int64_t e = 0; e < E; e++)
        m[e] = 0;
    for (int64_t s = 0; s < T * k; s++)
        m[ids[s]]++;
}

int64_t moe_ref_mlp_count_blocks(moe_mlp_layout_kind kind, int64_t T, int64_t k, int64_t E, int64_t B,
                                 const int64_t *topk_ids)
{
    if (kind == MOE_MLP_DROPPING)
        return E;
    int64_t *m = malloc(((size_t)E + 1) * sizeof(int64_t));
    if (m == NULL)
        return -1;
    count_per_expert(T, k, E, topk_ids, m);
    int64_t N = 0;
    for (int64_t e = 0; e < E; e++)
        N += m[e] / B + (m[e] % B != 0);
    free(m);
    return N;
}

moe_status moe_ref_mlp_build_layout(const char *op, moe_mlp_layout_kind kind, int64_t T, int64_t k,
                                    int64_t E, int64_t B, moe_mlp_padding padding, moe_dtype dtype,
                                    const int64_t *topk_ids, const void *topk_weights, int64_t N,
                                    int64_t *block_to_expert, int64_t *token_position_to_id, void *affinities,
                                    int64_t *num_dropped)
{
    int64_t *m = malloc(((size_t)E + 1) * sizeof(int64_t));
    int64_t *cursor = malloc(((size_t)E + 1) * sizeof(int64_t));
    if (m == NULL || cursor == NULL) {
        free(m);
        free(cursor);
        return moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: no memory for %" PRId64 " experts", op, E);
    }
    count_per_expert(T, k, E, topk_ids, m);
    /* cursor[e]: the next position of expert e; the blocks of expert e follow those of e - 1 */
    int64_t block = 0;
    for (int64_t e = 0; e < E; e++) {
        const int64_t blocks = kind == MOE_MLP_DROPPING ? 1 : m[e] / B + (m[e] % B != 0);
        for (int64_t q = 0; q < blocks; q++)
            block_to_expert[block + q] = e;
        cursor[e] = block * B;
        block += blocks;
    }
    (void)N; /* == block, checked by the caller */
    const int64_t pad = padding == MOE_MLP_PAD_ROW ? T : -1;
    for (int64_t p = 0; p < block * B; p++)
        token_position_to_id[p] = pad;
    const size_t es = moe_dtype_size(dtype);
    if (affinities != NULL)
        memset(affinities, 0, (size_t)(T * E) * es); /* +0 in every dtype */
    int64_t dropped = 0;
    for (int64_t t = 0; t < T; t++) {
        for (int64_t j = 0; j < k; j++) {
            const int64_t e = topk_ids[t * k + j];
            if (kind == MOE_MLP_DROPPING && cursor[e] >= (e + 1) * B) {
                dropped++;
                continue;
            }
            token_position_to_id[cursor[e]++] = t;
            if (affinities != NULL)
                memcpy((char *)affinities + (size_t)(t * E + e) * es,
                       (const char *)topk_weights + (size_t)(t * k + j) * es, es);
        }
    }
    if (num_dropped != NULL)
        *num_dropped = dropped;
    free(m);
    free(cursor);
    return MOE_OK;
}
