/* rest-gate.c - the REST server's front gate (see rest-gate.h).
 *
 * State: one entry per socket descriptor (fds index the table directly), in one of four states: FREE, HEAD
 * (accepted, first request head not complete; in the gate's epoll), MHD (handed to libmicrohttpd) and LINGER
 * (a canned reply was written; reading and dropping until EOF or 2 s). Counts per client address live in a
 * small open-addressing table keyed by the 16-byte address (IPv4 as IPv4-mapped IPv6). One mutex guards both;
 * it is held only for table updates, never across a system call that can block.
 * Invariants: n_head + n_mhd = number of entries in HEAD or MHD; an address's count = its entries in HEAD or
 * MHD; an MHD entry is freed only by srv_gate_closed (MHD calls it before it closes the socket, so a
 * descriptor in state MHD is never reused while the entry lives) or, defensively, when accept returns the
 * same number again (MHD closed it without telling).
 */
#define _GNU_SOURCE
#include "rest-gate.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#define GATE_MAX_LINE 8192        /* longest request line (414 past it) */
#define GATE_LINGER_US 2000000    /* lingering close after a canned reply */
#define GATE_MAX_LINGER 4096      /* more lingering sockets than this: close at once */
#define GATE_SCAN_US 100000       /* deadline scan period */
#define GATE_EVICT_AGE_US 500000  /* at the server's limit, a head-less connection this old may be dropped for
                                   * a new one (a client that means it sends its head within milliseconds) */
#define GATE_PROVISIONAL 16       /* connections an address at its limit may hold while they prove themselves */

enum { GATE_FREE = 0, GATE_HEAD, GATE_MHD, GATE_LINGER };

typedef struct gate_conn {
    uint8_t state, overflow;
    uint8_t prov;           /* admitted over its address's limit: counted in gate_ip.prov until its head is in */
    int ip;                 /* index in the address table, -1 none */
    int64_t t_accept, t_last, deadline; /* deadline: 0 = none (request complete, being served) */
    socklen_t alen;
    struct sockaddr_storage addr;
} gate_conn;

typedef struct gate_ip {
    uint8_t key[16];
    int used, count, prov; /* count: connections in HEAD or MHD; prov: provisional ones among HEAD (not in count) */
} gate_ip;

struct srv_gate {
    srv_gate_opts o;
    int lfd, ep, wake[2], spare_fd;
    struct MHD_Daemon *d;
    pthread_t thr;
    int running, stopping;
    pthread_mutex_t mu;
    gate_conn *c;
    int nc, max_fd;
    gate_ip *ips;
    int nips, ips_used;
    int n_head, n_mhd, n_linger;
    char host[64];
};

/* ---- client addresses ---- */

static void gate_ip_key(const struct sockaddr_storage *sa, uint8_t key[16]) {
    memset(key, 0, 16);
    if (sa->ss_family == AF_INET) {
        key[10] = key[11] = 0xff;
        memcpy(key + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
    } else if (sa->ss_family == AF_INET6) {
        memcpy(key, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
    }
}

static uint32_t gate_ip_hash(const uint8_t k[16]) {
    uint32_t h = 2166136261u;
    for (int i = 0; i < 16; i++) h = (h ^ k[i]) * 16777619u;
    return h;
}

/* Slot of key (inserted with count 0 when absent); -1 only if the table is full, which the rebuild prevents. */
static int gate_ip_slot(srv_gate *g, const uint8_t key[16]) {
    if (g->ips_used * 4 >= g->nips * 3) { /* too many addresses seen: keep only those with connections */
        gate_ip *old = g->ips;
        gate_ip *fresh = calloc((size_t)g->nips, sizeof *fresh);
        if (fresh) {
            int *remap = malloc((size_t)g->nips * sizeof *remap);
            g->ips = fresh;
            g->ips_used = 0;
            for (int i = 0; i < g->nips; i++) {
                if (remap) remap[i] = -1;
                if (!old[i].used || (old[i].count == 0 && old[i].prov == 0)) continue;
                uint32_t h = gate_ip_hash(old[i].key) & (uint32_t)(g->nips - 1);
                while (fresh[h].used) h = (h + 1) & (uint32_t)(g->nips - 1);
                fresh[h] = old[i];
                g->ips_used++;
                if (remap) remap[i] = (int)h;
            }
            for (int fd = 0; fd <= g->max_fd; fd++)
                if (g->c[fd].ip >= 0) g->c[fd].ip = remap ? remap[g->c[fd].ip] : -1;
            free(remap);
            free(old);
        }
    }
    uint32_t mask = (uint32_t)(g->nips - 1), h = gate_ip_hash(key) & mask;
    for (int n = 0; n < g->nips; n++, h = (h + 1) & mask) {
        if (!g->ips[h].used) {
            g->ips[h].used = 1;
            g->ips[h].count = g->ips[h].prov = 0;
            memcpy(g->ips[h].key, key, 16);
            g->ips_used++;
            return (int)h;
        }
        if (memcmp(g->ips[h].key, key, 16) == 0) return (int)h;
    }
    return -1;
}

static void gate_addr_str(const struct sockaddr_storage *sa, char *out, size_t n) {
    out[0] = 0;
    if (sa->ss_family == AF_INET) inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, out, (socklen_t)n);
    else if (sa->ss_family == AF_INET6) inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, out, (socklen_t)n);
}

