"""stepnet.io.proto: TensorProto <-> ndarray, Argument <-> Python value, load/save of NetDef and PlanDef files.

Expected values are built independently of the code under test: wire bytes by hand (varints, struct.pack),
float16 / bfloat16 values from explicit bit patterns, small-int narrowing from modular arithmetic.
"""
from __future__ import annotations

import errno
import os
import random
import re
import stat
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest

import stepnet
from stepnet.io import proto
from stepnet.core.errors import ArgumentError, FileFormatError
from stepnet.testing import allocates_under

FLOAT, INT32, BYTE, STRING, BOOL, UINT8, INT8, UINT16, INT16, INT64, FLOAT16, DOUBLE = (
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 13)


# ----------------------------------------------------------------------------------- wire-format helpers
def varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative ints are sign-extended to 64 bits on the wire
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def key(field: int, wire: int) -> bytes:
    return varint(field << 3 | wire)


def ld(field: int, payload: bytes) -> bytes:
    """A length-delimited record."""
    return key(field, 2) + varint(len(payload)) + payload


def vi(field: int, value: int) -> bytes:
    return key(field, 0) + varint(value)


def packed(field: int, values, fmt: str | None = None) -> bytes:
    """A packed repeated field: varints, or fixed-size values packed with struct format `fmt`."""
    body = struct.pack("<%d%s" % (len(values), fmt), *values) if fmt else b"".join(map(varint, values))
    return ld(field, body)


def fixed32(field: int, value: float) -> bytes:
    """One unpacked float record."""
    return key(field, 5) + struct.pack("<f", value)


def head(dims, data_type) -> bytes:
    """TensorProto.dims (field 1, unpacked) and data_type (field 2)."""
    return b"".join(vi(1, d) for d in dims) + vi(2, data_type)


def tensor(dims, data_type, *records) -> proto.TensorProto:
    """A TensorProto parsed from hand-made wire bytes."""
    return proto.TensorProto.FromString(head(dims, data_type) + b"".join(records))


def f16(bits):
    return np.array(bits, dtype=np.uint16).view(np.float16)


def bf16(bits):
    return np.array([struct.unpack("<f", struct.pack("<I", b << 16))[0] for b in bits], dtype=np.float32)


def assert_same_array(got, expected):
    """Same dtype, shape and elements; floats compared bit for bit (so -0.0 and inf count)."""
    expected = np.asarray(expected)
    assert isinstance(got, np.ndarray)
    assert got.dtype == expected.dtype and got.shape == expected.shape, (got.dtype, got.shape)
    if expected.dtype.kind == "f":
        assert got.tobytes() == expected.tobytes(), (got, expected)
    else:
        assert got.tolist() == expected.tolist()


# ----------------------------------------------------------------------------------- TensorProto -> ndarray
F32 = [0.0, 1.5, -2.25, float("inf"), -0.0, 3.0e-5]
HALF_BITS = [0x3C00, 0xC000, 0x7BFF, 0x0001, 0x7C00, 0x8000]  # 1, -2, 65504, 2**-24, inf, -0
BF16_BITS = [0x3F80, 0xC020, 0x4049, 0x7F80]  # 1, -2.5, 3.140625, inf
DECODE_CASES = {
    # typed fields, as Caffe2 writes them
    "FLOAT": (tensor([2, 3], FLOAT, packed(3, F32, "f")), np.array(F32, np.float32).reshape(2, 3)),
    "FLOAT unpacked": (tensor([2], FLOAT, fixed32(3, 1.5), fixed32(3, -4)),
                       np.array([1.5, -4], np.float32)),
    "INT32": (tensor([4], INT32, packed(4, [-7, 0, 2**31 - 1, -2**31])),
              np.array([-7, 0, 2**31 - 1, -2**31], np.int32)),
    "BYTE": (tensor([4], BYTE, ld(5, b"\x00\x7f\x80\xff")), np.array([0, 127, 128, 255], np.uint8)),
    "STRING": (tensor([3], STRING, ld(6, b"abc"), ld(6, b""), ld(6, b"\xff\x00")),
               np.array([b"abc", b"", b"\xff\x00"], dtype=object)),
    "BOOL": (tensor([3], BOOL, packed(4, [1, 0, 1])), np.array([True, False, True])),
    "UINT8": (tensor([3], UINT8, packed(4, [0, 200, 255])), np.array([0, 200, 255], np.uint8)),
    "INT8": (tensor([3], INT8, packed(4, [-128, 127, -1])), np.array([-128, 127, -1], np.int8)),
    "UINT16": (tensor([3], UINT16, packed(4, [0, 65535, 1234])), np.array([0, 65535, 1234], np.uint16)),
    "INT16": (tensor([2], INT16, packed(4, [-32768, 32767])), np.array([-32768, 32767], np.int16)),
    "INT64": (tensor([3], INT64, packed(10, [2**40, -2**63, 2**63 - 1])),
              np.array([2**40, -2**63, 2**63 - 1], np.int64)),
    "FLOAT16 int32_data bits": (tensor([2, 3], FLOAT16, packed(4, HALF_BITS)), f16(HALF_BITS).reshape(2, 3)),
    "DOUBLE": (tensor([3], DOUBLE, packed(9, [0.1, -1e300, 2.5], "d")), np.array([0.1, -1e300, 2.5])),
    # int32_data holding small ints is narrowed like C++ static_cast (modulo 2**bits; BOOL: non-zero is true)
    "UINT8 narrowed": (tensor([2], UINT8, packed(4, [263, -1])), np.array([263 - 256, 256 - 1], np.uint8)),
    "INT8 narrowed": (tensor([1], INT8, packed(4, [200])), np.array([200 - 256], np.int8)),
    "UINT16 narrowed": (tensor([1], UINT16, packed(4, [70000])), np.array([70000 - 65536], np.uint16)),
    "INT16 narrowed": (tensor([1], INT16, packed(4, [40000])), np.array([40000 - 65536], np.int16)),
    "BOOL narrowed": (tensor([2], BOOL, packed(4, [2, 0])), np.array([True, False])),
    # byte_data, little-endian (caffe2_serialize_using_bytes_as_holder / caffe2_serialize_fp16_as_bytes)
    "BOOL bytes": (tensor([3], BOOL, ld(5, b"\x01\x00\x01")), np.array([True, False, True])),
    "UINT8 bytes": (tensor([2], UINT8, ld(5, b"\x00\xff")), np.array([0, 255], np.uint8)),
    "INT8 bytes": (tensor([2], INT8, ld(5, b"\x80\x7f")), np.array([-128, 127], np.int8)),
    "UINT16 bytes": (tensor([2], UINT16, ld(5, b"\x01\x00\xcd\xab")), np.array([1, 0xABCD], np.uint16)),
    "INT16 bytes": (tensor([2], INT16, ld(5, b"\x00\x80\xff\x7f")), np.array([-32768, 32767], np.int16)),
    "FLOAT16 bytes": (tensor([3], FLOAT16, ld(5, b"\x00\x3c\x00\xc0\x00\x7c")),
                      f16([0x3C00, 0xC000, 0x7C00])),
    # raw_data, little-endian
    "FLOAT raw": (tensor([2], FLOAT, ld(13, struct.pack("<2f", 1.5, -0.0))),
                  np.array([1.5, -0.0], np.float32)),
    "INT32 raw": (tensor([2], INT32, ld(13, struct.pack("<2i", -5, 7))), np.array([-5, 7], np.int32)),
    "INT64 raw": (tensor([1], INT64, ld(13, struct.pack("<q", -2**62))), np.array([-2**62], np.int64)),
    "DOUBLE raw": (tensor([1], DOUBLE, ld(13, struct.pack("<d", 0.1))), np.array([0.1])),
    "UINT16 raw": (tensor([2], UINT16, ld(13, b"\x34\x12\xff\xff")), np.array([0x1234, 0xFFFF], np.uint16)),
    "INT8 raw": (tensor([2], INT8, ld(13, b"\xff\x01")), np.array([-1, 1], np.int8)),
    "FLOAT16 raw": (tensor([2], FLOAT16, ld(13, b"\x00\x3c\x00\xbc")), f16([0x3C00, 0xBC00])),
    # bfloat16: data_format = 1, the upper halves of float32 bit patterns in raw_data
    "FLOAT bfloat16": (tensor([2, 2], FLOAT, vi(15, 1), ld(13, struct.pack("<4H", *BF16_BITS))),
                       bf16(BF16_BITS).reshape(2, 2)),
    # empty tensors keep their dims; dims [] is a scalar
    "FLOAT empty": (tensor([0, 3], FLOAT), np.zeros((0, 3), np.float32)),
    "INT64 empty": (tensor([2, 0, 3], INT64), np.zeros((2, 0, 3), np.int64)),
    "STRING empty": (tensor([0], STRING), np.zeros((0,), dtype=object)),
    "FLOAT16 empty": (tensor([0], FLOAT16), np.zeros((0,), np.float16)),
    "BOOL empty": (tensor([0, 2], BOOL), np.zeros((0, 2), bool)),
    "FLOAT scalar": (tensor([], FLOAT, packed(3, [2.5], "f")), np.array(2.5, np.float32)),
}


