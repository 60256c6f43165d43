/* GPU grouped GEMM properties (skipped with exit 77 where no CUDA device is visible):
 *   1. every op x mode x dtype x option on random routings and shapes (N, K multiples of 8 for the
 *      tensor-core path and odd sizes for the fallback) agrees with the float64 oracle within its bound
 *      (every third trial on the sm80 family unless MOE_CUDA_KERNEL is set; f32 trials allow TF32 half of the
 *      time, which the oracle's bound then charges);
 *   2. on exactly representable data (small powers of two) the GPU equals the CPU reference bit for bit;
 *   3. running the same call twice gives bitwise the same output (determinism, dW included);
 *   4. invalid routings handed to the GPU are detected there, reported by moe_backend_synchronize with
 *      MOE_ERR_INVALID_ROUTING, and the output is left untouched;
 *   5. with --large: E*N*K past 2^31 elements (64-bit offsets; Unsloth's dW faults there), tokens on
 *      the last experts, sampled output elements of fwd, dX and dW checked against float64;
 *   6. (after the trials) many experts (up to 3000): on valid routings fwd and dX equal the reference on
 *      exact data; invalid size lists are reported as a walk over m_sizes in expert order finds them;
 *   7. (after the trials) dW isolates experts, with and without fused topk weights: Inf and NaN in one
 *      expert's rows of dY (and of X, in expert order) leave every other expert's dW bitwise unchanged,
 *      although an expert's last, partial k-step
 *      loads its neighbour's rows (the kernel must zero them in both operands: Inf * 0 is NaN);
 *   8. (after the trials) the Hopper kernel's race probe: fwd (X by TMA or gathered) and dX with TMA stores and
 *      experts of 100 rows or more give bitwise the same output when, through MOE_SM90_SKIP=32, its second
 *      consumer warpgroup issues each tile's last MMAs ~20 us late (so a warp of the first that reused
 *      shared memory the second still reads would corrupt the second's rows).  Skipped when the caller
 *      set MOE_SM90_SKIP; on other GPUs the probe changes nothing and the property holds trivially;
 *   9. (after the trials) the size thresholds of specs/THRESHOLDS.md's GPU GEMM rows, each crossed by a
 *      case on either side with the automatic rules, GPU == reference bit for bit on exact data (skipped
 *      when the caller sets a kernel override).
 * Outputs are poisoned with NaN before every call.  usage: test_gpu_gemm [--large] [seed] [trials] */
#include "moe.h"
#include "oracle.h"
#include "alloc.h"
#include "gpu_check.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum op { FWD, DX, DW, DTOPK, OPS };
static const char *const op_names[OPS] = {"fwd", "dx", "dw", "dtopk"};

typedef struct problem {
    moe_routing routing;       /* host arrays */
    moe_routing dev_routing;   /* device arrays */
    int64_t N, K, M, T, E;
    moe_gemm_options opt;
    const void *weights, *dev_weights;
    void *x, *w, *dy, *dev_x, *dev_w, *dev_dy;
} problem;

static int64_t out_count(const problem *p, enum op op)
{
    switch (op) {
    case FWD: return p->M * p->N;
    case DX: return (p->opt.reduce_topk ? p->T : p->M) * p->K;
    case DW: return p->E * p->N * p->K;
    default: return p->M;
    }
}

static moe_dtype out_dtype(const problem *p, enum op op)
{
    return (op == DW || op == DTOPK) && p->opt.dw_fp32 ? MOE_F32 : p->opt.dtype;
}

static moe_status call(const problem *p, enum op op, moe_backend backend, void *out)
{
    const int gpu = backend == MOE_BACKEND_CUDA;
    const moe_routing *r = gpu ? &p->dev_routing : &p->routing;
    const void *x = gpu ? p->dev_x : p->x, *w = gpu ? p->dev_w : p->w, *dy = gpu ? p->dev_dy : p->dy;
    const void *tw = gpu ? p->dev_weights : p->weights;
    switch (op) {
    case FWD: return moe_gemm_fwd(backend, r, p->N, p->K, x, w, tw, out, &p->opt);
    case DX: return moe_gemm_dx(backend, r, p->N, p->K, dy, w, tw, out, &p->opt);
    case DW: return moe_gemm_dw(backend, r, p->N, p->K, x, dy, tw, out, &p->opt);
    default: return moe_gemm_topk_weights_grad(backend, r, p->N, p->K, x, w, dy, out, &p->opt);
    }
}

static void oracle(const problem *p, enum op op, const void *old, double *value, double *bound)
{
    switch (op) {
    case FWD: oracle_gemm_fwd(&p->routing, p->N, p->K, p->x, p->w, p->weights, old, &p->opt, value, bound); break;
    case DX: oracle_gemm_dx(&p->routing, p->N, p->K, p->dy, p->w, p->weights, old, &p->opt, value, bound); break;
    case DW: /* the CUDA backend may split a bf16 row's w * dy into two terms */
        oracle_gemm_dw_split(&p->routing, p->N, p->K, p->x, p->dy, p->weights, old, &p->opt, value, bound);
        break;
    default: oracle_gemm_topk_weights_grad(&p->routing, p->N, p->K, p->x, p->w, p->dy, old, &p->opt, value, bound);
    }
}

