/*
 * cli/cli.h: what the files of the moe tool share, in one section per file that defines it.  Every
 * function here that can fail reports the error and exits with status 2 (die) instead of returning.
 */
#ifndef LIBMOE_CLI_H
#define LIBMOE_CLI_H

#include "moe.h"
#include "moe_fp8.h"
#include "moe_mlp.h"
#include "npy.h"
#include "options.h"

#include <stddef.h>
#include <stdint.h>

/* exit statuses: 1 compare found a difference over its tolerance, 2 any error */
enum { EXIT_MISMATCH = 1, EXIT_USAGE = 2 };

/* ---- memory.c: errors, and the heap blocks the tool owns (all freed at exit) ---- */
/* die() starts its messages with "moe NAME: " once the command NAME is known. */
void set_command_name(const char *name);
_Noreturn void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void *xmalloc(size_t count, size_t size);
void *xrealloc(void *p, size_t count, size_t size);
void xfree(void *p);
void own(void *p); /* registers a block malloc made elsewhere */
/* a * b * c elements, refusing products past 64 bits */
size_t elements(int64_t a, int64_t b, int64_t c);

/* ---- files.c: paths, and the files a command writes (all or none: outputs.h) ---- */
char *join_path(const char *dir, const char *name); /* "dir/name", owned */
void make_dirs(const char *path);                   /* mkdir -p */
int is_regular(const char *path);
int is_dir(const char *path);
/* Claiming, before anything is read: the files a command writes, then those it reads (refused when they
 * are outputs too). */
void add_outputs_in(const char *dir, const char *const *names, int n, char **paths);
void check_input(const char *path);
void claim_files(const args *a, const char *const *outs, const char *const *ins);
/* Writing into temporary files, then putting all in place at once (commit_outputs). */
void write_array(const char *path, npy_type type, int ndim, const int64_t *shape, const void *data);
void write_result(const args *a, const char *path, moe_dtype dtype, const void *data, int ndim,
                  const int64_t *shape);
void write_text(const char *path, const char *text); /* a text file, all or nothing like write_array */
void commit_outputs(void);
void discard_outputs(void);            /* at exit: removes every output not committed */
const char *uncommitted_output(void); /* the first, NULL when none */

/* ---- arrays.c: loading input arrays, checking and converting them ---- */
void load(const char *path, npy_array *array); /* reads a whole .npy file; its data is owned */
void release(npy_array *array);                /* frees what load read */
char *shape_text(const npy_header *h); /* "(2, 3)"; valid until the fourth call after */
void check_matrix(const char *path, const npy_array *array, int64_t rows, int64_t cols, int split,
                  const char *why);
void check_floating(const char *path, const npy_array *array);
void check_index_array(const char *path, const npy_array *arr);
int shape_is(const npy_header *h, int ndim, const int64_t *dims);
void check_shape(const char *path, const npy_array *arr, int ndim, const int64_t *dims, const char *what,
                 const char *why);
void *convert(const char *path, const npy_array *array, moe_dtype dtype); /* a floating array in dtype, owned */
int64_t *convert_int(const char *path, const npy_array *array);          /* an index array as int64, owned */
moe_dtype choose_dtype(const args *a, const npy_array *const *arrays, const char *const *paths, int n);

/* ---- call.c: one library call on the chosen backend ---- */
/* With MOE_BACKEND_REF the arrays are the host buffers themselves.  With MOE_BACKEND_CUDA (device
 * pointers for every array, the routing and layout arrays too) call_in gives a device copy of an input
 * and call_out a device buffer of NaN bytes (0xFF) for an output: no call of this tool accumulates into
 * its outputs, so none has contents to upload.  call_end reports a refused call, waits for the device
 * (an error it detected is a refused call too), copies the outputs back to their host buffers and frees
 * every device buffer (die() frees them at exit). */
#define MAX_CALL_OUTPUTS 8
typedef struct call_output {
    const char *name;
    void *host, *dev;
    size_t bytes;
} call_output;
typedef struct lib_call {
    const char *name; /* the library function */
    moe_backend backend;
    int num_out;
    call_output out[MAX_CALL_OUTPUTS];
} lib_call;

