/* ref-bench: every grouped GEMM op of the CPU reference on a real model shape, timed and checked.
 *
 *   ./bench/ref-bench --model qwen3-30b-a3b --tokens 256
 *
 * It builds a random top-k routing (each token picks k distinct experts uniformly; seeded, the seed is
 * printed first), random inputs (uniform in [-1, 1), rounded to the dtype) and runs fwd, dX, dW and the
 * topk-weight gradient in the modes Unsloth uses for that projection (SEMANTICS section 2):
 *
 *   gate_up (N = 2I, K = H)  X is token order; the forward gathers it (permute_x).  dX is summed over
 *                            each token's k slots in the kernel (reduce_topk) and written [T][K].
 *   down    (N = H, K = I)   X is expert order; the forward scatters Y to slot order and fuses the
 *                            routing weights (permute_y + topk weights).
 *
 * Each op runs --repeat times; the median wall-clock time gives GFLOP/s = 2 M N K / time.  cpu/wall
 * (the median of process CPU time / wall time per run) is about the thread count on an idle machine;
 * less means the threads waited for cores (other load) or for each other.  Then a random
 * sample of each op's output elements is checked against the float64 oracle bound of SEMANTICS
 * section 4, computed here for the sampled elements only (oracle_gamma, oracle_output_rounding: the
 * same bound as oracle/oracle.c; the full oracle would take longer than the ops).  The worst
 * |error| / bound is printed with PASS or FAIL; the exit status is 1 on any failure.
 *
 * --twin naive times the naive twins (ref/gemm_naive.c) by calling them directly; the default goes
 * through the public API with MOE_BACKEND_REF, i.e. the blocked twins (ref/gemm/).
 */
#include "moe.h"
#include "moe_ref.h"
#include "oracle.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef _OPENMP
#define BENCH_OMP(directive) _Pragma(#directive)
#else
#define BENCH_OMP(directive)
#endif

typedef struct model {
    const char *name;
    int64_t E, k, H, I;
} model;

/* SEMANTICS section 5 */
static const model models[] = {
    {"qwen3-30b-a3b", 128, 8, 2048, 768},  {"qwen3-235b-a22b", 128, 8, 4096, 1536},
    {"mixtral-8x7b", 8, 2, 4096, 14336},   {"deepseek-v3", 256, 8, 7168, 2048},
    {"llama-4-scout", 16, 1, 5120, 8192},  {"gpt-oss-120b", 128, 4, 2880, 2880},
};
#define MODEL_COUNT ((int)(sizeof models / sizeof models[0]))

enum op { OP_FWD, OP_DX, OP_DW, OP_TOPK, OP_COUNT };
static const char *const op_names[OP_COUNT] = {"fwd", "dx", "dw", "topk_grad"};

typedef struct options {
    const model *model;
    int64_t tokens;
    int down;          /* 0: gate_up, 1: down */
    moe_dtype dtype;
    int threads;       /* 0: OpenMP default */
    int repeat;
    uint64_t seed;
    int have_seed;
    int naive;
    int dw_fp32;
    int samples;
    int run[OP_COUNT];
} options;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ref-bench [options]\n"
            "  Times every grouped GEMM op of the CPU reference on a real model shape and checks a sample of\n"
            "  each output against the float64 oracle bound (SEMANTICS sections 2, 4, 5).\n"
            "  --model NAME      qwen3-30b-a3b (default), qwen3-235b-a22b, mixtral-8x7b, deepseek-v3,\n"
            "                    llama-4-scout, gpt-oss-120b\n"
            "  --tokens T        tokens (default 256); M = T * topk routed rows\n"
            "  --gemm G          gate_up (default: N = 2I, K = H, fwd with permute_x, dX with reduce_topk)\n"
            "                    or down (N = H, K = I, permute_y with fused topk weights)\n"
            "  --dtype D         bf16 (default), f16 or f32\n"
            "  --threads N       OpenMP threads (default: OpenMP's default)\n"
            "  --repeat R        timed runs per op; the median is reported (default 3)\n"
            "  --seed S          routing and data seed (default: from the clock; printed first)\n"
            "  --twin W          blocked (default: the public API, MOE_BACKEND_REF) or naive (the naive\n"
            "                    twins of ref/gemm_naive.c, called directly)\n"
            "  --naive           same as --twin naive\n"
            "  --ops LIST        comma-separated subset of fwd,dx,dw,topk_grad (default: all)\n"
            "  --samples S       output elements checked per op (default 2000; topk_grad at most 64)\n"
            "  --dw-fp32         dW and the topk-weight gradient in float32\n"
            "  --help            this text\n"
            "Exit status: 0 when every check passes, 1 when one fails, 2 on a usage or setup error.\n");
}

