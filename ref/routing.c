/* Routing builders and validators (SEMANTICS section 1), host memory. */
#include "moe_ref.h"

#include <inttypes.h>

/* The m_sizes half of moe_ref_check_routing: m_sizes[e] >= 0 and sum == rows (no scratch). */
/*@ requires experts: num_experts >= 1;
    requires rows: rows >= 0;
    requires m_sizes: \valid_read(m_sizes + (0 .. num_experts - 1));
    terminates \true;
    assigns moe_error_model;
    ensures accepts_exactly_wellformed: \result == MOE_OK <==> sizes_ok(m_sizes, num_experts, rows);
    ensures status: \result == MOE_OK || \result == MOE_ERR_INVALID_ROUTING; */
static moe_status check_sizes(const char *op, int64_t num_experts, int64_t rows, const int64_t *m_sizes)
{
    int64_t total = 0;
    /*@ loop invariant bounds: 0 <= e <= num_experts;
        loop invariant nonneg: sizes_nonneg(m_sizes, e);
        loop invariant total: total == msum(m_sizes, e) && 0 <= total <= rows;
        loop assigns e, total;
        loop variant num_experts - e; */
    for (int64_t e = 0; e < num_experts; e++) {
        if (m_sizes[e] < 0)
            return moe_fail(MOE_ERR_INVALID_ROUTING, "%s: routing.m_sizes[%" PRId64 "] = %" PRId64
                            ", expected >= 0", op, e, m_sizes[e]);
        if (m_sizes[e] > rows - total) {
            /*@ ghost lemma_msum_monotone((int64_t *)m_sizes, e + 1, num_experts); */
            return moe_fail(MOE_ERR_INVALID_ROUTING, "%s: routing.m_sizes[0..%" PRId64 "] sums past T*k = %"
                            PRId64 " (expected sum(m_sizes) == T*k)", op, e, rows);
        }
        total += m_sizes[e];
    }
    if (total != rows)
        return moe_fail(MOE_ERR_INVALID_ROUTING, "%s: sum(routing.m_sizes) = %" PRId64
                        ", expected T*k = %" PRId64, op, total, rows);
    return MOE_OK;
}

/* The permutation half of moe_ref_check_routing.
 *   gather_indices [rows]   the routing's gather indices
 *   seen           [rows]   zeroed scratch: seen[s] != 0 once slot s has been met
 * (One byte per slot rather than one bit: the same answers, and WP proves it without bit reasoning.) */
/*@ requires rows: 0 < rows;
    requires gather: \valid_read(gather_indices + (0 .. rows - 1));
    requires seen: \valid(seen + (0 .. rows - 1));
    requires zeroed: \forall integer i; 0 <= i < rows ==> seen[i] == 0;
    requires separated: \separated(seen + (0 .. rows - 1), gather_indices + (0 .. rows - 1));
    terminates \true;
    assigns seen[0 .. rows - 1], moe_error_model;
    ensures accepts_exactly_permutations: \result == MOE_OK <==> is_permutation(gather_indices, rows);
    ensures status: \result == MOE_OK || \result == MOE_ERR_INVALID_ROUTING; */
static moe_status check_permutation(const char *op, int64_t rows, const int64_t *gather_indices,
                                    unsigned char *seen)
{
    /*@ loop invariant bounds: 0 <= r <= rows;
        loop invariant in_range: in_range(gather_indices, r, 0, rows);
        loop invariant injective: injective(gather_indices, r);
        loop invariant marked: \forall integer s; 0 <= s < rows ==>
          (seen[s] != 0 <==> (\exists integer q; 0 <= q < r && gather_indices[q] == s));
        loop assigns r, seen[0 .. rows - 1];
        loop variant rows - r; */
    for (int64_t r = 0; r < rows; r++) {
        int64_t slot = gather_indices[r];
        if (slot < 0 || slot >= rows)
            return moe_fail(MOE_ERR_INVALID_ROUTING, "%s: routing.gather_indices[%" PRId64 "] = %" PRId64
                            ", expected a slot in [0, %" PRId64 ")", op, r, slot, rows);
        if (seen[slot])
            return moe_fail(MOE_ERR_INVALID_ROUTING, "%s: routing.gather_indices[%" PRId64 "] = %" PRId64
                            " repeats an earlier entry (expected a permutation of [0, %" PRId64 "))",
                            op, r, slot, rows);
        seen[slot] = 1;
    }
    return MOE_OK;
}

