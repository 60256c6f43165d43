#!/bin/sh
# The FP8 commands (specs/FP8.md): fp8-quantize's files (codes, scales, their shapes and types, known codes),
# gemm-fp8-fwd and gemm-fp8-dx on a known answer and against their own --bound-out, UE8M0 scales, e5m2 weights,
# and the refusals (non-finite input, codes that are not uint8, mixed scale formats, a bad scale value, a bad
# --fp8), none of which writes a file.
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
finish
