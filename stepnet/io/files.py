"""Opening the files a user or a model names: regular files only, checked before anything is read (and the bytes
of the .npz archives stepnet writes: `npz_bytes`).

A path may name a FIFO (opening it blocks until a writer comes), a character device (/dev/zero never ends), a
directory or a socket; stepnet refuses them all, and a file larger than what the reader can take, before it
reads a byte. Every file stepnet reads (models, minidb files, .npy/.npz feeds, images) is opened here.
"""
from __future__ import annotations

import os
import reprlib
import stat
from typing import BinaryIO

from ..core.errors import ArgumentError, FileFormatError

PROTOBUF_LIMIT = 2**31 - 1  # protobuf parses no message of 2 GiB or more
TEXT_LIMIT = 16 * 2**20     # text-format models: Python's protobuf text parser takes up to ~140 times a string's size

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def describe_size(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def quoted(value, limit: int = 80) -> str:
    """repr(value) for a message, cut (strings to `limit` characters, long numbers, deep or long containers):
    what a file holds can be any size."""
    cut = reprlib.Repr()
    cut.maxlevel, cut.maxstring, cut.maxother, cut.maxlong = 3, limit, limit, 40
    try:
        return cut.repr(value)
    except ValueError:   # an int of more digits than Python turns into text
        return f"<a {type(value).__name__} too long to show>"


def _kind(mode: int) -> str:
    return next((text for test, text in _KINDS if test(mode)), "not a regular file")


def over(path, what: str, size: str, limit: int) -> FileFormatError:
    why = {PROTOBUF_LIMIT: " (protobuf parses no message of 2 GiB or more)",
           TEXT_LIMIT: " for text (protobuf's Python text parser takes up to about 140 times a file's size in memory; "
                       "convert it to a binary .pb, e.g. protoc --encode=caffe2.NetDef caffe2.proto < IN > OUT)"}
    return FileFormatError(f"{path}: {what} is {size}, over the limit of {describe_size(limit)}{why.get(limit, '')}")


def open_fd(path, what: str = "file", limit: int | None = None, missing: str = "") -> tuple[int, int]:
    """(descriptor, size) of a regular file opened for reading; FileFormatError naming path and `what` for a
    missing file (plus `missing`, a hint), anything that is not a regular file, or one over `limit` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise FileFormatError(f"{path}: no such file{missing}") from None
    except OSError as e:
        if e.errno == getattr(os, "ENXIO", None):  # a socket, or a FIFO nobody writes to on some systems
            raise FileFormatError(f"{path}: {what} is not a regular file; stepnet reads only regular files") from None
        raise FileFormatError(f"{path}: cannot read {what} ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileFormatError(f"{path}: {what} is not a regular file ({_kind(st.st_mode)}); stepnet reads "
                                  "only regular files")
        if limit is not None and st.st_size > limit:
            exact = f" ({st.st_size} bytes)" if st.st_size >= 1024 else ""
            raise over(path, what, describe_size(st.st_size) + exact, limit)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def open_regular(path, what: str = "file", limit: int | None = None, missing: str = "") -> BinaryIO:
    """A regular file opened for reading in binary (open_fd's checks), for readers that stream or map it."""
    fd, _ = open_fd(path, what, limit, missing)
    return os.fdopen(fd, "rb")


def read_regular(path, what: str = "file", limit: int | None = None, missing: str = "") -> bytes:
    """The bytes of a regular file (open_fd's checks). Never reads more than `limit` bytes, even from a file
    that grows while it is read or that reports size 0 (as /proc files do)."""
    fd, size = open_fd(path, what, limit, missing)
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read() if limit is None else f.read(limit + 1)
        except OSError as e:
            raise FileFormatError(f"{path}: cannot read {what} ({e.strerror})") from None
    if limit is not None and len(data) > limit:
        raise over(path, what, "larger than it said when opened", limit)
    return data


def npz_bytes(arrays) -> bytes:
    """An .npz archive of {name: array} as np.savez writes it, for any names np.savez takes (np.savez(file,
    **arrays) takes a blob named `file` for its own parameter and one named `allow_pickle` as a flag), without a
    pickle: strings are stored as numpy strings ('S' for bytes, which drops trailing NULs; 'U' otherwise).
    Names come from models: one that cannot name a member safely (npz_member) is an ArgumentError."""
    import io
    import zipfile

    import numpy as np

    members = [(npz_member(name), name, value) for name, value in arrays.items()]   # every name checked first
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
        for member, name, value in members:
            with z.open(member, "w", force_zip64=True) as out:
                np.lib.format.write_array(out, _no_objects(name, np.asanyarray(value)), allow_pickle=False)
    return buf.getvalue()


def npz_member(name: str) -> str:
    """name + '.npy', the member of blob `name` in an .npz, when a tool extracting the archive writes it as an
    ordinary file inside the folder it extracts to: parts separated by '/' (Caffe2's scopes: 'gpu_0/fc_w'), as
    np.savez keeps them, but no absolute path, no '..', no hidden file, no backslash, nothing unprintable."""
    member = f"{name}.npy"
    why = ("it holds a backslash" if "\\" in name else
           "it holds a control, format or other unprintable character" if not name.isprintable() else
           f"{len(member.encode())} bytes is over 255" if len(member.encode()) > 255 else
           "a part of it is empty or starts with '.' (an absolute path, '..', a hidden file)"
           if any(not part or part.startswith(".") for part in name.split("/")) else "")
    if why:
        shown = repr(name) if len(name) <= 80 else repr(name[:77]) + "..."
        raise ArgumentError(f"blob {shown} cannot name a member of an .npz archive: {why}")
    return member


def _no_objects(name: str, arr):
    """arr with Python strings as numpy strings; an ArgumentError for any other Python object (a pickle)."""
    import numpy as np

    if not arr.dtype.hasobject:
        return arr
    items = arr.reshape(-1).tolist()
    if all(isinstance(v, bytes) for v in items):
        return np.array(items, dtype=bytes).reshape(arr.shape)
    if all(isinstance(v, (str, bytes)) for v in items):
        return np.array([v.decode("utf-8", "backslashreplace") if isinstance(v, bytes) else v for v in items],
                        dtype=str).reshape(arr.shape)
    kinds = ", ".join(sorted({type(v).__name__ for v in items} - {"str", "bytes"}))
    raise ArgumentError(f"blob {name!r} holds Python objects ({kinds}), which an .npz holds only as pickles; "
                        "stepnet writes none")


def looks_like_text(data: bytes) -> bool:
    """Whether a file's first bytes read as protobuf text (UTF-8, no control bytes but whitespace, a field name
    first), as a .pbtxt saved under a .pb name does."""
    head = bytes(data[:4096])
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        text = head[:-4].decode("utf-8", "ignore") if len(head) == 4096 else ""
    stripped = text.lstrip()
    return bool(stripped) and (stripped[0].isalpha() or stripped[0] == "#") and all(
        c.isprintable() or c in "\t\n\r" for c in text)