/* Property 5: one bf16 problem with E*N*K = 64*4096*8200 > 2^31, every token on experts 62 and 63. */
static void large_offsets(oracle_rng *rng)
{
    const int64_t T = 512, k = 2, E = 64, N = 4096, K = 8200, M = T * k;
    printf("large: E*N*K = %lld elements (> 2^31 = %lld)\n", (long long)(E * N * K), 1LL << 31);
    int64_t *ids = xmalloc((size_t)M * 8), m_sizes[64], *gather = xmalloc((size_t)M * 8);
    for (int64_t t = 0; t < T; t++)
        ids[t * k] = E - 2, ids[t * k + 1] = E - 1;
    REQUIRE(moe_routing_from_topk(T, k, E, ids, m_sizes, gather, NULL) == MOE_OK, "%s", moe_last_error());
    uint16_t *x = xmalloc((size_t)(M * K) * 2), *dy = xmalloc((size_t)(M * N) * 2);
    oracle_fill(rng, MOE_BF16, x, M * K, 0);
    oracle_fill(rng, MOE_BF16, dy, M * N, 0);
    /* W: only experts 62 and 63 matter; the rest is a repeated random block (not zeros) */
    const int64_t w_count = E * N * K, block = 1 << 20;
    uint16_t *w_tail = xmalloc((size_t)(2 * N * K) * 2), *chunk = xmalloc((size_t)block * 2);
    oracle_fill(rng, MOE_BF16, w_tail, 2 * N * K, 0);
    oracle_fill(rng, MOE_BF16, chunk, block, 0);
    void *dev_w;
    CUDA_CHECK(cudaMalloc(&dev_w, (size_t)w_count * 2));
    for (int64_t first = 0; first < (E - 2) * N * K; first += block) {
        int64_t n = (E - 2) * N * K - first < block ? (E - 2) * N * K - first : block;
        CUDA_CHECK(cudaMemcpy((uint16_t *)dev_w + first, chunk, (size_t)n * 2, cudaMemcpyHostToDevice));
    }
    CUDA_CHECK(cudaMemcpy((uint16_t *)dev_w + (E - 2) * N * K, w_tail, (size_t)(2 * N * K) * 2, cudaMemcpyHostToDevice));
    void *dev_x = to_device(x, (size_t)(M * K) * 2), *dev_dy = to_device(dy, (size_t)(M * N) * 2);
    moe_routing r = {T, k, E, to_device(m_sizes, sizeof m_sizes), to_device(gather, (size_t)M * 8)};
    void *dev_out;
    CUDA_CHECK(cudaMalloc(&dev_out, (size_t)w_count * 2));
    moe_gemm_options o = {0};
    o.dtype = MOE_BF16;
    const int64_t row0 = M - m_sizes[E - 1] - m_sizes[E - 2]; /* expert E-2's first expert-order row */
    for (int op = FWD; op <= DW; op++) {
        const int64_t count = op == FWD ? M * N : op == DX ? M * K : w_count;
        CUDA_CHECK(cudaMemset(dev_out, 0xff, (size_t)count * 2)); /* NaN poison */
        moe_status st = op == FWD ? moe_gemm_fwd(MOE_BACKEND_CUDA, &r, N, K, dev_x, dev_w, NULL, dev_out, &o)
                      : op == DX ? moe_gemm_dx(MOE_BACKEND_CUDA, &r, N, K, dev_dy, dev_w, NULL, dev_out, &o)
                                 : moe_gemm_dw(MOE_BACKEND_CUDA, &r, N, K, dev_x, dev_dy, NULL, dev_out, &o);
        if (st == MOE_OK)
            st = moe_backend_synchronize(MOE_BACKEND_CUDA, NULL);
        REQUIRE(st == MOE_OK, "large %s: %s", op_names[op], moe_last_error());
        double worst = 0;
        for (int sample = 0; sample < 3000; sample++) {
            int64_t row, col, e, out_index;
            if (op == DW) { /* elements of experts 62 and 63, past 2^31 */
                e = E - 2 + (int64_t)oracle_rng_below(rng, 2);
                row = (int64_t)oracle_rng_below(rng, (uint64_t)N), col = (int64_t)oracle_rng_below(rng, (uint64_t)K);
                out_index = (e * N + row) * K + col;
            } else {
                row = row0 + (int64_t)oracle_rng_below(rng, (uint64_t)(M - row0));
                col = (int64_t)oracle_rng_below(rng, (uint64_t)(op == FWD ? N : K));
                e = row < row0 + m_sizes[E - 2] ? E - 2 : E - 1;
                out_index = row * (op == FWD ? N : K) + col;
            }
            const uint16_t *we = w_tail + (e - (E - 2)) * N * K;
            double sum = 0, magnitude = 0;
            int64_t length;
            if (op == FWD) {
                length = K;
                for (int64_t c = 0; c < K; c++) {
                    double term = (double)moe_bf16_to_f32(x[row * K + c]) * moe_bf16_to_f32(we[col * K + c]);
                    sum += term, magnitude += term < 0 ? -term : term;
                }
            } else if (op == DX) {
                length = N;
                for (int64_t n = 0; n < N; n++) {
                    double term = (double)moe_bf16_to_f32(dy[row * N + n]) * moe_bf16_to_f32(we[n * K + col]);
                    sum += term, magnitude += term < 0 ? -term : term;
                }
            } else {
                const int64_t first = e == E - 2 ? row0 : row0 + m_sizes[E - 2];
                length = m_sizes[e];
                for (int64_t q = first; q < first + m_sizes[e]; q++) {
                    double term = (double)moe_bf16_to_f32(dy[q * N + row]) * moe_bf16_to_f32(x[q * K + col]);
                    sum += term, magnitude += term < 0 ? -term : term;
                }
            }
            uint16_t got_bits;
            CUDA_CHECK(cudaMemcpy(&got_bits, (uint16_t *)dev_out + out_index, 2, cudaMemcpyDeviceToHost));
            const double got = moe_bf16_to_f32(got_bits), err = got > sum ? got - sum : sum - got;
            const double bound = oracle_gamma(length) * magnitude +
                                 oracle_output_rounding(MOE_BF16, (sum < 0 ? -sum : sum) + oracle_gamma(length) * magnitude) +
                                 (double)length * 0x1p-52 * magnitude;
            REQUIRE(err <= bound, "large %s: element %lld (row %lld col %lld expert %lld): got %.9g want %.17g bound %.3g",
                    op_names[op], (long long)out_index, (long long)row, (long long)col, (long long)e, got, sum, bound);
            if (err / bound > worst)
                worst = err / bound;
        }
        printf("large %s: 3000 sampled elements within bound (worst %.3f)\n", op_names[op], worst);
    }
    CUDA_CHECK(cudaFree(dev_w)); CUDA_CHECK(cudaFree(dev_x)); CUDA_CHECK(cudaFree(dev_dy)); CUDA_CHECK(cudaFree(dev_out));
    CUDA_CHECK(cudaFree((void *)r.m_sizes)); CUDA_CHECK(cudaFree((void *)r.gather_indices));
    free(ids), free(gather), free(x), free(dy), free(w_tail), free(chunk);
}

/* On Hopper, case i runs the kernel variant i % 4: the automatic choice (128-row tiles for these small K),
 * 128-row tiles, 128-row tiles paired in clusters of two CTAs, 256-row tiles (fwd and dX; dW has 128).  The
 * unpaired variants 1 and 3 take dynamic tiles (MOE_SM90_DYNAMIC=1; where every operand comes by TMA) when
 * i / 4 is even and static ones when it is odd; the automatic choice has them only for reductions of 4096 and
 * more, which these cases rarely reach.  Those variants also keep every tile as long (MOE_SM90_FULL_BLOCKS=1:
 * m64 blocks past the expert's rows issue their MMAs; automatic from 1024 rows per expert) when i / 8 is odd.  dW:
 * variants 0 and 2 take the automatic choice (the ping-pong kernel with at most 128 rows per expert on average,
 * else the 128 x 256 kernel), 1 and 3 the 128 x 256 kernel (MOE_SM90_DW_PINGPONG=0), 1 with its wide epilogue
 * where it applies, 3 without (MOE_SM90_DW_WIDE=0). */
static void pick_sm90_variant(int i)
{
    unsetenv("MOE_SM90_TILE_ROWS");
    unsetenv("MOE_SM90_CLUSTER");
    unsetenv("MOE_SM90_DW_PINGPONG");
    unsetenv("MOE_SM90_DW_WIDE");
    unsetenv("MOE_SM90_DYNAMIC");
    unsetenv("MOE_SM90_FULL_BLOCKS");
    if (i % 4 == 1 || i % 4 == 3)
        REQUIRE(setenv("MOE_SM90_DYNAMIC", i / 4 % 2 == 0 ? "1" : "0", 1) == 0, "setenv failed");
    if ((i % 4 == 1 || i % 4 == 3) && i / 8 % 2 == 1)
        REQUIRE(setenv("MOE_SM90_FULL_BLOCKS", "1", 1) == 0, "setenv failed");
    if (i % 4 == 1 || i % 4 == 2)
        REQUIRE(setenv("MOE_SM90_TILE_ROWS", "128", 1) == 0 && setenv("MOE_SM90_CLUSTER", i % 4 == 1 ? "1" : "2", 1) == 0,
                "setenv failed");
    else if (i % 4 == 3)
        REQUIRE(setenv("MOE_SM90_TILE_ROWS", "256", 1) == 0, "setenv failed");
    if (i % 2 == 1)
        REQUIRE(setenv("MOE_SM90_DW_PINGPONG", "0", 1) == 0, "setenv failed");
    if (i % 4 == 3)
        REQUIRE(setenv("MOE_SM90_DW_WIDE", "0", 1) == 0, "setenv failed");
}

/* Property 6: many experts (up to 3000: the device's size check scans 1024 experts per round).  Valid
 * routings: fwd and dX on exact data (small integers, K = N = 8: every sum exact) equal the CPU
 * reference bit for bit, which needs the right offsets and tile starts.  Invalid sizes: the device reports
 * what a walk over m_sizes in expert order finds first (a negative size, or the first prefix sum past
 * T*k, with the value it reached; else the total), sizes up to INT64_MAX included. */
