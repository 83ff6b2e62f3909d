"""Ftrl and SparseFtrl against the FTRL-Proximal step written out element by element in float64 (from
Caffe2's ftrl_op: n' = n + g², σ = (√n' − √n)/α, z' = z + g − σw, w' = (λ1·sign z' − z')/((β + √n')/α + λ2)
or 0 when |z'| <= λ1), over several in-place steps, with α as an argument or an input, repeated sparse
indices applied in order, and the ops' checks."""
import math

import numpy as np
import pytest
from optim_steps import assert_close, f32, run_steps, workspace

from stepnet import NetDef
from stepnet.core.errors import ArgumentError, DTypeError, ShapeError
from stepnet.ops import REGISTRY
from stepnet.passes.gradients import GradientError, backward_ops
from stepnet.testing import DEVICES, make_op, run_op

RNG = np.random.default_rng(5)
ARGS = dict(alpha=0.05, beta=0.5, lambda1=0.02, lambda2=0.01)


def ref_step(w, nz, g, alpha, beta, lambda1, lambda2):
    """(w', nz') in float64, one weight at a time; nz holds (n, z) pairs."""
    w, g = w.astype(np.float64).ravel(), g.astype(np.float64).ravel()
    nz = nz.astype(np.float64).reshape(-1, 2).copy()
    out = np.empty_like(w)
    for i in range(w.size):
        n, z = nz[i]
        n_new = n + g[i] * g[i]
        z_new = z + g[i] - (math.sqrt(n_new) - math.sqrt(n)) / alpha * w[i]
        nz[i] = n_new, z_new
        if abs(z_new) > lambda1:
            out[i] = (lambda1 * math.copysign(1.0, z_new) - z_new) / ((beta + math.sqrt(n_new)) / alpha + lambda2)
        else:
            out[i] = 0.0
    return out, nz.ravel()


def start(shape):
    w = f32(RNG, *shape)
    nz = np.stack([np.abs(f32(RNG, *shape)), f32(RNG, *shape, scale=0.05)], axis=-1)
    return w, nz


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("alpha_as_input", [False, True])
def test_ftrl_steps(device, alpha_as_input):
    shape = (3, 4)
    w0, nz0 = start(shape)
    grads = [f32(RNG, *shape) for _ in range(4)]
    inputs, args = ["w", "nz", "g"], dict(ARGS)
    state = {"w": w0, "nz": nz0}
    if alpha_as_input:
        inputs.append("alpha")
        state["alpha"] = np.array(args.pop("alpha"), np.float32)
    out = run_steps("Ftrl", inputs, ["w", "nz"], state, [{"g": g} for g in grads], device, **args)
    w, nz = w0, nz0
    for k, g in enumerate(grads):
        w, nz = ref_step(w, nz, g, **ARGS)
        assert_close(out[k]["w"], w.reshape(shape), rtol=1e-4, atol=1e-6, what=f"w, step {k}")
        assert_close(out[k]["nz"], nz.reshape(nz0.shape), rtol=1e-5, what=f"nz, step {k}")


def test_ftrl_out_of_place_keeps_inputs_and_small_z_gives_zero():
    w, nz = np.array([0.3, -0.2], np.float32), np.array([[1.0, 0.0], [1.0, 0.0]], np.float32)
    g = np.array([0.001, 0.5], np.float32)   # z' of the first weight stays under lambda1
    new_w, new_nz = run_op("Ftrl", [w, nz, g], 2, **ARGS)
    want_w, want_nz = ref_step(w, nz, g, **ARGS)
    assert new_w[0] == 0.0 and new_w[1] != 0.0
    assert_close(new_w, want_w, rtol=1e-5)
    assert_close(new_nz, want_nz.reshape(2, 2), rtol=1e-6)


