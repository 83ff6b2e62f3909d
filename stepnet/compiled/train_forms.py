"""Compiled forms of the ops a training net runs once a step around its layers (compiled.forms has those of the
step nets and predict nets): the label cross entropy and its gradient, the loss gradient's seed (ConstantFill),
the learning rate and the SGD update (WeightedSum in place). Each computes with its kernel's own arithmetic (the
shared functions in stepnet.ops); the checks that depend only on shapes, dtypes and arguments are made once,
those that depend on values (the labels' range, the iteration counter) at every call."""
from __future__ import annotations

import numpy as np

from ..ops.fill import constant_plan
from ..ops.loss import check_label_values, mean_gradient, mean_into, xent_gradient_values, xent_values
from ..ops.lr import rate, schedule
from ..ops.sums import weighted_sum_in_place, writable_alone
from .cell_forms import FLOATS, Fast, Unsettled, bound_args


def _labelled(X, label, out_ok: bool):
    """picked(ins) -> (the flat indices of the labels' entries, the probabilities there) of N x D... float
    probabilities X and int32 labels of shape (N,) or (N, 1), the labels' range checked every call (arrays made
    once, rewritten each call); None for other inputs or out_ok false."""
    if not out_ok or X.dtype not in FLOATS or X.ndim < 2 or not X.size or label.dtype != np.int32:
        return None
    n, d = X.shape[0], X.size // X.shape[0]
    if label.shape not in ((n,), (n, 1)):
        return None
    starts, at, values = np.arange(n) * d, np.empty(n, np.intp), np.empty(n, X.dtype)

    def picked(ins):
        labels = ins[1].reshape(n)
        check_label_values(np, labels, d)
        np.add(starts, labels, out=at)
        np.take(ins[0].reshape(-1), at, out=values)
        return at, values
    return picked


def label_cross_entropy(bop, ins, outs):
    """LabelCrossEntropy: the labels' entries gathered, ops.loss.xent_values into the output."""
    X, label = ins
    picked = _labelled(X, label, outs[0].shape == (X.shape[0],) and outs[0].dtype == X.dtype)
    if picked is None:
        return None

    def run(ins, outs):
        xent_values(np, picked(ins)[1], out=outs[0])
    return Fast(run)


def label_cross_entropy_gradient(bop, ins, outs):
    """LabelCrossEntropyGradient: the output zeroed, ops.loss.xent_gradient_values at the labels' entries."""
    X, label, dY = ins
    picked = _labelled(X, label, outs[0].shape == X.shape and outs[0].dtype == X.dtype == dY.dtype
                       and dY.shape == (X.shape[0],))
    if picked is None:
        return None

    def run(ins, outs):
        at, values = picked(ins)
        out = outs[0].reshape(-1)
        out.fill(0)
        out[at] = xent_gradient_values(np, ins[2], values)
    return Fast(run)


def averaged_loss(bop, ins, outs):
    """AveragedLoss of a float tensor: ops.loss.mean_into into the 0-D output."""
    X = ins[0]
    if X.dtype not in FLOATS or outs[0].shape != () or outs[0].dtype != X.dtype:
        return None

    def run(ins, outs):
        mean_into(np, ins[0], outs[0].reshape(1))
    return Fast(run)


def averaged_loss_gradient(bop, ins, outs):
    """AveragedLossGradient: ops.loss.mean_gradient written into every element of dX."""
    X, d = ins
    if X.dtype not in FLOATS or d.size != 1 or outs[0].shape != X.shape or outs[0].dtype != X.dtype:
        return None

    def run(ins, outs):
        outs[0].fill(mean_gradient(ins[0], ins[1])[0])
    return Fast(run)


def reshape(bop, ins, outs):
    """Reshape as it ran when the program was built: X's elements copied into the output of the shape it made,
    X's old shape (the values it wrote) into the second output. A shape input is checked every call (other
    values send the op and the rest of the run op by op)."""
    x, y, dims = ins[0], outs[0], outs[1]
    if y.size != x.size or y.dtype != x.dtype or dims.shape != (x.ndim,):
        return None
    given = None
    if len(ins) > 1:
        if ins[1].ndim != 1 or ins[1].dtype.kind not in "iu":
            return None
        given = ins[1].tolist()
    new, old = y.shape, dims.copy()

    def run(ins, outs):
        if given is not None and ins[1].tolist() != given:
            raise Unsettled(redo=True)
        np.copyto(outs[0], ins[0].reshape(new))
        np.copyto(outs[1], old)
    return Fast(run)


def constant_fill(bop, ins, outs):
    """ConstantFill of a shape given by arguments or by its input's shape (not its values): the value written
    into the output."""
    args = bound_args(bop)
    if args["input_as_shape"] or outs[0].dtype == object:
        return None
    _, shape, value = constant_plan(ins, **args)
    if tuple(shape) != outs[0].shape:
        return None

    def run(ins, outs):
        outs[0].fill(value)
    return Fast(run)


def learning_rate(bop, ins, outs):
    """LearningRate with its schedule built once (ops.lr.schedule) and ops.lr.rate per call."""
    args = bound_args(bop)
    if ins[0].dtype != np.int64 or not ins[0].size or outs[0].shape != () or outs[0].dtype != np.float32:
        return None
    f, base = schedule(args), args["base_lr"]

    def run(ins, outs):
        outs[0][()] = rate(f, base, ins[0])
    return Fast(run)


def weighted_sum(bop, ins, outs):
    """WeightedSum in place over X0 (the SGD update), ops.sums.weighted_sum_in_place with a product buffer made
    once. It sets its blob itself (it is X0's): an X0 that cannot be written alone this time (a read-only array
    fed, an input sharing its memory) sends the op and the rest of the run op by op."""
    if len(bop.outputs) != 1 or bop.outputs[0] is not bop.inputs[0] or len(ins) % 2:
        return None
    X0 = ins[0]
    if X0.dtype not in FLOATS or X0.ndim == 0 or any(w.size != 1 for w in ins[1::2]) or any(
            x.dtype != X0.dtype or x.size != X0.size for x in ins[2::2]):
        return None
    shape, dtype = X0.shape, X0.dtype
    scratch = np.empty(shape, dtype) if len(ins) > 2 else None

    def run(ins, blobs):
        X0 = ins[0]
        if type(X0) is not np.ndarray or X0.shape != shape or X0.dtype != dtype or not writable_alone(X0, ins[2::2]):
            raise Unsettled(redo=True)
        weighted_sum_in_place(np, X0, ins, scratch)
    return Fast(run, blobs=True)
