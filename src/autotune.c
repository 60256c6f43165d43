/*
 * Autotuning of the CUDA grouped GEMM (include/moe.h, "Autotuning"): the process table of tuned kernel
 * choices, the cache file's format, and the driver that times the candidates.
 *
 * Cache file: UTF-8 text, one entry per line, '#' starts a comment line, blank lines are skipped:
 *
 *   libmoe-tune 2|DEVICE|OP|DTYPE|OUT_DTYPE|PX|PY|REDUCE|WEIGHTED|TF32|E|M|N|K|KERNEL|ROWS|CLUSTER|TMA|PINGPONG|US
 *
 *   DEVICE     the CUDA device name (no '|', at most 79 bytes)
 *   OP         fwd | dx | dw
 *   DTYPE      f32 | f16 | bf16 (the inputs), OUT_DTYPE the same for the output
 *   PX PY REDUCE WEIGHTED TF32    0 or 1: permute_x, permute_y, reduce_topk, topk weights given, allow_tf32
 *   E M N K    experts (>= 1), rows T*k, the forward's N and K (>= 0)
 *   KERNEL     sm90 | sm80 | simt
 *   ROWS       tile rows (sm90: 128 or 256, dw 128; sm80/simt: 1 .. 1024, informative)
 *   CLUSTER    1, or 2 (sm90 fwd/dx with 128-row tiles)
 *   TMA        0 or 1 (1 only with sm90)
 *   PINGPONG   -1, 0 or 1: sm90 dw with every operand and a 16-bit output by TMA takes the ping-pong kernel
 *              (1, 128 x 128 tiles) or the 128 x 256 kernel (0); -1 leaves it to the rule (gpu/gemm/heuristics.cu,
 *              sm90_dw_pingpong); 1 only with sm90, dw, TMA 1 and no topk weights
 *   US         the measured median microseconds of one call (>= 0, informative)
 *
 * Keys that no call makes are refused: REDUCE 1 other than for dx, TF32 1 other than with DTYPE f32, an
 * OUT_DTYPE other than DTYPE except f32 for dw; and so are sm90 for f32 and for f16 dw with topk weights.
 *
 * Version-1 lines ("libmoe-tune 1|...", 19 fields: no PINGPONG) still load, with PINGPONG -1; the writer
 * writes version 2.  moe_gemm_autotune appends one line per tuning; loading takes the last line of each key.
 */
#include "moe_backend.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TUNE_MAGIC "libmoe-tune 2"
#define TUNE_MAGIC_V1 "libmoe-tune 1" /* the version before PINGPONG: one field fewer */
#define TUNE_FIELDS 20
#define TUNE_PINGPONG_FIELD 18 /* the field a version-1 line lacks (0-based; US follows it) */
#define TUNE_LINE_MAX 512

/* ---------------------------------------------------------------------------------------------------
 * The process table: a growable array under one mutex.  Lookups scan it (tens of entries at most).
 * ------------------------------------------------------------------------------------------------- */
typedef struct tune_entry {
    moe_tune_key key;
    moe_tune_choice choice;
} tune_entry;

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static tune_entry *table_entries;
static int64_t table_count, table_capacity;
static volatile int table_nonempty; /* read without the lock as a hint; set and cleared under it */

static int same_key(const moe_tune_key *a, const moe_tune_key *b)
{
    return strcmp(a->device, b->device) == 0 && a->op == b->op && a->dtype == b->dtype &&
           a->out_dtype == b->out_dtype && a->permute_x == b->permute_x && a->permute_y == b->permute_y &&
           a->reduce_topk == b->reduce_topk && a->weighted == b->weighted && a->allow_tf32 == b->allow_tf32 &&
           a->E == b->E && a->M == b->M && a->N == b->N && a->K == b->K;
}

int moe_tune_table_used(void) { return table_nonempty; }

int moe_tune_lookup(const moe_tune_key *key, moe_tune_choice *choice)
{
    int found = 0;
    pthread_mutex_lock(&table_lock);
    for (int64_t i = 0; i < table_count && !found; i++) {
        if (same_key(&table_entries[i].key, key)) {
            *choice = table_entries[i].choice;
            found = 1;
        }
    }
    pthread_mutex_unlock(&table_lock);
    return found;
}

