/* sim-backend.c - "sim": a device backend in host memory, for testing everything above the kernels without a GPU.
 *
 * It behaves as a device does where that matters to the engine: its buffers are not host memory the CPU may touch
 * (they are mapped PROT_NONE, and opened only while a sim kernel or a sim copy uses them, so a CPU step handed a
 * device pointer faults at once instead of reading by luck); data moves only through set/get/copy; it has a memory
 * size (TENSORD_SIM_MEMORY bytes per device, default 1 GiB: allocations beyond it fail as a GPU's would) and a device
 * count (TENSORD_SIM_DEVICES, default 2). Its kernels are a subset of the CPU's, run through wrappers that check
 * every tensor they get is sim memory: the ops it lacks (LayerNormalization, Gather, ...) exercise the planner's
 * fallback and copies. Fault injection for the bad-condition tests: TENSORD_SIM_FAIL_KERNEL=name[:N] makes the N-th
 * exec of kernel `name` in this process (every one without :N) fail as a CUDA launch failure does (a graph's replay of
 * it counts as an exec, and fails at the next sync, as a fault in a CUDA graph surfaces);
 * TENSORD_SIM_FAIL_INIT=name makes its init fail as a cuBLASLt / cuDNN algorithm search can;
 * TENSORD_SIM_LOSE_DEVICE=name[:N[:D]] makes the N-th exec of kernel `name` (counting only execs on sim:D when D is
 * given; every exec without N) fail as a sticky CUDA error does (an illegal address): the device that ran it is lost
 * for the rest of the process (krn_backend_device_lost reports it, with that first error), and every later kernel,
 * copy, allocation, context and sync on it fails naming it, while the other sim devices and the CPU keep working.
 * Graphs, recorded and
 * replayed as CUDA Graphs are: sim-graph.c.
 * Its work is done when a call returns (contexts and events order nothing), but it records what a device would
 * have overlapped: an event remembers the context it was recorded on, a context that waits for it remembers that
 * context, and a bucketed all-reduce issued on the waiting context counts as overlapped when the recording context
 * still runs a kernel before its next sync (krn_sim_stats: a gradient bucket sent while the backward pass went on).
 * Never for serving: `--device sim` says in the log that it is a test device.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "sim-impl.h"
#include "../backend-impl.h"
#include "sim-comm.h"

typedef struct sim_block { char *base; size_t len, user; int dev; } sim_block;

static pthread_mutex_t sim_mu = PTHREAD_MUTEX_INITIALIZER;
static sim_block *sim_blocks;
static int sim_nblocks, sim_capblocks;
static size_t sim_used[64];

struct krn_event { krn_ctx *src; };

static atomic_long sim_groups, sim_allreduces, sim_overlapped;

void krn_sim_stats_get(krn_sim_stats *out) {
    out->groups = atomic_load(&sim_groups);
    out->allreduces = atomic_load(&sim_allreduces);
    out->overlapped = atomic_load(&sim_overlapped);
}

void krn_sim_stats_reset(void) {
    atomic_store(&sim_groups, 0);
    atomic_store(&sim_allreduces, 0);
    atomic_store(&sim_overlapped, 0);
}

static int sim_devices(void) {
    const char *e = getenv("TENSORD_SIM_DEVICES");
    int n = e && *e ? atoi(e) : 2;
    return n < 1 ? 1 : n > 64 ? 64 : n;
}

static size_t sim_memory(void) {
    const char *e = getenv("TENSORD_SIM_MEMORY");
    long long n = e && *e ? atoll(e) : (1LL << 30);
    return n > 0 ? (size_t)n : ((size_t)1 << 30);
}

static size_t page_size(void) {
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096;
}

static eng_status sim_mem_info(int dev, size_t *free_b, size_t *total_b) {
    pthread_mutex_lock(&sim_mu);
    size_t used = sim_used[dev & 63];
    pthread_mutex_unlock(&sim_mu);
    *total_b = sim_memory();
    *free_b = used < *total_b ? *total_b - used : 0;
    return ENG_STATUS_OK;
}

static eng_status sim_alloc(krn_ctx *c, size_t n, void **out) {
    int dev = c ? c->dev : 0;
    size_t ps = page_size(), len = ((n ? n : 1) + ps - 1) / ps * ps;
    *out = NULL;
    ENG_TRY(sim_lost_check(dev, "an allocation"));
    pthread_mutex_lock(&sim_mu);
    size_t total = sim_memory(), used = sim_used[dev & 63];
    if (used + len > total) {
        pthread_mutex_unlock(&sim_mu);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "sim:%d: out of memory allocating %.2f MiB (free %.2f MiB of %.2f MiB)",
                       dev, (double)n / 1048576.0, (double)(total - used) / 1048576.0, (double)total / 1048576.0);
    }
    if (sim_nblocks == sim_capblocks) {
        int nc = sim_capblocks ? sim_capblocks * 2 : 64;
        sim_block *b = realloc(sim_blocks, (size_t)nc * sizeof *b);
        if (!b) {
            pthread_mutex_unlock(&sim_mu);
            return eng_err(ENG_STATUS_OUT_OF_MEMORY, "sim:%d: out of host memory", dev);
        }
        sim_blocks = b;
        sim_capblocks = nc;
    }
    void *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        pthread_mutex_unlock(&sim_mu);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "sim:%d: cannot map %zu bytes", dev, len);
    }
    sim_blocks[sim_nblocks++] = (sim_block){p, len, n, dev};
    sim_used[dev & 63] += len;
    pthread_mutex_unlock(&sim_mu);
    *out = p;
    return ENG_STATUS_OK;
}

static void sim_free(krn_ctx *c, void *p) {
    pthread_mutex_lock(&sim_mu);
    for (int i = 0; i < sim_nblocks; i++)
        if (sim_blocks[i].base == p) {
            munmap(p, sim_blocks[i].len);
            sim_used[sim_blocks[i].dev & 63] -= sim_blocks[i].len;
            sim_blocks[i] = sim_blocks[--sim_nblocks];
            break;
        }
    pthread_mutex_unlock(&sim_mu);
}

/* Whether [p, p+n) lies inside one sim block. */
int sim_owns(const void *p, size_t n) {
    const char *c = p;
    int ok = 0;
    pthread_mutex_lock(&sim_mu);
    for (int i = 0; i < sim_nblocks && !ok; i++)
        ok = c >= sim_blocks[i].base && c + n <= sim_blocks[i].base + sim_blocks[i].len;
    pthread_mutex_unlock(&sim_mu);
    return ok;
}

