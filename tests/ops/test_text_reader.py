"""Text file readers (stepnet/ops/text_reader.py): rows of tab-separated fields read in batches over several
passes, checked against a reference written here from Caffe2's docs (split on newlines into rows and on tabs
into fields; text after the last newline is not a row; STRING fields as bytes, FLOAT as float32), escapes,
chunk boundaries, bad rows, the file-root confinement, and a broken kernel caught."""
import numpy as np
import pytest

from stepnet import NetDef, Workspace
from stepnet.core.errors import ArgumentError, DTypeError, FileAccessError, FileFormatError
from stepnet.core.limits import Limits
from stepnet.io.proto import DataType
from stepnet.ops import text_reader
from stepnet.testing import make_op

S, F = int(DataType.STRING), int(DataType.FLOAT)


def reference_rows(text: bytes, passes: int) -> list:
    """Rows of fields of every pass (complete lines only)."""
    lines = text.split(b"\n")[:-1]
    return [line.split(b"\t") for line in lines] * passes


def read_all(tmp_path, text: bytes, types, batch_size, passes=1):
    path = tmp_path / "data.tsv"
    path.write_bytes(text)
    ws = Workspace(limits=Limits(file_root=tmp_path))
    ws.run_operator_once(make_op("CreateTextFileReader", [], ["r"], filename=str(path), num_passes=passes,
                                 field_types=types))
    outs = [f"f{i}" for i in range(len(types))]
    net = NetDef(name="read")
    net.op.extend([make_op("TextFileReaderRead", ["r"], outs, batch_size=batch_size)])
    bound, batches = ws.bind(net), []
    while True:
        bound.run()
        batch = [ws.fetch(o) for o in outs]
        if batch[0].shape[0] == 0:
            return ws, batches
        batches.append(batch)


def columns(batches, i):
    return [v for batch in batches for v in batch[i].tolist()]


@pytest.mark.parametrize("batch_size,passes", [(1, 1), (2, 1), (3, 2), (10, 3)])
def test_rows_in_batches_over_passes(tmp_path, batch_size, passes):
    text = b"a\t0.5\tx y\nbb\t-2e3\t\nccc\t  7\tz\n"
    _, batches = read_all(tmp_path, text, [S, F, S], batch_size, passes)
    rows = reference_rows(text, passes)
    assert [len(b[0]) for b in batches[:-1]] == [batch_size] * (len(batches) - 1)   # full batches, then the rest
    assert columns(batches, 0) == [r[0] for r in rows]
    assert columns(batches, 2) == [r[2] for r in rows]
    assert batches[0][1].dtype == np.float32 and batches[0][0].dtype == object
    np.testing.assert_allclose(columns(batches, 1), [0.5, -2000.0, 7.0] * passes)


def test_text_after_the_last_newline_is_not_a_row(tmp_path):
    _, batches = read_all(tmp_path, b"a\nb\nunfinished", [S], 5, passes=2)
    assert columns(batches, 0) == [b"a", b"b", b"a", b"b"]


def test_long_fields_across_chunks_and_escapes(tmp_path, monkeypatch):
    monkeypatch.setattr(text_reader, "CHUNK", 3)      # every token crosses a chunk boundary
    text = b"abcdefg\th\x00\ti\nxy\x00\nz\t\x00\x00\n"
    _, batches = read_all(tmp_path, text, [S, S], 1)
    assert columns(batches, 0) == [b"abcdefg", b"xy\nz"]          # NUL makes the next byte literal
    assert columns(batches, 1) == [b"h\ti", b"\x00"]


def test_float_fields_parse_a_leading_number(tmp_path):
    _, batches = read_all(tmp_path, b" 1.5e1xyz\n-inf\n.25\n", [F], 4)
    assert columns(batches, 0) == [15.0, -np.inf, 0.25]
    with pytest.raises(FileFormatError, match="invalid float"):
        read_all(tmp_path, b"1\nabc\n", [F], 4)


