/* train-ckpt.c - training checkpoints and the atomic file writer the trainer uses (see train-impl.h).
 *
 * Checkpoint layout (little-endian, the host's float32 bytes):
 *   "TDCKPT01"  u32 format version (1)  u32 reserved
 *   state: i64 epoch, step_in_epoch, global_step; u64 rng[4]; f64 ep_loss_sum, ep_acc_sum, ep_seconds;
 *          i64 ep_rows; f64 best; i64 best_epoch, wait; u64 fingerprint
 *   u64 nepochs, then per epoch: i64 epoch, 7 x f64 (loss, accuracy, val_loss, val_accuracy, lr, eps, seconds)
 *   u64 nsteps, then per step: i64 step, f64 loss
 *   u32 ntensors, then per tensor: u32 name length, name bytes, i64 n, n x f32
 *   u64 optimizer state bytes, the bytes
 *   u32 CRC-32 (zlib) of everything before it
 * A reader checks magic, version, every length against the bytes left, and the CRC before trusting anything.
 * Format changes bump the version; readers refuse versions they do not know, naming both.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "../ir/file-io.h"
#include "train-impl.h"

#define CKPT_MAGIC "TDCKPT01"
#define CKPT_VERSION 1u
#define CKPT_MAX_BYTES ((size_t)16 << 30)

/* ---- state bookkeeping ---- */

eng_status trn_state_add_epoch(trn_state *s, const trn_epoch *e) {
    if (s->nepochs == s->cap_epochs) {
        int64_t cap = s->cap_epochs ? s->cap_epochs * 2 : 16;
        trn_epoch *p = realloc(s->epochs, (size_t)cap * sizeof *p);
        if (!p) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
        s->epochs = p;
        s->cap_epochs = cap;
    }
    s->epochs[s->nepochs++] = *e;
    return ENG_STATUS_OK;
}

eng_status trn_state_add_step(trn_state *s, int64_t step, double loss) {
    if (s->nsteps >= TRN_MAX_STEPS_KEPT) return ENG_STATUS_OK;
    if (s->nsteps == s->cap_steps) {
        int64_t cap = s->cap_steps ? s->cap_steps * 2 : 256;
        trn_stepm *p = realloc(s->steps, (size_t)cap * sizeof *p);
        if (!p) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
        s->steps = p;
        s->cap_steps = cap;
    }
    s->steps[s->nsteps++] = (trn_stepm){step, loss};
    return ENG_STATUS_OK;
}

void trn_state_free(trn_state *s) {
    free(s->epochs);
    free(s->steps);
    s->epochs = NULL;
    s->steps = NULL;
    s->nepochs = s->cap_epochs = s->nsteps = s->cap_steps = 0;
}

/* ---- atomic writes with the test hook ---- */

static int64_t fail_after(void) {
    static int64_t v = -2;
    if (v == -2) {
        const char *e = getenv("TENSORD_TEST_FAIL_WRITE_AFTER");
        v = e && *e ? strtoll(e, NULL, 10) : -1;
    }
    return v;
}

static int64_t written_total; /* bytes written through trn_write_file by this process (test hook only) */

eng_status trn_write_file(const char *path, const void *buf, size_t n) {
    size_t pl = strlen(path);
    char *tmp = malloc(pl + 32);
    if (!tmp) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    const char *slash = strrchr(path, '/');
    size_t dl = slash ? (size_t)(slash - path) + 1 : 0;
    snprintf(tmp, pl + 32, "%.*s.tmp-%s-%d", (int)dl, path, path + dl, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        eng_status st = eng_err(ENG_STATUS_IO, "cannot create '%s': %s", path, strerror(errno));
        free(tmp);
        return st;
    }
    const uint8_t *p = buf;
    size_t off = 0;
    int err = 0;
    int64_t lim = fail_after();
    while (off < n && !err) {
        size_t chunk = n - off > (1u << 20) ? (1u << 20) : n - off;
        if (lim >= 0) {
            if (written_total >= lim) {
                err = ENOSPC;
                break;
            }
            if ((int64_t)chunk > lim - written_total) chunk = (size_t)(lim - written_total);
        }
        ssize_t k = write(fd, p + off, chunk);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            err = k < 0 ? errno : EIO;
            break;
        }
        off += (size_t)k;
        written_total += k;
    }
    if (!err && fsync(fd) != 0) err = errno;
    if (close(fd) != 0 && !err) err = errno;
    if (!err && rename(tmp, path) != 0) err = errno;
    if (err) {
        unlink(tmp);
        free(tmp);
        return eng_err(ENG_STATUS_IO, "writing '%s': %s", path, strerror(err));
    }
    free(tmp);
    char *dir = eng_file_dirname(path);
    if (!dir) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    eng_status st = eng_file_sync(dir);
    free(dir);
    return st;
}

