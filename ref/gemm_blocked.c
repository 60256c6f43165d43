/*
 * The grouped GEMM, blocked twin: the same contract as ref/gemm_naive.c and, for every output element,
 * the same float32 operations in the same order (moe_ref.h), so the two agree bit for bit.  It is faster
 * because of three things, none of which changes an element's arithmetic:
 *
 *   1. Inputs are converted to float32 once per packed tile, not once per multiply (bf16/f16 loads and
 *      stores are inlined bit operations giving exactly the bits of ref/dtype.c).
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
 */
#include "moe_ref.h"
#include "ref_bf16.h"    /* bf16_to_f32, f32_to_bf16 */
#include "ref_threads.h" /* team_size, team_member, copy_floats */

/* Frama-C/WP (specs/verify.sh) reads the scalar path only: the SSE2, vector-extension and AVX2 code is
 * trusted (tested bit for bit against gemm_naive.c by tests/test_gemm_modes).  The compiled code is
 * not affected: __FRAMAC__ is defined by Frama-C's preprocessing only. */
#if defined(__FRAMAC__) && !defined(MOE_REF_NO_VECTOR)
#define MOE_REF_NO_VECTOR 1
#endif

#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__) && !defined(MOE_REF_NO_VECTOR)
#include <emmintrin.h>
#include <xmmintrin.h>
#endif

/* moe_dtype_size (ref/dtype.c) has its contract on the redeclaration in ref/moe_ref.h (the bytes of one
 * element); WP proves it in ref/dtype.c's run. */

/* No a*b+c contraction into FMA: GCC's -std=c11 already implies -ffp-contract=off; clang needs this. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#ifdef _OPENMP
#include <omp.h>
#define MOE_OMP(directive) _Pragma(#directive)
#else
#define MOE_OMP(directive)
#endif

#if defined(__clang__)
#define MOE_UNROLL _Pragma("unroll")
#elif defined(__GNUC__) && __GNUC__ >= 8
#define MOE_UNROLL _Pragma("GCC unroll 16")
#else
#define MOE_UNROLL
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

/* A hint to fetch the cache line at addr (the packs read W and X rows a few steps ahead). */
#if (defined(__GNUC__) || defined(__clang__)) && !defined(__FRAMAC__)
#define MOE_PREFETCH(addr) __builtin_prefetch(addr)
#else
#define MOE_PREFETCH(addr) ((void)(addr))
#endif

/* ---- exact conversions to float32, inlined (the same bits as moe_bf16_to_f32 / moe_f16_to_f32) ---- */

