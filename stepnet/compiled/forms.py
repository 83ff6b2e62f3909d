"""The compiled forms of ops: `make(bop, ins, outs) -> Fast | None`, called once per input-shape signature with
the arrays of an interpreted timestep or run (`ins`: the op's inputs, `outs`: its outputs' values after it).
Everything that depends only on shapes, dtypes and arguments is settled there; the returned `fn(ins, outs)`
only computes, writing every output array in place (out=) with the arithmetic the op's kernel calls
(stepnet.kernels), so the two runners agree by construction. None: no compiled form for these inputs (the
net then runs op by op). `MAKERS` is the compiled package's own table of them; what it needs to know of an op
beyond that (shapes_from_inputs, context="structure") is in the op's record."""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import numpy as np

from ..core.errors import ShapeError
from ..kernels.activations import sigmoid as sigmoid_into
from ..kernels.softmax import rows as softmax_rows
from ..ops import shape as shape_ops
from ..ops.binding import store_results
from ..ops.registry import REGISTRY
from .cell_forms import (
    Fast, Unsettled, bound_args, gru_unit, gru_unit_gradient, lstm_unit, lstm_unit_gradient, same_floats, shaped)
from .jit_forms import FUSED
from .link_forms import accumulate_gradient_input, apply_links
from .products import fc, fc_gradient_deferred, fc_input_gradient
from .train_forms import (
    averaged_loss, averaged_loss_gradient, constant_fill, label_cross_entropy, label_cross_entropy_gradient,
    learning_rate, reshape, weighted_sum)


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

    def prebind(ins, outs, fresh):     # (in place over input 0 with one more input: the step nets' Sum)
        out = shaped(outs[0], shape)
        if fresh or len(ins) != 2 or out is not ins[0]:
            return None
        x = ins[1]
        return lambda: np.add(out, x, out=out)
    return Fast(run, prebind=prebind)


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
        sigmoid_into(np, ins[0], shaped(outs[0], shape), e, d)
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


# ------------------------------------------------------------------------------------------- Softmax
def softmax(bop, ins, outs):
    """Softmax's rows (kernels.softmax, the interpreted kernel's arithmetic) straight into its output: no
    per-call signature check, result array or copy (the fused row kernel, jit_forms.softmax, where chosen)."""
    x, a = ins[0], bound_args(bop)["axis"]
    if (x.dtype.kind != "f" or outs[0].dtype != x.dtype or not -x.ndim <= a < x.ndim or not x.size
            or outs[0].size != x.size):
        return None
    a %= x.ndim
    rows2 = (math.prod(x.shape[:a]), math.prod(x.shape[a:]))

    def run(ins, outs):
        softmax_rows(np, ins[0].reshape(rows2), shaped(outs[0], rows2))
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


def results(bop, limit: int, outs) -> Fast:
    """A plain net's op as the executor runs it: its bound call (the kernel, its checks, its specialization by
    input signature) on the blobs' current values, the results stored into its output blobs as every runner
    stores them (ops.binding.store_results), without the executor's dispatch. The form of every op of a plain
    net that has no form of its own (it sets its blobs: no buffers). For an op whose output shapes need not
    follow its inputs' shapes (schema.shapes_from_inputs false), each output is compared with `outs`, what it
    made in the run the program was built from: Unsettled when one differs in shape or dtype."""
    call = bop.plain
    blobs = bop.outputs
    if bop.schema.shapes_from_inputs:
        expected = ()
    else:
        expected = tuple((k, v.shape, v.dtype) for k, v in enumerate(outs) if type(v) is np.ndarray)

    def run(ins, _blobs):
        result = call(*ins)
        if result is not None:
            store_results(bop, ins, result, limit)
        for k, shape, dtype in expected:
            v = blobs[k].value
            if type(v) is not np.ndarray or v.shape != shape or v.dtype != dtype:
                raise Unsettled
    return Fast(run, blobs=True)


def recurrent_network(bop, ins, outs):
    """RecurrentNetwork in a plain net: the op itself without the executor's dispatch (its replay of a
    compiled run, or the full run), setting its output blobs (aliases of the states) as it does interpreted.
    Only where its last run ran its step net compiled. The replay skips its own signature check while the run it
    replays is the one this form last left (same signature as the program's); one kept by a run op by op in
    between is checked."""
    ctx = bop.plain.args[0]
    fwd = ctx.state.get("forward")
    if fwd is None or fwd.kept is None:
        return None

    mine = [None]     # the kept run this form last left: its signature is the program's

    def run(ins, blobs):
        kept = fwd.kept    # (a run op by op in between, Unsettled, may have kept another: checked then)
        if not fwd.rerun(ins, checked=kept is not None and kept is mine[0]):
            fwd.run(ctx, np, ins)
        mine[0] = fwd.kept
    return Fast(run, blobs=True)


