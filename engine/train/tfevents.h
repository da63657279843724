/* tfevents.h - TensorBoard event files (what tf.summary writes), for training scalars.
 *
 * A writer creates <dir>/events.out.tfevents.<unix time>.<hostname> (dir is created if missing) and writes
 * TFRecord-framed Event protos: the first record carries file_version "brain.Event:2", then one record per
 * scalar (Event{wall_time, step, summary{value{tag, simple_value}}}). Each record is flushed to the OS when
 * written, so TensorBoard sees progress while training runs. Protobuf is hand-encoded; no TF dependency.
 * A writer is not thread-safe; use one per thread or serialise.
 */
#ifndef ENG_TFEVENTS_H
#define ENG_TFEVENTS_H

#include <stddef.h>
#include <stdint.h>

#include "../ir/status.h"

typedef struct eng_tfevents eng_tfevents;

eng_status eng_tfevents_open(const char *dir, eng_tfevents **out);
/* Path of the event file (owned by the writer). */
const char *eng_tfevents_path(const eng_tfevents *w);
eng_status eng_tfevents_scalar(eng_tfevents *w, const char *tag, int64_t step, double wall_time, float value);
/* Flush, fsync and close; *w becomes NULL. Returns the first write error seen, if any. */
eng_status eng_tfevents_close(eng_tfevents **w);

/* Exposed for tests. CRC-32C (Castagnoli), and the TFRecord mask ((crc >> 15) | (crc << 17)) + 0xa282ead8. */
uint32_t eng_crc32c(const void *data, size_t n);
uint32_t eng_tfrecord_mask(uint32_t crc);
/* Frame `n` bytes as one TFRecord into out (n + 16 bytes). */
void eng_tfrecord_frame(const void *data, size_t n, uint8_t *out);
/* Encode an Event proto into buf (cap bytes); returns its length, or 0 if it does not fit. file_version
 * non-NULL: the file-version event (tag ignored); else a scalar summary event. */
size_t eng_tfevents_encode(uint8_t *buf, size_t cap, double wall_time, int64_t step, const char *file_version,
                           const char *tag, float value);

#endif
