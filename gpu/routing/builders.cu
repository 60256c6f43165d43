// Routing and MLP block layouts built on the device from device topk_ids (moe_routing_build and
// moe_mlp_layout_build_on with MOE_BACKEND_CUDA): the host builders' outputs bit for bit, queued on a
// stream, nothing synchronised with the host.  The contract is in gpu/routing/builders.h.
//
// One call is a fixed sequence of kernels:
//   build_init_kernel  status, the two error reports, per-expert counts = 0
//   build_check_kernel every id in [0, E) (else: report the smallest flat index); with distinct_rows, an
//                      id repeated within its token (smallest flat index of a repeat); integer atomicAdd
//                      counts per expert (the totals do not depend on the schedule)
//   build_finalize_kernel the first error in the host's scan order (smallest flat index; out of range is
//                      checked before repeats at the same index, as the host does), the call's status and
//                      the sticky record; else the expert offsets (one warp, shuffle prefix sums)
//   place_kernel       one CTA per expert scans the slots in ascending order and places the expert's
//                      slots with ballot prefix sums: gather_indices is the stable sort by expert,
//                      scatter its inverse
//   (layouts)          blocks_kernel: block starts per expert; fill_kernel: one CTA per expert writes its
//                      blocks, token ids (ascending token = ascending slot) and affinities; tail_kernel:
//                      blocks past the routing's own count (capacity) become padding of expert E-1
// Every kernel after finalize returns at once when the status is set, so an invalid routing writes no
// output byte.
#include <stdint.h>
#include <stdio.h>

#include "common/cuda_check.cuh"
#include "common/device_error.cuh"
#include "common/launch.cuh"
#include "common/warp_scan.cuh"
#include "routing/builders.h"

