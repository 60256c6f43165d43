// The FP8 quantizers (rows, blocks, dW's columns) and their inverse on CUDA (gpu/fp8/quantize.h; the rule is
// specs/FP8.md section 3), bit for bit the reference's (ref/fp8_quantize.c): the same float32 operations, each
// written as one rounded operation (__fdiv_rn, __fmul_rn), so that nvcc contracts nothing.
//
//   quantize:   amax = max(MOE_FP8_AMAX_FLOOR, max |v| over the tile) (fmaxf: exact, in any order)
//               float32 scale  s = amax / max_format, factor = max_format / amax
//               UE8M0          b = the exponent byte of 2^ceil(log2(amax / max_format)), factor = 2^(127 - b)
//               q = the saturating round-to-nearest-even conversion of v * factor (cvt.rn.satfinite)
//   dequantize: out = round_to(out_dtype, decode(q) * scale)
//
// Each call is three steps on the stream: a workspace word set to "none", a scan that leaves in it the lowest
// index of a bad input (a non-finite source value, or a bad scale: atomicMin, so the element the host names),
// and the work, which returns at once when the scan found one (its first thread then publishes the error for
// moe_backend_synchronize).  The work runs one tile per warp (1 x 128 tiles: 4 elements a lane) or per CTA
// (128 x 128 blocks: 64 elements a thread).
//
// The columns quantizer (dW's operands, 128 x 1 tiles along each expert's rows) runs the GEMM's routing check
// first (gemm/routing_check.cu: the expert offsets, and m_sizes and gather_indices checked as the GEMM checks
// them, reported by moe_backend_synchronize), then the scan of the values in expert-row order (each read from its
// source row and times its topk weight, __fmul_rn, as the reference's column_value), then one thread per scale
// (scale row, column): the tile that scale row holds (gpu/fp8/column_tiles.cuh), or an empty tile's scale for a
// row no tile uses.  The codes go to [M][cols], or transposed to [cols][M] (moe_quantize_fp8_columns_transposed:
// each thread's tile then lies in consecutive bytes).
#include <cuda_fp8.h>
#include <string.h>

#include "common/cuda_check.cuh"
#include "common/device_error.cuh"
#include "common/dtype.cuh"
#include "common/launch.cuh"
#include "fp8/column_tiles.cuh"
#include "fp8/quantize.h"
#include "gemm/plan.cuh"

