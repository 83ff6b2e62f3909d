"""`caffe2.*` resolving to stepnet (stepnet.compat.alias) and `python -m stepnet.compat script.py`: a Caffe2
program runs with no edit at all."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from stepnet.compat import alias


@pytest.fixture
def installed():
    alias.install()
    yield
    alias.uninstall()


def test_caffe2_modules_are_stepnets_own(installed):
    import caffe2.python.core as c2core
    from caffe2.proto import caffe2_pb2
    from caffe2.python import brew, workspace

    import stepnet.compat.brew
    import stepnet.compat.core
    import stepnet.compat.workspace
    from stepnet import caffe2_pb2 as schema

    assert c2core is stepnet.compat.core and workspace is stepnet.compat.workspace and brew is stepnet.compat.brew
    assert caffe2_pb2 is schema
    workspace.FeedBlob("x", np.arange(3, dtype=np.float32))
    np.testing.assert_array_equal(stepnet.compat.workspace.FetchBlob("x"), [0, 1, 2])   # one state


def test_caffe2_legacy_pb2_has_caffe2_s_padding_numbers(installed):
    from caffe2.proto import caffe2_legacy_pb2 as legacy

    from stepnet.ops import window
    assert [legacy.NOTSET, legacy.VALID, legacy.SAME, legacy.CAFFE_LEGACY_POOLING] == [0, 1, 2, 3]
    assert legacy.LegacyPadding.Name(window.CAFFE_LEGACY_POOLING) == "CAFFE_LEGACY_POOLING"


def test_a_module_stepnet_lacks_is_a_plain_module_not_found(installed):
    with pytest.raises(ModuleNotFoundError, match="caffe2.python.no_such_module"):
        import caffe2.python.no_such_module  # noqa: F401


def test_roots_supply_what_stepnet_does_not(installed, tmp_path):
    pkg = tmp_path / "caffe2" / "python"
    pkg.mkdir(parents=True)
    (pkg / "my_helper.py").write_text("from caffe2.python import core\nVALUE = core.IsOperator('Relu')\n")
    alias.install(roots=[tmp_path])
    from caffe2.python import my_helper
    assert my_helper.VALUE is True


def test_uninstall_forgets_the_names():
    alias.install()
    import caffe2.python.core  # noqa: F401
    alias.uninstall()
    assert not any(name == "caffe2" or name.startswith("caffe2.") for name in sys.modules)
    with pytest.raises(ModuleNotFoundError):
        import caffe2.python.core  # noqa: F401, F811


COMMAND = "python -m stepnet.compat fit.py --flag x"   # docs/caffe2.md shows this command


def test_an_unchanged_caffe2_program_runs(tmp_path):
    script = tmp_path / "fit.py"
    script.write_text(textwrap.dedent("""\
        import sys
        import numpy as np
        from caffe2.python import core, workspace
        from caffe2.proto import caffe2_pb2

        net = core.Net("sum")
        net.Sum(["a", "b"], "c")
        workspace.FeedBlob("a", np.array([1.0, 2.0], dtype=np.float32))
        workspace.FeedBlob("b", np.array([10.0, 20.0], dtype=np.float32))
        workspace.RunNetOnce(net)
        assert isinstance(net.Proto(), caffe2_pb2.NetDef)
        print(sys.argv[1:], workspace.FetchBlob("c").tolist())
        """))
    out = subprocess.run([sys.executable, *COMMAND.split()[1:]], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['--flag', 'x'] [11.0, 22.0]"
    usage = subprocess.run([sys.executable, "-m", "stepnet.compat"], capture_output=True, text=True, timeout=120)
    assert usage.returncode == 2 and "python -m stepnet.compat SCRIPT.py" in usage.stdout


def test_a_program_gets_the_numpy_1_names_it_uses(tmp_path):
    """A 2018 program's np.asscalar / np.float run under NumPy 2 (resnet50_trainer's test pass uses asscalar)."""
    script = tmp_path / "old.py"
    script.write_text("import numpy as np\nprint(np.asscalar(np.array([3.5])), np.float('2'), np.int(7.9))\n")
    out = subprocess.run([sys.executable, "-m", "stepnet.compat", str(script)], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["3.5", "2.0", "7"]
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert plain.returncode != 0 and "asscalar" in plain.stderr   # NumPy 2 itself has none of them


def test_caffe1_s_own_caffe_package_stays_itself(tmp_path):
    """Without pycaffe, `caffe.proto.caffe_pb2` is stepnet's compiled caffe.proto (what caffe_translator reads);
    with pycaffe installed, `caffe` is pycaffe (a script may use Caffe1 and Caffe2 together)."""
    code = "from stepnet.compat import alias; alias.install(); import caffe.proto.caffe_pb2 as m; print(m.__name__)"
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.strip() == "stepnet.caffe_pb2"
    (tmp_path / "caffe" / "proto").mkdir(parents=True)
    (tmp_path / "caffe" / "__init__.py").write_text("")
    (tmp_path / "caffe" / "proto" / "__init__.py").write_text("")
    (tmp_path / "caffe" / "proto" / "caffe_pb2.py").write_text("PYCAFFE = True\n")
    real = subprocess.run([sys.executable, "-c", code + "; print(m.PYCAFFE)"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert real.returncode == 0, real.stderr
    assert real.stdout.split() == ["caffe.proto.caffe_pb2", "True"]
