/* infer.c - the one inference request path and the worker pool (see infer.h).
 *
 * A request: srv_infer_route picks and holds the version (the one place version selection happens: the
 * traffic router plugs in here) -> the front door's decode -> here when the version is quick for these rows
 * (srv_version_quick) or the caller may block, else on the version's batcher (srv_version_predict_async) or a
 * worker -> encode -> metrics (before the release: a retired version's series go with its last reference) ->
 * release -> done. Every path ends in infer_finish, which calls done exactly once.
 * Pool: a FIFO of srv_work; a thread is started whenever the queue is longer than the idle threads (up to
 * SRV_INFER_MAX_WORKERS), so batching's many waiting requests each get one; past SRV_INFER_KEEP_WORKERS, a
 * thread idle for SRV_INFER_IDLE_S seconds ends. Tracked work sits on a doubly
 * linked list under dmu; srv_infer_cut_off detaches the whole list, then calls each cut outside the lock.
 */
#include "infer.h"

#include <errno.h>
#include <pthread.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "canary.h"
#include "codec.h"

struct srv_infer {
    srv_registry *reg;
    srv_metrics *m;
    pthread_mutex_t mu;
    pthread_cond_t work, idle;
    srv_work *head, *tail;
    int queued, nthreads, nidle, stopping;
    pthread_mutex_t dmu;
    srv_work *tracked;
    struct srv_lane *lanes;     /* under mu */
    atomic_int shadows;         /* shadow copies waiting or running */
    srv_canary *canary;         /* outcomes of routed requests, per (model, label) */
};

/* The unbatched requests of one version that go to the pool: at most its instance count run (each on a worker,
 * each holding or about to hold an instance); the rest wait here, holding no thread, and the worker that finishes
 * one takes the next. So 1,000 slow requests to one version need as many threads as it has instances, and a
 * cancelled or expired one ends (CANCELLED / DEADLINE_EXCEEDED, without running) when its turn comes. Keyed by the
 * version object: every request on a lane holds a reference to it, and the lane ends with its last request. */
typedef struct srv_lane {
    const srv_version *v;
    int running;
    struct srv_infer_call *head, *tail;
    struct srv_lane *next;
} srv_lane;

typedef struct srv_infer_call { /* a request that continues on another thread */
    srv_work w;                 /* first: the pool sees only this */
    srv_infer *inf;
    srv_infer_req rq;
    const srv_infer_ops *ops;
    void *u;
    srv_version *v;
    srv_tensors in, out;
    int64_t input_ns, dec_end_ns;
    srv_lane *lane;
    struct srv_infer_call *lnext;
    char label[256];            /* the label the router chose (rq.label points here) */
} srv_infer_call;

/* A copy of a routed request for the model's shadow label: run on a worker, its reply discarded, its latency
 * and status recorded against the shadow version. At most SRV_INFER_MAX_SHADOWS wait at once; more are skipped. */
typedef struct srv_shadow {
    srv_work w;
    srv_infer *inf;
    srv_version *v;
    srv_tensors in;
    char model[256], label[256];
    char api[32], protocol[16]; /* copies: the request's strings may live in a front door's buffer that is gone by
                                 * the time the shadow runs */
    int64_t t0_ns;
} srv_shadow;
#define SRV_INFER_MAX_SHADOWS 64

/* ---- version selection ---- */

/* rq names a version or a label: exactly that. Otherwise the model's traffic routes, when it has any (label gets
 * the chosen label and rq->label points at it; shadow its shadow label), else the highest available version. A
 * route whose label cannot be served right now falls back to the highest available version: routing never fails
 * a request that the model could answer. */
