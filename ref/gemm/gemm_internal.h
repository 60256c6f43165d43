/*
 * ref/gemm/gemm_internal.h: what the files of the blocked grouped GEMM share (its tiling, the work-item
 * types, the row maps and the contracts of the functions one file calls in another).
 *
 * The grouped GEMM, blocked twin: the same contract as ref/gemm_naive.c and, for every output element,
 * the same float32 operations in the same order (moe_ref.h), so the two agree bit for bit.  It is faster
 * because of three things, none of which changes an element's arithmetic:
 *
 *   1. Inputs are converted to float32 once per packed tile, not once per multiply (bf16/f16 loads and
 *      stores are inlined bit operations giving exactly the bits of src/dtype.c).
 *   2. Cache blocking.  Every op is one tiled product  C[i][j] = sum_p A[p][i] * B[p][j]  over a
 *      reduction index p that runs in ascending order:
 *
 *        op    A side (rows i, <= MB per tile)           B side (cols j, <= NB)     reduction p
 *        fwd   x[xrow(r)][c]        i = expert row r     W[e][n][c]   j = n         c = 0 .. K-1
 *        dX    dy[yrow(r)][n]       i = expert row r     W[e][n][c]   j = c         n = 0 .. N-1
 *        dW    wt(r)*dy[yrow(r)][n] i = n                x[xrow(r)][c] j = c        r in expert e, ascending
 *        dtopk as fwd (C = the y_n), then per row acc += dy[yrow(r)][n] * y_n over the NB-column chunks
 *              in ascending n, all chunks of a row in one work item
 *
 *      A work item is one output tile: an A block (rows of one expert) x a B block.  The reduction is
 *      cut into blocks of KB; for each block the item packs A into MR-row groups laid out [p][MR] and B
 *      into NR-column panels laid out [p][NR] (fwd transposes W here, with SSE2 4x4 transposes where
 *      available), then the micro-kernel adds that block's products into the item's float32
 *      accumulator tile.  The tile stays in memory between reduction blocks, so each element's sum
 *      simply continues where it stopped: one acc per element, starting at +0.0f, one `acc += a * b`
 *      per p in ascending p, nothing reassociated.
 *   3. The micro-kernel vectorises ACROSS OUTPUT ELEMENTS: each SIMD lane is a different output column
 *      j, so a vector `acc += a_i * b[j..j+NR)` is NR independent scalar `acc += a * b` steps.  GCC/clang
 *      vector extensions make this explicit (16-byte vectors: SSE2 on x86-64, NEON on aarch64; a scalar
 *      loop elsewhere); on x86 a 32-byte AVX2 copy of the same kernel is picked at run time when the CPU
 *      has AVX2 (__builtin_cpu_supports; the library itself is built for the baseline ISA).  No FMA is
 *      ever used: GCC's -std=c11 implies -ffp-contract=off, clang gets `#pragma STDC FP_CONTRACT OFF`,
 *      and the AVX2 target does not include FMA; every product is rounded before its add, as in the
 *      naive twin.  The element-wise loops (conversions, stores) are written as fixed 8-wide chunks so
 *      that -O2 vectorises them too.
 *
 * After the last reduction block, the per-element tail of moe_ref.h follows: v = acc; v = wt * v (fwd,
 * dX with topk weights); v = old + v (accumulate); one rounding to the output dtype.  dX with
 * reduce_topk writes each slot's v (after its weight) into a float32 scratch indexed by slot, a column
 * chunk at a time (at most options.ref_scratch_bytes), and then each token t sums its slots t*k+0 ..
 * t*k+k-1 in order from +0.0f.
 *
 * Padding: A groups and B panels are zero-padded to MR rows / NR columns; the padded lanes compute
 * throw-away values that are never stored.
 *
 * Parallelism: OpenMP threads take whole work items (output tiles; dX reduce_topk: whole token rows;
 * dtopk: whole row blocks), so every output element is computed and written by exactly one thread, with
 * no atomics; the tiling does not depend on the thread count, so neither do the results.  The pack and
 * accumulator buffers of every thread (about 290 KiB each) are one arena, malloc'd before the parallel
 * region (omp_get_max_threads() parts; the region asks for that many threads) and carved by thread
 * number; if the allocation fails, no output has been touched and the call returns
 * MOE_ERR_OUT_OF_MEMORY.  All index arithmetic is int64_t.
 *
 * NaN results: when the inputs hold NaNs, which NaN an operation returns is not specified by IEEE 754
 * and depends on the compiler's operand order, so a NaN output may differ from the naive twin's in its
 * sign or payload bits (never in being NaN).  Every non-NaN output is bit for bit the same.
 *
 * Files: convert.h (the exact conversions and the row loads and stores, inlined into every caller),
 * kernels.c (the micro-kernels and the choice among them), tiles.c (packing, the tile's reduction and
 * store, the worksharing loop over the items: the hot loops, in one translation unit), setup.c (the work
 * blocks, the threads' scratch, the parallel region of the ops without reduce_topk), fwd_dw.c, dx.c,
 * topk.c (each op's driver and allocating shell).  specs/gemm_blocked.acsl has the ACSL logic.
 */
