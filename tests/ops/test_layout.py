"""Layout operators (reshape and flatten, transpose, squeeze/expand, the copy/alias family, shape queries, the
NCHW/NHWC switches) against element-by-element Python references, on every device; storage and in-place
rules, bad inputs, the no-gradient kinds declared with the ops, and broken kernels caught."""
import numpy as np
import pytest
from reference_check import check

from stepnet.core.errors import ArgumentError, ShapeError
from stepnet.passes.gradients import GradientError, backward_ops
from stepnet.ops import REGISTRY
from stepnet.ops.registry import NO_GRADIENT, SHOULD_NOT_DO_GRADIENT
from stepnet.testing import DEVICES, infer_alone, make_op, run_op
from stepnet.runtime.workspace import Workspace

RNG = np.random.default_rng(7)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def ints(values, dtype=np.int32):
    return np.array(values, dtype=dtype)


# --------------------------------------------------------------------------------------------- references
def ref_refill(x, shape):
    """x's elements in row-major order, laid out into `shape`."""
    flat = [x[idx] for idx in np.ndindex(*x.shape)]
    out = np.empty(shape, x.dtype)
    for k, idx in enumerate(np.ndindex(*shape)):
        out[idx] = flat[k]
    return out


def ref_permute(x, axes):
    shape = [x.shape[a] for a in axes]
    out = np.empty(shape, x.dtype)
    for idx in np.ndindex(*shape):
        src = [0] * x.ndim
        for k, a in enumerate(axes):
            src[a] = idx[k]
        out[idx] = x[tuple(src)]
    return out


# --------------------------------------------------------------------------------------------- the table
X234 = rand(2, 3, 4)
A = rand(2, 3)
I6 = np.arange(24, dtype=np.int64).reshape(2, 3, 4)
NCHW = rand(2, 3, 2, 2)
SQ = rand(1, 3, 1, 2)

