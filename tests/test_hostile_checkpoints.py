"""`stepnet run --resume` with checkpoints from someone else: a generator of hostile resume states (wrong JSON
types, huge, negative and NaN numbers, missing and extra keys, nested junk, non-UTF-8), each refused with one
FileFormatError line before anything is used, while the checkpoint they were made from still resumes."""
import json

import numpy as np
import pytest

from stepnet import Workspace
from stepnet.cli.run import main
from stepnet.core.errors import FileFormatError, PlanError
from stepnet.io import checkpoints, proto
from stepnet.io.checkpoints import POSITION, READERS, RNG
from stepnet.io.minidb import load_blobs, save_blobs

from test_checkpoints import ROOT, digits_plan


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """(plan path, checkpoint blobs): the digits plan interrupted after 1 of its 2 outer iterations."""
    where = tmp_path_factory.mktemp("resume")
    plan = digits_plan(4, 2)
    proto.save(plan, where / "plan.pbtxt")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        Workspace(seed=1).run_plan(plan, boundary=lambda pos, ws: pos.done == 1 and checkpoints.save(
            ws, where / "ck.minidb", pos))
    return where / "plan.pbtxt", load_blobs(where / "ck.minidb")


def hostile_states(blobs):
    """(label, {blob: value or None to drop it}) for each hostile change of a good checkpoint's resume state."""
    readers, rng = json.loads(blobs[READERS]), json.loads(blobs[RNG])
    name = sorted(readers)[0]
    junk = ["x", "", "[]", "null", "1", "1.5", "NaN", "Infinity", "-Infinity", "true", '"text"', "{", "[" * 100_000,
            "9" * 5000, b"\xff\xfe{}", b"{\"a\x80\": 1}", "{}" + "\0"]
    values = [None, True, -1, 2**200, -(2**200), 1.5, 1e400, "1", [], {}, [[[]]], {"a": {"b": None}}]
    cases = [(f"{blob} {raw!r:.30}", {blob: raw}) for blob in (READERS, RNG) for raw in junk if blob != READERS or
             raw not in ("{}",)]
    cases += [(f"{blob} missing", {blob: None}) for blob in (POSITION, READERS, RNG)]
    cases += [(f"{POSITION} {v!r:.40}", {POSITION: v}) for v in (
        "x", b"\xff", np.array([0.5, 1.0]), np.array([np.nan, 1.0]), np.zeros((2, 2), np.int64), np.array([], np.int64),
        np.array([0], np.int64), np.array([-5, 1]), np.array([0, -1]), np.array([2**63 - 1, 0]),
        np.zeros(500, np.int64), np.array([True, False]), np.array(["0", "1"]))]

    def changed(form, path, value):
        """form (a copy) with the item at `path` set to value (or removed, for the value `...`)."""
        form = json.loads(json.dumps(form))
        inner = form
        for key in path[:-1]:
            inner = inner[key]
        if value is ...:
            del inner[path[-1]]
        else:
            inner[path[-1]] = value
        return form
    for blob, form, paths in ((READERS, readers, [(name,), (name, "source"), (name, "pos")]),
                              (RNG, rng, [("bit_generator",), ("state",), ("state", "state"), ("state", "inc"),
                                          ("has_uint32",), ("uinteger",)])):
        for path in paths:
            for value in [..., *values][len(path) == 1 and blob == READERS:]:   # (a reader left out: it restarts)
                text = json.dumps(changed(form, path, value))   # NaN and Infinity from 1e400, as Python writes them
                cases.append((f"{blob} {list(path)} = {value!r:.30}", {blob: text}))
            cases.append((f"{blob} {list(path)} + extra key", {blob: json.dumps(changed(form, (*path[:-1], "extra"),
                                                                                       0))}))
    cases += [(f"{READERS} pos past the end", {READERS: json.dumps(changed(readers, (name, "pos"), 10**9))}),
              (f"{READERS} unknown reader", {READERS: json.dumps({"nobody\n\x1b[31m" * 50: readers[name]})}),
              (f"{READERS} other source", {READERS: json.dumps(changed(readers, (name, "source"), "x" * 10**5))}),
              (f"{RNG} MT19937", {RNG: json.dumps(np.random.Generator(np.random.MT19937(1)).bit_generator.state,
                                                  default=np.ndarray.tolist)})]
    return cases


def write(path, blobs, change):
    blobs = dict(blobs)
    for name, value in change.items():
        if value is None:
            blobs.pop(name)
        else:
            blobs[name] = value
    save_blobs(path, blobs)
    return path


def test_the_generator_makes_many_distinct_cases(good):
    cases = hostile_states(good[1])
    assert len(cases) > 150 and len({label for label, _ in cases}) == len(cases)


def test_each_hostile_checkpoint_is_one_file_format_error(good, tmp_path, monkeypatch, capsys):
    plan, blobs = good
    monkeypatch.chdir(ROOT)
    for label, change in hostile_states(blobs):
        path = write(tmp_path / "ck.minidb", blobs, change)
        with pytest.raises((FileFormatError, PlanError)) as e:
            Workspace().run_plan(proto.load(plan), resume=checkpoints.Resume(path))
        assert e.type is FileFormatError or "which plan 'digits_mlp' does not have" in str(e.value), label
        assert str(path) in str(e.value) and len(str(e.value)) < 600, label
        assert main(["run", str(plan), "-q", "--resume", str(path)]) == 1, label
        err = capsys.readouterr().err
        assert err.startswith("stepnet: error: ") and err.count("\n") == 1 and "internal" not in err, (label, err)


def test_the_good_checkpoint_still_resumes(good, tmp_path, monkeypatch, capsys):
    plan, blobs = good
    monkeypatch.chdir(ROOT)
    path = write(tmp_path / "ck.minidb", blobs, {})
    assert main(["run", str(plan), "-q", "--resume", str(path)]) == 0, capsys.readouterr().err
    resume = checkpoints.Resume(path)
    assert resume.position.done == 1 and resume.rng_state == json.loads(blobs[RNG])


def test_the_checks_are_what_refuses(good, tmp_path, monkeypatch):
    """With the form checks switched off, hostile states reach numpy and the readers as they did: crashes."""
    plan, blobs = good
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(checkpoints, "_check", lambda *args: None)
    crashes = set()
    for _label, change in hostile_states(blobs):
        try:
            Workspace().run_plan(proto.load(plan), resume=checkpoints.Resume(write(tmp_path / "ck.minidb", blobs,
                                                                                   change)))
        except FileFormatError:
            pass
        except Exception as e:   # noqa: BLE001 - what the checks prevent
            crashes.add(type(e).__name__)
    assert {"TypeError", "KeyError", "OverflowError"} <= crashes
