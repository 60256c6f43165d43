/*
 * libmoe: FP8 grouped GEMM (fwd, dX, dW) with fine-grained scales (the DeepSeek-V3 recipe) and its quantization
 * helpers.
 * The exact math is specs/FP8.md; this header names the shapes and the contract of each entry point.
 * Notation and conventions as in moe.h (T, k, E, M = T*k, W [E][N][K], the routing, statuses, messages,
 * nothing changed on failure).
 *
 * Tiles.  Every FP8 tensor carries float32 (or UE8M0) scales, one per tile of MOE_FP8_TILE = 128 elements
 * along the reduction dimension:
 *   activations (X for fwd, dY for dX)   [R][C] codes,  scales [R][ceil(C/128)]        (1 x 128 tiles)
 *   weights W                             [E][N][K] codes, scales [E][ceil(N/128)][ceil(K/128)]
 *                                                                                     (128 x 128 blocks)
 * The last tile of a row, and the last block row and column, may be partial (C, N, K need not be
 * multiples of 128).  Element (e, n, c) of W has the scale of block (e, n / 128, c / 128).  The forward
 * reduces over K: the K-tile t of output (r, n) uses X's scale (xrow(r), t) and W's (e, n / 128, t).  dX
 * reduces over N: the N-tile t of output (r, c) uses dY's scale (yrow(r), t) and W's (e, t, c / 128).
 * Because the blocks are square, one quantization of W serves both products.  dW reduces over each expert's
 * rows: its operands X [M][K] and dY [M][N] (expert-row order) have 128 x 1 tiles along the rows of each expert
 * (moe_quantize_fp8_columns, moe_gemm_fp8_dw below).
 */
#ifndef LIBMOE_FP8_H
#define LIBMOE_FP8_H

#include "moe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Elements per scale along the reduction (and both sides of a weight block). */
#define MOE_FP8_TILE 128

typedef enum moe_fp8_scale_format {
    MOE_FP8_SCALE_F32 = 0,   /* float32 scales, each finite and > 0 */
    MOE_FP8_SCALE_UE8M0 = 1  /* uint8_t biased exponents b (OCP MX E8M0): scale 2^(b - 127); b = 255 (E8M0's
                                NaN) is refused */
} moe_fp8_scale_format;

/* One FP8 operand: codes of `dtype` (uint8_t each) and the scales of its tiles (layout above; float or
 * uint8_t elements by the call's scale_format). */
typedef struct moe_fp8_tensor {
    const void *data;
    const void *scales;
    moe_dtype dtype;   /* MOE_E4M3 or MOE_E5M2 */
} moe_fp8_tensor;

typedef struct moe_fp8_options {
    moe_dtype out_dtype;               /* MOE_F32 (0, the default) or MOE_BF16: y, dx */
    moe_fp8_scale_format scale_format; /* of every operand's scales */
    int permute_x;                     /* as moe_gemm_options: X token order [T][K], row r reads X[g_r / k] */
    int permute_y;                     /* Y and dY slot order */
    int reduce_topk;                   /* dX: [T][K], the k slot rows of a token summed in float32 */
    int accumulate;                    /* add into the output (float32, one rounding) */
    void *stream;                      /* CUDA backend: the cudaStream_t */
    int w_transposed;                  /* dX only: w holds each expert's W^T (moe_gemm_fp8_dx below) */
    int codes_transposed;              /* dW only: x's and dy's codes transposed, [K][M] and [N][M] (below) */
} moe_fp8_options;

/* Y = fwd(X, W) on FP8 operands.
 *   x             codes [R_x][K], scales [R_x][ceil(K/128)]     (R_x = T with permute_x, else M)
 *   w             codes [E][N][K], scales [E][ceil(N/128)][ceil(K/128)]
 *   topk_weights  float32 [M] in slot order, or NULL (needs gather_indices): row r's result times
 *                 topk_weights[g_r] in float32 before the rounding
 *   y             [M][N] of out_dtype; expert order, or slot order with permute_y
 * MOE_BACKEND_REF checks every scale (MOE_ERR_INVALID_VALUE naming the operand and the index).  The CUDA
 * backend (sm_80 and later) checks them on the device: a bad scale is reported by moe_backend_synchronize
 * (MOE_ERR_INVALID_VALUE) and the call writes nothing. */
moe_status moe_gemm_fp8_fwd(moe_backend backend, const moe_routing *routing, int64_t N, int64_t K,
                            const moe_fp8_tensor *x, const moe_fp8_tensor *w, const float *topk_weights, void *y,
                            const moe_fp8_options *options);

