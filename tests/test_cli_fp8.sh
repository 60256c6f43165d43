#!/bin/sh
# The FP8 commands (specs/FP8.md): fp8-quantize's files (codes, scales, their shapes and types, known codes),
# gemm-fp8-fwd and gemm-fp8-dx on a known answer and against their own --bound-out, UE8M0 scales, e5m2 weights,
# fp8-quantize --columns and gemm-fp8-dw (a known answer, every row source, topk weights, the scales' shape, the
# codes transposed: --codes-transposed),
# and the refusals (non-finite input, codes that are not uint8, mixed scale formats, a bad scale value, a bad
# --fp8, --backend cuda where it cannot run), none of which writes a file.  Where --backend cuda runs,
# tests/test_cli_cuda.sh checks these commands on the GPU against the reference.
. "$(dirname "$0")/test_cli_lib.sh"

# ---- fp8-quantize: known codes.  One row of 3 values, amax 3.5: factor 448 / 3.5 = 128, so 1.75 -> 224
# (0x76 = 0.1110.110), -3.5 -> -448 (0xfe), 0.875 -> 112 (0x6e); the scale 3.5 / 448 = 2^-7 is exact. ----
"$NPY" mk a.npy '<f4' 1,3 1.75 -3.5 0.875
run_ok "fp8-quantize rows" "$MOE" fp8-quantize --in a.npy --out a8
has "fp8-quantize says what it wrote" out "wrote a8/q.npy: shape (1, 3) uint8" "wrote a8/scales.npy: shape (1, 1) float32"
run_ok "info q" "$NPY" info a8/q.npy
has "codes are uint8" out "|u1 (1, 3)"
"$NPY" mk q_want.npy '<f4' 1,3 118 254 110
run_ok "known codes" "$MOE" compare --exact q_want.npy a8/q.npy
# ---- a known GEMM: x above, one expert with w = [[7, 7, 7]] (codes 448, block scale 7 / 448 = 2^-6):
# y = 448 (224 - 448 + 112) 2^-7 2^-6 = -6.125 exactly ----
"$NPY" mk w.npy '<f4' 1,1,3 7 7 7
"$NPY" mk m.npy '<i8' 1 1
run_ok "fp8-quantize blocks" "$MOE" fp8-quantize --in w.npy --blocks --out w8
has "blocks scales (E, 1, 1)" out "wrote w8/scales.npy: shape (1, 1, 1) float32"
run_ok "gemm-fp8-fwd known" "$MOE" gemm-fp8-fwd --x a8/q.npy --x-scales a8/scales.npy --w w8/q.npy \
    --w-scales w8/scales.npy --m-sizes m.npy --out y.npy
"$NPY" mk y_want.npy '<f4' 1,1 -6.125
run_ok "gemm-fp8-fwd known value" "$MOE" compare --exact y_want.npy y.npy

# ---- a routed problem: T = 6, top-2 of 4 experts, K = 200 (two tiles, one partial), N = 130 ----
"$NPY" mk topk.npy '<i8' 6,2 0 1 2 3 1 2 3 0 0 2 1 3
"$NPY" mk x.npy '<f4' 6,200 0.5 -1 0.25 2 -0.75 3 0.125
"$NPY" mk wb.npy '<f4' 4,130,200 0.125 -0.5 0.25 1 -0.375 0.75 -2
"$NPY" mk dy.npy '<f4' 12,130 0.5 -0.25 1 -3
run_ok "route" "$MOE" route --topk-ids topk.npy --experts 4 --out routing
run_ok "quantize x" "$MOE" fp8-quantize --in x.npy --out x8
run_ok "quantize w" "$MOE" fp8-quantize --in wb.npy --blocks --out wb8
has "w's block scales" out "wrote wb8/scales.npy: shape (4, 2, 2) float32"
run_ok "quantize dy" "$MOE" fp8-quantize --in dy.npy --out dy8
R="--m-sizes routing/m_sizes.npy --gather routing/gather_indices.npy --topk 2"
# shellcheck disable=SC2086 # R is several words
run_ok "gemm-fp8-fwd" "$MOE" gemm-fp8-fwd --x x8/q.npy --x-scales x8/scales.npy --w wb8/q.npy \
    --w-scales wb8/scales.npy $R --permute-x --out y8.npy --bound-out y8_bound.npy
