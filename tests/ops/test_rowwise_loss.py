"""Row-wise losses and similarities (stepnet/ops/rowwise_loss.py: SigmoidCrossEntropyWithLogits and its
weighted form, SquaredL2Distance, L1Distance, DotProduct, CosineSimilarity, MakeTwoClass) against float64
loop references on every device, their gradients against finite differences, Caffe2's gradient makers, bad
inputs (also caught statically), and broken kernels caught."""
import math

import numpy as np
import pytest
from loss_helpers import (check_gradient_catches_a_wrong_kernel, close, f32, grad_sig, labels, n_outputs,
                          static_net)

from stepnet.core.errors import ArgumentError, DTypeError, ShapeError
from stepnet.passes.shapes import infer_net
from stepnet.testing import DEVICES, check_gradient, run_op


# --------------------------------------------------------------------------------------------- references
def rows_of(X):
    n = X.shape[0] if X.ndim else 1
    return n, X.astype(np.float64).reshape(n, -1).tolist() if X.size else [[] for _ in range(n)]

def pair_ref(fn):
    def ref(X, Y):
        n, xs = rows_of(X)
        _, ys = rows_of(Y)
        return np.array([fn(xs[i], ys[i]) for i in range(n)])
    return ref

def cosine(x, y):
    xx, yy = sum(a * a for a in x), sum(b * b for b in y)
    return sum(a * b for a, b in zip(x, y, strict=True)) / math.sqrt(max(xx, 1e-12) * max(yy, 1e-12))

def sigmoid_xent_ref(mode):
    """-mean over the last axis of the log-likelihood, written with p = sigmoid(l) (moderate logits only)."""
    def term(l, t):
        p = 1.0 / (1.0 + math.exp(-l))
        if mode == "log_D_trick":
            return (2 * t - 1) * math.log(p)
        if mode == "unjoined_lr_loss":
            return t * math.log(p) + (1 - 2 * t) * math.log(1 - p)
        return t * math.log(p) + (1 - t) * math.log(1 - p)

    def ref(L, T, W=None):
        W = np.ones_like(L) if W is None else W
        flat = [np.atleast_1d(a).reshape(-1, np.atleast_1d(a).shape[-1]).tolist() for a in (L, T, W)]
        out = [-sum(term(lv, tv) * wv for lv, tv, wv in zip(*row, strict=True)) / len(row[0])
               for row in zip(*flat, strict=True)]
        return np.array(out).reshape(L.shape[:-1])
    return ref


