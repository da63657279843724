/* plan-ctrl.c - ONNX control flow: If, Loop, Scan and SequenceMap, ops that run subgraphs.
 *
 * A subgraph is planned like the main graph. Its outer-scope reads are the node's implicit inputs (graph.h:
 * eng_node.nimplicit): at prepare, the subgraph is cloned with those values appended to its inputs, except the
 * ones that are constants in the enclosing plan (weights), which become borrowed initializers of the clone so the
 * body's kernels pack them once, as anywhere else. Plans of a subgraph are cached per input shapes (CTRL_CACHE).
 *
 * Static where shapes allow: at plan time, infer plans the subgraph for the shapes it will see; when those plans
 * are static and give fixed output shapes (If: the branch taken, or both agreeing; Loop: loop-carried shapes that
 * do not change, and scan outputs only with a trip count known at plan time; Scan: always), the node is an ordinary
 * static step. Otherwise it returns NEEDS_DATA and runs in a dynamic plan, allocating its outputs
 * (ENG_OP_ALLOCATES).
 *
 * Loop-carried values are double-buffered: iteration i reads buffer i%2's set and the body plan writes the next
 * set straight into the other (eng_plan_opts.ext_outputs), so nothing is copied per iteration; values the body
 * passes through unchanged (TensorFlow's while loops carry their weights so) stay where they are, and when they are
 * constants of the enclosing plan they are constants of the body too (packed once); scan outputs are
 * written by the body straight into their slot of the stacked output where the axis allows. Only where a carried
 * shape really changes between iterations does the body run as a dynamic plan (eng_plan_opts.any_shape), with a
 * copy of each carried value per iteration.
 *
 * SequenceMap runs its body once per element of its input sequences, collecting each output into a sequence.
 *
 * Limits: a Loop stops past eng_max_loop_iterations() iterations (INVALID_ARGUMENT: the request's data asked for
 * more), and a Loop, Scan or SequenceMap past the calling thread's run deadline (DEADLINE_EXCEEDED), each naming the
 * node. Nesting depth is bounded when the model is loaded
 * (ENG_ONNX_MAX_GRAPH_DEPTH), which bounds the recursion of plans in plans.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../kernels/kernel.h"
#include "../ir/seq.h"
#include "../ops/op.h"
#include "plan.h"

/* ---- run limits ---- */

static _Thread_local int64_t ctrl_deadline_us;
static _Atomic int64_t ctrl_max_iters = 1000000;

void eng_run_set_deadline(int64_t deadline_us) { ctrl_deadline_us = deadline_us > 0 ? deadline_us : 0; }
int64_t eng_run_deadline(void) { return ctrl_deadline_us; }
void eng_set_max_loop_iterations(int64_t n) { atomic_store(&ctrl_max_iters, n > 0 ? n : 1); }
int64_t eng_max_loop_iterations(void) { return atomic_load(&ctrl_max_iters); }

static int64_t ctrl_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static eng_status ctrl_check_deadline(int64_t done) {
    int64_t dl = ctrl_deadline_us;
    if (dl && ctrl_now_us() >= dl)
        return eng_err(ENG_STATUS_DEADLINE_EXCEEDED, "the run's deadline passed after %lld iterations", (long long)done);
    return ENG_STATUS_OK;
}

/* ---- subgraphs and their plans ---- */

enum { CTRL_IF = 0, CTRL_LOOP, CTRL_SCAN, CTRL_MAP };
#define CTRL_CACHE 8
/* A subgraph plan whose activations take less than this runs on one thread (plans are cached per thread count) */
#define CTRL_SMALL_BYTES (64 << 10)

typedef struct ctrl_entry {
    eng_tensor key[ENG_OP_MAX_IO]; /* dtype and shape of each input (any_shape plans: dtype only) */
    int nkey, any, nthreads;
    eng_plan *plan;
    uint64_t used;
} ctrl_entry;

typedef struct ctrl_sub {
    const char *attr;   /* "then_branch", "else_branch", "body" */
    eng_graph *flat;    /* the subgraph's clone: its inputs, then the outer values fed per run */
    int nformal;        /* the subgraph's own inputs */
    int nouter;         /* outer values fed per run */
    int outer_in[ENG_OP_MAX_IO]; /* per fed outer value: the node input holding it */
    int *borrowed;      /* clone values whose initializer borrows an outer constant's data */
    size_t const_bytes; /* the clone's initializers, borrowed ones included */
    int nborrowed;
    ctrl_entry cache[CTRL_CACHE];
    uint64_t clock;
} ctrl_sub;

typedef struct ctrl_params {
    int op;
    int nexplicit;      /* node inputs that are ONNX inputs (the rest are implicit) */
    int nsub;
    ctrl_sub sub[2];
    /* Loop: loop-carried values the body passes through unchanged (TensorFlow's while loops carry their weights so):
     * never copied between iterations; `bound`: also a constant of the enclosing plan, made a constant of the body */
    unsigned char pass[ENG_OP_MAX_IO], bound[ENG_OP_MAX_IO];
    /* Scan */
    int scan8;          /* opset 8 Scan: a batch axis and sequence_lens */
    int nstate, nscan_in, nscan_out;
    int in_axis[ENG_OP_MAX_IO], in_rev[ENG_OP_MAX_IO], out_axis[ENG_OP_MAX_IO], out_rev[ENG_OP_MAX_IO];
} ctrl_params;

static void ctrl_sub_free(ctrl_sub *s) {
    for (int i = 0; i < CTRL_CACHE; i++) eng_plan_free(&s->cache[i].plan);
    if (s->flat)
        for (int i = 0; i < s->nborrowed; i++) s->flat->values[s->borrowed[i]].init->data = NULL;
    free(s->borrowed);
    eng_graph_free(&s->flat);
}

static void ctrl_free_params(void *pp) {
    ctrl_params *p = pp;
    if (!p) return;
    for (int i = 0; i < p->nsub; i++) ctrl_sub_free(&p->sub[i]);
    free(p);
}

