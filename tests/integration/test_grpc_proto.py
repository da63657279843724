"""proto/*.proto against the interfaces the client libraries were built from: every message and field tensord declares
must exist in the PyPI packages' descriptors (tensorflow-serving-api, tensorflow, tritonclient[grpc],
grpcio-health-checking, protobuf's well-known types) with the same field number, the same cardinality and a
compatible wire type, and every enum value the same number. Our .proto files are compiled here with protoc-c's
--descriptor_set_out, so what is checked is what the build generates code from.
"""
import glob
import os
import subprocess

import pytest

from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import FieldDescriptor as FD

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# wire type per protobuf field type: 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32
WIRE = {FD.TYPE_DOUBLE: 1, FD.TYPE_FLOAT: 5, FD.TYPE_INT64: 0, FD.TYPE_UINT64: 0, FD.TYPE_INT32: 0,
        FD.TYPE_FIXED64: 1, FD.TYPE_FIXED32: 5, FD.TYPE_BOOL: 0, FD.TYPE_STRING: 2, FD.TYPE_MESSAGE: 2,
        FD.TYPE_BYTES: 2, FD.TYPE_UINT32: 0, FD.TYPE_ENUM: 0, FD.TYPE_SFIXED32: 5, FD.TYPE_SFIXED64: 1,
        FD.TYPE_SINT32: 0, FD.TYPE_SINT64: 0}


def _real_pool():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import google.protobuf.any_pb2  # noqa: F401
    import google.protobuf.wrappers_pb2  # noqa: F401
    import grpc_health.v1.health_pb2  # noqa: F401
    import tritonclient.grpc.service_pb2  # noqa: F401
    from tensorflow.core.example import example_pb2  # noqa: F401
    from tensorflow.core.protobuf import meta_graph_pb2  # noqa: F401
    from tensorflow_serving.apis import (classification_pb2, get_model_metadata_pb2, get_model_status_pb2,  # noqa: F401
                                         model_management_pb2, predict_pb2, regression_pb2)
    from tensorflow_serving.config import model_server_config_pb2  # noqa: F401
    from google.protobuf import descriptor_pool
    return descriptor_pool.Default()


@pytest.fixture(scope="module")
def ours(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("ds") / "ours.pb")
    protos = sorted(glob.glob(os.path.join(ROOT, "proto", "*.proto")))
    assert protos, "no proto/*.proto"
    subprocess.run(["protoc-c", f"--descriptor_set_out={out}", f"-I{os.path.join(ROOT, 'proto')}"] + protos, check=True)
    fds = descriptor_pb2.FileDescriptorSet()
    with open(out, "rb") as f:
        fds.ParseFromString(f.read())
    return fds


def _walk(prefix, messages):
    for m in messages:
        name = f"{prefix}.{m.name}"
        yield name, m
        yield from _walk(name, m.nested_type)


def _walk_enums(prefix, messages, enums):
    for e in enums:
        yield f"{prefix}.{e.name}", e
    for m in messages:
        yield from _walk_enums(f"{prefix}.{m.name}", m.nested_type, m.enum_type)


def test_every_field_matches_the_public_interface(ours):
    pool = _real_pool()
    checked, problems = 0, []
    for fd in ours.file:
        for full, m in _walk(fd.package, fd.message_type):
            if m.options.map_entry:
                continue  # map entries: checked through their map field (key 1, value 2 by definition)
            try:
                real = pool.FindMessageTypeByName(full)
            except KeyError:
                problems.append(f"message {full}: not in the client packages")
                continue
            for f in m.field:
                rf = real.fields_by_name.get(f.name)
                if rf is None:
                    problems.append(f"{full}.{f.name}: no such field upstream")
                    continue
                checked += 1
                if rf.number != f.number:
                    problems.append(f"{full}.{f.name}: number {f.number}, upstream {rf.number}")
                ours_rep = f.label == descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
                real_rep = rf.is_repeated if hasattr(rf, "is_repeated") else rf.label == FD.LABEL_REPEATED
                if ours_rep != real_rep:
                    problems.append(f"{full}.{f.name}: repeated={ours_rep}, upstream {real_rep}")
                if WIRE[f.type] != WIRE[rf.type]:
                    problems.append(f"{full}.{f.name}: wire type {WIRE[f.type]}, upstream {WIRE[rf.type]}")
                if f.type == FD.TYPE_MESSAGE and f.type_name.lstrip(".") != rf.message_type.full_name:
                    problems.append(f"{full}.{f.name}: type {f.type_name}, upstream {rf.message_type.full_name}")
        for full, e in _walk_enums(fd.package, fd.message_type, fd.enum_type):
            real = pool.FindEnumTypeByName(full)
            for v in e.value:
                rv = real.values_by_name.get(v.name)
                if rv is None or rv.number != v.number:
                    problems.append(f"enum {full}.{v.name}={v.number}: upstream {rv.number if rv else 'absent'}")
    assert not problems, "\n".join(problems)
    assert checked > 150, f"only {checked} fields checked"
