/* backend.c - kernel lookup in a backend's tables, the backend functions of kernel.h over backend-impl.h's hooks
 * (host defaults where a hook is NULL), and finding the backends: the CPU, the test device "sim", and the CUDA
 * plugin, loaded once per process from next to the executable. */
#include "backend-impl.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

static const krn_backend *be(const krn_backend *b) { return b ? b : krn_backend_cpu(); }

const char *krn_backend_name(const krn_backend *b) { return be(b)->name; }
int krn_backend_is_host(const krn_backend *b) { return be(b)->is_host; }

eng_status krn_backend_precision_check(const krn_backend *b, eng_dtype dt) {
    b = be(b);
    if (dt == ENG_DTYPE_UNDEFINED || dt == ENG_DTYPE_F32) return ENG_STATUS_OK;
    if (!b->precision_check) return eng_err(ENG_STATUS_UNSUPPORTED, "backend '%s' computes in fp32 only", b->name);
    return b->precision_check(dt);
}

int krn_backend_device_count(const krn_backend *b) {
    b = be(b);
    return b->device_count ? b->device_count() : 1;
}

eng_status krn_backend_mem_info(const krn_backend *b, int dev, size_t *free_b, size_t *total_b) {
    b = be(b);
    *free_b = *total_b = 0;
    return b->mem_info ? b->mem_info(dev, free_b, total_b) : ENG_STATUS_OK;
}

int krn_backend_device_lost(const krn_backend *b, int dev, char *why, size_t cap) {
    b = be(b);
    if (why && cap) why[0] = 0;
    return b->device_lost ? b->device_lost(dev, why, cap) != 0 : 0;
}

eng_status krn_ctx_new(const krn_backend *b, int device, krn_ctx **out) {
    b = be(b);
    *out = NULL;
    return b->ctx_new ? b->ctx_new(device, out) : ENG_STATUS_OK;
}

void krn_ctx_free(const krn_backend *b, krn_ctx **c) {
    b = be(b);
    if (*c && b->ctx_free) b->ctx_free(*c);
    *c = NULL;
}

eng_status krn_ctx_sync(const krn_backend *b, krn_ctx *c) {
    b = be(b);
    return b->ctx_sync ? b->ctx_sync(c) : ENG_STATUS_OK;
}

eng_status krn_ctx_enter(const krn_backend *b, krn_ctx *c) {
    b = be(b);
    return b->ctx_enter && c ? b->ctx_enter(c) : ENG_STATUS_OK;
}

eng_status krn_buf_alloc(const krn_backend *b, krn_ctx *c, size_t nbytes, void **out) {
    b = be(b);
    *out = NULL;
    if (b->alloc) return b->alloc(c, nbytes, out);
    *out = eng_alloc(nbytes ? nbytes : 1);
    if (!*out) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "cannot allocate %zu bytes of host memory", nbytes);
    return ENG_STATUS_OK;
}

void krn_buf_free(const krn_backend *b, krn_ctx *c, void *p) {
    b = be(b);
    if (!p) return;
    if (b->free) b->free(c, p);
    else eng_free(p);
}

eng_status krn_host_alloc(const krn_backend *b, size_t nbytes, void **out) {
    b = be(b);
    *out = NULL;
    if (b->host_alloc) return b->host_alloc(nbytes, out);
    *out = eng_alloc(nbytes ? nbytes : 1);
    if (!*out) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "cannot allocate %zu bytes of host memory", nbytes);
    return ENG_STATUS_OK;
}

void krn_host_free(const krn_backend *b, void *p) {
    b = be(b);
    if (!p) return;
    if (b->host_free) b->host_free(p);
    else eng_free(p);
}

eng_status krn_buf_set(const krn_backend *b, krn_ctx *c, void *dst, const void *src, size_t n) {
    b = be(b);
    if (b->set) return b->set(c, dst, src, n);
    if (n) memcpy(dst, src, n);
    return ENG_STATUS_OK;
}

