# Sourced by tests/test_cli_*.sh (POSIX sh): the programs, a scratch folder and the check helpers.
# Run from the build folder (make check does); MOE and NPY may point elsewhere.
MOE=${MOE:-./cli/moe}
NPY=${NPY:-./tests/test_cli_npy}
for prog in "$MOE" "$NPY"; do
    if [ ! -x "$prog" ]; then
        echo "missing $prog: run from the build folder after make"
        exit 99
    fi
done
case $MOE in /*) ;; *) MOE=$(pwd)/$MOE ;; esac
case $NPY in /*) ;; *) NPY=$(pwd)/$NPY ;; esac
TMP=$(mktemp -d "${TMPDIR:-/tmp}/test_cli.XXXXXX") || exit 99
trap 'rm -rf "$TMP"' EXIT
cd "$TMP" || exit 99
passed=0
failed=0

bad() {
    failed=$((failed + 1))
    echo "FAIL: $*"
    sed 's/^/  | /' out err 2>/dev/null | head -40
}

# run_status DESC STATUS CMD...: CMD must exit with STATUS (its output lands in ./out and ./err).
run_status() {
    desc=$1
    want=$2
    shift 2
    "$@" >out 2>err
    got=$?
    if [ "$got" -eq "$want" ]; then
        passed=$((passed + 1))
    else
        bad "$desc: exit $got, expected $want: $*"
    fi
}

run_ok() {
    desc=$1
    shift
    run_status "$desc" 0 "$@"
}

# has DESC FILE TEXT...: FILE (out or err) contains every TEXT.
has() {
    desc=$1
    file=$2
    shift 2
    for text in "$@"; do
        if ! grep -qF -- "$text" "$file"; then
            bad "$desc: $file lacks \"$text\""
            return
        fi
    done
    passed=$((passed + 1))
}

# refused DESC TEXT... -- CMD...: CMD exits with status 2, prints nothing to stdout and every TEXT to
# stderr (TEXT usually includes the file name).
refused() {
    desc=$1
    shift
    : >words
    while [ "$1" != "--" ]; do
        printf '%s\n' "$1" >>words
        shift
    done
    shift
    "$@" >out 2>err
    got=$?
    if [ "$got" -ne 2 ]; then
        bad "$desc: exit $got, expected 2: $*"
        return
    fi
    if [ -s out ]; then
        bad "$desc: wrote to stdout: $*"
        return
    fi
    while IFS= read -r text; do
        if ! grep -qF -- "$text" err; then
            bad "$desc: stderr lacks \"$text\": $*"
            return
        fi
    done <words
    passed=$((passed + 1))
}

# cuda_refused DESC CMD...: where --backend cuda cannot run (the caller sets cuda_runs to a probe's exit
# status, 0 where it runs, and then this skips), CMD refuses it: status 2, nothing on stdout, and stderr
# names a build without CUDA or a missing device.
cuda_refused() {
    desc=$1
    shift
    if [ "$cuda_runs" -eq 0 ]; then
        echo "SKIP: $desc: a CUDA device is usable here"
        return
    fi
    "$@" >out 2>err
    got=$?
    if [ "$got" -ne 2 ] || [ -s out ]; then
        bad "$desc: exit $got (expected 2, nothing on stdout): $*"
    elif grep -qF -- "--backend cuda: this build has no CUDA backend (configure --with-cuda" err ||
        grep -qF -- "--backend cuda: no CUDA device available (" err; then
        passed=$((passed + 1))
    else
        bad "$desc: stderr names neither a build without CUDA nor a missing device: $*"
    fi
}

# raw_npy FILE HEADER NBYTES [VERSION_BYTES]: a .npy file with a hand-written header dict (plus a newline)
# and NBYTES zero data bytes; VERSION_BYTES default '\001\000' (format 1.0).
raw_npy() {
    len=$((${#2} + 1))
    # shellcheck disable=SC2059 # the formats carry the version and length bytes as octal escapes
    {
        printf '\223NUMPY'
        printf "${4:-\\001\\000}"
        printf "\\$(printf %o $((len % 256)))\\$(printf %o $((len / 256)))"
        printf '%s\n' "$2"
        if [ "$3" -gt 0 ]; then dd if=/dev/zero bs="$3" count=1 2>/dev/null; fi
    } >"$1"
}

# raw_is DESC FILE DTYPE SHAPE: FILE (written with --raw) holds DTYPE's own encoding ('<f4' f32, '<f2'
# f16, '<u2' bf16 patterns) with the shape SHAPE, e.g. "(14, 5)".
raw_is() {
    case $3 in
    f32) descr='<f4' ;;
    f16) descr='<f2' ;;
    bf16) descr='<u2' ;;
    *) descr="unknown dtype $3" ;;
    esac
    run_ok "$1: info" "$NPY" info "$2"
    has "$1" out "$descr $4"
}

# gemm_mode D PX PY TW: the flags of one routing mode of the case `test_cli_npy gen` wrote to folder D
# (PX, PY, TW: 1 for --permute-x, --permute-y, --topk-weights). Sets tag (PX PY TW), x (the input file),
# flags (mode 000 without the gather, as that needs none) and rflags (always with the gather, for
# --reduce-topk and --out-topk-weights-grad).
gemm_mode() {
    g="--m-sizes $1/m_sizes.npy --gather $1/gather.npy --topk 2"
    tag=$2$3$4
    flags="--m-sizes $1/m_sizes.npy"
    if [ "$tag" != 000 ]; then flags=$g; fi
    x=$1/x_exp.npy
    if [ "$2" = 1 ]; then flags="$flags --permute-x"; x=$1/x_tok.npy; fi
    if [ "$3" = 1 ]; then flags="$flags --permute-y"; fi
    if [ "$4" = 1 ]; then flags="$flags --topk-weights $1/tw.npy"; fi
    rflags=$g
    if [ "$tag" != 000 ]; then rflags=$flags; fi
}

# small_gemm DIR: the small grouped GEMM problem of the refusal tests, in folder DIR (created): x.npy
# (3, 2), w.npy (2, 2, 2), m.npy = [1 2] (E = 2 experts, M = 3 rows) and dy.npy (3, 2).
small_gemm() {
    mkdir -p "$1"
    "$NPY" mk "$1/x.npy" '<f4' 3,2 1 2 3 4 5 6
    "$NPY" mk "$1/w.npy" '<f4' 2,2,2 1 0 0 1 1 1 0 2
    "$NPY" mk "$1/m.npy" '<i8' 2 1 2
    "$NPY" mk "$1/dy.npy" '<f4' 3,2 1
}

# small_mlp DIR: the files of a small blockwise MLP for mlp-fwd and mlp-bwd --in DIR (created):
# T = 2 tokens, E = 2 experts, H = 2, I = 1, one block of B = 2 positions holding tokens 0 and 1 for
# expert 0.
small_mlp() {
    mkdir -p "$1"
    "$NPY" mk "$1/hidden_states.npy" '<f4' 2,2 1 -1 0.5 2
    "$NPY" mk "$1/expert_affinities_masked.npy" '<f4' 4 1 0.5
    "$NPY" mk "$1/gate_up_proj_weight.npy" '<f4' 2,2,2,1 1 -0.5 0.25 2
    "$NPY" mk "$1/down_proj_weight.npy" '<f4' 2,1,2 1 -1
    "$NPY" mk "$1/token_position_to_id.npy" '<i8' 2 0 1
    "$NPY" mk "$1/block_to_expert.npy" '<i8' 1 0
    "$NPY" mk "$1/output_hidden_states_grad.npy" '<f4' 2,2 1 2
}

finish() {
    echo "$passed passed, $failed failed"
    [ "$failed" -eq 0 ]
    exit $?
}
