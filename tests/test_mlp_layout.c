/* Layout builders and argument validation of the blockwise MoE MLP:
 *   - the dropless and dropping builders (both padding conventions, several block sizes) produce the
 *     documented layout, affinity matrix and dropped count, and the validator accepts them;
 *   - every bad layout, option, option combination, pointer and shape returns its status code with a
 *     message naming the argument, and leaves every output byte untouched (fwd, bwd, builders). */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, MAP_NORESERVE */
#include "mlp_testlib.h"
#include "alloc.h"
#include "check.h"

#include <math.h>
#include <string.h>
#include <sys/mman.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
/* Under AddressSanitizer an allocation past its maximum aborts the process instead of returning NULL, as
 * malloc does; test_scratch_out_of_memory wants the NULL (CI runs this test under ASan). */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "allocator_may_return_null=1";
}
#endif

/* ---------------------------------------------------------------------------------------------------
 * builders
 * ------------------------------------------------------------------------------------------------- */
static void test_builders(void)
{
    oracle_rng rng = {4242};
    for (int trial = 0; trial < 200; trial++) {
        const int64_t T = (int64_t)oracle_rng_below(&rng, 12), E = 1 + (int64_t)oracle_rng_below(&rng, 6);
        const int64_t k = 1 + (int64_t)oracle_rng_below(&rng, (uint64_t)E);
        moe_mlp_options o = {0};
        o.block_size = 1 + (int64_t)oracle_rng_below(&rng, 5);
        o.padding = (moe_mlp_padding)oracle_rng_below(&rng, 2);
        o.dtype = (moe_dtype)oracle_rng_below(&rng, 3);
        const moe_mlp_layout_kind kind = (moe_mlp_layout_kind)oracle_rng_below(&rng, 2);
        const int64_t B = o.block_size, pad = o.padding == MOE_MLP_PAD_ROW ? T : -1;
        const size_t es = moe_dtype_size(o.dtype);
        /* skewed routing: expert e chosen with weight ~ (e + 1)^2, distinct per token */
        int64_t *ids = xmalloc((size_t)(T * k + 1) * 8), *m = xmalloc((size_t)E * 8);
        for (int64_t t = 0; t < T; t++)
            for (int64_t j = 0; j < k; j++) {
                int64_t e;
                int dup;
                do {
                    e = (int64_t)oracle_rng_below(&rng, (uint64_t)E);
                    if (oracle_rng_below(&rng, 2))
                        e = E - 1 - (int64_t)oracle_rng_below(&rng, (uint64_t)(E < 2 ? 1 : 2));
                    dup = 0;
                    for (int64_t q = 0; q < j; q++)
                        dup |= ids[t * k + q] == e;
                } while (dup);
                ids[t * k + j] = e;
            }
        void *w = xmalloc((size_t)(T * k + 1) * es), *aff = xmalloc((size_t)(T * E + 1) * es);
        oracle_fill(&rng, o.dtype, w, T * k, 0);
        int64_t N = -1;
        CHECK(moe_mlp_layout_num_blocks(kind, T, k, E, ids, &o, &N) == MOE_OK, "num_blocks: %s", moe_last_error());
        int64_t want_N = 0, want_dropped = 0;
        for (int64_t e = 0; e < E; e++)
            m[e] = 0;
        for (int64_t s = 0; s < T * k; s++)
            m[ids[s]]++;
        for (int64_t e = 0; e < E; e++) {
            want_N += kind == MOE_MLP_DROPPING ? 1 : (m[e] + B - 1) / B;
            want_dropped += kind == MOE_MLP_DROPPING && m[e] > B ? m[e] - B : 0;
        }
        CHECK(N == want_N, "N = %lld, want %lld", (long long)N, (long long)want_N);
        int64_t *b2e = xmalloc((size_t)(N + 1) * 8), *pos = xmalloc((size_t)(N * B + 1) * 8), dropped = -1;
        CHECK(moe_mlp_layout_build(kind, T, k, E, ids, w, N, b2e, pos, aff, &dropped, &o) == MOE_OK, "build: %s",
              moe_last_error());
        CHECK(dropped == want_dropped, "dropped %lld, want %lld", (long long)dropped, (long long)want_dropped);
        moe_mlp_layout lay = {T, E, N, b2e, pos};
        CHECK(moe_mlp_layout_validate(&lay, &o) == MOE_OK, "validate a built layout: %s", moe_last_error());
        /* blocks ordered by expert; each expert's tokens ascending then padding; kept pairs = the
         * first tokens (ascending) up to capacity */
        int64_t n = 0;
        for (int64_t e = 0; e < E; e++) {
            const int64_t blocks = kind == MOE_MLP_DROPPING ? 1 : (m[e] + B - 1) / B;
            int64_t r = 0;
            for (int64_t t = 0; t < T; t++) {
                int chosen = -1;
                for (int64_t j = 0; j < k; j++)
                    if (ids[t * k + j] == e)
                        chosen = (int)j;
                const int kept = chosen >= 0 && r < blocks * B;
                if (chosen >= 0 && kept) {
                    CHECK(pos[n * B + r] == t, "expert %lld slot %lld: %lld, want token %lld", (long long)e,
                          (long long)r, (long long)pos[n * B + r], (long long)t);
                    r++;
                }
                const double a = mt_load(o.dtype, aff, t * E + e);
                const double want = kept ? mt_load(o.dtype, w, t * k + chosen) : 0.0;
                CHECK(a == want && !signbit(a) == !signbit(want), "A[%lld][%lld] = %g, want %g", (long long)t,
                      (long long)e, a, want);
            }
            for (; r < blocks * B; r++)
                CHECK(pos[n * B + r] == pad, "expert %lld slot %lld: %lld, want padding %lld", (long long)e,
                      (long long)r, (long long)pos[n * B + r], (long long)pad);
            for (int64_t q = 0; q < blocks; q++)
                CHECK(b2e[n + q] == e, "block %lld -> %lld, want %lld", (long long)(n + q), (long long)b2e[n + q],
                      (long long)e);
            n += blocks;
        }
        free(ids), free(m), free(w), free(aff), free(b2e), free(pos);
    }
}

