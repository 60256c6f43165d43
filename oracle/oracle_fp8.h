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
 * len is K for the forward and N for dX.  Host pointers; `old` is read only with options->accumulate.
 */
#ifndef LIBMOE_ORACLE_FP8_H
#define LIBMOE_ORACLE_FP8_H

#include "moe_fp8.h"
#include "oracle.h"

void oracle_gemm_fp8_fwd(const moe_routing *routing, int64_t N, int64_t K, const moe_fp8_tensor *x,
                         const moe_fp8_tensor *w, const float *topk_weights, const void *old_y,
                         const moe_fp8_options *options, double *value, double *bound);
void oracle_gemm_fp8_dx(const moe_routing *routing, int64_t N, int64_t K, const moe_fp8_tensor *dy,
                        const moe_fp8_tensor *w, const float *topk_weights, const void *old_dx,
                        const moe_fp8_options *options, double *value, double *bound);

#endif
