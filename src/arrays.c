/* The array checks every entry point shares: sizes, NULL pointers, alignment, overlaps (see moe_backend.h). */
#include "moe_backend.h"

#include <inttypes.h>
#include <stdint.h>

static int64_t element_bytes(const moe_array_arg *a) { return a->is_index ? 8 : (int64_t)moe_dtype_size(a->dtype); }

static moe_status check_array(const char *op, const moe_array_arg *a, int64_t *bytes)
{
    int64_t elements = 0;
    if (a->rows < 0 || !moe_mul_ok(a->rows, a->cols, &elements) || !moe_mul_ok(elements, element_bytes(a), bytes) ||
        (uint64_t)*bytes > SIZE_MAX)
        return moe_fail(MOE_ERR_OVERFLOW, "%s: %s is %" PRId64 " x %" PRId64 " %s elements, past 64-bit sizes", op,
                        a->name, a->rows, a->cols, a->is_index ? "int64" : moe_dtype_name(a->dtype));
    if (elements > 0 && a->data == NULL)
        return moe_fail(MOE_ERR_NULL_POINTER, "%s: %s is NULL but has %" PRId64 " x %" PRId64 " elements", op,
                        a->name, a->rows, a->cols);
    if (a->data == NULL)
        *bytes = 0;
    return moe_check_aligned(op, a->name, a->data, element_bytes(a),
                             a->is_index ? "int64" : moe_dtype_name(a->dtype));
}

moe_status moe_check_aligned(const char *op, const char *name, const void *data, int64_t element_size,
                             const char *type)
{
    if ((uintptr_t)data % (uintptr_t)element_size != 0)
        return moe_fail(MOE_ERR_MISALIGNED, "%s: %s at %p is not aligned to its %" PRId64 "-byte %s elements", op,
                        name, data, element_size, type);
    return MOE_OK;
}

moe_status moe_check_arrays(const char *op, const moe_array_arg *args, int count)
{
    enum { MAX_ARRAYS = 32 };
    int64_t bytes[MAX_ARRAYS];
    if (count > MAX_ARRAYS)
        return moe_fail(MOE_ERR_INVALID_SHAPE, "%s: internal error: %d array arguments, at most %d", op, count,
                        MAX_ARRAYS);
    for (int i = 0; i < count; i++) {
        moe_status status = check_array(op, &args[i], &bytes[i]);
        if (status != MOE_OK)
            return status;
    }
    /* a kernel never reads what it overwrites: no output may overlap another array */
    for (int i = 0; i < count; i++) {
        if (!args[i].is_output || bytes[i] == 0)
            continue;
        uintptr_t lo = (uintptr_t)args[i].data, hi = lo + (uintptr_t)bytes[i];
        for (int j = 0; j < count; j++) {
            if (j == i || bytes[j] == 0)
                continue;
            uintptr_t other_lo = (uintptr_t)args[j].data, other_hi = other_lo + (uintptr_t)bytes[j];
            if (lo < other_hi && other_lo < hi)
                return moe_fail(MOE_ERR_INVALID_OPTION, "%s: output %s overlaps %s %s", op, args[i].name,
                                args[j].is_output ? "output" : "input", args[j].name);
        }
    }
    return MOE_OK;
}
