/* Grouped GEMM cases for the properties (pt_gemm.c, pt_gemm_meta.c, pt_gpu.c). */
#ifndef LIBMOE_PT_GEMM_H
#define LIBMOE_PT_GEMM_H

#include "pt.h"
#include "pt_gen.h"

/* Which op a case exercises. */
enum gop { GOP_FWD, GOP_DX, GOP_DW, GOP_DTOPK, GOPS };

/* One generated grouped GEMM problem (host memory). */
typedef struct gcase {
    int64_t T, k, E, N, K, M;
    int routing_kind, shape_kind, dist;
    int weighted;                 /* topk weights fused */
    moe_gemm_options opt;         /* dtype and mode flags */
    int64_t *ids;                 /* [M] topk ids (NULL for an arbitrary routing) */
    int64_t *m_sizes, *gather;    /* [E], [M] */
    moe_routing r;                /* gather_indices may be NULL when nothing needs it */
    uint64_t value_seed;
    void *x;                      /* [X rows][K]: T rows with permute_x, else M */
    void *w;                      /* [E][N][K] */
    void *dy;                     /* [M][N] */
    void *tw;                     /* [M] or NULL */
    int split_backend;            /* checked against the CUDA backend: the bound of oracle_gemm_dw_split */
} gcase;

/* Restrictions a property puts on the generator. */
enum {
    GEN_NEED_IDS = 1,       /* a routing from topk ids (not an arbitrary permutation) */
    GEN_EXACT = 2,          /* exact values only */
    GEN_GPU = 4             /* shapes the CUDA backend accepts (N, K multiples of 8) */
};

/* Draws a case; the mode flags of opt are drawn too (the caller may override them afterwards and call
 * gcase_fill_values again).  Describes it in c->desc. */
void gcase_generate(pt_case *c, gcase *g, int restrictions);
/* (Re)allocates and fills x, w, dy, tw for the current flags. */
void gcase_fill_values(gcase *g);
void gcase_free(gcase *g);
void gcase_describe(pt_case *c, const gcase *g);

int64_t gcase_x_rows(const gcase *g);
int64_t gop_out_count(const gcase *g, enum gop op);
moe_dtype gop_out_dtype(const gcase *g, enum gop op);
const char *gop_name(enum gop op);

/* Calls the library (host pointers; for CUDA see pt_gpu.c). */
moe_status gop_call(const gcase *g, enum gop op, moe_backend backend, void *out);
/* The oracle's value and bound for op; `old` is the output's prior contents (accumulate). */
void gop_oracle(const gcase *g, enum gop op, const void *old, double *value, double *bound);

/* Checks out (host, op's dtype) against the oracle within its bound; with exact values also that every
 * element is exactly the oracle value rounded once.  `what` labels the messages. */
void gop_check(pt_case *c, const gcase *g, enum gop op, const void *old, const void *out, const char *what);

/* Allocates an output buffer of op: poisoned with NaN, or with accumulate filled with prior contents
 * (copied to *old, which the caller frees). */
void *gop_output(const gcase *g, enum gop op, void **old);

/* memcmp of two outputs of op, reporting the first differing element. Returns 1 when equal. */
int gop_same_bits(pt_case *c, const gcase *g, enum gop op, const void *a, const void *b, const char *tag,
                  const char *what);

#endif /* LIBMOE_PT_GEMM_H */
