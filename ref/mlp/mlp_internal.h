/*
 * ref/mlp/mlp_internal.h: what the files of the blockwise MoE MLP reference share: the tile sizes, the
 * slot index, the workspaces and the per-thread scratch of the forward and the backward, and the
 * contracts of the functions one file calls in another.
 *
 * The blockwise MoE MLP, CPU reference: forward with checkpoints and the full backward
 * (SEMANTICS section 3, specs/MLP.md).  The float32 operation order is written in mlp_ref.h.
 *
 * Structure.  The valid positions of the layout are numbered s = 0 .. V-1 in ascending position
 * ("slots": slot_index.c).  Work is done expert by expert: the slots of one expert are gathered into
 * float32 tiles, the projections run as two small GEMM kernels (tiles.c: mlp_mm_nn, activations . weight;
 * mlp_mm_wn, weight . activations^T, for the products with a transposed weight), both with the inner loop
 * across output columns and every sum in ascending order, and the expert's weight and bias gradients
 * are written by the thread that owns the expert.  Per-slot contributions to token rows (forward
 * output, d_hidden) go to a float32 scratch indexed by slot and are summed per token afterwards in
 * ascending slot order, each token row by one thread.  No atomics; every float32 sum has an order fixed
 * by the layout alone, so results do not depend on the thread count.
 *
 * Files: tiles.c (the tile GEMMs, the row loads and stores), activations.h (the activations and clamps,
 * static inline for the per-element loops) and activations.c (the roundings of round_intermediates),
 * slot_index.c, workspace.c (threads and arenas), fwd.c and bwd.c (each with its allocating shell, the
 * entry point of mlp_ref.h).  specs/mlp.acsl, mlp_index.acsl, mlp_fwd.acsl and mlp_bwd.acsl have the
 * ACSL logic.
 */
#ifndef MOE_REF_MLP_INTERNAL_H
#define MOE_REF_MLP_INTERNAL_H

#include "mlp_ref.h"
#include "moe_ref.h"
#include "ref_bf16.h"    /* bf16_to_f32, f32_to_bf16 */
#include "ref_threads.h" /* team_size, team_member, copy_floats */

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
/* OpenMP pragmas that vanish (without an unknown-pragma warning) when built without OpenMP */
#ifdef _OPENMP
#include <omp.h>
#define MLP_PRAGMA(text) _Pragma(#text)
#define MLP_OMP(...) MLP_PRAGMA(omp __VA_ARGS__)
#else
#define MLP_OMP(...)
#endif
#define MLP_SIMD MLP_OMP(simd)

#ifdef __FRAMAC__
#include "mlp.acsl" /* specs/: the ACSL logic of the loop kernels (Frama-C only) */

/* The dtype conversions of ref/dtype.c that the proofs call (they terminate and touch no memory) have
 * their contracts on the redeclarations in ref/moe_ref.h. */
#endif

/* The tiles of the float32 GEMMs: NC output columns, PC depth (tiles.c), RC gradient rows per chunk (the
 * backward's weight gradients). */
enum { NC = 128, PC = 64, RC = 64 };

/* ---- slots: valid positions numbered in ascending position, grouped by expert and by token ---- */

typedef struct slot_index {
    int64_t count;           /* V */
    int64_t *pos;            /* [V] position of slot s */
    int64_t *token;          /* [V] */
    int64_t *expert_start;   /* [E+1] */
    int64_t *expert_slots;   /* [V] slots by expert, ascending within */
    int64_t *token_start;    /* [T+1] */
    int64_t *token_slots;    /* [V] slots by token, ascending within */
    int64_t *block_start;    /* [E+1] */
    int64_t *expert_blocks;  /* [N] blocks by expert, ascending within */
    int64_t max_slots;       /* most slots of one expert */
} slot_index;

/* One float32 arena per thread, carved into named pieces. */
typedef struct arena {
    float *base;
    size_t per_thread;
} arena;

/* The forward's per-thread scratch, carved from the thread's arena in moe_ref_mlp_fwd's parallel region
 * (n_max: the most slots of one expert): X, D [n_max][H]; GU [n_max][2I]; M [n_max][I]; with ON_I M0
 * [n_max][I] and D0 [n_max][H] (else NULL); a [n_max]; bgu [2I]; bd [H]; bbuf [PC*NC]. */
