/* rendezvous.c - the coordinator: processes of a training job joined over TCP through rank 0, and the small
 * collectives over those connections (see rendezvous.h for the protocol and what it is for).
 *
 * Invariants: every socket is non-blocking and every read or write waits in poll() against a deadline, so no peer
 * can hang a rank for longer than the timeout in force; every length read from the wire is checked against a limit
 * before anything is read into memory; collectives run on one thread (the trainer's), in the same order on every
 * rank; after a failed collective the communicator is broken and every later call fails with the first reason
 * (ranks then stop instead of falling out of step).
 */
#define _GNU_SOURCE
#include "rendezvous.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "allreduce-impl.h"

#define RDV_MAGIC_HELLO 0x54535244u  /* "TSRD" */
#define RDV_MAGIC_ANSWER 0x54535241u /* "TSRA" */
#define RDV_VERSION 1u
#define RDV_MAX_MSG 1024u
#define RDV_HELLO_WAIT_S 10.0 /* a connection must say hello within this, or it is dropped */
#define RDV_MAX_WORLD 4096

enum { OP_ALLREDUCE = 1, OP_BARRIER = 2, OP_BCAST = 3, OP_ACK = 4 };
static const char *const op_names[] = {"?", "an all-reduce", "a barrier", "a broadcast", "an acknowledgement"};

typedef struct comm_coord {
    eng_comm base;
    int *fds;           /* rank 0: fds[k] is rank k's connection (fds[0] unused, -1); other ranks: fds[0], rank 0 */
    double op_timeout;
    char where[300];    /* "host:port", for messages */
    float *acc;         /* rank 0: the running sum, cap floats */
    uint32_t *wire;     /* a payload in wire order, cap words */
    size_t cap;
    int broken;
    char why[RDV_MAX_MSG + 1];
} comm_coord;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ---- the environment ---- */

static eng_status env_int(const char *name, int lo, int hi, int *out) {
    const char *v = getenv(name);
    if (!v || !*v) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s is not set", name);
    char *end = NULL;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s=%s is not an integer in [%d, %d]", name, v, lo, hi);
    *out = (int)x;
    return ENG_STATUS_OK;
}

eng_status eng_rdv_opts_from_env(eng_rdv_opts *o) {
    memset(o, 0, sizeof *o);
    ENG_TRY(env_int("TENSORD_WORLD_SIZE", 1, RDV_MAX_WORLD, &o->world_size));
    ENG_TRY(env_int("TENSORD_RANK", 0, INT_MAX, &o->rank));
    if (o->rank >= o->world_size)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "TENSORD_RANK=%d is not below TENSORD_WORLD_SIZE=%d (ranks are 0..%d)",
                       o->rank, o->world_size, o->world_size - 1);
    const char *c = getenv("TENSORD_COORDINATOR");
    if (!c || !*c)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "TENSORD_COORDINATOR is not set: it is rank 0's host:port "
                       "(deploy/k8s/train-job.yaml: tensord-train-0.tensord-train:8503)");
    const char *colon = strrchr(c, ':');
    const char *h = c, *he = colon;
    if (c[0] == '[') { /* [v6addr]:port */
        const char *rb = strchr(c, ']');
        if (!rb || rb[1] != ':') colon = NULL;
        else h = c + 1, he = rb, colon = rb + 1;
    }
    char *end = NULL;
    long port = colon ? strtol(colon + 1, &end, 10) : 0;
    if (!colon || he == h || (size_t)(he - h) >= sizeof o->host || !end || *end || end == colon + 1 || port < 1 ||
        port > 65535)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "TENSORD_COORDINATOR=%s is not host:port (a port in 1..65535)", c);
    memcpy(o->host, h, (size_t)(he - h));
    o->host[he - h] = 0;
    o->port = (int)port;
    o->timeout_s = 300;
    const char *t = getenv("TENSORD_COORDINATOR_TIMEOUT");
    if (t && *t) {
        double x = strtod(t, &end);
        if (end == t || *end || !(x > 0) || x > 86400)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "TENSORD_COORDINATOR_TIMEOUT=%s is not a number of seconds in "
                           "(0, 86400]", t);
        o->timeout_s = x;
    }
    o->op_timeout_s = o->timeout_s > 1800 ? o->timeout_s : 1800;
    return ENG_STATUS_OK;
}

