"""compat.schema, dataio and text_file_reader: leaf names, types and positions written out by hand, records
tied to blobs, Struct algebra, and a TextFileReader reading a file through the ops."""
import numpy as np
import pytest

from stepnet.compat import core, workspace
from stepnet.compat.schema import (FetchRecord, FeedRecord, InitEmptyRecord, List, Map, NewRecord, RawTuple, Scalar,
                                   Struct, Tuple, as_record, data_type_for_dtype, equal_schemas, from_blob_list,
                                   from_column_list, from_dtype)
from stepnet.compat.text_file_reader import TextFileReader


def nested():
    return Struct(("dense", Scalar((np.float32, 3))),
                  ("ids", Map(Scalar(np.int32), List(Scalar(np.int64)))),
                  ("meta", Struct(("query", Scalar(str)))))


def test_leaf_names_types_and_positions():
    s = nested()
    assert s.field_names() == ["dense", "ids:lengths", "ids:values:keys", "ids:values:values:lengths",
                               "ids:values:values:values", "meta:query"]
    assert s.field_types() == [np.dtype((np.float32, 3)), np.dtype(np.int32), np.dtype(np.int32),
                               np.dtype(np.int32), np.dtype(np.int64), np.dtype(str)]
    assert s.ids.values.lengths.id() == 3 and s.meta.query.id() == 5
    assert s.ids.keys is s["ids:values:keys"]           # a list of structs shows the struct's fields
    assert s.ids.slice() == slice(1, 5)
    assert "ids:values" in s and "ids:nothing" not in s
    with pytest.raises(TypeError):
        s.extra = 1


def test_struct_algebra_and_builders():
    a = Struct(("x", Scalar()), ("b", Struct(("c", Scalar()))))
    b = Struct(("b:d", Scalar()))
    assert (a + b).field_names() == ["x", "b:c", "b:d"]
    assert ((a + b) - a).field_names() == ["b:d"]
    assert Tuple(np.int32, np.float32).field_names() == ["field_0", "field_1"]
    assert RawTuple(2).field_types() == [np.dtype(np.void)] * 2
    rebuilt = from_column_list(nested().field_names(), nested().field_types())
    assert equal_schemas(rebuilt, nested())
    assert isinstance(rebuilt.ids, List) and rebuilt.ids.keys.field_types() == [np.dtype(np.int32)]
    assert from_dtype(np.float32, _outer_shape=(2,)).field_types() == [np.dtype((np.float32, 2))]
    assert as_record({"k": np.int64}).field_names() == ["k"]
    assert data_type_for_dtype(np.dtype(str)) == core.DataType.STRING
    with pytest.raises(TypeError):
        data_type_for_dtype(np.dtype(np.complex64))


def test_records_feed_and_fetch_through_blobs():
    s = nested()
    values = [[[1, 2, 3]], [2], [7, 8], [1, 0], [9], ["q"]]
    contents = from_blob_list(s, values)
    assert contents.dense.get().shape == (1, 3) and contents["ids:values:values:values"].get().dtype == np.int64
    net = core.Net("records")
    record = NewRecord(net, s)
    FeedRecord(record, contents)
    back = FetchRecord(record)
    for got, want in zip(back.field_blobs(), contents.field_blobs()):
        np.testing.assert_array_equal(got, want)
    empty = core.Net("empty")
    blank = InitEmptyRecord(empty, s.clone_schema())
    workspace.RunNetOnce(empty)
    assert [workspace.FetchBlob(str(b)).shape for b in blank.field_blobs()] == [(0, 3)] + [(0,)] * 5
    with pytest.raises(ValueError, match="ambiguous"):
        Scalar(np.int32, "name")


def test_text_file_reader_reads_batches_until_should_stop(tmp_path):
    path = tmp_path / "rows.tsv"
    path.write_text("a\t1.5\nb\t-2\nc\t3\n")
    init = core.Net("init")
    reader = TextFileReader(init, str(path), Struct(("s", Scalar(str)), ("v", Scalar(np.float32))),
                            num_passes=2, batch_size=4)
    workspace.RunNetOnce(init)
    net = core.Net("read")
    should_stop, record = reader.read_record(net)
    got = []
    while True:
        workspace.RunNetOnce(net)
        if workspace.FetchBlob(str(should_stop)):
            break
        batch = FetchRecord(record)
        got += list(zip(batch.s.get().tolist(), batch.v.get().tolist()))
    assert got == [("a", 1.5), ("b", -2.0), ("c", 3.0)] * 2