static eng_status ctrl_sub_init(eng_op_ctx *c, ctrl_params *p, const char *attr, ctrl_sub *s) {
    const eng_attr *a = eng_node_attr(c->node, attr);
    s->attr = attr;
    if (!a || a->type != ENG_ATTR_GRAPH || !a->g)
        return eng_err(ENG_STATUS_INVALID_MODEL, "missing the graph attribute '%s'", attr);
    if (!(s->flat = eng_graph_clone(a->g))) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    eng_graph *f = s->flat;
    f->opset = c->opset;
    f->opset_ml = c->graph->opset_ml;
    s->nformal = f->ninputs;
    int *refs = NULL, nrefs = 0;
    ENG_TRY(eng_graph_outer_refs(f, &refs, &nrefs));
    int *ins = realloc(f->inputs, ((size_t)f->ninputs + (size_t)nrefs + 1) * sizeof(int));
    s->borrowed = malloc(((size_t)f->nvalues + 1) * sizeof(int));
    if (!ins || !s->borrowed) {
        if (ins) f->inputs = ins;
        free(refs);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    f->inputs = ins;
    eng_status st = ENG_STATUS_OK;
    for (int r = 0; r < nrefs && st == ENG_STATUS_OK; r++) {
        eng_value *val = &f->values[refs[r]];
        int j = p->nexplicit;
        while (j < c->nin && !(c->node->inputs[j] >= 0 &&
                               strcmp(c->graph->values[c->node->inputs[j]].name, val->name) == 0))
            j++;
        if (j >= c->nin) {
            st = eng_err(ENG_STATUS_INVALID_MODEL, "subgraph '%s' reads '%s', which no enclosing graph defines", attr,
                         val->name);
            break;
        }
        const eng_tensor *t = &c->in[j];
        if (t->data && t->dtype != ENG_DTYPE_SEQUENCE && t->dtype != ENG_DTYPE_UNDEFINED) {
            /* a constant of the enclosing plan: the clone's initializer, borrowing its bytes */
            eng_tensor *bt = malloc(sizeof *bt);
            if (!bt) {
                st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
                break;
            }
            *bt = *t;
            val->init = bt;
            val->dtype = t->dtype;
            val->ndim = t->ndim;
            for (int d = 0; d < ENG_MAX_DIMS; d++) val->dims[d] = d < t->ndim ? t->dims[d] : -1;
            s->borrowed[s->nborrowed++] = refs[r];
        } else if (s->nformal + s->nouter >= ENG_OP_MAX_IO) {
            st = eng_err(ENG_STATUS_UNSUPPORTED, "subgraph '%s' reads more than %d values", attr, ENG_OP_MAX_IO);
        } else {
            f->inputs[f->ninputs++] = refs[r];
            s->outer_in[s->nouter++] = j;
        }
    }
    free(refs);
    for (int v = 0; v < f->nvalues; v++)
        if (f->values[v].init) s->const_bytes += eng_tensor_nbytes(f->values[v].init);
    return st;
}

static int ctrl_key_match(const ctrl_entry *e, const eng_tensor *in, int n, int any, int nthreads) {
    if (e->nkey != n || e->any != any || e->nthreads != nthreads) return 0;
    for (int i = 0; i < n; i++) {
        if (e->key[i].dtype != in[i].dtype) return 0;
        if (!any && !eng_shape_equal(&e->key[i], &in[i])) return 0;
    }
    return 1;
}

/* The plan of sub s for inputs fin (nformal + nouter, shapes and dtypes); `any`: the any_shape plan. */
static eng_status ctrl_sub_plan(ctrl_sub *s, const eng_tensor *fin, int nthreads, int any, eng_plan **out) {
    int n = s->nformal + s->nouter;
    ctrl_entry *victim = &s->cache[0];
    for (int i = 0; i < CTRL_CACHE; i++) {
        ctrl_entry *e = &s->cache[i];
        if (e->plan && ctrl_key_match(e, fin, n, any, nthreads)) {
            e->used = ++s->clock;
            *out = e->plan;
            return ENG_STATUS_OK;
        }
        if (!e->plan || (victim->plan && e->used < victim->used)) victim = e;
    }
    eng_plan_opts o = {.nthreads = nthreads, .no_split = 1, .ext_outputs = 1, .any_shape = any};
    eng_plan *pl = NULL;
    eng_status st = eng_plan_new(s->flat, &o, fin, &pl);
    if (st != ENG_STATUS_OK) return eng_err_prefix(st, "subgraph '%s': ", s->attr);
    eng_plan_stats ps;
    eng_plan_get_stats(pl, &ps);
    if (nthreads != 1 && !ps.dynamic && ps.arena_bytes < CTRL_SMALL_BYTES && s->const_bytes < 4 * CTRL_SMALL_BYTES) {
        /* a small body (activations and weights) runs once per iteration: threads would cost more to wake than they
         * save; a body that streams large weights (an LSTM cell's GEMV) keeps them */
        eng_plan *one = NULL;
        o.nthreads = 1;
        if (eng_plan_new(s->flat, &o, fin, &one) == ENG_STATUS_OK) {
            eng_plan_free(&pl);
            pl = one;
        }
    }
    eng_plan_free(&victim->plan);
    victim->plan = pl;
    victim->nkey = n;
    victim->any = any;
    victim->nthreads = nthreads;
    for (int i = 0; i < n; i++) {
        victim->key[i] = fin[i];
        victim->key[i].data = NULL;
    }
    victim->used = ++s->clock;
    *out = pl;
    return ENG_STATUS_OK;
}

/* fin[nformal..) = the fed outer values, from the node's inputs. */
static void ctrl_fill_outer(const ctrl_sub *s, const eng_tensor *in, eng_tensor *fin) {
    for (int k = 0; k < s->nouter; k++) fin[s->nformal + k] = in[s->outer_in[k]];
}

static int ctrl_same(const eng_tensor *a, const eng_tensor *b) { return a->dtype == b->dtype && eng_shape_equal(a, b); }

/* At plan time (infer): sub s's plan for the formal inputs in fin[0..nformal) and the node's outer values; NEEDS_DATA
 * when that plan is itself dynamic (the node's output shapes are then known only when it runs). */
static eng_status ctrl_infer_plan(eng_op_ctx *c, ctrl_sub *s, eng_tensor *fin, eng_plan **pl) {
    ctrl_fill_outer(s, c->in, fin);
    ENG_TRY(ctrl_sub_plan(s, fin, c->nthreads, 0, pl));
    return eng_plan_dynamic(*pl) ? ENG_STATUS_NEEDS_DATA : ENG_STATUS_OK;
}

/* ---- values handed between iterations ---- */

/* Give *o (dtype/shape set) memory of its size when it has none. */
static eng_status ctrl_alloc(eng_tensor *o) { return o->data ? ENG_STATUS_OK : eng_tensor_alloc_data(o, "output"); }

/* Copy value src into node output *o: preallocated (a static plan: shapes must agree) or allocated here (a sequence
 * gets a copy of its block). */
static eng_status ctrl_put(const eng_tensor *src, eng_tensor *o, int k) {
    char a[160], b[160];
    if (o->data) {
        if (!ctrl_same(src, o))
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "output %d: the subgraph gave %s %s where %s %s was planned", k,
                           eng_dtype_name(src->dtype), eng_shape_str(src->dims, src->ndim, a, sizeof a),
                           eng_dtype_name(o->dtype), eng_shape_str(o->dims, o->ndim, b, sizeof b));
        if (src->data != o->data) memmove(o->data, src->data, eng_tensor_nbytes(src));
        return ENG_STATUS_OK;
    }
    if (src->dtype == ENG_DTYPE_SEQUENCE) return eng_seq_clone(src, o);
    *o = *src;
    o->data = NULL;
    ENG_TRY(ctrl_alloc(o));
    size_t nb = eng_tensor_nbytes(src);
    if (nb) memcpy(o->data, src->data, nb);
    return ENG_STATUS_OK;
}

/* A loop-carried value's storage: one per parity. Sequences hold their own block (a copy); tensors a buffer that
 * grows as needed. */
typedef struct ctrl_slot {
    void *buf;
    size_t cap;
} ctrl_slot;

static eng_status ctrl_slot_fit(ctrl_slot *s, size_t nb) {
    if (s->buf && s->cap >= nb) return ENG_STATUS_OK;
    eng_free(s->buf);
    s->cap = nb > 64 ? nb : 64;
    if (!(s->buf = eng_alloc(s->cap))) {
        s->cap = 0;
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "cannot allocate %zu bytes for a loop-carried value", nb);
    }
    return ENG_STATUS_OK;
}

/* Keep value v (a view valid until the body's next run) in slot s: a copy, into *kept. */
static eng_status ctrl_slot_keep(ctrl_slot *s, const eng_tensor *v, eng_tensor *kept) {
    if (v->dtype == ENG_DTYPE_SEQUENCE) {
        eng_free(s->buf);
        s->buf = NULL;
        s->cap = 0;
        ENG_TRY(eng_seq_clone(v, kept));
        s->buf = kept->data;
        s->cap = eng_value_nbytes(kept);
        return ENG_STATUS_OK;
    }
    size_t nb = eng_tensor_nbytes(v);
    ENG_TRY(ctrl_slot_fit(s, nb));
    *kept = *v;
    kept->data = s->buf;
    if (nb) memcpy(s->buf, v->data, nb);
    return ENG_STATUS_OK;
}

/* A growing stack of equally shaped slices (a Loop's scan output when the trip count is not known up front). */
typedef struct ctrl_stack {
    eng_tensor slice; /* dtype and shape of one slice (ndim < 0 until the first) */
    char *buf;
    size_t cap, n;    /* bytes allocated, slices held */
} ctrl_stack;

