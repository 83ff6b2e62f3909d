"""RecurrentNetwork's step-net rewrites (stepnet.graph.step_nets): what they make of a step net, and that
neither they nor running the ops change the nets a model holds."""
import dataclasses

import numpy as np

from stepnet import Workspace
from stepnet.graph import step_nets as sn
from stepnet.io.proto import NetDef, OperatorDef, argument_value, make_argument
from stepnet.testing import make_op

from .test_recurrent import rnn_op, sum_mul_step
from .test_lstm_layer import build, data, run

REC = sn.Recurrence("timestep", (sn.Link("o_prev", "o_states", 0, 1), sn.Link("o_t", "o_states", 1, 1),
                                 sn.Link("input_t", "x", 0, 2)))


def args(op) -> dict:
    return {a.name: argument_value(a) for a in op.arg}


def test_forward_rewrite_views_links_first_and_declares_them():
    step = sum_mul_step()
    step.type = "rnn"
    before = step.SerializeToString()
    out = sn.run(sn.FORWARD, sn.StepNets(step), REC)
    assert step.SerializeToString() == before
    links = out.step.op[0]
    assert links.type == "rnn_internal_apply_links"
    assert list(links.input) == ["timestep", "o_states", "o_states", "x"]
    assert list(links.output) == ["o_prev", "o_t", "input_t"]
    assert args(links) == {"offsets": [0, 1, 0], "windows": [1, 1, 2], "keep": [0, 0, 0]}
    assert [o.type for o in out.step.op[1:]] == ["Sum", "Mul"] and out.step.type == "async_simple"
    owning = sn.run(sn.FORWARD, sn.StepNets(step), dataclasses.replace(REC, owned=("o_states",)))
    assert args(owning.step.op[0])["keep"] == [1, 1, 0]      # the links into the op's own state tensor
    assert list(out.step.external_input) == ["input_t", "o_prev", "timestep", "o_states", "o_t", "x"]
    assert out.backward is None and out.local == ()


def fc_backward(dw_reused: bool) -> NetDef:
    """A backward step net with one FCGradient writing the per-step W and b gradients (and dX)."""
    ops = [make_op("FCGradient", ["h", "W", "dy"], ["W_grad", "b_grad", "h_grad"])]
    if dw_reused:
        ops.append(make_op("Scale", ["W_grad"], ["W_grad_scaled"], scale=2.0))
    return NetDef(name="back", op=ops, external_input=["h", "W", "dy"])


H_LINK = (sn.Link("h", "h_states", 0, 1),)


def backward(net: NetDef, links=H_LINK) -> sn.StepNets:
    rec = sn.Recurrence("timestep", tuple(links), (),
                        (sn.ParamGradient("W_grad", "W_grad"), sn.ParamGradient("b_grad", "b_grad")),
                        (("o_all_grad", "o_states_grad"),), "x")
    return sn.run(sn.BACKWARD, sn.StepNets(NetDef(name="step"), net), rec)


H_LINKS = (sn.Link("h", "h_states", 0, 1), sn.Link("h_next", "h_states", 1, 1), sn.Link("dy", "x_grad", 0, 1))


def test_weight_gradients_from_the_linked_tensors_rows_when_they_hold_every_step():
    """X and dY views of window-1 links whose tensors nothing else in the backward step writes: dX alone per
    step, and the GEMM after the loop reads rows [offset, offset + T) of those tensors (no copies)."""
    out = backward(fc_backward(dw_reused=False), H_LINKS)
    step_op = out.backward.op[-1]
    assert step_op.type == "rnn_internal_fc_input_gradient"
    assert list(step_op.input) == ["h", "W", "dy"] and list(step_op.output) == ["h_grad"]
    (gemm,) = out.weight_gradients.op
    assert gemm.type == "rnn_internal_fc_weight_gradient_linked"
    assert list(gemm.input) == ["x", "h_states", "x_grad", "W_grad", "b_grad"]
    assert args(gemm) == {"x_offset": 0, "dy_offset": 0}
    assert "W_grad_rnn_x" not in out.backward.external_input


