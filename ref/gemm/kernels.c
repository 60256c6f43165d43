/*
 * ref/gemm/kernels.c: the micro-kernels of the blocked grouped GEMM and the choice among them.
 * c[i][j] += a[p][i] * b[p][j] for p = 0 .. kb-1 in order, i < MR, j < NR (micro_kernel in gemm_internal.h):
 * a 16-byte vector-extension kernel (SSE2 on x86-64, NEON on aarch64), an AVX2 copy of it picked at run
 * time on x86, and the scalar loop where neither exists (and in Frama-C's parse).  The tile code
 * (tiles.c) calls the chosen one through a pointer, so they live apart from it without a cost.
 */
#include "gemm_internal.h"

#if defined(__clang__)
#define MOE_UNROLL _Pragma("unroll")
#elif defined(__GNUC__) && __GNUC__ >= 8
#define MOE_UNROLL _Pragma("GCC unroll 16")
#else
#define MOE_UNROLL
#endif

#ifdef MOE_HAVE_VECTOR_EXT
typedef float moe_v4f __attribute__((vector_size(16)));

/* rows h0 .. h0+2 of the group, with 16-byte vectors: 12 accumulators of 4 lanes.  The vector kernels are
 * outside Frama-C's parse (this #if branch): their contracts are stated, not checked, and the kernels are
 * tested bit for bit against the naive twin (tests/test_gemm_modes). */
/*@ requires depth: 0 <= kb <= KB;
    requires half: h0 == 0 || h0 == 3;
    requires ldc: NR <= ldc <= NB;
    requires a: \valid_read(a + (0 .. kb * MR - 1));
    requires b: \valid_read(b + (0 .. kb * NR - 1));
    requires c: \valid(c + (h0 * ldc .. (h0 + 2) * ldc + NR - 1));
    terminates \true;
    assigns c[h0 * ldc .. (h0 + 2) * ldc + NR - 1]; */
static inline void kernel_v4_half(int64_t kb, int first, int h0, const float *restrict a,
                                  const float *restrict b, float *restrict c, int64_t ldc)
{
    enum { H = 3, V = NR / 4 };
    moe_v4f acc[H][V];
    MOE_UNROLL
    for (int i = 0; i < H; i++) {
        MOE_UNROLL
        for (int v = 0; v < V; v++) {
            if (first)
                acc[i][v] = (moe_v4f){0.0f, 0.0f, 0.0f, 0.0f};
            else
                memcpy(&acc[i][v], c + (h0 + i) * ldc + 4 * v, sizeof acc[i][v]);
        }
    }
    for (int64_t p = 0; p < kb; p++) {
        moe_v4f bv[V];
        MOE_UNROLL
        for (int v = 0; v < V; v++)
            memcpy(&bv[v], b + p * NR + 4 * v, sizeof bv[v]);
        MOE_UNROLL
        for (int i = 0; i < H; i++) {
            const float av = a[p * MR + h0 + i];
            MOE_UNROLL
            for (int v = 0; v < V; v++)
                acc[i][v] += av * bv[v];
        }
    }
    MOE_UNROLL
    for (int i = 0; i < H; i++) {
        MOE_UNROLL
        for (int v = 0; v < V; v++)
            memcpy(c + (h0 + i) * ldc + 4 * v, &acc[i][v], sizeof acc[i][v]);
    }
}

/* Rows 0 .. 2, and 3 .. 5 when rows > 3 (padded rows computed too). */
/*@ requires depth: 0 <= kb <= KB;
    requires rows: 1 <= rows <= MR;
    requires ldc: NR <= ldc <= NB;
    requires a: \valid_read(a + (0 .. kb * MR - 1));
    requires b: \valid_read(b + (0 .. kb * NR - 1));
    requires c: \valid(c + (0 .. ((rows > 3 ? MR : 3) - 1) * ldc + NR - 1));
    terminates \true;
    assigns c[0 .. ((rows > 3 ? MR : 3) - 1) * ldc + NR - 1]; */
