/* Every backend table built into this libmoe fills every row of moe_dispatch (backend/moe_backend.h), so
 * that an op added to the table but missed by a backend fails here rather than at a user's call. */
#include "check.h"
#include "moe_backend.h"

#include <stdio.h>

/* The rows as an array of (name, filled) pairs; a new row of moe_dispatch is added here too. */
static void check_table(const moe_dispatch *t)
{
    const struct { const char *row; int filled; } rows[] = {
        {"available", t->available != NULL},
        {"gemm_fwd", t->gemm_fwd != NULL},
        {"gemm_dx", t->gemm_dx != NULL},
        {"gemm_dw", t->gemm_dw != NULL},
        {"gemm_topk_weights_grad", t->gemm_topk_weights_grad != NULL},
        {"mlp_fwd", t->mlp_fwd != NULL},
        {"mlp_bwd", t->mlp_bwd != NULL},
        {"routing_build", t->routing_build != NULL},
        {"mlp_layout_build", t->mlp_layout_build != NULL},
    };
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++)
        CHECK(rows[r].filled, "backend %s: row %s is NULL", t->name, rows[r].row);
    /* a backend whose rows return before the work is done must say how to wait for it */
    CHECK(t->validates_routing_on_host || t->synchronize != NULL, "backend %s: no synchronize row", t->name);
}

int main(void)
{
    const moe_dispatch *ref = moe_dispatch_for(MOE_BACKEND_REF);
    CHECK(ref != NULL, "no reference table");
    if (ref != NULL)
        check_table(ref);
    const moe_dispatch *cuda = moe_dispatch_for(MOE_BACKEND_CUDA);
    if (cuda != NULL) /* built in (whether or not a device is present) */
        check_table(cuda);
    printf("# backend tables: ref%s\n", cuda != NULL ? ", cuda" : "");
    printf("%ld checks, %ld failures\n", checks, failures);
    return failures ? 1 : 0;
}
