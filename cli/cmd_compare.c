/*
 * cli/cmd_compare.c: the compare command: two .npy files, or the same-named files of two folders,
 * element by element within a tolerance.
 */
#include "cli.h"
#include "oracle.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const opt compare_opts[] = {
    {"--dtype", "f32|f16|bf16|f64",
     "the dtype whose rounding the tolerance allows (and how uint16/void16 files are decoded: bf16 or "
     "f16 bit patterns). Default: the dtype of the moe-options.txt beside A (A itself when a folder), or "
     "else beside B, that an mlp command wrote (a --dtype that differs from it is refused); without one, "
     "f16 if either file is float16, f64 if both are float64, else f32 (float32 files holding bf16 results "
     "need --dtype bf16; a failed comparison says so when every value fits). Two integer files are compared "
     "exactly."},
    {"--reduction-length", "L",
     "also allow float32 accumulation over L terms: tolerance 2*(g(L)*m + u*(m + g(L)*m) + eta) with "
     "g(L) = L*2^-24/(1 - L*2^-24) and m = max(|a|,|b|), the bound of SEMANTICS section 4 with the sum "
     "of |terms| taken as m. That holds when the terms do not cancel; where they do, use --bound."},
    {"--bound", "B.npy|DIR",
     "per-element bounds written by --bound-out (gemm-fwd/dx/dw: a file; mlp-fwd, mlp-bwd: a folder of "
     "them): tolerance 2*B (A and B are each within B of the exact result). With two folders: DIR/NAME.npy "
     "where it exists; with two files and a folder: DIR/NAME.npy of A's NAME."},
    {"--exact", NULL, "tolerance 0: every element must be equal (NaN equals NaN)."},
    {"--atol", "X", "absolute tolerance: tolerance atol + rtol*max(|a|,|b|) replaces the derived one."},
    {"--rtol", "X", "relative tolerance, with or without --atol."},
    {NULL, NULL, NULL},
};

static int run_compare(const args *a);

/* The options file of the folder that holds A (A itself when a folder), or else B's: its dtype is
 * --dtype's default, and a --dtype that differs is refused (run_options_apply). */
static void compare_apply_run_options(args *a)
{
    for (int i = 0; i < 2; i++) {
        const char *p = a->pos[i];
        /* the folder: p itself, or the part of p before its last '/' ("." without one, "/" for "/x") */
        const char *slash = strrchr(p, '/');
        const size_t len = is_dir(p) ? strlen(p) : slash == NULL ? 0 : slash == p ? 1 : (size_t)(slash - p);
        char *dir = xmalloc(len + 2, 1);
        memcpy(dir, len ? p : ".", len ? len : 1);
        dir[len ? len : 1] = '\0';
        run_options r;
        const int found = run_options_read(dir, &r);
        xfree(dir);
        if (found) {
            run_options_apply(a, &r);
            if (run_options_get(&r, "dtype") != NULL)
                printf("dtype %s from %s (moe %s)\n", get(a, "--dtype"), r.path, r.command);
            return;
        }
    }
}

const command compare_command = {
    "compare", "A B [--dtype f32|f16|bf16|f64] [--reduction-length L | --bound B.npy | --exact | --atol X --rtol X]",
    "compare two .npy files, or every .npy file of folder A with the same name in folder B",
    "Prints per tensor its shape, the max abs error |a-b|, the max relative error |a-b|/max(|a|,|b|), "
    "the worst element (the largest |a-b| / tolerance) with both values, and a verdict. Exit status 1 "
    "when any tensor has an element over its tolerance, differs in shape, or is missing from B.\n\n"
    "Default tolerance, per element: |a-b| <= 2*(u*max(|a|,|b|) + eta), u the dtype's unit roundoff "
    "(2^-24 f32, 2^-11 f16, 2^-8 bf16, 2^-53 f64) and eta half its smallest subnormal. Why: two correct "
    "results of one computation are each the rounding of (nearly) the same exact value, so they may "
    "differ by one rounding each, never more; that is the loosest claim that holds without knowing "
    "how the values were computed. It suits 16-bit results, where one output rounding outweighs the "
    "float32 accumulation error. For float32 results of long reductions use --reduction-length L, or "
    "better --bound with the per-element bound a gemm or mlp command writes with --bound-out (it knows the "
    "sum of |terms| and so is exact where terms cancel).\n\n"
    "NaN equals NaN at the same place; a NaN against a number, and an Inf against anything else, fail. "
    "Files in B that A does not have are listed and not compared.",
    compare_opts, 2, run_compare,
    "# gemm-fwd's result against the step's, within the bound gemm-fwd derived for every element\n"
    "moe compare y_ref.npy step/y.npy --bound y_bound.npy",
};

