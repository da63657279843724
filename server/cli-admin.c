/* cli-admin.c - `tensord admin ...`: the admin API from the command line, for scripts and humans. It is a plain
 * HTTP/1.1 client of the admin port (loopback by default), reading the token from --admin_token_file or the env
 * TENSORD_ADMIN_TOKEN, printing the JSON reply on stdout; exit 0 on 2xx, 1 on an error reply (the error on stderr),
 * 2 on a usage error.
 *
 *   tensord admin [--admin_url http://127.0.0.1:8502] [--admin_token_file F] COMMAND
 *     models                                     list models, versions, labels, traffic
 *     add NAME BASE_PATH [--policy latest|all|specific=1,2]
 *     remove NAME
 *     label MODEL LABEL VERSION
 *     traffic MODEL [--routes stable=90,canary=10] [--sticky HEADER] [--shadow LABEL]   (no --routes: show it)
 *     promote MODEL | rollback MODEL
 *     datasets | dataset ID | delete-dataset ID
 *     upload NAME FILE --format npz|npy|csv|jsonl|tfrecord      (the file as the streamed body)
 *     upload NAME --images F --labels F                          (an IDX pair, as multipart parts)
 *     train MODEL DATASET [--val DATASET | --val-split X] [--epochs E] [--batch-size B] [--optimizer O] [--lr X]
 *           [--loss L] [--base-version V] [--canary PERCENT | --promote] [--min-val-accuracy X]   (or: train --spec FILE)
 *     jobs | job ID | cancel ID | follow ID                      (follow: the job's events until it ends)
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cli.h"
#include "json.h"
#include "srv.h"

static int adm_usage(void) {
    fprintf(stderr, "usage: tensord admin [--admin_url http://127.0.0.1:8502] [--admin_token_file F] COMMAND\n"
                    "  models | add NAME BASE_PATH [--policy latest|all|specific=1,2] | remove NAME\n"
                    "  label MODEL LABEL VERSION | traffic MODEL [--routes a=90,b=10] [--sticky H] [--shadow L]\n"
                    "  promote MODEL | rollback MODEL\n"
                    "  datasets | dataset ID | delete-dataset ID\n"
                    "  upload NAME FILE --format npz|npy|csv|jsonl|tfrecord | upload NAME --images F --labels F\n"
                    "  train MODEL DATASET [--val DATASET | --val-split X] [--epochs E] [--batch-size B]\n"
                    "        [--optimizer sgd|adam|adamw] [--lr X] [--loss L] [--base-version V]\n"
                    "        [--canary PERCENT | --promote] [--min-val-accuracy X]  |  train --spec FILE.json\n"
                    "  jobs | job ID | cancel ID | follow ID\n");
    return 2;
}

static char *read_token(const char *file) {
    char buf[4096] = {0};
    if (file) {
        FILE *f = fopen(file, "r");
        if (!f) {
            fprintf(stderr, "error: cannot read --admin_token_file '%s': %s\n", file, strerror(errno));
            return NULL;
        }
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = '\0';
    } else if (getenv("TENSORD_ADMIN_TOKEN")) {
        snprintf(buf, sizeof buf, "%s", getenv("TENSORD_ADMIN_TOKEN"));
    } else {
        fprintf(stderr, "error: no admin token: give --admin_token_file or set TENSORD_ADMIN_TOKEN\n");
        return NULL;
    }
    size_t n = strlen(buf);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) buf[--n] = '\0';
    return strdup(buf);
}

/* "http://host:port" -> host, port. */
static int parse_url(const char *url, char *host, size_t cap, char *port, size_t pcap) {
    if (strncmp(url, "http://", 7) != 0) return -1;
    const char *h = url + 7, *e = strchr(h, '/');
    size_t n = e ? (size_t)(e - h) : strlen(h);
    char hp[256];
    if (n == 0 || n >= sizeof hp) return -1;
    memcpy(hp, h, n);
    hp[n] = '\0';
    char *colon = hp[0] == '[' ? strstr(hp, "]:") : strrchr(hp, ':');
    if (colon && hp[0] == '[') colon++;
    if (colon) *colon = '\0';
    snprintf(host, cap, "%s", hp[0] == '[' ? hp + 1 : hp);
    if (hp[0] == '[') host[strcspn(host, "]")] = '\0';
    snprintf(port, pcap, "%s", colon ? colon + 1 : "8502");
    return 0;
}

