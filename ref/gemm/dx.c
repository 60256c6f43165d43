/*
 * ref/gemm/dx.c: the input gradient dX of the blocked grouped GEMM.  Without reduce_topk it runs every work
 * item in one parallel region (gemm_run_plain, setup.c); with reduce_topk the slot values of a column chunk
 * are computed into a float32 scratch and each token sums its k slots in order (reduce_tokens).  The
 * driver on the caller's scratch is proved; the allocating shells are not (allocation).
 */
#include "gemm_internal.h"
#include "convert.h"

/* dX with reduce_topk: the width of a column chunk of the slot values, as wide as `budget` bytes of float32
 * scratch allow (options.ref_scratch_bytes: all of K when it fits), a multiple of NB otherwise, at least NB
 * (proved: RTE, termination).  budget / 4 / M is budget / (4 * M) (nested floor divisions) without the
 * overflow of 4 * M. */
/*@ requires dims: 0 <= M && 0 <= K && 0 <= budget;
    terminates \true;
    assigns \nothing;
    ensures width: 0 <= \result && (K > 0 ==> 1 <= \result); */
static int64_t reduce_width(int64_t M, int64_t K, int64_t budget)
{
    int64_t width = K;
    if (M > 0 && width > budget / (int64_t)sizeof(float) / M) {
        width = budget / (int64_t)sizeof(float) / M / NB * NB;
        if (width < NB)
            width = NB;
    }
    return width;
}

/* dX with reduce_topk, after the slot values of columns c0 .. c0 + cw - 1 (a chunk) are in: each token t
 * sums its slots t*k+0 .. t*k+k-1 in order from +0.0f, NB columns at a time in row, and stores them in
 * dx (an orphaned worksharing loop over the tokens: call it from every thread of the region).  Proved:
 * RTE (every slot value read inside slot_values [M * slot_width], every dx element written inside
 * [T * K]: lemma_row_fits), assigns, termination; not the values (tested bit for bit).  The column
 * blocks step cb += n (n = NB but for the last block: the same cb as cb += NB, without its overflow). */
/*@ requires problem: \valid_read(g) && gemm_problem_ok(g->p);
    requires ghosts: nT == g->p->num_tokens && nK == g->p->K && dt == g->p->dtype;
    requires dx: tensor_writable((char *)dx, nT * nK, dt);
    requires chunk: 0 <= c0 && 0 <= cw && c0 + cw <= g->p->K && cw <= g->slot_width;
    requires slots: g->p->rows * g->slot_width <= INT64_MAX &&
                    \valid_read(g->slot_values + (0 .. g->p->rows * g->slot_width - 1));
    requires row: \valid(row + (0 .. NB - 1));
    requires apart: \separated((char *)dx + (0 .. byte_offset(nT * nK, dt) - 1), g, g->p);
    requires row_apart: \separated((char *)dx + (0 .. byte_offset(nT * nK, dt) - 1), row + (0 .. NB - 1));
    terminates \true;
    assigns row[0 .. NB - 1], ((char *)dx)[0 .. byte_offset(nT * nK, dt) - 1]; */
