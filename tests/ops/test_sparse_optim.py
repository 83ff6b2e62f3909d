"""Sparse optimizer and scatter ops against Caffe2's sequential row loop written out in float64 (repeated
indices included), against their dense forms applied row by row, and their checks and in-place rules."""
import math

import numpy as np
import pytest
from optim_steps import assert_close, counter, f32, lr_blob, run_steps, workspace

from stepnet import NetDef
from stepnet.core.errors import ArgumentError, ArityError, DTypeError, ShapeError
from stepnet.testing import DEVICES, make_op, run_op

RNG = np.random.default_rng(11)
SHAPE = (5, 2, 3)                      # 5 rows of 6 elements
IDX = np.array([3, 0, 3, 3, 1])        # row 3 three times
IDX2D = np.array([[4, 4], [2, 0]])     # indices of rank 2: grad is (2, 2, 2, 3)


def grads_for(idx, steps=3):
    return [f32(RNG, *idx.shape, *SHAPE[1:]) for _ in range(steps)]


# --------------------------------------------------------------------------------------------- references
def rows(a):
    return a.astype(np.float64).reshape(a.shape[0], -1).copy()


def ref_sparse_momentum(w, m, idx, g, lr, mu, nesterov):
    g = g.reshape(idx.size, -1).astype(np.float64)
    go = np.zeros_like(g)
    for i, r in enumerate(idx.ravel()):
        for j in range(g.shape[1]):
            old = m[r, j]
            if nesterov:
                m[r, j] = mu * old + lr * g[i, j]
                go[i, j] = (1 + mu) * m[r, j] - mu * old
            else:
                m[r, j] = lr * g[i, j] + mu * old
                go[i, j] = m[r, j]
            w[r, j] -= go[i, j]
    return go


def ref_sparse_adagrad(w, h, idx, g, lr, eps, wd, rowwise):
    g = g.reshape(idx.size, -1).astype(np.float64)
    for i, r in enumerate(idx.ravel()):
        gi = [g[i, j] + wd * w[r, j] for j in range(g.shape[1])]
        if rowwise:
            h[r, 0] += sum(x * x for x in gi) / len(gi)
            for j, x in enumerate(gi):
                w[r, j] += lr * x / (math.sqrt(h[r, 0]) + eps)
        else:
            for j, x in enumerate(gi):
                h[r, j] += x * x
                w[r, j] += lr * x / (math.sqrt(h[r, j]) + eps)


def ref_sparse_adam(w, m1, m2, idx, g, lr, it, b1, b2, eps, rowwise):
    g = g.reshape(idx.size, -1).astype(np.float64)
    c = math.sqrt(1 - b2 ** (it + 1)) / (1 - b1 ** (it + 1))
    eg = np.zeros_like(g)
    for i, r in enumerate(idx.ravel()):
        if rowwise:
            m2[r, 0] = b2 * m2[r, 0] + (1 - b2) * sum(x * x for x in g[i]) / g.shape[1]
        for j in range(g.shape[1]):
            m1[r, j] = b1 * m1[r, j] + (1 - b1) * g[i, j]
            if not rowwise:
                m2[r, j] = b2 * m2[r, j] + (1 - b2) * g[i, j] ** 2
            eg[i, j] = c * m1[r, j] / (math.sqrt(m2[r, 0 if rowwise else j]) + eps)
            w[r, j] += lr * eg[i, j]
    return eg