/* ---- entries (g->mu held) ---- */

/* e no longer counts for its address. */
static void gate_uncount(srv_gate *g, gate_conn *e) {
    if (e->ip < 0) return;
    gate_ip *a = &g->ips[e->ip];
    if (e->prov && a->prov > 0) a->prov--;
    else if (!e->prov && a->count > 0) a->count--;
    e->ip = -1;
    e->prov = 0;
}

static void gate_release(srv_gate *g, int fd) {
    gate_conn *e = &g->c[fd];
    if (e->state == GATE_HEAD) g->n_head--;
    else if (e->state == GATE_MHD) g->n_mhd--;
    else if (e->state == GATE_LINGER) g->n_linger--;
    if (e->state == GATE_HEAD || e->state == GATE_MHD) gate_uncount(g, e);
    memset(e, 0, sizeof *e);
    e->ip = -1;
}

/* ---- canned replies ---- */

static const char *gate_reason(int status) {
    switch (status) {
    case 400: return "Bad Request";
    case 408: return "Request Timeout";
    case 414: return "URI Too Long";
    case 431: return "Request Header Fields Too Large";
    case 503: return "Service Unavailable";
    default: return "Error";
    }
}

/* Write a JSON error and move fd to LINGER (or close it). g->mu held; fd is in the epoll set. */
static void gate_reply(srv_gate *g, int fd, int status, const char *msg) {
    char body[600], head[1024];
    int bl = snprintf(body, sizeof body, "{\"error\":\"");
    for (const char *p = msg; *p && bl < (int)sizeof body - 8; p++) {
        if (*p == '"' || *p == '\\') body[bl++] = '\\';
        body[bl++] = (*p >= 0x20 && *p < 0x7f) ? *p : '?';
    }
    bl += snprintf(body + bl, sizeof body - (size_t)bl, "\"}");
    int hl = snprintf(head, sizeof head,
                      "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%sConnection: close\r\n\r\n%s",
                      status, gate_reason(status), bl, status == 503 ? "Retry-After: 1\r\n" : "", body);
    if (hl > (int)sizeof head - 1) hl = (int)sizeof head - 1;
    (void)!send(fd, head, (size_t)hl, MSG_NOSIGNAL | MSG_DONTWAIT);
    gate_conn *e = &g->c[fd];
    int was_counted = e->state == GATE_HEAD || e->state == GATE_MHD;
    if (was_counted) {
        if (e->state == GATE_HEAD) g->n_head--;
        gate_uncount(g, e);
    }
    if (g->n_linger >= GATE_MAX_LINGER || shutdown(fd, SHUT_WR) != 0) {
        epoll_ctl(g->ep, EPOLL_CTL_DEL, fd, NULL);
        e->state = GATE_FREE;
        gate_release(g, fd);
        close(fd);
        return;
    }
    e->state = GATE_LINGER;
    e->deadline = srv_now_us() + GATE_LINGER_US;
    g->n_linger++;
}

static void gate_close(srv_gate *g, int fd) {
    epoll_ctl(g->ep, EPOLL_CTL_DEL, fd, NULL);
    gate_release(g, fd);
    close(fd);
}