/* ---- serialisation ---- */

typedef struct wbuf {
    uint8_t *p;
    size_t n, cap;
    int oom;
} wbuf;

static void wb_put(wbuf *b, const void *d, size_t n) {
    if (b->oom) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n) cap *= 2;
        uint8_t *q = realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}

static void wb_i64(wbuf *b, int64_t v) { wb_put(b, &v, 8); }
static void wb_u64(wbuf *b, uint64_t v) { wb_put(b, &v, 8); }
static void wb_u32(wbuf *b, uint32_t v) { wb_put(b, &v, 4); }
static void wb_f64(wbuf *b, double v) { wb_put(b, &v, 8); }

eng_status trn_ckpt_write(const char *path, const trn_state *st, const trn_ckpt_tensor *t, int nt, const void *optim,
                          size_t optim_len) {
    wbuf b = {0};
    wb_put(&b, CKPT_MAGIC, 8);
    wb_u32(&b, CKPT_VERSION);
    wb_u32(&b, 0);
    wb_i64(&b, st->epoch);
    wb_i64(&b, st->step_in_epoch);
    wb_i64(&b, st->global_step);
    for (int i = 0; i < 4; i++) wb_u64(&b, st->rng.s[i]);
    wb_f64(&b, st->ep_loss_sum);
    wb_f64(&b, st->ep_acc_sum);
    wb_f64(&b, st->ep_seconds);
    wb_i64(&b, st->ep_rows);
    wb_f64(&b, st->best);
    wb_i64(&b, st->best_epoch);
    wb_i64(&b, st->wait);
    wb_u64(&b, st->fingerprint);
    wb_u64(&b, (uint64_t)st->nepochs);
    for (int64_t i = 0; i < st->nepochs; i++) {
        const trn_epoch *e = &st->epochs[i];
        wb_i64(&b, e->epoch);
        double v[7] = {e->loss, e->accuracy, e->val_loss, e->val_accuracy, e->lr, e->examples_per_sec, e->seconds};
        wb_put(&b, v, sizeof v);
    }
    wb_u64(&b, (uint64_t)st->nsteps);
    for (int64_t i = 0; i < st->nsteps; i++) {
        wb_i64(&b, st->steps[i].step);
        wb_f64(&b, st->steps[i].loss);
    }
    wb_u32(&b, (uint32_t)nt);
    for (int i = 0; i < nt; i++) {
        size_t nl = strlen(t[i].name);
        wb_u32(&b, (uint32_t)nl);
        wb_put(&b, t[i].name, nl);
        wb_i64(&b, t[i].n);
        wb_put(&b, t[i].data, (size_t)t[i].n * sizeof(float));
    }
    wb_u64(&b, (uint64_t)optim_len);
    if (optim_len) wb_put(&b, optim, optim_len);
    uint32_t crc = b.oom ? 0 : (uint32_t)crc32(0L, b.p, (uInt)0);
    if (!b.oom) {
        /* zlib's crc32 takes uInt lengths: feed in chunks */
        size_t off = 0;
        while (off < b.n) {
            size_t k = b.n - off > (1u << 30) ? (1u << 30) : b.n - off;
            crc = (uint32_t)crc32(crc, b.p + off, (uInt)k);
            off += k;
        }
    }
    wb_u32(&b, crc);
    if (b.oom) {
        free(b.p);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory building checkpoint '%s'", path);
    }
    eng_status s = trn_write_file(path, b.p, b.n);
    free(b.p);
    return s;
}