# --------------------------------------------------------------------------------------------- optimizers
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("idx", [IDX, IDX2D], ids=["dups", "rank2"])
@pytest.mark.parametrize("nesterov", [0, 1])
def test_sparse_momentum_steps(device, idx, nesterov):
    w0, grads = f32(RNG, *SHAPE), grads_for(idx)
    out = run_steps("SparseMomentumSGDUpdate", ["g", "m", "lr", "w", "i"], ["g", "m", "w"],
                    {"w": w0, "m": np.zeros_like(w0), "lr": lr_blob(0.1), "i": idx},
                    [{"g": g} for g in grads], device, momentum=0.8, nesterov=nesterov)
    w, m = rows(w0), np.zeros((5, 6))
    for k, g in enumerate(grads):
        go = ref_sparse_momentum(w, m, idx, g, 0.1, 0.8, nesterov)
        assert_close(out[k]["g"], go.reshape(g.shape), what=f"adjusted grad, step {k}")
        assert_close(out[k]["m"], m.reshape(SHAPE), what=f"moment, step {k}")
        assert_close(out[k]["w"], w.reshape(SHAPE), what=f"param, step {k}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("idx", [IDX, IDX2D], ids=["dups", "rank2"])
@pytest.mark.parametrize("op_type,wd", [("SparseAdagrad", 0.0), ("SparseAdagrad", 0.1),
                                        ("RowWiseSparseAdagrad", 0.0), ("RowWiseSparseAdagrad", 0.1)])
def test_sparse_adagrad_steps(device, idx, op_type, wd):
    rowwise = op_type.startswith("RowWise")
    w0, grads = f32(RNG, *SHAPE), grads_for(idx)
    h0 = np.full(5 if rowwise else SHAPE, 0.5, np.float32)
    out = run_steps(op_type, ["w", "h", "i", "g", "lr"], ["w", "h"], {"w": w0, "h": h0, "i": idx,
                    "lr": lr_blob(-0.2)}, [{"g": g} for g in grads], device, epsilon=1e-3, weight_decay=wd)
    w, h = rows(w0), h0.astype(np.float64).reshape(5, -1).copy()
    for k, g in enumerate(grads):
        ref_sparse_adagrad(w, h, idx, g, -0.2, 1e-3, wd, rowwise)
        assert_close(out[k]["w"], w.reshape(SHAPE), what=f"param, step {k}")
        assert_close(out[k]["h"], h.reshape(h0.shape), what=f"moment, step {k}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("idx", [IDX, IDX2D], ids=["dups", "rank2"])
@pytest.mark.parametrize("op_type", ["SparseAdam", "RowWiseSparseAdam"])
def test_sparse_adam_steps(device, idx, op_type):
    rowwise = op_type.startswith("RowWise")
    w0, grads = f32(RNG, *SHAPE), grads_for(idx)
    m2_0 = np.zeros(5 if rowwise else SHAPE, np.float32)
    outputs = ["w", "m1", "m2"] + ([] if rowwise else ["eg"])
    out = run_steps(op_type, ["w", "m1", "m2", "i", "g", "lr", "iter"], outputs,
                    {"w": w0, "m1": np.zeros_like(w0), "m2": m2_0, "i": idx, "lr": lr_blob(-0.05)},
                    [{"g": g, "iter": counter(k + 3)} for k, g in enumerate(grads)], device, host=("iter",),
                    beta1=0.8, beta2=0.95, epsilon=1e-4)
    w, m1, m2 = rows(w0), np.zeros((5, 6)), np.zeros((5, 1 if rowwise else 6))
    for k, g in enumerate(grads):
        eg = ref_sparse_adam(w, m1, m2, idx, g, -0.05, k + 3, 0.8, 0.95, 1e-4, rowwise)
        assert_close(out[k]["w"], w.reshape(SHAPE), rtol=1e-4, what=f"param, step {k}")
        assert_close(out[k]["m1"], m1.reshape(SHAPE), what=f"moment 1, step {k}")
        assert_close(out[k]["m2"], m2.reshape(m2_0.shape), what=f"moment 2, step {k}")
        if not rowwise:
            assert_close(out[k]["eg"], eg.reshape(g.shape), rtol=1e-4, what=f"effective grad, step {k}")


DENSE_FORMS = {  # sparse op -> (dense op, sparse inputs, sparse outputs, dense inputs, dense outputs, args)
    "SparseAdagrad": ("Adagrad", ["w", "h", "i", "g", "lr"], ["w", "h"], ["w", "h", "g", "lr"], ["w", "h"],
                      dict(epsilon=1e-3)),
    "SparseAdam": ("Adam", ["w", "h", "v", "i", "g", "lr", "it"], ["w", "h", "v"],
                   ["w", "h", "v", "g", "lr", "it"], ["w", "h", "v"], dict(beta1=0.7)),
    "SparseMomentumSGDUpdate": ("MomentumSGDUpdate", ["g", "h", "lr", "w", "i"], ["g", "h", "w"],
                                ["g", "h", "lr", "w"], ["g", "h", "w"], dict(momentum=0.9, nesterov=1)),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sparse", list(DENSE_FORMS))
def test_sparse_equals_dense_row_by_row(device, sparse):
    # The sparse op = its dense form run on each indexed row in turn (a repeated row sees its own update).
    dense, s_in, s_out, d_in, d_out, args = DENSE_FORMS[sparse]
    tables = {"w": f32(RNG, *SHAPE), "h": np.abs(f32(RNG, *SHAPE)), "v": np.abs(f32(RNG, *SHAPE))}
    g = grads_for(IDX, 1)[0]
    common = {"lr": lr_blob(-0.3 if sparse != "SparseMomentumSGDUpdate" else 0.3), "it": counter(4)}
    got = run_op(sparse, {n: {**tables, **common, "i": IDX, "g": g}[n] for n in s_in}, s_out, device=device,
                 **args)
    want = {k: v.copy() for k, v in tables.items()}
    for pos, r in enumerate(IDX):
        feeds = {**{k: v[r] for k, v in want.items()}, **common, "g": g[pos]}
        res = run_op(dense, {n: feeds[n] for n in d_in}, d_out, device=device, **args)
        for name, value in zip(d_out, res, strict=True):
            if name != "g":
                want[name][r] = value
    for name, value in zip(s_out, got, strict=True):
        if name != "g":
            assert_close(value, want[name], rtol=1e-5, atol=1e-6, what=name)
    untouched = [r for r in range(5) if r not in IDX]
    np.testing.assert_array_equal(got[s_out.index("w")][untouched], tables["w"][untouched])


EMPTY_CASES = [  # (op, inputs, outputs, index of the updated table among the outputs)
    ("SparseAdagrad", ["w", "h", "i", "g", "lr"], ["w", "h"], 0),
    ("RowWiseSparseAdagrad", ["w", "r", "i", "g", "lr"], ["w", "r"], 0),
    ("SparseAdam", ["w", "h", "h2", "i", "g", "lr", "it"], ["w", "h", "h2"], 0),
    ("ScatterWeightedSum", ["w", "lr", "i", "g", "lr2"], ["w"], 0),
    ("SparseMomentumSGDUpdate", ["g", "h", "lr", "w", "i"], ["g", "h", "w"], 2),
    ("ScatterAssign", ["w", "i", "g"], ["w"], 0)]


@pytest.mark.parametrize("op_type,inputs,outputs,table", EMPTY_CASES)
def test_empty_indices_change_nothing(op_type, inputs, outputs, table):
    w = f32(RNG, *SHAPE)
    feeds = {"w": w, "h": f32(RNG, *SHAPE), "h2": f32(RNG, *SHAPE), "r": f32(RNG, 5), "lr": lr_blob(-1),
             "lr2": lr_blob(-1), "g": np.zeros((0, 2, 3), np.float32), "i": np.zeros(0, np.int64),
             "it": counter(1)}
    outs = run_op(op_type, {n: feeds[n] for n in inputs}, outputs)
    np.testing.assert_array_equal(outs[table] if len(outputs) > 1 else outs, w)


# --------------------------------------------------------------------------------------------- scatter ops
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("w0", [1.0, 0.5])
def test_scatter_weighted_sum(device, w0):
    x0, x1, x2 = f32(RNG, *SHAPE), f32(RNG, 5, 6), f32(RNG, 5, 2, 3)
    got = run_op("ScatterWeightedSum", {"x": x0, "w0": lr_blob(w0), "i": IDX.astype(np.int32), "x1": x1,
                 "w1": lr_blob(-0.1), "x2": x2, "w2": lr_blob(2.0)}, ["x"], device=device)
    want = rows(x0)
    for r in IDX:                     # Caffe2: every indexed row scaled once per occurrence, first ...
        want[r] *= w0
    for x, w in ((x1, -0.1), (x2, 2.0)):   # ... then every update added
        for k, r in enumerate(IDX):
            want[r] += w * x.reshape(5, 6)[k].astype(np.float64)
    assert_close(got, want.reshape(SHAPE))


@pytest.mark.parametrize("device", DEVICES)
def test_scatter_weighted_sum_equals_weighted_sum_on_unique_rows(device):
    x0, x1, idx = f32(RNG, *SHAPE), f32(RNG, 3, 2, 3), np.array([4, 1, 2])
    got = run_op("ScatterWeightedSum", {"x": x0, "a": lr_blob(0.9), "i": idx, "x1": x1, "b": lr_blob(-0.5)},
                 ["x"], device=device)
    dense = run_op("WeightedSum", [x0[idx], lr_blob(0.9), x1, lr_blob(-0.5)], 1, device=device)
    np.testing.assert_allclose(got[idx], dense, rtol=1e-6)
    np.testing.assert_array_equal(got[[0, 3]], x0[[0, 3]])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64])
def test_scatter_assign_last_wins(device, dtype):
    data = (RNG.standard_normal(SHAPE) * 10).astype(dtype)
    slices = (RNG.standard_normal((5, 2, 3)) * 10).astype(dtype)
    got = run_op("ScatterAssign", {"d": data, "i": IDX, "s": slices}, ["d"], device=device)
    want = data.copy()
    for k, r in enumerate(IDX):
        want[r] = slices[k]
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, want)


