/* Block layouts of the blockwise MoE MLP: the host-side check of a caller-made layout and the builders
 * from topk routing (specs/MLP.md, "Layouts"). */
#include "mlp_ref.h"
#include "moe_ref.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/*@ terminates \true;
    assigns \nothing; */
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

/* The part of moe_ref_mlp_check_layout that needs no scratch: every block's expert in [0, E), every
 * position's token in [0, T) or the padding mark pad.
 *   block_to_expert      [N]      the layout's expert of each block
 *   token_position_to_id [N * B]  the layout's token of each position
 *   pad                           T (MOE_MLP_PAD_ROW) or -1 (MOE_MLP_PAD_SKIP), named by `padding` */
/*@ requires dims: 0 <= T < INT64_MAX && 1 <= E && 0 <= N && 1 <= B && N * B <= INT64_MAX;
    requires pad: pad == (padding == MOE_MLP_PAD_ROW ? T : -1);
    requires b2e: \valid_read(b2e + (0 .. N - 1));
    requires ids: \valid_read(ids + (0 .. N * B - 1));
    terminates \true;
    assigns moe_error_model;
    ensures accepts_exactly_wellformed: \result == MOE_OK <==> layout_entries_ok(b2e, ids, T, E, N, B, pad);
    ensures status: \result == MOE_OK || \result == MOE_ERR_INVALID_INDEX; */
static moe_status check_layout_entries(const char *op, int64_t T, int64_t E, int64_t N, int64_t B,
                                       moe_mlp_padding padding, int64_t pad, const int64_t *b2e,
                                       const int64_t *ids)
{
    const int64_t NB = N * B;
    /*@ loop invariant bounds: 0 <= n <= N;
        loop invariant in_range: in_range(b2e, n, 0, E);
        loop assigns n;
        loop variant N - n; */
    for (int64_t n = 0; n < N; n++)
        if (b2e[n] < 0 || b2e[n] >= E)
            return moe_fail(MOE_ERR_INVALID_INDEX, "%s: layout.block_to_expert[%" PRId64 "] = %" PRId64
                            ", expected an expert in [0, %" PRId64 ")", op, n, b2e[n], E);
    /*@ loop invariant bounds: 0 <= p <= NB;
        loop invariant ids_ok: ids_ok(ids, p, T, pad);
        loop assigns p;
        loop variant NB - p; */
    for (int64_t p = 0; p < NB; p++) {
        const int64_t id = ids[p];
        if (id != pad && (id < 0 || id >= T))
            return moe_fail(MOE_ERR_INVALID_INDEX, "%s: layout.token_position_to_id[%" PRId64 "] = %" PRId64
                            " (block %" PRId64 ", slot %" PRId64 "), expected a token in [0, %" PRId64
                            ") or the padding mark %" PRId64 " of %s", op, p, id, p / B, p % B, T, pad,
                            padding_name(padding));
    }
    return MOE_OK;
}

/* The tensor_update_overwrite half of moe_ref_mlp_check_layout: each token at most once.
 *   ids      [NB]  the layout's token of each position (checked: a token or the padding mark)
 *   seen_pos [T]   scratch: the position where token t was met, or -1 */
/*@ requires dims: 0 <= T && 0 <= NB;
    requires pad: pad < 0 || pad >= T;
    requires ids: \valid_read(ids + (0 .. NB - 1)) && ids_ok(ids, NB, T, pad);
    requires seen_pos: \valid(seen_pos + (0 .. T - 1));
    requires separated: \separated(seen_pos + (0 .. T - 1), ids + (0 .. NB - 1));
    terminates \true;
    assigns seen_pos[0 .. T - 1], moe_error_model;
    ensures accepts_exactly_top1: \result == MOE_OK <==>
      (\forall integer a, b; 0 <= a < b < NB && ids[a] != pad ==> ids[a] != ids[b]);
    ensures status: \result == MOE_OK || \result == MOE_ERR_INVALID_OPTION; */
