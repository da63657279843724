/* backend-impl.h - the body of a backend (kernel.h's opaque krn_backend), in the spirit of ggml's
 * ggml-backend-impl.h. Backends fill one of these: kernels/cpu/cpu-backend.c, kernels/sim/sim-backend.c and the
 * CUDA plugin (kernels/cuda/cuda-backend.cu, loaded by kernels/backend.c). Engine code uses kernel.h's functions.
 *
 * A NULL hook means the host default: no context, eng_alloc buffers, memcpy copies, no-op events. A device backend
 * sets all of them. Hooks never exit or abort: they return a status with a message naming the device.
 */
#ifndef KRN_BACKEND_IMPL_H
#define KRN_BACKEND_IMPL_H

#include "kernel.h"

/* Bumped whenever this struct changes: the CUDA plugin is built from the same tree, and one built from another is
 * refused at load instead of called through the wrong layout. */
#define KRN_BACKEND_ABI 7

struct krn_backend {
    int abi;                         /* KRN_BACKEND_ABI */
    const char *name;                /* "cpu", "cuda", "sim" */
    const krn_kernel *const *tables; /* NULL-terminated list of {NULL}-terminated kernel arrays */
    eng_status (*precision_check)(eng_dtype dt);
    int is_host;                     /* tensors are host memory */
    size_t alignment;                /* of buffers from alloc */
    int (*device_count)(void);
    eng_status (*mem_info)(int dev, size_t *free_b, size_t *total_b);
    /* execution context */
    eng_status (*ctx_new)(int dev, krn_ctx **out);
    void (*ctx_free)(krn_ctx *c);
    eng_status (*ctx_sync)(krn_ctx *c);
    eng_status (*ctx_enter)(krn_ctx *c); /* make the calling thread launch on c's device (before kernels run) */
    /* buffers */
    eng_status (*alloc)(krn_ctx *c, size_t nbytes, void **out);
    void (*free)(krn_ctx *c, void *p);
    eng_status (*host_alloc)(size_t nbytes, void **out);
    void (*host_free)(void *p);
    eng_status (*set)(krn_ctx *c, void *dst, const void *host_src, size_t n);
    eng_status (*get)(krn_ctx *c, void *host_dst, const void *src, size_t n);
    eng_status (*copy)(krn_ctx *c, void *dst, const void *src, size_t n);
    /* events */
    eng_status (*event_new)(krn_ctx *c, krn_event **out);
    eng_status (*event_record)(krn_ctx *c, krn_event *e);
    eng_status (*event_wait)(krn_ctx *c, krn_event *e);
    eng_status (*event_sync)(krn_event *e);
    void (*event_free)(krn_event *e);
    /* collectives among n ranks of this backend in one process, one per device (CUDA: NCCL, ncclCommInitAll); each
     * rank calls from its own thread. NULL: this backend has none (replicas then all-reduce through host memory). */
    eng_status (*comm_new)(int n, const int *devices, krn_comm **out);
    eng_status (*comm_allreduce)(krn_comm *cm, int rank, krn_ctx *c, float *buf, size_t n, float prescale);
    void (*comm_free)(krn_comm *cm);
    /* graphs: record the work queued on a context and replay it (CUDA Graphs). NULL: this backend has none (all four
     * set, or none). graph_begin: from now on work queued on c (kernel execs, copies) is recorded, not run; the host
     * calls that queue it still return their errors. graph_end: stop recording; *out the graph (out NULL: discard what
     * was recorded); an error when the capture was invalidated, with c left usable either way. graph_launch: queue the
     * recorded work on c, in order, with the pointers and sizes it had when recorded. graph_free: after the work it
     * queued has finished (the caller synchronises first). */
    eng_status (*graph_begin)(krn_ctx *c);
    eng_status (*graph_end)(krn_ctx *c, krn_graph **out);
    eng_status (*graph_launch)(krn_ctx *c, krn_graph *g);
    void (*graph_free)(krn_graph *g);
    /* multi-process collectives (kernel.h's krn_comm_new_ranks): an id made by global rank 0's process, and a
     * communicator of nranks ranks from it, of which this process holds nlocal (global ranks first_rank ..
     * first_rank+nlocal-1 on devices[]); comm_allreduce / comm_free then take the local rank index. NULL: this
     * backend has none (processes then exchange the replicas' sums through host memory and MPI). */
    eng_status (*comm_id_new)(krn_comm_id *id);
    eng_status (*comm_new_ranks)(const krn_comm_id *id, int nranks, int first_rank, int nlocal, const int *devices,
                                 krn_comm **out);
    /* bucketed collectives: a bucket's all-reduces as one group on c (krn_comm_allreduce_many); NULL: one by one
     * through comm_allreduce */
    eng_status (*comm_allreduce_many)(krn_comm *cm, int rank, krn_ctx *c, float *const *bufs, const size_t *ns,
                                      int count, float prescale);
    /* device health: 1 when device dev is lost, that is, a sticky error (CUDA: an illegal address, a launch failure,
     * an uncorrectable ECC error, ...) corrupted its context, so that every later kernel, copy and sync on it fails
     * until the process restarts; why[cap] (why may be NULL) then gets the first such error. 0 while it works. The
     * backend marks a device lost process-wide, once, when one of its hooks or kernels first sees a sticky error
     * there, and that error's message says the device is lost. Thread-safe and cheap (an atomic load): callers may
     * ask before every run. NULL: this backend never loses a device (the CPU). */
    int (*device_lost)(int dev, char *why, size_t cap);
};

/* The CUDA plugin's one exported symbol (build/libtensord_cuda.so): the backend when the plugin's own checks pass
 * (driver, at least one device), else NULL with why[] saying what is missing. */
typedef const krn_backend *(*krn_cuda_entry_fn)(char *why, size_t whylen);
#define KRN_CUDA_ENTRY "tensord_cuda_backend"

const krn_backend *krn_backend_sim(void);
/* sim's record of its bucketed collectives (tests; counted over the process since the last reset): groups issued
 * (krn_comm_allreduce_many calls, every rank counted), the all-reduces in them, and how many groups were issued on
 * a context waiting for an event of another context that then still ran a kernel before its next sync (the
 * all-reduce overlapped that context's work: a bucket sent while the backward pass went on). */
typedef struct krn_sim_stats { long groups, allreduces, overlapped; } krn_sim_stats;
void krn_sim_stats_get(krn_sim_stats *out);
void krn_sim_stats_reset(void);
/* A symbol of the loaded CUDA plugin (benchmarks: cuda_blas_peak_tflops), NULL when it is not loaded or lacks it. */
void *krn_cuda_plugin_symbol(const char *name);

#endif
