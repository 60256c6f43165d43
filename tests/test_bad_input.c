/* Argument validation of every entry point (moe.h: "Every entry point validates its arguments before
 * touching any output.  On failure it returns a status other than MOE_OK, leaves every output untouched
 * and records a message for moe_last_error() naming the argument").
 *
 * For each bad input and each entry point it applies to (moe_gemm_fwd, _dx, _dw, _topk_weights_grad,
 * _bwd, moe_routing_from_topk, moe_routing_validate) the test checks: the exact status code, a non-empty
 * moe_last_error() that names the failing function and the offending argument, a non-NULL moe_strerror,
 * and every buffer (outputs filled with a byte pattern, inputs with data) byte for byte unchanged.
 *
 * Bad inputs: sum(m_sizes) != T*k (both ways), negative sizes, out-of-range and duplicate gather
 * indices, NULL routing / m_sizes / gather (when needed) / each tensor with a non-zero extent, negative
 * or inconsistent dimensions, an invalid dtype, dimension products past 64 bits, reduce_topk outside
 * dX, dx_only/dw_only outside bwd and together, allow_tf32 with f16/bf16, outputs overlapping the routing
 * arrays, outputs overlapping inputs or
 * each other, d_topk_weights without topk_weights, reduce_topk with dw_only, an unavailable or unknown
 * backend, out-of-range topk ids.
 * Good inputs that look bad: NULL pointers with zero extent (T = 0, N = 0, K = 0), NULL outputs bwd does
 * not compute, gather_indices NULL when nothing needs it, allow_tf32 with f32.
 *
 * Usage: test_bad_input    (deterministic; each failure prints one line naming the case) */
#include "moe.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK_MAX_PRINTED 60
#include "check.h"

enum op { OP_FWD, OP_DX, OP_DW, OP_TOPK, OP_BWD, OP_COUNT };
static const char *const OP_NAMES[] = {"moe_gemm_fwd", "moe_gemm_dx", "moe_gemm_dw", "moe_gemm_topk_weights_grad",
                                       "moe_gemm_bwd"};

/* ---- the baseline problem and its buffers ---- */

enum { T0 = 6, K0 = 2, E0 = 4, M0 = T0 * K0, NN = 5, KK = 3 };
enum { PATTERN = 0xC3 };

/* One arena holds every tensor, so overlap cases can point one argument into another. */
enum { X_OFF = 0, X_LEN = M0 * KK * 4 };
enum { W_OFF = X_OFF + X_LEN + 64, W_LEN = E0 * NN * KK * 4 };
enum { DY_OFF = W_OFF + W_LEN + 64, DY_LEN = M0 * NN * 4 };
enum { TW_OFF = DY_OFF + DY_LEN + 64, TW_LEN = M0 * 4 };
enum { Y_OFF = TW_OFF + TW_LEN + 64, Y_LEN = M0 * NN * 4 };
enum { DX_OFF = Y_OFF + Y_LEN + 64, DX_LEN = M0 * KK * 4 };
enum { DW_OFF = DX_OFF + DX_LEN + 64, DW_LEN = E0 * NN * KK * 4 };
enum { DT_OFF = DW_OFF + DW_LEN + 64, DT_LEN = M0 * 4 };
enum { ARENA = DT_OFF + DT_LEN + 64 };

static _Alignas(16) unsigned char arena[ARENA];
static unsigned char snapshot[ARENA];
static int64_t base_ids[M0], base_m_sizes[E0], base_gather[M0];
/* routing copies a case may edit; compared after the call too (inputs must not change) */
static int64_t m_sizes[E0], gather[M0];

typedef struct call_args {
    moe_backend backend;
    const moe_routing *routing;
    moe_routing r;
    int64_t N, K;
    const void *x, *w, *dy, *tw;
    void *y, *dx, *dw, *dt;
    moe_gemm_options o;
} call_args;

/* Fresh baseline for op: valid routing (expert 3 empty), f32, plain mode, every pointer the op needs set,
 * no topk weights (so bwd gets no d_topk_weights). */
static call_args baseline_for(enum op op)
{
    memcpy(m_sizes, base_m_sizes, sizeof m_sizes);
    memcpy(gather, base_gather, sizeof gather);
    call_args a;
    memset(&a, 0, sizeof a);
    a.backend = MOE_BACKEND_REF;
    a.r = (moe_routing){T0, K0, E0, m_sizes, gather};
    a.routing = NULL; /* set to &a.r at call time unless null_routing */
    a.N = NN, a.K = KK;
    a.x = arena + X_OFF, a.w = arena + W_OFF, a.dy = arena + DY_OFF, a.tw = NULL;
    a.y = arena + Y_OFF, a.dx = arena + DX_OFF, a.dw = arena + DW_OFF;
    a.dt = op == OP_TOPK ? arena + DT_OFF : NULL;
    a.o.dtype = MOE_F32;
    return a;
}