/* Open (prot = read/write) or close (PROT_NONE) the pages covering [p, p+n). */
static void sim_prot(const void *p, size_t n, int open) {
    if (!p || !n) return;
    size_t ps = page_size();
    uintptr_t a = (uintptr_t)p / ps * ps, e = ((uintptr_t)p + n + ps - 1) / ps * ps;
    mprotect((void *)a, e - a, open ? PROT_READ | PROT_WRITE : PROT_NONE);
}

static eng_status sim_ctx_new(int dev, krn_ctx **out) {
    ENG_TRY(sim_lost_check(dev, "creating a context"));
    krn_ctx *c = calloc(1, sizeof *c);
    if (!c) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "sim:%d: out of memory", dev);
    c->dev = dev;
    *out = c;
    return ENG_STATUS_OK;
}

static void sim_ctx_free(krn_ctx *c) {
    if (c && c->cap) sim_graph_ctx_free(c);
    free(c);
}
static eng_status sim_ctx_sync(krn_ctx *c) {
    if (!c) return ENG_STATUS_OK;
    atomic_store(&c->waiting, 0); /* what waited for it now follows all of its work */
    eng_status st = sim_graph_sync(c);
    return st != ENG_STATUS_OK ? st : sim_lost_check(c->dev, "synchronising a context");
}