/* ---- bytes on sockets, against deadlines ---- */

/* 1 ready, 0 deadline passed, -1 error (errno). */
static int wait_fd(int fd, short ev, double deadline) {
    for (;;) {
        double left = deadline - now_s();
        if (left <= 0) return 0;
        struct pollfd p = {.fd = fd, .events = ev};
        int ms = left > 1e6 ? 1000000000 : (int)(left * 1000) + 1;
        int r = poll(&p, 1, ms);
        if (r > 0) return 1;
        if (r < 0 && errno != EINTR) return -1;
    }
}

/* Reads exactly n bytes. Errors say what happened ("closed", "timed out after", the errno); callers add who. */
static eng_status read_full(int fd, void *buf, size_t n, double deadline, double limit) {
    char *p = buf;
    while (n) {
        int w = wait_fd(fd, POLLIN, deadline);
        if (w == 0) return eng_err(ENG_STATUS_DEADLINE_EXCEEDED, "nothing arrived within %.0f s", limit);
        if (w < 0) return eng_err(ENG_STATUS_IO, "%s", strerror(errno));
        ssize_t r = recv(fd, p, n, 0);
        if (r == 0) return eng_err(ENG_STATUS_IO, "the connection was closed");
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
            return eng_err(ENG_STATUS_IO, "%s", strerror(errno));
        }
        p += r;
        n -= (size_t)r;
    }
    return ENG_STATUS_OK;
}

static eng_status write_full(int fd, const void *buf, size_t n, double deadline, double limit) {
    const char *p = buf;
    while (n) {
        int w = wait_fd(fd, POLLOUT, deadline);
        if (w == 0) return eng_err(ENG_STATUS_DEADLINE_EXCEEDED, "could not send within %.0f s", limit);
        if (w < 0) return eng_err(ENG_STATUS_IO, "%s", strerror(errno));
        ssize_t r = send(fd, p, n, MSG_NOSIGNAL);
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
            return eng_err(ENG_STATUS_IO, "%s", strerror(errno));
        }
        p += r;
        n -= (size_t)r;
    }
    return ENG_STATUS_OK;
}

static void put_u32(unsigned char *b, uint32_t v) {
    uint32_t x = htonl(v);
    memcpy(b, &x, 4);
}
static uint32_t get_u32(const unsigned char *b) {
    uint32_t x;
    memcpy(&x, b, 4);
    return ntohl(x);
}

/* A header of three words, then len payload bytes. */
static eng_status send_msg(int fd, uint32_t w0, uint32_t w1, const void *payload, uint32_t len, double deadline,
                           double limit) {
    unsigned char h[12];
    put_u32(h, w0);
    put_u32(h + 4, w1);
    put_u32(h + 8, len);
    ENG_TRY(write_full(fd, h, sizeof h, deadline, limit));
    return len ? write_full(fd, payload, len, deadline, limit) : ENG_STATUS_OK;
}

/* Reads a header and its payload (at most cap bytes; a longer one is refused unread). */
static eng_status recv_msg(int fd, uint32_t *w0, uint32_t *w1, void *payload, uint32_t cap, uint32_t *len,
                           double deadline, double limit) {
    unsigned char h[12];
    ENG_TRY(read_full(fd, h, sizeof h, deadline, limit));
    *w0 = get_u32(h);
    *w1 = get_u32(h + 4);
    *len = get_u32(h + 8);
    if (*len > cap) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "a message of %u bytes (the limit here is %u)", *len, cap);
    return *len ? read_full(fd, payload, *len, deadline, limit) : ENG_STATUS_OK;
}

