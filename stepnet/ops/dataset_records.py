"""Whole datasets (Caffe2's dataset_ops): CheckDatasetConsistency, TrimDataset, Append, AtomicAppend (under a
CreateMutex lock), PackRecords and UnPackRecords.

CheckDatasetConsistency and TrimDataset read a dataset's fields as dataset_ops describes them. Append and
AtomicAppend add rows to tensors that hold a dataset's fields, in place. PackRecords turns a dataset
(fields as dataset_ops describes them) into a 1-D object tensor with one record per top-level entry, a record
being a TensorVector holding that entry's data in every field; UnPackRecords concatenates records back into
one tensor per field."""
from __future__ import annotations

import numpy as np

from ..core import backend
from ..core.errors import ArgumentError, ArityError, DTypeError, ShapeError
from .base import Meta, out_spec
from .dataset_ops import FIELDS, Tree, check_outputs, check_sizes, domain_sizes, field_tensors, lengths_of, walk
from .registry import SHOULD_NOT_DO_GRADIENT, op
from .tensor_vector import TensorVector
from .util import Mutex

STRINGS = "OUS"


def _same_type(a, b) -> bool:
    """Caffe2's meta equality: one dtype (strings of any numpy form are one type, std::string)."""
    return a.dtype == b.dtype or (a.dtype.kind in STRINGS and b.dtype.kind in STRINGS)


def _tensor(x, what: str):
    if not hasattr(x, "shape"):
        raise DTypeError(f"{what} must be a tensor, got {'nothing (never written)' if x is None else type(x).__name__}")
    return np.asarray(backend.to_host(x))


@op("CheckDatasetConsistency", inputs=(1, None), outputs=0, gradient=SHOULD_NOT_DO_GRADIENT, args=FIELDS)
def check_dataset_consistency(xp, *data, fields):
    """The inputs (one per field) must form a dataset of the given fields: the fields of a domain have as many
    entries, and each lengths field's lengths add up to exactly the entries of the domain it defines."""
    tree = Tree(fields)
    arrays = field_tensors(tree, data, 0)
    limits = domain_sizes(tree, arrays, exact=True)
    end = walk(tree, lengths_of(tree, arrays), limits, [0] * tree.domains, [0, limits[0]])[1]
    for k, lid in enumerate(tree.length_ids):
        if limits[k + 1] is None:
            raise ShapeError(f"field {lid} ({tree.names[lid]!r}) defines a domain that no field belongs to")
        if end[k + 1] != limits[k + 1]:
            raise ShapeError(f"inconsistent lengths: field {lid} ({tree.names[lid]!r}) adds up to {end[k + 1]}, "
                             f"but the fields of its domain have {limits[k + 1]} entries")


@op("TrimDataset", inputs=(1, None), outputs=(1, None), enforce_inplace=[(i, i) for i in range(1024)],
    context="structure", gradient=SHOULD_NOT_DO_GRADIENT, args={**FIELDS, "multiple_of": 1})
def trim_dataset(ctx, xp, *data, fields, multiple_of):
    """In place: drop the last top-level entries (and their data in every domain) so that their number is a
    multiple of multiple_of (>= 1)."""
    if multiple_of < 1:
        raise ArgumentError(f"multiple_of must be >= 1, got {multiple_of}")
    tree = Tree(fields)
    arrays = field_tensors(tree, data, 0)
    check_outputs(ctx, len(arrays))
    limits = domain_sizes(tree, arrays)
    keep = limits[0] // multiple_of * multiple_of
    if keep == limits[0]:
        return (None,) * len(arrays)
    end = walk(tree, lengths_of(tree, arrays), limits, [0] * tree.domains, [0, keep])[1]
    return tuple(x[:end[d]].copy() for x, d in zip(arrays, tree.domain))


def _starts_empty(a) -> bool:
    return a.size == 0 and a.ndim >= 1 and a.shape[0] == 0


def _check_append(a, b, what: str) -> None:
    """b's rows can follow a's: b at least 1-D and, unless a is empty along dim 0, the same dtype and dims
    after the first."""
    if b.ndim < 1:
        raise ShapeError(f"{what}: the data to append is 0-d; it must have at least 1 dim (its rows)")
    if _starts_empty(a):
        return
    if a.ndim != b.ndim:
        raise ShapeError(f"{what}: cannot append a {b.ndim}-D tensor {b.shape} to a {a.ndim}-D one {a.shape}")
    if not _same_type(a, b):
        raise DTypeError(f"{what}: cannot append {b.dtype} data to a {a.dtype} tensor")
    if a.shape[1:] != b.shape[1:]:
        raise ShapeError(f"{what}: cannot append rows of shape {b.shape[1:]} to rows of shape {a.shape[1:]}")


