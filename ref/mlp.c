/*
 * The blockwise MoE MLP, CPU reference: forward with checkpoints and the full backward
 * (SEMANTICS section 3, specs/MLP.md).  The float32 operation order is written in mlp_ref.h.
 *
 * Structure.  The valid positions of the layout are numbered s = 0 .. V-1 in ascending position
 * ("slots").  Work is done expert by expert: the slots of one expert are gathered into float32 tiles,
 * the projections run as two small GEMM kernels (mm_nn: activations . weight; mm_wn: weight .
 * activations^T, for the products with a transposed weight), both with the inner loop across output
 * columns and every sum in ascending order, and the expert's weight and bias gradients
 * are written by the thread that owns the expert.  Per-slot contributions to token rows (forward
 * output, d_hidden) go to a float32 scratch indexed by slot and are summed per token afterwards in
 * ascending slot order, each token row by one thread.  No atomics; every float32 sum has an order fixed
 * by the layout alone, so results do not depend on the thread count.
 */
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
#include "mlp.acsl" /* specs/: the ACSL logic of the loop kernels below (Frama-C only) */

/* The dtype conversions of ref/dtype.c that the proofs of this file call (they terminate and touch no
 * memory) have their contracts on the redeclarations in ref/moe_ref.h. */

/* The libm functions of the activations.  Frama-C's libc (math.h) specifies expf (assigns errno and its
 * result; no terminates clause) but not erff or tanhf: these contracts are trusted, not proved.  They
 * terminate; erff and tanhf are given errno as expf has it (C11 7.12.1 lets any of them report a range
 * error through errno), so that no contract here claims more than the C library promises.  expf's
 * termination is trusted through the pinned flag -wp-frama-c-stdlib-terminate (specs/verify.sh). */
/*@ terminates \true;
    assigns errno, \result \from x; */
float erff(float x);
/*@ terminates \true;
    assigns errno, \result \from x; */
float tanhf(float x);
#endif

enum { NC = 128, PC = 64, RC = 64 };

/* ---------------------------------------------------------------------------------------------------
 * element conversion (inline for the hot loops; bf16 -> f32 is a shift)
 * ------------------------------------------------------------------------------------------------- */
/* bf16_to_f32, f32_to_bf16: ref/ref_bf16.h. */

/* Elements first .. of a tensor given as void *, seen as float32 (an f32 tensor) or as uint16_t (f16, bf16).
 *   count  ghost (read by the proof only): the elements the caller reads through the result
 * Contracts trusted, not proved: these two casts of void * are the ones WP's typed model cannot follow
 * (specs/README.md); the caller proves the bytes of the count elements readable, and reads the result
 * only (so that no assigns clause has to relate float or uint16_t locations to the tensor's bytes). */
/*@ requires count: 0 <= first && 0 <= count && first + count <= INT64_MAX;
    requires elements: elements_readable((char *)base, first, count, MOE_F32);
    terminates \true;
    assigns \result \from base, first;
    ensures readable: \valid_read(\result + (0 .. count - 1)); */
static inline const float *f32_elements(const void *base, int64_t first) /*@ ghost (int64_t count) */
{
    return (const float *)base + first;
}

/*@ requires count: 0 <= first && 0 <= count && first + count <= INT64_MAX;
    requires elements: elements_readable((char *)base, first, count, MOE_F16);
    terminates \true;
    assigns \result \from base, first;
    ensures readable: \valid_read(\result + (0 .. count - 1)); */
static inline const uint16_t *u16_elements(const void *base, int64_t first) /*@ ghost (int64_t count) */
{
    return (const uint16_t *)base + first;
}

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
static void store_row(moe_dtype dtype, void *base, int64_t first, const float *v, int64_t count)
{
    switch (dtype) {
    case MOE_F32: /* an empty tensor may be NULL, which memcpy must not be given even for 0 bytes */
        if (count > 0)
            memcpy((float *)base + first, v, (size_t)count * sizeof(float));
        return;
    case MOE_BF16: {
        uint16_t *dst = (uint16_t *)base + first;
        for (int64_t i = 0; i < count; i++)
            dst[i] = f32_to_bf16(v[i]);
        return;
    }
    case MOE_F16: {
        uint16_t *dst = (uint16_t *)base + first;
        for (int64_t i = 0; i < count; i++)
            dst[i] = moe_f32_to_f16(v[i]);
        return;
    }
    }
}

/* count elements starting at element `first` of a dtype tensor as float32 into out (or, for f32, a
 * pointer straight into the tensor).   base: tensor of dtype;  out [count]
 * For f32 the result points into the tensor (readable: the caller proves its bytes readable); otherwise it
 * is out. */
/*@ requires dtype: dtype_ok(dtype);
    requires count: 0 <= first && 0 <= count && first + count <= INT64_MAX;
    requires elements: elements_readable((char *)base, first, count, dtype);
    requires out: \valid(out + (0 .. count - 1));
    terminates \true;
    assigns out[0 .. count - 1] \from dtype, count, ((char *)base)[byte_offset(first, dtype) ..
      byte_offset(first + count, dtype) - 1];
    assigns \result \from dtype, base, first, out;
    ensures readable: \valid_read(\result + (0 .. count - 1));
    ensures converted: dtype != MOE_F32 ==> \result == out; */
static const float *row_f32(moe_dtype dtype, const void *base, int64_t first, int64_t count, float *out)
{
    switch (dtype) {
    case MOE_F32: return f32_elements(base, first) /*@ ghost (count) */;
    case MOE_BF16: {
        const uint16_t *src = u16_elements(base, first) /*@ ghost (count) */;
        /*@ loop invariant bounds: 0 <= i <= count;
            loop assigns i, out[0 .. count - 1];
            loop variant count - i; */
        for (int64_t i = 0; i < count; i++)
            out[i] = bf16_to_f32(src[i]);
        return out;
    }
    case MOE_F16: {
        const uint16_t *src = u16_elements(base, first) /*@ ghost (count) */;
        /*@ loop invariant bounds: 0 <= i <= count;
            loop assigns i, out[0 .. count - 1];
            loop variant count - i; */
        for (int64_t i = 0; i < count; i++)
            out[i] = moe_f16_to_f32(src[i]);
        return out;
    }
    }
    return out;
}

/* count elements starting at element `first` of a dtype tensor as float32 into out.
 *   base: tensor of dtype;  out [count]
 * Contract trusted, not proved: row_f32's casts, and memcpy from the tensor's floats. */
/*@ requires dtype: dtype_ok(dtype);
    requires count: 0 <= first && 0 <= count && first + count <= INT64_MAX;
    requires elements: elements_readable((char *)base, first, count, dtype);
    requires out: \valid(out + (0 .. count - 1));
    requires separated: \separated(out + (0 .. count - 1),
      (char *)base + (byte_offset(first, dtype) .. byte_offset(first + count, dtype) - 1));
    terminates \true;
    assigns out[0 .. count - 1]; */
static void load_f32(moe_dtype dtype, const void *base, int64_t first, int64_t count, float *out)
{
    const float *src = row_f32(dtype, base, first, count, out);
    if (src != out && count > 0) /* an empty tensor may be NULL (memcpy's arguments must not be) */
        memcpy(out, src, (size_t)count * sizeof(float));
}

/* ---------------------------------------------------------------------------------------------------
 * the two GEMM kernels
 * ------------------------------------------------------------------------------------------------- */

/* The product step of mm_nn (one PC x NC tile) and of mm_wn (one weight row against NC columns):
 * c[i*ldc + j] += sum_{q = 0 .. pc-1 ascending} a[i*ars + q*acs] * bb[q*ldbb + j]
 * for i < m, j < nc, four q at a time (((c + a0 b0) + a1 b1) + a2 b2) + a3 b3, then the rest one by one.
 *   a: [m][pc] with strides ars, acs;  bb [pc][ldbb] (the first nc columns are read);
 *   c [m][ldc] (the first nc columns are updated) */
/*@ requires dims: 0 <= m && 0 <= nc <= ldbb && nc <= ldc && 0 <= pc <= INT64_MAX - 4 && 0 <= ars && 0 <= acs;
    requires a: m >= 1 ==> (m - 1) * ars <= INT64_MAX && (pc >= 1 ==>
      (m - 1) * ars + (pc - 1) * acs <= INT64_MAX && \valid_read(a + (0 .. (m - 1) * ars + (pc - 1) * acs)));
    requires bb: pc >= 1 ==> (pc - 1) * ldbb + nc <= INT64_MAX &&
      \valid_read(bb + (0 .. (pc - 1) * ldbb + nc - 1));
    requires c: m >= 1 ==> (m - 1) * ldc + nc <= INT64_MAX && \valid(c + (0 .. (m - 1) * ldc + nc - 1));
    terminates \true;
    assigns c[0 .. (m - 1) * ldc + nc - 1]; */
static void mm_nn_tile(int64_t m, int64_t nc, int64_t pc, const float *a, int64_t ars, int64_t acs,
                       const float *bb, int64_t ldbb, float *c, int64_t ldc)
{
    /*@ loop invariant rows: 0 <= i <= m;
        loop assigns i, c[0 .. (m - 1) * ldc + nc - 1];
        loop variant m - i; */
    for (int64_t i = 0; i < m; i++) {
        /*@ ghost lemma_mul_monotone(i, m - 1, ldc); */
        /*@ ghost lemma_mul_monotone(i, m - 1, ars); */
        float *restrict ci = c + i * ldc;
        const float *ai = a + i * ars;
        int64_t q = 0;
        /*@ loop invariant depth: 0 <= q <= pc;
            loop assigns q, c[0 .. (m - 1) * ldc + nc - 1];
            loop variant pc - q; */
        for (; q + 4 <= pc; q += 4) {
            /*@ ghost lemma_mul_monotone(q, q + 3, acs); */
            /*@ ghost lemma_mul_monotone(q + 3, pc - 1, acs); */
            /*@ ghost lemma_mul_monotone(q, q + 3, ldbb); */
            /*@ ghost lemma_mul_monotone(q + 3, pc - 1, ldbb); */
            const float a0 = ai[q * acs], a1 = ai[(q + 1) * acs], a2 = ai[(q + 2) * acs], a3 = ai[(q + 3) * acs];
            const float *restrict b0 = bb + q * ldbb, *restrict b1 = b0 + ldbb, *restrict b2 = b1 + ldbb,
                                  *restrict b3 = b2 + ldbb;
            /*@ loop invariant cols: 0 <= j <= nc;
                loop assigns j, c[0 .. (m - 1) * ldc + nc - 1];
                loop variant nc - j; */
            MLP_SIMD
            for (int64_t j = 0; j < nc; j++)
                ci[j] = (((ci[j] + a0 * b0[j]) + a1 * b1[j]) + a2 * b2[j]) + a3 * b3[j];
        }
        /*@ loop invariant depth: 0 <= q <= pc;
            loop assigns q, c[0 .. (m - 1) * ldc + nc - 1];
            loop variant pc - q; */
        for (; q < pc; q++) {
            /*@ ghost lemma_mul_monotone(q, pc - 1, acs); */
            /*@ ghost lemma_mul_monotone(q, pc - 1, ldbb); */
            const float a0 = ai[q * acs];
            const float *restrict b0 = bb + q * ldbb;
            /*@ loop invariant cols: 0 <= j <= nc;
                loop assigns j, c[0 .. (m - 1) * ldc + nc - 1];
                loop variant nc - j; */
            MLP_SIMD
            for (int64_t j = 0; j < nc; j++)
                ci[j] = ci[j] + a0 * b0[j];
        }
    }
}

/* c[i*ldc + j] = +0 for i < m, j < nc (the first nc columns of m rows; mm_nn's start of an output tile). */
/*@ requires dims: 0 <= m && 0 <= nc <= ldc;
    requires c: m >= 1 ==> (m - 1) * ldc + nc <= INT64_MAX && \valid(c + (0 .. (m - 1) * ldc + nc - 1));
    terminates \true;
    assigns c[0 .. (m - 1) * ldc + nc - 1]; */
static void zero_tile(int64_t m, int64_t nc, float *c, int64_t ldc)
{
    /*@ loop invariant rows: 0 <= i <= m;
        loop assigns i, c[0 .. (m - 1) * ldc + nc - 1];
        loop variant m - i; */
    for (int64_t i = 0; i < m; i++) {
        /*@ ghost lemma_mul_monotone(i, m - 1, ldc); */
        float *ci = c + i * ldc;
        /*@ loop invariant cols: 0 <= j <= nc;
            loop assigns j, c[0 .. (m - 1) * ldc + nc - 1];
            loop variant nc - j; */
        for (int64_t j = 0; j < nc; j++)
            ci[j] = 0.0f;
    }
}

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
static void mm_nn_f32(int64_t m, int64_t n, int64_t kk, const float *A, int64_t ars, int64_t acs, const float *B,
                      int64_t ldb, float *C, int64_t ldc)
{
    /*@ loop invariant tiles: 0 <= j0 < n + NC;
        loop assigns j0, C[0 .. m * ldc - 1];
        loop variant n - j0; */
    for (int64_t j0 = 0; j0 < n; j0 += NC) {
        const int64_t nc = n - j0 < NC ? n - j0 : NC;
        /*@ ghost if (m >= 1) lemma_row_fits(m - 1, m, ldc); */
        zero_tile(m, nc, C + j0, ldc);
        /*@ loop invariant depth: 0 <= p0 < kk + PC;
            loop assigns p0, C[0 .. m * ldc - 1];
            loop variant kk - p0; */
        for (int64_t p0 = 0; p0 < kk; p0 += PC) {
            const int64_t pc = kk - p0 < PC ? kk - p0 : PC;
            /*@ ghost lemma_mul_monotone(p0 + pc - 1, kk - 1, ldb); */
            /*@ ghost lemma_mul_monotone(p0, p0 + pc - 1, ldb); */
            /*@ ghost lemma_row_fits(p0 + pc - 1, kk, ldb); */
            /*@ ghost lemma_mul_monotone(p0, kk - 1, acs); */
            /*@ ghost lemma_mul_monotone(p0 + pc - 1, kk - 1, acs); */
            /*@ ghost if (m >= 1) lemma_row_fits(m - 1, m, ldc); */
            mm_nn_tile(m, nc, pc, A + p0 * acs, ars, acs, B + p0 * ldb + j0, ldb, C + j0, ldc);
        }
    }
}

/* C[i*ldc + j] = sum_{p = 0 .. kk-1 ascending} A[i*ars + p*acs] * B(p, j)   for i < m, j < n,
 * B(p, j) = element boff + p*ldb + j of a tensor of dtype bdt: an f32 tensor through mm_nn_f32 in place;
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
static void mm_nn(int64_t m, int64_t n, int64_t kk, const float *A, int64_t ars, int64_t acs, moe_dtype bdt,
                  const void *B, int64_t boff, int64_t ldb, float *C, int64_t ldc, float *bbuf)
{
    if (bdt == MOE_F32) {
        mm_nn_f32(m, n, kk, A, ars, acs, f32_elements(B, boff) /*@ ghost (kk * ldb) */, ldb, C, ldc);
        return;
    }
    /*@ loop invariant tiles: 0 <= j0 < n + NC;
        loop assigns j0, C[0 .. m * ldc - 1], bbuf[0 .. PC * NC - 1];
        loop variant n - j0; */
    for (int64_t j0 = 0; j0 < n; j0 += NC) {
        const int64_t nc = n - j0 < NC ? n - j0 : NC;
        /*@ ghost if (m >= 1) lemma_row_fits(m - 1, m, ldc); */
        zero_tile(m, nc, C + j0, ldc);
        /*@ loop invariant depth: 0 <= p0 < kk + PC;
            loop assigns p0, C[0 .. m * ldc - 1], bbuf[0 .. PC * NC - 1];
            loop variant kk - p0; */
        for (int64_t p0 = 0; p0 < kk; p0 += PC) {
            const int64_t pc = kk - p0 < PC ? kk - p0 : PC;
            /*@ ghost lemma_mul_monotone(p0 + pc - 1, kk - 1, ldb); */
            /*@ ghost lemma_mul_monotone(p0, p0 + pc - 1, ldb); */
            /*@ loop invariant converted: 0 <= q <= pc;
                loop assigns q, bbuf[0 .. PC * NC - 1];
                loop variant pc - q; */
            for (int64_t q = 0; q < pc; q++) {
                /*@ ghost lemma_mul_monotone(p0 + q, kk - 1, ldb); */
                /*@ ghost lemma_row_fits(q, PC, NC); */
                row_f32(bdt, B, boff + (p0 + q) * ldb + j0, nc, bbuf + q * NC);
            }
            /*@ ghost lemma_mul_monotone(p0, kk - 1, acs); */
            /*@ ghost lemma_mul_monotone(p0 + pc - 1, kk - 1, acs); */
            /*@ ghost if (m >= 1) lemma_row_fits(m - 1, m, ldc); */
            mm_nn_tile(m, nc, pc, A + p0 * acs, ars, acs, bbuf, NC, C + j0, ldc);
        }
    }
}

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
static void mm_wn(int64_t m, int64_t n, int64_t kk, moe_dtype wdt, const void *W, int64_t woff, int64_t ldw,
                  const float *B, int64_t ldb, float *C, int64_t ldc, float *wrow)
{
    /*@ loop invariant rows: 0 <= i <= m;
        loop assigns i, C[0 .. m * ldc - 1], wrow[0 .. kk - 1];
        loop variant m - i; */
    for (int64_t i = 0; i < m; i++) {
        /*@ ghost lemma_row_fits(i, m, ldw); */
        /*@ ghost lemma_row_fits(i, m, ldc); */
        const float *w = row_f32(wdt, W, woff + i * ldw, kk, wrow);
        /*@ loop invariant tiles: 0 <= j0 < n + NC;
            loop assigns j0, C[0 .. m * ldc - 1];
            loop variant n - j0; */
        for (int64_t j0 = 0; j0 < n; j0 += NC) {
            const int64_t nc = n - j0 < NC ? n - j0 : NC;
            float *restrict c = C + i * ldc + j0;
            /*@ loop invariant zeroed: 0 <= j <= nc;
                loop assigns j, C[0 .. m * ldc - 1];
                loop variant nc - j; */
            for (int64_t j = 0; j < nc; j++)
                c[j] = 0.0f;
            /*@ ghost if (kk >= 1) lemma_mul_monotone(kk - 1, kk, ldb); */
            mm_nn_tile(1, nc, kk, w, 0, 1, B + j0, ldb, c, ldc);
        }
    }
}

/* dst[j*m + i] = src[i*lds + j] for i < m, j < n (float32), in 32 x 32 tiles.
 *   src [m][lds] (the first n columns are read), dst [n][m] */
/*@ requires dims: 0 <= m <= INT64_MAX - 32 && 0 <= n <= INT64_MAX - 32 && n <= lds;
    requires sizes: m * lds <= INT64_MAX && m * n <= INT64_MAX;
    requires src: \valid_read(src + (0 .. m * lds - 1));
    requires dst: \valid(dst + (0 .. m * n - 1));
    terminates \true;
    assigns dst[0 .. m * n - 1]; */
static void transpose(int64_t m, int64_t n, const float *src, int64_t lds, float *dst)
{
    enum { TB = 32 };
    /*@ loop invariant tile_rows: 0 <= i0 < m + TB;
        loop assigns i0, dst[0 .. m * n - 1];
        loop variant m - i0; */
    for (int64_t i0 = 0; i0 < m; i0 += TB)
        /*@ loop invariant tile_cols: 0 <= j0 < n + TB;
            loop assigns j0, dst[0 .. m * n - 1];
            loop variant n - j0; */
        for (int64_t j0 = 0; j0 < n; j0 += TB)
            /*@ loop invariant row: i0 <= i <= m;
                loop assigns i, dst[0 .. m * n - 1];
                loop variant m - i; */
            for (int64_t i = i0; i < m && i < i0 + TB; i++)
                /*@ loop invariant col: j0 <= j <= n;
                    loop assigns j, dst[0 .. m * n - 1];
                    loop variant n - j; */
                for (int64_t j = j0; j < n && j < j0 + TB; j++) {
                    /*@ ghost lemma_row_fits(j, n, m); */
                    /*@ ghost lemma_row_fits(i, m, lds); */
                    dst[j * m + i] = src[i * lds + j];
                }
}

/* sum_{i ascending} a[i] * b[i]   a [n], b [n] */
/*@ requires count: n >= 0;
    requires a: \valid_read(a + (0 .. n - 1));
    requires b: \valid_read(b + (0 .. n - 1));
    terminates \true;
    assigns \nothing; */
static float dot_seq(const float *a, const float *b, int64_t n)
{
    float acc = 0.0f;
    /*@ loop invariant bounds: 0 <= i <= n;
        loop assigns i, acc;
        loop variant n - i; */
    for (int64_t i = 0; i < n; i++)
        acc = acc + a[i] * b[i];
    return acc;
}

/* ---------------------------------------------------------------------------------------------------
 * activations and clamps
 * ------------------------------------------------------------------------------------------------- */
/* Contracts: they terminate and write nothing but errno (expf may set ERANGE on overflow, C11 7.12.1);
 * the float results are checked by the property tests against the float64 oracle, not proved. */
/*@ terminates \true;
    assigns errno; */
static inline float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

static const float SWISH_ALPHA = 1.702f;
static const float SQRT_HALF = 0.70710678118654752440f;
static const float INV_SQRT_2PI = 0.39894228040143267794f;
static const float SQRT_2_OVER_PI = 0.79788456080286535588f;
static const float GELU_TANH_C = 0.044715f;

/*@ terminates \true;
    assigns errno;
    ensures identity: act != MOE_ACT_SILU && act != MOE_ACT_GELU && act != MOE_ACT_GELU_TANH &&
      act != MOE_ACT_SWISH ==> \result == x; */
static inline float act_value(moe_mlp_activation act, float x)
{
    switch (act) {
    case MOE_ACT_SILU: return x * sigmoidf_(x);
    case MOE_ACT_GELU: return 0.5f * x * (1.0f + erff(x * SQRT_HALF));
    case MOE_ACT_GELU_TANH: return 0.5f * x * (1.0f + tanhf(SQRT_2_OVER_PI * (x + GELU_TANH_C * x * x * x)));
    case MOE_ACT_SWISH: return x * sigmoidf_(SWISH_ALPHA * x);
    }
    return x;
}

/*@ terminates \true;
    assigns errno;
    ensures identity: act != MOE_ACT_SILU && act != MOE_ACT_GELU && act != MOE_ACT_GELU_TANH &&
      act != MOE_ACT_SWISH ==> \result == 1.0f; */
