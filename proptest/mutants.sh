#!/bin/sh
# Mutation testing of libmoe's tests: evidence that `make check` bites (issue 4, proptest/README.md
# "Mutation testing").  Not part of `make check` (about half an hour on two shared cores).
#
#   proptest/mutants.sh [--only NAME,NAME,...] [--full] [--dry] [--list] [SRCDIR [SCRATCH]]
#
#   SRCDIR   the libmoe source tree (default: this script's ../); it is copied, never changed
#   SCRATCH  a scratch folder (default: /tmp/moe-mutants); SCRATCH/src is the copy, SCRATCH/build the
#            one out-of-tree build (configure --without-cuda) shared by all mutants, SCRATCH/logs the
#            per-mutant logs, SCRATCH/kill-table.md the result
#   --only   run only these mutants (--list names them)
#   --dry    only check that every mutant's edits still apply to SRCDIR (no build, no tests); a run
#            without --dry checks the same first, before its baseline
#   --full   after the fuzzer, also run the rest of `make check` for every mutant (default: only for
#            mutants the fuzzer lets through)
#
# For each mutant: one realistic bug is written into the copy as a precise text edit (the edit fails
# loudly when its target text is not found exactly once, so a change of the code under a mutant is
# noticed, not silently skipped), the build is brought up to date (only the edited file recompiles),
# and the tests run in the order of `make check`'s cost:
#   1. proptest/check-fuzz.sh, the fixed-seed run of `make check` (seed, case count and regression file
#      taken from the script itself), with its shrink budget cut from 20 s to MUTANTS_SHRINK_SECONDS
#      (default 3) per failure: the cases run, and so the verdict, are the same; only the shrinking of
#      a failure found is shorter;
#   2. if the fuzzer passes (or with --full): every other test of `make check` (tests/, the CLI tests) but
#      the Frama-C/WP proof (specs/local.mk's VERIFY_TESTS): it proves index safety, termination and assigns,
#      not values, and takes tens of minutes; `make verify` in SCRATCH/build asks it of a mutant by hand.
# A mutant is killed when a test fails; the table names the first failing test and, for the fuzzer, its
# reproducer line.  The edit is then undone.  Before any mutant the unmutated copy must pass both
# stages, otherwise the verdicts would mean nothing.
#
# Exit status: 0 every mutant killed, 1 a mutant survived, 2 a usage, edit, build or baseline error.
set -u

usage() { sed -n '5,15p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

only=""
full=0
list=0
dry=0
while [ $# -gt 0 ]; do
    case "$1" in
    --only) [ $# -ge 2 ] || usage; only=$2; shift 2 ;;
    --full) full=1; shift ;;
    --list) list=1; shift ;;
    --dry) dry=1; shift ;;
    -h|--help) usage ;;
    -*) echo "mutants.sh: unknown option $1" >&2; usage ;;
    *) break ;;
    esac
done
script_dir=$(cd "$(dirname "$0")" && pwd)
srcdir=$(cd "${1:-$script_dir/..}" && pwd) || exit 2
scratch=${2:-/tmp/moe-mutants}
jobs=${MUTANTS_JOBS:-2}
shrink=${MUTANTS_SHRINK_SECONDS:-3}

