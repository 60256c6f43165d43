/*
 * cli/memory.c: how the moe tool stops on an error (die) and the registry of the heap blocks it holds,
 * freed at exit so that the tool is leak-free under AddressSanitizer also after die().
 */
#include "cli.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static char current_command[32] = "moe";

void set_command_name(const char *name) { snprintf(current_command, sizeof current_command, "moe %s", name); }

_Noreturn void die(const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "%s: ", current_command);
    vfprintf(stderr, fmt, args);
    fprintf(stderr, "\n");
    va_end(args);
    exit(EXIT_USAGE);
}

/* Every heap block the tool holds is owned by this registry and freed at exit (also after die()), so
 * that the tool is leak-free under AddressSanitizer: xmalloc and own() register, xrealloc moves, xfree
 * unregisters. */
static void **owned;
static size_t num_owned, cap_owned;

static void free_owned(void)
{
    for (size_t i = 0; i < num_owned; i++)
        free(owned[i]);
    free(owned);
    owned = NULL;
    num_owned = cap_owned = 0;
}

void own(void *p)
{
    if (p == NULL)
        return;
    if (num_owned == cap_owned) {
        size_t cap = cap_owned ? 2 * cap_owned : 64;
        void **bigger = realloc(owned, cap * sizeof *owned);
        if (bigger == NULL) {
            free(p);
            die("out of memory");
        }
        if (owned == NULL)
            atexit(free_owned);
        owned = bigger;
        cap_owned = cap;
    }
    owned[num_owned++] = p;
}

/* The registry slot of p (the newest first: blocks are mostly freed soon after they are made). */
static size_t owned_slot(const void *p)
{
    for (size_t i = num_owned; i-- > 0;)
        if (owned[i] == p)
            return i;
    fprintf(stderr, "moe: internal error: freeing a block the tool does not own\n");
    abort();
}

void xfree(void *p)
{
    if (p == NULL)
        return;
    const size_t i = owned_slot(p);
    owned[i] = owned[--num_owned];
    free(p);
}

void *xmalloc(size_t count, size_t size)
{
    if (size != 0 && count > SIZE_MAX / size)
        die("out of memory (%zu x %zu bytes)", count, size);
    const size_t bytes = count * size;
    void *p = malloc(bytes ? bytes : 1);
    if (p == NULL)
        die("out of memory (%zu bytes)", bytes);
    own(p);
    return p;
}

void *xrealloc(void *p, size_t count, size_t size)
{
    if (size != 0 && count > SIZE_MAX / size)
        die("out of memory (%zu x %zu bytes)", count, size);
    const size_t i = owned_slot(p), bytes = count * size;
    void *bigger = realloc(p, bytes != 0 ? bytes : 1);
    if (bigger == NULL)
        die("out of memory (%zu bytes)", bytes);
    owned[i] = bigger;
    return bigger;
}

/* a * b * c elements, refusing products past 64 bits (e.g. an (M, 0) input with a huge M) */
size_t elements(int64_t a, int64_t b, int64_t c)
{
    if (a < 0 || b < 0 || c < 0 || (a != 0 && b > INT64_MAX / a) || (a * b != 0 && c > INT64_MAX / (a * b)) ||
        (uint64_t)(a * b * c) > SIZE_MAX / 8)
        die("an output of %lld x %lld x %lld elements is too large", (long long)a, (long long)b, (long long)c);
    return (size_t)(a * b * c);
}
