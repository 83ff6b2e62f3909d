"""The process world outside mpiexec (rank 0 of 1, no MPI), the {rank}/{size} placeholders in command-line and
db paths, and what `stepnet run` leaves to rank 0. Jobs of several processes: tests/mpi/test_jobs.py."""
import argparse

import numpy as np
import pytest

from stepnet import NetDef, Workspace
from stepnet.distributed import launch, world
from stepnet.io import minidb
from stepnet.cli.run import main
from stepnet.testing import make_op


@pytest.fixture
def fresh_world():
    world.process_world.cache_clear()
    yield
    world.process_world.cache_clear()


def test_alone_the_world_is_rank_0_of_1_without_mpi(monkeypatch, fresh_world):
    for name in (*world.LAUNCH_VARIABLES, world.FORCE):
        monkeypatch.delenv(name, raising=False)
    w = world.process_world()
    assert (w.rank, w.size, w.uses_mpi) == (0, 1, False)
    assert world.expand("data/{rank}of{size}.npy") == "data/0of1.npy"
    assert world.expand("{other} {rank}") == "{other} 0" and world.expand("plain") == "plain"
    assert world.writes("out.npz") and world.writes("out_{rank}.npz")


def test_launchers_are_recognised(monkeypatch):
    for name in (*world.LAUNCH_VARIABLES, world.FORCE):
        monkeypatch.delenv(name, raising=False)
    assert world.launcher() is None
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    assert world.launcher() == "OMPI_COMM_WORLD_SIZE"
    monkeypatch.setenv(world.FORCE, "0")
    assert world.launcher() is None
    monkeypatch.setenv(world.FORCE, "1")
    assert world.launcher() == world.FORCE


def _args(**given):
    a = argparse.Namespace(feed=[], load=None, checkpoint=None, resume=None, save=None, save_image=None,
                           checkpoint_every=None, quiet=False)
    a.__dict__.update(given)
    return a


def test_rank_1_expands_its_paths_and_leaves_shared_files_to_rank_0(fresh_world):
    a = _args(feed=["x=x_{rank}.npy", "y=[1, 2]"], load="c_{rank}.minidb", checkpoint="ckpt.minidb",
              checkpoint_every=5, save="out_{rank}.npz", save_image="pic.png", resume="r_{size}.minidb")
    mine = launch._for_rank(a, 1)
    assert mine.feed == ["x=x_0.npy", "y=[1, 2]"] and mine.load == "c_0.minidb" and mine.resume == "r_1.minidb"
    assert (mine.checkpoint, mine.checkpoint_every, mine.save_image, mine.quiet) == (None, None, None, True)
    assert mine.save == "out_0.npz" and a.checkpoint == "ckpt.minidb"   # the caller's arguments are unchanged
    rank0 = launch._for_rank(a, 0)
    assert (rank0.checkpoint, rank0.checkpoint_every, rank0.quiet) == ("ckpt.minidb", 5, False)


def test_placeholders_in_command_line_paths(tmp_path, monkeypatch, capsys):
    """Not under MPI, {rank} is 0 and {size} is 1 in --feed, --load and --checkpoint paths."""
    monkeypatch.chdir(tmp_path)
    net = NetDef(name="double")
    net.op.append(make_op("Scale", ["x"], ["y"], scale=2.0))
    net.external_output.append("y")
    from stepnet import save
    save(net, "net.pbtxt")
    np.save("x_0of1.npy", np.array([1.5, 2], np.float32))
    assert main(["run", "net.pbtxt", "--feed", "x=x_{rank}of{size}.npy", "--checkpoint", "ck_{rank}.minidb"]) == 0
    assert "y: shape (2,) float32 [3., 4.]" in capsys.readouterr().out
    assert main(["run", "net.pbtxt", "--load", "ck_{rank}.minidb"]) == 0
    assert "[3., 4.]" in capsys.readouterr().out


def test_placeholders_in_db_paths(tmp_path, monkeypatch):
    """CreateDB, Save and Load expand {rank} and {size}, inside the file root."""
    monkeypatch.chdir(tmp_path)
    minidb.save_dataset(tmp_path / "shard_0of1.minidb", ([np.array([k], np.int32)] for k in range(3)))
    ws = Workspace()
    ws.run_operator_once(make_op("CreateDB", [], ["reader"], db="shard_{rank}of{size}.minidb", db_type="minidb"))
    ws.run_operator_once(make_op("TensorProtosDBInput", ["reader"], ["batch"]))
    assert ws.fetch("batch").tolist() == [0]
    ws.run_operator_once(make_op("Save", ["batch"], [], db="saved_{rank}.minidb", db_type="minidb"))
    assert (tmp_path / "saved_0.minidb").is_file()
    ws.run_operator_once(make_op("Load", [], ["batch"], db="saved_{rank}.minidb", db_type="minidb"))
    with pytest.raises(Exception, match="outside the file root"):
        ws.run_operator_once(make_op("CreateDB", [], ["r"], db="../{rank}.minidb", db_type="minidb"))
