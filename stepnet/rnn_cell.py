"""Recurrent nets from Python: `recurrent_net` (Caffe2's recurrent.py, spec §5.1) turns a step net into a
RecurrentNetwork op — links, aliases, references and params computed, the backward step net derived with the
backward pass (never written by hand) — and `lstm` builds the exact layout and blob names of spec §3.16."""
from __future__ import annotations

from .builder import BlobRef, NetBuilder
from .errors import ArgumentError
from .gradients import backward_ops
from .proto import NetDef, OperatorDef


def _versions(ops, external_input=()):
    """(blob -> last version, set of blobs read before any op writes them) in SSA order."""
    version = {name: 0 for name in external_input}
    undefined = set()
    for op in ops:
        for name in op.input:
            if version.get(name, 0) == 0:
                undefined.add(name)
        for name in op.output:
            version[name] = version.get(name, 0) + 1
    return version, undefined


def recurrent_net(net: NetBuilder, cell_net, inputs, initial_cell_inputs, links, timestep=None, scope=None,
                  outputs_with_grads=(0,), recompute_blobs_on_backward=None, forward_only=False):
    """Add a RecurrentNetwork op running cell_net once per timestep; returns its outputs
    (`<state>_all`, `<state>_last` per recurrent state, without step_workspaces).

    inputs: [(input_t, sequence blob)] (exactly one); initial_cell_inputs: [(cell-side name, initial blob)];
    links: {cell-side input: cell-side output of the next step}.
    """
    cell = cell_net.proto() if isinstance(cell_net, NetBuilder) else cell_net
    if len(inputs) != 1:
        raise ArgumentError(f"recurrent_net takes exactly one sequence input, got {len(inputs)}")
    op_name = net.next_name("recurrent")
    prefix = scope or op_name

    def s(name):
        return f"{prefix}/{name}"

    input_t, seq_blob = (str(x) for x in inputs[0])
    known = {input_t, seq_blob} | {str(b) for _, b in initial_cell_inputs} | {str(c) for c, _ in initial_cell_inputs}
    if timestep is not None:
        known.add(str(timestep))
    references = [b for b in cell.external_input if b not in known]

    backward = None
    mapping = {}
    if not forward_only:
        grads = {o: o + "_grad" for o in cell.external_output}
        b_ops, mapping = backward_ops(list(cell.op), grads)
        backward = NetDef(name="RecurrentBackwardStep", type="simple")
        recompute = set(recompute_blobs_on_backward or ())
        if recompute:
            for op in cell.op:
                if set(op.output) & recompute:
                    if not set(op.output) <= recompute:
                        raise ArgumentError(f"op {op.type} writes {list(op.output)}: a recomputed op may only "
                                            f"produce blobs in recompute_blobs_on_backward {sorted(recompute)}")
                    backward.op.append(OperatorDef.FromString(op.SerializeToString()))
        backward.op.extend(b_ops)
        b_versions, undefined = _versions(backward.op)
        f_versions, _ = _versions(cell.op, cell.external_input)
        scratches = [b for b, v in f_versions.items()
                     if v > 0 and b in undefined and b not in cell.external_output]
        backward.external_input.extend(scratches)

    forward_links, backward_links, aliases, recurrent_states, all_outputs = [], [], [], [], []
    for cell_input, _ in initial_cell_inputs:
        cell_input = str(cell_input)
        state = s(cell_input + "_states")
        states_grad = state + "_grad"
        cell_output = str(links[cell_input])
        forward_links += [(cell_input, state, 0), (cell_output, state, 1)]
        aliases += [(state, cell_output + "_all", 1), (state, cell_output + "_last", -1)]
        all_outputs += [cell_output + "_all", cell_output + "_last"]
        recurrent_states.append(state)
        if backward is not None:
            backward_links.append((cell_output + "_grad", states_grad, 1))
            backward.external_input.append(cell_output + "_grad")
            grad = cell_input + "_grad"
            if not b_versions.get(grad, 0):  # nobody writes it (e.g. the first cell op is a Sum): use the mapping
                backward_links.append((mapping[cell_input], states_grad, 0))
            else:
                backward_links.append((grad, states_grad, 0))
    forward_links.append((input_t, seq_blob, 0))
    if backward is not None:
        backward_links.append((mapping[input_t], seq_blob + "_grad", 0))
        backward.external_input.extend(cell.external_input)
        backward.external_input.extend(cell.external_output)
        _accumulate_external_gradients(backward)

    all_inputs = [seq_blob] + [str(b) for _, b in initial_cell_inputs] + references
    args = dict(
        alias_src=[a[0] for a in aliases], alias_dst=[a[1] for a in aliases], alias_offset=[a[2] for a in aliases],
        recurrent_states=recurrent_states,
        initial_recurrent_state_ids=[all_inputs.index(str(b)) for _, b in initial_cell_inputs],
        link_internal=[x[0] for x in forward_links], link_external=[x[1] for x in forward_links],
        link_offset=[x[2] for x in forward_links], enable_rnn_executor=1, step_net=cell,
        timestep="timestep" if timestep is None else str(timestep))
    if backward is not None:
        params = [r for r in references if r in mapping]
        args.update(
            param=[all_inputs.index(p) for p in params],
            backward_link_internal=[x[0] for x in backward_links],
            backward_link_external=[x[1] for x in backward_links],
            backward_link_offset=[x[2] for x in backward_links],
            outputs_with_grads=list(outputs_with_grads),
            recompute_blobs_on_backward=[str(b) for b in (recompute_blobs_on_backward or ())],
            param_grads=[str(mapping[p]) for p in params])
        if backward.op:
            args["backward_step_net"] = backward
    outputs = net.add_op("RecurrentNetwork", [BlobRef(x) for x in all_inputs],
                         [BlobRef(x) for x in all_outputs] + [BlobRef(s("step_workspaces"))], **args)
    return outputs[:-1]