typedef enum tol_mode { TOL_ROUNDING, TOL_REDUCTION, TOL_BOUND, TOL_EXACT, TOL_ABSREL } tol_mode;

typedef struct compare_cfg {
    int have_dtype;
    const char *dtype_name; /* f32 f16 bf16 f64 */
    tol_mode mode;
    int64_t length;
    double atol, rtol;
    const char *bound; /* file or folder */
} compare_cfg;

typedef struct tol_dtype {
    const char *name;
    double u, eta;
    moe_dtype pattern; /* how uint16 patterns decode */
    int exact;
} tol_dtype;

static tol_dtype dtype_by_name(const char *name)
{
    if (strcmp(name, "f64") == 0 || strcmp(name, "float64") == 0)
        return (tol_dtype){"f64", 0x1p-53, 0x1p-1074, MOE_BF16, 0};
    moe_dtype d;
    if (!parse_dtype(name, &d))
        die("--dtype %s: expected f32, f16, bf16 or f64", name);
    return (tol_dtype){moe_dtype_name(d), moe_dtype_unit_roundoff(d), oracle_output_rounding(d, 0.0), d, 0};
}

static tol_dtype infer_compare_dtype(const compare_cfg *cfg, const char *pa, const npy_array *a, const char *pb,
                                     const npy_array *b)
{
    if (npy_type_is_int(a->h.type) && npy_type_is_int(b->h.type))
        return (tol_dtype){"int", 0, 0, MOE_BF16, 1};
    const int patterns = npy_type_is_pattern(a->h.type) || npy_type_is_pattern(b->h.type);
    if (cfg->have_dtype) {
        tol_dtype dt = dtype_by_name(cfg->dtype_name);
        if (!patterns || strcmp(dt.name, "bf16") == 0 || strcmp(dt.name, "f16") == 0)
            return dt;
    }
    if (patterns)
        die("%s: holds %s 16-bit patterns; pass --dtype bf16 or --dtype f16 to say what they are",
            npy_type_is_pattern(a->h.type) ? pa : pb,
            npy_type_name(npy_type_is_pattern(a->h.type) ? a->h.type : b->h.type));
    if (a->h.type == NPY_T_F16 || b->h.type == NPY_T_F16)
        return dtype_by_name("f16");
    if (a->h.type == NPY_T_F64 && b->h.type == NPY_T_F64)
        return dtype_by_name("f64");
    return dtype_by_name("f32");
}

static void print_index(int64_t flat, const npy_header *h)
{
    int64_t idx[NPY_MAX_DIMS];
    for (int d = h->ndim - 1; d >= 0; d--) {
        idx[d] = h->shape[d] ? flat % h->shape[d] : 0;
        flat = h->shape[d] ? flat / h->shape[d] : 0;
    }
    printf("[");
    for (int d = 0; d < h->ndim; d++)
        printf("%s%lld", d ? ", " : "", (long long)idx[d]);
    printf("]");
}

