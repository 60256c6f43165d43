#!/bin/sh
# moe compare on tensors with known differences: every tolerance rule at its edge, NaN and Inf, shapes,
# integer arrays, 16-bit patterns, folders, and the report (shape, max abs/rel error, worst element,
# verdict) and exit status (0 within, 1 over).
. "$(dirname "$0")/test_cli_lib.sh"

# pass DESC ARGS...: exit 0 and a PASS verdict; fail DESC ARGS...: exit 1 and a FAIL verdict
pass() {
    desc=$1
    shift
    run_status "$desc" 0 "$MOE" compare "$@"
    has "$desc: verdict" out "verdict        PASS"
}
fail() {
    desc=$1
    shift
    run_status "$desc" 1 "$MOE" compare "$@"
    has "$desc: verdict" out "verdict        FAIL"
}

# ---- f32: one rounding each way, 2*u*max(|a|,|b|) (u = 2^-24) ----
"$NPY" mk a.npy '<f4' 3 1 2 3
"$NPY" mk a_v2.npy '<f4' 3 v2 1 2 3
"$NPY" mk a_v3.npy '<f4' 3 v3 1 2 3
"$NPY" mk one_ulp.npy '<f4' 3 1.00000011920928955 2 3
"$NPY" mk two_ulp.npy '<f4' 3 1 2 3.00000047683715820
pass "identical" a.npy a.npy
pass "format 1.0 vs 2.0" a.npy a_v2.npy
pass "format 1.0 vs 3.0" a.npy a_v3.npy
pass "f32 one ulp" a.npy one_ulp.npy
has "f32 report" out "a.npy vs one_ulp.npy" "shape          (3,)" "tolerance      f32" \
    "max abs error  1.192093e-07" "max rel error  1.192093e-07" "worst element  [0]" "(0 of 3 elements"
fail "f32 two ulps" a.npy two_ulp.npy
has "f32 two ulps report" out "worst element  [2]  a = 3  b = 3.00000048" "(1 of 3 elements over the tolerance)"
has "f32 failure hint" out "--reduction-length"
pass "--reduction-length 4 allows it" --reduction-length 4 a.npy two_ulp.npy
has "--reduction-length report" out "length 4" "gamma(4)"
pass "--atol" --atol 1e-6 a.npy two_ulp.npy
fail "--rtol too small" --rtol 1e-8 a.npy two_ulp.npy
pass "--rtol" --rtol 2e-7 a.npy two_ulp.npy
fail "--exact" --exact a.npy one_ulp.npy
has "--exact report" out "tolerance      exact (--exact)"

# ---- bf16 and f16 (u = 2^-8, 2^-11) ----
"$NPY" mk b1.npy '<f4' 2,2 1 -4 0.5 100
"$NPY" mk b1_ulp.npy '<f4' 2,2 1.0078125 -4 0.5 100
"$NPY" mk b1_2ulp.npy '<f4' 2,2 1 -4 0.5 101
fail "float32 files of bf16 values need --dtype bf16" b1.npy b1_ulp.npy
# 1.0078125 = 1 + 2^-7 is both a bf16 and an f16 value: the hint names both
has "bf16 hint" out "every value of both files is a bf16 and an f16 value, and the tolerance is float32's" \
    "pass --dtype bf16 or --dtype f16"
