/*
 * ref/gemm/topk.c: the topk-weight gradient of the blocked grouped GEMM: per expert-order row block, the
 * forward's tiles (gemm_compute_tile) chunk by chunk and, per row, the sum of dy times them.  The driver
 * on the caller's scratch is proved; the allocating shells are not (allocation).
 */
#include "gemm_internal.h"
#include "convert.h"

/* The topk-weight gradient of an expert-order row block: for each row, acc += dy[yrow(r)][n] * y_n in
 * ascending n, where the y_n of an NB-column chunk are the fwd tile's accumulators (the same sum,
 * from +0.0f over ascending c, as gemm_naive.c's y_value).  The chunks run in ascending order inside
 * one item, so each row's acc is one sequential sum. */
/* Frama-C/WP proves the indices and the writes (RTE, d_topk_weights' bytes only), not the values.  The
 * column chunks step j0 += nj (nj = NB but for the last chunk: the same j0 as j0 += NB, without its
 * overflow past N). */
/*@ requires tile: ctx_tile_ok(g);
    requires topk: ctx_topk_ok(g, ab);
    requires block: block_ok(g, ab);
    requires scratch: scratch_ok(s);
    terminates \true;
    assigns s->a[0 .. MB * KB - 1], s->b[0 .. NB * KB - 1], s->acc[0 .. MB * NB - 1],
            s->row[0 .. (MB > NB ? MB : NB) - 1],
            ((char *)g->out)[0 .. byte_offset(g->p->rows, g->p->dw_dtype) - 1]; */
static void run_topk_item(const gemm_ctx *g, const a_block *ab, thread_scratch *s)
{
    const moe_gemm_problem *p = g->p;
    float acc[MB];
    /*@ loop invariant bounds: 0 <= i <= ab->mi;
        loop assigns i, acc[0 .. MB - 1];
        loop variant ab->mi - i; */
    for (int64_t i = 0; i < ab->mi; i++)
        acc[i] = 0.0f;
    int64_t nj;
    /*@ loop invariant bounds: 0 <= j0 <= p->N;
        loop assigns j0, nj, acc[0 .. MB - 1], s->a[0 .. MB * KB - 1], s->b[0 .. NB * KB - 1],
                     s->acc[0 .. MB * NB - 1], s->row[0 .. (MB > NB ? MB : NB) - 1];
        loop variant p->N - j0; */
    for (int64_t j0 = 0; j0 < p->N; j0 += nj) {
        nj = p->N - j0 < NB ? p->N - j0 : NB;
        gemm_compute_tile(g, ab, j0, nj, p->K, s);
        /*@ loop invariant bounds: 0 <= i <= ab->mi;
            loop assigns i, acc[0 .. MB - 1], s->row[0 .. (MB > NB ? MB : NB) - 1];
            loop variant ab->mi - i; */
        for (int64_t i = 0; i < ab->mi; i++) {
            const int64_t r = ab->i0 + i;
            const float *y = s->acc + i * NB;
            const int64_t yr = y_row(p, r);
            /*@ ghost lemma_row_fits(yr, p->rows, p->N); */
            load_span(p->dtype, g->dy, yr * p->N + j0, nj, s->row, 1);
            float sum = acc[i];
            /*@ loop invariant bounds: 0 <= j <= nj;
                loop assigns j, sum;
                loop variant nj - j; */
            for (int64_t j = 0; j < nj; j++)
                sum += s->row[j] * y[j];
            acc[i] = sum;
        }
    }
    /*@ loop invariant bounds: 0 <= i <= ab->mi;
        loop invariant problem: ctx_problem_ok(g) && ctx_topk_ok(g, ab);
        loop invariant block: ab->i0 == \at(ab->i0, Pre) && ab->mi == \at(ab->mi, Pre) && block_ok(g, ab);
        loop assigns i, ((char *)g->out)[0 .. byte_offset(g->p->rows, g->p->dw_dtype) - 1];
        loop variant ab->mi - i; */
    for (int64_t i = 0; i < ab->mi; i++)
        store_row(p->dw_dtype, g->out, slot_of_row(p, ab->i0 + i), &acc[i], 1, p->accumulate);
}

/* The blocked twin of moe_ref_gemm_topk_weights_grad (gemm_naive.c).  Its prototype belongs next to
 * the other blocked twins in moe_ref.h; until it is there it is declared here and in ref_backend.c. */
moe_status moe_ref_gemm_topk_weights_grad_blocked(const moe_gemm_problem *p, const void *x, const void *w,
                                                  const void *dy, void *d_topk_weights);

/* One thread's part of the topk-weight gradient (proved): an orphaned worksharing loop over the row blocks
 * (Frama-C ignores the pragma: WP proves the sequential loop).  RTE, assigns, the requires of
 * run_topk_item for every block. */