def _appended(a, b):
    return b.copy() if _starts_empty(a) else np.concatenate([a, b])


def _grown(a, b) -> tuple:
    a, b = np.shape(a), np.shape(b)
    return tuple(b) if not a or a[0] == 0 or not b else (a[0] + b[0], *a[1:])


def _append_shape(specs, **_):
    a, b = Meta(specs[0]), Meta(specs[1])
    if a.dtype is None or b.dtype is None:
        return []
    _check_append(a, b, "Append")
    return [out_spec(_grown(a, b), b.dtype if _starts_empty(a) else a.dtype)]


def _append_alloc(a, b, **_):
    if not (hasattr(a, "shape") and hasattr(b, "shape")):
        return []    # (the kernel's error)
    return [(0, _grown(a, b), b.dtype)]


@op("Append", inputs=2, outputs=1, enforce_inplace=[(0, 0)], gradient=SHOULD_NOT_DO_GRADIENT, shape=_append_shape,
    alloc=_append_alloc)
def append(xp, dataset, new_data):
    """In place: the rows of new_data (input 1) after those of dataset (input 0, also the output). Both have the
    same dtype and dims after the first; a dataset empty along dim 0 becomes a copy of new_data."""
    a, b = _tensor(dataset, "input 0"), _tensor(new_data, "input 1")
    _check_append(a, b, "Append")
    return _appended(a, b)


def _split(inputs) -> int:
    if len(inputs) % 2 != 1:
        raise ArityError(f"AtomicAppend takes a mutex, n tensors and n tensors to append to them; got "
                         f"{len(inputs)} inputs")
    return (len(inputs) - 1) // 2


@op("AtomicAppend", inputs=(3, None), outputs=(1, None), inplace=[(i + 1, i) for i in range(1024)], context=True,
    gradient=SHOULD_NOT_DO_GRADIENT)
def atomic_append(ctx, xp, mutex, *data):
    """Holding the mutex (input 0, made by CreateMutex): inputs 1..n are tensors (outputs 0..n-1, in place),
    inputs n+1..2n the rows to append to each, as Append does; every pair is checked before any is changed."""
    if not isinstance(mutex, Mutex):
        raise DTypeError(f"input 0 must be a mutex made by CreateMutex, got "
                         f"{'nothing (never written)' if mutex is None else type(mutex).__name__}")
    n = _split((mutex, *data))
    if len(ctx.outputs) != n:
        raise ArityError(f"AtomicAppend appends to {n} tensor(s), so it has {n} outputs, got {len(ctx.outputs)}")
    with mutex:   # the tensors as they are now (another thread may have appended since the op's inputs were read),
        # and the results stored before the lock is let go
        current = [ctx.inputs[i + 1].value for i in range(n)]
        pairs = [(_tensor(current[i], f"input {i + 1}"), _tensor(data[n + i], f"input {n + i + 1}")) for i in range(n)]
        for i, (a, b) in enumerate(pairs):
            _check_append(a, b, f"field {i}")
            if a.size and ctx.opdef.input[i + 1] != ctx.opdef.output[i]:
                raise ArgumentError(f"field {i}: output {i} must be input {i + 1} ({ctx.opdef.input[i + 1]!r}): "
                                    "a non-empty tensor is appended to in place")
        check_sizes(ctx, [(i, _grown(a, b), b.dtype) for i, (a, b) in enumerate(pairs)])
        for i, (a, b) in enumerate(pairs):
            ctx.outputs[i].set(_appended(a, b))
    return None


def _pack_shape(specs, fields):
    tree = Tree(fields)
    if len(specs) != len(tree.names):
        raise ArityError(f"the dataset has {len(tree.names)} fields, but the op gives {len(specs)} field tensors")
    for i, s in enumerate(specs):
        if len(s.shape) < 1:
            raise ShapeError(f"input {i} (field {tree.names[i]!r}) is 0-d; a field holds its entries along dim 0")
    return [out_spec((min(s.shape[0] for s, d in zip(specs, tree.domain) if d == 0),), np.object_)]


