/* NumPy .npy reading and writing for the moe tool; see npy.h. */
#include "npy.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

static const char npy_magic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};

static const struct {
    const char *descr, *name;
    size_t size;
} npy_types[NPY_T_COUNT] = {
    [NPY_T_F16] = {"<f2", "float16", 2}, [NPY_T_F32] = {"<f4", "float32", 4},
    [NPY_T_F64] = {"<f8", "float64", 8}, [NPY_T_I32] = {"<i4", "int32", 4},
    [NPY_T_I64] = {"<i8", "int64", 8},   [NPY_T_U16] = {"<u2", "uint16", 2},
    [NPY_T_V2] = {"<V2", "void16 (2-byte void, e.g. ml_dtypes.bfloat16)", 2},
    [NPY_T_U8] = {"|u1", "uint8", 1},
};

size_t npy_type_size(npy_type type) { return (unsigned)type < NPY_T_COUNT ? npy_types[type].size : 0; }
const char *npy_type_descr(npy_type type) { return (unsigned)type < NPY_T_COUNT ? npy_types[type].descr : "?"; }
const char *npy_type_name(npy_type type) { return (unsigned)type < NPY_T_COUNT ? npy_types[type].name : "?"; }
int npy_type_is_float(npy_type type) { return type == NPY_T_F16 || type == NPY_T_F32 || type == NPY_T_F64; }
int npy_type_is_int(npy_type type) { return type == NPY_T_I32 || type == NPY_T_I64; }
int npy_type_is_pattern(npy_type type) { return type == NPY_T_U16 || type == NPY_T_V2; }

static int host_is_little_endian(void)
{
    const uint16_t one = 1;
    unsigned char first;
    memcpy(&first, &one, 1);
    return first == 1;
}

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    if (err != NULL && errlen > 0) {
        va_list args;
        va_start(args, fmt);
        vsnprintf(err, errlen, fmt, args);
        va_end(args);
    }
    return -1;
}

char *npy_format_shape(char *buf, size_t size, int ndim, const int64_t *shape)
{
    size_t used = 0;
    if (size == 0)
        return buf;
    buf[0] = '\0';
#define NPY_APPEND(...)                                                                              \
    do {                                                                                             \
        if (used < size) {                                                                           \
            int n = snprintf(buf + used, size - used, __VA_ARGS__);                                  \
            used = n < 0 ? size : used + (size_t)n;                                                  \
        }                                                                                            \
    } while (0)
    NPY_APPEND("(");
    for (int i = 0; i < ndim; i++)
        NPY_APPEND("%s%lld", i ? ", " : "", (long long)shape[i]);
    NPY_APPEND(ndim == 1 ? ",)" : ")");
#undef NPY_APPEND
    return buf;
}

/* ---------------------------------------------------------------------------------------------------
 * Header parsing: a tiny tokenizer over [p, end) that never looks past end.
 * ------------------------------------------------------------------------------------------------- */
typedef struct cursor {
    const char *start, *p, *end;
    size_t base; /* file offset of start, for messages */
} cursor;

static size_t cursor_offset(const cursor *c) { return c->base + (size_t)(c->p - c->start); }

