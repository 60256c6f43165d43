/*
 * cli/cmd_route.c: the route command: the routing arrays the gemm commands read and the blockwise layout
 * the mlp commands read, from the router's top-k choices.
 */
#include "cli.h"

#include <stdint.h>
#include <stdio.h>
#include <stddef.h>

static const opt route_opts[] = {
    {"--topk-ids", "IDS.npy", "the router's choices, shape (T, k) (or (T,) for k = 1), int32 or int64, values in [0, E)."},
    {"--experts", "E", "the number of experts E >= 1."},
    {"--out", "DIR",
     "folder to write m_sizes.npy (E,), gather_indices.npy (M,) and scatter_indices.npy (M,) into, all "
     "int64; created if missing. gather_indices is the stable sort of the flattened ids by expert; "
     "scatter_indices its inverse."},
    {"--block-size", "B",
     "also write the blockwise layout of the MoE MLP (moe_mlp_layout_build) with blocks of B >= 1 "
     "positions: token_position_to_id.npy (N*B,) and block_to_expert.npy (N,), int64, the files "
     "`moe mlp-fwd` and `moe mlp-bwd` read. Blocks are ordered by expert, tokens ascend within an "
     "expert. Dropless (the default): ceil(m_e / B) blocks per expert, none for an expert without "
     "tokens; the last block of an expert is padded at the tail. Prints N."},
    {"--dropping", NULL,
     "dropping layout instead: exactly one block of capacity B per expert (N = E); an expert keeps its "
     "first B tokens in ascending order and drops the others. Prints the number of dropped (token, "
     "expert) pairs. B is --block-size, default 128."},
    {"--padding", "skip|row",
     "how an empty position of token_position_to_id is marked: skip (default) -1, row T (the MLP's "
     "token tensors then have T + 1 rows). Needs --block-size or --dropping."},
    {"--topk-weights", "TW.npy",
     "the router's weights, shape (T, k) (or (T*k,)), floating: also write expert_affinities_masked.npy "
     "(T*E,), A[t*E + e] = the weight of every (token, expert) pair the layout holds, 0 for every other "
     "pair (dropped pairs included), float32 unless --raw; and router_topk_ids.npy (T, k) int64, the ids "
     "in the router's order, from which mlp-bwd also writes the weights' gradient as (T, k) "
     "(topk_weights_grad.npy). Needs --block-size or --dropping."},
    OPT_DTYPE,
    OPT_RAW,
    {NULL, NULL, NULL},
};

static int run_route(const args *a);

const command route_command = {
    "route",
    "--topk-ids IDS.npy --experts E [--block-size B] [--dropping] [--padding skip|row] "
    "[--topk-weights TW.npy [--dtype ...] [--raw]] --out DIR",
    "routing arrays and MLP block layouts from the router's top-k choices",
    "Writes the routing the gemm commands read (moe_routing_from_topk: --m-sizes DIR/m_sizes.npy "
    "--gather DIR/gather_indices.npy --topk k). With --block-size or --dropping also the blockwise layout "
    "the mlp commands read (moe_mlp_layout_build: token_position_to_id.npy, block_to_expert.npy, and "
    "with --topk-weights expert_affinities_masked.npy) and moe-options.txt (the layout's options, which "
    "mlp-fwd and mlp-bwd take as their defaults: cli/README.md), and prints the number of blocks N and, for "
    "--dropping, the number of dropped (token, expert) pairs.",
    route_opts, 0, run_route,
    "# the routing of a step's top-2 choices among 4 experts, step/topk_ids.npy (T, 2)\n"
    "moe route --topk-ids step/topk_ids.npy --experts 4 --out routing",
};

