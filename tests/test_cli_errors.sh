#!/bin/sh
# Every refusal of the moe tool: malformed and unsupported .npy files (Fortran order, big-endian,
# pickled objects, structured dtypes, truncated, garbage headers, ...), wrong shapes and dtypes, bad
# routing and block layouts, missing files, bad mlp options and every kind of usage error. Each must
# exit with status 2, print nothing on stdout and name the offending file (or option) on stderr.
. "$(dirname "$0")/test_cli_lib.sh"

small_gemm .
# shellcheck disable=SC2317 # called through run_ok and refused
fwd() { "$MOE" gemm-fwd --w w.npy --m-sizes m.npy --out y.npy "$@"; }
run_ok "the base problem runs" fwd --x x.npy

# --backend cuda where it cannot run (a build without CUDA, or no usable device): status 2, nothing on
# stdout, and the reason on stderr. Where it can run, the base problem with --backend cuda succeeds and
# these refusals are skipped (tests/test_cli_cuda.sh checks the GPU's results).
fwd --x x.npy --backend cuda >out 2>err
cuda_runs=$?

# ---- malformed and unsupported files, given as --x ----
H="'fortran_order': False, 'shape': (3, 2), }"
raw_npy fortran.npy "{'descr': '<f4', 'fortran_order': True, 'shape': (3, 2), }" 24
refused "Fortran order" "fortran.npy: " "Fortran-order" -- fwd --x fortran.npy
raw_npy big.npy "{'descr': '>f4', $H" 24
refused "big-endian" "big.npy: " "big-endian" "'>f4'" -- fwd --x big.npy
raw_npy pickled.npy "{'descr': '|O', $H" 48
refused "pickled objects" "pickled.npy: " "pickled" -- fwd --x pickled.npy
raw_npy structured.npy "{'descr': [('a', '<f4')], $H" 24
refused "structured dtype" "structured.npy: " "structured" -- fwd --x structured.npy
raw_npy complex.npy "{'descr': '<c8', $H" 48
refused "unsupported dtype" "complex.npy: " "unsupported dtype '<c8'" -- fwd --x complex.npy
raw_npy truncated.npy "{'descr': '<f4', $H" 20
refused "truncated data" "truncated.npy: " "truncated" "needs 24 data bytes, the file has 20" -- fwd --x truncated.npy
raw_npy long.npy "{'descr': '<f4', $H" 28
refused "bytes after the data" "long.npy: " "4 unexpected bytes after the data" -- fwd --x long.npy
raw_npy garbage.npy "{'descr': '<f4', $H garbage" 24
refused "garbage after the header" "garbage.npy: " "malformed .npy header" -- fwd --x garbage.npy
raw_npy garbage2.npy "print('hello')" 24
refused "garbage header" "garbage2.npy: " "malformed .npy header: expected '{'" -- fwd --x garbage2.npy
raw_npy nokey.npy "{'descr': '<f4', 'shape': (3, 2)}" 24
refused "missing key" "nokey.npy: " "missing key 'fortran_order'" -- fwd --x nokey.npy
raw_npy v4.npy "{'descr': '<f4', $H" 24 '\004\000'
refused "format version 4.0" "v4.npy: " "unsupported .npy format version 4.0" -- fwd --x v4.npy
printf '\223NUMPY\001\000\377\177{' >cut.npy
refused "file ends inside the header" "cut.npy: " "truncated" -- fwd --x cut.npy
printf '\223NUM' >short.npy
refused "file ends inside the magic" "short.npy: " "not a .npy file" -- fwd --x short.npy
: >empty.npy
refused "empty file" "empty.npy: " "not a .npy file" -- fwd --x empty.npy
echo "1 2 3 4 5 6" >text.npy
refused "text file" "text.npy: " "not a .npy file" -- fwd --x text.npy
refused "missing file" "nope.npy: cannot open" -- fwd --x nope.npy
mkdir folder.npy
refused "a folder" "folder.npy: not a regular file" -- fwd --x folder.npy

# ---- wrong shapes ----
"$NPY" mk x42.npy '<f4' 4,2 1
refused "X rows" "x42.npy: expected shape (3, 2)" "M = 3 rows, the sum of m.npy" "found (4, 2) float32" \
    -- fwd --x x42.npy
