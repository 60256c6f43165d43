/* The FP8 grouped GEMM's blocked twin, fwd, dX and dW: what the reference backend runs.  ref/gemm_fp8.c is the
 * readable definition (specs/FP8.md section 2); this file performs the same float32 operations on every output
 * element in the same order, so the two agree bit for bit (tests/test_gemm_fp8, tests/test_gemm_fp8_dw), and
 * only the order in which elements are computed differs:
 *   - a block is FP8_ROWS lines of the first operand (X or dY rows, dY columns for dW) against FP8_COLS lines of
 *     the second (W rows or columns, X columns for dW);
 *   - each 128-element tile of the reduction is decoded once per block into float32 panels (exact: every FP8
 *     value is a float32), its partial sums accumulated from +0.0f in ascending reduction order (each product of
 *     two FP8 values is exact in float32), then promoted acc = acc + part * (s_a * s_b), tiles in ascending
 *     order, as promoted_dot promotes.
 * Each OpenMP thread owns whole output rows (fwd, dX: rows; reduce_topk: tokens; dW: rows (e, n)), so the result
 * does not depend on the thread count. */
#include "fp8_ref.h"
#include "moe_ref.h"

#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#define FP8_OMP(directive) _Pragma(#directive)
#else
#define FP8_OMP(directive)
#endif

enum { FP8_ROWS = 16, FP8_COLS = 128, FP8_CHUNK = 16 };

/* The lines of one side of a block: line i's element l is code first[i] + l * step, and its tile t's scale is
 * scale first_scale[i] + t * scale_step. */
typedef struct fp8_lines {
    moe_dtype dtype;
    const uint8_t *codes;
    const void *scales;
    int64_t step, scale_step;
    int count; /* lines in use: <= FP8_ROWS (first operand), <= FP8_COLS (second) */
    int64_t first[FP8_COLS], first_scale[FP8_COLS];
} fp8_lines;

/* One thread's block: the decoded tile panels, the tile's partial sums and the promoted accumulators. */
typedef struct fp8_block {
    float decode_a[256], decode_b[256];       /* code -> value of each side's dtype */
    float a[FP8_ROWS][MOE_FP8_TILE];          /* a[i][l]: line i's element begin + l */
    float b[MOE_FP8_TILE][FP8_COLS];          /* b[l][j]: line j's element begin + l; 0 past count */
    float part[FP8_COLS];
    float acc[FP8_ROWS][FP8_COLS];
} fp8_block;

static void decode_table(moe_dtype dtype, float table[256])
{
    for (int code = 0; code < 256; code++)
        table[code] = moe_fp8_load(dtype, &(const uint8_t){(uint8_t)code}, 0);
}

/* blk->acc[i][j] = the promoted sum of line i of a against line j of b over len elements (promoted_dot's value). */
static void promoted_block(moe_fp8_scale_format format, const fp8_lines *a, const fp8_lines *b, int64_t len,
                           fp8_block *blk)
{
    memset(blk->acc, 0, sizeof blk->acc);
    memset(blk->b, 0, sizeof blk->b);
    const int64_t tiles = moe_fp8_tiles(len);
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t begin = t * MOE_FP8_TILE;
        const int n = (int)(len - begin < MOE_FP8_TILE ? len - begin : MOE_FP8_TILE);
        for (int i = 0; i < a->count; i++) {
            const uint8_t *codes = a->codes + a->first[i] + begin * a->step;
            for (int l = 0; l < n; l++)
                blk->a[i][l] = blk->decode_a[codes[l * a->step]];
        }
        for (int j = 0; j < b->count; j++) {
            const uint8_t *codes = b->codes + b->first[j] + begin * b->step;
            for (int l = 0; l < n; l++)
                blk->b[l][j] = blk->decode_b[codes[l * b->step]];
        }
        float scale_b[FP8_COLS];
        for (int j = 0; j < b->count; j++)
            scale_b[j] = moe_fp8_scale(format, b->scales, b->first_scale[j] + t * b->scale_step);
        for (int i = 0; i < a->count; i++) {
            float *restrict part = blk->part;
            for (int j0 = 0; j0 < b->count; j0 += FP8_CHUNK) { /* b is zero past count */
                float sum[FP8_CHUNK] = {0.0f};
                for (int l = 0; l < n; l++) {
                    const float value = blk->a[i][l];
                    const float *restrict row = blk->b[l] + j0;
                    for (int j = 0; j < FP8_CHUNK; j++)
                        sum[j] += value * row[j];
                }
                memcpy(part + j0, sum, sizeof sum);
            }
            const float scale_a = moe_fp8_scale(format, a->scales, a->first_scale[i] + t * a->scale_step);
            float *restrict acc = blk->acc[i];
            for (int j = 0; j < b->count; j++)
                acc[j] = acc[j] + part[j] * (scale_a * scale_b[j]);
        }
    }
}

