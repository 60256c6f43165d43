/*
 * The float64 oracle of the grouped GEMM and its derived error bounds (SEMANTICS section 4).
 *
 * For every output element the oracle gives `value`, the float64 result from the same (already rounded)
 * inputs, and `bound`, the largest error a correct float32-accumulating, once-rounding implementation
 * may have:
 *
 *   bound = A  +  u_out * (|value| + A)  +  eta_out  +  L * 2^-52 * S,   A = g(L) * (1 + d) * S  +  d * S
 *
 *   L       float32 roundings on the way to the element: the length of the dot product, plus one for a
 *           topk-weight multiply, plus one for an accumulate add (and N + 2k for reduce_topk); bf16 and f16
 *           dW with fused topk weights count their dot length twice in oracle_gemm_dw_split, the bound of a
 *           backend whose kernels may split each row's exact product w*dy into two terms, hi + lo, whose
 *           magnitudes add up to its own (the CUDA backend: specs/DECISIONS.md);
 *   S       the sum of |terms| (|w*a*b| with the topk weight when fused; plus |old| with accumulate);
 *   g(L)    = L 2^-24 / (1 - L 2^-24);
 *   d       0, or with allow_tf32 (f32; fwd, dX, dW) 2^-10 + 2^-22, the relative error of a product of two
 *           operands each rounded to TF32 (the whole S is charged, |old| of accumulate included: an overestimate);
 *   u_out   unit roundoff of the output dtype; eta_out half its smallest subnormal (underflow);
 *   the last term covers the oracle's own float64 rounding.
 *
 * The oracle shares no code with ref/: it indexes the inputs its own way, in double.
 */
#ifndef LIBMOE_ORACLE_H
#define LIBMOE_ORACLE_H

#include "moe.h"

#include <stdint.h>
#include <stdio.h>

/* value/bound arrays have the output's element count.  `old` is the output's contents before the call
 * (read only with options->accumulate; may be NULL otherwise).  Host pointers. */
void oracle_gemm_fwd(const moe_routing *routing, int64_t N, int64_t K, const void *x, const void *w,
                     const void *topk_weights, const void *old_y, const moe_gemm_options *options,
                     double *value, double *bound);
void oracle_gemm_dx(const moe_routing *routing, int64_t N, int64_t K, const void *dy, const void *w,
                    const void *topk_weights, const void *old_dx, const moe_gemm_options *options,
                    double *value, double *bound);
void oracle_gemm_dw(const moe_routing *routing, int64_t N, int64_t K, const void *x, const void *dy,
                    const void *topk_weights, const void *old_dw, const moe_gemm_options *options,
                    double *value, double *bound);
/* oracle_gemm_dw for a backend that may add a bf16 or f16 row's fused product w*dy as two terms (hi + lo): the
 * CUDA backend's tensor-core kernels, and any comparison that must hold for every backend (the CLI's
 * --bound-out).  oracle_gemm_dw is the bound of a backend that adds each product once (the CPU reference); the
 * two differ only for bf16 and f16 with topk weights. */
void oracle_gemm_dw_split(const moe_routing *routing, int64_t N, int64_t K, const void *x, const void *dy,
                          const void *topk_weights, const void *old_dw, const moe_gemm_options *options,
                          double *value, double *bound);
void oracle_gemm_topk_weights_grad(const moe_routing *routing, int64_t N, int64_t K, const void *x,
                                   const void *w, const void *dy, const void *old_d,
                                   const moe_gemm_options *options, double *value, double *bound);

/* gamma(L) of SEMANTICS section 4 for float32 accumulation. */
double oracle_gamma(int64_t length);
/* The rounding terms of an output dtype: u_out * |value| + eta_out. */
double oracle_output_rounding(moe_dtype dtype, double value);

/* The magnitude from which round-to-nearest gives Inf in a dtype (largest finite + half an ulp). */
double oracle_overflow_threshold(moe_dtype dtype);

/* Element i of a tensor as double. */
double oracle_load(moe_dtype dtype, const void *base, int64_t i);

/* Compares `count` elements of `out` against value +- bound.  NaN in `out` where value is finite fails.
 * Prints up to `max_reports` mismatches to `report` as "<label>[i]: got G, want V, |err| E > bound B",
 * and returns the number of mismatches.  *worst_ratio (if non-NULL) gets max |err| / bound. */
int64_t oracle_compare(const char *label, moe_dtype dtype, const void *out, const double *value,
                       const double *bound, int64_t count, FILE *report, int max_reports,
                       double *worst_ratio);

/* ---- test data helpers ---- */

/* splitmix64: a seeded, portable generator. */
typedef struct oracle_rng {
    uint64_t state;
} oracle_rng;
uint64_t oracle_rng_next(oracle_rng *rng);
/* Uniform in [0, bound) (bound >= 1). */
uint64_t oracle_rng_below(oracle_rng *rng, uint64_t bound);
/* Uniform double in [-1, 1). */
double oracle_rng_symmetric(oracle_rng *rng);

/* Fills count elements with values from the given distribution, rounded to dtype:
 *   0: uniform in [-1, 1)   1: small powers of two and zero (exact in every dtype and every sum)
 *   2: wide magnitudes (2^-8 .. 2^8 times uniform) */
void oracle_fill(oracle_rng *rng, moe_dtype dtype, void *base, int64_t count, int distribution);
/* A router's choices ids[T][k]: k distinct experts of [0, E) per token, uniformly at random (a repeated
 * draw is drawn again, so k <= E is required).  The benchmarks and `moe autotune` use it. */
void oracle_topk_ids(oracle_rng *rng, int64_t T, int64_t k, int64_t E, int64_t *ids);
/* Writes NaN into every element (poisoning outputs so unwritten elements fail). */
void oracle_poison(moe_dtype dtype, void *base, int64_t count);

#endif /* LIBMOE_ORACLE_H */