moe_backend get_backend(const args *a);
#ifdef MOE_CLI_CUDA
void require_cuda_device(const char *prefix, const char *suffix);
#endif
void library_failed(const char *call, moe_status status);
void *to_device(const lib_call *c, const void *host, size_t bytes, const char *name);
const void *call_in(const lib_call *c, const char *name, const void *host, size_t bytes);
void *call_out(lib_call *c, const char *name, void *host, size_t bytes);
moe_routing call_routing(const lib_call *c, const moe_routing *r);
void call_end(lib_call *c, moe_status status);

/* ---- cmd_gemm.c: the routing the gemm commands (and the gemm-fp8 ones) read ---- */
typedef struct routing_in {
    const char *m_path, *g_path;
    int64_t E, T, k, M;
    int64_t *m_sizes, *gather;
    moe_routing r;
} routing_in;
/* Reads the routing (--m-sizes, and --gather with --topk) and checks it: M = the sum of m_sizes is T*k,
 * and gather_indices is a valid routing of M slots (moe_routing_validate). */
void load_routing(const args *a, routing_in *ri);
/* Dies, naming flag, when the routing has no gather_indices. */
void require_gather(const routing_in *ri, const char *flag);
/* The routing flags of a gemm or gemm-fp8 command: *permute_x, *permute_y from --permute-x, --permute-y;
 * *reduce_topk from --reduce-topk when reduce_topk is not NULL (the dX commands); each of these and
 * --topk-weights dies without --gather. */
void routing_flags(const args *a, const routing_in *ri, int *permute_x, int *permute_y, int *reduce_topk);
/* Dies unless the topk weights have the shape (M,) or (T, k). */
void check_topk_weights(const char *path, const npy_array *tw, const routing_in *ri);

/* ---- cmd_fp8.c: what the FP8 commands (and cmd_fp8_dw.c's) share ---- */
/* The options the FP8 GEMM commands share. */
#define OPT_FP8_M_SIZES {"--m-sizes", "M.npy", "rows per expert, shape (E,), int32 or int64 (moe route writes it)."}
#define OPT_FP8_TOPK {"--topk", "K", "experts per token k (required with --gather; default 1)."}
#define OPT_FP8_OUT_DTYPE                                                                              \
    {"--out-dtype", "f32|bf16", "the output's dtype (default f32); written as float32 either way."}
#define OPT_FP8_BOUND_OUT                                                                              \
    {"--bound-out", "B.npy",                                                                           \
     "also write the float64 oracle's error bound of every output element (specs/FP8.md section 4), "  \
     "for `moe compare --bound`."}
/* The value of flag (--dtype, --out-dtype): f32 (the default) or bf16. */
moe_dtype f32_or_bf16(const args *a, const char *flag);
/* The FP8 format named by flag (e4m3 or e5m2), fallback when absent. */
moe_dtype fp8_format(const args *a, const char *flag, moe_dtype fallback);
/* --scales f32|ue8m0 (default f32) of the quantizing commands. */
moe_fp8_scale_format fp8_scale_format(const args *a);
/* Loads a quantization's source and dies unless it is floating (16-bit patterns only with bf16). */
void load_fp8_source(const char *path, npy_array *arr, moe_dtype src_dtype);
/* One FP8 operand from its codes file (uint8 of shape) and its scales file (scale_shape); *format is set by
 * (or checked against) the scales' type: float32, or uint8 for UE8M0. */
moe_fp8_tensor load_fp8_operand(const char *codes_path, const char *scales_path, moe_dtype dtype, int ndim,
                                const int64_t *shape, const int64_t *scale_shape, int *format);

/* ---- cmd_mlp.c: the MLP layout options, which route reads too ---- */
int64_t parse_block_size(const args *a);
moe_mlp_padding parse_padding(const args *a);

/* ---- run_options.c: the options a command ran with, DIR/moe-options.txt (cli/README.md) ---- */
#define RUN_OPTIONS_FILE "moe-options.txt"
#define RUN_OPTIONS_MAX 24
typedef struct run_options {
    char path[4096];   /* the file read (run_options_read) */
    char command[32];  /* the command that wrote it */
    int count;
    char key[RUN_OPTIONS_MAX][32];
    char value[RUN_OPTIONS_MAX][96];
} run_options;
/* Collecting what to write (key: one of the keys run_options.c knows), and writing it to path (an output
 * the command registered) with the header naming `command`. */