"$NPY" mk x33.npy '<f4' 3,3 1
refused "X columns" "x33.npy: expected shape (3, 2)" "K = 2 from w.npy" "found (3, 3) float32" -- fwd --x x33.npy
"$NPY" mk x6.npy '<f4' 6 1
refused "X 1-d" "x6.npy: expected shape (3, 2)" "found (6,) float32" -- fwd --x x6.npy
"$NPY" mk x312.npy '<f4' 3,1,2 1 2 3 4 5 6
run_ok "X with split leading dimensions" fwd --x x312.npy
"$NPY" mk w22.npy '<f4' 2,2 1
refused "W 2-d" "w22.npy: expected expert weights of shape (E, N, K) with E = 2 (the length of m.npy)" \
    "found (2, 2) float32" -- "$MOE" gemm-fwd --x x.npy --w w22.npy --m-sizes m.npy --out y.npy
"$NPY" mk w322.npy '<f4' 3,2,2 1
refused "W experts" "w322.npy: expected expert weights" "E = 2" "found (3, 2, 2) float32" \
    -- "$MOE" gemm-fwd --x x.npy --w w322.npy --m-sizes m.npy --out y.npy
"$NPY" mk dy33.npy '<f4' 3,3 1
refused "dY columns" "dy33.npy: expected shape (3, 2)" "N = 2 from w.npy" "found (3, 3) float32" \
    -- "$MOE" gemm-dx --dy dy33.npy --w w.npy --m-sizes m.npy --out dx.npy
refused "dY rows for dW" "x42.npy: expected shape (3, 2)" "found (4, 2) float32" \
    -- "$MOE" gemm-dw --x x.npy --dy x42.npy --m-sizes m.npy --out dw.npy
refused "X 1-d for dW" "x6.npy: expected a matrix" "found (6,) float32" \
    -- "$MOE" gemm-dw --x x6.npy --dy dy.npy --m-sizes m.npy --out dw.npy
"$NPY" mk m2d.npy '<i8' 1,2 1 2
refused "m_sizes 2-d" "m2d.npy: expected m_sizes of shape (E,)" "found (1, 2) int64" \
    -- "$MOE" gemm-fwd --x x.npy --w w.npy --m-sizes m2d.npy --out y.npy

# an empty input (K = 0) that claims a huge output: refused before any allocation
"$NPY" mk mbig.npy '<i8' 1 1099511627776
"$NPY" mk xbig.npy '<f4' 1099511627776,0
"$NPY" mk wbig.npy '<f4' 1,1099511627776,0
refused "output past 64 bits" "an output of 1099511627776 x 1099511627776 x 1 elements is too large" \
    -- "$MOE" gemm-fwd --x xbig.npy --w wbig.npy --m-sizes mbig.npy --out y.npy

# ---- wrong dtypes ----
"$NPY" mk mf.npy '<f4' 2 1 2
refused "float m_sizes" "mf.npy: expected an int32 or int64 array, found float32" \
    -- "$MOE" gemm-fwd --x x.npy --w w.npy --m-sizes mf.npy --out y.npy
"$NPY" mk xi.npy '<i8' 3,2 1
refused "integer X" "xi.npy: expected a floating-point array" "found (3, 2) int64" -- fwd --x xi.npy
refused "integer X with --dtype" "xi.npy: expected a floating-point array" -- fwd --x xi.npy --dtype bf16
"$NPY" mk xu.npy '<u2' 3,2 16256
refused "uint16 X without --dtype" "xu.npy: holds uint16 16-bit patterns" "--dtype bf16" -- fwd --x xu.npy
refused "uint16 X with --dtype f32" "xu.npy: holds uint16 16-bit patterns" -- fwd --x xu.npy --dtype f32
run_ok "uint16 X with --dtype bf16" fwd --x xu.npy --dtype bf16
"$NPY" mk xv.npy '<V2' 3,2 16256
refused "void16 X without --dtype" "xv.npy: holds void16" -- fwd --x xv.npy