/* Adds or replaces one entry; the caller holds the lock. */
static moe_status store_locked(const moe_tune_key *key, const moe_tune_choice *choice)
{
    for (int64_t i = 0; i < table_count; i++) {
        if (same_key(&table_entries[i].key, key)) {
            table_entries[i].choice = *choice;
            return MOE_OK;
        }
    }
    if (table_count == table_capacity) {
        const int64_t capacity = table_capacity ? 2 * table_capacity : 16;
        tune_entry *grown = realloc(table_entries, (size_t)capacity * sizeof *grown);
        if (grown == NULL)
            return moe_fail(MOE_ERR_OUT_OF_MEMORY, "autotune table: no memory for %" PRId64 " entries", capacity);
        table_entries = grown;
        table_capacity = capacity;
    }
    table_entries[table_count].key = *key;
    table_entries[table_count].choice = *choice;
    table_count++;
    table_nonempty = 1;
    return MOE_OK;
}

moe_status moe_tune_store(const moe_tune_key *key, const moe_tune_choice *choice)
{
    pthread_mutex_lock(&table_lock);
    const moe_status status = store_locked(key, choice);
    pthread_mutex_unlock(&table_lock);
    return status;
}

void moe_gemm_autotune_clear(void)
{
    moe_clear_error();
    pthread_mutex_lock(&table_lock);
    free(table_entries);
    table_entries = NULL;
    table_count = table_capacity = 0;
    table_nonempty = 0;
    pthread_mutex_unlock(&table_lock);
}

/* ---------------------------------------------------------------------------------------------------
 * The line format
 * ------------------------------------------------------------------------------------------------- */
static const char *const op_names[] = {"fwd", "dx", "dw"};
static const char *const kernel_names[] = {"simt", "sm80", "sm90"};

void moe_tune_format_line(const moe_tune_key *key, const moe_tune_choice *choice, char *line, size_t size)
{
    snprintf(line, size,
             TUNE_MAGIC "|%s|%s|%s|%s|%d|%d|%d|%d|%d|%" PRId64 "|%" PRId64 "|%" PRId64 "|%" PRId64 "|%s|%d|%d|%d|%d|%.3f",
             key->device, op_names[key->op], moe_dtype_name(key->dtype), moe_dtype_name(key->out_dtype),
             key->permute_x, key->permute_y, key->reduce_topk, key->weighted, key->allow_tf32, key->E, key->M,
             key->N, key->K, kernel_names[choice->kernel], choice->tile_rows, choice->cluster, choice->tma_store,
             choice->dw_pingpong, choice->median_us);
}

/* The index of text in names[count], or -1. */
static int name_index(const char *text, const char *const *names, int count)
{
    for (int i = 0; i < count; i++)
        if (strcmp(text, names[i]) == 0)
            return i;
    return -1;
}

/* Only moe_dtype_name's spellings (which moe_tune_format_line writes), not moe_dtype_from_name's aliases: a
 * line is the one text of its key (tests/test_autotune refuses "fp32"). */
static int parse_dtype(const char *text, moe_dtype *dtype)
{
    for (int d = MOE_F32; d <= MOE_BF16; d++)
        if (strcmp(text, moe_dtype_name((moe_dtype)d)) == 0) {
            *dtype = (moe_dtype)d;
            return 1;
        }
    return 0;
}

/* A decimal integer filling the whole field, in [lo, hi]: digits, after an optional '-' (strtoll alone
 * also takes leading blanks and '+'). */
static int parse_int(const char *text, int64_t lo, int64_t hi, int64_t *value)
{
    const char *digits = text[0] == '-' ? text + 1 : text;
    if (!isdigit((unsigned char)digits[0]))
        return 0;
    char *end = NULL;
    errno = 0;
    const long long v = strtoll(text, &end, 10);
    if (errno != 0 || *end != '\0' || v < lo || v > hi)
        return 0;
    *value = (int64_t)v;
    return 1;
}

