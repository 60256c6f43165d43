/*
 * ref/mlp/tiles.c: the float32 tile GEMMs of the blockwise MoE MLP reference and the row loads and stores
 * around them: a dtype tensor's row as float32 (converted, or read in place for f32), a float32 row stored
 * with one rounding, the gather of token rows, the two GEMM kernels (mlp_mm_nn: activations . weight;
 * mlp_mm_wn: weight . activations^T) on one product step (mm_nn_tile), and the transpose.  The product
 * step and its callers stay in this one file (the hot loop, inlined where the compiler chooses).
 */
#include "mlp_internal.h"

/* ---- element conversion (inline for the hot loops; bf16 -> f32 is a shift) ---- */
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

/* (contracts of the external functions on their prototypes in mlp_internal.h) */
void mlp_store_row(moe_dtype dtype, void *base, int64_t first, const float *v, int64_t count)
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
    case MOE_E4M3: /* unreachable: dtype_ok excludes FP8, which only the FP8 entry points take */
    case MOE_E5M2:
        return;
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
    case MOE_F16:
    case MOE_E4M3: /* never here: dtype_ok excludes FP8, which only the FP8 entry points take; its label */
    case MOE_E5M2: /* shares f16's statement, so that no unreachable statement follows it (WP's smoke tests) */
        break;
    }
    /* MOE_F16: after the switch rather than in its case, so that no unreachable return follows the switch
     * (WP's smoke tests, specs/README.md) */
    const uint16_t *src = u16_elements(base, first) /*@ ghost (count) */;
    /*@ loop invariant bounds: 0 <= i <= count;
        loop assigns i, out[0 .. count - 1];
        loop variant count - i; */
    for (int64_t i = 0; i < count; i++)
        out[i] = moe_f16_to_f32(src[i]);
    return out;
}

void mlp_load_f32(moe_dtype dtype, const void *base, int64_t first, int64_t count, float *out)
{
    const float *src = row_f32(dtype, base, first, count, out);
    if (src != out && count > 0) /* an empty tensor may be NULL (memcpy's arguments must not be) */
        memcpy(out, src, (size_t)count * sizeof(float));
}

/* ---- the two GEMM kernels ---- */

/* The product step of mlp_mm_nn (one PC x NC tile) and of mlp_mm_wn (one weight row against NC columns):
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

/* c[i*ldc + j] = +0 for i < m, j < nc (the first nc columns of m rows; mlp_mm_nn's start of an output tile). */
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

void mlp_mm_nn_f32(int64_t m, int64_t n, int64_t kk, const float *A, int64_t ars, int64_t acs, const float *B,
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

void mlp_mm_nn(int64_t m, int64_t n, int64_t kk, const float *A, int64_t ars, int64_t acs, moe_dtype bdt,
               const void *B, int64_t boff, int64_t ldb, float *C, int64_t ldc, float *bbuf)
{
    if (bdt == MOE_F32) {
        mlp_mm_nn_f32(m, n, kk, A, ars, acs, f32_elements(B, boff) /*@ ghost (kk * ldb) */, ldb, C, ldc);
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

void mlp_mm_wn(int64_t m, int64_t n, int64_t kk, moe_dtype wdt, const void *W, int64_t woff, int64_t ldw,
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

void mlp_transpose(int64_t m, int64_t n, const float *src, int64_t lds, float *dst)
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

void mlp_gather_rows(moe_dtype dtype, const void *src, const int64_t *slots, const int64_t *tok, int64_t n,
                     int64_t H, float *dst) /*@ ghost (int64_t V, int64_t rows) */
{
    /*@ loop invariant bounds: 0 <= i <= n;
        loop assigns i, dst[0 .. n * H - 1];
        loop variant n - i; */
    for (int64_t i = 0; i < n; i++) {
        /*@ ghost lemma_row_fits(tok[slots[i]], rows, H); */
        /*@ ghost lemma_row_fits(i, n, H); */
        mlp_load_f32(dtype, src, tok[slots[i]] * H, H, dst + i * H);
    }
}