def test_weight_gradient_rows_are_copied_where_the_linked_tensors_do_not_hold_them():
    fc = make_op("FCGradient", ["h", "W", "dy"], ["W_grad", "b_grad", "h_grad"])
    cases = {
        "dY written after": [fc, make_op("Scale", ["x"], ["dy"])],
        "X written": [make_op("Scale", ["x"], ["h"]), fc],
        "a link into X's tensor written": [make_op("Scale", ["x"], ["h_next"]), fc],
        "X's tensor written by name": [fc, make_op("Scale", ["x"], ["h_states"])],
    }
    for why, ops in cases.items():
        out = backward(NetDef(name="back", op=ops), H_LINKS)
        assert "rnn_internal_fc_gradient_deferred" in [o.type for o in out.backward.op], why
    two_into_dy = (*H_LINKS, sn.Link("dy_next", "x_grad", 1, 1))
    wide = (sn.Link("h", "h_states", 0, 2), *H_LINKS[1:])
    for links in (two_into_dy, wide):
        out = backward(fc_backward(dw_reused=False), links)
        assert out.weight_gradients.op[0].type == "rnn_internal_fc_weight_gradient"


def test_backward_rewrite_defers_fc_weight_gradients_to_one_net_after_the_loop():
    net = fc_backward(dw_reused=False)
    before = net.SerializeToString()
    out = backward(net)
    assert net.SerializeToString() == before
    assert [o.type for o in out.backward.op] == ["rnn_internal_apply_links", "rnn_internal_accumulate_gradient_input",
                                                 "rnn_internal_fc_gradient_deferred"]  # per-step Sums dropped
    deferred = out.backward.op[2]
    assert list(deferred.input) == ["timestep", "x", "h", "W", "dy", "W_grad_rnn_x", "W_grad_rnn_dy"]
    assert list(deferred.output) == ["h_grad", "W_grad_rnn_x", "W_grad_rnn_dy"]
    (gemm,) = out.weight_gradients.op
    assert gemm.type == "rnn_internal_fc_weight_gradient"
    assert list(gemm.input) == ["W_grad_rnn_x", "W_grad_rnn_dy", "W_grad", "b_grad"]
    assert list(gemm.output) == ["W_grad", "b_grad"]


def test_a_weight_gradient_read_by_another_op_stays_per_step():
    out = backward(fc_backward(dw_reused=True))
    types = [o.type for o in out.backward.op]
    assert "FCGradient" in types and "rnn_internal_fc_gradient_deferred" not in types
    assert out.weight_gradients is None
    assert types[-2:] == ["Sum", "Sum"]
    assert [list(o.input) for o in out.backward.op[-2:]] == [["W_grad", "W_grad_tmpstep"], ["b_grad", "b_grad_tmpstep"]]
    fc = out.backward.op[types.index("FCGradient")]
    assert list(fc.output) == ["W_grad_tmpstep", "b_grad_tmpstep", "h_grad"]


def test_running_an_rnn_leaves_the_model_nets_unchanged():
    T, N, D, H = 3, 2, 2, 3
    m, _ = build(D, H)
    net = m.net.proto()
    before = net.SerializeToString()
    ws = run(m, data(T, N, D, H, seed=0), (0,))
    step = ws.get_blob("LSTM/step_workspaces").value.steps[1]
    bound = {name: step.net(name).netdef for name in step.nets()}
    back = next(nd for nd in bound.values() if any(o.type == "rnn_internal_fc_input_gradient" for o in nd.op))
    assert back.op[0].type == "rnn_internal_apply_links"
    assert "FCGradient" not in [o.type for o in back.op]
    shared = ws.get_blob("LSTM/step_workspaces").value.shared
    (weights,) = [shared.net(n).netdef for n in shared.nets()]
    assert {o.output[0] for o in weights.op} == {"LSTM/gates_t_w_grad"}
    (gemm,) = weights.op   # from the rows of the hidden states and of the input projection's gradient, uncopied
    assert gemm.type == "rnn_internal_fc_weight_gradient_linked"
    assert list(gemm.input[1:3]) == ["LSTM/LSTM/hidden_t_prev_states", "LSTM/i2h_grad"]
    assert net.SerializeToString() == before


