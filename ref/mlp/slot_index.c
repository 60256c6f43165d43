/*
 * ref/mlp/slot_index.c: the slot index of a checked block layout.  The valid positions (those holding a
 * token) are numbered s = 0 .. V-1 in ascending position ("slots") and sorted three ways by stable
 * counting sorts: the slots by expert, the slots by token, the blocks by expert.  The cores are proved
 * (count_tokens, number_slots, bucket_positions, largest_bucket and their drivers up to build_index_in);
 * the allocating shell (mlp_build_index) and mlp_free_index are not (allocation).
 */
#include "mlp_internal.h"

/* (contracts of the external functions on their prototypes in mlp_internal.h) */
void mlp_free_index(slot_index *x)
{
    free(x->pos);
    free(x->token);
    free(x->expert_start);
    free(x->expert_slots);
    free(x->token_start);
    free(x->token_slots);
    free(x->block_start);
    free(x->expert_blocks);
}

/* The number of entries of ids[0 .. n-1] that are tokens (in [0, T)): the slots of a layout.   ids [n] */
/*@ requires n: 0 <= n && \valid_read(ids + (0 .. n - 1));
    terminates \true;
    assigns \nothing;
    ensures count: \result == count_lt((int64_t *)ids, n, T); */
static int64_t count_tokens(const int64_t *ids, int64_t n, int64_t T)
{
    int64_t V = 0;
    /*@ loop invariant bounds: 0 <= q <= n && 0 <= V <= q;
        loop invariant counted: V == count_lt((int64_t *)ids, q, T);
        loop assigns q, V;
        loop variant n - q; */
    for (int64_t q = 0; q < n; q++)
        V += ids[q] >= 0 && ids[q] < T;
    return V;
}

/* Numbers the slots: pos[s] and token[s] are the position and the token of the s-th entry of ids that is a
 * token (in [0, T)), in ascending position.
 *   ids [n];  pos [V], token [V];  V  ghost (read by the proof only): the number of slots */
/*@ requires dims: 0 <= n;
    requires ids: \valid_read(ids + (0 .. n - 1));
    requires slots: V == count_lt((int64_t *)ids, n, T);
    requires out: \valid(pos + (0 .. V - 1)) && \valid(token + (0 .. V - 1));
    requires separated: \separated(pos + (0 .. V - 1), token + (0 .. V - 1), ids + (0 .. n - 1));
    terminates \true;
    assigns pos[0 .. V - 1], token[0 .. V - 1];
    ensures positions: in_range(pos, V, 0, n);
    ensures tokens: in_range(token, V, 0, T); */
static void number_slots(const int64_t *ids, int64_t n, int64_t T, int64_t *pos, int64_t *token)
    /*@ ghost (int64_t V) */
{
    /*@ ghost lemma_count_lt_grows((int64_t *)ids, n, T); */
    int64_t s = 0;
    /*@ loop invariant bounds: 0 <= q <= n && 0 <= s <= q;
        loop invariant slots: s == (\let x = q; \at(count_lt((int64_t *)ids, x, T), Pre));
        loop invariant positions: in_range(pos, s, 0, q);
        loop invariant tokens: in_range(token, s, 0, T);
        loop assigns q, s, pos[0 .. V - 1], token[0 .. V - 1];
        loop variant n - q; */
    for (int64_t q = 0; q < n; q++) {
        if (!(ids[q] >= 0 && ids[q] < T))
            continue;
        /*@ assert slot_in: s < V; */
        pos[s] = q;
        token[s] = ids[q];
        s++;
    }
}

/* A stable counting sort of the entries j < n that are kept (0 <= filter[j] < lim) by their bucket
 * map[j / B] in [0, K): start[k] = the kept entries of buckets below k (start[0] = 0, start[K] = count),
 * and order[start[k] ..] lists the ranks (0, 1, ... among the kept entries, in ascending j) of bucket k's
 * entries, ascending.  mlp_build_index sorts three ways with it: slots by expert (filter = ids, map = b2e,
 * B = block size), slots by token (filter = map = ids, B = 1), blocks by expert (filter = map = b2e,
 * B = 1: every block is kept, and its rank is its index).
 *   filter [n];  map [blocks];  start [K + 1], zero on entry;  order [count];  cursor [K] scratch
 *   count, blocks  ghost (read by the proof only): the kept entries; the length of map (n <= blocks * B) */
