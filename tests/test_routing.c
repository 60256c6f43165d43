/* Routing (SEMANTICS section 1): moe_routing_from_topk against an independent stable sort, and
 * moe_routing_validate on valid routings and on every kind of invalid one.
 *
 *   - from_topk: m_sizes, gather_indices (the stable sort of the flattened ids by expert, computed here
 *     by scanning the experts in order) and scatter_indices (its inverse) on random and edge inputs:
 *     T = 0, T = 1, topk = 1, topk = E, E much larger than T, all slots on one expert, empty first/last
 *     experts; with and without scatter_indices;
 *   - from_topk with an out-of-range id (negative, E, huge; first, middle, last slot): returns
 *     MOE_ERR_INVALID_INDEX, names topk_ids[t][j] and the value, and writes nothing (outputs are
 *     poisoned with a byte pattern and compared after);
 *   - validate: accepts the routings built above (with and without gather) and rejects each defect with
 *     the expected status and a message naming the offending argument.
 *
 * Usage: test_routing [seed] */
#include "moe.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "check.h"

static uint64_t rng_state;
static uint64_t next_random(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static int64_t below(int64_t n) { return n <= 1 ? 0 : (int64_t)(next_random() % (uint64_t)n); }

enum { POISON = 0xA7 };

static int all_bytes(const void *p, size_t bytes, unsigned char value)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < bytes; i++)
        if (b[i] != value)
            return 0;
    return 1;
}

/* Short text of an id array for failure lines (first 24 entries). */
static const char *ids_text(const int64_t *ids, int64_t count)
{
    static char text[512];
    size_t used = 0;
    text[0] = '\0';
    for (int64_t i = 0; i < count && i < 24 && used < sizeof text - 32; i++)
        used += (size_t)snprintf(text + used, sizeof text - used, "%s%" PRId64, i ? "," : "", ids[i]);
    if (count > 24)
        snprintf(text + used, sizeof text - used, ",...");
    return text;
}

/* ---- moe_routing_from_topk against the independent stable sort ---- */

static void check_from_topk(const char *label, int64_t T, int64_t k, int64_t E, const int64_t *ids)
{
    const int64_t M = T * k;
    int64_t *m_sizes = xmalloc((size_t)E * 8), *gather = xmalloc((size_t)M * 8), *scatter = xmalloc((size_t)M * 8);
    int64_t *want_sizes = xmalloc((size_t)E * 8), *want_gather = xmalloc((size_t)M * 8);

    /* independent: scan the experts in order, and within one expert the slots in ascending order */
    int64_t r = 0;
    for (int64_t e = 0; e < E; e++) {
        want_sizes[e] = 0;
        for (int64_t s = 0; s < M; s++)
            if (ids[s] == e) {
                want_gather[r++] = s;
                want_sizes[e]++;
            }
    }

    for (int with_scatter = 0; with_scatter < 2; with_scatter++) {
        memset(m_sizes, POISON, (size_t)E * 8);
        memset(gather, POISON, (size_t)M * 8);
        memset(scatter, POISON, (size_t)M * 8);
        moe_status st = moe_routing_from_topk(T, k, E, M ? ids : NULL, m_sizes, M ? gather : NULL,
                                              with_scatter ? (M ? scatter : NULL) : NULL);
        CHECK(st == MOE_OK, "%s: from_topk(T=%" PRId64 " k=%" PRId64 " E=%" PRId64 " ids=%s) = %d (%s)", label, T, k,
              E, ids_text(ids, M), (int)st, moe_last_error());
        CHECK(moe_last_error()[0] == '\0', "%s: moe_last_error() not empty after success: %s", label,
              moe_last_error());
        if (st != MOE_OK)
            continue;
        for (int64_t e = 0; e < E; e++)
            CHECK(m_sizes[e] == want_sizes[e], "%s: T=%" PRId64 " k=%" PRId64 " E=%" PRId64 " ids=%s: m_sizes[%" PRId64
                  "] = %" PRId64 ", expected %" PRId64, label, T, k, E, ids_text(ids, M), e, m_sizes[e], want_sizes[e]);
        for (int64_t i = 0; i < M; i++)
            CHECK(gather[i] == want_gather[i], "%s: T=%" PRId64 " k=%" PRId64 " E=%" PRId64 " ids=%s: gather[%" PRId64
                  "] = %" PRId64 ", expected %" PRId64 " (stable order)", label, T, k, E, ids_text(ids, M), i,
                  gather[i], want_gather[i]);
        if (with_scatter)
            for (int64_t i = 0; i < M; i++)
                CHECK(scatter[want_gather[i]] == i, "%s: T=%" PRId64 " k=%" PRId64 " E=%" PRId64 " ids=%s: scatter[%"
                      PRId64 "] = %" PRId64 ", expected %" PRId64, label, T, k, E, ids_text(ids, M), want_gather[i],
                      scatter[want_gather[i]], i);
        else
            CHECK(all_bytes(scatter, (size_t)M * 8, POISON), "%s: scatter buffer written though NULL was passed",
                  label);

        /* the result is a valid routing, with and without requiring gather, and without gather */
        moe_routing routing = {T, k, E, m_sizes, M ? gather : NULL};
        st = moe_routing_validate(&routing, 1);
        CHECK(st == MOE_OK, "%s: validate(from_topk result, require_gather=1) = %d (%s)", label, (int)st,
              moe_last_error());
        st = moe_routing_validate(&routing, 0);
        CHECK(st == MOE_OK, "%s: validate(from_topk result, require_gather=0) = %d (%s)", label, (int)st,
              moe_last_error());
        routing.gather_indices = NULL;
        st = moe_routing_validate(&routing, 0);
        CHECK(st == MOE_OK, "%s: validate(no gather, require_gather=0) = %d (%s)", label, (int)st, moe_last_error());
    }
    free(m_sizes), free(gather), free(scatter), free(want_sizes), free(want_gather);
}

