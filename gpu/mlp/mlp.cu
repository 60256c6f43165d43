// The blockwise MLP's entry points (moe_cuda_mlp_fwd, moe_cuda_mlp_bwd): the call's workspace and its fixed
// sequence of kernels on the tile path or the rows path (the kernels are in the other files of gpu/mlp/).
//
// CUDA blockwise MoE MLP: forward with checkpoints and the full backward (SEMANTICS section 3,
// specs/MLP.md; the contract is in gpu/mlp/mlp_cuda.h).  The CPU reference (ref/mlp/) is the oracle.
//
// Two paths share the layout check, the token lists and the reductions:
//   - the tile path (float32 intermediates, the default, for f16 and f32): the kernels listed below;
//   - the rows path (the rounded intermediates with f16/bf16, and bf16 without it on split operands):
//     every GEMM on the grouped GEMM's tensor-core kernels over the layout's real positions grouped by
//     expert; see "Rows path" and "Split operands" below.
//
// One call is a fixed sequence of kernels on options.stream, nothing synchronised with the host:
//
//   layout check (every call)
//     init_kernel          pair_pos[T*E] = tok_first[T] = NONE, the error reports = NONE
//     check_kernel         block_to_expert / token ids in range; pair_pos[t*E+e] = min position of the pair
//                          (integer atomicMin: the result does not depend on the schedule)
//     repeat_kernel        a position that is not its pair's minimum repeats the pair (and likewise for
//                          a token under tensor_update_overwrite); the smallest such position is reported
//     finalize_kernel      picks the first error in the reference's order (block_to_expert, ids, pairs,
//                          top-1), sets this call's status word and the sticky record; every later
//                          kernel returns at once when the status word is set, so nothing is written
//     expert_lists_kernel  expert_blocks: the blocks of each expert in ascending block order
//   forward
//     GateUp tiles         per block: X_b . W_gu[e] (gate and up columns of the same i in one tile), bias,
//                          clamp, gate_up_ckpt_T, m = act(g)*u (ON_I: *a) -> M scratch
//     Down tiles           per block: M . W_d[e], bias, down_ckpt, per-position contribution a*d (ON_I:
//                          d + a*b_d) -> contrib scratch; ON_I with a down checkpoint: a second pass from
//                          the unscaled m (M0) writes the checkpoint
//     token_lists_kernel   each token's positions (rows on the rows path) in ascending expert order
//     token_rows_kernel    out[t] = the contributions of t's positions summed in that order
//   backward
//     Dm tiles             per block: dM = (a*G) . W_d[e]^T (ON_I: a * (G . W_d^T)); epilogue from the
//                          rounded checkpoint: m -> M, masked dg, du -> dGU scratch
//     (ON_I without a down checkpoint: Down tiles from M0 recompute d -> Dre scratch)
//     dot_kernel           da[pos] = <G, d>
//     Dx tiles             per block: dGU . W_gu[e]^T -> contrib scratch (one row per position)
//     DwD / DwGu tiles     per expert: M^T . (a*G) and X^T . dGU over the expert's positions, in
//                          ascending position order; one CTA owns an output tile (no atomics)
//     bias_grad_kernel     db_d, db_gu: column sums over the expert's positions, ascending
//     token_rows_kernel    d_hidden rows (ascending expert order);  daff_kernel: d_affinities rows
//
// Every GEMM-shaped step runs through one SIMT fp32 tile engine (tile_kernel<Op>): 64 x 64 output
// tiles, K staged 16 deep through shared memory as float32 (inputs of any dtype converted on load),
// 256 threads each owning 4 x 4 outputs and accumulating with fp32 FMA in ascending k.  The Op supplies
// the tile decomposition, the two operand element loaders (gathers, affinity scaling, zero for padding)
// and the epilogue.  Each output element is produced by exactly one thread with a reduction order fixed
#include "common/cuda_check.cuh"
#include "common/launch.cuh"
#include "gemm/gemm.cuh"
#include "gemm/heuristics.cuh"
#include "mlp/gate_sm90.cuh"
#include "mlp/mlp_cuda.h"
#include "mlp/steps.cuh"

