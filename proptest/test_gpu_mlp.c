/* CUDA blockwise MoE MLP properties (skipped with exit 77 where no CUDA device is visible):
 *   1. the full option cross of tests/test_mlp_grad.c: every activation (4) x affinity (2) x bias (2) x clamp
 *      subset (16) x dtype (f32, f16, bf16) x padding (2) x accumulate (2) = 3072 cases (or the first
 *      `cases` of them), with at random: shape (some past the 64-wide tiles), block size (1 .. 128,
 *      multiples of 16 and not), layout (dropless, dropping, shuffled caller-made with an empty block),
 *      topk, tensor_update_overwrite (top-1), grad_fp32, round_intermediates (f16/bf16: the rows path; bf16
 *      without it: the rows path on split operands) and, with ON_I, whether the backward gets the down
 *      checkpoint.  Every GPU output, checkpoint and gradient is checked against the float64 analytic
 *      value within the error bound oracle/mlp_bound.c derives for any correct float32 implementation
 *      (specs/MLP.md "Error bound"; small cases also against float64 finite differences), and against the
 *      CPU reference (MOE_BACKEND_REF) of the same case within the sum of both bounds;
 *   2. the same call twice gives bitwise the same outputs, checkpoints and gradients;
 *   3. invalid device layouts (block_to_expert out of range, a token id out of range or the other
 *      padding mark, a (token, expert) pair twice, a token twice under tensor_update_overwrite) are
 *      detected on the device and reported by moe_backend_synchronize with the reference's status codes
 *      and a message naming the position, and no output byte is written; the next call is clean.
 *   4. the forward's fused gate/up epilogue (sm_90a) on shapes that reach its every store path, against the
 *      reference and bit for bit against the unfused path (fused_gate below);
 *   5. many experts (E = 128 .. 700: the device's expert lists go in windows of 128 experts) and many
 *      blocks (block size 1), against the reference (many_experts below);
 *   6. every tensor one element off its usual alignment, so that the kernels' unaligned paths run, against
 *      the reference (offset_tensors below);
 *   7. bf16 on split operands (no round_intermediates) at shapes the tensor-core kernels take, against the
 *      reference (split_operands below);
 *   8. the rows path's size thresholds, each met from both sides with MOE_MLP_FUSE_GATE unset (the library's
 *      own choice), against the reference and bit for bit against MOE_MLP_FUSE_GATE=0 (thresholds below):
 *      - R_PINGPONG_MAX_N (gpu/gemm/heuristics.cuh, rows_f32_pingpong in gpu/gemm/rows_f32_sm90.cu):
 *        reductions I, H, 2 I of 1024 and 1032;
 *      - G_FUSE_MIN_ROWS (gpu/gemm/heuristics.cuh, gate_fusion_refusal in gpu/gemm/heuristics.cu): 128 and
 *        256 positions per expert;
 *      - GATE_SPAN (gpu/mlp/gate_rows.cu, gate_act_kernel and gate_bwd_kernel): I = 256, 257 and 512.
 * Outputs are poisoned with NaN before every call (untouched elements fail the comparisons).
 * usage: test_gpu_mlp [seed] [cases] [fused cases] [first fused case] [many-experts cases] [offset cases]
 *        [split cases] [threshold cases]
 * (TEST_GPU_MLP_TRACE=1 prints each fused case before it runs, for a crash's reproducer: the same seed with
 * the case's number as the first and 1 + that number as the count runs it alone.) */
#include "config.h"
#include "mlp_testlib.h"
#include "alloc.h"
#include "check.h"
#include "gpu_check.h"

#include <cuda_runtime_api.h>
#include <string.h>

/* ---- device copies of host arrays ---- */

/* Bytes past a cudaMalloc'd (256-byte aligned) start at which up() places each tensor: 0, except in the
 * offset-tensors property (6), which places every tensor one element off (2 bytes for f16/bf16, 4 for f32),
 * so that no tensor is 16-byte aligned and no 16-bit one 4-byte aligned. */
static size_t tensor_offset;

/* A device copy of `bytes` bytes of host at `offset` bytes past its allocation's start (NULL stays NULL, so
 * "not given" is preserved). */
static void *up_at(const void *host, size_t bytes, size_t offset)
{
    if (host == NULL)
        return NULL;
    char *dev = NULL;
    CUDA_CHECK(cudaMalloc((void **)&dev, offset + (bytes ? bytes : 16)));
    if (bytes)
        CUDA_CHECK(cudaMemcpy(dev + offset, host, bytes, cudaMemcpyHostToDevice));
    return dev + offset;
}
static void *up(const void *host, size_t bytes) { return up_at(host, bytes, tensor_offset); }

/* Copies a device output (placed `offset` bytes into its allocation) back over its host array (when the call
 * succeeded) and frees it. */
static void down_at(void *host, void *dev, size_t bytes, int copy, size_t offset)
{
    if (dev == NULL)
        return;
    if (copy && bytes)
        CUDA_CHECK(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree((char *)dev - offset));
}
static void down(void *host, void *dev, size_t bytes, int copy) { down_at(host, dev, bytes, copy, tensor_offset); }

typedef struct sizes {
    size_t es, gs;         /* element sizes: dtype, gradient dtype */
    int64_t T1, NB, N, B, E, H, I;
} sizes;

static sizes sizes_of(const moe_mlp_layout *l, int64_t H, int64_t I, const moe_mlp_options *o)
{
    sizes s;
    s.es = moe_dtype_size(o->dtype);
    s.gs = o->grad_fp32 ? 4 : s.es;
    s.B = o->block_size ? o->block_size : MOE_MLP_DEFAULT_BLOCK_SIZE;
    s.N = l->num_blocks, s.NB = s.N * s.B, s.E = l->num_experts, s.H = H, s.I = I;
    s.T1 = l->num_tokens + (o->padding == MOE_MLP_PAD_ROW);
    return s;
}

/* The layout with its arrays on the device. */
static moe_mlp_layout layout_up(const moe_mlp_layout *l, const sizes *s)
{
    moe_mlp_layout d = *l;
    d.block_to_expert = up_at(l->block_to_expert, (size_t)s->N * 8, 0);
    d.token_position_to_id = up_at(l->token_position_to_id, (size_t)s->NB * 8, 0);
    return d;
}

static void layout_free(moe_mlp_layout *d)
{
    down_at(NULL, (void *)d->block_to_expert, 0, 0, 0);
    down_at(NULL, (void *)d->token_position_to_id, 0, 0, 0);
}

/* moe_mlp_fwd on the GPU with host arguments (the signature of mt_fwd_fn): uploads everything (the
 * outputs too, so that elements the kernels do not write keep their poison), runs, synchronises (device
 * errors come back here) and downloads the outputs. */
