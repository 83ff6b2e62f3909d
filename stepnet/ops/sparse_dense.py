"""Sparse features to dense tensors and back: BatchSparseToDense / BatchDenseToSparse (Caffe2's
batch_sparse_to_dense_op.cc), SparseToDenseMask and its gradient (sparse_to_dense_mask_op.h/.cc), and
SparseLabelSplit and its gradient (label_ops.h/.cc). Lengths and ids are read on the host, as Caffe2 does;
the values move as arrays on the op's device. The gradient makers are declared with the forward ops, each
emitting Caffe2's gradient op.
"""
from __future__ import annotations

import math
import warnings

import numpy as np

from ..core.errors import ArgumentError, DTypeError, GradientError, ShapeError, StepnetWarning
from .base import host_ints, known_ints, on_device, out_spec, single_gradient, value_dependent
from .index import check_vector, read_lengths, require_int
from .registry import Arg, op


def _float_values(x, op_type: str, what: str) -> None:
    if x.dtype is not None and np.dtype(x.dtype).kind != "f":
        raise DTypeError(f"{op_type}: {what} must be a float tensor, got {x.dtype} (shape {tuple(x.shape)})")


def _lengths_total(op_type, lengths, count, read, what="indices") -> list[int] | None:
    require_int(lengths, "LENGTHS")
    lens = read_lengths(lengths, "LENGTHS", read)
    if lens is not None and sum(lens) != count:
        raise ShapeError(f"{op_type}: LENGTHS {tuple(lengths.shape)} sum to {sum(lens)} but there are {count} "
                         f"{what}; the lengths must sum to the number of {what}")
    return lens


def _cells(op_type, lens, ids, width: int) -> np.ndarray:
    """Flat positions row * width + id of every (row, id) pair, checking 0 <= id < width."""
    rows = np.repeat(np.arange(len(lens), dtype=np.int64), lens)
    ids = np.asarray(ids, dtype=np.int64)
    bad = np.flatnonzero((ids < 0) | (ids >= width))
    if bad.size:
        k = int(bad[0])
        raise ShapeError(f"{op_type}: INDICES[{k}] = {int(ids[k])} is out of range for a dense last dimension of "
                         f"{width} (valid: 0..{width - 1})")
    return rows * width + ids


def _last_of_each(cells: np.ndarray) -> np.ndarray:
    """Positions k of the last occurrence of every distinct cell (later writes win)."""
    _, first_from_end = np.unique(cells[::-1], return_index=True)
    return np.sort(cells.size - 1 - first_from_end)


# --------------------------------------------------------------------------------------------- BatchSparseToDense
def _batch_dense_width(op_type, indices, values, shaper, dense_last_dim) -> int:
    check_vector(indices, "INDICES")
    require_int(indices, "INDICES")
    if math.prod(values.shape) != math.prod(indices.shape):
        raise ShapeError(f"{op_type}: VALUES {tuple(values.shape)} must hold one value per index "
                         f"({math.prod(indices.shape)} INDICES)")
    _float_values(values, op_type, "VALUES")
    if shaper:
        if len(shaper[0].shape) != 2:
            raise ShapeError(f"{op_type}: output_shape_inference must be 2-D, got {tuple(shaper[0].shape)}")
        if dense_last_dim not in (-1, shaper[0].shape[1]):
            raise ArgumentError(f"{op_type}: dense_last_dim={dense_last_dim} differs from the last dimension of "
                                f"output_shape_inference {tuple(shaper[0].shape)}")
        return shaper[0].shape[1]
    if dense_last_dim < 1:
        raise ArgumentError(f"{op_type}: dense_last_dim must be >= 1 (or give output_shape_inference), got "
                            f"{dense_last_dim}")
    return dense_last_dim


def _batch_sparse_shape(specs, dense_last_dim, default_value):
    lengths, indices, values, *shaper = specs
    width = _batch_dense_width("BatchSparseToDense", indices, values, shaper, dense_last_dim)
    _lengths_total("BatchSparseToDense", lengths, indices.shape[0], known_ints)
    return [out_spec((lengths.shape[0], width), values.dtype)]