def test_bit_pattern_tables_mean_what_they_say():
    halves = f16(HALF_BITS).astype(np.float64).tolist()
    assert halves[:5] == [1.0, -2.0, 65504.0, 2.0**-24, float("inf")]
    assert halves[5] == 0.0 and str(halves[5]) == "-0.0"
    assert bf16(BF16_BITS).tolist() == [1.0, -2.5, 3.140625, float("inf")]


@pytest.mark.parametrize("case", sorted(DECODE_CASES))
def test_tensor_to_array(case):
    t, expected = DECODE_CASES[case]
    assert_same_array(proto.tensor_to_array(t), expected)


def test_every_data_type_is_covered():
    names = {case.split()[0] for case in DECODE_CASES}
    assert names == {"FLOAT", "INT32", "BYTE", "STRING", "BOOL", "UINT8", "INT8", "UINT16", "INT16", "INT64",
                     "FLOAT16", "DOUBLE"}


@pytest.mark.parametrize("t, dims, need, holds", [
    (tensor([2, 3], FLOAT, packed(3, [1.0] * 5, "f")), "[2, 3]", 6, 5),
    (tensor([4], INT64, packed(10, [1, 2, 3])), "[4]", 4, 3),
    (tensor([2], STRING, ld(6, b"a")), "[2]", 2, 1),
    (tensor([3], UINT16, ld(5, b"\x01\x00\x02\x00")), "[3]", 3, 2),
    (tensor([], FLOAT), "[]", 1, 0),
    (tensor([2], FLOAT, vi(15, 1), ld(13, struct.pack("<3H", 1, 2, 3))), "[2]", 2, 3),
])
def test_element_count_mismatch_names_dims_and_counts(t, dims, need, holds):
    t.name = "w"
    pattern = "'w'.*" + re.escape(f"dims {dims} need {need} elements") + f".* holds {holds}$"
    with pytest.raises(FileFormatError, match=pattern):
        proto.tensor_to_array(t)


@pytest.mark.parametrize("t, size", [
    (tensor([2], FLOAT, ld(13, b"\x00" * 7)), 7),
    (tensor([2], UINT16, ld(5, b"\x01\x00\x02")), 3),
    (tensor([2], FLOAT, vi(15, 1), ld(13, b"\x80\x3f\x00")), 3),
], ids=["raw FLOAT 7 bytes", "byte_data UINT16 3 bytes", "bfloat16 3 bytes"])
def test_byte_payload_of_a_partial_element_is_a_file_format_error(t, size):
    t.name = "w"
    with pytest.raises(FileFormatError, match=rf"'w'.*\b{size} bytes"):
        proto.tensor_to_array(t)


def test_undefined_data_type_is_a_file_format_error():
    with pytest.raises(FileFormatError, match="UNDEFINED"):
        proto.tensor_to_array(tensor([1], 0, ld(6, b"x")))


