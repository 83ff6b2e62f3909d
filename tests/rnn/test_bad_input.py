"""Bad RecurrentNetwork input beyond test_recurrent.py's cases: each error names the argument and the values."""
import numpy as np
import pytest

from stepnet import Workspace
from stepnet.core.errors import ArgumentError, DTypeError, MissingBlobError, ShapeError
from stepnet.builders.model import ModelBuilder
from stepnet.io.proto import NetDef, OperatorDef, make_argument, to_text
from stepnet.builders.rnn import lstm
from stepnet.testing import make_op

from .test_recurrent import rnn_op, run, sum_mul_step

X = np.ones((4, 2, 2), np.float32)
H0 = np.zeros((1, 2, 2), np.float32)


@pytest.mark.parametrize("change, error, message", [
    (dict(link_internal=["o_prev", "o_t", "input_t", "peek"], link_external=["o_states", "o_states", "x", "x"],
          link_offset=[0, 1, 0, 0], link_window=[1, 1, 1, 3]), ShapeError,
     r"link 'peek' -> 'x': at timestep 2 the window rows \[2, 5\) \(offset 0, window 3\) run past the end "
     r"of its 4 rows"),
    (dict(link_offset=[0, 1, 2]), ShapeError, r"link 'input_t' -> 'x': at timestep 2 the window rows \[4, 5\) "
     r"\(offset 2, window 1\) run past the end of its 4 rows"),
    (dict(alias_offset=[9, -1]), ArgumentError, "alias 'o_all': offset 9 is outside recurrent state 'o_states' with "
     "5 rows"),
    (dict(link_window=[1, 1]), ArgumentError, "link_window has 2 entries for 3 links"),
    (dict(initial_recurrent_state_ids=[5]), ArgumentError, "initial_recurrent_state_ids holds 5, but the op has 2 "
     "inputs"),
])
def test_bad_links_and_aliases(change, error, message):
    with pytest.raises(error, match=message):
        run(rnn_op(sum_mul_step(), **change), X, H0)


def test_step_and_backward_nets_with_one_name_given_as_text():
    op = rnn_op(sum_mul_step("cell"), backward=NetDef(name="back"))
    for a in op.arg:   # both nets as text in Argument.s, the backward one named like the step net
        if a.name in ("step_net", "backward_step_net"):
            text = to_text(a.n).replace('name: "back"', 'name: "cell"')
            a.ClearField("n")
            a.s = text.encode()
    with pytest.raises(ArgumentError, match="step_net and backward_step_net are both named 'cell'"):
        run(op, X, H0)


def test_gradient_op_alone_checks_the_names_too():
    fwd = rnn_op(sum_mul_step("cell"))
    grad = OperatorDef(type="RecurrentNetworkGradient", input=["o_all_grad", "x", "o_init", "o_all", "o_last",
                                                               "step_ws"], output=["x_grad", "o_init_grad"])
    grad.arg.extend(list(fwd.arg) + [make_argument("backward_step_net", NetDef(name="cell"))])
    ws = run(fwd, X, H0)
    ws.feed("o_all_grad", X)
    with pytest.raises(ArgumentError, match="both named 'cell'"):
        ws.run_operator_once(grad)


def timestep_reading_step():
    step = sum_mul_step()
    step.op.append(make_op("Cast", ["timestep"], ["t_float"], to=1))
    step.external_input.append("timestep")
    return step


def test_step_net_reading_a_timestep_the_op_does_not_provide():
    """Caffe2 fails at step-net creation ("Encountered a non-existing input blob"); so does stepnet, naming
    the blob the step net reads and the one the op's `timestep` argument provides."""
    with pytest.raises(MissingBlobError, match="'timestep' does not exist.*argument 'timestep' names 'step_t'"):
        run(rnn_op(timestep_reading_step(), timestep="step_t"), X, H0)


def test_a_timestep_name_found_in_an_outer_workspace_is_shared_as_in_caffe2():
    """Caffe2's binding rule: the step net binds an ancestor's blob of that name, so every step reads the stale
    outer value instead of t (spec §3.8). stepnet reproduces it rather than guessing."""
    ws = Workspace()
    ws.feed("timestep", np.array([7], np.int32))
    op = rnn_op(timestep_reading_step(), timestep="step_t", backward=NetDef(name="back"))
    run(op, X, H0, ws)
    steps = ws.get_blob("step_ws").value.steps
    assert [float(s.fetch("t_float")[0]) for s in steps] == [7.0] * 4
    assert [int(s.fetch("step_t")[0]) for s in steps] == [0, 1, 2, 3]