/*@ requires ctx: topk_ctx_ok(g);
    requires setup: \valid_read(st) && blocks_at(g->p, OP_TOPK, st->blocks, st->block_count);
    requires apart: topk_apart(g, st);
    requires scratch: scratch_ok(s);
    terminates \true;
    assigns s->a[0 .. MB * KB - 1], s->b[0 .. NB * KB - 1], s->acc[0 .. MB * NB - 1],
            s->row[0 .. (MB > NB ? MB : NB) - 1],
            ((char *)g->out)[0 .. byte_offset(g->p->rows, g->p->dw_dtype) - 1]; */
static void topk_items(const gemm_ctx *g, const gemm_setup *st, thread_scratch *s)
{
    /*@ assert tile: ctx_tile_ok(g); */
    /*@ assert topk: tensor_readable((char *)g->dy, g->p->rows * g->p->N, g->p->dtype) &&
                     tensor_writable((char *)g->out, g->p->rows, g->p->dw_dtype); */
    /*@ loop invariant bounds: 0 <= b <= st->block_count;
        loop invariant st: st->block_count == \at(st->block_count, Pre) && st->blocks == \at(st->blocks, Pre);
        loop invariant tile: ctx_tile_ok(g) && g->kind == OP_TOPK;
        loop invariant topk: tensor_readable((char *)g->dy, g->p->rows * g->p->N, g->p->dtype) &&
                             tensor_writable((char *)g->out, g->p->rows, g->p->dw_dtype);
        loop invariant setup: blocks_at(g->p, OP_TOPK, st->blocks, st->block_count);
        loop invariant apart: topk_apart(g, st);
        loop assigns b, s->a[0 .. MB * KB - 1], s->b[0 .. NB * KB - 1], s->acc[0 .. MB * NB - 1],
                     s->row[0 .. (MB > NB ? MB : NB) - 1],
                     ((char *)g->out)[0 .. byte_offset(g->p->rows, g->p->dw_dtype) - 1];
        loop variant st->block_count - b; */
    MOE_OMP(omp for schedule(dynamic, 1))
    for (int64_t b = 0; b < st->block_count; b++)
        run_topk_item(g, &st->blocks[b], s);
}

/* The parallel region of the topk-weight gradient on the threads' scratch arena (proved; as run_plain_in):
 * NULL: MOE_ERR_OUT_OF_MEMORY; else each thread runs topk_items on its part. */
/*@ requires ctx: topk_ctx_ok(g);
    requires setup: \valid_read(st) && blocks_at(g->p, OP_TOPK, st->blocks, st->block_count);
    requires apart: topk_apart(g, st);
    requires threads: 1 <= threads;
    requires arena: arena != \null ==> arena_ok(arena, threads);
    terminates \true;
    assigns arena[0 .. threads * SCRATCH_FLOATS - 1],
            ((char *)g->out)[0 .. byte_offset(g->p->rows, g->p->dw_dtype) - 1], moe_error_model;
    ensures status: arena != \null ? \result == MOE_OK : \result == MOE_ERR_OUT_OF_MEMORY; */
static moe_status run_topk_in(const gemm_ctx *g, const gemm_setup *st, float *arena, int threads)
{
    if (arena == NULL)
        return gemm_out_of_scratch(g->p);
    MOE_OMP(omp parallel num_threads(threads))
    {
        thread_scratch s;
        gemm_team_scratch(&s, arena, team_member(threads));
        /*@ assert ctx_problem: gemm_problem_ok(g->p); */
        /*@ assert ctx_fields: g->p == \at(g->p, Pre) && g->a_src == \at(g->a_src, Pre) && g->b_src == \at(g->b_src, Pre) &&
                               g->dy == \at(g->dy, Pre) && g->out == \at(g->out, Pre) &&
                               g->p->gather_indices == \at(g->p->gather_indices, Pre) &&
                               g->p->m_sizes == \at(g->p->m_sizes, Pre); */
        /*@ assert kept_at: gemm_topk_grad_tensors_at((char *)g->a_src, (char *)g->b_src, (char *)g->dy, (char *)g->out,
              \at(gemm_x_rows(g->p), Pre), \at(g->p->rows, Pre), \at(g->p->num_experts, Pre), \at(g->p->N, Pre),
              \at(g->p->K, Pre), \at(g->p->dtype, Pre), \at(g->p->dw_dtype, Pre), g->p, \at(g->p->gather_indices, Pre),
              \at(g->p->m_sizes, Pre)); */
        /*@ assert ctx_tensors: gemm_topk_grad_tensors_ok(g->p, (char *)g->a_src, (char *)g->b_src, (char *)g->dy,
                                                        (char *)g->out); */
        topk_items(g, st, &s);
    }
    return MOE_OK;
}

