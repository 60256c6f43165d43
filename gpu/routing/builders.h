/*
 * Device builders (gpu/routing/builders.cu): the launchers behind moe_routing_build and
 * moe_mlp_layout_build_on with MOE_BACKEND_CUDA (the rows routing_build and mlp_layout_build of
 * gpu/cuda_backend.cu's table).
 *
 * Contract (besides moe_backend.h's):
 *   - Every array is a device array; the work is queued on `stream` (a cudaStream_t, NULL = the default
 *     stream) and the call returns without waiting.
 *   - The front end has checked dimensions, pointers and overlaps.  The contents of topk_ids (every id in
 *     [0, E); for layouts, distinct within a token) are checked on the device first; on a violation no
 *     output byte is written and moe_backend_synchronize reports the host builder's status and message
 *     (moe_cuda_routing_take_error), naming the first bad entry in the host's scan order.
 *   - Outputs equal the host builders' bit for bit (moe_routing_from_topk, moe_mlp_layout_build); a
 *     layout's blocks past the routing's own count (num_blocks is a capacity) hold expert E-1 and only
 *     padding, and *num_blocks_used (when given) receives that count.
 */
#ifndef LIBMOE_GPU_ROUTING_BUILDERS_H
#define LIBMOE_GPU_ROUTING_BUILDERS_H

#ifdef __cplusplus
extern "C" {
#endif

#include "moe_backend.h"
#include "moe_mlp.h"

moe_status moe_cuda_routing_build(int64_t T, int64_t k, int64_t E, const int64_t *topk_ids, int64_t *m_sizes,
                                  int64_t *gather_indices, int64_t *scatter_indices, void *stream);

/* pad: the padding mark (-1 or T); dtype: of topk_weights and affinities (copied bit for bit). */
moe_status moe_cuda_mlp_layout_build(moe_mlp_layout_kind kind, int64_t T, int64_t k, int64_t E, int64_t B,
                                     int64_t pad, moe_dtype dtype, const int64_t *topk_ids, const void *topk_weights,
                                     int64_t num_blocks, int64_t *block_to_expert, int64_t *token_position_to_id,
                                     void *affinities, int64_t *num_dropped, int64_t *num_blocks_used, void *stream);

/* After the stream has been synchronised: the first topk_ids error the device builders detected since
 * the previous call (then forgotten), as a status with its message; MOE_OK if none. */
moe_status moe_cuda_routing_take_error(void);

#ifdef __cplusplus
}
#endif

#endif /* LIBMOE_GPU_ROUTING_BUILDERS_H */
