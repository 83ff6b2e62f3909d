"""The ops RecurrentNetwork inserts into step nets: link views, gradient accumulation into state-gradient
tensors, and the deferred weight gradient of a backward step net's FC (spec §3.6, §3.13)."""
from __future__ import annotations

import math

from .errors import ArgumentError, MissingBlobError, ShapeError
from .ops.registry import NO_GRADIENT, Arg, op
from .proto import NetDef, make_argument


# ------------------------------------------------------------------------------------------- link ops
@op("rnn_internal_apply_link", inputs=2, outputs=2, enforce_inplace=[(1, 1)], context=True, host_inputs=(0,),
    args={"offset": Arg("int"), "window": Arg("int")}, gradient=NO_GRADIENT)
def apply_link(ctx, xp, timestep, external, *, offset, window):
    """Point `internal` at rows [t + offset, t + offset + window) of `external` (a view: writes land there)."""
    _check_link_args(offset, window)
    set_links([(ctx.outputs[0], ctx.inputs[1], offset, window)], int(timestep.reshape(-1)[0]))
    return None, None


@op("rnn_internal_accumulate_gradient_input", inputs=3, outputs=1, enforce_inplace=[(2, 0)], context=True,
    host_inputs=(0,), args={"offset": Arg("int")}, gradient=NO_GRADIENT)
def accumulate_gradient_input(ctx, xp, timestep, og, g, *, offset):
    """g[t + offset] += og[t], in place (g is the state-gradient tensor that links view into)."""
    t = int(timestep.reshape(-1)[0])
    if offset < 0:
        raise ArgumentError(f"offset must be >= 0, got {offset}")
    if t >= og.shape[0] or t + offset >= g.shape[0]:
        raise ShapeError(f"timestep {t} + offset {offset} is outside the gradient tensors "
                         f"{tuple(og.shape)} / {tuple(g.shape)}")
    row = g[t + offset]
    row += og[t].reshape(row.shape)
    return None


def bind_links(step_ws, links) -> list:
    """(internal blob, external blob, offset, window) per link of a step workspace, bound as the link op's
    outputs and inputs would be (CreateBlob for the internal: an ancestor's blob of that name wins)."""
    bound = []
    for internal, external, offset, window in links:
        ext = step_ws.find(external)
        if ext is None:
            raise MissingBlobError(f"link {internal!r} -> {external!r}: blob {external!r} does not exist")
        _check_link_args(offset, window)
        bound.append((step_ws.create_blob(internal), ext, offset, window))
    return bound


def _check_link_args(offset: int, window: int) -> None:
    if offset < 0 or window < 0:
        raise ArgumentError(f"link offset ({offset}) and window ({window}) must be >= 0")


def set_links(bound, t: int) -> None:
    """Point every link internal at rows [t + offset, t + offset + window) of its external tensor: the work of
    Caffe2's rnn_internal_apply_link ops, done by the RecurrentNetwork loop without a dispatch per link."""
    for blob, ext, offset, window in bound:
        external = ext.value
        start = t + offset
        stop = start + window
        if external is None or not external.ndim or stop > external.shape[0] or not external.size:
            _link_error(blob, ext, start, stop, offset, window)
        blob.value = external[start:stop]
        blob.view = True


def _link_error(blob, ext, start: int, stop: int, offset: int, window: int):
    external = ext.value
    if external is None or not external.ndim or not external.size:
        raise ShapeError(f"linked tensor {ext.name!r} is empty; a link needs a tensor with rows")
    raise ShapeError(f"link {blob.name!r} -> {ext.name!r}: at timestep {start - offset} the window rows [{start}, "
                     f"{stop}) (offset {offset}, window {window}) run past the end of its "
                     f"{external.shape[0]} rows {tuple(external.shape)}")