# ---- routing ----
"$NPY" mk g.npy '<i8' 3 0 1 2
"$NPY" mk g_dup.npy '<i8' 3 0 0 2
"$NPY" mk g_big.npy '<i4' 3 0 1 3
"$NPY" mk g4.npy '<i8' 4 0 1 2 3
"$NPY" mk m_neg.npy '<i8' 2 -1 4
"$NPY" mk tw_bad.npy '<f4' 2 1
"$NPY" mk x_tok.npy '<f4' 2,2 1
refused "gather without --topk" "--gather needs --topk" -- fwd --x x.npy --gather g.npy
refused "--permute-x without gather" "--permute-x needs --gather" -- fwd --x x.npy --permute-x
refused "--permute-y without gather" "--permute-y needs --gather" -- fwd --x x.npy --permute-y
refused "--topk-weights without gather" "--topk-weights needs --gather" -- fwd --x x.npy --topk-weights tw_bad.npy
refused "--reduce-topk without gather" "--reduce-topk needs --gather" \
    -- "$MOE" gemm-dx --dy dy.npy --w w.npy --m-sizes m.npy --reduce-topk --out dx.npy
refused "gather repeats" "g_dup.npy: " "repeats an earlier entry" -- fwd --x x.npy --gather g_dup.npy --topk 1
refused "gather out of range" "g_big.npy: " "gather_indices[2] = 3" -- fwd --x x.npy --gather g_big.npy --topk 1
refused "gather length" "g4.npy: expected gather_indices of shape (3,)" "found (4,) int64" \
    -- fwd --x x.npy --gather g4.npy --topk 1
refused "negative m_sizes" "m_neg.npy: m_sizes[0] = -1, expected >= 0" \
    -- "$MOE" gemm-fwd --x x.npy --w w.npy --m-sizes m_neg.npy --out y.npy
refused "--topk 0" "--topk 0: expected an integer >= 1" -- fwd --x x.npy --topk 0
refused "--topk not a number" "--topk two: expected an integer >= 1" -- fwd --x x.npy --topk two
refused "--topk does not divide M" "m.npy: the rows sum to M = 3, which --topk 2 does not divide" -- fwd --x x.npy --topk 2
refused "topk weights shape" "tw_bad.npy: expected topk weights of shape (3,) or (3, 1)" "found (2,) float32" \
    -- fwd --x x.npy --gather g.npy --topk 1 --topk-weights tw_bad.npy
refused "permute-x rows" "x42.npy: expected shape (3, 2)" "T = 3 tokens because of --permute-x" \
    -- fwd --x x42.npy --gather g.npy --topk 1 --permute-x
refused "topk-weights grad without --w" "--out-topk-weights-grad needs --w" \
    -- "$MOE" gemm-dw --x x.npy --dy dy.npy --m-sizes m.npy --gather g.npy --topk 1 --out dw.npy --out-topk-weights-grad d.npy
refused "--w without topk-weights grad" "--w is only used by --out-topk-weights-grad" \
    -- "$MOE" gemm-dw --x x.npy --dy dy.npy --m-sizes m.npy --w w.npy --out dw.npy
refused "topk-weights grad without gather" "--out-topk-weights-grad needs --gather" \
    -- "$MOE" gemm-dw --x x.npy --dy dy.npy --m-sizes m.npy --w w.npy --out dw.npy --out-topk-weights-grad d.npy
refused "topk-weights grad: W shape" "w322.npy: expected expert weights of shape (2, 2, 2)" \
    -- "$MOE" gemm-dw --x x.npy --dy dy.npy --m-sizes m.npy --gather g.npy --topk 1 --w w322.npy --out dw.npy \
    --out-topk-weights-grad d.npy

# ---- route ----
"$NPY" mk ids.npy '<i8' 2,2 0 1 1 3
"$NPY" mk ids_f.npy '<f4' 2,2 0
"$NPY" mk ids_3d.npy '<i8' 1,2,2 0
refused "route id out of range" "ids.npy: " "topk_ids[1][1] = 3" -- "$MOE" route --topk-ids ids.npy --experts 3 --out r
refused "route float ids" "ids_f.npy: expected an int32 or int64 array, found float32" \
    -- "$MOE" route --topk-ids ids_f.npy --experts 3 --out r
