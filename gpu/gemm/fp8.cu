// The FP8 grouped GEMM on CUDA (include/moe_fp8.h; the exact math is specs/FP8.md): fwd and dX, on every GPU
// from sm_80.  The portable kernel: each K-step's FP8 codes are decoded to bf16 (exact: e4m3's and e5m2's
// values are bf16 values) into shared memory and multiplied by mma.sync m16n8k16 with fp32 accumulation; at
// the end of each 128-element tile of the reduction, the tile's partial sums are promoted as the reference
// promotes them, acc += part * (s_a * s_w), tiles in ascending order.  Only the order of the 128 products'
// sums inside a tile differs from the reference (the tensor core's), which the derived bound covers.
//
//   fwd: out[r][n] = sum over K-tiles t of part_t(X[xrow(r)], W[e][n]) * (sx[xrow(r)][t] * sw[e][n/128][t])
//   dX:  out[r][c] = sum over N-tiles t of part_t(dY[yrow(r)], W[e][.][c]) * (sdy[yrow(r)][t] * sw[e][t][c/128])
//        (from W^T, w_transposed: W^T[e][c][.] and its block (e, c/128, t), the same values)
// 128 x 128 output tiles, 256 threads (8 warps of 64 x 32), K-steps of 32; a tile's 128 columns lie in one W
// block, so the W scale of a K-tile is one number per CTA.  The scales are checked on the device first
// (finite and > 0; UE8M0 not 255): a bad one is reported by moe_backend_synchronize and the call writes
// nothing.  Topk weights, permute_x / permute_y, accumulate and the rounding are the GEMM's epilogue
// (gemm/epilogue.cuh); reduce_topk sums the fp32 slot rows in gemm/gemm.cu's fixed order.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cuda_check.cuh"
#include "common/device_error.cuh"
#include "common/launch.cuh"
#include "gemm/epilogue.cuh"
#include "gemm/fp8.cuh"
#include "gemm/gemm.cuh"
#include "gemm/heuristics.cuh"
#include "gemm/plan.cuh"
#include "fp8/column_tiles.cuh"

namespace moe_gpu {

enum Fp8ScaleErrorKind : int { FP8_SCALE_OK = 0, FP8_SCALE_BAD = 1 };
// DeviceErrorRecord::detail slots: the operand, the scale's index and bits, the scales per row
enum Fp8ScaleDetail : int { FP8_OPERAND = 0, FP8_INDEX = 1, FP8_BITS = 2, FP8_PER_ROW = 3 };
__device__ DeviceErrorRecord g_fp8_scale_error;

namespace {

// One operand's scale check (launch_fp8_scale_check): one bad scale is reported (whichever thread claims the call's
// status word first, not necessarily the lowest index); the GEMM kernel then skips the call.  Nothing runs after a
// routing error (the offsets column_experts reads may be incomplete then).
__global__ void check_scales_kernel(const void *scales, int64_t count, int64_t per_row, int64_t column_experts,
                                    int ue8m0, int operand, int op, Workspace ws)
{
    if (*ws.status != 0)
        return;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t first, end;
        if (column_experts > 0 && !column_tile_of_scale_row(ws.offsets, column_experts, i / per_row, &first, &end))
            continue; // a dW scale row no tile uses: never read
        unsigned bits;
        bool bad;
        if (ue8m0) {
            bits = static_cast<const uint8_t *>(scales)[i];
            bad = bits == 255u;
        } else {
            const float s = static_cast<const float *>(scales)[i];
            bits = __float_as_uint(s);
            bad = !(s > 0.0f && s <= 3.4028234663852886e38f);
        }
        if (bad && atomicCAS(ws.status, 0, FP8_SCALE_BAD) == 0)
            publish_device_error(&g_fp8_scale_error, FP8_SCALE_BAD, [&](DeviceErrorRecord *record) {
                record->op = op;
                record->detail[FP8_OPERAND] = operand;
                record->detail[FP8_INDEX] = i;
                record->detail[FP8_BITS] = bits;
                record->detail[FP8_PER_ROW] = per_row;
            });
    }
}

} // namespace