static void set_socket_opts(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* ---- the communicator ---- */

static void coord_free(eng_comm *cc) {
    comm_coord *c = (comm_coord *)cc;
    int n = c->base.rank == 0 ? c->base.size : 1;
    for (int k = 0; c->fds && k < n; k++)
        if (c->fds[k] >= 0) close(c->fds[k]);
    free(c->fds);
    free(c->acc);
    free(c->wire);
    free(c);
}

static eng_status coord_broken(comm_coord *c) {
    return eng_err(ENG_STATUS_INTERNAL, "rank %d of %d: the coordinator's connections failed earlier: %s", c->base.rank,
                   c->base.size, c->why);
}

/* Records the failure (the message already in eng_last_error) and, on rank 0, tells every peer why. */
static eng_status coord_fail(comm_coord *c, eng_status st) {
    if (!c->broken) {
        c->broken = 1;
        snprintf(c->why, sizeof c->why, "%s", eng_last_error());
    }
    if (c->base.rank == 0) {
        uint32_t len = (uint32_t)strnlen(c->why, RDV_MAX_MSG);
        double dl = now_s() + 5;
        for (int k = 1; k < c->base.size; k++)
            if (c->fds[k] >= 0) (void)send_msg(c->fds[k], OP_ACK, 1, c->why, len, dl, 5);
    }
    return eng_err(st, "%s", c->why);
}

static eng_status coord_scratch(comm_coord *c, size_t words) {
    if (words <= c->cap) return ENG_STATUS_OK;
    float *a = realloc(c->acc, words * sizeof *a);
    if (a) c->acc = a;
    uint32_t *w = a ? realloc(c->wire, words * sizeof *w) : NULL;
    if (w) c->wire = w;
    if (!a || !w) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "coordinator: out of memory for %zu floats", words);
    c->cap = words;
    return ENG_STATUS_OK;
}

static void to_wire(uint32_t *w, const float *f, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &f[i], 4);
        w[i] = htonl(u);
    }
}
static float from_wire(uint32_t w) {
    uint32_t u = ntohl(w);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* All-reduce (op OP_ALLREDUCE) or barrier (OP_BARRIER, n = 0): rank 0 sums the ranks in order and sends it back. */
static eng_status coord_reduce(comm_coord *c, uint32_t op, float *buf, int64_t n, int mean) {
    if (c->broken) return coord_broken(c);
    if (n < 0 || (uint64_t)n * 4 > ENG_COORD_MAX_BYTES)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "rank %d: an all-reduce of %lld floats over the coordinator's "
                       "connections (at most %d: they carry metrics and flags; gradients travel through NCCL or MPI)",
                       c->base.rank, (long long)n, ENG_COORD_MAX_BYTES / 4);
    ENG_TRY(coord_scratch(c, (size_t)n + 1));
    uint32_t bytes = (uint32_t)n * 4, w0, w1, len;
    double lim = c->op_timeout, dl = now_s() + lim;
    eng_status st;
    if (c->base.rank != 0) {
        to_wire(c->wire, buf, (size_t)n);
        st = send_msg(c->fds[0], op, 0, c->wire, bytes, dl, lim);
        if (st != ENG_STATUS_OK)
            return coord_fail(c, eng_err_prefix(st, "rank %d: sending %s to the coordinator (rank 0, %s): ", c->base.rank,
                                                op_names[op], c->where));
        st = recv_msg(c->fds[0], &w0, &w1, c->wire, ENG_COORD_MAX_BYTES, &len, dl, lim);
        if (st != ENG_STATUS_OK)
            return coord_fail(c, eng_err_prefix(st, "rank %d: waiting for the result of %s from the coordinator (rank 0, "
                                                "%s): ", c->base.rank, op_names[op], c->where));
        if (w1 != 0) {
            ((char *)c->wire)[len < ENG_COORD_MAX_BYTES ? len : len - 1] = 0;
            return coord_fail(c, eng_err(ENG_STATUS_INTERNAL, "rank %d: rank 0 reports: %s", c->base.rank, (char *)c->wire));
        }
        if (w0 != op || len != bytes)
            return coord_fail(c, eng_err(ENG_STATUS_INTERNAL, "rank %d: the coordinator answered %s with %s of %u bytes "
                                         "(expected %u)", c->base.rank, op_names[op], op_names[w0 <= OP_ACK ? w0 : 0], len, bytes));
        for (int64_t i = 0; i < n; i++) buf[i] = from_wire(c->wire[i]);
        return ENG_STATUS_OK;
    }
    if (n) memcpy(c->acc, buf, (size_t)n * sizeof(float));
    for (int k = 1; k < c->base.size; k++) {
        st = recv_msg(c->fds[k], &w0, &w1, c->wire, ENG_COORD_MAX_BYTES, &len, dl, lim);
        if (st != ENG_STATUS_OK)
            return coord_fail(c, eng_err_prefix(st, "rank 0 (coordinator): waiting for rank %d's part of %s: ", k,
                                                op_names[op]));
        if (w0 != op || w1 != 0 || len != bytes)
            return coord_fail(c, eng_err(ENG_STATUS_INTERNAL, "rank 0 (coordinator): rank %d sent %s of %u bytes where "
                                         "rank 0 is in %s of %u bytes: the ranks are out of step", k,
                                         op_names[w0 <= OP_ACK ? w0 : 0], len, op_names[op], bytes));
        for (int64_t i = 0; i < n; i++) c->acc[i] += from_wire(c->wire[i]);
    }
    if (mean) {
        float inv = 1.0f / (float)c->base.size;
        for (int64_t i = 0; i < n; i++) c->acc[i] *= inv;
    }
    if (n) memcpy(buf, c->acc, (size_t)n * sizeof(float));
    to_wire(c->wire, buf, (size_t)n);
    for (int k = 1; k < c->base.size; k++) {
        st = send_msg(c->fds[k], op, 0, c->wire, bytes, dl, lim);
        if (st != ENG_STATUS_OK)
            return coord_fail(c, eng_err_prefix(st, "rank 0 (coordinator): sending the result of %s to rank %d: ",
                                                op_names[op], k));
    }
    return ENG_STATUS_OK;
}

