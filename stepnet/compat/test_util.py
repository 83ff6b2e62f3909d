"""Caffe2's test_util: the base class of Caffe2-style unit tests and a few helpers for arrays and blobs.

`TestCase` prepares the process as Caffe2 prepared it for a test: once per class, GlobalInit with the test flags
and no engine preferences; around each test, an empty current workspace (and `self.ws`, a C.Workspace of the
test's own). From later Caffe2 (the PyTorch tree): `randBlob*`, `numOps`, `str_compare`, `get_default_test_flags`,
`caffe2_flaky` (a marked test runs only with CAFFE2_RUN_FLAKY_TESTS=1, the others only without it) and
`TestCase.make_tempdir`.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import tempfile
import unittest

import numpy as np

from . import core, workspace


def rand_array(*dims) -> np.ndarray:
    """A float32 array of shape `dims` with values uniform in [-0.5, 0.5) (a 0-d array when no dims are given)."""
    return np.asarray(np.random.rand(*dims) - 0.5, dtype=np.float32)


def randBlob(name, type, *dims, **kwargs) -> None:  # noqa: A002 - Caffe2's argument name
    """Feed blob `name`: values uniform in [0, 1) of shape `dims`, cast to `type`, plus `offset` (default 0)."""
    values = np.random.rand(*dims).astype(type) + kwargs.get("offset", 0.0)
    workspace.FeedBlob(name, values.astype(type, copy=False))   # (a NumPy scalar offset would widen it)


def randBlobFloat32(name, *dims, **kwargs) -> None:
    """randBlob with float32 values."""
    randBlob(name, np.float32, *dims, **kwargs)


def randBlobsFloat32(names, *dims, **kwargs) -> None:
    """randBlobFloat32 for each of `names`, each of shape `dims`."""
    for name in names:
        randBlobFloat32(name, *dims, **kwargs)


def numOps(net) -> int:
    """How many operators a core.Net holds."""
    return len(net.Proto().op)


def str_compare(a, b, encoding: str = "utf8") -> bool:
    """Whether two names are equal, bytes decoded with `encoding` first."""
    def text(s):
        return s.decode(encoding) if isinstance(s, bytes) else s
    return text(a) == text(b)


def get_default_test_flags() -> list:
    """The arguments TestCase gives GlobalInit (a program name, then the flags)."""
    return ["caffe2", "--caffe2_log_level=0"]


def caffe2_flaky(test_method):
    """Mark a test method as flaky: it then runs only in flaky-test mode (CAFFE2_RUN_FLAKY_TESTS=1). Put it on top
    of the method's other decorators."""
    test_method.__caffe2_flaky__ = True
    return test_method


def is_flaky_test_mode() -> bool:
    return os.getenv("CAFFE2_RUN_FLAKY_TESTS", "0") == "1"


class TestCase(unittest.TestCase):
    """A unittest.TestCase that starts and ends every test with an empty current workspace."""

    @classmethod
    def setUpClass(cls):
        workspace.GlobalInit(get_default_test_flags())
        core.SetEnginePref({}, {})   # no engine preferences: what an op test checks is the op alone

    def setUp(self):
        flaky = getattr(getattr(self, self._testMethodName, None), "__caffe2_flaky__", False)
        if flaky != is_flaky_test_mode():
            raise unittest.SkipTest("Flaky tests are skipped in regular test mode" if flaky
                                    else "Non-flaky tests are skipped in flaky test mode")
        self.ws = workspace.C.Workspace()
        workspace.ResetWorkspace()

    def tearDown(self):
        workspace.ResetWorkspace()

    def make_tempdir(self) -> pathlib.Path:
        """A new temporary folder, removed (with what the test wrote there) when the test ends."""
        folder = pathlib.Path(tempfile.mkdtemp(prefix="caffe2_test."))
        self.addCleanup(shutil.rmtree, str(folder), True)
        return folder
