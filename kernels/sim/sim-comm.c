/* sim-comm.c - the sim backend's collectives (krn_backend.comm_*), within a process and across processes, so that
 * tests run the whole multi-process device path (engine/train/rendezvous.c, train-device.c) without a GPU.
 *
 * A communicator is a shared-memory segment that every rank maps: a header with a process-shared, robust mutex and
 * condition variable (a barrier with a generation count), then per global rank its pid, the length it passed and a
 * slot of SIM_COMM_CHUNK floats. Within one process (comm_new) the segment is an anonymous shared mapping; across
 * processes (comm_id_new / comm_new_ranks) the id names a POSIX shared-memory object ("/tensord-sim-<pid>-<hex>"):
 * the process holding global rank 0 creates it, the others open it (retrying until it exists), and the creator
 * unlinks the name once every rank has mapped it (or at free), so nothing outlives the job.
 *
 * All-reduce, per chunk: every rank copies its buffer out of its device (krn_buf_get: sim memory is not host
 * memory), scales it by its prescale into its slot; barrier; every rank sums the slots in global rank order from 0
 * (the same float operations as one process summing all ranks: deterministic, identical on every rank) and copies
 * the sum into its buffer; barrier (the slots are free again). A first barrier per call checks every rank passed
 * the same length, so that all ranks run the same number of chunk barriers.
 *
 * A rank that fails or dies never hangs the others: every wait is timed (TENSORD_SIM_COMM_TIMEOUT seconds, default
 * 120), checks once a second whether a peer process is gone, and a rank that gives up marks the segment broken with
 * the reason, which every other rank then reports at once.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../backend-impl.h"
#include "sim-comm.h"

#define SIM_COMM_CHUNK ((size_t)1 << 16) /* floats per rank slot */
#define SIM_COMM_MAGIC 0x74656e736f72644dULL
#define SIM_COMM_MAX_RANKS 1024
static const char sim_id_prefix[] = "tensord-sim-comm:";

typedef struct sim_shm {
    _Atomic uint64_t magic; /* SIM_COMM_MAGIC once the creator initialised the rest */
    int nranks;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived, joined;
    uint64_t gen;
    int broken; /* a rank gave up: why[] says why, every later call fails */
    char why[256];
    /* then: uint64_t lens[nranks]; pid_t pids[nranks]; float slots[nranks][SIM_COMM_CHUNK] (lens first: aligned) */
} sim_shm;

struct krn_comm {
    int nlocal, first, nranks;
    sim_shm *sh;
    size_t bytes;       /* of the mapping */
    char name[64];      /* the shared-memory object's name, "" within one process */
    int creator;        /* this process created (and unlinks) the name */
    int unlinked;
    float **tmp;        /* per local rank: SIM_COMM_CHUNK floats, the sum before it goes to the device */
};

