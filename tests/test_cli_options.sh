#!/bin/sh
# What travels with the data: the options file (moe-options.txt) that route, mlp-fwd and mlp-bwd write and
# mlp-fwd (a routing's), mlp-bwd and compare read, its refusals; the warning of an MLP command that runs
# bf16-valued float32 inputs in f32 without being told; NKI's (T + 1) x E affinities with --padding row.
. "$(dirname "$0")/test_cli_lib.sh"

# A tiny MLP case, every value a bf16 (and f16) value: T = 2 tokens, E = 2, H = 2, I = 1, B = 2; token 0
# goes to experts 0 and 1, token 1 to expert 0: blocks [0 1] (expert 0) and [0 -] (expert 1).
mkdir m
"$NPY" mk m/hidden_states.npy '<f4' 2,2 0.5 1 0.25 -1
"$NPY" mk m/expert_affinities_masked.npy '<f4' 4 0.5 0.5 1 0
"$NPY" mk m/gate_up_proj_weight.npy '<f4' 2,2,2,1 0.5 0.25 -0.5 1 1 0.5 0.25 -0.25
"$NPY" mk m/down_proj_weight.npy '<f4' 2,1,2 1 0.5 -0.5 0.25
"$NPY" mk m/token_position_to_id.npy '<i8' 4 0 1 0 -1
"$NPY" mk m/block_to_expert.npy '<i8' 2 0 1
"$NPY" mk m/output_hidden_states_grad.npy '<f4' 2,2 1 -1 0.5 0.25

# ---- a forgotten --dtype: bf16-valued float32 inputs and no options file warn, and still run in f32 ----
run_ok "mlp-fwd of bf16-valued inputs without --dtype" "$MOE" mlp-fwd --in m --out w
has "mlp-fwd warns" err "warning: every value of the floating inputs in m is a bf16 and an f16 value" \
    "pass --dtype bf16; --dtype f32 says f32 is meant"
has "mlp-fwd still runs in f32" out "B = 2, f32"
run_ok "--dtype f32: no warning" "$MOE" mlp-fwd --in m --out w32 --dtype f32
if [ -s err ]; then bad "mlp-fwd --dtype f32 warned: $(cat err)"; fi
"$NPY" mk m/hidden_states.npy '<f4' 2,2 0.5 1 0.25 -1.00000012
run_ok "mlp-fwd of float32 values" "$MOE" mlp-fwd --in m --out w
if [ -s err ]; then bad "mlp-fwd warned about float32 values: $(cat err)"; fi
"$NPY" mk m/hidden_states.npy '<f4' 2,2 0.5 1 0.25 -1

# ---- mlp-fwd writes the file; mlp-bwd takes its options as defaults ----
cp -r m f
run_ok "mlp-fwd --dtype bf16" "$MOE" mlp-fwd --in f --out f --dtype bf16 --activation gelu --clamp ,2,-1,
has "mlp-fwd writes its options" out "wrote f/moe-options.txt"
has "the options file" f/moe-options.txt "# moe-options 1, written by moe mlp-fwd" "command = mlp-fwd" "dtype = bf16" \
    "block_size = 2" "padding = skip" "activation = gelu" "affinity_on = h" "bias = 0" "clamp = ,2,-1," \
    "no_accumulate = 0" "intermediates = rounded"
run_ok "mlp-bwd takes the forward's options" "$MOE" mlp-bwd --in f --out g
has "mlp-bwd runs in the forward's dtype" out "B = 2, bf16"
if [ -s err ]; then bad "mlp-bwd with the options file warned: $(cat err)"; fi
run_ok "the same flags given again" "$MOE" mlp-bwd --in f --out g2 --dtype bfloat16 --activation gelu --clamp ,2.0,-1,
run_ok "file and flags: the same gradients" "$MOE" compare --exact g g2
has "mlp-bwd writes its options" g/moe-options.txt "written by moe mlp-bwd" "dtype = bf16" "grad_fp32 = 0"
cp -r f f_flags
rm f_flags/moe-options.txt
run_ok "without the file's options" "$MOE" mlp-bwd --in f_flags --out g0 --dtype bf16
run_status "the file's options reach the library" 1 "$MOE" compare --exact g g0
# a conflicting flag is refused, naming both
refused "--dtype against the file" "--dtype f32 conflicts with f/moe-options.txt, which says dtype = bf16" \
    "(the options moe mlp-fwd ran with)" -- "$MOE" mlp-bwd --in f --out x --dtype f32
refused "--activation against the file" "--activation silu conflicts with f/moe-options.txt, which says activation = gelu" \
    -- "$MOE" mlp-bwd --in f --out x --activation silu
refused "--clamp against the file" "--clamp ,3,-1, conflicts with f/moe-options.txt, which says clamp = ,2,-1," \
    -- "$MOE" mlp-bwd --in f --out x --clamp ,3,-1,