static void reset_arena(void)
{
    /* inputs: small finite floats (valid in every dtype as bit patterns too); outputs: the pattern */
    for (int i = 0; i < Y_OFF; i++)
        arena[i] = (unsigned char)((i * 37 + 11) & 0x3f);
    memset(arena + Y_OFF, PATTERN, ARENA - Y_OFF);
}

static moe_status call(enum op op, call_args *a, int null_routing)
{
    const moe_routing *r = null_routing ? NULL : &a->r;
    switch (op) {
    case OP_FWD: return moe_gemm_fwd(a->backend, r, a->N, a->K, a->x, a->w, a->tw, a->y, &a->o);
    case OP_DX: return moe_gemm_dx(a->backend, r, a->N, a->K, a->dy, a->w, a->tw, a->dx, &a->o);
    case OP_DW: return moe_gemm_dw(a->backend, r, a->N, a->K, a->x, a->dy, a->tw, a->dw, &a->o);
    case OP_TOPK: return moe_gemm_topk_weights_grad(a->backend, r, a->N, a->K, a->x, a->w, a->dy, a->dt, &a->o);
    default: return moe_gemm_bwd(a->backend, r, a->N, a->K, a->x, a->w, a->dy, a->tw, a->dx, a->dw, a->dt, &a->o);
    }
}

static void check_message(const char *what, const char *fn, moe_status st, const char *needle)
{
    const char *msg = moe_last_error();
    CHECK(msg != NULL && msg[0] != '\0', "%s: %s: moe_last_error() is empty after status %d", fn, what, (int)st);
    if (msg == NULL)
        return;
    CHECK(strstr(msg, fn) != NULL, "%s: %s: message \"%s\" does not name the function", fn, what, msg);
    CHECK(needle == NULL || strstr(msg, needle) != NULL, "%s: %s: message \"%s\" does not contain \"%s\"", fn, what,
          msg, needle);
    const char *text = moe_strerror(st);
    CHECK(text != NULL && strcmp(text, "unknown status code") != 0, "%s: %s: moe_strerror(%d) = %s", fn, what,
          (int)st, text ? text : "(null)");
}

/* Calls op with a (already edited by the case); expects status `want`, a message containing `needle`, and
 * the arena and routing arrays unchanged. */
static void expect_fail_routing(const char *what, enum op op, call_args a, int null_routing, moe_status want,
                                const char *needle)
{
    reset_arena();
    memcpy(snapshot, arena, ARENA);
    int64_t ms_before[E0], g_before[M0];
    memcpy(ms_before, m_sizes, sizeof ms_before);
    memcpy(g_before, gather, sizeof g_before);
    const moe_status st = call(op, &a, null_routing);
    CHECK(st == want, "%s: %s: status %d (%s), expected %d (%s); message \"%s\"", OP_NAMES[op], what, (int)st,
          moe_strerror(st), (int)want, moe_strerror(want), moe_last_error());
    if (st != MOE_OK)
        check_message(what, OP_NAMES[op], st, needle);
    if (memcmp(arena, snapshot, ARENA) != 0) {
        size_t i = 0;
        while (arena[i] == snapshot[i])
            i++;
        const char *where = i < W_OFF ? "x" : i < DY_OFF ? "w" : i < TW_OFF ? "dy" : i < Y_OFF ? "topk_weights"
                          : i < DX_OFF ? "y" : i < DW_OFF ? "dx" : i < DT_OFF ? "dw" : "d_topk_weights";
        CHECK(0, "%s: %s: the failing call changed buffer %s (arena byte %zu)", OP_NAMES[op], what, where, i);
    }
    CHECK(memcmp(ms_before, m_sizes, sizeof ms_before) == 0 && memcmp(g_before, gather, sizeof g_before) == 0,
          "%s: %s: the failing call changed the routing arrays", OP_NAMES[op], what);
}

static void expect_fail(const char *what, enum op op, call_args a, moe_status want, const char *needle)
{
    expect_fail_routing(what, op, a, 0, want, needle);
}

/* A call that must succeed; moe_last_error() must then be "". */
static void expect_ok(const char *what, enum op op, call_args a)
{
    reset_arena();
    const moe_status st = call(op, &a, 0);
    CHECK(st == MOE_OK, "%s: %s: status %d (%s), expected MOE_OK; message \"%s\"", OP_NAMES[op], what, (int)st,
          moe_strerror(st), moe_last_error());
    CHECK(moe_last_error()[0] == '\0', "%s: %s: moe_last_error() = \"%s\" after success", OP_NAMES[op], what,
          moe_last_error());
}

/* ---- cases ---- */