class Maker(NamedTuple):
    """An op type's compiled form. blobs: the form sets its output blobs itself (link views, aliases); main_only:
    only in a plain net's program (RecurrentNetwork: one bound op serves the net; WeightedSum and Reshape: they
    may raise Unsettled, which only a plain net's routine handles); per_run: make takes steps= (the calls of
    one run, over which its forms' per-run setup is spread when they are timed)."""
    make: Callable | None
    blobs: bool = False
    main_only: bool = False
    per_run: bool = False


MAKERS = {    # type -> its form, for the kernel the type registered (a record whose kernel was replaced has none)
    "FC": Maker(fc, per_run=True), "Sum": Maker(sum_), "Mul": Maker(mul), "Sigmoid": Maker(sigmoid),
    "rnn_internal_apply_links": Maker(apply_links, blobs=True),
    "rnn_internal_fc_gradient_deferred": Maker(fc_gradient_deferred, per_run=True),
    "rnn_internal_fc_input_gradient": Maker(fc_input_gradient, per_run=True),
    "rnn_internal_accumulate_gradient_input": Maker(accumulate_gradient_input),
    "LSTMUnit": Maker(lstm_unit(saving=False)), "rnn_internal_lstm_unit": Maker(lstm_unit(saving=True)),
    "LSTMUnitGradient": Maker(lstm_unit_gradient(saved=False)),
    "rnn_internal_lstm_unit_gradient": Maker(lstm_unit_gradient(saved=True)),
    "Split": Maker(split), "Concat": Maker(concat), "MulGradient": Maker(mul_gradient),
    "SigmoidGradient": Maker(sigmoid_gradient), "GRUUnit": Maker(gru_unit), "GRUUnitGradient": Maker(gru_unit_gradient),
    "Softmax": Maker(softmax),   # (the jitted row kernel, jit_forms.FUSED, where the workspace chose it)
    "RecurrentNetwork": Maker(recurrent_network, blobs=True, main_only=True),
    "LabelCrossEntropy": Maker(label_cross_entropy), "LabelCrossEntropyGradient": Maker(label_cross_entropy_gradient),
    "ConstantFill": Maker(constant_fill), "LearningRate": Maker(learning_rate),
    "Reshape": Maker(reshape, main_only=True),
    "AveragedLoss": Maker(averaged_loss), "AveragedLossGradient": Maker(averaged_loss_gradient),
    "WeightedSum": Maker(weighted_sum, blobs=True, main_only=True),
}


def sets_blobs(bop) -> bool:
    """Whether the op's form sets its output blobs itself (its outputs need not hold arrays)."""
    maker = MAKERS.get(bop.opdef.type)
    return maker is not None and maker.blobs


def _generic_ok(schema) -> bool:
    return schema.shapes_from_inputs and not schema.random and schema.context in (False, "structure")


def registered_kernel(bop) -> bool:
    """Whether the bound op still has the kernel its type registered: a compiled form written for that kernel
    applies only then (a test hook may have patched the record)."""
    return bop.schema.kernel is REGISTRY.registered(bop.opdef.type).kernel


def compiled_form(bop, ins, outs, fused: bool = False, main: bool = False, steps: int = 8) -> Fast | None:
    """The op's compiled form for these arrays, or None; with `fused`, its jitted form where it has one. main:
    for a plain net's program (see Maker.main_only; no generic form: the program runs such an op by its
    `results` form); steps: the times a run calls it (a step net's timesteps, 1 for a plain net:
    Maker.per_run)."""
    t, schema = bop.opdef.type, bop.schema
    maker = MAKERS.get(t)
    if maker is not None and maker.main_only and not main:
        return None
    own = (maker is not None or t in FUSED) and registered_kernel(bop)
    if fused and own and t in FUSED:
        fast = FUSED[t](bop, ins, outs)
        if fast is not None:
            return fast
    fast = None
    if own and maker is not None and maker.make is not None:
        fast = maker.make(bop, ins, outs, steps=steps) if maker.per_run else maker.make(bop, ins, outs)
    if fast is not None:
        return fast
    return generic(bop, ins, outs) if _generic_ok(schema) and not main else None