static void skip_space(cursor *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static int accept_char(cursor *c, char ch)
{
    skip_space(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return 1;
    }
    return 0;
}

static int describe_here(const cursor *c, char *buf, size_t size)
{
    if (c->p >= c->end)
        return snprintf(buf, size, "the end of the header");
    unsigned char ch = (unsigned char)*c->p;
    if (ch >= 0x20 && ch < 0x7f)
        return snprintf(buf, size, "'%c'", ch);
    return snprintf(buf, size, "byte 0x%02x", ch);
}

static int expected(const cursor *c, const char *what, char *err, size_t errlen)
{
    char here[32];
    describe_here(c, here, sizeof here);
    return fail(err, errlen, "malformed .npy header: expected %s at byte %zu, found %s", what, cursor_offset(c),
                here);
}

/* A Python string literal in single or double quotes, without escapes, into out[outsize]. */
static int parse_string(cursor *c, char *out, size_t outsize, char *err, size_t errlen)
{
    skip_space(c);
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"'))
        return expected(c, "a quoted string", err, errlen);
    const char quote = *c->p++;
    size_t n = 0;
    while (c->p < c->end && *c->p != quote) {
        if (*c->p == '\\' || *c->p == '\n')
            return expected(c, "a plain string (no escapes)", err, errlen);
        if (n + 1 >= outsize)
            return fail(err, errlen, "malformed .npy header: string at byte %zu is too long", cursor_offset(c));
        out[n++] = *c->p++;
    }
    if (c->p >= c->end)
        return expected(c, "the closing quote of a string", err, errlen);
    c->p++;
    out[n] = '\0';
    return 0;
}

static int parse_word(cursor *c, const char *word)
{
    skip_space(c);
    size_t n = strlen(word);
    if ((size_t)(c->end - c->p) >= n && memcmp(c->p, word, n) == 0) {
        const char *after = c->p + n;
        if (after == c->end || !((*after >= 'a' && *after <= 'z') || (*after >= 'A' && *after <= 'Z') ||
                                 (*after >= '0' && *after <= '9') || *after == '_')) {
            c->p = after;
            return 1;
        }
    }
    return 0;
}

/* A non-negative decimal integer (Python 2 files may end it with L). */
static int parse_int(cursor *c, int64_t *value, char *err, size_t errlen)
{
    skip_space(c);
    if (c->p >= c->end || *c->p < '0' || *c->p > '9')
        return expected(c, "a non-negative integer", err, errlen);
    int64_t v = 0;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
        int digit = *c->p - '0';
        if (v > (INT64_MAX - digit) / 10)
            return fail(err, errlen, "malformed .npy header: integer at byte %zu is too large", cursor_offset(c));
        v = v * 10 + digit;
        c->p++;
    }
    if (c->p < c->end && (*c->p == 'L' || *c->p == 'l'))
        c->p++;
    *value = v;
    return 0;
}

static int parse_descr(const char *descr, npy_type *type, char *err, size_t errlen)
{
    char order = '|';
    const char *rest = descr;
    if (*rest == '<' || *rest == '>' || *rest == '|' || *rest == '=')
        order = *rest++;
    if (rest[0] == 'O')
        return fail(err, errlen, "object arrays (dtype '%s') are stored pickled and are not supported: save a "
                    "numeric array (e.g. a.astype(np.float32))", descr);
    static const struct {
        const char *code;
        npy_type type;
    } known[] = {{"f2", NPY_T_F16}, {"f4", NPY_T_F32}, {"f8", NPY_T_F64}, {"i4", NPY_T_I32},
                 {"i8", NPY_T_I64}, {"u2", NPY_T_U16}, {"V2", NPY_T_V2}, {"u1", NPY_T_U8}};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        if (strcmp(rest, known[i].code) != 0)
            continue;
        if (order == '>')
            return fail(err, errlen, "big-endian data (dtype '%s') is not supported: convert it with "
                        "a.astype(a.dtype.newbyteorder('<'))", descr);
        if (order == '|' && known[i].type != NPY_T_V2 && known[i].type != NPY_T_U8)
            return fail(err, errlen, "dtype '%s' has no byte order; expected '<%s'", descr, rest);
        *type = known[i].type;
        return 0;
    }
    return fail(err, errlen, "unsupported dtype '%s' (supported: float16 '<f2', float32 '<f4', float64 '<f8', "
                "int32 '<i4', int64 '<i8', uint16 '<u2' or 2-byte void '<V2' for bf16/f16 bit patterns, and uint8 '|u1' "
                "for FP8 codes and UE8M0 scales)",
                descr);
}

