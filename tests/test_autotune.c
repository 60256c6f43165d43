/* The autotune cache and table (src/autotune.c), without a GPU:
 *   1. a formatted line parses back to the same key and choice (random keys and choices);
 *   2. every field of a line, made invalid in turn, is refused with a message naming that field, and so are
 *      wrong field counts, a wrong version, over-long lines and configurations the kernels do not have;
 *      version-1 lines (no dw_pingpong field) are still accepted, with dw_pingpong -1, and their fields named
 *      by their own numbers;
 *   3. moe_gemm_autotune_load skips comments, blank lines and CRLF ends, lets a later line of a key replace
 *      an earlier one, and is all or nothing: a malformed line (reported as FILE:LINE) leaves the table
 *      unchanged; a missing file is MOE_ERR_IO; moe_gemm_autotune_clear empties the table;
 *   4. moe_gemm_autotune refuses a bad op, repeats outside 1 .. 1000 and accumulate, and reports
 *      MOE_ERR_NO_BACKEND where no CUDA device is usable;
 *   5. the table under concurrent use: threads storing, replacing and looking up their own keys while
 *      others do the same end with every key holding its thread's last choice;
 *   6. mutated lines (random bytes replaced, inserted or deleted in valid lines; run under ASan in CI):
 *      the parser never reads past a line, and a line it accepts formats back to a line that parses to
 *      the same entry. */
#include "check.h"
#include "moe.h"
#include "moe_backend.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

static const char *const field_names[] = {"version", "device", "op", "dtype", "out_dtype", "permute_x", "permute_y",
                                          "reduce_topk", "weighted", "allow_tf32", "E", "M", "N", "K", "kernel",
                                          "tile_rows", "cluster", "tma_store", "dw_pingpong", "median_us"};
enum { FIELDS = sizeof field_names / sizeof field_names[0] };

