"""Loss ops (stepnet/ops/loss.py) against float64 loop references, their gradients against finite differences,
Caffe2's gradient makers, and bad inputs. The softmax losses (softmax_loss.py) are tested in
test_softmax_loss.py, the row-wise losses (rowwise_loss.py) in test_rowwise_loss.py."""
import math

import numpy as np
import pytest
from loss_helpers import L4, close, f32, grad_sig, labels, n_outputs, probs, static_net

from stepnet.core.errors import ArgumentError, DTypeError, ShapeError
from stepnet.ops import REGISTRY
from stepnet.passes.shapes import infer_net
from stepnet.testing import DEVICES, check_gradient, run_op


# --------------------------------------------------------------------------------------------- references
def lce(X, lab):
    n, rows = (X.shape[0], X.reshape(X.shape[0], -1)) if X.ndim > 1 else (1, X.reshape(1, -1))
    return np.array([-math.log(max(float(rows[i, int(lab.reshape(-1)[i])]), 1e-20)) for i in range(n)])


def soft_ce(X, T):
    n = X.shape[0] if X.ndim > 1 else 1
    x, t = X.reshape(n, -1).astype(np.float64), T.reshape(n, -1).astype(np.float64)
    return np.array([-sum(t[i, j] * math.log(max(x[i, j], 1e-20)) for j in range(x.shape[1]))
                     for i in range(n)])