/* dX = dY . W per expert on FP8 operands (the reduction over N).
 *   dy            codes [M][N] (slot order with permute_y), scales [M][ceil(N/128)]
 *   w             as for the forward (the same codes and scales); with options.w_transposed, W^T per expert:
 *                 codes [E][K][N] (element (e, c, n) is W's (e, n, c)), scales [E][ceil(K/128)][ceil(N/128)]
 *                 (block (e, c / 128, n / 128) is W's block (e, n / 128, c / 128)).  moe_quantize_fp8_blocks
 *                 of W^T gives exactly these: a block's amax, so its scale, does not depend on the transposition.
 *                 The result is the same bit for bit (the same products, sums and scales, in the same order);
 *                 on sm_90a the kernel then reads W^T's boxes as they are instead of transposing W's boxes in
 *                 shared memory (FP8 wgmma reads no transposed operand), so this form is faster where the
 *                 caller keeps W^T's codes from step to step (bench/RESULTS.md, "dX from W^T").
 *   topk_weights  float32 [M] or NULL: the forward's fused routing weights
 *   dx            [M][K] of out_dtype (slot order with permute_x), or [T][K] with reduce_topk */
moe_status moe_gemm_fp8_dx(moe_backend backend, const moe_routing *routing, int64_t N, int64_t K,
                           const moe_fp8_tensor *dy, const moe_fp8_tensor *w, const float *topk_weights, void *dx,
                           const moe_fp8_options *options);

/* dW[e] = sum over the rows r of expert e of dy_r^T (x) x_r on FP8 operands (the reduction over the expert's
 * rows), with 128 x 1 tiles along the rows (specs/FP8.md, "dW"): both operands come from
 * moe_quantize_fp8_columns, in expert-row order, tiled from each expert's own offset.
 *   x             codes [M][K], scales [moe_fp8_column_scale_rows(M, E)][K]
 *   dy            codes [M][N], scales [moe_fp8_column_scale_rows(M, E)][N]
 *   dw            [E][N][K] of out_dtype; an expert with no rows gets zeros (old + 0 with accumulate)
 * The tile of expert e beginning at expert row r0 has scale row r0 / 128 + e in both.  The forward's
 * permute_x, permute_y and topk weights are the quantizer's (it gathers the rows and multiplies dY by the
 * weights before it picks the scales: a per-row factor or a row shared by k tiles has no tile scale), so
 * options.permute_x, permute_y, reduce_topk and w_transposed are refused here; out_dtype, scale_format, accumulate,
 * codes_transposed and stream apply.
 * With options.codes_transposed, x's and dy's codes are those of moe_quantize_fp8_columns_transposed: [K][M] and
 * [N][M] (element (c, r) is expert row r's code of column c), the scales as above.  The math and the scales are the
 * same; MOE_BACKEND_REF gives the same bits as from the untransposed codes.  This is the form Hopper's FP8 tensor
 * cores read (they take no operand whose reduction dimension is not contiguous).  The CUDA backend copies them
 * back into expert-row order in a device workspace and runs its portable kernel; its sm_90a wgmma kernel, which
 * reads them as they are (M % 16 == 0, the codes 16-byte aligned), runs only where the environment variable
 * MOE_FP8_DW_SM90=1 switches it on, until it has been checked on a device (specs/FP8.md, "dW").  The forward and
 * dX refuse the option.
 * MOE_BACKEND_REF checks the scales of every tile in use (MOE_ERR_INVALID_VALUE naming the
 * operand and the index); MOE_BACKEND_CUDA (sm_80 and later) checks them on the device: a bad one is reported by
 * moe_backend_synchronize (MOE_ERR_INVALID_VALUE) and the call writes nothing. */
moe_status moe_gemm_fp8_dw(moe_backend backend, const moe_routing *routing, int64_t N, int64_t K,
                           const moe_fp8_tensor *x, const moe_fp8_tensor *dy, void *dw,
                           const moe_fp8_options *options);

/* The scale rows of an operand of moe_gemm_fp8_dw with `rows` expert-order rows (M) and num_experts
 * experts: ceil(M / 128) + E - 1, enough for every routing (expert e's tiles take rows off_e / 128 + e
 * onwards, and no two experts' tiles meet), known without reading m_sizes.  Rows no tile uses are written by
 * the quantizer as an empty tile's scale and read by nothing.  -1 when rows < 0 or num_experts < 1. */
int64_t moe_fp8_column_scale_rows(int64_t rows, int64_t num_experts);

/* Quantization (specs/FP8.md section 3).  src holds f32 or bf16 values (src_dtype); for each tile, amax =
 * max |v| over it, floored at MOE_FP8_AMAX_FLOOR (so a zero tile has a finite scale and zero codes); its
 * scale s = amax / max_format in float32 (448 for e4m3, 57344 for e5m2), or with UE8M0 the power of two
 * 2^ceil(log2(amax / max_format)); each code is the saturating round-to-nearest-even conversion of
 * v * (max_format / amax) (float32 scale) or v * 2^-e (UE8M0), as DeepGEMM's per_token_cast_to_fp8 /
 * per_block_cast_to_fp8 compute them.
 *   rows:   src [R][C] -> q [R][C], scales [R][ceil(C/128)]                      (1 x 128 tiles)
 *   blocks: src [B][R][C] -> q [B][R][C], scales [B][ceil(R/128)][ceil(C/128)]   (128 x 128 blocks)
 * MOE_BACKEND_REF: host pointers, stream ignored; a NaN or Inf in src fails with MOE_ERR_INVALID_VALUE
 * naming the element, and nothing is written.  MOE_BACKEND_CUDA: device pointers, queued on `stream` (a
 * cudaStream_t, NULL = the default stream) without waiting; the source is checked on the device first, and
 * a NaN or Inf is reported by moe_backend_synchronize (MOE_ERR_INVALID_VALUE, the first such element as the
 * host names it) with nothing written.  Both backends give the same codes and scales, bit for bit. */
