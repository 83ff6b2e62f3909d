"""Half-precision operators (stepnet/ops/fp16.py): the casts, the fp16 fills and the packed fp16 FC against
references built from Python's own IEEE half packing (struct format 'e') and loops, on every device; the
casts' gradients by finite differences; bad inputs (also found statically); the no-gradient kinds; and a broken
kernel caught by each checker."""
import math
import struct

import numpy as np
import pytest
from reference_check import check

from stepnet.core.errors import ArgumentError, DTypeError, ShapeError
from stepnet.passes.gradients import backward_ops
from stepnet.ops import REGISTRY
from stepnet.ops.registry import NO_GRADIENT
from stepnet.testing import DEVICES, check_gradient, infer_alone, make_op, run_op

RNG = np.random.default_rng(16)


def half(v: float) -> float:
    """v rounded to the nearest IEEE half (ties to even), by Python's struct; inf past the half range."""
    try:
        return struct.unpack("<e", struct.pack("<e", float(v)))[0]
    except OverflowError:
        return math.copysign(math.inf, v)


def halves(values, shape=None, clip=False) -> np.ndarray:
    out = [half(min(max(float(v), -65504.0), 65504.0) if clip else v) for v in np.ravel(values)]
    return np.array(out, np.float16).reshape(np.shape(values) if shape is None else shape)


def from_bits(bits) -> np.ndarray:
    """float32 values of half bit patterns, decoded by struct."""
    return np.array([struct.unpack("<e", struct.pack("<H", b))[0] for b in bits], np.float32)


def fc_ref(x, w, b, axis=1):
    """rows of x (flattened at axis) times the rows of w, in exact float64 sums, plus b."""
    rows = np.asarray(x, np.float64).reshape(math.prod(x.shape[:axis]), -1)
    w2 = np.asarray(w, np.float64).reshape(len(b), -1)
    y = [[math.fsum(r * w2[j]) + float(b[j]) for j in range(len(b))] for r in rows]
    return np.array(y, np.float32).reshape(tuple(x.shape[:axis]) + (len(b),))


# ------------------------------------------------------------------------------------------ the table
X = (RNG.standard_normal((3, 4)) * 10).astype(np.float32)
EDGES = np.array([0.0, -0.0, 1e-8, 6.1e-5, 65504.0, 65519.0, 65520.0, -7e4, 1 / 3, 2049.0, 2051.0],
                 np.float32)
BITS = [0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x3C00, 0x7BFF, 0xFBFF, 0x7C00, 0x3555]
W53 = (RNG.standard_normal((5, 3)) * 4).astype(np.float32)
XF = RNG.standard_normal((2, 3, 3)).astype(np.float32)
B5 = RNG.standard_normal(5).astype(np.float32)
VALS = [0.1, -2.5, 70000.0, 1e-9]

