/* pbcheck.h - protobuf-c decoding with limits, for messages that come from clients (the gRPC front door). */
#ifndef SRV_PBCHECK_H
#define SRV_PBCHECK_H

#include <protobuf-c/protobuf-c.h>

#include "srv.h"

/* Walk msg's wire format with desc: 0 when well formed (no truncation, no groups, nesting within 32, field wire
 * types that fit) and protobuf-c's allocation for it (*cost, may be NULL) stays within limit; else -1 with err
 * set (INVALID_ARGUMENT naming the message, or RESOURCE_EXHAUSTED). */
int srv_pb_check(const ProtobufCMessageDescriptor *desc, const uint8_t *msg, size_t len, size_t limit,
                 size_t *cost, srv_error *err);
/* srv_pb_check, then unpack. NULL with err set. Free with protobuf_c_message_free_unpacked. */
ProtobufCMessage *srv_grpc_unpack(const ProtobufCMessageDescriptor *desc, const uint8_t *msg, size_t len,
                                  size_t limit, srv_error *err);

/* A bytes field pointing at n bytes at p (not copied). */
static inline ProtobufCBinaryData srv_pb_bytes(const void *p, size_t n) {
    ProtobufCBinaryData b = {n, (uint8_t *)p};
    return b;
}

#endif
