/*
 * The float64 oracle of the FP8 grouped GEMM (include/moe_fp8.h) and its derived bound (specs/FP8.md
 * section 4): for every output element, `value` (the exact result, in double, from the codes and scales) and
 * `bound`, the largest error of a correct implementation that sums each 128-element tile's exact products
 * in float32, multiplies the tile's sum by the float32 product of its two scales and adds it to a float32
 * accumulator (the promotion), then applies the topk weight and the accumulate add in float32 and rounds
 * once to the output dtype:
 *
 *   bound = A + u_out (|value| + A) + eta_out + L 2^-52 S,   A = g(L) S + (1 + g(L)) U
 *   L = min(len, 128) + 2 + ceil(len / 128)  (+1 topk weight, +k reduce_topk, +1 accumulate)
 *   S = sum over the terms of |sa sb qa qb| (times |w|; plus |old| with accumulate)
 *   U = 2^-150 sum over the tiles of (2 |tile sum| + 1) (times max(1, |w|)): the float32 underflows of the
 *       scale product and the scale multiply
 *
 * len is K for the forward, N for dX and the expert's rows for dW.  Host pointers; `old` is read only with options->accumulate.
 */
#ifndef LIBMOE_ORACLE_FP8_H
#define LIBMOE_ORACLE_FP8_H

#include "moe_fp8.h"
#include "oracle.h"

/* The in-tile sums the bound assumes (tile_acc_bits): 0, float32 with round to nearest (the reference and the
 * portable CUDA kernel: the bound above); p > 0, the FP8 tensor cores' fixed-point sum (Hopper's wgmma,
 * specs/FP8.md "The accumulator of Hopper's FP8 wgmma"): each k32 group's products and its accumulator input
 * are aligned to the largest of them and truncated to p bits below its leading bit, and the group's sum is
 * truncated to p bits, so a group errs by at most 34 2^-p times the sum of its |terms|.  Then the in-tile
 * term g(127) S of A becomes c S, c = G e (1 + G e), e = 34 2^-p, G = the k32 groups of a tile (<= 4), and L
 * keeps only the roundings after the tile's sum: A = g(L) S + (1 + g(L)) (c S + (1 + c) U). */
#define ORACLE_FP8_TILE_F32 0
/* What Hopper's FP8 wgmma keeps: 13 bits (bench/fp8_accum_probe.cu; bench/RESULTS.md, "The accumulator of
 * Hopper's FP8 wgmma"). */
#define ORACLE_FP8_TILE_HOPPER_BITS 13

void oracle_gemm_fp8_fwd(const moe_routing *routing, int64_t N, int64_t K, const moe_fp8_tensor *x,
                         const moe_fp8_tensor *w, const float *topk_weights, const void *old_y,
                         const moe_fp8_options *options, int tile_acc_bits, double *value, double *bound);
void oracle_gemm_fp8_dx(const moe_routing *routing, int64_t N, int64_t K, const moe_fp8_tensor *dy,
                        const moe_fp8_tensor *w, const float *topk_weights, const void *old_dx,
                        const moe_fp8_options *options, int tile_acc_bits, double *value, double *bound);

/* dW (specs/FP8.md, "dW"): x [M][K] and dy [M][N] in expert-row order (with options->codes_transposed, x [K][M]
 * and dy [N][M]) with moe_quantize_fp8_columns' scales (the tile of expert e beginning at expert row r0 in scale
 * row r0 / 128 + e); value and bound [E][N][K], len the expert's rows m_e (an expert with no rows: value 0, or old
 * with accumulate). */
void oracle_gemm_fp8_dw(const moe_routing *routing, int64_t N, int64_t K, const moe_fp8_tensor *x,
                        const moe_fp8_tensor *dy, const void *old_dw, const moe_fp8_options *options,
                        int tile_acc_bits, double *value, double *bound);

#endif
