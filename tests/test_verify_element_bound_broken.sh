#!/bin/sh
# make check: the elements' error bounds one rounding too tight must make their proofs fail.  Plants (tests/
# verify_lib.sh's verify_bound_broken), in ref/gemm_naive_internal.h, gamma_k(K - 1) for gamma_k(K) in
# gemm_naive_fwd_element's `bound_fwd` and within_dot_bound at K - 1 for K in its `bound_fwd_weighted`, the
# same at N - 1 in gemm_naive_dx_element's `bound_dx` and `bound_dx_weighted`, and at the expert's row count
# less one in gemm_naive_dw_element's `bound_dw`: all five false (one rounded product is not within 4 eta of
# the exact one; with a weight, two roundings are not within u |y| + eta of it); expects exactly those five
# ensures clauses unproved: the elements' bound hypotheses are not contradictory and the imported axioms
# (specs/float_bounds.mlw's FdotStepStatement, WeightStepStatement) do not make WP's model inconsistent.
# Skipped (exit 77) without Frama-C.
. "$srcdir/tests/verify_lib.sh"
verify_require test_verify_element_bound_broken
set -eu
verify_bound_broken test_verify_element_bound_broken \
    'gemm_naive_fwd_element:bound_fwd:p->K' 'gemm_naive_fwd_element:bound_fwd_weighted:p->K' \
    'gemm_naive_dx_element:bound_dx:p->N' 'gemm_naive_dx_element:bound_dx_weighted:p->N' \
    'gemm_naive_dw_element:bound_dw:offsets[e + 1] - offsets[e]'
