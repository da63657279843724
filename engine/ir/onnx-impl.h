/* onnx-impl.h - internals shared by onnx-load.c, onnx-tensor.c and onnx-save.c (not a public header).
 *
 * The protobuf-c types come from build/gen/onnx.pb-c.h, generated from /usr/include/onnx/onnx.proto.
 * Invariants: every function here reports failures through eng_err with a message naming the tensor, node or
 * field, but not the file: the public entry points prefix the file/source name once.
 */
#ifndef ENG_ONNX_IMPL_H
#define ENG_ONNX_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "onnx.h"
#include "onnx.pb-c.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tensord's ONNX/npy readers assume a little-endian host (raw_data is little-endian)"
#endif

/* Deepest protobuf message nesting accepted before unpacking (protobuf-c recurses once per level). */
#define ENG_ONNX_MAX_MSG_DEPTH 160
/* Deepest subgraph nesting (If/Loop/Scan bodies inside bodies). */
#define ENG_ONNX_MAX_GRAPH_DEPTH 32
/* Largest serialized model/tensor file (protobuf's own 2 GiB limit). */
#define ENG_ONNX_MAX_FILE_BYTES ((size_t)INT32_MAX)

/* Walk the wire format of `buf` as message type `d` and refuse nesting deeper than ENG_ONNX_MAX_MSG_DEPTH,
 * so protobuf-c's recursive unpacker cannot exhaust the stack. Malformed wire data is left for protobuf-c to
 * reject. Cost: one pass over the bytes. */
eng_status eng_onnx_check_nesting(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len);

/* Decode a TensorProto into a new tensor (malloc'd struct, eng_alloc'd data). base_dir NULL refuses external
 * data. Errors name the tensor ("tensor 'W': ..."). */
eng_status eng_onnx_tensor_decode(const Onnx__TensorProto *tp, const char *base_dir, eng_tensor **out);

#endif
