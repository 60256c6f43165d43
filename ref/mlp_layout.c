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
                        " or num_tokens * num_experts = %" PRId64 " * %" PRId64 " is too large (past 64 bits, or"
                        " past SIZE_MAX / 16 positions, tokens or experts)", op, N, B, T, E);
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
    ensures accepts_exactly_top1: \result == MOE_OK <==> tokens_once(ids, NB, pad);
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
        loop invariant once: tokens_once(ids, p, pad);
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

/* One block of check_pairs' visit: block order[q], whose expert e is at least every expert visited before
 * (the visit order is sorted by expert), slot by slot.  A token whose last expert (seen_expert) is e repeats
 * a pair: reported.  Otherwise its last expert becomes e, its last position (seen_pos, for the message) p.
 *   b2e [N], ids [N * B]    the layout (entries checked)
 *   order [N]               the visit order: a permutation of the blocks, sorted by expert up to q
 *   seen_expert, seen_pos [T]  per token: the last expert and position visited (-1: none) */
/*@ requires dims: 0 <= T < INT64_MAX && 1 <= E && 0 <= q < N && 1 <= B && N * B <= INT64_MAX;
    requires pad: pad < 0 || pad >= T;
    requires b2e: \valid_read(b2e + (0 .. N - 1)) && in_range(b2e, N, 0, E);
    requires ids: \valid_read(ids + (0 .. N * B - 1)) && ids_ok(ids, N * B, T, pad);
    requires order: \valid_read(order + (0 .. N - 1)) && is_permutation(order, N);
    requires sorted: \forall integer a; 0 <= a <= q ==> b2e[order[a]] <= b2e[order[q]];
    requires seen: \valid(seen_expert + (0 .. T - 1)) && \valid(seen_pos + (0 .. T - 1));
    requires separated: \separated(seen_expert + (0 .. T - 1), seen_pos + (0 .. T - 1));
    requires bases: other_base(seen_expert, (int64_t *)ids, (int64_t *)order, (int64_t *)b2e) &&
      other_base(seen_pos, (int64_t *)ids, (int64_t *)order, (int64_t *)b2e);
    requires seen_range: \forall integer u; 0 <= u < T ==> -1 <= seen_expert[u] < E;
    requires seen_below: \forall integer u; 0 <= u < T ==> seen_expert[u] <= b2e[order[q]];
    requires once: pairs_once_visited(order, b2e, ids, B, pad, q, 0);
    requires last: last_expert{Here, Here}(seen_expert, order, b2e, ids, T, B, q, 0);
    terminates \true;
    assigns seen_expert[0 .. T - 1], seen_pos[0 .. T - 1], moe_error_model;
    ensures seen_range: \forall integer u; 0 <= u < T ==> -1 <= seen_expert[u] < E;
    ensures seen_below: \forall integer u; 0 <= u < T ==> seen_expert[u] <= b2e[order[q]];
    ensures once: \result == MOE_OK ==> pairs_once_visited(order, b2e, ids, B, pad, q + 1, 0);
    ensures last: \result == MOE_OK ==> last_expert{Here, Here}(seen_expert, order, b2e, ids, T, B, q + 1, 0);
    ensures repeated: \result != MOE_OK ==> !pairs_once(b2e, ids, N, B, pad);
    ensures status: \result == MOE_OK || \result == MOE_ERR_INVALID_ROUTING; */
static moe_status check_block_pairs(const char *op, int64_t T, int64_t E, int64_t N, int64_t B, int64_t pad,
                                    const int64_t *b2e, const int64_t *ids, const int64_t *order, int64_t q,
                                    int64_t *seen_expert, int64_t *seen_pos)
{
    (void)T, (void)E, (void)N; /* read by the contract and the proof only */
    const int64_t n = order[q], e = b2e[n];
    /*@ ghost lemma_row_fits(n, N, B); */
    /*@ loop invariant bounds: 0 <= b <= B;
        loop invariant seen_range: \forall integer u; 0 <= u < T ==> -1 <= seen_expert[u] < E;
        loop invariant seen_below: \forall integer u; 0 <= u < T ==> seen_expert[u] <= e;
        loop invariant once: pairs_once_visited{Pre}(order, b2e, ids, B, pad, q, b);
        loop invariant last: last_expert{Here, Pre}(seen_expert, order, b2e, ids, T, B, q, b);
        loop assigns b, seen_expert[0 .. T - 1], seen_pos[0 .. T - 1];
        loop variant B - b; */
    for (int64_t b = 0; b < B; b++) {
        const int64_t p = n * B + b, t = ids[p];
        /*@ assert token: t == token_at{Pre}(ids, B, n, b); */
        if (t == pad)
            continue;
        if (seen_expert[t] == e) {
            /*@ assert repeated: \exists integer a, c; 0 <= a <= q && 0 <= c < B && visited_before(a, c, q, b) &&
                  token_at{Pre}(ids, B, \at(order[a], Pre), c) == t && \at(b2e[order[a]], Pre) == e; */
            /*@ assert other_place: \forall integer a, c; 0 <= a <= q && 0 <= c < B && visited_before(a, c, q, b) ==>
                  \at(order[a], Pre) != n || c != b; */
            /*@ assert broken: !pairs_once{Pre}(b2e, ids, N, B, pad); */
            /*@ assert frame_b2e: \forall integer x; 0 <= x < N ==> b2e[x] == \at(b2e[x], Pre); */
            /*@ ghost lemma_rows_inside(0, N, B); */
    /*@ assert frame_ids: \forall integer x, c; 0 <= x < N && 0 <= c < B ==>
                  token_at(ids, B, x, c) == token_at{Pre}(ids, B, x, c); */
            /*@ assert broken_here: !pairs_once(b2e, ids, N, B, pad); */
            return moe_fail(MOE_ERR_INVALID_ROUTING, "%s: layout.token_position_to_id[%" PRId64
                            "] and [%" PRId64 "] both place token %" PRId64 " with expert %" PRId64
                            ", expected each (token, expert) pair at most once", op, seen_pos[t], p, t, e);
        }
        /*@ assert new_pair: \forall integer a, c; 0 <= a && 0 <= c < B && visited_before(a, c, q, b) &&
              token_at{Pre}(ids, B, \at(order[a], Pre), c) == t ==> \at(b2e[order[a]], Pre) < e; */
        seen_expert[t] = e;
        seen_pos[t] = p;
    }
    /*@ assert next_block: \forall integer a, c; 0 <= c < B ==>
          (visited_before(a, c, q + 1, 0) <==> visited_before(a, c, q, B)); */
    /*@ assert once_pre: pairs_once_visited{Pre}(order, b2e, ids, B, pad, q + 1, 0); */
    /*@ assert last_pre: last_expert{Here, Pre}(seen_expert, order, b2e, ids, T, B, q + 1, 0); */
    /*@ assert frame_order: \forall integer a; 0 <= a < N ==> order[a] == \at(order[a], Pre); */
    /*@ assert frame_b2e: \forall integer x; 0 <= x < N ==> b2e[x] == \at(b2e[x], Pre); */
    /*@ ghost lemma_rows_inside(0, N, B); */
    /*@ assert frame_ids: \forall integer x, c; 0 <= x < N && 0 <= c < B ==>
          token_at(ids, B, x, c) == token_at{Pre}(ids, B, x, c); */
    return MOE_OK;
}

