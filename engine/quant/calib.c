/* calib.c - choosing what to quantize and calibrating activation ranges (see quant.h).
 *
 * Calibration runs a copy of the float graph whose outputs also list every activation to observe (graph inputs
 * are observed from the fed batch instead), without fusion so that every observed value is materialised. The
 * first pass records min and max; percentile and entropy run a second pass that histograms |x| into 2048 bins
 * over [0, amax], leaving exact zeros out (ReLU's: they quantize exactly at any scale, and as a spike in bin 0 they
 * pulled entropy's KL search down to thresholds that clip most of the range). Invariant: every eng_quant_act leaves here with a finite scale > 0 and a zero point inside its
 * dtype's range.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../plan/session.h"
#include "../train/eval.h"
#include "quant.h"

#define QUANT_NBINS 2048

const char *eng_quant_method_name(eng_quant_method m) {
    return m == ENG_QUANT_MINMAX ? "minmax" : m == ENG_QUANT_PERCENTILE ? "percentile" : "entropy";
}

int eng_quant_method_parse(const char *s) {
    if (strcmp(s, "minmax") == 0) return ENG_QUANT_MINMAX;
    if (strcmp(s, "percentile") == 0) return ENG_QUANT_PERCENTILE;
    if (strcmp(s, "entropy") == 0) return ENG_QUANT_ENTROPY;
    return -1;
}

void eng_quant_plan_free(eng_quant_plan *p) {
    if (!p) return;
    free(p->nodes);
    free(p->excluded);
    free(p->acts);
    memset(p, 0, sizeof *p);
}

static int is_float_init(const eng_graph *g, int v) {
    return v >= 0 && g->values[v].init && g->values[v].init->dtype == ENG_DTYPE_F32;
}

static int is_activation(const eng_graph *g, int v) {
    return v >= 0 && !g->values[v].init &&
           (g->values[v].dtype == ENG_DTYPE_F32 || g->values[v].dtype == ENG_DTYPE_UNDEFINED);
}

/* An Add of two float activations (a residual connection): quantized only where its result, after an optional
 * Relu, feeds quantized nodes alone (eng_quant_select), so that the load-time fusion makes it one int8 add. */
static int is_act_add(const eng_graph *g, const eng_node *n) {
    return !n->domain[0] && strcmp(n->op_type, "Add") == 0 && n->nin == 2 && n->nout == 1 &&
           is_activation(g, n->inputs[0]) && is_activation(g, n->inputs[1]) && n->inputs[0] != n->inputs[1];
}

/* 1 if some node reads value v as a quantized input of a taken node (a Conv's or Gemm's input 0, a MatMul's 0 or
 * 1, an Add's either), or, with relu_ok, v feeds a Relu whose result is so read: then v's quantized form exists
 * anyway (every reader of a quantized activation reads its DequantizeLinear, as in onnxruntime's QDQ models), so
 * an Add producing v can run in int8. */
static int feeds_quantized(const eng_graph *g, const char *take, int v, int relu_ok) {
    for (int j = 0; j < g->nnodes; j++) {
        const eng_node *r = &g->nodes[j];
        for (int k = 0; k < r->nin; k++) {
            if (r->inputs[k] != v) continue;
            if (relu_ok && !r->domain[0] && !strcmp(r->op_type, "Relu") && r->nout == 1 &&
                feeds_quantized(g, take, r->outputs[0], 0))
                return 1;
            if (take[j] && (k == 0 || (k == 1 && (!strcmp(r->op_type, "MatMul") || is_act_add(g, r))))) return 1;
        }
    }
    return 0;
}

/* A default-domain Conv, Gemm or MatMul whose first input is a float activation and whose second is a float
 * initializer (a weight). Adds of two activations are candidates too (is_act_add). */
static int quantizable(const eng_graph *g, const eng_node *n) {
    if (n->domain[0] || n->nin < 2) return 0;
    int conv = strcmp(n->op_type, "Conv") == 0, gemm = strcmp(n->op_type, "Gemm") == 0;
    int mm = strcmp(n->op_type, "MatMul") == 0;
    if (is_act_add(g, n)) return 1;
    if (!conv && !gemm && !mm) return 0;
    if (!is_activation(g, n->inputs[0])) return 0;
    /* a MatMul of two activations (attention's Q K^T, P V) stays float: no int8 kernel takes a non-constant
     * quantized B, so its Q/DQ pairs would cost time and accuracy and buy nothing */
    return is_float_init(g, n->inputs[1]);
}

