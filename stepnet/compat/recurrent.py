"""Caffe2's recurrent module: recurrent_net (stepnet.builders.rnn.recurrent_net: a RecurrentNetwork op from any step
net, its backward step net derived by the backward pass), set_rnn_executor_config and retrieve_step_blobs."""
from __future__ import annotations

from ..builders import rnn as _rnn
from ..builders.builder import BlobRef
from ..io.proto import make_argument
from . import core, workspace
from .errors import caffe2_errors
from .scope import CurrentDeviceScope

STEP_NETS = ("step_net", "backward_step_net")


def on_device(net, build):
    """build(), then the current device scope stamped on the ops of the step nets it added to net that have no
    device option (Caffe2 creates step ops under the scope, gradient ops included)."""
    before, device = len(net.Proto().op), CurrentDeviceScope()
    result = build()
    if device is not None:
        for op in net.Proto().op[before:]:
            for arg in op.arg:
                if arg.name in STEP_NETS and arg.HasField("n"):
                    for step_op in arg.n.op:
                        if not step_op.HasField("device_option"):
                            step_op.device_option.CopyFrom(device)
    return result


def recurrent_net(net, cell_net, inputs, initial_cell_inputs, links, timestep=None, scope=None,
                  outputs_with_grads=(0,), recompute_blobs_on_backward=None, forward_only=False):
    """Add a RecurrentNetwork op running cell_net once per timestep to net; returns (state_1_all, state_1_last,
    ...). inputs: [(input_t, sequence)], initial_cell_inputs: [(state_prev, initial blob)], links:
    {state_prev: state}."""
    links = {str(k): v for k, v in links.items()}
    inputs = [(t, _scoped(seq)) for t, seq in inputs]
    initial_cell_inputs = [(c, _scoped(b)) for c, b in initial_cell_inputs]
    before = len(net.Proto().op)
    outs = on_device(net, lambda: _rnn.recurrent_net(
        net, cell_net, inputs, initial_cell_inputs, links, timestep=timestep, scope=scope,
        outputs_with_grads=outputs_with_grads, recompute_blobs_on_backward=recompute_blobs_on_backward,
        forward_only=forward_only))
    if scope is not None:   # '<scope>/step_workspaces' is an output named by a string: it gets the name scope
        for op in net.Proto().op[before:]:
            if op.type == "RecurrentNetwork":
                op.output[-1] = core.ScopedName(op.output[-1])
    return tuple(core.BlobReference(str(o), net) for o in outs)


def _scoped(blob):
    """An op input given as a plain string is a blob of the current name scope (Caffe2 creates the op with it, so
    'hidden_init' under NameScope('cpu_0') is cpu_0/hidden_init); a BlobReference is used as it is."""
    if isinstance(blob, bytes):
        blob = blob.decode()
    return core.ScopedName(blob) if isinstance(blob, str) and not isinstance(blob, BlobRef) else blob


def set_rnn_executor_config(rnn_op, num_threads=None, max_cuda_streams=None) -> None:
    """Caffe2's RNN executor settings (`rnn_executor.*` arguments: accepted hints, stepnet runs steps in order)."""
    if rnn_op.type not in ("RecurrentNetwork", "RecurrentNetworkGradient"):
        raise ValueError(f"expected a RecurrentNetwork op, got {rnn_op.type}")
    for key, value in (("num_threads", num_threads), ("max_cuda_streams", max_cuda_streams)):
        if value is not None:
            rnn_op.arg.append(make_argument("rnn_executor." + key, int(value)))


def retrieve_step_blobs(net, prefix="rnn") -> list:
    """Copy the blobs of every step workspace of net's RecurrentNetwork ops (net already run) into the current
    workspace as `<prefix>_<blob><t>`; returns their names as Caffe2 does: the fetched string tensor's elements
    (bytes)."""
    proto = net.Proto() if hasattr(net, "Proto") else net
    fetch = caffe2_errors(_rnn.retrieve_step_blobs)
    return [name.encode("utf-8") for name in fetch(workspace._ws(), proto, prefix)]