has "gemm-fp8-fwd output" out "wrote y8.npy: shape (12, 130) float32" "wrote y8_bound.npy: shape (12, 130) float64"
run_ok "gemm-fp8-fwd within its bound" "$MOE" compare y8.npy y8.npy --bound y8_bound.npy
# shellcheck disable=SC2086
run_ok "gemm-fp8-dx" "$MOE" gemm-fp8-dx --dy dy8/q.npy --dy-scales dy8/scales.npy --w wb8/q.npy \
    --w-scales wb8/scales.npy $R --permute-x --reduce-topk --out-dtype bf16 --out dx8.npy --bound-out dx8_bound.npy
has "gemm-fp8-dx output" out "wrote dx8.npy: shape (6, 200) float32"
# shellcheck disable=SC2086
run_ok "gemm-fp8-dx --raw" "$MOE" gemm-fp8-dx --dy dy8/q.npy --dy-scales dy8/scales.npy --w wb8/q.npy \
    --w-scales wb8/scales.npy $R --permute-x --reduce-topk --out-dtype bf16 --raw --out dx8_raw.npy
run_ok "info raw" "$NPY" info dx8_raw.npy
has "--raw bf16 writes uint16 patterns" out "<u2 (6, 200)"
# dX from W^T (--w-transposed): W^T quantized by blocks is W's codes and scales transposed, and dX from it is dX
# from W bit for bit
"$NPY" relayout wb.npy wbT.npy 0,2,1 4,200,130
run_ok "quantize w^T" "$MOE" fp8-quantize --in wbT.npy --blocks --out wbT8
has "W^T's block scales" out "wrote wbT8/scales.npy: shape (4, 2, 2) float32" "wrote wbT8/q.npy: shape (4, 200, 130) uint8"
# shellcheck disable=SC2086
run_ok "gemm-fp8-dx --w-transposed" "$MOE" gemm-fp8-dx --dy dy8/q.npy --dy-scales dy8/scales.npy --w wbT8/q.npy \
    --w-scales wbT8/scales.npy --w-transposed $R --permute-x --reduce-topk --out-dtype bf16 --out dx8t.npy
run_ok "dX from W^T is dX from W" "$MOE" compare --exact dx8.npy dx8t.npy
# shellcheck disable=SC2086
refused "--w-transposed with W's codes" "expected FP8 codes, uint8 of shape (12, 200)" -- \
    "$MOE" gemm-fp8-dx --dy dy8/q.npy --dy-scales dy8/scales.npy --w wb8/q.npy --w-scales wb8/scales.npy \
    --w-transposed $R --out bad.npy
# UE8M0 scales and e5m2 weights
run_ok "quantize x ue8m0" "$MOE" fp8-quantize --in x.npy --scales ue8m0 --out xu
has "UE8M0 scales are uint8" out "wrote xu/scales.npy: shape (6, 2) uint8"
run_ok "quantize w e5m2 ue8m0" "$MOE" fp8-quantize --in wb.npy --blocks --fp8 e5m2 --scales ue8m0 --out wu
# shellcheck disable=SC2086
run_ok "gemm-fp8-fwd ue8m0 e4m3 x e5m2" "$MOE" gemm-fp8-fwd --x xu/q.npy --x-scales xu/scales.npy --w wu/q.npy \
    --w-scales wu/scales.npy --w-fp8 e5m2 $R --permute-x --out yu.npy --bound-out yu_bound.npy
run_ok "ue8m0 within its bound" "$MOE" compare yu.npy yu.npy --bound yu_bound.npy

# ---- refusals: status 2, a message naming the file, nothing written ----
"$NPY" mk nan.npy '<f4' 2,3 1 nan 2
refused "NaN input" "nan.npy" "src[0][0][1] = nan, expected a finite value" -- \
    "$MOE" fp8-quantize --in nan.npy --out nan8
