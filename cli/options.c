/*
 * cli/options.c: a command's options: parsing its arguments (parse_args), reading their values (get,
 * need, parse_*_arg) and printing its help.
 */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------------
 * Help
 * ------------------------------------------------------------------------------------------------- */
/* Prints text word-wrapped to `width` columns.  The cursor is at column `column`; it moves to `indent`
 * first if it is left of it, and every further line starts at `indent`.  A '\n' in text breaks the line. */
static void print_wrapped(FILE *out, const char *text, int column, int indent, int width)
{
    if (column < indent) {
        fprintf(out, "%*s", indent - column, "");
        column = indent;
    }
    const char *p = text;
    int line_start = 1;
    while (*p) {
        if (*p == '\n') {
            fprintf(out, "\n%*s", indent, "");
            column = indent;
            line_start = 1;
            p++;
            continue;
        }
        if (*p == ' ') {
            p++;
            continue;
        }
        size_t len = strcspn(p, " \n");
        if (!line_start && column + 1 + (int)len > width) {
            fprintf(out, "\n%*s", indent, "");
            column = indent;
            line_start = 1;
        }
        if (!line_start) {
            fputc(' ', out);
            column++;
        }
        fwrite(p, 1, len, out);
        column += (int)len;
        line_start = 0;
        p += len;
    }
    fputc('\n', out);
}

void print_command_help(FILE *out, const command *c)
{
    char head[64];
    int n = snprintf(head, sizeof head, "usage: moe %s ", c->name);
    fputs(head, out);
    print_wrapped(out, c->usage, n, 8, 100);
    fprintf(out, "\n");
    print_wrapped(out, c->summary, 0, 2, 100);
    fprintf(out, "\n");
    print_wrapped(out, c->details, 0, 2, 100);
    if (c->opts[0].name != NULL)
        fprintf(out, "\noptions:\n");
    for (const opt *o = c->opts; o->name != NULL; o++) {
        char left[64];
        n = snprintf(left, sizeof left, "  %s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
        fputs(left, out);
        const int column = 30;
        if (n + 2 > column) {
            fputc('\n', out);
            n = 0;
        }
        print_wrapped(out, o->help, n, column, 100);
    }
    fprintf(out, "  %-28s%s\n", "--help, -h", "print this help and exit");
    fprintf(out, "\nExample:\n");
    print_example(out, c, 1);
}

void print_example(FILE *out, const command *c, int comments)
{
    for (const char *line = c->example; *line != '\0';) {
        const size_t len = strcspn(line, "\n");
        if (comments || line[0] != '#')
            fprintf(out, "  %.*s\n", (int)len, line);
        line += len + (line[len] == '\n');
    }
}

/* ---------------------------------------------------------------------------------------------------
 * Argument parsing
 * ------------------------------------------------------------------------------------------------- */
static int opt_index(const command *c, const char *name)
{
    for (int i = 0; c->opts[i].name != NULL; i++)
        if (strcmp(c->opts[i].name, name) == 0)
            return i;
    return -1;
}

/* The value of an option (or "" for a given flag), NULL when absent. */
const char *get(const args *a, const char *name)
{
    int i = opt_index(a->cmd, name);
    if (i < 0) {
        fprintf(stderr, "internal error: %s has no option %s\n", a->cmd->name, name);
        abort();
    }
    return a->value[i];
}

const char *need(const args *a, const char *name)
{
    const char *v = get(a, name);
    if (v == NULL) {
        int i = opt_index(a->cmd, name);
        die("missing required option %s %s (see moe %s --help)", name, a->cmd->opts[i].arg, a->cmd->name);
    }
    if (v[0] == '\0') /* an empty folder name would put "/NAME" files at the root */
        die("option %s is empty (see moe %s --help)", name, a->cmd->name);
    return v;
}

void parse_args(const command *c, int argc, char **argv, args *a)
{
    memset(a, 0, sizeof *a);
    a->cmd = c;
    int only_positional = 0;
    for (int i = 0; i < argc; i++) {
        const char *s = argv[i];
        if (!only_positional && (strcmp(s, "--help") == 0 || strcmp(s, "-h") == 0)) {
            print_command_help(stdout, c);
            exit(0);
        }
        if (!only_positional && strcmp(s, "--") == 0) {
            only_positional = 1;
            continue;
        }
        if (!only_positional && s[0] == '-' && s[1] != '\0') {
            char name[64];
            const char *eq = strchr(s, '=');
            size_t len = eq ? (size_t)(eq - s) : strlen(s);
            if (len >= sizeof name)
                len = sizeof name - 1;
            memcpy(name, s, len);
            name[len] = '\0';
            int k = opt_index(c, name);
            if (k < 0)
                die("unknown option '%s' (see moe %s --help)", name, c->name);
            if (a->value[k] != NULL)
                die("option %s is given twice", name);
            if (c->opts[k].arg == NULL) {
                if (eq != NULL)
                    die("option %s takes no value", name);
                a->value[k] = "";
            } else if (eq != NULL) {
                a->value[k] = eq + 1;
            } else {
                if (i + 1 >= argc)
                    die("option %s needs a value: %s %s", name, name, c->opts[k].arg);
                a->value[k] = argv[++i];
            }
            continue;
        }
        if (a->npos >= c->positionals)
            die("unexpected argument '%s' (see moe %s --help)", s, c->name);
        a->pos[a->npos++] = s;
    }
    if (a->npos != c->positionals)
        die("expected %d file or folder arguments, got %d (see moe %s --help)", c->positionals, a->npos, c->name);
}

int64_t parse_int_arg(const char *flag, const char *s, int64_t min)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (s[0] == '\0' || *end != '\0' || errno != 0 || v < min)
        die("%s %s: expected an integer >= %lld", flag, s, (long long)min);
    return (int64_t)v;
}

double parse_double_arg(const char *flag, const char *s)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (s[0] == '\0' || *end != '\0' || errno != 0 || !(v >= 0) || isinf(v))
        die("%s %s: expected a finite number >= 0", flag, s);
    return v;
}

/* 1 and *dtype set when s names a dtype (moe_dtype_from_name: f32, f16, bf16 and their aliases), else 0. */
int parse_dtype(const char *s, moe_dtype *dtype)
{
    return moe_dtype_from_name(s, dtype) == MOE_OK;
}
