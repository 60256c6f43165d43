/*
 * libmoe: Mixture-of-Experts grouped GEMM (forward, dX, dW) with a CPU reference and CUDA kernels.
 *
 * The exact math of every operation is written in specs/SEMANTICS.md (sections 1, 2 and 4); this
 * header names the shapes and the contract of each entry point.  Notation used in every comment:
 *
 *   T  tokens            k  experts per token (topk)     E  experts
 *   M = T*k routed rows ("slots"); slot s = t*k + j is token t's j-th choice.
 *   W  is [E][N][K] row-major; for an expert-order row r of expert e, y_r = xsrc_r . W[e]^T (length N).
 *
 * Conventions
 *   - Every tensor is dense, row-major (C order), of the call's dtype (options.dtype), except where a
 *     comment says otherwise.  f16 and bf16 tensors are arrays of uint16_t bit patterns.
 *   - Accumulation is float32; each output element is rounded once (round to nearest even) to its dtype.
 *   - All indices and sizes are int64_t.
 *   - Backend MOE_BACKEND_REF takes host pointers; MOE_BACKEND_CUDA takes device pointers (tensors AND
 *     the routing arrays) and runs on options.stream.
 *   - Every entry point validates its arguments before touching any output.  On failure it returns a
 *     status other than MOE_OK, leaves every output untouched and records a message for
 *     moe_last_error() naming the argument, the index and what was expected.
 *   - Outputs are overwritten (never read) unless options.accumulate is set, in which case the result is
 *     added to the existing contents in float32 and rounded once.
 */
#ifndef LIBMOE_MOE_H
#define LIBMOE_MOE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LIBMOE_VERSION_MAJOR 0
#define LIBMOE_VERSION_MINOR 1
#define LIBMOE_VERSION_PATCH 0

/* ----------------------------------------------------------------------------------------------------
 * Status codes and error messages
 * -------------------------------------------------------------------------------------------------- */
typedef enum moe_status {
    MOE_OK = 0,
    MOE_ERR_NULL_POINTER = 1,     /* a required pointer is NULL (with a non-empty extent) */
    MOE_ERR_INVALID_SHAPE = 2,    /* a dimension is negative or inconsistent with another */
    MOE_ERR_OVERFLOW = 3,         /* a product of dimensions is not representable in int64 / size_t */
    MOE_ERR_INVALID_ROUTING = 4,  /* m_sizes negative or not summing to T*k; gather_indices not a permutation */
    MOE_ERR_INVALID_DTYPE = 5,    /* unknown dtype value */
    MOE_ERR_INVALID_OPTION = 6,   /* an option is unknown or an option combination is meaningless */
    MOE_ERR_UNSUPPORTED = 7,      /* valid request this backend cannot do (e.g. CUDA with N % 8 != 0) */
    MOE_ERR_NO_BACKEND = 8,       /* the backend was not built in, or no device is present */
    MOE_ERR_OUT_OF_MEMORY = 9,    /* a workspace allocation failed */
    MOE_ERR_DEVICE = 10,          /* a CUDA call failed; moe_last_error() has the CUDA message */
    MOE_ERR_INVALID_INDEX = 11,   /* an index array holds a value out of its range */
    MOE_ERR_IO = 12,              /* a file could not be opened, read or written, or is malformed */
    MOE_ERR_MISALIGNED = 13,      /* an array's address is not a multiple of its element size */
    MOE_ERR_INVALID_VALUE = 14    /* an element is outside its domain (an FP8 scale not finite and > 0, a
                                     non-finite value to quantize) */
} moe_status;

/* A short constant description of a status code ("invalid routing", ...). Never NULL. */
const char *moe_strerror(moe_status status);

/* The detailed message of the most recent failure in this thread (e.g. "moe_gemm_fwd: routing.m_sizes[3]
 * = -2, expected >= 0"), or "" if the last call in this thread succeeded.  Valid until the next call of
 * a libmoe function in the same thread. */
const char *moe_last_error(void);

/* ----------------------------------------------------------------------------------------------------
 * Dtypes
 * -------------------------------------------------------------------------------------------------- */
typedef enum moe_dtype {
    MOE_F32 = 0,   /* IEEE binary32 */
    MOE_F16 = 1,   /* IEEE binary16, stored as uint16_t */
    MOE_BF16 = 2,  /* bfloat16 (upper half of binary32), stored as uint16_t */
    MOE_E4M3 = 3,  /* OCP FP8 E4M3 ("e4m3fn"), stored as uint8_t: bias 7, no Inf, NaN = S.1111.111, max 448;
                      only the FP8 entry points take it (specs/FP8.md) */
    MOE_E5M2 = 4   /* OCP FP8 E5M2, stored as uint8_t: bias 15, IEEE-like (Inf, NaN), max 57344; FP8 only */
} moe_dtype;

