"""Run Caffe2's own Python test suite (tests/caffe2_suite) on stepnet and print a per-file table and the totals.

    python tools/caffe2_suite.py                       # every file, 10 Hypothesis examples per test
    python tools/caffe2_suite.py --examples 50 -k conv  # more examples, only files whose path holds "conv"
    python tools/caffe2_suite.py --json out.json       # also write {file: {test: outcome}}

The default test suite runs the same files with 2 examples per test (tests/caffe2_suite/conftest.py). A test
function is counted from the source (every `test*` function or method of a `*_test.py` file), so a file that
fails to import counts each of its tests as failing. The last line reads `N/M caffe2 test functions pass`.
Caffe2's onnx_backend_test.py, which runs the installed onnx package's own cases, is tools/onnx_node_tests.py's.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "tests" / "caffe2_suite"
ONNX_NODE_TESTS = "onnx_backend_test.py"   # ONNX's own cases, of the installed onnx: tools/onnx_node_tests.py


def test_functions(path: Path) -> list[str]:
    """`Class::test_x` / `test_x` for every test a file defines (by its source: importing is what may fail)."""
    tree = ast.parse(path.read_text())
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            names.append(node.name)
        elif isinstance(node, ast.ClassDef):
            names += [f"{node.name}::{f.name}" for f in node.body
                      if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name.startswith("test")]
    return names


def _rel(nodeid_file: str) -> str:
    """A node id's file relative to the suite folder (pytest names it from the project's root)."""
    return nodeid_file.removeprefix("tests/caffe2_suite/")


class Collector:
    """A pytest plugin keeping each test's outcome and each file's collection error."""

    def __init__(self):
        self.outcomes: dict[str, dict[str, str]] = defaultdict(dict)
        self.reasons: dict[str, str] = {}
        self.broken: dict[str, str] = {}
        self.why: dict[str, dict[str, str]] = defaultdict(dict)
        self.seconds: Counter = Counter()

    def pytest_collectreport(self, report):
        if report.failed:
            self.broken[_rel(report.nodeid.split("::")[0])] = str(report.longrepr).strip().splitlines()[-1][:200]

    def pytest_runtest_logreport(self, report):
        file, _, name = report.nodeid.partition("::")
        file = _rel(file)
        self.seconds[file] += report.duration
        name = name.split("[")[0]
        if report.when == "call" or report.outcome in ("failed", "skipped") and report.when == "setup":
            state = report.outcome
            if state == "skipped" and isinstance(report.longrepr, tuple):
                self.reasons[report.nodeid] = report.longrepr[2]
            if state == "failed" and name not in self.why[file]:
                crash = getattr(report.longrepr, "reprcrash", None)
                self.why[file][name] = (crash.message if crash else str(report.longrepr)).strip().splitlines()[0]
            previous = self.outcomes[file].get(name)
            if previous is None or previous == "passed":   # a test's worst outcome over its parameters
                self.outcomes[file][name] = state
        elif report.failed:   # a teardown error
            self.outcomes[file][name] = "failed"


def _union(names: list[str], collected: dict) -> list[str]:
    return names + [n for n in collected if n not in names]


def write_expectations(files, collector: Collector) -> None:
    """expected_failures.txt: each file that does not import, each test that does not pass, with the reason."""
    path = SUITE / "expected_failures.txt"
    kept = {}   # reasons a person wrote ("# why: ..."): kept while their test still fails
    for line in (path.read_text().splitlines() if path.exists() else []):
        test, _, reason = line.partition("  # ")
        if reason.startswith("why: "):
            kept[test.strip()] = reason
    lines = ["# Caffe2 tests that do not pass on stepnet yet (strict xfails in the default suite; conftest.py).",
             "# Written by `python tools/caffe2_suite.py --expectations`: one test a line, then # and why (the error;",
             "# a reason written as `# why: ...` is kept while its test still fails)."]
    for f in files:
        rel = f.relative_to(SUITE).as_posix()
        if rel in collector.broken:
            lines.append(f"{rel}  # does not import: {collector.broken[rel]}")
            continue
        got = collector.outcomes.get(rel, {})
        for name in _union(test_functions(f), got):
            if got.get(name) == "failed":   # (a test never run: its file skipped itself, as Caffe2 lets it)
                why = collector.why.get(rel, {}).get(name, "failed").replace("#", "No.")[:160]
                lines.append(f"{rel}::{name}  # {kept.get(f'{rel}::{name}', why)}")
    path.write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--examples", type=int, default=10, help="Hypothesis examples per test (default 10)")
    p.add_argument("-k", dest="match", default="", help="only the files whose path contains this")
    p.add_argument("--json", help="also write the outcomes to this file")
    p.add_argument("--expectations", action="store_true",
                   help="rewrite tests/caffe2_suite/expected_failures.txt from this run (with every file run)")
    a = p.parse_args(argv)
    os.environ["STEPNET_CAFFE2_EXAMPLES"] = str(a.examples)
    os.environ["STEPNET_CAFFE2_ALL"] = "1"   # run every test as it is: expected failures unmarked
    files = sorted(f for f in (SUITE / "caffe2").rglob("*_test.py") if a.match in f.relative_to(SUITE).as_posix()
                   and f.name != ONNX_NODE_TESTS)
    import pytest

    collector = Collector()
    os.chdir(SUITE)
    pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:warnings", "--no-header", "--tb=no",
                 "--continue-on-collection-errors",
                 *[str(f.relative_to(SUITE)) for f in files]], plugins=[collector])
    totals, rows = Counter(), []
    for f in files:
        rel = f.relative_to(SUITE).as_posix()
        got = collector.outcomes.get(rel, {})
        names = _union(test_functions(f), got)   # (tests a class inherits from a helper are only collected)
        count = Counter(got.get(n, "not run") for n in names)
        if rel in collector.broken:
            count = Counter({"import error": len(names)})
        totals.update(count)
        rows.append((rel.removeprefix("caffe2/python/"), len(names), count, collector.broken.get(rel, "")))
    print(f"\n{'file':<52}{'tests':>6}{'pass':>6}{'fail':>6}{'skip':>6}{'other':>7}{'s':>7}")
    for name, n, count, why in rows:
        other = n - count["passed"] - count["failed"] - count["skipped"]
        secs = collector.seconds["caffe2/python/" + name]
        print(f"{name:<52}{n:>6}{count['passed']:>6}{count['failed']:>6}{count['skipped']:>6}{other:>7}{secs:>7.1f}"
              + (f"  {why[:90]}" if why else ""))
    reasons = Counter(collector.reasons.values())
    if reasons:
        print("\nskips by reason:")
        for reason, k in reasons.most_common():
            print(f"  {k:>4}  {reason[:110]}")
    total = sum(n for _, n, _, _ in rows)
    print(f"\noutcomes: {dict(totals)}")
    if a.json:
        Path(a.json).write_text(json.dumps({"outcomes": collector.outcomes, "broken": collector.broken}, indent=1))
    if a.expectations:
        write_expectations(files, collector)
    print(f"{totals['passed']}/{total} caffe2 test functions pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