static void routing_defects(void)
{
    for (int op = 0; op < OP_COUNT; op++)
        for (int permute = 0; permute < 2; permute++) {
            /* plain mode (gather given but not needed: still checked) and permute_x (gather needed) */
            call_args a;
            char what[128];
#define CASE(label, edit, status, needle)                                                                   \
    do {                                                                                                      \
        a = baseline_for((enum op)op);                                                                        \
        a.o.permute_x = permute;                                                                              \
        edit;                                                                                                 \
        snprintf(what, sizeof what, "%s%s", label, permute ? " (permute_x)" : "");                            \
        expect_fail(what, (enum op)op, a, status, needle);                                                    \
    } while (0)
            CASE("sum(m_sizes) = T*k - 1", m_sizes[1]--, MOE_ERR_INVALID_ROUTING, "m_sizes");
            CASE("sum(m_sizes) = T*k + 1", m_sizes[2]++, MOE_ERR_INVALID_ROUTING, "m_sizes");
            CASE("sum(m_sizes) = 0", memset(m_sizes, 0, sizeof m_sizes), MOE_ERR_INVALID_ROUTING, "m_sizes");
            CASE("m_sizes[2] = -1 (sum kept)", (m_sizes[3] += m_sizes[2] + 1, m_sizes[2] = -1),
                 MOE_ERR_INVALID_ROUTING, "m_sizes[2]");
            CASE("m_sizes = {INT64_MAX, INT64_MAX, ..}", (m_sizes[0] = INT64_MAX, m_sizes[1] = INT64_MAX),
                 MOE_ERR_INVALID_ROUTING, "m_sizes");
            CASE("gather_indices[4] = T*k", gather[4] = M0, MOE_ERR_INVALID_ROUTING, "gather_indices[4]");
            CASE("gather_indices[0] = -1", gather[0] = -1, MOE_ERR_INVALID_ROUTING, "gather_indices[0]");
            CASE("gather_indices[11] = INT64_MIN", gather[11] = INT64_MIN, MOE_ERR_INVALID_ROUTING,
                 "gather_indices[11]");
            CASE("gather_indices[8] duplicates [3]", gather[8] = gather[3], MOE_ERR_INVALID_ROUTING,
                 "gather_indices[8]");
            CASE("m_sizes NULL", a.r.m_sizes = NULL, MOE_ERR_NULL_POINTER, "m_sizes");
            CASE("num_tokens = -1", a.r.num_tokens = -1, MOE_ERR_INVALID_SHAPE, "num_tokens");
            CASE("topk = 0 with T > 0", a.r.topk = 0, MOE_ERR_INVALID_SHAPE, "topk");
            CASE("topk = -1", a.r.topk = -1, MOE_ERR_INVALID_SHAPE, "topk");
            CASE("num_experts = 0", a.r.num_experts = 0, MOE_ERR_INVALID_SHAPE, "num_experts");
            CASE("num_experts = -4", a.r.num_experts = -4, MOE_ERR_INVALID_SHAPE, "num_experts");
            CASE("N = -1", a.N = -1, MOE_ERR_INVALID_SHAPE, "N");
            CASE("K = -3", a.K = -3, MOE_ERR_INVALID_SHAPE, "K");
            CASE("T*k past 64 bits", (a.r.num_tokens = (int64_t)1 << 62, a.r.topk = 4), MOE_ERR_OVERFLOW,
                 "T*k = 4611686018427387904*4 overflows");
            CASE("T*k past SIZE_MAX / 16", (a.r.num_tokens = (int64_t)1 << 60, a.r.topk = 2), MOE_ERR_OVERFLOW,
                 "T*k = 2305843009213693952 rows exceeds SIZE_MAX / 16");
            CASE("E past SIZE_MAX / 16", (a.r.num_experts = (int64_t)1 << 61, a.N = 0, a.K = 0), MOE_ERR_OVERFLOW,
                 "num_experts = 2305843009213693952 exceeds");
            CASE("topk = 0 with tokens", a.r.topk = 0, MOE_ERR_INVALID_SHAPE, "0 only with num_tokens = 0");
            CASE("E*N*K past 64 bits (E=16, N=K=2^40)",
                 (a.r.num_experts = 16, a.N = (int64_t)1 << 40, a.K = (int64_t)1 << 40), MOE_ERR_OVERFLOW,
                 "E*N*K = 16*1099511627776*1099511627776 overflows");
            CASE("N*K*4 bytes past 64 bits (N=2^31, K=2^30)", (a.N = (int64_t)1 << 31, a.K = (int64_t)1 << 30),
                 MOE_ERR_OVERFLOW, NULL);
            CASE("dtype = 5", a.o.dtype = (moe_dtype)5, MOE_ERR_INVALID_DTYPE, "dtype");
            CASE("dtype = e4m3", a.o.dtype = MOE_E4M3, MOE_ERR_INVALID_DTYPE, "options.dtype = e4m3: FP8 tensors "
                 "need their scales");
            CASE("dtype = e5m2", a.o.dtype = MOE_E5M2, MOE_ERR_INVALID_DTYPE, "options.dtype = e5m2: FP8");
            CASE("dtype = -1", a.o.dtype = (moe_dtype)-1, MOE_ERR_INVALID_DTYPE, "dtype");
            CASE("allow_tf32 with bf16", (a.o.dtype = MOE_BF16, a.o.allow_tf32 = 1), MOE_ERR_INVALID_OPTION,
                 "allow_tf32");
            CASE("allow_tf32 with f16", (a.o.dtype = MOE_F16, a.o.allow_tf32 = 1), MOE_ERR_INVALID_OPTION,
                 "allow_tf32");
            CASE("negative ref_scratch_bytes", a.o.ref_scratch_bytes = -1, MOE_ERR_INVALID_OPTION,
                 "ref_scratch_bytes");
            CASE("backend 7", a.backend = (moe_backend)7, MOE_ERR_NO_BACKEND, "backend 7 is not a libmoe backend");
            if (!moe_backend_available(MOE_BACKEND_CUDA))
                CASE("CUDA backend not available", a.backend = MOE_BACKEND_CUDA, MOE_ERR_NO_BACKEND, NULL);
            if (op != OP_BWD) {
                CASE("dx_only outside bwd", a.o.dx_only = 1, MOE_ERR_INVALID_OPTION, "dx_only");
                CASE("dw_only outside bwd", a.o.dw_only = 1, MOE_ERR_INVALID_OPTION, "dw_only");
            } else {
                CASE("dx_only and dw_only", (a.o.dx_only = 1, a.o.dw_only = 1), MOE_ERR_INVALID_OPTION, "dw_only");
            }
            if (op == OP_FWD || op == OP_DW || op == OP_TOPK)
                CASE("reduce_topk outside dX", a.o.reduce_topk = 1, MOE_ERR_INVALID_OPTION, "reduce_topk");
            a = baseline_for((enum op)op);
            a.o.permute_x = permute;
            snprintf(what, sizeof what, "routing NULL%s", permute ? " (permute_x)" : "");
            expect_fail_routing(what, (enum op)op, a, 1, MOE_ERR_NULL_POINTER, "routing");
#undef CASE
        }
}