refused "route 3-d ids" "ids_3d.npy: expected topk ids of shape (T, k) or (T,)" \
    -- "$MOE" route --topk-ids ids_3d.npy --experts 4 --out r
refused "route --experts 0" "--experts 0: expected an integer >= 1" -- "$MOE" route --topk-ids ids.npy --experts 0 --out r
# the blockwise layout
"$NPY" mk ids_ok.npy '<i8' 2,2 0 1 1 2
"$NPY" mk ids_dup.npy '<i8' 2,2 0 1 1 1
"$NPY" mk tw.npy '<f4' 2,2 0.5
"$NPY" mk tw3.npy '<f4' 3 0.5
"$NPY" mk tw_i.npy '<i4' 2,2 1
"$NPY" mk tw_u.npy '<u2' 2,2 16256
r() { "$MOE" route --topk-ids ids_ok.npy --experts 3 --out r "$@"; }
run_ok "route --block-size runs" r --block-size 2 --topk-weights tw.npy
refused "route --padding without a layout" "--padding belongs to the blockwise layout: give --block-size B" \
    -- r --padding row
refused "route --topk-weights without a layout" "--topk-weights belongs to the blockwise layout" -- r --topk-weights tw.npy
refused "route --dtype without weights" "--dtype is for expert_affinities_masked.npy: give --topk-weights" \
    -- r --block-size 2 --dtype bf16
refused "route --raw without weights" "--raw is for expert_affinities_masked.npy" -- r --block-size 2 --raw
refused "route --block-size 0" "--block-size 0: expected an integer >= 1" -- r --block-size 0
refused "route --padding bad" "--padding middle: expected skip (empty positions hold -1) or row (they hold T)" \
    -- r --block-size 2 --padding middle
refused "route topk weights shape" "tw3.npy: expected topk weights of shape (2, 2) or (4,) (those of ids_ok.npy)" \
    "found (3,) float32" -- r --block-size 2 --topk-weights tw3.npy
refused "route integer topk weights" "tw_i.npy: expected a floating-point array" -- r --block-size 2 --topk-weights tw_i.npy
refused "route uint16 weights without --dtype" "tw_u.npy: holds uint16 16-bit patterns" \
    -- r --block-size 2 --topk-weights tw_u.npy
refused "route missing topk weights" "nope.npy: cannot open" -- r --block-size 2 --topk-weights nope.npy
refused "route expert twice in a row" "ids_dup.npy: " "topk_ids[1][1] = 1" \
    -- "$MOE" route --topk-ids ids_dup.npy --experts 3 --block-size 2 --out r
refused "route layout id out of range" "ids.npy: " "topk_ids[1][1] = 3" \
    -- "$MOE" route --topk-ids ids.npy --experts 3 --block-size 2 --dropping --out r
: >file
refused "route into a file" "file: cannot create the folder" -- "$MOE" route --topk-ids ids.npy --experts 4 --out file/r

# ---- mlp-fwd, mlp-bwd ----
# the small MLP of small_mlp (tests/test_cli_lib.sh): T = 2 tokens, E = 2 experts, H = 2, I = 1, one block
small_mlp m
run_ok "mlp-fwd runs" "$MOE" mlp-fwd --in m --out m
run_ok "mlp-bwd runs" "$MOE" mlp-bwd --in m --out g
# variant NAME: a copy of m to break one file of
variant() {
    rm -rf "$1"
    cp -r m "$1"
}
# shellcheck disable=SC2317 # called through refused
mfwd() { "$MOE" mlp-fwd --out o "$@"; }
# shellcheck disable=SC2317
mbwd() { "$MOE" mlp-bwd --out o "$@"; }
# wrong shapes: the file, the expected and the found shape
variant v_wd
"$NPY" mk v_wd/down_proj_weight.npy '<f4' 2,2,2 1
refused "down_proj_weight shape" "v_wd/down_proj_weight.npy: expected down_proj_weight of shape (2, 1, 2)" \
    "E, I and H from v_wd/gate_up_proj_weight.npy" "found (2, 2, 2) float32" -- mfwd --in v_wd
