#!/bin/sh
# moe --backend cuda against --backend ref, on a GPU machine: every subcommand that takes --backend, in
# every dtype, on the cases test_cli_ops.sh and test_cli_mlp.sh check bit for bit against the reference.
# Exit 77 (skip) where --backend cuda cannot run (a build without CUDA, or no usable device).
# Run from the build folder: sh SRCDIR/tests/test_cli_cuda.sh
#
# Tolerances (the GPU sums in another order, so bits may differ):
#  - gemm-fwd, gemm-dx, gemm-dw: `compare --bound` with the float64 oracle's per-element bound the ref
#    run writes (--bound-out): each side is within it of the exact result (SEMANTICS section 4).
#  - the topk-weights gradient (no --bound-out): --reduction-length N*K, the bound of a float32 sum of
#    N*K products with sum |terms| taken as max(|a|,|b|) (compare --help: it assumes no cancellation).
#  - mlp-fwd, mlp-bwd: `compare --bound` with the per-element bounds the ref run writes (--bound-out, the
#    oracle's MLP bound that proptest/test_gpu_mlp holds the GPU to, split operands included): each side is
#    within it of the exact result.
. "$(dirname "$0")/test_cli_lib.sh"

# ---- can --backend cuda run here? ----
"$NPY" mk x.npy '<f4' 3,2 1 2 3 4 5 6
"$NPY" mk w.npy '<f4' 2,2,2 1 0 0 1 1 1 0 2
"$NPY" mk m.npy '<i8' 2 1 2
"$NPY" mk y_want.npy '<f4' 3,2 1 2 7 8 11 12
"$MOE" gemm-fwd --x x.npy --w w.npy --m-sizes m.npy --out y.npy --backend cuda >out 2>err
probe=$?
if [ "$probe" -eq 2 ] && { grep -qF "this build has no CUDA backend" err || grep -qF "no CUDA device available" err; }; then
    echo "SKIP: $(cat err)"
    exit 77
fi
if [ "$probe" -ne 0 ]; then
    bad "gemm-fwd --backend cuda on a known problem: exit $probe"
    finish
fi
passed=$((passed + 1))
run_ok "cuda known values" "$MOE" compare --exact y_want.npy y.npy

# dims FILE: the numbers of the shape `test_cli_npy info` prints, space-separated
dims() { "$NPY" info "$1" | sed 's/.*(\(.*\)).*/\1/; s/,/ /g'; }

# ---- grouped GEMMs: every dtype and routing mode ----
for dt in f32 f16 bf16; do
    d=$dt
    run_ok "gen $dt" "$NPY" gen "$d" 20261124 "$dt"
    dtflag=""
    if [ "$dt" = bf16 ]; then dtflag="--dtype bf16"; fi
    mkdir "$d/ref" "$d/cuda"
    set -- $(dims "$d/dy.npy")
    N=$2
    set -- $(dims "$d/x_exp.npy")
    K=$2
    for px in 0 1; do
        for py in 0 1; do
            for tw in 0 1; do
                gemm_mode "$d" "$px" "$py" "$tw"
                for b in ref cuda; do
                    # shellcheck disable=SC2086 # word splitting of the flag lists is intended
                    {
                    run_ok "gemm-fwd $dt $tag $b" "$MOE" gemm-fwd --x "$x" --w "$d/w.npy" $flags $dtflag --backend $b \
                        --out "$d/$b/y_$tag.npy" --bound-out "$d/$b/y_$tag.bound.npy"
                    run_ok "gemm-dx $dt $tag $b" "$MOE" gemm-dx --dy "$d/dy.npy" --w "$d/w.npy" $flags $dtflag \
                        --backend $b --out "$d/$b/dx_$tag.npy" --bound-out "$d/$b/dx_$tag.bound.npy"
                    run_ok "gemm-dx --reduce-topk $dt $tag $b" "$MOE" gemm-dx --dy "$d/dy.npy" --w "$d/w.npy" $rflags \
                        --reduce-topk $dtflag --backend $b --out "$d/$b/dxr_$tag.npy" --bound-out "$d/$b/dxr_$tag.bound.npy"
                    run_ok "gemm-dw $dt $tag $b" "$MOE" gemm-dw --x "$x" --dy "$d/dy.npy" $rflags $dtflag --backend $b \
                        --out "$d/$b/dw_$tag.npy" --bound-out "$d/$b/dw_$tag.bound.npy" \
                        --w "$d/w.npy" --out-topk-weights-grad "$d/$b/dtw_$tag.npy"
                    run_ok "gemm-dw --dw-fp32 $dt $tag $b" "$MOE" gemm-dw --x "$x" --dy "$d/dy.npy" $flags $dtflag \
                        --dw-fp32 --backend $b --out "$d/$b/dwf_$tag.npy" --bound-out "$d/$b/dwf_$tag.bound.npy"
                    }
                done
                for o in y dx dxr dw dwf; do
                    run_ok "$o $dt $tag: cuda = ref within the bound" "$MOE" compare --dtype "$dt" \
                        --bound "$d/ref/${o}_$tag.bound.npy" "$d/ref/${o}_$tag.npy" "$d/cuda/${o}_$tag.npy"
                done
                run_ok "dtw $dt $tag: cuda = ref within gamma(N*K)" "$MOE" compare --dtype "$dt" \
                    --reduction-length $((N * K)) "$d/ref/dtw_$tag.npy" "$d/cuda/dtw_$tag.npy"
            done
        done
    done
