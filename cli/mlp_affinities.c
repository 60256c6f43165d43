/*
 * cli/mlp_affinities.c: the shapes expert_affinities_masked.npy may have for the MLP commands, NKI's
 * padding row among them.  With --padding row, NKI's test helpers give the affinities a row per token
 * of hidden_states, the padding row T included ((T + 1) x E, zero in row T); the library reads only the
 * first T*E, so such a file is accepted once its padding row is checked to be zero, and the affinity
 * gradient gets the same shape with a zero padding row.
 */
#include "cli.h"

#include <math.h>
#include <stdint.h>

int mlp_affinities_pad_row(const char *path, const npy_array *arr, int64_t T, int64_t E, int row_padding,
                           moe_dtype dtype, const char *hidden_path, const char *weight_path)
{
    const npy_header *h = &arr->h;
    const int64_t te[1] = {T * E}, t_e[2] = {T, E};
    if (shape_is(h, 1, te) || shape_is(h, 2, t_e))
        return 0;
    const int64_t t1e[1] = {(T + 1) * E}, t1_e[2] = {T + 1, E};
    if (!row_padding || !(shape_is(h, 1, t1e) || shape_is(h, 2, t1_e))) {
        if (row_padding)
            die("%s: expected expert_affinities_masked of shape (%lld,), (%lld, 1) or (%lld, %lld) (T*E with T = %lld "
                "tokens from %s less the padding row, E = %lld from %s), or with NKI's padding row (%lld,), (%lld, 1) "
                "or (%lld, %lld), found %s %s",
                path, (long long)te[0], (long long)te[0], (long long)T, (long long)E, (long long)T, hidden_path,
                (long long)E, weight_path, (long long)t1e[0], (long long)t1e[0], (long long)(T + 1), (long long)E,
                shape_text(h), npy_type_name(h->type));
        die("%s: expected expert_affinities_masked of shape (%lld,), (%lld, 1) or (%lld, %lld) (T*E with T = %lld tokens "
            "from %s, E = %lld from %s), found %s %s",
            path, (long long)te[0], (long long)te[0], (long long)T, (long long)E, (long long)T, hidden_path,
            (long long)E, weight_path, shape_text(h), npy_type_name(h->type));
    }
    for (int64_t e = 0; e < E; e++) {
        const double v = npy_get(arr, T * E + e, dtype);
        if (v != 0.0 || isnan(v))
            die("%s: the padding row (token %lld, with --padding row) of expert_affinities_masked must be 0, but "
                "element [%lld, %lld] (flat index %lld) is %g",
                path, (long long)T, (long long)T, (long long)e, (long long)(T * E + e), v);
    }
    return 1;
}