static inline float bits_to_float(uint32_t bits)
{
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

/* bf16_to_f32 (and f32_to_bf16, below): ref/ref_bf16.h */

static inline float f16_to_float(uint16_t bits)
{
    const uint32_t sign = (uint32_t)(bits & 0x8000u) << 16;
    const uint32_t exponent = (bits >> 10) & 0x1fu;
    const uint32_t mantissa = bits & 0x3ffu;
    if (exponent == 0x1fu)
        return bits_to_float(sign | 0x7f800000u | (mantissa << 13));
    if (exponent == 0) {
        float magnitude = (float)mantissa * 0x1p-24f;
        uint32_t magnitude_bits;
        memcpy(&magnitude_bits, &magnitude, sizeof magnitude_bits);
        return bits_to_float(sign | magnitude_bits);
    }
    return bits_to_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

/* float -> f16, round to nearest even: the same bits as moe_f32_to_f16 (float -> bf16: f32_to_bf16 of
 * ref/ref_bf16.h) */
static inline uint16_t float_to_f16(float value)
{
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    const uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    const uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
    if (magnitude >= 0x477ff000u)
        return (uint16_t)(sign | 0x7c00u);
    if (magnitude < 0x38800000u) {
        float scaled = bits_to_float(magnitude) * 0x1p24f;
        volatile float rounded = scaled + 0x1p23f;
        return (uint16_t)(sign | (uint16_t)(rounded - 0x1p23f));
    }
    uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
    rounded -= 112u << 23;
    return (uint16_t)(sign | (rounded >> 13));
}

/* for (i = 0; i < count; i++) BODY, as 8-wide chunks plus a tail: GCC's -O2 vectoriser takes loops
 * of a known trip count, so the chunks become SIMD code (the operations per element are unchanged). */
#define MOE_FOR_CHUNKED(i, count, BODY)                                                             \
    do {                                                                                           \
        const int64_t moe_count_ = (count);                                                        \
        int64_t moe_base_ = 0;                                                                     \
        for (; moe_base_ + 8 <= moe_count_; moe_base_ += 8)                                        \
            for (int moe_u_ = 0; moe_u_ < 8; moe_u_++) {                                           \
                const int64_t i = moe_base_ + moe_u_;                                              \
                BODY;                                                                              \
            }                                                                                      \
        for (; moe_base_ < moe_count_; moe_base_++) {                                              \
            const int64_t i = moe_base_;                                                           \
            BODY;                                                                                  \
        }                                                                                          \
    } while (0)

/* out[i * stride] = element (first + i) of src as float, for i < count.
 * Contract trusted, not proved (as moe_ref_load's): WP's typed model cannot follow the casts of src to
 * uint16_t * / float * nor the memcpy; callers prove the source bytes and the out lanes valid. */
/*@ requires dtype: dtype_ok(dtype);
    requires span: 0 <= first && 0 <= count && 1 <= stride;
    requires src: count == 0 ||
                  \valid_read((char *)src + (byte_offset(first, dtype) .. byte_offset(first + count, dtype) - 1));
    requires out: count == 0 || \valid(out + (0 .. (count - 1) * stride));
    terminates \true;
    assigns out[0 .. (count - 1) * stride]; */
static inline void load_span(moe_dtype dtype, const void *src, int64_t first, int64_t count, float *out,
                             int64_t stride)
{
    switch (dtype) {
    case MOE_BF16: {
        const uint16_t *s = (const uint16_t *)src + first;
        if (stride == 1)
            MOE_FOR_CHUNKED(i, count, out[i] = bf16_to_f32(s[i]));
        else
            for (int64_t i = 0; i < count; i++)
                out[i * stride] = bf16_to_f32(s[i]);
        return;
    }
    case MOE_F16: {
        const uint16_t *s = (const uint16_t *)src + first;
        for (int64_t i = 0; i < count; i++)
            out[i * stride] = f16_to_float(s[i]);
        return;
    }
    case MOE_F32:
        break;
    }
    const float *s = (const float *)src + first;
    if (stride == 1)
        memcpy(out, s, (size_t)count * sizeof *out);
    else
        for (int64_t i = 0; i < count; i++)
            out[i * stride] = s[i];
}

/* panel[q * NR + j] = element (first + j * ld + q) of src as float, for q < kb, j < NR: the transpose
 * of NR source rows.  bf16 and f32 go through SSE2 4x4 transposes where available (pure data
 * movement: the same bits as the scalar loop). */
/* Frama-C/WP proves the scalar path (the SSE2 block is not in its parse): the NR source rows
 * first + j * ld + (0 .. kb - 1) are read, panel[0 .. kb * NR - 1] written (load_span's trusted contract). */
/*@ requires dtype: dtype_ok(dtype);
    requires depth: 0 <= kb <= KB;
    requires rows: 0 <= first && 0 <= ld && first + (NR - 1) * ld + kb <= INT64_MAX;
    requires src: kb == 0 || \valid_read((char *)src + (byte_offset(first, dtype) ..
                                                     byte_offset(first + (NR - 1) * ld + kb, dtype) - 1));
    requires panel: \valid(panel + (0 .. kb * NR - 1));
    terminates \true;
    assigns panel[0 .. kb * NR - 1]; */
static void load_transposed_panel(moe_dtype dtype, const void *src, int64_t first, int64_t ld, int64_t kb,
                                  float *panel)
{
    int64_t q = 0;
#if defined(__SSE2__) && !defined(MOE_REF_NO_VECTOR)
    if (dtype == MOE_BF16 || dtype == MOE_F32) {
        const __m128i zero = _mm_setzero_si128();
        for (; q + 4 <= kb; q += 4) {
            for (int j = 0; j < NR; j += 4) {
                __m128 r0, r1, r2, r3;
                if (dtype == MOE_BF16) {
                    const uint16_t *s = (const uint16_t *)src + first + j * ld + q;
                    /* 4 bf16 -> the upper halves of 4 32-bit lanes: exactly bf16_to_f32 */
                    r0 = _mm_castsi128_ps(_mm_unpacklo_epi16(zero, _mm_loadl_epi64((const __m128i *)(const void *)s)));
                    r1 = _mm_castsi128_ps(_mm_unpacklo_epi16(zero, _mm_loadl_epi64((const __m128i *)(const void *)(s + ld))));
                    r2 = _mm_castsi128_ps(_mm_unpacklo_epi16(zero, _mm_loadl_epi64((const __m128i *)(const void *)(s + 2 * ld))));
                    r3 = _mm_castsi128_ps(_mm_unpacklo_epi16(zero, _mm_loadl_epi64((const __m128i *)(const void *)(s + 3 * ld))));
                } else {
                    const float *s = (const float *)src + first + j * ld + q;
                    r0 = _mm_loadu_ps(s);
                    r1 = _mm_loadu_ps(s + ld);
                    r2 = _mm_loadu_ps(s + 2 * ld);
                    r3 = _mm_loadu_ps(s + 3 * ld);
                }
                _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
                _mm_storeu_ps(panel + (q + 0) * NR + j, r0);
                _mm_storeu_ps(panel + (q + 1) * NR + j, r1);
                _mm_storeu_ps(panel + (q + 2) * NR + j, r2);
                _mm_storeu_ps(panel + (q + 3) * NR + j, r3);
            }
        }
    }
#endif
    if (q < kb) {
        /*@ loop invariant bounds: 0 <= j <= NR;
            loop assigns j, panel[0 .. kb * NR - 1];
            loop variant NR - j; */
        for (int j = 0; j < NR; j++) {
            /*@ ghost lemma_mul_monotone(j, NR - 1, ld); */
            load_span(dtype, src, first + j * ld + q, kb - q, panel + q * NR + j, NR);
        }
    }
}

/* The tail of moe_ref.h for count consecutive elements of out from base: v = old + v with
 * accumulate, then one rounding (gemm_naive.c's finish, with the conversions inlined).
 * Contract trusted, not proved (as moe_ref_store's): WP's typed model cannot follow the casts of out to
 * uint16_t * / float * nor the memcpy, so the contract speaks of out's bytes (elements base ..
 * base + count - 1); callers prove those bytes writable and the writes inside their own ranges. */
/*@ requires dtype: dtype_ok(dtype);
    requires span: 0 <= base && 0 <= count;
    requires out: count == 0 ||
                  \valid((char *)out + (byte_offset(base, dtype) .. byte_offset(base + count, dtype) - 1));
    requires v: count == 0 || \valid_read(v + (0 .. count - 1));
    requires separated: \separated((char *)out + (byte_offset(base, dtype) .. byte_offset(base + count, dtype) - 1),
                                   v + (0 .. count - 1));
    terminates \true;
    assigns ((char *)out)[byte_offset(base, dtype) .. byte_offset(base + count, dtype) - 1]; */
static void store_row(moe_dtype dtype, void *out, int64_t base, const float *v, int64_t count, int accumulate)
{
    switch (dtype) {
    case MOE_BF16: {
        uint16_t *o = (uint16_t *)out + base;
        if (accumulate)
            MOE_FOR_CHUNKED(j, count, o[j] = f32_to_bf16(bf16_to_f32(o[j]) + v[j]));
        else
            MOE_FOR_CHUNKED(j, count, o[j] = f32_to_bf16(v[j]));
        return;
    }
    case MOE_F16: {
        uint16_t *o = (uint16_t *)out + base;
        if (accumulate)
            for (int64_t j = 0; j < count; j++)
                o[j] = float_to_f16(f16_to_float(o[j]) + v[j]);
        else
            for (int64_t j = 0; j < count; j++)
                o[j] = float_to_f16(v[j]);
        return;
    }
    case MOE_F32:
        break;
    }
    float *o = (float *)out + base;
    if (accumulate)
        MOE_FOR_CHUNKED(j, count, o[j] = o[j] + v[j]);
    else
        memcpy(o, v, (size_t)count * sizeof *o);
}

/* ---- micro-kernels: c[i][j] += a[p][i] * b[p][j] for p = 0 .. kb-1 in order, i < MR, j < NR ----
 * a is a packed group [kb][MR], b a packed panel [kb][NR], c the accumulator tile with row stride ldc.
 * With `first`, the accumulators start at +0.0f instead of being loaded from c (the first reduction
 * block).  rows (1 .. MR) is how many of the MR rows are real; a kernel may compute padded ones too. */
typedef void (*micro_kernel)(int64_t kb, int first, int rows, const float *restrict a,
                             const float *restrict b, float *restrict c, int64_t ldc);

#ifdef MOE_HAVE_VECTOR_EXT
typedef float moe_v4f __attribute__((vector_size(16)));

/* rows h0 .. h0+2 of the group, with 16-byte vectors: 12 accumulators of 4 lanes.  The vector kernels are
 * outside Frama-C's parse (this #if branch): their contracts are stated, not checked, and the kernels are
 * tested bit for bit against the naive twin (tests/test_gemm_modes). */
/*@ requires depth: 0 <= kb <= KB;
    requires half: h0 == 0 || h0 == 3;
    requires ldc: NR <= ldc <= NB;
    requires a: \valid_read(a + (0 .. kb * MR - 1));
    requires b: \valid_read(b + (0 .. kb * NR - 1));
    requires c: \valid(c + (h0 * ldc .. (h0 + 2) * ldc + NR - 1));
    terminates \true;
    assigns c[h0 * ldc .. (h0 + 2) * ldc + NR - 1]; */
static inline void kernel_v4_half(int64_t kb, int first, int h0, const float *restrict a,
                                  const float *restrict b, float *restrict c, int64_t ldc)
{
    enum { H = 3, V = NR / 4 };
    moe_v4f acc[H][V];
    MOE_UNROLL
    for (int i = 0; i < H; i++) {
        MOE_UNROLL
        for (int v = 0; v < V; v++) {
            if (first)
                acc[i][v] = (moe_v4f){0.0f, 0.0f, 0.0f, 0.0f};
            else
                memcpy(&acc[i][v], c + (h0 + i) * ldc + 4 * v, sizeof acc[i][v]);
        }
    }
    for (int64_t p = 0; p < kb; p++) {
        moe_v4f bv[V];
        MOE_UNROLL
        for (int v = 0; v < V; v++)
            memcpy(&bv[v], b + p * NR + 4 * v, sizeof bv[v]);
        MOE_UNROLL
        for (int i = 0; i < H; i++) {
            const float av = a[p * MR + h0 + i];
            MOE_UNROLL
            for (int v = 0; v < V; v++)
                acc[i][v] += av * bv[v];
        }
    }
    MOE_UNROLL
    for (int i = 0; i < H; i++) {
        MOE_UNROLL
        for (int v = 0; v < V; v++)
            memcpy(c + (h0 + i) * ldc + 4 * v, &acc[i][v], sizeof acc[i][v]);
    }
}

/* Rows 0 .. 2, and 3 .. 5 when rows > 3 (padded rows computed too). */
/*@ requires depth: 0 <= kb <= KB;
    requires rows: 1 <= rows <= MR;
    requires ldc: NR <= ldc <= NB;
    requires a: \valid_read(a + (0 .. kb * MR - 1));
    requires b: \valid_read(b + (0 .. kb * NR - 1));
    requires c: \valid(c + (0 .. ((rows > 3 ? MR : 3) - 1) * ldc + NR - 1));
    terminates \true;
    assigns c[0 .. ((rows > 3 ? MR : 3) - 1) * ldc + NR - 1]; */
static void kernel_v4(int64_t kb, int first, int rows, const float *restrict a, const float *restrict b,
                      float *restrict c, int64_t ldc)
{
    kernel_v4_half(kb, first, 0, a, b, c, ldc);
    if (rows > 3)
        kernel_v4_half(kb, first, 3, a, b, c, ldc);
}
#else
/* Frama-C/WP proves the indices and the writes (rows 0 .. rows-1 of c, NR floats each), not the values. */
/*@ requires depth: 0 <= kb <= KB;
    requires rows: 1 <= rows <= MR;
    requires ldc: NR <= ldc <= NB;
    requires a: \valid_read(a + (0 .. kb * MR - 1));
    requires b: \valid_read(b + (0 .. kb * NR - 1));
    requires c: \valid(c + (0 .. (rows - 1) * ldc + NR - 1));
    terminates \true;
    assigns c[0 .. (rows - 1) * ldc + NR - 1]; */
static void kernel_scalar(int64_t kb, int first, int rows, const float *restrict a, const float *restrict b,
                          float *restrict c, int64_t ldc)
{
    /*@ loop invariant bounds: 0 <= i <= rows;
        loop assigns i, c[0 .. (rows - 1) * ldc + NR - 1];
        loop variant rows - i; */
    for (int i = 0; i < rows; i++)
        /*@ loop invariant bounds: 0 <= p <= kb;
            loop invariant row: 0 <= i * ldc <= (rows - 1) * ldc;
            loop assigns p, c[i * ldc .. i * ldc + NR - 1];
            loop variant kb - p; */
        for (int64_t p = 0; p < kb; p++) {
            if (first && p == 0)
                /*@ loop invariant bounds: 0 <= j <= NR;
                    loop assigns j, c[i * ldc .. i * ldc + NR - 1];
                    loop variant NR - j; */
                for (int j = 0; j < NR; j++)
                    c[i * ldc + j] = 0.0f;
            const float av = a[p * MR + i];
            /*@ loop invariant bounds: 0 <= j <= NR;
                loop assigns j, c[i * ldc .. i * ldc + NR - 1];
                loop variant NR - j; */
            for (int j = 0; j < NR; j++)
                c[i * ldc + j] += av * b[p * NR + j];
        }
}
#endif

#ifdef MOE_HAVE_AVX2_KERNEL
/* The same kernel with 32-byte vectors (AVX2, no FMA): 12 accumulators of 8 lanes, every one of the MR rows
 * (padded rows computed too).  Outside Frama-C's parse: contract stated, not checked (as kernel_v4's). */
/*@ requires depth: 0 <= kb <= KB;
    requires rows: 1 <= rows <= MR;
    requires ldc: NR <= ldc <= NB;
    requires a: \valid_read(a + (0 .. kb * MR - 1));
    requires b: \valid_read(b + (0 .. kb * NR - 1));
    requires c: \valid(c + (0 .. (MR - 1) * ldc + NR - 1));
    terminates \true;
    assigns c[0 .. (MR - 1) * ldc + NR - 1]; */
__attribute__((target("avx2"))) static void kernel_avx2(int64_t kb, int first, int rows,
                                                        const float *restrict a, const float *restrict b,
                                                        float *restrict c, int64_t ldc)
{
    typedef float v8f __attribute__((vector_size(32)));
    enum { V = NR / 8 };
    (void)rows;
    v8f acc[MR][V];
    MOE_UNROLL
    for (int i = 0; i < MR; i++) {
        MOE_UNROLL
        for (int v = 0; v < V; v++) {
            if (first)
                acc[i][v] = (v8f){0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            else
                memcpy(&acc[i][v], c + i * ldc + 8 * v, sizeof acc[i][v]);
        }
    }
    for (int64_t p = 0; p < kb; p++) {
        v8f bv[V];
        MOE_UNROLL
        for (int v = 0; v < V; v++)
            memcpy(&bv[v], b + p * NR + 8 * v, sizeof bv[v]);
        MOE_UNROLL
        for (int i = 0; i < MR; i++) {
            const float av = a[p * MR + i];
            MOE_UNROLL
            for (int v = 0; v < V; v++)
                acc[i][v] += av * bv[v];
        }
    }
    MOE_UNROLL
    for (int i = 0; i < MR; i++) {
        MOE_UNROLL
        for (int v = 0; v < V; v++)
            memcpy(c + i * ldc + 8 * v, &acc[i][v], sizeof acc[i][v]);
    }
}
#endif

/* The kernel for this CPU (chosen by the calling thread, before any parallel region).  Frama-C parses the
 * scalar path only: there it returns kernel_scalar (proved); in gcc/clang builds kernel_avx2 or kernel_v4. */
/*@ terminates \true;
    assigns \nothing;
    ensures scalar: \result == &kernel_scalar; */
static micro_kernel pick_kernel(void)
{
#ifdef MOE_HAVE_VECTOR_EXT
    /* MOE_REF_KERNEL=v4 forces the 16-byte kernel on any CPU (tests: its second half of a 6-row tile,
     * `rows > 3`, runs nowhere else on an AVX2 machine); unset or any other value: chosen by the CPU */
    const char *forced = getenv("MOE_REF_KERNEL");
    if (forced != NULL && strcmp(forced, "v4") == 0)
        return kernel_v4;
#endif
#ifdef MOE_HAVE_AVX2_KERNEL
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2"))
        return kernel_avx2;
#endif
#ifdef MOE_HAVE_VECTOR_EXT
    return kernel_v4;
#else
    return kernel_scalar;
#endif
}

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

/* team_size, team_member: ref/ref_threads.h. */

/* The scratch of threads threads: threads * SCRATCH_FLOATS floats, or NULL when they cannot be had.  Not
 * proved (malloc: WP 25 has no model of allocation); its contract is stated. */
/*@ requires threads: threads >= 1;
    terminates \true;
    assigns __fc_heap_status \from threads, __fc_heap_status;
    assigns \result \from threads, __fc_heap_status;
    allocates \result;
    ensures arena: \result != \null ==> \valid(\result + (0 .. threads * SCRATCH_FLOATS - 1)); */
static float *scratch_arena(int threads)
{
    if ((size_t)threads > SIZE_MAX / sizeof(float) / SCRATCH_FLOATS)
        return NULL;
    return malloc((size_t)threads * SCRATCH_FLOATS * sizeof(float));
}

/* The index logic of a work item's context, for Frama-C/WP (specs/gemm.acsl has the problem's). */
/*@ predicate ctx_problem_ok{L}(gemm_ctx *g) = \valid_read(g) && gemm_problem_ok(g->p);
    predicate ctx_weights_ok{L}(gemm_ctx *g) =
      g->topk_weights != \null && tensor_readable((char *)g->topk_weights, g->p->rows, g->p->dtype);
*/

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

/* The topk weight of expert-order row r's slot (g->topk_weights [M], indexed by slot). */
/*@ requires problem: ctx_problem_ok(g);
    requires weights: ctx_weights_ok(g);
    requires row: 0 <= r < g->p->rows;
    terminates \true;
    assigns \nothing; */
static inline float topk_weight(const gemm_ctx *g, int64_t r)
{
    return moe_ref_load(g->p->dtype, g->topk_weights, slot_of_row(g->p, r));
}

/* Spreads a converted row v[0 .. count) over the lanes of consecutive packed groups or panels: element
 * j goes to dst[(j / width) * stride + j % width]; the lanes past count in the last one become 0. */
/* Frama-C/WP proves the indices and the writes, not the values.  The ghost parameter chunks is the number
 * of groups or panels, ceil(count / width): chunk c lands at dst[c * stride .. c * stride + width - 1]. */
/*@ ghost
  /@ requires range: 0 <= a && 1 <= k && a * k < b * k;
     terminates \true;
     assigns \nothing;
     ensures below: a < b;
  @/
  static void lemma_mul_below(int64_t a, int64_t b, int64_t k)
  {
  }
*/

/*@ requires width: 1 <= width <= NR;
    requires stride: width <= stride;
    requires count: 0 <= count <= INT64_MAX - NR;
    requires chunks: 0 <= chunks && (chunks - 1) * width < count <= chunks * width;
    requires v: \valid_read(v + (0 .. count - 1));
    requires dst: \valid(dst + (0 .. (chunks - 1) * stride + width - 1));
    terminates \true;
    assigns dst[0 .. (chunks - 1) * stride + width - 1]; */
static inline void spread_row(const float *restrict v, int64_t count, int width, float *restrict dst,
                              int64_t stride) /*@ ghost (int64_t chunks) */
{
    int64_t j0 = 0;
    /*@ ghost int64_t chunk = 0; */
    /*@ loop invariant bounds: 0 <= j0 <= count && 0 <= chunk <= j0;
        loop invariant chunk: j0 == chunk * width;
        loop invariant dst: dst == \at(dst, Pre) + chunk * stride;
        loop assigns j0, dst, chunk, \at(dst, Pre)[0 .. (chunks - 1) * stride + width - 1];
        loop variant count - j0; */
    for (; j0 + width <= count; j0 += width, dst += stride) {
        /*@ ghost lemma_mul_below(chunk, chunks, width); */
        /*@ ghost lemma_mul_monotone(chunk, chunks - 1, stride); */
        /*@ loop invariant bounds: 0 <= j <= width;
            loop assigns j, dst[0 .. width - 1];
            loop variant width - j; */
        for (int j = 0; j < width; j++) /* a fixed-size copy once inlined */
            dst[j] = v[j0 + j];
        /*@ ghost chunk++; */
    }
    if (j0 < count) {
        /*@ ghost lemma_mul_below(chunk, chunks, width); */
        /*@ ghost lemma_mul_monotone(chunk, chunks - 1, stride); */
        /*@ loop invariant bounds: 0 <= j <= width;
            loop assigns j, dst[0 .. width - 1];
            loop variant width - j; */
        for (int j = 0; j < width; j++)
            dst[j] = j0 + j < count ? v[j0 + j] : 0.0f;
    }
}

/* The packing of A and B (one reduction block of one work item), split per op kind into small functions
 * so that Frama-C/WP proves each with short goals: the indices and the writes (every read lies in the
 * source tensor's bytes, every write in the packed range), not the values. */
/*@ logic integer pack_count(integer n, integer width) = (n + width - 1) / width;

    // The A source of the op is readable: fwd, topk: x [gemm_x_rows][K]; dX, dW: dy [M][N].
    predicate ctx_a_src_ok{L}(gemm_ctx *g) =
      (g->kind == OP_FWD || g->kind == OP_TOPK) ?
        tensor_readable((char *)g->a_src, gemm_x_rows(g->p) * g->p->K, g->p->dtype) :
        tensor_readable((char *)g->a_src, g->p->rows * g->p->N, g->p->dtype);

    // The B source of the op is readable: dW: x [gemm_x_rows][K]; fwd, topk, dX: W [E][N][K].
    predicate ctx_b_src_ok{L}(gemm_ctx *g) =
      g->kind == OP_DW ?
        tensor_readable((char *)g->b_src, gemm_x_rows(g->p) * g->p->K, g->p->dtype) :
        tensor_readable((char *)g->b_src, g->p->num_experts * g->p->N * g->p->K, g->p->dtype);

    // Expert-order rows offsets[e] + p0 .. offsets[e] + p0 + kb - 1 belong to expert e (dW's reduction).
    predicate expert_rows_ok{L}(gemm_ctx *g, integer e, integer p0, integer kb) =
      0 <= e < g->p->num_experts && \valid_read(g->offsets + (e .. e + 1)) && 0 <= g->offsets[e] &&
      g->offsets[e] + p0 + kb <= g->offsets[e + 1] <= g->p->rows;
*/

/* fwd, topk, dX: lane[q * MR] = A[r][p0 + q] for q < kb (x[xrow(r)][p0 + q], or dy[yrow(r)][p0 + q]). */
/*@ requires problem: ctx_problem_ok(g);
    requires kind: g->kind == OP_FWD || g->kind == OP_TOPK || g->kind == OP_DX;
    requires src: ctx_a_src_ok(g);
    requires row: 0 <= r < g->p->rows;
    requires depth: 0 <= p0 && 1 <= kb <= KB && p0 + kb <= (g->kind == OP_DX ? g->p->N : g->p->K);
    requires lane: \valid(lane + (0 .. (kb - 1) * MR));
    terminates \true;
    assigns lane[0 .. (kb - 1) * MR]; */
static inline void pack_a_lane(const gemm_ctx *g, int64_t r, int64_t p0, int64_t kb, float *lane)
{
    const moe_gemm_problem *p = g->p;
    int64_t first;
    if (g->kind == OP_DX) {
        const int64_t yr = y_row(p, r);
        /*@ ghost lemma_row_fits(yr, p->rows, p->N); */
        first = yr * p->N + p0;
    } else {
        const int64_t xr = x_row(p, r);
        /*@ ghost lemma_row_fits(xr, p->permute_x != 0 ? p->num_tokens : p->rows, p->K); */
        first = xr * p->K + p0;
    }
    load_span(p->dtype, g->a_src, first, kb, lane, MR);
}

/* fwd, topk, dX: groups [gi][kb][MR] of rows i0 + gi * MR + l; the lanes past mi become 0. */
/*@ requires problem: ctx_problem_ok(g);
    requires kind: g->kind == OP_FWD || g->kind == OP_TOPK || g->kind == OP_DX;
    requires src: ctx_a_src_ok(g);
    requires block: \valid_read(ab) && 0 <= ab->i0 && 0 <= ab->mi <= MB && ab->i0 + ab->mi <= g->p->rows;
    requires depth: 0 <= p0 && 1 <= kb <= KB && p0 + kb <= (g->kind == OP_DX ? g->p->N : g->p->K);
    requires a: \valid(a + (0 .. pack_count(ab->mi, MR) * (kb * MR) - 1));
    terminates \true;
    assigns a[0 .. pack_count(ab->mi, MR) * (kb * MR) - 1]; */
static void pack_a_rows(const gemm_ctx *g, const a_block *ab, int64_t p0, int64_t kb, float *a)
{
    const int64_t groups = (ab->mi + MR - 1) / MR, group_len = kb * MR;
    /*@ assert packed: groups * group_len == pack_count(ab->mi, MR) * (kb * MR); */
    /*@ loop invariant bounds: 0 <= gi <= groups;
        loop assigns gi, a[0 .. groups * group_len - 1];
        loop variant groups - gi; */
    for (int64_t gi = 0; gi < groups; gi++) {
        /*@ ghost lemma_row_fits(gi, groups, group_len); */
        float *group = a + gi * group_len;
        /*@ loop invariant bounds: 0 <= l <= MR;
            loop assigns l, group[0 .. group_len - 1];
            loop variant MR - l; */
        for (int l = 0; l < MR; l++) {
            const int64_t i = gi * MR + l;
            float *lane = group + l;
            if (i >= ab->mi) {
                /*@ loop invariant bounds: 0 <= q <= kb;
                    loop assigns q, lane[0 .. (kb - 1) * MR];
                    loop variant kb - q; */
                for (int64_t q = 0; q < kb; q++)
                    lane[q * MR] = 0.0f;
                continue;
            }
            pack_a_lane(g, ab->i0 + i, p0, kb, lane);
        }
    }
}

/* dW: a[q][i] = wt(r) * dy[yrow(r)][n0 + i], r = offsets[e] + p0 + q: one dy row segment per q, spread
 * over the groups (row is scratch for the converted segment). */
/*@ requires problem: ctx_problem_ok(g);
    requires kind: g->kind == OP_DW;
    requires src: ctx_a_src_ok(g);
    requires weights: g->topk_weights != \null ==> ctx_weights_ok(g);
    requires block: \valid_read(ab) && 0 <= ab->i0 && 0 <= ab->mi <= MB && ab->i0 + ab->mi <= g->p->N;
    requires depth: 0 <= p0 && 1 <= kb <= KB;
    requires rows: expert_rows_ok(g, ab->e, p0, kb);
    requires a: \valid(a + (0 .. pack_count(ab->mi, MR) * (kb * MR) - 1));
    requires row: \valid(row + (0 .. ab->mi - 1));
    requires separated: \separated(a + (0 .. pack_count(ab->mi, MR) * (kb * MR) - 1), row + (0 .. ab->mi - 1));
    terminates \true;
    assigns a[0 .. pack_count(ab->mi, MR) * (kb * MR) - 1], row[0 .. ab->mi - 1]; */
static void pack_a_dw(const gemm_ctx *g, const a_block *ab, int64_t p0, int64_t kb, float *a, float *row)
{
    const moe_gemm_problem *p = g->p;
    const int64_t group_len = kb * MR;
    /*@ ghost const int64_t groups = (ab->mi + MR - 1) / MR; */
    /*@ assert packed: groups * group_len == pack_count(ab->mi, MR) * (kb * MR); */
    /*@ loop invariant bounds: 0 <= q <= kb;
        loop assigns q, a[0 .. groups * group_len - 1], row[0 .. ab->mi - 1];
        loop variant kb - q; */
    for (int64_t q = 0; q < kb; q++) {
        const int64_t r = g->offsets[ab->e] + p0 + q;
        const int64_t yr = y_row(p, r);
        /*@ ghost lemma_row_fits(yr, p->rows, p->N); */
        load_span(p->dtype, g->a_src, yr * p->N + ab->i0, ab->mi, row, 1);
        if (g->topk_weights != NULL) {
            const float wt = topk_weight(g, r);
            /*@ loop invariant bounds: 0 <= i <= ab->mi;
                loop assigns i, row[0 .. ab->mi - 1];
                loop variant ab->mi - i; */
            for (int64_t i = 0; i < ab->mi; i++)
                row[i] = wt * row[i];
        }
        /*@ assert lanes: 0 <= q * MR && q * MR + (groups - 1) * group_len + MR <= groups * group_len; */
        spread_row(row, ab->mi, MR, a + q * MR, group_len) /*@ ghost (groups) */;
    }
}

/* Packs A rows [0, mi) of block ab, reduction indices [p0, p0+kb), into groups [g][kb][MR]. */
/*@ requires problem: ctx_problem_ok(g);
    requires kind: g->kind == OP_FWD || g->kind == OP_TOPK || g->kind == OP_DX || g->kind == OP_DW;
    requires src: ctx_a_src_ok(g);
    requires weights: g->kind == OP_DW && g->topk_weights != \null ==> ctx_weights_ok(g);
    requires block: \valid_read(ab) && 0 <= ab->i0 && 0 <= ab->mi <= MB &&
                    ab->i0 + ab->mi <= (g->kind == OP_DW ? g->p->N : g->p->rows);
    requires depth: 0 <= p0 && 1 <= kb <= KB;
    requires reduction: g->kind == OP_DW ? expert_rows_ok(g, ab->e, p0, kb)
                                         : p0 + kb <= (g->kind == OP_DX ? g->p->N : g->p->K);
    requires a: \valid(a + (0 .. pack_count(ab->mi, MR) * (kb * MR) - 1));
    requires row: \valid(row + (0 .. ab->mi - 1));
    requires separated: \separated(a + (0 .. pack_count(ab->mi, MR) * (kb * MR) - 1), row + (0 .. ab->mi - 1));
    terminates \true;
    assigns a[0 .. pack_count(ab->mi, MR) * (kb * MR) - 1], row[0 .. ab->mi - 1];
    behavior op_dw:
      assumes g->kind == OP_DW;
      assigns a[0 .. pack_count(ab->mi, MR) * (kb * MR) - 1], row[0 .. ab->mi - 1];
    behavior op_rows:
      assumes g->kind != OP_DW;
      assigns a[0 .. pack_count(ab->mi, MR) * (kb * MR) - 1];
    complete behaviors;
    disjoint behaviors; */
static void pack_a(const gemm_ctx *g, const a_block *ab, int64_t p0, int64_t kb, float *a, float *row)
{
    if (g->kind == OP_DW)
        pack_a_dw(g, ab, p0, kb, a, row);
    else
        pack_a_rows(g, ab, p0, kb, a);
}

/* fwd, topk: panel[q][j] = W[n + j][p0 + q] (W seen as [E * N][K]) for j < cols, q < kb; the columns
 * past cols (a last, partial panel) become 0.  A full panel is one transpose. */
/*@ requires problem: ctx_problem_ok(g);
    requires kind: g->kind != OP_DW;
    requires src: ctx_b_src_ok(g);
    requires cols: 1 <= cols && 0 <= n && n + (cols < NR ? cols : NR) <= g->p->num_experts * g->p->N;
    requires depth: 0 <= p0 && 1 <= kb <= KB && p0 + kb <= g->p->K;
    requires panel: \valid(panel + (0 .. kb * NR - 1));
    terminates \true;
    assigns panel[0 .. kb * NR - 1]; */
static inline void pack_w_panel(const gemm_ctx *g, int64_t n, int64_t cols, int64_t p0, int64_t kb,
                                float *panel)
{
    const moe_gemm_problem *p = g->p;
    /*@ ghost lemma_row_fits(n, p->num_experts * p->N, p->K); */
    const int64_t first = n * p->K + p0;
    if (cols >= NR) {
        /*@ ghost lemma_row_fits(n + NR - 1, p->num_experts * p->N, p->K); */
        /*@ assert last_row: first + (NR - 1) * p->K + kb <= (n + NR) * p->K; */
        load_transposed_panel(p->dtype, g->b_src, first, p->K, kb, panel);
        return;
    }
    /*@ loop invariant bounds: 0 <= j <= NR;
        loop assigns j, panel[0 .. kb * NR - 1];
        loop variant NR - j; */
    for (int64_t j = 0; j < NR; j++) {
        if (j < cols) {
            /*@ ghost lemma_row_fits(n + j, p->num_experts * p->N, p->K); */
            /*@ assert column: first + j * p->K == (n + j) * p->K + p0; */
            load_span(p->dtype, g->b_src, first + j * p->K, kb, panel + j, NR);
        } else {
            /*@ loop invariant bounds: 0 <= q <= kb;
                loop assigns q, panel[0 .. kb * NR - 1];
                loop variant kb - q; */
            for (int64_t q = 0; q < kb; q++)
                panel[q * NR + j] = 0.0f;
        }
    }
}

/* fwd, topk: b[h][q][j] = W[e][j0 + h * NR + j][p0 + q]: the transpose of a W block, panel by panel. */
/*@ requires problem: ctx_problem_ok(g);
    requires kind: g->kind != OP_DW;
    requires src: ctx_b_src_ok(g);
    requires block: \valid_read(ab) && 0 <= ab->e < g->p->num_experts;
    requires cols: 0 <= j0 && 0 <= nj <= NB && j0 + nj <= g->p->N;
    requires depth: 0 <= p0 && 1 <= kb <= KB && p0 + kb <= g->p->K;
    requires b: \valid(b + (0 .. pack_count(nj, NR) * (kb * NR) - 1));
    terminates \true;
    assigns b[0 .. pack_count(nj, NR) * (kb * NR) - 1]; */
static void pack_b_w(const gemm_ctx *g, const a_block *ab, int64_t j0, int64_t nj, int64_t p0, int64_t kb,
                     float *b)
{
    const moe_gemm_problem *p = g->p;
    const int64_t panels = (nj + NR - 1) / NR, panel_len = kb * NR;
    /*@ assert packed: panels * panel_len == pack_count(nj, NR) * (kb * NR); */
    /*@ ghost lemma_row_fits(ab->e, p->num_experts, p->N); */
    /*@ loop invariant bounds: 0 <= h <= panels;
        loop assigns h, b[0 .. panels * panel_len - 1];
        loop variant panels - h; */
    for (int64_t h = 0; h < panels; h++) {
        /*@ ghost lemma_row_fits(h, panels, panel_len); */
        pack_w_panel(g, ab->e * p->N + j0 + h * NR, nj - h * NR, p0, kb, b + h * panel_len);
    }
}

/* dX, dW: the first element of B row p0 + q's column segment j0 .. (dX: W[e][qa][j0], qa = p0 + q;
 * dW: x[xrow(r)][j0], r = offsets[e] + qa), as an element index of g->b_src. */
/*@ requires problem: ctx_problem_ok(g);
    requires kind: g->kind == OP_DX || g->kind == OP_DW;
    requires block: \valid_read(ab) && 0 <= ab->e < g->p->num_experts;
    requires row: 0 <= qa && (g->kind == OP_DW ? expert_rows_ok(g, ab->e, qa, 1) : qa < g->p->N);
    requires col: 0 <= j0 <= g->p->K;
    terminates \true;
    assigns \nothing;
    ensures row_start: 0 <= \result - j0 && \result - j0 + g->p->K <=
                       (g->kind == OP_DW ? gemm_x_rows(g->p) * g->p->K : g->p->num_experts * g->p->N * g->p->K); */
static inline int64_t b_row_first(const gemm_ctx *g, const a_block *ab, int64_t qa, int64_t j0)
{
    const moe_gemm_problem *p = g->p;
    if (g->kind == OP_DX) {
        /*@ ghost lemma_row_fits(ab->e, p->num_experts, p->N); */
        /*@ ghost lemma_row_fits(ab->e * p->N + qa, p->num_experts * p->N, p->K); */
        return (ab->e * p->N + qa) * p->K + j0;
    }
    const int64_t xr = x_row(p, g->offsets[ab->e] + qa);
    /*@ ghost lemma_row_fits(xr, p->permute_x != 0 ? p->num_tokens : p->rows, p->K); */
    return xr * p->K + j0;
}

/* A hint to fetch the cache lines of line[0 .. bytes) (pack_b_rows: the row segment a few steps ahead).
 * Under Frama-C MOE_PREFETCH reads nothing. */
/*@ requires bytes: bytes <= 4 * NB;
    terminates \true;
    assigns \nothing; */
static inline void prefetch_span(const char *line, size_t bytes)
{
    /*@ loop invariant bounds: off <= bytes + 63;
        loop assigns off;
        loop variant bytes - off; */
    for (size_t off = 0; off < bytes; off += 64)
        MOE_PREFETCH(line + off);
}

/* dX: b[q][j] = W[e][p0 + q][j0 + j];  dW: b[q][j] = x[xrow(r)][j0 + j], r = offsets[e] + p0 + q: one row
 * segment per q, converted into row and spread over the panels.  The row segments are short and a row
 * apart (often a page apart), so each is fetched ahead. */
/*@ requires problem: ctx_problem_ok(g);
    requires kind: g->kind == OP_DX || g->kind == OP_DW;
    requires src: ctx_b_src_ok(g);
    requires block: \valid_read(ab) && 0 <= ab->e < g->p->num_experts;
    requires cols: 0 <= j0 && 0 <= nj <= NB && j0 + nj <= g->p->K;
    requires depth: 0 <= p0 && 1 <= kb <= KB;
    requires reduction: g->kind == OP_DW ? expert_rows_ok(g, ab->e, p0, kb) : p0 + kb <= g->p->N;
    requires b: \valid(b + (0 .. pack_count(nj, NR) * (kb * NR) - 1));
    requires row: \valid(row + (0 .. nj - 1));
    requires separated: \separated(b + (0 .. pack_count(nj, NR) * (kb * NR) - 1), row + (0 .. nj - 1));
    terminates \true;
    assigns b[0 .. pack_count(nj, NR) * (kb * NR) - 1], row[0 .. nj - 1]; */
static void pack_b_rows(const gemm_ctx *g, const a_block *ab, int64_t j0, int64_t nj, int64_t p0, int64_t kb,
                        float *b, float *row)
{
    const moe_gemm_problem *p = g->p;
    enum { AHEAD = 8 };
    const size_t es = moe_dtype_size(p->dtype);
    const int64_t panel_len = kb * NR;
    /*@ ghost const int64_t panels = (nj + NR - 1) / NR; */
    /*@ assert packed: panels * panel_len == pack_count(nj, NR) * (kb * NR); */
    /*@ loop invariant bounds: 0 <= q <= kb;
        loop assigns q, b[0 .. panels * panel_len - 1], row[0 .. nj - 1];
        loop variant kb - q; */
    for (int64_t q = 0; q < kb; q++) {
        if (q + AHEAD < kb) {
            const char *line = (const char *)g->b_src + (size_t)b_row_first(g, ab, p0 + q + AHEAD, j0) * es;
            prefetch_span(line, (size_t)nj * es);
        }
        load_span(p->dtype, g->b_src, b_row_first(g, ab, p0 + q, j0), nj, row, 1);
        /*@ assert lanes: 0 <= q * NR && q * NR + (panels - 1) * panel_len + NR <= panels * panel_len; */
        spread_row(row, nj, NR, b + q * NR, panel_len) /*@ ghost (panels) */;
    }
}

/* Packs B columns [j0, j0+nj), reduction indices [p0, p0+kb), into panels [h][kb][NR]. */
/*@ requires problem: ctx_problem_ok(g);
    requires kind: g->kind == OP_FWD || g->kind == OP_TOPK || g->kind == OP_DX || g->kind == OP_DW;
    requires src: ctx_b_src_ok(g);
    requires block: \valid_read(ab) && 0 <= ab->e < g->p->num_experts;
    requires cols: 0 <= j0 && 0 <= nj <= NB && j0 + nj <= (g->kind == OP_FWD || g->kind == OP_TOPK ? g->p->N : g->p->K);
    requires depth: 0 <= p0 && 1 <= kb <= KB;
    requires reduction: g->kind == OP_DW ? expert_rows_ok(g, ab->e, p0, kb)
                                         : p0 + kb <= (g->kind == OP_DX ? g->p->N : g->p->K);
    requires b: \valid(b + (0 .. pack_count(nj, NR) * (kb * NR) - 1));
    requires row: \valid(row + (0 .. nj - 1));
    requires separated: \separated(b + (0 .. pack_count(nj, NR) * (kb * NR) - 1), row + (0 .. nj - 1));
    terminates \true;
    assigns b[0 .. pack_count(nj, NR) * (kb * NR) - 1], row[0 .. nj - 1];
    behavior op_transpose:
      assumes g->kind == OP_FWD || g->kind == OP_TOPK;
      assigns b[0 .. pack_count(nj, NR) * (kb * NR) - 1];
    behavior op_rows:
      assumes g->kind == OP_DX || g->kind == OP_DW;
      assigns b[0 .. pack_count(nj, NR) * (kb * NR) - 1], row[0 .. nj - 1];
    complete behaviors;
    disjoint behaviors; */
static void pack_b(const gemm_ctx *g, const a_block *ab, int64_t j0, int64_t nj, int64_t p0, int64_t kb,
                   float *b, float *row)
{
    if (g->kind == OP_FWD || g->kind == OP_TOPK)
        pack_b_w(g, ab, j0, nj, p0, kb, b);
    else
        pack_b_rows(g, ab, j0, nj, p0, kb, b, row);
}

/* copy_floats (dX with reduce_topk: a slot's values): ref/ref_threads.h. */

/*@ // The elements store_tile may write: fwd y [M][N], dX dx [M][K] (without reduce_topk), dW dw [E][N][K].
    // dX with reduce_topk writes no output here (its slot values go to g->slot_values): 0, so that the
    // assigns clause below is empty then (WP 25 does not use a behavior's assigns at a call site).
    // (A function of values, applied to the fields: the provers carry it across writes to other memory by
    // congruence, which they do not do for a product of fields; see the notes of specs/README.md.)
    logic integer out_count_at(integer kind, integer reduce, integer M, integer E, integer N, integer K) =
      kind == OP_FWD ? M * N : kind == OP_DW ? E * N * K : kind == OP_DX && reduce != 0 ? 0 : M * K;
    logic integer ctx_out_count{L}(gemm_ctx *g) =
      out_count_at(g->kind, g->p->reduce_topk, g->p->rows, g->p->num_experts, g->p->N, g->p->K);
    logic moe_dtype ctx_out_dtype{L}(gemm_ctx *g) = g->kind == OP_DW ? g->p->dw_dtype : g->p->dtype;
    logic integer ctx_out_bytes{L}(gemm_ctx *g) = byte_offset(ctx_out_count(g), ctx_out_dtype(g));

    // The output's bytes are writable and overlap neither the context, the problem, the routing arrays
    // nor the accumulator tile acc [MB][NB].
    predicate ctx_out_ok{L}(gemm_ctx *g, a_block *ab, float *acc) =
      tensor_writable((char *)g->out, ctx_out_count(g), ctx_out_dtype(g)) &&
      \separated((char *)g->out + (0 .. ctx_out_bytes(g) - 1), g, ab, g->p, acc + (0 .. ab->mi * NB - 1),
                 g->p->gather_indices + (0 .. g->p->rows - 1), g->offsets + (0 .. g->p->num_experts));

    // dX with reduce_topk: slot_values [M][slot_width] holds columns chunk0 .. chunk0 + slot_width - 1,
    // among them the tile's j0 .. j0 + nj - 1; it does not overlap acc.
    predicate ctx_slots_ok{L}(gemm_ctx *g, a_block *ab, float *acc, integer j0, integer nj) =
      0 <= g->chunk0 <= j0 && j0 + nj <= g->chunk0 + g->slot_width &&
      g->p->rows * g->slot_width <= INT64_MAX &&
      \valid(g->slot_values + (0 .. g->p->rows * g->slot_width - 1)) &&
      \separated(g->slot_values + (0 .. g->p->rows * g->slot_width - 1), acc + (0 .. ab->mi * NB - 1));
*/

/* The per-element tail of moe_ref.h for the tile's real elements (acc is scratch: weighted in place). */
/*@ requires problem: ctx_problem_ok(g);
    requires kind: g->kind == OP_FWD || g->kind == OP_DX || g->kind == OP_DW;
    requires weights: g->kind != OP_DW && g->topk_weights != \null ==> ctx_weights_ok(g);
    requires block: \valid_read(ab) && 0 <= ab->i0 && 0 <= ab->mi <= MB &&
                    (g->kind == OP_DW ? 0 <= ab->e < g->p->num_experts && ab->i0 + ab->mi <= g->p->N
                                      : ab->i0 + ab->mi <= g->p->rows);
    requires cols: 0 <= j0 && 0 <= nj <= NB && j0 + nj <= (g->kind == OP_FWD ? g->p->N : g->p->K);
    requires acc: \valid(acc + (0 .. ab->mi * NB - 1));
    requires out: g->kind == OP_DX && g->p->reduce_topk != 0 ? ctx_slots_ok(g, ab, acc, j0, nj)
                                                             : ctx_out_ok(g, ab, acc);
    terminates \true;
    assigns acc[0 .. ab->mi * NB - 1], ((char *)g->out)[0 .. ctx_out_bytes(g) - 1],
            g->slot_values[0 .. g->p->rows * g->slot_width - 1]; */
static void store_tile(const gemm_ctx *g, const a_block *ab, int64_t j0, int64_t nj, float *acc)
{
    const moe_gemm_problem *p = g->p;
    /*@ loop invariant bounds: 0 <= i <= ab->mi;
        loop invariant problem: ctx_problem_ok(g) && g->kind == \at(g->kind, Pre);
        loop invariant block: ab->i0 == \at(ab->i0, Pre) && ab->mi == \at(ab->mi, Pre) && ab->e == \at(ab->e, Pre);
        loop assigns i, acc[0 .. ab->mi * NB - 1], ((char *)g->out)[0 .. ctx_out_bytes(g) - 1],
                     g->slot_values[0 .. g->p->rows * g->slot_width - 1];
        loop variant ab->mi - i; */
    for (int64_t i = 0; i < ab->mi; i++) {
        float *v = acc + i * NB;
        if (g->kind == OP_DW) {
            /*@ ghost lemma_row_fits(ab->e, p->num_experts, p->N); */
            const int64_t n = ab->e * p->N + ab->i0 + i; /* the row of dW seen as [E * N][K] */
            /*@ ghost lemma_row_fits(n, p->num_experts * p->N, p->K); */
            store_row(p->dw_dtype, g->out, n * p->K + j0, v, nj, p->accumulate);
            continue;
        }
        const int64_t r = ab->i0 + i;
        if (g->topk_weights != NULL) {
            const float wt = topk_weight(g, r);
            /*@ loop invariant bounds: 0 <= j <= nj;
                loop assigns j, v[0 .. nj - 1];
                loop variant nj - j; */
            for (int64_t j = 0; j < nj; j++)
                v[j] = wt * v[j];
        }
        if (g->kind == OP_DX && p->reduce_topk) {
            const int64_t s = slot_of_row(p, r);
            /*@ ghost lemma_row_fits(s, p->rows, g->slot_width); */
            copy_floats(g->slot_values + s * g->slot_width + (j0 - g->chunk0), v, nj);
        } else if (g->kind == OP_FWD) {
            const int64_t yr = y_row(p, r);
            /*@ ghost lemma_row_fits(yr, p->rows, p->N); */
            store_row(p->dtype, g->out, yr * p->N + j0, v, nj, p->accumulate);
        } else {
            const int64_t s = p->permute_x ? slot_of_row(p, r) : r;
            /*@ ghost lemma_row_fits(s, p->rows, p->K); */
            store_row(p->dtype, g->out, s * p->K + j0, v, nj, p->accumulate);
        }
    }
}

/*@ // A thread's scratch: the packs a [MB * KB] and b [NB * KB], the accumulator tile acc [MB * NB] and
    // row [max(MB, NB)], valid and pairwise apart (float buffers: apart from every int and pointer anyway).
    predicate scratch_ok{L}(thread_scratch *s) =
      \valid_read(s) &&
      \valid(s->a + (0 .. MB * KB - 1)) && \valid(s->b + (0 .. NB * KB - 1)) &&
      \valid(s->acc + (0 .. MB * NB - 1)) && \valid(s->row + (0 .. (MB > NB ? MB : NB) - 1)) &&
      \separated(s->a + (0 .. MB * KB - 1), s->b + (0 .. NB * KB - 1), s->acc + (0 .. MB * NB - 1),
                 s->row + (0 .. (MB > NB ? MB : NB) - 1));

    // What every op's tile needs of the context: the sources readable, the weights (dW) and the kernel.
    predicate ctx_tile_ok{L}(gemm_ctx *g) =
      ctx_problem_ok(g) &&
      (g->kind == OP_FWD || g->kind == OP_DX || g->kind == OP_DW || g->kind == OP_TOPK) &&
      ctx_a_src_ok(g) && ctx_b_src_ok(g) &&
      (g->kind == OP_DW && g->topk_weights != \null ==> ctx_weights_ok(g)) &&
      g->kernel == &kernel_scalar;
*/

/*@ // An arena of threads scratches (scratch_arena): threads * SCRATCH_FLOATS floats, valid.
    predicate arena_ok{L}(float *arena, integer threads) =
      1 <= threads && \valid(arena + (0 .. threads * SCRATCH_FLOATS - 1));
*/

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
static void team_scratch(thread_scratch *s, float *arena, int t)
{
    float *part = arena + (int64_t)t * SCRATCH_FLOATS;
    s->a = part;
    s->b = part + SCRATCH_B;
    s->acc = part + SCRATCH_ACC;
    s->row = part + SCRATCH_ROW;
}

/* The accumulator tile s->acc of A block ab x B columns [j0, j0+nj), reduction length L.
 * The micro-kernel is called through g->kernel (pick_kernel's choice).  Frama-C parses the scalar path,
 * where pick_kernel returns kernel_scalar: the `calls` annotation makes WP prove that the pointer is
 * kernel_scalar (requires `tile`: ctx_tile_ok) and the requires of kernel_scalar at the call.  In gcc/clang
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
static void compute_tile(const gemm_ctx *g, const a_block *ab, int64_t j0, int64_t nj, int64_t L,
                         thread_scratch *s)
{
    const int64_t groups = (ab->mi + MR - 1) / MR, panels = (nj + NR - 1) / NR;
    if (L == 0) /* an empty reduction (K or N is 0, or dW of an empty expert): every acc stays +0.0f */
        /*@ loop invariant bounds: 0 <= i <= ab->mi;
            loop assigns i, s->acc[0 .. MB * NB - 1];
            loop variant ab->mi - i; */
        for (int64_t i = 0; i < ab->mi; i++)
            /*@ loop invariant bounds: 0 <= j <= nj;
                loop assigns j, s->acc[0 .. MB * NB - 1];
                loop variant nj - j; */
            for (int64_t j = 0; j < nj; j++)
                s->acc[i * NB + j] = 0.0f;
    int64_t kb;
    /*@ loop invariant bounds: 0 <= p0 <= L;
        loop assigns p0, kb, s->a[0 .. MB * KB - 1], s->b[0 .. NB * KB - 1], s->acc[0 .. MB * NB - 1],
                     s->row[0 .. (MB > NB ? MB : NB) - 1];
        loop variant L - p0; */
    for (int64_t p0 = 0; p0 < L; p0 += kb) {
        kb = L - p0 < KB ? L - p0 : KB;
        const int64_t group_len = kb * MR, panel_len = kb * NR;
        /*@ ghost lemma_mul_monotone(groups, MB / MR, group_len); */
        /*@ ghost lemma_mul_monotone(panels, NB / NR, panel_len); */
        pack_a(g, ab, p0, kb, s->a, s->row);
        pack_b(g, ab, j0, nj, p0, kb, s->b, s->row);
        /*@ loop invariant bounds: 0 <= h <= panels;
            loop assigns h, s->acc[0 .. MB * NB - 1];
            loop variant panels - h; */
        for (int64_t h = 0; h < panels; h++) {
            /*@ ghost lemma_row_fits(h, panels, panel_len); */
            /*@ loop invariant bounds: 0 <= gi <= groups;
                loop assigns gi, s->acc[0 .. MB * NB - 1];
                loop variant groups - gi; */
            for (int64_t gi = 0; gi < groups; gi++) {
                /*@ ghost lemma_row_fits(gi, groups, group_len); */
                const int rows = (int)(ab->mi - gi * MR < MR ? ab->mi - gi * MR : MR);
                /*@ calls kernel_scalar; */
                g->kernel(kb, p0 == 0, rows, s->a + gi * group_len, s->b + h * panel_len,
                          s->acc + gi * MR * NB + h * NR, NB);
            }
        }
    }
}

/*@ // The expert offsets [E + 1]: expert e's rows offsets[e] .. offsets[e + 1] - 1 lie in [0, M).
    predicate ctx_offsets_ok{L}(gemm_ctx *g) =
      \valid_read(g->offsets + (0 .. g->p->num_experts)) &&
      \forall integer e; 0 <= e < g->p->num_experts ==> 0 <= g->offsets[e] <= g->offsets[e + 1] <= g->p->rows;

    // An A block of the op: expert e, rows (dW: n) i0 .. i0 + mi - 1.
    predicate block_ok{L}(gemm_ctx *g, a_block *ab) =
      \valid_read(ab) && 0 <= ab->e < g->p->num_experts && 0 <= ab->i0 && 0 <= ab->mi <= MB &&
      ab->i0 + ab->mi <= (g->kind == OP_DW ? g->p->N : g->p->rows);
    predicate blocks_ok{L}(gemm_ctx *g, a_block *blocks, integer count) =
      0 <= count && \valid_read(blocks + (0 .. count - 1)) &&
      \forall integer b; 0 <= b < count ==> block_ok(g, blocks + b);

    // Where the tiles of columns jlo .. jhi - 1 go: dX with reduce_topk the slot values (their chunk
    // holds those columns), otherwise the output tensor, apart from the context, the blocks, acc.
    predicate ctx_items_out_ok{L}(gemm_ctx *g, a_block *blocks, integer count, float *acc, integer jlo,
                                  integer jhi) =
      g->kind == OP_DX && g->p->reduce_topk != 0 ?
        0 <= g->chunk0 <= jlo && jhi <= g->chunk0 + g->slot_width && g->p->rows * g->slot_width <= INT64_MAX &&
        \valid(g->slot_values + (0 .. g->p->rows * g->slot_width - 1)) &&
        \separated(g->slot_values + (0 .. g->p->rows * g->slot_width - 1), acc + (0 .. MB * NB - 1))
      : tensor_writable((char *)g->out, ctx_out_count(g), ctx_out_dtype(g)) &&
        \separated((char *)g->out + (0 .. ctx_out_bytes(g) - 1), g, g->p, blocks + (0 .. count - 1),
                   acc + (0 .. MB * NB - 1), g->p->gather_indices + (0 .. g->p->rows - 1),
                   g->offsets + (0 .. g->p->num_experts));
*/

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
static void run_items(const gemm_ctx *g, const a_block *blocks, int64_t block_count, int64_t jlo, int64_t jhi,
                      thread_scratch *s)
{
    const int64_t span = jhi - jlo, chunks = span / NB + (span % NB != 0);
    /*@ assert chunks: chunks == pack_count(jhi - jlo, NB) && 0 <= chunks; */
    const int64_t items = block_count * chunks;
    /*@ loop invariant bounds: 0 <= it <= items;
        loop invariant tile: ctx_tile_ok(g) && g->kind == \at(g->kind, Pre);
        loop invariant weights: g->kind != OP_DW && g->topk_weights != \null ==> ctx_weights_ok(g);
        loop invariant offsets: ctx_offsets_ok(g);
        loop invariant blocks: blocks_ok(g, blocks, block_count);
        loop invariant out: ctx_items_out_ok(g, blocks, block_count, s->acc, jlo, jhi);
        loop assigns it, s->a[0 .. MB * KB - 1], s->b[0 .. NB * KB - 1], s->acc[0 .. MB * NB - 1],
                     s->row[0 .. (MB > NB ? MB : NB) - 1], ((char *)g->out)[0 .. ctx_out_bytes(g) - 1],
                     g->slot_values[0 .. g->p->rows * g->slot_width - 1];
        loop variant items - it; */
    MOE_OMP(omp for schedule(dynamic, 1))
    for (int64_t it = 0; it < items; it++) {
        /*@ ghost lemma_div_below(it, block_count, chunks); */
        const a_block *ab = &blocks[it / chunks];
        /*@ assert block: block_ok(g, ab); */
        const int64_t j0 = jlo + (it % chunks) * NB;
        const int64_t nj = jhi - j0 < NB ? jhi - j0 : NB;
        const int64_t L = g->kind == OP_FWD ? g->p->K
                          : g->kind == OP_DX ? g->p->N
                                             : g->offsets[ab->e + 1] - g->offsets[ab->e];
        compute_tile(g, ab, j0, nj, L, s);
        store_tile(g, ab, j0, nj, s->acc);
    }
}

/* ---- setup shared by the ops ---- */

typedef struct gemm_setup {
    int64_t *offsets;
    a_block *blocks;
    int64_t block_count;
} gemm_setup;

/*@ // ceil(m / MB) for m >= 0: the A blocks of m rows (C: m / MB + (m % MB != 0)).
    logic integer ceil_blocks(integer m) = m / MB + (m % MB != 0 ? 1 : 0);

    // The A blocks of experts 0 .. e - 1: sum ceil(m_sizes[e'] / MB) (fwd, dX, topk) or e * ceil(N / MB) (dW).
    logic integer gemm_blocks{L}(moe_gemm_problem *p, integer kind, integer e) =
      e <= 0 ? 0 : gemm_blocks(p, kind, e - 1) + ceil_blocks(kind == OP_DW ? p->N : p->m_sizes[e - 1]);

    // blocks [count] as setup_in writes them for the op kind.
    predicate blocks_at{L}(moe_gemm_problem *p, integer kind, a_block *blocks, integer count) =
      0 <= count && \valid_read(blocks + (0 .. count - 1)) &&
      \forall integer b; 0 <= b < count ==>
        0 <= blocks[b].e < p->num_experts && 0 <= blocks[b].i0 && 0 <= blocks[b].mi <= MB &&
        blocks[b].i0 + blocks[b].mi <= (kind == OP_DW ? p->N : p->rows);

    // The bound on the block count (a predicate over values: see the notes of specs/README.md on products
    // of fields read across a write).
    predicate blocks_bound(integer count, integer kind, integer E, integer N, integer M) =
      0 <= count <= (kind == OP_DW ? E * N : M);

    // The routing of a validated problem (src/gemm_api.c): m_sizes [E] readable, non-negative, sum M.
    predicate gemm_routing_ok{L}(moe_gemm_problem *p) =
      \valid_read(p->m_sizes + (0 .. p->num_experts - 1)) && sizes_ok(p->m_sizes, p->num_experts, p->rows);
*/

/*@ ghost
  /@ requires problem: \valid_read(p) && 0 <= p->num_experts && 0 <= p->N;
     requires nonneg: \forall integer k; 0 <= k < p->num_experts ==> p->m_sizes[k] >= 0;
     terminates \true;
     assigns \nothing;
     ensures monotone: \forall integer a, b; 0 <= a <= b <= p->num_experts ==>
                       gemm_blocks(p, kind, a) <= gemm_blocks(p, kind, b);
  @/
  static void lemma_blocks_monotone(const moe_gemm_problem *p, enum op_kind kind)
  {
    /@ loop invariant bounds: 0 <= x <= p->num_experts;
       loop invariant partial: \forall integer a, b; 0 <= a <= b <= x ==>
                               gemm_blocks(p, kind, a) <= gemm_blocks(p, kind, b);
       loop assigns x;
       loop variant p->num_experts - x;
    @/
    for (int64_t x = 0; x < p->num_experts; x++) ;
  }
*/

/*@ ghost
  /@ requires range: 0 <= j && MB * j < x;
     terminates \true;
     assigns \nothing;
     ensures below: j < ceil_blocks(x);
     ensures last: x - MB * j <= MB ==> ceil_blocks(x) == j + 1;
  @/
  static void lemma_ceil_blocks(int64_t j, int64_t x)
  {
  }
*/

/* The number of A blocks of the op (setup_in writes that many): ceil(m_e / MB) per expert for the
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

/* Offsets and A blocks: expert-order row blocks (fwd, dX, topk) or (expert, n) blocks (dW), on the
 * caller's scratch offsets [E + 1] and blocks [count_blocks + 1] (setup_alloc; either NULL when its
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
static moe_status setup_in(const moe_gemm_problem *p, enum op_kind kind, gemm_setup *st, int64_t *offsets,
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

/* The allocating part of the former setup (not proved: WP 25 has no model of allocation): offsets [E + 1]
 * and blocks [count_blocks + 1] (one more: malloc(0) may return NULL), either NULL when not given; setup_in
 * reports that as before.  Both are allocated even when the first fails (before: the blocks only after the
 * offsets); the status and message are the same. */
static void setup_alloc(const moe_gemm_problem *p, enum op_kind kind, int64_t **offsets, a_block **blocks)
{
    *offsets = malloc(((size_t)p->num_experts + 1) * sizeof **offsets);
    *blocks = malloc(((size_t)count_blocks(p, kind) + 1) * sizeof **blocks);
}

static void setup_free(int64_t *offsets, a_block *blocks)
{
    free(offsets);
    free(blocks);
}

/*@ requires problem: \valid_read(p);
    terminates \true;
    assigns moe_error_model;
    ensures status: \result == MOE_ERR_OUT_OF_MEMORY; */
static moe_status out_of_scratch(const moe_gemm_problem *p)
{
    return moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: no memory for the per-thread tile buffers (%zu bytes each)",
                    p->op, (size_t)(MB * KB + NB * KB + MB * NB + (MB > NB ? MB : NB)) * sizeof(float));
}

/*@ // An op without the reduce_topk scratch (fwd, dW, dX without reduce_topk) on a validated problem: its
    // tensors as src/gemm_api.c checks them (value-level predicates of specs/gemm.acsl, which the provers
    // carry across the scratch writes of the callers), the kernel; the offsets and the blocks of setup_in;
    // the output apart from the context, the setup and the scratch.
    // (three predicates, three requires clauses: as one, its goal at the callers took 10 s at load 6)
    predicate plain_problem_ok{L}(gemm_ctx *g) =
      \valid_read(g) && gemm_problem_ok(g->p) &&
      (g->kind == OP_FWD || g->kind == OP_DW || (g->kind == OP_DX && g->p->reduce_topk == 0));
    predicate plain_tensors_ok{L}(gemm_ctx *g) =
      (g->kind == OP_FWD ? gemm_fwd_tensors_ok(g->p, (char *)g->a_src, (char *)g->b_src,
                                              (char *)g->topk_weights, (char *)g->out) :
       g->kind == OP_DX ? gemm_dx_tensors_ok(g->p, (char *)g->a_src, (char *)g->b_src,
                                             (char *)g->topk_weights, (char *)g->out) :
                          gemm_dw_tensors_ok(g->p, (char *)g->b_src, (char *)g->a_src,
                                             (char *)g->topk_weights, (char *)g->out));
    predicate plain_kernel_ok{L}(gemm_ctx *g) =
      g->kernel == &kernel_scalar && g->slot_values == \null && g->slot_width == 0;
    predicate plain_setup_ok{L}(gemm_ctx *g, gemm_setup *st) =
      \valid_read(st) && ctx_offsets_ok(g) &&
      blocks_at(g->p, g->kind, st->blocks, st->block_count) &&
      blocks_bound(st->block_count, g->kind, g->p->num_experts, g->p->N, g->p->rows);
    predicate plain_apart{L}(gemm_ctx *g, gemm_setup *st) =
      \separated((char *)g->out + (0 .. ctx_out_bytes(g) - 1), g, g->p, st, st->blocks + (0 .. st->block_count - 1),
                 g->p->gather_indices + (0 .. g->p->rows - 1), g->offsets + (0 .. g->p->num_experts));
*/

/* One thread's part of run_plain (proved): every item of the op, on the thread's scratch s.  It states the
 * op's requirements in the form its callers can carry (plain_ok) and proves that they give run_items'. */
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
    run_items(g, st->blocks, st->block_count, 0, columns, s);
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
        return out_of_scratch(g->p);
    MOE_OMP(omp parallel num_threads(threads))
    {
        thread_scratch s;
        const int t = team_member(threads);
        team_scratch(&s, arena, t);
        /*@ assert acc: s.acc == arena + (t * SCRATCH_FLOATS + SCRATCH_ACC) &&
                        t * SCRATCH_FLOATS + SCRATCH_ACC + MB * NB <= threads * SCRATCH_FLOATS; */
        plain_items(g, st, columns, &s);
    }
    return MOE_OK;
}

