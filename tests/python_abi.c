/* The layout of every public struct the Python package mirrors in ctypes (python/libmoe/_capi.py), as this
 * compiler lays it out: one line "struct field offset size" per field and "struct sizeof 0 size" per struct.
 * python/tests/test_libmoe.py (TestAbi) compares them with ctypes' layout, field by field. */
#include <stddef.h>
#include <stdio.h>

#include "moe.h"
#include "moe_fp8.h"
#include "moe_mlp.h"

#define FIELD(S, F) printf("%s %s %zu %zu\n", #S, #F, offsetof(S, F), sizeof(((S *)0)->F))
#define SIZE(S) printf("%s sizeof 0 %zu\n", #S, sizeof(S))

int main(void)
{
    SIZE(moe_routing);
    FIELD(moe_routing, num_tokens);
    FIELD(moe_routing, topk);
    FIELD(moe_routing, num_experts);
    FIELD(moe_routing, m_sizes);
    FIELD(moe_routing, gather_indices);

    SIZE(moe_gemm_options);
    FIELD(moe_gemm_options, dtype);
    FIELD(moe_gemm_options, dw_fp32);
    FIELD(moe_gemm_options, permute_x);
    FIELD(moe_gemm_options, permute_y);
    FIELD(moe_gemm_options, reduce_topk);
    FIELD(moe_gemm_options, accumulate);
    FIELD(moe_gemm_options, allow_tf32);
    FIELD(moe_gemm_options, dx_only);
    FIELD(moe_gemm_options, dw_only);
    FIELD(moe_gemm_options, stream);
    FIELD(moe_gemm_options, ref_scratch_bytes);

    SIZE(moe_mlp_options);
    FIELD(moe_mlp_options, dtype);
    FIELD(moe_mlp_options, block_size);
    FIELD(moe_mlp_options, activation);
    FIELD(moe_mlp_options, affinity);
    FIELD(moe_mlp_options, padding);
    FIELD(moe_mlp_options, bias);
    FIELD(moe_mlp_options, has_linear_clamp_lower_limit);
    FIELD(moe_mlp_options, has_linear_clamp_upper_limit);
    FIELD(moe_mlp_options, has_non_linear_clamp_lower_limit);
    FIELD(moe_mlp_options, has_non_linear_clamp_upper_limit);
    FIELD(moe_mlp_options, linear_clamp_lower_limit);
    FIELD(moe_mlp_options, linear_clamp_upper_limit);
    FIELD(moe_mlp_options, non_linear_clamp_lower_limit);
    FIELD(moe_mlp_options, non_linear_clamp_upper_limit);
    FIELD(moe_mlp_options, tensor_update_overwrite);
    FIELD(moe_mlp_options, accumulate);
    FIELD(moe_mlp_options, grad_fp32);
    FIELD(moe_mlp_options, float32_intermediates);
    FIELD(moe_mlp_options, stream);

    SIZE(moe_mlp_layout);
    FIELD(moe_mlp_layout, num_tokens);
    FIELD(moe_mlp_layout, num_experts);
    FIELD(moe_mlp_layout, num_blocks);
    FIELD(moe_mlp_layout, block_to_expert);
    FIELD(moe_mlp_layout, token_position_to_id);

    SIZE(moe_fp8_tensor);
    FIELD(moe_fp8_tensor, data);
    FIELD(moe_fp8_tensor, scales);
    FIELD(moe_fp8_tensor, dtype);

    SIZE(moe_fp8_options);
    FIELD(moe_fp8_options, out_dtype);
    FIELD(moe_fp8_options, scale_format);
    FIELD(moe_fp8_options, permute_x);
    FIELD(moe_fp8_options, permute_y);
    FIELD(moe_fp8_options, reduce_topk);
    FIELD(moe_fp8_options, accumulate);
    FIELD(moe_fp8_options, stream);
    FIELD(moe_fp8_options, w_transposed);
    FIELD(moe_fp8_options, codes_transposed);

    return 0;
}
