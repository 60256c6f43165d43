/* Generators shared by the properties; see pt_gen.h. */
#include "pt_gen.h"

#include "oracle.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const pt_model pt_models[PT_MODELS] = {
    {"qwen3-30b-a3b", 128, 8, 2048, 768},  {"qwen3-235b-a22b", 128, 8, 4096, 1536},
    {"mixtral-8x7b", 8, 2, 4096, 14336},   {"deepseek-v3", 256, 8, 7168, 2048},
    {"llama-4-scout", 16, 1, 5120, 8192},  {"gpt-oss-120b", 128, 4, 2880, 2880},
};

const char *pt_routing_kind_name(int kind)
{
    static const char *const names[PT_ROUTE_KINDS] = {"uniform",     "zipf",        "one-expert",
                                                      "empty-first", "empty-last",  "alternating",
                                                      "E>>T",        "arbitrary"};
    return kind >= 0 && kind < PT_ROUTE_KINDS ? names[kind] : "?";
}

const char *pt_dist_name(int dist)
{
    static const char *const names[PT_DISTS] = {"exact", "uniform", "wide", "large", "tiny"};
    return dist >= 0 && dist < PT_DISTS ? names[dist] : "?";
}

int64_t pt_allowed_experts(int kind, int64_t E, int64_t *list)
{
    int64_t n = 0;
    for (int64_t e = 0; e < E; e++) {
        int ok = 1;
        if (kind == PT_ROUTE_EMPTY_FIRST && E > 1)
            ok = e >= E / 2;
        else if (kind == PT_ROUTE_EMPTY_LAST && E > 1)
            ok = e < (E + 1) / 2;
        else if (kind == PT_ROUTE_ALTERNATING && E > 1)
            ok = e % 2 == 0;
        if (ok)
            list[n++] = e;
    }
    return n;
}

void pt_gen_topk_ids(pt_source *src, int kind, int64_t T, int64_t k, int64_t E, int64_t *ids)
{
    int64_t *allowed = xmalloc((size_t)E * sizeof(int64_t));
    int64_t *pool = xmalloc((size_t)E * sizeof(int64_t));
    const int64_t A = pt_allowed_experts(kind, E, allowed);
    const int64_t favourite = kind == PT_ROUTE_ONE_EXPERT ? allowed[pt_draw(src, (uint64_t)(A - 1))] : -1;
    for (int64_t t = 0; t < T; t++) {
        memcpy(pool, allowed, (size_t)A * sizeof(int64_t));
        int64_t left = A; /* pool[0..left) are still free */
        for (int64_t j = 0; j < k; j++) {
            int64_t at;
            if (j == 0 && favourite >= 0) {
                for (at = 0; pool[at] != favourite; at++)
                    ;
            } else if (kind == PT_ROUTE_ZIPF) {
                /* index = floor(left * u^3): low ids much more likely */
                const double u = (double)pt_draw(src, 1023) / 1024.0;
                at = (int64_t)((double)left * u * u * u);
            } else {
                at = (int64_t)pt_draw(src, (uint64_t)(left - 1));
            }
            ids[t * k + j] = pool[at];
            memmove(pool + at, pool + at + 1, (size_t)(left - at - 1) * sizeof(int64_t)); /* keep order */
            left--;
        }
    }
    free(allowed);
    free(pool);
}

void pt_stable_routing(int64_t M, int64_t E, const int64_t *ids, int64_t *m_sizes, int64_t *gather)
{
    int64_t *next = xcalloc((size_t)E + 1, sizeof(int64_t));
    for (int64_t e = 0; e < E; e++)
        m_sizes[e] = 0;
    for (int64_t s = 0; s < M; s++)
        m_sizes[ids[s]]++;
    for (int64_t e = 1; e < E; e++)
        next[e] = next[e - 1] + m_sizes[e - 1];
    for (int64_t s = 0; s < M; s++)
        gather[next[ids[s]]++] = s;
    free(next);
}

double pt_round_to(moe_dtype dtype, double v)
{
    const float f = (float)v;
    switch (dtype) {
    case MOE_F16: return moe_f16_to_f32(moe_f32_to_f16(f));
    case MOE_BF16: return moe_bf16_to_f32(moe_f32_to_bf16(f));
    case MOE_E4M3: return moe_e4m3_to_f32(moe_f32_to_e4m3(f));
    case MOE_E5M2: return moe_e5m2_to_f32(moe_f32_to_e5m2(f));
    case MOE_F32: break;
    }
    return f;
}

static void store(moe_dtype dtype, void *buf, int64_t i, double v)
{
    const float f = (float)v;
    switch (dtype) {
    case MOE_F16: ((uint16_t *)buf)[i] = moe_f32_to_f16(f); return;
    case MOE_BF16: ((uint16_t *)buf)[i] = moe_f32_to_bf16(f); return;
    case MOE_E4M3: ((uint8_t *)buf)[i] = moe_f32_to_e4m3(f); return;
    case MOE_E5M2: ((uint8_t *)buf)[i] = moe_f32_to_e5m2(f); return;
    case MOE_F32: break;
    }
    ((float *)buf)[i] = f;
}

void pt_fill(uint64_t seed, int tensor, int dist, moe_dtype dtype, void *buf, int64_t count)
{
    oracle_rng rng = {pt_mix(seed * 64 + (uint64_t)tensor)};
    switch (dist) {
    case PT_DIST_EXACT: oracle_fill(&rng, dtype, buf, count, 1); return;
    case PT_DIST_UNIFORM: oracle_fill(&rng, dtype, buf, count, 0); return;
    case PT_DIST_WIDE: oracle_fill(&rng, dtype, buf, count, 2); return;
    default: break;
    }
    /* large / tiny: a uniform mantissa in [0.5, 1) with a sign, times 2^e for e in [lo, hi] */
    const int f16 = dtype == MOE_F16, large = dist == PT_DIST_LARGE;
    /* Products of three factors (x w dY in the topk-weight gradient) must neither overflow nor underflow
     * float32: the oracle's bound has no term for either inside a sum.  large: below 2^93, while f16
     * outputs overflow; tiny: above 2^-126 (f32/bf16), and subnormal f16 inputs whose outputs underflow. */
    const int lo = large ? (f16 ? 3 : 10) : (f16 ? -20 : -41), hi = large ? (f16 ? 8 : 30) : (f16 ? -12 : -36);
    for (int64_t i = 0; i < count; i++) {
        const double m = 0.5 + 0.5 * fabs(oracle_rng_symmetric(&rng));
        const int e = lo + (int)oracle_rng_below(&rng, (uint64_t)(hi - lo + 1));
        const double sign = oracle_rng_below(&rng, 2) ? -1.0 : 1.0;
        store(dtype, buf, i, sign * ldexp(m, e));
    }
}
