#!/bin/sh
# Proves the ACSL contracts of the reference with Frama-C/WP (issue 5) and writes a per-function summary.
#
#   specs/verify.sh SRCDIR WORKDIR [SUMMARY]
#
#   SRCDIR   the source tree (its ref/, src/, include/, specs/ are read)
#   WORKDIR  a writable folder for the why3 configuration, the WP session/cache and the logs
#   SUMMARY  where the Markdown summary goes (default WORKDIR/VERIFY-SUMMARY.md)
#
#   specs/verify.sh --targets   prints the proved functions, one FILE:FCT1,FCT2,... line per file
#
# Besides the summary, the run writes beside it PROOF-TABLE.md (each function's class: value, bound or
# safety proved, or stated only) and TRUSTED.md (every contract the proofs trust without proof), both by
# specs/proof_reports.py, and keeps in WORKDIR what `make verify-cold` compares (specs/verify_cold.py):
# goals-unique.txt (FILE FUNCTION GOAL STATUS), smoke-unique.txt (FILE FUNCTION GOAL STATUS LOCATION) and
# digests.txt (FILE GOAL PROVER DIGEST: the digest that keys each prover's result in WP's cache, the MD5 of
# the goal file WP sends to that prover).
#
# Environment: FRAMAC, WHY3 (the programs; default: found on PATH); VERIFY_ONLY=fct1,fct2 restricts the
# run to those functions (the broken-bound test uses it); VERIFY_JOBS (default 2) files are proved at a
# time, each by its own frama-c (most of the time goes to WP's goal generation, which is sequential);
# VERIFY_CACHE (default SRCDIR/specs/wp-cache.txt) the prover results to start from, or `none` to run the
# provers on every goal (see "The cache" below); VERIFY_SMOKE=1 adds WP's smoke tests (below; not by
# default: each smoke goal is expected to stay unproved, so it costs every prover its smoke timeout, about
# 4 s of the 2-core machine per smoke goal, and a full run has thousands of them: hours before the cache
# holds their results), VERIFY_SMOKE_TIMEOUT their timeout (default 2, WP's); VERIFY_PROVERS replaces the
# prover list z3,cvc4,cvc5 (for measurements: goals proved by a prover left out of it fail).
# Exit status 0 only when every goal is proved (and, with VERIFY_SMOKE=1, every smoke test passes).
#
# The cache.  WP's cache (-wp-cache) keys each prover result by a digest of the goal exactly as it is sent
# to the prover (the Why3 task after WP's simplifications), the prover and its version: a result is reused
# only for the identical goal, and a goal that changed in any way (a contract, a loop, a lemma it uses)
# has a new digest and goes to the provers.  specs/wp-cache.txt holds the results of the last full run
# (one line per entry: digest, then WP's JSON record); each file's session starts from it, and a full run
# (no VERIFY_ONLY) writes WORKDIR/wp-cache.txt with exactly the entries its goals used (-wp-cache cleanup),
# to be copied over specs/wp-cache.txt when contracts change.  The summary says how many goals were
# proved by a prover in this run and how many replayed a cached result.  With VERIFY_CACHE=none every
# goal is proved afresh (about 1.6 times as long; WP's goal generation is the rest).
#
# Pinned flags (specs/README.md explains each):
#   -wp -wp-rte                 prove the contracts and the run-time-error assertions RTE inserts
#   -wp-model Typed+int         typed memory model, machine integers (WP's default, pinned): every C integer
#                               lies in its type's range, and -wp-rte asserts (WP proves) that no signed
#                               operation overflows.  (+nat drops the range facts: overflow goals fail.)
#   -warn-special-float none    Inf and NaN are legitimate float values of these kernels, not errors
#   -wp-prover z3,cvc4,cvc5     Alt-Ergo is not packaged on Debian; the three SMT solvers are.  Why3 1.5.1
#                               predates cvc5: verify.sh registers it in its why3 configuration with
#                               specs/cvc5.drv (Why3's CVC4 driver with cvc5's logic and step count)
#   -wp-timeout 60 -wp-par 2    per goal (wall clock; the slowest goal takes ~5 s on a 2-core machine at load 2,
#                               and at load 6-8 three goals of 4-5 s timed out at 20 s: a goal that is
#                               proved costs its own time whatever the limit, so the limit is only room
#                               for a loaded machine); each frama-c runs two provers at a time (CI runners
#                               have 2 cores)
#   -wp-frama-c-stdlib-terminate  trust that the functions of Frama-C's libc without a terminates clause
#                               (expf, called by the activations of ref/mlp/activations.h) terminate
#   -wp-driver specs/gemm_value.driver  binds specs/gemm_value.acsl's f32_add / f32_mul to WP's own model of
#                               C's float + and *, and imports specs/float_bounds.mlw's FdotStepStatement (the
#                               dot product's bound step, proved by tests/test_float_bounds.sh) for its
#                               f32_dot_bound / f32_dot_step (specs/README.md, "Values and bounds proved"); only for the files
#                               that define MOE_REF_VALUES (ref/gemm_naive_value.c, ref/gemm_naive_dot.c), whose goals'
#                               model it renames; and WeightStepStatement (the forward element's weighted bound,
#                               f32_weight_step), proved by the same test
#   -rte-no-pointer-call        no RTE assertion \valid_function(f) at a call through a pointer: WP 25 does not
#                               implement \valid_function; such a call carries an ACSL `calls` annotation
#                               instead, whose goal proves the pointer equal to a listed function
#                               (ref/gemm/tiles.c's micro-kernel call: gemm_kernel_scalar)
#   -wp-smoke-tests             (VERIFY_SMOKE=1) WP's smoke tests: for each function, a goal `false` under its preconditions
#                               (contradictory requires), at each statement (unreachable code), in each
#                               loop (inconsistent invariants) and after each call (a callee that never
#                               returns).  A smoke goal that a prover proves is a failure of the run,
#                               reported with its function and source location; smoke goals are counted
#                               apart from the goals above.
#   -wp-smoke-timeout 2         (WP's default, pinned) per smoke goal: a smoke goal is expected to fail, so
#                               each costs up to this long per prover; one provable only after longer is
#                               missed (the check is best effort, as WP says)
#   -wp-cache cleanup / update  (rebuild with VERIFY_CACHE=none) the cache described above; cleanup for a
#                               full run, which drops the entries no goal used; update for VERIFY_ONLY runs
set -eu

