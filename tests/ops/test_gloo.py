"""The Gloo-named communication ops in one process (common world of size 1) against the numpy references of
tests/mpi, their records, a net as Caffe2's data_parallel_model writes it for Gloo, and their bad input."""
import numpy as np
import pytest
from collective_checks import check_gloo_ops, run, workspace

from stepnet import Workspace, load
from stepnet.distributed.collectives import CommonWorld
from stepnet.core.errors import ArgumentError, ArityError, CollectiveError, DTypeError, ShapeError
from stepnet.ops import REGISTRY
from stepnet.ops.registry import SHOULD_NOT_DO_GRADIENT
from stepnet.testing import DEVICES, make_op

GLOO_OPS = ("CreateCommonWorld", "CloneCommonWorld", "DestroyCommonWorld", "Broadcast", "Allreduce", "Allgather",
            "Barrier", "ReduceScatter")
MPI_ENGINE_OPS = ("Reduce", "SendTensor", "ReceiveTensor")     # generic types Caffe2 registers under MPI only

# What data_parallel_model writes for rendezvous={'engine': 'GLOO', 'num_shards': 1, 'shard_id': 0, ...}.
DPM_NET = """
name: "dpm"
op { output: "allreduce_0_cw" name: "allreduce_0_cw_op" type: "CreateCommonWorld" engine: "GLOO"
     arg { name: "size" i: 1 } arg { name: "rank" i: 0 } arg { name: "status_blob" s: "create_allreduce_cw_0_status" }
     arg { name: "timeout_ms" i: 30000 } arg { name: "transport" s: "tcp" } }
op { input: "allreduce_0_cw" output: "broadcast_0_cw" name: "broadcast_0_cw_op" type: "CloneCommonWorld"
     engine: "GLOO" arg { name: "status_blob" s: "clone_broadcast_cw_0_status" } }
op { input: "broadcast_0_cw" input: "gpu_0/fc_w" output: "gpu_0/fc_w" name: "gpu_0/fc_w" type: "Broadcast"
     engine: "GLOO" arg { name: "root" i: 0 } arg { name: "status_blob" s: "broadcast_gpu_0/fc_w_status" } }
op { input: "allreduce_0_cw" input: "gpu_0/fc_w_grad" output: "gpu_0/fc_w_grad" name: "gpu_0/fc_w_grad"
     type: "Allreduce" engine: "GLOO" control_input: "gpu_0/fc_w"
     arg { name: "status_blob" s: "allreduce_gpu_0/fc_w_grad_status" } arg { name: "gpu_direct" i: 0 } }
op { input: "allreduce_0_cw" type: "Barrier" engine: "GLOO" }
op { input: "allreduce_0_cw" output: "allreduce_0_cw" type: "DestroyCommonWorld" engine: "GLOO" }
"""


@pytest.mark.parametrize("device", DEVICES)
def test_collectives_match_numpy_references_alone(device):
    assert check_gloo_ops(0, 1, device) == 3


def test_a_data_parallel_model_net_runs(tmp_path):
    path = tmp_path / "dpm.pbtxt"
    path.write_text(DPM_NET)
    ws = Workspace(strict=True)   # every argument data_parallel_model writes is declared
    w, g = np.arange(6, dtype=np.float32).reshape(2, 3), np.full((2, 3), 0.5, np.float32)
    ws.feed("gpu_0/fc_w", w)
    ws.feed("gpu_0/fc_w_grad", g)
    ws.run_net_once(load(path))
    assert np.array_equal(ws.fetch("gpu_0/fc_w"), w) and np.array_equal(ws.fetch("gpu_0/fc_w_grad"), g)
    assert isinstance(ws.get_blob("broadcast_0_cw").value, CommonWorld)


def test_records_follow_caffe2():
    """communicator_op.cc: in place by force for Broadcast and Allreduce (output i is input i + 1), inputs may
    cross devices, no gradients."""
    r = REGISTRY.get
    for op_type in ("Broadcast", "Allreduce", "ReduceScatter"):   # (ReduceScatter's counts too: outputs = inputs - 1)
        assert {(1, 0), (2, 1), (9, 8)} <= r(op_type).enforce_inplace
    assert r("DestroyCommonWorld").enforce_inplace == {(0, 0)}
    assert (r("CreateCommonWorld").inputs, r("Barrier").outputs, r("Allgather").outputs) == ((0, 1), (0, 0), (1, 1))
    assert all(r(t).gradient == SHOULD_NOT_DO_GRADIENT for t in GLOO_OPS + MPI_ENGINE_OPS)
    assert all(r(t).devices == "any" for t in GLOO_OPS + ("Reduce",))
    # Reduce: 2 in, 1 out; SendTensor: 2 or 4 in, none out; ReceiveTensor: Y in place by force, src and tag may be
    assert (r("Reduce").inputs, r("Reduce").outputs, r("SendTensor").outputs) == ((2, 2), (1, 1), (0, 0))
    assert r("ReceiveTensor").enforce_inplace == {(1, 0)} and r("ReceiveTensor").allow_inplace == {(2, 1), (3, 2)}


