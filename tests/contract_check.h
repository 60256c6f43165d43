/* Run-time checks of the ACSL float postconditions that WP does not prove (specs/gemm.acsl, the
 * contract of moe_ref_gemm_fwd_naive in ref/moe_ref.h).  Each check re-evaluates one named `ensures`
 * clause in float64 and, on a violation, writes a message that starts with the clause name. */
#ifndef LIBMOE_TESTS_CONTRACT_CHECK_H
#define LIBMOE_TESTS_CONTRACT_CHECK_H

#include "moe_ref.h"

#include <stddef.h>

/* Checks `fwd_within_bound` of moe_ref_gemm_fwd_naive on a finished call: for every expert-order row r
 * of expert e and column n, |y[yrow(r)][n] - y64| <= gamma(K) * sum |x w| + u_out * |y64| with y64 the
 * float64 dot product of the (already rounded) inputs x[xrow(r)][:] and W[e][n][:].
 *   p  a validated problem without topk weights or accumulate (the clause's behaviour `plain_f32`,
 *      here for every dtype: inputs are read with moe_ref_load, u_out is the output dtype's roundoff)
 *   x [rows of X][K], w [E][N][K], y [rows of Y][N]: the call's tensors, in p->dtype
 *   message [capacity]: out, the first violation ("fwd_within_bound: y[3][1] = ...")
 * Returns the number of violated elements (0: the postcondition holds), or -1 if p is outside the
 * behaviour (topk weights or accumulate) or memory ran out. */
long moe_ref_check_gemm_fwd_post(const moe_gemm_problem *p, const void *x, const void *w,
                                 const void *topk_weights, const void *y, char *message, size_t capacity);

#endif /* LIBMOE_TESTS_CONTRACT_CHECK_H */
