// Warp-wide inclusive prefix sums (shuffle scans), shared by the routing (gpu/routing_cuda.cu), the grouped
// GEMM's size checks and tile starts (gpu/gemm_cuda.cu) and the MLP's layout (gpu/mlp_cuda.cu).
#ifndef LIBMOE_WARP_SCAN_CUDA_CUH
#define LIBMOE_WARP_SCAN_CUDA_CUH

#include <stdint.h>

// The sum of v over lanes 0 .. this lane of the warp.  Every lane of the warp calls it.
static __device__ __forceinline__ int64_t warp_inclusive_sum(int64_t v)
{
    const int lane = threadIdx.x % 32;
    for (int offset = 1; offset < 32; offset *= 2) {
        const int64_t below = __shfl_up_sync(0xffffffffu, v, offset);
        if (lane >= offset)
            v += below;
    }
    return v;
}

// The value of lane 31 (after warp_inclusive_sum: the warp's total).  Every lane of the warp calls it.
static __device__ __forceinline__ int64_t warp_last_lane(int64_t v) { return __shfl_sync(0xffffffffu, v, 31); }

#endif
