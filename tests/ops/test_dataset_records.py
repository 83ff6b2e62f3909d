"""Whole datasets (stepnet/ops/dataset_records.py): TrimDataset and CheckDatasetConsistency on test_dataset_ops'
records, Append and AtomicAppend against hand-written concatenations, PackRecords against the flattening of each
record on its own (test_dataset_ops' reference), UnPackRecords as its inverse, bad inputs, the blob limit, and a
broken packer caught."""
import numpy as np
import pytest

from stepnet import Limits, Workspace
from stepnet.core.errors import ArgumentError, ArityError, DTypeError, ResourceError, ShapeError
from stepnet.ops.tensor_vector import TensorVector
from stepnet.testing import make_op, run_op
from tests.ops.test_dataset_ops import FIELDS, RECORDS, dataset, fetch, flatten, same


def run(ws, op_type, inputs, outputs, **args):
    ws.run_operator_once(make_op(op_type, inputs, outputs, **args))


def test_trim_dataset_keeps_a_multiple_of_records():
    ws = dataset()
    run(ws, "TrimDataset", FIELDS, FIELDS, fields=FIELDS, multiple_of=3)
    same(fetch(ws, FIELDS), flatten(RECORDS[:3]))
    run(ws, "TrimDataset", FIELDS, FIELDS, fields=FIELDS, multiple_of=1)
    same(fetch(ws, FIELDS), flatten(RECORDS[:3]))
    with pytest.raises(ArgumentError, match="multiple_of must be >= 1"):
        run(ws, "TrimDataset", FIELDS, FIELDS, fields=FIELDS, multiple_of=0)


def test_check_dataset_consistency():
    ws = dataset()
    run(ws, "CheckDatasetConsistency", FIELDS, [], fields=FIELDS)
    ws.feed("b:values:values", np.arange(10, dtype=np.int32))
    with pytest.raises(ShapeError, match="'b:values:lengths'. adds up to 9, but the fields of its domain have 10"):
        run(ws, "CheckDatasetConsistency", FIELDS, [], fields=FIELDS)
    ws = dataset()
    ws.feed("c:c2:lengths", np.array([2, 1, 0], np.int32))
    with pytest.raises(ShapeError, match="field 6 .'c:c2:lengths'. has 3 entries, but an earlier field of its"):
        run(ws, "CheckDatasetConsistency", FIELDS, [], fields=FIELDS)
    with pytest.raises(ShapeError, match="'x:lengths'. defines a domain that no field belongs to"):
        ws.feed("l", np.array([1], np.int32))
        run(ws, "CheckDatasetConsistency", ["l"], [], fields=["x:lengths"])


def test_append_adds_rows_in_place():
    ws = Workspace()
    ws.feed("d", np.zeros((0, 2), np.float32))
    ws.feed("x", np.array([[1, 2]], np.float32))
    run(ws, "Append", ["d", "x"], ["d"])
    ws.feed("x", np.array([[3, 4], [5, 6]], np.float32))
    run(ws, "Append", ["d", "x"], ["d"])
    assert ws.fetch("d").tolist() == [[1, 2], [3, 4], [5, 6]] and ws.fetch("d").dtype == np.float32
    ws.feed("s", np.array(["a"], object))
    ws.feed("t", np.array(["bc", "d"], object))
    run(ws, "Append", ["s", "t"], ["s"])
    assert ws.fetch("s").tolist() == ["a", "bc", "d"]
    got = run_op("Append", {"d": np.array([[1, 2]], np.int64), "x": np.array([[3, 4]], np.int64)}, ["d"])
    assert got.tolist() == [[1, 2], [3, 4]] and got.dtype == np.int64       # (run_op checks the shape function)


def test_append_refuses_rows_that_do_not_fit():
    ws = Workspace()
    ws.feed("d", np.zeros((2, 2), np.float32))
    for x, error, match in [(np.zeros((1, 3), np.float32), ShapeError, r"rows of shape \(3,\) to rows of shape \(2,\)"),
                            (np.zeros((1, 2), np.int32), DTypeError, "cannot append int32 data to a float32"),
                            (np.zeros(2, np.float32), ShapeError, "cannot append a 1-D tensor"),
                            (np.float32(1), ShapeError, "the data to append is 0-d")]:
        ws.feed("x", x)
        with pytest.raises(error, match=match):
            run(ws, "Append", ["d", "x"], ["d"])
    assert ws.fetch("d").shape == (2, 2)


