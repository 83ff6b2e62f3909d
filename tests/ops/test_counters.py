"""Counters and atomic scalars (stepnet/ops/counters.py): random op sequences against a reference model of
Caffe2's Counter written here from its docs (CountDown: done when the count is already <= 0, and the count
goes down either way), Save/Load in Caffe2's blob format, AtomicFetchAdd and the atomic bool, bad inputs,
the gradient kinds, and a broken kernel caught."""
import numpy as np
import pytest

from stepnet import NetDef, Workspace
from stepnet.core.errors import ArgumentError, DTypeError, FileFormatError, GradientError
from stepnet.io import minidb
from stepnet.io.proto import BlobProto, DataType, TensorProto
from stepnet.ops.counters import Counter
from stepnet.passes.gradients import gradient_of_op
from stepnet.passes.shapes import infer_net
from stepnet.core.spec import TensorSpec
from stepnet.testing import make_op

rng = np.random.default_rng(7)


@pytest.fixture
def in_tmp_path(tmp_path, monkeypatch):
    """Db paths must lie under the file root, the working directory when the workspace is made."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(ws, op_type, inputs, outputs, **args):
    ws.run_operator_once(make_op(op_type, inputs, outputs, **args))


class ReferenceCounter:
    """Caffe2's counter_ops docs, one method per op: each returns what the op outputs."""

    def __init__(self, n):
        self.n = n

    def CountDown(self):
        done, self.n = not self.n > 0, self.n - 1
        return done

    def CheckCounterDone(self):
        return self.n <= 0

    def CountUp(self):
        self.n += 1
        return self.n - 1

    def RetrieveCount(self):
        return self.n

    def ResetCounter(self, init_count):
        old, self.n = self.n, init_count
        return old


def check_against_reference(steps=60):
    ws = Workspace()
    run(ws, "CreateCounter", [], ["c"], init_count=3)
    ref = ReferenceCounter(3)
    for _ in range(steps):
        kind = rng.choice(["CountDown", "CheckCounterDone", "CountUp", "RetrieveCount", "ResetCounter"])
        args = {"init_count": int(rng.integers(0, 4))} if kind == "ResetCounter" else {}
        run(ws, kind, ["c"], ["out"], **args)
        got, want = ws.fetch("out"), getattr(ref, kind)(**args)
        assert got.shape == () and got.item() == want, (kind, got, want)
        assert got.dtype == (np.bool_ if kind in ("CountDown", "CheckCounterDone") else np.int64)


def test_random_sequences_follow_the_reference():
    check_against_reference()


def test_the_reference_check_catches_a_count_down_that_does_not_count(broken):
    broken("CountDown", lambda xp, counter: np.asarray(counter.count <= 0))
    with pytest.raises(AssertionError):
        check_against_reference()


def test_hand_computed_sequence_and_optional_reset_output():
    ws = Workspace()
    run(ws, "CreateCounter", [], ["c"], init_count=1)
    outs = []
    for _ in range(3):
        run(ws, "CountDown", ["c"], ["d"])
        outs.append(bool(ws.fetch("d")))
    assert outs == [False, True, True] and ws.get_blob("c").value.count == -2
    run(ws, "ResetCounter", ["c"], [])            # no output: the previous count is not written anywhere
    assert ws.get_blob("c").value.count == 0
    run(ws, "ResetCounter", ["c"], ["prev"], init_count=5)
    assert ws.fetch("prev").item() == 0 and ws.get_blob("c").value.count == 5


def test_counts_wrap_at_int64_like_caffe2s_atomic():
    ws = Workspace()
    ws.create_blob("c").value = Counter(2**63 - 1)
    run(ws, "CountUp", ["c"], ["prev"])
    assert ws.fetch("prev").item() == 2**63 - 1
    run(ws, "RetrieveCount", ["c"], ["now"])
    assert ws.fetch("now").item() == -2**63


def test_save_and_load_in_caffe2s_format(in_tmp_path):
    tmp_path = in_tmp_path
    ws = Workspace()
    run(ws, "CreateCounter", [], ["c"], init_count=22)
    path = str(tmp_path / "c.minidb")
    run(ws, "Save", ["c"], [], db=path, db_type="minidb", absolute_path=1)
    (key, value), = minidb.read_records(path)
    proto = BlobProto.FromString(value)
    assert key == "c" and proto.type == "std::unique_ptr<Counter<int64_t>>"
    assert list(proto.tensor.dims) == [1] and proto.tensor.data_type == DataType.INT64
    assert list(proto.tensor.int64_data) == [22]
    for _ in range(4):
        run(ws, "CountDown", ["c"], ["d"])
    run(ws, "Load", [], ["c"], db=path, db_type="minidb", absolute_path=1)
    run(ws, "RetrieveCount", ["c"], ["n"])
    assert ws.fetch("n").item() == 22


