/* What the grouped GEMM's entry points share with the FP8 ones (src/gemm_fp8_api.c): the validation of the
 * backend, routing, dimensions and options into a problem, and the array checks. */
#ifndef LIBMOE_GEMM_PREPARE_H
#define LIBMOE_GEMM_PREPARE_H

#include "moe_backend.h"

/* moe_gemm_fwd's (is_dx 0) or moe_gemm_dx's (is_dx 1) checks of everything but the tensors, naming `op`:
 * clears the last error, finds the backend's table, validates options (NULL: the defaults) and the routing
 * (on the host for a host backend), and fills *p. */
moe_status moe_gemm_prepare(const char *op, int is_dx, moe_backend backend, const moe_routing *routing, int64_t N,
                            int64_t K, const void *topk_weights, const moe_gemm_options *options,
                            const moe_dispatch **table, moe_gemm_problem *p);

/* Checks count (at most 8) tensors (sizes, NULLs, alignment) and that no output overlaps another argument or
 * the routing arrays. */
moe_status moe_gemm_check_tensors(const char *op, const moe_gemm_problem *p, const moe_array_arg *args, int count);

#endif
