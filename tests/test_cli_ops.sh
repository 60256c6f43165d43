#!/bin/sh
# One run of every grouped GEMM subcommand: on a random problem in every dtype and every routing mode,
# checked bit for bit against the library called directly (test_cli_npy gen); small problems with
# known answers; route against known routings; the help of every command. The MLP subcommands and
# route's blockwise layout: test_cli_mlp.sh.
. "$(dirname "$0")/test_cli_lib.sh"

# ---- known answers (inputs written with format 1.0 headers) ----
# E = 2 experts with 1 and 2 rows; W[0] = I, W[1] = [[1, 1], [0, 2]].
"$NPY" mk x.npy '<f4' 3,2 1 2 3 4 5 6
"$NPY" mk w.npy '<f8' 2,2,2 1 0 0 1 1 1 0 2
"$NPY" mk m.npy '<i8' 2 1 2
"$NPY" mk dy.npy '<f2' 3,2 1 0 0 1 1 1
"$NPY" mk y_want.npy '<f4' 3,2 1 2 7 8 11 12
"$NPY" mk dx_want.npy '<f4' 3,2 1 0 0 2 1 3
"$NPY" mk dw_want.npy '<f4' 2,2,2 1 2 0 0 5 6 8 10
run_ok "gemm-fwd known" "$MOE" gemm-fwd --x x.npy --w w.npy --m-sizes m.npy --out y.npy
has "gemm-fwd says what it wrote" out "wrote y.npy: shape (3, 2) float32"
run_ok "gemm-fwd known values" "$MOE" compare --exact y_want.npy y.npy
run_ok "gemm-dx known" "$MOE" gemm-dx --dy dy.npy --w w.npy --m-sizes m.npy --dtype f32 --out dx.npy
run_ok "gemm-dx known values" "$MOE" compare --exact dx_want.npy dx.npy
run_ok "gemm-dw known" "$MOE" gemm-dw --x x.npy --dy dy.npy --m-sizes m.npy --dtype=bf16 --out dw.npy
run_ok "gemm-dw known values" "$MOE" compare --exact dw_want.npy dw.npy
run_ok "gemm-dw --raw bf16" "$MOE" gemm-dw --x x.npy --dy dy.npy --m-sizes m.npy --dtype bf16 --raw --out dw_raw.npy
run_ok "info" "$NPY" info dw_raw.npy
has "--raw bf16 writes uint16 patterns" out "<u2 (2, 2, 2)"
run_ok "gemm-dw --raw known values" "$MOE" compare --exact --dtype bf16 dw_want.npy dw_raw.npy
# --allow-tf32: the reference stays true fp32 (the known answer, exactly); refused with a 16-bit dtype
run_ok "gemm-fwd --allow-tf32" "$MOE" gemm-fwd --x x.npy --w w.npy --m-sizes m.npy --allow-tf32 --out y_tf32.npy
run_ok "gemm-fwd --allow-tf32 known values" "$MOE" compare --exact y_want.npy y_tf32.npy
refused "--allow-tf32 with bf16" "options.allow_tf32 applies to MOE_F32 only" -- \
    "$MOE" gemm-fwd --x x.npy --w w.npy --m-sizes m.npy --dtype bf16 --allow-tf32 --out y_tf32_bf16.npy
# an empty problem: T = 0
"$NPY" mk m0.npy '<i4' 3 0
"$NPY" mk x0.npy '<f4' 0,4
"$NPY" mk w0.npy '<f4' 3,2,4 1
run_ok "gemm-fwd T = 0" "$MOE" gemm-fwd --x x0.npy --w w0.npy --m-sizes m0.npy --out y0.npy
run_ok "info y0" "$NPY" info y0.npy
has "gemm-fwd T = 0 shape" out "<f4 (0, 2)"

