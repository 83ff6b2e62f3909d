"""Where `python -m stepnet.compat.models.download -i MODEL` installs a Caffe2 model, and how the installed model
reads its nets.

Caffe2 installed a model into its own package (caffe2/python/models/MODEL/, with __init__.py a link to
__sym_init__.py); stepnet never writes into its installed package: a model goes to install_dir()/MODEL
($STEPNET_CACHE_DIR/models, else $XDG_CACHE_HOME/stepnet/models, else ~/.cache/stepnet/models), and the models
package lists that folder on its `__path__`, so that `caffe2.python.models.MODEL` (= `stepnet.compat.models.MODEL`)
imports from there. The folder holds the two downloaded nets and PACKAGE_INIT, a fixed three-line __init__.py that
reads them with read_nets: `init_net` and `predict_net`, NetDefs, as Caffe2's __sym_init__.py gives them.
"""
from __future__ import annotations

import os
from pathlib import Path

from ...caffe2_pb2 import NetDef

NET_FILES = ("predict_net.pb", "init_net.pb")       # Caffe2's file names, in its download order

PACKAGE_INIT = ('"""A Caffe2 model installed by stepnet.compat.models.download: its init_net and predict_net."""\n'
                "from stepnet.compat.models._installed import read_nets\n\n"
                "init_net, predict_net = read_nets(__file__)\n")


def install_dir() -> Path:
    """The folder installed models live in (it need not exist)."""
    explicit = os.environ.get("STEPNET_CACHE_DIR")
    if explicit:
        return Path(explicit) / "models"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "stepnet" / "models"


_ADDED: list[str] = []      # the folder add_to_path last put on a __path__


def add_to_path(package_path: list) -> None:
    """Put install_dir() last on a package's __path__, so that installed models import as its modules (in place
    of the folder an earlier call put there, should the install folder have changed since)."""
    folder = str(install_dir())
    for old in _ADDED:
        if old != folder and old in package_path:
            package_path.remove(old)
    _ADDED[:] = [folder]
    if folder not in package_path:
        package_path.append(folder)


def read_net(path: Path, shown_as=None) -> NetDef:
    """A NetDef read from a downloaded file: one FileFormatError naming the file (or shown_as) if it is not one."""
    from ...io.validate import parse_checked
    return parse_checked(NetDef(), Path(path).read_bytes(), str(shown_as or path))


def read_nets(package_init: str) -> tuple[NetDef, NetDef]:
    """(init_net, predict_net) of the model installed in the folder of package_init (its __init__.py)."""
    folder = Path(package_init).parent
    return read_net(folder / "init_net.pb"), read_net(folder / "predict_net.pb")