/*@ requires dims: 0 <= n && 1 <= B && 0 <= K && 0 <= blocks && n <= blocks * B;
    requires filter: \valid_read(filter + (0 .. n - 1));
    requires map: \valid_read(map + (0 .. blocks - 1));
    requires keys: \forall integer j; 0 <= j < n && 0 <= filter[j] < lim ==> 0 <= map[j / B] < K;
    requires count: count == count_lt((int64_t *)filter, n, lim);
    requires start: \valid(start + (0 .. K)) && \forall integer k; 0 <= k <= K ==> start[k] == 0;
    requires order: \valid(order + (0 .. count - 1));
    requires cursor: \valid(cursor + (0 .. K - 1));
    requires separated: \separated(start + (0 .. K), order + (0 .. count - 1), cursor + (0 .. K - 1),
                                   filter + (0 .. n - 1));
    requires separated_map: \separated(map + (0 .. blocks - 1), start + (0 .. K), order + (0 .. count - 1),
                                       cursor + (0 .. K - 1));
    terminates \true;
    assigns start[1 .. K], order[0 .. count - 1], cursor[0 .. K - 1];
    ensures offsets: start[0] == 0 && start[K] == count;
    ensures sorted: sorted_offsets(start, K);
    ensures sizes: \forall integer k; 0 <= k < K ==>
      start[k + 1] - start[k] == \old(count_key((int64_t *)filter, lim, (int64_t *)map, B, n, k));
    ensures filled: in_range(order, count, 0, count);
    ensures permutation: is_permutation(order, count); */