@op("BatchSparseToDense", inputs=(3, 4), outputs=1, inplace=(), shape=_batch_sparse_shape, grows="shapes",
    args={"dense_last_dim": Arg("int", -1, "the output's last dimension"),
          "default_value": Arg("float", 0.0, "the value of cells no index names")},
    gradient=single_gradient("BatchDenseToSparse", ["I0", "I1", "GO0"], ["GI2"]))
def batch_sparse_to_dense(xp, lengths, indices, values, *shaper, dense_last_dim, default_value):
    """(LENGTHS, INDICES, VALUES[, output_shape_inference]) -> len(LENGTHS) x dense_last_dim: row i holds
    VALUES at the INDICES of its LENGTHS[i] entries, default_value elsewhere (a repeated index: the last)."""
    width = _batch_dense_width("BatchSparseToDense", indices, values, shaper, dense_last_dim)
    lens = _lengths_total("BatchSparseToDense", lengths, indices.shape[0], host_ints)
    cells = _cells("BatchSparseToDense", lens, host_ints(indices, "INDICES"), width)
    keep = _last_of_each(cells)
    out = xp.full((len(lens) * width,), default_value, dtype=values.dtype)
    if keep.size:
        out[on_device(xp, cells[keep], np.int64)] = xp.take(values.reshape(-1), on_device(xp, keep, np.int64))
    return out.reshape(len(lens), width)


def _batch_gather_checks(lengths, indices, dense, read):
    check_vector(indices, "INDICES")
    require_int(indices, "INDICES")
    _float_values(dense, "BatchDenseToSparse", "DENSE")
    if len(dense.shape) != 2 or dense.shape[0] != lengths.shape[0]:
        raise ShapeError(f"BatchDenseToSparse: DENSE must be a matrix with one row per length "
                         f"({lengths.shape[0]} LENGTHS), got {tuple(dense.shape)}")
    return _lengths_total("BatchDenseToSparse", lengths, indices.shape[0], read)


def _batch_gather_shape(specs, **_):
    lengths, indices, dense = specs
    _batch_gather_checks(lengths, indices, dense, known_ints)
    return [out_spec(indices.shape, dense.dtype)]


@op("BatchDenseToSparse", inputs=3, outputs=1, inplace=(), shape=_batch_gather_shape,
    args={"dense_last_dim": Arg("int", -1, "ignored (copied from BatchSparseToDense)"),
          "default_value": Arg("float", 0.0, "ignored (copied from BatchSparseToDense)")},
    gradient=single_gradient("BatchSparseToDense", ["I0", "I1", "GO0", "I2"], ["GI2"]))
def batch_dense_to_sparse(xp, lengths, indices, dense, **_):
    """(LENGTHS, INDICES, DENSE) -> VALUES: VALUES[k] = DENSE[i, INDICES[k]] for the entries k of row i;
    BatchSparseToDense's inverse (and gradient)."""
    lens = _batch_gather_checks(lengths, indices, dense, host_ints)
    cells = _cells("BatchDenseToSparse", lens, host_ints(indices, "INDICES"), dense.shape[1])
    return xp.take(dense.reshape(-1), on_device(xp, cells, np.int64)).reshape(indices.shape)


# --------------------------------------------------------------------------------------------- SparseToDenseMask
MASK_ARGS = {"mask": Arg("ints", [], "the ids, in the order of the output's mask dimension"),
             "return_presence_mask": Arg("bool", False, "also output which cells were present"),
             "max_skipped_indices": Arg("int", 5, "invalid ids (negative, or the index type's largest) tolerated "
                                        "per run: that many is an error")}


def mask_positions(mask) -> dict[int, int]:
    """id -> its position in `mask`, after Caffe2's checks (non-empty, ids >= 0, no duplicates)."""
    if not mask:
        raise ArgumentError("SparseToDenseMask: 'mask' must list at least one id")
    where = {}
    for i, v in enumerate(mask):
        if v < 0:
            raise ArgumentError(f"SparseToDenseMask: mask[{i}] = {v}; only non-negative ids are allowed")
        if v in where:
            raise ArgumentError(f"SparseToDenseMask: mask has the id {v} twice (mask[{where[v]}] and mask[{i}])")
        where[v] = i
    return where