static moe_status gpu_fwd(moe_backend backend, const moe_mlp_layout *layout, int64_t H, int64_t I,
                          const void *hidden, const void *aff, const void *w_gu, const void *w_d, const void *b_gu,
                          const void *b_d, void *out, void *ckpt_gu, void *ckpt_d, const moe_mlp_options *o)
{
    const sizes s = sizes_of(layout, H, I, o);
    const int64_t T = layout->num_tokens, E = s.E;
    moe_mlp_layout dl = layout_up(layout, &s);
    const size_t b_x = (size_t)(s.T1 * H) * s.es, b_a = (size_t)(T * E) * s.es;
    const size_t b_wgu = (size_t)(E * H * 2 * I) * s.es, b_wd = (size_t)(E * I * H) * s.es;
    const size_t b_bgu = (size_t)(E * 2 * I) * s.es, b_bd = (size_t)(E * H) * s.es;
    const size_t b_cgu = (size_t)(s.N * 2 * I * s.B) * s.es, b_cd = (size_t)(s.NB * H) * s.es;
    void *dx = up(hidden, b_x), *da = up(aff, b_a), *dwgu = up(w_gu, b_wgu), *dwd = up(w_d, b_wd);
    void *dbgu = up(b_gu, b_bgu), *dbd = up(b_d, b_bd);
    void *dout = up(out, b_x), *dcgu = up(ckpt_gu, b_cgu), *dcd = up(ckpt_d, b_cd);
    moe_status st = moe_mlp_fwd(backend, &dl, H, I, dx, da, dwgu, dwd, dbgu, dbd, dout, dcgu, dcd, o);
    if (st == MOE_OK)
        st = moe_backend_synchronize(backend, o ? o->stream : NULL);
    const int ok = st == MOE_OK;
    down(out, dout, b_x, ok), down(ckpt_gu, dcgu, b_cgu, ok), down(ckpt_d, dcd, b_cd, ok);
    down(NULL, dx, 0, 0), down(NULL, da, 0, 0), down(NULL, dwgu, 0, 0), down(NULL, dwd, 0, 0);
    down(NULL, dbgu, 0, 0), down(NULL, dbd, 0, 0);
    layout_free(&dl);
    return st;
}

static moe_status gpu_bwd(moe_backend backend, const moe_mlp_layout *layout, int64_t H, int64_t I,
                          const void *hidden, const void *aff, const void *w_gu, const void *w_d, const void *b_d,
                          const void *ckpt_gu, const void *ckpt_d, const void *out_grad, void *d_hidden,
                          void *d_aff, void *d_wgu, void *d_wd, void *d_bgu, void *d_bd, const moe_mlp_options *o)
{
    const sizes s = sizes_of(layout, H, I, o);
    const int64_t T = layout->num_tokens, E = s.E;
    moe_mlp_layout dl = layout_up(layout, &s);
    const size_t b_x = (size_t)(s.T1 * H) * s.es, b_a = (size_t)(T * E) * s.es;
    const size_t b_wgu = (size_t)(E * H * 2 * I) * s.es, b_wd = (size_t)(E * I * H) * s.es;
    const size_t b_bd = (size_t)(E * H) * s.es;
    const size_t b_cgu = (size_t)(s.N * 2 * I * s.B) * s.es, b_cd = (size_t)(s.NB * H) * s.es;
    const size_t g_wgu = (size_t)(E * H * 2 * I) * s.gs, g_wd = (size_t)(E * I * H) * s.gs;
    const size_t g_bgu = (size_t)(E * 2 * I) * s.gs, g_bd = (size_t)(E * H) * s.gs;
    void *dx = up(hidden, b_x), *da = up(aff, b_a), *dwgu = up(w_gu, b_wgu), *dwd = up(w_d, b_wd);
    void *dbd = up(b_d, b_bd), *dcgu = up(ckpt_gu, b_cgu), *dcd = up(ckpt_d, b_cd), *dg = up(out_grad, b_x);
    void *ddx = up(d_hidden, b_x), *dda = up(d_aff, b_a), *ddwgu = up(d_wgu, g_wgu), *ddwd = up(d_wd, g_wd);
    void *ddbgu = up(d_bgu, g_bgu), *ddbd = up(d_bd, g_bd);
    moe_status st = moe_mlp_bwd(backend, &dl, H, I, dx, da, dwgu, dwd, dbd, dcgu, dcd, dg, ddx, dda, ddwgu, ddwd,
                                ddbgu, ddbd, o);
    if (st == MOE_OK)
        st = moe_backend_synchronize(backend, o ? o->stream : NULL);
    const int ok = st == MOE_OK;
    down(d_hidden, ddx, b_x, ok), down(d_aff, dda, b_a, ok), down(d_wgu, ddwgu, g_wgu, ok);
    down(d_wd, ddwd, g_wd, ok), down(d_bgu, ddbgu, g_bgu, ok), down(d_bd, ddbd, g_bd, ok);
    void *inputs[] = {dx, da, dwgu, dwd, dbd, dcgu, dcd, dg};
    for (size_t i = 0; i < sizeof inputs / sizeof inputs[0]; i++)
        down(NULL, inputs[i], 0, 0);
    layout_free(&dl);
    return st;
}

static void use_gpu(void)
{
    mt_mlp_fwd = gpu_fwd;
    mt_mlp_bwd = gpu_bwd;
    mt_backend = MOE_BACKEND_CUDA;
    mt_split_operands = 1;
}

static void use_ref(void)
{
    mt_mlp_fwd = moe_mlp_fwd;
    mt_mlp_bwd = moe_mlp_bwd;
    mt_backend = MOE_BACKEND_REF;
    mt_split_operands = 0;
}

/* ---- 1 and 2: the option cross ---- */

