"""Window geometry shared by the convolution and pooling families, and the array helpers built on it.

Geometry follows caffe2/operators/conv_pool_op_base.h: each window quantity has a scalar form (`kernel`), a
2-D form (`kernel_h`+`kernel_w`), and a per-dimension list (`kernels`); pads list all begins then all ends
(`pad_t, pad_l, pad_b, pad_r` for 2-D). `legacy_pad` (caffe2_legacy.proto) is NOTSET=0, VALID=1, SAME=2 or
CAFFE_LEGACY_POOLING=3. Arrays are handled channels-first inside (an NHWC input is a transposed view), so one
code path serves both orders and 1-, 2- and 3-D images. `window_view` reads the windows of an image;
`scatter_windows` is its adjoint (what every gradient of a windowed op needs), and im2col/col2im are the
GEMM-shaped forms of the pair.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache

from ..core.errors import ArgumentError, ShapeError
from .registry import Arg

NOTSET, VALID, SAME, CAFFE_LEGACY_POOLING = 0, 1, 2, 3
LEGACY_NAMES = {NOTSET: "NOTSET", VALID: "VALID", SAME: "SAME", CAFFE_LEGACY_POOLING: "CAFFE_LEGACY_POOLING"}

# family -> (scalar form, 2-D forms, list form)
FORMS = {
    "kernel": ("kernel", ("kernel_h", "kernel_w"), "kernels"),
    "stride": ("stride", ("stride_h", "stride_w"), "strides"),
    "dilation": ("dilation", ("dilation_h", "dilation_w"), "dilations"),
    "pad": ("pad", ("pad_t", "pad_l", "pad_b", "pad_r"), "pads"),
    "adj": ("adj", ("adj_h", "adj_w"), "adjs"),
}


def window_args(*families: str, legacy: bool = True, global_pooling: bool = False) -> dict:
    """Declared arguments for the given families (absent = None), plus order / legacy_pad / global_pooling."""
    args = {}
    for fam in families:
        single, parts, many = FORMS[fam]
        for name in (single, *parts):
            args[name] = Arg("int", None)
        args[many] = Arg("ints", None)
    args["order"] = "NCHW"
    if legacy:
        args["legacy_pad"] = NOTSET
    if global_pooling:
        args["global_pooling"] = False
    return args


@dataclass(frozen=True)
class Geometry:
    """Per spatial dim: kernel, stride, dilation, pads (begin/end, may be negative = crop) and the number of
    window positions `out`."""
    kernel: tuple
    stride: tuple
    dilation: tuple
    pad_begin: tuple
    pad_end: tuple
    out: tuple

    @property
    def ndim(self) -> int:
        return len(self.kernel)

    def extent(self, i: int) -> int:
        """Length of padded input that the windows of dim i actually read."""
        return (self.out[i] - 1) * self.stride[i] + (self.kernel[i] - 1) * self.dilation[i] + 1


def family(key: dict, fam: str, nd: int):
    """A family's values: None when absent, else a tuple of nd ints (pads: 2*nd, all begins then all ends);
    a scalar form applies to every dim. Conflicting or partial forms are an ArgumentError."""
    single, parts, many = FORMS[fam]
    given_parts = [p for p in parts if key.get(p) is not None]
    lst = key.get(many) or None
    forms = [f for f, on in ((single, key.get(single) is not None), ("/".join(parts), bool(given_parts)),
                             (many, lst is not None)) if on]
    if len(forms) > 1:
        raise ArgumentError(f"the {fam} is given in more than one form ({' and '.join(forms)}); "
                            f"keep only one of {single}, {'+'.join(parts)} or {many}")
    if given_parts and len(given_parts) < len(parts):
        missing = [p for p in parts if key.get(p) is None]
        raise ArgumentError(f"{', '.join(given_parts)} given without {', '.join(missing)}; give all of "
                            f"{', '.join(parts)} (or {single} / {many})")
    width = 2 if fam == "pad" else 1
    if key.get(single) is not None:
        return (key[single],) * (width * nd)
    if given_parts:
        vals = tuple(key[p] for p in parts)
        return _check_len(fam, "+".join(parts), vals, nd, width)
    if lst is not None:
        return _check_len(fam, many, tuple(lst), nd, width)
    return None


def _check_len(fam, name, vals, nd, width):
    if len(vals) != width * nd:
        want = f"{width * nd} values (all begins, then all ends)" if width == 2 else f"{nd} values"
        raise ShapeError(f"{name} has {len(vals)} values {list(vals)} but the input has {nd} spatial "
                         f"dim{'s' if nd != 1 else ''}, so it needs {want}")
    return vals


def positive(fam, vals, minimum=1):
    for v in vals:
        if v < minimum:
            what = "positive" if minimum else "non-negative"
            raise ArgumentError(f"{fam} must be {what}, got {list(vals)}")
    return vals


def _div(a: int, b: int) -> int:
    """C++ integer division (truncates toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _size_and_pad(n, k, s, d, legacy, pb, pe, dim):
    """Caffe2's ComputeSizeAndPad for one dim: (out, pad_begin, pad_end)."""
    dk = d * (k - 1) + 1
    if legacy == SAME:
        if d != 1:
            raise ArgumentError(f"legacy_pad=2 (SAME) does not support dilation (got dilation {d})")
        need = (_div(n + s - 1, s) - 1) * s + k - n
        pb = _div(need, 2)
        pe = need - pb
    elif legacy == VALID:
        pb = pe = 0
    elif legacy == CAFFE_LEGACY_POOLING:
        if d != 1:
            raise ArgumentError(f"legacy_pad=3 (CAFFE_LEGACY_POOLING) does not support dilation (got {d})")
        span = n + 2 * pb - k
        out = math.ceil(span / s + 1)
        if pb > 0 and (out - 1) * s >= n + pb:
            out -= 1  # Caffe: the last window must start inside the image
        if out < 1:
            raise ShapeError(f"spatial dim {dim}: kernel {k} is larger than the input {n} padded by {pb} on "
                             "each side; use a smaller kernel or more padding")
        return out, pb, pb + s * (out - int(span / s + 1))  # the tail pad makes room for the extra window
    if n + pb + pe < dk:
        kern = f"dilated kernel {dk} (kernel {k}, dilation {d})" if d != 1 else f"kernel {k}"
        raise ShapeError(f"spatial dim {dim}: the {kern} is larger than the padded input {n + pb + pe} "
                         f"(size {n}, pads {pb}+{pe}); use a smaller kernel or more padding")
    return (n + pb + pe - dk) // s + 1, pb, pe


@lru_cache(maxsize=512)
def _geometry(key_items: tuple, spatial: tuple, kernel_hint: tuple | None, pool: bool) -> Geometry:
    key = dict(key_items)
    nd = len(spatial)
    legacy = key.get("legacy_pad", NOTSET)
    if legacy not in LEGACY_NAMES:
        raise ArgumentError("legacy_pad must be 0 (NOTSET), 1 (VALID), 2 (SAME) or 3 "
                            f"(CAFFE_LEGACY_POOLING), got {legacy}")
    pads = family(key, "pad", nd)
    stride = family(key, "stride", nd)
    dilation = family(key, "dilation", nd)
    if legacy in (VALID, SAME) and pads is not None:
        raise ArgumentError(f"legacy_pad={legacy} ({LEGACY_NAMES[legacy]}) computes the padding itself; "
                            "remove the explicit pad arguments")
    if key.get("global_pooling"):
        if any(pads or ()) or any(v != 1 for v in (stride or ()) + (dilation or ())):
            raise ArgumentError("global_pooling pools over the whole image: remove pad, stride and dilation "
                                f"(got pads {pads}, strides {stride}, dilations {dilation})")
        return Geometry(spatial, (1,) * nd, (1,) * nd, (0,) * nd, (0,) * nd, (1,) * nd)
    kernel = family(key, "kernel", nd) or kernel_hint
    if kernel is None:
        raise ArgumentError("the kernel size is required: give kernel, kernel_h+kernel_w or kernels")
    positive("kernel", kernel)
    stride = positive("stride", stride or (1,) * nd)
    dilation = positive("dilation", dilation or (1,) * nd)
    pads = positive("pads", pads or (0,) * (2 * nd), minimum=0)
    if pool:
        if any(d != 1 for d in dilation):
            raise ArgumentError(f"pooling does not support dilation (got {list(dilation)}); "
                                "Caffe2 rejects it too")
        if any(p >= k for p, k in zip(pads, kernel + kernel, strict=True)):
            raise ArgumentError(f"each pad must be smaller than the kernel (pads {list(pads)}, kernel "
                                f"{list(kernel)}); Caffe2 rejects such pooling")
    sizes = [_size_and_pad(spatial[i], kernel[i], stride[i], dilation[i], legacy, pads[i], pads[nd + i], i)
             for i in range(nd)]
    return Geometry(tuple(kernel), tuple(stride), tuple(dilation), tuple(s[1] for s in sizes),
                    tuple(s[2] for s in sizes), tuple(s[0] for s in sizes))


def args_key(args: dict) -> tuple:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in args.items()))