static void reduce_tokens(const gemm_ctx *g, void *dx, int64_t c0, int64_t cw, float *row)
    /*@ ghost (int64_t nT, int64_t nK, moe_dtype dt) */
{
    const moe_gemm_problem *p = g->p;
    const int64_t K = p->K, T = p->num_tokens, k = p->topk, width = g->slot_width;
    /*@ assert dims: gemm_dims_ok(p->num_tokens, p->topk, p->num_experts, p->rows, p->N, p->K); */
    /*@ loop invariant bounds: 0 <= t <= T;
        loop invariant problem: p->num_tokens == T && p->topk == k && p->K == K && p->rows == T * k &&
                                p->dtype == dt && g->slot_values == \at(g->slot_values, Pre);
        loop assigns t, row[0 .. NB - 1], ((char *)dx)[0 .. byte_offset(nT * nK, dt) - 1];
        loop variant T - t; */
    MOE_OMP(omp for schedule(static))
    for (int64_t t = 0; t < T; t++) {
        /*@ ghost lemma_row_fits(t, T, k); */
        /*@ ghost lemma_row_fits(t, T, K); */
        int64_t n;
        /*@ loop invariant bounds: 0 <= cb <= cw;
            loop invariant problem: p->num_tokens == T && p->topk == k && p->K == K && p->rows == T * k &&
                                    p->dtype == dt && g->slot_values == \at(g->slot_values, Pre);
            loop assigns cb, n, row[0 .. NB - 1], ((char *)dx)[0 .. byte_offset(nT * nK, dt) - 1];
            loop variant cw - cb; */
        for (int64_t cb = 0; cb < cw; cb += n) {
            n = cw - cb < NB ? cw - cb : NB;
            /*@ loop invariant bounds: 0 <= c <= n;
                loop assigns c, row[0 .. NB - 1];
                loop variant n - c; */
            for (int64_t c = 0; c < n; c++)
                row[c] = 0.0f;
            /*@ loop invariant bounds: 0 <= j <= k;
                loop assigns j, row[0 .. NB - 1];
                loop variant k - j; */
            for (int64_t j = 0; j < k; j++) {
                /*@ ghost lemma_row_fits(t * k + j, T * k, width); */
                const float *v = g->slot_values + (t * k + j) * width + cb;
                /*@ loop invariant bounds: 0 <= c <= n;
                    loop assigns c, row[0 .. NB - 1];
                    loop variant n - c; */
                for (int64_t c = 0; c < n; c++)
                    row[c] += v[c];
            }
            store_row(p->dtype, dx, t * K + c0 + cb, row, n, p->accumulate);
        }
    }
}

/* g->chunk0 = c0 (dX with reduce_topk: the chunk of the slot values), as a function whose contract keeps
 * ctx_tile_ok: proved in this small context; after the store in reduce_chunks' loop the provers took 2 to
 * over 15 s to carry it (its tensor sizes are products of the problem's fields). */
/*@ requires ctx: \valid(g) && ctx_tile_ok(g);
    requires apart: \separated(g, g->p, g->p->gather_indices + (0 .. g->p->rows - 1));
    terminates \true;
    assigns g->chunk0;
    ensures chunk0: g->chunk0 == c0;
    ensures tile: ctx_tile_ok(g); */
static void set_chunk0(gemm_ctx *g, int64_t c0)
{
    g->chunk0 = c0;
}

/* dX with reduce_topk, one thread's part (proved): per column chunk of W = g->slot_width columns, the slot
 * values of the chunk (gemm_run_items, after chunk0 is set), then per token the in-order sum of its k slots
 * (reduce_tokens).  The chunks step c0 += cw (cw = W but for the last chunk: the same c0 as c0 += W,
 * without its overflow).  M, T, K, W, dt are ghost parameters, the values of g->p->rows, ->num_tokens, ->K,
 * g->slot_width and g->p->dtype: the contract's sizes are products of these values, not of fields read in
 * the caller's later memory (the solvers do not carry such products across writes; see the notes). */
/*@ requires ctx: reduce_ctx_ok(g, dx);
    requires ghosts: M == g->p->rows && T == g->p->num_tokens && K == g->p->K && W == g->slot_width &&
                     dt == g->p->dtype;
    requires setup: reduce_setup_ok(g, st);
    requires apart: \separated((char *)dx + (0 .. byte_offset(T * K, dt) - 1), g, g->p,
      st, st->blocks + (0 .. st->block_count - 1), g->p->gather_indices + (0 .. g->p->rows - 1),
      g->offsets + (0 .. g->p->num_experts));
    requires width: 0 <= W && (K > 0 ==> 1 <= W);
    requires slots: slots_at(g->slot_values, M, W, s->acc);
    requires scratch: scratch_ok(s) && \separated((char *)dx + (0 .. byte_offset(T * K, dt) - 1), s->row + (0 .. NB - 1));
    terminates \true;
    assigns g->chunk0, s->a[0 .. MB * KB - 1], s->b[0 .. NB * KB - 1], s->acc[0 .. MB * NB - 1],
            s->row[0 .. (MB > NB ? MB : NB) - 1], g->slot_values[0 .. M * W - 1],
            ((char *)dx)[0 .. byte_offset(T * K, dt) - 1]; */