moe_status moe_ref_check_routing_in(const char *op, int64_t num_experts, int64_t rows, const int64_t *m_sizes,
                                    const int64_t *gather_indices, int need_gather, unsigned char *seen)
{
    moe_status status = check_sizes(op, num_experts, rows, m_sizes);
    if (status != MOE_OK || !need_gather || rows == 0)
        return status;
    if (seen == NULL)
        return moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: no memory for the %" PRId64
                        "-byte permutation check of routing.gather_indices", op, rows);
    return check_permutation(op, rows, gather_indices, seen);
}

void moe_ref_expert_offsets(int64_t num_experts, const int64_t *m_sizes, int64_t *offsets)
{
    /*@ ghost lemma_msum_monotone_all((int64_t *)m_sizes, 0, num_experts); */
    offsets[0] = 0;
    /* msum is read in the pre-state (\at Pre): the loop writes int64 memory, and restating msum after a
     * write would need a framing induction */
    /*@ loop invariant bounds: 0 <= e <= num_experts;
        loop invariant prefix_sums: \forall integer k; 0 <= k <= e ==> offsets[k] == \at(msum(m_sizes, k), Pre);
        loop invariant sorted: sorted_offsets(offsets, e);
        loop assigns e, offsets[1 .. num_experts];
        loop variant num_experts - e; */
    for (int64_t e = 0; e < num_experts; e++)
        offsets[e + 1] = offsets[e] + m_sizes[e];
}

int64_t moe_ref_expert_of_row(int64_t num_experts, const int64_t *offsets, int64_t row)
{
    /* the last e with offsets[e] <= row: binary search over [0, E) */
    int64_t lo = 0, hi = num_experts - 1;
    /*@ loop invariant bounds: 0 <= lo <= hi <= num_experts - 1;
        loop invariant low: offsets[lo] <= row;
        loop invariant high: row < offsets[hi + 1];
        loop assigns lo, hi;
        loop variant hi - lo; */
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        if (offsets[mid] <= row)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

moe_status moe_ref_check_routing_dims(const char *op, int64_t num_tokens, int64_t topk, int64_t num_experts,
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
                        " is too large (past 64 bits, or past SIZE_MAX / 8 rows)", op, num_tokens, topk);
    return MOE_OK;
}

/* The placement loop of the counting sort: for s = 0 .. rows - 1 ascending, slot s goes to the next free row r
 * of its expert e = topk_ids[s]: gather_indices[r] = s, scatter_indices[s] = r (when not NULL), next[e] + 1.
 * Entered with next[e] the first row of expert e's bucket (the prefix sums of the counts: `room`, `ordered`), it
 * leaves every bucket [old next[e], next[e]) holding the slots of expert e in ascending order.
 *   topk_ids [rows];  next [E] (in: bucket starts, out: bucket ends);  gather_indices, scatter_indices [rows] */