static srv_version *srv_infer_route(srv_infer *inf, srv_infer_req *rq, const srv_infer_ops *ops, void *u,
                                    char label[256], char shadow[256], srv_error *err) {
    shadow[0] = '\0';
    if (rq->version <= 0 && !rq->label) {
        char hname[256], hval[512];
        const char *sticky = NULL;
        if (ops->header && srv_registry_sticky_header(inf->reg, rq->model, hname, sizeof hname))
            sticky = ops->header(u, hname, hval, sizeof hval);
        if (srv_registry_route(inf->reg, rq->model, sticky, label, 256, shadow, 256)) {
            srv_version *v = srv_registry_acquire(inf->reg, rq->model, 0, label, err);
            if (v) {
                rq->label = label;
                rq->routed = 1;
                return v;
            }
            shadow[0] = '\0';
        }
    }
    return srv_registry_acquire(inf->reg, rq->model, rq->version, rq->label, err);
}

static void srv_shadow_run(srv_work *w) {
    srv_shadow *s = (srv_shadow *)w;
    srv_tensors out = {0};
    srv_error err = {0};
    srv_code rc = srv_version_predict(s->v, &s->in, &out, 0, NULL, &err);
    srv_infer_times tm = {.rows = 1};
    if (rc == SRV_OK) srv_infer_times_run(&tm, s->t0_ns);
    srv_metrics_infer(s->inf->m, s->model, srv_version_get_info(s->v)->version, s->label, s->api, s->protocol, rc,
                      srv_metrics_clock_ns() - s->t0_ns, rc == SRV_OK ? &tm : NULL);
    srv_tensors_free(&out);
    srv_tensors_free(&s->in);
    srv_version_release(s->v);
    atomic_fetch_sub(&s->inf->shadows, 1);
    free(s);
}

/* Send a copy of in to the shadow label's version (when it is another version than primary's). */
static void srv_infer_shadow(srv_infer *inf, const srv_infer_req *rq, const char *label, const srv_version *primary,
                             const srv_tensors *in) {
    if (atomic_fetch_add(&inf->shadows, 1) >= SRV_INFER_MAX_SHADOWS) {
        atomic_fetch_sub(&inf->shadows, 1);
        return;
    }
    srv_error err = {0};
    srv_shadow *s = calloc(1, sizeof *s);
    srv_version *v = s ? srv_registry_acquire(inf->reg, rq->model, 0, label, &err) : NULL;
    int ok = v && v != primary;
    for (int i = 0; ok && i < in->n; i++) ok = srv_tensors_add_copy(&s->in, in->names[i], &in->t[i]) == 0;
    if (ok) {
        s->w.run = srv_shadow_run;
        s->inf = inf;
        s->v = v;
        snprintf(s->model, sizeof s->model, "%s", rq->model);
        snprintf(s->label, sizeof s->label, "%s", label);
        snprintf(s->api, sizeof s->api, "%s", rq->api ? rq->api : "predict");
        snprintf(s->protocol, sizeof s->protocol, "%s", rq->protocol ? rq->protocol : "rest");
        s->t0_ns = srv_metrics_clock_ns();
        if (srv_infer_queue(inf, &s->w) == 0) return;
    }
    if (s) srv_tensors_free(&s->in);
    if (v) srv_version_release(v);
    free(s);
    atomic_fetch_sub(&inf->shadows, 1);
}

/* ---- metrics ---- */

/* Label values come from the configuration only, and a model name that matched nothing is not recorded
 * verbatim (clients choose URLs): served requests keep both, others keep what the registry knows. */
static void srv_infer_record(srv_infer *inf, const srv_infer_req *rq, const srv_version_info *info, srv_code code,
                             const srv_infer_times *tm) {
    int served = info != NULL;
    const char *model = srv_registry_metrics_model(inf->reg, rq->model, served, code);
    const char *label = !rq->label ? NULL
                        : served || srv_registry_has_label(inf->reg, rq->model, rq->label) ? rq->label
                                                                                            : "unknown";
    int64_t latency_ns = srv_metrics_clock_ns() - rq->t0_us * 1000;
    srv_metrics_infer(inf->m, model, served ? info->version : 0, label, rq->api, rq->protocol, code, latency_ns,
                      served ? tm : NULL);
    if (rq->routed && served && code != SRV_CANCELLED) /* a client that went away says nothing about the version */
        srv_canary_observe(inf->canary, rq->model, rq->label, code == SRV_OK, latency_ns / 1000);
}