def _pack_alloc(*data, fields):
    tree = Tree(fields)
    return [(0, (domain_sizes(tree, field_tensors(tree, data, 0))[0],), np.object_)]


@op("PackRecords", inputs=(1, None), outputs=1, args=FIELDS, gradient=SHOULD_NOT_DO_GRADIENT, shape=_pack_shape,
    alloc=_pack_alloc)
def pack_records(xp, *data, fields):
    """The dataset (one input per field) as a 1-D object tensor of records, one per top-level entry: a record
    holds the entry's data in every field, in order (UnPackRecords reverses this)."""
    tree = Tree(fields)
    arrays = field_tensors(tree, data, 0)
    limits = domain_sizes(tree, arrays)
    n = limits[0]
    table = walk(tree, lengths_of(tree, arrays), limits, [0] * tree.domains, np.arange(n + 1, dtype=np.int64))
    out = np.empty(n, dtype=np.object_)
    for r in range(n):
        out[r] = TensorVector(x[table[r, d]:table[r + 1, d]].copy() for x, d in zip(arrays, tree.domain))
    return out


def _unpack_plan(packed, protos, fields) -> tuple:
    """(the records, each output's shape, each output's dtype), with Caffe2's checks."""
    if getattr(packed, "dtype", None) != np.object_:
        what = getattr(packed, "dtype", None) or (
            "nothing (never written)" if packed is None else type(packed).__name__)
        raise DTypeError(f"input 0 must be a packed tensor made by PackRecords, got {what}")
    rows = list(np.asarray(packed).reshape(-1))
    for r, record in enumerate(rows):
        if not isinstance(record, TensorVector):
            raise DTypeError(f"element {r} of the packed tensor is {type(record).__name__}, not a record made by "
                             "PackRecords")
    if not rows and not protos:
        raise ArgumentError("the packed tensor is empty: give prototype tensors (inputs 1..) for the outputs' "
                            "shapes and types")
    templates = [_tensor(p, f"input {i + 1}") for i, p in enumerate(protos)] if protos else list(rows[0])
    if len(templates) != len(fields):
        where = "prototype tensors" if protos else "tensors in the first record"
        raise ArityError(f"fields names {len(fields)} fields, but there are {len(templates)} {where}")
    for j, t in enumerate(templates):
        if t.ndim < 1:
            raise ShapeError(f"field {j} ({fields[j]!r}): the prototype is 0-d; fields have at least 1 dim")
    shapes = [[0, *t.shape[1:]] for t in templates]
    for r, record in enumerate(rows):
        if len(record) != len(fields):
            raise ArityError(f"record {r} holds {len(record)} tensors, not one per field ({len(fields)})")
        for j, t in enumerate(record):
            if t.ndim != len(shapes[j]) or not _same_type(t, templates[j]) or t.shape[1:] != tuple(shapes[j][1:]):
                raise ShapeError(f"record {r}, field {j} ({fields[j]!r}): {t.shape} {t.dtype} does not match "
                                 f"{tuple(['N', *shapes[j][1:]])} {templates[j].dtype}")
            shapes[j][0] += t.shape[0]
    return rows, [tuple(s) for s in shapes], [t.dtype for t in templates]


@op("UnPackRecords", inputs=(1, None), outputs=(1, None), context=True, args=FIELDS,
    gradient=SHOULD_NOT_DO_GRADIENT)
def unpack_records(ctx, xp, packed, *protos, fields):
    """The records of a packed tensor (PackRecords') concatenated back into one tensor per field. Optional
    inputs 1..n: prototype tensors giving each output's dtype and dims after the first (needed when the packed
    tensor may be empty)."""
    rows, shapes, dtypes = _unpack_plan(packed, protos, fields)
    if len(ctx.outputs) != len(fields):
        raise ArityError(f"fields names {len(fields)} fields, but the op has {len(ctx.outputs)} outputs")
    check_sizes(ctx, [(j, s, d) for j, (s, d) in enumerate(zip(shapes, dtypes))])
    if not rows:
        return tuple(np.empty(s, d) for s, d in zip(shapes, dtypes))
    return tuple(np.concatenate([record[j] for record in rows]).astype(dtypes[j], copy=False)
                 for j in range(len(shapes)))
