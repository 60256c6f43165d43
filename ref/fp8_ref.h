/*
 * The FP8 reference (specs/FP8.md): code and scale access, the scale check, the fwd, dX and dW reference
 * (ref/gemm_fp8.c) and the quantizers (ref/fp8_quantize.c) that src/gemm_fp8_api.c and
 * src/fp8_quantize_api.c call after validating every argument.
 */
#ifndef LIBMOE_FP8_REF_H
#define LIBMOE_FP8_REF_H

#include "moe_backend.h"
#include "moe_ref.h" /* gemm_problem_ok, gemm_slot (Frama-C) */

#include <string.h>

#ifdef __FRAMAC__
/*@ // scale i of a scale array of format f is readable: a float32 (4 bytes) or a UE8M0 byte
    predicate fp8_scale_readable(char *s, integer i, moe_fp8_scale_format f) =
      f == MOE_FP8_SCALE_UE8M0 ? \valid_read(s + i) : \valid_read(s + (4 * i .. 4 * i + 3));
    logic integer fp8_tiles(integer n) = (n + 127) / 128; */
#endif

/* The number of 128-element tiles covering n >= 0 elements. */
/*@ requires n: 0 <= n;
    terminates \true;
    assigns \nothing;
    ensures tiles: \result == (n + 127) / 128; */
static inline int64_t moe_fp8_tiles(int64_t n) { return n / MOE_FP8_TILE + (n % MOE_FP8_TILE != 0); }

/* dW's scale row (moe_gemm_fp8_dw's operands, specs/FP8.md): the 128 x 1 tiles restart at each expert's first
 * row, so expert e's tile beginning at expert row r0 has its scales in row r0 / 128 + e. */
/*@ requires rows: 0 <= r0 && 0 <= e && r0 / 128 + e <= INT64_MAX;
    terminates \true;
    assigns \nothing;
    ensures row: \result == r0 / 128 + e; */
static inline int64_t moe_fp8_dw_scale_row(int64_t r0, int64_t e) { return r0 / MOE_FP8_TILE + e; }

/* The value of code i of an FP8 tensor of dtype MOE_E4M3 or MOE_E5M2 (exact). */
/* Contract trusted, not proved (as moe_ref_load's): WP's typed model cannot follow the void * -> uint8_t *
 * cast; callers prove the byte readable. */
/*@ requires code: \valid_read((char *)codes + i);
    terminates \true;
    assigns \nothing; */
static inline float moe_fp8_load(moe_dtype dtype, const void *codes, int64_t i)
{
    const uint8_t code = ((const uint8_t *)codes)[i];
    return dtype == MOE_E5M2 ? moe_e5m2_to_f32(code) : moe_e4m3_to_f32(code);
}

/* Scale i of a scale array of the given format.  UE8M0's b gives 2^(b - 127) exactly (the float32 with
 * exponent field b for b >= 1; 2^-127, a subnormal, for b = 0); b = 255 (refused by the entry points) would
 * give Inf.  Contract trusted, not proved (the casts and the memcpy, as float_bits'); callers prove the bytes
 * readable. */
/*@ requires scale: fp8_scale_readable((char *)scales, i, format);
    terminates \true;
    assigns \nothing; */
static inline float moe_fp8_scale(moe_fp8_scale_format format, const void *scales, int64_t i)
{
    if (format == MOE_FP8_SCALE_UE8M0) {
        const uint32_t b = ((const uint8_t *)scales)[i];
        const uint32_t bits = b != 0 ? b << 23 : 0x00400000u;
        float value;
        memcpy(&value, &bits, sizeof value);
        return value;
    }
    return ((const float *)scales)[i];
}

/* The slot of expert-order row r of g (r itself when no gather indices are given): the FP8 files' one copy of
 * gemm_naive_internal.h's and gemm/gemm_internal.h's slot_of_row, whose contracts the proofs of those files use. */
/*@ requires problem: gemm_problem_ok(g);
    requires row: 0 <= r < g->rows;
    terminates \true;
    assigns \nothing;
    ensures slot: \result == gemm_slot(g, r); */
static inline int64_t moe_ref_fp8_slot_of_row(const moe_gemm_problem *g, int64_t r)
{
    return g->gather_indices != NULL ? g->gather_indices[r] : r;
}

/* Checks count scales: float32 finite and > 0, UE8M0 b != 255.  name and the per-row count `per_row`
 * (the scales' innermost extent) make the message: "%s: name[i / per_row][i % per_row] = v, expected ...".
 * MOE_ERR_INVALID_VALUE for the first bad scale. */
moe_status moe_ref_fp8_check_scales(const char *op, const char *name, moe_fp8_scale_format format,
                                    const void *scales, int64_t count, int64_t per_row);

/* Checks the scales [moe_fp8_column_scale_rows(M, E)][cols] of moe_gemm_fp8_dw's operand `name` in the rows its
 * tiles use (m_sizes [E], the routing's, summing to M), as moe_ref_fp8_check_scales checks (its message, the
 * index [row][column]); the rows no tile uses are not read. */
