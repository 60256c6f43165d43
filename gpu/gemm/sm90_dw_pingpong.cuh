// The sm90 dW ping-pong kernel's tile shape and shared memory, and its entry (gemm/sm90_dw_pingpong.cu), for
// launch_sm90 (gemm/sm90.cu).
#ifndef LIBMOE_GPU_GEMM_SM90_DW_PINGPONG_CUH
#define LIBMOE_GPU_GEMM_SM90_DW_PINGPONG_CUH

#include "gemm/sm90.cuh"

namespace moe_gpu {

// ------------------------------------------------------------------------------------------------------------
// dW ping-pong kernel (the dW launches whose operands and output all go by TMA: no permute, no accumulate;
// MOE_SM90_DW_PINGPONG=0 falls back to sm90_gemm_kernel).  dW's reduction is one expert's rows, so a tile has
// only a few k-steps (4 at Qwen3-30B-A3B, T = 4096) and a large output: in sm90_gemm_kernel both consumer
// warpgroups share one 128 x 256 tile, so the tensor cores idle while they write it.  Here each consumer
// warpgroup owns whole 128 x 128 tiles (two m64n128 blocks, the same 128 fp32 accumulators per thread): the
// CTA's tiles alternate between the warpgroups (local tile i to warpgroup i % 2), and an ordering barrier
// lets a warpgroup start its MMAs only when the other has issued the MMAs of the previous tile, so one
// warpgroup's MMAs run while the other writes its tile.
//   Ring: P_STAGES stages of 32 KiB (dY 2 boxes {64 n, 64 rows}, X 2 boxes {64 c, 64 rows}, MN-major as in
//   sm90_gemm_kernel), filled in tile order by producer thread 0; a warpgroup steps its ring position over the
//   other's tiles (it knows their k-step counts), so the ring is consumed in the order it is filled.  Each
//   stage's empty barrier counts the 4 warps of the warpgroup that owns it.
//   Named barriers: 1 + w, warpgroup w's turn for MMAs (the other warpgroup's 128 threads arrive, w's 128
//   wait); 3 + w, warpgroup w alone (the tail rows of a partial last k-step, as h_zero_tail_rows).
//   Epilogue: the warpgroup rounds its tile into four 8 KiB boxes of its own epilogue area (64 rows x 64
//   16-bit columns each, the 64-row map maps.out_wide) and its thread 0 stores them by TMA; the 1 KiB boxes of
//   h_store_warp_tma gained nothing here (bench/RESULTS.md, "dW ping-pong kernel for short experts").  Each output
//   tile is owned by one warpgroup, which reduces in a fixed order: bitwise reproducible, as sm90_gemm_kernel.
// P_*: the ping-pong dW kernel's tile, ring and epilogue area.
constexpr int P_BM = 128, P_BN = 128, P_STAGES = 5;
constexpr int P_A_BYTES = P_BM * H_BK * 2, P_STAGE_BYTES = P_A_BYTES + P_BN * H_BK * 2; // 32 KiB
constexpr int P_EPI_OFFSET = P_STAGES * P_STAGE_BYTES;
constexpr int P_BOX_BYTES = H_WIDE_BOX_BYTES;                // 64 rows of 64 16-bit columns
constexpr int P_EPI_WG_BYTES = (P_BM / 64) * (P_BN / 64) * P_BOX_BYTES; // a warpgroup's whole tile, 32 KiB
constexpr int P_BARRIER_OFFSET = P_EPI_OFFSET + 2 * P_EPI_WG_BYTES; // full[S], empty[S]
constexpr size_t P_SMEM_BYTES = 1024 /* alignment */ + P_BARRIER_OFFSET + 2 * P_STAGES * 8;
static_assert(P_EPI_OFFSET % 1024 == 0 && P_SMEM_BYTES <= 232448, "shared memory of the ping-pong kernel");

// The kernels of the sm90 family: fn(g, maps).
typedef void (*Sm90Kernel)(GemmArgs, Sm90Maps);

// sm90_dw_pingpong_kernel<T> (T: __nv_bfloat16 or __half).
template <typename T> Sm90Kernel sm90_dw_pingpong_entry();

} // namespace moe_gpu

#endif