eng_status sim_copy_in(krn_ctx *c, void *dst, const void *src, size_t n, int dst_dev, int src_dev) {
    if ((dst_dev && !sim_owns(dst, n)) || (src_dev && !sim_owns(src, n)))
        return eng_err(ENG_STATUS_INTERNAL, "sim:%d: a copy of %zu bytes names memory that is not the device's", c ? c->dev : 0, n);
    ENG_TRY(sim_lost_check(c ? c->dev : 0, "a copy"));
    if (c && c->cap) return sim_graph_record_copy(c, dst, src, n, dst_dev, src_dev);
    if (dst_dev) sim_prot(dst, n, 1);
    if (src_dev) sim_prot(src, n, 1);
    memmove(dst, src, n);
    if (dst_dev) sim_prot(dst, n, 0);
    if (src_dev) sim_prot(src, n, 0);
    return ENG_STATUS_OK;
}
static eng_status sim_set(krn_ctx *c, void *dst, const void *src, size_t n) { return sim_copy_in(c, dst, src, n, 1, 0); }
static eng_status sim_get(krn_ctx *c, void *dst, const void *src, size_t n) { return sim_copy_in(c, dst, src, n, 0, 1); }
static eng_status sim_copy(krn_ctx *c, void *dst, const void *src, size_t n) { return sim_copy_in(c, dst, src, n, 1, 1); }

static eng_status sim_event_new(krn_ctx *c, krn_event **out) {
    *out = calloc(1, sizeof **out);
    return *out ? ENG_STATUS_OK : eng_err(ENG_STATUS_OUT_OF_MEMORY, "sim: out of memory");
}
static void sim_event_free(krn_event *e) { free(e); }
static eng_status sim_event_record(krn_ctx *c, krn_event *e) {
    e->src = c;
    return ENG_STATUS_OK;
}
static eng_status sim_event_wait(krn_ctx *c, krn_event *e) {
    if (c && e->src != c) c->after = e->src;
    return ENG_STATUS_OK;
}

/* A bucket: the all-reduces one by one (each a rendezvous of the ranks), every one made whatever failed before. */
static eng_status sim_comm_allreduce_many(krn_comm *cm, int rank, krn_ctx *c, float *const *bufs, const size_t *ns,
                                          int count, float prescale) {
    eng_status first = ENG_STATUS_OK;
    char err[512] = "";
    for (int j = 0; j < count; j++) {
        eng_status st = sim_comm_allreduce(cm, rank, c, bufs[j], ns[j], prescale);
        if (st != ENG_STATUS_OK && first == ENG_STATUS_OK) {
            first = st;
            snprintf(err, sizeof err, "%s", eng_last_error());
        }
    }
    atomic_fetch_add(&sim_groups, 1);
    atomic_fetch_add(&sim_allreduces, count);
    if (c && c->after) atomic_fetch_add(&c->after->waiting, 1);
    if (c) c->after = NULL;
    return first == ENG_STATUS_OK ? first : eng_err(first, "%s", err);
}

/* ---- kernels: the CPU's, on opened sim memory ---- */

/* TENSORD_SIM_FAIL_KERNEL=name[:N]: nonzero if this exec of kernel `name` is the one to fail. */
int sim_should_fail(const char *name) {
    const char *e = getenv("TENSORD_SIM_FAIL_KERNEL");
    if (!e || !*e) return 0;
    size_t n = strcspn(e, ":");
    if (strlen(name) != n || strncmp(e, name, n) != 0) return 0;
    if (!e[n]) return 1;
    static atomic_long seen;
    return atomic_fetch_add(&seen, 1) + 1 == atol(e + n + 1);
}

/* ---- device health: TENSORD_SIM_LOSE_DEVICE ---- */

#define SIM_MAX_DEVICES 64
static atomic_int sim_lost[SIM_MAX_DEVICES];   /* 1: lost; its reason is written (under sim_lost_mu) before */
static char sim_lost_why[SIM_MAX_DEVICES][320];
static pthread_mutex_t sim_lost_mu = PTHREAD_MUTEX_INITIALIZER;

