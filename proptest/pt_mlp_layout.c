/*
 * MLP layout builders (ops mlp-layout and, on the GPU, gpu-mlp-layout): a drawn routing (topk ids of every
 * routing kind, T from 0, k up to E), block size, padding convention, layout kind (dropless or dropping) and
 * dtype, through the library's builders:
 *   moe_mlp_layout_num_blocks, moe_mlp_layout_max_blocks, moe_mlp_layout_build (host), and
 *   moe_mlp_layout_build_on with a capacity of max_blocks plus 0..2 blocks (the backend's: the reference,
 *   or the CUDA builder on device copies through pt_layout_build_on_fn),
 * each compared exactly with a layout made here from specs/MLP.md's rules alone, never with the library's
 * own checker:
 *   - blocks ordered by expert; dropless: ceil(m_e / B) blocks for expert e (none without tokens), dropping:
 *     block e serves expert e (N = E);
 *   - inside an expert's blocks its tokens in ascending order from the first position, the rest the padding
 *     mark (-1, or T with MOE_MLP_PAD_ROW); dropping keeps the first B tokens of each expert and counts the
 *     other pairs as dropped;
 *   - affinities[t*E + e] = the bits of topk_weights[t][j] for every placed pair, +0 for every other pair
 *     (dropped ones too);
 *   - max_blocks: dropless min(T*k, (T*k + E*(B-1)) / B), dropping E, and never below the routing's N;
 *   - build_on: blocks 0 .. U-1 are the layout above, blocks U .. capacity-1 serve expert E-1 and hold only
 *     padding, *num_blocks_used = U.
 * One case in four instead carries one invalid id (out of range, or an expert twice in a token's row): every
 * builder must refuse it (MOE_ERR_INVALID_INDEX / MOE_ERR_INVALID_ROUTING, a message naming topk_ids) and
 * leave every output byte as it was.
 */
#include "pt.h"
#include "pt_gen.h"
#include "pt_mlp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const int64_t layout_block_sizes[] = {1, 2, 3, 4, 5, 8, 16, 128};

/* The reference's moe_mlp_layout_build_on on host arrays (the default pt_layout_build_on_fn). */
static moe_status ref_build_on(pt_case *c, const pt_layout_call *call, int64_t *b2e, int64_t *ids, void *aff,
                               int64_t *dropped, int64_t *used)
{
    (void)c;
    return moe_mlp_layout_build_on(MOE_BACKEND_REF, call->kind, call->T, call->k, call->E, call->topk_ids,
                                   call->topk_weights, call->capacity, b2e, ids, aff, dropped, used, &call->opt);
}

/* The expected layout of the call's routing, from the rules in the header: *N blocks in b2e [cap], positions in
 * ids [cap * B], affinities [T*E] (es bytes each, when weights are given), the dropped pairs. */
static void model_layout(const pt_layout_call *call, int64_t B, int64_t cap, int64_t *N, int64_t *b2e, int64_t *ids,
                         unsigned char *aff, int64_t *dropped)
{
    const int64_t T = call->T, k = call->k, E = call->E;
    const int64_t pad = call->opt.padding == MOE_MLP_PAD_ROW ? T : -1;
    const size_t es = moe_dtype_size(call->opt.dtype);
    for (int64_t p = 0; p < cap * B; p++)
        ids[p] = pad;
    for (int64_t n = 0; n < cap; n++)
        b2e[n] = E - 1;
    if (aff != NULL)
        memset(aff, 0, (size_t)(T * E) * es);
    int64_t n = 0;
    *dropped = 0;
    for (int64_t e = 0; e < E; e++) {
        const int64_t first = n * B;
        int64_t placed = 0;
        for (int64_t t = 0; t < T; t++)
            for (int64_t j = 0; j < k; j++) {
                if (call->topk_ids[t * k + j] != e)
                    continue;
                if (call->kind == MOE_MLP_DROPPING && placed == B) {
                    ++*dropped;
                    continue;
                }
                ids[first + placed++] = t;
                if (aff != NULL)
                    memcpy(aff + (size_t)(t * E + e) * es, (const char *)call->topk_weights + (size_t)(t * k + j) * es, es);
            }
        const int64_t blocks = call->kind == MOE_MLP_DROPPING ? 1 : (placed + B - 1) / B;
        for (int64_t b = 0; b < blocks; b++)
            b2e[n++] = e;
    }
    *N = n;
}

