"""Utility operators: Print's output, the state-carrying Iter/AtomicIter/Accumulate over several runs of
one created net, CreateMutex, and the Assert/NanCheck run-time checks."""
import sys
import threading
import time

import numpy as np
import pytest

from stepnet import Limits, NetDef, Workspace
from stepnet.core.backend import DeviceArray
from stepnet.core.errors import ArgumentError, DTypeError, MissingBlobError, OpError, ShapeError, StepnetWarning
from stepnet.ops import REGISTRY
from stepnet.ops.util import Mutex, next_iter
from stepnet.io.proto import DeviceOption
from stepnet.testing import DEVICES, infer_static, make_op, run_op

INT64 = 10
GPU = DeviceOption(device_type=1)


def workspace(device):
    return Workspace(gpu="emulate" if device != "cpu" else None)


def make_net(name, *ops, device="cpu"):
    nd = NetDef(name=name)
    nd.op.extend(ops)
    if device != "cpu":
        nd.device_option.CopyFrom(GPU)
    return nd


def feed(ws, name, value, device):
    ws.feed(name, value, device_option=GPU if device != "cpu" else None)


def init_counter(ws, value=0):
    """The init net Caffe2's Python helpers emit: the counter is an int64 [1] tensor on the CPU."""
    fill = make_op("ConstantFill", [], ["iter"], shape=[1], value=value, dtype=INT64)
    ws.run_net_once(make_net("init", fill))


# --------------------------------------------------------------------------------------------- Print
@pytest.mark.parametrize("device", DEVICES)
def test_print_format(device, capsys):
    run_op("Print", {"W": np.array([[1.5, -2, 0.25], [1e-7, 3, 4]], np.float32)}, 0, device=device)
    run_op("Print", {"n": np.array([1, 0], np.int32)}, 0, device=device, limit=1)
    run_op("Print", {"flag": np.array([True, False])}, 0, device=device)
    run_op("Print", {"empty": np.zeros((0, 3), np.float32)}, 0, device=device)
    assert capsys.readouterr().out.splitlines() == [
        "Tensor W of type float32. Dims: (2,3,): 1.5,-2,0.25,1e-07,3,4",
        "Tensor n of type int32. Dims: (2,): 1",
        "Tensor flag of type bool. Dims: (2,): 1,0",
        "Tensor empty of type float32. Dims: (0,3,): ",
    ]


def test_print_limit_default_is_1000(capsys):
    run_op("Print", {"x": np.arange(1500, dtype=np.int64)}, 0)
    values = capsys.readouterr().out.split("): ", 1)[1].strip().split(",")
    assert values == [str(i) for i in range(1000)]


@pytest.mark.parametrize("device", DEVICES)
def test_print_every_n_over_runs(device, capsys):
    ws = workspace(device)
    init_counter(ws)
    ws.create_net(make_net("train", make_op("Iter", ["iter"], ["iter"]),
                           make_op("Print", ["iter"], [], every_n=3), device=device))
    ws.run_net("train", 7)
    printed = [line.rsplit(": ", 1)[1] for line in capsys.readouterr().out.splitlines()]
    assert printed == ["1", "4", "7"]  # runs 1, 1+n, 1+2n


def test_print_to_file_appends_caffe2s_line_to_the_blobs_log(tmp_path, capsys):
    """Print(to_file=1) writes Caffe2's TensorPrinter line to <root folder>/<blob>.log ('/' as '#'), one per
    printed run (every_n), emptied when a new bound op first runs; nothing on stdout."""
    ws = Workspace(limits=Limits(trusted=True))    # a Python program's paths: its own choice, as in Caffe2
    ws.root_folder = str(tmp_path)
    ws.feed("scope/x", np.array([1.5, -2], np.float32))
    net = make_net("n", make_op("Print", ["scope/x"], [], to_file=1, every_n=2))
    ws.create_net(net)
    ws.run_net("n", 3)
    log = tmp_path / "scope#x.log"
    assert log.read_text() == "Tensor scope/x of type float32. Dims: (2,): 1.5,-2\n" * 2    # runs 1 and 3
    assert capsys.readouterr().out == ""
    ws.create_net(net, overwrite=True).run()
    assert log.read_text().count("\n") == 1


def test_a_model_files_print_to_file_prints_to_stdout(tmp_path, monkeypatch, capsys):
    """Under a model file's limits (the command line's) a model writes databases only: its Print(to_file=1)
    prints to stdout, with one warning per op, and writes nothing."""
    monkeypatch.chdir(tmp_path)
    ws = Workspace()
    ws.feed("x", np.ones(2, np.float32))
    ws.create_net(make_net("n", make_op("Print", ["x"], [], to_file=1)))
    with pytest.warns(StepnetWarning, match="would write x.log, and a model file may write databases only") as record:
        ws.run_net("n", 2)
    assert len(record) == 1
    assert capsys.readouterr().out.count("Tensor x of type float32") == 2
    assert list(tmp_path.iterdir()) == []