static size_t hdr_bytes(void) { return (sizeof(sim_shm) + 63) / 64 * 64; }
static size_t seg_bytes(int nranks) {
    size_t b = hdr_bytes() + (size_t)nranks * (sizeof(pid_t) + sizeof(uint64_t));
    b = (b + 63) / 64 * 64;
    return b + (size_t)nranks * SIM_COMM_CHUNK * sizeof(float);
}
static uint64_t *sh_lens(sim_shm *s) { return (uint64_t *)((char *)s + hdr_bytes()); }
static pid_t *sh_pids(sim_shm *s) { return (pid_t *)(sh_lens(s) + s->nranks); }
static float *sh_slot(sim_shm *s, int g) {
    size_t b = hdr_bytes() + (size_t)s->nranks * (sizeof(pid_t) + sizeof(uint64_t));
    b = (b + 63) / 64 * 64;
    return (float *)((char *)s + b) + (size_t)g * SIM_COMM_CHUNK;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double comm_timeout(void) {
    const char *e = getenv("TENSORD_SIM_COMM_TIMEOUT");
    double t = e && *e ? atof(e) : 120.0;
    return t > 0 ? t : 120.0;
}

/* Whether process pid is gone (no such process, or a zombie nobody reaped yet). */
static int pid_gone(pid_t pid) {
    if (pid <= 0 || pid == getpid()) return 0;
    if (kill(pid, 0) != 0 && errno == ESRCH) return 1;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

static void init_sync(sim_shm *s, int nranks) {
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&s->mu, &ma);
    pthread_mutexattr_destroy(&ma);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    s->nranks = nranks;
    atomic_store_explicit(&s->magic, SIM_COMM_MAGIC, memory_order_release);
}

static void sh_lock(sim_shm *s) {
    if (pthread_mutex_lock(&s->mu) == EOWNERDEAD) {
        pthread_mutex_consistent(&s->mu);
        if (!s->broken) {
            s->broken = 1;
            snprintf(s->why, sizeof s->why, "a rank's process died inside a sim collective");
        }
    }
}

/* Under the lock: mark the communicator broken (first reason wins) and wake everyone. */
static void sh_break(sim_shm *s, const char *why) {
    if (!s->broken) {
        s->broken = 1;
        snprintf(s->why, sizeof s->why, "%s", why);
    }
    pthread_cond_broadcast(&s->cv);
}

static eng_status broken_err(sim_shm *s, int g) {
    return eng_err(ENG_STATUS_INTERNAL, "sim collective (global rank %d of %d): %s", g, s->nranks, s->why);
}

/* Under the lock: wait until pred(s, arg) holds, in one-second slices, checking the peers and the deadline. */
static eng_status sh_wait(sim_shm *s, int g, const char *what, int (*pred)(sim_shm *, uint64_t), uint64_t arg) {
    double t0 = now_s(), limit = comm_timeout();
    while (!pred(s, arg) && !s->broken) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += 1;
        int rc = pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        if (rc == EOWNERDEAD) {
            pthread_mutex_consistent(&s->mu);
            sh_break(s, "a rank's process died inside a sim collective");
        }
        if (pred(s, arg) || s->broken) break;
        char why[256];
        pid_t *pids = sh_pids(s);
        for (int r = 0; r < s->nranks; r++)
            if (pid_gone(pids[r])) {
                snprintf(why, sizeof why, "global rank %d's process (pid %d) is gone", r, (int)pids[r]);
                sh_break(s, why);
                break;
            }
        if (!s->broken && now_s() - t0 > limit) {
            snprintf(why, sizeof why, "global rank %d waited %.0f s for the other ranks %s (TENSORD_SIM_COMM_TIMEOUT)", g,
                     limit, what);
            sh_break(s, why);
        }
    }
    return s->broken ? broken_err(s, g) : ENG_STATUS_OK;
}

static int gen_moved(sim_shm *s, uint64_t gen) { return s->gen != gen; }
static int all_joined(sim_shm *s, uint64_t unused) { return (void)unused, s->joined >= s->nranks; }

static eng_status sh_barrier(sim_shm *s, int g, const char *what) {
    sh_lock(s);
    eng_status st = ENG_STATUS_OK;
    if (s->broken) st = broken_err(s, g);
    else if (++s->arrived == s->nranks) {
        s->arrived = 0;
        s->gen++;
        pthread_cond_broadcast(&s->cv);
    } else {
        st = sh_wait(s, g, what, gen_moved, s->gen);
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

static void comm_release(krn_comm *cm) {
    if (!cm) return;
    if (cm->sh) munmap(cm->sh, cm->bytes);
    if (cm->creator && !cm->unlinked && cm->name[0]) shm_unlink(cm->name);
    for (int i = 0; cm->tmp && i < cm->nlocal; i++) free(cm->tmp[i]);
    free(cm->tmp);
    free(cm);
}

static eng_status comm_alloc(int nranks, int first, int nlocal, krn_comm **out) {
    *out = NULL;
    if (nranks < 1 || nranks > SIM_COMM_MAX_RANKS)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "sim: a communicator of %d ranks (at most %d)", nranks, SIM_COMM_MAX_RANKS);
    krn_comm *cm = calloc(1, sizeof *cm);
    if (cm && (cm->tmp = calloc((size_t)nlocal, sizeof *cm->tmp))) {
        cm->nlocal = nlocal;
        for (int i = 0; i < nlocal && cm; i++)
            if (!(cm->tmp[i] = malloc(SIM_COMM_CHUNK * sizeof(float)))) comm_release(cm), cm = NULL;
    } else {
        free(cm);
        cm = NULL;
    }
    if (!cm) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "sim: out of memory for a communicator of %d ranks", nranks);
    cm->nlocal = nlocal;
    cm->first = first;
    cm->nranks = nranks;
    cm->bytes = seg_bytes(nranks);
    *out = cm;
    return ENG_STATUS_OK;
}

