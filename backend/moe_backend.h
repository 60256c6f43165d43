/*
 * The contract between the front end (src/, every public moe_* entry point) and the backends (ref/, the
 * reference; gpu/, CUDA): error recording, the validated problem descriptions handed to a backend, and the
 * backend table (moe_dispatch) through which every op runs.  src/ includes this header and no backend's;
 * ref/ and gpu/ include it and neither each other nor src/.
 *
 * Kernel contract (every backend, every op):
 *   - The front end (src/gemm_api.c) has validated every dimension, pointer, option and (for host
 *     backends) the routing contents before a backend function runs.  Backends re-check only what they
 *     alone can see (device-side routing contents).
 *   - Without `accumulate`, an output is overwritten and never read.  With `accumulate`, each output
 *     element becomes round(old + result), the addition in float32.
 *   - Every output element is written exactly once per call by exactly one thread; results do not
 *     depend on the thread count or on scheduling.
 */
#ifndef LIBMOE_INTERNAL_H
#define LIBMOE_INTERNAL_H

#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "moe.h"
#include "moe_fp8.h"
#include "moe_mlp.h"

#include <stdint.h>

#ifdef __FRAMAC__
/* Frama-C only: the thread-local last-error message of src/errors.c, as one abstract ghost location, so
 * that contracts can say which functions may change it (specs/README.md). */
/*@ ghost int moe_error_model; */
#endif

/* Records a formatted message for moe_last_error() and returns `status`.  The message is prefixed with
 * the function that failed; file and line go into the message when MOE_DEBUG_LOCATIONS is set. */
/*@ terminates \true;
    assigns moe_error_model \from status;
    ensures returns_status: \result == status; */