static eng_status ctrl_stack_slot(ctrl_stack *st, const eng_tensor *slice, int k, void **slot) {
    char a[160], b[160];
    if (st->slice.ndim < 0) st->slice = *slice;
    else if (!ctrl_same(&st->slice, slice))
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "scan output %d is %s %s in iteration %zu but %s %s before", k,
                       eng_dtype_name(slice->dtype), eng_shape_str(slice->dims, slice->ndim, a, sizeof a), st->n,
                       eng_dtype_name(st->slice.dtype), eng_shape_str(st->slice.dims, st->slice.ndim, b, sizeof b));
    size_t nb = eng_tensor_nbytes(slice);
    if ((st->n + 1) * nb > st->cap) {
        size_t cap = st->cap ? st->cap * 2 : 16 * (nb ? nb : 1);
        if (cap < (st->n + 1) * nb) cap = (st->n + 1) * nb;
        char *nbuf = eng_alloc(cap);
        if (!nbuf) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "cannot allocate %zu bytes for scan output %d", cap, k);
        if (st->n && nb) memcpy(nbuf, st->buf, st->n * nb);
        eng_free(st->buf);
        st->buf = nbuf;
        st->cap = cap;
    }
    *slot = st->buf + st->n * nb;
    st->n++;
    return ENG_STATUS_OK;
}

/* Hand the stack over as node output *o: [n, slice...] (the stack's buffer itself when o has no memory yet). */
static eng_status ctrl_stack_put(ctrl_stack *st, eng_tensor *o, int k, const eng_tensor *planned) {
    eng_tensor t = {0};
    const eng_tensor *sl = st->slice.ndim >= 0 ? &st->slice : planned;
    if (!sl || sl->ndim < 0 || sl->ndim + 1 > ENG_MAX_DIMS)
        return eng_err(ENG_STATUS_UNSUPPORTED, "scan output %d: no iteration ran and its slice shape is unknown", k);
    t.dtype = sl->dtype;
    t.ndim = sl->ndim + 1;
    t.dims[0] = (int64_t)st->n;
    memcpy(t.dims + 1, sl->dims, (size_t)sl->ndim * sizeof(int64_t));
    if (!o->data) {
        if (!st->buf && !(st->buf = eng_alloc(64))) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
        t.data = st->buf;
        st->buf = NULL;
        *o = t;
        return ENG_STATUS_OK;
    }
    t.data = st->buf;
    return ctrl_put(&t, o, k);
}

/* ---- If ---- */

static int ctrl_cond(const eng_tensor *t) { return eng_tensor_get_i64(t, 0) != 0; }

static eng_status ctrl_check_cond(const eng_tensor *t, const char *what) {
    if (t->dtype != ENG_DTYPE_BOOL || eng_tensor_numel(t) != 1) {
        char a[160];
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: expected one bool, got %s %s", what, eng_dtype_name(t->dtype),
                       eng_shape_str(t->dims, t->ndim, a, sizeof a));
    }
    return ENG_STATUS_OK;
}

static eng_status if_infer(eng_op_ctx *c, ctrl_params *p) {
    ENG_TRY(ctrl_check_cond(&c->in[0], "input 'cond'"));
    eng_tensor fin[ENG_OP_MAX_IO];
    eng_plan *pl[2] = {NULL, NULL};
    int lo = 0, hi = 1;
    if (c->in[0].data) lo = hi = ctrl_cond(&c->in[0]) ? 0 : 1;
    for (int b = lo; b <= hi; b++) {
        ctrl_sub *s = &p->sub[b];
        if (s->flat->noutputs != c->nout)
            return eng_err(ENG_STATUS_INVALID_MODEL, "subgraph '%s' has %d outputs; the node has %d", s->attr,
                           s->flat->noutputs, c->nout);
        ENG_TRY(ctrl_infer_plan(c, s, fin, &pl[b]));
    }
    for (int i = 0; i < c->nout; i++) {
        const eng_tensor *a = eng_plan_output_desc(pl[lo], i, NULL);
        if (hi != lo && !ctrl_same(a, eng_plan_output_desc(pl[hi], i, NULL))) return ENG_STATUS_NEEDS_DATA;
        c->out[i] = *a;
        c->out[i].data = NULL;
    }
    return ENG_STATUS_OK;
}

static eng_status if_exec(krn_call *c, ctrl_params *p) {
    ENG_TRY(ctrl_check_cond(&c->in[0], "input 'cond'"));
    ctrl_sub *s = &p->sub[ctrl_cond(&c->in[0]) ? 0 : 1];
    eng_tensor fin[ENG_OP_MAX_IO], o[ENG_OP_MAX_IO];
    ctrl_fill_outer(s, c->in, fin);
    eng_plan *pl;
    ENG_TRY(ctrl_sub_plan(s, fin, c->nthreads, 0, &pl));
    if (!eng_plan_dynamic(pl)) { /* written straight into the node's outputs */
        for (int i = 0; i < c->nout; i++) {
            const eng_tensor *d = eng_plan_output_desc(pl, i, NULL);
            if (!c->out[i].data) {
                c->out[i] = *d;
                c->out[i].data = NULL;
                ENG_TRY(ctrl_alloc(&c->out[i]));
            } else if (!ctrl_same(d, &c->out[i])) {
                return ctrl_put(d, &c->out[i], i); /* the mismatch error */
            }
            o[i] = c->out[i];
        }
        eng_status st = eng_plan_run(pl, fin, o);
        return st == ENG_STATUS_OK ? st : eng_err_prefix(st, "subgraph '%s': ", s->attr);
    }
    eng_status st = eng_plan_run(pl, fin, o);
    if (st != ENG_STATUS_OK) return eng_err_prefix(st, "subgraph '%s': ", s->attr);
    for (int i = 0; i < c->nout; i++) ENG_TRY(ctrl_put(&o[i], &c->out[i], i));
    return ENG_STATUS_OK;
}

/* ---- Loop ---- */

static eng_status loop_check(const ctrl_params *p, int nout) {
    const eng_graph *b = p->sub[0].flat;
    int ncar = p->nexplicit - 2;
    if (p->nexplicit < 2) return eng_err(ENG_STATUS_INVALID_MODEL, "expected at least 2 inputs (M, cond), got %d", p->nexplicit);
    if (p->sub[0].nformal != ncar + 2)
        return eng_err(ENG_STATUS_INVALID_MODEL, "subgraph 'body' has %d inputs; expected %d (iteration_num, cond and "
                       "%d loop-carried values)", p->sub[0].nformal, ncar + 2, ncar);
    if (b->noutputs < ncar + 1 || nout != b->noutputs - 1)
        return eng_err(ENG_STATUS_INVALID_MODEL, "subgraph 'body' has %d outputs and the node %d; expected the body to "
                       "give cond, %d loop-carried values and the node's scan outputs", b->noutputs, nout, ncar);
    return ENG_STATUS_OK;
}

/* Loop-carried values the body outputs as it got them; those the enclosing plan holds as constants become borrowed
 * initializers of the body (fed as "not fed", so its kernels see constant weights and pack them once). */
static eng_status loop_bind_invariants(eng_op_ctx *c, ctrl_params *p) {
    ctrl_sub *s = &p->sub[0];
    eng_graph *f = s->flat;
    for (int j = 0; j < p->nexplicit - 2; j++) {
        int bi = f->inputs[2 + j];
        if (f->outputs[1 + j] != bi) continue;
        p->pass[j] = 1;
        const eng_tensor *t = &c->in[2 + j];
        if (!t->data || t->dtype == ENG_DTYPE_SEQUENCE || t->dtype == ENG_DTYPE_UNDEFINED || f->values[bi].init) continue;
        eng_tensor *bt = malloc(sizeof *bt);
        if (!bt) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
        *bt = *t;
        eng_value *val = &f->values[bi];
        val->init = bt;
        val->dtype = t->dtype;
        val->ndim = t->ndim;
        for (int d = 0; d < ENG_MAX_DIMS; d++) val->dims[d] = d < t->ndim ? t->dims[d] : -1;
        s->borrowed[s->nborrowed++] = bi;
        s->const_bytes += eng_tensor_nbytes(t);
        p->bound[j] = 1;
    }
    return ENG_STATUS_OK;
}

