"""Files written whole (issue #24 § 5.5): export-predict's init/predict pair is replaced together or not at all,
and the temporaries a killed write leaves are removed by a later write of the same file once they are stale."""
import errno
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stepnet import NetDef, Workspace
from stepnet.cli.run import main
from stepnet.core.errors import FileFormatError
from stepnet.export import predict
from stepnet.io import checkpoints, proto
from stepnet.testing import make_op

ROOT = Path(__file__).resolve().parents[1]
OLD = b"the old file"


def training_net(output: str = "y") -> NetDef:
    nd = NetDef(name="t")
    nd.op.extend([make_op("ConstantFill", [], ["w"], shape=[2], value=0.5),
                  make_op("Mul", ["data", "w"], [output])])
    nd.external_input.append("data")
    return nd


@pytest.fixture
def export(tmp_path):
    """The Export of a small training net with its checkpoint, and an output folder holding an old pair."""
    ws = Workspace()
    ws.feed("w", np.full(2, 0.25, np.float32))
    checkpoints.save(ws, tmp_path / "ck.minidb")
    out = tmp_path / "out"
    out.mkdir()
    (out / "init_net.pb").write_bytes(OLD)
    (out / "predict_net.pb").write_bytes(OLD)
    return predict.export(training_net(), tmp_path / "ck.minidb"), out


def files(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_the_pair_is_replaced_whole(export):
    result, out = export
    predict.write_pair(result, out)
    assert sorted(files(out)) == ["init_net.pb", "predict_net.pb"]   # no temporary left
    assert proto.load(out / "init_net.pb") == result.init and proto.load(out / "predict_net.pb") == result.predict


def test_a_failed_second_write_leaves_the_old_pair(export, monkeypatch):
    result, out = export
    calls = []

    def fsync(fd):   # the disk fills up while the second file is written
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(proto.os, "fsync", fsync)
    with pytest.raises(FileFormatError, match="No space left on device"):
        predict.write_pair(result, out)
    assert files(out) == {"init_net.pb": OLD, "predict_net.pb": OLD}


@pytest.mark.parametrize("had_a_pair", [True, False])
def test_a_failed_second_rename_puts_the_first_back(export, monkeypatch, had_a_pair):
    result, out = export
    if not had_a_pair:
        for p in out.iterdir():
            p.unlink()
    replace = os.replace

    def failing(src, dst):
        if Path(dst).name == "predict_net.pb":
            raise OSError(errno.EACCES, "Permission denied")
        replace(src, dst)

    monkeypatch.setattr(predict.os, "replace", failing)
    with pytest.raises(FileFormatError, match=r"cannot write init_net.pb and predict_net.pb \(Permission denied\)"):
        predict.write_pair(result, out)
    assert files(out) == ({"init_net.pb": OLD, "predict_net.pb": OLD} if had_a_pair else {})


def test_export_predict_escapes_the_names_it_shows(export, tmp_path, capsys):
    proto.save(training_net("y\x1b]0;pwned\x07"), tmp_path / "train.pb")
    assert main(["export-predict", str(tmp_path / "train.pb"), "--load", str(tmp_path / "ck.minidb"),
                 "-o", str(tmp_path / "e")]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "outputs: y\\x1b]0;pwned\\x07)" in out and "--feed data=..." in out


# --------------------------------------------------------------------------------------------- stale temporaries
def aged(path: Path, seconds: float = proto.STALE_SECONDS + 60) -> Path:
    when = os.lstat(path).st_mtime - seconds
    os.utime(path, (when, when), follow_symlinks=False)
    return path


def test_a_write_removes_the_stale_temporaries_of_its_file_only(tmp_path, monkeypatch):
    target = tmp_path / "ck.minidb"
    stale = tmp_path / ".ck.minidb.k3_9ab2z.tmp"
    stale.write_bytes(b"x" * 1000)
    aged(stale)
    kept = {".ck.minidb.fresh123.tmp": b"a write under way", ".ck.minidb.abc.tmp": b"", ".other.k3_9ab2z.tmp": b"",
            ".ck.minidb.k3_9ab2z.tmp.bak": b"", "ck.minidb.k3_9ab2z.tmp": b"", ".ck.minidb.K3_9AB2Z.tmp": b""}
    for name, data in kept.items():
        (tmp_path / name).write_bytes(data)
        if name != ".ck.minidb.fresh123.tmp":
            aged(tmp_path / name)
    (tmp_path / ".ck.minidb.folder00.tmp").mkdir()
    aged(tmp_path / ".ck.minidb.folder00.tmp")
    (tmp_path / ".ck.minidb.link0000.tmp").symlink_to(tmp_path / ".other.k3_9ab2z.tmp")
    aged(tmp_path / ".ck.minidb.link0000.tmp")
    monkeypatch.setattr(proto.os, "getuid", lambda: os.lstat(stale).st_uid + 1)   # not the user's: kept
    proto.atomic_write(target, b"new")
    assert stale.exists()
    monkeypatch.undo()
    proto.atomic_write(target, b"newer")
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted([*kept, "ck.minidb", ".ck.minidb.folder00.tmp", ".ck.minidb.link0000.tmp"])
    assert target.read_bytes() == b"newer"


KILLED_WRITE = """
import os, sys
from stepnet.io import proto

def stuck(fd):   # the write is under way: tell the test, and wait to be killed
    print("test: writing", flush=True)
    sys.stdin.readline()

proto.os.fsync = stuck
proto.atomic_write(sys.argv[1], b"x" * 100000)
"""


def test_the_temporary_of_a_killed_write_goes_with_a_later_write(tmp_path):
    target = tmp_path / "init_net.pb"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITE, str(target)], cwd=ROOT, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == "test: writing\n"
    finally:
        proc.kill()
        proc.wait()
    [left] = [p for p in tmp_path.iterdir()]          # SIGKILL: nothing could remove it
    assert left.name.startswith(".init_net.pb.") and left.stat().st_size == 100000
    proto.atomic_write(target, b"new")                # a fresh one may be a write under way: kept
    assert left.exists()
    aged(left)
    proto.atomic_write(target, b"newer")
    assert [p.name for p in tmp_path.iterdir()] == ["init_net.pb"] and target.read_bytes() == b"newer"