/* gather_indices NULL when the call needs it. */
static void missing_gather(void)
{
    for (int op = 0; op < OP_COUNT; op++) {
        call_args a;
#define NEED(label, edit)                                                                                     \
    do {                                                                                                      \
        a = baseline_for((enum op)op);                                                                        \
        a.r.gather_indices = NULL;                                                                            \
        edit;                                                                                                 \
        expect_fail("gather_indices NULL with " label, (enum op)op, a, MOE_ERR_NULL_POINTER, "gather_indices"); \
    } while (0)
        NEED("permute_x", a.o.permute_x = 1);
        NEED("permute_y", a.o.permute_y = 1);
        if (op != OP_TOPK) /* the topk grad takes no topk weights */
            NEED("topk_weights", (a.tw = arena + TW_OFF, a.dt = op == OP_BWD ? arena + DT_OFF : NULL));
        if (op == OP_DX || op == OP_BWD)
            NEED("reduce_topk", a.o.reduce_topk = 1);
        if (op == OP_TOPK)
            NEED("nothing else (the topk grad always needs it)", (void)0);
#undef NEED
    }
}

/* Each tensor argument NULL with a non-zero extent. */
static void null_tensors(void)
{
    call_args a;
#define NUL(op, field, name)                                                                                  \
    do {                                                                                                      \
        a = baseline_for(op);                                                                                 \
        a.field = NULL;                                                                                       \
        expect_fail(name " NULL", op, a, MOE_ERR_NULL_POINTER, name " is NULL");                              \
    } while (0)
    NUL(OP_FWD, x, "x");
    NUL(OP_FWD, w, "w");
    NUL(OP_FWD, y, "y");
    NUL(OP_DX, dy, "dy");
    NUL(OP_DX, w, "w");
    NUL(OP_DX, dx, "dx");
    NUL(OP_DW, x, "x");
    NUL(OP_DW, dy, "dy");
    NUL(OP_DW, dw, "dw");
    NUL(OP_TOPK, x, "x");
    NUL(OP_TOPK, w, "w");
    NUL(OP_TOPK, dy, "dy");
    NUL(OP_TOPK, dt, "d_topk_weights");
    NUL(OP_BWD, x, "x");
    NUL(OP_BWD, w, "w");
    NUL(OP_BWD, dy, "dy");
    NUL(OP_BWD, dx, "dx");
    NUL(OP_BWD, dw, "dw");
#undef NUL
    /* with permute_x, x has T rows; still not NULL */
    a = baseline_for(OP_FWD);
    a.o.permute_x = 1;
    a.x = NULL;
    expect_fail("x NULL (permute_x)", OP_FWD, a, MOE_ERR_NULL_POINTER, "x is NULL");
    /* reduce_topk: dx has T rows */
    a = baseline_for(OP_DX);
    a.o.reduce_topk = 1;
    a.dx = NULL;
    expect_fail("dx NULL (reduce_topk)", OP_DX, a, MOE_ERR_NULL_POINTER, "dx is NULL");
    /* bwd: dx_only needs dx, dw_only needs dw */
    a = baseline_for(OP_BWD);
    a.o.dx_only = 1;
    a.dx = NULL;
    expect_fail("dx NULL (dx_only)", OP_BWD, a, MOE_ERR_NULL_POINTER, "dx is NULL");
    a = baseline_for(OP_BWD);
    a.o.dw_only = 1;
    a.dw = NULL;
    expect_fail("dw NULL (dw_only)", OP_BWD, a, MOE_ERR_NULL_POINTER, "dw is NULL");
}

