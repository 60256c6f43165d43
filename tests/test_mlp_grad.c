/* The blockwise MoE MLP reference against float64 central finite differences, for every combination of
 * activation (4) x affinity placement (2) x bias (2) x clamp-limit subset (16) x dtype (f32, f16, bf16)
 * x padding convention (2) x accumulate (2) = 3072 cases.  Around them, per case at random: shape, block
 * size (1..8), layout (dropless builder, dropping builder, shuffled caller-made layout with an empty
 * block), topk, tensor_update_overwrite (when top-1), grad_fp32 (f16/bf16), and with ON_I whether the
 * backward gets the down checkpoint.  Clamp limits are placed inside the data so that each binds for a
 * fraction of the elements.  Every output, checkpoint and gradient is checked within its derived bound
 * (specs/MLP.md, "Error bound"), every gradient also against the finite differences.
 *
 * usage: test_mlp_grad [seed] */
#include "mlp_testlib.h"
#include "check.h"

#include <string.h>

int main(int argc, char **argv)
{
    const uint64_t base = argc > 1 ? strtoull(argv[1], NULL, 0) : 20260301;
    oracle_rng rng = {base};
    int64_t bad = 0, cases = 0, rounded = 0;
    double clamp_share_min = 1.0, clamp_share_max = 0.0;
    for (int combo = 0; combo < MT_OPTION_COMBOS; combo++) {
        const int clamp_mask = mt_option_combo(combo, &(moe_mlp_options){0});
        for (int pass = 0; pass < 12; pass++) { /* dtype x padding x accumulate */
            mt_case c;
            int placed = 0;
            for (int attempt = 0; attempt < 50 && !placed; attempt++) {
                moe_mlp_options o = {0};
                const int clamps = mt_option_combo(combo, &o);
                o.dtype = (moe_dtype)(pass % 3);
                o.padding = (moe_mlp_padding)((pass / 3) % 2);
                o.accumulate = pass / 6;
                static const int64_t blocks[] = {1, 2, 3, 4, 5, 8};
                o.block_size = blocks[oracle_rng_below(&rng, 6)];
                const int64_t E = 1 + (int64_t)oracle_rng_below(&rng, 5);
                const int64_t k = 1 + (int64_t)oracle_rng_below(&rng, (uint64_t)(E < 3 ? E : 3));
                const int64_t T = 2 + (int64_t)oracle_rng_below(&rng, 6);
                const int64_t H = 1 + (int64_t)oracle_rng_below(&rng, 8);
                const int64_t I = 1 + (int64_t)oracle_rng_below(&rng, 5);
                o.tensor_update_overwrite = k == 1 && oracle_rng_below(&rng, 2);
                o.grad_fp32 = o.dtype != MOE_F32 && oracle_rng_below(&rng, 2);
                o.float32_intermediates = !(o.dtype != MOE_F32 && oracle_rng_below(&rng, 2));
                const int mode = (int)oracle_rng_below(&rng, 3);
                const uint64_t seed = base * 1000003ULL + (uint64_t)(combo * 12 + pass) * 101 + (uint64_t)attempt;
                mt_case_init(&c, seed, T, E, k, H, I, &o, mode);
                if (clamps == 0 || mt_choose_clamps(&c, clamps))
                    placed = 1;
                else
                    mt_case_free(&c);
            }
            REQUIRE(placed, "combo %d: no clamp placement found", combo);
            for (int w = 0; w < 4; w++) {
                if (!(clamp_mask & (1 << w)))
                    continue;
                REQUIRE(c.clamp_fraction[w] > 0.0 && c.clamp_fraction[w] < 1.0, "clamp %d binds for %g", w,
                        c.clamp_fraction[w]);
                clamp_share_min = c.clamp_fraction[w] < clamp_share_min ? c.clamp_fraction[w] : clamp_share_min;
                clamp_share_max = c.clamp_fraction[w] > clamp_share_max ? c.clamp_fraction[w] : clamp_share_max;
            }
            const int down_in_bwd = c.opt.affinity == MOE_AFFINITY_ON_H || oracle_rng_below(&rng, 2);
            /* f16/bf16: also every rounding of the spec in its exact place (MT_CHECK_EXACT_ROUNDING) */
            const int exact = c.opt.dtype != MOE_F32 ? MT_CHECK_EXACT_ROUNDING : 0;
            const int64_t b = mt_run(&c, MT_CHECK_FD | MT_CHECK_BOUND | exact, down_in_bwd, NULL);
            rounded += !c.opt.float32_intermediates;
            if (b)
                fprintf(stderr, "combo %d pass %d: %lld mismatches\n", combo, pass, (long long)b);
            bad += b;
            cases++;
            mt_case_free(&c);
        }
    }
    printf("%lld cases (%lld with round_intermediates), %lld mismatches; clamps bound for %.0f%% .. %.0f%% of the "
           "elements\n", (long long)cases, (long long)rounded, (long long)bad, 100 * clamp_share_min,
           100 * clamp_share_max);
    return bad == 0 ? 0 : 1;
}
