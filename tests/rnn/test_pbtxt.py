"""Training plans in Caffe2's file layout (tests/rnn/data/, see make_rnn_pbtxt.py there): a char-rnn whose step
nets are text NetDefs in Argument.s and a classifier whose step nets are nested NetDefs, each with its
RecurrentNetworkGradient written in the file. They load, run forward to the numpy LSTM's values, and train."""
from pathlib import Path

import numpy as np
import pytest

from stepnet import Workspace
from stepnet.io.proto import argument_value, load

from .reference import lstm_forward

DATA = Path(__file__).parent / "data"
D, H, N, T = 4, 6, 2, 5


def arg(op, name):
    return next(argument_value(a) for a in op.arg if a.name == name)


def feeds(classifier: bool):
    text = [[0, 1, 2, 3, 0, 1], [2, 3, 3, 1, 0, 2]]       # two fixed sequences of 4 symbols
    X = np.zeros((T, N, D), np.float32)
    for n, seq in enumerate(text):
        X[np.arange(T), n, seq[:T]] = 1.0
    target = np.array([1, 2], np.int32) if classifier else np.array(
        [text[n][t + 1] for t in range(T) for n in range(N)], np.int32)
    return {"input": X, "seq_lengths": np.array([T, T - 2], np.int32), "target": target}


@pytest.mark.parametrize("name, classifier, step_field", [("lstm_char_rnn_plan.pbtxt", False, "s"),
                                                           ("lstm_classifier_plan.pbtxt", True, "n")])
def test_file_loads_runs_forward_and_trains(name, classifier, step_field):
    plan = load(DATA / name)
    init, train = plan.network
    rnn = next(o for o in train.op if o.type == "RecurrentNetwork")
    grad = next(o for o in train.op if o.type == "RecurrentNetworkGradient")
    for op in (rnn, grad):
        kinds = {a.name: ("s" if a.HasField("s") else "n" if a.HasField("n") else "") for a in op.arg}
        assert kinds["step_net"] == kinds["backward_step_net"] == step_field
    assert arg(rnn, "outputs_with_grads") == [1 if classifier else 0]
    assert list(grad.input[:1]) == ["LSTM/hidden_state_last_grad" if classifier else "LSTM/hidden_state_all_grad"]
    ws = Workspace(seed=3)
    ws.run_net_once(init)
    for k, v in feeds(classifier).items():
        ws.feed(k, v)
    net = ws.create_net(train)
    params = {p: ws.fetch(p) for p in ("LSTM/i2h_w", "LSTM/i2h_b", "LSTM/gates_t_w", "LSTM/gates_t_b")}
    losses = []
    for i in range(8):
        net.run()
        if i == 0:     # the forward pass ran on the initial parameters: compare with the numpy LSTM
            x = feeds(classifier)
            h_all, _, _ = lstm_forward(x["input"], np.zeros((N, H)), np.zeros((N, H)), params["LSTM/i2h_w"],
                                       params["LSTM/i2h_b"], params["LSTM/gates_t_w"], params["LSTM/gates_t_b"],
                                       x["seq_lengths"])
            np.testing.assert_allclose(ws.fetch("LSTM/hidden_state_all"), h_all, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(ws.fetch("LSTM/hidden_state_last"), h_all[-1:], rtol=1e-4, atol=1e-5)
        losses.append(float(ws.fetch("loss")))
    assert losses[-1] < losses[0] - 0.05, losses
    assert all(b < a for a, b in zip(losses, losses[1:], strict=False)), losses


def test_the_training_check_notices_a_gradient_that_does_not_flow(broken):
    """With the RNN's parameter gradients zeroed the loss still falls (the output FC learns), but the LSTM's
    parameters must move: check that they do in a real run, and that a broken gradient op freezes them."""
    from stepnet.ops import REGISTRY
    plan = load(DATA / "lstm_classifier_plan.pbtxt")
    init, train = plan.network

    def gates_w_change():
        ws = Workspace(seed=3)
        ws.run_net_once(init)
        for k, v in feeds(True).items():
            ws.feed(k, v)
        before = ws.fetch("LSTM/gates_t_w")
        ws.run_net_once(train)
        return np.abs(ws.fetch("LSTM/gates_t_w") - before).max()

    assert gates_w_change() > 1e-4
    for op_type in ("LSTMUnitGradient", "rnn_internal_lstm_unit_gradient"):  # the plain and the saved form
        kernel = REGISTRY.get(op_type).kernel
        broken(op_type, lambda xp, *a, kernel=kernel, **k: tuple(v * 0 for v in kernel(xp, *a, **k)))
    assert gates_w_change() == 0.0
