/* graph-fixture.h - what unit tests that build graphs by hand share (test_autodiff.c, test_train_fastpath.c,
 * test_place.c, ...): a new value, a one-output node, a graph input or float32 initializer with its shape recorded,
 * appending to an int list (g->inputs, g->outputs), and a seeded uniform draw. Include after criterion and the
 * engine's graph header.
 */
#ifndef TESTS_UNIT_GRAPH_FIXTURE_H
#define TESTS_UNIT_GRAPH_FIXTURE_H

#include <stdlib.h>
#include <string.h>

#include "engine/ir/graph.h"

#define GFX static __attribute__((unused))

GFX int val(eng_graph *g, const char *name) { return eng_graph_add_value(g, name); }

/* A default-domain node `type` named `name` with one output, a new value also named `name`; returns that value. */
GFX int gfx_node(eng_graph *g, const char *name, const char *type, const int *in, int nin) {
    int out = val(g, name);
    cr_assert_geq(eng_graph_add_node(g, name, type, "", in, nin, &out, 1), 0);
    return out;
}

/* Uniform in [-0.5, 0.5) from the linear congruential state *s. */
GFX float gfx_frand(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffffff) / 16777216.0f - 0.5f;
}

GFX void list_add(int **a, int *n, int v) {
    *a = realloc(*a, (size_t)(*n + 1) * sizeof(int));
    (*a)[(*n)++] = v;
}

static void gfx_set_shape(eng_graph *g, int v, eng_dtype dt, int ndim, const int64_t *dims) {
    g->values[v].dtype = dt;
    g->values[v].ndim = ndim;
    memcpy(g->values[v].dims, dims, (size_t)ndim * sizeof *dims);
}

/* A float32 graph input of this shape. */
GFX int input_f32(eng_graph *g, const char *name, int ndim, const int64_t *dims) {
    int v = val(g, name);
    gfx_set_shape(g, v, ENG_DTYPE_F32, ndim, dims);
    list_add(&g->inputs, &g->ninputs, v);
    return v;
}

/* A float32 initializer holding a copy of data. */
GFX int init_f32(eng_graph *g, const char *name, int ndim, const int64_t *dims, const float *data) {
    int v = val(g, name);
    eng_tensor *t = calloc(1, sizeof *t);
    t->dtype = ENG_DTYPE_F32;
    t->ndim = ndim;
    memcpy(t->dims, dims, (size_t)ndim * sizeof *dims);
    size_t nb = eng_tensor_nbytes(t);
    t->data = eng_alloc(nb ? nb : 4);
    memcpy(t->data, data, nb);
    eng_value_set_init(g, v, t);
    gfx_set_shape(g, v, ENG_DTYPE_F32, ndim, dims);
    return v;
}

#endif