/* fin[2 + j]: loop-carried value j as the body is fed it (a bound one: not fed). */
static void loop_feed(const ctrl_params *p, int j, const eng_tensor *cur, eng_tensor *fin) {
    if (p->bound[j]) memset(&fin[2 + j], 0, sizeof fin[2 + j]);
    else fin[2 + j] = cur[j];
}

static void loop_scalars(eng_tensor *it, int64_t *iv, eng_tensor *cd, uint8_t *cv) {
    *it = (eng_tensor){.dtype = ENG_DTYPE_I64, .ndim = 0, .data = iv};
    *cd = (eng_tensor){.dtype = ENG_DTYPE_BOOL, .ndim = 0, .data = cv};
}

static eng_status loop_infer(eng_op_ctx *c, ctrl_params *p) {
    ENG_TRY(loop_check(p, c->nout));
    int ncar = p->nexplicit - 2, nscan = c->nout - ncar;
    const eng_tensor *M = &c->in[0], *C = &c->in[1];
    if (M->dtype != ENG_DTYPE_UNDEFINED && (eng_tensor_numel(M) != 1 || !eng_dtype_is_int(M->dtype)))
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'M': expected one integer, got %s", eng_dtype_name(M->dtype));
    if (C->dtype != ENG_DTYPE_UNDEFINED) ENG_TRY(ctrl_check_cond(C, "input 'cond'"));
    eng_tensor fin[ENG_OP_MAX_IO];
    int64_t iv = 0;
    uint8_t cv = 1;
    loop_scalars(&fin[0], &iv, &fin[1], &cv);
    for (int j = 0; j < ncar; j++) {
        const eng_tensor *v = &c->in[2 + j];
        if (v->dtype == ENG_DTYPE_SEQUENCE || v->dtype == ENG_DTYPE_UNDEFINED) return ENG_STATUS_NEEDS_DATA;
        loop_feed(p, j, c->in + 2, fin);
    }
    ctrl_sub *s = &p->sub[0];
    eng_plan *pl;
    ENG_TRY(ctrl_infer_plan(c, s, fin, &pl));
    for (int j = 0; j < ncar; j++) {
        const eng_tensor *d = eng_plan_output_desc(pl, 1 + j, NULL), *v = &c->in[2 + j];
        if (d->dtype != v->dtype)
            return eng_err(ENG_STATUS_INVALID_MODEL, "loop-carried value %d enters the body as %s and leaves it as %s", j,
                           eng_dtype_name(v->dtype), eng_dtype_name(d->dtype));
        if (!eng_shape_equal(d, v)) return ENG_STATUS_NEEDS_DATA; /* its shape changes per iteration */
        c->out[j] = *v;
        c->out[j].data = NULL;
    }
    if (nscan == 0) return ENG_STATUS_OK;
    /* scan outputs need the trip count now: M known, the loop's cond known true and the body's cond always true */
    int konst = 0;
    const eng_tensor *co = eng_plan_output_desc(pl, 0, &konst);
    int cond_stays = s->flat->outputs[0] == s->flat->inputs[1] || (konst && co->data && ctrl_cond(co));
    if (!M->data || (C->dtype != ENG_DTYPE_UNDEFINED && (!C->data || !ctrl_cond(C))) || !cond_stays)
        return ENG_STATUS_NEEDS_DATA;
    int64_t trip = eng_tensor_get_i64(M, 0);
    if (trip < 0) trip = 0;
    if (trip > eng_max_loop_iterations()) return ENG_STATUS_NEEDS_DATA; /* refused when it runs, naming the limit */
    for (int k = 0; k < nscan; k++) {
        const eng_tensor *d = eng_plan_output_desc(pl, 1 + ncar + k, NULL);
        if (d->ndim + 1 > ENG_MAX_DIMS)
            return eng_err(ENG_STATUS_UNSUPPORTED, "scan output %d: rank %d exceeds %d dims", k, d->ndim + 1, ENG_MAX_DIMS);
        eng_tensor *o = &c->out[ncar + k];
        o->dtype = d->dtype;
        o->ndim = d->ndim + 1;
        o->dims[0] = trip;
        memcpy(o->dims + 1, d->dims, (size_t)d->ndim * sizeof(int64_t));
    }
    return ENG_STATUS_OK;
}