static int64_t option_cross(uint64_t base, int cases, int64_t *determinism_checks)
{
    oracle_rng rng = {base};
    int64_t bad = 0, done = 0, rows_path = 0, split_path = 0, rows_path_tc = 0;
    for (int index = 0; index < MT_OPTION_COMBOS * 12 && index < cases; index++) {
        /* every combo first, then the dtype passes */
        const int combo = index % MT_OPTION_COMBOS, pass = index / MT_OPTION_COMBOS;
        mt_case c;
        int placed = 0, wide = 0;
        for (int attempt = 0; attempt < 50 && !placed; attempt++) {
            moe_mlp_options o = {0};
            const int clamps = mt_option_combo(combo, &o);
            o.dtype = (moe_dtype)((pass + combo) % 3);
            o.padding = (moe_mlp_padding)((pass / 3) % 2);
            o.accumulate = (pass / 6) % 2;
            static const int64_t blocks[] = {1, 2, 3, 5, 8, 16, 17, 32, 64, 65, 128};
            o.block_size = blocks[oracle_rng_below(&rng, sizeof blocks / sizeof blocks[0])];
            wide = oracle_rng_below(&rng, 12) == 0; /* past the 64-wide tiles and the 16-deep K chunks */
            const int64_t E = 1 + (int64_t)oracle_rng_below(&rng, wide ? 4 : 6);
            const int64_t k = 1 + (int64_t)oracle_rng_below(&rng, (uint64_t)(E < 3 ? E : 3));
            const int64_t T = (wide ? 20 : 2) + (int64_t)oracle_rng_below(&rng, wide ? 60 : 12);
            int64_t H = wide ? 65 + (int64_t)oracle_rng_below(&rng, 80) : 1 + (int64_t)oracle_rng_below(&rng, 20);
            int64_t I = wide ? 33 + (int64_t)oracle_rng_below(&rng, 50) : 1 + (int64_t)oracle_rng_below(&rng, 12);
            o.tensor_update_overwrite = k == 1 && oracle_rng_below(&rng, 2);
            o.grad_fp32 = o.dtype != MOE_F32 && oracle_rng_below(&rng, 2);
            /* f16/bf16: half the cases with round_intermediates; those and every bf16 case take the rows
             * path (tensor-core GEMMs; bf16 without the flag on split operands), whose H and I are made
             * multiples of 8 half the time so that the tensor-core families take them */
            o.float32_intermediates = !(o.dtype != MOE_F32 && oracle_rng_below(&rng, 2));
            if ((!o.float32_intermediates || o.dtype == MOE_BF16) && oracle_rng_below(&rng, 2))
                H = (H + 7) / 8 * 8, I = (I + 7) / 8 * 8;
            const int mode = (int)oracle_rng_below(&rng, 3);
            const uint64_t seed = base * 1000003ULL + (uint64_t)index * 101 + (uint64_t)attempt;
            mt_case_init(&c, seed, T, E, k, H, I, &o, mode);
            if (wide)
                mt_case_scale_weights(&c);
            if (clamps == 0 || mt_choose_clamps(&c, clamps))
                placed = 1;
            else
                mt_case_free(&c);
        }
        REQUIRE(placed, "case %d: no clamp placement found", index);
        const int down_in_bwd = c.opt.affinity == MOE_AFFINITY_ON_H || oracle_rng_below(&rng, 2);
        /* finite differences on the small cases, one in four (the analytic values they validate are
         * checked against them exhaustively by tests/test_mlp_grad) */
        /* f16/bf16: also every rounding of the spec in its place (MT_CHECK_EXACT_ROUNDING, specs/MLP.md) */
        const int checks = MT_CHECK_BOUND | (!wide && index % 4 == 0 ? MT_CHECK_FD : 0) |
                           (c.opt.dtype != MOE_F32 ? MT_CHECK_EXACT_ROUNDING : 0);
        mt_result gpu, ref;
        use_gpu();
        int64_t b = mt_run(&c, checks, down_in_bwd, &gpu);
        use_ref();
        b += mt_run(&c, MT_CHECK_BOUND, down_in_bwd, &ref);
        b += mt_compare_results(&c, &gpu, &c, &ref, "GPU vs CPU reference");
        if (index % 6 == 0) {
            mt_result again;
            use_gpu();
            mt_run(&c, 0, down_in_bwd, &again);
            if (!mt_results_identical(&c, &gpu, &again, 1)) {
                fprintf(stderr, "case %d (seed %llu): two GPU runs differ\n", index, (unsigned long long)c.seed);
                b++;
            }
            mt_result_free(&again);
            (*determinism_checks)++;
        }
        if (b)
            fprintf(stderr, "case %d (combo %d pass %d%s): %lld mismatches\n", index, combo, pass, wide ? ", wide" : "",
                    (long long)b);
        bad += b;
        done++;
        const int rows = !c.opt.float32_intermediates || c.opt.dtype == MOE_BF16;
        rows_path += rows;
        split_path += rows && c.opt.float32_intermediates;
        rows_path_tc += rows && c.H % 8 == 0 && c.I % 8 == 0;
        mt_result_free(&gpu);
        mt_result_free(&ref);
        mt_case_free(&c);
        if (done % 500 == 0)
            fprintf(stderr, "  %lld cases ...\n", (long long)done);
    }
    printf("option cross: %lld cases, %lld mismatches (%lld on the rows path, %lld of them bf16 on split operands; "
           "%lld with H and I multiples of 8)\n", (long long)done, (long long)bad, (long long)rows_path,
           (long long)split_path, (long long)rows_path_tc);
    return bad;
}

/* Options whose activation, affinity and bias come from the case index's low bits (0-1, 2, 3), so that the
 * first 16 cases of a property reach every combination; the rest zero. */
static moe_mlp_options indexed_options(int index)
{
    moe_mlp_options o = {0};
    o.activation = (moe_mlp_activation)(index & 3);
    o.affinity = (moe_mlp_affinity)((index >> 2) & 1);
    o.bias = (index >> 3) & 1;
    return o;
}

/* mt_case_init with the weights scaled to the fan-in and the clamp limits `clamps` placed; where no placement
 * exists, the same case without clamps. */
static void init_scaled_case(mt_case *c, uint64_t seed, int64_t T, int64_t E, int64_t k, int64_t H, int64_t I,
                             const moe_mlp_options *o, int mode, int clamps)
{
    mt_case_init(c, seed, T, E, k, H, I, o, mode);
    mt_case_scale_weights(c);
    if (clamps != 0 && !mt_choose_clamps(c, clamps)) {
        mt_case_free(c);
        mt_case_init(c, seed, T, E, k, H, I, o, mode);
        mt_case_scale_weights(c);
    }
}

/* One case on the GPU (its tensors `offset` bytes into their allocations: tensor_offset) with `gpu_checks`,
 * then on the CPU reference within the bounds, and the two results compared (`what` names the comparison);
 * the mismatches of all three.  keep: NULL, or where the GPU's results go (the caller frees them). */
static int64_t gpu_against_ref(const mt_case *c, int gpu_checks, int down_in_bwd, size_t offset, const char *what,
                               mt_result *keep)
{
    mt_result gpu, ref;
    use_gpu();
    tensor_offset = offset;
    int64_t b = mt_run(c, gpu_checks, down_in_bwd, &gpu);
    tensor_offset = 0;
    use_ref();
    b += mt_run(c, MT_CHECK_BOUND, down_in_bwd, &ref);
    b += mt_compare_results(c, &gpu, c, &ref, what);
    if (keep != NULL)
        *keep = gpu;
    else
        mt_result_free(&gpu);
    mt_result_free(&ref);
    return b;
}

/* b, after printing the case (its label and index, seed, shape and layout mode) when b is not 0. */
static int64_t report_case(const char *label, int index, const mt_case *c, int mode, int64_t b)
{
    if (b)
        fprintf(stderr, "%s case %d (seed %llu, T %lld E %lld k %lld H %lld I %lld B %lld, mode %d): %lld mismatches\n",
                label, index, (unsigned long long)c->seed, (long long)c->T, (long long)c->E, (long long)c->k,
                (long long)c->H, (long long)c->I, (long long)c->B, mode, (long long)b);
    return b;
}

/* c on the GPU with MOE_MLP_FUSE_GATE set to `fuse` (NULL: unset, the library's own choice of kernels) against
 * the reference (gpu_against_ref, `what`), and again on the GPU with MOE_MLP_FUSE_GATE=0 (the unfused gate/up,
 * the 128 x 256 kernel for every fp32 rows GEMM), which must give the same bits: outputs, checkpoints and
 * gradients, both runs within the bounds (exact roundings included).  MOE_MLP_FUSE_GATE is unset afterwards.
 * The mismatches; *differ counts the cases where the two GPU runs differ. */