# ----------------------------------------------------------------------------------- chunks (segment)
def segment(begin: int, end: int) -> bytes:
    return ld(11, vi(1, begin) + vi(2, end))


def test_one_chunk_alone_gives_its_own_elements():
    t = tensor([2, 3], FLOAT, segment(2, 5), packed(3, [2.0, 3.0, 4.0], "f"))
    assert_same_array(proto.tensor_to_array(t), np.array([2.0, 3.0, 4.0], np.float32))


@pytest.mark.parametrize("t, expected", [
    (tensor([2, 3], FLOAT, segment(0, 6), packed(3, [0, 1, 2, 3, 4, 5], "f")),
     np.arange(6, dtype=np.float32).reshape(2, 3)),
    (tensor([0, 3], FLOAT, segment(0, 0)), np.zeros((0, 3), np.float32)),
], ids=["2x3", "0x3"])
def test_a_segment_covering_the_whole_tensor_keeps_the_dims(t, expected):
    # Caffe2's TensorSerializer sets `segment` on every tensor it writes, also when it is not chunked.
    assert_same_array(proto.tensor_to_array(t), expected)


def test_join_chunks_reassembles_out_of_order_chunks():
    values = [float(v) for v in range(10)]
    chunks = [tensor([2, 5], FLOAT, segment(8, 10), packed(3, values[8:], "f")),
              tensor([2, 5], FLOAT, segment(0, 4), packed(3, values[:4], "f")),
              tensor([2, 5], FLOAT, segment(4, 8), packed(3, values[4:8], "f"))]
    assert_same_array(proto.join_chunks(chunks), np.array(values, np.float32).reshape(2, 5))
    bits = [0x3C00, 0x4000, 0x4200, 0x4400]
    halves = [tensor([4], FLOAT16, segment(2, 4), packed(4, bits[2:])),
              tensor([4], FLOAT16, segment(0, 2), packed(4, bits[:2]))]
    assert_same_array(proto.join_chunks(halves), f16(bits))


@pytest.mark.parametrize("ranges", [[(0, 4), (4, 8)], [(0, 2), (4, 6)], [(0, 4), (2, 6)]],
                         ids=["past the end", "gap", "overlap"])
def test_join_chunks_rejects_chunks_that_do_not_tile_the_tensor(ranges):
    # Caffe2's Load op enforces that the chunks of a blob add up to its size ("Data size mismatch").
    chunks = [tensor([6], FLOAT, segment(b, e), packed(3, [1.0] * (e - b), "f")) for b, e in ranges]
    with pytest.raises(FileFormatError):
        proto.join_chunks(chunks)


# ----------------------------------------------------------------------------------- ndarray -> TensorProto
ENCODE_CASES = {
    "float32": (np.array([[1.5, -2.0]], np.float32), head([1, 2], FLOAT) + packed(3, [1.5, -2.0], "f")),
    "float64": (np.array([0.1, 2.0]), head([2], DOUBLE) + packed(9, [0.1, 2.0], "d")),
    "int32": (np.array([-1, 5], np.int32), head([2], INT32) + packed(4, [-1, 5])),
    "int64": (np.array([1, 2**40, -3], np.int64), head([3], INT64) + packed(10, [1, 2**40, -3])),
    "bool": (np.array([True, False]), head([2], BOOL) + packed(4, [1, 0])),
    "uint8": (np.array([0, 255], np.uint8), head([2], UINT8) + packed(4, [0, 255])),
    "int8": (np.array([-128, 5], np.int8), head([2], INT8) + packed(4, [-128, 5])),
    "uint16": (np.array([65535], np.uint16), head([1], UINT16) + packed(4, [65535])),
    "int16": (np.array([-32768], np.int16), head([1], INT16) + packed(4, [-32768])),
    "float16": (np.array([1.0, -2.0, np.inf], np.float16),
                head([3], FLOAT16) + packed(4, [0x3C00, 0xC000, 0x7C00])),
    "str": (np.array(["ab", "c"]), head([2], STRING) + ld(6, b"ab") + ld(6, b"c")),
    "bytes objects": (np.array([b"\xff", b""], dtype=object),
                      head([2], STRING) + ld(6, b"\xff") + ld(6, b"")),
    "empty": (np.zeros((0, 3), np.float32), head([0, 3], FLOAT)),
    "scalar": (np.float32(3.0), head([], FLOAT) + packed(3, [3.0], "f")),
}


@pytest.mark.parametrize("case", sorted(ENCODE_CASES))
def test_array_to_tensor_writes_the_fields_caffe2_writes(case):
    value, wire = ENCODE_CASES[case]
    assert proto.array_to_tensor(value).SerializeToString() == wire
    back = proto.tensor_to_array(proto.TensorProto.FromString(wire))
    expected = np.asarray(value)
    if expected.dtype.kind in "SU":
        expected = np.array([v.encode() for v in expected.reshape(-1)], dtype=object).reshape(expected.shape)
    assert_same_array(back, expected)


def test_array_to_tensor_name_and_unsupported_dtype():
    assert proto.array_to_tensor(np.zeros(1, np.float32), name="w").SerializeToString() == (
        head([1], FLOAT) + packed(3, [0.0], "f") + ld(7, b"w"))
    with pytest.raises(ArgumentError, match="complex64"):
        proto.array_to_tensor(np.zeros(2, np.complex64))


# ----------------------------------------------------------------------------------- arguments (spec §1.4)
def small_net(name: str = "step") -> proto.NetDef:
    net = proto.NetDef(name=name, external_input=["x"])
    net.op.add(type="Relu", input=["x"], output=["y"])
    return net


def net_wire(name: str = "step") -> bytes:
    """small_net() serialized by hand: name = 1, op = 2 (input 1, output 2, type 4), external_input = 7."""
    return ld(1, name.encode()) + ld(2, ld(1, b"x") + ld(2, b"y") + ld(4, b"Relu")) + ld(7, b"x")


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


