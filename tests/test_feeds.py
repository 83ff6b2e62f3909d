"""stepnet.io.feeds: --feed values. Literals that are not numbers in a rectangular list, values a dtype cannot hold,
and .npy/.npz files whose headers promise more than the file holds are one clean error, before anything is
allocated."""
import os
import struct
import zipfile

import numpy as np
import pytest

from stepnet.core.errors import ArgumentError, FileFormatError
from stepnet.io.feeds import parse_feed
from stepnet.testing import allocates_under


@pytest.mark.parametrize("spec, want", [
    ("X=[[1, 0], [1, 1]]", np.array([[1, 0], [1, 1]], np.float32)),
    ("X=3", np.array(3, np.float32)),
    ("X=-2.5", np.array(-2.5, np.float32)),
    ("X=[]", np.zeros((0,), np.float32)),
    ("X=[[], []]", np.zeros((2, 0), np.float32)),
    ("X=(1, 2)", np.array([1, 2], np.float32)),
    ("X=[True, False]", np.array([True, False])),
    ("X=[1, True]", np.array([1, 1], np.float32)),
    ("seq=[25, 25]:int32", np.array([25, 25], np.int32)),
    ("ids=[9223372036854775807]:int64", np.array([2**63 - 1], np.int64)),
    ("X=[1e300]:float64", np.array([1e300])),
    ("X=[1e999, -1e999]", np.array([np.inf, -np.inf], np.float32)),
    ("X=[1.5]:int8", np.array([1], np.int8)),
    ("X=[[1]]:bool", np.array([[True]])),
    ("X=" + "[" * 64 + "1" + "]" * 64, np.ones((1,) * 64, np.float32)),
])
def test_literals(spec, want):
    (got,) = parse_feed(spec).values()
    assert got.dtype == want.dtype and got.shape == want.shape and got.tolist() == want.tolist()


@pytest.mark.parametrize("spec, message", [
    ("X=[[99999999999999999999999,1]]:int64", r"99999999999999999999999 does not fit int64 \(-9223372036854775808 to "
                                              r"9223372036854775807\)"),
    ("X=[300]:uint8", r"300 does not fit uint8 \(0 to 255\)"),
    ("X=[-1]:uint16", "-1 does not fit uint16"),
    ("X=[1e300]", r"1e\+300 does not fit float32"),
    ("X=[70000]:float16", "70000 does not fit float16"),
    ("X=[1" + "0" * 400 + "]", r"10000000000000000000\.\.\.\(401 digits\) does not fit float32"),
    ("X=[1e30]:int32", r"1e\+30 does not fit int32"),
    ("X=[[1,2],[3]]", r"the list is ragged: item 0 has shape \(2,\) but item 1 has \(1,\)"),
    ("X=[[1,2],3]", r"ragged: item 0 has shape \(2,\) but item 1 has \(\)"),
    ("X=" + "[" * 65 + "1" + "]" * 65, "brackets nested 65 deep; an array has at most 64 dims"),
    ("X=" + "[" * 100000 + "1" + "]" * 100000, "brackets nested 100000 deep"),
    ("X=" + "(" * 300 + "1" + ")" * 300, "brackets nested 300 deep"),
    ("X=" + "-" * 100000 + "1", "not a file .* nor a number or list literal"),
    ("X=['a',1]", "'a' is not a number; a value is a number or a nested list of numbers"),
    ("X=[None]", "None is not a number"),
    ("X=[1j]", "1j is not a number"),
    ("X={1, 2}", r"\{1, 2\} is not a number"),
    ("X=[1, 2", "not a file .* nor a number or list literal"),
    ("X=__import__('os')", "not a file .* nor a number or list literal"),
    ("X=" + "9" * 5000, "not a file .* nor a number or list literal"),
])
def test_bad_literals_are_one_argument_error_naming_the_feed(spec, message):
    with pytest.raises(ArgumentError, match=message) as info:
        parse_feed(spec)
    assert str(info.value).startswith("--feed X=") and "\n" not in str(info.value)
    assert len(str(info.value)) < 400


def npy_bytes(arr, shape_text=None) -> bytes:
    import io
    buf = io.BytesIO()
    np.save(buf, arr)
    data = buf.getvalue()
    if shape_text is not None:   # same header length: the padding absorbs the difference
        old = repr(arr.shape).encode()
        header_len = struct.unpack("<H", data[8:10])[0]
        header = data[10:10 + header_len].replace(old + b", }", shape_text.encode() + b", }")
        header = header.rstrip(b"\n ").ljust(header_len - 1) + b"\n"
        assert len(header) == header_len
        data = data[:10] + header + data[10 + header_len:]
    return data


