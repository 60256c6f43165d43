/*
 * A CPU model of what the Hopper FP8 kernel (gpu/gemm/fp8_sm90.cu) computes under the measured accumulator of
 * FP8 wgmma (specs/FP8.md section 4, "The accumulator of Hopper's FP8 wgmma"), and of the same kernel with the
 * promotion dropped (the mutant of the property tests, specs/FP8.md section 5).
 *
 * Per output element, per 128-element tile of the reduction, four k32 wgmmas (the kernel's k-step; a partial
 * last tile is padded with zero codes, as TMA fills it): each puts every term, the 32 exact products and the
 * accumulator input C, on the grid 2^(E-13), E the largest of C's exponent and the products' exponent sums
 * (a product's exponent is its operands' summed, though its significand may reach [2, 4)), each term truncated
 * toward zero, and sums the grid values exactly (they fit float32).  The first wgmma of a tile
 * starts from C = 0 (scale_d = 0).  Then the promotion acc = acc + part * (sa * sb), float32, as the
 * reference promotes (specs/FP8.md section 2), then the topk weight, the accumulate add, reduce_topk's sum and
 * the rounding to the output dtype, as the reference does them.
 *
 * The mutant (promote = 0) is the kernel with its promotion removed: every wgmma of the reduction chained
 * through the tensor core's accumulator (scale_d = 0 only for the first k-step's first wgmma, so the running sum
 * of all earlier tiles is the C of every later wgmma and sets its grid) and the scales applied once after the
 * k-loop, acc = part * (sa * sb) with the scales of the last tile (what the loop's scale variables hold then).
 * This is how an FP8 GEMM without promotion runs (CUTLASS's FP8 "fast accumulation", torch._scaled_mm's
 * use_fast_accum): the scales can only be applied at the end, so it is right about them only where a row's
 * scales are equal along the reduction, and there it differs from the kernel only by the accumulation.
 *
 * Host pointers; the arguments as moe_gemm_fp8_fwd / _dx take them (valid: not checked here).
 */
#ifndef LIBMOE_FP8_HOPPER_MODEL_H
#define LIBMOE_FP8_HOPPER_MODEL_H

#include "moe_fp8.h"

typedef struct fp8_hopper_model {
    int promote;  /* 1: the kernel (a fresh tensor-core partial per 128-tile, promoted); 0: the mutant */
    int sum_trunc; /* 0: the probe's accumulator (a wgmma's sum of grid values is exact); 1: also that sum
                      truncated toward zero to 13 bits below its leading bit, the spare truncation the oracle's
                      Hopper bound allows (oracle/oracle_fp8.h): the probe never saw it, two sums on an H200
                      did (specs/FP8.md section 4), so the GPU's model op uses 1 */
} fp8_hopper_model;

void fp8_hopper_model_fwd(const fp8_hopper_model *model, const moe_routing *routing, int64_t N, int64_t K,
                          const moe_fp8_tensor *x, const moe_fp8_tensor *w, const float *topk_weights, void *y,
                          const moe_fp8_options *options);
void fp8_hopper_model_dx(const fp8_hopper_model *model, const moe_routing *routing, int64_t N, int64_t K,
                         const moe_fp8_tensor *dy, const moe_fp8_tensor *w, const float *topk_weights, void *dx,
                         const moe_fp8_options *options);

#endif /* LIBMOE_FP8_HOPPER_MODEL_H */
