/* test_ops.c - every op x backend x precision against the CPU's fp32 reference (STYLE.md, Tests; the shape of
 * llama.cpp's test-backend-ops, with ONNX's backend tests as the cases).
 *
 * Cases: the ONNX backend tests of Debian's libonnx-testdata (DIR/<test>/model.onnx + test_data_set_N/
 * input_K.pb, read by engine/ir/onnx-testdata.c exactly as `tensord conformance` reads them): the node suite
 * for every op, and `make test-ops` adds the pytorch-converted / pytorch-operator / simple suites, whose
 * convolutions and matmuls have random weights and real channel counts (the node tests' Conv data are small
 * integers, exact in bf16). Only tests in a suite's conformance expected-pass list run, so our fp32 answer is
 * already checked against ONNX's and a failure here is about a backend or a precision, never the op itself.
 * For each case and data set the CPU runs the model at fp32 (the reference); then every backend in ops_backends
 * runs the same inputs at every precision (fp32, bf16, fp16, int8; the CPU's fp32 is the reference itself) and
 * each output is compared with the reference: same dtype and shape, non-float outputs equal, float outputs
 * within a normalized MSE
 *     nmse = sum((y - ref)^2) / max(sum(ref^2), 1e-30)
 * (NaN where the reference has NaN and equal infinities match; any other non-finite difference is +inf).
 *
 * Thresholds (ops_nmse_max): a CPU plan that computed no step in a reduced dtype (lowp_steps == 0: every op
 * but the convolutions and matmuls of a bf16 plan, and the int8 plans, whose quantized kernels are the fp32
 * plan's too) must reproduce the reference to OPS_NMSE_EXACT, which checks that "every other op stays fp32".
 * A plan that did is held to the precision's default (ops_default_nmse) unless ops_tols names one of the
 * graph's ops at that precision (each entry says why). Another backend's fp32 is held to OPS_NMSE_FP32.
 *
 * Skips, never failures, each reason printed once: a backend absent here (CUDA without its plugin, a driver or a
 * device: the reason is printed), a precision the backend
 * refuses here (eng_plan_precision_check: fp16 on the CPU, bf16 without AVX512_BF16, int8 on a model with no
 * quantized op), absent test data. A precision the check accepts and a run then refuses is a failure: a server
 * would accept that model at that precision and fail its requests. Asserted: no failure, and on every backend
 * that runs bf16 / fp16, each op in ops_must_engage computes in it in at least one case (a plan property that
 * silently stays fp32 fails). Cases run one thread each (--threads), so the exact comparisons are repeatable.
 *
 * Usage: test_ops [--data DIR --expect FILE]... [--filter SUBSTR] [--threads N] [-v]   (default: the node suite)
 * Exit status: 0 passed (or the data is absent: says so), 1 a failure, 2 bad usage.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "engine/ir/graph.h"
#include "engine/ir/onnx-testdata.h"
#include "engine/ir/seq.h"
#include "engine/plan/session.h"
#include "kernels/backend-impl.h"

#define OPS_NMSE_EXACT 1e-12 /* a plan with no reduced-precision step: the reference's own kernels */
#define OPS_NMSE_FP32 1e-9   /* another backend at fp32: summation order differs, nothing else */
#define OPS_NMSE_TINY 1e-30  /* the denominator's floor, for an all-zero reference */

static const eng_precision ops_precs[] = {ENG_PRECISION_FP32, ENG_PRECISION_BF16, ENG_PRECISION_FP16,
                                          ENG_PRECISION_INT8};
#define OPS_NPREC ((int)(sizeof ops_precs / sizeof ops_precs[0]))

/* A plan with steps in the reduced dtype, by precision (indexed by eng_precision). bf16 keeps 8 significant
 * bits: rounding both operands of a product costs ~2^-8 relative each, an NMSE near 1e-5 for dot products
 * without cancellation; fp16 keeps 11 bits (~1e-7). int8 plans have no such steps (lowp_steps counts bf16 /
 * fp16 ones): a backend whose int8 kernels differ from the reference's would be held to this value. */