cudaError_t launch_fp8_scale_check(const void *scales, int64_t count, int64_t per_row, int64_t column_experts,
                                   int ue8m0, int operand, int op, const Workspace &ws, cudaStream_t stream)
{
    if (count > 0)
        check_scales_kernel<<<grid_for(count, 256, 1024), 256, 0, stream>>>(scales, count, per_row, column_experts,
                                                                           ue8m0, operand, op, ws);
    return cudaGetLastError();
}

namespace {

__global__ void __launch_bounds__(F8_THREADS) fp8_gemm_kernel(Fp8Args f)
{
    __shared__ uint16_t decode_a[256], decode_b[256];
    __shared__ __align__(16) uint16_t sa[F8_BM][F8_LDS]; // A(i, q): tile row i, K-step column q
    __shared__ __align__(16) uint16_t sb[F8_BN][F8_LDS]; // B(q, j) stored as [j][q]
    __shared__ int64_t a_rows[F8_BM];                    // A's source row per tile row, -1 past the expert
    __shared__ float a_scale[F8_BM];
    __shared__ float b_scale;
    const GemmArgs &g = f.g;
    if (*g.ws.status != 0)
        return;
    for (int i = threadIdx.x; i < 256; i += F8_THREADS) {
        decode_a[i] = fp8_to_bf16_bits(f.a_dtype, (unsigned)i);
        decode_b[i] = fp8_to_bf16_bits(f.b_dtype, (unsigned)i);
    }
    const bool dx = g.op == OP_DX;
    const int64_t qlen = dx ? g.N : g.K, tiles_q = (qlen + F8_TILE - 1) / F8_TILE;
    const int warp = threadIdx.x / 32;
    const int wm = warp % 2 * 64, wn = warp / 2 * 32;
    const int64_t tiles = total_tiles(g, F8_BM, F8_BN);
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const TileCoord t = tile_coord(g, tile, F8_BM, F8_BN);
        if (threadIdx.x < F8_BM)
            a_rows[threadIdx.x] = a_source_row(g, t, t.i0 + threadIdx.x, dx);
        float acc[4][4][4] = {}, part[4][4][4] = {};
        for (int64_t tq = 0; tq < tiles_q; tq++) {
            const int64_t q_begin = tq * F8_TILE, q_end = qlen - q_begin < F8_TILE ? qlen : q_begin + F8_TILE;
            for (int64_t q0 = q_begin; q0 < q_end; q0 += F8_BK) {
                __syncthreads(); // a_rows written; the previous step's tiles read
                { // A: tile row i, 16 codes of the K-step
                    const int i = threadIdx.x / 2, h = threadIdx.x % 2;
                    const uint8_t *row = a_rows[i] >= 0 ? f.a + a_rows[i] * qlen : nullptr;
                    load16(row, q0 + 16 * h, q_end, f.a_vec, decode_a, &sa[i][16 * h], 1);
                }
                if (!dx || f.w_kn) { // B = W[e][n][q] (fwd) or W^T[e][c][q] (dX): tile column j, 16 codes
                    const int j = threadIdx.x / 2, h = threadIdx.x % 2;
                    const int64_t n = t.j0 + j, cols = dx ? g.K : g.N; // n: the output column
                    const uint8_t *row = n < cols ? f.b + (t.e * cols + n) * qlen : nullptr;
                    load16(row, q0 + 16 * h, q_end, f.b_vec, decode_b, &sb[j][16 * h], 1);
                } else { // B = W[e][q][c]: K-step row q, 16 consecutive columns, stored transposed
                    const int q = threadIdx.x / 8, c16 = threadIdx.x % 8 * 16;
                    const int64_t n = q0 + q;
                    const uint8_t *row = n < q_end ? f.b + (t.e * g.N + n) * g.K : nullptr;
                    load16(row, t.j0 + c16, g.K, f.b_vec, decode_b, &sb[c16][q], F8_LDS);
                }
                __syncthreads();
                fp8_mma_step(sa, sb, wm, wn, part);
            }
            // promotion: acc += part * (s_a(row) * s_w), the reference's two roundings
            if (threadIdx.x < F8_BM)
                a_scale[threadIdx.x] = a_rows[threadIdx.x] >= 0 ? fp8_a_scale(f, a_rows[threadIdx.x], tq) : 0.0f;
            if (threadIdx.x == 0)
                b_scale = fp8_w_scale(f, t.e, tq, t.j0);
            __syncthreads();
            fp8_promote(acc, part, a_scale, &b_scale, 0, wm, wn);
            __syncthreads(); // the scales are read before the next tile writes them
        }
        fp8_store(g, t, acc, wm, wn);
        __syncthreads(); // a_rows is read before the next tile writes it
    }
}

