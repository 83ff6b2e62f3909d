"""Caffe2's own Python test suite, run on stepnet. The files under caffe2/python are byte-for-byte copies
(SOURCES.md lists each with its sha256; tests/test_caffe2_suite_sources.py keeps them so): `caffe2.*` resolves
to stepnet through stepnet.compat.alias, and Caffe2's pure-Python test helpers (hypothesis_test_util,
gradient_checker, test_util, ...) are imported from this folder, as Caffe2 ships them.

What is adapted is the environment, never a test's logic, tolerance or reference; each adaptation is here
because Caffe2's code of 2018 meets NumPy 2 or Hypothesis 6:
  1. numpy: the aliases NumPy 2 removed (np.float, np.int, np.bool, np.object: the builtins they named;
     np.asscalar: `a.item()`, what it did); np.delete given an empty float array of indices deletes nothing,
     as NumPy 1 did (NumPy 2 refuses non-integer indices even when there are none).
  2. hypothesis.settings: the keywords Hypothesis 6 removed (timeout, min_satisfying_examples, perform_health_check,
     max_iterations, max_shrinks, strict, use_coverage) are dropped; in settings made by Caffe2's files,
     max_examples is capped at EXAMPLES and runs are derandomized with no deadline and no shrinking (a failing
     example is reported as found), so the suite is the same on every run and fits CI. The profile Caffe2's
     hypothesis_test_util loads for the whole process is in force during Caffe2's tests only (the project's own
     tests keep theirs).
  3. hypothesis.strategies.lists, text, binary, sets: `average_size` (removed) is dropped, and text's
     `alphabet=None` (Hypothesis 3's "any character", refused by Hypothesis 6) is left out.
  4. hypothesis.extra.numpy.arrays: an element is converted to the array's numeric type first, as Hypothesis 3
     stored it by assignment (a float rounded to float16/float32, a float into an integer array truncated, an
     integer wrapped to the width of its type); Hypothesis 6 refuses a value the dtype cannot hold exactly.
  5. scipy.misc.logsumexp: scipy.special.logsumexp, where SciPy moved it (SciPy 1.3 removed the old name).
  6. numpy again: np.sum of a generator is Python's sum, as NumPy 1 did it (with a warning; NumPy 2 raises), and
     np.set_printoptions(threshold=np.nan) means no truncation, sys.maxsize (NumPy 1.14 began refusing nan); the
     print options are restored after each Caffe2 test.
  7. inspect.getargspec (removed in Python 3.11): its 4-tuple, from inspect.getfullargspec.
  8. np.fromstring without sep (the binary mode NumPy 2 removed): a copy of np.frombuffer's array, what it returned.
  9. Indexing with a list that holds slices (x[[slice(0, 2), slice(None)]]) reads it as a tuple, as NumPy before
     1.23 did: the arrays handed to a reference function of assertReferenceChecks are views of an ndarray
     subclass doing only that; what the reference returns is compared as plain arrays.
 10. hypothesis.strategies.sampled_from given a dict view (`d.keys()`): a list of it, in the dict's order, as
     Hypothesis 3 took any iterable (Hypothesis 6 wants a sequence).
 11. onnx.mapping (removed in onnx 1.16): its two tables, TENSOR_TYPE_TO_NP_TYPE and NP_TYPE_TO_TENSOR_TYPE, made
     from onnx.helper's type functions, as Caffe2's ONNX tests import them.

caffe2/python/onnx/tests/onnx_backend_test.py runs ONNX's own node tests from the installed onnx package (a much
newer onnx than Caffe2's: most of its cases use ops and forms Caffe2 never had, and which ones changes with the
onnx version), so it is left out of the default run: `python tools/onnx_node_tests.py` runs it and counts.

EXAMPLES comes from STEPNET_CAFFE2_EXAMPLES (default 2); tools/caffe2_suite.py runs the whole suite with more.

expected_failures.txt lists what does not pass yet, one test (or one file that does not import) a line, each
with its reason: those are strict xfails, so a test that starts to pass fails the suite until its line goes
(`python tools/caffe2_suite.py --expectations` rewrites the file from a run).
A reason beginning `why: NumPy 2` names a test whose own reference code NumPy 2 breaks (no environment adaptation
can give back NumPy 1's conversions of one-element arrays to scalars, or its wrapping of out-of-range integers):
it is an expected failure under NumPy 2 only and is marked caffe2_numpy2, as are the tests NumPy 2 breaks on some
examples only (NUMPY2_ON_SOME_EXAMPLES); .ci/run runs the marked tests again under NumPy 1.26 with 10 examples
each, where they must pass.
"""
from __future__ import annotations

