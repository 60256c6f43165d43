// TMA descriptors (CUtensorMap) on the host: the encoder and the sm90 GEMM kernels' maps (Sm90Maps).
#ifndef LIBMOE_GPU_GEMM_TMA_CUH
#define LIBMOE_GPU_GEMM_TMA_CUH

#include <cuda.h> // CUtensorMap and its enums only; the encoder comes through cudaGetDriverEntryPointByVersion
#include <stdint.h>

#include "gemm/args.cuh"

namespace moe_gpu {

// The kernel's TMA descriptors (one __grid_constant__ parameter; unused ones are zero): W [E][N][K] as 3-D
// (fwd: box {64 k, BN n}; dX: box {64 c, 64 n}); where rows are contiguous (g.tma_rows), the row operands
// as 2-D [M][cols]: rows_a (fwd: X, dX: dY, box {64, BM}; dW: dY, box {64, 64}), rows_b (dW: X, box
// {64, 64}); with g.tma_out the output as 3-D, box {128 bytes of columns, 8 rows, 1}: dW [E][N][K],
// fwd [1][M][N], dX [1][M][K].
struct Sm90Maps {
    CUtensorMap w, rows_a, rows_b, out;
    CUtensorMap out_wide; // dW with 16-bit output and TMA stores: dW [E][N][K], box {64 columns, 64 rows, 1}
};

// TMA descriptor (cuTensorMapEncodeTiled, reached through the runtime's driver entry point) of a dense
// tensor (bf16, f16, f32, or FP8 codes as bytes) of `rank` dimensions, dims[0] innermost, row strides in bytes for dims 1..,
// box `box` elements, with the 128-byte swizzle of gemm/sm90.cuh; loads past the edges fill zeros, stores
// past them are dropped.  A load's or store's innermost coordinate times the element size must be a multiple of 16
// bytes: the TMA unit stops the kernel with an illegal instruction otherwise (bench/RESULTS.md, "The Hopper FP8 dW
// kernel's illegal instruction").  Returns false when the driver has no encoder or rejects the shape.
bool encode_tensor_map(CUtensorMap *map, moe_dtype dtype, const void *base, int rank, const uint64_t *dims,
                       const uint64_t *strides, const uint32_t *box);
// The same without the swizzle: a box lands in shared memory as a dense array, its rows box[0] elements apart (a
// staging buffer that threads read; box[0] times the element size a multiple of 16 bytes).
bool encode_unswizzled_tensor_map(CUtensorMap *map, moe_dtype dtype, const void *base, int rank, const uint64_t *dims,
                                  const uint64_t *strides, const uint32_t *box);

// The map of an output [slabs][rows][cols] (f32, or a 16-bit type) that gemm/tma_store.cuh's epilogue writes in
// boxes of 128 bytes of columns x 8 rows (fwd [1][M][N], dX [1][M][K], dW [E][N][K]).
bool encode_out_boxes_map(CUtensorMap *map, moe_dtype out_dtype, const void *out, uint64_t cols, uint64_t rows,
                          uint64_t slabs);

// The sm90 kernel's tensor maps for op over p (see tma.cu); false: no W map, take the sm80 family.
bool encode_sm90_maps(const moe_gemm_problem *p, int op, int bm, int cluster, bool tma_store_allowed, const void *a,
                      const void *b, const void *out, moe_dtype out_dtype, GemmArgs *g, Sm90Maps *maps);

} // namespace moe_gpu

#endif
