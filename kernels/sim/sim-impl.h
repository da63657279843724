/* sim-impl.h - what the sim backend's files share (sim-backend.c: memory, copies, kernels; sim-graph.c: graphs).
 * Not part of the library's interface. */
#ifndef KRN_SIM_IMPL_H
#define KRN_SIM_IMPL_H

#include <stdatomic.h>

#include "../backend-impl.h"

typedef struct sim_capture sim_capture;

/* A sim execution context: its device and, between graph_begin and graph_end, the recording that its kernel execs
 * and copies go to instead of running (sim-graph.c). */
struct krn_ctx {
    int dev;
    krn_ctx *after;       /* the context of the last event this one waited for (until its next bucketed all-reduce) */
    atomic_long waiting;  /* bucketed all-reduces that waited for this context's events since its last kernel / sync */
    sim_capture *cap;
    eng_status fault;      /* a kernel of a launched graph failed: reported (and cleared) by the next sync */
    char fault_msg[512];
};

/* sim-backend.c */
int sim_owns(const void *p, size_t n);                    /* [p, p+n) inside one sim block */
int sim_should_fail(const char *name);                    /* TENSORD_SIM_FAIL_KERNEL: this run of kernel `name` fails */
/* Device health (TENSORD_SIM_LOSE_DEVICE=name[:N[:D]]): the gate every kernel exec on device dev passes, a graph's
 * replay included: OK, or a failure that names the device: the injected launch failure (TENSORD_SIM_FAIL_KERNEL),
 * the injected sticky fault that loses the device, or "device lost" when it was lost before. */
eng_status sim_exec_gate(int dev, const char *name);
/* OK while device dev works; else a status naming the device, `what` (a copy, a sync, an allocation) and the error
 * that lost it, as every call on a CUDA device fails after a sticky error. */
eng_status sim_lost_check(int dev, const char *what);
/* Run kernel k's init or exec on call c now: c's sim tensors opened for the call, closed after. */
eng_status sim_kernel_run(const krn_kernel *k, krn_call *c, int init);
/* A copy queued on c (recorded while c captures); dst_dev / src_dev: that side is sim memory. */
eng_status sim_copy_in(krn_ctx *c, void *dst, const void *src, size_t n, int dst_dev, int src_dev);

/* sim-graph.c: while c->cap is set, sim-backend.c hands each kernel exec and copy (already checked) here. */
eng_status sim_graph_record_call(krn_ctx *c, const krn_kernel *k, const krn_call *call, const char *name);
eng_status sim_graph_record_copy(krn_ctx *c, void *dst, const void *src, size_t n, int dst_dev, int src_dev);
/* ctx_sync: a capturing context's sync invalidates the capture (as CUDA's does) and fails; else the fault a launched
 * graph's kernel left, once; else OK. */
eng_status sim_graph_sync(krn_ctx *c);
void sim_graph_ctx_free(krn_ctx *c);                      /* drops an unfinished capture */
eng_status sim_graph_begin(krn_ctx *c);
eng_status sim_graph_end(krn_ctx *c, krn_graph **out);
eng_status sim_graph_launch(krn_ctx *c, krn_graph *g);
void sim_graph_free(krn_graph *g);

#endif
