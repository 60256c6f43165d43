# Sourced by specs/verify.sh and tests/test_float_bounds.sh: why3_add_cvc5 SRCDIR WORK registers cvc5 in the
# why3 configuration $WHY3CONFIG (after `why3 config detect`).  Why3 1.5.1, Debian's, has no detection data
# or driver for cvc5, so it is registered by hand, with the version it reports and Why3's drivers folder
# substituted into specs/cvc5.drv (written to WORK/cvc5.drv).  Fails, with a message, without cvc5.
why3_add_cvc5() {
    _cvc5=$(command -v cvc5 || true)
    _cvc5_version=$([ -z "$_cvc5" ] || "$_cvc5" --version 2> /dev/null | sed -n 's/^This is cvc5 version \([^ ]*\).*/\1/p' | head -1)
    if [ -z "$_cvc5_version" ]; then
        echo "cvc5 not found (the Debian package cvc5; ./bootstrap installs it with MOE_BOOTSTRAP_VERIFY=1)" >&2
        return 1
    fi
    sed "s|@WHY3_DRIVERS@|$("$WHY3" --print-datadir)/drivers|" "$1/specs/cvc5.drv" > "$2/cvc5.drv"
    cat >> "$WHY3CONFIG" << EOF2

[prover]
command = "$_cvc5 --stats --tlimit-per=%t000 --lang=smt2 %f"
command_steps = "$_cvc5 --stats --rlimit=%S --lang=smt2 %f"
driver = "$(cd "$2" && pwd)/cvc5.drv"
editor = ""
in_place = false
interactive = false
name = "CVC5"
shortcut = "cvc5"
version = "$_cvc5_version"
EOF2
    cvc5_version=$_cvc5_version
}