namespace moe_gpu {

enum Fp8QuantizeErrorKind : int { QUANTIZE_OK = 0, QUANTIZE_NONFINITE = 1, QUANTIZE_BAD_SCALE = 2 };
enum Fp8QuantizeOp : int { QUANTIZE_ROWS = 0, QUANTIZE_BLOCKS = 1, DEQUANTIZE = 2, QUANTIZE_COLUMNS = 3 };
// DeviceErrorRecord::detail slots: the bad element's index and bits; the shape that names it
enum Fp8QuantizeDetail : int { QD_INDEX = 0, QD_BITS = 1, QD_DTYPE = 2, QD_ROWS = 3, QD_COLS = 4, QD_FORMAT = 5 };
// ... and those of the columns quantizer's non-finite value: the source element, its slot and topk weight
enum Fp8ColumnsDetail : int {
    QC_ROW = 0, QC_COL = 1, QC_BITS = 2, QC_DTYPE = 3, QC_SLOT = 4, QC_WEIGHTED = 5, QC_WEIGHT_BITS = 6
};
__device__ DeviceErrorRecord g_fp8_quantize_error;

namespace {

constexpr int Q_THREADS = 256;
constexpr unsigned long long NO_BAD = ~0ull; // the workspace word before the scan finds anything

struct QuantizeArgs {
    moe_dtype wide_dtype, fp8_dtype;
    int ue8m0, tile_rows, op;
    int64_t batches, rows, cols, tiles_r, tiles_c;
    const unsigned long long *first_bad;
};

__device__ __forceinline__ float format_max(moe_dtype fp8_dtype) { return fp8_dtype == MOE_E5M2 ? 57344.0f : 448.0f; }

// The UE8M0 byte of 2^ceil(log2(s)) for a normal float32 s > 0: its exponent field, plus one unless the
// significand is 1 (s a power of two).  The reference's frexpf form, on the bits.
__device__ __forceinline__ unsigned ue8m0_ceil(float s)
{
    const unsigned bits = __float_as_uint(s);
    return (bits >> 23) + ((bits & 0x7fffffu) != 0u);
}

// 2^(b - 127) as float32, exactly (b = 0: 2^-127, a subnormal); b <= 254.
__device__ __forceinline__ float ue8m0_value(unsigned b) { return __uint_as_float(b != 0u ? b << 23 : 0x00400000u); }

__device__ __forceinline__ uint8_t encode(moe_dtype fp8_dtype, float v)
{
    return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, fp8_dtype == MOE_E5M2 ? __NV_E5M2 : __NV_E4M3);
}

// The exact value of a code (every e4m3 and e5m2 value is a binary16 value).
__device__ __forceinline__ float decode(moe_dtype fp8_dtype, uint8_t code)
{
    const __half_raw h = __nv_cvt_fp8_to_halfraw(code, fp8_dtype == MOE_E5M2 ? __NV_E5M2 : __NV_E4M3);
    return __half2float(__half(h));
}

// The scale rule of every tile (the reference's store_tile_scale): the scale of a tile whose floored amax is `amax`
// (amax / max_format, or its UE8M0 power of two), stored at scales[index] when `store`; returns the factor each
// value is multiplied by before the conversion (max_format / amax, or 2^(127 - b) exactly: b is 97 .. 247).
__device__ __forceinline__ float tile_scale_rule(moe_dtype fp8_dtype, int ue8m0, float amax, void *scales,
                                                 int64_t index, bool store)
{
    const float max = format_max(fp8_dtype), scale = __fdiv_rn(amax, max);
    if (ue8m0) {
        const unsigned biased = ue8m0_ceil(scale);
        if (store)
            static_cast<uint8_t *>(scales)[index] = (uint8_t)biased;
        return __uint_as_float((254u - biased) << 23);
    }
    if (store)
        static_cast<float *>(scales)[index] = scale;
    return __fdiv_rn(max, amax);
}

// The element index of a tile's slot `slot` (0 .. tile_rows * 128 - 1), or -1 past the tensor's edge.
__device__ __forceinline__ int64_t tile_element(const QuantizeArgs &a, int64_t tile, int slot)
{
    const int64_t per_batch = a.tiles_r * a.tiles_c, b = tile / per_batch, tr = tile % per_batch / a.tiles_c,
                  tc = tile % a.tiles_c;
    const int64_t r = tr * a.tile_rows + slot / MOE_FP8_TILE, c = tc * MOE_FP8_TILE + slot % MOE_FP8_TILE;
    return r < a.rows && c < a.cols ? (b * a.rows + r) * a.cols + c : -1;
}

// The scan: the lowest index of a non-finite value (quantize: the source) or of a bad scale (dequantize).
__global__ void scan_kernel(const void *data, int64_t count, moe_dtype dtype, int scales_ue8m0, int scales,
                            unsigned long long *first_bad)
{
    GRID_STRIDE(i, count) {
        bool bad;
        if (!scales) {
            bad = !isfinite(load_as_float(dtype, data, i));
        } else if (scales_ue8m0) {
            bad = static_cast<const uint8_t *>(data)[i] == 255u;
        } else {
            const float s = static_cast<const float *>(data)[i];
            bad = !(s > 0.0f) || isinf(s);
        }
        if (bad)
            atomicMin(first_bad, (unsigned long long)i);
    }
}

// The call's verdict: false, after the first thread of the grid published the error, when the scan found a bad
// element (bits: its bits, read from `data` of `dtype`, or a scale byte).
__device__ bool call_is_clean(const QuantizeArgs &a, const void *data, moe_dtype dtype, int scales)
{
    const unsigned long long bad = *a.first_bad;
    if (bad == NO_BAD)
        return true;
    if (blockIdx.x == 0 && threadIdx.x == 0)
        publish_device_error(&g_fp8_quantize_error, scales ? QUANTIZE_BAD_SCALE : QUANTIZE_NONFINITE,
                             [&](DeviceErrorRecord *record) {
                                 record->op = a.op;
                                 record->detail[QD_INDEX] = (long long)bad;
                                 long long bits;
                                 if (scales && a.ue8m0)
                                     bits = static_cast<const uint8_t *>(data)[bad];
                                 else if (dtype == MOE_F32)
                                     bits = static_cast<const unsigned *>(data)[bad];
                                 else
                                     bits = static_cast<const uint16_t *>(data)[bad];
                                 record->detail[QD_BITS] = bits;
                                 record->detail[QD_DTYPE] = dtype;
                                 record->detail[QD_ROWS] = a.rows;
                                 record->detail[QD_COLS] = scales ? a.tiles_c : a.cols;
                                 record->detail[QD_FORMAT] = a.ue8m0;
                             });
    return false;
}

// max over the group's threads (a warp, or the CTA when GROUP is Q_THREADS); every thread gets it.
template <int GROUP>
__device__ __forceinline__ float group_max(float v)
{
#pragma unroll
    for (int d = 16; d > 0; d /= 2)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, d));
    if (GROUP == 32)
        return v;
    __shared__ float warp_max[Q_THREADS / 32];
    __syncthreads(); // the previous tile's reads of warp_max are done
    if (threadIdx.x % 32 == 0)
        warp_max[threadIdx.x / 32] = v;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < Q_THREADS / 32; w++)
        v = fmaxf(v, warp_max[w]);
    return v;
}

