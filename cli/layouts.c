/*
 * cli/layouts.c: the MLP's weight layouts by name (--weight-layout), the gather that reads a layout's
 * files into NKI's order and the scatter that writes gradients back in it; the router's (T, k) view of
 * the affinity gradient.
 */
#include "layouts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------------
 * The layouts
 *
 * A layout spells each weight's storage with the axis letters e (expert, E), h (hidden, H), i
 * (intermediate, I) and j (0 gate, 1 up; 2): the letters from the slowest axis to the fastest, '|'
 * between the dimensions of the file ("e|ji|h": shape (E, 2*I, H), gate rows before up rows), and a
 * leading "j:" for a layout that keeps gate and up in two files of the remaining shape.  NKI's own
 * orders are nki_order[].
 * ------------------------------------------------------------------------------------------------- */
static const char *const nki_order[MLP_WEIGHTS] = {"ehji", "eih", "eji", "eh"};

struct weight_layout {
    const char *name;
    const char *spec[MLP_WEIGHTS];    /* NULL: the layout's model has no such weight */
    const char *file[MLP_WEIGHTS][2]; /* file names without ".npy": one, or gate and up */
    const char *refused;              /* why libmoe cannot compute the layout's model exactly, or NULL */
};

#define NKI_FILES {{"gate_up_proj_weight", NULL}, {"down_proj_weight", NULL}, {"gate_up_proj_bias", NULL}, {"down_proj_bias", NULL}}
/* torch nn.Linear stores out_features x in_features: gate_up (E, 2I, H), gate rows first; down (E, H, I) */
#define LINEAR_SPEC {"e|ji|h", "e|h|i", "e|ji", "e|h"}
/* transformers' fused experts without biases (MixtralExperts, Qwen3MoeExperts): chunk(2, dim=-1) of
 * F.linear(x, gate_up_proj[e]) gives gate, then up */
#define HF_LINEAR_SPEC {"e|ji|h", "e|h|i", NULL, NULL}

static const weight_layout layouts[] = {
    {"nki", {"e|h|j|i", "e|i|h", "e|j|i", "e|h"}, NKI_FILES, NULL},
    {"linear", LINEAR_SPEC, NKI_FILES, NULL},
    {"linear-split",
     {"j:e|i|h", "e|h|i", "j:e|i", "e|h"},
     {{"gate_proj_weight", "up_proj_weight"}, {"down_proj_weight", NULL}, {"gate_proj_bias", "up_proj_bias"},
      {"down_proj_bias", NULL}},
     NULL},
    {"hf-mixtral", HF_LINEAR_SPEC, NKI_FILES, NULL},
    {"hf-qwen3-moe", HF_LINEAR_SPEC, NKI_FILES, NULL},
    /* Llama4TextExperts: gate_up_proj (E, H, 2I) multiplied as x @ gate_up_proj[e], chunk(2, dim=-1) */
    {"hf-llama4", {"e|h|ji", "e|i|h", NULL, NULL}, NKI_FILES, NULL},
    {"hf-gpt-oss", {NULL, NULL, NULL, NULL}, NKI_FILES,
     "transformers' GptOssExperts computes (clamp(up) + 1) * glu, and libmoe's MLP computes act(g)*u with no "
     "offset on u; folding the 1 into the up bias gives the same function but another rounding (b + 1 is "
     "rounded to the dtype, and the sum in another order), so it is refused rather than approximated (its "
     "interleaved gate/up, SwiGLU with alpha 1.702 as --activation swish and the clamps as --clamp ,7,-7,7 "
     "would be exact; cli/README.md, \"Weight layouts\")"},
};
#define NUM_LAYOUTS (sizeof layouts / sizeof layouts[0])