/* TENSORD_SIM_LOSE_DEVICE=name[:N[:D]]: nonzero if this exec of kernel `name` on sim:dev is the one that loses it. */
static int sim_should_lose(const char *name, int dev) {
    const char *e = getenv("TENSORD_SIM_LOSE_DEVICE");
    if (!e || !*e) return 0;
    size_t n = strcspn(e, ":");
    if (strlen(name) != n || strncmp(e, name, n) != 0) return 0;
    if (!e[n]) return 1;
    char *end;
    long nth = strtol(e + n + 1, &end, 10);
    if (*end == ':' && atoi(end + 1) != dev) return 0;
    static atomic_long seen;
    return atomic_fetch_add(&seen, 1) + 1 == nth;
}

static int sim_dev_lost(int dev, char *why, size_t cap) {
    if (dev < 0 || dev >= SIM_MAX_DEVICES || !atomic_load(&sim_lost[dev])) return 0;
    if (why && cap) {
        pthread_mutex_lock(&sim_lost_mu);
        krn_str_copy(why, cap, sim_lost_why[dev]);
        pthread_mutex_unlock(&sim_lost_mu);
    }
    return 1;
}

eng_status sim_lost_check(int dev, const char *what) {
    char why[320];
    if (!sim_dev_lost(dev, why, sizeof why)) return ENG_STATUS_OK;
    return eng_err(ENG_STATUS_INTERNAL, "sim:%d: %s: device sim:%d is lost (an earlier sticky error: %s); every call on it "
                   "fails until the process restarts", dev, what, dev, why);
}

eng_status sim_exec_gate(int dev, const char *name) {
    char what[96];
    snprintf(what, sizeof what, "kernel '%s'", name);
    ENG_TRY(sim_lost_check(dev, what));
    if (sim_should_fail(name))
        return eng_err(ENG_STATUS_INTERNAL, "sim:%d: kernel '%s': injected launch failure (TENSORD_SIM_FAIL_KERNEL)", dev, name);
    if (!sim_should_lose(name, dev)) return ENG_STATUS_OK;
    if (dev >= 0 && dev < SIM_MAX_DEVICES) {
        pthread_mutex_lock(&sim_lost_mu);
        if (!atomic_load(&sim_lost[dev])) { /* the first error that lost it is the one kept */
            snprintf(sim_lost_why[dev], sizeof sim_lost_why[dev], "kernel '%s': injected illegal memory access "
                     "(TENSORD_SIM_LOSE_DEVICE)", name);
            atomic_store(&sim_lost[dev], 1);
        }
        pthread_mutex_unlock(&sim_lost_mu);
    }
    return eng_err(ENG_STATUS_INTERNAL, "sim:%d: kernel '%s': injected illegal memory access (TENSORD_SIM_LOSE_DEVICE): "
                   "a sticky error: device sim:%d is lost, and every later call on it fails until the process restarts",
                   dev, name, dev);
}

/* Tensor i of call c: its inputs, then its outputs. */
static const eng_tensor *sim_tensor(const krn_call *c, int i) { return i < c->nin ? &c->in[i] : &c->out[i - c->nin]; }

static void sim_open_call(const krn_call *c, int open) {
    for (int i = 0; i < c->nin + c->nout; i++) {
        const eng_tensor *t = sim_tensor(c, i);
        if (t->data && t->dtype != ENG_DTYPE_UNDEFINED) sim_prot(t->data, eng_tensor_nbytes(t), open);
    }
}

