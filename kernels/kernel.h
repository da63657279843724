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

typedef struct krn_kernel {
    const char *name;
    eng_status (*init)(krn_call *c); /* may be NULL */
    eng_status (*exec)(krn_call *c);
    void (*free_state)(void *state); /* may be NULL */
} krn_kernel;

typedef struct krn_backend {
    const char *name;        /* "cpu", "cuda" */
    const krn_kernel *const *tables; /* NULL-terminated list of {NULL}-terminated kernel arrays */
} krn_backend;

const krn_backend *krn_backend_cpu(void);
/* Kernel by name, NULL if this backend has none. */
const krn_kernel *krn_backend_find(const krn_backend *b, const char *name);

#endif
