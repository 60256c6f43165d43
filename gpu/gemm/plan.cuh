// The GEMM's plan (which kernel family runs a call, with its tiles and tensor maps) and the launchers of the
// families, shared by the GEMM's compile units.
#ifndef LIBMOE_GPU_GEMM_PLAN_CUH
#define LIBMOE_GPU_GEMM_PLAN_CUH

#include <cuda_runtime.h>

#include "common/cuda_check.cuh"
#include "gemm/args.cuh"
#include "gemm/tma.cuh"

namespace moe_gpu {

// Kernel family for a call.  MOE_CUDA_KERNEL=auto (default) | sm80 | simt forces a family, so tests can
// exercise every path on one GPU; a forced family still falls back when it cannot take the shape.
// MOE_CUDA_KERNEL=sm90 is auto, except that a refused TMA descriptor is an error instead of a quiet
// fallback to sm80 (so a test run proves the Hopper path took its shapes).
enum KernelFamily { FAMILY_SIMT, FAMILY_SM80, FAMILY_SM90 };

// Which kernel family runs a call, with its tile shape and (sm90) tensor maps.
struct Plan {
    KernelFamily family;
    int bm, bn;
    int cluster; // sm90: 2 for the paired kernel (fwd, dX with 128-row tiles), else 1
    int dw_pingpong; // sm90 dW with every operand and a 16-bit output by TMA: 1 sm90_dw_pingpong_kernel, else 0
    Sm90Maps maps; // sm90: TMA descriptors (unused ones stay zero)
};

moe_status plan_gemm(const moe_gemm_problem *p, int op, const void *a, const void *b, const void *out,
                     moe_dtype out_dtype, bool weighted, GemmArgs *g, Plan *plan);
moe_status launch_plan(const Plan &plan, int op, const GemmArgs &g, int64_t max_tiles, cudaStream_t stream);
int64_t max_tiles_of(int op, int64_t E, int64_t M, int64_t N, int bm, int64_t col_tiles);

// A call's device workspace (gemm/gemm.cu): Workspace's arrays for E experts and M rows in one cudaMallocAsync
// at *base (freed by the caller with free_call_workspace, common/cuda_check.cuh), then extra_floats floats of
// fp32 scratch at *extra.
cudaError_t alloc_call_workspace(int64_t E, int64_t M, int64_t extra_floats, cudaStream_t stream,
                                 unsigned char **base, Workspace *w, float **extra);
// reduce_topk's fixed-order sum (gemm/gemm.cu): dx[t][c] = sum_j slots[t*k + j][c] in j order (+ old with
// accumulate), one rounding to dtype; nothing while *status != 0.
void launch_reduce_topk(const float *slots, int64_t T, int64_t k, int64_t K, void *dx, moe_dtype dtype, int accumulate,
                        const int *status, cudaStream_t stream);

// The routing check (gemm/routing_check.cu).  op names the entry point in its messages: a GemmOp, or
// ROUTING_OP_FP8_FWD / _DX / _DW for the FP8 GEMM's calls (gemm/fp8.cu, gemm/fp8_dw.cu), ROUTING_OP_FP8_COLUMNS
// for the columns quantizer's (fp8/quantize.cu).
constexpr int ROUTING_OP_FP8_FWD = 4, ROUTING_OP_FP8_DX = 5, ROUTING_OP_FP8_DW = 6, ROUTING_OP_FP8_COLUMNS = 7;
void launch_routing_check(const moe_gemm_problem *p, int op, int64_t col_tiles, int rows_per_tile, bool paired,
                          int64_t bitmap_words, const Workspace &w, cudaStream_t stream);

// The families' launchers (max_tiles bounds the persistent grid): gemm/simt.cu, gemm/sm80.cu (T: __nv_bfloat16,
// __half), gemm/tf32.cu, gemm/sm90.cu.
moe_status launch_simt(const GemmArgs &g, int64_t max_tiles, cudaStream_t stream);
moe_status launch_sm80_family(void (*kernel)(GemmArgs), const GemmArgs &g, int64_t max_tiles, cudaStream_t stream);
template <typename T> moe_status launch_tc(int op, const GemmArgs &g, int64_t max_tiles, cudaStream_t stream);
moe_status launch_tf32(int op, const GemmArgs &g, int64_t max_tiles, cudaStream_t stream);
template <typename T>
moe_status launch_sm90(int op, int bm, int cluster, bool pingpong, const GemmArgs &g, const Sm90Maps &maps,
                       int64_t max_tiles, cudaStream_t stream);

} // namespace moe_gpu

#endif