/* The expert-order rows of each expert in blocks of FP8_ROWS: block q is rows [start, start + count) of expert. */
typedef struct row_block {
    int64_t expert, start, count;
} row_block;

/* The row blocks of every expert (*count of them), or NULL (out of memory, reported). */
static row_block *row_blocks(const moe_gemm_problem *g, const int64_t *offsets, int64_t *count)
{
    int64_t n = 0;
    for (int64_t e = 0; e < g->num_experts; e++)
        n += (offsets[e + 1] - offsets[e] + FP8_ROWS - 1) / FP8_ROWS;
    row_block *blocks = malloc((size_t)(n > 0 ? n : 1) * sizeof *blocks);
    if (blocks == NULL) {
        moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: no memory for %lld row blocks", g->op, (long long)n);
        return NULL;
    }
    n = 0;
    for (int64_t e = 0; e < g->num_experts; e++)
        for (int64_t r = offsets[e]; r < offsets[e + 1]; r += FP8_ROWS)
            blocks[n++] = (row_block){e, r, offsets[e + 1] - r < FP8_ROWS ? offsets[e + 1] - r : FP8_ROWS};
    *count = n;
    return blocks;
}

/* The first operand's lines of a row block: fwd X rows xrow(r), dX dY rows yrow(r), each `len` codes with
 * tiles(len) scales per row. */
static void operand_rows(const moe_fp8_problem *p, int dx, const moe_fp8_tensor *a, const row_block *rb,
                         fp8_lines *lines)
{
    const moe_gemm_problem *g = &p->g;
    const int64_t len = dx ? g->N : g->K, tiles = moe_fp8_tiles(len);
    *lines = (fp8_lines){.dtype = a->dtype, .codes = a->data, .scales = a->scales, .step = 1, .scale_step = 1,
                         .count = (int)rb->count};
    for (int i = 0; i < lines->count; i++) {
        const int64_t r = rb->start + i, slot = moe_ref_fp8_slot_of_row(g, r);
        const int64_t row = dx ? (g->permute_y ? slot : r) : (g->permute_x ? slot / g->topk : r);
        lines->first[i] = row * len;
        lines->first_scale[i] = row * tiles;
    }
}

/* The second operand's lines for output columns [c0, c0 + count) of expert e: fwd W rows (e, n) over K, dX W
 * columns (e, ., c) over N, or with w_transposed W^T rows (e, c) over N. */
static void weight_lines(const moe_fp8_problem *p, int dx, const moe_fp8_tensor *w, int64_t e, int64_t c0, int count,
                         fp8_lines *lines)
{
    const int64_t N = p->g.N, K = p->g.K, tiles_n = moe_fp8_tiles(N), tiles_k = moe_fp8_tiles(K);
    const int columns = dx && !p->w_transposed; /* W's column (e, ., c): strided */
    *lines = (fp8_lines){.dtype = w->dtype, .codes = w->data, .scales = w->scales, .step = columns ? K : 1,
                         .scale_step = columns ? tiles_k : 1, .count = count};
    for (int j = 0; j < count; j++) {
        const int64_t c = c0 + j;
        if (columns) {
            lines->first[j] = e * N * K + c;
            lines->first_scale[j] = e * tiles_n * tiles_k + c / MOE_FP8_TILE;
        } else if (dx) { /* W^T row (e, c) over N */
            lines->first[j] = (e * K + c) * N;
            lines->first_scale[j] = (e * tiles_k + c / MOE_FP8_TILE) * tiles_n;
        } else { /* W row (e, c) over K */
            lines->first[j] = (e * N + c) * K;
            lines->first_scale[j] = (e * tiles_n + c / MOE_FP8_TILE) * tiles_k;
        }
    }
}