static void bucket_positions(int64_t n, const int64_t *filter, int64_t lim, const int64_t *map, int64_t B, int64_t K,
                             int64_t *start, int64_t *order, int64_t *cursor)
    /*@ ghost (int64_t count, int64_t blocks) */
{
    /* count_key and count_key_lt read int64 memory, which the loops write (other addresses): the invariants
     * read them in the pre-state (\at Pre, on \let-bound loop values), where the lemma calls below hold. */
    /*@ ghost lemma_count_key_bounds((int64_t *)filter, lim, (int64_t *)map, B, n); */
    /*@ ghost lemma_count_key_lt((int64_t *)filter, lim, (int64_t *)map, B, n); */
    /*@ ghost lemma_count_key_all((int64_t *)filter, lim, (int64_t *)map, B, n, K); */
    /*@ loop invariant bounds: 0 <= j <= n;
        loop invariant counts: \forall integer k; 0 <= k < K ==>
          start[k + 1] == (\let x = j; \at(count_key((int64_t *)filter, lim, (int64_t *)map, B, x, k), Pre));
        loop invariant first: start[0] == 0;
        loop invariant frame: \forall integer y; 0 <= y < n ==> filter[y] == \at(filter[y], Pre);
        loop invariant frame_map: \forall integer y; 0 <= y < blocks ==> map[y] == \at(map[y], Pre);
        loop assigns j, start[1 .. K];
        loop variant n - j; */
    for (int64_t j = 0; j < n; j++) {
        if (!(filter[j] >= 0 && filter[j] < lim))
            continue;
        /*@ ghost lemma_div_below(j, blocks, B); */
        /*@ assert key_step: \let x = j; \let k = map[x / B]; 0 <= k < K &&
              \at(count_key((int64_t *)filter, lim, (int64_t *)map, B, x + 1, k), Pre) == \at(count_key((int64_t *)filter, lim, (int64_t *)map, B, x, k), Pre) + 1 &&
              \at(count_key((int64_t *)filter, lim, (int64_t *)map, B, x + 1, k), Pre) <= x + 1; */
        start[map[j / B] + 1]++;
    }
    /*@ loop invariant bounds: 0 <= k <= K;
        loop invariant done: \forall integer y; 0 <= y <= k ==> start[y] == \at(count_key_lt((int64_t *)filter, lim, (int64_t *)map, B, n, y), Pre);
        loop invariant rest: \forall integer y; k < y <= K ==> start[y] == \at(count_key((int64_t *)filter, lim, (int64_t *)map, B, n, y - 1), Pre);
        loop invariant frame: \forall integer y; 0 <= y < n ==> filter[y] == \at(filter[y], Pre);
        loop invariant frame_map: \forall integer y; 0 <= y < blocks ==> map[y] == \at(map[y], Pre);
        loop assigns k, start[1 .. K];
        loop variant K - k; */
    for (int64_t k = 0; k < K; k++)
        start[k + 1] += start[k];
    /*@ loop invariant bounds: 0 <= k <= K;
        loop invariant copied: \forall integer y; 0 <= y < k ==> cursor[y] == start[y];
        loop invariant sorted: sorted_offsets(start, K);
        loop invariant frame: \forall integer y; 0 <= y < n ==> filter[y] == \at(filter[y], Pre);
        loop invariant frame_map: \forall integer y; 0 <= y < blocks ==> map[y] == \at(map[y], Pre);
        loop assigns k, cursor[0 .. K - 1];
        loop variant K - k; */
    for (int64_t k = 0; k < K; k++)
        cursor[k] = start[k];
    /* every place unfilled (-1, no rank) before the bucketing: then "the filled places hold distinct ranks"
     * needs no bucket bounds (`distinct` below) */
    const int64_t kept = start[K];
    /*@ assert kept: kept == count; */
    /*@ loop invariant bounds: 0 <= q <= count;
        loop invariant unfilled: \forall integer y; 0 <= y < q ==> order[y] == -1;
        loop invariant starts: \forall integer y; 0 <= y <= K ==> start[y] == \at(count_key_lt((int64_t *)filter, lim, (int64_t *)map, B, n, y), Pre);
        loop invariant copied: \forall integer y; 0 <= y < K ==> cursor[y] == start[y];
        loop invariant sorted: sorted_offsets(start, K);
        loop invariant frame: \forall integer y; 0 <= y < n ==> filter[y] == \at(filter[y], Pre);
        loop invariant frame_map: \forall integer y; 0 <= y < blocks ==> map[y] == \at(map[y], Pre);
        loop assigns q, order[0 .. count - 1];
        loop variant count - q; */
    for (int64_t q = 0; q < kept; q++)
        order[q] = -1;
    int64_t s = 0;
    /*@ loop invariant bounds: 0 <= j <= n && 0 <= s <= j;
        loop invariant sorted: sorted_offsets(start, K);
        loop invariant starts: \forall integer y; 0 <= y <= K ==> start[y] == \at(count_key_lt((int64_t *)filter, lim, (int64_t *)map, B, n, y), Pre);
        loop invariant cursor: \forall integer k; 0 <= k < K ==>
          cursor[k] == start[k] + (\let x = j; \at(count_key((int64_t *)filter, lim, (int64_t *)map, B, x, k), Pre));
        loop invariant ranks: s == (\let x = j; \at(count_lt((int64_t *)filter, x, lim), Pre));
        loop invariant filled: \forall integer k, q; 0 <= k < K && start[k] <= q < cursor[k] ==> 0 <= order[q] < s;
        loop invariant marks: \forall integer q; 0 <= q < count ==> order[q] == -1 || 0 <= order[q] < s;
        loop invariant distinct: \forall integer q1, q2; 0 <= q1 < count && 0 <= q2 < count && q1 != q2 &&
          0 <= order[q1] ==> order[q1] != order[q2];
        loop invariant frame: \forall integer y; 0 <= y < n ==> filter[y] == \at(filter[y], Pre);
        loop invariant frame_map: \forall integer y; 0 <= y < blocks ==> map[y] == \at(map[y], Pre);
        loop assigns j, s, cursor[0 .. K - 1], order[0 .. count - 1];
        loop variant n - j; */
    for (int64_t j = 0; j < n; j++) {
        if (!(filter[j] >= 0 && filter[j] < lim))
            continue;
        /*@ ghost lemma_div_below(j, blocks, B); */
        const int64_t key = map[j / B];
        /*@ assert key_step: \let x = j; \let k = key; 0 <= k < K &&
              \at(count_key((int64_t *)filter, lim, (int64_t *)map, B, x + 1, k), Pre) == \at(count_key((int64_t *)filter, lim, (int64_t *)map, B, x, k), Pre) + 1 &&
              \at(count_key((int64_t *)filter, lim, (int64_t *)map, B, x + 1, k), Pre) <= \at(count_key((int64_t *)filter, lim, (int64_t *)map, B, n, k), Pre); */
        /*@ assert bucket_end: \let k = key; \at(count_key_lt((int64_t *)filter, lim, (int64_t *)map, B, n, k), Pre) + \at(count_key((int64_t *)filter, lim, (int64_t *)map, B, n, k), Pre) <= count; */
        /*@ assert cursor_in: 0 <= cursor[key] < count; */
        const int64_t r = cursor[key]++;
        /*@ assert r_separated: \separated(order + r, cursor + (0 .. K - 1), start + (0 .. K), filter + (0 .. n - 1)); */
        /*@ assert r_separated_map: \separated(order + r, map + (0 .. blocks - 1)); */
        order[r] = s++;
    }
    /*@ assert all_ranks: s == count; */
    /*@ assert full: \forall integer k; 0 <= k < K ==> cursor[k] == start[k + 1]; */
    /*@ assert buckets: \forall integer k, q; 0 <= k < K && start[k] <= q < start[k + 1] ==> 0 <= order[q] < count; */
    /*@ ghost lemma_buckets_cover(start, K, order, count, 0, count); */
    /*@ assert injective: injective(order, count); */
}