/* Parses the header dict bytes [text, text + len) that start at file offset base. */
static int parse_dict(const char *text, size_t len, size_t base, npy_header *h, char *err, size_t errlen)
{
    cursor c = {text, text, text + len, base};
    int seen_descr = 0, seen_order = 0, seen_shape = 0, fortran = 0;
    if (!accept_char(&c, '{'))
        return expected(&c, "'{' (the header is a Python dict literal)", err, errlen);
    for (;;) {
        if (accept_char(&c, '}'))
            break;
        char key[32];
        if (parse_string(&c, key, sizeof key, err, errlen) != 0)
            return -1;
        if (!accept_char(&c, ':'))
            return expected(&c, "':'", err, errlen);
        if (strcmp(key, "descr") == 0) {
            if (seen_descr++)
                return fail(err, errlen, "malformed .npy header: key 'descr' appears twice");
            skip_space(&c);
            if (c.p < c.end && *c.p == '[')
                return fail(err, errlen, "structured dtypes (a list descr) are not supported");
            char descr[32];
            if (parse_string(&c, descr, sizeof descr, err, errlen) != 0 ||
                parse_descr(descr, &h->type, err, errlen) != 0)
                return -1;
        } else if (strcmp(key, "fortran_order") == 0) {
            if (seen_order++)
                return fail(err, errlen, "malformed .npy header: key 'fortran_order' appears twice");
            if (parse_word(&c, "True"))
                fortran = 1;
            else if (parse_word(&c, "False"))
                fortran = 0;
            else
                return expected(&c, "True or False", err, errlen);
        } else if (strcmp(key, "shape") == 0) {
            if (seen_shape++)
                return fail(err, errlen, "malformed .npy header: key 'shape' appears twice");
            if (!accept_char(&c, '('))
                return expected(&c, "'(' starting the shape tuple", err, errlen);
            h->ndim = 0;
            while (!accept_char(&c, ')')) {
                if (h->ndim >= NPY_MAX_DIMS)
                    return fail(err, errlen, "shape has more than %d dimensions", NPY_MAX_DIMS);
                if (parse_int(&c, &h->shape[h->ndim], err, errlen) != 0)
                    return -1;
                h->ndim++;
                if (!accept_char(&c, ',')) {
                    if (!accept_char(&c, ')'))
                        return expected(&c, "',' or ')' in the shape tuple", err, errlen);
                    break;
                }
            }
        } else {
            return fail(err, errlen, "malformed .npy header: unexpected key '%s' (expected only 'descr', "
                        "'fortran_order' and 'shape')", key);
        }
        if (!accept_char(&c, ',')) {
            if (!accept_char(&c, '}'))
                return expected(&c, "',' or '}'", err, errlen);
            break;
        }
    }
    skip_space(&c);
    if (c.p != c.end)
        return expected(&c, "only spaces and a newline after the header dict", err, errlen);
    if (!seen_descr || !seen_order || !seen_shape)
        return fail(err, errlen, "malformed .npy header: missing key '%s'",
                    !seen_descr ? "descr" : !seen_order ? "fortran_order" : "shape");
    if (fortran)
        return fail(err, errlen, "Fortran-order (column-major) arrays are not supported: save "
                    "np.ascontiguousarray(a) instead");
    int64_t count = 1;
    for (int i = 0; i < h->ndim; i++) {
        if (h->shape[i] != 0 && count > INT64_MAX / h->shape[i]) {
            char shape[256];
            return fail(err, errlen, "shape %s has too many elements",
                        npy_format_shape(shape, sizeof shape, h->ndim, h->shape));
        }
        count *= h->shape[i];
    }
    const size_t size = npy_type_size(h->type);
    if ((uint64_t)count > SIZE_MAX / size || (uint64_t)count > (uint64_t)INT64_MAX / size) {
        char shape[256];
        return fail(err, errlen, "shape %s is too large for this machine",
                    npy_format_shape(shape, sizeof shape, h->ndim, h->shape));
    }
    h->count = count;
    h->data_bytes = (size_t)count * size;
    return 0;
}

