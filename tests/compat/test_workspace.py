"""compat.workspace: the process-wide workspaces (switching, resetting), feeding and fetching, creating and running
nets given as core.Net, NetDef or name, plans, and Caffe2's RuntimeError for what goes wrong."""
import numpy as np
import pytest

from stepnet import Workspace, caffe2_pb2
from stepnet.core.backend import DeviceArray
from stepnet.compat import core, workspace
from stepnet.core.errors import MissingBlobError, NetError, StepnetError


def fill_net(name="fill", value=2.0):
    net = core.Net(name)
    net.ConstantFill([], "x", shape=[2], value=value)
    return net


# --------------------------------------------------------------------------------------------- workspaces
def test_workspaces_switch_create_and_stay_apart():
    assert workspace.CurrentWorkspace() == "default" and workspace.Workspaces() == ["default"]
    workspace.FeedBlob("a", np.ones(1))
    with pytest.raises(RuntimeError, match="Workspace other does not exist"):
        workspace.SwitchWorkspace("other")
    workspace.SwitchWorkspace("other", True)
    assert workspace.CurrentWorkspace() == "other" and workspace.Blobs() == []
    workspace.FeedBlob("b", np.ones(1))
    assert workspace.Workspaces() == ["default", "other"]
    workspace.SwitchWorkspace("default")
    assert workspace.Blobs() == ["a"] and not workspace.HasBlob("b")
    with workspace.WorkspaceGuard("third"):
        assert workspace.CurrentWorkspace() == "third"
    assert workspace.CurrentWorkspace() == "default" and "third" in workspace.Workspaces()


def test_default_exists_from_the_start_of_a_process():
    """Caffe2's "default" workspace exists before anything uses it: a fresh process may switch away first and
    back without create_if_missing."""
    import subprocess
    import sys
    code = ("from stepnet.compat import workspace\n"
            "workspace.SwitchWorkspace('other', True)\n"
            "workspace.SwitchWorkspace('default')\n"
            "print(workspace.CurrentWorkspace(), workspace.Workspaces())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "default ['default', 'other']"


def test_reset_empties_only_the_current_workspace():
    workspace.FeedBlob("a", np.ones(1))
    workspace.CreateNet(fill_net())
    workspace.SwitchWorkspace("other", True)
    workspace.FeedBlob("b", np.ones(1))
    workspace.SwitchWorkspace("default")
    assert workspace.ResetWorkspace() is True
    assert workspace.Blobs() == []
    with pytest.raises(RuntimeError, match="no net named 'fill'"):
        workspace.RunNet("fill")
    workspace.SwitchWorkspace("other")
    assert workspace.Blobs() == ["b"]


def test_reset_with_a_root_folder_is_where_dbs_are_read_and_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    workspace.ResetWorkspace("models")
    assert (tmp_path / "models").is_dir() and workspace.RootFolder() == "models"
    workspace.FeedBlob("w", np.arange(3, dtype=np.float32))
    workspace.RunOperatorOnce(core.CreateOperator("Save", ["w"], [], db="w.minidb", db_type="minidb"))
    assert (tmp_path / "models" / "w.minidb").is_file()
    workspace.ResetWorkspace()                     # keeps the root folder
    workspace.RunOperatorOnce(core.CreateOperator("Load", [], ["w"], db="w.minidb", db_type="minidb"))
    assert workspace.FetchBlob("w").tolist() == [0, 1, 2]


# --------------------------------------------------------------------------------------------- blobs
def test_feed_and_fetch_keep_values_and_types():
    values = {"f": np.arange(6, dtype=np.float32).reshape(2, 3), "d": np.array([1.5]), "i": np.array([3], np.int32),
              "ref": np.ones(2)}
    for name, v in values.items():
        assert workspace.FeedBlob(core.BlobReference(name) if name == "ref" else name, v) is True
    for name, v in values.items():
        got = workspace.FetchBlob(name)
        np.testing.assert_array_equal(got, v)
        assert got.dtype == v.dtype
    values["f"][0, 0] = 99                                   # a copy was fed ...
    assert workspace.FetchBlob("f")[0, 0] == 0
    workspace.FetchBlob("f")[0, 0] = 99                     # ... and a copy is fetched
    assert workspace.FetchBlob("f")[0, 0] == 0
    workspace.FeedBlob("s", "some text")
    assert workspace.FetchBlob("s") == b"some text"                # Caffe2 keeps a str as its UTF-8 bytes
    workspace.FeedBlob("strings", np.array(["a", "bc"]))
    assert workspace.FetchBlob("strings").tolist() == ["a", "bc"]
    tensor = caffe2_pb2.TensorProto(dims=[2], data_type=caffe2_pb2.TensorProto.INT64, int64_data=[4, 5])
    workspace.FeedBlob("t", tensor)
    assert workspace.FetchBlob("t").tolist() == [4, 5] and workspace.FetchBlob("t").dtype == np.int64
    assert workspace.FetchBlobs(["i", "t"])[1].tolist() == [4, 5]
    assert workspace.CreateBlob("empty") is True and workspace.HasBlob("empty")


def test_a_missing_blob_is_a_runtime_error_that_names_it():
    with pytest.raises(RuntimeError, match="blob 'nope' does not exist") as info:
        workspace.FetchBlob("nope")
    assert isinstance(info.value, MissingBlobError) and isinstance(info.value, StepnetError)


def test_feed_uses_the_device_scope(monkeypatch):
    monkeypatch.setitem(workspace._workspaces, "default", Workspace(gpu="emulate", strict=True))
    workspace.ResetWorkspace()      # keeps the workspace's settings
    assert workspace._ws().gpu == "emulate" and workspace._ws().strict
    with core.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, 0)):
        workspace.FeedBlob("x", np.ones(2, np.float32))
    workspace.FeedBlob("y", np.ones(2, np.float32))
    assert isinstance(workspace._ws().get_blob("x").value, DeviceArray)
    assert not isinstance(workspace._ws().get_blob("y").value, DeviceArray)
    assert type(workspace.FetchBlob("x")) is np.ndarray


