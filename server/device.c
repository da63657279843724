/* device.c - device specs of `tensord serve --device` and a model's `device` field (see device.h), over the
 * engine's krn_backend_by_name, which owns the names ("cpu", "cuda:N", "sim:N") and the reasons a device is
 * missing. "auto" is resolved here (CUDA device 0, else the CPU), and the choice is logged through srv_log (text or
 * --log_format=json) once per process, when the first version that asks for "auto" loads. */
#include "device.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "log.h"

static atomic_int device_auto_logged; /* the "auto" choice is logged once per process (log.h: process-wide) */

/* krn_backend_by_name, with "auto" resolved (and logged) here. */
static eng_status device_by_name(const char *e, const krn_backend **b, int *dev) {
    if (strcmp(e, "auto") != 0) return krn_backend_by_name(e, b, dev);
    if (krn_backend_by_name("cuda:0", b, dev) == ENG_STATUS_OK) {
        if (!atomic_exchange(&device_auto_logged, 1))
            srv_log(SRV_LOG_INFO, "device", NULL, 0, "auto: using CUDA (%d device%s)", krn_backend_device_count(*b),
                    krn_backend_device_count(*b) == 1 ? "" : "s");
        return ENG_STATUS_OK;
    }
    const char *why = krn_cuda_unavailable_reason()[0] ? krn_cuda_unavailable_reason() : eng_last_error();
    if (!atomic_exchange(&device_auto_logged, 1)) srv_log(SRV_LOG_INFO, "device", NULL, 0, "no CUDA device, using CPU (%s)", why);
    *b = krn_backend_cpu();
    *dev = 0;
    return ENG_STATUS_OK;
}

/* The entry s[0..len) with surrounding blanks cut into buf (cut to cap - 1 characters). */
static void device_entry(const char *s, size_t len, char *buf, size_t cap) {
    while (len && (*s == ' ' || *s == '\t')) s++, len--;
    while (len && (s[len - 1] == ' ' || s[len - 1] == '\t')) len--;
    if (len >= cap) len = cap - 1;
    memcpy(buf, s, len);
    buf[len] = 0;
}

/* Calls fn on each entry of spec ("auto" when spec is NULL or blank) until it returns non-OK. */
typedef srv_code (*device_fn)(const char *entry, void *arg, srv_error *err);
static srv_code device_each(const char *spec, const char *what, device_fn fn, void *arg, int *n, srv_error *err) {
    int k = 0;
    if (n) *n = 0;
    if (!spec || !spec[strspn(spec, " \t")]) spec = "auto";
    if (strlen(spec) > SRV_DEVICE_SPEC_MAX)
        return srv_err(err, SRV_INVALID_ARGUMENT, "%s: device list '%.60s...' is longer than %d characters", what, spec,
                       SRV_DEVICE_SPEC_MAX);
    for (const char *p = spec;; k++) {
        size_t len = strcspn(p, ",");
        char e[SRV_DEVICE_SPEC_MAX + 1];
        device_entry(p, len, e, sizeof e); /* fits: the whole spec does */
        if (!*e)
            return srv_err(err, SRV_INVALID_ARGUMENT, "%s: device list '%s' has an empty entry (expected cpu, cuda:N, "
                           "sim:N or auto, comma-separated)", what, spec);
        if (k == SRV_DEVICE_MAX)
            return srv_err(err, SRV_INVALID_ARGUMENT, "%s: device list '%.60s...' has more than %d entries", what, spec,
                           SRV_DEVICE_MAX);
        srv_code c = fn(e, arg, err);
        if (c != SRV_OK) return c;
        if (!p[len]) break;
        p += len + 1;
    }
    if (n) *n = k + 1;
    return SRV_OK;
}

typedef struct device_check_arg {
    const char *what;
} device_check_arg;

static srv_code device_check_one(const char *e, void *arg, srv_error *err) {
    const device_check_arg *a = arg;
    const krn_backend *b;
    int dev;
    if (strcmp(e, "auto") == 0) return SRV_OK; /* always resolves; its choice is logged when a version uses it */
    eng_status st = krn_backend_by_name(e, &b, &dev);
    if (st == ENG_STATUS_OK || st == ENG_STATUS_UNSUPPORTED) return SRV_OK; /* UNSUPPORTED: not here; the load says why */
    return srv_err(err, SRV_INVALID_ARGUMENT, "%s: %s", a->what, eng_last_error());
}

srv_code srv_device_spec_check(const char *spec, const char *what, int *n, srv_error *err) {
    device_check_arg a = {what};
    return device_each(spec, what, device_check_one, &a, n, err);
}

typedef struct device_resolve_arg {
    srv_device *out;
    int n;
} device_resolve_arg;

static srv_code device_resolve_one(const char *e, void *arg, srv_error *err) {
    device_resolve_arg *a = arg;
    const krn_backend *b = NULL;
    int dev = 0;
    eng_status st = device_by_name(e, &b, &dev);
    if (st != ENG_STATUS_OK)
        return srv_err(err, st == ENG_STATUS_UNSUPPORTED ? SRV_UNAVAILABLE : SRV_INVALID_ARGUMENT, "%s", eng_last_error());
    srv_device *d = &a->out[a->n++];
    d->host = krn_backend_is_host(b);
    d->backend = d->host ? NULL : b;
    d->index = d->host ? 0 : dev;
    if (d->host) snprintf(d->name, sizeof d->name, "cpu");
    else snprintf(d->name, sizeof d->name, "%.24s:%d", krn_backend_name(b), dev);
    return SRV_OK;
}

srv_code srv_device_resolve(const char *spec, srv_device *out, int *n, srv_error *err) {
    device_resolve_arg a = {out, 0};
    srv_code c = device_each(spec, "device", device_resolve_one, &a, NULL, err);
    *n = c == SRV_OK ? a.n : 0;
    return c;
}

int srv_device_instances(int count, int cpu_default, const srv_device *devs, int n) {
    int k = count > 0 ? count : (n == 1 && devs[0].host) ? cpu_default : n;
    return k < 1 ? 1 : k > SRV_DEVICE_MAX ? SRV_DEVICE_MAX : k;
}

/* Lost devices already logged, by resolved name ("cuda:0"): process-wide, as the CUDA context that was lost is. */
static pthread_mutex_t device_lost_mu = PTHREAD_MUTEX_INITIALIZER;
static char device_lost_seen[SRV_DEVICE_MAX][40];
static int device_lost_nseen;

int srv_device_lost(const srv_device *d, char *why, size_t cap) {
    char reason[512];
    if (why && cap) why[0] = 0;
    if (!d || d->host || !krn_backend_device_lost(d->backend, d->index, reason, sizeof reason)) return 0;
    if (why && cap) snprintf(why, cap, "%s", reason);
    int first = 1;
    pthread_mutex_lock(&device_lost_mu);
    for (int i = 0; i < device_lost_nseen && first; i++) first = strcmp(device_lost_seen[i], d->name) != 0;
    if (first && device_lost_nseen < SRV_DEVICE_MAX)
        snprintf(device_lost_seen[device_lost_nseen++], sizeof device_lost_seen[0], "%s", d->name);
    pthread_mutex_unlock(&device_lost_mu);
    if (first)
        srv_log(SRV_LOG_ERROR, "device_lost", NULL, 0, "device %s is lost (%s): its execution instances take no more "
                "work; versions with none left become unavailable, and only a restart of the server recovers it",
                d->name, reason);
    return first ? 2 : 1;
}
