"""Caffe2's schema module: typed records of nested fields whose leaves, in order, are the tensors of a columnar
dataset. The field types (Field, Scalar, List, Struct) are in _schema_fields.py, the records built from lists (Map,
from_column_list, from_blob_list) in _schema_columns.py; here are Tuple, from_dtype and the helpers that tie a
record to nets and workspaces: NewRecord (a blob per leaf), FeedRecord, FetchRecord, ConstRecord, InitEmptyRecord."""
from __future__ import annotations

import logging

import numpy as np

from ..io.proto import TensorProto
from ._schema_fields import (FIELD_SEPARATOR, FeatureSpec, Field, List, Metadata, Scalar, Struct,  # noqa: F401
                             _as_field)
from ._schema_columns import Map, from_blob_list, from_column_list  # noqa: F401
from . import workspace
from ..builders.builder import BlobRef

logger = logging.getLogger(__name__)
DataType = TensorProto.DataType
_NUMERIC_TYPES = ((np.float16, DataType.FLOAT16), (np.float32, DataType.FLOAT), (np.float64, DataType.DOUBLE),
                  (np.bool_, DataType.BOOL), (np.int8, DataType.INT8), (np.int16, DataType.INT16),
                  (np.int32, DataType.INT32), (np.int64, DataType.INT64), (np.uint8, DataType.UINT8),
                  (np.uint16, DataType.UINT16))


def NamedTuple(name_prefix, *fields) -> Struct:
    return Struct(*[(f"{name_prefix}_{i}", field) for i, field in enumerate(fields)])


def Tuple(*fields) -> Struct:
    """A Struct with the names field_0, field_1, ..."""
    return NamedTuple("field", *fields)


def RawTuple(num_fields: int, name_prefix="field") -> Struct:
    """A Struct of num_fields untyped Scalars."""
    if not isinstance(num_fields, int) or num_fields < 0:
        raise ValueError(f"num_fields must be an int >= 0, got {num_fields!r}")
    return NamedTuple(name_prefix, *([np.void] * num_fields))


def from_dtype(dtype, _outer_shape=()) -> Field:
    """A Scalar for a plain (or sub-array) dtype, a Struct of them for a structured one."""
    if not isinstance(dtype, np.dtype):
        shape, dtype = _outer_shape, np.dtype((dtype, _outer_shape))
    else:
        shape = tuple(_outer_shape) + dtype.shape
        if shape != dtype.shape:
            dtype = np.dtype((dtype.base, shape))
    if not dtype.fields:
        return Scalar(dtype)
    fields = []
    for name, (field_dtype, offset, *_) in dtype.fields.items():
        if offset != 0:
            raise ValueError("Fields with byte offsets are not supported.")
        fields.append((name, from_dtype(field_dtype, _outer_shape=shape)))
    return Struct(*fields)


def as_record(value) -> Field:
    """value as a Field: a Field as it is, a list of (name, value) pairs or a dict as a Struct, another list or
    tuple as a Tuple, anything else as a Scalar."""
    if isinstance(value, Field):
        return value
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(f, tuple) and len(f) == 2 and isinstance(f[0], str) for f in value):
            return Struct(*[(k, as_record(v)) for k, v in value])
        return Tuple(*[as_record(f) for f in value])
    if isinstance(value, dict):
        return Struct(*[(k, as_record(v)) for k, v in value.items()])
    return _as_field(value)


def _blob_refs(record: Field) -> list:
    blobs = record.field_blobs()
    if not all(isinstance(b, BlobRef) for b in blobs):
        raise TypeError("the record's leaves must hold BlobReferences (make it with NewRecord)")
    return blobs