def test_the_gradient_op_sets_each_steps_timestep_even_when_an_outer_blob_has_its_name():
    """An outer `timestep` blob is the one every step workspace binds (Caffe2's CreateBlob rule); the backward
    loop writes t into it before each step, so its links and cell ops read the right rows."""
    step = sum_mul_step("cell")
    back = NetDef(name="back", op=[make_op("Mul", ["o_t_grad", "input_t"], ["o_int_grad"]),
                                   make_op("Mul", ["o_t_grad", "o_int"], ["direct"]),
                                   make_op("Sum", ["direct", "o_int_grad"], ["input_t_grad"]),
                                   make_op("Copy", ["o_int_grad"], ["o_prev_grad"])],
                  external_input=["o_t_grad", "input_t", "o_int"])
    op = rnn_op(step, backward=back)
    op.arg.extend([make_argument("backward_link_internal", ["o_t_grad", "o_prev_grad", "input_t_grad"]),
                   make_argument("backward_link_external", ["o_states_grad", "o_states_grad", "x_grad"]),
                   make_argument("backward_link_offset", [1, 0, 0])])
    grad = OperatorDef(type="RecurrentNetworkGradient", input=["o_all_grad", "x", "o_init", "o_all", "o_last",
                                                               "step_ws"], output=["x_grad", "o_init_grad"],
                       arg=list(op.arg))
    rng = np.random.default_rng(0)
    x, h0, dy = (rng.uniform(0.5, 1.5, s).astype(np.float32) for s in ((4, 2, 3), (2, 3), (4, 2, 3)))
    results = []
    for outer_timestep in (False, True):
        ws = Workspace()
        for name, value in (("x", x), ("o_init", h0), ("o_all_grad", dy)):
            ws.feed(name, value)
        if outer_timestep:
            ws.feed("timestep", np.array([99], np.int32))
        ws.run_operator_once(op)
        ws.run_operator_once(grad)
        results.append((ws.fetch("x_grad"), ws.fetch("o_init_grad")))
    states, sums = [h0.astype(np.float64)], []           # o_int = x_t + o_{t-1}, o_t = x_t * o_int
    for t in range(4):
        sums.append(x[t] + states[-1])
        states.append(x[t] * sums[-1])
    carry, dx = 0, np.zeros((4, 2, 3))
    for t in reversed(range(4)):
        do = dy[t] + carry
        carry = do * x[t]
        dx[t] = do * sums[t] + carry
    for got in results:
        np.testing.assert_allclose(got[0], dx, rtol=1e-5)
        np.testing.assert_allclose(got[1], carry, rtol=1e-5)


def bind(net: NetDef):
    """net bound in a workspace that has every blob its ops read."""
    ws = Workspace()
    for o in net.op:
        for name in o.input:
            ws.create_blob(name)
    return ws.create_net(net)


def test_a_malformed_fc_gradient_is_left_for_its_binding_to_report():
    """An FCGradient with a wrong kind of axis or a fourth input is not deferred (the rewrite reads only what
    it can trust): the op stays, and binding the backward step net reports it, naming the net and the op."""
    import pytest

    from stepnet.core.errors import ArgumentError, ArityError

    net = fc_backward(dw_reused=False)
    net.op[0].arg.append(make_argument("axis", ["a", "b"]))   # a file's wrong kind of value: not an int() TypeError
    assert [o.type for o in backward(net).backward.op].count("FCGradient") == 1
    with pytest.raises(ArgumentError, match=r"net 'back', op #\d+ \(FCGradient\): argument 'axis' must be an "
                                            r"integer \(field i\), but the file stores a list"):
        bind(backward(net).backward)
    net = fc_backward(dw_reused=False)
    net.op[0].input.append("dy")                                # four inputs: not a ValueError unpacking them
    assert [o.type for o in backward(net).backward.op].count("FCGradient") == 1
    with pytest.raises(ArityError, match=r"net 'back', op #\d+ \(FCGradient\): FCGradient takes 3 inputs, got 4"):
        bind(backward(net).backward)


def test_shared_scratch_is_what_nothing_reads_after_its_step():
    """Of a training step net's blobs, those written before any read in the step and read by no backward op
    are kept once for all steps; a blob read first (it would see the last step's value), read by the backward
    net, a link, a step-local or recomputed blob stays per step; a net with nested nets or no backward: none."""
    step = NetDef(op=[make_op("FC", ["o_prev", "W", "b"], ["g"]), make_op("Sum", ["g", "input_t"], ["g"]),
                      make_op("Relu", ["g"], ["r"]), make_op("Add", ["acc", "r"], ["acc"]),
                      make_op("Tanh", ["r"], ["kept"]), make_op("Mul", ["kept", "r"], ["o_t"])])
    backward = NetDef(op=[make_op("MulGradient", ["kept", "r", "o_t_grad"], ["kept_grad", "r_grad"])])
    nets = sn.StepNets(step, backward)
    assert sn.shared_scratch(nets, REC) == ("g",)
    assert sn.shared_scratch(nets._replace(local=("g",)), REC) == ()
    assert sn.shared_scratch(nets, sn.Recurrence("timestep", REC.links, recompute=("g",))) == ()
    assert sn.shared_scratch(sn.StepNets(step), REC) == ()
    nested = make_op("If", ["cond"], [], then_net=NetDef(op=[make_op("Relu", ["g"], ["z"])]))
    assert sn.shared_scratch(sn.StepNets(NetDef(op=[*step.op, nested]), backward), REC) == ()