/* ---------------------------------------------------------------------------------------------------
 * validation: a valid baseline call and one deviation per check
 * ------------------------------------------------------------------------------------------------- */
enum { T0 = 4, E0 = 3, K0 = 2, H0 = 3, I0 = 2, B0 = 2 };

typedef struct call {
    moe_backend backend;
    moe_mlp_layout layout;
    int64_t H, I;
    const void *hidden, *aff, *w_gu, *w_d, *b_gu, *b_d;
    void *out, *ckpt_gu, *ckpt_d;
    const void *ckpt_gu_in, *ckpt_d_in, *G;
    void *dx, *da, *dwgu, *dwd, *dbgu, *dbd;
    moe_mlp_options opt;
} call;

static int64_t b2e0[16], ids0[64];
static float bufs[32][512]; /* inputs and outputs, f32 (enough for every tensor of the baseline) */
enum { N_OUT_FIRST = 10 };  /* bufs[10..] are outputs */

static call baseline(void)
{
    /* the dropless layout of a fixed routing, skip padding */
    static const int64_t topk[T0 * K0] = {0, 1, 1, 2, 0, 2, 1, 0};
    moe_mlp_options o = {0};
    o.block_size = B0;
    int64_t N = 0;
    REQUIRE(moe_mlp_layout_num_blocks(MOE_MLP_DROPLESS, T0, K0, E0, topk, &o, &N) == MOE_OK && N <= 16, "N");
    REQUIRE(moe_mlp_layout_build(MOE_MLP_DROPLESS, T0, K0, E0, topk, NULL, N, b2e0, ids0, NULL, NULL, &o) == MOE_OK,
            "build");
    oracle_rng rng = {99};
    for (int i = 0; i < 10; i++)
        oracle_fill(&rng, MOE_F32, bufs[i], 512, 0);
    call c = {0};
    c.backend = MOE_BACKEND_REF;
    c.layout = (moe_mlp_layout){T0, E0, N, b2e0, ids0};
    c.H = H0, c.I = I0;
    c.hidden = bufs[0], c.aff = bufs[1], c.w_gu = bufs[2], c.w_d = bufs[3], c.b_gu = NULL, c.b_d = NULL;
    c.ckpt_gu_in = bufs[6], c.ckpt_d_in = bufs[7], c.G = bufs[8];
    c.out = bufs[10], c.ckpt_gu = bufs[11], c.ckpt_d = bufs[12];
    c.dx = bufs[13], c.da = bufs[14], c.dwgu = bufs[15], c.dwd = bufs[16], c.dbgu = NULL, c.dbd = NULL;
    c.opt = o;
    return c;
}

static call with_bias(call c)
{
    c.opt.bias = 1;
    c.b_gu = bufs[4], c.b_d = bufs[5], c.dbgu = bufs[17], c.dbd = bufs[18];
    return c;
}

static void poison_outputs(void)
{
    for (int i = N_OUT_FIRST; i < 32; i++)
        memset(bufs[i], 0x5A, sizeof bufs[i]);
}

static int outputs_untouched(void)
{
    for (int i = N_OUT_FIRST; i < 32; i++)
        for (size_t b = 0; b < sizeof bufs[i]; b++)
            if (((const unsigned char *)bufs[i])[b] != 0x5A)
                return 0;
    return 1;
}

static moe_status run_fwd(const call *c)
{
    return moe_mlp_fwd(c->backend, &c->layout, c->H, c->I, c->hidden, c->aff, c->w_gu, c->w_d, c->b_gu, c->b_d,
                       c->out, c->ckpt_gu, c->ckpt_d, &c->opt);
}

static moe_status run_bwd(const call *c)
{
    return moe_mlp_bwd(c->backend, &c->layout, c->H, c->I, c->hidden, c->aff, c->w_gu, c->w_d, c->b_d,
                       c->ckpt_gu_in, c->ckpt_d_in, c->G, c->dx, c->da, c->dwgu, c->dwd, c->dbgu, c->dbd, &c->opt);
}

