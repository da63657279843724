/* tfevents.c - TensorBoard event file writer (see tfevents.h).
 *
 * Record framing (TFRecord): uint64 length (LE), uint32 masked CRC-32C of those 8 bytes, the data, uint32
 * masked CRC-32C of the data. Event proto fields: wall_time = 1 (double), step = 2 (int64), file_version = 3
 * (string), summary = 5 (Summary{value = 1 repeated Value{tag = 1 string, simple_value = 2 float}}).
 */
#include "tfevents.h"

#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct eng_tfevents {
    int fd;
    char *path;
    eng_status err;
};

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[i] = c;
    }
}

uint32_t eng_crc32c(const void *data, size_t n) {
    pthread_once(&crc_once, crc_init);
    const uint8_t *p = data;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

uint32_t eng_tfrecord_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

static void put_le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void put_le64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

void eng_tfrecord_frame(const void *data, size_t n, uint8_t *out) {
    put_le64(out, (uint64_t)n);
    put_le32(out + 8, eng_tfrecord_mask(eng_crc32c(out, 8)));
    memcpy(out + 12, data, n);
    put_le32(out + 12 + n, eng_tfrecord_mask(eng_crc32c(data, n)));
}

/* protobuf encoding into a bounded buffer; pos past cap marks overflow */
typedef struct pb {
    uint8_t *buf;
    size_t cap, pos;
} pb;

static void pb_byte(pb *b, uint8_t v) {
    if (b->pos < b->cap) b->buf[b->pos] = v;
    b->pos++;
}

static void pb_varint(pb *b, uint64_t v) {
    while (v >= 0x80) {
        pb_byte(b, (uint8_t)(v | 0x80));
        v >>= 7;
    }
    pb_byte(b, (uint8_t)v);
}

static void pb_tag(pb *b, int field, int wire) { pb_varint(b, ((uint64_t)field << 3) | (uint64_t)wire); }

static void pb_bytes(pb *b, int field, const void *d, size_t n) {
    pb_tag(b, field, 2);
    pb_varint(b, n);
    for (size_t i = 0; i < n; i++) pb_byte(b, ((const uint8_t *)d)[i]);
}

static void pb_fixed64(pb *b, int field, uint64_t v) {
    pb_tag(b, field, 1);
    for (int i = 0; i < 8; i++) pb_byte(b, (uint8_t)(v >> (8 * i)));
}

static void pb_fixed32(pb *b, int field, uint32_t v) {
    pb_tag(b, field, 5);
    for (int i = 0; i < 4; i++) pb_byte(b, (uint8_t)(v >> (8 * i)));
}

size_t eng_tfevents_encode(uint8_t *buf, size_t cap, double wall_time, int64_t step, const char *file_version,
                           const char *tag, float value) {
    pb b = {buf, cap, 0};
    uint64_t wt;
    memcpy(&wt, &wall_time, 8);
    pb_fixed64(&b, 1, wt);
    if (step != 0) {
        pb_tag(&b, 2, 0);
        pb_varint(&b, (uint64_t)step);
    }
    if (file_version) {
        pb_bytes(&b, 3, file_version, strlen(file_version));
    } else {
        /* Value{tag, simple_value} inside Summary{value} inside Event{summary} */
        uint8_t val[1200];
        pb v = {val, sizeof val, 0};
        size_t tl = strlen(tag);
        if (tl > 1024) return 0;
        pb_bytes(&v, 1, tag, tl);
        uint32_t fv;
        memcpy(&fv, &value, 4);
        pb_fixed32(&v, 2, fv);
        uint8_t sum[1300];
        pb s = {sum, sizeof sum, 0};
        pb_bytes(&s, 1, val, v.pos);
        pb_bytes(&b, 5, sum, s.pos);
    }
    return b.pos <= cap ? b.pos : 0;
}

static eng_status ev_write(eng_tfevents *w, const uint8_t *ev, size_t n) {
    uint8_t rec[1400];
    if (n + 16 > sizeof rec) return eng_err(ENG_STATUS_INTERNAL, "event too large");
    eng_tfrecord_frame(ev, n, rec);
    size_t off = 0, len = n + 16;
    while (off < len) {
        ssize_t k = write(w->fd, rec + off, len - off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            w->err = eng_err(ENG_STATUS_IO, "writing TensorBoard events '%s': %s", w->path, k < 0 ? strerror(errno) : "short write");
            return w->err;
        }
        off += (size_t)k;
    }
    return ENG_STATUS_OK;
}

static double now_wall(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static eng_status mkdirs(const char *dir) {
    char p[4096];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof p) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "bad log directory '%s'", dir);
    memcpy(p, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] == '/' || p[i] == 0) {
            char c = p[i];
            p[i] = 0;
            if (mkdir(p, 0755) != 0 && errno != EEXIST)
                return eng_err(ENG_STATUS_IO, "cannot create directory '%s': %s", p, strerror(errno));
            p[i] = c;
        }
    }
    return ENG_STATUS_OK;
}

eng_status eng_tfevents_open(const char *dir, eng_tfevents **out) {
    *out = NULL;
    ENG_TRY(mkdirs(dir));
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    double t = now_wall();
    size_t n = strlen(dir) + strlen(host) + 64;
    eng_tfevents *w = calloc(1, sizeof *w);
    char *path = malloc(n);
    if (!w || !path) {
        free(w);
        free(path);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    snprintf(path, n, "%s/events.out.tfevents.%lld.%s", dir, (long long)t, host);
    w->path = path;
    w->fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        eng_status st = eng_err(ENG_STATUS_IO, "cannot create '%s': %s", path, strerror(errno));
        free(path);
        free(w);
        return st;
    }
    uint8_t ev[256];
    size_t len = eng_tfevents_encode(ev, sizeof ev, t, 0, "brain.Event:2", NULL, 0);
    eng_status st = ev_write(w, ev, len);
    if (st != ENG_STATUS_OK) {
        close(w->fd);
        free(path);
        free(w);
        return st;
    }
    *out = w;
    return ENG_STATUS_OK;
}

const char *eng_tfevents_path(const eng_tfevents *w) { return w->path; }

eng_status eng_tfevents_scalar(eng_tfevents *w, const char *tag, int64_t step, double wall_time, float value) {
    uint8_t ev[1400];
    size_t len = eng_tfevents_encode(ev, sizeof ev - 16, wall_time > 0 ? wall_time : now_wall(), step, NULL, tag, value);
    if (len == 0) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "TensorBoard tag '%.64s...' too long", tag);
    return ev_write(w, ev, len);
}

eng_status eng_tfevents_close(eng_tfevents **wp) {
    if (!wp || !*wp) return ENG_STATUS_OK;
    eng_tfevents *w = *wp;
    eng_status st = w->err;
    if (fsync(w->fd) != 0 && st == ENG_STATUS_OK && errno != EINVAL)
        st = eng_err(ENG_STATUS_IO, "fsync '%s': %s", w->path, strerror(errno));
    if (close(w->fd) != 0 && st == ENG_STATUS_OK) st = eng_err(ENG_STATUS_IO, "close '%s': %s", w->path, strerror(errno));
    free(w->path);
    free(w);
    *wp = NULL;
    return st;
}