static void kernel_v4(int64_t kb, int first, int rows, const float *restrict a, const float *restrict b,
                      float *restrict c, int64_t ldc)
{
    kernel_v4_half(kb, first, 0, a, b, c, ldc);
    if (rows > 3)
        kernel_v4_half(kb, first, 3, a, b, c, ldc);
}
#else
/* The scalar loop (contract on its prototype in gemm_internal.h). */
void gemm_kernel_scalar(int64_t kb, int first, int rows, const float *restrict a, const float *restrict b,
                        float *restrict c, int64_t ldc)
{
    /*@ loop invariant bounds: 0 <= i <= rows;
        loop assigns i, c[0 .. (rows - 1) * ldc + NR - 1];
        loop variant rows - i; */
    for (int i = 0; i < rows; i++)
        /*@ loop invariant bounds: 0 <= p <= kb;
            loop invariant row: 0 <= i * ldc <= (rows - 1) * ldc;
            loop assigns p, c[i * ldc .. i * ldc + NR - 1];
            loop variant kb - p; */
        for (int64_t p = 0; p < kb; p++) {
            if (first && p == 0)
                /*@ loop invariant bounds: 0 <= j <= NR;
                    loop assigns j, c[i * ldc .. i * ldc + NR - 1];
                    loop variant NR - j; */
                for (int j = 0; j < NR; j++)
                    c[i * ldc + j] = 0.0f;
            const float av = a[p * MR + i];
            /*@ loop invariant bounds: 0 <= j <= NR;
                loop assigns j, c[i * ldc .. i * ldc + NR - 1];
                loop variant NR - j; */
            for (int j = 0; j < NR; j++)
                c[i * ldc + j] += av * b[p * NR + j];
        }
}
#endif

#ifdef MOE_HAVE_AVX2_KERNEL
/* The same kernel with 32-byte vectors (AVX2, no FMA): 12 accumulators of 8 lanes, every one of the MR rows
 * (padded rows computed too).  Outside Frama-C's parse: contract stated, not checked (as kernel_v4's). */
/*@ requires depth: 0 <= kb <= KB;
    requires rows: 1 <= rows <= MR;
    requires ldc: NR <= ldc <= NB;
    requires a: \valid_read(a + (0 .. kb * MR - 1));
    requires b: \valid_read(b + (0 .. kb * NR - 1));
    requires c: \valid(c + (0 .. (MR - 1) * ldc + NR - 1));
    terminates \true;
    assigns c[0 .. (MR - 1) * ldc + NR - 1]; */
__attribute__((target("avx2"))) static void kernel_avx2(int64_t kb, int first, int rows,
                                                        const float *restrict a, const float *restrict b,
                                                        float *restrict c, int64_t ldc)
{
    typedef float v8f __attribute__((vector_size(32)));
    enum { V = NR / 8 };
    (void)rows;
    v8f acc[MR][V];
    MOE_UNROLL
    for (int i = 0; i < MR; i++) {
        MOE_UNROLL
        for (int v = 0; v < V; v++) {
            if (first)
                acc[i][v] = (v8f){0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            else
                memcpy(&acc[i][v], c + i * ldc + 8 * v, sizeof acc[i][v]);
        }
    }
    for (int64_t p = 0; p < kb; p++) {
        v8f bv[V];
        MOE_UNROLL
        for (int v = 0; v < V; v++)
            memcpy(&bv[v], b + p * NR + 8 * v, sizeof bv[v]);
        MOE_UNROLL
        for (int i = 0; i < MR; i++) {
            const float av = a[p * MR + i];
            MOE_UNROLL
            for (int v = 0; v < V; v++)
                acc[i][v] += av * bv[v];
        }
    }
    MOE_UNROLL
    for (int i = 0; i < MR; i++) {
        MOE_UNROLL
        for (int v = 0; v < V; v++)
            memcpy(c + i * ldc + 8 * v, &acc[i][v], sizeof acc[i][v]);
    }
}
#endif

/* (contract on the prototype in gemm_internal.h) */
micro_kernel gemm_pick_kernel(void)
{
#ifdef MOE_HAVE_VECTOR_EXT
    /* MOE_REF_KERNEL=v4 forces the 16-byte kernel on any CPU (tests: its second half of a 6-row tile,
     * `rows > 3`, runs nowhere else on an AVX2 machine); unset or any other value: chosen by the CPU */
    const char *forced = getenv("MOE_REF_KERNEL");
    if (forced != NULL && strcmp(forced, "v4") == 0)
        return kernel_v4;
#endif
#ifdef MOE_HAVE_AVX2_KERNEL
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2"))
        return kernel_avx2;
#endif
#ifdef MOE_HAVE_VECTOR_EXT
    return kernel_v4;
#else
    return gemm_kernel_scalar;
#endif
}
