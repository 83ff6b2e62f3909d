"""The write policy (stepnet/core/writes.py, Limits.confine/check_write, ops/db.py): no model file can cause code
execution or destroy a user's file. The .pth attack (a Save into a virtual environment's site-packages whose
record is a line of Python) and the replacement of ~/.bashrc are refused with one clear line and nothing
written, under the default limits and with --allow-any-path; only database names are written, never over a
file that is not a stepnet database; a run's files and bytes are capped; every file written is reported."""
import os
import subprocess
import sys

import numpy as np
import pytest

from stepnet import NetDef, Workspace
from stepnet.cli.run import main
from stepnet.core import limits as limits_module
from stepnet.core.errors import FileAccessError, ResourceError
from stepnet.core.limits import Limits
from stepnet.io import minidb
from stepnet.io.proto import save as save_model
from stepnet.testing import make_op

CODE = "\nimport os;os.system('id>PWNED')\n"      # a .pth line that Python's site module would exec


def pth_attack(db: str) -> NetDef:
    """A net whose Save writes db with one record keyed by a line of Python: an int32 32 keeps every byte of the
    minidb file valid UTF-8, so site.py would exec that line at the next interpreter start."""
    return NetDef(name="evil", op=[make_op("ConstantFill", [], ["x"], shape=[1], value=32, dtype=2),
                                   make_op("Save", ["x"], [], db=db, db_type="minidb", blob_name_overrides=[CODE])])


@pytest.fixture
def venv(tmp_path, monkeypatch):
    """A project folder holding a virtual environment, as users' do; the working directory (the file root)."""
    site = tmp_path / ".venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (tmp_path / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_cli(args, capsys):
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("extra", [[], ["--allow-any-path"]])
def test_the_pth_attack_is_refused(venv, capsys, extra):
    target = ".venv/lib/python3.11/site-packages/_x.pth"
    save_model(pth_attack(target), venv / "evil.pbtxt")
    code, out, err = run_cli(["run", "evil.pbtxt", *extra], capsys)
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stepnet: error: net 'evil', op #1 (Save): db path ")
    assert "a model may not write there" in lines[0] and "'.venv' is hidden" in lines[0]
    assert not (venv / target).exists() and not (venv / "PWNED").exists()
    assert "the model wrote" not in out


