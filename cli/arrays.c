/*
 * cli/arrays.c: loading the input arrays of a command, checking their shapes and types, and converting
 * them to the computation dtype or int64.
 */
#include "cli.h"

#include <stdint.h>

char *shape_text(const npy_header *h)
{
    static char buf[4][512];
    static int next;
    char *b = buf[next++ % 4];
    return npy_format_shape(b, sizeof buf[0], h->ndim, h->shape);
}

void load(const char *path, npy_array *array)
{
    char err[NPY_ERROR_SIZE];
    if (npy_read(path, array, err, sizeof err) != 0)
        die("%s", err);
    own(array->data);
}

/* Frees what load() read. */
void release(npy_array *array)
{
    xfree(array->data);
    array->data = NULL;
}

/* Refuses an array that is not [rows][cols] (split leading dimensions allowed when `split`). */
void check_matrix(const char *path, const npy_array *array, int64_t rows, int64_t cols, int split,
                  const char *why)
{
    const npy_header *h = &array->h;
    int ok = h->ndim >= 2 && h->shape[h->ndim - 1] == cols && (split || h->ndim == 2);
    if (ok) /* the leading dimensions multiply to count / cols */
        ok = cols == 0 ? h->ndim == 2 && h->shape[0] == rows : h->count / cols == rows;
    if (!ok)
        die("%s: expected shape (%lld, %lld)%s (%s), found %s %s", path, (long long)rows, (long long)cols,
            split ? " (leading dimensions may be split)" : "", why, shape_text(h), npy_type_name(h->type));
}

void check_floating(const char *path, const npy_array *array)
{
    if (npy_type_is_int(array->h.type) || array->h.type == NPY_T_U8)
        die("%s: expected a floating-point array (float16, float32, float64, or uint16 bit patterns), found %s %s",
            path, shape_text(&array->h), npy_type_name(array->h.type));
}

void *convert(const char *path, const npy_array *array, moe_dtype dtype)
{
    char err[NPY_ERROR_SIZE];
    void *out = xmalloc((size_t)array->h.count, moe_dtype_size(dtype));
    if (npy_to_dtype(array, path, dtype, out, NULL, err, sizeof err) != 0)
        die("%s", err);
    return out;
}

int64_t *convert_int(const char *path, const npy_array *array)
{
    char err[NPY_ERROR_SIZE];
    int64_t *out = xmalloc((size_t)array->h.count, sizeof *out);
    if (npy_to_int64(array, path, out, err, sizeof err) != 0)
        die("%s, shape %s", err, shape_text(&array->h));
    return out;
}

/* The computation dtype: --dtype, else f16 when every floating input is float16, else f32. */
moe_dtype choose_dtype(const args *a, const npy_array *const *arrays, const char *const *paths, int n)
{
    moe_dtype dtype = MOE_F32;
    const char *s = get(a, "--dtype");
    if (s != NULL) {
        if (!parse_dtype(s, &dtype))
            die("--dtype %s: expected f32, f16 or bf16", s);
        return dtype;
    }
    int all_f16 = 1, any = 0;
    for (int i = 0; i < n; i++) {
        if (arrays[i] == NULL)
            continue;
        check_floating(paths[i], arrays[i]);
        if (npy_type_is_pattern(arrays[i]->h.type))
            die("%s: holds %s 16-bit patterns; pass --dtype bf16 (bfloat16 bit patterns) or --dtype f16 to "
                "say what they are", paths[i], npy_type_name(arrays[i]->h.type));
        all_f16 &= arrays[i]->h.type == NPY_T_F16;
        any = 1;
    }
    return any && all_f16 ? MOE_F16 : MOE_F32;
}

/* h's shape is dims (ndim of them), possibly followed by extra dimensions of size 1. */
int shape_is(const npy_header *h, int ndim, const int64_t *dims)
{
    if (h->ndim < ndim)
        return 0;
    for (int d = 0; d < ndim; d++)
        if (h->shape[d] != dims[d])
            return 0;
    for (int d = ndim; d < h->ndim; d++)
        if (h->shape[d] != 1)
            return 0;
    return 1;
}

/* Refuses an array whose shape is not dims (extra trailing 1s allowed); what and why name it in the error. */
void check_shape(const char *path, const npy_array *arr, int ndim, const int64_t *dims, const char *what,
                 const char *why)
{
    if (shape_is(&arr->h, ndim, dims))
        return;
    char want[512];
    die("%s: expected %s of shape %s (%s), found %s %s", path, what, npy_format_shape(want, sizeof want, ndim, dims),
        why, shape_text(&arr->h), npy_type_name(arr->h.type));
}

void check_index_array(const char *path, const npy_array *arr)
{
    if (!npy_type_is_int(arr->h.type))
        die("%s: expected an int32 or int64 array, found %s %s", path, shape_text(&arr->h), npy_type_name(arr->h.type));
}
