"""stepnet.io.files: every file stepnet reads is a regular file, checked (and size-capped) before a byte is read."""
import os

import pytest

from stepnet.io import files
from stepnet.core.errors import FileFormatError


def test_reads_a_regular_file(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"abc")
    assert files.read_regular(tmp_path / "a.bin") == b"abc"
    with files.open_regular(tmp_path / "a.bin") as f:
        assert f.read() == b"abc"


@pytest.mark.parametrize("reader", [files.read_regular, files.open_regular])
def test_a_fifo_is_refused_without_blocking(fifo, reader, no_hang):
    with pytest.raises(FileFormatError, match=r"pipe: the model is not a regular file \(a FIFO\); stepnet reads only "
                                              "regular files"):
        no_hang(reader, fifo, "the model")


@pytest.mark.parametrize("path, kind", [("/dev/zero", "a character device"), ("/dev/null", "a character device")])
def test_a_device_is_refused_before_reading(path, kind, no_hang):
    if not os.path.exists(path):
        pytest.skip(f"no {path}")
    with pytest.raises(FileFormatError, match=f"not a regular file \\({kind}\\)"):
        no_hang(files.read_regular, path)


def test_a_directory_is_refused(tmp_path):
    with pytest.raises(FileFormatError, match=r"the minidb file is not a regular file \(a directory\)"):
        files.read_regular(tmp_path, "the minidb file")


def test_missing_file_names_the_path_and_the_hint(tmp_path):
    with pytest.raises(FileFormatError, match=r"nope\.pb: no such file \(look elsewhere\)$"):
        files.read_regular(tmp_path / "nope.pb", missing=" (look elsewhere)")


def test_unreadable_file(tmp_path):
    path = tmp_path / "secret"
    path.write_bytes(b"x")
    path.chmod(0)
    if os.access(path, os.R_OK):
        pytest.skip("running as root: permissions are not enforced")
    with pytest.raises(FileFormatError, match="cannot read the model file"):
        files.read_regular(path, "the model file")


def test_size_over_the_limit_is_refused_before_reading(tmp_path):
    path = tmp_path / "big.pb"
    path.write_bytes(b"x" * 100)
    with pytest.raises(FileFormatError, match=r"big\.pb: the model file is 100 bytes, over the limit of 99 bytes$"):
        files.read_regular(path, "the model file", limit=99)
    assert files.read_regular(path, limit=100) == b"x" * 100


def test_the_protobuf_cap_says_why(tmp_path, monkeypatch):
    path = tmp_path / "big.pb"
    with open(path, "wb") as f:
        f.truncate(files.PROTOBUF_LIMIT + 1)   # sparse: nothing is written
    with pytest.raises(FileFormatError, match=r"2\.0 GiB \(2147483648 bytes\), over the limit of 2\.0 GiB \(protobuf "
                                              "parses no message of 2 GiB or more\\)"):
        files.read_regular(path, "the model file", files.PROTOBUF_LIMIT)


def test_a_file_that_says_size_zero_is_still_read_up_to_the_limit():
    path = "/proc/self/status"   # a regular file whose size reads as 0
    if not os.path.exists(path):
        pytest.skip("no /proc")
    assert b"Name:" in files.read_regular(path)
    with pytest.raises(FileFormatError, match="larger than it said when opened"):
        files.read_regular(path, limit=10)