CASES = [
    ("to_half", "FloatToHalf", [X], {}, [halves(X)]),
    ("to_half_edges", "FloatToHalf", [EDGES], {}, [halves(EDGES)]),
    ("to_half_clip", "FloatToHalf", [EDGES], {"clip": 1}, [halves(EDGES, clip=True)]),
    ("to_float", "HalfToFloat", [np.array(BITS, np.uint16).view(np.float16)], {}, [from_bits(BITS)]),
    ("to_float_3d", "HalfToFloat", [halves(XF)], {}, [np.array([float(v) for v in halves(XF).ravel()],
                                                               np.float32).reshape(2, 3, 3)]),
    ("fp16_fill", "GivenTensorFp16Fill", [], {"shape": [2, 2], "values": VALS}, [halves(VALS, (2, 2))]),
    ("fp16_fill_like", "GivenTensorFp16Fill", [np.zeros((4,), np.int32)], {"values": VALS}, [halves(VALS)]),
    ("fp16_constant", "Float16ConstantFill", [], {"shape": [2, 3], "value": 0.3}, [halves([0.3] * 6, (2, 3))]),
    ("pack", "FbGemmPack", [W53], {}, [halves(W53)]),
    ("pack_axis", "FbGemmPack", [W53.reshape(5, 3, 1)], {"axis_w": 1}, [halves(W53)]),
    ("pack_transpose", "FbGemmPackTranspose", [W53.T.copy()], {}, [halves(W53)]),
    ("fc_packed", "FbFCPacked", [XF, halves(W53), B5], {"axis": 2},
     [fc_ref(XF, halves(W53).astype(np.float64), B5, axis=2)]),
    ("fc_packed_axis1", "FbFCPacked", [XF.reshape(2, 9)[:, :3].copy(), halves(W53), B5], {},
     [fc_ref(XF.reshape(2, 9)[:, :3], halves(W53).astype(np.float64), B5)]),
    ("fc_packed_empty", "FbFCPacked", [np.zeros((0, 3), np.float32), halves(W53), B5], {},
     [np.zeros((0, 5), np.float32)]),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_against_reference(case, device):
    _, op_type, inputs, args, expected = case
    tol = 1e-5 if op_type == "FbFCPacked" else 0.0   # float32 sums in another order; the rest is exact
    check(op_type, inputs, args, expected, device, tol)


def test_the_packed_fc_keeps_x_in_float32():
    """fbgemm's fp16 GEMM rounds only the weights: an X that half cannot hold keeps its digits."""
    x = np.array([[1 + 2 ** -20, 3.0]], np.float32)
    w = np.array([[1.0, 0.0]], np.float16)
    got = run_op("FbFCPacked", [x, w, np.zeros(1, np.float32)])
    assert got[0, 0] == np.float32(1 + 2 ** -20)


# ------------------------------------------------------------------------------------------- gradients
GRID = np.arange(-8, 8, dtype=np.float32).reshape(4, 4) / 4   # exact in half, and so are x +- 1/8


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type, x", [("FloatToHalf", GRID), ("HalfToFloat", GRID.astype(np.float16))])
def test_cast_gradients_match_finite_differences(op_type, x, device):
    """The casts are typed (float32 <-> float16), so x keeps its dtype; on a grid that half holds exactly the
    central differences (summed in float64) are exact and the analytic gradient is the other cast."""
    check_gradient(op_type, [x], float64=False, eps=0.125, device=device)


@pytest.mark.parametrize("op_type, grad_type", [("FloatToHalf", "HalfToFloat"), ("HalfToFloat", "FloatToHalf")])
def test_cast_gradients_are_the_other_cast(op_type, grad_type):
    ops, grads = backward_ops([make_op(op_type, ["x"], ["y"])], {"y": "y_grad"})
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [(grad_type, ["y_grad"], ["x_grad"])]
    assert grads["x"] == "x_grad"


@pytest.mark.parametrize("kind, op_type", [
    (NO_GRADIENT, "GivenTensorFp16Fill"), (NO_GRADIENT, "Float16ConstantFill"),
    (None, "FbFCPacked"), (None, "FbGemmPack"), (None, "FbGemmPackTranspose")])
def test_no_gradient_kinds_are_caffe2s(kind, op_type):
    assert REGISTRY.get(op_type).gradient == kind


# ------------------------------------------------------------------------------------------ bad inputs
H53 = halves(W53)
BAD = [
    ("FloatToHalf", [X.astype(np.float64)], {}, DTypeError, "X must be float32, got float64"),
    ("HalfToFloat", [X], {}, DTypeError, "X must be float16, got float32"),
    ("GivenTensorFp16Fill", [], {"shape": [3], "values": VALS}, ArgumentError, "needs 3 values .* holds 4"),
    ("Float16ConstantFill", [], {"shape": [2, -1]}, ArgumentError, "negative dimension"),
    ("FbGemmPack", [H53], {}, DTypeError, "the weight must be float32"),
    ("FbFCPacked", [XF, W53, B5], {"axis": 2}, DTypeError, "packed weight W .* must be float16"),
    ("FbFCPacked", [XF, H53, B5], {}, ShapeError, r"M x K = 2 x 9; .* N x K = 5 x 3"),
    ("FbFCPacked", [XF, H53, B5[:4]], {"axis": 2}, ShapeError, "must have N = 5"),
    ("FbFCPacked", [XF, H53, B5.reshape(5, 1)], {"axis": 2}, ShapeError, "b must be 1-D"),
    ("FbFCPacked", [XF.astype(np.float64), H53, B5.astype(np.float64)], {"axis": 2}, DTypeError,
     "X must be float32"),
    ("FbFCPacked", [XF, H53, B5], {"axis": 3}, ArgumentError, "axis=3 is out of range"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type,inputs,args,error,message", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs(op_type, inputs, args, error, message, device):
    with pytest.raises(error, match=message):
        run_op(op_type, inputs, 1, device=device, **args)


@pytest.mark.parametrize("op_type,inputs,args,error,message", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs_found_statically(op_type, inputs, args, error, message):
    with pytest.raises(error, match=message):
        infer_alone(op_type, inputs, 1, **args)


# ------------------------------------------------------------------------------------------ test the tester
@pytest.mark.parametrize("case_id, wrong", [
    ("to_half", lambda xp, x, clip=False: (xp.trunc(x * 64) / 64).astype(np.float16)),           # truncates
    ("to_half_clip", lambda xp, x, clip=False: x.astype(np.float16)),                            # ignores clip
    ("fc_packed", lambda xp, X, W, b, axis=1, axis_w=1: xp.matmul(X, W.astype(np.float32).T)),   # forgets b
    ("pack_transpose", lambda xp, W, axis_w=1, no_packing=0: W.astype(np.float16)),              # no transpose
])
@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
def test_reference_detects_broken_kernel(case_id, wrong, broken):
    _, op_type, inputs, args, expected = CASES[[c[0] for c in CASES].index(case_id)]
    tol = 1e-5 if op_type == "FbFCPacked" else 0.0
    check(op_type, inputs, args, expected, "cpu", tol)
    broken(op_type, wrong)
    with pytest.raises(AssertionError):
        check(op_type, inputs, args, expected, "cpu", tol)


def test_finite_differences_detect_a_broken_gradient_kernel(broken):
    check_gradient("HalfToFloat", [GRID.astype(np.float16)], float64=False, eps=0.125)
    broken("FloatToHalf", lambda xp, x, clip=False: (x * 2).astype(np.float16))   # HalfToFloat's gradient op
    with pytest.raises(AssertionError, match="gradient of input 0"):
        check_gradient("HalfToFloat", [GRID.astype(np.float16)], float64=False, eps=0.125)


def test_float16_constant_fill_is_refused_over_the_blob_limit():
    from stepnet import Limits, Workspace
    from stepnet.core.errors import ResourceError
    ws = Workspace(limits=Limits(max_blob_bytes=1024))
    with pytest.raises(ResourceError, match="Float16ConstantFill"):
        ws.run_operator_once(make_op("Float16ConstantFill", [], ["y"], shape=[10 ** 6, 10 ** 6], value=1.0))
    ws.run_operator_once(make_op("Float16ConstantFill", [], ["y"], shape=[8, 8], value=1.0))
    assert ws.fetch("y").shape == (8, 8)
