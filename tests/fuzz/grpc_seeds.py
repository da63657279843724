"""grpc_seeds.py DIR - write seed inputs for fuzz_grpc (first byte: 0 Predict, 1 Classify, 2 ModelInfer), encoded
by hand from the public field numbers (no protobuf package needed)."""
import os
import struct
import sys


def varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def field(num, wire, payload):
    key = varint((num << 3) | wire)
    if wire == 2:
        return key + varint(len(payload)) + payload
    return key + payload


def ln(num, payload):
    return field(num, 2, payload)


def vi(num, n):
    return field(num, 0, varint(n & 0xFFFFFFFFFFFFFFFF))


def shape(*dims):
    return b"".join(ln(2, vi(1, d)) for d in dims)


def tensor(dtype, dims, content=None, floats=None, int64s=None):
    t = vi(1, dtype) + ln(2, shape(*dims))
    if content is not None:
        t += ln(4, content)
    if floats is not None:
        t += ln(5, b"".join(struct.pack("<f", f) for f in floats))
    if int64s is not None:
        t += ln(10, b"".join(varint(i & 0xFFFFFFFFFFFFFFFF) for i in int64s))
    return t


spec = ln(1, ln(1, b"m") + ln(2, vi(1, 1)))
x = tensor(1, [2, 3], content=struct.pack("<6f", *range(6)))
k = tensor(9, [2], int64s=[1, -5])
seeds = {
    "predict": b"\x00" + spec + ln(2, ln(1, b"x") + ln(2, x)) + ln(2, ln(1, b"k") + ln(2, k)) + ln(3, b"y"),
    "predict_vals": b"\x00" + spec + ln(2, ln(1, b"x") + ln(2, tensor(1, [1, 3], floats=[1.5]))),
}
feat = ln(1, ln(1, b"x") + ln(2, ln(2, ln(1, struct.pack("<3f", 1, 2, 3)))))
feat_k = ln(1, ln(1, b"k") + ln(2, ln(3, ln(1, varint(7)))))
example = ln(1, feat + feat_k)
seeds["classify"] = b"\x01" + spec + ln(2, ln(1, ln(1, example) + ln(1, example)))
inp = ln(1, b"x") + ln(2, b"FP32") + ln(3, varint(1) + varint(3)) + ln(5, ln(6, struct.pack("<3f", 1, 2, 3)))
inp_k = ln(1, b"k") + ln(2, b"INT64") + ln(3, varint(1))
seeds["infer_typed"] = b"\x02" + ln(1, b"m") + ln(5, inp) + ln(5, inp_k + ln(5, ln(3, varint(4))))
raw_x = ln(1, b"x") + ln(2, b"FP32") + ln(3, varint(2) + varint(3))
seeds["infer_raw"] = b"\x02" + ln(1, b"m") + ln(2, b"1") + ln(5, raw_x) + ln(5, inp_k) + ln(7, struct.pack("<6f", *range(6))) + ln(7, struct.pack("<q", 3))
os.makedirs(sys.argv[1], exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(sys.argv[1], name + ".bin"), "wb") as f:
        f.write(data)