CASES = [
    # (id, op, inputs, args, reference outputs)
    ("reshape_arg", "Reshape", [X234], {"shape": [4, -1]},
     [ref_refill(X234, (4, 6)), ints([2, 3, 4], np.int64)]),
    ("reshape_zero", "Reshape", [X234], {"shape": [0, 0, 2, 2]},
     [ref_refill(X234, (2, 3, 2, 2)), ints([2, 3, 4], np.int64)]),
    ("reshape_input32", "Reshape", [X234, ints([-1, 2])], {}, [ref_refill(X234, (12, 2)), ints([2, 3, 4])]),
    ("reshape_input64", "Reshape", [I6, ints([24], np.int64)], {},
     [ref_refill(I6, (24,)), ints([2, 3, 4], np.int64)]),
    ("reshape_empty", "Reshape", [np.zeros((0, 3), np.float32)], {"shape": [-1, 3, 1]},
     [np.zeros((0, 3, 1), np.float32), ints([0, 3], np.int64)]),
    ("flatten", "Flatten", [X234], {}, [ref_refill(X234, (2, 12))]),
    ("flatten_axis2", "Flatten", [X234], {"axis": 2}, [ref_refill(X234, (6, 4))]),
    ("flatten_axis0", "Flatten", [X234], {"axis": 0}, [ref_refill(X234, (1, 24))]),
    ("flatten_to_vec", "FlattenToVec", [X234], {}, [ref_refill(X234, (24,))]),
    ("resize_like", "ResizeLike", [X234, np.zeros((4, 6), np.int32)], {}, [ref_refill(X234, (4, 6))]),
    ("transpose_default", "Transpose", [X234], {}, [ref_permute(X234, [2, 1, 0])]),
    ("transpose_axes", "Transpose", [X234], {"axes": [1, 2, 0]}, [ref_permute(X234, [1, 2, 0])]),
    ("transpose_int", "Transpose", [I6], {"axes": [0, 2, 1]}, [ref_permute(I6, [0, 2, 1])]),
    ("squeeze", "Squeeze", [SQ], {"dims": [2, 0]}, [ref_refill(SQ, (3, 2))]),
    ("expand_dims", "ExpandDims", [X234], {"dims": [0, 4]}, [ref_refill(X234, (1, 2, 3, 4, 1))]),
    ("expand_dims_dup", "ExpandDims", [A], {"dims": [1, 1]}, [ref_refill(A, (2, 1, 3))]),
    ("copy", "Copy", [X234], {}, [X234]),
    ("stop_gradient", "StopGradient", [I6], {}, [I6]),
    ("ensure_dense", "EnsureDense", [A], {}, [A]),
    ("shape", "Shape", [X234], {}, [ints([2, 3, 4], np.int64)]),
    ("shape_axes", "Shape", [X234], {"axes": [2, 0]}, [ints([4, 2], np.int64)]),
    ("shape_scalar", "Shape", [np.float32(3.0)], {}, [np.zeros(0, np.int64)]),
    ("size", "Size", [X234], {}, [np.array(24, np.int64)]),
    ("size_empty", "Size", [np.zeros((3, 0))], {}, [np.array(0, np.int64)]),
    ("nchw2nhwc", "NCHW2NHWC", [NCHW], {}, [ref_permute(NCHW, [0, 2, 3, 1])]),
    ("nhwc2nchw", "NHWC2NCHW", [NCHW], {}, [ref_permute(NCHW, [0, 3, 1, 2])]),
    ("nchw2nhwc_3d", "NCHW2NHWC", [X234], {}, [ref_permute(X234, [0, 2, 1])]),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_against_reference(case, device):
    _, op_type, inputs, args, expected = case
    check(op_type, inputs, args, expected, device)


# --------------------------------------------------------------------------------------------- storage rules
def _run_in_ws(op_type, out="Y", **args):
    ws = Workspace()
    ws.feed("X", X234)
    outputs = [out, "old_shape"] if op_type == "Reshape" else [out]
    ws.run_operator_once(make_op(op_type, ["X"], outputs, **args))
    return ws.get_blob("X").value, ws.get_blob(out).value


def test_alias_shares_storage():
    x, y = _run_in_ws("Alias")
    assert y is x
    y[0, 0, 0] = 42.0
    assert x[0, 0, 0] == 42.0


@pytest.mark.parametrize("op_type,args", [("Copy", {}), ("StopGradient", {}), ("Reshape", {"shape": [-1]}),
                                          ("Flatten", {}), ("Transpose", {"axes": [0, 1, 2]})])
def test_outputs_are_fresh(op_type, args):
    x, y = _run_in_ws(op_type, **args)
    assert not np.shares_memory(x, y), f"{op_type} returned a view of its input"


def test_in_place_rules():
    _, y = _run_in_ws("Reshape", out="X", shape=[6, 4])
    np.testing.assert_array_equal(y, ref_refill(X234, (6, 4)))
    with pytest.raises(ArgumentError, match="in place"):
        _run_in_ws("Transpose", out="X")


# --------------------------------------------------------------------------------------------- bad inputs
BAD = [
    ("Reshape", [X234], {"shape": [5, -1]}, ShapeError,
     r"cannot reshape \(2, 3, 4\) \(24 elements\) to \[5, -1\]"),
    ("Reshape", [X234], {"shape": [5, 5]}, ShapeError, r"\(2, 3, 4\).*\[5, 5\] \(25 elements\)"),
    ("Reshape", [X234], {"shape": [-1, -1]}, ArgumentError, "at most one -1"),
    ("Reshape", [X234], {}, ArgumentError, "needs the 'shape' argument"),
    ("Reshape", [X234, ints([24])], {"shape": [24]}, ArgumentError, "do not also pass"),
    ("Reshape", [X234, ints([[24]])], {}, ShapeError, "must be 1-D"),
    ("Flatten", [A], {"axis": 3}, ShapeError, "axis=3"),
    ("FlattenToVec", [np.float32(1)], {}, ShapeError, "rank >= 1"),
    ("ResizeLike", [A, X234], {}, ShapeError, r"6 elements.*24"),
    ("Transpose", [X234], {"axes": [0, 0, 1]}, ArgumentError, "permutation"),
    ("Transpose", [X234], {"axes": [1, 0]}, ShapeError, "rank 3"),
    ("Squeeze", [X234], {"dims": [1]}, ShapeError, "dimension 1 .* is 3, not 1"),
    ("Squeeze", [X234], {"dims": [5]}, ShapeError, "rank >= 6"),
    ("Squeeze", [X234], {"dims": [-1]}, ArgumentError, "non-negative"),
    ("Squeeze", [X234], {}, ArgumentError, "required argument 'dims'"),
    ("ExpandDims", [A], {"dims": [4]}, ShapeError, "rank >= 4"),
    ("EnsureDense", [np.float32(1)], {}, ShapeError, "at least a vector"),
    ("Shape", [A], {"axes": [2]}, ArgumentError, "axis 2 is not in 0..1"),
    ("NCHW2NHWC", [A], {}, ShapeError, "rank >= 3"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type,inputs,args,error,message", BAD,
                         ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs(op_type, inputs, args, error, message, device):
    outputs = 2 if op_type in ("Split", "Reshape", "Concat") else 1
    with pytest.raises(error, match=message):
        run_op(op_type, inputs, outputs, device=device, **args)


@pytest.mark.parametrize("op_type,inputs,args,error,message", BAD,
                         ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs_found_statically(op_type, inputs, args, error, message):
    """The shape functions raise the kernels' errors, before anything runs."""
    outputs = 2 if op_type in ("Split", "Reshape", "Concat") else 1
    with pytest.raises(error, match=message):
        infer_alone(op_type, inputs, outputs, **args)


# --------------------------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("kind, op_type", [(NO_GRADIENT, "StopGradient"), (NO_GRADIENT, "Size"),
                                           (SHOULD_NOT_DO_GRADIENT, "Shape"),
                                           (SHOULD_NOT_DO_GRADIENT, "ResizeLike")])
def test_no_gradient_kinds_are_caffe2s(kind, op_type):
    assert REGISTRY.get(op_type).gradient == kind


def test_stop_gradient_stops_and_shape_refuses():
    ops, grads = backward_ops([make_op("StopGradient", ["x"], ["y"])], {"y": "y_grad"})
    assert ops == [] and "x" not in grads
    with pytest.raises(GradientError, match=r"\(Shape\) is registered as not differentiable"):
        backward_ops([make_op("Shape", ["x"], ["y"])], {"y": "y_grad"})


# ------------------------------------------------------------------------------------------ test the tester
@pytest.mark.parametrize("op_type,wrong", [
    ("Reshape", lambda xp, x, *s,
     shape: (xp.transpose(x).reshape(4, 6).copy(), xp.asarray(np.array([2, 3, 4])))),
    ("Transpose", lambda xp, x, axes: xp.reshape(x, x.shape[::-1]).copy()),   # right shape, wrong order
])
def test_reference_detects_broken_kernel(op_type, wrong, broken):
    case = {"Reshape": "reshape_arg", "Transpose": "transpose_default"}[op_type]
    _, _, inputs, args, expected = CASES[[c[0] for c in CASES].index(case)]
    check(op_type, inputs, args, expected, "cpu")   # the real kernel passes ...
    broken(op_type, wrong)
    with pytest.raises(AssertionError):             # ... the wrong one does not
        check(op_type, inputs, args, expected, "cpu")
