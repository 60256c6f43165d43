/*
 * Tests of cli/npy.c (the moe tool's .npy reader/writer), and the helper the tests/test_cli_*.sh scripts
 * use to make .npy files without numpy.
 *
 *   test_cli_npy                          unit tests: round trips of every dtype through format 1.0, 2.0
 *                                         and 3.0 headers, accepted header spellings, every refusal,
 *                                         a mutation fuzz of the header parser, and the conversions
 *   test_cli_npy mk FILE DESCR SHAPE [v1|v2|v3] VALUE...
 *                                         writes an array: DESCR one of <f2 <f4 <f8 <i4 <i8 <u2 <V2,
 *                                         SHAPE "2,3" ("" for 0-d), format version (default v1); the values
 *                                         (decimal, repeated cyclically to fill; integers for <u2 <V2)
 *   test_cli_npy info FILE                prints "DESCR SHAPE", e.g. "<u2 (3, 4)"
 *   test_cli_npy gen DIR SEED DTYPE       a random grouped GEMM problem in DIR and the outputs of the
 *                                         library called directly (see gen() below)
 */
#include "moe.h"
#include "../cli/npy.h"
#include "oracle.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int failures;

#define CHECK(cond, ...)                                                                             \
    do {                                                                                             \
        if (!(cond)) {                                                                               \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);                 \
            fprintf(stderr, __VA_ARGS__);                                                            \
            fprintf(stderr, "\n");                                                                   \
            failures++;                                                                              \
        }                                                                                            \
    } while (0)

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (p == NULL) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

static const char *tmpdir(void)
{
    static char dir[512];
    if (dir[0] == '\0') {
        const char *base = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/test_cli_npy.XXXXXX", base && base[0] ? base : "/tmp");
        if (mkdtemp(dir) == NULL) {
            perror("mkdtemp");
            exit(2);
        }
    }
    return dir;
}

static unsigned char *slurp(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = xmalloc((size_t)n);
    *size = fread(buf, 1, (size_t)n, f);
    fclose(f);
    return buf;
}

/* Parses a header dict given as text, wrapped in a version 1.0 preamble, with `data` bytes of zeros. */
static int parse_text(const char *dict, size_t data, npy_header *h, char *err, size_t errlen)
{
    const size_t len = strlen(dict);
    const size_t size = 10 + len + data;
    unsigned char *file = xmalloc(size);
    memcpy(file, "\x93NUMPY\x01\x00", 8);
    file[8] = (unsigned char)(len & 0xff);
    file[9] = (unsigned char)(len >> 8);
    memcpy(file + 10, dict, len);
    memset(file + 10 + len, 0, data);
    int rc = npy_parse_memory(file, size, h, err, errlen);
    free(file);
    return rc;
}

/* ---- round trips ---- */
static void test_round_trips(void)
{
    static const int64_t shapes[][5] = {{0}, {1, 0}, {1, 5}, {2, 2, 3}, {3, 2, 0, 3}, {4, 1, 2, 3, 4}};
    char path[1024], err[NPY_ERROR_SIZE];
    int files = 0;
    for (int t = 0; t < NPY_T_COUNT; t++) {
        for (int version = 1; version <= 3; version++) {
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
                const int ndim = (int)shapes[s][0];
                const int64_t *shape = &shapes[s][1];
                int64_t count = 1;
                for (int d = 0; d < ndim; d++)
                    count *= shape[d];
                const size_t bytes = (size_t)count * npy_type_size((npy_type)t);
                unsigned char *data = xmalloc(bytes);
                for (size_t i = 0; i < bytes; i++)
                    data[i] = (unsigned char)(i * 37 + (size_t)t * 11 + 5);
                snprintf(path, sizeof path, "%s/rt_%d_%d_%zu.npy", tmpdir(), t, version, s);
                CHECK(npy_write(path, (npy_type)t, ndim, shape, data, version, err, sizeof err) == 0, "%s", err);
                npy_array a;
                CHECK(npy_read(path, &a, err, sizeof err) == 0, "%s", err);
                CHECK(a.h.type == (npy_type)t && a.h.ndim == ndim && a.h.count == count && a.h.major == version,
                      "%s: type %d ndim %d count %lld version %d", path, (int)a.h.type, a.h.ndim,
                      (long long)a.h.count, a.h.major);
                for (int d = 0; d < ndim && d < a.h.ndim; d++)
                    CHECK(a.h.shape[d] == shape[d], "%s: dim %d", path, d);
                CHECK(a.h.data_bytes == bytes && (bytes == 0 || memcmp(a.data, data, bytes) == 0), "%s: data", path);
                CHECK(a.h.data_offset % 64 == 0, "%s: data offset %zu is not 64-aligned", path, a.h.data_offset);
                npy_free(&a);
                size_t size = 0;
                unsigned char *image = slurp(path, &size);
                npy_header h;
                CHECK(image && npy_parse_memory(image, size, &h, err, sizeof err) == 0, "%s", err);
                free(image);
                free(data);
                remove(path);
                files++;
            }
        }
    }
    printf("round trips: %d files (%d dtypes x format 1.0, 2.0, 3.0 x %zu shapes)\n", files, NPY_T_COUNT,
           sizeof shapes / sizeof shapes[0]);
}