static void reduce_chunks(gemm_ctx *g, const gemm_setup *st, void *dx, thread_scratch *s)
    /*@ ghost (int64_t M, int64_t T, int64_t K, int64_t W, moe_dtype dt) */
{
    const int64_t width = g->slot_width;
    /*@ assert dims: gemm_dims_ok(g->p->num_tokens, g->p->topk, g->p->num_experts, g->p->rows, g->p->N, g->p->K); */
    /*@ assert blocks: blocks_ok(g, st->blocks, st->block_count); */
    /*@ assert tile: ctx_tile_ok(g); */
    /*@ assert weights: g->topk_weights != \null ==> ctx_weights_ok(g); */
    /*@ assert dx: tensor_writable((char *)dx, T * K, dt); */
    int64_t cw;
    /*@ loop invariant bounds: 0 <= c0 <= K;
        loop invariant g: g->p == \at(g->p, Pre) && g->kind == OP_DX && g->out == dx &&
                          g->slot_values == \at(g->slot_values, Pre) && g->slot_width == W &&
                          g->kernel == &gemm_kernel_scalar;
        loop invariant problem: g->p->reduce_topk != 0 && g->p->rows == M && g->p->K == K &&
                                g->p->num_tokens == T && g->p->dtype == dt;
        loop invariant tile: ctx_tile_ok(g);
        loop invariant weights: g->topk_weights != \null ==> ctx_weights_ok(g);
        loop invariant offsets: ctx_offsets_ok(g);
        loop invariant blocks: st->blocks == \at(st->blocks, Pre) && st->block_count == \at(st->block_count, Pre) &&
                               blocks_ok(g, st->blocks, st->block_count) && 0 <= st->block_count <= M;
        loop assigns c0, cw, g->chunk0, s->a[0 .. MB * KB - 1], s->b[0 .. NB * KB - 1], s->acc[0 .. MB * NB - 1],
                     s->row[0 .. (MB > NB ? MB : NB) - 1], g->slot_values[0 .. M * W - 1],
                     ((char *)dx)[0 .. byte_offset(T * K, dt) - 1];
        loop variant K - c0; */
    for (int64_t c0 = 0; c0 < g->p->K; c0 += cw) {
        cw = g->p->K - c0 < width ? g->p->K - c0 : width;
        MOE_OMP(omp single)
        set_chunk0(g, c0);
        /* (the single's closing barrier publishes chunk0; gemm_run_items ends with a barrier too) */
        /*@ ghost const int64_t ceil = cw / NB + (cw % NB != 0); */
        /*@ assert ceil: ceil == pack_count(cw, NB) && 0 <= ceil <= cw <= K; */
        /*@ ghost lemma_mul_monotone(ceil, K, M); */
        /*@ ghost lemma_mul_monotone(st->block_count, M, ceil); */
        /*@ assert items: st->block_count * pack_count(cw, NB) <= INT64_MAX; */
        /*@ assert out_slots: slots_at(g->slot_values, g->p->rows, g->slot_width, s->acc); */
        /*@ assert out_chunk: g->kind == OP_DX && g->p->reduce_topk != 0 &&
                              0 <= g->chunk0 <= c0 && c0 + cw <= g->chunk0 + g->slot_width; */
        /*@ ghost lemma_reduce_out(g, st->blocks, st->block_count, s->acc, c0, c0 + cw); */
        gemm_run_items(g, st->blocks, st->block_count, c0, c0 + cw, s);
        reduce_tokens(g, dx, c0, cw, s->row) /*@ ghost (T, K, dt) */;
    }
}