if [ -e nan8/q.npy ]; then bad "a refused fp8-quantize wrote nan8/q.npy"; else passed=$((passed + 1)); fi
refused "bad --fp8" "--fp8 e3m4: expected e4m3 or e5m2" -- "$MOE" fp8-quantize --in x.npy --fp8 e3m4 --out q
refused "bad --scales" "--scales f16: expected f32 or ue8m0" -- "$MOE" fp8-quantize --in x.npy --scales f16 --out q
# shellcheck disable=SC2086
refused "codes not uint8" "x.npy: expected FP8 codes, uint8 of shape (6, 200)" -- \
    "$MOE" gemm-fp8-fwd --x x.npy --x-scales x8/scales.npy --w wb8/q.npy --w-scales wb8/scales.npy $R --permute-x \
    --out bad.npy
# shellcheck disable=SC2086
refused "mixed scale formats" "wu/scales.npy: uint8 scales, but the other operand's are float32" -- \
    "$MOE" gemm-fp8-fwd --x x8/q.npy --x-scales x8/scales.npy --w wb8/q.npy --w-scales wu/scales.npy $R --permute-x \
    --out bad.npy
# shellcheck disable=SC2086
refused "scales of the wrong shape" "dy8/scales.npy: expected scales, float32 or uint8 (UE8M0) of shape (6, 2)" -- \
    "$MOE" gemm-fp8-fwd --x x8/q.npy --x-scales dy8/scales.npy --w wb8/q.npy --w-scales wb8/scales.npy $R \
    --permute-x --out bad.npy
"$NPY" mk zero_scales.npy '<f4' 4,2,2 1 1 1 0
# shellcheck disable=SC2086
refused "a zero scale" "moe_gemm_fp8_fwd" "w.scales[1][1] = 0, expected finite and > 0" -- \
    "$MOE" gemm-fp8-fwd --x x8/q.npy --x-scales x8/scales.npy --w wb8/q.npy --w-scales zero_scales.npy $R --permute-x \
    --out bad.npy
if [ -e bad.npy ]; then bad "a refused gemm-fp8-fwd wrote bad.npy"; else passed=$((passed + 1)); fi
refused "--reduce-topk needs --gather" "--reduce-topk needs --gather" -- \
    "$MOE" gemm-fp8-dx --dy dy8/q.npy --dy-scales dy8/scales.npy --w wb8/q.npy --w-scales wb8/scales.npy \
    --m-sizes routing/m_sizes.npy --reduce-topk --out bad.npy

# ---- dW (fp8-quantize --columns, gemm-fp8-dw).  Known value: one expert of 3 rows, x = a.npy's values as a
# column (codes 224, -448, 112, scale 2^-7), dy = 7 (codes 448, scale 2^-6): dW = 448 (224 - 448 + 112)
# 2^-7 2^-6 = -6.125 exactly ----
"$NPY" mk xcol.npy '<f4' 3,1 1.75 -3.5 0.875
"$NPY" mk dycol.npy '<f4' 3,1 7 7 7
"$NPY" mk m3.npy '<i8' 1 3
run_ok "fp8-quantize --columns" "$MOE" fp8-quantize --in xcol.npy --columns --m-sizes m3.npy --out xk
has "--columns writes codes and scales" out "wrote xk/q.npy: shape (3, 1) uint8" "wrote xk/scales.npy: shape (1, 1) float32"
"$NPY" mk xk_want.npy '<f4' 3,1 118 254 110
run_ok "known column codes" "$MOE" compare --exact xk_want.npy xk/q.npy
run_ok "fp8-quantize --columns dy" "$MOE" fp8-quantize --in dycol.npy --columns --m-sizes m3.npy --out dyk
run_ok "gemm-fp8-dw known" "$MOE" gemm-fp8-dw --x xk/q.npy --x-scales xk/scales.npy --dy dyk/q.npy \
    --dy-scales dyk/scales.npy --m-sizes m3.npy --out dwk.npy
has "gemm-fp8-dw output" out "wrote dwk.npy: shape (1, 1, 1) float32"
"$NPY" mk dwk_want.npy '<f4' 1,1,1 -6.125
run_ok "gemm-fp8-dw known value" "$MOE" compare --exact dwk_want.npy dwk.npy
# the routed problem: x in token order, dy in slot order with topk weights; scales (ceil(12/128) + 4 - 1, C)
"$NPY" mk tw.npy '<f4' 6,2 0.75 0.25 0.5 0.5 0.125 0.875
# shellcheck disable=SC2086
run_ok "columns of x, token rows" "$MOE" fp8-quantize --in x.npy --columns $R --rows token --out xcols
has "x's column scales" out "wrote xcols/q.npy: shape (12, 200) uint8" "wrote xcols/scales.npy: shape (4, 200) float32"
# shellcheck disable=SC2086
run_ok "columns of dy, slot rows, weighted" "$MOE" fp8-quantize --in dy.npy --columns $R --rows slot \
    --topk-weights tw.npy --fp8 e5m2 --out dycols
