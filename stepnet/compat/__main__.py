"""Run a Caffe2 program unchanged on stepnet: `python -m stepnet.compat script.py [args...]`, or a module as
`python -m` runs one: `python -m stepnet.compat -m pytest test_my_op.py` (a user's Caffe2 test files under pytest
or unittest).

For that run, `import caffe2.python.X` and `from caffe2.proto import caffe2_pb2` resolve to stepnet
(stepnet.compat.alias); the script runs as `__main__` with its own arguments, its folder first on sys.path, as
`python script.py` would run it (a module: with the current folder first, as `python -m` runs it). A module
the program needs that stepnet lacks fails as Python's
ModuleNotFoundError naming it. Caffe2's programs were written for NumPy 1: for the run, the names NumPy 2
removed that they use are put back as NumPy 1 defined them (NUMPY1_NAMES: np.asscalar, np.float, np.int, ...),
only where the installed NumPy lacks them. Their test files were written for Hypothesis 3: when the program
imports hypothesis, the settings and strategy arguments later releases removed are accepted as Hypothesis 3
took them (stepnet.compat._hypothesis3: `settings(timeout=...)`, `lists(average_size=...)`, ...).
"""
from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

from . import _hypothesis3, alias

NUMPY1_NAMES = {"float": float, "int": int, "bool": bool, "object": object, "long": int, "unicode": str,
                "str": str, "complex": complex, "asscalar": lambda a: a.item()}


def numpy1_names() -> None:
    """The NumPy 1 names (NUMPY1_NAMES) the installed NumPy lacks, added to it as NumPy 1 defined them."""
    import numpy as np
    for name, value in NUMPY1_NAMES.items():
        if name not in np.__dict__:
            setattr(np, name, value)


USAGE = ("usage: python -m stepnet.compat SCRIPT.py [ARGS...]   (a Caffe2 program, run unchanged on stepnet)\n"
         "       python -m stepnet.compat -m MODULE [ARGS...]  (a module as __main__: -m pytest, -m unittest, ...)")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    module = argv[0] == "-m"
    if module and len(argv) < 2:
        print(f"{USAGE}\nerror: -m needs a module name", file=sys.stderr)
        return 2
    if not module and not Path(argv[0]).is_file():
        print(f"{USAGE}\nerror: {argv[0]} is not a file", file=sys.stderr)
        return 2
    alias.install()
    numpy1_names()
    _hypothesis3.install()
    if module and argv[1] in ("pytest", "py.test"):    # (pytest's import hook comes first: a plugin adapts then)
        plugins = [p for p in os.environ.get("PYTEST_PLUGINS", "").split(",") if p]
        os.environ["PYTEST_PLUGINS"] = ",".join([*plugins, f"{__package__}._pytest_hypothesis3"])
    if module:
        sys.argv = [argv[1], *argv[2:]]
        sys.path.insert(0, "")
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        script = Path(argv[0])
        sys.argv = [str(script), *argv[1:]]
        sys.path.insert(0, str(script.resolve().parent))
        runpy.run_path(str(script), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