const weight_layout *parse_weight_layout(const char *name)
{
    if (name == NULL)
        return &layouts[0];
    for (size_t i = 0; i < NUM_LAYOUTS; i++) {
        if (strcmp(layouts[i].name, name) != 0)
            continue;
        if (layouts[i].refused != NULL)
            die("--weight-layout %s: not computed: %s", name, layouts[i].refused);
        return &layouts[i];
    }
    char choices[512] = "";
    for (size_t i = 0; i < NUM_LAYOUTS; i++)
        snprintf(choices + strlen(choices), sizeof choices - strlen(choices), "%s%s", i == 0 ? "" : ", ",
                 layouts[i].name);
    die("--weight-layout %s: expected one of %s (see moe mlp-fwd --help)", name, choices);
}

const char *weight_layout_name(const weight_layout *layout) { return layout->name; }

/* ---------------------------------------------------------------------------------------------------
 * A spec read apart
 * ------------------------------------------------------------------------------------------------- */
typedef struct spec_form {
    int files;      /* 1, or 2 with "j:" */
    char order[8];  /* the storage letters, slowest first (j first with "j:") */
    int ndim;       /* dimensions of each file */
    char group[4][4]; /* the letters of each file dimension */
} spec_form;

static void read_spec(const char *spec, spec_form *f)
{
    memset(f, 0, sizeof *f);
    f->files = 1;
    size_t n = 0;
    if (strncmp(spec, "j:", 2) == 0) {
        f->files = 2;
        f->order[n++] = 'j';
        spec += 2;
    }
    size_t g = 0;
    for (const char *p = spec; *p != '\0'; p++) {
        if (*p == '|') {
            f->ndim++;
            g = 0;
            continue;
        }
        f->order[n++] = *p;
        f->group[f->ndim][g++] = *p;
    }
    f->ndim++;
}

static int64_t letter_size(char letter, const int64_t dims[3])
{
    switch (letter) {
    case 'e':
        return dims[0];
    case 'h':
        return dims[1];
    case 'i':
        return dims[2];
    default: /* 'j' */
        return 2;
    }
}

/* The file shape a spec form gives for dims. */
static void file_shape(const spec_form *f, const int64_t dims[3], int64_t *shape)
{
    for (int d = 0; d < f->ndim; d++) {
        shape[d] = 1;
        for (const char *l = f->group[d]; *l != '\0'; l++)
            shape[d] *= letter_size(*l, dims);
    }
}

/* "(E, 2*I, H)" */
static void symbolic_shape(const spec_form *f, char *buf, size_t size)
{
    size_t used = (size_t)snprintf(buf, size, "(");
    for (int d = 0; d < f->ndim && used < size; d++) {
        for (const char *l = f->group[d]; *l != '\0' && used < size; l++)
            used += (size_t)snprintf(buf + used, size - used, "%s%c", l == f->group[d] ? "" : "*",
                                     *l == 'j' ? '2' : (char)(*l - 'a' + 'A'));
        if (used < size)
            used += (size_t)snprintf(buf + used, size - used, "%s", d + 1 < f->ndim ? ", " : f->ndim == 1 ? ",)" : ")");
    }
}

/* "E, I and H": the sizes a file's shape is checked against, in the order of its dimensions */
static void size_names(const spec_form *f, char *buf, size_t size)
{
    char letters[4];
    int n = 0;
    for (int d = 0; d < f->ndim; d++)
        for (const char *l = f->group[d]; *l != '\0'; l++)
            if (*l != 'j')
                letters[n++] = (char)(*l - 'a' + 'A');
    buf[0] = '\0';
    for (int k = 0; k < n; k++)
        snprintf(buf + strlen(buf), size - strlen(buf), "%s%c", k == 0 ? "" : k + 1 < n ? ", " : " and ", letters[k]);
}

/* ---------------------------------------------------------------------------------------------------
 * Gather and scatter
 * ------------------------------------------------------------------------------------------------- */
/* Moves a tensor between NKI's order `nki` and the storage order `order` (the same letters), es bytes an
 * element: to_nki: dst in NKI's order from src in storage order; else the inverse. */
