/*
 * ref/mlp/workspace.c: the workspaces of the blockwise MoE MLP reference: how many threads a call uses,
 * the per-thread float32 arenas and the pieces carved from them, and the allocation of the per-slot
 * scratch.  mlp_threads_for, mlp_carve and mlp_max3 are proved; the allocations are not (WP 25 has no
 * model of malloc).
 */
#include "mlp_internal.h"

/* team_size, team_member, copy_floats: ref/ref_threads.h. */

/* (contracts on the prototypes in mlp_internal.h) */
int mlp_threads_for(int64_t slots, int64_t H, int64_t I)
{
    const double work = (double)slots * (double)(H + 1) * (double)(I + 1) * 3.0;
    return work < 262144.0 ? 1 : team_size();
}

int mlp_arena_alloc(arena *a, int threads, size_t floats_per_thread)
{
    a->base = NULL;
    if (floats_per_thread > SIZE_MAX / sizeof(float) - 32)
        return 0;
    /* round up to a cache line so that threads never share one */
    a->per_thread = (floats_per_thread + 15) / 16 * 16 + 16;
    if (a->per_thread > SIZE_MAX / sizeof(float) / (size_t)threads)
        return 0;
    a->base = malloc((size_t)threads * a->per_thread * sizeof(float));
    return a->base != NULL;
}

float *mlp_carve(float **cursor, int64_t count)
{
    float *piece = *cursor;
    *cursor += (count + 15) / 16 * 16;
    return piece;
}

float *mlp_alloc_floats(int64_t a, int64_t b)
{
    if ((double)a * (double)b > 0x1p60)
        return NULL;
    return malloc(((size_t)a * (size_t)b + 1) * sizeof(float));
}

int64_t mlp_max3(int64_t a, int64_t b, int64_t c)
{
    int64_t m = a > b ? a : b;
    return m > c ? m : c;
}
