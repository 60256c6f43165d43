// The MLP's layout check (the first kernels of every call: ids in range, each pair and, with
// tensor_update_overwrite, each token at most once), the per-expert block lists, and the check's sticky record.
#include "common/cuda_check.cuh"
#include "common/device_error.cuh"
#include "common/launch.cuh"
#include "common/warp_scan.cuh"
#include "mlp/args.cuh"
#include "mlp/steps.cuh"
#include "mlp/mlp_cuda.h"

namespace moe_gpu {

// DeviceErrorRecord::detail slots of a layout error: the position (the block for ERR_EXPERT) and its value, the
// earlier position of the same pair or token and the pair's expert, and the call's T, E, B and padding mark.
enum LayoutErrorDetail : int {
    LAYOUT_INDEX, LAYOUT_VALUE, LAYOUT_OTHER, LAYOUT_EXPERT, LAYOUT_T, LAYOUT_E, LAYOUT_B, LAYOUT_PAD, LAYOUT_DETAILS
};

__device__ DeviceErrorRecord g_layout_error;

namespace {

// ------------------------------------------------------------------------------------------------
// Layout check and lists
// ------------------------------------------------------------------------------------------------
__global__ void layout_init_kernel(MlpArgs g)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x, first = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    for (int64_t i = first; i < g.T * g.E; i += stride)
        g.pair_pos[i] = NONE;
    if (g.tok_first != nullptr)
        for (int64_t i = first; i < g.T; i += stride)
            g.tok_first[i] = NONE;
    if (first < REPORTS)
        g.reports[first] = NONE;
    if (first == 0)
        *g.status = ERR_NONE;
}

__global__ void layout_check_kernel(MlpArgs g)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x, first = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    for (int64_t n = first; n < g.num_blocks; n += stride)
        if (g.b2e[n] < 0 || g.b2e[n] >= g.E)
            atomicMin(&g.reports[REP_EXPERT], (long long)n);
    for (int64_t p = first; p < g.positions; p += stride) {
        const int64_t id = g.ids[p], e = g.b2e[p / g.B];
        if (id == g.pad)
            continue;
        if (id < 0 || id >= g.T) {
            atomicMin(&g.reports[REP_TOKEN], (long long)p);
            continue;
        }
        if (e < 0 || e >= g.E)
            continue;
        atomicMin(&g.pair_pos[id * g.E + e], (long long)p);
        if (g.tok_first != nullptr)
            atomicMin(&g.tok_first[id], (long long)p);
    }
}

__global__ void layout_repeat_kernel(MlpArgs g)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x, first = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    for (int64_t p = first; p < g.positions; p += stride) {
        const int64_t id = g.ids[p], e = g.b2e[p / g.B];
        if (id < 0 || id >= g.T || e < 0 || e >= g.E)
            continue;
        if (g.pair_pos[id * g.E + e] != p)
            atomicMin(&g.reports[REP_PAIR], (long long)p);
        if (g.tok_first != nullptr && g.tok_first[id] != p)
            atomicMin(&g.reports[REP_TOP1], (long long)p);
    }
}

__global__ void layout_finalize_kernel(MlpArgs g)
{
    if (threadIdx.x != 0 || blockIdx.x != 0)
        return;
    DeviceErrorRecord err = {};
    for (int r = 0; r < REPORTS && err.kind == ERR_NONE; r++) {
        const long long at = g.reports[r];
        if (at == NONE)
            continue;
        err.kind = r + 1;
        err.detail[LAYOUT_INDEX] = at;
        if (r == REP_EXPERT) {
            err.detail[LAYOUT_VALUE] = g.b2e[at];
            continue;
        }
        err.detail[LAYOUT_VALUE] = g.ids[at];
        if (r == REP_PAIR) {
            err.detail[LAYOUT_EXPERT] = g.b2e[at / g.B];
            err.detail[LAYOUT_OTHER] = g.pair_pos[err.detail[LAYOUT_VALUE] * g.E + err.detail[LAYOUT_EXPERT]];
        } else if (r == REP_TOP1) {
            err.detail[LAYOUT_OTHER] = g.tok_first[err.detail[LAYOUT_VALUE]];
        }
    }
    *g.status = err.kind;
    if (err.kind == ERR_NONE)
        return;
    err.op = g.op, err.detail[LAYOUT_T] = g.T, err.detail[LAYOUT_E] = g.E, err.detail[LAYOUT_B] = g.B;
    err.detail[LAYOUT_PAD] = g.pad;
    publish_device_error(&g_layout_error, err.kind, [&](DeviceErrorRecord *record) {
        record->op = err.op;
        for (int d = 0; d < LAYOUT_DETAILS; d++)
            record->detail[d] = err.detail[d];
    });
}