static int run_route(const args *a)
{
    const char *ids_path = need(a, "--topk-ids"), *dir = need(a, "--out");
    const int64_t E = parse_int_arg("--experts", need(a, "--experts"), 1);
    const int blockwise = get(a, "--block-size") != NULL || get(a, "--dropping") != NULL;
    const char *tw_path = get(a, "--topk-weights");
    if (!blockwise) {
        static const char *const layout_only[] = {"--padding", "--topk-weights", "--dtype", "--raw"};
        for (size_t i = 0; i < sizeof layout_only / sizeof layout_only[0]; i++)
            if (get(a, layout_only[i]) != NULL)
                die("%s belongs to the blockwise layout: give --block-size B (or --dropping) too", layout_only[i]);
    } else if (tw_path == NULL && (get(a, "--dtype") != NULL || get(a, "--raw") != NULL)) {
        die("%s is for expert_affinities_masked.npy: give --topk-weights TW.npy too",
            get(a, "--dtype") != NULL ? "--dtype" : "--raw");
    }
    moe_mlp_options mo = {0};
    mo.block_size = parse_block_size(a);
    mo.padding = parse_padding(a);
    const moe_mlp_layout_kind kind = get(a, "--dropping") != NULL ? MOE_MLP_DROPPING : MOE_MLP_DROPLESS;
    /* the routing; with the blockwise layout two files more, and the affinities with --topk-weights */
    static const char *const names[] = {"m_sizes.npy",         "gather_indices.npy",
                                        "scatter_indices.npy", "token_position_to_id.npy",
                                        "block_to_expert.npy", "expert_affinities_masked.npy",
                                        "router_topk_ids.npy"};
    char *p[7], *opts_file = NULL;
    add_outputs_in(dir, names, blockwise ? 5 + 2 * (tw_path != NULL) : 3, p);
    if (blockwise)
        add_outputs_in(dir, (const char *const[]){RUN_OPTIONS_FILE}, 1, &opts_file);
    claim_files(a, (const char *const[]){NULL}, (const char *const[]){"--topk-ids", "--topk-weights", NULL});

    npy_array ids;
    load(ids_path, &ids);
    if (ids.h.ndim != 1 && ids.h.ndim != 2)
        die("%s: expected topk ids of shape (T, k) or (T,), found %s %s", ids_path, shape_text(&ids.h),
            npy_type_name(ids.h.type));
    const int64_t T = ids.h.shape[0], k = ids.h.ndim == 2 ? ids.h.shape[1] : 1;
    if (k < 1 && T > 0)
        die("%s: expected topk ids of shape (T, k) with k >= 1, found %s %s", ids_path, shape_text(&ids.h),
            npy_type_name(ids.h.type));
    int64_t *topk_ids = convert_int(ids_path, &ids);
    const int64_t M = T * k;
    int64_t *m_sizes = xmalloc((size_t)E, sizeof(int64_t));
    int64_t *gather = xmalloc((size_t)M, sizeof(int64_t)), *scatter = xmalloc((size_t)M, sizeof(int64_t));
    moe_status st = moe_routing_from_topk(T, k, E, topk_ids, m_sizes, gather, scatter);
    if (st != MOE_OK)
        die("%s: %s (--experts %lld)", ids_path, moe_last_error(), (long long)E);

    /* the blockwise layout: everything is checked and built before the first file is written */
    npy_array tw = {0};
    void *twd = NULL, *aff = NULL;
    int64_t N = 0, dropped = 0, *b2e = NULL, *tpti = NULL;
    if (blockwise) {
        if (tw_path != NULL) {
            load(tw_path, &tw);
            const npy_array *arrays[] = {&tw};
            const char *paths[] = {tw_path};
            mo.dtype = choose_dtype(a, arrays, paths, 1);
            check_floating(tw_path, &tw);
            const int64_t flat[1] = {M}, tk[2] = {T, k};
            if (!shape_is(&tw.h, 1, flat) && !shape_is(&tw.h, 2, tk))
                die("%s: expected topk weights of shape (%lld, %lld) or (%lld,) (those of %s), found %s %s", tw_path,
                    (long long)T, (long long)k, (long long)M, ids_path, shape_text(&tw.h), npy_type_name(tw.h.type));
            twd = convert(tw_path, &tw, mo.dtype);
            aff = xmalloc(elements(T, E, 1), moe_dtype_size(mo.dtype));
        }
        st = moe_mlp_layout_num_blocks(kind, T, k, E, topk_ids, &mo, &N);
        if (st != MOE_OK)
            die("%s: %s", ids_path, moe_last_error());
        b2e = xmalloc((size_t)N, sizeof *b2e);
        tpti = xmalloc(elements(N, mo.block_size, 1), sizeof *tpti);
        st = moe_mlp_layout_build(kind, T, k, E, topk_ids, twd, N, b2e, tpti, aff, &dropped, &mo);
        if (st != MOE_OK)
            die("%s: %s", ids_path, moe_last_error());
    }

    make_dirs(dir);
    write_array(p[0], NPY_T_I64, 1, &E, m_sizes);
    write_array(p[1], NPY_T_I64, 1, &M, gather);
    write_array(p[2], NPY_T_I64, 1, &M, scatter);
    const int64_t NB = N * mo.block_size, TE = T * E;
    if (blockwise) {
        write_array(p[3], NPY_T_I64, 1, &NB, tpti);
        write_array(p[4], NPY_T_I64, 1, &N, b2e);
        if (aff != NULL) {
            write_result(a, p[5], mo.dtype, aff, 1, &TE);
            const int64_t tk[2] = {T, k}; /* the router's order, for mlp-bwd's topk_weights_grad.npy */
            write_array(p[6], NPY_T_I64, 2, tk, topk_ids);
        }
        /* the layout's options, which mlp-fwd and mlp-bwd take as their defaults */
        run_options r = {0};
        run_options_set(&r, "block_size", "%lld", (long long)mo.block_size);
        run_options_set(&r, "padding", "%s", mo.padding == MOE_MLP_PAD_ROW ? "row" : "skip");
        run_options_set(&r, "dropping", "%d", kind == MOE_MLP_DROPPING);
        if (aff != NULL && get(a, "--dtype") != NULL) /* a dtype chosen, not one read off the weights' file */
            run_options_set(&r, "dtype", "%s", moe_dtype_name(mo.dtype));
        run_options_write(opts_file, "route", &r);
    }
    commit_outputs();
    printf("routing: T = %lld tokens, k = %lld, E = %lld experts, M = %lld rows (use --topk %lld)\n", (long long)T,
           (long long)k, (long long)E, (long long)M, (long long)k);
    if (!blockwise)
        return 0;
    int64_t empty = 0;
    for (int64_t i = 0; i < NB; i++)
        empty += tpti[i] < 0 || tpti[i] >= T;
    printf("blocks: N = %lld blocks of B = %lld positions (%s, padding %s: empty positions hold %lld), %lld of "
           "%lld positions empty (use --block-size %lld%s)\n",
           (long long)N, (long long)mo.block_size, kind == MOE_MLP_DROPPING ? "dropping" : "dropless",
           mo.padding == MOE_MLP_PAD_ROW ? "row" : "skip", mo.padding == MOE_MLP_PAD_ROW ? (long long)T : -1LL,
           (long long)empty, (long long)NB, (long long)mo.block_size,
           mo.padding == MOE_MLP_PAD_ROW ? " --padding row" : "");
    if (kind == MOE_MLP_DROPPING)
        printf("dropped: %lld (token, expert) pairs past the capacity of %lld tokens per expert\n", (long long)dropped,
               (long long)mo.block_size);
    return 0;
}
