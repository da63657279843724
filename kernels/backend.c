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