/* The fixed-size preamble: magic, version and header length, from the first `avail` bytes. */
static int parse_preamble(const unsigned char *buf, size_t avail, uint64_t file_size, npy_header *h,
                          size_t *header_len, char *err, size_t errlen)
{
    if (avail < 8 || memcmp(buf, npy_magic, sizeof npy_magic) != 0)
        return fail(err, errlen, "not a .npy file: %s", avail < 8 && (avail < 6 || memcmp(buf, npy_magic, 6) == 0)
                    ? "too short for the magic string and version" : "it does not start with \"\\x93NUMPY\"");
    h->major = buf[6];
    h->minor = buf[7];
    if (h->major < 1 || h->major > 3 || h->minor != 0)
        return fail(err, errlen, "unsupported .npy format version %d.%d (supported: 1.0, 2.0, 3.0)", h->major,
                    h->minor);
    const size_t pre = h->major == 1 ? 10 : 12;
    if (avail < pre)
        return fail(err, errlen, "truncated: the file ends inside the %zu-byte preamble", pre);
    uint64_t len = h->major == 1 ? (uint64_t)buf[8] | (uint64_t)buf[9] << 8
                                 : (uint64_t)buf[8] | (uint64_t)buf[9] << 8 | (uint64_t)buf[10] << 16 |
                                       (uint64_t)buf[11] << 24;
    if (len > NPY_MAX_HEADER)
        return fail(err, errlen, "header length %llu is larger than the %u bytes accepted", (unsigned long long)len,
                    NPY_MAX_HEADER);
    if (pre + len > file_size)
        return fail(err, errlen, "truncated: the header says it is %llu bytes but the file ends %llu bytes "
                    "after the preamble", (unsigned long long)len, (unsigned long long)(file_size - pre));
    *header_len = (size_t)len;
    h->data_offset = pre + (size_t)len;
    return 0;
}

static int check_data_size(const npy_header *h, uint64_t file_size, char *err, size_t errlen)
{
    const uint64_t have = file_size - h->data_offset;
    if (have == h->data_bytes)
        return 0;
    char shape[256];
    npy_format_shape(shape, sizeof shape, h->ndim, h->shape);
    if (have < h->data_bytes)
        return fail(err, errlen, "truncated: shape %s of %s needs %zu data bytes, the file has %llu", shape,
                    npy_type_name(h->type), h->data_bytes, (unsigned long long)have);
    return fail(err, errlen, "%llu unexpected bytes after the data of shape %s of %s",
                (unsigned long long)(have - h->data_bytes), shape, npy_type_name(h->type));
}

int npy_parse_memory(const void *file, size_t size, npy_header *h, char *err, size_t errlen)
{
    char why[NPY_ERROR_SIZE];
    size_t header_len = 0;
    memset(h, 0, sizeof *h);
    if (parse_preamble(file, size, size, h, &header_len, why, sizeof why) != 0 ||
        parse_dict((const char *)file + (h->data_offset - header_len), header_len, h->data_offset - header_len, h,
                   why, sizeof why) != 0 ||
        check_data_size(h, size, why, sizeof why) != 0)
        return fail(err, errlen, "<memory>: %s", why);
    return 0;
}

/* What a file that is not a regular one is, for messages. */
static const char *file_kind(mode_t mode)
{
    if (S_ISDIR(mode))
        return "a folder";
    if (S_ISFIFO(mode))
        return "a FIFO";
    if (S_ISCHR(mode) || S_ISBLK(mode))
        return "a device";
    if (S_ISSOCK(mode))
        return "a socket";
    return "not a file";
}

/* Opens path for reading when it is a regular file, *st its status; NULL with the reason in why
 * otherwise.  The status is checked before opening and the open does not block (O_NONBLOCK), so that a
 * FIFO (which would wait for a writer) or a device is refused without being opened at all, and is
 * checked again on the open file in case the path changed in between. */