/* op: 1 fwd, 2 bwd, 3 both */
static void expect_error(const char *label, const call *c, int op, moe_status want, const char *needle)
{
    for (int which = 1; which <= 2; which++) {
        if (!(op & which))
            continue;
        poison_outputs();
        const moe_status got = which == 1 ? run_fwd(c) : run_bwd(c);
        const char *msg = moe_last_error();
        CHECK(got == want, "%s (%s): status %d (%s), want %d (%s); message \"%s\"", label, which == 1 ? "fwd" : "bwd",
              (int)got, moe_strerror(got), (int)want, moe_strerror(want), msg);
        CHECK(strstr(msg, needle) != NULL && strstr(msg, which == 1 ? "moe_mlp_fwd" : "moe_mlp_bwd") != NULL,
              "%s (%s): message \"%s\" lacks \"%s\"", label, which == 1 ? "fwd" : "bwd", msg, needle);
        CHECK(outputs_untouched(), "%s (%s): an output was written", label, which == 1 ? "fwd" : "bwd");
    }
}

static void test_validation(void)
{
    call c = baseline();
    poison_outputs();
    CHECK(run_fwd(&c) == MOE_OK && moe_last_error()[0] == '\0', "baseline fwd: %s", moe_last_error());
    CHECK(run_bwd(&c) == MOE_OK, "baseline bwd: %s", moe_last_error());
    call cb = with_bias(baseline());
    CHECK(run_fwd(&cb) == MOE_OK && run_bwd(&cb) == MOE_OK, "baseline with bias: %s", moe_last_error());

    const int64_t N = c.layout.num_blocks;
    call x;
    /* backends */
    if (!moe_backend_available(MOE_BACKEND_CUDA)) { /* (where it is, proptest/test_gpu_mlp tests it) */
        x = baseline(), x.backend = MOE_BACKEND_CUDA;
        expect_error("CUDA backend", &x, 3, MOE_ERR_NO_BACKEND, "backend cuda");
    }
    x = baseline(), x.backend = (moe_backend)7;
    expect_error("unknown backend", &x, 3, MOE_ERR_NO_BACKEND, "backend 7");
    /* options */
    x = baseline(), x.opt.dtype = (moe_dtype)9;
    expect_error("dtype", &x, 3, MOE_ERR_INVALID_DTYPE, "options.dtype = 9");
    x = baseline(), x.opt.dtype = MOE_E4M3;
    expect_error("dtype e4m3", &x, 3, MOE_ERR_INVALID_DTYPE, "options.dtype = e4m3: the MLP takes no FP8");
    x = baseline(), x.opt.activation = (moe_mlp_activation)4;
    expect_error("activation", &x, 3, MOE_ERR_INVALID_OPTION, "options.activation = 4");
    x = baseline(), x.opt.affinity = (moe_mlp_affinity)2;
    expect_error("affinity", &x, 3, MOE_ERR_INVALID_OPTION, "options.affinity = 2");
    x = baseline(), x.opt.padding = (moe_mlp_padding)2;
    expect_error("padding", &x, 3, MOE_ERR_INVALID_OPTION, "options.padding = 2");
    x = baseline(), x.opt.block_size = -2;
    expect_error("block size", &x, 3, MOE_ERR_INVALID_OPTION, "options.block_size = -2");
    x = baseline(), x.opt.has_linear_clamp_upper_limit = 1, x.opt.linear_clamp_upper_limit = NAN;
    expect_error("NaN clamp", &x, 3, MOE_ERR_INVALID_OPTION, "linear_clamp_upper_limit");
    x = baseline(), x.opt.has_non_linear_clamp_lower_limit = 1, x.opt.non_linear_clamp_lower_limit = -INFINITY;
    expect_error("infinite clamp", &x, 3, MOE_ERR_INVALID_OPTION, "non_linear_clamp_lower_limit");
    x = baseline(), x.opt.has_non_linear_clamp_lower_limit = 1, x.opt.has_non_linear_clamp_upper_limit = 1;
    x.opt.non_linear_clamp_lower_limit = 1.0f, x.opt.non_linear_clamp_upper_limit = 0.5f;
    expect_error("clamp lower > upper", &x, 3, MOE_ERR_INVALID_OPTION, "expected lower <= upper");
    x = baseline(), x.opt.accumulate = 1;
    expect_error("fwd accumulate", &x, 1, MOE_ERR_INVALID_OPTION, "options.accumulate");
    x = baseline(), x.opt.grad_fp32 = 1;
    expect_error("fwd grad_fp32", &x, 1, MOE_ERR_INVALID_OPTION, "options.grad_fp32");
    x = baseline(), x.opt.tensor_update_overwrite = 1; /* k = 2: tokens sit in two blocks */
    expect_error("overwrite with top-2", &x, 3, MOE_ERR_INVALID_OPTION, "tensor_update_overwrite");
    /* bias pointers */
    x = baseline(), x.b_gu = bufs[4];
    expect_error("b_gu without bias", &x, 1, MOE_ERR_INVALID_OPTION, "b_gu");
    x = with_bias(baseline()), x.b_d = NULL;
    expect_error("b_d missing", &x, 1, MOE_ERR_NULL_POINTER, "b_d");
    x = baseline(), x.dbgu = bufs[17];
    expect_error("d_b_gu without bias", &x, 2, MOE_ERR_INVALID_OPTION, "d_b_gu");
    x = with_bias(baseline()), x.dbd = NULL;
    expect_error("d_b_d missing", &x, 2, MOE_ERR_NULL_POINTER, "d_b_d");
    x = with_bias(baseline()), x.opt.affinity = MOE_AFFINITY_ON_I, x.ckpt_d_in = NULL, x.b_d = NULL;
    expect_error("ON_I recompute without b_d", &x, 2, MOE_ERR_NULL_POINTER, "b_d");
    x = baseline(), x.ckpt_d_in = NULL;
    expect_error("ON_H without down checkpoint", &x, 2, MOE_ERR_NULL_POINTER, "down_ckpt");
    x = baseline(), x.ckpt_gu_in = NULL;
    expect_error("no gate/up checkpoint", &x, 2, MOE_ERR_NULL_POINTER, "gate_up_ckpt_T");
    /* tensors */
    x = baseline(), x.hidden = NULL;
    expect_error("hidden NULL", &x, 3, MOE_ERR_NULL_POINTER, "hidden");
    x = baseline(), x.aff = NULL;
    expect_error("affinities NULL", &x, 3, MOE_ERR_NULL_POINTER, "affinities");
    x = baseline(), x.out = NULL;
    expect_error("out NULL", &x, 1, MOE_ERR_NULL_POINTER, "out");
    x = baseline(), x.dwgu = NULL;
    expect_error("d_w_gu NULL", &x, 2, MOE_ERR_NULL_POINTER, "d_w_gu");
    x = baseline(), x.G = NULL;
    expect_error("out_grad NULL", &x, 2, MOE_ERR_NULL_POINTER, "out_grad");
    x = baseline(), x.out = (void *)bufs[0];
    expect_error("out overlaps hidden", &x, 1, MOE_ERR_INVALID_OPTION, "overlaps");
    x = baseline(), x.dwd = (char *)x.dx + 4;
    expect_error("d_w_d overlaps d_hidden", &x, 2, MOE_ERR_INVALID_OPTION, "overlaps");
    /* an output on top of the layout arrays (which a kernel reads throughout): refused, the layout unchanged */
    {
        int64_t b2e_copy[16], ids_copy[64];
        memcpy(b2e_copy, b2e0, sizeof b2e0), memcpy(ids_copy, ids0, sizeof ids0);
        x = baseline(), x.out = (char *)ids0 + 8;
        expect_error("out overlaps layout.token_position_to_id", &x, 1, MOE_ERR_INVALID_OPTION,
                     "overlaps input layout.token_position_to_id");
        x = baseline(), x.dx = b2e0;
        expect_error("d_hidden overlaps layout.block_to_expert", &x, 2, MOE_ERR_INVALID_OPTION,
                     "overlaps input layout.block_to_expert");
        x = baseline(), x.ckpt_gu = ids0 + 2 * x.layout.num_blocks - 1;
        expect_error("gate_up_ckpt_T overlaps the last layout entry", &x, 1, MOE_ERR_INVALID_OPTION,
                     "overlaps input layout.token_position_to_id");
        CHECK(memcmp(b2e_copy, b2e0, sizeof b2e0) == 0 && memcmp(ids_copy, ids0, sizeof ids0) == 0,
              "a refused call changed the layout");
    }
    /* tensors and layout arrays off their element alignment (a CUDA kernel would fault on them) */
    x = baseline(), x.hidden = (const char *)bufs[0] + 2;
    expect_error("hidden misaligned", &x, 3, MOE_ERR_MISALIGNED, "hidden at");
    x = baseline(), x.dwgu = (char *)bufs[15] + 1;
    expect_error("d_w_gu misaligned", &x, 2, MOE_ERR_MISALIGNED, "d_w_gu at");
    x = baseline(), x.ckpt_gu = (char *)bufs[11] + 2;
    expect_error("gate_up_ckpt_T misaligned", &x, 1, MOE_ERR_MISALIGNED, "4-byte f32 elements");
    x = baseline(), x.layout.block_to_expert = (const int64_t *)(const void *)((const char *)b2e0 + 4);
    expect_error("layout.block_to_expert misaligned", &x, 3, MOE_ERR_MISALIGNED, "layout.block_to_expert at");
    {
        const moe_status st = moe_mlp_layout_validate(&x.layout, &x.opt);
        CHECK(st == MOE_ERR_MISALIGNED && strstr(moe_last_error(), "moe_mlp_layout_validate") != NULL,
              "moe_mlp_layout_validate, block_to_expert misaligned: status %d (%s)", (int)st, moe_last_error());
    }
    x = baseline(), x.H = -1;
    expect_error("negative H", &x, 3, MOE_ERR_INVALID_SHAPE, "hidden_size = -1");
    x = baseline(), x.I = INT64_MAX / 4;
    expect_error("huge I", &x, 3, MOE_ERR_OVERFLOW, "2 * intermediate_size = 2 * 2305843009213693951 exceeds");
    x = baseline(), x.H = (int64_t)1 << 31, x.I = (int64_t)1 << 31;
    expect_error("E*H*2I past 64 bits", &x, 3, MOE_ERR_OVERFLOW, "E*H*2I = ");
    /* layouts */
    x = baseline();
    {
        poison_outputs();
        moe_status s1 = moe_mlp_fwd(MOE_BACKEND_REF, NULL, H0, I0, x.hidden, x.aff, x.w_gu, x.w_d, NULL, NULL,
                                    x.out, x.ckpt_gu, x.ckpt_d, &x.opt);
        CHECK(s1 == MOE_ERR_NULL_POINTER && strstr(moe_last_error(), "layout") && outputs_untouched(),
              "layout NULL: %d %s", (int)s1, moe_last_error());
    }
    x = baseline(), x.layout.num_tokens = -1;
    expect_error("negative T", &x, 3, MOE_ERR_INVALID_SHAPE, "layout.num_tokens = -1");
    x = baseline(), x.layout.num_experts = 0;
    expect_error("E = 0", &x, 3, MOE_ERR_INVALID_SHAPE, "layout.num_experts = 0");
    x = baseline(), x.layout.num_blocks = -3;
    expect_error("negative N", &x, 3, MOE_ERR_INVALID_SHAPE, "layout.num_blocks = -3");
    x = baseline(), x.layout.block_to_expert = NULL;
    expect_error("block_to_expert NULL", &x, 3, MOE_ERR_NULL_POINTER, "layout.block_to_expert");
    x = baseline(), x.layout.token_position_to_id = NULL;
    expect_error("token_position_to_id NULL", &x, 3, MOE_ERR_NULL_POINTER, "layout.token_position_to_id");

    int64_t bad_b2e[16], bad_ids[64];
    memcpy(bad_b2e, b2e0, sizeof bad_b2e);
    bad_b2e[1] = E0;
    x = baseline(), x.layout.block_to_expert = bad_b2e;
    expect_error("block_to_expert = E", &x, 3, MOE_ERR_INVALID_INDEX, "layout.block_to_expert[1] = 3");
    bad_b2e[1] = -1;
    expect_error("block_to_expert = -1", &x, 3, MOE_ERR_INVALID_INDEX, "layout.block_to_expert[1] = -1");

    /* token ids: find a padding position and a real one */
    int64_t pad_pos = -1, tok_pos = -1;
    for (int64_t p = 0; p < N * B0; p++) {
        if (ids0[p] == -1 && pad_pos < 0)
            pad_pos = p;
        if (ids0[p] >= 0 && tok_pos < 0)
            tok_pos = p;
    }
    REQUIRE(pad_pos >= 0 && tok_pos >= 0, "baseline layout has padding and tokens");
    static const int64_t bad_values[] = {T0, T0 + 1, -2, INT64_MIN, INT64_MAX};
    for (size_t q = 0; q < sizeof bad_values / sizeof bad_values[0]; q++) {
        memcpy(bad_ids, ids0, sizeof bad_ids);
        bad_ids[pad_pos] = bad_values[q];
        x = baseline(), x.layout.token_position_to_id = bad_ids;
        char needle[64];
        snprintf(needle, sizeof needle, "layout.token_position_to_id[%lld]", (long long)pad_pos);
        expect_error("token id out of range (skip padding)", &x, 3, MOE_ERR_INVALID_INDEX, needle);
    }
    /* pad-row convention: -1 is invalid, T is the mark */
    {
        moe_mlp_options o = x.opt;
        o.padding = MOE_MLP_PAD_ROW;
        CHECK(moe_mlp_layout_validate(&c.layout, &o) == MOE_ERR_INVALID_INDEX &&
                  strstr(moe_last_error(), "padding mark 4"),
              "-1 under the pad-row convention: %s", moe_last_error());
        memcpy(bad_ids, ids0, sizeof bad_ids);
        for (int64_t p = 0; p < N * B0; p++)
            if (bad_ids[p] == -1)
                bad_ids[p] = T0;
        moe_mlp_layout l = c.layout;
        l.token_position_to_id = bad_ids;
        CHECK(moe_mlp_layout_validate(&l, &o) == MOE_OK, "pad row layout: %s", moe_last_error());
        CHECK(moe_mlp_layout_validate(&l, &c.opt) == MOE_ERR_INVALID_INDEX, "T under skip padding: %s",
              moe_last_error());
    }
    /* the same (token, expert) pair twice: put the token of tok_pos into a padding slot of the same block
     * or, failing that, of another block of the same expert */
    {
        memcpy(bad_ids, ids0, sizeof bad_ids);
        int64_t target = -1;
        for (int64_t p = 0; p < N * B0 && target < 0; p++)
            if (ids0[p] == -1 && b2e0[p / B0] == b2e0[tok_pos / B0])
                target = p;
        if (target < 0) { /* make one: the block of tok_pos gets the token twice */
            target = tok_pos + 1;
            REQUIRE(target / B0 == tok_pos / B0, "layout shape");
        }
        bad_ids[target] = ids0[tok_pos];
        x = baseline(), x.layout.token_position_to_id = bad_ids;
        expect_error("duplicate pair", &x, 3, MOE_ERR_INVALID_ROUTING, "at most once");
    }
    /* a token under two different experts is fine (k = 2), and validate() agrees with fwd */
    CHECK(moe_mlp_layout_validate(&c.layout, &c.opt) == MOE_OK, "baseline layout: %s", moe_last_error());
    CHECK(moe_mlp_layout_validate(NULL, NULL) == MOE_ERR_NULL_POINTER, "validate(NULL)");
}

