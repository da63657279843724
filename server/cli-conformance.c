/* cli-conformance.c - `tensord conformance DIR`: run ONNX backend tests (Debian libonnx-testdata layout:
 * DIR/<test>/model.onnx + DIR/<test>/test_data_set_N/{input,output}_K.pb) and compare like ONNX's runner
 * (numpy assert_allclose with rtol 1e-3, atol 1e-7; NaN equals NaN; integers and bools exact).
 *
 * Classification: PASS; SKIP when the engine reports UNSUPPORTED (an op, dtype or feature we do not
 * implement) or the test uses non-tensor types; FAIL otherwise (wrong numbers, wrong shape, any other error).
 * With --expect FILE (one test name per line, '#' comments), exit 1 if a listed test does not pass.
 * Without it, exit 1 if any test failed. --isolate runs each test in a child process: a crash is then a
 * CRASH line (and exit 1) instead of the end of the run. Ends with the line "N passed, M failed, K skipped".
 * Test cases are read by engine/ir/onnx-testdata.c, the loader tests/test_ops.c shares.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../engine/ir/graph.h"
#include "../engine/ir/onnx-testdata.h"
#include "../engine/ir/seq.h"
#include "../engine/plan/session.h"
#include "cli.h"

enum { RES_PASS, RES_FAIL, RES_SKIP, RES_CRASH };

typedef struct conf_opts {
    const char *filter;
    int verbose;
    int isolate;
    int nthreads;
} conf_opts;

static int compare(const eng_tensor *got, const eng_tensor *want, char *why, size_t n);

/* Sequences: the same length, then element by element. */
static int compare_seq(const eng_tensor *got, const eng_tensor *want, char *why, size_t n) {
    const eng_seq *g = eng_seq_get(got), *w = eng_seq_get(want);
    if (!g || !w) {
        snprintf(why, n, "%s, expected %s", eng_dtype_name(got->dtype), eng_dtype_name(want->dtype));
        return 0;
    }
    if (g->n != w->n) {
        snprintf(why, n, "a sequence of %lld elements, expected %lld", (long long)g->n, (long long)w->n);
        return 0;
    }
    for (int64_t i = 0; i < g->n; i++) {
        char r[300];
        if (!compare(&g->items[i], &w->items[i], r, sizeof r)) {
            snprintf(why, n, "sequence element %lld: %s", (long long)i, r);
            return 0;
        }
    }
    return 1;
}

/* Compare got vs want; on mismatch write a reason. */
static int compare(const eng_tensor *got, const eng_tensor *want, char *why, size_t n) {
    char a[160], b[160];
    if (got->dtype == ENG_DTYPE_SEQUENCE || want->dtype == ENG_DTYPE_SEQUENCE) return compare_seq(got, want, why, n);
    if (got->dtype != want->dtype) {
        snprintf(why, n, "dtype %s, expected %s", eng_dtype_name(got->dtype), eng_dtype_name(want->dtype));
        return 0;
    }
    if (!eng_shape_equal(got, want)) {
        snprintf(why, n, "shape %s, expected %s", eng_shape_str(got->dims, got->ndim, a, sizeof a),
                 eng_shape_str(want->dims, want->ndim, b, sizeof b));
        return 0;
    }
    int64_t cnt = eng_tensor_numel(want);
    int fl = eng_dtype_is_float(want->dtype);
    for (int64_t i = 0; i < cnt; i++) {
        if (fl) {
            double x = eng_tensor_get_f64(got, i), y = eng_tensor_get_f64(want, i);
            if (isnan(x) && isnan(y)) continue;
            if (isinf(y) && x == y) continue;
            if (!(fabs(x - y) <= 1e-7 + 1e-3 * fabs(y))) {
                snprintf(why, n, "element %lld: got %.9g, expected %.9g", (long long)i, x, y);
                return 0;
            }
        } else if (eng_tensor_get_i64(got, i) != eng_tensor_get_i64(want, i)) {
            snprintf(why, n, "element %lld: got %lld, expected %lld", (long long)i, (long long)eng_tensor_get_i64(got, i),
                     (long long)eng_tensor_get_i64(want, i));
            return 0;
        }
    }
    return 1;
}

