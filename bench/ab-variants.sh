# Sourced by bench/device-ab.sh and bench/device-ab-mlp.sh: their NAME=TARBALL[:NVCCFLAGS] arguments.
# ab_build_variants BUILD SPEC...: checks every SPEC (NAME of letters, digits and '_'; TARBALL an existing file;
# NVCCFLAGS optional), then runs `BUILD NAME TARBALL NVCCFLAGS` for each in the background and waits for them
# all.  Sets the array `names` (the NAMEs in order).  Exits 2 on a bad SPEC, before any build starts.
ab_build_variants() {
  local build=$1 spec name rest tarball flags i
  shift
  local -a tarballs=() flag_list=()
  names=()
  for spec in "$@"; do
    name=${spec%%=*}; rest=${spec#*=}; tarball=${rest%%:*}; flags=""
    [ "$rest" != "$tarball" ] && flags=${rest#*:}
    case "$name" in *[!A-Za-z0-9_]*|"") echo "bad variant name '$name'" >&2; exit 2;; esac
    [ -f "$tarball" ] || { echo "no tarball $tarball" >&2; exit 2; }
    names+=("$name"); tarballs+=("$tarball"); flag_list+=("$flags")
  done
  for i in "${!names[@]}"; do
    "$build" "${names[$i]}" "${tarballs[$i]}" "${flag_list[$i]}" &
  done
  wait
}
