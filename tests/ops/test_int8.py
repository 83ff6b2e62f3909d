"""Int8Quantize, Int8Dequantize, the Int8 fills and the ops that move codes (Int8Reshape, Int8Flatten,
Int8Transpose, Int8Concat): exact results from definitions written here, on every device."""
import numpy as np
import pytest
from int8_reference import F32, check_close, check_exact, codes, random_int8, real

from stepnet import Int8Tensor, Workspace
from stepnet.core.errors import ArgumentError, ArityError, DTypeError, ShapeError
from stepnet.ops import REGISTRY
from stepnet.ops.registry import GRADIENT_NOT_IMPLEMENTED
from stepnet.testing import DEVICES, infer_alone, make_op, run_op

rng = np.random.default_rng(8)


def quantize_ref(x, scale, zp):
    """Caffe2's QuantizeUint8: x / scale in float32, rounded half to even, plus zp, clamped to [0, 255]."""
    q = np.rint(np.asarray(x, F32) / F32(scale)).astype(np.float64) + zp
    return np.clip(q, 0, 255).astype(np.uint8)


# ----------------------------------------------------------------------------------------------- (de)quantize
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scale, zp", [(0.02, 128), (0.5, 0), (1.0 / 3, 255), (7e-3, 17)])
def test_quantize_is_exact(device, scale, zp):
    x = rng.uniform(-3, 3, (3, 4, 5)).astype(F32)
    x[0, 0, :3] = [np.float32(scale) * 0.5, -np.float32(scale) * 1.5, 1e9]   # ties and saturation
    got = run_op("Int8Quantize", [x], device=device, Y_scale=scale, Y_zero_point=zp)
    check_exact(got, quantize_ref(x, scale, zp), scale, zp)
    check_close(got, x.astype(np.float64), scale, zp)


@pytest.mark.parametrize("device", DEVICES)
def test_dequantize_is_exact(device):
    q = random_int8(rng, (2, 3, 4), 0.037, 100)
    got = run_op("Int8Dequantize", [q], device=device)
    want = (codes(q).astype(np.int32) - 100).astype(F32) * F32(0.037)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, real(q), rtol=1e-6)


def test_quantize_then_dequantize_is_within_half_a_step():
    x = rng.uniform(-1, 1, 1000).astype(F32)
    ws = Workspace()
    ws.feed("x", x)
    ws.run_operator_once(make_op("Int8Quantize", ["x"], ["q"], Y_scale=0.01, Y_zero_point=128))
    ws.run_operator_once(make_op("Int8Dequantize", ["q"], ["y"]))
    assert np.abs(ws.fetch("y") - x).max() <= 0.005 + 1e-7


# ----------------------------------------------------------------------------------------------- fills
@pytest.mark.parametrize("device", DEVICES)
def test_int8_given_tensor_fill_takes_bytes(device):
    raw = bytes([0, 1, 127, 128, 200, 255])
    got = run_op("Int8GivenTensorFill", [], device=device, shape=[2, 3], values=raw, Y_scale=0.5, Y_zero_point=3)
    check_exact(got, np.frombuffer(raw, np.uint8).reshape(2, 3), 0.5, 3)
    text = run_op("Int8GivenTensorFill", [], device=device, shape=[4], values="\x01\x02\x03\x04")
    check_exact(text, np.array([1, 2, 3, 4], np.uint8), 1.0, 0)     # the Caffe2 defaults: scale 1, zero point 0


@pytest.mark.parametrize("device", DEVICES)
def test_int8_given_int_tensor_fill_takes_int32s(device):
    got = run_op("Int8GivenIntTensorFill", [], device=device, shape=[3], values=[-7, 0, 2 ** 31 - 1],
                 Y_scale=10.0, Y_zero_point=4)
    check_exact(got, np.array([-7, 0, 2 ** 31 - 1], np.int32), 10.0, 4)


@pytest.mark.parametrize("op_type, args, error, words", [
    ("Int8GivenTensorFill", {"shape": [2, 2], "values": b"\x01\x02\x03"}, ArgumentError, "needs 4 values"),
    ("Int8GivenIntTensorFill", {"shape": [1], "values": [1, 2]}, ArgumentError, "needs 1 values"),
    ("Int8GivenIntTensorFill", {"shape": [1], "values": [2 ** 31]}, ArgumentError, "int32 range"),
    ("Int8GivenTensorFill", {"shape": [1], "values": b"\x01", "Y_zero_point": 256}, ArgumentError, "0..255"),
    ("Int8GivenTensorFill", {"shape": [1], "values": b"\x01", "Y_scale": 0.0}, ArgumentError, "positive")])
