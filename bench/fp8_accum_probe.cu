// What Hopper's FP8 wgmma does to a sum: one wgmma.m64n8k32.f32.e4m3.e4m3 on exactly representable inputs,
// compared with the exact sum, to find how many bits its adder keeps, whether it truncates or rounds, and
// whether the accumulator input C goes through the same adder (specs/FP8.md, "The accumulator of Hopper's FP8
// wgmma").  A standalone program (it needs no libmoe):
//   nvcc -gencode=arch=compute_90a,code=sm_90a -o fp8-accum-probe bench/fp8_accum_probe.cu && ./fp8-accum-probe
// Each test puts 32 products in row 0 of A and column 0 of B (every other element zero) and an accumulator
// input c in D's (0, 0); it prints the exact value (float64), the wgmma's, and their difference in units of
// 2^-j.  The inputs and c are exact in e4m3 / float32, so every difference is the hardware's.
#include <cuda.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                                            \
    do {                                                                                                       \
        cudaError_t err_ = (call);                                                                             \
        if (err_ != cudaSuccess) {                                                                             \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_));            \
            exit(1);                                                                                           \
        }                                                                                                      \
    } while (0)

// A: 64 rows x 32 k codes; B: 8 columns x 32 k codes (K-major both); C, D: 64 x 8 floats, row-major.
__global__ void __launch_bounds__(128) probe_kernel(const uint8_t *a, const uint8_t *b, const float *c, float *d,
                                                    int *misaligned)
{
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    // 128-byte swizzled K-major tiles, as TMA's SWIZZLE_128B writes them: (row, 16-byte chunk q) at
    // row * 128 + ((q ^ (row & 7)) * 16); only the first 32 bytes of each row (k < 32) are used.
    __shared__ __align__(1024) uint8_t sa[64 * 128];
    __shared__ __align__(1024) uint8_t sb[8 * 128];
    const int t = threadIdx.x;
    for (int i = t; i < 64 * 128; i += 128)
        sa[i] = 0;
    for (int i = t; i < 8 * 128; i += 128)
        sb[i] = 0;
    __syncthreads();
    for (int i = t; i < 64 * 32; i += 128) {
        const int row = i / 32, k = i % 32;
        sa[row * 128 + (((k / 16) ^ (row & 7)) * 16) + k % 16] = a[i];
    }
    for (int i = t; i < 8 * 32; i += 128) {
        const int row = i / 32, k = i % 32;
        sb[row * 128 + (((k / 16) ^ (row & 7)) * 16) + k % 16] = b[i];
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const uint32_t a_addr = (uint32_t)__cvta_generic_to_shared(sa), b_addr = (uint32_t)__cvta_generic_to_shared(sb);
    if (t == 0 && ((a_addr | b_addr) & 1023) != 0)
        *misaligned = 1;
    // Descriptors: start >> 4, LBO 16 (unused with swizzle), SBO 1024 (next 8 rows), 128-byte swizzle.
    const uint64_t da = (uint64_t)((a_addr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)64 << 32) | (1ull << 62);
    const uint64_t db = (uint64_t)((b_addr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)64 << 32) | (1ull << 62);
    // The accumulator fragment of m64n8: warp w, lane l: rows 16 w + l / 4 (+8), columns 2 (l % 4) (+1).
    const int warp = t / 32, lane = t % 32, r = 16 * warp + lane / 4, col = 2 * (lane % 4);
    float acc[4] = {c[r * 8 + col], c[r * 8 + col + 1], c[(r + 8) * 8 + col], c[(r + 8) * 8 + col + 1]};
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, %4, %5, p, 1, 1;\n}\n"
                 : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
                 : "l"(da), "l"(db));
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    d[r * 8 + col] = acc[0];
    d[r * 8 + col + 1] = acc[1];
    d[(r + 8) * 8 + col] = acc[2];
    d[(r + 8) * 8 + col + 1] = acc[3];
#else
    if (threadIdx.x == 0)
        *misaligned = 2; // not built for sm_90a
#endif
}

static uint8_t *g_a, *g_b;
static float *g_c, *g_d;
static int *g_flag;

// An e4m3 code of v, which must be exact in e4m3.
static uint8_t code(double v)
{
    const __nv_fp8_e4m3 q((float)v);
    if ((double)(float)q != v) {
        fprintf(stderr, "%g is not an e4m3 value\n", v);
        exit(1);
    }
    return q.__x;
}