/* The allocating shell of run_plain_in (not proved: WP 25 has no model of allocation): the arena for the
 * threads of the region, run_plain_in, free.  Its contract is stated: run_plain_in's requires, with the
 * arena that scratch_arena gives (valid, apart: malloc's promise). */
/*@ requires problem: plain_problem_ok(g);
    requires tensors: plain_tensors_ok(g);
    requires kernel: plain_kernel_ok(g);
    requires setup: plain_setup_ok(g, st);
    requires apart: plain_apart(g, st);
    requires cols: columns == (g->kind == OP_FWD ? g->p->N : g->p->K);
    terminates \true;
    assigns ((char *)g->out)[0 .. ctx_out_bytes(g) - 1], moe_error_model, __fc_heap_status;
    ensures status: \result == MOE_OK || \result == MOE_ERR_OUT_OF_MEMORY; */
static moe_status run_plain(const gemm_ctx *g, const gemm_setup *st, int64_t columns)
{
    const int threads = team_size();
    float *arena = scratch_arena(threads);
    const moe_status status = run_plain_in(g, st, columns, arena, threads);
    free(arena);
    return status;
}

/*@ // The scratch of a blocked kernel: offsets [E + 1] and blocks [count_blocks + 1] (setup_alloc), each
    // NULL or valid, apart from each other, the problem, its routing arrays and the output's bytes.
    predicate blocked_scratch_ok{L}(moe_gemm_problem *p, integer kind, int64_t *offsets, a_block *blocks,
                                    char *out, integer out_bytes) =
      (offsets != \null ==> \valid(offsets + (0 .. p->num_experts)) &&
         \separated(offsets + (0 .. p->num_experts), p, p->m_sizes + (0 .. p->num_experts - 1),
                    p->gather_indices + (0 .. p->rows - 1), out + (0 .. out_bytes - 1))) &&
      (blocks != \null ==> \valid(blocks + (0 .. gemm_blocks(p, kind, p->num_experts))) &&
         \separated(blocks + (0 .. gemm_blocks(p, kind, p->num_experts)), p, p->m_sizes + (0 .. p->num_experts - 1),
                    p->gather_indices + (0 .. p->rows - 1), out + (0 .. out_bytes - 1),
                    offsets + (0 .. p->num_experts)));
*/