PYTHON=${PYTHON:-python3}
wp_provers=${VERIFY_PROVERS:-z3,cvc4,cvc5}
wp_flags="-wp -wp-rte -wp-model Typed+int -warn-special-float none -wp-prover $wp_provers -wp-timeout 60 -wp-par 2"
wp_flags="$wp_flags -wp-frama-c-stdlib-terminate -rte-no-pointer-call"
smoke=${VERIFY_SMOKE:-0}
[ "$smoke" = 0 ] || wp_flags="$wp_flags -wp-smoke-tests -wp-smoke-timeout ${VERIFY_SMOKE_TIMEOUT:-2}"

# Internal: `verify.sh --one SRCDIR WORKDIR FILE:FCTS` proves one file (run in parallel by the main part).
if [ "${1:-}" = "--one" ]; then
    srcdir=$2 work=$3 target=$4
    file=${target%%:*}
    fcts=${target#*:}
    if [ -n "${VERIFY_ONLY:-}" ]; then
        keep=""
        for f in $(echo "$fcts" | tr ',' ' '); do
            case ",$VERIFY_ONLY," in *",$f,"*) keep="$keep${keep:+,}$f" ;; esac
        done
        fcts=$keep
        [ -n "$fcts" ] || exit 0
    fi
    name=$(echo "$file" | tr '/.' '__')
    log=$work/$name.log
    echo "verify: $file: $fcts"
    # shellcheck disable=SC2086
    incs="-I$srcdir/include -I$srcdir/backend -I$srcdir/src -I$srcdir/ref -I$srcdir/ref/gemm -I$srcdir/ref/mlp -I$srcdir/specs"
    rm -rf "$work/out/$name" "$work/report-$name.json"
    # the value driver only for the files that prove float values (they define MOE_REF_VALUES, ref/moe_ref.h):
    # it changes WP's model name, hence every goal's text and cache digest, in whatever file it is given to
    value_flags=""
    if grep -q '^#define MOE_REF_VALUES' "$srcdir/$file"; then value_flags="-wp-driver $srcdir/specs/gemm_value.driver"; fi
    # shellcheck disable=SC2086
    if ! "$FRAMAC" -cpp-extra-args="$incs -D_POSIX_C_SOURCE=200809L" -c11 "$srcdir/$file" -wp-fct "$fcts" $wp_flags \
        $value_flags \
        -wp-session "$work/session/$name" -wp-cache "$VERIFY_CACHE_MODE" -wp-out "$work/out/$name" \
        -wp-report-json "$work/report-$name.json" > "$log" 2>&1; then
        echo "verify: frama-c failed on $file (log: $log):" >&2
        tail -20 "$log" >&2
        exit 1
    fi
    # one line per goal: FILE FUNCTION GOAL STATUS (goal names are [typed_]<function>_<property>; WP drops
    # the trailing underscores of a name such as clamp_: its goals are typed_clamp_<property>)
    for f in $(echo "$fcts" | tr ',' ' '); do
        stem=$(echo "$f" | sed 's/_*$//')
        sed -n "s/^\[wp\] \[[^]]*\] Goal \(\(typed_\(gemm_value_\)\{0,1\}\)\{0,1\}${stem}_[A-Za-z0-9_]*\)\(.*\)$/\1 \4/p" "$log" |
            while read -r goal rest; do
                case $rest in *": Valid"*) st=proved ;; *) st=UNPROVED ;; esac
                echo "$file $f $goal $st"
            done
    done > "$work/goals-$name.txt"
    # one line per smoke goal: FILE FUNCTION GOAL passed|FAILED LOCATION.  WP prints a failed one (a goal
    # `false` that a prover proved) as `[Failed] Smoke-test GOAL`, then `FILE:LINE: Warning: Failed
    # smoke-test`.  A smoke goal is named after a function, but a dead_call one after the callee: the
    # function whose proof it belongs to comes from WP's JSON report (wp:functions, goals without typed_,
    # and without the gemm_value_ that the value driver adds to the log's names: both are listed).
    "$PYTHON" -c 'import json, sys