def test_default_alpha_is_caffe2s():
    w, nz = start((4,))
    g = f32(RNG, 4)
    got, _ = run_op("Ftrl", [w, nz, g], 2)
    want, _ = ref_step(w, nz, g, alpha=0.005, beta=1.0, lambda1=0.001, lambda2=0.001)
    assert_close(got, want, rtol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("idx_dtype", [np.int32, np.int64])
def test_sparse_ftrl_repeated_indices_in_order(device, idx_dtype):
    shape = (5, 3)
    w0, nz0 = start(shape)
    idx = np.array([3, 0, 3, 4, 3], idx_dtype)
    grads = [f32(RNG, idx.size, 3) for _ in range(3)]
    out = run_steps("SparseFtrl", ["w", "nz", "i", "g"], ["w", "nz"], {"w": w0, "nz": nz0, "i": idx},
                    [{"g": g} for g in grads], device, **ARGS)
    w, nz = w0.astype(np.float64).copy(), nz0.astype(np.float64).copy()
    for k, g in enumerate(grads):
        for pos, r in enumerate(idx):
            new_w, new_nz = ref_step(w[r], nz[r], g[pos], **ARGS)
            w[r], nz[r] = new_w, new_nz.reshape(3, 2)
        assert_close(out[k]["w"], w, rtol=1e-4, atol=1e-6, what=f"w, step {k}")
        assert_close(out[k]["nz"], nz, rtol=1e-5, what=f"nz, step {k}")
    untouched = [1, 2]
    np.testing.assert_array_equal(out[-1]["w"][untouched], w0[untouched])


def test_sparse_ftrl_alpha_input_and_one_weight_rows():
    w0, nz0 = start((4,))
    idx, g = np.array([2, 1], np.int64), f32(RNG, 2)
    alpha = np.array([0.02], np.float32)
    ws = workspace("cpu")
    for name, value in (("w", w0), ("nz", nz0), ("i", idx), ("g", g), ("a", alpha)):
        ws.feed(name, value)
    ws.run_operator_once(make_op("SparseFtrl", ["w", "nz", "i", "g", "a"], ["w", "nz"], beta=0.5, lambda1=0.02,
                                 lambda2=0.01))
    want_w, want_nz = w0.astype(np.float64), nz0.astype(np.float64).copy()
    for pos, r in enumerate(idx):
        new_w, new_nz = ref_step(want_w[r:r + 1], want_nz[r], g[pos:pos + 1], 0.02, 0.5, 0.02, 0.01)
        want_w[r], want_nz[r] = new_w[0], new_nz
    assert_close(ws.fetch("w"), want_w, rtol=1e-4)
    assert_close(ws.fetch("nz"), want_nz, rtol=1e-5)


def test_bad_inputs():
    w, nz = start((2, 3))
    with pytest.raises(ArgumentError, match="alpha is given both as an argument and as an input"):
        run_op("Ftrl", [w, nz, w, np.array([0.1], np.float32)], 2, alpha=0.1)
    with pytest.raises(ShapeError, match="nz .* two accumulators"):
        run_op("Ftrl", [w, w, w], 2)
    with pytest.raises(ShapeError, match="grad .* as many elements as var"):
        run_op("Ftrl", [w, nz, f32(RNG, 5)], 2)
    with pytest.raises(ShapeError, match="alpha must hold exactly one element"):
        run_op("Ftrl", [w, nz, w, np.ones(2, np.float32)], 2)
    with pytest.raises(DTypeError, match="float"):
        run_op("Ftrl", [w.astype(np.int32), nz, w], 2)
    with pytest.raises(ShapeError, match="out of bounds"):
        run_op("SparseFtrl", {"w": w, "nz": nz, "i": np.array([2]), "g": f32(RNG, 1, 3)}, ["w", "nz"])
    with pytest.raises(ShapeError, match="len\\(indices\\) = 2 rows"):
        run_op("SparseFtrl", {"w": w, "nz": nz, "i": np.array([0, 1]), "g": f32(RNG, 1, 3)}, ["w", "nz"])
    with pytest.raises(DTypeError, match="indices must be int32 or int64"):
        run_op("SparseFtrl", {"w": w, "nz": nz, "i": np.array([0.0]), "g": f32(RNG, 1, 3)}, ["w", "nz"])


def test_sparse_ftrl_must_be_in_place():
    ws = workspace("cpu")
    net = NetDef(name="bad")
    net.op.append(make_op("SparseFtrl", ["w", "nz", "i", "g"], ["w2", "nz"]))
    for name in ("w", "nz", "i", "g"):
        ws.feed(name, np.zeros(1, np.float32))
    with pytest.raises(ArgumentError, match="in place"):
        ws.create_net(net)


def test_not_differentiable():
    for op_type, n_in in (("Ftrl", 3), ("SparseFtrl", 4)):
        assert REGISTRY.get(op_type).gradient == "should_not_do_gradient"
        with pytest.raises(GradientError, match="not differentiable"):
            backward_ops([make_op(op_type, [f"i{k}" for k in range(n_in)], ["o0", "o1"])], ["o0"])


def test_reference_catches_a_broken_kernel(broken):
    def wrong(xp, var, nz, grad, alpha_input=None, *, alpha, beta, lambda1, lambda2):   # forgets σ·w in z
        pairs = nz.reshape(-1, 2)
        n, z = pairs[:, 0] + grad.reshape(-1) ** 2, pairs[:, 1] + grad.reshape(-1)
        w = (lambda1 * xp.sign(z) - z) / ((beta + xp.sqrt(n)) / alpha + lambda2)
        w = xp.where(xp.abs(z) > lambda1, w, 0).astype(var.dtype)
        return w.reshape(var.shape), xp.stack([n, z], axis=1).reshape(nz.shape)

    test_ftrl_steps("cpu", False)
    broken("Ftrl", wrong)
    with pytest.raises(AssertionError):
        test_ftrl_steps("cpu", False)