/* fwd (dx 0) or dX (dx 1) over the row blocks.  Without reduce_topk (values NULL) each element, after its topk
 * weight, is stored as gemm_fp8.c's gemm_rows stores it.  With reduce_topk it goes, weighted, to values[r][c - c0]
 * for output columns [c0, c0 + FP8_COLS) only. */
static void gemm_blocks(const moe_fp8_problem *p, int dx, const row_block *blocks, int64_t num_blocks,
                        const moe_fp8_tensor *a, const moe_fp8_tensor *w, const float *topk_weights, void *out,
                        float *values, int64_t c0)
{
    const moe_gemm_problem *g = &p->g;
    const int64_t len = dx ? g->N : g->K, cols = dx ? g->K : g->N;
FP8_OMP(omp parallel for schedule(dynamic))
    for (int64_t q = 0; q < num_blocks; q++) {
        fp8_block blk;
        fp8_lines rows, weights;
        decode_table(a->dtype, blk.decode_a);
        decode_table(w->dtype, blk.decode_b);
        operand_rows(p, dx, a, &blocks[q], &rows);
        const int64_t col_begin = values != NULL ? c0 : 0;
        const int64_t col_end = values != NULL ? (c0 + FP8_COLS < cols ? c0 + FP8_COLS : cols) : cols;
        for (int64_t cb = col_begin; cb < col_end; cb += FP8_COLS) {
            const int count = (int)(col_end - cb < FP8_COLS ? col_end - cb : FP8_COLS);
            weight_lines(p, dx, w, blocks[q].expert, cb, count, &weights);
            promoted_block(p->scale_format, &rows, &weights, len, &blk);
            for (int i = 0; i < rows.count; i++) {
                const int64_t r = blocks[q].start + i, slot = moe_ref_fp8_slot_of_row(g, r);
                const int64_t out_row = dx ? (g->permute_x ? slot : r) : (g->permute_y ? slot : r);
                for (int j = 0; j < count; j++) {
                    float v = blk.acc[i][j];
                    if (topk_weights != NULL)
                        v = topk_weights[slot] * v;
                    if (values != NULL)
                        values[r * FP8_COLS + j] = v;
                    else
                        moe_ref_fp8_store_element(g, out, out_row * cols + cb + j, v);
                }
            }
        }
    }
}

moe_status moe_ref_gemm_fp8_fwd_blocked(const moe_fp8_problem *p, const moe_fp8_tensor *x, const moe_fp8_tensor *w,
                                        const float *topk_weights, void *y)
{
    int64_t *offsets = moe_ref_fp8_expert_offsets(&p->g), num_blocks = 0;
    row_block *blocks = offsets != NULL ? row_blocks(&p->g, offsets, &num_blocks) : NULL;
    if (blocks != NULL)
        gemm_blocks(p, 0, blocks, num_blocks, x, w, topk_weights, y, NULL, 0);
    free(blocks);
    free(offsets);
    return blocks != NULL ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
}

/* dX with reduce_topk, FP8_COLS output columns at a time: the weighted elements of every expert-order row into
 * values [M][FP8_COLS], then dx[t][c] = sum over j of values[row of slot t*k + j], ascending j, in float32 from
 * +0.0f, one rounding (gemm_fp8.c's dx_reduce). */
static moe_status dx_reduce_blocked(const moe_fp8_problem *p, const row_block *blocks, int64_t num_blocks,
                                    const moe_fp8_tensor *dy, const moe_fp8_tensor *w, const float *topk_weights,
                                    void *dx)
{
    const moe_gemm_problem *g = &p->g;
    const int64_t M = g->rows, T = g->num_tokens, k = g->topk, K = g->K;
    int64_t *row_of_slot = malloc((size_t)(M > 0 ? M : 1) * sizeof *row_of_slot);
    float *values = malloc((size_t)(M > 0 ? M : 1) * FP8_COLS * sizeof *values);
    if (row_of_slot == NULL || values == NULL) {
        free(row_of_slot);
        free(values);
        return moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: no memory for the %lld slot rows' partial results", g->op,
                        (long long)M);
    }
    for (int64_t r = 0; r < M; r++)
        row_of_slot[g->gather_indices[r]] = r;
    for (int64_t c0 = 0; c0 < K; c0 += FP8_COLS) {
        const int64_t count = K - c0 < FP8_COLS ? K - c0 : FP8_COLS;
        gemm_blocks(p, 1, blocks, num_blocks, dy, w, topk_weights, dx, values, c0);
FP8_OMP(omp parallel for schedule(static))
        for (int64_t t = 0; t < T; t++)
            for (int64_t j = 0; j < count; j++) {
                float sum = 0.0f;
                for (int64_t s = t * k; s < t * k + k; s++)
                    sum += values[row_of_slot[s] * FP8_COLS + j];
                moe_ref_fp8_store_element(g, dx, t * K + c0 + j, sum);
            }
    }
    free(row_of_slot);
    free(values);
    return MOE_OK;
}

