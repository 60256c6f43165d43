/*
 * GPU MLP properties (op gpu-mlp, --backend cuda): a case of the MLP generator (pt_mlp.c: every option,
 * shape, routing and layout mode) runs moe_mlp_fwd then moe_mlp_bwd on the CUDA backend with device
 * copies of every array (the layout arrays too), and
 *   1. every call returns MOE_OK and moe_backend_synchronize reports no device-side error;
 *   2. every output, checkpoint and gradient lies within oracle/mlp_bound.c's float64 running-error
 *      bound of the analytic value (the bound any correct float32 implementation meets: specs/MLP.md
 *      "Error bound"), and within the sum of both bounds of the CPU reference's result of the same case
 *      (what proptest/test_gpu_mlp.c checks);
 *   3. a second GPU run on identical inputs gives bitwise the same outputs, checkpoints and gradients;
 *   4. (when the stream asks for it) the same case with one invalid layout entry (an expert or a token id
 *      out of range, or a (token, expert) pair placed twice): both calls return MOE_OK (the work is only
 *      queued), moe_backend_synchronize reports the reference's status with a message naming the op and
 *      the position (gpu/mlp/layout_check.cu), no output byte on the device changes, and the next
 *      synchronisation is clean (the error is reported once).
 * Outputs are poisoned with NaN before every run (mt_run poisons the host arrays, which are uploaded as
 * the outputs' initial device contents; the invalid-layout check poisons its own), so an element the
 * kernels skip fails property 2 or 4.  The case runs in moe-fuzz's worker, so a device fault or a hang
 * is this case's failure and is shrunk like any other.
 */
#include "pt_cuda.h"
#include "pt_mlp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- host-argument wrappers of moe_mlp_fwd / moe_mlp_bwd for mt_run (the mt_fwd_fn, mt_bwd_fn hooks) ----
 * They upload every array (outputs included, so that elements the kernels do not write keep the poison
 * mt_run put there), run on MOE_BACKEND_CUDA, synchronise and download the outputs.  A failure (a CUDA
 * error, a status other than MOE_OK, a device-side error) fails `gpu_case` with its own tag and leaves the
 * host outputs as they were; the wrapper then answers MOE_OK, because mt_run exit()s on any other status
 * (which would kill the worker and lose the tag), and `gpu_failed` tells pt_gpu_mlp to stop after this
 * mt_run (whose bound checks then also see the poison: the first tag is what the case reports). */
static pt_case *gpu_case;
static int gpu_failed;

/* A device copy of host (NULL stays NULL: "not given" is preserved); sets *ok = 0 when the copy failed. */
static void *up(const void *host, size_t bytes, int *ok)
{
    if (host == NULL)
        return NULL;
    void *dev = pt_device_copy(gpu_case, host, bytes);
    if (dev == NULL)
        *ok = 0;
    return dev;
}

/* Byte sizes of the MLP tensors of one call. */
typedef struct mlp_bytes {
    size_t x;      /* hidden, out, out_grad, d_hidden: [T1][H] */
    size_t aff;    /* affinities, d_affinities: [T*E] */
    size_t wgu;    /* w_gu: [E][H][2][I] */
    size_t wd;     /* w_d: [E][I][H] */
    size_t bgu;    /* b_gu: [E][2][I] */
    size_t bd;     /* b_d: [E][H] */
    size_t cgu;    /* gate_up_ckpt_T: [N][2][I][B] */
    size_t cd;     /* down_ckpt: [N*B][H] */
    size_t g_wgu, g_wd, g_bgu, g_bd; /* the weight gradients (float32 with grad_fp32) */
    size_t b2e;    /* layout.block_to_expert: [N] int64 */
    size_t ids;    /* layout.token_position_to_id: [N*B] int64 */
} mlp_bytes;