static int64_t against_unfused(const mt_case *c, const char *fuse, int down_in_bwd, const char *what, int64_t *differ)
{
    const int checks = MT_CHECK_BOUND | MT_CHECK_EXACT_ROUNDING;
    REQUIRE((fuse != NULL ? setenv("MOE_MLP_FUSE_GATE", fuse, 1) : unsetenv("MOE_MLP_FUSE_GATE")) == 0, "setenv failed");
    mt_result first, unfused;
    int64_t b = gpu_against_ref(c, checks, down_in_bwd, 0, what, &first);
    REQUIRE(setenv("MOE_MLP_FUSE_GATE", "0", 1) == 0, "setenv failed");
    use_gpu();
    b += mt_run(c, checks, down_in_bwd, &unfused);
    REQUIRE(unsetenv("MOE_MLP_FUSE_GATE") == 0, "unsetenv failed");
    if (!mt_results_identical(c, &first, &unfused, 1)) {
        fprintf(stderr, "  %s: the GPU run and its MOE_MLP_FUSE_GATE=0 run differ\n", what);
        b++;
        (*differ)++;
    }
    mt_result_free(&first);
    mt_result_free(&unfused);
    return b;
}

/* ---- 4: the fused gate/up epilogue (gpu/mlp/gate_sm90.cu) ---- */

/* The rows path's forward runs its gate/up GEMM with the activation fused into the epilogue where the
 * sm_90a kernel takes the call (f16/bf16, H and I multiples of 8, round_intermediates, 256 positions per
 * expert or more unless MOE_MLP_FUSE_GATE=1); the option cross's small cases seldom reach it.  Here,
 * forced: blocks of 16 .. 128 positions, so both of its checkpoint stores; I a multiple of 64 or not, so
 * partial column tiles; dropless, dropping and shuffled layouts; every activation, affinity, bias and clamp
 * choice; ON_I forwards write the down checkpoint, so the unscaled copy of m too.  Each case is checked
 * against the reference within the bounds, and against the unfused path (MOE_MLP_FUSE_GATE=0) bit for bit,
 * outputs, checkpoints and gradients.  The same switch takes the down GEMM (and ON_I's recomputed d) and the
 * backward's dM and dX GEMMs to the ping-pong rows kernel (=1, sm90_rows_f32_kernel, both of its forms) or the
 * 128 x 256 kernel (=0), so that kernel is compared bit for bit too.  On an sm_90 device with the sm_90a kernels
 * built (and MOE_CUDA_KERNEL not forcing sm80 or simt), the fused run sets MOE_MLP_FUSE_GATE=1, so a case the
 * fused kernel declines fails instead of quietly comparing the unfused path with itself; elsewhere it runs with
 * MOE_MLP_FUSE_GATE unset, both runs take the unfused path and the comparison is trivially equal. */
static int fused_kernel_expected(void)
{
#ifdef MOE_HAVE_SM90A
    const char *forced = getenv("MOE_CUDA_KERNEL"); /* sm80 / simt: the caller asked for another family */
    if (forced != NULL && (strcmp(forced, "sm80") == 0 || strcmp(forced, "simt") == 0))
        return 0;
    int device = 0, major = 0, minor = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    return major == 9 && minor == 0;
#else
    return 0;
#endif
}

static int64_t fused_gate(uint64_t base, int first, int cases)
{
    oracle_rng rng = {base ^ 0x9a7e5eedULL};
    int64_t bad = 0, done = 0, differ = 0;
    const int strict = fused_kernel_expected();
    const int trace = getenv("TEST_GPU_MLP_TRACE") != NULL; /* each case's line before it runs */
    for (int index = 0; index < cases; index++) {
        moe_mlp_options o = indexed_options(index);
        o.dtype = (index >> 4) & 1 ? MOE_F16 : MOE_BF16;
        o.float32_intermediates = 0;
        o.padding = (moe_mlp_padding)oracle_rng_below(&rng, 2);
        static const int64_t blocks[] = {16, 32, 64, 128, 128, 64};
        o.block_size = blocks[oracle_rng_below(&rng, sizeof blocks / sizeof blocks[0])];
        const int64_t E = 1 + (int64_t)oracle_rng_below(&rng, 4);
        const int64_t k = 1 + (int64_t)oracle_rng_below(&rng, (uint64_t)(E < 2 ? E : 2));
        const int64_t T = 60 + (int64_t)oracle_rng_below(&rng, 300);
        const int64_t H = 8 * (8 + (int64_t)oracle_rng_below(&rng, 12));
        const int64_t I = oracle_rng_below(&rng, 2) ? 64 * (1 + (int64_t)oracle_rng_below(&rng, 2))
                                                    : 8 * (2 + (int64_t)oracle_rng_below(&rng, 16));
        const int mode = (int)oracle_rng_below(&rng, 3);
        const int clamps_drawn = (int)oracle_rng_below(&rng, 16);
        const int down_in_bwd = o.affinity == MOE_AFFINITY_ON_H || oracle_rng_below(&rng, 2);
        if (index < first) /* its draws are made: the later cases are those of the whole run */
            continue;
        /* the kernel's plain instance (no bias, no clamp, affinity on H): half the cases with the affinity on H
         * and no bias drop their clamps (by the index, so that every draw stays as before: the first 32 cases
         * reach each activation once, in one dtype or the other, the first 64 in both) */
        const int plain = o.affinity == MOE_AFFINITY_ON_H && !o.bias && ((index ^ (index >> 4) ^ (index >> 5)) & 1) == 0;
        const int clamps = plain ? 0 : clamps_drawn;
        if (trace) {
            fprintf(stderr, "fused case %d: T %lld E %lld k %lld H %lld I %lld B %lld mode %d act %d aff %d bias %d %s "
                    "clamps %d down_in_bwd %d\n", index, (long long)T, (long long)E, (long long)k, (long long)H,
                    (long long)I, (long long)o.block_size, mode, (int)o.activation, (int)o.affinity, o.bias,
                    moe_dtype_name(o.dtype), clamps, down_in_bwd);
            fflush(stderr);
        }
        mt_case c;
        init_scaled_case(&c, base * 7919ULL + (uint64_t)index, T, E, k, H, I, &o, mode, clamps);
        bad += report_case("fused", index, &c, mode,
                           against_unfused(&c, strict ? "1" : NULL, down_in_bwd, "GPU (fused gate/up) vs CPU reference",
                                           &differ));
        done++;
        mt_case_free(&c);
    }
    printf("fused gate/up: %lld cases%s, %lld mismatches (%lld where fused and unfused differ)\n", (long long)done,
           strict ? " (the fused kernel required)" : " (no sm_90a: both runs unfused)", (long long)bad,
           (long long)differ);
    return bad;
}

/* ---- 3: invalid device layouts ---- */

/* Runs fwd and bwd on the GPU with the given layout arrays (host copies; the wrappers upload them) and
 * checks the status moe_backend_synchronize reports and its message (naming the op and `needle`). */
