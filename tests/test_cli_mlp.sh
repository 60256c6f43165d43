#!/bin/sh
# The blockwise MoE MLP in the moe tool: `moe route --block-size/--dropping/--padding/--topk-weights`
# on a hand-checked routing; then, in every dtype, route -> mlp-fwd -> mlp-bwd on the cases of
# `test_cli_npy genmlp` (every mlp option at least once), each file bit for bit equal to the library
# called directly. The refusals are in test_cli_errors.sh.
. "$(dirname "$0")/test_cli_lib.sh"

# ---- route: the blockwise layout of a hand-checked routing ----
# T = 4 tokens, k = 2, E = 3. Expert 0 gets tokens 0, 2, 3; expert 1 tokens 0, 1, 2, 3; expert 2 token 1.
"$NPY" mk ids.npy '<i8' 4,2 0 1 1 2 0 1 1 0
"$NPY" mk tw.npy '<f4' 4,2 0.5 0.25 1 2 3 4 5 6
# dropless, B = 2: expert 0 -> blocks [0 2] [3 -]; expert 1 -> [0 1] [2 3]; expert 2 -> [1 -]
"$NPY" mk b2e_want.npy '<i8' 5 0 0 1 1 2
"$NPY" mk tpti_want.npy '<i8' 10 0 2 3 -1 0 1 2 3 1 -1
"$NPY" mk tpti_row_want.npy '<i8' 10 0 2 3 4 0 1 2 3 1 4
# A[t*E + e] = the weight of token t's choice e; 0 where t did not choose e
"$NPY" mk aff_want.npy '<f4' 12 0.5 0.25 0 0 1 2 3 4 0 6 5 0
run_ok "route --block-size 2" "$MOE" route --topk-ids ids.npy --experts 3 --block-size 2 --topk-weights tw.npy --out r
has "route --block-size prints the layout" out "blocks: N = 5 blocks of B = 2 positions (dropless, padding skip" \
    "2 of 10 positions empty" "wrote r/token_position_to_id.npy: shape (10,) int64" \
    "wrote r/block_to_expert.npy: shape (5,) int64" "wrote r/expert_affinities_masked.npy: shape (12,) float32"
run_ok "dropless block_to_expert" "$MOE" compare --exact b2e_want.npy r/block_to_expert.npy
run_ok "dropless token_position_to_id" "$MOE" compare --exact tpti_want.npy r/token_position_to_id.npy
run_ok "dropless affinities" "$MOE" compare --exact aff_want.npy r/expert_affinities_masked.npy
run_ok "route --block-size still writes the routing" "$NPY" info r/gather_indices.npy
has "routing next to the layout" out "<i8 (8,)"
run_ok "route --padding row" "$MOE" route --topk-ids ids.npy --experts 3 --block-size 2 --padding row --out rr
has "route --padding row prints the mark" out "padding row: empty positions hold 4" "--block-size 2 --padding row"
run_ok "dropless, row padding" "$MOE" compare --exact tpti_row_want.npy rr/token_position_to_id.npy
run_ok "dropless, row padding: the same blocks" "$MOE" compare --exact b2e_want.npy rr/block_to_expert.npy
if [ -e rr/expert_affinities_masked.npy ]; then bad "route without --topk-weights wrote affinities"; fi
# dropping, B = 2: one block per expert, the first 2 tokens of each: [0 2] [0 1] [1 -]; token 3 of
# expert 0 and tokens 2, 3 of expert 1 are dropped, and so are their affinities
"$NPY" mk b2e_drop_want.npy '<i8' 3 0 1 2
"$NPY" mk tpti_drop_want.npy '<i8' 6 0 2 0 1 1 4
"$NPY" mk aff_drop_want.npy '<f4' 12 0.5 0.25 0 0 1 2 3 0 0 0 0 0
run_ok "route --dropping" "$MOE" route --topk-ids ids.npy --experts 3 --block-size 2 --dropping --padding row \
    --topk-weights tw.npy --out rd
has "route --dropping counts the dropped pairs" out "(dropping, padding row" \
    "dropped: 3 (token, expert) pairs past the capacity of 2 tokens per expert"
