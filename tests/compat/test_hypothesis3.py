"""Hypothesis 3's API under `python -m stepnet.compat` (stepnet.compat._hypothesis3): a Caffe2-era test file
that passes the settings and strategy arguments later Hypothesis releases removed runs as it did, while the
same file under plain pytest fails on them; and the suite's conftest takes the same adaptation."""
import os
import subprocess
import sys
import textwrap

import pytest

# Written as Caffe2's tests were, against Hypothesis 3: removed settings, average_size, float64 elements in a
# float32 array, a dict view to sample from. Each test checks what it drew, so a wrong adaptation fails it.
OLD_TEST = textwrap.dedent("""\
    import numpy as np
    import hypothesis.extra.numpy as hnp
    import hypothesis.strategies as st
    from hypothesis import given, settings

    settings.register_profile("old", settings(timeout=5, min_satisfying_examples=1, max_examples=5,
                                              derandomize=True, deadline=None, database=None))
    settings.load_profile("old")
    KINDS = {"relu": 0, "tanh": 1}


    @settings(max_examples=5, timeout=10, perform_health_check=False, max_shrinks=0)
    @given(xs=st.lists(st.integers(0, 9), min_size=1, average_size=3, max_size=6),
           x=hnp.arrays(np.float32, 4, elements=st.floats(-1, 1)),
           kind=st.sampled_from(KINDS.keys()),
           name=st.text(alphabet=None, average_size=2, max_size=3))
    def test_old_arguments(xs, x, kind, name):
        assert 1 <= len(xs) <= 6 and all(0 <= v <= 9 for v in xs)
        assert x.dtype == np.float32 and x.shape == (4,) and np.all(np.abs(x) <= 1)
        assert kind in KINDS
        assert isinstance(name, str) and len(name) <= 3


    if __name__ == "__main__":
        test_old_arguments()
        print("ran")
""")


def _run(tmp_path, *head):
    (tmp_path / "test_old_hypothesis.py").write_text(OLD_TEST)
    env = {k: v for k, v in os.environ.items() if k != "CAFFE2_HYPOTHESIS_PROFILE"}
    return subprocess.run([sys.executable, *head, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "test_old_hypothesis.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)


def test_an_old_hypothesis_test_file_runs_under_python_m_stepnet_compat(tmp_path):
    done = _run(tmp_path, "-m", "stepnet.compat")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "1 passed" in done.stdout and "warning" not in done.stdout.lower()   # (hypothesis loaded by pytest's hook)


def test_an_old_hypothesis_test_file_runs_as_a_script_under_python_m_stepnet_compat(tmp_path):
    """A script: the import hook adapts hypothesis when the file first imports it."""
    (tmp_path / "test_old_hypothesis.py").write_text(OLD_TEST)
    done = subprocess.run([sys.executable, "-m", "stepnet.compat", "test_old_hypothesis.py"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ran", done.stderr[-3000:]


def test_the_same_file_fails_under_plain_pytest(tmp_path):
    """What the adaptation is for: Hypothesis 6 refuses Hypothesis 3's arguments."""
    done = _run(tmp_path)
    assert done.returncode != 0
    assert "timeout" in done.stdout + done.stderr


def test_install_adapts_at_once_where_hypothesis_is_imported_and_once_only():
    code = textwrap.dedent("""\
        import sys
        import hypothesis
        from stepnet.compat import _hypothesis3
        init = hypothesis.settings.__init__
        _hypothesis3.install()
        once = hypothesis.settings.__init__
        _hypothesis3.install()
        assert init is not once and hypothesis.settings.__init__ is once
        assert not any(isinstance(f, _hypothesis3._WhenImported) for f in sys.meta_path)
        assert hypothesis.settings(timeout=3, max_examples=2).max_examples == 2
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


@pytest.mark.parametrize("first", ["hypothesis", "hypothesis.strategies"])
def test_the_hook_adapts_when_the_program_first_imports_hypothesis(first):
    code = textwrap.dedent(f"""\
        import sys
        from stepnet.compat import _hypothesis3
        _hypothesis3.install()
        assert "hypothesis" not in sys.modules
        import {first}
        import hypothesis
        assert getattr(hypothesis.settings, "_stepnet_hypothesis3", False)
        assert not any(isinstance(f, _hypothesis3._WhenImported) for f in sys.meta_path)
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