eng_status krn_buf_get(const krn_backend *b, krn_ctx *c, void *dst, const void *src, size_t n) {
    b = be(b);
    if (b->get) return b->get(c, dst, src, n);
    if (n) memcpy(dst, src, n);
    return ENG_STATUS_OK;
}

eng_status krn_buf_copy(const krn_backend *b, krn_ctx *c, void *dst, const void *src, size_t n) {
    b = be(b);
    if (b->copy) return b->copy(c, dst, src, n);
    if (n) memmove(dst, src, n);
    return ENG_STATUS_OK;
}

eng_status krn_event_new(const krn_backend *b, krn_ctx *c, krn_event **out) {
    b = be(b);
    *out = NULL;
    return b->event_new ? b->event_new(c, out) : ENG_STATUS_OK;
}
eng_status krn_event_record(const krn_backend *b, krn_ctx *c, krn_event *e) {
    b = be(b);
    return b->event_record && e ? b->event_record(c, e) : ENG_STATUS_OK;
}
eng_status krn_event_wait(const krn_backend *b, krn_ctx *c, krn_event *e) {
    b = be(b);
    return b->event_wait && e ? b->event_wait(c, e) : ENG_STATUS_OK;
}
eng_status krn_event_sync(const krn_backend *b, krn_event *e) {
    b = be(b);
    return b->event_sync && e ? b->event_sync(e) : ENG_STATUS_OK;
}
void krn_event_free(const krn_backend *b, krn_event **e) {
    b = be(b);
    if (*e && b->event_free) b->event_free(*e);
    *e = NULL;
}

int krn_backend_has_comm(const krn_backend *b) { return be(b)->comm_new != NULL; }

eng_status krn_comm_new(const krn_backend *b, int n, const int *devices, krn_comm **out) {
    b = be(b);
    *out = NULL;
    if (!b->comm_new) return eng_err(ENG_STATUS_UNSUPPORTED, "backend '%s' has no collectives", b->name);
    return b->comm_new(n, devices, out);
}

eng_status krn_comm_allreduce(const krn_backend *b, krn_comm *cm, int rank, krn_ctx *c, float *buf, size_t n, float prescale) {
    b = be(b);
    if (!b->comm_allreduce) return eng_err(ENG_STATUS_UNSUPPORTED, "backend '%s' has no collectives", b->name);
    return b->comm_allreduce(cm, rank, c, buf, n, prescale);
}

eng_status krn_comm_allreduce_many(const krn_backend *b, krn_comm *cm, int rank, krn_ctx *c, float *const *bufs,
                                   const size_t *ns, int count, float prescale) {
    b = be(b);
    if (b->comm_allreduce_many) return b->comm_allreduce_many(cm, rank, c, bufs, ns, count, prescale);
    if (!b->comm_allreduce) return eng_err(ENG_STATUS_UNSUPPORTED, "backend '%s' has no collectives", b->name);
    eng_status first = ENG_STATUS_OK;
    for (int j = 0; j < count; j++) { /* every call made, whatever failed before (the other ranks wait for each) */
        eng_status st = b->comm_allreduce(cm, rank, c, bufs[j], ns[j], prescale);
        if (st != ENG_STATUS_OK && first == ENG_STATUS_OK) first = st;
    }
    return first;
}

void krn_comm_free(const krn_backend *b, krn_comm **cm) {
    b = be(b);
    if (*cm && b->comm_free) b->comm_free(*cm);
    *cm = NULL;
}

int krn_backend_has_graphs(const krn_backend *b) {
    b = be(b);
    return b->graph_begin && b->graph_end && b->graph_launch && b->graph_free;
}

eng_status krn_graph_begin(const krn_backend *b, krn_ctx *c) {
    if (!krn_backend_has_graphs(b)) return eng_err(ENG_STATUS_UNSUPPORTED, "backend '%s' has no graphs", be(b)->name);
    return be(b)->graph_begin(c);
}

eng_status krn_graph_end(const krn_backend *b, krn_ctx *c, krn_graph **out) {
    if (out) *out = NULL;
    if (!krn_backend_has_graphs(b)) return eng_err(ENG_STATUS_UNSUPPORTED, "backend '%s' has no graphs", be(b)->name);
    return be(b)->graph_end(c, out);
}