moe_status moe_ref_gemm_fp8_dx_blocked(const moe_fp8_problem *p, const moe_fp8_tensor *dy, const moe_fp8_tensor *w,
                                       const float *topk_weights, void *dx)
{
    int64_t *offsets = moe_ref_fp8_expert_offsets(&p->g), num_blocks = 0;
    row_block *blocks = offsets != NULL ? row_blocks(&p->g, offsets, &num_blocks) : NULL;
    moe_status status = blocks != NULL ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
    if (blocks != NULL && p->g.reduce_topk)
        status = dx_reduce_blocked(p, blocks, num_blocks, dy, w, topk_weights, dx);
    else if (blocks != NULL)
        gemm_blocks(p, 1, blocks, num_blocks, dy, w, topk_weights, dx, NULL, 0);
    free(blocks);
    free(offsets);
    return status;
}

/* dW: output rows (e, n) in blocks of FP8_ROWS within an expert; line i of the first side is dY column n over
 * the expert's rows (step N), line j of the second X column c (step K); the expert's tiles use scale rows
 * moe_fp8_dw_scale_row(first, e) on (gemm_fp8.c's dw_element). */
moe_status moe_ref_gemm_fp8_dw_blocked(const moe_fp8_problem *p, const moe_fp8_tensor *x, const moe_fp8_tensor *dy,
                                       void *dw)
{
    const moe_gemm_problem *g = &p->g;
    int64_t *offsets = moe_ref_fp8_expert_offsets(g);
    if (offsets == NULL)
        return MOE_ERR_OUT_OF_MEMORY;
    const int64_t N = g->N, K = g->K, n_blocks = (N + FP8_ROWS - 1) / FP8_ROWS;
FP8_OMP(omp parallel for schedule(dynamic))
    for (int64_t q = 0; q < g->num_experts * n_blocks; q++) {
        const int64_t e = q / n_blocks, n0 = q % n_blocks * FP8_ROWS, first = offsets[e];
        const int64_t m = offsets[e + 1] - first, scale_row = moe_fp8_dw_scale_row(first, e);
        fp8_block blk;
        fp8_lines dy_cols = {.dtype = dy->dtype, .codes = dy->data, .scales = dy->scales, .step = N,
                             .scale_step = N, .count = (int)(N - n0 < FP8_ROWS ? N - n0 : FP8_ROWS)};
        fp8_lines x_cols = {.dtype = x->dtype, .codes = x->data, .scales = x->scales, .step = K, .scale_step = K};
        decode_table(dy->dtype, blk.decode_a);
        decode_table(x->dtype, blk.decode_b);
        for (int i = 0; i < dy_cols.count; i++) {
            dy_cols.first[i] = first * N + n0 + i;
            dy_cols.first_scale[i] = scale_row * N + n0 + i;
        }
        for (int64_t c0 = 0; c0 < K; c0 += FP8_COLS) {
            x_cols.count = (int)(K - c0 < FP8_COLS ? K - c0 : FP8_COLS);
            for (int j = 0; j < x_cols.count; j++) {
                x_cols.first[j] = first * K + c0 + j;
                x_cols.first_scale[j] = scale_row * K + c0 + j;
            }
            promoted_block(p->scale_format, &dy_cols, &x_cols, m, &blk);
            for (int i = 0; i < dy_cols.count; i++)
                for (int j = 0; j < x_cols.count; j++)
                    moe_ref_fp8_store_element(g, dw, (e * N + n0 + i) * K + c0 + j, blk.acc[i][j]);
        }
    }
    free(offsets);
    return MOE_OK;
}
