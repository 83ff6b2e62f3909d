"""The compiled forms of the step FC (stepnet.kernels.fc_forms, stepnet.compiled.products): they give the interpreted
kernel's bits where this machine's check accepts them, are within float32 rounding of the float64 product
everywhere, and a faster form that sums otherwise is never chosen."""
import functools
import types

import numpy as np
import pytest

from stepnet import Workspace

F = np.float32


def fc_bound(y_blob=None):
    """A stand-in bound FC op (axis 1) for the compiled forms."""

    return types.SimpleNamespace(plain=functools.partial(print, axis=1, axis_w=1, float16_compute=False),
                                 outputs=[y_blob])


def fc_error_bound(x, w, b):
    """What float32 can get wrong in X·Wᵀ + b summed in any order: (K + 1)·eps32 times the sum of the terms'
    magnitudes, per element (the standard bound on a recursive sum of K products and a bias)."""
    k = x.shape[1]
    return (k + 1) * np.finfo(F).eps * (np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T + np.abs(b))


@pytest.mark.parametrize("m, k, n", [(32, 128, 512), (5, 37, 24), (1, 16, 8), (64, 512, 2048)])
def test_the_fc_form_chosen_gives_the_kernels_bits(m, k, n):
    """The step FC's compiled forms (stepnet.kernels.fc_forms): the kernel's own computation gives the FC kernel's
    bits everywhere; W·Xᵀ and the column-block forms are within float32 rounding of the float64 product (their
    sums may run in another order on some CPUs and BLAS kernels), a block form without its per-run Wᵀ copy
    takes the kernel's computation, and the form chosen automatically (checked at run time on this machine)
    gives the kernel's bits exactly."""
    from stepnet.compiled.products import fc
    from stepnet.kernels.fc_forms import same_sums, forms
    from stepnet.testing import run_op

    rng = np.random.default_rng(m + k + n)
    x, w, b = (rng.standard_normal(s).astype(F) for s in ((m, k), (n, k), (n,)))
    want = run_op("FC", [x, w, b], 1, ws=Workspace(fused_cells=False))   # the interpreted kernel
    exact = x.astype(np.float64) @ w.astype(np.float64).T + b
    bound = fc_error_bound(x, w, b)
    for parts in ("kernel", "w first", 1, 2, 4):
        fast = fc(fc_bound(), [x, w, b], [np.empty((m, n), F)], parts=parts)
        assert (fast.begin is not None) == (parts not in ("kernel", "w first"))
        out = [np.empty((m, n), F)]
        if fast.begin is not None:
            fast.fn([x, w, b], out)                  # no begin yet: the kernel's computation
            np.testing.assert_array_equal(out[0], want)
            fast.begin[1](w)
        fast.fn([x, w, b], out)
        assert (np.abs(out[0] - exact) <= bound).all(), parts
        if parts == "kernel":
            np.testing.assert_array_equal(out[0], want)
    for key in same_sums(m, k, n, F, forms(m, k, n, F)):     # what this machine's check accepts is exact
        fast = fc(fc_bound(), [x, w, b], [np.empty((m, n), F)], parts=key)
        out = [np.empty((m, n), F)]
        if fast.begin is not None:
            fast.begin[1](w)
        fast.fn([x, w, b], out)
        np.testing.assert_array_equal(out[0], want, err_msg=str(key))
    chosen = fc(fc_bound(), [x, w, b], [np.empty((m, n), F)])
    out = [np.empty((m, n), F)]
    if chosen.begin is not None:
        chosen.begin[1](w)
    chosen.fn([x, w, b], out)
    np.testing.assert_array_equal(out[0], want)


