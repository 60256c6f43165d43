/*
 * cli/cmd_autotune.c: the autotune command: times the CUDA kernel candidates of one grouped GEMM shape on
 * random data and appends the fastest to an autotune cache file.
 */
#include "cli.h"
#include "oracle.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static const opt autotune_opts[] = {
    {"--op", "fwd|dx|dw", "the grouped GEMM to tune: moe_gemm_fwd, moe_gemm_dx or moe_gemm_dw."},
    {"--tokens", "T", "tokens T >= 1."},
    {"--topk", "K", "experts per token k, 1 <= k <= E (default 1): each token gets k distinct experts, uniformly at random."},
    {"--experts", "E", "experts E >= 1."},
    {"--n", "N", "the forward's output features N (a multiple of 8 for the tensor-core kernels)."},
    {"--k", "K", "the forward's input features K (a multiple of 8 for the tensor-core kernels)."},
    {"--dtype", "f32|f16|bf16", "the call's dtype (default bf16)."},
    {"--permute-x", NULL, "tune the call with X in token order (gather on load; dx: dX written in slot order)."},
    {"--permute-y", NULL, "tune the call with Y / dY in slot order."},
    {"--reduce-topk", NULL, "dx: tune the call that sums each token's k rows."},
    {"--topk-weights", NULL, "tune the call with fused topk weights (random, slot order)."},
    {"--dw-fp32", NULL, "dw: tune the call that writes dW in float32."},
    {"--allow-tf32", NULL, "with --dtype f32: tune the call that allows TF32 tensor cores."},
    {"--repeats", "R", "timed runs per candidate, 1 .. 1000 (default 20); the median decides."},
    {"--seed", "S", "seed of the random routing and data (default 1)."},
    {"--cache", "FILE",
     "the autotune cache file to append the choice to (created if missing); load it in the training process "
     "with moe_gemm_autotune_load(FILE)."},
    {NULL, NULL, NULL},
};

static int run_autotune(const args *a);

const command autotune_command = {
    "autotune",
    "--op fwd|dx|dw --tokens T [--topk K] --experts E --n N --k K [--dtype ...] [--permute-x] [--permute-y] "
    "[--reduce-topk] [--topk-weights] [--dw-fp32] [--allow-tf32] [--repeats R] [--seed S] --cache FILE",
    "time the CUDA kernel candidates of one grouped GEMM shape and cache the fastest (moe_gemm_autotune)",
    "Makes a uniformly random routing of T tokens to k distinct experts of E and random inputs (uniform "
    "in [-1, 1), rounded to the dtype) on the first GPU, runs moe_gemm_autotune on that call, prints how "
    "many distinct configurations it timed and the one it kept, and appends the choice to --cache. The choice is keyed by the GPU's name, the op, the dtypes, the flags and (E, T*k, "
    "N, K): a training process that calls moe_gemm_autotune_load(FILE) then runs every call of that key "
    "with it. Needs a CUDA build and device (exit 2 otherwise). MOE_AUTOTUNE_VERBOSE=1 prints each "
    "candidate's median.",
    autotune_opts, 0, run_autotune,
    "# Qwen3-30B-A3B's gate/up forward at 4096 tokens on this GPU, kept in tune.txt\n"
    "moe autotune --op fwd --tokens 4096 --topk 8 --experts 128 --n 1536 --k 2048 --dtype bf16 \\\n"
    "    --cache tune.txt",
};

