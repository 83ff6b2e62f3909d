"""Small utilities over whole tensors: HasElements (does a tensor hold anything) and UnsafeCoalesce (several
tensors copied into one byte buffer, each output a view into it).

Semantics from caffe2/operators/utility_ops.{h,cc}. HasElements gives a 0-D bool, the complement of IsEmpty
(control.py). UnsafeCoalesce takes N tensors of fundamental types (numbers, bools: no strings) and writes N + 1
outputs: the last is a uint8 vector holding every input's bytes in turn, each block padded with zeros to a
multiple of 32 bytes (Caffe2's gCaffe2Alignment), and output i is input i's values as a view into that block,
so writing one of them writes the buffer ("unsafe"). Output i may overwrite input i (and only that one). Both
are SHOULD_NOT_DO_GRADIENT in Caffe2.

FeedBlob (caffe2/operators/feed_blob_op.h) writes its string argument `value` to its output as a string blob
(bytes, what FetchBlob gives back for one).

Free (caffe2/operators/free_op.cc) empties its blobs (each output is its input: memonger's
release_blobs_when_used puts one after a blob's last use); a later read of such a blob is an error naming it,
as a blob never written is.

GetAllBlobNames (caffe2/operators/workspace_ops.cc) lists the blobs of the workspace it runs in, its own output
included (Caffe2 makes an op's outputs when the net is made): a 1-D string tensor, sorted; include_shared=0
leaves out the blobs of parent workspaces.
"""
from __future__ import annotations

import numpy as np

from ..core.errors import ArgumentError, ArityError, DTypeError
from .base import like, on_device, out_spec, size_of, value_dependent
from .registry import SHOULD_NOT_DO_GRADIENT, Arg, op

ALIGNMENT = 32   # bytes: where each input's block starts in the coalesced buffer


# --------------------------------------------------------------------------------------------- HasElements
@op("HasElements", inputs=1, outputs=1, inplace=(), gradient=SHOULD_NOT_DO_GRADIENT,
    shape=lambda s: [out_spec((), np.bool_, 0 not in s[0].shape)])
def has_elements(xp, x):
    """A 0-D bool tensor: whether X has at least one element."""
    if not hasattr(x, "size"):
        raise DTypeError(f"HasElements needs a tensor, got a {type(x).__name__}")
    return on_device(xp, x.size > 0, np.bool_)


# --------------------------------------------------------------------------------------------- UnsafeCoalesce
def aligned(nbytes: int) -> int:
    """nbytes rounded up to a multiple of ALIGNMENT."""
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


def _check_fundamental(i: int, dtype) -> None:
    if dtype is not None and dtype.kind not in "biuf":
        raise DTypeError(f"UnsafeCoalesce coalesces only tensors of numbers or bools; input {i} holds {dtype}")


def _coalesce_shape(specs):
    for i, s in enumerate(specs):
        _check_fundamental(i, s.dtype)
    sizes = [None if s.dtype is None else aligned(size_of(s) * s.dtype.itemsize) for s in specs]
    total = None if None in sizes else sum(sizes)
    return [like(s) for s in specs] + [value_dependent((total,), np.uint8)]


def _check_structure(opdef, n: int) -> None:
    if len(opdef.output) != n + 1:
        raise ArityError(f"UnsafeCoalesce writes one output per input plus the coalesced buffer: {n} inputs need "
                         f"{n + 1} outputs, got {len(opdef.output)}")
    for i, name in enumerate(opdef.input):
        for j, out in enumerate(opdef.output):
            if out == name and i != j:
                raise ArgumentError(f"UnsafeCoalesce may write output i only over input i; output {j} is input "
                                    f"{i} ({name!r})")


@op("UnsafeCoalesce", inputs=(0, None), outputs=(1, None), context="structure", shape=_coalesce_shape,
    shapes_from_inputs=True, gradient=SHOULD_NOT_DO_GRADIENT)
def unsafe_coalesce(ctx, xp, *xs):
    """X_0..X_{N-1} -> Y_0..Y_{N-1}, COALESCED: COALESCED (uint8) holds each X_i's bytes at a 32-byte aligned
    offset (zero padding between), and Y_i is X_i's values viewed in place inside COALESCED."""
    _check_structure(ctx.opdef, len(xs))
    for i, x in enumerate(xs):
        _check_fundamental(i, x.dtype)
    offsets = np.cumsum([0] + [aligned(x.nbytes) for x in xs]).tolist()
    coalesced = xp.zeros((offsets[-1],), dtype=np.uint8)
    views = []
    for x, at in zip(xs, offsets):
        view = coalesced[at:at + x.nbytes].view(x.dtype).reshape(x.shape)
        view[...] = x
        views.append(view)
    return (*views, coalesced)


# --------------------------------------------------------------------------------------------- FeedBlob
@op("FeedBlob", inputs=0, outputs=1, args={"value": Arg("str")}, gradient=SHOULD_NOT_DO_GRADIENT,
    shape=lambda specs, **_: [None])
def feed_blob(xp, *, value):
    """The string argument `value` as a string blob (bytes)."""
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


# --------------------------------------------------------------------------------------------- Free
@op("Free", inputs=(1, None), outputs=(1, None), inplace=(), enforce_inplace=[(i, i) for i in range(1024)],
    context=True, devices="any", gradient=SHOULD_NOT_DO_GRADIENT, shape=lambda specs, **_: [None] * len(specs))
def free(ctx, xp, *values):
    """Empty each output blob (the same blob as the input at its index): its value goes, nothing is written."""
    if len(ctx.outputs) != len(values):
        raise ArityError(f"Free takes as many outputs as inputs (each input freed in place), got "
                         f"{len(values)} inputs and {len(ctx.outputs)} outputs")
    for blob in ctx.outputs:
        blob.value, blob.view = None, False


# --------------------------------------------------------------------------------------------- GetAllBlobNames
@op("GetAllBlobNames", inputs=0, outputs=1, context=True, devices="any", gradient=SHOULD_NOT_DO_GRADIENT,
    args={"include_shared": True}, shape=lambda specs, **_: [value_dependent((None,), object)])
def get_all_blob_names(ctx, xp, *, include_shared):
    """A 1-D string tensor of the names of the workspace's blobs (with include_shared, its parents' too)."""
    ws = ctx.workspace
    names = set(ws.blobs() if include_shared else ws.local_blobs()) | {str(ctx.opdef.output[0])}
    out = np.empty(len(names), dtype=object)
    out[:] = [n.encode("utf-8") for n in sorted(names)]
    return out