static eng_status sim_call(const krn_kernel *k, krn_call *c, int init, const char *name) {
    if (!k) return eng_err(ENG_STATUS_INTERNAL, "sim: the CPU has no kernel '%s'", name);
    int dev = c->ctx ? c->ctx->dev : -1;
    if (dev < 0) return eng_err(ENG_STATUS_INTERNAL, "sim kernel '%s' called without its context", name);
    for (int i = 0; i < c->nin + c->nout; i++) {
        const eng_tensor *t = sim_tensor(c, i);
        if (!t->data || t->dtype == ENG_DTYPE_UNDEFINED) continue;
        size_t nb = eng_tensor_nbytes(t);
        if (nb && !sim_owns(t->data, nb))
            return eng_err(ENG_STATUS_INTERNAL, "sim:%d: kernel '%s' %s %d is not device memory", dev, name,
                           i < c->nin ? "input" : "output", i < c->nin ? i : i - c->nin);
    }
    const char *fi = getenv("TENSORD_SIM_FAIL_INIT");
    if (init && fi && !strcmp(fi, name))
        return eng_err(ENG_STATUS_UNSUPPORTED, "sim:%d: kernel '%s': injected init failure (TENSORD_SIM_FAIL_INIT)", dev, name);
    char what[96];
    snprintf(what, sizeof what, "kernel '%s'%s", name, init ? " (init)" : "");
    ENG_TRY(sim_lost_check(dev, what));
    if (c->ctx->cap) { /* recorded, not run (sim-graph.c): TENSORD_SIM_FAIL_KERNEL counts when a launch runs it */
        if (init) /* as a CUDA kernel's init (allocations, algorithm searches) cannot run inside a capture */
            return eng_err(ENG_STATUS_INTERNAL, "sim:%d: kernel '%s': init during a graph capture", dev, name);
        return sim_graph_record_call(c->ctx, k, c, name);
    }
    if (!init) ENG_TRY(sim_exec_gate(dev, name));
    if (init && !k->init) return ENG_STATUS_OK;
    if (!init) atomic_fetch_add(&sim_overlapped, atomic_exchange(&c->ctx->waiting, 0));
    return sim_kernel_run(k, c, init);
}

eng_status sim_kernel_run(const krn_kernel *k, krn_call *c, int init) {
    sim_open_call(c, 1);
    krn_ctx *ctx = c->ctx;
    c->ctx = NULL; /* the CPU kernel runs as on the CPU */
    eng_status st = init ? k->init(c) : k->exec(c);
    c->ctx = ctx;
    sim_open_call(c, 0);
    return st;
}

/* sim computes no float64 (a call it refuses: the planner's supports() path). */
static int sim_supports(const krn_call *c) {
    for (int i = 0; i < c->nin; i++)
        if (c->in[i].dtype == ENG_DTYPE_F64) return 0;
    for (int i = 0; i < c->nout; i++)
        if (c->out[i].dtype == ENG_DTYPE_F64) return 0;
    return 1;
}

#define SIM_KERNEL(nm)                                                                                           \
    static const krn_kernel *sim_cpu_##nm(void) { return krn_backend_find(krn_backend_cpu(), #nm); }             \
    static eng_status sim_init_##nm(krn_call *c) { return sim_call(sim_cpu_##nm(), c, 1, #nm); }                \
    static eng_status sim_exec_##nm(krn_call *c) { return sim_call(sim_cpu_##nm(), c, 0, #nm); }                \
    static void sim_free_##nm(void *s) {                                                                         \
        const krn_kernel *k = sim_cpu_##nm();                                                                    \
        if (k && k->free_state) k->free_state(s);                                                                \
    }                                                                                                            \
    static void sim_describe_##nm(const krn_call *c, krn_impl_info *info) {                                      \
        const krn_kernel *k = sim_cpu_##nm();                                                                    \
        if (k && k->describe) k->describe(c, info);                                                              \
    }                                                                                                            \
    static int sim_compute_ok_##nm(const krn_call *c, eng_dtype dt) {                                            \
        const krn_kernel *k = sim_cpu_##nm();                                                                    \
        return k && k->compute_ok ? k->compute_ok(c, dt) : 0;                                                    \
    }                                                                                                            \
    static int sim_io_ok_##nm(const krn_call *c, eng_dtype dt) {                                                 \
        const krn_kernel *k = sim_cpu_##nm();                                                                    \
        return k && k->io_ok ? k->io_ok(c, dt) : 0;                                                              \
    }
