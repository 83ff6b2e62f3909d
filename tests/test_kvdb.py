"""lmdb and leveldb dbs (stepnet.io.kvdb, the `databases` extra): Save / Load / Checkpoint / CreateDB /
TensorProtosDBInput / DBExists with db_type "lmdb" and "leveldb", against dbs written and read by the libraries
themselves (the independent reference), and the write rules a model's db meets."""
import os

import numpy as np
import pytest

from stepnet import NetDef, Workspace
from stepnet.core.limits import Limits
from stepnet.core.errors import FileAccessError, FileFormatError, StepnetError
from stepnet.io import kvdb, minidb
from stepnet.testing import make_op

lmdb = pytest.importorskip("lmdb")
plyvel = pytest.importorskip("plyvel")
KINDS = ["lmdb", "leveldb"]


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # the file root: a model's dbs lie under it


def run(ws, *ops):
    nd = NetDef(name="kv")
    nd.op.extend(ops)
    ws.run_net_once(nd)


def library_records(path, kind) -> dict:
    """The db's records as the library itself reads them."""
    if kind == "lmdb":
        env = lmdb.open(str(path), readonly=True, lock=False)
        with env.begin() as txn:
            out = dict(txn.cursor())
        env.close()
        return out
    db = plyvel.DB(str(path))
    out = dict(db.iterator())
    db.close()
    return out


def library_write(path, kind, records) -> None:
    if kind == "lmdb":
        env = lmdb.open(str(path), map_size=1 << 28)
        with env.begin(write=True) as txn:
            for k, v in records:
                txn.put(k, v)
        env.close()
    else:
        db = plyvel.DB(str(path), create_if_missing=True)
        for k, v in records:
            db.put(k, v)
        db.close()


@pytest.mark.parametrize("kind", KINDS)
def test_save_writes_what_the_library_reads_and_load_reads_it_back(tmp_path, kind):
    ws = Workspace()
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    ws.feed("w", w)
    ws.feed("ids", np.array([5, -2], np.int64))
    run(ws, make_op("Save", ["w", "ids"], [], db=f"params.{kind}", db_type=kind))
    records = library_records(tmp_path / f"params.{kind}", kind)
    assert sorted(records) == [b"ids#%0", b"w#%0"]   # Caffe2's key: the blob name, "#%", the chunk number
    assert minidb.parse_blob_proto(records[b"w#%0"], "w").tensor.float_data == list(range(12))
    assert [os.path.realpath(w.path) for w in ws.written] == [os.path.realpath(tmp_path / f"params.{kind}")]
    fresh = Workspace()
    run(fresh, make_op("Load", [], ["w", "ids"], db=f"params.{kind}", db_type=kind))
    assert np.array_equal(fresh.fetch("w"), w) and fresh.fetch("ids").tolist() == [5, -2]
    run(fresh, make_op("DBExists", [], ["yes"], db_name=f"params.{kind}", db_type=kind),
        make_op("DBExists", [], ["no"], db_name="params.minidb", db_type=kind))
    assert fresh.fetch("yes").item() is True and fresh.fetch("no").item() is False


@pytest.mark.parametrize("kind", KINDS)
def test_a_reader_shards_and_cycles_over_a_library_written_db(tmp_path, kind):
    """Records i = 0..5 (keys sort as written), image i and label 100 + i; two shards of batch 2 each."""
    library_write(tmp_path / "data", kind, [(f"{i:03d}".encode(), minidb.tensor_protos_record(
        [np.full((2, 2), i, np.float32), np.array(100 + i, np.int32)])) for i in range(6)])
    ws = Workspace()
    run(ws, make_op("CreateDB", [], ["r0"], db="data", db_type=kind, num_shards=2, shard_id=0),
        make_op("CreateDB", [], ["r1"], db="data", db_type=kind, num_shards=2, shard_id=1))
    seen = []
    for _ in range(2):
        run(ws, make_op("TensorProtosDBInput", ["r0"], ["x0", "y0"], batch_size=2),
            make_op("TensorProtosDBInput", ["r1"], ["x1", "y1"], batch_size=2))
        seen.append((ws.fetch("y0").tolist(), ws.fetch("y1").tolist()))
        assert ws.fetch("x0")[:, 0, 0].tolist() == [y - 100 for y in ws.fetch("y0").tolist()]
    assert seen == [([100, 102], [101, 103]), ([104, 100], [105, 101])]   # round the end to the shard's first