static inline float act_derivative(moe_mlp_activation act, float x)
{
    switch (act) {
    case MOE_ACT_SILU: {
        const float s = sigmoidf_(x);
        return s * (1.0f + x * (1.0f - s));
    }
    case MOE_ACT_GELU:
        return 0.5f * (1.0f + erff(x * SQRT_HALF)) + x * (INV_SQRT_2PI * expf(-0.5f * x * x));
    case MOE_ACT_GELU_TANH: {
        const float x2 = x * x;
        const float t = tanhf(SQRT_2_OVER_PI * (x + GELU_TANH_C * x2 * x));
        return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_TANH_C * x2);
    }
    case MOE_ACT_SWISH: {
        const float s = sigmoidf_(SWISH_ALPHA * x);
        return s * (1.0f + SWISH_ALPHA * x * (1.0f - s));
    }
    }
    return 1.0f;
}

/* Clamps keep NaN (a comparison with NaN is false).  Each limit applies only when its flag is set; a NaN
 * limit clamps nothing.  The comparisons are IEEE's (\lt_float, \le_float: false with a NaN operand);
 * same_float (specs/mlp.acsl) is IEEE equality or both NaN. */
/*@ terminates \true;
    assigns \nothing;
    ensures nan_kept: \is_NaN(v) ==> \is_NaN(\result);
    ensures unchanged: (has_lo == 0 || !\lt_float(v, lo)) && (has_hi == 0 || !\gt_float(v, hi)) ==>
      same_float(\result, v);
    ensures at_least_lo: has_lo != 0 && !\is_NaN(v) && !\is_NaN(lo) &&
      (has_hi == 0 || \is_NaN(hi) || \le_float(lo, hi)) ==> \le_float(lo, \result);
    ensures at_most_hi: has_hi != 0 && !\is_NaN(v) && !\is_NaN(hi) ==> \le_float(\result, hi);
    ensures a_limit: same_float(\result, v) || (has_lo != 0 && same_float(\result, lo)) ||
      (has_hi != 0 && same_float(\result, hi)); */
static inline float clamp_(float v, int has_lo, float lo, int has_hi, float hi)
{
    if (has_lo && v < lo)
        v = lo;
    if (has_hi && v > hi)
        v = hi;
    return v;
}

/* The limit as the checkpoint stores it: a clamped value is stored as round(limit). */
/*@ terminates \true;
    assigns \nothing;
    ensures f32_exact: dtype != MOE_F16 && dtype != MOE_BF16 ==> \result == v; */
static float round_to(moe_dtype dtype, float v)
{
    switch (dtype) {
    case MOE_F16: return moe_f16_to_f32(moe_f32_to_f16(v));
    case MOE_BF16: return moe_bf16_to_f32(moe_f32_to_bf16(v));
    case MOE_F32: break;
    }
    return v;
}

/* options.round_intermediates: rounds count float32 values in place to the dtype and back (round to
 * nearest even; identity for f32), once each: the operands of the second-stage GEMMs (specs/MLP.md,
 * "Rounded intermediates").   v [count] */
/*@ requires dtype: dtype_ok(dtype);
    requires count: count >= 0;
    requires v: \valid(v + (0 .. count - 1));
    terminates \true;
    assigns v[0 .. count - 1]; */
static void round_row(moe_dtype dtype, float *v, int64_t count)
{
    switch (dtype) {
    case MOE_F32: return;
    case MOE_BF16:
        /*@ loop invariant bounds: 0 <= i <= count;
            loop assigns i, v[0 .. count - 1];
            loop variant count - i; */
        for (int64_t i = 0; i < count; i++)
            v[i] = bf16_to_f32(f32_to_bf16(v[i]));
        return;
    case MOE_F16:
        /*@ loop invariant bounds: 0 <= i <= count;
            loop assigns i, v[0 .. count - 1];
            loop variant count - i; */
        for (int64_t i = 0; i < count; i++)
            v[i] = moe_f16_to_f32(moe_f32_to_f16(v[i]));
        return;
    }
}

/* ---------------------------------------------------------------------------------------------------
 * slots: valid positions numbered in ascending position, grouped by expert and by token
 * ------------------------------------------------------------------------------------------------- */
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

/* The slot index of a checked layout (ids = token_position_to_id [N*B], b2e = block_to_expert [N]), as
 * build_index's proved cores fill it (count_tokens, number_slots, bucket_positions, largest_bucket). */
/*@ predicate slot_index_ok{L}(slot_index *x, int64_t *ids, integer T, integer E, integer N, integer B) =
      \valid_read(x) && 0 <= x->count &&
      \valid(x->pos + (0 .. x->count - 1)) && in_range(x->pos, x->count, 0, N * B) &&
      \valid(x->token + (0 .. x->count - 1)) && in_range(x->token, x->count, 0, T) &&
      \valid(x->expert_start + (0 .. E)) && x->expert_start[0] == 0 && x->expert_start[E] == x->count &&
      sorted_offsets(x->expert_start, E) &&
      \valid(x->expert_slots + (0 .. x->count - 1)) && in_range(x->expert_slots, x->count, 0, x->count) &&
      \valid(x->token_start + (0 .. T)) && x->token_start[0] == 0 && x->token_start[T] == x->count &&
      sorted_offsets(x->token_start, T) &&
      \valid(x->token_slots + (0 .. x->count - 1)) && in_range(x->token_slots, x->count, 0, x->count) &&
      \valid(x->block_start + (0 .. E)) && x->block_start[0] == 0 && x->block_start[E] == N &&
      sorted_offsets(x->block_start, E) &&
      \valid(x->expert_blocks + (0 .. N - 1)) && in_range(x->expert_blocks, N, 0, N) &&
      0 <= x->max_slots &&
      \forall integer e; 0 <= e < E ==> x->expert_start[e + 1] - x->expert_start[e] <= x->max_slots;
*/

/* Frees the arrays of a slot index (each NULL or allocated by build_index).  Contract stated, not proved:
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
static void free_index(slot_index *x)
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

/*@ requires p: \valid_read(p);
    terminates \true;
    assigns \nothing;
    ensures token: \result != 0 <==> 0 <= id < p->T; */
