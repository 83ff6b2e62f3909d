"""Records built from lists (schema.py re-exports them): Map, from_column_list (the record whose leaves are named
columns) and from_blob_list (a schema's copy holding given values). Here, apart from schema.py, because core.Net's
schema records (Clone(keep_schema=True), recover_input_record_by_prefix) use them, and schema.py imports the
workspace, which imports core."""
from __future__ import annotations

from collections import OrderedDict

from ..builders.builder import BlobRef
from ._schema_fields import FIELD_SEPARATOR, Field, List, Scalar, Struct


def Map(keys, values, keys_name="keys", values_name="values", lengths_blob=None) -> List:
    """A List of Structs (keys, values)."""
    return List(Struct((keys_name, keys), (values_name, values)), lengths_blob=lengths_blob)


def from_column_list(col_names, col_types=None, col_blobs=None, col_metadata=None) -> Field:
    """The record whose leaves are the given columns ('a:b' paths). A node whose children are exactly lengths
    and values becomes a List, exactly lengths, keys and values a Map; any other node a Struct."""
    n = len(col_names)
    col_types = [None] * n if col_types is None else list(col_types)
    col_blobs = [None] * n if col_blobs is None else list(col_blobs)
    col_metadata = [None] * n if col_metadata is None else list(col_metadata)
    if not len(col_types) == len(col_blobs) == len(col_metadata) == n:
        raise ValueError("col_names, col_types, col_blobs and col_metadata must have the same length")
    tree: OrderedDict = OrderedDict()
    for name, dtype, blob, metadata in zip(col_names, col_types, col_blobs, col_metadata):
        node = tree
        *parents, leaf = name.split(FIELD_SEPARATOR)
        for part in parents:
            node = node.setdefault(part, OrderedDict())
            if not isinstance(node, OrderedDict):
                raise ValueError(f"column {name!r}: {part!r} is also a leaf column")
        if leaf in node:
            raise ValueError(f"column {name!r} given twice")
        node[leaf] = Scalar(dtype=dtype, blob=blob, metadata=metadata)

    def build(node) -> Field:
        if isinstance(node, Field):
            return node
        children = {k: build(v) for k, v in node.items()}
        if set(children) == {"lengths", "values"}:
            return List(children["values"], lengths_blob=children["lengths"])
        if set(children) == {"lengths", "keys", "values"}:
            return Map(children["keys"], children["values"], lengths_blob=children["lengths"])
        return Struct(*children.items())

    return build(tree)


def from_blob_list(schema: Field, values, throw_on_type_mismatch=False) -> Field:
    """A copy of schema whose leaves hold values (arrays or blob references), in order."""
    if not isinstance(schema, Field):
        raise TypeError("Argument `schema` must be a Field.")
    if isinstance(values, BlobRef):
        values = [values]
    record = schema.clone_schema()
    scalars = record.all_scalars()
    if len(scalars) != len(values):
        raise ValueError(f"Values must have {len(scalars)} elements, got {len(values)}.")
    for scalar, value in zip(scalars, values):
        scalar.set_value(value, throw_on_type_mismatch, unsafe=True)
    return record
