/* The choice-stream engine of moe-fuzz; see pt.h. */
#include "pt.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------------
 * PRNG
 * ------------------------------------------------------------------------------------------------- */
uint64_t pt_mix(uint64_t x)
{
    uint64_t z = x + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void pt_rng_seed(pt_rng *rng, uint64_t seed)
{
    for (int i = 0; i < 4; i++) {
        seed += 0x9e3779b97f4a7c15ull;
        rng->s[i] = pt_mix(seed);
    }
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t pt_rng_next(pt_rng *rng)
{
    uint64_t *s = rng->s;
    const uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* ---------------------------------------------------------------------------------------------------
 * the choice stream
 * ------------------------------------------------------------------------------------------------- */
static void record(pt_source *src, uint64_t v)
{
    if (src->count == src->cap) {
        src->cap = src->cap ? 2 * src->cap : 256;
        uint64_t *grown = realloc(src->used, src->cap * sizeof *grown);
        if (grown == NULL) {
            fprintf(stderr, "moe-fuzz: out of memory recording choices\n");
            abort();
        }
        src->used = grown;
    }
    src->used[src->count++] = v;
}

uint64_t pt_draw(pt_source *src, uint64_t max)
{
    if (src->count >= PT_MAX_CHOICES) {
        src->overrun = 1;
        return 0;
    }
    uint64_t v;
    if (src->replay) {
        v = src->count < src->given_count ? src->given[src->count] : 0;
        if (v > max)
            v = max;
    } else if (max == UINT64_MAX) {
        v = pt_rng_next(&src->rng);
    } else {
        /* uniform in [0, max] by rejection; small answers get extra weight (1 in 8 draws answers 0, 1 in
         * 8 answers from the bottom eighth) so edge cases come up often */
        const uint64_t pick = pt_rng_next(&src->rng) & 7;
        const uint64_t range = pick == 0 ? 1 : pick == 1 ? max / 8 + 1 : max + 1;
        const uint64_t limit = UINT64_MAX - UINT64_MAX % range;
        uint64_t r;
        do
            r = pt_rng_next(&src->rng);
        while (r >= limit);
        v = r % range;
    }
    record(src, v);
    return v;
}

int64_t pt_int(pt_source *src, int64_t lo, int64_t hi)
{
    return hi <= lo ? lo : lo + (int64_t)pt_draw(src, (uint64_t)(hi - lo));
}

int64_t pt_sized(pt_source *src, int64_t lo, int64_t hi_at_max)
{
    const int64_t span = (hi_at_max - lo) * src->size / PT_MAX_SIZE;
    return pt_int(src, lo, lo + (span > 0 ? span : 0));
}

int pt_bool(pt_source *src) { return (int)pt_draw(src, 1); }

int pt_pick(pt_source *src, int n) { return n <= 1 ? 0 : (int)pt_draw(src, (uint64_t)(n - 1)); }

void pt_permutation(pt_source *src, int64_t n, int64_t *perm)
{
    for (int64_t i = 0; i < n; i++)
        perm[i] = i;
    /* forward Fisher-Yates: position i takes the element i + d; d = 0 keeps the identity */
    for (int64_t i = 0; i + 1 < n; i++) {
        const int64_t j = i + (int64_t)pt_draw(src, (uint64_t)(n - 1 - i)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

/* ---------------------------------------------------------------------------------------------------
 * case reporting
 * ------------------------------------------------------------------------------------------------- */
static void vappend(char *buf, size_t cap, size_t *len, const char *fmt, va_list ap)
{
    if (*len + 1 >= cap)
        return;
    int n = vsnprintf(buf + *len, cap - *len, fmt, ap);
    if (n > 0)
        *len += (size_t)n < cap - *len ? (size_t)n : cap - *len - 1;
}

void pt_fail(pt_case *c, const char *tag, const char *fmt, ...)
{
    if (c->outcome != PT_FAIL) {
        c->outcome = PT_FAIL;
        snprintf(c->tag, sizeof c->tag, "%s", tag);
    }
    va_list ap;
    va_start(ap, fmt);
    vappend(c->msg, sizeof c->msg, &c->msg_len, fmt, ap);
    va_end(ap);
    if (c->msg_len + 2 < sizeof c->msg && (c->msg_len == 0 || c->msg[c->msg_len - 1] != '\n')) {
        c->msg[c->msg_len++] = '\n';
        c->msg[c->msg_len] = '\0';
    }
}

void pt_discard(pt_case *c, const char *why)
{
    if (c->outcome == PT_PASS) {
        c->outcome = PT_DISCARD;
        snprintf(c->tag, sizeof c->tag, "discard");
        snprintf(c->msg, sizeof c->msg, "%s\n", why);
        c->msg_len = strlen(c->msg);
    }
}

void pt_ratio(pt_case *c, double ratio)
{
    if (ratio > c->worst_ratio || ratio != ratio)
        c->worst_ratio = ratio;
}

void pt_describe(pt_case *c, const char *fmt, ...)
{
    size_t len = strlen(c->desc);
    va_list ap;
    va_start(ap, fmt);
    vappend(c->desc, sizeof c->desc, &len, fmt, ap);
    va_end(ap);
}

const pt_op *pt_find_op(const char *name)
{
    for (const pt_op *op = pt_ops; op->name != NULL; op++)
        if (strcmp(op->name, name) == 0)
            return op;
    return NULL;
}

/* ---------------------------------------------------------------------------------------------------
 * reproducers
 * ------------------------------------------------------------------------------------------------- */
char *pt_format_repro(const char *op, int size, int has_seed, uint64_t seed, const uint64_t *choices,
                      size_t count)
{
    const size_t cap = strlen(op) + 64 + (has_seed ? 0 : count * 17);
    char *buf = xmalloc(cap);
    int len = snprintf(buf, cap, "%s:%d:", op, size);
    if (has_seed) {
        snprintf(buf + len, cap - (size_t)len, "s=%" PRIx64, seed);
        return buf;
    }
    len += snprintf(buf + len, cap - (size_t)len, "c=");
    for (size_t i = 0; i < count; i++)
        len += snprintf(buf + len, cap - (size_t)len, i ? ".%" PRIx64 : "%" PRIx64, choices[i]);
    return buf;
}

int pt_parse_repro(const char *line, char *op, size_t op_cap, int *size, int *has_seed, uint64_t *seed,
                   uint64_t **choices, size_t *count, char *err, size_t err_cap)
{
    *choices = NULL;
    *count = 0;
    const char *colon = strchr(line, ':');
    if (colon == NULL || (size_t)(colon - line) >= op_cap || colon == line) {
        snprintf(err, err_cap, "expected OP:SIZE:s=SEED or OP:SIZE:c=CHOICES, got '%s'", line);
        return -1;
    }
    memcpy(op, line, (size_t)(colon - line));
    op[colon - line] = '\0';
    char *end;
    errno = 0;
    long sz = strtol(colon + 1, &end, 10);
    if (errno || end == colon + 1 || *end != ':' || sz < 0 || sz > PT_MAX_SIZE) {
        snprintf(err, err_cap, "'%s': SIZE must be an integer in 0..%d", line, PT_MAX_SIZE);
        return -1;
    }
    *size = (int)sz;
    const char *rest = end + 1;
    if (strncmp(rest, "s=", 2) == 0) {
        errno = 0;
        unsigned long long v = strtoull(rest + 2, &end, 16);
        if (errno || end == rest + 2 || (*end != '\0' && *end != '\n' && *end != ' ' && *end != '\t')) {
            snprintf(err, err_cap, "'%s': SEED must be hexadecimal", line);
            return -1;
        }
        *has_seed = 1;
        *seed = (uint64_t)v;
        return 0;
    }
    if (strncmp(rest, "c=", 2) != 0) {
        snprintf(err, err_cap, "'%s': expected s=SEED or c=CHOICES after the size", line);
        return -1;
    }
    *has_seed = 0;
    const char *p = rest + 2;
    size_t n = 0, cap = 0;
    uint64_t *v = NULL;
    while (*p && *p != '\n' && *p != ' ' && *p != '\t') {
        errno = 0;
        unsigned long long x = strtoull(p, &end, 16);
        if (errno || end == p || (*end != '.' && *end != '\0' && *end != '\n' && *end != ' ' && *end != '\t')) {
            snprintf(err, err_cap, "'%s': choice %zu is not hexadecimal", line, n);
            free(v);
            return -1;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            v = realloc(v, cap * sizeof *v);
            if (v == NULL)
                abort();
        }
        v[n++] = (uint64_t)x;
        p = *end == '.' ? end + 1 : end;
        if (n > PT_MAX_CHOICES) {
            snprintf(err, err_cap, "'%s': more than %d choices", line, PT_MAX_CHOICES);
            free(v);
            return -1;
        }
    }
    *choices = v;
    *count = n;
    return 0;
}

int pt_shortlex_less(const uint64_t *a, size_t na, const uint64_t *b, size_t nb)
{
    if (na != nb)
        return na < nb;
    for (size_t i = 0; i < na; i++)
        if (a[i] != b[i])
            return a[i] < b[i];
    return 0;
}