static const double ops_default_nmse[] = {
    [ENG_PRECISION_FP32] = OPS_NMSE_FP32,
    [ENG_PRECISION_FP16] = 1e-5,
    [ENG_PRECISION_BF16] = 1e-4,
    [ENG_PRECISION_INT8] = 1e-4,
};

/* Per op and precision, where the default does not fit ({NULL}-terminated). An entry replaces the precision's
 * default for a graph holding that op; with several listed ops in one graph, the largest entry applies. */
typedef struct ops_tol {
    const char *op;
    eng_precision prec;
    double max_nmse;
    const char *why;
} ops_tol;

static const ops_tol ops_tols[] = {
    /* None needed on the CPU so far: its bf16 convolutions measure 3e-6..2e-5 on the pytorch-converted suite's
     * random data (exactly 0 on the node tests' small integers), its bf16 matmuls and Gemms up to 1.5e-6. */
    {NULL, ENG_PRECISION_FP32, 0, NULL},
};

/* Ops whose reduced-precision kernels must engage in at least one case wherever the precision runs.
 * ConvTranspose is not here: its kernel (kernels/cpu/nn-deconv.c) has no bf16 compute, so it stays fp32. */
/* The matmuls of these suites are all below the sizes where bf16 pays (kernels/cpu/nn.c, mm_compute_ok), so
 * main() sets TENSORD_LOWP_ALL=1: kernels then take every shape they compute correctly in bf16, and the check
 * covers them (which shapes pay is tests/unit/test_precision.c's business). */
static const char *const ops_must_engage[] = {"Conv", "MatMul", "Gemm"};

/* The backends, CPU (the reference) first. get() returns NULL and says why where a backend is absent. */
typedef struct ops_backend {
    const char *name;
    const krn_backend *(*get)(const char **why);
} ops_backend;

static const krn_backend *ops_cpu(const char **why) { return krn_backend_cpu(); }
/* The CUDA plugin where this build has it and a device is there, else NULL with the reason (no plugin, no driver,
 * no device). */
static const krn_backend *ops_cuda(const char **why) {
    const krn_backend *b = NULL;
    if (krn_backend_by_name("cuda:0", &b, NULL) != ENG_STATUS_OK) *why = krn_cuda_unavailable_reason();
    return b;
}
/* The host-memory test device (kernels/sim): the CPU's kernels for a subset of ops behind device buffers, so every
 * case also runs through the planner's placement, its CPU fallback and the copies between; its fp32 must equal
 * the reference. */
static const krn_backend *ops_sim(const char **why) { return krn_backend_sim(); }

static const ops_backend ops_backends[] = {{"cpu", ops_cpu}, {"sim", ops_sim}, {"cuda", ops_cuda}};
#define OPS_NBACK ((int)(sizeof ops_backends / sizeof ops_backends[0]))

/* One summary cell: a backend at a precision, over the cases of one op. */
typedef struct ops_cell {
    int pass, skip, fail;
    int lowp;     /* cases whose plan computed steps in the reduced dtype */
    double worst; /* largest NMSE of a case that ran; -1 when none ran */
} ops_cell;

typedef struct ops_group {
    char name[64];
    int cases, ref_fail;
    ops_cell cell[OPS_NBACK][OPS_NPREC];
} ops_group;

typedef struct ops_ctx {
    int nthreads, verbose;
    ops_group *groups;
    int ngroups, cap;
    char skip_why[OPS_NBACK][OPS_NPREC][512]; /* the first reason each column skipped */
    int failures;
} ops_ctx;

/* Result of one case in one column, over its data sets. */
enum { OPS_NOT_RUN, OPS_PASS, OPS_SKIP, OPS_FAIL };
typedef struct ops_result {
    int state, lowp;
    double worst;
} ops_result;

/* The summary row of a case: "<Op> (expanded)" for a function-expanded test (ONNX names its values
 * "<Op>_<test>_function_..."), else the graph's op types but Constant, '+'-joined in node order. */
