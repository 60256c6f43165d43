// The grouped GEMM's entry points (moe_cuda_gemm_fwd, _dx, _dw, _topk_weights_grad): per call the routing
// check, the planned GEMM kernel and, for reduce_topk and the topk-weight gradient, a fixed-order reduction
// (SEMANTICS section 2).  Nothing is synchronised with the host; group sizes are read on the device.
//
// The three ops are one GEMM  C[i][j] = sum_q A(i,q) * B(q,j)  per expert with different operand
// layouts ("contiguous" = the dimension adjacent in memory):
//   fwd: i = expert row r, j = n, q = c:   A = X[xrow(r)][c]  (q contiguous), B = W[e][n][c] (q contiguous)
//   dX:  i = expert row r, j = c, q = n:   A = dY[yrow(r)][n] (q contiguous), B = W[e][n][c] (j contiguous)
//   dW:  i = n, j = c, q = expert row r:   A = dY[yrow(r)][n] (i contiguous), B = X[xrow(r)][c] (j contiguous)
// Output tiles are owned by exactly one CTA, which reduces over q in a fixed order: results are bitwise
// reproducible run to run (no float atomics anywhere).
//
// Paths (families): sm90 (gemm/sm90.cu: Hopper, warp-specialised wgmma kernel fed by TMA and cp.async,
// 128 x 256 tiles; fwd, dX, dW), sm80 (tc_gemm_kernel: mma.sync m16n8k16 with ldmatrix on sm_80+, cp.async
// 4-stage pipeline, 128 x 128 tiles; also the topk-weight gradient), both for bf16/f16 inputs with fp32
// accumulation and N % 8 == 0, K % 8 == 0, 16-byte aligned tensors (dW with fused topk weights: w * dY
// split exactly into two bf16 terms for bf16, both MMA'd, and into two TF32 terms for f16, on the sm80 kernel
// only), and the sm80 family's TF32 kernel (tf32_gemm_kernel: f32 inputs with allow_tf32, every op, fused
// topk weights included, mma.sync m16n8k8); and SIMT (true fp32 FFMA; used for f32 inputs otherwise and
#include "common/cuda_check.cuh"
#include "common/dtype.cuh"
#include "gemm/gemm.cuh"
#include "gemm/heuristics.cuh"
#include "gemm/plan.cuh"

namespace moe_gpu {

// ------------------------------------------------------------------------------------------------
// Fixed-order reductions: reduce_topk (dX[t] = sum_j slot rows) and the topk-weight gradient partials, and
// the call workspace (shared with gpu/gemm/fp8.cu).
// ------------------------------------------------------------------------------------------------
// reduce_topk: dX[t] = sum_j slot rows t*k + j of the fp32 workspace, in j order, then one rounding.
__global__ void reduce_topk_kernel(const float *slots, int64_t T, int64_t k, int64_t K, void *dx, moe_dtype dtype,
                                   int accumulate, const int *status)
{
    if (*status != 0)
        return;
    for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < T * K; idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = idx / K, c = idx % K;
        float sum = 0.0f;
        for (int64_t j = 0; j < k; j++)
            sum += slots[(t * k + j) * K + c];
        if (accumulate)
            sum = load_as_float(dtype, dx, idx) + sum;
        store_from_float(dtype, dx, idx, sum);
    }
}

void launch_reduce_topk(const float *slots, int64_t T, int64_t k, int64_t K, void *dx, moe_dtype dtype, int accumulate,
                        const int *status, cudaStream_t stream)
{
    if (T * K > 0)
        reduce_topk_kernel<<<1024, 256, 0, stream>>>(slots, T, k, K, dx, dtype, accumulate, status);
}

cudaError_t alloc_call_workspace(int64_t E, int64_t M, int64_t extra_floats, cudaStream_t stream,
                                 unsigned char **base, Workspace *w, float **extra)
{
    const int64_t bitmap_words = M / 32 + 1;
    size_t bytes = (size_t)(3 * (E + 1) + 1) * 8 + (size_t)bitmap_words * 4 + 16;
    bytes = (bytes + 255) / 256 * 256;
    const size_t extra_offset = bytes;
    bytes += (size_t)extra_floats * 4;
    const cudaError_t err = cudaMallocAsync(base, bytes, stream);
    if (err != cudaSuccess)
        return err;
    w->offsets = reinterpret_cast<int64_t *>(*base);
    w->tile_start = w->offsets + (E + 1);
    w->lone_start = w->tile_start + (E + 1);
    w->tile_counter = reinterpret_cast<unsigned long long *>(w->lone_start + (E + 1));
    w->seen = reinterpret_cast<unsigned *>(w->tile_counter + 1);
    w->status = reinterpret_cast<int *>(w->seen + bitmap_words);
    *extra = reinterpret_cast<float *>(*base + extra_offset);
    return cudaSuccess;
}