enum { GATE_ANY_OLD, GATE_IP_PROV, GATE_IP_COUNTED };

/* The oldest connection still waiting for its head: GATE_ANY_OLD any that has waited GATE_EVICT_AGE_US;
 * GATE_IP_PROV a provisional one of address ip; GATE_IP_COUNTED a counted one of address ip. -1 if none. */
static int gate_oldest_head(srv_gate *g, int ip, int which) {
    int best = -1;
    int64_t old = srv_now_us() - GATE_EVICT_AGE_US;
    for (int fd = 0; fd <= g->max_fd; fd++) {
        const gate_conn *e = &g->c[fd];
        if (e->state != GATE_HEAD) continue;
        if (which == GATE_ANY_OLD ? e->t_accept > old : e->ip != ip || e->prov != (which == GATE_IP_PROV)) continue;
        if (best < 0 || e->t_accept < g->c[best].t_accept) best = fd;
    }
    return best;
}

/* Drop fd, which has not sent its head, to make room (503: the client may retry). */
static void gate_evict(srv_gate *g, int fd, const char *why) {
    char msg[240];
    snprintf(msg, sizeof msg, "request head not complete after %.1f s: dropped to make room for %s; retry shortly",
             (double)(srv_now_us() - g->c[fd].t_accept) / 1e6, why);
    gate_reply(g, fd, 503, msg);
}

static void gate_per_ip_msg(srv_gate *g, const gate_conn *e, char *msg, size_t n) {
    char as[64];
    gate_addr_str(&e->addr, as, sizeof as);
    snprintf(msg, n, "too many connections from %s (limit %d, --rest_api_per_ip_connection_limit); retry shortly", as,
             g->o.per_ip);
}

/* ---- the first request head ---- */

int srv_rest_is_health(const char *method, const char *path) {
    if (!method || !path) return 0;
    int get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    if (!get) return 0;
    if (strcmp(path, "/v2/health/live") == 0 || strcmp(path, "/v2/health/ready") == 0) return 1;
    size_t n = strlen(path);
    if (strncmp(path, "/v2/models/", 11) == 0 && n > 17 && strcmp(path + n - 6, "/ready") == 0) return 1;
    if (strncmp(path, "/v1/models/", 11) == 0 && !strchr(path, ':')) {
        /* /v1/models/{m}, /v1/models/{m}/versions/{v}, /v1/models/{m}/labels/{l}; not .../metadata */
        const char *rest = strchr(path + 11, '/');
        if (!rest) return path[11] != 0;
        const char *last = strrchr(path, '/');
        return (strncmp(rest, "/versions/", 10) == 0 || strncmp(rest, "/labels/", 8) == 0) && last == rest + (rest[1] == 'v' ? 9 : 7);
    }
    return 0;
}

int srv_rest_framing_bad(int ncl, int nte, char *msg, size_t n) {
    if (ncl <= 1 && nte <= 1 && !(ncl && nte)) return 0;
    snprintf(msg, n, "conflicting message framing: %d Content-Length and %d Transfer-Encoding headers (at most one of "
             "them, once)", ncl, nte);
    return 1;
}

void srv_rest_limit_msg(int conn_limit, char *msg, size_t n) {
    snprintf(msg, n, "the server is at its connection limit (%d, --rest_api_connection_limit); retry shortly",
             conn_limit);
}

/* Case-insensitive header-name match at the start of line p (of length n). */
static int gate_is_header(const char *p, size_t n, const char *name) {
    size_t k = strlen(name);
    return n > k && p[k] == ':' && strncasecmp(p, name, k) == 0;
}

/* Check a complete head of hl bytes. 0, or an HTTP status with msg set. */
static int gate_check_head(const char *h, size_t hl, char *msg, size_t mn) {
    if (memchr(h, 0, hl)) {
        snprintf(msg, mn, "the request line or a header contains a NUL byte");
        return 400;
    }
    const char *eol = memchr(h, '\n', hl);
    size_t line = eol ? (size_t)(eol - h) : hl;
    if (line > GATE_MAX_LINE) {
        snprintf(msg, mn, "request line of %zu bytes exceeds the limit of %d", line, GATE_MAX_LINE);
        return 414;
    }
    int ncl = 0, nte = 0;
    for (const char *p = eol ? eol + 1 : h + hl; p < h + hl;) {
        const char *e = memchr(p, '\n', (size_t)(h + hl - p));
        size_t n = e ? (size_t)(e - p) : (size_t)(h + hl - p);
        if (gate_is_header(p, n, "Content-Length")) ncl++;
        if (gate_is_header(p, n, "Transfer-Encoding")) nte++;
        p += n + 1;
    }
    return srv_rest_framing_bad(ncl, nte, msg, mn) ? 400 : 0;
}

