// The GEMM's autotuning state (src/autotune.c drives it): the configuration forced on this thread's calls and the
// key and configuration of its most recent plan.
#ifndef LIBMOE_GPU_GEMM_TUNE_CUH
#define LIBMOE_GPU_GEMM_TUNE_CUH

extern "C" {
#include "moe_backend.h"
}

namespace moe_gpu {

extern thread_local const moe_tune_choice *tune_forced;
extern thread_local bool tune_planned;
extern thread_local moe_tune_key tune_last_key;
extern thread_local moe_tune_choice tune_last_choice;

void tune_key_of(const moe_gemm_problem *p, int op, moe_dtype out_dtype, bool weighted, moe_tune_key *key);

} // namespace moe_gpu

#endif
