/* test_rendezvous.c - the coordinator (engine/train/rendezvous.c) and the sim backend's communicator across
 * processes (kernels/sim/sim-comm.c): the environment's variables checked with messages naming them; three ranks
 * (threads) joined on loopback sum, average, broadcast and meet, and refuse an all-reduce the size of gradients;
 * rank 0 drops a connection that does not speak the protocol and refuses a hello with a rank out of range, telling
 * that peer why; two processes (fork) join one sim communicator from one id and all-reduce in rank order.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/train/rendezvous.h"
#include "kernels/backend-impl.h"

TestSuite(rendezvous, .timeout = 60);

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    cr_assert(bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
    getsockname(fd, (struct sockaddr *)&a, &l);
    close(fd);
    return ntohs(a.sin_port);
}

static void set_env(const char *rank, const char *ws, const char *coord, const char *timeout) {
    const char *names[] = {"TENSORD_RANK", "TENSORD_WORLD_SIZE", "TENSORD_COORDINATOR", "TENSORD_COORDINATOR_TIMEOUT"};
    const char *vals[] = {rank, ws, coord, timeout};
    for (int i = 0; i < 4; i++) {
        if (vals[i]) setenv(names[i], vals[i], 1);
        else unsetenv(names[i]);
    }
}

Test(rendezvous, environment_is_checked_naming_the_variable) {
    eng_rdv_opts o;
    set_env("1", "4", "tensord-train-0.tensord-train:8503", NULL);
    cr_assert_eq(eng_rdv_opts_from_env(&o), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert(o.rank == 1 && o.world_size == 4 && o.port == 8503 && o.timeout_s == 300 && o.op_timeout_s == 1800);
    cr_assert_str_eq(o.host, "tensord-train-0.tensord-train");
    set_env("0", "2", "[::1]:9000", "2.5");
    cr_assert_eq(eng_rdv_opts_from_env(&o), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert(strcmp(o.host, "::1") == 0 && o.port == 9000 && o.timeout_s == 2.5);
    const char *bad[][5] = {
        {"5", "4", "h:1", NULL, "TENSORD_RANK=5 is not below TENSORD_WORLD_SIZE=4"},
        {"-1", "4", "h:1", NULL, "TENSORD_RANK=-1 is not an integer"},
        {"x", "4", "h:1", NULL, "TENSORD_RANK=x"},
        {NULL, "4", "h:1", NULL, "TENSORD_RANK is not set"},
        {"0", "0", "h:1", NULL, "TENSORD_WORLD_SIZE=0"},
        {"0", "2", NULL, NULL, "TENSORD_COORDINATOR is not set"},
        {"0", "2", "h", NULL, "TENSORD_COORDINATOR=h is not host:port"},
        {"0", "2", "h:70000", NULL, "TENSORD_COORDINATOR=h:70000 is not host:port"},
        {"0", "2", ":80", NULL, "TENSORD_COORDINATOR=:80"},
        {"0", "2", "h:80", "soon", "TENSORD_COORDINATOR_TIMEOUT=soon"},
        {"0", "2", "h:80", "-3", "TENSORD_COORDINATOR_TIMEOUT=-3"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        set_env(bad[i][0], bad[i][1], bad[i][2], bad[i][3]);
        cr_assert_eq(eng_rdv_opts_from_env(&o), ENG_STATUS_INVALID_ARGUMENT, "case %zu accepted", i);
        cr_assert(strstr(eng_last_error(), bad[i][4]), "case %zu: %s", i, eng_last_error());
    }
    set_env(NULL, NULL, NULL, NULL);
}

typedef struct rank_run {
    eng_rdv_opts o;
    eng_status st;
    char err[1024];
    float sum[2], mean[2];
    unsigned char got[200];
    eng_status big;
    char big_err[512];
} rank_run;

static void *rank_main(void *arg) {
    rank_run *r = arg;
    eng_comm *c = NULL;
    r->st = eng_comm_new_coordinator(&r->o, &c);
    if (r->st != ENG_STATUS_OK) {
        snprintf(r->err, sizeof r->err, "%s", eng_last_error());
        return NULL;
    }
    int k = eng_comm_rank(c);
    r->sum[0] = (float)(k + 1), r->sum[1] = 0.5f;
    r->mean[0] = (float)(k * 3), r->mean[1] = -1.0f;
    if (k == 0)
        for (int i = 0; i < 200; i++) r->got[i] = (unsigned char)(i * 7 + 1);
    eng_status st = eng_comm_allreduce(c, k, r->sum, 2, 0);
    if (st == ENG_STATUS_OK) st = eng_comm_allreduce(c, k, r->mean, 2, 1);
    if (st == ENG_STATUS_OK) st = eng_comm_bcast(c, k, r->got, sizeof r->got);
    if (st == ENG_STATUS_OK) eng_comm_barrier(c, k);
    float *big = calloc(1 << 20, sizeof *big);
    r->big = eng_comm_allreduce(c, k, big, 1 << 20, 0); /* refused alike on every rank, before any traffic */
    snprintf(r->big_err, sizeof r->big_err, "%s", eng_last_error());
    free(big);
    if (st == ENG_STATUS_OK) st = eng_comm_allreduce(c, k, r->sum, 1, 0); /* still in step after the refusal */
    r->st = st;
    if (st != ENG_STATUS_OK) snprintf(r->err, sizeof r->err, "%s", eng_last_error());
    cr_assert_str_eq(eng_comm_kind(c), "coordinator");
    eng_comm_free(&c);
    return NULL;
}