/* Method and path of the head's request line (for the health check). */
static void gate_request_line(const char *h, size_t hl, char *method, size_t mn, char *path, size_t pn) {
    method[0] = path[0] = 0;
    const char *sp = memchr(h, ' ', hl);
    if (!sp) return;
    size_t ml = (size_t)(sp - h);
    if (ml >= mn) return;
    memcpy(method, h, ml);
    method[ml] = 0;
    const char *p = sp + 1, *end = h + hl;
    size_t k = 0;
    while (p < end && *p != ' ' && *p != '?' && *p != '\r' && *p != '\n' && k + 1 < pn) path[k++] = *p++;
    path[k] = 0;
}

/* Look at what fd has sent so far (g->mu held). */
static void gate_peek(srv_gate *g, int fd, char *buf, size_t cap) {
    gate_conn *e = &g->c[fd];
    ssize_t n = recv(fd, buf, cap, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        gate_close(g, fd);
        return;
    }
    if (n < 0) return;
    e->t_last = srv_now_us();
    size_t len = (size_t)n, hl = 0;
    for (size_t i = 0; i + 1 < len; i++) {
        if (buf[i] == '\n' && buf[i + 1] == '\n') { hl = i + 2; break; }
        if (buf[i] == '\n' && buf[i + 1] == '\r' && i + 2 < len && buf[i + 2] == '\n') { hl = i + 3; break; }
    }
    char msg[256];
    if (!hl) {
        if (len > g->o.max_head) {
            const char *eol = memchr(buf, '\n', len);
            if (!eol || (size_t)(eol - buf) > GATE_MAX_LINE) {
                snprintf(msg, sizeof msg, "request line exceeds the limit of %d bytes", GATE_MAX_LINE);
                gate_reply(g, fd, 414, msg);
            } else {
                snprintf(msg, sizeof msg, "request head exceeds the limit of %zu bytes", g->o.max_head);
                gate_reply(g, fd, 431, msg);
            }
        } else if (memchr(buf, 0, len)) {
            gate_reply(g, fd, 400, "the request line or a header contains a NUL byte");
        }
        return;
    }
    int st = gate_check_head(buf, hl, msg, sizeof msg);
    if (st) {
        gate_reply(g, fd, st, msg);
        return;
    }
    if (e->prov) { /* admitted over its address's limit: a counted connection that still sends nothing yields */
        gate_ip *a = &g->ips[e->ip];
        if (a->count >= g->o.per_ip) {
            int victim = gate_oldest_head(g, e->ip, GATE_IP_COUNTED);
            if (victim < 0) {
                gate_per_ip_msg(g, e, msg, sizeof msg);
                gate_reply(g, fd, 503, msg);
                return;
            }
            gate_evict(g, victim, "a newer connection from the same address that sent its request");
        }
        a->prov--;
        a->count++;
        e->prov = 0;
    }
    if (g->n_mhd >= g->o.conn_limit) {
        char method[16], path[512];
        gate_request_line(buf, hl, method, sizeof method, path, sizeof path);
        if (!srv_rest_is_health(method, path) || g->n_mhd >= g->o.conn_limit + g->o.reserve) {
            srv_rest_limit_msg(g->o.conn_limit, msg, sizeof msg);
            gate_reply(g, fd, 503, msg);
            return;
        }
        e->overflow = 1;
    }
    /* Hand over to MHD; it reads the same bytes. The deadline keeps running until the request is complete. */
    epoll_ctl(g->ep, EPOLL_CTL_DEL, fd, NULL);
    e->state = GATE_MHD;
    g->n_head--;
    g->n_mhd++;
    struct sockaddr_storage sa = e->addr;
    socklen_t alen = e->alen;
    int64_t t_accept = e->t_accept;
    pthread_mutex_unlock(&g->mu);
    enum MHD_Result ok = MHD_add_connection(g->d, fd, (const struct sockaddr *)&sa, alen);
    pthread_mutex_lock(&g->mu);
    /* On failure MHD closed the socket. If MHD already took it and closed it again, the entry was released
     * by srv_gate_closed (and the number may even be reused); release only an entry that is still ours. */
    if (ok != MHD_YES && g->c[fd].state == GATE_MHD && g->c[fd].t_accept == t_accept) gate_release(g, fd);
}