bool aligned16(const void *p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// One op end to end on the stream: workspace, routing and scale checks, the kernel, reduce_topk's sum.
moe_status run_fp8(const moe_fp8_problem *fp, int op, const moe_fp8_tensor *a, const moe_fp8_tensor *b,
                   const float *weights, void *out)
{
    const moe_gemm_problem *p = &fp->g;
    cudaStream_t stream = static_cast<cudaStream_t>(p->stream);
    const int64_t E = p->num_experts, M = p->rows, N = p->N, K = p->K;
    const bool dx = op == OP_DX, reduce = dx && p->reduce_topk;
    const int message_op = dx ? ROUTING_OP_FP8_DX : ROUTING_OP_FP8_FWD;
    KernelOverride forced; // before any work: an unknown value fails the call
    const moe_status env_status = kernel_override(p->op, &forced);
    if (env_status != MOE_OK)
        return env_status;
    Fp8Args f = {};
    GemmArgs &g = f.g;
    g.op = op;
    g.dtype = MOE_F32; // the topk weights' dtype (the epilogue's topk_weight reads them with it)
    g.out_dtype = p->dtype;
    g.T = p->num_tokens, g.k = p->topk, g.E = E, g.M = M, g.N = N, g.K = K;
    g.cols_j = dx ? K : N;
    g.gather = p->gather_indices;
    g.permute_x = p->permute_x, g.permute_y = p->permute_y, g.accumulate = p->accumulate;
    g.weights = weights;
    g.out_is_workspace = reduce;
    f.a = static_cast<const uint8_t *>(a->data), f.b = static_cast<const uint8_t *>(b->data);
    f.a_scales = a->scales, f.b_scales = b->scales;
    f.a_dtype = a->dtype, f.b_dtype = b->dtype;
    f.ue8m0 = fp->scale_format == MOE_FP8_SCALE_UE8M0;
    f.w_kn = dx && fp->w_transposed;
    f.tiles_n = (N + F8_TILE - 1) / F8_TILE, f.tiles_k = (K + F8_TILE - 1) / F8_TILE;
    const int64_t a_len = dx ? N : K;
    f.a_vec = aligned16(a->data) && a_len % 16 == 0;
    f.b_vec = aligned16(b->data) && (f.w_kn ? N : K) % 16 == 0; // W's rows: K codes, W^T's N
    const int64_t bitmap_words = M / 32 + 1;
    const int64_t a_rows = dx ? M : (p->permute_x ? p->num_tokens : M);

    unsigned char *ws = nullptr;
    float *slots = nullptr;
    MOE_CUDA_CHECK(alloc_call_workspace(E, M, reduce ? M * K : 0, stream, &ws, &g.ws, &slots));
    if (reduce)
        g.out = slots;
    else
        g.out = out;
    moe_status status = MOE_OK;
    do {
        // the Hopper kernel where it takes the call, else the portable one; MOE_CUDA_KERNEL=sm80 or simt forces the
        // portable kernel, =sm90 makes refused tensor maps an error (as for the other dtypes).  Planned first: the
        // routing check counts the tiles of the kernel that runs (the Hopper kernel's wide tiles have 256 columns).
        // An output without columns has no tiles and runs no kernel: nothing to plan.
        const bool portable = forced == KERNEL_SM80 || forced == KERNEL_SIMT;
        Fp8Sm90Maps maps;
        const Fp8Sm90Plan plan = portable || g.cols_j == 0 ? FP8_SM90_NOT_ITS_SHAPE : fp8_sm90_plan(&f, &maps);
        if (plan == FP8_SM90_MAPS_REFUSED && forced == KERNEL_SM90) {
            status = moe_fail(MOE_ERR_DEVICE, "%s: MOE_CUDA_KERNEL=sm90 but the TMA descriptors were refused", p->op);
            break;
        }
        const int tile_cols = plan == FP8_SM90_TAKES && f.sm90_wide ? 2 * F8_BN : F8_BN;
        const int64_t col_tiles = (g.cols_j + tile_cols - 1) / tile_cols;
        launch_routing_check(p, message_op, col_tiles, F8_BM, false, bitmap_words, g.ws, stream);
        const int64_t a_tiles = dx ? f.tiles_n : f.tiles_k;
        cudaError_t err = launch_fp8_scale_check(a->scales, a_rows * a_tiles, a_tiles, 0, f.ue8m0, 0, message_op,
                                                 g.ws, stream);
        if (err == cudaSuccess)
            err = launch_fp8_scale_check(b->scales, E * f.tiles_n * f.tiles_k, f.w_kn ? f.tiles_n : f.tiles_k, 0,
                                         f.ue8m0, 1, message_op, g.ws, stream);
        if (err != cudaSuccess) {
            status = moe_fail(MOE_ERR_DEVICE, "%s: check launch failed: %s", p->op, cudaGetErrorString(err));
            break;
        }
        const int64_t max_tiles = max_tiles_of(op, E, M, N, F8_BM, col_tiles);
        if (max_tiles > 0) {
            if (plan == FP8_SM90_TAKES) {
                status = launch_fp8_sm90(f, maps, max_tiles, stream);
                if (status != MOE_OK)
                    break;
            } else {
                fp8_gemm_kernel<<<persistent_grid(max_tiles, 1), F8_THREADS, 0, stream>>>(f);
            }
        }
        if (reduce)
            launch_reduce_topk(slots, p->num_tokens, p->topk, K, out, p->dtype, p->accumulate, g.ws.status, stream);
        err = cudaGetLastError();
        if (err != cudaSuccess)
            status = moe_fail(MOE_ERR_DEVICE, "%s: kernel launch failed: %s", p->op, cudaGetErrorString(err));
    } while (0);
    return free_call_workspace(p->op, ws, stream, status);
}

} // namespace
} // namespace moe_gpu