eng_status krn_graph_launch(const krn_backend *b, krn_ctx *c, krn_graph *g) {
    if (!krn_backend_has_graphs(b)) return eng_err(ENG_STATUS_UNSUPPORTED, "backend '%s' has no graphs", be(b)->name);
    if (!g) return eng_err(ENG_STATUS_INTERNAL, "backend '%s': launch of a NULL graph", be(b)->name);
    return be(b)->graph_launch(c, g);
}

void krn_graph_free(const krn_backend *b, krn_graph **g) {
    if (!g) return;
    if (*g && krn_backend_has_graphs(b)) be(b)->graph_free(*g);
    *g = NULL;
}

int krn_backend_has_comm_ranks(const krn_backend *b) { return be(b)->comm_id_new && be(b)->comm_new_ranks; }

eng_status krn_comm_id_new(const krn_backend *b, krn_comm_id *id) {
    b = be(b);
    memset(id, 0, sizeof *id);
    if (!b->comm_id_new)
        return eng_err(ENG_STATUS_UNSUPPORTED, "backend '%s' has no collectives across processes", b->name);
    return b->comm_id_new(id);
}

eng_status krn_comm_new_ranks(const krn_backend *b, const krn_comm_id *id, int nranks, int first_rank, int nlocal,
                              const int *devices, krn_comm **out) {
    b = be(b);
    *out = NULL;
    if (!b->comm_new_ranks)
        return eng_err(ENG_STATUS_UNSUPPORTED, "backend '%s' has no collectives across processes", b->name);
    if (nranks < 1 || nlocal < 1 || first_rank < 0 || first_rank > nranks - nlocal)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: local ranks %d..%d do not fit a communicator of %d ranks",
                       b->name, first_rank, first_rank + nlocal - 1, nranks);
    return b->comm_new_ranks(id, nranks, first_rank, nlocal, devices, out);
}

/* ---- the CUDA plugin ---- */

static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static const krn_backend *cuda_backend;
static void *cuda_handle;
static char cuda_why[512];

/* Directory of the running executable, with a trailing '/'; "" if unknown. */
static void exe_dir(char *buf, size_t n) {
    ssize_t len = readlink("/proc/self/exe", buf, n - 1);
    if (len <= 0) {
        buf[0] = 0;
        return;
    }
    buf[len] = 0;
    char *slash = strrchr(buf, '/');
    if (slash) slash[1] = 0;
    else buf[0] = 0;
}

/* Where the plugin is looked for, in order: $TENSORD_CUDA_PLUGIN (a path the operator sets; never a model
 * directory), next to the executable, one level up (build/tests/ binaries), ../lib/tensord/ (installed). */
static void cuda_load(void) {
    char dir[PATH_MAX], path[PATH_MAX + 64], tried[1024] = "";
    const char *env = getenv("TENSORD_CUDA_PLUGIN");
    exe_dir(dir, sizeof dir);
    const char *cands[4] = {env && *env ? env : NULL, "libtensord_cuda.so", "../libtensord_cuda.so",
                            "../lib/tensord/libtensord_cuda.so"};
    void *h = NULL;
    char dlmsg[512] = "";
    for (int i = 0; i < 4 && !h; i++) {
        if (!cands[i]) continue;
        if (i == 0) snprintf(path, sizeof path, "%s", cands[i]);
        else snprintf(path, sizeof path, "%s%s", dir, cands[i]);
        if (access(path, R_OK) != 0) {
            size_t tl = strlen(tried);
            snprintf(tried + tl, sizeof tried - tl, "%s%.300s", tl ? ", " : "", path);
            continue;
        }
        h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!h) snprintf(dlmsg, sizeof dlmsg, "%s", dlerror());
    }
    if (!h) {
        if (dlmsg[0]) snprintf(cuda_why, sizeof cuda_why, "the CUDA plugin did not load: %.400s", dlmsg);
        else snprintf(cuda_why, sizeof cuda_why, "this build has no CUDA plugin (looked for %.380s; build with nvcc)",
                      tried);
        return;
    }
    krn_cuda_entry_fn entry = (krn_cuda_entry_fn)dlsym(h, KRN_CUDA_ENTRY);
    if (!entry) {
        snprintf(cuda_why, sizeof cuda_why, "the CUDA plugin %.300s lacks %s", path, KRN_CUDA_ENTRY);
        return;
    }
    char why[400] = "";
    const krn_backend *b = entry(why, sizeof why);
    if (!b) {
        snprintf(cuda_why, sizeof cuda_why, "%s", why[0] ? why : "the CUDA plugin found no device");
        return;
    }
    if (b->abi != KRN_BACKEND_ABI) {
        snprintf(cuda_why, sizeof cuda_why, "the CUDA plugin %.300s was built from another tensord (backend ABI %d, this binary %d)",
                 path, b->abi, KRN_BACKEND_ABI);
        return;
    }
    cuda_backend = b; /* the handle stays open for the process's life */
    cuda_handle = h;
}

