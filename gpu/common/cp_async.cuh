// cp.async, the asynchronous global -> shared copies of sm_80 and later (every target --with-cuda-arch
// accepts), shared by the GEMM kernels (gpu/gemm/) and the MLP's gate_bwd_kernel (gpu/mlp/gate_rows.cu).
// A copy completes for the issuing thread at cp_async_wait; other threads see it after a barrier that follows
// that wait.
#ifndef LIBMOE_GPU_COMMON_CP_ASYNC_CUH
#define LIBMOE_GPU_COMMON_CP_ASYNC_CUH

// 16 bytes from gmem to smem (16-byte aligned both), or 16 zero bytes when !valid (gmem not read).
static __device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid)
{
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    int bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
}
// 4 bytes from gmem to smem (4-byte aligned both), through L1.
static __device__ __forceinline__ void cp_async4(void *smem, const void *gmem)
{
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem));
}
// Closes the thread's current group of copies.
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most PENDING of the thread's committed groups are still in flight.
template <int PENDING> static __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING));
}

#endif