static void from_topk_cases(void)
{
    int64_t ids[4096] = {0};
    /* T = 0 (also with topk 0, and with NULL pointers: nothing to read or write but m_sizes) */
    check_from_topk("T=0", 0, 4, 5, ids);
    check_from_topk("T=0,k=0", 0, 0, 3, ids);
    /* T = 1 */
    ids[0] = 2;
    check_from_topk("T=1,k=1", 1, 1, 4, ids);
    ids[0] = 3, ids[1] = 0, ids[2] = 2;
    check_from_topk("T=1,k=3", 1, 3, 4, ids);
    /* topk = E: every token picks every expert, in a random order */
    for (int64_t t = 0; t < 9; t++) {
        int64_t *row = ids + t * 5;
        for (int64_t j = 0; j < 5; j++)
            row[j] = j;
        for (int64_t j = 4; j > 0; j--) {
            int64_t o = below(j + 1), tmp = row[j];
            row[j] = row[o], row[o] = tmp;
        }
    }
    check_from_topk("topk=E", 9, 5, 5, ids);
    /* topk = E = 1 */
    for (int64_t t = 0; t < 7; t++)
        ids[t] = 0;
    check_from_topk("topk=E=1", 7, 1, 1, ids);
    /* E much larger than T */
    for (int64_t s = 0; s < 3 * 2; s++)
        ids[s] = below(1000);
    check_from_topk("E>>T", 3, 2, 1000, ids);
    /* all slots on one expert (also repeated within a token), the first, a middle and the last */
    static const int64_t which[] = {0, 3, 7};
    for (int w = 0; w < 3; w++) {
        for (int64_t s = 0; s < 11 * 2; s++)
            ids[s] = which[w];
        check_from_topk("one expert", 11, 2, 8, ids);
    }
    /* empty first and last experts */
    for (int64_t s = 0; s < 13 * 3; s++)
        ids[s] = 1 + below(4);
    check_from_topk("empty first+last", 13, 3, 6, ids);
    /* alternating empty experts */
    for (int64_t s = 0; s < 10 * 2; s++)
        ids[s] = 2 * below(4) + 1;
    check_from_topk("alternating", 10, 2, 8, ids);
    /* random */
    for (int trial = 0; trial < 300; trial++) {
        const int64_t T = below(40), k = 1 + below(6), E = 1 + below(trial % 3 == 0 ? 300 : 12);
        for (int64_t s = 0; s < T * k; s++)
            ids[s] = below(E);
        char label[64];
        snprintf(label, sizeof label, "random trial %d", trial);
        check_from_topk(label, T, k, E, ids);
    }
}

