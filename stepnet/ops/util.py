"""Utility operators: printing, iteration counters and their mutexes, accumulation, and run-time checks.

Iter and AtomicIter keep the counter on the host as a 1-element int64 tensor, as Caffe2 does whatever
the op's device (LearningRate reads it there). Accumulate and the 0-input Iter read their own previous
output through the op context; Print counts its runs in the context's state. ZeroGradient is here too:
a no-op whose gradient gives its input zeros.
"""
from __future__ import annotations

import threading
import warnings

import numpy as np

from ..core import backend
from ..core.errors import ArgumentError, DTypeError, MissingBlobError, OpError, ShapeError, StepnetWarning, one_line
from ..core.int8 import Int8Tensor
from ..core.spec import TensorSpec
from .base import like, out_spec, size_of
from .op_files import append_line
from .registry import NO_GRADIENT, SHOULD_NOT_DO_GRADIENT, op
from .stats import record

PRINT_LIMIT_DEFAULT = 1000  # Caffe2's TensorPrinter prints at most this many values unless `limit` is set
PRINT_EXTENSION = ".log"   # Caffe2's kPrintFileExtension: Print(to_file=1) writes <root folder>/<blob>.log


# --------------------------------------------------------------------------------------------- Print
def _format_value(v) -> str:
    if isinstance(v, (bool, np.bool_)):
        return "1" if v else "0"  # C++ streams print bools as numbers
    if isinstance(v, (float, np.floating)):
        return f"{float(v):g}"  # the default 6 significant digits of a C++ stream
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return str(v)


def format_tensor(name: str, value, limit: int) -> str:
    """Caffe2's TensorPrinter line: 'Tensor <name> of type <type>. Dims: (d0,d1,): v0,v1,...' (an Int8Tensor:
    'Int8Tensor <name> of type uint8, scale <s>, zero_point <z>. Dims: ...: <codes>')."""
    if value is None or not hasattr(value, "dtype"):
        return f"Blob {name} of type {type(value).__name__}"
    kind, quant = "Tensor", ""
    if isinstance(value, Int8Tensor):
        kind, quant, value = "Int8Tensor", f", scale {value.scale:g}, zero_point {value.zero_point}", value.data
    host = np.asarray(backend.to_host(value))
    dims = "".join(f"{d}," for d in host.shape)
    meta = f"{kind} {name} of type {host.dtype}{quant}. Dims: ({dims}): "
    if host.size == 0:
        return meta
    flat = host.reshape(-1)[:limit]
    return meta + ",".join(_format_value(v) for v in flat.tolist())


def _check_every_n(every_n) -> None:
    if every_n < 1:
        raise ArgumentError(f"every_n must be >= 1, got {every_n}")


def _print_shape(specs, to_file=0, limit=0, every_n=1):
    _check_every_n(every_n)
    return []


@op("Print", inputs=1, outputs=0, context=True, devices="any", gradient=SHOULD_NOT_DO_GRADIENT,
    args={"to_file": 0, "limit": 0, "every_n": 1}, shape=_print_shape)
def print_op(ctx, xp, x, *, to_file, limit, every_n):
    """Print the input blob's name, type, dims and first `limit` values (default 1000) to stdout, on runs
    1, 1+every_n, 1+2*every_n, ... With `to_file`, a program's Print (trusted limits: stepnet.compat, a
    Workspace(limits=Limits(trusted=True))) appends a tensor's line to <root folder>/<blob>.log instead ('/' in
    the name as '#'; emptied on the bound op's first run; ops.op_files); a model file may write databases only
    (docs/limits.md), so its Print prints to stdout, with one warning per op. Control and format characters of
    the name and strings are escaped (errors.one_line). A workspace `reporter` may take a printed value instead
    (the command line shows scalars as labeled results)."""
    _check_every_n(every_n)
    state = ctx.state
    runs = state.get("runs", 0) + 1
    state["runs"] = runs
    if to_file and not ctx.workspace.limits.trusted:
        to_file = False
        if not state.get("warned"):
            state["warned"] = True
            name = one_line(ctx.opdef.input[0])
            warnings.warn(f"{ctx.label}: Print to_file=1 would write {name}{PRINT_EXTENSION}, and a model file may "
                          "write databases only; printing to stdout instead", StepnetWarning, stacklevel=2)
    if (runs - 1) % every_n == 0:
        line = one_line(format_tensor(ctx.opdef.input[0], x, limit if limit > 0 else PRINT_LIMIT_DEFAULT))
        if to_file and hasattr(x, "dtype"):     # (Caffe2 logs a blob that is no tensor to the console)
            append_line(ctx, PRINT_EXTENSION, line)
            return
        reporter = ctx.workspace.reporter   # e.g. the CLI's: a scalar becomes a labeled result and a metric
        if reporter is not None and reporter(ctx.opdef.input[0], x):
            return
        print(line, flush=True)   # the blob's name and strings come from the file: one line, no escapes