/* Tensors and routing arrays off their element alignment: refused before anything reads them; a 16-bit
 * tensor two bytes off is fine. */
static void misaligned(void)
{
    call_args a = baseline_for(OP_FWD);
    a.x = arena + X_OFF + 2;
    expect_fail("x 2 bytes off (f32)", OP_FWD, a, MOE_ERR_MISALIGNED, "x at");
    a = baseline_for(OP_DW);
    a.dw = arena + DW_OFF + 1;
    expect_fail("dw 1 byte off", OP_DW, a, MOE_ERR_MISALIGNED, "dw at");
    a = baseline_for(OP_BWD);
    a.o.dtype = MOE_BF16;
    a.w = arena + W_OFF + 1;
    expect_fail("w 1 byte off (bf16)", OP_BWD, a, MOE_ERR_MISALIGNED, "2-byte bf16 elements");
    a = baseline_for(OP_BWD);
    a.o.dtype = MOE_BF16;
    a.w = arena + W_OFF + 2, a.dx = arena + DX_OFF + 2;
    expect_ok("w and dx 2 bytes off (bf16)", OP_BWD, a);
    a = baseline_for(OP_FWD);
    a.r.m_sizes = (int64_t *)(void *)((unsigned char *)m_sizes + 4);
    expect_fail("routing.m_sizes 4 bytes off", OP_FWD, a, MOE_ERR_MISALIGNED, "routing.m_sizes at");
    a = baseline_for(OP_FWD);
    a.o.permute_x = 1;
    a.r.gather_indices = (int64_t *)(void *)((unsigned char *)gather + 2);
    expect_fail("routing.gather_indices 2 bytes off", OP_FWD, a, MOE_ERR_MISALIGNED, "8-byte int64 elements");
}

/* bwd-only option errors. */
static void bwd_options(void)
{
    call_args a = baseline_for(OP_BWD);
    a.dt = arena + DT_OFF; /* d_topk_weights without topk_weights */
    expect_fail("d_topk_weights without topk_weights", OP_BWD, a, MOE_ERR_INVALID_OPTION, "d_topk_weights");
    a = baseline_for(OP_BWD);
    a.o.dw_only = 1;
    a.o.reduce_topk = 1;
    expect_fail("reduce_topk with dw_only", OP_BWD, a, MOE_ERR_INVALID_OPTION, "reduce_topk");
}

/* Outputs overlapping inputs or other outputs. */
static void overlaps(void)
{
    call_args a;
#define OVERLAP(label, op, edit)                                                                              \
    do {                                                                                                      \
        a = baseline_for(op);                                                                                 \
        edit;                                                                                                 \
        expect_fail(label, op, a, MOE_ERR_INVALID_OPTION, "overlap");                                        \
    } while (0)
    OVERLAP("y == x", OP_FWD, a.y = arena + X_OFF);
    OVERLAP("y overlaps the end of w", OP_FWD, a.y = arena + W_OFF + W_LEN - 4);
    OVERLAP("y overlaps the end of x", OP_FWD, a.y = arena + X_OFF + X_LEN - 4);
    OVERLAP("y overlaps topk_weights", OP_FWD, (a.tw = arena + TW_OFF, a.y = arena + TW_OFF + 8));
    OVERLAP("dx == dy", OP_DX, a.dx = arena + DY_OFF);
    OVERLAP("dx overlaps w", OP_DX, a.dx = arena + W_OFF + 12);
    OVERLAP("dw == x", OP_DW, a.dw = arena + X_OFF);
    OVERLAP("dw overlaps dy", OP_DW, a.dw = arena + DY_OFF + DY_LEN - 4);
    OVERLAP("d_topk_weights == x", OP_TOPK, a.dt = arena + X_OFF);
    OVERLAP("d_topk_weights overlaps dy", OP_TOPK, a.dt = arena + DY_OFF + 4);
    OVERLAP("dx == dw", OP_BWD, a.dx = a.dw);
    OVERLAP("dx overlaps dw", OP_BWD, a.dx = arena + DW_OFF + 4);
    OVERLAP("dw == x", OP_BWD, a.dw = arena + X_OFF);
    OVERLAP("dx overlaps topk_weights", OP_BWD, (a.tw = arena + TW_OFF, a.dt = arena + DT_OFF, a.dx = arena + TW_OFF));
    OVERLAP("d_topk_weights overlaps dx", OP_BWD, (a.tw = arena + TW_OFF, a.dt = arena + DX_OFF + 4));
    OVERLAP("d_topk_weights overlaps dw", OP_BWD, (a.tw = arena + TW_OFF, a.dt = arena + DW_OFF));
    OVERLAP("dx overlaps dy (dx_only)", OP_BWD, (a.o.dx_only = 1, a.dx = arena + DY_OFF));
    OVERLAP("dw overlaps x (dw_only)", OP_BWD, (a.o.dw_only = 1, a.dw = arena + X_OFF + 4));
    OVERLAP("d_topk_weights overlaps dw (dw_only)", OP_BWD,
            (a.o.dw_only = 1, a.tw = arena + TW_OFF, a.dt = arena + DW_OFF + 8));
    /* an output on an input that only another product of the call reads (dx == x
     * was accepted and dW computed from dX; dw == w gave a wrong d_topk_weights) */
    OVERLAP("dx overlaps x (dW reads it)", OP_BWD, a.dx = arena + X_OFF);
    OVERLAP("dw overlaps w (d_topk_weights reads it)", OP_BWD, (a.tw = arena + TW_OFF, a.dt = arena + DT_OFF,
                                                              a.dw = arena + W_OFF));
    OVERLAP("d_topk_weights overlaps topk_weights", OP_BWD, (a.tw = arena + TW_OFF, a.dt = arena + TW_OFF));
#undef OVERLAP
}

