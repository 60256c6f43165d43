// CUDA grouped GEMM (work in progress: kernels land in the next commits).
#include "cuda_check.cuh"
#include "gemm_cuda.cuh"

static moe_status not_yet(const moe_gemm_problem *p)
{
    return moe_fail(MOE_ERR_UNSUPPORTED, "%s: the CUDA kernel for this op is not implemented yet", p->op);
}

moe_status moe_cuda_gemm_fwd(const moe_gemm_problem *p, const void *, const void *, const void *, void *)
{
    return not_yet(p);
}
moe_status moe_cuda_gemm_dx(const moe_gemm_problem *p, const void *, const void *, const void *, void *)
{
    return not_yet(p);
}
moe_status moe_cuda_gemm_dw(const moe_gemm_problem *p, const void *, const void *, const void *, void *)
{
    return not_yet(p);
}
moe_status moe_cuda_gemm_topk_weights_grad(const moe_gemm_problem *p, const void *, const void *,
                                           const void *, void *)
{
    return not_yet(p);
}