/* ---- header spellings np.save and other writers produce ---- */
static void test_accepted_headers(void)
{
    static const struct {
        const char *dict;
        npy_type type;
        int ndim;
        int64_t d0, d1;
    } ok[] = {
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }      \n", NPY_T_F32, 2, 2, 3},
        {"{'shape': (2, 3), 'fortran_order': False, 'descr': '<f8'}\n", NPY_T_F64, 2, 2, 3},
        {"{\"descr\": \"<i8\", \"fortran_order\": False, \"shape\": (4,)}", NPY_T_I64, 1, 4, 0},
        {"{'descr':'<i4','fortran_order':False,'shape':(2L, 3L)}\n", NPY_T_I32, 2, 2, 3},
        {"{'descr': '<u2', 'fortran_order': False, 'shape': (), }\n", NPY_T_U16, 0, 0, 0},
        {"{'descr': '|V2', 'fortran_order': False, 'shape': (1,), }\n", NPY_T_V2, 1, 1, 0},
        {"{'descr': '<f2',\t'fortran_order': False, 'shape': ( 3 , ) , }\r\n", NPY_T_F16, 1, 3, 0},
    };
    char err[NPY_ERROR_SIZE];
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        npy_header h;
        const int64_t count = ok[i].ndim == 0 ? 1 : ok[i].ndim == 1 ? ok[i].d0 : ok[i].d0 * ok[i].d1;
        int rc = parse_text(ok[i].dict, (size_t)count * npy_type_size(ok[i].type), &h, err, sizeof err);
        CHECK(rc == 0, "header %zu refused: %s", i, err);
        if (rc == 0)
            CHECK(h.type == ok[i].type && h.ndim == ok[i].ndim && h.count == count &&
                      (ok[i].ndim < 1 || h.shape[0] == ok[i].d0) && (ok[i].ndim < 2 || h.shape[1] == ok[i].d1),
                  "header %zu parsed wrong", i);
    }
    printf("accepted headers: %zu spellings\n", sizeof ok / sizeof ok[0]);
}

/* ---- refusals: each malformed or unsupported file gives a message with the expected words ---- */
static void expect_refused(const char *what, const void *file, size_t size, const char *words)
{
    char err[NPY_ERROR_SIZE] = "";
    npy_header h;
    unsigned char *copy = xmalloc(size);
    memcpy(copy, file, size);
    int rc = npy_parse_memory(copy, size, &h, err, sizeof err);
    free(copy);
    CHECK(rc != 0, "%s: accepted", what);
    CHECK(strstr(err, words) != NULL && strncmp(err, "<memory>: ", 10) == 0, "%s: message \"%s\" lacks \"%s\"",
          what, err, words);
}

static void expect_refused_dict(const char *what, const char *dict, size_t data, const char *words)
{
    const size_t len = strlen(dict), size = 10 + len + data;
    unsigned char *file = xmalloc(size);
    memcpy(file, "\x93NUMPY\x01\x00", 8);
    file[8] = (unsigned char)(len & 0xff);
    file[9] = (unsigned char)(len >> 8);
    memcpy(file + 10, dict, len);
    memset(file + 10 + len, 0, data);
    expect_refused(what, file, size, words);
    free(file);
}

