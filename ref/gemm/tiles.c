/*
 * ref/gemm/tiles.c: one work item of the blocked grouped GEMM, an output tile: the packing of its A rows
 * and B columns per reduction block, the micro-kernel calls that add each block into the float32
 * accumulator tile, the per-element tail that stores the tile, and the worksharing loop over the items.
 * These are the hot loops: they stay in one translation unit so that the compiler inlines the packs and
 * the store into the tile loops (gemm_internal.h has the design).
 */
#include "gemm_internal.h"
#include "convert.h"

#if defined(__SSE2__) && !defined(MOE_REF_NO_VECTOR)
#include <emmintrin.h>
#include <xmmintrin.h>
#endif

/* A hint to fetch the cache line at addr (the packs read W and X rows a few steps ahead). */
#if (defined(__GNUC__) || defined(__clang__)) && !defined(__FRAMAC__)
#define MOE_PREFETCH(addr) __builtin_prefetch(addr)
#else
#define MOE_PREFETCH(addr) ((void)(addr))
#endif

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

/* (contract on the prototype in gemm_internal.h) */
void gemm_compute_tile(const gemm_ctx *g, const a_block *ab, int64_t j0, int64_t nj, int64_t L, thread_scratch *s)
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
                /*@ calls gemm_kernel_scalar; */
                g->kernel(kb, p0 == 0, rows, s->a + gi * group_len, s->b + h * panel_len,
                          s->acc + gi * MR * NB + h * NR, NB);
            }
        }
    }
}

/* (contract on the prototype in gemm_internal.h) */
void gemm_run_items(const gemm_ctx *g, const a_block *blocks, int64_t block_count, int64_t jlo, int64_t jhi,
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
        gemm_compute_tile(g, ab, j0, nj, L, s);
        store_tile(g, ab, j0, nj, s->acc);
    }
}
