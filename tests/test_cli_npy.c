/*
 * Tests of cli/npy.c (the moe tool's .npy reader/writer), and the helper the tests/test_cli_*.sh scripts
 * use to make .npy files without numpy (its modes: tests/cli_fixtures.c).
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
 *   test_cli_npy genmlp DIR SEED DTYPE    random blockwise MoE MLP problems in DIR/CASE/, one per set of
 *                                         mlp options, and the library's outputs (see gen_mlp() below)
 */
#include "moe.h"
#include "moe_mlp.h"
#include "../cli/npy.h"
#include "mlp_testlib.h"
#include "oracle.h"
#include "alloc.h"
#include "check.h"
#include "cli_fixtures.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
    CHECK(npy_read(tmpdir(), &a, err, sizeof err) != 0 && strstr(err, "not a regular file (a folder)"), "folder: %s",
          err);
    /* a FIFO without a writer: refused at once (opening it for reading would wait for a writer) */
    snprintf(path, sizeof path, "%s/fifo.npy", tmpdir());
    CHECK(mkfifo(path, 0600) == 0, "mkfifo %s: %s", path, strerror(errno));
    CHECK(npy_read(path, &a, err, sizeof err) != 0 && strstr(err, path) == err &&
              strstr(err, "not a regular file (a FIFO)"), "FIFO: %s", err);
    remove(path);
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

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "mk") == 0)
        return mk(argc - 1, argv + 1);
    if (argc == 3 && strcmp(argv[1], "info") == 0)
        return info(argv[2]);
    if (argc == 5 && strcmp(argv[1], "gen") == 0)
        return gen(argv[2], strtoull(argv[3], NULL, 0), argv[4]);
    if (argc == 5 && strcmp(argv[1], "genmlp") == 0)
        return gen_mlp(argv[2], strtoull(argv[3], NULL, 0), argv[4]);
    if ((argc == 6 || argc == 8) && strcmp(argv[1], "relayout") == 0)
        return relayout(argc - 2, argv + 2);
    if (argc > 1) {
        fprintf(stderr, "usage: test_cli_npy [mk FILE DESCR SHAPE [v1|v2|v3] VALUE... | info FILE | gen DIR SEED DTYPE | "
                        "genmlp DIR SEED DTYPE | relayout IN OUT AXES SHAPE [PART PARTS]]\n");
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
        printf("%ld checks failed\n", failures);
        return 1;
    }
    printf("all npy checks passed\n");
    return 0;
}
