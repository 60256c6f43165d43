/*
 * ref/gemm/setup.c: what the ops of the blocked grouped GEMM share around their work items: the threads'
 * scratch arena and each thread's part of it, the expert offsets and the A blocks (the work items' rows),
 * and the parallel region of the ops without the reduce_topk scratch (fwd, dW, dX without reduce_topk).
 */
#include "gemm_internal.h"

/* team_size, team_member: ref/ref_threads.h. */

/* (contract on the prototype in gemm_internal.h) */
float *gemm_scratch_arena(int threads)
{
    if ((size_t)threads > SIZE_MAX / sizeof(float) / SCRATCH_FLOATS)
        return NULL;
    return malloc((size_t)threads * SCRATCH_FLOATS * sizeof(float));
}

/* (contract on the prototype in gemm_internal.h) */
void gemm_team_scratch(thread_scratch *s, float *arena, int t)
{
    float *part = arena + (int64_t)t * SCRATCH_FLOATS;
    s->a = part;
    s->b = part + SCRATCH_B;
    s->acc = part + SCRATCH_ACC;
    s->row = part + SCRATCH_ROW;
}

/* The number of A blocks of the op (gemm_setup_in writes that many): ceil(m_e / MB) per expert for the
 * expert-order rows (fwd, dX, topk), ceil(N / MB) per expert for dW.  ceil(m / MB) is m / MB + (m % MB != 0):
 * the same value as (m + MB - 1) / MB without its overflow for m > INT64_MAX - MB + 1. */
/*@ requires problem: gemm_problem_ok(p);
    requires routing: gemm_routing_ok(p);
    terminates \true;
    assigns \nothing;
    ensures count: \result == gemm_blocks(p, kind, p->num_experts);
    ensures bound: blocks_bound(\result, kind, p->num_experts, p->N, p->rows); */
static int64_t count_blocks(const moe_gemm_problem *p, enum op_kind kind)
{
    const int64_t E = p->num_experts;
    int64_t count = 0, e;
    /*@ ghost lemma_msum_monotone_all((int64_t *)p->m_sizes, 0, E); */
    /*@ loop invariant bounds: 0 <= e <= E;
        loop invariant count: count == gemm_blocks(p, kind, e);
        loop invariant nonneg: 0 <= count;
        loop invariant bound_dw: kind == OP_DW ==> count <= e * p->N;
        loop invariant bound_rows: kind != OP_DW ==> count <= msum(p->m_sizes, e);
        loop assigns e, count;
        loop variant E - e; */
    for (e = 0; e < E; e++) {
        const int64_t m = kind == OP_DW ? p->N : p->m_sizes[e];
        /*@ ghost lemma_mul_monotone(e + 1, E, p->N); */
        /*@ assert ceil: 0 <= m / MB + (m % MB != 0 ? 1 : 0) <= m; */
        /*@ assert dw_step: (e + 1) * p->N == e * p->N + p->N; */
        /*@ assert rows_step: msum(p->m_sizes, e + 1) == msum(p->m_sizes, e) + p->m_sizes[e] &&
                              msum(p->m_sizes, e + 1) <= p->rows; */
        /*@ assert room: count + m <= (kind == OP_DW ? E * p->N : p->rows); */
        count += m / MB + (m % MB != 0);
    }
    /*@ assert end: e == E && count == gemm_blocks(p, kind, E); */
    return count;
}