static eng_status coord_allreduce(eng_comm *cc, int rank, float *buf, int64_t n, int mean) {
    (void)rank;
    return coord_reduce((comm_coord *)cc, OP_ALLREDUCE, buf, n, mean);
}

static void coord_barrier(eng_comm *cc, int rank) {
    (void)rank;
    (void)coord_reduce((comm_coord *)cc, OP_BARRIER, NULL, 0, 0);
}

/* Rank 0 sends its bytes to every peer, then waits until every peer acknowledged them. */
static eng_status coord_bcast(eng_comm *cc, int rank, void *buf, size_t nbytes) {
    (void)rank;
    comm_coord *c = (comm_coord *)cc;
    if (c->broken) return coord_broken(c);
    if (nbytes > ENG_COORD_MAX_BYTES)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "rank %d: a broadcast of %zu bytes over the coordinator (at most %d)",
                       c->base.rank, nbytes, ENG_COORD_MAX_BYTES);
    ENG_TRY(coord_scratch(c, nbytes / 4 + 1));
    double lim = c->op_timeout, dl = now_s() + lim;
    uint32_t w0, w1, len;
    eng_status st;
    if (c->base.rank != 0) {
        st = recv_msg(c->fds[0], &w0, &w1, c->wire, ENG_COORD_MAX_BYTES, &len, dl, lim);
        if (st != ENG_STATUS_OK)
            return coord_fail(c, eng_err_prefix(st, "rank %d: waiting for rank 0's broadcast (%s): ", c->base.rank, c->where));
        if (w1 != 0) {
            ((char *)c->wire)[len < ENG_COORD_MAX_BYTES ? len : len - 1] = 0;
            return coord_fail(c, eng_err(ENG_STATUS_INTERNAL, "rank %d: rank 0 reports: %s", c->base.rank, (char *)c->wire));
        }
        if (w0 != OP_BCAST || len != nbytes)
            return coord_fail(c, eng_err(ENG_STATUS_INTERNAL, "rank %d: expected a broadcast of %zu bytes, the coordinator "
                                         "sent %s of %u", c->base.rank, nbytes, op_names[w0 <= OP_ACK ? w0 : 0], len));
        memcpy(buf, c->wire, nbytes);
        st = send_msg(c->fds[0], OP_ACK, 0, NULL, 0, dl, lim);
        return st == ENG_STATUS_OK ? st : coord_fail(c, eng_err_prefix(st, "rank %d: acknowledging a broadcast: ", c->base.rank));
    }
    for (int k = 1; k < c->base.size; k++) {
        st = send_msg(c->fds[k], OP_BCAST, 0, buf, (uint32_t)nbytes, dl, lim);
        if (st != ENG_STATUS_OK) return coord_fail(c, eng_err_prefix(st, "rank 0 (coordinator): broadcasting to rank %d: ", k));
    }
    for (int k = 1; k < c->base.size; k++) {
        st = recv_msg(c->fds[k], &w0, &w1, c->wire, ENG_COORD_MAX_BYTES, &len, dl, lim);
        if (st == ENG_STATUS_OK && (w0 != OP_ACK || w1 != 0))
            st = eng_err(ENG_STATUS_INTERNAL, "it sent %s instead", op_names[w0 <= OP_ACK ? w0 : 0]);
        if (st != ENG_STATUS_OK)
            return coord_fail(c, eng_err_prefix(st, "rank 0 (coordinator): rank %d's acknowledgement of a broadcast: ", k));
    }
    return ENG_STATUS_OK;
}