static int run_autotune(const args *a)
{
    const char *op_name = need(a, "--op"), *cache = need(a, "--cache");
    moe_gemm_op op;
    if (strcmp(op_name, "fwd") == 0)
        op = MOE_GEMM_FWD;
    else if (strcmp(op_name, "dx") == 0)
        op = MOE_GEMM_DX;
    else if (strcmp(op_name, "dw") == 0)
        op = MOE_GEMM_DW;
    else
        die("--op %s: expected fwd, dx or dw", op_name);
    const int64_t T = parse_int_arg("--tokens", need(a, "--tokens"), 1);
    const int64_t E = parse_int_arg("--experts", need(a, "--experts"), 1);
    const int64_t k = get(a, "--topk") ? parse_int_arg("--topk", get(a, "--topk"), 1) : 1;
    const int64_t N = parse_int_arg("--n", need(a, "--n"), 1), K = parse_int_arg("--k", need(a, "--k"), 1);
    const int64_t repeats = get(a, "--repeats") ? parse_int_arg("--repeats", get(a, "--repeats"), 1) : 20;
    const int64_t seed = get(a, "--seed") ? parse_int_arg("--seed", get(a, "--seed"), 0) : 1;
    if (k > E)
        die("--topk %lld: a token's experts are distinct, so k <= E = %lld", (long long)k, (long long)E);
    if (repeats > 1000)
        die("--repeats %lld: expected 1 .. 1000", (long long)repeats);
    moe_gemm_options o;
    memset(&o, 0, sizeof o);
    o.dtype = MOE_BF16;
    if (get(a, "--dtype") && !parse_dtype(get(a, "--dtype"), &o.dtype))
        die("--dtype %s: expected f32, f16 or bf16", get(a, "--dtype"));
    o.permute_x = get(a, "--permute-x") != NULL, o.permute_y = get(a, "--permute-y") != NULL;
    o.reduce_topk = get(a, "--reduce-topk") != NULL, o.dw_fp32 = get(a, "--dw-fp32") != NULL;
    o.allow_tf32 = get(a, "--allow-tf32") != NULL;
    const int weighted = get(a, "--topk-weights") != NULL;
    if (o.reduce_topk && op != MOE_GEMM_DX)
        die("--reduce-topk: only with --op dx");
    if (o.dw_fp32 && op != MOE_GEMM_DW)
        die("--dw-fp32: only with --op dw");
    /* the CUDA backend, as --backend cuda demands it */
#ifndef MOE_CLI_CUDA
    (void)cache, (void)N, (void)K, (void)seed, (void)weighted, (void)T;
    die("this build has no CUDA backend (configure --with-cuda where the CUDA toolkit is installed)");
#else
    require_cuda_device("", "");
    lib_call c = {"moe_gemm_autotune", MOE_BACKEND_CUDA, 0, {{0}}};
    const int64_t M = (int64_t)elements(T, k, 1);
    oracle_rng rng = {(uint64_t)seed};
    int64_t *ids = xmalloc(elements(M, 1, 1), sizeof(int64_t));
    oracle_topk_ids(&rng, T, k, E, ids); /* k <= E: checked above */
    int64_t *m_sizes = xmalloc(elements(E, 1, 1), sizeof(int64_t)), *gather = xmalloc(elements(M, 1, 1), sizeof(int64_t));
    moe_status st = moe_routing_from_topk(T, k, E, ids, m_sizes, gather, NULL);
    if (st != MOE_OK)
        library_failed("moe_routing_from_topk", st);
    const moe_routing host_routing = {T, k, E, m_sizes, gather};
    const moe_routing r = call_routing(&c, &host_routing);
    const size_t es = moe_dtype_size(o.dtype);
    /* a and b of the op (moe.h, moe_gemm_op): fwd x, w; dx dy, w; dw x, dy */
    const int64_t x_rows = o.permute_x ? T : M;
    const int64_t a_count = (int64_t)(op == MOE_GEMM_DX ? elements(M, N, 1) : elements(x_rows, K, 1));
    const int64_t b_count = (int64_t)(op == MOE_GEMM_DW ? elements(M, N, 1) : elements(E, N, K));
    const int64_t out_count = (int64_t)(op == MOE_GEMM_FWD ? elements(M, N, 1) : op == MOE_GEMM_DW ? elements(E, N, K)
                                        : elements(o.reduce_topk ? T : M, K, 1));
    const size_t out_es = op == MOE_GEMM_DW && o.dw_fp32 ? 4 : es;
    void *host_a = xmalloc((size_t)a_count, es), *host_b = xmalloc((size_t)b_count, es);
    void *host_tw = weighted ? xmalloc((size_t)M, es) : NULL;
    oracle_fill(&rng, o.dtype, host_a, a_count, 0);
    oracle_fill(&rng, o.dtype, host_b, b_count, 0);
    if (weighted)
        oracle_fill(&rng, o.dtype, host_tw, M, 0);
    const void *dev_a = call_in(&c, op == MOE_GEMM_DX ? "dy" : "x", host_a, (size_t)a_count * es);
    const void *dev_b = call_in(&c, op == MOE_GEMM_DW ? "dy" : "w", host_b, (size_t)b_count * es);
    const void *dev_tw = call_in(&c, "topk_weights", host_tw, (size_t)M * es);
    void *dev_out = to_device(&c, NULL, (size_t)out_count * out_es, "out");
    xfree(host_a), xfree(host_b);
    if (host_tw)
        xfree(host_tw);
    moe_gemm_tuning chosen;
    st = moe_gemm_autotune(op, &r, N, K, dev_a, dev_b, dev_tw, dev_out, &o, (int)repeats, cache, &chosen);
    call_end(&c, st);
    const double flops = 2.0 * (double)M * (double)N * (double)K;
    printf("%s E=%lld T=%lld k=%lld (M=%lld) N=%lld K=%lld %s: %d configurations timed; kept %s, tile rows %d, "
           "cluster %d, TMA store %d, dW ping-pong %d: median %.1f us (%.1f TFLOP/s); appended to %s\n",
           op_name, (long long)E, (long long)T, (long long)k, (long long)M, (long long)N, (long long)K,
           moe_dtype_name(o.dtype), chosen.candidates, chosen.kernel, chosen.tile_rows, chosen.cluster,
           chosen.tma_store, chosen.dw_pingpong, chosen.median_us, chosen.median_us > 0 ? flops / chosen.median_us / 1e6 : 0.0, cache);
    return 0;
#endif
}
