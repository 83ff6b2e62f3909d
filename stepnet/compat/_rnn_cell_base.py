"""Caffe2's rnn_cell.RNNCell and the cells that wrap other cells: MultiRNNCell (layers in one step net),
DropoutCell (dropout on the output only) and UnrolledCell (the step written out T times).

A cell writes one timestep into a step model (`_apply`); `apply_over_sequence` turns that step into one
RecurrentNetwork op through compat.recurrent.recurrent_net. Blob names follow Caffe2's: a cell's blobs are scoped
by its name (`<name>/<blob>`), the step's inputs are `input_t`, `timestep` and `<state>_prev` in the name scope of
the call, and the op's outputs are `<state output>_all` / `_last` per recurrent state.
"""
from __future__ import annotations

import inspect

from ..builders.builder import BlobRef
from ..builders.unroll import unroll_step_net
from . import brew, core, recurrent, scope
from .model_helper import ModelHelper
from .modeling.initializers import Initializer


def _rectify_name(blob):
    """A string is a blob of the current name scope; a BlobReference is kept (so later scopes leave it)."""
    if blob is None:
        return None
    if isinstance(blob, BlobRef):
        return blob if isinstance(blob, core.BlobReference) else core.BlobReference(str(blob))
    if isinstance(blob, str):
        return core.ScopedBlobReference(blob)
    raise TypeError(f"a blob must be a name or a BlobReference, got {type(blob).__name__}")


def _rectify_names(blobs):
    return None if blobs is None else [_rectify_name(b) for b in blobs]