/* The blocked forward on the caller's scratch (proved; moe_ref_gemm_fwd_blocked allocates it): offsets and
 * blocks as setup_in takes them.  RTE, assigns (the scratch, y's bytes), termination; the requires of
 * setup_in and run_plain.  Statuses: setup_in's, then run_plain's. */
/*@ requires problem: gemm_problem_ok(p);
    requires routing: gemm_routing_ok(p);
    requires tensors: gemm_fwd_tensors_ok(p, (char *)x, (char *)w, (char *)topk_weights, (char *)y);
    requires experts: p->num_experts < INT64_MAX;
    requires problem_apart: \separated(p, p->gather_indices + (0 .. p->rows - 1));
    requires scratch: blocked_scratch_ok(p, OP_FWD, offsets, blocks, (char *)y, byte_offset(p->rows * p->N, p->dtype));
    terminates \true;
    assigns offsets[0 .. p->num_experts], blocks[0 .. gemm_blocks(p, OP_FWD, p->num_experts)],
            ((char *)y)[0 .. byte_offset(p->rows * p->N, p->dtype) - 1], moe_error_model, __fc_heap_status;
    ensures status: offsets != \null && blocks != \null ? \result == MOE_OK || \result == MOE_ERR_OUT_OF_MEMORY
                                                        : \result == MOE_ERR_OUT_OF_MEMORY; */
