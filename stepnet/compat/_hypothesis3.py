"""Hypothesis 3's API, which Caffe2-era test files were written for, on the Hypothesis installed (6 and later).

adapt() makes, in the imported hypothesis package: `settings(...)` and `settings.register_profile(...)` drop the
settings Hypothesis 4 and later removed (REMOVED_SETTINGS: `timeout=`, `min_satisfying_examples=`, ...), which
Hypothesis 3 accepted and later releases refuse; `lists`, `text`, `binary` and `sets` drop `average_size` (and
`alphabet=None`, Hypothesis 3's "any character"); `extra.numpy.arrays` casts each element to the array's dtype
(Hypothesis 3 assigned elements, `result[i] = v`, so a float64 strategy filled a float32 array; Hypothesis 6
refuses an element the dtype cannot hold exactly); `sampled_from` takes dict views. install() does it when the
program first imports hypothesis (a sys.meta_path hook), at once where it is imported already:
`python -m stepnet.compat` installs it, so a user's old test files run as they did. Under pytest, whose
assertion-rewriting finder loads hypothesis (a pytest plugin's package) ahead of any finder installed before
it, a pytest plugin adapts it instead (compat._pytest_hypothesis3, named in PYTEST_PLUGINS) once pytest's import
hook is in place."""
from __future__ import annotations

import collections.abc
import importlib.abc
import importlib.util
import sys

REMOVED_SETTINGS = ("timeout", "min_satisfying_examples", "perform_health_check", "max_iterations", "max_shrinks",
                    "strict", "use_coverage", "average_list_length", "max_mutations")


def _without_average_size(strategy):
    def call(*args, average_size=None, **kwargs):
        if "alphabet" in kwargs and kwargs["alphabet"] is None:
            del kwargs["alphabet"]
        return strategy(*args, **kwargs)
    return call


def adapt() -> None:
    """Hypothesis 3's arguments accepted by the imported hypothesis (see the module's docstring); once."""
    import hypothesis
    import hypothesis.extra.numpy as hnp
    import hypothesis.strategies as st
    import numpy as np

    settings = hypothesis.settings
    if getattr(settings, "_stepnet_hypothesis3", False):
        return
    init = settings.__init__

    def __init__(self, parent=None, **kwargs):
        for name in REMOVED_SETTINGS:
            kwargs.pop(name, None)
        init(self, parent, **kwargs)

    settings.__init__ = __init__
    settings._stepnet_hypothesis3 = True
    for name in ("lists", "text", "binary", "sets"):
        setattr(st, name, _without_average_size(getattr(st, name)))
    arrays = hnp.arrays

    def arrays_(dtype, shape, elements=None, **kwargs):
        kind = np.dtype(dtype) if not isinstance(dtype, st.SearchStrategy) else None
        if elements is not None and kind is not None and kind.kind in "iuf" and kind != np.dtype(np.float64):
            elements = elements.map(lambda v: np.array(v).astype(kind)[()])
        return arrays(dtype, shape, elements=elements, **kwargs)

    hnp.arrays = arrays_
    sampled_from = st.sampled_from
    views = (collections.abc.KeysView, collections.abc.ValuesView, collections.abc.ItemsView)

    def sampled_from_(elements):
        return sampled_from(list(elements) if isinstance(elements, views) else elements)

    st.sampled_from = sampled_from_


class _WhenImported(importlib.abc.MetaPathFinder):
    """Finds `hypothesis` with the finders after it, once, and runs adapt() right after the package loads."""

    def find_spec(self, name, path=None, target=None):
        if name != "hypothesis":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            adapt()
        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """adapt() now where hypothesis is imported, else when the program first imports it."""
    if "hypothesis" in sys.modules:
        adapt()
    elif not any(isinstance(f, _WhenImported) for f in sys.meta_path):
        sys.meta_path.insert(0, _WhenImported())