/* ---- the second half of a request ---- */

/* predict (unless done_out: it holds an asynchronous predict's result, rc its status) -> encode -> record ->
 * release v -> done. Takes in, done_out and v. */
static void srv_infer_finish(srv_infer *inf, const srv_infer_req *rq, const srv_infer_ops *ops, void *u,
                             srv_version *v, srv_tensors *in, srv_tensors *done_out, srv_code rc, srv_error *err,
                             int64_t input_ns, int64_t dec_end_ns) {
    srv_tensors local = {0}, *outp = done_out ? done_out : &local;
    const srv_version_info *info = srv_version_get_info(v);
    srv_infer_times tm = {.input_ns = input_ns};
    if (rc == SRV_OK && !done_out) rc = srv_version_predict(v, in, outp, rq->deadline_us, rq->cancel, err);
    if (rc == SRV_OK) {
        int64_t t1 = srv_metrics_clock_ns(); /* the encode counts as output */
        srv_infer_times_run(&tm, dec_end_ns);
        int64_t mb = srv_kserve_max_batch(info, srv_registry_batching(inf->reg));
        tm.rows = mb > 0 && in->n > 0 && in->t[0].ndim >= 1 && in->t[0].dims[0] > 0 ? in->t[0].dims[0] : 1;
        rc = ops->encode(u, info, in, outp, err);
        tm.output_ns += srv_metrics_clock_ns() - t1;
    }
    if (rc == SRV_OK) err->code = SRV_OK;
    else if (err->code == SRV_OK) srv_err(err, SRV_INTERNAL, "request failed");
    srv_infer_record(inf, rq, info, err->code, &tm);
    srv_tensors_free(in);
    srv_tensors_free(outp);
    srv_version_release(v);
    ops->done(u, err->code, err);
}

static void srv_infer_call_finish(srv_infer_call *c) {
    srv_error err = {0};
    int gone = c->rq.cancel ? atomic_load(c->rq.cancel) : 0;
    srv_code rc = gone == SRV_CANCEL_DEADLINE ? srv_err(&err, SRV_DEADLINE_EXCEEDED, "deadline exceeded before the request ran")
                  : gone ? srv_err(&err, SRV_CANCELLED, "the client cancelled the request before it ran")
                         : SRV_OK;
    srv_infer_finish(c->inf, &c->rq, c->ops, c->u, c->v, &c->in, NULL, rc, &err, c->input_ns, c->dec_end_ns);
    free(c);
}

/* A worker runs c, then the requests waiting on its lane, one after the other. */
static void srv_infer_call_run(srv_work *w) {
    srv_infer_call *c = (srv_infer_call *)w;
    srv_infer *inf = c->inf;
    srv_lane *l = c->lane;
    while (c) {
        srv_infer_call_finish(c);
        if (!l) break;
        pthread_mutex_lock(&inf->mu);
        c = l->head;
        if (c) {
            l->head = c->lnext;
            if (!l->head) l->tail = NULL;
        } else if (--l->running == 0) {
            for (srv_lane **pp = &inf->lanes; *pp; pp = &(*pp)->next)
                if (*pp == l) {
                    *pp = l->next;
                    break;
                }
            free(l);
        }
        pthread_mutex_unlock(&inf->mu);
    }
}

/* Hand c to the pool through its version's lane: 1 when it waits there (a worker of the lane will run it). */
static int srv_infer_lane_wait(srv_infer *inf, srv_infer_call *c) {
    int limit = srv_version_instances(c->v);
    pthread_mutex_lock(&inf->mu);
    srv_lane *l = inf->lanes;
    while (l && l->v != c->v) l = l->next;
    if (!l && (l = calloc(1, sizeof *l))) {
        l->v = c->v;
        l->next = inf->lanes;
        inf->lanes = l;
    }
    int wait = 0;
    if (l) {
        c->lane = l;
        if (l->running >= (limit > 0 ? limit : 1)) {
            c->lnext = NULL;
            if (l->tail) l->tail->lnext = c;
            else l->head = c;
            l->tail = c;
            wait = 1;
        } else {
            l->running++;
        }
    }
    pthread_mutex_unlock(&inf->mu);
    return wait;
}

