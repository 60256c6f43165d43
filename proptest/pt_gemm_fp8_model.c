/* moe-fuzz's gemm-fp8-hopper-model op: the CPU model of the Hopper FP8 kernel (fp8_hopper_model.h; measured
 * accumulator, or with the spare sum truncation) on the FP8 cases of pt_fp8.h (every mode, output dtype, scale
 * format and operand dtype pair, partial tiles) against the float64 oracle within its Hopper bound
 * (tile_acc_bits 13, specs/FP8.md section 4), and bit for bit the reference on exact codes (every sum exact in
 * 13 bits, as on the GPU).  A case the bound misses is a bound (or model) that is wrong, before any GPU runs. */
#include "fp8_hopper_model.h"
#include "oracle_fp8.h"
#include "pt_fp8.h"

#include <stdlib.h>
#include <string.h>

#define MODEL_CAP_MACS 1000000 /* the model runs one element at a time, a few times the reference's cost */

void pt_gemm_fp8_hopper_model(pt_case *c)
{
    fp8_case f;
    fp8_case_generate(c, &f, MODEL_CAP_MACS);
    const fp8_hopper_model model = {1, pt_bool(c->src)};
    void *out = xmalloc(f.out_bytes + 4);
    memcpy(out, f.old, f.out_bytes);
    if (f.dx)
        fp8_hopper_model_dx(&model, &f.routing, f.N, f.K, &f.a, &f.w, f.topk, out, &f.opt);
    else
        fp8_hopper_model_fwd(&model, &f.routing, f.N, f.K, &f.a, &f.w, f.topk, out, &f.opt);
    fp8_case_check(c, &f, out, model.sum_trunc ? "model (sum truncated)" : "model", ORACLE_FP8_TILE_HOPPER_BITS);
    fp8_case_check_exact(c, &f, out, "model-vs-ref", "the kernel's model");
    free(out);
    fp8_case_free(&f);
}