def test_a_malformed_saved_counter_is_a_file_error(in_tmp_path):
    tmp_path = in_tmp_path
    proto = BlobProto(name="c", type="std::unique_ptr<Counter<int64_t>>")
    proto.tensor.CopyFrom(TensorProto(dims=[2], data_type=DataType.INT64, int64_data=[1, 2]))
    path = str(tmp_path / "bad.minidb")
    minidb.write_records(path, [("c", proto.SerializeToString())])
    with pytest.raises(FileFormatError, match="one int64 in a tensor of dims .1."):
        run(Workspace(), "Load", [], ["c"], db=path, db_type="minidb", absolute_path=1)


def test_bad_inputs():
    ws = Workspace()
    with pytest.raises(ArgumentError, match="init_count must be >= 0, got -1"):
        run(ws, "CreateCounter", [], ["c"], init_count=-1)
    ws.feed("t", np.zeros(1, np.int64))
    with pytest.raises(DTypeError, match="input 0 must be a counter made by CreateCounter, got ndarray"):
        run(ws, "CountDown", ["t"], ["d"])
    net = NetDef(name="n")
    net.op.extend([make_op("RetrieveCount", ["t"], ["n"])])
    with pytest.raises(DTypeError, match="must be a counter made by CreateCounter, got a tensor"):
        infer_net(net, {"t": TensorSpec((1,), np.dtype(np.int64))})


def test_gradient_kinds():
    with pytest.raises(GradientError, match="not differentiable"):
        gradient_of_op(make_op("CountDown", ["c"], ["d"]), ["d_grad"])
    with pytest.raises(GradientError):
        gradient_of_op(make_op("CheckCounterDone", ["c"], ["d"]), ["d_grad"])


# --------------------------------------------------------------------------------------------- atomic ops
def test_atomic_fetch_add_in_place_and_wrapping():
    ws = Workspace()
    run(ws, "CreateMutex", [], ["m"])
    ws.feed("v", np.array(5, np.int32))
    ws.feed("inc", np.array([-2], np.int32))
    run(ws, "AtomicFetchAdd", ["m", "v", "inc"], ["v", "fetched"])
    assert ws.fetch("v").item() == 3 and ws.fetch("fetched").item() == 5
    assert ws.fetch("v").shape == () and ws.fetch("v").dtype == np.int32
    ws.feed("big", np.array(2**31 - 1, np.int32))
    ws.feed("one", np.array(1, np.int32))
    run(ws, "AtomicFetchAdd", ["m", "big", "one"], ["sum", "old"])
    assert ws.fetch("sum").item() == -2**31 and ws.fetch("old").item() == 2**31 - 1
    assert not ws.get_blob("m").value.locked()


def test_atomic_fetch_add_bad_inputs():
    ws = Workspace()
    run(ws, "CreateMutex", [], ["m"])
    ws.feed("v", np.array(5, np.int64))
    with pytest.raises(DTypeError, match="input 1 must be an int32 tensor, got int64"):
        run(ws, "AtomicFetchAdd", ["m", "v", "v"], ["a", "b"])
    with pytest.raises(DTypeError, match="input 0 must be a mutex made by CreateMutex"):
        run(ws, "AtomicFetchAdd", ["v", "v", "v"], ["a", "b"])
    assert not ws.get_blob("m").value.locked()


def test_atomic_bool():
    ws = Workspace()
    run(ws, "CreateAtomicBool", [], ["b"])
    run(ws, "CheckAtomicBool", ["b"], ["v"])
    assert ws.fetch("v").tolist() == [False]
    for flag, want in ((False, False), (True, True), (False, True)):
        ws.feed("cond", np.array([flag]))
        run(ws, "ConditionalSetAtomicBool", ["b", "cond"], [])
        run(ws, "CheckAtomicBool", ["b"], ["v"])
        assert ws.fetch("v").tolist() == [want]
    ws.feed("cond", np.array([1.0]))
    with pytest.raises(DTypeError, match="input 1 must be a non-empty bool tensor"):
        run(ws, "ConditionalSetAtomicBool", ["b", "cond"], [])