run_ok "dropping block_to_expert" "$MOE" compare --exact b2e_drop_want.npy rd/block_to_expert.npy
run_ok "dropping token_position_to_id" "$MOE" compare --exact tpti_drop_want.npy rd/token_position_to_id.npy
run_ok "dropping affinities" "$MOE" compare --exact aff_drop_want.npy rd/expert_affinities_masked.npy
# --dropping alone: B = 128 (skip padding); an expert without tokens still gets its block
run_ok "route --dropping, default B" "$MOE" route --topk-ids ids.npy --experts 4 --dropping --out rd128
has "route --dropping default block size" out "N = 4 blocks of B = 128 positions" "dropped: 0"
run_ok "info" "$NPY" info rd128/token_position_to_id.npy
has "dropping B = 128 layout shape" out "<i8 (512,)"
# weights as (T*k,) bf16 patterns, written --raw: the same affinities, as bf16 patterns
"$NPY" mk tw_bf16.npy '<u2' 8 16128 16000 16256 16384 16448 16512 16544 16576
run_ok "route bf16 weights --raw" "$MOE" route --topk-ids ids.npy --experts 3 --block-size 2 --topk-weights tw_bf16.npy \
    --dtype bf16 --raw --out rb
run_ok "info" "$NPY" info rb/expert_affinities_masked.npy
has "route --raw bf16 affinities" out "<u2 (12,)"
run_ok "route bf16 affinities" "$MOE" compare --exact --dtype bf16 aff_want.npy rb/expert_affinities_masked.npy

# ---- route -> mlp-fwd -> mlp-bwd = the library, in every dtype, every option ----
for dt in f32 f16 bf16; do
    run_ok "genmlp $dt" "$NPY" genmlp "mlp_$dt" 20261123 "$dt"
    # route reads f32 / f16 weights as they are; bf16 weights are '<u2' patterns that need --dtype
    rdt=""
    if [ "$dt" = bf16 ]; then rdt="--dtype bf16"; fi
    for c in "mlp_$dt"/*/; do
        c=${c%/}
        name="$dt ${c#*/}"
        route_flags="" mlp_flags="" bwd_flags="" no_down_ckpt="" n_bwd=""
        . "./$c/case.sh"
        # shellcheck disable=SC2086 # word splitting of the flag lists is intended
        {
        run_ok "route $name" "$MOE" route --topk-ids "$c/ids.npy" --experts 4 $route_flags \
            --topk-weights "$c/tw.npy" $rdt --out "$c/route"
        run_ok "route $name = library" "$MOE" compare --exact "$c/layout" "$c/route"
        has "route $name: 3 files" out "summary: 3 tensor(s) compared, 0 over the tolerance or differing in shape"
        # the layout of route, unless the case holds it in NKI's shapes already
        if [ ! -e "$c/in/block_to_expert.npy" ]; then
            for f in token_position_to_id block_to_expert expert_affinities_masked; do
                cp "$c/route/$f.npy" "$c/in/"
            done
        fi
        # the forward writes next to its inputs, where the backward finds the checkpoints
        run_ok "mlp-fwd $name" "$MOE" mlp-fwd --in "$c/in" --out "$c/in" $mlp_flags --dtype "$dt"
        has "mlp-fwd $name summary" out "mlp-fwd: T = 7 tokens, E = 4 experts, H = 5, I = 3" "B = 3, $dt"
        case "$dt $mlp_flags" in
        f32*) ;;
        *--intermediates\ float32*) has "mlp-fwd $name says float32" out "B = 3, $dt, float32 intermediates" ;;
        *) has "mlp-fwd $name says it rounds" out "B = 3, $dt, intermediates rounded to $dt" ;;
        esac
        run_ok "mlp-fwd $name = library" "$MOE" compare --exact "$c/want_fwd" "$c/in"
        has "mlp-fwd $name: 3 files" out "summary: 3 tensor(s) compared, 0 over the tolerance or differing in shape"
        if [ "$no_down_ckpt" = 1 ]; then rm "$c/in/down_proj_act_checkpoint.npy"; fi
        run_ok "mlp-bwd $name" "$MOE" mlp-bwd --in "$c/in" --out "$c/grad" $mlp_flags $bwd_flags --dtype "$dt"
        if [ "$no_down_ckpt" = 1 ]; then has "mlp-bwd $name recomputes d" out "d recomputed (no down checkpoint)"; fi
        run_ok "mlp-bwd $name = library" "$MOE" compare --exact "$c/want_bwd" "$c/grad"
        has "mlp-bwd $name: $n_bwd files" out \
            "summary: $n_bwd tensor(s) compared, 0 over the tolerance or differing in shape, 0 missing"
        }
    done
    # --raw: the computation dtype itself (f16 '<f2', bf16 '<u2' patterns)
    c=mlp_$dt/1_base
    . "./$c/case.sh"
    # shellcheck disable=SC2086
    run_ok "mlp-fwd --raw $dt" "$MOE" mlp-fwd --in "$c/in" --out "$c/raw" $mlp_flags --dtype "$dt" --raw
    raw_is "mlp-fwd --raw $dt descr" "$c/raw/output.npy" "$dt" "(7, 5)"
    run_ok "mlp-fwd --raw $dt = library" "$MOE" compare --exact --dtype "$dt" "$c/want_fwd" "$c/raw"
    has "mlp-fwd --raw $dt: 3 files" out "summary: 3 tensor(s) compared, 0 over"
