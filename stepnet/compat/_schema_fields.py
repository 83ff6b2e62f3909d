"""The field types of Caffe2's schema module (schema.py re-exports them with the record helpers): typed records
of nested fields (Scalar, List, Struct; Map and Tuple are made of them) whose leaves, in order, are the tensors
of a columnar dataset.

A field's leaves are named by their path with ':' between names (`floats:values:keys`); a List adds a `lengths`
leaf (int32, one length per parent entry) before its values. A leaf may hold a value: a numpy array, or a
BlobReference naming a blob; records of blob references are made with NewRecord and fetched into records of
arrays with FetchRecord (schema.py).
"""
from __future__ import annotations

from collections import OrderedDict, namedtuple
from io import StringIO

import numpy as np

from ..builders.builder import BlobRef

FIELD_SEPARATOR = ":"

FeatureSpec = namedtuple("FeatureSpec", ["feature_type", "feature_names", "feature_ids",
                                         "feature_is_request_only", "desired_hash_size"],
                         defaults=(None, None, None, None, None))
Metadata = namedtuple("Metadata", ["categorical_limit", "expected_value", "feature_specs"],
                      defaults=(None, None, None))
Metadata.__doc__ = ("A leaf's extra facts: categorical_limit (an integer field's values are below it), "
                    "expected_value, feature_specs.")


def _join(prefix: str, suffix: str) -> str:
    return FIELD_SEPARATOR.join(p for p in (prefix, suffix) if p)


def _as_field(value, keep_blobs: bool = True) -> "Field":
    """A copy of a Field; a type or dtype as an empty Scalar of it; anything else as a Scalar holding it."""
    if isinstance(value, Field):
        return value.clone(keep_blobs=keep_blobs)
    if isinstance(value, (type, np.dtype)):
        return Scalar(dtype=value)
    return Scalar(blob=value)


class Field:
    """A node of a record. Subclasses give their leaves' names, types, metadata and values, all in one order."""

    def __init__(self, children):
        self._parent = (None, 0)
        self._field_offsets = [0]
        for child in children:
            self._field_offsets.append(self._field_offsets[-1] + len(child.field_names()))

    def field_names(self) -> list:
        raise NotImplementedError

    def field_types(self) -> list:
        raise NotImplementedError

    def field_metadata(self) -> list:
        raise NotImplementedError

    def field_blobs(self) -> list:
        return [value for s in self.all_scalars() for value in s.field_blobs()]

    def all_scalars(self) -> list:
        raise NotImplementedError

    def has_blobs(self) -> bool:
        return all(s.has_blobs() for s in self.all_scalars())

    def clone(self, keep_blobs: bool = True) -> "Field":
        raise NotImplementedError

    def clone_schema(self) -> "Field":
        return self.clone(keep_blobs=False)

    def _set_parent(self, parent, index: int) -> None:
        self._parent = (parent, index)

    def _child_base_id(self, child_index=None) -> int:
        parent, index = self._parent
        base = 0 if child_index is None else self._field_offsets[child_index]
        return base + (parent._child_base_id(index) if parent is not None else 0)

    def slice(self) -> slice:
        """The range of this field's leaves among the leaves of the whole record it belongs to."""
        start = self._child_base_id()
        return slice(start, start + len(self.field_names()))

    def __eq__(self, other):
        return (isinstance(other, Field) and self.field_names() == other.field_names()
                and self.field_types() == other.field_types()
                and self.field_metadata() == other.field_metadata())

    __hash__ = object.__hash__

    def _pprint_impl(self, indent: int, out) -> None:
        raise NotImplementedError

    def __repr__(self):
        out = StringIO()
        self._pprint_impl(0, out)
        return out.getvalue()


class List(Field):
    """A variable-length list per entry: the leaves `lengths` (int32) then those of the values."""

    def __init__(self, values, lengths_blob=None):
        if isinstance(lengths_blob, Field):
            if not isinstance(lengths_blob, Scalar):
                raise TypeError("a List's lengths must be a Scalar")
            self.lengths = _as_field(lengths_blob)
        else:
            self.lengths = Scalar(np.int32, lengths_blob)
        self._items = _as_field(values)
        self.lengths._set_parent(self, 0)
        self._items._set_parent(self, 1)
        super().__init__([self.lengths, self._items])

    def field_names(self):
        return ["lengths"] + [_join("values", n) for n in self._items.field_names()]

    def field_types(self):
        return self.lengths.field_types() + self._items.field_types()

    def field_metadata(self):
        return self.lengths.field_metadata() + self._items.field_metadata()

    def all_scalars(self):
        return self.lengths.all_scalars() + self._items.all_scalars()

    def clone(self, keep_blobs=True):
        return List(_as_field(self._items, keep_blobs), _as_field(self.lengths, keep_blobs))

    def _pprint_impl(self, indent, out):
        pad = "  " * indent
        out.write(f"{pad}List(\n{pad}  lengths=\n")
        self.lengths._pprint_impl(indent + 2, out)
        out.write(f"{pad}  _items=\n")
        self._items._pprint_impl(indent + 2, out)
        out.write(f"{pad})\n")

    def __getattr__(self, item):
        """The fields of a list of Structs are reachable from the list (`record.floats.keys`); `value` and
        `items` are the values."""
        if item.startswith("__") or item in ("lengths", "_items"):
            raise AttributeError(item)
        items = self.__dict__.get("_items")
        if isinstance(items, Struct):
            return getattr(items, item)
        if item in ("value", "items"):
            return items
        raise AttributeError(f"Field not found in list: {item}.")

    def __getitem__(self, item):
        head, _, rest = item.partition(FIELD_SEPARATOR)
        if not rest and head in ("lengths", "values"):
            return self.lengths if head == "lengths" else self._items
        if rest and head == "values":
            return self._items[rest]
        raise KeyError(f"Field not found in list: {item}.")


