"""NegateGradient, SquareRootDivide, SinusoidPositionEncoding and DotProductWithPadding (stepnet/ops/misc_math.py)
against references written here from Caffe2's docs (loops, Python's math module) on every device; their
gradients against float64 finite differences and the ops the makers emit; bad inputs; broken kernels caught."""
import math

import numpy as np
import pytest

from stepnet.core.errors import ArgumentError, DTypeError, ShapeError
from stepnet.io.proto import argument_value
from stepnet.passes.gradients import backward_ops
from stepnet.testing import DEVICES, check_gradient, infer_static, make_op, run_op

rng = np.random.default_rng(5)


def sqrt_divide_ref(data, scale):
    out = np.empty(data.shape, np.float64)
    for i in range(data.shape[0]):
        s = float(scale[i])
        out[i] = data[i] / (math.sqrt(s) if s else 1.0)
    return out


def sinusoid_ref(positions, e, alpha, amplitude):
    m, k = positions.shape
    out = np.zeros((m, k, e))
    for i, j, d in np.ndindex(m, k, e):
        x = float(positions[i, 0]) / alpha ** (d / e)
        out[i, j, d] = amplitude * (math.sin(x) if d % 2 == 0 else math.cos(x))
    return out


def padded_dot_ref(x, y, pad_value=0.0, replicate=False):
    n = x.shape[0]
    x, y = x.reshape(n, -1), y.reshape(n, -1)
    out = np.zeros(n)
    for i in range(n):
        a, b = list(x[i]), list(y[i])
        short, long_ = (a, b) if len(a) <= len(b) else (b, a)
        if replicate:
            short = short * (len(long_) // len(short))
        else:
            short = short + [pad_value] * (len(long_) - len(short))
        out[i] = math.fsum(p * q for p, q in zip(short, long_))
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_negate_gradient_forward_is_a_copy_and_its_gradient_is_negative(device):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_array_equal(run_op("NegateGradient", [x], device=device), x)
    ints = np.arange(5, dtype=np.int64)
    np.testing.assert_array_equal(run_op("NegateGradient", [ints], device=device), ints)
    ops, _ = backward_ops([make_op("NegateGradient", ["x"], ["y"])], {"y": "y_grad"})
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [("Negative", ["y_grad"], ["x_grad"])]


def test_negate_gradient_really_negates():
    """d(sum(c * NegateGradient(x)))/dx is -c, the opposite of the finite differences."""
    x = rng.standard_normal(4)
    with pytest.raises(AssertionError, match="NegateGradient: gradient of input 0"):
        check_gradient("NegateGradient", [x])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scale_dtype", [np.float32, np.int32, np.int64])
def test_square_root_divide(scale_dtype, device):
    data = rng.standard_normal((4, 2, 3)).astype(np.float32)
    scale = np.array([4, 0, 9, 2], scale_dtype)
    got = run_op("SquareRootDivide", [data, scale], device=device)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, sqrt_divide_ref(data, scale), rtol=1e-6)
    doc = run_op("SquareRootDivide", [np.array([[2.0, 4.0], [9.0, 12.0]], np.float32), np.array([4, 9], np.int32)])
    np.testing.assert_allclose(doc, [[1.0, 2.0], [3.0, 4.0]])


def test_square_root_divide_gradient():
    data, scale = rng.standard_normal((3, 4)), np.array([1.5, 0.0, 7.0])
    check_gradient("SquareRootDivide", [data, scale], wrt=[0])
    ops, grads = backward_ops([make_op("SquareRootDivide", ["d", "s"], ["y"])], {"y": "y_grad"})
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [("SquareRootDivide", ["y_grad", "s"],
                                                                       ["d_grad"])]
    assert "s" not in grads or grads["s"] is None


def test_square_root_divide_bad_inputs():
    data = np.ones((2, 3), np.float32)
    with pytest.raises(ShapeError, match=r"SCALE\[1\] = -1.0 is negative"):
        run_op("SquareRootDivide", [data, np.array([1.0, -1.0], np.float32)])
    with pytest.raises(ShapeError, match="one value per row"):
        run_op("SquareRootDivide", [data, np.ones(3, np.float32)])
    with pytest.raises(DTypeError, match="float, int32 or int64"):
        run_op("SquareRootDivide", [data, np.ones(2, np.uint8)])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_sinusoid_position_encoding(dtype, device):
    positions = np.tile(np.array([1, 4, 0, 9], dtype), (3, 1)).T
    got = run_op("SinusoidPositionEncoding", [positions], device=device, embedding_size=7, alpha=5000.0,
                 amplitude=2.5)
    assert got.dtype == np.float32 and got.shape == (4, 3, 7)
    np.testing.assert_allclose(got, sinusoid_ref(positions, 7, 5000.0, 2.5), rtol=1e-5, atol=1e-5)
    default = run_op("SinusoidPositionEncoding", [positions[:2]])
    np.testing.assert_allclose(default, sinusoid_ref(positions[:2], 100, 10000.0, 1.0), rtol=1e-5, atol=1e-5)


