// The grouped GEMM's routing check on the device (m_sizes, gather_indices; the first kernels of every call),
// its sticky error record and moe_cuda_synchronize, which reports that record.
#include <stdio.h>

#include "common/device_error.cuh"
#include "common/warp_scan.cuh"
#include "gemm/gemm.cuh"
#include "gemm/plan.cuh"

namespace moe_gpu {

// Device-side routing check.  The first error of a call sets the call's status word (Workspace) and is also
// copied to the sticky record read by moe_backend_synchronize().
enum RoutingErrorKind : int {
    ROUTING_OK = 0,
    ROUTING_NEGATIVE_SIZE = 1,  // m_sizes[index] = value < 0
    ROUTING_SIZES_SUM = 2,      // sum of m_sizes = value != T*k
    ROUTING_GATHER_RANGE = 3,   // gather_indices[index] = value outside [0, M)
    ROUTING_GATHER_REPEAT = 4,  // gather_indices[index] = value repeats
};
enum RoutingErrorDetail : int { ROUTING_INDEX = 0, ROUTING_VALUE = 1 }; // DeviceErrorRecord::detail slots

__device__ DeviceErrorRecord g_routing_check_error;

namespace {

__device__ void report(int *status, int op, int kind, long long index, long long value)
{
    if (atomicCAS(status, 0, kind) == 0)
        publish_device_error(&g_routing_check_error, kind, [&](DeviceErrorRecord *record) {
            record->op = op;
            record->detail[ROUTING_INDEX] = index;
            record->detail[ROUTING_VALUE] = value;
        });
}

// Inclusive prefix sums over the CTA (SIZES_THREADS threads) of three values per thread, in thread order;
// `totals` is shared scratch of 3 * 32 values.  Every thread of the CTA calls it (it synchronises).
constexpr int SIZES_THREADS = 1024;
__device__ __forceinline__ void block_inclusive_scan3(int64_t v[3], int64_t *totals)
{
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int c = 0; c < 3; c++)
        v[c] = warp_inclusive_sum(v[c]);
    if (lane == 31)
        for (int c = 0; c < 3; c++)
            totals[c * 32 + warp] = v[c];
    __syncthreads();
    if (warp == 0)
        for (int c = 0; c < 3; c++)
            totals[c * 32 + lane] = warp_inclusive_sum(totals[c * 32 + lane]); // inclusive over warps
    __syncthreads();
    if (warp > 0)
        for (int c = 0; c < 3; c++)
            v[c] += totals[c * 32 + warp - 1];
    __syncthreads(); // totals free for the next call
}

// One CTA of SIZES_THREADS threads, the first kernel of a call: zeroes the call's status word and the
// permutation bitmap (`seen_words` words, check_gather_kernel's; 0 without gather indices), then computes
// the prefix sums of m_sizes (offsets), the tile starts and the paired
// kernel's lone-tile starts, SIZES_THREADS experts per round (each thread loads its expert's size up
// front, then block scans).  The first expert e, in expert order, whose size is negative or whose
// prefix sum passes M is reported (as a sequential walk would; later experts are not looked at), else
// a total other than M.  Sizes are clipped to M + 1 inside the sums, so that they cannot overflow; a
// clipped size is an error at that expert or before it.  (This was one thread walking the experts, each
// iteration waiting for its size load, several times slower under ncu; bench/RESULTS.md,
// "the routing size check as one CTA of block scans".)
__global__ void __launch_bounds__(SIZES_THREADS) check_sizes_kernel(const int64_t *m_sizes, int64_t E, int64_t M,
                                                                  int64_t tiles_per_row_tile, int64_t rows_per_tile,
                                                                  int paired, int64_t seen_words, Workspace ws, int op)
{
    __shared__ int64_t totals[3 * 32];
    __shared__ int64_t first_bad; // smallest bad expert of the round, E when none
    if (blockIdx.x != 0)
        return;
    for (int64_t i = threadIdx.x; i < seen_words; i += SIZES_THREADS)
        ws.seen[i] = 0;
    if (threadIdx.x == 0)
        *ws.status = 0, *ws.tile_counter = 0, ws.offsets[0] = 0, ws.tile_start[0] = 0, ws.lone_start[0] = 0;
    int64_t carried[3] = {0, 0, 0}; // rows, tiles, lone tiles of the experts of earlier rounds
    for (int64_t e0 = 0; e0 < E; e0 += SIZES_THREADS) {
        const int64_t e = e0 + threadIdx.x;
        const int64_t m = e < E ? m_sizes[e] : 0;
        const int64_t clipped = m < 0 ? 0 : m > M ? M + 1 : m;
        int64_t lone = 0;
        const int64_t tiles = e < E && m >= 0 && m <= M ? expert_tiles(m, rows_per_tile, tiles_per_row_tile, paired, &lone) : 0;
        int64_t v[3] = {clipped, tiles, lone};
        if (threadIdx.x == 0)
            first_bad = E;
        block_inclusive_scan3(v, totals); // (its barriers also order first_bad's reset before the atomicMin)
        const int64_t rows_before = carried[0] + v[0] - clipped, rows_through = carried[0] + v[0];
        const bool bad = e < E && (m < 0 || rows_through > M);
        if (bad)
            atomicMin(reinterpret_cast<unsigned long long *>(&first_bad), (unsigned long long)e);
        __syncthreads();
        const int64_t stop = first_bad;
        if (e < E && e < stop) {
            ws.offsets[e + 1] = rows_through;
            ws.tile_start[e + 1] = carried[1] + v[1];
            ws.lone_start[e + 1] = carried[2] + v[2];
        }
        if (e == stop && stop < E) { // the sequential walk's message: the negative size, or the prefix sum it reached
            if (m < 0)
                report(ws.status, op, ROUTING_NEGATIVE_SIZE, e, m);
            else
                report(ws.status, op, ROUTING_SIZES_SUM, e, (long long)((unsigned long long)rows_before + (unsigned long long)m));
        }
        if (stop < E)
            return;
        // every thread takes the round's totals from the round's last thread
        __shared__ int64_t round_total[3];
        if (threadIdx.x == SIZES_THREADS - 1)
            for (int c = 0; c < 3; c++)
                round_total[c] = v[c];
        __syncthreads();
        for (int c = 0; c < 3; c++)
            carried[c] += round_total[c];
        __syncthreads();
    }
    if (threadIdx.x == 0 && carried[0] != M)
        report(ws.status, op, ROUTING_SIZES_SUM, E, carried[0]);
}

__global__ void check_gather_kernel(const int64_t *gather, int64_t M, Workspace ws, int op)
{
    for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < M; r += (int64_t)gridDim.x * blockDim.x) {
        int64_t s = gather[r];
        if (s < 0 || s >= M) {
            report(ws.status, op, ROUTING_GATHER_RANGE, r, s);
            continue;
        }
        unsigned bit = 1u << (s & 31);
        if (atomicOr(&ws.seen[s >> 5], bit) & bit)
            report(ws.status, op, ROUTING_GATHER_REPEAT, r, s);
    }
}