namespace moe_gpu {
namespace {

// ------------------------------------------------------------------------------------------------
// Rows path (the rounded intermediates with f16/bf16; bf16 without it on split operands, below): every GEMM
// on the grouped GEMM's kernels
// (gpu/gemm/gemm.cuh, moe_cuda_rows_gemm: wgmma/TMA on sm_90a, mma on sm_80+), the MLP's own work in
// elementwise kernels between them.  The layout's real positions are numbered as "rows" grouped by
// expert (the expert's blocks in ascending order, ascending slot within a block; padding positions get
// no row), so each GEMM is a plain grouped GEMM over contiguous row ranges:
//
//   forward    Xr = hidden rows;  GU = Xr . W_gu (f32);  gate_act: bias, clamps, gate_up_ckpt_T,
//              Mr = rnd(act(g)*u [*a]);  Dr = Mr . W_d (f32);  token_out: bias, a*d summed per token
//              -> out, and ON_H's down_ckpt on the way (ON_I's: down_ckpt from Dre = rnd(m) . W_d).
//              On sm_90a with long enough experts the gate/up GEMM and gate_act are one kernel
//              (gpu/mlp/gate_sm90.cu, G_FUSE_MIN_ROWS): the fp32 GU rows are neither written nor read, same
//              bits (MOE_MLP_FUSE_GATE=0 turns it off, =1 forces it); there the down GEMM, when I is short
//              (R_PINGPONG_MAX_N), runs on the same schedule with its fp32 epilogue beside the other
//              warpgroup's MMAs (sm90_rows_f32_kernel; MOE_MLP_FUSE_GATE=0 turns it off too)
//   backward   Xr;  Sr = rnd(a*G) (ON_I: G);  dMr = Sr . W_d^T (f32);  gate_bwd (from the checkpoint):
//              Mr = rnd(m [*a]), dGUr = rnd(dg, du);  [ON_I without down_ckpt: Dre = rnd(m) . W_d];
//              dot/daff -> d_affinities;  dXr = dGUr . W_gu^T (f32) -> token_rows -> d_hidden;
//              d_w_d = Mr^T . Sr;  d_w_gu = Xr^T . dGUr;  bias sums over the expert's rows.  dMr and dXr
//              take the ping-pong rows kernel under the down GEMM's rules (a reduction, H or 2 I, of at
//              most R_PINGPONG_MAX_N)
//
// rnd = one rounding to the call's dtype (specs/MLP.md, "Rounded intermediates"); on the split path (below) no
// rounding: Mr, M0r and dGUr hold exact terms at term rows, the GEMMs that read them run over term rows, Dr and
// Dre hold one float32 row per term, and the backward's d_w_d and d_w_gu read S3 and X3 (G and X at term rows)
// instead of Sr and Xr.  Every kernel returns at once while the call's status word is set.  Deterministic: no
// atomics on values.
// ------------------------------------------------------------------------------------------------

// The call's device workspace: one allocation, carved in 256-byte aligned pieces.
struct Carver {
    size_t bytes = 0;
    size_t take(int64_t count, size_t elem)
    {
        const size_t at = bytes;
        bytes += ((size_t)(count > 0 ? count : 0) * elem + 255) / 256 * 256;
        return at;
    }
};

MlpArgs base_args(const moe_mlp_problem *p, int op)
{
    MlpArgs g = {};
    g.dt = p->dtype, g.gdt = p->grad_dtype;
    g.T = p->T, g.E = p->E, g.num_blocks = p->N, g.B = p->B, g.H = p->H, g.I = p->I, g.positions = p->N * p->B;
    g.token_rows = p->token_rows;
    g.pad = p->padding == MOE_MLP_PAD_ROW ? p->T : -1;
    g.act = (int)p->activation, g.on_i = p->affinity == MOE_AFFINITY_ON_I, g.bias = p->bias;
    g.accumulate = p->accumulate, g.overwrite = p->overwrite, g.op = op;
    g.has_lin_lo = p->has_lin_lo, g.has_lin_hi = p->has_lin_hi, g.has_nl_lo = p->has_nl_lo, g.has_nl_hi = p->has_nl_hi;
    g.lin_lo = p->lin_lo, g.lin_hi = p->lin_hi, g.nl_lo = p->nl_lo, g.nl_hi = p->nl_hi;
    g.b2e = p->block_to_expert, g.ids = p->token_position_to_id;
    return g;
}

// The rows path's choices: split operands (bf16 without round_intermediates), the affinity on m (a_in_m).
void set_rows_path(MlpArgs &g, bool split)
{
    g.split = split;
    g.a_in_m = g.on_i || split;
}

// One grouped GEMM over the rows, or with term_rows over the split backward's term rows (shapes: gpu/gemm/gemm.cuh,
// MoeRowsGemm).
moe_status rows_gemm(const MlpArgs &g, const char *name, int op, moe_dtype out_dtype, int64_t N, int64_t K,
                     const void *a, const void *b, void *out, int accumulate, cudaStream_t stream, bool term_rows = false)
{
    MoeRowsGemm r = {};
    r.name = name, r.op = op, r.dtype = g.dt, r.out_dtype = out_dtype;
    r.E = g.E, r.rows = term_rows ? 3 * g.positions : g.positions, r.N = N, r.K = K;
    r.offsets = term_rows ? g.term_offsets : g.row_offsets, r.status = g.status;
    r.a = a, r.b = b, r.out = out, r.accumulate = accumulate, r.stream = stream;
    return moe_cuda_rows_gemm(&r);
}

// The forward's gate/up GEMM fused with gate_act_kernel's work (moe_cuda_rows_gate_gemm): *fused = 0 when
// the call does not fit it (nothing launched).
moe_status gate_up_fused(const MlpArgs &g, int *fused, cudaStream_t stream)
{
    if (g.split) { // the fused epilogue stores m rounded; split operands take gate_act_kernel
        *fused = 0;
        return MOE_OK;
    }
    MoeRowsGemm r = {};
    r.name = "moe_mlp_fwd (gate/up, fused)", r.op = MOE_ROWS_A_W, r.dtype = g.dt, r.out_dtype = g.dt;
    r.E = g.E, r.rows = g.positions, r.N = g.H, r.K = 2 * g.I;
    r.offsets = g.row_offsets, r.status = g.status;
    r.a = g.Xr, r.b = g.w_gu, r.out = nullptr, r.accumulate = 0, r.stream = stream;
    MoeGateEpilogue e = {};
    e.act = g.act, e.on_i = g.on_i;
    e.I = g.I, e.B = g.B, e.num_blocks = g.num_blocks, e.num_experts = g.E;
    e.row_pos = g.row_pos, e.ids = g.ids, e.affinities = g.aff, e.bias = g.bias ? g.b_gu : nullptr;
    e.has_nl_lo = g.has_nl_lo, e.has_nl_hi = g.has_nl_hi, e.has_lin_lo = g.has_lin_lo, e.has_lin_hi = g.has_lin_hi;
    e.nl_lo = g.nl_lo, e.nl_hi = g.nl_hi, e.lin_lo = g.lin_lo, e.lin_hi = g.lin_hi;
    e.m_rows = g.Mr, e.ckpt = g.ckpt_gu, e.m0_rows = g.M0r;
    return moe_cuda_rows_gate_gemm(&r, &e, fused);
}

// The rows path's buffers, in elements (dt ones, then float32 ones); all zero on the tile path.
struct RowsSizes {
    bool active, term_rows;                // term_rows: the split path's term_offsets
    int64_t xr, mr, m0r, sr, dgur, x3, s3; // dt
    int64_t dr, dmr;                       // float32
};

// Allocates the workspace, points g at it, runs the layout kernels and body(g), frees (stream-ordered).
template <class Body>
moe_status with_workspace(const moe_mlp_problem *p, MlpArgs &g, int64_t nM, int64_t nM0, int64_t nContrib,
                          int64_t nDGU, int64_t nDre, int64_t nDa, const RowsSizes &rs, Body body)
{
    cudaStream_t stream = static_cast<cudaStream_t>(p->stream);
    Carver c;
    const size_t o_status = c.take(1 + REPORTS, 8); // status word, then the reports at +8
    const size_t o_pairs = c.take(g.T * g.E, 8);
    const size_t o_first = c.take(g.overwrite ? g.T : 0, 8);
    const size_t o_start = c.take(g.E + 1, 8);
    const size_t o_blocks = c.take(g.num_blocks, 8);
    const size_t o_M = c.take(nM, 4), o_M0 = c.take(nM0, 4), o_contrib = c.take(nContrib, 4);
    const size_t o_dgu = c.take(nDGU, 4), o_dre = c.take(nDre, 4), o_da = c.take(nDa, 4);
    const size_t es = moe_dtype_size(g.dt);
    const int64_t rows_n = rs.active ? g.num_blocks : 0, rows_nb = rs.active ? g.positions : 0;
    const size_t o_brows = c.take(rows_n, 8), o_bfirst = c.take(rows_n, 8), o_roff = c.take(rs.active ? g.E + 1 : 0, 8);
    const size_t o_rpos = c.take(rows_nb, 8), o_prow = c.take(rows_nb, 8);
    const size_t o_tcount = c.take(g.T, 8), o_tlist = c.take(g.T * g.E, 8), o_texp = c.take(g.T * g.E, 8);
    const size_t o_xr = c.take(rs.xr, es), o_mr = c.take(rs.mr, es), o_m0r = c.take(rs.m0r, es);
    const size_t o_sr = c.take(rs.sr, es), o_dgur = c.take(rs.dgur, es);
    const size_t o_x3 = c.take(rs.x3, es), o_s3 = c.take(rs.s3, es);
    const size_t o_toff = c.take(rs.term_rows ? g.E + 1 : 0, 8);
    const size_t o_dr = c.take(rs.dr, 4), o_dmr = c.take(rs.dmr, 4);
    unsigned char *ws = nullptr;
    cudaError_t err = cudaMallocAsync(&ws, c.bytes, stream);
    if (err != cudaSuccess)
        return moe_fail(err == cudaErrorMemoryAllocation ? MOE_ERR_OUT_OF_MEMORY : MOE_ERR_DEVICE,
                        "%s: cudaMallocAsync of the %zu-byte workspace failed: %s", p->op, c.bytes,
                        cudaGetErrorString(err));
    g.status = reinterpret_cast<int *>(ws + o_status);
    g.reports = reinterpret_cast<long long *>(ws + o_status + 8);
    g.pair_pos = reinterpret_cast<long long *>(ws + o_pairs);
    g.tok_first = g.overwrite ? reinterpret_cast<long long *>(ws + o_first) : nullptr;
    g.expert_start = reinterpret_cast<int64_t *>(ws + o_start);
    g.expert_blocks = reinterpret_cast<int64_t *>(ws + o_blocks);
    g.M = reinterpret_cast<float *>(ws + o_M);
    g.M0 = nM0 > 0 ? reinterpret_cast<float *>(ws + o_M0) : nullptr;
    g.contrib = reinterpret_cast<float *>(ws + o_contrib);
    g.dGU = reinterpret_cast<float *>(ws + o_dgu);
    g.Dre = reinterpret_cast<float *>(ws + o_dre);
    g.da = reinterpret_cast<float *>(ws + o_da);
    g.tok_count = reinterpret_cast<int64_t *>(ws + o_tcount);
    g.tok_list = reinterpret_cast<int64_t *>(ws + o_tlist);
    g.tok_expert = reinterpret_cast<int64_t *>(ws + o_texp);
    if (rs.active) {
        g.block_rows = reinterpret_cast<int64_t *>(ws + o_brows);
        g.block_first = reinterpret_cast<int64_t *>(ws + o_bfirst);
        g.row_offsets = reinterpret_cast<int64_t *>(ws + o_roff);
        g.row_pos = reinterpret_cast<int64_t *>(ws + o_rpos);
        g.pos_row = reinterpret_cast<int64_t *>(ws + o_prow);
        g.Xr = ws + o_xr, g.Mr = ws + o_mr, g.M0r = rs.m0r > 0 ? ws + o_m0r : nullptr;
        g.Sr = ws + o_sr, g.dGUr = ws + o_dgur;
        if (rs.term_rows) {
            g.term_offsets = reinterpret_cast<int64_t *>(ws + o_toff);
            g.X3 = rs.x3 > 0 ? ws + o_x3 : nullptr, g.S3 = rs.s3 > 0 ? ws + o_s3 : nullptr;
        }
        g.Dr = reinterpret_cast<float *>(ws + o_dr);
        g.dMr = reinterpret_cast<float *>(ws + o_dmr);
    }
    moe_status status = launch_layout(g, stream);
    if (status == MOE_OK && rs.active)
        status = launch_rows_layout(g, stream);
    if (status == MOE_OK)
        status = body(g, stream);
    return free_call_workspace(p->op, ws, stream, status);
}

} // namespace
} // namespace moe_gpu

