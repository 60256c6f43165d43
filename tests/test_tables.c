/* The tables that make one definition per concept: every backend table built into this libmoe fills every
 * row of moe_dispatch (backend/moe_backend.h), so that an op added to the table but missed by a backend
 * fails here rather than at a user's call; the activation table (backend/moe_activations.h) names every
 * value below MOE_MLP_ACTIVATION_COUNT, and its names and values map both ways. */
#include "check.h"
#include "moe_activations.h"
#include "moe_backend.h"

#include <stdio.h>
#include <string.h>

/* moe_mlp_activation_choices: the list of names, exactly; a buffer one byte short or NULL refused with the buffer
 * unchanged; every name in the list. */
static void check_activation_choices(void)
{
    static const char want[] = "silu, gelu, gelu_tanh or swish";
    char text[64];
    CHECK(moe_mlp_activation_choices(text, sizeof text) == MOE_OK && strcmp(text, want) == 0, "choices: %s", text);
    for (int a = 0; a < MOE_MLP_ACTIVATION_COUNT; a++) {
        const char *name = moe_mlp_activation_name((moe_mlp_activation)a);
        CHECK(name != NULL && strstr(text, name) != NULL, "activation %d not in the choices %s", a, text);
    }
    memset(text, 'x', sizeof text);
    CHECK(moe_mlp_activation_choices(text, sizeof want) == MOE_OK && strcmp(text, want) == 0,
          "choices in a buffer of exactly their size: %.*s", (int)sizeof want, text);
    memset(text, 'x', sizeof text);
    CHECK(moe_mlp_activation_choices(text, sizeof want - 1) == MOE_ERR_INVALID_SHAPE, "a short buffer accepted");
    CHECK(strstr(moe_last_error(), "moe_mlp_activation_choices: size = 30, expected at least 31") != NULL,
          "message: %s", moe_last_error());
    int untouched = 1;
    for (size_t i = 0; i < sizeof text; i++)
        untouched = untouched && text[i] == 'x';
    CHECK(untouched, "a refused call wrote into the buffer");
    CHECK(moe_mlp_activation_choices(text, 0) == MOE_ERR_INVALID_SHAPE, "size 0 accepted");
    CHECK(moe_mlp_activation_choices(NULL, sizeof text) == MOE_ERR_NULL_POINTER, "NULL text accepted");
    CHECK(strstr(moe_last_error(), "moe_mlp_activation_choices: text is NULL") != NULL, "message: %s", moe_last_error());
}

static void check_activations(void)
{
    for (int a = 0; a < MOE_MLP_ACTIVATION_COUNT; a++) {
        const char *name = moe_mlp_activation_name((moe_mlp_activation)a);
        CHECK(name != NULL, "activation %d has no name", a);
        if (name == NULL)
            continue;
        moe_mlp_activation back = (moe_mlp_activation)-1;
        CHECK(moe_mlp_activation_from_name(name, &back) == MOE_OK && back == (moe_mlp_activation)a,
              "activation %s does not map back to %d", name, a);
    }
    CHECK(moe_mlp_activation_name((moe_mlp_activation)MOE_MLP_ACTIVATION_COUNT) == NULL,
          "a name for the value past the last activation");
    CHECK(moe_mlp_activation_name((moe_mlp_activation)-1) == NULL, "a name for activation -1");
    moe_mlp_activation kept = MOE_ACT_GELU;
    CHECK(moe_mlp_activation_from_name("relu", &kept) == MOE_ERR_INVALID_OPTION && kept == MOE_ACT_GELU,
          "relu accepted or the output changed");
    CHECK(strstr(moe_last_error(), "\"relu\" is not an activation, expected silu, gelu, gelu_tanh or swish") != NULL,
          "message: %s", moe_last_error());
    CHECK(moe_mlp_activation_from_name(NULL, &kept) == MOE_ERR_INVALID_OPTION && kept == MOE_ACT_GELU,
          "NULL name accepted");
    CHECK(moe_mlp_activation_from_name("silu", NULL) == MOE_ERR_NULL_POINTER, "NULL output accepted");
    check_activation_choices();
    /* the table's functions at one point each: the rows are wired to their own functions */
    CHECK(moe_act_value(MOE_ACT_SILU, 1.0f) == moe_act_silu(1.0f) && moe_act_value(MOE_ACT_SWISH, 1.0f) ==
          moe_act_swish(1.0f) && moe_act_derivative(MOE_ACT_GELU, 0.5f) == moe_act_gelu_grad(0.5f) &&
          moe_act_derivative(MOE_ACT_GELU_TANH, 0.5f) == moe_act_gelu_tanh_grad(0.5f), "rows miswired");
    CHECK(moe_act_value((moe_mlp_activation)MOE_MLP_ACTIVATION_COUNT, 3.0f) == 3.0f &&
          moe_act_derivative((moe_mlp_activation)MOE_MLP_ACTIVATION_COUNT, 3.0f) == 1.0f, "no identity past the table");
}

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
        {"gemm_fp8_fwd", t->gemm_fp8_fwd != NULL},
        {"gemm_fp8_dx", t->gemm_fp8_dx != NULL},
        {"gemm_fp8_dw", t->gemm_fp8_dw != NULL},
        {"fp8_quantize_columns", t->fp8_quantize_columns != NULL},
        {"fp8_quantize", t->fp8_quantize != NULL},
        {"fp8_dequantize", t->fp8_dequantize != NULL},
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
    check_activations();
    printf("%ld checks, %ld failures\n", checks, failures);
    return failures ? 1 : 0;
}
