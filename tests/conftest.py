"""Fixtures shared by every test module."""
from __future__ import annotations

import contextlib
import types
from pathlib import Path

import numpy as np
import pytest

DATA_DIR = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="session", autouse=True)
def _stepnet_cache(tmp_path_factory):
    """stepnet's cache (onnxruntime exports) in a folder of the test session's, never the user's ~/.cache."""
    import os
    folder = tmp_path_factory.mktemp("stepnet-cache")
    saved = os.environ.get("STEPNET_CACHE_DIR")
    os.environ["STEPNET_CACHE_DIR"] = str(folder)
    yield folder
    if saved is None:
        os.environ.pop("STEPNET_CACHE_DIR", None)
    else:
        os.environ["STEPNET_CACHE_DIR"] = saved


@pytest.fixture(scope="session", autouse=True)
def _blas_threads():
    """numpy's BLAS at DEFAULT_THREADS for the whole session, the count every workspace's nets run with. Tests
    that compare a kernel or compiled form called directly with a net's run bit for bit need one thread count on
    both sides: multi-threaded OpenBLAS splits a GEMM's sums otherwise on some kernel families (Haswell's), and
    which count a direct call got depended on what earlier tests had left. Tests of the thread handling set
    their own counts inside."""
    from stepnet.runtime.workspace import DEFAULT_THREADS, numpy_blas
    with numpy_blas().limit(limits=DEFAULT_THREADS):
        yield


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """tests/data: the vendored real Caffe2 files (provenance in tests/data/SOURCES.md)."""
    return DATA_DIR


# The registry is frozen once stepnet.ops is imported; tests change records only through these fixtures, which
# use its two test hooks (REGISTRY.patched and REGISTRY.temporary) and undo every change after the test.
@pytest.fixture
def patched():
    """patched(op_type, **fields) swaps fields of a registered record (kernel, shape, inplace_kernel, ...) for
    the test and returns the patched record; a later call for the same op patches on top of the earlier one."""
    from stepnet.ops import REGISTRY

    with contextlib.ExitStack() as undo:
        yield lambda op_type, **fields: undo.enter_context(REGISTRY.patched(op_type, **fields))


@pytest.fixture
def broken(patched):
    """broken(op_type, kernel) swaps a registered kernel for the test; every swap is undone afterwards."""
    def replace(op_type, kernel):
        patched(op_type, kernel=kernel, fused_kernel=None)   # the fused arithmetic would bypass the swap
    return replace


@pytest.fixture
def temporary_op():
    """temporary_op(op_type, kernel, **record) registers a throwaway op (record: the keywords of @op) for the
    test and returns its record; it is removed afterwards."""
    from stepnet.ops import REGISTRY

    with contextlib.ExitStack() as undo:
        yield lambda op_type, kernel, **record: undo.enter_context(REGISTRY.temporary(op_type, kernel, **record))


class FakeArray:
    """An array of a made-up device kind 'fake'. Like a CuPy array it is no ndarray, refuses to become one
    implicitly, and its reductions stay on the device until bool() brings the verdict to the host."""

    def __init__(self, data):
        self.data = np.asarray(data)

    shape = property(lambda self: self.data.shape)
    dtype = property(lambda self: self.data.dtype)
    size = property(lambda self: self.data.size)

    def __array__(self, *args, **kwargs):
        raise TypeError("implicit conversion of a fake-device array to numpy")

    def all(self) -> "FakeArray":
        return FakeArray(self.data.all())

    def any(self) -> "FakeArray":
        return FakeArray(self.data.any())

    def __bool__(self) -> bool:
        return bool(self.data)


FAKE_MODULE = types.SimpleNamespace(isfinite=lambda a: FakeArray(np.isfinite(a.data)),
                                    isnan=lambda a: FakeArray(np.isnan(a.data)))


@pytest.fixture
def fake_backend(monkeypatch):
    """A backend record for the device kind 'fake' (arrays: FakeArray) in backend.BACKENDS for the test;
    returns the FakeArray class."""
    from stepnet.core import backend

    record = backend.Backend("fake", lambda: FAKE_MODULE, lambda v: isinstance(v, FakeArray),
                             lambda v: v.data.copy(), lambda a, index: FakeArray(np.array(a, copy=True)),
                             lambda v: 0)
    monkeypatch.setitem(backend.BACKENDS, "fake", record)
    return FakeArray


def _call_with_timeout(fn, *args, seconds: float = 10, **kwargs):
    """fn(*args, **kwargs) in a daemon thread: its result, or its exception re-raised; a call still running after
    `seconds` fails the test (reading a FIFO or a device can block forever) instead of hanging the suite."""
    import threading

    out = {}

    def target():
        try:
            out["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            out["error"] = e
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{getattr(fn, '__name__', fn)}{args} blocks"
    if "error" in out:
        raise out["error"]
    return out.get("value")


@pytest.fixture
def no_hang():
    """no_hang(fn, *args, seconds=10, **kwargs): call fn, failing the test if it blocks (FIFOs, devices)."""
    return _call_with_timeout


@pytest.fixture
def fifo(tmp_path):
    """A FIFO nobody writes to, at tmp_path / 'pipe' (skips where there are none)."""
    import os

    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this system")
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path
