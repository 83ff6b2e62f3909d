"""The vendored Caffe2 test suite (tests/caffe2_suite) is Caffe2's, byte for byte: every file under its
caffe2/ folder is listed in its SOURCES.md with the sha256 it has at the commit named there, and nothing else is
in that folder. (What stepnet adapts lives in tests/caffe2_suite/conftest.py, outside it.)"""
import hashlib
import re
from pathlib import Path

SUITE = Path(__file__).resolve().parent / "caffe2_suite"
ROW = re.compile(r"^\| `(caffe2/[^`]+)` \| `([0-9a-f]{64})` \|$", re.M)


def test_every_vendored_file_is_listed_and_unchanged():
    listed = dict(ROW.findall((SUITE / "SOURCES.md").read_text()))
    assert len(listed) >= 160
    present = {p.relative_to(SUITE).as_posix() for p in (SUITE / "caffe2").rglob("*") if p.is_file()
               and "__pycache__" not in p.parts}
    assert present == set(listed), sorted(present ^ set(listed))
    changed = [path for path, digest in listed.items()
               if hashlib.sha256((SUITE / path).read_bytes()).hexdigest() != digest]
    assert changed == []


def test_the_licence_and_notice_travel_with_it():
    assert "Apache License" in (SUITE / "LICENSE").read_text()
    assert "Facebook" in (SUITE / "NOTICE").read_text()
    assert "157ff81a12cf48eb4b0a2ad854c4ae205ad8aa07" in (SUITE / "SOURCES.md").read_text()


DOCS_COMMAND = "python tools/caffe2_suite.py --examples 10"   # docs/caffe2.md; here on one small file


def test_the_suite_tool_prints_the_table_and_the_total():
    import subprocess
    import sys

    root = SUITE.parents[1]
    out = subprocess.run([sys.executable, "tools/caffe2_suite.py", "--examples", "1", "-k", "/relu_op_test"],
                         cwd=root, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    row = next(line for line in lines if line.startswith("operator_test/relu_op_test.py"))
    assert row.split()[1:4] == ["1", "1", "0"]      # tests, pass, fail
    assert lines[-1] == "1/1 caffe2 test functions pass"