# ---------------------------------------------------------------------------------------------------
# The mutants.  Each is a line of the registry (name|file|what the bug does) and a function m_NAME
# that makes the edits with `edit FILE OLD NEW` (literal text; OLD must occur exactly once).
# ---------------------------------------------------------------------------------------------------
REGISTRY='offsets-off-by-one|ref/routing.c|counting sort of moe_routing_from_topk takes ++next[e] for next[e]++: every row one past its expert offset
token-g-not-g-over-k|ref/gemm/gemm_internal.h|permute_x gathers x row g (the slot) instead of g/k (its token)
clamp-mask-dropped|ref/mlp/bwd.c|MLP backward: the gate gradient ignores the nonlinear clamp mask
silu-derivative|backend/moe_activations.h|SiLU derivative written as s(1-s) (the sigmoid derivative) instead of s(1+x(1-s))
gate-up-bias-half|ref/mlp/bwd.c|db_gu sums only the gate half (j < I); the up half stays +0
dA-not-zeroed|ref/mlp/bwd.c|d_affinities row buffer not zeroed per token: stale values for experts a token skips
W-transposed-square|ref/gemm/tiles.c|forward packs W[e] as [K][N] (transposed) exactly when N == K
bf16-accumulation|ref/gemm/tiles.c|bf16 inputs: the float32 accumulator is rounded to bf16 after every step
missed-tail-row|ref/gemm/setup.c|the last row of a partial 96-row block (an expert tail, the dW tail in N) is never computed
lost-topk-weight|ref/gemm/tiles.c|dW drops the topk weight of its rows (fwd and dX keep it)
reduction-tail-block|ref/gemm/tiles.c|tile edge: the partial last KB = 256 reduction block is dropped (K, N or rows past 256)
panel-edge-column|ref/gemm/tiles.c|tile edge: the last real column of a partial NR = 16 W panel is packed as 0
reduce-topk-order|ref/gemm/dx.c|dX reduce_topk sums a token slots in reverse order (k-1 .. 0), not the specified 0 .. k-1
v4-second-half|ref/gemm/kernels.c|the 16-byte micro-kernel skips the second half of a 6-row tile with 4 rows (rows > 4 for rows > 3): only MOE_REF_KERNEL=v4 reaches it on an AVX2 machine
reduce-chunk-offset|ref/gemm/dx.c|dX reduce_topk stores every column chunk at column 0 of the token row (the chunk offset c0 dropped): only a K split into chunks (options.ref_scratch_bytes below 4*M*K) shows it
duplicate-gather|ref/routing.c|the routing validator accepts a repeated gather index
layout-pad-mark|ref/mlp_layout.c|the layout builder marks padding with token T-1 instead of T (MOE_MLP_PAD_ROW)
lost-affinity-fwd|ref/mlp/fwd.c|MLP forward (affinity on H) adds d instead of a*d to the token row
gelu-tanh-derivative|backend/moe_activations.h|GELU-tanh derivative without the factor 3 of d/dx (0.044715 x^3)
unrounded-aG|ref/mlp/bwd.c|round_intermediates: the down projection gradient operand a*G stays float32 (m, dg, du are rounded)
affinity-rounded-early|ref/mlp/fwd.c|round_intermediates, affinity on I: the forward rounds act(g)*u before the affinity, rnd(m)*a for rnd(m*a)
sigmoid-overflow|backend/moe_activations.h|the sigmoid as e^x/(1+e^x): inf/inf = NaN once x > 88 (only large pre-activations reach it)'

