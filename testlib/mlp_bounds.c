/* The MLP test library's analytic expectation of a case: the oracle's (oracle/oracle_mlp.h, oracle/mlp_bound.c)
 * for the case's inputs, the backward on the forward's own checkpoints; see mlp_internal.h. */
#include "mlp_internal.h"

static oracle_mlp_problem case_problem(const mt_case *c)
{
    return (oracle_mlp_problem){c->T, c->T1, c->E, c->H, c->I, c->B, c->N, c->b2e, c->ids, c->opt,
                                c->x, c->A, c->wgu, c->wd, c->bgu, c->bd, c->g, NULL, NULL};
}

/* (mlp_internal.h) */
void mt_compute_expect(const mt_case *c, const double *old_wgu, const double *old_wd, const double *old_bgu,
                       const double *old_bd, int down_ckpt_in_bwd, int exact_rounding, int split_backend,
                       expect *X)
{
    const oracle_mlp_problem p = case_problem(c);
    oracle_mlp_expect_compute(&p, old_wgu, old_wd, old_bgu, old_bd, down_ckpt_in_bwd, exact_rounding, split_backend, X);
}

double mt_expect_rnd_peak(const mt_case *c)
{
    expect X;
    mt_compute_expect(c, NULL, NULL, NULL, NULL, 1, 0, 0, &X);
    const double peak = X.rnd_peak;
    mt_expect_free(&X);
    return peak;
}