# ------------------------------------------------------------------------------------------- saved LSTM
def lstm_pairs(step_net: NetDef, backward_net: NetDef, recompute) -> dict[str, str]:
    """{gates blob: activations blob} for every LSTMUnit of the step net whose LSTMUnitGradient in the backward
    step net reads the same states, gates, arguments and outputs, where nothing else writes the gates or the
    cell after the LSTMUnit and the gates are not recomputed on backward. Such a pair can run as
    rnn_internal_lstm_unit / rnn_internal_lstm_unit_gradient: the gradient then reads the activations the
    forward kept in the step workspace instead of recomputing them (same results, no second tanh pass)."""
    names = set()
    for net in (step_net, backward_net):
        names.update(net.external_input, net.external_output)
        for o in net.op:
            names.update(o.input, o.output)
    pairs = {}
    for k, u in enumerate(step_net.op):
        if u.type != "LSTMUnit" or len(u.input) < 4 or len(u.output) != 2:
            continue
        gates, cell, acts = u.input[2], u.output[1], u.input[2] + "_rnn_activations"
        later = list(step_net.op[k + 1:]) + list(backward_net.op)
        grads = [v for v in backward_net.op if v.type == "LSTMUnitGradient" and len(v.input) > 2
                 and v.input[2] == gates]
        if (gates in recompute or acts in names or gates in pairs or len(grads) != 1
                or any(gates in o.output or cell in o.output for o in later)
                or sum(o.type == "LSTMUnit" and o.input[2:3] == [gates] for o in step_net.op) != 1):
            continue
        v = grads[0]
        n = len(u.input)
        if (list(v.input[:n]) != list(u.input) or list(v.input[n:n + 2]) != list(u.output)
                or sorted(a.SerializeToString() for a in v.arg) != sorted(a.SerializeToString() for a in u.arg)):
            continue
        pairs[gates] = acts
    return pairs


def save_lstm_activations(net: NetDef, pairs: dict[str, str], forward: bool) -> None:
    """Substitute the saved forms for the pairs' LSTMUnit (forward) or LSTMUnitGradient (backward) ops."""
    for o in net.op:
        acts = pairs.get(o.input[2]) if len(o.input) > 2 else None
        if acts is None:
            continue
        if forward and o.type == "LSTMUnit":
            o.type = "rnn_internal_lstm_unit"
            o.output.append(acts)
        elif not forward and o.type == "LSTMUnitGradient":
            o.type = "rnn_internal_lstm_unit_gradient"
            o.input[2] = acts
            if acts not in net.external_input:
                net.external_input.append(acts)


# ------------------------------------------------------------------------------------------- deferred FC
class _DeferredFC:
    """An FCGradient of the backward step net whose weight/bias gradients only feed the `_tmpstep`
    accumulation Sums: per step it computes dX and keeps (X, dY); after the loop one GEMM over all timesteps
    gives the summed dW and db (the same sum, far fewer and larger matrix products)."""

    def __init__(self, collector: str, grad_w: str, grad_b: str):
        self.collector, self.grad_w, self.grad_b = collector, grad_w, grad_b

    def start(self, shared, T: int) -> None:
        """An empty collector for T steps (the previous run's buffers are kept, as Caffe2 keeps tensors)."""
        blob = shared.create_local_blob(self.collector)
        if isinstance(blob.value, _Rows):
            blob.value.reset(T)
        else:
            blob.value = _Rows(T)

    def finish(self, xp, ws, shared, fresh=()) -> None:
        """Add the summed dW and db into their gradient blobs (in place into a buffer listed in `fresh`, which
        the caller made for this run)."""
        rows = shared.find(self.collector).value
        if rows.xs is None or not rows.n:
            return
        xs, dys = rows.xs[:rows.n], rows.dys[:rows.n]
        for name, value in ((self.grad_w, dys.T @ xs), (self.grad_b, dys.sum(axis=0))):
            blob = ws.find(name)
            cur = blob.value
            value = value.reshape(cur.shape)
            if any(cur is f for f in fresh) and value.dtype == cur.dtype:
                cur += value
            else:
                blob.value = cur + value.astype(cur.dtype, copy=False)