m_offsets_off_by_one() {
    edit ref/routing.c 'const int64_t r = next[e];' 'const int64_t r = ++next[e];'
    edit ref/routing.c 'next[e] = r + 1;' 'next[e] = r;'
}
m_token_g_not_g_over_k() {
    edit ref/gemm/gemm_internal.h 'return p->permute_x ? slot_of_row(p, r) / p->topk : r;' \
        'return p->permute_x ? slot_of_row(p, r) : r;'
}
m_clamp_mask_dropped() {
    edit ref/mlp/bwd.c 'dg[j] = g_free ? (dmj * u[j]) * act_derivative_of(p->activation, g[j]) : 0.0f;' \
        'dg[j] = ((void)g_free, (dmj * u[j]) * act_derivative_of(p->activation, g[j]));'
}
m_silu_derivative() {
    edit backend/moe_activations.h 'return s * (1.0f + x * (1.0f - s));' 'return s * (1.0f - s);'
}
m_gate_up_bias_half() {
    # bwd_weight_grad's bias sum, for the gate/up call only (R = H, W = 2I; the down call has R = I, W = H)
    edit ref/mlp/bwd.c '        sum_rows(n, W, bsrc, C);
' '        sum_rows(n, W, bsrc, C);
        if (R == p->H && W == 2 * p->I)
            for (int64_t c = p->I; c < W; c++)
                C[c] = 0.0f;
'
}
m_dA_not_zeroed() {
    edit ref/mlp/bwd.c '    for (int64_t e = 0; e < E; e++)
        row_e[e] = 0.0f;
' ''
}
m_W_transposed_square() {
    # pack_b sends the forward with N == K to the row packer, whose b_row_first reads W[e][p0 + q][j0 + j]
    edit ref/gemm/tiles.c '    if (g->kind == OP_FWD || g->kind == OP_TOPK)
        pack_b_w(g, ab, j0, nj, p0, kb, b);' '    if ((g->kind == OP_FWD && g->p->N != g->p->K) || g->kind == OP_TOPK)
        pack_b_w(g, ab, j0, nj, p0, kb, b);'
    edit ref/gemm/tiles.c '    if (g->kind == OP_DX) {
        /*@ ghost lemma_row_fits(ab->e, p->num_experts, p->N); */' '    if (g->kind != OP_DW) {
        /*@ ghost lemma_row_fits(ab->e, p->num_experts, p->N); */'
}
m_bf16_accumulation() {
    edit ref/gemm/tiles.c '                g->kernel(kb, p0 == 0, rows, s->a + gi * group_len, s->b + h * panel_len,
                          s->acc + gi * MR * NB + h * NR, NB);' '                if (g->p->dtype != MOE_BF16) {
                    g->kernel(kb, p0 == 0, rows, s->a + gi * group_len, s->b + h * panel_len,
                              s->acc + gi * MR * NB + h * NR, NB);
                    continue;
                }
                for (int64_t q = 0; q < kb; q++) {
                    g->kernel(1, p0 == 0 && q == 0, rows, s->a + gi * group_len + q * MR,
                              s->b + h * panel_len + q * NR, s->acc + gi * MR * NB + h * NR, NB);
                    for (int i = 0; i < rows; i++)
                        for (int j = 0; j < NR; j++) {
                            float *c = s->acc + (gi * MR + i) * NB + h * NR + j;
                            *c = bf16_to_f32(f32_to_bf16(*c));
                        }
                }'
}
m_missed_tail_row() {
    edit ref/gemm/setup.c 'ab->mi = mi;' 'ab->mi = mi < MB ? mi - 1 : mi;'
}
m_lost_topk_weight() {
    # pack_a_dw: the dy row segment of dW's A operand is not weighted (fwd and dX weight in store_tile)
    edit ref/gemm/tiles.c 'row[i] = wt * row[i];' '(void)wt;'
}
m_reduction_tail_block() {
    edit ref/gemm/tiles.c 'for (int64_t p0 = 0; p0 < L; p0 += kb) {' \
        'for (int64_t p0 = 0; p0 < L && (p0 == 0 || L - p0 >= KB); p0 += kb) {'
}
m_panel_edge_column() {
    edit ref/gemm/tiles.c 'if (j < cols) {' 'if (j + 1 < cols) {'
}
m_reduce_topk_order() {
    edit ref/gemm/dx.c '            for (int64_t j = 0; j < k; j++) {
                /*@ ghost lemma_row_fits(t * k + j, T * k, width); */' '            for (int64_t j = k - 1; j >= 0; j--) {
                /*@ ghost lemma_row_fits(t * k + j, T * k, width); */'
}
m_v4_second_half() {
    edit ref/gemm/kernels.c '    if (rows > 3)
        kernel_v4_half(kb, first, 3, a, b, c, ldc);' '    if (rows > 4)
        kernel_v4_half(kb, first, 3, a, b, c, ldc);'
}
m_reduce_chunk_offset() {
    edit ref/gemm/dx.c 'store_row(p->dtype, dx, t * K + c0 + cb, row, n, p->accumulate);' \
        'store_row(p->dtype, dx, t * K + (c0 & 0) + cb, row, n, p->accumulate);'
}
m_duplicate_gather() {
    edit ref/routing.c '        if (seen[slot])' '        if (0 && seen[slot])'
}
m_layout_pad_mark() {
    edit ref/mlp_layout.c 'const int64_t pad = padding == MOE_MLP_PAD_ROW ? T : -1, NB = block * B;' \
        'const int64_t pad = padding == MOE_MLP_PAD_ROW ? T - 1 : -1, NB = block * B;'
}
m_lost_affinity_fwd() {
    edit ref/mlp/fwd.c 'c[h] = a[i] * d[h];' 'c[h] = d[h];'
}
m_gelu_tanh_derivative() {
    edit backend/moe_activations.h '(1.0f + 3.0f * MOE_ACT_GELU_TANH_C * x2)' '(1.0f + MOE_ACT_GELU_TANH_C * x2)'
}
m_unrounded_aG() {
    edit ref/mlp/bwd.c '        mlp_round_row(dt, dD, n * H);
' ''
}
m_sigmoid_overflow() {
    edit backend/moe_activations.h 'return 1.0f / (1.0f + expf(-x));' 'return expf(x) / (1.0f + expf(x));'
}
m_affinity_rounded_early() {
    edit ref/mlp/fwd.c '        for (int64_t j = 0; j < I; j++)
            m[j] = m[j] * a[i];
    }' '        if (p->round_intermediates)
            mlp_round_row(dt, m, I);
        for (int64_t j = 0; j < I; j++)
            m[j] = m[j] * a[i];
    }'
}

