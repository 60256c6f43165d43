#!/bin/sh
# mlp-fwd / mlp-bwd --weight-layout: every layout round-trips the cases of `test_cli_npy genmlp` (f32 and
# bf16) bit for bit against the library's NKI-layout results, the weights converted into the layout and
# the weight gradients converted back by the tests' own `test_cli_npy relayout` (numpy's transpose and
# reshape, written apart from cli/layouts.c); the (T, k) gradient route --topk-weights leads to; and the
# refusals: a wrong shape names the layout's expected shape, hf-gpt-oss says why it is not computed.
. "$(dirname "$0")/test_cli_lib.sh"

# genmlp's sizes: E = 4 experts, H = 5, I = 3
E=4 H=5 I=3

# to_layout LAYOUT SRC DST SUFFIX BIAS: NKI's weight files SRC/NAME$SUFFIX.npy (biases when BIAS = 1) as
# LAYOUT's files in DST.
to_layout() {
    l=$1 src=$2 dst=$3 sfx=$4
    gu=$src/gate_up_proj_weight$sfx.npy wd=$src/down_proj_weight$sfx.npy
    bgu=$src/gate_up_proj_bias$sfx.npy bd=$src/down_proj_bias$sfx.npy
    case $l in
    nki)
        cp "$gu" "$wd" "$dst/"
        if [ "$5" = 1 ]; then cp "$bgu" "$bd" "$dst/"; fi ;;
    linear | hf-mixtral | hf-qwen3-moe)
        "$NPY" relayout "$gu" "$dst/gate_up_proj_weight$sfx.npy" 0,2,3,1 $E,$((2 * I)),$H
        "$NPY" relayout "$wd" "$dst/down_proj_weight$sfx.npy" 0,2,1 $E,$H,$I
        if [ "$5" = 1 ]; then
            "$NPY" relayout "$bgu" "$dst/gate_up_proj_bias$sfx.npy" 0,1,2 $E,$((2 * I))
            cp "$bd" "$dst/"
        fi ;;
    linear-split)
        "$NPY" relayout "$gu" "$dst/gate_proj_weight$sfx.npy" 2,0,3,1 $E,$I,$H 0 2
        "$NPY" relayout "$gu" "$dst/up_proj_weight$sfx.npy" 2,0,3,1 $E,$I,$H 1 2
        "$NPY" relayout "$wd" "$dst/down_proj_weight$sfx.npy" 0,2,1 $E,$H,$I
        if [ "$5" = 1 ]; then
            "$NPY" relayout "$bgu" "$dst/gate_proj_bias$sfx.npy" 1,0,2 $E,$I 0 2
            "$NPY" relayout "$bgu" "$dst/up_proj_bias$sfx.npy" 1,0,2 $E,$I 1 2
            cp "$bd" "$dst/"
        fi ;;
    hf-llama4)
        "$NPY" relayout "$gu" "$dst/gate_up_proj_weight$sfx.npy" 0,1,2,3 $E,$H,$((2 * I))
        cp "$wd" "$dst/" ;;
    esac
}

