/* kernel.h - the backend dispatch interface.
 *
 * A backend (the CPU; CUDA, loaded as a plugin, kernels/cuda/; "sim", a host-memory test device) is a table of
 * kernels looked up by name at plan time, plus where its tensors live (its buffers) and how work is queued on it
 * (its execution context). The planner places each node on the plan's backend where that backend has the kernel
 * and the kernel supports the call, and on the CPU otherwise, moving tensors between the two with counted copies
 * (engine/plan/plan-place.c). The backend's struct body is in kernels/backend-impl.h: engine code sees the opaque
 * handle and the functions below. A kernel computes one
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

typedef struct krn_backend krn_backend;
/* A backend's execution context: on CUDA a device, a stream, library handles and a workspace; one per plan (so one
 * stream per batch worker). NULL on the CPU, which needs none. Kernels of a backend cast it to their own type. */
typedef struct krn_ctx krn_ctx;

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
    krn_ctx *ctx;           /* the backend's execution context (NULL on the CPU); device kernels queue work on it
                             * and return without waiting; in/out data are then that backend's buffers */
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
    /* Whether this kernel runs call c (shapes, dtypes, params final; no data) on its backend: 1 yes, 0 no (the
     * planner then places the node on the CPU). NULL: every call its exec accepts. CPU kernels leave it NULL. */
    int (*supports)(const krn_call *c);
    /* Device kernels that validate data they cannot return an error for while queued (an index out of range):
     * called by the planner after the run's sync, with the run's call; returns the error the CPU kernel would have
     * (naming the index, its position and the bound). NULL: nothing to check. */
    eng_status (*check)(const krn_call *c);
} krn_kernel;

/* ---- backends ---- */
const krn_backend *krn_backend_cpu(void);
/* The backend a device name selects: "cpu", "cuda" / "cuda:N" (the CUDA plugin, when built and a device is there),
 * "sim" / "sim:N" (tests). *device gets N (0 if not given). NULL with a message naming what is missing when the
 * backend is not there (no plugin, no driver, no device, N out of range). */
eng_status krn_backend_by_name(const char *spec, const krn_backend **out, int *device);
/* "auto": CUDA device 0 when one is there, else the CPU. Silent: callers log krn_backend_auto_note() once, where
 * their log goes ("no CUDA device, using CPU (<why>)" or "using CUDA (N devices)"). */
const krn_backend *krn_backend_auto(int *device);
const char *krn_backend_auto_note(void);
/* Why the CUDA backend is not there ("" when it is): no plugin built, no driver, no device. */
const char *krn_cuda_unavailable_reason(void);

const char *krn_backend_name(const krn_backend *b);
int krn_backend_is_host(const krn_backend *b); /* 1: its tensors are host memory (the CPU) */
/* Whether this backend runs compute dtype dt (ENG_DTYPE_BF16, ENG_DTYPE_F16, ENG_DTYPE_I8) fast on this
 * machine: OK, or UNSUPPORTED with a message naming what is missing (an ISA, a device capability). */
eng_status krn_backend_precision_check(const krn_backend *b, eng_dtype dt);
int krn_backend_device_count(const krn_backend *b);
/* Free and total memory of device dev (host backends: 0, 0). */
eng_status krn_backend_mem_info(const krn_backend *b, int dev, size_t *free_b, size_t *total_b);

/* Device health: 1 when device dev of b is lost (a sticky error corrupted its context: every later call on it fails
 * until the process restarts; only a restart cures it), with the first error that lost it in why[cap] (why may be
 * NULL); 0 while it works, and always on host backends. Thread-safe, cheap. */
int krn_backend_device_lost(const krn_backend *b, int dev, char *why, size_t cap);

/* Execution contexts (NULL *out and OK for host backends). */
eng_status krn_ctx_new(const krn_backend *b, int device, krn_ctx **out);
void krn_ctx_free(const krn_backend *b, krn_ctx **c);
eng_status krn_ctx_sync(const krn_backend *b, krn_ctx *c); /* wait for all work queued on c; its first error */
/* Make the calling thread's kernel launches go to c's device (CUDA: cudaSetDevice); call before running kernels of
 * c on a thread (a batch worker, a replica). */
eng_status krn_ctx_enter(const krn_backend *b, krn_ctx *c);

/* Buffers of backend b (host backends: eng_alloc). alloc fails with OUT_OF_MEMORY naming the bytes and the device. */
eng_status krn_buf_alloc(const krn_backend *b, krn_ctx *c, size_t nbytes, void **out);
void krn_buf_free(const krn_backend *b, krn_ctx *c, void *p);
/* Host memory the backend copies from and to fast (CUDA: pinned); eng_alloc for host backends. */
eng_status krn_host_alloc(const krn_backend *b, size_t nbytes, void **out);
void krn_host_free(const krn_backend *b, void *p);
/* Copies queued on c: host -> b, b -> host, b -> b. The host side must stay valid until krn_ctx_sync. */
eng_status krn_buf_set(const krn_backend *b, krn_ctx *c, void *dst, const void *host_src, size_t n);
eng_status krn_buf_get(const krn_backend *b, krn_ctx *c, void *host_dst, const void *src, size_t n);
eng_status krn_buf_copy(const krn_backend *b, krn_ctx *c, void *dst, const void *src, size_t n);
/* Events order work across contexts (a gradient bucket's all-reduce after the backward kernels that wrote it):
 * record marks the point reached on c; wait makes later work on c wait for it; sync blocks the host. Host
 * backends: no-ops (work is done when the call returns). */