typedef struct rbuf {
    const uint8_t *p;
    size_t n, pos;
    int bad;
} rbuf;

static void rb_get(rbuf *b, void *d, size_t n) {
    if (b->bad || n > b->n - b->pos) {
        b->bad = 1;
        memset(d, 0, n);
        return;
    }
    memcpy(d, b->p + b->pos, n);
    b->pos += n;
}

static int64_t rb_i64(rbuf *b) {
    int64_t v;
    rb_get(b, &v, 8);
    return v;
}
static uint64_t rb_u64(rbuf *b) {
    uint64_t v;
    rb_get(b, &v, 8);
    return v;
}
static uint32_t rb_u32(rbuf *b) {
    uint32_t v;
    rb_get(b, &v, 4);
    return v;
}
static double rb_f64(rbuf *b) {
    double v;
    rb_get(b, &v, 8);
    return v;
}

eng_status trn_ckpt_read(const char *path, trn_state *st, trn_ckpt_tensor *t, int nt, void **optim, size_t *optim_len) {
    *optim = NULL;
    *optim_len = 0;
    uint8_t *buf = NULL;
    size_t len = 0;
    ENG_TRY(eng_file_read(path, CKPT_MAX_BYTES, &buf, &len));
    eng_status s = ENG_STATUS_OK;
    int *seen = calloc((size_t)nt + 1, sizeof *seen);
    if (!seen) {
        free(buf);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    if (len < 20 || memcmp(buf, CKPT_MAGIC, 8) != 0) {
        s = eng_err(ENG_STATUS_INVALID_ARGUMENT, "checkpoint '%s': not a tensord checkpoint", path);
        goto out;
    }
    uint32_t want;
    memcpy(&want, buf + len - 4, 4);
    uint32_t crc = (uint32_t)crc32(0L, buf, (uInt)0);
    for (size_t off = 0; off < len - 4;) {
        size_t k = len - 4 - off > (1u << 30) ? (1u << 30) : len - 4 - off;
        crc = (uint32_t)crc32(crc, buf + off, (uInt)k);
        off += k;
    }
    if (crc != want) {
        s = eng_err(ENG_STATUS_INVALID_ARGUMENT, "checkpoint '%s': CRC mismatch (file is corrupt or truncated)", path);
        goto out;
    }
    rbuf b = {buf, len - 4, 8, 0};
    uint32_t ver = rb_u32(&b);
    rb_u32(&b);
    if (ver != CKPT_VERSION) {
        s = eng_err(ENG_STATUS_INVALID_ARGUMENT, "checkpoint '%s': format version %u, this build reads version %u", path,
                    ver, CKPT_VERSION);
        goto out;
    }
    trn_state_free(st);
    st->epoch = rb_i64(&b);
    st->step_in_epoch = rb_i64(&b);
    st->global_step = rb_i64(&b);
    for (int i = 0; i < 4; i++) st->rng.s[i] = rb_u64(&b);
    st->ep_loss_sum = rb_f64(&b);
    st->ep_acc_sum = rb_f64(&b);
    st->ep_seconds = rb_f64(&b);
    st->ep_rows = rb_i64(&b);
    st->best = rb_f64(&b);
    st->best_epoch = rb_i64(&b);
    st->wait = rb_i64(&b);
    st->fingerprint = rb_u64(&b);
    uint64_t ne = rb_u64(&b);
    if (ne > (b.n - b.pos) / 64) b.bad = 1;
    for (uint64_t i = 0; i < ne && !b.bad && s == ENG_STATUS_OK; i++) {
        trn_epoch e;
        e.epoch = rb_i64(&b);
        double v[7];
        rb_get(&b, v, sizeof v);
        e.loss = v[0], e.accuracy = v[1], e.val_loss = v[2], e.val_accuracy = v[3], e.lr = v[4];
        e.examples_per_sec = v[5], e.seconds = v[6];
        s = trn_state_add_epoch(st, &e);
    }
    uint64_t ns = rb_u64(&b);
    if (ns > (b.n - b.pos) / 16) b.bad = 1;
    for (uint64_t i = 0; i < ns && !b.bad && s == ENG_STATUS_OK; i++) {
        int64_t step = rb_i64(&b);
        s = trn_state_add_step(st, step, rb_f64(&b));
    }
    if (s != ENG_STATUS_OK) goto out;
    uint32_t ntf = rb_u32(&b);
    for (uint32_t i = 0; i < ntf && !b.bad; i++) {
        uint32_t nl = rb_u32(&b);
        if (nl > 4096 || nl > b.n - b.pos) {
            b.bad = 1;
            break;
        }
        char name[4097];
        rb_get(&b, name, nl);
        name[nl] = 0;
        int64_t n = rb_i64(&b);
        if (n < 0 || (uint64_t)n > (b.n - b.pos) / 4) {
            b.bad = 1;
            break;
        }
        int k = -1;
        for (int j = 0; j < nt; j++)
            if (strcmp(t[j].name, name) == 0) k = j;
        if (k < 0) {
            s = eng_err(ENG_STATUS_INVALID_ARGUMENT, "checkpoint '%s': tensor '%s' is not in the model being trained", path,
                        name);
            goto out;
        }
        if (n != t[k].n) {
            s = eng_err(ENG_STATUS_INVALID_ARGUMENT, "checkpoint '%s': tensor '%s' has %lld elements, the model's has %lld",
                        path, name, (long long)n, (long long)t[k].n);
            goto out;
        }
        rb_get(&b, t[k].data, (size_t)n * 4);
        seen[k] = 1;
    }
    uint64_t ol = rb_u64(&b);
    if (!b.bad && ol > b.n - b.pos) b.bad = 1;
    if (!b.bad && ol) {
        *optim = malloc(ol);
        if (!*optim) {
            s = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
            goto out;
        }
        rb_get(&b, *optim, ol);
        *optim_len = ol;
    }
    if (b.bad || b.pos != b.n) {
        s = eng_err(ENG_STATUS_INVALID_ARGUMENT, "checkpoint '%s': malformed (a length runs past the end of the file)", path);
        goto out;
    }
    for (int j = 0; j < nt; j++)
        if (!seen[j]) {
            s = eng_err(ENG_STATUS_INVALID_ARGUMENT, "checkpoint '%s' has no tensor '%s'", path, t[j].name);
            goto out;
        }
out:
    if (s != ENG_STATUS_OK) {
        free(*optim);
        *optim = NULL;
        *optim_len = 0;
    }
    free(seen);
    free(buf);
    return s;
}

/* ckpt-<step>.bin -> step, or -1 */
static int64_t ckpt_step(const char *name) {
    if (strncmp(name, "ckpt-", 5) != 0) return -1;
    char *end;
    errno = 0;
    long long v = strtoll(name + 5, &end, 10);
    if (errno || end == name + 5 || strcmp(end, ".bin") != 0 || v < 0) return -1;
    return v;
}

eng_status trn_ckpt_latest(const char *dir, char *path, size_t cap, int *found) {
    *found = 0;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return ENG_STATUS_OK;
        return eng_err(ENG_STATUS_IO, "cannot read checkpoint directory '%s': %s", dir, strerror(errno));
    }
    int64_t best = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t s = ckpt_step(e->d_name);
        if (s > best) best = s;
    }
    closedir(d);
    if (best < 0) return ENG_STATUS_OK;
    if (snprintf(path, cap, "%s/ckpt-%lld.bin", dir, (long long)best) >= (int)cap)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "checkpoint path too long");
    *found = 1;
    return ENG_STATUS_OK;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

void trn_ckpt_prune(const char *dir, int keep) {
    DIR *d = opendir(dir);
    if (!d) return;
    int64_t steps[4096];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 4096) {
        int64_t s = ckpt_step(e->d_name);
        if (s >= 0) steps[n++] = s;
    }
    closedir(d);
    qsort(steps, (size_t)n, sizeof *steps, cmp_i64);
    char p[4400];
    for (int i = 0; i + keep < n; i++) {
        snprintf(p, sizeof p, "%s/ckpt-%lld.bin", dir, (long long)steps[i]);
        unlink(p);
    }
}
