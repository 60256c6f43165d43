/*
 * cli/run_options.c: the options a command ran with, written into its output folder as moe-options.txt,
 * and read back by the commands that take that folder as input (cli/README.md, "Options travel with the
 * data").  The file is small and human-readable:
 *
 *   # moe-options 1, written by moe mlp-fwd ...      the header: the format version and the command
 *   command = mlp-fwd
 *   dtype = bf16                                      one key = value per line
 *   ...
 *
 * Lines starting with '#' and blank lines are comments.  A reader takes each key it has a flag for as
 * that flag's default, and refuses the flag when it is given with another value, naming both.
 */
#include "cli.h"
#include "layouts.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RUN_OPTIONS_VERSION 1

/* How a key's value reads as a flag. */
enum key_kind {
    K_DTYPE,    /* f32 | f16 | bf16 (and the aliases moe_dtype_from_name takes) */
    K_INT,      /* an integer */
    K_WORD,     /* a word, compared without case (activation, padding, affinity side) */
    K_CLAMP,    /* NL_LO,NL_HI,LIN_LO,LIN_HI, fields compared as numbers */
    K_BOOL,     /* 1 or 0: the flag given or not */
    K_INTER     /* rounded | float32 (--intermediates; --round-intermediates says rounded) */
};

typedef struct key_flag {
    const char *key, *flag;
    enum key_kind kind;
} key_flag;

/* Every key a command writes, and the flag it stands for. */
static const key_flag keys[] = {
    {"dtype", "--dtype", K_DTYPE},
    {"block_size", "--block-size", K_INT},
    {"padding", "--padding", K_WORD},
    {"activation", "--activation", K_WORD},
    {"affinity_on", "--affinity-on", K_WORD},
    {"bias", "--bias", K_BOOL},
    {"clamp", "--clamp", K_CLAMP},
    {"no_accumulate", "--no-accumulate", K_BOOL},
    {"intermediates", "--intermediates", K_INTER},
    {"grad_fp32", "--grad-fp32", K_BOOL},
    {"dropping", "--dropping", K_BOOL},
    {"weight_layout", "--weight-layout", K_WORD},
};
#define NKEYS (sizeof keys / sizeof keys[0])

static const key_flag *find_key(const char *key)
{
    for (size_t i = 0; i < NKEYS; i++)
        if (strcmp(keys[i].key, key) == 0)
            return &keys[i];
    return NULL;
}

/* ---------------------------------------------------------------------------------------------------
 * Writing
 * ------------------------------------------------------------------------------------------------- */
void run_options_set(run_options *r, const char *key, const char *fmt, ...)
{
    if (find_key(key) == NULL || r->count >= RUN_OPTIONS_MAX) {
        fprintf(stderr, "internal error: run option %s\n", key);
        abort();
    }
    snprintf(r->key[r->count], sizeof r->key[0], "%s", key);
    va_list args;
    va_start(args, fmt);
    vsnprintf(r->value[r->count], sizeof r->value[0], fmt, args);
    va_end(args);
    r->count++;
}

void run_options_write(const char *path, const char *command, const run_options *r)
{
    char text[4096];
    size_t n = (size_t)snprintf(text, sizeof text,
                                "# moe-options %d, written by moe %s: the options the files of this folder were computed "
                                "with\n# (key = value, one per line; the commands that read this folder take them as "
                                "their defaults: cli/README.md)\ncommand = %s\n",
                                RUN_OPTIONS_VERSION, command, command);
    for (int i = 0; i < r->count && n < sizeof text; i++)
        n += (size_t)snprintf(text + n, sizeof text - n, "%s = %s\n", r->key[i], r->value[i]);
    if (n >= sizeof text) {
        fprintf(stderr, "internal error: run options too long\n");
        abort();
    }
    write_text(path, text);
}

/* The text of an mlp option struct's clamp limits, as --clamp takes it (an empty field: no bound). */
void run_options_clamp_text(const moe_mlp_options *o, char *buf, size_t size)
{
    const int has[4] = {o->has_non_linear_clamp_lower_limit, o->has_non_linear_clamp_upper_limit,
                        o->has_linear_clamp_lower_limit, o->has_linear_clamp_upper_limit};
    const float v[4] = {o->non_linear_clamp_lower_limit, o->non_linear_clamp_upper_limit,
                        o->linear_clamp_lower_limit, o->linear_clamp_upper_limit};
    size_t n = 0;
    buf[0] = '\0';
    for (int f = 0; f < 4 && n < size; f++) {
        n += (size_t)snprintf(buf + n, size - n, "%s", f ? "," : "");
        if (has[f] && n < size)
            n += (size_t)snprintf(buf + n, size - n, "%.9g", (double)v[f]);
    }
}

/* ---------------------------------------------------------------------------------------------------
 * Reading
 * ------------------------------------------------------------------------------------------------- */