refused "a flag the file says was off" "--bias (given) conflicts with f/moe-options.txt, which says bias = 0" \
    -- "$MOE" mlp-bwd --in f --out x --bias
if [ -e x ]; then bad "a refused mlp-bwd created its --out folder"; fi

# ---- compare takes the dtype of the file beside A (or B) ----
run_ok "compare with the file's dtype" "$MOE" compare g/hidden_states_grad.npy g2/hidden_states_grad.npy
has "compare names the file" out "dtype bf16 from g/moe-options.txt (moe mlp-bwd)" "tolerance      bf16:"
run_ok "compare folders" "$MOE" compare g g2
has "compare of folders" out "dtype bf16 from g/moe-options.txt"
refused "compare --dtype against the file" "--dtype f32 conflicts with g/moe-options.txt, which says dtype = bf16" \
    -- "$MOE" compare --dtype f32 g/hidden_states_grad.npy g0/hidden_states_grad.npy
mkdir plain
cp g/hidden_states_grad.npy plain/
run_ok "compare: B's file when A has none" "$MOE" compare plain/hidden_states_grad.npy g/hidden_states_grad.npy
has "compare reads B's file" out "dtype bf16 from g/moe-options.txt"

# ---- malformed files are refused, naming the file and the line ----
cp -r f bad
printf 'dtype = bf16\n' >bad/moe-options.txt
refused "no header" "bad/moe-options.txt: not a moe options file" -- "$MOE" mlp-bwd --in bad --out x
printf '# moe-options 2, written by moe mlp-fwd\ncommand = mlp-fwd\n' >bad/moe-options.txt
refused "a newer format" "bad/moe-options.txt: format version 2; this moe reads version 1" -- "$MOE" mlp-bwd --in bad --out x
printf '# moe-options 1, written by moe mlp-fwd\ncommand = mlp-fwd\ncolour = blue\n' >bad/moe-options.txt
refused "an unknown key" "bad/moe-options.txt:3: unknown key 'colour'" -- "$MOE" mlp-bwd --in bad --out x
printf '# moe-options 1, written by moe mlp-fwd\ncommand = mlp-fwd\ndtype = f8\n' >bad/moe-options.txt
refused "a bad value" "bad/moe-options.txt: dtype = f8 is not a valid value of --dtype" -- "$MOE" mlp-bwd --in bad --out x
printf '# moe-options 1, written by moe mlp-fwd\ndtype = bf16\n' >bad/moe-options.txt
refused "no command" "bad/moe-options.txt: no 'command = ...' line" -- "$MOE" mlp-bwd --in bad --out x
printf '# moe-options 1, written by moe mlp-fwd\ncommand = mlp-fwd\nno equals sign\n' >bad/moe-options.txt
refused "not key = value" "bad/moe-options.txt:3: expected 'key = value', found 'no equals sign'" \
    -- "$MOE" mlp-bwd --in bad --out x

# ---- route's options: the layout's, and the dtype only when --dtype was given ----
"$NPY" mk ids.npy '<i8' 2,2 0 1 0 1
"$NPY" mk tw.npy '<f4' 2,2 0.5 0.5 1 0.5
run_ok "route --padding row --dtype bf16" "$MOE" route --topk-ids ids.npy --experts 2 --block-size 2 --padding row \
    --topk-weights tw.npy --dtype bf16 --out r
has "route's options" r/moe-options.txt "written by moe route" "command = route" "block_size = 2" "padding = row" \
    "dropping = 0" "dtype = bf16"
refused "mlp-fwd against the routing's padding" "--padding skip conflicts with r/moe-options.txt, which says padding = row" \
    "(the options moe route ran with)" -- "$MOE" mlp-fwd --in r --out x --padding skip
# the routing's options are mlp-fwd's defaults: row padding (hidden_states has T + 1 rows) and bf16
cp m/gate_up_proj_weight.npy m/down_proj_weight.npy r/
"$NPY" mk r/hidden_states.npy '<f4' 3,2 0.5 1 0.25 -1 0 0
run_ok "mlp-fwd takes the routing's options" "$MOE" mlp-fwd --in r --out rf
has "mlp-fwd with the routing's padding and dtype" out "wrote rf/output.npy: shape (3, 2) float32" "B = 2, bf16"
has "mlp-fwd passes them on" rf/moe-options.txt "padding = row" "dtype = bf16" "block_size = 2"
run_ok "route without --dtype" "$MOE" route --topk-ids ids.npy --experts 2 --block-size 2 --topk-weights tw.npy --out r2
if grep -q dtype r2/moe-options.txt; then bad "route without --dtype wrote a dtype"; fi
# an earlier forward's file in mlp-fwd's --in describes outputs, not inputs: not read
run_ok "mlp-fwd ignores an earlier forward's file" "$MOE" mlp-fwd --in f --out f3 --dtype f16
has "mlp-fwd ran as told" out "B = 2, f16"

