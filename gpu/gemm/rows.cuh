// The frame of the rows GEMMs (moe_cuda_rows_gemm, the MLP's fused gate/up GEMM): tile starts from trusted
// offsets, their GemmArgs, and the f32 rows ping-pong kernel's entry.
#ifndef LIBMOE_GPU_GEMM_ROWS_CUH
#define LIBMOE_GPU_GEMM_ROWS_CUH

#include "gemm/args.cuh"
#include "gemm/gemm.cuh"

namespace moe_gpu {

// The frame of every rows GEMM: the tile starts of r's experts (rows_tiles_kernel: col_tiles column tiles,
// rows_per_tile rows, paired or not) in a stream-ordered allocation, launch(context, tile_start, lone_start,
// tile_counter), the allocation freed.  The launch's status is returned, or the frame's own failure.
typedef moe_status (*TileStartsLaunch)(void *context, int64_t *tile_start, int64_t *lone_start,
                                       unsigned long long *tile_counter);
moe_status with_tile_starts_of(const MoeRowsGemm *r, int64_t col_tiles, int64_t rows_per_tile, bool paired,
                               TileStartsLaunch launch, void *context);
// The same with launch(tile_start, lone_start, tile_counter) a callable.
template <class Launch>
moe_status with_tile_starts(const MoeRowsGemm *r, int64_t col_tiles, int64_t rows_per_tile, bool paired,
                            Launch launch)
{
    return with_tile_starts_of(
        r, col_tiles, rows_per_tile, paired,
        [](void *context, int64_t *tile_start, int64_t *lone_start, unsigned long long *tile_counter) {
            return (*static_cast<Launch *>(context))(tile_start, lone_start, tile_counter);
        },
        &launch);
}

GemmArgs rows_gemm_args(const MoeRowsGemm *r, int op, int64_t cols_j, int64_t *tile_start, int64_t *lone_start,
                        unsigned long long *tile_counter);

// gemm/rows_f32_sm90.cu: the f32 rows ping-pong kernel for r, or *taken = 0.
moe_status rows_f32_pingpong(const MoeRowsGemm *r, int *taken);

} // namespace moe_gpu

#endif
