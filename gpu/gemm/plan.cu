// The GEMM's plan: the kernel family, tile shape, cluster and tensor maps of a call (environment overrides, the
// autotune driver's candidate, the autotune table, then the shape rules of gemm/heuristics.cu), and its launch.
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/simt_tile.cuh"
#include "gemm/heuristics.cuh"
#include "gemm/plan.cuh"
#include "gemm/sm80.cuh"
#include "gemm/sm90.cuh"
#include "gemm/tune.cuh"

namespace moe_gpu {

// Picks the family for op over problem p (a, b, out: the operands as run_gemm names them) and fills
// plan (tile shape, cluster, tensor maps, the sm90 dW kernel) and g->tma_rows.  Order of authority: the
// MOE_CUDA_KERNEL / MOE_SM90_* environment overrides, then the autotune driver's forced candidate, then the
// autotune table, then the shape heuristic.  Fails when MOE_CUDA_KERNEL is not a known value, and when
// MOE_CUDA_KERNEL=sm90 forces a refused TMA descriptor.
moe_status plan_gemm(const moe_gemm_problem *p, int op, const void *a, const void *b, const void *out,
                     moe_dtype out_dtype, bool weighted, GemmArgs *g, Plan *plan)
{
    KernelOverride forced;
    const moe_status env_status = kernel_override(p->op, &forced);
    if (env_status != MOE_OK)
        return env_status;
    const bool forced_family = forced == KERNEL_SIMT || forced == KERNEL_SM80;
    moe_tune_key key;
    const bool tunable = op != OP_TOPK_GRAD;
    if (tunable)
        tune_key_of(p, op, out_dtype, weighted, &key);
    moe_tune_choice table_choice;
    const moe_tune_choice *tuned = !tunable ? nullptr
                                 : tune_forced != nullptr ? tune_forced
                                 : moe_tune_table_used() && moe_tune_lookup(&key, &table_choice) ? &table_choice
                                 : nullptr;
    // dW with fused topk weights: the two-term split of w * dY, into bf16 terms on the sm90 and sm80 kernels for
    // bf16, into TF32 terms on the sm80 kernel for f16 (no sm90 kernel); f32 with allow_tf32: fl32(w * dY)
    // rounded to TF32 like any operand
    const bool weighted_dw = op == OP_DW && weighted;
    // f32: true fp32 (SIMT) unless the caller allows TF32, which the TF32 kernel (sm80 family) uses for every op
    const bool f32_ok = p->dtype != MOE_F32 || p->allow_tf32;
    // A tuned "simt" binds nothing: the autotune records it only where no tensor-core kernel took the call (no
    // candidate is SIMT), which a call of the same key may not share (16-byte alignment is not in the key) and
    // a later libmoe may have changed (f16 weighted dW and f32 weighted dW with allow_tf32 were SIMT before
    // the change of bench/RESULTS.md, "weighted dW on tensor cores for f16 and for f32 with allow_tf32")
    const bool use_tc = tensor_core_ok(p, a, b, out) && f32_ok && forced != KERNEL_SIMT;
    const bool want_sm80 = forced == KERNEL_SM80 ||
                           (!forced_family && tuned != nullptr && tuned->kernel == MOE_TUNE_SM80);
    plan->family = !use_tc ? FAMILY_SIMT
                 : op != OP_TOPK_GRAD && p->dtype != MOE_F32 && !(weighted_dw && p->dtype == MOE_F16) &&
                           sm90_path_available() && !want_sm80 ? FAMILY_SM90
                 : FAMILY_SM80;
    memset(&plan->maps, 0, sizeof plan->maps);
    g->tma_rows = 0, g->tma_out = 0, g->tma_out_wide = 0;
    const int sm90_bm = sm90_tile_rows(op, tuned);
    plan->cluster = plan->family == FAMILY_SM90 ? sm90_cluster_size(p, op, sm90_bm, tuned) : 1;
    const bool tma_store_allowed = tuned == nullptr || tuned->kernel != MOE_TUNE_SM90 || tuned->tma_store != 0;
    if (plan->family == FAMILY_SM90 &&
        !encode_sm90_maps(p, op, sm90_bm, plan->cluster, tma_store_allowed, a, b, out, out_dtype, g, &plan->maps)) {
        if (forced == KERNEL_SM90) // tests: the Hopper path must take every shape it can
            return moe_fail(MOE_ERR_DEVICE, "%s: MOE_CUDA_KERNEL=sm90 but the TMA descriptors were refused", p->op);
        plan->family = FAMILY_SM80;
        plan->cluster = 1;
    }
    plan->dw_pingpong = plan->family == FAMILY_SM90 && op == OP_DW && !weighted_dw && g->tma_rows && g->tma_out_wide &&
                        sm90_dw_pingpong(p, tuned);
    g->dynamic_tiles = plan->family == FAMILY_SM90 && plan->cluster == 1 && (op == OP_FWD || op == OP_DX) &&
                       g->tma_rows && sm90_dynamic_tiles(p, op);
    g->full_blocks = plan->family == FAMILY_SM90 && plan->cluster == 1 && (op == OP_FWD || op == OP_DX) &&
                     sm90_full_blocks(p);
    plan->bm = plan->family == FAMILY_SM90 ? sm90_bm : use_tc ? TC_BM : SIMT_BM;
    plan->bn = plan->family == FAMILY_SM90 ? h_bn(sm90_bm) : use_tc ? TC_BN : SIMT_BN;
    if (tunable) {
        tune_planned = true;
        tune_last_key = key;
        tune_last_choice.kernel = plan->family == FAMILY_SM90 ? MOE_TUNE_SM90
                                : plan->family == FAMILY_SM80 ? MOE_TUNE_SM80 : MOE_TUNE_SIMT;
        tune_last_choice.tile_rows = plan->bm;
        tune_last_choice.cluster = plan->cluster;
        tune_last_choice.tma_store = g->tma_out != 0;
        tune_last_choice.dw_pingpong = plan->dw_pingpong;
        tune_last_choice.median_us = 0.0;
    }
    return MOE_OK;
}

// Launches the planned GEMM kernel (g complete); max_tiles bounds the persistent grid.
moe_status launch_plan(const Plan &plan, int op, const GemmArgs &g, int64_t max_tiles, cudaStream_t stream)
{
    if (max_tiles <= 0 || g.cols_j <= 0)
        return MOE_OK;
    if (plan.family == FAMILY_SM90)
        return g.dtype == MOE_BF16
                   ? launch_sm90<__nv_bfloat16>(op, plan.bm, plan.cluster, plan.dw_pingpong != 0, g, plan.maps, max_tiles, stream)
                   : launch_sm90<__half>(op, plan.bm, plan.cluster, plan.dw_pingpong != 0, g, plan.maps, max_tiles, stream);
    if (plan.family == FAMILY_SM80)
        return g.dtype == MOE_BF16 ? launch_tc<__nv_bfloat16>(op, g, max_tiles, stream)
             : g.dtype == MOE_F16  ? launch_tc<__half>(op, g, max_tiles, stream)
                                   : launch_tf32(op, g, max_tiles, stream);
    return launch_simt(g, max_tiles, stream);
}

// Upper bound of the tile count (the grid of a persistent launch).
int64_t max_tiles_of(int op, int64_t E, int64_t M, int64_t N, int bm, int64_t col_tiles)
{
    return op == OP_DW ? E * ((N + bm - 1) / bm) * col_tiles : (M / bm + E) * col_tiles;
}

} // namespace moe_gpu
