"""Element-wise string ops (stepnet/ops/strings.py) against byte-level references written here (a prefix or
suffix of n bytes, which may cut a UTF-8 character, as Caffe2's docs say), shapes kept, str elements read as
UTF-8, bad inputs, the gradient kind, and a broken kernel caught."""
import numpy as np
import pytest

from stepnet.core.errors import ArgumentError, DTypeError, GradientError
from stepnet.passes.gradients import gradient_of_op
from stepnet.testing import make_op, run_op

WORDS = ["", "a", "ab", "abc", "abcd", "héllo", "ü€x", "ba", "aba"]


def tensor(items, shape=None):
    out = np.empty(len(items), object)
    out[:] = items
    return out.reshape(shape or (len(items),))


def byte_prefix(s: bytes, n: int) -> bytes:
    return bytes(s[i] for i in range(min(n, len(s))))


def byte_suffix(s: bytes, n: int) -> bytes:
    return bytes(s[i] for i in range(max(len(s) - n, 0), len(s)))


def check_ops():
    raw = [w.encode() for w in WORDS]
    x = tensor(raw[:8], (2, 4))
    for length in (0, 1, 3, 10):
        got = run_op("StringPrefix", [x], length=length)
        assert got.shape == (2, 4) and got.reshape(-1).tolist() == [byte_prefix(s, length) for s in raw[:8]]
        got = run_op("StringSuffix", [x], length=length)
        assert got.reshape(-1).tolist() == [byte_suffix(s, length) for s in raw[:8]]
    y = tensor(WORDS)   # str elements: their UTF-8 bytes
    for fix in ("", "a", "ab", "é"):
        want = [w.encode()[:len(fix.encode())] == fix.encode() for w in WORDS]
        got = run_op("StringStartsWith", [y], prefix=fix)
        assert got.dtype == np.bool_ and got.tolist() == want
        want = [len(w.encode()) >= len(fix.encode()) and w.encode()[len(w.encode()) - len(fix.encode()):] ==
                fix.encode() for w in WORDS]
        assert run_op("StringEndsWith", [y], suffix=fix).tolist() == want


def test_ops_against_byte_references():
    check_ops()


def test_the_check_catches_a_character_prefix(broken):
    def by_characters(xp, strings, *, length):
        return tensor([s.decode()[:length].encode() for s in strings.reshape(-1)], strings.shape)
    broken("StringPrefix", by_characters)
    with pytest.raises(AssertionError):
        check_ops()


def test_a_prefix_may_cut_a_character():
    assert run_op("StringPrefix", [tensor(["é".encode()])], length=1).tolist() == [b"\xc3"]


def test_bad_inputs_and_gradient():
    with pytest.raises(DTypeError, match="input 0 must be a string tensor, got float32"):
        run_op("StringPrefix", [np.zeros(2, np.float32)])
    with pytest.raises(DTypeError, match="input 0 must hold strings, but it holds int values"):
        run_op("StringEndsWith", [tensor([b"a", 3])], suffix="a")
    with pytest.raises(ArgumentError, match="length must be >= 0"):
        run_op("StringSuffix", [tensor([b"a"])], length=-1)
    with pytest.raises(GradientError, match="not differentiable"):
        gradient_of_op(make_op("StringPrefix", ["s"], ["p"]), ["p_grad"])