def FetchRecord(blob_record: Field, ws=None, throw_on_type_mismatch=False) -> Field:
    """A record of the same schema holding the values of blob_record's blobs (in the current workspace, or ws)."""
    if not isinstance(blob_record, Field):
        raise TypeError("FetchRecord needs a schema.Field")

    def fetch(name):
        if ws is None:
            return workspace.FetchBlob(name)
        return ws.fetch(name) if hasattr(ws, "fetch") else ws.blobs[name].fetch()

    arrays = [fetch(str(b)) for b in _blob_refs(blob_record)]
    return from_blob_list(blob_record, arrays, throw_on_type_mismatch)


def FeedRecord(blob_record: Field, arrays, ws=None) -> None:
    """Feed arrays (a list, or a record of arrays) to blob_record's blobs, in order."""
    if not isinstance(blob_record, Field):
        raise TypeError("FeedRecord needs a schema.Field")
    blobs = _blob_refs(blob_record)
    if isinstance(arrays, Field):
        arrays = arrays.field_blobs()
    if len(arrays) != len(blobs):
        raise ValueError(f"Values must contain exactly {len(blobs)} ndarrays.")
    for blob, array in zip(blobs, arrays):
        if ws is None:
            workspace.FeedBlob(str(blob), array)
        elif hasattr(ws, "feed"):
            ws.feed(str(blob), array)
        else:
            ws.create_blob(str(blob)).feed(array)


def NewRecord(net, schema: Field) -> Field:
    """schema with a new blob of net (NextScopedBlob of the leaf's name) at each leaf."""
    if isinstance(schema, Scalar):
        record = schema.clone()
        record.set_value(blob=net.NextScopedBlob("unnamed_scalar"), unsafe=True)
        return record
    if not isinstance(schema, Field):
        raise TypeError("Record must be a schema.Field instance.")
    return from_blob_list(schema, [net.NextScopedBlob(prefix=name) for name in schema.field_names()])


def ConstRecord(net, array_record: Field) -> Field:
    """A record of new blobs that net fills (net.Const) with array_record's arrays."""
    record = NewRecord(net, array_record)
    for blob, array in zip(record.field_blobs(), array_record.field_blobs()):
        net.Const(array, blob)
    return record


def InitEmptyRecord(net, schema_or_record: Field, enforce_types=False) -> Field:
    """Fill each leaf's blob (new blobs when it has none) with an empty tensor of its dtype and entry shape."""
    record = schema_or_record if schema_or_record.has_blobs() else NewRecord(net, schema_or_record)
    for dtype, blob in zip(record.field_types(), record.field_blobs()):
        try:
            net.ConstantFill([], blob, shape=[0] + list(dtype.shape), dtype=data_type_for_dtype(dtype))
        except TypeError:
            logger.warning("Blob %s has type error", blob)
            if enforce_types:
                raise
            net.ConstantFill([], blob, shape=[0])
    return record


def data_type_for_dtype(dtype) -> int:
    """The core.DataType of a numpy dtype (strings: STRING); TypeError for any other."""
    base = np.dtype(dtype).base
    if base.kind in "USO":
        return DataType.STRING
    for np_type, data_type in _NUMERIC_TYPES:
        if base == np_type:
            return data_type
    raise TypeError(f"Unknown dtype: {base}")


def is_schema_subset(schema: Field, original_schema: Field) -> bool:
    return set(schema.field_names()).issubset(original_schema.field_names())


def equal_schemas(schema: Field, original_schema: Field, check_field_names=True, check_field_types=True,
                  check_field_metas=False) -> bool:
    if not isinstance(schema, Field) or not isinstance(original_schema, Field):
        raise TypeError("equal_schemas compares two schema.Field")
    return not ((check_field_names and schema.field_names() != original_schema.field_names())
                or (check_field_types and schema.field_types() != original_schema.field_types())
                or (check_field_metas and schema.field_metadata() != original_schema.field_metadata()))


def schema_check(schema, previous=None) -> Field:
    record = as_record(schema)
    if previous is not None and not equal_schemas(schema, previous):
        raise ValueError("the schema differs from the previous one")
    return record


def attach_metadata_to_scalars(field: Field, metadata) -> None:
    for scalar in field.all_scalars():
        scalar.set_metadata(metadata)