static void srv_infer_batch_done(void *arg, srv_code rc, const srv_error *e) {
    srv_infer_call *c = arg;
    srv_error err = {0};
    if (rc != SRV_OK) err = *e;
    srv_infer_finish(c->inf, &c->rq, c->ops, c->u, c->v, &c->in, &c->out, rc, &err, c->input_ns, c->dec_end_ns);
    free(c);
}

int srv_infer_submit(srv_infer *inf, const srv_infer_req *rq0, const srv_infer_ops *ops, void *u) {
    srv_error err = {0};
    srv_infer_req r = *rq0, *rq = &r;
    char label[256], shadow[256];
    srv_version *v = srv_infer_route(inf, rq, ops, u, label, shadow, &err);
    if (!v) {
        if (err.code == SRV_OK) srv_err(&err, SRV_INTERNAL, "request failed");
        srv_infer_record(inf, rq, NULL, err.code, NULL);
        ops->done(u, err.code, &err);
        return 1;
    }
    srv_tensors in = {0};
    int64_t t0 = srv_metrics_clock_ns();
    srv_code rc = ops->decode(u, srv_version_get_info(v), &in, &err);
    int64_t t1 = srv_metrics_clock_ns();
    if (rc == SRV_OK && shadow[0]) srv_infer_shadow(inf, rq, shadow, v, &in);
    srv_infer_call *c = NULL;
    if (rc == SRV_OK && !rq->may_block && !srv_version_quick(v, &in, SRV_INFER_INLINE_US) && (c = malloc(sizeof *c))) {
        *c = (srv_infer_call){.w = {.run = srv_infer_call_run}, .inf = inf, .rq = *rq, .ops = ops, .u = u, .v = v,
                              .in = in, .input_ns = t1 - t0, .dec_end_ns = t1};
        if (rq->label == label) {
            memcpy(c->label, label, sizeof c->label);
            c->rq.label = c->label;
        }
        if (ops->going_async) ops->going_async(u);
        if (srv_version_predict_async(v, &c->in, &c->out, rq->deadline_us, rq->cancel, srv_infer_batch_done, c)) return 0;
        if (srv_infer_lane_wait(inf, c)) return 0;
        if (srv_infer_queue(inf, &c->w) != 0) srv_infer_call_run(&c->w); /* no worker: here after all */
        return 0;
    }
    srv_infer_finish(inf, rq, ops, u, v, &in, NULL, rc, &err, t1 - t0, t1);
    return 1;
}

/* ---- the worker pool ---- */

static void *srv_infer_worker(void *arg) {
    srv_infer *inf = arg;
    pthread_mutex_lock(&inf->mu);
    for (;;) {
        int expired = 0;
        while (!inf->head && !inf->stopping && !expired) {
            inf->nidle++;
            if (inf->nthreads > SRV_INFER_KEEP_WORKERS) { /* a burst's extra threads leave once idle a while */
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_sec += SRV_INFER_IDLE_S;
                expired = pthread_cond_timedwait(&inf->work, &inf->mu, &ts) == ETIMEDOUT;
            } else {
                pthread_cond_wait(&inf->work, &inf->mu);
            }
            inf->nidle--;
        }
        if (!inf->head) break; /* stopping and drained, or idle past SRV_INFER_IDLE_S */
        srv_work *w = inf->head;
        inf->head = w->next;
        if (!inf->head) inf->tail = NULL;
        inf->queued--;
        pthread_mutex_unlock(&inf->mu);
        w->run(w);
        pthread_mutex_lock(&inf->mu);
    }
    inf->nthreads--;
    pthread_cond_broadcast(&inf->idle);
    pthread_mutex_unlock(&inf->mu);
    return NULL;
}