typedef struct fwd_scratch {
    float *X, *D, *GU, *M, *M0, *D0, *a, *bgu, *bd, *bbuf;
} fwd_scratch;

/* The backward's per-thread scratch, carved from the thread's arena (n_max: the most slots of one expert;
 * wide = max(H, 2I, 1)): X, G, Dk, dD [n_max][H]; Tin, Tout [n_max][wide]; GU, dGU [n_max][2I]; M, dM
 * [n_max][I]; a [n_max]; C [RC][wide]; brow [wide]; bd [H]; bbuf [PC*NC]. */
typedef struct bwd_scratch {
    float *X, *G, *Dk, *dD, *Tin, *Tout, *GU, *dGU, *M, *dM, *a, *C, *brow, *bd, *bbuf;
} bwd_scratch;

#ifdef __FRAMAC__
#include "mlp_index.acsl" /* specs/: slot_index_ok and mlp_build_index's arrays */
#include "mlp_fwd.acsl"   /* specs/: the forward's dims, scratch and tensors */
#include "mlp_bwd.acsl"   /* specs/: the backward's */
#endif

/* The functions declared below are called from one file of the reference in another; hidden from the shared
 * library's exported symbols, whose names all begin with moe_ (theirs do not). */
#if (defined(__GNUC__) || defined(__clang__)) && !defined(__FRAMAC__)
#pragma GCC visibility push(hidden)
#endif

/* ---- tiles.c: row loads and stores, the tile GEMMs ---- */

/* Stores count float32 values as elements first .. first + count - 1 of a dtype tensor (one rounding).
 *   base: tensor of dtype;  v [count]
 * Contract trusted, not proved (as moe_ref_store's): the body casts void * to float * / uint16_t *, which
 * WP's typed model cannot follow; it writes exactly the bytes of elements first .. first + count - 1. */
/*@ requires dtype: dtype_ok(dtype);
    requires count: 0 <= first && 0 <= count && first + count <= INT64_MAX;
    requires elements: elements_writable((char *)base, first, count, dtype);
    requires v: \valid_read(v + (0 .. count - 1));
    requires separated: \separated(v + (0 .. count - 1),
      (char *)base + (byte_offset(first, dtype) .. byte_offset(first + count, dtype) - 1));
    terminates \true;
    assigns ((char *)base)[byte_offset(first, dtype) .. byte_offset(first + count, dtype) - 1]; */
void mlp_store_row(moe_dtype dtype, void *base, int64_t first, const float *v, int64_t count);

/* count elements starting at element `first` of a dtype tensor as float32 into out.
 *   base: tensor of dtype;  out [count]
 * Contract trusted, not proved: the casts of row_f32 (tiles.c), and memcpy from the tensor's floats. */
/*@ requires dtype: dtype_ok(dtype);
    requires count: 0 <= first && 0 <= count && first + count <= INT64_MAX;
    requires elements: elements_readable((char *)base, first, count, dtype);
    requires out: \valid(out + (0 .. count - 1));
    requires separated: \separated(out + (0 .. count - 1),
      (char *)base + (byte_offset(first, dtype) .. byte_offset(first + count, dtype) - 1));
    terminates \true;
    assigns out[0 .. count - 1]; */
void mlp_load_f32(moe_dtype dtype, const void *base, int64_t first, int64_t count, float *out);

/* C[i*ldc + j] = sum_{p = 0 .. kk-1 ascending} A[i*ars + p*acs] * B[p*ldb + j]   for i < m, j < n, B float32:
 * per tile of NC output columns, C's columns zeroed, then mm_nn_tile over the depth in chunks of PC (the
 * summation order of every element: p ascending, four at a time within a chunk, see mm_nn_tile).
 *   A: [m][kk] with strides ars, acs (row-major: ars = kk-or-more, acs = 1; transposed: ars = 1);
 *   B [kk][ldb] (the first n columns are read);  C [m][ldc] (the first n columns are written) */
