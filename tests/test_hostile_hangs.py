"""Hangs and runaway resources an independent hostile-input campaign found (#24 §4): each ends in one
`stepnet: error:` line, checked against a bound that makes the hang impossible, and the good input next to it
still works."""
from __future__ import annotations

import numpy as np
import pytest

from stepnet import Workspace
from stepnet.cli.run import main
from stepnet.core.errors import ArgumentError
from stepnet.core.limits import Limits
from stepnet.io import proto
from stepnet.testing import make_op


def one_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("stepnet: error: ") and err.count("\n") == 1 and "internal" not in err, err
    return err


# --------------------------------------------------------------------------------- Checkpoint's db pattern
def checkpoint_net(path, pattern: str) -> str:
    net = proto.NetDef(name="ck")
    net.op.extend([make_op("ConstantFill", [], ["it"], shape=[1], dtype=proto.DataType.INT64, value=3),
                   make_op("Checkpoint", ["it"], [], db=pattern, db_type="minidb")])
    proto.save(net, path)
    return str(path)


@pytest.mark.parametrize("pattern, message", [
    ("ck%100000000d", "'%100000000d' pads the iteration to more than the 255 bytes a file name holds"),
    ("ck%1000000000d", "'%1000000000d' pads the iteration"),
    ("ck%.1000000000d", "'%.1000000000d' pads the iteration"),
    ("ck%256d", "'%256d' pads the iteration"),
    ("ck%" + "9" * 100_000 + "d", "pads the iteration"),
    ("ck%0254d", "characters long with a name of 256 bytes; file systems take at most 255 bytes a name"),
    ("d/" * 2100 + "ck%d", "file systems take at most 255 bytes a name and 4096 a path"),
])
def test_a_db_pattern_wider_than_a_file_name_is_one_short_line(tmp_path, monkeypatch, capsys, pattern, message):
    monkeypatch.chdir(tmp_path)
    assert main(["run", checkpoint_net(tmp_path / "net.pbtxt", pattern)]) == 1
    err = one_error(capsys)
    assert message in err and "op #1 (Checkpoint)" in err and len(err) < 500
    assert sorted(p.name for p in tmp_path.iterdir()) == ["net.pbtxt"]


@pytest.mark.parametrize("pattern, written", [("ck_%08d.minidb", "ck_00000003.minidb"),
                                              ("ck%0253d", "ck" + "3".zfill(253)), ("ck%%%-5d.db", "ck%3    .db")])
def test_a_db_pattern_a_file_name_holds_writes(tmp_path, monkeypatch, capsys, pattern, written):
    monkeypatch.chdir(tmp_path)
    assert main(["run", checkpoint_net(tmp_path / "net.pbtxt", pattern), "-q"]) == 0, capsys.readouterr().err
    assert (tmp_path / written).is_file()


def test_a_save_to_a_name_longer_than_a_file_name_is_refused(tmp_path):
    ws = Workspace(limits=Limits(file_root=tmp_path))
    ws.feed("x", np.ones(2, np.float32))
    with pytest.raises(ArgumentError, match="with a name of 256 bytes"):
        ws.run_operator_once(make_op("Save", ["x"], [], db=str(tmp_path / ("é" * 128)), db_type="minidb",
                                     absolute_path=1))
    ws.run_operator_once(make_op("Save", ["x"], [], db=str(tmp_path / ("é" * 127)), db_type="minidb",
                                 absolute_path=1))
    assert (tmp_path / ("é" * 127)).is_file()
