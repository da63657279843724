/* fuzz_npy.c - libFuzzer target for the .npy reader: any byte string must come back as a status. */
#include <stddef.h>
#include <stdint.h>

#include "engine/ir/graph.h"
#include "engine/ir/npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    eng_tensor *t = NULL;
    if (eng_npy_load_buffer(data, size, "fuzz", &t) == ENG_STATUS_OK) eng_tensor_destroy(&t);
    return 0;
}