static mlp_bytes bytes_of(const moe_mlp_layout *l, int64_t H, int64_t I, const moe_mlp_options *o)
{
    const size_t es = moe_dtype_size(o->dtype), gs = o->grad_fp32 ? 4 : es;
    const int64_t B = o->block_size ? o->block_size : MOE_MLP_DEFAULT_BLOCK_SIZE;
    const int64_t T = l->num_tokens, E = l->num_experts, N = l->num_blocks;
    const int64_t T1 = T + (o->padding == MOE_MLP_PAD_ROW);
    mlp_bytes b;
    b.x = (size_t)(T1 * H) * es, b.aff = (size_t)(T * E) * es;
    b.wgu = (size_t)(E * H * 2 * I) * es, b.wd = (size_t)(E * I * H) * es;
    b.bgu = (size_t)(E * 2 * I) * es, b.bd = (size_t)(E * H) * es;
    b.cgu = (size_t)(N * 2 * I * B) * es, b.cd = (size_t)(N * B * H) * es;
    b.g_wgu = (size_t)(E * H * 2 * I) * gs, b.g_wd = (size_t)(E * I * H) * gs;
    b.g_bgu = (size_t)(E * 2 * I) * gs, b.g_bd = (size_t)(E * H) * gs;
    b.b2e = (size_t)N * sizeof(int64_t), b.ids = (size_t)(N * B) * sizeof(int64_t);
    return b;
}

/* After a queued call: its status, then moe_backend_synchronize's; fails gpu_case on either. */
static int call_finished(moe_status st, const char *op, const moe_mlp_options *o)
{
    if (st != MOE_OK) {
        pt_fail(gpu_case, "status", "gpu %s returned %s: %s", op, moe_strerror(st), moe_last_error());
        return 0;
    }
    st = moe_backend_synchronize(MOE_BACKEND_CUDA, o ? o->stream : NULL);
    if (st != MOE_OK) {
        pt_fail(gpu_case, "device-error", "gpu %s: moe_backend_synchronize: %s: %s", op, moe_strerror(st),
                moe_last_error());
        return 0;
    }
    return 1;
}

static moe_status gpu_fwd(moe_backend backend, const moe_mlp_layout *layout, int64_t H, int64_t I, const void *hidden,
                          const void *aff, const void *w_gu, const void *w_d, const void *b_gu, const void *b_d,
                          void *out, void *ckpt_gu, void *ckpt_d, const moe_mlp_options *o)
{
    (void)backend; /* always MOE_BACKEND_CUDA */
    const mlp_bytes b = bytes_of(layout, H, I, o);
    int ok = 1;
    moe_mlp_layout dl = *layout;
    void *db2e = up(layout->block_to_expert, b.b2e, &ok), *dids = up(layout->token_position_to_id, b.ids, &ok);
    void *dx = up(hidden, b.x, &ok), *da = up(aff, b.aff, &ok), *dwgu = up(w_gu, b.wgu, &ok);
    void *dwd = up(w_d, b.wd, &ok), *dbgu = up(b_gu, b.bgu, &ok), *dbd = up(b_d, b.bd, &ok);
    void *dout = up(out, b.x, &ok), *dcgu = up(ckpt_gu, b.cgu, &ok), *dcd = up(ckpt_d, b.cd, &ok);
    if (ok) {
        dl.block_to_expert = db2e, dl.token_position_to_id = dids;
        ok = call_finished(moe_mlp_fwd(MOE_BACKEND_CUDA, &dl, H, I, dx, da, dwgu, dwd, dbgu, dbd, dout, dcgu, dcd, o),
                           "moe_mlp_fwd", o);
        ok = ok && pt_device_download(gpu_case, out, dout, b.x);
        ok = ok && (dcgu == NULL || pt_device_download(gpu_case, ckpt_gu, dcgu, b.cgu));
        ok = ok && (dcd == NULL || pt_device_download(gpu_case, ckpt_d, dcd, b.cd));
    }
    void *all[] = {db2e, dids, dx, da, dwgu, dwd, dbgu, dbd, dout, dcgu, dcd};
    pt_device_free_all(all, sizeof all / sizeof all[0]);
    gpu_failed |= !ok;
    return MOE_OK; /* see the comment above gpu_case */
}

