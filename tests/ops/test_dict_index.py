"""Key indexes (stepnet/ops/dict_index.py): IndexGet on random keys against a reference dictionary written here
from Caffe2's docs (new keys numbered 1, 2, ... in order of appearance; frozen: unknown keys give 0; the size
counts the 0 entry), IndexLoad/IndexStore, the capacity, Save/Load in Caffe2's blob format, bad inputs, and a
broken kernel caught."""
import numpy as np
import pytest

from stepnet import Workspace
from stepnet.core.errors import ArgumentError, DTypeError, OpError
from stepnet.io import minidb
from stepnet.io.proto import BlobProto, DataType
from stepnet.testing import make_op

rng = np.random.default_rng(11)
KINDS = {"IntIndexCreate": np.int32, "LongIndexCreate": np.int64, "StringIndexCreate": object}


@pytest.fixture
def in_tmp_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(ws, op_type, inputs, outputs, **args):
    ws.run_operator_once(make_op(op_type, inputs, outputs, **args))


def keys_of(create, values):
    if KINDS[create] is object:
        out = np.empty(len(values), object)
        out[:] = [f"k{v}" for v in values]
        return out
    return np.asarray(values, KINDS[create])


def as_key(k):
    return k.encode() if isinstance(k, str) else k


def check_get(create):
    """Random batches of keys through IndexGet, freezing half way, against a dict."""
    ws = Workspace()
    run(ws, create, [], ["idx"])
    ref = {}
    for step in range(8):
        if step == 4:
            run(ws, "IndexFreeze", ["idx"], ["idx"])
        batch = keys_of(create, rng.integers(0, 12, size=(2, 3)).reshape(-1)).reshape(2, 3)
        ws.feed("q", batch)
        run(ws, "IndexGet", ["idx", "q"], ["ids"])
        want = []
        for k in batch.reshape(-1).tolist():
            if step < 4:
                ref.setdefault(as_key(k), len(ref) + 1)
            want.append(ref.get(as_key(k), 0))
        got = ws.fetch("ids")
        assert got.dtype == np.int64 and got.shape == (2, 3) and got.reshape(-1).tolist() == want
    run(ws, "IndexSize", ["idx"], ["n"])
    assert ws.fetch("n").shape == () and ws.fetch("n").item() == len(ref) + 1
    run(ws, "IndexStore", ["idx"], ["stored"])
    assert [as_key(k) for k in ws.fetch("stored").tolist()] == list(ref)


@pytest.mark.parametrize("create", list(KINDS))
def test_get_freeze_size_store_against_a_dict(create):
    check_get(create)


def test_the_check_catches_ids_from_zero(broken):
    def from_zero(xp, index, keys):
        ids = [index.ids.setdefault(k, len(index.ids)) for k in index.keys_of(keys, "keys")]
        return np.asarray(ids, np.int64).reshape(keys.shape)
    broken("IndexGet", from_zero)
    with pytest.raises(AssertionError):
        check_get("IntIndexCreate")


def test_load_store_and_skip_first_entry():
    ws = Workspace()
    run(ws, "StringIndexCreate", [], ["idx"])
    ws.feed("items", keys_of("StringIndexCreate", [5, 6, 7]))
    run(ws, "IndexLoad", ["idx", "items"], ["idx"])
    ws.feed("q", keys_of("StringIndexCreate", [7, 5, 8]))
    run(ws, "IndexGet", ["idx", "q"], ["ids"])
    assert ws.fetch("ids").tolist() == [3, 1, 4]
    run(ws, "IndexStore", ["idx"], ["stored"])
    assert ws.fetch("stored").tolist() == [b"k5", b"k6", b"k7", b"k8"]
    run(ws, "IntIndexCreate", [], ["other"])
    ws.feed("ints", np.array([0, 40, 30], np.int32))
    run(ws, "IndexLoad", ["other", "ints"], ["other"], skip_first_entry=1)
    ws.feed("q", np.array([30, 0], np.int32))
    run(ws, "IndexGet", ["other", "q"], ["ids"])
    assert ws.fetch("ids").tolist() == [2, 3]


def test_capacity_counts_the_zero_entry():
    ws = Workspace()
    run(ws, "LongIndexCreate", [], ["idx"], max_elements=3)
    ws.feed("q", np.array([10, 20], np.int64))
    run(ws, "IndexGet", ["idx", "q"], ["ids"])
    ws.feed("q", np.array([30], np.int64))
    with pytest.raises(OpError, match="index is full: it holds 2 keys and max_elements is 3"):
        run(ws, "IndexGet", ["idx", "q"], ["ids"])
    ws.feed("items", np.arange(4, dtype=np.int64))
    with pytest.raises(ArgumentError, match="cannot load 4 keys into an index of max_elements 3"):
        run(ws, "IndexLoad", ["idx", "items"], ["idx"])


def test_save_and_load_in_caffe2s_format(in_tmp_path):
    ws = Workspace()
    run(ws, "StringIndexCreate", [], ["idx"], max_elements=10)
    ws.feed("q", keys_of("StringIndexCreate", [3, 1, 3]))
    run(ws, "IndexGet", ["idx", "q"], ["ids"])
    run(ws, "IndexFreeze", ["idx"], ["idx"])
    run(ws, "Save", ["idx"], [], db="i.minidb", db_type="minidb")
    (_, value), = minidb.read_records("i.minidb")
    proto = BlobProto.FromString(value)
    assert proto.type == "std::unique_ptr<caffe2::IndexBase>" and proto.content == b"10 1"
    assert proto.tensor.data_type == DataType.STRING and list(proto.tensor.string_data) == [b"k3", b"k1"]
    fresh = Workspace()
    run(fresh, "Load", [], ["idx"], db="i.minidb", db_type="minidb")
    fresh.feed("q", keys_of("StringIndexCreate", [1, 9, 3]))
    run(fresh, "IndexGet", ["idx", "q"], ["ids"])
    assert fresh.fetch("ids").tolist() == [2, 0, 1]        # still frozen: the unknown key gives 0


def test_bad_inputs():
    ws = Workspace()
    run(ws, "IntIndexCreate", [], ["idx"])
    ws.feed("longs", np.array([1], np.int64))
    with pytest.raises(DTypeError, match="input 1 .keys. must hold int32 keys for this index, got int64"):
        run(ws, "IndexGet", ["idx", "longs"], ["ids"])
    ws.feed("dup", np.array([1, 2, 1], np.int32))
    with pytest.raises(ArgumentError, match="key 1 appears more than once"):
        run(ws, "IndexLoad", ["idx", "dup"], ["idx"])
    ws.feed("empty", np.zeros(0, np.int32))
    with pytest.raises(ArgumentError, match="skip_first_entry is set but the items tensor is empty"):
        run(ws, "IndexLoad", ["idx", "empty"], ["idx"], skip_first_entry=1)
    with pytest.raises(DTypeError, match="input 0 must be an index made by IntIndexCreate"):
        run(ws, "IndexSize", ["longs"], ["n"])
    with pytest.raises(ArgumentError, match="max_elements must be >= 1"):
        run(ws, "IntIndexCreate", [], ["i2"], max_elements=0)