/* dX with reduce_topk on the caller's slot values [M * width] and threads' scratch arena (proved): each
 * thread runs reduce_chunks on its part of the arena.  slot_values NULL: MOE_ERR_OUT_OF_MEMORY with the
 * slot values' message; arena NULL: gemm_out_of_scratch, in that order (the shell allocates the arena only
 * after the slot values).
 * Frama-C ignores the OpenMP pragmas: WP proves the sequential program (the region run once, by thread 0). */
/*@ requires ctx: reduce_ctx_ok(g, dx);
    requires setup: reduce_setup_ok(g, st);
    requires apart: reduce_apart(g, st, dx);
    requires width: 0 <= width && (g->p->K > 0 ==> 1 <= width);
    requires slots: slot_values != \null ==> g->p->rows * width <= INT64_MAX &&
                    \valid(slot_values + (0 .. g->p->rows * width - 1));
    requires threads: 1 <= threads;
    requires arena: arena != \null ==> arena_ok(arena, threads) &&
      \separated(arena + (0 .. threads * SCRATCH_FLOATS - 1), slot_values + (0 .. g->p->rows * width - 1),
                 (char *)dx + (0 .. byte_offset(g->p->num_tokens * g->p->K, g->p->dtype) - 1));
    terminates \true;
    assigns g->slot_values, g->slot_width, g->chunk0, slot_values[0 .. g->p->rows * width - 1],
            arena[0 .. threads * SCRATCH_FLOATS - 1],
            ((char *)dx)[0 .. byte_offset(g->p->num_tokens * g->p->K, g->p->dtype) - 1], moe_error_model;
    ensures status: slot_values != \null && arena != \null ? \result == MOE_OK : \result == MOE_ERR_OUT_OF_MEMORY; */
static moe_status run_reduce_in(gemm_ctx *g, const gemm_setup *st, void *dx, int64_t width, float *slot_values,
                                float *arena, int threads)
{
    const moe_gemm_problem *p = g->p;
    const int64_t M = p->rows;
    /*@ ghost const int64_t T = p->num_tokens; */
    /*@ ghost const int64_t K = p->K; */
    /*@ ghost const moe_dtype dt = p->dtype; */
    g->slot_width = width;
    g->slot_values = slot_values;
    if (slot_values == NULL)
        return moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: no memory for %" PRId64 " x %" PRId64
                        " float32 slot values of reduce_topk", p->op, M, width);
    if (arena == NULL)
        return gemm_out_of_scratch(p);
    /*@ assert field_T: p->num_tokens == \at(g->p->num_tokens, Pre); */
    /*@ assert field_k: p->topk == \at(g->p->topk, Pre); */
    /*@ assert field_E: p->num_experts == \at(g->p->num_experts, Pre); */
    /*@ assert field_M: p->rows == \at(g->p->rows, Pre); */
    /*@ assert field_N: p->N == \at(g->p->N, Pre); */
    /*@ assert field_K: p->K == \at(g->p->K, Pre); */
    /*@ assert fields: p->gather_indices == \at(g->p->gather_indices, Pre) && p->m_sizes == \at(g->p->m_sizes, Pre) &&
          p->reduce_topk == \at(g->p->reduce_topk, Pre) && p->dtype == \at(g->p->dtype, Pre) &&
          p->dw_dtype == \at(g->p->dw_dtype, Pre) && p->permute_x == \at(g->p->permute_x, Pre); */
    /*@ assert gather: p->gather_indices != \null ==>
          \forall integer r; 0 <= r < p->rows ==> p->gather_indices[r] == \at(g->p->gather_indices[r], Pre); */
    /*@ assert kept_problem: gemm_problem_ok(p); */
    /*@ assert kept_dx_rows: gemm_dx_rows(p) == \at(gemm_dx_rows(g->p), Pre); */
    /*@ assert kept_at: gemm_dx_tensors_at((char *)g->a_src, (char *)g->b_src, (char *)g->topk_weights, (char *)dx,
          \at(gemm_dx_rows(g->p), Pre), \at(g->p->rows, Pre), \at(g->p->num_experts, Pre), \at(g->p->N, Pre),
          \at(g->p->K, Pre), \at(g->p->dtype, Pre), p, \at(g->p->gather_indices, Pre), \at(g->p->m_sizes, Pre)); */
    /*@ assert kept: gemm_problem_ok(g->p) &&
          gemm_dx_tensors_ok(g->p, (char *)g->a_src, (char *)g->b_src, (char *)g->topk_weights, (char *)dx); */
    MOE_OMP(omp parallel num_threads(threads))
    {
        thread_scratch s;
        const int t = team_member(threads);
        gemm_team_scratch(&s, arena, t);
        /*@ assert ctx_fields: g->p == p && g->kind == OP_DX && g->out == dx && g->kernel == &gemm_kernel_scalar &&
                               g->slot_values == slot_values && g->slot_width == width &&
                               g->a_src == \at(g->a_src, Pre) && g->b_src == \at(g->b_src, Pre) &&
                               g->topk_weights == \at(g->topk_weights, Pre) && g->offsets == \at(g->offsets, Pre); */
        /*@ assert acc: \separated(slot_values + (0 .. M * width - 1), s.acc + (0 .. MB * NB - 1)); */
        /*@ assert slots: slots_at(slot_values, M, width, s.acc); */
        /*@ assert row: \separated((char *)dx + (0 .. byte_offset(T * K, dt) - 1), s.row + (0 .. NB - 1)); */
        reduce_chunks(g, st, dx, &s) /*@ ghost (M, T, K, width, dt) */;
    }
    return MOE_OK;
}