// One CTA of 32 warps.  expert_start[e] .. expert_start[e+1]-1 index expert_blocks, which lists the
// blocks of expert e in ascending order: a stable counting sort of the blocks by expert, without atomics.
// Warp w owns the w-th of 32 contiguous segments of the blocks and walks it 32 blocks at a time; the lanes
// holding blocks of one expert find each other by __match_any_sync, and the group's lowest lane counts them.
// Experts go in windows of LIST_WINDOW (one window up to E = 128), with per warp and expert of the window a
// count in shared memory (counts[w][e - e0]):
//   1. per window: the segments' counts; thread j sums expert e0 + j's over the warps into expert_start[e + 1];
//   2. expert_start becomes the running totals (warp_prefix_sum);
//   3. per window: the counts again (with one window, E <= LIST_WINDOW, pass 1's, still in shared memory),
//      turned by thread j into each segment's first index of expert e0 + j (expert_start[e] + the blocks of e
//      in earlier segments); each warp then places its blocks from there, a group's lanes in lane order.
// The kernel this replaced had each warp scan every block once per expert of its own (twice), an instruction
// stream of E * N / 32 ballots on one SM; this one is several times faster with many experts or many blocks and
// slightly slower with E = 8 (ncu, H200; bench/RESULTS.md, "the expert lists as a counting sort").
constexpr int LIST_WARPS = LIST_THREADS / 32, LIST_WINDOW = 128;

// Warp `warp`'s blocks of the window's experts: calls visit(n, e, group, lane_is_lowest) per chunk of 32 blocks
// for every lane holding block n of expert e in [e0, e0 + LIST_WINDOW) (group: the lanes of the chunk holding
// that expert's blocks).  Whole-warp calls only (every lane runs every chunk).
template <class Visit>
__device__ __forceinline__ void walk_segment(const MlpArgs &g, int warp, int64_t e0, Visit visit)
{
    const int lane = threadIdx.x % 32;
    const int64_t per_warp = (g.num_blocks + LIST_WARPS - 1) / LIST_WARPS;
    const int64_t begin = warp * per_warp, end = begin + per_warp < g.num_blocks ? begin + per_warp : g.num_blocks;
    for (int64_t n0 = begin; n0 < end; n0 += 32) {
        const int64_t n = n0 + lane;
        const int64_t e = n < end ? g.b2e[n] : -1;
        const bool inside = e >= e0 && e < e0 + LIST_WINDOW;
        const unsigned group = __match_any_sync(0xffffffffu, (unsigned long long)(inside ? e : -1));
        if (inside)
            visit(n, e, group, lane == __ffs(group) - 1);
        __syncwarp();
    }
}

__global__ void __launch_bounds__(LIST_THREADS) expert_lists_kernel(MlpArgs g)
{
    if (*g.status != ERR_NONE)
        return;
    __shared__ int64_t counts[LIST_WARPS][LIST_WINDOW];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, j = threadIdx.x;
    // this window's counts per warp (the CTA synchronised before and after)
    auto count_window = [&](int64_t e0) {
        for (int q = lane; q < LIST_WINDOW; q += 32)
            counts[warp][q] = 0;
        __syncwarp();
        walk_segment(g, warp, e0, [&](int64_t, int64_t e, unsigned group, bool lowest) {
            if (lowest)
                counts[warp][e - e0] += __popc(group);
        });
    };
    for (int64_t e0 = 0; e0 < g.E; e0 += LIST_WINDOW) {
        count_window(e0);
        __syncthreads();
        if (j < LIST_WINDOW && e0 + j < g.E) {
            int64_t total = 0;
            for (int w = 0; w < LIST_WARPS; w++)
                total += counts[w][j];
            g.expert_start[e0 + j + 1] = total;
        }
        __syncthreads();
    }
    if (warp == 0)
        warp_prefix_sum(g.expert_start, g.E);
    __syncthreads();
    for (int64_t e0 = 0; e0 < g.E; e0 += LIST_WINDOW) {
        if (g.E > LIST_WINDOW) // one window: pass 1's counts are still there (the prefix sum left them)
            count_window(e0);
        __syncthreads();
        if (j < LIST_WINDOW && e0 + j < g.E) {
            int64_t next = g.expert_start[e0 + j];
            for (int w = 0; w < LIST_WARPS; w++) {
                const int64_t c = counts[w][j];
                counts[w][j] = next;
                next += c;
            }
        }
        __syncthreads();
        walk_segment(g, warp, e0, [&](int64_t n, int64_t e, unsigned group, bool lowest) {
            int64_t &next = counts[warp][e - e0];
            g.expert_blocks[next + __popc(group & ((1u << lane) - 1u))] = n;
            __syncwarp(group);
            if (lowest)
                next += __popc(group);
        });
        __syncthreads();
    }
}

} // namespace