done

# ---- f32 with --allow-tf32 (TF32 tensor cores where the shape allows them): cuda within the bound the ref
# run writes with the same flag, which charges TF32's rounding (the reference itself stays true fp32) ----
d=f32
gemm_mode "$d" 0 0 0
for b in ref cuda; do
    # shellcheck disable=SC2086 # word splitting of the flag lists is intended
    {
    run_ok "gemm-fwd --allow-tf32 $b" "$MOE" gemm-fwd --x "$x" --w "$d/w.npy" $flags --allow-tf32 --backend $b \
        --out "$d/$b/y_tf32.npy" --bound-out "$d/$b/y_tf32.bound.npy"
    run_ok "gemm-dx --allow-tf32 $b" "$MOE" gemm-dx --dy "$d/dy.npy" --w "$d/w.npy" $flags --allow-tf32 --backend $b \
        --out "$d/$b/dx_tf32.npy" --bound-out "$d/$b/dx_tf32.bound.npy"
    run_ok "gemm-dw --allow-tf32 $b" "$MOE" gemm-dw --x "$x" --dy "$d/dy.npy" $flags --allow-tf32 --backend $b \
        --out "$d/$b/dw_tf32.npy" --bound-out "$d/$b/dw_tf32.bound.npy"
    }
done
for o in y dx dw; do
    run_ok "$o f32 --allow-tf32: cuda = ref within the bound" "$MOE" compare --dtype f32 \
        --bound "$d/ref/${o}_tf32.bound.npy" "$d/ref/${o}_tf32.npy" "$d/cuda/${o}_tf32.npy"
done

# ---- a bad routing is refused with --backend cuda too (the host check runs first) ----
"$NPY" mk mbad.npy '<i8' 2 1 2
"$NPY" mk gbad.npy '<i8' 3 0 0 1
"$NPY" mk twbad.npy '<f4' 3 1 1 1
run_status "a bad gather with --backend cuda" 2 "$MOE" gemm-fwd --x x.npy --w w.npy --m-sizes mbad.npy --gather gbad.npy \
    --topk 1 --topk-weights twbad.npy --out ybad.npy --backend cuda

