/*
 * Generators shared by the grouped GEMM and MLP properties: routings, model shapes, value
 * distributions.  Every generator draws from a pt_source; zero answers give the simplest choice.
 */
#ifndef LIBMOE_PT_GEN_H
#define LIBMOE_PT_GEN_H

#include "pt.h"

/* Routing kinds (the first answer a routing generator draws). */
enum pt_routing_kind {
    PT_ROUTE_UNIFORM = 0,     /* each token's k distinct experts uniformly */
    PT_ROUTE_ZIPF,            /* skewed towards low expert ids (cubic inverse CDF) */
    PT_ROUTE_ONE_EXPERT,      /* every token's first choice is the same expert */
    PT_ROUTE_EMPTY_FIRST,     /* experts [0, E/2) get no tokens */
    PT_ROUTE_EMPTY_LAST,      /* experts [ceil(E/2), E) get no tokens */
    PT_ROUTE_ALTERNATING,     /* odd experts get no tokens */
    PT_ROUTE_E_MUCH_LARGER,   /* uniform, with E >> T arranged by the shape generator */
    PT_ROUTE_KINDS_FROM_TOPK, /* kinds below this one come from topk ids */
    PT_ROUTE_ARBITRARY = PT_ROUTE_KINDS_FROM_TOPK, /* m_sizes any composition, gather any permutation */
    PT_ROUTE_KINDS
};
const char *pt_routing_kind_name(int kind);

/* The experts a topk-id kind may choose (ascending), written to list[E]; returns their count. */
int64_t pt_allowed_experts(int kind, int64_t E, int64_t *list);

/* Draws topk_ids[T*k] for a topk-id kind: k distinct experts per token from the allowed ones
 * (k <= the allowed count). */
void pt_gen_topk_ids(pt_source *src, int kind, int64_t T, int64_t k, int64_t E, int64_t *ids);

/* The stable sort of flattened ids by expert, computed here independently of the library. */
void pt_stable_routing(int64_t M, int64_t E, const int64_t *ids, int64_t *m_sizes, int64_t *gather);

/* Models of SEMANTICS section 5. */
typedef struct pt_model {
    const char *name;
    int64_t E, k, H, I;
} pt_model;
extern const pt_model pt_models[];
#define PT_MODELS 6

/* Value distributions. */
enum pt_dist {
    PT_DIST_EXACT = 0, /* 0 and +-2^-3..2^0: every float32 sum of their products is exact */
    PT_DIST_UNIFORM,   /* uniform in [-1, 1) */
    PT_DIST_WIDE,      /* uniform times 2^-8..2^8 */
    PT_DIST_LARGE,     /* large magnitudes (f16: up to 2^8, products overflow f16; f32/bf16: 2^10..2^30) */
    PT_DIST_TINY,      /* tiny magnitudes (f16: subnormals 2^-20..2^-12; f32/bf16: 2^-41..2^-36) */
    PT_DISTS
};
const char *pt_dist_name(int dist);

/* Fills count elements of a tensor (dtype) from distribution dist; `seed` and `tensor` (which tensor
 * of the case) select an independent PRNG stream. */
void pt_fill(uint64_t seed, int tensor, int dist, moe_dtype dtype, void *buf, int64_t count);

/* Round a double once to float32 and then to dtype, returned as double. */
double pt_round_to(moe_dtype dtype, double v);

#endif /* LIBMOE_PT_GEN_H */
