// Launch helpers of every gpu/ compile unit: the device's SM count, grid sizes, ceiling division, alignment
// tests, the grid-stride loop and the "no position" mark of the integer atomicMin reports.
#ifndef LIBMOE_GPU_COMMON_LAUNCH_CUH
#define LIBMOE_GPU_COMMON_LAUNCH_CUH

#include <cuda_runtime.h>
#include <limits.h>
#include <stdint.h>

namespace moe_gpu {

// "No position" in the reports that integer atomicMin fills (the smallest bad index wins).
constexpr long long NONE = LLONG_MAX;

__host__ __device__ __forceinline__ int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline bool aligned_to(const void *p, uintptr_t bytes) { return ((uintptr_t)p & (bytes - 1)) == 0; }
inline bool aligned16(const void *p) { return aligned_to(p, 16); }

// The current device's SM count (132, an H100's, when the query fails).
inline int sm_count()
{
    int device = 0, sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
        return 132;
    return sms;
}

// CTAs of per_block work items each for `work` items, at most cap, at least one.
inline unsigned grid_for(int64_t work, int64_t per_block, int64_t cap)
{
    int64_t blocks = (work + per_block - 1) / per_block;
    if (blocks > cap)
        blocks = cap;
    return (unsigned)(blocks < 1 ? 1 : blocks);
}

// Grid of a persistent kernel: per_sm CTAs per SM, no more than max_tiles (each CTA needs a tile), at least one.
inline unsigned persistent_grid(int64_t max_tiles, int per_sm = 1)
{
    int64_t grid = (int64_t)sm_count() * (per_sm > 0 ? per_sm : 1);
    if (grid > max_tiles)
        grid = max_tiles;
    return (unsigned)(grid < 1 ? 1 : grid);
}

// Grid of a grid-stride kernel: `wanted` CTAs, but no more than fit on the device at once.  A larger grid
// leaves a partial last wave whose CTAs, each with a full share of the work, run at the end on a part of
// the device (ncu on an H100: gate_bwd_kernel's 1056 CTAs were 1.33 waves).  A failed occupancy query
// leaves its error for the caller's cudaGetLastError check.
template <class Kernel>
unsigned resident_grid(Kernel kernel, int threads, int64_t wanted)
{
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0) != cudaSuccess || per_sm < 1)
        per_sm = 1;
    return grid_for(wanted, 1, (int64_t)sm_count() * per_sm);
}

} // namespace moe_gpu

// for (var = this thread's first index; var < count; var += the grid's threads)
#define GRID_STRIDE(var, count)                                                                     \
    for (int64_t var = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; var < (count);               \
         var += (int64_t)gridDim.x * blockDim.x)

#endif
