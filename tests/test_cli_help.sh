#!/bin/sh
# moe --help is one screen with an example per command, every command's --help ends with a worked
# example, and the examples run, in moe --help's order, each on the files the ones before it made
# (autotune's needs a GPU: it is only parsed there). test_cli_ops.sh checks that the help names every flag.
. "$(dirname "$0")/test_cli_lib.sh"

run_ok "moe --help" "$MOE" --help
lines=$(wc -l <out)
if [ "$lines" -le 52 ]; then passed=$((passed + 1)); else bad "moe --help prints $lines lines, at most 52 expected"; fi
cp out overview
commands=$(sed -n 's/^\([a-z][a-z0-9-]*\)  .*/\1/p' overview | tr '\n' ' ')
if [ "$commands" = "route gemm-fwd compare gemm-dx gemm-dw fp8-quantize gemm-fp8-fwd gemm-fp8-dx gemm-fp8-dw mlp-fwd mlp-bwd autotune " ]; then
    passed=$((passed + 1))
else
    bad "moe --help lists [$commands]"
fi

# the files a user has before the first example: a grouped GEMM step (T = 6 tokens, top-2 of E = 4
# experts, K = 16, N = 8) and an MLP layer (T = 8, top-2 of 4, H = 16, I = 8)
mkdir step mlp
"$NPY" mk step/topk_ids.npy '<i8' 6,2 0 1 2 3 1 2 3 0 0 2 1 3
"$NPY" mk step/x.npy '<f4' 6,16 0.5 -1 0.25 2 -0.75
"$NPY" mk step/w.npy '<f4' 4,8,16 0.125 -0.5 0.25 1 -0.375 0.75
"$NPY" mk step/y.npy '<f4' 12,8 1
"$NPY" mk step/dy.npy '<f4' 12,8 0.5 -0.25 1
"$NPY" mk mlp/topk_ids.npy '<i8' 8,2 0 1 2 3 1 2 3 0 0 2 1 3 2 0 3 1
"$NPY" mk mlp/topk_weights.npy '<f4' 8,2 0.75 0.25 0.5
"$NPY" mk mlp/hidden_states.npy '<f4' 8,16 0.5 -1 0.25 2 -0.75
"$NPY" mk mlp/gate_up_proj_weight.npy '<f4' 4,16,2,8 0.125 -0.5 0.25 1 -0.375
"$NPY" mk mlp/down_proj_weight.npy '<f4' 4,8,16 0.25 -0.125 0.5
"$NPY" mk mlp/output_hidden_states_grad.npy '<f4' 8,16 1 -0.5 0.25
# shellcheck disable=SC2317 # called by the examples
moe() { "$MOE" "$@"; }
# shellcheck disable=SC2086 # one command a word
for cmd in $commands; do
    run_ok "moe $cmd --help" "$MOE" "$cmd" --help
    # the example: what follows "Example:", its command lines joined where they end in a backslash
    sed -n '/^Example:$/,$p' out >example
    has "moe $cmd --help ends with an example" example "Example:" "  moe $cmd "
    has "moe --help shows $cmd's example" overview "$(grep "^  moe $cmd " example)"
    sed -n 's/^  //p' example | grep -v '^#' | sed -e ':a' -e '/\\$/N; s/\\\n//; ta' >commands.sh
    if [ "$cmd" = autotune ]; then continue; fi
    while IFS= read -r line; do
        eval "$line" >out 2>err
        status=$?
        # compare's verdict on the made-up step/y.npy may be a difference (1); an error (2) never
        if [ "$status" -le 1 ] && [ -s out ]; then passed=$((passed + 1)); else bad "example of $cmd: exit $status: $line"; fi
    done <commands.sh
done
for f in routing/gather_indices.npy y_ref.npy y_bound.npy dx_ref.npy dw_ref.npy x8/q.npy w8/scales.npy y8.npy y8_bound.npy dx8.npy xc/scales.npy dyc/q.npy dw8.npy dw8_bound.npy mlp/output.npy grads/hidden_states_grad.npy \
    grads/topk_weights_grad.npy; do
    if [ -s "$f" ]; then passed=$((passed + 1)); else bad "the examples did not write $f"; fi
done
finish
