"""The MPI ops in one process (a common world of size 1: every collective is the identity) against the same
numpy references the multi-process jobs use (tests/mpi), their records, and their bad input. Several ranks:
tests/mpi/test_jobs.py."""
import numpy as np
import pytest
from collective_checks import check_mpi_ops, check_send_receive, check_strings, run, workspace

from stepnet import NetDef, Workspace
from stepnet.distributed import world
from stepnet.distributed.collectives import CommonWorld
from stepnet.core.errors import ArgumentError, ArityError, CollectiveError, GradientError
from stepnet.passes.gradients import add_gradient_ops
from stepnet.ops import REGISTRY
from stepnet.ops.registry import SHOULD_NOT_DO_GRADIENT
from stepnet.passes.shapes import infer_net
from stepnet.testing import DEVICES, make_op

MPI_OPS = ("MPICreateCommonWorld", "MPIBroadcast", "MPIReduce", "MPIAllgather", "MPIAllreduce", "MPISendTensor",
           "MPIReceiveTensor")


@pytest.mark.parametrize("device", DEVICES)
def test_collectives_match_numpy_references_alone(device):
    assert check_mpi_ops(0, 1, device) == 35


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("generic", [False, True], ids=["MPI names", "generic names"])
def test_send_then_receive_alone(device, generic):
    check_send_receive(0, 1, device, generic)


def test_string_tensors_are_broadcast_and_gathered():
    check_strings(0, 1)


def test_common_world_is_the_process_alone():
    ws = workspace()
    comm = ws.get_blob("comm").value
    assert isinstance(comm, CommonWorld) and (comm.rank, comm.size) == (0, 1)
    assert ws.fetch("comm") == "<blob 'comm': a CommonWorld, not a tensor>"


def test_outputs_are_fresh_arrays():
    """Alone, a collective returns its input: written to another blob it must be a copy, not the same array."""
    ws = workspace()
    ws.feed("x", np.ones(3, np.float32))
    for op_type in ("MPIAllreduce", "MPIReduce", "MPIAllgather"):
        ws.run_operator_once(make_op(op_type, ["comm", "x"], ["y"]))
        assert ws.get_blob("y").value is not ws.get_blob("x").value, op_type


def test_records_follow_caffe2():
    """mpi_ops.cc: Broadcast in place by force, Allreduce in place allowed, Reduce/Allgather/Send/Receive never;
    no gradients."""
    r = REGISTRY.get
    assert r("MPIBroadcast").enforce_inplace == {(1, 0)}
    assert r("MPIAllreduce").allow_inplace == {(1, 0)}
    for op_type in ("MPIReduce", "MPIAllgather", "MPISendTensor", "MPIReceiveTensor"):
        assert r(op_type).allow_inplace == frozenset() and not r(op_type).enforce_inplace, op_type
    assert (r("MPIReceiveTensor").inputs, r("MPIReceiveTensor").outputs) == ((2, 4), (3, 3))
    assert {a: r("MPISendTensor").args[a].default for a in ("dst", "tag", "raw_buffer")} == {
        "dst": -1, "tag": -1, "raw_buffer": False}
    assert all(r(t).gradient == SHOULD_NOT_DO_GRADIENT for t in MPI_OPS)


@pytest.mark.parametrize("op_type, outputs, message", [
    ("MPIBroadcast", ["y"], r"must write input 1 \('x'\) in place"),
    ("MPIReduce", ["x"], "cannot write output 0 in place"),
    ("MPIAllgather", ["x"], "cannot write output 0 in place"),
])
def test_in_place_rules(op_type, outputs, message):
    ws = workspace()
    ws.feed("x", np.ones(2, np.float32))
    with pytest.raises(ArgumentError, match=message):
        ws.run_operator_once(make_op(op_type, ["comm", "x"], outputs))


@pytest.mark.parametrize("comm, what", [(np.zeros(3, np.float32), r"got a \(3,\) float32 tensor"),
                                        (None, "got nothing")])
def test_a_collective_outside_a_common_world(comm, what):
    ws = Workspace()
    ws.feed("x", np.ones(2, np.float32))
    ws.create_blob("comm")
    if comm is not None:
        ws.feed("comm", comm)
    with pytest.raises(CollectiveError, match=f"MPIAllreduce.*input 0 \\('comm'\\) must be a common world.*{what}"):
        ws.run_operator_once(make_op("MPIAllreduce", ["comm", "x"], ["x"]))


def test_bad_collectives():
    ws = workspace()
    with pytest.raises(CollectiveError, match="root 1 is not a rank of the common world"):
        run(ws, "MPIBroadcast", {"x": np.ones(2)}, ["x"], root=1)
    with pytest.raises(CollectiveError, match="'x' is a scalar"):
        run(ws, "MPIAllgather", {"x": np.float32(1)}, ["y"])
    with pytest.raises(CollectiveError, match="cannot be summed"):
        run(ws, "MPIAllreduce", {"s": np.array(["a"], dtype=object)}, ["s"])