#ifndef MOE_REF_GEMM_INTERNAL_H
#define MOE_REF_GEMM_INTERNAL_H

/* Frama-C/WP (specs/verify.sh) reads the scalar path only: the SSE2, vector-extension and AVX2 code is
 * trusted (tested bit for bit against gemm_naive.c by tests/test_gemm_modes).  The compiled code is
 * not affected: __FRAMAC__ is defined by Frama-C's preprocessing only. */
#if defined(__FRAMAC__) && !defined(MOE_REF_NO_VECTOR)
#define MOE_REF_NO_VECTOR 1
#endif

#include "moe_ref.h"
#include "ref_bf16.h"    /* bf16_to_f32, f32_to_bf16 */
#include "ref_threads.h" /* team_size, team_member, copy_floats */

#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* moe_dtype_size (src/dtype.c) has its contract on the redeclaration in ref/moe_ref.h (the bytes of one
 * element); WP proves it in src/dtype.c's run. */

/* No a*b+c contraction into FMA: GCC's -std=c11 already implies -ffp-contract=off; clang needs this (in
 * every file that includes this header, before its code). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#ifdef _OPENMP
#include <omp.h>
#define MOE_OMP(directive) _Pragma(#directive)
#else
#define MOE_OMP(directive)
#endif

#if (defined(__GNUC__) || defined(__clang__)) && !defined(MOE_REF_NO_VECTOR)
#define MOE_HAVE_VECTOR_EXT 1
#endif
#if defined(MOE_HAVE_VECTOR_EXT) && (defined(__x86_64__) || defined(__i386__)) && !defined(MOE_REF_NO_AVX2)
#define MOE_HAVE_AVX2_KERNEL 1
#endif

/* Tiling.  MR x NR is the micro-tile; MB x NB the output tile of one work item; KB the reduction block.
 * Per thread: A pack MB*KB, B pack NB*KB, the accumulator MB*NB and one row of floats (96 + 128 + 48
 * KiB + 512 B). */
enum {
    MR = 6,   /* A rows per micro-tile (the AVX2 kernel does 6; the 16-byte kernel two halves of 3) */
    NR = 16,  /* B columns per micro-tile */
    MB = 96,  /* A rows per work item, a multiple of MR */
    NB = 128, /* B columns per work item, a multiple of NR */
    KB = 256  /* reduction block */
};

/* ---- micro-kernels: c[i][j] += a[p][i] * b[p][j] for p = 0 .. kb-1 in order, i < MR, j < NR ----
 * a is a packed group [kb][MR], b a packed panel [kb][NR], c the accumulator tile with row stride ldc.
 * With `first`, the accumulators start at +0.0f instead of being loaded from c (the first reduction
 * block).  rows (1 .. MR) is how many of the MR rows are real; a kernel may compute padded ones too. */