/* check_pairs' visit order: the blocks sorted by expert (moe_ref_counting_sort of block_to_expert, stable),
 * with only what check_pairs reads of it: a permutation of the blocks along which the experts ascend (a small
 * contract: with the sort's every ensures among its hypotheses, check_pairs' frame goals took 30 s or timed out).
 *   b2e [N];  counts [E], start [E + 1] scratch;  order [N] out */
/*@ requires dims: 1 <= E <= INT64_MAX / 2 && 0 <= N <= INT64_MAX / 2;
    requires b2e: \valid_read(b2e + (0 .. N - 1)) && in_range(b2e, N, 0, E);
    requires scratch: \valid(counts + (0 .. E - 1)) && \valid(start + (0 .. E)) && \valid(order + (0 .. N - 1));
    requires separated: \separated(counts + (0 .. E - 1), start + (0 .. E), order + (0 .. N - 1), b2e + (0 .. N - 1));
    terminates \true;
    assigns counts[0 .. E - 1], start[0 .. E], order[0 .. N - 1];
    ensures permutation: is_permutation(order, N);
    ensures sorted: \forall integer a1, a2; 0 <= a1 <= a2 < N ==> b2e[order[a1]] <= b2e[order[a2]]; */
static void sort_blocks(int64_t N, int64_t E, const int64_t *b2e, int64_t *counts, int64_t *start, int64_t *order)
{
    moe_ref_counting_sort(N, E, b2e, counts, order, NULL, start);
    /*@ ghost lemma_buckets_sorted(order, (int64_t *)b2e, counts, N, E); */
}

/* Each (token, expert) pair at most once: visit the blocks expert by expert (order: the blocks sorted by
 * expert, stably: sort_blocks) and remember, per token, the last expert it was seen with (seen_expert) and
 * where (seen_pos).  In that order the blocks of one expert come together and the experts ascend, so a token
 * repeats a pair exactly when its last expert is the current block's (check_block_pairs).  The first
 * repeated pair in that visit order is reported.
 *   b2e [N], ids [N * B]   the layout (entries checked: check_layout_entries)
 *   counts [E], start [E + 1], order [N], seen_expert [T], seen_pos [T]   scratch, any contents */
/*@ requires dims: 0 <= T < INT64_MAX && 1 <= E <= INT64_MAX / 2 && 0 <= N <= INT64_MAX / 2 && 1 <= B &&
      N * B <= INT64_MAX;
    requires pad: pad < 0 || pad >= T;
    requires b2e: \valid_read(b2e + (0 .. N - 1)) && in_range(b2e, N, 0, E);
    requires ids: \valid_read(ids + (0 .. N * B - 1)) && ids_ok(ids, N * B, T, pad);
    requires scratch: \valid(counts + (0 .. E - 1)) && \valid(start + (0 .. E)) && \valid(order + (0 .. N - 1)) &&
      \valid(seen_expert + (0 .. T - 1)) && \valid(seen_pos + (0 .. T - 1));
    requires separated: \separated(counts + (0 .. E - 1), start + (0 .. E), order + (0 .. N - 1),
      seen_expert + (0 .. T - 1), seen_pos + (0 .. T - 1), b2e + (0 .. N - 1));
    requires separated_ids: \separated(ids + (0 .. N * B - 1), counts + (0 .. E - 1), start + (0 .. E),
      order + (0 .. N - 1), seen_expert + (0 .. T - 1), seen_pos + (0 .. T - 1));
    requires bases: other_base(seen_expert, (int64_t *)ids, order, (int64_t *)b2e) &&
      other_base(seen_pos, (int64_t *)ids, order, (int64_t *)b2e);
    terminates \true;
    assigns counts[0 .. E - 1], start[0 .. E], order[0 .. N - 1], seen_expert[0 .. T - 1], seen_pos[0 .. T - 1],
      moe_error_model;
    ensures accepts_exactly_pairs_once: \result == MOE_OK <==> pairs_once(b2e, ids, N, B, pad);
    ensures status: \result == MOE_OK || \result == MOE_ERR_INVALID_ROUTING; */
static moe_status check_pairs(const char *op, int64_t T, int64_t E, int64_t N, int64_t B, int64_t pad,
                              const int64_t *b2e, const int64_t *ids, int64_t *counts, int64_t *start,
                              int64_t *order, int64_t *seen_expert, int64_t *seen_pos)
{
    sort_blocks(N, E, b2e, counts, start, order);
    /*@ loop invariant bounds: 0 <= t <= T;
        loop invariant cleared: \forall integer u; 0 <= u < t ==> seen_expert[u] == -1;
        loop assigns t, seen_expert[0 .. T - 1];
        loop variant T - t; */
    for (int64_t t = 0; t < T; t++)
        seen_expert[t] = -1;
    /*@ loop invariant bounds: 0 <= q <= N;
        loop invariant seen_range: \forall integer u; 0 <= u < T ==> -1 <= seen_expert[u] < E;
        loop invariant seen_below: q < N ==> \forall integer u; 0 <= u < T ==> seen_expert[u] <= b2e[order[q]];
        loop invariant once: pairs_once_visited(order, b2e, ids, B, pad, q, 0);
        loop invariant last: last_expert{Here, Here}(seen_expert, order, b2e, ids, T, B, q, 0);
        loop assigns q, seen_expert[0 .. T - 1], seen_pos[0 .. T - 1], moe_error_model;
        loop variant N - q; */
    for (int64_t q = 0; q < N; q++) {
        const moe_status status = check_block_pairs(op, T, E, N, B, pad, b2e, ids, order, q, seen_expert, seen_pos);
        if (status != MOE_OK)
            return status;
    }
    /*@ ghost lemma_pairs_once_all(order, (int64_t *)b2e, (int64_t *)ids, N, B, pad); */
    return MOE_OK;
}