/* Out-of-range ids: MOE_ERR_INVALID_INDEX, message names topk_ids[t][j] and the value, nothing written. */
static void from_topk_bad_ids(void)
{
    const int64_t T = 5, k = 3, E = 4, M = T * k;
    static const int64_t bad_values[] = {-1, 4, 5, INT64_MAX, INT64_MIN, -4};
    static const int64_t positions[] = {0, 7, 14};
    for (size_t v = 0; v < sizeof bad_values / sizeof bad_values[0]; v++)
        for (size_t p = 0; p < sizeof positions / sizeof positions[0]; p++) {
            int64_t ids[15], m_sizes[4], gather[15], scatter[15];
            for (int64_t s = 0; s < M; s++)
                ids[s] = s % E;
            ids[positions[p]] = bad_values[v];
            memset(m_sizes, POISON, sizeof m_sizes);
            memset(gather, POISON, sizeof gather);
            memset(scatter, POISON, sizeof scatter);
            moe_status st = moe_routing_from_topk(T, k, E, ids, m_sizes, gather, scatter);
            CHECK(st == MOE_ERR_INVALID_INDEX, "from_topk(ids[%" PRId64 "] = %" PRId64 ") = %d, expected %d",
                  positions[p], bad_values[v], (int)st, (int)MOE_ERR_INVALID_INDEX);
            char name[64], value[32];
            snprintf(name, sizeof name, "topk_ids[%" PRId64 "][%" PRId64 "]", positions[p] / k, positions[p] % k);
            snprintf(value, sizeof value, "%" PRId64, bad_values[v]);
            const char *msg = moe_last_error();
            CHECK(strstr(msg, name) != NULL && strstr(msg, value) != NULL,
                  "from_topk(ids[%" PRId64 "] = %" PRId64 "): message \"%s\" does not name %s and %s", positions[p],
                  bad_values[v], msg, name, value);
            CHECK(all_bytes(m_sizes, sizeof m_sizes, POISON) && all_bytes(gather, sizeof gather, POISON) &&
                      all_bytes(scatter, sizeof scatter, POISON),
                  "from_topk(ids[%" PRId64 "] = %" PRId64 ") wrote to an output before failing", positions[p],
                  bad_values[v]);
        }
}

/* Overlapping or misaligned arrays: refused before any is read or written (m_sizes
 * on top of topk_ids was accepted, and the sort then indexed with the ids it had overwritten). */
static void from_topk_bad_arrays(void)
{
    enum { T = 4, k = 1, E = 4, M = T * k };
    int64_t buf[3 * M + 2], gather[M], scatter[M];
    struct {
        const char *label;
        moe_status want;
        const char *needle;
        const int64_t *ids;
        int64_t *m_sizes, *gather, *scatter;
    } cases[] = {
        {"m_sizes on topk_ids", MOE_ERR_INVALID_OPTION, "output m_sizes overlaps input topk_ids", buf, buf,
         gather, scatter},
        {"gather on topk_ids", MOE_ERR_INVALID_OPTION, "output gather_indices overlaps input topk_ids", buf,
         buf + 2 * M, buf + 1, NULL},
        {"scatter on gather", MOE_ERR_INVALID_OPTION, "overlaps", buf, buf + 2 * M, gather, gather + 1},
        {"topk_ids misaligned", MOE_ERR_MISALIGNED, "topk_ids at",
         (const int64_t *)(const void *)((const char *)buf + 4), buf + 2 * M, gather, NULL},
        {"gather misaligned", MOE_ERR_MISALIGNED, "gather_indices at", buf, buf + 2 * M,
         (int64_t *)(void *)((char *)gather + 2), NULL},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        for (int64_t s = 0; s < 3 * M + 2; s++)
            buf[s] = 0; /* ids all 0: a valid routing when read in place */
        memset(gather, POISON, sizeof gather);
        memset(scatter, POISON, sizeof scatter);
        const moe_status st = moe_routing_from_topk(T, k, E, cases[c].ids, cases[c].m_sizes, cases[c].gather,
                                                    cases[c].scatter);
        int64_t nonzero = 0;
        for (int64_t s = 0; s < 3 * M + 2; s++)
            nonzero += buf[s] != 0;
        CHECK(st == cases[c].want && strstr(moe_last_error(), cases[c].needle) != NULL &&
                  strstr(moe_last_error(), "moe_routing_from_topk") != NULL,
              "from_topk %s: status %d, \"%s\"", cases[c].label, (int)st, moe_last_error());
        CHECK(nonzero == 0 && all_bytes(gather, sizeof gather, POISON) && all_bytes(scatter, sizeof scatter, POISON),
              "from_topk %s wrote before failing", cases[c].label);
    }
}