done

# the options reach the library: the same inputs without --clamp give other results
c=mlp_f32/3_gelu_tanh_clamp_dropping
run_ok "mlp-fwd without --clamp" "$MOE" mlp-fwd --in "$c/in" --out "$c/noclamp" --activation gelu_tanh
run_status "without --clamp the output differs" 1 "$MOE" compare --exact "$c/want_fwd/output.npy" "$c/noclamp/output.npy"
# The intermediates reach the library in both directions: the case rounds them (the default, no flag);
# --intermediates float32 changes the bf16 results (genmlp made sure it does), --round-intermediates is the
# default spelled out, and in f32 the choice changes no bit
c=mlp_bf16/6_round_intermediates
. "./$c/case.sh"
# shellcheck disable=SC2086
{
# the forward's options file in its folder: the backward takes the rounded intermediates from it, and
# refuses --intermediates float32, naming both
run_ok "mlp-bwd bf16 with the forward's options file" "$MOE" mlp-bwd --in "$c/in" --out "$c/from_file" $mlp_flags \
    --dtype bf16
run_ok "mlp-bwd bf16 with the file's options = library" "$MOE" compare --exact "$c/want_bwd" "$c/from_file"
run_status "mlp-bwd --intermediates float32 against the file" 2 "$MOE" mlp-bwd --in "$c/in" --out "$c/x" $mlp_flags \
    --intermediates float32 --dtype bf16
has "the conflict names both" err "--intermediates float32 conflicts with $c/in/moe-options.txt, which says intermediates = rounded"
rm "$c/in/moe-options.txt"
run_ok "mlp-fwd bf16 --intermediates float32" "$MOE" mlp-fwd --in "$c/in" --out "$c/unrounded" $mlp_flags \
    --intermediates float32 --dtype bf16
run_status "--intermediates float32: the forward differs" 1 "$MOE" compare --exact "$c/want_fwd" "$c/unrounded"
run_ok "mlp-bwd bf16 --intermediates float32" "$MOE" mlp-bwd --in "$c/in" --out "$c/unrounded_grad" $mlp_flags \
    --intermediates float32 --dtype bf16
run_status "--intermediates float32: the backward differs" 1 "$MOE" compare --exact "$c/want_bwd" \
    "$c/unrounded_grad"
run_ok "mlp-fwd bf16 --round-intermediates" "$MOE" mlp-fwd --in "$c/in" --out "$c/rounded" $mlp_flags \
    --round-intermediates --dtype bf16
run_ok "--round-intermediates is the default" "$MOE" compare --exact "$c/want_fwd" "$c/rounded"
run_ok "mlp-fwd bf16 --intermediates rounded" "$MOE" mlp-fwd --in "$c/in" --out "$c/rounded2" $mlp_flags \
    --intermediates rounded --dtype bf16
run_ok "--intermediates rounded is the default" "$MOE" compare --exact "$c/want_fwd" "$c/rounded2"
run_status "--intermediates float32 with --round-intermediates" 2 "$MOE" mlp-fwd --in "$c/in" --out "$c/bad" \
    $mlp_flags --intermediates float32 --round-intermediates --dtype bf16
has "the contradiction is named" err "--intermediates float32 and --round-intermediates contradict"
run_status "--intermediates half" 2 "$MOE" mlp-fwd --in "$c/in" --out "$c/bad" $mlp_flags --intermediates half
has "--intermediates half: the choices" err "--intermediates half: expected rounded (the default) or float32"
c=mlp_f32/6_round_intermediates
. "./$c/case.sh"
run_ok "mlp-fwd f32 --intermediates float32" "$MOE" mlp-fwd --in "$c/in" --out "$c/unrounded" $mlp_flags \
    --intermediates float32
run_ok "f32: --intermediates changes no bit" "$MOE" compare --exact "$c/want_fwd" "$c/unrounded"
}
# f16 inputs (and only those) run in f16 without --dtype
c=mlp_f16/1_base
mkdir f16_only
for f in hidden_states gate_up_proj_weight down_proj_weight token_position_to_id block_to_expert; do
    cp "$c/in/$f.npy" f16_only/
done
"$NPY" mk f16_only/tw.npy '<f2' 7,2 0.5
run_ok "route f16 --raw" "$MOE" route --topk-ids "$c/ids.npy" --experts 4 --block-size 3 --topk-weights f16_only/tw.npy \
    --raw --out f16_route
cp f16_route/expert_affinities_masked.npy f16_only/
run_ok "mlp-fwd infers f16" "$MOE" mlp-fwd --in f16_only --out f16_out
has "mlp-fwd infers f16" out ", f16"

finish
