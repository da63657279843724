/* device.h - where a served version runs: `tensord serve --device SPEC` (env TENSORD_DEVICE; default "auto") and a
 * model config's `device` field, which overrides it for that model.
 *
 * SPEC is one device or a comma-separated list: "cpu", "cuda:N" (also "cuda", "gpu:N"), "sim:N" (the host-memory
 * test device), "auto" (CUDA device 0 when there is one, else the CPU; the choice is logged once per process through
 * srv_log when the first version that uses it loads: "no CUDA device, using CPU (<why>)").
 * A version gets one execution instance per listed device, instance i on device i % n; when the model sets
 * instance_count (or the server --instances_per_version) that many instances spread round-robin over the list.
 *
 * Two moments, two kinds of error: srv_device_spec_check runs when a config is read (or a flag parsed) and refuses
 * what can never work (syntax, unknown kind, an index past the devices the backend has); srv_device_resolve runs
 * when a version loads and fails that load alone when a device is not available on this machine (CUDA with no
 * plugin, driver or GPU), with the engine's reason. Thread-safe. Its one piece of state is process-wide, as a CUDA
 * context is: which lost devices it has logged (srv_device_lost).
 */
#ifndef SRV_DEVICE_H
#define SRV_DEVICE_H

#include "../kernels/kernel.h"
#include "srv.h"

#define SRV_DEVICE_SPEC_MAX 512 /* characters of a spec */
#define SRV_DEVICE_MAX 64       /* entries of a spec (SRV_MAX_INSTANCES) */

typedef struct srv_device {
    const krn_backend *backend; /* NULL: the CPU (as eng_session_opts takes it) */
    int index;                  /* the backend's device index (0 on the CPU) */
    int host;                   /* 1: the CPU (no device memory) */
    char name[40];              /* resolved: "cpu", "cuda:0", "sim:1" ("auto" becomes one of these) */
} srv_device;

/* Check spec (NULL or "" is "auto"): OK, or INVALID_ARGUMENT "<what>: device '<entry>': <why>". A kind that is
 * known but not available here passes (the load reports it). *n (may be NULL) gets the number of entries. */
srv_code srv_device_spec_check(const char *spec, const char *what, int *n, srv_error *err);

/* Resolve spec's entries into out (room for SRV_DEVICE_MAX), *n of them. A device that is not available:
 * UNAVAILABLE "device '<entry>' is not available: <why>"; a bad entry: INVALID_ARGUMENT. May load the CUDA plugin
 * (first call in the process): call it with no lock held. */
srv_code srv_device_resolve(const char *spec, srv_device *out, int *n, srv_error *err);

/* Execution instances of a version on devs[0..n): `count` (> 0: the model's instance_count or the server's
 * --instances_per_version) when given; else one per listed device, except that a list of just the CPU keeps the
 * CPU's default (cpu_default: srv_instances_resolve's usable cores / threads). Capped at SRV_DEVICE_MAX. */
int srv_device_instances(int count, int cpu_default, const srv_device *devs, int n);

/* Device health: nonzero when device d is lost, that is, a sticky error (an illegal address, ...) corrupted its
 * context, so that every later call on it fails until the process restarts (krn_backend_device_lost); why[cap] (may
 * be NULL) then gets the first error that lost it. The first call in the process that finds d lost logs one line
 * (event "device_lost", naming the device and the reason) and returns 2; later calls return 1. Host devices: 0.
 * Thread-safe; cheap while the device works (an atomic load). */
int srv_device_lost(const srv_device *d, char *why, size_t cap);

#endif