NAME = ld(1, b"a")
ARGUMENT_CASES = {
    # value: (wire bytes after the name, value read back)
    "float": (0.25, key(2, 5) + struct.pack("<f", 0.25), 0.25),
    "float rounded to float32": (0.1, key(2, 5) + struct.pack("<f", 0.1), f32(0.1)),
    "int": (-3, vi(3, -3), -3),
    "int64": (2**40, vi(3, 2**40), 2**40),
    "bool": (True, vi(3, 1), 1),
    "str": ("NCHW", ld(4, b"NCHW"), "NCHW"),
    "bytes": (b"\xff\x00", ld(4, b"\xff\x00"), b"\xff\x00"),
    "NetDef": (small_net(), ld(8, net_wire()), small_net()),
    # Argument.floats / ints are unpacked on the wire, as Caffe2 writes them
    "floats": ([1.5, -2.0], fixed32(5, 1.5) + fixed32(5, -2.0), [1.5, -2.0]),
    "ints": ([1, -2, 2**40], vi(6, 1) + vi(6, -2) + vi(6, 2**40), [1, -2, 2**40]),
    "bools": ([True, False], vi(6, 1) + vi(6, 0), [1, 0]),
    "strings": (["a", b"b\xff"], ld(7, b"a") + ld(7, b"b\xff"), ["a", b"b\xff"]),
    "nets": ([small_net("n1"), small_net("n2")], ld(9, net_wire("n1")) + ld(9, net_wire("n2")),
             [small_net("n1"), small_net("n2")]),
    "empty list": ([], b"", []),
    "numpy float32 scalar": (np.float32(0.5), key(2, 5) + struct.pack("<f", 0.5), 0.5),
    "numpy float64 scalar": (np.float64(0.25), key(2, 5) + struct.pack("<f", 0.25), 0.25),
    "numpy int64 scalar": (np.int64(7), vi(3, 7), 7),
    "numpy bool scalar": (np.bool_(True), vi(3, 1), 1),
    "numpy float32 array": (np.array([0.5, 1.0], np.float32), fixed32(5, 0.5) + fixed32(5, 1.0), [0.5, 1.0]),
    "numpy int32 array": (np.array([3, -4], np.int32), vi(6, 3) + vi(6, -4), [3, -4]),
    "numpy bool array": (np.array([True, False]), vi(6, 1) + vi(6, 0), [1, 0]),
    "numpy empty array": (np.zeros(0, np.float32), b"", []),
    # Caffe2's MakeArgument flattens every ndarray (value.flatten().tolist()), 0-d ones included
    "numpy 2-d array": (np.array([[1.0, 2.0], [3.0, 4.0]], np.float32),
                        b"".join(fixed32(5, v) for v in (1, 2, 3, 4)), [1.0, 2.0, 3.0, 4.0]),
    "numpy 0-d array": (np.array(2.5, np.float32), fixed32(5, 2.5), [2.5]),
}


@pytest.mark.parametrize("case", sorted(ARGUMENT_CASES))
def test_make_argument_wire_format_and_value(case):
    check_argument(case)


def check_argument(case):
    """make_argument writes the hand-made wire bytes, and argument_value reads them back as expected."""
    value, wire, expected = ARGUMENT_CASES[case]
    arg = proto.make_argument("a", value)
    assert arg.SerializeToString() == NAME + wire
    got = proto.argument_value(proto.Argument.FromString(NAME + wire))
    assert type(got) is type(expected) and got == expected
    if isinstance(expected, list):
        assert [type(v) for v in got] == [type(v) for v in expected]


def test_name_only_argument_reads_as_an_empty_list():
    assert proto.argument_value(proto.Argument.FromString(ld(1, b"shape"))) == []
    op = proto.OperatorDef.FromString(ld(5, ld(1, b"shape")) + ld(5, ld(1, b"k") + vi(3, 2)))
    assert proto.arguments(op.arg) == {"shape": [], "k": 2}


def test_other_messages_are_stored_serialized_in_s():
    device = proto.DeviceOption(device_type=1, device_id=2)
    op = proto.OperatorDef(type="Relu", input=["x"], output=["y"], device_option=device)
    for message, wire in ((device, vi(1, 1) + vi(2, 2)),
                          (op, ld(1, b"x") + ld(2, b"y") + ld(4, b"Relu") + ld(6, vi(1, 1) + vi(2, 2)))):
        arg = proto.make_argument("m", message)
        assert arg.SerializeToString() == ld(1, b"m") + ld(4, wire)
        value = proto.argument_value(arg)
        raw = value.encode() if isinstance(value, str) else value
        assert type(message).FromString(raw) == message


def test_netdef_stored_as_text_in_s():
    # 2017-era files keep step nets as text-format NetDefs in Argument.s (spec §1.4, §3.15).
    text = 'name: "step"\nop {\n  input: "x"\n  output: "y"\n  type: "Relu"\n}\nexternal_input: "x"\n'
    arg = proto.make_argument("step_net", text)
    assert arg.SerializeToString() == ld(1, b"step_net") + ld(4, text.encode())
    value = proto.argument_value(arg)
    assert value == text
    assert proto.parse_text(value, "net") == small_net()
    assert proto.parse_text(value) == small_net()


@pytest.mark.parametrize("value", [None, {"k": 1}, object(), ["a", 1], [small_net(), 1], [[1, 2]]],
                         ids=["None", "dict", "object", "str and int", "net and int", "nested list"])
def test_make_argument_rejects_values_it_cannot_store(value):
    with pytest.raises(ArgumentError, match="argument 'bad'"):
        proto.make_argument("bad", value)


# ----------------------------------------------------------------------------------- load / save
NET_TEXT = 'name: "step"\nop {\n  input: "x"\n  output: "y"\n  type: "Relu"\n}\nexternal_input: "x"\n'


def nested_plan() -> proto.PlanDef:
    """A PlanDef whose second net runs a sub-net held in an argument (Do-style), with a looping step."""
    outer = proto.NetDef(name="outer")
    do = outer.op.add(type="Do", input=["x"], output=["y"])
    do.arg.append(proto.make_argument("net", small_net("inner")))
    plan = proto.PlanDef(name="plan", network=[small_net("first"), outer])
    plan.execution_step.add(name="loop", num_iter=3, network=["first", "outer"])
    return plan