# --------------------------------------------------------------------------------------------- bad input
def test_bad_inputs():
    w, h = f32(RNG, *SHAPE), f32(RNG, *SHAPE)
    with pytest.raises(ShapeError, match=r"indices\[1\] = 5 is out of bounds for a table of 5 rows"):
        run_op("SparseAdagrad", {"w": w, "h": h, "i": np.array([0, 5]), "g": f32(RNG, 2, 6),
                                 "lr": lr_blob(-1)}, ["w", "h"])
    with pytest.raises(ShapeError, match="must hold len.indices. = 2 rows of param's row size 6"):
        run_op("SparseAdagrad", {"w": w, "h": h, "i": np.array([0, 1]), "g": f32(RNG, 2, 5),
                                 "lr": lr_blob(-1)}, ["w", "h"])
    with pytest.raises(DTypeError, match="indices must be int32 or int64"):
        run_op("ScatterAssign", {"w": w, "i": np.array([0.0]), "g": f32(RNG, 1, 6)}, ["w"])
    with pytest.raises(ShapeError, match="one value per row of param"):
        run_op("RowWiseSparseAdagrad", {"w": w, "h": f32(RNG, 4), "i": IDX, "g": grads_for(IDX, 1)[0],
                                        "lr": lr_blob(-1)}, ["w", "h"])
    with pytest.raises(ArgumentError, match="does not support decay"):
        run_op("SparseAdagrad", {"w": w, "h": h, "i": IDX, "g": grads_for(IDX, 1)[0], "lr": lr_blob(-1)},
               ["w", "h"], decay=0.5)
    with pytest.raises(ArityError, match="odd number of inputs"):
        run_op("ScatterWeightedSum", {"w": w, "a": lr_blob(1), "i": IDX, "g": grads_for(IDX, 1)[0],
                                      "b": lr_blob(1), "c": lr_blob(1)}, ["w"])


