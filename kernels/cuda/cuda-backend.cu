/* cuda-backend.cu - the CUDA backend: device probe, execution contexts, buffers, copies, events; the plugin's
 * entry point (tensord_cuda_backend, the one symbol kernels/backend.c looks up).
 *
 * A krn_ctx of this backend is a cuda_ctx (cuda-impl.h): one device, one non-blocking stream, a cuBLASLt handle, a
 * cuDNN handle bound to the stream, and a workspace from the caching allocator (cuda-alloc.cu). Every hook that
 * takes a context first makes the context's device current on the calling thread and leaves it so: kernels then
 * launched from that thread on ctx->stream run on the right device. Hooks never synchronise except ctx_sync,
 * event_sync and a workspace growth; copies are queued on the context's stream, so the host side of set/get must
 * stay valid until ctx_sync (kernel.h's contract). Every message names the device as cuda:N. Nothing here logs:
 * the engine reports the backend once. Device health: every failure that carries a cudaError_t goes through
 * cuda_error, which marks the device lost (process-wide, once, first reason kept) when the error is sticky; the
 * device_lost hook reports it.
 */
#include "cuda-impl.h"
#include "cuda-alloc.h"
#include "../backend-impl.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
extern const krn_kernel krn_cuda_blas_kernels[];
extern const krn_kernel krn_cuda_dnn_kernels[];
extern const krn_kernel krn_cuda_eltwise_kernels[];
extern const krn_kernel krn_cuda_reduce_kernels[];
extern const krn_kernel krn_cuda_tensor_kernels[];
extern const krn_kernel krn_cuda_quant_kernels[];
extern const krn_kernel krn_cuda_optim_kernels[];
extern const krn_kernel krn_cuda_attn_kernels[];
eng_status cuda_comm_new(int n, const int *devices, krn_comm **out); /* cuda-comm.cu */
eng_status cuda_comm_allreduce(krn_comm *cm, int rank, krn_ctx *c, float *buf, size_t n, float prescale);
void cuda_comm_free(krn_comm *cm);
eng_status cuda_graph_begin(krn_ctx *c); /* cuda-graph.cu */
eng_status cuda_graph_end(krn_ctx *c, krn_graph **out);
eng_status cuda_graph_launch(krn_ctx *c, krn_graph *g);
void cuda_graph_free(krn_graph *g);
eng_status cuda_comm_id_new(krn_comm_id *id);
eng_status cuda_comm_new_ranks(const krn_comm_id *id, int nranks, int first, int nlocal, const int *devices, krn_comm **out);
eng_status cuda_comm_allreduce_many(krn_comm *cm, int rank, krn_ctx *c, float *const *bufs, const size_t *ns, int count,
                                    float prescale);
}

static const krn_kernel *const cuda_tables[] = {
    krn_cuda_blas_kernels, krn_cuda_dnn_kernels, krn_cuda_eltwise_kernels, krn_cuda_reduce_kernels,
    krn_cuda_tensor_kernels, krn_cuda_quant_kernels, krn_cuda_optim_kernels, krn_cuda_attn_kernels, NULL,
};

/* The opaque event of kernel.h: a CUDA event of device `dev`, made without timing (cheaper to record and wait). */
struct krn_event {
    cudaEvent_t ev;
    int dev;
};

#define CUDA_WORKSPACE_INITIAL ((size_t)32 << 20)

/* Errors after which the CUDA context of the process is unusable (every later call fails with the same error). */
extern "C" int cuda_error_is_sticky(cudaError_t e) {
    switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorHardwareStackError:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
        return 1;
    default:
        return 0;
    }
}

/* ---- device health ---- */

/* Devices lost to a sticky error, process-wide (the CUDA context is the process's): lost[dev] turns 1 once, after
 * the first error's text is in why[dev] (written under lost_mu, read under it). */
#define CUDA_MAX_DEVICES 64
static int cuda_lost[CUDA_MAX_DEVICES];
static char cuda_lost_why[CUDA_MAX_DEVICES][320];
static pthread_mutex_t cuda_lost_mu = PTHREAD_MUTEX_INITIALIZER;

static int cuda_device_lost(int dev, char *why, size_t cap) {
    if (dev < 0 || dev >= CUDA_MAX_DEVICES || !__atomic_load_n(&cuda_lost[dev], __ATOMIC_ACQUIRE)) return 0;
    if (why && cap) {
        pthread_mutex_lock(&cuda_lost_mu);
        krn_str_copy(why, cap, cuda_lost_why[dev]);
        pthread_mutex_unlock(&cuda_lost_mu);
    }
    return 1;
}