variant v_wgu
"$NPY" mk v_wgu/gate_up_proj_weight.npy '<f4' 2,2,3,1 1
refused "gate_up_proj_weight shape" "v_wgu/gate_up_proj_weight.npy: expected gate_up_proj_weight of shape (E, H, 2, I)" \
    "found (2, 2, 3, 1) float32" -- mfwd --in v_wgu
variant v_h
"$NPY" mk v_h/hidden_states.npy '<f4' 2,3 1
refused "hidden_states shape" "v_h/hidden_states.npy: expected hidden_states of shape (T, 2)" "found (2, 3) float32" \
    -- mfwd --in v_h
variant v_aff
"$NPY" mk v_aff/expert_affinities_masked.npy '<f4' 5 1
refused "affinities shape" "v_aff/expert_affinities_masked.npy: expected expert_affinities_masked of shape (4,), (4, 1) or (2, 2)" \
    "T = 2 tokens from v_aff/hidden_states.npy" "found (5,) float32" -- mfwd --in v_aff
# with --padding row, m's 2 rows of hidden_states are 1 token and the padding row; its 4 affinities are
# then NKI's (T + 1) x E with a padding row that is not zero
refused "--padding row: NKI's padding row of the affinities must be 0" \
    "m/expert_affinities_masked.npy: the padding row (token 1, with --padding row) of expert_affinities_masked must be 0" \
    "element [1, 0] (flat index 2) is 1" -- mfwd --in m --padding row
variant v_aff3
"$NPY" mk v_aff3/expert_affinities_masked.npy '<f4' 3 1
refused "--padding row: T*E or (T + 1)*E affinities" "v_aff3/expert_affinities_masked.npy: expected expert_affinities_masked of shape (2,)" \
    "less the padding row" "or with NKI's padding row (4,), (4, 1) or (2, 2)" "found (3,) float32" -- mfwd --in v_aff3 --padding row
variant v_tp
"$NPY" mk v_tp/token_position_to_id.npy '<i8' 3 0
"$NPY" mk v_tp/block_to_expert.npy '<i8' 2 0 1
refused "token_position_to_id length" "v_tp/token_position_to_id.npy: expected token_position_to_id of shape (N*B,) or (N, B)" \
    "N = 2 blocks from v_tp/block_to_expert.npy" "found (3,) int64" -- mfwd --in v_tp
refused "--block-size against the files" "m/token_position_to_id.npy: expected token_position_to_id of shape (1,) or (1, 1)" \
    "B = 1 from --block-size" "found (2,) int64" -- mfwd --in m --block-size 1
variant v_b2e
"$NPY" mk v_b2e/block_to_expert.npy '<i8' 1,2 0
refused "block_to_expert shape" "v_b2e/block_to_expert.npy: expected block_to_expert of shape (N,) or (N, 1)" \
    "found (1, 2) int64" -- mfwd --in v_b2e
variant v_bias
"$NPY" mk v_bias/gate_up_proj_bias.npy '<f4' 2,2 1
"$NPY" mk v_bias/down_proj_bias.npy '<f4' 2,2 1
refused "gate_up_proj_bias shape" "v_bias/gate_up_proj_bias.npy: expected gate_up_proj_bias of shape (2, 2, 1)" \
    "found (2, 2) float32" -- mfwd --in v_bias --bias
"$NPY" mk v_bias/gate_up_proj_bias.npy '<f4' 2,2,1 1
"$NPY" mk v_bias/down_proj_bias.npy '<f4' 2,1 1
refused "down_proj_bias shape" "v_bias/down_proj_bias.npy: expected down_proj_bias of shape (2, 2)" "found (2, 1) float32" \
    -- mfwd --in v_bias --bias
variant v_g
"$NPY" mk v_g/output_hidden_states_grad.npy '<f4' 3,2 1
refused "output grad shape" "v_g/output_hidden_states_grad.npy: expected output_hidden_states_grad of shape (2, 2)" \
    "found (3, 2) float32" -- mbwd --in v_g
