#!/bin/sh
# make check: a dot product's error bound one rounding too tight must make its proof fail.  Plants (tests/
# verify_lib.sh's verify_bound_broken) gamma_k(K - 1) for gamma_k(K) in gemm_naive_fwd_dot's `bound_fwd_dot`,
# gamma_k(N - 1) for gamma_k(N) in gemm_naive_dx_dot's `bound_dx_dot` and gamma_k(m_e - 1) for gamma_k(m_e)
# (m_e = offsets[e + 1] - offsets[e], expert e's rows) in gemm_naive_dw_dot's `bound_dw_dot`
# (ref/gemm_naive_internal.h), all false (one rounded product is not within 4 eta of the exact one), and
# expects exactly those three ensures clauses unproved: the hypotheses (fdot_strided_bound_premise,
# fdw_bound_premise, specs/gemm_value.acsl) are not contradictory, and the imported step axiom
# (specs/float_bounds.mlw's FdotStepStatement) does not make WP's model inconsistent.  Skipped (exit 77)
# without Frama-C.
. "$srcdir/tests/verify_lib.sh"
verify_require test_verify_bound_broken
set -eu
verify_bound_broken test_verify_bound_broken \
    'gemm_naive_fwd_dot:bound_fwd_dot:p->K' 'gemm_naive_dx_dot:bound_dx_dot:p->N' \
    'gemm_naive_dw_dot:bound_dw_dot:offsets[e + 1] - offsets[e]'