# ---- route: known routings ----
"$NPY" mk ids.npy '<i4' 3,2 2 0 1 2 0 1
"$NPY" mk m_want.npy '<i8' 3 2 2 2
"$NPY" mk g_want.npy '<i8' 6 1 4 2 5 0 3
"$NPY" mk s_want.npy '<i8' 6 4 0 2 5 1 3
run_ok "route" "$MOE" route --topk-ids ids.npy --experts 3 --out routing/a
has "route summary" out "T = 3 tokens, k = 2, E = 3 experts, M = 6 rows" "wrote routing/a/gather_indices.npy"
run_ok "route m_sizes" "$MOE" compare m_want.npy routing/a/m_sizes.npy
run_ok "route gather" "$MOE" compare g_want.npy routing/a/gather_indices.npy
run_ok "route scatter" "$MOE" compare s_want.npy routing/a/scatter_indices.npy
"$NPY" mk ids1.npy '<i8' 3 1 0 1
"$NPY" mk g1_want.npy '<i8' 3 1 0 2
run_ok "route (T,) ids" "$MOE" route --topk-ids ids1.npy --experts 2 --out r1
run_ok "route (T,) gather" "$MOE" compare --exact g1_want.npy r1/gather_indices.npy

# ---- every mode and dtype against the library called directly ----
for dt in f32 f16 bf16; do
    d=$dt
    run_ok "gen $dt" "$NPY" gen "$d" 20261122 "$dt"
    # f32 and f16 inputs are '<f4' / '<f2' (the dtype is inferred); bf16 inputs are '<u2' patterns
    dtflag=""
    if [ "$dt" = bf16 ]; then dtflag="--dtype bf16"; fi
    run_ok "route $dt" "$MOE" route --topk-ids "$d/ids.npy" --experts 4 --out "$d/route"
    for name in m_sizes gather_indices scatter_indices; do
        run_ok "route $dt $name" "$MOE" compare --exact "$d/route_$name.npy" "$d/route/$name.npy"
    done
    g="--m-sizes $d/m_sizes.npy --gather $d/gather.npy --topk 2"
    mkdir "$d/out"
    for px in 0 1; do
        for py in 0 1; do
            for tw in 0 1; do
                gemm_mode "$d" "$px" "$py" "$tw"
                # shellcheck disable=SC2086 # word splitting of the flag lists is intended
                {
                run_ok "gemm-fwd $dt $tag" "$MOE" gemm-fwd --x "$x" --w "$d/w.npy" $flags $dtflag --out "$d/out/y_$tag.npy"
                run_ok "gemm-dx $dt $tag" "$MOE" gemm-dx --dy "$d/dy.npy" --w "$d/w.npy" $flags $dtflag \
                    --out "$d/out/dx_$tag.npy"
                run_ok "gemm-dx --reduce-topk $dt $tag" "$MOE" gemm-dx --dy "$d/dy.npy" --w "$d/w.npy" $rflags \
                    --reduce-topk $dtflag --out "$d/out/dxr_$tag.npy"
                run_ok "gemm-dw $dt $tag" "$MOE" gemm-dw --x "$x" --dy "$d/dy.npy" $rflags $dtflag \
                    --out "$d/out/dw_$tag.npy" --w "$d/w.npy" --out-topk-weights-grad "$d/out/dtw_$tag.npy"
                run_ok "gemm-dw --dw-fp32 $dt $tag" "$MOE" gemm-dw --x "$x" --dy "$d/dy.npy" $flags $dtflag \
                    --dw-fp32 --out "$d/out/dwf_$tag.npy"
                }
            done
        done
    done
    # every output (y, dx, dxr, dw, dtw, dwf for the 8 modes) equals the library's, bit for bit
    run_ok "$dt: every op and mode = library" "$MOE" compare --exact "$d/out" "$d"
    has "$dt: 48 outputs compared" out "summary: 48 tensor(s) compared, 0 over the tolerance or differing in shape, 0 missing"
    # shellcheck disable=SC2086
    {
    # --raw: the computation dtype itself
    run_ok "gemm-fwd --raw $dt" "$MOE" gemm-fwd --x "$d/x_tok.npy" --w "$d/w.npy" $g --permute-x --permute-y \
        --topk-weights "$d/tw.npy" $dtflag --raw --out "$d/y_raw.npy" --bound-out "$d/y_bound.npy"
    run_ok "gemm-fwd --raw $dt = library" "$MOE" compare --exact --dtype "$dt" "$d/y_raw_111.npy" "$d/y_raw.npy"
    raw_is "gemm-fwd --raw $dt descr" "$d/y_raw.npy" "$dt" "(14, 5)"
    # --bound-out: the oracle's bound, float64
    run_ok "--bound-out $dt = oracle" "$MOE" compare --exact "$d/y_bound_111.npy" "$d/y_bound.npy"
    run_ok "compare --bound $dt" "$MOE" compare --dtype "$dt" --bound "$d/y_bound.npy" "$d/y_111.npy" "$d/y_raw.npy"
    # float32 and float64 inputs off the dtype's grid are rounded once on load
    run_ok "gemm-fwd rounded inputs $dt" "$MOE" gemm-fwd --x "$d/x_tok_f32.npy" --w "$d/w_f64.npy" $g --permute-x \
        --dtype "$dt" --out "$d/y_rounded.npy"
    run_ok "gemm-fwd rounded inputs $dt = library" "$MOE" compare --exact "$d/y_rounded_100.npy" "$d/y_rounded.npy"
    }