def geometry(args: dict, spatial, kernel_hint=None, pool: bool = False) -> Geometry:
    """The window geometry of a conv/pool op for an image of these spatial sizes (cached per arguments)."""
    return _geometry(args_key(args), tuple(int(v) for v in spatial), kernel_hint, pool)


def check_order(order: str) -> str:
    o = order.upper()
    if o not in ("NCHW", "NHWC"):
        raise ArgumentError(f"order must be 'NCHW' or 'NHWC', got {order!r}")
    return o


def image_dims(shape, order: str, what: str = "X") -> tuple[int, int, tuple]:
    """(N, C, spatial dims) of an image shape in the given order."""
    if len(shape) < 3:
        raise ShapeError(f"{what} must have a batch, a channel and at least one spatial dim ({order}), "
                         f"got shape {tuple(shape)}")
    shape = tuple(int(d) for d in shape)
    return (shape[0], shape[1], shape[2:]) if order == "NCHW" else (shape[0], shape[-1], shape[1:-1])


def in_order(n: int, c: int, spatial, order: str) -> tuple:
    """The shape (N, C, *spatial) laid out in the given order."""
    return (n, c, *spatial) if order == "NCHW" else (n, *spatial, c)


def channels_first(xp, x, order: str, what: str = "X"):
    """x viewed as (N, C, *spatial); NHWC inputs are transposed views (no copy)."""
    image_dims(x.shape, order, what)
    return x if order == "NCHW" else xp.moveaxis(x, -1, 1)


