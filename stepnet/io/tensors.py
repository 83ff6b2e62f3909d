"""TensorProto <-> ndarray for every Caffe2 data type (re-exported by `proto`), and chunked tensors."""
from __future__ import annotations

import math

import numpy as np

from ..caffe2_pb2 import TensorProto
from ..core.errors import ArgumentError, FileFormatError
from ..core.limits import check_blob

DataType = TensorProto.DataType

NUMPY_OF = {
    DataType.FLOAT: np.float32, DataType.INT32: np.int32, DataType.BYTE: np.uint8,
    DataType.STRING: object, DataType.BOOL: np.bool_, DataType.UINT8: np.uint8, DataType.INT8: np.int8,
    DataType.UINT16: np.uint16, DataType.INT16: np.int16, DataType.INT64: np.int64,
    DataType.FLOAT16: np.float16, DataType.DOUBLE: np.float64,
}
_DTYPE_OF_NUMPY = {np.dtype(np.float32): DataType.FLOAT, np.dtype(np.int32): DataType.INT32,
                   np.dtype(np.bool_): DataType.BOOL, np.dtype(np.uint8): DataType.UINT8,
                   np.dtype(np.int8): DataType.INT8, np.dtype(np.uint16): DataType.UINT16,
                   np.dtype(np.int16): DataType.INT16, np.dtype(np.int64): DataType.INT64,
                   np.dtype(np.float16): DataType.FLOAT16, np.dtype(np.float64): DataType.DOUBLE}
MAX_DIMS = 64                     # numpy's limit on an array's rank
MAX_ELEMENTS = (2**63 - 1) // 16  # the most elements numpy allows for the widest element (complex128 bound)
_SMALL_INTS = {DataType.BOOL, DataType.UINT8, DataType.INT8, DataType.UINT16, DataType.INT16}


def data_type_of(dtype) -> int:
    """The TensorProto.DataType of a numpy dtype (object/str/bytes -> STRING)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "OSU":
        return DataType.STRING
    try:
        return _DTYPE_OF_NUMPY[dtype]
    except KeyError:
        raise ArgumentError(f"dtype {dtype} has no Caffe2 TensorProto data type") from None


def numpy_dtype(data_type: int):
    """The numpy dtype of a TensorProto data type (FileFormatError for one that has no array form)."""
    try:
        return NUMPY_OF[data_type]
    except KeyError:
        name = DataType.Name(data_type) if data_type in DataType.values() else data_type
        raise FileFormatError(f"TensorProto data_type {name} cannot be converted to an array") from None


def _named(t: TensorProto) -> str:
    return f"tensor {t.name!r}" if t.name else "tensor"


def element_count(t: TensorProto) -> int:
    """The elements t's dims call for, as a Python int (never an overflowing int64); FileFormatError for a
    negative dim."""
    dims = list(t.dims)
    if len(dims) > MAX_DIMS:
        raise FileFormatError(f"{_named(t)}: {len(dims)} dims; an array has at most {MAX_DIMS}")
    if any(d < 0 for d in dims):
        raise FileFormatError(f"{_named(t)}: dims {dims} hold a negative size; every dim must be >= 0")
    if math.prod(d for d in dims if d) > MAX_ELEMENTS:  # numpy refuses such a shape even with a zero dim in it
        raise FileFormatError(f"{_named(t)}: dims {dims} describe more elements than any array can hold")
    return math.prod(dims)


def segment_of(t: TensorProto, total: int) -> tuple[int, int]:
    """[begin, end) of a chunk's segment (the whole tensor without one), checked against its total elements."""
    if not t.HasField("segment"):
        return 0, total
    begin, end = t.segment.begin, t.segment.end
    if not 0 <= begin <= end <= total:
        raise FileFormatError(f"{_named(t)}: segment [{begin}, {end}) is outside its {total} elements "
                              f"(dims {list(t.dims)})")
    return begin, end