moe_status moe_ref_mlp_check_layout_in(const char *op, const moe_mlp_layout *layout, int64_t B,
                                       moe_mlp_padding padding, int overwrite, int64_t *counts, int64_t *start,
                                       int64_t *order, int64_t *seen_expert, int64_t *seen_pos)
{
    const int64_t T = layout->num_tokens, E = layout->num_experts, N = layout->num_blocks, NB = N * B;
    const int64_t *b2e = layout->block_to_expert, *ids = layout->token_position_to_id;
    const int64_t pad = padding == MOE_MLP_PAD_ROW ? T : -1;
    moe_status status = check_layout_entries(op, T, E, N, B, padding, pad, b2e, ids);
    if (status != MOE_OK)
        return status;
    if (counts == NULL || start == NULL || order == NULL || seen_expert == NULL || seen_pos == NULL)
        return moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: no memory for the scratch of the layout check (2 E + 2 T + N + 1"
                        " int64 for E = %" PRId64 " experts, T = %" PRId64 " tokens, N = %" PRId64 " blocks)", op, E,
                        T, N);
    /*@ ghost lemma_mul_monotone(1, B, N); */
    status = check_pairs(op, T, E, N, B, pad, b2e, ids, counts, start, order, seen_expert, seen_pos);
    /*@ assert entries_kept: layout_entries_ok(b2e, ids, T, E, N, B, pad); */
    if (status != MOE_OK || !overwrite)
        return status;
    /*@ ghost paired: ; */
    status = check_tokens_once(op, T, NB, pad, ids, seen_pos);
    /* check_tokens_once wrote seen_pos only, an allocation of its own (layout_scratch_ok): the pairs stand */
    /*@ assert frame_b2e: \forall integer x; 0 <= x < N ==> b2e[x] == \at(b2e[x], paired); */
    /*@ ghost lemma_rows_inside(0, N, B); */
    /*@ assert frame_ids: \forall integer x, c; 0 <= x < N && 0 <= c < B ==>
          token_at(ids, B, x, c) == token_at{paired}(ids, B, x, c); */
    /*@ assert pairs_kept: pairs_once(b2e, ids, N, B, pad); */
    /*@ assert entries_kept_2: layout_entries_ok(b2e, ids, T, E, N, B, pad); */
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
                        " or num_tokens * num_experts is too large (past 64 bits, or past SIZE_MAX / 16)", op, T, k);
    return MOE_OK;
}

moe_status moe_ref_mlp_check_topk_in(const char *op, int64_t T, int64_t k, int64_t E, const int64_t *topk_ids,
                                     int64_t *last)
{
    const int64_t M = T * k;
    if (M > 0 && topk_ids == NULL)
        return moe_fail(MOE_ERR_NULL_POINTER, "%s: topk_ids is NULL but has %" PRId64 " entries", op, M);
    if (last == NULL)
        return moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: no memory for %" PRId64 " experts", op, E);
    return check_topk_ids(op, T, k, E, topk_ids, last);
}

/* m[e] = the number of topk ids equal to e (the counting loop of moe_ref_counting_sort, ref/routing.c).
 *   ids [T * k]  checked topk ids;  m [E]  out */
/*@ requires dims: 0 <= T && 0 <= k && 1 <= E && T * k <= INT64_MAX;
    requires ids: \valid_read(ids + (0 .. T * k - 1)) && in_range(ids, T * k, 0, E);
    requires m: \valid(m + (0 .. E - 1));
    requires separated: \separated(m + (0 .. E - 1), ids + (0 .. T * k - 1));
    requires block_size: 1 <= B;
    terminates \true;
    assigns m[0 .. E - 1];
    ensures counts: \forall integer e; 0 <= e < E ==> m[e] == count_eq(ids, T * k, e);
    ensures counts_pre: \forall integer e; 0 <= e < E ==> m[e] == \old(count_eq(ids, T * k, e));
    ensures sizes_ok: sizes_ok(m, E, T * k);
    ensures blocks: nblocks(m, E, B) == \old(topk_blocks(ids, T * k, E, B)); */
