/* A command's output files, written all or nothing; see outputs.h. */
#define _XOPEN_SOURCE 700 /* realpath (an XSI function in glibc's headers) */
#include "outputs.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Writes a message into err and gives -1, for `return FAIL(...)`. */
#define FAIL(...) (snprintf(err, errlen, __VA_ARGS__), -1)

/* base (canonical, absolute, malloc'ed) followed by the components of rest: empty and "." ones are
 * dropped and ".." removes the component before it.  Takes base; NULL when out of memory. */
static char *append_components(char *base, const char *rest)
{
    size_t len = strlen(base);
    char *out = realloc(base, len + strlen(rest) + 2);
    if (out == NULL) {
        free(base);
        return NULL;
    }
    while (*rest != '\0') {
        const size_t n = strcspn(rest, "/");
        if (n == 2 && rest[0] == '.' && rest[1] == '.') {
            char *slash = strrchr(out, '/');
            len = slash == out ? 1 : (size_t)(slash - out);
        } else if (n > 0 && !(n == 1 && rest[0] == '.')) {
            if (len > 1)
                out[len++] = '/';
            memcpy(out + len, rest, n);
            len += n;
        }
        out[len] = '\0';
        rest += n + (rest[n] == '/');
    }
    return out;
}

/* path absolute and canonical: realpath of its longest leading part that exists, followed by the rest
 * taken literally (it does not exist yet, so it holds no symbolic links; folders the command creates
 * are real ones).  NULL with errno set when that fails. */
static char *resolve(const char *path)
{
    char *real = realpath(path, NULL);
    if (real != NULL || (errno != ENOENT && errno != ENOTDIR))
        return real;
    char *head = strdup(path);
    if (head == NULL)
        return NULL;
    const char *rest = path;
    for (;;) {
        char *slash = strrchr(head, '/');
        if (slash == NULL) { /* a name relative to the current folder */
            rest = path;
            real = realpath(".", NULL);
            break;
        }
        rest = path + (slash - head) + 1;
        if (slash == head) { /* a name in the root folder */
            real = realpath("/", NULL);
            break;
        }
        *slash = '\0';
        real = realpath(head, NULL);
        if (real != NULL || (errno != ENOENT && errno != ENOTDIR))
            break;
    }
    free(head);
    return real != NULL ? append_components(real, rest) : NULL;
}

/* The output that is the file whose canonical path is key (st: its status, NULL when it is missing), or
 * NULL when none is. */
static const output_file *same_file(const output_set *set, const char *key, const struct stat *st)
{
    for (size_t i = 0; i < set->count; i++) {
        const output_file *o = &set->file[i];
        if (strcmp(o->target, key) == 0 || (o->exists && st != NULL && o->dev == st->st_dev && o->ino == st->st_ino))
            return o;
    }
    return NULL;
}

static output_file *find(output_set *set, const char *path)
{
    for (size_t i = 0; i < set->count; i++)
        if (strcmp(set->file[i].path, path) == 0)
            return &set->file[i];
    return NULL;
}

/* Whether path ends in a file name: not empty, not a folder's ("dir/", ".", "..") */
static int names_a_file(const char *path)
{
    const char *slash = strrchr(path, '/'), *name = slash != NULL ? slash + 1 : path;
    return name[0] != '\0' && strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
}

int outputs_add(output_set *set, const char *path, char *err, size_t errlen)
{
    if (!names_a_file(path))
        return FAIL("'%s': cannot write there: the path does not end in a file name", path);
    struct stat st;
    const int exists = stat(path, &st) == 0;
    if (!exists && errno != ENOENT && errno != ENOTDIR) /* ENOTDIR: creating it fails later, saying so */
        return FAIL("%s: cannot write there: %s", path, strerror(errno));
    if (exists && !S_ISREG(st.st_mode))
        return FAIL("%s: cannot write there: it is %s", path, S_ISDIR(st.st_mode) ? "a folder" : "not a regular file");
    char *target = resolve(path);
    if (target == NULL)
        return FAIL("%s: cannot resolve the path: %s", path, strerror(errno));
    const output_file *same = same_file(set, target, exists ? &st : NULL);
    if (same != NULL) {
        free(target);
        return FAIL("%s and %s are the same file: every output needs a file of its own", same->path, path);
    }
    if (set->count == set->cap) {
        const size_t cap = set->cap ? 2 * set->cap : 8;
        output_file *bigger = realloc(set->file, cap * sizeof *bigger);
        if (bigger == NULL) {
            free(target);
            return FAIL("%s: out of memory", path);
        }
        set->file = bigger;
        set->cap = cap;
    }
    output_file *o = &set->file[set->count];
    memset(o, 0, sizeof *o);
    o->path = strdup(path);
    if (o->path == NULL) {
        free(target);
        return FAIL("%s: out of memory", path);
    }
    o->target = target;
    o->exists = exists;
    if (exists) {
        o->dev = st.st_dev;
        o->ino = st.st_ino;
        o->mode = st.st_mode;
    }
    set->count++;
    return 0;
}

