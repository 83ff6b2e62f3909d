"""Caffe2's recurrent module: recurrent_net (stepnet.builders.rnn.recurrent_net: a RecurrentNetwork op from any step
net, its backward step net derived by the backward pass), set_rnn_executor_config and retrieve_step_blobs."""
from __future__ import annotations

from ..builders import rnn as _rnn
from ..io.proto import make_argument
from . import core, workspace
from .rnn_cell import on_device


def recurrent_net(net, cell_net, inputs, initial_cell_inputs, links, timestep=None, scope=None,
                  outputs_with_grads=(0,), recompute_blobs_on_backward=None, forward_only=False):
    """Add a RecurrentNetwork op running cell_net once per timestep to net; returns (state_1_all, state_1_last,
    ...). inputs: [(input_t, sequence)], initial_cell_inputs: [(state_prev, initial blob)], links:
    {state_prev: state}."""
    outs = on_device(net, lambda: _rnn.recurrent_net(
        net, cell_net, inputs, initial_cell_inputs, links, timestep=timestep, scope=scope,
        outputs_with_grads=outputs_with_grads, recompute_blobs_on_backward=recompute_blobs_on_backward,
        forward_only=forward_only))
    return tuple(core.BlobReference(str(o), net) for o in outs)


def set_rnn_executor_config(rnn_op, num_threads=None, max_cuda_streams=None) -> None:
    """Caffe2's RNN executor settings (`rnn_executor.*` arguments: accepted hints, stepnet runs steps in order)."""
    if rnn_op.type not in ("RecurrentNetwork", "RecurrentNetworkGradient"):
        raise ValueError(f"expected a RecurrentNetwork op, got {rnn_op.type}")
    for key, value in (("num_threads", num_threads), ("max_cuda_streams", max_cuda_streams)):
        if value is not None:
            rnn_op.arg.append(make_argument("rnn_executor." + key, int(value)))


def retrieve_step_blobs(net, prefix="rnn") -> list:
    """Copy the blobs of every step workspace of net's RecurrentNetwork ops (net already run) into the current
    workspace as `<prefix>_<blob><t>`; returns their names."""
    return _rnn.retrieve_step_blobs(workspace._ws(), net.Proto() if hasattr(net, "Proto") else net, prefix)
