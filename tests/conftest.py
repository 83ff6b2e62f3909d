"""Fixtures shared by every test module."""
from __future__ import annotations

from pathlib import Path

import pytest

DATA_DIR = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """tests/data: the vendored real Caffe2 files (provenance in tests/data/SOURCES.md)."""
    return DATA_DIR


@pytest.fixture
def broken():
    """broken(op_type, kernel) swaps a registered kernel for the test; every swap is undone afterwards."""
    from stepnet.ops import REGISTRY

    saved = {}

    def replace(op_type, kernel):
        saved.setdefault(op_type, REGISTRY.get(op_type).kernel)
        REGISTRY.update(op_type, kernel=kernel)
    yield replace
    for op_type, kernel in saved.items():
        REGISTRY.update(op_type, kernel=kernel)
