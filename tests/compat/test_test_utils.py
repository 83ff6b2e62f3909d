"""stepnet's own Caffe2 test helpers (stepnet.compat.test_util, hypothesis_test_util, gradient_checker,
device_checker): what a user's Caffe2 test file imports. Caffe2's own operator tests pass with them (run in a
fresh interpreter with the caffe2 names installed without the suite's root, so no adaptation of the suite's
conftest is in force); the checkers catch a broken operator; the strategies draw what Caffe2's drew; and the
alias keeps Caffe2's own copies for the vendored suite."""
import functools
import json
import os
import subprocess
import sys
import textwrap
import unittest
from pathlib import Path

import hypothesis
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepnet.compat import _hypothesis_strategies as strategies
from stepnet.compat import _workspaces, alias, core, device_checker, gradient_checker, test_util, workspace
from stepnet.runtime.workspace import Workspace

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "tests" / "caffe2_suite"
TESTS = SUITE / "caffe2" / "python"
HELPERS = ("test_util", "hypothesis_test_util", "gradient_checker", "device_checker")
ROOTS = (SUITE, ROOT / "tests" / "compat" / "programs" / "seq2seq")   # the roots tests install
FEW = settings(max_examples=15, deadline=None, derandomize=True, database=None)
CPU, GPU = core.DeviceOption(0), core.DeviceOption(1)

# Runs Caffe2's test files (paths in argv) with the caffe2 names installed and no root: every name, the four
# helpers included, is stepnet's. Prints {file: {run, problems}} and where the helpers came from, as JSON.
RUNNER = textwrap.dedent("""\
    import importlib.util, json, os, sys, unittest
    import hypothesis
    hypothesis.settings.register_profile("few", max_examples=3, derandomize=True, deadline=None, database=None,
                                         verbosity=hypothesis.Verbosity.quiet)
    os.environ["CAFFE2_HYPOTHESIS_PROFILE"] = "few"   # hypothesis_test_util loads it, as Caffe2's did
    from stepnet.compat import alias
    alias.install()
    report = {}
    for path in sys.argv[1:]:
        spec = importlib.util.spec_from_file_location("caffe2_test_" + os.path.basename(path)[:-3], path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        result = unittest.TestResult()
        unittest.defaultTestLoader.loadTestsFromModule(module).run(result)
        report[os.path.basename(path)] = {"run": result.testsRun, "skipped": len(result.skipped),
                                          "problems": [str(t) + ": " + tb for t, tb in result.failures + result.errors]}
    import caffe2.python as c2
    report["helpers"] = {n: importlib.import_module("caffe2.python." + n).__file__
                         for n in ("test_util", "hypothesis_test_util", "gradient_checker", "device_checker")}
    print("REPORT " + json.dumps(report))
""")