static void ops_group_name(const eng_graph *g, const char *test, char *out, size_t n) {
    char needle[300];
    snprintf(needle, sizeof needle, "_%s_function_", test);
    for (int v = 0; v < g->nvalues; v++) {
        const char *hit = g->values[v].name ? strstr(g->values[v].name, needle) : NULL;
        if (hit && hit > g->values[v].name) {
            snprintf(out, n, "%.*s (expanded)", (int)(hit - g->values[v].name), g->values[v].name);
            return;
        }
    }
    out[0] = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const char *op = g->nodes[i].op_type;
        if (strcmp(op, "Constant") == 0 && g->nnodes > 1) continue;
        int seen = 0;
        for (int j = 0; j < i && !seen; j++) seen = strcmp(g->nodes[j].op_type, op) == 0;
        if (seen) continue;
        size_t len = strlen(out);
        snprintf(out + len, n - len, "%s%s", len ? "+" : "", op);
    }
    if (!out[0]) snprintf(out, n, "(no nodes)");
}

static ops_group *ops_group_get(ops_ctx *cx, const char *name) {
    for (int i = 0; i < cx->ngroups; i++)
        if (strcmp(cx->groups[i].name, name) == 0) return &cx->groups[i];
    if (cx->ngroups == cx->cap) {
        int nc = cx->cap ? cx->cap * 2 : 128;
        ops_group *ng = realloc(cx->groups, (size_t)nc * sizeof *ng);
        if (!ng) return NULL;
        cx->groups = ng, cx->cap = nc;
    }
    ops_group *gr = &cx->groups[cx->ngroups++];
    memset(gr, 0, sizeof *gr);
    snprintf(gr->name, sizeof gr->name, "%s", name);
    for (int b = 0; b < OPS_NBACK; b++)
        for (int p = 0; p < OPS_NPREC; p++) gr->cell[b][p].worst = -1;
    return gr;
}

/* The largest NMSE a case may show on backend b at precision prec. */
static double ops_nmse_max(const eng_graph *g, int b, eng_precision prec, int lowp_steps, const char **why) {
    *why = NULL;
    if (!lowp_steps) return b == 0 ? OPS_NMSE_EXACT : OPS_NMSE_FP32;
    double m = ops_default_nmse[prec];
    int found = 0;
    for (size_t t = 0; ops_tols[t].op; t++) {
        if (ops_tols[t].prec != prec) continue;
        for (int i = 0; i < g->nnodes; i++)
            if (strcmp(g->nodes[i].op_type, ops_tols[t].op) == 0) {
                if (!found || ops_tols[t].max_nmse > m) m = ops_tols[t].max_nmse, *why = ops_tols[t].why;
                found = 1;
                break;
            }
    }
    return m;
}

static double ops_nmse(const eng_tensor *y, const eng_tensor *ref) {
    double num = 0, den = 0;
    int64_t n = eng_tensor_numel(ref);
    for (int64_t i = 0; i < n; i++) {
        double a = eng_tensor_get_f64(y, i), r = eng_tensor_get_f64(ref, i);
        if (isnan(r) && isnan(a)) continue;
        if (isinf(r) && a == r) continue;
        if (!isfinite(r) || !isfinite(a)) return INFINITY;
        num += (a - r) * (a - r);
        den += r * r;
    }
    return num / (den > OPS_NMSE_TINY ? den : OPS_NMSE_TINY);
}

/* Compare the n outputs y with the reference. 0 with a message on a dtype, shape or non-float mismatch; else 1,
 * the largest float NMSE in *worst and its output in *at. */