static moe_status check_tokens_once(const char *op, int64_t T, int64_t NB, int64_t pad, const int64_t *ids,
                                    int64_t *seen_pos)
{
    /*@ loop invariant bounds: 0 <= t <= T;
        loop invariant cleared: \forall integer u; 0 <= u < t ==> seen_pos[u] == -1;
        loop assigns t, seen_pos[0 .. T - 1];
        loop variant T - t; */
    for (int64_t t = 0; t < T; t++)
        seen_pos[t] = -1;
    /*@ loop invariant bounds: 0 <= p <= NB;
        loop invariant once: \forall integer a, b; 0 <= a < b < p && ids[a] != pad ==> ids[a] != ids[b];
        loop invariant seen: \forall integer u; 0 <= u < T ==>
          (seen_pos[u] == -1 && (\forall integer q; 0 <= q < p ==> ids[q] != u)) ||
          (0 <= seen_pos[u] < p && ids[seen_pos[u]] == u);
        loop assigns p, seen_pos[0 .. T - 1];
        loop variant NB - p; */
    for (int64_t p = 0; p < NB; p++) {
        const int64_t t = ids[p];
        if (t == pad)
            continue;
        if (seen_pos[t] >= 0)
            return moe_fail(MOE_ERR_INVALID_OPTION, "%s: options.tensor_update_overwrite is set but token %"
                            PRId64 " sits at layout.token_position_to_id[%" PRId64 "] and [%" PRId64
                            "], expected each token at most once (top-1)", op, t, seen_pos[t], p);
        seen_pos[t] = p;
    }
    return MOE_OK;
}

/* Not proved by WP (it allocates); check_layout_entries and check_tokens_once are.  The (token, expert)
 * pair check below is tested only (tests/test_mlp_layout, proptest). */
moe_status moe_ref_mlp_check_layout(const char *op, const moe_mlp_layout *layout, int64_t B,
                                    moe_mlp_padding padding, int overwrite)
{
    const moe_status shape = moe_ref_mlp_check_layout_shape(op, layout, B);
    if (shape != MOE_OK)
        return shape;
    const int64_t T = layout->num_tokens, E = layout->num_experts, N = layout->num_blocks, NB = N * B;
    const int64_t *b2e = layout->block_to_expert, *ids = layout->token_position_to_id;
    const int64_t pad = padding == MOE_MLP_PAD_ROW ? T : -1;
    moe_status status = check_layout_entries(op, T, E, N, B, padding, pad, b2e, ids);
    if (status != MOE_OK)
        return status;

    /* each (token, expert) pair at most once: visit the blocks expert by expert and remember, per token,
     * the last expert it was seen with and where */
    int64_t *start = calloc((size_t)E + 1, sizeof(int64_t));
    int64_t *order = malloc(((size_t)N + 1) * sizeof(int64_t));
    int64_t *seen_expert = malloc(((size_t)T + 1) * sizeof(int64_t));
    int64_t *seen_pos = malloc(((size_t)T + 1) * sizeof(int64_t));
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
    if (status == MOE_OK && overwrite)
        status = check_tokens_once(op, T, NB, pad, ids, seen_pos);
done:
    free(start);
    free(order);
    free(seen_expert);
    free(seen_pos);
    return status;
}

/* One token's row of moe_ref_mlp_check_topk: every id an expert in [0, E), no expert twice.
 *   t         the token (for messages, and the mark left in last[])
 *   row [k]   topk_ids + t * k: the token's experts
 *   last [E]  scratch: the last token seen with expert e, every entry < t on entry; on success the
 *             row's experts are marked t, the others left alone */
/*@ requires dims: 0 <= t && 0 <= k && 1 <= E;
    requires row: \valid_read(row + (0 .. k - 1));
    requires last: \valid(last + (0 .. E - 1));
    requires separated: \separated(last + (0 .. E - 1), row + (0 .. k - 1));
    requires earlier: \forall integer x; 0 <= x < E ==> last[x] < t;
    terminates \true;
    assigns last[0 .. E - 1], moe_error_model;
    ensures accepts_exactly_wellformed: \result == MOE_OK <==> topk_row_ok(row, k, E);
    ensures marked: \result == MOE_OK ==> \forall integer x; 0 <= x < E ==> last[x] <= t;
    ensures status: \result == MOE_OK || \result == MOE_ERR_INVALID_INDEX || \result == MOE_ERR_INVALID_ROUTING; */
static moe_status check_topk_row(const char *op, int64_t t, int64_t k, int64_t E, const int64_t *row,
                                 int64_t *last)
{
    /*@ loop invariant bounds: 0 <= j <= k;
        loop invariant in_range: in_range(row, j, 0, E);
        loop invariant distinct: injective(row, j);
        loop invariant marks: \forall integer x; 0 <= x < E ==>
          last[x] <= t && (last[x] == t <==> \exists integer a; 0 <= a < j && row[a] == x);
        loop assigns j, last[0 .. E - 1];
        loop variant k - j; */
    for (int64_t j = 0; j < k; j++) {
        const int64_t e = row[j];
        if (e < 0 || e >= E)
            return moe_fail(MOE_ERR_INVALID_INDEX, "%s: topk_ids[%" PRId64 "][%" PRId64 "] = %" PRId64
                            ", expected an expert in [0, %" PRId64 ")", op, t, j, e, E);
        if (last[e] == t)
            return moe_fail(MOE_ERR_INVALID_ROUTING, "%s: topk_ids[%" PRId64 "][%" PRId64 "] = %" PRId64
                            " repeats an expert of the same token, expected distinct experts per token",
                            op, t, j, e);
        last[e] = t;
    }
    return MOE_OK;
}