import ast
import collections
import collections.abc
import contextlib
import inspect
import os
import sys
import types
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
EXPECTED = HERE / "expected_failures.txt"
collect_ignore = ["caffe2/python/test_util.py",   # Caffe2's TestCase bases, helpers (their names only look like tests)
                  "caffe2/python/onnx/tests/test_utils.py"]
if not os.environ.get("STEPNET_ONNX_NODE_TESTS"):   # tools/onnx_node_tests.py sets it
    collect_ignore.append("caffe2/python/onnx/tests/onnx_backend_test.py")
EXAMPLES = int(os.environ.get("STEPNET_CAFFE2_EXAMPLES", "2"))
ArgSpec = collections.namedtuple("ArgSpec", "args varargs keywords defaults")   # inspect's, before Python 3.11


def _adapt_numpy() -> None:
    for name, value in (("float", float), ("int", int), ("bool", bool), ("object", object), ("long", int),
                        ("unicode", str), ("complex", complex), ("str", str)):
        if name not in np.__dict__:
            setattr(np, name, value)
    if not hasattr(np, "asscalar"):
        np.asscalar = lambda a: a.item()
    if not getattr(np.delete, "_stepnet_adapted", False):
        delete = np.delete

        def delete_(arr, obj, axis=None):   # NumPy 1 took an empty float array of indices as no index
            if isinstance(obj, np.ndarray) and obj.size == 0 and obj.dtype.kind == "f":
                obj = obj.astype(np.intp)
            return delete(arr, obj, axis=axis)

        delete_._stepnet_adapted = True
        np.delete = delete_
    if not getattr(np.sum, "_stepnet_adapted", False):
        sum_, set_printoptions = np.sum, np.set_printoptions

        def npsum(a, *args, **kwargs):   # NumPy 1: a generator went to Python's sum (with a DeprecationWarning)
            return sum(a, *args, **kwargs) if isinstance(a, types.GeneratorType) else sum_(a, *args, **kwargs)

        def printoptions(*args, **kwargs):   # NumPy 1.13 took threshold=nan for "never summarize"
            if isinstance(kwargs.get("threshold"), float) and np.isnan(kwargs["threshold"]):
                kwargs["threshold"] = sys.maxsize
            return set_printoptions(*args, **kwargs)

        npsum._stepnet_adapted = True
        np.sum, np.set_printoptions = npsum, printoptions
        fromstring = np.fromstring

        def fromstring_(string, dtype=float, count=-1, *, sep="", **kwargs):   # NumPy 1's binary mode
            if sep == "":
                return np.frombuffer(string, dtype=dtype, count=count, **kwargs).copy()
            return fromstring(string, dtype=dtype, count=count, sep=sep, **kwargs)
        np.fromstring = fromstring_


class _SliceListArray(np.ndarray):
    """An ndarray that takes a list holding slices as a tuple index (NumPy < 1.23); nothing else differs."""

    def __getitem__(self, key):
        if isinstance(key, list) and any(isinstance(k, slice) for k in key):
            key = tuple(key)
        return super().__getitem__(key)


def _adapt_reference_checks() -> None:
    from caffe2.python import hypothesis_test_util as hu

    check = hu.HypothesisTestCase.assertReferenceChecks
    if getattr(check, "_stepnet_adapted", False):
        return

    def assertReferenceChecks(self, device_option, op, inputs, reference, input_device_options=None,
                              threshold=1e-4, output_to_grad=None, grad_reference=None, atol=None,
                              outputs_to_check=None):   # (Caffe2's signature: tests inspect it for `threshold`)
        def ref(*xs):
            return reference(*(x.view(_SliceListArray) if type(x) is np.ndarray else x for x in xs))
        return check(self, device_option, op, inputs, ref, input_device_options, threshold, output_to_grad,
                     grad_reference, atol, outputs_to_check)

    assertReferenceChecks._stepnet_adapted = True
    hu.HypothesisTestCase.assertReferenceChecks = assertReferenceChecks


def _adapt_python() -> None:
    if not hasattr(inspect, "getargspec"):
        def getargspec(func):
            spec = inspect.getfullargspec(func)
            return ArgSpec(spec.args, spec.varargs, spec.varkw, spec.defaults)
        inspect.getargspec = getargspec