static eng_status loop_exec(krn_call *c, ctrl_params *p) {
    ENG_TRY(loop_check(p, c->nout));
    int ncar = p->nexplicit - 2, nscan = c->nout - ncar;
    const eng_tensor *M = &c->in[0], *C = &c->in[1];
    int64_t trip = INT64_MAX, limit = eng_max_loop_iterations();
    if (M->dtype != ENG_DTYPE_UNDEFINED) trip = eng_tensor_get_i64(M, 0);
    uint8_t cv = 1;
    if (C->dtype != ENG_DTYPE_UNDEFINED) {
        ENG_TRY(ctrl_check_cond(C, "input 'cond'"));
        cv = (uint8_t)ctrl_cond(C);
    }
    if (C->dtype == ENG_DTYPE_UNDEFINED && trip > limit)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "trip count M = %lld exceeds the limit of %lld iterations "
                       "(--max_loop_iterations)", (long long)trip, (long long)limit);
    ctrl_sub *s = &p->sub[0];
    eng_tensor fin[ENG_OP_MAX_IO], o[ENG_OP_MAX_IO], cur[ENG_OP_MAX_IO];
    int64_t iv = 0;
    uint8_t cond_out = 1;
    loop_scalars(&fin[0], &iv, &fin[1], &cv);
    for (int j = 0; j < ncar; j++) cur[j] = c->in[2 + j];
    ctrl_fill_outer(s, c->in, fin);
    ctrl_slot slots[2][ENG_OP_MAX_IO];
    ctrl_stack stacks[ENG_OP_MAX_IO];
    memset(slots, 0, sizeof slots);
    memset(stacks, 0, sizeof stacks);
    for (int k = 0; k < nscan; k++) stacks[k].slice.ndim = -1;
    int any = 0;
    eng_status st = ENG_STATUS_OK;
    int64_t i = 0;
    for (; i < trip && cv && st == ENG_STATUS_OK; i++) {
        if (i >= limit) {
            st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "ran past the limit of %lld iterations (--max_loop_iterations)",
                         (long long)limit);
            break;
        }
        if ((st = ctrl_check_deadline(i)) != ENG_STATUS_OK) break;
        iv = i;
        for (int j = 0; j < ncar; j++) loop_feed(p, j, cur, fin);
        eng_plan *pl = NULL;
        if (!any) {
            st = ctrl_sub_plan(s, fin, c->nthreads, 0, &pl);
            if (st == ENG_STATUS_OK && eng_plan_dynamic(pl) && i > 0) pl = NULL, any = 1;
            else if (st == ENG_STATUS_OK && i > 0) { /* a carried shape changed: run the body shape-free from here on */
                for (int j = 0; j < ncar && !any; j++)
                    any = !p->pass[j] && !eng_shape_equal(eng_plan_output_desc(pl, 1 + j, NULL), &cur[j]);
                if (any) pl = NULL;
            }
        }
        if (st == ENG_STATUS_OK && any) st = ctrl_sub_plan(s, fin, c->nthreads, 1, &pl);
        if (st != ENG_STATUS_OK) break;
        ctrl_slot *nxt = slots[i & 1];
        if (!eng_plan_dynamic(pl)) {
            /* static body: it writes the next carried set into the other buffer, scan slices into their slot */
            o[0] = *eng_plan_output_desc(pl, 0, NULL);
            o[0].data = &cond_out;
            if (o[0].dtype != ENG_DTYPE_BOOL || eng_tensor_numel(&o[0]) != 1) {
                st = ctrl_check_cond(&o[0], "subgraph 'body' output 'cond'");
                break;
            }
            for (int j = 0; j < ncar && st == ENG_STATUS_OK; j++) {
                o[1 + j] = *eng_plan_output_desc(pl, 1 + j, NULL);
                if (p->pass[j]) { /* "written" where it already is (a bound one's constant is cur's bytes): nothing moves */
                    o[1 + j].data = cur[j].data;
                    continue;
                }
                st = ctrl_slot_fit(&nxt[j], eng_tensor_nbytes(&o[1 + j]));
                o[1 + j].data = nxt[j].buf;
            }
            for (int k = 0; k < nscan && st == ENG_STATUS_OK; k++) {
                eng_tensor *so = &c->out[ncar + k];
                o[1 + ncar + k] = *eng_plan_output_desc(pl, 1 + ncar + k, NULL);
                if (so->data) { /* planned statically: the trip count is known */
                    o[1 + ncar + k].data = (char *)so->data + i * eng_tensor_nbytes(&o[1 + ncar + k]);
                    stacks[k].n++;
                } else {
                    st = ctrl_stack_slot(&stacks[k], &o[1 + ncar + k], k, &o[1 + ncar + k].data);
                }
            }
            if (st != ENG_STATUS_OK) break;
            if ((st = eng_plan_run(pl, fin, o)) != ENG_STATUS_OK) {
                eng_err_prefix(st, "subgraph 'body', iteration %lld: ", (long long)i);
                break;
            }
            cv = cond_out;
            for (int j = 0; j < ncar; j++)
                if (!p->pass[j]) cur[j] = o[1 + j];
        } else {
            /* dynamic body (sequences, changing shapes): its outputs are views until its next run: keep copies */
            if ((st = eng_plan_run(pl, fin, o)) != ENG_STATUS_OK) {
                eng_err_prefix(st, "subgraph 'body', iteration %lld: ", (long long)i);
                break;
            }
            if ((st = ctrl_check_cond(&o[0], "subgraph 'body' output 'cond'")) != ENG_STATUS_OK) break;
            cv = (uint8_t)ctrl_cond(&o[0]);
            for (int k = 0; k < nscan && st == ENG_STATUS_OK; k++) {
                void *slot = NULL;
                eng_tensor *v = &o[1 + ncar + k];
                if (v->dtype == ENG_DTYPE_SEQUENCE) {
                    st = eng_err(ENG_STATUS_UNSUPPORTED, "scan output %d is a sequence", k);
                    break;
                }
                if ((st = ctrl_stack_slot(&stacks[k], v, k, &slot)) == ENG_STATUS_OK && eng_tensor_nbytes(v))
                    memcpy(slot, v->data, eng_tensor_nbytes(v));
            }
            for (int j = 0; j < ncar && st == ENG_STATUS_OK; j++)
                if (!p->pass[j]) st = ctrl_slot_keep(&nxt[j], &o[1 + j], &cur[j]);
        }
    }
    for (int j = 0; j < ncar && st == ENG_STATUS_OK; j++) st = ctrl_put(&cur[j], &c->out[j], j);
    for (int k = 0; k < nscan && st == ENG_STATUS_OK; k++) {
        eng_tensor *so = &c->out[ncar + k];
        if (so->data && so->ndim > 0) {
            if ((int64_t)stacks[k].n != so->dims[0])
                st = eng_err(ENG_STATUS_INTERNAL, "scan output %d: %zu iterations ran where %lld were planned", k,
                             stacks[k].n, (long long)so->dims[0]);
            continue;
        }
        eng_plan *pl = NULL;
        const eng_tensor *planned = NULL;
        for (int e = 0; e < CTRL_CACHE && !planned; e++)
            if ((pl = s->cache[e].plan) && !eng_plan_dynamic(pl)) planned = eng_plan_output_desc(pl, 1 + ncar + k, NULL);
        st = ctrl_stack_put(&stacks[k], so, k, planned);
    }
    for (int k = 0; k < nscan; k++) eng_free(stacks[k].buf);
    /* a sequence output took a copy; a tensor output of a dynamic run took its own memory in ctrl_put */
    for (int b = 0; b < 2; b++)
        for (int j = 0; j < ncar; j++) eng_free(slots[b][j].buf);
    return st;
}

/* ---- Scan ---- */

static eng_status scan_prepare(eng_op_ctx *c, ctrl_params *p) {
    p->scan8 = c->opset < 9;
    int64_t nsi = eng_node_attr_int(c->node, "num_scan_inputs", -1);
    int first = p->scan8 ? 1 : 0; /* opset 8: sequence_lens first */
    int nin = p->nexplicit - first;
    if (nsi < 1 || nsi > nin)
        return eng_err(ENG_STATUS_INVALID_MODEL, "attribute 'num_scan_inputs' = %lld; expected 1..%d", (long long)nsi, nin);
    p->nscan_in = (int)nsi;
    p->nstate = nin - p->nscan_in;
    p->nscan_out = c->nout - p->nstate;
    if (p->nscan_out < 0)
        return eng_err(ENG_STATUS_INVALID_MODEL, "%d outputs for %d state variables", c->nout, p->nstate);
    if (p->sub[0].nformal != p->nstate + p->nscan_in || p->sub[0].flat->noutputs != c->nout)
        return eng_err(ENG_STATUS_INVALID_MODEL, "subgraph 'body' has %d inputs and %d outputs; expected %d and %d",
                       p->sub[0].nformal, p->sub[0].flat->noutputs, p->nstate + p->nscan_in, c->nout);
    const int64_t *v = NULL;
    int n;
    const char *dir_in = p->scan8 ? "directions" : "scan_input_directions";
    if ((n = eng_node_attr_ints(c->node, dir_in, &v)) >= 0 && n != p->nscan_in)
        return eng_err(ENG_STATUS_INVALID_MODEL, "attribute '%s' has %d entries for %d scan inputs", dir_in, n, p->nscan_in);
    for (int j = 0; j < p->nscan_in; j++) p->in_rev[j] = n > 0 && v[j] != 0;
    if ((n = eng_node_attr_ints(c->node, "scan_input_axes", &v)) >= 0 && n != p->nscan_in)
        return eng_err(ENG_STATUS_INVALID_MODEL, "attribute 'scan_input_axes' has %d entries for %d scan inputs", n, p->nscan_in);
    for (int j = 0; j < p->nscan_in; j++) p->in_axis[j] = n > 0 ? (int)v[j] : 0;
    if ((n = eng_node_attr_ints(c->node, "scan_output_directions", &v)) >= 0 && n != p->nscan_out)
        return eng_err(ENG_STATUS_INVALID_MODEL, "attribute 'scan_output_directions' has %d entries for %d scan outputs",
                       n, p->nscan_out);
    for (int k = 0; k < p->nscan_out; k++) p->out_rev[k] = n > 0 && v[k] != 0;
    if ((n = eng_node_attr_ints(c->node, "scan_output_axes", &v)) >= 0 && n != p->nscan_out)
        return eng_err(ENG_STATUS_INVALID_MODEL, "attribute 'scan_output_axes' has %d entries for %d scan outputs", n,
                       p->nscan_out);
    for (int k = 0; k < p->nscan_out; k++) p->out_axis[k] = n > 0 ? (int)v[k] : 0;
    return ENG_STATUS_OK;
}

/* One Scan over T steps (opset 9+, or one batch row of opset 8): states st0 (nstate), scan inputs xs (their own
 * axis in p->in_axis; for opset 8, 0) and the scan outputs' memory ys (dims final, T along p->out_axis); final states
 * into sout. nthreads: the body plans'. */
typedef struct scan_io {
    const eng_tensor *st0, *xs;
    eng_tensor *sout, *ys;
    int64_t T;
} scan_io;

/* dst = src's slice `idx` along `axis` (dst: src's shape without that axis, memory of its size). */
static void scan_take(const eng_tensor *src, int axis, int64_t idx, void *dst) {
    size_t es = eng_dtype_size(src->dtype);
    int64_t outer = eng_shape_numel(src->dims, axis), T = src->dims[axis];
    size_t inner = (size_t)eng_shape_numel(src->dims + axis + 1, src->ndim - axis - 1) * es;
    for (int64_t o = 0; o < outer; o++)
        memcpy((char *)dst + (size_t)o * inner, (const char *)src->data + ((size_t)(o * T + idx)) * inner, inner);
}

