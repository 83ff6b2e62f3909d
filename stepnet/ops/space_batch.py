"""SpaceToBatch and BatchToSpace: spatial blocks of an NCHW image moved into the batch and back.

Semantics from caffe2/operators/space_batch_op.{h,cc}. SpaceToBatch zero-pads X (N, C, H, W) and moves each
block_size x block_size block's positions into the batch: output batch (dy * block_size + dx) * N + n holds the
pixels at (y * block_size + dy, x * block_size + dx) of image n, so the output is (N * block_size^2, C, H' /
block_size, W' / block_size), H' and W' the padded sizes, which must be multiples of block_size. BatchToSpace is
its inverse, cropping the padding away. Arguments as Caffe2 reads them: `pad` pads the bottom, left and right,
`pad_t` the top (default: pad), block_size defaults to 2, and order must be NCHW. Each is the other's gradient
(Caffe2's makers: BatchToSpace(dY) and SpaceToBatch(dY), with the forward's arguments).
"""
from __future__ import annotations

from ..core.errors import ArgumentError, ShapeError
from .base import check_float, out_spec, single_gradient
from .registry import Arg, op

SPACE_BATCH_ARGS = {"pad": 0, "pad_t": Arg("int", None), "block_size": 2, "order": "NCHW"}


def _pads(op_type: str, pad: int, pad_t, block_size: int, order: str) -> tuple[int, int]:
    """(top pad, the pad of the other three sides), the arguments checked."""
    if order != "NCHW":
        raise ArgumentError(f"{op_type} supports order NCHW only, got {order!r}")
    if block_size < 1:
        raise ArgumentError(f"{op_type} argument block_size must be >= 1, got {block_size}")
    top = pad if pad_t is None else pad_t
    if pad < 0 or top < 0:
        raise ArgumentError(f"{op_type}: pads must be >= 0, got pad={pad}, pad_t={top}")
    return top, pad


def _image(op_type: str, x) -> tuple[int, int, int, int]:
    check_float(op_type, X=x)
    if len(x.shape) != 4:
        raise ShapeError(f"{op_type} needs a 4-D NCHW tensor, got shape {tuple(x.shape)}")
    return tuple(int(d) for d in x.shape)


def _to_batch_dims(x, pad, pad_t, block_size, order) -> tuple[tuple[int, ...], int, int]:
    """SpaceToBatch's output dims, and the top and other pads."""
    top, side = _pads("SpaceToBatch", pad, pad_t, block_size, order)
    n, c, h, w = _image("SpaceToBatch", x)
    height, width = h + top + side, w + 2 * side
    if height % block_size or width % block_size:
        raise ShapeError(f"SpaceToBatch: the padded height {height} and width {width} of X {tuple(x.shape)} "
                         f"must be multiples of block_size {block_size}")
    return (n * block_size * block_size, c, height // block_size, width // block_size), top, side


def _to_space_dims(x, pad, pad_t, block_size, order) -> tuple[tuple[int, ...], int, int]:
    """BatchToSpace's output dims, and the top and other pads."""
    top, side = _pads("BatchToSpace", pad, pad_t, block_size, order)
    b, c, h, w = _image("BatchToSpace", x)
    blocks = block_size * block_size
    if b % blocks:
        raise ShapeError(f"BatchToSpace: the batch {b} of X {tuple(x.shape)} must be a multiple of block_size^2 "
                         f"= {blocks}")
    height, width = h * block_size - top - side, w * block_size - 2 * side
    if height < 0 or width < 0:
        raise ShapeError(f"BatchToSpace: X {tuple(x.shape)} with block_size {block_size} is {h * block_size} x "
                         f"{w * block_size}, smaller than the pads (top {top}, others {side}) to crop")
    return (b // blocks, c, height, width), top, side


def _shape_of(dims_fn):
    def shape(specs, *, pad, pad_t, block_size, order):
        dims, _, _ = dims_fn(specs[0], pad, pad_t, block_size, order)
        return [out_spec(dims, specs[0].dtype)]
    return shape


@op("SpaceToBatch", inputs=1, outputs=1, inplace=(), args=SPACE_BATCH_ARGS, shape=_shape_of(_to_batch_dims),
    shapes_from_inputs=True, grows="shapes", gradient=single_gradient("BatchToSpace", ["GO0"]))
def space_to_batch(xp, x, *, pad, pad_t, block_size, order):
    """X (N, C, H, W) zero-padded (pad_t on top, pad elsewhere) -> (N * block_size^2, C, H' / block_size,
    W' / block_size): output batch (dy * block_size + dx) * N + n is image n's pixels at offset (dy, dx) of
    every block."""
    (_, c, ho, wo), top, side = _to_batch_dims(x, pad, pad_t, block_size, order)
    n, bs = x.shape[0], block_size
    padded = xp.zeros((n, c, ho * bs, wo * bs), dtype=x.dtype)
    padded[:, :, top:top + x.shape[2], side:side + x.shape[3]] = x
    blocks = padded.reshape(n, c, ho, bs, wo, bs).transpose(3, 5, 0, 1, 2, 4)   # (dy, dx, n, c, y, x)
    return xp.ascontiguousarray(blocks).reshape(bs * bs * n, c, ho, wo)


@op("BatchToSpace", inputs=1, outputs=1, inplace=(), args=SPACE_BATCH_ARGS, shape=_shape_of(_to_space_dims),
    shapes_from_inputs=True, gradient=single_gradient("SpaceToBatch", ["GO0"]))
def batch_to_space(xp, x, *, pad, pad_t, block_size, order):
    """The inverse of SpaceToBatch: X (N * block_size^2, C, H, W) -> (N, C, H * block_size - pad_t - pad,
    W * block_size - 2 pad), each batch's pixels put back at their block offset, then the pads cropped."""
    (n, c, height, width), top, side = _to_space_dims(x, pad, pad_t, block_size, order)
    bs, (_, _, h, w) = block_size, x.shape
    blocks = x.reshape(bs, bs, n, c, h, w).transpose(2, 3, 4, 0, 5, 1)          # (n, c, y, dy, x, dx)
    full = xp.ascontiguousarray(blocks).reshape(n, c, h * bs, w * bs)
    return xp.ascontiguousarray(full[:, :, top:top + height, side:side + width])