@pytest.mark.parametrize("kind", KINDS)
def test_checkpoints_replace_their_own_dbs_only(tmp_path, kind):
    ws = Workspace()
    ws.feed("w", np.ones(2, np.float32))
    for it in (0, 0, 2):   # the second run replaces the db the first made in this run
        ws.feed("iter", np.array([it], np.int64))
        run(ws, make_op("Checkpoint", ["iter", "w"], [], db="ck_%d", db_type=kind, every=2))
    assert sorted(p for p in os.listdir(tmp_path) if not p.startswith(".")) == ["ck_0", "ck_2"]
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]   # no temporaries left
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    fresh = Workspace()
    fresh.feed("w", np.ones(2, np.float32))
    with pytest.raises(FileAccessError, match=f"is not an {kind} db or empty"):
        run(fresh, make_op("Save", ["w"], [], db="mine", db_type=kind))
    assert os.listdir(tmp_path / "mine") == ["notes.txt"]
    cli = Workspace(limits=Limits(overwrite=False))   # `stepnet run` without --overwrite
    cli.feed("w", np.ones(2, np.float32))
    with pytest.raises(FileAccessError, match="was there before this run"):
        run(cli, make_op("Save", ["w"], [], db="ck_0", db_type=kind))


def test_a_directory_that_is_not_a_leveldb_is_refused_untouched(tmp_path):
    """leveldb's open writes LOCK and LOG (renaming an old LOG to LOG.old) into the directory it is given: a
    directory that does not hold a leveldb is refused before the library sees it."""
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "LOG").write_text("my log")
    with pytest.raises(FileFormatError, match="no leveldb db there"):
        run(Workspace(), make_op("CreateDB", [], ["r"], db="project", db_type="leveldb"))
    assert os.listdir(tmp_path / "project") == ["LOG"]


def test_a_corrupt_leveldb_table_is_a_file_error(tmp_path):
    library_write(tmp_path / "db", "leveldb", [(b"k%d" % i, b"v" * 100) for i in range(50)])
    db = plyvel.DB(str(tmp_path / "db"))
    db.compact_range()   # records into a table file
    db.close()
    table = next(p for p in (tmp_path / "db").iterdir() if p.suffix in (".ldb", ".sst"))
    data = bytearray(table.read_bytes())
    data[20] ^= 0xFF
    table.write_bytes(bytes(data))
    with pytest.raises(FileFormatError, match="not a leveldb db leveldb can read"):
        kvdb.open_db(str(tmp_path / "db"), "leveldb")


def test_without_the_library_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "lmdb", None)
    with pytest.raises(StepnetError, match=r"lmdb dbs need the lmdb package: pip install .*`databases` extra"):
        kvdb.open_db("x", "lmdb")


@pytest.mark.parametrize("kind", KINDS)
def test_a_db_in_a_missing_directory_is_one_file_error(tmp_path, kind):
    """Campaign seed 6 case 3361: Save to "$HOME/x" (a directory that is not there) gave mkdtemp's
    FileNotFoundError as a kernel failure."""
    ws = Workspace()
    ws.feed("w", np.ones(2, np.float32))
    with pytest.raises(FileFormatError, match=rf"\$HOME/x.{kind}: cannot write the {kind} db \(No such file"):
        run(ws, make_op("Save", ["w"], [], db=f"$HOME/x.{kind}", db_type=kind))
    assert os.listdir(tmp_path) == []


def test_an_lmdb_is_written_under_a_memory_limit(tmp_path):
    """Campaign seed 9 cases 2647 and 2913: a map of 1 TiB (what Caffe2's examples reserve) failed under a 3 GiB
    address-space limit with lmdb's MemoryError, as a kernel failure; the map is now sized to the records."""
    import subprocess
    import sys
    code = ("import resource, numpy as np\n"
            "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
            "from stepnet import NetDef, Workspace\n"
            "from stepnet.testing import make_op\n"
            "ws = Workspace()\n"
            "ws.feed('w', np.arange(100000, dtype=np.int64))\n"
            "ws.run_net_once(NetDef(name='s', op=[make_op('Save', ['w'], [], db='w.lmdb', db_type='lmdb')]))\n"
            "fresh = Workspace()\n"
            "fresh.run_net_once(NetDef(name='l', op=[make_op('Load', [], ['w'], db='w.lmdb', db_type='lmdb')]))\n"
            "print(int(fresh.fetch('w').sum()))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == str(sum(range(100000)))


def test_an_lmdb_the_library_cannot_write_is_one_file_error(tmp_path, monkeypatch):
    monkeypatch.setattr(kvdb, "lmdb_map_size", lambda records: 8192)   # too small: lmdb's MapFullError
    ws = Workspace()
    ws.feed("w", np.zeros(100000, np.float32))
    with pytest.raises(FileFormatError, match=r"w.lmdb: cannot write the lmdb db \(MapFullError"):
        run(ws, make_op("Save", ["w"], [], db="w.lmdb", db_type="lmdb"))
    assert os.listdir(tmp_path) == []