# 2^20 + 2^13 is a bf16 value and no f16 value (past 65504); 1 + 2^-10 an f16 value and no bf16 value
"$NPY" mk bf_only.npy '<f4' 2 1048576 2
"$NPY" mk bf_only_ulp.npy '<f4' 2 1056768 2
fail "bf16 values only" bf_only.npy bf_only_ulp.npy
has "bf16-only hint" out "every value of both files is a bf16 value," "pass --dtype bf16"
"$NPY" mk h_only.npy '<f4' 2 1 2
"$NPY" mk h_only_ulp.npy '<f4' 2 1.0009765625 2
fail "f16 values only" h_only.npy h_only_ulp.npy
has "f16-only hint" out "every value of both files is an f16 value," "pass --dtype f16"
pass "--dtype f16 one ulp" --dtype f16 h_only.npy h_only_ulp.npy
# --reduction-length keeps float32's rounding: the hint still names the dtype
fail "bf16 values with --reduction-length" --reduction-length 2 bf_only.npy bf_only_ulp.npy
has "bf16 hint with --reduction-length" out "pass --dtype bf16"
# values of no 16-bit type: the float32 hint
"$NPY" mk f_only.npy '<f4' 2 1.000000476837158203125 2
fail "float32 values" f_only.npy h_only.npy
has "float32 hint" out "pass --reduction-length L"
pass "--dtype bf16 one ulp" --dtype bf16 b1.npy b1_ulp.npy
fail "--dtype bf16 two ulps" --dtype bf16 b1.npy b1_2ulp.npy
has "2-d worst element" out "worst element  [1, 1]  a = 100  b = 101"
# the same values as bf16 bit patterns: uint16 and 2-byte void (ml_dtypes.bfloat16)
"$NPY" mk p1.npy '<u2' 2,2 0x3f80 0xc080 0x3f00 0x42c8
"$NPY" mk p1_void.npy '<V2' 2,2 0x3f80 0xc080 0x3f00 0x42c8
pass "bf16 patterns = float32 values" --dtype bf16 --exact b1.npy p1.npy
pass "void16 bf16 patterns" --dtype bf16 --exact p1_void.npy p1.npy
refused "patterns need --dtype" "p1.npy" "--dtype bf16" -- "$MOE" compare b1.npy p1.npy
refused "patterns are not f32" "p1.npy" "--dtype bf16" -- "$MOE" compare --dtype f32 b1.npy p1.npy
"$NPY" mk p1_f16.npy '<u2' 2,2 0x3c00 0xc400 0x3800 0x5640
pass "f16 patterns" --dtype f16 --exact b1.npy p1_f16.npy
"$NPY" mk h.npy '<f2' 2 1 2
"$NPY" mk h_ulp.npy '<f2' 2 1.0009765625 2
"$NPY" mk h_2ulp.npy '<f2' 2 1.001953125 2
pass "f16 inferred, one ulp" h.npy h_ulp.npy
has "f16 inferred" out "tolerance      f16"
fail "f16 two ulps" h.npy h_2ulp.npy
"$NPY" mk h_f32.npy '<f4' 2 1.0009765625 2
pass "f16 file against float32 values: f16 tolerance" h.npy h_f32.npy
has "f16 against float32 report" out "(float16 in A, float32 in B)" "tolerance      f16"
"$NPY" mk d.npy '<f8' 2 1 2
"$NPY" mk d_ulp.npy '<f8' 2 1.0000000000000002 2
pass "f64 inferred" d.npy d_ulp.npy
has "f64 tolerance" out "tolerance      f64"
fail "f64 file vs f32 file: f32 tolerance" d_ulp.npy d.npy --dtype f32 --exact

# ---- NaN, Inf, zeros, subnormals ----
"$NPY" mk n1.npy '<f4' 4 nan inf -inf 0
"$NPY" mk n2.npy '<f4' 4 nan inf -inf -0
"$NPY" mk n3.npy '<f4' 4 1 inf -inf 0
"$NPY" mk n4.npy '<f4' 4 nan 3e38 -inf 0
"$NPY" mk n5.npy '<f4' 4 nan inf -inf 1e-45
pass "NaN = NaN, Inf = Inf, 0 = -0" n1.npy n2.npy
fail "NaN vs number" n1.npy n3.npy
has "NaN vs number worst" out "worst element  [0]  a = nan  b = 1"
fail "Inf vs finite" n1.npy n4.npy
has "Inf vs finite worst" out "worst element  [1]  a = inf  b = 3.00000001e+38"
pass "a subnormal against zero is within eta" n1.npy n5.npy

