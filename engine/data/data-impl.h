/* data-impl.h - what the dataset readers (engine/data-*.c) share; not a public interface.
 *
 * A reader parses one file and adds its columns to the dataset being built with eng_data_add(), which takes
 * ownership of the column data, checks that N agrees with the columns already there, that names are unique and
 * that the total stays under ENG_DATA_MAX_BYTES. Readers allocate column data only through eng_data_alloc(),
 * which refuses absurd or over-the-cap sizes before allocating. Numbering in messages: lines are 1-based,
 * records and examples 0-based (records also give their byte offset).
 */
#ifndef ENG_DATA_IMPL_H
#define ENG_DATA_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "data.h"

/* Largest file (compressed or not) a reader accepts; bigger ones are refused before reading. */
#define ENG_DATA_MAX_FILE ((size_t)ENG_DATA_MAX_BYTES)

/* Read a whole file; gzip data (by its magic bytes, whatever the name) is inflated. At most `limit` bytes of
 * (uncompressed) content. Free *buf with free(). */
eng_status eng_data_read(const char *path, size_t limit, uint8_t **buf, size_t *len);
/* 1 if the file starts with the gzip magic. */
int eng_data_is_gzip(const char *path);

/* Allocate t->data for t's dtype and shape (rank >= 1, dims[0] = examples) for a column of dataset d, checking
 * overflow and the dataset cap (naming file and column). The data is eng_alloc'd. */
eng_status eng_data_alloc(const eng_dataset *d, eng_tensor *t, const char *file, const char *col);
/* Add a column (takes ownership of t->data even on failure: it is freed then). */
eng_status eng_data_add(eng_dataset *d, const char *name, eng_tensor *t, const char *file);
/* Fail on the first NaN/Inf of a float column, naming file, column and example. */
eng_status eng_data_check_finite(const char *file, const char *col, const eng_tensor *t);
/* Column name for a file or npz member stem: "y" and "labels" become "label". */
const char *eng_data_col_name(const char *stem);
/* Bytes used by the dataset's columns. */
int64_t eng_data_bytes(const eng_dataset *d);
/* Copy rows idx[0..k) of src (a column [N, ...]) into dst (rows [k, ...], same dtype, allocated). */
void eng_data_gather(const eng_tensor *src, const int64_t *idx, int64_t k, void *dst);

/* Readers (one per file; each adds its columns to d). */
eng_status eng_data_load_idx(eng_dataset *d, const char *path);
eng_status eng_data_load_npy(eng_dataset *d, const char *path);
eng_status eng_data_load_npz(eng_dataset *d, const char *path);
eng_status eng_data_load_csv(eng_dataset *d, const char *path);
eng_status eng_data_load_jsonl(eng_dataset *d, const char *path);
eng_status eng_data_load_tfrecord(eng_dataset *d, const char *path);

#endif