/* The inverse: slice `src` into dst's position idx along axis. */
static void scan_put(eng_tensor *dst, int axis, int64_t idx, const void *src) {
    size_t es = eng_dtype_size(dst->dtype);
    int64_t outer = eng_shape_numel(dst->dims, axis), T = dst->dims[axis];
    size_t inner = (size_t)eng_shape_numel(dst->dims + axis + 1, dst->ndim - axis - 1) * es;
    for (int64_t o = 0; o < outer; o++)
        memcpy((char *)dst->data + ((size_t)(o * T + idx)) * inner, (const char *)src + (size_t)o * inner, inner);
}

static void scan_slice_shape(const eng_tensor *x, int axis, eng_tensor *sl) {
    *sl = (eng_tensor){.dtype = x->dtype, .ndim = x->ndim - 1};
    for (int d = 0, k = 0; d < x->ndim; d++)
        if (d != axis) sl->dims[k++] = x->dims[d];
}

static eng_status scan_axis(int axis, int rank, const char *what, int j, int *out) {
    if (axis < -rank || axis >= rank)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s %d: axis %d is out of range for rank %d", what, j, axis, rank);
    *out = axis < 0 ? axis + rank : axis;
    return ENG_STATUS_OK;
}

static eng_status scan_run(ctrl_params *p, const scan_io *io, const eng_tensor *in, int nthreads) {
    ctrl_sub *s = &p->sub[0];
    int ns = p->nstate, nx = p->nscan_in, ny = p->nscan_out;
    eng_tensor fin[ENG_OP_MAX_IO], o[ENG_OP_MAX_IO], cur[ENG_OP_MAX_IO];
    void *tmp_in[ENG_OP_MAX_IO] = {0}, *tmp_out[ENG_OP_MAX_IO] = {0};
    ctrl_slot slots[2][ENG_OP_MAX_IO];
    memset(slots, 0, sizeof slots);
    int axin[ENG_OP_MAX_IO], axout[ENG_OP_MAX_IO];
    eng_status st = ENG_STATUS_OK;
    for (int j = 0; j < ns; j++) cur[j] = io->st0[j];
    ctrl_fill_outer(s, in, fin);
    for (int j = 0; j < nx && st == ENG_STATUS_OK; j++) {
        const eng_tensor *x = &io->xs[j];
        if ((st = scan_axis(p->scan8 ? 0 : p->in_axis[j], x->ndim, "scan input", j, &axin[j])) != ENG_STATUS_OK) break;
        scan_slice_shape(x, axin[j], &fin[ns + j]);
        if (axin[j] != 0 && !(tmp_in[j] = eng_alloc(eng_tensor_nbytes(&fin[ns + j]) + 1)))
            st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    for (int t = 0; t < io->T && st == ENG_STATUS_OK; t++) {
        if ((st = ctrl_check_deadline(t)) != ENG_STATUS_OK) break;
        for (int j = 0; j < ns; j++) fin[j] = cur[j];
        for (int j = 0; j < nx; j++) {
            int64_t idx = p->in_rev[j] ? io->T - 1 - t : t;
            if (axin[j] == 0) {
                fin[ns + j].data = (char *)io->xs[j].data + (size_t)idx * eng_tensor_nbytes(&fin[ns + j]);
            } else {
                scan_take(&io->xs[j], axin[j], idx, tmp_in[j]);
                fin[ns + j].data = tmp_in[j];
            }
        }
        eng_plan *pl;
        if ((st = ctrl_sub_plan(s, fin, nthreads, 0, &pl)) != ENG_STATUS_OK) break;
        int dyn = eng_plan_dynamic(pl);
        ctrl_slot *nxt = slots[t & 1];
        for (int j = 0; j < ns && st == ENG_STATUS_OK && !dyn; j++) {
            o[j] = *eng_plan_output_desc(pl, j, NULL);
            st = ctrl_slot_fit(&nxt[j], eng_tensor_nbytes(&o[j]));
            o[j].data = nxt[j].buf;
        }
        for (int k = 0; k < ny && st == ENG_STATUS_OK; k++) {
            const eng_tensor *d = dyn ? NULL : eng_plan_output_desc(pl, ns + k, NULL);
            if (!d) break;
            eng_tensor *y = &io->ys[k];
            if (!y->data) { /* the first step gives the slice shape: allocate the whole output */
                *y = (eng_tensor){.dtype = d->dtype, .ndim = d->ndim + 1};
                if ((st = scan_axis(p->scan8 ? 0 : p->out_axis[k], d->ndim + 1, "scan output", k, &axout[k])) != ENG_STATUS_OK)
                    break;
                for (int a = 0, m = 0; a < y->ndim; a++) y->dims[a] = a == axout[k] ? io->T : d->dims[m++];
                if ((st = ctrl_alloc(y)) != ENG_STATUS_OK) break;
            } else if (t == 0) {
                if ((st = scan_axis(p->scan8 ? 0 : p->out_axis[k], y->ndim, "scan output", k, &axout[k])) != ENG_STATUS_OK)
                    break;
            }
            o[ns + k] = *d;
            int64_t idx = p->out_rev[k] ? io->T - 1 - t : t;
            if (axout[k] == 0) {
                o[ns + k].data = (char *)y->data + (size_t)idx * eng_tensor_nbytes(d);
            } else {
                if (!tmp_out[k] && !(tmp_out[k] = eng_alloc(eng_tensor_nbytes(d) + 1))) {
                    st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
                    break;
                }
                o[ns + k].data = tmp_out[k];
            }
        }
        if (st != ENG_STATUS_OK) break;
        if (dyn) {
            st = eng_err(ENG_STATUS_UNSUPPORTED, "subgraph 'body' of a Scan must have shapes fixed per step");
            break;
        }
        if ((st = eng_plan_run(pl, fin, o)) != ENG_STATUS_OK) {
            eng_err_prefix(st, "subgraph 'body', step %d: ", t);
            break;
        }
        for (int k = 0; k < ny; k++)
            if (axout[k] != 0) scan_put(&io->ys[k], axout[k], p->out_rev[k] ? io->T - 1 - t : t, tmp_out[k]);
        for (int j = 0; j < ns; j++) cur[j] = o[j];
    }
    for (int j = 0; j < ns && st == ENG_STATUS_OK; j++) st = ctrl_put(&cur[j], &io->sout[j], j);
    for (int j = 0; j < ENG_OP_MAX_IO; j++) eng_free(tmp_in[j]), eng_free(tmp_out[j]);
    for (int b = 0; b < 2; b++)
        for (int j = 0; j < ns; j++) eng_free(slots[b][j].buf);
    return st;
}

/* Output shapes by planning the body for one step. */
static eng_status scan_infer(eng_op_ctx *c, ctrl_params *p) {
    int first = p->scan8 ? 1 : 0, ns = p->nstate, nx = p->nscan_in;
    eng_tensor fin[ENG_OP_MAX_IO];
    int64_t T = -1, B = 1;
    for (int j = 0; j < ns; j++) {
        fin[j] = c->in[first + j];
        if (p->scan8) {
            if (fin[j].ndim < 1) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "state %d: expected a batch axis", j);
            B = fin[j].dims[0];
            scan_slice_shape(&c->in[first + j], 0, &fin[j]);
        }
        if (fin[j].dtype == ENG_DTYPE_SEQUENCE) return ENG_STATUS_NEEDS_DATA;
    }
    for (int j = 0; j < nx; j++) {
        const eng_tensor *x = &c->in[first + ns + j];
        eng_tensor row = *x;
        if (p->scan8) {
            if (x->ndim < 2) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "scan input %d: expected [batch, sequence, ...]", j);
            B = x->dims[0];
            scan_slice_shape(x, 0, &row);
        }
        int ax = 0;
        ENG_TRY(scan_axis(p->scan8 ? 0 : p->in_axis[j], row.ndim, "scan input", j, &ax));
        if (T >= 0 && row.dims[ax] != T)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "scan input %d has %lld steps; scan input 0 has %lld", j,
                           (long long)row.dims[ax], (long long)T);
        T = row.dims[ax];
        scan_slice_shape(&row, ax, &fin[ns + j]);
    }
    eng_plan *pl;
    ENG_TRY(ctrl_infer_plan(c, &p->sub[0], fin, &pl));
    for (int j = 0; j < ns; j++) {
        const eng_tensor *d = eng_plan_output_desc(pl, j, NULL);
        if (!ctrl_same(d, &fin[j]))
            return eng_err(ENG_STATUS_INVALID_MODEL, "state variable %d enters the body as %s and leaves it as %s", j,
                           eng_dtype_name(fin[j].dtype), eng_dtype_name(d->dtype));
        c->out[j] = c->in[first + j];
        c->out[j].data = NULL;
    }
    for (int k = 0; k < p->nscan_out; k++) {
        const eng_tensor *d = eng_plan_output_desc(pl, ns + k, NULL);
        eng_tensor *y = &c->out[ns + k];
        int ax = 0;
        ENG_TRY(scan_axis(p->scan8 ? 0 : p->out_axis[k], d->ndim + 1, "scan output", k, &ax));
        if (d->ndim + 1 + p->scan8 > ENG_MAX_DIMS)
            return eng_err(ENG_STATUS_UNSUPPORTED, "scan output %d: rank exceeds %d dims", k, ENG_MAX_DIMS);
        *y = (eng_tensor){.dtype = d->dtype, .ndim = d->ndim + 1 + p->scan8};
        int off = 0;
        if (p->scan8) y->dims[off++] = B;
        for (int a = 0, m = 0; a < d->ndim + 1; a++) y->dims[off + a] = a == ax ? T : d->dims[m++];
    }
    return ENG_STATUS_OK;
}