static int parse_flag(const char *text, int *flag)
{
    int64_t v;
    if (!parse_int(text, 0, 1, &v))
        return 0;
    *flag = (int)v;
    return 1;
}

int moe_tune_parse_line(const char *line, moe_tune_key *key, moe_tune_choice *choice, char *why, size_t why_size)
{
    static const char *const field_names[TUNE_FIELDS] = {
        "version", "device", "op", "dtype", "out_dtype", "permute_x", "permute_y", "reduce_topk", "weighted",
        "allow_tf32", "E", "M", "N", "K", "kernel", "tile_rows", "cluster", "tma_store", "dw_pingpong", "median_us"};
    char copy[TUNE_LINE_MAX];
    const size_t length = strlen(line);
    if (length >= sizeof copy) {
        snprintf(why, why_size, "line longer than %d bytes", TUNE_LINE_MAX - 1);
        return 0;
    }
    memcpy(copy, line, length + 1);
    char *field[TUNE_FIELDS];
    int count = 0;
    for (char *cursor = copy;; count++) {
        char *bar = strchr(cursor, '|');
        if (count < TUNE_FIELDS)
            field[count] = cursor;
        if (bar == NULL) {
            count++;
            break;
        }
        *bar = '\0';
        cursor = bar + 1;
    }
    const int version = strcmp(field[0], TUNE_MAGIC) == 0 ? 2 : strcmp(field[0], TUNE_MAGIC_V1) == 0 ? 1 : 0;
    const int expected = version == 1 ? TUNE_FIELDS - 1 : TUNE_FIELDS;
    if (version == 0) {
        snprintf(why, why_size, "does not start with \"" TUNE_MAGIC "|\" (or the older \"" TUNE_MAGIC_V1 "|\")");
        return 0;
    }
    if (count != expected) {
        snprintf(why, why_size, "%d '|'-separated fields, expected %d (version %d)", count, expected, version);
        return 0;
    }
    char rule[] = "-1";
    if (version == 1) { /* no PINGPONG: US moves up one place, PINGPONG reads as -1 (the rule) */
        field[TUNE_FIELDS - 1] = field[TUNE_PINGPONG_FIELD];
        field[TUNE_PINGPONG_FIELD] = rule;
    }
    memset(key, 0, sizeof *key);
    memset(choice, 0, sizeof *choice);
    int bad = -1; /* the first field that fails */
    const size_t device_length = strlen(field[1]);
    if (device_length == 0 || device_length >= MOE_TUNE_DEVICE_CHARS)
        bad = 1;
    else
        memcpy(key->device, field[1], device_length + 1);
    int64_t v[TUNE_FIELDS] = {0};
    if (bad < 0 && (key->op = name_index(field[2], op_names, 3)) < 0)
        bad = 2;
    if (bad < 0 && !parse_dtype(field[3], &key->dtype))
        bad = 3;
    if (bad < 0 && !parse_dtype(field[4], &key->out_dtype))
        bad = 4;
    int *const flags[5] = {&key->permute_x, &key->permute_y, &key->reduce_topk, &key->weighted, &key->allow_tf32};
    for (int f = 5; f <= 9 && bad < 0; f++)
        if (!parse_flag(field[f], flags[f - 5]))
            bad = f;
    for (int f = 10; f <= 13 && bad < 0; f++)
        if (!parse_int(field[f], f == 10 ? 1 : 0, INT64_MAX, &v[f]))
            bad = f;
    int kernel = -1;
    if (bad < 0 && (kernel = name_index(field[14], kernel_names, 3)) < 0)
        bad = 14;
    if (bad < 0 && !parse_int(field[15], 1, 1024, &v[15]))
        bad = 15;
    if (bad < 0 && !parse_int(field[16], 1, 2, &v[16]))
        bad = 16;
    if (bad < 0 && !parse_int(field[17], 0, 1, &v[17]))
        bad = 17;
    if (bad < 0 && !parse_int(field[18], -1, 1, &v[18]))
        bad = 18;
    double us = 0.0;
    if (bad < 0) {
        char *end = NULL;
        errno = 0;
        us = strtod(field[19], &end);
        if (!isdigit((unsigned char)field[19][0]) || *end != '\0' || errno != 0 || !isfinite(us) || us < 0.0)
            bad = 19;
    }
    if (bad >= 0) { /* a version-1 line's US is its field 19 */
        const int number = version == 1 && bad > TUNE_PINGPONG_FIELD ? bad : bad + 1;
        snprintf(why, why_size, "field %d (%s) = \"%s\" is not valid", number, field_names[bad], field[bad]);
        return 0;
    }
    key->E = v[10], key->M = v[11], key->N = v[12], key->K = v[13];
    choice->kernel = (moe_tune_kernel)kernel;
    choice->tile_rows = (int)v[15], choice->cluster = (int)v[16], choice->tma_store = (int)v[17];
    choice->dw_pingpong = (int)v[18];
    choice->median_us = us;
    /* keys no call makes, which would load as entries that never apply (gemm_api.c refuses reduce_topk
     * outside dX and allow_tf32 outside f32; only dW's output dtype may differ, as f32); then the
     * combinations the kernels have */
    const char *conflict = NULL;
    if (key->reduce_topk && key->op != MOE_GEMM_DX)
        conflict = "reduce_topk 1 exists only for dx";
    else if (key->allow_tf32 && key->dtype != MOE_F32)
        conflict = "allow_tf32 1 exists only with dtype f32";
    else if (key->out_dtype != key->dtype && !(key->op == MOE_GEMM_DW && key->out_dtype == MOE_F32))
        conflict = "out_dtype differs from dtype only for dw, as f32";
    else if (kernel == MOE_TUNE_SM90 && key->dtype == MOE_F32)
        conflict = "sm90 takes f16 and bf16 only";
    else if (kernel == MOE_TUNE_SM90 && key->op == MOE_GEMM_DW && key->weighted && key->dtype == MOE_F16)
        conflict = "sm90 has no f16 dw with topk weights";
    else if (choice->dw_pingpong == 1 && key->weighted)
        conflict = "dw_pingpong 1 does not exist with topk weights";
    else if (kernel == MOE_TUNE_SM90 && choice->tile_rows != 128 && choice->tile_rows != 256)
        conflict = "sm90 tile_rows must be 128 or 256";
    else if (kernel == MOE_TUNE_SM90 && key->op == MOE_GEMM_DW && choice->tile_rows != 128)
        conflict = "sm90 dw has 128-row tiles only";
    else if (choice->cluster == 2 && !(kernel == MOE_TUNE_SM90 && key->op != MOE_GEMM_DW && choice->tile_rows == 128))
        conflict = "cluster 2 exists only for sm90 fwd/dx with 128-row tiles";
    else if (choice->tma_store && kernel != MOE_TUNE_SM90)
        conflict = "tma_store 1 exists only for sm90";
    else if (choice->dw_pingpong == 1 && !(kernel == MOE_TUNE_SM90 && key->op == MOE_GEMM_DW && choice->tma_store))
        conflict = "dw_pingpong 1 exists only for sm90 dw with tma_store 1";
    if (conflict != NULL) {
        snprintf(why, why_size, "%s", conflict);
        return 0;
    }
    return 1;
}