typedef void (*micro_kernel)(int64_t kb, int first, int rows, const float *restrict a,
                             const float *restrict b, float *restrict c, int64_t ldc);

/* ---- the problem, its work items and the per-thread scratch ---- */

enum op_kind { OP_FWD, OP_DX, OP_DW, OP_TOPK }; /* OP_TOPK: the topk-weight gradient, fwd's tiles */

/* An A block: rows [i0, i0+mi) of expert e (fwd, dX: expert-order rows; dW: n). */
typedef struct a_block {
    int64_t e, i0, mi;
} a_block;

typedef struct gemm_ctx {
    const moe_gemm_problem *p;
    enum op_kind kind;
    const void *a_src;        /* fwd: x, dX: dy, dW: dy */
    const void *b_src;        /* fwd: w, dX: w,  dW: x  */
    const void *topk_weights; /* or NULL */
    const void *dy;           /* OP_TOPK: dy */
    void *out;                /* y, dx, dw or d_topk_weights */
    const int64_t *offsets;   /* [E+1] */
    micro_kernel kernel;
    /* dX with reduce_topk: v of slot s, column c lands in slot_values[s * slot_width + c - chunk0] */
    float *slot_values;
    int64_t slot_width, chunk0;
} gemm_ctx;

typedef struct thread_scratch {
    float *a, *b, *acc, *row; /* packs, accumulator tile [MB][NB], one converted row of MB or NB */
} thread_scratch;

/* A thread's scratch is one part of an arena of SCRATCH_FLOATS floats per thread: a at 0, b at SCRATCH_B,
 * acc at SCRATCH_ACC, row at SCRATCH_ROW; 16 floats of padding at the end keep the threads' parts off
 * each other's cache lines (every offset is a multiple of 16 floats). */
enum {
    SCRATCH_B = MB * KB,
    SCRATCH_ACC = SCRATCH_B + NB * KB,
    SCRATCH_ROW = SCRATCH_ACC + MB * NB,
    SCRATCH_FLOATS = SCRATCH_ROW + (MB > NB ? MB : NB) + 16
};

typedef struct gemm_setup {
    int64_t *offsets;
    a_block *blocks;
    int64_t block_count;
} gemm_setup;

/* ---- the ACSL logic (Frama-C only) ---- */

/* The functions declared below are called from one file of the reference in another; hidden from the shared
 * library's exported symbols, whose names all begin with moe_ (theirs do not). */
#if (defined(__GNUC__) || defined(__clang__)) && !defined(__FRAMAC__)
#pragma GCC visibility push(hidden)
#endif

#ifndef MOE_HAVE_VECTOR_EXT
/* The scalar micro-kernel (kernels.c), the only one without vector extensions and so the one Frama-C
 * parses: ctx_tile_ok names it.  WP proves the indices and the writes (rows 0 .. rows-1 of c, NR floats
 * each), not the values. */
/*@ requires depth: 0 <= kb <= KB;
    requires rows: 1 <= rows <= MR;
    requires ldc: NR <= ldc <= NB;
    requires a: \valid_read(a + (0 .. kb * MR - 1));
    requires b: \valid_read(b + (0 .. kb * NR - 1));
    requires c: \valid(c + (0 .. (rows - 1) * ldc + NR - 1));
    terminates \true;
    assigns c[0 .. (rows - 1) * ldc + NR - 1]; */
void gemm_kernel_scalar(int64_t kb, int first, int rows, const float *restrict a, const float *restrict b,
                        float *restrict c, int64_t ldc);
#endif

#ifdef __FRAMAC__
#include "gemm_blocked.acsl" /* specs/: the logic of the work items, the setup and the ops */
#endif

/* ---- row maps (static inline: the packs and stores of tiles.c, the topk gradient of topk.c) ---- */

