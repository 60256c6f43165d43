// The GEMM's shape rules and environment overrides (which kernel, which tiles, which grid), apart from the
// kernels; each rule's measurements are beside it in gemm/heuristics.cu.
#ifndef LIBMOE_GPU_GEMM_HEURISTICS_CUH
#define LIBMOE_GPU_GEMM_HEURISTICS_CUH

#include <initializer_list>
#include <stdint.h>

#include "gemm/gemm.cuh"

namespace moe_gpu {

// The grid of sm90 fwd and dX launches in the static tile order: a multiple of H_GRID_ALIGN CTAs (sm90_grid_cap).
constexpr int64_t H_GRID_ALIGN = 8;
// fwd pairs CTAs from this K with long experts (sm90_cluster_size; dX: autotune only)
constexpr int H_PAIRED_REDUCTION = 4096;
// The fused kernel is taken (unless MOE_MLP_FUSE_GATE=1 forces it) when the GEMM has at least this many rows
// per expert on average (positions, padding included).  Its m64n128 MMAs, one warpgroup at a time, run
// slower than the 128 x 256 kernel's; the epilogue it saves pays that back on long experts only: forward fused /
// unfused, it lost at 183 positions per expert (gpt-oss-120b T = 4096), was even at 319 (Qwen3-30B-A3B T = 4096)
// and won from about 1000 (H100; bench/RESULTS.md, "a size rule for the fusion").
constexpr int64_t G_FUSE_MIN_ROWS = 256;
// The longest reduction (dX form: N, forward form: K) the rows kernels hand it (rows_f32_pingpong in
// gemm/rows_f32_sm90.cu).  Its 128 x 128 tiles move a third more bytes per MMA from L2 and shared memory than the
// 128 x 256 kernel's, which only a large share of epilogue in the tile's time pays back: with short reductions.
// Measured in both forms, the kernel alone, with five stages: ahead up to a reduction of 1024, about even at 1536,
// behind from 2048 (ncu; bench/RESULTS.md, "the f32 rows kernel's bound with five stages").
// 4096 (the E128 row) 1678 / 1849, 7168 5493 / 6282.
constexpr int64_t R_PINGPONG_MAX_N = 1024;

int env_switch(const char *name);
int sm90_skip_from_env();
bool sm90_path_available();
bool tensor_core_ok(const moe_gemm_problem *p, const void *a, const void *b, const void *out);
int64_t sm90_grid_cap(int64_t ctas);
bool sm90_dynamic_tiles(const moe_gemm_problem *p, int op);
bool sm90_full_blocks(const moe_gemm_problem *p);
int sm90_tile_rows(int op, const moe_tune_choice *tuned);
int sm90_cluster_size(const moe_gemm_problem *p, int op, int bm, const moe_tune_choice *tuned);
bool sm90_dw_pingpong(const moe_gemm_problem *p, const moe_tune_choice *tuned);
bool sm90_dw_wide(void);
const char *gate_fusion_refusal(const MoeRowsGemm *r, bool form_ok, int64_t H, int64_t I, bool required,
                                std::initializer_list<const void *> outs);
bool gate_fusion_required();
bool fp8_sm90_staged_scales(int op, bool w_kn);
// MOE_CUDA_KERNEL (tests and tuning runs): unset, "" or "auto": the plan's rules; "sm90": the rules, but a refused
// TMA descriptor is an error instead of the sm80 family; "sm80", "simt": that family where it can take the call.
enum KernelOverride { KERNEL_AUTO, KERNEL_SM90, KERNEL_SM80, KERNEL_SIMT };
// Reads MOE_CUDA_KERNEL into *kernel; any other value fails with MOE_ERR_INVALID_OPTION naming op and the value
// (a misspelt override is not ignored).
moe_status kernel_override(const char *op, KernelOverride *kernel);
bool fp8_sm90_tma_store(int op);
bool fp8_sm90_wide_tiles(int op, int64_t M, int64_t E);
bool fp8_dw_sm90_enabled();

} // namespace moe_gpu

#endif