eng_status sim_comm_new(int n, const int *devices, krn_comm **out) {
    (void)devices;
    krn_comm *cm;
    ENG_TRY(comm_alloc(n, 0, n, &cm));
    void *p = mmap(NULL, cm->bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        comm_release(cm);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "sim: cannot map %zu bytes for a communicator of %d ranks", seg_bytes(n), n);
    }
    cm->sh = p;
    init_sync(cm->sh, n);
    for (int r = 0; r < n; r++) sh_pids(cm->sh)[r] = getpid();
    cm->sh->joined = n;
    *out = cm;
    return ENG_STATUS_OK;
}

eng_status sim_comm_id_new(krn_comm_id *id) {
    unsigned char rnd[8] = {0};
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    ssize_t got = fd >= 0 ? read(fd, rnd, sizeof rnd) : -1;
    if (fd >= 0) close(fd);
    if (got != (ssize_t)sizeof rnd) return eng_err(ENG_STATUS_INTERNAL, "sim: cannot read /dev/urandom for a communicator id");
    memset(id, 0, sizeof *id);
    int k = snprintf((char *)id->bytes, sizeof id->bytes, "%s/tensord-sim-%d-", sim_id_prefix, (int)getpid());
    for (size_t i = 0; i < sizeof rnd; i++) k += snprintf((char *)id->bytes + k, sizeof id->bytes - (size_t)k, "%02x", rnd[i]);
    return ENG_STATUS_OK;
}

/* The creator's side: a new object of the right size, initialised. */
static eng_status seg_create(krn_comm *cm) {
    int fd = shm_open(cm->name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) return eng_err(ENG_STATUS_INTERNAL, "sim: shm_open(%s) to create global rank 0's communicator: %s", cm->name, strerror(errno));
    cm->creator = 1;
    if (ftruncate(fd, (off_t)cm->bytes) != 0) {
        int e = errno;
        close(fd);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "sim: sizing communicator %s to %zu bytes: %s", cm->name, cm->bytes, strerror(e));
    }
    void *p = mmap(NULL, cm->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "sim: mapping communicator %s: %s", cm->name, strerror(errno));
    cm->sh = p;
    init_sync(cm->sh, cm->nranks);
    return ENG_STATUS_OK;
}

/* Another process's side: open the object once global rank 0's process made it, within the timeout. */
static eng_status seg_open(krn_comm *cm) {
    double t0 = now_s(), limit = comm_timeout();
    for (;;) {
        int fd = shm_open(cm->name, O_RDWR, 0600);
        if (fd >= 0) {
            struct stat sb;
            if (fstat(fd, &sb) == 0 && (size_t)sb.st_size >= hdr_bytes()) {
                void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                close(fd);
                if (p == MAP_FAILED)
                    return eng_err(ENG_STATUS_OUT_OF_MEMORY, "sim: mapping communicator %s: %s", cm->name, strerror(errno));
                sim_shm *s = p;
                while (atomic_load_explicit(&s->magic, memory_order_acquire) != SIM_COMM_MAGIC && now_s() - t0 < limit)
                    usleep(1000);
                if (atomic_load_explicit(&s->magic, memory_order_acquire) != SIM_COMM_MAGIC) {
                    munmap(p, (size_t)sb.st_size);
                    return eng_err(ENG_STATUS_INTERNAL, "sim: communicator %s was never initialised by global rank 0", cm->name);
                }
                if (s->nranks != cm->nranks || (size_t)sb.st_size != cm->bytes) {
                    int n = s->nranks;
                    munmap(p, (size_t)sb.st_size);
                    return eng_err(ENG_STATUS_INVALID_ARGUMENT, "sim: communicator %s has %d ranks, global ranks %d..%d were "
                                   "told %d", cm->name, n, cm->first, cm->first + cm->nlocal - 1, cm->nranks);
                }
                cm->sh = s;
                return ENG_STATUS_OK;
            }
            close(fd);
        } else if (errno != ENOENT) {
            return eng_err(ENG_STATUS_INTERNAL, "sim: shm_open(%s): %s", cm->name, strerror(errno));
        }
        if (now_s() - t0 > limit)
            return eng_err(ENG_STATUS_DEADLINE_EXCEEDED, "sim: global ranks %d..%d waited %.0f s for global rank 0 to create "
                           "communicator %s (TENSORD_SIM_COMM_TIMEOUT)", cm->first, cm->first + cm->nlocal - 1, limit, cm->name);
        usleep(5000);
    }
}

