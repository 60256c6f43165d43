// Hopper (sm_90a) tensor-core path of gpu/gemm_cuda.cu: wgmma with operands in 128-byte-swizzled
// shared memory, filled by a 4-stage cp.async pipeline (cp.async rather than TMA because rows are
// gathered: permute_x, permute_y and per-expert row ranges).  Included by gemm_cuda.cu only.
//
// CTA tile 128 x 128, BK = 64, two consumer warpgroups; warpgroup w computes rows 64w .. 64w+63 with
// wgmma.m64n128k16 (fp32 accumulators in 64 registers per thread).  3 stages and at most 128
// registers per thread let two CTAs share an SM, so one's epilogue overlaps the other's main loop.
//
// Shared-memory layouts (16-byte chunk c of 128-byte row r inside a 1024-byte atom sits at chunk c ^ r):
//   K-major tile  [MN 128][K 64]:  atom = 8 MN-rows x 64 K-elements; atoms stacked along MN.
//                 descriptor: SBO = 1024 (next 8 MN-rows), LBO unused; k16 step = +32 bytes.
//   MN-major tile [K 64][MN 128]:  atom = 8 K-rows x 64 MN-elements; layout [k group 8][MN atom 2][atom].
//                 descriptor: LBO = 1024 (next 64 MN-elements), SBO = 2048 (next 8 K-rows);
//                 k16 step = +4096 bytes (two k groups).
// fwd: A K-major (X rows), B K-major (W[e] rows n)      -> trans-a 0, trans-b 0
// dX:  A K-major (dY rows), B MN-major (W[e][n][c])     -> trans-a 0, trans-b 1
// dW:  A MN-major (dY rows, i = n), B MN-major (X rows) -> trans-a 1, trans-b 1
#ifndef LIBMOE_GEMM_SM90_CUH
#define LIBMOE_GEMM_SM90_CUH

constexpr int H_BM = 128, H_BN = 128, H_BK = 64, H_STAGES = 3, H_THREADS = 256;
constexpr int H_TILE_BYTES = H_BM * H_BK * 2;            // 16 KiB per operand tile
constexpr int H_STAGE_BYTES = 2 * H_TILE_BYTES;          // A then B
constexpr int H_LDC = H_BN + 4; // fp32 C tile staged over the pipeline buffers for the epilogue
static_assert((size_t)H_BM * H_LDC * 4 <= (size_t)H_STAGES * H_STAGE_BYTES, "C tile fits the stages");
constexpr size_t H_SMEM_BYTES = (size_t)H_STAGES * H_STAGE_BYTES + 1024 /* alignment */ + H_BM * 12 /* rows */;

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MOE_SM90A_DEVICE 1
#endif

// Byte offset of 16-byte chunk `chunk` (0..7) of row `row` (0..7) inside a 1024-byte swizzle atom.
__device__ __forceinline__ uint32_t swizzled(int row, int chunk) { return (uint32_t)(row * 128 + ((chunk ^ row) * 16)); }

// Offset of (mn, k-chunk) in a K-major tile: mn 0..127, k chunk 0..7 (8 elements each).
__device__ __forceinline__ uint32_t kmajor_offset(int mn, int kchunk) { return (uint32_t)((mn >> 3) * 1024) + swizzled(mn & 7, kchunk); }

// Offset of (k, mn-chunk) in an MN-major tile: k 0..63, mn chunk 0..15.
__device__ __forceinline__ uint32_t mnmajor_offset(int k, int mnchunk)
{
    return (uint32_t)((k >> 3) * 2048 + (mnchunk >> 3) * 1024) + swizzled(k & 7, mnchunk & 7);
}

__device__ __forceinline__ uint64_t smem_descriptor(uint32_t smem_addr, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)((smem_addr & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32) |
           (1ull << 62); // 128-byte swizzle
}

