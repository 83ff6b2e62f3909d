"""FC's fused kernel for one row (stepnet/ops/math.py `_fused_fc`, numba's fc_row; Workspace.fused_cells) and the
fused compiled forms (stepnet/compiled/products.py `fc_row` with its FC + Sum pair, fc_row_sum; stepnet/compiled/
fused.py `softmax`): one float32 row against a float64 product within float32 rounding, NaN and ±inf spread as
the BLAS product spreads them, other rows, dtypes and FCTransposed left to the regular kernel, the compiled forms
with the interpreted fused kernels' bits, overlapping arrays refused, broken kernels caught."""
import functools
import importlib.util
import types

import numpy as np
import pytest

from test_fused_softmax import fused, plain   # (run_op with the fused kernels on / off)

from stepnet.runtime.workspace import Blob

pytestmark = pytest.mark.skipif(importlib.util.find_spec("numba") is None,
                                reason="numba (the fast extra, in the test extra) is not installed")
F = np.float32


def fc_inputs(x_shape, w_shape, axis_w=1, seed=0, dtype=F):
    """Random x, W and a bias of W's N (the product of W's dims before axis_w)."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(w_shape[:axis_w % len(w_shape)]))
    return [rng.standard_normal(s).astype(dtype) for s in (x_shape, w_shape)] + [rng.standard_normal(n).astype(dtype)]


def assert_near_product(got, x, w, b, axis=1, axis_w=1):
    """got within float32 rounding of X·Wᵀ + b computed in float64: (K + 1)·2^-23 of the sum of |terms| (both
    BLAS and fc_row sum K products, then add the bias, in some order)."""
    k = int(np.prod(x.shape[axis:]))
    x2, w2 = x.reshape(-1, k).astype(np.float64), w.reshape(-1, k).astype(np.float64)
    want = x2 @ w2.T + b
    bound = (np.abs(x2) @ np.abs(w2).T + np.abs(b)) * (k + 1) * 2.0 ** -23
    assert got.shape == x.shape[:axis] + (w2.shape[0],)
    assert (np.abs(got.reshape(want.shape) - want) <= bound).all(), np.abs(got.reshape(want.shape) - want).max()


@pytest.mark.parametrize("n", [1, 3, 4, 5, 7, 65, 512])
@pytest.mark.parametrize("k", [1, 3, 4, 5, 65, 128])
def test_one_row_against_the_float64_product(k, n):
    x, w, b = fc_inputs((1, k), (n, k), seed=k * 1000 + n)
    got = fused("FC", [x, w, b])
    assert got.dtype == F
    assert_near_product(got, x, w, b)
    assert_near_product(plain("FC", [x, w, b]), x, w, b)      # the bound holds for BLAS's sums as well


@pytest.mark.parametrize("x_shape, axis, w_shape, axis_w", [
    ((1, 1, 65), 2, (7, 65), 1),          # rows = 1·1
    ((1, 5, 13), 1, (9, 5, 13), 1),       # K = 5·13 from X's trailing dims and from W's
    ((1, 1, 12), 2, (3, 4, 12), 2),       # N = 3·4
    ((1, 6), -1, (4, 2, 3), -2),          # negative axes
    ((2, 3), 0, (5, 6), 1),               # axis 0: every element in one row, Y of shape (N,)
])
def test_one_row_of_n_d_views(x_shape, axis, w_shape, axis_w):
    x, w, b = fc_inputs(x_shape, w_shape, axis_w, seed=len(x_shape) + sum(w_shape))
    got = fused("FC", [x, w, b], axis=axis, axis_w=axis_w)
    assert_near_product(got, x, w, b, axis=axis % x.ndim, axis_w=axis_w)


def test_a_broken_row_kernel_is_caught(monkeypatch):
    """One row really takes fc_row (read from the kernel module when FC specializes): a kernel dropping the
    bias fails the reference check."""
    from stepnet.kernels import jit as fused_module

    module = fused_module.load()
    real = module.fc_row
    monkeypatch.setattr(module, "fc_row", lambda W, x, b, y: real(W, x, np.zeros_like(b), y))
    x, w, b = fc_inputs((1, 16), (10, 16), seed=5)
    with pytest.raises(AssertionError):
        assert_near_product(fused("FC", [x, w, b]), x, w, b)
    assert_near_product(plain("FC", [x, w, b]), x, w, b)          # the regular kernel does not read it


def special_case(case):
    """x (1 × 9), W (11 × 9), b with special values where `case` puts them (11 rows: a block of four and a tail)."""
    x, w, b = fc_inputs((1, 9), (11, 9), seed=7)
    if case == "0·inf":
        x[0, 2], w[1, 2], w[9, 2] = 0, np.inf, -np.inf
    elif case == "nan in W":
        w[5, 4], w[10, 0] = np.nan, np.nan
    elif case == "inf in x":
        x[0, 6], w[3, 6], w[8, 6] = np.inf, 0, -2
    elif case == "inf - inf":
        w[3, 0], w[3, 1], w[9, 0] = np.inf, -np.inf, np.inf
        x[0, :2] = 1
    elif case == "bias":
        b[8], b[10], b[2] = np.inf, np.nan, -np.inf
    elif case == "overflow":
        w[4, :], x[0, :] = 3e38, 2
    return x, w, b


@pytest.mark.parametrize("case", ["0·inf", "nan in W", "inf in x", "inf - inf", "bias", "overflow"])
def test_nan_and_inf_spread_as_in_the_regular_kernel(case):
    x, w, b = special_case(case)
    with np.errstate(all="ignore"):
        got, want = fused("FC", [x, w, b]), plain("FC", [x, w, b])
    assert not np.isfinite(want).all()                                  # the case has special values at all
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    np.testing.assert_array_equal(np.sign(got[np.isinf(got)]), np.sign(want[np.isinf(want)]))
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op_type, x_shape, w_shape, dtype, args", [
    ("FC", (2, 16), (9, 16), F, {}),                       # more than one row
    ("FC", (70, 16), (9, 16), F, {}),                      # rows enough for the one-hot gather
    ("FC", (2, 3, 4), (9, 12), F, {}),
    ("FC", (1, 16), (9, 16), np.float64, {}),              # one row of float64
    ("FC", (1, 16), (9, 16), F, {"float16_compute": True}),
    ("FCTransposed", (1, 16), (16, 9), F, {}),             # no fused kernel
])
def test_other_inputs_take_the_regular_kernel(op_type, x_shape, w_shape, dtype, args):
    x, w, _ = fc_inputs(x_shape, w_shape, seed=11, dtype=dtype)
    b = np.random.default_rng(12).standard_normal(w.size // int(np.prod(x_shape[1:]))).astype(dtype)
    np.testing.assert_array_equal(fused(op_type, [x, w, b], **args), plain(op_type, [x, w, b], **args))


# ------------------------------------------------------------------------------------------- compiled forms
def bound_op(outputs, inputs=(), **args):
    """A stand-in bound op for the compiled forms: its kernel's arguments, its input and output Blobs."""
    return types.SimpleNamespace(plain=functools.partial(print, **args), inputs=list(inputs), outputs=list(outputs))