moe_status moe_fail_at(const char *file, int line, moe_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
#define moe_fail(status, ...) moe_fail_at(__FILE__, __LINE__, (status), __VA_ARGS__)

/* Clears the last error of this thread (called on entry of every public function). */
/*@ terminates \true;
    assigns moe_error_model; */
void moe_clear_error(void);

/* Multiplies non-negative int64 values, failing (returns 0 and leaves *out alone) on overflow. */
/*@ requires out_valid: \valid(out);
    terminates \true;
    assigns *out \from a, b;
    behavior fits:
      assumes 0 <= a && 0 <= b && a * b <= INT64_MAX;
      ensures ok: \result == 1 && *out == a * b;
    behavior fails:
      assumes a < 0 || b < 0 || a * b > INT64_MAX;
      assigns \nothing;
      ensures failed: \result == 0;
    complete behaviors;
    disjoint behaviors; */
int moe_mul_ok(int64_t a, int64_t b, int64_t *out);

/* One array argument of an entry point, for the checks every entry point shares. */
typedef struct moe_array_arg {
    const char *name;   /* as the caller knows it, for messages ("x", "routing.gather_indices") */
    const void *data;
    int64_t rows;
    int64_t cols;
    moe_dtype dtype;    /* element type (ignored for index arrays) */
    int is_output;
    int is_index;       /* an int64 index array */
} moe_array_arg;

/* Checks that each array's byte size is representable, that no array with elements is NULL, that each
 * non-NULL array is aligned to its element size (MOE_ERR_MISALIGNED; a CUDA kernel's load of a misaligned
 * element faults and poisons the context), and that no output overlaps any other array (a kernel never reads
 * what it overwrites).  count <= 32. */
moe_status moe_check_arrays(const char *op, const moe_array_arg *args, int count);
/* MOE_ERR_MISALIGNED (naming op, name and type) unless data is a multiple of element_size (NULL is): also for
 * the index arrays a front end reads on the host before moe_check_arrays sees them.  Contract stated, not
 * proved (src/arrays.c is not in specs/verify.sh's list; its test is by the callers' tests). */
/*@ terminates \true;
    assigns moe_error_model;
    ensures status: \result == MOE_OK || \result == MOE_ERR_MISALIGNED; */
moe_status moe_check_aligned(const char *op, const char *name, const void *data, int64_t element_size,
                             const char *type);

/* A grouped GEMM call after validation.  Row counts and dimensions are all >= 0 and every product of
 * them used for indexing fits in int64 and in size_t bytes. */
typedef struct moe_gemm_problem {
    const char *op;                 /* "moe_gemm_fwd", ... for messages */
    int64_t num_tokens;             /* T */
    int64_t topk;                   /* k */
    int64_t num_experts;            /* E */
    int64_t rows;                   /* M = T*k */
    int64_t N;                      /* output features of the forward */
    int64_t K;                      /* input features of the forward */
    const int64_t *m_sizes;         /* [E] */
    const int64_t *gather_indices;  /* [M] or NULL */
    moe_dtype dtype;
    moe_dtype dw_dtype;             /* dtype of dW / d_topk_weights: dtype, or MOE_F32 with dw_fp32 */
    int permute_x;
    int permute_y;
    int reduce_topk;
    int accumulate;
    int allow_tf32;
    void *stream;
    int64_t ref_scratch_bytes;      /* >= 1: options.ref_scratch_bytes, its default filled in */
} moe_gemm_problem;

/* A validated FP8 grouped GEMM call (include/moe_fp8.h): g as for the other dtypes, with g.dtype the output
 * dtype (MOE_F32 or MOE_BF16); the operands' FP8 dtypes are in their moe_fp8_tensor. */
typedef struct moe_fp8_problem {
    moe_gemm_problem g;
    moe_fp8_scale_format scale_format;
    int w_transposed; /* dX: w is W^T per expert, codes [E][K][N], scales [E][ceil(K/128)][ceil(N/128)] */
    int codes_transposed; /* dW: x's codes [K][M], dy's [N][M] (moe_quantize_fp8_columns_transposed's) */
} moe_fp8_problem;

/* A validated FP8 quantization (moe_quantize_fp8_rows / _blocks) or dequantization (moe_dequantize_fp8):
 * `wide` is the full-precision side (src of a quantization, out of a dequantization), [batches][rows][cols];
 * the codes have its shape, the scales [batches][ceil(rows / tile_rows)][ceil(cols / 128)].  Every product
 * of the extents fits in int64 and in size_t bytes. */
typedef struct moe_fp8_quantize_problem {
    const char *op;
    moe_dtype wide_dtype;              /* MOE_F32 or MOE_BF16 */
    moe_dtype fp8_dtype;               /* MOE_E4M3 or MOE_E5M2 */
    moe_fp8_scale_format scale_format;
    int tile_rows;                     /* 1 (rows) or 128 (blocks) */
    int64_t batches, rows, cols;
    void *stream;                      /* MOE_BACKEND_CUDA: the cudaStream_t */
} moe_fp8_quantize_problem;

/* A validated moe_quantize_fp8_columns call: g holds the routing (rows, experts, topk, m_sizes,
 * gather_indices, host or device pointers as the backend takes them) with g.N = cols and g.K = 0; the source
 * rows are where `source` says, the codes [g.rows][cols] ([cols][g.rows] with transposed) and the scales
 * [moe_fp8_column_scale_rows(g.rows, g.num_experts)][cols]. */
typedef struct moe_fp8_columns_problem {
    moe_gemm_problem g;
    moe_dtype src_dtype;               /* MOE_F32 or MOE_BF16 */
    moe_dtype fp8_dtype;               /* MOE_E4M3 or MOE_E5M2 */
    moe_fp8_scale_format scale_format;
    moe_fp8_row_source source;
    int transposed;                    /* moe_quantize_fp8_columns_transposed: codes [cols][g.rows] */
} moe_fp8_columns_problem;

/* A validated MLP call. */
typedef struct moe_mlp_problem {
    const char *op;
    int64_t T;                 /* tokens */
    int64_t E;                 /* experts */
    int64_t N;                 /* blocks */
    int64_t B;                 /* block size (resolved: never 0) */
    int64_t H;
    int64_t I;
    int64_t token_rows;        /* rows of hidden/out/out_grad/d_hidden: T, or T + 1 with MOE_MLP_PAD_ROW */
    const int64_t *block_to_expert;
    const int64_t *token_position_to_id;
    moe_dtype dtype;           /* every tensor but the weight/bias gradients */
    moe_dtype grad_dtype;      /* d_w_gu, d_w_d, d_b_gu, d_b_d */
    moe_mlp_activation activation;
    moe_mlp_affinity affinity;
    int bias;
    int accumulate;
    int has_lin_lo, has_lin_hi, has_nl_lo, has_nl_hi;
    float lin_lo, lin_hi, nl_lo, nl_hi;
    int overwrite;             /* options.tensor_update_overwrite (checked by the layout check) */
    int round_intermediates;   /* a 16-bit dtype without options.float32_intermediates (0 for f32) */
    moe_mlp_padding padding;
    void *stream;              /* MOE_BACKEND_CUDA: the cudaStream_t */
} moe_mlp_problem;

/* A device build of moe_routing_build after validation (dimensions, pointers, overlaps). */
typedef struct moe_routing_problem {
    const char *op;
    int64_t T, k, E;
    void *stream;
} moe_routing_problem;

/* A build of moe_mlp_layout_build_on after validation (dimensions, capacity, pointers, overlaps). */
typedef struct moe_layout_problem {
    const char *op;
    moe_mlp_layout_kind kind;
    int64_t T, k, E;
    int64_t B;                 /* block size (resolved) */
    int64_t num_blocks;        /* the capacity: at least moe_mlp_layout_max_blocks */
    moe_mlp_padding padding;
    int64_t pad;               /* the padding mark: -1, or T with MOE_MLP_PAD_ROW */
    moe_dtype dtype;           /* of topk_weights and affinities */
    void *stream;
} moe_layout_problem;

/* One backend's implementation of each op: a row per op, as BLIS's context.  Every table fills every row
 * (tests/test_tables checks each table built in): the reference's (ref/ref_backend.c) on host
 * pointers, the CUDA one (gpu/cuda_backend.cu) on device pointers.  Arguments have the shapes documented in
 * moe.h and moe_mlp.h.  Adding an op: a row here, its entry point in src/, and a function in each table. */
typedef struct moe_dispatch {
    const char *name;
    int (*available)(void);
    moe_status (*gemm_fwd)(const moe_gemm_problem *p, const void *x, const void *w,
                           const void *topk_weights, void *y);
    moe_status (*gemm_dx)(const moe_gemm_problem *p, const void *dy, const void *w,
                          const void *topk_weights, void *dx);
    moe_status (*gemm_dw)(const moe_gemm_problem *p, const void *x, const void *dy,
                          const void *topk_weights, void *dw);
    moe_status (*gemm_topk_weights_grad)(const moe_gemm_problem *p, const void *x, const void *w,
                                         const void *dy, void *d_topk_weights);
    moe_status (*mlp_fwd)(const moe_mlp_problem *p, const void *hidden, const void *affinities, const void *w_gu,
                          const void *w_d, const void *b_gu, const void *b_d, void *out, void *gate_up_ckpt_T,
                          void *down_ckpt);
    moe_status (*mlp_bwd)(const moe_mlp_problem *p, const void *hidden, const void *affinities, const void *w_gu,
                          const void *w_d, const void *b_d, const void *gate_up_ckpt_T, const void *down_ckpt,
                          const void *out_grad, void *d_hidden, void *d_affinities, void *d_w_gu, void *d_w_d,
                          void *d_b_gu, void *d_b_d);
    /* The host row (validates_routing_on_host) is moe_routing_from_topk, which validates everything itself; a
     * device row gets arrays checked by the front end, whose contents it checks on the device. */
    moe_status (*routing_build)(const moe_routing_problem *p, const int64_t *topk_ids, int64_t *m_sizes,
                                int64_t *gather_indices, int64_t *scatter_indices);
    /* Fills all p->num_blocks blocks: those past the routing's own count hold expert E-1 and only padding;
     * *num_blocks_used (when not NULL) receives that count. */
    moe_status (*mlp_layout_build)(const moe_layout_problem *p, const int64_t *topk_ids, const void *topk_weights,
                                   int64_t *block_to_expert, int64_t *token_position_to_id, void *affinities,
                                   int64_t *num_dropped, int64_t *num_blocks_used);
    /* FP8 grouped GEMM (include/moe_fp8.h): a = x (fwd) or dy (dX), b = w; topk_weights float32 */
    moe_status (*gemm_fp8_fwd)(const moe_fp8_problem *p, const moe_fp8_tensor *x, const moe_fp8_tensor *w,
                               const float *topk_weights, void *y);
    moe_status (*gemm_fp8_dx)(const moe_fp8_problem *p, const moe_fp8_tensor *dy, const moe_fp8_tensor *w,
                              const float *topk_weights, void *dx);
    /* FP8 dW (include/moe_fp8.h): x [M][K] and dy [M][N] in expert-row order, 128 x 1 tiles per expert */
    moe_status (*gemm_fp8_dw)(const moe_fp8_problem *p, const moe_fp8_tensor *x, const moe_fp8_tensor *dy,
                              void *dw);
    /* The 128 x 1 quantizer of dW's operands (moe_quantize_fp8_columns); checks the source's values itself */
    moe_status (*fp8_quantize_columns)(const moe_fp8_columns_problem *p, const void *src, const float *topk_weights,
                                       void *q, void *scales);
    /* FP8 quantization and its inverse (include/moe_fp8.h).  quantize checks the source's values itself (a
     * NaN or Inf: nothing written); dequantize gets scales the front end checked when the backend takes host
     * pointers, and checks them itself otherwise. */
    moe_status (*fp8_quantize)(const moe_fp8_quantize_problem *p, const void *src, void *q, void *scales);
    moe_status (*fp8_dequantize)(const moe_fp8_quantize_problem *p, const void *q, const void *scales, void *out);
    /* Non-zero: the front end checks routing contents on the host before calling (host pointers). */
    int validates_routing_on_host;
    /* Waits for the backend's queued work on `stream` and reports errors detected there (NULL: the
     * backend runs synchronously and reports every error from the call itself). */
    moe_status (*synchronize)(void *stream);
} moe_dispatch;

/* The table of a backend, or NULL if it was not built in. */
const moe_dispatch *moe_dispatch_for(moe_backend backend);

/* The reference table (ref/), always present. */
extern const moe_dispatch moe_ref_dispatch;
#ifdef MOE_HAVE_CUDA
/* The CUDA table (gpu/), present when configured with CUDA. */
extern const moe_dispatch moe_cuda_dispatch;
#endif

/* Autotuning (src/autotune.c).  A tuned kernel choice is keyed by the device and the problem as the CUDA
 * backend plans it (gpu/gemm/plan.cu, plan_gemm). */
typedef enum moe_tune_kernel { MOE_TUNE_SIMT = 0, MOE_TUNE_SM80 = 1, MOE_TUNE_SM90 = 2 } moe_tune_kernel;

#define MOE_TUNE_DEVICE_CHARS 80

typedef struct moe_tune_key {
    char device[MOE_TUNE_DEVICE_CHARS]; /* device name as CUDA reports it, NUL-terminated, no '|' */
    int op;                 /* moe_gemm_op: MOE_GEMM_FWD, MOE_GEMM_DX, MOE_GEMM_DW */
    moe_dtype dtype;        /* the inputs' dtype */
    moe_dtype out_dtype;    /* the output's dtype */
    int permute_x, permute_y, reduce_topk, weighted, allow_tf32; /* 0 or 1 each */
    int64_t E, M, N, K;     /* experts, rows T*k, the forward's N and K */
} moe_tune_key;

typedef struct moe_tune_choice {
    moe_tune_kernel kernel;
    int tile_rows;          /* sm90: 128 or 256 (dW: 128); other kernels: their fixed tile rows */
    int cluster;            /* 1, or 2 (sm90 fwd/dX with 128-row tiles) */
    int tma_store;          /* 0 or 1 */
    int dw_pingpong;        /* sm90 dW with every operand and a 16-bit output by TMA: 1 the ping-pong kernel
                             * (128 x 128 tiles), 0 the 128 x 256 kernel, -1 the rule decides (gpu/gemm/heuristics.cu,
                             * sm90_dw_pingpong); recorded plans hold 0 where the ping-pong kernel does not apply */
    double median_us;       /* measured time of one call, >= 0 */
} moe_tune_choice;

/* Non-zero when the process table holds an entry (a cheap test before building a key). */
int moe_tune_table_used(void);
/* Copies the entry of key into *choice and returns 1, or returns 0 when there is none.  Thread-safe. */
int moe_tune_lookup(const moe_tune_key *key, moe_tune_choice *choice);
/* Adds or replaces the entry of key.  Thread-safe. */
moe_status moe_tune_store(const moe_tune_key *key, const moe_tune_choice *choice);
/* One cache-file line (no newline) of an entry: "libmoe-tune 2|device|op|dtype|..." (src/autotune.c). */
void moe_tune_format_line(const moe_tune_key *key, const moe_tune_choice *choice, char *line, size_t size);
/* Parses one cache-file line (version 2, or version 1, which has no dw_pingpong field: -1) into key and
 * choice; on failure returns 0 and writes why (naming the field) into why[why_size]. */
int moe_tune_parse_line(const char *line, moe_tune_key *key, moe_tune_choice *choice, char *why, size_t why_size);

#ifdef MOE_HAVE_CUDA
/* gpu/gemm/tune.cu: the configuration the CUDA GEMM calls of this thread must use instead of the table
 * and the heuristic (NULL: none), and the key and configuration the most recent call of this thread
 * planned (returns 0 when this thread has planned no call). */
void moe_cuda_tune_force(const moe_tune_choice *choice);
int moe_cuda_tune_last(moe_tune_key *key, moe_tune_choice *choice);
/* Times run(context, c) for each candidate c in [0, candidates) on the stream with CUDA events: one untimed
 * call of each, then `repeats` rounds that each run every candidate once in turn, the L2 flushed before
 * every timed call; writes each candidate's median microseconds to median_us[c].  Returns the first failing
 * status of run or of a CUDA call. */
moe_status moe_cuda_time_rounds(void *stream, moe_status (*run)(void *context, int candidate), void *context,
                                int candidates, int repeats, double *median_us);
#endif

#endif /* LIBMOE_INTERNAL_H */