for fct, goals in json.load(open(sys.argv[1])).get("wp:functions", {}).items():
    for goal in goals:
        if "_wp_smoke_" in goal:
            print("typed_" + goal, fct)
            print("typed_gemm_value_" + goal, fct)' "$work/report-$name.json" > "$work/owners-$name.txt"
    # Frama-C names a source file relative to the current folder when it lies below it, else in full
    src_abs=$(cd "$srcdir" && pwd)
    src_rel=${src_abs#"$PWD"/}
    awk -v file="$file" -v prefixes="$srcdir/ $src_abs/ $src_rel/" '
        BEGIN { np = split(prefixes, prefix, " ") }
        FNR == NR { owner[$1] = $2; next }
        /^\[wp\] \[[A-Za-z]*\] Smoke-test / {
            goal = $4; last = goal
            if (!(goal in st)) { order[++n] = goal; st[goal] = ($2 == "[Passed]" ? "passed" : "FAILED") }
            next }
        /^\[wp\] .*: Warning: Failed smoke-test/ {
            if (last != "" && !(last in loc)) {
                l = $2; sub(/:$/, "", l)
                for (i = 1; i <= np; i++) if (index(l, prefix[i]) == 1) { l = substr(l, length(prefix[i]) + 1); break }
                loc[last] = l }
            next }
        /^\[wp\] / { last = "" }
        END { for (i = 1; i <= n; i++) { g = order[i]
                  print file, (g in owner ? owner[g] : "(unknown)"), g, st[g], (g in loc ? loc[g] : "-") } }' \
        "$work/owners-$name.txt" "$log" > "$work/smoke-$name.txt"
    # the digest of each goal sent to a prover (WP's cache key: the MD5 of the goal file, named
    # <goal>_Why3_<prover>.why in a folder named after the memory model)
    if [ -d "$work/out/$name" ]; then
        find "$work/out/$name" -name '*_Why3_*.why' -type f | while read -r why; do
            model=$(basename "$(dirname "$why")")
            base=$(basename "$why" .why)
            printf '%s %s_%s %s %s\n' "$file" "$model" "${base%_Why3_*}" "${base##*_Why3_}" "$(md5sum < "$why" | cut -c1-32)"
        done > "$work/digests-$name.txt"
        rm -rf "$work/out/$name"
    fi
    grep -E "^\[wp\] Proved goals:" "$log" | sed "s|^|verify: $file: (smoke tests included where run) |"
    exit 0
fi

srcdir=$1
work=${2:-}
summary=${3:-$work/VERIFY-SUMMARY.md}
FRAMAC=${FRAMAC:-frama-c}
WHY3=${WHY3:-why3}
export FRAMAC WHY3

# The functions proved, per file.  Functions of these files that are not listed (they allocate, and WP 25
# has no model of malloc/free; or they cast void * / reinterpret bits through memcpy: trusted contracts) are
# named in specs/README.md with their status and what checks them instead.  ref/routing.c, ref/gemm_naive.c
# and ref/mlp_layout.c have every function listed (their allocating shells are in ref/alloc_shells.c).
# A static inline function of a header is proved in the run of one file that includes it: moe_ref_load_row
# (ref/moe_ref.h) in src/dtype.c's, team_size and team_member (ref/ref_threads.h) in ref/gemm/setup.c's, the
# row maps of ref/gemm/gemm_internal.h in ref/gemm/tiles.c's, the activation table (backend/moe_activations.h)
# and the clamps of ref/mlp/activations.h in ref/mlp/activations.c's; the other files use the same contracts at
# their call sites.  Each file lists the ghost lemma functions (specs/*.acsl) it calls, proved in its own run.
# VERIFY_JOBS files run at a time, each next file going to the first free slot; the order balances the two
# slots, longest first (by the frama-c times of a full run; ref/gemm/tiles.c and ref/mlp/bwd.c take the longest).
targets="ref/gemm/tiles.c:lemma_mul_monotone,lemma_mul_below,lemma_div_below,lemma_row_fits,slot_of_row,x_row,y_row,topk_weight,spread_row,load_transposed_panel,pack_a_lane,pack_a_rows,pack_a_dw,pack_a,pack_w_panel,pack_b_w,b_row_first,prefetch_span,pack_b_rows,pack_b,store_tile,gemm_compute_tile,gemm_run_items
ref/mlp/bwd.c:lemma_row_fits,lemma_mul_monotone,lemma_div_below,dot_seq,store_grad,bwd_token_row,bwd_token_affinities,bwd_tokens,bwd_gather_slot,bwd_dx_scatter,bwd_m_rows,bwd_affinity_rows,bwd_gate_grads,sum_rows,bwd_recompute_d,bwd_weight_grad,bwd_weight_rows,bwd_gather,bwd_down_stage,bwd_gate_up_stage,bwd_expert,bwd_experts
ref/gemm/dx.c:lemma_mul_monotone,lemma_row_fits,lemma_reduce_out,reduce_width,reduce_tokens,set_chunk0,reduce_chunks,run_reduce_in,gemm_dx_blocked_in
ref/mlp_layout.c:lemma_count_eq_injective,lemma_count_lt_range,lemma_count_lt_split,lemma_permutation_onto,lemma_buckets_sorted,lemma_pairs_once_all,lemma_nblocks_le_msum,lemma_nblocks_monotone,lemma_nblocks_owner,lemma_mul_monotone,lemma_row_fits,lemma_rows_inside,lemma_msum_monotone_all,lemma_count_eq_bounds,lemma_msum_counts,lemma_nblocks_counts,padding_name,moe_ref_mlp_check_layout_shape,check_layout_entries,check_tokens_once,sort_blocks,check_block_pairs,check_pairs,moe_ref_mlp_check_layout_in,check_topk_row,check_topk_ids,moe_ref_mlp_check_topk_shape,moe_ref_mlp_check_topk_in,count_per_expert,dropless_blocks,moe_ref_mlp_count_blocks_in,assign_blocks_dropping,assign_blocks_dropless,lemma_runs_bounded,lemma_runs_apart,block_end,place_token,copy_weight,place_row,lemma_count_row,place_tokens,lemma_block_pair,lemma_runs_pairs,zero_affinities,element_size,moe_ref_mlp_build_layout_in
ref/gemm/setup.c:lemma_mul_monotone,lemma_blocks_monotone,lemma_ceil_blocks,team_size,team_member,gemm_team_scratch,count_blocks,gemm_setup_in,gemm_out_of_scratch,plain_items,run_plain_in
ref/mlp/slot_index.c:lemma_div_below,lemma_count_lt_grows,lemma_count_key_bounds,lemma_count_key_lt,lemma_count_key_all,lemma_buckets_cover,lemma_count_lt_all,lemma_map_keys,lemma_steps_sorted,count_tokens,number_slots,bucket_positions,bucket_sort,largest_bucket,index_by_expert,index_by_token,fill_index,build_index_in
ref/gemm_naive.c:lemma_row_fits,lemma_div_below,lemma_count_lt_split,lemma_count_eq_injective,lemma_count_lt_range,lemma_permutation_onto,lemma_inverse_converse,lemma_rows_apart,lemma_slots_apart,lemma_out_rows_through_slots_apart,lemma_out_rows_apart,lemma_topk_grad_apart,slot_of_row,x_row,y_row,gemm_fwd_row,gemm_fwd_rows,gemm_dx_per_row,gemm_dx_rows,invert_gather,gemm_dx_reduce_row,gemm_dx_reduce_rows,gemm_dw_row,gemm_dw_rows,gemm_topk_grad_row,gemm_topk_grad_rows,no_offsets,moe_ref_gemm_fwd_naive_in,moe_ref_gemm_dx_naive_in,moe_ref_gemm_dw_naive_in,moe_ref_gemm_topk_weights_grad_in
ref/gemm_naive_dot.c:lemma_row_fits,lemma_fdot_strided_bound,lemma_fdw_bound,gemm_naive_fwd_dot,gemm_naive_fwd_element,gemm_naive_dx_dot,gemm_naive_dx_element,gemm_naive_dw_dot,gemm_naive_dw_element
ref/gemm_naive_value.c:lemma_row_fits,gemm_naive_finish,gemm_naive_topk_grad_dot,gemm_naive_topk_grad_element,lemma_expert_unique,gemm_naive_dx_reduce_sum,gemm_naive_dx_reduce_element
ref/mlp/fwd.c:lemma_row_fits,lemma_mul_monotone,lemma_div_below,is_token,fwd_pad_position,fwd_pad,fwd_gate_up_row,fwd_act_row,fwd_down_row,fwd_gather,fwd_gate_up,fwd_down,fwd_expert,fwd_token_row,fwd_experts,fwd_tokens
ref/gemm/fwd_dw.c:gemm_fwd_blocked_in,gemm_dw_blocked_in
ref/gemm/topk.c:lemma_row_fits,run_topk_item,topk_items,run_topk_in,gemm_topk_blocked_in
ref/routing.c:lemma_msum_monotone,lemma_msum_monotone_all,lemma_count_eq_bounds,lemma_count_lt_split,lemma_msum_counts,check_sizes,check_permutation,moe_ref_check_routing_in,moe_ref_expert_offsets,moe_ref_expert_of_row,moe_ref_check_routing_dims,moe_ref_routing_from_topk_check,place_slots,lemma_ascending_range,lemma_buckets_permutation,moe_ref_counting_sort
ref/mlp/tiles.c:lemma_row_fits,lemma_mul_monotone,row_f32,mm_nn_tile,zero_tile,mlp_mm_nn_f32,mlp_mm_nn,mlp_mm_wn,mlp_transpose,mlp_gather_rows
src/dtype.c:moe_dtype_size,moe_dtype_name,spells,moe_dtype_from_name,moe_dtype_unit_roundoff,moe_f32_to_bf16,moe_bf16_to_f32,moe_f32_to_f16,moe_f16_to_f32,encode_fp8,decode_fp8,moe_f32_to_e4m3,moe_e4m3_to_f32,moe_f32_to_e5m2,moe_e5m2_to_f32,moe_ref_load_row
ref/mlp/activations.c:moe_act_sigmoid,moe_act_silu,moe_act_silu_grad,moe_act_gelu,moe_act_gelu_grad,moe_act_gelu_tanh,moe_act_gelu_tanh_grad,moe_act_swish,moe_act_swish_grad,moe_act_value,moe_act_derivative,clamp_,act_of,act_derivative_of,mlp_round_to,mlp_round_row
ref/gemm/kernels.c:gemm_kernel_scalar,gemm_pick_kernel
ref/gemm_fp8.c:moe_fp8_tiles,moe_fp8_dw_scale_row,moe_ref_fp8_slot_of_row
ref/mlp/workspace.c:mlp_threads_for,mlp_carve,mlp_max3
src/routing_api.c:moe_routing_validate
src/errors.c:moe_mul_ok"
# (ref/gemm/: its scalar path only; ref/gemm/gemm_internal.h defines MOE_REF_NO_VECTOR under __FRAMAC__.)
if [ "$srcdir" = --targets ]; then
    # shellcheck disable=SC2086
    printf '%s\n' $targets
    exit 0
fi
[ -n "$work" ] || { echo "usage: specs/verify.sh SRCDIR WORKDIR [SUMMARY] | --targets" >&2; exit 2; }
mkdir -p "$work/session"
cache_file=${VERIFY_CACHE:-$srcdir/specs/wp-cache.txt}
if [ "$cache_file" = none ]; then
    VERIFY_CACHE_MODE=rebuild
elif [ -n "${VERIFY_ONLY:-}" ]; then
    VERIFY_CACHE_MODE=update
else
    VERIFY_CACHE_MODE=cleanup
fi
export VERIFY_CACHE_MODE

# why3 must know the provers: detect them into a configuration of our own (never the user's ~/.why3.conf).
WHY3CONFIG=$work/why3.conf
export WHY3CONFIG
rm -f "$WHY3CONFIG" # detect keeps a configuration's [prover] sections: cvc5's (below) would appear twice
"$WHY3" config detect -C "$WHY3CONFIG" > "$work/why3-detect.log" 2>&1 || {
    cat "$work/why3-detect.log" >&2; echo "verify: why3 config detect failed" >&2; exit 1; }
for prover in Z3 CVC4; do
    grep -q "^Found prover $prover version [^ ]*, OK" "$work/why3-detect.log" || {
        cat "$work/why3-detect.log" >&2; echo "verify: why3 did not detect $prover" >&2; exit 1; }
done
# cvc5: Why3 1.5.1 has no detection data or driver for it (see the flags above); registered by hand
# (specs/why3_cvc5.sh), which sets cvc5_version.
. "$srcdir/specs/why3_cvc5.sh"
why3_add_cvc5 "$srcdir" "$work" || { echo "verify: cannot register cvc5" >&2; exit 1; }

# Seed every file's session cache from the cache file (each file's session then holds what it used).
if [ "$cache_file" != none ] && [ -f "$cache_file" ]; then
    for target in $targets; do
        name=$(echo "${target%%:*}" | tr '/.' '__')
        mkdir -p "$work/session/$name/cache"
        awk -v dir="$work/session/$name/cache" '/^[0-9a-f]+ \{/ {
            f = dir "/" $1 ".json"; line = $0; sub(/^[0-9a-f]+ /, "", line); print line > f; close(f) }' "$cache_file"
    done
    echo "verify: prover results of $(grep -c '^[0-9a-f]* {' "$cache_file") goals seeded from $cache_file"