def test_the_blobs_dict():
    workspace.blobs["x"] = np.array([1.0])
    assert "x" in workspace.blobs and len(workspace.blobs) == 1 and list(workspace.blobs) == ["x"]
    assert workspace.blobs["x"].tolist() == [1.0]


# --------------------------------------------------------------------------------------------- nets
@pytest.mark.parametrize("how", ["net", "netdef", "name"])
def test_create_net_then_run_it(how):
    net = fill_net()
    workspace.CreateNet(net if how != "netdef" else net.Proto())
    ref = {"net": net, "netdef": net.Proto(), "name": "fill"}[how]
    assert workspace.RunNet(ref) is True
    assert workspace.FetchBlob("x").tolist() == [2.0, 2.0]


def test_create_net_takes_a_copy_and_refuses_a_second_one_of_the_name():
    net = fill_net()
    workspace.CreateNet(net)
    net.Scale("x", "x", scale=10.0)                 # added after CreateNet: not in the created net
    workspace.RunNet(net.Name())
    assert workspace.FetchBlob("x").tolist() == [2.0, 2.0]
    with pytest.raises(RuntimeError, match="a net named 'fill' already exists"):
        workspace.CreateNet(net)
    workspace.CreateNet(net, overwrite=True)
    workspace.RunNet(net, 1)
    assert workspace.FetchBlob("x").tolist() == [20.0, 20.0]


def test_create_net_makes_input_blobs_and_runs_several_iterations():
    net = core.Net("count")
    net.Iter("it", "it")
    with pytest.raises(RuntimeError, match="input blob 'it' does not exist"):
        workspace.CreateNet(net)
    workspace.FeedBlob("it", np.array([0], np.int64))
    workspace.CreateNet(net, input_blobs=["unused"])
    assert workspace.HasBlob("unused")
    workspace.RunNet("count", num_iter=5)
    assert workspace.FetchBlob("it").tolist() == [5]


def test_run_net_errors_and_allow_fail():
    with pytest.raises(RuntimeError, match="no net named 'ghost'") as info:
        workspace.RunNet("ghost")
    assert isinstance(info.value, NetError)
    net = core.Net("bad")
    net.Reshape(["x"], ["y", "old_shape"], shape=[5])
    workspace.FeedBlob("x", np.ones(4, np.float32))
    workspace.CreateNet(net)
    assert workspace.RunNet("bad", allow_fail=True) is False
    with pytest.raises(RuntimeError, match="Reshape"):
        workspace.RunNet("bad")


