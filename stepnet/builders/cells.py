"""Recurrent cells that write Caffe2's step nets (rnn_cell.py / gru_cell.py, spec §5.2): LSTM, GRU, BasicRNN
and a stack of them (MultiRNNCell). A cell adds one timestep's ops to a step net and names every blob and
parameter exactly as Caffe2's cell does, so nets built here match real Caffe2 files op for op.

A cell is used by `rnn_cell.apply_over_sequence`: `prepare_input` runs once over the whole T x N x D input
(the i2h FC), `apply` writes the step, `initial_states` makes trainable zero states when none are given.
Blob names are scoped by the NetBuilder's name scope; parameters are created in the model's init net under
the same (fully written out) names, as Caffe2's step ModelHelper does with `param_model`.
"""
from __future__ import annotations

import contextlib

from .builder import BlobRef, NetBuilder
from ..core.errors import ArgumentError
from .model import XAVIER, ZEROS

FLOAT = 1  # TensorProto.FLOAT


def fc(model, net: NetBuilder, x, out: str, dim_in: int, dim_out: int):
    """brew.fc(..., axis=2): `<scope>/<out>` = FC(x, `<scope>/<out>_w`, `<scope>/<out>_b`), params in the
    model's init net (XavierFill weight dim_out x dim_in, zero bias)."""
    name = net.scope.scoped(out)
    w = model.create_param(BlobRef(name + "_w"), [dim_out, dim_in], XAVIER)
    b = model.create_param(BlobRef(name + "_b"), [dim_out], ZEROS)
    return net.FC([BlobRef(x), w, b], BlobRef(name), axis=2)


class Cell:
    """One recurrent layer. `name` scopes its blobs (None inside a MultiRNNCell, which scopes them itself)."""

    state_names: tuple = ()
    output_index = 0

    def __init__(self, input_size: int, hidden_size: int, name: str | None = None, drop_states: bool = False):
        self.input_size, self.hidden_size = int(input_size), int(hidden_size)
        self.name = name
        self.drop_states = bool(drop_states)
        self.recompute_blobs: list = []

    def scope(self, name: str) -> str:
        return f"{self.name}/{name}" if self.name else name

    def get_state_names(self) -> list[str]:
        return [self.scope(s) for s in self.state_names]

    def gates(self) -> int:
        return self.hidden_size

    def prepare_input(self, model, net: NetBuilder, x):
        """The input projection over all timesteps: FC(axis=2) to the gate width, named `<name>/i2h`."""
        return fc(model, net, x, self.scope("i2h"), self.input_size, self.gates())

    def initial_states(self, model, prefix: str) -> list:
        """Trainable 1-D zero states (Caffe2's LSTMInitializer / GRUInitializer), `<prefix>initial_<state>`."""
        raise ArgumentError(f"{type(self).__name__} has no initializer in Caffe2: pass initial_states")

    def _zero_state(self, model, name: str):
        return model.create_param(BlobRef(name), [self.hidden_size], ZEROS)

    def apply(self, model, step: NetBuilder, input_t, seq_lengths, states, timestep) -> list:
        with step.name_scope(self.name) if self.name else contextlib.nullcontext():
            return self._apply(model, step, input_t, seq_lengths, [BlobRef(s) for s in states], timestep)

    def _apply(self, model, step, input_t, seq_lengths, states, timestep) -> list:
        raise NotImplementedError


class LSTMCell(Cell):
    """FC(hidden_t_prev) -> gates_t, Sum(gates_t, input_t) in place, LSTMUnit -> hidden_state, cell_state."""

    state_names = ("hidden_t", "cell_t")

    def __init__(self, input_size, hidden_size, forget_bias=0.0, memory_optimization=False, drop_states=False,
                 name=None):
        super().__init__(input_size, hidden_size, name, drop_states)
        self.forget_bias = float(forget_bias)
        self.memory_optimization = bool(memory_optimization)

    def gates(self) -> int:
        return 4 * self.hidden_size

    def initial_states(self, model, prefix):
        return [self._zero_state(model, prefix + "initial_hidden_state"),
                self._zero_state(model, prefix + "initial_cell_state")]

    def _apply(self, model, step, input_t, seq_lengths, states, timestep):
        h_prev, c_prev = states
        gates = fc(model, step, h_prev, "gates_t", self.hidden_size, self.gates())
        step.Sum([gates, BlobRef(input_t)], gates)
        seq = [BlobRef(seq_lengths)] if seq_lengths is not None else []
        h, c = step.LSTMUnit([h_prev, c_prev, gates] + seq + [BlobRef(timestep)], ["hidden_state", "cell_state"],
                             forget_bias=self.forget_bias, drop_states=int(self.drop_states),
                             sequence_lengths=int(seq_lengths is not None))
        step.add_external_outputs(h, c)
        if self.memory_optimization:
            self.recompute_blobs = [gates]
        return [h, c]