@pytest.mark.parametrize("suffix", [".pbtxt", ".prototxt", ".txt", ".pbtext", ".textproto", ".PBTXT"])
def test_text_suffixes_save_and_load_text(tmp_path, suffix):
    path = tmp_path / f"net{suffix}"
    proto.save(small_net(), path)
    assert path.read_text() == NET_TEXT
    assert stepnet.load(path) == small_net()


@pytest.mark.parametrize("suffix", [".pb", ".bin", ".model", ""])
def test_other_suffixes_save_and_load_binary(tmp_path, suffix):
    path = tmp_path / f"net{suffix}"
    proto.save(small_net(), path)
    assert path.read_bytes() == net_wire()
    assert stepnet.load(path) == small_net()


def test_text_argument_overrides_the_suffix(tmp_path):
    proto.save(small_net(), tmp_path / "a.pb", text=True)
    proto.save(small_net(), tmp_path / "b.pbtxt", text=False)
    assert (tmp_path / "a.pb").read_text() == NET_TEXT
    assert (tmp_path / "b.pbtxt").read_bytes() == net_wire()


def test_kind_is_found_from_the_content_when_the_suffix_says_nothing(tmp_path):
    (tmp_path / "text.dat").write_text("# a comment\n\tname: \"step\"\n" + NET_TEXT.split("\n", 1)[1])
    (tmp_path / "binary.dat").write_bytes(net_wire())
    assert stepnet.load(tmp_path / "text.dat") == small_net()
    assert stepnet.load(tmp_path / "binary.dat") == small_net()


def test_plandef_and_netdef_told_apart_in_text_and_binary(tmp_path):
    plan = nested_plan()
    for name in ("plan.pbtxt", "plan.pb"):
        proto.save(plan, tmp_path / name)
        loaded = stepnet.load(tmp_path / name)
        assert type(loaded) is proto.PlanDef and loaded == plan
        inner = proto.argument_value(loaded.network[1].op[0].arg[0])
        assert type(inner) is proto.NetDef and inner == small_net("inner")
    (tmp_path / "net.pb").write_bytes(net_wire())
    (tmp_path / "net.pbtxt").write_text(NET_TEXT)
    assert type(stepnet.load(tmp_path / "net.pb")) is proto.NetDef
    assert type(stepnet.load(tmp_path / "net.pbtxt")) is proto.NetDef


def test_text_of_caffe2_before_2018_08_names_device_id_cuda_gpu_id(tmp_path):
    """DeviceOption's field 2 was cuda_gpu_id, then device_id: both read as field 2 (bytes 0x10 0x03 on the wire);
    a string or comment holding the old name keeps it, and an error after it on its line keeps its column."""
    text = ('name: "cuda_gpu_id: 1"  # cuda_gpu_id\n'
            'op { type: "Relu" input: "X" output: "Y" device_option { cuda_gpu_id: 3 } '
            'arg { name: "s" s: "cuda_gpu_id" } }\n')
    (tmp_path / "old.pbtxt").write_text(text)
    net = stepnet.load(tmp_path / "old.pbtxt")
    assert net.op[0].device_option.SerializeToString() == bytes([0x10, 0x03])
    assert net.name == "cuda_gpu_id: 1" and net.op[0].arg[0].s == b"cuda_gpu_id"
    with pytest.raises(FileFormatError, match=r"line 1, column 37: .*no field named \"bogus\""):
        proto.parse_text('op { device_option { cuda_gpu_id: 3 bogus: 1 } }', kind="net")


def test_binary_plan_whose_nets_already_live_in_the_workspace(tmp_path):
    # A plan may run nets created earlier in the workspace, so it can have steps and no `network`.
    wire = ld(1, b"p") + ld(3, ld(1, b"s") + ld(3, b"train") + vi(4, 5))
    (tmp_path / "plan.pb").write_bytes(wire)
    plan = stepnet.load(tmp_path / "plan.pb")
    assert type(plan) is proto.PlanDef
    assert plan.execution_step[0].network == ["train"] and plan.execution_step[0].num_iter == 5


def test_kind_argument(tmp_path):
    proto.save(nested_plan(), tmp_path / "plan.pb")
    proto.save(nested_plan(), tmp_path / "plan.pbtxt")
    assert stepnet.load(tmp_path / "plan.pb", kind="plan") == nested_plan()
    assert stepnet.load(tmp_path / "plan.pbtxt", kind=proto.PlanDef) == nested_plan()
    with pytest.raises(FileFormatError, match='line 2, column 1: .*no field named "network"'):
        stepnet.load(tmp_path / "plan.pbtxt", kind="net")
    (tmp_path / "tensor.pbtxt").write_text("dims: 2\ndata_type: INT32\nint32_data: 4\nint32_data: 5\n")
    t = stepnet.load(tmp_path / "tensor.pbtxt", kind="tensor")
    assert_same_array(proto.tensor_to_array(t), np.array([4, 5], np.int32))
    with pytest.raises(ValueError, match="unknown kind 'bogus'"):
        stepnet.load(tmp_path / "plan.pb", kind="bogus")


