"""caffe2.python.predictor.serde: protobuf messages to bytes and back."""
from __future__ import annotations


def serialize_protobuf_struct(protobuf_struct) -> bytes:
    return protobuf_struct.SerializeToString()


def deserialize_protobuf_struct(serialized_protobuf: bytes, struct_type):
    message = struct_type()
    message.ParseFromString(serialized_protobuf)
    return message