def tensor_to_array(t: TensorProto) -> np.ndarray:
    """The ndarray a TensorProto holds (for a chunk with `segment`, just that chunk's elements). The dims and
    segment are checked against the data before anything is allocated."""
    dtype = numpy_dtype(t.data_type)
    shape = tuple(t.dims)
    count = element_count(t)
    begin, end = segment_of(t, count)
    if (begin, end) != (0, count):
        count = end - begin
        shape = (count,)
    dt = t.data_type
    if dt == DataType.STRING:
        arr = np.empty(len(t.string_data), dtype=object)
        arr[:] = list(t.string_data)
    elif t.data_format == TensorProto.FMT_BFLOAT16:
        bits = _frombuffer(t, t.raw_data, "<u2").astype(np.uint32) << 16
        arr = bits.view(np.float32).astype(dtype)
    elif t.raw_data:
        arr = _frombuffer(t, t.raw_data, np.dtype(dtype).newbyteorder("<")).astype(dtype)
    elif dt == DataType.FLOAT:
        arr = np.asarray(t.float_data, dtype=np.float32)
    elif dt == DataType.DOUBLE:
        arr = np.asarray(t.double_data, dtype=np.float64)
    elif dt == DataType.INT64:
        arr = np.asarray(t.int64_data, dtype=np.int64)
    elif dt == DataType.INT32:
        arr = np.asarray(t.int32_data, dtype=np.int32)
    elif dt == DataType.BYTE:
        arr = _frombuffer(t, t.byte_data, np.uint8).copy()
    elif dt == DataType.FLOAT16:
        if t.byte_data:
            arr = _frombuffer(t, t.byte_data, "<f2").astype(np.float16)
        else:
            arr = np.asarray(t.int32_data, dtype=np.int64).astype(np.uint16).view(np.float16)
    elif dt in _SMALL_INTS:
        if t.byte_data:
            arr = _frombuffer(t, t.byte_data, np.dtype(dtype).newbyteorder("<")).astype(dtype)
        else:
            arr = np.asarray(t.int32_data, dtype=np.int64).astype(dtype)
    else:  # pragma: no cover - numpy_dtype rejected it
        raise FileFormatError(f"unsupported data_type {dt}")
    if arr.size != count:
        raise FileFormatError(f"{_named(t)}: dims {list(t.dims)} need {count} elements but "
                              f"{DataType.Name(dt)} data holds {arr.size}")
    return arr.reshape(shape)


def _frombuffer(t: TensorProto, buf: bytes, dtype) -> np.ndarray:
    itemsize = np.dtype(dtype).itemsize
    if len(buf) % itemsize:
        name = f" {t.name!r}" if t.name else ""
        raise FileFormatError(f"tensor{name}: a payload of {len(buf)} bytes is not a whole number of "
                              f"{itemsize}-byte {DataType.Name(t.data_type)} elements")
    return np.frombuffer(buf, dtype=dtype)


def array_to_tensor(value, name: str | None = None) -> TensorProto:
    """A TensorProto holding value, in the fields Caffe2 itself writes for its dtype."""
    arr = np.asarray(value)
    t = TensorProto(dims=arr.shape, data_type=data_type_of(arr.dtype))
    if name is not None:
        t.name = name
    flat = arr.reshape(-1)
    dt = t.data_type
    if dt == DataType.STRING:
        t.string_data.extend(v if isinstance(v, bytes) else str(v).encode() for v in flat)
    elif dt == DataType.FLOAT:
        t.float_data.extend(flat.tolist())
    elif dt == DataType.DOUBLE:
        t.double_data.extend(flat.tolist())
    elif dt == DataType.INT64:
        t.int64_data.extend(flat.tolist())
    elif dt == DataType.FLOAT16:
        t.int32_data.extend(flat.view(np.uint16).astype(np.int32).tolist())
    else:
        t.int32_data.extend(flat.astype(np.int32).tolist())
    return t


def join_chunks(chunks) -> np.ndarray:
    """Reassemble a tensor saved as several TensorProtos with `segment`s (Caffe2 chunked blobs); the chunks
    must cover every element exactly once. Every chunk's segment and data are checked before the whole tensor
    is allocated, so dims that claim more elements than the chunks hold allocate nothing."""
    chunks = list(chunks)
    if not chunks:
        raise FileFormatError("no chunks to join")
    first = chunks[0]
    total = element_count(first)
    dtype = numpy_dtype(first.data_type)
    pieces = sorted((*segment_of(c, total), i) for i, c in enumerate(chunks))
    covered = 0
    for begin, end, _ in pieces:
        if begin == end:
            continue
        if begin < covered:
            raise FileFormatError(f"tensor {first.name!r}: chunk [{begin}, {end}) overlaps another chunk")
        if begin > covered:
            break
        covered = end
    if covered != total:
        held = sum(end - begin for begin, end, _ in pieces)
        raise FileFormatError(f"tensor {first.name!r}: the chunks do not cover its {total} elements (they hold "
                              f"{held}; elements from {covered} on are missing)")
    arrays = [(begin, end, tensor_to_array(chunks[i]).reshape(-1)) for begin, end, i in pieces]
    out = np.empty(total, dtype=dtype)
    for begin, end, arr in arrays:
        out[begin:end] = arr
    return out.reshape(tuple(first.dims))


def check_tensor_proto(limit: int, blob: str, proto, where: str) -> None:
    """Refuse a BlobProto whose tensor's dims say it takes more than limit bytes, before it is assembled (each
    chunk's dims are the whole tensor's), or whose content (a string blob, an object's bytes) is longer than
    limit; dims and types that cannot be read are left to the loader."""
    if not proto.HasField("tensor"):
        if len(proto.content) > limit:
            check_blob(limit, blob, (len(proto.content),), np.uint8, where)   # the message of any blob over it
        return
    dtype = NUMPY_OF.get(proto.tensor.data_type)
    if dtype is not None and all(d >= 0 for d in proto.tensor.dims):
        check_blob(limit, blob, proto.tensor.dims, dtype, where)
