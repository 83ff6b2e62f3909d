"""`import caffe2.python.X` and `caffe2.proto.Y` resolving to stepnet, so that a Caffe2 program runs unchanged.

    from stepnet.compat import alias
    alias.install()                      # from here on, caffe2.python.core is stepnet.compat.core

`caffe2`, `caffe2.python` and `caffe2.proto` become small packages of their own; each module under them is
the stepnet module of the same role (`caffe2.python.core` *is* `stepnet.compat.core`: one module, one state),
`caffe2.proto.caffe2_pb2` is stepnet's schema module, and Caffe1's `caffe.proto.caffe_pb2` (what caffe_translator
reads) is stepnet's compiled copy of Caffe's caffe.proto, unless Caffe1's own `caffe` package is installed
(then `caffe` is that package, whose caffe_pb2 is the same schema). The `roots` given to install are folders
holding `caffe2/python/...`: a module file there (`X.py`) wins over stepnet's module of that name, so that Caffe2's
own suite checks stepnet with Caffe2's own pure-Python test helpers (test_util, hypothesis_test_util, ...) rather
than stepnet's; stepnet's packages win over a root's folders; a name stepnet lacks is looked for under the roots
too, and otherwise fails as a plain ModuleNotFoundError naming it. Installing is the caller's choice: nothing in
stepnet installs it on import.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path

PACKAGES = ("caffe2", "caffe2.python", "caffe2.proto", "caffe", "caffe.proto")
PROTO = {"caffe2_pb2": "stepnet.caffe2_pb2", "hsm_pb2": "stepnet.hsm_pb2", "metanet_pb2": "stepnet.caffe2_pb2",
         "caffe2_legacy_pb2": "stepnet.caffe2_pb2"}
CAFFE1 = {"caffe.proto.caffe_pb2": "stepnet.caffe_pb2"}   # Caffe1's schema, read by caffe_translator


def target_of(name: str) -> str | None:
    """The stepnet module that stands for Caffe2 module `name`, if stepnet has one."""
    if name.startswith("caffe2.python."):
        target = "stepnet.compat." + name[len("caffe2.python."):]
    elif name.startswith("caffe2.proto."):
        target = PROTO.get(name[len("caffe2.proto."):])
    else:
        target = CAFFE1.get(name)
    if target is None:
        return None
    try:
        return target if importlib.util.find_spec(target) is not None else None
    except ModuleNotFoundError:   # a parent package stepnet lacks
        return None


class _Alias(importlib.abc.Loader):
    """Loads a name as another, already existing module: the import system returns sys.modules[name] after
    exec_module, which is the target itself."""

    def __init__(self, target: str | None):
        self.target = target

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        if self.target is None:    # one of the PACKAGES: an empty package
            return
        sys.modules[module.__name__] = importlib.import_module(self.target)


class Finder(importlib.abc.MetaPathFinder):
    """The meta path finder for the caffe2 and caffe namespaces (install() puts one first on sys.meta_path)."""

    def __init__(self, roots=()):
        self.roots = [Path(r) for r in roots]

    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top not in ("caffe2", "caffe") or (top == "caffe" and _real_caffe()):
            return None
        if name in PACKAGES:
            spec = importlib.machinery.ModuleSpec(name, _Alias(None), is_package=True)
            spec.submodule_search_locations = [str(r.joinpath(*name.split("."))) for r in self.roots]
            return spec
        parts = name.split(".")
        for root in self.roots:   # a root's module file wins: Caffe2's suite checks stepnet with Caffe2's own helpers
            file = root.joinpath(*parts).with_suffix(".py")
            if file.is_file():
                return importlib.util.spec_from_file_location(name, file)
        stepnet_name = target_of(name)
        if stepnet_name is not None:
            return importlib.machinery.ModuleSpec(name, _Alias(stepnet_name))
        for root in self.roots:   # a module stepnet does not provide, from a root (e.g. Caffe2's test helpers)
            base = root.joinpath(*parts)
            for file, package in ((base / "__init__.py", True), (base.with_suffix(".py"), False)):
                if file.is_file():
                    return importlib.util.spec_from_file_location(
                        name, file, submodule_search_locations=[str(base)] if package else None)
            if base.is_dir():     # a folder without __init__.py: a namespace package, as Python 3 makes it
                spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
                spec.submodule_search_locations = [str(base)]
                return spec
        return None


def _real_caffe() -> bool:
    """Whether Caffe1's own Python package (pycaffe) is installed: then `caffe` is it, and stays it."""
    return importlib.machinery.PathFinder.find_spec("caffe") is not None


def install(roots=()) -> Finder:
    """Make `caffe2.*` (and `caffe.proto.caffe_pb2`) resolve to stepnet (and to files under `roots`) in this
    process; idempotent: a second call adds its roots to the finder already installed. Returns the finder."""
    for finder in sys.meta_path:
        if isinstance(finder, Finder):
            finder.roots.extend(Path(r) for r in roots if Path(r) not in finder.roots)
            return finder
    finder = Finder(roots)
    sys.meta_path.insert(0, finder)
    return finder


def uninstall() -> None:
    """Remove the finder and every caffe2.* and caffe.* module it made (the stepnet modules themselves stay
    imported)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, Finder)]
    for name in [n for n in sys.modules if n.partition(".")[0] in ("caffe2", "caffe")]:
        del sys.modules[name]

