#!/bin/sh
# The moe tool's outputs are all or nothing (cli/outputs.c): a command that fails once it has written
# some outputs changes no existing file and leaves no temporary file behind; two outputs naming one
# file, an output naming an input, and an output that is a folder or a FIFO are refused before
# anything is read; an input that is not a regular file (a FIFO without a writer, a folder) is
# refused at once, naming it. Outputs that are written replace their files, keeping their permissions.
. "$(dirname "$0")/test_cli_lib.sh"

# snapshot DIR: a copy of folder DIR (DIR.saved) for `unchanged` to compare with.
snapshot() {
    rm -rf "$1.saved"
    cp -R "$1" "$1.saved"
}

# unchanged DESC DIR: DIR holds the files of its snapshot, byte for byte, and nothing else (no
# temporary file either).
unchanged() {
    if diff -r "$2.saved" "$2" >diffs 2>&1; then
        passed=$((passed + 1))
    else
        bad "$1: $2 changed: $(cat diffs)"
    fi
}

small_gemm in
"$NPY" mk in/g.npy '<i8' 3 2 0 1
# shellcheck disable=SC2317 # called through refused and run_ok
fwd() { "$MOE" gemm-fwd --x in/x.npy --w in/w.npy --m-sizes in/m.npy "$@"; }
# shellcheck disable=SC2317
dw() {
    "$MOE" gemm-dw --x in/x.npy --dy in/dy.npy --m-sizes in/m.npy --gather in/g.npy --topk 1 --w in/w.npy "$@"
}
snapshot in

# ---- an output that cannot be created after others were written: nothing changes ----
mkdir d
"$NPY" mk d/y.npy '<f4' 1 7
"$NPY" mk d/b.npy '<f8' 1 8
"$NPY" mk d/dw.npy '<f4' 1 9
: >d/file
snapshot d
refused "gemm-fwd --bound-out under a file" "d/file/b.npy: cannot create" "Not a directory" \
    -- fwd --out d/y.npy --bound-out d/file/b.npy
unchanged "gemm-fwd --bound-out under a file" d
refused "gemm-fwd --bound-out in a missing folder" "d/none/b.npy: cannot create" "No such file or directory" \
    -- fwd --out d/y.npy --bound-out d/none/b.npy
unchanged "gemm-fwd --bound-out in a missing folder" d
refused "gemm-dw: the third output under a file" "d/file/dtw.npy: cannot create" \
    -- dw --out d/dw.npy --bound-out d/b.npy --out-topk-weights-grad d/file/dtw.npy
unchanged "gemm-dw: the third output under a file" d
unchanged "gemm-dw: the third output under a file, inputs" in

# an output that is a folder is refused before anything is read (a rename could not replace it)
mkdir d/bound.npy
snapshot d
refused "gemm-fwd --bound-out a folder" "d/bound.npy: cannot write there: it is a folder" \
    -- fwd --out d/y.npy --bound-out d/bound.npy
unchanged "gemm-fwd --bound-out a folder" d
refused "gemm-fwd --out ending in /" "'d/': cannot write there: the path does not end in a file name" \
    -- fwd --out d/
refused "gemm-fwd --bound-out .." "'d/..': cannot write there: the path does not end in a file name" \
    -- fwd --out d/y.npy --bound-out d/..
unchanged "outputs that name no file" d

# mlp-fwd --out its --in folder: an earlier output.npy and checkpoints stay as they were
small_mlp m
run_ok "mlp-fwd into its --in folder" "$MOE" mlp-fwd --in m --out m
"$NPY" mk m/output.npy '<f4' 1 1
rm m/down_proj_act_checkpoint.npy
mkdir m/down_proj_act_checkpoint.npy
snapshot m
refused "mlp-fwd with a folder for a checkpoint" "m/down_proj_act_checkpoint.npy: cannot write there: it is a folder" \
    -- "$MOE" mlp-fwd --in m --out m
unchanged "mlp-fwd with a folder for a checkpoint" m
rmdir m/down_proj_act_checkpoint.npy
run_ok "mlp-fwd again" "$MOE" mlp-fwd --in m --out m
run_ok "mlp-bwd" "$MOE" mlp-bwd --in m --out grads
rm grads/down_proj_weight_grad.npy
mkdir grads/down_proj_weight_grad.npy
snapshot grads
refused "mlp-bwd with a folder for a gradient" "grads/down_proj_weight_grad.npy: cannot write there: it is a folder" \
    -- "$MOE" mlp-bwd --in m --out grads
unchanged "mlp-bwd with a folder for a gradient" grads
# (FIFOs stay out of the snapshots: diff would wait on them)
mkfifo fifo_out.npy
refused "a FIFO --out" "fifo_out.npy: cannot write there: it is not a regular file" \
    -- timeout 10 "$MOE" gemm-fwd --x in/x.npy --w in/w.npy --m-sizes in/m.npy --out fifo_out.npy

# route: the routing is not rewritten when the layout cannot be
"$NPY" mk ids.npy '<i8' 2,2 0 1 1 0
run_ok "route" "$MOE" route --topk-ids ids.npy --experts 2 --out r
"$NPY" mk r/m_sizes.npy '<i8' 1 5
mkdir r/block_to_expert.npy
snapshot r
refused "route with a folder for the layout" "r/block_to_expert.npy: cannot write there: it is a folder" \
    -- "$MOE" route --topk-ids ids.npy --experts 2 --block-size 2 --out r
