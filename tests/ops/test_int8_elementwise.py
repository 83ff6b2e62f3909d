"""Int8Add / Int8AddRelu / Int8Sum / Int8SumRelu, Int8Relu and Int8Softmax against float64 references written
here (dequantize, compute, quantize with the output's parameters: within one step), on every device."""
import numpy as np
import pytest
from int8_reference import check_close, check_exact, codes, random_int8, real

from stepnet import Int8Tensor, Workspace
from stepnet.core.errors import ArgumentError, ArityError, DTypeError, ShapeError
from stepnet.ops import REGISTRY
from stepnet.testing import DEVICES, infer_alone, make_op, run_op

rng = np.random.default_rng(5)

ADDS = [  # (id, A scale, A zero point, B scale, B zero point, Y scale, Y zero point)
    ("same", 0.05, 128, 0.05, 128, 0.1, 128),
    ("mixed", 0.02, 10, 0.07, 200, 0.06, 90),
    ("fine_output", 0.5, 0, 0.25, 255, 0.01, 0),       # saturates both ways
    ("coarse_output", 0.001, 3, 0.002, 7, 0.2, 250),   # ratios near QNNPACK's lower bound 2^-14 ... 2^-7
    ("unit", 1.0, 0, 1.0, 0, 1.0, 0)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type, relu", [("Int8Add", False), ("Int8AddRelu", True), ("Int8Sum", False),
                                           ("Int8SumRelu", True)])
@pytest.mark.parametrize("cid, sa, za, sb, zb, sy, zy", ADDS, ids=[a[0] for a in ADDS])
def test_add(device, op_type, relu, cid, sa, za, sb, zb, sy, zy):
    a, b = random_int8(rng, (2, 3, 7), sa, za), random_int8(rng, (2, 3, 7), sb, zb)
    want = real(a) + real(b)
    got = run_op(op_type, [a, b], device=device, Y_scale=sy, Y_zero_point=zy)
    check_close(got, np.maximum(want, 0) if relu else want, sy, zy, op_type)


def test_add_in_place():
    ws = Workspace()
    a, b = random_int8(rng, (4, 5), 0.1, 100), random_int8(rng, (4, 5), 0.2, 30)
    ws.feed("a", a)
    ws.feed("b", b)
    ws.run_operator_once(make_op("Int8Add", ["a", "b"], ["b"], Y_scale=0.3, Y_zero_point=60))
    check_close(ws.fetch("b"), real(a) + real(b), 0.3, 60)


@pytest.mark.parametrize("device", DEVICES)
def test_relu_is_exact(device):
    x = random_int8(rng, (3, 4, 5), 0.1, 77)
    got = run_op("Int8Relu", [x], device=device, Y_scale=0.1, Y_zero_point=77)
    check_exact(got, np.maximum(codes(x), 77), 0.1, 77)
    check_close(got, np.maximum(real(x), 0), 0.1, 77)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape, scale, zp", [((3, 10), 0.1, 128), ((2, 3, 4), 0.5, 0), ((4, 1), 0.2, 9),
                                              ((2, 300), 0.03, 200), ((1, 5), 2.0, 100)])
def test_softmax(device, shape, scale, zp):
    x = random_int8(rng, shape, scale, zp)
    rows = real(x).reshape(shape[0], -1)
    e = np.exp(rows - rows.max(axis=1, keepdims=True))
    want = (e / e.sum(axis=1, keepdims=True)).reshape(shape)
    got = run_op("Int8Softmax", [x], device=device, Y_scale=1 / 256, Y_zero_point=0)
    check_close(got, want, 1 / 256, 0)


@pytest.mark.parametrize("op_type, inputs, args, error, words", [
    ("Int8Add", [Int8Tensor(np.zeros((2, 3), np.uint8)), Int8Tensor(np.zeros((3,), np.uint8))], {}, ShapeError,
     "same shape"),
    ("Int8Add", [Int8Tensor(np.zeros(3, np.uint8)), np.zeros(3, np.uint8)], {}, DTypeError, "B as an Int8 tensor"),
    ("Int8Add", [Int8Tensor(np.zeros(3, np.uint8)), Int8Tensor(np.zeros(3, np.uint8))], {"Y_scale": 1e-5},
     ArgumentError, "ratio in \\[2\\^-14, 2\\^8\\)"),
    ("Int8Add", [Int8Tensor(np.zeros(3, np.uint8), 1e-6), Int8Tensor(np.zeros(3, np.uint8))], {}, ArgumentError,
     "ratio"),
    ("Int8Sum", [Int8Tensor(np.zeros(3, np.uint8))] * 3, {}, ArityError, "exactly two"),
    ("Int8SumRelu", [Int8Tensor(np.zeros(3, np.uint8))] * 2, {"Y_zero_point": 255}, ArgumentError, "empty"),
    ("Int8Relu", [Int8Tensor(np.zeros(3, np.uint8), 0.5, 3)], {"Y_scale": 0.5}, ArgumentError,
     "zero point 3"),
    ("Int8Relu", [Int8Tensor(np.zeros(3, np.int32))], {}, DTypeError, "uint8 codes, got int32"),
    ("Int8Softmax", [Int8Tensor(np.zeros((2, 3), np.uint8))], {}, ArgumentError, "scale 1/256"),
    ("Int8Softmax", [Int8Tensor(np.zeros((2, 3), np.uint8))], {"Y_scale": 1 / 256, "axis": 0}, ArgumentError,
     "axis=0"),
    ("Int8Softmax", [Int8Tensor(np.zeros((0, 3), np.uint8))], {"Y_scale": 1 / 256}, ShapeError, "non-empty")])
def test_bad_inputs_are_named(op_type, inputs, args, error, words):
    with pytest.raises(error, match=words):
        run_op(op_type, inputs, **args)
    with pytest.raises(error, match=words):
        infer_alone(op_type, inputs, **args)


# ----------------------------------------------------------------------------------------------- the checkers
def _shift(k):
    """A kernel whose codes are two steps too high (where they can be)."""
    def kernel(xp, *xs, **a):
        y = k(xp, *xs, **a)
        return Int8Tensor(xp.minimum(y.data, 253) + 2, y.scale, y.zero_point)
    return kernel


@pytest.mark.parametrize("op_type, check", [
    ("Int8Add", lambda: test_add("cpu", "Int8Add", False, *ADDS[1])),
    ("Int8SumRelu", lambda: test_add("cpu", "Int8SumRelu", True, *ADDS[1])),
    ("Int8Relu", lambda: test_relu_is_exact("cpu")),
    ("Int8Softmax", lambda: test_softmax("cpu", (3, 10), 0.1, 128))])
def test_broken_kernels_are_caught(op_type, check, broken):
    check()
    broken(op_type, _shift(REGISTRY.get(op_type).kernel))
    with pytest.raises(AssertionError):
        check()


def test_an_add_that_ignores_a_zero_point_is_caught(broken):
    kernel = REGISTRY.get("Int8Add").kernel
    broken("Int8Add", lambda xp, a, b, **k: kernel(xp, a, Int8Tensor(b.data, b.scale, 0), **k))
    with pytest.raises(AssertionError):
        test_add("cpu", "Int8Add", False, *ADDS[1])