static uint64_t rng_state = 0x5eed1234abcdULL;
static uint64_t next_random(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* A key some call makes: reduce_topk only for dx, allow_tf32 only for f32, out_dtype = dtype except f32 for dw. */
static moe_tune_key sample_key(int i)
{
    moe_tune_key key;
    memset(&key, 0, sizeof key);
    snprintf(key.device, sizeof key.device, "%s", i % 2 ? "NVIDIA H100 80GB HBM3" : "NVIDIA H200");
    key.op = (int)(next_random() % 3);
    key.dtype = (moe_dtype)(next_random() % 3);
    key.out_dtype = (moe_dtype)(next_random() % 3);
    key.permute_x = (int)(next_random() % 2), key.permute_y = (int)(next_random() % 2);
    key.reduce_topk = (int)(next_random() % 2), key.weighted = (int)(next_random() % 2);
    key.allow_tf32 = (int)(next_random() % 2);
    key.reduce_topk &= key.op == MOE_GEMM_DX;
    key.allow_tf32 &= key.dtype == MOE_F32;
    if (!(key.op == MOE_GEMM_DW && key.out_dtype == MOE_F32))
        key.out_dtype = key.dtype;
    key.E = 1 + (int64_t)(next_random() % 300);
    key.M = (int64_t)(next_random() % ((int64_t)1 << 40));
    key.N = 8 * (int64_t)(next_random() % 4096);
    key.K = i == 0 ? INT64_MAX : 8 * (int64_t)(next_random() % 4096);
    return key;
}

/* A configuration the kernels have, for the key's op and dtype. */
static moe_tune_choice sample_choice(const moe_tune_key *key)
{
    moe_tune_choice c = {MOE_TUNE_SM90, 128, 1, 1, 0, 0.0};
    const int sm90 = key->dtype != MOE_F32 && !(key->op == MOE_GEMM_DW && key->weighted && key->dtype == MOE_F16);
    switch (next_random() % 4 | (sm90 ? 0 : 2)) {
    case 0: c.tile_rows = key->op == MOE_GEMM_DW ? 128 : 256; break;
    case 1: c.cluster = key->op == MOE_GEMM_DW ? 1 : 2, c.tma_store = 0; break;
    case 2: c.kernel = MOE_TUNE_SM80, c.tma_store = 0; break;
    default: c.kernel = MOE_TUNE_SIMT, c.tile_rows = 64, c.tma_store = 0; break;
    }
    c.dw_pingpong = (int)(next_random() % 3) - 1; /* 1 only where the ping-pong kernel exists */
    if (c.dw_pingpong == 1 && !(c.kernel == MOE_TUNE_SM90 && key->op == MOE_GEMM_DW && c.tma_store && !key->weighted))
        c.dw_pingpong = 0;
    c.median_us = (double)(next_random() % 10000000) / 1000.0;
    return c;
}

static int same_key(const moe_tune_key *a, const moe_tune_key *b)
{
    return strcmp(a->device, b->device) == 0 && a->op == b->op && a->dtype == b->dtype && a->out_dtype == b->out_dtype &&
           a->permute_x == b->permute_x && a->permute_y == b->permute_y && a->reduce_topk == b->reduce_topk &&
           a->weighted == b->weighted && a->allow_tf32 == b->allow_tf32 && a->E == b->E && a->M == b->M &&
           a->N == b->N && a->K == b->K;
}

static int same_choice(const moe_tune_choice *a, const moe_tune_choice *b)
{
    return a->kernel == b->kernel && a->tile_rows == b->tile_rows && a->cluster == b->cluster &&
           a->tma_store == b->tma_store && a->dw_pingpong == b->dw_pingpong && a->median_us == b->median_us;
}

static void round_trip(void)
{
    for (int i = 0; i < 500; i++) {
        const moe_tune_key key = sample_key(i);
        const moe_tune_choice choice = sample_choice(&key);
        char line[512], why[200] = "";
        moe_tune_format_line(&key, &choice, line, sizeof line);
        moe_tune_key key2;
        moe_tune_choice choice2;
        const int ok = moe_tune_parse_line(line, &key2, &choice2, why, sizeof why);
        CHECK(ok, "round trip %d: %s refused: %s", i, line, why);
        CHECK(!ok || (same_key(&key, &key2) && same_choice(&choice, &choice2)), "round trip %d: %s changed", i, line);
    }
}

/* Splits a line at '|' into fields (of a static buffer). */
static int split(const char *line, char fields[FIELDS + 2][128])
{
    int count = 0;
    const char *start = line;
    for (;;) {
        const char *bar = strchr(start, '|');
        const size_t length = bar ? (size_t)(bar - start) : strlen(start);
        if (count < FIELDS + 2) {
            snprintf(fields[count], 128, "%.*s", (int)length, start);
        }
        count++;
        if (!bar)
            return count;
        start = bar + 1;
    }
}

static void join(char fields[FIELDS + 2][128], int count, char *line, size_t size)
{
    line[0] = '\0';
    for (int f = 0; f < count; f++) {
        strncat(line, fields[f], size - strlen(line) - 1);
        if (f + 1 < count)
            strncat(line, "|", size - strlen(line) - 1);
    }
}

static void expect_refused(const char *line, const char *needle, const char *what)
{
    moe_tune_key key;
    moe_tune_choice choice;
    char why[200] = "";
    const int ok = moe_tune_parse_line(line, &key, &choice, why, sizeof why);
    CHECK(!ok, "%s: accepted: %s", what, line);
    CHECK(ok || strstr(why, needle) != NULL, "%s: message \"%s\" does not name \"%s\"", what, why, needle);
}

/* A line of the cache format with some fields replaced (NULL: the good line's), and what its refusal must
 * name (NULL: it must parse, with its dw_pingpong as written). */
enum { F_OP = 2, F_DTYPE, F_OUT, F_REDUCE = 7, F_WEIGHTED, F_TF32, F_KERNEL = 14, F_ROWS, F_CLUSTER, F_TMA, F_PINGPONG };
typedef struct line_edit {
    const char *value[FIELDS];
    const char *needle;
} line_edit;

static void check_edits(const char *good, const line_edit *edits, size_t count, const char *what)
{
    char fields[FIELDS + 2][128], line[1024], why[200] = "";
    for (size_t i = 0; i < count; i++) {
        CHECK(split(good, fields) == FIELDS, "split");
        for (int f = 0; f < FIELDS; f++)
            if (edits[i].value[f] != NULL)
                snprintf(fields[f], 128, "%s", edits[i].value[f]);
        join(fields, FIELDS, line, sizeof line);
        if (edits[i].needle != NULL) {
            expect_refused(line, edits[i].needle, what);
            continue;
        }
        moe_tune_key key;
        moe_tune_choice choice;
        const int ok = moe_tune_parse_line(line, &key, &choice, why, sizeof why);
        CHECK(ok && choice.dw_pingpong == atoi(fields[F_PINGPONG]), "%s refused or changed: %s", line, why);
    }
}

static void bad_fields(void)
{
    const char *good = "libmoe-tune 2|NVIDIA H100 80GB HBM3|fwd|bf16|bf16|0|0|0|0|0|128|32768|1536|2048|sm90|128|1|1|0|12.5";
    moe_tune_key key;
    moe_tune_choice choice;
    char why[200] = "";
    CHECK(moe_tune_parse_line(good, &key, &choice, why, sizeof why), "good line refused: %s", why);
    /* bad values per field (field 0 is the version); a leading tab or space was accepted by strtoll /
     * strtod where the rest of the format has no blanks */
    static const char *const bad_value[FIELDS][4] = {
        {"libmoe-tune 3", "libmoe-tune", ""},
        {"", "0123456789012345678901234567890123456789012345678901234567890123456789012345678901234", NULL},
        {"bwd", "FWD", ""},
        {"fp32", "", "bf8"},
        {"f64", "BF16", ""},
        {"2", "-1", "x"},
        {"2", "", "01x"},
        {"3", " 1", "+1"},
        {"yes", "", "1.0"},
        {"10", "", "-0x1"},
        {"0", "-5", "1e3"},
        {"-1", "", "99999999999999999999", "\t8"},
        {"abc", "-8", "1 "},
        {"", "0x10", "9223372036854775808"},
        {"sm100", "SM90", ""},
        {"0", "2048", "12a"},
        {"3", "0", ""},
        {"2", "-1", ""},
        {"2", "-2", ""},
        {"-1", "nan", "inf", " 1"},
    };
    char fields[FIELDS + 2][128], line[1024];
    for (int f = 0; f < FIELDS; f++) {
        for (int v = 0; v < 4 && bad_value[f][v] != NULL; v++) {
            CHECK(split(good, fields) == FIELDS, "split");
            snprintf(fields[f], 128, "%s", bad_value[f][v]);
            join(fields, FIELDS, line, sizeof line);
            char what[64];
            snprintf(what, sizeof what, "field %s = \"%s\"", field_names[f], bad_value[f][v]);
            expect_refused(line, f == 0 ? "libmoe-tune 2|" : field_names[f], what);
        }
    }
    /* field counts */
    split(good, fields);
    join(fields, FIELDS - 1, line, sizeof line);
    expect_refused(line, "19 '|'-separated fields, expected 20", "one field missing");
    snprintf(line, sizeof line, "%s|7", good);
    expect_refused(line, "21 '|'-separated fields, expected 20", "one field too many");
    expect_refused("", "does not start", "empty line");
    /* an over-long line */
    char long_line[700];
    memset(long_line, 'a', sizeof long_line - 1);
    long_line[sizeof long_line - 1] = '\0';
    expect_refused(long_line, "longer than", "700-byte line");
    /* configurations the kernels do not have (needle: what the refusal names), and some they have (NULL):
     * the ping-pong kernel only for sm90 dw with TMA stores, dw_pingpong -1 (the rule) and 0 anywhere */
    static const line_edit configurations[] = {
        {{[F_OP] = "fwd", [F_KERNEL] = "sm90", [F_ROWS] = "192", [F_TMA] = "1", [F_PINGPONG] = "0"}, "128 or 256"},
        {{[F_OP] = "dw", [F_KERNEL] = "sm90", [F_ROWS] = "256", [F_TMA] = "1", [F_PINGPONG] = "0"}, "dw has 128-row"},
        {{[F_OP] = "fwd", [F_KERNEL] = "sm90", [F_ROWS] = "256", [F_CLUSTER] = "2", [F_TMA] = "0"}, "cluster 2"},
        {{[F_OP] = "dw", [F_KERNEL] = "sm90", [F_ROWS] = "128", [F_CLUSTER] = "2", [F_TMA] = "0"}, "cluster 2"},
        {{[F_OP] = "dx", [F_KERNEL] = "sm80", [F_ROWS] = "128", [F_CLUSTER] = "2", [F_TMA] = "0"}, "cluster 2"},
        {{[F_OP] = "fwd", [F_KERNEL] = "sm80", [F_ROWS] = "128", [F_TMA] = "1"}, "tma_store 1"},
        {{[F_OP] = "dx", [F_KERNEL] = "simt", [F_ROWS] = "64", [F_TMA] = "1"}, "tma_store 1"},
        {{[F_OP] = "fwd", [F_KERNEL] = "sm90", [F_ROWS] = "128", [F_TMA] = "1", [F_PINGPONG] = "1"}, "dw_pingpong 1"},
        {{[F_OP] = "dx", [F_KERNEL] = "sm90", [F_ROWS] = "256", [F_TMA] = "1", [F_PINGPONG] = "1"}, "dw_pingpong 1"},
        {{[F_OP] = "dw", [F_KERNEL] = "sm90", [F_ROWS] = "128", [F_TMA] = "0", [F_PINGPONG] = "1"}, "dw_pingpong 1"},
        {{[F_OP] = "dw", [F_KERNEL] = "sm80", [F_ROWS] = "128", [F_TMA] = "0", [F_PINGPONG] = "1"}, "dw_pingpong 1"},
        {{[F_OP] = "dw", [F_KERNEL] = "simt", [F_ROWS] = "64", [F_TMA] = "0", [F_PINGPONG] = "1"}, "dw_pingpong 1"},
        {{[F_OP] = "dw", [F_KERNEL] = "sm90", [F_ROWS] = "128", [F_TMA] = "1", [F_PINGPONG] = "1"}, NULL},
        {{[F_OP] = "dw", [F_KERNEL] = "sm90", [F_ROWS] = "128", [F_TMA] = "1", [F_PINGPONG] = "0"}, NULL},
        {{[F_OP] = "dw", [F_KERNEL] = "sm90", [F_ROWS] = "128", [F_TMA] = "0", [F_PINGPONG] = "-1"}, NULL},
        {{[F_OP] = "fwd", [F_KERNEL] = "sm90", [F_ROWS] = "256", [F_TMA] = "1", [F_PINGPONG] = "-1"}, NULL},
        {{[F_OP] = "dx", [F_KERNEL] = "sm80", [F_ROWS] = "128", [F_TMA] = "0", [F_PINGPONG] = "0"}, NULL},
        {{[F_OP] = "dw", [F_KERNEL] = "simt", [F_ROWS] = "64", [F_TMA] = "0", [F_PINGPONG] = "-1"}, NULL},
    };
    check_edits(good, configurations, sizeof configurations / sizeof configurations[0], "conflicting configuration");
    /* keys no call makes (needle: what the refusal names), with kernels they have, and some keys calls make
     * (the good line: fwd bf16 -> bf16 on sm90, tile_rows 128, tma_store 1) */
    static const line_edit keys[] = {
        {{[F_REDUCE] = "1"}, "reduce_topk 1"},
        {{[F_OP] = "dw", [F_REDUCE] = "1"}, "reduce_topk 1"},
        {{[F_OP] = "dw", [F_TF32] = "1"}, "allow_tf32 1"},
        {{[F_DTYPE] = "f16", [F_OUT] = "f16", [F_TF32] = "1", [F_KERNEL] = "sm80", [F_TMA] = "0"}, "allow_tf32 1"},
        {{[F_OUT] = "f32"}, "out_dtype"},
        {{[F_OP] = "dx", [F_DTYPE] = "f16", [F_OUT] = "f32", [F_KERNEL] = "sm80", [F_TMA] = "0"}, "out_dtype"},
        {{[F_OP] = "dw", [F_DTYPE] = "f32", [F_KERNEL] = "simt", [F_ROWS] = "64", [F_TMA] = "0"}, "out_dtype"},
        {{[F_OP] = "dw", [F_OUT] = "f16"}, "out_dtype"},
        {{[F_DTYPE] = "f32", [F_OUT] = "f32", [F_TF32] = "1", [F_TMA] = "0"}, "sm90 takes f16 and bf16"},
        {{[F_OP] = "dw", [F_DTYPE] = "f16", [F_OUT] = "f16", [F_WEIGHTED] = "1"}, "no f16 dw with topk weights"},
        {{[F_OP] = "dw", [F_WEIGHTED] = "1", [F_PINGPONG] = "1"}, "dw_pingpong 1 does not exist with topk"},
        {{[F_OP] = "dx", [F_REDUCE] = "1", [F_WEIGHTED] = "1", [F_ROWS] = "256", [F_TMA] = "0"}, NULL},
        {{[F_OP] = "dw", [F_OUT] = "f32", [F_WEIGHTED] = "1"}, NULL},
        {{[F_OP] = "dw", [F_DTYPE] = "f16", [F_OUT] = "f32", [F_WEIGHTED] = "1", [F_KERNEL] = "sm80", [F_TMA] = "0"},
         NULL},
        {{[F_OP] = "dw", [F_DTYPE] = "f32", [F_OUT] = "f32", [F_WEIGHTED] = "1", [F_TF32] = "1", [F_KERNEL] = "sm80",
          [F_TMA] = "0"},
         NULL},
        {{[F_DTYPE] = "f32", [F_OUT] = "f32", [F_KERNEL] = "simt", [F_ROWS] = "64", [F_TMA] = "0"}, NULL},
    };
    check_edits(good, keys, sizeof keys / sizeof keys[0], "key no call makes");
    /* the device name's limit, MOE_TUNE_DEVICE_CHARS (80 with its terminator): 79 characters kept, 80 refused */
    static const line_edit device_names[] = {
        {{[1] = "0123456789012345678901234567890123456789012345678901234567890123456789012345678"}, NULL},
        {{[1] = "01234567890123456789012345678901234567890123456789012345678901234567890123456789"}, "device"},
    };
    check_edits(good, device_names, sizeof device_names / sizeof device_names[0], "device name length");
}

/* Version-1 lines (19 fields, no dw_pingpong): accepted with dw_pingpong -1, the other fields as in version 2;
 * refused with 20 fields; a bad field named by its version-1 number; formatted back as version 2. */
static void version_1_lines(void)
{
    const char *v1 = "libmoe-tune 1|NVIDIA H100 80GB HBM3|dw|bf16|bf16|0|0|0|0|0|128|16384|1536|2048|sm90|128|1|1|12.5";
    const char *v2 = "libmoe-tune 2|NVIDIA H100 80GB HBM3|dw|bf16|bf16|0|0|0|0|0|128|16384|1536|2048|sm90|128|1|1|-1|12.500";
    moe_tune_key k1, k2;
    moe_tune_choice c1, c2;
    char why[200] = "", line[600];
    CHECK(moe_tune_parse_line(v1, &k1, &c1, why, sizeof why), "version-1 line refused: %s", why);
    CHECK(moe_tune_parse_line(v2, &k2, &c2, why, sizeof why), "version-2 line refused: %s", why);
    CHECK(c1.dw_pingpong == -1 && c1.median_us == 12.5 && c1.tma_store == 1 && same_key(&k1, &k2) &&
              same_choice(&c1, &c2),
          "version-1 line read as kernel %d rows %d cluster %d tma_store %d dw_pingpong %d %.3f us", (int)c1.kernel,
          c1.tile_rows, c1.cluster, c1.tma_store, c1.dw_pingpong, c1.median_us);
    moe_tune_format_line(&k1, &c1, line, sizeof line);
    CHECK(strcmp(line, v2) == 0, "version-1 line formats as %s, expected %s", line, v2);
    /* version 1 with a PINGPONG field, version 2 without */
    snprintf(line, sizeof line, "libmoe-tune 1%s", strchr(v2, '|'));
    expect_refused(line, "20 '|'-separated fields, expected 19", "version-1 line with 20 fields");
    snprintf(line, sizeof line, "libmoe-tune 2%s", strchr(v1, '|'));
    expect_refused(line, "19 '|'-separated fields, expected 20", "version-2 line with 19 fields");
    /* bad fields by their version-1 numbers: tma_store is field 18, median_us field 19 */
    snprintf(line, sizeof line, "%.*s|7|12.5", (int)(strrchr(v1, '|') - v1 - 2), v1);
    expect_refused(line, "field 18 (tma_store) = \"7\"", "version-1 tma_store 7");
    snprintf(line, sizeof line, "%.*s|-3", (int)(strrchr(v1, '|') - v1), v1);
    expect_refused(line, "field 19 (median_us) = \"-3\"", "version-1 median_us -3");
    /* the version-1 conflicts stay */
    expect_refused("libmoe-tune 1|GPU|dw|bf16|bf16|0|0|0|0|0|8|100|64|64|sm90|256|1|1|1.0", "dw has 128-row",
                   "version-1 conflict");
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL, "cannot write %s", path);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void load_files(void)
{
    char path[] = "/tmp/libmoe-tune-XXXXXX";
    const int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp failed");
    if (fd < 0)
        return;
    close(fd);
    /* a and b version 2, c version 1: files of both versions, and mixed ones, load */
    const char *a = "libmoe-tune 2|GPU A|fwd|bf16|bf16|0|0|0|0|0|128|32768|1536|2048|sm90|128|1|1|0|10.0";
    const char *b = "libmoe-tune 2|GPU A|fwd|bf16|bf16|0|0|0|0|0|128|32768|1536|2048|sm90|256|1|0|-1|9.0";
    const char *c = "libmoe-tune 1|GPU B|dw|f16|f32|1|1|0|1|0|8|100|64|64|simt|64|1|0|3.25";
    moe_tune_key ka, kc;
    moe_tune_choice ca, cb, cc, got;
    char why[200];
    CHECK(moe_tune_parse_line(a, &ka, &ca, why, sizeof why) && moe_tune_parse_line(b, &ka, &cb, why, sizeof why) &&
              moe_tune_parse_line(c, &kc, &cc, why, sizeof why),
          "sample lines refused: %s", why);
    (void)ca;

    moe_gemm_autotune_clear();
    CHECK(!moe_tune_table_used() && !moe_tune_lookup(&ka, &got), "table not empty after clear");
    char text[1024];
    snprintf(text, sizeof text, "# libmoe autotune cache\n\n%s\r\n%s\n   \n%s", a, c, b); /* b: last, no newline */
    /* "   " is not blank: it must be refused */
    write_file(path, text);
    moe_status st = moe_gemm_autotune_load(path);
    CHECK(st == MOE_ERR_IO && strstr(moe_last_error(), ":5:") != NULL, "line of spaces: %s (%s)", moe_strerror(st),
          moe_last_error());
    CHECK(!moe_tune_table_used() && !moe_tune_lookup(&ka, &got), "a refused file changed the table");

    snprintf(text, sizeof text, "# libmoe autotune cache\n\n%s\r\n%s\n\n%s", a, c, b);
    write_file(path, text);
    st = moe_gemm_autotune_load(path);
    CHECK(st == MOE_OK, "load: %s (%s)", moe_strerror(st), moe_last_error());
    CHECK(moe_tune_lookup(&ka, &got) && same_choice(&got, &cb), "the later line of a key did not win");
    CHECK(moe_tune_lookup(&kc, &got) && same_choice(&got, &cc) && got.dw_pingpong == -1,
          "entry c (version 1) missing after load, or its dw_pingpong not -1");

    /* all or nothing: a bad line 3 after a good line 1 */
    moe_gemm_autotune_clear();
    snprintf(text, sizeof text, "%s\n# ok\n%s|extra\n", c, a);
    write_file(path, text);
    st = moe_gemm_autotune_load(path);
    char where[600];
    snprintf(where, sizeof where, "%s:3:", path);
    CHECK(st == MOE_ERR_IO && strstr(moe_last_error(), where) != NULL, "bad line 3: %s (%s)", moe_strerror(st),
          moe_last_error());
    CHECK(!moe_tune_lookup(&kc, &got), "a refused file's good line entered the table");

    /* an over-long line in a file */
    char big[1400];
    memset(big, 'x', sizeof big - 2);
    big[sizeof big - 2] = '\n', big[sizeof big - 1] = '\0';
    write_file(path, big);
    st = moe_gemm_autotune_load(path);
    CHECK(st == MOE_ERR_IO && strstr(moe_last_error(), "longer than") != NULL, "long line: %s (%s)",
          moe_strerror(st), moe_last_error());

    /* a NUL byte inside line 2 (it was reported as a line too long) */
    {
        FILE *f = fopen(path, "wb");
        CHECK(f != NULL, "cannot write %s", path);
        if (f) {
            fprintf(f, "# ok\n%s", a);
            fputc('\0', f);
            fputs("|junk\n", f);
            fclose(f);
        }
        st = moe_gemm_autotune_load(path);
        char nul_where[640];
        snprintf(nul_where, sizeof nul_where, "%s:2: a NUL byte at column %zu", path, strlen(a) + 1);
        CHECK(st == MOE_ERR_IO && strstr(moe_last_error(), nul_where) != NULL, "NUL byte: %s (%s)", moe_strerror(st),
              moe_last_error());
    }

    /* store and replace through the internal interface, as the driver does */
    CHECK(moe_tune_store(&kc, &cc) == MOE_OK && moe_tune_store(&kc, &cb) == MOE_OK, "store failed");
    CHECK(moe_tune_lookup(&kc, &got) && same_choice(&got, &cb), "store did not replace");
    moe_gemm_autotune_clear();

    unlink(path);
    st = moe_gemm_autotune_load(path);
    CHECK(st == MOE_ERR_IO && strstr(moe_last_error(), path) != NULL, "missing file: %s (%s)", moe_strerror(st),
          moe_last_error());
    st = moe_gemm_autotune_load(NULL);
    CHECK(st == MOE_ERR_NULL_POINTER, "NULL path: %s", moe_strerror(st));
}

static void autotune_arguments(void)
{
    int64_t m_sizes[2] = {1, 1};
    const moe_routing routing = {2, 1, 2, m_sizes, NULL};
    moe_gemm_options options;
    memset(&options, 0, sizeof options);
    options.dtype = MOE_BF16;
    char dummy[64];
    moe_status st = moe_gemm_autotune((moe_gemm_op)3, &routing, 8, 8, dummy, dummy, NULL, dummy, &options, 3, NULL, NULL);
    CHECK(st == MOE_ERR_INVALID_OPTION && strstr(moe_last_error(), "op = 3") != NULL, "op 3: %s (%s)",
          moe_strerror(st), moe_last_error());
    st = moe_gemm_autotune(MOE_GEMM_FWD, &routing, 8, 8, dummy, dummy, NULL, dummy, &options, 0, NULL, NULL);
    CHECK(st == MOE_ERR_INVALID_OPTION && strstr(moe_last_error(), "repeats = 0") != NULL, "repeats 0: %s (%s)",
          moe_strerror(st), moe_last_error());
    st = moe_gemm_autotune(MOE_GEMM_FWD, &routing, 8, 8, dummy, dummy, NULL, dummy, &options, 1001, NULL, NULL);
    CHECK(st == MOE_ERR_INVALID_OPTION, "repeats 1001: %s", moe_strerror(st));
    options.accumulate = 1;
    st = moe_gemm_autotune(MOE_GEMM_DW, &routing, 8, 8, dummy, dummy, NULL, dummy, &options, 3, NULL, NULL);
    CHECK(st == MOE_ERR_INVALID_OPTION && strstr(moe_last_error(), "accumulate") != NULL, "accumulate: %s (%s)",
          moe_strerror(st), moe_last_error());
    options.accumulate = 0;
    if (!moe_backend_available(MOE_BACKEND_CUDA)) {
        st = moe_gemm_autotune(MOE_GEMM_FWD, &routing, 8, 8, dummy, dummy, NULL, dummy, &options, 3, NULL, NULL);
        CHECK(st == MOE_ERR_NO_BACKEND, "no CUDA: %s (%s)", moe_strerror(st), moe_last_error());
    }
}

enum { THREADS = 4, KEYS_PER_THREAD = 64, ROUNDS = 20 };

/* Thread t owns keys with E = 1000 * (t + 1) + i; round r stores tile_rows 128 (r even) or 256 (r odd) and
 * reads each key back at once.  Returns the number of wrong reads. */
static void *table_worker(void *arg)
{
    const int t = (int)(intptr_t)arg;
    intptr_t wrong = 0;
    for (int r = 0; r < ROUNDS; r++) {
        for (int i = 0; i < KEYS_PER_THREAD; i++) {
            moe_tune_key key;
            memset(&key, 0, sizeof key);
            snprintf(key.device, sizeof key.device, "thread test");
            key.E = 1000 * (t + 1) + i, key.M = 4096, key.N = 512, key.K = 256;
            const moe_tune_choice choice = {MOE_TUNE_SM90, r % 2 ? 256 : 128, 1, 1, 0, (double)r};
            moe_tune_choice got;
            if (moe_tune_store(&key, &choice) != MOE_OK || !moe_tune_lookup(&key, &got) || got.tile_rows != choice.tile_rows ||
                got.median_us != choice.median_us)
                wrong++;
        }
    }
    return (void *)wrong;
}

static void concurrent_table(void)
{
    moe_gemm_autotune_clear();
    pthread_t threads[THREADS];
    for (int t = 0; t < THREADS; t++)
        CHECK(pthread_create(&threads[t], NULL, table_worker, (void *)(intptr_t)t) == 0, "pthread_create");
    for (int t = 0; t < THREADS; t++) {
        void *wrong = NULL;
        CHECK(pthread_join(threads[t], &wrong) == 0, "pthread_join");
        CHECK(wrong == NULL, "thread %d read %ld wrong entries", t, (long)(intptr_t)wrong);
    }
    for (int t = 0; t < THREADS; t++)
        for (int i = 0; i < KEYS_PER_THREAD; i++) {
            moe_tune_key key;
            memset(&key, 0, sizeof key);
            snprintf(key.device, sizeof key.device, "thread test");
            key.E = 1000 * (t + 1) + i, key.M = 4096, key.N = 512, key.K = 256;
            moe_tune_choice got;
            CHECK(moe_tune_lookup(&key, &got) && got.tile_rows == ((ROUNDS - 1) % 2 ? 256 : 128) &&
                      got.median_us == (double)(ROUNDS - 1),
                  "key of thread %d, entry %d: not its last choice", t, i);
        }
    moe_gemm_autotune_clear();
}

static void mutated_lines(void)
{
    int accepted = 0, refused = 0;
    for (int i = 0; i < 20000; i++) {
        const moe_tune_key key = sample_key(i + 7);
        const moe_tune_choice choice = sample_choice(&key);
        char line[1024];
        moe_tune_format_line(&key, &choice, line, 512);
        size_t length = strlen(line);
        const int edits = 1 + (int)(next_random() % 3);
        for (int e = 0; e < edits; e++) {
            const size_t at = (size_t)(next_random() % (length + 1));
            static const char alphabet[] = "0123456789|-+. aefnsx\x01\x7f\xff";
            const char c = alphabet[next_random() % (sizeof alphabet - 1)];
            switch (next_random() % 3) {
            case 0: if (at < length) line[at] = c; break;                                        /* replace */
            case 1: if (length + 1 < sizeof line) { memmove(line + at + 1, line + at, length - at + 1); line[at] = c; length++; } break;
            default: if (at < length) { memmove(line + at, line + at + 1, length - at); length--; } break; /* delete */
            }
        }
        moe_tune_key got_key;
        moe_tune_choice got_choice;
        char why[200];
        if (!moe_tune_parse_line(line, &got_key, &got_choice, why, sizeof why)) {
            refused++;
            CHECK(why[0] != '\0', "mutated line %d refused without a reason", i);
            continue;
        }
        accepted++;
        char again[1024];
        moe_tune_format_line(&got_key, &got_choice, again, sizeof again);
        moe_tune_key key2;
        moe_tune_choice choice2;
        const int ok = moe_tune_parse_line(again, &key2, &choice2, why, sizeof why);
        /* the time prints with 3 decimals: half a unit of the third decimal, plus the two binary roundings
         * (reading the mutated text, reading the reprint) of at most |v| 2^-53 each */
        CHECK(ok && same_key(&got_key, &key2) && got_choice.kernel == choice2.kernel &&
                  got_choice.tile_rows == choice2.tile_rows && got_choice.cluster == choice2.cluster &&
                  got_choice.tma_store == choice2.tma_store && got_choice.dw_pingpong == choice2.dw_pingpong &&
                  fabs(got_choice.median_us - choice2.median_us) <= 5e-4 + 0x1p-52 * fabs(got_choice.median_us),
              "accepted mutated line %d does not survive a round trip: %s -> %s", i, line, again);
    }
    CHECK(accepted > 100 && refused > 100, "mutations: %d accepted, %d refused (expected both kinds)", accepted, refused);
}

int main(void)
{
    round_trip();
    bad_fields();
    version_1_lines();
    load_files();
    autotune_arguments();
    concurrent_table();
    mutated_lines();
    printf("test_autotune: %ld checks, %ld failures\n", checks, failures);
    return failures ? 1 : 0;
}