/* The layout check's scratch (2 E + 2 T + N + 1 int64) that no allocator can give: E = 2^59 experts (the shape
 * checks accept up to SIZE_MAX / 16), no token, no block; the check reads no entry before it allocates. */
static void test_scratch_out_of_memory(void)
{
    moe_mlp_layout huge = {0};
    huge.num_experts = (int64_t)1 << 59;
    const moe_status st = moe_mlp_layout_validate(&huge, NULL);
    CHECK(st == MOE_ERR_OUT_OF_MEMORY &&
              strstr(moe_last_error(), "moe_mlp_layout_validate: no memory for the scratch of the layout check") !=
                  NULL &&
              strstr(moe_last_error(), "E = 576460752303423488 experts, T = 0 tokens, N = 0 blocks") != NULL,
          "validate with E = 2^59: status %d (%s)", (int)st, moe_last_error());
}

static void test_builder_errors(void)
{
    const int64_t ids[6] = {0, 1, 2, 0, 1, 2};
    moe_mlp_options o = {0};
    o.block_size = 2;
    int64_t N = -7, b2e[8], pos[16], dropped = -7;
    float w[6] = {1, 2, 3, 4, 5, 6}, aff[12];
    const int64_t bad_range[6] = {0, 1, 3, 0, 1, 2}, bad_dup[6] = {0, 1, 0, 2, 1, 2};
    struct {
        const char *label;
        moe_status want;
        const char *needle;
        int64_t T, k, E;
        const int64_t *ids;
        int kind;
    } cases[] = {
        {"expert out of range", MOE_ERR_INVALID_INDEX, "topk_ids[0][2] = 3", 2, 3, 3, bad_range, 0},
        {"repeated expert", MOE_ERR_INVALID_ROUTING, "topk_ids[0][2] = 0", 2, 3, 3, bad_dup, 0},
        {"k > E", MOE_ERR_INVALID_SHAPE, "topk = 3", 2, 3, 2, ids, 0},
        {"negative T", MOE_ERR_INVALID_SHAPE, "num_tokens = -1", -1, 3, 3, ids, 0},
        {"E = 0", MOE_ERR_INVALID_SHAPE, "num_experts = 0", 2, 3, 0, ids, 0},
        {"ids NULL", MOE_ERR_NULL_POINTER, "topk_ids", 2, 3, 3, NULL, 0},
        {"bad kind", MOE_ERR_INVALID_OPTION, "kind = 5", 2, 3, 3, ids, 5},
    };
    for (size_t q = 0; q < sizeof cases / sizeof cases[0]; q++) {
        N = -7;
        moe_status s = moe_mlp_layout_num_blocks((moe_mlp_layout_kind)cases[q].kind, cases[q].T, cases[q].k,
                                                 cases[q].E, cases[q].ids, &o, &N);
        CHECK(s == cases[q].want && N == -7 && strstr(moe_last_error(), cases[q].needle) &&
                  strstr(moe_last_error(), "moe_mlp_layout_num_blocks"),
              "num_blocks %s: %d \"%s\"", cases[q].label, (int)s, moe_last_error());
        memset(b2e, 0x5A, sizeof b2e), memset(pos, 0x5A, sizeof pos), memset(aff, 0x5A, sizeof aff);
        dropped = -7;
        s = moe_mlp_layout_build((moe_mlp_layout_kind)cases[q].kind, cases[q].T, cases[q].k, cases[q].E,
                                 cases[q].ids, w, 3, b2e, pos, aff, &dropped, &o);
        int untouched = dropped == -7;
        for (size_t b = 0; b < sizeof b2e; b++)
            untouched &= ((unsigned char *)b2e)[b] == 0x5A;
        for (size_t b = 0; b < sizeof pos; b++)
            untouched &= ((unsigned char *)pos)[b] == 0x5A;
        for (size_t b = 0; b < sizeof aff; b++)
            untouched &= ((unsigned char *)aff)[b] == 0x5A;
        CHECK(s == cases[q].want && strstr(moe_last_error(), cases[q].needle) && untouched,
              "build %s: %d \"%s\" untouched %d", cases[q].label, (int)s, moe_last_error(), untouched);
    }
    /* wrong num_blocks, weights without affinities, NULL num_blocks */
    CHECK(moe_mlp_layout_num_blocks(MOE_MLP_DROPLESS, 2, 3, 3, ids, &o, &N) == MOE_OK && N == 3, "N = %lld",
          (long long)N);
    memset(pos, 0x5A, sizeof pos);
    CHECK(moe_mlp_layout_build(MOE_MLP_DROPLESS, 2, 3, 3, ids, w, 4, b2e, pos, aff, NULL, &o) ==
                  MOE_ERR_INVALID_SHAPE &&
              strstr(moe_last_error(), "num_blocks = 4, expected 3") && ((unsigned char *)pos)[0] == 0x5A,
          "wrong num_blocks: %s", moe_last_error());
    CHECK(moe_mlp_layout_build(MOE_MLP_DROPLESS, 2, 3, 3, ids, NULL, 3, b2e, pos, aff, NULL, &o) ==
                  MOE_ERR_NULL_POINTER && strstr(moe_last_error(), "topk_weights"),
          "affinities without weights: %s", moe_last_error());
    CHECK(moe_mlp_layout_num_blocks(MOE_MLP_DROPLESS, 2, 3, 3, ids, &o, NULL) == MOE_ERR_NULL_POINTER,
          "NULL num_blocks");
    CHECK(moe_mlp_layout_build(MOE_MLP_DROPLESS, 2, 3, 3, ids, w, 3, NULL, pos, aff, NULL, &o) ==
              MOE_ERR_NULL_POINTER && strstr(moe_last_error(), "block_to_expert"),
          "NULL block_to_expert: %s", moe_last_error());
    /* misaligned int64 arrays, refused before they are read or written (num_blocks
     * read a misaligned topk_ids and wrote a misaligned num_blocks; build read the ids before refusing) */
    int64_t raw[16];
    memcpy((char *)raw + 1, ids, sizeof ids);
    const int64_t *ids_off = (const int64_t *)(const void *)((const char *)raw + 1);
    int64_t *n_off = (int64_t *)(void *)((char *)(raw + 10) + 4);
    N = -7;
    CHECK(moe_mlp_layout_num_blocks(MOE_MLP_DROPLESS, 2, 3, 3, ids_off, &o, &N) == MOE_ERR_MISALIGNED &&
              N == -7 && strstr(moe_last_error(), "topk_ids at"),
          "num_blocks, topk_ids misaligned: %s", moe_last_error());
    memset(pos, 0x5A, sizeof pos);
    CHECK(moe_mlp_layout_build(MOE_MLP_DROPLESS, 2, 3, 3, ids_off, w, 3, b2e, pos, aff, NULL, &o) ==
                  MOE_ERR_MISALIGNED && strstr(moe_last_error(), "topk_ids at") && ((unsigned char *)pos)[0] == 0x5A,
          "build, topk_ids misaligned: %s", moe_last_error());
    memset(raw, 0x5A, sizeof raw);
    CHECK(moe_mlp_layout_num_blocks(MOE_MLP_DROPLESS, 2, 3, 3, ids, &o, n_off) == MOE_ERR_MISALIGNED &&
              strstr(moe_last_error(), "num_blocks at") && ((unsigned char *)raw)[84] == 0x5A,
          "num_blocks, num_blocks misaligned: %s", moe_last_error());
    CHECK(moe_mlp_layout_max_blocks(MOE_MLP_DROPLESS, 2, 3, 3, &o, n_off) == MOE_ERR_MISALIGNED &&
              strstr(moe_last_error(), "moe_mlp_layout_max_blocks: num_blocks at") &&
              ((unsigned char *)raw)[84] == 0x5A,
          "max_blocks, num_blocks misaligned: %s", moe_last_error());
    /* num_blocks * B past 64 bits, and past what the arrays can address (SIZE_MAX / 16 positions for build_on):
     * refused before any array is read, each with its own message */
    CHECK(moe_mlp_layout_build_on(MOE_BACKEND_REF, MOE_MLP_DROPLESS, 2, 3, 3, ids, w, (int64_t)1 << 62, b2e, pos,
                                  aff, NULL, NULL, &o) == MOE_ERR_OVERFLOW &&
              strstr(moe_last_error(), "num_blocks * B = 4611686018427387904 * 2 overflows 64 bits"),
          "build_on, num_blocks * B past 64 bits: %s", moe_last_error());
    CHECK(moe_mlp_layout_build_on(MOE_BACKEND_REF, MOE_MLP_DROPLESS, 2, 3, 3, ids, w, (int64_t)1 << 59, b2e, pos,
                                  aff, NULL, NULL, &o) == MOE_ERR_OVERFLOW &&
              strstr(moe_last_error(), "num_blocks * B = 1152921504606846976 positions, more than the ") &&
              strstr(moe_last_error(), " whose arrays this builder can address"),
          "build_on, num_blocks * B past SIZE_MAX / 16: %s", moe_last_error());
    /* the empty problem */
    CHECK(moe_mlp_layout_num_blocks(MOE_MLP_DROPLESS, 0, 0, 3, NULL, &o, &N) == MOE_OK && N == 0, "T = 0");
    CHECK(moe_mlp_layout_build(MOE_MLP_DROPPING, 0, 0, 3, NULL, NULL, 3, b2e, pos, NULL, &dropped, &o) == MOE_OK &&
              dropped == 0 && b2e[2] == 2 && pos[5] == -1,
          "T = 0 dropping: %s", moe_last_error());
}