void *krn_cuda_plugin_symbol(const char *name) {
    pthread_once(&cuda_once, cuda_load);
    return cuda_handle ? dlsym(cuda_handle, name) : NULL;
}

const char *krn_cuda_unavailable_reason(void) {
    pthread_once(&cuda_once, cuda_load);
    return cuda_backend ? "" : cuda_why;
}

static const krn_backend *krn_backend_cuda(void) {
    pthread_once(&cuda_once, cuda_load);
    return cuda_backend;
}

const krn_backend *krn_backend_auto(int *device) {
    if (device) *device = 0;
    const krn_backend *c = krn_backend_cuda();
    return c ? c : krn_backend_cpu();
}

static char auto_note[640];
static pthread_once_t auto_note_once = PTHREAD_ONCE_INIT;
static void auto_note_fill(void) {
    const krn_backend *c = krn_backend_cuda();
    int n = c ? krn_backend_device_count(c) : 0;
    if (c) snprintf(auto_note, sizeof auto_note, "using CUDA (%d device%s)", n, n == 1 ? "" : "s");
    else snprintf(auto_note, sizeof auto_note, "no CUDA device, using CPU (%.580s)", cuda_why);
}

const char *krn_backend_auto_note(void) {
    pthread_once(&auto_note_once, auto_note_fill);
    return auto_note;
}

eng_status krn_backend_by_name(const char *spec, const krn_backend **out, int *device) {
    *out = NULL;
    if (device) *device = 0;
    if (!spec || !*spec) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "empty device name (expected cpu, cuda:N or auto)");
    char name[16];
    size_t n = strcspn(spec, ":");
    if (n >= sizeof name) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "device '%s': expected cpu, cuda:N or auto", spec);
    memcpy(name, spec, n);
    name[n] = 0;
    long dev = 0;
    if (spec[n] == ':') {
        char *end;
        dev = strtol(spec + n + 1, &end, 10);
        if (end == spec + n + 1 || *end || dev < 0 || dev > 1023)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "device '%s': the index after ':' must be a number 0..1023", spec);
    }
    const krn_backend *b = NULL;
    if (strcmp(name, "auto") == 0 && spec[n] == 0) {
        *out = krn_backend_auto(device);
        return ENG_STATUS_OK;
    } else if (strcmp(name, "cpu") == 0) {
        b = krn_backend_cpu();
    } else if (strcmp(name, "sim") == 0) {
        b = krn_backend_sim();
    } else if (strcmp(name, "cuda") == 0 || strcmp(name, "gpu") == 0) {
        b = krn_backend_cuda();
        if (!b) return eng_err(ENG_STATUS_UNSUPPORTED, "device '%s' is not available: %s", spec, cuda_why);
    } else {
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "device '%s': unknown kind '%s' (expected cpu, cuda:N or auto)", spec, name);
    }
    int count = krn_backend_device_count(b);
    if (dev >= count)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "device '%s': %s has %d device%s (0..%d)", spec, b->name, count,
                       count == 1 ? "" : "s", count - 1);
    *out = b;
    if (device) *device = (int)dev;
    return ENG_STATUS_OK;
}
