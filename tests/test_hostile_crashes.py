"""Crashes an independent hostile-input campaign found (#24 §3): each bad input is one `stepnet: error:` line, and
the good input next to it still works."""
from __future__ import annotations

import re

import pytest
from google.protobuf import text_format

from stepnet.builders import synth_rules
from stepnet.builders.synth import synth_init
from stepnet.cli.run import main
from stepnet.core.errors import ResourceError
from stepnet.io import files, proto
from stepnet.testing import make_op


def one_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("stepnet: error: ") and err.count("\n") == 1 and "internal" not in err, err
    return err


# --------------------------------------------------------------------------------- synth-init's axes
def net_file(tmp_path, *ops):
    net = proto.NetDef(name="n", external_output=[ops[-1][2][0]])
    net.op.extend(make_op(t, ins, outs, **args) for t, ins, outs, args in ops)
    proto.save(net, tmp_path / "net.pbtxt")
    return str(tmp_path / "net.pbtxt")


AXES = [  # (op, args, bad value, its message, a good value, the parameter's shape with it) on x (2, 3)
    ("Div", {"broadcast": 1}, {"axis": 5}, r"op #0 \(Div\): axis=5 is out of range for a 2-D tensor \(valid: -2..1\)",
     {"axis": 0}, (2,)),
    ("Add", {"broadcast": 1}, {"axis": -3}, r"axis=-3 is out of range for a 2-D tensor", {"axis": -1}, (3,)),
    ("Mul", {"broadcast": 1}, {"axis_str": "Q"}, r"axis_str 'Q' is not one letter of order 'NCHW'",
     {"axis_str": "C"}, (3,)),
    ("FC", {}, {"axis": 2}, r"op #0 \(FC\): axis=2 is out of range", {"axis": 1}, (4, 3)),
    ("FC", {}, {"axis_w": 10**9}, r"axis_w=1000000000 is out of range for the weight synth-init makes \(1..63\)",
     {"axis_w": 2}, (4, 1, 3)),
    ("LayerNorm", {}, {"axis": 7}, r"op #0 \(LayerNorm\): axis=7 is out of range", {"axis": -1}, (3,)),
    ("ElementwiseLinear", {}, {"axis": -9}, r"axis=-9 is out of range", {"axis": 0}, (6,)),
]


def _op(op_type, args):
    outs = ["y", "mean", "std"] if op_type == "LayerNorm" else ["y"]
    ins = ["x", "p"] if op_type in ("Div", "Add", "Mul") else ["x", "p", "q"]
    return op_type, ins, outs, args


@pytest.mark.parametrize("op_type, args, bad, message, good, shape", AXES)
def test_synth_init_refuses_an_axis_out_of_range(tmp_path, capsys, op_type, args, bad, message, good, shape):
    init = tmp_path / "init.pbtxt"
    command = ["synth-init", "-o", str(init), "--input", "x=2,3", "--classes", "4"]
    assert main([*command, net_file(tmp_path, _op(op_type, {**args, **bad}))]) == 1
    assert re.search(message, one_error(capsys))
    assert main([*command, net_file(tmp_path, _op(op_type, {**args, **good}))]) == 0
    fills = {o.output[0]: proto.argument_value(next(a for a in o.arg if a.name == "shape"))
             for o in proto.load(init, kind="net").op}
    assert tuple(fills["p"]) == shape


def test_without_the_axis_check_an_axis_out_of_range_crashes(tmp_path, monkeypatch):
    monkeypatch.setattr(synth_rules.Site, "axis", lambda self, shape, value, name="axis": value)
    net = proto.load(net_file(tmp_path, _op("Div", {"broadcast": 1, "axis": 5})), kind="net")
    with pytest.raises(IndexError):
        synth_init(net, {"x": (2, 3)})


def test_generate_proposals_scores_without_anchor_count(tmp_path, capsys):
    path = net_file(tmp_path, ("GenerateProposals", ["s", "d", "i", "a"], ["r", "p"], {}))
    command = ["synth-init", path, "-o", str(tmp_path / "i.pb"), "--input", "d=1,8,3,3", "--input", "i=1,3"]
    assert main([*command, "--input", "s=2"]) == 1
    assert "the scores (2,) are not 4-D (images, A, H, W)" in one_error(capsys)
    assert main([*command, "--input", "s=1,2,3,3"]) == 0


def test_a_rule_error_on_a_given_parameter_is_that_error(tmp_path, capsys):
    """(not 'params gives dims for p, but it is not a parameter', which the planning walk used to say first)"""
    command = ["synth-init", net_file(tmp_path, _op("FC", {"axis_w": 5})), "-o", str(tmp_path / "i.pb"), "--input",
               "x=2,3", "--param", "p=4,3"]
    assert main(command) == 1
    assert "op #0 (FC): axis_w=5 is out of range for a 2-D tensor" in one_error(capsys)
    net_file(tmp_path, _op("FC", {}))
    assert main(command) == 0


# --------------------------------------------------------------------------------- text models' size
def text_net(path, size: int):
    """A valid text NetDef of exactly `size` bytes (a long string argument: the text parser's worst case)."""
    head, tail = 'name: "n" op { type: "Relu" input: "x" output: "y" arg { name: "note" s: "', '" } }\n'
    path.write_text(head + "a" * (size - len(head) - len(tail)) + tail)
    return str(path)


@pytest.mark.parametrize("name", ["net.pbtxt", "net"])   # named text, or found to be text by its bytes
def test_a_text_model_over_the_text_limit_is_one_line(tmp_path, capsys, monkeypatch, name):
    monkeypatch.setattr(files, "TEXT_LIMIT", 4096)
    assert main(["inspect", text_net(tmp_path / name, 4097)]) == 1
    err = one_error(capsys)
    assert f"{name}: the model file {'' if name.endswith('.pbtxt') else '(text) '}is 4.0 KiB (4097 bytes), over the " \
           "limit of 4.0 KiB for text (protobuf's Python text parser takes up to about 140 times" in err
    assert "protoc --encode" in err
    assert main(["inspect", text_net(tmp_path / name, 4096)]) == 0
    assert len(proto.load(tmp_path / name).op[0].arg[0].s) > 4000


def test_without_the_text_limit_the_text_is_parsed(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "TEXT_LIMIT", files.PROTOBUF_LIMIT)
    assert len(proto.load(text_net(tmp_path / "net.pbtxt", 20000)).op[0].arg[0].s) > 19000


def test_running_out_of_memory_while_parsing_names_the_file(tmp_path, capsys, monkeypatch):
    def no_memory(*_args, **_kwargs):
        raise MemoryError
    path = text_net(tmp_path / "net.pbtxt", 1000)
    monkeypatch.setattr(text_format, "Parse", no_memory)
    assert main(["inspect", path]) == 1
    assert f"{path}: ran out of memory parsing the model file (1000 bytes)" in one_error(capsys)
    with pytest.raises(ResourceError):
        proto.load(path)