/* Bytes per element of a dtype, or 0 for an unknown dtype value. */
size_t moe_dtype_size(moe_dtype dtype);
/* "f32", "f16", "bf16", "e4m3", "e5m2", or "?" */
const char *moe_dtype_name(moe_dtype dtype);
/* The dtype of a name: moe_dtype_name's five, or the aliases "float32", "fp32", "float16", "fp16",
 * "bfloat16", "float8_e4m3fn" and "float8_e5m2" (torch's names) (exact, case-sensitive).  Sets *dtype and returns MOE_OK; MOE_ERR_NULL_POINTER when name or dtype
 * is NULL, MOE_ERR_INVALID_DTYPE (the message quotes the name) for any other name; *dtype is then unchanged. */
moe_status moe_dtype_from_name(const char *name, moe_dtype *dtype);

/* Conversions.  float -> 16-bit rounds to nearest even, overflows to +-Inf, keeps NaN a (quiet) NaN and
 * keeps the sign of zero; 16-bit -> float is exact. */
uint16_t moe_f32_to_bf16(float value);
float moe_bf16_to_f32(uint16_t bits);
uint16_t moe_f32_to_f16(float value);
float moe_f16_to_f32(uint16_t bits);

/* FP8 conversions (OCP 8-bit floating point).  fp8 -> float is exact.  float -> fp8 rounds to nearest
 * even and saturates: a finite value beyond the largest finite (448 for e4m3, 57344 for e5m2) and +-Inf
 * give +-max (as PTX's cvt.rn.satfinite), so e5m2's Inf is never produced; NaN gives NaN (0x7f with the
 * sign bit of the input, a NaN in both formats); the sign of zero is kept; values below half the smallest
 * subnormal (2^-10 for e4m3, 2^-17 for e5m2) give a signed zero. */
uint8_t moe_f32_to_e4m3(float value);
float moe_e4m3_to_f32(uint8_t bits);
uint8_t moe_f32_to_e5m2(float value);
float moe_e5m2_to_f32(uint8_t bits);

/* Unit roundoff of a dtype: 2^-24 (f32), 2^-11 (f16), 2^-8 (bf16), 2^-4 (e4m3), 2^-3 (e5m2); 0 for an
 * unknown dtype. */
double moe_dtype_unit_roundoff(moe_dtype dtype);

/* ----------------------------------------------------------------------------------------------------
 * Routing (SEMANTICS section 1)
 * -------------------------------------------------------------------------------------------------- */
typedef struct moe_routing {
    int64_t num_tokens;             /* T >= 0 */
    int64_t topk;                   /* k >= 1 (k >= 0 accepted when T == 0) */
    int64_t num_experts;            /* E >= 1 */
    const int64_t *m_sizes;         /* [E]  rows per expert; m_e >= 0, sum m_e == T*k */
    const int64_t *gather_indices;  /* [T*k] expert-order row r holds slot gather_indices[r]; a
                                       permutation of [0, T*k).  May be NULL when the call fuses no
                                       permutation, no topk weights and no reduce_topk. */
} moe_routing;

/* Builds a routing from topk_ids[T][k] (values in [0, E)):
 *   m_sizes[E]            out: slots per expert
 *   gather_indices[T*k]   out: the stable sort of the flattened topk_ids by expert
 *   scatter_indices[T*k]  out (may be NULL): the inverse permutation, scatter[gather[r]] = r
 * Host pointers.  Fails with MOE_ERR_INVALID_INDEX (naming t, j and the value) when an id is out of
 * range; then nothing is written.  The arrays must not overlap (the proof of the sort, ref/routing.c
 * moe_ref_counting_sort, assumes it): an overlap fails with MOE_ERR_INVALID_OPTION, an array not aligned to
 * 8 bytes with MOE_ERR_MISALIGNED, both before any array is read. */
moe_status moe_routing_from_topk(int64_t num_tokens, int64_t topk, int64_t num_experts,
                                 const int64_t *topk_ids, int64_t *m_sizes, int64_t *gather_indices,
                                 int64_t *scatter_indices);

