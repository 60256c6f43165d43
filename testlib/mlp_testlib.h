/*
 * Test support for the blockwise MoE MLP (tests/test_mlp_*.c, tests/test_cli_npy.c, the fuzzer's MLP ops,
 * proptest/test_gpu_mlp.c), independent of ref/mlp/, one file per stage:
 *
 *   - mlp_case.c: a random case generator (routing, layouts, inputs, relabelled copies);
 *   - mlp_float64.c: a float64 forward of SEMANTICS section 3 written from the spec, and central finite
 *     differences of the loss L = <G, out> through it (the gradients every test checks against);
 *   - mlp_bounds.c: a case's analytic expectation, the oracle's (oracle/oracle_mlp.h, oracle/mlp_bound.c): a
 *     float64 forward/backward in "running error" arithmetic: every quantity carries its exact value (from
 *     the same rounded inputs) and a bound on the error a correct float32 reference may have in it,
 *     composed from the dot-product bound of SEMANTICS section 4 (specs/MLP.md, "Error bound", derives
 *     each rule);
 *   - mlp_clamps.c: clamp limits placed in gaps of the data;
 *   - mlp_check.c: the run of an implementation and the checks of its outputs (mt_run), and comparisons
 *     of two result sets.
 */
#ifndef LIBMOE_MLP_TESTLIB_H
#define LIBMOE_MLP_TESTLIB_H

#include "moe.h"
#include "moe_mlp.h"
#include "oracle.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* How the case's layout is made. */
enum mt_layout_mode {
    MT_DROPLESS = 0,     /* moe_mlp_layout_build, dropless */
    MT_DROPPING = 1,     /* moe_mlp_layout_build, dropping (capacity B) */
    MT_SHUFFLED = 2      /* dropless, then blocks permuted, slots shuffled, an empty block added */
};

/* Which clamp limits a case sets (bit mask). */
enum { MT_LIN_LO = 1, MT_LIN_HI = 2, MT_NL_LO = 4, MT_NL_HI = 8 };

/* The option cross of the MLP tests: every activation of the table (backend/moe_activations.h) x affinity (2)
 * x bias (2) x clamp subset (16). */
enum { MT_OPTION_COMBOS = MOE_MLP_ACTIVATION_COUNT * 2 * 2 * 16 };
/* Sets o's activation, affinity and bias of combo (0 <= combo < MT_OPTION_COMBOS, the activation varying
 * fastest) and returns its clamp mask (MT_LIN_LO | ...). */
static inline int mt_option_combo(int combo, moe_mlp_options *o)
{
    const int rest = combo / MOE_MLP_ACTIVATION_COUNT;
    o->activation = (moe_mlp_activation)(combo % MOE_MLP_ACTIVATION_COUNT);
    o->affinity = (moe_mlp_affinity)(rest & 1);
    o->bias = (rest >> 1) & 1;
    return rest >> 2;
}

typedef struct mt_case {
    uint64_t seed;
    int64_t T, E, k, H, I, B, N, T1;
    moe_mlp_options opt;
    int64_t *topk_ids;            /* [T*k] */
    int64_t *b2e, *ids;           /* the layout arrays */
    moe_mlp_layout layout;
    int64_t dropped;
    /* inputs in opt.dtype; hidden/out_grad row T (pad-row convention) and the affinities of pairs
     * outside the layout are NaN: the reference must never read them */
    void *hidden, *aff, *w_gu, *w_d, *b_gu, *b_d, *G;
    /* the same values as double */
    double *x, *A, *wgu, *wd, *bgu, *bd, *g;
    /* clamp statistics of the case (filled by mt_choose_clamps) */
    double clamp_fraction[4];     /* lin lo, lin hi, nl lo, nl hi: share of elements clamped */
    int value_dist;               /* enum mt_value_dist (mt_case_set_values); 0 after mt_case_init */
    int value_log2;               /* MT_VALUES_LARGE / _TINY: hidden was scaled by 2^value_log2 */
} mt_case;

/* Value distributions of a case's inputs (mt_case_set_values).  Every one keeps the checks of mt_run
 * valid: no value or intermediate reaches Inf in the dtype; MT_CHECK_FD assumes |data| <= 1, true for
 * all but MT_VALUES_LARGE. */
