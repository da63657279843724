/* file-io.h - whole-file reads with size limits and atomic writes (temp file in the same directory, fsync,
 * rename, fsync of the directory), plus fsync by path and flat directory removal. Used by the ONNX and npy
 * readers/writers, the bundle writer (engine/bundle.c) and the trainer's checkpoints.
 *
 * Invariants: a reader never allocates more than the file's size (bounded by `limit`); a writer never leaves a
 * partial file at the destination path: either the old file or the complete new one is visible, and on failure
 * the temp file is removed. Errors name the path.
 * Every read goes through eng_file_open_regular: a reader never blocks in open() (a FIFO, a device) and never
 * reads anything but a regular file.
 */
#ifndef ENG_FILE_IO_H
#define ENG_FILE_IO_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* Open path for reading without blocking on it: symlinks resolved (with root non-NULL the resolved path must
 * lie inside realpath(root), else INVALID_ARGUMENT naming both), nothing but a regular file opened, and that
 * with O_RDONLY|O_NONBLOCK|O_CLOEXEC, so a FIFO or device never stalls the caller. Anything else is refused
 * naming the path and what it is ("'p' is a FIFO, not a regular file"). *fd: close() it; *size: its size.
 * NOT_FOUND when path does not exist. Thread-safe (the message goes to this thread's eng_last_error). */
eng_status eng_file_open_regular(const char *path, const char *root, int *fd, uint64_t *size);

/* Read a whole regular file (at most `limit` bytes) into a malloc'd buffer (free with free()). Opens it with
 * eng_file_open_regular (no root). */
eng_status eng_file_read(const char *path, size_t limit, uint8_t **buf, size_t *len);

/* Directory part of path ("." if none, "/" for "/x"), malloc'd; NULL on allocation failure. */
char *eng_file_dirname(const char *path);

/* fsync a file or a directory by path. A directory's EINVAL (filesystems that cannot sync one) is not an error. */
eng_status eng_file_sync(const char *path);
/* Remove the entries directly in dir (files, empty subdirectories), then dir itself. Not recursive; failures
 * are ignored (it cleans up after an error, e.g. a half-written version or checkpoint directory). */
void eng_file_remove_dir(const char *dir);

typedef struct eng_atomic_file {
    int fd;     /* -1 when closed */
    char *tmp;  /* "<dir>/.tmp-<name>-<pid>" */
    char *path; /* destination */
    uint64_t size; /* bytes written so far */
} eng_atomic_file;

/* Create the temp file beside `path`. On failure *f is left closed (fd -1, nothing to clean). */
eng_status eng_atomic_open(eng_atomic_file *f, const char *path);
eng_status eng_atomic_write(eng_atomic_file *f, const void *buf, size_t n);
/* fsync, close, rename over the destination, fsync the directory. The file is closed either way. */
eng_status eng_atomic_commit(eng_atomic_file *f);
/* Close and remove the temp file (no-op if closed). */
void eng_atomic_abort(eng_atomic_file *f);

#endif
