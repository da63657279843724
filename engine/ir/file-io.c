/* file-io.c - bounded whole-file reads through one non-blocking opener, atomic writes, fsync by path, flat
 * directory removal (see file-io.h). */
#include "file-io.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *eng_file_kind(mode_t m) {
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISDIR(m)) return "a directory";
    if (S_ISSOCK(m)) return "a socket";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISLNK(m)) return "a symbolic link";
    return "not a plain file";
}

/* 1 if the resolved path rp lies inside the resolved directory rroot. */
static int eng_file_inside(const char *rp, const char *rroot) {
    size_t n = strlen(rroot);
    if (n == 1 && rroot[0] == '/') return rp[0] == '/';
    return strncmp(rp, rroot, n) == 0 && rp[n] == '/';
}

eng_status eng_file_open_regular(const char *path, const char *root, int *fd, uint64_t *size) {
    *fd = -1;
    *size = 0;
    char *rp = realpath(path, NULL);
    if (!rp) {
        int e = errno;
        return eng_err(e == ENOENT ? ENG_STATUS_NOT_FOUND : ENG_STATUS_IO, "%s: cannot open: %s", path, strerror(e));
    }
    eng_status st = ENG_STATUS_OK;
    if (root) {
        char *rr = realpath(root, NULL);
        if (!rr) st = eng_err(ENG_STATUS_IO, "%s: cannot resolve the directory '%s': %s", path, root, strerror(errno));
        else if (!eng_file_inside(rp, rr))
            st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "'%s' resolves to '%s', outside the directory '%s'", path, rp, rr);
        free(rr);
    }
    struct stat sb, fb;
    if (st == ENG_STATUS_OK && stat(rp, &sb) != 0)
        st = eng_err(errno == ENOENT ? ENG_STATUS_NOT_FOUND : ENG_STATUS_IO, "%s: cannot open: %s", path,
                     strerror(errno));
    if (st == ENG_STATUS_OK && !S_ISREG(sb.st_mode)) /* refused before open(): a device is never even opened */
        st = eng_err(ENG_STATUS_IO, "'%s' is %s, not a regular file", path, eng_file_kind(sb.st_mode));
    int f = -1;
    if (st == ENG_STATUS_OK && (f = open(rp, O_RDONLY | O_NONBLOCK | O_CLOEXEC)) < 0)
        st = eng_err(errno == ENOENT ? ENG_STATUS_NOT_FOUND : ENG_STATUS_IO, "%s: cannot open: %s", path,
                     strerror(errno));
    if (st == ENG_STATUS_OK && fstat(f, &fb) != 0)
        st = eng_err(ENG_STATUS_IO, "%s: cannot stat: %s", path, strerror(errno));
    else if (st == ENG_STATUS_OK && !S_ISREG(fb.st_mode)) /* replaced between stat() and open() */
        st = eng_err(ENG_STATUS_IO, "'%s' is %s, not a regular file", path, eng_file_kind(fb.st_mode));
    free(rp);
    if (st != ENG_STATUS_OK) {
        if (f >= 0) close(f);
        return st;
    }
    *fd = f;
    *size = (uint64_t)fb.st_size;
    return ENG_STATUS_OK;
}

eng_status eng_file_read(const char *path, size_t limit, uint8_t **buf, size_t *len) {
    *buf = NULL;
    *len = 0;
    int fd;
    uint64_t size;
    ENG_TRY(eng_file_open_regular(path, NULL, &fd, &size));
    if (size > limit) {
        close(fd);
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: file is %llu bytes, more than the limit of %zu", path,
                       (unsigned long long)size, limit);
    }
    size_t n = (size_t)size;
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
