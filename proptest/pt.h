/*
 * The property-testing engine of moe-fuzz (proptest/README.md, specs/PROPTEST.md).
 *
 * Design: a test case is a function of a "choice stream".  Generators never call a random number
 * generator directly; they ask the stream for a bounded integer (pt_draw).  A fresh case records every
 * answer it got from a seeded PRNG; a replayed case reads the recorded answers back.  So a case is
 * fully described by (op, size, choices), and shrinking is done on the choice sequence alone:
 * delete, zero, halve and decrement choices, re-run the case, keep the change when the case still
 * fails the same way.  Generators are written so that smaller choices mean simpler cases and the
 * all-zero stream is the smallest one (T = 0, E = 1, k = 1, N = K = 0, f32, no options, exact values).
 * Reading past the end of a replayed stream gives zeros, so deleting choices is always well defined.
 *
 * `size` (0..100) grows over a run and caps the dimensions the generators draw; it is part of every
 * reproducer because the same choices mean a bigger case at a bigger size.
 */
#ifndef LIBMOE_PT_H
#define LIBMOE_PT_H

#include "moe.h"
#include "alloc.h" /* xmalloc, xcalloc */

#include <stddef.h>
#include <stdint.h>

/* ---- PRNG: xoshiro256** seeded through splitmix64 ---- */
typedef struct pt_rng {
    uint64_t s[4];
} pt_rng;
void pt_rng_seed(pt_rng *rng, uint64_t seed);
uint64_t pt_rng_next(pt_rng *rng);
/* splitmix64 of x: mixes a seed and a counter into an independent seed */
uint64_t pt_mix(uint64_t x);

/* ---- the choice stream ---- */
#define PT_MAX_SIZE 100
#define PT_MAX_CHOICES 65536 /* a case that needs more is discarded ("overrun") */

typedef struct pt_source {
    int replay;           /* 0: answers come from rng and are recorded; 1: answers are read from `given` */
    pt_rng rng;
    const uint64_t *given; /* replay: the choices to read */
    size_t given_count;
    uint64_t *used;        /* the answers actually returned (after clamping), in order */
    size_t count, cap;
    int size;              /* 0..PT_MAX_SIZE */
    int overrun;           /* more than PT_MAX_CHOICES draws */
} pt_source;

/* An answer in [0, max]; max >= 0.  Replay clamps a recorded value above max to max. */
uint64_t pt_draw(pt_source *src, uint64_t max);
/* Helpers on top of pt_draw. */
int64_t pt_int(pt_source *src, int64_t lo, int64_t hi);          /* lo..hi inclusive, hi >= lo */
int64_t pt_sized(pt_source *src, int64_t lo, int64_t hi_at_max); /* lo..lo+(hi-lo)*size/100 */
int pt_bool(pt_source *src);                                     /* 0 or 1 */
int pt_pick(pt_source *src, int n);                              /* 0..n-1 */
/* A permutation of [0, n) (Fisher-Yates on drawn indices; the all-zero stream gives the identity). */
void pt_permutation(pt_source *src, int64_t n, int64_t *perm);

/* ---- one case: what a property reports ---- */
enum pt_outcome { PT_PASS = 0, PT_FAIL = 1, PT_DISCARD = 2 };

typedef struct pt_case {
    pt_source *src;
    moe_backend backend;
    int outcome;          /* enum pt_outcome */
    char tag[48];         /* which property failed first (shrinking keeps the same tag) */
    char msg[6144];       /* what failed: element, values, bound */
    size_t msg_len;
    double worst_ratio;   /* max over checks of |error| / bound (0 when nothing was compared) */
    char desc[768];       /* one line: the case's shape, dtype, options */
} pt_case;

/* Records a failure (the first tag wins; messages append up to the buffer's size). */
void pt_fail(pt_case *c, const char *tag, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Marks the case as not applicable (e.g. a CUDA-only shape constraint the generator did not meet). */
void pt_discard(pt_case *c, const char *why);
void pt_ratio(pt_case *c, double ratio);
/* Appends to c->desc. */
void pt_describe(pt_case *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Bounds of the generators' draws. */
static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* ---- ops ---- */
typedef struct pt_op {
    const char *name;
    const char *help;
    int cuda;                    /* runs with --backend cuda (1) or --backend ref (0) */
    void (*run)(pt_case *c);
} pt_op;

/* The op table (pt_gemm.c, pt_mlp.c).  Terminated by a NULL name. */
extern const pt_op pt_ops[];
const pt_op *pt_find_op(const char *name);

/* ---- reproducers ----
 *   OP:SIZE:s=SEED           a fresh case: the stream of PRNG seed SEED (hex) at size SIZE
 *   OP:SIZE:c=V.V.V...       a recorded choice sequence (hex values separated by dots; "c=" is empty)
 * pt_format_repro writes one of them into buf (malloc'd, caller frees). */
char *pt_format_repro(const char *op, int size, int has_seed, uint64_t seed, const uint64_t *choices,
                      size_t count);
/* Parses a reproducer; *choices is malloc'd (NULL for a seed reproducer).  Returns 0 on success, or -1
 * with a message in err. */
int pt_parse_repro(const char *line, char *op, size_t op_cap, int *size, int *has_seed, uint64_t *seed,
                   uint64_t **choices, size_t *count, char *err, size_t err_cap);

/* Shortlex order of choice sequences: shorter first, then lexicographic. */
int pt_shortlex_less(const uint64_t *a, size_t na, const uint64_t *b, size_t nb);

#endif /* LIBMOE_PT_H */
