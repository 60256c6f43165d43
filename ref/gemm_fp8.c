/* The FP8 grouped GEMM, fwd, dX and dW: the readable definition of specs/FP8.md section 2, one output element
 * at a time; each OpenMP thread owns whole output rows (fwd, dX: rows; reduce_topk: tokens; dW: rows (e, n)),
 * so the result does not depend on the thread count. */
#include "fp8_ref.h"
#include "moe_ref.h"

#include <stdlib.h>

#ifdef _OPENMP
#define FP8_OMP(directive) _Pragma(#directive)
#else
#define FP8_OMP(directive)
#endif

/* One operand of a dot product: element i of the reduction is code first + i * step; its tile t = i / 128
 * has scale scale_first + t * scale_step. */
typedef struct fp8_stream {
    moe_dtype dtype;
    const void *codes;
    int64_t first, step;
    const void *scales;
    int64_t scale_first, scale_step;
} fp8_stream;

#ifdef __FRAMAC__
/*@ // a stream of len elements whose codes and tile scales are readable, every index within int64
    predicate fp8_stream_ok{L}(fp8_stream *s, integer len, moe_fp8_scale_format f) =
      \valid_read(s) && 0 <= s->first && 0 <= s->step && 0 <= s->scale_first && 0 <= s->scale_step &&
      s->first + len * s->step <= INT64_MAX && s->scale_first + fp8_tiles(len) * s->scale_step <= INT64_MAX &&
      (\forall integer i; 0 <= i < len ==> \valid_read((char *)s->codes + (s->first + i * s->step))) &&
      (\forall integer t; 0 <= t < fp8_tiles(len) ==>
         fp8_scale_readable((char *)s->scales, s->scale_first + t * s->scale_step, f)); */
#endif

/* The promoted sum over len reduction elements (specs/FP8.md section 2): per 128-element tile, the exact
 * products a_i * b_i summed in float32 in ascending i from +0.0f; the tile's sum times (sa_t * sb_t) (both
 * products rounded to float32) added to the float32 accumulator, tiles in ascending order from +0.0f. */
/*@ requires len: 0 <= len <= INT64_MAX - 128;
    requires a: fp8_stream_ok(a, len, format);
    requires b: fp8_stream_ok(b, len, format);
    terminates \true;
    assigns \nothing; */
static float promoted_dot(moe_fp8_scale_format format, const fp8_stream *a, const fp8_stream *b, int64_t len)
{
    const int64_t tiles = moe_fp8_tiles(len);
    float acc = 0.0f;
    /*@ loop invariant bounds: 0 <= t <= tiles;
        loop assigns t, acc;
        loop variant tiles - t; */
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t begin = t * MOE_FP8_TILE;
        const int64_t end = len - begin < MOE_FP8_TILE ? len : begin + MOE_FP8_TILE;
        float part = 0.0f;
        /*@ loop invariant bounds: begin <= i <= end <= len;
            loop assigns i, part;
            loop variant end - i; */
        for (int64_t i = begin; i < end; i++) {
            /*@ ghost lemma_mul_monotone(i, len, a->step); */
            /*@ ghost lemma_mul_monotone(i, len, b->step); */
            const int64_t ia = a->first + i * a->step, ib = b->first + i * b->step;
            part += moe_fp8_load(a->dtype, a->codes, ia) * moe_fp8_load(b->dtype, b->codes, ib);
        }
        /*@ ghost lemma_mul_monotone(t, tiles, a->scale_step); */
        /*@ ghost lemma_mul_monotone(t, tiles, b->scale_step); */
        const int64_t sa = a->scale_first + t * a->scale_step, sb = b->scale_first + t * b->scale_step;
        const float scale = moe_fp8_scale(format, a->scales, sa) * moe_fp8_scale(format, b->scales, sb);
        acc += part * scale;
    }
    return acc;
}

void moe_ref_fp8_store_element(const moe_gemm_problem *g, void *out, int64_t index, float value)
{
    if (g->accumulate)
        value = moe_ref_load(g->dtype, out, index) + value;
    moe_ref_store(g->dtype, out, index, value);
}

