// The rows path's numbering of the layout's real positions as rows grouped by expert (block_rows, row_offsets,
// row_pos / pos_row, and the split path's term offsets).
#include "common/cuda_check.cuh"
#include "common/launch.cuh"
#include "common/warp_scan.cuh"
#include "mlp/steps.cuh"

namespace moe_gpu {
namespace {

// block_rows[n] = the real positions of block n (one warp per block).
__global__ void block_rows_kernel(MlpArgs g)
{
    if (*g.status != ERR_NONE)
        return;
    const int lane = threadIdx.x % 32;
    for (int64_t n = warp_id_global(); n < g.num_blocks; n += warps_in_grid()) {
        int64_t count = 0;
        for (int64_t b0 = 0; b0 < g.B; b0 += 32) {
            const bool real = b0 + lane < g.B && token_of(g, n * g.B + b0 + lane) >= 0;
            count += __popc(__ballot_sync(0xffffffffu, real));
        }
        if (lane == 0)
            g.block_rows[n] = count;
    }
}

// row_offsets[e] and block_first[n] (one CTA; each thread walks its experts' block lists in order).
__global__ void __launch_bounds__(LIST_THREADS) row_offsets_kernel(MlpArgs g)
{
    if (*g.status != ERR_NONE)
        return;
    for (int64_t e = threadIdx.x; e < g.E; e += blockDim.x) {
        int64_t total = 0;
        for (int64_t q = g.expert_start[e]; q < g.expert_start[e + 1]; q++) {
            const int64_t n = g.expert_blocks[q];
            g.block_first[n] = total;
            total += g.block_rows[n];
        }
        g.row_offsets[e + 1] = total;
    }
    __syncthreads();
    if (threadIdx.x < 32)
        warp_prefix_sum(g.row_offsets, g.E);
    __syncthreads();
    for (int64_t e = threadIdx.x; e < g.E; e += blockDim.x)
        for (int64_t q = g.expert_start[e]; q < g.expert_start[e + 1]; q++)
            g.block_first[g.expert_blocks[q]] += g.row_offsets[e];
}

// row_pos and pos_row (one warp per block, ballots in slot order).
__global__ void row_maps_kernel(MlpArgs g)
{
    if (*g.status != ERR_NONE)
        return;
    const int lane = threadIdx.x % 32;
    for (int64_t n = warp_id_global(); n < g.num_blocks; n += warps_in_grid()) {
        int64_t next = g.block_first[n];
        for (int64_t b0 = 0; b0 < g.B; b0 += 32) {
            const int64_t pos = n * g.B + b0 + lane;
            const bool inside = b0 + lane < g.B;
            const bool real = inside && token_of(g, pos) >= 0;
            const unsigned bits = __ballot_sync(0xffffffffu, real);
            if (inside) {
                const int64_t row = real ? next + __popc(bits & ((1u << lane) - 1u)) : -1;
                g.pos_row[pos] = row;
                if (real)
                    g.row_pos[row] = pos;
            }
            next += __popc(bits);
        }
    }
}

// term_offsets[e] = 3 row_offsets[e] (split path).
__global__ void term_offsets_kernel(MlpArgs g)
{
    if (*g.status != ERR_NONE)
        return;
    for (int64_t e = threadIdx.x; e <= g.E; e += blockDim.x)
        g.term_offsets[e] = 3 * g.row_offsets[e];
}

} // namespace

moe_status launch_rows_layout(const MlpArgs &g, cudaStream_t stream)
{
    const int64_t cap = (int64_t)sm_count() * 8;
    block_rows_kernel<<<grid_for(g.num_blocks * 32, 256, cap), 256, 0, stream>>>(g);
    row_offsets_kernel<<<1, LIST_THREADS, 0, stream>>>(g);
    row_maps_kernel<<<grid_for(g.num_blocks * 32, 256, cap), 256, 0, stream>>>(g);
    if (g.term_offsets != nullptr)
        term_offsets_kernel<<<1, 256, 0, stream>>>(g);
    MOE_CUDA_CHECK(cudaGetLastError());
    return MOE_OK;
}

} // namespace moe_gpu