/* (contract on the prototype in gemm_internal.h) */
moe_status gemm_setup_in(const moe_gemm_problem *p, enum op_kind kind, gemm_setup *st, int64_t *offsets,
                         a_block *blocks)
{
    const int64_t E = p->num_experts;
    const int64_t count = count_blocks(p, kind);
    /*@ ghost lemma_blocks_monotone(p, kind); */
    /*@ ghost lemma_msum_monotone_all((int64_t *)p->m_sizes, 0, E); */
    if (offsets == NULL) {
        st->offsets = NULL;
        st->blocks = NULL;
        st->block_count = 0;
        return moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: no memory for %" PRId64 " expert offsets", p->op, E + 1);
    }
    /* (before the writes to *st: moe_ref_expert_offsets' postcondition reads msum in the pre-state) */
    moe_ref_expert_offsets(E, p->m_sizes, offsets);
    st->offsets = offsets;
    st->blocks = NULL;
    st->block_count = 0;
    if (blocks == NULL)
        return moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: no memory for %" PRId64 " work blocks", p->op, count);
    st->blocks = blocks;
    int64_t e, mi;
    /*@ loop invariant bounds: 0 <= e <= E;
        loop invariant st: st->offsets == offsets && st->blocks == blocks;
        loop invariant problem: p->num_experts == E && p->N == \at(p->N, Pre) && p->rows == \at(p->rows, Pre);
        loop invariant count: \let ee = e; st->block_count == \at(gemm_blocks(p, kind, ee), Pre);
        loop invariant written: \forall integer b; 0 <= b < st->block_count ==>
          0 <= blocks[b].e < E && 0 <= blocks[b].i0 && 0 <= blocks[b].mi <= MB &&
          blocks[b].i0 + blocks[b].mi <= (kind == OP_DW ? p->N : p->rows);
        loop invariant offsets: \forall integer i; 0 <= i <= E ==> offsets[i] == \at(msum(p->m_sizes, i), Pre);
        loop assigns e, mi, st->block_count, blocks[0 .. count];
        loop variant E - e; */
    for (e = 0; e < E; e++) {
        const int64_t lo = kind == OP_DW ? 0 : offsets[e];
        const int64_t hi = kind == OP_DW ? p->N : offsets[e + 1];
        /*@ assert rows: \let ee = e; hi - lo == \at(kind == OP_DW ? p->N : p->m_sizes[ee], Pre) &&
                         0 <= lo <= hi <= (kind == OP_DW ? p->N : p->rows); */
        /*@ assert next: \let ee = e; \at(gemm_blocks(p, kind, ee + 1), Pre) ==
                         \at(gemm_blocks(p, kind, ee), Pre) + ceil_blocks(hi - lo) &&
                         \at(gemm_blocks(p, kind, ee + 1), Pre) <= count; */
        /*@ ghost int64_t j = 0; */
        /*@ loop invariant bounds: lo <= i0 <= hi && 0 <= j;
            loop invariant st: st->offsets == offsets && st->blocks == blocks;
            loop invariant problem: p->num_experts == E && p->N == \at(p->N, Pre) && p->rows == \at(p->rows, Pre);
            loop invariant step: i0 < hi ==> i0 == lo + MB * j;
            loop invariant done: i0 == hi ==> j == ceil_blocks(hi - lo);
            loop invariant below: j <= ceil_blocks(hi - lo);
            loop invariant count: \let ee = e; st->block_count == \at(gemm_blocks(p, kind, ee), Pre) + j;
            loop invariant written: \forall integer b; 0 <= b < st->block_count ==>
              0 <= blocks[b].e < E && 0 <= blocks[b].i0 && 0 <= blocks[b].mi <= MB &&
              blocks[b].i0 + blocks[b].mi <= (kind == OP_DW ? p->N : p->rows);
            loop invariant offsets: \forall integer i; 0 <= i <= E ==> offsets[i] == \at(msum(p->m_sizes, i), Pre);
            loop assigns i0, mi, j, st->block_count, blocks[0 .. count];
            loop variant hi - i0; */
        for (int64_t i0 = lo; i0 < hi; i0 += mi) {
            /*@ ghost lemma_ceil_blocks(j, hi - lo); */
            mi = hi - i0 < MB ? hi - i0 : MB;
            a_block *ab = &st->blocks[st->block_count++];
            ab->e = e;
            ab->i0 = i0;
            ab->mi = mi;
            /*@ ghost j++; */
        }
    }
    /*@ assert end: e == E; */
    /*@ assert done: st->block_count == count && p->num_experts == E && p->N == \at(p->N, Pre) &&
                     p->rows == \at(p->rows, Pre); */
    /*@ assert blocks_final: blocks_at(p, kind, blocks, st->block_count); */
    /*@ assert bound_final: blocks_bound(st->block_count, kind, p->num_experts, p->N, p->rows); */
    return MOE_OK;
}