/*@ requires dims: 0 <= rows <= INT64_MAX / 2 && 1 <= num_experts <= INT64_MAX / 2;
    requires ids: \valid_read(topk_ids + (0 .. rows - 1)) && in_range(topk_ids, rows, 0, num_experts);
    requires gather: \valid(gather_indices + (0 .. rows - 1));
    requires scatter: scatter_indices == \null || \valid(scatter_indices + (0 .. rows - 1));
    requires next: \valid(next + (0 .. num_experts - 1));
    requires separated: \separated(topk_ids + (0 .. rows - 1), gather_indices + (0 .. rows - 1),
                                   next + (0 .. num_experts - 1));
    requires separated_scatter: scatter_indices != \null ==> \separated(scatter_indices + (0 .. rows - 1),
                                   topk_ids + (0 .. rows - 1), gather_indices + (0 .. rows - 1),
                                   next + (0 .. num_experts - 1));
    requires room: \forall integer e; 0 <= e < num_experts ==>
      0 <= next[e] && next[e] + count_eq(topk_ids, rows, e) <= rows;
    requires ordered: \forall integer e1, e2; 0 <= e1 < e2 < num_experts ==>
      next[e1] + count_eq(topk_ids, rows, e1) <= next[e2];
    terminates \true;
    assigns next[0 .. num_experts - 1], gather_indices[0 .. rows - 1], scatter_indices[0 .. rows - 1];
    ensures cursor: \forall integer e; 0 <= e < num_experts ==>
      next[e] == \old(next[e]) + \old(count_eq(topk_ids, rows, e));
    ensures grouped: \forall integer e, q; 0 <= e < num_experts && \old(next[e]) <= q < next[e] ==>
      0 <= gather_indices[q] < rows && topk_ids[gather_indices[q]] == e;
    ensures stable: \forall integer e, q; 0 <= e < num_experts && \old(next[e]) <= q && q + 1 < next[e] ==>
      gather_indices[q] < gather_indices[q + 1];
    ensures gather_range: \old(in_range(gather_indices, rows, 0, rows)) ==> in_range(gather_indices, rows, 0, rows);
    ensures inverse: scatter_indices != \null ==> \forall integer j; 0 <= j < rows ==>
      0 <= scatter_indices[j] < rows && gather_indices[scatter_indices[j]] == j; */
static void place_slots(int64_t rows, const int64_t *topk_ids, int64_t *next, int64_t *gather_indices,
                        int64_t *scatter_indices) /*@ ghost (int64_t num_experts) */
{
    /*@ ghost lemma_count_eq_bounds((int64_t *)topk_ids, rows); */
    /*@ loop invariant bounds: 0 <= s <= rows;
        loop invariant ids: \forall integer j; 0 <= j < rows ==> topk_ids[j] == \at(topk_ids[j], Pre);
        loop invariant cursor: \forall integer e; 0 <= e < num_experts ==>
          next[e] == \at(next[e], Pre) + (\let x = s; \at(count_eq((int64_t *)topk_ids, x, e), Pre));
        loop invariant within: \forall integer e; 0 <= e < num_experts ==>
          \at(next[e], Pre) <= next[e] <= \at(next[e] + count_eq((int64_t *)topk_ids, rows, e), Pre);
        loop invariant grouped: \forall integer e, q; 0 <= e < num_experts && \at(next[e], Pre) <= q < next[e] ==>
          0 <= gather_indices[q] < s && topk_ids[gather_indices[q]] == e;
        loop invariant stable: \forall integer e, q; 0 <= e < num_experts && \at(next[e], Pre) <= q && q + 1 < next[e] ==>
          gather_indices[q] < gather_indices[q + 1];
        loop invariant gather_range: \at(in_range(gather_indices, rows, 0, rows), Pre) ==>
          in_range(gather_indices, rows, 0, rows);
        loop invariant scattered: scatter_indices != \null ==> \forall integer j; 0 <= j < s ==>
          \at(next[topk_ids[j]], Pre) <= scatter_indices[j] < next[topk_ids[j]] && gather_indices[scatter_indices[j]] == j;
        loop assigns s, next[0 .. num_experts - 1], gather_indices[0 .. rows - 1], scatter_indices[0 .. rows - 1];
        loop variant rows - s; */
    for (int64_t s = 0; s < rows; s++) {
        const int64_t e = topk_ids[s];
        /*@ assert count_step: \let x = s; \forall integer f;
              \at(count_eq((int64_t *)topk_ids, x + 1, f), Pre) ==
              \at(count_eq((int64_t *)topk_ids, x, f), Pre) + (topk_ids[x] == f ? 1 : 0); */
        /*@ assert in_bucket: \let k = e; \at(next[k], Pre) <= next[k] < \at(next[k] + count_eq((int64_t *)topk_ids, rows, k), Pre); */
        /*@ assert apart: \forall integer f; 0 <= f < num_experts && f != e ==>
              next[e] < \at(next[f], Pre) || \at(next[f] + count_eq((int64_t *)topk_ids, rows, f), Pre) <= next[e]; */
        const int64_t r = next[e];
        /*@ assert below: \forall integer q; \let k = e; \at(next[k], Pre) <= q < r ==> gather_indices[q] < s; */
        gather_indices[r] = s;
        if (scatter_indices != NULL)
            scatter_indices[s] = r;
        next[e] = r + 1;
        /*@ assert kept: \forall integer q; 0 <= q < rows && q != r ==>
              gather_indices[q] == \at(gather_indices[q], LoopCurrent); */
        /*@ assert others: \forall integer f; 0 <= f < num_experts && f != e ==> next[f] == \at(next[f], LoopCurrent); */
    }
}