// The wgmma's D(0, 0) for c + sum_i a[i] * b[i] (n <= 32 products).
static double wgmma_sum(int n, const double *av, const double *bv, float c)
{
    uint8_t ha[64 * 32] = {0}, hb[8 * 32] = {0};
    float hc[64 * 8] = {0}, hd[64 * 8];
    for (int i = 0; i < n; i++) {
        ha[i] = code(av[i]);
        hb[i] = code(bv[i]);
    }
    hc[0] = c;
    for (int i = 1; i < 64 * 8; i++)
        hc[i] = NAN; // every other output is poisoned, overwritten by the wgmma
    CHECK(cudaMemcpy(g_a, ha, sizeof ha, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(g_b, hb, sizeof hb, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(g_c, hc, sizeof hc, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(g_d, 0xFF, sizeof hd));
    probe_kernel<<<1, 128>>>(g_a, g_b, g_c, g_d, g_flag);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(hd, g_d, sizeof hd, cudaMemcpyDeviceToHost));
    int flag;
    CHECK(cudaMemcpy(&flag, g_flag, sizeof flag, cudaMemcpyDeviceToHost));
    if (flag != 0) {
        fprintf(stderr, flag == 1 ? "shared tiles not 1024-byte aligned\n" : "not built for sm_90a\n");
        exit(1);
    }
    // Column 1 of row 0 has c = NaN: the wgmma must have written it (NaN + 0 = NaN) — a check that the
    // kernel ran at all.
    if (!isnan(hd[1])) {
        fprintf(stderr, "D(0, 1) = %g: expected NaN from its NaN accumulator input\n", hd[1]);
        exit(1);
    }
    return hd[0];
}

// One line: the exact value, the wgmma's, and the error in units of unit (the small product's size).
static void report(const char *family, int j, int n, const double *av, const double *bv, float c, double unit)
{
    double exact = c;
    for (int i = 0; i < n; i++)
        exact += av[i] * bv[i];
    const double got = wgmma_sum(n, av, bv, c);
    printf("%-24s j=%2d exact=%-22.17g wgmma=%-22.17g (wgmma-exact)/2^-j=%g\n", family, j, exact, got,
           (got - exact) / unit);
}

// 2^e as a product of two e4m3 powers of two (each in [2^-9, 2^8]), e in [-18, 16].
static void pow2_factors(int e, double *a, double *b)
{
    const int ea = e >= 0 ? e / 2 : -((-e + 1) / 2);
    *a = ldexp(1, ea);
    *b = ldexp(1, e - ea);
}

int main(void)
{
    CHECK(cudaMalloc(&g_a, 64 * 32));
    CHECK(cudaMalloc(&g_b, 8 * 32));
    CHECK(cudaMalloc(&g_c, 64 * 8 * sizeof(float)));
    CHECK(cudaMalloc(&g_d, 64 * 8 * sizeof(float)));
    CHECK(cudaMalloc(&g_flag, sizeof(int)));
    CHECK(cudaMemset(g_flag, 0, sizeof(int)));
    // The big product is 2^BIG = 2^8 (the factors 2^4 * 2^4), the small ones 2^(BIG - j); the error is printed
    // in units of 2^(BIG - j), relative to the big product's 2^-j.
    enum { BIG = 8 };
    double av[32], bv[32];
    for (int j = 8; j <= 25; j++) { // j = 26 would need 1.5 * 2^-9, not an e4m3 value
        const double unit = ldexp(1, BIG - j);
        // 1. Two products, 2^BIG and 2^(BIG-j): the first j at which the small one is lost is the adder's width.
        pow2_factors(BIG, &av[0], &bv[0]);
        pow2_factors(BIG - j, &av[1], &bv[1]);
        report("big + small", j, 2, av, bv, 0.0f, unit);
        // 2. Rounding: big + 3 small (1.5 * 2 small): where one bit is cut, truncation and rounding differ;
        //    negative sums show whether truncation is toward zero or toward -infinity.
        pow2_factors(BIG - j + 1, &av[1], &bv[1]);
        av[1] *= 1.5;
        report("big + 3 small", j, 2, av, bv, 0.0f, unit);
        av[0] = -av[0], av[1] = -av[1];
        report("-big - 3 small", j, 2, av, bv, 0.0f, unit);
        av[0] = -av[0];
        report("big - 3 small", j, 2, av, bv, 0.0f, unit);
        // 3. The accumulator input: c = 2^BIG with one small product, and c = small with the big product.
        pow2_factors(BIG - j, &av[0], &bv[0]);
        report("c=big, product small", j, 1, av, bv, (float)ldexp(1, BIG), unit);
        pow2_factors(BIG, &av[0], &bv[0]);
        report("c=small, product big", j, 1, av, bv, (float)ldexp(1, BIG - j), unit);
        report("c=3 small, product big", j, 1, av, bv, (float)(3 * ldexp(1, BIG - j)), unit);
        // 4. 31 small products beside the big one (each may be cut, their sum is 31 small).
        for (int i = 1; i < 32; i++)
            pow2_factors(BIG - j, &av[i], &bv[i]);
        report("big + 31 small", j, 32, av, bv, 0.0f, unit);
        // 5. A big accumulator input c = 2^(BIG+8) beside big + small products.
        pow2_factors(BIG - j, &av[1], &bv[1]);
        report("c=2^8 big, big + small", j, 2, av, bv, (float)ldexp(1, BIG + 8), unit);
        // 6. Is the k32 one alignment group, or chunks added in turn?  31 small products, then the big one last
        //    (k = 31), or at k = 16.  One group truncates every small one on the big one's grid (from j = 14:
        //    big); chunks of 16 in turn would first sum the 16 small ones before the big one exactly and keep
        //    them (big + 16 small at j = 14), chunks of 8 the 24 before the last chunk (big + 24 small).
        for (int i = 0; i < 31; i++)
            pow2_factors(BIG - j, &av[i], &bv[i]);
        pow2_factors(BIG, &av[31], &bv[31]);
        report("31 small, then big", j, 32, av, bv, 0.0f, unit);
        pow2_factors(BIG - j, &av[31], &bv[31]);
        pow2_factors(BIG, &av[16], &bv[16]);
        report("16 small, big, 15 small", j, 32, av, bv, 0.0f, unit);
    }
    CHECK(cudaDeviceSynchronize());
    return 0;
}