static FILE *open_regular(const char *path, struct stat *st, char *why, size_t size)
{
    if (stat(path, st) != 0) {
        snprintf(why, size, "cannot open: %s", strerror(errno));
        return NULL;
    }
    if (!S_ISREG(st->st_mode)) {
        snprintf(why, size, "not a regular file (%s)", file_kind(st->st_mode));
        return NULL;
    }
    const int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, size, "cannot open: %s", strerror(errno));
        return NULL;
    }
    FILE *f = NULL;
    if (fstat(fd, st) != 0)
        snprintf(why, size, "cannot open: %s", strerror(errno));
    else if (!S_ISREG(st->st_mode))
        snprintf(why, size, "not a regular file (%s)", file_kind(st->st_mode));
    else if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) /* reads as from fopen */
        snprintf(why, size, "cannot open: %s", strerror(errno));
    else if ((f = fdopen(fd, "rb")) == NULL)
        snprintf(why, size, "cannot open: %s", strerror(errno));
    if (f == NULL)
        close(fd);
    return f;
}

int npy_read(const char *path, npy_array *array, char *err, size_t errlen)
{
    char why[NPY_ERROR_SIZE];
    memset(array, 0, sizeof *array);
    if (!host_is_little_endian())
        return fail(err, errlen, "%s: .npy support needs a little-endian host", path);
    struct stat st;
    FILE *f = open_regular(path, &st, why, sizeof why);
    if (f == NULL)
        return fail(err, errlen, "%s: %s", path, why);
    const uint64_t file_size = (uint64_t)st.st_size;
    unsigned char pre[12];
    const size_t avail = fread(pre, 1, sizeof pre, f);
    size_t header_len = 0;
    npy_header *h = &array->h;
    char *header = NULL;
    if (parse_preamble(pre, avail, file_size, h, &header_len, why, sizeof why) != 0)
        goto failed;
    header = malloc(header_len + 1);
    if (header == NULL) {
        snprintf(why, sizeof why, "out of memory for the header");
        goto failed;
    }
    if (fseek(f, (long)(h->data_offset - header_len), SEEK_SET) != 0 ||
        fread(header, 1, header_len, f) != header_len) {
        snprintf(why, sizeof why, "read error in the header");
        goto failed;
    }
    if (parse_dict(header, header_len, h->data_offset - header_len, h, why, sizeof why) != 0 ||
        check_data_size(h, file_size, why, sizeof why) != 0)
        goto failed;
    free(header);
    header = NULL;
    array->data = malloc(h->data_bytes ? h->data_bytes : 1);
    if (array->data == NULL) {
        snprintf(why, sizeof why, "out of memory for %zu data bytes", h->data_bytes);
        goto failed;
    }
    if (fread(array->data, 1, h->data_bytes, f) != h->data_bytes) {
        snprintf(why, sizeof why, "read error in the data");
        goto failed;
    }
    fclose(f);
    return 0;
failed:
    free(header);
    free(array->data);
    array->data = NULL;
    fclose(f);
    return fail(err, errlen, "%s: %s", path, why);
}

void npy_free(npy_array *array)
{
    free(array->data);
    array->data = NULL;
}