/* Marks dev lost with reason `what: error` unless it already is (the first reason stays). */
static void cuda_lose(int dev, const char *what, cudaError_t e) {
    if (dev < 0 || dev >= CUDA_MAX_DEVICES) return;
    pthread_mutex_lock(&cuda_lost_mu);
    if (!__atomic_load_n(&cuda_lost[dev], __ATOMIC_ACQUIRE)) {
        snprintf(cuda_lost_why[dev], sizeof cuda_lost_why[dev], "%s: %s (%s)", what, cudaGetErrorString(e),
                 cudaGetErrorName(e));
        __atomic_store_n(&cuda_lost[dev], 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&cuda_lost_mu);
}

extern "C" eng_status cuda_error(int dev, const char *what, cudaError_t e) {
    (void)cudaGetLastError();
    int d = dev;
    if (d < 0 && cudaGetDevice(&d) != cudaSuccess) {
        (void)cudaGetLastError();
        d = -1;
    }
    char lost[224] = "";
    if (cuda_error_is_sticky(e)) {
        cuda_lose(d, what, e);
        snprintf(lost, sizeof lost, "; a sticky error: device cuda:%d is lost (its CUDA context is corrupted) and every "
                 "later call on it fails until the process restarts", d);
    }
    if (dev < 0)
        return eng_err(ENG_STATUS_INTERNAL, "cuda %s: %s (%s)%s", what, cudaGetErrorString(e), cudaGetErrorName(e), lost);
    return eng_err(ENG_STATUS_INTERNAL, "cuda:%d: %s: %s (%s)%s", dev, what, cudaGetErrorString(e), cudaGetErrorName(e),
                   lost);
}

static int cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

static eng_status check_device(int dev) {
    int n = cuda_device_count();
    if (dev < 0 || dev >= n)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "cuda:%d: no such device (this machine has %d: 0..%d)", dev, n, n - 1);
    return ENG_STATUS_OK;
}

static eng_status cuda_mem_info(int dev, size_t *free_b, size_t *total_b) {
    *free_b = *total_b = 0;
    ENG_TRY(check_device(dev));
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
    CUDA_DEV_TRY(dev, "cudaSetDevice", cudaSetDevice(dev));
    cudaError_t e = cudaMemGetInfo(free_b, total_b);
    if (prev >= 0 && prev != dev) (void)cudaSetDevice(prev);
    if (e != cudaSuccess) return cuda_error(dev, "cudaMemGetInfo", e);
    return ENG_STATUS_OK;
}

/* Reduced precisions, judged on the calling thread's current device (device 0 unless a context made another
 * current): fp16 tensor cores from Volta (sm_70), int8 tensor cores (IMMA) from Turing (sm_75), bf16 from Ampere
 * (sm_80). */
static eng_status cuda_precision_check(eng_dtype dt) {
    if (dt == ENG_DTYPE_UNDEFINED || dt == ENG_DTYPE_F32) return ENG_STATUS_OK;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError();
        dev = 0;
    }
    cudaDeviceProp prop;
    CUDA_DEV_TRY(dev, "cudaGetDeviceProperties", cudaGetDeviceProperties(&prop, dev));
    int sm = prop.major * 10 + prop.minor;
    int need;
    const char *why;
    switch (dt) {
    case ENG_DTYPE_F16: need = 70; why = "fp16 tensor cores"; break;
    case ENG_DTYPE_I8:
    case ENG_DTYPE_U8: need = 75; why = "int8 tensor cores"; break;
    case ENG_DTYPE_BF16: need = 80; why = "bf16"; break;
    default: return eng_err(ENG_STATUS_UNSUPPORTED, "no %s compute on the CUDA backend", eng_dtype_name(dt));
    }
    if (sm >= need) return ENG_STATUS_OK;
    return eng_err(ENG_STATUS_UNSUPPORTED, "%s needs compute capability %d.%d or newer (%s); cuda:%d is %s, compute "
                   "capability %d.%d", eng_dtype_name(dt), need / 10, need % 10, why, dev, prop.name, prop.major,
                   prop.minor);
}

/* ---- contexts ---- */

