/*
 * An output set: the files one command of the moe tool writes, written all or nothing.
 *
 * Before it reads anything, a command registers every file it will write (outputs_add) and checks
 * every file it will read against them (outputs_check_input).  Both compare files by identity: the
 * path made absolute and canonical (symbolic links resolved as far as the path exists), and device
 * and inode for a file that exists, so "y.npy", "./y.npy" and a hard link of it are one file.  Two
 * outputs naming one file, an output naming an input, and an output that exists but is not a regular
 * file (a folder, a device) are refused.
 *
 * Each output is then written into a new temporary file beside its destination (outputs_open,
 * outputs_close: flushed, synced and closed, every step checked), and only once every output is
 * complete does outputs_commit rename them into place, each rename atomic.  outputs_discard removes
 * every temporary not renamed yet, so a command that fails before the commit changes no existing
 * file.  A new file gets the mode fopen would give it (0666 less the umask); a replaced one keeps its
 * permission bits.  An output that is a symbolic link to a file replaces the file it points to.
 *
 * Every function that can fail returns 0, or -1 (NULL for outputs_open) with "PATH: why" in err.
 */
#ifndef LIBMOE_CLI_OUTPUTS_H
#define LIBMOE_CLI_OUTPUTS_H

#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

#define OUTPUTS_ERROR_SIZE 4096

typedef struct output_file {
    char *path;   /* as the command names it: the messages use it */
    char *target; /* the file replaced: path absolute and canonical */
    int exists;   /* target existed when registered: dev, ino and mode are its */
    dev_t dev;
    ino_t ino;
    mode_t mode;
    char *temp;   /* the temporary file beside target, from outputs_open until renamed or removed */
    FILE *stream; /* open from outputs_open to outputs_close */
    int complete; /* written, flushed, synced and closed */
    char *note;   /* the caller's line about what was written (outputs_close), for after the commit */
} output_file;

typedef struct output_set {
    output_file *file;
    size_t count, cap;
} output_set; /* zero-initialised: empty */

/* Registers path as an output; refuses one that names the same file as an earlier output, an existing
 * file that is not a regular one, and a path that does not end in a file name ("", "dir/", ".."). */
int outputs_add(output_set *set, const char *path, char *err, size_t errlen);

/* Refuses an input that names the same file as a registered output. */
int outputs_check_input(const output_set *set, const char *path, char *err, size_t errlen);

/* A new temporary file for the registered output path, open for writing. */
FILE *outputs_open(output_set *set, const char *path, char *err, size_t errlen);

/* Flushes, syncs and closes what outputs_open gave for path; the output is then complete.  note
 * (copied, may be NULL) is kept for the caller to print after the commit. */
int outputs_close(output_set *set, const char *path, const char *note, char *err, size_t errlen);

/* Renames every output into place; each must be complete.  A rename that fails (rare: the destination
 * changed meanwhile, or a disk error) stops the commit: err then says which outputs were replaced
 * already and which were not, and the temporaries not renamed are removed. */
int outputs_commit(output_set *set, char *err, size_t errlen);

/* Closes what is open, removes every temporary file not renamed, and empties the set. */
void outputs_discard(output_set *set);

#endif /* LIBMOE_CLI_OUTPUTS_H */