/* Outputs on top of the routing arrays.  The routing contents are valid, so only the overlap check can
 * refuse; each buffer has room for the whole output, so a library without the check corrupts only it. */
static void routing_overlaps(void)
{
    static int64_t gather_room[M0 * NN], sizes_room[E0 * NN * KK];
    call_args a = baseline_for(OP_FWD);
    memcpy(gather_room, base_gather, sizeof base_gather);
    a.r.gather_indices = gather_room, a.o.permute_y = 1, a.y = gather_room;
    moe_status st = call(OP_FWD, &a, 0);
    CHECK(st == MOE_ERR_INVALID_OPTION && strstr(moe_last_error(), "gather_indices") != NULL,
          "moe_gemm_fwd: y on top of routing.gather_indices: status %d, message \"%s\"", (int)st, moe_last_error());
    CHECK(memcmp(gather_room, base_gather, sizeof base_gather) == 0, "moe_gemm_fwd: gather_indices were overwritten");

    a = baseline_for(OP_DW);
    memcpy(sizes_room, base_m_sizes, sizeof base_m_sizes);
    a.r.m_sizes = sizes_room, a.dw = sizes_room;
    st = call(OP_DW, &a, 0);
    CHECK(st == MOE_ERR_INVALID_OPTION && strstr(moe_last_error(), "m_sizes") != NULL,
          "moe_gemm_dw: dw on top of routing.m_sizes: status %d, message \"%s\"", (int)st, moe_last_error());
    CHECK(memcmp(sizes_room, base_m_sizes, sizeof base_m_sizes) == 0, "moe_gemm_dw: m_sizes were overwritten");
}