def test_run_net_once_and_operators_once_keep_no_net():
    assert workspace.RunNetOnce(fill_net()) is True
    assert workspace.FetchBlob("x").tolist() == [2.0, 2.0] and workspace._ws().nets() == []
    ops = [core.CreateOperator("ConstantFill", [], ["y"], shape=[1], value=3.0),
           core.CreateOperator("Scale", ["y"], ["y"], scale=2.0)]
    assert workspace.RunOperatorsOnce(ops) is True
    assert workspace.FetchBlob("y").tolist() == [6.0]
    with pytest.raises(TypeError, match="OperatorDef"):
        workspace.RunOperatorOnce(fill_net())


def test_run_plan_from_a_plan_a_step_or_a_plandef():
    init = fill_net("init", 1.0)
    step_net = core.Net("double")
    step_net.Scale("x", "x", scale=2.0)
    plan = core.Plan("plan")
    plan.AddStep(core.execution_step("init", init))
    plan.AddStep(core.execution_step("train", step_net, num_iter=3))
    assert workspace.RunPlan(plan) is True
    assert workspace.FetchBlob("x").tolist() == [8.0, 8.0]
    workspace.RunPlan(plan.Proto())
    assert workspace.FetchBlob("x").tolist() == [8.0, 8.0]
    workspace.RunPlan(core.execution_step("more", step_net, num_iter=2))
    assert workspace.FetchBlob("x").tolist() == [32.0, 32.0]


def test_benchmark_net_times_the_runs(capsys):
    workspace.CreateNet(fill_net())
    result = workspace.BenchmarkNet("fill", 1, 3, True)
    assert len(result) == 1 and result[0] > 0
    out = capsys.readouterr().out
    assert "Main runs: 3" in out and "Milliseconds per iter" in out and "not available" in out


def test_infer_shapes_and_types():
    net = core.Net("infer")
    net.FC(["x", "w", "b"], "y")
    workspace.FeedBlob("x", np.ones((4, 3), np.float32))
    workspace.FeedBlob("w", np.ones((5, 3), np.float32))
    workspace.FeedBlob("b", np.ones(5, np.float32))
    shapes, types = workspace.InferShapesAndTypes([net])
    assert shapes["y"] == [4, 5] and types["y"] == caffe2_pb2.TensorProto.FLOAT
    shapes, _ = workspace.InferShapesAndTypes([net], {"x": [2, 3], "w": [7, 3], "b": [7]})
    assert shapes["y"] == [2, 7]


def test_the_rest_of_the_module():
    workspace.GlobalInit(["caffe2", "--caffe2_log_level=0"])
    assert "FC" in workspace.RegisteredOperators() and "CreateBlobsQueue" in workspace.RegisteredOperators()
    assert workspace.IsImmediate() is False and workspace.NumCudaDevices() >= 0
    assert isinstance(workspace.has_gpu_support, bool)
    with core.NameScope("scope"):
        assert workspace.GetNameScope() == "scope/"
    net = fill_net()
    assert workspace.StringifyProto(net) == net.Proto().SerializeToString()
    assert workspace.GetNetName(core.Net("named")) == "named" and workspace.StringifyBlobName(b"x") == "x"
    with pytest.raises(TypeError):
        workspace.FeedBlob(3, np.ones(1))


def test_stepnet_seed_makes_a_programs_random_fills_repeat(monkeypatch):
    """STEPNET_SEED seeds every workspace compat makes: a reset workspace draws the same fills again; unset,
    two draws differ."""
    def draw():
        workspace.ResetWorkspace()
        workspace.RunOperatorOnce(core.CreateOperator("GaussianFill", [], ["g"], shape=[16]))
        return workspace.FetchBlob("g")

    monkeypatch.setenv("STEPNET_SEED", "3")
    first = draw()
    np.testing.assert_array_equal(draw(), first)
    monkeypatch.delenv("STEPNET_SEED")
    assert not np.array_equal(draw(), draw())