def _adapt_hypothesis() -> None:
    """Hypothesis 3's arguments accepted (stepnet.compat._hypothesis3, as `python -m stepnet.compat` has them),
    then, for Caffe2's files alone, the suite's example count and the same examples every run."""
    import hypothesis

    from stepnet.compat import _hypothesis3

    _hypothesis3.adapt()
    settings = hypothesis.settings
    NO_SHRINK = (hypothesis.Phase.explicit, hypothesis.Phase.reuse, hypothesis.Phase.generate)
    if getattr(settings, "_stepnet_adapted", False):
        return
    init = settings.__init__

    def __init__(self, parent=None, **kwargs):
        caller = sys._getframe(1).f_globals.get("__file__") or ""
        if caller.startswith(str(HERE)):   # Caffe2's files only: the suite's count, the same examples every run
            if kwargs.get("max_examples") is not None:
                kwargs["max_examples"] = min(kwargs["max_examples"], EXAMPLES)
            for name, value in (("derandomize", True), ("deadline", None), ("database", None),
                                ("suppress_health_check", list(hypothesis.HealthCheck)), ("phases", NO_SHRINK)):
                kwargs.setdefault(name, value)
        init(self, parent, **kwargs)

    settings.__init__ = __init__
    settings._stepnet_adapted = True
    settings.register_profile("stepnet-caffe2", max_examples=EXAMPLES, derandomize=True, deadline=None,
                              suppress_health_check=list(hypothesis.HealthCheck), database=None, phases=NO_SHRINK)


def _adapt_scipy() -> None:
    import warnings

    import scipy.special
    with warnings.catch_warnings():   # (SciPy says scipy.misc will go; the suite imports it)
        warnings.simplefilter("ignore", DeprecationWarning)
        import scipy.misc

    if not hasattr(scipy.misc, "logsumexp"):
        scipy.misc.logsumexp = scipy.special.logsumexp


def _adapt_onnx() -> None:
    try:
        import onnx
        from onnx import TensorProto, helper
    except ImportError:
        return
    if hasattr(onnx, "mapping"):
        return
    mapping = types.ModuleType("onnx.mapping")
    to_np = {}
    for code in TensorProto.DataType.values():
        with contextlib.suppress(Exception):   # (types NumPy has no dtype for)
            to_np[code] = helper.tensor_dtype_to_np_dtype(code)
    mapping.TENSOR_TYPE_TO_NP_TYPE = to_np
    mapping.NP_TYPE_TO_TENSOR_TYPE = {}
    for code in sorted(to_np):   # onnx 1.x: a dtype's first type number
        mapping.NP_TYPE_TO_TENSOR_TYPE.setdefault(to_np[code], code)
    onnx.mapping = mapping
    sys.modules["onnx.mapping"] = mapping


def _install() -> None:
    from stepnet.compat import alias

    _adapt_numpy()
    _adapt_python()
    _adapt_scipy()
    _adapt_hypothesis()
    _adapt_onnx()
    alias.install(roots=[HERE])
    os.environ.setdefault("CAFFE2_HYPOTHESIS_PROFILE", "stepnet-caffe2")
    import hypothesis

    before = hypothesis.settings.get_current_profile_name()
    import caffe2.python.hypothesis_test_util  # noqa: F401 - it loads a profile for the whole process: undo that
    hypothesis.settings.load_profile(before)
    _adapt_reference_checks()


_install()


@pytest.fixture(autouse=True)
def _caffe2_environment():
    """Each Caffe2 test: the caffe2 names installed, the suite's Hypothesis profile (the project's other tests keep
    theirs: the profile in force before is restored), and Caffe2's fresh-process state, as tests/compat has it."""

    from stepnet.compat import alias
    from stepnet.compat.state import reset

    alias.install(roots=[HERE])
    reset()
    printing = np.get_printoptions()
    try:
        with caffe2_profile():
            yield
    finally:
        np.set_printoptions(**printing)
        reset()


# ------------------------------------------------------------------------------------------- expected failures
def expected_failures() -> dict[str, str]:
    """{test id relative to this folder (file::Class::test, or a file alone): reason} from expected_failures.txt."""
    out = {}
    if EXPECTED.exists() and not os.environ.get("STEPNET_CAFFE2_ALL"):   # tools/caffe2_suite.py sets it
        for line in EXPECTED.read_text().splitlines():
            test, _, reason = line.partition("#")
            if test.strip():
                out[test.strip()] = reason.strip()
    return out


def test_ids(path: Path) -> list[str]:
    """Class::test / test for every test function a file defines, read from its source."""
    tree = ast.parse(path.read_text())
    ids = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test")]
    for node in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        ids += [f"{node.name}::{f.name}" for f in node.body if isinstance(f, ast.FunctionDef)
                and f.name.startswith("test")]
    return ids