static int parse_int64(const char *text, int64_t *out)
{
    char *end;
    long long v = strtoll(text, &end, 0);
    if (*text == '\0' || *end != '\0')
        return 0;
    *out = v;
    return 1;
}

static void die_usage(const char *fmt, const char *arg)
{
    fprintf(stderr, "ref-bench: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n");
    usage(stderr);
    exit(2);
}

static void parse_args(int argc, char **argv, options *o)
{
    memset(o, 0, sizeof *o);
    o->model = &models[0];
    o->tokens = 256;
    o->dtype = MOE_BF16;
    o->repeat = 3;
    o->samples = 2000;
    for (int i = 0; i < OP_COUNT; i++)
        o->run[i] = 1;
    for (int i = 1; i < argc; i++) {
        char *arg = argv[i];
        const char *value = NULL;
        char name[64];
        snprintf(name, sizeof name, "%s", arg);
        char *eq = strchr(name, '=');
        if (strncmp(arg, "--", 2) == 0 && eq != NULL) {
            *eq = '\0';
            value = arg + (eq - name) + 1;
        }
        if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) {
            usage(stdout);
            exit(0);
        }
        if (strcmp(name, "--naive") == 0) {
            o->naive = 1;
            continue;
        }
        if (strcmp(name, "--dw-fp32") == 0) {
            o->dw_fp32 = 1;
            continue;
        }
        static const char *const with_value[] = {"--model", "--tokens", "--gemm", "--dtype", "--threads",
                                                 "--repeat", "--seed", "--twin", "--ops", "--samples"};
        int known = 0;
        for (size_t j = 0; j < sizeof with_value / sizeof with_value[0]; j++)
            known |= strcmp(name, with_value[j]) == 0;
        if (!known)
            die_usage("unknown option '%s'", arg);
        if (value == NULL) {
            if (i + 1 >= argc)
                die_usage("option %s needs a value", name);
            value = argv[++i];
        }
        int64_t number = 0;
        if (strcmp(name, "--model") == 0) {
            o->model = NULL;
            for (int m = 0; m < MODEL_COUNT; m++)
                if (strcmp(value, models[m].name) == 0)
                    o->model = &models[m];
            if (o->model == NULL)
                die_usage("unknown model '%s'", value);
        } else if (strcmp(name, "--gemm") == 0) {
            if (strcmp(value, "gate_up") == 0)
                o->down = 0;
            else if (strcmp(value, "down") == 0)
                o->down = 1;
            else
                die_usage("--gemm is gate_up or down, not '%s'", value);
        } else if (strcmp(name, "--dtype") == 0) {
            if (strcmp(value, "bf16") == 0)
                o->dtype = MOE_BF16;
            else if (strcmp(value, "f16") == 0)
                o->dtype = MOE_F16;
            else if (strcmp(value, "f32") == 0)
                o->dtype = MOE_F32;
            else
                die_usage("--dtype is bf16, f16 or f32, not '%s'", value);
        } else if (strcmp(name, "--twin") == 0) {
            if (strcmp(value, "naive") == 0)
                o->naive = 1;
            else if (strcmp(value, "blocked") == 0)
                o->naive = 0;
            else
                die_usage("--twin is naive or blocked, not '%s'", value);
        } else if (strcmp(name, "--ops") == 0) {
            for (int j = 0; j < OP_COUNT; j++)
                o->run[j] = 0;
            char list[256];
            snprintf(list, sizeof list, "%s", value);
            for (char *tok = strtok(list, ","); tok != NULL; tok = strtok(NULL, ",")) {
                int found = 0;
                for (int j = 0; j < OP_COUNT; j++)
                    if (strcmp(tok, op_names[j]) == 0)
                        o->run[j] = found = 1;
                if (!found)
                    die_usage("unknown op '%s' in --ops (fwd, dx, dw, topk_grad)", tok);
            }
        } else if (strcmp(name, "--seed") == 0) {
            char *end;
            o->seed = strtoull(value, &end, 0);
            if (*value == '\0' || *end != '\0')
                die_usage("--seed needs an unsigned integer, not '%s'", value);
            o->have_seed = 1;
        } else {
            if (!parse_int64(value, &number))
                die_usage("option needs an integer, not '%s'", value);
            if (strcmp(name, "--tokens") == 0) {
                if (number < 0 || number > ((int64_t)1 << 24))
                    die_usage("--tokens must be in [0, 2^24], not '%s'", value);
                o->tokens = number;
            } else if (strcmp(name, "--threads") == 0) {
                if (number < 1 || number > 4096)
                    die_usage("--threads must be in [1, 4096], not '%s'", value);
                o->threads = (int)number;
            } else if (strcmp(name, "--repeat") == 0) {
                if (number < 1 || number > 1000000)
                    die_usage("--repeat must be >= 1, not '%s'", value);
                o->repeat = (int)number;
            } else if (strcmp(name, "--samples") == 0) {
                if (number < 0 || number > 100000000)
                    die_usage("--samples must be >= 0, not '%s'", value);
                o->samples = (int)number;
            }
        }
    }
    if (!o->have_seed) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        o->seed = ((uint64_t)now.tv_sec * 1000000007u) ^ (uint64_t)now.tv_nsec;
    }
}