eng_status eng_quant_select(const eng_graph *g, const char *what, const eng_quant_opts *o, eng_quant_plan *p) {
    memset(p, 0, sizeof *p);
    for (int e = 0; e < o->nexclude; e++) {
        int found = 0;
        for (int i = 0; i < g->nnodes && !found; i++) found = strcmp(g->nodes[i].name, o->exclude[e]) == 0;
        if (!found) {
            char names[1024] = "";
            size_t k = 0;
            for (int i = 0; i < g->nnodes && k < sizeof names; i++)
                if (quantizable(g, &g->nodes[i]))
                    k += (size_t)snprintf(names + k, sizeof names - k, "%s'%s'", k ? ", " : "", g->nodes[i].name);
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "--exclude: %s has no node named '%s' (quantizable nodes: %s)",
                           what, o->exclude[e], names[0] ? names : "none");
        }
    }
    p->nodes = calloc((size_t)g->nnodes + 1, sizeof *p->nodes);
    p->excluded = calloc((size_t)g->nnodes + 1, sizeof *p->excluded);
    p->acts = calloc((size_t)g->nnodes * 2 + 1, sizeof *p->acts);
    char *take = calloc((size_t)g->nnodes + 1, 1);
    if (!p->nodes || !p->excluded || !p->acts || !take) {
        free(take);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    for (int i = 0; i < g->nnodes; i++) {
        const eng_node *n = &g->nodes[i];
        int ex = 0;
        for (int e = 0; e < o->nexclude && !ex; e++) ex = strcmp(n->name, o->exclude[e]) == 0;
        take[i] = quantizable(g, n) && !ex;
        if (quantizable(g, n) && ex) p->excluded[p->nexcluded++] = i;
    }
    /* Adds keep their place only while something takes their result (through a Relu) as a quantized input */
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = 0; i < g->nnodes; i++)
            if (take[i] && is_act_add(g, &g->nodes[i]) && !feeds_quantized(g, take, g->nodes[i].outputs[0], 1))
                take[i] = 0, changed = 1;
    }
    for (int i = 0; i < g->nnodes; i++) {
        const eng_node *n = &g->nodes[i];
        if (!take[i]) continue;
        p->nodes[p->nnodes++] = i;
        for (int s = 0; s < 2; s++) {
            int v = n->inputs[s];
            if (!is_activation(g, v)) continue;
            int dup = 0;
            for (int a = 0; a < p->nacts && !dup; a++) dup = p->acts[a].value == v;
            if (!dup) p->acts[p->nacts++].value = v;
        }
    }
    free(take);
    if (p->nnodes == 0 && p->nexcluded == 0)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT,
                       "%s has no Conv, MatMul or Gemm node with a float activation input to quantize", what);
    if (p->nnodes == 0)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: every quantizable node (%d) is excluded; nothing to quantize",
                       what, p->nexcluded);
    return ENG_STATUS_OK;
}

/* ---- thresholds ---- */

float eng_quant_percentile_threshold(const double *hist, int nbins, float amax, double pct) {
    double total = 0;
    for (int i = 0; i < nbins; i++) total += hist[i];
    if (total <= 0 || amax <= 0) return amax;
    double target = total * pct / 100.0, cum = 0;
    for (int i = 0; i < nbins; i++) {
        cum += hist[i];
        if (cum >= target) return amax * (float)(i + 1) / (float)nbins;
    }
    return amax;
}

