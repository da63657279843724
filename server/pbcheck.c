/* pbcheck.c - decoding protobuf messages from clients with limits (see pbcheck.h). protobuf-c allocates
 * while it unpacks: a 64 MiB message of tiny sub-messages or packed varints would cost many times its size. So
 * the wire format is walked first with the message's descriptor, counting what the unpack will allocate.
 */
#include <stdlib.h>

#include "pbcheck.h"

static size_t pb_scalar_size(ProtobufCType t) {
    switch (t) {
    case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64: case PROTOBUF_C_TYPE_DOUBLE:
        return 8;
    default:
        return 4; /* int32, enums, floats, bools (protobuf_c_boolean is an int) */
    }
}

static int pb_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
    uint64_t x = 0;
    for (int s = 0; s < 70; s += 7) {
        if (*p >= end) return -1;
        uint8_t b = *(*p)++;
        x |= (uint64_t)(b & 0x7f) << s;
        if (!(b & 0x80)) {
            *v = x;
            return 0;
        }
    }
    return -1;
}

typedef struct pb_walk {
    size_t cost, limit;
    srv_error *err;
} pb_walk;

/* Walk one message's wire format with its descriptor: well-formed (no truncation, no groups, nesting within
 * 32), and add to w->cost what protobuf-c will allocate for it. */
static int pb_walk_msg(pb_walk *w, const ProtobufCMessageDescriptor *d, const uint8_t *p, const uint8_t *end,
                       int depth) {
    if (depth > 32) {
        srv_err(w->err, SRV_INVALID_ARGUMENT, "%s: messages nested deeper than 32", d->name);
        return -1;
    }
    w->cost += d->sizeof_message;
    while (p < end) {
        uint64_t key, v;
        if (pb_varint(&p, end, &key) != 0 || (key >> 3) == 0 || (key >> 3) > 0x1fffffff) goto bad;
        unsigned wt = key & 7;
        const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3));
        size_t n = 0;
        const uint8_t *val = p;
        switch (wt) {
        case 0: if (pb_varint(&p, end, &v) != 0) goto bad; break;
        case 1: if (end - p < 8) goto bad; p += 8; break;
        case 5: if (end - p < 4) goto bad; p += 4; break;
        case 2:
            if (pb_varint(&p, end, &v) != 0 || v > (uint64_t)(end - p)) goto bad;
            val = p;
            n = (size_t)v;
            p += n;
            break;
        default: goto bad; /* groups (3, 4) and reserved types */
        }
        if (!f) {
            w->cost += 48 + (size_t)(p - val); /* kept as an unknown field */
        } else if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
            if (wt != 2) goto bad;
            if (f->label == PROTOBUF_C_LABEL_REPEATED) w->cost += sizeof(void *);
            if (pb_walk_msg(w, f->descriptor, val, val + n, depth + 1) != 0) return -1;
        } else if (f->type == PROTOBUF_C_TYPE_STRING || f->type == PROTOBUF_C_TYPE_BYTES) {
            if (wt != 2) goto bad;
            w->cost += n + 1 + (f->label == PROTOBUF_C_LABEL_REPEATED ? sizeof(ProtobufCBinaryData) : 0);
        } else if (wt == 2) { /* packed scalars */
            size_t count = 0;
            if (f->type == PROTOBUF_C_TYPE_FIXED32 || f->type == PROTOBUF_C_TYPE_SFIXED32 || f->type == PROTOBUF_C_TYPE_FLOAT)
                count = n / 4;
            else if (f->type == PROTOBUF_C_TYPE_FIXED64 || f->type == PROTOBUF_C_TYPE_SFIXED64 || f->type == PROTOBUF_C_TYPE_DOUBLE)
                count = n / 8;
            else
                for (size_t i = 0; i < n; i++) count += !(val[i] & 0x80);
            w->cost += count * pb_scalar_size(f->type);
        } else {
            w->cost += pb_scalar_size(f->type);
        }
        if (w->cost > w->limit) {
            srv_err(w->err, SRV_RESOURCE_EXHAUSTED,
                    "%s: decoding it would take more than %zu bytes of memory (send large tensors as "
                    "tensor_content / raw_input_contents)", d->name, w->limit);
            return -1;
        }
    }
    return 0;
bad:
    srv_err(w->err, SRV_INVALID_ARGUMENT, "%s: the request is not a valid protobuf message (truncated or corrupt)",
            d->name);
    return -1;
}

int srv_pb_check(const ProtobufCMessageDescriptor *desc, const uint8_t *msg, size_t len, size_t limit,
                 size_t *cost, srv_error *err) {
    pb_walk w = {.limit = limit, .err = err};
    int rc = pb_walk_msg(&w, desc, msg, msg + len, 0);
    if (cost) *cost = w.cost;
    return rc;
}

ProtobufCMessage *srv_grpc_unpack(const ProtobufCMessageDescriptor *desc, const uint8_t *msg, size_t len,
                                  size_t limit, srv_error *err) {
    if (srv_pb_check(desc, msg, len, limit, NULL, err) != 0) return NULL;
    ProtobufCMessage *m = protobuf_c_message_unpack(desc, NULL, len, msg);
    if (!m) srv_err(err, SRV_INVALID_ARGUMENT, "%s: the request is not a valid protobuf message", desc->name);
    return m;
}