static int ops_compare(const eng_tensor *y, eng_tensor *const *ref, int n, double *worst, int *at, char *why,
                       size_t wn) {
    char a[160], b[160];
    *worst = 0, *at = 0;
    for (int k = 0; k < n; k++) {
        const eng_seq *ys = eng_seq_get(&y[k]), *rs = eng_seq_get(ref[k]);
        if (ys && rs && ys->n == rs->n) { /* sequences: element by element */
            for (int64_t i = 0; i < ys->n; i++) {
                const eng_tensor *ri = &rs->items[i];
                double e;
                int at1;
                if (!ops_compare(&ys->items[i], (eng_tensor *const *)&ri, 1, &e, &at1, why, wn)) return 0;
                if (e > *worst || isnan(e)) *worst = e, *at = k;
            }
            continue;
        }
        if (y[k].dtype != ref[k]->dtype || !eng_shape_equal(&y[k], ref[k]) || (ys && rs)) {
            snprintf(why, wn, "output %d: %s %s, reference %s %s", k, eng_dtype_name(y[k].dtype),
                     eng_shape_str(y[k].dims, y[k].ndim, a, sizeof a), eng_dtype_name(ref[k]->dtype),
                     eng_shape_str(ref[k]->dims, ref[k]->ndim, b, sizeof b));
            return 0;
        }
        if (!eng_dtype_is_float(ref[k]->dtype)) {
            int64_t cnt = eng_tensor_numel(ref[k]);
            for (int64_t i = 0; i < cnt; i++)
                if (eng_tensor_get_i64(&y[k], i) != eng_tensor_get_i64(ref[k], i)) {
                    snprintf(why, wn, "output %d element %lld: %lld, reference %lld", k, (long long)i,
                             (long long)eng_tensor_get_i64(&y[k], i), (long long)eng_tensor_get_i64(ref[k], i));
                    return 0;
                }
            continue;
        }
        double e = ops_nmse(&y[k], ref[k]);
        if (e > *worst || isnan(e)) *worst = e, *at = k;
    }
    return 1;
}

static void ops_fail(ops_ctx *cx, ops_result *r, const char *test, int b, eng_precision prec, const char *msg) {
    printf("FAIL %s: %s %s: %s\n", test, ops_backends[b].name, eng_precision_name(prec), msg);
    r->state = OPS_FAIL;
    cx->failures++;
}

static void ops_skip(ops_ctx *cx, ops_result *r, int b, int p, const char *why) {
    r->state = OPS_SKIP;
    if (!cx->skip_why[b][p][0]) snprintf(cx->skip_why[b][p], sizeof cx->skip_why[b][p], "%s", why);
}

/* One data set of a case: the reference run, then every column that is not skipped. A backend other than the
 * reference whose fp32 plan is UNSUPPORTED lacks an op: its columns skip. Any other refused run fails, a
 * reduced precision's UNSUPPORTED included: eng_plan_precision_check accepted it, so a server would accept the
 * model at that precision and then fail its requests. */