float eng_quant_entropy_threshold(const double *hist, int nbins, float amax, int levels) {
    if (amax <= 0 || nbins <= levels) return amax;
    double *P = malloc(sizeof *P * (size_t)nbins), *Q = malloc(sizeof *Q * (size_t)nbins);
    if (!P || !Q) {
        free(P);
        free(Q);
        return amax;
    }
    double best = INFINITY;
    int best_i = nbins;
    double above = 0; /* mass in bins >= i */
    for (int i = nbins - 1; i >= levels; i--) above += hist[i];
    for (int i = levels; i <= nbins; i++) {
        /* P: hist[0..i) with the clipped mass folded into its last bin */
        if (i > levels) above -= hist[i - 1];
        double ps = 0;
        for (int k = 0; k < i; k++) P[k] = hist[k], ps += hist[k];
        P[i - 1] += above;
        ps += above;
        if (ps <= 0) continue;
        /* Q: hist[0..i) merged into `levels` bins, each spread over its non-empty source bins */
        double qs = 0;
        for (int j = 0; j < levels; j++) {
            int b0 = (int)((int64_t)j * i / levels), b1 = j == levels - 1 ? i : (int)((int64_t)(j + 1) * i / levels);
            double s = 0;
            int nz = 0;
            for (int k = b0; k < b1; k++) {
                s += hist[k];
                nz += hist[k] != 0;
            }
            for (int k = b0; k < b1; k++) {
                Q[k] = hist[k] != 0 ? s / nz : 0;
                qs += Q[k];
            }
        }
        if (qs <= 0) continue;
        double kl = 0;
        for (int k = 0; k < i; k++) {
            if (P[k] <= 0) continue;
            double p = P[k] / ps, q = Q[k] > 0 ? Q[k] / qs : 1e-4 / ps; /* smoothing: a missed bin costs, not infinity */
            kl += p * log(p / q);
        }
        if (kl < best) {
            best = kl;
            best_i = i;
        }
    }
    free(P);
    free(Q);
    return amax * (float)best_i / (float)nbins;
}

/* ---- calibration runs ---- */

typedef struct calib_src {
    int input;  /* index into the fed inputs, or -1 */
    int output; /* index into the session outputs, or -1 */
} calib_src;

/* Visit every element of every observed activation of one batch. pass 0: min/max; pass 1: |x| histograms. */
static eng_status calib_observe(const eng_graph *g, const eng_tensor *t, eng_quant_act *a, double *hist,
                                float *amax) {
    int64_t n = eng_tensor_numel(t);
    const float *f = t->dtype == ENG_DTYPE_F32 ? t->data : NULL;
    for (int64_t i = 0; i < n; i++) {
        float x = f ? f[i] : (float)eng_tensor_get_f64(t, i);
        if (!isfinite(x))
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "calibration: activation '%s' holds a non-finite value (%g)",
                           g->values[a->value].name, x);
        if (!hist) {
            if (x < a->min) a->min = x;
            if (x > a->max) a->max = x;
        } else if (*amax > 0 && x != 0.0f) {
            int b = (int)(fabsf(x) / *amax * QUANT_NBINS);
            hist[b >= QUANT_NBINS ? QUANT_NBINS - 1 : b] += 1;
        }
    }
    return ENG_STATUS_OK;
}

static void calib_params(eng_quant_act *a, eng_quant_method m, const double *hist, double pct) {
    if (m == ENG_QUANT_MINMAX) {
        float lo = a->min < 0 ? a->min : 0, hi = a->max > 0 ? a->max : 0;
        a->dtype = ENG_DTYPE_U8;
        if (hi - lo <= 0) {
            a->scale = 1;
            a->zero_point = 0;
            return;
        }
        a->scale = (hi - lo) / 255.0f;
        long zp = lroundf(-lo / a->scale);
        a->zero_point = (int)(zp < 0 ? 0 : zp > 255 ? 255 : zp);
        return;
    }
    float amax = fmaxf(fabsf(a->min), fabsf(a->max));
    int nonneg = a->min >= 0;
    float t = m == ENG_QUANT_PERCENTILE ? eng_quant_percentile_threshold(hist, QUANT_NBINS, amax, pct)
                                        : eng_quant_entropy_threshold(hist, QUANT_NBINS, amax, nonneg ? 255 : 128);
    if (!(t > 0)) t = amax;
    a->dtype = nonneg ? ENG_DTYPE_U8 : ENG_DTYPE_I8;
    a->zero_point = 0;
    a->scale = t > 0 ? t / (nonneg ? 255.0f : 127.0f) : 1.0f;
}