/* ---- accept ---- */

static void gate_accept(srv_gate *g) {
    for (int k = 0; k < 256; k++) {
        struct sockaddr_storage sa;
        socklen_t alen = sizeof sa;
        int fd = accept4(g->lfd, (struct sockaddr *)&sa, &alen, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE) {
                /* Out of descriptors: free the spare, answer one connection with 503, keep the spare again. */
                if (g->spare_fd >= 0) {
                    close(g->spare_fd);
                    fd = accept4(g->lfd, NULL, NULL, SOCK_CLOEXEC);
                    if (fd >= 0) {
                        static const char r[] = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                                                "Retry-After: 1\r\nConnection: close\r\nContent-Length: 61\r\n\r\n"
                                                "{\"error\":\"the server is out of file descriptors; retry later\"}";
                        (void)!send(fd, r, sizeof r - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
                        close(fd);
                    }
                    g->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
                }
            }
            return; /* EAGAIN, or an error the next round retries */
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        pthread_mutex_lock(&g->mu);
        if (fd >= g->nc) {
            pthread_mutex_unlock(&g->mu);
            close(fd);
            continue;
        }
        if (g->c[fd].state != GATE_FREE) gate_release(g, fd); /* closed behind our back: forget it */
        if (fd > g->max_fd) g->max_fd = fd;
        gate_conn *e = &g->c[fd];
        e->t_accept = e->t_last = srv_now_us();
        e->addr = sa;
        e->alen = alen;
        e->ip = -1;
        struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data.fd = fd};
        if (epoll_ctl(g->ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
            pthread_mutex_unlock(&g->mu);
            close(fd);
            continue;
        }
        e->state = GATE_HEAD;
        g->n_head++;
        uint8_t key[16];
        gate_ip_key(&sa, key);
        int ip = gate_ip_slot(g, key);
        char msg[240];
        int prov = 0;
        if (ip >= 0 && g->ips[ip].count >= g->o.per_ip) {
            /* Over its address's limit: let it prove itself (a complete head, see gate_peek) in one of a few
             * provisional slots, the oldest of which makes way. */
            int nprov = g->o.per_ip < GATE_PROVISIONAL ? g->o.per_ip : GATE_PROVISIONAL;
            if (g->ips[ip].prov >= nprov) {
                int victim = gate_oldest_head(g, ip, GATE_IP_PROV);
                if (victim >= 0) gate_evict(g, victim, "a newer connection from the same address");
            }
            if (g->ips[ip].prov >= nprov) {
                gate_per_ip_msg(g, e, msg, sizeof msg);
                gate_reply(g, fd, 503, msg);
                pthread_mutex_unlock(&g->mu);
                continue;
            }
            prov = 1;
        }
        if (g->n_head - 1 + g->n_mhd >= g->o.conn_limit + g->o.reserve) {
            int victim = gate_oldest_head(g, -1, GATE_ANY_OLD);
            if (victim == fd || victim < 0) {
                srv_rest_limit_msg(g->o.conn_limit, msg, sizeof msg);
                gate_reply(g, fd, 503, msg);
                pthread_mutex_unlock(&g->mu);
                continue;
            }
            gate_evict(g, victim, "a new connection");
        }
        e->ip = ip;
        e->prov = (uint8_t)prov;
        if (ip >= 0) {
            if (prov) g->ips[ip].prov++;
            else g->ips[ip].count++;
        }
        e->deadline = e->t_accept + (int64_t)g->o.header_timeout_s * 1000000;
        pthread_mutex_unlock(&g->mu);
    }
}

/* ---- deadlines ---- */

static void gate_scan(srv_gate *g, int64_t now) {
    pthread_mutex_lock(&g->mu);
    int64_t idle = (int64_t)g->o.idle_timeout_s * 1000000;
    for (int fd = 0; fd <= g->max_fd; fd++) {
        gate_conn *e = &g->c[fd];
        if (e->state == GATE_HEAD) {
            if (now >= e->deadline) {
                char msg[160];
                snprintf(msg, sizeof msg, "request head not complete within %d s (--rest_api_header_timeout_seconds)",
                         g->o.header_timeout_s);
                gate_reply(g, fd, 408, msg);
            } else if (now - e->t_last >= idle) {
                char msg[160];
                snprintf(msg, sizeof msg, "no data for %d s (--rest_api_connection_timeout_seconds)", g->o.idle_timeout_s);
                gate_reply(g, fd, 408, msg);
            }
        } else if (e->state == GATE_MHD) {
            int64_t dl = __atomic_load_n(&e->deadline, __ATOMIC_RELAXED);
            /* MHD sees the shutdown as an error on its next poll and closes the connection (srv_gate_closed). */
            if (dl && now >= dl && __atomic_compare_exchange_n(&e->deadline, &dl, 0, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
                shutdown(fd, SHUT_RDWR);
        } else if (e->state == GATE_LINGER && now >= e->deadline) {
            gate_close(g, fd);
        }
    }
    pthread_mutex_unlock(&g->mu);
}

static void *gate_main(void *arg) {
    srv_gate *g = arg;
    size_t cap = g->o.max_head + 1;
    char *buf = malloc(cap), drop[4096];
    struct epoll_event evs[256];
    int64_t next_scan = srv_now_us() + GATE_SCAN_US;
    while (buf) {
        int n = epoll_wait(g->ep, evs, 256, GATE_SCAN_US / 1000);
        if (__atomic_load_n(&g->stopping, __ATOMIC_ACQUIRE)) break;
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == g->wake[0]) {
                while (read(g->wake[0], drop, sizeof drop) > 0) {}
                continue;
            }
            if (fd == g->lfd) {
                gate_accept(g);
                continue;
            }
            pthread_mutex_lock(&g->mu);
            if (fd < g->nc && g->c[fd].state == GATE_HEAD) {
                gate_peek(g, fd, buf, cap);
            } else if (fd < g->nc && g->c[fd].state == GATE_LINGER) {
                ssize_t r;
                while ((r = read(fd, drop, sizeof drop)) > 0) {}
                if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) gate_close(g, fd);
            }
            pthread_mutex_unlock(&g->mu);
        }
        int64_t now = srv_now_us();
        if (now >= next_scan) {
            gate_scan(g, now);
            next_scan = now + GATE_SCAN_US;
        }
    }
    free(buf);
    return NULL;
}