moe_status moe_gemm_autotune_load(const char *cache_path)
{
    static const char op[] = "moe_gemm_autotune_load";
    moe_clear_error();
    if (cache_path == NULL)
        return moe_fail(MOE_ERR_NULL_POINTER, "%s: cache_path is NULL", op);
    FILE *file = fopen(cache_path, "r");
    if (file == NULL)
        return moe_fail(MOE_ERR_IO, "%s: cannot open %s: %s", op, cache_path, strerror(errno));
    tune_entry *parsed = NULL;
    int64_t count = 0, capacity = 0, line_number = 0;
    moe_status status = MOE_OK;
    char line[TUNE_LINE_MAX + 2];
    /* zeroed before each read, so that the bytes fgets stored end at the last non-zero one: a NUL byte
     * inside a line (which strlen stops at) is then told from a line too long */
    while (status == MOE_OK) {
        memset(line, 0, sizeof line);
        if (fgets(line, sizeof line, file) == NULL)
            break;
        line_number++;
        size_t length = strlen(line), stored = sizeof line - 1;
        while (stored > 0 && line[stored - 1] == '\0')
            stored--;
        if (stored > length) {
            status = moe_fail(MOE_ERR_IO, "%s: %s:%" PRId64 ": a NUL byte at column %zu", op, cache_path, line_number,
                              length + 1);
            break;
        }
        if (length > 0 && line[length - 1] == '\n')
            line[--length] = '\0';
        else if (!feof(file)) {
            status = moe_fail(MOE_ERR_IO, "%s: %s:%" PRId64 ": line longer than %d bytes", op, cache_path, line_number,
                              TUNE_LINE_MAX - 1);
            break;
        }
        if (length > 0 && line[length - 1] == '\r')
            line[--length] = '\0';
        if (length == 0 || line[0] == '#')
            continue;
        if (count == capacity) {
            capacity = capacity ? 2 * capacity : 16;
            tune_entry *grown = realloc(parsed, (size_t)capacity * sizeof *grown);
            if (grown == NULL) {
                status = moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: no memory for %" PRId64 " entries", op, capacity);
                break;
            }
            parsed = grown;
        }
        char why[200];
        if (!moe_tune_parse_line(line, &parsed[count].key, &parsed[count].choice, why, sizeof why))
            status = moe_fail(MOE_ERR_IO, "%s: %s:%" PRId64 ": %s", op, cache_path, line_number, why);
        else
            count++;
    }
    if (status == MOE_OK && ferror(file))
        status = moe_fail(MOE_ERR_IO, "%s: reading %s failed", op, cache_path);
    fclose(file);
    if (status == MOE_OK) {
        pthread_mutex_lock(&table_lock);
        for (int64_t i = 0; i < count && status == MOE_OK; i++)
            status = store_locked(&parsed[i].key, &parsed[i].choice);
        pthread_mutex_unlock(&table_lock);
    }
    free(parsed);
    return status;
}

