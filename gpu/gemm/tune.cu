// The GEMM's autotuning hooks (the driver is src/autotune.c): the tune keys, the forced candidate, the last plan
// read back, and the candidates' timing in rounds.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cuda_check.cuh"
#include "gemm/tune.cuh"

namespace moe_gpu {

// Autotuning (src/autotune.c): the configuration the autotune driver forces on this thread's calls, and
// the key and configuration of this thread's most recent plan (what the driver reads back).
thread_local const moe_tune_choice *tune_forced = nullptr;
thread_local bool tune_planned = false;
thread_local moe_tune_key tune_last_key;
thread_local moe_tune_choice tune_last_choice;

// The current device's name for tune keys ('|' replaced, truncated), cached per thread and device.
const char *device_name_for_tuning()
{
    thread_local int cached_device = -1;
    thread_local char name[MOE_TUNE_DEVICE_CHARS];
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess)
        return "unknown";
    if (device != cached_device) {
        cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, device) != cudaSuccess)
            return "unknown";
        const size_t length = strnlen(prop.name, sizeof prop.name);
        const size_t kept = length < sizeof name - 1 ? length : sizeof name - 1; // truncated, as the key allows
        memcpy(name, prop.name, kept);
        name[kept] = '\0';
        for (char *c = name; *c != '\0'; c++)
            if (*c == '|' || *c == '\n' || *c == '\r')
                *c = '/';
        cached_device = device;
    }
    return name;
}

void tune_key_of(const moe_gemm_problem *p, int op, moe_dtype out_dtype, bool weighted, moe_tune_key *key)
{
    memset(key, 0, sizeof *key);
    snprintf(key->device, sizeof key->device, "%s", device_name_for_tuning());
    key->op = op;
    key->dtype = p->dtype, key->out_dtype = out_dtype;
    key->permute_x = p->permute_x != 0, key->permute_y = p->permute_y != 0, key->reduce_topk = p->reduce_topk != 0;
    key->weighted = weighted, key->allow_tf32 = p->allow_tf32 != 0;
    key->E = p->num_experts, key->M = p->rows, key->N = p->N, key->K = p->K;
}

} // namespace moe_gpu

using namespace moe_gpu;