enum mt_value_dist {
    MT_VALUES_UNIFORM = 0, /* uniform in [-1, 1), rounded to the dtype (what mt_case_init makes) */
    MT_VALUES_EXACT,       /* every input in {0, +-2^-4 .. +-2^0} (and wide-shape weights times a power of
                              two): exact in every dtype, every float32 product and GEMM sum exact */
    MT_VALUES_LARGE,       /* uniform with hidden times 2^s (s > 0; f16: lowered until nothing overflows) */
    MT_VALUES_TINY,        /* uniform with hidden times 2^s (s < 0; f16: subnormal and zero inputs) */
    MT_VALUE_DISTS
};
const char *mt_value_dist_name(int dist);

/* Makes a random case: distinct experts per token, uniform [-1, 1) inputs rounded to opt->dtype,
 * layout per `mode`; opt->block_size must be set.  Clamp limits are not set (mt_choose_clamps). */
void mt_case_init(mt_case *c, uint64_t seed, int64_t T, int64_t E, int64_t k, int64_t H, int64_t I,
                  const moe_mlp_options *opt, int mode);
/* Same, with caller-given routing (topk_ids[T*k]) and the dropless builder. */
void mt_case_init_routing(mt_case *c, uint64_t seed, int64_t T, int64_t E, int64_t k, int64_t H, int64_t I,
                          const int64_t *topk_ids, const moe_mlp_options *opt, int mode);
void mt_case_free(mt_case *c);
/* dst = src with its tokens and experts relabelled: src's token t is dst's token token_map[t], src's
 * expert e is dst's expert expert_map[e] (permutations; NULL keeps the labels).  Inputs, affinities,
 * weights, biases, routing and clamp limits move with their labels (the pad row stays row T).  The
 * layout is src's, mapped (every position keeps its place: block n serves expert_map[b2e[n]]), or
 * with rebuild_layout the dropless builder's layout of the relabelled routing (another position order,
 * so other summation orders).  Free with mt_case_free. */
void mt_case_relabel(const mt_case *src, const int64_t *token_map, const int64_t *expert_map, int rebuild_layout,
                     mt_case *dst);

/* Redraws the inputs of a case fresh from mt_case_init per `dist` (enum mt_value_dist; NaN entries stay
 * NaN); log2_scale is the s of MT_VALUES_LARGE / MT_VALUES_TINY (ignored otherwise); scale_weights:
 * also mt_case_scale_weights (after the redraw, before the scaling of hidden).  For f16,
 * MT_VALUES_LARGE lowers s (down to 0 at worst) until every rounding to f16 of the analytic expectation
 * (outputs, checkpoints, rounded intermediates, magnitude plus bound) stays below a quarter of the
 * largest finite f16; c->value_log2 holds the s used.  Call right after mt_case_init*, instead of
 * mt_case_scale_weights, before mt_choose_clamps. */
void mt_case_set_values(mt_case *c, int dist, int log2_scale, int scale_weights);

/* Scales w_gu by 1/sqrt(H) and w_d by 1/sqrt(I) (re-rounded to the dtype), keeping pre-activations
 * O(1) on wide shapes; for MT_VALUES_EXACT by the nearest power of two instead, so the values stay
 * exact.  Call before mt_choose_clamps. */
void mt_case_scale_weights(mt_case *c);

/* Sets the clamp limits in `mask` at quantiles of the data (lower ~25%, upper ~75%) in gaps wide
 * enough that no element lies within its error bound (+1e-3) of a limit; each limit is exactly
 * representable in the dtype.  Returns 0 if no such placement exists. */
int mt_choose_clamps(mt_case *c, int mask);

/* The float64 forward: out[T1][H] (row T zero). */
void mt_forward64(const mt_case *c, double *out);

/* What mt_run calls: moe_mlp_fwd / moe_mlp_bwd with MOE_BACKEND_REF and host pointers by default.  A
 * test of another backend (proptest/test_gpu_mlp.c) points these at wrappers of the same signature that
 * copy the host arrays to the device, run there and copy every output back. */
typedef moe_status (*mt_fwd_fn)(moe_backend backend, const moe_mlp_layout *layout, int64_t hidden_size,
                                int64_t intermediate_size, const void *hidden, const void *affinities,
                                const void *w_gu, const void *w_d, const void *b_gu, const void *b_d, void *out,
                                void *gate_up_ckpt_T, void *down_ckpt, const moe_mlp_options *options);
typedef moe_status (*mt_bwd_fn)(moe_backend backend, const moe_mlp_layout *layout, int64_t hidden_size,
                                int64_t intermediate_size, const void *hidden, const void *affinities,
                                const void *w_gu, const void *w_d, const void *b_d, const void *gate_up_ckpt_T,
                                const void *down_ckpt, const void *out_grad, void *d_hidden, void *d_affinities,
                                void *d_w_gu, void *d_w_d, void *d_b_gu, void *d_b_d,
                                const moe_mlp_options *options);