/* ---------------------------------------------------------------------------------------------------
 * The driver
 * ------------------------------------------------------------------------------------------------- */
#ifdef MOE_HAVE_CUDA /* the driver needs the CUDA backend; without it moe_gemm_autotune only validates */
typedef struct tune_call {
    moe_gemm_op op;
    const moe_routing *routing;
    int64_t N, K;
    const void *a, *b, *topk_weights;
    void *out;
    const moe_gemm_options *options;
} tune_call;

static moe_status run_tune_call(void *context)
{
    const tune_call *c = context;
    switch (c->op) {
    case MOE_GEMM_FWD:
        return moe_gemm_fwd(MOE_BACKEND_CUDA, c->routing, c->N, c->K, c->a, c->b, c->topk_weights, c->out, c->options);
    case MOE_GEMM_DX:
        return moe_gemm_dx(MOE_BACKEND_CUDA, c->routing, c->N, c->K, c->a, c->b, c->topk_weights, c->out, c->options);
    case MOE_GEMM_DW:
        return moe_gemm_dw(MOE_BACKEND_CUDA, c->routing, c->N, c->K, c->a, c->b, c->topk_weights, c->out, c->options);
    }
    return MOE_ERR_INVALID_OPTION;
}

/* Re-labels the failure an inner call recorded as the autotune's own. */
static moe_status relabel(moe_status status)
{
    char inner[400];
    snprintf(inner, sizeof inner, "%s", moe_last_error());
    return moe_fail(status, "moe_gemm_autotune: %s", inner);
}

static int same_choice(const moe_tune_choice *a, const moe_tune_choice *b)
{
    return a->kernel == b->kernel && a->tile_rows == b->tile_rows && a->cluster == b->cluster &&
           a->tma_store == b->tma_store && a->dw_pingpong == b->dw_pingpong;
}

