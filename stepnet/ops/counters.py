"""Counter objects and atomic scalars (Caffe2's counter_ops and atomic_ops): CreateCounter, ResetCounter,
CountDown, CheckCounterDone, CountUp, RetrieveCount; AtomicFetchAdd (under a CreateMutex lock);
CreateAtomicBool, ConditionalSetAtomicBool, CheckAtomicBool.

A counter is an opaque blob value (Counter) holding an int64 count; the ops that read it change it in place and
write their scalar results as host tensors whatever the op's device, as Caffe2 does. Save writes a counter as
Caffe2 does (a BlobProto of type "std::unique_ptr<Counter<int64_t>>" whose tensor holds the count) and Load
reads it back as a counter."""
from __future__ import annotations

import threading

import numpy as np

from ..core.errors import ArgumentError, DTypeError, FileFormatError, ShapeError
from ..io.blobs import register_blob_type
from ..io.proto import BlobProto, DataType, TensorProto
from .base import held_object, out_spec
from .registry import SHOULD_NOT_DO_GRADIENT, op
from .util import Mutex

COUNTER_TYPE = "std::unique_ptr<Counter<int64_t>>"


def _int64(value: int) -> int:
    """value wrapped into int64's range, as Caffe2's std::atomic<int64_t> wraps."""
    return (value + 2**63) % 2**64 - 2**63


class Counter:
    """Caffe2's Counter<int64_t>: a count changed under a lock, so concurrent nets may share it."""
    __slots__ = ("count", "_lock")

    def __init__(self, count: int):
        self.count, self._lock = int(count), threading.Lock()

    def count_down(self) -> bool:
        """True when the count was already <= 0 (done); the count goes down by one either way."""
        with self._lock:
            done = self.count <= 0
            self.count = _int64(self.count - 1)
            return done

    def count_up(self) -> int:
        """The count before adding one."""
        with self._lock:
            previous, self.count = self.count, _int64(self.count + 1)
            return previous

    def reset(self, count: int) -> int:
        """The count before setting it to `count`."""
        with self._lock:
            previous, self.count = self.count, int(count)
            return previous

    def __repr__(self):
        return f"Counter({self.count})"


class AtomicBool:
    """Caffe2's std::atomic<bool> blob (CreateAtomicBool): false until ConditionalSetAtomicBool sets it."""
    __slots__ = ("value",)

    def __init__(self):
        self.value = False

    def __repr__(self):
        return f"AtomicBool({self.value})"


NOUNS = {Counter: "a counter", AtomicBool: "an atomic bool", Mutex: "a mutex"}


def _object(value, i: int, cls: type, maker: str):
    return held_object(value, cls, i, NOUNS[cls], maker)


def _counter(value) -> Counter:
    return _object(value, 0, Counter, "CreateCounter")


def _scalar_of(dtype, cls: type = Counter, maker: str = "CreateCounter", dims=()):
    """Shape function of an op reading an object from input 0 and writing one scalar: a known spec there is a
    tensor, which is an error before anything runs."""
    def shape(specs, **_):
        _object(specs[0], 0, cls, maker)
        return [out_spec(dims, dtype)]
    return shape


def _check_init(init_count: int) -> None:
    if init_count < 0:
        raise ArgumentError(f"init_count must be >= 0, got {init_count}")


@op("CreateCounter", inputs=0, outputs=1, devices="any", gradient=SHOULD_NOT_DO_GRADIENT, args={"init_count": 0})
def create_counter(xp, *, init_count):
    """A new counter holding init_count (>= 0)."""
    _check_init(init_count)
    return Counter(init_count)


@op("ResetCounter", inputs=1, outputs=(0, 1), devices="any", gradient=SHOULD_NOT_DO_GRADIENT,
    args={"init_count": 0})
def reset_counter(xp, counter, *, init_count):
    """Set the counter to init_count (>= 0); the optional output gets the count it held (int64, 0-d)."""
    _check_init(init_count)
    return (np.asarray(_counter(counter).reset(init_count), np.int64),)   # (a tuple: the output is optional)


@op("CountDown", inputs=1, outputs=1, devices="any", gradient=SHOULD_NOT_DO_GRADIENT, shape=_scalar_of(np.bool_))
def count_down(xp, counter):
    """Take one from the count; the output (bool, 0-d) is true when the count was already <= 0."""
    return np.asarray(_counter(counter).count_down(), np.bool_)


@op("CheckCounterDone", inputs=1, outputs=1, devices="any", shape=_scalar_of(np.bool_))
def check_counter_done(xp, counter):
    """True (bool, 0-d) when the count is <= 0; the count is left as it is."""
    return np.asarray(_counter(counter).count <= 0, np.bool_)