variant v_ck
"$NPY" mk v_ck/gate_up_proj_act_checkpoint_T.npy '<f4' 1,2,2,2 1
refused "gate/up checkpoint shape" "v_ck/gate_up_proj_act_checkpoint_T.npy: expected gate_up_proj_act_checkpoint_T of shape (1, 2, 1, 2)" \
    "found (1, 2, 2, 2) float32" -- mbwd --in v_ck
variant v_cd
"$NPY" mk v_cd/down_proj_act_checkpoint.npy '<f4' 1,2,1 1
refused "down checkpoint shape" "v_cd/down_proj_act_checkpoint.npy: expected down_proj_act_checkpoint of shape (1, 2, 2)" \
    "found (1, 2, 1) float32" -- mbwd --in v_cd
# wrong dtypes
variant v_hi
"$NPY" mk v_hi/hidden_states.npy '<i8' 2,2 1
refused "integer hidden_states" "v_hi/hidden_states.npy: expected a floating-point array" "found (2, 2) int64" -- mfwd --in v_hi
variant v_bf
"$NPY" mk v_bf/block_to_expert.npy '<f4' 1 0
refused "float block_to_expert" "v_bf/block_to_expert.npy: expected an int32 or int64 array, found (1,) float32" \
    -- mfwd --in v_bf
variant v_hu
"$NPY" mk v_hu/hidden_states.npy '<u2' 2,2 16256
refused "uint16 hidden_states without --dtype" "v_hu/hidden_states.npy: holds uint16 16-bit patterns" "--dtype bf16" \
    -- mfwd --in v_hu
# missing files and folders
variant v_nh
rm v_nh/hidden_states.npy
refused "missing hidden_states" "v_nh/hidden_states.npy: cannot open" -- mfwd --in v_nh
refused "missing biases" "m/gate_up_proj_bias.npy: cannot open" -- mfwd --in m --bias
variant v_nc
rm v_nc/moe-options.txt # the forward's options (affinity on h); here the flags say which
rm v_nc/gate_up_proj_act_checkpoint_T.npy
refused "missing gate/up checkpoint" "v_nc/gate_up_proj_act_checkpoint_T.npy: cannot open" -- mbwd --in v_nc
rm v_nc/down_proj_act_checkpoint.npy
"$NPY" mk v_nc/gate_up_proj_act_checkpoint_T.npy '<f4' 1,2,1,2 1
refused "missing down checkpoint" "v_nc/down_proj_act_checkpoint.npy: cannot open" -- mbwd --in v_nc
run_ok "--affinity-on i: the down checkpoint is optional" "$MOE" mlp-bwd --in v_nc --out ok --affinity-on i
refused "--affinity-on i --bias without it: the down bias" "v_nc/down_proj_bias.npy: cannot open" \
    -- mbwd --in v_nc --affinity-on i --bias
refused "--in missing" "--in nope: not a folder" -- mfwd --in nope
refused "--in a file" "--in m/hidden_states.npy: not a folder" -- mfwd --in m/hidden_states.npy
refused "missing --in" "missing required option --in DIR" -- "$MOE" mlp-fwd --out o
refused "missing --out" "missing required option --out DIR" -- "$MOE" mlp-bwd --in m
# ids out of range and broken layouts
variant v_id
"$NPY" mk v_id/token_position_to_id.npy '<i8' 2 0 5
refused "token id out of range" "v_id/token_position_to_id.npy, v_id/block_to_expert.npy: " \
    "token_position_to_id[1] = 5 (block 0, slot 1), expected a token in [0, 2) or the padding mark -1" -- mfwd --in v_id
variant v_row
"$NPY" mk v_row/hidden_states.npy '<f4' 3,2 1
"$NPY" mk v_row/output_hidden_states_grad.npy '<f4' 3,2 1
"$NPY" mk v_row/token_position_to_id.npy '<i8' 2 0 2
run_ok "--padding row: T + 1 rows, id T marks a padding position" "$MOE" mlp-fwd --in v_row --out v_row --padding row
"$NPY" mk v_row/token_position_to_id.npy '<i8' 2 0 -1
refused "skip mark with --padding row" "v_row/token_position_to_id.npy, v_row/block_to_expert.npy: " \
    "token_position_to_id[1] = -1 (block 0, slot 1), expected a token in [0, 2) or the padding mark 2" \
    -- mbwd --in v_row --padding row
