"""Caffe2's other db types: lmdb and leveldb, read and written through their libraries (the `databases` extra:
lmdb, plyvel). Each is a directory the library manages (lmdb: data.mdb and lock.mdb; leveldb: CURRENT,
MANIFEST-*, *.ldb/*.sst, logs). A db opened for reading has MiniDB's interface (len, key(i), value(i),
where(i)), read by a cursor that moves forward (reading in order, as Caffe2's DBReader does, costs one step a
record). A db is written whole into a new directory beside its path, then renamed into place: readers see the
old db or the new one, never a part.

What these libraries trust: lmdb memory-maps its file and follows its page numbers, so a corrupt or crafted
data.mdb can crash the process (LMDB has no checksums); leveldb checks block checksums (opened with
paranoid_checks). Read lmdb dbs only from sources you would run code from; minidb is the format stepnet checks
record by record."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Iterable

from ..core.errors import FileFormatError, StepnetError
from ..core.extras import install_hint

KINDS = {"minidb": "minidb", "MiniDB": "minidb", "lmdb": "lmdb", "leveldb": "leveldb"}
LMDB_FILES = frozenset({"data.mdb", "lock.mdb"})
LMDB_PAGE = 4096


def lmdb_map_size(records: list) -> int:
    """The address space an lmdb being written reserves: enough for the records with a page of overhead each
    and a page-aligned value (large values take whole overflow pages), plus 1 MiB. A fixed huge map (1 TiB, as
    Caffe2's examples use) fails under a memory limit (ulimit -v) before anything is written."""
    need = sum(len(k) + len(v) + 2 * LMDB_PAGE for k, v in records)
    return need + (1 << 20)


def _library(module: str, kind: str):
    try:
        return __import__(module)
    except ImportError:
        raise StepnetError(f"{kind} dbs need the {module} package: {install_hint('databases')}") from None


def is_leveldb_file(name: str) -> bool:
    return (name in ("CURRENT", "LOCK", "LOG", "LOG.old") or name.startswith("MANIFEST-")
            or name.endswith((".log", ".ldb", ".sst", ".dbtmp")))


def looks_like(path: str, kind: str) -> bool:
    """Whether path is a directory holding a db of this kind (lmdb: data.mdb; leveldb: CURRENT and a manifest),
    and nothing its library would not have made."""
    try:
        names = os.listdir(path) if os.path.isdir(path) and not os.path.islink(path) else None
    except OSError:
        return False
    if not names:
        return False
    if kind == "lmdb":
        return "data.mdb" in names and set(names) <= LMDB_FILES
    return ("CURRENT" in names and any(n.startswith("MANIFEST-") for n in names)
            and all(is_leveldb_file(n) for n in names))


class _Shared:
    """A library handle (lmdb environment, leveldb db) that every reader of the same directory in this process
    shares: neither library opens one db twice in a process. Kept while a reader holds it; a db replaced since
    (a new directory at the path) is opened anew."""
    _open: "weakref.WeakValueDictionary[tuple, _Shared]" = weakref.WeakValueDictionary()

    def __init__(self, handle):
        self.handle = handle

    @classmethod
    def of(cls, path: str, kind: str, opener) -> "_Shared":
        st = os.stat(path)
        key = (kind, st.st_dev, st.st_ino)
        shared = cls._open.get(key)
        if shared is None:
            shared = cls._open[key] = cls(opener(path))
        return shared


class _Cursor:
    """Records i = 0, 1, ... of a db read by a forward cursor; key(i)/value(i) for another i than the next one
    start again from the first record."""

    def __init__(self, path: str, kind: str, count: int):
        self.path, self.kind, self.count, self.pos = path, kind, count, -1
        self._key = self._value = b""

    def __len__(self) -> int:
        return self.count

    def _at(self, i: int) -> None:
        if not 0 <= i < self.count:
            raise IndexError(f"record {i} of {self.count}")
        if i != self.pos:
            if i < self.pos or self.pos < 0:
                self._first()
                self.pos = 0
            while self.pos < i:
                self._next()
                self.pos += 1
            self._key, self._value = self._current()

    def key(self, i: int) -> str:
        self._at(i)
        return self._key.decode("utf-8", "backslashreplace")

    def key_bytes(self, i: int) -> bytes:
        """Key i as the db holds it."""
        self._at(i)
        return bytes(self._key)

    def value(self, i: int) -> bytes:
        self._at(i)
        return self._value

    def where(self, i: int) -> str:
        return f"{self.path}: record {self.key(i)!r} (No.{i} of the {self.kind} db)"

    def __iter__(self):
        for i in range(self.count):
            yield self.key(i), self.value(i)


class LMDB(_Cursor):
    """An lmdb environment opened read-only, without its lock file (nothing in the directory is written)."""

    def __init__(self, path: str):
        lmdb = _library("lmdb", "lmdb")
        if not os.path.isdir(path) or not os.path.isfile(os.path.join(path, "data.mdb")):
            raise FileFormatError(f"{path}: no lmdb db there (a directory holding data.mdb)")
        try:
            self.shared = _Shared.of(path, "lmdb", lambda p: lmdb.open(p, readonly=True, lock=False, subdir=True,
                                                                       readahead=False, max_dbs=0))
            self.env = self.shared.handle
            self.txn = self.env.begin(buffers=False)
            self.cursor = self.txn.cursor()
            count = self.env.stat()["entries"]
        except lmdb.Error as e:
            raise FileFormatError(f"{path}: not an lmdb db lmdb can read ({e})") from None
        super().__init__(path, "lmdb", count)

    def _first(self):
        self.cursor.first()

    def _next(self):
        self.cursor.next()

    def _current(self):
        return self.cursor.key(), self.cursor.value()


class LevelDB(_Cursor):
    """A leveldb opened with paranoid checks; its records counted by one pass over the keys."""

    def __init__(self, path: str):
        plyvel = _library("plyvel", "leveldb")
        if not looks_like(path, "leveldb"):   # leveldb's open writes LOCK and LOG into the directory it is given
            raise FileFormatError(f"{path}: no leveldb db there (a directory holding CURRENT and MANIFEST-* and only "
                                  "leveldb's files)")
        try:
            self.shared = _Shared.of(path, "leveldb", lambda p: plyvel.DB(p, create_if_missing=False,
                                                                          paranoid_checks=True))
            self.db = self.shared.handle
            count = sum(1 for _ in self.db.iterator(include_value=False))
        except plyvel.Error as e:
            raise FileFormatError(f"{path}: not a leveldb db leveldb can read ({e})") from None
        self.it = None
        super().__init__(path, "leveldb", count)

    def _first(self):
        self.it = self.db.iterator()
        self._pair = next(self.it)

    def _next(self):
        self._pair = next(self.it)

    def _current(self):
        return self._pair


def open_db(path: str, kind: str):
    """The db at path for reading: a MiniDB, LMDB or LevelDB (kind as in KINDS' values)."""
    if kind == "lmdb":
        return LMDB(path)
    if kind == "leveldb":
        return LevelDB(path)
    from .minidb import MiniDB
    return MiniDB(path)


def exists(path: str, kind: str) -> bool:
    """Whether a db of this kind can be opened for reading at path (DBExists)."""
    if kind == "minidb":
        return os.path.isfile(path) and os.access(path, os.R_OK)
    return looks_like(path, kind)


def replaceable(path: str, kind: str) -> bool:
    """Whether a model may write a db of this kind at path: nothing there, an empty directory, or a db of that
    kind (a directory holding only what its library makes)."""
    if not os.path.lexists(path):
        return True
    if os.path.isdir(path) and not os.path.islink(path):
        with contextlib.suppress(OSError):
            if not os.listdir(path):
                return True
    return looks_like(path, kind)


def write_db(path: str, kind: str, records: Iterable[tuple[str, bytes]]) -> int:
    """Write the records as a new lmdb or leveldb db at path (replacing a db of that kind there); returns the
    bytes the new directory holds. Written into a hidden directory beside path, then renamed into place."""
    target = Path(path)
    try:
        tmp = tempfile.mkdtemp(prefix=f".{target.name[:32]}.", suffix=".tmpdb", dir=target.parent)
    except OSError as e:
        raise FileFormatError(f"{path}: cannot write the {kind} db ({e.strerror or e})") from None
    try:
        if kind == "lmdb":
            lmdb = _library("lmdb", "lmdb")
            records = [(k.encode("utf-8") if isinstance(k, str) else k, v) for k, v in records]
            try:
                env = lmdb.open(tmp, map_size=lmdb_map_size(records), subdir=True, max_dbs=0)
                try:
                    with env.begin(write=True) as txn:
                        for key, value in records:
                            txn.put(key, value)
                finally:
                    env.close()
            except lmdb.Error as e:   # (lmdb's MemoryError for ENOMEM, MapFullError, ...: all lmdb.Error)
                raise FileFormatError(f"{path}: cannot write the lmdb db ({type(e).__name__}: {e})") from None
            os.unlink(os.path.join(tmp, "lock.mdb"))
        else:
            plyvel = _library("plyvel", "leveldb")
            try:
                db = plyvel.DB(tmp, create_if_missing=True, error_if_exists=False)
                try:
                    with db.write_batch() as batch:
                        for key, value in records:
                            batch.put(key.encode("utf-8") if isinstance(key, str) else key, value)
                finally:
                    db.close()
            except plyvel.Error as e:
                raise FileFormatError(f"{path}: cannot write the leveldb db ({type(e).__name__}: {e})") from None
        size = sum(f.stat().st_size for f in Path(tmp).iterdir() if f.is_file())
        _swap_in(tmp, str(target))
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError):
            raise FileFormatError(f"{path}: cannot write the {kind} db ({e.strerror or e})") from None
        raise
    return size


def _swap_in(tmp: str, path: str) -> None:
    """Rename the new db directory to path; an old one there is moved aside first and removed after."""
    if not os.path.lexists(path):
        os.rename(tmp, path)
        return
    old = tempfile.mkdtemp(prefix=f".{os.path.basename(path)[:32]}.", suffix=".olddb", dir=os.path.dirname(path))
    os.rmdir(old)
    os.rename(path, old)
    try:
        os.rename(tmp, path)
    except BaseException:
        os.rename(old, path)
        raise
    shutil.rmtree(old, ignore_errors=True)
