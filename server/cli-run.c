/* cli-run.c - `tensord predict` and `tensord bench`: run a model on .npy inputs. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "../engine/ir/graph.h"
#include "../engine/ir/npy.h"
#include "../engine/plan/session.h"
#include "cli.h"

#define RUN_MAX_INPUTS 256

typedef struct run_args {
    const char *model;
    const char *outdir;
    int nthreads;
    eng_precision precision;
    const krn_backend *backend; /* --device (default: the CPU; "auto": CUDA device 0 when there is one) */
    int device;
    int iterations, warmup;
    int ninputs;
    char *names[RUN_MAX_INPUTS];
    eng_tensor *tensors[RUN_MAX_INPUTS];
} run_args;

static void run_args_free(run_args *a) {
    for (int i = 0; i < a->ninputs; i++) {
        free(a->names[i]);
        eng_tensor_destroy(&a->tensors[i]);
    }
}

static int fail(const char *what) {
    fprintf(stderr, "error: %s%s\n", what ? what : "", eng_last_error());
    return 1;
}

/* Returns 0 ok, 1 runtime error, 2 usage error. */
static int parse(int argc, char **argv, run_args *a, int bench) {
    memset(a, 0, sizeof *a);
    a->iterations = 100;
    a->warmup = 10;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if ((v = srv_flag(argc, argv, &i, "--model"))) a->model = v;
        else if ((v = srv_flag(argc, argv, &i, "--output-dir"))) a->outdir = v;
        else if ((v = srv_flag(argc, argv, &i, "--threads"))) a->nthreads = atoi(v);
        else if ((v = srv_flag(argc, argv, &i, "--iterations"))) a->iterations = atoi(v);
        else if ((v = srv_flag(argc, argv, &i, "--precision"))) {
            if (eng_precision_parse(v, &a->precision) != ENG_STATUS_OK) {
                fprintf(stderr, "error: --precision: %s\n", eng_last_error());
                return 2;
            }
        }
        else if ((v = srv_flag(argc, argv, &i, "--warmup"))) a->warmup = atoi(v);
        else if ((v = srv_flag(argc, argv, &i, "--device"))) {
            if (krn_backend_by_name(v, &a->backend, &a->device) != ENG_STATUS_OK) {
                fprintf(stderr, "error: --device: %s\n", eng_last_error());
                return 2;
            }
            if (strcmp(v, "auto") == 0) fprintf(stderr, "tensord: %s\n", krn_backend_auto_note());
        }
        else if ((v = srv_flag(argc, argv, &i, "--input"))) {
            const char *eq = strchr(v, '=');
            if (!eq || eq == v || !eq[1]) {
                fprintf(stderr, "error: --input takes NAME=FILE.npy, got '%s'\n", v);
                return 2;
            }
            if (a->ninputs == RUN_MAX_INPUTS) {
                fprintf(stderr, "error: more than %d inputs\n", RUN_MAX_INPUTS);
                return 2;
            }
            a->names[a->ninputs] = strndup(v, (size_t)(eq - v));
            eng_tensor *t = NULL;
            if (eng_npy_load(eq + 1, &t) != ENG_STATUS_OK) {
                fprintf(stderr, "error: input '%s': %s\n", a->names[a->ninputs], eng_last_error());
                free(a->names[a->ninputs]);
                return 1;
            }
            a->tensors[a->ninputs++] = t;
        } else {
            fprintf(stderr, "error: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!a->model) {
        fprintf(stderr, "error: --model is required\n");
        return 2;
    }
    if (!bench && !a->outdir) {
        fprintf(stderr, "error: --output-dir is required\n");
        return 2;
    }
    if (a->iterations < 1 || a->warmup < 0) {
        fprintf(stderr, "error: --iterations must be >= 1 and --warmup >= 0\n");
        return 2;
    }
    return 0;
}

static int run_once(eng_session *s, run_args *a, eng_tensor *outs) {
    eng_tensor in[RUN_MAX_INPUTS];
    for (int i = 0; i < a->ninputs; i++) in[i] = *a->tensors[i];
    if (eng_session_run(s, a->ninputs, (const char *const *)a->names, in, outs) != ENG_STATUS_OK) return fail(NULL);
    return 0;
}

/* Output names become file names: keep [A-Za-z0-9_.-], map the rest to '_', never start with '.'. */
static void safe_name(const char *in, char *out, size_t n) {
    size_t k = 0;
    for (; *in && k + 1 < n; in++) {
        char c = *in;
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
                 (c == '.' && k > 0);
        out[k++] = ok ? c : '_';
    }
    if (k == 0) out[k++] = '_';
    out[k] = 0;
}

/* Parse the command line and load the model: 0 with *s and *outs set (outs sized for the graph's outputs), or
 * the exit code with everything released. */
static int open_model(int argc, char **argv, int bench, run_args *a, eng_session **s, eng_tensor **outs) {
    *s = NULL;
    *outs = NULL;
    int rc = parse(argc, argv, a, bench);
    if (rc) {
        run_args_free(a);
        return rc;
    }
    eng_session_opts so = {.nthreads = a->nthreads, .precision = a->precision, .backend = a->backend,
                           .device = a->device};
    if (eng_session_new_file(a->model, &so, s) != ENG_STATUS_OK) {
        run_args_free(a);
        return fail(NULL);
    }
    *outs = calloc((size_t)eng_session_graph(*s)->noutputs + 1, sizeof **outs);
    if (!*outs) {
        eng_session_free(s);
        run_args_free(a);
        return fail("out of memory");
    }
    return 0;
}

int srv_cmd_predict(int argc, char **argv) {
    run_args a;
    eng_session *s;
    eng_tensor *outs;
    int rc = open_model(argc, argv, 0, &a, &s, &outs);
    if (rc) return rc;
    const eng_graph *g = eng_session_graph(s);
    rc = run_once(s, &a, outs);
    if (rc == 0 && mkdir(a.outdir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "error: cannot create output directory '%s': %s\n", a.outdir, strerror(errno));
        rc = 1;
    }
    for (int i = 0; rc == 0 && i < g->noutputs; i++) {
        char name[512], path[4096];
        safe_name(g->values[g->outputs[i]].name, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s.npy", a.outdir, name);
        if (eng_npy_save(path, &outs[i]) != ENG_STATUS_OK) rc = fail(NULL);
        else printf("%s -> %s\n", g->values[g->outputs[i]].name, path);
    }
    free(outs);
    eng_session_free(&s);
    run_args_free(&a);
    return rc;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int dbl_cmp(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

int srv_cmd_bench(int argc, char **argv) {
    run_args a;
    eng_session *s;
    eng_tensor *outs;
    int rc = open_model(argc, argv, 1, &a, &s, &outs);
    if (rc) return rc;
    double *t = calloc((size_t)a.iterations, sizeof *t);
    double t0 = now_ms();
    rc = t ? run_once(s, &a, outs) : fail("out of memory");
    double first = now_ms() - t0;
    for (int i = 0; rc == 0 && i < a.warmup; i++) rc = run_once(s, &a, outs);
    for (int i = 0; rc == 0 && i < a.iterations; i++) {
        double b = now_ms();
        rc = run_once(s, &a, outs);
        t[i] = now_ms() - b;
    }
    if (rc == 0) {
        eng_plan_stats st;
        eng_session_last_stats(s, &st);
        qsort(t, (size_t)a.iterations, sizeof *t, dbl_cmp);
        double med = t[a.iterations / 2], p90 = t[(int)((a.iterations - 1) * 0.9)];
        printf("model=%s nodes=%d steps=%d folded=%d dynamic=%d arena_bytes=%zu (without reuse %zu) first_run_ms=%.3f",
               a.model, st.nodes, st.steps, st.folded, st.dynamic, st.arena_bytes, st.naive_bytes, first);
        if (st.split_workers) printf(" batch_split=%d threads x %d rows", st.split_workers, st.split_rows);
        printf(" precision=%s", eng_precision_name(st.precision));
        if (st.lowp_steps) printf(" (%d steps, %d activations in %s)", st.lowp_steps, st.lowp_values, eng_precision_name(st.precision));
        if (st.device_steps || (a.backend && !krn_backend_is_host(a.backend))) /* dynamic plans: the last run's */
            printf(" device=%s:%d device_steps=%d fallback_steps=%d copies=%d copy_bytes=%zu device_bytes=%zu",
                   krn_backend_name(a.backend), a.device, st.device_steps, st.fallback_steps, st.copies, st.copy_bytes,
                   st.device_bytes);
        if (st.device_steps)
            printf(" graphs=%d graph_captures=%lld graph_launches=%lld%s%s%s", st.graphs, (long long)st.graph_captures,
                   (long long)st.graph_launches, st.graph_off ? " (graphs off: " : "", st.graph_off ? st.graph_off : "",
                   st.graph_off ? ")" : "");
        printf("\n");
        printf("iterations=%d min_ms=%.4f max_ms=%.4f\n", a.iterations, t[0], t[a.iterations - 1]);
        printf("median_ms=%.4f p90_ms=%.4f\n", med, p90);
    }
    free(t);
    free(outs);
    eng_session_free(&s);
    run_args_free(&a);
    return rc;
}