def test_bad_fills(op_type, args, error, words):
    with pytest.raises(error, match=words):
        run_op(op_type, [], **args)
    with pytest.raises(error, match=words):
        infer_alone(op_type, [], **args)


# ----------------------------------------------------------------------------------------------- code movers
MOVES = [  # (id, op, input shape, args, numpy definition of the output codes, extra outputs)
    ("reshape", "Int8Reshape", (2, 3, 4), {"shape": [0, -1, 2]}, lambda x: x.reshape(2, 6, 2), 2),
    ("flatten", "Int8Flatten", (2, 3, 4, 5), {"axis": 2}, lambda x: x.reshape(6, 20), 1),
    ("flatten0", "Int8Flatten", (2, 3), {"axis": 0}, lambda x: x.reshape(1, 6), 1),
    ("transpose", "Int8Transpose", (2, 3, 4), {"axes": [1, 2, 0]}, lambda x: x.transpose(1, 2, 0), 1),
    ("transpose_default", "Int8Transpose", (2, 3, 4), {}, lambda x: x.transpose(2, 1, 0), 1)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid, op_type, shape, args, define, n_out", MOVES, ids=[m[0] for m in MOVES])
def test_code_movers_are_exact(device, cid, op_type, shape, args, define, n_out):
    x = random_int8(rng, shape, 0.25, 9)
    got = run_op(op_type, [x], n_out, device=device, Y_scale=0.25, Y_zero_point=9, **args)
    y = got[0] if n_out == 2 else got
    check_exact(y, define(codes(x)), 0.25, 9)
    if n_out == 2:
        np.testing.assert_array_equal(got[1], np.array(shape, np.int64))


@pytest.mark.parametrize("device", DEVICES)
def test_reshape_by_a_shape_input_and_of_a_bias(device):
    x = random_int8(rng, (4, 6), 0.5, 1)
    y, old = run_op("Int8Reshape", [x, np.array([3, -1], np.int32)], 2, device=device, Y_scale=0.5, Y_zero_point=1)
    check_exact(y, codes(x).reshape(3, 8), 0.5, 1)
    assert old.tolist() == [4, 6]
    b = Int8Tensor(np.arange(6, dtype=np.int32), 0.125, 0)
    y, _ = run_op("Int8Reshape", [b], 2, device=device, shape=[2, 3], Y_scale=0.125)
    check_exact(y, np.arange(6, dtype=np.int32).reshape(2, 3), 0.125, 0)


CONCATS = [  # (id, shapes, args, numpy axis)
    ("nhwc", [(2, 3, 4, 5), (2, 3, 4, 2)], {"order": "NHWC"}, 3),
    ("nchw", [(1, 2, 3, 3), (1, 4, 3, 3), (1, 1, 3, 3)], {"order": "NCHW"}, 1),
    ("no_order", [(2, 3), (5, 3)], {}, 0),
    ("axis", [(2, 3, 4, 5), (2, 1, 4, 5)], {"order": "NHWC", "axis": 1}, 1),
    ("negative", [(2, 3), (2, 1)], {"axis": -1}, 1)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid, shapes, args, axis", CONCATS, ids=[c[0] for c in CONCATS])
def test_concat_with_equal_params_is_exact(device, cid, shapes, args, axis):
    xs = [random_int8(rng, s, 0.1, 128) for s in shapes]
    y, split = run_op("Int8Concat", xs, 2, device=device, Y_scale=0.1, Y_zero_point=128, **args)
    check_exact(y, np.concatenate([codes(x) for x in xs], axis=axis), 0.1, 128)
    check_close(y, np.concatenate([real(x) for x in xs], axis=axis), 0.1, 128)
    assert split.dtype == np.int32 and split.tolist() == [s[axis] for s in shapes]


@pytest.mark.parametrize("op_type, inputs, args, error, words", [
    ("Int8Quantize", [np.zeros(3, np.float64)], {}, DTypeError, "float32 tensor, got a float64"),
    ("Int8Quantize", [Int8Tensor(np.zeros(3, np.uint8))], {}, DTypeError, "got an Int8 tensor"),
    ("Int8Quantize", [np.zeros(3, F32)], {"Y_zero_point": -1}, ArgumentError, "0..255"),
    ("Int8Dequantize", [np.zeros(3, F32)], {}, DTypeError, "Int8 tensor .*got a plain float32 tensor"),
    ("Int8Dequantize", [Int8Tensor(np.zeros(3, np.int32))], {}, DTypeError, "uint8 codes, got int32"),
    ("Int8Reshape", [Int8Tensor(np.zeros(4, np.uint8), 0.5)], {"shape": [2, 2]}, ArgumentError,
     "Y_scale and Y_zero_point must equal the input's scale 0.5 and zero point 0"),
    ("Int8Reshape", [Int8Tensor(np.zeros(4, np.uint8))], {"shape": [3, -1]}, ShapeError, "cannot reshape"),
    ("Int8Flatten", [Int8Tensor(np.zeros((2, 2), np.uint8), 1.0, 5)], {}, ArgumentError, "zero point 5"),
    ("Int8Transpose", [Int8Tensor(np.zeros((2, 2), np.uint8))], {"axes": [0, 0]}, ArgumentError, "permutation"),
    ("Int8Concat", [Int8Tensor(np.zeros((2, 2), np.uint8)), Int8Tensor(np.zeros((3, 3), np.uint8))], {},
     ShapeError, "except axis 0"),
    ("Int8Concat", [Int8Tensor(np.zeros((2, 2), np.uint8))], {"order": "NHWC"}, ShapeError, "4-D"),
    ("Int8Concat", [Int8Tensor(np.zeros((2, 2), np.uint8))], {"add_axis": 1}, ArgumentError, "add_axis"),
    ("Int8Concat", [Int8Tensor(np.zeros(2, np.uint8)), np.zeros(2, np.uint8)], {}, DTypeError, "input 1")])
def test_bad_inputs_are_named(op_type, inputs, args, error, words):
    n_out = 2 if op_type == "Int8Reshape" else 1
    with pytest.raises(error, match=words):
        run_op(op_type, inputs, n_out, **args)
    with pytest.raises(error, match=words):          # static inference says the same before anything runs
        infer_alone(op_type, inputs, n_out, **args)


def test_int8_ops_have_no_gradient():
    int8_ops = [t for t in REGISTRY if t.startswith("Int8")]
    assert len(int8_ops) >= 19
    assert all(REGISTRY.get(t).gradient == GRADIENT_NOT_IMPLEMENTED for t in int8_ops)


def test_quantize_dequantize_in_a_net_ask_for_no_arity_beyond_caffe2s():
    with pytest.raises(ArityError):
        run_op("Int8Quantize", [np.zeros(2, F32), np.zeros(2, F32)])


# ----------------------------------------------------------------------------------------------- the checkers
@pytest.mark.parametrize("op_type, wrong, check", [
    ("Int8Quantize", lambda k: lambda xp, x, **a: k(xp, x * np.float32(1.01), **a),
     lambda: test_quantize_is_exact("cpu", 0.02, 128)),
    ("Int8Dequantize", lambda k: lambda xp, x: k(xp, Int8Tensor(x.data, x.scale, x.zero_point + 1)),
     lambda: test_dequantize_is_exact("cpu")),
    ("Int8Transpose", lambda k: lambda xp, x, **a: k(xp, Int8Tensor(x.data[::-1], x.scale, x.zero_point), **a),
     lambda: test_code_movers_are_exact("cpu", *MOVES[3])),
    ("Int8Concat", lambda k: lambda xp, *xs, **a: k(xp, *xs[::-1], **a),
     lambda: test_concat_with_equal_params_is_exact("cpu", *CONCATS[0])),
    ("Int8GivenTensorFill", lambda k: lambda xp, **a: k(xp, **{**a, "values": a["values"][::-1]}),
     lambda: test_int8_given_tensor_fill_takes_bytes("cpu"))])
def test_broken_kernels_are_caught(op_type, wrong, check, broken):
    check()
    broken(op_type, wrong(REGISTRY.get(op_type).kernel))
    with pytest.raises(AssertionError):
        check()
