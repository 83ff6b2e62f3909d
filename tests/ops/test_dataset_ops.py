"""Dataset cursors (stepnet/ops/dataset_ops.py) on the nested schema of Caffe2's CreateTreeCursor doc: batches
and offsets checked against a flattening of Python records written here (each record's
lists laid end to end, one tensor per field), SortAndShuffle against orders worked out by hand from the
minstd_rand0 sequence (16807, 282475249, ...), bad inputs, and a broken reader caught."""
import numpy as np
import pytest

from stepnet import Limits, NetDef, Workspace
from stepnet.core.errors import (ArgumentError, ArityError, DTypeError, FileFormatError, OpError, ResourceError,
                                 ShapeError)
from stepnet.io import minidb
from stepnet.io.proto import BlobProto
from stepnet.ops.dataset_ops import Tree
from stepnet.testing import make_op

FIELDS = ["a", "b:lengths", "b:values:lengths", "b:values:values", "c:lengths", "c:c1", "c:c2:lengths", "c:c2:values"]
RECORDS = [   # a: int, b: a list of int lists, c: a list of (name, int list)
    (3, [[4, 5], [6, 7, 8], [], [9]], [("alex", [10, 11]), ("bob", [12])]),
    (4, [], [("carl", [])]),
    (5, [[1]], []),
    (6, [[2, 3]], [("dan", [13, 14, 15])]),
]


def flatten(records) -> list:
    """The field tensors of records, by the rule of Caffe2's doc (a list: its length, then its items' fields)."""
    i32 = lambda v: np.array(v, np.int32)   # noqa: E731
    return [i32([a for a, _, _ in records]),
            i32([len(b) for _, b, _ in records]),
            i32([len(x) for _, b, _ in records for x in b]),
            i32([v for _, b, _ in records for x in b for v in x]),
            i32([len(c) for _, _, c in records]),
            np.array([n for _, _, c in records for n, _ in c], dtype=object).reshape(-1),
            i32([len(v) for _, _, c in records for _, v in c]),
            i32([x for _, _, c in records for _, v in c for x in v])]