def test_sinusoid_reads_the_first_column_only_and_checks_its_input():
    positions = np.array([[3, 7], [1, 5]], np.int32)
    got = run_op("SinusoidPositionEncoding", [positions], embedding_size=4)
    np.testing.assert_allclose(got[:, 1], got[:, 0])
    np.testing.assert_allclose(got[0, 0], sinusoid_ref(np.array([[3]]), 4, 10000.0, 1.0)[0, 0], rtol=1e-6)
    with pytest.raises(ShapeError, match="must be 2-D"):
        run_op("SinusoidPositionEncoding", [np.arange(3, dtype=np.int32)])
    with pytest.raises(DTypeError, match="int32 or int64"):
        run_op("SinusoidPositionEncoding", [positions.astype(np.float32)])
    with pytest.raises(ArgumentError, match="embedding_size must be >= 0"):
        run_op("SinusoidPositionEncoding", [positions], embedding_size=-1)
    for alpha in (0.0, -2.0, -math.inf, math.nan):   # campaign seed 10 case 6817: log's "math domain error"
        with pytest.raises(ArgumentError, match="alpha must be a positive number"):
            run_op("SinusoidPositionEncoding", [positions], alpha=alpha)


PADDED = [   # (X shape, Y shape, args)
    ((3, 5), (3, 2), {"pad_value": 0.5}),
    ((3, 2), (3, 5), {"pad_value": -1.5}),
    ((2, 4), (2, 4), {}),
    ((3, 6), (3, 2), {"replicate": True}),
    ((3, 3), (3, 9), {"replicate": True}),
    ((2, 2, 3), (2, 3, 2), {"replicate": True}),
    ((4,), (4,), {"pad_value": 3.0}),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("xs, ys, args", PADDED)
def test_dot_product_with_padding(xs, ys, args, device):
    x, y = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ys).astype(np.float32)
    got = run_op("DotProductWithPadding", [x, y], device=device, **args)
    np.testing.assert_allclose(got, padded_dot_ref(x, y, **args), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("xs, ys, args", PADDED)
def test_dot_product_with_padding_gradient(xs, ys, args):
    check_gradient("DotProductWithPadding", [rng.standard_normal(xs), rng.standard_normal(ys)], **args)


def test_dot_product_with_padding_maker_passes_its_arguments():
    fwd = make_op("DotProductWithPadding", ["x", "y"], ["z"], replicate=True)
    ops, _ = backward_ops([fwd], {"z": "z_grad"})
    (g,) = ops
    assert g.type == "DotProductWithPaddingGradient" and list(g.output) == ["x_grad", "y_grad"]
    assert {a.name: argument_value(a) for a in g.arg} == {"pad_value": 0.0, "replicate": 1}


def test_dot_product_with_padding_bad_inputs_and_static_shape():
    x = np.ones((3, 4), np.float32)
    with pytest.raises(ShapeError, match="same first dim"):
        run_op("DotProductWithPadding", [x, np.ones((2, 4), np.float32)])
    with pytest.raises(ShapeError, match="one must divide the other"):
        run_op("DotProductWithPadding", [x, np.ones((3, 3), np.float32)], replicate=True)
    with pytest.raises(ShapeError, match="one rank"):
        run_op("DotProductWithPadding", [x, np.ones(3, np.float32)])
    assert infer_static("DotProductWithPadding", [x, np.ones((3, 7), np.float32)])[0].shape == (3,)
    assert run_op("DotProductWithPadding", [np.zeros((0, 2), np.float32), np.zeros((0, 3), np.float32)]).shape == (0,)


@pytest.mark.parametrize("op_type, inputs, wrong", [
    ("SquareRootDivide", [np.ones((2, 2)), np.array([4.0, 1.0])], lambda xp, d, s: d / 2),
    ("SinusoidPositionEncoding", [np.ones((2, 1), np.int32)],
     lambda xp, p, **a: xp.zeros((2, 1, a["embedding_size"]), np.float32)),
    ("DotProductWithPadding", [np.ones((2, 3)), np.ones((2, 1))], lambda xp, x, y, **a: x.sum(axis=1)),
])
def test_the_references_catch_broken_kernels(op_type, inputs, wrong, broken):
    def check():
        got = run_op(op_type, inputs, embedding_size=3) if op_type.startswith("Sin") else run_op(op_type, inputs)
        if op_type == "SquareRootDivide":
            want = sqrt_divide_ref(*inputs)
        elif op_type == "DotProductWithPadding":
            want = padded_dot_ref(*inputs)
        else:
            want = sinusoid_ref(inputs[0], 3, 10000.0, 1.0)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    check()
    broken(op_type, wrong)
    with pytest.raises(AssertionError):
        check()


def test_check_gradient_catches_a_broken_padded_dot_gradient(broken):
    inputs = [rng.standard_normal((2, 3)), rng.standard_normal((2, 1))]
    check_gradient("DotProductWithPadding", inputs, pad_value=2.0)
    broken("DotProductWithPaddingGradient", lambda xp, X, Y, dZ, **a: (X * 0, Y * 0))
    with pytest.raises(AssertionError, match="gradient of input"):
        check_gradient("DotProductWithPadding", inputs, pad_value=2.0)