/* The slot of expert-order row r (r itself when no gather indices are given). */
/*@ requires problem: gemm_problem_ok(p);
    requires row: 0 <= r < p->rows;
    terminates \true;
    assigns \nothing;
    ensures slot: 0 <= \result < p->rows;
    ensures value: \result == (p->gather_indices != \null ? p->gather_indices[r] : r); */
static inline int64_t slot_of_row(const moe_gemm_problem *p, int64_t r)
{
    return p->gather_indices != NULL ? p->gather_indices[r] : r;
}

/* Row of X read by expert-order row r. */
/*@ requires problem: gemm_problem_ok(p);
    requires row: 0 <= r < p->rows;
    terminates \true;
    assigns \nothing;
    ensures x_row: 0 <= \result < gemm_x_rows(p); */
static inline int64_t x_row(const moe_gemm_problem *p, int64_t r)
{
    /*@ assert topk: 1 <= p->topk; */
    /*@ ghost
      if (p->permute_x)
          lemma_div_below(p->gather_indices != 0 ? p->gather_indices[r] : r, p->num_tokens, p->topk); */
    return p->permute_x ? slot_of_row(p, r) / p->topk : r;
}

/* Row of Y written (forward) or of dY read (backward) for expert-order row r. */
/*@ requires problem: gemm_problem_ok(p);
    requires row: 0 <= r < p->rows;
    terminates \true;
    assigns \nothing;
    ensures y_row: 0 <= \result < p->rows; */
static inline int64_t y_row(const moe_gemm_problem *p, int64_t r)
{
    return p->permute_y ? slot_of_row(p, r) : r;
}

/* ---- kernels.c ---- */

/* The kernel for this CPU (chosen by the calling thread, before any parallel region).  Frama-C parses the
 * scalar path only: there it returns gemm_kernel_scalar (proved); in gcc/clang builds kernel_avx2 or kernel_v4. */
/*@ terminates \true;
    assigns \nothing;
    ensures scalar: \result == &gemm_kernel_scalar; */
micro_kernel gemm_pick_kernel(void);

/* ---- tiles.c ---- */

/* The accumulator tile s->acc of A block ab x B columns [j0, j0+nj), reduction length L.
 * The micro-kernel is called through g->kernel (gemm_pick_kernel's choice).  Frama-C parses the scalar path,
 * where gemm_pick_kernel returns gemm_kernel_scalar: the `calls` annotation makes WP prove that the pointer is
 * gemm_kernel_scalar (requires `tile`: ctx_tile_ok) and the requires of gemm_kernel_scalar at the call.  In gcc/clang
 * builds the pointer is kernel_v4 or kernel_avx2 (trusted, tested bit for bit).  The reduction is walked
 * in blocks p0 += kb (kb = KB but for the last block): the same p0 as p0 += KB, without the overflow of
 * p0 + KB past L. */
/*@ requires tile: ctx_tile_ok(g);
    requires block: \valid_read(ab) && 0 <= ab->e < g->p->num_experts && 0 <= ab->i0 && 0 <= ab->mi <= MB &&
                    ab->i0 + ab->mi <= (g->kind == OP_DW ? g->p->N : g->p->rows);
    requires cols: 0 <= j0 && 0 <= nj <= NB &&
                   j0 + nj <= (g->kind == OP_FWD || g->kind == OP_TOPK ? g->p->N : g->p->K);
    requires reduction: 0 <= L && (g->kind == OP_DW ? expert_rows_ok(g, ab->e, 0, L)
                                                    : L <= (g->kind == OP_DX ? g->p->N : g->p->K));
    requires scratch: scratch_ok(s);
    terminates \true;
    assigns s->a[0 .. MB * KB - 1], s->b[0 .. NB * KB - 1], s->acc[0 .. MB * NB - 1],
            s->row[0 .. (MB > NB ? MB : NB) - 1]; */
void gemm_compute_tile(const gemm_ctx *g, const a_block *ab, int64_t j0, int64_t nj, int64_t L, thread_scratch *s);