/* Calls that look suspicious but are valid. */
static void valid_edge_calls(void)
{
    static const int64_t zeros[E0] = {0, 0, 0, 0};
    call_args a;
    for (int op = 0; op < OP_COUNT; op++)
        for (int mode = 0; mode < 4; mode++) {
            /* T = 0: every tensor with M or T rows may be NULL, and so may gather_indices */
            a = baseline_for((enum op)op);
            a.r = (moe_routing){0, K0, E0, zeros, NULL};
            a.o.permute_x = mode & 1, a.o.permute_y = mode >> 1;
            a.x = NULL, a.dy = NULL, a.y = NULL, a.dx = NULL, a.dt = NULL;
            expect_ok("T = 0 with NULL x, dy, y, dx, d_topk_weights, gather", (enum op)op, a);
            if (op == OP_DW || op == OP_BWD) { /* dW of an empty problem is all zeros */
                int zero = 1;
                for (int i = 0; i < E0 * NN * KK * 4; i++)
                    zero &= arena[DW_OFF + i] == 0;
                CHECK(zero, "%s: T = 0: dw is not all +0", OP_NAMES[op]);
            }
            if (op == OP_DX || op == OP_BWD) {
                a.o.reduce_topk = 1;
                expect_ok("T = 0, reduce_topk, NULL dx", (enum op)op, a);
            }
            a = baseline_for((enum op)op);
            a.r = (moe_routing){0, 0, E0, zeros, NULL};
            a.o.permute_x = mode & 1, a.o.permute_y = mode >> 1;
            a.x = NULL, a.dy = NULL, a.y = NULL, a.dx = NULL, a.dt = NULL;
            expect_ok("T = 0, topk = 0", (enum op)op, a);
        }
    /* N = 0: w, y, dy, dw may be NULL (empty); dx and d_topk_weights are written as zeros */
    for (int op = 0; op < OP_COUNT; op++) {
        a = baseline_for((enum op)op);
        a.N = 0;
        a.w = NULL, a.y = NULL, a.dy = NULL, a.dw = NULL;
        expect_ok("N = 0 with NULL w, y, dy, dw", (enum op)op, a);
        if (op == OP_DX || op == OP_BWD) {
            int zero = 1;
            for (int i = 0; i < M0 * KK * 4; i++)
                zero &= arena[DX_OFF + i] == 0;
            CHECK(zero, "%s: N = 0: dx is not all +0", OP_NAMES[op]);
        }
        if (op == OP_TOPK) {
            int zero = 1;
            for (int i = 0; i < M0 * 4; i++)
                zero &= arena[DT_OFF + i] == 0;
            CHECK(zero, "%s: N = 0: d_topk_weights is not all +0", OP_NAMES[op]);
        }
    }
    /* K = 0: x, w, dx, dw may be NULL; y is written as zeros */
    for (int op = 0; op < OP_COUNT; op++) {
        a = baseline_for((enum op)op);
        a.K = 0;
        a.x = NULL, a.w = NULL, a.dx = NULL, a.dw = NULL;
        expect_ok("K = 0 with NULL x, w, dx, dw", (enum op)op, a);
        if (op == OP_FWD) {
            int zero = 1;
            for (int i = 0; i < M0 * NN * 4; i++)
                zero &= arena[Y_OFF + i] == 0;
            CHECK(zero, "%s: K = 0: y is not all +0", OP_NAMES[op]);
        }
    }
    /* outputs bwd does not compute may be NULL */
    a = baseline_for(OP_BWD);
    a.o.dx_only = 1;
    a.dw = NULL;
    expect_ok("dx_only with dw NULL", OP_BWD, a);
    a = baseline_for(OP_BWD);
    a.o.dw_only = 1;
    a.dx = NULL;
    expect_ok("dw_only with dx NULL", OP_BWD, a);
    a = baseline_for(OP_BWD);
    a.tw = arena + TW_OFF;
    a.dt = NULL;
    expect_ok("topk_weights without d_topk_weights", OP_BWD, a);
    /* gather_indices NULL when nothing needs it */
    for (int op = 0; op < OP_COUNT; op++) {
        if (op == OP_TOPK)
            continue;
        a = baseline_for((enum op)op);
        a.r.gather_indices = NULL;
        expect_ok("plain mode with gather_indices NULL", (enum op)op, a);
    }
    /* allow_tf32 with f32 is accepted by the reference (which computes true fp32 anyway) */
    for (int op = 0; op < OP_COUNT; op++) {
        a = baseline_for((enum op)op);
        a.o.allow_tf32 = 1;
        expect_ok("allow_tf32 with f32", (enum op)op, a);
    }
    /* an empty dW with a huge N: nothing to write, done at once (the reference walked
     * E * ceil(N / 96) blocks, 20 s and 8 GB at N = 2^35; at 2^40 it failed for memory) */
    {
        static const int64_t one_zero[1] = {0};
        moe_routing r0 = {0, 1, 1, one_zero, NULL};
        moe_gemm_options o0 = {0};
        o0.dtype = MOE_F32;
        const moe_status st0 = moe_gemm_dw(MOE_BACKEND_REF, &r0, (int64_t)1 << 40, 0, NULL, NULL, NULL, NULL, &o0);
        CHECK(st0 == MOE_OK, "moe_gemm_dw, T = 0, N = 2^40, K = 0: %d (%s)", (int)st0, moe_last_error());
    }
    /* NULL options means defaults */
    reset_arena();
    moe_routing r = {T0, K0, E0, base_m_sizes, base_gather};
    moe_status st = moe_gemm_fwd(MOE_BACKEND_REF, &r, NN, KK, arena + X_OFF, arena + W_OFF, NULL, arena + Y_OFF, NULL);
    CHECK(st == MOE_OK, "moe_gemm_fwd with NULL options: %d (%s)", (int)st, moe_last_error());
}