/* The first index where two int64 arrays differ, or -1. */
static int64_t first_difference(const int64_t *a, const int64_t *b, int64_t count)
{
    for (int64_t i = 0; i < count; i++)
        if (a[i] != b[i])
            return i;
    return -1;
}

/* Compares a built layout (blocks [0, n) of b2e, positions [0, n*B) of ids) with the model's. */
static void same_layout(pt_case *c, const char *who, int64_t n, int64_t B, const int64_t *b2e, const int64_t *ids,
                        const int64_t *want_b2e, const int64_t *want_ids)
{
    int64_t at = first_difference(b2e, want_b2e, n);
    if (at >= 0) {
        pt_fail(c, "layout-blocks", "%s: block_to_expert[%lld] = %lld, the rules give %lld", who, (long long)at,
                (long long)b2e[at], (long long)want_b2e[at]);
        return;
    }
    at = first_difference(ids, want_ids, n * B);
    if (at >= 0)
        pt_fail(c, "layout-positions", "%s: token_position_to_id[%lld] (block %lld, slot %lld) = %lld, the rules give %lld",
                who, (long long)at, (long long)(at / B), (long long)(at % B), (long long)ids[at], (long long)want_ids[at]);
}

/* Plants one invalid id in a copy of the routing: out of range (negative or >= E), or, with k >= 2, a token's
 * expert repeated in its row.  Returns the status the builders must give. */
static moe_status plant_bad_id(pt_case *c, pt_layout_call *call, int64_t *ids)
{
    pt_source *s = c->src;
    const int64_t t = pt_int(s, 0, call->T - 1), j = pt_int(s, 0, call->k - 1);
    if (call->k >= 2 && pt_bool(s)) {
        const int64_t other = (j + 1 + pt_int(s, 0, call->k - 2)) % call->k;
        ids[t * call->k + j] = ids[t * call->k + other];
        pt_describe(c, " bad=topk_ids[%lld][%lld] repeats [%lld]", (long long)t, (long long)j, (long long)other);
        return MOE_ERR_INVALID_ROUTING;
    }
    ids[t * call->k + j] = pt_bool(s) ? call->E + (int64_t)pt_draw(s, 5) : -1 - (int64_t)pt_draw(s, 5);
    pt_describe(c, " bad=topk_ids[%lld][%lld]=%lld", (long long)t, (long long)j, (long long)ids[t * call->k + j]);
    return MOE_ERR_INVALID_INDEX;
}

static void expect_refusal(pt_case *c, const char *who, moe_status got, moe_status want)
{
    if (got != want)
        pt_fail(c, "layout-bad-status", "%s on an invalid id: %s (%s), expected %s", who, moe_strerror(got),
                moe_last_error(), moe_strerror(want));
    else if (strstr(moe_last_error(), "topk_ids") == NULL)
        pt_fail(c, "layout-bad-message", "%s: message '%s' does not name topk_ids", who, moe_last_error());
}