const char *routing_error_text(int kind)
{
    switch (kind) {
    case ROUTING_NEGATIVE_SIZE: return "routing.m_sizes[%lld] = %lld, expected >= 0";
    case ROUTING_SIZES_SUM: return "routing.m_sizes[0..%lld] sums to %lld, expected T*k";
    case ROUTING_GATHER_RANGE: return "routing.gather_indices[%lld] = %lld, expected a slot in [0, T*k)";
    case ROUTING_GATHER_REPEAT: return "routing.gather_indices[%lld] = %lld repeats an earlier entry";
    }
    return "unknown device error %lld %lld";
}

} // namespace

// The routing check's kernels for a call of `op` over p (check_sizes_kernel: the offsets and tile starts for tiles of
// rows_per_tile rows and col_tiles columns, paired or not; check_gather_kernel when p has gather indices and rows).
void launch_routing_check(const moe_gemm_problem *p, int op, int64_t col_tiles, int rows_per_tile, bool paired,
                          int64_t bitmap_words, const Workspace &w, cudaStream_t stream)
{
    const int64_t E = p->num_experts, M = p->rows;
    const bool check_gather = p->gather_indices != NULL && M > 0;
    check_sizes_kernel<<<1, SIZES_THREADS, 0, stream>>>(p->m_sizes, E, M, col_tiles, rows_per_tile, paired,
                                                        check_gather ? bitmap_words : 0, w, op);
    if (check_gather)
        check_gather_kernel<<<(unsigned)((M + 255) / 256 < 1024 ? (M + 255) / 256 : 1024), 256, 0, stream>>>(
            p->gather_indices, M, w, op);
}

} // namespace moe_gpu

using namespace moe_gpu;

moe_status moe_cuda_synchronize(void *stream)
{
    MOE_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
    DeviceErrorRecord record;
    const moe_status taken = take_device_error(g_routing_check_error, &record);
    if (taken != MOE_OK || record.kind == ROUTING_OK)
        return taken;
    static const char *const ops[] = {"moe_gemm_fwd",     "moe_gemm_dx",     "moe_gemm_dw",
                                      "moe_gemm_topk_weights_grad", "moe_gemm_fp8_fwd", "moe_gemm_fp8_dx",
                                      "moe_gemm_fp8_dw",  "moe_quantize_fp8_columns"};
    static_assert(sizeof ops / sizeof ops[0] == ROUTING_OP_FP8_COLUMNS + 1, "a name for every op of plan.cuh");
    char detail[256];
    snprintf(detail, sizeof detail, routing_error_text(record.kind), record.detail[ROUTING_INDEX],
             record.detail[ROUTING_VALUE]);
    return moe_fail(MOE_ERR_INVALID_ROUTING, "%s %s: %s", record.op >= 0 && record.op <= ROUTING_OP_FP8_COLUMNS ? ops[record.op] : "?",
                    DEVICE_ERROR_WHERE, detail);
}
