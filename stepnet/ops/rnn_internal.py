"""The ops RecurrentNetwork's step-net rewrites (stepnet.graph.step_nets) put into step nets: link views,
gradient accumulation into state-gradient tensors, and the deferred FC weight gradient (spec §3.6, §3.13).
They are in place by definition: a link's internal is a view into its external tensor, and the accumulating
ops write into the tensors they name as both input and output."""
from __future__ import annotations

from ..core.errors import ArgumentError, ShapeError
from ..kernels.fc import input_gradient_into
from .math_grad import fc_grad_dims
from .registry import NO_GRADIENT, Arg, op


# ------------------------------------------------------------------------------------------- links
def _check_link_args(offset: int, window: int) -> None:
    if offset < 0 or window < 0:
        raise ArgumentError(f"link offset ({offset}) and window ({window}) must be >= 0")


def _link_error(internal: str, external_name: str, external, start: int, stop: int, offset: int, window: int):
    if external is None or not external.ndim or not external.size:
        raise ShapeError(f"linked tensor {external_name!r} is empty; a link needs a tensor with rows")
    raise ShapeError(f"link {internal!r} -> {external_name!r}: at timestep {start - offset} the window rows [{start}, "
                     f"{stop}) (offset {offset}, window {window}) run past the end of its "
                     f"{external.shape[0]} rows {tuple(external.shape)}")


def _timestep(timestep) -> int:
    return int(timestep.flat[0])


@op("rnn_internal_apply_link", inputs=2, outputs=2, enforce_inplace=[(1, 1)], context=True, host_inputs=(0,),
    args={"offset": Arg("int"), "window": Arg("int")}, gradient=NO_GRADIENT)
def apply_link(ctx, xp, timestep, external, *, offset, window):
    """Point `internal` at rows [t + offset, t + offset + window) of `external` (a view: writes land there)."""
    _check_link_args(offset, window)
    t = _timestep(timestep)
    start, stop = t + offset, t + offset + window
    if external is None or not external.ndim or stop > external.shape[0] or not external.size:
        _link_error(ctx.opdef.output[0], ctx.opdef.input[1], external, start, stop, offset, window)
    ctx.outputs[0].set_view(external[start:stop])
    return None, None


@op("rnn_internal_apply_links", inputs=(1, None), outputs=(0, None), context=True, devices="any", host_inputs=(0,),
    args={"offsets": Arg("ints"), "windows": Arg("ints"), "keep": Arg("ints", []), "cyclic": Arg("ints", []),
          "zeroed": Arg("ints", [])}, gradient=NO_GRADIENT)
def apply_links(ctx, xp, timestep, *externals, offsets, windows, keep, cyclic, zeroed):
    """timestep, external_1..k -> internal_1..k: every link of a step net in one op, internal j a view of rows
    [t + offsets[j], t + offsets[j] + windows[j]) of external j (the work of k rnn_internal_apply_link ops).
    keep (1 per link, optional): the external is the same array run after run, so a compiled run may keep the
    views it made (a hint; the views are the same either way). cyclic (optional): rows counted modulo the
    external's rows (a state gradient the op keeps as 2 rows); zeroed (optional): that view filled with zeros."""
    links = ctx.state.get("links") or _links_of(ctx, externals, offsets, windows, keep, cyclic, zeroed)
    t = int(timestep.flat[0])
    for (blob, offset, window, roll, zero), external in zip(links, externals):
        start = t + offset
        if roll and external is not None and external.ndim and external.shape[0]:
            start %= external.shape[0]
        stop = start + window
        if external is None or not external.ndim or stop > external.shape[0] or not external.size:
            name = ctx.opdef.input[1 + [link[0] for link in links].index(blob)]
            _link_error(blob.name, name, external, start, stop, offset, window)
        view = external[start:stop]
        if zero:
            view[...] = 0
        blob.value = view
        blob.view = True
    return None