static void test_refusals(void)
{
    static const struct {
        const char *what, *dict;
        size_t data;
        const char *words;
    } bad[] = {
        {"fortran order", "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }\n", 24, "Fortran"},
        {"big-endian", "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }\n", 8, "big-endian"},
        {"object", "{'descr': '|O', 'fortran_order': False, 'shape': (2,), }\n", 16, "pickled"},
        {"structured", "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }\n", 8, "structured"},
        {"complex", "{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }\n", 16, "unsupported dtype"},
        {"bool", "{'descr': '|b1', 'fortran_order': False, 'shape': (2,), }\n", 2, "unsupported dtype"},
        {"no byte order", "{'descr': '|f4', 'fortran_order': False, 'shape': (2,), }\n", 8, "no byte order"},
        {"missing key", "{'descr': '<f4', 'shape': (2,), }\n", 8, "missing key 'fortran_order'"},
        {"duplicate key", "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", 8, "twice"},
        {"extra key", "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", 8, "unexpected key"},
        {"bad bool", "{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}", 8, "True or False"},
        {"negative dim", "{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}", 8, "non-negative integer"},
        {"huge dim", "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}", 8, "too large"},
        {"overflowing shape", "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296)}", 8,
         "too many elements"},
        {"too big for size_t", "{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904,)}", 8,
         "too large"},
        {"unterminated string", "{'descr': '<f4", 8, "closing quote"},
        {"escape", "{'descr': '<f\\x34', 'fortran_order': False, 'shape': (2,)}", 8, "no escapes"},
        {"junk after dict", "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), } junk\n", 8, "after the header"},
        {"not a dict", "hello world\n", 8, "expected '{'"},
        {"unclosed dict", "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)", 8, "',' or '}'"},
        {"unclosed tuple", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3", 24, "shape tuple"},
        {"empty header", "", 8, "expected '{'"},
        {"truncated data", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n", 23, "truncated"},
        {"extra data", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n", 25, "unexpected bytes"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_refused_dict(bad[i].what, bad[i].dict, bad[i].data, bad[i].words);

    char dims[4096] = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
    for (int d = 0; d < NPY_MAX_DIMS + 1; d++)
        strcat(dims, "1, ");
    strcat(dims, ")}");
    expect_refused_dict("too many dims", dims, 4, "more than");

    expect_refused("empty file", "", 0, "too short");
    expect_refused("short magic", "\x93NUM", 4, "too short");
    expect_refused("bad magic", "PK\x03\x04 this is a zip file", 22, "does not start");
    expect_refused("text file", "1.0 2.0 3.0\n", 12, "not a .npy file");
    expect_refused("version 4.0", "\x93NUMPY\x04\x00\x10\x00{}", 12, "version 4.0");
    expect_refused("version 1.1", "\x93NUMPY\x01\x01\x10\x00{}", 12, "version 1.1");
    expect_refused("truncated preamble", "\x93NUMPY\x02\x00\x10\x00", 10, "preamble");
    expect_refused("header past the end", "\x93NUMPY\x01\x00\xff\x00{'descr'", 17, "truncated");
    expect_refused("header too large", "\x93NUMPY\x02\x00\x00\x00\x00\x10{}", 14, "larger than");
    printf("refusals: %zu malformed or unsupported files\n", sizeof bad / sizeof bad[0] + 10);
}

/* Mutations of valid files: every answer is a clean accept or a clean refusal (and, under a memory
 * checker, no read outside the buffer: each attempt parses an exact-size heap copy). */
static void test_fuzz(void)
{
    static const char *seeds[] = {
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }          \n",
        "{'shape': (3,), 'descr': '<i8', 'fortran_order': False}\n",
        "{\"descr\": \"<u2\", \"fortran_order\": False, \"shape\": (1, 1, 2)}\n",
    };
    oracle_rng rng = {12345};
    int accepted = 0, refused = 0;
    for (int iter = 0; iter < 30000; iter++) {
        const char *seed = seeds[iter % 3];
        const size_t len = strlen(seed);
        size_t size = 10 + len + 24;
        unsigned char *file = xmalloc(size);
        memcpy(file, "\x93NUMPY\x01\x00", 8);
        file[8] = (unsigned char)len;
        file[9] = 0;
        memcpy(file + 10, seed, len);
        memset(file + 10 + len, 0, 24);
        const int mutations = 1 + (int)oracle_rng_below(&rng, 4);
        for (int m = 0; m < mutations; m++) {
            const size_t at = (size_t)oracle_rng_below(&rng, 10 + len);
            switch (oracle_rng_below(&rng, 4)) {
            case 0: file[at] = (unsigned char)oracle_rng_below(&rng, 256); break;
            case 1: file[at] = (unsigned char)"{}()[],:' \"0123456789LTrueFalse<>|=fiuVO\n"[oracle_rng_below(&rng, 42)]; break;
            case 2: size = (size_t)oracle_rng_below(&rng, size + 1); break;
            default: file[at] ^= (unsigned char)(1u << oracle_rng_below(&rng, 8)); break;
            }
        }
        unsigned char *copy = xmalloc(size);
        memcpy(copy, file, size);
        npy_header h;
        char err[NPY_ERROR_SIZE] = "";
        if (npy_parse_memory(copy, size, &h, err, sizeof err) == 0) {
            accepted++;
            CHECK(h.data_offset + h.data_bytes == size, "fuzz %d: accepted with inconsistent sizes", iter);
        } else {
            refused++;
            CHECK(strncmp(err, "<memory>: ", 10) == 0 && strlen(err) > 12, "fuzz %d: bad message \"%s\"", iter, err);
        }
        free(copy);
        free(file);
    }
    printf("fuzz: 30000 mutated headers, %d accepted, %d refused cleanly\n", accepted, refused);
}

/* ---- reading files: the file name in every message ---- */
static void test_read_errors(void)
{
    char path[1024], err[NPY_ERROR_SIZE];
    npy_array a;
    snprintf(path, sizeof path, "%s/does_not_exist.npy", tmpdir());
    CHECK(npy_read(path, &a, err, sizeof err) != 0 && strstr(err, path) == err && strstr(err, "cannot open"),
          "missing file: %s", err);
    CHECK(npy_read(tmpdir(), &a, err, sizeof err) != 0 && strstr(err, "not a regular file"), "folder: %s", err);
    snprintf(path, sizeof path, "%s/short.npy", tmpdir());
    FILE *f = fopen(path, "wb");
    static const char image[] = "\x93NUMPY\x01\x00\x39\x00{'descr': '<f4', 'fortran_order': False, 'shape': (100,)}";
    fwrite(image, 1, sizeof image - 1, f);
    fclose(f);
    CHECK(npy_read(path, &a, err, sizeof err) != 0 && strstr(err, path) == err && strstr(err, "truncated"),
          "truncated: %s", err);
    remove(path);
    snprintf(path, sizeof path, "%s/no_such_dir/x.npy", tmpdir());
    const int64_t shape[1] = {1};
    const float one = 1.0f;
    CHECK(npy_write(path, NPY_T_F32, 1, shape, &one, 0, err, sizeof err) != 0 && strstr(err, path) == err,
          "unwritable: %s", err);
}

/* ---- conversions ---- */
static void test_conversions(void)
{
    char err[NPY_ERROR_SIZE];
    /* a double just above a bf16 tie: one rounding goes up; rounding through float first would tie to even */
    const double one = 1.0, ulp_bf16 = 0x1p-7, ulp_f16 = 0x1p-10;
    CHECK(npy_f64_to_bf16(one + ulp_bf16 / 2 + 0x1p-40) == moe_f32_to_bf16(1.0f + 0x1p-7f), "bf16 single rounding");
    CHECK(npy_f64_to_bf16(one + ulp_bf16 / 2) == moe_f32_to_bf16(1.0f), "bf16 tie to even");
    CHECK(npy_f64_to_bf16(one + ulp_bf16 / 2 - 0x1p-40) == moe_f32_to_bf16(1.0f), "bf16 below the tie");
    CHECK(npy_f64_to_f16(one + ulp_f16 / 2 + 0x1p-40) == moe_f32_to_f16(1.0f + 0x1p-10f), "f16 single rounding");
    CHECK(npy_f64_to_f16(one + 3 * ulp_f16 / 2) == moe_f32_to_f16(1.0f + 0x1p-9f), "f16 tie to even (up)");
    CHECK(npy_f64_to_f16(-(one + ulp_f16 / 2 + 0x1p-40)) == moe_f32_to_f16(-1.0f - 0x1p-10f), "f16 negative");
    CHECK(npy_f64_to_f16(70000.0) == 0x7c00 && npy_f64_to_f16(-1e300) == 0xfc00, "f16 overflow");
    CHECK(npy_f64_to_bf16(1e300) == 0x7f80, "bf16 overflow");
    CHECK(npy_f64_to_f16(0x1p-26) == 0 && npy_f64_to_f16(0x1p-25 + 0x1p-40) == 1, "f16 underflow");
    CHECK(isnan(moe_bf16_to_f32(npy_f64_to_bf16(NAN))) && isnan(moe_f16_to_f32(npy_f64_to_f16(NAN))), "NaN");
    CHECK(npy_f64_to_f32(0x1.ffffffp127) == INFINITY && npy_f64_to_f32(0x1.fffffefp127) == FLT_MAX,
          "f32 overflow threshold");
    CHECK(npy_f64_to_f32(1.0 + 0x1p-24 + 0x1p-50) == 1.0f + 0x1p-23f, "f32 rounding");

    /* npy_to_dtype: every floating source to every dtype, and the refusals */
    const double values[] = {1.0, -2.5, 1.0 + 0x1p-9, 3.0e-3, 65504.0, 0.0};
    const int n = 6;
    npy_array a;
    for (int src = 0; src < 3; src++) {
        const npy_type t = src == 0 ? NPY_T_F16 : src == 1 ? NPY_T_F32 : NPY_T_F64;
        a.h.type = t;
        a.h.count = n;
        a.data = xmalloc(8 * (size_t)n);
        for (int i = 0; i < n; i++) {
            if (t == NPY_T_F16)
                ((uint16_t *)a.data)[i] = npy_f64_to_f16(values[i]);
            else if (t == NPY_T_F32)
                ((float *)a.data)[i] = (float)values[i];
            else
                ((double *)a.data)[i] = values[i];
        }
        for (int d = 0; d < 3; d++) {
            const moe_dtype dtype = (moe_dtype)d;
            unsigned char out[64];
            int64_t rounded = -1;
            CHECK(npy_to_dtype(&a, "a.npy", dtype, out, &rounded, err, sizeof err) == 0, "%s", err);
            for (int i = 0; i < n; i++) {
                const double src_value = npy_get(&a, i, MOE_BF16);
                const double want = dtype == MOE_F32 ? (double)npy_f64_to_f32(src_value)
                                    : dtype == MOE_BF16 ? (double)moe_bf16_to_f32(npy_f64_to_bf16(src_value))
                                                        : (double)moe_f16_to_f32(npy_f64_to_f16(src_value));
                const double got = oracle_load(dtype, out, i);
                CHECK(got == want, "%s -> %s [%d]: %.9g, want %.9g", npy_type_name(t), moe_dtype_name(dtype), i,
                      got, want);
            }
            CHECK(rounded >= 0, "rounded count");
        }
        free(a.data);
    }
    uint16_t bits[2] = {0x3f80, 0xc000}; /* bf16 1.0, -2.0 */
    a.h.type = NPY_T_U16;
    a.h.count = 2;
    a.data = bits;
    uint16_t out16[2];
    float out32[2];
    CHECK(npy_to_dtype(&a, "p.npy", MOE_BF16, out16, NULL, err, sizeof err) == 0 && out16[0] == 0x3f80 &&
              out16[1] == 0xc000, "patterns kept");
    CHECK(npy_get(&a, 1, MOE_BF16) == -2.0, "pattern decode bf16");
    CHECK(npy_to_dtype(&a, "p.npy", MOE_F32, out32, NULL, err, sizeof err) != 0 && strstr(err, "p.npy: ") == err &&
              strstr(err, "--dtype bf16"), "patterns as f32: %s", err);
    int64_t ints[2] = {3, -4}, out64[2];
    a.h.type = NPY_T_I64;
    a.data = ints;
    CHECK(npy_to_dtype(&a, "i.npy", MOE_F32, out32, NULL, err, sizeof err) != 0 && strstr(err, "i.npy: ") == err &&
              strstr(err, "floating-point"), "ints as floats: %s", err);
    CHECK(npy_to_int64(&a, "i.npy", out64, err, sizeof err) == 0 && out64[1] == -4, "int64");
    int32_t ints32[2] = {7, -8};
    a.h.type = NPY_T_I32;
    a.data = ints32;
    CHECK(npy_to_int64(&a, "i.npy", out64, err, sizeof err) == 0 && out64[0] == 7 && out64[1] == -8, "int32");
    float floats[2] = {1, 2};
    a.h.type = NPY_T_F32;
    a.data = floats;
    CHECK(npy_to_int64(&a, "f.npy", out64, err, sizeof err) != 0 && strstr(err, "f.npy: expected an int32 or int64"),
          "floats as ints: %s", err);
    printf("conversions: single rounding from float64, every source to every dtype, refusals\n");
}

/* ---------------------------------------------------------------------------------------------------
 * Helper modes for the shell tests
 * ------------------------------------------------------------------------------------------------- */
static int parse_descr_arg(const char *descr, npy_type *type)
{
    for (int t = 0; t < NPY_T_COUNT; t++)
        if (strcmp(descr, npy_type_descr((npy_type)t)) == 0) {
            *type = (npy_type)t;
            return 1;
        }
    return 0;
}

static int mk(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: test_cli_npy mk FILE DESCR SHAPE [v1|v2|v3] VALUE...\n");
        return 2;
    }
    npy_type type;
    if (!parse_descr_arg(argv[2], &type)) {
        fprintf(stderr, "mk: unknown descr %s\n", argv[2]);
        return 2;
    }
    int64_t shape[NPY_MAX_DIMS], count = 1;
    int ndim = 0;
    for (const char *p = argv[3]; *p;) {
        char *end;
        shape[ndim] = strtoll(p, &end, 10);
        count *= shape[ndim++];
        p = *end == ',' ? end + 1 : end;
        if (end == p && *p) {
            fprintf(stderr, "mk: bad shape %s\n", argv[3]);
            return 2;
        }
    }
    int first = 4, version = 1;
    if (argc > 4 && argv[4][0] == 'v' && argv[4][1] >= '1' && argv[4][1] <= '3' && argv[4][2] == '\0') {
        version = argv[4][1] - '0';
        first = 5;
    }
    const int nvalues = argc - first;
    if (count > 0 && nvalues == 0) {
        fprintf(stderr, "mk: no values\n");
        return 2;
    }
    unsigned char *data = xmalloc((size_t)count * npy_type_size(type));
    for (int64_t i = 0; i < count; i++) {
        const char *s = argv[first + i % nvalues];
        const double v = strtod(s, NULL);
        const long long iv = strtoll(s, NULL, 0);
        switch (type) {
        case NPY_T_F16: ((uint16_t *)data)[i] = npy_f64_to_f16(v); break;
        case NPY_T_F32: ((float *)data)[i] = npy_f64_to_f32(v); break;
        case NPY_T_F64: ((double *)data)[i] = v; break;
        case NPY_T_I32: ((int32_t *)data)[i] = (int32_t)iv; break;
        case NPY_T_I64: ((int64_t *)data)[i] = (int64_t)iv; break;
        case NPY_T_U16:
        case NPY_T_V2: ((uint16_t *)data)[i] = (uint16_t)iv; break;
        case NPY_T_COUNT: break;
        }
    }
    char err[NPY_ERROR_SIZE];
    int rc = npy_write(argv[1], type, ndim, shape, data, version, err, sizeof err);
    free(data);
    if (rc != 0) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    return 0;
}

static int info(const char *path)
{
    npy_array a;
    char err[NPY_ERROR_SIZE], shape[512];
    if (npy_read(path, &a, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    printf("%s %s\n", npy_type_descr(a.h.type), npy_format_shape(shape, sizeof shape, a.h.ndim, a.h.shape));
    npy_free(&a);
    return 0;
}

static void save(const char *dir, const char *name, npy_type type, int ndim, const int64_t *shape, const void *data)
{
    char path[1024], err[NPY_ERROR_SIZE];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (npy_write(path, type, ndim, shape, data, 2, err, sizeof err) != 0) { /* format 2.0: the CLI reads it */
        fprintf(stderr, "%s\n", err);
        exit(2);
    }
}

/* Saves a result of dtype as float32 (what the CLI writes without --raw), and with raw as the dtype. */
static void save_result(const char *dir, const char *name, moe_dtype dtype, int raw, int ndim, const int64_t *shape,
                        const void *data)
{
    int64_t count = 1;
    for (int d = 0; d < ndim; d++)
        count *= shape[d];
    if (raw) {
        save(dir, name, dtype == MOE_F32 ? NPY_T_F32 : dtype == MOE_F16 ? NPY_T_F16 : NPY_T_U16, ndim, shape, data);
        return;
    }
    float *f = xmalloc((size_t)count * 4);
    for (int64_t i = 0; i < count; i++)
        f[i] = (float)oracle_load(dtype, data, i);
    save(dir, name, NPY_T_F32, ndim, shape, f);
    free(f);
}

static void must(moe_status status, const char *what)
{
    if (status != MOE_OK) {
        fprintf(stderr, "gen: %s: %s\n", what, moe_last_error());
        exit(2);
    }
}

/*
 * gen DIR SEED DTYPE: T = 7 tokens, k = 2, E = 4 experts (expert 3 gets no rows), N = 5, K = 6.
 * Inputs, in the form the CLI reads for DTYPE (float32 '<f4' for f32, float16 '<f2' for f16, uint16
 * bf16 patterns '<u2' for bf16):
 *   ids.npy (T,k) int32, m_sizes.npy (E,) int32, gather.npy (M,) int64, x_tok.npy (T,K) [split as
 *   (7,1,6)], x_exp.npy (M,K), w.npy (E,N,K), dy.npy (M,N), tw.npy (T,k)
 * plus float32 / float64 copies that are NOT representable in DTYPE (x_tok_f32.npy, w_f64.npy: the CLI
 * rounds them on load) and the routing the library builds (route_m_sizes/gather/scatter.npy, int64).
 * Expected outputs of the library called directly, for every PX PY TW in {0,1}^3 (permute_x,
 * permute_y, topk weights), float32 like the CLI writes:
 *   y_PXPYTW.npy  dx_PXPYTW.npy  dxr_PXPYTW.npy (reduce_topk)  dw_PXPYTW.npy  dwf_PXPYTW.npy (dw_fp32)
 *   dtw_PXPYTW.npy (topk-weight gradient, (T,k))
 * and y_raw_111.npy (--raw), y_bound_111.npy (the oracle bound, float64), y_rounded_000.npy (from the
 * rounded float32/float64 copies, with x_tok_f32 and permute_x: named y_rounded_100.npy).
 */
static int gen(const char *dir, uint64_t seed, const char *dtype_name)
{
    moe_dtype dtype;
    if (strcmp(dtype_name, "f32") == 0)
        dtype = MOE_F32;
    else if (strcmp(dtype_name, "f16") == 0)
        dtype = MOE_F16;
    else if (strcmp(dtype_name, "bf16") == 0)
        dtype = MOE_BF16;
    else {
        fprintf(stderr, "gen: unknown dtype %s\n", dtype_name);
        return 2;
    }
    mkdir(dir, 0777);
    enum { T = 7, k = 2, E = 4, N = 5, K = 6, M = T * k };
    oracle_rng rng = {seed};
    int32_t ids[M], m32[E];
    int64_t ids64[M], m_sizes[E], gather[M], scatter[M];
    for (int s = 0; s < M; s++)
        ids64[s] = ids[s] = (int32_t)oracle_rng_below(&rng, E - 1); /* expert E-1 gets no rows */
    must(moe_routing_from_topk(T, k, E, ids64, m_sizes, gather, scatter), "routing");
    for (int e = 0; e < E; e++)
        m32[e] = (int32_t)m_sizes[e];
    const int64_t s_ids[2] = {T, k}, s_e[1] = {E}, s_m[1] = {M};
    save(dir, "ids.npy", NPY_T_I32, 2, s_ids, ids);
    save(dir, "m_sizes.npy", NPY_T_I32, 1, s_e, m32);
    save(dir, "gather.npy", NPY_T_I64, 1, s_m, gather);
    save(dir, "route_m_sizes.npy", NPY_T_I64, 1, s_e, m_sizes);
    save(dir, "route_gather_indices.npy", NPY_T_I64, 1, s_m, gather);
    save(dir, "route_scatter_indices.npy", NPY_T_I64, 1, s_m, scatter);

    const size_t es = moe_dtype_size(dtype);
    void *x_tok = xmalloc(T * K * es), *x_exp = xmalloc(M * K * es), *w = xmalloc(E * N * K * es);
    void *dy = xmalloc(M * N * es), *tw = xmalloc(M * es);
    oracle_fill(&rng, dtype, x_tok, T * K, 0);
    oracle_fill(&rng, dtype, x_exp, M * K, 2);
    oracle_fill(&rng, dtype, w, E * N * K, 0);
    oracle_fill(&rng, dtype, dy, M * N, 0);
    oracle_fill(&rng, dtype, tw, M, 0);
    const npy_type in_type = dtype == MOE_F32 ? NPY_T_F32 : dtype == MOE_F16 ? NPY_T_F16 : NPY_T_U16;
    const int64_t s_xtok[3] = {T, 1, K}, s_xexp[2] = {M, K}, s_w[3] = {E, N, K}, s_dy[2] = {M, N};
    save(dir, "x_tok.npy", in_type, 3, s_xtok, x_tok);
    save(dir, "x_exp.npy", in_type, 2, s_xexp, x_exp);
    save(dir, "w.npy", in_type, 3, s_w, w);
    save(dir, "dy.npy", in_type, 2, s_dy, dy);
    save(dir, "tw.npy", in_type, 2, s_ids, tw);

    void *out = xmalloc(E * N * K * 4 + M * K * 4 + 64);
    char name[64];
    moe_routing routing = {T, k, E, m_sizes, gather};
    for (int combo = 0; combo < 8; combo++) {
        moe_gemm_options o = {0};
        o.dtype = dtype;
        o.permute_x = combo >> 2 & 1;
        o.permute_y = combo >> 1 & 1;
        const void *weights = combo & 1 ? tw : NULL;
        const void *x = o.permute_x ? x_tok : x_exp;
        const char *tag = (const char *[]){"000", "001", "010", "011", "100", "101", "110", "111"}[combo];
        const int64_t s_y[2] = {M, N}, s_dx[2] = {M, K}, s_dxr[2] = {T, K};

        must(moe_gemm_fwd(MOE_BACKEND_REF, &routing, N, K, x, w, weights, out, &o), "fwd");
        snprintf(name, sizeof name, "y_%s.npy", tag);
        save_result(dir, name, dtype, 0, 2, s_y, out);
        if (combo == 7) {
            save_result(dir, "y_raw_111.npy", dtype, 1, 2, s_y, out);
            double *value = xmalloc(M * N * 8), *bound = xmalloc(M * N * 8);
            oracle_gemm_fwd(&routing, N, K, x, w, weights, NULL, &o, value, bound);
            save(dir, "y_bound_111.npy", NPY_T_F64, 2, s_y, bound);
            free(value);
            free(bound);
        }

        must(moe_gemm_dx(MOE_BACKEND_REF, &routing, N, K, dy, w, weights, out, &o), "dx");
        snprintf(name, sizeof name, "dx_%s.npy", tag);
        save_result(dir, name, dtype, 0, 2, s_dx, out);
        o.reduce_topk = 1;
        must(moe_gemm_dx(MOE_BACKEND_REF, &routing, N, K, dy, w, weights, out, &o), "dx reduce");
        snprintf(name, sizeof name, "dxr_%s.npy", tag);
        save_result(dir, name, dtype, 0, 2, s_dxr, out);
        o.reduce_topk = 0;

        must(moe_gemm_dw(MOE_BACKEND_REF, &routing, N, K, x, dy, weights, out, &o), "dw");
        snprintf(name, sizeof name, "dw_%s.npy", tag);
        save_result(dir, name, dtype, 0, 3, s_w, out);
        must(moe_gemm_topk_weights_grad(MOE_BACKEND_REF, &routing, N, K, x, w, dy, out, &o), "dtw");
        snprintf(name, sizeof name, "dtw_%s.npy", tag);
        save_result(dir, name, dtype, 0, 2, s_ids, out);
        o.dw_fp32 = 1;
        must(moe_gemm_dw(MOE_BACKEND_REF, &routing, N, K, x, dy, weights, out, &o), "dw fp32");
        snprintf(name, sizeof name, "dwf_%s.npy", tag);
        save_result(dir, name, MOE_F32, 0, 3, s_w, out);
    }

    /* float32 / float64 copies off the dtype's grid; the expected output uses the single rounding */
    float *x_f32 = xmalloc(T * K * 4);
    double *w_f64 = xmalloc(E * N * K * 8);
    void *x_r = xmalloc(T * K * es), *w_r = xmalloc(E * N * K * es);
    for (int i = 0; i < T * K; i++) {
        x_f32[i] = (float)oracle_rng_symmetric(&rng);
        if (dtype == MOE_F32)
            ((float *)x_r)[i] = x_f32[i];
        else
            ((uint16_t *)x_r)[i] = dtype == MOE_F16 ? npy_f64_to_f16(x_f32[i]) : npy_f64_to_bf16(x_f32[i]);
    }
    for (int i = 0; i < E * N * K; i++) {
        w_f64[i] = oracle_rng_symmetric(&rng);
        if (dtype == MOE_F32)
            ((float *)w_r)[i] = npy_f64_to_f32(w_f64[i]);
        else
            ((uint16_t *)w_r)[i] = dtype == MOE_F16 ? npy_f64_to_f16(w_f64[i]) : npy_f64_to_bf16(w_f64[i]);
    }
    const int64_t s_xt2[2] = {T, K}, s_y[2] = {M, N};
    save(dir, "x_tok_f32.npy", NPY_T_F32, 2, s_xt2, x_f32);
    save(dir, "w_f64.npy", NPY_T_F64, 3, s_w, w_f64);
    moe_gemm_options o = {0};
    o.dtype = dtype;
    o.permute_x = 1;
    must(moe_gemm_fwd(MOE_BACKEND_REF, &routing, N, K, x_r, w_r, NULL, out, &o), "fwd rounded");
    save_result(dir, "y_rounded_100.npy", dtype, 0, 2, s_y, out);

    free(x_tok), free(x_exp), free(w), free(dy), free(tw), free(out);
    free(x_f32), free(w_f64), free(x_r), free(w_r);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "mk") == 0)
        return mk(argc - 1, argv + 1);
    if (argc == 3 && strcmp(argv[1], "info") == 0)
        return info(argv[2]);
    if (argc == 5 && strcmp(argv[1], "gen") == 0)
        return gen(argv[2], strtoull(argv[3], NULL, 0), argv[4]);
    if (argc > 1) {
        fprintf(stderr, "usage: test_cli_npy [mk FILE DESCR SHAPE [v1|v2|v3] VALUE... | info FILE | gen DIR SEED DTYPE]\n");
        return 2;
    }
    test_round_trips();
    test_accepted_headers();
    test_refusals();
    test_fuzz();
    test_read_errors();
    test_conversions();
    rmdir(tmpdir());
    if (failures) {
        printf("%d checks failed\n", failures);
        return 1;
    }
    printf("all npy checks passed\n");
    return 0;
}