static moe_status gemm_fwd_blocked_in(const moe_gemm_problem *p, const void *x, const void *w,
                                      const void *topk_weights, void *y, int64_t *offsets, a_block *blocks)
{
    gemm_setup st;
    const moe_status status = setup_in(p, OP_FWD, &st, offsets, blocks);
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
    /*@ assert kept_x_rows: gemm_x_rows(p) == \at(gemm_x_rows(p), Pre) && p->dtype == \at(p->dtype, Pre); */
    /*@ assert kept_at: gemm_fwd_tensors_at((char *)x, (char *)w, (char *)topk_weights, (char *)y,
          \at(gemm_x_rows(p), Pre), \at(p->rows, Pre), \at(p->num_experts, Pre), \at(p->N, Pre), \at(p->K, Pre),
          \at(p->dtype, Pre), p, \at(p->gather_indices, Pre), \at(p->m_sizes, Pre)); */
    /*@ assert kept: gemm_problem_ok(p) &&
                     gemm_fwd_tensors_ok(p, (char *)x, (char *)w, (char *)topk_weights, (char *)y); */
    gemm_ctx g = {p, OP_FWD, x, w, topk_weights, NULL, y, st.offsets, pick_kernel(), NULL, 0, 0};
    /*@ assert g: g.p == p && g.kind == OP_FWD && g.a_src == x && g.b_src == w && g.topk_weights == topk_weights &&
                  g.out == y && g.offsets == offsets && g.kernel == &kernel_scalar && g.slot_values == \null &&
                  g.slot_width == 0; */
    /*@ assert kept_g: gemm_problem_ok(g.p) &&
          gemm_fwd_tensors_ok(g.p, (char *)g.a_src, (char *)g.b_src, (char *)g.topk_weights, (char *)g.out); */
    /*@ assert apart: \separated((char *)y + (0 .. byte_offset(p->rows * p->N, p->dtype) - 1), &g, p, &st,
          blocks + (0 .. st.block_count - 1), p->gather_indices + (0 .. p->rows - 1), offsets + (0 .. p->num_experts)); */
    /*@ assert out_kind: g.kind == OP_FWD && g.p->rows == p->rows && g.p->N == p->N && g.p->dtype == p->dtype; */
    /*@ assert out_count: out_count_at(g.kind, g.p->reduce_topk, g.p->rows, g.p->num_experts, g.p->N, g.p->K) ==
                          p->rows * p->N; */
    /*@ assert out_dtype: ctx_out_dtype(&g) == p->dtype; */
    /*@ assert out_bytes: ctx_out_bytes(&g) == byte_offset(p->rows * p->N, p->dtype); */
    return run_plain(&g, &st, p->N);
}

