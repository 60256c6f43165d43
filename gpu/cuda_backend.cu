// The CUDA backend's dispatch table and host glue (device pointers, options.stream).
#include "cuda_check.cuh"
#include "gemm_cuda.cuh"
#include "mlp_cuda.h"
#include "routing_cuda.h"

static int cuda_available(void)
{
    int count = 0;
    return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

// moe_backend_synchronize: the grouped GEMM's device-detected routing error first, then the MLP's
// layout error, then the device builders' topk_ids error (each is kept until reported).
static moe_status cuda_synchronize(void *stream)
{
    moe_status status = moe_cuda_synchronize(stream);
    if (status == MOE_OK)
        status = moe_cuda_mlp_take_error();
    return status != MOE_OK ? status : moe_cuda_routing_take_error();
}

static moe_dispatch make_cuda_dispatch()
{
    moe_dispatch table = {};
    table.name = "cuda";
    table.available = cuda_available;
    table.gemm_fwd = moe_cuda_gemm_fwd;
    table.gemm_dx = moe_cuda_gemm_dx;
    table.gemm_dw = moe_cuda_gemm_dw;
    table.gemm_topk_weights_grad = moe_cuda_gemm_topk_weights_grad;
    table.validates_routing_on_host = 0; // routing lives on the device: checked there
    table.synchronize = cuda_synchronize;
    return table;
}

extern "C" const moe_dispatch moe_cuda_dispatch = make_cuda_dispatch();
