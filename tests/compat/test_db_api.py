"""workspace.C's db API (create_db, Mode, DB, Transaction, Cursor) against minidb's documented record layout
(int32 key length, int32 value length, key, value; caffe2/core/db.cc), and against what Save/Load read."""
import struct

import numpy as np
import pytest

from stepnet.compat import core, workspace

C = workspace.C


def _layout(records) -> bytes:
    """The minidb bytes of records, written out by hand from the documented layout."""
    return b"".join(struct.pack("<ii", len(k), len(v)) + k + v for k, v in records)


def _read_all(path, db_type="minidb"):
    db = C.create_db(db_type, str(path), C.Mode.read)
    cursor, out = db.new_cursor(), []
    while cursor.valid():
        out.append((cursor.key(), cursor.value()))
        cursor.next()
    db.close()
    return out


def test_mode_values_are_caffe2s_enum():
    assert (int(C.Mode.read), int(C.Mode.write), int(C.Mode.new)) == (0, 1, 2)
    assert "minidb" in C.registered_dbs()


def test_write_commits_the_documented_layout_and_reads_back(tmp_path):
    path = tmp_path / "db"
    db = C.create_db("minidb", str(path), C.Mode.new)
    t = db.new_transaction()
    t.put(b"k1", b"value one")
    t.put("k2", b"\x00\x01")
    t.commit()
    del t, db
    assert path.read_bytes() == _layout([(b"k1", b"value one"), (b"k2", b"\x00\x01")])
    assert _read_all(path) == [(b"k1", b"value one"), (b"k2", b"\x00\x01")]


def test_a_dropped_transaction_commits_and_write_mode_appends(tmp_path):
    path = tmp_path / "db"
    path.write_bytes(_layout([(b"a", b"1")]))
    db = C.create_db("minidb", str(path), C.Mode.write)
    t = db.new_transaction()
    t.put(b"b", b"2")
    del t                                      # Caffe2's destructor commits
    assert path.read_bytes() == _layout([(b"a", b"1"), (b"b", b"2")])
    db = C.create_db("minidb", str(path), C.Mode.new)   # new mode starts an empty file
    del db
    assert path.read_bytes() == b""


def test_cursor_seek_to_first_and_invalid_position(tmp_path):
    path = tmp_path / "db"
    path.write_bytes(_layout([(b"x", b"1"), (b"y", b"2")]))
    cursor = C.create_db("minidb", str(path), C.Mode.read).new_cursor()
    assert not cursor.supports_seek()
    cursor.next()
    assert cursor.key() == b"y"
    cursor.seek_to_first()
    assert (cursor.key(), cursor.value()) == (b"x", b"1")
    cursor.next()
    cursor.next()
    assert not cursor.valid()
    with pytest.raises(RuntimeError, match="invalid location"):
        cursor.key()


def test_records_written_here_are_read_by_load(tmp_path):
    """A db written through the API holds what Save writes: Load reads its blob back."""
    path = tmp_path / "blobs"
    workspace.FeedBlob("w", np.arange(6, dtype=np.float32).reshape(2, 3))
    data = workspace.SerializeBlob("w")
    db = C.create_db("minidb", str(path), C.Mode.new)
    t = db.new_transaction()
    t.put(b"w", data)
    t.commit()
    workspace.ResetWorkspace()
    workspace.RunOperatorOnce(core.CreateOperator("Load", [], ["w"], db=str(path), db_type="minidb",
                                                    absolute_path=1))
    np.testing.assert_array_equal(workspace.FetchBlob("w"), np.arange(6, dtype=np.float32).reshape(2, 3))


def test_misuse_fails_as_caffe2_does(tmp_path):
    path = tmp_path / "db"
    assert C.create_db("rocksdb", str(path), C.Mode.new) is None      # not a registered db type
    with pytest.raises(RuntimeError):
        C.create_db("minidb", str(tmp_path / "missing"), C.Mode.read)
    db = C.create_db("minidb", str(path), C.Mode.new)
    with pytest.raises(RuntimeError, match="cursor"):
        db.new_cursor()                        # a cursor needs read mode
    reader = C.create_db("minidb", str(path), C.Mode.read)
    with pytest.raises(RuntimeError, match="write"):
        reader.new_transaction()
    reader.close()
    with pytest.raises(RuntimeError, match="closed"):
        reader.new_cursor()


@pytest.mark.parametrize("db_type,library", [("lmdb", "lmdb"), ("leveldb", "plyvel")])
def test_lmdb_and_leveldb_keep_keys_sorted_across_commits(tmp_path, db_type, library):
    pytest.importorskip(library)                # the `databases` extra
    path = tmp_path / "db"
    db = C.create_db(db_type, str(path), C.Mode.new)
    t = db.new_transaction()
    t.put(b"b", b"2")
    t.put(b"a", b"1")
    del t
    t = C.create_db(db_type, str(path), C.Mode.write).new_transaction()
    t.put(b"c", b"3")
    t.commit()
    assert _read_all(path, db_type) == [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]   # the libraries' key order
    assert C.create_db(db_type, str(path), C.Mode.read).new_cursor().supports_seek()