# --only names registry mutants only
for name in $(printf '%s' "$only" | tr ',' ' '); do
    printf '%s\n' "$REGISTRY" | grep -q "^$name|" || { echo "mutants.sh: no mutant named $name (--list)" >&2; exit 2; }
done

if [ "$list" = 1 ]; then
    printf '%s\n' "$REGISTRY" | awk -F'|' '{ printf "%-22s %-20s %s\n", $1, $2, $3 }'
    exit 0
fi

# edit FILE OLD NEW: replace the one occurrence of OLD (literal) in SCRATCH/src/FILE by NEW.
edit() {
    target=$scratch/src/$1
    MUT_OLD=$2 MUT_NEW=$3 perl -0777 -ne '
        my ($old, $new) = ($ENV{MUT_OLD}, $ENV{MUT_NEW});
        my ($count, $at) = (0, -1);
        for (my $i = index($_, $old); $i >= 0; $i = index($_, $old, $i + 1)) { $count++; $at = $i if $at < 0; }
        die "found $count times (expected once)\n" if $count != 1;
        substr($_, $at, length $old) = $new;
        print;' "$target" > "$target.mutant" || {
        rm -f "$target.mutant"
        echo "mutants.sh: mutant $current: the target text of the edit in $1 is not there exactly once;" \
             "the code changed under the mutant: update it in $0" >&2
        printf '  text: %s\n' "$2" | head -3 >&2
        exit 2
    }
    mv "$target.mutant" "$target"
}

log() { printf '%s\n' "$*"; }
elapsed() { echo $(( $(date +%s) - $1 )); }