void gemm_setup_alloc(const moe_gemm_problem *p, enum op_kind kind, int64_t **offsets, a_block **blocks)
{
    *offsets = malloc(((size_t)p->num_experts + 1) * sizeof **offsets);
    *blocks = malloc(((size_t)count_blocks(p, kind) + 1) * sizeof **blocks);
}

void gemm_setup_free(int64_t *offsets, a_block *blocks)
{
    free(offsets);
    free(blocks);
}

/* (contract on the prototype in gemm_internal.h) */
moe_status gemm_out_of_scratch(const moe_gemm_problem *p)
{
    return moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: no memory for the per-thread tile buffers (%zu bytes each)",
                    p->op, (size_t)SCRATCH_FLOATS * sizeof(float));
}

/* One thread's part of gemm_run_plain (proved): every item of the op, on the thread's scratch s.  It states the
 * op's requirements in the form its callers can carry (plain_ok) and proves that they give gemm_run_items'. */
/*@ requires problem: plain_problem_ok(g);
    requires tensors: plain_tensors_ok(g);
    requires kernel: plain_kernel_ok(g);
    requires setup: plain_setup_ok(g, st);
    requires apart: plain_apart(g, st);
    requires cols: columns == (g->kind == OP_FWD ? g->p->N : g->p->K);
    requires scratch: scratch_ok(s) &&
      \separated(s->acc + (0 .. MB * NB - 1), (char *)g->out + (0 .. ctx_out_bytes(g) - 1), g, g->p,
                 st->blocks + (0 .. st->block_count - 1), g->p->gather_indices + (0 .. g->p->rows - 1),
                 g->offsets + (0 .. g->p->num_experts));
    terminates \true;
    assigns s->a[0 .. MB * KB - 1], s->b[0 .. NB * KB - 1], s->acc[0 .. MB * NB - 1],
            s->row[0 .. (MB > NB ? MB : NB) - 1], ((char *)g->out)[0 .. ctx_out_bytes(g) - 1]; */
static void plain_items(const gemm_ctx *g, const gemm_setup *st, int64_t columns, thread_scratch *s)
{
    /*@ ghost const moe_gemm_problem *p = g->p; */
    /*@ assert dims: gemm_dims_ok(p->num_tokens, p->topk, p->num_experts, p->rows, p->N, p->K); */
    /*@ ghost
      const int64_t ceil = columns / NB + (columns % NB != 0);
      const int64_t most = g->kind == OP_DW ? p->num_experts * p->N : p->rows;
    */
    /*@ assert ceil: ceil == pack_count(columns, NB) && 0 <= ceil <= columns; */
    /*@ assert most: 0 <= st->block_count <= most; */
    /*@ assert room_fwd: g->kind == OP_FWD ==> columns * most == p->rows * p->N; */
    /*@ assert room_dx: g->kind == OP_DX ==> columns * most == p->rows * p->K; */
    /*@ assert room_dw: g->kind == OP_DW ==> columns * most == p->num_experts * p->N * p->K; */
    /*@ assert room: columns * most <= INT64_MAX; */
    /*@ ghost lemma_mul_monotone(ceil, columns, most); */
    /*@ ghost lemma_mul_monotone(st->block_count, most, ceil); */
    /*@ assert items: st->block_count * pack_count(columns, NB) <= INT64_MAX; */
    /*@ assert blocks: blocks_ok(g, st->blocks, st->block_count); */
    /*@ assert out_count: ctx_out_count(g) == (g->kind == OP_FWD ? g->p->rows * g->p->N :
                                               g->kind == OP_DW ? g->p->num_experts * g->p->N * g->p->K :
                                               g->p->rows * g->p->K); */
    /*@ assert out_fwd: g->kind == OP_FWD ==>
          tensor_writable((char *)g->out, p->rows * p->N, p->dtype) &&
          \separated((char *)g->out + (0 .. byte_offset(p->rows * p->N, p->dtype) - 1), p,
                     p->gather_indices + (0 .. p->rows - 1)); */
    /*@ assert out_dx: g->kind == OP_DX ==>
          tensor_writable((char *)g->out, p->rows * p->K, p->dtype) &&
          \separated((char *)g->out + (0 .. byte_offset(p->rows * p->K, p->dtype) - 1), p,
                     p->gather_indices + (0 .. p->rows - 1)); */
    /*@ assert out_dw: g->kind == OP_DW ==>
          tensor_writable((char *)g->out, p->num_experts * p->N * p->K, p->dw_dtype) &&
          \separated((char *)g->out + (0 .. byte_offset(p->num_experts * p->N * p->K, p->dw_dtype) - 1), p,
                     p->gather_indices + (0 .. p->rows - 1)); */
    /*@ assert out: tensor_writable((char *)g->out, ctx_out_count(g), ctx_out_dtype(g)) &&
                    \separated((char *)g->out + (0 .. ctx_out_bytes(g) - 1), g->p,
                               g->p->gather_indices + (0 .. g->p->rows - 1)); */
    gemm_run_items(g, st->blocks, st->block_count, 0, columns, s);
}