/* bucket_positions as build_index_in needs it: the same requires, the postconditions but `sizes`.  With the
 * recursive count_key facts of `sizes` from three calls in one context, Z3 ran out of memory (and CVC4
 * timed out) on build_index_in's frame goals after the second call; this contract leaves them out. */
/*@ requires dims: 0 <= n && 1 <= B && 0 <= K && 0 <= blocks && n <= blocks * B;
    requires filter: \valid_read(filter + (0 .. n - 1));
    requires map: \valid_read(map + (0 .. blocks - 1));
    requires keys: \forall integer j; 0 <= j < n && 0 <= filter[j] < lim ==> 0 <= map[j / B] < K;
    requires count: count == count_lt((int64_t *)filter, n, lim);
    requires start: \valid(start + (0 .. K)) && \forall integer k; 0 <= k <= K ==> start[k] == 0;
    requires order: \valid(order + (0 .. count - 1));
    requires cursor: \valid(cursor + (0 .. K - 1));
    requires separated: \separated(start + (0 .. K), order + (0 .. count - 1), cursor + (0 .. K - 1),
                                   filter + (0 .. n - 1));
    requires separated_map: \separated(map + (0 .. blocks - 1), start + (0 .. K), order + (0 .. count - 1),
                                       cursor + (0 .. K - 1));
    terminates \true;
    assigns start[1 .. K], order[0 .. count - 1], cursor[0 .. K - 1];
    ensures offsets: start[0] == 0 && start[K] == count;
    ensures sorted: sorted_offsets(start, K);
    ensures filled: in_range(order, count, 0, count); */
static inline void bucket_sort(int64_t n, const int64_t *filter, int64_t lim, const int64_t *map, int64_t B, int64_t K,
                               int64_t *start, int64_t *order, int64_t *cursor)
    /*@ ghost (int64_t count, int64_t blocks) */
{
    bucket_positions(n, filter, lim, map, B, K, start, order, cursor) /*@ ghost (count, blocks) */;
}

/* The most entries of one bucket: max_k start[k + 1] - start[k].   start [K + 1], sorted, start[0] >= 0 */
/*@ requires dims: 0 <= K && \valid_read(start + (0 .. K));
    requires sorted: start[0] >= 0 && sorted_offsets(start, K);
    terminates \true;
    assigns \nothing;
    ensures largest: 0 <= \result && \forall integer k; 0 <= k < K ==> start[k + 1] - start[k] <= \result; */
static int64_t largest_bucket(const int64_t *start, int64_t K)
{
    int64_t most = 0;
    /*@ loop invariant bounds: 0 <= k <= K && 0 <= most;
        loop invariant largest: \forall integer y; 0 <= y < k ==> start[y + 1] - start[y] <= most;
        loop assigns k, most;
        loop variant K - k; */
    for (int64_t k = 0; k < K; k++)
        most = start[k + 1] - start[k] > most ? start[k + 1] - start[k] : most;
    return most;
}