done

# ---- compare, folder against folder ----
run_ok "compare folders" "$MOE" compare f16 f16
has "compare folders summary" out "summary:" "0 over the tolerance"

# ---- help documents every flag (moe help all: every command's help; test_cli_help.sh: moe --help) ----
run_ok "moe help all" "$MOE" help all
has "moe help all lists every command" out gemm-fwd gemm-dx gemm-dw route compare mlp-fwd mlp-bwd autotune
cp out full_help
check_help() {
    cmd=$1
    shift
    run_ok "moe $cmd --help" "$MOE" "$cmd" --help
    has "moe $cmd --help documents its flags" out "usage: moe $cmd" "$@" "--help"
    has "moe help all documents $cmd's flags" full_help "$@"
}
check_help gemm-fwd --x --w --m-sizes --gather --topk --permute-x --permute-y --topk-weights --dtype --allow-tf32 \
    --backend --out --raw --bound-out "NaN bytes"
check_help gemm-dx --dy --w --m-sizes --gather --topk --permute-x --permute-y --topk-weights --reduce-topk --dtype \
    --allow-tf32 --backend --out --raw
check_help gemm-dw --x --dy --m-sizes --gather --topk --permute-x --permute-y --topk-weights --dw-fp32 --dtype \
    --allow-tf32 --backend --out --w --out-topk-weights-grad --raw
check_help route --topk-ids --experts --block-size --dropping --padding --topk-weights --dtype --raw --out m_sizes.npy \
    gather_indices.npy token_position_to_id.npy block_to_expert.npy expert_affinities_masked.npy
check_help compare --dtype --reduction-length --bound --exact --atol --rtol "Exit status 1" "2*(u*max(|a|,|b|) + eta)"
check_help mlp-fwd --in --out --block-size --activation --affinity-on --bias --clamp --padding --no-accumulate --dtype \
    --backend --raw --weight-layout hidden_states.npy expert_affinities_masked.npy gate_up_proj_weight.npy down_proj_weight.npy \
    gate_up_proj_bias.npy down_proj_bias.npy token_position_to_id.npy block_to_expert.npy output.npy \
    gate_up_proj_act_checkpoint_T.npy down_proj_act_checkpoint.npy
check_help mlp-bwd --in --out --block-size --activation --affinity-on --bias --clamp --padding --no-accumulate \
    --grad-fp32 --dtype --backend --raw --weight-layout topk_weights_grad.npy output_hidden_states_grad.npy hidden_states_grad.npy \
    expert_affinities_masked_grad.npy gate_up_proj_weight_grad.npy down_proj_weight_grad.npy \
    gate_up_proj_bias_grad.npy down_proj_bias_grad.npy
run_ok "moe help compare" "$MOE" help compare
has "moe help compare" out "usage: moe compare"
run_ok "moe --version" "$MOE" --version
has "moe --version" out "moe (libmoe)"

finish
