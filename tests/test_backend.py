"""The backend table: every public function of stepnet.core.backend answers from BACKENDS, for any device kind."""
import sys

import numpy as np
import pytest

from stepnet.core import backend
from stepnet.core.backend import CPU_DEVICE, EMULATED, Device, DeviceArray


def test_each_kind_has_its_module():
    assert backend.array_module(CPU_DEVICE) is np
    assert backend.array_module(Device("emulated", 1)) is EMULATED
    assert backend.array_module(Device("cuda", 0)) is backend.cupy_module()
    assert set(backend.BACKENDS) >= {"cpu", "emulated", "cuda"}


@pytest.mark.parametrize("value", [None, 3.0, "text", [1.0, 2.0], np.float32(1.0)])
def test_non_arrays_belong_to_no_backend(value):
    assert backend.backend_of(value) is None and backend.device_of(value) is None
    assert backend.to_host(value) is value
    assert backend.all_finite(value) and not backend.any_nan(value)


def test_host_and_emulated_arrays_round_trip():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert backend.device_of(x) == CPU_DEVICE and backend.to_host(x) is x
    on = backend.to_device(x, Device("emulated", 2))
    assert type(on) is DeviceArray and backend.device_of(on) == Device("emulated", 2)
    back = backend.to_host(on)
    assert type(back) is np.ndarray and not np.shares_memory(back, on.view(np.ndarray))
    np.testing.assert_array_equal(back, x)
    again = backend.to_device(on, CPU_DEVICE)
    assert type(again) is np.ndarray and not np.shares_memory(again, x)
    copy = backend.to_device(x, CPU_DEVICE)
    assert copy is not x and not np.shares_memory(copy, x)


def test_a_registered_backend_answers_every_function(fake_backend):
    fake = Device("fake", 0)
    x = np.array([1.0, 2.0], np.float32)
    on = backend.to_device(x, fake)
    assert isinstance(on, fake_backend) and backend.device_of(on) == fake and str(fake) == "fake:0"
    assert backend.backend_of(on).kind == "fake"
    np.testing.assert_array_equal(backend.to_host(on), x)
    assert backend.array_module(fake).isfinite is not None
    emulated = backend.to_device(on, Device("emulated", 0))
    assert type(emulated) is DeviceArray
    np.testing.assert_array_equal(emulated.get(), x)


@pytest.mark.parametrize("kind", ["cpu", "emulated", "fake"])
@pytest.mark.parametrize("values, finite, nan", [([1.0, -2.0], True, False), ([1.0, np.nan], False, True),
                                                 ([np.inf, 0.0], False, False), ([-np.inf, np.nan], False, True),
                                                 ([], True, False)])
def test_all_finite_and_any_nan_on_every_backend(kind, values, finite, nan, request):
    if kind == "fake":
        request.getfixturevalue("fake_backend")
    v = backend.to_device(np.array(values, np.float32), Device(kind, 0))
    assert backend.all_finite(v) is finite and backend.any_nan(v) is nan


def test_all_finite_passes_arrays_that_cannot_hold_nan():
    assert backend.all_finite(np.array([1, 2], np.int64)) and backend.all_finite(np.array(["a"], dtype=object))
    assert not backend.any_nan(np.array([True]))


@pytest.mark.skipif("cupy" in sys.modules, reason="CuPy is already imported")
def test_looking_up_values_does_not_import_cupy(monkeypatch):
    def no_cupy():
        raise AssertionError("CuPy was looked up although no CuPy array can exist")
    monkeypatch.setattr(backend, "cupy_module", no_cupy)
    for value in (None, "text", [1.0], 3, np.ones(2), backend.to_device(np.ones(2), Device("emulated", 0))):
        backend.device_of(value)
        backend.to_host(value)
        backend.all_finite(value)
    assert "cupy" not in sys.modules


def test_an_op_on_emulated_device_1_leaves_its_results_there_and_the_next_op_reads_them():
    """Ops on GPU 1 (emulated): their results, arrays the kernels make from nothing included, are on
    emulated:1 (device_scope, as CuPy's current device), so a second op on GPU 1 reads them; GPU 0's stay on 0.
    Values against numpy."""
    from stepnet import NetDef, Workspace
    from stepnet.testing import make_op

    def on(gpu, op):
        op.device_option.device_type, op.device_option.device_id = backend.CUDA, gpu
        return op

    ws = Workspace(gpu="emulate")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    ws.feed("x", x)
    net = NetDef(name="two_gpus", op=[
        on(1, make_op("CopyCPUToGPU", ["x"], ["x1"])),
        on(1, make_op("Relu", ["x1"], ["r1"])),
        on(1, make_op("ConstantFill", [], ["z1"], shape=[2, 3], value=2.0)),
        on(1, make_op("Mul", ["r1", "z1"], ["y1"])),
        on(0, make_op("CopyCPUToGPU", ["x"], ["x0"])),
        on(0, make_op("Relu", ["x0"], ["y0"]))])
    ws.run_net_once(net)
    for name, index in (("x1", 1), ("r1", 1), ("z1", 1), ("y1", 1), ("y0", 0)):
        assert backend.device_of(ws.get_blob(name).value) == Device("emulated", index), name
    np.testing.assert_array_equal(ws.fetch("y1"), np.maximum(x, 0) * 2)
    with backend.device_scope(Device("emulated", 3)):
        made = EMULATED.zeros(2)
    assert made.device_index == 3 and EMULATED.zeros(2).device_index == 0


def test_a_cuda_device_the_machine_lacks_is_one_device_error(monkeypatch):
    """A model asking for CUDA device 3 on a one-GPU machine (CuPy stood in for): a DeviceError naming the
    count, before any kernel runs (CuPy's own error came from inside the kernel's device scope)."""
    import types

    from stepnet.core.errors import DeviceError
    from stepnet.io.proto import DeviceOption

    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=lambda: 1)))
    monkeypatch.setitem(backend.BACKENDS, "cuda", backend.Backend("cuda", lambda: fake, lambda v: False,
                                                                  lambda v: v, lambda a, i: a, lambda v: 0))
    assert backend.resolve(DeviceOption(device_type=backend.CUDA, device_id=0)) == Device("cuda", 0)
    with pytest.raises(DeviceError, match=r"CUDA device 3 but this machine has 1 GPU\(s\) \(0..0\)"):
        backend.resolve(DeviceOption(device_type=backend.CUDA, device_id=3))