/* The counting sort of moe_routing_from_topk (contract on the prototype in moe_ref.h). */
void moe_ref_counting_sort(int64_t rows, int64_t num_experts, const int64_t *topk_ids, int64_t *m_sizes,
                           int64_t *gather_indices, int64_t *scatter_indices, int64_t *next)
{
    /* Counts, prefix sums, then place_slots (the slots into their buckets, ascending) and, in ghost code,
     * the bucket starts as msum of the counts and lemma_buckets_permutation (gather_indices a permutation).
     * Framing: count_eq and msum read int64 memory, which the code here writes (other addresses), so the
     * counting loop reads count_eq in the pre-state (\at Pre, on a \let-bound loop value) and the ghost loops
     * frame_counted, frame_placed and frame_end carry it over to the current state (an induction over the
     * slots: topk_ids itself is never written), where the single-state ghost lemma functions apply:
     * lemma_msum_counts (the counts add up to rows: sizes_ok) and lemma_msum_monotone_all (the buckets are
     * ordered and inside [0, rows)).  The label `placing` and the assertions sizes_kept, ends_cursor and
     * ends_first only name facts for the provers (without sizes_kept, ends_cursor timed out at 60 s);
     * lemma_count_eq_bounds bounds the counts (the counting loop's increments). */
    /*@ ghost lemma_count_eq_bounds((int64_t *)topk_ids, rows); */
    /*@ loop invariant bounds: 0 <= e <= num_experts;
        loop invariant zero: \forall integer j; 0 <= j < e ==> m_sizes[j] == 0;
        loop assigns e, m_sizes[0 .. num_experts - 1];
        loop variant num_experts - e; */
    for (int64_t e = 0; e < num_experts; e++)
        m_sizes[e] = 0;
    /*@ loop invariant bounds: 0 <= s <= rows;
        loop invariant counts: \forall integer e; 0 <= e < num_experts ==>
          m_sizes[e] == (\let x = s; \at(count_eq((int64_t *)topk_ids, x, e), Pre));
        loop assigns s, m_sizes[0 .. num_experts - 1];
        loop variant rows - s; */
    for (int64_t s = 0; s < rows; s++)
        m_sizes[topk_ids[s]]++;
    /*@ ghost
        /@ loop invariant bounds: 0 <= x <= rows;
           loop invariant frame_counted: \forall integer y, e; 0 <= y <= x ==>
             count_eq((int64_t *)topk_ids, y, e) == \at(count_eq((int64_t *)topk_ids, y, e), Pre);
           loop assigns x;
           loop variant rows - x; @/
        for (int64_t x = 0; x < rows; x++) ;
        lemma_msum_counts(m_sizes, (int64_t *)topk_ids, rows, num_experts);
        lemma_msum_monotone_all(m_sizes, 0, num_experts);
        /@ assert msum_step: \forall integer e; 0 <= e < num_experts ==>
             msum(m_sizes, e + 1) == msum(m_sizes, e) + m_sizes[e]; @/
        /@ assert cursor_bounds: \forall integer e; 0 <= e < num_experts ==>
             0 <= msum(m_sizes, e) && msum(m_sizes, e) + m_sizes[e] <= rows; @/
    */
    moe_ref_expert_offsets(num_experts, m_sizes, next);
    /*@ assert cursor_range: \forall integer e; 0 <= e < num_experts ==> 0 <= next[e] && next[e] + m_sizes[e] <= rows; */
    /*@ assert first_start: next[0] == 0; */
    /*@ assert adjacent: \forall integer e; 0 <= e < num_experts ==> next[e] + m_sizes[e] == next[e + 1]; */
    /*@ assert ordered: \forall integer e1, e2; 0 <= e1 < e2 < num_experts ==> next[e1] + m_sizes[e1] <= next[e2]; */
    /*@ ghost
        /@ loop invariant bounds: 0 <= x <= rows;
           loop invariant frame_placed: \forall integer y, e; 0 <= y <= x ==>
             count_eq((int64_t *)topk_ids, y, e) == \at(count_eq((int64_t *)topk_ids, y, e), Pre);
           loop assigns x;
           loop variant rows - x; @/
        for (int64_t x = 0; x < rows; x++) ;
    */
    /*@ assert counted: \forall integer e; 0 <= e < num_experts ==> m_sizes[e] == count_eq((int64_t *)topk_ids, rows, e); */
    /*@ ghost placing: ; */
    place_slots(rows, topk_ids, next, gather_indices, scatter_indices) /*@ ghost (num_experts) */;
    /*@ assert ids_post: in_range((int64_t *)topk_ids, rows, 0, num_experts); */
    /*@ assert sizes_kept: \forall integer e; 0 <= e < num_experts ==> m_sizes[e] == \at(m_sizes[e], placing); */
    /*@ assert ends_cursor: \forall integer e; 0 <= e < num_experts ==> next[e] == \at(next[e], placing) + m_sizes[e]; */
    /*@ assert ends_first: next[0] - m_sizes[0] == 0; */
    /*@ assert ends: \forall integer e; 0 <= e < num_experts - 1 ==> next[e] == next[e + 1] - m_sizes[e + 1]; */
    /*@ ghost
        /@ loop invariant bounds: 0 <= x <= rows;
           loop invariant frame_end: \forall integer y, e; 0 <= y <= x ==>
             count_eq((int64_t *)topk_ids, y, e) == \at(count_eq((int64_t *)topk_ids, y, e), Pre);
           loop assigns x;
           loop variant rows - x; @/
        for (int64_t x = 0; x < rows; x++) ;
        lemma_msum_counts(m_sizes, (int64_t *)topk_ids, rows, num_experts);
        /@ loop invariant bounds: 0 <= x <= num_experts;
           loop invariant starts: \forall integer y; 0 <= y < x ==> next[y] - m_sizes[y] == msum(m_sizes, y);
           loop assigns x;
           loop variant num_experts - x; @/
        for (int64_t x = 0; x < num_experts; x++) ;
        lemma_buckets_permutation(gather_indices, (int64_t *)topk_ids, m_sizes, rows, num_experts);
    */
}