variant v_ex
"$NPY" mk v_ex/block_to_expert.npy '<i8' 1 2
refused "expert out of range" "v_ex/token_position_to_id.npy, v_ex/block_to_expert.npy: " \
    "block_to_expert[0] = 2, expected an expert in [0, 2)" -- mfwd --in v_ex
variant v_pair
"$NPY" mk v_pair/token_position_to_id.npy '<i8' 2 1 1
refused "a pair twice" "v_pair/token_position_to_id.npy" "both place token 1 with expert 0" -- mfwd --in v_pair
variant v_top2
"$NPY" mk v_top2/token_position_to_id.npy '<i8' 4 0 1 0 1
"$NPY" mk v_top2/block_to_expert.npy '<i8' 2 0 1
run_ok "top-2 layout runs" "$MOE" mlp-fwd --in v_top2 --out ok
refused "--no-accumulate with a token twice" "v_top2/token_position_to_id.npy" \
    "tensor_update_overwrite is set but token 0 sits at layout.token_position_to_id[0] and [2]" \
    -- mfwd --in v_top2 --no-accumulate
# bad options (m_flags: m without the forward's options file, so the flags alone decide)
variant m_flags
rm m_flags/moe-options.txt
refused "--clamp 3 fields" "--clamp 1,2,3: expected exactly 4 comma-separated fields NL_LO,NL_HI,LIN_LO,LIN_HI" \
    -- mfwd --in m --clamp 1,2,3
refused "--clamp 5 fields" "--clamp 1,2,3,4,5: expected exactly 4 comma-separated fields" -- mfwd --in m --clamp 1,2,3,4,5
refused "--clamp empty" "--clamp : expected exactly 4 comma-separated fields" -- mfwd --in m --clamp ""
refused "--clamp not a number" "--clamp a,,,: field NL_LO = 'a' is not a finite number" -- mfwd --in m --clamp a,,,
refused "--clamp trailing junk" "--clamp ,,,1x: field LIN_HI = '1x' is not a finite number" -- mfwd --in m --clamp ,,,1x
refused "--clamp inf" "--clamp ,inf,,: field NL_HI = 'inf' is not a finite number" -- mfwd --in m --clamp ,inf,,
refused "--clamp nan" "--clamp ,,nan,: field LIN_LO = 'nan' is not a finite number" -- mfwd --in m --clamp ,,nan,
refused "--clamp past float" "--clamp ,,,1e50: field LIN_HI = '1e50' is not a finite number" -- mfwd --in m --clamp ,,,1e50
refused "--clamp NL lower above upper" "--clamp 2,1,,: NL_LO = 2 is above NL_HI = 1" -- mfwd --in m --clamp 2,1,,
refused "--clamp LIN lower above upper" "--clamp ,,3,-3: LIN_LO = 3 is above LIN_HI = -3" -- mbwd --in m_flags --clamp ,,3,-3
run_ok "--clamp with every field empty" "$MOE" mlp-fwd --in m --out ok --clamp ,,,
refused "--activation" "--activation relu: expected silu, gelu, gelu_tanh or swish" -- mfwd --in m --activation relu
refused "--affinity-on" "--affinity-on x: expected h (out += a*d) or i (m = act(g)*u*a)" -- mbwd --in m_flags --affinity-on x
refused "--padding" "--padding middle: expected skip (empty positions hold -1) or row (they hold T)" \
    -- mfwd --in m --padding middle
refused "mlp --block-size 0" "--block-size 0: expected an integer >= 1" -- mfwd --in m --block-size 0
refused "mlp --dtype" "--dtype f64: expected f32, f16 or bf16" -- mfwd --in m --dtype f64
cuda_refused "mlp-bwd --backend cuda" mbwd --in m --backend cuda
cuda_refused "mlp-fwd --backend cuda" mfwd --in m --backend cuda
refused "--grad-fp32 is the backward's" "unknown option '--grad-fp32'" -- mfwd --in m --grad-fp32
if [ -e o ]; then bad "a refused mlp command created its --out folder o"; fi

