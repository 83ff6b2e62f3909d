"""Real, public Caffe2 NetDef files (tests/data; provenance in tests/data/SOURCES.md) through stepnet.io.proto.

Every vendored file must load, be recognised as a NetDef, and survive binary <-> text round trips. Facts about
each file come from tests/data/SOURCES.md and from a minimal wire-format reader written here, so expected
values never come from the code under test.
"""
from __future__ import annotations

import collections
import hashlib
import re
import shutil
from pathlib import Path

import pytest

import stepnet
from stepnet.io import proto
from stepnet.core.errors import FileFormatError

DATA = Path(__file__).resolve().parent / "data"
EMPTY_TEXT = DATA / "glow" / "empty_init_net.pbtxt"
PB_FILES = sorted(DATA.rglob("*.pb"))
TEXT_FILES = sorted(p for p in DATA.rglob("*.pbtxt") if p != EMPTY_TEXT)


def _id(path: Path) -> str:
    return str(path.relative_to(DATA))


# ----------------------------------------------------------------------------------- independent wire reader
def _varint(buf: bytes, i: int):
    value = shift = 0
    while True:
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def _records(buf: bytes):
    """(field number, payload) of each record of one serialized message."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, i = buf[i:i + size], i + size
        elif wire == 2:
            size, i = _varint(buf, i)
            value, i = buf[i:i + size], i + size
        else:
            raise AssertionError(f"unexpected wire type {wire}")
        yield number, value


def wire_ops(netdef_bytes: bytes) -> list[bytes]:
    """Serialized OperatorDefs of a binary NetDef (NetDef.op is field 2)."""
    return [value for number, value in _records(netdef_bytes) if number == 2]


def wire_type(op_bytes: bytes) -> str:
    """OperatorDef.type (field 4)."""
    return next((v.decode() for n, v in _records(op_bytes) if n == 4), "")


def wire_net_args(op_bytes: bytes) -> dict[str, bytes]:
    """{argument name: serialized NetDef} for the arguments of an op that hold a NetDef in `n` (field 8)."""
    found = {}
    for number, arg in _records(op_bytes):
        if number == 5:
            fields = dict(_records(arg))
            if 8 in fields:
                found[fields[1].decode()] = fields[8]
    return found


def all_ops(net):
    """Every op of a NetDef, including those of nets held in its ops' arguments."""
    for op in net.op:
        yield op
        for arg in op.arg:
            if arg.HasField("n"):
                yield from all_ops(arg.n)
            for sub in arg.nets:
                yield from all_ops(sub)


def op_counts(net, nested: bool = False) -> collections.Counter:
    return collections.Counter(op.type for op in (all_ops(net) if nested else net.op))


def assert_found_by_content(path: Path, net, tmp_path: Path) -> None:
    """A copy of the file without its suffix loads as the same NetDef: the kind is read from the bytes."""
    copy = tmp_path / "model"
    shutil.copyfile(path, copy)
    from_copy = stepnet.load(copy)
    assert type(from_copy) is proto.NetDef
    assert from_copy == net


def assert_round_trips(message, original_bytes: bytes | None = None) -> None:
    """message -> text -> message and message -> bytes -> message give equal NetDefs."""
    from_text = proto.parse_text(proto.to_text(message))
    assert type(from_text) is proto.NetDef
    assert from_text == message
    data = message.SerializeToString()
    from_bytes = proto.parse_binary(data)
    assert type(from_bytes) is proto.NetDef
    assert from_bytes == message
    if original_bytes is not None:
        assert data == original_bytes
        assert from_text.SerializeToString() == original_bytes


# ----------------------------------------------------------------------------------- provenance
def test_every_vendored_file_is_listed_in_sources_md_with_its_sha256(data_dir):
    assert data_dir == DATA
    text = (DATA / "SOURCES.md").read_text()
    listed = {}
    for row in re.finditer(r"^\| `([^`]+)` \|.*\| `([0-9a-f]{64})` \|$", text, re.M):
        listed[row.group(1)] = row.group(2)
    for line in re.finditer(r"^([0-9a-f]{64})  (\S+)$", text, re.M):
        assert line.group(2) not in listed, f"{line.group(2)} listed twice"
        listed[line.group(2)] = line.group(1)
    present = {_id(p) for p in DATA.rglob("*") if p.is_file() and p.name != "SOURCES.md"}
    assert present == set(listed)
    for name, digest in listed.items():
        assert hashlib.sha256((DATA / name).read_bytes()).hexdigest() == digest, name