@pytest.mark.parametrize("name, content, match", [
    ("empty.pb", b"", "empty"),
    ("empty.pbtxt", b"", "empty"),
    ("blank.pbtxt", b" \n\t\n", "empty"),
    ("syntax.pbtxt", b'name: "x"\nop {\n  type: "Relu"\n  input "a"\n}\n',
     r"line 4, column 9: .*Expected \":\""),
    ("field.pbtxt", b'name: "x"\nop {\n  type: "Relu"\n  bogus_field: 3\n}\n',
     'line 4, column 3: .*no field named "bogus_field"'),
    ("unclosed.pbtxt", b'name: "x"\nop {\n  type: "Relu"\n', r'line 3, column \d+: Expected "}"'),
    ("tensor.pbtxt", b"dims: 2\ndata_type: FLOAT\n", 'line 1, column 1: .*no field named "dims"'),
    ("prose.txt", b"hello world, this is not a model\n", "line 1, column 1"),
    ("tensor.pb", head([2], FLOAT) + packed(3, [1.0, 2.0], "f"), "neither as a NetDef nor as a PlanDef"),
    ("latin1.pbtxt", 'name: "caf\xe9"\n'.encode("latin-1"), "UTF-8"),
    ("garbage.pb", bytes(random.Random(1).randrange(256) for _ in range(300)), "not a valid binary"),
    ("garbage", bytes(random.Random(2).randrange(256) for _ in range(300)), "not a valid binary"),
])
def test_malformed_files_raise_file_format_error(tmp_path, name, content, match):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(FileFormatError, match=match) as info:
        stepnet.load(path)
    assert str(path) in str(info.value)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(FileFormatError, match="no such file"):
        stepnet.load(tmp_path / "missing.pb")
    with pytest.raises(FileFormatError, match=r"is not a regular file \(a directory\); stepnet reads only regular"):
        stepnet.load(tmp_path)