/* The forward's element (r, n) of expert e: X row xr against W row (e, n), over K. */
static float fwd_element(const moe_fp8_problem *p, const moe_fp8_tensor *x, const moe_fp8_tensor *w, int64_t e,
                         int64_t xr, int64_t n)
{
    const int64_t N = p->g.N, K = p->g.K, tiles_k = moe_fp8_tiles(K), tiles_n = moe_fp8_tiles(N);
    const fp8_stream a = {x->dtype, x->data, xr * K, 1, x->scales, xr * tiles_k, 1};
    const fp8_stream b = {w->dtype, w->data, (e * N + n) * K, 1, w->scales,
                          (e * tiles_n + n / MOE_FP8_TILE) * tiles_k, 1};
    return promoted_dot(p->scale_format, &a, &b, K);
}

/* dX's element (r, c) of expert e: dY row dyr against W column (e, ., c), over N; with w_transposed, the same
 * elements and scales as W^T's row (e, c). */
static float dx_element(const moe_fp8_problem *p, const moe_fp8_tensor *dy, const moe_fp8_tensor *w, int64_t e,
                        int64_t dyr, int64_t c)
{
    const int64_t N = p->g.N, K = p->g.K, tiles_k = moe_fp8_tiles(K), tiles_n = moe_fp8_tiles(N);
    const fp8_stream a = {dy->dtype, dy->data, dyr * N, 1, dy->scales, dyr * tiles_n, 1};
    const fp8_stream b = p->w_transposed
        ? (fp8_stream){w->dtype, w->data, (e * K + c) * N, 1, w->scales, (e * tiles_k + c / MOE_FP8_TILE) * tiles_n, 1}
        : (fp8_stream){w->dtype, w->data, e * N * K + c, K, w->scales, e * tiles_n * tiles_k + c / MOE_FP8_TILE,
                       tiles_k};
    return promoted_dot(p->scale_format, &a, &b, N);
}

int64_t *moe_ref_fp8_expert_offsets(const moe_gemm_problem *g)
{
    int64_t *offsets = malloc((size_t)(g->num_experts + 1) * sizeof *offsets);
    if (offsets == NULL) {
        moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: no memory for %lld expert offsets", g->op,
                 (long long)g->num_experts + 1);
        return NULL;
    }
    moe_ref_expert_offsets(g->num_experts, g->m_sizes, offsets);
    return offsets;
}

/* fwd (dx 0) or dX without reduce_topk (dx 1), one output row per expert-order row r: the forward reads X row
 * xrow(r) and writes Y row yrow(r); dX reads dY row yrow(r) and writes dX row (permute_x ? g_r : r). */
static void gemm_rows(const moe_fp8_problem *p, const int64_t *offsets, int dx, const moe_fp8_tensor *a,
                      const moe_fp8_tensor *w, const float *topk_weights, void *out)
{
    const moe_gemm_problem *g = &p->g;
    const int64_t M = g->rows, cols = dx ? g->K : g->N;
FP8_OMP(omp parallel for schedule(static))
    for (int64_t r = 0; r < M; r++) {
        const int64_t e = moe_ref_expert_of_row(g->num_experts, offsets, r);
        const int64_t slot = moe_ref_fp8_slot_of_row(g, r);
        const int64_t y_row = g->permute_y ? slot : r;
        const int64_t a_row = dx ? y_row : g->permute_x ? slot / g->topk : r;
        const int64_t out_row = dx ? (g->permute_x ? slot : r) : y_row;
        for (int64_t c = 0; c < cols; c++) {
            float acc = dx ? dx_element(p, a, w, e, a_row, c) : fwd_element(p, a, w, e, a_row, c);
            if (topk_weights != NULL)
                acc = topk_weights[slot] * acc;
            moe_ref_fp8_store_element(g, out, out_row * cols + c, acc);
        }
    }
}

moe_status moe_ref_gemm_fp8_fwd(const moe_fp8_problem *p, const moe_fp8_tensor *x, const moe_fp8_tensor *w,
                                const float *topk_weights, void *y)
{
    int64_t *offsets = moe_ref_fp8_expert_offsets(&p->g);
    if (offsets == NULL)
        return MOE_ERR_OUT_OF_MEMORY;
    gemm_rows(p, offsets, 0, x, w, topk_weights, y);
    free(offsets);
    return MOE_OK;
}

