/* The routing and MLP layout builders on a backend (moe_routing_build, moe_mlp_layout_build_on) against
 * the host builders (moe_routing_from_topk, moe_mlp_layout_build):
 *   1. random routings (skewed: empty experts, crowded experts, T = 0, k = E, E = 1; E = 1024, 1025 and 1500,
 *      one expert per CTA of the device builders and more), both layout kinds, both padding marks, every
 *      dtype, weights or none, block sizes 1..128, capacity = the bound of
 *      moe_mlp_layout_max_blocks (+ 0 or 3): the outputs equal the host builders' bit for bit, the blocks
 *      past the routing's own count are padding of expert E-1, num_blocks_used and num_dropped agree, and
 *      the used count never exceeds the bound;
 *   2. an id out of range, or repeated within its token (layouts), anywhere: the same status as the host
 *      builder, a message naming the same entry, and no output byte written;
 *   3. a capacity below the bound is refused before anything runs.
 * Built twice: tests/test_builders runs MOE_BACKEND_REF (host arrays); proptest/test_gpu_builders
 * (-DMOE_TEST_CUDA) runs MOE_BACKEND_CUDA on device copies and exits 77 where no device is visible.
 * usage: test_builders [seed] [trials] */
#include "moe.h"
#include "moe_mlp.h"

#include "alloc.h"
#include "check.h"

#include <inttypes.h>
#include <stdint.h>
#include <string.h>

#ifdef MOE_TEST_CUDA
#include <cuda_runtime_api.h>
static const moe_backend backend = MOE_BACKEND_CUDA;
static void *b_alloc(size_t bytes)
{
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 16) != cudaSuccess) {
        fprintf(stderr, "cudaMalloc of %zu bytes failed\n", bytes);
        exit(2);
    }
    return p;
}
static void b_put(void *dst, const void *src, size_t bytes)
{
    CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice) == cudaSuccess, "upload");
}
static void b_get(void *dst, const void *src, size_t bytes)
{
    CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost) == cudaSuccess, "download");
}
static void b_free(void *p) { cudaFree(p); }
#else
static const moe_backend backend = MOE_BACKEND_REF;
static void *b_alloc(size_t bytes) { return xmalloc(bytes); }
static void b_put(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }
static void b_get(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }
static void b_free(void *p) { free(p); }
#endif

static uint64_t rng_state;
static uint64_t next_u64(void) /* splitmix64 */
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static int64_t below(int64_t n) { return n > 0 ? (int64_t)(next_u64() % (uint64_t)n) : 0; }

/* A backend copy of `bytes` bytes of host data (or poison bytes 0xA5 when host is NULL). */
static void *b_copy(const void *host, size_t bytes)
{
    void *p = b_alloc(bytes);
    if (host != NULL) {
        b_put(p, host, bytes);
    } else {
        unsigned char *poison = xmalloc(bytes ? bytes : 1);
        memset(poison, 0xA5, bytes);
        b_put(p, poison, bytes);
        free(poison);
    }
    return p;
}

/* The status of the call plus, on the CUDA backend, what the device detected. */
static moe_status settle(moe_status status)
{
    if (status != MOE_OK)
        return status;
    return moe_backend_synchronize(backend, NULL);
}

/* k distinct experts per token: uniform, crowded onto the first k + 1 experts (3 in 4 draws), or on the
 * even experts only (when there are at least k of them; odd experts stay empty). */
static void draw_ids(int64_t T, int64_t k, int64_t E, int64_t *ids)
{
    int style = (int)below(3);
    if (style == 2 && (E + 1) / 2 < k)
        style = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++) {
            int64_t e, again;
            do {
                if (style == 1 && below(4) != 0)
                    e = below(k + 1 < E ? k + 1 : E);
                else if (style == 2)
                    e = below((E + 1) / 2) * 2;
                else
                    e = below(E);
                again = 0;
                for (int64_t q = 0; q < j; q++)
                    again |= ids[t * k + q] == e;
            } while (again);
            ids[t * k + j] = e;
        }
}