/* build_index_in's first step: numbers the slots (pos, token: number_slots), sorts them by expert
 * (start = expert_start [E + 1], zero on entry; slots = expert_slots [V]: bucket_sort by block_to_expert)
 * and returns the most slots of one expert (largest_bucket).  `counted`: count_lt of the ids in the
 * post-state, carried from the pre-state by ghost loops (the stores are int64, as the ids), so that the
 * caller needs no induction.  The ensures name one-variable facts (`steps`, not sorted_offsets): the
 * caller frames them across its next calls, which the provers did not do in 40 s for sorted_offsets.
 *   V, C  ghost: the slots, count_lt(ids, N*B, T); the length of cursor (at least E) */
/*@ requires dims: 0 <= T && 1 <= E && 0 <= N && 1 <= B && N * B <= INT64_MAX;
    requires layout: \valid_read(ids + (0 .. N * B - 1)) && \valid_read(b2e + (0 .. N - 1)) &&
      in_range(b2e, N, 0, E);
    requires slots: V == count_lt(ids, N * B, T);
    requires cursor_length: E <= C;
    requires out: \valid(pos + (0 .. V - 1)) && \valid(token + (0 .. V - 1)) && \valid(start + (0 .. E)) &&
      \valid(slots + (0 .. V - 1)) && \valid(cursor + (0 .. C - 1));
    requires zeroed: \forall integer k; 0 <= k <= E ==> start[k] == 0;
    requires separated: \separated(pos + (0 .. V - 1), token + (0 .. V - 1), start + (0 .. E), slots + (0 .. V - 1),
      cursor + (0 .. C - 1), ids + (0 .. N * B - 1));
    requires separated_map: \separated(pos + (0 .. V - 1), token + (0 .. V - 1), start + (0 .. E),
      slots + (0 .. V - 1), cursor + (0 .. C - 1), b2e + (0 .. N - 1));
    terminates \true;
    assigns pos[0 .. V - 1], token[0 .. V - 1], start[1 .. E], slots[0 .. V - 1], cursor[0 .. C - 1];
    ensures positions: in_range(pos, V, 0, N * B);
    ensures tokens: in_range(token, V, 0, T);
    ensures offsets: start[0] == 0 && start[E] == V;
    ensures steps: ascending_steps(start, E);
    ensures filled: in_range(slots, V, 0, V);
    ensures largest: 0 <= \result && \forall integer e; 0 <= e < E ==> start[e + 1] - start[e] <= \result;
    ensures counted: count_lt(ids, N * B, T) == V; */
static int64_t index_by_expert(int64_t *ids, int64_t *b2e, int64_t T, int64_t E, int64_t N, int64_t B,
                               int64_t *pos, int64_t *token, int64_t *start, int64_t *slots, int64_t *cursor)
    /*@ ghost (int64_t V, int64_t C) */
{
    const int64_t NB = N * B;
    number_slots(ids, NB, T, pos, token) /*@ ghost (V) */;
    /*@ ghost
        /@ loop invariant bounds: 0 <= y <= NB;
           loop invariant framed: \forall integer z; 0 <= z <= y ==> count_lt(ids, z, T) == \at(count_lt(ids, z, T), Pre);
           loop assigns y;
           loop variant NB - y; @/
        for (int64_t y = 0; y < NB; y++) ;
    */
    /*@ ghost lemma_map_keys(b2e, N, B, E); */
    bucket_sort(NB, ids, T, b2e, B, E, start, slots, cursor) /*@ ghost (V, N) */;
    /*@ assert steps: ascending_steps(start, E); */
    /*@ ghost
        /@ loop invariant bounds: 0 <= y <= NB;
           loop invariant framed: \forall integer z; 0 <= z <= y ==> count_lt(ids, z, T) == \at(count_lt(ids, z, T), Pre);
           loop assigns y;
           loop variant NB - y; @/
        for (int64_t y = 0; y < NB; y++) ;
    */
    return largest_bucket(start, E);
}

/* build_index_in's second step: sorts the slots by token (start = token_start [T + 1], zero on entry;
 * slots = token_slots [V]: bucket_sort by the ids themselves).
 *   V, C  ghost: the slots, count_lt(ids, NB, T); the length of cursor (at least T) */