moe_status moe_ref_fp8_check_column_scales(const char *op, const char *name, moe_fp8_scale_format format,
                                           const void *scales, int64_t num_experts, const int64_t *m_sizes,
                                           int64_t cols);

/* Stores output element `index` of a GEMM: value, plus the old element under g->accumulate, rounded once to
 * g->dtype (the topk weight, when there is one, is already in value). */
void moe_ref_fp8_store_element(const moe_gemm_problem *g, void *out, int64_t index, float value);

/* The expert offsets [E + 1] of the problem's m_sizes, or NULL (out of memory, reported). */
int64_t *moe_ref_fp8_expert_offsets(const moe_gemm_problem *g);

/* The FP8 grouped GEMM, the readable definition (specs/FP8.md section 2), one output element at a time. */
moe_status moe_ref_gemm_fp8_fwd(const moe_fp8_problem *p, const moe_fp8_tensor *x, const moe_fp8_tensor *w,
                                const float *topk_weights, void *y);
moe_status moe_ref_gemm_fp8_dx(const moe_fp8_problem *p, const moe_fp8_tensor *dy, const moe_fp8_tensor *w,
                               const float *topk_weights, void *dx);

/* FP8 dW (specs/FP8.md, "dW"): dw[e][n][c] promoted every 128 rows of expert e, x and dy in expert-row order,
 * the scales of the tile beginning at expert row r0 in scale row moe_fp8_dw_scale_row(r0, e).  Each OpenMP
 * thread owns whole rows (e, n) of dW. */
moe_status moe_ref_gemm_fp8_dw(const moe_fp8_problem *p, const moe_fp8_tensor *x, const moe_fp8_tensor *dy,
                               void *dw);

/* The blocked twins of the three (ref/gemm_fp8_blocked.c): the same float32 operations on every element in the
 * same order, so bit for bit the same outputs, a block of rows and columns at a time.  What the reference
 * backend runs. */
moe_status moe_ref_gemm_fp8_fwd_blocked(const moe_fp8_problem *p, const moe_fp8_tensor *x, const moe_fp8_tensor *w,
                                        const float *topk_weights, void *y);
moe_status moe_ref_gemm_fp8_dx_blocked(const moe_fp8_problem *p, const moe_fp8_tensor *dy, const moe_fp8_tensor *w,
                                       const float *topk_weights, void *dx);
moe_status moe_ref_gemm_fp8_dw_blocked(const moe_fp8_problem *p, const moe_fp8_tensor *x, const moe_fp8_tensor *dy,
                                       void *dw);

/* The quantizer behind moe_quantize_fp8_rows (tile_rows 1) and _blocks (tile_rows 128), on validated
 * arguments: src [batches][rows][cols] of src_dtype (f32 or bf16) -> q (same shape), scales
 * [batches][ceil(rows / tile_rows)][ceil(cols / 128)].  Returns MOE_ERR_INVALID_VALUE (naming the element)
 * before writing anything when src holds a NaN or Inf. */
moe_status moe_ref_quantize_fp8(const char *op, moe_dtype src_dtype, int tile_rows, int64_t batches, int64_t rows,
                                int64_t cols, const void *src, moe_dtype fp8_dtype, moe_fp8_scale_format format,
                                void *q, void *scales);

/* The quantizer behind moe_quantize_fp8_columns (include/moe_fp8.h) on validated arguments: 128 x 1 tiles along
 * each expert's rows from its offset; MOE_ERR_INVALID_VALUE (naming the element) before writing anything when
 * a value (after its topk weight) is a NaN or Inf. */
moe_status moe_ref_quantize_fp8_columns(const moe_fp8_columns_problem *p, const void *src, const float *topk_weights,
                                        void *q, void *scales);

/* The inverse on validated arguments: out = decode(q) * scale (float32), rounded to out_dtype. */
void moe_ref_dequantize_fp8(moe_dtype fp8_dtype, moe_fp8_scale_format format, int tile_rows, int64_t batches,
                            int64_t rows, int64_t cols, const void *q, const void *scales, moe_dtype out_dtype,
                            void *out);

/* The reference backend's table entries for dW and the columns quantizer (ref/fp8_transposed.c): the functions
 * above on untransposed codes; with p->codes_transposed (x [K][M], dy [N][M]) or p->transposed (codes [cols][M])
 * through a host scratch of the codes in rows, so the same bits.  MOE_ERR_OUT_OF_MEMORY, nothing written, when the
 * scratch cannot be had. */
moe_status moe_ref_gemm_fp8_dw_entry(const moe_fp8_problem *p, const moe_fp8_tensor *x, const moe_fp8_tensor *dy,
                                     void *dw);
moe_status moe_ref_quantize_fp8_columns_entry(const moe_fp8_columns_problem *p, const void *src,
                                              const float *topk_weights, void *q, void *scales);

#endif