def _mask_geometry(indices, values, default, lengths, mask, read):
    """(rows or None without LENGTHS, the lengths, the id -> column map) after SparseToDenseMask's checks."""
    cols = mask_positions(mask)
    check_vector(indices, "INDICES")
    require_int(indices, "INDICES")
    count = indices.shape[0]
    if len(values.shape) < 1 or values.shape[0] != count:
        raise ShapeError(f"SparseToDenseMask: VALUES {tuple(values.shape)} must have one row per index ({count} "
                         "INDICES)")
    if tuple(default.shape) != tuple(values.shape[1:]):
        raise ShapeError(f"SparseToDenseMask: DEFAULT {tuple(default.shape)} must have the shape of one row of "
                         f"VALUES {tuple(values.shape)}, i.e. {tuple(values.shape[1:])}")
    if values.dtype is not None and default.dtype is not None and values.dtype != default.dtype:
        raise DTypeError(f"SparseToDenseMask: VALUES ({values.dtype}) and DEFAULT ({default.dtype}) must have one "
                         "dtype")
    if not lengths:
        return None, [count], cols
    lens = _lengths_total("SparseToDenseMask", lengths[0], count, read)
    return lengths[0].shape[0], lens, cols


def _mask_cells(lens, ids, cols) -> tuple[np.ndarray, np.ndarray]:
    """(entries k that fill a cell, their flat cells row * len(mask) + column): ids outside the mask fill
    nothing, and of several entries with one id in a row the last fills the cell."""
    row_of = np.repeat(np.arange(len(lens), dtype=np.int64), lens)
    col = np.array([cols.get(int(v), -1) for v in ids], dtype=np.int64)
    picked = np.flatnonzero(col >= 0)
    cells = row_of[picked] * len(cols) + col[picked]
    last = _last_of_each(cells)
    return picked[last], cells[last]


def _mask_gradient(g):
    """SparseToDenseMask -> SparseToDenseMaskGradient(indices, dY[, lengths]) -> dVALUES (forward args copied)."""
    g.op("SparseToDenseMaskGradient", [g.I(0), g.GO(0)] + ([g.I(3)] if g.n_inputs == 4 else []), [g.GI(1)])


def _mask_shape(specs, mask, return_presence_mask, max_skipped_indices):
    indices, values, default, *lengths = specs
    rows, _, cols = _mask_geometry(indices, values, default, lengths, mask, known_ints)
    lead = () if rows is None else (rows,)
    out = [out_spec(lead + (len(cols),) + tuple(default.shape), values.dtype)]
    return out + ([out_spec(lead + (len(cols),), np.bool_)] if return_presence_mask else [])


@op("SparseToDenseMask", inputs=(3, 4), outputs=(1, 2), inplace=(), args=MASK_ARGS, shape=_mask_shape,
    grows="shapes",
    gradient=_mask_gradient)
def sparse_to_dense_mask(xp, indices, values, default, *lengths, mask, return_presence_mask, max_skipped_indices):
    """(INDICES, VALUES, DEFAULT[, LENGTHS]) -> [len(LENGTHS) x] len(mask) x DEFAULT's shape: the cell of
    mask[j] holds the VALUES row whose index is mask[j] (the last one in its row of LENGTHS), DEFAULT when none
    is. Ids not in the mask are dropped; invalid ids (negative, or the largest value of INDICES' dtype) are
    skipped with a warning, and max_skipped_indices or more of them is an error (Caffe2 counts them one by
    one; its later versions count rows, with a default of 50). LENGTHS must sum to the number of INDICES.
    return_presence_mask adds a bool tensor of the cells that were present."""
    rows, lens, cols = _mask_geometry(indices, values, default, lengths, mask, host_ints)
    ids = np.asarray(host_ints(indices, "INDICES"), dtype=np.int64)
    row_of = np.repeat(np.arange(len(lens), dtype=np.int64), lens)
    bad = (ids < 0) | (ids >= np.iinfo(indices.dtype).max)
    skipped = int(bad.sum())
    if skipped:
        warnings.warn(f"SparseToDenseMask: skipped {skipped} invalid id(s) in {np.unique(row_of[bad]).size} "
                      "row(s)", StepnetWarning, stacklevel=2)
        if skipped >= max_skipped_indices:
            raise ShapeError(f"SparseToDenseMask: {skipped} INDICES are invalid (negative, or the largest "
                             f"{indices.dtype}); max_skipped_indices={max_skipped_indices} allows fewer")
    keep, cells = _mask_cells(lens, np.where(bad, -1, ids), cols)
    n_rows = len(lens)
    out = xp.broadcast_to(default, (n_rows * len(cols),) + tuple(default.shape)).copy()
    present = xp.zeros((n_rows * len(cols),), dtype=np.bool_)
    if keep.size:
        where = on_device(xp, cells, np.int64)
        out[where] = xp.take(values, on_device(xp, keep, np.int64), axis=0)
        present[where] = True
    lead = (len(cols),) if rows is None else (rows, len(cols))
    result = out.reshape(lead + tuple(default.shape))
    return (result, present.reshape(lead)) if return_presence_mask else result


