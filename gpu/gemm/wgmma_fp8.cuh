// FP8 wgmma (sm_90a) for the Hopper FP8 kernels (gemm/fp8_sm90.cu: fwd and dX; gemm/fp8_dw_sm90.cu: dW): one
// m64n128k32 step on K-major operands in shared memory (128-byte swizzle), e4m3 or e5m2 codes on either side.
#ifndef LIBMOE_GPU_GEMM_WGMMA_FP8_CUH
#define LIBMOE_GPU_GEMM_WGMMA_FP8_CUH

#include <stdint.h>

#include "gemm/sm90.cuh"

namespace moe_gpu {

#ifdef MOE_SM90A_DEVICE
// d (+)= A(desc_a) * B(desc_b), 64 x 128 x 32 FP8 (scale_d = 0: d = A * B).
#define MOE_WGMMA_FP8_M64N128K32(TA, TB) \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" \
                 "wgmma.mma_async.sync.aligned.m64n128k32.f32." TA "." TB " " \
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n" \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d))
// The PTX type names of the operands' codes: 0 e4m3, 1 e5m2.
template <int TA, int TB>
__device__ __forceinline__ void wgmma_fp8_m64n128k32(float *d, uint64_t desc_a, uint64_t desc_b, int scale_d)
{
    if constexpr (TA == 0 && TB == 0)
        MOE_WGMMA_FP8_M64N128K32("e4m3", "e4m3");
    else if constexpr (TA == 0 && TB == 1)
        MOE_WGMMA_FP8_M64N128K32("e4m3", "e5m2");
    else if constexpr (TA == 1 && TB == 0)
        MOE_WGMMA_FP8_M64N128K32("e5m2", "e4m3");
    else
        MOE_WGMMA_FP8_M64N128K32("e5m2", "e5m2");
}
#undef MOE_WGMMA_FP8_M64N128K32
#endif

} // namespace moe_gpu

#endif