# ---- the copy and its build ----
start_all=$(date +%s)
case "$scratch" in /*) ;; *) scratch=$(pwd)/$scratch ;; esac
if [ -e "$srcdir/config.status" ]; then
    echo "mutants.sh: $srcdir is configured in the source tree; use a clean (out-of-tree built) tree" >&2
    exit 2
fi
mkdir -p "$scratch/logs" || exit 2
log "mutants.sh: source $srcdir, scratch $scratch, $(date -u '+%Y-%m-%d %H:%M UTC')"
# a fresh build too: the copy keeps the source mtimes, older than objects built from an earlier mutant
rm -rf "$scratch/src" "$scratch/pristine" "$scratch/build"
mkdir -p "$scratch/src"
(cd "$srcdir" && tar -cf - --exclude=.git --exclude=autom4te.cache --exclude='*.o' --exclude='*.lo' \
    --exclude='*.la' --exclude=.libs --exclude=.deps .) | (cd "$scratch/src" && tar -xf -) || exit 2
cp -a "$scratch/src" "$scratch/pristine"
# Every selected mutant's edits are tried on the copy before anything is built (each in a subshell, so that
# a failed edit ends only its own try, then the file is restored): a stale mutant stops the run (exit 2)
# here, not after the baseline.
selected() { [ -z "$only" ] || case ",$only," in *",$1,"*) ;; *) return 1 ;; esac; }
stale=$(printf '%s\n' "$REGISTRY" | while IFS='|' read -r name file what; do
    selected "$name" || continue
    if (current=$name; "m_$(printf '%s' "$name" | tr -c 'A-Za-z0-9\n' '_')") &&
       ! cmp -s "$scratch/src/$file" "$scratch/pristine/$file"; then
        [ "$dry" = 1 ] && log "edit ok: $name ($file)" >&2
    else
        echo "mutants.sh: mutant $name: its edits do not apply to $file (or change nothing)" >&2
        printf ' %s' "$name"
    fi
    cp "$scratch/pristine/$file" "$scratch/src/$file"
done)
[ -z "$stale" ] || { echo "mutants.sh: stale mutants (update them in $0):$stale" >&2; exit 2; }
[ "$dry" = 1 ] && exit 0
if [ ! -x "$scratch/src/configure" ]; then
    log "mutants.sh: no configure in the copy: ./bootstrap"
    (cd "$scratch/src" && ./bootstrap) > "$scratch/logs/bootstrap.log" 2>&1 || {
        echo "mutants.sh: bootstrap failed, see $scratch/logs/bootstrap.log" >&2; exit 2; }
fi
mkdir -p "$scratch/build"
cd "$scratch/build" || exit 2
log "mutants.sh: configure --without-cuda"
"$scratch/src/configure" --without-cuda > "$scratch/logs/configure.log" 2>&1 || {
    echo "mutants.sh: configure failed, see $scratch/logs/configure.log" >&2; exit 2; }

# the fixed-seed run of make check: check-fuzz.sh itself, with only its shrink budget changed
fuzz_script=$scratch/check-fuzz-mutants.sh
sed "s/--shrink-seconds 20 /--shrink-seconds $shrink /" "$scratch/src/proptest/check-fuzz.sh" > "$fuzz_script"
if cmp -s "$fuzz_script" "$scratch/src/proptest/check-fuzz.sh"; then
    echo "mutants.sh: proptest/check-fuzz.sh no longer says '--shrink-seconds 20 ': update $0" >&2
    exit 2
fi

build() { make -j"$jobs" all > "$1" 2>&1 && make -j"$jobs" check TESTS= >> "$1" 2>&1; }

run_fuzz() { srcdir=$scratch/src sh "$fuzz_script" > "$1" 2>&1; }

run_others() { make -j"$jobs" check TESTS="$other_tests" > "$1" 2>&1; }

# The first failing test of a `make check TESTS=...` log
first_failed_test() { sed -n 's/^\(FAIL\|ERROR\|XPASS\): \([^ ]*\).*/\2/p' "$1" | head -1; }

current=baseline
log "mutants.sh: building the unmutated copy"
t0=$(date +%s)
build "$scratch/logs/baseline-build.log" || {
    echo "mutants.sh: the unmutated copy does not build, see $scratch/logs/baseline-build.log" >&2; exit 2; }
# every other test of make check (asked once the build exists: a fresh Makefile first regenerates)
other_tests=$(printf 'print-tests:\n\t@echo $(TESTS)\n' | make -s -f Makefile -f - print-tests VERIFY_TESTS= |
              tr ' ' '\n' | grep -v '^proptest/check-fuzz.sh$' | grep -v '^$' | tr '\n' ' ')
run_fuzz "$scratch/logs/baseline-fuzz.log" || {
    echo "mutants.sh: the unmutated copy fails the fuzzer, see $scratch/logs/baseline-fuzz.log" >&2; exit 2; }
