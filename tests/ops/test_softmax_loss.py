"""The softmax losses (stepnet/ops/softmax_loss.py: SoftmaxWithLoss, SpatialSoftmaxWithLoss and their gradients)
against float64 loop references, their gradients against finite differences, Caffe2's gradient makers, and bad
inputs. The other losses (loss.py) are tested in test_loss.py."""
import math

import numpy as np
import pytest
from loss_helpers import (L4, check_gradient_catches_a_wrong_kernel, close, f32, grad_sig, labels, n_outputs, probs,
                          rng, static_net)

from stepnet.core.errors import ArgumentError, DTypeError, ShapeError
from stepnet.passes.shapes import infer_net
from stepnet.testing import DEVICES, check_gradient, run_op


# --------------------------------------------------------------------------------------------- references
def softmax_rows(rows):
    out = []
    for row in rows:
        m = max(row)
        e = [math.exp(v - m) for v in row]
        out.append([v / sum(e) for v in e])
    return out


def swl_ref(X, T, W=None, label_prob=0, axis=1, scale=1.0):
    """(P, loss) of SoftmaxWithLoss by loops over rows of the 2-D view."""
    n = int(np.prod(X.shape[:axis]))
    rows = X.astype(np.float64).reshape(n, -1).tolist()
    P = softmax_rows(rows)
    t = T.reshape(n, -1).tolist()
    w = [1.0] * n if W is None else W.reshape(-1).astype(np.float64).tolist()
    total = 0.0
    for i in range(n):
        if label_prob:
            li = -sum(t[i][j] * math.log(max(P[i][j], 1e-20)) for j in range(len(P[i])))
        else:
            li = -math.log(P[i][t[i][0]])
        total += w[i] * li
    loss = total * scale / sum(w) if sum(w) != 0 else 0.0
    return np.array(P).reshape(X.shape), np.array(loss)


def spatial_ref(X, T, W=None):
    N, C, H, Wd = X.shape
    P = np.zeros(X.shape)
    num = den = 0.0
    for i in range(N):
        for y in range(H):
            for x in range(Wd):
                p = softmax_rows([[float(X[i, c, y, x]) for c in range(C)]])[0]
                P[i, :, y, x] = p
                lab = int(T[i, y, x])
                if lab != -1:
                    w = 1.0 if W is None else float(W[i, y, x])
                    num += -math.log(max(p[lab], 1e-20)) * w
                    den += w
    return P, np.array(num / den if den else 0.0)


# --------------------------------------------------------------------------------------------- forward cases
X45, W4 = f32(4, 5), f32(4, lo=0.2, hi=2.0)
X3D = f32(2, 3, 4)
SWL = [  # (id, inputs, args)
    ("hard", [X45, L4], {}),
    ("hard-Nx1", [X45, L4.reshape(4, 1)], {}),
    ("weights", [X45, L4, W4], {}),
    ("scale", [X45, L4, W4], {"scale": 2.5}),
    ("zero-weights", [X45, L4, np.zeros(4, np.float32)], {}),
    ("axis2", [X3D, labels(6, 4, (2, 3))], {"axis": 2}),
    ("axis-1", [X3D, labels(6, 4, (2, 3, 1))], {"axis": -1}),
    ("axis1-3d", [X3D, labels(2, 12)], {}),
    ("prob", [X45, probs(4, 5)], {"label_prob": 1}),
    ("prob-weights", [X45, probs(4, 5), W4], {"label_prob": 1, "scale": 0.5}),
    ("wide-logits", [np.array([[80.0, -80.0, 0.0], [-50.0, 50.0, 49.0]], np.float32),
                     np.array([1, 2], np.int32)], {}),
    ("f64", [X45.astype(np.float64), L4], {}),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid,inputs,args", SWL, ids=[c[0] for c in SWL])
def test_softmax_with_loss(device, cid, inputs, args):
    P, loss = run_op("SoftmaxWithLoss", inputs, 2, device=device, **args)
    P_ref, loss_ref = swl_ref(*inputs, **args)
    assert P.dtype == loss.dtype == inputs[0].dtype and loss.shape == ()
    close(P, P_ref, 1e-6)
    close(loss, loss_ref, 1e-5)


SPATIAL_X, SPATIAL_T = f32(2, 3, 2, 3), rng.integers(-1, 3, size=(2, 2, 3)).astype(np.int32)
SPATIAL_W = f32(2, 2, 3, lo=0.2, hi=2.0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type,args", [("SoftmaxWithLoss", {"spatial": 1}),
                                          ("SpatialSoftmaxWithLoss", {})])