class GRUCell(Cell):
    """gru_cell.GRUCell: the input's reset/update/output parts (Split), FC(h_prev) for reset and update, the
    reset gate applied before the output FC (or after it with linear_before_reset), then GRUUnit."""

    state_names = ("hidden_t",)

    def __init__(self, input_size, hidden_size, drop_states=False, linear_before_reset=False, name=None):
        super().__init__(input_size, hidden_size, name, drop_states)
        self.linear_before_reset = bool(linear_before_reset)

    def gates(self) -> int:
        return 3 * self.hidden_size

    def initial_states(self, model, prefix):
        return [self._zero_state(model, prefix + "initial_hidden_state")]

    def _apply(self, model, step, input_t, seq_lengths, states, timestep):
        (h_prev,) = states
        H = self.hidden_size
        x_reset, x_update, x_output = step.Split(
            [BlobRef(input_t)], ["input_t_reset", "input_t_update", "input_t_output"], axis=2)
        reset = fc(model, step, h_prev, "reset_gate_t", H, H)
        update = fc(model, step, h_prev, "update_gate_t", H, H)
        reset = step.Sum([reset, x_reset], "reset_gate_t")
        reset_sigmoid = step.Sigmoid([reset], "reset_gate_t_sigmoid")
        if self.linear_before_reset:
            out_fc = fc(model, step, h_prev, "output_gate_t", H, H)
            output = step.Mul([reset_sigmoid, out_fc], "output_gate_t_mul")
        else:
            modified = step.Mul([reset_sigmoid, h_prev], "modified_hidden_t_prev")
            output = fc(model, step, modified, "output_gate_t", H, H)
        update = step.Sum([update, x_update], "update_gate_t")
        output = step.Sum([output, x_output], "output_gate_t_summed")
        gates, _ = step.Concat([reset, update, output], ["gates_t", "_gates_t_concat_dims"], axis=2)
        seq = [BlobRef(seq_lengths)] if seq_lengths is not None else []
        # Caffe2's gru_cell also passes forget_bias, which GRUUnit does not read; it is left out here
        h = step.GRUUnit([h_prev, gates] + seq + [BlobRef(timestep)], ["hidden_t"],
                         drop_states=int(self.drop_states), sequence_lengths=int(seq_lengths is not None))
        step.add_external_outputs(h)
        return [h]


class BasicRNNCell(Cell):
    """rnn_cell.BasicRNNCell: hidden_t = act(FC(hidden_t_prev) + input_t). With seq_lengths, rows past their
    length are masked with GT/LE -> Cast -> Mul (-> Add of the carried state unless drop_states), as Caffe2
    builds it. That masking has no backward pass in Caffe2 (its Casts carry no from_type, and hidden_t is
    overwritten in place by the Add), so it is forward-only there and here."""

    state_names = ("hidden_t",)

    def __init__(self, input_size, hidden_size, activation="tanh", drop_states=False, name=None):
        super().__init__(input_size, hidden_size, name, drop_states)
        if activation not in ("tanh", "relu"):
            raise ArgumentError(f"BasicRNN activation must be 'tanh' or 'relu', got {activation!r}")
        self.activation = activation

    def _apply(self, model, step, input_t, seq_lengths, states, timestep):
        (h_prev,) = states
        gates = fc(model, step, h_prev, "gates_t", self.hidden_size, self.hidden_size)
        step.Sum([gates, BlobRef(input_t)], gates)
        act = step.Tanh if self.activation == "tanh" else step.Relu
        hidden = act([gates], "hidden_t")
        if seq_lengths is not None:
            seq = BlobRef(seq_lengths)
            ts = step.CopyFromCPUInput([BlobRef(timestep)], "timestep_gpu")
            valid_b = step.GT([seq, ts], "valid_b", broadcast=1)
            invalid_b = step.LE([seq, ts], "invalid_b", broadcast=1)
            valid = step.Cast([valid_b], "valid", to="float")
            invalid = step.Cast([invalid_b], "invalid", to="float")
            hidden_valid = step.Mul([hidden, valid], "hidden_valid", broadcast=1, axis=1)
            if self.drop_states:
                hidden = hidden_valid
            else:
                hidden_invalid = step.Mul([h_prev, invalid], "hidden_invalid", broadcast=1, axis=1)
                hidden = step.Add([hidden_valid, hidden_invalid], hidden)
        return [hidden]


class MultiRNNCell(Cell):
    """Layers stacked in one step net: layer i's blobs and params under `<name>/layer_<i>/`; layer 0's input
    projection runs outside (unscoped `i2h`, as in facebookarchive/caffe2), layers > 0 compute theirs inside
    the step from the layer below's output. Recurrent states: every layer's, in layer order."""

    def __init__(self, cells, name: str):
        if not name:
            raise ArgumentError("a multi-layer cell needs a scope name")
        super().__init__(cells[0].input_size, cells[-1].hidden_size, name)
        self.cells = list(cells)
        self.output_index = sum(len(c.state_names) for c in self.cells[:-1]) + self.cells[-1].output_index

    def get_state_names(self):
        return [f"{self.name}/layer_{i}/{s}" for i, c in enumerate(self.cells) for s in c.get_state_names()]

    def prepare_input(self, model, net, x):
        return self.cells[0].prepare_input(model, net, x)

    def initial_states(self, model, prefix):
        states = []
        for i, cell in enumerate(self.cells):
            states += cell.initial_states(model, f"{prefix}layer_{i}/")
        return states

    def apply(self, model, step, input_t, seq_lengths, states, timestep):
        out, k, layer_input = [], 0, BlobRef(input_t)
        for i, cell in enumerate(self.cells):
            n = len(cell.state_names)
            with step.name_scope(self.name), step.name_scope(f"layer_{i}"):
                prepared = cell.prepare_input(model, step, layer_input) if i > 0 else layer_input
                next_states = cell.apply(model, step, prepared, seq_lengths, states[k:k + n], timestep)
            layer_input = next_states[cell.output_index]
            out += next_states
            k += n
        return out
