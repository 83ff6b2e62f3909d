"""RecurrentNetworkGradient on hand-written step nets and backward step nets (no backward pass involved)
against numpy BPTT loops: state gradients through links, `_all` and `_last` output gradients, per-step
parameter gradients (summed and, for an FCGradient, deferred to one GEMM), initial-state gradients."""
import numpy as np
import pytest

from stepnet import Workspace
from stepnet.io.proto import NetDef, OperatorDef, make_argument
from stepnet.testing import make_op

F = np.float32


def fc_tanh_op(scale_dw: bool) -> tuple[OperatorDef, OperatorDef]:
    """h_t = tanh(FC(h_{t-1}, W, b) + x_t) as a RecurrentNetwork and its gradient op, both hand-written.
    scale_dw: the backward net also reads W's per-step gradient (so it cannot be deferred)."""
    step = NetDef(name="step", op=[make_op("FC", ["h_prev", "W", "b"], ["pre"], axis=2),
                                   make_op("Sum", ["pre", "input_t"], ["pre"]),
                                   make_op("Tanh", ["pre"], ["h_t"])],
                  external_input=["input_t", "h_prev", "W", "b"], external_output=["h_t"])
    back = [make_op("TanhGradient", ["h_t", "h_t_grad"], ["pre_grad"]),
            make_op("FCGradient", ["h_prev", "W", "pre_grad"], ["W_grad", "b_grad", "h_prev_grad"], axis=2),
            make_op("Copy", ["pre_grad"], ["input_t_grad"])]
    if scale_dw:
        back.append(make_op("Scale", ["W_grad"], ["W_grad_half"], scale=0.5))
    backward = NetDef(name="back", op=back, external_input=["h_t", "h_t_grad", "h_prev", "W"])
    args = dict(step_net=step, backward_step_net=backward, recurrent_states=["h_states"],
                initial_recurrent_state_ids=[1], link_internal=["h_prev", "h_t", "input_t"],
                link_external=["h_states", "h_states", "x"], link_offset=[0, 1, 0],
                alias_src=["h_states", "h_states"], alias_dst=["h_all", "h_last"], alias_offset=[1, -1],
                param=[2, 3], param_grads=["W_grad", "b_grad"], outputs_with_grads=[0, 1],
                backward_link_internal=["h_t_grad", "h_prev_grad", "input_t_grad"],
                backward_link_external=["h_states_grad", "h_states_grad", "x_grad"],
                backward_link_offset=[1, 0, 0], timestep="timestep")
    fwd = OperatorDef(type="RecurrentNetwork", input=["x", "h0", "W", "b"], output=["h_all", "h_last", "ws"],
                      arg=[make_argument(k, v) for k, v in args.items()])
    grad = OperatorDef(type="RecurrentNetworkGradient",
                       input=["h_all_grad", "h_last_grad", "x", "h0", "W", "b", "h_all", "h_last", "ws"],
                       output=["x_grad", "W_grad", "b_grad", "h0_grad"], arg=list(fwd.arg))
    return fwd, grad


def bptt(x, h0, W, b, dall, dlast):
    """The same recurrence and its gradients, in float64 loops over timesteps."""
    T = x.shape[0]
    hs = [h0.astype(np.float64)]
    for t in range(T):
        hs.append(np.tanh(hs[-1] @ W.T + b + x[t]))
    dW, db, dx = np.zeros(W.shape), np.zeros(b.shape), np.zeros(x.shape)
    carry = dlast[0].astype(np.float64)
    for t in reversed(range(T)):
        dh = dall[t] + carry
        dpre = dh * (1 - hs[t + 1] ** 2)
        dW += dpre.T @ hs[t]
        db += dpre.sum(axis=0)
        dx[t] = dpre
        carry = dpre @ W
    return np.stack(hs[1:]), dx, dW, db, carry


@pytest.mark.parametrize("scale_dw", [False, True])
@pytest.mark.parametrize("T", [1, 4])
def test_fc_tanh_gradients_match_bptt(T, scale_dw):
    rng = np.random.default_rng(T)
    N, D = 3, 4
    v = dict(x=rng.uniform(-1, 1, (T, N, D)), h0=rng.uniform(-1, 1, (N, D)), W=rng.uniform(-.5, .5, (D, D)),
             b=rng.uniform(-.5, .5, D), h_all_grad=rng.standard_normal((T, N, D)),
             h_last_grad=rng.standard_normal((1, N, D)))
    fwd, grad = fc_tanh_op(scale_dw)
    ws = Workspace()
    for name, value in v.items():
        ws.feed(name, value.astype(F))
    ws.run_operator_once(fwd)
    ws.run_operator_once(grad)
    ref = bptt(*(v[k] for k in ("x", "h0", "W", "b", "h_all_grad", "h_last_grad")))
    for name, expected in zip(("h_all", "x_grad", "W_grad", "b_grad", "h0_grad"), ref):
        np.testing.assert_allclose(ws.fetch(name), expected, rtol=2e-5, atol=2e-5, err_msg=name)
    back = ws.get_blob("ws").value.steps[0]
    types = [o.type for name in back.nets() for o in back.net(name).netdef.op]
    assert ("FCGradient" in types) == scale_dw     # deferred to one GEMM unless another op reads the per-step dW
    ws.run_operator_once(fwd)                      # a second run refills the same gradient buffers
    ws.run_operator_once(grad)
    np.testing.assert_allclose(ws.fetch("W_grad"), ref[2], rtol=2e-5, atol=2e-5)


def test_bptt_reference_catches_a_wrong_fc_gradient(broken):
    from stepnet.ops import REGISTRY
    kernel = REGISTRY.get("FCGradient").kernel
    broken("FCGradient", lambda xp, *a, **k: tuple(o * 1.01 for o in kernel(xp, *a, **k)))
    with pytest.raises(AssertionError, match="Not equal to tolerance"):
        test_fc_tanh_gradients_match_bptt(4, True)