static void permute(const char *nki, const char *order, const int64_t dims[3], size_t es, const void *src, void *dst,
                    int to_nki)
{
    const int n = (int)strlen(nki);
    int64_t size[4], stride[4], idx[4] = {0}, total = 1;
    for (int d = 0; d < n; d++) {
        size[d] = letter_size(nki[d], dims);
        total *= size[d];
        stride[d] = 1;
        for (const char *l = strchr(order, nki[d]) + 1; *l != '\0'; l++)
            stride[d] *= letter_size(*l, dims);
    }
    const char *s = src;
    char *t = dst;
    for (int64_t p = 0; p < total; p++) {
        int64_t q = 0;
        for (int d = 0; d < n; d++)
            q += idx[d] * stride[d];
        if (to_nki)
            memcpy(t + (size_t)p * es, s + (size_t)q * es, es);
        else
            memcpy(t + (size_t)q * es, s + (size_t)p * es, es);
        for (int d = n - 1; d >= 0; d--) {
            if (++idx[d] < size[d])
                break;
            idx[d] = 0;
        }
    }
}

int weight_file_names(const weight_layout *layout, int w, const char *suffix, char names[2][WEIGHT_NAME_SIZE])
{
    if (layout->spec[w] == NULL)
        return 0;
    int n = 0;
    for (; n < 2 && layout->file[w][n] != NULL; n++)
        snprintf(names[n], WEIGHT_NAME_SIZE, "%s%s.npy", layout->file[w][n], suffix);
    return n;
}

/* The file name of paths[k] without the folder and ".npy", for messages ("gate_proj_weight"). */
static const char *file_what(const weight_layout *layout, int w, int k) { return layout->file[w][k]; }

void weight_read(const weight_layout *layout, int w, char *const paths[2], const char *dims_from, int64_t dims[3],
                 npy_array *nki)
{
    if (w == W_GATE_UP)
        dims_from = paths[0];
    spec_form f;
    read_spec(layout->spec[w], &f);
    char sym[64];
    symbolic_shape(&f, sym, sizeof sym);
    npy_array arr[2];
    for (int k = 0; k < f.files; k++) {
        load(paths[k], &arr[k]);
        check_floating(paths[k], &arr[k]);
    }
    if (w == W_GATE_UP) { /* E, H and I from this file's shape */
        const npy_header *h = &arr[0].h;
        int ok = h->ndim >= f.ndim && shape_is(h, f.ndim, h->shape);
        for (int d = 0; ok && d < f.ndim; d++) {
            const char *g = f.group[d];
            const int64_t n = h->shape[d];
            if (strcmp(g, "j") == 0) {
                ok = n == 2;
                continue;
            }
            const int has_j = strchr(g, 'j') != NULL;
            if (has_j && n % 2 != 0) {
                ok = 0;
                break;
            }
            const char letter = g[0] == 'j' ? g[1] : g[0];
            dims[letter == 'e' ? 0 : letter == 'h' ? 1 : 2] = has_j ? n / 2 : n;
        }
        if (!ok)
            die("%s: expected %s of shape %s (--weight-layout %s), found %s %s", paths[0], file_what(layout, w, 0), sym,
                layout->name, shape_text(h), npy_type_name(h->type));
    }
    int64_t want[4];
    file_shape(&f, dims, want);
    char names[32], wtext[128];
    size_names(&f, names, sizeof names);
    npy_format_shape(wtext, sizeof wtext, f.ndim, want);
    for (int k = 0; k < f.files; k++) {
        if (shape_is(&arr[k].h, f.ndim, want))
            continue;
        die("%s: expected %s of shape %s = %s (--weight-layout %s; %s from %s), found %s %s", paths[k],
            file_what(layout, w, k), wtext, sym, layout->name, names, dims_from, shape_text(&arr[k].h),
            npy_type_name(arr[k].h.type));
    }
    if (f.files == 2 && arr[1].h.type != arr[0].h.type)
        die("%s: %s, but %s is %s: gate and up must have one dtype", paths[1], npy_type_name(arr[1].h.type), paths[0],
            npy_type_name(arr[0].h.type));

    const size_t es = npy_type_size(arr[0].h.type);
    const size_t part = arr[0].h.data_bytes;
    char *storage = arr[0].data;
    if (f.files == 2) { /* gate then up: the storage order j, ... */
        storage = xmalloc(2 * part + 1, 1);
        memcpy(storage, arr[0].data, part);
        memcpy(storage + part, arr[1].data, part);
    }
    memset(nki, 0, sizeof *nki);
    nki->h.type = arr[0].h.type;
    nki->h.ndim = (int)strlen(nki_order[w]);
    nki->h.count = 1;
    for (int d = 0; d < nki->h.ndim; d++) {
        nki->h.shape[d] = letter_size(nki_order[w][d], dims);
        nki->h.count *= nki->h.shape[d];
    }
    nki->h.data_bytes = (size_t)nki->h.count * es;
    nki->data = xmalloc((size_t)nki->h.count + 1, es);
    permute(nki_order[w], f.order, dims, es, storage, nki->data, 1);
    if (storage != arr[0].data)
        xfree(storage);
    for (int k = 0; k < f.files; k++)
        release(&arr[k]);
}