static int64_t expect_layout_error(const char *label, const mt_case *c, const int64_t *b2e, const int64_t *ids,
                                   int overwrite, moe_status want, const char *needle)
{
    int64_t bad = 0;
    moe_mlp_options o = c->opt;
    o.tensor_update_overwrite = overwrite;
    o.accumulate = 0, o.grad_fp32 = 0, o.bias = 0;
    moe_mlp_layout l = c->layout;
    l.block_to_expert = b2e, l.token_position_to_id = ids;
    const sizes s = sizes_of(&l, c->H, c->I, &o);
    const size_t sz[7] = {(size_t)(s.T1 * c->H) * s.es, (size_t)(s.N * 2 * c->I * s.B) * s.es,
                          (size_t)(s.NB * c->H) * s.es, (size_t)(s.T1 * c->H) * s.es, (size_t)(c->T * c->E) * s.es,
                          (size_t)(c->E * c->H * 2 * c->I) * s.es, (size_t)(c->E * c->I * c->H) * s.es};
    void *buf[7];
    for (int q = 0; q < 7; q++) {
        buf[q] = xmalloc(sz[q] + 1);
        oracle_poison(c->opt.dtype, buf[q], (int64_t)(sz[q] / s.es));
    }
    for (int which = 0; which < 2; which++) {
        const moe_status st =
            which == 0 ? gpu_fwd(MOE_BACKEND_CUDA, &l, c->H, c->I, c->hidden, c->aff, c->w_gu, c->w_d, NULL, NULL,
                                 buf[0], buf[1], buf[2], &o)
                       : gpu_bwd(MOE_BACKEND_CUDA, &l, c->H, c->I, c->hidden, c->aff, c->w_gu, c->w_d, NULL, buf[1],
                                 buf[2], c->G, buf[3], buf[4], buf[5], buf[6], NULL, NULL, &o);
        const char *msg = moe_last_error();
        const char *opname = which == 0 ? "moe_mlp_fwd" : "moe_mlp_bwd";
        const int message_ok = want == MOE_OK || (strstr(msg, needle) != NULL && strstr(msg, opname) != NULL);
        if (st != want || !message_ok) {
            fprintf(stderr, "  %s (%s): status %d (%s), want %d; message \"%s\" (want \"%s\")\n", label, opname,
                    (int)st, moe_strerror(st), (int)want, msg, needle);
            bad++;
        }
    }
    for (int q = 0; q < 7; q++)
        free(buf[q]);
    return bad;
}

/* Runs fwd and bwd with an invalid layout on device buffers and checks that every output buffer on the
 * device still holds its poison afterwards (no byte written). */
static int64_t device_untouched(const mt_case *c, const int64_t *b2e, const int64_t *ids)
{
    moe_mlp_options o = c->opt;
    o.accumulate = 0, o.grad_fp32 = 0, o.bias = 0;
    moe_mlp_layout l = c->layout;
    l.block_to_expert = b2e, l.token_position_to_id = ids;
    const sizes s = sizes_of(&l, c->H, c->I, &o);
    moe_mlp_layout dl = layout_up(&l, &s);
    const size_t bx = (size_t)(s.T1 * c->H) * s.es, bgu = (size_t)(s.N * 2 * c->I * s.B) * s.es;
    const size_t bd = (size_t)(s.NB * c->H) * s.es, ba = (size_t)(c->T * c->E) * s.es;
    const size_t bwgu = (size_t)(c->E * c->H * 2 * c->I) * s.es, bwd = (size_t)(c->E * c->I * c->H) * s.es;
    const size_t sz[7] = {bx, bgu, bd, bx, ba, bwgu, bwd};
    void *host[7], *dev[7];
    for (int q = 0; q < 7; q++) {
        host[q] = xmalloc(sz[q] + 1);
        oracle_poison(c->opt.dtype, host[q], (int64_t)(sz[q] / s.es));
        dev[q] = up(host[q], sz[q]);
    }
    void *dxh = up(c->hidden, bx), *da = up(c->aff, ba), *dwgu = up(c->w_gu, bwgu), *dwd = up(c->w_d, bwd);
    void *dg = up(c->G, bx), *ckgu = up(host[1], bgu), *ckd = up(host[2], bd);
    int64_t bad = 0;
    moe_status st = moe_mlp_fwd(MOE_BACKEND_CUDA, &dl, c->H, c->I, dxh, da, dwgu, dwd, NULL, NULL, dev[0], dev[1],
                                dev[2], &o);
    bad += st != MOE_OK; /* the call itself queues the work; the error comes from the synchronisation */
    bad += moe_backend_synchronize(MOE_BACKEND_CUDA, NULL) == MOE_OK;
    st = moe_mlp_bwd(MOE_BACKEND_CUDA, &dl, c->H, c->I, dxh, da, dwgu, dwd, NULL, ckgu, ckd, dg, dev[3], dev[4], dev[5],
                     dev[6], NULL, NULL, &o);
    bad += st != MOE_OK;
    bad += moe_backend_synchronize(MOE_BACKEND_CUDA, NULL) == MOE_OK;
    bad += moe_backend_synchronize(MOE_BACKEND_CUDA, NULL) != MOE_OK; /* reported once, then forgotten */
    for (int q = 0; q < 7; q++) {
        unsigned char *back = xmalloc(sz[q] + 1);
        if (sz[q])
            CUDA_CHECK(cudaMemcpy(back, dev[q], sz[q], cudaMemcpyDeviceToHost));
        if (memcmp(back, host[q], sz[q]) != 0) {
            fprintf(stderr, "  device output %d was written by a call with an invalid layout\n", q);
            bad++;
        }
        free(back);
        free(host[q]);
        down(NULL, dev[q], 0, 0);
    }
    void *rest[] = {dxh, da, dwgu, dwd, dg, ckgu, ckd};
    for (int q = 0; q < 7; q++)
        down(NULL, rest[q], 0, 0);
    layout_free(&dl);
    return bad;
}

