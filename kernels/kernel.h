/* kernel.h - the backend dispatch interface.
 *
 * A backend (CPU now, CUDA later) is a table of kernels looked up by name at plan time. A kernel computes one
 * op family on dense tensors; it knows nothing of graphs: the engine parses ONNX attributes into a plain
 * params struct (declared in kernels/krn-<family>.h) and resolves all shapes before calling it.
 *
 * Life of a kernel inside a plan: init (optional, once, with final shapes: create oneDNN primitives, pack
 * weights that are constant) -> exec (every run; in/out data pointers may change between runs, shapes may not)
 * -> free_state. In a dynamic plan (shapes known only at run time) all three run on every execution.
 * Kernels never exit or abort: they return an eng_status with a message (eng_err).
 */
#ifndef KRN_KERNEL_H
#define KRN_KERNEL_H

#include "../engine/ir/tensor.h"

typedef struct krn_call {
    const void *params;     /* op-specific params struct, or NULL */
    const eng_tensor *in;   /* nin inputs; in[i].data == NULL for an omitted optional input (dtype UNDEFINED) */
    int nin;
    eng_tensor *out;        /* nout outputs, shapes/dtypes final, data allocated by the caller */
    int nout;
    void *state;            /* set by init, passed back to exec and free_state */
    int nthreads;           /* threads the kernel may use (OpenMP) */
    unsigned const_mask;    /* bit i set: input i holds the same data on every run (weights): init may pack it */
} krn_call;

/* What a kernel's init chose, for profiles and slow-path warnings (kernels know no node names; the planner
 * adds them). */
typedef struct krn_impl_info {
    char impl[192];  /* implementation and layouts, e.g. "jit:avx512_core src aBcd16b wei ABcd16b16a dst aBcd16b" */
    int slow;        /* a reference implementation where a fast one should exist (oneDNN "ref", scalar loops) */
    int reorders;    /* layout conversions this kernel runs on every exec */
} krn_impl_info;

/* Copy src into dst[cap], truncating; dst is always NUL-terminated. */
static inline void krn_str_copy(char *dst, size_t cap, const char *src) {
    size_t n = 0;
    if (!cap) return;
    while (src[n] && n + 1 < cap) n++;
    for (size_t i = 0; i < n; i++) dst[i] = src[i];
    dst[n] = 0;
}

typedef struct krn_kernel {
    const char *name;
    eng_status (*init)(krn_call *c); /* may be NULL */
    eng_status (*exec)(krn_call *c);
    void (*free_state)(void *state); /* may be NULL */
    /* Fill *info from the state init left (state may be NULL: no init, or a reference path). May be NULL. */
    void (*describe)(const krn_call *c, krn_impl_info *info);
} krn_kernel;

typedef struct krn_backend {
    const char *name;        /* "cpu", "cuda" */
    const krn_kernel *const *tables; /* NULL-terminated list of {NULL}-terminated kernel arrays */
} krn_backend;

const krn_backend *krn_backend_cpu(void);
/* Kernel by name, NULL if this backend has none. */
const krn_kernel *krn_backend_find(const krn_backend *b, const char *name);

#endif
