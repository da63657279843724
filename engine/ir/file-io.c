/* file-io.c - bounded whole-file reads, atomic writes, fsync by path, flat directory removal (see file-io.h). */
#include "file-io.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

eng_status eng_file_read(const char *path, size_t limit, uint8_t **buf, size_t *len) {
    *buf = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return eng_err(errno == ENOENT ? ENG_STATUS_NOT_FOUND : ENG_STATUS_IO, "%s: cannot open: %s", path,
                       strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return eng_err(ENG_STATUS_IO, "%s: not a regular file", path);
    }
    if ((uint64_t)sb.st_size > limit) {
        close(fd);
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: file is %lld bytes, more than the limit of %zu", path,
                       (long long)sb.st_size, limit);
    }
    size_t n = (size_t)sb.st_size;
    uint8_t *b = malloc(n ? n : 1);
    if (!b) {
        close(fd);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes", path, n);
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, b + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = errno;
            free(b);
            close(fd);
            return eng_err(ENG_STATUS_IO, "%s: read failed at byte %zu of %zu: %s", path, got, n,
                           r == 0 ? "file shrank" : strerror(e));
        }
        got += (size_t)r;
    }
    close(fd);
    *buf = b;
    *len = n;
    return ENG_STATUS_OK;
}

char *eng_file_dirname(const char *path) {
    const char *slash = strrchr(path, '/');
    size_t n = slash ? (size_t)(slash - path) : 1;
    if (slash && n == 0) n = 1;
    char *d = malloc(n + 1);
    if (!d) return NULL;
    if (slash) memcpy(d, path, n);
    else d[0] = '.';
    d[n] = '\0';
    return d;
}

eng_status eng_file_sync(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return eng_err(ENG_STATUS_IO, "cannot open '%s' to fsync it: %s", path, strerror(errno));
    struct stat sb;
    int is_dir = fstat(fd, &sb) == 0 && S_ISDIR(sb.st_mode);
    int rc = fsync(fd), e = errno;
    close(fd);
    if (rc != 0 && !(is_dir && e == EINVAL))
        return eng_err(ENG_STATUS_IO, "fsync of %s '%s': %s", is_dir ? "directory" : "file", path, strerror(e));
    return ENG_STATUS_OK;
}

void eng_file_remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    size_t cap = strlen(dir) + 258;
    char *p = malloc(cap);
    while (p && (e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(p, cap, "%s/%s", dir, e->d_name);
        if (unlink(p) != 0 && errno == EISDIR) rmdir(p);
    }
    free(p);
    closedir(d);
    rmdir(dir);
}

eng_status eng_atomic_open(eng_atomic_file *f, const char *path) {
    memset(f, 0, sizeof *f);
    f->fd = -1;
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (!*base) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: not a file path", path);
    size_t dl = slash ? (size_t)(slash - path) + 1 : 0;
    size_t n = strlen(path) + 64;
    f->tmp = malloc(n);
    f->path = strdup(path);
    if (!f->tmp || !f->path) {
        free(f->tmp);
        free(f->path);
        memset(f, 0, sizeof *f);
        f->fd = -1;
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    snprintf(f->tmp, n, "%.*s.tmp-%s-%ld", (int)dl, path, base, (long)getpid());
    f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f->fd < 0) {
        eng_status st = eng_err(ENG_STATUS_IO, "%s: cannot create temp file '%s': %s", path, f->tmp, strerror(errno));
        free(f->tmp);
        free(f->path);
        memset(f, 0, sizeof *f);
        f->fd = -1;
        return st;
    }
    return ENG_STATUS_OK;
}

eng_status eng_atomic_write(eng_atomic_file *f, const void *buf, size_t n) {
    const char *p = buf;
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(f->fd, p + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            return eng_err(ENG_STATUS_IO, "%s: write failed after %llu bytes: %s", f->path,
                           (unsigned long long)(f->size + done), w == 0 ? "no progress" : strerror(errno));
        done += (size_t)w;
    }
    f->size += n;
    return ENG_STATUS_OK;
}

static void eng_atomic_release(eng_atomic_file *f) {
    free(f->tmp);
    free(f->path);
    f->tmp = f->path = NULL;
    f->fd = -1;
}

eng_status eng_atomic_commit(eng_atomic_file *f) {
    if (f->fd < 0) return eng_err(ENG_STATUS_INTERNAL, "atomic commit of a closed file");
    eng_status st = ENG_STATUS_OK;
    if (fsync(f->fd) != 0) st = eng_err(ENG_STATUS_IO, "%s: fsync failed: %s", f->path, strerror(errno));
    if (close(f->fd) != 0 && st == ENG_STATUS_OK)
        st = eng_err(ENG_STATUS_IO, "%s: close failed: %s", f->path, strerror(errno));
    f->fd = -1;
    if (st == ENG_STATUS_OK && rename(f->tmp, f->path) != 0)
        st = eng_err(ENG_STATUS_IO, "%s: rename from '%s' failed: %s", f->path, f->tmp, strerror(errno));
    if (st != ENG_STATUS_OK) {
        unlink(f->tmp);
        eng_atomic_release(f);
        return st;
    }
    char *dir = eng_file_dirname(f->path);
    if (dir) {
        int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            if (fsync(dfd) != 0) st = eng_err(ENG_STATUS_IO, "%s: fsync of directory '%s' failed: %s", f->path, dir,
                                              strerror(errno));
            close(dfd);
        }
        free(dir);
    }
    eng_atomic_release(f);
    return st;
}

void eng_atomic_abort(eng_atomic_file *f) {
    if (f->fd >= 0) {
        close(f->fd);
        unlink(f->tmp);
    }
    eng_atomic_release(f);
}
