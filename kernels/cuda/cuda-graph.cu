/* cuda-graph.cu - the CUDA backend's graphs (backend-impl.h's graph hooks): stream capture into a CUDA graph,
 * instantiated once and launched on the context's stream (engine/plan/plan-graph.c decides when).
 *
 * Capture mode: cudaStreamCaptureModeThreadLocal. It refuses the calls that are unsafe while capturing (cudaMalloc,
 * a synchronous copy, a stream or device synchronisation) made from the capturing thread, so a kernel whose exec
 * would allocate or wait fails the capture (the plan then runs eagerly) instead of being recorded wrongly; and it
 * leaves other threads alone: the other batch workers keep running, allocating and capturing on their own streams
 * (a Global capture would make their cudaMalloc fail). The kernels' exec paths keep to this: device memory is
 * allocated in init (cuda_mem_alloc), the shared workspace grows only outside a capture (cuda_ctx_workspace refuses),
 * cuBLASLt and cuDNN are given that workspace and never allocate in exec, and only check hooks read back (plans with
 * them are not captured).
 *
 * A capture that fails midway is ended (cudaStreamEndCapture), what it produced destroyed and the thread's error
 * cleared, so the stream takes eager work again. A graph remembers the workspace address its kernels were recorded
 * with; a launch after the workspace moved is refused rather than run on freed memory. Every message names the
 * device as cuda:N. Nothing here logs.
 */
#include "cuda-impl.h"
#include "../backend-impl.h"

#include <stdlib.h>

struct krn_graph {
    int device;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    void *workspace; /* the context's workspace at capture: recorded kernels use this address */
};


extern "C" eng_status cuda_graph_begin(krn_ctx *c) {
    cuda_ctx *x = (cuda_ctx *)c;
    if (!x) return eng_err(ENG_STATUS_INTERNAL, "cuda: graph capture without a context");
    CUDA_DEV_TRY(x->device, "cudaSetDevice", cudaSetDevice(x->device));
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    CUDA_DEV_TRY(x->device, "cudaStreamIsCapturing", cudaStreamIsCapturing(x->stream, &cap));
    if (cap != cudaStreamCaptureStatusNone)
        return eng_err(ENG_STATUS_INTERNAL, "cuda:%d: a graph capture is already under way on this stream", x->device);
    /* a non-sticky error left by earlier work would be reported by the first captured kernel's launch check */
    (void)cudaGetLastError();
    CUDA_DEV_TRY(x->device, "cudaStreamBeginCapture", cudaStreamBeginCapture(x->stream, cudaStreamCaptureModeThreadLocal));
    return ENG_STATUS_OK;
}

extern "C" eng_status cuda_graph_end(krn_ctx *c, krn_graph **out) {
    if (out) *out = NULL;
    cuda_ctx *x = (cuda_ctx *)c;
    if (!x) return eng_err(ENG_STATUS_INTERNAL, "cuda: graph end without a context");
    CUDA_DEV_TRY(x->device, "cudaSetDevice", cudaSetDevice(x->device));
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(x->stream, &g); /* ends the capture even when it was invalidated */
    if (e != cudaSuccess) {
        if (g && cudaGraphDestroy(g) != cudaSuccess) (void)cudaGetLastError();
        return cuda_error(x->device, "cudaStreamEndCapture (the capture was invalidated: a call that cannot be captured, "
                         "such as an allocation or a synchronisation, or a failed launch)", e);
    }
    if (!g) return eng_err(ENG_STATUS_INTERNAL, "cuda:%d: cudaStreamEndCapture produced no graph", x->device);
    if (!out) { /* discard */
        CUDA_DEV_TRY(x->device, "cudaGraphDestroy", cudaGraphDestroy(g));
        return ENG_STATUS_OK;
    }
    cudaGraphExec_t ex = NULL;
    e = cudaGraphInstantiate(&ex, g, 0ULL);
    if (e != cudaSuccess) {
        eng_status st = cuda_error(x->device, "cudaGraphInstantiate", e);
        if (cudaGraphDestroy(g) != cudaSuccess) (void)cudaGetLastError();
        return st;
    }
    e = cudaGraphUpload(ex, x->stream); /* the first launch then costs what later ones do */
    if (e != cudaSuccess) {
        eng_status st = cuda_error(x->device, "cudaGraphUpload", e);
        if (cudaGraphExecDestroy(ex) != cudaSuccess) (void)cudaGetLastError();
        if (cudaGraphDestroy(g) != cudaSuccess) (void)cudaGetLastError();
        return st;
    }
    krn_graph *gr = (krn_graph *)calloc(1, sizeof *gr);
    if (!gr) {
        if (cudaGraphExecDestroy(ex) != cudaSuccess) (void)cudaGetLastError();
        if (cudaGraphDestroy(g) != cudaSuccess) (void)cudaGetLastError();
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "cuda:%d: out of host memory for a graph", x->device);
    }
    gr->device = x->device;
    gr->graph = g;
    gr->exec = ex;
    gr->workspace = x->workspace;
    *out = gr;
    return ENG_STATUS_OK;
}

extern "C" eng_status cuda_graph_launch(krn_ctx *c, krn_graph *g) {
    cuda_ctx *x = (cuda_ctx *)c;
    if (!x || !g) return eng_err(ENG_STATUS_INTERNAL, "cuda: graph launch without a context or a graph");
    if (g->device != x->device)
        return eng_err(ENG_STATUS_INTERNAL, "cuda:%d: launch of a graph captured on cuda:%d", x->device, g->device);
    if (g->workspace != x->workspace)
        return eng_err(ENG_STATUS_INTERNAL, "cuda:%d: the context's workspace moved since the graph was captured: its "
                       "kernels would use freed memory", x->device);
    CUDA_DEV_TRY(x->device, "cudaSetDevice", cudaSetDevice(x->device));
    CUDA_DEV_TRY(x->device, "cudaGraphLaunch", cudaGraphLaunch(g->exec, x->stream));
    return ENG_STATUS_OK;
}

/* The caller synchronised the stream that launched g. */
extern "C" void cuda_graph_free(krn_graph *g) {
    if (!g) return;
    if (cudaSetDevice(g->device) != cudaSuccess) (void)cudaGetLastError();
    if (g->exec && cudaGraphExecDestroy(g->exec) != cudaSuccess) (void)cudaGetLastError();
    if (g->graph && cudaGraphDestroy(g->graph) != cudaSuccess) (void)cudaGetLastError();
    free(g);
}