@pytest.fixture
def in_tmp_path(tmp_path, monkeypatch):
    """Db paths must lie under the file root, the working directory when the workspace is made."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(ws, op_type, inputs, outputs, **args):
    ws.run_operator_once(make_op(op_type, inputs, outputs, **args))


def dataset(records=RECORDS, ws=None):
    ws = ws or Workspace()
    for name, value in zip(FIELDS, flatten(records)):
        ws.feed(name, value)
    run(ws, "CreateTreeCursor", [], ["cur"], fields=FIELDS)
    return ws


def out_names(prefix="o"):
    return [f"{prefix}{i}" for i in range(len(FIELDS))]


def fetch(ws, names):
    return [ws.fetch(n) for n in names]


def same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape and g.tolist() == w.tolist()


def test_domains_follow_the_longest_lengths_prefix():
    tree = Tree(FIELDS)
    assert tree.domain == [0, 0, 1, 2, 0, 3, 3, 4]     # a, b:lengths top level; b:values:* in b, ...
    assert tree.parent == [0, 1, 0, 3]
    with pytest.raises(ArgumentError, match="field 0 .'b:x'. belongs to the domain of field 1 .'b:lengths'."):
        Tree(["b:x", "b:lengths"])
    with pytest.raises(ArgumentError, match="fields is empty"):
        Tree([])


@pytest.mark.parametrize("batch", [1, 2, 3, 5])
def test_read_next_batch_gives_the_records_in_order(batch):
    ws = dataset()
    names = out_names()
    net = NetDef(name="read")
    net.op.extend([make_op("ReadNextBatch", ["cur"] + FIELDS, names, batch_size=batch)])
    bound = ws.bind(net)
    for start in range(0, len(RECORDS) + batch, batch):
        bound.run()
        same(fetch(ws, names), flatten(RECORDS[start:start + batch]))
    run(ws, "ResetCursor", ["cur"], [])
    bound.run()
    same(fetch(ws, names), flatten(RECORDS[:batch]))


def test_enforce_batch_size_gives_nothing_for_a_short_last_batch():
    ws = dataset()
    names = out_names()
    run(ws, "ReadNextBatch", ["cur"] + FIELDS, names, batch_size=3, enforce_batch_size=True)
    same(fetch(ws, names), flatten(RECORDS[:3]))
    run(ws, "ReadNextBatch", ["cur"] + FIELDS, names, batch_size=3, enforce_batch_size=True)
    same(fetch(ws, names), flatten([]))


def test_the_reference_check_catches_a_reader_that_ignores_the_domains(broken):
    def top_level_only(ctx, xp, cursor, *data, batch_size, enforce_batch_size):
        start = (cursor.offsets or [0])[0]
        cursor.offsets = [start + batch_size] + [0] * (cursor.tree.domains - 1)
        return tuple(x[start:start + batch_size] for x in data)
    broken("ReadNextBatch", top_level_only)
    with pytest.raises(AssertionError):
        test_read_next_batch_gives_the_records_in_order(1)


def test_compute_offset_gives_where_each_record_starts():
    ws = dataset()
    run(ws, "ComputeOffset", ["cur"] + FIELDS, ["off"])
    want = [[r] + [len(flatten(RECORDS[:r])[i]) for i in (2, 3, 5, 7)] for r in range(len(RECORDS) + 1)]
    assert ws.fetch("off").dtype == np.int64 and ws.fetch("off").tolist() == want
    assert ws.get_blob("cur").value.offsets == [0] * 5


def random_read(ws, idx, batch, **args):
    names = out_names("r")
    ws.feed("idx", np.array(idx, np.int64))
    run(ws, "ComputeOffset", ["cur"] + FIELDS, ["off"])
    net = NetDef(name="random")
    net.op.extend([make_op("ReadRandomBatch", ["cur", "idx", "off"] + FIELDS, names, batch_size=batch, **args)])
    bound = ws.bind(net)

    def read():
        bound.run()
        return fetch(ws, names)
    return read


def test_read_random_batch_follows_the_indices():
    read = random_read(dataset(), [3, 0, 2], 2)
    same(read(), flatten([RECORDS[3], RECORDS[0]]))
    same(read(), flatten([RECORDS[2]]))
    same(read(), flatten([]))
    loop = random_read(dataset(), [3, 0, 2], 2, loop_over=True)
    got = [loop() for _ in range(4)]
    same(got[2], got[0])
    same(got[3], flatten([RECORDS[2]]))
    enforce = random_read(dataset(), [3, 0, 2], 2, enforce_batch_size=True)
    enforce()
    same(enforce(), flatten([]))


def test_sort_and_shuffle_orders_worked_out_by_hand():
    ws = Workspace()
    ws.feed("k", np.array([5, 3, 9, 1], np.int32))
    run(ws, "CreateTreeCursor", [], ["c1"], fields=["k"])
    run(ws, "SortAndShuffle", ["c1", "k"], ["i"], sort_by_field_idx=0, batch_size=4)   # one batch: sorted
    assert ws.fetch("i").dtype == np.int64 and ws.fetch("i").tolist() == [3, 1, 0, 2]
    ws.feed("k", np.array([2, 1, 2, 1], np.int32))
    run(ws, "SortAndShuffle", ["c1", "k"], ["i"], sort_by_field_idx=0, batch_size=4)
    assert ws.fetch("i").tolist() == [1, 3, 0, 2]                          # ties keep their order
    # three batches of 1 shuffled: swap(1, draw 16806 // 1073741822 = 0), swap(2, 282475248 // 715827881 = 0)
    ws.feed("k", np.array([7, 8, 9], np.int32))
    run(ws, "SortAndShuffle", ["c1", "k"], ["i"], sort_by_field_idx=-1, batch_size=1, shuffle_size=1)
    assert ws.fetch("i").tolist() == [2, 0, 1]
    # Caffe2's dataset test: sorted [1, 2, 0], the first chunk of 2 shuffled by one swap, one batch
    ws = dataset(RECORDS[:3])
    run(ws, "SortAndShuffle", ["cur"] + FIELDS, ["i"], sort_by_field_idx=1, batch_size=2, shuffle_size=1)
    assert ws.fetch("i").tolist() == [2, 1, 0]


def test_bad_datasets_are_refused_with_one_line():
    names = out_names()
    ws = dataset()
    ws.feed("b:lengths", np.array([4, 0, -1, 1], np.int32))
    with pytest.raises(ShapeError, match="'b:lengths'. has a negative length"):
        run(ws, "ReadNextBatch", ["cur"] + FIELDS, names, batch_size=4)
    ws = dataset()
    ws.feed("b:values:values", np.arange(3, dtype=np.int32))
    with pytest.raises(ShapeError, match="inconsistent lengths: field 2 .'b:values:lengths'. reaches entry 6 of"):
        run(ws, "ReadNextBatch", ["cur"] + FIELDS, names)
    assert ws.get_blob("cur").value.offsets == []          # a failed read leaves the cursor where it was
    ws.feed("b:lengths", np.array([4, 0, 1, 1], np.int64))
    with pytest.raises(DTypeError, match="'b:lengths'. is a lengths field: it must be a 1-D int32"):
        run(ws, "ReadNextBatch", ["cur"] + FIELDS, names)
    with pytest.raises(ArityError, match="the dataset has 8 fields, but the op gives 7"):
        run(ws, "ReadNextBatch", ["cur"] + FIELDS[:7], names[:7])
    with pytest.raises(ArityError, match="but the op has 7 outputs"):
        run(dataset(), "ReadNextBatch", ["cur"] + FIELDS, names[:7])
    ws.feed("t", np.zeros(2, np.float32))
    with pytest.raises(DTypeError, match="input 0 must be a cursor made by CreateTreeCursor, got ndarray"):
        run(ws, "ResetCursor", ["t"], [])
    ws.feed("a", np.array(1, np.int32))
    with pytest.raises(ShapeError, match="input 1 .field 'a'. is 0-d"):
        run(ws, "ComputeOffset", ["cur"] + FIELDS, ["off"])


def test_a_cursor_past_the_end_of_a_shrunk_dataset():
    ws = dataset()
    run(ws, "ReadNextBatch", ["cur"] + FIELDS, out_names(), batch_size=4)
    for name, value in zip(FIELDS, flatten(RECORDS[:2])):
        ws.feed(name, value)
    with pytest.raises(OpError, match="the cursor is at top-level entry 4, past the dataset's 2 entries"):
        run(ws, "ReadNextBatch", ["cur"] + FIELDS, out_names())


def test_random_read_refuses_indices_and_offsets_out_of_range():
    read = random_read(dataset(), [0, 4], 2)
    with pytest.raises(ShapeError, match="an index of idx .0..4. is out of range for an offsets matrix of 5 rows"):
        read()
    ws = dataset()
    ws.feed("idx", np.array([0], np.int64))
    ws.feed("off", np.array([[0, 0, 0, 0, 0], [1, 9, 0, 0, 0]], np.int64))
    with pytest.raises(ShapeError, match="gives field 'b:values:lengths' entries outside its 6 rows"):
        run(ws, "ReadRandomBatch", ["cur", "idx", "off"] + FIELDS, out_names())
    ws.feed("idx", np.array([0], np.int32))
    with pytest.raises(DTypeError, match="idx must be an int64 tensor"):
        run(ws, "ReadRandomBatch", ["cur", "idx", "off"] + FIELDS, out_names())


def test_a_huge_offsets_matrix_is_refused_before_it_is_made():
    ws = Workspace(limits=Limits(max_blob_bytes=1 << 10))
    ws.feed("x", np.zeros(1000, np.int8))
    run(ws, "CreateTreeCursor", [], ["c"], fields=["x"])
    with pytest.raises(ResourceError, match="'off'"):
        run(ws, "ComputeOffset", ["c", "x"], ["off"])


def test_a_cursor_saves_and_loads_in_caffe2s_format(in_tmp_path):
    ws = dataset()
    run(ws, "ReadNextBatch", ["cur"] + FIELDS, out_names())
    path = str(in_tmp_path / "cur.minidb")
    run(ws, "Save", ["cur"], [], db=path, db_type="minidb", absolute_path=1)
    (key, value), = minidb.read_records(path)
    proto = BlobProto.FromString(value)
    assert proto.type == "std::unique_ptr<TreeCursor>" and proto.content.split() == [f.encode() for f in FIELDS]
    assert list(proto.tensor.int64_data) == [1, 4, 6, 2, 3]
    run(ws, "ResetCursor", ["cur"], [])
    run(ws, "Load", [], ["cur"], db=path, db_type="minidb", absolute_path=1)
    run(ws, "ReadNextBatch", ["cur"] + FIELDS, out_names())
    same(fetch(ws, out_names()), flatten(RECORDS[1:2]))
    bad = BlobProto(name="cur", type="std::unique_ptr<TreeCursor>", content=b"b:x b:lengths")
    minidb.write_records(path, [("cur", bad.SerializeToString())])
    with pytest.raises(FileFormatError, match="a saved cursor's content must list its fields"):
        run(ws, "Load", [], ["cur"], db=path, db_type="minidb", absolute_path=1)


def test_a_random_batch_past_the_blob_limit_is_refused():
    ws = Workspace(limits=Limits(max_blob_bytes=4000))
    ws.feed("x", np.zeros(500, np.float32))
    ws.feed("idx", np.zeros(10, np.int64))
    ws.feed("off", np.array([[0], [500]], np.int64))
    run(ws, "CreateTreeCursor", [], ["c"], fields=["x"])
    with pytest.raises(ResourceError, match="'y'"):
        run(ws, "ReadRandomBatch", ["c", "idx", "off", "x"], ["y"], batch_size=10)
    assert ws.get_blob("c").value.offsets == []