/* Checks a caller-made host routing: dimensions, m_e >= 0, sum m_e == T*k, and (when require_gather is
 * non-zero, or gather_indices is non-NULL) that gather_indices is a permutation of [0, T*k).
 * Allocates a T*k-byte scratch set for the permutation check (MOE_ERR_OUT_OF_MEMORY if that fails). */
moe_status moe_routing_validate(const moe_routing *routing, int require_gather);

/* ----------------------------------------------------------------------------------------------------
 * Backends
 * -------------------------------------------------------------------------------------------------- */
typedef enum moe_backend {
    MOE_BACKEND_REF = 0,   /* the CPU reference (always present) */
    MOE_BACKEND_CUDA = 1   /* CUDA kernels (present when built --with-cuda and a device is visible) */
} moe_backend;

/* Non-zero when the backend was built in and can run here (CUDA: at least one device visible). */
int moe_backend_available(moe_backend backend);

/* Waits until the work queued on `stream` (a cudaStream_t, NULL = default stream) is done and returns
 * the first error the device detected since the previous call, then forgets it.  The CUDA backend
 * checks routing contents (m_sizes, gather_indices) on the device without synchronising the host: a
 * call with an invalid routing returns MOE_OK, writes nothing and records the error, which this call
 * reports as MOE_ERR_INVALID_ROUTING with the offending index.  For the reference backend (synchronous,
 * every error returned by the call itself) this returns MOE_OK at once. */
moe_status moe_backend_synchronize(moe_backend backend, void *stream);
const char *moe_backend_name(moe_backend backend);

/* moe_routing_from_topk on a backend: MOE_BACKEND_REF runs it on host arrays (stream ignored);
 * MOE_BACKEND_CUDA builds the same outputs, bit for bit, from device arrays on `stream` (a cudaStream_t,
 * NULL = default) without waiting and without a host round trip.  The ids are checked on the device: an
 * id out of range makes the call write nothing, and moe_backend_synchronize(MOE_BACKEND_CUDA, stream)
 * reports MOE_ERR_INVALID_INDEX naming the first one (t, j, value).  The arrays must not overlap. */
moe_status moe_routing_build(moe_backend backend, int64_t num_tokens, int64_t topk, int64_t num_experts,
                             const int64_t *topk_ids, int64_t *m_sizes, int64_t *gather_indices,
                             int64_t *scatter_indices, void *stream);

/* ----------------------------------------------------------------------------------------------------
 * Grouped GEMM (SEMANTICS section 2)
 *
 * Shapes, with R_x = (permute_x ? T : M) and every row index below expert-order unless stated:
 *   fwd:  X [R_x][K], W [E][N][K]                       -> Y [M][N]  (row r, or slot row g_r if permute_y)
 *   dX:   dY [M][N] (slot order if permute_y), W        -> dX [M][K] (row r, or slot row g_r if permute_x)
 *                                                          or [T][K] with reduce_topk
 *   dW:   X [R_x][K], dY [M][N]                         -> dW [E][N][K]
 *   topk_weights [M] in slot order, the call's dtype; when given (non-NULL), expert-order row r is scaled
 *   by topk_weights[g_r] (fwd: the output row; dX and dW: the dY source row), in float32, before the
 *   single rounding.  Requires routing.gather_indices.
 * -------------------------------------------------------------------------------------------------- */
typedef struct moe_gemm_options {
    moe_dtype dtype;      /* dtype of every tensor argument (X, W, dY, topk_weights, Y, dX, dW) */
    int dw_fp32;          /* dW (and d_topk_weights) written as float32 instead of `dtype`; fwd and dX
                             write no such output and do not read it (one options struct may serve a
                             layer's calls); the options of other ops are refused where they do not apply */
    int permute_x;        /* forward gathered X on load: X is token order [T][K], row r reads X[g_r / k] */
    int permute_y;        /* forward scattered Y on store: Y and dY are slot order, row r is at g_r */
    int reduce_topk;      /* dX: write [T][K] with dX[t] = sum_j dXslot[t*k + j] (needs gather_indices) */
    int accumulate;       /* add the result into every output of the call instead of overwriting */
    int allow_tf32;       /* CUDA, f32 only: allow TF32 tensor cores for every GEMM op (fwd, dX, dW, the
                           * topk-weight gradient; default: true fp32); the error bound then charges TF32's
                           * rounding (DECISIONS) */
    int dx_only;          /* moe_gemm_bwd: compute dX only */
    int dw_only;          /* moe_gemm_bwd: compute dW (and d_topk_weights) only */
    void *stream;         /* CUDA backend: the cudaStream_t to run on (NULL = default stream) */
    int64_t ref_scratch_bytes; /* MOE_BACKEND_REF, dX with reduce_topk: the most bytes of float32 scratch
                                * for the slot rows before they are summed per token (0 = the default,
                                * MOE_REF_DEFAULT_SCRATCH_BYTES; negative: MOE_ERR_INVALID_OPTION).  A
                                * smaller budget splits K into more column chunks, each a multiple of 128
                                * columns and at least one such chunk however small the budget; the
                                * result's bits do not depend on it.  The CUDA backend ignores it. */
} moe_gemm_options;

