/*
 * One generated FP8 grouped GEMM case (fwd or dX, every mode, both output dtypes, both scale formats, all four
 * operand dtype pairs, K and N on both sides of multiples of 128), shared by moe-fuzz's gemm-fp8 (the
 * reference, pt_gemm_fp8.c) and gpu-gemm-fp8 (the CUDA backend, pt_gpu_fp8.c).  All arrays are host arrays.
 */
#ifndef LIBMOE_PT_FP8_H
#define LIBMOE_PT_FP8_H

#include "pt.h"

#include "moe_fp8.h"

typedef struct fp8_case {
    int dx, weighted, code_dist, scale_dist; /* code_dist 0: exact small codes (every tile sum exact) */
    int64_t T, k, E, N, K, M;
    moe_fp8_options opt;
    int64_t *m_sizes, *gather;
    moe_routing routing;
    moe_fp8_tensor a, w;       /* a: x (fwd) or dy (dX) */
    uint8_t *a_codes, *w_codes;
    void *a_scales, *w_scales;
    size_t a_code_bytes, w_code_bytes, a_scale_bytes, w_scale_bytes, out_bytes;
    float *topk;               /* NULL unless weighted */
    int64_t out_count;
    void *old;                 /* the output's contents before the call */
    int64_t bad_scale;         /* the w scale fp8_case_corrupt spoils, -1 when W has no scale */
} fp8_case;

/* Draws a case whose work is at most cap_macs multiply-adds. */
void fp8_case_generate(pt_case *c, fp8_case *f, int64_t cap_macs);
/* The same with N and K multiples of `align` (1: the same case stream as fp8_case_generate). */
void fp8_case_generate_aligned(pt_case *c, fp8_case *f, int64_t cap_macs, int64_t align);
/* bad 1: w_scales[bad_scale] made invalid (-0.0f, or UE8M0's 255); bad 0: restored to a valid 1. */
void fp8_case_corrupt(fp8_case *f, int bad);
/* The case's call on `backend` with the given operands (host or device copies of the case's arrays). */
moe_status fp8_case_call(const fp8_case *f, moe_backend backend, const moe_routing *routing, const moe_fp8_tensor *a,
                         const moe_fp8_tensor *w, const float *topk, void *out);
/* The float64 oracle's values and bounds for in-tile sums of tile_acc_bits (oracle_fp8.h), checked against `out`
 * (host); failures tagged "bound". */
void fp8_case_check(pt_case *c, const fp8_case *f, const void *out, const char *who, int tile_acc_bits);
/* On exact codes (code_dist 0: every sum exact in any order and in 13 bits), `out` (host) must equal the reference's
 * output bit for bit; failures tagged "<tag>". */
void fp8_case_check_exact(pt_case *c, const fp8_case *f, const void *out, const char *tag, const char *who);
void fp8_case_free(fp8_case *f);

#endif /* LIBMOE_PT_FP8_H */
