"""The compiled forms of step-net ops: `make(bop, ins, outs) -> Fast | None`, called once per input-shape
signature with the arrays of an interpreted timestep (`ins`: the op's inputs, `outs`: its outputs' values
after that step). Everything that depends only on shapes, dtypes and arguments is settled there; the returned
`fn(ins, outs)` only computes, writing every output array in place (out=), with the same numpy operations in
the same order as the op's kernel, so results are bit-identical. None: no compiled form for these inputs
(the net then runs op by op)."""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import ShapeError
from ..ops import REGISTRY, gru, lstm, recurrent, rnn_internal, sums
from ..ops import shape as shape_ops
from ..ops import math as math_ops
from ..ops.rnn_internal import _link_error
from .jit_forms import FUSED
from .cell_forms import (
    Fast, bound_args, same_floats, shaped, gru_unit, gru_unit_gradient, lstm_unit, lstm_unit_gradient)
from .products import fc, fc_gradient_deferred


# ------------------------------------------------------------------------------------------- Sum
def sum_(bop, ins, outs):
    if not same_floats(*ins) or any(x.shape != ins[0].shape for x in ins) or outs[0].size != ins[0].size:
        return None
    shape = ins[0].shape

    def run(ins, outs):
        out = shaped(outs[0], shape)
        if out is ins[0]:
            for x in ins[1:]:
                out += x
            return
        if len(ins) == 1:
            np.copyto(out, ins[0])
            return
        np.add(ins[0], ins[1], out=out)
        for x in ins[2:]:
            out += x
    return Fast(run)


# ------------------------------------------------------------------------------------------- GRU step ops
def mul(bop, ins, outs):
    """Mul of two same-shape float tensors (no broadcast) into its output."""
    a, b = ins
    if not same_floats(a, b) or a.shape != b.shape or outs[0].size != a.size:
        return None
    shape = a.shape

    def run(ins, outs):
        np.multiply(ins[0], ins[1], out=shaped(outs[0], shape))
    return Fast(run)


def sigmoid(bop, ins, outs):
    """The Sigmoid kernel's values (e = exp(-|x|), then 1/(1+e) or e/(1+e) by the sign of x) with one
    division and no masked select: the numerator is exp(min(x, 0)), exactly 1 for x ≥ 0 and exactly e for
    x < 0 (the same exp of the same value), divided by 1 + e: the kernel's correctly rounded quotients."""
    x = ins[0]
    if not same_floats(x) or outs[0].size != x.size:
        return None
    shape = x.shape
    e, d = np.empty(shape, x.dtype), np.empty(shape, x.dtype)

    def run(ins, outs):
        x, out = ins[0], shaped(outs[0], shape)
        np.abs(x, out=e)
        np.negative(e, out=e)
        np.exp(e, out=e)
        np.add(1, e, out=d)
        np.minimum(x, 0, out=e)
        np.exp(e, out=e)
        np.divide(e, d, out=out)
    return Fast(run)


def split(bop, ins, outs):
    """Split by argument sizes, equal parts, or sizes from input 1 (the gradient of a Concat: the sizes of the
    compiled timestep, checked every call): each part copied straight into its buffer."""
    args = bound_args(bop)
    if len(ins) > 2 or (args["add_axis"] and args["axis"] is not None):
        return None
    x = ins[0]
    sizes = None
    if len(ins) == 2:
        if ins[1].dtype.kind not in "iu" or ins[1].ndim != 1 or len(ins[1]) != len(outs):
            return None
        sizes = ins[1].tolist()
    ax = shape_ops.canonical_axis(shape_ops._axis_from(args["axis"], args["order"]), x.ndim)
    parts, start = [], 0
    for out in outs:
        size = out.shape[ax] if out.ndim == x.ndim else -1
        if size < 0 or out.shape[:ax] + out.shape[ax + 1:] != x.shape[:ax] + x.shape[ax + 1:]:
            return None
        parts.append((slice(None),) * ax + (slice(start, start + size),))
        start += size
    if start != x.shape[ax] or x.dtype != outs[0].dtype or (sizes is not None and sizes != [
            o.shape[ax] for o in outs]):
        return None
    shapes = [o.shape for o in outs]

    def run(ins, outs):
        x = ins[0]
        if sizes is not None and ins[1].tolist() != sizes:
            raise ShapeError(f"split sizes {ins[1].tolist()} differ from {sizes}, the sizes of this run's first "
                             "timestep: the sizes input must not change between the timesteps of a run")
        for out, shape, part in zip(outs, shapes, parts):
            np.copyto(shaped(out, shape), x[part])
    return Fast(run)