moe_status moe_ref_routing_from_topk_check(const char *op, int64_t num_tokens, int64_t topk, int64_t num_experts,
                                          const int64_t *topk_ids, const int64_t *m_sizes,
                                          const int64_t *gather_indices, int64_t *rows)
{
    moe_status status = moe_ref_check_routing_dims(op, num_tokens, topk, num_experts, rows);
    if (status != MOE_OK)
        return status;
    const int64_t M = *rows;
    if (m_sizes == NULL)
        return moe_fail(MOE_ERR_NULL_POINTER, "%s: m_sizes is NULL", op);
    if (M > 0 && (topk_ids == NULL || gather_indices == NULL))
        return moe_fail(MOE_ERR_NULL_POINTER, "%s: %s is NULL with T*k = %" PRId64 " > 0", op,
                        topk_ids == NULL ? "topk_ids" : "gather_indices", M);
    if ((uint64_t)num_experts >= SIZE_MAX / sizeof(int64_t))
        return moe_fail(MOE_ERR_OVERFLOW, "%s: num_experts = %" PRId64 " too large", op, num_experts);
    /*@ loop invariant bounds: 0 <= s <= M;
        loop invariant in_range: in_range(topk_ids, s, 0, num_experts);
        loop assigns s;
        loop variant M - s; */
    for (int64_t s = 0; s < M; s++)
        if (topk_ids[s] < 0 || topk_ids[s] >= num_experts)
            return moe_fail(MOE_ERR_INVALID_INDEX, "%s: topk_ids[%" PRId64 "][%" PRId64 "] = %" PRId64
                            ", expected an expert in [0, %" PRId64 ")", op, s / topk, s % topk,
                            topk_ids[s], num_experts);
    return MOE_OK;
}
