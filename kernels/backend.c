/* backend.c - kernel lookup in a backend's tables (see kernel.h). */
#include "kernel.h"

#include <string.h>

const krn_kernel *krn_backend_find(const krn_backend *b, const char *name) {
    if (!b || !name) return NULL;
    for (const krn_kernel *const *t = b->tables; *t; t++)
        for (const krn_kernel *k = *t; k->name; k++)
            if (strcmp(k->name, name) == 0) return k;
    return NULL;
}

const krn_kernel *krn_backend_find_dtype(const krn_backend *b, const char *name, eng_dtype dt) {
    const krn_kernel *k = krn_backend_find(b, name);
    if (!k || dt == ENG_DTYPE_UNDEFINED || dt == ENG_DTYPE_F32) return k;
    return k->compute_ok ? k : NULL;
}