def from_channels_first(xp, y, order: str):
    """A fresh contiguous array in the op's order from a channels-first result."""
    return xp.ascontiguousarray(y if order == "NCHW" else xp.moveaxis(y, 1, -1))


def _pad_to_extent(xp, xc, geom: Geometry, fill):
    """xc padded (or cropped) so each spatial dim holds exactly the extent the windows read."""
    crops, widths = [slice(None)] * 2, [(0, 0), (0, 0)]
    for i in range(geom.ndim):
        n, pb = xc.shape[2 + i], geom.pad_begin[i]
        pe = geom.extent(i) - n - pb
        crops.append(slice(max(-pb, 0), n - max(-pe, 0)))
        widths.append((max(pb, 0), max(pe, 0)))
    xc = xc[tuple(crops)]
    if any(w != (0, 0) for w in widths):
        xc = xp.pad(xc, widths, mode="constant", constant_values=fill)
    return xc


def window_view(xp, xc, geom: Geometry, fill=0):
    """A strided view (N, C, *out, *kernel) of the padded channels-first input: no copy beyond the padding."""
    p = _pad_to_extent(xp, xc, geom, fill)
    nd, st = geom.ndim, p.strides
    shape = tuple(xc.shape[:2]) + geom.out + geom.kernel
    strides = (st[0], st[1]) + tuple(st[2 + i] * geom.stride[i] for i in range(nd)) + \
        tuple(st[2 + i] * geom.dilation[i] for i in range(nd))
    return xp.lib.stride_tricks.as_strided(p, shape=shape, strides=strides)


