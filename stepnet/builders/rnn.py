"""Recurrent nets from Python: `recurrent_net` (Caffe2's recurrent.py, spec §5.1) turns a step net into a
RecurrentNetwork op — links, aliases, references and params computed, the backward step net derived with the
backward pass (never written by hand) — and `lstm` / `gru` / `basic_rnn` build the exact layouts and blob names
of Caffe2's rnn_cell.LSTM (one or several layers, spec §3.16, §5.2), gru_cell.GRU and rnn_cell.BasicRNN,
either as one RecurrentNetwork op or statically unrolled (`static_rnn_unroll_size`, see rnn_unroll.py)."""
from __future__ import annotations

from .builder import BlobRef, NetBuilder, Scope
from ..core.errors import ArgumentError
from ..passes.gradients import backward_ops
from ..graph.view import Graph, copy_op, with_ops
from ..io.proto import NetDef, OperatorDef, make_argument
from .cells import BasicRNNCell, GRUCell, LSTMCell, MultiRNNCell


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
        b_graph = Graph(backward.op)
        b_versions, undefined = b_graph.final, b_graph.read_before_written()
        scratches = [b for b, v in Graph.of(cell).final.items()   # written by the step, read first by backward
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
        backward = _accumulate_external_gradients(backward)

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


def _accumulate_external_gradients(backward: NetDef) -> NetDef:
    """A gradient that arrives through a link and is also written inside the step must be added, not
    overwritten: such an op writes <blob>_accum and a Sum follows it (recurrent.py's fix-up)."""
    ops = []
    for op in backward.op:
        op = copy_op(op)
        ops.append(op)
        for j, out in enumerate(list(op.output)):
            if out in backward.external_input and out not in op.input:
                accum = out + "_accum"
                op.output[j] = accum
                ops.append(OperatorDef(type="Sum", input=[out, accum], output=[out]))
    return with_ops(backward, ops)


def retrieve_step_blobs(ws, net, prefix: str = "rnn") -> list[str]:
    """recurrent.retrieve_step_blobs: copy every step workspace's blobs of each RecurrentNetwork op of `net`
    (a NetDef or NetBuilder, already run in `ws`) into `ws` as `<prefix>_<blob><t>`; returns their names."""
    proto = net.proto() if isinstance(net, NetBuilder) else net
    names, count = [], 1
    for op in proto.op:
        if op.type != "RecurrentNetwork":
            continue
        out = f"{prefix}_{count}"
        count += 1
        ws.run_operator_once(OperatorDef(type="RecurrentNetworkBlobFetcher", input=[op.output[-1]], output=[out],
                                         arg=[make_argument("prefix", prefix)]))
        names += [n.decode("utf-8") for n in ws.fetch(out).tolist()]
    return names


def apply_over_sequence(model, cell, inputs, seq_lengths=None, initial_states=None, outputs_with_grads=None,
                        forward_only: bool = False, unroll: int | None = None) -> list:
    """RNNCell.apply_over_sequence: the input projection over all steps, the step net (`input_t`, `timestep`
    and `<state>_prev` as its inputs, scoped by the model's current name scope), then one RecurrentNetwork op
    (or `unroll` static copies of the step). Returns (state_1_all, state_1_last, state_2_all, ...)."""
    outer = model.scope.scoped
    if initial_states is None:
        initial_states = cell.initial_states(model, outer(f"{cell.name}/" if cell.name else ""))
    states_prev = [BlobRef(outer(s + "_prev")) for s in cell.get_state_names()]
    if len(initial_states) != len(states_prev):
        raise ArgumentError(f"{len(initial_states)} initial states given for the {len(states_prev)} recurrent "
                            f"states {[str(s) for s in states_prev]}")
    initial_states = [BlobRef(str(b)) for b in initial_states]
    prepared = cell.prepare_input(model, model.net, BlobRef(str(inputs)))
    step_scope = Scope()
    step_scope.names = list(model.scope.names)
    step_scope.device = model.scope.device   # step ops run where the model's ops do (Caffe2's DeviceScope)
    step = NetBuilder(cell.name or "step", step_scope)
    input_t, timestep = BlobRef(outer("input_t")), BlobRef(outer("timestep"))
    step.add_external_inputs(input_t, timestep, *states_prev)
    states = cell.apply(model, step, input_t, seq_lengths, states_prev, timestep)
    step.add_external_outputs(*(s for s in states if s not in step.external_outputs))
    if outputs_with_grads is None:
        outputs_with_grads = [2 * cell.output_index]
    links = dict(zip(states_prev, states, strict=True))
    initial = list(zip(states_prev, initial_states, strict=True))
    if unroll is not None:
        from .unroll import unroll_step_net
        return unroll_step_net(model, step, [(input_t, prepared)], initial, links,
                               unroll, timestep=timestep, outputs_with_grads=outputs_with_grads)
    return recurrent_net(model.net, step, [(input_t, prepared)], initial, links,
                         timestep=timestep, scope=cell.name, outputs_with_grads=outputs_with_grads,
                         recompute_blobs_on_backward=cell.recompute_blobs, forward_only=forward_only)


def _layers(cell_class, dim_in, dim_out, scope, **kwargs):
    dims = list(dim_out) if isinstance(dim_out, (list, tuple)) else [dim_out]
    if not dims:
        raise ArgumentError("dim_out is empty: give the hidden size of each layer")
    cells = [cell_class(dim_in if i == 0 else dims[i - 1], d, name=scope if len(dims) == 1 else None, **kwargs)
             for i, d in enumerate(dims)]
    return (cells[0] if len(dims) == 1 else MultiRNNCell(cells, scope)), len(dims)


def _run(model, cell, layers, per_layer, input_blob, seq_lengths, initial_states, outputs_with_grads,
         forward_only, return_last_layer_only, static_rnn_unroll_size):
    """rnn_cell._LSTM's tail: outputs_with_grads index the last layer's outputs."""
    first = per_layer * (layers - 1)
    result = apply_over_sequence(model, cell, input_blob, seq_lengths, initial_states,
                                 [first + i for i in outputs_with_grads], forward_only, static_rnn_unroll_size)
    return list(result[first:] if return_last_layer_only else result)


def lstm(model, input_blob, seq_lengths, initial_states, dim_in: int, dim_out, scope: str = "LSTM",
         outputs_with_grads=(0,), memory_optimization: bool = False, forget_bias: float = 0.0,
         forward_only: bool = False, drop_states: bool = False, return_last_layer_only: bool = True,
         static_rnn_unroll_size: int | None = None):
    """rnn_cell.LSTM over a T x N x dim_in sequence: the i2h FC over all timesteps, then one RecurrentNetwork
    whose step net is FC(hidden_t_prev) + input_t -> LSTMUnit per layer. dim_out: the hidden size, or a list
    (one per layer: Caffe2's MultiRNNCell layout, one op for all layers). initial_states: (h0, c0) per layer,
    or None for trainable zero states. Returns (hidden_all, hidden_last, cell_all, cell_last) of the last layer
    (of every layer, in order, with return_last_layer_only=False). model is a ModelBuilder."""
    cell, layers = _layers(LSTMCell, dim_in, dim_out, scope, forget_bias=forget_bias,
                           memory_optimization=memory_optimization, drop_states=drop_states)
    return _run(model, cell, layers, 4, input_blob, seq_lengths, initial_states, outputs_with_grads,
                forward_only, return_last_layer_only, static_rnn_unroll_size)


def gru(model, input_blob, seq_lengths, initial_states, dim_in: int, dim_out: int, scope: str = "GRU",
        outputs_with_grads=(0,), forward_only: bool = False, drop_states: bool = False,
        linear_before_reset: bool = False, static_rnn_unroll_size: int | None = None):
    """gru_cell.GRU (one layer): i2h FC to 3H over all timesteps, then a RecurrentNetwork whose step computes
    the reset, update and output gates and GRUUnit. initial_states: (h0,) or None. Returns (h_all, h_last)."""
    if isinstance(dim_out, (list, tuple)):
        raise ArgumentError("gru builds one layer (Caffe2's GRU indexes outputs as if each layer had 4); "
                            "give dim_out as an int")
    cell = GRUCell(dim_in, dim_out, drop_states=drop_states, linear_before_reset=linear_before_reset, name=scope)
    return _run(model, cell, 1, 2, input_blob, seq_lengths, initial_states, outputs_with_grads, forward_only,
                True, static_rnn_unroll_size)


def basic_rnn(model, input_blob, seq_lengths, initial_states, dim_in: int, dim_out: int,
              scope: str = "BasicRNN", activation: str = "tanh", outputs_with_grads=(0,),
              forward_only: bool = False, drop_states: bool = False, static_rnn_unroll_size: int | None = None):
    """rnn_cell.BasicRNN (one layer): h_t = tanh or relu(FC(h_{t-1}) + i2h(x_t)), rows past seq_lengths masked.
    With seq_lengths the net is forward-only, as in Caffe2 (see BasicRNNCell). Returns (h_all, h_last)."""
    if seq_lengths is not None and not forward_only:
        raise ArgumentError("basic_rnn with seq_lengths has no backward pass (Caffe2 builds its masking with "
                            "Casts that have no gradient); pass forward_only=True, or seq_lengths=None")
    if initial_states is None:
        raise ArgumentError("basic_rnn needs initial_states (Caffe2's BasicRNNCell has no initializer)")
    cell = BasicRNNCell(dim_in, dim_out, activation=activation, drop_states=drop_states, name=scope)
    return _run(model, cell, 1, 2, input_blob, seq_lengths, initial_states, outputs_with_grads, forward_only,
                True, static_rnn_unroll_size)