/* dW on the caller's scratch (proved; as gemm_fwd_blocked_in). */
/*@ requires problem: gemm_problem_ok(p);
    requires routing: gemm_routing_ok(p);
    requires tensors: gemm_dw_tensors_ok(p, (char *)x, (char *)dy, (char *)topk_weights, (char *)dw);
    requires experts: p->num_experts < INT64_MAX;
    requires problem_apart: \separated(p, p->gather_indices + (0 .. p->rows - 1));
    requires scratch: blocked_scratch_ok(p, OP_DW, offsets, blocks, (char *)dw,
                                         byte_offset(p->num_experts * p->N * p->K, p->dw_dtype));
    terminates \true;
    assigns offsets[0 .. p->num_experts], blocks[0 .. gemm_blocks(p, OP_DW, p->num_experts)],
            ((char *)dw)[0 .. byte_offset(p->num_experts * p->N * p->K, p->dw_dtype) - 1], moe_error_model,
            __fc_heap_status;
    ensures status: offsets != \null && blocks != \null ? \result == MOE_OK || \result == MOE_ERR_OUT_OF_MEMORY
                                                        : \result == MOE_ERR_OUT_OF_MEMORY; */
static moe_status gemm_dw_blocked_in(const moe_gemm_problem *p, const void *x, const void *dy,
                                     const void *topk_weights, void *dw, int64_t *offsets, a_block *blocks)
{
    gemm_setup st;
    const moe_status status = setup_in(p, OP_DW, &st, offsets, blocks);
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
    /*@ assert kept_at: gemm_dw_tensors_at((char *)x, (char *)dy, (char *)topk_weights, (char *)dw,
          \at(gemm_x_rows(p), Pre), \at(p->rows, Pre), \at(p->num_experts, Pre), \at(p->N, Pre), \at(p->K, Pre),
          \at(p->dtype, Pre), \at(p->dw_dtype, Pre), p, \at(p->gather_indices, Pre), \at(p->m_sizes, Pre)); */
    /*@ assert kept: gemm_problem_ok(p) &&
                     gemm_dw_tensors_ok(p, (char *)x, (char *)dy, (char *)topk_weights, (char *)dw); */
    gemm_ctx g = {p, OP_DW, dy, x, topk_weights, NULL, dw, st.offsets, pick_kernel(), NULL, 0, 0};
    /*@ assert g: g.p == p && g.kind == OP_DW && g.a_src == dy && g.b_src == x && g.topk_weights == topk_weights &&
                  g.out == dw && g.offsets == offsets && g.kernel == &kernel_scalar && g.slot_values == \null &&
                  g.slot_width == 0; */
    /*@ assert kept_g: gemm_problem_ok(g.p) &&
          gemm_dw_tensors_ok(g.p, (char *)g.b_src, (char *)g.a_src, (char *)g.topk_weights, (char *)g.out); */
    /*@ assert apart: \separated((char *)dw + (0 .. byte_offset(p->num_experts * p->N * p->K, p->dw_dtype) - 1), &g,
          p, &st, blocks + (0 .. st.block_count - 1), p->gather_indices + (0 .. p->rows - 1),
          offsets + (0 .. p->num_experts)); */
    /*@ assert out_kind: g.kind == OP_DW && g.p->num_experts == p->num_experts && g.p->N == p->N &&
                         g.p->K == p->K && g.p->dw_dtype == p->dw_dtype; */
    /*@ assert out_count: out_count_at(g.kind, g.p->reduce_topk, g.p->rows, g.p->num_experts, g.p->N, g.p->K) ==
                          p->num_experts * p->N * p->K; */
    /*@ assert out_dtype: ctx_out_dtype(&g) == p->dw_dtype; */
    /*@ assert out_bytes: ctx_out_bytes(&g) == byte_offset(p->num_experts * p->N * p->K, p->dw_dtype); */
    return run_plain(&g, &st, p->K);
}