def lstm_run(seq, N=3):
    m = ModelBuilder("m")
    lstm(m, "X", "seq", ("h0", "c0"), 2, 3, forward_only=True)
    ws = Workspace()
    ws.run_net_once(m.init_net.proto())
    ws.feed("X", np.ones((4, N, 2), np.float32))
    ws.feed("h0", np.zeros((1, N, 3), np.float32))
    ws.feed("c0", np.zeros((1, N, 3), np.float32))
    ws.feed("seq", seq)
    ws.run_net_once(m.net.proto())


@pytest.mark.parametrize("seq, error, message", [
    (np.array([4, 2, 1], np.int64), DTypeError, "seq_lengths must be int32, got int64"),
    (np.array([4, 2, 1], np.float32), DTypeError, "seq_lengths must be int32, got float32"),
    (np.array([4, 2, 1, 3], np.int32), ShapeError, r"seq_lengths has 4 entries but must hold one length per batch "
     r"row N \(3\)"),
])
def test_bad_seq_lengths_are_caught_by_lstm_unit(seq, error, message):
    with pytest.raises(error, match=message):
        lstm_run(seq)


@pytest.mark.parametrize("h0, message", [
    (np.zeros((2, 2), np.float32).reshape(2, 2, 1, 1)[..., 0, 0][None, None], "rank 4"),
    (np.zeros((3, 2), np.float32), r"\(3, 2\) has batch size 3 but the input sequence has N = 2"),
    (np.zeros((2, 1, 2), np.float32), r"\(2, 1, 2\) has batch size 1 but the input sequence has N = 2"),
])
def test_bad_initial_states_name_the_state_and_shapes(h0, message):
    with pytest.raises(ShapeError, match=f"initial value of recurrent state 'o_states'.*{message}"):
        run(rnn_op(sum_mul_step()), X, h0)


def gradient_op(fwd):
    grad = OperatorDef(type="RecurrentNetworkGradient", input=["o_all_grad", "x", "o_init", "o_all", "o_last",
                                                               "step_ws"], output=["x_grad", "o_init_grad"])
    grad.arg.extend(list(fwd.arg))
    return grad


def test_gradient_op_run_without_any_forward_run():
    fwd = rnn_op(sum_mul_step(), backward=NetDef(name="back"))
    ws = Workspace()
    for name in ("x", "o_init", "o_all", "o_last", "o_all_grad"):
        ws.feed(name, X)
    with pytest.raises(MissingBlobError, match="'step_ws' does not exist"):
        ws.run_operator_once(gradient_op(fwd))
    ws.feed("step_ws", np.zeros(1, np.float32))   # a tensor where the workspaces should be
    with pytest.raises(MissingBlobError, match="kept 0 step workspaces in 'step_ws' but this gradient needs 4"):
        ws.run_operator_once(gradient_op(fwd))


def test_gradient_op_after_a_shorter_forward_run():
    fwd = rnn_op(sum_mul_step(), backward=NetDef(name="back"))
    ws = run(fwd, X[:2], H0)
    ws.feed("x", X)                                # the sequence grew after the forward ran
    ws.feed("o_all_grad", X)
    with pytest.raises(MissingBlobError, match="kept 2 step workspaces.*needs 4.*run the forward op"):
        ws.run_operator_once(gradient_op(fwd))


def test_the_window_check_is_what_catches_a_link_past_the_end(broken):
    """With lenient link views (clipping the window) the past-the-end case no longer raises: the test above
    depends on the bounds check, not on some later failure."""
    def clipping(ctx, xp, timestep, *externals, offsets, windows, **flags):
        t = int(timestep[0])
        for blob, ext, offset, window in zip(ctx.outputs, externals, offsets, windows):
            blob.set_view(ext[t + offset:t + offset + window])
    broken("rnn_internal_apply_links", clipping)
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        test_bad_links_and_aliases(dict(link_internal=["o_prev", "o_t", "input_t", "peek"],
                                        link_external=["o_states", "o_states", "x", "x"],
                                        link_offset=[0, 1, 0, 0], link_window=[1, 1, 1, 3]), ShapeError, "rows")


@pytest.mark.parametrize("which", ["step_net", "backward_step_net"])
def test_a_step_net_given_as_text_that_is_not_utf8(which):
    from stepnet.core.errors import FileFormatError
    op = rnn_op(sum_mul_step("cell"), backward=NetDef(name="back"))
    for a in op.arg:
        if a.name == which:
            text = to_text(a.n).encode().replace(b'name: "', b'name: "\xff', 1)
            a.ClearField("n")
            a.s = text
    with pytest.raises(FileFormatError, match=f"op #0 \\(RecurrentNetwork\\), argument '{which}': the net's text is "
                                              r"not valid UTF-8 \(byte 0xff at offset 7"):
        run(op, X, H0)
