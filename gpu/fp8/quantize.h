/*
 * The FP8 quantizers and their inverse on CUDA (gpu/fp8/quantize.cu): the rows fp8_quantize, fp8_quantize_columns
 * and fp8_dequantize of gpu/cuda_backend.cu's table, behind moe_quantize_fp8_rows / _blocks / _columns and
 * moe_dequantize_fp8 with MOE_BACKEND_CUDA.
 *
 * Contract (besides moe_backend.h's):
 *   - Every array is a device array; the work is queued on p->stream and the call returns without waiting.
 *   - The front end has checked dtypes, format, extents, pointers and overlaps.  The values it cannot read
 *     (a quantization's source: finite; a dequantization's scales: float32 finite and > 0, UE8M0 not 255)
 *     are checked on the device first; on a violation nothing is written and moe_backend_synchronize
 *     reports the reference's status and message for the first bad element in the host's order.
 *   - Codes, scales and dequantized values equal the reference's (ref/fp8_quantize.c) bit for bit.
 */
#ifndef LIBMOE_GPU_FP8_QUANTIZE_H
#define LIBMOE_GPU_FP8_QUANTIZE_H

#ifdef __cplusplus
extern "C" {
#endif

#include "moe_backend.h"

moe_status moe_cuda_fp8_quantize(const moe_fp8_quantize_problem *p, const void *src, void *q, void *scales);
moe_status moe_cuda_fp8_dequantize(const moe_fp8_quantize_problem *p, const void *q, const void *scales, void *out);
/* moe_quantize_fp8_columns: the routing (device arrays) is checked on the device as the GEMM checks it (a bad one
 * reported by moe_backend_synchronize, MOE_ERR_INVALID_ROUTING), then the values (after their topk weights). */
moe_status moe_cuda_fp8_quantize_columns(const moe_fp8_columns_problem *p, const void *src, const float *topk_weights,
                                         void *q, void *scales);

/* After the stream has been synchronised: the first bad source value or scale these calls detected since the
 * previous report (then forgotten), as a status with its message; MOE_OK if none. */
moe_status moe_cuda_fp8_quantize_take_error(void);

#ifdef __cplusplus
}
#endif

#endif /* LIBMOE_GPU_FP8_QUANTIZE_H */
