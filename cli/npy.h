/*
 * NumPy .npy files for the moe command-line tool: reading and writing format versions 1.0, 2.0 and 3.0
 * (3.0 is 2.0 with a UTF-8 header), little-endian, C order.
 *
 * Element types: float16 '<f2', float32 '<f4', float64 '<f8', int32 '<i4', int64 '<i8', uint16 '<u2'
 * and two-byte void '<V2' / '|V2' (what np.save writes for an ml_dtypes.bfloat16 array).  The last two
 * hold 16-bit patterns whose meaning (bf16 or f16) the caller supplies.
 *
 * Refused with a message: Fortran order, big-endian data, object (pickled) arrays, structured dtypes,
 * any other dtype, a truncated file, bytes after the data, and any header that is not exactly the
 * Python dict literal np.save writes ({'descr': ..., 'fortran_order': ..., 'shape': (...), }).  The
 * parser never reads outside the bytes it was given.
 *
 * Every message starts with the file name (or "<memory>" for npy_parse_memory).
 */
#ifndef LIBMOE_CLI_NPY_H
#define LIBMOE_CLI_NPY_H

#include "moe.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define NPY_MAX_DIMS 64
#define NPY_ERROR_SIZE 1024
#define NPY_MAX_HEADER (1u << 20) /* header bytes accepted (np.load's default limit is 10000) */

typedef enum npy_type {
    NPY_T_F16 = 0,
    NPY_T_F32,
    NPY_T_F64,
    NPY_T_I32,
    NPY_T_I64,
    NPY_T_U16, /* uint16: 16-bit patterns (bf16 or f16, given by the caller) */
    NPY_T_V2,  /* two-byte void, e.g. ml_dtypes.bfloat16: 16-bit patterns as well */
    NPY_T_U8,  /* uint8 '|u1': FP8 codes and UE8M0 scales (moe fp8-quantize, the gemm-fp8 commands) */
    NPY_T_COUNT
} npy_type;

typedef struct npy_header {
    int major, minor;          /* format version */
    npy_type type;
    int ndim;
    int64_t shape[NPY_MAX_DIMS];
    int64_t count;             /* product of shape (1 for a 0-d array) */
    size_t data_offset;        /* bytes before the data */
    size_t data_bytes;         /* count * element size */
} npy_header;

typedef struct npy_array {
    npy_header h;
    void *data; /* h.data_bytes bytes (at least 1 allocated), little-endian = host order */
} npy_array;

/* Element size in bytes, numpy's descr ("<f4") and a readable name ("float32"). */
size_t npy_type_size(npy_type type);
const char *npy_type_descr(npy_type type);
const char *npy_type_name(npy_type type);
int npy_type_is_float(npy_type type);   /* f16, f32, f64 */
int npy_type_is_int(npy_type type);     /* i32, i64 */
int npy_type_is_pattern(npy_type type); /* u16, V2: 16-bit patterns */

/* "(2, 3)", "(5,)" or "()" into buf (always NUL-terminated); returns buf. */
char *npy_format_shape(char *buf, size_t size, int ndim, const int64_t *shape);

/* Parses the preamble and header at the start of a file image of `size` bytes and checks that exactly
 * h->data_bytes follow.  Returns 0, or -1 with a message in err. */
int npy_parse_memory(const void *file, size_t size, npy_header *h, char *err, size_t errlen);

/* Reads a whole regular file; a folder, FIFO, device or socket is refused as "not a regular file"
 * without blocking (a FIFO without a writer is never waited on).  Returns 0 (free with npy_free), or
 * -1 with "PATH: why" in err. */
int npy_read(const char *path, npy_array *array, char *err, size_t errlen);
void npy_free(npy_array *array);

/* Writes a C-order little-endian array to a new file at path (removed again on failure).  version: 1, 2
 * or 3, or 0 for the smallest that fits (1.0 unless the header needs more than 65535 bytes).  Returns
 * 0, or -1 with "PATH: why" in err. */
int npy_write(const char *path, npy_type type, int ndim, const int64_t *shape, const void *data,
              int version, char *err, size_t errlen);

/* The same into an open stream, path naming it in messages; the caller flushes and closes it. */
int npy_write_stream(FILE *f, const char *path, npy_type type, int ndim, const int64_t *shape,
                     const void *data, int version, char *err, size_t errlen);

/* ---- conversions ---- */

/* Correctly rounded (round to nearest even) float64 -> bf16 / f16 / f32: a single rounding, unlike
 * (uint16_t)(float)d which rounds twice. */
uint16_t npy_f64_to_bf16(double value);
uint16_t npy_f64_to_f16(double value);
float npy_f64_to_f32(double value);

/* Element i as double.  Patterns (u16, V2) are decoded as `pattern_dtype` (MOE_BF16 or MOE_F16). */
double npy_get(const npy_array *array, int64_t i, moe_dtype pattern_dtype);

/* Converts a floating array (f16, f32, f64; or u16/V2 patterns when dtype is MOE_BF16 or MOE_F16, taken
 * as patterns of that dtype) to `dtype` elements in dst (float for MOE_F32, uint16_t patterns
 * otherwise), rounding once to nearest even.  *rounded (if non-NULL) counts the values that changed.
 * Returns 0, or -1 with "PATH: why" (path names the array) when the types do not fit. */
int npy_to_dtype(const npy_array *array, const char *path, moe_dtype dtype, void *dst, int64_t *rounded,
                 char *err, size_t errlen);

/* Converts an int32/int64 array to int64.  Returns 0, or -1 with "PATH: why". */
int npy_to_int64(const npy_array *array, const char *path, int64_t *dst, char *err, size_t errlen);

#endif /* LIBMOE_CLI_NPY_H */