namespace moe_gpu {

enum BuildErrorKind : int { KIND_NONE = 0, KIND_RANGE = 1, KIND_REPEAT = 2 };
// DeviceErrorRecord::detail slots of a topk_ids error: topk_ids[t][j] = value, and the call's E.  The record's op:
// 0 moe_routing_build, 1 moe_mlp_layout_build_on.
enum BuildErrorDetail : int { BUILD_T = 0, BUILD_J = 1, BUILD_VALUE = 2, BUILD_E = 3 };

__device__ DeviceErrorRecord g_build_error;

namespace {

struct BuildArgs {
    int64_t T, k, E, M;
    const int64_t *ids;
    int op, distinct_rows;
    // workspace
    int *status;
    long long *reports; // [2] smallest flat index out of range / repeated
    int64_t *counts;    // [E]
    int64_t *offsets;   // [E+1]
    int64_t *gather;    // [M]  (the caller's gather_indices, or workspace for layouts)
    int64_t *scatter;   // [M] or NULL
    int64_t *m_sizes;   // [E] or NULL
    // layouts
    int64_t B, N_cap, pad, dropping;
    int64_t *block_start; // [E+1]
    int64_t *b2e, *tpid, *num_used, *num_dropped;
    const void *weights;
    void *aff;
    int64_t es; // bytes per affinity element
};

__global__ void build_init_kernel(BuildArgs a)
{
    GRID_STRIDE(e, a.E)
    a.counts[e] = 0;
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        *a.status = KIND_NONE;
        a.reports[0] = a.reports[1] = NONE;
    }
}

__global__ void build_check_kernel(BuildArgs a)
{
    GRID_STRIDE(s, a.M)
    {
        const int64_t e = a.ids[s];
        if (e < 0 || e >= a.E) {
            atomicMin(&a.reports[0], (long long)s);
            continue;
        }
        atomicAdd(reinterpret_cast<unsigned long long *>(&a.counts[e]), 1ull);
        if (a.distinct_rows) {
            const int64_t first = s - s % a.k;
            for (int64_t q = first; q < s; q++)
                if (a.ids[q] == e) {
                    atomicMin(&a.reports[1], (long long)s);
                    break;
                }
        }
    }
}

__global__ void build_finalize_kernel(BuildArgs a)
{
    if (blockIdx.x != 0 || threadIdx.x >= 32)
        return;
    const long long bad = a.reports[0] < a.reports[1] ? a.reports[0] : a.reports[1];
    if (bad != NONE) {
        if (threadIdx.x == 0) {
            const int kind = bad == a.reports[0] ? KIND_RANGE : KIND_REPEAT;
            *a.status = kind;
            publish_device_error(&g_build_error, kind, [&](DeviceErrorRecord *rec) {
                rec->op = a.op, rec->detail[BUILD_T] = bad / a.k, rec->detail[BUILD_J] = bad % a.k;
                rec->detail[BUILD_VALUE] = a.ids[bad], rec->detail[BUILD_E] = a.E;
            });
        }
        return;
    }
    const int lane = threadIdx.x;
    int64_t carried = 0;
    if (lane == 0)
        a.offsets[0] = 0;
    for (int64_t e0 = 0; e0 < a.E; e0 += 32) {
        const int64_t e = e0 + lane;
        int64_t v = e < a.E ? a.counts[e] : 0;
        if (e < a.E && a.m_sizes != nullptr)
            a.m_sizes[e] = v;
        v = warp_inclusive_sum(v);
        if (e < a.E)
            a.offsets[e + 1] = carried + v;
        carried += warp_last_lane(v);
    }
}

constexpr int PLACE_THREADS = 1024;

// One CTA per expert: its slots in ascending order, ranks from ballots and per-warp counts.
__global__ void __launch_bounds__(PLACE_THREADS) place_kernel(BuildArgs a)
{
    if (*a.status != KIND_NONE)
        return;
    __shared__ int warp_counts[PLACE_THREADS / 32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int64_t e = blockIdx.x; e < a.E; e += gridDim.x) {
        int64_t next = a.offsets[e];
        for (int64_t s0 = 0; s0 < a.M; s0 += PLACE_THREADS) {
            const int64_t s = s0 + threadIdx.x;
            const bool mine = s < a.M && a.ids[s] == e;
            const unsigned bits = __ballot_sync(0xffffffffu, mine);
            if (lane == 0)
                warp_counts[warp] = __popc(bits);
            __syncthreads();
            int before = 0, total = 0;
            for (int w = 0; w < PLACE_THREADS / 32; w++) {
                before += w < warp ? warp_counts[w] : 0;
                total += warp_counts[w];
            }
            if (mine) {
                const int64_t r = next + before + __popc(bits & ((1u << lane) - 1u));
                a.gather[r] = s;
                if (a.scatter != nullptr)
                    a.scatter[s] = r;
            }
            next += total;
            __syncthreads();
        }
    }
}

// block_start[e]: first block of expert e (dropless ceil(m_e / B) blocks each, dropping one), the used
// count and (dropping) the dropped pairs.  One warp.
__global__ void blocks_kernel(BuildArgs a)
{
    if (*a.status != KIND_NONE || blockIdx.x != 0 || threadIdx.x >= 32)
        return;
    const int lane = threadIdx.x;
    int64_t carried = 0, dropped = 0;
    if (lane == 0)
        a.block_start[0] = 0;
    for (int64_t e0 = 0; e0 < a.E; e0 += 32) {
        const int64_t e = e0 + lane;
        const int64_t m = e < a.E ? a.counts[e] : 0;
        int64_t v = e < a.E ? (a.dropping ? 1 : (m + a.B - 1) / a.B) : 0;
        int64_t d = a.dropping && m > a.B ? m - a.B : 0;
        v = warp_inclusive_sum(v), d = warp_inclusive_sum(d);
        if (e < a.E)
            a.block_start[e + 1] = carried + v;
        carried += warp_last_lane(v);
        dropped += warp_last_lane(d);
    }
    if (lane == 0) {
        if (a.num_used != nullptr)
            *a.num_used = carried;
        if (a.num_dropped != nullptr)
            *a.num_dropped = dropped;
    }
}

// One CTA per expert: its blocks, their token ids (ascending token) and the affinities of placed pairs.
__global__ void fill_kernel(BuildArgs a)
{
    if (*a.status != KIND_NONE)
        return;
    for (int64_t e = blockIdx.x; e < a.E; e += gridDim.x) {
        const int64_t n0 = a.block_start[e], n1 = a.block_start[e + 1], m = a.counts[e], base = a.offsets[e];
        const int64_t placed = a.dropping && m > a.B ? a.B : m;
        for (int64_t n = n0 + threadIdx.x; n < n1; n += blockDim.x)
            a.b2e[n] = e;
        for (int64_t i = threadIdx.x; i < (n1 - n0) * a.B; i += blockDim.x) {
            const int64_t s = i < placed ? a.gather[base + i] : -1;
            a.tpid[n0 * a.B + i] = s >= 0 ? s / a.k : a.pad;
            if (s >= 0 && a.aff != nullptr) {
                unsigned char *dst = static_cast<unsigned char *>(a.aff) + (size_t)((s / a.k) * a.E + e) * a.es;
                const unsigned char *src = static_cast<const unsigned char *>(a.weights) + (size_t)s * a.es;
                for (int64_t b = 0; b < a.es; b++)
                    dst[b] = src[b];
            }
        }
    }
}

// Blocks past the routing's own count (up to the capacity): expert E-1, only padding.  Also clears the
// affinities (before fill_kernel writes the placed pairs).
__global__ void tail_kernel(BuildArgs a)
{
    if (*a.status != KIND_NONE)
        return;
    const int64_t used = a.block_start[a.E];
    GRID_STRIDE(n, a.N_cap - used)
    a.b2e[used + n] = a.E - 1;
    GRID_STRIDE(p, (a.N_cap - used) * a.B)
    a.tpid[used * a.B + p] = a.pad;
    if (a.aff != nullptr)
        GRID_STRIDE(q, a.T * a.E * a.es)
        static_cast<unsigned char *>(a.aff)[q] = 0;
}

// Allocates the workspace (status, reports, counts, offsets, block starts and, for layouts, gather),
// runs check + finalize + place, then `more`, then frees (stream-ordered).
template <class More>
moe_status run_build(BuildArgs a, bool need_gather_ws, cudaStream_t stream, const char *op, More more)
{
    const size_t words = 4 + 2 + (size_t)a.E + (size_t)(a.E + 1) * 2 + (need_gather_ws ? (size_t)a.M : 0);
    unsigned char *ws = nullptr;
    cudaError_t err = cudaMallocAsync(&ws, words * 8, stream);
    if (err != cudaSuccess)
        return moe_fail(err == cudaErrorMemoryAllocation ? MOE_ERR_OUT_OF_MEMORY : MOE_ERR_DEVICE,
                        "%s: cudaMallocAsync of the %zu-byte workspace failed: %s", op, words * 8,
                        cudaGetErrorString(err));
    int64_t *w = reinterpret_cast<int64_t *>(ws);
    a.status = reinterpret_cast<int *>(w);
    a.reports = reinterpret_cast<long long *>(w + 4);
    a.counts = w + 6;
    a.offsets = a.counts + a.E;
    a.block_start = a.offsets + (a.E + 1);
    if (need_gather_ws)
        a.gather = a.block_start + (a.E + 1);
    build_init_kernel<<<grid_for(a.E, 256, 64), 256, 0, stream>>>(a);
    if (a.M > 0)
        build_check_kernel<<<grid_for(a.M, 256, 1024), 256, 0, stream>>>(a);
    build_finalize_kernel<<<1, 32, 0, stream>>>(a);
    if (a.M > 0)
        place_kernel<<<(unsigned)(a.E < 1024 ? a.E : 1024), PLACE_THREADS, 0, stream>>>(a);
    moe_status status = MOE_OK;
    err = cudaGetLastError();
    if (err != cudaSuccess)
        status = moe_fail(MOE_ERR_DEVICE, "%s: kernel launch failed: %s", op, cudaGetErrorString(err));
    if (status == MOE_OK)
        status = more(a);
    return free_call_workspace(op, ws, stream, status);
}

} // namespace
} // namespace moe_gpu

