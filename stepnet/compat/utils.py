"""Caffe2's utils: argument and tensor conversion, proto reading, debug/DebugMode and a few helpers."""
from __future__ import annotations

import copy
import functools
import sys

import numpy as np
from google.protobuf import text_format
from google.protobuf.message import DecodeError

from ..core import backend
from ..core.errors import FileFormatError
from ..io.proto import TensorProto, array_to_tensor, make_argument, tensor_to_array


def MakeArgument(key, value):
    """An Argument from a Python value (numbers, strings, lists of them, NetDefs, arrays)."""
    return make_argument(key, value)


def Caffe2TensorToNumpyArray(tensor):
    return tensor_to_array(tensor)


def NumpyArrayToCaffe2Tensor(arr, name=None) -> TensorProto:
    return array_to_tensor(np.asarray(arr), name)


def CaffeBlobToNumpyArray(blob) -> np.ndarray:
    """A Caffe (Caffe1) BlobProto as a float32 array: the legacy num/channels/height/width shape when num is set,
    else its shape's dims (its data, or double_data); a FileFormatError when the values do not fill that shape."""
    values = blob.data if len(blob.data) else blob.double_data
    shape = [blob.num, blob.channels, blob.height, blob.width] if blob.num != 0 else list(blob.shape.dim)
    if int(np.prod(shape, dtype=np.int64)) != len(values) or any(d < 0 for d in shape):
        raise FileFormatError(f"a Caffe blob of shape {shape} holds {len(values)} values")
    return np.asarray(values, dtype=np.float32).reshape(shape)


def OpAlmostEqual(op_a, op_b, ignore_fields=None) -> bool:
    """Two ops are equal apart from the fields in ignore_fields."""
    fields = ignore_fields or []
    fields = fields if isinstance(fields, list) else [fields]

    def clean(op):
        op = copy.deepcopy(op)
        for field in fields:
            op.ClearField(field)
        return op
    return clean(op_a) == clean(op_b)


def TryReadProtoWithClass(cls, s):
    """A message of cls from text or binary protobuf content."""
    obj = cls()
    try:
        text_format.Parse(s if isinstance(s, str) else s.decode("utf-8"), obj)
    except (text_format.ParseError, UnicodeDecodeError):
        obj = cls()
        obj.ParseFromString(s if isinstance(s, bytes) else s.encode("utf-8"))
    return obj


def GetContentFromProto(obj, function_map):
    for cls, func in function_map.items():
        if type(obj) is cls:
            return func(obj)
    return None


def GetContentFromProtoString(s, function_map):
    for cls, func in function_map.items():
        try:
            return func(TryReadProtoWithClass(cls, s))
        except DecodeError:
            continue
    raise DecodeError("Cannot find a fit protobuffer class.")


def ConvertProtoToBinary(proto_class, filename, out_filename) -> None:
    with open(filename, "rb") as f:
        proto = TryReadProtoWithClass(proto_class, f.read())
    with open(out_filename, "wb") as f:
        f.write(proto.SerializeToString())


def GetGPUMemoryUsageStats() -> dict:
    """Bytes CuPy's memory pool holds now ('total') and at most so far as far as it knows ('max_total'), per GPU
    and summed."""
    cupy = backend.cupy_module()
    if cupy is None:
        raise RuntimeError("GetGPUMemoryUsageStats needs CuPy and a GPU")
    pool = cupy.get_default_memory_pool()
    total = np.array([pool.used_bytes()], np.int64)
    most = np.array([pool.total_bytes()], np.int64)
    return {"total_by_gpu": total, "max_by_gpu": most, "total": int(total.sum()), "max_total": int(most.sum())}


def ResetBlobs(blobs) -> None:
    """Empty the named blobs of the current workspace (Caffe2's Free op)."""
    from .workspace import _ws
    for name in blobs:
        blob = _ws().find(str(name))
        if blob is not None:
            blob.value, blob.view = None, False


def raiseIfNotEqual(a, b, msg) -> None:
    if a != b:
        raise Exception(f"{msg}. {a} != {b}")


class DebugMode:
    """Run a function; on an unhandled exception, print it and, at an interactive terminal, open pdb on it and
    exit(1). Without a terminal (a pipe, CI, tests) the exception is raised again, where Caffe2 would start pdb
    reading nothing."""

    @classmethod
    def run(cls, func):
        try:
            return func()
        except KeyboardInterrupt:
            raise
        except Exception:
            if not (sys.stdin is not None and sys.stdin.isatty()):
                raise
            import pdb
            print('Entering interactive debugger. Type "bt" to print the full stacktrace. Type "help" to see '
                  "command listing.")
            print(sys.exc_info()[1])
            pdb.post_mortem()
            sys.exit(1)


def debug(f):
    """Decorate a function with DebugMode (its return value is passed on)."""
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        return DebugMode.run(lambda: f(*args, **kwargs))
    return wrapper