@op("CountUp", inputs=1, outputs=1, devices="any", gradient=SHOULD_NOT_DO_GRADIENT, shape=_scalar_of(np.int64))
def count_up(xp, counter):
    """Add one to the count; the output (int64, 0-d) is the count before."""
    return np.asarray(_counter(counter).count_up(), np.int64)


@op("RetrieveCount", inputs=1, outputs=1, devices="any", gradient=SHOULD_NOT_DO_GRADIENT,
    shape=_scalar_of(np.int64))
def retrieve_count(xp, counter):
    """The current count (int64, 0-d)."""
    return np.asarray(_counter(counter).count, np.int64)


# --------------------------------------------------------------------------------------------- atomic ops
def _int32_scalar(value, i: int) -> int:
    if getattr(value, "dtype", None) != np.int32:
        what = getattr(value, "dtype", None) or type(value).__name__
        raise DTypeError(f"input {i} must be an int32 tensor, got {what}")
    if value.size < 1:
        raise ShapeError(f"input {i} is empty; AtomicFetchAdd reads its first element")
    return int(np.asarray(value).reshape(-1)[0])


def _fetch_add_shape(specs, **_):
    _object(specs[0], 0, Mutex, "CreateMutex")
    return []


@op("AtomicFetchAdd", inputs=3, outputs=2, inplace=[(1, 0)], context=True, gradient=SHOULD_NOT_DO_GRADIENT,
    shape=_fetch_add_shape)
def atomic_fetch_add(ctx, xp, mutex, *_):
    """Holding the mutex (made by CreateMutex): output 0 = input 1 + input 2 and output 1 = input 1, int32
    scalars (0-d; the first element of each input is read). The inputs are read and the outputs written under
    the lock, so concurrent nets sharing the value lose no update."""
    _object(mutex, 0, Mutex, "CreateMutex")
    with mutex:
        a = _int32_scalar(ctx.inputs[1].value, 1)
        b = _int32_scalar(ctx.inputs[2].value, 2)
        ctx.outputs[1].set(np.asarray(a, np.int32))
        ctx.outputs[0].set(np.asarray(a + b, np.int64).astype(np.int32))   # wraps as int32 arithmetic does
    return (None, None)


@op("CreateAtomicBool", inputs=0, outputs=1, gradient=SHOULD_NOT_DO_GRADIENT)
def create_atomic_bool(xp):
    """A new atomic bool, false."""
    return AtomicBool()


@op("ConditionalSetAtomicBool", inputs=2, outputs=0, gradient=SHOULD_NOT_DO_GRADIENT)
def conditional_set_atomic_bool(xp, flag, condition):
    """Set the atomic bool (input 0) to true when the first element of the bool tensor `condition` is true."""
    flag = _object(flag, 0, AtomicBool, "CreateAtomicBool")
    if getattr(condition, "dtype", None) != np.bool_ or condition.size < 1:
        raise DTypeError(f"input 1 must be a non-empty bool tensor, got {getattr(condition, 'dtype', condition)}")
    if bool(np.asarray(condition).reshape(-1)[0]):
        flag.value = True


@op("CheckAtomicBool", inputs=1, outputs=1, gradient=SHOULD_NOT_DO_GRADIENT,
    shape=_scalar_of(np.bool_, AtomicBool, "CreateAtomicBool", (1,)))
def check_atomic_bool(xp, flag):
    """The atomic bool's value as a bool tensor of shape [1]."""
    return np.asarray([_object(flag, 0, AtomicBool, "CreateAtomicBool").value], np.bool_)


# --------------------------------------------------------------------------------------------- Save / Load
def _counter_proto(counter: Counter, name: str) -> BlobProto:
    proto = BlobProto()
    proto.tensor.CopyFrom(TensorProto(name=name, data_type=DataType.INT64, dims=[1], int64_data=[counter.count]))
    return proto


def _counter_from_proto(proto: BlobProto) -> Counter:
    t = proto.tensor
    if list(t.dims) != [1] or t.data_type != DataType.INT64 or len(t.int64_data) != 1:
        raise FileFormatError(f"a saved counter holds one int64 in a tensor of dims [1], got dims {list(t.dims)}, "
                              f"{DataType.Name(t.data_type)}, {len(t.int64_data)} int64 value(s)")
    return Counter(t.int64_data[0])


register_blob_type(Counter, COUNTER_TYPE, _counter_proto, _counter_from_proto, whole_proto=True)