@pytest.mark.parametrize("m, k, n", [(8, 128, 512), (32, 128, 512)])
def test_an_x_of_another_layout_takes_the_kernels_computation(m, k, n):
    """Every FC form this machine accepts (checked with a C-contiguous X) gives fc_into's bits for an
    F-ordered X too (a fed input keeps its order): the non-kernel forms compute such an X as the kernel does
    (at 8×128 by 128×512 the column-block forms sum an F-ordered X otherwise on SkylakeX kernels)."""
    from stepnet.kernels.fc import fc_into
    from stepnet.kernels.fc_forms import forms, same_sums

    rng = np.random.default_rng(m * k)
    x = np.asfortranarray(rng.standard_normal((m, k)).astype(F))
    w, b = rng.standard_normal((n, k)).astype(F), rng.standard_normal(n).astype(F)
    want = fc_into(np, x, w.T, b)
    candidates = forms(m, k, n, F)
    product = candidates["kernel"].product(x, w).copy()
    for key in same_sums(m, k, n, F, candidates):
        form, out = candidates[key], np.empty((m, n), F)
        if form.begin is not None:
            form.begin(w)
        form.biased(x, w, b, out)
        np.testing.assert_array_equal(out, want, err_msg=str(key))
        np.testing.assert_array_equal(form.product(x, w), product, err_msg=str(key))


def test_the_error_bound_catches_a_wrong_product():
    """fc_error_bound is tight enough to fail a product off by one part in 10^4."""
    rng = np.random.default_rng(1)
    x, w, b = (rng.standard_normal(s).astype(F) for s in ((8, 64), (32, 64), (32,)))
    exact = x.astype(np.float64) @ w.astype(np.float64).T + b
    assert not (np.abs(exact * (1 + 1e-4) - exact) <= fc_error_bound(x, w, b)).all()


def test_a_faster_fc_form_with_other_sums_is_not_chosen():
    """fastest() times only the forms that give fc_into's bits on this machine: a faster form that sums
    otherwise (here off by a little) is never chosen; a faster form with the bits wins; with none, the
    kernel's computation stays."""
    import time

    from stepnet.kernels.fc_forms import Form, fastest, kernel_form

    m, k, n = 32, 128, 512
    real = kernel_form(m, k, n, F)

    def slow(x2, w, b, out):
        time.sleep(0.002)
        real.biased(x2, w, b, out)

    def off(x2, w, b, out):
        real.biased(x2, w, b, out)
        out *= F(1 + 1e-6)
    kernel, right, wrong = Form(slow, real.product), Form(real.biased, real.product), Form(off, real.product)
    assert fastest(m, k, n, F, {"kernel": kernel, 4: right, 2: wrong}) == 4
    assert fastest(m, k, n, F, {"kernel": kernel, 2: wrong}) == "kernel"


def test_a_trial_over_the_memory_budget_keeps_the_kernels_computation(monkeypatch):
    """A trial makes random X and W, the kernel's result and each candidate's output: over TRIAL_BYTES (a
    main net's FC over all timesteps, 100 MiB and more at T=400) no trial runs, and the kernel's computation
    stays, even against a faster form with its bits."""
    import time

    from stepnet.kernels import fc_forms
    from stepnet.kernels.fc_forms import Form, fastest, kernel_form

    m, k, n = 32, 128, 512
    real = kernel_form(m, k, n, F)

    def slow(x2, w, b, out):
        time.sleep(0.002)
        real.biased(x2, w, b, out)
    candidates = {"kernel": Form(slow, real.product), 4: Form(real.biased, real.product)}
    need = (m * k + n * k + m * n * 4) * 4           # (two candidates: X, W, result and two outputs)
    monkeypatch.setattr(fc_forms, "TRIAL_BYTES", need)
    assert fastest(m, k, n, F, candidates) == 4
    monkeypatch.setattr(fc_forms, "TRIAL_BYTES", need - 1)
    assert fastest(m, k, n, F, candidates) == "kernel"


def grad_error_bound(dy, w):
    """What float32 can get wrong in dY·W summed in any order (as fc_error_bound, without a bias)."""
    return (dy.shape[1] + 1) * np.finfo(F).eps * (np.abs(dy.astype(np.float64)) @ np.abs(w.astype(np.float64)))