/* The scratch budget an options.ref_scratch_bytes of 0 means: 64 MiB. */
#define MOE_REF_DEFAULT_SCRATCH_BYTES ((int64_t)64 << 20)

/* Y = fwd(X, W).
 *   x             [R_x][K]    input activations
 *   w             [E][N][K]   expert weights
 *   topk_weights  [M] or NULL routing weights, slot order
 *   y             [M][N]      output; expert order, or slot order with permute_y */
moe_status moe_gemm_fwd(moe_backend backend, const moe_routing *routing, int64_t N, int64_t K,
                        const void *x, const void *w, const void *topk_weights, void *y,
                        const moe_gemm_options *options);

/* dX = dY . W per expert.
 *   dy            [M][N]      output gradient; expert order, or slot order with permute_y
 *   w             [E][N][K]   expert weights
 *   topk_weights  [M] or NULL the forward's fused routing weights
 *   dx            [M][K], or [T][K] with reduce_topk; expert order, or slot order with permute_x */
moe_status moe_gemm_dx(moe_backend backend, const moe_routing *routing, int64_t N, int64_t K,
                       const void *dy, const void *w, const void *topk_weights, void *dx,
                       const moe_gemm_options *options);

/* dW[e] = sum over the rows r of expert e of dysrc_r^T (x) xsrc_r.  Experts with no rows get exact zeros
 * (or are left unchanged with accumulate).
 *   x             [R_x][K]    the forward's input
 *   dy            [M][N]      output gradient (slot order with permute_y)
 *   topk_weights  [M] or NULL the forward's fused routing weights
 *   dw            [E][N][K]   weight gradient (float32 if dw_fp32) */
moe_status moe_gemm_dw(moe_backend backend, const moe_routing *routing, int64_t N, int64_t K,
                       const void *x, const void *dy, const void *topk_weights, void *dw,
                       const moe_gemm_options *options);

/* Gradient of the fused topk weights: d_topk_weights[g_r] = < dY_src_r (unweighted), y_r > where
 * y_r = xsrc_r . W[e]^T is recomputed in float32 (not rounded).  Requires gather_indices.
 *   x [R_x][K], w [E][N][K], dy [M][N]  ->  d_topk_weights [M] slot order (float32 if dw_fp32) */
moe_status moe_gemm_topk_weights_grad(moe_backend backend, const moe_routing *routing, int64_t N,
                                      int64_t K, const void *x, const void *w, const void *dy,
                                      void *d_topk_weights, const moe_gemm_options *options);

/* The backward of moe_gemm_fwd in one call, as an autograd backward needs it: dX (unless dw_only), dW
 * (unless dx_only) and, when topk_weights and d_topk_weights are both non-NULL and dx_only is not set,
 * d_topk_weights.  Outputs that are not computed may be NULL and are never touched. */
moe_status moe_gemm_bwd(moe_backend backend, const moe_routing *routing, int64_t N, int64_t K,
                        const void *x, const void *w, const void *dy, const void *topk_weights,
                        void *dx, void *dw, void *d_topk_weights, const moe_gemm_options *options);

