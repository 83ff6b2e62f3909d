"""Vectors of tensors (Caffe2's dataset_ops): CreateTensorVector, TensorVectorSize, ConcatTensorVector,
CollectTensor (reservoir sampling into tensor vectors).

A tensor vector is an opaque blob value (TensorVector, a list of host arrays). CollectTensor keeps, per op, how
many tensors it has seen, as Caffe2's op does."""
from __future__ import annotations

import numpy as np

from ..core import backend
from ..core.errors import ArgumentError, ArityError, DTypeError, OpError, ShapeError
from .base import held_object, out_spec
from .registry import SHOULD_NOT_DO_GRADIENT, op


class TensorVector(list):
    """Caffe2's std::vector<Tensor> blob: tensors (host arrays) in order."""

    def __repr__(self):
        return f"TensorVector({len(self)} tensors)"


def _vector(value, i: int = 0) -> TensorVector:
    return held_object(value, TensorVector, i, "a tensor vector", "CreateTensorVector")


def _on_vector(out=None):
    def shape(specs, **_):
        _vector(specs[0])   # (a known spec is a tensor: an error before anything runs)
        return [] if out is None else [out]
    return shape


@op("CreateTensorVector", inputs=0, outputs=1, gradient=SHOULD_NOT_DO_GRADIENT)
def create_tensor_vector(xp):
    """A new empty tensor vector."""
    return TensorVector()


@op("TensorVectorSize", inputs=1, outputs=1, gradient=SHOULD_NOT_DO_GRADIENT,
    shape=_on_vector(out_spec((), np.int32)))
def tensor_vector_size(xp, vector):
    """The number of tensors in the vector (int32, 0-d)."""
    return np.asarray(len(_vector(vector)), np.int32)


@op("ConcatTensorVector", inputs=1, outputs=1, gradient=SHOULD_NOT_DO_GRADIENT, shape=_on_vector())
def concat_tensor_vector(xp, vector):
    """The vector's tensors concatenated along their first axis (they must agree in dtype and in the other
    dims, and be at least 1-D)."""
    vector = _vector(vector)
    if not vector:
        raise ShapeError("the tensor vector is empty: there is nothing to concatenate")
    first = vector[0]
    if first.ndim < 1:
        raise ShapeError("the tensor vector's first tensor is 0-d; concatenation needs tensors of 1 or more dims")
    for k, t in enumerate(vector[1:], 1):
        if t.dtype != first.dtype or t.shape[1:] != first.shape[1:]:
            raise ShapeError(f"tensor {k} of the vector is {t.shape} {t.dtype}, tensor 0 is {first.shape} "
                             f"{first.dtype}: they must agree in dtype and in every dim but the first")
    return xp.asarray(np.concatenate(vector, axis=0))


@op("CollectTensor", inputs=(2, None), outputs=(1, None), enforce_inplace=[(i, i) for i in range(1024)],
    context=True, random=True, gradient=SHOULD_NOT_DO_GRADIENT, args={"num_to_collect": -1})
def collect_tensor(ctx, xp, *inputs, num_to_collect, rng):
    """Reservoir sampling: inputs are n tensor vectors (also the outputs, in place) then n tensors. The first
    num_to_collect runs append each tensor (a copy) to its vector; a later run, the k-th (k counted from 0),
    draws a position uniformly from [0, k] and, if it is below num_to_collect, puts the tensors there, else
    drops them. The n tensors of one run are kept or dropped together, at one position."""
    if num_to_collect <= 0:
        raise ArgumentError(f"num_to_collect must be > 0, got {num_to_collect}")
    n = len(ctx.outputs)
    if len(inputs) != 2 * n:
        raise ArityError(f"CollectTensor takes n tensor vectors and n tensors, with the n vectors as outputs; got "
                         f"{len(inputs)} inputs and {n} outputs")
    vectors = [_vector(v, i) for i, v in enumerate(inputs[:n])]
    tensors = inputs[n:]
    for i, t in enumerate(tensors):
        if not hasattr(t, "dtype"):
            raise DTypeError(f"input {n + i} must be a tensor, got {type(t).__name__}")
    visited = ctx.state.get("visited", 0)
    if visited < num_to_collect:
        pos = visited
    else:
        pos = int(rng.integers(0, visited + 1))
        for i, v in enumerate(vectors):
            if len(v) != num_to_collect:
                raise OpError(f"tensor vector {i} holds {len(v)} tensors, but after {visited} runs it should hold "
                              f"num_to_collect={num_to_collect}")
    if pos < num_to_collect:
        for v, t in zip(vectors, tensors):
            copy = np.array(backend.to_host(t), copy=True)
            if pos >= len(v):
                v.append(copy)
            else:
                v[pos] = copy
    ctx.state["visited"] = visited + 1
    return (None,) * n