static void expected_size_error(const int64_t *m, int64_t E, int64_t M, char *text, size_t cap)
{
    int64_t sum = 0;
    text[0] = '\0';
    for (int64_t e = 0; e < E; e++) {
        if (m[e] < 0) {
            snprintf(text, cap, "routing.m_sizes[%lld] = %lld, expected >= 0", (long long)e, (long long)m[e]);
            return;
        }
        if (m[e] > M - sum) {
            snprintf(text, cap, "routing.m_sizes[0..%lld] sums to %lld, expected T*k", (long long)e,
                     (long long)((unsigned long long)sum + (unsigned long long)m[e]));
            return;
        }
        sum += m[e];
    }
    if (sum != M)
        snprintf(text, cap, "routing.m_sizes[0..%lld] sums to %lld, expected T*k", (long long)E, (long long)sum);
}

static void many_experts(oracle_rng *rng, int cases, int cycle_variants)
{
    const int64_t N = 8, K = 8;
    int valid = 0, defects = 0;
    for (int c = 0; c < cases; c++) {
        if (cycle_variants)
            pick_sm90_variant(c);
        const int64_t E = 1 + (int64_t)oracle_rng_below(rng, oracle_rng_below(rng, 2) ? 3000 : 40);
        const int64_t T = 1 + (int64_t)oracle_rng_below(rng, 300), k = 1 + (int64_t)oracle_rng_below(rng, E < 8 ? (uint64_t)E : 8);
        const int64_t M = T * k;
        int64_t *m = xmalloc((size_t)E * 8), *gather = xmalloc((size_t)M * 8);
        memset(m, 0, (size_t)E * 8);
        const int64_t hot = (int64_t)oracle_rng_below(rng, (uint64_t)E); /* half the cases: most rows on one expert */
        const int skewed = (int)oracle_rng_below(rng, 2);
        for (int64_t r = 0; r < M; r++)
            m[skewed && oracle_rng_below(rng, 4) != 0 ? hot : (int64_t)oracle_rng_below(rng, (uint64_t)E)]++;
        for (int64_t r = 0; r < M; r++)
            gather[r] = r;
        const int kind = (int)oracle_rng_below(rng, 6); /* 0, 1 valid; 2 .. 5 a defect */
        const int64_t e = (int64_t)oracle_rng_below(rng, (uint64_t)E), e2 = (int64_t)oracle_rng_below(rng, (uint64_t)E);
        switch (kind) {
        case 2: m[e] = -1 - (int64_t)oracle_rng_below(rng, 5); break;                     /* negative */
        case 3: m[e] += 1 + (int64_t)oracle_rng_below(rng, 3); break;                     /* a prefix passes T*k */
        case 4: m[e] = INT64_MAX - (int64_t)oracle_rng_below(rng, 100); m[e2] = -1; break; /* huge, and a negative */
        case 5: if (m[e] > 0) m[e]--; else m[e] = -2; break;                               /* total short */
        default: break;
        }
        uint16_t *x = xmalloc((size_t)(M * K) * 2), *w = xmalloc((size_t)(E * N * K) * 2), *dy = xmalloc((size_t)(M * N) * 2);
        for (int64_t i = 0; i < M * K; i++)
            x[i] = moe_f32_to_bf16((float)((int)oracle_rng_below(rng, 5) - 2));
        for (int64_t i = 0; i < E * N * K; i++)
            w[i] = moe_f32_to_bf16((float)((int)oracle_rng_below(rng, 5) - 2));
        for (int64_t i = 0; i < M * N; i++)
            dy[i] = moe_f32_to_bf16((float)((int)oracle_rng_below(rng, 5) - 2));
        moe_routing host = {T, k, E, m, gather}, dev = host;
        dev.m_sizes = to_device(m, (size_t)E * 8);
        dev.gather_indices = to_device(gather, (size_t)M * 8);
        void *dev_x = to_device(x, (size_t)(M * K) * 2), *dev_w = to_device(w, (size_t)(E * N * K) * 2);
        void *dev_dy = to_device(dy, (size_t)(M * N) * 2);
        moe_gemm_options o = {0};
        o.dtype = MOE_BF16;
        o.permute_x = (int)oracle_rng_below(rng, 2);
        char want[160];
        expected_size_error(m, E, M, want, sizeof want);
        REQUIRE((kind < 2) == (want[0] == '\0'), "case %d: kind %d but the walk says '%s'", c, kind, want);
        const size_t out_bytes = (size_t)(M * (N > K ? N : K)) * 2;
        uint16_t *poison = xmalloc(out_bytes), *got = xmalloc(out_bytes), *ref = xmalloc(out_bytes);
        oracle_poison(MOE_BF16, poison, M * (N > K ? N : K));
        void *dev_out = to_device(poison, out_bytes);
        for (int op = FWD; op <= DX; op++) {
            CUDA_CHECK(cudaMemcpy(dev_out, poison, out_bytes, cudaMemcpyHostToDevice));
            moe_status st = op == FWD ? moe_gemm_fwd(MOE_BACKEND_CUDA, &dev, N, K, dev_x, dev_w, NULL, dev_out, &o)
                                      : moe_gemm_dx(MOE_BACKEND_CUDA, &dev, N, K, dev_dy, dev_w, NULL, dev_out, &o);
            REQUIRE(st == MOE_OK, "case %d %s: %s", c, op_names[op], moe_last_error());
            st = moe_backend_synchronize(MOE_BACKEND_CUDA, NULL);
            to_host(got, dev_out, out_bytes);
            if (want[0] != '\0') {
                REQUIRE(st == MOE_ERR_INVALID_ROUTING && strstr(moe_last_error(), want) != NULL,
                        "case %d %s (E=%lld M=%lld kind %d): got %s '%s', expected '%s'", c, op_names[op], (long long)E,
                        (long long)M, kind, moe_strerror(st), moe_last_error(), want);
                REQUIRE(memcmp(got, poison, out_bytes) == 0, "case %d %s: an invalid routing wrote output", c, op_names[op]);
                continue;
            }
            REQUIRE(st == MOE_OK, "case %d %s: %s", c, op_names[op], moe_last_error());
            memcpy(ref, poison, out_bytes);
            st = op == FWD ? moe_gemm_fwd(MOE_BACKEND_REF, &host, N, K, x, w, NULL, ref, &o)
                           : moe_gemm_dx(MOE_BACKEND_REF, &host, N, K, dy, w, NULL, ref, &o);
            REQUIRE(st == MOE_OK, "case %d %s (reference): %s", c, op_names[op], moe_last_error());
            REQUIRE(memcmp(got, ref, (size_t)(M * (op == FWD ? N : K)) * 2) == 0,
                    "case %d %s (E=%lld M=%lld): GPU differs from the reference on exact data", c, op_names[op],
                    (long long)E, (long long)M);
        }
        valid += want[0] == '\0';
        defects += want[0] != '\0';
        CUDA_CHECK(cudaFree(dev_out));
        CUDA_CHECK(cudaFree((void *)dev.m_sizes)); CUDA_CHECK(cudaFree((void *)dev.gather_indices));
        CUDA_CHECK(cudaFree(dev_x)); CUDA_CHECK(cudaFree(dev_w)); CUDA_CHECK(cudaFree(dev_dy));
        free(m), free(gather), free(x), free(w), free(dy), free(poison), free(got), free(ref);
    }
    printf("many experts: %d valid routings equal to the reference, %d invalid size lists reported as a walk "
           "finds them\n", valid, defects);
}

