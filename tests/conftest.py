"""Fixtures shared by every test module."""
from __future__ import annotations

from pathlib import Path

import pytest

DATA_DIR = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """tests/data: the vendored real Caffe2 files (provenance in tests/data/SOURCES.md)."""
    return DATA_DIR