static double clock_seconds(clockid_t clock)
{
    struct timespec t;
    clock_gettime(clock, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void *alloc_or_die(const char *what, int64_t count, size_t element)
{
    size_t bytes = (size_t)count * element;
    void *p = malloc(bytes ? bytes : 1);
    if (p == NULL) {
        fprintf(stderr, "ref-bench: cannot allocate %s (%.2f GiB); try fewer --tokens, --ops or a smaller model\n",
                what, (double)bytes / (1u << 30));
        exit(2);
    }
    return p;
}

/* Fills count elements with uniform [-1, 1) values rounded to dtype, in parallel 1 Mi-element chunks
 * whose generators depend only on (seed, stream, chunk): the data do not depend on the thread count. */
static void fill_random(uint64_t seed, uint64_t stream, moe_dtype dtype, void *base, int64_t count)
{
    const int64_t chunk = (int64_t)1 << 20;
    const int64_t chunks = (count + chunk - 1) / chunk;
    const size_t es = moe_dtype_size(dtype);
    BENCH_OMP(omp parallel for schedule(dynamic, 1))
    for (int64_t c = 0; c < chunks; c++) {
        oracle_rng rng = {seed ^ (stream * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)c * 0xd1b54a32d192ed03ull)};
        oracle_rng_next(&rng);
        const int64_t n = count - c * chunk < chunk ? count - c * chunk : chunk;
        oracle_fill(&rng, dtype, (char *)base + (size_t)(c * chunk) * es, n, 0);
    }
}

/* ---- the benchmark problem ---- */

typedef struct bench {
    options opt;
    int64_t T, k, E, M, N, K;
    moe_dtype dtype, dw_dtype;
    int64_t *m_sizes, *gather, *scatter, *offsets, *expert_of_row;
    moe_routing routing;
    moe_gemm_options gopt;      /* the op modes */
    moe_gemm_problem problem;   /* the same, for the naive twins */
    void *x, *w, *dy, *topk_weights; /* topk_weights NULL for gate_up */
    void *out[OP_COUNT];
    int64_t out_count[OP_COUNT];
    moe_dtype out_dtype[OP_COUNT];
} bench;

static void build_routing(bench *b, oracle_rng *rng)
{
    const int64_t T = b->T, k = b->k, E = b->E, M = b->M;
    int64_t *ids = alloc_or_die("topk_ids", M, sizeof(int64_t));
    oracle_topk_ids(rng, T, k, E, ids); /* k distinct experts per token (k <= E for every model here) */
    b->m_sizes = alloc_or_die("m_sizes", E, sizeof(int64_t));
    b->gather = alloc_or_die("gather_indices", M, sizeof(int64_t));
    b->scatter = alloc_or_die("scatter_indices", M, sizeof(int64_t));
    if (moe_routing_from_topk(T, k, E, ids, b->m_sizes, b->gather, b->scatter) != MOE_OK) {
        fprintf(stderr, "ref-bench: routing: %s\n", moe_last_error());
        exit(2);
    }
    free(ids);
    b->offsets = alloc_or_die("offsets", E + 1, sizeof(int64_t));
    b->offsets[0] = 0;
    for (int64_t e = 0; e < E; e++)
        b->offsets[e + 1] = b->offsets[e] + b->m_sizes[e];
    b->expert_of_row = alloc_or_die("expert_of_row", M, sizeof(int64_t));
    for (int64_t e = 0; e < E; e++)
        for (int64_t r = b->offsets[e]; r < b->offsets[e + 1]; r++)
            b->expert_of_row[r] = e;
    b->routing = (moe_routing){T, k, E, b->m_sizes, b->gather};
}

/* Topk weights of the down projection: k positive weights per token summing to about 1. */
static void fill_topk_weights(bench *b, oracle_rng *rng)
{
    float *v = alloc_or_die("weights", b->k, sizeof(float));
    for (int64_t t = 0; t < b->T; t++) {
        float sum = 0.0f;
        for (int64_t j = 0; j < b->k; j++)
            sum += v[j] = (float)(0.05 + (oracle_rng_symmetric(rng) + 1.0));
        for (int64_t j = 0; j < b->k; j++) {
            const int64_t s = t * b->k + j;
            const float value = v[j] / sum;
            switch (b->dtype) {
            case MOE_BF16: ((uint16_t *)b->topk_weights)[s] = moe_f32_to_bf16(value); break;
            case MOE_F16: ((uint16_t *)b->topk_weights)[s] = moe_f32_to_f16(value); break;
            case MOE_F32: ((float *)b->topk_weights)[s] = value; break;
            case MOE_E4M3: ((uint8_t *)b->topk_weights)[s] = moe_f32_to_e4m3(value); break;
            case MOE_E5M2: ((uint8_t *)b->topk_weights)[s] = moe_f32_to_e5m2(value); break;
            }
        }
    }
    free(v);
}

static moe_status run_op(const bench *b, enum op op)
{
    const moe_gemm_problem *p = &b->problem;
    if (b->opt.naive) {
        switch (op) {
        case OP_FWD: return moe_ref_gemm_fwd_naive(p, b->x, b->w, b->topk_weights, b->out[op]);
        case OP_DX: return moe_ref_gemm_dx_naive(p, b->dy, b->w, b->topk_weights, b->out[op]);
        case OP_DW: return moe_ref_gemm_dw_naive(p, b->x, b->dy, b->topk_weights, b->out[op]);
        case OP_TOPK: return moe_ref_gemm_topk_weights_grad(p, b->x, b->w, b->dy, b->out[op]);
        case OP_COUNT: break;
        }
        return MOE_ERR_INVALID_OPTION;
    }
    moe_gemm_options o = b->gopt;
    if (op != OP_DX)
        o.reduce_topk = 0;
    switch (op) {
    case OP_FWD:
        return moe_gemm_fwd(MOE_BACKEND_REF, &b->routing, b->N, b->K, b->x, b->w, b->topk_weights, b->out[op], &o);
    case OP_DX:
        return moe_gemm_dx(MOE_BACKEND_REF, &b->routing, b->N, b->K, b->dy, b->w, b->topk_weights, b->out[op], &o);
    case OP_DW:
        return moe_gemm_dw(MOE_BACKEND_REF, &b->routing, b->N, b->K, b->x, b->dy, b->topk_weights, b->out[op], &o);
    case OP_TOPK:
        return moe_gemm_topk_weights_grad(MOE_BACKEND_REF, &b->routing, b->N, b->K, b->x, b->w, b->dy, b->out[op],
                                          &o);
    case OP_COUNT:
        break;
    }
    return MOE_ERR_INVALID_OPTION;
}

static const char *op_mode(const bench *b, enum op op)
{
    if (!b->opt.down)
        return op == OP_DX ? "permute_x reduce_topk" : "permute_x";
    return op == OP_TOPK ? "permute_y" : "permute_y topk_weights";
}

static int compare_doubles(const void *a, const void *c)
{
    double x = *(const double *)a, y = *(const double *)c;
    return (x > y) - (x < y);
}

/* ---- the sampled oracle: value and bound of one output element (oracle/oracle.c's formulas) ---- */

static double element_bound(moe_dtype out_dtype, int64_t roundings, double magnitude, double value)
{
    const double accumulation = oracle_gamma(roundings) * magnitude;
    return accumulation + oracle_output_rounding(out_dtype, fabs(value) + accumulation) +
           (double)roundings * 0x1p-52 * magnitude;
}

static double weight_of(const bench *b, int64_t slot)
{
    return b->topk_weights != NULL ? oracle_load(b->dtype, b->topk_weights, slot) : 1.0;
}

static int64_t x_row(const bench *b, int64_t r) { return b->gopt.permute_x ? b->gather[r] / b->k : r; }
static int64_t y_row(const bench *b, int64_t r) { return b->gopt.permute_y ? b->gather[r] : r; }

/* xsrc_r . W[e]^T at column n, with its magnitude sum */
static double dot_xw(const bench *b, int64_t r, int64_t n, double *magnitude)
{
    const int64_t e = b->expert_of_row[r], xr = x_row(b, r);
    double sum = 0.0, mag = 0.0;
    for (int64_t c = 0; c < b->K; c++) {
        const double term = oracle_load(b->dtype, b->x, xr * b->K + c) * oracle_load(b->dtype, b->w, (e * b->N + n) * b->K + c);
        sum += term;
        mag += fabs(term);
    }
    *magnitude = mag;
    return sum;
}

static void oracle_element(const bench *b, enum op op, int64_t index, double *value, double *bound)
{
    const int64_t N = b->N, K = b->K, k = b->k;
    const int weighted = b->topk_weights != NULL;
    switch (op) {
    case OP_FWD: {
        const int64_t row = index / N, n = index % N;
        const int64_t r = b->gopt.permute_y ? b->scatter[row] : row;
        double mag;
        const double wt = weight_of(b, b->gather[r]);
        const double v = wt * dot_xw(b, r, n, &mag);
        *value = v;
        *bound = element_bound(b->dtype, K + weighted, fabs(wt) * mag, v);
        return;
    }
    case OP_DX: {
        const int64_t row = index / K, c = index % K;
        const int reduce = b->gopt.reduce_topk;
        const int64_t slots = reduce ? k : 1;
        double v = 0.0, mag = 0.0;
        for (int64_t j = 0; j < slots; j++) {
            const int64_t r = reduce ? b->scatter[row * k + j] : b->gopt.permute_x ? b->scatter[row] : row;
            const int64_t e = b->expert_of_row[r], dyr = y_row(b, r);
            const double wt = weight_of(b, b->gather[r]);
            double sum = 0.0, m = 0.0;
            for (int64_t n = 0; n < N; n++) {
                const double term = oracle_load(b->dtype, b->dy, dyr * N + n) * oracle_load(b->dtype, b->w, (e * N + n) * K + c);
                sum += term;
                m += fabs(term);
            }
            v += wt * sum;
            mag += fabs(wt) * m;
        }
        *value = v;
        *bound = element_bound(b->dtype, N + weighted + (reduce ? k - 1 : 0), mag, v);
        return;
    }
    case OP_DW: {
        const int64_t e = index / (N * K), n = index / K % N, c = index % K;
        double sum = 0.0, mag = 0.0;
        for (int64_t r = b->offsets[e]; r < b->offsets[e + 1]; r++) {
            const double term = weight_of(b, b->gather[r]) * oracle_load(b->dtype, b->dy, y_row(b, r) * N + n) *
                                oracle_load(b->dtype, b->x, x_row(b, r) * K + c);
            sum += term;
            mag += fabs(term);
        }
        *value = sum;
        *bound = element_bound(b->dw_dtype, b->m_sizes[e] + weighted, mag, sum);
        return;
    }
    case OP_TOPK: {
        const int64_t r = b->scatter[index], dyr = y_row(b, r);
        double sum = 0.0, mag = 0.0, inherited = 0.0;
        for (int64_t n = 0; n < N; n++) {
            double ymag;
            const double y = dot_xw(b, r, n, &ymag);
            const double g = oracle_load(b->dtype, b->dy, dyr * N + n);
            const double y_error = oracle_gamma(K) * ymag + (double)K * 0x1p-52 * ymag;
            sum += g * y;
            mag += fabs(g) * (fabs(y) + y_error);
            inherited += fabs(g) * y_error;
        }
        *value = sum;
        *bound = element_bound(b->dw_dtype, N, mag, sum) + inherited;
        return;
    }
    case OP_COUNT:
        break;
    }
    *value = NAN;
    *bound = 0.0;
}

typedef struct check_result {
    int64_t checked, failures;
    double worst;
} check_result;

/* Checks `samples` random elements of op's output (all of them when there are fewer). */
static check_result check_op(const bench *b, enum op op, uint64_t seed, int samples)
{
    check_result res = {0, 0, 0.0};
    const int64_t count = b->out_count[op];
    if (op == OP_TOPK && samples > 64)
        samples = 64; /* each needs N dot products of length K */
    const int64_t n = count < samples ? count : samples;
    if (n == 0)
        return res;
    int64_t *index = alloc_or_die("sample indices", n, sizeof(int64_t));
    oracle_rng rng = {seed ^ (0x5851f42d4c957f2dull * (uint64_t)(op + 1))};
    for (int64_t i = 0; i < n; i++)
        index[i] = n == count ? i : (int64_t)oracle_rng_below(&rng, (uint64_t)count);
    double *value = alloc_or_die("sample values", 3 * n, sizeof(double));
    double *bound = value + n, *got = value + 2 * n;
    BENCH_OMP(omp parallel for schedule(dynamic, 8))
    for (int64_t i = 0; i < n; i++) {
        oracle_element(b, op, index[i], &value[i], &bound[i]);
        got[i] = oracle_load(b->out_dtype[op], b->out[op], index[i]);
    }
    for (int64_t i = 0; i < n; i++) {
        const double err = fabs(got[i] - value[i]);
        if (err <= bound[i]) { /* NaN fails */
            const double ratio = bound[i] > 0 ? err / bound[i] : 0.0;
            res.worst = ratio > res.worst ? ratio : res.worst;
            continue;
        }
        if (res.failures++ < 10)
            fprintf(stderr, "  %s[%" PRId64 "]: got %.9g, want %.17g, |err| %.3g > bound %.3g (seed %" PRIu64 ")\n",
                    op_names[op], index[i], got[i], value[i], err, bound[i], b->opt.seed);
    }
    if (res.failures > 0)
        res.worst = INFINITY;
    free(value);
    res.checked = n;
    free(index);
    return res;
}

int main(int argc, char **argv)
{
    bench b;
    memset(&b, 0, sizeof b);
    parse_args(argc, argv, &b.opt);
    const options *o = &b.opt;
    printf("seed %" PRIu64 "\n", o->seed);
    fflush(stdout);
#ifdef _OPENMP
    if (o->threads > 0)
        omp_set_num_threads(o->threads);
    const int threads = omp_get_max_threads();
#else
    const int threads = 1;
#endif

    const model *m = o->model;
    b.T = o->tokens;
    b.k = m->k;
    b.E = m->E;
    b.M = b.T * b.k;
    b.N = o->down ? m->H : 2 * m->I;
    b.K = o->down ? m->I : m->H;
    b.dtype = o->dtype;
    b.dw_dtype = o->dw_fp32 ? MOE_F32 : o->dtype;
    const size_t es = moe_dtype_size(b.dtype), dws = moe_dtype_size(b.dw_dtype);

    b.gopt.dtype = b.dtype;
    b.gopt.dw_fp32 = o->dw_fp32;
    b.gopt.permute_x = !o->down;
    b.gopt.permute_y = o->down;
    b.gopt.reduce_topk = !o->down;

    const int64_t x_rows = b.gopt.permute_x ? b.T : b.M;
    const int64_t dx_rows = b.gopt.reduce_topk ? b.T : b.M;
    b.out_count[OP_FWD] = b.M * b.N;
    b.out_count[OP_DX] = dx_rows * b.K;
    b.out_count[OP_DW] = b.E * b.N * b.K;
    b.out_count[OP_TOPK] = b.M;
    b.out_dtype[OP_FWD] = b.out_dtype[OP_DX] = b.dtype;
    b.out_dtype[OP_DW] = b.out_dtype[OP_TOPK] = b.dw_dtype;

    const double flops = 2.0 * (double)b.M * (double)b.N * (double)b.K;
    printf("model %s (E=%" PRId64 ", k=%" PRId64 ", H=%" PRId64 ", I=%" PRId64 "), gemm %s: T=%" PRId64
           ", M=%" PRId64 ", N=%" PRId64 ", K=%" PRId64 ", %s%s\n",
           m->name, m->E, m->k, m->H, m->I, o->down ? "down" : "gate_up", b.T, b.M, b.N, b.K,
           moe_dtype_name(b.dtype), o->dw_fp32 ? " (dW f32)" : "");
    printf("twin %s, %d threads, repeat %d (median), %.3f GFLOP per op (2 M N K)\n",
           o->naive ? "naive (ref/gemm_naive.c, direct)" : "blocked (public API, MOE_BACKEND_REF)", threads,
           o->repeat, flops * 1e-9);

    /* routing and data */
    oracle_rng rng = {o->seed};
    build_routing(&b, &rng);
    int64_t min_rows = b.M, max_rows = 0, empty = 0;
    for (int64_t e = 0; e < b.E; e++) {
        min_rows = b.m_sizes[e] < min_rows ? b.m_sizes[e] : min_rows;
        max_rows = b.m_sizes[e] > max_rows ? b.m_sizes[e] : max_rows;
        empty += b.m_sizes[e] == 0;
    }
    printf("routing: rows per expert min %" PRId64 ", mean %.1f, max %" PRId64 "; %" PRId64 " empty experts\n",
           b.E > 0 && b.M > 0 ? min_rows : 0, (double)b.M / (double)b.E, max_rows, empty);

    double bytes = (double)(x_rows * b.K + b.E * b.N * b.K + b.M * b.N) * (double)es;
    for (int op = 0; op < OP_COUNT; op++)
        if (o->run[op])
            bytes += (double)b.out_count[op] * (double)(op == OP_DW || op == OP_TOPK ? dws : es);
    printf("memory: %.2f GiB of tensors\n", bytes / (double)(1u << 30));
    fflush(stdout);

    fprintf(stderr, "ref-bench: filling inputs...\n");
    b.x = alloc_or_die("X", x_rows * b.K, es);
    b.w = alloc_or_die("W", b.E * b.N * b.K, es);
    b.dy = alloc_or_die("dY", b.M * b.N, es);
    fill_random(o->seed, 1, b.dtype, b.x, x_rows * b.K);
    fill_random(o->seed, 2, b.dtype, b.w, b.E * b.N * b.K);
    fill_random(o->seed, 3, b.dtype, b.dy, b.M * b.N);
    if (o->down) {
        b.topk_weights = alloc_or_die("topk weights", b.M, es);
        fill_topk_weights(&b, &rng);
    }
    for (int op = 0; op < OP_COUNT; op++)
        if (o->run[op]) {
            const size_t size = op == OP_DW || op == OP_TOPK ? dws : es;
            b.out[op] = alloc_or_die(op_names[op], b.out_count[op], size);
            oracle_poison(b.out_dtype[op], b.out[op], b.out_count[op]);
        }

    /* the naive twins take the validated problem directly */
    moe_gemm_problem *p = &b.problem;
    p->op = "ref-bench";
    p->num_tokens = b.T;
    p->topk = b.k;
    p->num_experts = b.E;
    p->rows = b.M;
    p->N = b.N;
    p->K = b.K;
    p->m_sizes = b.m_sizes;
    p->gather_indices = b.gather;
    p->dtype = b.dtype;
    p->dw_dtype = b.dw_dtype;
    p->permute_x = b.gopt.permute_x;
    p->permute_y = b.gopt.permute_y;
    p->reduce_topk = b.gopt.reduce_topk;

    printf("\n%-10s %-24s %10s %10s %8s %8s %16s  %s\n", "op", "mode", "median s", "GFLOP/s", "cpu/wall",
           "checked", "worst err/bound", "result");
    fflush(stdout);
    int failed = 0;
    double *times = alloc_or_die("times", 2 * (int64_t)o->repeat, sizeof(double));
    double *cpu = times + o->repeat;
    for (int op = 0; op < OP_COUNT; op++) {
        if (!o->run[op])
            continue;
        p->reduce_topk = op == OP_DX && b.gopt.reduce_topk;
        for (int rep = 0; rep < o->repeat; rep++) {
            fprintf(stderr, "ref-bench: %s run %d/%d...", op_names[op], rep + 1, o->repeat);
            const double t0 = clock_seconds(CLOCK_MONOTONIC), c0 = clock_seconds(CLOCK_PROCESS_CPUTIME_ID);
            const moe_status status = run_op(&b, (enum op)op);
            times[rep] = clock_seconds(CLOCK_MONOTONIC) - t0;
            cpu[rep] = (clock_seconds(CLOCK_PROCESS_CPUTIME_ID) - c0) / (times[rep] > 0 ? times[rep] : 1.0);
            fprintf(stderr, " %.3f s\n", times[rep]);
            if (status != MOE_OK) {
                fprintf(stderr, "ref-bench: %s failed: %s: %s\n", op_names[op], moe_strerror(status),
                        moe_last_error());
                return 1;
            }
        }
        qsort(times, (size_t)o->repeat, sizeof *times, compare_doubles);
        qsort(cpu, (size_t)o->repeat, sizeof *cpu, compare_doubles);
        const double median = o->repeat % 2 ? times[o->repeat / 2]
                                            : 0.5 * (times[o->repeat / 2 - 1] + times[o->repeat / 2]);
        fprintf(stderr, "ref-bench: checking %s...\n", op_names[op]);
        const check_result res = check_op(&b, (enum op)op, o->seed, o->samples);
        const int ok = res.failures == 0;
        failed |= !ok;
        printf("%-10s %-24s %10.4f %10.2f %8.2f %8" PRId64 " %16.4g  %s\n", op_names[op],
               op_mode(&b, (enum op)op), median, median > 0 ? flops / median * 1e-9 : 0.0, cpu[o->repeat / 2],
               res.checked, res.worst, ok ? "PASS" : "FAIL");
        if (!ok)
            printf("  %" PRId64 " of %" PRId64 " sampled elements outside the bound (details on stderr)\n",
                   res.failures, res.checked);
        fflush(stdout);
    }
    printf("\n%s\n", failed ? "FAIL" : "PASS");

    free(times);
    for (int op = 0; op < OP_COUNT; op++)
        free(b.out[op]);
    free(b.x);
    free(b.w);
    free(b.dy);
    free(b.topk_weights);
    free(b.m_sizes);
    free(b.gather);
    free(b.scatter);
    free(b.offsets);
    free(b.expert_of_row);
    return failed ? 1 : 0;
}