static moe_status gpu_bwd(moe_backend backend, const moe_mlp_layout *layout, int64_t H, int64_t I, const void *hidden,
                          const void *aff, const void *w_gu, const void *w_d, const void *b_d, const void *ckpt_gu,
                          const void *ckpt_d, const void *out_grad, void *d_hidden, void *d_aff, void *d_wgu,
                          void *d_wd, void *d_bgu, void *d_bd, const moe_mlp_options *o)
{
    (void)backend;
    const mlp_bytes b = bytes_of(layout, H, I, o);
    int ok = 1;
    moe_mlp_layout dl = *layout;
    void *db2e = up(layout->block_to_expert, b.b2e, &ok), *dids = up(layout->token_position_to_id, b.ids, &ok);
    void *dx = up(hidden, b.x, &ok), *da = up(aff, b.aff, &ok), *dwgu = up(w_gu, b.wgu, &ok);
    void *dwd = up(w_d, b.wd, &ok), *dbd = up(b_d, b.bd, &ok), *dcgu = up(ckpt_gu, b.cgu, &ok);
    void *dcd = up(ckpt_d, b.cd, &ok), *dg = up(out_grad, b.x, &ok);
    void *ddx = up(d_hidden, b.x, &ok), *dda = up(d_aff, b.aff, &ok), *ddwgu = up(d_wgu, b.g_wgu, &ok);
    void *ddwd = up(d_wd, b.g_wd, &ok), *ddbgu = up(d_bgu, b.g_bgu, &ok), *ddbd = up(d_bd, b.g_bd, &ok);
    if (ok) {
        dl.block_to_expert = db2e, dl.token_position_to_id = dids;
        ok = call_finished(moe_mlp_bwd(MOE_BACKEND_CUDA, &dl, H, I, dx, da, dwgu, dwd, dbd, dcgu, dcd, dg, ddx, dda,
                                       ddwgu, ddwd, ddbgu, ddbd, o),
                           "moe_mlp_bwd", o);
        ok = ok && pt_device_download(gpu_case, d_hidden, ddx, b.x);
        ok = ok && pt_device_download(gpu_case, d_aff, dda, b.aff);
        ok = ok && pt_device_download(gpu_case, d_wgu, ddwgu, b.g_wgu);
        ok = ok && pt_device_download(gpu_case, d_wd, ddwd, b.g_wd);
        ok = ok && (ddbgu == NULL || pt_device_download(gpu_case, d_bgu, ddbgu, b.g_bgu));
        ok = ok && (ddbd == NULL || pt_device_download(gpu_case, d_bd, ddbd, b.g_bd));
    }
    void *all[] = {db2e, dids, dx, da, dwgu, dwd, dbd, dcgu, dcd, dg, ddx, dda, ddwgu, ddwd, ddbgu, ddbd};
    pt_device_free_all(all, sizeof all / sizeof all[0]);
    gpu_failed |= !ok;
    return MOE_OK; /* see the comment above gpu_case */
}

/* ---- property 4: an invalid layout ---- */

enum { BAD_NONE = 0, BAD_ID = 1, BAD_PAIR = 2, BAD_KINDS = 3 };

/* Corrupts one entry of the case's layout (copies in b2e[N], ids[N*B]) per `kind`; writes the status the
 * device check must report and a piece of its message (gpu/mlp/layout_check.cu) into want/needle.  Returns 0
 * when the layout has no entry of that kind to corrupt. */
