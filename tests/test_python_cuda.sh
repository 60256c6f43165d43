#!/bin/sh
# tests/test_python.sh on CUDA tensors (exit 77 without a CUDA device or a CUDA build of libmoe).
LIBMOE_TEST_DEVICE=cuda exec sh "$(dirname "$0")/test_python.sh"