def _mask_gradient_geometry(indices, grad, lengths, mask, read):
    cols = mask_positions(mask)
    check_vector(indices, "INDICES")
    require_int(indices, "INDICES")
    count = indices.shape[0]
    gs = tuple(grad.shape)
    if lengths:
        lens = _lengths_total("SparseToDenseMaskGradient", lengths[0], count, read)
        rows = lengths[0].shape[0]
        if len(gs) < 2 or gs[:2] != (rows, len(cols)):
            raise ShapeError(f"SparseToDenseMaskGradient: the output gradient {gs} must start with (len(LENGTHS), "
                             f"len(mask)) = ({rows}, {len(cols)})")
        return lens, cols, gs[2:]
    if len(gs) < 1 or gs[0] != len(cols):
        raise ShapeError(f"SparseToDenseMaskGradient: the output gradient {gs} must start with len(mask) = "
                         f"{len(cols)}")
    return [count], cols, gs[1:]


@op("SparseToDenseMaskGradient", inputs=(2, 3), outputs=1, inplace=(), args=MASK_ARGS,
    shape=lambda s, mask, **_: [out_spec((s[0].shape[0],) + _mask_gradient_geometry(s[0], s[1], s[2:], mask,
                                                                                    known_ints)[2], s[1].dtype)])
def sparse_to_dense_mask_gradient(xp, indices, grad, *lengths, mask, **_):
    """(INDICES, dY[, LENGTHS]) -> dVALUES: the entry that filled a cell (the last one with that id in its row)
    gets the cell's gradient, every other entry zeros."""
    lens, cols, block = _mask_gradient_geometry(indices, grad, lengths, mask, host_ints)
    ids = host_ints(indices, "INDICES")
    keep, cells = _mask_cells(lens, ids, cols)
    out = xp.zeros((len(ids),) + tuple(block), dtype=grad.dtype)
    if keep.size:
        flat = grad.reshape((len(lens) * len(cols),) + tuple(block))
        out[on_device(xp, keep, np.int64)] = xp.take(flat, on_device(xp, cells, np.int64), axis=0)
    return out


# --------------------------------------------------------------------------------------------- SparseLabelSplit
def _label_count(num_labels: int, n_out: int, op_type="SparseLabelSplit") -> int:
    if num_labels == -1:
        return n_out // 2
    if n_out not in (2 * num_labels, 2 * num_labels + 1):
        raise ArgumentError(f"{op_type}: num_labels={num_labels} needs {2 * num_labels} outputs (values and example "
                            f"ids per label) or {2 * num_labels + 1} (with the offset map), got {n_out}")
    return num_labels


def _label_checks(lengths, indices, values, read):
    for x, what in ((indices, "label_index"), (values, "label_value")):
        check_vector(x, what)
    require_int(indices, "label_index")
    _float_values(values, "SparseLabelSplit", "label_value")
    if values.shape[0] != indices.shape[0]:
        raise ShapeError(f"SparseLabelSplit: label_value {tuple(values.shape)} must have one value per label_index "
                         f"({indices.shape[0]})")
    return _lengths_total("SparseLabelSplit", lengths, indices.shape[0], read, "labels")