/* Sets every element of rows first .. first + count - 1 of a [rows][cols] 16-bit tensor to +Inf, -Inf or NaN. */
static void poison_rows(moe_dtype dtype, uint16_t *t, int64_t first, int64_t count, int64_t cols, oracle_rng *rng)
{
    const uint16_t inf = dtype == MOE_BF16 ? 0x7F80 : 0x7C00, nan = dtype == MOE_BF16 ? 0x7FC0 : 0x7E00;
    for (int64_t i = first * cols; i < (first + count) * cols; i++) {
        const int pick = (int)oracle_rng_below(rng, 3);
        t[i] = pick == 0 ? inf : pick == 1 ? (uint16_t)(inf | 0x8000) : nan;
    }
}

static void dw_isolation(oracle_rng *rng, int cases, int cycle_variants, const char *argv0, uint64_t seed, int trials)
{
    int checked = 0;
    for (int c = 0; c < cases; c++) {
        if (cycle_variants)
            pick_sm90_variant(c);
        const int64_t E = 2 + (int64_t)oracle_rng_below(rng, 7), T = 1 + (int64_t)oracle_rng_below(rng, 400);
        const int64_t k = 1 + (int64_t)oracle_rng_below(rng, E < 4 ? (uint64_t)E : 4), M = T * k;
        const int64_t N = 8 * (1 + (int64_t)oracle_rng_below(rng, 40)), K = 8 * (1 + (int64_t)oracle_rng_below(rng, 40));
        const moe_dtype dtype = oracle_rng_below(rng, 2) ? MOE_BF16 : MOE_F16;
        moe_gemm_options o = {0};
        o.dtype = dtype;
        o.permute_x = (int)oracle_rng_below(rng, 2); /* 0: dY and X by TMA; 1: X rows gathered (cp.async) */
        o.dw_fp32 = (int)oracle_rng_below(rng, 2);
        const int weighted = (int)oracle_rng_below(rng, 2); /* fused topk weights: the split kernels */
        int64_t *ids = xmalloc((size_t)M * 8), m[8] = {0}, *gather = xmalloc((size_t)M * 8);
        for (int64_t s = 0; s < M; s++)
            ids[s] = (int64_t)oracle_rng_below(rng, (uint64_t)E);
        REQUIRE(moe_routing_from_topk(T, k, E, ids, m, gather, NULL) == MOE_OK, "%s", moe_last_error());
        const int64_t bad = (int64_t)oracle_rng_below(rng, (uint64_t)E);
        int64_t first = 0;
        for (int64_t e = 0; e < bad; e++)
            first += m[e];
        const int64_t x_rows = o.permute_x ? T : M;
        uint16_t *x = xmalloc((size_t)(x_rows * K) * 2), *dy = xmalloc((size_t)(M * N) * 2), *tw = xmalloc((size_t)M * 2);
        oracle_fill(rng, dtype, x, x_rows * K, 0);
        oracle_fill(rng, dtype, dy, M * N, 0);
        oracle_fill(rng, dtype, tw, M, 0);
        moe_routing dev = {T, k, E, to_device(m, (size_t)E * 8), to_device(gather, (size_t)M * 8)};
        void *dev_x = to_device(x, (size_t)(x_rows * K) * 2), *dev_dy = to_device(dy, (size_t)(M * N) * 2);
        void *dev_tw = weighted ? to_device(tw, (size_t)M * 2) : NULL;
        const int64_t count = E * N * K;
        const size_t es = o.dw_fp32 ? 4 : 2, bytes = (size_t)count * es;
        void *poison = xmalloc(bytes), *clean = xmalloc(bytes), *dirty = xmalloc(bytes);
        oracle_poison(o.dw_fp32 ? MOE_F32 : dtype, poison, count);
        void *dev_out = to_device(poison, bytes);
        REQUIRE(moe_gemm_dw(MOE_BACKEND_CUDA, &dev, N, K, dev_x, dev_dy, dev_tw, dev_out, &o) == MOE_OK &&
                moe_backend_synchronize(MOE_BACKEND_CUDA, NULL) == MOE_OK, "dw isolation case %d: %s", c, moe_last_error());
        to_host(clean, dev_out, bytes);
        poison_rows(dtype, dy, first, m[bad], N, rng);
        if (!o.permute_x)
            poison_rows(dtype, x, first, m[bad], K, rng);
        CUDA_CHECK(cudaMemcpy(dev_dy, dy, (size_t)(M * N) * 2, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(dev_x, x, (size_t)(x_rows * K) * 2, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(dev_out, poison, bytes, cudaMemcpyHostToDevice));
        REQUIRE(moe_gemm_dw(MOE_BACKEND_CUDA, &dev, N, K, dev_x, dev_dy, dev_tw, dev_out, &o) == MOE_OK &&
                moe_backend_synchronize(MOE_BACKEND_CUDA, NULL) == MOE_OK, "dw isolation case %d: %s", c, moe_last_error());
        to_host(dirty, dev_out, bytes);
        const size_t slab = (size_t)(N * K) * es;
        for (int64_t e = 0; e < E; e++) {
            if (e == bad)
                continue;
            REQUIRE(memcmp((char *)clean + e * slab, (char *)dirty + e * slab, slab) == 0,
                    "FAIL dw isolation: Inf/NaN in the rows of expert %lld changed dW of expert %lld\n"
                    "  case %d: T=%lld k=%lld E=%lld N=%lld K=%lld dtype=%s permute_x=%d dw_fp32=%d weighted=%d "
                    "m_sizes[%lld]=%lld\n  replay: %s %llu %d",
                    (long long)bad, (long long)e, c, (long long)T, (long long)k, (long long)E, (long long)N, (long long)K,
                    moe_dtype_name(dtype), o.permute_x, o.dw_fp32, weighted, (long long)e, (long long)m[e], argv0,
                    (unsigned long long)seed, trials);
        }
        checked++;
        CUDA_CHECK(cudaFree(dev_out)); CUDA_CHECK(cudaFree(dev_x)); CUDA_CHECK(cudaFree(dev_dy));
        CUDA_CHECK(cudaFree(dev_tw)); /* NULL when not weighted */
        CUDA_CHECK(cudaFree((void *)dev.m_sizes)); CUDA_CHECK(cudaFree((void *)dev.gather_indices));
        free(ids), free(gather), free(x), free(dy), free(tw), free(poison), free(clean), free(dirty);
    }
    printf("dw isolation: %d cases, Inf/NaN rows of one expert left every other expert's dW bitwise unchanged\n",
           checked);
}

static void race_probe(oracle_rng *rng, int cases, int cycle_variants, const char *argv0, uint64_t seed, int trials)
{
    if (getenv("MOE_SM90_SKIP") != NULL) {
        printf("race probe: skipped (MOE_SM90_SKIP is set)\n");
        return;
    }
    static const int64_t dims[] = {128, 136, 256, 264}; /* two or more output boxes per warp and row group */
    for (int c = 0; c < cases; c++) {
        if (cycle_variants)
            pick_sm90_variant(c);
        const int64_t E = 1 + (int64_t)oracle_rng_below(rng, 3), k = 1 + (int64_t)oracle_rng_below(rng, E < 2 ? 1 : 2);
        const int64_t T = (100 + (int64_t)oracle_rng_below(rng, 300)) * E / k, M = T * k;
        const int64_t N = dims[oracle_rng_below(rng, 4)], K = dims[oracle_rng_below(rng, 4)];
        const moe_dtype dtype = oracle_rng_below(rng, 2) ? MOE_BF16 : MOE_F16;
        moe_gemm_options o = {0};
        o.dtype = dtype;
        o.permute_x = (int)oracle_rng_below(rng, 2); /* fwd: X rows gathered by the producers (cp.async) */
        const int weighted = (int)oracle_rng_below(rng, 2);
        int64_t *ids = xmalloc((size_t)M * 8), *m = xmalloc((size_t)E * 8), *gather = xmalloc((size_t)M * 8);
        oracle_topk_ids(rng, T, k, E, ids);
        REQUIRE(moe_routing_from_topk(T, k, E, ids, m, gather, NULL) == MOE_OK, "%s", moe_last_error());
        uint16_t *x = xmalloc((size_t)(M * K) * 2), *w = xmalloc((size_t)(E * N * K) * 2);
        uint16_t *dy = xmalloc((size_t)(M * N) * 2), *tw = xmalloc((size_t)M * 2);
        oracle_fill(rng, dtype, x, M * K, 0);
        oracle_fill(rng, dtype, w, E * N * K, 0);
        oracle_fill(rng, dtype, dy, M * N, 0);
        oracle_fill(rng, dtype, tw, M, 0);
        moe_routing dev = {T, k, E, to_device(m, (size_t)E * 8), to_device(gather, (size_t)M * 8)};
        void *dev_x = to_device(x, (size_t)(M * K) * 2), *dev_w = to_device(w, (size_t)(E * N * K) * 2);
        void *dev_dy = to_device(dy, (size_t)(M * N) * 2), *dev_tw = weighted ? to_device(tw, (size_t)M * 2) : NULL;
        const size_t bytes = (size_t)(M * (N > K ? N : K)) * 2;
        uint16_t *poison = xmalloc(bytes), *plain = xmalloc(bytes), *probed = xmalloc(bytes);
        oracle_poison(dtype, poison, M * (N > K ? N : K));
        void *dev_out = to_device(poison, bytes);
        for (int op = FWD; op <= DX; op++) {
            for (int probe = 0; probe < 2; probe++) {
                if (probe)
                    REQUIRE(setenv("MOE_SM90_SKIP", "32", 1) == 0, "setenv failed");
                CUDA_CHECK(cudaMemcpy(dev_out, poison, bytes, cudaMemcpyHostToDevice));
                const moe_status st =
                    op == FWD ? moe_gemm_fwd(MOE_BACKEND_CUDA, &dev, N, K, dev_x, dev_w, dev_tw, dev_out, &o)
                              : moe_gemm_dx(MOE_BACKEND_CUDA, &dev, N, K, dev_dy, dev_w, dev_tw, dev_out, &o);
                REQUIRE(st == MOE_OK && moe_backend_synchronize(MOE_BACKEND_CUDA, NULL) == MOE_OK,
                        "race probe case %d %s: %s", c, op_names[op], moe_last_error());
                unsetenv("MOE_SM90_SKIP");
                to_host(probe ? probed : plain, dev_out, bytes);
            }
            const int64_t count = M * (op == FWD ? N : K);
            int64_t first_difference = -1;
            for (int64_t i = 0; i < count && first_difference < 0; i++)
                if (plain[i] != probed[i])
                    first_difference = i;
            const int64_t cols = op == FWD ? N : K;
            REQUIRE(first_difference < 0,
                    "FAIL race probe: %s with a late second warpgroup differs from the plain run at element %lld (row "
                    "%lld col %lld)\n  case %d: T=%lld k=%lld E=%lld N=%lld K=%lld dtype=%s weighted=%d permute_x=%d\n"
                    "  replay: %s %llu %d",
                    op_names[op], (long long)first_difference, (long long)(first_difference / cols),
                    (long long)(first_difference % cols), c, (long long)T, (long long)k, (long long)E, (long long)N,
                    (long long)K, moe_dtype_name(dtype), weighted, o.permute_x, argv0, (unsigned long long)seed, trials);
        }
        CUDA_CHECK(cudaFree(dev_out)); CUDA_CHECK(cudaFree(dev_x)); CUDA_CHECK(cudaFree(dev_w));
        CUDA_CHECK(cudaFree(dev_dy)); CUDA_CHECK(cudaFree(dev_tw));
        CUDA_CHECK(cudaFree((void *)dev.m_sizes)); CUDA_CHECK(cudaFree((void *)dev.gather_indices));
        free(ids), free(m), free(gather), free(x), free(w), free(dy), free(tw), free(poison), free(plain), free(probed);
    }
    printf("race probe: %d cases, fwd and dX bitwise the same with the second warpgroup's last MMAs late\n", cases);
}

/* Property 9: the size thresholds of the CUDA GEMM (specs/THRESHOLDS.md), each crossed by a case on either
 * side with the automatic rules (no MOE_SM90_* or MOE_CUDA_KERNEL override; MOE_SM90_GRID only where it is the
 * point), on exact data, where the GPU must equal the CPU reference bit for bit. */
typedef struct threshold_case {
    const char *what;             /* the threshold and the side this case is on */
    unsigned ops;                 /* 1 << FWD | 1 << DX | ... */
    int64_t T, k, E, N, K;
    int permute_y, reduce_topk;
    const char *env, *value;      /* an environment variable set for the case (MOE_SM90_GRID, ...), or NULL */
} threshold_case;

static const threshold_case threshold_cases[] = {
    {"H_DYNAMIC_REDUCTION: fwd K = 4088, below", 1u << FWD, 64, 1, 1, 8, 4088, 0, 0, NULL, NULL},
    {"H_DYNAMIC_REDUCTION: fwd K = 4096, at", 1u << FWD, 64, 1, 1, 8, 4096, 0, 0, NULL, NULL},
    {"H_DYNAMIC_REDUCTION: dX N = 4088, below", 1u << DX, 64, 1, 1, 4088, 8, 0, 0, NULL, NULL},
    {"H_DYNAMIC_REDUCTION: dX N = 4096, at", 1u << DX, 64, 1, 1, 4096, 8, 0, 0, NULL, NULL},
    {"H_PAIRED_ROWS: fwd K = 4096, 2047 rows per expert, below", 1u << FWD, 2047, 1, 1, 8, 4096, 0, 0, NULL, NULL},
    {"H_PAIRED_ROWS: fwd K = 4096, 2048 rows per expert, at", 1u << FWD, 2048, 1, 1, 8, 4096, 0, 0, NULL, NULL},
    {"H_FULL_BLOCK_ROWS: 1023 rows per expert, below", 1u << FWD | 1u << DX, 1023, 1, 1, 8, 8, 0, 0, NULL, NULL},
    {"H_FULL_BLOCK_ROWS: 1030 rows per expert (a partial last tile), above", 1u << FWD | 1u << DX, 1030, 1, 1, 8, 8,
     0, 0, NULL, NULL},
    {"gather bitmap: M = 32736 (1024 words), below", 1u << FWD, 16368, 2, 4, 8, 8, 1, 0, NULL, NULL},
    {"gather bitmap: M = 40000 (1251 words, two zeroing rounds), above", 1u << FWD, 20000, 2, 4, 8, 8, 1, 0, NULL, NULL},
    {"gather bitmap: M = 40000 again, another routing (no stale bits)", 1u << FWD, 20000, 2, 4, 8, 8, 1, 0, NULL, NULL},
    {"reduce_topk grid stride: T*K = 262144, one pass", 1u << DX, 1024, 2, 3, 8, 256, 0, 1, NULL, NULL},
    {"reduce_topk grid stride: T*K = 262400, a second pass", 1u << DX, 1025, 2, 3, 8, 256, 0, 1, NULL, NULL},
    {"topk-grad partials grid stride: M = 262144, one pass", 1u << DTOPK, 131072, 2, 3, 8, 8, 0, 0, NULL, NULL},
    {"topk-grad partials grid stride: M = 262146, a second pass", 1u << DTOPK, 131073, 2, 3, 8, 8, 0, 0, NULL, NULL},
    {"MOE_SM90_GRID = 1: one CTA takes every tile", 1u << FWD | 1u << DX | 1u << DW, 300, 2, 3, 136, 136, 0, 0,
     "MOE_SM90_GRID", "1"},
    {"MOE_SM90_GRID = 3: three CTAs", 1u << FWD | 1u << DX | 1u << DW, 300, 2, 3, 136, 136, 0, 0, "MOE_SM90_GRID", "3"},
    /* the tensor-map limit (2^31 elements a dimension) lowered: rows past it lose their row maps (gathered
     * loads, register stores), a W dimension past it sends the call to the sm80 family */
    {"TMA dimension limit: 600 rows past it", 1u << FWD | 1u << DX | 1u << DW, 300, 2, 3, 136, 136, 0, 0,
     "MOE_SM90_TMA_MAX_DIM", "512"},
    {"TMA dimension limit: W's K past it (the sm80 family)", 1u << FWD | 1u << DX | 1u << DW, 300, 2, 3, 136, 136, 0,
     0, "MOE_SM90_TMA_MAX_DIM", "128"},
};

static void threshold_case_run(oracle_rng *rng, const threshold_case *tc)
{
    problem p;
    memset(&p, 0, sizeof p);
    p.T = tc->T, p.E = tc->E, p.N = tc->N, p.K = tc->K, p.M = tc->T * tc->k;
    p.opt.dtype = MOE_BF16;
    p.opt.permute_y = tc->permute_y;
    int64_t *ids = xmalloc((size_t)p.M * 8), *m = xmalloc((size_t)p.E * 8), *gather = xmalloc((size_t)p.M * 8);
    oracle_topk_ids(rng, p.T, tc->k, p.E, ids);
    REQUIRE(moe_routing_from_topk(p.T, tc->k, p.E, ids, m, gather, NULL) == MOE_OK, "%s", moe_last_error());
    p.routing = (moe_routing){p.T, tc->k, p.E, m, gather};
    p.dev_routing = (moe_routing){p.T, tc->k, p.E, to_device(m, (size_t)p.E * 8), to_device(gather, (size_t)p.M * 8)};
    p.x = xmalloc((size_t)(p.M * p.K) * 2), p.w = xmalloc((size_t)(p.E * p.N * p.K) * 2), p.dy = xmalloc((size_t)(p.M * p.N) * 2);
    oracle_fill(rng, MOE_BF16, p.x, p.M * p.K, 1);
    oracle_fill(rng, MOE_BF16, p.w, p.E * p.N * p.K, 1);
    oracle_fill(rng, MOE_BF16, p.dy, p.M * p.N, 1);
    p.dev_x = to_device(p.x, (size_t)(p.M * p.K) * 2), p.dev_w = to_device(p.w, (size_t)(p.E * p.N * p.K) * 2);
    p.dev_dy = to_device(p.dy, (size_t)(p.M * p.N) * 2);
    if (tc->env)
        REQUIRE(setenv(tc->env, tc->value, 1) == 0, "setenv failed");
    for (int op = 0; op < OPS; op++) {
        if (!(tc->ops & 1u << op))
            continue;
        p.opt.reduce_topk = op == DX && tc->reduce_topk;
        const int64_t count = out_count(&p, op);
        const size_t bytes = (size_t)count * moe_dtype_size(out_dtype(&p, op));
        void *poison = xmalloc(bytes), *gpu = xmalloc(bytes), *ref = xmalloc(bytes);
        oracle_poison(out_dtype(&p, op), poison, count);
        void *dev_out = to_device(poison, bytes);
        moe_status st = call(&p, op, MOE_BACKEND_CUDA, dev_out);
        if (st == MOE_OK)
            st = moe_backend_synchronize(MOE_BACKEND_CUDA, NULL);
        REQUIRE(st == MOE_OK, "thresholds: %s: %s: %s", tc->what, op_names[op], moe_last_error());
        to_host(gpu, dev_out, bytes);
        memcpy(ref, poison, bytes);
        REQUIRE(call(&p, op, MOE_BACKEND_REF, ref) == MOE_OK, "thresholds: %s: %s (reference): %s", tc->what,
                op_names[op], moe_last_error());
        int64_t first = -1;
        const size_t es = moe_dtype_size(out_dtype(&p, op));
        for (int64_t i = 0; i < count && first < 0; i++)
            if (memcmp((char *)gpu + (size_t)i * es, (char *)ref + (size_t)i * es, es) != 0)
                first = i;
        REQUIRE(first < 0, "FAIL thresholds: %s: %s differs from the reference on exact data at element %lld: %.9g vs %.9g",
                tc->what, op_names[op], (long long)first, oracle_load(out_dtype(&p, op), gpu, first),
                oracle_load(out_dtype(&p, op), ref, first));
        CUDA_CHECK(cudaFree(dev_out));
        free(poison), free(gpu), free(ref);
    }
    if (tc->env)
        unsetenv(tc->env);
    CUDA_CHECK(cudaFree((void *)p.dev_routing.m_sizes)); CUDA_CHECK(cudaFree((void *)p.dev_routing.gather_indices));
    CUDA_CHECK(cudaFree(p.dev_x)); CUDA_CHECK(cudaFree(p.dev_w)); CUDA_CHECK(cudaFree(p.dev_dy));
    free(ids), free(m), free(gather), free(p.x), free(p.w), free(p.dy);
}

/* A bf16 forward of one expert's 8 rows of zeros, N = K = dim, into a poisoned y, under the caller's environment:
 * requires status `want` with `fragment` in the message, and y untouched (a refused call writes nothing). */
static void fwd_refused(const char *what, int64_t dim, moe_status want, const char *fragment)
{
    const int64_t M = 8;
    int64_t m[1] = {M}, gather[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    const moe_routing dev = {M, 1, 1, to_device(m, 8), to_device(gather, (size_t)M * 8)};
    uint16_t *zeros = calloc((size_t)(dim * dim), 2), *poison = malloc((size_t)(M * dim) * 2);
    uint16_t *back = malloc((size_t)(M * dim) * 2);
    REQUIRE(zeros != NULL && poison != NULL && back != NULL, "out of memory");
    void *x = to_device(zeros, (size_t)(M * dim) * 2), *w = to_device(zeros, (size_t)(dim * dim) * 2);
    oracle_poison(MOE_BF16, poison, M * dim);
    void *y = to_device(poison, (size_t)(M * dim) * 2);
    moe_gemm_options o = {0};
    o.dtype = MOE_BF16;
    const moe_status st = moe_gemm_fwd(MOE_BACKEND_CUDA, &dev, dim, dim, x, w, NULL, y, &o);
    REQUIRE(st == want && strstr(moe_last_error(), fragment) != NULL, "FAIL %s: %s (%s), expected %s with \"%s\"", what,
            moe_strerror(st), moe_last_error(), moe_strerror(want), fragment);
    REQUIRE(moe_backend_synchronize(MOE_BACKEND_CUDA, NULL) == MOE_OK, "%s", moe_last_error());
    to_host(back, y, (size_t)(M * dim) * 2);
    REQUIRE(memcmp(back, poison, (size_t)(M * dim) * 2) == 0, "FAIL %s: the refused call wrote its output", what);
    CUDA_CHECK(cudaFree((void *)dev.m_sizes)); CUDA_CHECK(cudaFree((void *)dev.gather_indices));
    CUDA_CHECK(cudaFree(x)); CUDA_CHECK(cudaFree(w)); CUDA_CHECK(cudaFree(y));
    free(zeros), free(poison), free(back);
}

static void thresholds(oracle_rng *rng, int automatic)
{
    if (!automatic || getenv("MOE_SM90_GRID") != NULL) {
        printf("thresholds: skipped (the caller set a MOE_SM90_* or MOE_CUDA_KERNEL override)\n");
        return;
    }
    pick_sm90_variant(0); /* variant 0: no override */
    unsetenv("MOE_CUDA_KERNEL");
    const size_t n = sizeof threshold_cases / sizeof threshold_cases[0];
    for (size_t i = 0; i < n; i++)
        threshold_case_run(rng, &threshold_cases[i]);
    /* with the Hopper family forced, a refused W map is an error, not a fallback (sm_90 devices) */
    int device = 0;
    struct cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    if (prop.major == 9) {
        REQUIRE(setenv("MOE_SM90_TMA_MAX_DIM", "128", 1) == 0 && setenv("MOE_CUDA_KERNEL", "sm90", 1) == 0, "setenv failed");
        fwd_refused("thresholds: MOE_CUDA_KERNEL=sm90 with W past the TMA limit", 136, MOE_ERR_DEVICE,
                    "TMA descriptors were refused");
        unsetenv("MOE_SM90_TMA_MAX_DIM");
        unsetenv("MOE_CUDA_KERNEL");
    }
    printf("thresholds: %zu cases on both sides of the GEMM's size thresholds equal the reference bit for bit\n", n);
}

/* An unknown MOE_CUDA_KERNEL value fails the call with MOE_ERR_INVALID_OPTION naming it, and writes nothing
 * (gpu/gemm/heuristics.cu, kernel_override), instead of running the automatic choice. */
static void unknown_kernel_override(int automatic)
{
    if (!automatic) {
        printf("unknown override: skipped (the caller set MOE_CUDA_KERNEL)\n");
        return;
    }
    REQUIRE(setenv("MOE_CUDA_KERNEL", "sm9O", 1) == 0, "setenv failed");
    fwd_refused("unknown override: MOE_CUDA_KERNEL=sm9O", 16, MOE_ERR_INVALID_OPTION, "MOE_CUDA_KERNEL=\"sm9O\"");
    unsetenv("MOE_CUDA_KERNEL");
    printf("unknown override: MOE_CUDA_KERNEL=sm9O refused with MOE_ERR_INVALID_OPTION, nothing written\n");
}

static int64_t pick_dim(oracle_rng *rng)
{
    static const int64_t dims[] = {0, 8, 16, 24, 120, 128, 136, 256, 264, 1, 3, 13, 72};
    return dims[oracle_rng_below(rng, sizeof dims / sizeof dims[0])];
}

int main(int argc, char **argv)
{
    const int large = argc > 1 && strcmp(argv[1], "--large") == 0;
    if (large)
        argc--, argv++;
    const uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 20261122;
    const int trials = argc > 2 ? atoi(argv[2]) : 120;
    printf("seed %llu, %d trials\n", (unsigned long long)seed, trials);
    if (!moe_backend_available(MOE_BACKEND_CUDA)) {
        printf("SKIP: no CUDA backend or device (%s)\n", moe_last_error());
        return 77;
    }
    oracle_rng rng = {seed};
    if (large) {
        large_offsets(&rng);
        return 0;
    }
    int64_t checked = 0;
    double worst = 0;
    /* the kernel variants cycle (pick_sm90_variant) unless the caller sets MOE_SM90_TILE_ROWS, MOE_SM90_CLUSTER,
     * MOE_SM90_DW_PINGPONG, MOE_SM90_DW_WIDE, MOE_SM90_DYNAMIC or MOE_SM90_FULL_BLOCKS */
    const int cycle_variants = getenv("MOE_SM90_TILE_ROWS") == NULL && getenv("MOE_SM90_CLUSTER") == NULL &&
                               getenv("MOE_SM90_DW_PINGPONG") == NULL && getenv("MOE_SM90_DW_WIDE") == NULL &&
                               getenv("MOE_SM90_DYNAMIC") == NULL && getenv("MOE_SM90_FULL_BLOCKS") == NULL;
    /* The automatic choice sends fwd, dX and dW to the Hopper kernels on an sm_90 device; unless the caller set
     * MOE_CUDA_KERNEL, every third trial forces the sm80 family (what Ampere and Ada run), so that one device
     * checks both (a function of the trial number: the replay line reproduces it). */
    const int cycle_family = getenv("MOE_CUDA_KERNEL") == NULL;
    int sm80_trials = 0, tf32_trials = 0;
    for (int trial = 0; trial < trials; trial++) {
        problem p;
        memset(&p, 0, sizeof p);
        if (cycle_variants)
            pick_sm90_variant(trial);
        if (cycle_family && trial % 3 == 2) {
            REQUIRE(setenv("MOE_CUDA_KERNEL", "sm80", 1) == 0, "setenv failed");
            sm80_trials++;
        } else if (cycle_family) {
            unsetenv("MOE_CUDA_KERNEL");
        }
        p.T = (int64_t)oracle_rng_below(&rng, 4) == 0 ? (int64_t)oracle_rng_below(&rng, 3) : 1 + (int64_t)oracle_rng_below(&rng, 300);
        const int64_t k = 1 + (int64_t)oracle_rng_below(&rng, 4);
        p.E = 1 + (int64_t)oracle_rng_below(&rng, 12);
        p.N = pick_dim(&rng), p.K = pick_dim(&rng), p.M = p.T * k;
        p.opt.dtype = (moe_dtype)oracle_rng_below(&rng, 3);
        p.opt.permute_x = (int)oracle_rng_below(&rng, 2);
        p.opt.permute_y = (int)oracle_rng_below(&rng, 2);
        p.opt.accumulate = (int)oracle_rng_below(&rng, 3) == 0;
        p.opt.dw_fp32 = (int)oracle_rng_below(&rng, 2);
        p.opt.allow_tf32 = p.opt.dtype == MOE_F32 && (int)oracle_rng_below(&rng, 2); /* the TF32 kernel */
        tf32_trials += p.opt.allow_tf32;
        const int use_weights = (int)oracle_rng_below(&rng, 2);
        const int distribution = (int)oracle_rng_below(&rng, 3);
        const int skew = (int)oracle_rng_below(&rng, 3); /* 0 uniform, 1 one hot expert, 2 even experts only */
        const size_t es = moe_dtype_size(p.opt.dtype);

        int64_t *ids = xmalloc((size_t)p.M * 8), *m_sizes = xmalloc((size_t)p.E * 8), *gather = xmalloc((size_t)p.M * 8);
        for (int64_t s = 0; s < p.M; s++) {
            int64_t e = (int64_t)oracle_rng_below(&rng, (uint64_t)p.E);
            ids[s] = skew == 1 ? p.E - 1 : skew == 2 ? e & ~(int64_t)1 : e;
        }
        REQUIRE(moe_routing_from_topk(p.T, k, p.E, ids, m_sizes, gather, NULL) == MOE_OK, "%s", moe_last_error());
        p.routing = (moe_routing){p.T, k, p.E, m_sizes, gather};
        p.dev_routing = (moe_routing){p.T, k, p.E, to_device(m_sizes, (size_t)p.E * 8), to_device(gather, (size_t)p.M * 8)};

        const int64_t x_rows = p.opt.permute_x ? p.T : p.M;
        p.x = xmalloc((size_t)(x_rows * p.K) * es), p.w = xmalloc((size_t)(p.E * p.N * p.K) * es);
        p.dy = xmalloc((size_t)(p.M * p.N) * es);
        void *tw = xmalloc((size_t)p.M * es);
        oracle_fill(&rng, p.opt.dtype, p.x, x_rows * p.K, distribution);
        oracle_fill(&rng, p.opt.dtype, p.w, p.E * p.N * p.K, distribution);
        oracle_fill(&rng, p.opt.dtype, p.dy, p.M * p.N, distribution);
        oracle_fill(&rng, p.opt.dtype, tw, p.M, distribution);
        p.dev_x = to_device(p.x, (size_t)(x_rows * p.K) * es), p.dev_w = to_device(p.w, (size_t)(p.E * p.N * p.K) * es);
        p.dev_dy = to_device(p.dy, (size_t)(p.M * p.N) * es);
        void *dev_tw = to_device(tw, (size_t)p.M * es);
        p.weights = use_weights ? tw : NULL;
        p.dev_weights = use_weights ? dev_tw : NULL;

        for (int op = 0; op < OPS; op++) {
            p.opt.reduce_topk = op == DX ? (int)oracle_rng_below(&rng, 2) : 0;
            const int64_t count = out_count(&p, op);
            const moe_dtype odt = out_dtype(&p, op);
            const size_t bytes = (size_t)count * moe_dtype_size(odt);
            void *old = xmalloc(bytes), *gpu = xmalloc(bytes), *again = xmalloc(bytes), *ref = xmalloc(bytes);
            if (p.opt.accumulate)
                oracle_fill(&rng, odt, old, count, 0);
            else
                oracle_poison(odt, old, count);
            void *dev_out = to_device(old, bytes);
            moe_status st = call(&p, op, MOE_BACKEND_CUDA, dev_out);
            if (st == MOE_OK)
                st = moe_backend_synchronize(MOE_BACKEND_CUDA, NULL);
            REQUIRE(st == MOE_OK, "trial %d %s: %s", trial, op_names[op], moe_last_error());
            to_host(gpu, dev_out, bytes);
            /* determinism: the same call on the same old contents */
            CUDA_CHECK(cudaMemcpy(dev_out, old, bytes, cudaMemcpyHostToDevice));
            REQUIRE(call(&p, op, MOE_BACKEND_CUDA, dev_out) == MOE_OK, "%s", moe_last_error());
            REQUIRE(moe_backend_synchronize(MOE_BACKEND_CUDA, NULL) == MOE_OK, "%s", moe_last_error());
            to_host(again, dev_out, bytes);

            double *value = xmalloc((size_t)count * 8 + 8), *bound = xmalloc((size_t)count * 8 + 8);
            oracle(&p, op, old, value, bound);
            double ratio = 0;
            int64_t bad = oracle_compare(op_names[op], odt, gpu, value, bound, count, stderr, 4, &ratio);
            int nondeterministic = memcmp(gpu, again, bytes) != 0;
            int differs_exact = 0;
            if (distribution == 1) { /* exact data: bit for bit the reference */
                memcpy(ref, old, bytes);
                REQUIRE(call(&p, op, MOE_BACKEND_REF, ref) == MOE_OK, "%s", moe_last_error());
                differs_exact = memcmp(gpu, ref, bytes) != 0;
            }
            REQUIRE(bad == 0 && !nondeterministic && !differs_exact,
                    "FAIL %s: %lld outside bound, nondeterministic=%d, differs-from-ref-on-exact-data=%d\n"
                    "  case: T=%lld k=%lld E=%lld N=%lld K=%lld dtype=%s permute_x=%d permute_y=%d accumulate=%d "
                    "dw_fp32=%d weights=%d reduce_topk=%d allow_tf32=%d dist=%d skew=%d\n  replay: %s %llu %d",
                    op_names[op], (long long)bad, nondeterministic, differs_exact, (long long)p.T, (long long)k,
                    (long long)p.E, (long long)p.N, (long long)p.K, moe_dtype_name(p.opt.dtype), p.opt.permute_x,
                    p.opt.permute_y, p.opt.accumulate, p.opt.dw_fp32, use_weights, p.opt.reduce_topk, p.opt.allow_tf32,
                    distribution, skew, argv[0], (unsigned long long)seed, trial + 1);
            if (ratio > worst)
                worst = ratio;
            checked += count;
            CUDA_CHECK(cudaFree(dev_out));
            free(old), free(gpu), free(again), free(ref), free(value), free(bound);
        }

        /* invalid routing on the device: a size off by one, then a repeated gather entry */
        if (p.M > 1 && p.N > 0 && p.K > 0) {
            const size_t bytes = (size_t)(p.M * p.N) * es;
            void *poison = xmalloc(bytes), *back = xmalloc(bytes);
            oracle_poison(p.opt.dtype, poison, p.M * p.N);
            void *dev_out = to_device(poison, bytes);
            int64_t *bad_sizes = xmalloc((size_t)p.E * 8), *bad_gather = xmalloc((size_t)p.M * 8);
            memcpy(bad_sizes, m_sizes, (size_t)p.E * 8);
            bad_sizes[p.E - 1] += 1;
            memcpy(bad_gather, gather, (size_t)p.M * 8);
            bad_gather[p.M - 1] = bad_gather[0];
            for (int variant = 0; variant < 2; variant++) {
                moe_routing r = p.dev_routing;
                void *dev_bad = to_device(variant == 0 ? (void *)bad_sizes : (void *)bad_gather,
                                          variant == 0 ? (size_t)p.E * 8 : (size_t)p.M * 8);
                if (variant == 0)
                    r.m_sizes = dev_bad;
                else
                    r.gather_indices = dev_bad;
                moe_gemm_options o = p.opt;
                o.permute_y = 1; /* gather needed */
                o.accumulate = 0;
                REQUIRE(moe_gemm_fwd(MOE_BACKEND_CUDA, &r, p.N, p.K, p.dev_x, p.dev_w, NULL, dev_out, &o) == MOE_OK,
                        "%s", moe_last_error());
                moe_status st = moe_backend_synchronize(MOE_BACKEND_CUDA, NULL);
                REQUIRE(st == MOE_ERR_INVALID_ROUTING, "trial %d: bad routing variant %d gave %s (%s)", trial, variant,
                        moe_strerror(st), moe_last_error());
                REQUIRE(strstr(moe_last_error(), variant == 0 ? "m_sizes" : "gather_indices") != NULL, "message: %s",
                        moe_last_error());
                to_host(back, dev_out, bytes);
                REQUIRE(memcmp(back, poison, bytes) == 0, "trial %d: bad routing variant %d wrote output", trial, variant);
                CUDA_CHECK(cudaFree(dev_bad));
            }
            CUDA_CHECK(cudaFree(dev_out));
            free(poison), free(back), free(bad_sizes), free(bad_gather);
        }

        CUDA_CHECK(cudaFree((void *)p.dev_routing.m_sizes));
        CUDA_CHECK(cudaFree((void *)p.dev_routing.gather_indices));
        CUDA_CHECK(cudaFree(p.dev_x)); CUDA_CHECK(cudaFree(p.dev_w)); CUDA_CHECK(cudaFree(p.dev_dy)); CUDA_CHECK(cudaFree(dev_tw));
        free(ids), free(m_sizes), free(gather), free(p.x), free(p.w), free(p.dy), free(tw);
    }
    char families[64];
    if (cycle_family) {
        unsetenv("MOE_CUDA_KERNEL");
        snprintf(families, sizeof families, "%d of them with MOE_CUDA_KERNEL=sm80", sm80_trials);
    } else {
        snprintf(families, sizeof families, "MOE_CUDA_KERNEL=%s", getenv("MOE_CUDA_KERNEL"));
    }
    printf("%d trials passed (%s; %d f32 trials allowed TF32): %lld output elements checked, worst error %.3f of its "
           "bound\n", trials, families, tf32_trials, (long long)checked, worst);
    many_experts(&rng, trials / 2 > 12 ? trials / 2 : 12, cycle_variants);
    dw_isolation(&rng, trials / 4 > 8 ? trials / 4 : 8, cycle_variants, argv[0], seed, trials);
    race_probe(&rng, trials / 6 > 8 ? trials / 6 : 8, cycle_variants, argv[0], seed, trials);
    thresholds(&rng, cycle_variants && cycle_family);
    unknown_kernel_override(cycle_family);
    return 0;
}
