"""Shared by test_loss.py, test_softmax_loss.py and test_rowwise_loss.py: the data builders, the comparison, the
gradient makers' signature, the labels L4, the one-op nets of the static bad-input checks, and the check that
check_gradient catches a wrong gradient kernel."""
import numpy as np
import pytest

from stepnet.passes.gradients import backward_ops
from stepnet.ops import REGISTRY
from stepnet.io.proto import NetDef
from stepnet.core.spec import TensorSpec
from stepnet.testing import check_gradient, make_op

rng = np.random.default_rng(7)


def f32(*shape, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def probs(n, d, dtype=np.float32):
    p = rng.uniform(0.05, 1.0, size=(n, d))
    return (p / p.sum(axis=1, keepdims=True)).astype(dtype)


def labels(n, d, shape=None):
    return rng.integers(0, d, size=shape or (n,)).astype(np.int32)


def close(got, want, tol=1e-5):
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)


def grad_sig(op_type, inputs, outputs, wanted, **args):
    ops, grads = backward_ops([make_op(op_type, inputs, outputs, **args)], {o: o + "_grad" for o in wanted})
    return [(o.type, list(o.input), list(o.output), sorted(a.name for a in o.arg)) for o in ops], grads


L4 = labels(4, 5)


def n_outputs(op_type):
    """The softmax losses give (P, loss), the other losses one output."""
    return 2 if "SoftmaxWithLoss" in op_type else 1


def static_net(op_type, inputs, **args):
    """A net of the one op over inputs in0, in1, ... and the specs of those inputs, for infer_net."""
    names = {f"in{i}": v for i, v in enumerate(inputs)}
    net = NetDef(name="static")
    outs = ["o0", "o1"][:n_outputs(op_type)]
    net.op.add().CopyFrom(make_op(op_type, list(names), outs, **args))
    return net, {n: TensorSpec.of(np.asarray(v)) for n, v in names.items()}


def check_gradient_catches_a_wrong_kernel(op_type, inputs, outputs, with_grads, broken):
    """check_gradient passes the forward op of gradient op `op_type`, and fails once that gradient kernel's
    results are 10 % off."""
    schema = REGISTRY.get(op_type)
    forward = op_type[:-len("Gradient")]
    check_gradient(forward, inputs, outputs=outputs, outputs_with_grads=with_grads, wrt=[0])

    def wrong(xp, *args, **kw):
        out = schema.kernel(xp, *args, **kw)
        return tuple(o * 1.1 for o in out) if isinstance(out, tuple) else out * 1.1
    broken(op_type, wrong)
    with pytest.raises(AssertionError, match="gradient of input 0"):
        check_gradient(forward, inputs, outputs=outputs, outputs_with_grads=with_grads, wrt=[0])