class RNNCell:
    """A recurrent step. Subclasses write the step in apply_override (called in the cell's name scope) or in
    _apply (scoping names themselves), and name their states in get_state_names_override (or get_state_names)."""

    def __init__(self, name=None, forward_only=False, initializer=None):
        self.name = name
        self.recompute_blobs = []
        self.forward_only = forward_only
        self._initializer = initializer

    @property
    def initializer(self):
        return self._initializer

    @initializer.setter
    def initializer(self, value):
        self._initializer = value

    def scope(self, name):
        return name if self.name is None else f"{self.name}/{name}"

    def apply_over_sequence(self, model, inputs, seq_lengths=None, initial_states=None, outputs_with_grads=None):
        """Add the RecurrentNetwork op over the T x N x D inputs to model.net; returns (the output sequence,
        (state_1_all, state_1_last, state_2_all, ...)). initial_states None: the initializer's trainable ones."""
        if initial_states is None:
            with scope.NameScope(self.name or ""):
                if self.initializer is None:
                    raise ValueError("Either initial states or initializer have to be set")
                initial_states = self.initializer.create_states(model)
        prepared = self.prepare_input(model, inputs)
        step_model = ModelHelper(name=self.name, param_model=model)
        input_t, timestep = step_model.net.AddScopedExternalInputs("input_t", "timestep")
        names = list(self.get_state_names())
        if len(initial_states) != len(names):
            raise ValueError(f"{len(initial_states)} initial state values given for the {len(names)} states "
                             f"{names}: the numbers must match")
        states_prev = step_model.net.AddScopedExternalInputs(*[n + "_prev" for n in names])
        states = self._apply(model=step_model, input_t=input_t, seq_lengths=seq_lengths, states=states_prev,
                             timestep=timestep)
        declared = set(step_model.net.Proto().external_output)
        for state in states:
            if str(state) not in declared:
                step_model.net.AddExternalOutput(state)
        if outputs_with_grads is None:
            outputs_with_grads = [2 * self.get_output_state_index()]
        all_states = recurrent.recurrent_net(
            net=model.net, cell_net=step_model.net, inputs=[(input_t, prepared)],
            initial_cell_inputs=list(zip(states_prev, initial_states)), links=dict(zip(states_prev, states)),
            timestep=timestep, scope=self.name, forward_only=self.forward_only,
            outputs_with_grads=outputs_with_grads, recompute_blobs_on_backward=self.recompute_blobs)
        return self._prepare_output_sequence(model, all_states), all_states

    def apply(self, model, input_t, seq_lengths, states, timestep):
        """One step added to model directly (no RecurrentNetwork): returns (output, states)."""
        input_t = self.prepare_input(model, input_t)
        states = self._apply(model, input_t, seq_lengths, states, timestep)
        return self._prepare_output(model, states), states

    def _apply(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        """apply_override in the cell's name scope, the blobs it is given kept as they are."""
        args = self._rectify_apply_inputs(input_t, seq_lengths, states, timestep, extra_inputs)
        with core.NameScope(self.name or ""):
            return self.apply_override(model, *args)

    def _rectify_apply_inputs(self, input_t, seq_lengths, states, timestep, extra_inputs):
        input_t, seq_lengths, timestep = _rectify_names([input_t, seq_lengths, timestep])
        states = _rectify_names(states)
        if extra_inputs:
            blobs, sizes = zip(*extra_inputs)
            extra_inputs = list(zip(_rectify_names(blobs), sizes))
        rectified = [input_t, seq_lengths, states, timestep]
        if "extra_inputs" in inspect.signature(self.apply_override).parameters:
            rectified.append(extra_inputs)
        return rectified

    def apply_override(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        """One step (input_t: 1 x N x D); returns the new states. extra_inputs: [(blob, dim)] the step also
        reads (not prepared), e.g. an attention context."""
        raise NotImplementedError("Abstract method")

    def prepare_input(self, model, input_blob):
        """What depends on the input only, computed once over the whole sequence (default: the input)."""
        return input_blob

    def get_output_state_index(self):
        return 0

    def get_state_names(self):
        return [self.scope(s) for s in self.get_state_names_override()]

    def get_state_names_override(self):
        raise NotImplementedError("Abstract method")

    def get_output_dim(self):
        raise NotImplementedError("Abstract method")

    def _prepare_output(self, model, states):
        return states[self.get_output_state_index()]

    def _prepare_output_sequence(self, model, state_outputs):
        """state_outputs alternate (all steps, last step) per state, hence the factor 2."""
        return state_outputs[2 * self.get_output_state_index()]


class LSTMInitializer:
    """Trainable zero initial states: `initial_hidden_state` and `initial_cell_state` (hidden_size each)."""

    def __init__(self, hidden_size):
        self.hidden_size = hidden_size

    def create_states(self, model):
        return [model.create_param(param_name=name, shape=[self.hidden_size],
                                   initializer=Initializer(operator_name="ConstantFill", value=0.0))
                for name in ("initial_hidden_state", "initial_cell_state")]


class DropoutCell(RNNCell):
    """internal_cell with dropout on its output (not on the recurrent connection of that state)."""

    def __init__(self, internal_cell, dropout_ratio=None, use_cudnn=False, **kwargs):
        if "is_test" not in kwargs:
            raise ValueError("Argument 'is_test' is required")
        self.internal_cell = internal_cell
        self.dropout_ratio = dropout_ratio
        self.is_test = kwargs.pop("is_test")
        self.use_cudnn = use_cudnn
        super().__init__(**kwargs)
        self.prepare_input = internal_cell.prepare_input
        self.get_output_state_index = internal_cell.get_output_state_index
        self.get_state_names = internal_cell.get_state_names
        self.get_output_dim = internal_cell.get_output_dim
        self.mask = 0

    def _apply(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        return self.internal_cell._apply(model, input_t, seq_lengths, states, timestep, extra_inputs)

    def _prepare_output(self, model, states):
        output = self.internal_cell._prepare_output(model, states)
        return output if self.dropout_ratio is None else self._apply_dropout(model, output)

    def _prepare_output_sequence(self, model, state_outputs):
        output = self.internal_cell._prepare_output_sequence(model, state_outputs)
        return output if self.dropout_ratio is None else self._apply_dropout(model, output)

    def _apply_dropout(self, model, output):
        if self.dropout_ratio and not self.forward_only:
            with core.NameScope(self.name or ""):
                output = brew.dropout(model, output, f"{output}_with_dropout_mask{self.mask}",
                                      ratio=float(self.dropout_ratio), is_test=self.is_test,
                                      use_cudnn=self.use_cudnn)
                self.mask += 1
        return output


class MultiRNNCellInitializer:
    def __init__(self, cells):
        self.cells = cells

    def create_states(self, model):
        states = []
        for i, cell in enumerate(self.cells):
            if cell.initializer is None:
                raise ValueError("Either initial states or initializer have to be set")
            with core.NameScope(f"layer_{i}"), core.NameScope(cell.name or ""):
                states.extend(cell.initializer.create_states(model))
        return states


class MultiRNNCell(RNNCell):
    """Layers in one step: each layer's output (its first state's output) is the next one's input, scoped
    `<name>/layer_<i>/`. residual_output_layers: layers (never 0) whose input is added to their output."""

    def __init__(self, cells, residual_output_layers=None, **kwargs):
        super().__init__(**kwargs)
        self.cells = cells
        self.residual_output_layers = list(residual_output_layers or [])
        per_layer, base = [], 0
        for cell in cells:
            per_layer.append(base + cell.get_output_state_index())
            base += len(cell.get_state_names())
        # the output is the sum of the last layer and the unbroken run of residual layers just below it
        self.output_connected_layers, self.output_indices = [], []
        for i in range(len(cells) - 1):
            if i + 1 in self.residual_output_layers:
                self.output_connected_layers.append(i)
                self.output_indices.append(per_layer[i])
            else:
                self.output_connected_layers, self.output_indices = [], []
        self.output_connected_layers.append(len(cells) - 1)
        self.output_indices.append(per_layer[-1])
        self.state_names = [self.layer_scoper(i)(n) for i, cell in enumerate(cells)
                            for n in cell.get_state_names()]
        self.initializer = MultiRNNCellInitializer(cells)

    def layer_scoper(self, layer_id):
        return lambda name: f"{self.name}/layer_{layer_id}/{name}"

    def prepare_input(self, model, input_blob):
        input_blob = _rectify_name(input_blob)
        with core.NameScope(self.name or ""):
            return self.cells[0].prepare_input(model, input_blob)

    def _apply(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        input_t, seq_lengths, timestep = _rectify_names([input_t, seq_lengths, timestep])
        states = _rectify_names(states)
        if extra_inputs:
            blobs, sizes = zip(*extra_inputs)
            extra_inputs = list(zip(_rectify_names(blobs), sizes))
        counts = [len(cell.get_state_names()) for cell in self.cells]
        if len(states) != sum(counts):
            raise ValueError(f"{len(states)} states given to a MultiRNNCell whose layers have {sum(counts)}")
        next_states, k, layer_input = [], 0, input_t
        for i, cell in enumerate(self.cells):
            with core.NameScope(self.name or ""), core.NameScope(f"layer_{i}"):
                layer_states = states[k:k + counts[i]]
                k += counts[i]
                prepared = cell.prepare_input(model, layer_input) if i > 0 else layer_input
                layer_next = cell._apply(model, prepared, seq_lengths, layer_states, timestep,
                                         extra_inputs=None if i > 0 else extra_inputs)
                if i != len(self.cells) - 1:
                    layer_output = cell._prepare_output(model, layer_next)
                    if i > 0 and i in self.residual_output_layers:
                        layer_input = brew.sum(model, [layer_output, layer_input],
                                               self.scope(f"residual_output_{i}"))
                    else:
                        layer_input = layer_output
                next_states.extend(layer_next)
        return next_states

    def get_state_names(self):
        return self.state_names

    def get_output_state_index(self):
        return sum(len(c.get_state_names()) for c in self.cells[:-1]) + self.cells[-1].get_output_state_index()

    def _connected(self, model, states, width, prepare, name):
        outputs, k = [], 0
        for i, cell in enumerate(self.cells):
            n = width * len(cell.get_state_names())
            if i in self.output_connected_layers:
                outputs.append(getattr(cell, prepare)(model, states[k:k + n]))
            k += n
        return brew.sum(model, outputs, self.scope(name)) if len(outputs) > 1 else outputs[0]

    def _prepare_output(self, model, states):
        return self._connected(model, states, 1, "_prepare_output", "residual_output")

    def _prepare_output_sequence(self, model, states):
        return self._connected(model, states, 2, "_prepare_output_sequence", "residual_output_sequence")


class UnrolledCell(RNNCell):
    """cell written out T times in model.net (no RecurrentNetwork op); the same parameters at every step and the
    same outputs (`<state>_concat` over the steps, the last step's state)."""

    def __init__(self, cell, T):
        super().__init__(name=getattr(cell, "name", None))
        self.T = T
        self.cell = cell

    def apply_over_sequence(self, model, inputs, seq_lengths, initial_states, outputs_with_grads=None):
        prepared = self.cell.prepare_input(model, inputs)
        step_model = ModelHelper(name=self.cell.name, param_model=model)
        input_t, timestep = step_model.net.AddScopedExternalInputs("input_t", "timestep")
        names = list(self.cell.get_state_names())
        states_prev = step_model.net.AddScopedExternalInputs(*[n + "_prev" for n in names])
        states = self.cell._apply(model=step_model, input_t=input_t, seq_lengths=seq_lengths, states=states_prev,
                                  timestep=timestep)
        if outputs_with_grads is None:
            outputs_with_grads = [2 * self.cell.get_output_state_index()]
        outputs = unroll_step_net(model, step_model.net, [(input_t, prepared)],
                                  list(zip(states_prev, _rectify_names(initial_states))),
                                  dict(zip(states_prev, states)), self.T, timestep=timestep,
                                  outputs_with_grads=outputs_with_grads)
        outputs = tuple(core.BlobReference(str(o), model.net) for o in outputs)
        return self.cell._prepare_output_sequence(model, outputs), outputs