/*@ requires dims: 0 <= T && 0 <= NB;
    requires layout: \valid_read(ids + (0 .. NB - 1));
    requires slots: V == count_lt(ids, NB, T);
    requires cursor_length: T <= C;
    requires out: \valid(start + (0 .. T)) && \valid(slots + (0 .. V - 1)) && \valid(cursor + (0 .. C - 1));
    requires zeroed: \forall integer k; 0 <= k <= T ==> start[k] == 0;
    requires separated: \separated(start + (0 .. T), slots + (0 .. V - 1), cursor + (0 .. C - 1),
      ids + (0 .. NB - 1));
    terminates \true;
    assigns start[1 .. T], slots[0 .. V - 1], cursor[0 .. C - 1];
    ensures offsets: start[0] == 0 && start[T] == V;
    ensures steps: ascending_steps(start, T);
    ensures filled: in_range(slots, V, 0, V); */
static void index_by_token(int64_t *ids, int64_t T, int64_t NB, int64_t *start, int64_t *slots, int64_t *cursor)
    /*@ ghost (int64_t V, int64_t C) */
{
    bucket_sort(NB, ids, T, ids, 1, T, start, slots, cursor) /*@ ghost (V, NB) */;
    /*@ assert steps: ascending_steps(start, T); */
}

/* build_index_in on the arrays themselves (formals, not x's fields: shorter goals): the slots by expert
 * (index_by_expert) and by token (index_by_token), then the blocks by expert (bucket_sort of
 * block_to_expert); returns max_slots.  The arrays as in index_scratch_ok: apart by distinct base addresses
 * (index_bases).  Proved: index_by_expert's facts are restated after index_by_token one by one (`*_kept`;
 * without them its frame goals timed out: specs/README.md, build_index_in's row), and the two starts
 * are framed element by element across the block sort (`expert_start_kept`, `token_start_kept`, from label
 * Sorted), from which the facts of two neighbours follow without another frame.
 *   V, C  ghost: the slots, count_lt(ids, N*B, T); the length of cursor, max(E, T) (a name rather than
 *         the conditional expression: shorter separation goals) */
/*@ requires dims: 0 <= T && 1 <= E && 0 <= N && 1 <= B && N * B <= INT64_MAX;
    requires layout: \valid_read(ids + (0 .. N * B - 1)) && \valid_read(b2e + (0 .. N - 1)) &&
      in_range(b2e, N, 0, E);
    requires slots: V == count_lt(ids, N * B, T);
    requires cursor_length: E <= C && T <= C;
    requires out: \valid(pos + (0 .. V - 1)) && \valid(token + (0 .. V - 1)) &&
      \valid(expert_start + (0 .. E)) && \valid(expert_slots + (0 .. V - 1)) &&
      \valid(token_start + (0 .. T)) && \valid(token_slots + (0 .. V - 1)) &&
      \valid(block_start + (0 .. E)) && \valid(expert_blocks + (0 .. N - 1)) &&
      \valid(cursor + (0 .. C - 1));
    requires zeroed: \forall integer k; 0 <= k <= E ==> expert_start[k] == 0 && block_start[k] == 0;
    requires zeroed_tokens: \forall integer k; 0 <= k <= T ==> token_start[k] == 0;
    requires bases: index_bases(pos, token, expert_start, expert_slots, token_start, token_slots, block_start,
      expert_blocks, cursor, ids, b2e);
    terminates \true;
    assigns pos[0 .. V - 1], token[0 .. V - 1], expert_start[1 .. E], expert_slots[0 .. V - 1],
      token_start[1 .. T], token_slots[0 .. V - 1], block_start[1 .. E], expert_blocks[0 .. N - 1],
      cursor[0 .. C - 1];
    ensures positions: in_range(pos, V, 0, N * B);
    ensures tokens: in_range(token, V, 0, T);
    ensures by_expert: expert_start[0] == 0 && expert_start[E] == V;
    ensures expert_steps: ascending_steps(expert_start, E);
    ensures expert_slots: in_range(expert_slots, V, 0, V);
    ensures largest: 0 <= \result && \forall integer e; 0 <= e < E ==> expert_start[e + 1] - expert_start[e] <= \result;
    ensures by_token: token_start[0] == 0 && token_start[T] == V;
    ensures token_steps: ascending_steps(token_start, T);
    ensures token_slots: in_range(token_slots, V, 0, V);
    ensures by_block: block_start[0] == 0 && block_start[E] == N;
    ensures block_steps: ascending_steps(block_start, E);
    ensures expert_blocks: in_range(expert_blocks, N, 0, N); */