/* The contents half of moe_ref_mlp_check_topk: every id an expert in [0, E), distinct within a token.
 *   topk_ids [T * k]  the experts of each token
 *   last     [E]      scratch: the last token seen with expert e, or -1 */
/*@ requires dims: 0 <= T && 0 <= k && 1 <= E && T * k <= INT64_MAX;
    requires ids: \valid_read(topk_ids + (0 .. T * k - 1));
    requires last: \valid(last + (0 .. E - 1));
    requires separated: \separated(last + (0 .. E - 1), topk_ids + (0 .. T * k - 1));
    terminates \true;
    assigns last[0 .. E - 1], moe_error_model;
    ensures accepts_exactly_wellformed: \result == MOE_OK <==> \old(topk_ok(topk_ids, T, k, E));
    ensures status: \result == MOE_OK || \result == MOE_ERR_INVALID_INDEX || \result == MOE_ERR_INVALID_ROUTING; */
static moe_status check_topk_ids(const char *op, int64_t T, int64_t k, int64_t E, const int64_t *topk_ids,
                                 int64_t *last)
{
    /*@ loop invariant bounds: 0 <= e <= E;
        loop invariant cleared: \forall integer x; 0 <= x < e ==> last[x] == -1;
        loop assigns e, last[0 .. E - 1];
        loop variant E - e; */
    for (int64_t e = 0; e < E; e++)
        last[e] = -1;
    /*@ loop invariant bounds: 0 <= t <= T;
        loop invariant rows_ok: topk_ok{Pre}(topk_ids, t, k, E);
        loop invariant last: \forall integer x; 0 <= x < E ==> last[x] < t;
        loop assigns t, last[0 .. E - 1], moe_error_model;
        loop variant T - t; */
    for (int64_t t = 0; t < T; t++) {
        /*@ ghost lemma_mul_monotone(t + 1, T, k); */
        /*@ assert row_fits: 0 <= t * k && t * k + k <= T * k; */
        const moe_status status = check_topk_row(op, t, k, E, topk_ids + t * k, last);
        /* the row was read in memory where only last[] changed: its verdict holds in the pre-state */
        /*@ assert framed_range: in_range(topk_ids + t * k, k, 0, E) <==> in_range{Pre}(topk_ids + t * k, k, 0, E); */
        /*@ assert framed_distinct: injective(topk_ids + t * k, k) <==> injective{Pre}(topk_ids + t * k, k); */
        if (status != MOE_OK) {
            /*@ assert row_bad: !topk_token_ok{Pre}(topk_ids, t, k, E); */
            return status;
        }
        /*@ assert row_good: topk_token_ok{Pre}(topk_ids, t, k, E); */
    }
    return MOE_OK;
}

moe_status moe_ref_mlp_check_topk_shape(const char *op, int64_t T, int64_t k, int64_t E)
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
    return MOE_OK;
}

moe_status moe_ref_mlp_check_topk(const char *op, int64_t T, int64_t k, int64_t E, const int64_t *topk_ids)
{
    const moe_status shape = moe_ref_mlp_check_topk_shape(op, T, k, E);
    if (shape != MOE_OK)
        return shape;
    const int64_t M = T * k;
    if (M > 0 && topk_ids == NULL)
        return moe_fail(MOE_ERR_NULL_POINTER, "%s: topk_ids is NULL but has %" PRId64 " entries", op, M);
    int64_t *last = malloc(((size_t)E + 1) * sizeof(int64_t));
    if (last == NULL)
        return moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: no memory for %" PRId64 " experts", op, E);
    const moe_status status = check_topk_ids(op, T, k, E, topk_ids, last);
    free(last);
    return status;
}

/* m[e] = the number of topk ids equal to e.
 *   ids [T * k]  checked topk ids;  m [E]  out */
/*@ requires dims: 0 <= T && 0 <= k && 1 <= E && T * k <= INT64_MAX;
    requires ids: \valid_read(ids + (0 .. T * k - 1)) && in_range(ids, T * k, 0, E);
    requires m: \valid(m + (0 .. E - 1));
    requires separated: \separated(m + (0 .. E - 1), ids + (0 .. T * k - 1));
    terminates \true;
    assigns m[0 .. E - 1];
    ensures bounded: \forall integer e; 0 <= e < E ==> 0 <= m[e] <= T * k; */