/* ---- life cycle ---- */

srv_gate *srv_gate_new(const srv_gate_opts *o, srv_error *err) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", o->port);
    int gai = getaddrinfo(o->host, ps, &hints, &ai);
    if (gai != 0 || !ai) {
        srv_err(err, SRV_INVALID_ARGUMENT, "cannot resolve REST host '%s': %s", o->host, gai_strerror(gai));
        return NULL;
    }
    int lfd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    if (lfd >= 0) setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one); /* fast restarts; never REUSEPORT */
    if (lfd < 0 || bind(lfd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(lfd, 1024) != 0) {
        int e = errno;
        srv_err(err, e == EADDRINUSE ? SRV_ALREADY_EXISTS : SRV_UNAVAILABLE, "cannot listen on %s:%d: %s%s", o->host,
                o->port, e == EADDRINUSE ? "address in use" : strerror(e),
                e == EADDRINUSE ? " (another server holds this port; stop it or choose another --rest_api_port)" : "");
        if (lfd >= 0) close(lfd);
        freeaddrinfo(ai);
        return NULL;
    }
    freeaddrinfo(ai);
    srv_gate *g = calloc(1, sizeof *g);
    struct rlimit rl;
    int nc = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? (int)rl.rlim_cur : 65536;
    if (nc > (1 << 20)) nc = 1 << 20;
    int nips = 1024;
    while (nips < 4 * (o->conn_limit + o->reserve)) nips *= 2;
    if (g) {
        g->o = *o;
        g->c = calloc((size_t)nc, sizeof *g->c);
        g->ips = calloc((size_t)nips, sizeof *g->ips);
        g->nc = nc;
        g->nips = nips;
        g->lfd = lfd;
        g->ep = epoll_create1(EPOLL_CLOEXEC);
        g->wake[0] = g->wake[1] = -1;
        g->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        pthread_mutex_init(&g->mu, NULL);
        snprintf(g->host, sizeof g->host, "%s", o->host);
    }
    if (!g || !g->c || !g->ips || g->ep < 0 || pipe2(g->wake, O_NONBLOCK | O_CLOEXEC) != 0) {
        srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory or descriptors setting up the REST listener");
        if (!g) close(lfd);
        srv_gate_free(&g);
        return NULL;
    }
    for (int i = 0; i < nc; i++) g->c[i].ip = -1;
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = g->wake[0]};
    epoll_ctl(g->ep, EPOLL_CTL_ADD, g->wake[0], &ev);
    ev.data.fd = lfd;
    epoll_ctl(g->ep, EPOLL_CTL_ADD, lfd, &ev);
    return g;
}