class Struct(Field):
    """Named fields over one domain. A name with ':' makes nested Structs (`('b:c', x)` is b = Struct(c=x)), and
    two Structs of one name merge."""

    def __init__(self, *fields):
        merged: "OrderedDict[str, Field]" = OrderedDict()
        for entry in fields:
            if len(entry) != 2:
                raise ValueError(f"a Struct field is (name, field), got {entry!r}")
            name, field = entry
            if not name:
                raise ValueError("Field names cannot be empty")
            if name == "lengths":
                raise ValueError("Struct cannot contain a field named `lengths`.")
            field = _as_field(field)
            head, _, rest = name.partition(FIELD_SEPARATOR)
            if rest:
                name, field = head, Struct((rest, field))
            if name not in merged:
                merged[name] = field
            elif isinstance(field, Struct) and isinstance(merged[name], Struct):
                merged[name] = merged[name] + field
            else:
                raise ValueError(f"Duplicate field name: {name}")
        self.fields = merged
        for index, field in enumerate(merged.values()):
            field._set_parent(self, index)
        super().__init__(list(merged.values()))
        self._frozen = True

    def get_children(self) -> list:
        return list(self.fields.items())

    def field_names(self):
        return [_join(name, n) for name, f in self.fields.items() for n in f.field_names()]

    def field_types(self):
        return [t for f in self.fields.values() for t in f.field_types()]

    def field_metadata(self):
        return [m for f in self.fields.values() for m in f.field_metadata()]

    def all_scalars(self):
        return [s for f in self.fields.values() for s in f.all_scalars()]

    def clone(self, keep_blobs=True):
        return Struct(*[(name, _as_field(f, keep_blobs)) for name, f in self.fields.items()])

    def _nested(self, name: str):
        head, _, rest = name.partition(FIELD_SEPARATOR)
        field = self.fields.get(head)
        if field is None or not rest:
            return field
        try:
            return field[rest]
        except (KeyError, TypeError):
            return None

    def _pprint_impl(self, indent, out):
        pad = "  " * indent
        out.write(f"{pad}Struct( \n")
        for name, field in self.fields.items():
            out.write(f"{pad}  {name}=\n")
            field._pprint_impl(indent + 2, out)
        out.write(f"{pad}) \n")

    def __contains__(self, item):
        return self._nested(item) is not None

    def __len__(self):
        return len(self.fields)

    def __getitem__(self, item):
        """By nested name ('a:b'), by position at the first level, or a list/tuple of either (a new Struct)."""
        if isinstance(item, (list, tuple)):
            keys = list(self.fields)
            return Struct(*[(keys[k] if isinstance(k, int) else k, self[k]) for k in item])
        if isinstance(item, int):
            return list(self.fields.values())[item]
        field = self._nested(item)
        if field is None:
            raise KeyError(f'field "{item}" not found')
        return field

    def get(self, item, default_value):
        return getattr(self, item, default_value)

    def __getattr__(self, item):
        if item.startswith("__"):
            raise AttributeError(item)
        try:
            return self.__dict__["fields"][item]
        except KeyError:
            raise AttributeError(item) from None

    def __setattr__(self, key, value):
        if getattr(self, "_frozen", False) and not key.startswith("_"):
            raise TypeError("Struct.__setattr__() is disabled after __init__()")
        super().__setattr__(key, value)

    def __add__(self, other):
        """The fields of both; Structs present in both merge, recursively."""
        if not isinstance(other, Struct):
            return NotImplemented
        children = OrderedDict(self.get_children())
        for name, right in other.get_children():
            children[name] = children[name] + right if name in children else right
        return Struct(*children.items())

    def __sub__(self, other):
        """The fields of self not in other (recursively for Structs; a Struct left empty goes too)."""
        if not isinstance(other, Struct):
            return NotImplemented
        children = OrderedDict(self.get_children())
        for name, right in other.get_children():
            if name not in children:
                continue
            left = children[name]
            if type(left) is not type(right):
                raise TypeError(f"field {name} is a {type(left).__name__} on the left and a "
                                f"{type(right).__name__} on the right")
            rest = left - right if isinstance(left, Struct) else None
            if rest is not None and rest.get_children():
                children[name] = rest
            else:
                children.pop(name)
        return Struct(*children.items())