/* dX with reduce_topk: the allocating shell of run_reduce_in (not proved: WP 25 has no model of
 * allocation): the chunk width (reduce_width), the slot values [M * width] (none when M * width * 4 bytes
 * would pass INT64_MAX: reported as out of memory rather than a size that wraps), the threads'
 * arena (only when the slot values were had), run_reduce_in, free.  Its contract is stated. */
/*@ requires ctx: reduce_ctx_ok(g, dx);
    requires setup: reduce_setup_ok(g, st);
    requires apart: reduce_apart(g, st, dx);
    terminates \true;
    assigns g->slot_values, g->slot_width, g->chunk0,
            ((char *)dx)[0 .. byte_offset(g->p->num_tokens * g->p->K, g->p->dtype) - 1], moe_error_model,
            __fc_heap_status;
    ensures status: \result == MOE_OK || \result == MOE_ERR_OUT_OF_MEMORY; */
static moe_status run_reduce(gemm_ctx *g, const gemm_setup *st, void *dx)
{
    const int64_t M = g->p->rows, width = reduce_width(M, g->p->K, g->p->ref_scratch_bytes);
    float *slot_values = M > 0 && width > INT64_MAX / (int64_t)sizeof(float) / M
                             ? NULL
                             : malloc((size_t)M * (size_t)width * sizeof(float) + 1);
    const int threads = team_size();
    float *arena = slot_values != NULL ? gemm_scratch_arena(threads) : NULL;
    const moe_status status = run_reduce_in(g, st, dx, width, slot_values, arena, threads);
    free(arena);
    free(slot_values);
    return status;
}

/* dX on the caller's scratch (proved; as gemm_fwd_blocked_in): gemm_run_plain without reduce_topk, else
 * run_reduce (the allocating shells of run_plain_in / run_reduce_in). */
/*@ requires problem: gemm_problem_ok(p);
    requires routing: gemm_routing_ok(p);
    requires tensors: gemm_dx_tensors_ok(p, (char *)dy, (char *)w, (char *)topk_weights, (char *)dx);
    requires experts: p->num_experts < INT64_MAX;
    requires problem_apart: \separated(p, p->gather_indices + (0 .. p->rows - 1));
    requires scratch: blocked_scratch_ok(p, OP_DX, offsets, blocks, (char *)dx,
                                         byte_offset(gemm_dx_rows(p) * p->K, p->dtype));
    terminates \true;
    assigns offsets[0 .. p->num_experts], blocks[0 .. gemm_blocks(p, OP_DX, p->num_experts)],
            ((char *)dx)[0 .. byte_offset(gemm_dx_rows(p) * p->K, p->dtype) - 1], moe_error_model,
            __fc_heap_status;
    ensures status: offsets != \null && blocks != \null ? \result == MOE_OK || \result == MOE_ERR_OUT_OF_MEMORY
                                                        : \result == MOE_ERR_OUT_OF_MEMORY; */
