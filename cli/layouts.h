/*
 * cli/layouts.h: the MLP's weight layouts by name (mlp-fwd / mlp-bwd --weight-layout) and the router's
 * (T, k) view of the affinity gradient.
 *
 * The library takes the expert weights in NKI's layout: gate/up (E, H, 2, I), down (E, I, H), biases
 * (E, 2, I) and (E, H).  A layout names the files a caller has instead (stacked nn.Linear weights, a
 * Hugging Face fused expert module) and how their elements map onto NKI's: reading one is a gather
 * into NKI's order, writing its gradient the inverse scatter, so the gradients come back in the layout
 * the weights were given in.  The table, and what each layout expresses exactly, is in layouts.c and
 * cli/README.md ("Weight layouts").
 */
#ifndef LIBMOE_CLI_LAYOUTS_H
#define LIBMOE_CLI_LAYOUTS_H

#include "cli.h"

#include <stdint.h>

/* The weights of the MLP, in the order of moe_mlp_fwd's arguments. */
enum mlp_weight { W_GATE_UP, W_DOWN, B_GATE_UP, B_DOWN, MLP_WEIGHTS };

typedef struct weight_layout weight_layout;

/* --weight-layout's value (NULL: nki); dies naming the choices for an unknown name, and with the reason
 * for a layout libmoe cannot compute exactly. */
const weight_layout *parse_weight_layout(const char *name);
const char *weight_layout_name(const weight_layout *layout);

/* The file names of weight w in `layout`, each followed by suffix ("" or "_grad") and ".npy": the number
 * of files (1, or 2 for a layout that keeps gate and up apart), or 0 when the layout has no such weight
 * (its model has no biases). */
#define WEIGHT_NAME_SIZE 64
int weight_file_names(const weight_layout *layout, int w, const char *suffix, char names[2][WEIGHT_NAME_SIZE]);

/* Reads weight w from its files (weight_file_names) into *nki: NKI's shape and element order, the files'
 * element type.  dims = {E, H, I}: set from W_GATE_UP's shape, checked for every other weight (dims_from
 * names the file they came from); a shape that does not fit is refused naming the layout's expected
 * shape. */
void weight_read(const weight_layout *layout, int w, char *const paths[2], const char *dims_from, int64_t dims[3],
                 npy_array *nki);

/* Writes weight w's gradient, `grad` in NKI's order with dtype elements, to its files in the layout's
 * shapes (write_result: float32 unless --raw). */
void weight_write(const args *a, const weight_layout *layout, int w, char *const paths[2], moe_dtype dtype,
                  const void *grad, const int64_t dims[3]);

/* The same for float64 values in NKI's order (the bounds of --bound-out), written as float64. */
void weight_write_f64(const weight_layout *layout, int w, char *const paths[2], const double *values,
                      const int64_t dims[3]);

/* The router's view of the dense affinity gradient: topk_grad[t][j] = d_affinities[t*E + topk_ids[t][j]]
 * for T tokens of k choices, elements of es bytes.  topk_ids must hold experts in [0, E) (checked by
 * check_topk_ids). */
void topk_weights_grad(int64_t T, int64_t k, int64_t E, const int64_t *topk_ids, const void *d_affinities,
                       size_t es, void *topk_grad);

/* Refuses topk ids (T*k values) outside [0, E), naming the file, the index and the value. */
void check_topk_ids(const char *path, int64_t T, int64_t k, int64_t E, const int64_t *topk_ids);

#endif /* LIBMOE_CLI_LAYOUTS_H */