void run_options_set(run_options *r, const char *key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void run_options_write(const char *path, const char *command, const run_options *r);
void run_options_clamp_text(const moe_mlp_options *o, char *buf, size_t size);
/* Reads DIR/moe-options.txt: 1 when read, 0 when there is none; dies on a malformed file. */
int run_options_read(const char *dir, run_options *r);
const char *run_options_get(const run_options *r, const char *key); /* NULL when absent */
/* Every key of r that a's command has a flag for becomes that flag's value when the flag is not given;
 * a given flag with another value is refused, naming both. */
void run_options_apply(args *a, const run_options *r);
/* mlp-fwd (forward = 1: only a file moe route wrote) and mlp-bwd: run_options_apply with --in's file. */
void mlp_apply_run_options(args *a, int forward);
/* The file mlp-fwd and mlp-bwd write beside their outputs: every option that changes the result. */
void mlp_write_run_options(const char *path, const char *command, const moe_mlp_options *o,
                           const char *weight_layout);

/* ---- dtype_fit.c: float32 data holding 16-bit values ---- */
/* 1 when every value (NaN aside) of a float32/float64 array is exactly a value of dtype (an f16 array: of f16). */
int values_fit_dtype(const npy_array *arr, moe_dtype dtype);
/* Warns on stderr, naming --dtype bf16 (or f16), when every floating input (arrays[i], NULL skipped) of a
 * float32 run holds only bf16 (or f16) values: a forgotten --dtype. */
void warn_if_16bit_valued(const args *a, const npy_array *const *arrays, int n, const char *folder);

/* ---- mlp_affinities.c: expert_affinities_masked's shapes ---- */
/* 0 when arr is (T*E,), (T*E, 1) or (T, E); 1 when it carries NKI's padding row ((T+1)*E,), ((T+1)*E, 1)
 * or (T + 1, E), allowed with row_padding and checked to be zero there; dies otherwise, naming the files
 * T and E come from.  dtype decodes 16-bit patterns. */
int mlp_affinities_pad_row(const char *path, const npy_array *arr, int64_t T, int64_t E, int row_padding,
                           moe_dtype dtype, const char *hidden_path, const char *weight_path);

/* ---- bounds.c: --bound-out of mlp-fwd and mlp-bwd ---- */
/* One MLP call's inputs, in o->dtype (ckpt_* and g: the backward's; NULL in the forward). */
typedef struct mlp_bound_in {
    int64_t T, T1, E, H, I, B, N;
    const int64_t *b2e, *tpti;
    const moe_mlp_options *o;
    const void *x, *A, *wgu, *wd, *bgu, *bd, *g, *ckpt_gu, *ckpt_d;
} mlp_bound_in;
/* Writes the per-element bound of every output (float64, the output's shape) to the registered paths:
 * output, gate/up checkpoint, down checkpoint; or hidden_states_grad, the affinity gradient (aff_count
 * elements of aff_shape: T*E, or (T + 1)*E with NKI's padding row, bound 0) and, with topk_ids (T x k), its
 * router's view; and the weight gradients (with bias the bias gradients) in `layout` (weight_paths). */
void write_mlp_fwd_bounds(char *const *paths, const mlp_bound_in *in);
struct weight_layout;
void write_mlp_bwd_bounds(char *const *paths, char *const weight_paths[][2], const struct weight_layout *layout,
                          const mlp_bound_in *in, int aff_ndim, const int64_t *aff_shape, int64_t aff_count,
                          const int64_t *topk_ids, int64_t k);

/* ---- the commands, in cmd_*.c ---- */
extern const command fp8_quantize_command, gemm_fp8_fwd_command, gemm_fp8_dx_command, gemm_fp8_dw_command;
/* cmd_fp8_dw.c: fp8-quantize --columns */
int run_fp8_quantize_columns(const args *a);
extern const command gemm_fwd_command, gemm_dx_command, gemm_dw_command, route_command, compare_command,
    mlp_fwd_command, mlp_bwd_command, autotune_command;

#endif /* LIBMOE_CLI_H */
