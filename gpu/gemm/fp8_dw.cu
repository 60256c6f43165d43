// FP8 dW on CUDA (moe_gemm_fp8_dw; the exact math is specs/FP8.md, "dW"), the portable kernel for every GPU from
// sm_80: dw[e][n][c] = the promoted sum over expert e's 128-row tiles t, in ascending order, of
//   part_t(n, c) * (sdy[s_t][n] * sx[s_t][c]),   s_t = offsets[e] / 128 + e + t (gpu/fp8/column_tiles.cuh),
// part_t the tile's fp32 tensor-core sum of dY[r][n] * X[r][c] over its rows r.  At the end of each tile,
// acc += part * (s_dy(n) * s_x(c)) with the reference's two roundings (its promoted_dot: the scale product, then
// the multiply and the add, never fused).  Only the order of a tile's (exact) products differs from the
// reference, which the oracle's bound allows.
//
// 128 x 128 output tiles (n, c) of each expert, 256 threads (8 warps of 64 x 32), persistent CTAs.  The operands
// are reduction-major (rows are tokens): each 32-row step of both is read 16 codes of a row per thread, decoded
// exactly to bf16 and stored as it lies ([q][n] and [q][c], rows of 16 bytes swizzled between the lanes of a
// quarter warp so that the stores are free of bank conflicts), and the MMA fragments are read transposed by
// ldmatrix.trans.  Two shared stages, and the codes of the next step (of this output tile or the CTA's next one)
// are loaded into registers before the MMAs of the current one: one barrier per step.  bench/RESULTS.md, "The
// portable FP8 dW kernel rebuilt", has the speeds before and after.
//
// The expert offsets come from the routing check on the device (no host sync); the scales of the tiles in use
// are checked there too, before the kernel: a bad one is reported by moe_backend_synchronize and nothing is
// written.  An expert without rows gets +0 (old + 0 with accumulate), as in the reference; the output goes
// through the GEMM's epilogue (gemm/epilogue.cuh: accumulate, one rounding to f32 or bf16).
#include "common/cuda_check.cuh"
#include "common/launch.cuh"
#include "fp8/column_tiles.cuh"
#include "gemm/epilogue.cuh"
#include "gemm/fp8.cuh"
#include "gemm/gemm.cuh"
#include "gemm/heuristics.cuh"
#include "gemm/mma_sm80.cuh"
#include "gemm/plan.cuh"

namespace moe_gpu {
namespace {

static_assert(F8_THREADS == F8_BM + F8_BN, "one thread per scale of the output tile's n and c at the promotion");
static_assert(F8_THREADS == F8_BK * 8, "one thread per 16 codes of each operand's step (32 rows x 128 columns)");
static_assert(F8_TILE % F8_BK == 0, "a reduction step never straddles two 128-row tiles");

constexpr int DW_LDS = F8_BM + 8; // shared row stride in bf16: 272 bytes, 8 rows of ldmatrix in distinct banks

struct DwShared {
    uint16_t decode_a[256], decode_b[256];
    __align__(16) uint16_t a[2][F8_BK][DW_LDS]; // dY(q, n) of the step, per stage
    __align__(16) uint16_t b[2][F8_BK][DW_LDS]; // X(q, c) of the step, per stage
    float a_scale[2][F8_BM], b_scale[2][F8_BN]; // the 128-row tile's scales of the output tile's n and c, by parity
};

// The CTA's walk over its reduction steps: output tile `tile` (every gridDim.x-th), its expert's rows
// [first, end) in steps of F8_BK from q0.  Output tiles of experts without rows have no step; enter() (from next()
// too) stores their +0 as it passes them.
struct DwCursor {
    int64_t tile, tiles, first, end, q0, scale_row0;
    TileCoord t;
    bool valid;

