/*
 * cli/main.c: the moe tool's entry point, `moe COMMAND [options]`: the command table, moe --help and main.
 * Exit status: 0 success, 1 compare found a tensor over its tolerance, 2 any error (message on stderr).
 */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The commands, in the order moe --help lists them (each cmd_*.c defines its own): the order of their
 * examples, each of which runs on the files the ones before it made. */
static const command *const commands[] = {
    &route_command,        &gemm_fwd_command,     &compare_command,     &gemm_dx_command,
    &gemm_dw_command,      &fp8_quantize_command, &gemm_fp8_fwd_command, &gemm_fp8_dx_command,
    &gemm_fp8_dw_command,  &mlp_fwd_command,      &mlp_bwd_command,     &autotune_command,
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

static const char general_help[] =
    "Files: NumPy .npy, format 1.0, 2.0 or 3.0, little-endian, C order. Floating inputs may be float16,\n"
    "float32 or float64 (converted to the computation dtype, rounded once to nearest even), or uint16 /\n"
    "2-byte void (ml_dtypes.bfloat16) bit patterns with --dtype bf16 or --dtype f16. Index inputs are\n"
    "int32 or int64. Fortran order, big-endian data, object (pickled) and structured arrays are refused,\n"
    "as is any file whose shape or dtype does not fit, with a message naming the file, the expected and\n"
    "the found shape and dtype.\n"
    "Outputs are float32 (bf16 and f16 results convert exactly) unless --raw asks for the computation\n"
    "dtype; index outputs are int64.\n"
    "Inputs must be regular files (a folder, FIFO or device is refused at once). A command writes all its\n"
    "outputs or none: each goes to a temporary file beside it, and all are renamed into place once every\n"
    "one is complete, so a command that fails changes no existing file. Two outputs naming one file, an\n"
    "output naming an input, and an output that exists but is no regular file are refused before\n"
    "anything is read.\n"
    "\n"
    "Exit status: 0 success; 1 `moe compare` found a difference over its tolerance; 2 an error (usage,\n"
    "an unreadable or refused file, a call the library refused). Errors go to stderr.\n";

static void print_usage(FILE *out)
{
    fprintf(out, "usage: moe COMMAND [options]   (moe COMMAND --help: its options and a worked example;\n"
                 "                                moe help all: every command's help and the rules for files)\n\ncommands:\n");
    for (size_t i = 0; i < NCOMMANDS; i++)
        fprintf(out, "  %-13s %s\n", commands[i]->name, commands[i]->summary);
}

/* moe --help: one screen, a line and an example per command. */
static void print_overview(FILE *out)
{
    fprintf(out, "moe %d.%d.%d: run libmoe's ops on NumPy .npy files (the CPU reference, or --backend cuda) and\n"
                 "compare results. Dump a training step's tensors, recompute the op, compare.\n\n",
            LIBMOE_VERSION_MAJOR, LIBMOE_VERSION_MINOR, LIBMOE_VERSION_PATCH);
    fprintf(out, "usage: moe COMMAND [options]   (moe COMMAND --help: its options and a worked example;\n"
                 "                                moe help all: every command's help and the rules for files)\n\n");
    fprintf(out, "commands, with an example each (each runs on the files the ones before it made):\n");
    for (size_t i = 0; i < NCOMMANDS; i++) {
        fprintf(out, "%-13s %s\n", commands[i]->name, commands[i]->summary);
        print_example(out, commands[i], 0);
    }
    fprintf(out, "\nInputs: .npy files, float16/32/64 (or bf16 bit patterns with --dtype bf16), int32/int64 indices.\n"
                 "Outputs: float32 unless --raw; a command writes all its outputs or none.\n"
                 "Exit status: 0 success, 1 compare found a difference over its tolerance, 2 an error.\n");
}

static void print_full_help(FILE *out)
{
    fprintf(out, "moe %d.%d.%d: run libmoe's ops on NumPy .npy files with the CPU reference, and compare results.\n\n",
            LIBMOE_VERSION_MAJOR, LIBMOE_VERSION_MINOR, LIBMOE_VERSION_PATCH);
    print_usage(out);
    fprintf(out, "\n%s", general_help);
    for (size_t i = 0; i < NCOMMANDS; i++) {
        fprintf(out, "\n----------------------------------------------------------------------------------------------------\n");
        print_command_help(out, commands[i]);
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        print_usage(stderr);
        fprintf(stderr, "\nmoe --help shows an example of each command; moe help all documents every option.\n");
        return EXIT_USAGE;
    }
    const char *name = argv[1];
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0 || strcmp(name, "help") == 0) {
        if (argc > 2 && strcmp(name, "help") == 0 && strcmp(argv[2], "all") == 0) {
            print_full_help(stdout);
            return 0;
        }
        if (argc > 2 && strcmp(name, "help") == 0) {
            for (size_t i = 0; i < NCOMMANDS; i++)
                if (strcmp(commands[i]->name, argv[2]) == 0) {
                    print_command_help(stdout, commands[i]);
                    return 0;
                }
            die("unknown command '%s' (see moe --help)", argv[2]);
        }
        print_overview(stdout);
        return 0;
    }
    if (strcmp(name, "--version") == 0) {
        printf("moe (libmoe) %d.%d.%d\n", LIBMOE_VERSION_MAJOR, LIBMOE_VERSION_MINOR, LIBMOE_VERSION_PATCH);
        return 0;
    }
    for (size_t i = 0; i < NCOMMANDS; i++) {
        if (strcmp(commands[i]->name, name) != 0)
            continue;
        set_command_name(name);
        args a;
        parse_args(commands[i], argc - 2, argv + 2, &a);
        atexit(discard_outputs);
        int status = commands[i]->run(&a);
        const char *uncommitted = uncommitted_output();
        if (uncommitted != NULL)
            die("internal error: %s was written but not committed", uncommitted);
        if (fflush(stdout) != 0)
            die("cannot write to standard output");
        return status;
    }
    die("unknown command '%s' (see moe --help)", name);
}
