// Warp-wide inclusive prefix sums (shuffle scans), shared by the device builders (gpu/routing/), the grouped
// GEMM's size checks and tile starts (gpu/gemm/) and the MLP's layout (gpu/mlp/).
#ifndef LIBMOE_GPU_COMMON_WARP_SCAN_CUH
#define LIBMOE_GPU_COMMON_WARP_SCAN_CUH

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

// Called by one whole warp: counts[1 .. n] (counts[0] not read) become running totals, counts[e] = the sum
// of the counts 1 .. e given, counts[0] = 0; 32 entries at a time by a shuffle scan, where a serial sum by
// one thread waited on each global load in turn (the MLP's expert_lists_kernel and row_offsets_kernel ran faster
// under ncu; bench/RESULTS.md, "the routing's prefix sums as warp scans").  The caller synchronises the CTA before and
// after.
static __device__ __forceinline__ void warp_prefix_sum(int64_t *counts, int64_t n)
{
    const int lane = threadIdx.x % 32;
    int64_t carry = 0; // the sum of the entries before e0
    for (int64_t e0 = 0; e0 < n; e0 += 32) {
        const bool inside = e0 + lane < n;
        const int64_t sum = warp_inclusive_sum(inside ? counts[e0 + lane + 1] : 0);
        if (inside)
            counts[e0 + lane + 1] = carry + sum;
        carry += warp_last_lane(sum);
    }
    if (lane == 0)
        counts[0] = 0;
}

#endif