def _accumulate_external_gradients(backward: NetDef) -> None:
    """A gradient that arrives through a link and is also written inside the step must be added, not
    overwritten: such an op writes <blob>_accum and a Sum follows it (recurrent.py's fix-up)."""
    ops = list(backward.op)
    del backward.op[:]
    for op in ops:
        backward.op.append(op)
        for j, out in enumerate(list(op.output)):
            if out in backward.external_input and out not in op.input:
                accum = out + "_accum"
                backward.op[-1].output[j] = accum
                backward.op.append(OperatorDef(type="Sum", input=[out, accum], output=[out]))


def lstm(model, input_blob, seq_lengths, initial_states, dim_in: int, dim_out: int, scope: str = "LSTM",
         outputs_with_grads=(0,), memory_optimization: bool = False, forget_bias: float = 0.0,
         forward_only: bool = False, drop_states: bool = False):
    """An LSTM over a T x N x dim_in sequence (Caffe2's rnn_cell.LSTM with one layer): the i2h FC over all
    timesteps, then a RecurrentNetwork whose step net is FC(hidden_t_prev) + input_t -> LSTMUnit. Returns
    (hidden_all, hidden_last, cell_all, cell_last). model is a ModelBuilder; parameters go in its init net."""
    hidden_init, cell_init = (BlobRef(str(x)) for x in initial_states)
    i2h = model.fc(BlobRef(str(input_blob)), BlobRef(f"{scope}/i2h"), dim_in, 4 * dim_out, axis=2)
    h_prev, c_prev = BlobRef(f"{scope}/hidden_t_prev"), BlobRef(f"{scope}/cell_t_prev")
    step = NetBuilder(scope)
    step.add_external_inputs("input_t", "timestep", h_prev, c_prev)
    w = model.create_param(f"{scope}/gates_t_w", [4 * dim_out, dim_out])
    b = model.create_param(f"{scope}/gates_t_b", [4 * dim_out], ("ConstantFill", {"value": 0.0}))
    gates = step.FC([h_prev, w, b], BlobRef(f"{scope}/gates_t"), axis=2)
    step.Sum([gates, BlobRef("input_t")], gates)
    unit_inputs = [h_prev, c_prev, gates] + ([BlobRef(str(seq_lengths))] if seq_lengths is not None else [])
    h, c = step.LSTMUnit(unit_inputs + [BlobRef("timestep")],
                         [BlobRef(f"{scope}/hidden_state"), BlobRef(f"{scope}/cell_state")],
                         forget_bias=float(forget_bias), drop_states=int(drop_states),
                         sequence_lengths=int(seq_lengths is not None))
    step.add_external_outputs(h, c)
    return recurrent_net(model.net, step, [(BlobRef("input_t"), i2h)], [(h_prev, hidden_init), (c_prev, cell_init)],
                         {h_prev: h, c_prev: c}, timestep=BlobRef("timestep"), scope=scope,
                         outputs_with_grads=outputs_with_grads,
                         recompute_blobs_on_backward=[gates] if memory_optimization else None,
                         forward_only=forward_only)
