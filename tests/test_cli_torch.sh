#!/bin/sh
# Two PyTorch MoE layers in bf16, forward and backward, checked against libmoe through the moe CLI with
# no layout code: nn.Linear experts (tests/torch_moe_linear.py, --weight-layout linear-split) and
# transformers' fused MixtralExperts layout (tests/torch_moe_hf.py, --weight-layout hf-mixtral); the
# shared part and the tolerance are tests/torch_moe_check.py.  Skipped (77) where no python3 has torch
# and numpy.
here=$(cd "$(dirname "$0")" && pwd)
. "$here/test_cli_lib.sh"
if ! python=$(sh "$here/torch_python.sh" "torch, numpy"); then
    echo "SKIP: no python3 with torch and numpy"
    exit 77
fi
for layer in linear hf; do
    run_ok "torch_moe_$layer.py" env PYTHONPATH="$here" "$python" "$here/torch_moe_$layer.py" "$MOE" "$layer"
    has "torch_moe_$layer.py: the planted bug was caught" out "verdict        FAIL ("
done
# the README's example as it stands: step.py, then its commands, and with gate and up swapped every tensor fails
readme=$here/../README.md
sed -n '/^## Debugging a training step/,/^## How it is checked/p' "$readme" >section
# shellcheck disable=SC2016 # sed's own $
sed -n '/^```python$/,/^```$/p' section | sed '1d;$d' >step.py
# shellcheck disable=SC2016
sed -n '/^```sh$/,/^```$/p' section | sed '1d;$d' >readme.sh
# shellcheck disable=SC2317 # called by readme.sh
moe() { "$MOE" "$@"; }
# shellcheck disable=SC2317
python3() { "$python" "$@"; }
run_status "README example" 0 . ./readme.sh
if [ "$(grep -c 'verdict        PASS' out)" = 5 ]; then passed=$((passed + 1)); else
    bad "README example: the forward and 4 gradients should pass"; fi
sed 's/gate, up = F.linear/up, gate = F.linear/' step.py >bug.py && mv bug.py step.py
rm -r step grads
run_status "README example with gate and up swapped" 1 . ./readme.sh
if [ "$(grep -c 'verdict        FAIL' out)" = 5 ]; then passed=$((passed + 1)); else
    bad "README example with gate and up swapped: the forward and 4 gradients should fail"; fi
finish
