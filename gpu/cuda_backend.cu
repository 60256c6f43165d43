// The CUDA backend's table (every row of moe_dispatch) and its host glue (device pointers, options.stream).
#include "common/cuda_check.cuh"
#include "fp8/quantize.h"
#include "gemm/gemm.cuh"
#include "mlp/mlp_cuda.h"
#include "routing/builders.h"

static int cuda_available(void)
{
    int count = 0;
    return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

static moe_status cuda_routing_build(const moe_routing_problem *p, const int64_t *topk_ids, int64_t *m_sizes,
                                     int64_t *gather_indices, int64_t *scatter_indices)
{
    return moe_cuda_routing_build(p->T, p->k, p->E, topk_ids, m_sizes, gather_indices, scatter_indices, p->stream);
}

static moe_status cuda_mlp_layout_build(const moe_layout_problem *p, const int64_t *topk_ids,
                                        const void *topk_weights, int64_t *block_to_expert,
                                        int64_t *token_position_to_id, void *affinities, int64_t *num_dropped,
                                        int64_t *num_blocks_used)
{
    return moe_cuda_mlp_layout_build(p->kind, p->T, p->k, p->E, p->B, p->pad, p->dtype, topk_ids, topk_weights,
                                     p->num_blocks, block_to_expert, token_position_to_id, affinities, num_dropped,
                                     num_blocks_used, p->stream);
}

// moe_backend_synchronize: the grouped GEMM's device-detected routing error first, then the FP8 GEMM's bad
// scale, then the FP8 quantizers' bad value or scale, then the MLP's layout error, then the device builders'
// topk_ids error (each is kept until reported; the five records are gpu/common/device_error.cuh's).
static moe_status cuda_synchronize(void *stream)
{
    moe_status status = moe_cuda_synchronize(stream);
    if (status == MOE_OK)
        status = moe_cuda_fp8_take_error();
    if (status == MOE_OK)
        status = moe_cuda_fp8_quantize_take_error();
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
    table.mlp_fwd = moe_cuda_mlp_fwd;
    table.mlp_bwd = moe_cuda_mlp_bwd;
    table.routing_build = cuda_routing_build;
    table.mlp_layout_build = cuda_mlp_layout_build;
    table.gemm_fp8_fwd = moe_cuda_gemm_fp8_fwd;
    table.gemm_fp8_dx = moe_cuda_gemm_fp8_dx;
    table.gemm_fp8_dw = moe_cuda_gemm_fp8_dw;
    table.fp8_quantize_columns = moe_cuda_fp8_quantize_columns;
    table.fp8_quantize = moe_cuda_fp8_quantize;
    table.fp8_dequantize = moe_cuda_fp8_dequantize;
    table.validates_routing_on_host = 0; // routing lives on the device: checked there
    table.synchronize = cuda_synchronize;
    return table;
}

extern "C" const moe_dispatch moe_cuda_dispatch = make_cuda_dispatch();