# --------------------------------------------------------------------------------------------- counters
class Mutex:
    """The opaque object CreateMutex puts in a blob: a lock, usable as `with mutex:`."""
    __slots__ = ("_lock",)

    def __init__(self):
        self._lock = threading.Lock()

    def __enter__(self):
        self._lock.acquire()
        return self

    def __exit__(self, *exc):
        self._lock.release()
        return False

    def locked(self) -> bool:
        return self._lock.locked()

    def __repr__(self):
        return f"Mutex({'locked' if self.locked() else 'unlocked'})"


def check_counter(counter, name: str) -> None:
    """Caffe2's checks of an iteration counter (an array or a TensorSpec): one int64 element."""
    if counter is None:
        raise MissingBlobError(f"the iteration counter {name!r} holds no value; create it in the init net, "
                               "e.g. ConstantFill([], [iter], shape=[1], value=0, dtype=10)")
    if not hasattr(counter, "dtype") or (counter.dtype is not None and counter.dtype.kind not in "iu"):
        what = getattr(counter, "dtype", type(counter).__name__)
        raise DTypeError(f"the iteration counter {name!r} must be an int64 tensor, got {what}")
    if size_of(counter) != 1:
        raise ShapeError(f"the iteration counter {name!r} must hold one element, got shape "
                         f"{tuple(counter.shape)}")


_INT64_MAX = int(np.iinfo(np.int64).max)


def next_iter(counter, name: str):
    """counter + 1 as a fresh host int64 tensor of the same shape, with Caffe2's checks."""
    check_counter(counter, name)
    host = np.asarray(backend.to_host(counter))
    value = int(host.reshape(-1)[0])
    if value < 0:
        raise OpError(f"the iteration counter {name!r} is negative ({value})")
    if value >= _INT64_MAX:
        raise OpError(f"the iteration counter {name!r} would overflow int64")
    return np.full(host.shape, value + 1, dtype=np.int64)


def _check_mutex(mutex) -> None:
    if not isinstance(mutex, Mutex):
        what = f"a tensor ({mutex})" if isinstance(mutex, TensorSpec) else type(mutex).__name__
        raise DTypeError(f"input 0 must be a mutex made by CreateMutex, got {what}")


def _counter_shape(index):
    """Shape function of Iter (counter = input 0) and AtomicIter (input 1): the counter's shape in int64.
    The 0-input Iter has none: its output takes the shape of whatever the blob held before the op ran."""
    def shape(specs):
        if len(specs) <= index:
            return []
        if index == 1:  # AtomicIter: a TensorSpec describes a tensor, so input 0 is not a mutex
            _check_mutex(specs[0])
        check_counter(specs[index], "iter")
        return [out_spec(specs[index].shape, np.int64)]
    return shape


@op("Iter", inputs=(0, 1), enforce_inplace=[(0, 0)], context=True, devices="any", gradient=NO_GRADIENT,
    shape=_counter_shape(0))
def iter_op(ctx, xp, *counter):
    """Add 1 to the int64 counter in place (on the host). The legacy 0-input form creates the counter at 0
    when its output does not hold one yet, then increments it, so its first run gives 1."""
    name = ctx.opdef.output[0]
    if counter:
        return next_iter(counter[0], name)
    previous = ctx.outputs[0].value
    if previous is None or not hasattr(previous, "dtype"):
        previous = np.zeros(1, dtype=np.int64)
    return next_iter(previous, name)


@op("AtomicIter", inputs=2, enforce_inplace=[(1, 0)], context=True, devices="any", gradient=NO_GRADIENT,
    shape=_counter_shape(1), shapes_from_inputs=True)
def atomic_iter(ctx, xp, mutex, counter):
    """Iter holding `mutex` (made by CreateMutex) while it increments, for concurrent (Hogwild) nets. The
    counter is read and written back under the lock (the run loop reads inputs before the call and stores
    results after it, both outside any lock, which would lose increments between threads). Each run adds 1 to
    the stat `atomic_iter/stats/<counter>/num_iter` of the workspace tree's default registry, as Caffe2 exports
    it."""
    _check_mutex(mutex)
    with mutex:
        ctx.outputs[0].set(next_iter(ctx.inputs[1].value, "iter"))
    record(ctx.workspace, f"atomic_iter/stats/{ctx.opdef.input[1]}/num_iter")
    return None


