/* The reference backend's dispatch table (host pointers, routing checked on the host first).  Every
 * grouped GEMM op runs the blocked twin (ref/gemm_blocked.c), which agrees bit for bit with the naive
 * twin (ref/gemm_naive.c), the readable definition. */
#include "moe_ref.h"

static int ref_available(void) { return 1; }

const moe_dispatch moe_ref_dispatch = {
    .name = "ref",
    .available = ref_available,
    .gemm_fwd = moe_ref_gemm_fwd_blocked,
    .gemm_dx = moe_ref_gemm_dx_blocked,
    .gemm_dw = moe_ref_gemm_dw_blocked,
    .gemm_topk_weights_grad = moe_ref_gemm_topk_weights_grad_blocked,
    .validates_routing_on_host = 1,
};
