/*
 * cli/dtype_fit.c: noticing float32 data that holds 16-bit values.  A bf16 step saved with .float() gives
 * float32 files whose every value is a bf16 value; run or compared as float32 it silently gets float32
 * arithmetic or float32 tolerances.  The MLP commands warn about it and compare's hint names the --dtype
 * that fits.
 */
#include "cli.h"

#include <math.h>
#include <stdio.h>

int values_fit_dtype(const npy_array *arr, moe_dtype dtype)
{
    if (arr->h.type != NPY_T_F32 && arr->h.type != NPY_T_F64)
        return arr->h.type == NPY_T_F16 && dtype == MOE_F16;
    for (int64_t i = 0; i < arr->h.count; i++) {
        const double v = npy_get(arr, i, MOE_BF16);
        if (isnan(v))
            continue;
        const double r = dtype == MOE_BF16 ? (double)moe_bf16_to_f32(npy_f64_to_bf16(v))
                         : dtype == MOE_F16 ? (double)moe_f16_to_f32(npy_f64_to_f16(v))
                                            : (double)npy_f64_to_f32(v);
        if (r != v)
            return 0;
    }
    return 1;
}

void warn_if_16bit_valued(const args *a, const npy_array *const *arrays, int n, const char *folder)
{
    int bf16 = 1, f16 = 1, any = 0;
    for (int i = 0; i < n; i++) {
        if (arrays[i] == NULL || arrays[i]->h.type == NPY_T_F16)
            continue;
        any = 1;
        bf16 = bf16 && values_fit_dtype(arrays[i], MOE_BF16);
        f16 = f16 && values_fit_dtype(arrays[i], MOE_F16);
    }
    if (!any || (!bf16 && !f16))
        return;
    fprintf(stderr,
            "moe %s: warning: every value of the floating inputs in %s is %s, but without --dtype (and no %s "
            "there) this computes in f32. If the step ran in %s, pass --dtype %s; --dtype f32 says f32 is meant.\n",
            a->cmd->name, folder, bf16 && f16 ? "a bf16 and an f16 value" : bf16 ? "a bf16 value" : "an f16 value",
            RUN_OPTIONS_FILE, bf16 ? "bf16" : "f16", bf16 ? "bf16" : "f16");
}
