"""Caffe2's seq2seq tests, caffe2/python/models/seq2seq/*_test.py here (byte-for-byte copies, ../SOURCES.md),
collected by pytest and run as Caffe2 ran them. The names they import resolve through stepnet.compat.alias:
`caffe2.python.models.seq2seq.train` and `.translate` to the vendored programs next to them (Caffe2's programs,
which the tests import), `.seq2seq_util`, `.seq2seq_model_helper` and `.beam_search` to stepnet's own library
(stepnet.compat.models.seq2seq: no root holds a file of those names), `caffe2.python.test_util`
to Caffe2's test helper in tests/caffe2_suite. reference/ holds Caffe2's copies of the three library modules,
read only by tests/compat/test_seq2seq.py (which checks that stepnet's build the same nets)."""
from pathlib import Path

import pytest

from stepnet.compat import alias

HERE = Path(__file__).resolve().parent
ROOTS = [HERE, HERE.parents[2] / "caffe2_suite"]
alias.install(roots=ROOTS)   # the test files import caffe2 names when they are collected


@pytest.fixture(autouse=True)
def _caffe2_names():
    alias.install(roots=ROOTS)   # again for each test (tests/compat/test_alias.py uninstalls the finder)
    yield