/* Every item of A blocks x B columns [jlo, jhi) (an orphaned worksharing loop: call it from every thread
 * of a parallel region).  Frama-C ignores the OpenMP pragma: WP proves the sequential loop (every item in
 * turn, by one thread).  The chunk count is ceil((jhi - jlo) / NB) without the overflow of
 * jhi - jlo + NB - 1. */
/*@ requires tile: ctx_tile_ok(g);
    requires kind: g->kind == OP_FWD || g->kind == OP_DX || g->kind == OP_DW;
    requires weights: g->kind != OP_DW && g->topk_weights != \null ==> ctx_weights_ok(g);
    requires offsets: ctx_offsets_ok(g);
    requires blocks: blocks_ok(g, blocks, block_count);
    requires cols: 0 <= jlo <= jhi <= (g->kind == OP_FWD ? g->p->N : g->p->K);
    requires items: block_count * pack_count(jhi - jlo, NB) <= INT64_MAX;
    requires scratch: scratch_ok(s);
    requires out: ctx_items_out_ok(g, blocks, block_count, s->acc, jlo, jhi);
    terminates \true;
    assigns s->a[0 .. MB * KB - 1], s->b[0 .. NB * KB - 1], s->acc[0 .. MB * NB - 1],
            s->row[0 .. (MB > NB ? MB : NB) - 1], ((char *)g->out)[0 .. ctx_out_bytes(g) - 1],
            g->slot_values[0 .. g->p->rows * g->slot_width - 1]; */
void gemm_run_items(const gemm_ctx *g, const a_block *blocks, int64_t block_count, int64_t jlo, int64_t jhi,
                    thread_scratch *s);

/* ---- setup.c ---- */

/* The scratch of threads threads: threads * SCRATCH_FLOATS floats, or NULL when they cannot be had.  Not
 * proved (malloc: WP 25 has no model of allocation); its contract is stated. */
/*@ requires threads: threads >= 1;
    terminates \true;
    assigns __fc_heap_status \from threads, __fc_heap_status;
    assigns \result \from threads, __fc_heap_status;
    allocates \result;
    ensures arena: \result != \null ==> \valid(\result + (0 .. threads * SCRATCH_FLOATS - 1)); */
float *gemm_scratch_arena(int threads);

/* Thread t's part of an arena (proved): the four buffers at their offsets in floats t * SCRATCH_FLOATS ..
 * t * SCRATCH_FLOATS + SCRATCH_FLOATS - 1, valid and apart (scratch_ok). */
/*@ requires s: \valid(s);
    requires part: 0 <= t && \valid(arena + (t * SCRATCH_FLOATS .. t * SCRATCH_FLOATS + SCRATCH_FLOATS - 1));
    terminates \true;
    assigns *s;
    ensures at: s->a == arena + t * SCRATCH_FLOATS && s->b == arena + (t * SCRATCH_FLOATS + SCRATCH_B) &&
                s->acc == arena + (t * SCRATCH_FLOATS + SCRATCH_ACC) &&
                s->row == arena + (t * SCRATCH_FLOATS + SCRATCH_ROW);
    ensures scratch: scratch_ok(s); */
void gemm_team_scratch(thread_scratch *s, float *arena, int t);

/* Offsets and A blocks: expert-order row blocks (fwd, dX, topk) or (expert, n) blocks (dW), on the
 * caller's scratch offsets [E + 1] and blocks [count_blocks + 1] (gemm_setup_alloc; either NULL when its
 * allocation failed: MOE_ERR_OUT_OF_MEMORY with the message the library always gave, offsets first).
 * Proved: RTE (every block written inside blocks [count_blocks + 1], no overflow), the blocks in range.
 * The row blocks step i0 += mi (mi = MB but for the last block of an expert: the same i0 as i0 += MB,
 * without its overflow past hi). */