int npy_write_stream(FILE *f, const char *path, npy_type type, int ndim, const int64_t *shape, const void *data,
                     int version, char *err, size_t errlen)
{
    if (!host_is_little_endian())
        return fail(err, errlen, "%s: .npy support needs a little-endian host", path);
    if ((unsigned)type >= NPY_T_COUNT || ndim < 0 || ndim > NPY_MAX_DIMS || version < 0 || version > 3)
        return fail(err, errlen, "%s: npy_write: bad type, ndim or version", path);
    const size_t esize = npy_type_size(type);
    uint64_t count = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || (shape[i] != 0 && count > (uint64_t)INT64_MAX / (uint64_t)shape[i]))
            return fail(err, errlen, "%s: npy_write: bad shape", path);
        count *= (uint64_t)shape[i];
    }
    if (count > SIZE_MAX / esize)
        return fail(err, errlen, "%s: npy_write: too many elements", path);
    const size_t bytes = (size_t)count * esize;

    char dict[NPY_MAX_DIMS * 24 + 128], shape_text[NPY_MAX_DIMS * 24 + 8];
    npy_format_shape(shape_text, sizeof shape_text, ndim, shape);
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                     npy_type_descr(type), shape_text);
    if (n < 0 || (size_t)n >= sizeof dict)
        return fail(err, errlen, "%s: npy_write: header too long", path);
    if (version == 0)
        version = (10 + (size_t)n + 1 + 63) / 64 * 64 - 10 <= 65535 ? 1 : 2;
    const size_t pre = version == 1 ? 10 : 12;
    const size_t total = (pre + (size_t)n + 1 + 63) / 64 * 64; /* preamble + header, a multiple of 64 */
    const size_t header_len = total - pre;
    if (version == 1 && header_len > 65535)
        return fail(err, errlen, "%s: the header needs format version 2.0", path);
    unsigned char head[12 + sizeof dict + 64];
    memcpy(head, npy_magic, 6);
    head[6] = (unsigned char)version;
    head[7] = 0;
    for (size_t i = 0; i < pre - 8; i++)
        head[8 + i] = (unsigned char)(header_len >> (8 * i));
    memcpy(head + pre, dict, (size_t)n);
    memset(head + pre + n, ' ', header_len - (size_t)n - 1);
    head[total - 1] = '\n';

    errno = 0;
    if (fwrite(head, 1, total, f) != total || (bytes != 0 && fwrite(data, 1, bytes, f) != bytes))
        return fail(err, errlen, "%s: write error: %s", path, strerror(errno ? errno : EIO));
    return 0;
}

int npy_write(const char *path, npy_type type, int ndim, const int64_t *shape, const void *data, int version,
              char *err, size_t errlen)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return fail(err, errlen, "%s: cannot create: %s", path, strerror(errno));
    int rc = npy_write_stream(f, path, type, ndim, shape, data, version, err, errlen);
    errno = 0;
    if (fclose(f) != 0 && rc == 0)
        rc = fail(err, errlen, "%s: write error: %s", path, strerror(errno ? errno : EIO));
    if (rc != 0)
        remove(path);
    return rc;
}

/* ---------------------------------------------------------------------------------------------------
 * Conversions
 * ------------------------------------------------------------------------------------------------- */
float npy_f64_to_f32(double value)
{
    if (isnan(value))
        return signbit(value) ? -NAN : NAN;
    if (fabs(value) > FLT_MAX) /* 0x1.ffffffp127 (FLT_MAX + half an ulp) and up round to Inf */
        return (float)(fabs(value) >= 0x1.ffffffp127 ? (value > 0 ? INFINITY : -INFINITY)
                                                     : (value > 0 ? FLT_MAX : -FLT_MAX));
    return (float)value;
}

/* double -> float rounded to odd: exact, or else the neighbour whose last bit is 1.  Rounding that to a
 * format with at most 22 bits of precision (bf16: 8, f16: 11) gives the correctly rounded result. */
static float f64_to_f32_odd(double value)
{
    if (isnan(value) || isinf(value))
        return (float)value;
    if (fabs(value) > FLT_MAX)
        return value > 0 ? FLT_MAX : -FLT_MAX; /* odd, and rounds to Inf in both 16-bit formats */
    float f = (float)value;
    if ((double)f == value)
        return f;
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if (bits & 1u)
        return f;
    return nextafterf(f, value > (double)f ? INFINITY : -INFINITY);
}

uint16_t npy_f64_to_bf16(double value) { return moe_f32_to_bf16(f64_to_f32_odd(value)); }
uint16_t npy_f64_to_f16(double value) { return moe_f32_to_f16(f64_to_f32_odd(value)); }

