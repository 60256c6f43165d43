#!/bin/sh
# The Python package (python/libmoe) on the library just built: python/tests/test_libmoe.py, test_fp8.py and
# test_fp8_train.py on CPU tensors
# (LIBMOE_TEST_DEVICE=cuda: on CUDA tensors, tests/test_python_cuda.sh).  Runs with the first Python that
# imports torch (tests/torch_python.sh); exit 77 (skip) when none does, or when CUDA is asked for and cannot run.  In a build
# under -fsanitize=address,undefined the sanitizer runtimes are preloaded into the interpreter.
# Run from the build folder: sh SRCDIR/tests/test_python.sh
srcdir=$(cd "$(dirname "$0")/.." && pwd)
builddir=$(pwd)
device=${LIBMOE_TEST_DEVICE:-cpu}
lib="$builddir/.libs/libmoe.so"
[ -f "$lib" ] || { echo "FAIL: $lib not built"; exit 1; }


if ! python=$(sh "$srcdir/tests/torch_python.sh"); then
    echo "SKIP: no python3 here imports torch (Debian: apt-get install python3-torch python3-numpy)"
    exit 77
fi
# A sanitizer build of libmoe needs its runtimes loaded first: preload the ones the library links (leak
# detection off: the interpreter keeps allocations until exit by design; every other check stays on).
sanitizers=$(ldd "$lib" 2>/dev/null | awk '/lib(asan|ubsan)\.so/ {print $3}' | tr '\n' ' ')
if [ -n "$sanitizers" ]; then
    echo "sanitizer build: preloading $sanitizers(ASAN_OPTIONS detect_leaks=0)"
    LD_PRELOAD="$sanitizers${LD_PRELOAD:-}"
    ASAN_OPTIONS="detect_leaks=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
    export LD_PRELOAD ASAN_OPTIONS
fi
echo "python: $python ($("$python" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)'))"

if [ "$device" = cuda ]; then
    if ! LIBMOE_PATH="$lib" PYTHONPATH="$srcdir/python" "$python" -c \
        "import sys, torch, libmoe; sys.exit(0 if torch.cuda.is_available() and libmoe.cuda_available() else 1)"; then
        echo "SKIP: no CUDA here (torch.cuda.is_available() and a libmoe built with CUDA are both needed)"
        exit 77
    fi
fi

LIBMOE_PATH="$lib" LIBMOE_TEST_DEVICE="$device" LIBMOE_ABI_PROGRAM="$builddir/tests/python_abi" \
    PYTHONPATH="$srcdir/python:$srcdir/python/tests" PYTHONDONTWRITEBYTECODE=1 \
    "$python" -m unittest -v test_libmoe test_fp8 test_fp8_train