def test_bad_send_and_receive():
    ws = workspace()
    x = np.ones((2, 2), np.float32)
    with pytest.raises(ArgumentError, match="raw_buffer=0 is not supported"):
        run(ws, "MPISendTensor", {"x": x}, [], dst=0, tag=1)
    with pytest.raises(ArgumentError, match="needs the destination rank and the tag"):
        run(ws, "MPISendTensor", {"x": x}, [], tag=1, raw_buffer=1)
    with pytest.raises(CollectiveError, match="destination rank 2 is not in the common world"):
        run(ws, "MPISendTensor", {"x": x}, [], dst=2, tag=1, raw_buffer=1)
    with pytest.raises(ArityError, match="takes 2 or 4 inputs"):
        run(ws, "MPISendTensor", {"x": x, "d": np.array([0], np.int32)}, [], raw_buffer=1)
    with pytest.raises(CollectiveError, match="nothing was sent to this process from any rank with tag 5.*wait "
                                              "forever"):
        run(ws, "MPIReceiveTensor", {"like": x}, ["y", "s", "t"], tag=5, raw_buffer=1)
    run(ws, "MPISendTensor", {"x": x}, [], dst=0, tag=1, raw_buffer=1)
    with pytest.raises(CollectiveError, match=r"rank 0 sent 16 bytes \(tag 1\) but blob 'like' receives \(3,\) "
                                              r"float32 = 12 bytes"):
        run(ws, "MPIReceiveTensor", {"like": np.zeros(3, np.float32)}, ["y", "s", "t"], raw_buffer=1)


def test_shapes_are_inferred_through_the_collectives():
    net = NetDef(name="n")
    net.op.extend([make_op("MPICreateCommonWorld", [], ["comm"]), make_op("MPIAllgather", ["comm", "x"], ["g"]),
                   make_op("MPIAllreduce", ["comm", "g"], ["g"]), make_op("MPIReceiveTensor", ["comm", "g"],
                                                                          ["y", "s", "t"], raw_buffer=1)])
    from stepnet.core.spec import spec
    specs = infer_net(net, {"x": spec((2, 3))})
    assert [str(specs[n]) for n in ("g", "y", "s")] == ["(2, 3) float32", "(2, 3) float32", "() int32"]


def test_no_gradient_through_a_collective():
    net = NetDef(name="n")
    net.op.extend([make_op("MPIAllreduce", ["comm", "x"], ["y"]), make_op("AveragedLoss", ["y"], ["loss"])])
    with pytest.raises(GradientError, match="MPIAllreduce.*not differentiable"):
        add_gradient_ops(net, ["loss"])


def test_an_mpi_op_under_mpiexec_without_mpi4py_names_the_extra(monkeypatch):
    monkeypatch.setenv("PMI_SIZE", "2")
    monkeypatch.setitem(__import__("sys").modules, "mpi4py", None)
    world.process_world.cache_clear()
    try:
        with pytest.raises(CollectiveError, match=r"started by mpiexec \(PMI_SIZE='2'\) but mpi4py cannot be "
                                                  r"imported .*pip install 'mpi4py>=4' mpich \(stepnet's"):
            Workspace().run_operator_once(make_op("MPICreateCommonWorld", [], ["comm"]))
    finally:
        world.process_world.cache_clear()


@pytest.mark.parametrize("args, message", [
    ({"src": 5, "tag": 1}, r"source rank 5 is not in the common world \(size 1\); give a rank from 0 to 0, or -1"),
    ({"src": -2, "tag": 1}, r"source rank -2 is not in the common world"),
    ({"src": 0, "tag": 2**62}, r"tag 4611686018427387904 is out of range; a tag is -1 \(any tag\) or 0 to 2147483647"),
    ({"src": -1, "tag": -7}, r"tag -7 is out of range"),
])
def test_hostile_receive_arguments_are_one_line(tmp_path, capsys, args, message):
    from stepnet import save
    from stepnet.cli.run import main
    from stepnet.testing import make_op as mk

    net = NetDef(name="recv", op=[mk("MPICreateCommonWorld", [], ["comm"]),
                                  mk("ConstantFill", [], ["like"], shape=[2], value=1.0),
                                  mk("MPIReceiveTensor", ["comm", "like"], ["y", "s", "t"], raw_buffer=1, **args)])
    save(net, tmp_path / "recv.pbtxt")
    assert main(["run", str(tmp_path / "recv.pbtxt")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("stepnet: error: net 'recv', op #2 (MPIReceiveTensor): ")
    assert "failed:" not in err[0]
    import re
    assert re.search(message, err[0]), err[0]


def test_hostile_send_tag_is_one_line():
    ws = workspace()
    with pytest.raises(CollectiveError, match=r"MPISendTensor: tag 4611686018427387904 is out of range; a tag is 0 to "
                                              "2147483647"):
        run(ws, "MPISendTensor", {"x": np.ones(2, np.float32)}, [], dst=0, tag=2**62, raw_buffer=1)