/* The distinct candidates of one call, for moe_cuda_time_rounds: candidate c runs the call under forced[c]. */
enum { MAX_TUNE_CANDIDATES = 16 };
typedef struct timed_candidates {
    tune_call *call;
    const moe_tune_choice *forced[MAX_TUNE_CANDIDATES];
} timed_candidates;

static moe_status run_timed_candidate(void *context, int c)
{
    timed_candidates *t = context;
    moe_cuda_tune_force(t->forced[c]);
    return run_tune_call(t->call);
}

/* Times every distinct candidate; *best gets the fastest, *timed the number timed. */
static moe_status time_candidates(tune_call *call, int repeats, void *stream, moe_tune_key *key,
                                  moe_tune_choice *best, int *timed)
{
    /* Every configuration the kernels have; those a device or shape cannot take collapse into another
     * (plan_gemm falls back), and duplicates of an earlier effective plan are not timed again.  The last
     * one, the dW ping-pong kernel, collapses into {sm90, 128, 1, 1, 0} where the ping-pong kernel does
     * not apply (fwd, dX, a 32-bit dW output, a shape without TMA). */
    static const moe_tune_choice candidates[] = {
        {MOE_TUNE_SM90, 256, 1, 1, 0, 0}, {MOE_TUNE_SM90, 256, 1, 0, 0, 0}, {MOE_TUNE_SM90, 128, 1, 1, 0, 0},
        {MOE_TUNE_SM90, 128, 1, 0, 0, 0}, {MOE_TUNE_SM90, 128, 2, 1, 0, 0}, {MOE_TUNE_SM90, 128, 2, 0, 0, 0},
        {MOE_TUNE_SM80, 128, 1, 0, 0, 0}, {MOE_TUNE_SM90, 128, 1, 1, 1, 0},
    };
    enum { CANDIDATES = sizeof candidates / sizeof candidates[0] };
    _Static_assert((int)CANDIDATES <= (int)MAX_TUNE_CANDIDATES, "timed_candidates holds every candidate");
    moe_tune_choice seen[CANDIDATES];
    timed_candidates distinct;
    distinct.call = call;
    const char *verbose_env = getenv("MOE_AUTOTUNE_VERBOSE"); /* =1: each candidate's time on stderr */
    const int verbose = verbose_env != NULL && strcmp(verbose_env, "0") != 0;
    *timed = 0;
    /* which plan each configuration becomes (one untimed call each) */
    for (int i = 0; i < CANDIDATES; i++) {
        moe_cuda_tune_force(&candidates[i]);
        moe_status status = run_tune_call(call);
        if (status == MOE_OK)
            status = moe_backend_synchronize(MOE_BACKEND_CUDA, stream);
        moe_tune_choice planned;
        if (status == MOE_OK && !moe_cuda_tune_last(key, &planned))
            status = moe_fail(MOE_ERR_DEVICE, "moe_gemm_autotune: the call planned no GEMM");
        moe_cuda_tune_force(NULL);
        if (status != MOE_OK)
            return relabel(status);
        int duplicate = 0;
        for (int j = 0; j < *timed; j++)
            duplicate |= same_choice(&seen[j], &planned);
        if (duplicate)
            continue;
        distinct.forced[*timed] = &candidates[i];
        seen[(*timed)++] = planned;
    }
    /* the distinct plans timed in interleaved rounds (moe_cuda_time_rounds) */
    double median_us[CANDIDATES];
    moe_status status = moe_cuda_time_rounds(stream, run_timed_candidate, &distinct, *timed, repeats, median_us);
    if (status == MOE_OK)
        status = moe_backend_synchronize(MOE_BACKEND_CUDA, stream);
    moe_cuda_tune_force(NULL);
    if (status != MOE_OK)
        return relabel(status);
    for (int j = 0; j < *timed; j++) {
        seen[j].median_us = median_us[j];
        if (verbose)
            fprintf(stderr, "moe_gemm_autotune: %s %s E=%" PRId64 " M=%" PRId64 " N=%" PRId64 " K=%" PRId64
                            ": %s rows %d cluster %d tma_store %d dw_pingpong %d: %.1f us\n",
                    key->device, op_names[key->op], key->E, key->M, key->N, key->K, kernel_names[seen[j].kernel],
                    seen[j].tile_rows, seen[j].cluster, seen[j].tma_store, seen[j].dw_pingpong, seen[j].median_us);
        if (j == 0 || seen[j].median_us < best->median_us)
            *best = seen[j];
    }
    return MOE_OK;
}
#endif