int srv_gate_start(srv_gate *g, struct MHD_Daemon *d, srv_error *err) {
    g->d = d;
    if (pthread_create(&g->thr, NULL, gate_main, g) != 0) {
        srv_err(err, SRV_RESOURCE_EXHAUSTED, "cannot start the REST accept thread");
        return -1;
    }
    g->running = 1;
    return 0;
}

void srv_gate_close_listen(srv_gate *g) {
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    if (g->lfd >= 0) {
        epoll_ctl(g->ep, EPOLL_CTL_DEL, g->lfd, NULL);
        close(g->lfd);
        g->lfd = -1;
    }
    pthread_mutex_unlock(&g->mu);
}

void srv_gate_stop(srv_gate *g) {
    if (!g || !g->running) return;
    __atomic_store_n(&g->stopping, 1, __ATOMIC_RELEASE);
    (void)!write(g->wake[1], "x", 1);
    pthread_join(g->thr, NULL);
    g->running = 0;
    pthread_mutex_lock(&g->mu);
    for (int fd = 0; fd <= g->max_fd; fd++)
        if (g->c[fd].state == GATE_HEAD || g->c[fd].state == GATE_LINGER) gate_close(g, fd);
    pthread_mutex_unlock(&g->mu);
}

void srv_gate_free(srv_gate **pg) {
    if (!pg || !*pg) return;
    srv_gate *g = *pg;
    srv_gate_stop(g);
    srv_gate_close_listen(g);
    if (g->ep >= 0) close(g->ep);
    if (g->wake[0] >= 0) close(g->wake[0]);
    if (g->wake[1] >= 0) close(g->wake[1]);
    if (g->spare_fd >= 0) close(g->spare_fd);
    pthread_mutex_destroy(&g->mu);
    free(g->c);
    free(g->ips);
    free(g);
    *pg = NULL;
}

/* ---- hooks from MHD ---- */

void srv_gate_closed(srv_gate *g, int fd) {
    if (!g || fd < 0 || fd >= g->nc) return;
    pthread_mutex_lock(&g->mu);
    if (g->c[fd].state == GATE_MHD) gate_release(g, fd);
    pthread_mutex_unlock(&g->mu);
}

/* The two per-request hooks take no lock: only the connection's own MHD thread calls them, between its hand-over
 * and srv_gate_closed (which runs on that same thread), so the entry is in state MHD throughout; the deadline is
 * an atomic the gate thread's scan reads. */
void srv_gate_received(srv_gate *g, int fd) {
    if (!g || fd < 0 || fd >= g->nc) return;
    __atomic_store_n(&g->c[fd].deadline, 0, __ATOMIC_RELAXED);
}

void srv_gate_replied(srv_gate *g, int fd) {
    if (!g || fd < 0 || fd >= g->nc) return;
    __atomic_store_n(&g->c[fd].deadline, srv_now_us() + (int64_t)g->o.idle_timeout_s * 1000000, __ATOMIC_RELAXED);
}

int srv_gate_overflow(srv_gate *g, int fd) {
    if (!g || fd < 0 || fd >= g->nc) return 0;
    return g->c[fd].overflow; /* set before the hand-over (MHD_add_connection orders it), fixed after */
}