static void ops_run_set(ops_ctx *cx, const char *test, const char *case_dir, const char *set, eng_session **sess,
                        ops_result res[OPS_NBACK][OPS_NPREC], int *ref_fail) {
    const eng_graph *g = eng_session_graph(sess[0]);
    char msg[1024];
    eng_testdata_set d;
    eng_tensor **ref = calloc((size_t)g->noutputs + 1, sizeof *ref);
    eng_tensor *y = calloc((size_t)g->noutputs + 1, sizeof *y);
    eng_status st = eng_testdata_set_load(case_dir, set, g, &d);
    if (st == ENG_STATUS_OK && (!ref || !y)) st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "output arrays");
    if (st == ENG_STATUS_OK) st = eng_session_run_at(sess[0], ENG_PRECISION_FP32, d.nfeed, d.names, d.feed, y);
    for (int k = 0; st == ENG_STATUS_OK && k < g->noutputs; k++)
        if (!(ref[k] = eng_tensor_clone(&y[k]))) st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "copying output %d", k);
    if (st != ENG_STATUS_OK) {
        printf("FAIL %s: %s: reference run (cpu fp32): %s\n", test, set, eng_last_error());
        cx->failures++;
        *ref_fail = 1;
    }
    for (int b = 0; st == ENG_STATUS_OK && b < OPS_NBACK; b++)
        for (int p = 0; p < OPS_NPREC; p++) {
            ops_result *r = &res[b][p];
            eng_precision prec = ops_precs[p];
            if ((b == 0 && prec == ENG_PRECISION_FP32) || r->state == OPS_SKIP || r->state == OPS_FAIL) continue;
            eng_status rs = eng_session_run_at(sess[b], prec, d.nfeed, d.names, d.feed, y);
            if (rs == ENG_STATUS_UNSUPPORTED && b > 0 && prec == ENG_PRECISION_FP32) {
                for (int q = 0; q < OPS_NPREC; q++) ops_skip(cx, &res[b][q], b, q, eng_last_error());
                break;
            }
            if (rs != ENG_STATUS_OK) {
                snprintf(msg, sizeof msg, "%s: run: %s", set, eng_last_error());
                ops_fail(cx, r, test, b, prec, msg);
                continue;
            }
            eng_plan_stats ps;
            eng_session_last_stats(sess[b], &ps);
            double worst, max;
            int at;
            const char *why;
            char cmp[600];
            if (!ops_compare(y, ref, g->noutputs, &worst, &at, cmp, sizeof cmp)) {
                snprintf(msg, sizeof msg, "%s: %s", set, cmp);
                ops_fail(cx, r, test, b, prec, msg);
                continue;
            }
            max = ops_nmse_max(eng_session_graph(sess[b]), b, prec, ps.lowp_steps, &why);
            if (ps.lowp_steps) r->lowp = 1;
            if (r->state == OPS_NOT_RUN || worst > r->worst) r->worst = worst;
            if (!(worst <= max)) {
                snprintf(msg, sizeof msg, "%s output %d ('%s'): nmse %.3g > %.3g (%d of %d steps in %s)%s%s", set, at,
                         g->values[g->outputs[at]].name, worst, max, ps.lowp_steps, ps.steps, eng_precision_name(prec),
                         why ? "; tolerance: " : "", why ? why : "");
                ops_fail(cx, r, test, b, prec, msg);
                continue;
            }
            r->state = OPS_PASS;
        }
    for (int k = 0; ref && k < g->noutputs; k++) eng_tensor_destroy(&ref[k]);
    free(ref);
    free(y);
    eng_testdata_set_free(&d);
}

/* Whether column (b, p) runs this case: OPS_NOT_RUN (it does; sess[b] is open), OPS_SKIP (the backend is absent,
 * lacks an op of the model, or refuses the precision here) or OPS_FAIL (loading failed otherwise), *why saying
 * why (valid until the next engine error). */
static int ops_column_state(const char *model, int b, eng_precision prec, eng_session **sess, int nthreads,
                            const char **why) {
    const krn_backend *kb = ops_backends[b].get(why);
    if (!kb) return OPS_SKIP;
    if (!sess[b]) {
        eng_session_opts so = {.nthreads = nthreads, .backend = kb};
        eng_status st = eng_session_new_file(model, &so, &sess[b]);
        *why = eng_last_error();
        if (st != ENG_STATUS_OK) return st == ENG_STATUS_UNSUPPORTED ? OPS_SKIP : OPS_FAIL;
    }
    eng_status st = eng_plan_precision_check(eng_session_graph(sess[b]), kb, prec);
    *why = eng_last_error();
    return st == ENG_STATUS_OK ? OPS_NOT_RUN : OPS_SKIP;
}