/* grad (NKI's order, es-byte elements) permuted into the layout's order: the storage (owned, count elements),
 * the spec of the files and their shape. */
static char *to_layout(const weight_layout *layout, int w, size_t es, const void *grad, const int64_t dims[3],
                       spec_form *f, int64_t shape[4], int64_t *count)
{
    read_spec(layout->spec[w], f);
    *count = 1;
    for (const char *l = nki_order[w]; *l != '\0'; l++)
        *count *= letter_size(*l, dims);
    char *storage = xmalloc((size_t)*count + 1, es);
    permute(nki_order[w], f->order, dims, es, grad, storage, 0);
    file_shape(f, dims, shape);
    return storage;
}

void weight_write(const args *a, const weight_layout *layout, int w, char *const paths[2], moe_dtype dtype,
                  const void *grad, const int64_t dims[3])
{
    spec_form f;
    int64_t shape[4], count;
    const size_t es = moe_dtype_size(dtype);
    char *storage = to_layout(layout, w, es, grad, dims, &f, shape, &count);
    for (int k = 0; k < f.files; k++)
        write_result(a, paths[k], dtype, storage + (size_t)k * (size_t)(count / f.files) * es, f.ndim, shape);
    xfree(storage);
}

void weight_write_f64(const weight_layout *layout, int w, char *const paths[2], const double *values,
                      const int64_t dims[3])
{
    spec_form f;
    int64_t shape[4], count;
    char *storage = to_layout(layout, w, sizeof(double), values, dims, &f, shape, &count);
    for (int k = 0; k < f.files; k++)
        write_array(paths[k], NPY_T_F64, f.ndim, shape, storage + (size_t)k * (size_t)(count / f.files) * sizeof(double));
    xfree(storage);
}

/* ---------------------------------------------------------------------------------------------------
 * The router's (T, k) view
 * ------------------------------------------------------------------------------------------------- */
void check_topk_ids(const char *path, int64_t T, int64_t k, int64_t E, const int64_t *topk_ids)
{
    for (int64_t i = 0; i < T * k; i++)
        if (topk_ids[i] < 0 || topk_ids[i] >= E)
            die("%s: [%lld, %lld] = %lld, expected an expert in [0, %lld)", path, (long long)(i / k),
                (long long)(i % k), (long long)topk_ids[i], (long long)E);
}

void topk_weights_grad(int64_t T, int64_t k, int64_t E, const int64_t *topk_ids, const void *d_affinities,
                       size_t es, void *topk_grad)
{
    const char *from = d_affinities;
    char *to = topk_grad;
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++)
            memcpy(to + (size_t)(t * k + j) * es, from + (size_t)(t * E + topk_ids[t * k + j]) * es, es);
}