static void count_per_expert(int64_t T, int64_t k, int64_t E, const int64_t *ids, int64_t *m)
{
    /*@ loop invariant bounds: 0 <= e <= E;
        loop invariant zero: \forall integer x; 0 <= x < e ==> m[x] == 0;
        loop assigns e, m[0 .. E - 1];
        loop variant E - e; */
    for (int64_t e = 0; e < E; e++)
        m[e] = 0;
    /*@ loop invariant bounds: 0 <= s <= T * k;
        loop invariant bounded: \forall integer x; 0 <= x < E ==> 0 <= m[x] <= s;
        loop assigns s, m[0 .. E - 1];
        loop variant T * k - s; */
    for (int64_t s = 0; s < T * k; s++)
        m[ids[s]]++;
}

/* The blocks of a dropless layout: sum_e ceil(m[e] / B).  m [E]: tokens per expert. */
/*@ requires dims: 1 <= E && 1 <= B;
    requires m: \valid_read(m + (0 .. E - 1)) && sizes_nonneg(m, E) && msum(m, E) <= INT64_MAX;
    terminates \true;
    assigns \nothing;
    ensures blocks: \result == nblocks(m, E, B); */
static int64_t dropless_blocks(int64_t E, int64_t B, const int64_t *m)
{
    /*@ ghost lemma_nblocks_le_msum((int64_t *)m, E, B); */
    /*@ ghost lemma_msum_monotone_all((int64_t *)m, 0, E); */
    int64_t N = 0;
    /*@ loop invariant bounds: 0 <= e <= E;
        loop invariant blocks: N == nblocks(m, e, B);
        loop assigns e, N;
        loop variant E - e; */
    for (int64_t e = 0; e < E; e++) {
        /*@ assert step: nblocks(m, e + 1, B) == N + ceil_div(m[e], B) && 0 <= ceil_div(m[e], B) &&
              nblocks(m, e + 1, B) <= msum(m, e + 1) && msum(m, e + 1) <= msum(m, E); */
        N += m[e] / B + (m[e] % B != 0);
    }
    return N;
}

/* Not proved by WP (it allocates); count_per_expert and dropless_blocks are, given that the counts sum to
 * T * k (not proved: the framing of msum over the counting loop; tested by tests/test_mlp_layout). */
int64_t moe_ref_mlp_count_blocks(moe_mlp_layout_kind kind, int64_t T, int64_t k, int64_t E, int64_t B,
                                 const int64_t *topk_ids)
{
    if (kind == MOE_MLP_DROPPING)
        return E;
    int64_t *m = malloc(((size_t)E + 1) * sizeof(int64_t));
    if (m == NULL)
        return -1;
    count_per_expert(T, k, E, topk_ids, m);
    const int64_t N = dropless_blocks(E, B, m);
    free(m);
    return N;
}

/* MOE_MLP_DROPPING: block e belongs to expert e, whose first position is e * B.  Returns E.
 *   block_to_expert [E]  out;  cursor [E]  out: first position of expert e */
/*@ requires dims: 1 <= E && 1 <= B && E * B <= INT64_MAX;
    requires b2e: \valid(block_to_expert + (0 .. E - 1));
    requires cursor: \valid(cursor + (0 .. E - 1));
    requires separated: \separated(cursor + (0 .. E - 1), block_to_expert + (0 .. E - 1));
    terminates \true;
    assigns block_to_expert[0 .. E - 1], cursor[0 .. E - 1];
    ensures blocks: \result == E;
    ensures one_block_each: \forall integer e; 0 <= e < E ==> block_to_expert[e] == e && cursor[e] == e * B; */
static int64_t assign_blocks_dropping(int64_t E, int64_t B, int64_t *block_to_expert, int64_t *cursor)
{
    /*@ loop invariant bounds: 0 <= e <= E;
        loop invariant done: \forall integer x; 0 <= x < e ==> block_to_expert[x] == x && cursor[x] == x * B;
        loop assigns e, block_to_expert[0 .. E - 1], cursor[0 .. E - 1];
        loop variant E - e; */
    for (int64_t e = 0; e < E; e++) {
        /*@ ghost lemma_mul_monotone(e, E, B); */
        block_to_expert[e] = e;
        cursor[e] = e * B;
    }
    return E;
}

/* A dropless layout: expert e gets ceil(m[e] / B) blocks, after those of e - 1, and its first position is
 * the first position of its first block.  Returns the block count N = nblocks(m, E, B).
 *   m [E]  tokens per expert;  block_to_expert [N]  out;  cursor [E]  out
 *   N      ghost (read by the proof only): the block count, bounding block * B */