/* One test case: dir/test, named suite/test in messages. */
static void ops_case(ops_ctx *cx, const char *dir, const char *suite, const char *test) {
    char case_dir[4096], model[4200], label[600];
    snprintf(case_dir, sizeof case_dir, "%s/%s", dir, test);
    snprintf(model, sizeof model, "%s/model.onnx", case_dir);
    snprintf(label, sizeof label, "%s/%s", suite, test);
    eng_session *sess[OPS_NBACK] = {0};
    eng_session_opts so = {.nthreads = cx->nthreads};
    if (eng_session_new_file(model, &so, &sess[0]) != ENG_STATUS_OK) {
        printf("FAIL %s: load: %s\n", label, eng_last_error());
        cx->failures++;
        return;
    }
    char name[64];
    ops_group_name(eng_session_graph(sess[0]), test, name, sizeof name);
    ops_group *gr = ops_group_get(cx, name);
    if (!gr) {
        printf("FAIL %s: out of memory\n", label);
        cx->failures++;
        eng_session_free(&sess[0]);
        return;
    }
    gr->cases++;
    ops_result res[OPS_NBACK][OPS_NPREC];
    memset(res, 0, sizeof res);
    for (int b = 0; b < OPS_NBACK; b++)
        for (int p = 0; p < OPS_NPREC; p++) {
            if (b == 0 && ops_precs[p] == ENG_PRECISION_FP32) continue;
            const char *why = NULL;
            int state = ops_column_state(model, b, ops_precs[p], sess, cx->nthreads, &why);
            if (state == OPS_FAIL) ops_fail(cx, &res[b][p], label, b, ops_precs[p], why);
            else if (state == OPS_SKIP) ops_skip(cx, &res[b][p], b, p, why);
        }
    int nsets = 0, ref_fail = 0;
    char **sets = eng_testdata_dirs(case_dir, "test_data_set_", &nsets);
    for (int si = 0; si < nsets && !ref_fail; si++) ops_run_set(cx, label, case_dir, sets[si], sess, res, &ref_fail);
    eng_testdata_names_free(sets, nsets);
    gr->ref_fail += ref_fail;
    for (int b = 0; b < OPS_NBACK; b++)
        for (int p = 0; p < OPS_NPREC; p++) {
            const ops_result *r = &res[b][p];
            ops_cell *c = &gr->cell[b][p];
            if (r->state == OPS_PASS) c->pass++;
            else if (r->state == OPS_SKIP) c->skip++;
            else if (r->state == OPS_FAIL) c->fail++;
            c->lowp += r->lowp;
            if ((r->state == OPS_PASS || r->state == OPS_FAIL) && r->worst > c->worst) c->worst = r->worst;
            if (cx->verbose && r->state == OPS_PASS) /* failures are printed as they happen */
                printf("PASS %s: %s %s nmse %.3g%s\n", label, ops_backends[b].name, eng_precision_name(ops_precs[p]),
                       r->worst, r->lowp ? " (steps in the reduced dtype)" : "");
        }
    for (int b = 0; b < OPS_NBACK; b++) eng_session_free(&sess[b]);
}

static int ops_group_cmp(const void *a, const void *b) {
    return strcmp(((const ops_group *)a)->name, ((const ops_group *)b)->name);
}

static int ops_prec_is_lowp(eng_precision p) { return p == ENG_PRECISION_BF16 || p == ENG_PRECISION_FP16; }

/* The table's columns: every (backend, precision) but the reference, of the backends that ran anything. */
static int ops_column_shown(const ops_group *total, int b, int p) {
    if (b == 0 && ops_precs[p] == ENG_PRECISION_FP32) return 0;
    for (int q = 0; q < OPS_NPREC; q++)
        if (total->cell[b][q].pass || total->cell[b][q].fail) return 1;
    return 0;
}

#define OPS_NAME_W 36

static void ops_print_row(const ops_group *gr, const ops_group *total) {
    printf("%-*.*s %5d%s", OPS_NAME_W, OPS_NAME_W, gr->name, gr->cases, gr->ref_fail ? "!" : " ");
    for (int b = 0; b < OPS_NBACK; b++)
        for (int p = 0; p < OPS_NPREC; p++) {
            if (!ops_column_shown(total, b, p)) continue;
            const ops_cell *c = &gr->cell[b][p];
            char w[16];
            if (c->worst < 0) snprintf(w, sizeof w, "-");
            else if (c->worst == 0) snprintf(w, sizeof w, "0");
            else snprintf(w, sizeof w, "%.1e", c->worst);
            printf("| %4d %4d %4d %7s ", c->pass, c->skip, c->fail, w);
            if (ops_prec_is_lowp(ops_precs[p])) printf("%4d ", c->lowp);
        }
    printf("\n");
}

