// The rows GEMMs of the MLP (moe_cuda_rows_gemm: rows already grouped by expert, trusted offsets): their tile
// starts, their GemmArgs, and the choice between the f32 rows ping-pong kernel and the planned kernels.
#include "common/cuda_check.cuh"
#include "common/warp_scan.cuh"
#include "gemm/heuristics.cuh"
#include "gemm/plan.cuh"
#include "gemm/rows.cuh"
#include "gemm/sm90.cuh"

namespace moe_gpu {
namespace {

// Tile starts of a rows GEMM from trusted offsets: one warp, 32 experts at a time, shuffle prefix sums.
// (paired: also the lone tiles' starts, as check_sizes_kernel.)
__global__ void rows_tiles_kernel(const int64_t *offsets, int64_t E, int64_t col_tiles, int64_t rows_per_tile,
                                  int paired, int64_t *tile_start, int64_t *lone_start,
                                  unsigned long long *tile_counter, const int *status)
{
    if (blockIdx.x != 0 || threadIdx.x >= 32 || *status != 0)
        return;
    const int lane = threadIdx.x;
    int64_t carried = 0, carried_lone = 0;
    if (lane == 0)
        tile_start[0] = 0, lone_start[0] = 0, *tile_counter = 0;
    for (int64_t e0 = 0; e0 < E; e0 += 32) {
        const int64_t e = e0 + lane;
        int64_t lone = 0;
        int64_t tiles = e < E ? expert_tiles(offsets[e + 1] - offsets[e], rows_per_tile, col_tiles, paired, &lone) : 0;
        tiles = warp_inclusive_sum(tiles), lone = warp_inclusive_sum(lone);
        if (e < E)
            tile_start[e + 1] = carried + tiles, lone_start[e + 1] = carried_lone + lone;
        carried += warp_last_lane(tiles);
        carried_lone += warp_last_lane(lone);
    }
}

} // namespace

moe_status with_tile_starts_of(const MoeRowsGemm *r, int64_t col_tiles, int64_t rows_per_tile, bool paired,
                               TileStartsLaunch launch, void *context)
{
    cudaStream_t stream = static_cast<cudaStream_t>(r->stream);
    int64_t *tile_start = nullptr;
    // tile_start, lone_start, the tile counter
    MOE_CUDA_CHECK(cudaMallocAsync(&tile_start, (size_t)((r->E + 1) * 2 + 1) * 8, stream));
    int64_t *const lone_start = tile_start + (r->E + 1);
    unsigned long long *const tile_counter = reinterpret_cast<unsigned long long *>(lone_start + (r->E + 1));
    rows_tiles_kernel<<<1, 32, 0, stream>>>(r->offsets, r->E, col_tiles, rows_per_tile, paired, tile_start,
                                            lone_start, tile_counter, r->status);
    moe_status status = MOE_OK;
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess)
        status = moe_fail(MOE_ERR_DEVICE, "%s: tile start launch failed: %s", r->name, cudaGetErrorString(err));
    if (status == MOE_OK)
        status = launch(context, tile_start, lone_start, tile_counter);
    return free_call_workspace(r->name, tile_start, stream, status);
}

// GemmArgs of a rows GEMM (op, dtypes, shapes, operands, offsets and status from r; cols_j, the tile starts
// and the tile counter from the caller).
GemmArgs rows_gemm_args(const MoeRowsGemm *r, int op, int64_t cols_j, int64_t *tile_start, int64_t *lone_start,
                        unsigned long long *tile_counter)
{
    GemmArgs g = {};
    g.op = op;
    g.dtype = r->dtype, g.out_dtype = r->out_dtype;
    g.T = r->rows, g.k = 1, g.E = r->E, g.M = r->rows, g.N = r->N, g.K = r->K;
    g.cols_j = cols_j;
    g.accumulate = r->accumulate;
    g.a = r->a, g.b = r->b, g.out = r->out;
    g.sm90_skip = sm90_skip_from_env();
    g.ws.offsets = const_cast<int64_t *>(r->offsets);
    g.ws.tile_start = tile_start;
    g.ws.lone_start = lone_start;
    g.ws.tile_counter = tile_counter;
    g.ws.seen = nullptr;
    g.ws.status = const_cast<int *>(r->status);
    return g;
}

} // namespace moe_gpu

using namespace moe_gpu;

moe_status moe_cuda_rows_gemm(const MoeRowsGemm *r)
{
    static_assert((int)MOE_ROWS_A_WT == (int)OP_FWD && (int)MOE_ROWS_A_W == (int)OP_DX && (int)MOE_ROWS_AT_B == (int)OP_DW,
                  "op numbering");
    int taken = 0;
    const moe_status pingpong = rows_f32_pingpong(r, &taken);
    if (taken || pingpong != MOE_OK)
        return pingpong;
    cudaStream_t stream = static_cast<cudaStream_t>(r->stream);
    const int op = r->op;
    moe_gemm_problem p = {};
    p.op = r->name;
    p.num_tokens = r->rows, p.topk = 1, p.num_experts = r->E, p.rows = r->rows, p.N = r->N, p.K = r->K;
    p.dtype = r->dtype, p.dw_dtype = r->out_dtype, p.accumulate = r->accumulate, p.stream = r->stream;
    GemmArgs planned = {};
    Plan plan;
    moe_status status = plan_gemm(&p, op, r->a, r->b, r->out, r->out_dtype, false, &planned, &plan);
    if (status != MOE_OK)
        return status;
    const int64_t cols_j = op == OP_FWD ? r->N : r->K;
    const int64_t col_tiles = (cols_j + plan.bn - 1) / plan.bn;
    return with_tile_starts(r, col_tiles, plan.bm, plan.cluster > 1, [&](int64_t *tile_start, int64_t *lone_start,
                                                                               unsigned long long *tile_counter) {
        GemmArgs g = rows_gemm_args(r, op, cols_j, tile_start, lone_start, tile_counter);
        // what plan_gemm decided (tensor-map flags, dynamic tiles)
        g.tma_rows = planned.tma_rows, g.tma_out = planned.tma_out, g.tma_out_wide = planned.tma_out_wide;
        g.dynamic_tiles = planned.dynamic_tiles, g.full_blocks = planned.full_blocks;
        g.partial_stride = col_tiles;
        return launch_plan(plan, op, g, max_tiles_of(op, r->E, r->rows, r->N, plan.bm, col_tiles), stream);
    });
}