# ---- usage ----
refused "unknown option" "moe gemm-fwd: unknown option '--bogus'" -- fwd --x x.npy --bogus
refused "unknown option=value" "unknown option '--bogus'" -- fwd --x x.npy --bogus=1
refused "single-dash option" "unknown option '-x'" -- fwd -x x.npy
refused "missing --out" "missing required option --out Y.npy" -- "$MOE" gemm-fwd --x x.npy --w w.npy --m-sizes m.npy
refused "missing --x" "missing required option --x X.npy" -- "$MOE" gemm-fwd --w w.npy --m-sizes m.npy --out y.npy
refused "missing --m-sizes" "missing required option --m-sizes M.npy" -- "$MOE" gemm-dx --dy dy.npy --w w.npy --out y.npy
refused "option twice" "option --x is given twice" -- fwd --x x.npy --x x.npy
refused "flag with a value" "option --permute-x takes no value" -- fwd --x x.npy --permute-x=1
refused "option without its value" "option --out needs a value" -- "$MOE" gemm-fwd --x x.npy --w w.npy --m-sizes m.npy --out
refused "stray argument" "unexpected argument 'extra'" -- fwd --x x.npy extra
refused "bad --dtype" "--dtype f64: expected f32, f16 or bf16" -- fwd --x x.npy --dtype f64
cuda_refused "gemm-fwd --backend cuda" fwd --x x.npy --backend cuda
refused "--backend foo" "--backend foo: expected ref or cuda" -- fwd --x x.npy --backend foo
refused "output folder missing" "no/such/folder/y.npy: cannot create" \
    -- "$MOE" gemm-fwd --x x.npy --w w.npy --m-sizes m.npy --out no/such/folder/y.npy
refused "unknown command" "unknown command 'frobnicate'" -- "$MOE" frobnicate
refused "help for an unknown command" "unknown command 'frobnicate'" -- "$MOE" help frobnicate
refused "no command" "usage: moe COMMAND" -- "$MOE"
run_ok "gemm-fwd with --backend ref and --opt=value spelling" fwd --x=x.npy --backend=ref

# moe autotune: usage errors are refused before any device is touched; without CUDA the command is refused
# naming why (tests/test_cli_cuda.sh runs it on a GPU)
# shellcheck disable=SC2317 # called through refused
tune() { "$MOE" autotune --tokens 16 --experts 4 --n 64 --k 64 --cache tune.txt "$@"; }
refused "autotune --op bwd" "--op bwd: expected fwd, dx or dw" -- tune --op bwd
refused "autotune without --op" "missing required option --op" -- tune
refused "autotune k > E" "--topk 5: a token's experts are distinct, so k <= E = 4" -- tune --op fwd --topk 5
refused "autotune --reduce-topk with fwd" "--reduce-topk: only with --op dx" -- tune --op fwd --reduce-topk
refused "autotune --dw-fp32 with dx" "--dw-fp32: only with --op dw" -- tune --op dx --dw-fp32
refused "autotune --repeats 1001" "--repeats 1001: expected 1 .. 1000" -- tune --op dw --repeats 1001
refused "autotune --repeats 0" "--repeats 0: expected an integer >= 1" -- tune --op dw --repeats 0
refused "autotune --dtype f64" "--dtype f64: expected f32, f16 or bf16" -- tune --op fwd --dtype f64
refused "autotune --tokens 0" "--tokens 0: expected an integer >= 1" -- "$MOE" autotune --op fwd --tokens 0 \
    --experts 4 --n 64 --k 64 --cache tune.txt
if [ "$cuda_runs" -ne 0 ]; then
    tune --op fwd >out 2>err
    got=$?
    if [ "$got" -eq 2 ] && [ ! -s out ] && [ ! -e tune.txt ] &&
        { grep -qF "this build has no CUDA backend" err || grep -qF "no CUDA device available" err; }; then
        passed=$((passed + 1))
    else
        bad "autotune without a usable GPU: exit $got, or stdout / tune.txt written, or no reason: $(cat err)"
    fi
fi

finish