/* The routing builders: failures write nothing. */
static void routing_builders(void)
{
    int64_t ids[M0], ms[E0], g[M0], sc[M0];
#define BUILD(label, T, k, E, ids_p, ms_p, g_p, sc_p, status, needle)                                           \
    do {                                                                                                      \
        memset(ms, PATTERN, sizeof ms), memset(g, PATTERN, sizeof g), memset(sc, PATTERN, sizeof sc);         \
        const moe_status st_ = moe_routing_from_topk(T, k, E, ids_p, ms_p, g_p, sc_p);                        \
        CHECK(st_ == status, "moe_routing_from_topk: %s: status %d (%s), expected %d; message \"%s\"", label, \
              (int)st_, moe_strerror(st_), (int)status, moe_last_error());                                    \
        if (st_ != MOE_OK)                                                                                    \
            check_message(label, "moe_routing_from_topk", st_, needle);                                       \
        int untouched_ = 1;                                                                                   \
        for (size_t i_ = 0; i_ < sizeof ms; i_++)                                                             \
            untouched_ &= ((unsigned char *)ms)[i_] == PATTERN;                                               \
        for (size_t i_ = 0; i_ < sizeof g; i_++)                                                              \
            untouched_ &= ((unsigned char *)g)[i_] == PATTERN && ((unsigned char *)sc)[i_] == PATTERN;        \
        CHECK(untouched_, "moe_routing_from_topk: %s: an output was written", label);                        \
    } while (0)
    memcpy(ids, base_ids, sizeof ids);
    ids[5] = E0;
    BUILD("topk_ids[2][1] = E", T0, K0, E0, ids, ms, g, sc, MOE_ERR_INVALID_INDEX, "topk_ids[2][1]");
    memcpy(ids, base_ids, sizeof ids);
    ids[11] = -1;
    BUILD("topk_ids[5][1] = -1", T0, K0, E0, ids, ms, g, sc, MOE_ERR_INVALID_INDEX, "topk_ids[5][1]");
    memcpy(ids, base_ids, sizeof ids);
    BUILD("m_sizes NULL", T0, K0, E0, ids, NULL, g, sc, MOE_ERR_NULL_POINTER, "m_sizes");
    BUILD("topk_ids NULL", T0, K0, E0, NULL, ms, g, sc, MOE_ERR_NULL_POINTER, "topk_ids");
    BUILD("gather_indices NULL", T0, K0, E0, ids, ms, NULL, sc, MOE_ERR_NULL_POINTER, "gather_indices");
    BUILD("num_tokens = -1", -1, K0, E0, ids, ms, g, sc, MOE_ERR_INVALID_SHAPE, "num_tokens");
    BUILD("topk = 0 with T > 0", T0, 0, E0, ids, ms, g, sc, MOE_ERR_INVALID_SHAPE, "topk");
    BUILD("num_experts = 0", T0, K0, 0, ids, ms, g, sc, MOE_ERR_INVALID_SHAPE, "num_experts");
    BUILD("T*k past 64 bits", (int64_t)1 << 40, (int64_t)1 << 30, E0, ids, ms, g, sc, MOE_ERR_OVERFLOW, "num_tokens");
#undef BUILD
    /* T = 0: NULL ids and gather accepted, m_sizes zeroed */
    memset(ms, PATTERN, sizeof ms);
    moe_status st = moe_routing_from_topk(0, K0, E0, NULL, ms, NULL, NULL);
    CHECK(st == MOE_OK && ms[0] == 0 && ms[1] == 0 && ms[2] == 0 && ms[3] == 0,
          "moe_routing_from_topk(T = 0, NULL ids/gather): %d (%s)", (int)st, moe_last_error());
    /* validate: no outputs; status and message only */
    moe_routing r = {T0, K0, E0, base_m_sizes, NULL};
    st = moe_routing_validate(&r, 1);
    CHECK(st == MOE_ERR_NULL_POINTER, "moe_routing_validate(gather NULL, required) = %d", (int)st);
    check_message("gather NULL, required", "moe_routing_validate", st, "gather_indices");
    st = moe_routing_validate(NULL, 0);
    CHECK(st == MOE_ERR_NULL_POINTER, "moe_routing_validate(NULL) = %d", (int)st);
    check_message("NULL routing", "moe_routing_validate", st, "routing");
}

/* Every status has a description; unknown codes too. */
static void status_strings(void)
{
    for (int s = 0; s <= (int)MOE_ERR_MISALIGNED; s++) {
        const char *text = moe_strerror((moe_status)s);
        CHECK(text != NULL && text[0] != '\0' && strcmp(text, "unknown status code") != 0, "moe_strerror(%d) = %s", s,
              text ? text : "(null)");
        for (int t = 0; t < s; t++)
            CHECK(text == NULL || strcmp(text, moe_strerror((moe_status)t)) != 0,
                  "moe_strerror(%d) == moe_strerror(%d) = %s", s, t, text);
    }
    CHECK(moe_strerror((moe_status)99) != NULL, "moe_strerror(99) is NULL");
    CHECK(moe_strerror((moe_status)-1) != NULL, "moe_strerror(-1) is NULL");
    CHECK(moe_backend_available(MOE_BACKEND_REF), "the reference backend is not available");
    CHECK(!moe_backend_available((moe_backend)7), "backend 7 claims to be available");
    CHECK(moe_backend_name(MOE_BACKEND_REF) != NULL && moe_backend_name((moe_backend)7) != NULL,
          "moe_backend_name returned NULL");
}

int main(void)
{
    printf("deterministic (no seed); CUDA backend %s\n",
           moe_backend_available(MOE_BACKEND_CUDA) ? "available: its NO_BACKEND check is skipped" : "not available");
    /* baseline routing: tokens over experts 0..2, expert 3 empty */
    for (int s = 0; s < M0; s++)
        base_ids[s] = (s * 5 + 1) % 3;
    if (moe_routing_from_topk(T0, K0, E0, base_ids, base_m_sizes, base_gather, NULL) != MOE_OK) {
        fprintf(stderr, "baseline routing failed: %s\n", moe_last_error());
        return 1;
    }
    /* the baseline itself is valid for every op */
    for (int op = 0; op < OP_COUNT; op++) {
        call_args a = baseline_for((enum op)op);
        expect_ok("baseline", (enum op)op, a);
    }
    routing_defects();
    missing_gather();
    null_tensors();
    misaligned();
    bwd_options();
    overlaps();
    routing_overlaps();
    valid_edge_calls();
    routing_builders();
    status_strings();
    printf("%ld checks, %ld failures\n", checks, failures);
    return failures ? 1 : 0;
}