    __device__ void enter(const GemmArgs &g)
    {
        for (; tile < tiles; tile += gridDim.x) {
            t = tile_coord(g, tile, F8_BM, F8_BN); // i0: n, j0: c
            first = g.ws.offsets[t.e], end = g.ws.offsets[t.e + 1];
            scale_row0 = column_first_scale_row(g.ws.offsets, t.e);
            q0 = first;
            if (first < end) {
                valid = true;
                return;
            }
            const float zero[4][4][4] = {};
            fp8_store(g, t, zero, threadIdx.x / 32 % 2 * 64, threadIdx.x / 32 / 2 * 32);
        }
        valid = false;
    }
    __device__ void next(const GemmArgs &g)
    {
        q0 += F8_BK;
        if (q0 < end)
            return;
        tile += gridDim.x;
        enter(g);
    }
    __device__ bool last_of_tile() const { return q0 + F8_BK >= end || (q0 - first) % F8_TILE == F8_TILE - F8_BK; }
    __device__ bool last_of_output() const { return q0 + F8_BK >= end; }
};

// 16 codes of one operand's row `row` (of `len` codes) from column col: code 0 (+0) at or past the expert's end
// row `end` or past the row's end; 16 at a time where vec allows it.
__device__ __forceinline__ uint4 load_codes(const uint8_t *base, int64_t row, int64_t end, int64_t col, int64_t len,
                                           bool vec)
{
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row >= end)
        return v;
    const uint8_t *p = base + row * len;
    if (vec && col + 16 <= len)
        return *reinterpret_cast<const uint4 *>(p + col);
    uint32_t w[4] = {0, 0, 0, 0};
    for (int u = 0; u < 16; u++)
        if (col + u < len)
            w[u / 4] |= (uint32_t)p[col + u] << (8 * (u % 4));
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// The 16 codes decoded to bf16 into row `row` of a stage at column c16: two 16-byte stores, the lanes of a quarter
// warp (one row, columns 0 .. 127) taking their halves in an order that puts the eight stores in distinct banks.
__device__ __forceinline__ void store_decoded(uint4 codes, const uint16_t *decode, uint16_t *row, int c16)
{
    const uint32_t w[4] = {codes.x, codes.y, codes.z, codes.w};
    uint32_t h[8];
#pragma unroll
    for (int u = 0; u < 8; u++) {
        const uint32_t lo = decode[(w[u / 2] >> (16 * (u % 2))) & 0xffu];
        const uint32_t hi = decode[(w[u / 2] >> (16 * (u % 2) + 8)) & 0xffu];
        h[u] = lo | hi << 16;
    }
    const int first = threadIdx.x >> 2 & 1;
    uint4 *dst = reinterpret_cast<uint4 *>(row + c16);
    dst[first] = first ? make_uint4(h[4], h[5], h[6], h[7]) : make_uint4(h[0], h[1], h[2], h[3]);
    dst[first ^ 1] = first ? make_uint4(h[0], h[1], h[2], h[3]) : make_uint4(h[4], h[5], h[6], h[7]);
}

// The warp's MMAs of one step (fp8_mma_step's fragments and accumulator layout, the operands stored [q][n] and
// [q][c]): A(n, q) and B(q, c) through ldmatrix.trans.
__device__ __forceinline__ void dw_mma_step(const uint16_t (*sa)[DW_LDS], const uint16_t (*sb)[DW_LDS], int wm, int wn,
                                            float (&part)[4][4][4])
{
    const int lane = threadIdx.x % 32, i = lane % 8, mat = lane / 8;
#pragma unroll
    for (int k16 = 0; k16 < F8_BK; k16 += 16) {
        uint32_t af[4][4], bf[4][2];
#pragma unroll
        for (int mt = 0; mt < 4; mt++) // matrices: (n 0-7, q 0-7), (n 8-15, q 0-7), (n 0-7, q 8-15), (n 8-15, q 8-15)
            ldmatrix_x4<true>(af[mt], (uint32_t)__cvta_generic_to_shared(
                                          &sa[k16 + i + 8 * (mat / 2)][wm + 16 * mt + 8 * (mat % 2)]));
#pragma unroll
        for (int np = 0; np < 2; np++) { // matrices: (q 0-7, c 0-7), (q 8-15, c 0-7), (q 0-7, c 8-15), (q 8-15, c 8-15)
            uint32_t r[4];
            ldmatrix_x4<true>(r, (uint32_t)__cvta_generic_to_shared(
                                     &sb[k16 + i + 8 * (mat % 2)][wn + 16 * np + 8 * (mat / 2)]));
            bf[2 * np][0] = r[0], bf[2 * np][1] = r[1], bf[2 * np + 1][0] = r[2], bf[2 * np + 1][1] = r[3];
        }
#pragma unroll
        for (int mt = 0; mt < 4; mt++)
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
                mma_m16n8k16<__nv_bfloat16>(part[mt][nt], af[mt], bf[nt]);
    }
}

__global__ void __launch_bounds__(F8_THREADS) fp8_dw_kernel(Fp8Args f)
{
    __shared__ DwShared s;
    const GemmArgs &g = f.g;
    if (*g.ws.status != 0)
        return;
    for (int i = threadIdx.x; i < 256; i += F8_THREADS) {
        s.decode_a[i] = fp8_to_bf16_bits(f.a_dtype, (unsigned)i);
        s.decode_b[i] = fp8_to_bf16_bits(f.b_dtype, (unsigned)i);
    }
    __syncthreads(); // the decode tables, read by every thread's first stores
    const int warp = threadIdx.x / 32;
    const int wm = warp % 2 * 64, wn = warp / 2 * 32;
    const int q = threadIdx.x / 8, c16 = threadIdx.x % 8 * 16;
    DwCursor cur;
    cur.tile = blockIdx.x, cur.tiles = total_tiles(g, F8_BM, F8_BN);
    cur.enter(g);
    if (!cur.valid)
        return;
    uint4 code_a = load_codes(f.a, cur.q0 + q, cur.end, cur.t.i0 + c16, g.N, f.a_vec);
    uint4 code_b = load_codes(f.b, cur.q0 + q, cur.end, cur.t.j0 + c16, g.K, f.b_vec);
    float acc[4][4][4] = {}, part[4][4][4] = {};
    for (int stage = 0, parity = 0;; stage ^= 1) {
        store_decoded(code_a, s.decode_a, s.a[stage][q], c16);
        store_decoded(code_b, s.decode_b, s.b[stage][q], c16);
        const bool promote = cur.last_of_tile(), output = cur.last_of_output();
        if (promote) { // the scales of this 128-row tile, beside those the previous promotion may still read
            const int64_t s_row = cur.scale_row0 + (cur.q0 - cur.first) / F8_TILE;
            if (threadIdx.x < F8_BM) {
                const int64_t n = cur.t.i0 + threadIdx.x;
                s.a_scale[parity][threadIdx.x] = n < g.N ? fp8_scale(f, f.a_scales, s_row * g.N + n) : 0.0f;
            } else {
                const int64_t c = cur.t.j0 + threadIdx.x - F8_BM;
                s.b_scale[parity][threadIdx.x - F8_BM] = c < g.K ? fp8_scale(f, f.b_scales, s_row * g.K + c) : 0.0f;
            }
        }
        __syncthreads(); // the stage and the scales written; the other stage's MMAs (the step before) done
        const TileCoord t = cur.t;
        cur.next(g);
        if (cur.valid) {
            code_a = load_codes(f.a, cur.q0 + q, cur.end, cur.t.i0 + c16, g.N, f.a_vec);
            code_b = load_codes(f.b, cur.q0 + q, cur.end, cur.t.j0 + c16, g.K, f.b_vec);
        }
        dw_mma_step(s.a[stage], s.b[stage], wm, wn, part);
        if (promote) {
            fp8_promote(acc, part, s.a_scale[parity], s.b_scale[parity], 1, wm, wn);
            parity ^= 1;
        }
        if (output) {
            fp8_store(g, t, acc, wm, wn);
            for (auto &x : acc)
                for (auto &y : x)
                    for (float &z : y)
                        z = 0.0f;
        }
        if (!cur.valid)
            break;
    }
}

// The transposed codes back into the portable kernel's layout: src [cols][M] -> dst [M][cols], 32 x 32 codes a block
// through shared memory (coalesced reads along M, writes along cols).
__global__ void untranspose_codes_kernel(const uint8_t *src, int64_t cols, int64_t M, uint8_t *dst, const int *status)
{
    __shared__ uint8_t tile[32][33];
    if (*status != 0)
        return;
    for (int64_t r0 = (int64_t)blockIdx.x * 32; r0 < M; r0 += (int64_t)gridDim.x * 32)
        for (int64_t c0 = (int64_t)blockIdx.y * 32; c0 < cols; c0 += (int64_t)gridDim.y * 32) {
            for (int i = threadIdx.y; i < 32; i += blockDim.y)
                if (c0 + i < cols && r0 + threadIdx.x < M)
                    tile[i][threadIdx.x] = src[(c0 + i) * M + r0 + threadIdx.x];
            __syncthreads();
            for (int i = threadIdx.y; i < 32; i += blockDim.y)
                if (r0 + i < M && c0 + threadIdx.x < cols)
                    dst[(r0 + i) * cols + c0 + threadIdx.x] = tile[threadIdx.x][i];
            __syncthreads();
        }
}

cudaError_t launch_untranspose_codes(const void *src, int64_t cols, int64_t M, uint8_t *dst, const int *status,
                                     cudaStream_t stream)
{
    const dim3 grid(grid_for(M, 32, 4096), grid_for(cols, 32, 64));
    untranspose_codes_kernel<<<grid, dim3(32, 8), 0, stream>>>(static_cast<const uint8_t *>(src), cols, M, dst, status);
    return cudaGetLastError();
}

} // namespace
} // namespace moe_gpu