def test_print_non_tensor_and_bad_every_n(capsys):
    ws = Workspace()
    ws.run_operator_once(make_op("CreateMutex", [], ["m"]))
    ws.run_operator_once(make_op("Print", ["m"], []))
    assert capsys.readouterr().out.strip() == "Blob m of type Mutex"
    with pytest.raises(ArgumentError, match="every_n must be >= 1, got 0"):
        run_op("Print", [np.ones(1)], 0, every_n=0)


# --------------------------------------------------------------------------------------------- Iter
def check_iter_runs(device, runs=5):
    """Iter in place over `runs` runs of one net: the counter is 1, 2, ... as int64 on the host."""
    ws = workspace(device)
    init_counter(ws)
    ws.create_net(make_net("train", make_op("Iter", ["iter"], ["iter"]), device=device))
    for expected in range(1, runs + 1):
        ws.run_net("train")
        value = ws.get_blob("iter").value
        assert type(value) is np.ndarray, "the counter must stay on the host"
        assert value.dtype == np.int64 and value.shape == (1,)
        assert value.tolist() == [expected], f"run {expected}: counter {value.tolist()}"


@pytest.mark.parametrize("device", DEVICES)
def test_iter_counts_runs(device):
    check_iter_runs(device)


@pytest.mark.parametrize("device", DEVICES)
def test_legacy_iter_without_input(device):
    ws = workspace(device)
    ws.create_net(make_net("train", make_op("Iter", [], ["it"]), device=device))
    seen = []
    for _ in range(3):
        ws.run_net("train")
        seen.append(ws.fetch("it").tolist())
    assert seen == [[1], [2], [3]]  # created at 0, then incremented on the same run
    ws.feed("it", np.array([41], np.int64))  # an existing counter is resumed, not reset
    ws.run_net("train")
    assert ws.fetch("it").tolist() == [42]


def test_iter_bad_counters():
    ws = Workspace()
    ws.feed("c", np.zeros(1, np.int64))
    with pytest.raises(ArgumentError, match="must write input 0 .*'c'.* in place"):
        ws.run_operator_once(make_op("Iter", ["c"], ["d"]))
    cases = [(np.array([-1], np.int64), OpError, "is negative"),
             (np.zeros(2, np.int64), ShapeError, "one element, got shape"),
             (np.zeros(1, np.float32), DTypeError, "must be an int64 tensor, got float32"),
             (np.array([np.iinfo(np.int64).max]), OpError, "overflow")]
    for value, error, match in cases:
        ws.feed("c", value)
        with pytest.raises(error, match=match):
            ws.run_operator_once(make_op("Iter", ["c"], ["c"]))
    ws.create_blob("never_written")
    with pytest.raises(MissingBlobError, match="'never_written' holds no value.*ConstantFill"):
        ws.run_operator_once(make_op("Iter", ["never_written"], ["never_written"]))


# --------------------------------------------------------------------------------------------- mutex
@pytest.mark.parametrize("device", DEVICES)
def test_atomic_iter_with_mutex(device):
    ws = workspace(device)
    init_counter(ws, value=10)
    ws.run_operator_once(make_op("CreateMutex", [], ["mutex"]))
    mutex = ws.get_blob("mutex").value
    assert isinstance(mutex, Mutex) and not mutex.locked()
    assert "not a tensor" in ws.fetch("mutex")
    ws.create_net(make_net("train", make_op("AtomicIter", ["mutex", "iter"], ["iter"]), device=device))
    ws.run_net("train", 4)
    assert ws.fetch("iter").tolist() == [14] and ws.fetch("iter").dtype == np.int64
    assert not mutex.locked()


def count_from_threads(workers=4, runs=250):
    """The counter after `workers` threads each ran a net of one AtomicIter `runs` times. Threads switch
    every microsecond, so an increment that is not atomic is lost with near certainty."""
    ws = Workspace()
    init_counter(ws)
    ws.run_operator_once(make_op("CreateMutex", [], ["mutex"]))
    nets = [ws.create_net(make_net(f"worker{k}", make_op("AtomicIter", ["mutex", "iter"], ["iter"])))
            for k in range(workers)]
    threads = [threading.Thread(target=lambda n=n: [n.run() for _ in range(runs)]) for n in nets]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    return ws.fetch("iter").tolist()


def test_atomic_iter_from_threads():
    assert count_from_threads() == [1000]


