"""Importing stepnet from a source folder that lacks the compiled schema (a checkout in the working directory
shadows the installed package after `pip install .`) is one ImportError that says why and what to do, not a
"circular import" from deep inside the package."""
import shutil
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "stepnet"


# as after `pip install .` (not -e): no editable finder that would supply the checkout's own modules
PLAIN = "import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'Editable' not in repr(f)]; import stepnet"


def test_a_checkout_without_the_schema_says_so(tmp_path):
    copy = tmp_path / "stepnet"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "caffe2_pb2.py"))
    done = subprocess.run([sys.executable, "-c", PLAIN], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: stepnet's compiled schema is missing from ") and "pip install -e ." in last
    assert "circular" not in done.stderr
    shutil.copy(PACKAGE / "caffe2_pb2.py", copy / "caffe2_pb2.py")     # with it, the same folder imports
    assert subprocess.run([sys.executable, "-c", PLAIN], cwd=tmp_path).returncode == 0