#define SIM_ENTRY(nm) {#nm, sim_init_##nm, sim_exec_##nm, sim_free_##nm, sim_describe_##nm, sim_compute_ok_##nm,  \
                       sim_io_ok_##nm, sim_supports}

SIM_KERNEL(matmul)
SIM_KERNEL(conv)
SIM_KERNEL(pool)
SIM_KERNEL(batchnorm)
SIM_KERNEL(eltwise_unary)
SIM_KERNEL(eltwise_binary)
SIM_KERNEL(eltwise_cast)
SIM_KERNEL(softmax)
SIM_KERNEL(attention)
SIM_KERNEL(reduce)
SIM_KERNEL(transpose)
SIM_KERNEL(concat)
SIM_KERNEL(loss)
SIM_KERNEL(grad_loss)
SIM_KERNEL(grad_matmul)
SIM_KERNEL(grad_conv)
SIM_KERNEL(grad_act)
SIM_KERNEL(grad_softmax)
SIM_KERNEL(grad_reduce_to_shape)
SIM_KERNEL(grad_fill)
SIM_KERNEL(grad_pool)
SIM_KERNEL(grad_batchnorm)
SIM_KERNEL(optim_update)
SIM_KERNEL(optim_sum_squares)
SIM_KERNEL(optim_accumulate)

static const krn_kernel sim_kernels[] = {
    SIM_ENTRY(matmul), SIM_ENTRY(conv), SIM_ENTRY(pool), SIM_ENTRY(batchnorm), SIM_ENTRY(eltwise_unary),
    SIM_ENTRY(eltwise_binary), SIM_ENTRY(eltwise_cast), SIM_ENTRY(softmax), SIM_ENTRY(attention), SIM_ENTRY(reduce),
    SIM_ENTRY(transpose), SIM_ENTRY(concat), SIM_ENTRY(loss), SIM_ENTRY(grad_loss), SIM_ENTRY(grad_matmul), SIM_ENTRY(grad_conv),
    SIM_ENTRY(grad_act), SIM_ENTRY(grad_softmax), SIM_ENTRY(grad_reduce_to_shape), SIM_ENTRY(grad_fill),
    SIM_ENTRY(grad_pool), SIM_ENTRY(grad_batchnorm), SIM_ENTRY(optim_update), SIM_ENTRY(optim_sum_squares),
    SIM_ENTRY(optim_accumulate), {NULL},
};
static const krn_kernel *const sim_tables[] = {sim_kernels, NULL};

static eng_status sim_precision_check(eng_dtype dt) { return krn_backend_precision_check(krn_backend_cpu(), dt); }

static const krn_backend krn_sim_backend = {
    .abi = KRN_BACKEND_ABI, .name = "sim", .tables = sim_tables, .precision_check = sim_precision_check,
    .is_host = 0, .alignment = 64, .device_count = sim_devices, .mem_info = sim_mem_info,
    .ctx_new = sim_ctx_new, .ctx_free = sim_ctx_free, .ctx_sync = sim_ctx_sync,
    .alloc = sim_alloc, .free = sim_free, .set = sim_set, .get = sim_get, .copy = sim_copy,
    .event_new = sim_event_new, .event_record = sim_event_record, .event_wait = sim_event_wait,
    .event_free = sim_event_free,
    .comm_new = sim_comm_new, .comm_allreduce = sim_comm_allreduce, .comm_free = sim_comm_free, /* sim-comm.c */
    .comm_allreduce_many = sim_comm_allreduce_many,
    /* graphs */
    .graph_begin = sim_graph_begin, .graph_end = sim_graph_end, .graph_launch = sim_graph_launch,
    .graph_free = sim_graph_free,
    /* multi-process collectives */
    .comm_id_new = sim_comm_id_new, .comm_new_ranks = sim_comm_new_ranks,
    /* device health */
    .device_lost = sim_dev_lost,
};

const krn_backend *krn_backend_sim(void) { return &krn_sim_backend; }