/*@ requires dims: 1 <= E && 1 <= B && 0 <= N && N * B <= INT64_MAX;
    requires m: \valid_read(m + (0 .. E - 1)) && sizes_nonneg(m, E) && msum(m, E) <= INT64_MAX;
    requires blocks: N == nblocks(m, E, B);
    requires b2e: \valid(block_to_expert + (0 .. N - 1));
    requires cursor: \valid(cursor + (0 .. E - 1));
    requires separated: \separated(m + (0 .. E - 1), cursor + (0 .. E - 1), block_to_expert + (0 .. N - 1));
    terminates \true;
    assigns block_to_expert[0 .. N - 1], cursor[0 .. E - 1];
    ensures blocks: \result == N;
    ensures experts: in_range(block_to_expert, \result, 0, E);
    ensures first_positions: \forall integer e; 0 <= e < E ==> cursor[e] == first_position{Pre}(m, e, B);
    ensures in_order: \forall integer e, n; 0 <= e < E && in_expert_blocks{Pre}(m, B, e, n) ==>
      block_to_expert[n] == e; */
static int64_t assign_blocks_dropless(int64_t E, int64_t B, const int64_t *m, int64_t *block_to_expert,
                                      int64_t *cursor) /*@ ghost (int64_t N) */
{
    /*@ ghost lemma_nblocks_le_msum((int64_t *)m, E, B); */
    /*@ ghost lemma_nblocks_monotone((int64_t *)m, E, B); */
    /*@ ghost lemma_msum_monotone_all((int64_t *)m, 0, E); */
    /*@ ghost lemma_nblocks_owner((int64_t *)m, E, B); */
    int64_t block = 0;
    /* nblocks is read in the pre-state ({Pre}): the loop writes int64 memory (see specs/README.md) */
    /*@ loop invariant bounds: 0 <= e <= E;
        loop invariant block: block == nblocks{Pre}(m, e, B);
        loop invariant owner: \forall integer n; 0 <= n < block ==> 0 <= block_to_expert[n] < e &&
          in_expert_blocks{Pre}(m, B, block_to_expert[n], n);
        loop invariant cursor: \forall integer x; 0 <= x < e ==> cursor[x] == first_position{Pre}(m, x, B);
        loop assigns e, block, block_to_expert[0 .. N - 1], cursor[0 .. E - 1];
        loop variant E - e; */
    for (int64_t e = 0; e < E; e++) {
        /*@ assert step: nblocks{Pre}(m, e + 1, B) == block + ceil_div(m[e], B) && 0 <= ceil_div(m[e], B) &&
              nblocks{Pre}(m, e + 1, B) <= msum{Pre}(m, e + 1) && msum{Pre}(m, e + 1) <= msum{Pre}(m, E) &&
              nblocks{Pre}(m, e + 1, B) <= N; */
        const int64_t blocks = m[e] / B + (m[e] % B != 0);
        /*@ loop invariant bounds: 0 <= q <= blocks;
            loop invariant owner: \forall integer n; 0 <= n < block + q ==> 0 <= block_to_expert[n] <= e &&
              in_expert_blocks{Pre}(m, B, block_to_expert[n], n);
            loop invariant cursor: \forall integer x; 0 <= x < e ==> cursor[x] == first_position{Pre}(m, x, B);
            loop assigns q, block_to_expert[block .. block + blocks - 1];
            loop variant blocks - q; */
        for (int64_t q = 0; q < blocks; q++) {
            /*@ assert mine: in_expert_blocks{Pre}(m, B, e, block + q); */
            block_to_expert[block + q] = e;
        }
        /*@ ghost lemma_mul_monotone(block, N, B); */
        cursor[e] = block * B;
        /*@ assert first: cursor[e] == first_position{Pre}(m, e, B); */
        block += blocks;
    }
    return block;
}

/* Not proved by WP (it allocates and copies dtype-generic affinities); count_per_expert,
 * assign_blocks_dropping and assign_blocks_dropless are.  The placement loop is tested (tests/test_mlp_layout,
 * proptest). */
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
    /* expert e's blocks follow those of e - 1 (one block each with MOE_MLP_DROPPING); cursor[e]: the next
     * position of expert e.  N == the block count (checked by the caller): only the proof reads it */
    (void)N;
    const int64_t block = kind == MOE_MLP_DROPPING
                              ? assign_blocks_dropping(E, B, block_to_expert, cursor)
                              : assign_blocks_dropless(E, B, m, block_to_expert, cursor) /*@ ghost (N) */;
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
