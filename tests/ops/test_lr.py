"""LearningRate: every policy against its formula at several iterations, on both devices, with the counter
on the device or (as Caffe2 keeps it) on the CPU; output dtype/shape; argument errors."""
import numpy as np
import pytest
from optim_steps import CPU, GPU, counter, workspace

from stepnet import NetDef
from stepnet.core.errors import ArgumentError, DTypeError
from stepnet.ops import REGISTRY
from stepnet.testing import DEVICES, make_op, run_op

ITERS = [0, 1, 2, 5, 9, 10, 11, 50, 99, 100, 101, 1000]


def warmup(start, n, it):
    return start + (1 - start) * it / n if it < n else 1.0


def alter(on, off, first, it):
    active = it % (on + off) < (on if first else off)
    return float(active) if first else float(not active)


def F(v):
    """A float argument as the op sees it: Argument.f is a float32."""
    return float(np.float32(v))


CASES = [  # (id, args, multiplier formula)
    ("fixed", dict(policy="fixed"), lambda it: 1.0),
    ("step", dict(policy="step", stepsize=10, gamma=0.5), lambda it: 0.5 ** (it // 10)),
    ("multistep", dict(policy="multistep", stepsizes=[5, 50, 100], gamma=0.1),
     lambda it: F(0.1) ** sum(it >= s for s in (5, 50, 100))),
    ("exp", dict(policy="exp", gamma=0.99), lambda it: F(0.99) ** it),
    ("inv", dict(policy="inv", gamma=0.01, power=0.75), lambda it: (1 + F(0.01) * it) ** -0.75),
    ("poly", dict(policy="poly", power=2.0, max_iter=1000), lambda it: (1 - it / 1000) ** 2),
    ("linearWarmup", dict(policy="linearWarmup", start_multiplier=0.1, num_iter=50),
     lambda it: warmup(F(0.1), 50, it)),
    ("constantWarmup", dict(policy="constantWarmup", multiplier=0.25, num_iter=10),
     lambda it: 0.25 if it < 10 else 1.0),
    ("constantWarmup-default", dict(policy="constantWarmup", num_iter=10),
     lambda it: 0.5 if it < 10 else 1.0),
    ("alter", dict(policy="alter", active_period=3, inactive_period=7), lambda it: alter(3, 7, True, it)),
    ("alter-inactive-first", dict(policy="alter", active_first=0, active_period=3, inactive_period=7),
     lambda it: alter(3, 7, False, it)),
    ("hill", dict(policy="hill", num_iter=10, start_multiplier=0.2, gamma=0.5, power=0.5, end_multiplier=0.3),
     lambda it: warmup(F(0.2), 10, it) if it < 10 else max(F(0.3), (1 + 0.5 * (it - 10)) ** -0.5)),
    ("composite", dict(policy="composite", sub_policy_num_iters=[10, 40], sub_policy_0_policy="fixed",
                       sub_policy_0_lr_scale=0.1, sub_policy_1_policy="step", sub_policy_1_stepsize=5,
                       sub_policy_1_gamma=0.5, sub_policy_1_lr_scale=2.0),
     lambda it: F(0.1) if it <= 10 else 2.0 * 0.5 ** (it // 5)),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,args,formula", CASES, ids=[c[0] for c in CASES])
def test_policy_formula(device, name, args, formula):
    for it in ITERS:
        got = run_op("LearningRate", [counter(it)], 1, device=device, base_lr=-0.05, **args)
        assert got.shape == () and got.dtype == np.float32
        np.testing.assert_allclose(got, F(-0.05) * formula(it), rtol=1e-6, atol=1e-12,
                                   err_msg=f"{name} at {it}")


@pytest.mark.parametrize("device", DEVICES)
def test_counter_on_the_host_and_iter_before_lr(device):
    # The layout caffe2.python.optimizer builds: the counter (CPU) is incremented before LearningRate runs on
    # the net's device, so the first run sees iter = 1.
    ws = workspace(device)
    ws.feed("iter", np.zeros(1, np.int64))
    net = NetDef(name="lr")
    if device != "cpu":
        net.device_option.CopyFrom(GPU)
    net.op.extend([make_op("Iter", ["iter"], ["iter"]),
                   make_op("LearningRate", ["iter"], ["lr"], base_lr=0.1, policy="step", stepsize=2,
                           gamma=0.1)])
    net.op[0].device_option.CopyFrom(CPU)
    lrs = []
    run = ws.create_net(net)
    for _ in range(5):
        run.run()
        lrs.append(float(ws.fetch("lr")))
    np.testing.assert_allclose(lrs, [0.1 * 0.1 ** (k // 2) for k in range(1, 6)], rtol=1e-6)


def test_bad_arguments():
    it = [counter(3)]
    with pytest.raises(ArgumentError, match="required argument 'base_lr' is missing"):
        run_op("LearningRate", it, 1, policy="fixed")
    with pytest.raises(ArgumentError, match="required argument 'policy' is missing"):
        run_op("LearningRate", it, 1, base_lr=0.1)
    with pytest.raises(ArgumentError, match="unknown policy 'stepp'.*did you mean step"):
        run_op("LearningRate", it, 1, base_lr=0.1, policy="stepp")
    with pytest.raises(ArgumentError, match="stepsize > 0"):
        run_op("LearningRate", it, 1, base_lr=0.1, policy="step", gamma=0.5)
    with pytest.raises(ArgumentError, match="cannot be a sub-policy of a composite"):
        run_op("LearningRate", it, 1, base_lr=0.1, policy="composite", sub_policy_num_iters=[3],
               sub_policy_0_policy="composite")
    with pytest.raises(ArgumentError, match="must be a float"):
        run_op("LearningRate", it, 1, base_lr=1, policy="fixed")  # an int base_lr: Caffe2 reads field f only
    with pytest.raises(DTypeError, match="iteration counter must be an int64"):
        run_op("LearningRate", [np.array([3], np.int32)], 1, base_lr=0.1, policy="fixed")


def test_not_differentiable_and_not_in_place():
    assert REGISTRY.get("LearningRate").gradient == "no_gradient"
    ws = workspace("cpu")
    ws.feed("it", counter(1))
    net = NetDef(name="n")
    net.op.append(make_op("LearningRate", ["it"], ["it"], base_lr=0.1, policy="fixed"))
    with pytest.raises(ArgumentError, match="cannot write output 0 in place"):
        ws.create_net(net)


def test_formula_check_catches_a_broken_schedule(broken):
    # A "step" without the floor (gamma^(iter/stepsize)) must fail the formula comparison.
    def wrong(xp, it, **a):
        value = int(np.asarray(it).reshape(-1)[0])
        return xp.asarray(np.float32(a["base_lr"] * a["gamma"] ** (value / a["stepsize"])))

    test_policy_formula("cpu", *CASES[1])
    broken("LearningRate", wrong)
    with pytest.raises(AssertionError):
        test_policy_formula("cpu", *CASES[1])
