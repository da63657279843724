/* krn-transpose-view.h - a transpose reduced to its essential view, one definition for the CPU kernel
 * (kernels/cpu/tensor.c krn_cpu_transpose) and the CUDA one (kernels/cuda/cuda-tensor.cu): the permutation checked,
 * size-1 dims dropped, and source axes that stay adjacent in the output merged into groups. The output is then the
 * groups in output order, group g of od[g] elements at source stride os[g] (elements); b is the group holding the
 * source's innermost axis (b == ng - 1: a strided copy; otherwise a 2-D tile transpose of groups b and ng - 1).
 * Plain C, also compiled as C++. */
#ifndef KRN_TRANSPOSE_VIEW_H
#define KRN_TRANSPOSE_VIEW_H

#include <stdint.h>

#include "../engine/ir/status.h"

#define KRN_TRANSPOSE_MAXD 16

typedef struct krn_transpose_view {
    int64_t total;                   /* elements; <= 0: nothing to move */
    int ng;                          /* groups; 0 (with total 1): every dim is 1, one element */
    int64_t od[KRN_TRANSPOSE_MAXD];  /* group sizes, output order */
    int64_t os[KRN_TRANSPOSE_MAXD];  /* their source strides */
    int b;                           /* the group of the source's innermost axis */
} krn_transpose_view;

/* what: the op, for messages; maxd: the caller's rank limit (<= KRN_TRANSPOSE_MAXD). */
static inline eng_status krn_transpose_view_make(int ndim, const int64_t *dims, const int *perm, int maxd,
                                                 const char *what, krn_transpose_view *v) {
    v->total = 1;
    v->ng = 0;
    v->b = -1;
    if (ndim < 0 || ndim > maxd || maxd > KRN_TRANSPOSE_MAXD)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: rank %d exceeds %d", what, ndim, maxd);
    unsigned seen = 0;
    for (int k = 0; k < ndim; k++) {
        if (perm[k] < 0 || perm[k] >= ndim || (seen >> perm[k] & 1u))
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: perm[%d] = %d is not a permutation of 0..%d", what, k,
                           perm[k], ndim - 1);
        seen |= 1u << perm[k];
        v->total *= dims[k];
    }
    if (v->total <= 0) return ENG_STATUS_OK;
    /* drop size-1 dims */
    int map[KRN_TRANSPOSE_MAXD], n = 0, p[KRN_TRANSPOSE_MAXD], m = 0;
    int64_t sd[KRN_TRANSPOSE_MAXD];
    for (int i = 0; i < ndim; i++) {
        map[i] = dims[i] == 1 ? -1 : n;
        if (dims[i] != 1) sd[n++] = dims[i];
    }
    for (int k = 0; k < ndim; k++)
        if (map[perm[k]] >= 0) p[m++] = map[perm[k]];
    if (n == 0) return ENG_STATUS_OK;
    /* merge source axes that stay adjacent in the output: group g covers source axes [gfirst[g], glast[g]] */
    int gfirst[KRN_TRANSPOSE_MAXD], glast[KRN_TRANSPOSE_MAXD], ng = 0;
    for (int k = 0; k < n; k++) {
        if (ng > 0 && p[k] == glast[ng - 1] + 1) glast[ng - 1] = p[k];
        else {
            gfirst[ng] = glast[ng] = p[k];
            ng++;
        }
    }
    int64_t sstr[KRN_TRANSPOSE_MAXD], st = 1;
    for (int i = n - 1; i >= 0; i--) {
        sstr[i] = st;
        st *= sd[i];
    }
    for (int g = 0; g < ng; g++) {
        int64_t dd = 1;
        for (int i = gfirst[g]; i <= glast[g]; i++) dd *= sd[i];
        v->od[g] = dd;
        v->os[g] = sstr[glast[g]];
        if (glast[g] == n - 1) v->b = g;
    }
    v->ng = ng;
    return ENG_STATUS_OK;
}

#endif
