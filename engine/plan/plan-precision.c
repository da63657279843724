/* plan-precision.c - precision as a plan property: the pass that runs a plan at bf16 / fp16, and the checks that
 * refuse a precision the backend cannot run fast.
 *
 * bf16 / fp16 (after shape inference and folding, before memory planning):
 *  1. every step whose kernel computes in that dtype (krn_backend_find_dtype) and says it can run this call
 *     fast (krn_kernel.compute_ok: convolutions and matmuls with oneDNN's bf16 kernels) computes in it, with
 *     fp32 accumulation; its weights are converted once, when the kernel initialises (plan-owned buffers);
 *  2. an activation written by such a step and read only by such steps is stored in the reduced dtype, so a
 *     chain of convolutions (a ResNet's blocks) passes bf16 from one to the next with no conversion; fp32 steps
 *     whose kernels convert inside (krn_kernel.io_ok: LayerNorm, binary eltwise, pooling) may write or read such
 *     an activation too, so BERT's LayerNorm output reaches its Q, K and V matmuls in bf16, converted once instead
 *     of three times, and a ResNet stem's MaxPool runs between bf16 convs (the residual stream, an Add's output,
 *     stays fp32);
 *  3. everything else stays fp32: softmax, normalisation statistics, losses, eltwise ops, and the graph
 *     outputs, which are returned in the signature's dtype. A reduced-precision step that reads an fp32
 *     activation converts it inside its kernel (a counted reorder, shown by TENSORD_PROFILE=1).
 * int8: the quantized nodes of a QDQ / QOperator model (fused into int8 kernels at load time) compute in int8;
 * float nodes stay fp32, as in onnxruntime. A model with nothing quantized is refused, naming `tensord quantize`.
 * Plans whose shapes are known only at run time compute in fp32 and say so once on stderr.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "plan-impl.h"

const char *eng_precision_name(eng_precision p) {
    switch (p) {
    case ENG_PRECISION_FP32: return "fp32";
    case ENG_PRECISION_FP16: return "fp16";
    case ENG_PRECISION_BF16: return "bf16";
    case ENG_PRECISION_INT8: return "int8";
    }
    return "unknown";
}

eng_status eng_precision_parse(const char *s, eng_precision *out) {
    static const eng_precision all[] = {ENG_PRECISION_FP32, ENG_PRECISION_FP16, ENG_PRECISION_BF16, ENG_PRECISION_INT8};
    for (size_t i = 0; s && i < sizeof all / sizeof all[0]; i++)
        if (strcasecmp(s, eng_precision_name(all[i])) == 0) { /* "BF16" too, as signature.json always took it */
            *out = all[i];
            return ENG_STATUS_OK;
        }
    return eng_err(ENG_STATUS_INVALID_ARGUMENT, "unknown precision '%.40s' (fp32, bf16, fp16 or int8)", s ? s : "");
}

static eng_dtype precision_dtype(eng_precision p) {
    switch (p) {
    case ENG_PRECISION_FP16: return ENG_DTYPE_F16;
    case ENG_PRECISION_BF16: return ENG_DTYPE_BF16;
    case ENG_PRECISION_INT8: return ENG_DTYPE_I8;
    default: return ENG_DTYPE_F32;
    }
}

/* A node that computes on quantized integers (after the load-time QDQ fusion, or as written). */
static int node_is_quantized(const eng_node *n) {
    static const char *ops[] = {"QuantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul",
                                "ConvInteger", "MatMulInteger", "QLinearAdd", "QLinearMul"};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (strcmp(n->op_type, ops[i]) == 0) return 1;
    return 0;
}

eng_status eng_plan_precision_check(const eng_graph *g, const krn_backend *b, eng_precision prec) {
    if (!b) b = krn_backend_cpu();
    if (prec == ENG_PRECISION_FP32) return ENG_STATUS_OK;
    if ((int)prec < 0 || prec > ENG_PRECISION_INT8)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "precision %d is not one of fp32, bf16, fp16, int8", (int)prec);
    eng_dtype dt = precision_dtype(prec);
    eng_status st = krn_backend_precision_check(b, dt);
    if (st != ENG_STATUS_OK)
        return eng_err_prefix(st, "precision %s on backend '%s': ", eng_precision_name(prec), krn_backend_name(b));
    if (prec == ENG_PRECISION_INT8) {
        for (int i = 0; i < g->nnodes; i++)
            if (node_is_quantized(&g->nodes[i])) return ENG_STATUS_OK;
        return eng_err(ENG_STATUS_UNSUPPORTED, "precision int8: the model has no quantized ops (QuantizeLinear/"
                       "DequantizeLinear around weights, QLinearConv, QLinearMatMul, MatMulInteger, ConvInteger); make an "
                       "int8 version with `tensord quantize` (calibrated), or serve this one at fp32 or bf16");
    }
    return ENG_STATUS_OK;
}

/* Step s can run as the plan has it now: computing in dt (when s->compute == dt or `compute`), or, for an fp32
 * step, with some of its tensors in dt (io_ok). */