moe_status moe_gemm_autotune(moe_gemm_op op, const moe_routing *routing, int64_t N, int64_t K,
                             const void *a, const void *b, const void *topk_weights, void *out,
                             const moe_gemm_options *options, int repeats, const char *cache_path,
                             moe_gemm_tuning *chosen)
{
    static const char name[] = "moe_gemm_autotune";
    moe_clear_error();
    if (op != MOE_GEMM_FWD && op != MOE_GEMM_DX && op != MOE_GEMM_DW)
        return moe_fail(MOE_ERR_INVALID_OPTION, "%s: op = %d, expected MOE_GEMM_FWD, MOE_GEMM_DX or MOE_GEMM_DW", name,
                        (int)op);
    if (repeats < 1 || repeats > 1000)
        return moe_fail(MOE_ERR_INVALID_OPTION, "%s: repeats = %d, expected 1 .. 1000", name, repeats);
    if (options != NULL && options->accumulate)
        return moe_fail(MOE_ERR_INVALID_OPTION,
                        "%s: options->accumulate is set, but the candidates overwrite out many times; tune the "
                        "same call without accumulate (the choice applies to both)", name);
    if (!moe_backend_available(MOE_BACKEND_CUDA))
        return moe_fail(MOE_ERR_NO_BACKEND, "%s: the CUDA backend is not available (not built in, or no device)", name);
#ifdef MOE_HAVE_CUDA
    tune_call call = {op, routing, N, K, a, b, topk_weights, out, options};
    void *stream = options != NULL ? options->stream : NULL;
    moe_tune_key key;
    moe_tune_choice best = {MOE_TUNE_SIMT, 0, 1, 0, 0, 0.0};
    int timed = 0;
    moe_status status = time_candidates(&call, repeats, stream, &key, &best, &timed);
    if (status != MOE_OK)
        return status;
    status = moe_tune_store(&key, &best);
    if (status != MOE_OK)
        return status;
    status = run_tune_call(&call); /* with the table's choice: out holds the call's result */
    if (status == MOE_OK)
        status = moe_backend_synchronize(MOE_BACKEND_CUDA, stream);
    if (status != MOE_OK)
        return relabel(status);
    if (chosen != NULL) {
        memset(chosen, 0, sizeof *chosen);
        snprintf(chosen->kernel, sizeof chosen->kernel, "%s", kernel_names[best.kernel]);
        chosen->tile_rows = best.tile_rows;
        chosen->cluster = best.cluster;
        chosen->tma_store = best.tma_store;
        chosen->dw_pingpong = best.dw_pingpong;
        chosen->median_us = best.median_us;
        chosen->candidates = timed;
    }
    if (cache_path != NULL) {
        char line[TUNE_LINE_MAX];
        moe_tune_format_line(&key, &best, line, sizeof line);
        FILE *file = fopen(cache_path, "a");
        if (file == NULL)
            return moe_fail(MOE_ERR_IO, "%s: cannot append to %s: %s (the choice is kept in this process)", name,
                            cache_path, strerror(errno));
        const int written = fprintf(file, "%s\n", line) > 0;
        if (fclose(file) != 0 || !written)
            return moe_fail(MOE_ERR_IO, "%s: writing %s failed (the choice is kept in this process)", name, cache_path);
    }
    return MOE_OK;
#else
    (void)routing, (void)N, (void)K, (void)a, (void)b, (void)topk_weights, (void)out, (void)cache_path, (void)chosen;
    return moe_fail(MOE_ERR_NO_BACKEND, "%s: built without CUDA", name);
#endif
}