class Scalar(Field):
    """A leaf: one tensor whose first dim is the field's domain. dtype may carry a fixed entry shape
    (`Scalar((np.float32, 3))`: an L x 3 matrix); no dtype is np.void (unknown). The value is a numpy array
    (converted to the dtype) or a BlobReference."""

    def __init__(self, dtype=None, blob=None, metadata=None):
        self._metadata = None
        self.set(dtype, blob, metadata, unsafe=True)
        super().__init__([])

    def field_names(self):
        return [""]

    def field_type(self):
        return self.dtype

    def field_types(self):
        return [self.dtype]

    def field_metadata(self):
        return [self._metadata]

    def has_blobs(self):
        return self._blob is not None

    def field_blobs(self):
        if self._blob is None:
            raise AssertionError("Value is not set for this field.")
        return [self._blob]

    def all_scalars(self):
        return [self]

    def clone(self, keep_blobs=True):
        return Scalar(dtype=self._original_dtype, blob=self._blob if keep_blobs else None,
                      metadata=self._metadata)

    def get(self):
        return self.field_blobs()[0]

    def __call__(self):
        return self.get()

    @property
    def metadata(self):
        return self._metadata

    def set_metadata(self, value) -> None:
        if not isinstance(value, Metadata):
            raise TypeError(f"metadata must be Metadata, got {type(value).__name__}")
        self._metadata = value
        self._validate_metadata()

    def _validate_metadata(self) -> None:
        if (self._metadata is not None and self._metadata.categorical_limit is not None
                and self.dtype is not None and not np.issubdtype(self.dtype.base, np.integer)):
            raise TypeError(f"categorical_limit is only for integer fields, this one is {self.dtype}")

    def set_value(self, blob, throw_on_type_mismatch=False, unsafe=False) -> None:
        """A new value of the same dtype (checked against an array's dtype with throw_on_type_mismatch)."""
        if throw_on_type_mismatch and self.dtype.base != np.void:
            if not isinstance(blob, np.ndarray) or blob.dtype.base != self.dtype.base:
                raise TypeError(f"expected an array of {self.dtype.base}, got {blob!r}")
        self.set(dtype=self._original_dtype, blob=blob, unsafe=unsafe)

    def set(self, dtype=None, blob=None, metadata=None, unsafe=False) -> None:
        """Set the dtype and/or value: an array is converted to the dtype (a 0-d value that was not an array
        becomes 1-d; a rank > 1 value fixes the entry shape); a string is refused (a blob name or a value?)."""
        if isinstance(blob, (str, bytes)) and not isinstance(blob, BlobRef):
            raise ValueError("Passing str blob to Scalar.set() is ambiguous. Do either set(blob=np.array(blob)) "
                             "or set(blob=BlobReference(blob))")
        self._original_dtype = dtype
        dtype = None if dtype is None else np.dtype(dtype)
        if blob is not None and not isinstance(blob, BlobRef):
            was_array = isinstance(blob, np.ndarray)
            if dtype is not None and dtype != np.void:
                blob = np.array(blob, dtype=dtype.base)
                if blob.size == 0 and not was_array:
                    blob = blob.reshape((0,) + dtype.shape)
            elif not was_array:
                raise TypeError(f"Invalid blob type: {type(blob).__name__}")
            if blob.ndim == 0 and not was_array:
                blob = blob.reshape(1)
            if blob.ndim > 1 and dtype is not None and dtype.base != np.void:
                dtype = np.dtype((dtype.base, blob.shape[1:]))
        dtype = np.dtype(np.void) if dtype is None else dtype
        if dtype.fields:
            raise TypeError("Cannot create Scalar with a structured dtype. Use from_dtype instead.")
        self.dtype, self._blob = dtype, blob
        if metadata is not None:
            self.set_metadata(metadata)
        self._validate_metadata()

    def set_type(self, dtype) -> None:
        self._original_dtype = dtype
        self.dtype = np.dtype(np.void if dtype is None else dtype)
        self._validate_metadata()

    def _pprint_impl(self, indent, out):
        out.write(f"{'  ' * indent}Scalar({self.dtype!r}, {self._blob!r}, {self._metadata!r})\n")

    def id(self) -> int:
        """This leaf's position among the leaves of its record (the index into a reader's blobs)."""
        return self._child_base_id()
