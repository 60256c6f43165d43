#!/bin/sh
# The Python package (python/libmoe) on the library just built: python/tests/test_libmoe.py on CPU tensors
# (LIBMOE_TEST_DEVICE=cuda: on CUDA tensors, tests/test_python_cuda.sh).  Runs with the first Python that
# imports torch among $MOE_PYTHON, $PYTHON (configure's), python3 and /usr/bin/python3 (Debian's
# python3-torch); exit 77 (skip) when none does, when CUDA is asked for and cannot run, or when libmoe.so
# is built with AddressSanitizer (Python itself is not: loading the library would need the ASan runtime
# preloaded into the interpreter and torch, which this test does not do; the C tests cover that build).
# Run from the build folder: sh SRCDIR/tests/test_python.sh
srcdir=$(cd "$(dirname "$0")/.." && pwd)
builddir=$(pwd)
device=${LIBMOE_TEST_DEVICE:-cpu}
lib="$builddir/.libs/libmoe.so"
[ -f "$lib" ] || { echo "FAIL: $lib not built"; exit 1; }

if command -v ldd >/dev/null 2>&1 && ldd "$lib" | grep -Eq 'lib(asan|ubsan)'; then
    echo "SKIP: $lib is built with -fsanitize (ASan/UBSan build): the Python tests run in the other builds"
    exit 77
fi

if ! python=$(sh "$srcdir/tests/torch_python.sh"); then
    echo "SKIP: no python3 here imports torch (Debian: apt-get install python3-torch python3-numpy)"
    exit 77
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
    "$python" -m unittest -v test_libmoe