// Runs the layout check and the expert lists (the first kernels of every call).
moe_status launch_layout(const MlpArgs &g, cudaStream_t stream)
{
    const int64_t cap = (int64_t)sm_count() * 8;
    const int64_t most = g.T * g.E > g.positions ? g.T * g.E : g.positions;
    layout_init_kernel<<<grid_for(most > (int64_t)REPORTS ? most : (int64_t)REPORTS, 256, cap), 256, 0, stream>>>(g);
    layout_check_kernel<<<grid_for(g.positions > g.num_blocks ? g.positions : g.num_blocks, 256, cap), 256, 0, stream>>>(g);
    layout_repeat_kernel<<<grid_for(g.positions, 256, cap), 256, 0, stream>>>(g);
    layout_finalize_kernel<<<1, 32, 0, stream>>>(g);
    expert_lists_kernel<<<1, LIST_THREADS, 0, stream>>>(g);
    MOE_CUDA_CHECK(cudaGetLastError());
    return MOE_OK;
}

} // namespace moe_gpu

using namespace moe_gpu;

moe_status moe_cuda_mlp_take_error(void)
{
    DeviceErrorRecord record;
    const moe_status taken = take_device_error(g_layout_error, &record);
    if (taken != MOE_OK || record.kind == ERR_NONE)
        return taken;
    const char *op = record.op == 0 ? "moe_mlp_fwd" : "moe_mlp_bwd";
    const char *where = DEVICE_ERROR_WHERE;
    const long long index = record.detail[LAYOUT_INDEX], value = record.detail[LAYOUT_VALUE];
    const long long other = record.detail[LAYOUT_OTHER], expert = record.detail[LAYOUT_EXPERT];
    const long long T = record.detail[LAYOUT_T], E = record.detail[LAYOUT_E], B = record.detail[LAYOUT_B];
    const long long pad = record.detail[LAYOUT_PAD];
    switch (record.kind) {
    case ERR_EXPERT:
        return moe_fail(MOE_ERR_INVALID_INDEX, "%s %s: layout.block_to_expert[%lld] = %lld, expected an expert in "
                        "[0, %lld)", op, where, index, value, E);
    case ERR_TOKEN:
        return moe_fail(MOE_ERR_INVALID_INDEX, "%s %s: layout.token_position_to_id[%lld] = %lld (block %lld, slot "
                        "%lld), expected a token in [0, %lld) or the padding mark %lld of %s", op, where, index, value,
                        index / B, index % B, T, pad, pad < 0 ? "MOE_MLP_PAD_SKIP" : "MOE_MLP_PAD_ROW");
    case ERR_PAIR:
        return moe_fail(MOE_ERR_INVALID_ROUTING, "%s %s: layout.token_position_to_id[%lld] and [%lld] both place "
                        "token %lld with expert %lld, expected each (token, expert) pair at most once", op, where,
                        other, index, value, expert);
    case ERR_TOP1:
        return moe_fail(MOE_ERR_INVALID_OPTION, "%s %s: options.tensor_update_overwrite is set but token %lld sits "
                        "at layout.token_position_to_id[%lld] and [%lld], expected each token at most once (top-1)",
                        op, where, value, other, index);
    }
    return moe_fail(MOE_ERR_DEVICE, "%s %s: unknown device error record %d", op, where, record.kind);
}