/* Runs every item of one op with a parallel region on the threads' scratch arena (proved): NULL (the
 * shell could not allocate it): MOE_ERR_OUT_OF_MEMORY before any output is written, as before; else each
 * thread runs plain_items on its part.  Frama-C ignores the OpenMP pragmas (no _OPENMP): WP proves the
 * sequential program, where the region is run once, by thread 0. */
/*@ requires problem: plain_problem_ok(g);
    requires tensors: plain_tensors_ok(g);
    requires kernel: plain_kernel_ok(g);
    requires setup: plain_setup_ok(g, st);
    requires apart: plain_apart(g, st);
    requires cols: columns == (g->kind == OP_FWD ? g->p->N : g->p->K);
    requires threads: 1 <= threads;
    requires arena: arena != \null ==> arena_ok(arena, threads) &&
      \separated(arena + (0 .. threads * SCRATCH_FLOATS - 1), (char *)g->out + (0 .. ctx_out_bytes(g) - 1), g, g->p,
                 st->blocks + (0 .. st->block_count - 1), g->p->gather_indices + (0 .. g->p->rows - 1),
                 g->offsets + (0 .. g->p->num_experts));
    terminates \true;
    assigns arena[0 .. threads * SCRATCH_FLOATS - 1], ((char *)g->out)[0 .. ctx_out_bytes(g) - 1], moe_error_model;
    ensures status: arena != \null ? \result == MOE_OK : \result == MOE_ERR_OUT_OF_MEMORY; */
static moe_status run_plain_in(const gemm_ctx *g, const gemm_setup *st, int64_t columns, float *arena,
                               int threads)
{
    if (arena == NULL)
        return gemm_out_of_scratch(g->p);
    MOE_OMP(omp parallel num_threads(threads))
    {
        thread_scratch s;
        const int t = team_member(threads);
        gemm_team_scratch(&s, arena, t);
        /*@ assert acc: s.acc == arena + (t * SCRATCH_FLOATS + SCRATCH_ACC) &&
                        t * SCRATCH_FLOATS + SCRATCH_ACC + MB * NB <= threads * SCRATCH_FLOATS; */
        plain_items(g, st, columns, &s);
    }
    return MOE_OK;
}

/* (contract on the prototype in gemm_internal.h) */
moe_status gemm_run_plain(const gemm_ctx *g, const gemm_setup *st, int64_t columns)
{
    const int threads = team_size();
    float *arena = gemm_scratch_arena(threads);
    const moe_status status = run_plain_in(g, st, columns, arena, threads);
    free(arena);
    return status;
}