using namespace moe_gpu;

// Forward.  Writes: out (all token_rows rows), gate_up_ckpt_T and down_ckpt when given (every position).
moe_status moe_cuda_mlp_fwd(const moe_mlp_problem *p, const void *hidden, const void *affinities, const void *w_gu,
                            const void *w_d, const void *b_gu, const void *b_d, void *out, void *gate_up_ckpt_T,
                            void *down_ckpt)
{
    // MOE_CUDA_KERNEL steers the fused kernel's rule (gate_fusion_refusal): an unknown value fails here, before any work
    KernelOverride forced;
    const moe_status env_status = kernel_override(p->op, &forced);
    if (env_status != MOE_OK)
        return env_status;
    MlpArgs g = base_args(p, 0);
    g.hidden = hidden, g.aff = affinities, g.w_gu = w_gu, g.w_d = w_d, g.b_gu = b_gu, g.b_d = b_d;
    g.out = out, g.ckpt_gu = gate_up_ckpt_T, g.ckpt_d = down_ckpt;
    const int64_t NB = g.positions, H = g.H, I = g.I;
    const bool ckpt_from_m0 = g.on_i && down_ckpt != nullptr;
    const bool split = p->dtype == MOE_BF16 && !p->round_intermediates;
    if (p->round_intermediates || split) {
        set_rows_path(g, split);
        RowsSizes rs = {};
        // no fp32 gate/up rows in the workspace: the fused kernel does without them, and the unfused path
        // allocates them itself (805 MB at Qwen3-30B-A3B, T = 16384).  Split: Mr, M0r, Dr and Dre by term rows.
        const int64_t nr = split ? 3 * NB : NB;
        rs.active = true, rs.term_rows = split, rs.xr = NB * H, rs.mr = nr * I, rs.m0r = ckpt_from_m0 ? nr * I : 0;
        rs.dr = nr * H;
        return with_workspace(p, g, 0, 0, 0, 0, ckpt_from_m0 ? nr * H : 0, 0, rs,
                              [&](const MlpArgs &a, cudaStream_t stream) -> moe_status {
            launch_token_lists(a, stream);
            moe_status s = gather_rows(a, a.hidden, a.Xr, nullptr, false, false, stream);
            if (s != MOE_OK)
                return s;
            launch_zero_padding(a, stream);
            MOE_CUDA_CHECK(cudaGetLastError());
            // the gate/up GEMM with the elementwise step in its epilogue where the sm_90a kernel takes the call;
            // otherwise the GEMM's fp32 rows (allocated here, stream-ordered) and gate_act_kernel
            int fused = 0;
            s = gate_up_fused(a, &fused, stream);
            if (s == MOE_OK && !fused && NB > 0) {
                MlpArgs u = a;
                cudaError_t err = cudaMallocAsync(reinterpret_cast<void **>(&u.GU), (size_t)(NB * 2 * I) * 4, stream);
                if (err != cudaSuccess)
                    return moe_fail(err == cudaErrorMemoryAllocation ? MOE_ERR_OUT_OF_MEMORY : MOE_ERR_DEVICE,
                                    "moe_mlp_fwd: cudaMallocAsync of the %lld-byte gate/up rows failed: %s",
                                    (long long)(NB * 2 * I * 4), cudaGetErrorString(err));
                s = rows_gemm(u, "moe_mlp_fwd (gate/up)", MOE_ROWS_A_W, MOE_F32, H, 2 * I, u.Xr, u.w_gu, u.GU, 0, stream);
                if (s == MOE_OK && NB * I > 0)
                    s = launch_gate_act(u, stream);
                s = free_call_workspace("moe_mlp_fwd", u.GU, stream, s);
            }
            if (s != MOE_OK)
                return s;
            MOE_CUDA_CHECK(cudaGetLastError());
            s = rows_gemm(a, "moe_mlp_fwd (down)", MOE_ROWS_A_W, MOE_F32, I, H, a.Mr, a.w_d, a.Dr, 0, stream, a.split);
            if (s == MOE_OK && ckpt_from_m0)
                s = rows_gemm(a, "moe_mlp_fwd (down checkpoint)", MOE_ROWS_A_W, MOE_F32, I, H, a.M0r, a.w_d, a.Dre, 0,
                              stream, a.split);
            if (s != MOE_OK)
                return s;
            const bool vec = H % 8 == 0 && (!a.bias || aligned16(a.b_d));
            const int ckpt_in_token_out = !a.on_i && a.ckpt_d != nullptr;
            if (NB * H > 0 && a.ckpt_d != nullptr && !ckpt_in_token_out)
                launch_down_ckpt(a, vec, stream);
            if (a.token_rows * H > 0)
                launch_token_out(a, vec, ckpt_in_token_out, stream);
            MOE_CUDA_CHECK(cudaGetLastError());
            return MOE_OK;
        });
    }
    return with_workspace(p, g, NB * I, ckpt_from_m0 ? NB * I : 0, NB * H, 0, 0, 0, RowsSizes{},
                          [&](const MlpArgs &a, cudaStream_t stream) -> moe_status {
        moe_status s = tile_path_fwd(a, ckpt_from_m0, stream);
        if (s == MOE_OK) {
            launch_token_lists(a, stream);
            s = token_rows(a, a.contrib, a.out, stream);
        }
        return s;
    });
}