def run_caffe2_tests(*files: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "CAFFE2_HYPOTHESIS_PROFILE"}
    done = subprocess.run([sys.executable, "-c", RUNNER, *(str(TESTS / f) for f in files)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("REPORT "))
    return json.loads(line[len("REPORT "):])


@pytest.fixture(scope="module")
def caffe2_results():
    return run_caffe2_tests("operator_test/activation_ops_test.py", "operator_test/elementwise_ops_test.py",
                            "operator_test/segment_ops_test.py", "gradient_check_test.py")


@pytest.fixture(scope="module")
def hu():
    """stepnet's hypothesis_test_util, imported here; the Hypothesis profile its import loads is undone."""
    before = hypothesis.settings.get_current_profile_name()
    from stepnet.compat import hypothesis_test_util
    hypothesis.settings.load_profile(before)
    return hypothesis_test_util


# ----------------------------------------------------------------------------------------- Caffe2's own tests
def test_caffe2_s_tests_import_stepnet_s_helpers_without_the_suite_root(caffe2_results):
    assert caffe2_results["helpers"] == {n: str(ROOT / "stepnet" / "compat" / f"{n}.py") for n in HELPERS}


@pytest.mark.parametrize("name, tests", [("activation_ops_test.py", 4), ("elementwise_ops_test.py", 9),
                                         ("segment_ops_test.py", 18), ("gradient_check_test.py", 17)])
def test_caffe2_s_operator_tests_pass_with_stepnet_s_helpers(caffe2_results, name, tests):
    result = caffe2_results[name]
    assert result["problems"] == []
    assert result["run"] >= max(tests, 1) and result["skipped"] < result["run"]


USER_TEST = textwrap.dedent("""\
    import unittest
    import numpy as np
    from hypothesis import given, settings
    from caffe2.python import core, gradient_checker, test_util, workspace
    import caffe2.python.hypothesis_test_util as hu


    class TestMyOps(hu.HypothesisTestCase):
        @settings(max_examples=3, deadline=None, derandomize=True)
        @given(X=hu.tensor(), **hu.gcs)
        def test_sigmoid(self, X, gc, dc):
            op = core.CreateOperator("Sigmoid", ["X"], ["Y"])
            self.assertReferenceChecks(gc, op, [X], lambda x: (1 / (1 + np.exp(-x)),))
            self.assertDeviceChecks(dc, op, [X], [0])
            self.assertGradientChecks(gc, op, [X], 0, [0])


    class TestFC(test_util.TestCase):
        def test_weight_gradient(self):
            checker = gradient_checker.GradientChecker(0.01, 0.05)
            op = core.CreateOperator("FC", ["x", "w", "b"], ["y"])
            inputs = [test_util.rand_array(2, 3), test_util.rand_array(4, 3), test_util.rand_array(4)]
            self.assertTrue(checker.CheckSimple(op, inputs, 1, [0])[0])
            self.assertEqual(workspace.Blobs(), [])


    if __name__ == "__main__":
        unittest.main()
""")


def test_a_user_s_caffe2_test_file_runs_under_python_m_stepnet_compat(tmp_path):
    (tmp_path / "my_op_test.py").write_text(USER_TEST)
    env = {k: v for k, v in os.environ.items() if k != "CAFFE2_HYPOTHESIS_PROFILE"}
    done = subprocess.run([sys.executable, "-m", "stepnet.compat", "my_op_test.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Ran 2 tests" in done.stderr and done.stderr.rstrip().endswith("OK")


@pytest.mark.parametrize("runner, passed", [(["-m", "pytest", "-q", "-p", "no:cacheprovider", "my_op_test.py"],
                                             "2 passed"),
                                            (["-m", "unittest", "my_op_test"], "Ran 2 tests")])
def test_a_user_s_caffe2_test_file_runs_under_pytest_and_unittest_through_the_alias(tmp_path, runner, passed):
    """`python -m stepnet.compat -m pytest FILE` / `-m unittest MODULE`: the module runs as `python -m` runs it,
    with caffe2.* resolving to stepnet; a broken reference in the same file fails the run (exit code 1)."""
    env = {k: v for k, v in os.environ.items() if k != "CAFFE2_HYPOTHESIS_PROFILE"}
    broken = USER_TEST.replace("(1 / (1 + np.exp(-x)),)", "(1 / (2 + np.exp(-x)),)")
    assert broken != USER_TEST
    for text, code in ((USER_TEST, 0), (broken, 1)):
        (tmp_path / "my_op_test.py").write_text(text)
        done = subprocess.run([sys.executable, "-m", "stepnet.compat", *runner], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == code, (done.stdout + done.stderr)[-3000:]
        if code == 0:
            assert passed in done.stdout + done.stderr


# ----------------------------------------------------------------------------------------- the alias
def _origin(finder, name):
    spec = finder.find_spec(name)
    return spec.origin if spec.loader.__class__.__name__ != "_Alias" else spec.loader.target


def test_the_suite_root_keeps_caffe2_s_own_helpers_and_stepnet_keeps_its_packages():
    with_root, plain = alias.Finder([SUITE]), alias.Finder()
    for name in HELPERS:
        assert _origin(with_root, f"caffe2.python.{name}") == str(TESTS / f"{name}.py")
        assert _origin(plain, f"caffe2.python.{name}") == f"stepnet.compat.{name}"
    for name in ("core", "workspace", "models", "models.resnet", "onnx"):   # packages and modules of stepnet's
        assert _origin(with_root, f"caffe2.python.{name}") == f"stepnet.compat.{name}"


def test_no_other_root_file_shadows_a_stepnet_module():
    shadowing = set()
    for root in ROOTS:
        for path in (root / "caffe2" / "python").rglob("*.py"):
            if path.name != "__init__.py":
                name = ".".join(path.relative_to(root).with_suffix("").parts)
                if alias.target_of(name) is not None:
                    shadowing.add(name.removeprefix("caffe2.python."))
    assert shadowing == set(HELPERS)


# ----------------------------------------------------------------------------------------- the checkers catch errors
X = np.array([[0.5, -0.3, 0.8], [-0.9, 0.25, 0.6]], dtype=np.float32)


def test_reference_checks_catch_a_wrong_forward_kernel(hu, patched):
    case, op = hu.HypothesisTestCase(), core.CreateOperator("Relu", ["X"], ["Y"])
    outs = case.assertReferenceChecks(CPU, op, [X], lambda x: (np.maximum(x, 0),))
    np.testing.assert_array_equal(outs[0], np.maximum(X, 0))
    patched("Relu", kernel=lambda xp, x: xp.maximum(x, 0) * x.dtype.type(1.01), inplace_kernel=None, gpu_kernel=None)
    with pytest.raises(AssertionError, match="Output Y is not matching the reference"):
        case.assertReferenceChecks(CPU, op, [X], lambda x: (np.maximum(x, 0),))


def test_gradient_checks_catch_a_wrong_gradient_kernel(hu, patched):
    case, op = hu.HypothesisTestCase(), core.CreateOperator("Relu", ["X"], ["Y"])
    case.assertGradientChecks(CPU, op, [X], 0, [0])
    patched("ReluGradient", kernel=lambda xp, y, dy: xp.where(y > 0, dy * dy.dtype.type(2), dy.dtype.type(0)),
            inplace_kernel=None, gpu_kernel=None)
    with pytest.raises(AssertionError, match="Gradient check failed for input X"):
        case.assertGradientChecks(CPU, op, [X], 0, [0])


def test_gradient_checks_catch_a_forward_kernel_its_gradient_does_not_match(hu, patched):
    case, op = hu.HypothesisTestCase(), core.CreateOperator("Sigmoid", ["X"], ["Y"])
    case.assertGradientChecks(CPU, op, [X], 0, [0])
    patched("Sigmoid", kernel=lambda xp, x: 1 / (1 + xp.exp(-2 * x)), inplace_kernel=None, gpu_kernel=None)
    with pytest.raises(AssertionError, match="Gradient check failed"):
        case.assertGradientChecks(CPU, op, [X], 0, [0])


def test_the_gradient_checker_estimates_the_derivative_of_its_loss():
    """Mul: loss sum(Z²)/2 with Z = A·B, so dloss/dA = A·B² (float64 here)."""
    a = np.array([[0.3, -1.2], [2.0, 0.7]], dtype=np.float32)
    b = np.array([[1.5, 0.4], [-0.8, 1.1]], dtype=np.float32)
    op = core.CreateOperator("Mul", ["A", "B"], ["Z"])
    checker = gradient_checker.GradientChecker(stepsize=1e-3, threshold=1e-3)
    passed, grad, estimate = checker.CheckSimple(op, [a, b], 0, [0])
    expected = a.astype(np.float64) * b.astype(np.float64) ** 2
    assert passed
    np.testing.assert_allclose(grad, expected, rtol=1e-5)
    np.testing.assert_allclose(estimate, expected, rtol=2e-3, atol=1e-4)
    assert a[0, 0] == np.float32(0.3) and workspace.CurrentWorkspace() == "default"   # inputs kept; back home


def test_sparse_gradients_are_made_dense():
    """Gather's data gradient is a GradientSlice: rows hit k times get k times the output's gradient."""
    data = np.array([[1.0, -2.0], [0.5, 3.0], [4.0, 0.25]], dtype=np.float32)
    indices = np.array([2, 0, 2], dtype=np.int32)
    count = np.bincount(indices, minlength=3).astype(np.float64)[:, None]
    op = core.CreateOperator("Gather", ["DATA", "INDICES"], ["Y"])
    passed, grad, estimate = gradient_checker.GradientChecker(0.01, 0.01).CheckSimple(op, [data, indices], 0, [0])
    assert passed
    np.testing.assert_allclose(grad, count * data, rtol=1e-6)   # loss sum(Y²)/2
    net = core.Net("gather")
    net.Gather(["DATA", "INDICES"], "Y")
    _, grads, _ = gradient_checker._get_grad(net, [], ["Y"], {"DATA": data, "INDICES": indices}, ["DATA"])
    np.testing.assert_array_equal(grads["DATA"], np.broadcast_to(count, data.shape))   # loss sum(Y)
    gradient_checker.NetGradientChecker.Check(net, ["Y"], {"DATA": data, "INDICES": indices}, "DATA")


def test_the_net_gradient_checker_fails_on_a_wrong_gradient(patched):
    net = core.Net("relu_net")
    net.Relu("X", "Y")
    gradient_checker.NetGradientChecker.Check(net, ["Y"], {"X": X}, "X")
    patched("ReluGradient", kernel=lambda xp, y, dy: xp.where(y > 0, -dy, dy.dtype.type(0)),
            inplace_kernel=None, gpu_kernel=None)
    with pytest.raises(AssertionError, match="Error in gradient check for net_copy relu_net"):
        gradient_checker.NetGradientChecker.Check(net, ["Y"], {"X": X}, "X", print_net=False)


@pytest.fixture
def emulated_gpu(monkeypatch):
    """The compat workspaces with CUDA device options on stepnet's emulated GPU (a CPU-only machine's stand-in)."""
    from stepnet.compat.state import reset
    monkeypatch.setattr(_workspaces, "Workspace", functools.partial(Workspace, gpu="emulate"))
    reset()
    yield
    reset()


def _relu_off_by_one_on_the_gpu(xp, x):
    return xp.maximum(x, 0) + (0 if xp is np else 1)


def test_device_checks_catch_a_kernel_wrong_on_one_device(hu, patched, emulated_gpu, capsys):
    op = core.CreateOperator("Relu", ["X"], ["Y"])
    checker = device_checker.DeviceChecker(0.01, [CPU, GPU])
    assert checker.CheckSimple(op, [X], [0])
    net = core.Net("relus")
    net.Relu("X", "Y")
    net.Relu("Y", "Z")
    assert checker.CheckNet(net.Proto(), {"X": X})
    patched("Relu", kernel=_relu_off_by_one_on_the_gpu, inplace_kernel=None, gpu_kernel=None)
    assert not checker.CheckSimple(op, [X], [0])
    assert "Failure in checking device option 1 and output Y" in capsys.readouterr().out
    assert not checker.CheckNet(net.Proto(), {"X": X}, blobs_to_check=["Z"])
    with pytest.raises(AssertionError):
        hu.HypothesisTestCase().assertDeviceChecks([CPU, GPU], op, [X], [0])
    assert device_checker.DeviceChecker(0.01, [CPU, CPU]).CheckSimple(op, [X], [0])   # the CPU agrees with itself
    assert workspace.CurrentWorkspace() == "default"


def test_validation_and_raising_checks(hu):
    case = hu.HypothesisTestCase()
    seen = {}
    case.assertValidationChecks(CPU, core.CreateOperator("Relu", ["X"], ["Y"]), [X], lambda X, Y: seen.update(Y=Y))
    np.testing.assert_array_equal(seen["Y"], np.maximum(X, 0))
    case.assertRunOpRaises(CPU, core.CreateOperator("Relu", ["X"], ["Y"]), [np.arange(3, dtype=np.int32)])
    with pytest.raises(AssertionError):
        case.assertRunOpRaises(CPU, core.CreateOperator("Relu", ["X"], ["Y"]), [X])


def test_the_gradient_reference_check(hu):
    case, op = hu.HypothesisTestCase(), core.CreateOperator("Mul", ["A", "B"], ["Z"])
    a, b = X, X[::-1].copy()
    case.assertReferenceChecks(CPU, op, [a, b], lambda a, b: (a * b,), output_to_grad="Z",
                               grad_reference=lambda dz, outs, ins: (dz * ins[1], dz * ins[0]))
    with pytest.raises(AssertionError, match="Gradient"):
        case.assertReferenceChecks(CPU, op, [a, b], lambda a, b: (a * b,), output_to_grad="Z",
                                   grad_reference=lambda dz, outs, ins: (dz * ins[0], dz * ins[1]))


def test_the_checks_come_back_to_a_current_workspace_not_made_yet(hu):
    """In a fresh process "default" is current before anything has made it: each check returns to it."""
    op = core.CreateOperator("Relu", ["X"], ["Y"])
    checks = (lambda: hu.runOpBenchmark(CPU, op, [X]),
              lambda: device_checker.DeviceChecker(0.01, [CPU]).CheckSimple(op, [X], [0]),
              lambda: gradient_checker.GradientChecker(0.05, 0.005).CheckSimple(op, [X], 0, [0]))
    for check in checks:
        _workspaces._workspaces.clear()
        check()
        assert workspace.CurrentWorkspace() == "default"


# ----------------------------------------------------------------------------------------- test_util
def test_test_case_starts_and_ends_with_an_empty_workspace():
    class Case(test_util.TestCase):
        def test_sees_nothing(self):
            self.assertEqual(workspace.Blobs(), [])
            workspace.FeedBlob("inside", np.ones(2, np.float32))

        @test_util.caffe2_flaky
        def test_flaky(self):
            raise AssertionError("a flaky test runs only in flaky-test mode")

    workspace.FeedBlob("outside", np.zeros(1, np.float32))
    core.SetEnginePref({}, {1: ["CUDNN"]})
    result = unittest.TestResult()
    unittest.defaultTestLoader.loadTestsFromTestCase(Case).run(result)
    assert result.testsRun == 2 and not result.failures and not result.errors and len(result.skipped) == 1
    assert workspace.Blobs() == []
    from stepnet.compat.engines import _ENGINE_PREF
    assert _ENGINE_PREF == {"op": {}, "global": {}}


def test_blob_and_array_helpers():
    a = test_util.rand_array(3, 4)
    assert a.dtype == np.float32 and a.shape == (3, 4) and np.all((a >= -0.5) & (a < 0.5))
    assert test_util.rand_array().shape == ()
    test_util.randBlobsFloat32(["p", "q"], 2, 3, offset=np.float64(10))
    p = workspace.FetchBlob("p")
    assert p.dtype == np.float32 and p.shape == (2, 3) and np.all((p >= 10) & (p < 11))
    net = core.Net("two")
    net.Relu("p", "r")
    net.Relu("r", "s")
    assert test_util.numOps(net) == 2
    assert test_util.str_compare(b"abc", "abc") and not test_util.str_compare("abc", b"abd")


# ----------------------------------------------------------------------------------------- strategies
@FEW
@given(x=strategies.tensor(dtype=np.float32), h=strategies.tensor(min_dim=2, max_dim=2, dtype=np.float16))
def test_tensors_are_of_their_dtype_within_one(x, h):
    assert x.dtype == np.float32 and 1 <= x.ndim <= 4 and all(1 <= d <= 5 for d in x.shape)
    assert h.dtype == np.float16 and h.ndim == 2
    assert np.all(np.abs(x) <= 1) and np.all(np.abs(h) <= 1)


@FEW
@given(a=strategies.arrays([4], dtype=np.int32, elements=st.integers(0, 2 ** 40)),
       f=strategies.arrays([3], dtype=np.float32, elements=st.floats(-10, 10)))
def test_given_elements_are_stored_as_the_array_type_stores_them(a, f):
    assert a.dtype == np.int32 and f.dtype == np.float32 and np.all(np.abs(f) <= 10)


@FEW
@given(ids=st.integers(1, 12).flatmap(lambda n: strategies.segment_ids(n, is_sorted=True)),
       lengths=strategies.lengths(10, min_segments=2, max_segments=4))
def test_segment_ids_and_lengths(ids, lengths):
    assert ids.dtype == np.int32 and ids[0] == 0 and set(np.diff(ids)) <= {0, 1}
    assert lengths.dtype == np.int32 and lengths.sum() == 10 and 1 <= len(lengths) <= 4 and np.all(lengths >= 0)


@FEW
@given(data=strategies.sparse_lengths_tensor(min_dim=2, max_dim=2, itype=np.int32),
       segmented=strategies.lengths_tensor(dtype=np.float32, allow_empty=True))
def test_sparse_and_segmented_tensors(data, segmented):
    values, indices, lengths = data
    assert indices.dtype == np.int32 and np.all((indices >= 0) & (indices < values.shape[0]))
    assert lengths.sum() == len(indices)
    rows, lengths = segmented
    assert lengths.sum() == rows.shape[0]


def test_device_strategies_on_this_machine(hu):
    assert [o.device_type for o in hu.device_options] == [0] + ([1] if workspace.has_gpu_support else [])
    assert hu.gpu_do.device_type == 1 and set(hu.gcs) == set(hu.gcs_cpu_only) == {"gc", "dc"}
    assert hu.arrays is strategies.arrays and hu.tensor is strategies.tensor
    with pytest.raises(ValueError, match="Unexpected dtype"):
        strategies.elements_of_type(np.complex64)


def test_dash_m_needs_a_module_name(capsys):
    from stepnet.compat.__main__ import main
    assert main(["-m"]) == 2
    assert "-m needs a module name" in capsys.readouterr().err
