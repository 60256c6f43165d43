// The SIMT fp32 tile shape of the GEMM's SIMT kernel (gpu/gemm/simt.cu) and the MLP's tile engine
// (gpu/mlp/tile_engine.cuh): 64 x 64 output tiles, 16-deep k-steps staged in shared memory as fp32, 256 threads
// each owning 4 x 4 outputs (rows ty + 16u, columns tx + 16v) accumulated with fp32 FMA in ascending k.
#ifndef LIBMOE_GPU_COMMON_SIMT_TILE_CUH
#define LIBMOE_GPU_COMMON_SIMT_TILE_CUH

namespace moe_gpu {

constexpr int SIMT_BM = 64, SIMT_BN = 64, SIMT_BK = 16, SIMT_THREADS = 256;

// The two kernels keep their own k-step loops: one shared loop (fmaf) changed simt_gemm_kernel's SASS (sm_80: 60 ->
// 63 registers; its `acc += a * b` contracts to the same FFMAs, scheduled differently).

} // namespace moe_gpu

#endif