static int is_token(const moe_mlp_problem *p, int64_t id) { return id >= 0 && id < p->T; }

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
 * entries, ascending.  build_index sorts three ways with it: slots by expert (filter = ids, map = b2e,
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

/* The arrays of build_index_in are apart because each is its own allocation (build_index mallocs them one
 * by one; the layout's ids and b2e are the caller's): distinct base addresses, one fact per pair (ids and b2e,
 * both read only, may share one).  Stated so rather than as \separated ranges: WP's separated(p, n, q, m) is
 * a disjunction (an empty range, distinct bases, or disjoint offsets), and with 45 of them among the
 * hypotheses Z3 ran out of memory (CVC4 timed out) framing fill_index's facts across its second and third
 * calls; a base inequality is a unit fact that closes each disjunction at once. */
/*@ predicate index_bases(int64_t *pos, int64_t *token, int64_t *es, int64_t *esl, int64_t *ts, int64_t *tsl,
                          int64_t *bs, int64_t *eb, int64_t *cursor, int64_t *ids, int64_t *b2e) =
      \base_addr(pos) != \base_addr(token) && \base_addr(pos) != \base_addr(es) &&
      \base_addr(pos) != \base_addr(esl) && \base_addr(pos) != \base_addr(ts) &&
      \base_addr(pos) != \base_addr(tsl) && \base_addr(pos) != \base_addr(bs) &&
      \base_addr(pos) != \base_addr(eb) && \base_addr(pos) != \base_addr(cursor) &&
      \base_addr(pos) != \base_addr(ids) && \base_addr(pos) != \base_addr(b2e) &&
      \base_addr(token) != \base_addr(es) && \base_addr(token) != \base_addr(esl) &&
      \base_addr(token) != \base_addr(ts) && \base_addr(token) != \base_addr(tsl) &&
      \base_addr(token) != \base_addr(bs) && \base_addr(token) != \base_addr(eb) &&
      \base_addr(token) != \base_addr(cursor) && \base_addr(token) != \base_addr(ids) &&
      \base_addr(token) != \base_addr(b2e) &&
      \base_addr(es) != \base_addr(esl) && \base_addr(es) != \base_addr(ts) &&
      \base_addr(es) != \base_addr(tsl) && \base_addr(es) != \base_addr(bs) &&
      \base_addr(es) != \base_addr(eb) && \base_addr(es) != \base_addr(cursor) &&
      \base_addr(es) != \base_addr(ids) && \base_addr(es) != \base_addr(b2e) &&
      \base_addr(esl) != \base_addr(ts) && \base_addr(esl) != \base_addr(tsl) &&
      \base_addr(esl) != \base_addr(bs) && \base_addr(esl) != \base_addr(eb) &&
      \base_addr(esl) != \base_addr(cursor) && \base_addr(esl) != \base_addr(ids) &&
      \base_addr(esl) != \base_addr(b2e) &&
      \base_addr(ts) != \base_addr(tsl) && \base_addr(ts) != \base_addr(bs) &&
      \base_addr(ts) != \base_addr(eb) && \base_addr(ts) != \base_addr(cursor) &&
      \base_addr(ts) != \base_addr(ids) && \base_addr(ts) != \base_addr(b2e) &&
      \base_addr(tsl) != \base_addr(bs) && \base_addr(tsl) != \base_addr(eb) &&
      \base_addr(tsl) != \base_addr(cursor) && \base_addr(tsl) != \base_addr(ids) &&
      \base_addr(tsl) != \base_addr(b2e) &&
      \base_addr(bs) != \base_addr(eb) && \base_addr(bs) != \base_addr(cursor) &&
      \base_addr(bs) != \base_addr(ids) && \base_addr(bs) != \base_addr(b2e) &&
      \base_addr(eb) != \base_addr(cursor) && \base_addr(eb) != \base_addr(ids) &&
      \base_addr(eb) != \base_addr(b2e) &&
      \base_addr(cursor) != \base_addr(ids) && \base_addr(cursor) != \base_addr(b2e);
*/

/* build_index_in on the arrays themselves (formals, not x's fields: shorter goals): the slots by expert
 * (index_by_expert) and by token (index_by_token), then the blocks by expert (bucket_sort of
 * block_to_expert); returns max_slots.  The arrays as in index_scratch_ok: apart by distinct base addresses
 * (index_bases).  Proved (2026-11-25; until then its frame goals timed out: specs/README.md, build_index_in's
 * row): index_by_expert's facts are restated after index_by_token one by one (`*_kept`), and the two starts
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

/* The arrays of a slot index and the cursor scratch as build_index allocates them, for V slots of a
 * problem with T tokens, E experts, N blocks, NB = N*B positions: valid, the three starts zeroed (calloc),
 * each its own allocation (index_bases: distinct base addresses, also from the layout's arrays ids [NB] and
 * b2e [N], which build_index_in reads), and none in the object of the index itself (x: the caller's local).
 * (Until 2026-11-25 as pairwise \separated ranges; see index_bases for why not.) */
/*@ predicate index_scratch_ok{L}(slot_index *x, int64_t *cursor, int64_t *ids, int64_t *b2e, integer V,
                                  integer T, integer E, integer N, integer NB) =
      \valid(x->pos + (0 .. V - 1)) && \valid(x->token + (0 .. V - 1)) &&
      \valid(x->expert_start + (0 .. E)) && \valid(x->expert_slots + (0 .. V - 1)) &&
      \valid(x->token_start + (0 .. T)) && \valid(x->token_slots + (0 .. V - 1)) &&
      \valid(x->block_start + (0 .. E)) && \valid(x->expert_blocks + (0 .. N - 1)) &&
      \valid(cursor + (0 .. (E > T ? E : T) - 1)) &&
      (\forall integer k; 0 <= k <= E ==> x->expert_start[k] == 0 && x->block_start[k] == 0) &&
      (\forall integer k; 0 <= k <= T ==> x->token_start[k] == 0) &&
      index_bases(x->pos, x->token, x->expert_start, x->expert_slots, x->token_start, x->token_slots,
                  x->block_start, x->expert_blocks, cursor, ids, b2e) &&
      \base_addr(x) != \base_addr(x->pos) && \base_addr(x) != \base_addr(x->token) &&
      \base_addr(x) != \base_addr(x->expert_start) && \base_addr(x) != \base_addr(x->expert_slots) &&
      \base_addr(x) != \base_addr(x->token_start) && \base_addr(x) != \base_addr(x->token_slots) &&
      \base_addr(x) != \base_addr(x->block_start) && \base_addr(x) != \base_addr(x->expert_blocks) &&
      \base_addr(x) != \base_addr(cursor) && \base_addr(x) != \base_addr(ids) && \base_addr(x) != \base_addr(b2e);
*/

/* Fills the slot index of a checked layout into arrays the caller allocated (build_index): the layout
 * ids = token_position_to_id [N*B] (a token in [0, T) or not a token), b2e = block_to_expert [N] (in
 * [0, E)); x->count = the slots V (count_tokens), x's eight arrays and cursor [max(E, T)] scratch, any of
 * them NULL (not allocated): MOE_ERR_OUT_OF_MEMORY with the message build_index always gave (op: the
 * caller's name).  Proved (2026-11-25, with fill_index; the arrays apart by distinct base addresses:
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
static moe_status build_index(const moe_mlp_problem *p, slot_index *x)
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
        free_index(x);
    return status;
}

/* ---------------------------------------------------------------------------------------------------
 * per-thread workspaces
 * ------------------------------------------------------------------------------------------------- */
/* team_size, team_member, copy_floats: ref/ref_threads.h. */

/* Threads for a call: one for small problems (below ~2^18 multiply-adds the fork/join costs more than
 * it saves, and on a loaded machine a barrier can wait a whole time slice).  The result does not
 * depend on the choice. */
/*@ requires dims: H < INT64_MAX && I < INT64_MAX;
    terminates \true;
    assigns \nothing;
    ensures positive: \result >= 1; */
static int threads_for(int64_t slots, int64_t H, int64_t I)
{
    const double work = (double)slots * (double)(H + 1) * (double)(I + 1) * 3.0;
    return work < 262144.0 ? 1 : team_size();
}

/* One float32 arena per thread, carved into named pieces. */
typedef struct arena {
    float *base;
    size_t per_thread;
} arena;

/* Allocates threads arenas of at least floats_per_thread + 16 floats each (a multiple of 16: threads
 * never share a cache line).  Contract stated, not proved (malloc: WP 25 has no model of allocation).
 * Fails (0) when threads * per_thread floats, per_thread rounded up, would not fit in size_t bytes: the
 * bound is checked after the rounding, which adds up to 31 floats per thread (checked before it, 4 threads
 * of 2^60 - 17 floats passed and the byte count wrapped to 0; an audit, 2026-11-29). */
/*@ requires a: \valid(a);
    requires threads: threads >= 1;
    terminates \true;
    assigns a->base, a->per_thread, __fc_heap_status;
    allocates a->base;
    ensures allocated: \result != 0 <==> a->base != \null;
    ensures per_thread: \result != 0 ==> a->per_thread >= floats_per_thread + 16 && a->per_thread % 16 == 0;
    ensures bounded: \result != 0 ==> threads * a->per_thread <= SIZE_MAX / 4;
    ensures arena: \result != 0 ==> \valid(a->base + (0 .. threads * a->per_thread - 1)); */
static int arena_alloc(arena *a, int threads, size_t floats_per_thread)
{
    a->base = NULL;
    if (floats_per_thread > SIZE_MAX / sizeof(float) - 32)
        return 0;
    /* round up to a cache line so that threads never share one */
    a->per_thread = (floats_per_thread + 15) / 16 * 16 + 16;
    if (a->per_thread > SIZE_MAX / sizeof(float) / (size_t)threads)
        return 0;
    a->base = malloc((size_t)threads * a->per_thread * sizeof(float));
    return a->base != NULL;
}

/* The next piece of count floats of an arena: *cursor, which moves on by count rounded up to 16. */
/*@ requires cursor: \valid(cursor);
    requires count: 0 <= count <= INT64_MAX - 15;
    requires room: \valid(*cursor + (0 .. (count + 15) / 16 * 16 - 1));
    terminates \true;
    assigns *cursor \from *cursor, count;
    assigns \result \from *cursor;
    ensures piece: \result == \old(*cursor) && \valid(\result + (0 .. count - 1));
    ensures moved: *cursor == \old(*cursor) + (count + 15) / 16 * 16; */
static float *carve(float **cursor, int64_t count)
{
    float *piece = *cursor;
    *cursor += (count + 15) / 16 * 16;
    return piece;
}

/* malloc of count floats (at least one); NULL when the size is past any real memory.  Contract stated, not
 * proved (malloc: WP 25 has no model of allocation). */
/*@ requires dims: 0 <= a && 0 <= b;
    terminates \true;
    assigns __fc_heap_status \from a, b, __fc_heap_status;
    assigns \result \from a, b, __fc_heap_status;
    allocates \result;
    ensures floats: \result != \null ==> \valid(\result + (0 .. a * b)); */
static float *alloc_floats(int64_t a, int64_t b)
{
    if ((double)a * (double)b > 0x1p60)
        return NULL;
    return malloc(((size_t)a * (size_t)b + 1) * sizeof(float));
}

/*@ terminates \true;
    assigns \nothing;
    ensures largest: \result >= a && \result >= b && \result >= c;
    ensures one_of: \result == a || \result == b || \result == c; */
static int64_t max3(int64_t a, int64_t b, int64_t c)
{
    int64_t m = a > b ? a : b;
    return m > c ? m : c;
}

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
static void gather_rows(moe_dtype dtype, const void *src, const int64_t *slots, const int64_t *tok, int64_t n,
                        int64_t H, float *dst) /*@ ghost (int64_t V, int64_t rows) */
{
    /*@ loop invariant bounds: 0 <= i <= n;
        loop assigns i, dst[0 .. n * H - 1];
        loop variant n - i; */
    for (int64_t i = 0; i < n; i++) {
        /*@ ghost lemma_row_fits(tok[slots[i]], rows, H); */
        /*@ ghost lemma_row_fits(i, n, H); */
        load_f32(dtype, src, tok[slots[i]] * H, H, dst + i * H);
    }
}

/* ---------------------------------------------------------------------------------------------------
 * forward
 * ------------------------------------------------------------------------------------------------- */
/* act_value with its contract reduced to termination and errno: with act_value's float postcondition
 * (`identity`) among the hypotheses, Z3 and CVC4 timed out on plain index goals of the loops that call it. */
/*@ terminates \true;
    assigns errno; */
static inline float act_of(moe_mlp_activation act, float x)
{
    return act_value(act, x);
}

/* The forward's per-thread scratch, carved from the thread's arena by fwd_thread (n_max: the most slots of
 * one expert): X, D [n_max][H]; GU [n_max][2I]; M [n_max][I]; with ON_I M0 [n_max][I] and D0 [n_max][H]
 * (else NULL); a [n_max]; bgu [2I]; bd [H]; bbuf [PC*NC]. */
typedef struct fwd_scratch {
    float *X, *D, *GU, *M, *M0, *D0, *a, *bgu, *bd, *bbuf;
} fwd_scratch;

/*@ // The forward's dims as values (the fields of a problem with mlp_problem_ok; V slots, n_max the most
    // slots of one expert): every index the forward computes fits in int64.  A predicate of values, so that
    // the provers carry it across writes by congruence (specs/README.md, notes).
    predicate fwd_dims(integer T, integer E, integer N, integer B, integer H, integer I, integer V,
                       integer n_max, integer rows) =
      0 <= T <= rows && 1 <= E && 0 <= N && 1 <= B && 0 <= H && 0 <= I && 0 <= V && 0 <= n_max &&
      H <= SIZE_MAX / 64 && 2 * I <= SIZE_MAX / 64 && T * E <= INT64_MAX && E * H <= INT64_MAX &&
      E * (2 * I) <= INT64_MAX && E * I <= INT64_MAX && E * H * (2 * I) <= INT64_MAX && E * I * H <= INT64_MAX &&
      N * B <= INT64_MAX && N * (2 * I) <= INT64_MAX && N * B * H <= INT64_MAX && N * (2 * I) * B <= INT64_MAX &&
      rows * H <= INT64_MAX && V * H <= INT64_MAX && n_max * H <= INT64_MAX && n_max * (2 * I) <= INT64_MAX &&
      n_max * I <= INT64_MAX;

    // the scratch s for n_max slots and the per-slot contributions contrib [V][H]: valid, pairwise apart
    predicate fwd_scratch_ok{L}(fwd_scratch *s, float *contrib, integer V, integer n_max, integer H, integer I,
                                integer on_i) =
      \valid_read(s) && \valid(contrib + (0 .. V * H - 1)) &&
      \valid(s->X + (0 .. n_max * H - 1)) && \valid(s->D + (0 .. n_max * H - 1)) &&
      \valid(s->GU + (0 .. n_max * (2 * I) - 1)) && \valid(s->M + (0 .. n_max * I - 1)) &&
      \valid(s->M0 + (0 .. (on_i != 0 ? n_max * I : 0) - 1)) &&
      \valid(s->D0 + (0 .. (on_i != 0 ? n_max * H : 0) - 1)) &&
      \valid(s->a + (0 .. n_max - 1)) && \valid(s->bgu + (0 .. 2 * I - 1)) && \valid(s->bd + (0 .. H - 1)) &&
      \valid(s->bbuf + (0 .. PC * NC - 1)) &&
      \separated(s->X + (0 .. n_max * H - 1), s->D + (0 .. n_max * H - 1), s->GU + (0 .. n_max * (2 * I) - 1),
                 s->M + (0 .. n_max * I - 1), s->M0 + (0 .. (on_i != 0 ? n_max * I : 0) - 1),
                 s->D0 + (0 .. (on_i != 0 ? n_max * H : 0) - 1), s->a + (0 .. n_max - 1),
                 s->bgu + (0 .. 2 * I - 1), s->bd + (0 .. H - 1), s->bbuf + (0 .. PC * NC - 1),
                 contrib + (0 .. V * H - 1));
*/

/* One padding position (block blk, row b): its gate/up checkpoint column and its down checkpoint row +0.
 *   gate_up_ckpt_T [N][2I][B], down_ckpt [N*B][H] of dtype dt, each NULL when not requested */
/*@ requires dims: 0 <= N && 1 <= B && 0 <= H && 0 <= I2 && N * B <= INT64_MAX && N * I2 <= INT64_MAX &&
      N * B * H <= INT64_MAX && N * I2 * B <= INT64_MAX;
    requires position: 0 <= blk < N && 0 <= b < B;
    requires dtype: dtype_ok(dt);
    requires gate_up: gate_up_ckpt_T != \null ==> tensor_writable((char *)gate_up_ckpt_T, N * I2 * B, dt);
    requires down: down_ckpt != \null ==> tensor_writable((char *)down_ckpt, N * B * H, dt);
    terminates \true;
    assigns ((char *)gate_up_ckpt_T)[0 .. (gate_up_ckpt_T == \null ? 0 : byte_offset(N * I2 * B, dt)) - 1],
      ((char *)down_ckpt)[0 .. (down_ckpt == \null ? 0 : byte_offset(N * B * H, dt)) - 1]; */
static void fwd_pad_position(moe_dtype dt, int64_t B, int64_t H, int64_t I2, int64_t blk, int64_t b,
                             void *gate_up_ckpt_T, void *down_ckpt) /*@ ghost (int64_t N) */
{
    if (gate_up_ckpt_T != NULL) {
        /*@ ghost lemma_row_fits(blk, N, I2); */
        /*@ loop invariant bounds: 0 <= i <= I2;
            loop assigns i, ((char *)gate_up_ckpt_T)[0 .. byte_offset(N * I2 * B, dt) - 1];
            loop variant I2 - i; */
        for (int64_t i = 0; i < I2; i++) {
            /*@ ghost lemma_row_fits(blk * I2 + i, N * I2, B); */
            moe_ref_store(dt, gate_up_ckpt_T, (blk * I2 + i) * B + b, 0.0f);
        }
    }
    if (down_ckpt != NULL) {
        /*@ ghost lemma_row_fits(blk, N, B); */
        /*@ ghost lemma_row_fits(blk * B + b, N * B, H); */
        /*@ loop invariant bounds: 0 <= h <= H;
            loop assigns h, ((char *)down_ckpt)[0 .. byte_offset(N * B * H, dt) - 1];
            loop variant H - h; */
        for (int64_t h = 0; h < H; h++)
            moe_ref_store(dt, down_ckpt, (blk * B + b) * H + h, 0.0f);
    }
}

/* The padding positions of one expert's blocks (blocks[q0 .. q1 - 1], each in [0, N)): checkpoints +0.
 *   ids: the layout's token_position_to_id [N*B] (p->T: the tokens) */
/*@ requires problem: \valid_read(p);
    requires dims: 0 <= N && 1 <= B && 0 <= H && 0 <= I2 && N * B <= INT64_MAX && N * I2 <= INT64_MAX &&
      N * B * H <= INT64_MAX && N * I2 * B <= INT64_MAX;
    requires dtype: dtype_ok(dt);
    requires blocks: 0 <= q0 <= q1 && \valid_read(blocks + (q0 .. q1 - 1)) &&
      \forall integer q; q0 <= q < q1 ==> 0 <= blocks[q] < N;
    requires ids: \valid_read(ids + (0 .. N * B - 1));
    requires gate_up: gate_up_ckpt_T != \null ==> tensor_writable((char *)gate_up_ckpt_T, N * I2 * B, dt) &&
      \separated((char *)gate_up_ckpt_T + (0 .. byte_offset(N * I2 * B, dt) - 1), p) &&
      \separated((char *)gate_up_ckpt_T + (0 .. byte_offset(N * I2 * B, dt) - 1), blocks + (q0 .. q1 - 1)) &&
      \separated((char *)gate_up_ckpt_T + (0 .. byte_offset(N * I2 * B, dt) - 1), ids + (0 .. N * B - 1));
    requires down: down_ckpt != \null ==> tensor_writable((char *)down_ckpt, N * B * H, dt) &&
      \separated((char *)down_ckpt + (0 .. byte_offset(N * B * H, dt) - 1), p) &&
      \separated((char *)down_ckpt + (0 .. byte_offset(N * B * H, dt) - 1), blocks + (q0 .. q1 - 1)) &&
      \separated((char *)down_ckpt + (0 .. byte_offset(N * B * H, dt) - 1), ids + (0 .. N * B - 1));
    terminates \true;
    assigns ((char *)gate_up_ckpt_T)[0 .. (gate_up_ckpt_T == \null ? 0 : byte_offset(N * I2 * B, dt)) - 1],
      ((char *)down_ckpt)[0 .. (down_ckpt == \null ? 0 : byte_offset(N * B * H, dt)) - 1]; */
static void fwd_pad(const moe_mlp_problem *p, moe_dtype dt, int64_t B, int64_t H, int64_t I2, const int64_t *ids,
                    const int64_t *blocks, int64_t q0, int64_t q1, void *gate_up_ckpt_T, void *down_ckpt)
    /*@ ghost (int64_t N) */
{
    /*@ loop invariant bounds: q0 <= q <= \max(q0, q1);
        loop assigns q, ((char *)gate_up_ckpt_T)[0 .. (gate_up_ckpt_T == \null ? 0 : byte_offset(N * I2 * B, dt)) - 1],
          ((char *)down_ckpt)[0 .. (down_ckpt == \null ? 0 : byte_offset(N * B * H, dt)) - 1];
        loop variant q1 - q; */
    for (int64_t q = q0; q < q1; q++) {
        const int64_t blk = blocks[q];
        /*@ ghost lemma_row_fits(blk, N, B); */
        /*@ loop invariant bounds: 0 <= b <= B;
            loop assigns b, ((char *)gate_up_ckpt_T)[0 .. (gate_up_ckpt_T == \null ? 0 : byte_offset(N * I2 * B, dt)) - 1],
              ((char *)down_ckpt)[0 .. (down_ckpt == \null ? 0 : byte_offset(N * B * H, dt)) - 1];
            loop variant B - b; */
        for (int64_t b = 0; b < B; b++) {
            if (is_token(p, ids[blk * B + b]))
                continue;
            fwd_pad_position(dt, B, H, I2, blk, b, gate_up_ckpt_T, down_ckpt) /*@ ghost (N) */;
        }
    }
}

/* One slot's gate/up row gu [2I] after the GEMM: + bgu (with bias), clamped (gate j < I: the non-linear
 * limits; up: the linear ones), stored back and, when requested, checkpointed at position (blk, b) of
 * gate_up_ckpt_T [N][2I][B]. */
/*@ requires problem: \valid_read(p);
    requires dims: 0 <= N && 1 <= B && 0 <= I && 2 * I <= INT64_MAX && N * (2 * I) <= INT64_MAX &&
      N * (2 * I) * B <= INT64_MAX;
    requires position: 0 <= blk < N && 0 <= b < B;
    requires dtype: dtype_ok(dt);
    requires gu: \valid(gu + (0 .. 2 * I - 1)) && \separated(gu + (0 .. 2 * I - 1), p);
    requires bgu: \valid_read(bgu + (0 .. 2 * I - 1));
    requires gate_up: gate_up_ckpt_T != \null ==> tensor_writable((char *)gate_up_ckpt_T, N * (2 * I) * B, dt) &&
      \separated((char *)gate_up_ckpt_T + (0 .. byte_offset(N * (2 * I) * B, dt) - 1), p);
    terminates \true;
    assigns gu[0 .. 2 * I - 1],
      ((char *)gate_up_ckpt_T)[0 .. (gate_up_ckpt_T == \null ? 0 : byte_offset(N * (2 * I) * B, dt)) - 1]; */
static void fwd_gate_up_row(const moe_mlp_problem *p, moe_dtype dt, int64_t B, int64_t I, float *gu,
                            const float *bgu, void *gate_up_ckpt_T, int64_t blk, int64_t b) /*@ ghost (int64_t N) */
{
    const int64_t I2 = 2 * I;
    /*@ ghost lemma_row_fits(blk, N, I2); */
    /*@ ghost const int64_t NI2 = N * I2; */
    const int64_t row0 = blk * I2; /* the checkpoint's rows (blk, j) start here */
    /*@ loop invariant bounds: 0 <= j <= I2;
        loop assigns j, gu[0 .. I2 - 1],
          ((char *)gate_up_ckpt_T)[0 .. (gate_up_ckpt_T == \null ? 0 : byte_offset(N * I2 * B, dt)) - 1];
        loop variant I2 - j; */
    for (int64_t j = 0; j < I2; j++) {
        const int64_t r = row0 + j;
        /*@ ghost lemma_row_fits(r, NI2, B); */
        /* the checkpoint element (blk * 2I + j) * B + b, computed before the float operations (with their facts
         * in the context, and the index as one expression, the provers failed on its overflow goals) */
        const int64_t k = r * B + b;
        float v = p->bias ? gu[j] + bgu[j] : gu[j];
        v = j < I ? clamp_(v, p->has_nl_lo, p->nl_lo, p->has_nl_hi, p->nl_hi)
                  : clamp_(v, p->has_lin_lo, p->lin_lo, p->has_lin_hi, p->lin_hi);
        gu[j] = v;
        if (gate_up_ckpt_T != NULL)
            moe_ref_store(dt, gate_up_ckpt_T, k, v);
    }
}

/* One slot's activation row: m [I] = act(g) * u from its clamped gate/up row gu [2I]; with ON_I the
 * unscaled m is copied to m0 [I] (write_d0: for the down checkpoint; rounded with round_intermediates) and
 * m scaled by the slot's affinity a[i]; m rounded with round_intermediates. */
/*@ requires problem: \valid_read(p);
    requires dims: 0 <= I && 2 * I <= INT64_MAX && 0 <= i;
    requires dtype: dtype_ok(dt);
    requires rows: \valid_read(gu + (0 .. 2 * I - 1)) && \valid(m + (0 .. I - 1)) && \valid_read(a + i);
    requires m0: write_d0 != 0 ==> \valid(m0 + (0 .. I - 1)) &&
      \separated(m0 + (0 .. I - 1), m + (0 .. I - 1), p);
    requires apart: \separated(m + (0 .. I - 1), gu + (0 .. 2 * I - 1), a + i, p);
    terminates \true;
    assigns m[0 .. I - 1], m0[0 .. (write_d0 != 0 ? I : 0) - 1], errno; */
static void fwd_act_row(const moe_mlp_problem *p, moe_dtype dt, int64_t I, const float *gu, float *m, float *m0,
                        const float *a, int64_t i, int on_i, int write_d0)
{
    /*@ loop invariant bounds: 0 <= j <= I;
        loop assigns j, m[0 .. I - 1], errno;
        loop variant I - j; */
    for (int64_t j = 0; j < I; j++)
        m[j] = act_of(p->activation, gu[j]) * gu[I + j];
    if (on_i) {
        if (write_d0) {
            copy_floats(m0, m, I);
            if (p->round_intermediates)
                round_row(dt, m0, I);
        }
        /*@ loop invariant bounds: 0 <= j <= I;
            loop assigns j, m[0 .. I - 1];
            loop variant I - j; */
        for (int64_t j = 0; j < I; j++)
            m[j] = m[j] * a[i];
    }
    /* the down projection's operand: rnd(m) (ON_I: rnd(act(g)*u*a), from the unrounded product) */
    if (p->round_intermediates)
        round_row(dt, m, I);
}

/* One slot's down row d [H] after the GEMM (d0 [H]: the unscaled one, write_d0 only): ON_H d + bd (with
 * bias), checkpointed at position pos of down_ckpt [N*B][H], contribution c [H] = a[i] * d; ON_I c = d +
 * a[i] * bd (with bias, else d), and the checkpoint from d0 (+ bd). */
/*@ requires problem: \valid_read(p);
    requires dims: 0 <= H && 0 <= pos < NB && NB * H <= INT64_MAX && 0 <= i;
    requires dtype: dtype_ok(dt);
    requires mode: write_d0 != 0 ==> on_i != 0 && down_ckpt != \null;
    requires rows: \valid(d + (0 .. H - 1)) && \valid_read(bd + (0 .. H - 1)) && \valid_read(a + i) &&
      \valid(c + (0 .. H - 1));
    requires d0: write_d0 != 0 ==> \valid(d0 + (0 .. H - 1)) &&
      \separated(d0 + (0 .. H - 1), c + (0 .. H - 1), bd + (0 .. H - 1), a + i, p);
    requires apart: \separated(c + (0 .. H - 1), d + (0 .. H - 1), bd + (0 .. H - 1), a + i, p) &&
      \separated(d + (0 .. H - 1), bd + (0 .. H - 1), a + i, p);
    requires down: down_ckpt != \null ==> tensor_writable((char *)down_ckpt, NB * H, dt) &&
      \separated((char *)down_ckpt + (0 .. byte_offset(NB * H, dt) - 1), p, d + (0 .. H - 1),
                 c + (0 .. H - 1), bd + (0 .. H - 1), a + i) &&
      (write_d0 != 0 ==> \separated((char *)down_ckpt + (0 .. byte_offset(NB * H, dt) - 1), d0 + (0 .. H - 1)));
    terminates \true;
    assigns d[0 .. H - 1], d0[0 .. (write_d0 != 0 ? H : 0) - 1], c[0 .. H - 1],
      ((char *)down_ckpt)[0 .. (down_ckpt == \null ? 0 : byte_offset(NB * H, dt)) - 1]; */
static void fwd_down_row(const moe_mlp_problem *p, moe_dtype dt, int64_t H, float *d, float *d0, const float *bd,
                         const float *a, int64_t i, float *c, void *down_ckpt, int64_t pos, int on_i, int write_d0)
    /*@ ghost (int64_t NB) */
{
    /*@ ghost lemma_row_fits(pos, NB, H); */
    if (!on_i) {
        if (p->bias)
            /*@ loop invariant bounds: 0 <= h <= H;
                loop assigns h, d[0 .. H - 1];
                loop variant H - h; */
            for (int64_t h = 0; h < H; h++)
                d[h] = d[h] + bd[h];
        if (down_ckpt != NULL)
            store_row(dt, down_ckpt, pos * H, d, H);
        /*@ loop invariant bounds: 0 <= h <= H;
            loop assigns h, c[0 .. H - 1];
            loop variant H - h; */
        for (int64_t h = 0; h < H; h++)
            c[h] = a[i] * d[h];
    } else {
        /*@ loop invariant bounds: 0 <= h <= H;
            loop assigns h, c[0 .. H - 1];
            loop variant H - h; */
        for (int64_t h = 0; h < H; h++)
            c[h] = p->bias ? d[h] + a[i] * bd[h] : d[h];
        if (write_d0) {
            if (p->bias)
                /*@ loop invariant bounds: 0 <= h <= H;
                    loop assigns h, d0[0 .. H - 1];
                    loop variant H - h; */
                for (int64_t h = 0; h < H; h++)
                    d0[h] = d0[h] + bd[h];
            store_row(dt, down_ckpt, pos * H, d0, H);
        }
    }
}

/*@ // The input tensors of the forward as values: readable (b_gu, b_d only with bias)
    predicate fwd_inputs_at{L}(char *hidden, char *affinities, char *w_gu, char *w_d, char *b_gu, char *b_d,
                               integer rows, integer T, integer E, integer H, integer I, integer bias,
                               moe_dtype dt) =
      tensor_readable(hidden, rows * H, dt) && tensor_readable(affinities, T * E, dt) &&
      tensor_readable(w_gu, E * H * (2 * I), dt) && tensor_readable(w_d, E * I * H, dt) &&
      (bias != 0 ==> tensor_readable(b_gu, E * (2 * I), dt) && tensor_readable(b_d, E * H, dt));

    // bytes q[0 .. bytes - 1] apart from every float the forward writes (the scratch s, contrib [V][H]).
    // (No set-valued logic functions here: WP 25 translates them with the Why3 library vset, which the
    // installed Why3 does not have.)
    predicate fwd_floats_apart{L}(fwd_scratch *s, float *contrib, integer V, integer n_max, integer H, integer I,
                                  integer on_i, char *q, integer bytes) =
      \separated(q + (0 .. bytes - 1), s->X + (0 .. n_max * H - 1)) &&
      \separated(q + (0 .. bytes - 1), s->D + (0 .. n_max * H - 1)) &&
      \separated(q + (0 .. bytes - 1), s->GU + (0 .. n_max * (2 * I) - 1)) &&
      \separated(q + (0 .. bytes - 1), s->M + (0 .. n_max * I - 1)) &&
      \separated(q + (0 .. bytes - 1), s->M0 + (0 .. (on_i != 0 ? n_max * I : 0) - 1)) &&
      \separated(q + (0 .. bytes - 1), s->D0 + (0 .. (on_i != 0 ? n_max * H : 0) - 1)) &&
      \separated(q + (0 .. bytes - 1), s->a + (0 .. n_max - 1)) &&
      \separated(q + (0 .. bytes - 1), s->bgu + (0 .. 2 * I - 1)) &&
      \separated(q + (0 .. bytes - 1), s->bd + (0 .. H - 1)) &&
      \separated(q + (0 .. bytes - 1), s->bbuf + (0 .. PC * NC - 1)) &&
      \separated(q + (0 .. bytes - 1), contrib + (0 .. V * H - 1));

    // the same for the problem struct (its float fields: the clamp limits)
    predicate fwd_floats_apart_p{L}(fwd_scratch *s, float *contrib, integer V, integer n_max, integer H,
                                    integer I, integer on_i, moe_mlp_problem *p) =
      \separated(p, s->X + (0 .. n_max * H - 1)) && \separated(p, s->D + (0 .. n_max * H - 1)) &&
      \separated(p, s->GU + (0 .. n_max * (2 * I) - 1)) && \separated(p, s->M + (0 .. n_max * I - 1)) &&
      \separated(p, s->M0 + (0 .. (on_i != 0 ? n_max * I : 0) - 1)) &&
      \separated(p, s->D0 + (0 .. (on_i != 0 ? n_max * H : 0) - 1)) && \separated(p, s->a + (0 .. n_max - 1)) &&
      \separated(p, s->bgu + (0 .. 2 * I - 1)) && \separated(p, s->bd + (0 .. H - 1)) &&
      \separated(p, s->bbuf + (0 .. PC * NC - 1)) && \separated(p, contrib + (0 .. V * H - 1));

    // what fwd_expert requires of a checkpoint ck (NULL: not requested) of count elements: writable, apart
    // from the problem, the index arrays it reads and the floats it writes
    predicate fwd_ckpt_ok{L}(char *ck, integer count, moe_dtype dt, moe_mlp_problem *p, int64_t *slots,
                             integer n, int64_t *pos, int64_t *token, integer V, int64_t *blocks, integer q0,
                             integer q1, int64_t *ids, integer NB, fwd_scratch *s, float *contrib, integer n_max,
                             integer H, integer I, integer on_i) =
      ck != \null ==> tensor_writable(ck, count, dt) &&
        \separated(ck + (0 .. byte_offset(count, dt) - 1), p) &&
        \separated(ck + (0 .. byte_offset(count, dt) - 1), slots + (0 .. n - 1)) &&
        \separated(ck + (0 .. byte_offset(count, dt) - 1), pos + (0 .. V - 1)) &&
        \separated(ck + (0 .. byte_offset(count, dt) - 1), token + (0 .. V - 1)) &&
        \separated(ck + (0 .. byte_offset(count, dt) - 1), blocks + (q0 .. q1 - 1)) &&
        \separated(ck + (0 .. byte_offset(count, dt) - 1), ids + (0 .. NB - 1)) &&
        fwd_floats_apart(s, contrib, V, n_max, H, I, on_i, ck, byte_offset(count, dt));

    // the same for fwd_experts, over the whole slot index x
    predicate fwd_ckpt_x_ok{L}(char *ck, integer count, moe_dtype dt, moe_mlp_problem *p, slot_index *x,
                               integer V, integer E, integer N, int64_t *ids, integer NB, fwd_scratch *s,
                               float *contrib, integer n_max, integer H, integer I, integer on_i) =
      ck != \null ==> tensor_writable(ck, count, dt) &&
        \separated(ck + (0 .. byte_offset(count, dt) - 1), p) &&
        \separated(ck + (0 .. byte_offset(count, dt) - 1), x->expert_slots + (0 .. V - 1)) &&
        \separated(ck + (0 .. byte_offset(count, dt) - 1), x->expert_start + (0 .. E)) &&
        \separated(ck + (0 .. byte_offset(count, dt) - 1), x->pos + (0 .. V - 1)) &&
        \separated(ck + (0 .. byte_offset(count, dt) - 1), x->token + (0 .. V - 1)) &&
        \separated(ck + (0 .. byte_offset(count, dt) - 1), x->block_start + (0 .. E)) &&
        \separated(ck + (0 .. byte_offset(count, dt) - 1), x->expert_blocks + (0 .. N - 1)) &&
        \separated(ck + (0 .. byte_offset(count, dt) - 1), ids + (0 .. NB - 1)) &&
        fwd_floats_apart(s, contrib, V, n_max, H, I, on_i, ck, byte_offset(count, dt));

    // the inputs that fwd_expert copies into its scratch (hidden; with bias b_gu, b_d) apart from its floats
    predicate fwd_inputs_apart{L}(char *hidden, char *b_gu, char *b_d, integer rows, integer E, integer H,
                                  integer I, integer bias, moe_dtype dt, fwd_scratch *s, float *contrib,
                                  integer V, integer n_max, integer on_i) =
      fwd_floats_apart(s, contrib, V, n_max, H, I, on_i, hidden, byte_offset(rows * H, dt)) &&
      (bias != 0 ==> fwd_floats_apart(s, contrib, V, n_max, H, I, on_i, b_gu, byte_offset(E * (2 * I), dt)) &&
                     fwd_floats_apart(s, contrib, V, n_max, H, I, on_i, b_d, byte_offset(E * H, dt)));
*/

/* fwd_expert's gather: the rows X [n][H] of its slots' tokens (hidden), their affinities a [n] for expert e
 * (affinities [T][E]) and, with bias, its bias rows bgu [2I], bd [H] (b_gu [E][2I], b_d [E][H]). */
/*@ requires problem: \valid_read(p);
    requires dims: 0 <= T <= rows && 0 <= e < E && 0 <= H && 0 <= I && 1 <= n <= n_max && 0 <= V &&
      rows * H <= INT64_MAX && n_max * H <= INT64_MAX && T * E <= INT64_MAX && E * H <= INT64_MAX &&
      E * (2 * I) <= INT64_MAX;
    requires dtype: dtype_ok(dt);
    requires slots: \valid_read(slots + (0 .. n - 1)) && in_range(slots, n, 0, V);
    requires token: \valid_read(token + (0 .. V - 1)) && in_range(token, V, 0, T);
    requires inputs: tensor_readable((char *)hidden, rows * H, dt) && tensor_readable((char *)affinities, T * E, dt) &&
      (p->bias != 0 ==> tensor_readable((char *)b_gu, E * (2 * I), dt) && tensor_readable((char *)b_d, E * H, dt));
    requires scratch: \valid(X + (0 .. n_max * H - 1)) && \valid(a + (0 .. n_max - 1)) &&
      \valid(bgu + (0 .. 2 * I - 1)) && \valid(bd + (0 .. H - 1)) &&
      \separated(X + (0 .. n_max * H - 1), a + (0 .. n_max - 1), bgu + (0 .. 2 * I - 1), bd + (0 .. H - 1));
    requires apart: \separated(X + (0 .. n_max * H - 1), (char *)hidden + (0 .. byte_offset(rows * H, dt) - 1)) &&
      (p->bias != 0 ==> \separated(bgu + (0 .. 2 * I - 1), (char *)b_gu + (0 .. byte_offset(E * (2 * I), dt) - 1)) &&
                        \separated(bd + (0 .. H - 1), (char *)b_d + (0 .. byte_offset(E * H, dt) - 1)));
    terminates \true;
    assigns X[0 .. n_max * H - 1], a[0 .. n_max - 1], bgu[0 .. 2 * I - 1], bd[0 .. H - 1]; */
static void fwd_gather(const moe_mlp_problem *p, moe_dtype dt, int64_t E, int64_t H, int64_t I, int64_t e,
                       const int64_t *slots, int64_t n, const int64_t *token, const void *hidden,
                       const void *affinities, const void *b_gu, const void *b_d, float *X, float *a, float *bgu,
                       float *bd) /*@ ghost (int64_t T, int64_t V, int64_t rows, int64_t n_max) */
{
    const int64_t I2 = 2 * I;
    /*@ ghost lemma_mul_monotone(n, n_max, H); */
    gather_rows(dt, hidden, slots, token, n, H, X) /*@ ghost (V, rows) */;
    /*@ loop invariant bounds: 0 <= i <= n;
        loop assigns i, a[0 .. n_max - 1];
        loop variant n - i; */
    for (int64_t i = 0; i < n; i++) {
        /*@ ghost lemma_row_fits(token[slots[i]], T, E); */
        a[i] = moe_ref_load(dt, affinities, token[slots[i]] * E + e);
    }
    if (p->bias) {
        /*@ ghost lemma_row_fits(e, E, I2); */
        /*@ ghost lemma_row_fits(e, E, H); */
        load_f32(dt, b_gu, e * I2, I2, bgu);
        load_f32(dt, b_d, e * H, H, bd);
    }
}

/* fwd_expert's gate/up stage: GU [n][2I] = X . W_gu[e] (w_gu [E][H][2I]), then per slot fwd_gate_up_row (bias,
 * clamp, checkpoint at its position pos[slots[i]] of gate_up_ckpt_T [N][2I][B]) and fwd_act_row (M [n][I],
 * with write_d0 M0 [n][I]). */
/*@ requires problem: \valid_read(p);
    requires dims: 0 <= e < E && 0 <= H && 0 <= I && 1 <= n <= n_max && 0 <= V && 0 <= N && 1 <= B &&
      H <= SIZE_MAX / 64 && 2 * I <= SIZE_MAX / 64 && E * H <= INT64_MAX && E * H * (2 * I) <= INT64_MAX &&
      N * B <= INT64_MAX && N * (2 * I) <= INT64_MAX && N * (2 * I) * B <= INT64_MAX &&
      n_max * H <= INT64_MAX && n_max * (2 * I) <= INT64_MAX && n_max * I <= INT64_MAX;
    requires dtype: dtype_ok(dt);
    requires mode: write_d0 != 0 ==> on_i != 0;
    requires slots: \valid_read(slots + (0 .. n - 1)) && in_range(slots, n, 0, V);
    requires pos: \valid_read(pos + (0 .. V - 1)) && in_range(pos, V, 0, N * B);
    requires w_gu: tensor_readable((char *)w_gu, E * H * (2 * I), dt);
    requires scratch: \valid_read(X + (0 .. n_max * H - 1)) && \valid(GU + (0 .. n_max * (2 * I) - 1)) &&
      \valid(M + (0 .. n_max * I - 1)) && \valid(M0 + (0 .. (write_d0 != 0 ? n_max * I : 0) - 1)) &&
      \valid_read(a + (0 .. n_max - 1)) && \valid_read(bgu + (0 .. 2 * I - 1)) && \valid(bbuf + (0 .. PC * NC - 1)) &&
      \separated(GU + (0 .. n_max * (2 * I) - 1), M + (0 .. n_max * I - 1),
                 M0 + (0 .. (write_d0 != 0 ? n_max * I : 0) - 1), a + (0 .. n_max - 1), bgu + (0 .. 2 * I - 1),
                 bbuf + (0 .. PC * NC - 1), p) &&
      \separated(X + (0 .. n_max * H - 1), GU + (0 .. n_max * (2 * I) - 1), M + (0 .. n_max * I - 1),
                 M0 + (0 .. (write_d0 != 0 ? n_max * I : 0) - 1), bbuf + (0 .. PC * NC - 1));
    requires gate_up: gate_up_ckpt_T != \null ==> tensor_writable((char *)gate_up_ckpt_T, N * (2 * I) * B, dt) &&
      \separated((char *)gate_up_ckpt_T + (0 .. byte_offset(N * (2 * I) * B, dt) - 1), p) &&
      \separated((char *)gate_up_ckpt_T + (0 .. byte_offset(N * (2 * I) * B, dt) - 1), slots + (0 .. n - 1)) &&
      \separated((char *)gate_up_ckpt_T + (0 .. byte_offset(N * (2 * I) * B, dt) - 1), pos + (0 .. V - 1));
    terminates \true;
    assigns GU[0 .. n_max * (2 * I) - 1], M[0 .. n_max * I - 1], M0[0 .. (write_d0 != 0 ? n_max * I : 0) - 1],
      bbuf[0 .. PC * NC - 1], errno,
      ((char *)gate_up_ckpt_T)[0 .. (gate_up_ckpt_T == \null ? 0 : byte_offset(N * (2 * I) * B, dt)) - 1]; */
static void fwd_gate_up(const moe_mlp_problem *p, moe_dtype dt, int64_t B, int64_t H, int64_t I, int64_t e,
                        const int64_t *slots, int64_t n, const int64_t *pos, const void *w_gu, const float *X,
                        float *GU, float *M, float *M0, const float *a, const float *bgu, float *bbuf,
                        void *gate_up_ckpt_T, int on_i, int write_d0)
    /*@ ghost (int64_t E, int64_t N, int64_t V, int64_t n_max) */
{
    const int64_t I2 = 2 * I;
    /*@ ghost lemma_row_fits(e, E, H); */
    /*@ ghost lemma_mul_monotone(e * H + H, E * H, I2); */
    /*@ ghost lemma_row_fits(n - 1, n_max, H); */
    /*@ ghost lemma_mul_monotone(n, n_max, I2); */
    mm_nn(n, I2, H, X, H, 1, dt, w_gu, e * H * I2, I2, GU, I2, bbuf);
    /*@ loop invariant bounds: 0 <= i <= n;
        loop invariant slots: in_range(slots, n, 0, V);
        loop invariant pos: in_range(pos, V, 0, N * B);
        loop assigns i, errno, GU[0 .. n_max * I2 - 1], M[0 .. n_max * I - 1],
          M0[0 .. (write_d0 != 0 ? n_max * I : 0) - 1],
          ((char *)gate_up_ckpt_T)[0 .. (gate_up_ckpt_T == \null ? 0 : byte_offset(N * I2 * B, dt)) - 1];
        loop variant n - i; */
    for (int64_t i = 0; i < n; i++) {
        const int64_t pos_i = pos[slots[i]], blk = pos_i / B, b = pos_i % B;
        /*@ ghost lemma_div_below(pos_i, N, B); */
        /*@ ghost lemma_row_fits(i, n_max, I2); */
        /*@ ghost lemma_row_fits(i, n_max, I); */
        fwd_gate_up_row(p, dt, B, I, GU + i * I2, bgu, gate_up_ckpt_T, blk, b) /*@ ghost (N) */;
        fwd_act_row(p, dt, I, GU + i * I2, M + i * I, write_d0 ? M0 + i * I : NULL, a, i, on_i, write_d0);
    }
}

/* fwd_expert's down stage: D [n][H] = M . W_d[e] (w_d [E][I][H]; with write_d0 also D0 = M0 . W_d[e]), then
 * per slot fwd_down_row into its contribution row contrib[slots[i]] and the down checkpoint at its position. */
/*@ requires problem: \valid_read(p);
    requires dims: 0 <= e < E && 0 <= H && 0 <= I && 1 <= n <= n_max && 0 <= V && 0 <= NB &&
      H <= SIZE_MAX / 64 && 2 * I <= SIZE_MAX / 64 && E * I <= INT64_MAX && E * I * H <= INT64_MAX && NB * H <= INT64_MAX &&
      V * H <= INT64_MAX && n_max * H <= INT64_MAX && n_max * I <= INT64_MAX;
    requires dtype: dtype_ok(dt);
    requires mode: write_d0 != 0 ==> on_i != 0 && down_ckpt != \null;
    requires slots: \valid_read(slots + (0 .. n - 1)) && in_range(slots, n, 0, V);
    requires pos: \valid_read(pos + (0 .. V - 1)) && in_range(pos, V, 0, NB);
    requires w_d: tensor_readable((char *)w_d, E * I * H, dt);
    requires scratch: \valid_read(M + (0 .. n_max * I - 1)) && \valid_read(M0 + (0 .. (write_d0 != 0 ? n_max * I : 0) - 1)) &&
      \valid(D + (0 .. n_max * H - 1)) && \valid(D0 + (0 .. (write_d0 != 0 ? n_max * H : 0) - 1)) &&
      \valid_read(a + (0 .. n_max - 1)) && \valid_read(bd + (0 .. H - 1)) && \valid(bbuf + (0 .. PC * NC - 1)) &&
      \valid(contrib + (0 .. V * H - 1)) &&
      \separated(D + (0 .. n_max * H - 1), D0 + (0 .. (write_d0 != 0 ? n_max * H : 0) - 1), contrib + (0 .. V * H - 1),
                 a + (0 .. n_max - 1), bd + (0 .. H - 1), bbuf + (0 .. PC * NC - 1), p) &&
      \separated(M + (0 .. n_max * I - 1), M0 + (0 .. (write_d0 != 0 ? n_max * I : 0) - 1), D + (0 .. n_max * H - 1),
                 D0 + (0 .. (write_d0 != 0 ? n_max * H : 0) - 1), bbuf + (0 .. PC * NC - 1));
    requires down: down_ckpt != \null ==> tensor_writable((char *)down_ckpt, NB * H, dt) &&
      \separated((char *)down_ckpt + (0 .. byte_offset(NB * H, dt) - 1), p) &&
      \separated((char *)down_ckpt + (0 .. byte_offset(NB * H, dt) - 1), slots + (0 .. n - 1)) &&
      \separated((char *)down_ckpt + (0 .. byte_offset(NB * H, dt) - 1), pos + (0 .. V - 1)) &&
      \separated((char *)down_ckpt + (0 .. byte_offset(NB * H, dt) - 1), D + (0 .. n_max * H - 1)) &&
      \separated((char *)down_ckpt + (0 .. byte_offset(NB * H, dt) - 1), D0 + (0 .. (write_d0 != 0 ? n_max * H : 0) - 1)) &&
      \separated((char *)down_ckpt + (0 .. byte_offset(NB * H, dt) - 1), contrib + (0 .. V * H - 1)) &&
      \separated((char *)down_ckpt + (0 .. byte_offset(NB * H, dt) - 1), bd + (0 .. H - 1)) &&
      \separated((char *)down_ckpt + (0 .. byte_offset(NB * H, dt) - 1), a + (0 .. n_max - 1));
    terminates \true;
    assigns D[0 .. n_max * H - 1], D0[0 .. (write_d0 != 0 ? n_max * H : 0) - 1], bbuf[0 .. PC * NC - 1],
      contrib[0 .. V * H - 1], ((char *)down_ckpt)[0 .. (down_ckpt == \null ? 0 : byte_offset(NB * H, dt)) - 1]; */
static void fwd_down(const moe_mlp_problem *p, moe_dtype dt, int64_t H, int64_t I, int64_t e, const int64_t *slots,
                     int64_t n, const int64_t *pos, const void *w_d, const float *M, const float *M0, float *D,
                     float *D0, const float *a, const float *bd, float *bbuf, float *contrib, void *down_ckpt, int on_i,
                     int write_d0) /*@ ghost (int64_t E, int64_t NB, int64_t V, int64_t n_max) */
{
    /*@ ghost lemma_row_fits(e, E, I); */
    /*@ ghost lemma_mul_monotone(e * I + I, E * I, H); */
    /*@ ghost lemma_row_fits(n - 1, n_max, I); */
    /*@ ghost lemma_mul_monotone(n, n_max, H); */
    mm_nn(n, H, I, M, I, 1, dt, w_d, e * I * H, H, D, H, bbuf);
    if (write_d0)
        mm_nn(n, H, I, M0, I, 1, dt, w_d, e * I * H, H, D0, H, bbuf);
    /*@ loop invariant bounds: 0 <= i <= n;
        loop invariant slots: in_range(slots, n, 0, V);
        loop invariant pos: in_range(pos, V, 0, NB);
        loop assigns i, D[0 .. n_max * H - 1], D0[0 .. (write_d0 != 0 ? n_max * H : 0) - 1], contrib[0 .. V * H - 1],
          ((char *)down_ckpt)[0 .. (down_ckpt == \null ? 0 : byte_offset(NB * H, dt)) - 1];
        loop variant n - i; */
    for (int64_t i = 0; i < n; i++) {
        const int64_t sl = slots[i], pos_i = pos[sl];
        /*@ ghost lemma_row_fits(i, n_max, H); */
        /*@ ghost lemma_row_fits(sl, V, H); */
        fwd_down_row(p, dt, H, D + i * H, write_d0 ? D0 + i * H : NULL, bd, a, i, contrib + sl * H, down_ckpt,
                     pos_i, on_i, write_d0) /*@ ghost (NB) */;
    }
}

/* The forward of expert e: its padding positions (blocks[q0 .. q1 - 1]) checkpointed +0, then its n slots
 * (slots[0 .. n - 1]): gather (X, a, the bias rows), gate/up GEMM, per slot fwd_gate_up_row and fwd_act_row,
 * down GEMM (and, write_d0, the unscaled one into D0), per slot fwd_down_row into contrib [V][H].
 *   pos, token [V]: the slot index;  ids: the layout's token_position_to_id [N*B];  s: the thread's scratch */
/*@ requires problem: \valid_read(p);
    requires dims: fwd_dims(T, E, N, B, H, I, V, n_max, rows);
    requires dtype: dtype_ok(dt);
    requires expert: 0 <= e < E;
    requires mode: write_d0 != 0 ==> on_i != 0 && down_ckpt != \null;
    requires slots: 0 <= n <= n_max && \valid_read(slots + (0 .. n - 1)) &&
      \forall integer r; 0 <= r < n ==> 0 <= slots[r] < V;
    requires index: \valid_read(pos + (0 .. V - 1)) && in_range(pos, V, 0, N * B) &&
      \valid_read(token + (0 .. V - 1)) && in_range(token, V, 0, T);
    requires blocks: 0 <= q0 <= q1 && \valid_read(blocks + (q0 .. q1 - 1)) &&
      (\forall integer q; q0 <= q < q1 ==> 0 <= blocks[q] < N);
    requires ids: \valid_read(ids + (0 .. N * B - 1));
    requires inputs: fwd_inputs_at((char *)hidden, (char *)affinities, (char *)w_gu, (char *)w_d, (char *)b_gu,
      (char *)b_d, rows, T, E, H, I, p->bias, dt);
    requires scratch: fwd_scratch_ok(s, contrib, V, n_max, H, I, on_i);
    requires floats_apart: fwd_floats_apart_p(s, contrib, V, n_max, H, I, on_i, p) &&
      fwd_inputs_apart((char *)hidden, (char *)b_gu, (char *)b_d, rows, E, H, I, p->bias, dt, s, contrib, V,
                       n_max, on_i);
    requires gate_up: fwd_ckpt_ok((char *)gate_up_ckpt_T, N * (2 * I) * B, dt, p, slots, n, pos, token, V, blocks,
      q0, q1, ids, N * B, s, contrib, n_max, H, I, on_i);
    requires down: fwd_ckpt_ok((char *)down_ckpt, N * B * H, dt, p, slots, n, pos, token, V, blocks, q0, q1, ids,
      N * B, s, contrib, n_max, H, I, on_i);
    terminates \true;
    assigns s->X[0 .. n_max * H - 1], s->D[0 .. n_max * H - 1], s->GU[0 .. n_max * (2 * I) - 1],
      s->M[0 .. n_max * I - 1], s->M0[0 .. (on_i != 0 ? n_max * I : 0) - 1],
      s->D0[0 .. (on_i != 0 ? n_max * H : 0) - 1], s->a[0 .. n_max - 1], s->bgu[0 .. 2 * I - 1],
      s->bd[0 .. H - 1], s->bbuf[0 .. PC * NC - 1], contrib[0 .. V * H - 1], errno,
      ((char *)gate_up_ckpt_T)[0 .. (gate_up_ckpt_T == \null ? 0 : byte_offset(N * (2 * I) * B, dt)) - 1],
      ((char *)down_ckpt)[0 .. (down_ckpt == \null ? 0 : byte_offset(N * B * H, dt)) - 1]; */
static void fwd_expert(const moe_mlp_problem *p, moe_dtype dt, int64_t E, int64_t B, int64_t H,
                       int64_t I, int on_i, int write_d0, int64_t e, const int64_t *slots, int64_t n,
                       const int64_t *pos, const int64_t *token, const int64_t *ids, const int64_t *blocks,
                       int64_t q0, int64_t q1, const void *hidden, const void *affinities, const void *w_gu,
                       const void *w_d, const void *b_gu, const void *b_d, void *gate_up_ckpt_T, void *down_ckpt,
                       float *contrib, const fwd_scratch *s)
    /*@ ghost (int64_t T, int64_t N, int64_t V, int64_t n_max, int64_t rows) */
{
    const int64_t I2 = 2 * I;
    float *X = s->X, *D = s->D, *GU = s->GU, *M = s->M, *M0 = s->M0, *D0 = s->D0, *a = s->a, *bgu = s->bgu,
          *bd = s->bd, *bbuf = s->bbuf;

    /* padding positions of this expert's blocks: checkpoints +0 */
    fwd_pad(p, dt, B, H, I2, ids, blocks, q0, q1, gate_up_ckpt_T, down_ckpt) /*@ ghost (N) */;
    if (n == 0)
        return;
    fwd_gather(p, dt, E, H, I, e, slots, n, token, hidden, affinities, b_gu, b_d, X, a, bgu, bd)
        /*@ ghost (T, V, rows, n_max) */;
    /* gate/up projection, bias, clamp, checkpoint, activation */
    fwd_gate_up(p, dt, B, H, I, e, slots, n, pos, w_gu, X, GU, M, M0, a, bgu, bbuf, gate_up_ckpt_T, on_i, write_d0)
        /*@ ghost (E, N, V, n_max) */;
    /* down projection, bias, checkpoint, contributions */
    fwd_down(p, dt, H, I, e, slots, n, pos, w_d, M, M0, D, D0, a, bd, bbuf, contrib, down_ckpt, on_i, write_d0)
        /*@ ghost (E, N * B, V, n_max) */;
}

/* Token t's output row: the sum of its slots' contributions (contrib rows token_slots[first .. last - 1]) in
 * ascending slot order, rounded once; +0 when it has none.   acc [H] (read only when the token has slots) */
/*@ requires dims: 0 <= H && 0 <= t < rows && rows * H <= INT64_MAX && 0 <= V && V * H <= INT64_MAX;
    requires dtype: dtype_ok(dt);
    requires slots: 0 <= first <= last && \valid_read(token_slots + (first .. last - 1)) &&
      (\forall integer q; first <= q < last ==> 0 <= token_slots[q] < V);
    requires contrib: \valid_read(contrib + (0 .. V * H - 1));
    requires acc: first < last ==> \valid(acc + (0 .. H - 1)) &&
      \separated(acc + (0 .. H - 1), contrib + (0 .. V * H - 1));
    requires out: tensor_writable((char *)out, rows * H, dt) &&
      \separated((char *)out + (0 .. byte_offset(rows * H, dt) - 1), token_slots + (first .. last - 1)) &&
      (first < last ==> \separated((char *)out + (0 .. byte_offset(rows * H, dt) - 1), acc + (0 .. H - 1)));
    terminates \true;
    assigns acc[0 .. (first < last ? H : 0) - 1],
      ((char *)out)[byte_offset(t * H, dt) .. byte_offset(t * H + H, dt) - 1]; */
static void fwd_token_row(moe_dtype dt, int64_t H, const float *contrib, const int64_t *token_slots, int64_t first,
                          int64_t last, float *acc, void *out, int64_t t) /*@ ghost (int64_t V, int64_t rows) */
{
    /*@ ghost lemma_row_fits(t, rows, H); */
    if (first == last) {
        /*@ loop invariant bounds: 0 <= h <= H;
            loop assigns h, ((char *)out)[byte_offset(t * H, dt) .. byte_offset(t * H + H, dt) - 1];
            loop variant H - h; */
        for (int64_t h = 0; h < H; h++)
            moe_ref_store(dt, out, t * H + h, 0.0f);
        return;
    }
    /*@ ghost lemma_row_fits(token_slots[first], V, H); */
    const float *c0 = contrib + token_slots[first] * H;
    copy_floats(acc, c0, H);
    /*@ loop invariant bounds: first + 1 <= q <= last;
        loop assigns q, acc[0 .. H - 1];
        loop variant last - q; */
    for (int64_t q = first + 1; q < last; q++) {
        /*@ ghost lemma_row_fits(token_slots[q], V, H); */
        const float *c = contrib + token_slots[q] * H;
        /*@ loop invariant bounds: 0 <= h <= H;
            loop assigns h, acc[0 .. H - 1];
            loop variant H - h; */
        MLP_SIMD
        for (int64_t h = 0; h < H; h++)
            acc[h] = acc[h] + c[h];
    }
    store_row(dt, out, t * H, acc, H);
}

/* One thread's share of the experts: the orphaned `omp for` (dynamic, one expert at a time) of
 * moe_ref_mlp_fwd's parallel region, fwd_expert for each expert e < E (its slots expert_slots[expert_start[e]
 * ..], its blocks expert_blocks[block_start[e] ..]).  Frama-C parses it without OpenMP: the proof is of the
 * loop run by one thread over every expert.
 *   x: the slot index (V = x->count slots, n_max = x->max_slots);  ids: the layout's token_position_to_id */
/*@ requires problem: \valid_read(p);
    requires dims: fwd_dims(T, E, N, B, H, I, V, n_max, rows);
    requires dtype: dtype_ok(dt);
    requires mode: write_d0 != 0 ==> on_i != 0 && down_ckpt != \null;
    requires index: slot_index_ok(x, ids, T, E, N, B) && x->count == V && x->max_slots == n_max;
    requires ids: \valid_read(ids + (0 .. N * B - 1));
    requires inputs: fwd_inputs_at((char *)hidden, (char *)affinities, (char *)w_gu, (char *)w_d, (char *)b_gu,
      (char *)b_d, rows, T, E, H, I, p->bias, dt);
    requires scratch: fwd_scratch_ok(s, contrib, V, n_max, H, I, on_i);
    requires floats_apart: fwd_floats_apart_p(s, contrib, V, n_max, H, I, on_i, p) &&
      fwd_inputs_apart((char *)hidden, (char *)b_gu, (char *)b_d, rows, E, H, I, p->bias, dt, s, contrib, V,
                       n_max, on_i);
    requires gate_up: fwd_ckpt_x_ok((char *)gate_up_ckpt_T, N * (2 * I) * B, dt, p, x, V, E, N, ids, N * B, s,
      contrib, n_max, H, I, on_i);
    requires down: fwd_ckpt_x_ok((char *)down_ckpt, N * B * H, dt, p, x, V, E, N, ids, N * B, s, contrib, n_max,
      H, I, on_i);
    terminates \true;
    assigns s->X[0 .. n_max * H - 1], s->D[0 .. n_max * H - 1], s->GU[0 .. n_max * (2 * I) - 1],
      s->M[0 .. n_max * I - 1], s->M0[0 .. (on_i != 0 ? n_max * I : 0) - 1],
      s->D0[0 .. (on_i != 0 ? n_max * H : 0) - 1], s->a[0 .. n_max - 1], s->bgu[0 .. 2 * I - 1],
      s->bd[0 .. H - 1], s->bbuf[0 .. PC * NC - 1], contrib[0 .. V * H - 1], errno,
      ((char *)gate_up_ckpt_T)[0 .. (gate_up_ckpt_T == \null ? 0 : byte_offset(N * (2 * I) * B, dt)) - 1],
      ((char *)down_ckpt)[0 .. (down_ckpt == \null ? 0 : byte_offset(N * B * H, dt)) - 1]; */
static void fwd_experts(const moe_mlp_problem *p, moe_dtype dt, int64_t E, int64_t B, int64_t H,
                        int64_t I, int on_i, int write_d0, const slot_index *x, const int64_t *ids,
                        const void *hidden, const void *affinities, const void *w_gu, const void *w_d,
                        const void *b_gu, const void *b_d, void *gate_up_ckpt_T, void *down_ckpt, float *contrib,
                        const fwd_scratch *s) /*@ ghost (int64_t T, int64_t N, int64_t V, int64_t n_max, int64_t rows) */
{
    /*@ loop invariant bounds: 0 <= e <= E;
        loop assigns e, s->X[0 .. n_max * H - 1], s->D[0 .. n_max * H - 1], s->GU[0 .. n_max * (2 * I) - 1],
          s->M[0 .. n_max * I - 1], s->M0[0 .. (on_i != 0 ? n_max * I : 0) - 1],
          s->D0[0 .. (on_i != 0 ? n_max * H : 0) - 1], s->a[0 .. n_max - 1], s->bgu[0 .. 2 * I - 1],
          s->bd[0 .. H - 1], s->bbuf[0 .. PC * NC - 1], contrib[0 .. V * H - 1], errno,
          ((char *)gate_up_ckpt_T)[0 .. (gate_up_ckpt_T == \null ? 0 : byte_offset(N * (2 * I) * B, dt)) - 1],
          ((char *)down_ckpt)[0 .. (down_ckpt == \null ? 0 : byte_offset(N * B * H, dt)) - 1];
        loop variant E - e; */
    MLP_OMP(for schedule(dynamic, 1))
    for (int64_t e = 0; e < E; e++) {
        const int64_t first = x->expert_start[e], n = x->expert_start[e + 1] - first;
        const int64_t q0 = x->block_start[e], q1 = x->block_start[e + 1];
        /*@ assert slots_in: 0 <= first && first + n <= V && 0 <= n <= n_max; */
        /*@ assert slots_kept: \forall integer r; first <= r < first + n ==> 0 <= x->expert_slots[r] < V; */
        /*@ assert blocks_in: 0 <= q0 <= q1 <= N; */
        fwd_expert(p, dt, E, B, H, I, on_i, write_d0, e, x->expert_slots + first, n, x->pos, x->token, ids,
                   x->expert_blocks, q0, q1, hidden, affinities, w_gu, w_d, b_gu, b_d, gate_up_ckpt_T, down_ckpt,
                   contrib, s) /*@ ghost (T, N, V, n_max, rows) */;
    }
}

/* One thread's share of the token rows: the orphaned `omp for` (static) of moe_ref_mlp_fwd's parallel region,
 * fwd_token_row for each row t < rows (the padding row t = T, when there is one, has no slots: +0).
 *   token_start [T + 1], token_slots [V]: the slot index by token;  acc [H] when V >= 1 */
/*@ requires dims: 0 <= H && 0 <= T <= rows && rows * H <= INT64_MAX && 0 <= V && V * H <= INT64_MAX;
    requires dtype: dtype_ok(dt);
    requires index: \valid_read(token_start + (0 .. T)) && token_start[0] == 0 && token_start[T] == V &&
      sorted_offsets(token_start, T) && \valid_read(token_slots + (0 .. V - 1)) && in_range(token_slots, V, 0, V);
    requires contrib: \valid_read(contrib + (0 .. V * H - 1));
    requires acc: V >= 1 ==> \valid(acc + (0 .. H - 1)) && \separated(acc + (0 .. H - 1), contrib + (0 .. V * H - 1));
    requires out: tensor_writable((char *)out, rows * H, dt) &&
      \separated((char *)out + (0 .. byte_offset(rows * H, dt) - 1), token_slots + (0 .. V - 1),
                 token_start + (0 .. T)) &&
      (V >= 1 ==> \separated((char *)out + (0 .. byte_offset(rows * H, dt) - 1), acc + (0 .. H - 1)));
    terminates \true;
    assigns acc[0 .. (V >= 1 ? H : 0) - 1], ((char *)out)[0 .. byte_offset(rows * H, dt) - 1]; */
static void fwd_tokens(moe_dtype dt, int64_t T, int64_t H, int64_t rows, const int64_t *token_start,
                       const int64_t *token_slots, const float *contrib, float *acc, void *out) /*@ ghost (int64_t V) */
{
    /*@ loop invariant bounds: 0 <= t <= rows;
        loop assigns t, acc[0 .. (V >= 1 ? H : 0) - 1], ((char *)out)[0 .. byte_offset(rows * H, dt) - 1];
        loop variant rows - t; */
    MLP_OMP(for schedule(static))
    for (int64_t t = 0; t < rows; t++) {
        const int64_t first = t < T ? token_start[t] : 0, last = t < T ? token_start[t + 1] : 0;
        /*@ assert range: 0 <= first <= last <= V; */
        /*@ ghost lemma_row_fits(t, rows, H); */
        fwd_token_row(dt, H, contrib, token_slots, first, last, acc, out, t) /*@ ghost (V, rows) */;
    }
}

/* The allocating shell of the forward (contract on the prototype in ref/mlp_ref.h; stated, not proved: it
 * allocates, and WP 25 has no model of allocation): the slot index (build_index), the per-slot contributions
 * and the per-thread arenas, then the parallel region, in which each thread carves its scratch and runs its
 * share of the experts (fwd_experts) and of the token rows (fwd_tokens), both proved; then it frees. */
moe_status moe_ref_mlp_fwd(const moe_mlp_problem *p, const void *hidden, const void *affinities,
                           const void *w_gu, const void *w_d, const void *b_gu, const void *b_d, void *out,
                           void *gate_up_ckpt_T, void *down_ckpt)
{
    const int64_t E = p->E, B = p->B, H = p->H, I = p->I, I2 = 2 * p->I, T = p->T;
    const moe_dtype dt = p->dtype;
    const int on_i = p->affinity == MOE_AFFINITY_ON_I;
    slot_index x;
    moe_status status = build_index(p, &x);
    if (status != MOE_OK)
        return status;
    const int64_t n_max = x.max_slots;
    const int threads = threads_for(x.count, H, I);
    /* per thread: X, D [n][H]; GU [n][2I]; M [n][I]; (ON_I: M0 [n][I], D0 [n][H]); a [n]; bias rows
     * [2I + H]; bbuf */
    const double need = (double)n_max * (double)(2 * H + I2 + I + (on_i ? I + H : 0) + 2) + (double)(I2 + H);
    const size_t per_thread = need > 0x1p60 ? SIZE_MAX
                              : (size_t)n_max * (size_t)(2 * H + I2 + I + (on_i ? I + H : 0) + 2) +
                                    (size_t)(I2 + H) + PC * NC + 16 * 12;
    arena ws;
    float *contrib = alloc_floats(x.count, H);
    if (contrib == NULL || !arena_alloc(&ws, threads, per_thread)) {
        free(contrib);
        free_index(&x);
        return moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: no memory for the float32 workspace (%" PRId64
                        " slots, H = %" PRId64 ", I = %" PRId64 ")", p->op, x.count, H, I);
    }

    MLP_OMP(parallel num_threads(threads))
    {
        float *cur = ws.base + (size_t)team_member(threads) * ws.per_thread;
        float *X = carve(&cur, n_max * H), *D = carve(&cur, n_max * H), *GU = carve(&cur, n_max * I2);
        float *M = carve(&cur, n_max * I), *M0 = on_i ? carve(&cur, n_max * I) : NULL;
        float *D0 = on_i ? carve(&cur, n_max * H) : NULL;
        float *a = carve(&cur, n_max), *bgu = carve(&cur, I2), *bd = carve(&cur, H);
        float *bbuf = carve(&cur, PC * NC);
        const fwd_scratch s = {X, D, GU, M, M0, D0, a, bgu, bd, bbuf};
        const int write_d0 = on_i && down_ckpt != NULL;

        fwd_experts(p, dt, E, B, H, I, on_i, write_d0, &x, p->token_position_to_id, hidden, affinities,
                    w_gu, w_d, b_gu, b_d, gate_up_ckpt_T, down_ckpt, contrib, &s)
            /*@ ghost (T, p->N, x.count, n_max, p->token_rows) */;
        /* token rows: acc = X (n_max >= 1 whenever a token has a slot) */
        fwd_tokens(dt, T, H, p->token_rows, x.token_start, x.token_slots, contrib, X, out) /*@ ghost (x.count) */;
    }

    free(contrib);
    free(ws.base);
    free_index(&x);
    return MOE_OK;
}

/* ---------------------------------------------------------------------------------------------------
 * backward
 * ------------------------------------------------------------------------------------------------- */

/* Writes count float32 values to a gradient (old + value with accumulate), one rounding each.  v is
 * scratch and is overwritten.   dst: tensor of p->grad_dtype (elements first .. first + count - 1);  v [count] */
/*@ requires problem: \valid_read(p) && dtype_ok(p->grad_dtype);
    requires count: 0 <= first && 0 <= count && first + count <= INT64_MAX;
    requires dst: elements_writable((char *)dst, first, count, p->grad_dtype);
    requires v: \valid(v + (0 .. count - 1));
    requires separated: \separated(v + (0 .. count - 1),
      (char *)dst + (byte_offset(first, p->grad_dtype) .. byte_offset(first + count, p->grad_dtype) - 1));
    terminates \true;
    assigns v[0 .. count - 1],
      ((char *)dst)[byte_offset(first, p->grad_dtype) .. byte_offset(first + count, p->grad_dtype) - 1]; */
static void store_grad(const moe_mlp_problem *p, void *dst, int64_t first, float *v, int64_t count)
{
    if (p->accumulate)
        /*@ loop invariant bounds: 0 <= i <= count;
            loop assigns i, v[0 .. count - 1];
            loop variant count - i; */
        for (int64_t i = 0; i < count; i++)
            v[i] = moe_ref_load(p->grad_dtype, dst, first + i) + v[i];
    store_row(p->grad_dtype, dst, first, v, count);
}

/* The backward's gather of one slot i at position pos (block blk = pos / B, row b = pos % B): its affinity
 * a[i] = affinities[t][e] (t = its token), its gate/up row gu [2I] from the checkpoint gate_up_ckpt_T [N][2I][B]
 * and, when the down checkpoint is given (!recompute_d), its row d [H] of down_ckpt [N*B][H]. */
/*@ requires dims: 0 <= t < T && 0 <= e < E && T * E <= INT64_MAX && 0 <= H && 0 <= I && 2 * I <= INT64_MAX &&
      1 <= B && 0 <= pos < N * B && N * B <= INT64_MAX && N * (2 * I) <= INT64_MAX && N * (2 * I) * B <= INT64_MAX &&
      N * B * H <= INT64_MAX && 0 <= i;
    requires dtype: dtype_ok(dt);
    requires inputs: tensor_readable((char *)affinities, T * E, dt) &&
      tensor_readable((char *)gate_up_ckpt_T, N * (2 * I) * B, dt) &&
      (recompute_d == 0 ==> tensor_readable((char *)down_ckpt, N * B * H, dt));
    requires rows: \valid(a + i) && \valid(gu + (0 .. 2 * I - 1)) && \valid(d + (0 .. H - 1)) &&
      \separated(a + i, gu + (0 .. 2 * I - 1), d + (0 .. H - 1)) &&
      (recompute_d == 0 ==> \separated(d + (0 .. H - 1), (char *)down_ckpt + (0 .. byte_offset(N * B * H, dt) - 1)));
    terminates \true;
    assigns a[i], gu[0 .. 2 * I - 1], d[0 .. H - 1]; */
static void bwd_gather_slot(moe_dtype dt, int64_t E, int64_t B, int64_t H, int64_t I, int64_t e, int64_t t,
                            int64_t pos, const void *affinities, const void *gate_up_ckpt_T, const void *down_ckpt,
                            int recompute_d, float *a, int64_t i, float *gu, float *d)
    /*@ ghost (int64_t T, int64_t N) */
{
    const int64_t I2 = 2 * I, blk = pos / B, b = pos % B;
    /*@ ghost lemma_div_below(pos, N, B); */
    /*@ ghost lemma_row_fits(t, T, E); */
    /*@ ghost lemma_row_fits(blk, N, I2); */
    /*@ ghost lemma_row_fits(pos, N * B, H); */
    /*@ ghost const int64_t NI2 = N * I2; */
    a[i] = moe_ref_load(dt, affinities, t * E + e);
    const int64_t row0 = blk * I2; /* the checkpoint's rows (blk, j) start here */
    /*@ loop invariant bounds: 0 <= j <= I2;
        loop assigns j, gu[0 .. I2 - 1];
        loop variant I2 - j; */
    for (int64_t j = 0; j < I2; j++) {
        const int64_t r = row0 + j;
        /*@ ghost lemma_row_fits(r, NI2, B); */
        gu[j] = moe_ref_load(dt, gate_up_ckpt_T, r * B + b);
    }
    if (!recompute_d)
        load_f32(dt, down_ckpt, pos * H, H, d);
}

/* The per-slot input gradients of one expert: dx_slot row slots[i] [H] = column i of Tout [H][n]. */
/*@ requires dims: 0 <= n && 0 <= H && H * n <= INT64_MAX && 0 <= V && V * H <= INT64_MAX;
    requires slots: \valid_read(slots + (0 .. n - 1)) && in_range(slots, n, 0, V);
    requires Tout: \valid_read(Tout + (0 .. H * n - 1));
    requires dx_slot: \valid(dx_slot + (0 .. V * H - 1)) &&
      \separated(dx_slot + (0 .. V * H - 1), Tout + (0 .. H * n - 1));
    terminates \true;
    assigns dx_slot[0 .. V * H - 1]; */
static void bwd_dx_scatter(int64_t n, int64_t H, const int64_t *slots, const float *Tout, float *dx_slot)
    /*@ ghost (int64_t V) */
{
    /*@ loop invariant bounds: 0 <= i <= n;
        loop assigns i, dx_slot[0 .. V * H - 1];
        loop variant n - i; */
    for (int64_t i = 0; i < n; i++) {
        /*@ ghost lemma_row_fits(slots[i], V, H); */
        float *dst = dx_slot + slots[i] * H;
        /*@ loop invariant bounds: 0 <= h <= H;
            loop assigns h, dx_slot[0 .. V * H - 1];
            loop variant H - h; */
        for (int64_t h = 0; h < H; h++) {
            /*@ ghost lemma_row_fits(h, H, n); */
            dst[h] = Tout[h * n + i];
        }
    }
}

/* Token t's d_hidden row: the sum of its slots' input gradients (dx_slot rows token_slots[first .. last - 1])
 * in ascending slot order, from +0 (the first copied), rounded once.   acc [H] */
/*@ requires dims: 0 <= H && 0 <= t < rows && rows * H <= INT64_MAX && 0 <= V && V * H <= INT64_MAX;
    requires dtype: dtype_ok(dt);
    requires slots: 0 <= first <= last && \valid_read(token_slots + (first .. last - 1)) &&
      (\forall integer q; first <= q < last ==> 0 <= token_slots[q] < V);
    requires dx_slot: \valid_read(dx_slot + (0 .. V * H - 1));
    requires acc: \valid(acc + (0 .. H - 1)) && \separated(acc + (0 .. H - 1), dx_slot + (0 .. V * H - 1));
    requires out: tensor_writable((char *)d_hidden, rows * H, dt) &&
      \separated((char *)d_hidden + (0 .. byte_offset(rows * H, dt) - 1), acc + (0 .. H - 1));
    terminates \true;
    assigns acc[0 .. H - 1], ((char *)d_hidden)[byte_offset(t * H, dt) .. byte_offset(t * H + H, dt) - 1]; */
static void bwd_token_row(moe_dtype dt, int64_t H, const float *dx_slot, const int64_t *token_slots, int64_t first,
                          int64_t last, float *acc, void *d_hidden, int64_t t) /*@ ghost (int64_t V, int64_t rows) */
{
    /*@ ghost lemma_row_fits(t, rows, H); */
    /*@ loop invariant bounds: 0 <= h <= H;
        loop assigns h, acc[0 .. H - 1];
        loop variant H - h; */
    for (int64_t h = 0; h < H; h++)
        acc[h] = 0.0f;
    /*@ loop invariant bounds: first <= q <= last;
        loop assigns q, acc[0 .. H - 1];
        loop variant last - q; */
    for (int64_t q = first; q < last; q++) {
        /*@ ghost lemma_row_fits(token_slots[q], V, H); */
        const float *c = dx_slot + token_slots[q] * H;
        if (q == first) {
            copy_floats(acc, c, H);
            continue;
        }
        /*@ loop invariant bounds: 0 <= h <= H;
            loop assigns h, acc[0 .. H - 1];
            loop variant H - h; */
        MLP_SIMD
        for (int64_t h = 0; h < H; h++)
            acc[h] = acc[h] + c[h];
    }
    store_row(dt, d_hidden, t * H, acc, H);
}

/* Token t's d_affinities row (t < T): +0 but for the experts of its slots (token_slots[first .. last - 1]), each
 * the slot's affinity gradient da_slot[s]; the expert of slot s is block_to_expert[pos[s] / B].   row_e [E] */
/*@ requires dims: 0 <= t < T && T * E <= INT64_MAX && 1 <= E && 1 <= B && 0 <= N && N * B <= INT64_MAX && 0 <= V;
    requires dtype: dtype_ok(dt);
    requires slots: 0 <= first <= last && \valid_read(token_slots + (first .. last - 1)) &&
      (\forall integer q; first <= q < last ==> 0 <= token_slots[q] < V);
    requires index: \valid_read(pos + (0 .. V - 1)) && in_range(pos, V, 0, N * B) &&
      \valid_read(b2e + (0 .. N - 1)) && in_range(b2e, N, 0, E);
    requires da_slot: \valid_read(da_slot + (0 .. V - 1));
    requires row_e: \valid(row_e + (0 .. E - 1)) && \separated(row_e + (0 .. E - 1), da_slot + (0 .. V - 1));
    requires out: tensor_writable((char *)d_affinities, T * E, dt) &&
      \separated((char *)d_affinities + (0 .. byte_offset(T * E, dt) - 1), row_e + (0 .. E - 1));
    terminates \true;
    assigns row_e[0 .. E - 1], ((char *)d_affinities)[byte_offset(t * E, dt) .. byte_offset(t * E + E, dt) - 1]; */
static void bwd_token_affinities(moe_dtype dt, int64_t E, int64_t B, const int64_t *b2e, const int64_t *pos,
                                 const int64_t *token_slots, int64_t first, int64_t last, const float *da_slot,
                                 float *row_e, void *d_affinities, int64_t t)
    /*@ ghost (int64_t T, int64_t N, int64_t V) */
{
    /*@ ghost lemma_row_fits(t, T, E); */
    /*@ loop invariant bounds: 0 <= e <= E;
        loop assigns e, row_e[0 .. E - 1];
        loop variant E - e; */
    for (int64_t e = 0; e < E; e++)
        row_e[e] = 0.0f;
    /*@ loop invariant bounds: first <= q <= last;
        loop assigns q, row_e[0 .. E - 1];
        loop variant last - q; */
    for (int64_t q = first; q < last; q++) {
        const int64_t s = token_slots[q];
        /*@ ghost lemma_div_below(pos[s], N, B); */
        row_e[b2e[pos[s] / B]] = da_slot[s];
    }
    /*@ loop invariant bounds: 0 <= e <= E;
        loop assigns e, ((char *)d_affinities)[byte_offset(t * E, dt) .. byte_offset(t * E + E, dt) - 1];
        loop variant E - e; */
    for (int64_t e = 0; e < E; e++)
        moe_ref_store(dt, d_affinities, t * E + e, row_e[e]);
}

/* One thread's share of the backward's token rows: the orphaned `omp for` (static) of moe_ref_mlp_bwd's
 * parallel region; for each row t < rows its d_hidden row (bwd_token_row) and, for t < T, its d_affinities
 * row (bwd_token_affinities).  Frama-C parses it without OpenMP: the proof is of the loop run by one thread.
 *   token_start [T + 1], token_slots [V], pos [V]: the slot index;  b2e: the layout's block_to_expert [N];
 *   dx_slot [V][H], da_slot [V]: the per-slot gradients;  acc [H], row_e [E]: the thread's scratch */
/*@ requires dims: 0 <= H && 0 <= T <= rows && rows * H <= INT64_MAX && T * E <= INT64_MAX && 1 <= E && 1 <= B &&
      0 <= N && N * B <= INT64_MAX && 0 <= V && V * H <= INT64_MAX;
    requires dtype: dtype_ok(dt);
    requires index: \valid_read(token_start + (0 .. T)) && token_start[0] == 0 && token_start[T] == V &&
      sorted_offsets(token_start, T) && \valid_read(token_slots + (0 .. V - 1)) && in_range(token_slots, V, 0, V) &&
      \valid_read(pos + (0 .. V - 1)) && in_range(pos, V, 0, N * B) &&
      \valid_read(b2e + (0 .. N - 1)) && in_range(b2e, N, 0, E);
    requires slot_grads: \valid_read(dx_slot + (0 .. V * H - 1)) && \valid_read(da_slot + (0 .. V - 1));
    requires scratch: \valid(acc + (0 .. H - 1)) && \valid(row_e + (0 .. E - 1)) &&
      \separated(acc + (0 .. H - 1), row_e + (0 .. E - 1), dx_slot + (0 .. V * H - 1), da_slot + (0 .. V - 1));
    requires d_hidden: tensor_writable((char *)d_hidden, rows * H, dt) &&
      \separated((char *)d_hidden + (0 .. byte_offset(rows * H, dt) - 1), acc + (0 .. H - 1)) &&
      \separated((char *)d_hidden + (0 .. byte_offset(rows * H, dt) - 1), token_start + (0 .. T)) &&
      \separated((char *)d_hidden + (0 .. byte_offset(rows * H, dt) - 1), token_slots + (0 .. V - 1)) &&
      \separated((char *)d_hidden + (0 .. byte_offset(rows * H, dt) - 1), pos + (0 .. V - 1)) &&
      \separated((char *)d_hidden + (0 .. byte_offset(rows * H, dt) - 1), b2e + (0 .. N - 1));
    requires d_affinities: tensor_writable((char *)d_affinities, T * E, dt) &&
      \separated((char *)d_affinities + (0 .. byte_offset(T * E, dt) - 1), row_e + (0 .. E - 1)) &&
      \separated((char *)d_affinities + (0 .. byte_offset(T * E, dt) - 1), token_start + (0 .. T)) &&
      \separated((char *)d_affinities + (0 .. byte_offset(T * E, dt) - 1), token_slots + (0 .. V - 1)) &&
      \separated((char *)d_affinities + (0 .. byte_offset(T * E, dt) - 1), pos + (0 .. V - 1)) &&
      \separated((char *)d_affinities + (0 .. byte_offset(T * E, dt) - 1), b2e + (0 .. N - 1));
    terminates \true;
    assigns acc[0 .. H - 1], row_e[0 .. E - 1], ((char *)d_hidden)[0 .. byte_offset(rows * H, dt) - 1],
      ((char *)d_affinities)[0 .. byte_offset(T * E, dt) - 1]; */
static void bwd_tokens(moe_dtype dt, int64_t T, int64_t E, int64_t B, int64_t H, int64_t rows,
                       const int64_t *token_start, const int64_t *token_slots, const int64_t *pos, const int64_t *b2e,
                       const float *dx_slot, const float *da_slot, float *acc, float *row_e, void *d_hidden,
                       void *d_affinities) /*@ ghost (int64_t N, int64_t V) */
{
    /*@ loop invariant bounds: 0 <= t <= rows;
        loop assigns t, acc[0 .. H - 1], row_e[0 .. E - 1], ((char *)d_hidden)[0 .. byte_offset(rows * H, dt) - 1],
          ((char *)d_affinities)[0 .. byte_offset(T * E, dt) - 1];
        loop variant rows - t; */
    MLP_OMP(for schedule(static))
    for (int64_t t = 0; t < rows; t++) {
        const int64_t first = t < T ? token_start[t] : 0, last = t < T ? token_start[t + 1] : 0;
        /*@ assert range: 0 <= first <= last <= V; */
        bwd_token_row(dt, H, dx_slot, token_slots, first, last, acc, d_hidden, t) /*@ ghost (V, rows) */;
        if (t >= T)
            continue;
        bwd_token_affinities(dt, E, B, b2e, pos, token_slots, first, last, da_slot, row_e, d_affinities, t)
            /*@ ghost (T, N, V) */;
    }
}

/* m = act(g) * u for one expert's n slots, unscaled and unrounded.  GU [n][2I] (g, then u); M [n][I] (overwritten). */
/*@ requires dims: 0 <= n && 0 <= I && 2 * I <= INT64_MAX && n * I <= INT64_MAX && n * (2 * I) <= INT64_MAX;
    requires GU: \valid_read(GU + (0 .. n * (2 * I) - 1));
    requires M: \valid(M + (0 .. n * I - 1)) && \separated(M + (0 .. n * I - 1), GU + (0 .. n * (2 * I) - 1));
    terminates \true;
    assigns M[0 .. n * I - 1], errno; */
static void bwd_m_rows(moe_mlp_activation act, int64_t n, int64_t I, const float *GU, float *M)
{
    const int64_t I2 = 2 * I;
    /*@ loop invariant bounds: 0 <= i <= n;
        loop assigns i, M[0 .. n * I - 1], errno;
        loop variant n - i; */
    for (int64_t i = 0; i < n; i++) {
        /*@ ghost lemma_row_fits(i, n, I2); */
        /*@ ghost lemma_row_fits(i, n, I); */
        /*@ loop invariant bounds: 0 <= j <= I;
            loop assigns j, M[0 .. n * I - 1], errno;
            loop variant I - j; */
        for (int64_t j = 0; j < I; j++)
            M[i * I + j] = act_of(act, GU[i * I2 + j]) * GU[i * I2 + I + j];
    }
}

/* The affinity gradient and the a-scaled rows of one expert's n slots: da_slot[slots[i]] = <G row i, D row i>
 * (D: the slot's down-projection output, bias included), dD row i = a[i] * G row i, and with ON_I (on_i)
 * M row i scaled by a[i] in place.  G, D, dD [n][H]; a [n]; M [n][I]; da_slot [V]. */
/*@ requires dims: 0 <= n && 0 <= H && 0 <= I && n * H <= INT64_MAX && n * I <= INT64_MAX && 0 <= V;
    requires slots: \valid_read(slots + (0 .. n - 1)) && in_range(slots, n, 0, V);
    requires inputs: \valid_read(G + (0 .. n * H - 1)) && \valid_read(D + (0 .. n * H - 1)) &&
      \valid_read(a + (0 .. n - 1));
    requires outputs: \valid(da_slot + (0 .. V - 1)) && \valid(dD + (0 .. n * H - 1)) && \valid(M + (0 .. n * I - 1));
    requires apart: \separated(da_slot + (0 .. V - 1), dD + (0 .. n * H - 1), M + (0 .. n * I - 1),
                                G + (0 .. n * H - 1), D + (0 .. n * H - 1), a + (0 .. n - 1));
    terminates \true;
    assigns da_slot[0 .. V - 1], dD[0 .. n * H - 1], M[0 .. n * I - 1]; */
static void bwd_affinity_rows(int64_t n, int64_t H, int64_t I, int on_i, const int64_t *slots, const float *G,
                              const float *D, const float *a, float *da_slot, float *dD, float *M)
    /*@ ghost (int64_t V) */
{
    /*@ loop invariant bounds: 0 <= i <= n;
        loop assigns i, da_slot[0 .. V - 1], dD[0 .. n * H - 1], M[0 .. n * I - 1];
        loop variant n - i; */
    for (int64_t i = 0; i < n; i++) {
        /*@ ghost lemma_row_fits(i, n, H); */
        /*@ ghost lemma_row_fits(i, n, I); */
        da_slot[slots[i]] = dot_seq(G + i * H, D + i * H, H);
        /*@ loop invariant bounds: 0 <= h <= H;
            loop assigns h, dD[0 .. n * H - 1];
            loop variant H - h; */
        for (int64_t h = 0; h < H; h++)
            dD[i * H + h] = a[i] * G[i * H + h];
        if (on_i) {
            /*@ loop invariant bounds: 0 <= j <= I;
                loop assigns j, M[0 .. n * I - 1];
                loop variant I - j; */
            for (int64_t j = 0; j < I; j++)
                M[i * I + j] = M[i * I + j] * a[i];
        }
    }
}

/* act_derivative with its contract reduced to termination and errno (as act_of). */
/*@ terminates \true;
    assigns errno; */
static inline float act_derivative_of(moe_mlp_activation act, float x)
{
    return act_derivative(act, x);
}

/* The gate/up gradients of one expert's n slots from the checkpointed g, u and the gradient dm of m:
 * dg = (dm' u) act'(g), du = dm' act(g), each 0 where its value fails the strict limits (nl for g, lin for u;
 * a limit applies when p's flag is set); dm' = a dm with ON_I (on_i), dm otherwise.
 * GU [n][2I] (g, then u); dM [n][I]; a [n]; dGU [n][2I] (dg, then du; overwritten). */
/*@ requires dims: 0 <= n && 0 <= I && 2 * I <= INT64_MAX && n * I <= INT64_MAX && n * (2 * I) <= INT64_MAX;
    requires problem: \valid_read(p);
    requires inputs: \valid_read(GU + (0 .. n * (2 * I) - 1)) && \valid_read(dM + (0 .. n * I - 1)) &&
      \valid_read(a + (0 .. n - 1));
    requires out: \valid(dGU + (0 .. n * (2 * I) - 1)) &&
      \separated(dGU + (0 .. n * (2 * I) - 1), GU + (0 .. n * (2 * I) - 1), dM + (0 .. n * I - 1), a + (0 .. n - 1), p);
    terminates \true;
    assigns dGU[0 .. n * (2 * I) - 1], errno; */
static void bwd_gate_grads(const moe_mlp_problem *p, int64_t n, int64_t I, int on_i, float nl_lo, float nl_hi,
                           float lin_lo, float lin_hi, const float *GU, const float *dM, const float *a, float *dGU)
{
    const int64_t I2 = 2 * I;
    /*@ loop invariant bounds: 0 <= i <= n;
        loop assigns i, dGU[0 .. n * (2 * I) - 1], errno;
        loop variant n - i; */
    for (int64_t i = 0; i < n; i++) {
        /*@ ghost lemma_row_fits(i, n, I2); */
        /*@ ghost lemma_row_fits(i, n, I); */
        const float *g = GU + i * I2, *u = g + I;
        float *dg = dGU + i * I2, *du = dg + I;
        const float *dm = dM + i * I;
        /*@ loop invariant bounds: 0 <= j <= I;
            loop assigns j, dGU[0 .. n * (2 * I) - 1], errno;
            loop variant I - j; */
        for (int64_t j = 0; j < I; j++) {
            const float dmj = on_i ? a[i] * dm[j] : dm[j];
            const int g_free = (!p->has_nl_lo || nl_lo < g[j]) && (!p->has_nl_hi || g[j] < nl_hi);
            const int u_free = (!p->has_lin_lo || lin_lo < u[j]) && (!p->has_lin_hi || u[j] < lin_hi);
            dg[j] = g_free ? (dmj * u[j]) * act_derivative_of(p->activation, g[j]) : 0.0f;
            du[j] = u_free ? dmj * act_of(p->activation, g[j]) : 0.0f;
        }
    }
}

/* C[c] = the sum of column c of src [n][W] over its n rows, in ascending row order from +0 (the bias gradients'
 * sums).  C [W] (overwritten). */
/*@ requires dims: 0 <= n && 0 <= W && n * W <= INT64_MAX;
    requires src: \valid_read(src + (0 .. n * W - 1));
    requires C: \valid(C + (0 .. W - 1)) && \separated(C + (0 .. W - 1), src + (0 .. n * W - 1));
    terminates \true;
    assigns C[0 .. W - 1]; */
static void sum_rows(int64_t n, int64_t W, const float *src, float *C)
{
    /*@ loop invariant bounds: 0 <= c <= W;
        loop assigns c, C[0 .. W - 1];
        loop variant W - c; */
    for (int64_t c = 0; c < W; c++)
        C[c] = 0.0f;
    /*@ loop invariant bounds: 0 <= i <= n;
        loop assigns i, C[0 .. W - 1];
        loop variant n - i; */
    for (int64_t i = 0; i < n; i++) {
        /*@ ghost lemma_row_fits(i, n, W); */
        /*@ loop invariant bounds: 0 <= c <= W;
            loop assigns c, C[0 .. W - 1];
            loop variant W - c; */
        for (int64_t c = 0; c < W; c++)
            C[c] = C[c] + src[i * W + c];
    }
}

/* d recomputed (ON_I without a down checkpoint), as the forward's down checkpoint: D [n][H] = rnd(M) . W_d[e]
 * (+ b_d[e]), rnd only with round_intermediates (M itself stays unrounded: d_w_d rounds a*m, not m; Mr [n][I]
 * holds the rounded copy).  M [n][I]; w_d [E][I][H], b_d [E][H] (read with bias) of dtype dt;  bd [H], bbuf
 * [PC*NC] scratch */
/*@ requires problem: \valid_read(p);
    requires dims: 0 <= e < E && 1 <= n && 0 <= H <= INT64_MAX - NC && 0 <= I <= INT64_MAX - PC &&
      n * I <= INT64_MAX && n * H <= INT64_MAX && E * H <= INT64_MAX && E * I <= INT64_MAX && E * I * H <= INT64_MAX;
    requires dtype: dtype_ok(dt);
    requires weights: tensor_readable((char *)w_d, E * I * H, dt) &&
      (p->bias != 0 ==> tensor_readable((char *)b_d, E * H, dt) &&
                        \separated(bd + (0 .. H - 1), (char *)b_d + (0 .. byte_offset(E * H, dt) - 1)));
    requires scratch: \valid_read(M + (0 .. n * I - 1)) && \valid(Mr + (0 .. n * I - 1)) &&
      \valid(D + (0 .. n * H - 1)) && \valid(bd + (0 .. H - 1)) && \valid(bbuf + (0 .. PC * NC - 1)) &&
      \separated(M + (0 .. n * I - 1), Mr + (0 .. n * I - 1), D + (0 .. n * H - 1), bd + (0 .. H - 1),
                 bbuf + (0 .. PC * NC - 1), p);
    terminates \true;
    assigns Mr[0 .. n * I - 1], D[0 .. n * H - 1], bd[0 .. H - 1], bbuf[0 .. PC * NC - 1]; */
static void bwd_recompute_d(const moe_mlp_problem *p, moe_dtype dt, int64_t H, int64_t I, int64_t e, int64_t n,
                            const float *M, float *Mr, const void *w_d, const void *b_d, float *D, float *bd,
                            float *bbuf) /*@ ghost (int64_t E) */
{
    const float *Md = M;
    if (p->round_intermediates) {
        copy_floats(Mr, M, n * I);
        round_row(dt, Mr, n * I);
        Md = Mr;
    }
    /*@ ghost lemma_row_fits(e, E, I); */
    /*@ ghost lemma_mul_monotone(e * I + I, E * I, H); */
    /*@ ghost lemma_row_fits(n - 1, n, I); */
    mm_nn(n, H, I, Md, I, 1, dt, w_d, e * I * H, H, D, H, bbuf);
    if (!p->bias)
        return;
    /*@ ghost lemma_row_fits(e, E, H); */
    load_f32(dt, b_d, e * H, H, bd);
    /*@ loop invariant bounds: 0 <= i <= n;
        loop assigns i, D[0 .. n * H - 1];
        loop variant n - i; */
    for (int64_t i = 0; i < n; i++) {
        /*@ ghost lemma_row_fits(i, n, H); */
        /*@ loop invariant bounds: 0 <= h <= H;
            loop assigns h, D[0 .. n * H - 1];
            loop variant H - h; */
        for (int64_t h = 0; h < H; h++)
            D[i * H + h] = D[i * H + h] + bd[h];
    }
}

/* One expert's weight gradient and, with bias, its bias gradient, each through store_grad (p->grad_dtype, one
 * rounding, old + value with accumulate): dw[e][r][c] = sum_{i = 0 .. n-1 ascending} A[i][r] * S[i][c] (mm_nn_f32
 * of A^T in chunks of RC rows r, C holding one chunk), db[e][c] = sum_i bsrc[i][c] (sum_rows).  d_w_d: A = M,
 * S = dD (ON_H) or G (ON_I), bsrc = dD; d_w_gu: A = X, S = bsrc = dGU.
 *   A [n][R], S [n][W], bsrc [n][W];  C [RC*cw] scratch (ghost cw >= W: its row capacity);  dw [E][R][W], db [E][W] (written with bias) */
/*@ requires problem: \valid_read(p) && dtype_ok(p->grad_dtype);
    requires dims: 0 <= e < E && 0 <= n <= INT64_MAX - PC && 0 <= R <= INT64_MAX - RC && 0 <= W <= INT64_MAX - NC &&
      n * R <= INT64_MAX && n * W <= INT64_MAX && E * R <= INT64_MAX && E * R * W <= INT64_MAX &&
      E * W <= INT64_MAX && W <= cw && RC * cw <= INT64_MAX;
    requires inputs: \valid_read(A + (0 .. n * R - 1)) && \valid_read(S + (0 .. n * W - 1)) &&
      \valid_read(bsrc + (0 .. n * W - 1));
    requires C: \valid(C + (0 .. RC * cw - 1)) && \separated(C + (0 .. RC * cw - 1), p);
    requires C_A: \separated(C + (0 .. RC * cw - 1), A + (0 .. n * R - 1));
    requires C_S: \separated(C + (0 .. RC * cw - 1), S + (0 .. n * W - 1));
    requires C_bsrc: \separated(C + (0 .. RC * cw - 1), bsrc + (0 .. n * W - 1));
    requires dw: tensor_writable((char *)dw, E * R * W, p->grad_dtype) &&
      \separated((char *)dw + (0 .. byte_offset(E * R * W, p->grad_dtype) - 1), C + (0 .. RC * cw - 1), p);
    requires db: p->bias != 0 ==> tensor_writable((char *)db, E * W, p->grad_dtype) &&
      \separated((char *)db + (0 .. byte_offset(E * W, p->grad_dtype) - 1), C + (0 .. RC * cw - 1), p);
    terminates \true;
    assigns C[0 .. RC * cw - 1], ((char *)dw)[0 .. byte_offset(E * R * W, p->grad_dtype) - 1],
      ((char *)db)[0 .. byte_offset(p->bias != 0 ? E * W : 0, p->grad_dtype) - 1]; */
static void bwd_weight_grad(const moe_mlp_problem *p, int64_t e, int64_t n, int64_t R, int64_t W, const float *A,
                            const float *S, const float *bsrc, float *C, void *dw, void *db)
    /*@ ghost (int64_t E, int64_t cw) */
{
    /*@ ghost lemma_mul_monotone(W, cw, RC); */
    /*@ ghost lemma_row_fits(e, E, R); */
    /*@ ghost if (n >= 1) lemma_row_fits(n - 1, n, R); */
    /*@ loop invariant chunks: 0 <= r0 < R + RC;
        loop assigns r0, C[0 .. RC * cw - 1], ((char *)dw)[0 .. byte_offset(E * R * W, p->grad_dtype) - 1];
        loop variant R - r0; */
    for (int64_t r0 = 0; r0 < R; r0 += RC) {
        const int64_t rc = R - r0 < RC ? R - r0 : RC;
        /*@ ghost lemma_mul_monotone(rc, RC, W); */
        /*@ ghost lemma_mul_monotone(e * R + r0 + rc, E * R, W); */
        /*@ ghost lemma_mul_monotone(e * R + r0, e * R + r0 + rc, W); */
        mm_nn_f32(rc, W, n, A + r0, 1, R, S, W, C, W);
        store_grad(p, dw, (e * R + r0) * W, C, rc * W);
    }
    if (p->bias) {
        /*@ ghost lemma_row_fits(e, E, W); */
        sum_rows(n, W, bsrc, C);
        store_grad(p, db, e * W, C, W);
    }
}

/* Tout [R][n] = W[e] . src^T: Tout[r][i] = sum_{c = 0 .. K-1 ascending} W[e][r][c] * src[i][c] (W[e]: elements
 * woff + r*K + c of a dtype tensor), through Tin = src^T and mm_wn (the weight row converted once, the inner loop
 * across the n slots).  The backward's dM (W = W_d[e], K = H, R = I) and per-slot dX (W = W_gu[e], K = 2I, R = H).
 *   src [n][K];  Tin [K*n], Tout [R*n], wrow [K] scratch */
/*@ requires dims: 1 <= n <= INT64_MAX - NC && 0 <= K <= INT64_MAX - 32 && 0 <= R && n <= INT64_MAX - 32 &&
      n * K <= INT64_MAX && R * n <= INT64_MAX && 0 <= woff && woff + R * K <= INT64_MAX;
    requires dtype: dtype_ok(wdt);
    requires weight: elements_readable((char *)w, woff, R * K, wdt);
    requires src: \valid_read(src + (0 .. n * K - 1));
    requires scratch: \valid(Tin + (0 .. n * K - 1)) && \valid(Tout + (0 .. R * n - 1)) &&
      \valid(wrow + (0 .. K - 1)) &&
      \separated(Tin + (0 .. n * K - 1), Tout + (0 .. R * n - 1), wrow + (0 .. K - 1), src + (0 .. n * K - 1));
    terminates \true;
    assigns Tin[0 .. n * K - 1], Tout[0 .. R * n - 1], wrow[0 .. K - 1]; */
static void bwd_weight_rows(int64_t n, int64_t K, int64_t R, moe_dtype wdt, const void *w, int64_t woff,
                            const float *src, float *Tin, float *Tout, float *wrow)
{
    transpose(n, K, src, K, Tin);
    mm_wn(R, n, K, wdt, w, woff, K, Tin, n, Tout, n, wrow);
}

/* The backward's per-thread scratch, carved from the thread's arena (n_max: the most slots of one expert;
 * wide = max(H, 2I, 1)): X, G, Dk, dD [n_max][H]; Tin, Tout [n_max][wide]; GU, dGU [n_max][2I]; M, dM
 * [n_max][I]; a [n_max]; C [RC][wide]; brow [wide]; bd [H]; bbuf [PC*NC]. */
typedef struct bwd_scratch {
    float *X, *G, *Dk, *dD, *Tin, *Tout, *GU, *dGU, *M, *dM, *a, *C, *brow, *bd, *bbuf;
} bwd_scratch;

/*@ // The backward's dims as values: the forward's, and the width of the transposed and chunk scratch
    predicate bwd_dims(integer T, integer E, integer N, integer B, integer H, integer I, integer V,
                       integer n_max, integer rows, integer wide) =
      fwd_dims(T, E, N, B, H, I, V, n_max, rows) && 1 <= wide <= INT64_MAX - NC && H <= wide && 2 * I <= wide &&
      n_max <= INT64_MAX - NC && n_max * wide <= INT64_MAX && RC * wide <= INT64_MAX;

    // the scratch s and the per-slot gradients dx_slot [V][H], da_slot [V]: valid, pairwise apart
    predicate bwd_scratch_ok{L}(bwd_scratch *s, float *dx_slot, float *da_slot, integer V, integer n_max,
                                integer H, integer I, integer wide) =
      \valid_read(s) && \valid(dx_slot + (0 .. V * H - 1)) && \valid(da_slot + (0 .. V - 1)) &&
      \valid(s->X + (0 .. n_max * H - 1)) && \valid(s->G + (0 .. n_max * H - 1)) &&
      \valid(s->Dk + (0 .. n_max * H - 1)) && \valid(s->dD + (0 .. n_max * H - 1)) &&
      \valid(s->Tin + (0 .. n_max * wide - 1)) && \valid(s->Tout + (0 .. n_max * wide - 1)) &&
      \valid(s->GU + (0 .. n_max * (2 * I) - 1)) && \valid(s->dGU + (0 .. n_max * (2 * I) - 1)) &&
      \valid(s->M + (0 .. n_max * I - 1)) && \valid(s->dM + (0 .. n_max * I - 1)) &&
      \valid(s->a + (0 .. n_max - 1)) && \valid(s->C + (0 .. RC * wide - 1)) &&
      \valid(s->brow + (0 .. wide - 1)) && \valid(s->bd + (0 .. H - 1)) && \valid(s->bbuf + (0 .. PC * NC - 1)) &&
      \separated(s->X + (0 .. n_max * H - 1), s->G + (0 .. n_max * H - 1), s->Dk + (0 .. n_max * H - 1),
                 s->dD + (0 .. n_max * H - 1), s->Tin + (0 .. n_max * wide - 1),
                 s->Tout + (0 .. n_max * wide - 1), s->GU + (0 .. n_max * (2 * I) - 1),
                 s->dGU + (0 .. n_max * (2 * I) - 1), s->M + (0 .. n_max * I - 1), s->dM + (0 .. n_max * I - 1),
                 s->a + (0 .. n_max - 1), s->C + (0 .. RC * wide - 1), s->brow + (0 .. wide - 1),
                 s->bd + (0 .. H - 1), s->bbuf + (0 .. PC * NC - 1), dx_slot + (0 .. V * H - 1),
                 da_slot + (0 .. V - 1));

    // bytes q[0 .. bytes - 1] apart from every float the backward writes
    predicate bwd_floats_apart{L}(bwd_scratch *s, float *dx_slot, float *da_slot, integer V, integer n_max,
                                  integer H, integer I, integer wide, char *q, integer bytes) =
      \separated(q + (0 .. bytes - 1), s->X + (0 .. n_max * H - 1)) &&
      \separated(q + (0 .. bytes - 1), s->G + (0 .. n_max * H - 1)) &&
      \separated(q + (0 .. bytes - 1), s->Dk + (0 .. n_max * H - 1)) &&
      \separated(q + (0 .. bytes - 1), s->dD + (0 .. n_max * H - 1)) &&
      \separated(q + (0 .. bytes - 1), s->Tin + (0 .. n_max * wide - 1)) &&
      \separated(q + (0 .. bytes - 1), s->Tout + (0 .. n_max * wide - 1)) &&
      \separated(q + (0 .. bytes - 1), s->GU + (0 .. n_max * (2 * I) - 1)) &&
      \separated(q + (0 .. bytes - 1), s->dGU + (0 .. n_max * (2 * I) - 1)) &&
      \separated(q + (0 .. bytes - 1), s->M + (0 .. n_max * I - 1)) &&
      \separated(q + (0 .. bytes - 1), s->dM + (0 .. n_max * I - 1)) &&
      \separated(q + (0 .. bytes - 1), s->a + (0 .. n_max - 1)) &&
      \separated(q + (0 .. bytes - 1), s->C + (0 .. RC * wide - 1)) &&
      \separated(q + (0 .. bytes - 1), s->brow + (0 .. wide - 1)) &&
      \separated(q + (0 .. bytes - 1), s->bd + (0 .. H - 1)) &&
      \separated(q + (0 .. bytes - 1), s->bbuf + (0 .. PC * NC - 1)) &&
      \separated(q + (0 .. bytes - 1), dx_slot + (0 .. V * H - 1)) &&
      \separated(q + (0 .. bytes - 1), da_slot + (0 .. V - 1));

    // the same for the problem struct (its float fields: the clamp limits)
    predicate bwd_floats_apart_p{L}(bwd_scratch *s, float *dx_slot, float *da_slot, integer V, integer n_max,
                                    integer H, integer I, integer wide, moe_mlp_problem *p) =
      \separated(p, s->X + (0 .. n_max * H - 1)) && \separated(p, s->G + (0 .. n_max * H - 1)) &&
      \separated(p, s->Dk + (0 .. n_max * H - 1)) && \separated(p, s->dD + (0 .. n_max * H - 1)) &&
      \separated(p, s->Tin + (0 .. n_max * wide - 1)) && \separated(p, s->Tout + (0 .. n_max * wide - 1)) &&
      \separated(p, s->GU + (0 .. n_max * (2 * I) - 1)) && \separated(p, s->dGU + (0 .. n_max * (2 * I) - 1)) &&
      \separated(p, s->M + (0 .. n_max * I - 1)) && \separated(p, s->dM + (0 .. n_max * I - 1)) &&
      \separated(p, s->a + (0 .. n_max - 1)) && \separated(p, s->C + (0 .. RC * wide - 1)) &&
      \separated(p, s->brow + (0 .. wide - 1)) && \separated(p, s->bd + (0 .. H - 1)) &&
      \separated(p, s->bbuf + (0 .. PC * NC - 1)) && \separated(p, dx_slot + (0 .. V * H - 1)) &&
      \separated(p, da_slot + (0 .. V - 1));

    // the input tensors of the backward: readable (b_d only when d is recomputed with bias, down_ckpt only
    // when it is given)
    predicate bwd_inputs_at{L}(char *hidden, char *affinities, char *w_gu, char *w_d, char *b_d,
                               char *gate_up_ckpt_T, char *down_ckpt, char *out_grad, integer recompute_d,
                               integer rows, integer T, integer E, integer N, integer B, integer H, integer I,
                               integer bias, moe_dtype dt) =
      tensor_readable(hidden, rows * H, dt) && tensor_readable(out_grad, rows * H, dt) &&
      tensor_readable(affinities, T * E, dt) && tensor_readable(w_gu, E * H * (2 * I), dt) &&
      tensor_readable(w_d, E * I * H, dt) && tensor_readable(gate_up_ckpt_T, N * (2 * I) * B, dt) &&
      (recompute_d == 0 ==> tensor_readable(down_ckpt, N * B * H, dt)) &&
      (recompute_d != 0 && bias != 0 ==> tensor_readable(b_d, E * H, dt));

    // the inputs copied into the scratch (hidden, out_grad, down_ckpt, b_d) apart from the floats written
    predicate bwd_inputs_apart{L}(char *hidden, char *out_grad, char *down_ckpt, char *b_d, integer recompute_d,
                                  integer rows, integer E, integer N, integer B, integer H, integer bias,
                                  moe_dtype dt, bwd_scratch *s, float *dx_slot, float *da_slot, integer V,
                                  integer n_max, integer I, integer wide) =
      bwd_floats_apart(s, dx_slot, da_slot, V, n_max, H, I, wide, hidden, byte_offset(rows * H, dt)) &&
      bwd_floats_apart(s, dx_slot, da_slot, V, n_max, H, I, wide, out_grad, byte_offset(rows * H, dt)) &&
      (recompute_d == 0 ==>
         bwd_floats_apart(s, dx_slot, da_slot, V, n_max, H, I, wide, down_ckpt, byte_offset(N * B * H, dt))) &&
      (recompute_d != 0 && bias != 0 ==>
         bwd_floats_apart(s, dx_slot, da_slot, V, n_max, H, I, wide, b_d, byte_offset(E * H, dt)));

    // a gradient output g of count elements of grad dtype gd: writable, apart from the problem and the floats
    predicate bwd_grad_ok{L}(char *g, integer count, moe_dtype gd, moe_mlp_problem *p, bwd_scratch *s,
                             float *dx_slot, float *da_slot, integer V, integer n_max, integer H, integer I,
                             integer wide) =
      tensor_writable(g, count, gd) && \separated(g + (0 .. byte_offset(count, gd) - 1), p) &&
      bwd_floats_apart(s, dx_slot, da_slot, V, n_max, H, I, wide, g, byte_offset(count, gd));
*/

/* bwd_expert's gather: X, G [n][H] the hidden and output-gradient rows of its slots' tokens, and per slot
 * (bwd_gather_slot) its affinity a[i], its gate/up checkpoint row GU [2I] and, with the down checkpoint, its
 * row Dk [H]. */
/*@ requires dims: 0 <= e < E && 0 <= n <= n_max && 0 <= H && 0 <= I && 2 * I <= INT64_MAX && 0 <= T <= rows &&
      rows * H <= INT64_MAX && T * E <= INT64_MAX && 1 <= B && 0 <= N && N * B <= INT64_MAX &&
      N * (2 * I) <= INT64_MAX && N * (2 * I) * B <= INT64_MAX && N * B * H <= INT64_MAX && 0 <= V &&
      n_max * H <= INT64_MAX && n_max * (2 * I) <= INT64_MAX;
    requires dtype: dtype_ok(dt);
    requires slots: \valid_read(slots + (0 .. n - 1)) && in_range(slots, n, 0, V);
    requires index: \valid_read(pos + (0 .. V - 1)) && in_range(pos, V, 0, N * B) &&
      \valid_read(token + (0 .. V - 1)) && in_range(token, V, 0, T);
    requires inputs: tensor_readable((char *)hidden, rows * H, dt) && tensor_readable((char *)out_grad, rows * H, dt) &&
      tensor_readable((char *)affinities, T * E, dt) && tensor_readable((char *)gate_up_ckpt_T, N * (2 * I) * B, dt) &&
      (recompute_d == 0 ==> tensor_readable((char *)down_ckpt, N * B * H, dt));
    requires scratch: \valid(X + (0 .. n_max * H - 1)) && \valid(G + (0 .. n_max * H - 1)) &&
      \valid(a + (0 .. n_max - 1)) && \valid(GU + (0 .. n_max * (2 * I) - 1)) && \valid(Dk + (0 .. n_max * H - 1)) &&
      \separated(X + (0 .. n_max * H - 1), G + (0 .. n_max * H - 1), a + (0 .. n_max - 1),
                 GU + (0 .. n_max * (2 * I) - 1), Dk + (0 .. n_max * H - 1));
    requires apart: \separated(X + (0 .. n_max * H - 1), (char *)hidden + (0 .. byte_offset(rows * H, dt) - 1)) &&
      \separated(G + (0 .. n_max * H - 1), (char *)out_grad + (0 .. byte_offset(rows * H, dt) - 1)) &&
      (recompute_d == 0 ==>
         \separated(Dk + (0 .. n_max * H - 1), (char *)down_ckpt + (0 .. byte_offset(N * B * H, dt) - 1)));
    terminates \true;
    assigns X[0 .. n_max * H - 1], G[0 .. n_max * H - 1], a[0 .. n_max - 1], GU[0 .. n_max * (2 * I) - 1],
      Dk[0 .. n_max * H - 1]; */
static void bwd_gather(moe_dtype dt, int64_t E, int64_t B, int64_t H, int64_t I, int64_t e, const int64_t *slots,
                       int64_t n, const int64_t *pos, const int64_t *token, const void *hidden, const void *out_grad,
                       const void *affinities, const void *gate_up_ckpt_T, const void *down_ckpt, int recompute_d,
                       float *X, float *G, float *a, float *GU, float *Dk)
    /*@ ghost (int64_t T, int64_t N, int64_t V, int64_t rows, int64_t n_max) */
{
    const int64_t I2 = 2 * I;
    /*@ ghost lemma_mul_monotone(n, n_max, H); */
    gather_rows(dt, hidden, slots, token, n, H, X) /*@ ghost (V, rows) */;
    gather_rows(dt, out_grad, slots, token, n, H, G) /*@ ghost (V, rows) */;
    /*@ loop invariant bounds: 0 <= i <= n;
        loop assigns i, a[0 .. n_max - 1], GU[0 .. n_max * I2 - 1], Dk[0 .. n_max * H - 1];
        loop variant n - i; */
    for (int64_t i = 0; i < n; i++) {
        /*@ ghost lemma_row_fits(i, n_max, I2); */
        /*@ ghost lemma_row_fits(i, n_max, H); */
        bwd_gather_slot(dt, E, B, H, I, e, token[slots[i]], pos[slots[i]], affinities, gate_up_ckpt_T, down_ckpt,
                        recompute_d, a, i, GU + i * I2, Dk + i * H) /*@ ghost (T, N) */;
    }
}

/* bwd_expert's down stage: M = act(g) u (bwd_m_rows), d recomputed when recompute_d (bwd_recompute_d), the
 * affinity gradients da_slot and dD = a G, with ON_I M scaled by a (bwd_affinity_rows), with round_intermediates
 * M and dD rounded, then d_w_d[e] and db_d[e] (bwd_weight_grad of M against dD with ON_H, G with ON_I) and
 * dM = (W_d[e] . dDsrc^T)^T (bwd_weight_rows, transpose).
 *   G, Dk, dD [n][H]; GU [n][2I]; M, dM [n][I]; a [n]; Tin, Tout [n][wide]; C [RC][wide]; brow [wide]; bd [H];
 *   bbuf [PC*NC]; da_slot [V]; d_w_d [E][I][H], d_b_d [E][H] (with bias) of p->grad_dtype */
/*@ requires problem: \valid_read(p) && dtype_ok(p->grad_dtype);
    requires dims: 0 <= e < E && 0 <= n <= n_max && 0 <= H <= wide && 0 <= I && 2 * I <= wide &&
      1 <= wide <= INT64_MAX - NC && n_max <= INT64_MAX - NC && n_max * wide <= INT64_MAX && RC * wide <= INT64_MAX &&
      n_max * H <= INT64_MAX && n_max * I <= INT64_MAX && n_max * (2 * I) <= INT64_MAX && E * H <= INT64_MAX &&
      E * I <= INT64_MAX && E * I * H <= INT64_MAX && 0 <= V;
    requires dtype: dtype_ok(dt);
    requires slots: \valid_read(slots + (0 .. n - 1)) && in_range(slots, n, 0, V);
    requires weights: tensor_readable((char *)w_d, E * I * H, dt) &&
      (recompute_d != 0 && p->bias != 0 ==> tensor_readable((char *)b_d, E * H, dt) &&
         \separated(bd + (0 .. H - 1), (char *)b_d + (0 .. byte_offset(E * H, dt) - 1)));
    requires scratch: \valid_read(G + (0 .. n_max * H - 1)) && \valid(Dk + (0 .. n_max * H - 1)) &&
      \valid(dD + (0 .. n_max * H - 1)) && \valid_read(GU + (0 .. n_max * (2 * I) - 1)) &&
      \valid(M + (0 .. n_max * I - 1)) && \valid(dM + (0 .. n_max * I - 1)) && \valid_read(a + (0 .. n_max - 1)) &&
      \valid(Tin + (0 .. n_max * wide - 1)) && \valid(Tout + (0 .. n_max * wide - 1)) &&
      \valid(C + (0 .. RC * wide - 1)) && \valid(brow + (0 .. wide - 1)) && \valid(bd + (0 .. H - 1)) &&
      \valid(bbuf + (0 .. PC * NC - 1)) && \valid(da_slot + (0 .. V - 1)) &&
      \separated(G + (0 .. n_max * H - 1), Dk + (0 .. n_max * H - 1), dD + (0 .. n_max * H - 1),
                 GU + (0 .. n_max * (2 * I) - 1), M + (0 .. n_max * I - 1), dM + (0 .. n_max * I - 1),
                 a + (0 .. n_max - 1), Tin + (0 .. n_max * wide - 1), Tout + (0 .. n_max * wide - 1),
                 C + (0 .. RC * wide - 1), brow + (0 .. wide - 1), bd + (0 .. H - 1), bbuf + (0 .. PC * NC - 1),
                 da_slot + (0 .. V - 1), p);
    requires d_w_d: tensor_writable((char *)d_w_d, E * I * H, p->grad_dtype) &&
      \separated((char *)d_w_d + (0 .. byte_offset(E * I * H, p->grad_dtype) - 1), C + (0 .. RC * wide - 1), p);
    requires d_b_d: p->bias != 0 ==> tensor_writable((char *)d_b_d, E * H, p->grad_dtype) &&
      \separated((char *)d_b_d + (0 .. byte_offset(E * H, p->grad_dtype) - 1), C + (0 .. RC * wide - 1), p);
    terminates \true;
    assigns Dk[0 .. n_max * H - 1], dD[0 .. n_max * H - 1], M[0 .. n_max * I - 1], dM[0 .. n_max * I - 1],
      Tin[0 .. n_max * wide - 1], Tout[0 .. n_max * wide - 1], C[0 .. RC * wide - 1], brow[0 .. wide - 1],
      bd[0 .. H - 1], bbuf[0 .. PC * NC - 1], da_slot[0 .. V - 1], errno,
      ((char *)d_w_d)[0 .. byte_offset(E * I * H, p->grad_dtype) - 1],
      ((char *)d_b_d)[0 .. byte_offset(p->bias != 0 ? E * H : 0, p->grad_dtype) - 1]; */
static void bwd_down_stage(const moe_mlp_problem *p, moe_dtype dt, int64_t H, int64_t I, int64_t e, int64_t n,
                           const int64_t *slots, int on_i, int recompute_d, const void *w_d, const void *b_d,
                           const float *G, float *Dk, float *dD, const float *GU, float *M, float *dM, const float *a,
                           float *Tin, float *Tout, float *C, float *brow, float *bd, float *bbuf, float *da_slot,
                           void *d_w_d, void *d_b_d) /*@ ghost (int64_t E, int64_t V, int64_t n_max, int64_t wide) */
{
    /*@ ghost lemma_mul_monotone(n, n_max, H); */
    /*@ ghost lemma_mul_monotone(n, n_max, I); */
    /*@ ghost lemma_mul_monotone(n, n_max, 2 * I); */
    /*@ ghost lemma_mul_monotone(n, n_max, wide); */
    /*@ ghost lemma_mul_monotone(H, wide, RC); */
    /*@ ghost lemma_mul_monotone(H, wide, n); */
    /*@ ghost lemma_mul_monotone(I, wide, n); */
    /*@ ghost lemma_row_fits(e, E, I); */
    /*@ ghost lemma_mul_monotone(e * I + I, E * I, H); */
    /* m = act(g) * u (the unscaled one first: ON_I without a down checkpoint recomputes d) */
    bwd_m_rows(p->activation, n, I, GU, M);
    if (recompute_d && n > 0)
        bwd_recompute_d(p, dt, H, I, e, n, M, dM, w_d, b_d, Dk, bd, bbuf) /*@ ghost (E) */;
    /* affinity gradient and dD */
    bwd_affinity_rows(n, H, I, on_i, slots, G, Dk, a, da_slot, dD, M) /*@ ghost (V) */;
    /* round_intermediates: dW_d's operands rnd(m) (ON_I rnd(a*m)) and rnd(a*G); dD is also what db_d sums and,
     * with ON_H, the dM GEMM's operand */
    if (p->round_intermediates) {
        round_row(dt, M, n * I);
        round_row(dt, dD, n * H);
    }
    /* the down-projection input gradient as the forward applied a: ON_H dD = a*G against the unscaled m; ON_I
     * G against the scaled m */
    const float *dDsrc = on_i ? G : dD;
    /* dW_d[e] = M^T . dDsrc;  db_d[e] = sum dD (= sum a*G either way) */
    bwd_weight_grad(p, e, n, I, H, M, dDsrc, dD, C, d_w_d, d_b_d) /*@ ghost (E, wide) */;
    /* dM = dD . W_d[e]^T  (ON_I: a * (G . W_d^T)), computed as (W_d[e] . dD^T)^T */
    if (n > 0) {
        bwd_weight_rows(n, H, I, dt, w_d, e * I * H, dDsrc, Tin, Tout, brow);
        transpose(I, n, Tout, n, dM);
    }
}

/* bwd_expert's gate/up stage: dGU = (dg, du) with the clamp masks (bwd_gate_grads; limits already rounded to
 * the dtype), rounded with round_intermediates, then d_w_gu[e] and db_gu[e] (bwd_weight_grad of X against dGU)
 * and the per-slot dX rows = (W_gu[e] . dGU^T)^T into dx_slot (bwd_weight_rows, bwd_dx_scatter).
 *   X [n][H]; GU, dGU [n][2I]; dM [n][I]; a [n]; Tin, Tout [n][wide]; C [RC][wide]; brow [wide];
 *   dx_slot [V][H]; d_w_gu [E][H][2I], d_b_gu [E][2I] (with bias) of p->grad_dtype */
/*@ requires problem: \valid_read(p) && dtype_ok(p->grad_dtype);
    requires dims: 0 <= e < E && 0 <= n <= n_max && 0 <= H <= wide && 0 <= I && 2 * I <= wide &&
      1 <= wide <= INT64_MAX - NC && n_max <= INT64_MAX - NC && n_max * wide <= INT64_MAX && RC * wide <= INT64_MAX &&
      n_max * H <= INT64_MAX && n_max * I <= INT64_MAX && n_max * (2 * I) <= INT64_MAX && E * H <= INT64_MAX &&
      E * (2 * I) <= INT64_MAX && E * H * (2 * I) <= INT64_MAX && 0 <= V && V * H <= INT64_MAX;
    requires dtype: dtype_ok(dt);
    requires slots: \valid_read(slots + (0 .. n - 1)) && in_range(slots, n, 0, V);
    requires w_gu: tensor_readable((char *)w_gu, E * H * (2 * I), dt);
    requires scratch: \valid_read(X + (0 .. n_max * H - 1)) && \valid_read(GU + (0 .. n_max * (2 * I) - 1)) &&
      \valid(dGU + (0 .. n_max * (2 * I) - 1)) && \valid_read(dM + (0 .. n_max * I - 1)) &&
      \valid_read(a + (0 .. n_max - 1)) && \valid(Tin + (0 .. n_max * wide - 1)) &&
      \valid(Tout + (0 .. n_max * wide - 1)) && \valid(C + (0 .. RC * wide - 1)) && \valid(brow + (0 .. wide - 1)) &&
      \valid(dx_slot + (0 .. V * H - 1)) &&
      \separated(X + (0 .. n_max * H - 1), GU + (0 .. n_max * (2 * I) - 1), dGU + (0 .. n_max * (2 * I) - 1),
                 dM + (0 .. n_max * I - 1), a + (0 .. n_max - 1), Tin + (0 .. n_max * wide - 1),
                 Tout + (0 .. n_max * wide - 1), C + (0 .. RC * wide - 1), brow + (0 .. wide - 1),
                 dx_slot + (0 .. V * H - 1), p);
    requires d_w_gu: tensor_writable((char *)d_w_gu, E * H * (2 * I), p->grad_dtype) &&
      \separated((char *)d_w_gu + (0 .. byte_offset(E * H * (2 * I), p->grad_dtype) - 1), C + (0 .. RC * wide - 1), p);
    requires d_b_gu: p->bias != 0 ==> tensor_writable((char *)d_b_gu, E * (2 * I), p->grad_dtype) &&
      \separated((char *)d_b_gu + (0 .. byte_offset(E * (2 * I), p->grad_dtype) - 1), C + (0 .. RC * wide - 1), p);
    terminates \true;
    assigns dGU[0 .. n_max * (2 * I) - 1], Tin[0 .. n_max * wide - 1], Tout[0 .. n_max * wide - 1],
      C[0 .. RC * wide - 1], brow[0 .. wide - 1], dx_slot[0 .. V * H - 1], errno,
      ((char *)d_w_gu)[0 .. byte_offset(E * H * (2 * I), p->grad_dtype) - 1],
      ((char *)d_b_gu)[0 .. byte_offset(p->bias != 0 ? E * (2 * I) : 0, p->grad_dtype) - 1]; */
static void bwd_gate_up_stage(const moe_mlp_problem *p, moe_dtype dt, int64_t H, int64_t I, int64_t e, int64_t n,
                              const int64_t *slots, int on_i, float nl_lo, float nl_hi, float lin_lo, float lin_hi,
                              const void *w_gu, const float *X, const float *GU, float *dGU, const float *dM,
                              const float *a, float *Tin, float *Tout, float *C, float *brow, float *dx_slot,
                              void *d_w_gu, void *d_b_gu) /*@ ghost (int64_t E, int64_t V, int64_t n_max, int64_t wide) */
{
    const int64_t I2 = 2 * I;
    /*@ ghost lemma_mul_monotone(n, n_max, H); */
    /*@ ghost lemma_mul_monotone(n, n_max, I); */
    /*@ ghost lemma_mul_monotone(n, n_max, I2); */
    /*@ ghost lemma_mul_monotone(n, n_max, wide); */
    /*@ ghost lemma_mul_monotone(I2, wide, RC); */
    /*@ ghost lemma_mul_monotone(I2, wide, n); */
    /*@ ghost lemma_mul_monotone(H, wide, n); */
    /*@ ghost lemma_row_fits(e, E, H); */
    /*@ ghost lemma_mul_monotone(e * H + H, E * H, I2); */
    bwd_gate_grads(p, n, I, on_i, nl_lo, nl_hi, lin_lo, lin_hi, GU, dM, a, dGU);
    /* round_intermediates: rnd(dg), rnd(du) for dW_gu, db_gu and d_hidden */
    if (p->round_intermediates)
        round_row(dt, dGU, n * I2);
    /* dW_gu[e] = X^T . dGU;  db_gu[e] = sum dGU */
    bwd_weight_grad(p, e, n, H, I2, X, dGU, dGU, C, d_w_gu, d_b_gu) /*@ ghost (E, wide) */;
    /* per-slot dX = dGU . W_gu[e]^T, computed as (W_gu[e] . dGU^T)^T */
    if (n > 0) {
        bwd_weight_rows(n, I2, H, dt, w_gu, e * H * I2, dGU, Tin, Tout, brow);
        bwd_dx_scatter(n, H, slots, Tout, dx_slot) /*@ ghost (V) */;
    }
}

/*@ // a gradient output g of count elements of grad dtype gd as bwd_experts needs it: writable, apart from the
    // problem, the slot index arrays it reads and the floats it writes
    predicate bwd_grad_x_ok{L}(char *g, integer count, moe_dtype gd, moe_mlp_problem *p, slot_index *x,
                               integer V, integer E, bwd_scratch *s, float *dx_slot, float *da_slot,
                               integer n_max, integer H, integer I, integer wide) =
      tensor_writable(g, count, gd) && \separated(g + (0 .. byte_offset(count, gd) - 1), p) &&
      \separated(g + (0 .. byte_offset(count, gd) - 1), x->expert_slots + (0 .. V - 1)) &&
      \separated(g + (0 .. byte_offset(count, gd) - 1), x->expert_start + (0 .. E)) &&
      \separated(g + (0 .. byte_offset(count, gd) - 1), x->pos + (0 .. V - 1)) &&
      \separated(g + (0 .. byte_offset(count, gd) - 1), x->token + (0 .. V - 1)) &&
      bwd_floats_apart(s, dx_slot, da_slot, V, n_max, H, I, wide, g, byte_offset(count, gd));
*/

/* The backward of expert e over its n slots (slots[0 .. n - 1]): gather (bwd_gather), the down stage (m, d
 * recomputed, dA and dD, d_w_d and db_d, dM: bwd_down_stage), the gate/up stage (dg/du, d_w_gu and db_gu, the
 * per-slot dX: bwd_gate_up_stage).  An expert without slots still writes its weight (and bias) gradients: +0,
 * or the old value through one rounding with accumulate.
 *   pos, token [V]: the slot index;  s: the thread's scratch;  dx_slot [V][H], da_slot [V]: per-slot gradients;
 *   limits nl_lo .. lin_hi rounded to dt */
/*@ requires problem: \valid_read(p) && dtype_ok(p->grad_dtype);
    requires dims: bwd_dims(T, E, N, B, H, I, V, n_max, rows, wide);
    requires dtype: dtype_ok(dt);
    requires expert: 0 <= e < E;
    requires slots: 0 <= n <= n_max && \valid_read(slots + (0 .. n - 1)) &&
      \forall integer r; 0 <= r < n ==> 0 <= slots[r] < V;
    requires index: \valid_read(pos + (0 .. V - 1)) && in_range(pos, V, 0, N * B) &&
      \valid_read(token + (0 .. V - 1)) && in_range(token, V, 0, T);
    requires inputs: bwd_inputs_at((char *)hidden, (char *)affinities, (char *)w_gu, (char *)w_d, (char *)b_d,
      (char *)gate_up_ckpt_T, (char *)down_ckpt, (char *)out_grad, recompute_d, rows, T, E, N, B, H, I, p->bias, dt);
    requires scratch: bwd_scratch_ok(s, dx_slot, da_slot, V, n_max, H, I, wide);
    requires floats_apart: bwd_floats_apart_p(s, dx_slot, da_slot, V, n_max, H, I, wide, p) &&
      bwd_inputs_apart((char *)hidden, (char *)out_grad, (char *)down_ckpt, (char *)b_d, recompute_d, rows, E, N, B,
                       H, p->bias, dt, s, dx_slot, da_slot, V, n_max, I, wide);
    requires d_w_gu: bwd_grad_ok((char *)d_w_gu, E * H * (2 * I), p->grad_dtype, p, s, dx_slot, da_slot, V, n_max, H,
      I, wide);
    requires d_w_d: bwd_grad_ok((char *)d_w_d, E * I * H, p->grad_dtype, p, s, dx_slot, da_slot, V, n_max, H, I, wide);
    requires d_b_gu: p->bias != 0 ==> bwd_grad_ok((char *)d_b_gu, E * (2 * I), p->grad_dtype, p, s, dx_slot, da_slot,
      V, n_max, H, I, wide);
    requires d_b_d: p->bias != 0 ==> bwd_grad_ok((char *)d_b_d, E * H, p->grad_dtype, p, s, dx_slot, da_slot, V,
      n_max, H, I, wide);
    terminates \true;
    assigns s->X[0 .. n_max * H - 1], s->G[0 .. n_max * H - 1], s->Dk[0 .. n_max * H - 1],
      s->dD[0 .. n_max * H - 1], s->Tin[0 .. n_max * wide - 1], s->Tout[0 .. n_max * wide - 1],
      s->GU[0 .. n_max * (2 * I) - 1], s->dGU[0 .. n_max * (2 * I) - 1], s->M[0 .. n_max * I - 1],
      s->dM[0 .. n_max * I - 1], s->a[0 .. n_max - 1], s->C[0 .. RC * wide - 1], s->brow[0 .. wide - 1],
      s->bd[0 .. H - 1], s->bbuf[0 .. PC * NC - 1], dx_slot[0 .. V * H - 1], da_slot[0 .. V - 1], errno,
      ((char *)d_w_gu)[0 .. byte_offset(E * H * (2 * I), p->grad_dtype) - 1],
      ((char *)d_w_d)[0 .. byte_offset(E * I * H, p->grad_dtype) - 1],
      ((char *)d_b_gu)[0 .. byte_offset(p->bias != 0 ? E * (2 * I) : 0, p->grad_dtype) - 1],
      ((char *)d_b_d)[0 .. byte_offset(p->bias != 0 ? E * H : 0, p->grad_dtype) - 1]; */
static void bwd_expert(const moe_mlp_problem *p, moe_dtype dt, int64_t E, int64_t B, int64_t H, int64_t I, int on_i,
                       int recompute_d, float nl_lo, float nl_hi, float lin_lo, float lin_hi, int64_t e,
                       const int64_t *slots, int64_t n, const int64_t *pos, const int64_t *token, const void *hidden,
                       const void *affinities, const void *w_gu, const void *w_d, const void *b_d,
                       const void *gate_up_ckpt_T, const void *down_ckpt, const void *out_grad, void *d_w_gu,
                       void *d_w_d, void *d_b_gu, void *d_b_d, const bwd_scratch *s, float *dx_slot, float *da_slot)
    /*@ ghost (int64_t T, int64_t N, int64_t V, int64_t n_max, int64_t rows, int64_t wide) */
{
    bwd_gather(dt, E, B, H, I, e, slots, n, pos, token, hidden, out_grad, affinities, gate_up_ckpt_T, down_ckpt,
               recompute_d, s->X, s->G, s->a, s->GU, s->Dk) /*@ ghost (T, N, V, rows, n_max) */;
    bwd_down_stage(p, dt, H, I, e, n, slots, on_i, recompute_d, w_d, b_d, s->G, s->Dk, s->dD, s->GU, s->M, s->dM,
                   s->a, s->Tin, s->Tout, s->C, s->brow, s->bd, s->bbuf, da_slot, d_w_d, d_b_d)
        /*@ ghost (E, V, n_max, wide) */;
    bwd_gate_up_stage(p, dt, H, I, e, n, slots, on_i, nl_lo, nl_hi, lin_lo, lin_hi, w_gu, s->X, s->GU, s->dGU, s->dM,
                      s->a, s->Tin, s->Tout, s->C, s->brow, dx_slot, d_w_gu, d_b_gu) /*@ ghost (E, V, n_max, wide) */;
}

/* One thread's share of the experts: the orphaned `omp for` (dynamic, one expert at a time) of moe_ref_mlp_bwd's
 * parallel region, bwd_expert for each expert e < E (its slots expert_slots[expert_start[e] ..]).  Frama-C parses
 * it without OpenMP: the proof is of the loop run by one thread over every expert.
 *   x: the slot index (V = x->count slots, n_max = x->max_slots) */
/*@ requires problem: \valid_read(p) && dtype_ok(p->grad_dtype);
    requires dims: bwd_dims(T, E, N, B, H, I, V, n_max, rows, wide);
    requires dtype: dtype_ok(dt);
    requires index: slot_index_ok(x, ids, T, E, N, B) && x->count == V && x->max_slots == n_max;
    requires inputs: bwd_inputs_at((char *)hidden, (char *)affinities, (char *)w_gu, (char *)w_d, (char *)b_d,
      (char *)gate_up_ckpt_T, (char *)down_ckpt, (char *)out_grad, recompute_d, rows, T, E, N, B, H, I, p->bias, dt);
    requires scratch: bwd_scratch_ok(s, dx_slot, da_slot, V, n_max, H, I, wide);
    requires floats_apart: bwd_floats_apart_p(s, dx_slot, da_slot, V, n_max, H, I, wide, p) &&
      bwd_inputs_apart((char *)hidden, (char *)out_grad, (char *)down_ckpt, (char *)b_d, recompute_d, rows, E, N, B,
                       H, p->bias, dt, s, dx_slot, da_slot, V, n_max, I, wide);
    requires d_w_gu: bwd_grad_x_ok((char *)d_w_gu, E * H * (2 * I), p->grad_dtype, p, x, V, E, s, dx_slot, da_slot,
      n_max, H, I, wide);
    requires d_w_d: bwd_grad_x_ok((char *)d_w_d, E * I * H, p->grad_dtype, p, x, V, E, s, dx_slot, da_slot, n_max, H,
      I, wide);
    requires d_b_gu: p->bias != 0 ==> bwd_grad_x_ok((char *)d_b_gu, E * (2 * I), p->grad_dtype, p, x, V, E, s,
      dx_slot, da_slot, n_max, H, I, wide);
    requires d_b_d: p->bias != 0 ==> bwd_grad_x_ok((char *)d_b_d, E * H, p->grad_dtype, p, x, V, E, s, dx_slot,
      da_slot, n_max, H, I, wide);
    terminates \true;
    assigns s->X[0 .. n_max * H - 1], s->G[0 .. n_max * H - 1], s->Dk[0 .. n_max * H - 1],
      s->dD[0 .. n_max * H - 1], s->Tin[0 .. n_max * wide - 1], s->Tout[0 .. n_max * wide - 1],
      s->GU[0 .. n_max * (2 * I) - 1], s->dGU[0 .. n_max * (2 * I) - 1], s->M[0 .. n_max * I - 1],
      s->dM[0 .. n_max * I - 1], s->a[0 .. n_max - 1], s->C[0 .. RC * wide - 1], s->brow[0 .. wide - 1],
      s->bd[0 .. H - 1], s->bbuf[0 .. PC * NC - 1], dx_slot[0 .. V * H - 1], da_slot[0 .. V - 1], errno,
      ((char *)d_w_gu)[0 .. byte_offset(E * H * (2 * I), p->grad_dtype) - 1],
      ((char *)d_w_d)[0 .. byte_offset(E * I * H, p->grad_dtype) - 1],
      ((char *)d_b_gu)[0 .. byte_offset(p->bias != 0 ? E * (2 * I) : 0, p->grad_dtype) - 1],
      ((char *)d_b_d)[0 .. byte_offset(p->bias != 0 ? E * H : 0, p->grad_dtype) - 1]; */
static void bwd_experts(const moe_mlp_problem *p, moe_dtype dt, int64_t E, int64_t B, int64_t H, int64_t I, int on_i,
                        int recompute_d, float nl_lo, float nl_hi, float lin_lo, float lin_hi, const slot_index *x,
                        const void *hidden, const void *affinities, const void *w_gu, const void *w_d, const void *b_d,
                        const void *gate_up_ckpt_T, const void *down_ckpt, const void *out_grad, void *d_w_gu,
                        void *d_w_d, void *d_b_gu, void *d_b_d, const bwd_scratch *s, float *dx_slot, float *da_slot)
    /*@ ghost (const int64_t *ids, int64_t T, int64_t N, int64_t V, int64_t n_max, int64_t rows, int64_t wide) */
{
    /*@ loop invariant bounds: 0 <= e <= E;
        loop assigns e, s->X[0 .. n_max * H - 1], s->G[0 .. n_max * H - 1], s->Dk[0 .. n_max * H - 1],
          s->dD[0 .. n_max * H - 1], s->Tin[0 .. n_max * wide - 1], s->Tout[0 .. n_max * wide - 1],
          s->GU[0 .. n_max * (2 * I) - 1], s->dGU[0 .. n_max * (2 * I) - 1], s->M[0 .. n_max * I - 1],
          s->dM[0 .. n_max * I - 1], s->a[0 .. n_max - 1], s->C[0 .. RC * wide - 1], s->brow[0 .. wide - 1],
          s->bd[0 .. H - 1], s->bbuf[0 .. PC * NC - 1], dx_slot[0 .. V * H - 1], da_slot[0 .. V - 1], errno,
          ((char *)d_w_gu)[0 .. byte_offset(E * H * (2 * I), p->grad_dtype) - 1],
          ((char *)d_w_d)[0 .. byte_offset(E * I * H, p->grad_dtype) - 1],
          ((char *)d_b_gu)[0 .. byte_offset(p->bias != 0 ? E * (2 * I) : 0, p->grad_dtype) - 1],
          ((char *)d_b_d)[0 .. byte_offset(p->bias != 0 ? E * H : 0, p->grad_dtype) - 1];
        loop variant E - e; */
    MLP_OMP(for schedule(dynamic, 1))
    for (int64_t e = 0; e < E; e++) {
        const int64_t first = x->expert_start[e], n = x->expert_start[e + 1] - first;
        /*@ assert slots_in: 0 <= first && first + n <= V && 0 <= n <= n_max; */
        /*@ assert slots_kept: \forall integer r; first <= r < first + n ==> 0 <= x->expert_slots[r] < V; */
        bwd_expert(p, dt, E, B, H, I, on_i, recompute_d, nl_lo, nl_hi, lin_lo, lin_hi, e, x->expert_slots + first, n,
                   x->pos, x->token, hidden, affinities, w_gu, w_d, b_d, gate_up_ckpt_T, down_ckpt, out_grad, d_w_gu,
                   d_w_d, d_b_gu, d_b_d, s, dx_slot, da_slot) /*@ ghost (T, N, V, n_max, rows, wide) */;
    }
}

moe_status moe_ref_mlp_bwd(const moe_mlp_problem *p, const void *hidden, const void *affinities,
                           const void *w_gu, const void *w_d, const void *b_d, const void *gate_up_ckpt_T,
                           const void *down_ckpt, const void *out_grad, void *d_hidden, void *d_affinities,
                           void *d_w_gu, void *d_w_d, void *d_b_gu, void *d_b_d)
{
    const int64_t E = p->E, B = p->B, H = p->H, I = p->I, I2 = 2 * p->I, T = p->T;
    const moe_dtype dt = p->dtype;
    const int on_i = p->affinity == MOE_AFFINITY_ON_I;
    const int recompute_d = down_ckpt == NULL; /* only allowed with ON_I */
    slot_index x;
    moe_status status = build_index(p, &x);
    if (status != MOE_OK)
        return status;
    const int64_t n_max = x.max_slots, wide = max3(H, I2, 1);
    const int threads = threads_for(x.count, H, I);
    /* per thread: X, G, Dk, dD [n][H]; GU, dGU [n][2I]; M, dM [n][I]; a [n]; transposed in/out [wide][n];
     * C [RC][wide]; wrow [wide]; bias row [H]; bbuf; per-token expert row [E] */
    const double need = (double)n_max * (double)(4 * H + 2 * I2 + 2 * I + 1 + 2 * wide) +
                        (double)(RC + 1) * (double)wide + (double)E;
    const size_t per_thread = need > 0x1p60 ? SIZE_MAX
                              : (size_t)n_max * (size_t)(4 * H + 2 * I2 + 2 * I + 1 + 2 * wide) +
                                    (size_t)(RC + 1) * wide + (size_t)H + PC * NC + (size_t)E + 16 * 15;
    arena ws;
    float *dx_slot = alloc_floats(x.count, H);
    float *da_slot = alloc_floats(x.count, 1);
    if (dx_slot == NULL || da_slot == NULL || !arena_alloc(&ws, threads, per_thread)) {
        free(dx_slot);
        free(da_slot);
        free_index(&x);
        return moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: no memory for the float32 workspace (%" PRId64
                        " slots, H = %" PRId64 ", I = %" PRId64 ")", p->op, x.count, H, I);
    }
    const float nl_lo = round_to(dt, p->nl_lo), nl_hi = round_to(dt, p->nl_hi);
    const float lin_lo = round_to(dt, p->lin_lo), lin_hi = round_to(dt, p->lin_hi);

    MLP_OMP(parallel num_threads(threads))
    {
        float *cur = ws.base + (size_t)team_member(threads) * ws.per_thread;
        float *X = carve(&cur, n_max * H), *G = carve(&cur, n_max * H), *Dk = carve(&cur, n_max * H);
        float *dD = carve(&cur, n_max * H), *Tin = carve(&cur, n_max * wide), *Tout = carve(&cur, n_max * wide);
        float *GU = carve(&cur, n_max * I2), *dGU = carve(&cur, n_max * I2);
        float *M = carve(&cur, n_max * I), *dM = carve(&cur, n_max * I), *a = carve(&cur, n_max);
        float *C = carve(&cur, RC * wide), *brow = carve(&cur, wide), *bd = carve(&cur, H);
        float *bbuf = carve(&cur, PC * NC), *row_e = carve(&cur, E);

        const bwd_scratch s = {X, G, Dk, dD, Tin, Tout, GU, dGU, M, dM, a, C, brow, bd, bbuf};

        bwd_experts(p, dt, E, B, H, I, on_i, recompute_d, nl_lo, nl_hi, lin_lo, lin_hi, &x, hidden, affinities, w_gu,
                    w_d, b_d, gate_up_ckpt_T, down_ckpt, out_grad, d_w_gu, d_w_d, d_b_gu, d_b_d, &s, dx_slot, da_slot)
            /*@ ghost (p->token_position_to_id, T, p->N, x.count, n_max, p->token_rows, wide) */;

        /* token rows of d_hidden and d_affinities (acc = brow: wide >= H) */
        bwd_tokens(dt, T, E, B, H, p->token_rows, x.token_start, x.token_slots, x.pos, p->block_to_expert, dx_slot,
                   da_slot, brow, row_e, d_hidden, d_affinities) /*@ ghost (p->N, x.count) */;
    }

    free(dx_slot);
    free(da_slot);
    free(ws.base);
    free_index(&x);
    return MOE_OK;
}