static const eng_comm_ops coord_ops = {.kind = "coordinator", .allreduce = coord_allreduce, .barrier = coord_barrier,
                                       .bcast = coord_bcast, .free = coord_free};

/* ---- joining: rank 0 ---- */

static int listen_any(int port, int backlog) {
    int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1, zero = 0;
    if (fd >= 0) {
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero); /* IPv4 too */
        struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port), .sin6_addr = in6addr_any};
        if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, backlog) == 0) return fd;
        int e = errno;
        close(fd);
        if (e != EAFNOSUPPORT && e != EADDRNOTAVAIL) {
            errno = e;
            return -1;
        }
    }
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0); /* no IPv6 here */
    if (fd < 0) return -1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_ANY)};
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, backlog) == 0) return fd;
    int e = errno;
    close(fd);
    errno = e;
    return -1;
}

static void peer_name(const struct sockaddr_storage *a, socklen_t len, char *out, size_t n) {
    char h[NI_MAXHOST] = "?", s[NI_MAXSERV] = "?";
    getnameinfo((const struct sockaddr *)a, len, h, sizeof h, s, sizeof s, NI_NUMERICHOST | NI_NUMERICSERV);
    snprintf(out, n, "%.63s:%.15s", h, s); /* numeric: an IPv6 address and a port fit */
}

/* Rank 0 gives up: tell the offending peer (fd, may be -1) and every joined peer why, log it, return the error. */
static eng_status join_refuse(comm_coord *c, int fd, const char *from, const char *msg) {
    if (fd >= 0) fprintf(stderr, "tensord: coordinator (rank 0, port %s): refused %s: %s\n", c->where, from, msg);
    else fprintf(stderr, "tensord: coordinator (rank 0, port %s): gave up: %s\n", c->where, msg);
    double dl = now_s() + 5;
    uint32_t len = (uint32_t)strnlen(msg, RDV_MAX_MSG);
    if (fd >= 0) (void)send_msg(fd, RDV_MAGIC_ANSWER, 1, msg, len, dl, 5);
    char all[RDV_MAX_MSG + 64];
    snprintf(all, sizeof all, "rank 0 gave up the rendezvous: %s", msg);
    len = (uint32_t)strnlen(all, RDV_MAX_MSG);
    for (int k = 1; k < c->base.size; k++)
        if (c->fds[k] >= 0) (void)send_msg(c->fds[k], RDV_MAGIC_ANSWER, 1, all, len, dl, 5);
    return eng_err(ENG_STATUS_INVALID_ARGUMENT, "rank 0 (coordinator): %s", msg);
}