/* ---- moe_routing_validate rejections ---- */

static void expect_invalid(const char *what, const moe_routing *routing, int require_gather, moe_status want,
                           const char *needle)
{
    moe_status st = moe_routing_validate(routing, require_gather);
    const char *msg = moe_last_error();
    CHECK(st == want, "validate(%s) = %d (%s), expected %d (%s); message \"%s\"", what, (int)st, moe_strerror(st),
          (int)want, moe_strerror(want), msg);
    CHECK(msg[0] != '\0', "validate(%s): moe_last_error() is empty", what);
    CHECK(needle == NULL || strstr(msg, needle) != NULL, "validate(%s): message \"%s\" does not contain \"%s\"", what,
          msg, needle);
    CHECK(strstr(msg, "moe_routing_validate") != NULL, "validate(%s): message \"%s\" does not name the function",
          what, msg);
}

static void validate_cases(void)
{
    /* base: T=6, k=2, E=5, a valid routing */
    const int64_t T = 6, k = 2, E = 5, M = T * k;
    int64_t ids[12], m_sizes[5], gather[12];
    for (int64_t s = 0; s < M; s++)
        ids[s] = (s * 3 + 1) % 4; /* expert 4 is empty */
    CHECK(moe_routing_from_topk(T, k, E, ids, m_sizes, gather, NULL) == MOE_OK, "base routing: %s", moe_last_error());
    int64_t ms[5], g[12];
    moe_routing r;
#define RESET() (memcpy(ms, m_sizes, sizeof ms), memcpy(g, gather, sizeof g), r = (moe_routing){T, k, E, ms, g})

    RESET();
    CHECK(moe_routing_validate(&r, 1) == MOE_OK, "base routing rejected: %s", moe_last_error());

    /* misaligned arrays, refused before they are read */
    int64_t shifted[14];
    RESET();
    memcpy((char *)shifted + 4, m_sizes, sizeof m_sizes);
    r.m_sizes = (const int64_t *)(const void *)((const char *)shifted + 4);
    expect_invalid("m_sizes misaligned", &r, 1, MOE_ERR_MISALIGNED, "routing.m_sizes at");
    RESET();
    memcpy((char *)shifted + 2, gather, sizeof gather);
    r.gather_indices = (const int64_t *)(const void *)((const char *)shifted + 2);
    expect_invalid("gather_indices misaligned", &r, 1, MOE_ERR_MISALIGNED, "routing.gather_indices at");

    /* negative size (sum kept right) */
    RESET();
    ms[3] = -2, ms[4] += m_sizes[3] + 2; /* sum kept; the negative entry comes first */
    expect_invalid("m_sizes[3] = -2", &r, 0, MOE_ERR_INVALID_ROUTING, "m_sizes[3]");
    RESET();
    ms[0] = -1, ms[4] = m_sizes[0] + 1;
    expect_invalid("m_sizes[0] = -1", &r, 1, MOE_ERR_INVALID_ROUTING, "m_sizes[0]");
    /* sum too small, too large, and huge entries that would overflow a naive sum */
    RESET();
    ms[1]--;
    expect_invalid("sum(m_sizes) = T*k - 1", &r, 0, MOE_ERR_INVALID_ROUTING, "m_sizes");
    RESET();
    ms[4]++;
    expect_invalid("sum(m_sizes) = T*k + 1", &r, 0, MOE_ERR_INVALID_ROUTING, "m_sizes");
    RESET();
    ms[2] += 100;
    expect_invalid("sum(m_sizes) = T*k + 100", &r, 1, MOE_ERR_INVALID_ROUTING, "m_sizes");
    RESET();
    ms[0] = INT64_MAX, ms[1] = INT64_MAX;
    expect_invalid("m_sizes = {INT64_MAX, INT64_MAX, ...}", &r, 0, MOE_ERR_INVALID_ROUTING, "m_sizes");
    RESET();
    ms[0] = INT64_MIN;
    expect_invalid("m_sizes[0] = INT64_MIN", &r, 0, MOE_ERR_INVALID_ROUTING, "m_sizes[0]");
    /* gather out of range, both ends, with and without require_gather (a given gather is always checked) */
    RESET();
    g[5] = M;
    expect_invalid("gather[5] = T*k", &r, 1, MOE_ERR_INVALID_ROUTING, "gather_indices[5]");
    RESET();
    g[0] = -1;
    expect_invalid("gather[0] = -1", &r, 0, MOE_ERR_INVALID_ROUTING, "gather_indices[0]");
    RESET();
    g[11] = INT64_MIN;
    expect_invalid("gather[11] = INT64_MIN", &r, 1, MOE_ERR_INVALID_ROUTING, "gather_indices[11]");
    RESET();
    g[3] = INT64_MAX;
    expect_invalid("gather[3] = INT64_MAX", &r, 1, MOE_ERR_INVALID_ROUTING, "gather_indices[3]");
    /* duplicate entry: the later index is named */
    RESET();
    g[9] = g[2];
    expect_invalid("gather[9] = gather[2]", &r, 1, MOE_ERR_INVALID_ROUTING, "gather_indices[9]");
    RESET();
    g[1] = g[0];
    expect_invalid("gather[1] = gather[0]", &r, 0, MOE_ERR_INVALID_ROUTING, "gather_indices[1]");
    /* NULL m_sizes, NULL gather when required */
    RESET();
    r.m_sizes = NULL;
    expect_invalid("m_sizes NULL", &r, 0, MOE_ERR_NULL_POINTER, "m_sizes");
    RESET();
    r.gather_indices = NULL;
    expect_invalid("gather NULL, required", &r, 1, MOE_ERR_NULL_POINTER, "gather_indices");
    RESET();
    r.gather_indices = NULL;
    CHECK(moe_routing_validate(&r, 0) == MOE_OK, "gather NULL, not required: rejected: %s", moe_last_error());
    CHECK(moe_last_error()[0] == '\0', "moe_last_error() not cleared by a successful validate: %s", moe_last_error());
    /* dimensions */
    RESET();
    r.num_tokens = -1;
    expect_invalid("T = -1", &r, 0, MOE_ERR_INVALID_SHAPE, "num_tokens");
    RESET();
    r.num_tokens = INT64_MIN;
    expect_invalid("T = INT64_MIN", &r, 0, MOE_ERR_INVALID_SHAPE, "num_tokens");
    RESET();
    r.topk = 0;
    expect_invalid("topk = 0, T > 0", &r, 0, MOE_ERR_INVALID_SHAPE, "topk");
    RESET();
    r.topk = -2;
    expect_invalid("topk = -2", &r, 0, MOE_ERR_INVALID_SHAPE, "topk");
    RESET();
    r.num_experts = 0;
    expect_invalid("E = 0", &r, 0, MOE_ERR_INVALID_SHAPE, "num_experts");
    RESET();
    r.num_experts = -3;
    expect_invalid("E = -3", &r, 0, MOE_ERR_INVALID_SHAPE, "num_experts");
    RESET();
    r.num_tokens = (int64_t)1 << 40, r.topk = (int64_t)1 << 30;
    expect_invalid("T*k = 2^70", &r, 0, MOE_ERR_OVERFLOW, "num_tokens");
    RESET();
    r.num_tokens = INT64_MAX, r.topk = 2;
    expect_invalid("T*k = 2*INT64_MAX", &r, 1, MOE_ERR_OVERFLOW, "num_tokens");
    RESET();
    expect_invalid("NULL routing", NULL, 0, MOE_ERR_NULL_POINTER, "routing");

    /* valid edge routings */
    int64_t zeros[5] = {0, 0, 0, 0, 0};
    moe_routing empty = {0, 2, 5, zeros, NULL};
    CHECK(moe_routing_validate(&empty, 1) == MOE_OK, "T=0 with NULL gather and require_gather rejected: %s",
          moe_last_error());
    empty.topk = 0;
    CHECK(moe_routing_validate(&empty, 1) == MOE_OK, "T=0, topk=0 rejected: %s", moe_last_error());
    int64_t one[1] = {3}, perm[3] = {2, 0, 1};
    moe_routing single = {3, 1, 1, one, perm};
    CHECK(moe_routing_validate(&single, 1) == MOE_OK, "E=1 with a non-identity permutation rejected: %s",
          moe_last_error());
#undef RESET
}

int main(int argc, char **argv)
{
    const uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 20261124;
    printf("seed %llu\n", (unsigned long long)seed);
    rng_state = seed;
    from_topk_cases();
    from_topk_bad_ids();
    from_topk_bad_arrays();
    validate_cases();
    if (failures) {
        printf("%ld failures (seed %llu)\n", failures, (unsigned long long)seed);
        return 1;
    }
    printf("all routing checks passed\n");
    return 0;
}