eng_status sim_comm_new_ranks(const krn_comm_id *id, int nranks, int first, int nlocal, const int *devices,
                              krn_comm **out) {
    (void)devices;
    *out = NULL;
    const char *s = (const char *)id->bytes;
    size_t plen = strlen(sim_id_prefix);
    if (memchr(s, 0, sizeof id->bytes) == NULL || strncmp(s, sim_id_prefix, plen) != 0 || s[plen] != '/' ||
        strlen(s + plen) >= sizeof ((krn_comm *)0)->name)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "sim: the communicator id given to global ranks %d..%d is not a sim id "
                       "(made by another backend?)", first, first + nlocal - 1);
    krn_comm *cm;
    ENG_TRY(comm_alloc(nranks, first, nlocal, &cm));
    snprintf(cm->name, sizeof cm->name, "%s", s + plen);
    eng_status st = first == 0 ? seg_create(cm) : seg_open(cm);
    if (st != ENG_STATUS_OK) {
        comm_release(cm);
        return st;
    }
    sim_shm *sh = cm->sh;
    sh_lock(sh);
    pid_t *pids = sh_pids(sh);
    for (int i = 0; i < nlocal && st == ENG_STATUS_OK; i++) {
        if (pids[first + i] != 0) {
            char why[160];
            snprintf(why, sizeof why, "global rank %d joined twice (pids %d and %d)", first + i, (int)pids[first + i],
                     (int)getpid());
            sh_break(sh, why);
            st = broken_err(sh, first + i);
        }
        pids[first + i] = getpid();
    }
    if (st == ENG_STATUS_OK) {
        sh->joined += nlocal;
        pthread_cond_broadcast(&sh->cv);
        st = sh_wait(sh, first, "to join", all_joined, 0);
    }
    pthread_mutex_unlock(&sh->mu);
    if (st == ENG_STATUS_OK && cm->creator) { /* every rank has mapped it: the name is no longer needed */
        shm_unlink(cm->name);
        cm->unlinked = 1;
    }
    if (st != ENG_STATUS_OK) {
        comm_release(cm);
        return st;
    }
    *out = cm;
    return ENG_STATUS_OK;
}

eng_status sim_comm_allreduce(krn_comm *cm, int rank, krn_ctx *c, float *buf, size_t n, float prescale) {
    if (rank < 0 || rank >= cm->nlocal)
        return eng_err(ENG_STATUS_INTERNAL, "sim: local rank %d of a communicator with %d local ranks (%d in all)", rank,
                       cm->nlocal, cm->nranks);
    const krn_backend *b = krn_backend_sim();
    sim_shm *s = cm->sh;
    int g = cm->first + rank;
    sh_lens(s)[g] = n;
    ENG_TRY(sh_barrier(s, g, "at an all-reduce"));
    for (int r = 0; r < s->nranks; r++)
        if (sh_lens(s)[r] != n) {
            eng_status st = eng_err(ENG_STATUS_INTERNAL, "sim: all-reduce lengths differ: global rank %d passed %zu floats, "
                                    "global rank %d %llu", g, n, r, (unsigned long long)sh_lens(s)[r]);
            (void)sh_barrier(s, g, "after an all-reduce"); /* the lengths stay readable until all checked */
            return st;
        }
    float *mine = sh_slot(s, g), *sum = cm->tmp[rank];
    eng_status st = ENG_STATUS_OK;
    for (size_t off = 0; off < n || off == 0; off += SIM_COMM_CHUNK) {
        size_t k = n - off < SIM_COMM_CHUNK ? n - off : SIM_COMM_CHUNK;
        if (k) {
            eng_status e = krn_buf_get(b, c, mine, buf + off, k * sizeof(float));
            if (e != ENG_STATUS_OK) {
                if (st == ENG_STATUS_OK) st = e;
                memset(mine, 0, k * sizeof(float)); /* still joins every barrier */
            }
            for (size_t i = 0; i < k; i++) mine[i] *= prescale;
        }
        ENG_TRY(sh_barrier(s, g, "at an all-reduce"));
        for (size_t i = 0; i < k; i++) {
            float a = 0;
            for (int r = 0; r < s->nranks; r++) a += sh_slot(s, r)[i];
            sum[i] = a;
        }
        if (k && st == ENG_STATUS_OK) st = krn_buf_set(b, c, buf + off, sum, k * sizeof(float));
        ENG_TRY(sh_barrier(s, g, "after an all-reduce"));
        if (n == 0) break;
    }
    return st;
}

void sim_comm_free(krn_comm *cm) { comm_release(cm); }
