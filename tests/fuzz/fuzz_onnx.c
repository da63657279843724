/* fuzz_onnx.c - libFuzzer target for the ONNX model loader: any byte string must come back as a status
 * (never a crash, leak or sanitizer report). base_dir is NULL, so external data is refused, not read.
 * Successfully loaded graphs are also cloned and topologically ordered to exercise the IR code on them. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "engine/ir/onnx.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    eng_graph *g = NULL;
    if (eng_onnx_load_buffer(data, size, NULL, "fuzz", &g) == ENG_STATUS_OK) {
        int *order = malloc(((size_t)g->nnodes + 1) * sizeof(int));
        if (order) (void)eng_graph_topo_order(g, order);
        free(order);
        eng_graph *c = eng_graph_clone(g);
        eng_graph_free(&c);
        eng_graph_free(&g);
    }
    return 0;
}