run_ok "gemm-fp8-dw routed" "$MOE" gemm-fp8-dw --x xcols/q.npy --x-scales xcols/scales.npy --dy dycols/q.npy \
    --dy-scales dycols/scales.npy --fp8 e5m2 --x-fp8 e4m3 --m-sizes routing/m_sizes.npy --out-dtype bf16 \
    --out dw8.npy --bound-out dw8_bound.npy
has "gemm-fp8-dw routed output" out "wrote dw8.npy: shape (4, 130, 200) float32" \
    "wrote dw8_bound.npy: shape (4, 130, 200) float64"
# dW on transposed codes (--codes-transposed): the transposed quantizer's codes are the columns quantizer's
# transposed, its scales the same, and dW from them is dW from the untransposed codes bit for bit
# shellcheck disable=SC2086
run_ok "columns of x transposed" "$MOE" fp8-quantize --in x.npy --columns $R --rows token --codes-transposed \
    --out xcolsT
has "transposed codes (K, M)" out "wrote xcolsT/q.npy: shape (200, 12) uint8" \
    "wrote xcolsT/scales.npy: shape (4, 200) float32"
"$NPY" relayout xcols/q.npy xcols_qT.npy 1,0 200,12
run_ok "transposed codes are the transpose" "$MOE" compare --exact xcols_qT.npy xcolsT/q.npy
run_ok "transposed quantizer's scales" "$MOE" compare --exact xcols/scales.npy xcolsT/scales.npy
# shellcheck disable=SC2086
run_ok "columns of dy transposed" "$MOE" fp8-quantize --in dy.npy --columns $R --rows slot --topk-weights tw.npy \
    --fp8 e5m2 --codes-transposed --out dycolsT
run_ok "gemm-fp8-dw --codes-transposed" "$MOE" gemm-fp8-dw --x xcolsT/q.npy --x-scales xcolsT/scales.npy \
    --dy dycolsT/q.npy --dy-scales dycolsT/scales.npy --codes-transposed --fp8 e5m2 --x-fp8 e4m3 \
    --m-sizes routing/m_sizes.npy --out-dtype bf16 --out dw8t.npy --bound-out dw8t_bound.npy
run_ok "dW from transposed codes is dW" "$MOE" compare --exact dw8.npy dw8t.npy
run_ok "transposed codes' bound" "$MOE" compare --exact dw8_bound.npy dw8t_bound.npy
refused "--codes-transposed with untransposed codes" "xcols/q.npy: expected FP8 codes of shape (C, M) (--codes-transposed) with M = 12" -- \
    "$MOE" gemm-fp8-dw --x xcols/q.npy --x-scales xcols/scales.npy --dy dycolsT/q.npy --dy-scales dycolsT/scales.npy \
    --codes-transposed --m-sizes routing/m_sizes.npy --out bad.npy
refused "--codes-transposed without --columns" "--codes-transposed applies to --columns only" -- \
    "$MOE" fp8-quantize --in x.npy --codes-transposed --out bad8
# shellcheck disable=SC2086
run_ok "columns ue8m0" "$MOE" fp8-quantize --in x.npy --columns $R --rows token --scales ue8m0 --out xcolu
has "UE8M0 column scales are uint8" out "wrote xcolu/scales.npy: shape (4, 200) uint8"
refused "--columns and --blocks" "--columns and --blocks: pick one tiling" -- \
    "$MOE" fp8-quantize --in x.npy --columns --blocks --m-sizes routing/m_sizes.npy --out bad8
refused "--rows without --columns" "--rows applies to --columns only" -- \
    "$MOE" fp8-quantize --in x.npy --rows token --out bad8
refused "--rows token needs --gather" "--rows slot|token needs --gather" -- \
    "$MOE" fp8-quantize --in x.npy --columns --m-sizes routing/m_sizes.npy --rows token --out bad8