/*@ requires problem: gemm_problem_ok(p);
    requires routing: gemm_routing_ok(p);
    requires experts: p->num_experts < INT64_MAX;
    requires st: \valid(st);
    requires offsets: offsets != \null ==> \valid(offsets + (0 .. p->num_experts));
    requires blocks: blocks != \null ==> \valid(blocks + (0 .. gemm_blocks(p, kind, p->num_experts)));
    requires separated: \separated(st, p, p->m_sizes + (0 .. p->num_experts - 1));
    requires offsets_apart: offsets != \null ==>
      \separated(offsets + (0 .. p->num_experts), st, p, p->m_sizes + (0 .. p->num_experts - 1));
    requires blocks_apart: blocks != \null ==>
      \separated(blocks + (0 .. gemm_blocks(p, kind, p->num_experts)), st, p,
                 p->m_sizes + (0 .. p->num_experts - 1), offsets + (0 .. p->num_experts));
    terminates \true;
    assigns *st, offsets[0 .. p->num_experts], blocks[0 .. gemm_blocks(p, kind, p->num_experts)],
            moe_error_model;
    ensures status: offsets != \null && blocks != \null ? \result == MOE_OK : \result == MOE_ERR_OUT_OF_MEMORY;
    ensures offsets: \result == MOE_OK ==> st->offsets == offsets && offsets[0] == 0 &&
      \forall integer e; 0 <= e < p->num_experts ==> 0 <= offsets[e] <= offsets[e + 1] <= p->rows;
    ensures blocks: \result == MOE_OK ==> st->blocks == blocks &&
      blocks_at(p, kind, blocks, st->block_count) &&
      blocks_bound(st->block_count, kind, p->num_experts, p->N, p->rows);
    ensures block_count: \result == MOE_OK ==> st->block_count == \old(gemm_blocks(p, kind, p->num_experts)); */
moe_status gemm_setup_in(const moe_gemm_problem *p, enum op_kind kind, gemm_setup *st, int64_t *offsets,
                         a_block *blocks);

/* The allocating part of the setup (not proved: WP 25 has no model of allocation): offsets [E + 1] and
 * blocks [count_blocks + 1] (one more: malloc(0) may return NULL), either NULL when its allocation failed,
 * which gemm_setup_in reports.  Both are allocated even when the first fails. */
void gemm_setup_alloc(const moe_gemm_problem *p, enum op_kind kind, int64_t **offsets, a_block **blocks);

/* Frees what gemm_setup_alloc allocated. */
void gemm_setup_free(int64_t *offsets, a_block *blocks);

/* MOE_ERR_OUT_OF_MEMORY with the message of a failed scratch arena (the size of one thread's part). */
/*@ requires problem: \valid_read(p);
    terminates \true;
    assigns moe_error_model;
    ensures status: \result == MOE_ERR_OUT_OF_MEMORY; */
moe_status gemm_out_of_scratch(const moe_gemm_problem *p);

/* The allocating shell of run_plain_in (not proved: WP 25 has no model of allocation): the arena for the
 * threads of the region, run_plain_in, free.  Its contract is stated: run_plain_in's requires, with the
 * arena that gemm_scratch_arena gives (valid, apart: malloc's promise). */
/*@ requires problem: plain_problem_ok(g);
    requires tensors: plain_tensors_ok(g);
    requires kernel: plain_kernel_ok(g);
    requires setup: plain_setup_ok(g, st);
    requires apart: plain_apart(g, st);
    requires cols: columns == (g->kind == OP_FWD ? g->p->N : g->p->K);
    terminates \true;
    assigns ((char *)g->out)[0 .. ctx_out_bytes(g) - 1], moe_error_model, __fc_heap_status;
    ensures status: \result == MOE_OK || \result == MOE_ERR_OUT_OF_MEMORY; */
moe_status gemm_run_plain(const gemm_ctx *g, const gemm_setup *st, int64_t columns);

#if (defined(__GNUC__) || defined(__clang__)) && !defined(__FRAMAC__)
#pragma GCC visibility pop
#endif

#endif