elif [ "$cache_file" != none ]; then
    echo "verify: no cache file $cache_file: every goal goes to the provers"
fi

status=0
rm -f "$work"/goals-*.txt "$work"/owners-*.txt "$work"/smoke-*.txt "$work"/digests-*.txt "$work"/report-*.json "$work"/ref_*.log "$work"/src_*.log "$work/wp-cache.txt"
# xargs -P: not POSIX, but in GNU findutils and the BSDs
# shellcheck disable=SC2086
printf '%s\n' $targets | xargs -P "${VERIFY_JOBS:-2}" -I '{}' sh "$0" --one "$srcdir" "$work" '{}' || status=1
cat "$work"/goals-*.txt > "$work/goals.txt" 2> /dev/null || : > "$work/goals.txt"
cat "$work"/smoke-*.txt 2> /dev/null | sort -u > "$work/smoke-unique.txt" || : > "$work/smoke-unique.txt"
cat "$work"/digests-*.txt 2> /dev/null | sort -u > "$work/digests.txt" || : > "$work/digests.txt"
if [ -z "${VERIFY_ONLY:-}" ] || [ "$cache_file" = none ]; then
    # the entries this run used (a full run: for specs/wp-cache.txt; a cold run: what verify_cold.py reads)
    for f in "$work"/session/*/cache/*.json; do
        [ -f "$f" ] || continue
        printf '%s %s\n' "$(basename "$f" .json)" "$(tr -d '\n' < "$f")"
    done | sort -u -k1,1 > "$work/wp-cache.txt"
fi
# goals whose prover result came from the cache, and goals a prover ran on in this run
cached=$(cat "$work"/*.log 2> /dev/null | grep -c '^\[wp\] \[[^]]*\] Goal .*: Valid.*(cached)$' || true)

# A goal name typed_<f>_... also matches a function whose name extends f (f_more): keep the longest.  The
# key is file and goal: a ghost lemma proved in several files (lemma_row_fits) counts, and fails, per file.
sort -u "$work/goals.txt" | awk '
    { key = $1 " " $3; if (!(key in fct) || length($2) > length(fct[key])) { fct[key] = $2; st[key] = $4 } }
    END { for (k in fct) { split(k, a, " "); print a[1], fct[k], a[2], st[k] } }' | sort > "$work/goals-unique.txt"

{
    echo "# Frama-C/WP summary (generated by specs/verify.sh; do not edit)"
    echo
    echo "Tools: $("$FRAMAC" -version 2>/dev/null | head -1 | sed 's/^/Frama-C /'), $("$WHY3" --version 2>/dev/null | head -1)," \
         "$(z3 --version 2>/dev/null | head -1), $(cvc4 --version 2>/dev/null | head -1 | sed 's/^This is //'), cvc5 version $cvc5_version."
    echo "Flags: $wp_flags"
    echo
    echo "Goals are the contracts' and the run-time-error assertions' proof obligations; smoke tests (a goal"
    echo "\`false\` at each point that must be reachable, which must stay unproved) are counted apart."
    echo "PROOF-TABLE.md classes each function by what its contract states; TRUSTED.md lists what is trusted."
    echo
    echo "| file | function | goals proved / total | smoke tests passed / total |"
    echo "|---|---|---|---|"
    awk 'FNR == 1 { part++ }
         part == 1 { k = $1 " " $2; tot[k]++; if ($4 == "proved") ok[k]++ }
         part == 2 { k = $1 " " $2; stot[k]++; if ($4 == "passed") sok[k]++ }
         END { for (k in tot) { split(k, a, " ")
                   printf "| %s | %s | %d / %d%s | %s |\n", a[1], a[2], ok[k], tot[k], (ok[k] == tot[k] ? "" : " **UNPROVED**"),
                          (smoke == 0 ? "-" : sprintf("%d / %d%s", sok[k], stot[k], (sok[k] == stot[k] ? "" : " **FAILED**"))) } }' \
        smoke="$smoke" \
        "$work/goals-unique.txt" "$work/smoke-unique.txt" | sort
    awk '{ tot++; if ($4 == "proved") ok++ } END { printf "\nTotal: %d / %d goals proved", ok, tot }' "$work/goals-unique.txt"
    if [ "$smoke" = 0 ]; then
        echo "; smoke tests not run (VERIFY_SMOKE=1 runs them)."
    else
        awk '{ tot++; if ($4 == "passed") ok++ } END { printf "; %d / %d smoke tests passed.\n", ok, tot }' "$work/smoke-unique.txt"
    fi
    echo
    echo "Of the goals WP sent to Z3, CVC4 or cvc5, $cached were proved by a result replayed from the cache (the"
    echo "same goal, digest for digest, proved in an earlier run: specs/verify.sh, \"The cache\"); the others by a prover in this run."
} > "$summary"
cat "$summary"
reports=$(dirname "$summary")
"$PYTHON" "$srcdir/specs/proof_reports.py" --srcdir "$srcdir" --summary "$summary" \
    --table "$reports/PROOF-TABLE.md" --trusted "$reports/TRUSTED.md" || {
    echo "verify: specs/proof_reports.py failed" >&2; status=1; }

if grep -q " UNPROVED$" "$work/goals-unique.txt"; then
    echo "verify: unproved goals:" >&2
    grep " UNPROVED$" "$work/goals-unique.txt" >&2
    status=1
fi
if awk '$4 != "passed" { bad = 1 } END { exit !bad }' "$work/smoke-unique.txt"; then
    echo "verify: failed smoke tests (a prover proved \`false\` there: the code is unreachable under the contract):" >&2
    awk '$4 != "passed" {
        kind = $3; sub(/^.*_wp_smoke_/, "", kind); what = "dead " kind
        if (kind ~ /^default_requires/) what = "contradictory preconditions"
        else if (kind ~ /^dead_code/) what = "unreachable code"
        else if (kind ~ /^dead_loop/) what = "inconsistent loop invariants"
        else if (kind ~ /^dead_call/) what = "unreachable code after a call (it never returns, or is itself unreachable)"
        else if (kind ~ /_assumes$/) what = "a behavior whose assumes never hold"
        printf "  %s: %s at %s (%s)\n", $2, what, $5, $3 }' "$work/smoke-unique.txt" >&2
    status=1
fi
if [ ! -s "$work/goals-unique.txt" ]; then
    echo "verify: no goals were found in the WP logs" >&2
    status=1
fi
exit $status