run_others "$scratch/logs/baseline-tests.log" || {
    echo "mutants.sh: the unmutated copy fails make check, see $scratch/logs/baseline-tests.log" >&2; exit 2; }
log "mutants.sh: baseline green ($(elapsed "$t0") s); tests besides the fuzzer: $other_tests"

table=$scratch/kill-table.md
{
    echo "| mutant | file | the bug | killed by | reproducer / log |"
    echo "|---|---|---|---|---|"
} > "$table"
total=0
killed=0
survivors=""
registry_lines=$(printf '%s\n' "$REGISTRY" | wc -l)
i=0
while [ "$i" -lt "$registry_lines" ]; do
    i=$((i + 1))
    line=$(printf '%s\n' "$REGISTRY" | sed -n "${i}p")
    name=${line%%|*}; rest=${line#*|}; file=${rest%%|*}; what=${rest#*|}
    selected "$name" || continue
    current=$name
    total=$((total + 1))
    fn=m_$(printf '%s' "$name" | tr -c 'A-Za-z0-9\n' '_')
    t0=$(date +%s)
    "$fn"   # exits 2 when a target text is missing
    if cmp -s "$scratch/src/$file" "$scratch/pristine/$file"; then
        echo "mutants.sh: mutant $name left $file unchanged" >&2; exit 2
    fi
    logs=$scratch/logs/$name
    if ! build "$logs-build.log"; then
        echo "mutants.sh: mutant $name does not build (a mutant must compile), see $logs-build.log" >&2
        exit 2
    fi
    killer=""
    repro=""
    if ! run_fuzz "$logs-fuzz.log"; then
        first=$(grep -m1 '^FAIL ' "$logs-fuzz.log")
        case "$first" in
        *'['*)
            killer="moe-fuzz $(printf '%s' "$first" | sed 's/^FAIL \([^ ]*\) \(\[[^]]*\]\).*/\1 \2/')"
            # the first failure's shrunk reproducer (its original one when shrinking found nothing)
            repro=$(awk '/^FAIL /{n++} n==1 && /^  reproducer: /{r=$0} n==2{exit} END{print r}' "$logs-fuzz.log" |
                    sed 's/^  reproducer: //') ;;
        *)
            line_=$(printf '%s' "$first" | awk '{ print $2 }')
            killer="moe-fuzz regressions.txt"
            repro="proptest/moe-fuzz --replay $line_" ;;
        esac
        [ -n "$repro" ] || repro="see logs/$name-fuzz.log"
    fi
    if [ -z "$killer" ] || [ "$full" = 1 ]; then
        if ! run_others "$logs-tests.log"; then
            failed_test=$(first_failed_test "$logs-tests.log")
            if [ -z "$killer" ]; then
                killer=${failed_test:-"make check (see logs/$name-tests.log)"}
                repro="make check TESTS=$failed_test"
            else
                killer="$killer; also $failed_test"
            fi
        fi
    fi
    # undo: the pristine file back (a mutant edits its registry file only), newer than the objects built
    # from the mutant
    if ! cmp -s "$scratch/src/$file" "$scratch/pristine/$file"; then
        cp "$scratch/pristine/$file" "$scratch/src/$file" && touch "$scratch/src/$file"
    fi
    secs=$(elapsed "$t0")
    if [ -n "$killer" ]; then
        killed=$((killed + 1))
        log "KILLED   $name ($secs s): $killer"
        [ -n "$repro" ] && log "         $repro"
    else
        survivors="$survivors $name"
        killer="SURVIVED"
        log "SURVIVED $name ($secs s)"
    fi
    printf '| %s | %s | %s | %s | `%s` |\n' "$name" "$file" "$what" "$killer" "$repro" >> "$table"
done

log ""
log "mutants.sh: $killed of $total mutants killed in $(elapsed "$start_all") s (fuzzer shrink budget ${shrink} s)"
[ -n "$survivors" ] && log "mutants.sh: survived:$survivors"
log ""
cat "$table"
[ -z "$survivors" ]
