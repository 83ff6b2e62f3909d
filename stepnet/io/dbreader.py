"""Caffe2's db::DBReader: what CreateDB puts in a blob (an open db and a cursor over its records), and its
BlobProto form (a DBReaderProto: Save and checkpoints keep which db a reader reads). minidb files, and lmdb and
leveldb dbs through io.kvdb."""
from __future__ import annotations

from ..core.errors import ArgumentError, FileFormatError
from . import kvdb, minidb
from .proto import DBReaderProto


def check_db_type(db_type: str, what: str = "db_type") -> str:
    """The kind of db a db_type names: 'minidb', 'lmdb' or 'leveldb' (an ArgumentError for any other)."""
    if db_type not in kvdb.KINDS:
        shown = repr(db_type) if db_type else "empty"
        raise ArgumentError(f"{what} is {shown}, but stepnet reads and writes 'minidb', 'lmdb' and 'leveldb' dbs "
                            "(others, such as rocksdb or zmqdb, need Caffe2's libraries); set db_type to one of "
                            "them, converting the data if needed")
    return kvdb.KINDS[db_type]


class DBReader:
    """What CreateDB puts in a blob (Caffe2's db::DBReader): an open db and a cursor. read() returns the
    current record and moves on by num_shards records, going back to the first record of its shard at the
    end, so readers cycle over the data forever. The file is opened by open(limits, where), which confines its
    path: at once when the op is given (CreateDB), else by the first op that reads it (a reader loaded from a
    db)."""

    def __init__(self, source: str, db_type: str = "minidb", num_shards: int = 1, shard_id: int = 0):
        self.kind = check_db_type(db_type)
        if num_shards < 1 or not 0 <= shard_id < num_shards:
            raise ArgumentError(f"need num_shards >= 1 and 0 <= shard_id < num_shards, got "
                                f"num_shards={num_shards}, shard_id={shard_id}")
        self.source, self.db_type = source, db_type
        self.num_shards, self.shard_id = num_shards, shard_id
        self._db = None

    def open(self, limits, where: str) -> "DBReader":
        """Open the file (once) if its path lies under the file root of `limits` (the reading op's workspace's;
        where: the op, for the error)."""
        if self._db is None:
            self._db = kvdb.open_db(limits.confine(self.source, where), self.kind)
            self.seek_to_first()
        return self

    @property
    def db(self):
        if self._db is None:
            raise FileFormatError(f"the DB reader of {self.source!r} is not open yet (ops reading it open it)")
        return self._db

    def seek_to_first(self) -> None:
        if self.shard_id and self.shard_id >= len(self.db):
            raise FileFormatError(f"{self.source}: the db has {len(self.db)} records, fewer than "
                                  f"shard_id + 1 = {self.shard_id + 1}")
        self.pos = self.shard_id

    def seek(self, pos: int) -> None:
        """Put the cursor at record `pos` (where a resumed run's reader stood when the checkpoint was taken)."""
        if not 0 <= pos <= len(self.db):
            raise FileFormatError(f"{self.source}: cannot move the reader to record {pos}; the db has "
                                  f"{len(self.db)} records")
        self.pos = pos

    def read(self) -> tuple[str, bytes, str]:
        """(key, value, where) of the current record; then advance, wrapping around at the end."""
        if not len(self.db):
            raise FileFormatError(f"{self.source}: the db has no records to read")
        if self.pos >= len(self.db):  # left at the end by a Load that read this reader
            self.seek_to_first()
        i = self.pos
        for _ in range(self.num_shards):
            self.pos += 1
            if self.pos >= len(self.db):
                self.seek_to_first()
                break
        return self.db.key(i), self.db.value(i), self.where(i)

    def rest(self):
        """Every record from the cursor to the end (what Load reads from a reader); leaves it at the end."""
        while self.pos < len(self.db):
            i = self.pos
            self.pos += 1
            yield self.db.key(i), self.db.value(i), self.where(i)

    def where(self, i: int) -> str:
        return self.db.where(i)

    def __repr__(self):
        where = f"record {self.pos} of {len(self._db)}" if self._db is not None else "not open"
        return f"DBReader({self.source!r}, {self.db_type!r}, {where})"


def _reader_from_content(content: bytes) -> DBReader:
    proto = DBReaderProto()
    proto.ParseFromString(content)
    if proto.HasField("key"):
        raise FileFormatError(f"a saved DBReader of {proto.source!r} needs seeking to key {proto.key!r}, "
                              "which minidb does not support")
    return DBReader(proto.source, proto.db_type)


minidb.register_blob_type(
    DBReader, "DBReader",
    lambda r, name: DBReaderProto(name=name, source=r.source, db_type=r.db_type).SerializeToString(),
    _reader_from_content)
