"""Net observers (core.Net.AddObserver / RemoveObserver / NumObservers, C.add_observer_to_net): what Caffe2's
RunCountObserver and TimeObserver report, counted from the nets' protos (ops per run, step-net ops and link
ops per timestep), and that an observed net's results are those of an unobserved run."""
import math

import numpy as np
import pytest

from stepnet.compat import brew, model_helper, rnn_cell, workspace


def _fc_model():
    model = model_helper.ModelHelper(name="obs")
    brew.fc(model, "data", "y", dim_in=4, dim_out=3)
    model.net.Relu("y", "z")
    workspace.FeedBlob("data", np.arange(8, dtype=np.float32).reshape(2, 4))
    workspace.RunNetOnce(model.param_init_net)
    workspace.CreateNet(model.net)
    return model


def test_run_count_is_ops_times_runs_and_stops_when_removed():
    model = _fc_model()
    ops = len(model.net.Proto().op)
    counter = model.net.AddObserver("RunCountObserver")
    assert model.net.NumObservers() == 1
    workspace.RunNet(model.net, 5)             # past the runs after which an unobserved net runs compiled
    assert counter.debug_info() == f"This operator runs {5 * ops} times."
    model.net.RemoveObserver(counter)
    assert model.net.NumObservers() == 0
    workspace.RunNet(model.net, 2)
    assert counter.debug_info() == f"This operator runs {5 * ops} times."


def test_observed_results_equal_unobserved_ones():
    model = _fc_model()
    workspace.RunNet(model.net, 3)
    plain = workspace.FetchBlob("z")
    model.net.AddObserver("TimeObserver")
    workspace.RunNet(model.net, 3)
    np.testing.assert_array_equal(workspace.FetchBlob("z"), plain)
    x = np.arange(8, dtype=np.float64).reshape(2, 4)
    w, b = workspace.FetchBlob("y_w").astype(np.float64), workspace.FetchBlob("y_b").astype(np.float64)
    np.testing.assert_allclose(plain, np.maximum(x @ w.T + b, 0), rtol=1e-6)


def test_time_observer_averages():
    model = _fc_model()
    timer = model.net.AddObserver("TimeObserver")
    assert math.isnan(timer.average_time())    # no run yet: Caffe2 divides by zero runs
    workspace.RunNet(model.net, 3)
    assert timer.average_time() >= 0 and timer.average_time_children() >= 0
    assert timer.average_time_children() <= timer.average_time()   # mean per op <= a whole run
    assert timer.debug_info() == "Not implemented."
    with pytest.raises(RuntimeError, match="does not implement"):
        model.net.AddObserver("RunCountObserver").average_time()


def test_run_count_includes_step_net_ops_per_timestep():
    T, batch, dim = 4, 2, 3
    model = model_helper.ModelHelper(name="lstm_obs")
    model.net.AddExternalInputs("input", "h0", "c0")
    rnn_cell.LSTM(model, "input", "seq_lengths", ["h0", "c0"], dim_in=dim, dim_out=dim, scope="lstm",
                  forward_only=True)
    for name, value in (("input", np.random.rand(T, batch, dim)), ("h0", np.zeros((1, batch, dim))),
                        ("c0", np.zeros((1, batch, dim)))):
        workspace.FeedBlob(name, value.astype(np.float32))
    workspace.FeedBlob("seq_lengths", np.full(batch, T, dtype=np.int32))
    workspace.RunNetOnce(model.param_init_net)
    workspace.CreateNet(model.net)
    proto = model.net.Proto()
    rnn, = [op for op in proto.op if op.type == "RecurrentNetwork"]
    step_net, = [a.n for a in rnn.arg if a.name == "step_net"]
    links = [a.strings for a in rnn.arg if a.name == "link_internal"][0]
    counter = model.net.AddObserver("RunCountObserver")
    workspace.RunNet(model.net, 2)
    # per timestep: the step ops and one rnn_internal_apply_link op per link, as Caffe2's RNN executor runs them
    expected = 2 * (len(proto.op) + T * (len(step_net.op) + len(links)))
    assert counter.debug_info() == f"This operator runs {expected} times."


def test_misuse_is_caffe2s_error():
    model = _fc_model()
    with pytest.raises(RuntimeError, match="observer"):
        model.net.AddObserver("NoSuchObserver")
    with pytest.raises(RuntimeError, match="Can't find net"):
        workspace.C.add_observer_to_net("no_net", "TimeObserver")