// Backward.  Writes: d_hidden (all rows), d_affinities (all T*E), d_w_gu, d_w_d, d_b_gu, d_b_d (every
// element; old + sum with accumulate).
moe_status moe_cuda_mlp_bwd(const moe_mlp_problem *p, const void *hidden, const void *affinities, const void *w_gu,
                            const void *w_d, const void *b_d, const void *gate_up_ckpt_T, const void *down_ckpt,
                            const void *out_grad, void *d_hidden, void *d_affinities, void *d_w_gu, void *d_w_d,
                            void *d_b_gu, void *d_b_d)
{
    // MOE_CUDA_KERNEL steers the fused kernel's rule (gate_fusion_refusal): an unknown value fails here, before any work
    KernelOverride forced;
    const moe_status env_status = kernel_override(p->op, &forced);
    if (env_status != MOE_OK)
        return env_status;
    MlpArgs g = base_args(p, 1);
    // the masks compare the checkpointed value with the limit as the checkpoint stores it (specs/MLP.md)
    g.lin_lo = round_to_dtype(p->dtype, p->lin_lo), g.lin_hi = round_to_dtype(p->dtype, p->lin_hi);
    g.nl_lo = round_to_dtype(p->dtype, p->nl_lo), g.nl_hi = round_to_dtype(p->dtype, p->nl_hi);
    g.hidden = hidden, g.aff = affinities, g.w_gu = w_gu, g.w_d = w_d, g.b_d = b_d;
    g.ckpt_gu_in = gate_up_ckpt_T, g.ckpt_d_in = down_ckpt, g.out_grad = out_grad;
    g.d_hidden = d_hidden, g.d_aff = d_affinities, g.d_wgu = d_w_gu, g.d_wd = d_w_d, g.d_bgu = d_b_gu, g.d_bd = d_b_d;
    const int64_t NB = g.positions, H = g.H, I = g.I, E = g.E;
    const bool recompute = down_ckpt == nullptr; // ON_I only (the front end checked)
    const bool split = p->dtype == MOE_BF16 && !p->round_intermediates;
    if (p->round_intermediates || split) {
        set_rows_path(g, split);
        RowsSizes rs = {};
        // split: Mr, M0r, dGUr, Dr and Dre by term rows, X and G copied to them for the weight gradients (the
        // X rows themselves are not needed)
        const int64_t nr = split ? 3 * NB : NB;
        rs.active = true, rs.term_rows = split, rs.xr = split ? 0 : NB * H, rs.sr = NB * H;
        rs.mr = nr * I, rs.m0r = recompute ? nr * I : 0, rs.dgur = nr * 2 * I, rs.dmr = NB * I, rs.dr = nr * H;
        rs.x3 = split ? 3 * NB * H : 0, rs.s3 = rs.x3;
        g.dre_bias = recompute && g.bias;
        return with_workspace(p, g, 0, 0, 0, 0, recompute ? nr * H : 0, NB, rs,
                              [&](const MlpArgs &a, cudaStream_t stream) -> moe_status {
            const int64_t cap = (int64_t)sm_count() * 16;
            launch_token_lists(a, stream);
            moe_status s = gather_rows(a, a.hidden, a.split ? nullptr : a.Xr, a.X3, false, false, stream);
            if (s == MOE_OK) // da too, from the checkpoint
                s = gather_rows(a, a.out_grad, a.Sr, a.S3, !a.a_in_m, !recompute, stream);
            if (s == MOE_OK)
                s = rows_gemm(a, "moe_mlp_bwd (dM)", MOE_ROWS_A_WT, MOE_F32, I, H, a.Sr, a.w_d, a.dMr, 0, stream);
            if (s != MOE_OK)
                return s;
            if (NB * I > 0)
                s = launch_gate_bwd(a, stream);
            if (s != MOE_OK)
                return s;
            MOE_CUDA_CHECK(cudaGetLastError());
            if (recompute) {
                s = rows_gemm(a, "moe_mlp_bwd (d recomputed)", MOE_ROWS_A_W, MOE_F32, I, H, a.M0r, a.w_d, a.Dre, 0,
                              stream, a.split);
                if (s != MOE_OK)
                    return s;
            }
            if (recompute) {
                s = launch_dot(a, stream);
                if (s != MOE_OK)
                    return s;
            }
            launch_daff(a, cap, stream);
            MOE_CUDA_CHECK(cudaGetLastError());
            s = rows_gemm(a, "moe_mlp_bwd (dX)", MOE_ROWS_A_WT, MOE_F32, H, 2 * I, a.dGUr, a.w_gu, a.Dr, 0, stream,
                          a.split);
            if (s == MOE_OK)
                s = token_rows(a, a.Dr, a.d_hidden, stream);
            if (s == MOE_OK)
                s = rows_gemm(a, "moe_mlp_bwd (d_w_d)", MOE_ROWS_AT_B, a.gdt, I, H, a.Mr, a.split ? a.S3 : a.Sr, a.d_wd,
                              a.accumulate, stream, a.split);
            if (s == MOE_OK)
                s = rows_gemm(a, "moe_mlp_bwd (d_w_gu)", MOE_ROWS_AT_B, a.gdt, H, 2 * I, a.split ? a.X3 : a.Xr, a.dGUr,
                              a.d_wgu, a.accumulate, stream, a.split);
            if (s == MOE_OK && a.bias && E * (H + 2 * I) > 0) {
                launch_rows_bias_grad(a, cap, stream);
                MOE_CUDA_CHECK(cudaGetLastError());
            }
            return s;
        });
    }
    return with_workspace(p, g, NB * I, recompute ? NB * I : 0, NB * H, NB * 2 * I, recompute ? NB * H : 0, NB,
                          RowsSizes{}, [&](const MlpArgs &a, cudaStream_t stream) -> moe_status {
        const int64_t cap = (int64_t)sm_count() * 16;
        moe_status s = tile_path_dm(a, recompute, stream);
        if (s != MOE_OK)
            return s;
        s = launch_dot(a, stream);
        if (s != MOE_OK)
            return s;
        launch_daff(a, cap, stream);
        MOE_CUDA_CHECK(cudaGetLastError());
        s = tile_path_dx(a, stream);
        if (s == MOE_OK) {
            launch_token_lists(a, stream);
            s = token_rows(a, a.contrib, a.d_hidden, stream);
        }
        if (s == MOE_OK)
            s = tile_path_dw(a, stream);
        if (s == MOE_OK && a.bias && E * (H + 2 * I) > 0) {
            launch_bias_grad(a, cap, stream);
            MOE_CUDA_CHECK(cudaGetLastError());
        }
        return s;
    });
}
