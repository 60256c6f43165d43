// The blockwise MLP as its kernels see it (MlpArgs: the call, its tensors and its device workspace) and the
// small device helpers that several of the MLP's compile units share.
#ifndef LIBMOE_GPU_MLP_ARGS_CUH
#define LIBMOE_GPU_MLP_ARGS_CUH

#include <stdint.h>

#include "common/dtype.cuh"

extern "C" {
#include "moe_backend.h"
}

namespace moe_gpu {

// The call's status word (MlpArgs::status): ERR_NONE, or the layout error the check found (gpu/mlp/layout_check.cu);
// every kernel after the check returns at once while it is set.
enum ErrorKind : int { ERR_NONE = 0, ERR_EXPERT = 1, ERR_TOKEN = 2, ERR_PAIR = 3, ERR_TOP1 = 4 };
// The check's reports (MlpArgs::reports, the smallest bad position of each kind, NONE when none).
enum Report : int { REP_EXPERT = 0, REP_TOKEN = 1, REP_PAIR = 2, REP_TOP1 = 3, REPORTS = 4 };

// The CTA of the one-CTA list kernels (expert_lists_kernel, row_offsets_kernel).
constexpr int LIST_THREADS = 1024;

struct MlpArgs {
    moe_dtype dt;  // every tensor but the weight/bias gradients
    moe_dtype gdt; // d_w_gu, d_w_d, d_b_gu, d_b_d
    int64_t T, E, num_blocks, B, H, I, positions, token_rows, pad; // positions = num_blocks * B
    int act, on_i, bias, accumulate, overwrite, op;
    int has_lin_lo, has_lin_hi, has_nl_lo, has_nl_hi;
    float lin_lo, lin_hi, nl_lo, nl_hi; // forward: the limits; backward: rounded to dt (mask limits)
    const int64_t *b2e, *ids;
    const void *hidden, *aff, *w_gu, *w_d, *b_gu, *b_d, *out_grad, *ckpt_gu_in, *ckpt_d_in;
    void *out, *ckpt_gu, *ckpt_d, *d_hidden, *d_aff, *d_wgu, *d_wd, *d_bgu, *d_bd;
    // workspace
    int *status;
    long long *reports;   // [REPORTS]
    long long *pair_pos;  // [T*E]
    long long *tok_first; // [T] (tensor_update_overwrite only)
    int64_t *expert_start;  // [E+1]
    int64_t *expert_blocks; // [num_blocks]
    float *M;       // [NB][I]  m as the down projection uses it (ON_I: scaled by a)
    float *M0;      // [NB][I]  unscaled m (ON_I: forward with a down checkpoint; backward recomputing d)
    float *contrib; // [NB][H]  per-position rows: a*d (forward), dX (backward)
    float *dGU;     // [NB][2I]
    float *Dre;     // [NB][H]  recomputed d (ON_I backward without a down checkpoint)
    float *da;      // [NB]
    // The rows path (round_intermediates: the default rounded intermediates, see "Rows path" below): the layout's real positions
    // grouped by expert, expert e owning rows row_offsets[e] .. row_offsets[e+1]-1
    int64_t *block_rows;  // [N]    real positions of each block
    int64_t *block_first; // [N]    the row of each block's first real position
    int64_t *row_offsets; // [E+1]
    int64_t *row_pos;     // [NB]   position of each row (rows past row_offsets[E] unused)
    int64_t *pos_row;     // [NB]   row of each position, -1 for padding; NULL on the tile path
    void *Xr, *Mr, *M0r, *Sr, *dGUr; // dt rows: hidden, m, unscaled m, down-gradient operand, (dg, du)
    float *GU, *Dr, *dMr;            // float32 rows: gate/up (unfused forward only, its own allocation),
                                     // down (then a*d or dX), dM
    int dre_bias;                    // rows path: Dre rows lack the down bias (dot_kernel adds it)
    // The split path (bf16 without round_intermediates, see "Split operands" below): the operands Mr, M0r and
    // dGUr hold three exact bf16 terms of each float32 value, and they and the GEMMs' float32 rows Dr and Dre
    // are indexed by term rows (term_rows_of: [3 NB][width]); otherwise one value rounded to dt per row
    int split;
    // backward: the affinity scales m (d_w_d's operand) and dM, and Sr is G (ON_I, and ON_H on split
    // operands), instead of Sr = rnd(a*G)
    int a_in_m;
    // Split path: term_offsets [E+1] = 3 row_offsets, the term rows' grouping by expert; the backward's X3, S3:
    // hidden and G at term rows (each row copied to its three), the weight gradients' other operands.  NULL
    // otherwise.
    int64_t *term_offsets;
    void *X3, *S3;
    int64_t *tok_count;              // [T]    positions of each token
    int64_t *tok_list;               // [T*E]  their rows (tile path: positions), ascending expert order
    int64_t *tok_expert;             // [T*E]  the expert of each
};

__device__ __forceinline__ int64_t token_of(const MlpArgs &g, int64_t pos)
{
    const int64_t id = g.ids[pos];
    return id >= 0 && id < g.T ? id : -1;
}

__device__ __forceinline__ int64_t warp_id_global() { return (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32; }
__device__ __forceinline__ int64_t warps_in_grid() { return (int64_t)gridDim.x * (blockDim.x / 32); }
__device__ __forceinline__ int64_t rows_total(const MlpArgs &g) { return g.row_offsets[g.E]; }

// dD = a * G (ON_H: the down-projection gradient input; ON_I: db_d's terms), or G itself (ON_I's dM and
// dW_d input).
__device__ __forceinline__ float scaled_grad(const MlpArgs &g, int64_t tok, float a, int64_t h, bool scale)
{
    const float G = load_as_float(g.dt, g.out_grad, tok * g.H + h);
    return scale ? a * G : G;
}

// One weight-gradient element: overwritten, or round(old + sum) with accumulate.
__device__ __forceinline__ void store_grad(const MlpArgs &g, void *dst, int64_t index, float v)
{
    if (g.accumulate)
        v = load_as_float(g.gdt, dst, index) + v;
    store_from_float(g.gdt, dst, index, v);
}

} // namespace moe_gpu

#endif
