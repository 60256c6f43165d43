// dW's 128 x 1 tiles on the device (specs/FP8.md, "dW"): each expert's rows are tiled from its own offset, and the
// tile of expert e beginning at expert row offsets[e] + 128 j has scale row offsets[e] / 128 + e + j.  Shared by
// the columns quantizer (gpu/fp8/quantize.cu), the FP8 GEMM's scale check (gpu/gemm/fp8.cu) and the dW kernel
// (gpu/gemm/fp8_dw.cu); offsets [E + 1] are the routing check's (trusted once it passed).
#ifndef LIBMOE_GPU_FP8_COLUMN_TILES_CUH
#define LIBMOE_GPU_FP8_COLUMN_TILES_CUH

#include <stdint.h>

extern "C" {
#include "moe_fp8.h"
}

namespace moe_gpu {

// The scale row of expert e's first tile (its later tiles follow it).
__host__ __device__ __forceinline__ int64_t column_first_scale_row(const int64_t *offsets, int64_t e)
{
    return offsets[e] / MOE_FP8_TILE + e;
}

// The expert rows [*first, *end) of the tile whose scales are in scale row s, or false when no tile uses that
// row (then the quantizer writes an empty tile's scale there).  The first scale rows of the experts grow with e
// and no tile of expert e reaches expert e + 1's first scale row, so the tile is the last expert's whose first
// scale row is at most s (a binary search), if s is within its tiles.
__device__ __forceinline__ bool column_tile_of_scale_row(const int64_t *offsets, int64_t E, int64_t s, int64_t *first,
                                                         int64_t *end)
{
    int64_t lo = 0, hi = E - 1;
    while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if (column_first_scale_row(offsets, mid) <= s)
            lo = mid;
        else
            hi = mid - 1;
    }
    const int64_t j = s - column_first_scale_row(offsets, lo);
    const int64_t r0 = offsets[lo] + j * MOE_FP8_TILE;
    if (j < 0 || r0 >= offsets[lo + 1])
        return false;
    *first = r0;
    *end = offsets[lo + 1] - r0 < MOE_FP8_TILE ? offsets[lo + 1] : r0 + MOE_FP8_TILE;
    return true;
}

} // namespace moe_gpu

#endif