static int corrupt_layout(pt_case *c, const mt_case *m, int kind, int64_t *b2e, int64_t *ids, moe_status *want,
                          char *needle, size_t needle_cap)
{
    pt_source *s = c->src;
    const int64_t N = m->N, B = m->B, NB = N * B, T = m->T, E = m->E;
    if (NB == 0)
        return 0;
    if (kind == BAD_ID) {
        const int expert = pt_bool(s);
        *want = MOE_ERR_INVALID_INDEX;
        if (expert) {
            const int64_t n = pt_int(s, 0, N - 1), v = pt_bool(s) ? E + pt_int(s, 0, 3) : -1 - pt_int(s, 0, 3);
            b2e[n] = v;
            snprintf(needle, needle_cap, "layout.block_to_expert[%lld] = %lld", (long long)n, (long long)v);
            pt_describe(c, " bad-expert b2e[%lld]=%lld", (long long)n, (long long)v);
        } else {
            const int64_t p = pt_int(s, 0, NB - 1);
            const int64_t other_pad = m->opt.padding == MOE_MLP_PAD_ROW ? -1 : T; /* the other convention's mark */
            const int64_t targets[3] = {T + 1, other_pad, -7};
            const int64_t v = targets[pt_pick(s, 3)];
            ids[p] = v;
            snprintf(needle, needle_cap, "layout.token_position_to_id[%lld] = %lld", (long long)p, (long long)v);
            pt_describe(c, " bad-id ids[%lld]=%lld", (long long)p, (long long)v);
        }
        return 1;
    }
    /* a (token, expert) pair twice: position q of a block of the same expert as position p gets p's token */
    const int64_t pad = m->opt.padding == MOE_MLP_PAD_ROW ? T : -1;
    int64_t *cand = xmalloc((size_t)NB * sizeof(int64_t));
    int64_t count = 0;
    for (int64_t p = 0; p < NB; p++) /* positions holding a token */
        if (ids[p] != pad)
            cand[count++] = p;
    if (count == 0) {
        free(cand);
        return 0;
    }
    const int64_t p = cand[pt_int(s, 0, count - 1)], e = b2e[p / B];
    count = 0;
    for (int64_t q = 0; q < NB; q++) /* other positions of blocks of p's expert without p's token */
        if (b2e[q / B] == e && ids[q] != ids[p])
            cand[count++] = q;
    const int ok = count > 0;
    if (ok) {
        const int64_t q = cand[pt_int(s, 0, count - 1)];
        ids[q] = ids[p];
        *want = MOE_ERR_INVALID_ROUTING;
        /* the original layout is valid, so the pair sat only at p: the first position is the smaller */
        snprintf(needle, needle_cap, "layout.token_position_to_id[%lld] and [%lld] both place token %lld with expert %lld",
                 (long long)(p < q ? p : q), (long long)(p < q ? q : p), (long long)ids[p], (long long)e);
        pt_describe(c, " dup-pair ids[%lld]=ids[%lld]", (long long)q, (long long)p);
    }
    free(cand);
    return ok;
}

/* Checks one queued call with an invalid layout: returns MOE_OK, synchronisation reports `want` with a
 * message naming `op` and holding `needle`. */
static void expect_device_error(pt_case *c, moe_status st, const char *op, moe_status want, const char *needle)
{
    if (st != MOE_OK) {
        pt_fail(c, "bad-layout", "gpu %s with an invalid layout returned %s at the call (%s); the layout is checked "
                "on the device, so the call should queue and the synchronisation report", op, moe_strerror(st),
                moe_last_error());
        return;
    }
    st = moe_backend_synchronize(MOE_BACKEND_CUDA, NULL);
    const char *msg = moe_last_error();
    if (st != want || strstr(msg, needle) == NULL || strstr(msg, op) == NULL)
        pt_fail(c, "bad-layout", "gpu %s with an invalid layout: moe_backend_synchronize gave %s (\"%s\"), want %s "
                "with a message naming %s and holding \"%s\"", op, moe_strerror(st), msg, moe_strerror(want), op,
                needle);
}

/* Property 4 on the case's inputs (options as drawn, except accumulate, grad_fp32 and bias, which do not
 * change the layout check). */
