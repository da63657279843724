/* srv.c - what every serving file shares: status codes and their HTTP mapping, error values, named tensor
 * sets that own their data, name validation, removing a directory tree and a monotonic clock.
 *
 * Invariants:
 *  - srv_err never fails and always NUL-terminates err->msg (messages longer than SRV_ERR_MAX are cut); its
 *    arguments may include err->msg itself, to put context before a message.
 *  - An srv_tensors owns names[i] (malloc) and t[i].data (eng_alloc) for every i < n; names and t always
 *    have the same length n; srv_tensors_free leaves a zeroed, reusable set.
 *  - srv_tensors_add takes ownership of the data in every case, also when it fails (then the data is freed),
 *    so callers never leak and never double-free.
 */
#define _GNU_SOURCE
#include "srv.h"

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

srv_code srv_err(srv_error *err, srv_code code, const char *fmt, ...) {
    if (!err) return code;
    err->code = code;
    char m[sizeof err->msg]; /* formatted aside first: an argument may be err->msg itself ("ctx: %s", err->msg) */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    memcpy(err->msg, m, sizeof m);
    return code;
}

static srv_code code_from_eng(eng_status st) {
    switch (st) {
    case ENG_STATUS_OK: return SRV_OK;
    case ENG_STATUS_INVALID_ARGUMENT:
    case ENG_STATUS_INVALID_MODEL: return SRV_INVALID_ARGUMENT;
    case ENG_STATUS_NOT_FOUND: return SRV_NOT_FOUND;
    case ENG_STATUS_UNSUPPORTED: return SRV_UNIMPLEMENTED;
    case ENG_STATUS_OUT_OF_MEMORY: return SRV_RESOURCE_EXHAUSTED;
    case ENG_STATUS_DEADLINE_EXCEEDED: return SRV_DEADLINE_EXCEEDED;
    default: return SRV_INTERNAL;
    }
}

srv_code srv_err_from_eng(srv_error *err, eng_status st, const char *prefix) {
    srv_code c = code_from_eng(st);
    const char *m = eng_last_error();
    if (!m || !*m) m = eng_status_name(st);
    if (prefix && *prefix) return srv_err(err, c, "%s: %s", prefix, m);
    return srv_err(err, c, "%s", m);
}

const char *srv_code_name(srv_code c) {
    switch (c) {
    case SRV_OK: return "OK";
    case SRV_CANCELLED: return "CANCELLED";
    case SRV_UNKNOWN: return "UNKNOWN";
    case SRV_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case SRV_DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case SRV_NOT_FOUND: return "NOT_FOUND";
    case SRV_ALREADY_EXISTS: return "ALREADY_EXISTS";
    case SRV_PERMISSION_DENIED: return "PERMISSION_DENIED";
    case SRV_RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case SRV_FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case SRV_ABORTED: return "ABORTED";
    case SRV_OUT_OF_RANGE: return "OUT_OF_RANGE";
    case SRV_UNIMPLEMENTED: return "UNIMPLEMENTED";
    case SRV_INTERNAL: return "INTERNAL";
    case SRV_UNAVAILABLE: return "UNAVAILABLE";
    case SRV_DATA_LOSS: return "DATA_LOSS";
    case SRV_UNAUTHENTICATED: return "UNAUTHENTICATED";
    }
    return "UNKNOWN";
}

/* TF Serving's REST mapping (tensorflow_serving/model_servers/http_rest_api_handler: ToHTTPStatusCode). */
int srv_code_http(srv_code c) {
    switch (c) {
    case SRV_OK: return 200;
    case SRV_INVALID_ARGUMENT:
    case SRV_FAILED_PRECONDITION:
    case SRV_OUT_OF_RANGE: return 400;
    case SRV_UNAUTHENTICATED: return 401;
    case SRV_PERMISSION_DENIED: return 403;
    case SRV_NOT_FOUND: return 404;
    case SRV_ALREADY_EXISTS: return 409;
    case SRV_RESOURCE_EXHAUSTED: return 429;
    case SRV_CANCELLED: return 499;
    case SRV_UNIMPLEMENTED: return 501;
    case SRV_UNAVAILABLE: return 503;
    case SRV_DEADLINE_EXCEEDED: return 504;
    default: return 500;
    }
}

int srv_tensors_add(srv_tensors *s, const char *name, const eng_tensor *t) {
    char *nm = strdup(name ? name : "");
    char **names = nm ? realloc(s->names, (size_t)(s->n + 1) * sizeof *names) : NULL;
    if (names) s->names = names;
    eng_tensor *ts = names ? realloc(s->t, (size_t)(s->n + 1) * sizeof *ts) : NULL;
    if (!ts) {
        free(nm);
        eng_free(t->data);
        return -1;
    }
    s->t = ts;
    s->names[s->n] = nm;
    s->t[s->n] = *t;
    s->n++;
    return 0;
}

int srv_tensors_add_copy(srv_tensors *s, const char *name, const eng_tensor *t) {
    size_t nb = 0;
    if (eng_tensor_nbytes_checked(t, name ? name : "tensor", &nb) != ENG_STATUS_OK) return -1;
    eng_tensor c = *t;
    c.data = eng_alloc(nb ? nb : 64); /* never NULL for present tensors, even with zero elements */
    if (!c.data) return -1;
    if (nb && t->data) memcpy(c.data, t->data, nb);
    return srv_tensors_add(s, name, &c);
}

int srv_tensors_find(const srv_tensors *s, const char *name) {
    if (!s || !name) return -1;
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->names[i], name) == 0) return i;
    return -1;
}

void srv_tensors_free(srv_tensors *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) {
        free(s->names[i]);
        eng_free(s->t[i].data);
    }
    free(s->names);
    free(s->t);
    memset(s, 0, sizeof *s);
}

/* (readdir, not nftw: unit tests compile this file in after system headers, without _XOPEN_SOURCE) */
int srv_remove_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return errno == ENOENT ? 0 : -1;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        if (!d) return -1;
        int rc = 0;
        struct dirent *e;
        while (rc == 0 && (e = readdir(d)) != NULL) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            size_t n = strlen(path) + strlen(e->d_name) + 2;
            char *p = malloc(n);
            if (!p) {
                errno = ENOMEM;
                rc = -1;
                break;
            }
            snprintf(p, n, "%s/%s", path, e->d_name);
            rc = srv_remove_tree(p);
            free(p);
        }
        closedir(d);
        if (rc != 0) return -1;
    }
    return remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

int srv_name_valid(const char *name) {
    if (!name || !*name) return 0;
    if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0) return 0;
    size_t n = 0;
    for (const char *p = name; *p; p++, n++) {
        char c = *p;
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                 c == '.' || c == '-';
        if (!ok || n >= 255) return 0;
    }
    return 1;
}

int64_t srv_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int srv_bearer_ok(const char *hdr, const char *token) {
    if (!hdr) return 0;
    while (*hdr == ' ') hdr++;
    if (strncasecmp(hdr, "Bearer ", 7) != 0) return 0;
    const char *p = hdr + 7;
    while (*p == ' ') p++;
    size_t n = strlen(p), m = strlen(token);
    while (n > 0 && (p[n - 1] == ' ' || p[n - 1] == '\t')) n--;
    volatile unsigned char d = n != m;
    for (size_t i = 0; i < m; i++) d |= (unsigned char)(token[i] ^ (i < n ? p[i] : 0));
    return d == 0;
}