def mul_gradient(bop, ins, outs):
    """MulGradient of same-shape float tensors (no broadcast): dA = dC·B, dB = dC·A into the outputs (dA may be
    dC itself, in place: then dB is formed first)."""
    dc, a, b = ins
    if not same_floats(dc, a, b) or not dc.shape == a.shape == b.shape or outs[0].size != a.size or \
            outs[1].size != b.size:
        return None
    shape = a.shape

    def run(ins, outs):
        dc, a, b = ins
        da, db = shaped(outs[0], shape), shaped(outs[1], shape)
        if da is dc:
            np.multiply(dc, a, out=db)
            np.multiply(dc, b, out=da)
        else:
            np.multiply(dc, b, out=da)
            np.multiply(dc, a, out=db)
    return Fast(run)


def sigmoid_gradient(bop, ins, outs):
    """SigmoidGradient: dY·Y·(1 − Y) into the output (which may be Y or dY, in place), with the input order its
    kernel read from the net at the first timestep."""
    ctx = bop.plain.args[0] if getattr(bop.plain, "args", None) else None
    order = getattr(ctx, "state", {}).get("order")
    if order is None or not same_floats(*ins) or ins[0].shape != ins[1].shape or outs[0].size != ins[0].size:
        return None
    y_at, dy_at = order
    shape = ins[0].shape
    one_minus = np.empty(shape, ins[0].dtype)
    one = ins[0].dtype.type(1)

    def run(ins, outs):
        y, dy = ins[y_at], ins[dy_at]
        np.subtract(one, y, out=one_minus)
        out = shaped(outs[0], shape)
        np.multiply(dy, y, out=out)
        out *= one_minus
    return Fast(run)


def concat(bop, ins, outs):
    """Concat along an existing axis into its output, and the constant part sizes into the second."""
    args = bound_args(bop)
    if args["add_axis"] and args["axis"] is not None:
        return None
    ax = shape_ops.canonical_axis(shape_ops._axis_from(args["axis"], args["order"]), ins[0].ndim)
    shape = ins[0].shape[:ax] + (sum(x.shape[ax] for x in ins),) + ins[0].shape[ax + 1:]
    if any(x.dtype != ins[0].dtype or x.ndim != ins[0].ndim for x in ins) or outs[0].size != math.prod(shape):
        return None
    sizes = np.array([x.shape[ax] for x in ins], np.int32)

    def run(ins, outs):
        np.concatenate(ins, axis=ax, out=shaped(outs[0], shape))
        if len(outs) > 1:
            np.copyto(outs[1], sizes)
    return Fast(run)


# ------------------------------------------------------------------------------------------- RNN internals
def apply_links(bop, ins, outs):
    args = bound_args(bop)
    offsets, windows = list(args["offsets"]), list(args["windows"])
    if not len(ins) - 1 == len(offsets) == len(windows) == len(outs):
        return None
    links = tuple(zip(offsets, windows, bop.opdef.input[1:]))
    last = [(None, -1, None)] * len(links)   # per link: the external, start and view it last made

    def run(ins, blobs):
        t = int(ins[0].flat[0])
        for i, (blob, external, (offset, window, name)) in enumerate(zip(blobs, ins[1:], links)):
            start = t + offset
            seen, at, view = last[i]
            if seen is not external or at != start:   # else the same rows of the same array: its view again
                if start + window > external.shape[0] or not external.size:
                    _link_error(blob.name, name, external, start, start + window, offset, window)
                view = external[start:start + window]
                last[i] = (external, start, view)
            blob.value = view
            blob.view = True
    return Fast(run, blobs=True)