static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    return s;
}

int run_options_read(const char *dir, run_options *r)
{
    memset(r, 0, sizeof *r);
    char *path = join_path(dir, RUN_OPTIONS_FILE);
    snprintf(r->path, sizeof r->path, "%s", path);
    xfree(path);
    if (!is_regular(r->path))
        return 0;
    FILE *f = fopen(r->path, "r");
    if (f == NULL)
        die("%s: cannot read: %s", r->path, strerror(errno));
    char line[512];
    int lineno = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        lineno++;
        if (strchr(line, '\n') == NULL && !feof(f)) {
            fclose(f);
            die("%s:%d: line too long", r->path, lineno);
        }
        if (lineno == 1) {
            int version = 0;
            if (sscanf(line, "# moe-options %d", &version) != 1) {
                fclose(f);
                die("%s: not a moe options file (its first line is not '# moe-options VERSION, ...')", r->path);
            }
            if (version != RUN_OPTIONS_VERSION) {
                fclose(f);
                die("%s: format version %d; this moe reads version %d", r->path, version, RUN_OPTIONS_VERSION);
            }
            continue;
        }
        char *s = trim(line);
        if (s[0] == '\0' || s[0] == '#')
            continue;
        char *eq = strchr(s, '=');
        if (eq == NULL) {
            fclose(f);
            die("%s:%d: expected 'key = value', found '%s'", r->path, lineno, s);
        }
        *eq = '\0';
        const char *key = trim(s), *value = trim(eq + 1);
        if (strcmp(key, "command") == 0) {
            snprintf(r->command, sizeof r->command, "%s", value);
            continue;
        }
        if (find_key(key) == NULL) {
            fclose(f);
            die("%s:%d: unknown key '%s'", r->path, lineno, key);
        }
        if (r->count >= RUN_OPTIONS_MAX || strlen(value) >= sizeof r->value[0]) {
            fclose(f);
            die("%s:%d: too many keys or too long a value", r->path, lineno);
        }
        snprintf(r->key[r->count], sizeof r->key[0], "%s", key);
        snprintf(r->value[r->count], sizeof r->value[0], "%s", value);
        r->count++;
    }
    fclose(f);
    if (lineno == 0)
        die("%s: empty (expected a moe options file)", r->path);
    if (r->command[0] == '\0')
        die("%s: no 'command = ...' line", r->path);
    return 1;
}

const char *run_options_get(const run_options *r, const char *key)
{
    for (int i = r->count - 1; i >= 0; i--)
        if (strcmp(r->key[i], key) == 0)
            return r->value[i];
    return NULL;
}

/* A value of kind k in the form two values compare by (buf); "" for a bad one (never equal to a good one). */
static const char *canonical(enum key_kind k, const char *v, char *buf, size_t size)
{
    moe_dtype d;
    switch (k) {
    case K_DTYPE:
        if (strcmp(v, "f64") == 0 || strcmp(v, "float64") == 0)
            return "f64";
        return parse_dtype(v, &d) ? moe_dtype_name(d) : "";
    case K_INT: {
        char *end;
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (v[0] == '\0' || *end != '\0' || errno != 0)
            return "";
        snprintf(buf, size, "%lld", x);
        return buf;
    }
    case K_WORD: {
        size_t i = 0;
        for (; v[i] != '\0' && i + 1 < size; i++)
            buf[i] = (char)tolower((unsigned char)v[i]);
        buf[i] = '\0';
        return buf;
    }
    case K_CLAMP: {
        size_t n = 0;
        buf[0] = '\0';
        const char *p = v;
        for (int f = 0; f < 4; f++) {
            const char *comma = strchr(p, ',');
            const size_t len = comma ? (size_t)(comma - p) : strlen(p);
            char field[64];
            if ((f < 3) != (comma != NULL) || len >= sizeof field)
                return "";
            memcpy(field, p, len);
            field[len] = '\0';
            n += (size_t)snprintf(buf + n, size - n, "%s", f ? "," : "");
            if (len > 0) {
                char *end;
                const float x = strtof(field, &end);
                if (*end != '\0' || !isfinite(x))
                    return "";
                n += (size_t)snprintf(buf + n, size - n, "%.9g", (double)x);
            }
            p = comma ? comma + 1 : p + len;
            if (n >= size)
                return "";
        }
        return buf;
    }
    case K_BOOL: return strcmp(v, "1") == 0 ? "1" : strcmp(v, "0") == 0 ? "0" : "";
    case K_INTER: return strcmp(v, "rounded") == 0 ? "rounded" : strcmp(v, "float32") == 0 ? "float32" : "";
    }
    return "";
}

/* Whether a flag's value is one the command takes: a bad one is left to the command's own parsing, whose
 * message says what is expected (a conflict with the file would hide it). */