void pt_mlp_layout_with(pt_case *c, pt_layout_build_on_fn build_on)
{
    pt_source *s = c->src;
    if (build_on == NULL)
        build_on = ref_build_on;
    pt_layout_call call;
    memset(&call, 0, sizeof call);
    const int routing_kind = pt_pick(s, PT_ROUTE_KINDS_FROM_TOPK);
    call.kind = pt_bool(s) ? MOE_MLP_DROPPING : MOE_MLP_DROPLESS;
    call.opt.padding = pt_bool(s) ? MOE_MLP_PAD_ROW : MOE_MLP_PAD_SKIP;
    call.opt.dtype = (moe_dtype)pt_pick(s, 3);
    call.opt.block_size = layout_block_sizes[pt_pick(s, 8)];
    const int weighted = pt_pick(s, 4) != 0;
    const int bad = pt_pick(s, 4) == 3;
    const int64_t extra = pt_int(s, 0, 2);
    const int64_t B = call.opt.block_size;
    int64_t E = pt_sized(s, 1, 300), T = pt_sized(s, 0, 600);
    int64_t *allowed = xmalloc((size_t)E * sizeof(int64_t));
    const int64_t A = pt_allowed_experts(routing_kind, E, allowed);
    free(allowed);
    const int64_t k = min64(A, pt_int(s, 1, 8));
    if (bad && T == 0)
        T = 1;
    call.T = T, call.k = k, call.E = E;
    int64_t *topk = xmalloc((size_t)(T * k + 1) * sizeof(int64_t));
    pt_gen_topk_ids(s, routing_kind, T, k, E, topk);
    call.topk_ids = topk;
    const size_t es = moe_dtype_size(call.opt.dtype);
    void *tw = NULL;
    if (weighted) {
        tw = xmalloc((size_t)(T * k + 1) * es);
        for (int64_t i = 0; i < T * k * (int64_t)es; i++) /* any bits: they are copied, never computed with */
            ((unsigned char *)tw)[i] = (unsigned char)(pt_draw(s, 255) ^ (uint64_t)(i * 37));
    }
    call.topk_weights = tw;
    pt_describe(c, "T=%lld k=%lld E=%lld B=%lld %s pad=%s %s routing=%s%s capacity+%lld", (long long)T, (long long)k,
                (long long)E, (long long)B, call.kind == MOE_MLP_DROPPING ? "dropping" : "dropless",
                call.opt.padding == MOE_MLP_PAD_ROW ? "row" : "skip", moe_dtype_name(call.opt.dtype),
                pt_routing_kind_name(routing_kind), weighted ? " topk_weights" : "", (long long)extra);

    /* the model: N, max_blocks, the layout over the capacity */
    int64_t max_blocks = 0;
    moe_status st = moe_mlp_layout_max_blocks(call.kind, T, k, E, &call.opt, &max_blocks);
    const int64_t want_max = call.kind == MOE_MLP_DROPPING ? E : min64(T * k, (T * k + E * (B - 1)) / B);
    if (st != MOE_OK || max_blocks != want_max) {
        pt_fail(c, "layout-max-blocks", "moe_mlp_layout_max_blocks: %s, %lld blocks; the rule gives %lld",
                moe_strerror(st), (long long)max_blocks, (long long)want_max);
        free(topk), free(tw);
        return;
    }
    call.capacity = max_blocks + extra;
    const int64_t cap = call.capacity > 0 ? call.capacity : 1;
    int64_t want_N = 0, want_dropped = 0;
    int64_t *want_b2e = xmalloc((size_t)cap * sizeof(int64_t)), *want_ids = xmalloc((size_t)(cap * B) * sizeof(int64_t));
    unsigned char *want_aff = weighted ? xmalloc((size_t)(T * E + 1) * es) : NULL;
    model_layout(&call, B, cap, &want_N, want_b2e, want_ids, want_aff, &want_dropped);
    if (want_N > max_blocks)
        pt_fail(c, "layout-max-blocks", "max_blocks %lld is below this routing's %lld blocks", (long long)max_blocks,
                (long long)want_N);
    pt_describe(c, " N=%lld dropped=%lld", (long long)want_N, (long long)want_dropped);

    /* the outputs, filled with a marker: a refused call must leave every byte of them */
    const size_t aff_bytes = (size_t)(T * E) * es;
    int64_t *b2e = xmalloc((size_t)cap * sizeof(int64_t)), *ids = xmalloc((size_t)(cap * B) * sizeof(int64_t));
    unsigned char *aff = weighted ? xmalloc(aff_bytes + 1) : NULL;
    int64_t dropped = -7, used = -7, N = -7;
    memset(b2e, 0x5a, (size_t)cap * sizeof(int64_t));
    memset(ids, 0x5a, (size_t)(cap * B) * sizeof(int64_t));
    if (aff)
        memset(aff, 0x5a, aff_bytes);

    if (bad) {
        int64_t *bad_topk = xmalloc((size_t)(T * k + 1) * sizeof(int64_t));
        memcpy(bad_topk, topk, (size_t)(T * k) * sizeof(int64_t));
        pt_layout_call bad_call = call;
        bad_call.topk_ids = bad_topk;
        const moe_status want = plant_bad_id(c, &bad_call, bad_topk);
        expect_refusal(c, "moe_mlp_layout_num_blocks",
                       moe_mlp_layout_num_blocks(call.kind, T, k, E, bad_topk, &call.opt, &N), want);
        expect_refusal(c, "moe_mlp_layout_build",
                       moe_mlp_layout_build(call.kind, T, k, E, bad_topk, tw, want_N, b2e, ids, aff, &dropped, &call.opt),
                       want);
        expect_refusal(c, "moe_mlp_layout_build_on", build_on(c, &bad_call, b2e, ids, aff, &dropped, &used), want);
        int changed = N != -7 || dropped != -7 || used != -7;
        for (size_t i = 0; i < (size_t)cap * sizeof(int64_t); i++)
            changed |= ((unsigned char *)b2e)[i] != 0x5a;
        for (size_t i = 0; i < (size_t)(cap * B) * sizeof(int64_t); i++)
            changed |= ((unsigned char *)ids)[i] != 0x5a;
        for (size_t i = 0; aff && i < aff_bytes; i++)
            changed |= aff[i] != 0x5a;
        if (changed && c->outcome != PT_FAIL)
            pt_fail(c, "layout-bad-wrote", "a builder that refused an invalid id changed an output");
        free(bad_topk);
    } else {
        st = moe_mlp_layout_num_blocks(call.kind, T, k, E, topk, &call.opt, &N);
        if (st != MOE_OK || N != want_N)
            pt_fail(c, "layout-num-blocks", "moe_mlp_layout_num_blocks: %s (%s), %lld blocks; the rules give %lld",
                    moe_strerror(st), moe_last_error(), (long long)N, (long long)want_N);
        st = c->outcome == PT_FAIL ? MOE_OK
                                   : moe_mlp_layout_build(call.kind, T, k, E, topk, tw, want_N, b2e, ids, aff, &dropped,
                                                          &call.opt);
        if (st != MOE_OK)
            pt_fail(c, "layout-build", "moe_mlp_layout_build: %s (%s)", moe_strerror(st), moe_last_error());
        if (c->outcome != PT_FAIL) {
            same_layout(c, "moe_mlp_layout_build", want_N, B, b2e, ids, want_b2e, want_ids);
            if (dropped != want_dropped)
                pt_fail(c, "layout-dropped", "moe_mlp_layout_build: %lld pairs dropped, the rules give %lld",
                        (long long)dropped, (long long)want_dropped);
            if (aff && memcmp(aff, want_aff, aff_bytes) != 0)
                pt_fail(c, "layout-affinities", "moe_mlp_layout_build: the affinities differ from the placed pairs' weights");
        }
        if (c->outcome != PT_FAIL) {
            memset(b2e, 0x5a, (size_t)cap * sizeof(int64_t)); /* so that an output it skips shows */
            memset(ids, 0x5a, (size_t)(cap * B) * sizeof(int64_t));
            if (aff)
                memset(aff, 0x5a, aff_bytes);
            dropped = -7;
            st = build_on(c, &call, b2e, ids, aff, &dropped, &used);
            if (st != MOE_OK && c->outcome != PT_FAIL)
                pt_fail(c, "layout-build-on", "moe_mlp_layout_build_on: %s (%s)", moe_strerror(st), moe_last_error());
        }
        if (c->outcome != PT_FAIL) {
            same_layout(c, "moe_mlp_layout_build_on", call.capacity, B, b2e, ids, want_b2e, want_ids);
            if (used != want_N || dropped != want_dropped)
                pt_fail(c, "layout-build-on", "moe_mlp_layout_build_on: %lld blocks used, %lld dropped; the rules give "
                        "%lld and %lld", (long long)used, (long long)dropped, (long long)want_N, (long long)want_dropped);
            if (aff && memcmp(aff, want_aff, aff_bytes) != 0)
                pt_fail(c, "layout-affinities", "moe_mlp_layout_build_on: the affinities differ from the placed pairs' weights");
        }
    }
    free(topk), free(tw), free(want_b2e), free(want_ids), free(want_aff), free(b2e), free(ids), free(aff);
}

void pt_mlp_layout(pt_case *c) { pt_mlp_layout_with(c, NULL); }