def test_the_file_set_is_complete():
    assert len(PB_FILES) == 7
    assert len(list((DATA / "glow").glob("*.pbtxt"))) == 140
    assert len(list((DATA / "models").glob("*.pbtxt"))) == 5
    assert (DATA / "LICENSE-Apache-2.0.txt").read_bytes() == (DATA / "glow" / "LICENSE.glow").read_bytes()


# ----------------------------------------------------------------------------------- loading and round trips
@pytest.mark.parametrize("path", PB_FILES, ids=_id)
def test_binary_file_loads_as_netdef_with_the_ops_on_the_wire(path):
    data = path.read_bytes()
    net = stepnet.load(path)
    assert type(net) is proto.NetDef
    assert [op.type for op in net.op] == [wire_type(op) for op in wire_ops(data)]
    assert [op.SerializeToString() for op in net.op] == wire_ops(data)


@pytest.mark.parametrize("path", PB_FILES, ids=_id)
def test_binary_file_round_trips_byte_for_byte(path, tmp_path):
    data = path.read_bytes()
    net = stepnet.load(path)
    assert_round_trips(net, data)
    proto.save(net, tmp_path / "net.pbtxt")
    from_text = stepnet.load(tmp_path / "net.pbtxt")
    assert from_text == net
    proto.save(from_text, tmp_path / "again.pb")
    assert (tmp_path / "again.pb").read_bytes() == data
    assert_found_by_content(path, net, tmp_path)


@pytest.mark.parametrize("path", TEXT_FILES, ids=_id)
def test_text_file_loads_as_netdef_and_round_trips(path, tmp_path):
    text = path.read_text()
    net = stepnet.load(path)
    assert type(net) is proto.NetDef
    # Every `op {` block of the file is an op of the net or of a net nested in an argument.
    assert len(re.findall(r"(?m)^\s*op\s*\{", text)) == sum(1 for _ in all_ops(net))
    assert_round_trips(net)
    proto.save(net, tmp_path / "net.pb")
    assert stepnet.load(tmp_path / "net.pb") == net
    proto.save(net, tmp_path / "net.pbtxt")
    assert stepnet.load(tmp_path / "net.pbtxt") == net
    assert_found_by_content(path, net, tmp_path)


