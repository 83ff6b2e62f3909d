"""Dictionaries from keys to consecutive ids (Caffe2's index_ops): IntIndexCreate, LongIndexCreate,
StringIndexCreate, IndexGet, IndexLoad, IndexStore, IndexFreeze, IndexSize.

An index blob holds a KeyIndex: keys of one kind (int32, int64 or strings, kept as bytes) numbered 1, 2, ... in
the order they were added; id 0 stands for unknown keys. Its capacity `max_elements` counts the 0 entry. Save
writes it as Caffe2 does (a BlobProto of type "std::unique_ptr<caffe2::IndexBase>": the keys as a tensor, and
"<max_elements> <frozen>" as content) and Load reads it back as an index."""
from __future__ import annotations

import threading

import numpy as np

from ..core.errors import ArgumentError, DTypeError, FileFormatError, OpError
from ..io.blobs import register_blob_type
from ..io.proto import BlobProto
from ..io.tensors import array_to_tensor, tensor_to_array
from .base import held_object, like, out_spec
from .registry import NO_GRADIENT, SHOULD_NOT_DO_GRADIENT, op

INDEX_TYPE = "std::unique_ptr<caffe2::IndexBase>"
INT_MAX = 2**31 - 1   # max_elements' default (Caffe2 reads the argument as an int)
KINDS = {"int32": np.dtype(np.int32), "int64": np.dtype(np.int64), "string": np.dtype(object)}


class KeyIndex:
    """Keys of one kind (`kind`: "int32", "int64" or "string") with their ids, 1 up, at most max_elements - 1
    of them; a frozen index gives 0 for unknown keys instead of adding them."""

    def __init__(self, kind: str, max_elements: int = INT_MAX):
        self.kind, self.max_elements = kind, int(max_elements)
        self.ids: dict = {}
        self.frozen = False
        self._lock = threading.Lock()

    @property
    def size(self) -> int:
        """Caffe2's Size(): the next id to give, so the 0 entry is counted."""
        return len(self.ids) + 1

    def keys_of(self, x, what: str) -> list:
        """The keys of tensor x (flat) as dictionary keys: ints, or bytes for strings (str encoded in UTF-8)."""
        dtype = getattr(x, "dtype", None)
        if dtype != KINDS[self.kind]:
            got = dtype if dtype is not None else type(x).__name__
            raise DTypeError(f"{what} must hold {self.kind} keys for this index, got {got}")
        flat = np.asarray(x).reshape(-1).tolist()
        if self.kind != "string":
            return flat
        if not all(isinstance(k, (bytes, str)) for k in flat):
            raise DTypeError(f"{what} must hold strings, but it holds other objects")
        return [k.encode("utf-8") if isinstance(k, str) else k for k in flat]

    def get(self, keys: list) -> list[int]:
        with self._lock:
            if self.frozen:
                return [self.ids.get(k, 0) for k in keys]
            out = []
            for k in keys:
                got = self.ids.get(k)
                if got is None:
                    if self.size >= self.max_elements:
                        raise OpError(f"the index is full: it holds {len(self.ids)} keys and max_elements is "
                                      f"{self.max_elements} (counting the 0 entry for unknown keys)")
                    got = self.ids[k] = self.size
                out.append(got)
            return out

    def load(self, keys: list) -> None:
        if len(keys) > self.max_elements:
            raise ArgumentError(f"cannot load {len(keys)} keys into an index of max_elements "
                                f"{self.max_elements}")
        ids = {}
        for i, k in enumerate(keys):
            if ids.setdefault(k, i + 1) != i + 1:
                raise ArgumentError(f"cannot load the index: key {k!r} appears more than once")
        with self._lock:
            self.ids = ids

    def stored(self) -> np.ndarray:
        """The keys in id order (id 1 first) as a 1-D tensor of the index's kind."""
        with self._lock:
            keys = list(self.ids)
        out = np.empty(len(keys), KINDS[self.kind])
        out[:] = keys
        return out

    def __repr__(self):
        return (f"KeyIndex({self.kind}, {len(self.ids)} keys, max_elements={self.max_elements}"
                f"{', frozen' if self.frozen else ''})")


def _index(value) -> KeyIndex:
    return held_object(value, KeyIndex, 0, "an index", "IntIndexCreate, LongIndexCreate or StringIndexCreate")