/* The allocating shells (not proved): setup_alloc, the proved `_in` function, setup_free. */
moe_status moe_ref_gemm_fwd_blocked(const moe_gemm_problem *p, const void *x, const void *w,
                                    const void *topk_weights, void *y)
{
    int64_t *offsets;
    a_block *blocks;
    setup_alloc(p, OP_FWD, &offsets, &blocks);
    const moe_status status = gemm_fwd_blocked_in(p, x, w, topk_weights, y, offsets, blocks);
    setup_free(offsets, blocks);
    return status;
}

moe_status moe_ref_gemm_dw_blocked(const moe_gemm_problem *p, const void *x, const void *dy,
                                   const void *topk_weights, void *dw)
{
    /* dw [E][N][K] has no element: nothing to write (its E * ceil(N / 96) blocks were allocated and walked
     * before: N = 2^35 with K = 0 took 20 s and 8 GB, 2^40 failed for memory; an audit, 2026-11-29) */
    if (p->N == 0 || p->K == 0)
        return MOE_OK;
    int64_t *offsets;
    a_block *blocks;
    setup_alloc(p, OP_DW, &offsets, &blocks);
    const moe_status status = gemm_dw_blocked_in(p, x, dy, topk_weights, dw, offsets, blocks);
    setup_free(offsets, blocks);
    return status;
}