namespace {

__global__ void reduce_partials_kernel(const float *partials, int64_t M, int64_t parts, void *out, moe_dtype dtype,
                                       int accumulate, const int *status)
{
    if (*status != 0)
        return;
    for (int64_t s = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; s < M; s += (int64_t)gridDim.x * blockDim.x) {
        float sum = 0.0f;
        for (int64_t p = 0; p < parts; p++)
            sum += partials[s * parts + p];
        if (accumulate)
            sum = load_as_float(dtype, out, s) + sum;
        store_from_float(dtype, out, s, sum);
    }
}

// Runs one op end to end on the stream: workspace, routing check, GEMM, reduction.
moe_status run_gemm(const moe_gemm_problem *p, int op, const void *a, const void *b, const void *weights,
                    const void *dy, void *out)
{
    cudaStream_t stream = static_cast<cudaStream_t>(p->stream);
    const int64_t E = p->num_experts, M = p->rows;
    const int64_t cols_j = op == OP_FWD || op == OP_TOPK_GRAD ? p->N : p->K;
    GemmArgs g = {};
    Plan plan;
    const moe_dtype out_dtype = (op == OP_DW || op == OP_TOPK_GRAD) ? p->dw_dtype : p->dtype;
    moe_status status = plan_gemm(p, op, a, b, out, out_dtype, weights != NULL, &g, &plan);
    if (status != MOE_OK)
        return status;
    const int BM = plan.bm;
    const int64_t col_tiles = (cols_j + plan.bn - 1) / plan.bn;
    const int reduce = op == OP_DX && p->reduce_topk;

    const int64_t partials = op == OP_TOPK_GRAD ? M * col_tiles : reduce ? M * p->K : 0;
    unsigned char *ws = nullptr;
    Workspace w;
    float *partial_buffer = nullptr;
    const int64_t bitmap_words = M / 32 + 1;
    MOE_CUDA_CHECK(alloc_call_workspace(E, M, partials, stream, &ws, &w, &partial_buffer));
    do {
        launch_routing_check(p, op, col_tiles, BM, plan.cluster > 1, bitmap_words, w, stream);
        cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess) {
            status = moe_fail(MOE_ERR_DEVICE, "%s: routing check launch failed: %s", p->op, cudaGetErrorString(err));
            break;
        }

        g.op = op;
        g.dtype = p->dtype;
        g.out_dtype = out_dtype;
        g.T = p->num_tokens, g.k = p->topk, g.E = E, g.M = M, g.N = p->N, g.K = p->K;
        g.cols_j = cols_j;
        g.gather = p->gather_indices;
        g.permute_x = p->permute_x, g.permute_y = p->permute_y, g.accumulate = p->accumulate;
        g.a = a, g.b = b, g.weights = weights, g.dy = dy;
        g.out = (op == OP_TOPK_GRAD || reduce) ? static_cast<void *>(partial_buffer) : out;
        g.out_is_workspace = op == OP_TOPK_GRAD || reduce;
        g.partial_stride = col_tiles;
        g.sm90_skip = sm90_skip_from_env();
        g.ws = w;
        status = launch_plan(plan, op, g, max_tiles_of(op, E, M, p->N, BM, col_tiles), stream);
        if (status != MOE_OK)
            break;
        const unsigned blocks = 1024;
        if (reduce) {
            launch_reduce_topk(partial_buffer, p->num_tokens, p->topk, p->K, out, p->dtype, p->accumulate, w.status,
                               stream);
        } else if (op == OP_TOPK_GRAD && M > 0) {
            reduce_partials_kernel<<<blocks, 256, 0, stream>>>(static_cast<const float *>(g.out), M, col_tiles, out,
                                                               p->dw_dtype, p->accumulate, w.status);
        }
        err = cudaGetLastError();
        if (err != cudaSuccess)
            status = moe_fail(MOE_ERR_DEVICE, "%s: reduction launch failed: %s", p->op, cudaGetErrorString(err));
    } while (0);
    return free_call_workspace(p->op, ws, stream, status);
}

} // namespace
} // namespace moe_gpu

using namespace moe_gpu;

moe_status moe_cuda_gemm_fwd(const moe_gemm_problem *p, const void *x, const void *w, const void *topk_weights,
                             void *y)
{
    return run_gemm(p, OP_FWD, x, w, topk_weights, nullptr, y);
}

moe_status moe_cuda_gemm_dx(const moe_gemm_problem *p, const void *dy, const void *w, const void *topk_weights,
                            void *dx)
{
    return run_gemm(p, OP_DX, dy, w, topk_weights, nullptr, dx);
}

moe_status moe_cuda_gemm_dw(const moe_gemm_problem *p, const void *x, const void *dy, const void *topk_weights,
                            void *dw)
{
    return run_gemm(p, OP_DW, dy, x, topk_weights, nullptr, dw);
}

moe_status moe_cuda_gemm_topk_weights_grad(const moe_gemm_problem *p, const void *x, const void *w, const void *dy,
                                           void *d_topk_weights)
{
    return run_gemm(p, OP_TOPK_GRAD, x, w, nullptr, dy, d_topk_weights);
}