@op("CreateMutex", inputs=0, context=True, gradient=SHOULD_NOT_DO_GRADIENT)
def create_mutex(ctx, xp):
    """Put a new unlocked Mutex (not a tensor) in the output blob."""
    ctx.outputs[0].set(Mutex())  # stored directly: the run loop would turn a non-array result into an array
    return (None,)


# --------------------------------------------------------------------------------------------- Accumulate
def _check_accumulate(x) -> None:
    if x.dtype is not None and x.dtype != np.float32:
        raise DTypeError(f"Accumulate takes float32 input, got {x.dtype}; Cast it to float first")


def _accumulate_shape(specs, gamma=1.0):
    _check_accumulate(specs[0])
    return [like(specs[0])]


@op("Accumulate", inputs=1, inplace=(), context=True, gradient=SHOULD_NOT_DO_GRADIENT, args={"gamma": 1.0},
    shape=_accumulate_shape)
def accumulate(ctx, xp, x, *, gamma):
    """Y = X + gamma * Y, reading Y from the previous run; Y starts at zero whenever it does not hold a
    float32 tensor of X's shape (Caffe2 reshapes and zero-fills it)."""
    _check_accumulate(x)
    previous = ctx.outputs[0].value
    if (previous is None or not hasattr(previous, "dtype") or previous.dtype != np.float32
            or tuple(previous.shape) != tuple(x.shape)):
        return x.copy()
    return x + xp.asarray(previous) * np.float32(gamma)


# --------------------------------------------------------------------------------------------- checks
ASSERT_KINDS = "biu"  # Caffe2 accepts bool, int32 and int64 tensors


def _check_assert(x) -> None:
    if x.dtype is not None and x.dtype.kind not in ASSERT_KINDS:
        raise DTypeError(f"Assert takes a bool or integer tensor, got {x.dtype}; compare it first (e.g. GT)")


def _assert_shape(specs, error_msg=""):
    """No outputs; the dtype check only (whether the values hold is known when the op runs)."""
    _check_assert(specs[0])
    return []


@op("Assert", inputs=1, outputs=0, devices="any", args={"error_msg": ""}, shape=_assert_shape)
def assert_op(xp, x, *, error_msg):
    """Fail unless every element of X (bool or integer) is true / non-zero."""
    _check_assert(x)
    host = np.asarray(backend.to_host(x)).reshape(-1)
    bad = np.flatnonzero(host == 0)
    if bad.size:
        first = int(bad[0])
        extra = f": {error_msg}" if error_msg else ""
        raise OpError(f"Assert failed{extra} ({bad.size} of {host.size} elements false; first at flat index "
                      f"{first}, value {_format_value(host[first].item())})")


def _check_nan_check(x) -> None:
    if x.dtype is not None and x.dtype.kind != "f":
        raise DTypeError(f"NanCheck takes a float tensor, got {x.dtype}")


def _nan_check_shape(specs):
    _check_nan_check(specs[0])
    return [like(specs[0])]


def _nan_check_gradient(g):
    """NanCheck([dY]) -> dX: the gradient passes through, checked for NaN/Inf too."""
    g.op("NanCheck", [g.GO(0)], [g.GI(0)])


@op("NanCheck", inputs=(1, None), inplace=[(0, 0)], context=True, shape=_nan_check_shape,
    gradient=_nan_check_gradient)
def nan_check(ctx, xp, x, *others):
    """Y = X, failing with the blob's name when X holds NaN or Inf (further inputs are only named)."""
    _check_nan_check(x)
    finite = xp.isfinite(x)
    if not bool(finite.all()):
        host = np.asarray(backend.to_host(x)).reshape(-1)
        nans, infs = np.flatnonzero(np.isnan(host)), np.flatnonzero(np.isinf(host))
        parts = [f"{len(idx)} {what} (first at flat index {int(idx[0])})"
                 for what, idx in (("NaN", nans), ("Inf", infs)) if len(idx)]
        found = " and ".join(parts)
        raise OpError(f"blob {ctx.opdef.input[0]!r} contains {found} among {host.size} elements")
    return x.copy()


# --------------------------------------------------------------------------------------------- ZeroGradient
def _zero_gradient_gradient(g):
    """ConstantFill([X], [dX], value=0.0): X's gradient is zeros of its shape. The backward pass calls this
    maker even though the op has no outputs (and so no output gradients)."""
    g.op("ConstantFill", [g.I(0)], [g.GI(0)], value=0.0)


def _no_outputs(specs):
    return []


@op("ZeroGradient", inputs=1, outputs=0, devices="any", gradient=_zero_gradient_gradient, shape=_no_outputs)
def zero_gradient(xp, x):
    """Does nothing when run; in a backward pass it gives X a zero gradient (e.g. for a blob that reaches the
    loss only through ops without gradients)."""
    return None