static void check_routing(int trial, int64_t T, int64_t k, int64_t E, const int64_t *ids)
{
    const int64_t M = T * k;
    int64_t *m = xmalloc((size_t)E * 8), *g = xmalloc((size_t)M * 8 + 8), *s = xmalloc((size_t)M * 8 + 8);
    CHECK(moe_routing_from_topk(T, k, E, ids, m, g, s) == MOE_OK, "trial %d: host routing: %s", trial,
          moe_last_error());
    int64_t *d_ids = b_copy(ids, (size_t)M * 8), *d_m = b_copy(NULL, (size_t)E * 8);
    int64_t *d_g = b_copy(NULL, (size_t)M * 8), *d_s = b_copy(NULL, (size_t)M * 8);
    const moe_status st = settle(moe_routing_build(backend, T, k, E, d_ids, d_m, d_g, d_s, NULL));
    CHECK(st == MOE_OK, "trial %d: moe_routing_build: %s", trial, moe_last_error());
    int64_t *bm = xmalloc((size_t)E * 8), *bg = xmalloc((size_t)M * 8 + 8), *bs = xmalloc((size_t)M * 8 + 8);
    b_get(bm, d_m, (size_t)E * 8);
    b_get(bg, d_g, (size_t)M * 8);
    b_get(bs, d_s, (size_t)M * 8);
    CHECK(memcmp(bm, m, (size_t)E * 8) == 0, "trial %d (T=%" PRId64 " k=%" PRId64 " E=%" PRId64 "): m_sizes differ",
          trial, T, k, E);
    CHECK(memcmp(bg, g, (size_t)M * 8) == 0, "trial %d: gather_indices differ", trial);
    CHECK(memcmp(bs, s, (size_t)M * 8) == 0, "trial %d: scatter_indices differ", trial);
    b_free(d_ids), b_free(d_m), b_free(d_g), b_free(d_s);
    free(m), free(g), free(s), free(bm), free(bg), free(bs);
}