/* A request body: JSON text, or files streamed one after another (raw, or as multipart/form-data parts). */
typedef struct adm_body {
    const char *json;                 /* NULL: files */
    const char *files[2], *parts[2];  /* parts NULL: the one file is the raw body */
    int nfiles;
} adm_body;

#define ADM_BOUNDARY "tensord-admin-7f3a9c1e5b"

static long long file_size(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    long long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    fclose(f);
    return n;
}

static int write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int send_file(int fd, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    char buf[65536];
    size_t r;
    int rc = 0;
    while (rc == 0 && (r = fread(buf, 1, sizeof buf, f)) > 0) rc = write_all(fd, buf, r);
    fclose(f);
    return rc;
}

/* One request; prints the reply body (stream: as it arrives, line by line, until the server closes). Returns the
 * exit code. */
static int adm_call_body(const char *url, const char *token, const char *method, const char *path, const adm_body *b,
                         int stream) {
    char host[256], port[16];
    if (parse_url(url, host, sizeof host, port, sizeof port) != 0) {
        fprintf(stderr, "error: --admin_url '%s' must look like http://127.0.0.1:8502\n", url);
        return 2;
    }
    long long blen = 0, sizes[2] = {0, 0};
    char heads[2][512];
    const char *ctype = "application/json";
    if (b && b->json) {
        blen = (long long)strlen(b->json);
    } else if (b) {
        for (int i = 0; i < b->nfiles; i++) {
            if ((sizes[i] = file_size(b->files[i])) < 0) {
                fprintf(stderr, "error: cannot read '%s': %s\n", b->files[i], strerror(errno));
                return 1;
            }
            if (b->parts[i])
                snprintf(heads[i], sizeof heads[i], "--" ADM_BOUNDARY "\r\nContent-Disposition: form-data; name=\"%s\"; "
                         "filename=\"%s\"\r\nContent-Type: application/octet-stream\r\n\r\n", b->parts[i], b->parts[i]);
            blen += sizes[i] + (b->parts[i] ? (long long)strlen(heads[i]) + 2 : 0);
        }
        if (b->parts[0]) {
            blen += (long long)strlen("--" ADM_BOUNDARY "--\r\n");
            ctype = "multipart/form-data; boundary=" ADM_BOUNDARY;
        } else {
            ctype = "application/octet-stream";
        }
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    int rc = getaddrinfo(host, port, &hints, &ai);
    if (rc != 0) {
        fprintf(stderr, "error: %s:%s: %s\n", host, port, gai_strerror(rc));
        return 1;
    }
    int fd = -1;
    for (struct addrinfo *p = ai; p && fd < 0; p = p->ai_next) {
        fd = socket(p->ai_family, SOCK_STREAM, 0);
        if (fd >= 0 && connect(fd, p->ai_addr, p->ai_addrlen) != 0) close(fd), fd = -1;
    }
    freeaddrinfo(ai);
    if (fd < 0) {
        fprintf(stderr, "error: cannot reach the admin API at %s:%s: %s\n", host, port, strerror(errno));
        return 1;
    }
    srv_buf rq = {0};
    srv_buf_printf(&rq, "%s %s HTTP/1.1\r\nHost: %s:%s\r\nAuthorization: Bearer %s\r\nConnection: close\r\n"
                        "Content-Type: %s\r\nContent-Length: %lld\r\n\r\n",
                   method, path, host, port, token, ctype, blen);
    if (b && b->json) srv_buf_puts(&rq, b->json);
    int wrc = write_all(fd, rq.p, rq.len);
    free(rq.p);
    for (int i = 0; wrc == 0 && b && !b->json && i < b->nfiles; i++) {
        if (b->parts[i]) wrc = write_all(fd, heads[i], strlen(heads[i]));
        if (wrc == 0) wrc = send_file(fd, b->files[i]);
        if (wrc == 0 && b->parts[i]) wrc = write_all(fd, "\r\n", 2);
    }
    if (wrc == 0 && b && !b->json && b->parts[0]) wrc = write_all(fd, "--" ADM_BOUNDARY "--\r\n", strlen("--" ADM_BOUNDARY "--\r\n"));
    srv_buf rs = {0};
    char chunk[8192];
    ssize_t r;
    int status = 0;
    size_t shown = 0;
    while ((r = read(fd, chunk, sizeof chunk)) > 0 && rs.len < (64u << 20)) {
        srv_buf_put(&rs, chunk, (size_t)r);
        const char *sep = stream && rs.p ? strstr(rs.p, "\r\n\r\n") : NULL;
        if (sep && !status) sscanf(rs.p, "HTTP/1.%*d %d", &status);
        if (sep && status >= 200 && status < 300) { /* print the stream's complete lines as they come */
            size_t start = (size_t)(sep + 4 - rs.p);
            if (shown < start) shown = start;
            char *nl;
            while ((nl = memchr(rs.p + shown, '\n', rs.len - shown)) != NULL) {
                fwrite(rs.p + shown, 1, (size_t)(nl - (rs.p + shown)) + 1, stdout);
                shown = (size_t)(nl - rs.p) + 1;
            }
            fflush(stdout);
        }
    }
    close(fd);
    if (!rs.p || sscanf(rs.p, "HTTP/1.%*d %d", &status) != 1) {
        if (wrc != 0) /* it answered before the body was in, and the answer was lost with the connection */
            fprintf(stderr, "error: %s:%s refused the request before its body was sent (%s); check the name, the "
                    "format and the size\n", host, port, strerror(errno));
        else
            fprintf(stderr, "error: no HTTP reply from %s:%s\n", host, port);
        free(rs.p);
        return 1;
    }
    const char *sep = strstr(rs.p, "\r\n\r\n");
    const char *out = sep ? sep + 4 : "";
    int ok = status >= 200 && status < 300;
    if (!(stream && ok)) fprintf(ok ? stdout : stderr, "%s%s\n", ok ? "" : "error: ", out);
    free(rs.p);
    return ok ? 0 : 1;
}

static int adm_call(const char *url, const char *token, const char *method, const char *path, const char *body) {
    adm_body b = {.json = body};
    return adm_call_body(url, token, method, path, body ? &b : NULL, 0);
}

static int is_name(const char *s, const char *what) {
    if (srv_name_valid(s)) return 1;
    fprintf(stderr, "error: %s '%s' must match [A-Za-z0-9_.-]\n", what, s);
    return 0;
}

int srv_cmd_admin(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN); /* a server that refuses an upload early closes while the body is sent */
    const char *url = "http://127.0.0.1:8502", *token_file = NULL, *policy = NULL, *routes = NULL, *sticky = NULL,
               *shadow = NULL;
    const char *format = NULL, *images = NULL, *labels = NULL, *spec = NULL;
    const char *tr[10] = {0}; /* train: val, val_split, epochs, batch_size, optimizer, lr, loss, base_version, canary,
                               * min_val_accuracy */
    static const char *const trf[10] = {"--val", "--val-split", "--epochs", "--batch-size", "--optimizer", "--lr",
                                        "--loss", "--base-version", "--canary", "--min-val-accuracy"};
    int promote = 0;
    const char *pos[8];
    int npos = 0;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if ((v = srv_flag(argc, argv, &i, "--admin_url"))) url = v;
        else if ((v = srv_flag(argc, argv, &i, "--admin_token_file"))) token_file = v;
        else if ((v = srv_flag(argc, argv, &i, "--policy"))) policy = v;
        else if ((v = srv_flag(argc, argv, &i, "--routes"))) routes = v;
        else if ((v = srv_flag(argc, argv, &i, "--sticky"))) sticky = v;
        else if ((v = srv_flag(argc, argv, &i, "--shadow"))) shadow = v;
        else if ((v = srv_flag(argc, argv, &i, "--format"))) format = v;
        else if ((v = srv_flag(argc, argv, &i, "--images"))) images = v;
        else if ((v = srv_flag(argc, argv, &i, "--labels"))) labels = v;
        else if ((v = srv_flag(argc, argv, &i, "--spec"))) spec = v;
        else if (!strcmp(argv[i], "--promote")) promote = 1;
        else {
            int k = 0;
            while (k < 10 && !(v = srv_flag(argc, argv, &i, trf[k]))) k++;
            if (k < 10) {
                tr[k] = v;
                continue;
            }
            if (argv[i][0] == '-' || npos == 8) return adm_usage();
            pos[npos++] = argv[i];
        }
    }
    if (npos < 1) return adm_usage();
    const char *cmd = pos[0];
    char *token = read_token(token_file);
    if (!token) return 2;
    char path[600];
    srv_buf body = {0};
    int code = 2;
    if (!strcmp(cmd, "models") && npos == 1) {
        code = adm_call(url, token, "GET", "/v1/admin/models", NULL);
    } else if (!strcmp(cmd, "add") && npos == 3 && is_name(pos[1], "model")) {
        srv_buf_puts(&body, "{\"name\":");
        srv_buf_json_str(&body, pos[1]);
        srv_buf_puts(&body, ",\"base_path\":");
        srv_buf_json_str(&body, pos[2]);
        if (policy && !strcmp(policy, "all")) srv_buf_puts(&body, ",\"version_policy\":{\"all\":{}}");
        else if (policy && !strncmp(policy, "specific=", 9)) srv_buf_printf(&body, ",\"version_policy\":{\"specific\":{\"versions\":[%s]}}", policy + 9);
        else if (policy && strcmp(policy, "latest")) {
            fprintf(stderr, "error: --policy must be latest, all or specific=1,2\n");
            goto out;
        }
        srv_buf_puts(&body, "}");
        code = adm_call(url, token, "POST", "/v1/admin/models", body.p);
    } else if (!strcmp(cmd, "remove") && npos == 2 && is_name(pos[1], "model")) {
        snprintf(path, sizeof path, "/v1/admin/models/%s", pos[1]);
        code = adm_call(url, token, "DELETE", path, NULL);
    } else if (!strcmp(cmd, "label") && npos == 4 && is_name(pos[1], "model") && is_name(pos[2], "label")) {
        char *end = NULL;
        long long v = strtoll(pos[3], &end, 10);
        if (*end || v < 1) {
            fprintf(stderr, "error: VERSION '%s' must be a positive integer\n", pos[3]);
            goto out;
        }
        snprintf(path, sizeof path, "/v1/admin/models/%s/labels/%s", pos[1], pos[2]);
        srv_buf_printf(&body, "{\"version\":%lld}", v);
        code = adm_call(url, token, "PUT", path, body.p);
    } else if (!strcmp(cmd, "traffic") && npos == 2 && is_name(pos[1], "model")) {
        snprintf(path, sizeof path, "/v1/admin/models/%s/traffic", pos[1]);
        if (!routes) {
            code = adm_call(url, token, "GET", path, NULL);
            goto out;
        }
        srv_buf_puts(&body, "{\"routes\":{");
        char *rs = strdup(routes), *save = NULL;
        int k = 0;
        for (char *t = strtok_r(rs, ",", &save); t; t = strtok_r(NULL, ",", &save), k++) {
            char *eq = strchr(t, '=');
            char *end = NULL;
            long w = eq ? strtol(eq + 1, &end, 10) : -1;
            if (!eq || *end || w < 0 || (*eq = '\0', !is_name(t, "route label"))) {
                fprintf(stderr, "error: --routes takes label=weight,label=weight (got '%s')\n", routes);
                free(rs);
                goto out;
            }
            srv_buf_puts(&body, k ? "," : "");
            srv_buf_json_str(&body, t);
            srv_buf_printf(&body, ":%ld", w);
        }
        free(rs);
        srv_buf_puts(&body, "}");
        if (sticky) srv_buf_puts(&body, ",\"sticky_header\":"), srv_buf_json_str(&body, sticky);
        if (shadow) srv_buf_puts(&body, ",\"shadow\":"), srv_buf_json_str(&body, shadow);
        srv_buf_puts(&body, "}");
        code = adm_call(url, token, "PUT", path, body.p);
    } else if ((!strcmp(cmd, "promote") || !strcmp(cmd, "rollback")) && npos == 2 && is_name(pos[1], "model")) {
        snprintf(path, sizeof path, "/v1/admin/models/%s:%s", pos[1], cmd);
        code = adm_call(url, token, "POST", path, NULL);
    } else if (!strcmp(cmd, "datasets") && npos == 1) {
        code = adm_call(url, token, "GET", "/v1/admin/datasets", NULL);
    } else if ((!strcmp(cmd, "dataset") || !strcmp(cmd, "delete-dataset")) && npos == 2 && is_name(pos[1], "dataset")) {
        snprintf(path, sizeof path, "/v1/admin/datasets/%s", pos[1]);
        code = adm_call(url, token, cmd[0] == 'd' && cmd[1] == 'e' ? "DELETE" : "GET", path, NULL);
    } else if (!strcmp(cmd, "upload") && npos >= 2 && is_name(pos[1], "dataset")) {
        adm_body b = {0};
        if (npos == 3 && format && !images && !labels) {
            b.files[0] = pos[2];
            b.nfiles = 1;
        } else if (npos == 2 && images && labels) {
            format = "idx";
            b = (adm_body){.files = {images, labels}, .parts = {"images", "labels"}, .nfiles = 2};
        } else {
            fprintf(stderr, "error: upload NAME FILE --format F, or upload NAME --images F --labels F\n");
            goto out;
        }
        if (!is_name(format, "format")) goto out;
        snprintf(path, sizeof path, "/v1/admin/datasets?name=%s&format=%s", pos[1], format);
        code = adm_call_body(url, token, "POST", path, &b, 0);
    } else if (!strcmp(cmd, "train") && ((npos == 1 && spec) || (npos == 3 && !spec))) {
        if (spec) {
            adm_body b = {.files = {spec}, .nfiles = 1};
            code = adm_call_body(url, token, "POST", "/v1/admin/jobs", &b, 0);
            goto out;
        }
        if (!is_name(pos[1], "model") || !is_name(pos[2], "dataset")) goto out;
        srv_buf_puts(&body, "{\"model\":");
        srv_buf_json_str(&body, pos[1]);
        srv_buf_puts(&body, ",\"dataset\":");
        srv_buf_json_str(&body, pos[2]);
        static const char *const keys[10] = {"val_dataset", "val_split", "epochs", "batch_size", "optimizer",
                                             "learning_rate", "loss", "base_version", NULL, NULL};
        static const int is_str[10] = {1, 0, 0, 0, 1, 0, 1, 2, 0, 0};
        const char *defs[10] = {NULL, NULL, "1", "32", "adam", "0.001", "sparse_categorical_crossentropy", NULL};
        for (int k = 0; k < 8; k++) {
            const char *v = tr[k] ? tr[k] : defs[k];
            if (!v) continue;
            char *end = NULL;
            strtod(v, &end);
            int numeric = *v && !*end;
            srv_buf_printf(&body, ",\"%s\":", keys[k]);
            if (is_str[k] == 1 || (is_str[k] == 2 && !numeric)) srv_buf_json_str(&body, v);
            else if (numeric) srv_buf_puts(&body, v);
            else {
                fprintf(stderr, "error: %s '%s' must be a number\n", trf[k], v);
                goto out;
            }
        }
        if (tr[8] || promote || tr[9]) {
            srv_buf_printf(&body, ",\"on_complete\":{\"action\":\"%s\"", promote ? "promote" : tr[8] ? "canary" : "none");
            char *end = NULL;
            if (tr[8] && (strtol(tr[8], &end, 10) < 1 || *end)) {
                fprintf(stderr, "error: --canary takes a percentage 1..99\n");
                goto out;
            }
            if (tr[8]) srv_buf_printf(&body, ",\"traffic_percent\":%s", tr[8]);
            if (tr[9] && (strtod(tr[9], &end), *end || !*tr[9])) {
                fprintf(stderr, "error: --min-val-accuracy takes a number\n");
                goto out;
            }
            if (tr[9]) srv_buf_printf(&body, ",\"min_val_accuracy\":%s", tr[9]);
            srv_buf_puts(&body, "}");
        }
        srv_buf_puts(&body, "}");
        code = adm_call(url, token, "POST", "/v1/admin/jobs", body.p);
    } else if (!strcmp(cmd, "jobs") && npos == 1) {
        code = adm_call(url, token, "GET", "/v1/admin/jobs", NULL);
    } else if ((!strcmp(cmd, "job") || !strcmp(cmd, "cancel") || !strcmp(cmd, "follow")) && npos == 2) {
        char *end = NULL;
        long long id = strtoll(pos[1], &end, 10);
        if (*end || id < 1) {
            fprintf(stderr, "error: a job id is a positive integer, got '%s'\n", pos[1]);
            goto out;
        }
        if (!strcmp(cmd, "job")) snprintf(path, sizeof path, "/v1/admin/jobs/%lld", id);
        else if (!strcmp(cmd, "cancel")) snprintf(path, sizeof path, "/v1/admin/jobs/%lld:cancel", id);
        else snprintf(path, sizeof path, "/v1/admin/jobs/%lld/events", id);
        adm_body none = {0};
        code = cmd[0] == 'f' ? adm_call_body(url, token, "GET", path, &none, 1)
                             : adm_call(url, token, !strcmp(cmd, "cancel") ? "POST" : "GET", path, NULL);
    } else {
        code = adm_usage();
    }
out:
    free(body.p);
    free(token);
    return code;
}