static int64_t bad_layouts(uint64_t seed)
{
    int64_t bad = 0, checks = 0;
    for (int padding = 0; padding < 2; padding++) {
        moe_mlp_options o = {0};
        o.dtype = MOE_BF16;
        o.block_size = 4;
        o.padding = (moe_mlp_padding)padding;
        mt_case c;
        mt_case_init(&c, seed + (uint64_t)padding, 9, 3, 2, 5, 3, &o, MT_DROPLESS);
        const int64_t N = c.N, NB = c.N * c.B, T = c.T, E = c.E;
        int64_t *b2e = xmalloc((size_t)N * 8), *ids = xmalloc((size_t)NB * 8);
        const int64_t other_pad = padding ? -1 : T;
#define RESET() (memcpy(b2e, c.b2e, (size_t)N * 8), memcpy(ids, c.ids, (size_t)NB * 8))
        char needle[160];
        /* a valid call first: passes, and leaves no error behind */
        RESET();
        bad += expect_layout_error("valid layout", &c, b2e, ids, 0, MOE_OK, "");
        checks++;
        RESET();
        b2e[N - 1] = E;
        snprintf(needle, sizeof needle, "layout.block_to_expert[%lld] = %lld", (long long)(N - 1), (long long)E);
        bad += expect_layout_error("expert out of range", &c, b2e, ids, 0, MOE_ERR_INVALID_INDEX, needle);
        bad += device_untouched(&c, b2e, ids);
        checks++;
        RESET();
        b2e[0] = -3;
        bad += expect_layout_error("negative expert", &c, b2e, ids, 0, MOE_ERR_INVALID_INDEX, "= -3");
        checks++;
        const int64_t targets[3] = {T + 1, other_pad, -7};
        for (int q = 0; q < 3; q++) {
            RESET();
            ids[NB - 1] = targets[q];
            snprintf(needle, sizeof needle, "layout.token_position_to_id[%lld] = %lld", (long long)(NB - 1),
                     (long long)targets[q]);
            bad += expect_layout_error("token id out of range", &c, b2e, ids, 0, MOE_ERR_INVALID_INDEX, needle);
            checks++;
        }
        /* both an expert and a token error: the expert error is reported (the reference's order) */
        RESET();
        ids[0] = T + 9;
        b2e[N - 1] = E + 2;
        bad += expect_layout_error("two errors", &c, b2e, ids, 0, MOE_ERR_INVALID_INDEX, "layout.block_to_expert");
        checks++;
        /* a pair twice: copy position 0's token into another slot of a block of the same expert */
        RESET();
        int64_t dup = -1;
        for (int64_t p = 1; p < NB && dup < 0; p++)
            if (b2e[p / c.B] == b2e[0] && ids[p] != ids[0])
                dup = p;
        if (dup > 0) {
            ids[dup] = ids[0];
            snprintf(needle, sizeof needle, "[0] and [%lld] both place token %lld with expert %lld", (long long)dup,
                     (long long)ids[0], (long long)b2e[0]);
            bad += expect_layout_error("pair twice", &c, b2e, ids, 0, MOE_ERR_INVALID_ROUTING, needle);
            bad += device_untouched(&c, b2e, ids);
            checks++;
        }
        /* top-1 promised but a token sits twice (this layout is top-2) */
        RESET();
        bad += expect_layout_error("top-1 broken", &c, b2e, ids, 1, MOE_ERR_INVALID_OPTION,
                                   "options.tensor_update_overwrite is set but token");
        checks++;
        /* and a valid call after all the errors is clean */
        RESET();
        bad += expect_layout_error("valid layout again", &c, b2e, ids, 0, MOE_OK, "");
        checks++;
#undef RESET
        free(b2e);
        free(ids);
        mt_case_free(&c);
    }
    printf("invalid layouts: %lld checks, %lld failures\n", (long long)checks, (long long)bad);
    return bad;
}

/* ---- 5: many experts ---- */

/* The layout's per-expert block lists (expert_lists_kernel, gpu/mlp/layout_check.cu) are built in windows of 128
 * experts by 32 warps, each over its own segment of the blocks; the option cross has at most 6 experts. Here E is
 * 128, 129, 255, 256, 257 or 700 (one window, two, three, six), with blocks of 1 .. 16 positions (up to ~2400
 * blocks: several chunks of 32 per warp), in the three layout modes, both paths (round_intermediates or not),
 * checked against the CPU reference within the bounds. */
static int64_t many_experts(uint64_t base, int cases)
{
    oracle_rng rng = {base ^ 0x3e5e9a11ULL};
    int64_t bad = 0;
    static const int64_t experts[] = {128, 129, 255, 256, 257, 700};
    static const int64_t blocks[] = {1, 1, 3, 16};
    for (int index = 0; index < cases; index++) {
        moe_mlp_options o = {0};
        o.activation = (moe_mlp_activation)(index & 3);
        o.affinity = (moe_mlp_affinity)((index >> 2) & 1);
        o.dtype = (moe_dtype)(index % 3);
        o.float32_intermediates = !(o.dtype != MOE_F32 && (index & 8) != 0);
        o.block_size = blocks[oracle_rng_below(&rng, sizeof blocks / sizeof blocks[0])];
        const int64_t E = experts[index % (int)(sizeof experts / sizeof experts[0])];
        const int64_t k = 1 + (int64_t)oracle_rng_below(&rng, 4);
        const int64_t T = 100 + (int64_t)oracle_rng_below(&rng, 500);
        const int64_t H = 8 * (1 + (int64_t)oracle_rng_below(&rng, 3)), I = 8 * (1 + (int64_t)oracle_rng_below(&rng, 2));
        const int mode = (int)oracle_rng_below(&rng, 3);
        mt_case c;
        mt_case_init(&c, base * 104729ULL + (uint64_t)index, T, E, k, H, I, &o, mode);
        bad += report_case("many-experts", index, &c, mode,
                           gpu_against_ref(&c, MT_CHECK_BOUND, 1, 0, "GPU vs CPU reference", NULL));
        mt_case_free(&c);
    }
    printf("many experts: %d cases, %lld mismatches\n", cases, (long long)bad);
    return bad;
}

/* ---- 6: tensors off their alignment ---- */

/* The kernels take 16-byte vector and 4-byte word paths only where a tensor's address allows them (aligned16 of
 * gpu/common/launch.cuh, ckpt_words of gpu/mlp/gate_rows.cu); cudaMalloc'd tensors always allow them.  Here every
 * tensor sits one element past a 256-byte boundary (tensor_offset), so that each call takes the other paths: cases
 * of every dtype, activation, affinity and bias choice, H and I multiples of 8 (where the aligned paths would have
 * been taken), blocks of 16 .. 128 positions, half of the f16/bf16 cases on the rows path, checked within the
 * bounds and against the CPU reference.  (grad_fp32 stays off: its float32 gradients would sit one 16-bit element
 * off, misaligned for float32 itself.) */
static int64_t offset_tensors(uint64_t base, int cases)
{
    oracle_rng rng = {base ^ 0x0ff5e7edULL};
    int64_t bad = 0;
    static const int64_t blocks[] = {16, 32, 64, 128};
    for (int index = 0; index < cases; index++) {
        moe_mlp_options o = indexed_options(index);
        o.dtype = (moe_dtype)(index % 3);
        o.float32_intermediates = !(o.dtype != MOE_F32 && oracle_rng_below(&rng, 2));
        o.block_size = blocks[oracle_rng_below(&rng, sizeof blocks / sizeof blocks[0])];
        const int64_t E = 1 + (int64_t)oracle_rng_below(&rng, 4);
        const int64_t k = 1 + (int64_t)oracle_rng_below(&rng, (uint64_t)(E < 2 ? E : 2));
        const int64_t T = 30 + (int64_t)oracle_rng_below(&rng, 200);
        const int64_t H = 8 * (1 + (int64_t)oracle_rng_below(&rng, 12));
        const int64_t I = 8 * (1 + (int64_t)oracle_rng_below(&rng, 12));
        const int mode = (int)oracle_rng_below(&rng, 3);
        const int down_in_bwd = o.affinity == MOE_AFFINITY_ON_H || oracle_rng_below(&rng, 2);
        mt_case c;
        mt_case_init(&c, base * 15485863ULL + (uint64_t)index, T, E, k, H, I, &o, mode);
        const int checks = MT_CHECK_BOUND | (o.dtype != MOE_F32 ? MT_CHECK_EXACT_ROUNDING : 0);
        const int64_t b = gpu_against_ref(&c, checks, down_in_bwd, moe_dtype_size(o.dtype),
                                          "GPU (tensors one element off) vs CPU reference", NULL);
        if (b)
            fprintf(stderr, "offset case %d (seed %llu, T %lld E %lld k %lld H %lld I %lld B %lld, mode %d, %s%s): "
                    "%lld mismatches\n", index, (unsigned long long)c.seed, (long long)T, (long long)E, (long long)k,
                    (long long)H, (long long)I, (long long)o.block_size, mode, moe_dtype_name(o.dtype),
                    !o.float32_intermediates ? ", rows path" : "", (long long)b);
        bad += b;
        mt_case_free(&c);
    }
    printf("tensors one element off: %d cases, %lld mismatches\n", cases, (long long)bad);
    return bad;
}