def _creator(kind: str):
    def create(xp, *, max_elements):
        if max_elements < 1:
            raise ArgumentError(f"max_elements must be >= 1 (it counts the 0 entry), got {max_elements}")
        return KeyIndex(kind, max_elements)
    create.__doc__ = (f"A new empty index of {kind} keys numbered from 1 (0: unknown); max_elements counts the 0 "
                      "entry.")
    return create


for _name, _kind in (("IntIndexCreate", "int32"), ("LongIndexCreate", "int64"), ("StringIndexCreate", "string")):
    op(_name, inputs=0, outputs=1, gradient=NO_GRADIENT, args={"max_elements": INT_MAX})(_creator(_kind))


def _on_index(out=None):
    """Shape function of an op on an index: a known spec for input 0 is a tensor, which is an error."""
    def shape(specs, **_):
        _index(specs[0])
        return [] if out is None else [out(specs)]
    return shape


@op("IndexGet", inputs=2, outputs=1, gradient=NO_GRADIENT, shape=_on_index(lambda s: like(s[1], np.int64)))
def index_get(xp, index, keys):
    """The id of every key (int64, the keys' shape). An index that is not frozen adds the keys it lacks,
    failing when it would pass max_elements; a frozen one gives 0 for them."""
    index = _index(index)
    ids = index.get(index.keys_of(keys, "input 1 (keys)"))
    return np.asarray(ids, np.int64).reshape(keys.shape)


@op("IndexLoad", inputs=2, outputs=1, enforce_inplace=[(0, 0)], gradient=SHOULD_NOT_DO_GRADIENT,
    args={"skip_first_entry": 0}, shape=_on_index())
def index_load(xp, index, items, *, skip_first_entry):
    """Replace the index's keys with the elements of `items` (read flat), numbered 1, 2, ...; skip_first_entry
    leaves out its first element (the 0 entry of an embedding-aligned list). Repeated keys are an error."""
    index = _index(index)
    keys = index.keys_of(items, "input 1 (items)")
    if skip_first_entry:
        if not keys:
            raise ArgumentError("skip_first_entry is set but the items tensor is empty")
        keys = keys[1:]
    index.load(keys)


@op("IndexStore", inputs=1, outputs=1, gradient=SHOULD_NOT_DO_GRADIENT, shape=_on_index())
def index_store(xp, index):
    """The index's keys in id order (the key of id 1 first), a 1-D tensor of its kind (strings as bytes)."""
    return _index(index).stored()


@op("IndexFreeze", inputs=1, outputs=1, enforce_inplace=[(0, 0)], gradient=SHOULD_NOT_DO_GRADIENT,
    shape=_on_index())
def index_freeze(xp, index):
    """Freeze the index: from now on IndexGet gives 0 for unknown keys instead of adding them."""
    _index(index).frozen = True


@op("IndexSize", inputs=1, outputs=1, gradient=SHOULD_NOT_DO_GRADIENT,
    shape=_on_index(lambda s: out_spec((), np.int64)))
def index_size(xp, index):
    """The number of entries, the 0 entry included (int64, 0-d)."""
    return np.asarray(_index(index).size, np.int64)


# --------------------------------------------------------------------------------------------- Save / Load
def _index_proto(index: KeyIndex, name: str) -> BlobProto:
    proto = BlobProto(content=f"{index.max_elements} {int(index.frozen)}".encode())
    proto.tensor.CopyFrom(array_to_tensor(index.stored(), name=name))
    return proto


def _index_from_proto(proto: BlobProto) -> KeyIndex:
    keys = tensor_to_array(proto.tensor).reshape(-1)
    kind = next((k for k, dt in KINDS.items() if dt == keys.dtype), None)
    if kind is None:
        raise FileFormatError(f"a saved index holds int32, int64 or string keys, got {keys.dtype}")
    fields = bytes(proto.content).split()
    try:
        max_elements = int(fields[0]) if fields else 2**63 - 1
        frozen = bool(int(fields[1])) if len(fields) > 1 else False
    except ValueError:
        raise FileFormatError(f"a saved index's content must be '<max_elements> <frozen>', got "
                              f"{bytes(proto.content)[:40]!r}") from None
    index = KeyIndex(kind, max_elements)
    index.load(index.keys_of(keys, "the saved keys"))
    index.frozen = frozen
    return index


register_blob_type(KeyIndex, INDEX_TYPE, _index_proto, _index_from_proto, whole_proto=True)