def test_atomic_append_appends_every_pair_under_the_mutex():
    ws = Workspace()
    run(ws, "CreateMutex", [], ["m"])
    ws.feed("a", np.array([1], np.int32))
    ws.feed("b", np.zeros(0, np.int64))
    ws.feed("x", np.array([2, 3], np.int32))
    ws.feed("y", np.array([7], np.int64))
    run(ws, "AtomicAppend", ["m", "a", "b", "x", "y"], ["a", "b"])
    assert ws.fetch("a").tolist() == [1, 2, 3] and ws.fetch("b").tolist() == [7]
    assert not ws.get_blob("m").value.locked()
    ws.feed("y", np.array([1.5], np.float32))
    with pytest.raises(DTypeError, match="field 1: cannot append float32 data to a int64"):
        run(ws, "AtomicAppend", ["m", "a", "b", "x", "y"], ["a", "b"])
    assert ws.fetch("a").tolist() == [1, 2, 3]      # checked before any is changed
    with pytest.raises(ArgumentError, match="output 0 must be input 1 .'a'."):
        run(ws, "AtomicAppend", ["m", "a", "x"], ["other"])
    with pytest.raises(ArityError, match="got 4 inputs"):
        run(ws, "AtomicAppend", ["m", "a", "b", "x"], ["a"])
    with pytest.raises(DTypeError, match="input 0 must be a mutex made by CreateMutex"):
        run(ws, "AtomicAppend", ["x", "a", "x"], ["a"])


def test_appends_past_the_blob_limit_are_refused_before_copying():
    ws = Workspace(limits=Limits(max_blob_bytes=1000))
    ws.feed("d", np.zeros(200, np.float32))
    ws.feed("x", np.zeros(100, np.float32))
    with pytest.raises(ResourceError, match="'d'"):
        run(ws, "Append", ["d", "x"], ["d"])
    assert ws.fetch("d").shape == (200,)


def test_pack_records_makes_one_record_per_entry():
    packed = run_op("PackRecords", flatten(RECORDS), fields=FIELDS)
    assert packed.dtype == object and packed.shape == (len(RECORDS),)
    for record, want in zip(packed, RECORDS):
        assert isinstance(record, TensorVector)
        same(list(record), flatten([want]))


def test_unpack_records_reverses_packing():
    ws = Workspace()
    for name, value in zip(FIELDS, flatten(RECORDS)):
        ws.feed(name, value)
    run(ws, "PackRecords", FIELDS, ["p"], fields=FIELDS)
    outs = [f"u{i}" for i in range(len(FIELDS))]
    run(ws, "UnPackRecords", ["p"], outs, fields=FIELDS)
    same([ws.fetch(n) for n in outs], flatten(RECORDS))
    ws.feed("p", np.empty(0, object))
    run(ws, "UnPackRecords", ["p"] + FIELDS, outs, fields=FIELDS)     # prototypes give dtype and dims
    same([ws.fetch(n) for n in outs], flatten([]))


def test_the_check_catches_a_packer_that_splits_by_top_level_rows(broken):
    def by_rows(xp, *data, fields):
        out = np.empty(len(data[0]), object)
        for r in range(len(data[0])):
            out[r] = TensorVector(x[r:r + 1] for x in data)
        return out
    broken("PackRecords", by_rows)
    with pytest.raises(AssertionError):
        test_pack_records_makes_one_record_per_entry()


def test_unpack_refuses_bad_packs():
    ws = Workspace()
    outs = [f"u{i}" for i in range(2)]
    ws.feed("p", np.empty(0, object))
    with pytest.raises(ArgumentError, match="the packed tensor is empty: give prototype tensors"):
        run(ws, "UnPackRecords", ["p"], outs, fields=["x", "y"])
    ws.feed("p", np.array([1.0]))
    with pytest.raises(DTypeError, match="input 0 must be a packed tensor made by PackRecords, got float64"):
        run(ws, "UnPackRecords", ["p"], outs, fields=["x", "y"])
    p = np.empty(2, object)
    p[0] = TensorVector([np.zeros(1, np.float32), np.zeros((1, 2), np.int32)])
    p[1] = TensorVector([np.zeros(2, np.float32), np.zeros((1, 3), np.int32)])
    ws.feed("p", p)
    with pytest.raises(ShapeError, match=r"record 1, field 1 .'y'.: \(1, 3\) int32 does not match"):
        run(ws, "UnPackRecords", ["p"], outs, fields=["x", "y"])
    p[1] = None
    ws.feed("p", p)
    with pytest.raises(DTypeError, match="element 1 of the packed tensor is NoneType"):
        run(ws, "UnPackRecords", ["p"], outs, fields=["x", "y"])
    p[1] = p[0]
    ws.feed("p", p)
    with pytest.raises(ArityError, match="fields names 3 fields, but there are 2 tensors in the first record"):
        run(ws, "UnPackRecords", ["p"], outs + ["u2"], fields=["x", "y", "z"])
    with pytest.raises(ArityError, match="fields names 2 fields, but the op has 1 outputs"):
        run(ws, "UnPackRecords", ["p"], outs[:1], fields=["x", "y"])


def test_unpacking_repeated_records_past_the_blob_limit_is_refused():
    ws = Workspace(limits=Limits(max_blob_bytes=4000))
    p = np.empty(100, object)
    p[:] = [TensorVector([np.zeros(20, np.float32)])] * 100     # 100 references to one 80-byte record
    ws.feed("p", p)
    with pytest.raises(ResourceError, match="'u'"):
        run(ws, "UnPackRecords", ["p"], ["u"], fields=["x"])
