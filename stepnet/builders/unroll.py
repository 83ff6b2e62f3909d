"""A recurrent step net unrolled into a static net, as Caffe2's rnn_cell.UnrolledCell lays it out (spec §5.2).

The sequence is cut along time with Split (`<seq>_timestep_<t>`); step t's ops are copies of the step net
with every blob the step writes renamed `timestep_<t>/<name>`, `input_t` replaced by the t-th slice, each
`<state>_prev` by the previous step's output (the initial blob at t = 0) and the timestep by a CPU int32
blob `timestep_<t>/timestep` filled in the init net; parameters and other references stay shared. Each
state's steps are concatenated (`<output>_concat`), and outputs that receive no gradient get ZeroGradient.
Used to check RecurrentNetwork against a plain net (same outputs, same gradients).
"""
from __future__ import annotations

from .builder import BlobRef, NetBuilder
from ..core.errors import ArgumentError
from ..io.proto import DeviceOption

INT32 = 2  # TensorProto.INT32


def unroll_step_net(model, cell_net, inputs, initial_cell_inputs, links, T: int, timestep="timestep",
                    outputs_with_grads=(0,)) -> list:
    """Add the unrolled form of cell_net over T steps to model.net (timestep fills to model.init_net).

    Arguments as for rnn_cell.recurrent_net. Returns (state_1_all, state_1_last, state_2_all, ...): the
    concatenated T x N x D outputs and the last step's 1 x N x D outputs.
    """
    cell = cell_net.proto() if isinstance(cell_net, NetBuilder) else cell_net
    if len(inputs) != 1:
        raise ArgumentError(f"unroll takes exactly one sequence input, got {len(inputs)}")
    if T < 1:
        raise ArgumentError(f"cannot unroll over T = {T} steps; T must be >= 1")
    net = model.net
    input_t, seq = (str(x) for x in inputs[0])
    timestep = str(timestep)
    cell_inputs = [str(c) for c, _ in initial_cell_inputs]
    for c in cell_inputs:
        if str(c) not in {str(k) for k in links}:
            raise ArgumentError(f"recurrent input {c!r} has no link to the step output that feeds it")
    cell_outputs = [str(links[next(k for k in links if str(k) == c)]) for c in cell_inputs]
    pieces = net.Split([BlobRef(seq)], [BlobRef(f"{seq}_timestep_{t}") for t in range(T)], axis=0)
    pieces = [pieces] if T == 1 else pieces
    states = [str(b) for _, b in initial_cell_inputs]
    per_step = []
    for t in range(T):
        prefix = f"timestep_{t}/"
        ts = BlobRef(prefix + timestep)
        model.init_net.ConstantFill([], ts, value=t, shape=[1], dtype=INT32,
                                    device_option=DeviceOption(device_type=0))
        names = {input_t: str(pieces[t]), timestep: str(ts), **dict(zip(cell_inputs, states, strict=True))}
        for op in cell.op:
            ins = [BlobRef(names.get(n, n)) for n in op.input]
            for n in op.output:
                names[n] = prefix + n
            outs = [BlobRef(names[n]) for n in op.output]
            extra = {"device_option": op.device_option} if op.HasField("device_option") else {}
            net.add_op(op.type, ins, outs, arg=list(op.arg), name=op.name, engine=op.engine, **extra)
        missing = [o for o in cell_outputs if o not in names or names[o] == o]
        if missing:
            raise ArgumentError(f"the step net never writes the linked output(s) {missing}")
        states = [names[o] for o in cell_outputs]
        per_step.append(states)
    outputs = []
    for k, out in enumerate(cell_outputs):
        steps = [BlobRef(s[k]) for s in per_step]
        full = net.Concat(steps, [BlobRef(out + "_concat"), BlobRef(out + "_concat_info")], axis=0)[0]
        # The last step's blob also feeds the Concat: a copy gives `_last` a gradient of its own, summed with
        # the Concat's by the backward pass (a gradient given for a blob other ops read would be replaced).
        last = net.Copy(steps[-1], BlobRef(out + "_last"))
        outputs += [full, last]
    for i, out in enumerate(outputs):
        if i not in outputs_with_grads:
            net.ZeroGradient([out], [])
    return outputs