def test_atomic_iter_bad_inputs():
    ws = Workspace()
    ws.feed("notamutex", np.zeros(1))
    ws.feed("it", np.zeros(1, np.int64))
    with pytest.raises(DTypeError, match="must be a mutex made by CreateMutex, got ndarray"):
        ws.run_operator_once(make_op("AtomicIter", ["notamutex", "it"], ["it"]))
    with pytest.raises(ArgumentError, match="must write input 1 .* in place"):
        ws.run_operator_once(make_op("AtomicIter", ["notamutex", "it"], ["other"]))


# --------------------------------------------------------------------------------------------- Accumulate
def accumulate_reference(xs, gamma):
    """Y after each run: Y = X + gamma * Y elementwise, Y starting at zero."""
    y = [0.0] * len(xs[0])
    out = []
    for x in xs:
        y = [xi + gamma * yi for xi, yi in zip(x, y, strict=True)]
        out.append(y)
    return out


def check_accumulate(device, gamma=0.5):
    ws = workspace(device)
    xs = [[1.0, -2.0, 0.5], [0.25, 4.0, -1.0], [3.0, 3.0, 3.0], [0.0, 1.0, 2.0]]
    ws.create_blob("x")
    ws.create_net(make_net("acc", make_op("Accumulate", ["x"], ["y"], gamma=gamma), device=device))
    for x, expected in zip(xs, accumulate_reference(xs, gamma), strict=True):
        feed(ws, "x", np.array(x, np.float32), device)
        ws.run_net("acc")
        y = ws.fetch("y")
        assert y.dtype == np.float32
        np.testing.assert_allclose(y, expected, rtol=1e-6)
    return ws


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gamma", [1.0, 0.5, -2.0])
def test_accumulate_over_runs(device, gamma):
    ws = check_accumulate(device, gamma)
    # X changes shape: Y is reset to zero first, so it equals X
    feed(ws, "x", np.full((2, 2), 7.0, np.float32), device)
    ws.run_net("acc")
    assert ws.fetch("y").tolist() == [[7.0, 7.0], [7.0, 7.0]]


@pytest.mark.parametrize("device", DEVICES)
def test_accumulate_onto_existing_output(device):
    ws = workspace(device)
    feed(ws, "x", np.array([1.0, 2.0], np.float32), device)
    feed(ws, "y", np.array([10.0, 20.0], np.float32), device)  # right shape already: added to
    ws.run_operator_once(make_op("Accumulate", ["x"], ["y"], device=device, gamma=0.1))
    np.testing.assert_allclose(ws.fetch("y"), [2.0, 4.0], rtol=1e-6)


def test_accumulate_bad_inputs():
    with pytest.raises(DTypeError, match="float32 input, got int32; Cast"):
        run_op("Accumulate", [np.ones(2, np.int32)], 1)
    ws = Workspace()
    ws.feed("x", np.ones(2, np.float32))
    with pytest.raises(ArgumentError, match="cannot write output 0 in place"):
        ws.run_operator_once(make_op("Accumulate", ["x"], ["x"]))


# --------------------------------------------------------------------------------------------- checks
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("value", [np.array([True, True]), np.array([[1, 5], [-3, 2]], np.int32),
                                   np.array([2**40], np.int64), np.zeros(0, np.bool_)])
def test_assert_passes(device, value):
    assert run_op("Assert", [value], 0, device=device) == []