static int step_can(const eng_plan *p, const plan_step *s, eng_dtype dt, int compute) {
    eng_tensor in[ENG_OP_MAX_IO], out[ENG_OP_MAX_IO];
    krn_call c;
    plan_step_call(p, s, in, out, &c); /* shapes and dtypes as the plan has them now; no arena yet */
    if (compute || s->compute == dt) return s->kernel->compute_ok(&c, dt);
    return s->kernel->io_ok ? s->kernel->io_ok(&c, dt) : 0;
}

static int step_ok(const eng_plan *p, const plan_step *s, eng_dtype dt) { return step_can(p, s, dt, 0); }

/* Step s may read or write a dt tensor at all (computing in it, or converting inside). */
static int step_takes(const plan_step *s, eng_dtype dt) {
    return s->kernel && (s->compute == dt || s->kernel->io_ok);
}

static int value_is_graph_output(const eng_graph *g, int v) {
    for (int i = 0; i < g->noutputs; i++)
        if (g->outputs[i] == v) return 1;
    return 0;
}

/* Store value v (written by step `producer`) in dt if its producer and every step that reads it can take it in dt,
 * and the producer or at least one reader computes in dt (a value only fp32 steps pass between stays fp32: storing
 * it in bf16 would cost precision and buy nothing). */
static int demote_value(eng_plan *p, int v, int producer, eng_dtype dt) {
    const eng_graph *g = p->g;
    if (p->kind[v] != VAL_ARENA || p->root[v] != v || p->vals[v].dtype != ENG_DTYPE_F32 || value_is_graph_output(g, v))
        return 0;
    if (!step_takes(&p->steps[producer], dt)) return 0;
    int nread = 0, ncompute = 0;
    for (int si = 0; si < p->nsteps; si++) {
        const plan_step *s = &p->steps[si];
        const eng_node *n = &g->nodes[s->node];
        for (int i = 0; i < n->nin; i++)
            if (n->inputs[i] == v) {
                if (!step_takes(s, dt)) return 0; /* an fp32-only reader, or an alias (Reshape...) */
                nread++;
                ncompute += s->compute == dt;
                break;
            }
    }
    if (!nread || (!ncompute && p->steps[producer].compute != dt)) return 0;
    p->vals[v].dtype = dt;
    int ok = step_ok(p, &p->steps[producer], dt), native = 1;
    for (int si = 0; ok && si < p->nsteps; si++) {
        const eng_node *n = &g->nodes[p->steps[si].node];
        for (int i = 0; i < n->nin; i++)
            if (n->inputs[i] == v) {
                ok = step_ok(p, &p->steps[si], dt);
                if (ok == 1 && p->steps[si].compute != dt) native = 0; /* converts inside: costs a pass */
                break;
            }
    }
    /* with no reader computing in dt, only readers that run natively in dt (io_ok 2: pooling) make it pay; an
     * Add that converts its operand back (io_ok 1) would cost a pass more than reading fp32 */
    if (ok && !ncompute && !native) ok = 0;
    if (!ok) p->vals[v].dtype = ENG_DTYPE_F32;
    return ok != 0;
}

static int node_kept_fp32(const eng_plan *p, const eng_node *n) {
    for (int i = 0; i < p->opts.nfp32_nodes; i++)
        if (n->name && strcmp(n->name, p->opts.fp32_nodes[i]) == 0) return 1;
    return 0;
}

eng_status plan_precision(eng_plan *p) {
    eng_precision prec = p->opts.precision;
    if (prec != ENG_PRECISION_BF16 && prec != ENG_PRECISION_FP16) return ENG_STATUS_OK;
    eng_dtype dt = precision_dtype(prec);
    const krn_backend *b = p->opts.backend ? p->opts.backend : krn_backend_cpu();
    if (p->dynamic) {
        static int said;
        if (!said++)
            fprintf(stderr, "tensord: a plan whose shapes are known only at run time computes in fp32 (%s needs shapes "
                            "fixed at plan time)\n", eng_precision_name(prec));
        return ENG_STATUS_OK;
    }
    for (int si = 0; si < p->nsteps; si++) {
        plan_step *s = &p->steps[si];
        if (!s->kernel || !s->def->kernel || node_kept_fp32(p, &p->g->nodes[s->node])) continue;
        const krn_kernel *k = krn_backend_find_dtype(b, s->def->kernel, dt);
        if (!k || k != s->kernel) continue;
        if (step_can(p, s, dt, 1)) s->compute = dt, p->lowp_steps++;
    }
    for (int si = 0; si < p->nsteps; si++) {
        const plan_step *s = &p->steps[si];
        if (!step_takes(s, dt)) continue;
        const eng_node *n = &p->g->nodes[s->node];
        if (n->nout > 0 && n->outputs[0] >= 0 && demote_value(p, n->outputs[0], si, dt)) p->lowp_values++;
    }
    return ENG_STATUS_OK;
}