static int64_t fill_index(int64_t *ids, int64_t *b2e, int64_t T, int64_t E, int64_t N, int64_t B, int64_t *pos,
                          int64_t *token, int64_t *expert_start, int64_t *expert_slots, int64_t *token_start,
                          int64_t *token_slots, int64_t *block_start, int64_t *expert_blocks, int64_t *cursor)
    /*@ ghost (int64_t V, int64_t C) */
{
    const int64_t most = index_by_expert(ids, b2e, T, E, N, B, pos, token, expert_start, expert_slots, cursor)
        /*@ ghost (V, C) */;
    index_by_token(ids, T, N * B, token_start, token_slots, cursor) /*@ ghost (V, C) */;
    /* index_by_expert's facts, framed across index_by_token one by one (the ensures below frame them across
     * the block sort only) */
    /*@ assert positions_kept: in_range(pos, V, 0, N * B); */
    /*@ assert tokens_kept: in_range(token, V, 0, T); */
    /*@ assert by_expert_kept: expert_start[0] == 0 && expert_start[E] == V; */
    /*@ assert expert_steps_kept: ascending_steps(expert_start, E); */
    /*@ assert expert_slots_kept: in_range(expert_slots, V, 0, V); */
    /*@ assert largest_kept: \forall integer e; 0 <= e < E ==> expert_start[e + 1] - expert_start[e] <= most; */
    /*@ assert blocks_kept: in_range(b2e, N, 0, E); */
    /*@ ghost lemma_count_lt_all(b2e, N, E); */
    /*@ ghost Sorted: ; */
    bucket_sort(N, b2e, E, b2e, 1, E, block_start, expert_blocks, cursor) /*@ ghost (N, N) */;
    /* the two starts element by element across the block sort (one index per goal): the ensures' facts of
     * two neighbours (steps, largest) follow from these and the facts at Sorted without another frame
     * (framed directly, they timed out at 60 s) */
    /*@ assert expert_start_kept: \forall integer k; 0 <= k <= E ==> expert_start[k] == \at(expert_start[k], Sorted); */
    /*@ assert token_start_kept: \forall integer k; 0 <= k <= T ==> token_start[k] == \at(token_start[k], Sorted); */
    /*@ assert block_steps: ascending_steps(block_start, E); */
    return most;
}

/* Fills the slot index of a checked layout into arrays the caller allocated (mlp_build_index): the layout
 * ids = token_position_to_id [N*B] (a token in [0, T) or not a token), b2e = block_to_expert [N] (in
 * [0, E)); x->count = the slots V (count_tokens), x's eight arrays and cursor [max(E, T)] scratch, any of
 * them NULL (not allocated): MOE_ERR_OUT_OF_MEMORY with the message mlp_build_index always gave (op: the
 * caller's name).  Proved (with fill_index; the arrays apart by distinct base addresses:
 * index_scratch_ok, index_bases).  Value parameters rather than the problem: with mlp_problem_ok among the
 * hypotheses (its products of five fields) Z3 needed 8 s for the overflow of N * B alone. */
/*@ requires dims: 0 <= T && 1 <= E && 0 <= N && 1 <= B && N * B <= INT64_MAX;
    requires layout: \valid_read(ids + (0 .. N * B - 1)) && \valid_read(b2e + (0 .. N - 1)) &&
      in_range(b2e, N, 0, E);
    requires x: \valid(x);
    requires slots: x->count == count_lt(ids, N * B, T);
    requires arrays: x->pos != \null && x->token != \null && x->expert_start != \null &&
      x->expert_slots != \null && x->token_start != \null && x->token_slots != \null &&
      x->block_start != \null && x->expert_blocks != \null && cursor != \null ==>
      index_scratch_ok(x, cursor, ids, b2e, x->count, T, E, N, N * B);
    terminates \true;
    assigns x->max_slots, x->pos[0 .. x->count - 1], x->token[0 .. x->count - 1], x->expert_start[0 .. E],
      x->expert_slots[0 .. x->count - 1], x->token_start[0 .. T], x->token_slots[0 .. x->count - 1],
      x->block_start[0 .. E], x->expert_blocks[0 .. N - 1], cursor[0 .. (E > T ? E : T) - 1], moe_error_model;
    ensures status: x->pos != \null && x->token != \null && x->expert_start != \null &&
      x->expert_slots != \null && x->token_start != \null && x->token_slots != \null &&
      x->block_start != \null && x->expert_blocks != \null && cursor != \null ?
      \result == MOE_OK : \result == MOE_ERR_OUT_OF_MEMORY;
    ensures index: \result == MOE_OK ==> slot_index_ok(x, ids, T, E, N, B);
    ensures counted: x->count == \old(count_lt(ids, N * B, T)); */