def fc_op(y, axis=1, axis_w=1, float16_compute=False):
    """A stand-in bound FC writing y (an array, or the Blob a Sum reads)."""
    return bound_op([y if isinstance(y, Blob) else Blob("y", y)], axis=axis, axis_w=axis_w,
                    float16_compute=float16_compute)


@pytest.mark.parametrize("x_shape, w_shape, axis, axis_w", [
    ((1, 1), (1, 1), 1, 1), ((1, 5), (7, 5), 1, 1), ((1, 65), (512, 65), 1, 1), ((1, 128), (3, 128), 1, 1),
    ((1, 1, 12), (3, 4, 12), 2, 2), ((1, 5, 13), (9, 5, 13), 1, 1)])
def test_the_row_form_gives_the_interpreted_bits(x_shape, w_shape, axis, axis_w):
    from stepnet.compiled.products import fc_row

    x, w, b = fc_inputs(x_shape, w_shape, axis_w, seed=sum(w_shape))
    want = fused("FC", [x, w, b], axis=axis, axis_w=axis_w)
    y = np.full(want.shape, np.nan, F)
    form = fc_row(fc_op(y, axis, axis_w), [x, w, b], [y])
    assert form is not None
    form.fn([x, w, b], [y])
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("x_shape, dtype, f16", [((2, 8), F, False), ((1, 8), np.float64, False),
                                                 ((1, 8), F, True)])
def test_no_row_form_for_other_inputs(x_shape, dtype, f16):
    from stepnet.compiled.products import fc_row

    x, w, b = fc_inputs(x_shape, (6, 8), dtype=dtype)
    y = np.empty((x_shape[0], 6), dtype)
    assert fc_row(fc_op(y, float16_compute=f16), [x, w, b], [y]) is None


def pair_case(how, n=37, k=21, seed=3):
    """(FC's form, the Sum's stand-in op, the pair's inputs, the pair's outputs, y, z) for FC -> y then the Sum
    `how`: Sum(y, z) -> y, Sum(y, z) -> s, Sum(z, y) -> s or Sum(y, z) -> z."""
    from stepnet.compiled.products import fc_row

    x, w, b = fc_inputs((1, k), (n, k), seed=seed)
    z = np.random.default_rng(seed + 1).standard_normal((1, n)).astype(F)
    y, s = np.empty((1, n), F), np.empty((1, n), F)
    y_blob, z_blob, s_blob = Blob("y", y), Blob("z", z), Blob("s", s)
    sum_ins = [z_blob, y_blob] if how == "Sum(z, y) -> s" else [y_blob, z_blob]
    out_blob = {"Sum(y, z) -> y": y_blob, "Sum(y, z) -> z": z_blob}.get(how, s_blob)
    sum_op = bound_op([out_blob], sum_ins)
    form = fc_row(fc_op(y_blob), [x, w, b], [y])
    return form, sum_op, [x, w, b, *(blob.value for blob in sum_ins)], [y, out_blob.value], y, z


