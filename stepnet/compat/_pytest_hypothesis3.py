"""The pytest plugin `python -m stepnet.compat -m pytest` names in PYTEST_PLUGINS: Hypothesis 3's arguments
accepted (compat._hypothesis3.adapt) once pytest's import hook, which loads hypothesis, is in place."""
from __future__ import annotations

import importlib.util

from ._hypothesis3 import adapt


def pytest_configure(config) -> None:
    """adapt() where hypothesis is installed."""
    if importlib.util.find_spec("hypothesis") is not None:
        adapt()
