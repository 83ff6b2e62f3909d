"""Run ONNX's own backend tests on stepnet's Caffe2 ONNX backend (`caffe2.python.onnx.backend`) through Caffe2's
tests/caffe2_suite/caffe2/python/onnx/tests/onnx_backend_test.py, and count the outcomes.

    python tools/onnx_node_tests.py                    # every case of the installed onnx package
    python tools/onnx_node_tests.py -k "relu or conv"   # some of them (pytest's -k)
    python tools/onnx_node_tests.py --list-failing out.txt   # also write each failing case with its one line

The cases come with the installed onnx package (onnx.backend.test): which exist, and how many use ops or forms
Caffe2 never had, changes with its version, so this is not part of the default test run. CUDA variants are
skipped (the backend supports CPU only) and so are the cases Caffe2's file excludes. The last line reads
`onnx <version>: P passed, F failed, S skipped`.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST_FILE = ROOT / "tests" / "caffe2_suite" / "caffe2" / "python" / "onnx" / "tests" / "onnx_backend_test.py"


class Outcomes:
    """A pytest plugin keeping each case's outcome and a failure's last line."""

    def __init__(self):
        self.counts: Counter = Counter()
        self.failing: list[str] = []

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or (report.when == "setup" and not report.passed):
            self.counts[report.outcome] += 1
            if report.failed:
                last = str(report.longrepr).strip().splitlines()[-1] if report.longrepr else ""
                self.failing.append(f"{report.nodeid.split('::')[-1]}  # {last[:200]}")


def main(argv: list[str] | None = None) -> int:
    import onnx
    import pytest

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-k", default=None, help="pytest's -k expression, to run some cases only")
    p.add_argument("--list-failing", type=Path, default=None, help="write each failing case and its last line")
    args = p.parse_args(argv)
    os.environ["STEPNET_ONNX_NODE_TESTS"] = "1"   # (tests/caffe2_suite/conftest.py leaves the file out otherwise)
    plugin = Outcomes()
    options = ["-p", "no:cacheprovider", "-q", "-o", "addopts=", "--tb=no", "-rN", "-W", "ignore", str(TEST_FILE)]
    if args.k:
        options += ["-k", args.k]
    pytest.main(options, plugins=[plugin])
    if args.list_failing:
        args.list_failing.write_text("".join(line + "\n" for line in sorted(plugin.failing)))
    c = plugin.counts
    print(f"onnx {onnx.__version__}: {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