Test(rendezvous, three_ranks_sum_average_broadcast_and_meet) {
    int port = free_port();
    rank_run r[3];
    memset(r, 0, sizeof r);
    pthread_t th[3];
    for (int k = 2; k >= 0; k--) { /* the peers first: they retry until rank 0 listens */
        r[k].o = (eng_rdv_opts){.rank = k, .world_size = 3, .port = port, .timeout_s = 20, .op_timeout_s = 20};
        snprintf(r[k].o.host, sizeof r[k].o.host, "127.0.0.1");
        pthread_create(&th[k], NULL, rank_main, &r[k]);
        if (k == 2) usleep(100000);
    }
    for (int k = 0; k < 3; k++) pthread_join(th[k], NULL);
    for (int k = 0; k < 3; k++) {
        cr_assert_eq(r[k].st, ENG_STATUS_OK, "rank %d: %s", k, r[k].err);
        cr_assert(r[k].sum[0] == 6.0f * 3 && r[k].sum[1] == 1.5f, "rank %d: sum %g %g", k, r[k].sum[0], r[k].sum[1]);
        cr_assert(r[k].mean[0] == 3.0f && r[k].mean[1] == -1.0f, "rank %d: mean %g %g", k, r[k].mean[0], r[k].mean[1]);
        for (int i = 0; i < 200; i++) cr_assert_eq(r[k].got[i], (unsigned char)(i * 7 + 1), "rank %d byte %d", k, i);
        cr_assert_eq(r[k].big, ENG_STATUS_INVALID_ARGUMENT);
        cr_assert(strstr(r[k].big_err, "gradients travel through NCCL or MPI"), "%s", r[k].big_err);
    }
}

static void *root_main(void *arg) {
    rank_run *r = arg;
    eng_comm *c = NULL;
    r->st = eng_comm_new_coordinator(&r->o, &c);
    snprintf(r->err, sizeof r->err, "%s", eng_last_error());
    eng_comm_free(&c);
    return NULL;
}

static int connect_to(int port) {
    for (int i = 0; i < 200; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) return fd;
        close(fd);
        usleep(20000);
    }
    return -1;
}