/* Compares one pair; prints its report; returns 0 when within tolerance, 1 otherwise. */
static int compare_pair(const compare_cfg *cfg, const char *label, const char *pa, const char *pb, const char *pbound)
{
    npy_array A, B, bound = {0};
    load(pa, &A);
    load(pb, &B);
    int same_shape = A.h.ndim == B.h.ndim;
    for (int d = 0; same_shape && d < A.h.ndim; d++)
        same_shape = A.h.shape[d] == B.h.shape[d];
    if (!same_shape) {
        printf("%s\n", label);
        printf("  shape          %s %s in A, %s %s in B\n  verdict        FAIL (shapes differ)\n", shape_text(&A.h),
               npy_type_name(A.h.type), shape_text(&B.h), npy_type_name(B.h.type));
        release(&A);
        release(&B);
        return 1;
    }
    const tol_dtype dt = infer_compare_dtype(cfg, pa, &A, pb, &B);
    tol_mode mode = dt.exact ? TOL_EXACT : cfg->mode;
    if (mode == TOL_BOUND && pbound == NULL)
        mode = TOL_ROUNDING;
    if (mode == TOL_BOUND) {
        load(pbound, &bound);
        int ok = bound.h.ndim == A.h.ndim && npy_type_is_float(bound.h.type);
        for (int d = 0; ok && d < A.h.ndim; d++)
            ok = bound.h.shape[d] == A.h.shape[d];
        if (!ok)
            die("%s: expected a floating-point bound of shape %s (the shape of %s), found %s %s", pbound,
                shape_text(&A.h), pa, shape_text(&bound.h), npy_type_name(bound.h.type));
    }
    const double g = mode == TOL_REDUCTION ? oracle_gamma(cfg->length) : 0.0;
    printf("%s\n", label);

    printf("  shape          %s", shape_text(&A.h));
    if (A.h.type != B.h.type)
        printf(" (%s in A, %s in B)", npy_type_name(A.h.type), npy_type_name(B.h.type));
    printf("\n  tolerance      ");
    switch (mode) {
    case TOL_EXACT: printf("exact (%s)\n", dt.exact ? "integer arrays" : "--exact"); break;
    case TOL_ROUNDING: printf("%s: 2*(u*max(|a|,|b|) + eta), u = %g, eta = %g\n", dt.name, dt.u, dt.eta); break;
    case TOL_REDUCTION:
        printf("%s, length %lld: 2*(g*m + u*(m + g*m) + eta), m = max(|a|,|b|), g = gamma(%lld) = %.6g, u = %g\n",
               dt.name, (long long)cfg->length, (long long)cfg->length, g, dt.u);
        break;
    case TOL_BOUND: printf("2 * bound from %s\n", pbound); break;
    case TOL_ABSREL: printf("atol + rtol*max(|a|,|b|), atol = %g, rtol = %g\n", cfg->atol, cfg->rtol); break;
    }

    double max_abs = 0, max_rel = 0, worst_ratio = -1, worst_diff = -1, worst_tol = 0;
    int64_t worst = 0, over = 0;
    for (int64_t i = 0; i < A.h.count; i++) {
        const double x = npy_get(&A, i, dt.pattern), y = npy_get(&B, i, dt.pattern);
        double diff, rel;
        if (x == y || (isnan(x) && isnan(y))) {
            diff = 0;
            rel = 0;
        } else {
            diff = fabs(x - y);
            if (isnan(diff))
                diff = INFINITY;
            const double m = fmax(fabs(x), fabs(y));
            rel = isinf(diff) ? INFINITY : diff / m;
        }
        const double m = fmax(fabs(x), fabs(y));
        double tol = 0;
        switch (mode) {
        case TOL_EXACT: tol = 0; break;
        case TOL_ROUNDING: tol = 2 * (dt.u * m + dt.eta); break;
        case TOL_REDUCTION: tol = 2 * (g * m + dt.u * (m + g * m) + dt.eta); break;
        case TOL_BOUND: tol = 2 * npy_get(&bound, i, MOE_BF16); break;
        case TOL_ABSREL: tol = cfg->atol + cfg->rtol * m; break;
        }
        if (isnan(tol))
            tol = 0;
        const int exceeds = isinf(diff) || !(diff <= tol);
        const double ratio = diff == 0 ? 0 : isinf(diff) || tol == 0 ? INFINITY : diff / tol;
        over += exceeds;
        if (ratio > worst_ratio || (ratio == worst_ratio && diff > worst_diff)) {
            worst_ratio = ratio;
            worst_diff = diff;
            worst_tol = tol;
            worst = i;
        }
        max_abs = fmax(max_abs, diff);
        max_rel = fmax(max_rel, rel);
    }
    const int digits = strcmp(dt.name, "f64") == 0 ? 17 : 9;
    printf("  max abs error  %.6e\n  max rel error  %.6e\n", max_abs, max_rel);
    if (A.h.count > 0) {
        printf("  worst element  ");
        print_index(worst, &A.h);
        printf("  a = ");
        printf("%.*g", digits, npy_get(&A, worst, dt.pattern));
        printf("  b = ");
        printf("%.*g", digits, npy_get(&B, worst, dt.pattern));
        printf("  |a-b| = %.6e  tolerance = %.6e\n", worst_diff, worst_tol);
    } else {
        printf("  worst element  none (empty)\n");
    }
    printf("  verdict        %s (%lld of %lld elements over the tolerance)\n", over ? "FAIL" : "PASS", (long long)over,
           (long long)A.h.count);
    const int f32_tolerance = mode == TOL_ROUNDING || mode == TOL_REDUCTION;
    const int fit_bf16 = over && f32_tolerance && strcmp(dt.name, "f32") == 0 && values_fit_dtype(&A, MOE_BF16) &&
                         values_fit_dtype(&B, MOE_BF16);
    const int fit_f16 = over && f32_tolerance && strcmp(dt.name, "f32") == 0 && values_fit_dtype(&A, MOE_F16) &&
                        values_fit_dtype(&B, MOE_F16);
    if (fit_bf16 || fit_f16)
        printf("  hint           every value of both files is %s, and the tolerance is float32's: if these are %s "
               "results, pass %s\n", fit_bf16 && fit_f16 ? "a bf16 and an f16 value" : fit_bf16 ? "a bf16 value" : "an f16 value",
               fit_bf16 && fit_f16 ? "bf16 or f16" : fit_bf16 ? "bf16" : "f16",
               fit_bf16 && fit_f16 ? "--dtype bf16 or --dtype f16" : fit_bf16 ? "--dtype bf16" : "--dtype f16");
    else if (over && mode == TOL_ROUNDING && (strcmp(dt.name, "f32") == 0 || strcmp(dt.name, "f64") == 0))
        printf("  hint           %s results of a sum taken in another order may differ by more than one "
               "rounding: pass --reduction-length L (the sum's length), or --bound with a gemm or mlp command's "
               "--bound-out\n", dt.name);
    release(&A);
    release(&B);
    if (mode == TOL_BOUND)
        release(&bound);
    return over ? 1 : 0;
}