PR = probs(4, 5)
PR_ZERO = np.array([[0.0, 1.0], [0.5, 0.5]], np.float32)
ROWWISE = [  # (id, op, inputs, args, reference, tol)
    ("LabelCrossEntropy", "LabelCrossEntropy", [PR, L4], {}, lce, 1e-5),
    ("LabelCrossEntropy-Nx1", "LabelCrossEntropy", [PR, L4.reshape(4, 1)], {}, lce, 1e-5),
    ("LabelCrossEntropy-1d", "LabelCrossEntropy", [PR[0], np.array([3], np.int32)], {}, lce, 1e-5),
    ("LabelCrossEntropy-3d", "LabelCrossEntropy", [probs(2, 6).reshape(2, 3, 2), labels(2, 6)], {}, lce,
     1e-5),
    ("LabelCrossEntropy-clamp", "LabelCrossEntropy", [PR_ZERO, np.array([0, 1], np.int32)], {}, lce, 1e-5),
    ("CrossEntropy", "CrossEntropy", [PR, probs(4, 5)], {}, soft_ce, 1e-5),
    ("CrossEntropy-clamp", "CrossEntropy", [PR_ZERO, np.array([[0.5, 0.5], [1, 0]], np.float32)], {}, soft_ce,
     1e-5),
    ("AveragedLoss", "AveragedLoss", [f32(3, 4)], {},
     lambda x: np.array(sum(x.reshape(-1).tolist()) / x.size), 1e-6),
    ("AveragedLoss-empty", "AveragedLoss", [np.zeros((0, 3), np.float32)], {}, lambda x: np.array(0.0), 0),
    ("AveragedLoss-0d", "AveragedLoss", [np.float32(-1.5)], {}, lambda x: np.array(-1.5), 0),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid,op_type,inputs,args,ref,tol", ROWWISE, ids=[c[0] for c in ROWWISE])
def test_rowwise(device, cid, op_type, inputs, args, ref, tol):
    got = run_op(op_type, inputs, device=device, **args)
    assert got.dtype == np.asarray(inputs[0]).dtype
    close(got, ref(*inputs), tol)


# --------------------------------------------------------------------------------------------- gradients
GRADS = [  # (id, op, inputs, outputs, outputs_with_grads, wrt, args)
    ("LabelCrossEntropy", "LabelCrossEntropy", [PR, L4], 1, None, [0], {}),
    ("LabelCrossEntropy-1d", "LabelCrossEntropy", [PR[0], np.array([2], np.int32)], 1, None, [0], {}),
    ("CrossEntropy", "CrossEntropy", [PR, probs(4, 5)], 1, None, [0], {}),
    ("AveragedLoss", "AveragedLoss", [f32(3, 4)], 1, None, [0], {}),
    ("AveragedLoss-0d", "AveragedLoss", [np.float32(0.4)], 1, None, [0], {}),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid,op_type,inputs,outputs,with_grads,wrt,args", GRADS, ids=[c[0] for c in GRADS])
def test_gradient(device, cid, op_type, inputs, outputs, with_grads, wrt, args):
    check_gradient(op_type, inputs, outputs=outputs, outputs_with_grads=with_grads, wrt=wrt, device=device,
                   **args)


@pytest.mark.parametrize("device", DEVICES)
def test_label_cross_entropy_gradient_divides_by_the_clamp(device):
    """dX[i, label] = -dY / max(X, 1e-20), even where X is 0 (Caffe2's formula, not the true derivative)."""
    dY = np.array([2.0, 3.0], np.float32)
    got = run_op("LabelCrossEntropyGradient", [PR_ZERO, np.array([0, 1], np.int32), dY], device=device)
    close(got, np.array([[-2.0 / 1e-20, 0.0], [0.0, -3.0 / 0.5]]), 1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_label_cross_entropy_gradient_writes_only_the_label_entries(device):
    """Caffe2's kernel zero-fills dX and writes dX[i, label[i]] only: a NaN or inf elsewhere in X stays out."""
    rng = np.random.default_rng(2)
    X = rng.uniform(0.1, 1, (5, 7)).astype(np.float32)
    labels = np.array([3, 0, 6, 3, 2], np.int32)
    X[0, 1], X[2, 5], X[4, 4] = np.nan, np.inf, -np.inf
    dY = rng.uniform(-1, 1, 5).astype(np.float32)
    got = run_op("LabelCrossEntropyGradient", [X, labels, dY], device=device)
    want = np.zeros((5, 7))
    for i, k in enumerate(labels):
        want[i, k] = -float(dY[i]) / max(float(X[i, k]), 1e-20)
    close(got, want, 1e-6)



MAKERS = [
    ("LabelCrossEntropy", ["X", "T"], ["Y"], ["Y"], {},
     [("LabelCrossEntropyGradient", ["X", "T", "Y_grad"], ["X_grad"], [])]),
    ("CrossEntropy", ["X", "T"], ["Y"], ["Y"], {},
     [("CrossEntropyGradient", ["X", "T", "Y_grad"], ["X_grad"], [])]),
    ("AveragedLoss", ["X"], ["L"], ["L"], {}, [("AveragedLossGradient", ["X", "L_grad"], ["X_grad"], [])]),
]


@pytest.mark.parametrize("op_type,ins,outs,wanted,args,expected", MAKERS,
                         ids=[m[0] + str(len(m[1])) for m in MAKERS])
def test_gradient_makers_emit_caffe2_ops(op_type, ins, outs, wanted, args, expected):
    ops, grads = grad_sig(op_type, ins, outs, wanted, **args)
    assert ops == expected
    assert grads["X"] == "X_grad"


# --------------------------------------------------------------------------------------------- bad input
BAD = [  # (id, op, inputs, args, error, match)
    ("LCE-range", "LabelCrossEntropy", [PR, np.array([0, 5, 1, 1], np.int32)], {}, ShapeError,
     r"label 5 at position 1 is out of range"),
    ("LCE-dtype", "LabelCrossEntropy", [PR, L4.astype(np.float32)], {}, DTypeError, "int32 class indices"),
    ("LCE-shape", "LabelCrossEntropy", [PR, L4.reshape(2, 2)], {}, ShapeError,
     r"label \(2, 2\) does not fit X \(4, 5\): expected shape \(4,\) or \(4, 1\)"),
    ("CE-range", "CrossEntropy", [PR, np.full((4, 5), 2.0, np.float32)], {}, ShapeError,
     r"probabilities in \[0, 1\].*LabelCrossEntropy"),
    ("CE-shape", "CrossEntropy", [PR, probs(4, 4)], {}, ShapeError, r"expected shape \(4, 5\)"),
    ("AveragedLoss-int", "AveragedLoss", [L4], {}, DTypeError, "float"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid,op_type,inputs,args,err,match", BAD, ids=[c[0] for c in BAD])
def test_bad_input(device, cid, op_type, inputs, args, err, match):
    with pytest.raises(err, match=match):
        run_op(op_type, inputs, n_outputs(op_type), device=device, **args)


STATIC = {"CE-range"}  # float values: known only at run time


@pytest.mark.parametrize("cid,op_type,inputs,args,err,match", [b for b in BAD if b[0] not in STATIC],
                         ids=[b[0] for b in BAD if b[0] not in STATIC])
def test_bad_input_caught_statically(cid, op_type, inputs, args, err, match):
    """Shape functions refuse the same inputs before anything runs (small int32 labels carry their values)."""
    net, specs = static_net(op_type, inputs, **args)
    with pytest.raises(err, match=match):
        infer_net(net, specs)


@pytest.mark.parametrize("device", DEVICES)
def test_gradient_op_checks_its_inputs(device):
    with pytest.raises(ShapeError, match=r"dY \(3,\) must have one gradient per example"):
        run_op("LabelCrossEntropyGradient", [PR, L4, np.ones(3, np.float32)], device=device)


def test_in_place_refused_as_in_caffe2():
    with pytest.raises(ArgumentError, match="in place"):
        run_op("LabelCrossEntropy", {"x": PR, "t": L4}, ["x"])


# ------------------------------------------------------------------------------------------- test the testers
def test_reference_comparison_catches_a_wrong_kernel(broken):
    close(run_op("LabelCrossEntropy", [PR, L4]), lce(PR, L4), 1e-5)
    schema = REGISTRY.get("LabelCrossEntropy")
    broken("LabelCrossEntropy", lambda xp, X, label: schema.kernel(xp, X, label) * 1.001)
    with pytest.raises(AssertionError):
        close(run_op("LabelCrossEntropy", [PR, L4]), lce(PR, L4), 1e-5)
