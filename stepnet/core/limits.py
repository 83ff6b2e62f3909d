"""What a model file may read, write and allocate: one policy object (`Limits`) a Workspace holds and its child
workspaces inherit. Model files are untrusted (people run files they downloaded), so by default a model's db
paths stay under the working directory and no blob may take more than a quarter of the machine's memory.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass, field

import numpy as np

from .errors import ArgumentError, FileAccessError, OpAt, ResourceError
from .writes import refusal

FALLBACK_MAX_BLOB_BYTES = 4 << 30  # where the physical memory size cannot be read
BLOB_FLAG = "--max-blob-bytes SIZE (Python: Limits(max_blob_bytes=...))"
PATH_FLAGS = ("--file-root DIR to allow another root, or --allow-any-path to lift the confinement (Python: "
              "Workspace(limits=Limits(file_root=..., any_path=True)))")
WRITE_FLAGS = ("--max-write-files N / --max-write-bytes SIZE (Python: Limits(max_write_files=..., "
               "max_write_bytes=...))")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def default_max_blob_bytes() -> int:
    """A quarter of the machine's physical memory (4 GiB where it cannot be read)."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return FALLBACK_MAX_BLOB_BYTES
    return total // 4 if total > 0 else FALLBACK_MAX_BLOB_BYTES


@dataclass(frozen=True)
class Limits:
    """max_blob_bytes: the most bytes one blob may take (a fill, a loaded tensor, a batch, a feed).
    file_root: the directory every db path a model names (read or write) must lie under, symlinks resolved;
    None: the working directory when the Workspace is made. any_path: no confinement to a root (the write
    rules of core.writes still hold). writes: whether a model may write files at all (False where a command
    runs a model's ops only to read values, as the export commands do: they write nothing but what -o names).
    max_write_files / max_write_bytes: how many files, and how many bytes on disk, a run's models may write.
    trusted: the paths come from a program, not a model file (stepnet.compat: Caffe2 scripts are code, their
    paths their own choice): no root, no write rules, no write budget. overwrite: whether a model may replace a
    database that was there before the run (False for `stepnet run` without --overwrite: a short run never
    replaces a trained model unasked)."""
    max_blob_bytes: int = field(default_factory=default_max_blob_bytes)
    file_root: str | os.PathLike | None = None
    any_path: bool = False
    writes: bool = True
    max_write_files: int = 256
    max_write_bytes: int = 4 << 30
    trusted: bool = False
    overwrite: bool = True

    def resolved(self) -> "Limits":
        """These limits with file_root an absolute, symlink-free directory (the working directory if None)."""
        if self.max_blob_bytes < 0:
            raise ArgumentError(f"max_blob_bytes must be >= 0, got {self.max_blob_bytes}")
        root = os.path.realpath(os.fspath(self.file_root) if self.file_root is not None else os.getcwd())
        if not self.any_path and not os.path.isdir(root):
            raise ArgumentError(f"file root {os.fspath(self.file_root)!r} is not a directory")
        return self if root == self.file_root else dataclasses.replace(self, file_root=root)

    # ----------------------------------------------------------------------------------------- files
    def confine(self, path: str, where: str = "", write: bool = False) -> str:
        """path unchanged if it lies under file_root once symlinks are resolved (for a file to be created, its
        parent's); else a FileAccessError naming the path, the root and the flags that allow it (after
        `where`, e.g. the net and op). A write where `writes` is False is refused wherever the path lies."""
        if "\0" in path:
            raise FileAccessError(f"db path {path!r} holds a NUL byte, which no file name can", at=where or None)
        if write and not self.writes:
            raise FileAccessError(f"db path {path!r}: this command runs the model's ops only to compute values and "
                                  "lets no op write a file (it writes only what -o names); drop the op from the net, "
                                  "or run the model with stepnet run", at=where or None)
        if self.trusted:
            return path
        real = os.path.realpath(path)
        shown = "" if real == os.path.abspath(path) else f" (resolving to {real})"
        root = None if self.any_path else os.path.realpath(self.file_root if self.file_root is not None else
                                                           os.getcwd())
        if root is not None and not (real == root or real.startswith(root.rstrip(os.sep) + os.sep)):
            raise FileAccessError(f"db path {path!r}{shown} is outside the file root {root}: a model may read and "
                                  f"write files only under its root; pass {PATH_FLAGS}", at=where or None)
        why = refusal(real, root) if write else None
        if why is not None:
            raise FileAccessError(f"db path {path!r}{shown}: a model may not write there: {why}; see the README's "
                                  "write policy", at=where or None)
        return path

    def check_write(self, log, path: str, nbytes: int, where=None) -> None:
        """Refuse (ResourceError) a model's write of nbytes to path that would pass this run's budget of files or
        bytes on disk (log: the workspace's WriteLog)."""
        if self.trusted:
            return
        files, total = log.on_disk(path, nbytes)
        if files > self.max_write_files:
            raise ResourceError(f"db {path!r} would be file {files} this run writes, over the limit of "
                                f"{self.max_write_files} files; raise it with {WRITE_FLAGS}", at=where)
        if total > self.max_write_bytes:
            raise ResourceError(f"db {path!r} ({format_bytes(nbytes)}) would bring what this run wrote to "
                                f"{format_bytes(total)}, over the limit of {format_bytes(self.max_write_bytes)}; "
                                f"raise it with {WRITE_FLAGS}", at=where)