static int classify(eng_status st) { return st == ENG_STATUS_UNSUPPORTED ? RES_SKIP : RES_FAIL; }

static int run_test(const char *dir, const char *name, const conf_opts *o, char *why, size_t wn) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/model.onnx", dir, name);
    eng_session_opts so = {.nthreads = o->nthreads};
    eng_session *s = NULL;
    eng_status st = eng_session_new_file(path, &so, &s);
    if (st != ENG_STATUS_OK) {
        snprintf(why, wn, "load: %s", eng_last_error());
        return classify(st);
    }
    const eng_graph *g = eng_session_graph(s);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int nsets = 0;
    char **sets = eng_testdata_dirs(path, "test_data_set_", &nsets);
    int res = nsets ? RES_PASS : RES_SKIP;
    if (!nsets) snprintf(why, wn, "no test_data_set_* directories");
    eng_tensor *outs = calloc((size_t)g->noutputs + 1, sizeof *outs);
    for (int si = 0; si < nsets && res == RES_PASS; si++) {
        eng_testdata_set d;
        st = eng_testdata_set_load(path, sets[si], g, &d);
        if (st != ENG_STATUS_OK) {
            snprintf(why, wn, "%s", eng_last_error());
            res = classify(st); /* an input count the positional feed cannot map is UNSUPPORTED: a skip */
        }
        if (res == RES_PASS) {
            st = eng_session_run(s, d.nfeed, d.names, d.feed, outs);
            if (st != ENG_STATUS_OK) {
                snprintf(why, wn, "run: %s", eng_last_error());
                res = classify(st);
            }
        }
        for (int k = 0; res == RES_PASS && k < g->noutputs; k++) {
            eng_tensor *want = NULL;
            st = eng_testdata_output_load(path, sets[si], k, outs[k].dtype, &want);
            if (st != ENG_STATUS_OK) {
                snprintf(why, wn, "%s", eng_last_error());
                res = classify(st);
                break;
            }
            char r[400];
            if (!compare(&outs[k], want, r, sizeof r)) {
                snprintf(why, wn, "%s output %d ('%s'): %s", sets[si], k, g->values[g->outputs[k]].name, r);
                res = RES_FAIL;
            }
            eng_tensor_destroy(&want);
        }
        eng_testdata_set_free(&d);
    }
    free(outs);
    eng_testdata_names_free(sets, nsets);
    eng_session_free(&s);
    return res;
}

/* Run one test in a child process so that a crash is reported as a CRASH line, not the end of the run. */
static int run_test_isolated(const char *dir, const char *name, const conf_opts *o, char *why, size_t wn) {
    int fds[2];
    if (pipe(fds) != 0) return run_test(dir, name, o, why, wn);
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return run_test(dir, name, o, why, wn);
    }
    if (pid == 0) {
        close(fds[0]);
        int r = run_test(dir, name, o, why, wn);
        size_t len = strlen(why);
        if (write(fds[1], why, len) != (ssize_t)len) r = RES_FAIL;
        _exit(r);
    }
    close(fds[1]);
    size_t k = 0;
    ssize_t got;
    while (k + 1 < wn && (got = read(fds[0], why + k, wn - 1 - k)) > 0) k += (size_t)got;
    why[k] = 0;
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFEXITED(status) && WEXITSTATUS(status) <= RES_SKIP) return WEXITSTATUS(status);
    snprintf(why, wn, "CRASHED (%s %d)", WIFSIGNALED(status) ? "signal" : "exit code",
             WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    return RES_CRASH;
}