static eng_status join_as_root(comm_coord *c, const eng_rdv_opts *o) {
    int W = o->world_size;
    int lfd = listen_any(o->port, W < 128 ? 128 : W);
    if (lfd < 0)
        return eng_err(ENG_STATUS_IO, "rank 0 (coordinator): cannot listen on port %d (TENSORD_COORDINATOR=%s:%d): %s",
                       o->port, o->host, o->port, strerror(errno));
    char (*from)[80] = calloc((size_t)W, sizeof *from);
    if (!from) {
        close(lfd);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    double deadline = now_s() + o->timeout_s;
    int have = 0;
    eng_status st = ENG_STATUS_OK;
    while (have < W - 1 && st == ENG_STATUS_OK) {
        int w = wait_fd(lfd, POLLIN, deadline);
        if (w <= 0) {
            char missing[256] = "";
            size_t k = 0;
            for (int r = 1; r < W && k + 16 < sizeof missing; r++)
                if (c->fds[r] < 0) k += (size_t)snprintf(missing + k, sizeof missing - k, "%s%d", k ? ", " : "", r);
            char msg[512];
            snprintf(msg, sizeof msg, "%d of %d ranks joined within %g s (TENSORD_COORDINATOR_TIMEOUT); missing: rank%s %s",
                     have + 1, W, o->timeout_s, W - 1 - have > 1 ? "s" : "", missing);
            st = join_refuse(c, -1, NULL, msg);
            break;
        }
        struct sockaddr_storage a;
        socklen_t alen = sizeof a;
        int fd = accept4(lfd, (struct sockaddr *)&a, &alen, SOCK_CLOEXEC);
        if (fd < 0) continue; /* the peer went away already, or EINTR */
        set_socket_opts(fd);
        char who[80];
        peer_name(&a, alen, who, sizeof who);
        unsigned char h[16];
        double hd = now_s() + RDV_HELLO_WAIT_S;
        eng_status hs = read_full(fd, h, sizeof h, hd < deadline ? hd : deadline, RDV_HELLO_WAIT_S);
        if (hs != ENG_STATUS_OK || get_u32(h) != RDV_MAGIC_HELLO) {
            fprintf(stderr, "tensord: coordinator (rank 0, port %s): dropped a connection from %s: %s\n", c->where, who,
                    hs != ENG_STATUS_OK ? eng_last_error() : "it does not speak tensord's rendezvous protocol");
            close(fd);
            continue;
        }
        uint32_t ver = get_u32(h + 4), rank = get_u32(h + 8), ws = get_u32(h + 12);
        char msg[512] = "";
        if (ver != RDV_VERSION)
            snprintf(msg, sizeof msg, "rank %u speaks rendezvous protocol %u, rank 0 speaks %u (mixed tensord versions?)",
                     rank, ver, RDV_VERSION);
        else if (ws != (uint32_t)W)
            snprintf(msg, sizeof msg, "rank %u says TENSORD_WORLD_SIZE=%u, rank 0 has TENSORD_WORLD_SIZE=%d", rank, ws, W);
        else if (rank < 1 || rank >= (uint32_t)W)
            snprintf(msg, sizeof msg, "rank %u is out of range: TENSORD_WORLD_SIZE=%d has peers 1..%d (rank 0 is the "
                     "coordinator)", rank, W, W - 1);
        else if (c->fds[rank] >= 0)
            snprintf(msg, sizeof msg, "rank %u joined twice (from %s, and before from %s)", rank, who, from[rank]);
        if (msg[0]) {
            char fw[128];
            snprintf(fw, sizeof fw, "rank %u from %s", rank, who);
            st = join_refuse(c, fd, fw, msg);
            close(fd);
            break;
        }
        c->fds[rank] = fd;
        snprintf(from[rank], sizeof from[rank], "%s", who);
        have++;
    }
    close(lfd);
    free(from);
    if (st != ENG_STATUS_OK) return st;
    double dl = now_s() + 30;
    for (int k = 1; k < W && st == ENG_STATUS_OK; k++) {
        st = send_msg(c->fds[k], RDV_MAGIC_ANSWER, 0, NULL, 0, dl, 30);
        if (st != ENG_STATUS_OK) eng_err_prefix(st, "rank 0 (coordinator): telling rank %d it joined: ", k);
    }
    if (st == ENG_STATUS_OK) fprintf(stderr, "tensord: coordinator: all %d ranks joined at port %d\n", W, o->port);
    return st;
}

/* ---- joining: the other ranks ---- */

/* One connection attempt to every address host resolves to; the socket, or -1 with why[] filled. */
static int try_connect(const eng_rdv_opts *o, double deadline, char *why, size_t whyn) {
    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int g = getaddrinfo(o->host, port, &hints, &res);
    if (g != 0) {
        snprintf(why, whyn, "cannot resolve %s: %s", o->host, gai_strerror(g));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) continue;
        set_socket_opts(fd);
        int r = connect(fd, ai->ai_addr, ai->ai_addrlen), err = r == 0 ? 0 : errno;
        if (r != 0 && err == EINPROGRESS) {
            double d = now_s() + 5;
            if (wait_fd(fd, POLLOUT, d < deadline ? d : deadline) <= 0) err = ETIMEDOUT;
            else {
                socklen_t l = sizeof err;
                if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l) != 0) err = errno;
            }
        }
        if (err) {
            snprintf(why, whyn, "%s", strerror(err));
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    return fd;
}