static void cuda_ctx_free(krn_ctx *c) {
    cuda_ctx *x = (cuda_ctx *)c;
    if (!x) return;
    if (cudaSetDevice(x->device) != cudaSuccess) (void)cudaGetLastError();
    /* the caller synchronised; if it did not, wait here rather than free a workspace a kernel still uses */
    if (x->stream && cudaStreamSynchronize(x->stream) != cudaSuccess) (void)cudaGetLastError();
    if (x->workspace) cuda_mem_free(x->device, x->workspace);
    if (x->dnn) (void)cudnnDestroy(x->dnn);
    if (x->lt) (void)cublasLtDestroy(x->lt);
    if (x->stream && cudaStreamDestroy(x->stream) != cudaSuccess) (void)cudaGetLastError();
    free(x);
}

/* Fills x (x->device set); on failure the caller frees what was made with cuda_ctx_free. */
static eng_status ctx_init(cuda_ctx *x) {
    int dev = x->device;
    CUDA_DEV_TRY(dev, "cudaSetDevice", cudaSetDevice(dev));
    int major = 0, minor = 0;
    CUDA_DEV_TRY(dev, "cudaDeviceGetAttribute(major)", cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CUDA_DEV_TRY(dev, "cudaDeviceGetAttribute(minor)", cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    x->sm = major * 10 + minor;
    CUDA_DEV_TRY(dev, "cudaStreamCreateWithFlags", cudaStreamCreateWithFlags(&x->stream, cudaStreamNonBlocking));
    cublasStatus_t bs = cublasLtCreate(&x->lt);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        x->lt = NULL;
        return eng_err(ENG_STATUS_INTERNAL, "cuda:%d: cublasLtCreate: cuBLAS status %d", dev, (int)bs);
    }
    cudnnStatus_t ds = cudnnCreate(&x->dnn);
    if (ds != CUDNN_STATUS_SUCCESS) {
        x->dnn = NULL;
        return eng_err(ENG_STATUS_INTERNAL, "cuda:%d: cudnnCreate: %s", dev, cudnnGetErrorString(ds));
    }
    ds = cudnnSetStream(x->dnn, x->stream);
    if (ds != CUDNN_STATUS_SUCCESS) return eng_err(ENG_STATUS_INTERNAL, "cuda:%d: cudnnSetStream: %s", dev, cudnnGetErrorString(ds));
    ENG_TRY(cuda_mem_alloc(dev, CUDA_WORKSPACE_INITIAL, &x->workspace));
    x->ws_bytes = CUDA_WORKSPACE_INITIAL;
    const char *tf32 = getenv("TENSORD_CUDA_TF32");
    x->tf32 = tf32 && strcmp(tf32, "1") == 0;
    return ENG_STATUS_OK;
}

static eng_status cuda_ctx_new(int dev, krn_ctx **out) {
    *out = NULL;
    ENG_TRY(check_device(dev));
    cuda_ctx *x = (cuda_ctx *)calloc(1, sizeof *x);
    if (!x) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "cuda:%d: out of host memory for an execution context", dev);
    x->device = dev;
    eng_status st = ctx_init(x);
    if (st != ENG_STATUS_OK) {
        cuda_ctx_free((krn_ctx *)x);
        return st;
    }
    *out = (krn_ctx *)x;
    return ENG_STATUS_OK;
}

/* Waits for everything queued on the context; the first failure of that work (a kernel fault is reported here,
 * not at its launch) as a status naming the device and the CUDA error. */
static eng_status cuda_ctx_sync(krn_ctx *c) {
    cuda_ctx *x = (cuda_ctx *)c;
    CUDA_DEV_TRY(x->device, "cudaSetDevice", cudaSetDevice(x->device));
    cudaError_t e = cudaStreamSynchronize(x->stream);
    if (e == cudaSuccess) return ENG_STATUS_OK;
    return cuda_error(x->device, "work queued on the stream failed", e);
}

static eng_status cuda_ctx_enter(krn_ctx *c) {
    cuda_ctx *x = (cuda_ctx *)c;
    CUDA_DEV_TRY(x->device, "cudaSetDevice", cudaSetDevice(x->device));
    return ENG_STATUS_OK;
}

/* Grows x's workspace to at least n bytes. Growing synchronises x->stream first (kernels queued before may still
 * use the old block, which goes back to the shared cache), so it is refused during a CUDA graph capture; kernels
 * grow it rarely (first runs), and the size only rises. */