int srv_cmd_conformance(int argc, char **argv) {
    conf_opts o = {0};
    const char *dir = NULL, *expect = NULL, *write_passes = NULL;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if ((v = srv_flag(argc, argv, &i, "--filter"))) o.filter = v;
        else if ((v = srv_flag(argc, argv, &i, "--expect"))) expect = v;
        else if ((v = srv_flag(argc, argv, &i, "--write-passes"))) write_passes = v;
        else if ((v = srv_flag(argc, argv, &i, "--threads"))) o.nthreads = atoi(v);
        else if (strcmp(argv[i], "--isolate") == 0) o.isolate = 1;
        else if (strcmp(argv[i], "-v") == 0 || strcmp(argv[i], "--verbose") == 0) o.verbose = 1;
        else if (argv[i][0] == '-') {
            fprintf(stderr, "error: unknown option '%s'\n", argv[i]);
            return 2;
        } else dir = argv[i];
    }
    if (!dir) {
        fprintf(stderr, "error: conformance needs a directory of ONNX backend tests\n");
        return 2;
    }
    int ntests = 0;
    char **tests = eng_testdata_dirs(dir, NULL, &ntests);
    if (!tests || ntests == 0) {
        fprintf(stderr, "error: no tests under '%s'\n", dir);
        eng_testdata_names_free(tests, ntests);
        return 1;
    }
    int nexp = 0;
    char **exp = NULL;
    if (expect) {
        exp = eng_testdata_names_read(expect, &nexp);
        if (!exp) {
            fprintf(stderr, "error: cannot read expected-pass list '%s'\n", expect);
            eng_testdata_names_free(tests, ntests);
            return 2;
        }
    }
    FILE *wp = NULL;
    if (write_passes && !(wp = fopen(write_passes, "w"))) {
        fprintf(stderr, "error: cannot write '%s'\n", write_passes);
        return 2;
    }
    int *res = calloc((size_t)ntests, sizeof *res);
    int npass = 0, nfail = 0, nskip = 0, ncrash = 0;
    for (int t = 0; t < ntests; t++) {
        res[t] = -1;
        if (o.filter && !strstr(tests[t], o.filter)) continue;
        char why[2048] = "";
        eng_err_clear();
        res[t] = o.isolate ? run_test_isolated(dir, tests[t], &o, why, sizeof why)
                           : run_test(dir, tests[t], &o, why, sizeof why);
        if (res[t] == RES_PASS) {
            npass++;
            if (wp) fprintf(wp, "%s\n", tests[t]);
            if (o.verbose) printf("PASS %s\n", tests[t]);
        } else if (res[t] == RES_SKIP) {
            nskip++;
            if (o.verbose) printf("SKIP %s: %s\n", tests[t], why);
        } else {
            nfail++;
            if (res[t] == RES_CRASH) ncrash++;
            printf("%s %s: %s\n", res[t] == RES_CRASH ? "CRASH" : "FAIL", tests[t], why);
        }
        fflush(stdout);
    }
    int regress = 0;
    for (int e = 0; e < nexp; e++) {
        int found = 0;
        for (int t = 0; t < ntests; t++)
            if (strcmp(tests[t], exp[e]) == 0) {
                found = 1;
                if (res[t] != RES_PASS && res[t] != -1) {
                    printf("REGRESSION %s: listed in %s but did not pass\n", exp[e], expect);
                    regress++;
                }
            }
        if (!found) {
            printf("REGRESSION %s: listed in %s but not found under %s\n", exp[e], expect, dir);
            regress++;
        }
    }
    if (wp) fclose(wp);
    printf("%d passed, %d failed, %d skipped\n", npass, nfail, nskip);
    free(res);
    eng_testdata_names_free(tests, ntests);
    eng_testdata_names_free(exp, nexp);
    if (ncrash) printf("%d tests crashed\n", ncrash);
    if (expect) return (regress || ncrash) ? 1 : 0;
    return nfail ? 1 : 0;
}