# --------------------------------------------------------------------------------------------- forward cases
X45, L4 = f32(4, 5), labels(4, 5)
ROWWISE = [  # (id, op, inputs, args, reference, tol)
    ("MakeTwoClass", "MakeTwoClass", [f32(2, 3, lo=0, hi=1)], {},
     lambda x: np.array([[1 - v, v] for v in x.reshape(-1).tolist()]).reshape(x.shape + (2,)), 1e-7),
    ("SigmoidXent", "SigmoidCrossEntropyWithLogits", [f32(3, 4), f32(3, 4, lo=0, hi=1)], {},
     sigmoid_xent_ref(""), 1e-5),
    ("SigmoidXent-logD", "SigmoidCrossEntropyWithLogits", [f32(3, 4), f32(3, 4, lo=0, hi=1)],
     {"log_D_trick": True}, sigmoid_xent_ref("log_D_trick"), 1e-5),
    ("SigmoidXent-unjoined", "SigmoidCrossEntropyWithLogits", [f32(3, 4), f32(3, 4, lo=0, hi=1)],
     {"unjoined_lr_loss": True}, sigmoid_xent_ref("unjoined_lr_loss"), 1e-5),
    ("SigmoidXent-3d", "SigmoidCrossEntropyWithLogits", [f32(2, 2, 3), f32(2, 2, 3, lo=0, hi=1)], {},
     sigmoid_xent_ref(""), 1e-5),
    ("SigmoidXent-1d", "SigmoidCrossEntropyWithLogits", [f32(5), f32(5, lo=0, hi=1)], {},
     sigmoid_xent_ref(""), 1e-5),
    ("SigmoidXent-0d", "SigmoidCrossEntropyWithLogits", [np.float32(0.7), np.float32(0.25)], {},
     sigmoid_xent_ref(""), 1e-6),
    ("MakeTwoClass-0d", "MakeTwoClass", [np.float32(0.3)], {}, lambda x: np.array([0.7, 0.3]), 1e-7),
    ("SigmoidXent-wide", "SigmoidCrossEntropyWithLogits",
     [np.array([[-100.0, 100.0, 30.0]], np.float32), np.array([[0.0, 1.0, 0.5]], np.float32)], {},
     lambda L, T: np.array([sum(max(l, 0) - l * t + math.log1p(math.exp(-abs(l)))
                                for l, t in zip(L[0].tolist(), T[0].tolist(), strict=True)) / 3]), 1e-5),
    ("WeightedSigmoidXent", "WeightedSigmoidCrossEntropyWithLogits",
     [f32(3, 4), f32(3, 4, lo=0, hi=1), f32(3, 4, lo=0, hi=2)], {}, sigmoid_xent_ref(""), 1e-5),
    ("SquaredL2Distance", "SquaredL2Distance", [f32(4, 3), f32(4, 3)], {},
     pair_ref(lambda x, y: 0.5 * sum((a - b) ** 2 for a, b in zip(x, y, strict=True))), 1e-5),
    ("SquaredL2Distance-3d", "SquaredL2Distance", [f32(2, 3, 2), f32(2, 3, 2)], {},
     pair_ref(lambda x, y: 0.5 * sum((a - b) ** 2 for a, b in zip(x, y, strict=True))), 1e-5),
    ("SquaredL2Distance-0d", "SquaredL2Distance", [np.float32(3.0), np.float32(1.0)], {},
     lambda x, y: np.array([2.0]), 1e-6),
    ("L1Distance", "L1Distance", [f32(4, 3), f32(4, 3)], {},
     pair_ref(lambda x, y: sum(abs(a - b) for a, b in zip(x, y, strict=True))), 1e-5),
    ("L1Distance-1d", "L1Distance", [f32(5), f32(5)], {}, pair_ref(lambda x, y: abs(x[0] - y[0])), 1e-6),
    ("DotProduct", "DotProduct", [f32(4, 3), f32(4, 3)], {},
     pair_ref(lambda x, y: sum(a * b for a, b in zip(x, y, strict=True))), 1e-5),
    ("DotProduct-empty", "DotProduct", [np.zeros((3, 0), np.float32)] * 2, {}, lambda x, y: np.zeros(0), 0),
    ("CosineSimilarity", "CosineSimilarity", [f32(4, 3), f32(4, 3)], {}, pair_ref(cosine), 1e-5),
    ("CosineSimilarity-zero-row", "CosineSimilarity", [np.array([[0.0, 0.0], [1.0, 2.0]], np.float32),
                                                       np.array([[1.0, 1.0], [2.0, -1.0]], np.float32)], {},
     pair_ref(cosine), 1e-6),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid,op_type,inputs,args,ref,tol", ROWWISE, ids=[c[0] for c in ROWWISE])
def test_rowwise(device, cid, op_type, inputs, args, ref, tol):
    got = run_op(op_type, inputs, device=device, **args)
    assert got.dtype == np.asarray(inputs[0]).dtype
    close(got, ref(*inputs), tol)


# --------------------------------------------------------------------------------------------- gradients
GRADS = [  # (id, op, inputs, outputs, outputs_with_grads, wrt, args)
    ("MakeTwoClass", "MakeTwoClass", [f32(2, 3, lo=0.1, hi=0.9)], 1, None, [0], {}),
    ("MakeTwoClass-0d", "MakeTwoClass", [np.float32(0.4)], 1, None, [0], {}),
    ("SigmoidXent-0d", "SigmoidCrossEntropyWithLogits", [np.float32(-0.4), np.float32(0.3)], 1, None, [0],
     {}),
    ("SigmoidXent-1d", "SigmoidCrossEntropyWithLogits", [f32(5), f32(5, lo=0, hi=1)], 1, None, [0], {}),
    ("SigmoidXent", "SigmoidCrossEntropyWithLogits", [f32(3, 4), f32(3, 4, lo=0, hi=1)], 1, None, [0], {}),
    ("SigmoidXent-logD", "SigmoidCrossEntropyWithLogits", [f32(3, 4), f32(3, 4, lo=0, hi=1)], 1, None, [0],
     {"log_D_trick": True}),
    ("SigmoidXent-unjoined", "SigmoidCrossEntropyWithLogits", [f32(2, 3, 2), f32(2, 3, 2, lo=0, hi=1)], 1,
     None, [0], {"unjoined_lr_loss": True}),
    ("WeightedSigmoidXent", "WeightedSigmoidCrossEntropyWithLogits",
     [f32(3, 4), f32(3, 4, lo=0, hi=1), f32(3, 4, lo=0, hi=2)], 1, None, [0], {}),
    ("SquaredL2Distance", "SquaredL2Distance", [f32(4, 3), f32(4, 3)], 1, None, [0, 1], {}),
    ("SquaredL2Distance-0d", "SquaredL2Distance", [np.float32(0.5), np.float32(2.0)], 1, None, [0, 1], {}),
    ("L1Distance", "L1Distance", [f32(4, 3, lo=0.1, hi=1), f32(4, 3, lo=-1, hi=-0.1)], 1, None, [0, 1], {}),
    ("DotProduct", "DotProduct", [f32(4, 3), f32(4, 3)], 1, None, [0, 1], {}),
    ("CosineSimilarity", "CosineSimilarity", [f32(4, 3), f32(4, 3)], 1, None, [0, 1], {}),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid,op_type,inputs,outputs,with_grads,wrt,args", GRADS, ids=[c[0] for c in GRADS])
def test_gradient(device, cid, op_type, inputs, outputs, with_grads, wrt, args):
    check_gradient(op_type, inputs, outputs=outputs, outputs_with_grads=with_grads, wrt=wrt, device=device,
                   **args)


@pytest.mark.parametrize("device", DEVICES)
def test_l1_distance_gradient_dead_zone(device):
    X = np.array([[1.0, 2.0, 3.0]], np.float32)
    Y = np.array([[1.0, 3.0, 2.0]], np.float32)
    dX, dY = run_op("L1DistanceGradient", [X, Y, np.array([2.0], np.float32)], 2, device=device)
    close(dX, [[0.0, -2.0, 2.0]], 0)
    close(dY, [[0.0, 2.0, -2.0]], 0)


def pair_gradient_ref(op_type, X, Y, dZ):
    """(dX, dY) of the pair ops by their definitions, row by row in Python floats."""
    n, xs = rows_of(X)
    _, ys = rows_of(Y)
    dx, dy = [], []
    for x, y, g in zip(xs, ys, dZ.astype(np.float64).tolist(), strict=True):
        if op_type == "SquaredL2DistanceGradient":      # z = |x - y|^2 / 2
            gx = [g * (a - b) for a, b in zip(x, y, strict=True)]
            gy = [-v for v in gx]
        elif op_type == "DotProductGradient":           # z = x . y
            gx, gy = [g * b for b in y], [g * a for a in x]
        else:                                           # z = x . y / (|x| |y|)
            xx, yy = sum(a * a for a in x), sum(b * b for b in y)
            xy = sum(a * b for a, b in zip(x, y, strict=True))
            nx, ny = math.sqrt(xx), math.sqrt(yy)
            gx = [g * (b / (nx * ny) - xy * a / (nx ** 3 * ny)) for a, b in zip(x, y, strict=True)]
            gy = [g * (a / (nx * ny) - xy * b / (ny ** 3 * nx)) for a, b in zip(x, y, strict=True)]
        dx.append(gx)
        dy.append(gy)
    return np.array(dx).reshape(X.shape), np.array(dy).reshape(Y.shape)


def check_pair_gradient(op_type, device):
    X, Y, dZ = f32(4, 3), f32(4, 3), f32(4)
    dX, dY = run_op(op_type, [X, Y, dZ], 2, device=device)
    want_x, want_y = pair_gradient_ref(op_type, X, Y, dZ)
    assert dX.dtype == dY.dtype == np.float32
    close(dX, want_x, 1e-5)
    close(dY, want_y, 1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type", ["SquaredL2DistanceGradient", "DotProductGradient", "CosineSimilarityGradient"])
def test_pair_gradient_kernels_against_their_definitions(op_type, device):
    check_pair_gradient(op_type, device)


@pytest.mark.parametrize("op_type", ["DotProductGradient", "CosineSimilarityGradient"])
def test_the_pair_gradient_check_catches_swapped_outputs(op_type, broken):
    check_pair_gradient(op_type, "cpu")
    broken(op_type, lambda xp, X, Y, dZ: (Y * dZ[:, None], Y * dZ[:, None]))   # dY taken as dX
    with pytest.raises(AssertionError):
        check_pair_gradient(op_type, "cpu")


MAKERS = [
    ("MakeTwoClass", ["X"], ["Y"], ["Y"], {}, [("MakeTwoClassGradient", ["Y_grad"], ["X_grad"], [])]),
    ("SigmoidCrossEntropyWithLogits", ["X", "T"], ["Y"], ["Y"], {"log_D_trick": True},
     [("SigmoidCrossEntropyWithLogitsGradient", ["Y_grad", "X", "T"], ["X_grad"], ["log_D_trick"])]),
    ("WeightedSigmoidCrossEntropyWithLogits", ["X", "T", "W"], ["Y"], ["Y"], {},
     [("WeightedSigmoidCrossEntropyWithLogitsGradient", ["Y_grad", "X", "T", "W"], ["X_grad"], [])]),
] + [(t, ["X", "Y"], ["Z"], ["Z"], {}, [(t + "Gradient", ["X", "Y", "Z_grad"], ["X_grad", "Y_grad"], [])])
     for t in ("SquaredL2Distance", "L1Distance", "DotProduct", "CosineSimilarity")]


@pytest.mark.parametrize("op_type,ins,outs,wanted,args,expected", MAKERS,
                         ids=[m[0] + str(len(m[1])) for m in MAKERS])
def test_gradient_makers_emit_caffe2_ops(op_type, ins, outs, wanted, args, expected):
    ops, grads = grad_sig(op_type, ins, outs, wanted, **args)
    assert ops == expected
    assert grads["X"] == "X_grad"


# --------------------------------------------------------------------------------------------- bad input
BAD = [  # (id, op, inputs, args, error, match)
    ("Sigmoid-args", "SigmoidCrossEntropyWithLogits", [X45, X45],
     {"log_D_trick": True, "unjoined_lr_loss": True}, ArgumentError, "cannot both be set"),
    ("Sigmoid-shape", "SigmoidCrossEntropyWithLogits", [X45, X45[:2]], {}, ShapeError,
     r"logits \(4, 5\) and targets \(2, 5\)"),
    ("Weighted-shape", "WeightedSigmoidCrossEntropyWithLogits", [X45, X45, X45[:, :2]], {}, ShapeError,
     r"weights \(4, 2\)"),
    ("L2-shape", "SquaredL2Distance", [X45, X45.T], {}, ShapeError, r"X \(4, 5\) and Y \(5, 4\)"),
    ("Dot-dtype", "DotProduct", [L4, L4], {}, DTypeError, "X must be a float tensor, got int32"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid,op_type,inputs,args,err,match", BAD, ids=[c[0] for c in BAD])
def test_bad_input(device, cid, op_type, inputs, args, err, match):
    with pytest.raises(err, match=match):
        run_op(op_type, inputs, n_outputs(op_type), device=device, **args)


@pytest.mark.parametrize("cid,op_type,inputs,args,err,match", BAD, ids=[b[0] for b in BAD])
def test_bad_input_caught_statically(cid, op_type, inputs, args, err, match):
    """Shape functions refuse the same inputs before anything runs."""
    net, specs = static_net(op_type, inputs, **args)
    with pytest.raises(err, match=match):
        infer_net(net, specs)


@pytest.mark.parametrize("device", DEVICES)
def test_gradient_op_checks_its_inputs(device):
    with pytest.raises(ShapeError, match="size 2"):
        run_op("MakeTwoClassGradient", [np.ones((2, 3), np.float32)], device=device)


# ------------------------------------------------------------------------------------------- test the testers
@pytest.mark.parametrize("cid, wrong", [
    ("DotProduct", lambda xp, X, Y: (X * X).sum(axis=1)),                          # X with itself
    ("CosineSimilarity", lambda xp, X, Y: (X * Y).sum(axis=1)),                    # not normalised
    ("SquaredL2Distance", lambda xp, X, Y: ((X - Y) ** 2).sum(axis=1)),            # without the 1/2
    ("L1Distance", lambda xp, X, Y: xp.abs((X - Y).sum(axis=1))),                  # |sum| for sum |.|
    ("MakeTwoClass", lambda xp, X: xp.stack([X, 1 - X], axis=-1)),                 # (p, 1 - p)
    ("SigmoidXent", lambda xp, L, T, **a: -(T * L).mean(axis=-1)),                 # no log-sigmoid
])
def test_reference_comparison_catches_wrong_kernels(cid, wrong, broken):
    _, op_type, inputs, args, ref, tol = ROWWISE[[r[0] for r in ROWWISE].index(cid)]
    close(run_op(op_type, inputs, **args), ref(*inputs), tol)     # the real kernel passes ...
    broken(op_type, wrong)
    with pytest.raises(AssertionError):                           # ... the wrong one does not
        close(run_op(op_type, inputs, **args), ref(*inputs), tol)


@pytest.mark.parametrize("op_type,inputs,outputs,with_grads", [
    ("SquaredL2DistanceGradient", [f32(4, 3), f32(4, 3)], 1, None),
])
def test_check_gradient_catches_a_wrong_gradient(op_type, inputs, outputs, with_grads, broken):
    check_gradient_catches_a_wrong_kernel(op_type, inputs, outputs, with_grads, broken)