Test(rendezvous, rank_0_drops_strangers_and_refuses_a_rank_out_of_range) {
    int port = free_port();
    rank_run root;
    memset(&root, 0, sizeof root);
    root.o = (eng_rdv_opts){.rank = 0, .world_size = 2, .port = port, .timeout_s = 20, .op_timeout_s = 20};
    snprintf(root.o.host, sizeof root.o.host, "127.0.0.1");
    pthread_t th;
    pthread_create(&th, NULL, root_main, &root);
    int stranger = connect_to(port);
    cr_assert(stranger >= 0);
    cr_assert_eq(write(stranger, "GET / HTTP/1.0\r\n\r\n", 18), 18);
    int fd = connect_to(port);
    cr_assert(fd >= 0);
    uint32_t hello[4] = {htonl(0x54535244u), htonl(1), htonl(5), htonl(2)}; /* rank 5 of 2 */
    cr_assert_eq(write(fd, hello, sizeof hello), (ssize_t)sizeof hello);
    uint32_t h[3];
    cr_assert_eq(read(fd, h, sizeof h), (ssize_t)sizeof h);
    cr_assert_eq(ntohl(h[0]), 0x54535241u);
    cr_assert_neq(ntohl(h[1]), 0, "the hello was accepted");
    uint32_t len = ntohl(h[2]);
    cr_assert(len > 0 && len <= 1024);
    char msg[1025] = {0};
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, msg + got, len - got);
        cr_assert(n > 0);
        got += (size_t)n;
    }
    cr_assert(strstr(msg, "rank 5 is out of range"), "%s", msg);
    pthread_join(th, NULL);
    cr_assert_eq(root.st, ENG_STATUS_INVALID_ARGUMENT, "%s", root.err);
    cr_assert(strstr(root.err, "rank 5 is out of range: TENSORD_WORLD_SIZE=2"), "%s", root.err);
    close(fd);
    close(stranger);
}

/* Global rank `rank` of 2 with one sim device: all-reduces 3 floats (rank + 1) * {1, 2, 3} scaled by 0.5. */
static int sim_rank(const krn_comm_id *id, int rank, float out[3]) {
    const krn_backend *b = krn_backend_sim();
    krn_ctx *ctx = NULL;
    krn_comm *cm = NULL;
    void *buf = NULL;
    int dev = rank;
    float x[3] = {(float)(rank + 1), (float)(rank + 1) * 2, (float)(rank + 1) * 3};
    if (krn_ctx_new(b, dev, &ctx) != ENG_STATUS_OK || krn_buf_alloc(b, ctx, sizeof x, &buf) != ENG_STATUS_OK ||
        krn_buf_set(b, ctx, buf, x, sizeof x) != ENG_STATUS_OK)
        return 1;
    if (krn_comm_new_ranks(b, id, 2, rank, 1, &dev, &cm) != ENG_STATUS_OK) return 2;
    if (krn_comm_allreduce(b, cm, 0, ctx, buf, 3, 0.5f) != ENG_STATUS_OK) return 3;
    if (krn_buf_get(b, ctx, out, buf, sizeof x) != ENG_STATUS_OK || krn_ctx_sync(b, ctx) != ENG_STATUS_OK) return 4;
    krn_comm_free(b, &cm);
    krn_buf_free(b, ctx, buf);
    krn_ctx_free(b, &ctx);
    return 0;
}

Test(rendezvous, two_processes_share_one_sim_communicator) {
    const krn_backend *b = krn_backend_sim();
    cr_assert(krn_backend_has_comm_ranks(b));
    krn_comm_id id;
    cr_assert_eq(krn_comm_id_new(b, &id), ENG_STATUS_OK, "%s", eng_last_error());
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        float out[3];
        int rc = sim_rank(&id, 1, out);
        _exit(rc ? 10 + rc : (out[0] == 1.5f && out[1] == 3.0f && out[2] == 4.5f) ? 0 : 1);
    }
    float out[3] = {0};
    int rc = sim_rank(&id, 0, out);
    int ws = 0;
    waitpid(pid, &ws, 0);
    cr_assert_eq(rc, 0, "rank 0 failed at stage %d: %s", rc, eng_last_error());
    cr_assert(out[0] == 1.5f && out[1] == 3.0f && out[2] == 4.5f, "rank 0: %g %g %g", out[0], out[1], out[2]);
    cr_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "rank 1 (child) exit %d", WEXITSTATUS(ws));
    /* an id from no backend at all is refused, naming the ranks */
    krn_comm_id junk;
    memset(&junk, 'x', sizeof junk);
    krn_comm *cm = NULL;
    int dev = 0;
    cr_assert_eq(krn_comm_new_ranks(b, &junk, 2, 1, 1, &dev, &cm), ENG_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(eng_last_error(), "not a sim id"), "%s", eng_last_error());
}