extern "C" eng_status cuda_ctx_workspace(cuda_ctx *x, size_t n, void **out) {
    *out = NULL;
    if (n <= x->ws_bytes) {
        *out = x->workspace;
        return ENG_STATUS_OK;
    }
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    CUDA_DEV_TRY(x->device, "cudaStreamIsCapturing", cudaStreamIsCapturing(x->stream, &cap));
    if (cap != cudaStreamCaptureStatusNone)
        return eng_err(ENG_STATUS_INTERNAL, "cuda:%d: the workspace must grow from %zu to %zu bytes during a CUDA graph "
                       "capture, where it cannot", x->device, x->ws_bytes, n);
    CUDA_DEV_TRY(x->device, "cudaSetDevice", cudaSetDevice(x->device));
    CUDA_DEV_TRY(x->device, "cudaStreamSynchronize (growing the workspace)", cudaStreamSynchronize(x->stream));
    if (x->workspace) cuda_mem_free(x->device, x->workspace);
    x->workspace = NULL;
    x->ws_bytes = 0;
    ENG_TRY(cuda_mem_alloc(x->device, n, &x->workspace));
    x->ws_bytes = n;
    *out = x->workspace;
    return ENG_STATUS_OK;
}

/* ---- buffers ---- */

/* The device of c, or the thread's current device without one. */
static int ctx_device(krn_ctx *c) {
    if (c) return ((cuda_ctx *)c)->device;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError();
        dev = 0;
    }
    return dev;
}

static eng_status cuda_buf_alloc(krn_ctx *c, size_t nbytes, void **out) { return cuda_mem_alloc(ctx_device(c), nbytes, out); }

/* Back to the cache at once: the plan frees a buffer only after synchronising the context (see cuda-alloc.cu). */
static void cuda_buf_free(krn_ctx *c, void *p) { cuda_mem_free(ctx_device(c), p); }

/* Pinned, portable (usable by every device) host memory for staging copies. */
static eng_status cuda_host_alloc(size_t nbytes, void **out) {
    *out = NULL;
    cudaError_t e = cudaHostAlloc(out, nbytes ? nbytes : 1, cudaHostAllocPortable);
    if (e == cudaSuccess) return ENG_STATUS_OK;
    (void)cudaGetLastError();
    *out = NULL;
    return eng_err(e == cudaErrorMemoryAllocation ? ENG_STATUS_OUT_OF_MEMORY : ENG_STATUS_INTERNAL,
                   "cuda: cannot allocate %zu bytes of pinned host memory: %s (%s)", nbytes, cudaGetErrorString(e),
                   cudaGetErrorName(e));
}

static void cuda_host_free(void *p) {
    if (p && cudaFreeHost(p) != cudaSuccess) (void)cudaGetLastError();
}

static eng_status ctx_copy(krn_ctx *c, void *dst, const void *src, size_t n, cudaMemcpyKind kind, const char *what) {
    if (n == 0) return ENG_STATUS_OK;
    cuda_ctx *x = (cuda_ctx *)c;
    CUDA_DEV_TRY(x->device, "cudaSetDevice", cudaSetDevice(x->device));
    cudaError_t e = cudaMemcpyAsync(dst, src, n, kind, x->stream);
    if (e == cudaSuccess) return ENG_STATUS_OK;
    char w[160];
    snprintf(w, sizeof w, "%s of %zu bytes (%p -> %p)", what, n, src, dst);
    return cuda_error(x->device, w, e);
}

static eng_status cuda_buf_set(krn_ctx *c, void *dst, const void *host_src, size_t n) {
    return ctx_copy(c, dst, host_src, n, cudaMemcpyHostToDevice, "copy host -> device");
}
static eng_status cuda_buf_get(krn_ctx *c, void *host_dst, const void *src, size_t n) {
    return ctx_copy(c, host_dst, src, n, cudaMemcpyDeviceToHost, "copy device -> host");
}
static eng_status cuda_buf_copy(krn_ctx *c, void *dst, const void *src, size_t n) {
    return ctx_copy(c, dst, src, n, cudaMemcpyDeviceToDevice, "copy device -> device");
}

/* ---- events ---- */

static eng_status cuda_event_new(krn_ctx *c, krn_event **out) {
    *out = NULL;
    int dev = ctx_device(c);
    krn_event *e = (krn_event *)calloc(1, sizeof *e);
    if (!e) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "cuda:%d: out of host memory for an event", dev);
    e->dev = dev;
    cudaError_t err = cudaSetDevice(dev);
    if (err == cudaSuccess) err = cudaEventCreateWithFlags(&e->ev, cudaEventDisableTiming);
    if (err != cudaSuccess) {
        free(e);
        return cuda_error(dev, "cudaEventCreateWithFlags", err);
    }
    *out = e;
    return ENG_STATUS_OK;
}

