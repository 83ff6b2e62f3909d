"""The README and docs/ stay true: every code block runs as written and the operator table is current.

Blocks by their fence's language:
- `python`: run, the blocks of one page in order in one namespace, in a fresh folder that sees the repository's
  `models/` and `tests/data/` (the pages' relative paths) as the repository root would;
- `sh`: each line is a command run in that same folder (after the page's Python blocks that come before it):
  `stepnet ...` through the command line's main() (it must exit 0); the install lines are the ones .ci/run
  runs (a test cannot install itself), checked against it;
- `console`: `$ command` lines run likewise and the lines after each are its output: every one must appear in
  what the command printed (a line ending in `...` up to there), and a `stepnet: error:` line means exit 1;
- `text` and unlabeled blocks are output, pictures of text or usage synopses: not run.
A block that runs only elsewhere says so on the line before its fence: `<!-- run by tests/FILE -->`, and FILE
must hold the block's command."""
import contextlib
import io
import os
import re
import shlex
from pathlib import Path

import pytest

from stepnet.cli.run import main, op_table

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"(?m)^(<!-- run by (?P<by>\S+) -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)^```", re.S)
INSTALL = ("python3 -m venv", ".venv/bin/pip install")
CI = (ROOT / ".ci" / "run").read_text()


def blocks(page: Path) -> list:
    return [(m.group("lang"), m.group("body"), m.group("by"), page.read_text()[:m.start()].count("\n") + 1)
            for m in FENCE.finditer(page.read_text())]


def commands(body: str) -> list[str]:
    """The commands of an sh block: continuation lines joined, comments dropped, `&&` chains split."""
    text = re.sub(r"\\\n\s*", " ", body)
    out = []
    for line in text.splitlines():
        line = re.sub(r"\s+#.*$", "", line).strip()
        if line and not line.startswith("#"):
            out += [part.strip() for part in line.split(" && ")]
    return out


def run_stepnet(command: str) -> tuple[int, str]:
    """Run `stepnet ...` (or `.venv/bin/stepnet ...`) in-process; (exit status, stdout + stderr)."""
    argv = shlex.split(command)
    assert argv[0] in ("stepnet", ".venv/bin/stepnet"), f"not a stepnet command: {command}"
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = main(argv[1:])
        except SystemExit as e:
            code = e.code
    return code, out.getvalue()


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A fresh working folder holding copies of models/ and tests/data/ where the repository root has them (the
    pages' relative paths; copies, since a model's files must lie under the folder it runs in)."""
    import shutil

    shutil.copytree(ROOT / "models", tmp_path / "models", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "tests" / "data", tmp_path / "tests" / "data")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def check_install(command: str) -> None:
    """An install command the docs give: what .ci/run does in its fresh env."""
    if command.startswith("python3 -m venv"):
        assert "python3 -m venv" in CI
    elif command.startswith(".venv/bin/pip install"):
        target = shlex.split(command)[-1]
        assert target.replace("'", "") in CI.replace('"', ""), f"{command} is not what CI installs"
    elif command.startswith(".venv/bin/python -m pytest"):
        assert "-m pytest" in CI
    else:
        raise AssertionError(f"unknown install command {command}")


def run_page(page: Path) -> int:
    namespace, ran = {"__name__": f"docs_{page.stem}"}, 0
    for lang, body, by, line in blocks(page):
        where = f"{page.relative_to(ROOT) if page.is_relative_to(ROOT) else page.name}:{line}"
        if by is not None:
            text = (ROOT / by).read_text()
            for command in commands(body):
                if command.startswith(INSTALL):
                    check_install(command)
                    continue
                key = [Path(w).stem for w in shlex.split(command) if w.startswith("models/")] or [command]
                assert all(k in text for k in key), f"{where}: {by} does not run {command}"
            continue
        if lang == "python":
            exec(compile(body, where, "exec"), namespace)   # noqa: S102 - the docs' own examples
        elif lang == "sh":
            for command in commands(body):
                if command.startswith(INSTALL) or command.startswith(".venv/bin/python -m pytest"):
                    check_install(command)
                    continue
                code, out = run_stepnet(command)
                assert code == 0, f"{where}: `{command}` exited {code}:\n{out[-2000:]}"
        elif lang == "console":
            for command, expected in re.findall(r"(?m)^\$ (.*)\n((?:(?!\$ ).*\n)*)", body):
                code, out = run_stepnet(command)
                want = [line for line in expected.splitlines() if line]
                assert code == (1 if any(w.startswith("stepnet: error:") for w in want) else 0), \
                    f"{where}: `{command}` exited {code}:\n{out[-2000:]}"
                for w in want:
                    ok = out.find(w[:-3]) >= 0 if w.endswith("...") else w in out.splitlines()
                    assert ok, f"{where}: `{command}` did not print {w!r}; it printed:\n{out[-2000:]}"
        else:
            continue
        ran += 1
    return ran


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_block_runs_as_written(page, folder):
    run_page(page)


def test_the_readme_fits_on_two_screens():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def test_every_page_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    missing = [p.name for p in PAGES[1:] if f"(docs/{p.name})" not in readme]
    assert not missing, f"docs pages the README does not link: {missing}"


def test_operator_table_is_current():
    text = (ROOT / "docs" / "operators.md").read_text()
    table = re.search(r"<!-- ops:begin -->\n(.*)\n<!-- ops:end -->", text, re.S).group(1)
    assert table.strip() == op_table(markdown=True).strip(), (
        "docs/operators.md's table is stale: regenerate it with `stepnet ops --markdown`")


def test_the_checks_fail_on_a_wrong_block(folder, tmp_path):
    page = tmp_path / "bad.md"
    page.write_text("```console\n$ stepnet run models/xor/init_net.pbtxt models/xor/predict_net.pbtxt "
                    "--feed 'X=[[0, 1]]'\ny: shape (1, 1) float32 [0.]\n```\n")
    with pytest.raises(AssertionError, match="did not print"):
        run_page(page)
    page.write_text("```python\nassert 1 + 1 == 3\n```\n")
    with pytest.raises(AssertionError):
        run_page(page)
    os.remove(page)