static void invalid_layout(pt_case *c, const mt_case *m, int kind)
{
    const int64_t N = m->N, NB = m->N * m->B, H = m->H, I = m->I;
    int64_t *b2e = xmalloc((size_t)(N + 1) * sizeof(int64_t)), *ids = xmalloc((size_t)(NB + 1) * sizeof(int64_t));
    memcpy(b2e, m->b2e, (size_t)N * sizeof(int64_t));
    memcpy(ids, m->ids, (size_t)NB * sizeof(int64_t));
    moe_status want = MOE_OK;
    char needle[200];
    if (!corrupt_layout(c, m, kind, b2e, ids, &want, needle, sizeof needle)) {
        pt_describe(c, " (no layout entry to corrupt)");
        free(b2e), free(ids);
        return;
    }
    moe_mlp_options o = m->opt;
    o.accumulate = 0, o.grad_fp32 = 0, o.bias = 0;
    moe_mlp_layout l = m->layout;
    l.block_to_expert = b2e, l.token_position_to_id = ids;
    const mlp_bytes b = bytes_of(&l, H, I, &o);
    const size_t es = moe_dtype_size(o.dtype);
    /* outputs: out, ckpt_gu, ckpt_d (fwd); d_hidden, d_aff, d_wgu, d_wd (bwd) */
    enum { OUTS = 7 };
    const size_t sz[OUTS] = {b.x, b.cgu, b.cd, b.x, b.aff, b.g_wgu, b.g_wd};
    static const char *const out_names[OUTS] = {"out", "gate_up_ckpt_T", "down_ckpt", "d_hidden", "d_affinities",
                                                "d_w_gu", "d_w_d"};
    void *host[OUTS], *dev[OUTS];
    unsigned char *back = xmalloc(b.x + b.cgu + b.cd + b.aff + b.g_wgu + b.g_wd + 1);
    int ok = 1;
    gpu_case = c;
    for (int q = 0; q < OUTS; q++) {
        host[q] = xmalloc(sz[q] + 1);
        oracle_poison(o.dtype, host[q], (int64_t)(sz[q] / es));
        dev[q] = up(host[q], sz[q], &ok);
    }
    void *db2e = up(b2e, b.b2e, &ok), *dids = up(ids, b.ids, &ok);
    void *dx = up(m->hidden, b.x, &ok), *da = up(m->aff, b.aff, &ok), *dwgu = up(m->w_gu, b.wgu, &ok);
    void *dwd = up(m->w_d, b.wd, &ok), *dg = up(m->G, b.x, &ok);
    if (ok) {
        moe_mlp_layout dl = l;
        dl.block_to_expert = db2e, dl.token_position_to_id = dids;
        moe_status st = moe_mlp_fwd(MOE_BACKEND_CUDA, &dl, H, I, dx, da, dwgu, dwd, NULL, NULL, dev[0], dev[1], dev[2],
                                    &o);
        expect_device_error(c, st, "moe_mlp_fwd", want, needle);
        /* the backward reads the (untouched, poisoned) checkpoints of the refused forward */
        st = moe_mlp_bwd(MOE_BACKEND_CUDA, &dl, H, I, dx, da, dwgu, dwd, NULL, dev[1], dev[2], dg, dev[3], dev[4],
                         dev[5], dev[6], NULL, NULL, &o);
        expect_device_error(c, st, "moe_mlp_bwd", want, needle);
        st = moe_backend_synchronize(MOE_BACKEND_CUDA, NULL);
        if (st != MOE_OK)
            pt_fail(c, "bad-layout", "the synchronisation after the reported layout errors gave %s (%s), want MOE_OK "
                    "(an error is reported once)", moe_strerror(st), moe_last_error());
        for (int q = 0; q < OUTS && ok; q++) {
            ok = pt_device_download(c, back, dev[q], sz[q]);
            if (ok && memcmp(back, host[q], sz[q]) != 0)
                pt_fail(c, "bad-layout", "device %s was written by a call with an invalid layout (%s)", out_names[q],
                        needle);
        }
    }
    void *all[] = {db2e, dids, dx, da, dwgu, dwd, dg};
    pt_device_free_all(all, sizeof all / sizeof all[0]);
    pt_device_free_all(dev, OUTS);
    for (int q = 0; q < OUTS; q++)
        free(host[q]);
    free(back), free(b2e), free(ids);
}

/* ---- the op ---- */

/* mt_run on the GPU (hooks set, restored after); 0 when a GPU call failed (the case has failed). */
static int gpu_run(pt_case *c, const mt_case *m, int checks, int down_ckpt, mt_result *res, const char *what)
{
    gpu_case = c, gpu_failed = 0;
    mt_mlp_fwd = gpu_fwd, mt_mlp_bwd = gpu_bwd, mt_backend = MOE_BACKEND_CUDA, mt_split_operands = 1;
    if (checks)
        pt_mlp_run_checked(c, m, checks, down_ckpt, res, what);
    else
        mt_run(m, 0, down_ckpt, res);
    mt_mlp_fwd = moe_mlp_fwd, mt_mlp_bwd = moe_mlp_bwd, mt_backend = MOE_BACKEND_REF, mt_split_operands = 0;
    return !gpu_failed;
}