class Unimportable(pytest.Item):
    """A test of a file that does not import: it fails with the import error."""

    def __init__(self, *, error: str, **kwargs):
        super().__init__(**kwargs)
        self.error = error

    def runtest(self):
        raise ImportError(self.error)

    def reportinfo(self):
        return self.path, None, self.name


@contextlib.contextmanager
def caffe2_profile():
    """The suite's Hypothesis profile in force (then the one before): Hypothesis binds a test's settings when it
    decorates it, at import, and reads the profile again when it runs."""
    import hypothesis

    before = hypothesis.settings.get_current_profile_name()
    hypothesis.settings.load_profile("stepnet-caffe2")
    try:
        yield
    finally:
        hypothesis.settings.load_profile(before)


class SuiteModule(pytest.Module):
    """A test file of the suite: imported under the suite's profile. One listed as not importing gives each of
    its tests as an expected failure while it does not, and one failing item saying so once it does."""

    def _getobj(self):
        option = self.config.option
        mode = option.importmode
        if self.path.name in SHARED_NAMES or (self.path.parent / "__init__.py").exists():   # (by path, see above)
            option.importmode = "importlib"
        try:
            with caffe2_profile():
                return super()._getobj()
        finally:
            option.importmode = mode

    def collect(self):
        reason = expected_failures().get(self.path.relative_to(HERE).as_posix())
        if reason is None:
            return super().collect()
        try:
            items = list(super().collect())
        except Exception as e:  # noqa: BLE001 - pytest's CollectError, whatever the module raised
            error = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            mark = pytest.mark.xfail(strict=True, reason=reason)
            made = []
            for name in test_ids(self.path):
                item = Unimportable.from_parent(self, name=name.replace("::", "."), error=error)
                item.add_marker(mark)
                made.append(item)
            return made
        stale = Unimportable.from_parent(self, name="expected_failures_entry",
                                         error="this file imports now: remove its line from expected_failures.txt")
        return [*items, stale]


# Test files of one name in two folders (checkpoint_test.py: Caffe2's operator test and its module test), and those
# in a folder with an __init__.py (onnx/tests: as a package it would be `tests`, the project's own folder's name):
# pytest imports a test file by its name, so these are imported by their path instead.
_NAMES = collections.Counter(p.name for p in HERE.joinpath("caffe2").rglob("*_test.py"))
SHARED_NAMES = {name for name, n in _NAMES.items() if n > 1}


def pytest_pycollect_makemodule(module_path, parent):
    if module_path.name.endswith("_test.py") and module_path.resolve().is_relative_to(HERE):
        return SuiteModule.from_parent(parent, path=module_path)
    return None


# Tests whose own code NumPy 2 breaks only on some examples (so not an expected failure at EXAMPLES): marked
# caffe2_numpy2 too, so that .ci/run runs them under NumPy 1 with more examples.
NUMPY2_ON_SOME_EXAMPLES = {
    # the reference builds np.int32(0xDEADBEEF * seed), which NumPy 1 wrapped and NumPy 2 refuses (OverflowError)
    "caffe2/python/operator_test/index_hash_ops_test.py::TestIndexHashOps::test_index_hash_ops",
}


def numpy2_break(reason: str) -> bool:
    """Whether an expected failure is one of Caffe2's test code meeting NumPy 2 (its reason begins `why: NumPy 2`):
    such a test is expected to fail under NumPy 2 only, and must pass under NumPy 1."""
    return reason.startswith("why: NumPy 2")


def pytest_configure(config):
    config.addinivalue_line("markers", "caffe2_numpy2: a Caffe2 test whose own code NumPy 2 breaks (run under NumPy 1"
                                       " by .ci/run: `pytest tests/caffe2_suite -m caffe2_numpy2`)")


def pytest_collection_modifyitems(config, items):
    expected = expected_failures()
    numpy1 = int(np.__version__.split(".")[0]) < 2
    for item in items:
        if not Path(item.path).resolve().is_relative_to(HERE) or isinstance(item, Unimportable):
            continue
        key = "::".join([Path(item.path).resolve().relative_to(HERE).as_posix(),
                         *item.nodeid.split("[")[0].split("::")[1:]])
        if key in NUMPY2_ON_SOME_EXAMPLES:
            item.add_marker(pytest.mark.caffe2_numpy2)
        if key in expected and numpy2_break(expected[key]):
            item.add_marker(pytest.mark.caffe2_numpy2)
            if numpy1:
                continue
        if key in expected:
            item.add_marker(pytest.mark.xfail(strict=True, reason=expected[key]))