eng_status eng_quant_calibrate(const eng_graph *g, const char *what, eng_dataset *d, const eng_quant_opts *o,
                               eng_quant_plan *p) {
    int *cols = calloc((size_t)g->ninputs + 1, sizeof *cols);
    const char **names = calloc((size_t)g->ninputs + 1, sizeof *names);
    eng_tensor *in = calloc((size_t)g->ninputs + 1, sizeof *in);
    calib_src *src = calloc((size_t)p->nacts + 1, sizeof *src);
    double *hist = NULL;
    float *amax = calloc((size_t)p->nacts + 1, sizeof *amax);
    eng_tensor *outs = NULL;
    eng_session *s = NULL;
    int ncols = 0;
    eng_status st = ENG_STATUS_OK;
    if (!cols || !names || !in || !src || !amax) st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    if (st == ENG_STATUS_OK) st = eng_eval_fit(g, d, what, cols, &ncols);
    eng_graph *cg = st == ENG_STATUS_OK ? eng_graph_clone(g) : NULL;
    if (st == ENG_STATUS_OK && !cg) st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory copying %s", what);
    if (st == ENG_STATUS_OK) {
        int k = 0;
        for (int i = 0; i < g->ninputs; i++)
            if (!g->values[g->inputs[i]].init) names[k++] = g->values[g->inputs[i]].name;
        int *no = realloc(cg->outputs, sizeof(int) * (size_t)(cg->noutputs + p->nacts + 1));
        if (!no) st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
        else cg->outputs = no;
        for (int a = 0; st == ENG_STATUS_OK && a < p->nacts; a++) {
            p->acts[a].min = INFINITY;
            p->acts[a].max = -INFINITY;
            src[a].input = src[a].output = -1;
            for (int i = 0; i < ncols; i++)
                if (strcmp(names[i], g->values[p->acts[a].value].name) == 0) src[a].input = i;
            if (src[a].input >= 0) continue;
            for (int i = 0; i < cg->noutputs; i++)
                if (cg->outputs[i] == p->acts[a].value) src[a].output = i;
            if (src[a].output < 0) {
                src[a].output = cg->noutputs;
                cg->outputs[cg->noutputs++] = p->acts[a].value;
            }
        }
    }
    if (st == ENG_STATUS_OK) {
        outs = calloc((size_t)cg->noutputs + 1, sizeof *outs);
        if (!outs) st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    if (st == ENG_STATUS_OK) {
        eng_session_opts so = {0};
        so.nthreads = o->nthreads;
        so.no_fuse = 1;
        st = eng_session_new_graph(cg, &so, &s);
        cg = NULL;
        if (st != ENG_STATUS_OK) st = eng_err_prefix(st, "%s: calibration graph: ", what);
    }
    eng_graph_free(&cg);
    int passes = o->method == ENG_QUANT_MINMAX ? 1 : 2;
    int64_t bs = o->batch_size > 0 ? o->batch_size : 256;
    for (int pass = 0; st == ENG_STATUS_OK && pass < passes; pass++) {
        if (pass == 1) {
            hist = calloc((size_t)p->nacts * QUANT_NBINS + 1, sizeof *hist);
            if (!hist) st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
            for (int a = 0; a < p->nacts; a++) amax[a] = fmaxf(fabsf(p->acts[a].min), fabsf(p->acts[a].max));
        }
        for (int64_t b0 = 0; st == ENG_STATUS_OK && b0 < d->n; b0 += bs) {
            int64_t rows = d->n - b0 < bs ? d->n - b0 : bs;
            eng_eval_rows(d, cols, ncols, b0, rows, in);
            st = eng_session_run(s, ncols, names, in, outs);
            if (st != ENG_STATUS_OK) {
                st = eng_err_prefix(st, "%s: calibration examples %lld..%lld: ", what, (long long)b0,
                                    (long long)(b0 + rows - 1));
                break;
            }
            for (int a = 0; st == ENG_STATUS_OK && a < p->nacts; a++) {
                const eng_tensor *t = src[a].input >= 0 ? &in[src[a].input] : &outs[src[a].output];
                st = calib_observe(g, t, &p->acts[a], pass ? hist + (size_t)a * QUANT_NBINS : NULL, &amax[a]);
            }
        }
    }
    double pct = o->percentile > 0 ? o->percentile : 99.99;
    for (int a = 0; st == ENG_STATUS_OK && a < p->nacts; a++)
        calib_params(&p->acts[a], o->method, hist ? hist + (size_t)a * QUANT_NBINS : NULL, pct);
    eng_session_free(&s);
    free(cols);
    free(names);
    free(in);
    free(src);
    free(hist);
    free(amax);
    free(outs);
    return st;
}