def _links_of(ctx, externals, offsets, windows, keep, cyclic, zeroed) -> tuple:
    """(internal blob, offset, window, cyclic, zeroed) per link, checked once and kept in the op's state."""
    flags = (keep, cyclic, zeroed)
    if not len(externals) == len(ctx.outputs) == len(offsets) == len(windows) or any(
            len(f) not in (0, len(offsets)) for f in flags):
        raise ArgumentError(f"{len(externals)} linked tensors, {len(ctx.outputs)} link blobs, {len(offsets)} "
                            f"offsets, {len(windows)} windows and {len(keep)} / {len(cyclic)} / {len(zeroed)} "
                            "keep / cyclic / zeroed flags: give one of each per link (the flags may be left out)")
    for offset, window in zip(offsets, windows):
        _check_link_args(offset, window)
    cyclic, zeroed = list(cyclic) or [0] * len(offsets), list(zeroed) or [0] * len(offsets)
    links = ctx.state["links"] = tuple(zip(ctx.outputs, offsets, windows, cyclic, zeroed))
    return links


# ------------------------------------------------------------------------------------------- accumulation
@op("rnn_internal_accumulate_gradient_input", inputs=3, outputs=1, enforce_inplace=[(2, 0)], host_inputs=(0,),
    args={"offset": Arg("int"), "cyclic": 0}, gradient=NO_GRADIENT, shapes_from_inputs=True)
def accumulate_gradient_input(xp, timestep, og, g, *, offset, cyclic):
    """g[t + offset] += og[t], in place (g is the state-gradient tensor that links view into; cyclic: row
    (t + offset) mod g's rows, a state gradient kept as 2 rows)."""
    t = _timestep(timestep)
    if offset < 0:
        raise ArgumentError(f"offset must be >= 0, got {offset}")
    row_at = (t + offset) % g.shape[0] if cyclic and g.ndim and g.shape[0] else t + offset
    if t >= og.shape[0] or row_at >= g.shape[0]:
        raise ShapeError(f"timestep {t} + offset {offset} is outside the gradient tensors "
                         f"{tuple(og.shape)} / {tuple(g.shape)}")
    row = g[row_at]
    row += og[t].reshape(row.shape)
    return None   # g holds the result: the op writes it in place


# ------------------------------------------------------------------------------------------- deferred FC
def _fc_dims(x, w, dy, axis: int, axis_w: int) -> tuple[int, int, int]:
    """(M, K, N) after FCGradient's own checks (float X, W and dY; axes in range; sizes that fit)."""
    return fc_grad_dims("FCGradient", x, w, dy, axis, axis_w, False)


def _steps(sequence) -> int:
    """T, the first dimension of the op's sequence input (T x ...)."""
    if sequence.ndim == 0:
        raise ShapeError(f"the sequence input must be T x ..., got a scalar of shape {tuple(sequence.shape)}")
    return sequence.shape[0]


def _rows(xp, rows, count: int, width: int, like):
    """rows when it is a (count x width) buffer of like's dtype and device (last run's, kept as Caffe2 keeps a
    tensor's memory), else a new one."""
    if (rows is None or rows.shape != (count, width) or rows.dtype != like.dtype
            or type(rows) is not type(like)):
        rows = xp.empty((count, width), like.dtype)
    return rows


@op("rnn_internal_fc_gradient_deferred", inputs=7, outputs=3, enforce_inplace=[(5, 1), (6, 2)], host_inputs=(0,),
    args={"axis": 1, "axis_w": 1}, gradient=NO_GRADIENT)
def fc_gradient_deferred(xp, timestep, sequence, x, w, dy, xs, dys, *, axis, axis_w):
    """timestep, sequence (T x ...), X, W, dY, X rows, dY rows -> dX, X rows, dY rows: FCGradient's dX now,
    and this step's X and dY copied into block T-1-t of the (T·M) x K and (T·M) x N row buffers (the order the
    backward loop visits the steps), from which rnn_internal_fc_weight_gradient forms dW and db."""
    m, k, n = _fc_dims(x, w, dy, axis, axis_w)
    T, t = _steps(sequence), _timestep(timestep)
    if not 0 <= t < T:
        raise ShapeError(f"timestep {t} is outside the {T} steps of the sequence {tuple(sequence.shape)}")
    new_xs, new_dys = _rows(xp, xs, T * m, k, x), _rows(xp, dys, T * m, n, dy)
    x2, dy2 = x.reshape(m, k), dy.reshape(m, n)
    block = (T - 1 - t) * m
    new_xs[block:block + m] = x2
    new_dys[block:block + m] = dy2
    dx = input_gradient_into(xp, dy2, w.reshape(n, k)).reshape(x.shape)
    return dx, (None if new_xs is xs else new_xs), (None if new_dys is dys else new_dys)  # None: kept in place


