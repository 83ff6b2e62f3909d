"""What files a model may read and write: every db path a model names (Save, Checkpoint, Load, CreateDB, DBExists,
a saved DB reader) must lie under the workspace's file root once symlinks are resolved. A downloaded model could
otherwise drop a .pth file into site-packages (code run at the next Python start) or read any file."""
import os

import numpy as np
import pytest

from stepnet import NetDef, PlanDef, Workspace
from stepnet.io import minidb
from stepnet.cli.run import main
from stepnet.core.errors import ArgumentError, FileAccessError
from stepnet.core.limits import Limits
from stepnet.io.proto import BlobProto, DBReaderProto
from stepnet.testing import make_op


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    """(work, outside): the working directory (the default root) and a sibling directory outside it."""
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    monkeypatch.chdir(work)
    return work, outside


def net(*ops, name="model"):
    nd = NetDef(name=name)
    nd.op.extend(ops)
    return nd


def fed(limits=None):
    ws = Workspace(limits=limits)
    ws.feed("x", np.array([1.0, 2.0], np.float32))
    ws.feed("iter", np.array([3], np.int64))
    return ws


def save(db, **args):
    return make_op("Save", ["x"], [], db=db, db_type="minidb", **args)


def refused(ws, nd, path, root, op="op #0 (Save)"):
    with pytest.raises(FileAccessError) as info:
        ws.run_net_once(nd)
    message = str(info.value)
    assert message.startswith(f"net 'model', {op}: db path ")
    for part in (repr(path), f"outside the file root {os.path.realpath(root)}:", "--file-root DIR",
                 "--allow-any-path", "Limits(file_root=..., any_path=True)"):
        assert part in message, (part, message)
    return message


# ----------------------------------------------------------------------------------------- writes
WRITES = {
    "relative ../": lambda work, out: (save("../outside/evil.pth"), "./../outside/evil.pth"),
    "absolute_path=1": lambda work, out: (save(str(out / "evil.pth"), absolute_path=1), str(out / "evil.pth")),
    "through a directory symlink": lambda work, out: (save("link/evil.pth"), "./link/evil.pth"),
    "through a dangling file symlink": lambda work, out: (save("dangling.pth"), "./dangling.pth"),
    "Checkpoint pattern": lambda work, out: (
        make_op("Checkpoint", ["iter", "x"], [], db="../outside/ckpt_%d.pth", db_type="minidb"),
        "./../outside/ckpt_3.pth"),
}


@pytest.mark.parametrize("case", sorted(WRITES))
def test_writes_outside_the_root_are_refused_and_nothing_is_written(dirs, case):
    work, outside = dirs
    (work / "link").symlink_to(outside)
    (work / "dangling.pth").symlink_to(outside / "new.pth")
    opdef, path = WRITES[case](work, outside)
    message = refused(fed(), net(opdef), path, work, f"op #0 ({opdef.type})")
    if "symlink" in case:
        assert "(resolving to " in message and str(outside) in message
    assert os.listdir(outside) == []


def test_reads_outside_the_root_are_refused(dirs):
    work, outside = dirs
    minidb.save_blobs(outside / "secret.minidb", {"x": np.ones(2, np.float32)})
    minidb.save_blobs(work / "inside.minidb", {"y": np.ones(2, np.float32)})
    (work / "link.minidb").symlink_to(outside / "secret.minidb")
    secret = str(outside / "secret.minidb")
    cases = [
        (make_op("Load", [], ["x"], db="../outside/secret.minidb", db_type="minidb"), "./../outside/secret.minidb"),
        (make_op("Load", [], ["x"], db=secret, db_type="minidb", absolute_path=1), secret),
        (make_op("Load", [], ["x"], db="link.minidb", db_type="minidb"), "./link.minidb"),
        (make_op("Load", [], ["x", "y"], dbs=["inside.minidb", "../outside/secret.minidb"], db_type="minidb"),
         "./../outside/secret.minidb"),
        (make_op("DBExists", [], ["there"], db_name=secret, db_type="minidb", absolute_path=1), secret),
        (make_op("CreateDB", [], ["reader"], db=secret, db_type="minidb"), secret),
        (make_op("CreateDB", [], ["reader"], db="link.minidb", db_type="minidb"), "link.minidb"),
    ]
    for opdef, path in cases:
        ws = Workspace()
        refused(ws, net(opdef), path, work, f"op #0 ({opdef.type})")
        assert all(ws.find(n) is None or ws.find(n).value is None for n in ("x", "y", "there", "reader"))


def test_a_saved_db_reader_pointing_outside_is_refused_when_loaded(dirs):
    work, outside = dirs
    minidb.save_dataset(outside / "data.minidb", [(np.zeros(2, np.float32),)])
    source = str(outside / "data.minidb")
    proto = BlobProto(name="reader", type="DBReader",
                      content=DBReaderProto(name="reader", source=source, db_type="minidb").SerializeToString())
    minidb.write_records(work / "model.minidb", [("reader", proto.SerializeToString())])
    ws = Workspace()
    refused(ws, net(make_op("Load", [], ["reader"], db="model.minidb", db_type="minidb")), source, work,
            "op #0 (Load)")
    loaded = minidb.load_blobs(work / "model.minidb")["reader"]   # read without a workspace: not opened
    with pytest.raises(FileAccessError, match="TensorProtosDBInput.*outside the file root"):
        ws.create_blob("r").value = loaded
        ws.run_net_once(net(make_op("TensorProtosDBInput", ["r"], ["y"])))