def check_blob(limit: int, blob: str, shape, dtype, where: str = "") -> None:
    """A ResourceError if a blob of shape and dtype would take more than limit bytes."""
    nbytes = blob_bytes(shape, dtype)
    if nbytes > limit:
        raise over_limit(blob, shape, dtype, nbytes, limit, where)


def blob_bytes(shape, dtype) -> int:
    """Bytes of an array of shape and dtype (exact: Python integers; objects count as pointers)."""
    return math.prod(int(d) for d in shape) * np.dtype(dtype).itemsize


def format_bytes(n: int) -> str:
    """'17179869184 bytes (16.0 GiB)'."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n} bytes ({n / size:.1f} {unit})"
    return f"{n} bytes"


def over_limit(blob: str, shape, dtype, nbytes: int, limit: int, where: str = "") -> ResourceError:
    """The error for a blob over the limit, naming it, its shape, dtype and bytes, the limit and the flag. where:
    the op (an OpAt: the error's place) or a text put before the message (what asked for the blob)."""
    place = where if isinstance(where, OpAt) else None
    prefix = f"{where}: " if where and place is None else ""
    dims = tuple(int(d) for d in shape)
    return ResourceError(f"{prefix}blob {blob!r} would be {dims} {np.dtype(dtype)}, {format_bytes(nbytes)}, over "
                         f"the limit of {format_bytes(limit)} per blob; raise it with {BLOB_FLAG} if the model "
                         "really needs that much", at=place)


def parse_size(text: str) -> int:
    """'512M', '8G', '1.5G', '64KiB', '1073741824' -> bytes (K, M, G, T are powers of 1024)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise ArgumentError(f"size {text!r}: expected a number of bytes, optionally with K, M, G or T "
                            "(powers of 1024), e.g. 512M, 8G or 1073741824")
    number, unit = m.group(1), _UNITS[m.group(2).upper()]
    return int(float(number) * unit) if "." in number else int(number) * unit


def check_specs(limit: int, names, specs, where: str) -> None:
    """Static form of the blob limit: refuse any inferred output (a TensorSpec) whose shape and dtype are
    known and take more than limit bytes (a shape function's output, statically or before a kernel)."""
    for name, s in zip(names, specs):
        shape = getattr(s, "shape", None)
        if shape is not None and None not in shape and s.dtype is not None:
            check_blob(limit, name, shape, s.dtype, where)


# --------------------------------------------------------------------------------------------- command line
def _size(text: str) -> int:
    import argparse

    try:
        return parse_size(text)
    except ArgumentError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_limit_flags(parser, paths: bool) -> None:
    """--max-blob-bytes SIZE, and with paths --file-root DIR and --allow-any-path, on a CLI command's parser."""
    parser.add_argument("--max-blob-bytes", type=_size, metavar="SIZE",
                        help="the most bytes one blob may take, e.g. 512M, 8G, 1073741824 (default: a quarter of "
                             "the physical memory)")
    if paths:
        parser.add_argument("--file-root", metavar="DIR",
                            help="the directory the model's db paths (Save, Load, CreateDB, ...) must lie under "
                                 "(default: the working directory)")
        parser.add_argument("--allow-any-path", action="store_true",
                            help="let the model read and write db files outside the file root (the write policy "
                                 "still holds: database files only, nothing hidden, no Python environment)")
        parser.add_argument("--overwrite", action="store_true",
                            help="let the model's Save and Checkpoint ops replace databases that were there before "
                                 "the run (without it such a run stops before it starts, naming the file)")
        parser.add_argument("--max-write-files", type=int, metavar="N",
                            help="the most files the model's ops may write in this run (default: 256)")
        parser.add_argument("--max-write-bytes", type=_size, metavar="SIZE",
                            help="the most bytes the files the model's ops write may hold in all (default: 4G)")


def limits_of(args) -> Limits:
    """The Limits a command's parsed flags ask for."""
    given = {"max_blob_bytes": args.max_blob_bytes, "max_write_files": getattr(args, "max_write_files", None),
             "max_write_bytes": getattr(args, "max_write_bytes", None)}
    if (given["max_write_files"] or 0) < 0:
        raise ArgumentError(f"--max-write-files needs a count >= 0, got {given['max_write_files']}")
    return Limits(file_root=getattr(args, "file_root", None), any_path=getattr(args, "allow_any_path", False),
                  overwrite=getattr(args, "overwrite", True), **{k: v for k, v in given.items() if v is not None})