class _Rows:
    """The (X, dY) rows of every timestep, written into buffers sized for T steps and kept across runs."""

    def __init__(self, T: int):
        self.T, self.n, self.xs, self.dys = T, 0, None, None

    def reset(self, T: int) -> None:
        self.T, self.n = T, 0

    def add(self, xp, x2, dy2) -> None:
        n, m = self.n, len(x2)
        xs = self.xs
        if (xs is None or n + m > len(xs) or xs.shape[1] != x2.shape[1] or self.dys.shape[1] != dy2.shape[1]
                or xs.dtype != x2.dtype or self.dys.dtype != dy2.dtype or type(xs) is not type(x2)):
            capacity = max(self.T * m, n + m)
            xs, dys = xp.empty((capacity, x2.shape[1]), x2.dtype), xp.empty((capacity, dy2.shape[1]), dy2.dtype)
            if n:
                xs[:n], dys[:n] = self.xs[:n], self.dys[:n]
            self.xs, self.dys = xs, dys
        xs[n:n + m] = x2
        self.dys[n:n + m] = dy2
        self.n = n + m


def _defer_fc_parameter_gradients(bnet: NetDef, param_grads) -> list:
    """Rewrite FCGradient ops whose dW and db are parameter `_tmpstep` gradients (used nowhere else) into
    rnn_internal_fc_gradient_deferred; drop their per-step accumulation Sums."""
    from .proto import argument_value

    tmp_to_grad = {tmp: grad for _, grad, tmp in param_grads}
    uses: dict[str, int] = {}
    for o in bnet.op:
        for name in list(o.input) + list(o.output):
            uses[name] = uses.get(name, 0) + 1
    deferred, drop = [], set()
    for o in bnet.op:
        if o.type != "FCGradient" or len(o.output) != 3:
            continue
        dw, db = o.output[0], o.output[1]
        if dw not in tmp_to_grad or db not in tmp_to_grad or uses[dw] != 2 or uses[db] != 2:
            continue
        args = {a.name: argument_value(a) for a in o.arg}
        collector = tmp_to_grad[dw] + "_rnn_deferred"
        x, w, dy = o.input
        dx = o.output[2]
        o.type = "rnn_internal_fc_gradient_deferred"
        o.input[:] = [x, w, dy, collector]
        o.output[:] = [dx]
        del o.arg[:]
        o.arg.extend([make_argument("axis", int(args.get("axis", 1))),
                      make_argument("axis_w", int(args.get("axis_w", 1)))])
        if collector not in bnet.external_input:
            bnet.external_input.append(collector)
        deferred.append(_DeferredFC(collector, tmp_to_grad[dw], tmp_to_grad[db]))
        drop.update((dw, db))
    if drop:
        keep = [o for o in bnet.op if not (o.type == "Sum" and len(o.input) == 2 and o.input[1] in drop)]
        del bnet.op[:]
        bnet.op.extend(keep)
    return deferred


@op("rnn_internal_fc_gradient_deferred", inputs=4, outputs=1, context=True, inplace=(),
    args={"axis": 1, "axis_w": 1}, gradient=NO_GRADIENT)
def fc_gradient_deferred(ctx, xp, x, w, dy, collector, *, axis, axis_w):
    """dX of FCGradient now; (X, dY) copied into the collector (views may change later) for dW, db."""
    a = axis + x.ndim if axis < 0 else axis
    aw = axis_w + w.ndim if axis_w < 0 else axis_w
    m, k, n = math.prod(x.shape[:a]), math.prod(x.shape[a:]), math.prod(w.shape[:aw])
    if dy.size != m * n or w.size != n * k:
        raise ShapeError(f"FCGradient: X {tuple(x.shape)}, W {tuple(w.shape)} and dY {tuple(dy.shape)} do not fit")
    x2, dy2 = x.reshape(m, k), dy.reshape(m, n)
    collector.add(xp, x2, dy2)
    return xp.matmul(dy2, w.reshape(n, k)).reshape(x.shape)