static moe_status build_index_in(const char *op, int64_t *ids, int64_t *b2e, int64_t T, int64_t E, int64_t N,
                                 int64_t B, slot_index *x, int64_t *cursor)
{
    /*@ ghost const int64_t V = x->count; */
    if (!x->pos || !x->token || !x->expert_start || !x->expert_slots || !x->token_start || !x->token_slots ||
        !x->block_start || !x->expert_blocks || !cursor)
        return moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: no memory for the slot index of %" PRId64 " positions",
                        op, N * B);
    /* x->count is apart from what fill_index writes (index_scratch_ok's distinct bases), stated in the form
     * of fill_index's assigns: count_kept below then needs no unfolding (it ran out of memory in Z3 without) */
    /*@ assert count_apart: \separated(&x->count, x->pos + (0 .. V - 1)) &&
          \separated(&x->count, x->token + (0 .. V - 1)) && \separated(&x->count, x->expert_start + (1 .. E)) &&
          \separated(&x->count, x->expert_slots + (0 .. V - 1)) && \separated(&x->count, x->token_start + (1 .. T)) &&
          \separated(&x->count, x->token_slots + (0 .. V - 1)) && \separated(&x->count, x->block_start + (1 .. E)) &&
          \separated(&x->count, x->expert_blocks + (0 .. N - 1)) &&
          \separated(&x->count, cursor + (0 .. (E > T ? E : T) - 1)); */
    x->max_slots = fill_index(ids, b2e, T, E, N, B, x->pos, x->token, x->expert_start, x->expert_slots,
                              x->token_start, x->token_slots, x->block_start, x->expert_blocks, cursor)
        /*@ ghost (V, E > T ? E : T) */;
    /*@ assert count_kept: x->count == V; */
    /*@ ghost lemma_steps_sorted(x->expert_start, E); */
    /*@ ghost lemma_steps_sorted(x->token_start, T); */
    /*@ ghost lemma_steps_sorted(x->block_start, E); */
    return MOE_OK;
}

/* (contract on the prototype in mlp_internal.h) */
moe_status mlp_build_index(const moe_mlp_problem *p, slot_index *x)
{
    memset(x, 0, sizeof *x);
    const int64_t NB = p->N * p->B, E = p->E, T = p->T, N = p->N;
    const int64_t V = count_tokens(p->token_position_to_id, NB, T);
    x->count = V;
    x->pos = malloc(((size_t)V + 1) * sizeof(int64_t));
    x->token = malloc(((size_t)V + 1) * sizeof(int64_t));
    x->expert_start = calloc((size_t)E + 1, sizeof(int64_t));
    x->expert_slots = malloc(((size_t)V + 1) * sizeof(int64_t));
    x->token_start = calloc((size_t)T + 1, sizeof(int64_t));
    x->token_slots = malloc(((size_t)V + 1) * sizeof(int64_t));
    x->block_start = calloc((size_t)E + 1, sizeof(int64_t));
    x->expert_blocks = malloc(((size_t)N + 1) * sizeof(int64_t));
    int64_t *cursor = malloc(((size_t)(E > T ? E : T) + 1) * sizeof(int64_t));
    /* the layout's arrays as int64_t *, the type of the logic (count_lt, in_range); read only */
    const moe_status status = build_index_in(p->op, (int64_t *)p->token_position_to_id, (int64_t *)p->block_to_expert,
                                             T, E, N, p->B, x, cursor);
    free(cursor);
    if (status != MOE_OK)
        mlp_free_index(x);
    return status;
}
