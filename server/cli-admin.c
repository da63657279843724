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
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
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
                    "  promote MODEL | rollback MODEL\n");
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

/* One request; prints the body. Returns the exit code. */
static int adm_call(const char *url, const char *token, const char *method, const char *path, const char *body) {
    char host[256], port[16];
    if (parse_url(url, host, sizeof host, port, sizeof port) != 0) {
        fprintf(stderr, "error: --admin_url '%s' must look like http://127.0.0.1:8502\n", url);
        return 2;
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
    size_t blen = body ? strlen(body) : 0;
    srv_buf_printf(&rq, "%s %s HTTP/1.1\r\nHost: %s:%s\r\nAuthorization: Bearer %s\r\nConnection: close\r\n"
                        "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                   method, path, host, port, token, blen);
    if (body) srv_buf_puts(&rq, body);
    size_t off = 0;
    while (off < rq.len) {
        ssize_t w = write(fd, rq.p + off, rq.len - off);
        if (w <= 0) break;
        off += (size_t)w;
    }
    free(rq.p);
    srv_buf rs = {0};
    char chunk[8192];
    ssize_t r;
    while ((r = read(fd, chunk, sizeof chunk)) > 0 && rs.len < (64u << 20)) srv_buf_put(&rs, chunk, (size_t)r);
    close(fd);
    int status = 0;
    if (!rs.p || sscanf(rs.p, "HTTP/1.%*d %d", &status) != 1) {
        fprintf(stderr, "error: no HTTP reply from %s:%s\n", host, port);
        free(rs.p);
        return 1;
    }
    const char *sep = strstr(rs.p, "\r\n\r\n");
    const char *out = sep ? sep + 4 : "";
    int ok = status >= 200 && status < 300;
    fprintf(ok ? stdout : stderr, "%s%s\n", ok ? "" : "error: ", out);
    free(rs.p);
    return ok ? 0 : 1;
}

static int is_name(const char *s, const char *what) {
    if (srv_name_valid(s)) return 1;
    fprintf(stderr, "error: %s '%s' must match [A-Za-z0-9_.-]\n", what, s);
    return 0;
}

int srv_cmd_admin(int argc, char **argv) {
    const char *url = "http://127.0.0.1:8502", *token_file = NULL, *policy = NULL, *routes = NULL, *sticky = NULL,
               *shadow = NULL;
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
        else if (argv[i][0] == '-' || npos == 8) return adm_usage();
        else pos[npos++] = argv[i];
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
    } else {
        code = adm_usage();
    }
out:
    free(body.p);
    free(token);
    return code;
}