static uint16_t load_u16(const void *base, int64_t i)
{
    uint16_t v;
    memcpy(&v, (const unsigned char *)base + 2 * i, 2);
    return v;
}

double npy_get(const npy_array *a, int64_t i, moe_dtype pattern_dtype)
{
    const unsigned char *p = a->data;
    switch (a->h.type) {
    case NPY_T_F16: return (double)moe_f16_to_f32(load_u16(p, i));
    case NPY_T_U8: return (double)p[i];
    case NPY_T_F32: {
        float v;
        memcpy(&v, p + 4 * i, 4);
        return (double)v;
    }
    case NPY_T_F64: {
        double v;
        memcpy(&v, p + 8 * i, 8);
        return v;
    }
    case NPY_T_I32: {
        int32_t v;
        memcpy(&v, p + 4 * i, 4);
        return (double)v;
    }
    case NPY_T_I64: {
        int64_t v;
        memcpy(&v, p + 8 * i, 8);
        return (double)v;
    }
    case NPY_T_U16:
    case NPY_T_V2:
        return pattern_dtype == MOE_F16 ? (double)moe_f16_to_f32(load_u16(p, i))
                                        : (double)moe_bf16_to_f32(load_u16(p, i));
    case NPY_T_COUNT: break;
    }
    return NAN;
}

static int same_value(double a, double b) { return a == b || (isnan(a) && isnan(b)); }

int npy_to_dtype(const npy_array *a, const char *path, moe_dtype dtype, void *dst, int64_t *rounded, char *err,
                 size_t errlen)
{
    const npy_type type = a->h.type;
    if (npy_type_is_int(type) || type == NPY_T_U8)
        return fail(err, errlen, "%s: expected a floating-point array, found %s", path, npy_type_name(type));
    if (npy_type_is_pattern(type) && dtype == MOE_F32)
        return fail(err, errlen, "%s: holds %s 16-bit patterns; pass --dtype bf16 (bfloat16 bit patterns) or "
                    "--dtype f16 to say what they are", path, npy_type_name(type));
    if (dtype != MOE_F32 && dtype != MOE_F16 && dtype != MOE_BF16)
        return fail(err, errlen, "%s: unknown dtype %d", path, (int)dtype);
    int64_t changed = 0;
    for (int64_t i = 0; i < a->h.count; i++) {
        if (npy_type_is_pattern(type) || (type == NPY_T_F16 && dtype == MOE_F16)) {
            ((uint16_t *)dst)[i] = load_u16(a->data, i);
            continue;
        }
        const double v = npy_get(a, i, dtype);
        double back;
        if (dtype == MOE_F32) {
            float f = type == NPY_T_F64 ? npy_f64_to_f32(v) : (float)v; /* f16, f32: exact */
            ((float *)dst)[i] = f;
            back = (double)f;
        } else if (dtype == MOE_BF16) {
            uint16_t b = npy_f64_to_bf16(v);
            ((uint16_t *)dst)[i] = b;
            back = (double)moe_bf16_to_f32(b);
        } else {
            uint16_t b = npy_f64_to_f16(v);
            ((uint16_t *)dst)[i] = b;
            back = (double)moe_f16_to_f32(b);
        }
        changed += !same_value(back, v);
    }
    if (rounded != NULL)
        *rounded = changed;
    return 0;
}

int npy_to_int64(const npy_array *a, const char *path, int64_t *dst, char *err, size_t errlen)
{
    if (a->h.type == NPY_T_I64) {
        if (a->h.count > 0)
            memcpy(dst, a->data, (size_t)a->h.count * 8);
        return 0;
    }
    if (a->h.type == NPY_T_I32) {
        for (int64_t i = 0; i < a->h.count; i++) {
            int32_t v;
            memcpy(&v, (const unsigned char *)a->data + 4 * i, 4);
            dst[i] = v;
        }
        return 0;
    }
    return fail(err, errlen, "%s: expected an int32 or int64 array, found %s", path, npy_type_name(a->h.type));
}
