/*
 * GPU properties (op gpu-gemm, --backend cuda): a generated grouped GEMM case (N and K rounded up to
 * multiples of 8) runs on the CUDA backend with device copies of every array, routing included, and
 *   1. returns MOE_OK and moe_backend_synchronize reports no device-side error;
 *   2. agrees with the float64 oracle within its derived bound (exactly, on exact data);
 *   3. on exactly representable data equals the CPU reference bit for bit;
 *   4. a second run on identical inputs gives bitwise the same output (determinism, dW included).
 * Each case also picks the kernel family (MOE_CUDA_KERNEL unset, sm80 or simt) unless the caller set it,
 * so that a Hopper machine fuzzes the kernels Ampere runs and the fp32 fallback too.
 * f32 cases allow TF32 half of the time (the TF32 kernel; the oracle's bound then charges TF32's product
 * error), and otherwise require true fp32.  The case runs in moe-fuzz's worker process,
 * so a device fault or a hang is reported as this case's failure and shrunk.
 */
#include "pt_gemm.h"

#include "oracle.h"
#include "pt_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int pt_cuda_ok(pt_case *c, cudaError_t err, const char *what)
{
    if (err == cudaSuccess)
        return 1;
    pt_fail(c, "cuda", "%s: %s", what, cudaGetErrorString(err));
    return 0;
}

void *pt_device_copy(pt_case *c, const void *host, size_t bytes)
{
    void *dev = NULL;
    if (!pt_cuda_ok(c, cudaMalloc(&dev, bytes ? bytes : 16), "cudaMalloc"))
        return NULL;
    if (bytes && host && !pt_cuda_ok(c, cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device")) {
        cudaFree(dev);
        return NULL;
    }
    return dev;
}

int pt_device_download(pt_case *c, void *host, const void *dev, size_t bytes)
{
    return bytes == 0 || pt_cuda_ok(c, cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
}

void pt_device_free_all(void *const *ptrs, size_t count)
{
    for (size_t i = 0; i < count; i++)
        if (ptrs[i])
            cudaFree(ptrs[i]);
}

/* Runs op on the GPU into a device buffer initialised from `init` (output bytes); copies it to `host`. */
static int gpu_run(pt_case *c, const gcase *g, enum gop op, const void *init, size_t bytes, void *host)
{
    const size_t es = moe_dtype_size(g->opt.dtype);
    gcase d = *g; /* the same case with device pointers */
    int ok = 0;
    void *dm = pt_device_copy(c, g->m_sizes, (size_t)g->E * sizeof(int64_t));
    void *dg = pt_device_copy(c, g->gather, (size_t)g->M * sizeof(int64_t));
    void *dx = pt_device_copy(c, g->x, (size_t)(gcase_x_rows(g) * g->K) * es);
    void *dw = pt_device_copy(c, g->w, (size_t)(g->E * g->N * g->K) * es);
    void *ddy = pt_device_copy(c, g->dy, (size_t)(g->M * g->N) * es);
    void *dtw = g->tw ? pt_device_copy(c, g->tw, (size_t)g->M * es) : NULL;
    void *dout = pt_device_copy(c, init, bytes);
    if (c->outcome != PT_FAIL) {
        d.r.m_sizes = dm;
        d.r.gather_indices = g->r.gather_indices ? dg : NULL;
        d.x = dx, d.w = dw, d.dy = ddy, d.tw = dtw;
        moe_status st = gop_call(&d, op, MOE_BACKEND_CUDA, dout);
        if (st == MOE_ERR_UNSUPPORTED) {
            pt_discard(c, moe_last_error());
        } else if (st != MOE_OK) {
            pt_fail(c, "status", "gpu %s returned %s: %s", gop_name(op), moe_strerror(st), moe_last_error());
        } else {
            st = moe_backend_synchronize(MOE_BACKEND_CUDA, NULL);
            if (st != MOE_OK)
                pt_fail(c, "device-error", "gpu %s: moe_backend_synchronize: %s: %s", gop_name(op), moe_strerror(st),
                        moe_last_error());
            else if (pt_device_download(c, host, dout, bytes))
                ok = 1;
        }
    }
    void *ps[] = {dm, dg, dx, dw, ddy, dtw, dout};
    pt_device_free_all(ps, sizeof ps / sizeof ps[0]);
    return ok;
}

/* The kernel family a case forces (MOE_CUDA_KERNEL): the automatic choice first, the smallest to shrink to. */
static const char *const gpu_families[] = {NULL, "sm80", "simt"};

void pt_gpu_gemm(pt_case *c)
{
    const enum gop op = (enum gop)pt_pick(c->src, GOPS);
    const int family = (int)pt_pick(c->src, 3);
    /* the caller's MOE_CUDA_KERNEL wins; else the case sets it for its own calls and unsets it after them */
    const int forcing = getenv("MOE_CUDA_KERNEL") == NULL && gpu_families[family] != NULL;
    if (forcing && setenv("MOE_CUDA_KERNEL", gpu_families[family], 1) != 0) {
        pt_fail(c, "setup", "setenv MOE_CUDA_KERNEL failed");
        return;
    }
    const char *family_name = getenv("MOE_CUDA_KERNEL");
    pt_describe(c, "%s (family %s): ", gop_name(op), family_name ? family_name : "auto");
    gcase g;
    gcase_generate(c, &g, GEN_GPU);
    g.split_backend = 1;
    if (g.opt.dtype == MOE_F32 && pt_pick(c->src, 2)) {
        g.opt.allow_tf32 = 1;
        pt_describe(c, " allow_tf32");
    }
    if (op != GOP_DX)
        g.opt.reduce_topk = 0;
    if (op != GOP_DW && op != GOP_DTOPK)
        g.opt.dw_fp32 = 0;
    if (op == GOP_DTOPK)
        g.r.gather_indices = g.gather;
    void *old;
    void *init = gop_output(&g, op, &old);
    const size_t bytes = (size_t)gop_out_count(&g, op) * moe_dtype_size(gop_out_dtype(&g, op));
    void *first = xmalloc(bytes), *second = xmalloc(bytes);
    if (gpu_run(c, &g, op, init, bytes, first)) {
        gop_check(c, &g, op, old, first, "gpu");
        if (g.dist == PT_DIST_EXACT) {
            void *ref = xmalloc(bytes);
            memcpy(ref, init, bytes);
            moe_status st = gop_call(&g, op, MOE_BACKEND_REF, ref);
            if (st != MOE_OK)
                pt_fail(c, "status", "reference %s returned %s: %s", gop_name(op), moe_strerror(st), moe_last_error());
            else
                gop_same_bits(c, &g, op, first, ref, "gpu-vs-ref", "GPU vs CPU reference on exact data");
            free(ref);
        }
        if (gpu_run(c, &g, op, init, bytes, second))
            gop_same_bits(c, &g, op, first, second, "determinism", "two GPU runs on identical inputs");
    }
    free(first), free(second), free(init), free(old);
    gcase_free(&g);
    if (forcing)
        unsetenv("MOE_CUDA_KERNEL");
}