static eng_status cuda_event_record(krn_ctx *c, krn_event *e) {
    cuda_ctx *x = (cuda_ctx *)c;
    if (e->dev != x->device)
        return eng_err(ENG_STATUS_INTERNAL, "cuda:%d: cannot record an event of cuda:%d on this device's stream", x->device, e->dev);
    CUDA_DEV_TRY(x->device, "cudaSetDevice", cudaSetDevice(x->device));
    CUDA_DEV_TRY(x->device, "cudaEventRecord", cudaEventRecord(e->ev, x->stream));
    return ENG_STATUS_OK;
}

/* Work queued on c after this waits for the event (which may be of another device); the host does not wait. */
static eng_status cuda_event_wait(krn_ctx *c, krn_event *e) {
    cuda_ctx *x = (cuda_ctx *)c;
    CUDA_DEV_TRY(x->device, "cudaSetDevice", cudaSetDevice(x->device));
    CUDA_DEV_TRY(x->device, "cudaStreamWaitEvent", cudaStreamWaitEvent(x->stream, e->ev, 0));
    return ENG_STATUS_OK;
}

static eng_status cuda_event_sync(krn_event *e) {
    cudaError_t err = cudaEventSynchronize(e->ev);
    if (err == cudaSuccess) return ENG_STATUS_OK;
    return cuda_error(e->dev, "work before the event failed", err);
}

static void cuda_event_free(krn_event *e) {
    if (!e) return;
    if (cudaEventDestroy(e->ev) != cudaSuccess) (void)cudaGetLastError();
    free(e);
}

static const krn_backend cuda_backend = {
    .abi = KRN_BACKEND_ABI,
    .name = "cuda",
    .tables = cuda_tables,
    .precision_check = cuda_precision_check,
    .is_host = 0,
    .alignment = 256,
    .device_count = cuda_device_count,
    .mem_info = cuda_mem_info,
    .ctx_new = cuda_ctx_new,
    .ctx_free = cuda_ctx_free,
    .ctx_sync = cuda_ctx_sync,
    .ctx_enter = cuda_ctx_enter,
    .alloc = cuda_buf_alloc,
    .free = cuda_buf_free,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .set = cuda_buf_set,
    .get = cuda_buf_get,
    .copy = cuda_buf_copy,
    .event_new = cuda_event_new,
    .event_record = cuda_event_record,
    .event_wait = cuda_event_wait,
    .event_sync = cuda_event_sync,
    .event_free = cuda_event_free,
    .comm_new = cuda_comm_new,
    .comm_allreduce = cuda_comm_allreduce,
    .comm_free = cuda_comm_free,
    /* graphs */
    .graph_begin = cuda_graph_begin,
    .graph_end = cuda_graph_end,
    .graph_launch = cuda_graph_launch,
    .graph_free = cuda_graph_free,
    /* multi-process collectives */
    .comm_id_new = TENSORD_NCCL ? cuda_comm_id_new : NULL,
    .comm_new_ranks = TENSORD_NCCL ? cuda_comm_new_ranks : NULL,
    /* bucketed collectives */
    .comm_allreduce_many = cuda_comm_allreduce_many,
    /* device health */
    .device_lost = cuda_device_lost,
};

/* The backend when a CUDA driver and at least one device are present, else NULL with why[] saying which is missing.
 * Logs nothing. */
extern "C" __attribute__((visibility("default"))) const krn_backend *tensord_cuda_backend(char *why, size_t whylen) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        int drv = 0, rt = 0;
        if (cudaDriverGetVersion(&drv) != cudaSuccess) drv = 0;
        if (cudaRuntimeGetVersion(&rt) != cudaSuccess) rt = 0;
        (void)cudaGetLastError();
        if (e == cudaErrorNoDevice)
            snprintf(why, whylen, "no CUDA device (cudaErrorNoDevice)");
        else if (e == cudaErrorInsufficientDriver && drv == 0)
            snprintf(why, whylen, "CUDA driver not found (%s)", cudaGetErrorName(e));
        else if (e == cudaErrorInsufficientDriver)
            snprintf(why, whylen, "the CUDA driver (%d.%d) is older than this plugin's runtime (%d.%d) (%s)", drv / 1000,
                     drv % 1000 / 10, rt / 1000, rt % 1000 / 10, cudaGetErrorName(e));
        else
            snprintf(why, whylen, "cudaGetDeviceCount failed: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
        return NULL;
    }
    if (n <= 0) {
        snprintf(why, whylen, "no CUDA device");
        return NULL;
    }
    return &cuda_backend;
}