/* One layout case of `kind` with options o, weights or none, and `extra` blocks of capacity past the bound. */
static void check_layout(int trial, int64_t T, int64_t k, int64_t E, const int64_t *ids, moe_mlp_layout_kind kind,
                         const moe_mlp_options *o, int with_weights, int64_t extra)
{
    const int64_t M = T * k, B = o->block_size;
    const size_t es = moe_dtype_size(o->dtype);
    unsigned char *w = xmalloc((size_t)M * es + 1);
    for (size_t q = 0; q < (size_t)M * es; q++)
        w[q] = (unsigned char)below(256);
    int64_t U = 0, cap = 0;
    CHECK(moe_mlp_layout_num_blocks(kind, T, k, E, ids, o, &U) == MOE_OK, "num_blocks: %s", moe_last_error());
    CHECK(moe_mlp_layout_max_blocks(kind, T, k, E, o, &cap) == MOE_OK, "max_blocks: %s", moe_last_error());
    CHECK(U <= cap, "trial %d: the routing needs %" PRId64 " blocks, more than the bound %" PRId64, trial, U, cap);
    if (U > cap)
        cap = U;
    const int64_t Ncap = cap + extra, pad = o->padding == MOE_MLP_PAD_ROW ? T : -1;
    int64_t *hb = xmalloc((size_t)U * 8 + 8), *hp = xmalloc((size_t)(U * B) * 8 + 8), hdrop = -7;
    unsigned char *ha = xmalloc((size_t)(T * E) * es + 1);
    CHECK(moe_mlp_layout_build(kind, T, k, E, ids, with_weights ? w : NULL, U, hb, hp, with_weights ? ha : NULL,
                               &hdrop, o) == MOE_OK, "trial %d: host layout: %s", trial, moe_last_error());
    int64_t *d_ids = b_copy(ids, (size_t)M * 8);
    void *d_w = with_weights ? b_copy(w, (size_t)M * es) : NULL;
    int64_t *d_b = b_copy(NULL, (size_t)Ncap * 8), *d_p = b_copy(NULL, (size_t)(Ncap * B) * 8);
    void *d_a = with_weights ? b_copy(NULL, (size_t)(T * E) * es) : NULL;
    int64_t *d_drop = b_copy(NULL, 8), *d_used = b_copy(NULL, 8);
    const moe_status st = settle(moe_mlp_layout_build_on(backend, kind, T, k, E, d_ids, d_w, Ncap, d_b, d_p, d_a,
                                                         d_drop, d_used, o));
    CHECK(st == MOE_OK, "trial %d: moe_mlp_layout_build_on: %s", trial, moe_last_error());
    int64_t *bb = xmalloc((size_t)Ncap * 8 + 8), *bp = xmalloc((size_t)(Ncap * B) * 8 + 8), bdrop = 0, bused = 0;
    unsigned char *ba = xmalloc((size_t)(T * E) * es + 1);
    b_get(bb, d_b, (size_t)Ncap * 8);
    b_get(bp, d_p, (size_t)(Ncap * B) * 8);
    b_get(&bdrop, d_drop, 8);
    b_get(&bused, d_used, 8);
    if (with_weights)
        b_get(ba, d_a, (size_t)(T * E) * es);
    const char *what = kind == MOE_MLP_DROPPING ? "dropping" : "dropless";
    CHECK(bused == U, "trial %d %s: num_blocks_used = %" PRId64 ", host %" PRId64, trial, what, bused, U);
    CHECK(bdrop == hdrop, "trial %d %s: num_dropped = %" PRId64 ", host %" PRId64, trial, what, bdrop, hdrop);
    CHECK(memcmp(bb, hb, (size_t)U * 8) == 0, "trial %d %s: block_to_expert differs (T=%" PRId64 " k=%" PRId64
          " E=%" PRId64 " B=%" PRId64 ")", trial, what, T, k, E, B);
    CHECK(memcmp(bp, hp, (size_t)(U * B) * 8) == 0, "trial %d %s: token_position_to_id differs", trial, what);
    int64_t tail_bad = 0;
    for (int64_t n = U; n < Ncap; n++)
        tail_bad += bb[n] != E - 1;
    for (int64_t p = U * B; p < Ncap * B; p++)
        tail_bad += bp[p] != pad;
    CHECK(tail_bad == 0, "trial %d %s: %" PRId64 " entries of the capacity's tail are not padding of expert E-1",
          trial, what, tail_bad);
    if (with_weights)
        CHECK(memcmp(ba, ha, (size_t)(T * E) * es) == 0, "trial %d %s: affinities differ", trial, what);
    b_free(d_ids), b_free(d_b), b_free(d_p), b_free(d_drop), b_free(d_used);
    if (with_weights)
        b_free(d_w), b_free(d_a);
    free(w), free(hb), free(hp), free(ha), free(bb), free(bp), free(ba);
}

/* The message from "topk_ids[" on (the prefix names the entry point and, on CUDA, where it was found). */
static const char *entry_part(const char *message)
{
    const char *at = strstr(message, "topk_ids[");
    return at ? at : message;
}