static void ops_print_summary(ops_ctx *cx, const ops_group *total) {
    qsort(cx->groups, (size_t)cx->ngroups, sizeof *cx->groups, ops_group_cmp);
    printf("\n%-*s %5s ", OPS_NAME_W, "", "");
    for (int b = 0; b < OPS_NBACK; b++)
        for (int p = 0; p < OPS_NPREC; p++) {
            if (!ops_column_shown(total, b, p)) continue;
            char h[32];
            snprintf(h, sizeof h, "%s %s", ops_backends[b].name, eng_precision_name(ops_precs[p]));
            printf("| %-*s", ops_prec_is_lowp(ops_precs[p]) ? 28 : 23, h);
        }
    printf("\n%-*s %5s ", OPS_NAME_W, "op (what the cases test)", "cases");
    for (int b = 0; b < OPS_NBACK; b++)
        for (int p = 0; p < OPS_NPREC; p++) {
            if (!ops_column_shown(total, b, p)) continue;
            printf("| %4s %4s %4s %7s ", "pass", "skip", "fail", "nmse");
            if (ops_prec_is_lowp(ops_precs[p])) printf("%4s ", eng_precision_name(ops_precs[p]));
        }
    printf("\n");
    for (int i = 0; i < cx->ngroups; i++) ops_print_row(&cx->groups[i], total);
    ops_print_row(total, total);
    printf("nmse: the worst case's normalized MSE against cpu fp32 (0: bit-equal); bf16 / fp16: cases whose plan "
           "computed steps in it; '!': the cpu fp32 reference run failed\n");
    for (int b = 0; b < OPS_NBACK; b++) {
        int same = 1;
        for (int p = 0; p < OPS_NPREC; p++) same = same && strcmp(cx->skip_why[b][p], cx->skip_why[b][0]) == 0;
        if (same && cx->skip_why[b][0][0]) {
            printf("skipped: %s, every precision (%d cases): %s\n", ops_backends[b].name, total->cell[b][0].skip,
                   cx->skip_why[b][0]);
            continue;
        }
        for (int p = 0; p < OPS_NPREC; p++)
            if (cx->skip_why[b][p][0])
                printf("skipped: %s %s (%d cases): %s\n", ops_backends[b].name, eng_precision_name(ops_precs[p]),
                       total->cell[b][p].skip, cx->skip_why[b][p]);
    }
}

/* Every backend that ran a reduced precision computed each ops_must_engage op in it at least once (an op with
 * no case in the suites run is reported, not failed). Returns the number of misses. */
static int ops_check_engaged(const ops_ctx *cx, const ops_group *total) {
    int bad = 0;
    for (int b = 0; b < OPS_NBACK; b++)
        for (int p = 0; p < OPS_NPREC; p++) {
            if (!ops_prec_is_lowp(ops_precs[p]) || !total->cell[b][p].pass) continue;
            const char *pn = eng_precision_name(ops_precs[p]);
            printf("%s %s, cases computed in %s:", ops_backends[b].name, pn, pn);
            int miss = 0;
            for (size_t e = 0; e < sizeof ops_must_engage / sizeof ops_must_engage[0]; e++) {
                int lowp = 0, ran = 0;
                for (int i = 0; i < cx->ngroups; i++) {
                    const ops_cell *c = &cx->groups[i].cell[b][p];
                    if (strcmp(cx->groups[i].name, ops_must_engage[e]) == 0) lowp += c->lowp, ran += c->pass + c->fail;
                }
                printf(" %s %d/%d", ops_must_engage[e], lowp, ran);
                if (ran && !lowp) miss++;
            }
            printf("\n");
            if (miss)
                printf("FAIL %s %s: an op of ops_must_engage never computed in %s (its plans stayed fp32)\n",
                       ops_backends[b].name, pn, pn);
            bad += miss;
        }
    return bad;
}