static void count_per_expert(int64_t T, int64_t k, int64_t E, const int64_t *ids, int64_t *m)
    /*@ ghost (int64_t B) */
{
    const int64_t M = T * k;
    /* count_eq is read in the pre-state (the loop writes int64 memory); the ghost loop carries it over
     * to the current state for lemma_msum_counts (as in moe_ref_counting_sort) */
    /*@ ghost lemma_count_eq_bounds((int64_t *)ids, M); */
    /*@ loop invariant bounds: 0 <= e <= E;
        loop invariant zero: \forall integer x; 0 <= x < e ==> m[x] == 0;
        loop assigns e, m[0 .. E - 1];
        loop variant E - e; */
    for (int64_t e = 0; e < E; e++)
        m[e] = 0;
    /*@ loop invariant bounds: 0 <= s <= M;
        loop invariant counted: \forall integer x; 0 <= x < E ==>
          m[x] == (\let y = s; \at(count_eq((int64_t *)ids, y, x), Pre));
        loop assigns s, m[0 .. E - 1];
        loop variant M - s; */
    for (int64_t s = 0; s < M; s++)
        m[ids[s]]++;
    /*@ ghost
        /@ loop invariant bounds: 0 <= y <= M;
           loop invariant framed: \forall integer z, x; 0 <= z <= y ==>
             count_eq((int64_t *)ids, z, x) == \at(count_eq((int64_t *)ids, z, x), Pre);
           loop assigns y;
           loop variant M - y; @/
        for (int64_t y = 0; y < M; y++) ;
        lemma_msum_counts(m, (int64_t *)ids, M, E);
        lemma_nblocks_counts(m, (int64_t *)ids, M, E, B);
        /@ loop invariant bounds: 0 <= x <= E;
           loop invariant framed_blocks: topk_blocks((int64_t *)ids, M, x, B) ==
             (\let n = M; \let y = x; \at(topk_blocks((int64_t *)ids, n, y, B), Pre));
           loop assigns x;
           loop variant E - x; @/
        for (int64_t x = 0; x < E; x++) ;
    */
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

int64_t moe_ref_mlp_count_blocks_in(moe_mlp_layout_kind kind, int64_t T, int64_t k, int64_t E, int64_t B,
                                    const int64_t *topk_ids, int64_t *m)
{
    if (kind == MOE_MLP_DROPPING)
        return E;
    if (m == NULL)
        return -1;
    count_per_expert(T, k, E, topk_ids, m) /*@ ghost (B) */;
    const int64_t N = dropless_blocks(E, B, m);
    /*@ ghost lemma_mul_monotone(0, T, k); */
    /*@ ghost lemma_nblocks_counts(m, (int64_t *)topk_ids, T * k, E, B); */
    /*@ ghost lemma_nblocks_le_msum(m, E, B); */
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
    ensures one_block_each: \forall integer e; 0 <= e < E ==> block_to_expert[e] == e && cursor[e] == e * B;
    ensures value_regions: regions_ok(cursor, E, E * B);
    ensures value_blocks_in_regions: blocks_in_regions(block_to_expert, cursor, E, E, B); */
static int64_t assign_blocks_dropping(int64_t E, int64_t B, int64_t *block_to_expert, int64_t *cursor)
{
    /*@ loop invariant bounds: 0 <= e <= E;
        loop invariant done: \forall integer x; 0 <= x < e ==> block_to_expert[x] == x && cursor[x] == x * B;
        loop invariant ascending: \forall integer a, b; 0 <= a <= b < e ==> cursor[a] <= cursor[b];
        loop invariant below: \forall integer x; 0 <= x < e ==> cursor[x] + B <= e * B;
        loop invariant runs: \forall integer n; 0 <= n < e ==> block_in_region(block_to_expert, cursor, e, e * B, B, n);
        loop assigns e, block_to_expert[0 .. E - 1], cursor[0 .. E - 1];
        loop variant E - e; */
    for (int64_t e = 0; e < E; e++) {
        /*@ ghost lemma_mul_monotone(e, E, B); */
        block_to_expert[e] = e;
        cursor[e] = e * B;
        /*@ assert step: (e + 1) * B == e * B + B; */
        /*@ assert run: block_in_region(block_to_expert, cursor, e + 1, (e + 1) * B, B, e); */
    }
    /*@ assert first: cursor[0] == 0; */
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
      block_to_expert[n] == e;
    ensures room: \forall integer e; 0 <= e < E ==> 0 <= cursor[e] && cursor[e] + m[e] <= N * B;
    ensures value_regions: regions_ok(cursor, E, N * B);
    ensures value_blocks_in_regions: blocks_in_regions(block_to_expert, cursor, E, N, B);
    ensures value_fits: \forall integer e; 0 <= e < E ==> cursor[e] + m[e] <= region_end(cursor, E, N * B, e); */
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
        loop invariant room: \forall integer x; 0 <= x < e ==> 0 <= cursor[x] && cursor[x] + m[x] <= N * B;
        loop invariant start: 0 < e ==> cursor[0] == 0;
        loop invariant ascending: \forall integer a, b; 0 <= a <= b < e ==> cursor[a] <= cursor[b];
        loop invariant below: \forall integer x; 0 <= x < e ==> cursor[x] <= block * B;
        loop invariant runs: \forall integer n; 0 <= n < block ==> 0 <= block_to_expert[n] < e &&
          cursor[block_to_expert[n]] <= n * B;
        loop invariant run_ends: \forall integer n; 0 <= n < block ==>
          n * B + B <= region_end(cursor, e, block * B, block_to_expert[n]);
        loop invariant fits: \forall integer x; 0 <= x < e ==> cursor[x] + m[x] <= region_end(cursor, e, block * B, x);
        loop assigns e, block, block_to_expert[0 .. N - 1], cursor[0 .. E - 1];
        loop variant E - e; */
    for (int64_t e = 0; e < E; e++) {
        /*@ assert step: nblocks{Pre}(m, e + 1, B) == block + ceil_div(m[e], B) && 0 <= ceil_div(m[e], B) &&
              nblocks{Pre}(m, e + 1, B) <= msum{Pre}(m, e + 1) && msum{Pre}(m, e + 1) <= msum{Pre}(m, E) &&
              nblocks{Pre}(m, e + 1, B) <= N; */
        const int64_t blocks = m[e] / B + (m[e] % B != 0);
        /*@ ghost lemma_mul_monotone(block, N, B); */
        cursor[e] = block * B;
        /*@ assert first: cursor[e] == first_position{Pre}(m, e, B); */
        /*@ assert runs_kept: \forall integer n; 0 <= n < block ==> 0 <= block_to_expert[n] < e &&
              cursor[block_to_expert[n]] <= n * B; */
        /*@ assert ends_kept: \forall integer x; 0 <= x < e ==>
              region_end(cursor, e + 1, block * B, x) == \at(region_end(cursor, e, block * B, x), LoopCurrent); */
        /*@ ghost lemma_mul_monotone(block, block + blocks, B); */
        /*@ loop invariant bounds: 0 <= q <= blocks;
            loop invariant owner: \forall integer n; 0 <= n < block + q ==> 0 <= block_to_expert[n] <= e &&
              in_expert_blocks{Pre}(m, B, block_to_expert[n], n);
            loop invariant cursor: \forall integer x; 0 <= x <= e ==> cursor[x] == first_position{Pre}(m, x, B);
            loop invariant room: \forall integer x; 0 <= x < e ==> 0 <= cursor[x] && cursor[x] + m[x] <= N * B;
            loop invariant runs: \forall integer n; 0 <= n < block ==> block_to_expert[n] == \at(block_to_expert[n], LoopEntry);
            loop invariant runs_new: \forall integer n; block <= n < block + q ==> block_to_expert[n] == e;
            loop assigns q, block_to_expert[block .. block + blocks - 1];
            loop variant blocks - q; */
        for (int64_t q = 0; q < blocks; q++) {
            /*@ assert mine: in_expert_blocks{Pre}(m, B, e, block + q); */
            block_to_expert[block + q] = e;
        }
        /* the runs in positions: the earlier blocks keep theirs, expert e's new blocks lie in block * B ..
         * (block + blocks) * B (lemma_rows_inside: the products of the quantified block index, apart from
         * the loop above, whose goals they swamp) */
        /*@ ghost lemma_rows_inside(block, block + blocks, B); */
        /*@ assert runs_old: \forall integer n; 0 <= n < block ==> 0 <= block_to_expert[n] < e &&
              cursor[block_to_expert[n]] <= n * B && n * B + B <= cursor[block_to_expert[n] + 1]; */
        /*@ assert runs_new: \forall integer n; block <= n < block + blocks ==> block_to_expert[n] == e &&
              cursor[e] <= n * B && n * B + B <= (block + blocks) * B; */
        /*@ assert runs_e: \forall integer n; 0 <= n < block + blocks ==> 0 <= block_to_expert[n] < e + 1 &&
              cursor[block_to_expert[n]] <= n * B; */
        /*@ assert ends_e: \forall integer n; 0 <= n < block + blocks ==>
              n * B + B <= region_end(cursor, e + 1, (block + blocks) * B, block_to_expert[n]); */
        /* expert e's tokens fit in its blocks, which end inside the layout */
        /*@ ghost lemma_mul_monotone(block + blocks, N, B); */
        /*@ assert euclid: m[e] == (m[e] / B) * B + m[e] % B && 0 <= m[e] % B < B; */
        /*@ assert covered: m[e] <= blocks * B; */
        /*@ assert room_e: 0 <= cursor[e] && cursor[e] + m[e] <= (block + blocks) * B && (block + blocks) * B <= N * B; */
        block += blocks;
    }
    return block;
}

/* The end of expert e's one block, (e + 1) * B (MOE_MLP_DROPPING's drop test): a function of its own, so
 * that the overflow goal of the product is stated over e and B, not over the wrapped e + 1 of a goal that
 * carries place_row's invariants. */
/*@ requires dims: 0 <= e < INT64_MAX && 1 <= B && (e + 1) * B <= INT64_MAX;
    terminates \true;
    assigns \nothing;
    ensures end: \result == (e + 1) * B; */
static int64_t block_end(int64_t e, int64_t B)
{
    return (e + 1) * B;
}

/* Stores token t at expert e's cursor next[e], which moves on.  kept / grown: what the store does to a run
 * (run_placed, specs/mlp_layout.acsl) inside 0 .. NB: one that does not hold the position is unchanged; the
 * run whose cursor it is grows by t.
 *   ids [NB]  the positions;  next [E]  the cursors
 *   E, T, NB, pad  ghost: the experts, the tokens, the positions, the padding mark */
/*@ requires dims: 0 <= e < E && 0 <= t < T && 0 <= NB;
    requires pad: pad < 0 || pad >= T;
    requires next: \valid(next + (0 .. E - 1)) && 0 <= next[e] < NB;
    requires positions: \valid(ids + (0 .. NB - 1));
    requires separated: \separated(next + (0 .. E - 1), ids + (0 .. NB - 1));
    terminates \true;
    assigns next[e], ids[next[e]];
    ensures next: next[e] == \old(next[e]) + 1;
    ensures entries: ids_ok{Pre}(ids, NB, T, pad) ==> ids_ok(ids, NB, T, pad);
    ensures kept: \forall integer a, c, b, u; 0 <= a && b <= NB && (\old(next[e]) < a || b <= \old(next[e])) &&
      run_placed{Pre}(ids, a, c, b, u, pad) ==> run_placed(ids, a, c, b, u, pad);
    ensures grown: \forall integer a, b; 0 <= a && b <= NB && a <= \old(next[e]) < b &&
      run_placed{Pre}(ids, a, \old(next[e]), b, t, pad) ==> run_placed(ids, a, \old(next[e]) + 1, b, t + 1, pad); */
static void place_token(int64_t *ids, int64_t *next, int64_t e, int64_t t)
    /*@ ghost (int64_t E, int64_t T, int64_t NB, int64_t pad) */
{
    ids[next[e]++] = t;
}

/* The affinity of one pair: es bytes of weights[from] to affinities[to] (the byte copy apart from the int64
 * memory of the layout).  TE, Tk ghost: the elements of affinities and weights. */
/*@ requires es: es == 2 || es == 4;
    requires dims: 0 <= to < TE && 0 <= from < Tk && TE * 4 <= SIZE_MAX && Tk * 4 <= SIZE_MAX;
    requires bytes: \valid((char *)affinities + (0 .. TE * es - 1)) &&
      \valid_read((char *)weights + (0 .. Tk * es - 1)) &&
      \separated((char *)affinities + (0 .. TE * es - 1), (char *)weights + (0 .. Tk * es - 1));
    terminates \true;
    assigns ((char *)affinities)[to * es .. to * es + es - 1]; */
static void copy_weight(void *affinities, const void *weights, int64_t to, int64_t from, size_t es)
    /*@ ghost (int64_t TE, int64_t Tk) */
{
    /*@ ghost lemma_row_fits(to, TE, (int64_t)es); */
    /*@ ghost lemma_row_fits(from, Tk, (int64_t)es); */
    memcpy((char *)affinities + (size_t)to * es, (const char *)weights + (size_t)from * es, es);
}

/* Token t's pairs in order: pair j, expert e = row[j], goes to position next[e], which then moves on, unless
 * MOE_MLP_DROPPING and expert e's block is full (the pair is dropped).  With affinities, the pair's weight
 * (es bytes) is copied to affinities[t][e].  Returns the pairs dropped.
 *   row [k]  topk_ids + t * k: the token's experts (distinct);  next [E]  the cursors;  ids [NB] the positions
 *   T, NB, pad, start  ghost: the tokens, the positions, the padding mark, the runs' first positions
 * The runs of token t's experts hold tokens below t before, below t + 1 after; the others are unchanged.  The
 * row is read in the pre-state (\at(..., Pre)): its memory is apart from what the stores write. */
/*@ requires dims: 0 <= t < T && 0 <= k && 1 <= E && 1 <= B && T * k <= INT64_MAX && T * E <= INT64_MAX &&
      0 <= NB;
    requires row_fits: 0 <= t * k && t * k + k <= T * k && 0 <= t * E && t * E + E <= T * E;
    requires pad: pad < 0 || pad >= T;
    requires es: es == 2 || es == 4;
    requires bytes: T * E * 4 <= SIZE_MAX && T * k * 4 <= SIZE_MAX;
    requires row: \valid_read(row + (0 .. k - 1)) && topk_row_ok(row, k, E);
    requires start: \valid_read(start + (0 .. E - 1)) && regions_ok(start, E, NB);
    requires next: \valid(next + (0 .. E - 1));
    requires positions: \valid(ids + (0 .. NB - 1)) && ids_ok(ids, NB, T, pad);
    requires runs: runs_placed(ids, start, next, E, NB, t, pad);
    requires dropping: kind == MOE_MLP_DROPPING ==> NB == E * B &&
      \forall integer x; 0 <= x < E ==> start[x] == x * B;
    requires dropless: kind != MOE_MLP_DROPPING ==> \forall integer x; 0 <= x < E && !row_unmet(row, k, x) ==>
      next[x] < region_end(start, E, NB, x);
    requires affinities: affinities != \null ==> \valid((char *)affinities + (0 .. T * E * es - 1)) &&
      \valid_read((char *)topk_weights + (0 .. T * k * es - 1)) &&
      \separated((char *)affinities + (0 .. T * E * es - 1), (char *)topk_weights + (0 .. T * k * es - 1));
    requires separated: \separated(next + (0 .. E - 1), ids + (0 .. NB - 1), start + (0 .. E - 1),
      row + (0 .. k - 1));
    terminates \true;
    assigns next[0 .. E - 1], ids[0 .. NB - 1], ((char *)affinities)[0 .. T * E * es - 1];
    ensures dropped: 0 <= \result <= k;
    ensures entries: ids_ok(ids, NB, T, pad);
    ensures runs: runs_placed(ids, start, next, E, NB, t + 1, pad);
    ensures dropless: kind != MOE_MLP_DROPPING ==> \result == 0 && \forall integer x; 0 <= x < E ==>
      (\old(row_unmet(row, k, x)) ==> next[x] == \old(next[x])) &&
      (!\old(row_unmet(row, k, x)) ==> next[x] == \old(next[x]) + 1); */
static int64_t place_row(moe_mlp_layout_kind kind, int64_t t, int64_t k, int64_t E, int64_t B,
                         const int64_t *row, const void *topk_weights, size_t es, int64_t *next, int64_t *ids,
                         void *affinities)
    /*@ ghost (int64_t T, int64_t NB, int64_t pad, int64_t *start) */
{
    int64_t dropped = 0;
    /*@ loop invariant bounds: 0 <= j <= k;
        loop invariant dropped: 0 <= dropped <= j;
        loop invariant entries: ids_ok(ids, NB, T, pad);
        loop invariant runs: runs_placed(ids, start, next, E, NB, t + 1, pad);
        loop invariant fresh: \forall integer x; 0 <= x < E && (\let i = j; \at(row_unmet(row, i, x), Pre)) ==>
          run_placed(ids, start[x], next[x], region_end(start, E, NB, x), t, pad);
        loop invariant dropless: kind != MOE_MLP_DROPPING ==> dropped == 0 && \forall integer x; 0 <= x < E ==>
          ((\let i = j; \at(row_unmet(row, i, x), Pre)) ==> next[x] == \at(next[x], Pre)) &&
          (!(\let i = j; \at(row_unmet(row, i, x), Pre)) ==> next[x] == \at(next[x], Pre) + 1);
        loop assigns j, dropped, next[0 .. E - 1], ids[0 .. NB - 1], ((char *)affinities)[0 .. T * E * es - 1];
        loop variant k - j; */
    for (int64_t j = 0; j < k; j++) {
        const int64_t e = row[j];
        /*@ assert row_e: \let i = j; e == \at(row[i], Pre); */
        /*@ ghost lemma_runs_apart(start, E, NB, e); */
        /*@ assert new_expert: \let i = j; \let x = e; \at(row_unmet(row, i, x), Pre) && !\at(row_unmet(row, k, x), Pre); */
        /*@ assert run_e: run_placed(ids, start[e], next[e], region_end(start, E, NB, e), t, pad); */
        /*@ ghost lemma_mul_monotone(e + 1, E, B); */
        if (kind == MOE_MLP_DROPPING && next[e] >= block_end(e, B)) {
            dropped++;
            continue;
        }
        /*@ assert room_dropping: kind == MOE_MLP_DROPPING ==> next[e] < (e + 1) * B &&
              (e + 1) * B == region_end(start, E, NB, e); */
        /*@ assert room_dropless: kind != MOE_MLP_DROPPING ==> \let x = e; next[x] == \at(next[x], Pre) &&
              \at(next[x], Pre) < region_end(start, E, NB, x); */
        /*@ assert room: next[e] < region_end(start, E, NB, e); */
        /*@ ghost stored: ; */
        place_token(ids, next, e, t) /*@ ghost (E, T, NB, pad) */;
        /*@ assert grown_e: run_placed(ids, start[e], next[e], region_end(start, E, NB, e), t + 1, pad); */
        /*@ assert kept_runs: \forall integer x; 0 <= x < E && x != e ==>
              run_placed(ids, start[x], next[x], region_end(start, E, NB, x), t + 1, pad); */
        /*@ assert kept_fresh: \forall integer x; 0 <= x < E && x != e && (\let i = j; \at(row_unmet(row, i, x), Pre)) ==>
              run_placed(ids, start[x], next[x], region_end(start, E, NB, x), t, pad); */
        /*@ assert unmet_step: \forall integer x; (\let i = j + 1; \at(row_unmet(row, i, x), Pre)) ==>
              x != e && (\let i = j; \at(row_unmet(row, i, x), Pre)); */
        /*@ assert runs_after: runs_placed(ids, start, next, E, NB, t + 1, pad); */
        /*@ assert fresh_after: \forall integer x; 0 <= x < E && (\let i = j + 1; \at(row_unmet(row, i, x), Pre)) ==>
              run_placed(ids, start[x], next[x], region_end(start, E, NB, x), t, pad); */
        if (affinities != NULL) {
            /*@ ghost lemma_row_fits(t * E + e, T * E, (int64_t)es); */
            copy_weight(affinities, topk_weights, t * E + e, t * k + j, es) /*@ ghost (T * E, T * k) */;
        }
    }
    return dropped;
}

/* Places the routing's (token, expert) pairs in token order (place_row, token by token) into the layout's
 * positions, first all padding marks: pair s = t * k + j with expert e = topk_ids[s] goes to position next[e],
 * which then moves on, unless MOE_MLP_DROPPING and expert e's block is full (the pair is dropped).  next starts
 * as start (a copy: start stays the runs' first positions for the proof).  With affinities, the pair's weight
 * (es bytes) is copied to affinities[t][e].  Returns the dropped pairs.
 *   topk_ids [T * k] (distinct experts per token: topk_ok), topk_weights [T * k] (es bytes each), start [E]
 *   (the first position of each expert's run), next [E] out (the cursors), token_position_to_id [NB] out,
 *   affinities [T * E] (es bytes each) out or NULL;  pad  the padding mark
 *   MOE_MLP_DROPPING: start[e] == e * B and NB == E * B; otherwise expert e's pairs fit in its run
 *   (moe_ref_mlp_build_layout_in: assign_blocks_dropless' value_fits). */
/*@ requires dims: 0 <= T && 0 <= k && 1 <= E && 1 <= B && T * k <= INT64_MAX && T * E <= INT64_MAX && 0 <= NB;
    requires pad: pad < 0 || pad >= T;
    requires es: es == 2 || es == 4;
    requires bytes: T * E * 4 <= SIZE_MAX && T * k * 4 <= SIZE_MAX;
    requires ids: \valid_read(topk_ids + (0 .. T * k - 1)) && topk_ok(topk_ids, T, k, E);
    requires start: \valid_read(start + (0 .. E - 1)) && regions_ok(start, E, NB);
    requires next: \valid(next + (0 .. E - 1));
    requires positions: \valid(token_position_to_id + (0 .. NB - 1));
    requires dropping: kind == MOE_MLP_DROPPING ==> NB == E * B &&
      \forall integer e; 0 <= e < E ==> start[e] == e * B;
    requires dropless: kind != MOE_MLP_DROPPING ==> \forall integer e; 0 <= e < E ==>
      start[e] + count_eq(topk_ids, T * k, e) <= region_end(start, E, NB, e);
    requires affinities: affinities != \null ==> \valid((char *)affinities + (0 .. T * E * es - 1)) &&
      \valid_read((char *)topk_weights + (0 .. T * k * es - 1)) &&
      \separated((char *)affinities + (0 .. T * E * es - 1), (char *)topk_weights + (0 .. T * k * es - 1));
    requires separated: \separated(next + (0 .. E - 1), token_position_to_id + (0 .. NB - 1), start + (0 .. E - 1),
      topk_ids + (0 .. T * k - 1));
    terminates \true;
    assigns next[0 .. E - 1], token_position_to_id[0 .. NB - 1], ((char *)affinities)[0 .. T * E * es - 1];
    ensures dropped: 0 <= \result <= T * k;
    ensures value_entries: ids_ok(token_position_to_id, NB, T, pad);
    ensures value_runs: runs_placed(token_position_to_id, start, next, E, NB, T, pad);
    ensures value_dropless: kind != MOE_MLP_DROPPING ==> \result == 0 && \forall integer e; 0 <= e < E ==>
      next[e] == start[e] + \old(count_eq(topk_ids, T * k, e)); */
static int64_t place_tokens(moe_mlp_layout_kind kind, int64_t T, int64_t k, int64_t E, int64_t B, int64_t NB,
                            int64_t pad, const int64_t *topk_ids, const void *topk_weights, size_t es,
                            const int64_t *start, int64_t *next, int64_t *token_position_to_id, void *affinities)
{
    /*@ ghost lemma_count_eq_bounds((int64_t *)topk_ids, T * k); */
    /*@ loop invariant bounds: 0 <= e <= E;
        loop invariant copied: \forall integer x; 0 <= x < e ==> next[x] == start[x];
        loop assigns e, next[0 .. E - 1];
        loop variant E - e; */
    for (int64_t e = 0; e < E; e++)
        next[e] = start[e];
    /*@ loop invariant bounds: 0 <= p <= NB;
        loop invariant padded: \forall integer q; 0 <= q < p ==> token_position_to_id[q] == pad;
        loop invariant copied: \forall integer x; 0 <= x < E ==> next[x] == start[x];
        loop assigns p, token_position_to_id[0 .. NB - 1];
        loop variant NB - p; */
    for (int64_t p = 0; p < NB; p++)
        token_position_to_id[p] = pad;
    /*@ ghost lemma_runs_bounded((int64_t *)start, E, NB); */
    /*@ assert runs_empty: runs_placed(token_position_to_id, start, next, E, NB, 0, pad); */
    int64_t dropped = 0;
    /*@ loop invariant bounds: 0 <= t <= T;
        loop invariant dropped: 0 <= dropped <= t * k;
        loop invariant entries: ids_ok(token_position_to_id, NB, T, pad);
        loop invariant runs: runs_placed(token_position_to_id, start, next, E, NB, t, pad);
        loop invariant dropless: kind != MOE_MLP_DROPPING ==> dropped == 0 && \forall integer x; 0 <= x < E ==>
          next[x] == start[x] + (\let y = t * k; \at(count_eq((int64_t *)topk_ids, y, x), Pre));
        loop assigns t, dropped, next[0 .. E - 1], token_position_to_id[0 .. NB - 1],
          ((char *)affinities)[0 .. T * E * es - 1];
        loop variant T - t; */
    for (int64_t t = 0; t < T; t++) {
        /*@ ghost lemma_row_fits(t, T, k); */
        /*@ ghost lemma_row_fits(t, T, E); */
        /*@ assert row_pre: topk_token_ok{Pre}(topk_ids, t, k, E); */
        /*@ assert row_frame: \forall integer i; 0 <= i < k ==>
              (\let s = t * k + i; topk_ids[s] == \at(topk_ids[s], Pre)); */
        /*@ assert row_ok: topk_row_ok(topk_ids + t * k, k, E); */
        /* count_eq of the ids is read in the pre-state (the rows wrote int64 memory): carried over here */
        /*@ ghost
            /@ loop invariant bounds: 0 <= y <= T * k;
               loop invariant framed: \forall integer z, x; 0 <= z <= y ==>
                 count_eq((int64_t *)topk_ids, z, x) == \at(count_eq((int64_t *)topk_ids, z, x), Pre);
               loop assigns y;
               loop variant T * k - y; @/
            for (int64_t y = 0; y < T * k; y++) ;
        */
        /*@ ghost lemma_count_row((int64_t *)topk_ids, t * k, k, (int64_t *)topk_ids + t * k); */
        /*@ assert counts_row: kind != MOE_MLP_DROPPING ==> \forall integer x; 0 <= x < E ==>
              (row_unmet(topk_ids + t * k, k, x) ==> (\let y = t * k; \at(count_eq((int64_t *)topk_ids, y + k, x), Pre) ==
               \at(count_eq((int64_t *)topk_ids, y, x), Pre))) &&
              (!row_unmet(topk_ids + t * k, k, x) ==> (\let y = t * k; \at(count_eq((int64_t *)topk_ids, y + k, x), Pre) ==
               \at(count_eq((int64_t *)topk_ids, y, x), Pre) + 1)); */
        /*@ assert counts_room: kind != MOE_MLP_DROPPING ==> \forall integer x; 0 <= x < E ==>
              (\let y = t * k; \at(count_eq((int64_t *)topk_ids, y + k, x), Pre) <=
               \at(count_eq((int64_t *)topk_ids, T * k, x), Pre)); */
        /*@ assert row_room: kind != MOE_MLP_DROPPING ==> \forall integer x; 0 <= x < E &&
              !row_unmet(topk_ids + t * k, k, x) ==> next[x] < region_end(start, E, NB, x); */
        /*@ ghost called: ; */
        dropped += place_row(kind, t, k, E, B, topk_ids + t * k, topk_weights, es, next, token_position_to_id,
                             affinities) /*@ ghost (T, NB, pad, (int64_t *)start) */;
        /*@ assert counts_after: kind != MOE_MLP_DROPPING ==> \forall integer x; 0 <= x < E ==>
              next[x] == start[x] + (\let y = t * k; \at(count_eq((int64_t *)topk_ids, y + k, x), Pre)); */
        /*@ assert next_row: (t + 1) * k == t * k + k; */
    }
    return dropped;
}
/* affinities[0 .. count - 1] = +0 (all bits zero in every dtype). */
/*@ requires dtype: dtype_ok(dtype);
    requires count: 0 <= count <= SIZE_MAX / 16;
    requires affinities: tensor_writable((char *)affinities, count, dtype);
    terminates \true;
    assigns ((char *)affinities)[0 .. byte_offset(count, dtype) - 1]; */
static void zero_affinities(moe_dtype dtype, void *affinities, int64_t count)
{
    /* no call for no elements: memset's contract (Frama-C's libc) wants a valid pointer even for 0 bytes,
     * and an empty affinities tensor may be any non-NULL pointer */
    if (count == 0)
        return;
    /* count * moe_dtype_size(dtype) bytes, the size written as a constant per dtype (as byte_offset is): the
     * provers relate a product by a constant to byte_offset, not the product by a variable es */
    memset(affinities, 0, dtype == MOE_F32 ? (size_t)count * 4 : (size_t)count * 2);
}

/* moe_dtype_size for the affinity copies; a and b (ghost) are element counts whose bytes it states. */
/*@ requires dtype: dtype_ok(dtype);
    terminates \true;
    assigns \nothing;
    ensures size: \result == byte_offset(1, dtype) && (\result == 2 || \result == 4);
    ensures bytes: a * \result == byte_offset(a, dtype) && b * \result == byte_offset(b, dtype); */
static size_t element_size(moe_dtype dtype) /*@ ghost (int64_t a, int64_t b) */
{
    return moe_dtype_size(dtype);
}

moe_status moe_ref_mlp_build_layout_in(const char *op, moe_mlp_layout_kind kind, int64_t T, int64_t k,
                                       int64_t E, int64_t B, moe_mlp_padding padding, moe_dtype dtype,
                                       const int64_t *topk_ids, const void *topk_weights, int64_t N,
                                       int64_t *block_to_expert, int64_t *token_position_to_id,
                                       void *affinities, int64_t *num_dropped, int64_t *m, int64_t *cursor)
{
    (void)N; /* only the proof reads it (the caller checked it is the block count) */
    /*@ assert blocks: N == (kind == MOE_MLP_DROPPING ? E : topk_blocks(topk_ids, T * k, E, B)); */
    if (m == NULL || cursor == NULL)
        return moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: no memory for %" PRId64 " experts", op, E);
    count_per_expert(T, k, E, topk_ids, m) /*@ ghost (B) */;
    /*@ assert ids_counted: in_range(topk_ids, T * k, 0, E); */
    /* expert e's blocks follow those of e - 1 (one block each with MOE_MLP_DROPPING); cursor[e]: the next
     * position of expert e */
    const int64_t block = kind == MOE_MLP_DROPPING
                              ? assign_blocks_dropping(E, B, block_to_expert, cursor)
                              : assign_blocks_dropless(E, B, m, block_to_expert, cursor) /*@ ghost (N) */;
    /*@ ghost lemma_mul_monotone(0, N, B); */
    /*@ ghost lemma_mul_monotone(0, T, E); */
    /*@ ghost lemma_mul_monotone(0, T, k); */
    /*@ assert block: block == N && block * B == N * B; */
    /*@ assert regions: regions_ok(cursor, E, N * B) && blocks_in_regions(block_to_expert, cursor, E, N, B); */
    /*@ assert dropping: kind == MOE_MLP_DROPPING ==> N * B == E * B &&
          \forall integer e; 0 <= e < E ==> cursor[e] == e * B; */
    /*@ assert dropless: kind != MOE_MLP_DROPPING ==> \forall integer e; 0 <= e < E ==>
          cursor[e] + \at(count_eq((int64_t *)topk_ids, T * k, e), Pre) <= region_end(cursor, E, N * B, e); */
    const int64_t pad = padding == MOE_MLP_PAD_ROW ? T : -1, NB = block * B;
    /*@ assert ids_kept: in_range(topk_ids, T * k, 0, E); */
    const size_t es = element_size(dtype) /*@ ghost (T * E, T * k) */;
    if (affinities != NULL)
        zero_affinities(dtype, affinities, T * E);
    /* count_eq and topk_ok of the ids are read in the pre-state (the stores above wrote int64 memory): carried
     * over here, the rows token by token */
    /*@ ghost
        /@ loop invariant bounds: 0 <= y <= T;
           loop invariant rows: topk_ok(topk_ids, y, k, E);
           loop assigns y;
           loop variant T - y; @/
        for (int64_t y = 0; y < T; y++) {
          lemma_row_fits(y, T, k);
          /@ assert row_pre: topk_token_ok{Pre}(topk_ids, y, k, E); @/
          /@ assert row_frame: \forall integer i; 0 <= i < k ==> (\let s = y * k + i; topk_ids[s] == \at(topk_ids[s], Pre)); @/
          /@ assert row_frame_shift: \forall integer i; 0 <= i < k ==>
               (\let r = topk_ids + y * k; r[i] == \at(r[i], Pre)); @/
          /@ assert row_range: in_range(topk_ids + y * k, k, 0, E); @/
          /@ assert row_distinct_pre: injective{Pre}(topk_ids + y * k, k); @/
          /@ assert row_distinct: injective(topk_ids + y * k, k); @/
          /@ assert row_here: topk_token_ok(topk_ids, y, k, E); @/
        }
        /@ loop invariant bounds: 0 <= y <= T * k;
           loop invariant framed: \forall integer z, x; 0 <= z <= y ==>
             count_eq((int64_t *)topk_ids, z, x) == \at(count_eq((int64_t *)topk_ids, z, x), Pre);
           loop assigns y;
           loop variant T * k - y; @/
        for (int64_t y = 0; y < T * k; y++) ;
    */
    /* the padding marks, then the pairs; m (the counts, read by assign_blocks_dropless only) becomes the
     * cursors, cursor keeps the runs' first positions */
    /*@ assert blocks_before: blocks_in_regions(block_to_expert, cursor, E, N, B); */
    /*@ ghost placing: ; */
    const int64_t dropped = place_tokens(kind, T, k, E, B, NB, pad, topk_ids, topk_weights, es, cursor, m,
                                         token_position_to_id, affinities);
    /* place_tokens wrote the positions and m only: the blocks and their runs stand */
    /*@ assert b2e_kept: \forall integer n; 0 <= n < N ==> block_to_expert[n] == \at(block_to_expert[n], placing); */
    /*@ assert cursor_kept: \forall integer x; 0 <= x < E ==> cursor[x] == \at(cursor[x], placing); */
    /*@ assert ends_kept: \forall integer x; 0 <= x < E ==>
          region_end(cursor, E, N * B, x) == \at(region_end(cursor, E, N * B, x), placing); */
    /*@ assert blocks_kept_each: \forall integer n; 0 <= n < N ==>
          \at(block_in_region(block_to_expert, cursor, E, N * B, B, n), placing) &&
          block_to_expert[n] == \at(block_to_expert[n], placing) &&
          cursor[block_to_expert[n]] == \at(cursor[block_to_expert[n]], placing) &&
          region_end(cursor, E, N * B, block_to_expert[n]) == \at(region_end(cursor, E, N * B, block_to_expert[n]), placing); */
    /*@ assert blocks_kept: blocks_in_regions(block_to_expert, cursor, E, N, B); */
    /*@ ghost lemma_runs_pairs(block_to_expert, cursor, m, token_position_to_id, E, N, B, T, pad); */
    /*@ assert value_layout: layout_ok(block_to_expert, token_position_to_id, T, E, N, B, pad, 0); */
    /*@ ghost laid_out: ; */
    if (num_dropped != NULL)
        *num_dropped = dropped;
    /* *num_dropped lies apart from the layout (build_layout_args_ok): the layout stands */
    /*@ assert frame_b2e: \forall integer n; 0 <= n < N ==> block_to_expert[n] == \at(block_to_expert[n], laid_out); */
    /*@ assert frame_positions: \forall integer p; 0 <= p < N * B ==>
          token_position_to_id[p] == \at(token_position_to_id[p], laid_out); */
    /*@ ghost lemma_rows_inside(0, N, B); */
    /*@ assert frame_ids: \forall integer x, c; 0 <= x < N && 0 <= c < B ==>
          token_at(token_position_to_id, B, x, c) == token_at{laid_out}(token_position_to_id, B, x, c); */
    /*@ assert value_layout_end: layout_ok(block_to_expert, token_position_to_id, T, E, N, B, pad, 0); */
    return MOE_OK;
}
