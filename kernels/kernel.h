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
    eng_dtype compute;      /* reduced-precision plans: the dtype the kernel multiplies in (ENG_DTYPE_BF16 / F16),
                             * with fp32 accumulation; its float inputs and outputs may then be f32 or that dtype.
                             * ENG_DTYPE_UNDEFINED: compute in the dtype of the tensors (the fp32 path) */
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
    /* Reduced precision: 1 if this kernel can run call c (shapes, dtypes, params final; no data) with
     * c->compute == dt fast on this machine, the f32/bf16 dtypes of c's float inputs and outputs as given.
     * NULL: the kernel computes only in its tensors' own dtypes. */
    int (*compute_ok)(const krn_call *c, eng_dtype dt);
    /* Reduced precision, for kernels that compute in fp32 (LayerNorm, Add, pooling): nonzero if call c can read
     * and write its float activations in dt where they are given so: 1 converting inside (a pass more), 2 natively
     * (oneDNN's bf16 pooling). A bf16 plan then stores an activation in bf16 between, say, a LayerNorm and the
     * matmuls that read it. NULL: fp32 tensors only. */
    int (*io_ok)(const krn_call *c, eng_dtype dt);
} krn_kernel;

typedef struct krn_backend {
    const char *name;        /* "cpu", "cuda" */
    const krn_kernel *const *tables; /* NULL-terminated list of {NULL}-terminated kernel arrays */
    /* Whether this backend runs compute dtype dt (ENG_DTYPE_BF16, ENG_DTYPE_F16, ENG_DTYPE_I8) fast on this
     * machine: OK, or UNSUPPORTED with a message naming what is missing (an ISA, a device capability). */
    eng_status (*precision_check)(eng_dtype dt);
} krn_backend;

const krn_backend *krn_backend_cpu(void);
/* Kernel by name, NULL if this backend has none. */
const krn_kernel *krn_backend_find(const krn_backend *b, const char *name);
/* Kernel by name and compute dtype: the kernel named `name` if it computes in dt (ENG_DTYPE_F32 / UNDEFINED:
 * every kernel; a reduced precision: kernels with compute_ok), else NULL. Whether one call of it can (its
 * shapes and params) is compute_ok's answer. */
const krn_kernel *krn_backend_find_dtype(const krn_backend *b, const char *name, eng_dtype dt);

#endif