/* dX with reduce_topk: dx[t][c] = sum_j (weight * element) over the slots s = t*k + j, ascending j, in float32
 * from +0.0f, then one rounding. */
static moe_status dx_reduce(const moe_fp8_problem *p, const int64_t *offsets, const moe_fp8_tensor *dy,
                            const moe_fp8_tensor *w, const float *topk_weights, void *dx)
{
    const moe_gemm_problem *g = &p->g;
    const int64_t M = g->rows, T = g->num_tokens, k = g->topk, K = g->K;
    int64_t *row_of_slot = malloc((size_t)(M > 0 ? M : 1) * sizeof *row_of_slot);
    if (row_of_slot == NULL)
        return moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: no memory for %lld slot rows", g->op, (long long)M);
    for (int64_t r = 0; r < M; r++)
        row_of_slot[g->gather_indices[r]] = r;
FP8_OMP(omp parallel for schedule(static))
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = 0; c < K; c++) {
            float sum = 0.0f;
            for (int64_t j = 0; j < k; j++) {
                const int64_t s = t * k + j, r = row_of_slot[s];
                const int64_t e = moe_ref_expert_of_row(g->num_experts, offsets, r);
                float acc = dx_element(p, dy, w, e, g->permute_y ? s : r, c);
                if (topk_weights != NULL)
                    acc = topk_weights[s] * acc;
                sum += acc;
            }
            moe_ref_fp8_store_element(g, dx, t * K + c, sum);
        }
    free(row_of_slot);
    return MOE_OK;
}

moe_status moe_ref_gemm_fp8_dx(const moe_fp8_problem *p, const moe_fp8_tensor *dy, const moe_fp8_tensor *w,
                               const float *topk_weights, void *dx)
{
    const moe_gemm_problem *g = &p->g;
    int64_t *offsets = moe_ref_fp8_expert_offsets(g);
    if (offsets == NULL)
        return MOE_ERR_OUT_OF_MEMORY;
    moe_status status = MOE_OK;
    if (g->reduce_topk)
        status = dx_reduce(p, offsets, dy, w, topk_weights, dx);
    else
        gemm_rows(p, offsets, 1, dy, w, topk_weights, dx);
    free(offsets);
    return status;
}

/* dW's element (e, n, c): dY column n against X column c over the rows of expert e (first row `first`, m rows),
 * both walked with step N (dY) and K (X); the expert's tiles use scale rows moe_fp8_dw_scale_row(first, e) onward,
 * one per tile. */
static float dw_element(const moe_fp8_problem *p, const moe_fp8_tensor *x, const moe_fp8_tensor *dy, int64_t e,
                        int64_t first, int64_t m, int64_t n, int64_t c)
{
    const int64_t N = p->g.N, K = p->g.K, scale_row = moe_fp8_dw_scale_row(first, e);
    const fp8_stream a = {dy->dtype, dy->data, first * N + n, N, dy->scales, scale_row * N + n, N};
    const fp8_stream b = {x->dtype, x->data, first * K + c, K, x->scales, scale_row * K + c, K};
    return promoted_dot(p->scale_format, &a, &b, m);
}

moe_status moe_ref_gemm_fp8_dw(const moe_fp8_problem *p, const moe_fp8_tensor *x, const moe_fp8_tensor *dy,
                               void *dw)
{
    const moe_gemm_problem *g = &p->g;
    int64_t *offsets = moe_ref_fp8_expert_offsets(g);
    if (offsets == NULL)
        return MOE_ERR_OUT_OF_MEMORY;
    const int64_t N = g->N, K = g->K, rows = g->num_experts * N;
FP8_OMP(omp parallel for schedule(static))
    for (int64_t en = 0; en < rows; en++) {
        const int64_t e = en / N, n = en % N, first = offsets[e], m = offsets[e + 1] - first;
        for (int64_t c = 0; c < K; c++)
            moe_ref_fp8_store_element(g, dw, en * K + c, dw_element(p, x, dy, e, first, m, n, c));
    }
    free(offsets);
    return MOE_OK;
}
