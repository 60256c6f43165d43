// TMA descriptors on the host: cuTensorMapEncodeTiled through the runtime's driver entry point, and the maps of
// the sm90 GEMM kernel for a call (rows, W, output).
#include <stdlib.h>
#include <string.h>

#include <cudaTypedefs.h>

#include "gemm/sm90.cuh"
#include "gemm/tma.cuh"

namespace moe_gpu {
namespace {
// The largest dimension a map takes is the hardware's 2^31 elements; MOE_SM90_TMA_MAX_DIM=n lowers it to n
// (tests: a small problem then crosses the refusals and their fallbacks, specs/THRESHOLDS.md).
uint64_t tma_max_dim()
{
    const char *env = getenv("MOE_SM90_TMA_MAX_DIM");
    const long long n = env != nullptr ? atoll(env) : 0;
    return n > 0 && (uint64_t)n < (1ull << 31) ? (uint64_t)n : 1ull << 31;
}

} // namespace

namespace {
// cuTensorMapEncodeTiled of a dense tensor with the given swizzle (encode_tensor_map's contract)
bool encode_tiled(CUtensorMap *map, moe_dtype dtype, const void *base, int rank, const uint64_t *dims,
                  const uint64_t *strides, const uint32_t *box, CUtensorMapSwizzle swizzle)
{
    static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
    static bool looked_up = false;
    if (!looked_up) {
        void *fn = nullptr;
        cudaDriverEntryPointQueryResult found;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) ==
                cudaSuccess && found == cudaDriverEntryPointSuccess)
            encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
        looked_up = true;
    }
    if (encode == nullptr)
        return false;
    cuuint64_t d[3], st[2];
    cuuint32_t b[3], element_strides[3] = {1, 1, 1};
    const uint64_t max_dim = tma_max_dim();
    for (int i = 0; i < rank; i++) {
        if (dims[i] == 0 || dims[i] > max_dim)
            return false;
        d[i] = dims[i], b[i] = box[i];
        if (i > 0)
            st[i - 1] = strides[i - 1];
    }
    const CUtensorMapDataType type = dtype == MOE_BF16                        ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                   : dtype == MOE_F16                         ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                   : dtype == MOE_E4M3 || dtype == MOE_E5M2 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 // FP8 codes
                                                                              : CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
    const CUresult r = encode(map, type,
                              (cuuint32_t)rank, const_cast<void *>(base), d, st, b, element_strides,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS;
}
} // namespace

bool encode_tensor_map(CUtensorMap *map, moe_dtype dtype, const void *base, int rank, const uint64_t *dims,
                       const uint64_t *strides, const uint32_t *box)
{
    return encode_tiled(map, dtype, base, rank, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B);
}

bool encode_unswizzled_tensor_map(CUtensorMap *map, moe_dtype dtype, const void *base, int rank, const uint64_t *dims,
                                  const uint64_t *strides, const uint32_t *box)
{
    return encode_tiled(map, dtype, base, rank, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_NONE);
}

bool encode_out_boxes_map(CUtensorMap *map, moe_dtype out_dtype, const void *out, uint64_t cols, uint64_t rows,
                          uint64_t slabs)
{
    const uint64_t esize = out_dtype == MOE_F32 ? 4 : 2;
    const uint64_t dims[3] = {cols, rows, slabs}, strides[2] = {cols * esize, rows * cols * esize};
    const uint32_t box[3] = {(uint32_t)(128 / esize), 8, 1};
    return encode_tensor_map(map, out_dtype, out, 3, dims, strides, box);
}

// The sm90 kernel's tensor maps (Sm90Maps, gemm/tma.cuh) for tiles of bm rows (the paired kernel, cluster 2,
// loads the forward's W stage in two boxes of half the columns); sets g->tma_rows when the row operands are
// contiguous and got their maps, g->tma_out when `out` (element type out_dtype) is overwritten with its rows
// in tile order and got its map.  False: no W map, take the sm80 family.
bool encode_sm90_maps(const moe_gemm_problem *p, int op, int bm, int cluster, bool tma_store_allowed, const void *a,
                      const void *b, const void *out, moe_dtype out_dtype, GemmArgs *g, Sm90Maps *maps)
{
    const uint64_t E = (uint64_t)p->num_experts, N = (uint64_t)p->N, K = (uint64_t)p->K, M = (uint64_t)p->rows;
    if (op != OP_DW && E > 0 && N > 0 && K > 0) { // an empty W is never read (no tiles or no k-steps)
        const uint64_t dims[3] = {K, N, E}, strides[2] = {K * 2, N * K * 2};
        const uint32_t box[3] = {(uint32_t)H_BK, op == OP_FWD ? (uint32_t)(h_bn(bm) / cluster) : 64u, 1};
        if (!encode_tensor_map(&maps->w, p->dtype, b, 3, dims, strides, box))
            return false;
    }
    g->tma_rows = 0;
    if (op == OP_FWD && !p->permute_x) {
        const uint64_t dims[2] = {K, M}, strides[1] = {K * 2};
        const uint32_t box[2] = {(uint32_t)H_BK, (uint32_t)bm};
        g->tma_rows = encode_tensor_map(&maps->rows_a, p->dtype, a, 2, dims, strides, box);
    } else if (op == OP_DX && !p->permute_y) {
        const uint64_t dims[2] = {N, M}, strides[1] = {N * 2};
        const uint32_t box[2] = {(uint32_t)H_BK, (uint32_t)bm};
        g->tma_rows = encode_tensor_map(&maps->rows_a, p->dtype, a, 2, dims, strides, box);
    } else if (op == OP_DW && !p->permute_x && !p->permute_y) {
        const uint64_t dims_a[2] = {N, M}, strides_a[1] = {N * 2}, dims_b[2] = {K, M}, strides_b[1] = {K * 2};
        const uint32_t box[2] = {64, (uint32_t)H_BK};
        g->tma_rows = encode_tensor_map(&maps->rows_a, p->dtype, a, 2, dims_a, strides_a, box) &&
                      encode_tensor_map(&maps->rows_b, p->dtype, b, 2, dims_b, strides_b, box);
    }
    g->tma_out = 0, g->tma_out_wide = 0;
    const char *off = getenv("MOE_SM90_TMA_OUT"); // =0: the register-store epilogue (A/B timing runs)
    const bool rows_in_order = op == OP_DW || (op == OP_FWD && !p->permute_y) ||
                               (op == OP_DX && !p->permute_x && !p->reduce_topk);
    if (rows_in_order && !p->accumulate && E > 0 && N > 0 && K > 0 && M > 0 && tma_store_allowed &&
        !(off != NULL && strcmp(off, "0") == 0)) {
        const uint64_t esize = out_dtype == MOE_F32 ? 4 : 2, cols = op == OP_FWD ? N : K;
        const uint64_t rows = op == OP_DW ? N : M, slabs = op == OP_DW ? E : 1;
        const uint64_t dims[3] = {cols, rows, slabs}, strides[2] = {cols * esize, rows * cols * esize};
        g->tma_out = encode_out_boxes_map(&maps->out, out_dtype, out, cols, rows, slabs);
        if (g->tma_out && op == OP_DW && esize == 2) { // the ping-pong kernel's 8 KiB boxes
            const uint32_t wide_box[3] = {64, 64, 1};
            g->tma_out_wide = encode_tensor_map(&maps->out_wide, out_dtype, out, 3, dims, strides, wide_box);
        }
    }
    return true;
}

} // namespace moe_gpu