static eng_status join_as_peer(comm_coord *c, const eng_rdv_opts *o) {
    double t0 = now_s(), deadline = t0 + o->timeout_s, backoff = 0.05;
    char why[512] = "no attempt";
    int fd;
    while ((fd = try_connect(o, deadline, why, sizeof why)) < 0) {
        double left = deadline - now_s();
        if (left <= 0)
            return eng_err(ENG_STATUS_DEADLINE_EXCEEDED, "rank %d: could not reach the coordinator (rank 0) at %s within "
                           "%g s (TENSORD_COORDINATOR_TIMEOUT): %s", o->rank, c->where, o->timeout_s, why);
        double s = backoff < left ? backoff : left;
        struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
        nanosleep(&ts, NULL);
        backoff = backoff * 2 > 2 ? 2 : backoff * 2;
    }
    c->fds[0] = fd;
    unsigned char h[16];
    put_u32(h, RDV_MAGIC_HELLO);
    put_u32(h + 4, RDV_VERSION);
    put_u32(h + 8, (uint32_t)o->rank);
    put_u32(h + 12, (uint32_t)o->world_size);
    double lim = o->timeout_s, dl = now_s() + lim; /* rank 0 answers when the last rank joined */
    eng_status st = write_full(fd, h, sizeof h, dl, lim);
    uint32_t magic = 0, status = 0, len = 0;
    char msg[RDV_MAX_MSG + 1];
    if (st == ENG_STATUS_OK) st = recv_msg(fd, &magic, &status, msg, RDV_MAX_MSG, &len, dl, lim);
    if (st != ENG_STATUS_OK)
        return eng_err_prefix(st, "rank %d: joining through the coordinator (rank 0) at %s: ", o->rank, c->where);
    msg[len] = 0;
    if (magic != RDV_MAGIC_ANSWER)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "rank %d: %s is not a tensord coordinator (it answered 0x%08x)",
                       o->rank, c->where, magic);
    if (status != 0)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "rank %d: the coordinator (rank 0) at %s refused this rank: %s",
                       o->rank, c->where, msg);
    return ENG_STATUS_OK;
}

eng_status eng_comm_new_coordinator(const eng_rdv_opts *o, eng_comm **out) {
    *out = NULL;
    if (o->world_size < 1 || o->world_size > RDV_MAX_WORLD || o->rank < 0 || o->rank >= o->world_size)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "coordinator: rank %d of a world of %d", o->rank, o->world_size);
    if (o->port < 1 || o->port > 65535 || !o->host[0] || !(o->timeout_s > 0))
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "coordinator: '%s:%d' with timeout %g s", o->host, o->port, o->timeout_s);
    comm_coord *c = calloc(1, sizeof *c);
    int nfd = o->rank == 0 ? o->world_size : 1;
    if (c) c->fds = malloc((size_t)nfd * sizeof *c->fds);
    if (!c || !c->fds) {
        free(c);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    for (int k = 0; k < nfd; k++) c->fds[k] = -1;
    c->base = (eng_comm){.ops = &coord_ops, .size = o->world_size, .rank = o->rank};
    c->op_timeout = o->op_timeout_s > 0 ? o->op_timeout_s : 1800;
    if (o->rank == 0) snprintf(c->where, sizeof c->where, "%d", o->port);
    else snprintf(c->where, sizeof c->where, strchr(o->host, ':') ? "[%s]:%d" : "%s:%d", o->host, o->port);
    eng_status st = o->world_size == 1 ? ENG_STATUS_OK : o->rank == 0 ? join_as_root(c, o) : join_as_peer(c, o);
    if (st != ENG_STATUS_OK) {
        coord_free(&c->base);
        return st;
    }
    *out = &c->base;
    return ENG_STATUS_OK;
}