int srv_infer_queue(srv_infer *inf, srv_work *w) {
    pthread_mutex_lock(&inf->mu);
    if (inf->queued + 1 > inf->nidle && inf->nthreads < SRV_INFER_MAX_WORKERS && !inf->stopping) {
        pthread_attr_t a;
        pthread_t t;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&a, 2 << 20);
        if (pthread_create(&t, &a, srv_infer_worker, inf) == 0) inf->nthreads++;
        pthread_attr_destroy(&a);
    }
    if (inf->nthreads == 0 || inf->stopping) {
        pthread_mutex_unlock(&inf->mu);
        return -1;
    }
    w->next = NULL;
    if (inf->tail) inf->tail->next = w;
    else inf->head = w;
    inf->tail = w;
    inf->queued++;
    pthread_cond_signal(&inf->work);
    pthread_mutex_unlock(&inf->mu);
    return 0;
}

/* ---- requests still to answer ---- */

void srv_infer_track(srv_infer *inf, srv_work *w) {
    pthread_mutex_lock(&inf->dmu);
    if (!w->tracked) {
        w->tracked = 1;
        w->dprev = NULL;
        w->dnext = inf->tracked;
        if (inf->tracked) inf->tracked->dprev = w;
        inf->tracked = w;
    }
    pthread_mutex_unlock(&inf->dmu);
}

int srv_infer_untrack(srv_infer *inf, srv_work *w) {
    pthread_mutex_lock(&inf->dmu);
    int was = w->tracked;
    if (was) {
        if (w->dprev) w->dprev->dnext = w->dnext;
        else inf->tracked = w->dnext;
        if (w->dnext) w->dnext->dprev = w->dprev;
        w->dprev = w->dnext = NULL;
        w->tracked = 0;
    }
    pthread_mutex_unlock(&inf->dmu);
    return was;
}

int srv_infer_cut_off(srv_infer *inf, const char *why) {
    if (!inf) return 0;
    pthread_mutex_lock(&inf->dmu);
    srv_work *list = inf->tracked;
    inf->tracked = NULL;
    for (srv_work *w = list; w; w = w->dnext) w->tracked = 0;
    pthread_mutex_unlock(&inf->dmu);
    int n = 0;
    for (srv_work *w = list, *next; w; w = next, n++) {
        next = w->dnext; /* read first: cut may hand w back to its owner */
        w->cut(w, why);
    }
    return n;
}

/* ---- life cycle ---- */

srv_canary *srv_infer_canary(srv_infer *inf) { return inf ? inf->canary : NULL; }

srv_infer *srv_infer_new(srv_registry *reg, srv_metrics *m) {
    srv_infer *inf = calloc(1, sizeof *inf);
    if (!inf) return NULL;
    inf->reg = reg;
    inf->m = m;
    if (!(inf->canary = srv_canary_new())) {
        free(inf);
        return NULL;
    }
    pthread_mutex_init(&inf->mu, NULL);
    pthread_cond_init(&inf->work, NULL);
    pthread_cond_init(&inf->idle, NULL);
    pthread_mutex_init(&inf->dmu, NULL);
    return inf;
}

void srv_infer_free(srv_infer **p) {
    if (!p || !*p) return;
    srv_infer *inf = *p;
    pthread_mutex_lock(&inf->mu);
    inf->stopping = 1;
    pthread_cond_broadcast(&inf->work);
    while (inf->nthreads > 0) pthread_cond_wait(&inf->idle, &inf->mu);
    pthread_mutex_unlock(&inf->mu);
    pthread_mutex_destroy(&inf->mu);
    pthread_cond_destroy(&inf->work);
    pthread_cond_destroy(&inf->idle);
    pthread_mutex_destroy(&inf->dmu);
    srv_canary_free(&inf->canary);
    free(inf);
    *p = NULL;
}
