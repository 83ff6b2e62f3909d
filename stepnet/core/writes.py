"""What a model file may write, beyond where (Limits.confine says where): only database files, never a file that
something else would run, import or read as its configuration, and never over a file stepnet did not make.

Model files are untrusted. Caffe2 let a model's Save op write any path; a stepnet model's write is refused when
  - a directory on its way below the file root, or the file itself, is hidden (a name starting with '.': shell
    profiles, .ssh, .git hooks, .venv and .local live there);
  - it lies in a Python environment: a directory holding pyvenv.cfg on its way down, a site-packages or
    dist-packages directory, or this interpreter's prefixes and site directories (a .pth file there runs at the
    next start of Python);
  - its name says another program would run or read it: a suffix other than a database's (DB_SUFFIXES, digits
    such as ckpt.0001, or none), or a build or config file name (Makefile, Dockerfile, ...).
Where a file exists already, ops/db.py keeps it unless it is a stepnet database (minidb) or empty, so a model
never destroys a user's file. Paths a Python program passes (stepnet.compat, scripts) are that program's
choice: Limits(trusted=True) skips these rules, as it skips the confinement.

WriteLog is what a workspace (and its children) records of the files its models wrote; Limits.check_write holds
a run to its budget of files and bytes (max_write_files, max_write_bytes)."""
from __future__ import annotations

import os
import site
import sys
from dataclasses import dataclass, field

DB_SUFFIXES = frozenset({"", ".minidb", ".db", ".ckpt", ".checkpoint", ".pb", ".bin", ".dat", ".data", ".mdb",
                         ".lmdb", ".leveldb", ".ldb", ".snapshot", ".model", ".weights", ".save"})
# names without a suffix that build tools, shells and package managers read or run where they find them
RUN_NAMES = frozenset({"makefile", "gnumakefile", "dockerfile", "containerfile", "vagrantfile", "rakefile", "gemfile",
                       "justfile", "procfile", "brewfile", "jenkinsfile", "sconstruct", "sconscript", "configure",
                       "build", "workspace", "pipfile", "snakefile", "tiltfile", "earthfile", "caddyfile"})
ENV_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})


def _site_dirs() -> list[str]:
    """This interpreter's site-packages directories (global and the user's), symlinks resolved."""
    dirs = set()
    try:
        dirs.update(site.getsitepackages())
        dirs.add(site.getusersitepackages())
    except AttributeError:   # (a site module without them)
        dirs.update(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))
    return [os.path.realpath(d) for d in dirs if d]


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def refusal(real: str, root: str | None) -> str | None:
    """Why a model may not write the file at `real` (an absolute, symlink-resolved path), or None when it may.
    root: the file root it lies under (the rules look at the directories below it), or None for any path."""
    parent, name = os.path.split(real)
    below = os.path.relpath(parent, root).split(os.sep) if root else parent.split(os.sep)
    below = [part for part in below if part not in ("", ".")]
    hidden = [part for part in (*below, name) if part.startswith(".")]
    if hidden:
        return (f"{hidden[0]!r} is hidden: shell profiles, keys, repositories' hooks and Python environments live "
                "in hidden files and directories, so a model writes none")
    if any(part.lower() in ENV_DIRS for part in below) or any(_inside(real, d) for d in _site_dirs()):
        return "it lies in a Python package directory, where a file can run at the next start of Python"
    directory = parent
    while True:
        if os.path.exists(os.path.join(directory, "pyvenv.cfg")):
            return f"{directory} is a Python environment (it holds pyvenv.cfg), where a file can run at its next start"
        up = os.path.dirname(directory)
        if up == directory:
            break
        directory = up
    stem, suffix = os.path.splitext(name)
    if name.lower() in RUN_NAMES or stem.lower() in RUN_NAMES and suffix.lower() in ("", ".txt", ".in", ".am"):
        return f"{name!r} is a name build tools and package managers read or run"
    if suffix.lower() not in DB_SUFFIXES and not suffix[1:].isdigit():
        return (f"its suffix {suffix!r} is not a database's: a file so named could be run, imported or read by "
                f"another program; name the db with one of {', '.join(sorted(s for s in DB_SUFFIXES if s))}, a "
                "number, or no suffix")
    return None


@dataclass
class Written:
    """One file a model wrote: its path, its size after the last write, how many times it was written, and the
    op that wrote it last."""
    path: str
    size: int
    times: int = 1
    by: object = None


@dataclass
class WriteLog:
    """The files the models of a workspace (and of its children) wrote, in the order first written."""
    files: dict = field(default_factory=dict)

    def on_disk(self, path: str, nbytes: int) -> tuple[int, int]:
        """(files, bytes) this run will have written once `path` holds `nbytes` (a file written again counts
        once, at its new size)."""
        key = os.path.abspath(path)
        return (len(self.files) + (key not in self.files),
                sum(w.size for k, w in self.files.items() if k != key) + nbytes)

    def record(self, path: str, nbytes: int, where=None) -> None:
        key = os.path.abspath(path)
        entry = self.files.get(key)
        if entry is None:
            self.files[key] = Written(os.path.normpath(path), nbytes, 1, where)
        else:
            entry.size, entry.times, entry.by = nbytes, entry.times + 1, where

    def has(self, path: str) -> bool:
        """Whether this run wrote path already."""
        return os.path.abspath(path) in self.files

    def __iter__(self):
        return iter(self.files.values())

    def __len__(self):
        return len(self.files)