// One tile per group of GROUP threads (32: 1 x 128 tiles; Q_THREADS: 128 x 128 blocks).
template <int GROUP>
__global__ void __launch_bounds__(Q_THREADS) quantize_kernel(QuantizeArgs a, const void *src, uint8_t *q, void *scales)
{
    if (!call_is_clean(a, src, a.wide_dtype, 0))
        return;
    constexpr int GROUPS = Q_THREADS / GROUP;
    const int slots = a.tile_rows * MOE_FP8_TILE, lane = threadIdx.x % GROUP;
    const int64_t tiles = a.batches * a.tiles_r * a.tiles_c;
    // every thread of a group runs the same trip count (the group's tile is one value)
    for (int64_t tile = (int64_t)blockIdx.x * GROUPS + threadIdx.x / GROUP; tile < tiles;
         tile += (int64_t)gridDim.x * GROUPS) {
        float amax = MOE_FP8_AMAX_FLOOR;
        for (int slot = lane; slot < slots; slot += GROUP) {
            const int64_t i = tile_element(a, tile, slot);
            if (i >= 0)
                amax = fmaxf(amax, fabsf(load_as_float(a.wide_dtype, src, i)));
        }
        amax = group_max<GROUP>(amax);
        const float factor = tile_scale_rule(a.fp8_dtype, a.ue8m0, amax, scales, tile, lane == 0);
        for (int slot = lane; slot < slots; slot += GROUP) {
            const int64_t i = tile_element(a, tile, slot);
            if (i >= 0)
                q[i] = encode(a.fp8_dtype, __fmul_rn(load_as_float(a.wide_dtype, src, i), factor));
        }
    }
}

__global__ void dequantize_kernel(QuantizeArgs a, const uint8_t *q, const void *scales, void *out)
{
    if (!call_is_clean(a, scales, MOE_F32, 1))
        return;
    const int64_t count = a.batches * a.rows * a.cols;
    GRID_STRIDE(i, count) {
        const int64_t b = i / (a.rows * a.cols), r = i / a.cols % a.rows, c = i % a.cols;
        const int64_t s = (b * a.tiles_r + r / a.tile_rows) * a.tiles_c + c / MOE_FP8_TILE;
        const float scale = a.ue8m0 ? ue8m0_value(static_cast<const uint8_t *>(scales)[s])
                                    : static_cast<const float *>(scales)[s];
        store_from_float(a.wide_dtype, out, i, __fmul_rn(decode(a.fp8_dtype, q[i]), scale));
    }
}

// The columns quantizer's arguments: the routing (offsets and status of the call's workspace, from the routing
// check), the source and its row mode, the topk weights or NULL.
struct ColumnsArgs {
    moe_dtype src_dtype, fp8_dtype;
    int ue8m0, source;
    int transposed; // moe_quantize_fp8_columns_transposed: codes [cols][M]
    int64_t M, E, k, cols, scale_rows;
    const int64_t *gather; // NULL for expert-order rows without weights
    const float *weights;
    Workspace ws;
    unsigned long long *first_bad;
};