def test_paths_inside_the_root_work_as_caffe2_resolves_them(dirs):
    work, outside = dirs
    (work / "sub").mkdir()
    (work / "inner").symlink_to(work / "sub")
    ws = fed()
    for db, args in (("a.minidb", {}), ("sub/../b.minidb", {}), ("inner/c.minidb", {}),
                     (str(work / "d.minidb"), {"absolute_path": 1})):
        ws.run_net_once(net(save(db, **args)))
    assert sorted(os.listdir(work)) == ["a.minidb", "b.minidb", "d.minidb", "inner", "sub"]
    assert os.listdir(work / "sub") == ["c.minidb"]
    ws.run_net_once(net(make_op("Load", [], ["y"], db="inner/c.minidb", db_type="minidb", source_blob_names=["x"]),
                        make_op("DBExists", [], ["there"], db_name="a.minidb", db_type="minidb"),
                        make_op("CreateDB", [], ["r"], db="a.minidb", db_type="minidb")))
    assert ws.fetch("y").tolist() == [1.0, 2.0] and bool(ws.fetch("there"))


def test_another_root_or_any_path(dirs):
    work, outside = dirs
    ws = fed(Limits(file_root=outside))
    ws.run_net_once(net(save(str(outside / "ok.minidb"), absolute_path=1), save("../outside/rel.minidb")))
    assert sorted(os.listdir(outside)) == ["ok.minidb", "rel.minidb"]
    refused(ws, net(save("here.minidb")), "./here.minidb", outside)  # relative paths still start at the cwd
    free = fed(Limits(any_path=True))
    free.run_net_once(net(save("../outside/free.minidb"), save(str(outside / "abs.minidb"), absolute_path=1)))
    assert sorted(os.listdir(outside)) == ["abs.minidb", "free.minidb", "ok.minidb", "rel.minidb"]
    with pytest.raises(ArgumentError, match="file root .*nowhere' is not a directory"):
        Workspace(limits=Limits(file_root=work / "nowhere"))


def test_the_root_is_fixed_when_the_workspace_is_made_and_children_inherit_it(dirs, monkeypatch):
    work, outside = dirs
    ws = fed()
    assert ws.limits.file_root == os.path.realpath(work)
    child = Workspace(parent=ws)
    assert child.limits is ws.limits
    monkeypatch.chdir(outside)  # relative paths follow the cwd, the root does not
    refused(child, net(save("moved.minidb")), "./moved.minidb", work)
    monkeypatch.chdir(work)
    plan = PlanDef(name="plan")  # a step's own workspace (create_workspace) has its parent's limits
    plan.network.add().CopyFrom(net(save("../work/inside.minidb"), save("../outside/escape.minidb"), name="saver"))
    plan.execution_step.add(name="step", network=["saver"], create_workspace=True)
    with pytest.raises(FileAccessError, match="net 'saver', op #1 \\(Save\\): db path './../outside/escape"):
        ws.run_plan(plan)
    assert os.listdir(outside) == [] and (work / "inside.minidb").is_file()


# ----------------------------------------------------------------------------------------- command line
def test_cli_flags(dirs, capsys):
    work, outside = dirs
    plan = PlanDef(name="plan")
    nd = plan.network.add()
    nd.CopyFrom(net(make_op("ConstantFill", [], ["x"], shape=[2], value=1.0), save("../outside/out.minidb"),
                    name="model"))
    plan.execution_step.add(name="step", network=["model"])
    from stepnet import save as save_file
    save_file(plan, work / "plan.pbtxt")
    assert main(["run", "plan.pbtxt", "-q"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("stepnet: error: net 'model', op #1 (Save): db path './../outside/out.minidb'")
    assert "--file-root DIR" in err and "--allow-any-path" in err and len(err.splitlines()) == 1
    assert os.listdir(outside) == []
    for root in (str(outside), "../outside", ".."):
        assert main(["run", "plan.pbtxt", "-q", "--file-root", root]) == 0
        assert os.listdir(outside) == ["out.minidb"]
        os.unlink(outside / "out.minidb")
    assert main(["run", "plan.pbtxt", "-q", "--file-root", "nowhere"]) == 1
    assert "file root 'nowhere' is not a directory" in capsys.readouterr().err
    assert main(["run", "plan.pbtxt", "-q", "--allow-any-path"]) == 0
    assert os.listdir(outside) == ["out.minidb"]
    capsys.readouterr()
    # the user's own paths (--checkpoint, --save, --load, --feed) are not confined
    assert main(["run", "plan.pbtxt", "-q", "--allow-any-path", "--overwrite", "--checkpoint",
                 str(outside / "ck.minidb"), "--fetch", "x", "--save", str(outside / "x.npz")]) == 0
    assert main(["run", "plan.pbtxt", "-q", "--allow-any-path", "--overwrite", "--load",
                 str(outside / "ck.minidb")]) == 0
    assert sorted(os.listdir(outside)) == ["ck.minidb", "out.minidb", "x.npz"]