@pytest.mark.parametrize("op_type,inputs,outputs,message", [
    ("SparseAdagrad", ["w", "h", "i", "g", "lr"], ["w2", "h"], "must write input 0 .'w'. in place"),
    ("SparseAdam", ["w", "h", "v", "i", "g", "lr", "it"], ["w", "h", "v2"], "must write input 2"),
    ("SparseMomentumSGDUpdate", ["g", "h", "lr", "w", "i"], ["g", "h", "w2"], "must write input 3"),
    ("ScatterWeightedSum", ["w", "lr", "i", "g", "lr2"], ["w2"], "must write input 0"),
    ("ScatterWeightedSum", ["w", "lr", "i", "w", "lr2"], ["w"], "cannot write output 0 in place over input"),
    ("ScatterAssign", ["w", "i", "g"], ["w3"], "must write input 0"),
    ("RowWiseSparseAdagrad", ["w", "h", "i", "g", "lr"], ["w", "h2"], "must write input 1")])
def test_enforced_inplace(op_type, inputs, outputs, message):
    ws = workspace("cpu")
    for name in set(inputs):
        ws.feed(name, lr_blob(1.0))
    net = NetDef(name="n")
    net.op.append(make_op(op_type, inputs, outputs))
    with pytest.raises(ArgumentError, match=message):
        ws.create_net(net)


def test_reference_catches_parallel_duplicates(broken):
    # A SparseAdagrad that applies repeated indices "in parallel" (the last occurrence wins) must fail.
    def wrong(xp, w, h, i, g, lr, *, epsilon, weight_decay, decay):
        w2, h2, g2 = w.reshape(5, -1).copy(), h.reshape(5, -1).copy(), g.reshape(i.size, -1)
        r = i.ravel()
        h2[r] = h2[r] + g2 * g2
        w2[r] = w2[r] + lr.reshape(()) * g2 / (xp.sqrt(h2[r]) + epsilon)
        return w2.reshape(w.shape), h2.reshape(h.shape)

    test_sparse_adagrad_steps("cpu", IDX, "SparseAdagrad", 0.0)
    broken("SparseAdagrad", wrong)
    with pytest.raises(AssertionError):
        test_sparse_adagrad_steps("cpu", IDX, "SparseAdagrad", 0.0)