#ifdef MOE_SM90A_DEVICE
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// d += A(desc_a) * B(desc_b) for one 64 x 128 x 16 step; scale_d = 0 starts from zero.
template <typename T, int TRANS_A, int TRANS_B>
__device__ __forceinline__ void wgmma_m64n128k16(float *d, uint64_t desc_a, uint64_t desc_b, int scale_d)
{
    if (std::is_same<T, __nv_bfloat16>::value) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, %67, %68;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                     : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_A), "n"(TRANS_B));
    } else {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, %67, %68;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                     : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_A), "n"(TRANS_B));
    }
}
#endif

// Issues the cp.async copies of one pipeline stage (reduction elements q0 .. q0+63).
template <typename T, int OP>
__device__ __forceinline__ void h_load_stage(const GemmArgs &g, const TileCoord &t, int64_t q0, int64_t qlen,
                                             unsigned char *stage, const int64_t *a_rows)
{
    const T *A = static_cast<const T *>(g.a);
    const T *B = static_cast<const T *>(g.b);
    unsigned char *sa = stage, *sb = stage + H_TILE_BYTES;
    const int64_t base = g.ws.offsets[t.e];
    // 1024 chunks of 16 bytes per operand tile: 4 per thread
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const int c = threadIdx.x + u * H_THREADS;
        if (OP != OP_DW) { // A K-major: row i (a_rows), k chunk
            const int i = c >> 3, kc = c & 7;
            const bool ok = a_rows[i] >= 0 && q0 + kc * 8 < qlen;
            const int64_t lda = OP == OP_DX ? g.N : g.K;
            cp_async16(sa + kmajor_offset(i, kc), ok ? A + a_rows[i] * lda + q0 + kc * 8 : A, ok);
        } else { // A MN-major: k = expert row q, mn chunk over n
            const int k = c >> 4, mc = c & 15;
            const bool ok = q0 + k < qlen && t.i0 + mc * 8 < g.N;
            cp_async16(sa + mnmajor_offset(k, mc), ok ? A + y_row(g, base + q0 + k) * g.N + t.i0 + mc * 8 : A, ok);
        }
        if (OP == OP_FWD) { // B K-major: row j = n of W[e]
            const int j = c >> 3, kc = c & 7;
            const bool ok = t.j0 + j < g.cols_j && q0 + kc * 8 < qlen;
            cp_async16(sb + kmajor_offset(j, kc), ok ? B + (t.e * g.N + t.j0 + j) * g.K + q0 + kc * 8 : B, ok);
        } else if (OP == OP_DX) { // B MN-major: k = n, mn chunk over c of W[e][n][c]
            const int k = c >> 4, mc = c & 15;
            const bool ok = q0 + k < qlen && t.j0 + mc * 8 < g.cols_j;
            cp_async16(sb + mnmajor_offset(k, mc), ok ? B + (t.e * g.N + q0 + k) * g.K + t.j0 + mc * 8 : B, ok);
        } else { // dW, B MN-major: k = expert row, mn chunk over c of X
            const int k = c >> 4, mc = c & 15;
            const bool ok = q0 + k < qlen && t.j0 + mc * 8 < g.cols_j;
            cp_async16(sb + mnmajor_offset(k, mc), ok ? B + x_row(g, base + q0 + k) * g.K + t.j0 + mc * 8 : B, ok);
        }
    }
}