# ---- --bound-out: a bound per output element, beside each output's name ----
cp -r m b
rm -f b/moe-options.txt
run_ok "mlp-fwd --bound-out bf16" "$MOE" mlp-fwd --in b --out b --dtype bf16 --bound-out b_bound
has "mlp-fwd writes the bounds" out "wrote b_bound/output.npy: shape (2, 2) float64" \
    "wrote b_bound/gate_up_proj_act_checkpoint_T.npy: shape (2, 2, 1, 2) float64" \
    "wrote b_bound/down_proj_act_checkpoint.npy: shape (2, 2, 2) float64"
run_ok "mlp-fwd f32" "$MOE" mlp-fwd --in b --out b32 --dtype f32
# the f32 result is nearer the exact one than bf16's bound: within it
run_ok "bf16 forward within its bound of the f32 one" "$MOE" compare b/output.npy b32/output.npy --bound b_bound
has "compare --bound DIR with two files" out "tolerance      2 * bound from b_bound/output.npy"
run_ok "mlp-bwd --bound-out" "$MOE" mlp-bwd --in b --out b_g --bound-out b_gbound
cp -r b b_f
rm b_f/moe-options.txt
run_ok "mlp-bwd f32 of the same checkpoints" "$MOE" mlp-bwd --in b_f --out b_g32 --dtype f32 --bound-out b_g32bound
has "mlp-bwd writes the bounds" out "wrote b_g32bound/expert_affinities_masked_grad.npy: shape (4,) float64"
run_ok "bf16 gradients within their bounds of the f32 ones" "$MOE" compare b_g b_g32 --bound b_gbound
has "every gradient within its bound" out "summary: 4 tensor(s) compared, 0 over the tolerance"
run_status "f32 gradients: not within the f32 bounds of the bf16 ones" 1 "$MOE" compare b_g32 b_g --bound b_g32bound
refused "--bound-out the folder of --out" "b/output.npy and b/output.npy are the same file" \
    -- "$MOE" mlp-fwd --in b --out b --bound-out b
run_status "compare --bound DIR without A's name" 2 "$MOE" compare b/hidden_states.npy b/hidden_states.npy --bound b_bound
has "compare --bound DIR without A's name: the message" err \
    "b_bound/hidden_states.npy: no bound for b/hidden_states.npy in the folder b_bound"

# ---- NKI's padding row: (T + 1) x E affinities, zero in row T ----
mkdir n
cp m/gate_up_proj_weight.npy m/down_proj_weight.npy m/block_to_expert.npy n/
"$NPY" mk n/hidden_states.npy '<f4' 3,2 0.5 1 0.25 -1 0 0
"$NPY" mk n/output_hidden_states_grad.npy '<f4' 3,2 1 -1 0.5 0.25 0 0
"$NPY" mk n/token_position_to_id.npy '<i8' 4 0 1 0 2
cp -r n n_flat
"$NPY" mk n/expert_affinities_masked.npy '<f4' 6,1 0.5 0.5 1 0 0 0
"$NPY" mk n_flat/expert_affinities_masked.npy '<f4' 4 0.5 0.5 1 0
for d in n n_flat; do
    run_ok "mlp-fwd --padding row $d" "$MOE" mlp-fwd --in $d --out $d --padding row --dtype f32
    run_ok "mlp-bwd $d" "$MOE" mlp-bwd --in $d --out $d/grad
done
run_ok "(T + 1) x E affinities: the same forward" "$MOE" compare --exact n/output.npy n_flat/output.npy
for f in hidden_states_grad gate_up_proj_weight_grad down_proj_weight_grad; do
    run_ok "(T + 1) x E affinities: the same $f" "$MOE" compare --exact n/grad/$f.npy n_flat/grad/$f.npy
done
run_ok "info" "$NPY" info n/grad/expert_affinities_masked_grad.npy
has "the affinity gradient in NKI's shape" out "(6, 1)"
"$NPY" mk n/expert_affinities_masked.npy '<f4' 3,2 0.5 0.5 1 0 0 0.125
refused "a padding row that is not zero" \
    "n/expert_affinities_masked.npy: the padding row (token 2, with --padding row) of expert_affinities_masked must be 0" \
    "element [2, 1] (flat index 5) is 0.125" -- "$MOE" mlp-fwd --in n --out x --padding row
refused "(T + 1) x E affinities need --padding row" "n_flat/expert_affinities_masked.npy: expected expert_affinities_masked of shape (6,)" \
    -- "$MOE" mlp-fwd --in n_flat --out x --padding skip

finish