using namespace moe_gpu;

moe_status moe_cuda_gemm_fp8_fwd(const moe_fp8_problem *p, const moe_fp8_tensor *x, const moe_fp8_tensor *w,
                                 const float *topk_weights, void *y)
{
    return run_fp8(p, OP_FWD, x, w, topk_weights, y);
}

moe_status moe_cuda_gemm_fp8_dx(const moe_fp8_problem *p, const moe_fp8_tensor *dy, const moe_fp8_tensor *w,
                                const float *topk_weights, void *dx)
{
    return run_fp8(p, OP_DX, dy, w, topk_weights, dx);
}

moe_status moe_cuda_fp8_take_error(void)
{
    DeviceErrorRecord record;
    const moe_status taken = take_device_error(g_fp8_scale_error, &record);
    if (taken != MOE_OK || record.kind == FP8_SCALE_OK)
        return taken;
    static const char *const names[3][3] = {// op, operand 0, operand 1
                                            {"moe_gemm_fp8_fwd", "x.scales", "w.scales"},
                                            {"moe_gemm_fp8_dx", "dy.scales", "w.scales"},
                                            {"moe_gemm_fp8_dw", "x.scales", "dy.scales"}};
    const int which = record.op == ROUTING_OP_FP8_DW ? 2 : record.op == ROUTING_OP_FP8_DX ? 1 : 0;
    const long long i = record.detail[FP8_INDEX], per_row = record.detail[FP8_PER_ROW];
    return moe_fail(MOE_ERR_INVALID_VALUE, "%s %s: %s[%lld][%lld] (bits 0x%llx) is not a valid scale (float32: finite "
                    "and > 0; UE8M0: not 255)", names[which][0], DEVICE_ERROR_WHERE,
                    names[which][record.detail[FP8_OPERAND] == 1 ? 2 : 1], i / per_row, i % per_row,
                    record.detail[FP8_BITS]);
}