def im2col(xp, xc, geom: Geometry, groups: int = 1):
    """Columns (G, N*out_pixels, C/G*kernel_pixels) of a channels-first input, ordered (c, *kernel)."""
    n, c = xc.shape[:2]
    nd = geom.ndim
    v = window_view(xp, xc, geom).reshape((n, groups, c // groups) + geom.out + geom.kernel)
    v = v.transpose((1, 0) + tuple(range(3, 3 + nd)) + (2,) + tuple(range(3 + nd, 3 + 2 * nd)))
    return v.reshape(groups, n * math.prod(geom.out), (c // groups) * math.prod(geom.kernel))


def taps(geom: Geometry):
    """Every kernel position (a tuple of per-dim offsets), in C order."""
    return itertools.product(*(range(k) for k in geom.kernel))


def scatter_windows(xp, contribution, x_shape, geom: Geometry, dtype):
    """The adjoint of window_view: sum contribution(tap) -- an (N, C, *out) array for each kernel position --
    onto the image positions those windows read, one strided add per position; pixels read from the padding
    fall away. Returns a fresh (N, C, *spatial) array."""
    n, c = x_shape[:2]
    nd = geom.ndim
    z = xp.zeros((n, c) + tuple(geom.extent(i) for i in range(nd)), dtype=dtype)
    for tap in taps(geom):
        dst = tuple(slice(t * d, t * d + (o - 1) * s + 1, s)
                    for t, d, o, s in zip(tap, geom.dilation, geom.out, geom.stride, strict=True))
        z[(slice(None), slice(None)) + dst] += contribution(tap)
    out = xp.zeros(tuple(x_shape), dtype=dtype)
    src, dst = [slice(None)] * 2, [slice(None)] * 2
    for i in range(nd):
        pb, size = geom.pad_begin[i], x_shape[2 + i]
        lo, hi = max(0, -pb), min(size, z.shape[2 + i] - pb)
        if hi <= lo:
            return out
        dst.append(slice(lo, hi))
        src.append(slice(lo + pb, hi + pb))
    out[tuple(dst)] = z[tuple(src)]
    return out


def col2im(xp, cols, x_shape, geom: Geometry, groups: int = 1):
    """The adjoint of im2col: scatter-add columns (G, N*out, C/G*kernel) onto a (N, C, *spatial) image."""
    n, c = x_shape[:2]
    nd = geom.ndim
    v = cols.reshape((groups, n) + geom.out + (c // groups,) + geom.kernel)
    v = v.transpose((1, 0, 2 + nd) + tuple(range(3 + nd, 3 + 2 * nd)) + tuple(range(2, 2 + nd)))
    v = v.reshape((n, c) + geom.kernel + geom.out)
    return scatter_windows(xp, lambda tap: v[(slice(None), slice(None)) + tap], x_shape, geom, cols.dtype)


def filter_gradient(g):
    """The gradient maker of Conv, ConvTranspose and the locally connected ops (Caffe2's GetConvGradient,
    GetLocallyConnectedGradient): <Type>Gradient(X, filter, dY) -> (dfilter, dbias, dX), without dbias
    (no_bias=1) when there is no bias input, without dX under no_gradient_to_input."""
    outputs, extra = [g.GI(1)], {}
    if g.n_inputs == 3:
        outputs.append(g.GI(2))
    else:
        extra["no_bias"] = 1
    if not g.arg("no_gradient_to_input", 0):
        outputs.append(g.GI(0))
    g.op(g.def_.type + "Gradient", [g.I(0), g.I(1), g.GO(0)], outputs, **extra)