static eng_status scan_exec(krn_call *c, ctrl_params *p) {
    int ns = p->nstate, nx = p->nscan_in, ny = p->nscan_out;
    if (!p->scan8) {
        int64_t T = -1;
        for (int j = 0; j < nx; j++) {
            const eng_tensor *x = &c->in[ns + j];
            int ax = 0;
            ENG_TRY(scan_axis(p->in_axis[j], x->ndim, "scan input", j, &ax));
            if (T >= 0 && x->dims[ax] != T)
                return eng_err(ENG_STATUS_INVALID_ARGUMENT, "scan input %d has %lld steps; scan input 0 has %lld", j,
                               (long long)x->dims[ax], (long long)T);
            T = x->dims[ax];
        }
        scan_io io = {.st0 = c->in, .xs = c->in + ns, .sout = c->out, .ys = c->out + ns, .T = T};
        ENG_TRY(scan_run(p, &io, c->in, c->nthreads));
        for (int k = 0; k < ny; k++)
            if (!c->out[ns + k].data)
                return eng_err(ENG_STATUS_UNSUPPORTED, "scan output %d: zero steps and its shape is unknown", k);
        return ENG_STATUS_OK;
    }
    /* opset 8: per batch row, sequence_lens steps (the rest of its scan outputs zero) */
    const eng_tensor *lens = &c->in[0];
    int64_t B = nx ? c->in[1 + ns].dims[0] : 0, T = nx ? c->in[1 + ns].dims[1] : 0;
    for (int k = 0; k < ny; k++)
        if (!c->out[ns + k].data)
            return eng_err(ENG_STATUS_UNSUPPORTED, "opset-8 Scan needs shapes known at plan time");
    for (int k = 0; k < ny; k++) memset(c->out[ns + k].data, 0, eng_tensor_nbytes(&c->out[ns + k]));
    for (int64_t b = 0; b < B; b++) {
        eng_tensor st0[ENG_OP_MAX_IO], xs[ENG_OP_MAX_IO], sout[ENG_OP_MAX_IO], ys[ENG_OP_MAX_IO];
        int64_t Tb = T;
        if (lens->dtype != ENG_DTYPE_UNDEFINED && eng_tensor_numel(lens) == B) {
            Tb = eng_tensor_get_i64(lens, b);
            if (Tb < 0 || Tb > T)
                return eng_err(ENG_STATUS_INVALID_ARGUMENT, "sequence_lens[%lld] = %lld is outside [0, %lld]", (long long)b,
                               (long long)Tb, (long long)T);
        }
        for (int j = 0; j < ns; j++) {
            scan_slice_shape(&c->in[1 + j], 0, &st0[j]);
            st0[j].data = (char *)c->in[1 + j].data + (size_t)b * eng_tensor_nbytes(&st0[j]);
            scan_slice_shape(&c->out[j], 0, &sout[j]);
            sout[j].data = (char *)c->out[j].data + (size_t)b * eng_tensor_nbytes(&sout[j]);
        }
        for (int j = 0; j < nx; j++) {
            scan_slice_shape(&c->in[1 + ns + j], 0, &xs[j]);
            size_t row = eng_tensor_nbytes(&xs[j]);
            xs[j].data = (char *)c->in[1 + ns + j].data + (size_t)b * row;
            xs[j].dims[0] = Tb; /* the row's first Tb steps (reverse: counted from its step Tb - 1) */
        }
        for (int k = 0; k < ny; k++) {
            scan_slice_shape(&c->out[ns + k], 0, &ys[k]);
            size_t row = eng_tensor_nbytes(&ys[k]);
            ys[k].data = (char *)c->out[ns + k].data + (size_t)b * row;
            ys[k].dims[0] = Tb;
        }
        scan_io io = {.st0 = st0, .xs = xs, .sout = sout, .ys = ys, .T = Tb};
        ENG_TRY(scan_run(p, &io, c->in, c->nthreads));
    }
    return ENG_STATUS_OK;
}

/* ---- SequenceMap ---- */

/* The body once per position of the input sequence (the other sequence inputs indexed alike, tensor inputs as they
 * are); each output k collects the body's output k into a sequence. */
static eng_status map_exec(krn_call *c, ctrl_params *p) {
    ctrl_sub *s = &p->sub[0];
    const eng_seq *s0 = eng_seq_get(&c->in[0]);
    if (!s0) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'input_sequence' is not a sequence");
    int64_t n = s0->n;
    for (int j = 1; j < p->nexplicit; j++) {
        const eng_seq *sj = eng_seq_get(&c->in[j]);
        if (sj && sj->n != n)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input %d is a sequence of %lld elements; input 0 has %lld", j,
                           (long long)sj->n, (long long)n);
    }
    eng_tensor fin[ENG_OP_MAX_IO], o[ENG_OP_MAX_IO];
    eng_tensor *items[ENG_OP_MAX_IO] = {0};
    eng_status st = ENG_STATUS_OK;
    for (int k = 0; k < c->nout && st == ENG_STATUS_OK; k++)
        if (!(items[k] = calloc((size_t)n + 1, sizeof(eng_tensor)))) st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    ctrl_fill_outer(s, c->in, fin);
    for (int64_t i = 0; i < n && st == ENG_STATUS_OK; i++) {
        if ((st = ctrl_check_deadline(i)) != ENG_STATUS_OK) break;
        for (int j = 0; j < p->nexplicit; j++) {
            const eng_seq *sj = eng_seq_get(&c->in[j]);
            fin[j] = sj ? sj->items[i] : c->in[j];
        }
        eng_plan *pl;
        if ((st = ctrl_sub_plan(s, fin, c->nthreads, 0, &pl)) != ENG_STATUS_OK) break;
        if (!eng_plan_dynamic(pl))
            for (int k = 0; k < c->nout && st == ENG_STATUS_OK; k++) {
                o[k] = *eng_plan_output_desc(pl, k, NULL);
                o[k].data = NULL;
                st = ctrl_alloc(&o[k]);
                items[k][i] = o[k];
            }
        if (st == ENG_STATUS_OK && (st = eng_plan_run(pl, fin, o)) != ENG_STATUS_OK)
            eng_err_prefix(st, "subgraph 'body', element %lld: ", (long long)i);
        for (int k = 0; k < c->nout && st == ENG_STATUS_OK && eng_plan_dynamic(pl); k++) {
            items[k][i].data = NULL;
            st = ctrl_put(&o[k], &items[k][i], k);
        }
    }
    for (int k = 0; k < c->nout && st == ENG_STATUS_OK; k++) {
        eng_dtype dt = n ? items[k][0].dtype : ENG_DTYPE_F32;
        const eng_tensor *d = NULL;
        for (int e = 0; e < CTRL_CACHE && !n && !d; e++)
            if (s->cache[e].plan && !eng_plan_dynamic(s->cache[e].plan)) d = eng_plan_output_desc(s->cache[e].plan, k, NULL);
        if (d) dt = d->dtype;
        st = eng_seq_make(dt, items[k], n, &c->out[k]);
    }
    for (int k = 0; k < c->nout; k++) {
        for (int64_t i = 0; items[k] && i < n; i++) eng_free(items[k][i].data);
        free(items[k]);
    }
    return st;
}