unchanged "route with a folder for the layout" r
# an empty folder name is refused (it would have put /m_sizes.npy and the rest at the root)
refused "route --out ''" "option --out is empty" -- "$MOE" route --topk-ids ids.npy --experts 2 --out ""
refused "mlp-fwd --out ''" "option --out is empty" -- "$MOE" mlp-fwd --in m --out ""

# ---- two outputs naming one file ----
snapshot d
refused "the same path twice" "d/y.npy and d/y.npy are the same file" -- fwd --out d/y.npy --bound-out d/y.npy
refused "./ and .. spellings" "d/y.npy and ./d/../d/y.npy are the same file" \
    -- fwd --out d/y.npy --bound-out ./d/../d/y.npy
refused "a new file, two spellings" "d/new.npy and ./d/new.npy are the same file" \
    -- fwd --out d/new.npy --bound-out ./d/new.npy
ln d/y.npy d/link.npy
snapshot d
refused "a hard link" "d/y.npy and d/link.npy are the same file" -- fwd --out d/y.npy --bound-out d/link.npy
refused "gemm-dw: the weights gradient and dW" "d/dw.npy and d//dw.npy are the same file" \
    -- dw --out d/dw.npy --out-topk-weights-grad d//dw.npy
unchanged "two outputs naming one file" d

# ---- an output naming an input ----
refused "--out is --x" "in/x.npy is both an input and an output (as in/x.npy)" -- fwd --out in/x.npy
refused "--out is --m-sizes" "in/m.npy is both an input and an output (as ./in/m.npy)" -- fwd --out ./in/m.npy
refused "--bound-out is --x" "in/x.npy is both an input and an output (as in/../in/x.npy)" \
    -- fwd --out d/y.npy --bound-out in/../in/x.npy
refused "gemm-dw weights gradient is --gather" "in/g.npy is both an input and an output" \
    -- dw --out d/dw.npy --out-topk-weights-grad in/g.npy
unchanged "outputs naming inputs: the inputs" in
unchanged "outputs naming inputs: the outputs" d
ln -s hidden_states.npy m/hidden_states_grad.npy
snapshot m
refused "mlp-bwd gradient linked to its input" "m/hidden_states.npy is both an input and an output" \
    "(as m/hidden_states_grad.npy)" -- "$MOE" mlp-bwd --in m --out m
unchanged "mlp-bwd gradient linked to its input" m
rm m/hidden_states_grad.npy
refused "route --out holding --topk-ids" "r/gather_indices.npy is both an input and an output" \
    -- "$MOE" route --topk-ids r/gather_indices.npy --experts 2 --out r

# ---- inputs that are not regular files: refused at once ----
mkfifo in/fifo.npy
refused "a FIFO --x" "in/fifo.npy: not a regular file (a FIFO)" -- timeout 10 "$MOE" gemm-fwd --x in/fifo.npy \
    --w in/w.npy --m-sizes in/m.npy --out d/y.npy
refused "a FIFO --m-sizes" "in/fifo.npy: not a regular file (a FIFO)" -- timeout 10 "$MOE" gemm-fwd --x in/x.npy \
    --w in/w.npy --m-sizes in/fifo.npy --out d/y.npy
refused "a FIFO to compare" "in/fifo.npy: not a regular file (a FIFO)" -- timeout 10 "$MOE" compare in/fifo.npy in/x.npy
cp -R m mf
rm mf/hidden_states.npy
mkfifo mf/hidden_states.npy
refused "a FIFO in mlp-fwd --in" "mf/hidden_states.npy: not a regular file (a FIFO)" \
    -- timeout 10 "$MOE" mlp-fwd --in mf --out mf
refused "a folder --x" "in: not a regular file (a folder)" -- "$MOE" gemm-fwd --x in --w in/w.npy \
    --m-sizes in/m.npy --out d/y.npy
refused "a folder --w" "d/bound.npy: not a regular file (a folder)" -- "$MOE" gemm-fwd --x in/x.npy --w d/bound.npy \
    --m-sizes in/m.npy --out d/y.npy
refused "a device --x" "/dev/null: not a regular file (a device)" -- "$MOE" gemm-fwd --x /dev/null --w in/w.npy \
    --m-sizes in/m.npy --out d/y.npy
rm in/fifo.npy
unchanged "refused inputs" d

# ---- a command that succeeds replaces its outputs, keeping their permissions; new files get 0666 less the umask ----
chmod 640 d/y.npy
run_ok "gemm-fwd replaces its outputs" fwd --out d/y.npy --bound-out d/b.npy
has "gemm-fwd says what it wrote" out "wrote d/y.npy: shape (3, 2) float32" "wrote d/b.npy: shape (3, 2) float64"
run_ok "the new y" "$NPY" info d/y.npy
has "the new y" out "<f4 (3, 2)"
case $(ls -l d/y.npy) in -rw-r-----*) passed=$((passed + 1)) ;; *) bad "d/y.npy lost its mode: $(ls -l d/y.npy)" ;; esac
(umask 027 && fwd --out d/fresh.npy >/dev/null)
case $(ls -l d/fresh.npy) in -rw-r-----*) passed=$((passed + 1)) ;; *) bad "d/fresh.npy: $(ls -l d/fresh.npy)" ;; esac
ls -A d >listing
if grep -q 'moe-' listing; then bad "a temporary file is left in d: $(cat listing)"; else passed=$((passed + 1)); fi

finish
