/* data.h - training data: readers into in-memory columns, validation split, and a shuffling, batching loader
 * with a background prefetch thread (what tf.data gives a Keras user).
 *
 * A dataset is a set of named columns, each a tensor [N, ...] with the same N (examples). Readers:
 *   IDX (MNIST/Fashion-MNIST layout, raw or .gz): an images file (rank >= 2) becomes column "x" as float32
 *     in [0, 1] (uint8 / 255); a rank-1 file becomes column "label" (int64). Give both files.
 *   NPY (.npy): one array -> column named after the file stem ("x.npy" -> "x", "y.npy"/"labels.npy" -> "label").
 *   NPZ (.npz, stored or deflated): one column per member (member "y" or "labels" -> "label").
 *   CSV (.csv): header row; numeric columns; the column named "label" (or the last one if none is) is the
 *     label; the others form column "x" [N, ncols] float32.
 *   JSONL (.jsonl): {"inputs": {"name": value-or-nested-list, ...}, "label": number-or-list} per line.
 *   TFRecord (.tfrecord, .tfrecords; optionally .gz) of tf.train.Example: each feature -> a column
 *     (float_list -> float32, int64_list -> int64; bytes_list -> UNSUPPORTED unless all same length, then
 *     uint8 [N, len]); feature "label" is the label. CRCs are checked.
 * Every malformed record yields ENG_STATUS_INVALID_ARGUMENT naming the file and the record (line) number;
 * NaN/Inf in float data is an error naming file, column and example; an empty dataset is an error.
 */
#ifndef ENG_DATA_H
#define ENG_DATA_H

#include <stdint.h>

#include "../ir/tensor.h"

typedef struct eng_data_column {
    char *name;
    eng_tensor t; /* [N, ...]; data owned (eng_alloc) */
} eng_data_column;

typedef struct eng_dataset {
    eng_data_column *cols;
    int ncols;
    int64_t n;        /* examples */
    char *source;     /* description for messages ("train-images-idx3-ubyte.gz + ...") */
} eng_dataset;

/* Load and join files (their columns are merged; all must agree on N). */
eng_status eng_dataset_load(const char *const *files, int nfiles, eng_dataset **out);
void eng_dataset_free(eng_dataset **d);
/* Column index by name, -1 if absent. */
int eng_dataset_find(const eng_dataset *d, const char *name);

/* Deterministic split: a seeded permutation, the last round(n * val_fraction) examples go to val.
 * Both results are new datasets (copies); d is unchanged. val_fraction in (0, 1). */
eng_status eng_dataset_split(const eng_dataset *d, double val_fraction, uint64_t seed, eng_dataset **train,
                             eng_dataset **val);

/* Make column `col` fit a model input of dtype dt and shape dims (dims[0] = -1 for the batch; other -1 dims
 * are free): converts the dtype and reshapes each example when its element count matches (e.g. [N,28,28] ->
 * [N,1,28,28] or [N,784]). Error names the column, the model input and both shapes. Writes a one-line
 * description of what was done into desc (for signature.json's "preprocessing"). */
eng_status eng_dataset_fit(eng_dataset *d, const char *col, const char *input_name, eng_dtype dt, int ndim,
                           const int64_t *dims, char *desc, size_t desc_len);

typedef struct eng_loader eng_loader;

typedef struct eng_loader_opts {
    int64_t batch_size;
    int shuffle;             /* reshuffle every epoch (seeded by seed + epoch) */
    uint64_t seed;
    int drop_remainder;      /* drop the last partial batch */
    int prefetch;            /* batches prepared ahead by the background thread (0: no thread) */
} eng_loader_opts;

/* A batch: one tensor per dataset column, in column order, [B, ...]; views valid until the next call. */
typedef struct eng_batch {
    const eng_tensor *cols;
    int ncols;
    int64_t rows;
    int64_t epoch, step;     /* position of this batch */
} eng_batch;

/* The loader reads d's columns (it does not copy them): d must outlive it and not change (no fit) meanwhile.
 * One caller thread uses a loader; its own prefetch thread is internal. Memory: (prefetch + 1) batches. */
eng_status eng_loader_new(const eng_dataset *d, const eng_loader_opts *o, eng_loader **out);
/* Next batch of the current epoch; *end is set to 1 (and no batch returned) at the end of an epoch, after
 * which the next call starts the next epoch. */
eng_status eng_loader_next(eng_loader *l, eng_batch *b, int *end);
/* Position the loader at (epoch, step) so a resumed run sees exactly the batches an uninterrupted one would. */
eng_status eng_loader_seek(eng_loader *l, int64_t epoch, int64_t step);
int64_t eng_loader_steps_per_epoch(const eng_loader *l);
void eng_loader_free(eng_loader **l);

/* Deterministic PRNG shared by data loading and training (weight init, dropout): xoshiro256** (Blackman and
 * Vigna) seeded through splitmix64, so any 64-bit seed (0 included) gives a good state. The same seed gives the
 * same stream on every platform. Not for cryptography. A state is plain data: copy it to fork a stream. */
typedef struct eng_rng {
    uint64_t s[4];
} eng_rng;

void eng_rng_seed(eng_rng *r, uint64_t seed);
uint64_t eng_rng_u64(eng_rng *r);
/* Uniform in [0, n) without modulo bias (Lemire's method); n > 0. */
uint64_t eng_rng_below(eng_rng *r, uint64_t n);
/* float in [0, 1): the top 24 bits of one draw. */
float eng_rng_uniform(eng_rng *r);
/* Standard normal (Box-Muller; two draws per call, no cached second value, so the stream stays simple). */
float eng_rng_normal(eng_rng *r);
/* perm[i] = i, then a Fisher-Yates shuffle driven by r. */
void eng_rng_permutation(eng_rng *r, int64_t *perm, int64_t n);

/* Total bytes a dataset may hold in memory; a load that would exceed it fails before allocating. */
#define ENG_DATA_MAX_BYTES ((int64_t)8 << 30)

#endif
