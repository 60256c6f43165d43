/*
 * cli/options.h: how a command of the moe tool is described (its options and help text) and how its
 * arguments are parsed and read.  cli/options.c defines the functions.
 */
#ifndef LIBMOE_CLI_OPTIONS_H
#define LIBMOE_CLI_OPTIONS_H

#include "moe.h"

#include <stdint.h>
#include <stdio.h>

#define MAX_OPTS 32

typedef struct opt {
    const char *name; /* "--x" */
    const char *arg;  /* "X.npy", or NULL for a flag without value */
    const char *help;
} opt;

struct args;
typedef struct command {
    const char *name;
    const char *usage;   /* what follows "moe NAME" */
    const char *summary; /* one line */
    const char *details; /* paragraphs printed before the options */
    const opt *opts;     /* terminated by {NULL} */
    int positionals;     /* exact number of positional arguments */
    int (*run)(const struct args *);
    /* a worked example, printed verbatim at the end of the help: '#' lines say what it does, the
     * others are command lines that run on the files the examples before it (main.c's order) made */
    const char *example;
} command;

typedef struct args {
    const command *cmd;
    const char *value[MAX_OPTS];
    const char *pos[4];
    int npos;
} args;

/* Options several commands share (an opt initialiser each). */
#define OPT_DTYPE                                                                                      \
    {"--dtype", "f32|f16|bf16",                                                                        \
     "the computation dtype: every input is converted to it on load (rounded once to nearest even), "   \
     "the library runs in it and the result is rounded to it. Default: f16 when every floating input is " \
     "a float16 .npy, else f32. Needed for uint16/void16 files, which hold bf16 (--dtype bf16) or f16 " \
     "(--dtype f16) bit patterns."}
#define OPT_BACKEND                                                                                    \
    {"--backend", "ref|cuda",                                                                          \
     "ref (default): the CPU reference. cuda: the library's CUDA kernels on the first GPU: every input " \
     "is copied to the device, every output buffer is filled with NaN bytes (0xFF) before the call and " \
     "copied back after it; an error the device detects (e.g. a bad routing index) is a refused call. " \
     "Exits with status 2 when this build has no CUDA backend or no CUDA device is visible."}
#define OPT_RAW                                                                                        \
    {"--raw", NULL,                                                                                    \
     "write outputs in the computation dtype instead of float32: f16 as float16 '<f2', bf16 as uint16 " \
     "'<u2' bit patterns (torch.from_numpy(a.view(np.int16)).view(torch.bfloat16) reads them)."}

/* Fills *a from the arguments after the command name; --help prints the command's help and exits, any
 * misuse dies. */
void parse_args(const command *c, int argc, char **argv, args *a);

/* The value of an option (or "" for a given flag), NULL when absent. */
const char *get(const args *a, const char *name);

/* The value of a required option; dies when it is absent or empty. */
const char *need(const args *a, const char *name);

/* The value of option `flag` read from s: an integer >= min, or a finite number >= 0; dies otherwise. */
int64_t parse_int_arg(const char *flag, const char *s, int64_t min);
double parse_double_arg(const char *flag, const char *s);

/* 1 and *dtype set when s names a dtype (moe_dtype_from_name: f32, f16, bf16 and their aliases), else 0. */
int parse_dtype(const char *s, moe_dtype *dtype);

/* Prints `moe NAME --help`: the usage, the summary, the details, every option and the example. */
void print_command_help(FILE *out, const command *c);

/* Prints c's example, each line indented by two spaces; its '#' lines only when `comments`. */
void print_example(FILE *out, const command *c, int comments);

#endif /* LIBMOE_CLI_OPTIONS_H */