def test_truncated_real_files_are_rejected(tmp_path):
    for path in PB_FILES:
        data = path.read_bytes()
        for cut in (len(data) // 2, len(data) - 1):
            bad = tmp_path / f"cut_{cut}_{path.name}"
            bad.write_bytes(data[:cut])
            with pytest.raises(FileFormatError, match="truncated"):
                stepnet.load(bad)


def test_glow_empty_init_net_is_reported_as_empty():
    # Glow ships this 0-byte file as an init net with no ops; stepnet's rule: an empty file is an error.
    assert EMPTY_TEXT.stat().st_size == 0
    with pytest.raises(FileFormatError, match="empty"):
        stepnet.load(EMPTY_TEXT)


# ------------------------------------------------------------------------------ facts per file (SOURCES.md)
FACTS = {
    "caffe2/squeeze_predict_net.pb": (66, {"Conv": 26, "Relu": 26, "MaxPool": 3, "Concat": 8, "Dropout": 1,
                                          "AveragePool": 1, "Softmax": 1}),
    "caffe2/armcompute_squeezenet_predict.pb": (65, {"Conv": 26, "Relu": 26, "MaxPool": 3, "Concat": 8,
                                                     "AveragePool": 1, "Softmax": 1}),
    "models/maskrcnn2go_fp32_model.pb": (111, {"Conv": 64, "Relu": 22, "Sum": 13, "If": 1, "IsEmpty": 1,
                                               "GenerateProposals": 1, "RoIAlign": 1, "FC": 2}),
    "models/maskrcnn2go_fp32_model.pbtxt": (112, {"If": 1}),
    "models/bvlc_alexnet_predict_net.pbtxt": (23, {"Conv": 5, "Relu": 7, "LRN": 2, "MaxPool": 3, "FC": 3,
                                                   "Dropout": 2, "Softmax": 1}),
    "models/resnet50_predict_net.pbtxt": (175, {"Conv": 53, "SpatialBN": 53, "Relu": 49, "Sum": 16,
                                                "MaxPool": 1, "AveragePool": 1, "FC": 1, "Softmax": 1}),
    "models/inception_v1_predict_net.pbtxt": (142, {"Conv": 57, "Relu": 57, "MaxPool": 13, "Concat": 9,
                                                    "LRN": 2, "AveragePool": 1, "Dropout": 1, "FC": 1,
                                                    "Softmax": 1}),
    "models/detectron_e2e_faster_rcnn_R-50-C4_1x_predict_net.pbtxt": (
        132, {"Conv": 56, "Relu": 50, "Sum": 16, "GenerateProposals": 1, "RoIAlign": 1, "BBoxTransform": 1,
              "BoxWithNMSLimit": 1, "FC": 2, "Softmax": 1, "Sigmoid": 1, "MaxPool": 1, "AveragePool": 1}),
    "models/style_transfer_crayon_predict.pb": (22, {"PackedInt8BGRANHWCToNCHWCStylizerPreprocess": 1,
                                                     "AveragePool": 1, "PadImage": 2, "Conv": 7, "PRelu": 8,
                                                     "ConvTranspose": 2,
                                                     "BRGNCHWCToPackedInt8BGRAStylizerDeprocess": 1}),
    "models/style_transfer_crayon_init.pb": (60, {"GivenTensorFill": 59, "ConstantFill": 1}),
}


@pytest.mark.parametrize("name", sorted(FACTS))
def test_op_counts_match_sources_md(name):
    total, counts = FACTS[name]
    net = stepnet.load(DATA / name)
    assert len(net.op) == total
    got = op_counts(net)
    assert {k: got[k] for k in counts} == counts
    if sum(counts.values()) == total:  # SOURCES.md lists every type of this net
        assert got == collections.Counter(counts)


def test_squeezenet_details():
    net = stepnet.load(DATA / "caffe2/squeeze_predict_net.pb")
    assert len(net.external_input) == 53 and net.external_input[0] == "data"
    assert list(net.external_output) == ["softmaxout"]
    for op in net.op:
        args = proto.arguments(op.arg)
        if op.type == "Relu":
            assert list(op.input) == list(op.output)  # in place
        elif op.type == "MaxPool":
            assert args["legacy_pad"] == 3
        elif op.type == "Concat":
            assert len(op.output) == 2 and args["order"] == "NCHW"
        elif op.type == "Dropout":
            assert args["is_test"] == 1 and len(op.output) == 2
        elif op.type == "AveragePool":
            assert args["global_pooling"] == 1


def test_maskrcnn_if_op_holds_its_branches_in_argument_n():
    path = DATA / "models/maskrcnn2go_fp32_model.pb"
    net = stepnet.load(path)
    (index,) = [i for i, op in enumerate(net.op) if op.type == "If"]
    branches = proto.arguments(net.op[index].arg)
    then_net, else_net = branches["then_net"], branches["else_net"]
    assert type(then_net) is proto.NetDef and len(then_net.op) == 0
    assert type(else_net) is proto.NetDef and len(else_net.op) == 27
    expected = {"RoIAlign": 1, "Conv": 13, "Relu": 5, "Sum": 3, "ConvTranspose": 2, "Sigmoid": 1, "Slice": 1,
                "Div": 1}
    assert op_counts(else_net) == collections.Counter(expected)
    # The same nets read straight off the wire.
    nets_on_wire = wire_net_args(wire_ops(path.read_bytes())[index])
    assert set(nets_on_wire) == {"then_net", "else_net"}
    assert len(wire_ops(nets_on_wire["else_net"])) == 27 and wire_ops(nets_on_wire["then_net"]) == []
    assert else_net.SerializeToString() == nets_on_wire["else_net"]
    assert all(op.engine == "DEPTHWISE_3x3,NNPACK" for op in net.op if op.type == "Conv")


def test_maskrcnn_text_revision_nested_counts():
    net = stepnet.load(DATA / "models/maskrcnn2go_fp32_model.pbtxt")
    counts = op_counts(net, nested=True)
    assert {k: counts[k] for k in ("Conv", "Relu", "Sum", "RoIAlign", "ResizeNearest")} == {
        "Conv": 80, "Relu": 27, "Sum": 18, "RoIAlign": 2, "ResizeNearest": 1}
    assert len(proto.arguments(next(op for op in net.op if op.type == "If").arg)["else_net"].op) == 30
    assert net != stepnet.load(DATA / "models/maskrcnn2go_fp32_model.pb")  # a later revision


def test_model_zoo_text_details():
    alexnet = stepnet.load(DATA / "models/bvlc_alexnet_predict_net.pbtxt")
    assert all(len(op.output) == 2 for op in alexnet.op if op.type == "LRN")
    resnet = stepnet.load(DATA / "models/resnet50_predict_net.pbtxt")
    assert all(name.startswith("gpu_0/") for op in resnet.op for name in list(op.input) + list(op.output))
    assert all(proto.arguments(op.arg)["is_test"] == 1 for op in resnet.op if op.type == "SpatialBN")
    detectron = stepnet.load(DATA / "models/detectron_e2e_faster_rcnn_R-50-C4_1x_predict_net.pbtxt")
    assert detectron.type == "simple"


def test_style_transfer_pair():
    predict = stepnet.load(DATA / "models/style_transfer_crayon_predict.pb")
    assert predict.name == "style"
    assert predict.op[0].engine == "MOBILE"
    assert all(proto.arguments(op.arg)["mode"] == "reflect" for op in predict.op if op.type == "PadImage")
    init = stepnet.load(DATA / "models/style_transfer_crayon_init.pb")
    fills = [op for op in init.op if op.type == "GivenTensorFill"]
    assert sum(len(proto.arguments(op.arg)["values"]) for op in fills) == 12048
    for op in fills:
        args = proto.arguments(op.arg)
        count = 1
        for d in args["shape"]:
            count *= d
        assert len(args["values"]) == count, op.output[0]
    assert [list(op.output) for op in init.op if op.type == "ConstantFill"] == [["data_int8_bgra"]]
    # Every blob the init net makes is an input of the predict net.
    made = {name for op in init.op for name in op.output}
    assert made <= set(predict.external_input)


def test_glow_conv_and_fc_nets():
    conv = stepnet.load(DATA / "glow/predict_net.pbtxt").op[0]
    args = proto.arguments(conv.arg)
    assert (conv.type, args["kernel"], args["pad"], args["dilations"]) == ("Conv", 2, 1, [2, 2])
    init = {op.output[0]: proto.arguments(op.arg) for op in stepnet.load(DATA / "glow/init_net.pbtxt").op}
    assert init["conv_w"] == {"shape": [1, 1, 2, 2], "values": [1.0] * 4}
    assert init["conv_b"] == {"shape": [1], "values": [2.0]}
    fc = {op.output[0]: proto.arguments(op.arg) for op in stepnet.load(DATA / "glow/fc_init_net.pbtxt").op}
    assert fc["weights"] == {"shape": [4, 3], "values": [float(v) for v in range(1, 13)]}
    assert fc["bias"]["values"] == pytest.approx([0.1, 0.2, 0.3, 0.4], rel=1e-7)


def test_glow_byte_strings_keep_their_octal_escapes():
    ops = stepnet.load(DATA / "glow/fill_test_init_net.pbtxt").op
    (fill,) = [op for op in ops if op.type == "GivenTensorByteStringToUInt8Fill"]
    assert proto.arguments(fill.arg)["values"] == [b"\x80\x81\x82\x83"]


# ----------------------------------------------------------------------------------- test the tester
def test_round_trip_check_catches_a_lossy_text_writer(monkeypatch):
    net = stepnet.load(DATA / "models/bvlc_alexnet_predict_net.pbtxt")
    real_to_text = proto.to_text

    def drops_last_op(message):
        clipped = type(message)()
        clipped.CopyFrom(message)
        del clipped.op[-1]
        return real_to_text(clipped)

    monkeypatch.setattr(proto, "to_text", drops_last_op)
    with pytest.raises(AssertionError):
        assert_round_trips(net)


def test_wire_reader_agrees_with_sources_md():
    data = (DATA / "caffe2/squeeze_predict_net.pb").read_bytes()
    assert collections.Counter(wire_type(op) for op in wire_ops(data)) == collections.Counter(
        FACTS["caffe2/squeeze_predict_net.pb"][1])


# Ops only the detection/quantized nets use; the README's limits list them.
KNOWN_UNSUPPORTED = {"BBoxTransform", "BoxWithNMSLimit", "GenerateProposals", "RoIAlign", "If", "IsEmpty"}


@pytest.mark.parametrize("path", [p for p in PB_FILES + TEXT_FILES if "glow" not in p.parts], ids=_id)
def test_inspect_runs_cleanly_on_every_real_model(path, capsys):
    """`stepnet inspect` prints the nets, warns about nothing, and lists only the detection ops as unsupported."""
    import warnings

    from stepnet.cli.run import main

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("net ")
    if "unsupported ops" in out:
        listed = {item.split("×")[0] for item in out.split("unsupported ops (this build cannot run them): ")[1]
                  .strip().split(", ")}
        assert listed <= KNOWN_UNSUPPORTED, listed
        assert "maskrcnn" in path.name or "detectron" in path.name
    else:
        assert "all ops supported" in out