@pytest.mark.parametrize("device", DEVICES)
def test_assert_fails(device):
    with pytest.raises(OpError, match=r"Assert failed: lengths must match \(2 of 4 elements false; first at "
                                      r"flat index 1, value 0\)"):
        run_op("Assert", {"ok": np.array([1, 0, 3, 0], np.int64)}, 0, device=device,
               error_msg="lengths must match")
    with pytest.raises(OpError, match=r"Assert failed \(1 of 1 elements false.*value 0\)"):
        run_op("Assert", [np.array([False])], 0, device=device)
    with pytest.raises(DTypeError, match="bool or integer tensor, got float32"):
        run_op("Assert", [np.ones(2, np.float32)], 0, device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_nan_check_passes_through(device):
    x = np.array([[1.5, -2.0], [0.0, 3e38]], np.float32)
    y = run_op("NanCheck", [x, np.zeros(3, np.float32)], 1, device=device)
    assert y.dtype == np.float32 and y.tolist() == x.tolist()
    ws = workspace(device)
    feed(ws, "x", x, device)
    ws.run_operator_once(make_op("NanCheck", ["x"], ["x"], device=device))  # in place
    assert ws.fetch("x").tolist() == x.tolist()
    assert isinstance(ws.get_blob("x").value, DeviceArray) == (device != "cpu")


@pytest.mark.parametrize("device", DEVICES)
def test_nan_check_fails(device):
    with pytest.raises(OpError, match=r"blob 'grad' contains 2 NaN \(first at flat index 1\) among 4"):
        run_op("NanCheck", {"grad": np.array([0, np.nan, 1, np.nan], np.float32)}, 1, device=device)
    with pytest.raises(OpError, match=r"'w' contains 1 NaN \(first at flat index 2\) and 1 Inf "
                                      r"\(first at flat index 0\)"):
        run_op("NanCheck", {"w": np.array([-np.inf, 1, np.nan])}, 1, device=device)
    with pytest.raises(DTypeError, match="float tensor, got int32"):
        run_op("NanCheck", [np.ones(2, np.int32)], 1, device=device)


# --------------------------------------------------------------------------------------------- static shapes
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type,inputs,n_out,want", [
    ("Iter", [np.array([4], np.int64)], 1, [((1,), np.int64)]),
    ("Iter", [np.array(4, np.int32)], 1, [((), np.int64)]),
    ("Accumulate", [np.ones((2, 3), np.float32)], 1, [((2, 3), np.float32)]),
    ("NanCheck", [np.ones((2, 3)), np.zeros(4, np.float32)], 1, [((2, 3), np.float64)]),
    ("Assert", [np.array([1, 2], np.int32)], 0, []),
    ("Print", [np.ones(2, np.float16)], 0, []),
])
def test_static_specs(device, op_type, inputs, n_out, want, capsys):
    """The inferred specs, written out by hand; run_op then checks them against the real outputs too."""
    got = infer_static(op_type, inputs, n_out)
    assert [(s.shape, s.dtype) for s in got] == [(shape, np.dtype(d)) for shape, d in want]
    assert all(s.value is None for s in got)  # a counter's value changes on every run: never carried
    if op_type == "Iter":  # in place, and the counter stays on the host (run_op expects device outputs)
        out = run_op(op_type, inputs, ["in0"])
    else:
        out = run_op(op_type, inputs, n_out, device=device)
    for spec, value in zip(got, out if n_out != 1 else [out], strict=True):
        assert value.shape == spec.shape and value.dtype == spec.dtype


def test_static_unknown_outputs():
    """The legacy 0-input Iter takes the shape of whatever its output blob held; CreateMutex makes no
    tensor."""
    assert infer_static("Iter", [])[0].shape is None
    assert infer_static("CreateMutex", [])[0].shape is None


@pytest.mark.parametrize("op_type,inputs,n_out,args,error,match", [
    ("Iter", [np.zeros(2, np.int64)], 1, {}, ShapeError, "one element, got shape"),
    ("Iter", [np.zeros(1, np.float32)], 1, {}, DTypeError, "must be an int64 tensor, got float32"),
    ("AtomicIter", [np.zeros(1), np.zeros(1, np.int64)], 1, {}, DTypeError,
     "must be a mutex made by CreateMutex"),
    ("Accumulate", [np.ones(2, np.int32)], 1, {}, DTypeError, "float32 input, got int32; Cast"),
    ("Assert", [np.ones(2, np.float32)], 0, {}, DTypeError, "bool or integer tensor, got float32"),
    ("NanCheck", [np.ones(2, np.int32)], 1, {}, DTypeError, "float tensor, got int32"),
    ("Print", [np.ones(1)], 0, {"every_n": 0}, ArgumentError, "every_n must be >= 1, got 0"),
])
def test_bad_input_caught_statically(op_type, inputs, n_out, args, error, match):
    """The kernels' shape and dtype errors, raised by the shape functions before anything runs."""
    with pytest.raises(error, match=match):
        infer_static(op_type, inputs, n_out, **args)


# --------------------------------------------------------------------------------------------- the testers
def test_checkers_detect_broken_kernels(broken):
    check_accumulate("cpu", gamma=0.5)
    check_iter_runs("cpu")
    acc = REGISTRY.get("Accumulate")
    broken("Accumulate", lambda ctx, xp, x, gamma: acc.kernel(ctx, xp, x, gamma=1.0))
    with pytest.raises(AssertionError):
        check_accumulate("cpu", gamma=0.5)  # a kernel ignoring gamma

    def racy(ctx, xp, mutex, counter):  # increments under the lock a counter read before taking it
        with mutex:
            time.sleep(1e-4)           # the other threads read the same stale counter meanwhile, every time
            return next_iter(counter, "iter")

    broken("AtomicIter", racy)
    assert count_from_threads() != [1000]

    it = REGISTRY.get("Iter")
    broken("Iter", lambda ctx, xp, *c: it.kernel(ctx, xp, *c) + 1)
    with pytest.raises(AssertionError, match="run 1: counter"):
        check_iter_runs("cpu")