using namespace moe_gpu;

moe_status moe_cuda_routing_build(int64_t T, int64_t k, int64_t E, const int64_t *topk_ids, int64_t *m_sizes,
                                  int64_t *gather_indices, int64_t *scatter_indices, void *stream)
{
    BuildArgs a = {};
    a.T = T, a.k = k, a.E = E, a.M = T * k, a.ids = topk_ids, a.op = 0, a.distinct_rows = 0;
    a.gather = gather_indices, a.scatter = scatter_indices, a.m_sizes = m_sizes;
    return run_build(a, false, static_cast<cudaStream_t>(stream), "moe_routing_build",
                     [](const BuildArgs &) { return MOE_OK; });
}

moe_status moe_cuda_mlp_layout_build(moe_mlp_layout_kind kind, int64_t T, int64_t k, int64_t E, int64_t B,
                                     int64_t pad, moe_dtype dtype, const int64_t *topk_ids, const void *topk_weights,
                                     int64_t num_blocks, int64_t *block_to_expert, int64_t *token_position_to_id,
                                     void *affinities, int64_t *num_dropped, int64_t *num_blocks_used, void *stream)
{
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    BuildArgs a = {};
    a.T = T, a.k = k, a.E = E, a.M = T * k, a.ids = topk_ids, a.op = 1, a.distinct_rows = 1;
    a.B = B, a.N_cap = num_blocks, a.pad = pad, a.dropping = kind == MOE_MLP_DROPPING;
    a.b2e = block_to_expert, a.tpid = token_position_to_id, a.num_used = num_blocks_used, a.num_dropped = num_dropped;
    a.weights = topk_weights, a.aff = affinities, a.es = (int64_t)moe_dtype_size(dtype);
    return run_build(a, true, s, "moe_mlp_layout_build_on", [&](const BuildArgs &w) -> moe_status {
        blocks_kernel<<<1, 32, 0, s>>>(w);
        tail_kernel<<<grid_for(num_blocks * B > T * E * w.es ? num_blocks * B : T * E * w.es, 256, 1024), 256, 0, s>>>(w);
        fill_kernel<<<(unsigned)(E < 1024 ? E : 1024), 256, 0, s>>>(w);
        MOE_CUDA_CHECK(cudaGetLastError());
        return MOE_OK;
    });
}

moe_status moe_cuda_routing_take_error(void)
{
    DeviceErrorRecord record;
    const moe_status taken = take_device_error(g_build_error, &record);
    if (taken != MOE_OK || record.kind == KIND_NONE)
        return taken;
    const char *op = record.op == 0 ? "moe_routing_build" : "moe_mlp_layout_build_on";
    const long long t = record.detail[BUILD_T], j = record.detail[BUILD_J], value = record.detail[BUILD_VALUE];
    if (record.kind == KIND_RANGE)
        return moe_fail(MOE_ERR_INVALID_INDEX, "%s %s: topk_ids[%lld][%lld] = %lld, expected an expert in [0, %lld)",
                        op, DEVICE_ERROR_WHERE, t, j, value, record.detail[BUILD_E]);
    return moe_fail(MOE_ERR_INVALID_ROUTING, "%s %s: topk_ids[%lld][%lld] = %lld repeats an expert of the same "
                    "token, expected distinct experts per token", op, DEVICE_ERROR_WHERE, t, j, value);
}