/*@ // dX with reduce_topk on a validated problem: the context (its tensors as src/gemm_api.c checks them,
    // the kernel), the setup (offsets, blocks), dx's bytes apart from the context, the problem, the setup, the
    // blocks, gather_indices and the offsets.
    predicate reduce_ctx_ok{L}(gemm_ctx *g, void *dx) =
      \valid(g) && gemm_problem_ok(g->p) && g->kind == OP_DX && g->p->reduce_topk != 0 &&
      gemm_dx_tensors_ok(g->p, (char *)g->a_src, (char *)g->b_src, (char *)g->topk_weights, (char *)dx) &&
      g->out == dx && g->kernel == &kernel_scalar;
    predicate reduce_setup_ok{L}(gemm_ctx *g, gemm_setup *st) =
      \valid_read(st) && ctx_offsets_ok(g) && blocks_at(g->p, OP_DX, st->blocks, st->block_count) &&
      blocks_bound(st->block_count, OP_DX, g->p->num_experts, g->p->N, g->p->rows);
    predicate reduce_apart{L}(gemm_ctx *g, gemm_setup *st, void *dx) =
      \separated((char *)dx + (0 .. byte_offset(g->p->num_tokens * g->p->K, g->p->dtype) - 1), g, g->p,
                 st, st->blocks + (0 .. st->block_count - 1), g->p->gather_indices + (0 .. g->p->rows - 1),
                 g->offsets + (0 .. g->p->num_experts));
*/

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

/*@ // dX with reduce_topk: the slot values sv [rows * width], valid and apart from the accumulator tile acc.
    // Over values (rows, width), so that the provers carry it to the fields' later reads by congruence.
    predicate slots_at{L}(float *sv, integer rows, integer width, float *acc) =
      rows * width <= INT64_MAX && \valid(sv + (0 .. rows * width - 1)) &&
      \separated(sv + (0 .. rows * width - 1), acc + (0 .. MB * NB - 1));
*/

/* run_items' `out` for dX with reduce_topk, from the slot values' facts (a ghost lemma function): proved in
 * this small context, the predicate over the memory (ctx_items_out_ok) follows from one over the fields'
 * values (slots_at); inside reduce_chunks' loop the provers did not unfold it (Qed had replaced the fields
 * by the ghost values they equal, which it cannot do inside a predicate of the memory). */
/*@ ghost
  /@ requires ctx: \valid_read(g) && \valid_read(g->p) && g->kind == OP_DX && g->p->reduce_topk != 0;
     requires chunk: 0 <= g->chunk0 <= jlo && jhi <= g->chunk0 + g->slot_width;
     requires slots: slots_at(g->slot_values, g->p->rows, g->slot_width, acc);
     terminates \true;
     assigns \nothing;
     ensures out: ctx_items_out_ok(g, blocks, count, acc, jlo, jhi);
  @/
  static void lemma_reduce_out(const gemm_ctx *g, const a_block *blocks, int64_t count, float *acc, int64_t jlo,
                               int64_t jhi)
  {
  }
*/

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
 * values of the chunk (run_items, after chunk0 is set), then per token the in-order sum of its k slots
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
                          g->kernel == &kernel_scalar;
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
        /* (the single's closing barrier publishes chunk0; run_items ends with a barrier too) */
        /*@ ghost const int64_t ceil = cw / NB + (cw % NB != 0); */
        /*@ assert ceil: ceil == pack_count(cw, NB) && 0 <= ceil <= cw <= K; */
        /*@ ghost lemma_mul_monotone(ceil, K, M); */
        /*@ ghost lemma_mul_monotone(st->block_count, M, ceil); */
        /*@ assert items: st->block_count * pack_count(cw, NB) <= INT64_MAX; */
        /*@ assert out_slots: slots_at(g->slot_values, g->p->rows, g->slot_width, s->acc); */
        /*@ assert out_chunk: g->kind == OP_DX && g->p->reduce_topk != 0 &&
                              0 <= g->chunk0 <= c0 && c0 + cw <= g->chunk0 + g->slot_width; */
        /*@ ghost lemma_reduce_out(g, st->blocks, st->block_count, s->acc, c0, c0 + cw); */
        run_items(g, st->blocks, st->block_count, c0, c0 + cw, s);
        reduce_tokens(g, dx, c0, cw, s->row) /*@ ghost (T, K, dt) */;
    }
}

/* dX with reduce_topk on the caller's slot values [M * width] and threads' scratch arena (proved): each
 * thread runs reduce_chunks on its part of the arena.  slot_values NULL: MOE_ERR_OUT_OF_MEMORY with the
 * slot values' message; arena NULL: out_of_scratch (the order and messages of the former run_reduce).
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
        return out_of_scratch(p);
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
        team_scratch(&s, arena, t);
        /*@ assert ctx_fields: g->p == p && g->kind == OP_DX && g->out == dx && g->kernel == &kernel_scalar &&
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
 * would pass INT64_MAX: reported as out of memory, where the former code's size could wrap), the threads'
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
    float *arena = slot_values != NULL ? scratch_arena(threads) : NULL;
    const moe_status status = run_reduce_in(g, st, dx, width, slot_values, arena, threads);
    free(arena);
    free(slot_values);
    return status;
}

/* dX on the caller's scratch (proved; as gemm_fwd_blocked_in): run_plain without reduce_topk, else
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
    const moe_status status = setup_in(p, OP_DX, &st, offsets, blocks);
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
    gemm_ctx g = {p, OP_DX, dy, w, topk_weights, NULL, dx, st.offsets, pick_kernel(), NULL, 0, 0};
    /*@ assert g: g.p == p && g.kind == OP_DX && g.a_src == dy && g.b_src == w && g.topk_weights == topk_weights &&
                  g.out == dx && g.offsets == offsets && g.kernel == &kernel_scalar && g.slot_values == \null &&
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
        return run_plain(&g, &st, p->K);
    }
    /*@ assert reduce_apart: \separated((char *)dx + (0 .. byte_offset(p->num_tokens * p->K, p->dtype) - 1), &g, p,
          &st, blocks + (0 .. st.block_count - 1), p->gather_indices + (0 .. p->rows - 1),
          offsets + (0 .. p->num_experts)); */
    return run_reduce(&g, &st, dx);
}

/* The allocating shell (not proved): setup_alloc, gemm_dx_blocked_in, setup_free. */
moe_status moe_ref_gemm_dx_blocked(const moe_gemm_problem *p, const void *dy, const void *w,
                                   const void *topk_weights, void *dx)
{
    int64_t *offsets;
    a_block *blocks;
    setup_alloc(p, OP_DX, &offsets, &blocks);
    const moe_status status = gemm_dx_blocked_in(p, dy, w, topk_weights, dx, offsets, blocks);
    setup_free(offsets, blocks);
    return status;
}

/* The topk-weight gradient of an expert-order row block: for each row, acc += dy[yrow(r)][n] * y_n in
 * ascending n, where the y_n of an NB-column chunk are the fwd tile's accumulators (the same sum,
 * from +0.0f over ascending c, as gemm_naive.c's y_value).  The chunks run in ascending order inside
 * one item, so each row's acc is one sequential sum. */
/* Frama-C/WP proves the indices and the writes (RTE, d_topk_weights' bytes only), not the values.  The
 * column chunks step j0 += nj (nj = NB but for the last chunk: the same j0 as j0 += NB, without its
 * overflow past N). */
/*@ // The topk-weight gradient's tensors: dy [M][N] readable, d_topk_weights [M] (dw_dtype) writable and
    // apart from the context, the block, the problem and the gather indices.
    predicate ctx_topk_ok{L}(gemm_ctx *g, a_block *ab) =
      g->kind == OP_TOPK &&
      tensor_readable((char *)g->dy, g->p->rows * g->p->N, g->p->dtype) &&
      tensor_writable((char *)g->out, g->p->rows, g->p->dw_dtype) &&
      \separated((char *)g->out + (0 .. byte_offset(g->p->rows, g->p->dw_dtype) - 1), g, ab, g->p,
                 g->p->gather_indices + (0 .. g->p->rows - 1));
*/
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
        compute_tile(g, ab, j0, nj, p->K, s);
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

/*@ // The topk-weight gradient on a validated problem: its tensors as src/gemm_api.c checks them, the kernel.
    predicate topk_ctx_ok{L}(gemm_ctx *g) =
      \valid_read(g) && gemm_problem_ok(g->p) && g->kind == OP_TOPK &&
      gemm_topk_grad_tensors_ok(g->p, (char *)g->a_src, (char *)g->b_src, (char *)g->dy, (char *)g->out) &&
      g->kernel == &kernel_scalar;
    // d_topk_weights apart from the context, the problem, the setup, the blocks and the gather indices.
    predicate topk_apart{L}(gemm_ctx *g, gemm_setup *st) =
      \separated((char *)g->out + (0 .. byte_offset(g->p->rows, g->p->dw_dtype) - 1), g, g->p, st,
                 st->blocks + (0 .. st->block_count - 1), g->p->gather_indices + (0 .. g->p->rows - 1));
*/

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
        return out_of_scratch(g->p);
    MOE_OMP(omp parallel num_threads(threads))
    {
        thread_scratch s;
        team_scratch(&s, arena, team_member(threads));
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

/* The allocating shell of run_topk_in (not proved, as run_plain); its contract is stated. */
/*@ requires ctx: topk_ctx_ok(g);
    requires setup: \valid_read(st) && blocks_at(g->p, OP_TOPK, st->blocks, st->block_count);
    requires apart: topk_apart(g, st);
    terminates \true;
    assigns ((char *)g->out)[0 .. byte_offset(g->p->rows, g->p->dw_dtype) - 1], moe_error_model, __fc_heap_status;
    ensures status: \result == MOE_OK || \result == MOE_ERR_OUT_OF_MEMORY; */
static moe_status run_topk(const gemm_ctx *g, const gemm_setup *st)
{
    const int threads = team_size();
    float *arena = scratch_arena(threads);
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
    const moe_status status = setup_in(p, OP_TOPK, &st, offsets, blocks);
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
    gemm_ctx g = {p, OP_TOPK, x, w, NULL, dy, d_topk_weights, st.offsets, pick_kernel(), NULL, 0, 0};
    /*@ assert g: g.p == p && g.kind == OP_TOPK && g.a_src == x && g.b_src == w && g.dy == dy &&
                  g.out == d_topk_weights && g.kernel == &kernel_scalar; */
    /*@ assert kept_g: gemm_problem_ok(g.p) &&
          gemm_topk_grad_tensors_ok(g.p, (char *)g.a_src, (char *)g.b_src, (char *)g.dy, (char *)g.out); */
    /*@ assert ctx: topk_ctx_ok(&g); */
    /*@ assert apart: \separated((char *)d_topk_weights + (0 .. byte_offset(p->rows, p->dw_dtype) - 1), &g, p, &st,
          blocks + (0 .. st.block_count - 1), p->gather_indices + (0 .. p->rows - 1)); */
    return run_topk(&g, &st);
}

/* The allocating shell (not proved): setup_alloc, gemm_topk_blocked_in, setup_free. */
moe_status moe_ref_gemm_topk_weights_grad_blocked(const moe_gemm_problem *p, const void *x, const void *w,
                                                  const void *dy, void *d_topk_weights)
{
    int64_t *offsets;
    a_block *blocks;
    setup_alloc(p, OP_TOPK, &offsets, &blocks);
    const moe_status status = gemm_topk_blocked_in(p, x, w, dy, d_topk_weights, offsets, blocks);
    setup_free(offsets, blocks);
    return status;
}