__device__ __forceinline__ int64_t column_slot(const ColumnsArgs &a, int64_t r) { return a.gather ? a.gather[r] : r; }
__device__ __forceinline__ int64_t column_source_row(const ColumnsArgs &a, int64_t r)
{
    return a.source == MOE_FP8_ROWS_EXPERT ? r : a.source == MOE_FP8_ROWS_SLOT ? column_slot(a, r) : column_slot(a, r) / a.k;
}
// The value expert row r, column c stands for: the source element, times its slot's topk weight if any.
__device__ __forceinline__ float column_value(const ColumnsArgs &a, const void *src, int64_t r, int64_t c)
{
    const float v = load_as_float(a.src_dtype, src, column_source_row(a, r) * a.cols + c);
    return a.weights ? __fmul_rn(a.weights[column_slot(a, r)], v) : v;
}

// The scan: the lowest expert-row-order index r * cols + c of a non-finite value.
__global__ void columns_scan_kernel(ColumnsArgs a, const void *src)
{
    if (*a.ws.status != 0) // a routing error (reported by the routing check): gather may be out of range
        return;
    GRID_STRIDE(i, a.M * a.cols) {
        if (!isfinite(column_value(a, src, i / a.cols, i % a.cols)))
            atomicMin(a.first_bad, (unsigned long long)i);
    }
}

// One thread per scale (scale row s, column c): its tile's amax, scale and codes, or an empty tile's scale.
__global__ void columns_quantize_kernel(ColumnsArgs a, const void *src, uint8_t *q, void *scales)
{
    if (*a.ws.status != 0)
        return;
    const unsigned long long bad = *a.first_bad;
    if (bad != NO_BAD) {
        if (blockIdx.x == 0 && threadIdx.x == 0)
            publish_device_error(&g_fp8_quantize_error, QUANTIZE_NONFINITE, [&](DeviceErrorRecord *record) {
                const int64_t r = (int64_t)bad / a.cols, c = (int64_t)bad % a.cols, row = column_source_row(a, r);
                record->op = QUANTIZE_COLUMNS;
                record->detail[QC_ROW] = row;
                record->detail[QC_COL] = c;
                record->detail[QC_BITS] = a.src_dtype == MOE_F32
                                              ? static_cast<const unsigned *>(src)[row * a.cols + c]
                                              : static_cast<const uint16_t *>(src)[row * a.cols + c];
                record->detail[QC_DTYPE] = a.src_dtype;
                record->detail[QC_SLOT] = column_slot(a, r);
                record->detail[QC_WEIGHTED] = a.weights != nullptr;
                record->detail[QC_WEIGHT_BITS] = a.weights ? __float_as_uint(a.weights[column_slot(a, r)]) : 0;
            });
        return;
    }
    GRID_STRIDE(i, a.scale_rows * a.cols) {
        const int64_t c = i % a.cols;
        int64_t first, end;
        if (!column_tile_of_scale_row(a.ws.offsets, a.E, i / a.cols, &first, &end)) {
            tile_scale_rule(a.fp8_dtype, a.ue8m0, MOE_FP8_AMAX_FLOOR, scales, i, true);
            continue;
        }
        float amax = MOE_FP8_AMAX_FLOOR;
        for (int64_t r = first; r < end; r++)
            amax = fmaxf(amax, fabsf(column_value(a, src, r, c)));
        const float factor = tile_scale_rule(a.fp8_dtype, a.ue8m0, amax, scales, i, true);
        for (int64_t r = first; r < end; r++)
            q[a.transposed ? c * a.M + r : r * a.cols + c] =
                encode(a.fp8_dtype, __fmul_rn(column_value(a, src, r, c), factor));
    }
}

QuantizeArgs make_args(const moe_fp8_quantize_problem *p, int op)
{
    QuantizeArgs a = {};
    a.wide_dtype = p->wide_dtype, a.fp8_dtype = p->fp8_dtype;
    a.ue8m0 = p->scale_format == MOE_FP8_SCALE_UE8M0;
    a.tile_rows = p->tile_rows, a.op = op;
    a.batches = p->batches, a.rows = p->rows, a.cols = p->cols;
    a.tiles_r = cdiv(p->rows, p->tile_rows), a.tiles_c = cdiv(p->cols, MOE_FP8_TILE);
    return a;
}