@pytest.mark.parametrize("how", ["Sum(y, z) -> y", "Sum(y, z) -> s", "Sum(z, y) -> s", "Sum(y, z) -> z"])
def test_the_pair_form_gives_the_two_kernels_bits(how):
    form, sum_op, ins, outs, y, z = pair_case(how)
    want_y = fused("FC", ins[:3])
    want_s = want_y + z if how != "Sum(z, y) -> s" else z + want_y
    z_before = z.copy()
    pair = form.fuse(sum_op, ins, outs[1:])
    assert pair is not None
    pair.fn(ins, outs)
    np.testing.assert_array_equal(outs[1], want_s)
    if how != "Sum(y, z) -> y":
        np.testing.assert_array_equal(y, want_y)
    if how != "Sum(y, z) -> z":
        np.testing.assert_array_equal(z, z_before)


def test_a_broken_pair_kernel_is_caught(monkeypatch):
    from stepnet.kernels import jit as fused_module

    module = fused_module.load()
    real = module.fc_row_sum
    monkeypatch.setattr(module, "fc_row_sum", lambda W, x, b, z, y, s: real(W, x, b, z * F(1.5), y, s))
    form, sum_op, ins, outs, y, z = pair_case("Sum(y, z) -> s")
    form.fuse(sum_op, ins, outs[1:]).fn(ins, outs)
    with pytest.raises(AssertionError):
        np.testing.assert_array_equal(outs[1], fused("FC", ins[:3]) + z)


@pytest.mark.parametrize("overlap", ["z in y", "s in y"])
def test_overlapping_arrays_are_not_paired(overlap):
    """z sharing y's memory in part, or s sharing it without being y or z: one pass would read sums the two
    ops never see."""
    from stepnet.compiled.products import fc_row

    n = 12
    x, w, b = fc_inputs((1, 8), (n, 8))
    rows = np.zeros((1, n + 1), F)
    y, other, fresh = rows[:, :n], rows[:, 1:], np.ones((1, n), F)
    z, s = (other, fresh) if overlap == "z in y" else (fresh, other)
    y_blob = Blob("y", y)
    form = fc_row(fc_op(y_blob), [x, w, b], [y])
    assert form.fuse(bound_op([Blob("s", s)], [y_blob, Blob("z", z)]), [x, w, b, y, z], [s]) is None
    apart = np.empty((1, n), F)                                      # the same pair without the overlap is taken
    assert form.fuse(bound_op([Blob("s", apart)], [y_blob, Blob("z", fresh)]), [x, w, b, y, fresh],
                     [apart]) is not None


@pytest.mark.parametrize("shape, axis", [((1, 65), 1), ((1, 1, 65), 2), ((4, 3, 5), 1), ((2, 7), -1)])
def test_the_softmax_form_gives_the_interpreted_bits(shape, axis):
    from stepnet.compiled.jit_forms import softmax

    x = (np.random.default_rng(shape[-1]).standard_normal(shape) * 4).astype(F)
    want = fused("Softmax", [x], axis=axis)
    out = np.full(shape, np.nan, F)
    form = softmax(bound_op([Blob("y", out)], axis=axis), [x], [out])
    assert form is not None
    form.fn([x], [out])
    np.testing.assert_array_equal(out, want)


def test_no_softmax_form_for_float64():
    from stepnet.compiled.jit_forms import softmax

    x = np.random.default_rng(0).standard_normal((3, 5))
    assert softmax(bound_op([Blob("y", x.copy())], axis=1), [x], [x.copy()]) is None


def test_a_broken_softmax_form_is_caught(monkeypatch):
    """The form reads softmax_rows when it is made: one made with a wrong kernel fails the bit check."""
    from stepnet.compiled.jit_forms import softmax
    from stepnet.kernels import jit as fused_module

    module = fused_module.load()
    real = module.softmax_rows
    x = np.random.default_rng(9).standard_normal((4, 10)).astype(F)
    out = np.empty_like(x)
    with monkeypatch.context() as m:
        m.setattr(module, "softmax_rows", lambda x, out: real(np.roll(x, 1, axis=1), out))
        form = softmax(bound_op([Blob("y", out)], axis=1), [x], [out])
    form.fn([x], [out])
    with pytest.raises(AssertionError):
        np.testing.assert_array_equal(out, fused("Softmax", [x]))