# ---- mlp-fwd, mlp-bwd: every genmlp case (every mlp option) in every dtype ----
for dt in f32 f16 bf16; do
    run_ok "genmlp $dt" "$NPY" genmlp "mlp_$dt" 20261125 "$dt"
    rdt=""
    if [ "$dt" = bf16 ]; then rdt="--dtype bf16"; fi
    for c in "mlp_$dt"/*/; do
        c=${c%/}
        name="$dt ${c#*/}"
        route_flags="" mlp_flags="" bwd_flags="" no_down_ckpt=""
        . "./$c/case.sh"
        # shellcheck disable=SC2086
        {
        run_ok "route $name" "$MOE" route --topk-ids "$c/ids.npy" --experts 4 $route_flags \
            --topk-weights "$c/tw.npy" $rdt --out "$c/route"
        if [ ! -e "$c/in/block_to_expert.npy" ]; then
            for f in token_position_to_id block_to_expert expert_affinities_masked; do
                cp "$c/route/$f.npy" "$c/in/"
            done
        fi
        for b in ref cuda; do
            mkdir -p "$c/$b"
            cp "$c"/in/*.npy "$c/$b/"
            bound=""
            if [ "$b" = ref ]; then bound="--bound-out $c/bound_fwd"; fi
            run_ok "mlp-fwd $name $b" "$MOE" mlp-fwd --in "$c/$b" --out "$c/$b" $mlp_flags --dtype "$dt" --backend $b \
                $bound
            if [ "$no_down_ckpt" = 1 ]; then rm "$c/$b/down_proj_act_checkpoint.npy"; fi
        done
        run_ok "mlp-fwd $name: cuda = ref" "$MOE" compare --dtype "$dt" --bound "$c/bound_fwd" "$c/ref" "$c/cuda"
        # the backward of both from the reference's checkpoints, so that only mlp-bwd is compared
        for b in ref cuda; do
            bound=""
            if [ "$b" = ref ]; then bound="--bound-out $c/bound_bwd"; fi
            run_ok "mlp-bwd $name $b" "$MOE" mlp-bwd --in "$c/ref" --out "$c/grad_$b" $mlp_flags $bwd_flags --dtype "$dt" \
                --backend $b $bound
        done
        run_ok "mlp-bwd $name: cuda = ref" "$MOE" compare --dtype "$dt" --bound "$c/bound_bwd" "$c/grad_ref" \
            "$c/grad_cuda"
        }
    done
done

# ---- FP8: fp8-quantize on the GPU gives the reference's codes and scales bit for bit (both scale formats, e4m3
# and e5m2, rows and blocks); gemm-fp8-fwd and gemm-fp8-dx on them, in several modes, within the reference
# run's bound; a NaN input and a bad scale are refused with --backend cuda too, writing nothing; FP8 dW is refused
# (no kernel yet) ----
"$NPY" mk f8ids.npy '<i8' 6,2 0 1 2 3 1 2 3 0 0 2 1 3
"$NPY" mk f8x.npy '<f4' 6,200 0.5 -1 0.25 2 -0.75 3 0.125
"$NPY" mk f8w.npy '<f4' 4,130,200 0.125 -0.5 0.25 1 -0.375 0.75 -2
"$NPY" mk f8dy.npy '<f4' 12,130 0.5 -0.25 1 -3
"$NPY" mk f8tw.npy '<f4' 12 0.5 0.25 1 0.75
run_ok "fp8 route" "$MOE" route --topk-ids f8ids.npy --experts 4 --out f8r
F="--m-sizes f8r/m_sizes.npy --gather f8r/gather_indices.npy --topk 2"
# fp8_gemm CMD OUT OPERANDS MODE: CMD (e5m2 weights) on both backends into f8ref/OUT.npy and f8cuda/OUT.npy
# with the bound of each run, then cuda = ref within the reference run's bound
fp8_gemm() {
    for b in ref cuda; do
        # shellcheck disable=SC2086 # the flag lists are several words
        run_ok "$1 $4 $b" "$MOE" "$1" $3 --w-fp8 e5m2 $F $4 --backend $b --out "f8$b/$2.npy" \
            --bound-out "f8$b/$2.bound.npy"
    done
    dt=f32
    case $4 in *bf16*) dt=bf16 ;; esac
    run_ok "$1 $4: cuda = ref within the bound" "$MOE" compare --dtype $dt --bound "f8ref/$2.bound.npy" \
        "f8ref/$2.npy" "f8cuda/$2.npy"
}
for sc in f32 ue8m0; do
    for b in ref cuda; do
        run_ok "fp8-quantize x $sc $b" "$MOE" fp8-quantize --in f8x.npy --scales $sc --backend $b --out "f8$b/x$sc"
        run_ok "fp8-quantize w $sc $b" "$MOE" fp8-quantize --in f8w.npy --blocks --fp8 e5m2 --scales $sc --backend $b \
            --out "f8$b/w$sc"
        run_ok "fp8-quantize dy $sc $b" "$MOE" fp8-quantize --in f8dy.npy --dtype bf16 --scales $sc --backend $b \
            --out "f8$b/dy$sc"
    done
    for t in x w dy; do
        for f in q scales; do
            run_ok "fp8-quantize $t $f $sc: cuda = ref" "$MOE" compare --exact "f8ref/$t$sc/$f.npy" "f8cuda/$t$sc/$f.npy"
        done
    done
    X="--x f8ref/x$sc/q.npy --x-scales f8ref/x$sc/scales.npy --w f8ref/w$sc/q.npy --w-scales f8ref/w$sc/scales.npy"
    DY="--dy f8ref/dy$sc/q.npy --dy-scales f8ref/dy$sc/scales.npy --w f8ref/w$sc/q.npy --w-scales f8ref/w$sc/scales.npy"
    fp8_gemm gemm-fp8-fwd "y${sc}1" "$X" "--permute-x"
    fp8_gemm gemm-fp8-fwd "y${sc}2" "$X" "--permute-x --permute-y --topk-weights f8tw.npy --out-dtype bf16"
    fp8_gemm gemm-fp8-dx "dx${sc}1" "$DY" ""
    fp8_gemm gemm-fp8-dx "dx${sc}2" "$DY" "--permute-x --reduce-topk"
    fp8_gemm gemm-fp8-dx "dx${sc}3" "$DY" "--permute-y --topk-weights f8tw.npy --out-dtype bf16"
done
"$NPY" mk f8nan.npy '<f4' 2,3 1 nan 2
refused "fp8-quantize NaN --backend cuda" "f8nan.npy" "src[0][0][1] = nan, expected a finite value" -- \
    "$MOE" fp8-quantize --in f8nan.npy --backend cuda --out f8nan
if [ -e f8nan/q.npy ]; then bad "a refused fp8-quantize --backend cuda wrote f8nan/q.npy"; else passed=$((passed + 1)); fi
"$NPY" mk f8zero.npy '<f4' 4,2,2 1 1 1 0
# shellcheck disable=SC2086
refused "gemm-fp8-fwd zero scale --backend cuda" "moe_gemm_fp8_fwd" "w.scales[" -- \
    "$MOE" gemm-fp8-fwd --x f8ref/xf32/q.npy --x-scales f8ref/xf32/scales.npy --w f8ref/wf32/q.npy \
    --w-scales f8zero.npy --w-fp8 e5m2 $F --permute-x --backend cuda --out f8bad.npy
if [ -e f8bad.npy ]; then bad "a refused gemm-fp8-fwd --backend cuda wrote f8bad.npy"; else passed=$((passed + 1)); fi
# FP8 dW: the columns quantizer on both backends (cuda = ref, bit for bit), then gemm-fp8-dw on both (cuda = ref
# within the bound)
for b in ref cuda; do
    # shellcheck disable=SC2086
    run_ok "fp8-quantize --columns dy $b" "$MOE" fp8-quantize --in f8dy.npy --columns $F --rows slot \
        --topk-weights f8tw.npy --fp8 e5m2 --backend $b --out "f8$b/dyc"
    # shellcheck disable=SC2086
    run_ok "fp8-quantize --columns x $b" "$MOE" fp8-quantize --in f8x.npy --columns $F --rows token --backend $b \
        --out "f8$b/xc"
done
for t in dyc xc; do
    for f in q scales; do
        run_ok "fp8-quantize --columns $t $f: cuda = ref" "$MOE" compare --exact "f8ref/$t/$f.npy" "f8cuda/$t/$f.npy"
    done
done
for b in ref cuda; do
    run_ok "gemm-fp8-dw $b" "$MOE" gemm-fp8-dw --x f8ref/xc/q.npy --x-scales f8ref/xc/scales.npy --dy f8ref/dyc/q.npy \
        --dy-scales f8ref/dyc/scales.npy --fp8 e5m2 --x-fp8 e4m3 --m-sizes f8r/m_sizes.npy --out-dtype bf16 --backend $b \
        --out "f8$b/dw.npy" --bound-out "f8$b/dw.bound.npy"
done
run_ok "gemm-fp8-dw: cuda = ref within the bound" "$MOE" compare --dtype bf16 --bound f8ref/dw.bound.npy \
    f8ref/dw.npy f8cuda/dw.npy
"$NPY" mk f8colnan.npy '<f4' 12,3 1 nan 2
# shellcheck disable=SC2086
refused "fp8-quantize --columns NaN --backend cuda" "moe_quantize_fp8_columns" "src[0][1] = nan, expected a finite value" -- \
    "$MOE" fp8-quantize --in f8colnan.npy --columns $F --rows expert --backend cuda --out f8colnan
if [ -e f8colnan/q.npy ]; then bad "a refused fp8-quantize --columns --backend cuda wrote f8colnan/q.npy"; else passed=$((passed + 1)); fi

# moe autotune: each op tunes, prints its choice and appends one line per call to the cache file
rm -f tune.txt
n=0
for op in "fwd" "dx --reduce-topk --permute-y" "dw --dw-fp32"; do
    # shellcheck disable=SC2086 # op carries its flags
    run_ok "autotune $op" "$MOE" autotune --op $op --tokens 64 --topk 2 --experts 4 --n 64 --k 128 --repeats 3 \
        --cache tune.txt
    n=$((n + 1))
    has "autotune $op prints the choice" out "configurations timed; kept "
done
lines=$(grep -c '^libmoe-tune 2|' tune.txt)
if [ "$lines" -eq "$n" ]; then passed=$((passed + 1)); else bad "autotune: $lines cache lines after $n calls"; fi

finish
