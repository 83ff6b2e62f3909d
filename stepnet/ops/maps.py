"""Integer maps (Caffe2's map_ops): CreateMap, KeyValueToMap, MapToKeyValue.

A map blob holds a KeyValueMap: a dict from keys to values of one of the four (key, value) dtype pairs Caffe2
has, int32/int64 each. Save writes it as Caffe2 does (a BlobProto of type "(std::unordered_map<K, V>)" whose
content is a TensorProtos of the keys and the values) and Load reads it back as a map."""
from __future__ import annotations

import numpy as np

from ..core.errors import ArgumentError, DTypeError, FileFormatError, ShapeError
from ..io.blobs import register_blob_type
from ..io.proto import DataType, TensorProtos
from ..io.tensors import array_to_tensor, tensor_to_array
from .base import held_object, size_of
from .registry import op

DTYPES = {DataType.INT32: np.dtype(np.int32), DataType.INT64: np.dtype(np.int64)}
_C_NAMES = {np.dtype(np.int32): "int32_t", np.dtype(np.int64): "int64_t"}


class KeyValueMap(dict):
    """A map from keys to values of fixed dtypes (class attributes key_dtype and value_dtype): one subclass
    per dtype pair, as Caffe2 has one blob type per pair."""
    key_dtype: np.dtype
    value_dtype: np.dtype

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The keys and the values as 1-D tensors, pair by pair."""
        return (np.fromiter(self.keys(), self.key_dtype, len(self)),
                np.fromiter(self.values(), self.value_dtype, len(self)))

    def __repr__(self):
        return f"{type(self).__name__}({len(self)} entries)"


def _map_class(key_dtype: np.dtype, value_dtype: np.dtype) -> type:
    name = f"Map{key_dtype.itemsize * 8}To{value_dtype.itemsize * 8}"
    return type(name, (KeyValueMap,), {"key_dtype": key_dtype, "value_dtype": value_dtype, "__slots__": ()})


MAP_TYPES = {(k, v): _map_class(k, v) for k in DTYPES.values() for v in DTYPES.values()}


def _map_of(key_dtype, value_dtype, what: str) -> type:
    cls = MAP_TYPES.get((np.dtype(key_dtype), np.dtype(value_dtype)))
    if cls is None:
        raise DTypeError(f"{what}: maps take int32 or int64 keys and values, got {key_dtype} keys and "
                         f"{value_dtype} values")
    return cls


def _data_type(code: int, what: str) -> np.dtype:
    if code not in DTYPES:
        name = DataType.Name(code) if code in DataType.values() else str(code)
        raise ArgumentError(f"{what} must be INT32 (2) or INT64 (10), got {name}")
    return DTYPES[code]


@op("CreateMap", inputs=0, outputs=1, args={"key_dtype": DataType.INT32, "value_dtype": DataType.INT32})
def create_map(xp, *, key_dtype, value_dtype):
    """An empty map with keys and values of the given TensorProto data types (INT32 or INT64 each)."""
    return _map_of(_data_type(key_dtype, "key_dtype"), _data_type(value_dtype, "value_dtype"), "CreateMap")()


def _pairs_shape(specs, **_):
    keys, values = specs
    _map_of(keys.dtype, values.dtype, "KeyValueToMap")
    if size_of(keys) != size_of(values):
        raise ShapeError(f"keys and values must have as many elements, got {keys.shape} and {values.shape}")
    return []


@op("KeyValueToMap", inputs=2, outputs=1, context=True, shape=_pairs_shape)
def key_value_to_map(ctx, xp, keys, values):
    """The map of keys[i] -> values[i] (tensors of the same element count, read flat). A key given twice keeps
    its first value. When the output blob already holds a map of these dtypes, the pairs are added to a copy of
    it (its own entries win), as Caffe2 adds them to the map the blob holds."""
    for i, x in enumerate((keys, values)):
        if not hasattr(x, "dtype"):
            raise DTypeError(f"input {i} must be a tensor, got {type(x).__name__}")
    cls = _map_of(keys.dtype, values.dtype, "KeyValueToMap")
    if keys.size != values.size:
        raise ShapeError(f"keys and values must have as many elements, got {tuple(keys.shape)} and "
                         f"{tuple(values.shape)}")
    old = ctx.outputs[0].value
    out = cls(old) if type(old) is cls else cls()
    for k, v in zip(np.asarray(keys).reshape(-1).tolist(), np.asarray(values).reshape(-1).tolist()):
        out.setdefault(k, v)
    return out


def _map_input(value) -> KeyValueMap:
    return held_object(value, KeyValueMap, 0, "a map", "CreateMap or KeyValueToMap")


def _map_shape(specs):
    _map_input(specs[0])   # (a known spec is a tensor: an error before anything runs)
    return []


@op("MapToKeyValue", inputs=1, outputs=2, shape=_map_shape)
def map_to_key_value(xp, table):
    """The map's keys and values as two 1-D tensors of its dtypes, pair by pair (in the map's order)."""
    return _map_input(table).arrays()


# --------------------------------------------------------------------------------------------- Save / Load
def _type_name(cls: type) -> str:
    return f"(std::unordered_map<{_C_NAMES[cls.key_dtype]}, {_C_NAMES[cls.value_dtype]}>)"


def _serialize(table: KeyValueMap, name: str) -> bytes:
    protos = TensorProtos()
    for arr in table.arrays():
        t = array_to_tensor(arr, name=name)
        t.segment.begin, t.segment.end = 0, arr.size
        protos.protos.add().CopyFrom(t)
    return protos.SerializeToString()


def _deserializer(cls: type):
    def deserialize(content: bytes) -> KeyValueMap:
        protos = TensorProtos()
        protos.ParseFromString(content)
        if len(protos.protos) != 2:
            raise FileFormatError(f"a saved map holds two tensors (keys, values), got {len(protos.protos)}")
        keys, values = (tensor_to_array(t).reshape(-1) for t in protos.protos)
        if (keys.dtype, values.dtype) != (cls.key_dtype, cls.value_dtype) or keys.size != values.size:
            raise FileFormatError(f"a saved {_type_name(cls)} holds {keys.size} {keys.dtype} keys and "
                                  f"{values.size} {values.dtype} values")
        out = cls()
        for k, v in zip(keys.tolist(), values.tolist()):
            out.setdefault(k, v)
        return out
    return deserialize


for _cls in MAP_TYPES.values():
    register_blob_type(_cls, _type_name(_cls), _serialize, _deserializer(_cls))