def test_create_common_world_checks_its_size():
    ws = Workspace()
    ws.run_operator_once(make_op("CreateCommonWorld", [], ["cw"], size=1, rank=0, engine="GLOO"))
    with pytest.raises(CollectiveError, match=r"built for a common world of size=4 but this job has 1 process\(es\); "
                                              "run it with mpiexec -n 4"):
        ws.run_operator_once(make_op("CreateCommonWorld", [], ["cw"], size=4, rank=0))
    with pytest.raises(ArgumentError, match="rank=1 is not below size=1"):
        ws.run_operator_once(make_op("CreateCommonWorld", [], ["cw"], size=1, rank=1))


def test_bad_buffers():
    ws = workspace()
    a, b = np.ones((2, 3), np.float32), np.ones(5, np.float32)
    with pytest.raises(ShapeError, match="'b' has 5 elements, 'a' 6"):
        run(ws, "Allreduce", {"a": a, "b": b}, ["a", "b"])
    with pytest.raises(DTypeError, match="'b' is float64, 'a' float32"):
        run(ws, "Broadcast", {"a": a, "b": a.astype(np.float64)}, ["a", "b"])
    with pytest.raises(ArityError, match="one output per tensor input"):
        run(ws, "Allreduce", {"a": a, "b": a}, ["a"])
    with pytest.raises(ArgumentError, match=r"must write input 1 \('a'\) in place"):
        run(ws, "Allreduce", {"a": a}, ["y"])
    with pytest.raises(CollectiveError, match="must be a common world"):
        ws.feed("t", a)
        ws.run_operator_once(make_op("Barrier", ["t"], []))


def test_reduce_scatter_bad_input():
    ws = workspace()
    a = np.ones(6, np.float32)
    counts = {"c": np.array([6], np.int32)}
    with pytest.raises(ShapeError, match=r"one integer receive count per rank \(1\), got int32 of shape \(2,\)"):
        run(ws, "ReduceScatter", {"a": a, "c": np.array([3, 3], np.int32)}, ["a", "c"])
    with pytest.raises(ShapeError, match=r"receive counts \[7\] must be non-negative and add up to at most the 6"):
        run(ws, "ReduceScatter", {"a": a, "c": np.array([7], np.int32)}, ["a", "c"])
    with pytest.raises(ShapeError, match=r"receive counts \[-1\]"):
        run(ws, "ReduceScatter", {"a": a, "c": np.array([-1], np.int32)}, ["a", "c"])
    with pytest.raises(DTypeError, match="float tensors .* got int64"):
        run(ws, "ReduceScatter", {"a": a.astype(np.int64), **counts}, ["a", "c"])
    with pytest.raises(ArityError, match="ReduceScatter takes 2 or more outputs, got 1"):
        run(ws, "ReduceScatter", {"a": a, **counts}, ["a"])
    with pytest.raises(ArityError, match="writes its 2 tensor.* and the receive counts in place: 3 outputs, got 2"):
        run(ws, "ReduceScatter", {"a": a, "b": a, **counts}, ["a", "b"])
    with pytest.raises(ShapeError, match="'b' has 5 elements, 'a' 6"):
        run(ws, "ReduceScatter", {"a": a, "b": np.ones(5, np.float32), **counts}, ["a", "b", "c"])


def test_destroy_accepts_an_empty_blob():
    ws = Workspace()
    ws.create_blob("cw")
    ws.run_operator_once(make_op("DestroyCommonWorld", ["cw"], ["cw"]))


def test_mpi_engine_ops_take_caffe2s_generic_schemas():
    """Caffe2 checks an op against the schema of its type whatever its engine: a ReceiveTensor into another blob
    than its Y input, or an Allreduce with engine MPI writing another blob, are refused as Caffe2 refuses them;
    SendTensor without raw_buffer too (Caffe2's MPI op enforces it)."""
    ws = workspace()
    ws.feed("y", np.zeros(3, np.float32))
    with pytest.raises(ArgumentError, match=r"ReceiveTensor must write input 1 \('y'\) in place, but output 0 is 'z'"):
        ws.run_operator_once(make_op("ReceiveTensor", ["comm", "y"], ["z", "src", "tag"], engine="MPI",
                                     raw_buffer=1))
    with pytest.raises(ArgumentError, match="Allreduce must write input 1 .'y'. in place, but output 0 is 'y_reduced'"):
        ws.run_operator_once(make_op("Allreduce", ["comm", "y"], ["y_reduced"], engine="MPI"))
    with pytest.raises(ArgumentError, match="SendTensor: raw_buffer=0 is not supported"):
        ws.run_operator_once(make_op("SendTensor", ["comm", "y"], [], engine="MPI", dst=0, tag=0))
    with pytest.raises(ArityError):
        ws.run_operator_once(make_op("SendTensor", ["comm", "y", "y"], [], engine="MPI", raw_buffer=1))