def accumulate_gradient_input(bop, ins, outs):
    """g[t + offset] += og[t], in place (the state-gradient tensor the links view)."""
    _, og, g = ins
    offset = bound_args(bop)["offset"]
    if offset < 0 or og.ndim < 1 or g.ndim < 1 or og[0].size != g[0].size or og.dtype != g.dtype:
        return None
    row_shape = g.shape[1:]

    def run(ins, outs):
        timestep, og, g = ins
        t = int(timestep.flat[0])
        if t >= og.shape[0] or t + offset >= g.shape[0]:
            raise ShapeError(f"timestep {t} + offset {offset} is outside the gradient tensors "
                             f"{tuple(og.shape)} / {tuple(g.shape)}")
        row = g[t + offset]
        row += shaped(og[t], row_shape)
    return Fast(run)


# ------------------------------------------------------------------------------------------- generic form
def _put(out, value) -> None:
    if value is out:
        return
    if value.size != out.size:
        raise ShapeError(f"a compiled step wrote {tuple(value.shape)} into a {tuple(out.shape)} buffer: the op's "
                         "output shape changed between timesteps")
    np.copyto(shaped(out, value.shape), value)


def _generic_fn(bop):
    call = bop.plain
    if len(bop.outputs) == 1:
        def run(ins, outs):
            result = call(*ins)
            if result is not None:
                _put(outs[0], result if type(result) is not tuple else result[0])
        return run

    def run_many(ins, outs):
        for out, value in zip(outs, call(*ins)):
            if value is not None:
                _put(out, np.asarray(value))
    return run_many


def generic(bop, ins, outs):
    """The op's bound kernel (each step workspace's own), its results copied into the buffers (in-place results
    skipped): no executor dispatch or Blob.set, the kernel's own checks kept. For ops whose output shapes
    follow from input shapes."""
    return Fast(_generic_fn(bop), rebind=_generic_fn)


# Ops whose output shapes and dtypes follow from their inputs' shapes and dtypes (never from values): the
# generic form may run them. Others (Gather, Slice with tensor bounds, ...) leave the net interpreted.
SHAPE_DETERMINED = frozenset((
    "Add", "Sub", "Mul", "Div", "Sigmoid", "Tanh", "Relu", "Softsign", "Exp", "Log", "Abs", "Negative", "Scale",
    "Copy", "CopyFromCPUInput", "EnsureCPUOutput", "Alias", "Cast", "GT", "GE", "LT", "LE", "EQ", "Not", "And", "Or",
    "Split", "Concat", "Transpose", "ExpandDims", "Squeeze", "FCTransposed", "MatMul", "BatchMatMul",
    "SigmoidGradient", "TanhGradient", "ReluGradient", "MulGradient", "AddGradient", "SumReduceLike",
    "FCGradient", "FCTransposedGradient", "GRUUnit", "GRUUnitGradient", "SumInt", "WeightedSum",
    "ElementwiseLinear", "LayerNorm", "Softmax", "LSTMUnit", "LSTMUnitGradient",
    "rnn_internal_accumulate_gradient_input",
))
# Context ops among them read only their own op's structure (output count, net, device) from the context.
CONTEXT_SAFE = frozenset(("Split", "SigmoidGradient", "CopyFromCPUInput", "EnsureCPUOutput"))