/* The allocating shell of run_topk_in (not proved, as gemm_run_plain); its contract is stated. */
/*@ requires ctx: topk_ctx_ok(g);
    requires setup: \valid_read(st) && blocks_at(g->p, OP_TOPK, st->blocks, st->block_count);
    requires apart: topk_apart(g, st);
    terminates \true;
    assigns ((char *)g->out)[0 .. byte_offset(g->p->rows, g->p->dw_dtype) - 1], moe_error_model, __fc_heap_status;
    ensures status: \result == MOE_OK || \result == MOE_ERR_OUT_OF_MEMORY; */
static moe_status run_topk(const gemm_ctx *g, const gemm_setup *st)
{
    const int threads = team_size();
    float *arena = gemm_scratch_arena(threads);
    const moe_status status = run_topk_in(g, st, arena, threads);
    free(arena);
    return status;
}

/* The topk-weight gradient on the caller's scratch (proved; as gemm_fwd_blocked_in). */
/*@ requires problem: gemm_problem_ok(p);
    requires routing: gemm_routing_ok(p);
    requires tensors: gemm_topk_grad_tensors_ok(p, (char *)x, (char *)w, (char *)dy, (char *)d_topk_weights);
    requires experts: p->num_experts < INT64_MAX;
    requires problem_apart: \separated(p, p->gather_indices + (0 .. p->rows - 1));
    requires scratch: blocked_scratch_ok(p, OP_TOPK, offsets, blocks, (char *)d_topk_weights,
                                         byte_offset(p->rows, p->dw_dtype));
    terminates \true;
    assigns offsets[0 .. p->num_experts], blocks[0 .. gemm_blocks(p, OP_TOPK, p->num_experts)],
            ((char *)d_topk_weights)[0 .. byte_offset(p->rows, p->dw_dtype) - 1], moe_error_model,
            __fc_heap_status;
    ensures status: offsets != \null && blocks != \null ? \result == MOE_OK || \result == MOE_ERR_OUT_OF_MEMORY
                                                        : \result == MOE_ERR_OUT_OF_MEMORY; */
static moe_status gemm_topk_blocked_in(const moe_gemm_problem *p, const void *x, const void *w, const void *dy,
                                       void *d_topk_weights, int64_t *offsets, a_block *blocks)
{
    gemm_setup st;
    const moe_status status = gemm_setup_in(p, OP_TOPK, &st, offsets, blocks);
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
    /*@ assert kept_x_rows: gemm_x_rows(p) == \at(gemm_x_rows(p), Pre) && p->dtype == \at(p->dtype, Pre) &&
                            p->dw_dtype == \at(p->dw_dtype, Pre); */
    /*@ assert kept_at: gemm_topk_grad_tensors_at((char *)x, (char *)w, (char *)dy, (char *)d_topk_weights,
          \at(gemm_x_rows(p), Pre), \at(p->rows, Pre), \at(p->num_experts, Pre), \at(p->N, Pre), \at(p->K, Pre),
          \at(p->dtype, Pre), \at(p->dw_dtype, Pre), p, \at(p->gather_indices, Pre), \at(p->m_sizes, Pre)); */
    /*@ assert kept: gemm_problem_ok(p) &&
          gemm_topk_grad_tensors_ok(p, (char *)x, (char *)w, (char *)dy, (char *)d_topk_weights); */
    gemm_ctx g = {p, OP_TOPK, x, w, NULL, dy, d_topk_weights, st.offsets, gemm_pick_kernel(), NULL, 0, 0};
    /*@ assert g: g.p == p && g.kind == OP_TOPK && g.a_src == x && g.b_src == w && g.dy == dy &&
                  g.out == d_topk_weights && g.kernel == &gemm_kernel_scalar; */
    /*@ assert kept_g: gemm_problem_ok(g.p) &&
          gemm_topk_grad_tensors_ok(g.p, (char *)g.a_src, (char *)g.b_src, (char *)g.dy, (char *)g.out); */
    /*@ assert ctx: topk_ctx_ok(&g); */
    /*@ assert apart: \separated((char *)d_topk_weights + (0 .. byte_offset(p->rows, p->dw_dtype) - 1), &g, p, &st,
          blocks + (0 .. st.block_count - 1), p->gather_indices + (0 .. p->rows - 1)); */
    return run_topk(&g, &st);
}

/* The allocating shell (not proved): gemm_setup_alloc, gemm_topk_blocked_in, gemm_setup_free. */
moe_status moe_ref_gemm_topk_weights_grad_blocked(const moe_gemm_problem *p, const void *x, const void *w,
                                                  const void *dy, void *d_topk_weights)
{
    int64_t *offsets;
    a_block *blocks;
    gemm_setup_alloc(p, OP_TOPK, &offsets, &blocks);
    const moe_status status = gemm_topk_blocked_in(p, x, w, dy, d_topk_weights, offsets, blocks);
    gemm_setup_free(offsets, blocks);
    return status;
}