static int name_cmp(const void *x, const void *y) { return strcmp(*(char *const *)x, *(char *const *)y); }

/* The sorted names of the regular *.npy files in a folder. */
static char **list_npy(const char *dir, size_t *count)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        die("%s: cannot open the folder: %s", dir, strerror(errno));
    size_t n = 0, cap = 16;
    char **names = xmalloc(cap, sizeof *names);
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        size_t len = strlen(ent->d_name);
        if (len < 5 || strcmp(ent->d_name + len - 4, ".npy") != 0)
            continue;
        char *full = join_path(dir, ent->d_name);
        int regular = is_regular(full);
        xfree(full);
        if (!regular)
            continue;
        if (n == cap) {
            cap *= 2;
            names = xrealloc(names, cap, sizeof *names);
        }
        names[n] = xmalloc(len + 1, 1);
        memcpy(names[n++], ent->d_name, len + 1);
    }
    closedir(d);
    qsort(names, n, sizeof *names, name_cmp);
    *count = n;
    return names;
}

static int run_compare(const args *given)
{
    args with_file = *given; /* the flags, and the dtype of the options file beside A (or else B) */
    compare_apply_run_options(&with_file);
    const args *a = &with_file;
    compare_cfg cfg = {0};
    cfg.mode = TOL_ROUNDING;
    const char *s = get(a, "--dtype");
    if (s != NULL) {
        (void)dtype_by_name(s); /* refuses a bad name now */
        cfg.have_dtype = 1;
        cfg.dtype_name = s;
    }
    int modes = 0;
    if ((s = get(a, "--reduction-length")) != NULL) {
        cfg.length = parse_int_arg("--reduction-length", s, 1);
        if (cfg.length >= (int64_t)1 << 24)
            die("--reduction-length %s: gamma(L) needs L < 2^24", s);
        cfg.mode = TOL_REDUCTION;
        modes++;
    }
    if ((cfg.bound = get(a, "--bound")) != NULL) {
        cfg.mode = TOL_BOUND;
        modes++;
    }
    if (get(a, "--exact") != NULL) {
        cfg.mode = TOL_EXACT;
        modes++;
    }
    const char *atol = get(a, "--atol"), *rtol = get(a, "--rtol");
    if (atol != NULL || rtol != NULL) {
        cfg.atol = atol ? parse_double_arg("--atol", atol) : 0;
        cfg.rtol = rtol ? parse_double_arg("--rtol", rtol) : 0;
        cfg.mode = TOL_ABSREL;
        modes++;
    }
    if (modes > 1)
        die("choose one of --reduction-length, --bound, --exact and --atol/--rtol");

    const char *pa = a->pos[0], *pb = a->pos[1];
    if (is_dir(pa) || is_dir(pb)) {
        if (!is_dir(pa) || !is_dir(pb))
            die("%s: compare takes two files or two folders; %s is a %s", is_dir(pa) ? pb : pa,
                is_dir(pa) ? pa : pb, "folder");
        if (cfg.bound != NULL && !is_dir(cfg.bound))
            die("%s: with two folders, --bound must be a folder too", cfg.bound);
        size_t na, nb;
        char **names_a = list_npy(pa, &na), **names_b = list_npy(pb, &nb);
        if (na == 0)
            die("%s: no .npy files in the folder", pa);
        int failed = 0, compared = 0, missing = 0;
        for (size_t i = 0; i < na; i++) {
            char *fa = join_path(pa, names_a[i]), *fb = join_path(pb, names_a[i]);
            char *fbound = cfg.bound ? join_path(cfg.bound, names_a[i]) : NULL;
            if (!is_regular(fb)) {
                printf("%s\n  verdict        FAIL (missing from %s)\n", names_a[i], pb);
                missing++;
                failed++;
            } else {
                char label[1024];
                snprintf(label, sizeof label, "%s", names_a[i]);
                failed += compare_pair(&cfg, label, fa, fb, fbound && is_regular(fbound) ? fbound : NULL);
                compared++;
            }
            xfree(fa), xfree(fb), xfree(fbound);
        }
        for (size_t j = 0; j < nb; j++)
            if (bsearch(&names_b[j], names_a, na, sizeof *names_a, name_cmp) == NULL)
                printf("%s\n  only in %s, not compared\n", names_b[j], pb);
        printf("\nsummary: %d tensor(s) compared, %d over the tolerance or differing in shape, %d missing from %s\n",
               compared, failed - missing, missing, pb);
        return failed ? EXIT_MISMATCH : 0;
    }
    const char *bound = cfg.bound;
    if (bound != NULL && is_dir(bound)) { /* a folder of --bound-out: the bound named like A */
        const char *slash = strrchr(pa, '/');
        bound = join_path(bound, slash ? slash + 1 : pa);
        if (!is_regular(bound))
            die("%s: no bound for %s in the folder %s (--bound-out writes one per output, named like it)", bound, pa,
                cfg.bound);
    }
    char label[2048];
    snprintf(label, sizeof label, "%s vs %s", pa, pb);
    return compare_pair(&cfg, label, pa, pb, bound) ? EXIT_MISMATCH : 0;
}