void pt_gpu_mlp(pt_case *c)
{
    const int bad_kind = pt_pick(c->src, BAD_KINDS);
    pt_mlp_draw d;
    pt_mlp_generate(c, &d);
    pt_mlp_draw_values(c, &d); /* last, as in op mlp */
    mt_case m;
    pt_mlp_build(&d, &d.opt, d.layout_mode, &m);
    pt_mlp_describe_values(c, &m);
    pt_describe(c, " N=%lld", (long long)m.N);
    mt_result gpu, again, ref;
    const int checks = MT_CHECK_BOUND | (d.opt.dtype != MOE_F32 ? MT_CHECK_EXACT_ROUNDING : 0);
    const int ran = gpu_run(c, &m, checks, d.down_ckpt_in_bwd, &gpu, "gpu mlp");
    if (ran) {
        mt_run(&m, 0, d.down_ckpt_in_bwd, &ref); /* the CPU reference (its own bound: op mlp) */
        const int64_t bad = mt_compare_results(&m, &gpu, &m, &ref, "GPU vs CPU reference");
        if (bad)
            pt_fail(c, "gpu-vs-ref", "%lld outputs differ from the CPU reference by more than the sum of both bounds "
                    "(details below)", (long long)bad);
        mt_result_free(&ref);
        if (gpu_run(c, &m, 0, d.down_ckpt_in_bwd, &again, "gpu mlp again")) {
            if (!mt_results_identical(&m, &gpu, &again, 1))
                pt_fail(c, "determinism", "two GPU runs on identical inputs differ bitwise (outputs, checkpoints or "
                        "gradients)");
        }
        mt_result_free(&again);
        if (bad_kind != BAD_NONE)
            invalid_layout(c, &m, bad_kind);
    }
    mt_result_free(&gpu);
    mt_case_free(&m);
    free(d.ids);
}

/* ---- gpu-mlp-layout: moe_mlp_layout_build_on(MOE_BACKEND_CUDA) in pt_mlp_layout.c's property ----
 * The routing and weights go up as device copies, every output as a device copy of its host contents (the
 * property's marker), so that an output the builder does not write comes back unchanged.  The call only
 * queues: an invalid id is reported by moe_backend_synchronize, whose status is this builder's answer. */
static moe_status cuda_build_on(pt_case *c, const pt_layout_call *call, int64_t *b2e, int64_t *ids, void *aff,
                                int64_t *dropped, int64_t *used)
{
    const int64_t B = call->opt.block_size, n_pos = call->capacity * B;
    const size_t es = moe_dtype_size(call->opt.dtype), aff_bytes = (size_t)(call->T * call->E) * es;
    enum { TOPK, TW, B2E, IDS, AFF, DROPPED, USED, BUFS };
    void *dev[BUFS] = {NULL};
    int ok = (dev[TOPK] = pt_device_copy(c, call->topk_ids, (size_t)(call->T * call->k) * sizeof(int64_t))) != NULL &&
             (call->topk_weights == NULL ||
              (dev[TW] = pt_device_copy(c, call->topk_weights, (size_t)(call->T * call->k) * es)) != NULL) &&
             (dev[B2E] = pt_device_copy(c, b2e, (size_t)call->capacity * sizeof(int64_t))) != NULL &&
             (dev[IDS] = pt_device_copy(c, ids, (size_t)n_pos * sizeof(int64_t))) != NULL &&
             (aff == NULL || (dev[AFF] = pt_device_copy(c, aff, aff_bytes)) != NULL) &&
             (dev[DROPPED] = pt_device_copy(c, dropped, sizeof(int64_t))) != NULL &&
             (dev[USED] = pt_device_copy(c, used, sizeof(int64_t))) != NULL;
    moe_status st = MOE_OK;
    if (ok) {
        moe_mlp_options o = call->opt;
        o.stream = NULL;
        st = moe_mlp_layout_build_on(MOE_BACKEND_CUDA, call->kind, call->T, call->k, call->E, dev[TOPK], dev[TW],
                                     call->capacity, dev[B2E], dev[IDS], dev[AFF], dev[DROPPED], dev[USED], &o);
        const moe_status synced = moe_backend_synchronize(MOE_BACKEND_CUDA, NULL);
        if (st == MOE_OK)
            st = synced;
        ok = pt_device_download(c, b2e, dev[B2E], (size_t)call->capacity * sizeof(int64_t)) &&
             pt_device_download(c, ids, dev[IDS], (size_t)n_pos * sizeof(int64_t)) &&
             (aff == NULL || pt_device_download(c, aff, dev[AFF], aff_bytes)) &&
             pt_device_download(c, dropped, dev[DROPPED], sizeof(int64_t)) &&
             pt_device_download(c, used, dev[USED], sizeof(int64_t));
    }
    pt_device_free_all(dev, BUFS);
    return ok ? st : MOE_OK; /* a CUDA failure has failed the case already, with its own tag */
}

void pt_gpu_mlp_layout(pt_case *c) { pt_mlp_layout_with(c, cuda_build_on); }
