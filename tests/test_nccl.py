"""The NCCL path (stepnet/distributed/nccl.py) without a GPU: a stand-in for `cupy` and `cupy.cuda.nccl` whose
communicator of one rank copies the bytes between the device pointers it is given, as NCCL does for a single rank. It
checks the calls' pointers, counts and data types (a wrong count or type moves the wrong bytes); and that CPU
collectives never import the module."""
import ctypes
import subprocess
import sys
import types
from contextlib import nullcontext

import numpy as np
import pytest

from stepnet.core import backend
from stepnet.distributed import nccl
from stepnet.core.errors import CollectiveError

SIZES = {0: 1, 1: 1, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 4, 8: 8}   # NCCL data type -> bytes per element
FAKE_NCCL = types.SimpleNamespace(
    NCCL_INT8=0, NCCL_UINT8=1, NCCL_INT32=2, NCCL_UINT32=3, NCCL_INT64=4, NCCL_UINT64=5, NCCL_FLOAT16=6,
    NCCL_FLOAT32=7, NCCL_FLOAT64=8, NCCL_SUM=0, get_unique_id=lambda: (1, 2, 3))


class DeviceArray(np.ndarray):
    """A 'CuPy array': its memory is reached through .data.ptr, on device 0."""
    device = types.SimpleNamespace(id=0)

    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.__array_interface__["data"][0])


class OneRank:
    """NCCL's communicator of a single rank: every collective copies the send buffer to the receive buffer."""
    def __init__(self, size, uid, rank):
        assert (size, uid, rank) == (1, (1, 2, 3), 0)

    def allReduce(self, send, recv, count, dtype, op, stream):  # noqa: N802 - cupy's names
        ctypes.memmove(recv, send, count * SIZES[dtype])

    def reduce(self, send, recv, count, dtype, op, root, stream):
        ctypes.memmove(recv, send, count * SIZES[dtype])

    def broadcast(self, send, recv, count, dtype, root, stream):
        ctypes.memmove(recv, send, count * SIZES[dtype])

    def allGather(self, send, recv, count, dtype, stream):  # noqa: N802
        ctypes.memmove(recv, send, count * SIZES[dtype])


FAKE_NCCL.NcclCommunicator = OneRank
FAKE_CUPY = types.SimpleNamespace(
    uint8=np.uint8, ascontiguousarray=lambda x: np.ascontiguousarray(x).view(DeviceArray),
    empty_like=lambda x: np.empty_like(x).view(DeviceArray), empty=lambda s, d: np.empty(s, d).view(DeviceArray),
    cuda=types.SimpleNamespace(Device=lambda i: nullcontext(), get_current_stream=lambda: types.SimpleNamespace(ptr=0)))


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(nccl, "_nccl", lambda: FAKE_NCCL)
    monkeypatch.setattr(backend, "cupy_module", lambda: FAKE_CUPY)
    return types.SimpleNamespace(rank=0, size=1, comm=None, nccl={})


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8, np.bool_])
def test_one_rank_collectives_move_the_right_bytes(fake_gpu, dtype):
    x = (np.arange(12).reshape(3, 4) % 3).astype(dtype).view(DeviceArray)
    for result in (nccl.allreduce(fake_gpu, x), nccl.broadcast(fake_gpu, x, 0), nccl.reduce(fake_gpu, x, 0),
                   nccl.allgather(fake_gpu, x)):
        assert result.shape == x.shape and result.dtype == x.dtype and np.array_equal(result, x)
    assert list(fake_gpu.nccl) == [0]   # one communicator per device, made once


def test_types_nccl_lacks(fake_gpu):
    with pytest.raises(CollectiveError, match="NCCL has no data type for complex64"):
        nccl.allreduce(fake_gpu, np.zeros(2, np.complex64).view(DeviceArray))


def test_cpu_collectives_never_import_the_nccl_module():
    code = ("import sys, numpy as np; from collective_checks import check_all; check_all(0, 1); "
            "assert 'stepnet.distributed.nccl' not in sys.modules")
    from pathlib import Path
    ops = Path(__file__).resolve().parent / "ops"
    r = subprocess.run([sys.executable, "-c", code], cwd=ops, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