@pytest.mark.parametrize("weighted", [False, True])
def test_spatial_forms(device, op_type, args, weighted):
    inputs = [SPATIAL_X, SPATIAL_T] + ([SPATIAL_W] if weighted else [])
    P, loss = run_op(op_type, inputs, 2, device=device, **args)
    P_ref, loss_ref = spatial_ref(*inputs)
    close(P, P_ref, 1e-6)
    close(loss, loss_ref)
    # Caffe2's spatial forward ignores `scale` (its gradient applies it).
    close(run_op(op_type, inputs, 2, device=device, scale=3.0, **args)[1], loss_ref)


# --------------------------------------------------------------------------------------------- gradients
GRADS = [  # (id, op, inputs, outputs, outputs_with_grads, wrt, args)
    ("SWL", "SoftmaxWithLoss", [X45, L4], 2, [1], [0], {}),
    ("SWL-weights-scale", "SoftmaxWithLoss", [X45, L4, W4], 2, [1], [0], {"scale": 2.0}),
    ("SWL-axis2", "SoftmaxWithLoss", [X3D, labels(6, 4, (2, 3))], 2, [1], [0], {"axis": 2}),
    ("SWL-prob", "SoftmaxWithLoss", [X45, probs(4, 5)], 2, [1], [0], {"label_prob": 1}),
    ("SWL-prob-weights", "SoftmaxWithLoss", [X45, probs(4, 5), W4], 2, [1], [0], {"label_prob": 1}),
    ("SWL-spatial", "SoftmaxWithLoss", [SPATIAL_X, SPATIAL_T, SPATIAL_W], 2, [1], [0], {"spatial": 1}),
    ("SpatialSWL", "SpatialSoftmaxWithLoss", [SPATIAL_X, SPATIAL_T], 2, [1], [0], {}),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid,op_type,inputs,outputs,with_grads,wrt,args", GRADS, ids=[c[0] for c in GRADS])
def test_gradient(device, cid, op_type, inputs, outputs, with_grads, wrt, args):
    check_gradient(op_type, inputs, outputs=outputs, outputs_with_grads=with_grads, wrt=wrt, device=device,
                   **args)


def swl_grad_ref(X, T, W, P, dloss, label_prob=0, scale=1.0):
    """Caffe2's SoftmaxWithLossGradient by loops: (P - target) * w, scaled only when sum(w) > 0."""
    n, d = P.shape
    total = float(n) if W is None else float(W.astype(np.float64).sum())
    out = np.zeros((n, d))
    for i in range(n):
        w = 1.0 if W is None else float(W[i])
        for j in range(d):
            target = float(T[i, j]) if label_prob else float(j == int(T[i]))
            out[i, j] = (float(P[i, j]) - target) * w
    return out * (scale / total * float(dloss)) if total > 0 else out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("weights", [None, W4, np.array([1.0, -1.0, 0.5, -0.5], np.float32)],
                         ids=["none", "positive", "zero-sum"])
@pytest.mark.parametrize("label_prob", [0, 1])
def test_softmax_with_loss_gradient_op(device, weights, label_prob):
    """The gradient op itself, including Caffe2's unscaled result when the weights sum to zero."""
    T = probs(4, 5) if label_prob else L4
    P = run_op("SoftmaxWithLoss", [X45, T], 2, device=device, label_prob=label_prob)[0]
    dloss = np.array(0.7, np.float32)
    ins = [X45, T] + ([] if weights is None else [weights]) + [P, dloss]
    got = run_op("SoftmaxWithLossGradient", ins, device=device, label_prob=label_prob, scale=1.5)
    close(got, swl_grad_ref(X45, T, weights, P, 0.7, label_prob, 1.5), 1e-6)


MAKERS = [
    ("SoftmaxWithLoss", ["X", "T"], ["P", "loss"], ["loss"], {"scale": 2.0},
     [("SoftmaxWithLossGradient", ["X", "T", "P", "loss_grad"], ["X_grad"], ["scale"])]),
    ("SoftmaxWithLoss", ["X", "T", "W"], ["P", "loss"], ["loss"], {},
     [("SoftmaxWithLossGradient", ["X", "T", "W", "P", "loss_grad"], ["X_grad"], [])]),
    ("SpatialSoftmaxWithLoss", ["X", "T", "W"], ["P", "loss"], ["loss"], {},
     [("SpatialSoftmaxWithLossGradient", ["X", "T", "W", "P", "loss_grad"], ["X_grad"], [])]),
]


@pytest.mark.parametrize("op_type,ins,outs,wanted,args,expected", MAKERS,
                         ids=[m[0] + str(len(m[1])) for m in MAKERS])
def test_gradient_makers_emit_caffe2_ops(op_type, ins, outs, wanted, args, expected):
    ops, grads = grad_sig(op_type, ins, outs, wanted, **args)
    assert ops == expected
    assert grads["X"] == "X_grad"


# --------------------------------------------------------------------------------------------- bad input
BAD = [  # (id, op, inputs, args, error, match)
    ("SWL-label-range", "SoftmaxWithLoss", [X45, np.array([0, 1, 7, 2], np.int32)], {}, ShapeError,
     r"label 7 at position 2 is out of range: labels must be in \[0, 5\)"),
    ("SWL-negative-label", "SoftmaxWithLoss", [X45, np.array([0, -1, 1, 2], np.int32)], {}, ShapeError,
     r"label -1 at position 1"),
    ("SWL-int64", "SoftmaxWithLoss", [X45, L4.astype(np.int64)], {}, DTypeError, r"int32.*got int64.*Cast"),
    ("SWL-float-labels", "SoftmaxWithLoss", [X45, probs(4, 5)], {}, DTypeError, "set label_prob=1"),
    ("SWL-label-shape", "SoftmaxWithLoss", [X45, L4[:3]], {}, ShapeError,
     r"labels \(3,\) do not fit logits \(4, 5\): expected 4 labels"),
    ("SWL-weights", "SoftmaxWithLoss", [X45, L4, W4[:3]], {}, ShapeError,
     r"weights \(3,\) must hold one weight per example: 4"),
    ("SWL-weights-dtype", "SoftmaxWithLoss", [X45, L4, np.ones(4, np.int32)], {}, DTypeError, "weights"),
    ("SWL-prob-shape", "SoftmaxWithLoss", [X45, probs(4, 4)], {"label_prob": 1}, ShapeError,
     r"label probabilities \(4, 4\) must match logits \(4, 5\)"),
    ("SWL-prob-sum", "SoftmaxWithLoss", [X45, np.full((4, 5), 0.3, np.float32)], {"label_prob": 1},
     ShapeError, "row 0 sum to 1.5"),
    ("SWL-prob-negative", "SoftmaxWithLoss", [X45, probs(4, 5) - 0.5], {"label_prob": 1}, ShapeError,
     "non-negative"),
    ("SWL-scale", "SoftmaxWithLoss", [X45, L4], {"scale": -1.0}, ArgumentError, "scale must be >= 0"),
    ("SWL-order", "SoftmaxWithLoss", [X45, L4], {"order": "NHWC"}, ArgumentError, "only order 'NCHW'"),
    ("SWL-axis", "SoftmaxWithLoss", [X45, L4], {"axis": 2}, ArgumentError, "axis 2 is out of range"),
    ("SWL-int-logits", "SoftmaxWithLoss", [L4.reshape(2, 2), L4[:2]], {}, DTypeError,
     "logits must be a float"),
    ("spatial-shape", "SoftmaxWithLoss", [SPATIAL_X, SPATIAL_T[:, :1]], {"spatial": 1}, ShapeError,
     "labels N x H x W"),
    ("spatial-label", "SpatialSoftmaxWithLoss", [SPATIAL_X, np.full((2, 2, 3), 3, np.int32)], {}, ShapeError,
     r"label 3 at position 0 is out of range: labels must be in \[0, 3\) or -1"),
    ("spatial-label-prob", "SoftmaxWithLoss", [SPATIAL_X, SPATIAL_T], {"spatial": 1, "label_prob": 1},
     ArgumentError, "label_prob=1 cannot be used with spatial=1"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid,op_type,inputs,args,err,match", BAD, ids=[c[0] for c in BAD])
def test_bad_input(device, cid, op_type, inputs, args, err, match):
    with pytest.raises(err, match=match):
        run_op(op_type, inputs, n_outputs(op_type), device=device, **args)


STATIC = {"SWL-prob-sum", "SWL-prob-negative"}  # float values: known only at run time


@pytest.mark.parametrize("cid,op_type,inputs,args,err,match", [b for b in BAD if b[0] not in STATIC],
                         ids=[b[0] for b in BAD if b[0] not in STATIC])
def test_bad_input_caught_statically(cid, op_type, inputs, args, err, match):
    """Shape functions refuse the same inputs before anything runs (small int32 labels carry their values)."""
    net, specs = static_net(op_type, inputs, **args)
    with pytest.raises(err, match=match):
        infer_net(net, specs)


@pytest.mark.parametrize("device", DEVICES)
def test_gradient_op_checks_its_inputs(device):
    with pytest.raises(ShapeError, match="one value"):
        run_op("SoftmaxWithLossGradient", [X45, L4, X45, np.ones(2, np.float32)], device=device)


# ------------------------------------------------------------------------------------------- test the testers
@pytest.mark.parametrize("op_type,inputs,outputs,with_grads", [
    ("SoftmaxWithLossGradient", [X45, L4], 2, [1]),
])
def test_check_gradient_catches_a_wrong_gradient(op_type, inputs, outputs, with_grads, broken):
    check_gradient_catches_a_wrong_kernel(op_type, inputs, outputs, with_grads, broken)