@pytest.mark.parametrize("shape_text, message", [
    ("(9999999, 99999)", r"its header claims shape \(9999999, 99999\) float32 \(3999959600004 bytes of data\) but only "
                         r"24 bytes follow it"),
    ("(4611686018427387904, 4)", "claims shape"),
    ("(-1, 3)", r"impossible shape \(-1, 3\)"),
])
def test_an_npy_header_that_lies_allocates_nothing(tmp_path, shape_text, message):
    path = tmp_path / "x.npy"
    path.write_bytes(npy_bytes(np.zeros((2, 3), np.float32), shape_text))
    with allocates_under(), pytest.raises(FileFormatError, match=message):
        parse_feed(f"X={path}")


def test_a_truncated_npy_and_a_good_one(tmp_path):
    path = tmp_path / "x.npy"
    data = npy_bytes(np.arange(6, dtype=np.int64).reshape(2, 3))
    path.write_bytes(data)
    assert parse_feed(f"X={path}")["X"].tolist() == [[0, 1, 2], [3, 4, 5]]
    path.write_bytes(data[:-1])
    with pytest.raises(FileFormatError, match=r"claims shape \(2, 3\) int64 \(48 bytes of data\) but only 47 bytes"):
        parse_feed(f"X={path}")
    path.write_bytes(b"\x93NUMPY garbage")
    with pytest.raises(FileFormatError, match=r"x\.npy is not a readable \.npy file"):
        parse_feed(f"X={path}")


def test_an_npz_member_that_lies_allocates_nothing(tmp_path):
    path = tmp_path / "x.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("ok.npy", npy_bytes(np.ones(3, np.float32)))
        z.writestr("liar.npy", npy_bytes(np.zeros((2, 3), np.float32), "(9999999, 99999)"))
    with allocates_under(), pytest.raises(FileFormatError, match=r"x\.npz member 'liar\.npy': its header "
                                                             r"claims shape \(9999999, 99999\)"):
        parse_feed(str(path))


def test_an_npz_member_claiming_more_than_deflate_can_give(tmp_path):
    path = tmp_path / "x.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("a.npy", npy_bytes(np.zeros(1000, np.float32)))
    data = bytearray(path.read_bytes())
    for sig, at in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):   # the uncompressed size, in both headers
        pos = data.find(sig)
        data[pos + at:pos + at + 4] = struct.pack("<I", 2**32 - 1)
    path.write_bytes(bytes(data))
    with pytest.raises(FileFormatError, match=r"member 'a\.npy' claims 4294967295 bytes from \d+ compressed, more "
                                              "than DEFLATE can expand to"):
        parse_feed(str(path))


def test_npz_feeds_still_work(tmp_path):
    np.savez(tmp_path / "a.npz", X=np.ones((2, 2), np.float32), y=np.arange(3))
    np.savez_compressed(tmp_path / "b.npz", X=np.zeros((50, 50)))
    got = parse_feed(str(tmp_path / "a.npz"))
    assert sorted(got) == ["X", "y"] and got["y"].tolist() == [0, 1, 2]
    assert parse_feed(f"Z={tmp_path / 'b.npz'}")["Z"].shape == (50, 50)
    (tmp_path / "bad.npz").write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(FileFormatError, match=r"bad\.npz is not a readable \.npz file"):
        parse_feed(str(tmp_path / "bad.npz"))


@pytest.mark.parametrize("suffix", [".npy", ".npz", ".png"])
def test_feeds_are_regular_files(tmp_path, suffix, no_hang):
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs")
    pytest.importorskip("PIL")
    pipe = tmp_path / f"pipe{suffix}"
    os.mkfifo(pipe)
    with pytest.raises(FileFormatError, match=r"is not a regular file \(a FIFO\); stepnet reads only regular files"):
        no_hang(parse_feed, f"X={pipe}")
    (tmp_path / f"dir{suffix}").mkdir()
    with pytest.raises(FileFormatError, match=r"is not a regular file \(a directory\)"):
        parse_feed(f"X={tmp_path / f'dir{suffix}'}")


def test_an_image_pillow_cannot_read_is_a_file_format_error(tmp_path):
    pytest.importorskip("PIL")
    (tmp_path / "x.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)
    with pytest.raises(FileFormatError, match=r"x\.png: not an image Pillow can read"):
        parse_feed(f"X={tmp_path / 'x.png'}")
