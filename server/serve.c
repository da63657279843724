/* serve.c - `tensord serve`: wires options, registry, poller, REST front end and signals together.
 *
 * Startup: parse TF Serving's flags, set up metrics, the registry (with batching if asked), the model set
 * from --model_config_file or --model_name/--model_base_path (env MODEL_NAME/MODEL_BASE_PATH), start the
 * file-system poller and the REST server. Health endpoints answer 503 until every configured model has an
 * AVAILABLE version. Signals are blocked in every thread and taken synchronously here: SIGHUP re-reads the
 * model config file; SIGTERM/SIGINT stop accepting connections, let in-flight requests finish up to
 * --drain_seconds, then exit 0 (TF Serving does not drain: #1853). At the deadline, requests still running
 * are answered 503 and the process exits at once with status 3, so a supervisor can tell that work was cut.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "config.h"
#include "log.h"
#include "metrics.h"
#include "registry.h"
#include "admin-ops.h"
#include "admin/datasets.h"
#include "admin/jobs.h"
#include "grpc.h"
#include "rest.h"
#include "../engine/plan/plan.h"

static int serve_apply_config(const srv_options *o, srv_registry *reg) {
    srv_model_config *cfgs = NULL;
    int n = 0;
    srv_error err = {0};
    if (srv_config_models(o, &cfgs, &n, &err) != SRV_OK) {
        srv_log(SRV_LOG_ERROR, "config", NULL, 0, "%s", err.msg);
        return -1;
    }
    int rc = 0;
    if (srv_registry_set_config(reg, cfgs, n, &err) != SRV_OK) {
        srv_log(SRV_LOG_ERROR, "config", NULL, 0, "%s", err.msg);
        rc = -1;
    }
    for (int i = 0; i < n; i++) srv_model_config_free(&cfgs[i]);
    free(cfgs);
    return rc;
}

int srv_cmd_serve(int argc, char **argv) {
    srv_options o;
    srv_error err = {0};
    if (srv_options_parse(argc, argv, &o, &err) != SRV_OK) {
        srv_log(SRV_LOG_ERROR, "config", NULL, 0, "%s", err.msg);
        srv_options_free(&o);
        return 2;
    }
    /* Block the signals we handle before any thread starts, so all threads inherit the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    srv_log_set_json(o.log_format && strcmp(o.log_format, "json") == 0);
    signal(SIGPIPE, SIG_IGN);

    srv_batch_opts bopts;
    int metrics_on = 1;
    char *metrics_path = NULL;
    if (o.enable_batching) {
        srv_batch_opts_default(&bopts);
        if (o.batching_parameters_file && srv_config_load_batching(o.batching_parameters_file, &bopts, &err) != SRV_OK) {
            srv_log(SRV_LOG_ERROR, "config", NULL, 0, "%s", err.msg);
            srv_options_free(&o);
            return 2;
        }
    }
    if (o.monitoring_config_file &&
        srv_config_load_monitoring(o.monitoring_config_file, &metrics_on, &metrics_path, &err) != SRV_OK) {
        srv_log(SRV_LOG_ERROR, "config", NULL, 0, "%s", err.msg);
        srv_options_free(&o);
        return 2;
    }
    srv_metrics *metrics = srv_metrics_new();
    srv_registry_opts ro = {.session_threads = o.session_threads,
                            .instances_per_version = o.instances_per_version > 0 ? o.instances_per_version : 0,
                            .batching = o.enable_batching ? &bopts : NULL,
                            .allow_labels_for_unavailable = o.allow_version_labels_for_unavailable_models,
                            .metrics = metrics,
                            .load_timeout_s = o.model_load_timeout_s,
                            .explicit_control = o.model_control_mode && strcmp(o.model_control_mode, "explicit") == 0,
                            .device = o.device};
    srv_registry *reg = srv_registry_new(&ro);
    if (!reg || !metrics || serve_apply_config(&o, reg) != 0) {
        srv_registry_free(&reg);
        srv_metrics_free(&metrics);
        free(metrics_path);
        srv_options_free(&o);
        return 1;
    }
    srv_registry_start(reg, o.file_system_poll_wait_seconds);

    static srv_admin_ctx actx; /* large (the rollback history): not on the stack */
    actx.reg = reg;
    actx.model_root = o.model_root;
    pthread_mutex_init(&actx.mu, NULL);
    if (o.state_dir) { /* asked to keep admin changes: no state, no start */
        if (adm_state_open(o.state_dir, &actx.state, &err) != SRV_OK || srv_admin_restore(&actx, &err) != SRV_OK) {
            srv_log(SRV_LOG_ERROR, "state", NULL, 0, "--state_dir %s: %s", o.state_dir, err.msg);
            adm_state_free(&actx.state);
            srv_registry_free(&reg);
            srv_metrics_free(&metrics);
            free(metrics_path);
            srv_options_free(&o);
            return 1;
        }
    }

    srv_infer *inf = srv_infer_new(reg, metrics); /* the request path both front doors share */
    if (!inf) {
        srv_log(SRV_LOG_ERROR, "start", NULL, 0, "out of memory");
        srv_registry_free(&reg);
        srv_metrics_free(&metrics);
        free(metrics_path);
        srv_options_free(&o);
        return 1;
    }
    eng_set_max_loop_iterations(o.max_loop_iterations);
    srv_rest *rest = NULL;
    srv_grpc *grpc = NULL;
    if (o.rest_port > 0) {
        srv_rest_opts rop = {.host = o.rest_host,
                             .port = o.rest_port,
                             .nthreads = o.rest_api_num_threads,
                             .max_body_bytes = (size_t)o.max_body_bytes,
                             .connection_limit = o.connection_limit,
                             .connection_timeout_s = o.connection_timeout_s,
                             .request_timeout_ms = o.rest_api_timeout_in_ms,
                             .metrics_enabled = metrics_on,
                             .metrics_path = metrics_path ? metrics_path : "/monitoring/prometheus/metrics",
                             .header_timeout_s = o.header_timeout_s,
                             .per_ip_connection_limit = o.per_ip_connection_limit,
                             .explicit_control = ro.explicit_control,
                             .admin_token = o.admin_token};
        rest = srv_rest_start(&rop, reg, metrics, inf, &err);
        if (!rest) {
            srv_log(SRV_LOG_ERROR, "listen", NULL, 0, "REST server on %s:%d: %s", o.rest_host ? o.rest_host : "0.0.0.0",
                    o.rest_port, err.msg);
            srv_infer_free(&inf);
            srv_registry_free(&reg);
            srv_metrics_free(&metrics);
            free(metrics_path);
            srv_options_free(&o);
            return 1;
        }
        const char *host = o.rest_host ? o.rest_host : "0.0.0.0";
        srv_log(SRV_LOG_INFO, "listen", NULL, 0, "REST API on %s:%d%s", host, o.rest_port,
                strcmp(host, "0.0.0.0") == 0 || strcmp(host, "::") == 0
                    ? " (all interfaces; --rest_api_host=127.0.0.1 keeps it on this machine)"
                    : "");
    }
    if (o.grpc_port > 0) {
        const char *ghost = o.grpc_host ? o.grpc_host : o.rest_host ? o.rest_host : "0.0.0.0";
        srv_grpc_opts gop = {.host = ghost,
                             .port = o.grpc_port,
                             .max_receive_bytes = (size_t)o.grpc_max_receive_bytes,
                             .nthreads = o.grpc_threads,
                             .ssl_config_file = o.ssl_config_file,
                             .explicit_control = ro.explicit_control,
                             .admin_token = o.admin_token};
        grpc = srv_grpc_start(&gop, reg, metrics, inf, &err);
        if (!grpc) {
            srv_log(SRV_LOG_ERROR, "listen", NULL, 0, "gRPC server: %s", err.msg);
            if (rest) srv_rest_quiesce(rest);
            srv_infer_free(&inf);
            srv_rest_stop(&rest);
            srv_registry_free(&reg);
            srv_metrics_free(&metrics);
            free(metrics_path);
            srv_options_free(&o);
            return 1;
        }
        srv_log(SRV_LOG_INFO, "listen", NULL, 0, "gRPC API on %s:%d%s%s", ghost, o.grpc_port,
                o.ssl_config_file ? " (TLS)" : "",
                strcmp(ghost, "0.0.0.0") == 0 || strcmp(ghost, "::") == 0
                    ? " (all interfaces; --grpc_api_host=127.0.0.1 keeps it on this machine)"
                    : "");
    }

    if (srv_admin_monitor_start(&actx, srv_infer_canary(inf), metrics) != 0)
        srv_log(SRV_LOG_ERROR, "start", NULL, 0, "the automatic-rollback monitor did not start");
    adm_server *admin = NULL;
    adm_datasets *datasets = NULL;
    adm_jobs *jobs = NULL;
    if (o.admin_port > 0 && o.admin_token && actx.state) { /* datasets and training jobs live under --state_dir */
        adm_datasets_opts dopt = {.state_dir = o.state_dir, .state = actx.state, .max_upload_bytes = o.max_upload_bytes,
                                  .quota_bytes = o.dataset_quota_bytes};
        char exe[4096];
        ssize_t en = readlink("/proc/self/exe", exe, sizeof exe - 1);
        exe[en > 0 ? en : 0] = '\0';
        if (!(datasets = adm_datasets_new(&dopt, &err))) {
            srv_log(SRV_LOG_ERROR, "start", NULL, 0, "datasets are off: %s", err.msg);
        } else {
            adm_jobs_opts jopt = {.state = actx.state, .datasets = datasets, .ops = srv_admin_ops(&actx),
                                  .state_dir = o.state_dir, .worker_exe = exe, .max_concurrent = o.max_concurrent_jobs};
            if (!(jobs = adm_jobs_new(&jopt, &err))) srv_log(SRV_LOG_ERROR, "start", NULL, 0, "training jobs are off: %s", err.msg);
        }
    }
    if (o.admin_port > 0 && !o.admin_token) {
        srv_log(SRV_LOG_INFO, "listen", NULL, 0, "admin API off: no admin token (--admin_token_file or TENSORD_ADMIN_TOKEN)");
    } else if (o.admin_port > 0) {
        adm_ops ops = srv_admin_ops(&actx);
        adm_opts aop = {.bind = o.admin_bind, .port = o.admin_port, .token = o.admin_token, .datasets = datasets,
                        .jobs = jobs};
        admin = adm_start(&aop, &ops, &err);
        if (!admin) srv_log(SRV_LOG_ERROR, "listen", NULL, 0, "admin API not opened: %s", err.msg);
        else srv_log(SRV_LOG_INFO, "listen", NULL, 0, "admin API on %s:%d", o.admin_bind ? o.admin_bind : "127.0.0.1",
                     o.admin_port);
    }

    double cfg_poll = o.model_config_file ? o.model_config_file_poll_wait_seconds : 0;
    int sig = 0;
    for (;;) {
        if (cfg_poll > 0) {
            struct timespec ts = {(time_t)cfg_poll, (long)((cfg_poll - (double)(time_t)cfg_poll) * 1e9)};
            sig = sigtimedwait(&sigs, NULL, &ts);
            if (sig < 0) {
                if (errno == EAGAIN) serve_apply_config(&o, reg);
                continue;
            }
        } else if (sigwait(&sigs, &sig) != 0) {
            continue;
        }
        if (sig == SIGHUP) {
            srv_log(SRV_LOG_INFO, "reload", NULL, 0, "SIGHUP: re-reading the model config");
            serve_apply_config(&o, reg);
            continue;
        }
        break;
    }
    adm_stop(&admin); /* no admin changes while draining */
    adm_jobs_free(&jobs); /* running jobs stay RUNNING in the state: the next start resumes them */
    adm_datasets_free(&datasets);
    srv_admin_monitor_stop(&actx);
    srv_rest_quiesce(rest);
    srv_grpc_quiesce(grpc);
    srv_log(SRV_LOG_INFO, "drain", NULL, 0, "signal %d: draining in-flight requests (up to %g s)", sig, o.drain_seconds);
    int64_t deadline = srv_now_us() + (int64_t)(o.drain_seconds * 1e6);
    /* idle twice, 20 ms apart: a gRPC call the core matched just before the shutdown is counted once its
     * queue thread takes it */
    for (int idle = 0; idle < 2 && srv_now_us() < deadline;) {
        idle = srv_rest_inflight(rest) + srv_grpc_inflight(grpc) > 0 ? 0 : idle + 1;
        usleep(idle ? 20000 : 5000);
    }
    int left = srv_rest_inflight(rest) + srv_grpc_inflight(grpc);
    if (left > 0) {
        /* The deadline holds: whatever still runs is answered 503 / UNAVAILABLE now, and the process ends within a
         * second, without waiting for the work itself (which may hold the registry's versions: no clean-up then). */
        char why[160];
        snprintf(why, sizeof why, "the server is shutting down: the request was still running at the "
                 "--drain_seconds=%g deadline", o.drain_seconds);
        int cut = srv_infer_cut_off(inf, why);
        int64_t flush = srv_now_us() + 800000; /* the answers go out; the exit stays within a second */
        while ((srv_rest_cut_unsent(rest) > 0 || srv_rest_inflight(rest) + srv_grpc_inflight(grpc) > 0) &&
               srv_now_us() < flush)
            usleep(2000);
        int unsent = srv_rest_cut_unsent(rest), still = srv_rest_inflight(rest) + srv_grpc_inflight(grpc);
        srv_log(SRV_LOG_ERROR, "drain", NULL, 0,
                "%d requests still running at the drain deadline: %d answered UNAVAILABLE (%d of those not "
                "delivered), %d closed without a reply; exiting with status 3", left, cut, unsent,
                still > unsent ? still - unsent : 0);
        fflush(stderr);
        _exit(3);
    }
    srv_infer_free(&inf); /* workers finish what they hold before the front doors stop */
    srv_rest_stop(&rest);
    srv_grpc_stop(&grpc);
    adm_state_free(&actx.state);
    srv_registry_free(&reg);
    srv_metrics_free(&metrics);
    free(metrics_path);
    srv_options_free(&o);
    srv_log(SRV_LOG_INFO, "stop", NULL, 0, "stopped");
    return 0;
}