/* Corrupts one id (out of range, or a repeat of the token's previous expert) and checks both builders. */
static void check_bad_ids(int trial, int64_t T, int64_t k, int64_t E, int64_t *ids)
{
    const int64_t M = T * k, s = below(M);
    const int repeat = k > 1 && s % k > 0 && below(2);
    const int64_t saved = ids[s];
    ids[s] = repeat ? ids[s - 1] : (below(2) ? E + below(3) : -1 - below(3));
    char host_msg[512];
    /* routing (no distinctness rule): only out-of-range ids are errors */
    int64_t *m = xmalloc((size_t)E * 8), *g = xmalloc((size_t)M * 8), *sc = xmalloc((size_t)M * 8);
    const moe_status hs = moe_routing_from_topk(T, k, E, ids, m, g, sc);
    snprintf(host_msg, sizeof host_msg, "%s", moe_last_error());
    int64_t *d_ids = b_copy(ids, (size_t)M * 8), *d_m = b_copy(NULL, (size_t)E * 8);
    int64_t *d_g = b_copy(NULL, (size_t)M * 8), *d_s = b_copy(NULL, (size_t)M * 8);
    const moe_status bs = settle(moe_routing_build(backend, T, k, E, d_ids, d_m, d_g, d_s, NULL));
    CHECK(bs == hs, "trial %d: routing with a bad id: status %d, host %d (%s)", trial, (int)bs, (int)hs,
          moe_last_error());
    if (hs != MOE_OK) {
        CHECK(strcmp(entry_part(moe_last_error()), entry_part(host_msg)) == 0,
              "trial %d: routing message \"%s\", host \"%s\"", trial, moe_last_error(), host_msg);
        unsigned char *back = xmalloc((size_t)M * 8 + (size_t)E * 8);
        b_get(back, d_g, (size_t)M * 8);
        b_get(back + M * 8, d_m, (size_t)E * 8);
        size_t touched = 0;
        for (size_t q = 0; q < (size_t)(M + E) * 8; q++)
            touched += back[q] != 0xA5;
        CHECK(touched == 0, "trial %d: a rejected routing wrote %zu bytes", trial, touched);
        free(back);
    }
    b_free(d_ids), b_free(d_m), b_free(d_g), b_free(d_s);
    free(m), free(g), free(sc);
    /* layout (distinct ids required) */
    moe_mlp_options o = {0};
    o.block_size = 4;
    int64_t cap = 0;
    CHECK(moe_mlp_layout_max_blocks(MOE_MLP_DROPLESS, T, k, E, &o, &cap) == MOE_OK, "max_blocks");
    int64_t N = 0;
    const moe_status hl = moe_mlp_layout_num_blocks(MOE_MLP_DROPLESS, T, k, E, ids, &o, &N);
    snprintf(host_msg, sizeof host_msg, "%s", moe_last_error());
    CHECK(hl != MOE_OK, "trial %d: the host accepted a bad id", trial);
    d_ids = b_copy(ids, (size_t)M * 8);
    int64_t *d_b = b_copy(NULL, (size_t)cap * 8), *d_p = b_copy(NULL, (size_t)(cap * 4) * 8);
    const moe_status bl = settle(moe_mlp_layout_build_on(backend, MOE_MLP_DROPLESS, T, k, E, d_ids, NULL, cap, d_b,
                                                         d_p, NULL, NULL, NULL, &o));
    CHECK(bl == hl, "trial %d: layout with a bad id: status %d, host %d (%s)", trial, (int)bl, (int)hl,
          moe_last_error());
    CHECK(strcmp(entry_part(moe_last_error()), entry_part(host_msg)) == 0, "trial %d: layout message \"%s\", host \"%s\"",
          trial, moe_last_error(), host_msg);
    unsigned char *back = xmalloc((size_t)cap * 8 * 5 + 1);
    b_get(back, d_b, (size_t)cap * 8);
    b_get(back + cap * 8, d_p, (size_t)(cap * 4) * 8);
    size_t touched = 0;
    for (size_t q = 0; q < (size_t)cap * 8 * 5; q++)
        touched += back[q] != 0xA5;
    CHECK(touched == 0, "trial %d: a rejected layout wrote %zu bytes", trial, touched);
    free(back);
    b_free(d_ids), b_free(d_b), b_free(d_p);
    ids[s] = saved;
}