# shellcheck disable=SC2086
refused "a bad --rows" "--rows tokens: expected expert, slot or token" -- \
    "$MOE" fp8-quantize --in x.npy --columns $R --rows tokens --out bad8
refused "--columns source of the wrong shape" "x.npy: expected a shape (12, C)" -- \
    "$MOE" fp8-quantize --in x.npy --columns --m-sizes routing/m_sizes.npy --out bad8
"$NPY" mk nancol.npy '<f4' 3,2 1 2 3 nan 4 5
refused "--columns NaN input" "moe_quantize_fp8_columns" "src[1][1] = nan, expected a finite value" -- \
    "$MOE" fp8-quantize --in nancol.npy --columns --m-sizes m3.npy --out bad8
if [ -e bad8 ]; then bad "a refused fp8-quantize --columns wrote bad8"; else passed=$((passed + 1)); fi
refused "mixed dW scale formats" "xcolu/scales.npy: uint8 scales, but the other operand's are float32" -- \
    "$MOE" gemm-fp8-dw --x xcols/q.npy --x-scales xcolu/scales.npy --dy dycols/q.npy --dy-scales dycols/scales.npy \
    --m-sizes routing/m_sizes.npy --out bad.npy
refused "dW scales of the wrong shape" "x8/scales.npy: expected scales, float32 or uint8 (UE8M0) of shape (4, 200)" -- \
    "$MOE" gemm-fp8-dw --x xcols/q.npy --x-scales x8/scales.npy --dy dycols/q.npy --dy-scales dycols/scales.npy \
    --m-sizes routing/m_sizes.npy --out bad.npy
refused "dW codes of the wrong rows" "x8/q.npy: expected FP8 codes of shape (M, C) with M = 12" -- \
    "$MOE" gemm-fp8-dw --x x8/q.npy --x-scales xcols/scales.npy --dy dycols/q.npy --dy-scales dycols/scales.npy \
    --m-sizes routing/m_sizes.npy --out bad.npy
"$NPY" mk neg_scale.npy '<f4' 1,1 -0.5
refused "a negative dW scale" "moe_gemm_fp8_dw" "x.scales[0][0] = -0.5, expected finite and > 0" -- \
    "$MOE" gemm-fp8-dw --x xk/q.npy --x-scales neg_scale.npy --dy dyk/q.npy --dy-scales dyk/scales.npy \
    --m-sizes m3.npy --out bad.npy
if [ -e bad.npy ]; then bad "a refused gemm-fp8-dw wrote bad.npy"; else passed=$((passed + 1)); fi

# ---- --backend cuda where it cannot run (a build without CUDA, or no usable device): each command refuses
# with status 2 and the reason, nothing on stdout, no file written (where it runs: tests/test_cli_cuda.sh) ----
"$MOE" fp8-quantize --in x.npy --backend cuda --out xc >out 2>err
cuda_runs=$?
if [ "$cuda_runs" -ne 0 ]; then
    cuda_refused "fp8-quantize --backend cuda" "$MOE" fp8-quantize --in x.npy --backend cuda --out xc
    # shellcheck disable=SC2086
    cuda_refused "gemm-fp8-fwd --backend cuda" "$MOE" gemm-fp8-fwd --x x8/q.npy --x-scales x8/scales.npy \
        --w wb8/q.npy --w-scales wb8/scales.npy $R --permute-x --backend cuda --out yc.npy
    # shellcheck disable=SC2086
    cuda_refused "gemm-fp8-dx --backend cuda" "$MOE" gemm-fp8-dx --dy dy8/q.npy --dy-scales dy8/scales.npy \
        --w wb8/q.npy --w-scales wb8/scales.npy $R --backend cuda --out dxc.npy
    cuda_refused "gemm-fp8-dw --backend cuda" "$MOE" gemm-fp8-dw --x xk/q.npy --x-scales xk/scales.npy \
        --dy dyk/q.npy --dy-scales dyk/scales.npy --m-sizes m3.npy --backend cuda --out dwc.npy
    if [ -e xc ] || [ -e yc.npy ] || [ -e dxc.npy ] || [ -e dwc.npy ]; then bad "a refused --backend cuda wrote a file"; fi
fi
finish