#define MOE_FP8_AMAX_FLOOR 1e-4f
moe_status moe_quantize_fp8_rows(moe_backend backend, moe_dtype src_dtype, int64_t rows, int64_t cols,
                                 const void *src, moe_dtype fp8_dtype, moe_fp8_scale_format scale_format, void *q,
                                 void *scales, void *stream);
moe_status moe_quantize_fp8_blocks(moe_backend backend, moe_dtype src_dtype, int64_t batches, int64_t rows,
                                   int64_t cols, const void *src, moe_dtype fp8_dtype,
                                   moe_fp8_scale_format scale_format, void *q, void *scales, void *stream);

/* Where the rows of moe_quantize_fp8_columns' source are: expert row r of the routing reads source row r
 * (expert order), g_r (slot order: dY of a forward with permute_y) or g_r / k (token order: X of a
 * forward with permute_x); the last two need routing.gather_indices. */
typedef enum moe_fp8_row_source {
    MOE_FP8_ROWS_EXPERT = 0, /* src [M][cols] */
    MOE_FP8_ROWS_SLOT = 1,   /* src [M][cols] */
    MOE_FP8_ROWS_TOKEN = 2   /* src [T][cols] */
} moe_fp8_row_source;

/* The quantizer of moe_gemm_fp8_dw's operands: 128 x 1 tiles along the expert-order rows of each expert,
 * each expert tiled from its own offset (its last tile partial, never shared with the next expert), with
 * the rows and blocks quantizers' rule per tile (amax floored, amax / max_format, the same codes).
 *   src           [M or T][cols] of src_dtype (f32 or bf16), rows as `source` says
 *   topk_weights  float32 [M] in slot order, or NULL (needs gather_indices): the value of expert row r is
 *                 topk_weights[g_r] * src (float32, one rounding) before the tile's amax, as the bf16 dW
 *                 weights dY
 *   q             [M][cols] codes, expert-row order
 *   scales        [moe_fp8_column_scale_rows(M, E)][cols]: the tile of expert e beginning at expert row r0
 *                 has scale row r0 / 128 + e; unused rows get an empty tile's scale (MOE_FP8_AMAX_FLOOR's)
 * MOE_BACKEND_REF: host pointers (the routing too, checked as the GEMM checks it); a NaN or Inf value
 * (after the weight) fails with MOE_ERR_INVALID_VALUE naming the element, and nothing is written.
 * MOE_BACKEND_CUDA: device pointers (the routing too), queued on `stream`; the routing and the values are checked
 * on the device and a violation is reported by moe_backend_synchronize (the reference's status and message for
 * the first bad value in expert-row order), with nothing written; the codes and scales equal the reference's bit
 * for bit. */
moe_status moe_quantize_fp8_columns(moe_backend backend, const moe_routing *routing, moe_dtype src_dtype,
                                    int64_t cols, const void *src, moe_fp8_row_source source,
                                    const float *topk_weights, moe_dtype fp8_dtype,
                                    moe_fp8_scale_format scale_format, void *q, void *scales, void *stream);

/* moe_quantize_fp8_columns with the codes transposed (moe_gemm_fp8_dw's options.codes_transposed): the same tiles,
 * scales and codes, the codes stored qt [cols][M], qt[c][r] = expert row r's code of column c; the scales
 * [moe_fp8_column_scale_rows(M, E)][cols] as moe_quantize_fp8_columns writes them.  Arguments, checks and failure as
 * moe_quantize_fp8_columns (nothing written on failure). */
moe_status moe_quantize_fp8_columns_transposed(moe_backend backend, const moe_routing *routing, moe_dtype src_dtype,
                                               int64_t cols, const void *src, moe_fp8_row_source source,
                                               const float *topk_weights, moe_dtype fp8_dtype,
                                               moe_fp8_scale_format scale_format, void *qt, void *scales,
                                               void *stream);

/* The inverse: out = decode(q) * scale in float32 (exact for UE8M0 scales; one rounding otherwise), then
 * rounded to out_dtype (MOE_F32 or MOE_BF16).  tile_rows 1 reads the rows layout (batches must be 1), 128
 * the blocks layout.  Scales are checked as the GEMM checks them: on the host for MOE_BACKEND_REF, on the
 * device for MOE_BACKEND_CUDA (a bad one reported by moe_backend_synchronize, nothing written).  Pointers
 * and stream as for the quantizers. */
moe_status moe_dequantize_fp8(moe_backend backend, moe_dtype fp8_dtype, moe_fp8_scale_format scale_format,
                              int tile_rows, int64_t batches, int64_t rows, int64_t cols, const void *q,
                              const void *scales, moe_dtype out_dtype, void *out, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* LIBMOE_FP8_H */