using namespace moe_gpu;

// The call on the stream: workspace, the routing check (the expert offsets), the scale checks of the tiles in use,
// the kernel.  Transposed codes (options.codes_transposed) go to the Hopper kernel (gemm/fp8_dw_sm90.cu) where it
// is switched on (fp8_dw_sm90_enabled) and fp8_dw_sm90_plan takes them, else back into expert-row order in the
// workspace for the portable kernel.
moe_status moe_cuda_gemm_fp8_dw(const moe_fp8_problem *fp, const moe_fp8_tensor *x, const moe_fp8_tensor *dy,
                                void *dw)
{
    const moe_gemm_problem *p = &fp->g;
    cudaStream_t stream = static_cast<cudaStream_t>(p->stream);
    const int64_t E = p->num_experts, M = p->rows, N = p->N, K = p->K;
    Fp8Args f = {};
    GemmArgs &g = f.g;
    g.op = OP_DW;
    g.dtype = MOE_F32; // no topk weights: the quantizer applied them
    g.out_dtype = p->dtype;
    g.T = p->num_tokens, g.k = p->topk, g.E = E, g.M = M, g.N = N, g.K = K;
    g.rows_i = N, g.cols_j = K;
    g.accumulate = p->accumulate;
    g.out = dw;
    f.a = static_cast<const uint8_t *>(dy->data), f.b = static_cast<const uint8_t *>(x->data);
    f.a_scales = dy->scales, f.b_scales = x->scales;
    f.a_dtype = dy->dtype, f.b_dtype = x->dtype;
    f.ue8m0 = fp->scale_format == MOE_FP8_SCALE_UE8M0;
    f.tiles_n = cdiv(N, F8_TILE), f.tiles_k = cdiv(K, F8_TILE);
    f.a_vec = aligned16(dy->data) && N % 16 == 0;
    f.b_vec = aligned16(x->data) && K % 16 == 0;
    const int64_t col_tiles = cdiv(K, F8_BN), scale_rows = cdiv(M, F8_TILE) + E - 1;

    // transposed codes: the Hopper kernel where it takes the call, else the portable kernel on the codes transposed
    // back into the workspace ([M][K] for X, then [M][N] for dY, 16-byte aligned)
    Fp8Sm90Maps maps;
    const bool hopper = fp->codes_transposed && fp8_dw_sm90_enabled() && fp8_dw_sm90_plan(f, &maps);
    const bool untranspose = fp->codes_transposed && !hopper;
    const int64_t x_bytes = (M * K + 15) / 16 * 16, untransposed_floats = untranspose ? (x_bytes + M * N + 3) / 4 : 0;
    unsigned char *ws = nullptr;
    float *untransposed = nullptr;
    MOE_CUDA_CHECK(alloc_call_workspace(E, M, untransposed_floats, stream, &ws, &g.ws, &untransposed));
    moe_status status = MOE_OK;
    launch_routing_check(p, ROUTING_OP_FP8_DW, col_tiles, F8_BM, false, M / 32 + 1, g.ws, stream);
    cudaError_t err = launch_fp8_scale_check(x->scales, scale_rows * K, K, E, f.ue8m0, 0, ROUTING_OP_FP8_DW, g.ws,
                                             stream);
    if (err == cudaSuccess)
        err = launch_fp8_scale_check(dy->scales, scale_rows * N, N, E, f.ue8m0, 1, ROUTING_OP_FP8_DW, g.ws, stream);
    if (err == cudaSuccess && untranspose && M > 0) {
        uint8_t *x_rows = reinterpret_cast<uint8_t *>(untransposed), *dy_rows = x_rows + x_bytes;
        err = launch_untranspose_codes(x->data, K, M, x_rows, g.ws.status, stream);
        if (err == cudaSuccess)
            err = launch_untranspose_codes(dy->data, N, M, dy_rows, g.ws.status, stream);
        f.a = dy_rows, f.b = x_rows;
        f.a_vec = N % 16 == 0, f.b_vec = K % 16 == 0; // the workspace is 256-byte aligned, X's part padded to 16
    }
    const int64_t max_tiles = max_tiles_of(OP_DW, E, M, N, F8_BM, col_tiles);
    if (err == cudaSuccess && max_tiles > 0) {
        if (hopper) {
            status = launch_fp8_dw_sm90(f, maps, max_tiles, stream);
        } else {
            fp8_dw_kernel<<<persistent_grid(max_tiles, 1), F8_THREADS, 0, stream>>>(f);
            err = cudaGetLastError();
        }
    }
    if (err != cudaSuccess)
        status = moe_fail(MOE_ERR_DEVICE, "%s: kernel launch failed: %s", p->op, cudaGetErrorString(err));
    return free_call_workspace(p->op, ws, stream, status);
}