def test_truncated_real_file(tmp_path, data_dir):
    data = (data_dir / "caffe2" / "squeeze_predict_net.pb").read_bytes()
    (tmp_path / "half.pb").write_bytes(data[:len(data) // 2])
    with pytest.raises(FileFormatError, match="truncated"):
        stepnet.load(tmp_path / "half.pb")


# ----------------------------------------------------------------------------------- atomic save
def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_save_into_a_missing_directory(tmp_path):
    with pytest.raises(FileFormatError, match="cannot write"):
        proto.save(small_net(), tmp_path / "no" / "such" / "net.pb")
    assert list(tmp_path.iterdir()) == []


def unwritable_directory(tmp_path: Path) -> Path | None:
    """A directory where this user may not create files: chmod 555, or /sys for root (who ignores modes)."""
    directory = tmp_path / "ro"
    directory.mkdir()
    directory.chmod(0o555)
    for candidate in (directory, Path("/sys")):
        try:
            fd, probe = tempfile.mkstemp(dir=candidate)
        except PermissionError:
            return candidate
        except OSError:
            continue
        os.close(fd)
        os.unlink(probe)
    return None


def test_save_into_a_read_only_directory(tmp_path):
    directory = unwritable_directory(tmp_path)
    try:
        if directory is None:
            pytest.skip("no directory here refuses new files to this user")
        with pytest.raises(FileFormatError, match="cannot write .*Permission denied"):
            proto.save(small_net(), directory / "stepnet_test_net.pb")
        assert not any(p.name.startswith(".stepnet_test_net.pb") for p in directory.iterdir())
        assert not (directory / "stepnet_test_net.pb").exists()
    finally:
        (tmp_path / "ro").chmod(0o755)


@pytest.mark.parametrize("where, error", [
    ("tempfile.mkstemp", PermissionError(errno.EACCES, "Permission denied")),
    ("os.fsync", OSError(errno.ENOSPC, "No space left on device")),
    ("os.replace", PermissionError(errno.EACCES, "Permission denied")),
])
def test_failed_save_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch, where, error):
    path = tmp_path / "net.pb"
    path.write_bytes(b"old contents")
    module, name = where.split(".")

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(getattr(proto, module), name, fail)
    with pytest.raises(FileFormatError, match=f"cannot write .*{error.strerror}"):
        proto.save(small_net(), path)
    monkeypatch.undo()
    assert path.read_bytes() == b"old contents"
    assert leftovers(tmp_path) == []


def not_a_regular_file(kind: str, path: Path) -> str:
    """Make a `kind` of non-regular file at path (in tmp_path: never the real /dev/null, which a save that
    failed to refuse would replace); return the words the error uses for it."""
    if kind == "symlink":
        target = path.with_name("target.pb")
        target.write_bytes(b"the link's target")
        path.symlink_to(target)
        return "a symbolic link"
    if kind == "dangling symlink":
        path.symlink_to(path.with_name("nowhere.pb"))
        return "a symbolic link"
    if kind == "fifo":
        os.mkfifo(path)
        return r"a FIFO \(named pipe\)"
    if kind == "directory":
        path.mkdir()
        return "a directory"
    if os.geteuid() != 0:
        pytest.skip("a device node (a copy of /dev/null made with mknod) can be made only by root")
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("this machine refuses mknod even to root (no CAP_MKNOD)")
    return "a character device"


@pytest.mark.parametrize("kind", ["symlink", "dangling symlink", "fifo", "directory", "device"])
def test_save_refuses_to_replace_what_is_not_a_regular_file(tmp_path, kind):
    """As root, `stepnet convert model.pbtxt /dev/null` replaced /dev/null with a regular file."""
    path = tmp_path / "out.pb"
    words = not_a_regular_file(kind, path)
    before = os.lstat(path)
    with pytest.raises(FileFormatError, match=f"^{re.escape(str(path))}: refusing to write there: it is {words}, "
                                              "not a regular file"):
        proto.save(small_net(), path)
    after = os.lstat(path)
    assert (after.st_mode, after.st_ino, after.st_rdev) == (before.st_mode, before.st_ino, before.st_rdev)
    assert leftovers(tmp_path) == []
    if kind == "symlink":
        assert (tmp_path / "target.pb").read_bytes() == b"the link's target"
    regular = tmp_path / "regular.pb"
    regular.write_bytes(b"old")
    proto.save(small_net(), regular)  # a regular file is replaced as before
    assert proto.load(regular) == small_net()


def test_interrupted_save_removes_its_temporary(tmp_path, monkeypatch):
    def interrupt(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(proto.os, "fsync", interrupt)
    with pytest.raises(KeyboardInterrupt):
        proto.save(small_net(), tmp_path / "net.pb")
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


def test_save_replaces_an_existing_file_whole(tmp_path):
    path = tmp_path / "net.pb"
    path.write_bytes(b"x" * 10000)
    os.link(path, tmp_path / "old")
    proto.save(small_net(), path)
    assert path.read_bytes() == net_wire()  # nothing of the longer old file is left
    # A new file was moved in: the old one (still reachable through the link) was not rewritten in place.
    assert (tmp_path / "old").read_bytes() == b"x" * 10000
    assert leftovers(tmp_path) == []


def test_saved_file_gets_the_usual_permissions(tmp_path):
    (tmp_path / "plain").write_bytes(b"")
    proto.save(small_net(), tmp_path / "net.pb")

    def mode(name):
        return oct((tmp_path / name).stat().st_mode & 0o777)

    assert mode("net.pb") == mode("plain")


# ----------------------------------------------------------------------------------- test the tester
def test_array_check_catches_a_wrong_dtype_table(monkeypatch):
    t, expected = DECODE_CASES["INT16"]
    monkeypatch.setitem(proto.NUMPY_OF, INT16, np.uint16)
    with pytest.raises(AssertionError):
        assert_same_array(proto.tensor_to_array(t), expected)


def test_array_check_catches_a_sign_flip_of_zero():
    with pytest.raises(AssertionError):
        assert_same_array(np.array([0.0], np.float32), np.array([-0.0], np.float32))


def test_argument_check_catches_a_float_stored_as_int(monkeypatch):
    # Caffe2 refuses to read a float argument from field i (spec §1.4), so this must not go unnoticed.
    real = proto.make_argument

    def floats_as_ints(name, value):
        return real(name, int(value)) if isinstance(value, float) else real(name, value)

    monkeypatch.setattr(proto, "make_argument", floats_as_ints)
    with pytest.raises(AssertionError):
        check_argument("float")


def test_tensor_conversions_are_reexported_by_proto():
    from stepnet.io import proto, tensors
    for name in ("tensor_to_array", "array_to_tensor", "join_chunks", "data_type_of", "numpy_dtype", "NUMPY_OF"):
        assert getattr(proto, name) is getattr(tensors, name), name


# ----------------------------------------------------------------------------------- hostile files
def with_bad_utf8(message) -> bytes:
    """message's wire bytes with every string 'BAD!' made invalid UTF-8 (same length: the framing holds)."""
    data = message.SerializeToString()
    assert b"BAD!" in data
    return data.replace(b"BAD!", b"B\xffD!")


def _op(kind, inputs=(), outputs=(), **args):
    op = proto.OperatorDef(type=kind, input=inputs, output=outputs)
    op.arg.extend(proto.make_argument(k, v) for k, v in args.items())
    return op


def _utf8_cases():
    relu = _op("Relu", ["x"], ["y"])
    step = proto.NetDef(name="step", op=[_op("Relu", ["x"], ["BAD!"])])
    rnn = _op("RecurrentNetwork", ["x"], ["y"], step_net=step)
    fill = _op("GivenTensorFill", [], ["w"], values=proto.TensorProto(name="BAD!", dims=[1], data_type=1,
                                                                      float_data=[1.0]))
    nets = _op("Do", [], [], net=[small_net("a"), small_net("BAD!")])
    return {
        "net name": (proto.NetDef(name="BAD!", op=[relu]), "field name"),
        "op type": (proto.NetDef(name="n", op=[relu, _op("BAD!")]), "op #1 type"),
        "op input": (proto.NetDef(name="n", op=[relu, _op("FC", ["x", "BAD!", "b"], ["y"])]),
                     r"op #1 \(FC\) input\[1\]"),
        "arg name": (proto.NetDef(name="n", op=[_op("Relu", ["x"], ["y"], **{"BAD!": 1})]),
                     r"op #0 \(Relu\) arg #0 name"),
        "external output": (proto.NetDef(name="n", op=[relu], external_output=["y", "BAD!"]),
                            r"field external_output\[1\]"),
        "net in an argument": (proto.PlanDef(name="p", network=[proto.NetDef(name="train", op=[rnn])]),
                               r"network 'train' op #0 \(RecurrentNetwork\) arg 'step_net' op #0 \(Relu\) output\[0\]"),
        "tensor in an argument": (proto.NetDef(name="n", op=[fill]), r"op #0 \(GivenTensorFill\) arg 'values' t name"),
        "nets in an argument": (proto.NetDef(name="n", op=[nets]), r"op #0 \(Do\) arg 'net' net #1 name"),
        "plan step": (proto.PlanDef(name="p", network=[small_net("a")],
                                    execution_step=[proto.ExecutionStep(name="BAD!", network=["a"])]), "step #0 name"),
        "substep network": (proto.PlanDef(name="p", network=[small_net("a")], execution_step=[proto.ExecutionStep(
            name="outer", substep=[proto.ExecutionStep(name="inner", network=["BAD!"])])]),
            r"step 'outer' step 'inner' network\[0\]"),
    }


UTF8_CASES = _utf8_cases()


@pytest.mark.parametrize("case", sorted(UTF8_CASES))
def test_a_string_that_is_not_utf8_names_its_field(tmp_path, case):
    # protobuf's Python runtime hands such strings back as bytes; every later step would trip over them.
    message, path = UTF8_CASES[case]
    (tmp_path / "m.pb").write_bytes(with_bad_utf8(message))
    kind = "plan" if isinstance(message, proto.PlanDef) else "net"
    for k in (None, kind):
        with pytest.raises(FileFormatError, match=f"m\\.pb: {path} is not valid UTF-8 \\(byte 0xff at offset 1 of "
                                                  r"b'B\\xffD!'\)") as info:
            stepnet.load(tmp_path / "m.pb", kind=k)
        assert "\n" not in str(info.value)


def deep_plan_text(levels: int) -> str:
    """A plan whose execution steps nest `levels` deep (the outermost step is level 1), written by hand (protobuf's
    printer itself recurses too deep for hundreds of levels)."""
    return 'name: "deep"\n' + "execution_step {\n" + "substep {\n" * (levels - 1) + 'name: "s"\n' + "}\n" * levels


def deep_plan(levels: int) -> proto.PlanDef:
    plan = proto.PlanDef(name="deep")
    step = plan.execution_step.add()
    for _ in range(levels - 1):
        step = step.substep.add()
    step.name = "s"
    return plan


def test_text_and_binary_files_share_protobufs_nesting_limit(tmp_path):
    for levels in (99, 100):   # the binary parser takes 100 levels below the top message; so does the text one
        (tmp_path / "ok.pbtxt").write_text(deep_plan_text(levels))
        (tmp_path / "ok.pb").write_bytes(deep_plan(levels).SerializeToString())
        assert stepnet.load(tmp_path / "ok.pbtxt") == stepnet.load(tmp_path / "ok.pb") == deep_plan(levels)
    for levels in (101, 150, 300, 5000):
        (tmp_path / "deep.pbtxt").write_text(deep_plan_text(levels))
        (tmp_path / "deep.pb").write_bytes(deep_plan(levels).SerializeToString())
        for name in ("deep.pbtxt", "deep.pb"):
            for kind in (None, "plan"):
                with pytest.raises(FileFormatError, match="messages are nested more than 100 levels deep "
                                                          r"\(protobuf's limit, for text and binary files alike\)"):
                    stepnet.load(tmp_path / name, kind=kind)


def test_the_text_depth_scan_skips_strings_and_comments(tmp_path):
    braces = "{" * 150 + "<" * 150
    text = f'name: "{braces}" # {braces}\nop {{ type: "Relu" input: "x}}}}" output: \'{braces}\' }}\n'
    (tmp_path / "n.pbtxt").write_text(text)
    net = stepnet.load(tmp_path / "n.pbtxt")
    assert net.name == braces and net.op[0].output == [braces]


def test_a_net_in_text_counts_the_levels_around_it():
    text = "op {\n" * 0 + 'name: "inner"\nop { type: "Relu" arg { name: "a" n { name: "x" } } }\n'
    assert proto.parse_text(text, "net", depth=97).name == "inner"      # its deepest message is level 3
    with pytest.raises(FileFormatError, match=r"line 2: .*counting the 98 levels of the nets around it"):
        proto.parse_text(text, "net", "here", depth=98)


def test_a_binary_file_too_deep_for_the_parser_says_so(tmp_path):
    # The decoder's own message is opaque; the depth is found by scanning the wire format.
    (tmp_path / "deep.pb").write_bytes(deep_plan(101).SerializeToString())
    with pytest.raises(FileFormatError, match=r"deep\.pb: messages are nested more than 100 levels deep"):
        stepnet.load(tmp_path / "deep.pb")
    (tmp_path / "garbage.pb").write_bytes(b"\x1a\xff\xff\xff\x0f" + b"\x00" * 10)
    with pytest.raises(FileFormatError, match="not a valid binary .*or messages nested more than 100 levels deep"):
        stepnet.load(tmp_path / "garbage.pb")


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_a_device_is_not_a_model_file(device, no_hang):
    if not os.path.exists(device):
        pytest.skip(f"no {device}")
    with pytest.raises(FileFormatError, match=r"is not a regular file \(a character device\); stepnet reads only"):
        no_hang(stepnet.load, device)


def test_a_fifo_is_refused_without_waiting_for_a_writer(fifo, no_hang):
    with pytest.raises(FileFormatError, match=r"pipe: the model file is not a regular file \(a FIFO\)"):
        no_hang(stepnet.load, fifo)


def test_files_over_protobufs_cap_are_refused_before_reading(tmp_path, monkeypatch):
    monkeypatch.setattr(proto, "PROTOBUF_LIMIT", 10)
    proto.save(small_net(), tmp_path / "n.pb")
    with pytest.raises(FileFormatError, match=r"n\.pb: the model file is \d+ bytes, over the limit of 10 bytes"):
        stepnet.load(tmp_path / "n.pb")


@pytest.mark.parametrize("t, match", [
    (tensor([-2, -3], FLOAT, packed(3, [1.0] * 6, "f")), r"dims \[-2, -3\] hold a negative size"),
    (tensor([2, -1], FLOAT, packed(3, [1.0] * 2, "f")), r"dims \[2, -1\] hold a negative size"),
    # 2**32 * 2**32 wraps to 0 in int64, which the empty payload would have matched
    (tensor([2**32, 2**32], FLOAT), r"dims \[4294967296, 4294967296\] describe more elements than any array can "
                                    "hold"),
    (tensor([2**62, 4], INT64, packed(10, [])), "describe more elements than any array can hold"),
    (tensor([2**28, 2**28], FLOAT, packed(3, [1.0], "f")), r"dims \[268435456, 268435456\] need 72057594037927936 "
                                                         "elements but FLOAT data holds 1"),
    (tensor([3], FLOAT, segment(2, 9), packed(3, [1.0] * 7, "f")), r"segment \[2, 9\) is outside its 3 elements"),
    # no elements, yet numpy refuses the shape: its other dims multiply past what any array can hold
    (tensor([0, 2**62, 2**62], FLOAT), r"dims \[0, 4611686018427387904, 4611686018427387904\] describe more "
                                       "elements than any array can hold"),
], ids=["negative", "minus one", "int64 overflow", "int64 overflow 2", "2**56", "segment past the end",
        "empty but huge"])
def test_tensor_headers_that_lie_are_file_format_errors(t, match):
    with pytest.raises(FileFormatError, match=match):
        proto.tensor_to_array(t)


def test_chunks_claiming_a_huge_tensor_allocate_nothing():
    huge = [tensor([10**12], FLOAT, segment(0, 2), packed(3, [1.0, 2.0], "f")),
            tensor([10**12], FLOAT, segment(2, 4), packed(3, [3.0, 4.0], "f"))]
    with allocates_under():
        with pytest.raises(FileFormatError, match="do not cover its 1000000000000 elements"):
            proto.join_chunks(huge)
        with pytest.raises(FileFormatError, match="negative"):
            proto.join_chunks([tensor([-1, 5], FLOAT, segment(0, 1), packed(3, [1.0], "f"))])