typedef struct krn_event krn_event;
/* Collectives on device buffers among n ranks, one per device, in one process (CUDA: NCCL). krn_comm_allreduce, called
 * by every rank (each from its own thread, with its own context): buf (n floats, rank's device memory) becomes, on
 * every rank, the sum over ranks of prescale_r * buf_r, summed in rank order where the backend can (deterministic).
 * Queued on c. UNSUPPORTED when the backend has no collectives. */
typedef struct krn_comm krn_comm;
int krn_backend_has_comm(const krn_backend *b);
eng_status krn_comm_new(const krn_backend *b, int n, const int *devices, krn_comm **out);
eng_status krn_comm_allreduce(const krn_backend *b, krn_comm *cm, int rank, krn_ctx *c, float *buf, size_t n, float prescale);
void krn_comm_free(const krn_backend *b, krn_comm **cm);
/* Collectives spanning processes (and hosts): one communicator of nranks ranks, of which this process holds nlocal,
 * global ranks first_rank .. first_rank+nlocal-1 on devices[0..nlocal-1]. Rank 0's process makes the id
 * (krn_comm_id_new: CUDA ncclGetUniqueId) and hands it to every other process (engine/train/rendezvous.h: MPI or the
 * TENSORD_COORDINATOR); every process then calls krn_comm_new_ranks with it, and all of them block until all
 * nranks ranks joined (or the backend's timeout). krn_comm_allreduce and krn_comm_free then work on the result with
 * the LOCAL rank index 0..nlocal-1; the sum covers all nranks ranks. UNSUPPORTED when the backend has none. */
#define KRN_COMM_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES */
typedef struct krn_comm_id {
    unsigned char bytes[KRN_COMM_ID_BYTES];
} krn_comm_id;
int krn_backend_has_comm_ranks(const krn_backend *b);
eng_status krn_comm_id_new(const krn_backend *b, krn_comm_id *id);
eng_status krn_comm_new_ranks(const krn_backend *b, const krn_comm_id *id, int nranks, int first_rank, int nlocal,
                              const int *devices, krn_comm **out);
/* A bucket of all-reduces as one group (CUDA: ncclGroupStart / End around count ncclAllReduce calls on c's stream):
 * for each j, bufs[j] (ns[j] floats) becomes the sum over ranks of prescale_r * bufs_r[j], as krn_comm_allreduce
 * would make it. Every rank calls with the same count and sizes, in the same order as its other collectives.
 * Backends without the grouped hook run the all-reduces one by one. */
eng_status krn_comm_allreduce_many(const krn_backend *b, krn_comm *cm, int rank, krn_ctx *c, float *const *bufs,
                                   const size_t *ns, int count, float prescale);
eng_status krn_event_new(const krn_backend *b, krn_ctx *c, krn_event **out);
eng_status krn_event_record(const krn_backend *b, krn_ctx *c, krn_event *e);
eng_status krn_event_wait(const krn_backend *b, krn_ctx *c, krn_event *e);
eng_status krn_event_sync(const krn_backend *b, krn_event *e);
void krn_event_free(const krn_backend *b, krn_event **e);

/* Graphs (CUDA Graphs): the work queued on a context between begin and end is recorded instead of run, and a launch
 * queues all of it again at once, with the pointers, sizes and kernel state it had when recorded (so those must stay
 * valid and unchanged while the graph lives: a plan's arena, its pinned staging buffers, its steps' params and state).
 * A kernel exec or copy queued while recording returns its host-side errors as usual; a kernel that must allocate or
 * synchronise in exec fails the capture (its error), and graph_end then reports it. After an error, the caller ends
 * the capture with krn_graph_end(b, c, NULL) (discard): c is then usable as before. UNSUPPORTED where the backend has
 * no graphs (krn_backend_has_graphs 0: every host backend). */
typedef struct krn_graph krn_graph;
int krn_backend_has_graphs(const krn_backend *b);
eng_status krn_graph_begin(const krn_backend *b, krn_ctx *c);
/* out NULL: discard the recording; else *out the graph (NULL on failure). */
eng_status krn_graph_end(const krn_backend *b, krn_ctx *c, krn_graph **out);
eng_status krn_graph_launch(const krn_backend *b, krn_ctx *c, krn_graph *g);
/* Sets *g to NULL. Call after the context that launched it has been synchronised. */
void krn_graph_free(const krn_backend *b, krn_graph **g);

/* Kernel by name, NULL if this backend has none. */
const krn_kernel *krn_backend_find(const krn_backend *b, const char *name);
/* Kernel by name and compute dtype: the kernel named `name` if it computes in dt (ENG_DTYPE_F32 / UNDEFINED:
 * every kernel; a reduced precision: kernels with compute_ok), else NULL. Whether one call of it can (its
 * shapes and params) is compute_ok's answer. */
const krn_kernel *krn_backend_find_dtype(const krn_backend *b, const char *name, eng_dtype dt);

#endif
