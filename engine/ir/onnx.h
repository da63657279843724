/* onnx.h - reading and writing ONNX models and TensorProto files (protobuf-c code generated at build time from
 * /usr/include/onnx/onnx.proto; nothing of ONNX is vendored).
 *
 * Loading validates everything it copies: sizes against the bytes present, dtype/shape arithmetic against
 * overflow and ENG_MAX_TENSOR_BYTES, names and references, external-data paths (relative, inside the model's
 * directory, no "..", no absolute paths). A corrupt file yields ENG_STATUS_INVALID_MODEL with a message naming
 * the file and the offending tensor/node/field; it never crashes.
 */
#ifndef ENG_ONNX_H
#define ENG_ONNX_H

#include <stddef.h>

#include "graph.h"

/* Load a model file; external data is resolved relative to the file's directory. */
eng_status eng_onnx_load_file(const char *path, eng_graph **out);
/* Load from memory. base_dir NULL: a model that uses external data is refused. `what` names the source in errors. */
eng_status eng_onnx_load_buffer(const void *buf, size_t len, const char *base_dir, const char *what, eng_graph **out);

/* Write the graph as a model file, atomically (temp file in the same directory, fsync, rename, fsync dir).
 * Initializers larger than external_threshold bytes go to "<basename>.data" beside it (written the same way);
 * external_threshold 0 keeps every initializer inline. load(save(g)) computes the same outputs as g. */
eng_status eng_onnx_save_file(const eng_graph *g, const char *path, size_t external_threshold);

/* Read a serialized TensorProto (e.g. the ONNX backend tests' input_0.pb). *name gets a malloc'd copy of the
 * tensor's name (may be ""); pass NULL to ignore. Free the tensor with eng_tensor_destroy. */
eng_status eng_onnx_tensor_load_file(const char *path, eng_tensor **out, char **name);
/* A serialized SequenceProto of tensors (ONNX test data) as a sequence value (engine/ir/seq.h): *out malloc'd, its
 * data one eng_alloc block; free with eng_tensor_destroy. */
eng_status eng_onnx_seq_load_file(const char *path, eng_tensor **out);

#endif