@op("rnn_internal_fc_weight_gradient", inputs=4, outputs=2, enforce_inplace=[(2, 0), (3, 1)], gradient=NO_GRADIENT)
def fc_weight_gradient(xp, xs, dys, dw, db):
    """X rows, dY rows, dW, db -> dW += dYᵀ·X, db += Σ dY rows, in place (the summed FC weight gradients of
    every timestep, after the backward loop)."""
    if xs.shape[0] != dys.shape[0] or dys.shape[1] * xs.shape[1] != dw.size or dys.shape[1] != db.size:
        raise ShapeError(f"X rows {tuple(xs.shape)} and dY rows {tuple(dys.shape)} do not fit dW {tuple(dw.shape)} "
                         f"and db {tuple(db.shape)}")
    for grad, value in ((dw, dys.T @ xs), (db, dys.sum(axis=0))):
        value = value.reshape(grad.shape)
        if value.dtype == grad.dtype:
            grad += value
        else:
            grad += value.astype(grad.dtype)
    return dw, db


@op("rnn_internal_fc_input_gradient", inputs=3, outputs=1, args={"axis": 1, "axis_w": 1}, gradient=NO_GRADIENT)
def fc_input_gradient(xp, x, w, dy, *, axis, axis_w):
    """X, W, dY -> dX = dY·W (shaped as X): FCGradient's input gradient alone, in a backward step net whose
    weight gradients are formed after the loop from the rows of the linked tensors X and dY view
    (rnn_internal_fc_weight_gradient_linked)."""
    m, k, n = _fc_dims(x, w, dy, axis, axis_w)
    return input_gradient_into(xp, dy.reshape(m, n), w.reshape(n, k)).reshape(x.shape)


@op("rnn_internal_fc_weight_gradient_linked", inputs=5, outputs=2, enforce_inplace=[(3, 0), (4, 1)],
    args={"x_offset": Arg("int"), "dy_offset": Arg("int")}, gradient=NO_GRADIENT)
def fc_weight_gradient_linked(xp, sequence, x_states, dy_states, dw, db, *, x_offset, dy_offset):
    """sequence (T x ...), X's linked tensor, dY's linked tensor, dW, db -> dW += dYᵀ·X and db += Σ dY over
    rows [offset, offset + T) of each linked tensor, in place: after the backward loop, every timestep's X
    and dY are there already (the step viewed row offset + t of each), so no copy of them is kept."""
    T = _steps(sequence)
    for name, states, offset in (("X", x_states, x_offset), ("dY", dy_states, dy_offset)):
        if offset < 0 or states.ndim == 0 or states.shape[0] < offset + T:
            raise ShapeError(f"the {name} rows [{offset}, {offset + T}) run past the linked tensor "
                             f"{tuple(states.shape)} ({T} steps)")
    xs, dys = x_states[x_offset:x_offset + T], dy_states[dy_offset:dy_offset + T]
    n = db.size
    k = dw.size // n if n else 0
    rows = dys.size // n if n else 0
    if n * k != dw.size or dys.size != rows * n or xs.size != rows * k:
        raise ShapeError(f"X rows {tuple(xs.shape)} and dY rows {tuple(dys.shape)} do not fit dW {tuple(dw.shape)} "
                         f"and db {tuple(db.shape)}")
    return fc_weight_gradient(xp, xs.reshape(rows, k), dys.reshape(rows, n), dw, db)