/* ---- load-time checks ---- */

static const eng_graph *ctrl_graph_attr(const eng_node *n, const char *name) {
    const eng_attr *a = eng_node_attr(n, name);
    return a && a->type == ENG_ATTR_GRAPH ? a->g : NULL;
}

eng_status eng_ctrl_check_node(int64_t opset, const eng_node *n) {
    int op = strcmp(n->op_type, "If") == 0 ? CTRL_IF : strcmp(n->op_type, "Loop") == 0 ? CTRL_LOOP
           : strcmp(n->op_type, "Scan") == 0 ? CTRL_SCAN : -1;
    if (op < 0 || n->domain[0]) return ENG_STATUS_OK;
    char lb[300];
    snprintf(lb, sizeof lb, "node '%s' (%s): ", n->name, n->op_type);
    int nexp = n->nin - n->nimplicit;
    if (op == CTRL_IF) {
        if (nexp != 1) return eng_err(ENG_STATUS_INVALID_MODEL, "%sexpected 1 input (cond), got %d", lb, nexp);
        const char *names[2] = {"then_branch", "else_branch"};
        for (int b = 0; b < 2; b++) {
            const eng_graph *sg = ctrl_graph_attr(n, names[b]);
            if (!sg) return eng_err(ENG_STATUS_INVALID_MODEL, "%smissing the graph attribute '%s'", lb, names[b]);
            if (sg->ninputs != 0 || sg->noutputs != n->nout)
                return eng_err(ENG_STATUS_INVALID_MODEL, "%ssubgraph '%s' has %d inputs and %d outputs; expected 0 and %d",
                               lb, names[b], sg->ninputs, sg->noutputs, n->nout);
        }
        return ENG_STATUS_OK;
    }
    const eng_graph *body = ctrl_graph_attr(n, "body");
    if (!body) return eng_err(ENG_STATUS_INVALID_MODEL, "%smissing the graph attribute 'body'", lb);
    if (op == CTRL_LOOP) {
        int ncar = nexp - 2;
        if (nexp < 2) return eng_err(ENG_STATUS_INVALID_MODEL, "%sexpected at least 2 inputs (M, cond), got %d", lb, nexp);
        if (body->ninputs != ncar + 2)
            return eng_err(ENG_STATUS_INVALID_MODEL, "%ssubgraph 'body' has %d inputs; expected %d (iteration_num, cond and "
                           "%d loop-carried values)", lb, body->ninputs, ncar + 2, ncar);
        if (body->noutputs < ncar + 1 || n->nout != body->noutputs - 1)
            return eng_err(ENG_STATUS_INVALID_MODEL, "%ssubgraph 'body' has %d outputs and the node %d; expected the body "
                           "to give cond, the %d loop-carried values and the node's scan outputs", lb, body->noutputs,
                           n->nout, ncar);
        return ENG_STATUS_OK;
    }
    int first = opset < 9 ? 1 : 0;
    int64_t nsi = eng_node_attr_int(n, "num_scan_inputs", -1);
    if (nsi < 1 || nsi > nexp - first)
        return eng_err(ENG_STATUS_INVALID_MODEL, "%sattribute 'num_scan_inputs' = %lld; expected 1..%d", lb, (long long)nsi,
                       nexp - first);
    if (body->ninputs != nexp - first || body->noutputs != n->nout)
        return eng_err(ENG_STATUS_INVALID_MODEL, "%ssubgraph 'body' has %d inputs and %d outputs; expected %d and %d", lb,
                       body->ninputs, body->noutputs, nexp - first, n->nout);
    return ENG_STATUS_OK;
}

/* ---- the op definitions and their kernel ---- */

static eng_status ctrl_prepare(eng_op_ctx *c) {
    ctrl_params *p = calloc(1, sizeof *p);
    if (!p) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    c->params = p;
    const char *op = c->node->op_type;
    p->op = strcmp(op, "If") == 0 ? CTRL_IF : strcmp(op, "Loop") == 0 ? CTRL_LOOP : strcmp(op, "Scan") == 0 ? CTRL_SCAN
          : CTRL_MAP;
    p->nexplicit = c->nin - c->node->nimplicit;
    if (c->nout > ENG_OP_MAX_IO) return eng_err(ENG_STATUS_UNSUPPORTED, "more than %d outputs", ENG_OP_MAX_IO);
    if (p->op == CTRL_IF) {
        if (p->nexplicit != 1) return eng_err(ENG_STATUS_INVALID_MODEL, "expected 1 input (cond), got %d", p->nexplicit);
        p->nsub = 2;
        ENG_TRY(ctrl_sub_init(c, p, "then_branch", &p->sub[0]));
        return ctrl_sub_init(c, p, "else_branch", &p->sub[1]);
    }
    p->nsub = 1;
    ENG_TRY(ctrl_sub_init(c, p, "body", &p->sub[0]));
    if (p->op == CTRL_LOOP) {
        ENG_TRY(loop_check(p, c->nout));
        return loop_bind_invariants(c, p);
    }
    if (p->op == CTRL_MAP) {
        if (p->sub[0].nformal != p->nexplicit || p->sub[0].flat->noutputs != c->nout)
            return eng_err(ENG_STATUS_INVALID_MODEL, "subgraph 'body' has %d inputs and %d outputs; expected %d and %d",
                           p->sub[0].nformal, p->sub[0].flat->noutputs, p->nexplicit, c->nout);
        return ENG_STATUS_OK;
    }
    return scan_prepare(c, p);
}

static eng_status ctrl_infer(eng_op_ctx *c) {
    ctrl_params *p = c->params;
    switch (p->op) {
    case CTRL_IF: return if_infer(c, p);
    case CTRL_LOOP: return loop_infer(c, p);
    case CTRL_SCAN: return scan_infer(c, p);
    default: return ENG_STATUS_NEEDS_DATA; /* SequenceMap: sequences */
    }
}

static eng_status ctrl_exec(krn_call *c) {
    ctrl_params *p = (ctrl_params *)c->params;
    switch (p->op) {
    case CTRL_IF: return if_exec(c, p);
    case CTRL_LOOP: return loop_exec(c, p);
    case CTRL_SCAN: return scan_exec(c, p);
    default: return map_exec(c, p);
    }
}

static const krn_kernel ctrl_kernel = {.name = "control_flow", .exec = ctrl_exec};

#define CTRL_OP(name) {name, "", "control_flow", ENG_OP_ALLOCATES, ctrl_prepare, ctrl_infer, ctrl_free_params, &ctrl_kernel}

const eng_op_def eng_ops_ctrl[] = {
    CTRL_OP("If"),
    CTRL_OP("Loop"),
    CTRL_OP("Scan"),
    CTRL_OP("SequenceMap"),
    {NULL},
};
