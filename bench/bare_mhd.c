/* bare_mhd.c - the floor for tensord's REST overhead: a bare libmicrohttpd server in the same threading mode
 * as server/rest.c (internal polling thread + ITC + epoll + a pool of N threads, 128 KiB per-connection memory,
 * connection limit 2048, HTTP/1.1 keep-alive) that reads the
 * whole POST body and answers POST /v1/models/m:predict with a fixed small JSON body. No JSON parsing, no
 * model: whatever tensord spends beyond this is its own.
 *
 *   bare_mhd PORT [THREADS]     THREADS default 4 * online cores (tensord's --rest_api_num_threads default)
 *
 * Binds 127.0.0.1 only. Runs until SIGINT/SIGTERM, then stops the daemon and exits 0.
 * Built by bench/serve_bench.py: gcc -O2 -o build/bench/bare_mhd bench/bare_mhd.c -lmicrohttpd
 */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if MHD_VERSION < 0x00097002
typedef int MHD_Result_t;
#else
typedef enum MHD_Result MHD_Result_t;
#endif

static const char PREDICT_BODY[] = "{\"predictions\": [[0.5, 0.25, 0.125, 0.0625]]}";
static const char NOT_FOUND_BODY[] = "{\"error\": \"not found\"}";

static struct MHD_Response *g_predict, *g_not_found;
static int g_marker; /* *con_cls points here once the request's first call was seen */

/* MHD calls this once for the headers, then once per body chunk, then once with *upload_data_size == 0. */
static MHD_Result_t handle(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                           const char *version, const char *upload_data, size_t *upload_data_size, void **con_cls) {
    (void)cls; (void)version; (void)upload_data;
    if (*con_cls == NULL) {
        *con_cls = &g_marker;
        return MHD_YES;
    }
    if (*upload_data_size) { /* consume (and drop) the body */
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (strcmp(method, "POST") == 0 && strcmp(url, "/v1/models/m:predict") == 0)
        return MHD_queue_response(conn, MHD_HTTP_OK, g_predict);
    return MHD_queue_response(conn, MHD_HTTP_NOT_FOUND, g_not_found);
}

static struct MHD_Response *fixed(const char *body) {
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_PERSISTENT);
    if (r) MHD_add_response_header(r, "Content-Type", "application/json");
    return r;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s PORT [THREADS]\n", argv[0]);
        return 2;
    }
    int port = atoi(argv[1]);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = argc > 2 ? atoi(argv[2]) : (int)(4 * (ncpu > 0 ? ncpu : 1));
    if (port <= 0 || port > 65535 || threads < 1) {
        fprintf(stderr, "error: bad port or thread count\n");
        return 2;
    }
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL); /* before MHD starts its threads: they inherit the mask */
    signal(SIGPIPE, SIG_IGN);

    g_predict = fixed(PREDICT_BODY);
    g_not_found = fixed(NOT_FOUND_BODY);
    if (!g_predict || !g_not_found) return 1;

    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);

    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC | MHD_USE_EPOLL | MHD_USE_ERROR_LOG, (uint16_t)port, NULL, NULL, handle, NULL,
        MHD_OPTION_THREAD_POOL_SIZE, (unsigned int)threads, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned int)2048, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)30,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(128 * 1024),
        MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned int)1024, MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "error: cannot start libmicrohttpd on 127.0.0.1:%d\n", port);
        return 1;
    }
    fprintf(stderr, "bare_mhd: listening on 127.0.0.1:%d with %d threads (epoll)\n", port, threads);
    int sig = 0;
    sigwait(&sigs, &sig);
    MHD_stop_daemon(d);
    MHD_destroy_response(g_predict);
    MHD_destroy_response(g_not_found);
    return 0;
}