@pytest.mark.parametrize("target, reason", [
    ("env/lib/python3.11/site-packages/_x.pth", "Python package directory"),     # a venv not hidden
    ("env/bin/activate_this", "is a Python environment (it holds pyvenv.cfg)"),
    ("pkgs/site-packages/x.minidb", "Python package directory"),
    ("_x.pth", "its suffix '.pth' is not a database's"),
    ("sitecustomize.py", "its suffix '.py' is not a database's"),
    ("Makefile", "'Makefile' is a name build tools"),
    ("lib.so", "its suffix '.so'"),
])
def test_code_and_environments_are_never_written(tmp_path, monkeypatch, target, reason):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "env").mkdir()
    (tmp_path / "env" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    ws = Workspace()
    with pytest.raises(FileAccessError, match="a model may not write there") as info:
        ws.run_net_once(pth_attack(target))
    assert reason in str(info.value) and str(info.value).startswith("net 'evil', op #1 (Save): db path ")
    assert not (tmp_path / target).exists() and len(ws.written) == 0


def test_the_bashrc_is_never_replaced(tmp_path, monkeypatch, capsys):
    """Run from a home directory: a model naming ~/.bashrc (relative, or absolute with --allow-any-path) is
    refused and the file keeps its bytes."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    bashrc = tmp_path / ".bashrc"
    bashrc.write_text("export PS1='$ '\n")
    for db, extra in ((".bashrc", ["--overwrite"]), (str(bashrc), ["--allow-any-path", "--overwrite"])):
        net = pth_attack(db)
        if os.path.isabs(db):
            net.op[1].arg.add(name="absolute_path", i=1)
        save_model(net, tmp_path / "m.pbtxt")
        code, _, err = run_cli(["run", "m.pbtxt", *extra], capsys)
        assert code == 1 and "'.bashrc' is hidden" in err and err.count("\n") == 1, err
        assert bashrc.read_text() == "export PS1='$ '\n"


def test_only_a_stepnet_database_or_an_empty_file_is_replaced(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes").write_text("my notes\n")
    (tmp_path / "empty.db").write_bytes(b"")
    minidb.save_blobs("old.minidb", {"w": np.zeros(3, np.float32)})
    ws = Workspace()
    with pytest.raises(FileAccessError, match=r"db './notes' exists and is not a stepnet database \(minidb\)"):
        ws.run_net_once(pth_attack("notes"))
    assert (tmp_path / "notes").read_text() == "my notes\n"
    for db in ("empty.db", "old.minidb", "ckpt.0001", "fresh.minidb"):
        ws.run_net_once(pth_attack(db))
        assert minidb.MiniDB(db).key(0).startswith(CODE)   # written: a database, whatever its keys say
    assert [w.path for w in ws.written] == ["empty.db", "old.minidb", "ckpt.0001", "fresh.minidb"]


def test_every_write_is_reported_and_counted(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    plan = ('network { name: "n" op { type: "ConstantFill" output: "x" arg { name: "shape" ints: 2 } } '
            'op { type: "Save" input: "x" arg { name: "db" s: "a.minidb" } arg { name: "db_type" s: "minidb" } } '
            'op { type: "Save" input: "x" arg { name: "db" s: "b.minidb" } arg { name: "db_type" s: "minidb" } } }'
            '\nexecution_step { name: "s" network: "n" num_iter: 3 }\n')
    (tmp_path / "p.pbtxt").write_text(plan)
    code, out, _ = run_cli(["run", "p.pbtxt", "-q"], capsys)
    assert code == 0
    lines = [line for line in out.splitlines() if line.startswith("the model wrote")]
    size = os.path.getsize("a.minidb")
    assert lines == [f"the model wrote a.minidb ({size} bytes, written 3 times) by net 'n', op #1 (Save)",
                     f"the model wrote b.minidb ({size} bytes, written 3 times) by net 'n', op #2 (Save)"]
    os.remove("a.minidb"), os.remove("b.minidb")
    code, out, err = run_cli(["run", "p.pbtxt", "-q", "--max-write-files", "1"], capsys)
    assert code == 1 and "db './b.minidb' would be file 2 this run writes, over the limit of 1 files" in err
    assert "--max-write-files N" in err and not os.path.exists("b.minidb")
    assert out.splitlines() == [f"the model wrote a.minidb ({size} bytes) by net 'n', op #1 (Save)"]
    code, _, err = run_cli(["run", "p.pbtxt", "-q", "--overwrite", "--max-write-bytes", str(size + 1)], capsys)
    assert code == 1 and "over the limit of" in err and "--max-write-bytes SIZE" in err


def test_checkpoint_patterns_are_held_to_the_budget(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ws = Workspace(limits=Limits(max_write_files=4))
    ws.feed("it", np.array([0], np.int64))
    ws.feed("x", np.ones(2, np.float32))
    net = ws.create_net(NetDef(name="ck", op=[make_op("Iter", ["it"], ["it"]),
                                              make_op("Checkpoint", ["it", "x"], [], db="ck_%d.minidb",
                                                      db_type="minidb", every=1)]))
    for _ in range(4):
        net.run()
    with pytest.raises(ResourceError, match="would be file 5 this run writes"):
        net.run()
    assert sorted(os.listdir(tmp_path)) == ["ck_1.minidb", "ck_2.minidb", "ck_3.minidb", "ck_4.minidb"]


def test_a_program_s_own_paths_are_its_choice(tmp_path, monkeypatch):
    """Limits(trusted=True), what stepnet.compat's workspaces use: a Caffe2 script saves where it says."""
    monkeypatch.chdir(tmp_path)
    outside = tmp_path.parent / f"{tmp_path.name}_out"
    outside.mkdir()
    from stepnet.compat import workspace

    workspace.ResetWorkspace()
    workspace.FeedBlob("x", np.ones(2, np.float32))
    target = outside / ".hidden" / "x.db"
    target.parent.mkdir()
    assert workspace.RunOperatorOnce(make_op("Save", ["x"], [], db=str(target), db_type="minidb", absolute_path=1))
    assert target.exists()


def test_the_policy_tests_fail_when_a_rule_is_broken(venv, monkeypatch):
    """With the rules switched off the attack goes through: the tests above can fail."""
    monkeypatch.setattr(limits_module, "refusal", lambda real, root: None)
    Workspace().run_net_once(pth_attack(".venv/lib/python3.11/site-packages/_x.pth"))
    pth = venv / ".venv/lib/python3.11/site-packages/_x.pth"
    assert pth.exists() and CODE.encode() in pth.read_bytes()
    subprocess.run([sys.executable, "-c", f"import site; site.addsitedir({str(pth.parent)!r})"], cwd=venv,
                   check=True)
    assert (venv / "PWNED").exists()      # the line ran: that is what the policy prevents


def test_a_run_replaces_no_database_from_before_it_unasked(tmp_path, monkeypatch, capsys):
    """#27: a short run (--iterations 30, --profile, ...) never replaces a trained model silently: `stepnet run`
    stops before it starts when a Save op's db is there already, names it and the flag; --overwrite replaces;
    a Checkpoint op (its name formatted as it runs) is refused when it runs; Python keeps Caffe2's rule."""
    monkeypatch.chdir(tmp_path)
    plan = ('network { name: "train" op { type: "ConstantFill" output: "x" arg { name: "shape" ints: 2 } } } '
            'network { name: "save" op { type: "Save" input: "x" arg { name: "db" s: "model.minidb" } '
            'arg { name: "db_type" s: "minidb" } } }\n'
            'execution_step { name: "train" network: "train" num_iter: 5 }\n'
            'execution_step { name: "save" network: "save" }\n')
    (tmp_path / "p.pbtxt").write_text(plan)
    assert run_cli(["run", "p.pbtxt", "-q"], capsys)[0] == 0
    trained = (tmp_path / "model.minidb").read_bytes()
    code, out, err = run_cli(["run", "p.pbtxt", "-q", "--iterations", "1"], capsys)
    assert code == 1 and err.startswith("stepnet: error: net 'save', op #0 (Save): db 'model.minidb' is there "
                                        "already") and "--overwrite" in err and "the model wrote" not in out
    assert (tmp_path / "model.minidb").read_bytes() == trained
    assert run_cli(["run", "p.pbtxt", "-q", "--overwrite"], capsys)[0] == 0
    ws = Workspace(limits=Limits(overwrite=False))
    ws.feed("it", np.array([7], np.int64))
    ws.feed("x", np.ones(2, np.float32))
    minidb.save_blobs("ck_7.minidb", {"x": np.zeros(2, np.float32)})
    with pytest.raises(FileAccessError, match=r"db './ck_7.minidb' was there before this run"):
        ws.run_net_once(NetDef(name="ck", op=[make_op("Checkpoint", ["it", "x"], [], db="ck_%d.minidb",
                                                      db_type="minidb", every=1)]))
    Workspace().run_net_once(pth_attack("ck_7.minidb"))            # Python: Caffe2's rule, Save replaces