/* ---- 7: split operands ---- */

/* bf16 without round_intermediates takes the rows path on split operands (specs/MLP.md, "Split operands on
 * the GPU": every float32 intermediate a GEMM reads stored as three exact bf16 terms at term rows, the GEMMs
 * over the term rows); the option cross's shapes are mostly too small for the tensor-core kernels.
 * Here the fused gate/up property's shapes (H 64 .. 152, I 16 .. 128 or 64 / 128, blocks of 16 .. 128
 * positions, three layout modes), one in four with H or I off a multiple of 8 (the rows GEMM's SIMT
 * family); every activation, affinity and bias choice, clamps at random; half with accumulate and half with
 * float32 gradients, where a lost term shows past bf16's rounding.  Checked within the bounds (exact
 * roundings included) and against the CPU reference. */
static int64_t split_operands(uint64_t base, int cases)
{
    oracle_rng rng = {base ^ 0x5b117e55ULL};
    int64_t bad = 0;
    static const int64_t blocks[] = {16, 32, 64, 128};
    for (int index = 0; index < cases; index++) {
        moe_mlp_options o = indexed_options(index);
        o.dtype = MOE_BF16;
        o.grad_fp32 = (index >> 4) & 1;
        o.accumulate = oracle_rng_below(&rng, 2);
        o.padding = (moe_mlp_padding)oracle_rng_below(&rng, 2);
        o.block_size = blocks[oracle_rng_below(&rng, sizeof blocks / sizeof blocks[0])];
        const int64_t E = 1 + (int64_t)oracle_rng_below(&rng, 4);
        const int64_t k = 1 + (int64_t)oracle_rng_below(&rng, (uint64_t)(E < 2 ? E : 2));
        const int64_t T = 60 + (int64_t)oracle_rng_below(&rng, 300);
        int64_t H = 8 * (8 + (int64_t)oracle_rng_below(&rng, 12));
        int64_t I = oracle_rng_below(&rng, 2) ? 64 * (1 + (int64_t)oracle_rng_below(&rng, 2))
                                              : 8 * (2 + (int64_t)oracle_rng_below(&rng, 16));
        if (oracle_rng_below(&rng, 4) == 0) { /* off the tensor-core families */
            if (oracle_rng_below(&rng, 2))
                H += 1 + (int64_t)oracle_rng_below(&rng, 7);
            else
                I += 1 + (int64_t)oracle_rng_below(&rng, 7);
        }
        const int mode = (int)oracle_rng_below(&rng, 3);
        const int clamps = (int)oracle_rng_below(&rng, 16);
        const int down_in_bwd = o.affinity == MOE_AFFINITY_ON_H || oracle_rng_below(&rng, 2);
        mt_case c;
        init_scaled_case(&c, base * 2750159ULL + (uint64_t)index, T, E, k, H, I, &o, mode, clamps);
        bad += report_case("split", index, &c, mode,
                           gpu_against_ref(&c, MT_CHECK_BOUND | MT_CHECK_EXACT_ROUNDING, down_in_bwd, 0,
                                           "GPU (split operands) vs CPU reference", NULL));
        mt_case_free(&c);
    }
    printf("split operands: %d cases, %lld mismatches\n", cases, (long long)bad);
    return bad;
}

/* ---- 8: the size thresholds of the rows path's kernel choice ---- */

/* With MOE_MLP_FUSE_GATE unset the rows path picks some kernels by size, rules the other properties never
 * evaluate (the option cross's shapes are small; fused_gate sets the variable).  Each case below sits on one
 * side of a threshold, its twin on the other; each runs with the affinity on I without the down checkpoint in
 * the backward, so that every fp32 rows GEMM of the MLP runs (the forward's down-checkpoint GEMM and the
 * backward's recomputed d too), and the small ones also with the affinity on H and the checkpoint (the long
 * reductions run once: their float64 checks are the slow part).  Each run is checked by against_unfused:
 * within the bounds, against the reference, and bit for bit against
 * MOE_MLP_FUSE_GATE=0 (the unfused gate/up and the 128 x 256 kernel for every fp32 rows GEMM: the same bits).
 * Every layout is dropless, so that the positions are exactly the ceil(T k / E / B) blocks of each expert
 * (the shuffled layout's empty block and the dropping layout's capacity would change them).  MOE_CUDA_KERNEL
 * and MOE_SM90_ROWS_PINGPONG, where the caller sets them, override these rules. */
typedef struct threshold_case {
    const char *crosses;     /* the threshold and the side the case is on */
    moe_dtype dtype;
    int round_intermediates; /* 0 with bf16: split operands (the rows path all the same) */
    int64_t T, E, k, B, H, I;
    int on_h_too;            /* also a run with the affinity on H */
} threshold_case;