/* ----------------------------------------------------------------------------------------------------
 * Autotuning (CUDA backend)
 *
 * Every CUDA call picks its kernel (family, tile rows, paired CTAs, TMA-store epilogue, and for sm90 dW
 * the ping-pong kernel or the 128 x 256 one) by a heuristic from the shapes alone.  moe_gemm_autotune
 * times the candidate configurations of one call on the caller's tensors instead and keeps the fastest
 * in a process-wide table keyed by (device name, op, dtype, output dtype, permute_x, permute_y,
 * reduce_topk, topk weights given, allow_tf32, E, T*k, N, K); from then on every CUDA call of that key in
 * this process uses it (accumulate or not), except that a "simt" choice (recorded where no tensor-core kernel
 * could take the tuned call: candidates are tensor-core configurations) keeps no call that one can take off
 * the tensor cores.  With a cache_path the choice is appended to that text file (one "libmoe-tune 2|..." line
 * per choice, format in src/autotune.c; "libmoe-tune 1|..." lines of older files still load, their dW kernel
 * left to the heuristic; lines with a key no call makes are refused), which moe_gemm_autotune_load reads back
 * in a later process; a later line for the same key replaces an earlier one.  The environment overrides
 * (MOE_CUDA_KERNEL, MOE_SM90_TILE_ROWS, MOE_SM90_CLUSTER, MOE_SM90_TMA_OUT, MOE_SM90_DW_PINGPONG,
 * MOE_SM90_DW_WIDE; README) win over the table.  Dynamic tiles (the unpaired sm90 kernel for fwd and dX with a
 * reduction of 4096 or more) are not a tuned choice: they follow that rule under any table, unless
 * MOE_SM90_DYNAMIC=0|1 forces them; nor are tiles of one length (fwd and dX with 1024 or more rows per
 * expert on average; MOE_SM90_FULL_BLOCKS=0|1 forces them) or the CTA count (a multiple of 8 for fwd and dX in
 * the static tile order; MOE_SM90_GRID=N caps it for every sm90 launch).
 * -------------------------------------------------------------------------------------------------- */
typedef enum moe_gemm_op {
    MOE_GEMM_FWD = 0,   /* moe_gemm_fwd:  a = x,  b = w,  out = y  */
    MOE_GEMM_DX = 1,    /* moe_gemm_dx:   a = dy, b = w,  out = dx */
    MOE_GEMM_DW = 2     /* moe_gemm_dw:   a = x,  b = dy, out = dw */
} moe_gemm_op;

/* One kernel configuration and its measured time. */
typedef struct moe_gemm_tuning {
    char kernel[8];      /* "sm90" (wgmma + TMA), "sm80" (mma.sync) or "simt" */
    int tile_rows;       /* rows of a tile */
    int cluster;         /* 2: pairs of CTAs share W tiles by TMA multicast (sm90 fwd/dX), else 1 */
    int tma_store;       /* 1: the output tiles are stored by TMA (sm90, outputs in tile order) */
    int dw_pingpong;     /* sm90 dW: 1 the ping-pong kernel (128 x 128 tiles), 0 the 128 x 256 kernel */
    double median_us;    /* median wall time of one call with this configuration, microseconds */
    int candidates;      /* distinct configurations timed (moe_gemm_autotune's result only) */
} moe_gemm_tuning;

/* Times each candidate configuration of the call moe_gemm_fwd / _dx / _dw(MOE_BACKEND_CUDA, routing,
 * N, K, a, b, topk_weights, out, options) `repeats` times (CUDA events on options->stream, median; after
 * one untimed run each, in `repeats` rounds that each run every candidate once in turn, so that all see the
 * same clock and thermal state; before each timed run the L2 is flushed by rewriting a device buffer of four
 * times its size, allocated for the call, so that each run starts as a call in a training step does, with its
 * operands not in L2), keeps the fastest (see above), appends it to cache_path when that is not
 * NULL, and runs the call once more with it, so that `out` holds the call's result.  The arguments are
 * those of the op (device pointers; the routing on the device), validated as the op validates them.
 *   repeats   1 .. 1000
 *   chosen    out, may be NULL: the configuration kept
 * Refuses options->accumulate (MOE_ERR_INVALID_OPTION): the candidates overwrite out many times.
 * MOE_ERR_NO_BACKEND without a CUDA device; MOE_ERR_OUT_OF_MEMORY when the flush buffer does not fit in
 * device memory; MOE_ERR_IO when cache_path cannot be appended to (the choice is still kept in the process
 * table).  Routing errors found on the device are returned. */
moe_status moe_gemm_autotune(moe_gemm_op op, const moe_routing *routing, int64_t N, int64_t K,
                             const void *a, const void *b, const void *topk_weights, void *out,
                             const moe_gemm_options *options, int repeats, const char *cache_path,
                             moe_gemm_tuning *chosen);

/* Reads an autotune cache file into the process table (entries of other devices are kept but never
 * match).  All or nothing: a malformed line (MOE_ERR_IO, naming the file, the line and the field)
 * leaves the table unchanged.  Needs no device. */
moe_status moe_gemm_autotune_load(const char *cache_path);

/* Empties the process table: every call goes back to the heuristic. */
void moe_gemm_autotune_clear(void);

#ifdef __cplusplus
}
#endif

#endif /* LIBMOE_MOE_H */