# ---- --bound ----
"$NPY" mk bound.npy '<f8' 3 0 0 2.4e-7
"$NPY" mk bound_small.npy '<f8' 3 0 0 2.3e-7
"$NPY" mk bound_shape.npy '<f8' 2 1 1
pass "--bound" --bound bound.npy a.npy two_ulp.npy
has "--bound report" out "2 * bound from bound.npy"
fail "--bound too small" --bound bound_small.npy a.npy two_ulp.npy
refused "--bound of another shape" "bound_shape.npy" "expected a floating-point bound of shape (3,)" "found (2,) float64" \
    -- "$MOE" compare --bound bound_shape.npy a.npy two_ulp.npy

# ---- integers: exact ----
"$NPY" mk i1.npy '<i4' 3 1 2 3
"$NPY" mk i2.npy '<i8' 3 1 2 3
"$NPY" mk i3.npy '<i8' 3 1 2 4
pass "int32 = int64" i1.npy i2.npy
has "integers are exact" out "exact (integer arrays)"
fail "integers differ" i1.npy i3.npy --dtype bf16
has "integer report" out "worst element  [2]  a = 3  b = 4"

# ---- shapes ----
"$NPY" mk s1.npy '<f4' 1,3 1 2 3
"$NPY" mk e1.npy '<f4' 0,3
fail "shapes differ" a.npy s1.npy
has "shapes differ report" out "(3,) float32 in A, (1, 3) float32 in B" "(shapes differ)"
pass "empty arrays" e1.npy e1.npy
has "empty report" out "worst element  none (empty)"

# ---- folders: every .npy of A against B's namesake ----
mkdir A B C
cp a.npy b1.npy i1.npy A/
cp a.npy B/
cp b1_ulp.npy B/b1.npy
cp i1.npy B/i1.npy
cp h.npy B/extra.npy
echo "not a tensor" > A/notes.txt
fail "folders: b1 differs in f32" A B
has "folders report" out "a.npy" "b1.npy" "i1.npy" "extra.npy" "only in B, not compared" \
    "summary: 3 tensor(s) compared, 1 over the tolerance or differing in shape, 0 missing from B"
run_ok "folders: bf16 tolerance" "$MOE" compare --dtype bf16 A B
has "folders pass" out "summary: 3 tensor(s) compared, 0 over the tolerance or differing in shape, 0 missing from B"
cp a.npy C/
fail "folders: missing in B" A C
has "missing report" out "FAIL (missing from C)" "2 missing from C"
mkdir BOUNDS
"$NPY" mk BOUNDS/b1.npy '<f8' 2,2 0.004 0 0 0
run_ok "folders with --bound DIR" "$MOE" compare --bound BOUNDS A B
has "folders --bound" out "2 * bound from BOUNDS/b1.npy" "summary: 3 tensor(s) compared, 0 over"
refused "file against folder" "compare takes two files or two folders" -- "$MOE" compare a.npy A
refused "--bound file with folders" "BOUNDS/b1.npy" "--bound must be a folder" -- "$MOE" compare --bound BOUNDS/b1.npy A B
mkdir EMPTY
refused "folder without .npy files" "EMPTY: no .npy files" -- "$MOE" compare EMPTY A

# ---- usage errors ----
refused "one tolerance rule at a time" "choose one of" -- "$MOE" compare --exact --atol 1 a.npy a.npy
refused "bad --dtype" "--dtype f8" "expected f32, f16, bf16 or f64" -- "$MOE" compare --dtype f8 a.npy a.npy
refused "bad --reduction-length" "--reduction-length 0" -- "$MOE" compare --reduction-length 0 a.npy a.npy
refused "bad --atol" "--atol -1" -- "$MOE" compare --atol -1 a.npy a.npy
refused "one file only" "expected 2 file or folder arguments, got 1" -- "$MOE" compare a.npy
refused "three files" "unexpected argument 'a.npy'" -- "$MOE" compare a.npy a.npy a.npy
refused "missing file" "nope.npy: cannot open" -- "$MOE" compare a.npy nope.npy

finish
