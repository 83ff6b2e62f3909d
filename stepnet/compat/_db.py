"""`workspace.C`'s db objects (Caffe2's `db::DB` bindings): `C.create_db(db_type, source, mode)` opens a minidb
file (or an lmdb / leveldb db, through stepnet's io layer and their libraries) as a `DB`; a DB in `Mode.write`
or `Mode.new` gives transactions (`put(key, value)`, `commit()`, committed when dropped), one in `Mode.read`
gives cursors (`valid()`, `key()`, `value()`, `next()`, `seek_to_first()`). Keys and values are bytes.

minidb's write mode adds records at the end of the file, its new mode starts an empty file, as Caffe2's minidb
opens its file ("ab" / "wb"). An lmdb or leveldb db is written whole by io.kvdb, so a commit there rewrites the
db with the records it held plus the new ones. A db_type stepnet has no db for gives None, as Caffe2's registry
lookup does.
"""
from __future__ import annotations

import enum
import os

from ..core.errors import ArgumentError
from ..io import kvdb, minidb
from .errors import caffe2_errors


class Mode(enum.IntEnum):
    """db::Mode: read an existing db, write (add to) one, or start a new one."""
    read = 0
    write = 1
    new = 2


def registered_dbs() -> list:
    """The db types create_db opens (Caffe2's Caffe2DBRegistry keys that stepnet has)."""
    return sorted(kvdb.KINDS)


def _records(kind: str, path: str) -> list:
    """Every (key bytes, value) of the db at path, or none when nothing is there."""
    if not os.path.lexists(path):
        return []
    db = kvdb.open_db(path, kind)
    return [(db.key_bytes(i), db.value(i)) for i in range(len(db))]


def _as_bytes(value, what: str) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"a db {what} is bytes (or str), got {type(value).__name__}")


class Transaction:
    """Writes to a DB: `put` collects records, `commit` writes them (and is called when the transaction is
    dropped, as Caffe2's destructor commits)."""

    def __init__(self, db: "DB"):
        self._db, self._pending = db, []

    def put(self, key, value) -> None:
        self._pending.append((_as_bytes(key, "key"), _as_bytes(value, "value")))

    @caffe2_errors
    def commit(self) -> None:
        pending, self._pending = self._pending, []
        if pending:
            self._db._write(pending)

    def __del__(self):
        try:
            self.commit()
        except Exception:   # noqa: BLE001 - nothing can be raised from a finalizer; commit() first to see it
            pass


class Cursor:
    """Reads a DB's records in order from the first: `valid()` until the end is passed."""

    def __init__(self, db):
        self._db, self._i = db, 0

    def supports_seek(self) -> bool:
        """Whether the db can seek to a key (lmdb, leveldb; minidb cannot)."""
        return not isinstance(self._db, minidb.MiniDB)

    def seek_to_first(self) -> None:
        self._i = 0

    def next(self) -> None:  # noqa: A003 - Caffe2's name
        self._i += 1

    def valid(self) -> bool:
        return self._i < len(self._db)

    def _check(self) -> None:
        if not self.valid():
            raise RuntimeError("[enforce fail] Cursor is at invalid location!")

    def key(self) -> bytes:
        self._check()
        return self._db.key_bytes(self._i)

    def value(self) -> bytes:
        self._check()
        return self._db.value(self._i)


class DB:
    """One db opened by create_db."""

    def __init__(self, kind: str, source: str, mode: Mode):
        self.kind, self.source, self.mode = kind, source, Mode(mode)
        self._open = True
        if self.mode is Mode.new:
            self._start_empty()
        elif self.mode is Mode.read:
            kvdb.open_db(source, kind)      # fails now, as Caffe2 fails to open, when nothing readable is there
        elif kind == "minidb":
            minidb.append_records(source, [])   # the file exists from here on, as fopen("ab") makes it

    def _start_empty(self) -> None:
        if self.kind == "minidb":
            minidb.write_records(self.source, [])
        else:
            kvdb.write_db(self.source, self.kind, [])

    def _live(self, want: str) -> None:
        if not self._open:
            raise RuntimeError(f"the db {self.source!r} is closed")
        if (want == "read") != (self.mode is Mode.read):
            raise RuntimeError(f"[enforce fail] a db opened in {self.mode.name} mode cannot "
                               f"{'give a cursor' if want == 'read' else 'write'} (mode_ is {self.mode.name})")

    def _write(self, records: list) -> None:
        self._live("write")
        if self.kind == "minidb":
            minidb.append_records(self.source, records)
        else:
            kvdb.write_db(self.source, self.kind, _records(self.kind, self.source) + records)

    def new_transaction(self) -> Transaction:
        self._live("write")
        return Transaction(self)

    @caffe2_errors
    def new_cursor(self) -> Cursor:
        self._live("read")
        return Cursor(kvdb.open_db(self.source, self.kind))

    def close(self) -> None:
        self._open = False


@caffe2_errors
def create_db(db_type: str, source: str, mode) -> DB | None:
    """The db of db_type at source opened in mode (a Mode); None for a db_type stepnet has no db for."""
    if not isinstance(db_type, str) or not isinstance(source, str):
        raise TypeError("create_db(db_type: str, source: str, mode: Mode)")
    if not isinstance(mode, Mode):
        raise TypeError(f"create_db's mode is a C.Mode (read, write, new), got {type(mode).__name__}")
    kind = kvdb.KINDS.get(db_type)
    if kind is None:
        return None
    if not source:
        raise ArgumentError("create_db: the source (the db's path) is empty")
    return DB(kind, source, mode)
