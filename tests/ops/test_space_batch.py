"""SpaceToBatch and BatchToSpace (stepnet/ops/space_batch.py) against Caffe2's index loops (written here) on
every device; each other's inverse; gradients by float64 finite differences and the ops Caffe2's makers emit;
bad arguments and shapes; a broken kernel caught."""
import numpy as np
import pytest

from stepnet.core.errors import ArgumentError, DTypeError, ShapeError
from stepnet.passes.gradients import backward_ops
from stepnet.testing import DEVICES, check_gradient, infer_static, make_op, run_op

rng = np.random.default_rng(21)


def space_to_batch_ref(x, top, pad, bs):
    n, c, h, w = x.shape
    ho, wo = (h + top + pad) // bs, (w + 2 * pad) // bs
    out = np.zeros((n * bs * bs, c, ho, wo), x.dtype)
    for ob, d, oh, ow in np.ndindex(*out.shape):
        b, offset_w, offset_h = ob % n, (ob // n) % bs, (ob // n) // bs
        ih, iw = oh * bs + offset_h - top, ow * bs + offset_w - pad
        if 0 <= ih < h and 0 <= iw < w:
            out[ob, d, oh, ow] = x[b, d, ih, iw]
    return out


def batch_to_space_ref(x, top, pad, bs):
    nb, c, h, w = x.shape
    n = nb // (bs * bs)
    out = np.full((n, c, h * bs - top - pad, w * bs - 2 * pad), np.nan, x.dtype)
    for ib, d, ih, iw in np.ndindex(*x.shape):
        ob, offset_w, offset_h = ib % n, (ib // n) % bs, (ib // n) // bs
        oh, ow = ih * bs + offset_h - top, iw * bs + offset_w - pad
        if 0 <= oh < out.shape[2] and 0 <= ow < out.shape[3]:
            out[ob, d, oh, ow] = x[ib, d, ih, iw]
    return out


CASES = [((2, 3, 4, 6), {}), ((1, 2, 4, 4), {"pad": 1, "block_size": 3}), ((3, 1, 2, 4), {"pad": 1}),
         ((2, 2, 5, 4), {"pad": 1, "pad_t": 0, "block_size": 3}), ((1, 1, 1, 2), {"pad_t": 1, "block_size": 2})]


def pads(args):
    pad = args.get("pad", 0)
    return args.get("pad_t", pad), pad, args.get("block_size", 2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape,args", CASES)
def test_space_to_batch_and_back(shape, args, device):
    x = rng.standard_normal(shape).astype(np.float32)
    y = run_op("SpaceToBatch", [x], device=device, **args)
    np.testing.assert_array_equal(y, space_to_batch_ref(x, *pads(args)))
    back = run_op("BatchToSpace", [y], device=device, **args)
    np.testing.assert_array_equal(back, x)
    np.testing.assert_array_equal(back, batch_to_space_ref(y, *pads(args)))


def test_by_hand():
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    y = run_op("SpaceToBatch", [x])
    assert y.shape == (4, 1, 2, 2)
    assert y[:, 0].tolist() == [[[0, 2], [8, 10]], [[1, 3], [9, 11]], [[4, 6], [12, 14]], [[5, 7], [13, 15]]]


@pytest.mark.parametrize("shape,args", CASES[:3])
def test_gradients(shape, args):
    check_gradient("SpaceToBatch", [rng.standard_normal(shape)], **args)
    y_shape = space_to_batch_ref(np.zeros(shape), *pads(args)).shape
    check_gradient("BatchToSpace", [rng.standard_normal(y_shape)], **args)
    for fwd, bwd in (("SpaceToBatch", "BatchToSpace"), ("BatchToSpace", "SpaceToBatch")):
        ops, _ = backward_ops([make_op(fwd, ["x"], ["y"], pad=1, block_size=3)], {"y": "y_grad"})
        assert [(o.type, list(o.input), list(o.output)) for o in ops] == [(bwd, ["y_grad"], ["x_grad"])]
        assert sorted(a.name for a in ops[0].arg) == ["block_size", "pad"]


def test_inferred_shapes_and_bad_inputs():
    assert infer_static("SpaceToBatch", [np.zeros((2, 3, 4, 6), np.float32)], pad=1)[0].shape == (8, 3, 3, 4)
    assert infer_static("BatchToSpace", [np.zeros((8, 3, 3, 4), np.float32)], pad=1)[0].shape == (2, 3, 4, 6)
    x = np.zeros((1, 1, 3, 4), np.float32)
    with pytest.raises(ShapeError, match="padded height 3 and width 4 .* multiples of block_size 2"):
        run_op("SpaceToBatch", [x])
    with pytest.raises(ShapeError, match="batch 3 .* multiple of block_size\\^2 = 4"):
        run_op("BatchToSpace", [np.zeros((3, 1, 2, 2), np.float32)])
    with pytest.raises(ShapeError, match="smaller than the pads"):
        run_op("BatchToSpace", [np.zeros((4, 1, 1, 1), np.float32)], pad=2)
    with pytest.raises(ShapeError, match="4-D NCHW"):
        run_op("SpaceToBatch", [np.zeros((2, 4, 4), np.float32)])
    with pytest.raises(ArgumentError, match="NCHW only"):
        run_op("SpaceToBatch", [np.zeros((1, 1, 2, 2), np.float32)], order="NHWC")
    with pytest.raises(ArgumentError, match="block_size must be >= 1, got 0"):
        run_op("BatchToSpace", [np.zeros((1, 1, 2, 2), np.float32)], block_size=0)
    with pytest.raises(ArgumentError, match="pads must be >= 0"):
        run_op("SpaceToBatch", [np.zeros((1, 1, 2, 2), np.float32)], pad=-1)
    with pytest.raises(DTypeError, match="float"):
        run_op("SpaceToBatch", [np.zeros((1, 1, 2, 2), np.int32)])


def test_checkers_catch_a_broken_kernel(broken):
    def swapped(xp, x, **_):   # block offsets (dx, dy) where Caffe2 has (dy, dx)
        n, c, h, w = x.shape
        blocks = x.reshape(n, c, h // 2, 2, w // 2, 2).transpose(5, 3, 0, 1, 2, 4)
        return blocks.reshape(4 * n, c, h // 2, w // 2).copy()
    broken("SpaceToBatch", swapped)
    with pytest.raises(AssertionError):
        test_space_to_batch_and_back((2, 3, 4, 6), {}, "cpu")
    with pytest.raises(AssertionError, match="gradient of input 0"):
        check_gradient("BatchToSpace", [rng.standard_normal((8, 1, 2, 2))])
