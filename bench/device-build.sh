# Sourced by the bench/device-*.sh scripts (bash): unpacks the `make dist` tarball $tarball into a fresh folder,
# builds it for sm_90a and sm_80 with the extra make targets $build_targets, logging under $out, and leaves
# the shell in the build folder with the library on LD_LIBRARY_PATH.  The GPU machine has no libtool: the
# tarball carries the generated configure and libtool scripts.
mkdir -p "$out"
work=$(mktemp -d)
tar -C "$work" -xzf "$tarball"
cd "$work"/libmoe-*
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/device.txt"
./configure --with-cuda=yes --with-cuda-arch="90a;80" --enable-werror > "$out/configure.log" 2>&1 ||
  { tail -30 "$out/configure.log"; exit 1; }
make -j16 > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
# shellcheck disable=SC2086
make -j16 $build_targets >> "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
export LD_LIBRARY_PATH="$PWD/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