// ------------------------------------------------------------------------------------------------
// Autotuning hooks (the driver is src/autotune.c)
// ------------------------------------------------------------------------------------------------
// (declared in moe_backend.h under MOE_HAVE_CUDA, which this file's compile does not see: hence the
// explicit C linkage)
extern "C" {
void moe_cuda_tune_force(const moe_tune_choice *choice) { tune_forced = choice; }

int moe_cuda_tune_last(moe_tune_key *key, moe_tune_choice *choice)
{
    if (!tune_planned)
        return 0;
    *key = tune_last_key;
    *choice = tune_last_choice;
    return 1;
}

// Events are recorded around each call and read after the last round: one synchronisation for the whole timing.
// The candidates are timed in rounds: each round runs every candidate once, in turn, so that every candidate
// sees the same spread of the GPU's clock and thermal state (as bench/device-ab.sh alternates its variants)
// instead of one block of runs each.  Each timed call follows a rewrite of `flush` (flush_bytes, several times
// the L2), so that it starts with none of its operands in L2, as in a training step, where other work runs
// between two calls of one GEMM, and as bench/moe-bench times (after triton.testing.do_bench).  Timed in blocks,
// back to back and then also with the flush, the autotune took the dW ping-pong kernel at Mixtral-8x7B down
// (T = 4096), which moe-bench, alternating the two kernels, times slower than the rule's; in rounds it takes
// the rule's (H200; bench/RESULTS.md, "the heuristic's knobs on an H200").
static moe_status time_rounds_with(cudaStream_t stream, moe_status (*run)(void *, int), void *context, int candidates,
                                   int repeats, cudaEvent_t *events, void *flush, size_t flush_bytes, double *median_us)
{
    for (int c = 0; c < candidates; c++) { // warm-up
        const moe_status status = run(context, c);
        if (status != MOE_OK)
            return status;
    }
    for (int r = 0; r < repeats; r++)
        for (int c = 0; c < candidates; c++) {
            cudaEvent_t *pair = events + 2 * ((int64_t)c * repeats + r);
            MOE_CUDA_CHECK(cudaMemsetAsync(flush, (r * candidates + c) & 0xff, flush_bytes, stream));
            MOE_CUDA_CHECK(cudaEventRecord(pair[0], stream));
            const moe_status status = run(context, c);
            if (status != MOE_OK)
                return status;
            MOE_CUDA_CHECK(cudaEventRecord(pair[1], stream));
        }
    MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    double *ms = static_cast<double *>(malloc((size_t)repeats * sizeof(double)));
    if (ms == nullptr)
        return moe_fail(MOE_ERR_OUT_OF_MEMORY, "moe_gemm_autotune: no memory for %d timings", repeats);
    for (int c = 0; c < candidates; c++) {
        for (int r = 0; r < repeats; r++) {
            const cudaEvent_t *pair = events + 2 * ((int64_t)c * repeats + r);
            float elapsed = 0.0f;
            const cudaError_t err = cudaEventElapsedTime(&elapsed, pair[0], pair[1]);
            if (err != cudaSuccess) {
                free(ms);
                return moe_fail(MOE_ERR_DEVICE, "moe_gemm_autotune: cudaEventElapsedTime failed: %s",
                                cudaGetErrorString(err));
            }
            ms[r] = elapsed;
        }
        for (int i = 1; i < repeats; i++) // insertion sort: repeats <= 1000
            for (int j = i; j > 0 && ms[j - 1] > ms[j]; j--) {
                const double t = ms[j];
                ms[j] = ms[j - 1], ms[j - 1] = t;
            }
        median_us[c] = 1000.0 * (repeats % 2 ? ms[repeats / 2] : 0.5 * (ms[repeats / 2 - 1] + ms[repeats / 2]));
    }
    free(ms);
    return MOE_OK;
}

moe_status moe_cuda_time_rounds(void *stream, moe_status (*run)(void *context, int candidate), void *context,
                                int candidates, int repeats, double *median_us)
{
    if (repeats < 1 || repeats > 1000)
        return moe_fail(MOE_ERR_INVALID_OPTION, "moe_gemm_autotune: repeats = %d, expected 1 .. 1000", repeats);
    if (candidates < 1 || candidates > 64)
        return moe_fail(MOE_ERR_INVALID_OPTION, "moe_gemm_autotune: %d candidates, expected 1 .. 64", candidates);
    const size_t event_count = (size_t)2 * candidates * repeats;
    cudaEvent_t *events = static_cast<cudaEvent_t *>(calloc(event_count, sizeof(cudaEvent_t)));
    if (events == nullptr)
        return moe_fail(MOE_ERR_OUT_OF_MEMORY, "moe_gemm_autotune: no memory for %zu events", event_count);
    moe_status status = MOE_OK;
    size_t created = 0;
    for (; created < event_count; created++) {
        const cudaError_t err = cudaEventCreate(&events[created]);
        if (err != cudaSuccess) {
            status = moe_fail(MOE_ERR_DEVICE, "moe_gemm_autotune: cudaEventCreate failed: %s", cudaGetErrorString(err));
            break;
        }
    }
    // the L2 flush buffer: four times the device's L2 (200-240 MB on an H100 / H200)
    void *flush = nullptr;
    size_t flush_bytes = 0;
    if (status == MOE_OK) {
        int device = 0, l2_bytes = 0;
        cudaError_t err = cudaGetDevice(&device);
        if (err == cudaSuccess)
            err = cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device);
        if (err != cudaSuccess)
            status = moe_fail(MOE_ERR_DEVICE, "moe_gemm_autotune: the L2 size query failed: %s",
                              cudaGetErrorString(err));
        flush_bytes = 4 * (size_t)(l2_bytes > 0 ? l2_bytes : 1 << 20);
        if (status == MOE_OK && (err = cudaMalloc(&flush, flush_bytes)) != cudaSuccess) {
            flush = nullptr;
            status = moe_fail(err == cudaErrorMemoryAllocation ? MOE_ERR_OUT_OF_MEMORY : MOE_ERR_DEVICE,
                              "moe_gemm_autotune: no device memory for the %zu-byte buffer that flushes the L2 "
                              "before each timed call (four times the L2): %s",
                              flush_bytes, cudaGetErrorString(err));
        }
    }
    if (status == MOE_OK)
        status = time_rounds_with(static_cast<cudaStream_t>(stream), run, context, candidates, repeats, events, flush,
                                  flush_bytes, median_us);
    if (flush != nullptr) {
        const cudaError_t err = cudaFree(flush); // synchronises with the timed calls
        if (err != cudaSuccess && status == MOE_OK)
            status = moe_fail(MOE_ERR_DEVICE, "moe_gemm_autotune: cudaFree of the L2 flush buffer failed: %s",
                              cudaGetErrorString(err));
    }
    for (size_t i = 0; i < created; i++)
        cudaEventDestroy(events[i]); // best effort: a failure here changes no result
    free(events);
    return status;
}

} // extern "C"