/* A forward whose per-thread float32 workspace is at the size_t bound: T = 349501
 * tokens on one expert, H = 1, I = 1099586081712, 4 threads: 2^60 - 17 floats per thread, rounded up to
 * 2^60, so 4 * 2^60 * 4 bytes wrapped to malloc(0) and the forward wrote past it.  Every tensor has its full
 * size: the weights (6.6 TB) are MAP_NORESERVE mappings the call never touches.  Now MOE_ERR_OUT_OF_MEMORY.
 * Skipped where the address space or the overcommit policy refuses the mapping. */
static void test_workspace_bound(void)
{
    const int64_t T = 349501, E = 1, H = 1, I = 1099586081712LL, B = 128, N = (T + B - 1) / B;
    const size_t w_bytes = (size_t)(E * H * 2 * I) * 2;
    void *w_gu = mmap(NULL, w_bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    void *w_d = mmap(NULL, w_bytes / 2, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    int64_t *b2e = calloc((size_t)N, 8), *ids = malloc((size_t)(N * B) * 8);
    uint16_t *hidden = calloc((size_t)T, 2), *aff = calloc((size_t)T, 2), *out = malloc((size_t)T * 2);
    if (w_gu == MAP_FAILED || w_d == MAP_FAILED || !b2e || !ids || !hidden || !aff || !out) {
        printf("workspace bound: skipped (no %.1f TB mapping or no memory)\n", (double)w_bytes * 1.5 / 1e12);
    } else {
        for (int64_t p = 0; p < N * B; p++)
            ids[p] = p < T ? p : -1;
        for (int64_t t = 0; t < T; t++)
            hidden[t] = aff[t] = 0x3F80; /* 1.0 in bf16 */
        memset(out, 0x5A, (size_t)T * 2);
        moe_mlp_options o = {0};
        o.dtype = MOE_BF16, o.block_size = B;
        const moe_mlp_layout L = {T, E, N, b2e, ids};
        CHECK(moe_mlp_layout_validate(&L, &o) == MOE_OK, "workspace bound: layout %s", moe_last_error());
#ifdef _OPENMP
        const int threads = omp_get_max_threads();
        omp_set_num_threads(4);
#endif
        const moe_status s = moe_mlp_fwd(MOE_BACKEND_REF, &L, H, I, hidden, aff, w_gu, w_d, NULL, NULL, out, NULL,
                                         NULL, &o);
#ifdef _OPENMP
        omp_set_num_threads(threads);
#endif
        CHECK(s == MOE_ERR_OUT_OF_MEMORY && strstr(moe_last_error(), "float32 workspace") &&
                  ((unsigned char *)out)[0] == 0x5A && ((unsigned char *)out)[T * 2 - 1] == 0x5A,
              "workspace bound: status %d (%s)", (int)s, moe_last_error());
    }
    if (w_gu != MAP_FAILED)
        munmap(w_gu, w_bytes);
    if (w_d != MAP_FAILED)
        munmap(w_d, w_bytes / 2);
    free(b2e), free(ids), free(hidden), free(aff), free(out);
}

/* H = 0 with bias: b_d [E][0], hidden, out and w_* are empty and may be NULL (the
 * reference passed their NULL to memcpy with 0 bytes, undefined behaviour that UBSan reports) */
static void test_empty_hidden(void)
{
    int64_t b2e[1] = {0}, ids[2] = {0, -1};
    const moe_mlp_layout L = {1, 1, 1, b2e, ids};
    moe_mlp_options o = {0};
    o.block_size = 2, o.bias = 1;
    float aff[1] = {1}, b_gu[4] = {0.5f, -1, 2, 0.25f}, ckpt[8];
    memset(ckpt, 0x5A, sizeof ckpt);
    const moe_status s = moe_mlp_fwd(MOE_BACKEND_REF, &L, 0, 2, NULL, aff, NULL, NULL, b_gu, NULL, NULL, ckpt, NULL,
                                     &o);
    /* gate / up of slot 0 are the bias alone (no hidden columns); slot 1 is padding: +0 */
    CHECK(s == MOE_OK && ckpt[0] == 0.5f && ckpt[2] == -1 && ckpt[4] == 2 && ckpt[6] == 0.25f && ckpt[1] == 0 &&
              ckpt[7] == 0,
          "H = 0 with bias: status %d (%s), ckpt %g %g %g %g", (int)s, moe_last_error(), ckpt[0], ckpt[2], ckpt[4],
          ckpt[6]);
}

int main(void)
{
    test_builders();
    test_validation();
    test_builder_errors();
    test_scratch_out_of_memory();
    test_workspace_bound();
    test_empty_hidden();
    printf("%lld failures\n", (long long)failures);
    return failures == 0 ? 0 : 1;
}