def recurrent_network(bop, ins, outs):
    """RecurrentNetwork in a plain net: the op itself without the executor's dispatch (its replay of a
    compiled run, or the full run), setting its output blobs (aliases of the states) as it does interpreted.
    Only where its last run ran its step net compiled."""
    ctx = bop.plain.args[0]
    fwd = ctx.state.get("forward")
    if fwd is None or fwd.replay is None:
        return None

    def run(ins, blobs):
        replay = fwd.replay    # its inputs have the signature of the run it was made from: the net checked them
        if replay is None or not replay.run(ins, checked=True):
            fwd.run(ctx, np, ins)
    return Fast(run, blobs=True)


SPECIALIZED = {   # type -> (the kernel it specializes, its maker); a record whose kernel was replaced gets none
    "FC": (math_ops.fc, fc), "Sum": (sums.sum_, sum_),
    "rnn_internal_apply_links": (rnn_internal.apply_links, apply_links),
    "rnn_internal_fc_gradient_deferred": (rnn_internal.fc_gradient_deferred, fc_gradient_deferred),
    "rnn_internal_accumulate_gradient_input": (rnn_internal.accumulate_gradient_input, accumulate_gradient_input),
    "LSTMUnit": (lstm.lstm_unit, lstm_unit(saving=False)),
    "rnn_internal_lstm_unit": (lstm.lstm_unit_saving, lstm_unit(saving=True)),
    "LSTMUnitGradient": (lstm.lstm_unit_gradient, lstm_unit_gradient(saved=False)),
    "rnn_internal_lstm_unit_gradient": (lstm.lstm_unit_gradient_saved, lstm_unit_gradient(saved=True)),
    "Mul": (REGISTRY.get("Mul").kernel, mul), "Sigmoid": (REGISTRY.get("Sigmoid").kernel, sigmoid),
    "Split": (shape_ops.split, split), "Concat": (shape_ops.concat, concat),
    "MulGradient": (REGISTRY.get("MulGradient").kernel, mul_gradient),
    "SigmoidGradient": (REGISTRY.get("SigmoidGradient").kernel, sigmoid_gradient),
    "GRUUnit": (gru.gru_unit, gru_unit), "GRUUnitGradient": (gru.gru_unit_gradient, gru_unit_gradient),
    "Softmax": (math_ops.softmax, None),   # the fused row kernel (fused.FUSED), else the generic form
    "RecurrentNetwork": (recurrent.recurrent_network, recurrent_network),   # plain nets only (MAIN_ONLY)
}


BLOB_FORMS = frozenset(("rnn_internal_apply_links", "RecurrentNetwork"))   # forms that set their output blobs
MAIN_ONLY = frozenset(("RecurrentNetwork",))                                 # forms for plain nets only


def has_form(bop) -> bool:
    """Whether the op may have a compiled form (for some arrays)."""
    t = bop.opdef.type
    return t in SPECIALIZED or t in FUSED or t in SHAPE_DETERMINED


def compiled_form(bop, ins, outs, fused: bool = False, main: bool = False) -> Fast | None:
    """The op's compiled form for these arrays, or None; with `fused`, a cell op's fused form where it has one.
    main: for a plain net's program (RecurrentNetwork's form is only there: its replay trusts that the net's
    own signature check covers its inputs, and one bound op serves the net)."""
    if bop.opdef.type in MAIN_ONLY and not main:
        return None
    kernel, make = SPECIALIZED.get(bop.opdef.type, (None, None))
    if fused and bop.opdef.type in FUSED and bop.schema.kernel is kernel:
        fast = FUSED[bop.opdef.type](bop, ins, outs)
        if fast is not None:
            return fast
    fast = make(bop, ins, outs) if make is not None and bop.schema.kernel is kernel else None
    if fast is not None:
        return fast
    schema = bop.schema
    if bop.opdef.type in SHAPE_DETERMINED and not schema.random and (not schema.context or
                                                                      bop.opdef.type in CONTEXT_SAFE):
        return generic(bop, ins, outs)
    return None
