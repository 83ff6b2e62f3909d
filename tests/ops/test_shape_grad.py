"""Gradients of the shape and layout operators (their makers are in shape_grad.py): float64 finite differences
on every device, the gradient ops Caffe2's makers emit, SliceGradient/TileGradient against loop references,
the refused cases, and a broken gradient kernel caught. The no-gradient kinds declared with the layout ops are
tested in test_layout.py."""
import itertools

import numpy as np
import pytest

from stepnet.core.errors import ArgumentError, ArityError, ShapeError
from stepnet.passes.gradients import GradientError, GradientSlice, backward_ops
from stepnet.ops import REGISTRY
from stepnet.io.proto import NetDef, argument_value
from stepnet.testing import DEVICES, check_gradient, make_op, run_op
from stepnet.runtime.workspace import Workspace

rng = np.random.default_rng(11)


def f64(*shape):
    return rng.standard_normal(shape)


def i32(*values):
    return np.array(values, dtype=np.int32)


def sig(ops):
    return [(o.type, list(o.input), list(o.output), {a.name: argument_value(a) for a in o.arg}) for o in ops]


# ----------------------------------------------------------------------------------------- finite differences
# (op, inputs, outputs, outputs with gradients, args)
CASES = [
    ("Concat", [f64(2, 3), f64(2, 1), f64(2, 2)], 2, [0], {"axis": 1}),
    ("Concat", [f64(2, 1, 2), f64(2, 3, 2)], 2, [0], {}),                      # axis 1 from the NCHW order
    ("Concat", [f64(3, 2), f64(3, 2)], 2, [0], {"axis": -1, "add_axis": 1}),   # stacking on a new last axis
    ("Split", [f64(2, 6)], 3, None, {"axis": 1}),                              # equal parts
    ("Split", [f64(5, 2)], 2, None, {"axis": 0, "split": [3, 2]}),
    ("Split", [f64(2, 6), i32(4, 2)], 2, None, {"axis": 1}),                   # sizes from an input
    ("Split", [f64(3, 2)], 3, None, {"axis": 0, "add_axis": 1}),               # the axis removed
    ("Slice", [f64(3, 4)], 1, None, {"starts": [1, 0], "ends": [-1, 3]}),
    ("Slice", [f64(3, 4, 2), i32(0, 1), i32(2, -1)], 1, None, {}),
    ("Reshape", [f64(2, 3, 4)], 2, [0], {"shape": [4, -1]}),
    ("Reshape", [f64(2, 6), np.array([0, 3, 2], dtype=np.int64)], 2, [0], {}),
    ("Flatten", [f64(2, 3, 4)], 1, None, {"axis": 2}),
    ("FlattenToVec", [f64(2, 3)], 1, None, {}),
    ("Transpose", [f64(2, 3, 4)], 1, None, {"axes": [1, 2, 0]}),
    ("Transpose", [f64(2, 3, 4)], 1, None, {}),
    ("Squeeze", [f64(2, 1, 3, 1)], 1, None, {"dims": [1, 3]}),
    ("ExpandDims", [f64(2, 3)], 1, None, {"dims": [0, 3]}),
    ("NCHW2NHWC", [f64(2, 3, 2, 2)], 1, None, {}),
    ("NHWC2NCHW", [f64(2, 2, 2, 3)], 1, None, {}),
    ("Copy", [f64(2, 3)], 1, None, {}),
    ("Alias", [f64(2, 3)], 1, None, {}),
    ("EnsureDense", [f64(2, 3)], 1, None, {}),
    ("Tile", [f64(2, 3)], 1, None, {"tiles": 3, "axis": 1}),
    ("Tile", [f64(2, 3, 2), np.array([2]), np.array([-2])], 1, None, {}),      # tiles and axis as inputs
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type, inputs, outputs, with_grads, args", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_gradients_match_finite_differences(op_type, inputs, outputs, with_grads, args, device):
    check_gradient(op_type, inputs, outputs=outputs, outputs_with_grads=with_grads, device=device, **args)


# ------------------------------------------------------------------------------------------- emitted ops
def test_concat_emits_split_by_split_info_with_its_arguments():
    ops, grads = backward_ops([make_op("Concat", ["a", "b"], ["y", "info"], axis=1, add_axis=1)],
                              {"y": "y_grad"})
    assert sig(ops) == [("Split", ["y_grad", "info"], ["a_grad", "b_grad"], {"axis": 1, "add_axis": 1})]
    assert ops[0].is_gradient_op and grads["a"] == "a_grad" and grads["b"] == "b_grad"


def test_split_emits_concat_with_a_dims_output():
    ops, grads = backward_ops([make_op("Split", ["x"], ["p", "q"], axis=0, split=[1, 2])],
                              {"p": "p_grad", "q": "q_grad"})
    assert sig(ops) == [("Concat", ["p_grad", "q_grad"], ["x_grad", "_x_grad_dims"],
                         {"axis": 0, "split": [1, 2]})]
    assert grads["x"] == "x_grad"


def test_reshape_emits_reshape_by_old_shape_without_arguments():
    fwd = make_op("Reshape", ["x"], ["y", "old"], shape=[3, -1])
    fwd.device_option.device_type = 1
    ops, grads = backward_ops([fwd], {"y": "y_grad"})
    assert sig(ops) == [("Reshape", ["y_grad", "old"], ["x_grad", "_x_grad_dims"], {})]
    assert ops[0].device_option.device_type == 1 and grads["x"] == "x_grad"


@pytest.mark.parametrize("op_type, inputs, args, want", [
    ("Slice", ["x"], {"starts": [0], "ends": [2]}, [("SliceGradient", ["x", "y_grad"], ["x_grad"],
                                                     {"starts": [0], "ends": [2]})]),
    ("Slice", ["x", "s", "e"], {}, [("SliceGradient", ["x", "s", "e", "y_grad"], ["x_grad"], {})]),
    ("Flatten", ["x"], {"axis": 2}, [("ResizeLike", ["y_grad", "x"], ["x_grad"], {"axis": 2})]),
    ("FlattenToVec", ["x"], {}, [("ResizeLike", ["y_grad", "x"], ["x_grad"], {})]),
    ("Transpose", ["x"], {"axes": [2, 0, 1]}, [("Transpose", ["y_grad"], ["x_grad"], {"axes": [1, 2, 0]})]),
    ("Transpose", ["x"], {}, [("Transpose", ["y_grad"], ["x_grad"], {})]),
    ("Squeeze", ["x"], {"dims": [1]}, [("ExpandDims", ["y_grad"], ["x_grad"], {"dims": [1]})]),
    ("ExpandDims", ["x"], {"dims": [0]}, [("Squeeze", ["y_grad"], ["x_grad"], {"dims": [0]})]),
    ("NCHW2NHWC", ["x"], {}, [("NHWC2NCHW", ["y_grad"], ["x_grad"], {})]),
    ("NHWC2NCHW", ["x"], {}, [("NCHW2NHWC", ["y_grad"], ["x_grad"], {})]),
    ("Copy", ["x"], {}, [("CopyOnDeviceLike", ["y_grad", "x"], ["x_grad"], {})]),
    ("Tile", ["x", "t", "a"], {}, [("TileGradient", ["y_grad", "t", "a"], ["x_grad"], {})]),
    ("Tile", ["x"], {"tiles": 2, "axis": 0}, [("TileGradient", ["y_grad"], ["x_grad"],
                                                {"tiles": 2, "axis": 0})]),
    ("Alias", ["x"], {}, []),
    ("EnsureDense", ["x"], {}, []),
])
def test_the_other_makers_emit_caffe2s_ops(op_type, inputs, args, want):
    ops, grads = backward_ops([make_op(op_type, inputs, ["y"], **args)], {"y": "y_grad"})
    assert sig(ops) == want
    assert grads["x"] == ("y_grad" if not want else "x_grad")   # Alias and EnsureDense pass dY through


def test_ensure_dense_densifies_a_sparse_gradient_with_sparse_to_dense():
    fwd = [make_op("EnsureDense", ["w"], ["wd"]), make_op("Gather", ["wd", "idx"], ["e"])]
    ops, grads = backward_ops(fwd, {"e": "e_grad"})
    assert sig(ops) == [("SparseToDense", ["idx", "e_grad", "w"], ["w_grad"], {})]
    assert grads["wd"] == GradientSlice("idx", "e_grad") and grads["w"] == "w_grad"


@pytest.mark.parametrize("device", DEVICES)
def test_ensure_dense_gradient_runs_and_matches_a_scatter_loop(device):
    w, idx, g = f64(4, 2).astype(np.float32), i32(3, 0, 3), f64(3, 2).astype(np.float32)
    fwd = [make_op("EnsureDense", ["w"], ["wd"], device=device), make_op("Gather", ["wd", "idx"], ["e"],
                                                                         device=device)]
    ops, _ = backward_ops(fwd, {"e": "e_grad"})
    ws = Workspace(gpu="emulate" if device == "emulated" else None)
    net = NetDef(name="ensure_dense")
    net.op.extend(fwd + ops)
    do = fwd[0].device_option if device != "cpu" else None
    for name, value in (("w", w), ("idx", idx), ("e_grad", g)):
        ws.feed(name, value, device_option=do)
    ws.run_net_once(net)
    want = np.zeros_like(w)
    for k, row in enumerate(idx):
        want[row] += g[k]
    np.testing.assert_allclose(ws.fetch("w_grad"), want, rtol=1e-6)


# ------------------------------------------------------------------------------------------ refused cases
def test_split_with_an_output_lacking_a_gradient_is_refused():
    with pytest.raises(GradientError, match=r"'q' of Split have no gradient.*ZeroGradient"):
        backward_ops([make_op("Split", ["x"], ["p", "q"], axis=0)], {"p": "p_grad"})


def test_split_with_no_output_gradient_emits_nothing():
    fwd = [make_op("Split", ["x"], ["p", "q"], axis=0), make_op("Copy", ["x"], ["y"])]
    ops, grads = backward_ops(fwd, {"y": "y_grad"})
    assert [o.type for o in ops] == ["CopyOnDeviceLike"] and grads["x"] == "x_grad"


def test_concat_with_one_output_cannot_be_differentiated():
    with pytest.raises(GradientError, match="second output"):
        backward_ops([make_op("Concat", ["a", "b"], ["y"], axis=0)], {"y": "y_grad"})


def test_transpose_with_axes_that_are_no_permutation_is_refused():
    with pytest.raises(GradientError, match="not a permutation"):
        backward_ops([make_op("Transpose", ["x"], ["y"], axes=[0, 0])], {"y": "y_grad"})


# --------------------------------------------------------------------------------------- gradient kernels
def ref_slice_gradient(x_shape, dy, lo, hi):
    """Zeros with dY at the sliced cells (Caffe2 bounds: negative b means size + 1 + b)."""
    lo = [b + n + 1 if b < 0 else b for b, n in zip(lo, x_shape, strict=False)]
    out = np.zeros(x_shape, dy.dtype)
    for idx in itertools.product(*(range(d) for d in dy.shape)):
        out[tuple(i + (lo[k] if k < len(lo) else 0) for k, i in enumerate(idx))] = dy[idx]
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("x_shape, lo, hi", [((4, 5), [1, 2], [3, -1]), ((3, 2, 4), [0], [-2]),
                                             ((2, 3), [0, 1], [2, 1])])
def test_slice_gradient_kernel_against_a_loop(x_shape, lo, hi, device):
    x = f64(*x_shape).astype(np.float32)
    y = run_op("Slice", [x], starts=lo, ends=hi, device=device)
    dy = f64(*y.shape).astype(np.float32)
    got = run_op("SliceGradient", [x, dy], starts=lo, ends=hi, device=device)
    via_inputs = run_op("SliceGradient", [x, i32(*lo), i32(*hi), dy], device=device)
    want = ref_slice_gradient(x_shape, dy, lo, hi)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(via_inputs, want)


def ref_tile_gradient(dy, tiles, axis):
    """dX[..., j, ...] = sum over t of dY[..., t * d + j, ...] along axis."""
    axis %= dy.ndim
    d = dy.shape[axis] // tiles
    shape = list(dy.shape)
    shape[axis] = d
    out = np.zeros(shape)
    for idx in itertools.product(*(range(n) for n in shape)):
        for t in range(tiles):
            src = list(idx)
            src[axis] = t * d + idx[axis]
            out[idx] += dy[tuple(src)]
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("x_shape, tiles, axis", [((2, 3), 3, 1), ((2, 3, 2), 2, 0), ((3, 2, 2), 4, -1),
                                                  ((2, 2), 1, 1)])
def test_tile_gradient_kernel_against_a_loop(x_shape, tiles, axis, device):
    x = f64(*x_shape).astype(np.float32)
    y = run_op("Tile", [x], tiles=tiles, axis=axis, device=device)
    dy = f64(*y.shape).astype(np.float32)
    got = run_op("TileGradient", [dy], tiles=tiles, axis=axis, device=device)
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, ref_tile_gradient(dy, tiles, axis), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op_type, inputs, args, error, message", [
    ("SliceGradient", [np.zeros((3, 4)), np.zeros((2, 4))], {"starts": [0, 0], "ends": [1, -1]}, ShapeError,
     r"dY has shape \(2, 4\) but the slice .* has shape \(1, 4\)"),
    ("SliceGradient", [np.zeros((3, 4)), i32(0), np.zeros((3, 4))], {}, ArityError, "X and dY, or X, starts"),
    ("TileGradient", [np.zeros((2, 0))], {"tiles": 0, "axis": 1}, ArgumentError, "tiles=0"),
    ("TileGradient", [np.zeros((2, 5))], {"tiles": 2, "axis": 1}, ShapeError, "not a multiple of tiles=2"),
])
def test_gradient_kernels_reject_bad_inputs(op_type, inputs, args, error, message):
    with pytest.raises(error, match=message):
        run_op(op_type, inputs, **args)


