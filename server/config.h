/* config.h - tensord serve's command line (TF Serving's flag names) and its config files:
 * --model_config_file (TF Serving's model_config_list in protobuf text format, or the same structure as
 * JSON; tensord adds `instance_count` to a model's config, Triton's instance_group count, and `device`, one device
 * or a comma-separated list as --device takes it, or a repeated field / JSON array of devices), --batching_parameters_file and --monitoring_config_file (text format). Env MODEL_NAME and
 * MODEL_BASE_PATH work as in TF Serving's Docker image (used when no model flags are given).
 */
#ifndef SRV_CONFIG_H
#define SRV_CONFIG_H

#include "batcher.h"
#include "registry.h"

typedef struct srv_options {
    int grpc_port;                     /* --port, 8500 */
    int rest_port;                     /* --rest_api_port, 8501 (0 disables REST) */
    char *rest_host;                   /* --rest_api_host (tensord extension), default 0.0.0.0 */
    char *model_name;                  /* --model_name, default "default" */
    char *model_base_path;             /* --model_base_path */
    char *model_config_file;           /* --model_config_file */
    double model_config_file_poll_wait_seconds; /* 0: read once */
    double file_system_poll_wait_seconds;       /* default 1 */
    int enable_batching;
    char *batching_parameters_file;
    char *monitoring_config_file;
    int64_t rest_api_timeout_in_ms;    /* default 30000 (TF Serving's default) */
    int64_t max_loop_iterations;       /* one ONNX Loop's iterations per run at most; default 1,000,000 */
    int allow_version_labels_for_unavailable_models;
    int rest_api_num_threads;          /* HTTP polling threads; 0 (default): 4 per core */
    int session_threads;               /* --tensorflow_intra_op_parallelism (threads per run), 0 all */
    int instances_per_version;         /* --instances_per_version (1..64): execution instances of a version; -1 (not
                                        * given): max(1, usable cores / session_threads) */
    int64_t max_body_bytes;            /* --rest_api_max_body_bytes, 64 MiB */
    int connection_limit;              /* --rest_api_connection_limit, 2048 */
    int connection_timeout_s;          /* --rest_api_connection_timeout_seconds, 30 */
    double drain_seconds;              /* --drain_seconds: SIGTERM grace for in-flight requests, 30 */
    int header_timeout_s;              /* --rest_api_header_timeout_seconds: whole request (headers + body), 10 */
    int per_ip_connection_limit;       /* --rest_api_per_ip_connection_limit, 256 */
    double model_load_timeout_s;       /* --model_load_timeout_seconds: one version's load, 600 */
    char *log_format;                  /* --log_format: "text" (default) or "json" */
    char *model_control_mode;          /* --model_control_mode (Triton's): "poll" (default) or "explicit" */
    char *admin_token_file;            /* --admin_token_file (else env TENSORD_ADMIN_TOKEN): bearer token */
    char *admin_token;                 /* read from admin_token_file or the env; NULL: none configured */
    char *grpc_host;                   /* --grpc_api_host (tensord extension): default --rest_api_host's value */
    int64_t grpc_max_receive_bytes;    /* --grpc_max_receive_message_bytes, 64 MiB */
    int grpc_threads;                  /* --grpc_max_threads: completion-queue threads, 0: half the cores */
    char *ssl_config_file;             /* --ssl_config_file: TF Serving's SSLConfig (TLS for gRPC) */
    int admin_port;                    /* --admin_port, 8502 (0: off; also off without an admin token) */
    char *admin_bind;                  /* --admin_bind, default 127.0.0.1 */
    char *model_root;                  /* --model_root: admin-added base paths must resolve inside it */
    char *state_dir;                   /* --state_dir: admin changes kept in its SQLite file (NULL: not kept) */
    int64_t max_upload_bytes;          /* --max_upload_bytes: one dataset upload, 1 GiB */
    int64_t dataset_quota_bytes;       /* --dataset_quota_bytes: all datasets together, 10 GiB */
    int max_concurrent_jobs;           /* --max_concurrent_jobs: training jobs running at once on the CPU, 1 */
    char *device;                      /* --device (else env TENSORD_DEVICE, else "auto"): where versions run, one device
                                        * or a comma-separated list (server/device.h); a model's `device` overrides it */
} srv_options;

/* Parse `tensord serve` flags (argv[0] is "serve"). Accepts --flag=value and --flag value, booleans as
 * --flag, --flag=true/false. Unknown flags are an error naming the flag. */
srv_code srv_options_parse(int argc, char **argv, srv_options *o, srv_error *err);
void srv_options_free(srv_options *o);

/* The models to serve: from --model_config_file, else --model_name/--model_base_path (or the env vars). */
srv_code srv_config_models(const srv_options *o, srv_model_config **cfgs, int *n, srv_error *err);
/* Parse a model_config_list file (text format or JSON). */
srv_code srv_config_load_models(const char *path, srv_model_config **cfgs, int *n, srv_error *err);
/* The same from text-format text (gRPC's HandleReloadConfigRequest writes its ModelServerConfig as text, so
 * both go through one set of checks); what names the source in errors. */
srv_code srv_config_parse_models(const char *text, size_t len, const char *what, srv_model_config **cfgs, int *n,
                                 srv_error *err);
srv_code srv_config_load_batching(const char *path, srv_batch_opts *o, srv_error *err);
/* s as a text-format string literal (quotes, backslashes, newlines escaped), appended to b. */
struct srv_buf;
void srv_config_quote(struct srv_buf *b, const char *s);
/* prometheus_config { enable: true path: "/monitoring/prometheus/metrics" } */
srv_code srv_config_load_monitoring(const char *path, int *enable, char **metrics_path, srv_error *err);

#endif