/*@ requires dims: 0 <= m && 0 <= n <= INT64_MAX - NC && 0 <= kk <= INT64_MAX - PC;
    requires A_strides: 0 <= ars && 0 <= acs && (kk >= 1 ==> (kk - 1) * acs <= INT64_MAX);
    requires A: m >= 1 && kk >= 1 ==> (m - 1) * ars + (kk - 1) * acs <= INT64_MAX &&
      \valid_read(A + (0 .. (m - 1) * ars + (kk - 1) * acs));
    requires strides: n <= ldb && n <= ldc;
    requires sizes: kk * ldb <= INT64_MAX && m * ldc <= INT64_MAX;
    requires B: \valid_read(B + (0 .. kk * ldb - 1));
    requires C: \valid(C + (0 .. m * ldc - 1));
    terminates \true;
    assigns C[0 .. m * ldc - 1]; */
void mlp_mm_nn_f32(int64_t m, int64_t n, int64_t kk, const float *A, int64_t ars, int64_t acs, const float *B,
                   int64_t ldb, float *C, int64_t ldc);

/* C[i*ldc + j] = sum_{p = 0 .. kk-1 ascending} A[i*ars + p*acs] * B(p, j)   for i < m, j < n,
 * B(p, j) = element boff + p*ldb + j of a tensor of dtype bdt: an f32 tensor through mlp_mm_nn_f32 in place;
 * f16 / bf16 with the same loops, each PC x NC tile of B converted once into bbuf (PC*NC floats) first.
 * The inner loop runs across output columns.
 *   A: [m][kk] with strides ars, acs (row-major: ars = kk-or-more, acs = 1; transposed: ars = 1);
 *   B: elements boff .. boff + kk*ldb - 1 of a dtype tensor, [kk][ldb] (the first n columns are read);
 *   C [m][ldc] (the first n columns are written);  bbuf [PC*NC] */
/*@ requires dims: 0 <= m && 0 <= n <= INT64_MAX - NC && 0 <= kk <= INT64_MAX - PC;
    requires A_strides: 0 <= ars && 0 <= acs && (kk >= 1 ==> (kk - 1) * acs <= INT64_MAX);
    requires A: m >= 1 && kk >= 1 ==> (m - 1) * ars + (kk - 1) * acs <= INT64_MAX &&
      \valid_read(A + (0 .. (m - 1) * ars + (kk - 1) * acs));
    requires strides: n <= ldb && n <= ldc;
    requires sizes: 0 <= boff && boff + kk * ldb <= INT64_MAX && m * ldc <= INT64_MAX;
    requires dtype: dtype_ok(bdt);
    requires B: elements_readable((char *)B, boff, kk * ldb, bdt);
    requires C: \valid(C + (0 .. m * ldc - 1));
    requires bbuf: \valid(bbuf + (0 .. PC * NC - 1));
    terminates \true;
    assigns C[0 .. m * ldc - 1], bbuf[0 .. PC * NC - 1]; */
void mlp_mm_nn(int64_t m, int64_t n, int64_t kk, const float *A, int64_t ars, int64_t acs, moe_dtype bdt,
               const void *B, int64_t boff, int64_t ldb, float *C, int64_t ldc, float *bbuf);

/* C[i*ldc + j] = sum_{p = 0 .. kk-1 ascending} W(i, p) * B[p*ldb + j]   for i < m, j < n,
 * W(i, p) = element woff + i*ldw + p of a tensor of dtype wdt (a weight, each row converted once into
 * wrow, kk floats); B float32.  The backward's "activation . weight^T" products run as
 * (weight . activation^T)^T through this kernel so that the inner loop stays across output columns.
 *   W: elements woff .. woff + m*ldw - 1 of a dtype tensor, [m][ldw] (the first kk columns are read);
 *   B [kk][ldb] (the first n columns are read);  C [m][ldc] (the first n columns are written);  wrow [kk] */
/*@ requires dims: 0 <= m && 0 <= n <= INT64_MAX - NC && 0 <= kk <= INT64_MAX - 4;
    requires strides: kk <= ldw && n <= ldb && n <= ldc;
    requires sizes: 0 <= woff && woff + m * ldw <= INT64_MAX && kk * ldb <= INT64_MAX && m * ldc <= INT64_MAX;
    requires dtype: dtype_ok(wdt);
    requires W: elements_readable((char *)W, woff, m * ldw, wdt);
    requires B: \valid_read(B + (0 .. kk * ldb - 1));
    requires C: \valid(C + (0 .. m * ldc - 1));
    requires wrow: \valid(wrow + (0 .. kk - 1));
    terminates \true;
    assigns C[0 .. m * ldc - 1], wrow[0 .. kk - 1]; */