# ------------------------------------------------------------------------------------------ test the tester
def test_check_gradient_catches_a_tile_gradient_that_takes_only_the_first_copy(broken):
    def first_copy(xp, dy, *params, tiles, axis):
        return xp.split(dy, tiles, axis=axis)[0].copy()
    check_gradient("Tile", [f64(2, 3)], tiles=2, axis=1)
    broken("TileGradient", first_copy)
    with pytest.raises(AssertionError, match=r"Tile: gradient of input 0 \(in0\) is wrong"):
        check_gradient("Tile", [f64(2, 3)], tiles=2, axis=1)


def test_check_gradient_catches_a_split_that_swaps_the_gradients_of_concat(broken):
    split = REGISTRY.get("Split").kernel
    broken("Split", lambda ctx, xp, *a, **k: split(ctx, xp, *a, **k)[::-1])
    with pytest.raises(AssertionError, match="Concat: gradient of input"):
        check_gradient("Concat", [f64(2, 2), f64(2, 2)], outputs=2, outputs_with_grads=[0], axis=1)


def test_depth_concat_and_depth_split_are_concat_and_split():
    """Caffe2's backward-compatible names (concat_split_op.cc registers DepthConcat / DepthSplit with Concat's
    and Split's operators and gradients): the same values as numpy's concatenate / split, the same gradient."""
    a, b = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((2, 1)).astype(np.float32)
    y, info = run_op("DepthConcat", [a, b], 2, axis=1)
    np.testing.assert_array_equal(y, np.concatenate([a, b], axis=1))
    np.testing.assert_array_equal(info, [3, 1])
    p, q = run_op("DepthSplit", [y], 2, axis=1, split=[3, 1])
    np.testing.assert_array_equal(p, a)
    np.testing.assert_array_equal(q, b)
    ops, _ = backward_ops([make_op("DepthConcat", ["a", "b"], ["y", "info"], axis=1)], {"y": "y_grad"})
    assert sig(ops) == [("Split", ["y_grad", "info"], ["a_grad", "b_grad"], {"axis": 1})]
    check_gradient("DepthConcat", [a, b], outputs=2, outputs_with_grads=[0], axis=1)
    check_gradient("DepthSplit", [y], outputs=2, axis=1, split=[3, 1])