extern mt_fwd_fn mt_mlp_fwd;
extern mt_bwd_fn mt_mlp_bwd;
extern moe_backend mt_backend;
/* Set (with the hooks) by a test of a backend that evaluates bf16 calls without round_intermediates on
 * split operands, as the CUDA backend does (specs/MLP.md, "Split operands on the GPU"): mt_run's bounds
 * then allow the extra roundings of those GEMM sums.  0 (the reference) by default. */
extern int mt_split_operands;

/* Results of one reference run (allocated by mt_run). */
typedef struct mt_result {
    void *out, *ckpt_gu, *ckpt_d;
    void *d_hidden, *d_aff, *d_wgu, *d_wd, *d_bgu, *d_bd;
    int split_operands; /* mt_split_operands when mt_run made it: the bound mt_compare_results holds it to */
} mt_result;

/* Checks of mt_run (bit mask).
 *   MT_CHECK_BOUND: every output within the derived bound of its exact value (from the rounded inputs,
 *     no intermediate rounding; each rounding of the spec widens the bound instead), the bound any
 *     correct float32 implementation meets, whether it rounds an intermediate or not;
 *   MT_CHECK_FD: every gradient also against float64 central finite differences;
 *   MT_CHECK_EXACT_ROUNDING: in addition, every output against a second expectation that applies each
 *     rounding of the spec (checkpoints, options.round_intermediates, outputs) to its value, with the
 *     bound the rounding's spread over the operand's interval (0 where no rounding boundary is in it):
 *     this one fails an implementation that rounds in the wrong place, or not at all, or twice (bound
 *     check only; meaningful for f16/bf16, the same as MT_CHECK_BOUND for f32). */
enum { MT_CHECK_FD = 1, MT_CHECK_BOUND = 2, MT_CHECK_EXACT_ROUNDING = 4 };

/* Runs moe_mlp_fwd then moe_mlp_bwd on the case (outputs poisoned with NaN first; with accumulate,
 * the gradients start from random contents), checks every output against the float64 analytic
 * value within its derived bound and every gradient against central finite differences (bound +
 * finite-difference error), and returns the number of mismatches (printed to stderr with the seed).
 * `res` (if non-NULL) receives the outputs; free with mt_result_free.  `down_ckpt_in_bwd`: pass the
 * down checkpoint to the backward (required for ON_H). */
int64_t mt_run(const mt_case *c, int checks, int down_ckpt_in_bwd, mt_result *res);
void mt_result_free(mt_result *r);

/* Element counts of the case's tensors. */
int64_t mt_count_wgu(const mt_case *c);
int64_t mt_count_wd(const mt_case *c);

/* Largest |a - b| / (bound_a + bound_b) style comparison of two result sets of the same case (e.g.
 * ON_H vs ON_I, two block sizes, two backends): compares every gradient and the output element by
 * element with the sum of both analytic bounds (with accumulate, from mt_run's starting contents of
 * each case's gradients); returns mismatches (printed, labelled `what`, unless what is NULL). */
int64_t mt_compare_results(const mt_case *c1, const mt_result *r1, const mt_case *c2, const mt_result *r2,
                           const char *what);

/* mt_compare_results of two cases that differ by a relabelling (mt_case_relabel): element i of c1's
 * results is compared with its image in c2's labelling, within the sum of both bounds.  token_map[T]:
 * c1's token t is c2's token token_map[t]; expert_map[E] likewise (NULL: the same labels). */
int64_t mt_compare_relabelled(const mt_case *c1, const mt_result *r1, const mt_case *c2, const mt_result *r2,
                              const int64_t *token_map, const int64_t *expert_map, const char *what);

/* Bitwise equality of two result sets (sizes from c). */
int mt_results_identical(const mt_case *c, const mt_result *r1, const mt_result *r2, int with_ckpts);

/* The largest |got - analytic| / bound that mt_run's bound checks have seen (infinite where a
 * non-finite value met a finite expectation); the caller resets it. */
extern double mt_worst_ratio;

/* Number of elements of the case's gradient tensors, etc. (for tests poking at results) */
double mt_load(moe_dtype dtype, const void *base, int64_t i);

#endif /* LIBMOE_MLP_TESTLIB_H */