void mlp_mm_wn(int64_t m, int64_t n, int64_t kk, moe_dtype wdt, const void *W, int64_t woff, int64_t ldw,
               const float *B, int64_t ldb, float *C, int64_t ldc, float *wrow);

/* dst[j*m + i] = src[i*lds + j] for i < m, j < n (float32), in 32 x 32 tiles.
 *   src [m][lds] (the first n columns are read), dst [n][m] */
/*@ requires dims: 0 <= m <= INT64_MAX - 32 && 0 <= n <= INT64_MAX - 32 && n <= lds;
    requires sizes: m * lds <= INT64_MAX && m * n <= INT64_MAX;
    requires src: \valid_read(src + (0 .. m * lds - 1));
    requires dst: \valid(dst + (0 .. m * n - 1));
    terminates \true;
    assigns dst[0 .. m * n - 1]; */
void mlp_transpose(int64_t m, int64_t n, const float *src, int64_t lds, float *dst);

/* Gathers the float32 rows `tok[slots[i]]` (i < n) of a [rows][H] tensor into dst[n][H].
 *   src [rows][H] of dtype;  slots [n], each in [0, V);  tok [V], each in [0, rows);  dst [n][H]
 *   V, rows  ghost (read by the proof only): the lengths of tok and of src */
/*@ requires dtype: dtype_ok(dtype);
    requires dims: 0 <= n && 0 <= H && 0 <= V && 0 <= rows && rows * H <= INT64_MAX && n * H <= INT64_MAX;
    requires slots: \valid_read(slots + (0 .. n - 1)) && in_range(slots, n, 0, V);
    requires tok: \valid_read(tok + (0 .. V - 1)) && in_range(tok, V, 0, rows);
    requires src: tensor_readable((char *)src, rows * H, dtype);
    requires dst: \valid(dst + (0 .. n * H - 1));
    requires separated: \separated(dst + (0 .. n * H - 1), (char *)src + (0 .. byte_offset(rows * H, dtype) - 1));
    terminates \true;
    assigns dst[0 .. n * H - 1]; */
void mlp_gather_rows(moe_dtype dtype, const void *src, const int64_t *slots, const int64_t *tok, int64_t n,
                     int64_t H, float *dst) /*@ ghost (int64_t V, int64_t rows) */;

/* ---- activations.c: the roundings of round_intermediates (the activations: activations.h) ---- */

/* The limit as the checkpoint stores it: a clamped value is stored as round(limit). */
/*@ terminates \true;
    assigns \nothing;
    ensures f32_exact: dtype != MOE_F16 && dtype != MOE_BF16 ==> \result == v; */
float mlp_round_to(moe_dtype dtype, float v);

/* the rounded intermediates (p->round_intermediates): rounds count float32 values in place to the dtype and back (round to
 * nearest even; identity for f32), once each: the operands of the second-stage GEMMs (specs/MLP.md,
 * "Rounded intermediates").   v [count] */
/*@ requires dtype: dtype_ok(dtype);
    requires count: count >= 0;
    requires v: \valid(v + (0 .. count - 1));
    terminates \true;
    assigns v[0 .. count - 1]; */
void mlp_round_row(moe_dtype dtype, float *v, int64_t count);

/* ---- slot_index.c ---- */

/* Allocates the slot index of a checked layout and fills it (build_index_in).  This shell only
 * counts the slots (count_tokens, proved), allocates (the three starts zeroed) and, when build_index_in
 * fails (an allocation failed: MOE_ERR_OUT_OF_MEMORY), frees; it is not proved: contract stated (WP 25
 * has no model of malloc/calloc/free). */
/*@ requires problem: mlp_problem_ok(p);
    requires x: \valid(x) && \separated(x, p);
    terminates \true;
    assigns *x, moe_error_model, __fc_heap_status;
    ensures status: \result == MOE_OK || \result == MOE_ERR_OUT_OF_MEMORY;
    ensures index: \result == MOE_OK ==>
      slot_index_ok(x, (int64_t *)p->token_position_to_id, p->T, p->E, p->N, p->B);
    ensures counted: \result == MOE_OK ==>
      x->count == \old(count_lt((int64_t *)p->token_position_to_id, p->N * p->B, p->T)); */
moe_status mlp_build_index(const moe_mlp_problem *p, slot_index *x);

