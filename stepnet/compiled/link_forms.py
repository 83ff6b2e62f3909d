"""The compiled forms of the recurrent ops' own step ops (stepnet.ops.rnn_internal): the link op, which points
each link internal at its rows of the external tensor, and the accumulate op, which adds the output gradient
into a state gradient's row. Same contract as forms.py."""
from __future__ import annotations

import numpy as np

from ..core.errors import ShapeError
from ..ops.rnn_internal import _link_error
from .cell_forms import Fast, bound_args, shaped


def apply_links(bop, ins, outs):
    args = bound_args(bop)
    offsets, windows = list(args["offsets"]), list(args["windows"])
    n = len(offsets)
    keep, cyclic, zeroed = (list(args.get(k) or ()) or [0] * n for k in ("keep", "cyclic", "zeroed"))
    if not len(ins) - 1 == len(windows) == len(outs) == n == len(keep) == len(cyclic) == len(zeroed):
        return None
    links = [_link(*spec) for spec in zip(offsets, windows, bop.opdef.input[1:], keep, cyclic, zeroed)]

    def run(ins, blobs):
        t = int(ins[0].flat[0])
        for blob, external, (memo, link) in zip(blobs, ins[1:], links):
            view = memo[1].get(t) if memo is not None and memo[0] is external else None   # (a kept view)
            blob.value = link(t, external, blob.name) if view is None else view
            blob.view = True

    def prebind(ins, blobs, fresh):
        """The views run just pointed the blobs at, pointed at again (and zeroed where flagged); a link into a
        tensor read fresh, or one the op does not own, made anew each call."""
        t = int(ins[0].flat[0])
        held = [k for k in range(n) if keep[k] and k + 1 not in fresh]
        kept = [(blobs[k], blobs[k].value) for k in held]
        zero = [blobs[k].value for k in held if zeroed[k]]
        made = [(blob, k + 1, _rows_at(t, offsets[k], windows[k], cyclic[k], ins[k + 1]), zeroed[k])
                for k, blob in enumerate(blobs) if k not in held]    # (their shapes: the signature's)

        def call():
            for blob, view in kept:
                blob.value = view
                blob.view = True
            for view in zero:
                view.fill(0)
            for blob, j, rows, zero_it in made:
                blob.value = view = ins[j][rows]
                blob.view = True
                if zero_it:
                    view.fill(0)
        return call
    unkept = tuple(k for k in range(n) if not keep[k])
    return Fast(run, blobs=True, prebind=prebind, fresh_inputs=tuple(k + 1 for k in unkept), made_fresh=unkept,
                sources=tuple(range(1, n + 1)))


def _link(offset: int, window: int, name: str, keep: int, cyclic: int, zeroed: int):
    """(memo, view): view(t, external, internal name) -> the link's rows at timestep t; memo: [the external
    last seen, its views by timestep] where they may be reused as they are (else None). Into a tensor the op
    owns (keep): each row's view made once and kept while the external is the same array. Views of other
    tensors (an input projection the main net recomputes) are made each time: kept, they would hold the array,
    and with it a second copy of it when the main net next computes it. cyclic: rows mod the tensor's; zeroed:
    filled with zeros."""
    memo = [None, {}]      # the external last seen, its views by timestep

    def rows(t, external, internal):
        at = _rows_at(t, offset, window, cyclic, external)
        if at.stop > external.shape[0] or not external.size:
            _link_error(internal, name, external, at.start, at.stop, offset, window)
        return external[at]

    if not keep:
        if not zeroed:
            return None, rows

        def fresh_zeroed(t, external, internal):
            view = rows(t, external, internal)
            view.fill(0)
            return view
        return None, fresh_zeroed

    def kept(t, external, internal):
        if memo[0] is external:
            view = memo[1].get(t)
            if view is None:
                view = memo[1][t] = rows(t, external, internal)
        else:
            view = rows(t, external, internal)
            memo[0], memo[1] = external, {t: view}
        if zeroed:
            view.fill(0)
        return view
    return (None if zeroed else memo), kept


def accumulate_gradient_input(bop, ins, outs):
    """g[t + offset] += og[t], in place (the state-gradient tensor the links view)."""
    _, og, g = ins
    args = bound_args(bop)
    offset, cyclic = args["offset"], args.get("cyclic", 0)
    if offset < 0 or og.ndim < 1 or g.ndim < 1 or og[0].size != g[0].size or og.dtype != g.dtype:
        return None
    row_shape = g.shape[1:]

    def run(ins, outs):
        timestep, og, g = ins
        t = int(timestep.flat[0])
        at = (t + offset) % g.shape[0] if cyclic and g.shape[0] else t + offset
        if t >= og.shape[0] or at >= g.shape[0]:
            raise ShapeError(f"timestep {t} + offset {offset} is outside the gradient tensors "
                             f"{tuple(og.shape)} / {tuple(g.shape)}")
        row = g[at]
        row += shaped(og[t], row_shape)

    def prebind(ins, outs, fresh):
        timestep, og, g = ins
        t = int(timestep.flat[0])
        at = (t + offset) % g.shape[0] if cyclic and g.shape[0] else t + offset
        if 0 in fresh or 2 in fresh or t >= og.shape[0] or at >= g.shape[0]:
            return None
        row = g[at]
        if 1 in fresh:       # (a gradient the main net makes anew each run; its shape is the run's signature's)
            return lambda: np.add(row, shaped(ins[1][t], row_shape), out=row)
        og_t = shaped(og[t], row_shape)
        return lambda: np.add(row, og_t, out=row)
    return Fast(run, prebind=prebind, fresh_inputs=(1,))   # (og: the main net's gradient, not the op's to hold)


def _rows_at(t: int, offset: int, window: int, cyclic: int, external) -> slice:
    """The rows of the external a link views at timestep t (mod its rows where cyclic)."""
    start = t + offset
    if cyclic and external.ndim and external.shape[0]:
        start %= external.shape[0]
    return slice(start, start + window)
