"""Integer maps (stepnet/ops/maps.py): the four dtype pairs, KeyValueToMap against a dict built here (first
value of a repeated key kept, pairs added to the map the output already holds), MapToKeyValue back, Save/Load
in Caffe2's blob format, bad inputs, and a broken kernel caught."""
import itertools

import numpy as np
import pytest

from stepnet import Workspace
from stepnet.core.errors import ArgumentError, DTypeError, FileFormatError, ShapeError
from stepnet.io import minidb
from stepnet.io.proto import BlobProto, DataType, TensorProtos
from stepnet.ops.maps import KeyValueMap
from stepnet.testing import make_op

PAIRS = list(itertools.product([np.int32, np.int64], repeat=2))
CODES = {np.int32: DataType.INT32, np.int64: DataType.INT64}
rng = np.random.default_rng(3)


@pytest.fixture
def in_tmp_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(ws, op_type, inputs, outputs, **args):
    ws.run_operator_once(make_op(op_type, inputs, outputs, **args))


def reference(keys, values, start=None):
    out = dict(start or {})
    for k, v in zip(keys.reshape(-1).tolist(), values.reshape(-1).tolist()):
        if k not in out:
            out[k] = v
    return out


def check_round_trip(key_t, value_t):
    ws = Workspace()
    keys = rng.integers(-5, 5, size=(3, 4)).astype(key_t)
    values = rng.integers(-100, 100, size=12).astype(value_t)
    ws.feed("k", keys)
    ws.feed("v", values)
    run(ws, "KeyValueToMap", ["k", "v"], ["m"])
    run(ws, "MapToKeyValue", ["m"], ["k2", "v2"])
    k2, v2 = ws.fetch("k2"), ws.fetch("v2")
    assert k2.dtype == key_t and v2.dtype == value_t and k2.ndim == v2.ndim == 1
    assert dict(zip(k2.tolist(), v2.tolist())) == reference(keys, values) and len(k2) == len(set(k2.tolist()))


@pytest.mark.parametrize("key_t, value_t", PAIRS)
def test_key_value_round_trip_against_a_dict(key_t, value_t):
    check_round_trip(key_t, value_t)


def test_the_check_catches_a_map_keeping_the_last_value(broken):
    def last_wins(ctx, xp, keys, values):
        from stepnet.ops.maps import MAP_TYPES
        out = MAP_TYPES[(keys.dtype, values.dtype)]()
        out.update(zip(keys.reshape(-1).tolist(), values.reshape(-1).tolist()))
        return out
    broken("KeyValueToMap", last_wins)
    with pytest.raises(AssertionError):
        check_round_trip(np.int32, np.int32)


@pytest.mark.parametrize("key_t, value_t", PAIRS)
def test_create_map_makes_an_empty_map_of_the_dtypes(key_t, value_t):
    ws = Workspace()
    run(ws, "CreateMap", [], ["m"], key_dtype=CODES[key_t], value_dtype=CODES[value_t])
    table = ws.get_blob("m").value
    assert isinstance(table, KeyValueMap) and not table
    assert (table.key_dtype, table.value_dtype) == (np.dtype(key_t), np.dtype(value_t))
    run(ws, "MapToKeyValue", ["m"], ["k", "v"])
    assert ws.fetch("k").shape == (0,) and ws.fetch("k").dtype == key_t and ws.fetch("v").dtype == value_t


def test_pairs_are_added_to_the_map_the_output_holds():
    ws = Workspace()
    ws.feed("k", np.array([1, 2], np.int32))
    ws.feed("v", np.array([10, 20], np.int32))
    run(ws, "KeyValueToMap", ["k", "v"], ["m"])
    first = ws.get_blob("m").value
    ws.feed("k", np.array([2, 3], np.int32))
    ws.feed("v", np.array([99, 30], np.int32))
    run(ws, "KeyValueToMap", ["k", "v"], ["m"])
    assert ws.get_blob("m").value == {1: 10, 2: 20, 3: 30}
    assert first == {1: 10, 2: 20}          # the earlier value is not changed under its holder
    ws.feed("k", np.array([5], np.int64))   # another dtype pair: a fresh map
    ws.feed("v", np.array([7], np.int32))
    run(ws, "KeyValueToMap", ["k", "v"], ["m"])
    assert ws.get_blob("m").value == {5: 7}


@pytest.mark.parametrize("key_t, value_t", PAIRS)
def test_save_and_load_in_caffe2s_format(in_tmp_path, key_t, value_t):
    ws = Workspace()
    ws.feed("k", np.array([4, 2, 9], key_t))
    ws.feed("v", np.array([1, 2, 3], value_t))
    run(ws, "KeyValueToMap", ["k", "v"], ["m"])
    run(ws, "Save", ["m"], [], db="m.minidb", db_type="minidb")
    (key, value), = minidb.read_records("m.minidb")
    proto = BlobProto.FromString(value)
    names = {np.int32: "int32_t", np.int64: "int64_t"}
    assert proto.type == f"(std::unordered_map<{names[key_t]}, {names[value_t]}>)"
    protos = TensorProtos.FromString(proto.content)
    assert [t.data_type for t in protos.protos] == [CODES[key_t], CODES[value_t]]
    fresh = Workspace()
    run(fresh, "Load", [], ["m"], db="m.minidb", db_type="minidb", load_all=1)
    assert fresh.get_blob("m").value == {4: 1, 2: 2, 9: 3}
    assert type(fresh.get_blob("m").value) is type(ws.get_blob("m").value)


def test_a_malformed_saved_map_is_a_file_error(in_tmp_path):
    protos = TensorProtos()
    protos.protos.add(data_type=DataType.INT32, dims=[1], int32_data=[1])
    proto = BlobProto(name="m", type="(std::unordered_map<int32_t, int32_t>)", content=protos.SerializeToString())
    minidb.write_records("bad.minidb", [("m", proto.SerializeToString())])
    with pytest.raises(FileFormatError, match="two tensors .keys, values., got 1"):
        run(Workspace(), "Load", [], ["m"], db="bad.minidb", db_type="minidb", load_all=1)


def test_bad_inputs():
    ws = Workspace()
    with pytest.raises(ArgumentError, match="key_dtype must be INT32 .2. or INT64 .10., got FLOAT"):
        run(ws, "CreateMap", [], ["m"], key_dtype=DataType.FLOAT)
    ws.feed("f", np.zeros(2, np.float32))
    ws.feed("i", np.zeros(3, np.int32))
    with pytest.raises(DTypeError, match="maps take int32 or int64 keys and values, got float32 keys"):
        run(ws, "KeyValueToMap", ["f", "i"], ["m"])
    ws.feed("j", np.zeros(2, np.int32))
    with pytest.raises(ShapeError, match="as many elements, got .3,. and .2,."):
        run(ws, "KeyValueToMap", ["i", "j"], ["m"])
    with pytest.raises(DTypeError, match="input 0 must be a map made by CreateMap or KeyValueToMap, got ndarray"):
        run(ws, "MapToKeyValue", ["i"], ["k", "v"])