int outputs_check_input(const output_set *set, const char *path, char *err, size_t errlen)
{
    struct stat st;
    const int exists = stat(path, &st) == 0;
    char *key = resolve(path);
    if (key == NULL)
        return FAIL("%s: cannot resolve the path: %s", path, strerror(errno));
    const output_file *same = same_file(set, key, exists ? &st : NULL);
    free(key);
    if (same != NULL)
        return FAIL("%s is both an input and an output (as %s): writing the output would replace the input", path,
                    same->path);
    return 0;
}

/* The mode fopen gives a new file, 0666 less the umask (which can only be read by setting it). */
static mode_t new_file_mode(void)
{
    const mode_t mask = umask(0);
    umask(mask);
    return 0666 & ~mask;
}

/* Removes o's temporary file, if any. */
static void remove_temp(output_file *o)
{
    if (o->temp == NULL)
        return;
    unlink(o->temp);
    free(o->temp);
    o->temp = NULL;
}

FILE *outputs_open(output_set *set, const char *path, char *err, size_t errlen)
{
    output_file *o = find(set, path);
    if (o == NULL || o->temp != NULL || o->complete) {
        snprintf(err, errlen, "%s: internal error: not an output waiting to be written", path);
        return NULL;
    }
    /* beside the target, so that the rename stays in its file system: "DIR/.NAME.moe-XXXXXX" */
    const char *name = strrchr(o->target, '/') + 1;
    const int dir_len = (int)(name - 1 - o->target);
    const size_t size = strlen(o->target) + sizeof "/..moe-XXXXXX";
    o->temp = malloc(size);
    if (o->temp == NULL) {
        snprintf(err, errlen, "%s: out of memory", path);
        return NULL;
    }
    snprintf(o->temp, size, "%.*s/.%s.moe-XXXXXX", dir_len, o->target, name);
    const int fd = mkstemp(o->temp);
    if (fd < 0) {
        snprintf(err, errlen, "%s: cannot create a new file in its folder: %s", path, strerror(errno));
        free(o->temp);
        o->temp = NULL;
        return NULL;
    }
    /* mkstemp makes it 0600: give it what fopen would, or the permissions of the file it replaces */
    const mode_t mode = o->exists ? o->mode & 0777 : new_file_mode();
    if (fchmod(fd, mode) != 0 || (o->stream = fdopen(fd, "wb")) == NULL) {
        snprintf(err, errlen, "%s: cannot open the new file %s: %s", path, o->temp, strerror(errno));
        close(fd);
        remove_temp(o);
        return NULL;
    }
    return o->stream;
}

int outputs_close(output_set *set, const char *path, const char *note, char *err, size_t errlen)
{
    output_file *o = find(set, path);
    if (o == NULL || o->stream == NULL)
        return FAIL("%s: internal error: not an output being written", path);
    FILE *f = o->stream;
    o->stream = NULL;
    int saved = 0;
    if (fflush(f) != 0)
        saved = errno;
    else if (fsync(fileno(f)) != 0 && errno != EINVAL) /* EINVAL: a file system that cannot sync */
        saved = errno;
    if (fclose(f) != 0 && saved == 0)
        saved = errno;
    if (saved != 0) {
        remove_temp(o);
        return FAIL("%s: write error: %s", path, strerror(saved));
    }
    if (note != NULL && (o->note = strdup(note)) == NULL) {
        remove_temp(o);
        return FAIL("%s: out of memory", path);
    }
    o->complete = 1;
    return 0;
}

/* Appends "LABEL P1, P2, ..." for outputs [from, to) of set to err (nothing when the range is empty). */
static void append_paths(char *err, size_t errlen, const char *label, const output_set *set, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++) {
        const size_t used = strlen(err);
        snprintf(err + used, errlen - used, "%s%s", i == from ? label : ", ", set->file[i].path);
    }
}

int outputs_commit(output_set *set, char *err, size_t errlen)
{
    for (size_t i = 0; i < set->count; i++)
        if (!set->file[i].complete || set->file[i].temp == NULL)
            return FAIL("%s: internal error: committed before it was written", set->file[i].path);
    for (size_t i = 0; i < set->count; i++) {
        output_file *o = &set->file[i];
        if (rename(o->temp, o->target) != 0) {
            snprintf(err, errlen, "%s: cannot move the new file into place: %s (so the command's outputs are incomplete)",
                     o->path, strerror(errno));
            append_paths(err, errlen, "; replaced already: ", set, 0, i);
            append_paths(err, errlen, "; left as they were: ", set, i, set->count);
            for (size_t j = i; j < set->count; j++)
                remove_temp(&set->file[j]);
            return -1;
        }
        free(o->temp);
        o->temp = NULL;
    }
    return 0;
}

void outputs_discard(output_set *set)
{
    for (size_t i = 0; i < set->count; i++) {
        output_file *o = &set->file[i];
        if (o->stream != NULL)
            fclose(o->stream);
        remove_temp(o);
        free(o->path);
        free(o->target);
        free(o->note);
    }
    free(set->file);
    memset(set, 0, sizeof *set);
}