static const threshold_case threshold_cases[] = {
    /* R_PINGPONG_MAX_N (gpu/gemm/heuristics.cuh; rows_f32_pingpong, gpu/gemm/rows_f32_sm90.cu): the ping-pong
     * kernel takes an fp32 rows GEMM only with reduction <= 1024 (without MOE_SM90_ROWS_PINGPONG=1 or
     * MOE_MLP_FUSE_GATE=1), and only past gate_fusion_refusal's size rule: here E = 1 and T = 136 top-1 in blocks
     * of 128, two blocks, so rows = NB = 256 = G_FUSE_MIN_ROWS * E (the rule counts positions, padding included; 3
     * NB on split operands' term rows) with fewer tokens to check than T = 256 (a full and a partial tile of 128
     * rows), and (but for I = 516 below) every other dimension a multiple of 8.  The down GEMM and the recomputed d
     * (MOE_ROWS_A_W, reduction N = I): */
    {"R_PINGPONG_MAX_N, down reduction I = 1024 (ping-pong)", MOE_BF16, 1, 136, 1, 1, 128, 8, 1024, 0},
    {"R_PINGPONG_MAX_N, down reduction I = 1032 (128 x 256)", MOE_BF16, 1, 136, 1, 1, 128, 8, 1032, 0},
    {"R_PINGPONG_MAX_N, down reduction I = 1024 (ping-pong)", MOE_F16, 1, 136, 1, 1, 128, 8, 1024, 0},
    {"R_PINGPONG_MAX_N, down reduction I = 1032 (128 x 256)", MOE_F16, 1, 136, 1, 1, 128, 8, 1032, 0},
    /* the backward's dM (MOE_ROWS_A_WT, reduction K = H); on split operands also the forward's unfused gate/up
     * GEMM (MOE_ROWS_A_W, reduction N = H; split operands never take the fused kernel) */
    {"R_PINGPONG_MAX_N, dM reduction H = 1024 (ping-pong)", MOE_BF16, 1, 136, 1, 1, 128, 1024, 8, 0},
    {"R_PINGPONG_MAX_N, dM reduction H = 1032 (128 x 256)", MOE_BF16, 1, 136, 1, 1, 128, 1032, 8, 0},
    {"R_PINGPONG_MAX_N, split gate/up and dM reduction H = 1024 (ping-pong)", MOE_BF16, 0, 136, 1, 1, 128, 1024, 8, 0},
    {"R_PINGPONG_MAX_N, split gate/up and dM reduction H = 1032 (128 x 256)", MOE_BF16, 0, 136, 1, 1, 128, 1032, 8, 0},
    /* the backward's dX (MOE_ROWS_A_WT, reduction K = 2 I; I = 516 is no multiple of 8, which keeps the fused
     * gate/up, the down GEMM and dM off the ping-pong kernel, but dX's reduction 1032 and H are multiples of 8,
     * so only the size rule declines it) */
    {"R_PINGPONG_MAX_N, dX reduction 2 I = 1024 (ping-pong)", MOE_BF16, 1, 136, 1, 1, 128, 8, 512, 0},
    {"R_PINGPONG_MAX_N, dX reduction 2 I = 1032 (128 x 256)", MOE_BF16, 1, 136, 1, 1, 128, 8, 516, 0},
    /* G_FUSE_MIN_ROWS (gpu/gemm/heuristics.cuh; gate_fusion_refusal, gpu/gemm/heuristics.cu): the fused gate/up
     * kernel (and the ping-pong kernel) only with rows >= 256 E, rows = NB = 128 (one block) or 256 (two) */
    {"G_FUSE_MIN_ROWS, 128 positions per expert (unfused)", MOE_BF16, 1, 128, 1, 1, 128, 8, 8, 1},
    {"G_FUSE_MIN_ROWS, 256 positions per expert (fused)", MOE_BF16, 1, 256, 1, 1, 128, 8, 8, 1},
    /* GATE_SPAN (gpu/mlp/gate_rows.cu; gate_act_kernel, gate_bwd_kernel): tiles of 256 columns of I, I > 256 in
     * several spans (2 at 257 and at 512); 16 positions per expert, far below G_FUSE_MIN_ROWS, so that the
     * forward takes gate_act_kernel (split operands always do), the backward gate_bwd_kernel on every path */
    {"GATE_SPAN, I = 256 (one span)", MOE_BF16, 0, 8, 2, 2, 16, 8, 256, 1},
    {"GATE_SPAN, I = 257 (two spans, the second of one column)", MOE_BF16, 0, 8, 2, 2, 16, 8, 257, 1},
    {"GATE_SPAN, I = 512 (two spans)", MOE_BF16, 0, 8, 2, 2, 16, 8, 512, 1},
    {"GATE_SPAN, I = 256 (one span)", MOE_BF16, 1, 8, 2, 2, 16, 8, 256, 1},
    {"GATE_SPAN, I = 257 (two spans, the second of one column)", MOE_BF16, 1, 8, 2, 2, 16, 8, 257, 1},
    {"GATE_SPAN, I = 512 (two spans)", MOE_BF16, 1, 8, 2, 2, 16, 8, 512, 1},
    {"GATE_SPAN, I = 256 (one span)", MOE_F16, 1, 8, 2, 2, 16, 8, 256, 1},
    {"GATE_SPAN, I = 257 (two spans, the second of one column)", MOE_F16, 1, 8, 2, 2, 16, 8, 257, 1},
    {"GATE_SPAN, I = 512 (two spans)", MOE_F16, 1, 8, 2, 2, 16, 8, 512, 1},
};

static int64_t thresholds(uint64_t base, int cases)
{
    const int count = (int)(sizeof threshold_cases / sizeof threshold_cases[0]);
    int64_t bad = 0, done = 0, differ = 0;
    for (int index = 0; index < count && index < cases; index++) { /* the first `cases` of the table */
        const threshold_case *t = &threshold_cases[index];
        for (int on_i = !t->on_h_too; on_i < 2; on_i++) {
            moe_mlp_options o = indexed_options(index);
            o.affinity = on_i ? MOE_AFFINITY_ON_I : MOE_AFFINITY_ON_H;
            o.dtype = t->dtype;
            o.float32_intermediates = !t->round_intermediates;
            o.block_size = t->B;
            mt_case c;
            init_scaled_case(&c, base * 1299709ULL + (uint64_t)(2 * index + on_i), t->T, t->E, t->k, t->H, t->I, &o,
                             MT_DROPLESS, 0);
            char what[200];
            snprintf(what, sizeof what, "GPU (%s, %s%s, affinity on %s) vs CPU reference", t->crosses,
                     moe_dtype_name(t->dtype), t->round_intermediates ? ", round_intermediates" : "", on_i ? "I" : "H");
            bad += report_case("threshold", index, &c, MT_DROPLESS, against_unfused(&c, NULL, !on_i, what, &differ));
            done++;
            mt_case_free(&c);
        }
    }
    printf("size thresholds: %lld cases%s, %lld mismatches (%lld where the library's choice and MOE_MLP_FUSE_GATE=0 "
           "differ)\n", (long long)done, fused_kernel_expected() ? "" : " (no sm_90a: both runs on the same kernels)",
           (long long)bad, (long long)differ);
    return bad;
}

int main(int argc, char **argv)
{
    const uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 20261122;
    const int cases = argc > 2 ? atoi(argv[2]) : 3072;
    printf("seed %llu, %d cases\n", (unsigned long long)seed, cases);
    if (!moe_backend_available(MOE_BACKEND_CUDA)) {
        printf("SKIP: no CUDA backend or device (%s)\n", moe_last_error());
        return 77;
    }
    int64_t determinism = 0;
    int64_t bad = option_cross(seed, cases, &determinism);
    printf("determinism: %lld repeated cases compared bit for bit\n", (long long)determinism);
    bad += fused_gate(seed, argc > 4 ? atoi(argv[4]) : 0, argc > 3 ? atoi(argv[3]) : 48);
    bad += bad_layouts(seed);
    bad += many_experts(seed, argc > 5 ? atoi(argv[5]) : 12);
    bad += offset_tensors(seed, argc > 6 ? atoi(argv[6]) : 24);
    bad += split_operands(seed, argc > 7 ? atoi(argv[7]) : 32);
    bad += thresholds(seed, argc > 8 ? atoi(argv[8]) : (int)(sizeof threshold_cases / sizeof threshold_cases[0]));
    printf("%s\n", bad == 0 ? "PASS" : "FAIL");
    return bad == 0 ? 0 : 1;
}
