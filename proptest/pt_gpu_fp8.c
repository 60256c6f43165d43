/*
 * GPU FP8 properties (op gpu-gemm-fp8, --backend cuda): a case of pt_fp8.h runs on the CUDA backend with device
 * copies of every array, routing included, and
 *   1. with one invalid W scale, the call is accepted and moe_backend_synchronize reports MOE_ERR_INVALID_VALUE
 *      naming w.scales, with the output untouched;
 *   2. with valid scales, returns MOE_OK, synchronises without a device error, and agrees with the float64
 *      oracle within its derived bound (on a Hopper GPU, unless MOE_CUDA_KERNEL=sm80 or simt forces the portable
 *      kernel, the bound of FP8 wgmma's in-tile sums: gpu/gemm/fp8_sm90.cu may take the call);
 *   3. on exact codes (every tile sum exact in any order) equals the CPU reference bit for bit;
 *   4. a second run on identical inputs gives bitwise the same output.
 */
#include "pt_cuda.h"
#include "pt_fp8.h"

#include <stdlib.h>
#include <string.h>

#include "oracle_fp8.h"

#define GPU_FP8_CAP_MACS 20000000

/* Runs the case on the GPU from `init` into host `out`; 1 when the call and the synchronisation succeeded.
 * expect_bad: the call must instead be reported bad by the synchronisation (and out is the output then). */
static int gpu_fp8_run(pt_case *c, const fp8_case *f, const void *init, void *out, int expect_bad)
{
    int ok = 0;
    void *dm = pt_device_copy(c, f->m_sizes, (size_t)f->E * sizeof(int64_t));
    void *dg = pt_device_copy(c, f->gather, (size_t)f->M * sizeof(int64_t));
    void *dac = pt_device_copy(c, f->a_codes, f->a_code_bytes), *das = pt_device_copy(c, f->a_scales, f->a_scale_bytes);
    void *dwc = pt_device_copy(c, f->w_codes, f->w_code_bytes), *dws = pt_device_copy(c, f->w_scales, f->w_scale_bytes);
    void *dtw = f->topk ? pt_device_copy(c, f->topk, (size_t)f->M * sizeof(float)) : NULL;
    void *dout = pt_device_copy(c, init, f->out_bytes);
    if (c->outcome != PT_FAIL) {
        const moe_routing r = {f->T, f->k, f->E, dm, dg};
        const moe_fp8_tensor a = {dac, das, f->a.dtype}, w = {dwc, dws, f->w.dtype};
        moe_status st = fp8_case_call(f, MOE_BACKEND_CUDA, &r, &a, &w, dtw, dout);
        const char *op = f->dx ? "moe_gemm_fp8_dx" : "moe_gemm_fp8_fwd";
        if (st != MOE_OK) {
            pt_fail(c, "status", "gpu %s returned %s: %s", op, moe_strerror(st), moe_last_error());
        } else {
            st = moe_backend_synchronize(MOE_BACKEND_CUDA, NULL);
            if (expect_bad) {
                if (st != MOE_ERR_INVALID_VALUE || strstr(moe_last_error(), "w.scales[") == NULL)
                    pt_fail(c, "bad-scale", "gpu %s with w.scales[%lld] bad: moe_backend_synchronize gave %s, \"%s\"",
                            op, (long long)f->bad_scale, moe_strerror(st), moe_last_error());
                else
                    ok = pt_device_download(c, out, dout, f->out_bytes);
            } else if (st != MOE_OK) {
                pt_fail(c, "device-error", "gpu %s: moe_backend_synchronize: %s: %s", op, moe_strerror(st),
                        moe_last_error());
            } else {
                ok = pt_device_download(c, out, dout, f->out_bytes);
            }
        }
    }
    void *ps[] = {dm, dg, dac, das, dwc, dws, dtw, dout};
    pt_device_free_all(ps, sizeof ps / sizeof ps[0]);
    return ok;
}

/* The in-tile sums the bound assumes on this GPU (oracle_fp8.h): FP8 wgmma's on compute capability 9.0 unless the
 * portable kernel is forced, else float32's. */
static int gpu_tile_acc_bits(void)
{
    const char *forced = getenv("MOE_CUDA_KERNEL");
    if (forced != NULL && (strcmp(forced, "sm80") == 0 || strcmp(forced, "simt") == 0))
        return ORACLE_FP8_TILE_F32;
    int device = 0, major = 0, minor = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess)
        return ORACLE_FP8_TILE_HOPPER_BITS; /* unknown: the looser bound, never a false alarm */
    return major == 9 && minor == 0 ? ORACLE_FP8_TILE_HOPPER_BITS : ORACLE_FP8_TILE_F32;
}

void pt_gpu_gemm_fp8(pt_case *c)
{
    fp8_case f;
    fp8_case_generate(c, &f, GPU_FP8_CAP_MACS);
    void *first = xmalloc(f.out_bytes + 4), *second = xmalloc(f.out_bytes + 4);
    if (f.bad_scale >= 0) {
        fp8_case_corrupt(&f, 1);
        if (gpu_fp8_run(c, &f, f.old, first, 1) && memcmp(first, f.old, f.out_bytes) != 0)
            pt_fail(c, "bad-scale", "a call reported bad changed the output");
        fp8_case_corrupt(&f, 0);
    }
    if (c->outcome != PT_FAIL && gpu_fp8_run(c, &f, f.old, first, 0)) {
        fp8_case_check(c, &f, first, "gpu", gpu_tile_acc_bits());
        if (f.code_dist == 0) {
            memcpy(second, f.old, f.out_bytes);
            const moe_status st = fp8_case_call(&f, MOE_BACKEND_REF, &f.routing, &f.a, &f.w, f.topk, second);
            if (st != MOE_OK)
                pt_fail(c, "status", "reference returned %s: %s", moe_strerror(st), moe_last_error());
            else if (memcmp(first, second, f.out_bytes) != 0)
                pt_fail(c, "gpu-vs-ref", "GPU and CPU reference differ on exact codes");
        }
        if (c->outcome != PT_FAIL && gpu_fp8_run(c, &f, f.old, second, 0) && memcmp(first, second, f.out_bytes) != 0)
            pt_fail(c, "determinism", "two GPU runs on identical inputs differ");
    }
    free(first), free(second);
    fp8_case_free(&f);
}
