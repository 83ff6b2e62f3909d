"""stepnet.compat.onnx.backend (Caffe2's ONNX backend): small ONNX models made with onnx.helper, run by stepnet's
Caffe2 ops and by onnxruntime, an independent implementation of ONNX. float32 throughout: outputs agree within
rtol 1e-5, atol 1e-5 (1e-4 for the recurrent and convolution nets, whose sums run in another order)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from stepnet.compat.onnx import backend  # noqa: E402
from stepnet.compat.onnx.helper import dummy_name  # noqa: E402

RNG = np.random.default_rng(7)


def _rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _model(nodes, inputs, outputs, opset, initializers=()):
    """inputs: {name: array}; outputs: names (their types and shapes left for the backends to find)."""
    graph = helper.make_graph(
        nodes, "t", [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                     for n, v in inputs.items()],
        [helper.make_empty_tensor_value_info(n) for n in outputs],
        initializer=[numpy_helper.from_array(v, n) for n, v in initializers])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=7)


def _compare(model, feeds, atol=1e-5, rtol=1e-5):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = backend.prepare(model).run(feeds)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert np.asarray(g).shape == e.shape
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)
    return got


def _one(op, feeds, opset=13, attrs=None, n_out=1, initializers=(), atol=1e-5, **kw):
    names = list(feeds) + [n for n, _ in initializers]
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, names, outs, **(attrs or {}))
    return _compare(_model([node], feeds, outs, opset, initializers), feeds, atol=atol, **kw)


@pytest.mark.parametrize("op", ["Relu", "Sigmoid", "Tanh", "Exp", "Abs", "Neg", "Identity", "Reciprocal",
                                "Softsign", "Floor", "Ceil"])
def test_unary(op):
    x = _rand(3, 4)
    if op == "Reciprocal":
        x = np.abs(x) + 0.5
    _one(op, {"x": x})


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
def test_binary_broadcast(op):
    _one(op, {"a": _rand(2, 3, 4), "b": np.abs(_rand(4)) + 0.5})


@pytest.mark.parametrize("op", ["Max", "Min", "Sum"])
def test_variadic_same_shapes(op):   # Caffe2's Max, Min and Sum take inputs of one shape
    _one(op, {"a": _rand(2, 3), "b": _rand(2, 3), "c": _rand(2, 3)})


@pytest.mark.parametrize("op,attrs", [("LeakyRelu", {"alpha": 0.2}), ("Elu", {"alpha": 0.7}),
                                      ("Selu", {"alpha": 1.5, "gamma": 1.1})])
def test_activations_with_attributes(op, attrs):
    _one(op, {"x": _rand(5, 3)}, attrs=attrs)


@pytest.mark.parametrize("attrs", [{}, {"strides": [2, 1], "pads": [1, 0, 2, 1]}, {"group": 2, "dilations": [2, 2]}])
def test_conv(attrs):
    w = _rand(4, 4 // attrs.get("group", 1), 3, 3)
    _one("Conv", {"x": _rand(2, 4, 7, 8)}, attrs={"kernel_shape": [3, 3], **attrs},
         initializers=[("w", w), ("b", _rand(4))], atol=1e-4)


def test_conv_transpose():
    _one("ConvTranspose", {"x": _rand(1, 3, 4, 5)}, attrs={"strides": [2, 2], "pads": [1, 1, 1, 1],
                                                          "output_padding": [1, 0]},
         initializers=[("w", _rand(3, 2, 3, 3))], atol=1e-4)


@pytest.mark.parametrize("op,attrs", [("MaxPool", {"kernel_shape": [2, 3], "strides": [2, 1], "pads": [0, 1, 0, 1]}),
                                      ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
                                      ("GlobalAveragePool", {}), ("GlobalMaxPool", {})])
def test_pools(op, attrs):
    _one(op, {"x": _rand(2, 3, 6, 7)}, attrs=attrs)


@pytest.mark.parametrize("attrs,c_shape", [({"transB": 1}, (5,)), ({"transA": 1, "alpha": 0.5, "beta": 2.0}, (3, 5)),
                                           ({}, (1, 5))])
def test_gemm(attrs, c_shape):
    a = _rand(4, 3) if attrs.get("transA") else _rand(3, 4)
    b = _rand(5, 4) if attrs.get("transB") else _rand(4, 5)
    _one("Gemm", {"a": a}, attrs=attrs, initializers=[("b", b), ("c", _rand(*c_shape))])


def test_matmul_batched():
    _one("MatMul", {"a": _rand(2, 3, 4), "b": _rand(2, 4, 5)})


def test_reshape_shape_input():
    _one("Reshape", {"x": _rand(2, 3, 4)}, initializers=[("s", np.array([0, -1, 2], dtype=np.int64))])


@pytest.mark.parametrize("opset", [9, 13])
def test_pad(opset):
    pads = [0, 0, 1, 2, 0, 0, 2, 1]
    if opset < 11:
        _one("Pad", {"x": _rand(1, 2, 3, 4)}, opset=opset, attrs={"pads": pads, "value": 1.5})
    else:
        _one("Pad", {"x": _rand(1, 2, 3, 4)}, opset=opset, attrs={"mode": "reflect"},
             initializers=[("p", np.array(pads, dtype=np.int64))])


def test_concat():
    _one("Concat", {"a": _rand(2, 3), "b": _rand(2, 5)}, attrs={"axis": 1})


def test_batch_norm():
    c = 3
    _one("BatchNormalization", {"x": _rand(2, c, 4, 5)}, attrs={"epsilon": 1e-3},
         initializers=[("s", _rand(c)), ("b", _rand(c)), ("m", _rand(c)), ("v", np.abs(_rand(c)) + 0.5)])


def test_instance_norm():
    _one("InstanceNormalization", {"x": _rand(2, 3, 4, 5)}, attrs={"epsilon": 1e-3},
         initializers=[("s", _rand(3)), ("b", _rand(3))], atol=1e-4)


def test_dropout_is_identity_at_inference():
    _one("Dropout", {"x": _rand(4, 6)}, opset=10, attrs={"ratio": 0.3})


@pytest.mark.parametrize("opset", [9, 13])
def test_split(opset):
    if opset < 13:
        _one("Split", {"x": _rand(2, 7)}, opset=opset, attrs={"axis": 1, "split": [3, 4]}, n_out=2)
    else:
        _one("Split", {"x": _rand(2, 7)}, opset=opset, attrs={"axis": 1}, n_out=2,
             initializers=[("s", np.array([2, 5], dtype=np.int64))])


@pytest.mark.parametrize("starts,ends,axes", [([1, 0], [3, -1], [0, 2]), ([-2], [2 ** 62], [1]), ([0], [-2], None)])
def test_slice_attributes(starts, ends, axes):
    attrs = {"starts": starts, "ends": ends, **({"axes": axes} if axes else {})}
    _one("Slice", {"x": _rand(4, 5, 6)}, opset=9, attrs=attrs)


def test_slice_inputs():
    _one("Slice", {"x": _rand(4, 5, 6)}, opset=13,
         initializers=[("s", np.array([1, -3], dtype=np.int64)), ("e", np.array([-1, 6], dtype=np.int64)),
                       ("a", np.array([1, 2], dtype=np.int64))])


@pytest.mark.parametrize("opset", [7, 9])
def test_upsample_nearest(opset):
    scales = [1.0, 1.0, 2.0, 3.0]
    if opset == 7:
        _one("Upsample", {"x": _rand(1, 2, 3, 4)}, opset=7, attrs={"scales": scales, "mode": "nearest"})
    else:
        _one("Upsample", {"x": _rand(1, 2, 3, 4)}, opset=9, attrs={"mode": "nearest"},
             initializers=[("s", np.array(scales, dtype=np.float32))])


def test_softmax_and_log_softmax_before_opset_13():
    _one("Softmax", {"x": _rand(3, 4, 5)}, opset=11, attrs={"axis": 1})
    _one("LogSoftmax", {"x": _rand(3, 7)}, opset=11, attrs={"axis": 1})


def test_transpose_squeeze_unsqueeze():
    _one("Transpose", {"x": _rand(2, 3, 4)}, attrs={"perm": [2, 0, 1]})
    _one("Squeeze", {"x": _rand(2, 1, 4, 1)}, opset=11, attrs={"axes": [1, 3]})
    _one("Unsqueeze", {"x": _rand(2, 4)}, opset=13, initializers=[("a", np.array([0, 2], dtype=np.int64))])


def test_cast_maps_onnx_type_numbers():
    got = _one("Cast", {"x": _rand(3, 4) * 10}, attrs={"to": TensorProto.INT32})
    assert got[0].dtype == np.int32


def test_gather_axis_0_and_1():
    idx = np.array([[2, 0], [1, 1]], dtype=np.int64)
    _one("Gather", {"x": _rand(4, 3)}, initializers=[("i", idx)])
    _one("Gather", {"x": _rand(3, 4)}, attrs={"axis": 1}, initializers=[("i", np.array([3, 0], dtype=np.int64))])


def test_constant_and_a_chain():
    c = _rand(3)
    nodes = [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(c)),
             helper.make_node("Mul", ["x", "c"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    x = _rand(2, 3)
    _compare(_model(nodes, {"x": x}, ["y"], 13), {"x": x})


def _rnn(op, direction, hidden=4, input_size=3, t=5, n=2, with_states=True, lengths=None, **attrs):
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    d = 2 if direction == "bidirectional" else 1
    inits = [("W", _rand(d, gates * hidden, input_size) * 0.5), ("R", _rand(d, gates * hidden, hidden) * 0.5),
             ("B", _rand(d, 2 * gates * hidden) * 0.5)]
    feeds = {"X": _rand(t, len(lengths) if lengths else n, input_size)}
    names = ["X", "W", "R", "B"]
    if lengths:
        feeds["lens"] = np.array(lengths, np.int32)
        names.append("lens")
    if with_states:
        feeds["h0"] = _rand(d, feeds["X"].shape[1], hidden)
        names += ["h0"] if lengths else ["", "h0"]
        if op == "LSTM":
            feeds["c0"] = _rand(d, feeds["X"].shape[1], hidden)
            names.append("c0")
    outs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    node = helper.make_node(op, names, outs, hidden_size=hidden, direction=direction, **attrs)
    return _compare(_model([node], feeds, outs, 14, inits), feeds, atol=1e-4)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_lstm(direction):
    _rnn("LSTM", direction)


def test_lstm_without_initial_states():
    _rnn("LSTM", "forward", with_states=False)


@pytest.mark.parametrize("direction,lbr", [("forward", 0), ("forward", 1), ("bidirectional", 0)])
def test_gru(direction, lbr):
    _rnn("GRU", direction, linear_before_reset=lbr)


@pytest.mark.parametrize("direction,act", [("forward", "Tanh"), ("reverse", "Relu"), ("bidirectional", "Tanh")])
def test_rnn(direction, act):
    _rnn("RNN", direction, with_states=direction != "reverse",
         activations=[act] * (2 if direction == "bidirectional" else 1))


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_sequence_lens(op, direction):
    """Each sequence stops at its length: Y zero past it, Y_h (Y_c) its last valid step, a reverse direction
    over its valid steps alone (Caffe2's backend: the cells' seq_lengths, ReversePackedSegs over the lengths,
    VariableLengthSequencePadding), against onnxruntime."""
    y = _rnn(op, direction, t=6, lengths=[6, 2, 4, 1])[0]
    assert not np.any(y[2:, :, 1]) and np.any(y[:2, :, 1])


def test_sequence_lens_checker_catches_unpadded_outputs(monkeypatch):
    """The comparison above fails where Y is not padded past each end (the padding op made a copy)."""
    real = backend.create_rnn

    def unpadded(*args):
        ops = real(*args)
        for op in ops.ops:
            if op.type == "VariableLengthSequencePadding":
                op.type = "Copy"
                del op.input[1:]
        return ops
    monkeypatch.setattr(backend, "create_rnn", unpadded)
    with pytest.raises(AssertionError):
        _rnn("LSTM", "forward", t=6, lengths=[6, 2, 4, 1])


def test_run_node_and_list_inputs():
    a, b = _rand(3, 2), _rand(2, 4)
    out = backend.run_node(helper.make_node("MatMul", ["a", "b"], ["y"]), [a, b])
    np.testing.assert_allclose(out.y, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-6)


def test_onnx_graph_to_caffe2_net_fills_initializers():
    w = _rand(3, 2)
    model = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": _rand(4, 3)}, ["y"], 13, [("w", w)])
    init_net, predict_net = backend.Caffe2Backend.onnx_graph_to_caffe2_net(model)
    assert [op.type for op in init_net.op] == ["GivenTensorFill"]
    assert [op.type for op in predict_net.op] == ["BatchMatMul"]
    assert list(predict_net.external_output) == ["y"]


def test_unconvertible_nodes_are_named():
    model = _model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Hardmax", ["r"], ["y"])],
                   {"x": _rand(2, 3)}, ["y"], 13)
    with pytest.raises(RuntimeError, match=r"ONNX conversion failed: Hardmax \(y\): Don't know how to translate"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            backend.prepare(model)


def test_dummy_names_skip_used_ones():
    dummy_name(["OC2_DUMMY_0", "OC2_DUMMY_2"])
    assert [dummy_name() for _ in range(3)] == ["OC2_DUMMY_1", "OC2_DUMMY_3", "OC2_DUMMY_4"]


def test_tile_one_op_per_repeated_axis():
    _one("Tile", {"x": _rand(2, 3, 1)}, initializers=[("r", np.array([2, 1, 3], dtype=np.int64))])


@pytest.mark.parametrize("fmod", [0, 1])
def test_mod_by_a_constant_integer(fmod):
    x = np.array([[-7, -3, 0, 4, 9]], dtype=np.int32)
    _one("Mod", {"x": x}, attrs={"fmod": fmod}, initializers=[("d", np.array(3, dtype=np.int32))])


def test_argmax_default_axis_is_onnx_s():
    _one("ArgMax", {"x": _rand(4, 3)})
    _one("ArgMin", {"x": _rand(4, 3, 2)}, attrs={"axis": 1, "keepdims": 0})


def test_softmax_opset_13_last_axis():
    _one("Softmax", {"x": _rand(2, 3, 4)}, opset=13)
    _one("LogSoftmax", {"x": _rand(2, 3, 4)}, opset=13, attrs={"axis": -1})


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(approximate):
    _one("Gelu", {"x": _rand(3, 5)}, opset=20, attrs={"approximate": approximate})


def test_reduce_mean_axes_input():
    _one("ReduceMean", {"x": _rand(2, 3, 4)}, opset=18, attrs={"keepdims": 0},
         initializers=[("a", np.array([0, 2], dtype=np.int64))])


def test_an_attribute_caffe2_ignores_is_refused_unless_default():
    x = _rand(4, 3)
    _one("ArgMax", {"x": x}, attrs={"select_last_index": 0})
    model = _model([helper.make_node("ArgMax", ["x"], ["y"], select_last_index=1)], {"x": x}, ["y"], 13)
    with pytest.raises(RuntimeError, match="select_last_index=1: Caffe2's ArgMax has no such argument"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            backend.prepare(model)


def test_prepare_zip_archive_fills_external_tensors(tmp_path):
    import zipfile
    x, w = _rand(2, 3), _rand(3, 2)
    external = onnx.TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[3, 2], raw_data=b"__EXTERNAL")
    model = _model([helper.make_node("MatMul", ["X", "W"], ["Y"])], {"X": x}, ["Y"], 13, [])
    model.graph.initializer.append(external)
    path = tmp_path / "model.zip"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("__MODEL_PROTO", model.SerializeToString())
        z.writestr("W", w.tobytes())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = backend.prepare_zip_archive(str(path)).run(x).Y
    np.testing.assert_allclose(got, x.astype(np.float64) @ w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op_type, attrs", [("Save", {"db": "pwned.db", "db_type": "minidb", "absolute_path": 0}),
                                            ("Python", {"token": "f"}), ("Print", {"to_file": 1})])
def test_a_model_file_cannot_ask_for_caffe2_s_own_ops(tmp_path, monkeypatch, op_type, attrs):
    """An ONNX file is data: its nodes are ONNX operators, never Caffe2's own ops that write files or run code
    (Caffe2's backend passed any op name through). Refused at prepare, nothing written."""
    monkeypatch.chdir(tmp_path)
    model = _model([helper.make_node(op_type, ["x"], [], **attrs)], {"x": _rand(2)}, [], 9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(RuntimeError, match=f"{op_type} is not an ONNX operator"):
            backend.prepare(model).run({"x": _rand(2)})
    assert list(tmp_path.iterdir()) == []


def test_a_zip_member_over_the_blob_limit_is_refused_before_it_is_inflated(tmp_path, monkeypatch):
    """A zip archive is a file from elsewhere: each member's inflated size (from its header, which zipfile holds
    the read to) is checked first. Here the limit is made 16 bytes and W takes 24."""
    import zipfile
    external = onnx.TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[3, 2], raw_data=b"__EXTERNAL")
    model = _model([helper.make_node("MatMul", ["X", "W"], ["Y"])], {"X": _rand(2, 3)}, ["Y"], 13, [])
    model.graph.initializer.append(external)
    path = tmp_path / "model.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("__MODEL_PROTO", model.SerializeToString())
        z.writestr("W", _rand(3, 2).tobytes())
    monkeypatch.setattr(backend, "default_max_blob_bytes", lambda: 16)
    with pytest.raises(RuntimeError, match=r"member 'W' inflates to 24 bytes, over the 16 a tensor may take"):
        backend.prepare_zip_archive(str(path))