// The workspace word, the scan of `count` elements of `scanned`, then launch(args); every step on the stream.
template <class Launch>
moe_status run_checked(const moe_fp8_quantize_problem *p, QuantizeArgs a, const void *scanned, int64_t count,
                       int scales, Launch launch)
{
    if (count == 0)
        return MOE_OK;
    cudaStream_t stream = static_cast<cudaStream_t>(p->stream);
    unsigned long long *first_bad = nullptr;
    cudaError_t err = cudaMallocAsync(&first_bad, sizeof *first_bad, stream);
    if (err != cudaSuccess)
        return moe_fail(MOE_ERR_DEVICE, "%s: cudaMallocAsync of the 8-byte workspace failed: %s", p->op,
                        cudaGetErrorString(err));
    a.first_bad = first_bad;
    moe_status status = MOE_OK;
    err = cudaMemsetAsync(first_bad, 0xff, sizeof *first_bad, stream);
    if (err == cudaSuccess) {
        scan_kernel<<<grid_for(count, Q_THREADS, (int64_t)sm_count() * 8), Q_THREADS, 0, stream>>>(
            scanned, count, scales ? MOE_F32 : a.wide_dtype, a.ue8m0, scales, first_bad);
        launch(a, stream);
        err = cudaGetLastError();
    }
    if (err != cudaSuccess)
        status = moe_fail(MOE_ERR_DEVICE, "%s: kernel launch failed: %s", p->op, cudaGetErrorString(err));
    return free_call_workspace(p->op, first_bad, stream, status);
}

} // namespace
} // namespace moe_gpu

using namespace moe_gpu;

moe_status moe_cuda_fp8_quantize(const moe_fp8_quantize_problem *p, const void *src, void *q, void *scales)
{
    const int blocks = p->tile_rows != 1;
    const QuantizeArgs a = make_args(p, blocks ? QUANTIZE_BLOCKS : QUANTIZE_ROWS);
    const int64_t tiles = a.batches * a.tiles_r * a.tiles_c;
    uint8_t *codes = static_cast<uint8_t *>(q);
    return run_checked(p, a, src, p->batches * p->rows * p->cols, 0, [&](const QuantizeArgs &args, cudaStream_t s) {
        const int64_t cap = (int64_t)sm_count() * 8;
        if (blocks)
            quantize_kernel<Q_THREADS><<<grid_for(tiles, 1, cap), Q_THREADS, 0, s>>>(args, src, codes, scales);
        else
            quantize_kernel<32><<<grid_for(tiles, Q_THREADS / 32, cap), Q_THREADS, 0, s>>>(args, src, codes, scales);
    });
}

moe_status moe_cuda_fp8_dequantize(const moe_fp8_quantize_problem *p, const void *q, const void *scales, void *out)
{
    const QuantizeArgs a = make_args(p, DEQUANTIZE);
    const int64_t count = p->batches * p->rows * p->cols;
    const uint8_t *codes = static_cast<const uint8_t *>(q);
    const int64_t scale_count = a.batches * a.tiles_r * a.tiles_c;
    return run_checked(p, a, scales, scale_count, 1, [&](const QuantizeArgs &args, cudaStream_t s) {
        const unsigned grid = grid_for(count, Q_THREADS, (int64_t)sm_count() * 8);
        dequantize_kernel<<<grid, Q_THREADS, 0, s>>>(args, codes, scales, out);
    });
}