int main(int argc, char **argv)
{
    const uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 20261123;
    const int trials = argc > 2 ? atoi(argv[2]) : 150;
    printf("seed %llu, %d trials, backend %s\n", (unsigned long long)seed, trials, moe_backend_name(backend));
    if (!moe_backend_available(backend)) {
        printf("SKIP: backend %s not available\n", moe_backend_name(backend));
        return 77;
    }
    rng_state = seed;
    static const int64_t blocks[] = {1, 2, 3, 4, 16, 17, 64, 128};
    /* every 13th trial (not a 10th) on many experts: the device builders' place and fill kernels run
     * min(E, 1024) CTAs (gpu/routing/builders.cu), one expert each at E = 1024, several past it */
    static const int64_t many_experts[] = {1024, 1025, 1500};
    for (int trial = 0; trial < trials; trial++) {
        const int64_t E = trial % 10 == 0   ? 1
                          : trial % 13 == 0 ? many_experts[(trial / 13) % 3]
                                            : 1 + below(trial % 3 == 0 ? 300 : 40);
        const int64_t k = trial % 7 == 0 ? E < 8 ? E : 8 : 1 + below(E < 8 ? E : 8);
        const int64_t T = trial % 11 == 0 ? 0 : below(trial % 5 == 0 ? 2000 : 200);
        int64_t *ids = xmalloc((size_t)(T * k) * 8 + 8);
        draw_ids(T, k, E, ids);
        check_routing(trial, T, k, E, ids);
        moe_mlp_options o = {0};
        o.dtype = (moe_dtype)below(3);
        o.padding = (moe_mlp_padding)below(2);
        o.block_size = blocks[below((int64_t)(sizeof blocks / sizeof blocks[0]))];
        check_layout(trial, T, k, E, ids, MOE_MLP_DROPLESS, &o, (int)below(2), below(2) * 3);
        check_layout(trial, T, k, E, ids, MOE_MLP_DROPPING, &o, (int)below(2), below(2) * 3);
        if (T > 0)
            check_bad_ids(trial, T, k, E, ids);
        free(ids);
    }
    /* CUDA: sizes the proved checks accept but the device arrays cannot hold (past SIZE_MAX / 16) are refused
     * before any array is read (the pointers below are never dereferenced); the host builder has no such bound */
    if (backend == MOE_BACKEND_CUDA && SIZE_MAX / 16 < INT64_MAX / 2) {
        int64_t *d_any = b_copy(NULL, 64);
        const int64_t big_rows_T = ((int64_t)(SIZE_MAX / 16) >> 21) + 1, big_rows_k = (int64_t)1 << 21;
        moe_status st = moe_routing_build(backend, big_rows_T, big_rows_k, 8, d_any, d_any, d_any, d_any, NULL);
        CHECK(st == MOE_ERR_OVERFLOW && strstr(moe_last_error(), " rows is too large for the CUDA builder") != NULL,
              "T * k = %" PRId64 " * %" PRId64 " past SIZE_MAX / 16: status %d (%s)", big_rows_T, big_rows_k, (int)st,
              moe_last_error());
        const int64_t big_E = (int64_t)(SIZE_MAX / 16) + 1;
        st = moe_routing_build(backend, 4, 2, big_E, d_any, d_any, d_any, d_any, NULL);
        CHECK(st == MOE_ERR_OVERFLOW && strstr(moe_last_error(), "num_experts = ") != NULL &&
                  strstr(moe_last_error(), "is too large for the CUDA builder") != NULL,
              "E = %" PRId64 " past SIZE_MAX / 16: status %d (%s)", big_E, (int)st, moe_last_error());
        b_free(d_any);
    }
    /* a capacity below the bound is refused before anything runs */
    {
        const int64_t ids[4] = {0, 1, 1, 0};
        int64_t cap = 0, *d_ids = b_copy(ids, sizeof ids), *d_b = b_copy(NULL, 64), *d_p = b_copy(NULL, 64);
        moe_mlp_options o = {0};
        o.block_size = 2;
        CHECK(moe_mlp_layout_max_blocks(MOE_MLP_DROPLESS, 2, 2, 2, &o, &cap) == MOE_OK && cap == 3,
              "max_blocks(T=2, k=2, E=2, B=2) = %" PRId64 ", expected min(4, (4 + 2) / 2) = 3", cap);
        const moe_status st = moe_mlp_layout_build_on(backend, MOE_MLP_DROPLESS, 2, 2, 2, d_ids, NULL, cap - 1, d_b, d_p,
                                                      NULL, NULL, NULL, &o);
        CHECK(st == MOE_ERR_INVALID_SHAPE && strstr(moe_last_error(), "moe_mlp_layout_max_blocks") != NULL,
              "capacity below the bound: status %d (%s)", (int)st, moe_last_error());
        b_free(d_ids), b_free(d_b), b_free(d_p);
    }
    printf("%ld checks, %ld failures\n", checks, failures);
    return failures ? 1 : 0;
}