static int valid_value(const key_flag *kf, const char *v)
{
    char buf[128];
    moe_mlp_activation act;
    if (strcmp(kf->key, "activation") == 0)
        return moe_mlp_activation_from_name(v, &act) == MOE_OK;
    if (strcmp(kf->key, "affinity_on") == 0)
        return strcmp(v, "h") == 0 || strcmp(v, "H") == 0 || strcmp(v, "i") == 0 || strcmp(v, "I") == 0;
    if (strcmp(kf->key, "padding") == 0)
        return strcmp(v, "skip") == 0 || strcmp(v, "row") == 0;
    if (strcmp(kf->key, "weight_layout") == 0) {
        (void)parse_weight_layout(v); /* dies naming the choices for an unknown or refused layout */
        return 1;
    }
    return kf->kind == K_BOOL || canonical(kf->kind, v, buf, sizeof buf)[0] != '\0';
}

static int option_index(const command *c, const char *flag)
{
    for (int i = 0; c->opts[i].name != NULL; i++)
        if (strcmp(c->opts[i].name, flag) == 0)
            return i;
    return -1;
}

void run_options_apply(args *a, const run_options *r)
{
    for (int i = 0; i < r->count; i++) {
        const key_flag *kf = find_key(r->key[i]);
        const int idx = option_index(a->cmd, kf->flag);
        if (idx < 0)
            continue; /* a key this command has no flag for */
        char fbuf[128], gbuf[128];
        const char *file = canonical(kf->kind, r->value[i], fbuf, sizeof fbuf);
        if (file[0] == '\0')
            die("%s: %s = %s is not a valid value of %s", r->path, r->key[i], r->value[i], kf->flag);
        const char *given = a->value[idx];
        if (given == NULL && kf->kind == K_INTER && option_index(a->cmd, "--round-intermediates") >= 0 &&
            a->value[option_index(a->cmd, "--round-intermediates")] != NULL)
            given = "rounded"; /* --round-intermediates, the synonym */
        const int is_flag = kf->kind == K_BOOL;
        const int file_on = strcmp(file, "1") == 0;
        if (given == NULL) { /* the file's value becomes the default */
            if (!is_flag) {
                char *copy = xmalloc(strlen(r->value[i]) + 1, 1); /* r may be gone before a */
                memcpy(copy, r->value[i], strlen(r->value[i]) + 1);
                a->value[idx] = copy;
            } else if (file_on) {
                a->value[idx] = "";
            }
            continue;
        }
        if (!is_flag && !valid_value(kf, given))
            continue;
        if (is_flag ? !file_on : strcmp(canonical(kf->kind, given, gbuf, sizeof gbuf), file) != 0)
            die("%s %s conflicts with %s, which says %s = %s (the options moe %s ran with): drop %s to use the "
                "file's value, or compute these files again with the option you want",
                a->value[idx] != NULL ? kf->flag : "--round-intermediates", is_flag || a->value[idx] == NULL ? "(given)" : given,
                r->path, r->key[i], r->value[i], r->command, a->value[idx] != NULL ? kf->flag : "--round-intermediates");
    }
}

/* ---------------------------------------------------------------------------------------------------
 * The MLP commands
 * ------------------------------------------------------------------------------------------------- */
void mlp_apply_run_options(args *a, int forward)
{
    run_options r;
    if (!run_options_read(need(a, "--in"), &r))
        return;
    /* the forward's --in folder may hold an earlier forward's file next to its outputs: only a routing's
     * file (moe route --out) describes the forward's inputs */
    if (forward && strcmp(r.command, "route") != 0)
        return;
    run_options_apply(a, &r);
}

void mlp_write_run_options(const char *path, const char *command, const moe_mlp_options *o,
                           const char *weight_layout)
{
    run_options r = {0};
    char clamp[256];
    run_options_clamp_text(o, clamp, sizeof clamp);
    run_options_set(&r, "dtype", "%s", moe_dtype_name(o->dtype));
    run_options_set(&r, "block_size", "%lld", (long long)o->block_size);
    run_options_set(&r, "padding", "%s", o->padding == MOE_MLP_PAD_ROW ? "row" : "skip");
    run_options_set(&r, "activation", "%s", moe_mlp_activation_name(o->activation));
    run_options_set(&r, "affinity_on", "%s", o->affinity == MOE_AFFINITY_ON_I ? "i" : "h");
    run_options_set(&r, "bias", "%d", o->bias != 0);
    run_options_set(&r, "clamp", "%s", clamp);
    run_options_set(&r, "no_accumulate", "%d", o->tensor_update_overwrite != 0);
    run_options_set(&r, "intermediates", "%s", o->float32_intermediates ? "float32" : "rounded");
    run_options_set(&r, "weight_layout", "%s", weight_layout);
    if (strcmp(command, "mlp-bwd") == 0)
        run_options_set(&r, "grad_fp32", "%d", o->grad_fp32 != 0);
    run_options_write(path, command, &r);
}