static const char *ops_basename(const char *path) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    const char *s = path + n;
    while (s > path && s[-1] != '/') s--;
    return s;
}

#define OPS_MAX_SUITES 8

int main(int argc, char **argv) {
    setenv("TENSORD_LOWP_ALL", "1", 1); /* see ops_must_engage */
    const char *dirs[OPS_MAX_SUITES] = {0}, *expects[OPS_MAX_SUITES] = {0};
    int nsuites = 0, nexp = 0;
    const char *filter = NULL;
    ops_ctx cx = {.nthreads = 1};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--data") == 0 && i + 1 < argc && nsuites < OPS_MAX_SUITES) dirs[nsuites++] = argv[++i];
        else if (strcmp(argv[i], "--expect") == 0 && i + 1 < argc && nexp < OPS_MAX_SUITES) expects[nexp++] = argv[++i];
        else if (strcmp(argv[i], "--filter") == 0 && i + 1 < argc) filter = argv[++i];
        else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) cx.nthreads = atoi(argv[++i]);
        else if (strcmp(argv[i], "-v") == 0) cx.verbose = 1;
        else nexp = -1;
    }
    if (!nsuites) dirs[nsuites++] = "/usr/share/libonnx-testdata/data/node", expects[nexp++] = "tests/conformance/expected-node.txt";
    if (nexp != nsuites) {
        fprintf(stderr, "usage: %s [--data DIR --expect FILE]... [--filter SUBSTR] [--threads N] [-v]\n"
                        "  DIR: ONNX backend tests (DIR/<test>/model.onnx); FILE: those our fp32 run passes\n", argv[0]);
        return 2;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int ran = 0;
    for (int su = 0; su < nsuites; su++) {
        struct stat sb;
        if (stat(dirs[su], &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            printf("test_ops: skipped: no ONNX backend tests at %s (`make deps` installs libonnx-testdata)\n", dirs[su]);
            continue;
        }
        int ntests = 0;
        char **tests = eng_testdata_names_read(expects[su], &ntests);
        if (!tests) {
            fprintf(stderr, "test_ops: cannot read the expected-pass list '%s'\n", expects[su]);
            return 2;
        }
        printf("test_ops: %s (the %d tests of %s) on every backend x precision against cpu fp32\n", dirs[su], ntests,
               expects[su]);
        for (int t = 0; t < ntests; t++) {
            if (filter && !strstr(tests[t], filter)) continue;
            eng_err_clear();
            ops_case(&cx, dirs[su], ops_basename(dirs[su]), tests[t]);
            ran++;
            fflush(stdout);
        }
        eng_testdata_names_free(tests, ntests);
    }
    if (!ran) {
        printf("test_ops: no case ran\n");
        free(cx.groups);
        return 0;
    }
    ops_group total;
    memset(&total, 0, sizeof total);
    snprintf(total.name, sizeof total.name, "all");
    for (int b = 0; b < OPS_NBACK; b++)
        for (int p = 0; p < OPS_NPREC; p++) total.cell[b][p].worst = -1;
    for (int i = 0; i < cx.ngroups; i++) {
        const ops_group *gr = &cx.groups[i];
        total.cases += gr->cases, total.ref_fail += gr->ref_fail;
        for (int b = 0; b < OPS_NBACK; b++)
            for (int p = 0; p < OPS_NPREC; p++) {
                ops_cell *c = &total.cell[b][p];
                const ops_cell *g = &gr->cell[b][p];
                c->pass += g->pass, c->skip += g->skip, c->fail += g->fail, c->lowp += g->lowp;
                if (g->worst > c->worst) c->worst = g->worst;
            }
    }
    ops_print_summary(&cx, &total);
    int bad = filter ? 0 : ops_check_engaged(&cx, &total);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("test_ops: %d cases, %d failures%s, %.1f s\n", ran, cx.failures + bad,
           filter ? " (--filter: the engaged-op check is off)" : "",
           (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
    free(cx.groups);
    return cx.failures || bad ? 1 : 0;
}
