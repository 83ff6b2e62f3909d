"""The compiled forms of the ops whose jitted arithmetic a workspace chose (Workspace.fused_cells; numba, the
`fast` extra): the cell ops (stepnet.kernels.lstm / .gru jit_step, the calls their interpreted fused kernels
make), Softmax's row kernel, Sigmoid's pass and FC of one row, writing into the program's buffers."""
from __future__ import annotations

import math

import numpy as np

from ..kernels import gru as gru_cell
from ..kernels import lstm as lstm_cell
from ..kernels import jit
from ..kernels.jit import F32
from .cell_forms import Fast, _begin, bound_args, gru_grad_params, gru_params, lstm_grad_params, lstm_params, shaped
from .products import fc_row


def _fused_form(step, params_of, seq_at: int, *flags, reads_first: bool = False):
    """The compiled maker of a fused step: the numpy forms' checks (params_of -> the step's parameters, the
    has_seq flag third from the end), float32 only; reads_first as Fast's."""
    def make(bop, ins, outs):
        k = jit.load()
        params = params_of(bop, ins, outs, *flags)
        if k is None or params is None or ins[0].dtype != F32:
            return None
        run, ended_at, bind = step(k, *flags, *params)
        return Fast(run, begin=_begin(ended_at, seq_at, params[-3]), reads_first=reads_first,
                    prebind=lambda ins, outs, fresh: None if fresh else bind(ins, outs))
    return make


def softmax(bop, ins, outs):
    """Softmax's row kernel straight into its output (the fused interpreted kernel's bits), float32."""
    k, x, a = jit.load(), ins[0], bound_args(bop)["axis"]
    if k is None or x.dtype != F32 or outs[0].dtype != F32 or not -x.ndim <= a < x.ndim:
        return None
    a %= x.ndim
    rows2 = (math.prod(x.shape[:a]), math.prod(x.shape[a:]))
    if not x.size or outs[0].size != x.size:
        return None
    kernel = k.softmax_rows

    def run(ins, outs):
        kernel(np.ascontiguousarray(ins[0]).reshape(rows2), shaped(outs[0], rows2))
    return Fast(run)


def sigmoid(bop, ins, outs):
    """Sigmoid's jitted pass straight into its output (the fused interpreted kernel's bits), float32; its
    scratch made once."""
    k, x = jit.load(), ins[0]
    if k is None or x.dtype != F32 or outs[0].dtype != F32 or outs[0].size != x.size:
        return None
    n, kernel = x.size, k.sigmoid
    y, bits = np.empty(n, F32), np.empty(n, np.int32)

    def run(ins, outs):
        kernel(np.ascontiguousarray(ins[0]).reshape(n), shaped(outs[0], (n,)), y, bits)
    return Fast(run)


FUSED = {
    "LSTMUnit": _fused_form(lstm_cell.jit_step, lstm_params, 3, False),
    "rnn_internal_lstm_unit": _fused_form(lstm_cell.jit_step, lstm_params, 3, True),
    "LSTMUnitGradient": _fused_form(lstm_cell.jit_grad_step, lstm_grad_params, 3, False),
    "rnn_internal_lstm_unit_gradient": _fused_form(lstm_cell.jit_grad_step, lstm_grad_params, 3, True,
                                                   reads_first=True),
    "GRUUnit": _fused_form(gru_cell.jit_step, gru_params, 2),
    "GRUUnitGradient": _fused_form(gru_cell.jit_grad_step, gru_grad_params, 2),
    "Softmax": softmax, "FC": fc_row, "Sigmoid": sigmoid,
}