def test_a_transposed_copy_is_the_transpose():
    """transposed_copy in strips of 16 rows: the transpose exactly, for row counts that are and are not
    multiples of 16; a strip that skipped a row would leave the output's garbage there."""
    from stepnet.kernels.fc_forms import transposed_copy

    rng = np.random.default_rng(3)
    for n, k in ((48, 7), (37, 20), (5, 3)):
        a = rng.standard_normal((n, k)).astype(F)
        out = np.full((k, n), np.nan, F)
        assert transposed_copy(a, out) is out
        np.testing.assert_array_equal(out, a.T)


@pytest.mark.parametrize("m, k, n", [(8, 256, 1024), (32, 128, 512), (3, 17, 40), (1, 64, 256)])
def test_the_input_gradient_form_chosen_gives_the_kernels_bits(m, k, n):
    """The step FC's input-gradient forms (kernels.fc_forms): the kernel's own computation gives
    input_gradient_into's bits; Wᵀ·dYᵀ from the per-run Wᵀ copy is within float32 rounding of the float64
    product (its sums may run in another order), and before its copy (or for another W) takes the kernel's
    computation; what this machine's check accepts, and the form chosen, give the kernel's bits exactly."""
    from stepnet.kernels.fc import input_gradient_into
    from stepnet.kernels.fc_forms import gradient_fastest, gradient_forms, gradient_same_sums

    rng = np.random.default_rng(m + k + n)
    dy, w = rng.standard_normal((m, n)).astype(F), rng.standard_normal((n, k)).astype(F)
    want = input_gradient_into(np, dy, w)
    exact, bound = dy.astype(np.float64) @ w.astype(np.float64), grad_error_bound(dy, w)
    candidates = gradient_forms(m, k, n, F)
    assert set(candidates) == {"kernel", "w transposed"}
    out = np.empty((m, k), F)
    candidates["kernel"].product(dy, w, out)
    np.testing.assert_array_equal(out, want)
    wt = candidates["w transposed"]
    wt.product(dy, w, out)                              # no begin yet: the kernel's computation
    np.testing.assert_array_equal(out, want)
    wt.begin(w)
    wt.product(dy, w, out)
    assert (np.abs(out - exact) <= bound).all()
    wt.product(dy, w.copy(), out)                       # another W than the one copied: the kernel's again
    np.testing.assert_array_equal(out, want)
    strided = np.asfortranarray(dy)                     # a layout the sums were not checked with: the kernel's
    if not strided.flags.c_contiguous:                  # (one row is C-contiguous in any order)
        wt.product(strided, w, out)
        np.testing.assert_array_equal(out, input_gradient_into(np, strided, w))
    for key in gradient_same_sums(m, k, n, F, candidates):
        form = candidates[key]
        if form.begin is not None:
            form.begin(w)
        form.product(dy, w, out)
        np.testing.assert_array_equal(out, want, err_msg=key)
    chosen = candidates[gradient_fastest(m, k, n, F, candidates)]
    if chosen.begin is not None:
        chosen.begin(w)
    chosen.product(dy, w, out)
    np.testing.assert_array_equal(out, want)


def test_a_faster_gradient_form_with_other_sums_is_not_chosen():
    """gradient_fastest() times only the forms with input_gradient_into's bits here: a faster form off by a
    little is never chosen; a faster one with the bits wins (its per-run setup counted); with none, the kernel."""
    import time

    from stepnet.kernels.fc_forms import GradientForm, gradient_fastest, gradient_kernel_form

    m, k, n = 32, 128, 512
    real = gradient_kernel_form(m, k, n, F)

    def slow(dy2, w, out):
        time.sleep(0.002)
        real.product(dy2, w, out)

    def off(dy2, w, out):
        real.product(dy2, w, out)
        out *= F(1 + 1e-6)
    kernel, right, wrong = GradientForm(slow), GradientForm(real.product, lambda w: None), GradientForm(off)
    assert gradient_fastest(m, k, n, F, {"kernel": kernel, "right": right, "wrong": wrong}) == "right"
    assert gradient_fastest(m, k, n, F, {"kernel": kernel, "wrong": wrong}) == "kernel"
    costly = GradientForm(real.product, lambda w: time.sleep(0.1))    # setup dearer than 8 calls save
    assert gradient_fastest(m, k, n, F, {"kernel": kernel, "costly": costly}) == "kernel"
