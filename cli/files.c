/*
 * cli/files.c: the files a command reads and writes: paths and folders, and the output set (outputs.h)
 * through which every output is claimed before anything is read and written all or nothing.
 */
#include "cli.h"
#include "outputs.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

/* ---------------------------------------------------------------------------------------------------
 * Paths and folders
 * ------------------------------------------------------------------------------------------------- */
char *join_path(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = xmalloc(n, 1);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

void make_dirs(const char *path)
{
    char *copy = join_path(path, "");
    for (char *p = copy + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        struct stat st;
        if (mkdir(copy, 0777) != 0 && (errno != EEXIST || stat(copy, &st) != 0 || !S_ISDIR(st.st_mode)))
            die("%s: cannot create the folder: %s", copy, strerror(errno == EEXIST ? ENOTDIR : errno));
        *p = '/';
    }
    xfree(copy);
}

int is_regular(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* ---------------------------------------------------------------------------------------------------
 * Claiming the files a command writes and reads, before it reads any
 * ------------------------------------------------------------------------------------------------- */
/* Every file the command writes.  A command that fails (die) leaves every existing file as it was: the
 * outputs are written to temporary files, which discard_outputs removes at exit, and only
 * commit_outputs puts them in place. */
static output_set outputs;

void discard_outputs(void) { outputs_discard(&outputs); }

/* Registers path (NULL: none) as an output; refuses a file that another output names already. */
static void add_output(const char *path)
{
    char err[OUTPUTS_ERROR_SIZE];
    if (path != NULL && outputs_add(&outputs, path, err, sizeof err) != 0)
        die("%s", err);
}

/* Registers dir/names[i] for i < n as outputs; paths[i] gets dir/names[i]. */
void add_outputs_in(const char *dir, const char *const *names, int n, char **paths)
{
    for (int i = 0; i < n; i++) {
        paths[i] = join_path(dir, names[i]);
        add_output(paths[i]);
    }
}

/* Refuses an input (NULL: none) that is also an output (register the outputs first). */
void check_input(const char *path)
{
    char err[OUTPUTS_ERROR_SIZE];
    if (path != NULL && outputs_check_input(&outputs, path, err, sizeof err) != 0)
        die("%s", err);
}

/* Registers the files the options `outs` name as outputs, then checks those `ins` name as inputs
 * (NULL-terminated lists of option names; an option not given names no file). */
void claim_files(const args *a, const char *const *outs, const char *const *ins)
{
    for (; *outs != NULL; outs++)
        add_output(get(a, *outs));
    for (; *ins != NULL; ins++)
        check_input(get(a, *ins));
}

/* The first output not committed yet, NULL when none (every command commits all it writes). */
const char *uncommitted_output(void) { return outputs.count != 0 ? outputs.file[0].path : NULL; }

/* ---------------------------------------------------------------------------------------------------
 * Writing results
 * ------------------------------------------------------------------------------------------------- */
/* Writes an array into the temporary file of output `path` (add_output registered it); the file is put
 * in place by commit_outputs. */
void write_array(const char *path, npy_type type, int ndim, const int64_t *shape, const void *data)
{
    char err[OUTPUTS_ERROR_SIZE], note[OUTPUTS_ERROR_SIZE], text[512];
    FILE *f = outputs_open(&outputs, path, err, sizeof err);
    if (f == NULL || npy_write_stream(f, path, type, ndim, shape, data, 0, err, sizeof err) != 0)
        die("%s", err);
    snprintf(note, sizeof note, "wrote %s: shape %s %s", path, npy_format_shape(text, sizeof text, ndim, shape),
             npy_type_name(type));
    if (outputs_close(&outputs, path, note, err, sizeof err) != 0)
        die("%s", err);
}

/* Writes a text file into the temporary file of output `path`, like write_array. */
void write_text(const char *path, const char *text)
{
    char err[OUTPUTS_ERROR_SIZE], note[OUTPUTS_ERROR_SIZE];
    FILE *f = outputs_open(&outputs, path, err, sizeof err);
    if (f == NULL)
        die("%s", err);
    if (fputs(text, f) == EOF)
        die("%s: cannot write: %s", path, strerror(errno));
    snprintf(note, sizeof note, "wrote %s", path);
    if (outputs_close(&outputs, path, note, err, sizeof err) != 0)
        die("%s", err);
}

/* Puts every output of the command in place (all of them written: outputs_commit) and says what it
 * wrote.  Every command that writes calls it once, after its last write_array. */
void commit_outputs(void)
{
    char err[OUTPUTS_ERROR_SIZE];
    if (outputs_commit(&outputs, err, sizeof err) != 0)
        die("%s", err);
    for (size_t i = 0; i < outputs.count; i++)
        if (outputs.file[i].note != NULL)
            printf("%s\n", outputs.file[i].note);
    outputs_discard(&outputs);
}

/* Writes a result of `dtype` as float32, or as the dtype itself with --raw. */
void write_result(const args *a, const char *path, moe_dtype dtype, const void *data, int ndim,
                  const int64_t *shape)
{
    int64_t count = 1;
    for (int i = 0; i < ndim; i++)
        count *= shape[i];
    if (dtype == MOE_F32 || get(a, "--raw") != NULL) {
        write_array(path, dtype == MOE_F32 ? NPY_T_F32 : dtype == MOE_F16 ? NPY_T_F16 : NPY_T_U16, ndim, shape, data);
        return;
    }
    float *f = xmalloc((size_t)count, sizeof *f);
    for (int64_t i = 0; i < count; i++) {
        uint16_t bits = ((const uint16_t *)data)[i];
        f[i] = dtype == MOE_F16 ? moe_f16_to_f32(bits) : moe_bf16_to_f32(bits);
    }
    write_array(path, NPY_T_F32, ndim, shape, f);
    xfree(f);
}