def _label_split_shape(specs, num_labels):
    lengths, indices, values = specs
    _label_checks(lengths, indices, values, known_ints)
    if num_labels < 0:
        return []   # the label count is the op's output count
    return ([value_dependent((None,), values.dtype)] * num_labels + [value_dependent((None,), np.int32)] * num_labels
            + [out_spec(indices.shape, np.int32)])


def _label_split_gradient(g):
    """SparseLabelSplit -> SparseLabelSplitGradient(length, label_index, d(values of each label)[, offset map])."""
    n = g.arg("num_labels")
    if not isinstance(n, int) or n < 0:
        raise GradientError("the gradient of SparseLabelSplit needs its num_labels argument", at=g.label)
    extra = [g.O(2 * n)] if g.n_outputs > 2 * n else []
    g.op("SparseLabelSplitGradient", [g.I(0), g.I(1)] + [g.GO(i) for i in range(n)] + extra, [g.GI(2)])


@op("SparseLabelSplit", inputs=3, outputs=(2, None), inplace=(), context=True, shape=_label_split_shape,
    args={"num_labels": Arg("int", -1, "number of labels (default: half the outputs)")},
    gradient=_label_split_gradient)
def sparse_label_split(ctx, xp, lengths, indices, values, num_labels):
    """(length, label_index, label_value) -> the values of each label 0..n-1 in order, then the example (row of
    length) of each of them as int32, then (with a (2n+1)-th output) each entry's position within its label."""
    n = _label_count(num_labels, len(ctx.opdef.output))
    lens = _label_checks(lengths, indices, values, host_ints)
    labels = np.asarray(host_ints(indices, "label_index"), dtype=np.int64)
    bad = np.flatnonzero((labels < 0) | (labels >= n))
    if bad.size:
        raise ShapeError(f"SparseLabelSplit: label_index[{int(bad[0])}] = {int(labels[bad[0]])} is out of range "
                         f"for {n} labels (valid: 0..{n - 1})")
    example = np.repeat(np.arange(len(lens), dtype=np.int32), lens)
    offsets = np.zeros(labels.size, dtype=np.int32)
    out_values, out_ids = [], []
    for label in range(n):
        ks = np.flatnonzero(labels == label)
        offsets[ks] = np.arange(ks.size, dtype=np.int32)
        out_values.append(xp.take(values, on_device(xp, ks, np.int64)))
        out_ids.append(on_device(xp, example[ks], np.int32))
    extra = [on_device(xp, offsets, np.int32)] if len(ctx.opdef.output) > 2 * n else []
    return tuple(out_values + out_ids + extra)


@op("SparseLabelSplitGradient", inputs=(3, None), outputs=1, inplace=(),
    args={"num_labels": Arg("int", 0, "number of labels")})
def sparse_label_split_gradient(xp, lengths, indices, *grads, num_labels):
    """(length, label_index, d(values) of each label[, offset map]) -> d(label_value): entry k takes the gradient
    of its place in its label's values."""
    if num_labels <= 0 or len(grads) not in (num_labels, num_labels + 1):
        raise ArgumentError(f"SparseLabelSplitGradient: num_labels must be positive and match the inputs (the "
                            f"value gradients of {num_labels} labels and maybe the offset map), got {len(grads)}")
    if len(indices.shape) != 1:
        raise ShapeError(f"SparseLabelSplitGradient: label_index must be 1-D, got shape {tuple(indices.shape)}")
    _lengths_total("SparseLabelSplitGradient", lengths, indices.shape[0], host_ints, "labels")
    labels = np.asarray(host_ints(indices, "label_index"), dtype=np.int64)
    offsets = (np.asarray(host_ints(grads[num_labels], "offset map"), dtype=np.int64) if len(grads) > num_labels
               else None)
    out = xp.zeros(labels.shape, dtype=grads[0].dtype)
    for label in range(num_labels):
        ks = np.flatnonzero(labels == label)
        at = np.arange(ks.size) if offsets is None else offsets[ks]
        if ks.size and (at.max() >= grads[label].shape[0] or at.min() < 0):
            raise ShapeError(f"SparseLabelSplitGradient: the gradient of label {label} has {grads[label].shape[0]} "
                             f"entries, too few for its {ks.size} labels")
        if ks.size:
            out[on_device(xp, ks, np.int64)] = xp.take(grads[label], on_device(xp, at, np.int64))
    return out