def test_bad_rows_and_arguments(tmp_path):
    with pytest.raises(FileFormatError, match="does not have 2 fields"):
        read_all(tmp_path, b"a\tb\nc\nd\te\n", [S, S], 5)
    with pytest.raises(FileFormatError, match="ends in the middle of row 2"):
        read_all(tmp_path, b"a\tb\nc\n", [S, S], 5)
    with pytest.raises(FileFormatError, match="does not have 1 fields"):
        read_all(tmp_path, b"a\tb\n", [S], 5)
    with pytest.raises(ArgumentError, match="field_types must be non-empty"):
        read_all(tmp_path, b"a\n", [], 1)
    with pytest.raises(ArgumentError, match="only STRING"):
        read_all(tmp_path, b"1\n", [int(DataType.INT32)], 1)
    with pytest.raises(ArgumentError, match="batch_size must be >= 0"):
        read_all(tmp_path, b"1\n", [S], -1)
    ws = Workspace()
    ws.feed("x", np.zeros(2, np.float32))
    with pytest.raises(DTypeError, match="text file reader made by CreateTextFileReader"):
        ws.run_operator_once(make_op("TextFileReaderRead", ["x"], ["y"]))
    with pytest.raises(FileFormatError, match="no such file"):
        Workspace(limits=Limits(file_root=tmp_path)).run_operator_once(
            make_op("CreateTextFileReader", [], ["r"], filename=str(tmp_path / "missing"), field_types=[S]))


def test_the_output_count_must_match_the_fields(tmp_path):
    path = tmp_path / "d.tsv"
    path.write_bytes(b"a\tb\n")
    ws = Workspace(limits=Limits(file_root=tmp_path))
    ws.run_operator_once(make_op("CreateTextFileReader", [], ["r"], filename=str(path), field_types=[S, S]))
    with pytest.raises(ArgumentError, match="2 fields, the op 1 outputs"):
        ws.run_operator_once(make_op("TextFileReaderRead", ["r"], ["a"]))


def test_the_file_must_lie_under_the_file_root(tmp_path):
    inside = tmp_path / "root"
    inside.mkdir()
    outside = tmp_path / "secret.tsv"
    outside.write_bytes(b"a\n")
    ws = Workspace(limits=Limits(file_root=inside))
    with pytest.raises(FileAccessError, match="outside the file root"):
        ws.run_operator_once(make_op("CreateTextFileReader", [], ["r"], filename=str(outside), field_types=[S]))
    (inside / "link.tsv").symlink_to(outside)
    with pytest.raises(FileAccessError, match="outside the file root"):
        ws.run_operator_once(make_op("CreateTextFileReader", [], ["r"], filename=str(inside / "link.tsv"),
                                     field_types=[S]))


def test_a_field_longer_than_a_blob_may_be_is_refused(tmp_path):
    path = tmp_path / "big.tsv"
    path.write_bytes(b"x" * 5000 + b"\n")
    ws = Workspace(limits=Limits(file_root=tmp_path, max_blob_bytes=1000))
    ws.run_operator_once(make_op("CreateTextFileReader", [], ["r"], filename=str(path), field_types=[S]))
    with pytest.raises(Exception, match="max_blob_bytes"):
        ws.run_operator_once(make_op("TextFileReaderRead", ["r"], ["a"], batch_size=1))


def test_the_check_catches_a_reader_that_drops_the_last_row(tmp_path, broken):
    kernel = text_reader.text_file_reader_read

    def drops_last(ctx, xp, reader, *, batch_size):
        out = kernel(ctx, xp, reader, batch_size=batch_size)
        return tuple(o[:-1] if len(o) < batch_size else o for o in out)

    broken("TextFileReaderRead", drops_last)
    text = b"a\nb\nc\n"
    _, batches = read_all(tmp_path, text, [S], 2)
    assert columns(batches, 0) != [r[0] for r in reference_rows(text, 1)]