template <typename T, int OP>
__global__ void __launch_bounds__(H_THREADS, 2) sm90_gemm_kernel(GemmArgs g)
{
#ifdef MOE_SM90A_DEVICE
    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem = reinterpret_cast<unsigned char *>(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    int64_t *a_rows = reinterpret_cast<int64_t *>(smem + (size_t)H_STAGES * H_STAGE_BYTES);
    float *row_weight = reinterpret_cast<float *>(a_rows + H_BM);
    float *tile_c = reinterpret_cast<float *>(smem);
    if (*g.ws.status != 0)
        return;
    constexpr int TRANS_A = OP == OP_DW ? 1 : 0;
    constexpr int TRANS_B = OP == OP_FWD ? 0 : 1;
    const int wg = threadIdx.x / 128, lane_in_wg = threadIdx.x % 128;
    const int warp_in_wg = lane_in_wg / 32, lane = lane_in_wg % 32;
    const uint32_t smem_base = (uint32_t)__cvta_generic_to_shared(smem);

    const int64_t tiles = total_tiles(g, H_BM, H_BN);
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const TileCoord t = tile_coord(g, tile, H_BM, H_BN);
        const int64_t qlen = reduction_length(g, t.e);
        if (OP != OP_DW) {
            for (int i = threadIdx.x; i < H_BM; i += H_THREADS) {
                const int64_t r = g.ws.offsets[t.e] + t.i0 + i;
                a_rows[i] = t.i0 + i < t.rows ? (OP == OP_DX ? y_row(g, r) : x_row(g, r)) : -1;
            }
        }
        __syncthreads();

        float d[64];
#pragma unroll
        for (int i = 0; i < 64; i++)
            d[i] = 0.0f;
        const int64_t steps = (qlen + H_BK - 1) / H_BK;
#pragma unroll
        for (int s = 0; s < H_STAGES - 1; s++) {
            if (s < steps)
                h_load_stage<T, OP>(g, t, s * H_BK, qlen, smem + s * H_STAGE_BYTES, a_rows);
            cp_async_commit();
        }
        for (int64_t step = 0; step < steps; step++) {
            cp_async_wait<H_STAGES - 2>();
            fence_proxy_async();       // cp.async wrote through the generic proxy; wgmma reads via the async one
            __syncthreads();           // every thread's copies of stage `step` landed
            const int s = (int)(step % H_STAGES);
            const uint32_t a_addr = smem_base + s * H_STAGE_BYTES;
            const uint32_t b_addr = a_addr + H_TILE_BYTES;
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < H_BK / 16; kk++) {
                uint64_t da, db;
                if (TRANS_A == 0)
                    da = smem_descriptor(a_addr + wg * 8 * 1024 + kk * 32, 16, 1024);
                else
                    da = smem_descriptor(a_addr + wg * 1024 + kk * 4096, 1024, 2048);
                if (TRANS_B == 0)
                    db = smem_descriptor(b_addr + kk * 32, 16, 1024);
                else
                    db = smem_descriptor(b_addr + kk * 4096, 1024, 2048);
                wgmma_m64n128k16<T, TRANS_A, TRANS_B>(d, da, db, 1);
            }
            wgmma_commit();
            wgmma_wait<1>();           // this warpgroup's step-1 group is done; step's stays in flight
            __syncthreads();           // ... and so is every warpgroup's: stage (step-1) may be refilled
            const int64_t next = step + H_STAGES - 1; // refills the stage consumed at step - 1
            if (next < steps)
                h_load_stage<T, OP>(g, t, next * H_BK, qlen, smem + (int)(next % H_STAGES) * H_STAGE_BYTES, a_rows);
            cp_async_commit();
        }
        wgmma_wait<0>();
        cp_async_wait<0>();

        __syncthreads(); // every warpgroup is done with the stages: they now hold the fp32 C tile
        // accumulator fragment: d[4j + {0,1,2,3}] = (row r0, col 8j + c0 + {0,1}), (row r0 + 8, same cols)
        const int r0 = wg * 64 + warp_in_wg * 16 + lane / 4, c0 = (lane % 4) * 2;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            *reinterpret_cast<float2 *>(tile_c + r0 * H_LDC + 8 * j + c0) = make_float2(d[4 * j + 0], d[4 * j + 1]);
            *reinterpret_cast<float2 *>(tile_c + (r0 + 8) * H_LDC + 8 * j + c0) = make_float2(d[4 * j + 2], d[4 * j + 3]);
        }
        __syncthreads();
        epilogue_vectorised<H_BM, H_BN, H_LDC>(g, t, tile_c, a_rows, row_weight);
        __syncthreads(); // a_rows and the stages are reused by the next tile
    }
#else
    (void)g; // compiled for another target: never launched (see sm90_path_available)
#endif
}

#endif
