"""Utility operators: printing, iteration counters and their mutexes, accumulation, and run-time checks.

Iter and AtomicIter keep the counter on the host as a 1-element int64 tensor, as Caffe2 does whatever
the op's device (LearningRate reads it there). Accumulate and the 0-input Iter read their own previous
output through the op context; Print counts its runs in the context's state.
"""
from __future__ import annotations

import threading
import warnings

import numpy as np

from .. import backend
from ..errors import ArgumentError, DTypeError, MissingBlobError, OpError, ShapeError, StepnetWarning
from .registry import NO_GRADIENT, SHOULD_NOT_DO_GRADIENT, op

PRINT_LIMIT_DEFAULT = 1000  # Caffe2's TensorPrinter prints at most this many values unless `limit` is set


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
    """Caffe2's TensorPrinter line: 'Tensor <name> of type <type>. Dims: (d0,d1,): v0,v1,...'."""
    if value is None or not hasattr(value, "dtype"):
        return f"Blob {name} of type {type(value).__name__}"
    host = np.asarray(backend.to_host(value))
    dims = "".join(f"{d}," for d in host.shape)
    meta = f"Tensor {name} of type {host.dtype}. Dims: ({dims}): "
    if host.size == 0:
        return meta
    flat = host.reshape(-1)[:limit]
    return meta + ",".join(_format_value(v) for v in flat.tolist())


@op("Print", inputs=1, outputs=0, context=True, devices="any", gradient=SHOULD_NOT_DO_GRADIENT,
    args={"to_file": 0, "limit": 0, "every_n": 1})
def print_op(ctx, xp, x, *, to_file, limit, every_n):
    """Print the input blob's name, type, dims and first `limit` values (default 1000) to stdout, on runs
    1, 1+every_n, 1+2*every_n, ... Limitation: `to_file` (Caffe2 writes <root folder>/<blob>.log) is not
    supported; stepnet warns once per op and prints to stdout instead."""
    if every_n < 1:
        raise ArgumentError(f"every_n must be >= 1, got {every_n}")
    state = ctx.state
    if to_file and not state.get("warned"):
        state["warned"] = True
        warnings.warn(f"{ctx.label}: Print to_file=1 is not supported; printing to stdout instead",
                      StepnetWarning, stacklevel=2)
    runs = state.get("runs", 0) + 1
    state["runs"] = runs
    if (runs - 1) % every_n == 0:
        print(format_tensor(ctx.opdef.input[0], x, limit if limit > 0 else PRINT_LIMIT_DEFAULT), flush=True)


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


def next_iter(counter, name: str):
    """counter + 1 as a fresh host int64 tensor of the same shape, with Caffe2's checks."""
    if counter is None:
        raise MissingBlobError(f"the iteration counter {name!r} holds no value; create it in the init net, "
                               "e.g. ConstantFill([], [iter], shape=[1], value=0, dtype=10)")
    if not hasattr(counter, "dtype") or counter.dtype.kind not in "iu":
        what = getattr(counter, "dtype", type(counter).__name__)
        raise DTypeError(f"the iteration counter {name!r} must be an int64 tensor, got {what}")
    host = np.asarray(backend.to_host(counter))
    if host.size != 1:
        raise ShapeError(f"the iteration counter {name!r} must hold one element, got shape {host.shape}")
    value = int(host.reshape(-1)[0])
    if value < 0:
        raise OpError(f"the iteration counter {name!r} is negative ({value})")
    if value >= np.iinfo(np.int64).max:
        raise OpError(f"the iteration counter {name!r} would overflow int64")
    return np.full(host.shape, value + 1, dtype=np.int64)


@op("Iter", inputs=(0, 1), enforce_inplace=[(0, 0)], context=True, devices="any", gradient=NO_GRADIENT)
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


@op("AtomicIter", inputs=2, enforce_inplace=[(1, 0)], devices="any", gradient=NO_GRADIENT)
def atomic_iter(xp, mutex, counter):
    """Iter holding `mutex` (made by CreateMutex) while it increments, for concurrent (Hogwild) nets."""
    if not isinstance(mutex, Mutex):
        raise DTypeError(f"input 0 must be a mutex made by CreateMutex, got {type(mutex).__name__}")
    with mutex:
        return next_iter(counter, "iter")


@op("CreateMutex", inputs=0, context=True, gradient=SHOULD_NOT_DO_GRADIENT)
def create_mutex(ctx, xp):
    """Put a new unlocked Mutex (not a tensor) in the output blob."""
    ctx.outputs[0].set(Mutex())  # stored directly: the run loop would turn a non-array result into an array
    return (None,)


# --------------------------------------------------------------------------------------------- Accumulate
@op("Accumulate", inputs=1, inplace=(), context=True, gradient=SHOULD_NOT_DO_GRADIENT, args={"gamma": 1.0})
def accumulate(ctx, xp, x, *, gamma):
    """Y = X + gamma * Y, reading Y from the previous run; Y starts at zero whenever it does not hold a
    float32 tensor of X's shape (Caffe2 reshapes and zero-fills it)."""
    if x.dtype != np.float32:
        raise DTypeError(f"Accumulate takes float32 input, got {x.dtype}; Cast it to float first")
    previous = ctx.outputs[0].value
    if (previous is None or not hasattr(previous, "dtype") or previous.dtype != np.float32
            or tuple(previous.shape) != tuple(x.shape)):
        return x.copy()
    return x + xp.asarray(previous) * np.float32(gamma)


# --------------------------------------------------------------------------------------------- checks
ASSERT_KINDS = "biu"  # Caffe2 accepts bool, int32 and int64 tensors


@op("Assert", inputs=1, outputs=0, devices="any", args={"error_msg": ""})
def assert_op(xp, x, *, error_msg):
    """Fail unless every element of X (bool or integer) is true / non-zero."""
    if x.dtype.kind not in ASSERT_KINDS:
        raise DTypeError(f"Assert takes a bool or integer tensor, got {x.dtype}; compare it first (e.g. GT)")
    host = np.asarray(backend.to_host(x)).reshape(-1)
    bad = np.flatnonzero(host == 0)
    if bad.size:
        first = int(bad[0])
        extra = f": {error_msg}" if error_msg else ""
        raise OpError(f"Assert failed{extra} ({bad.size} of {host.size} elements false; first at flat index "
                      f"{first}, value {_format_value(host[first].item())})")


@op("NanCheck", inputs=(1, None), inplace=[(0, 0)], context=True)
def nan_check(ctx, xp, x, *others):
    """Y = X, failing with the blob's name when X holds NaN or Inf (further inputs are only named)."""
    if x.dtype.kind != "f":
        raise DTypeError(f"NanCheck takes a float tensor, got {x.dtype}")
    finite = xp.isfinite(x)
    if not bool(finite.all()):
        host = np.asarray(backend.to_host(x)).reshape(-1)
        nans, infs = np.flatnonzero(np.isnan(host)), np.flatnonzero(np.isinf(host))
        parts = [f"{len(idx)} {what} (first at flat index {int(idx[0])})"
                 for what, idx in (("NaN", nans), ("Inf", infs)) if len(idx)]
        found = " and ".join(parts)
        raise OpError(f"blob {ctx.opdef.input[0]!r} contains {found} among {host.size} elements")
    return x.copy()
