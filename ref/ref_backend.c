/* The reference backend's dispatch table (host pointers, routing checked on the host first). */
#include "moe_ref.h"

static int ref_available(void) { return 1; }

const moe_dispatch moe_ref_dispatch = {
    .name = "ref",
    .available = ref_available,
    .gemm_fwd = moe_ref_gemm_fwd_naive,
    .gemm_dx = moe_ref_gemm_dx_naive,
    .gemm_dw = moe_ref_gemm_dw_naive,
    .gemm_topk_weights_grad = moe_ref_gemm_topk_weights_grad,
    .validates_routing_on_host = 1,
};