layouts="nki linear linear-split hf-mixtral hf-qwen3-moe hf-llama4"
for dt in f32 bf16; do
    run_ok "genmlp $dt" "$NPY" genmlp "mlp_$dt" 20261206 "$dt"
    for c in "mlp_$dt"/*/; do
        c=${c%/}
        mlp_flags="" bwd_flags="" no_down_ckpt="" n_bwd=""
        # shellcheck disable=SC1090 # genmlp's flags of the case
        . "./$c/case.sh"
        bias=0
        case $mlp_flags in *--bias*) bias=1 ;; esac
        for l in $layouts; do
            name="$dt ${c#*/} $l"
            if [ $bias = 1 ] && [ "${l#hf-}" != "$l" ]; then
                mkdir "$c/$l"
                # shellcheck disable=SC2086 # word splitting of the flag lists is intended
                refused "$name: --bias refused" "--bias: --weight-layout $l has no biases" -- \
                    "$MOE" mlp-fwd --in "$c/in" --out "$c/$l" --weight-layout $l $mlp_flags --dtype "$dt"
                continue
            fi
            mkdir "$c/$l" "$c/$l/want"
            for f in "$c"/in/*.npy; do
                case $f in */gate_up_proj_*.npy | */down_proj_weight.npy | */down_proj_bias.npy) ;; *) cp "$f" "$c/$l/" ;; esac
            done
            if [ ! -e "$c/in/block_to_expert.npy" ]; then cp "$c"/layout/*.npy "$c/$l/"; fi
            to_layout "$l" "$c/in" "$c/$l" "" $bias
            # shellcheck disable=SC2086
            {
            run_ok "mlp-fwd $name" "$MOE" mlp-fwd --in "$c/$l" --out "$c/$l" --weight-layout $l $mlp_flags --dtype "$dt"
            run_ok "mlp-fwd $name = library (NKI layout)" "$MOE" compare --exact "$c/want_fwd" "$c/$l"
            has "mlp-fwd $name: 3 files" out "summary: 3 tensor(s) compared, 0 over the tolerance or differing in shape"
            if [ "$no_down_ckpt" = 1 ]; then rm "$c/$l/down_proj_act_checkpoint.npy"; fi
            run_ok "mlp-bwd $name" "$MOE" mlp-bwd --in "$c/$l" --out "$c/$l/grad" --weight-layout $l $mlp_flags \
                $bwd_flags --dtype "$dt"
            }
            cp "$c/want_bwd/hidden_states_grad.npy" "$c/want_bwd/expert_affinities_masked_grad.npy" "$c/$l/want/"
            to_layout "$l" "$c/want_bwd" "$c/$l/want" _grad $bias
            n=$n_bwd # linear-split: gate and up apart, one file more for the weight and one for the bias
            if [ "$l" = linear-split ]; then n=$((n + 1 + bias)); fi
            run_ok "mlp-bwd $name = library (NKI layout), converted back" "$MOE" compare --exact "$c/$l/want" "$c/$l/grad"
            has "mlp-bwd $name: $n files" out \
                "summary: $n tensor(s) compared, 0 over the tolerance or differing in shape, 0 missing"
        done
    done
done

# a linear layout is not NKI's: the same files read as nki are refused, and nki's read as linear too
c=mlp_f32/1_base
refused "linear files as nki" "$c/linear/gate_up_proj_weight.npy: expected gate_up_proj_weight of shape (E, H, 2, I) (--weight-layout nki)" \
    "found (4, 6, 5) float32" -- "$MOE" mlp-fwd --in "$c/linear" --out o
mkdir bad && cp "$c"/linear/*.npy bad/ && cp "$c/nki/down_proj_weight.npy" bad/
for l in linear hf-mixtral hf-qwen3-moe; do
    refused "nki down file as $l" "bad/down_proj_weight.npy: expected down_proj_weight of shape (4, 5, 3) = (E, H, I) (--weight-layout $l; E, H and I from bad/gate_up_proj_weight.npy)" \
        "found (4, 3, 5) float32" -- "$MOE" mlp-fwd --in bad --out o --weight-layout $l
done
cp "$c/hf-llama4/gate_up_proj_weight.npy" "$c/linear/down_proj_weight.npy" bad/
refused "linear down file as hf-llama4" "bad/down_proj_weight.npy: expected down_proj_weight of shape (4, 3, 5) = (E, I, H) (--weight-layout hf-llama4; E, I and H from bad/gate_up_proj_weight.npy)" \
    "found (4, 5, 3) float32" -- "$MOE" mlp-fwd --in bad --out o --weight-layout hf-llama4
rm -r bad && mkdir bad && cp "$c"/linear/*.npy bad/
# wrong shapes name the layout's shape
"$NPY" mk bad/gate_up_proj_weight.npy '<f4' 4,5,5 1
refused "linear gate_up with an odd 2*I" "bad/gate_up_proj_weight.npy: expected gate_up_proj_weight of shape (E, 2*I, H) (--weight-layout linear)" \
    "found (4, 5, 5) float32" -- "$MOE" mlp-fwd --in bad --out o --weight-layout linear
rm -r bad && mkdir bad && cp "$c"/linear-split/*.npy bad/
"$NPY" mk bad/up_proj_weight.npy '<f4' 4,3,4 1
refused "linear-split up of another shape" "bad/up_proj_weight.npy: expected up_proj_weight of shape (4, 3, 5) = (E, I, H) (--weight-layout linear-split; E, I and H from bad/gate_proj_weight.npy)" \
    "found (4, 3, 4) float32" -- "$MOE" mlp-fwd --in bad --out o --weight-layout linear-split
"$NPY" mk bad/up_proj_weight.npy '<f2' 4,3,5 1
refused "linear-split gate and up of two dtypes" "bad/up_proj_weight.npy: float16, but bad/gate_proj_weight.npy is float32" \
    -- "$MOE" mlp-fwd --in bad --out o --weight-layout linear-split
rm bad/up_proj_weight.npy
refused "linear-split without the up file" "bad/up_proj_weight.npy: cannot open" \
    -- "$MOE" mlp-fwd --in bad --out o --weight-layout linear-split
refused "hf-llama4 gate_up" "$c/linear/gate_up_proj_weight.npy: expected gate_up_proj_weight of shape (E, H, 2*I) (--weight-layout hf-llama4)" \
    -- "$MOE" mlp-fwd --in "$c/linear" --out o --weight-layout hf-llama4
refused "hf-gpt-oss is not computed" "--weight-layout hf-gpt-oss: not computed" "(clamp(up) + 1) * glu" \
    -- "$MOE" mlp-fwd --in "$c/nki" --out o --weight-layout hf-gpt-oss
refused "unknown layout" "--weight-layout torch: expected one of nki, linear, linear-split, hf-mixtral, hf-qwen3-moe, hf-llama4, hf-gpt-oss" \
    -- "$MOE" mlp-bwd --in "$c/nki" --out o --weight-layout torch

# the router's (T, k) order: route --topk-weights writes router_topk_ids.npy, and mlp-bwd then writes
# topk_weights_grad.npy[t][j] = expert_affinities_masked_grad[t*E + ids[t][j]] (hand-checked routing:
# T = 2 tokens, k = 2, E = 3; token 0 chose experts 2 then 0, token 1 experts 1 then 2)
mkdir tk
"$NPY" mk tk/ids.npy '<i8' 2,2 2 0 1 2
"$NPY" mk tk/tw.npy '<f4' 2,2 0.75 0.25 0.5 0.5
"$NPY" mk tk/hidden_states.npy '<f4' 2,2 1 -1 0.5 2
"$NPY" mk tk/gate_up_proj_weight.npy '<f4' 3,2,2,1 1 -0.5 0.25 2 0.5 1 -1 0.75 2 1 0.5 -0.5
"$NPY" mk tk/down_proj_weight.npy '<f4' 3,1,2 1 -1 0.5 2 -1 1
"$NPY" mk tk/output_hidden_states_grad.npy '<f4' 2,2 1 2 -1 0.5
run_ok "route writes the router's order" "$MOE" route --topk-ids tk/ids.npy --experts 3 --block-size 2 --topk-weights tk/tw.npy --out tk
has "route: router_topk_ids.npy" out "wrote tk/router_topk_ids.npy: shape (2, 2) int64"
run_ok "route: the ids as given" "$MOE" compare --exact tk/ids.npy tk/router_topk_ids.npy
run_ok "mlp-fwd" "$MOE" mlp-fwd --in tk --out tk
run_ok "mlp-bwd writes the (T, k) gradient" "$MOE" mlp-bwd --in tk --out tk/grad
has "mlp-bwd: topk_weights_grad.npy" out "wrote tk/grad/topk_weights_grad.npy: shape (2, 2) float32"
run_ok "info" "$NPY" info tk/grad/expert_affinities_masked_grad.npy
has "the dense gradient stays" out "<f4 (6,)"
# router_topk_ids.npy must be the routing's: T rows, experts in [0, E)
cp -r tk tk_bad
"$NPY" mk tk_bad/router_topk_ids.npy '<i8' 3,2 0
refused "router_topk_ids of another T" "tk_bad/router_topk_ids.npy: expected router_topk_ids of shape (2, k)" \
    "found (3, 2) int64" -- "$MOE" mlp-bwd --in tk_bad --out o
"$NPY" mk tk_bad/router_topk_ids.npy '<i8' 2,2 2 0 1 3
refused "router_topk_ids out of range" "tk_bad/router_topk_ids.npy: [1, 1] = 3, expected an expert in [0, 3)" \
    -- "$MOE" mlp-bwd --in tk_bad --out o
# the last N float32 values of a .npy file, as od prints them
values() { od -A n -v -t f4 -j $(($(wc -c <"$1") - 4 * $2)) "$1" | tr -s ' \n' '  '; }
# shellcheck disable=SC2046 # the six values as $1 .. $6
set -- $(values tk/grad/expert_affinities_masked_grad.npy 6)
want="$3 $1 $5 $6" # t*E + ids[t][j]: [2], [0], [4], [5]
got=$(values tk/grad/topk_weights_grad.npy 4 | sed 's/^ //; s/ $//')
if [ "$got" = "$want" ] && [ "$1" != 0 ] && [ "$6" != 0 ] && [ "$2" = 0 ]; then passed=$((passed + 1)); else
    bad "topk_weights_grad.npy = [$got], expected [$want] from the dense gradient [$*]"; fi
# --bound-out: the (T, k) gradient's bound is the dense one's, in the router's order
run_ok "mlp-bwd --bound-out with the router's order" "$MOE" mlp-bwd --in tk --out tk/grad2 --bound-out tk/bound
has "the (T, k) bound" out "wrote tk/bound/topk_weights_grad.npy: shape (2, 2) float64"
values64() { od -A n -v -t f8 -j $(($(wc -c <"$1") - 8 * $2)) "$1" | tr -s ' \n' '  '; }
# shellcheck disable=SC2046
set -- $(values64 tk/bound/expert_affinities_masked_grad.npy 6)
want="$3 $1 $5 $6"
got=$(values64 tk/bound/topk_weights_grad.npy 4 | sed 's/^ //; s/ $//')
if [ "$got" = "$want" ] && [ "$1" != 0 ]; then passed=$((passed + 1)); else
    bad "bound of topk_weights_grad.npy = [$got], expected [$want] from the dense bound [$*]"; fi
# --bound-out in a layout: the weight gradients' bounds are NKI's, moved as the gradients are
c=mlp_f32/2_gelu_bias_on_i_row
mlp_flags="" bwd_flags=""
# shellcheck disable=SC1090
. "./$c/case.sh"
# shellcheck disable=SC2086
{
run_ok "mlp-bwd nki --bound-out" "$MOE" mlp-bwd --in "$c/nki" --out "$c/nki/bgrad" $mlp_flags $bwd_flags --dtype f32 \
    --bound-out "$c/nki/bound"
run_ok "mlp-bwd linear-split --bound-out" "$MOE" mlp-bwd --in "$c/linear-split" --out "$c/linear-split/bgrad" \
    --weight-layout linear-split $mlp_flags $bwd_flags --dtype f32 --bound-out "$c/linear-split/bound"
}
has "the bounds in the layout's files" out "wrote $c/linear-split/bound/gate_proj_weight_grad.npy: shape (4, 3, 5) float64"
mkdir "$c/bound_want"
cp "$c/nki/bound/hidden_states_grad.npy" "$c/nki/bound/expert_affinities_masked_grad.npy" "$c/bound_want/"
to_layout linear-split "$c/nki/bound" "$c/bound_want" _grad 1
run_ok "the layout's bounds = NKI's, moved" "$MOE" compare --exact "$c/bound_want" "$c/linear-split/bound"
has "every bound file" out "summary: 8 tensor(s) compared, 0 over the tolerance or differing in shape, 0 missing"

finish