static moe_status gemm_dx_blocked_in(const moe_gemm_problem *p, const void *dy, const void *w,
                                     const void *topk_weights, void *dx, int64_t *offsets, a_block *blocks)
{
    gemm_setup st;
    const moe_status status = gemm_setup_in(p, OP_DX, &st, offsets, blocks);
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
    /*@ assert kept_dx_rows: gemm_dx_rows(p) == \at(gemm_dx_rows(p), Pre) && p->dtype == \at(p->dtype, Pre); */
    /*@ assert kept_at: gemm_dx_tensors_at((char *)dy, (char *)w, (char *)topk_weights, (char *)dx,
          \at(gemm_dx_rows(p), Pre), \at(p->rows, Pre), \at(p->num_experts, Pre), \at(p->N, Pre), \at(p->K, Pre),
          \at(p->dtype, Pre), p, \at(p->gather_indices, Pre), \at(p->m_sizes, Pre)); */
    /*@ assert kept: gemm_problem_ok(p) &&
                     gemm_dx_tensors_ok(p, (char *)dy, (char *)w, (char *)topk_weights, (char *)dx); */
    gemm_ctx g = {p, OP_DX, dy, w, topk_weights, NULL, dx, st.offsets, gemm_pick_kernel(), NULL, 0, 0};
    /*@ assert g: g.p == p && g.kind == OP_DX && g.a_src == dy && g.b_src == w && g.topk_weights == topk_weights &&
                  g.out == dx && g.offsets == offsets && g.kernel == &gemm_kernel_scalar && g.slot_values == \null &&
                  g.slot_width == 0; */
    /*@ assert kept_g: gemm_problem_ok(g.p) &&
          gemm_dx_tensors_ok(g.p, (char *)g.a_src, (char *)g.b_src, (char *)g.topk_weights, (char *)g.out); */
    if (!p->reduce_topk) {
            /*@ assert apart: \separated((char *)dx + (0 .. byte_offset(p->rows * p->K, p->dtype) - 1), &g, p, &st,
              blocks + (0 .. st.block_count - 1), p->gather_indices + (0 .. p->rows - 1),
              offsets + (0 .. p->num_experts)); */
        /*@ assert out_kind: g.kind == OP_DX && g.p->reduce_topk == 0 && g.p->rows == p->rows && g.p->K == p->K &&
                             g.p->dtype == p->dtype; */
        /*@ assert out_count: out_count_at(g.kind, g.p->reduce_topk, g.p->rows, g.p->num_experts, g.p->N, g.p->K) ==
                              p->rows * p->K; */
        /*@ assert out_dtype: ctx_out_dtype(&g) == p->dtype; */
        /*@ assert out_bytes: ctx_out_bytes(&g) == byte_offset(p->rows * p->K, p->dtype); */
        return gemm_run_plain(&g, &st, p->K);
    }
    /*@ assert reduce_apart: \separated((char *)dx + (0 .. byte_offset(p->num_tokens * p->K, p->dtype) - 1), &g, p,
          &st, blocks + (0 .. st.block_count - 1), p->gather_indices + (0 .. p->rows - 1),
          offsets + (0 .. p->num_experts)); */
    return run_reduce(&g, &st, dx);
}

/* The allocating shell (not proved): gemm_setup_alloc, gemm_dx_blocked_in, gemm_setup_free. */
moe_status moe_ref_gemm_dx_blocked(const moe_gemm_problem *p, const void *dy, const void *w,
                                   const void *topk_weights, void *dx)
{
    int64_t *offsets;
    a_block *blocks;
    gemm_setup_alloc(p, OP_DX, &offsets, &blocks);
    const moe_status status = gemm_dx_blocked_in(p, dy, w, topk_weights, dx, offsets, blocks);
    gemm_setup_free(offsets, blocks);
    return status;
}
