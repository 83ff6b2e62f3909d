"""Int8Tensor in its BlobProto form, as Caffe2 saves an Int8TensorCPU (caffe2/core/int8_serialization.cc): a
BlobProto of type "Int8TensorCPU" whose `qtensor` holds dims, precision 8, scale, the zero point in `bias`,
is_signed false, data_type UINT8 or INT32 and the codes in `data`. Importing this module registers the type
with the blob serializers (stepnet.io.minidb imports it)."""
from __future__ import annotations

import math

import numpy as np

from ..core import backend
from ..core.errors import FileFormatError
from ..core.int8 import Int8Tensor
from .blobs import register_blob_type
from .proto import BlobProto, DataType

BLOB_TYPE = "Int8TensorCPU"   # the BlobProto type name Caffe2 saves an Int8TensorCPU under
DATA_TYPES = {np.dtype(np.uint8): DataType.UINT8, np.dtype(np.int32): DataType.INT32}


def _to_blob_proto(value: Int8Tensor, name: str) -> BlobProto:
    data = np.asarray(backend.to_host(value.data))
    proto = BlobProto()
    q = proto.qtensor
    q.name = name
    q.dims.extend(data.shape)
    q.precision, q.scale, q.bias, q.is_signed = 8, value.scale, value.zero_point, False
    q.data_type = DATA_TYPES[data.dtype]
    q.data.extend(data.reshape(-1).astype(np.int32).tolist())
    return proto


def _from_blob_proto(proto: BlobProto) -> Int8Tensor:
    if not proto.HasField("qtensor"):
        raise FileFormatError(f"a {BLOB_TYPE} blob needs its qtensor field, which is missing")
    q = proto.qtensor
    dtype = {code: dt for dt, code in DATA_TYPES.items()}.get(q.data_type)
    if dtype is None:
        known = q.data_type in DataType.values()
        raise FileFormatError(f"{BLOB_TYPE} data type {DataType.Name(q.data_type) if known else q.data_type} is "
                              "not supported (Caffe2 saves UINT8 or INT32)")
    dims = tuple(int(d) for d in q.dims)
    if any(d < 0 for d in dims):
        raise FileFormatError(f"{BLOB_TYPE} dims {list(dims)} has a negative size")
    values = np.array(q.data, dtype=np.int64)
    if values.size != math.prod(dims):
        raise FileFormatError(f"{BLOB_TYPE} dims {list(dims)} need {math.prod(dims)} values but data holds "
                              f"{values.size}")
    info = np.iinfo(dtype)
    if values.size and (values.min() < info.min or values.max() > info.max):
        raise FileFormatError(f"{BLOB_TYPE} data holds values outside the {dtype} range")
    if not math.isfinite(q.scale) or not math.isfinite(q.bias) or q.bias != int(q.bias):
        raise FileFormatError(f"{BLOB_TYPE} needs a finite scale and an integer zero point (bias), got scale "
                              f"{q.scale!r} and bias {q.bias!r}")
    return Int8Tensor(values.astype(dtype).reshape(dims), q.scale, int(q.bias))


register_blob_type(Int8Tensor, BLOB_TYPE, _to_blob_proto, _from_blob_proto, whole_proto=True)