moe_status moe_cuda_fp8_quantize_columns(const moe_fp8_columns_problem *p, const void *src, const float *topk_weights,
                                         void *q, void *scales)
{
    const moe_gemm_problem *g = &p->g;
    cudaStream_t stream = static_cast<cudaStream_t>(g->stream);
    ColumnsArgs a = {};
    a.src_dtype = p->src_dtype, a.fp8_dtype = p->fp8_dtype;
    a.ue8m0 = p->scale_format == MOE_FP8_SCALE_UE8M0, a.source = p->source, a.transposed = p->transposed;
    a.M = g->rows, a.E = g->num_experts, a.k = g->topk, a.cols = g->N;
    a.scale_rows = cdiv(a.M, MOE_FP8_TILE) + a.E - 1;
    a.gather = g->gather_indices, a.weights = topk_weights;
    unsigned char *ws = nullptr;
    float *word = nullptr; // two floats: the 8-byte first_bad word (256-byte aligned)
    MOE_CUDA_CHECK(alloc_call_workspace(a.E, a.M, 2, stream, &ws, &a.ws, &word));
    a.first_bad = reinterpret_cast<unsigned long long *>(word);
    launch_routing_check(g, ROUTING_OP_FP8_COLUMNS, 1, MOE_FP8_TILE, false, a.M / 32 + 1, a.ws, stream);
    cudaError_t err = cudaMemsetAsync(a.first_bad, 0xff, sizeof *a.first_bad, stream);
    const int64_t cap = (int64_t)sm_count() * 8, values = a.M * a.cols, scale_count = a.scale_rows * a.cols;
    if (err == cudaSuccess && values > 0)
        columns_scan_kernel<<<grid_for(values, Q_THREADS, cap), Q_THREADS, 0, stream>>>(a, src);
    if (err == cudaSuccess && scale_count > 0)
        columns_quantize_kernel<<<grid_for(scale_count, Q_THREADS, cap), Q_THREADS, 0, stream>>>(
            a, src, static_cast<uint8_t *>(q), scales);
    if (err == cudaSuccess)
        err = cudaGetLastError();
    const moe_status status = err == cudaSuccess ? MOE_OK
                              : moe_fail(MOE_ERR_DEVICE, "%s: kernel launch failed: %s", g->op, cudaGetErrorString(err));
    return free_call_workspace(g->op, ws, stream, status);
}

static float float_of_bits(unsigned bits)
{
    float v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

// The reference's messages (ref/fp8_quantize.c), with the device's words.
moe_status moe_cuda_fp8_quantize_take_error(void)
{
    DeviceErrorRecord record;
    const moe_status taken = take_device_error(g_fp8_quantize_error, &record);
    if (taken != MOE_OK || record.kind == QUANTIZE_OK)
        return taken;
    static const char *const ops[] = {"moe_quantize_fp8_rows", "moe_quantize_fp8_blocks", "moe_dequantize_fp8",
                                      "moe_quantize_fp8_columns"};
    const char *op = ops[record.op];
    if (record.op == QUANTIZE_COLUMNS) { // a non-finite value, named as the reference names it
        const unsigned bits = (unsigned)record.detail[QC_BITS];
        const float v = float_of_bits(record.detail[QC_DTYPE] == MOE_F32 ? bits : bits << 16);
        const long long row = record.detail[QC_ROW], col = record.detail[QC_COL];
        if (!record.detail[QC_WEIGHTED])
            return moe_fail(MOE_ERR_INVALID_VALUE, "%s %s: src[%lld][%lld] = %g, expected a finite value", op,
                            DEVICE_ERROR_WHERE, row, col, (double)v);
        const float w = float_of_bits((unsigned)record.detail[QC_WEIGHT_BITS]);
        return moe_fail(MOE_ERR_INVALID_VALUE, "%s %s: topk_weights[%lld] * src[%lld][%lld] = %g * %g = %g, expected "
                        "a finite value", op, DEVICE_ERROR_WHERE, record.detail[QC_SLOT], row, col, (double)w,
                        (double)v, (double)(w * v));
    }
    const long long i = record.detail[QD_INDEX], bits = record.detail[QD_BITS];
    const long long rows = record.detail[QD_ROWS], cols = record.detail[QD_COLS];
    if (record.kind == QUANTIZE_BAD_SCALE) {
        if (record.detail[QD_FORMAT])
            return moe_fail(MOE_ERR_INVALID_VALUE, "%s %s: scales[%lld][%lld] = 255 (UE8M0's NaN), expected a biased "
                            "exponent 0 .. 254", op, DEVICE_ERROR_WHERE, i / cols, i % cols);
        return moe_fail(MOE_ERR_INVALID_VALUE, "%s %s: scales[%lld][%lld] = %g, expected finite and > 0", op,
                        DEVICE_ERROR_WHERE, i / cols, i % cols, (double)float_of_bits((unsigned)bits));
    }
    const float v = float_of_bits(record.detail[QD_DTYPE] == MOE_F32 ? (unsigned)bits : (unsigned)bits << 16);
    return moe_fail(MOE_ERR_INVALID_VALUE, "%s %s: src[%lld][%lld][%lld] = %g, expected a finite value", op,
                    DEVICE_ERROR_WHERE, i / (rows * cols), i / cols % rows, i % cols, (double)v);
}