/* Frees the arrays of a slot index (each NULL or allocated by mlp_build_index).  Contract stated, not proved:
 * WP 25 implements neither \freeable nor the frees clause. */
/*@ requires x: \valid_read(x);
    requires freeable: (x->pos == \null || \freeable(x->pos)) && (x->token == \null || \freeable(x->token)) &&
      (x->expert_start == \null || \freeable(x->expert_start)) &&
      (x->expert_slots == \null || \freeable(x->expert_slots)) &&
      (x->token_start == \null || \freeable(x->token_start)) &&
      (x->token_slots == \null || \freeable(x->token_slots)) &&
      (x->block_start == \null || \freeable(x->block_start)) &&
      (x->expert_blocks == \null || \freeable(x->expert_blocks));
    terminates \true;
    assigns __fc_heap_status;
    frees x->pos, x->token, x->expert_start, x->expert_slots, x->token_start, x->token_slots, x->block_start,
      x->expert_blocks; */
void mlp_free_index(slot_index *x);

/* ---- workspace.c: threads and per-thread arenas ---- */

/* Threads for a call: one for small problems (below ~2^18 multiply-adds the fork/join costs more than
 * it saves, and on a loaded machine a barrier can wait a whole time slice).  The result does not
 * depend on the choice. */
/*@ requires dims: H < INT64_MAX && I < INT64_MAX;
    terminates \true;
    assigns \nothing;
    ensures positive: \result >= 1; */
int mlp_threads_for(int64_t slots, int64_t H, int64_t I);

/* Allocates threads arenas of at least floats_per_thread + 16 floats each (a multiple of 16: threads
 * never share a cache line).  Contract stated, not proved (malloc: WP 25 has no model of allocation).
 * Fails (0) when threads * per_thread floats, per_thread rounded up, would not fit in size_t bytes: the
 * bound is checked after the rounding, which adds up to 31 floats per thread (checked before it, the byte
 * count of 4 threads of 2^60 - 17 floats would wrap to 0). */
/*@ requires a: \valid(a);
    requires threads: threads >= 1;
    terminates \true;
    assigns a->base, a->per_thread, __fc_heap_status;
    allocates a->base;
    ensures allocated: \result != 0 <==> a->base != \null;
    ensures per_thread: \result != 0 ==> a->per_thread >= floats_per_thread + 16 && a->per_thread % 16 == 0;
    ensures bounded: \result != 0 ==> threads * a->per_thread <= SIZE_MAX / 4;
    ensures arena: \result != 0 ==> \valid(a->base + (0 .. threads * a->per_thread - 1)); */
int mlp_arena_alloc(arena *a, int threads, size_t floats_per_thread);

/* The next piece of count floats of an arena: *cursor, which moves on by count rounded up to 16. */
/*@ requires cursor: \valid(cursor);
    requires count: 0 <= count <= INT64_MAX - 15;
    requires room: \valid(*cursor + (0 .. (count + 15) / 16 * 16 - 1));
    terminates \true;
    assigns *cursor \from *cursor, count;
    assigns \result \from *cursor;
    ensures piece: \result == \old(*cursor) && \valid(\result + (0 .. count - 1));
    ensures moved: *cursor == \old(*cursor) + (count + 15) / 16 * 16; */
float *mlp_carve(float **cursor, int64_t count);

/* malloc of count floats (at least one); NULL when the size is past any real memory.  Contract stated, not
 * proved (malloc: WP 25 has no model of allocation). */
/*@ requires dims: 0 <= a && 0 <= b;
    terminates \true;
    assigns __fc_heap_status \from a, b, __fc_heap_status;
    assigns \result \from a, b, __fc_heap_status;
    allocates \result;
    ensures floats: \result != \null ==> \valid(\result + (0 .. a * b)); */
float *mlp_alloc_floats(int64_t a, int64_t b);

/* The largest of three values (the backward's row width, max(H, 2I, 1)). */
/*@ terminates \true;
    assigns \nothing;
    ensures largest: \result >= a && \result >= b && \result >= c;
    ensures one_of: \result == a || \result == b || \result == c; */
int64_t mlp_max3(int64_t a, int64_t b, int64_t c);

#if (defined(__GNUC__) || defined(__clang__)) && !defined(__FRAMAC__)
#pragma GCC visibility pop
#endif

#endif
