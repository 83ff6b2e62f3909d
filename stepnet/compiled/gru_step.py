"""Caffe2's GRU step as one compiled entry (with the fused kernels): the eleven ops of gru_cell's step net, as
stepnet's builders and caffe2.python's rnn_cell write them,

    Split(x_t) -> xr, xu, xo;  FC(h, W_r, b_r) -> r;  FC(h, W_u, b_u) -> u;  Sum(r, xr) -> r;  Sigmoid(r) -> s;
    Mul(s, h) -> mh;  FC(mh, W_o, b_o) -> o;  Sum(u, xu) -> u;  Sum(o, xo) -> os;  Concat(r, u, os) -> gates;
    GRUUnit(h, gates, ...) -> h_t

(with linear_before_reset: FC(h, W_o, b_o) -> o before Mul(s, o) -> om, and Sum(om, xo) -> os), run as the
three products (each in the form the FC's own compiled form takes: compiled.products) and two numba passes
(kernels.jitted gru_gates, gru_concat) before GRUUnit's own form: 5 calls a timestep instead of 11 ops' worth
of numpy calls. Every output of every op is written, each value rounded as its op rounds it (the same products,
the same float32 additions in the same order, the same sigmoid pass, the same cell kernel), so the blobs hold
the bits the ops leave and a backward step net reads what it would read. Only these two arrangements, each op
with the kernel its type registered (compiled.entries checks), float32 and two or more rows (the cases where
each op's own compiled value is the product + bias): anything else keeps one entry per op."""
from __future__ import annotations

import functools

import numpy as np

from ..kernels import jit
from ..ops import shape as shape_ops
from .cell_forms import Fast, bound_args, shaped
from .jit_forms import FUSED
from .products import step_product

RESET_FIRST = ("Split", "FC", "FC", "Sum", "Sigmoid", "Mul", "FC", "Sum", "Sum", "Concat", "GRUUnit")
LINEAR_FIRST = ("Split", "FC", "FC", "Sum", "Sigmoid", "FC", "Mul", "Sum", "Sum", "Concat", "GRUUnit")
SIZE = len(RESET_FIRST)
_AT = {RESET_FIRST: (5, 6), LINEAR_FIRST: (6, 5)}     # where each layout has its Mul and its output FC


def _is(blobs, *expected) -> bool:
    return len(blobs) == len(expected) and all(a is b for a, b in zip(blobs, expected))


def _pair(blobs, a, b) -> bool:
    """Whether blobs are (a, b) in either order (a Sum's or Mul's two inputs: the same bits either way)."""
    return _is(blobs, a, b) or _is(blobs, b, a)


def layout(ops, i: int) -> tuple | None:
    """(the Mul's position, the output FC's, linear_before_reset) when bound ops i..i+10 are the GRU step
    above (or, with linear_before_reset, its FC(h) -> o, Mul(s, o) -> om, Sum(om, xo) -> os), by what each
    reads and writes, every value a blob of its own (no output is another's or an input read by the step);
    else None."""
    at = _AT.get(tuple(o.opdef.type for o in ops[i:i + SIZE]))
    if at is None:
        return None
    lbr = at[0] > at[1]
    split, fr, fu, sr, sig, mul, fo, su, so, cat, unit = (ops[i + j] for j in (0, 1, 2, 3, 4, *at, 7, 8, 9, 10))
    if len(split.inputs) != 1 or len(split.outputs) != 3 or len(unit.outputs) != 1 or len(cat.outputs) > 2:
        return None
    (x,), (xr, xu, xo), h = split.inputs, split.outputs, unit.inputs[0]
    r, u, o = fr.outputs[0], fu.outputs[0], fo.outputs[0]
    s, m, os, gates = sig.outputs[0], mul.outputs[0], so.outputs[0], cat.outputs[0]
    if not (len(fr.inputs) == len(fu.inputs) == len(fo.inputs) == 3 and fr.inputs[0] is h and fu.inputs[0] is h
            and _pair(sr.inputs, r, xr) and _is(sr.outputs, r) and _is(sig.inputs, r)
            and _pair(su.inputs, u, xu) and _is(su.outputs, u) and _is(cat.inputs, r, u, os)
            and unit.inputs[1] is gates):
        return None
    if not (fo.inputs[0] is h and _pair(mul.inputs, s, o) and _pair(so.inputs, m, xo) if lbr else
            fo.inputs[0] is m and _pair(mul.inputs, s, h) and _pair(so.inputs, o, xo)):
        return None
    made = [xr, xu, xo, r, u, s, m, o, os, *cat.outputs, *unit.outputs]
    read = [x, h, *fr.inputs[1:], *fu.inputs[1:], *fo.inputs[1:], *unit.inputs[2:]]
    if len({id(b) for b in made}) != len(made) or {id(b) for b in made} & {id(b) for b in read}:
        return None
    return (*at, lbr)


def _last_axis(bop, ndim: int) -> bool:
    a = bound_args(bop)
    return not a["add_axis"] and shape_ops.canonical_axis(shape_ops._axis_from(a["axis"], a["order"]), ndim) == ndim - 1


def form(ops, i: int, found: tuple, trace, steps: int = 8) -> Fast | None:
    """The one entry of the GRU step at ops i..i+10, whose layout() is `found`, for the arrays of the trace: its
    fn takes the eleven ops' inputs, then their outputs, in op order. None where the arrays are not the case it
    covers."""
    k = jit.load()
    if k is None:
        return None
    m_at, f_at, lbr = found
    bops, seen = ops[i:i + SIZE], trace[i:i + SIZE]
    split, cat, unit = bops[0], bops[9], bops[10]
    x, h = seen[0][0][0], seen[-1][0][0]
    if h.ndim != 3 or h.shape[0] != 1 or x.shape != h.shape[:2] + (3 * h.shape[2],):
        return None
    n, d = h.shape[1:]
    made = [out for _, outs in seen[:9] for out in outs] + [seen[9][1][0]]
    floats = [a for ins, _ in seen[:9] for a in ins] + made
    if any(type(a) is not np.ndarray or a.dtype != np.float32 for a in floats) or not (
            _last_axis(split, 3) and _last_axis(cat, 3) and all(a.flags.c_contiguous for a in made)
            and all(out.size == n * d for out in made[:-1]) and made[-1].size == 3 * n * d
            and all(seen[j][0][2].shape == (d,) for j in (1, 2, f_at))
            and (len(seen[9][1]) == 1 or (seen[9][1][1].size == 3 and seen[9][1][1].dtype == np.int32))):
        return None
    products = [step_product(bops[j], *seen[j], steps) for j in (1, 2, f_at)]
    cell = FUSED["GRUUnit"](unit, *seen[10])
    if None in products or cell is None or any(p[0] != (n, d, d) for p in products):
        return None
    (_, fr_), (_, fu_), (_, fo_) = products
    at = [0]                                  # where each op's inputs, then each op's outputs, begin
    for ins, _ in seen:
        at.append(at[-1] + len(ins))
    o_at = [at[-1]]
    for _, outs in seen:
        o_at.append(o_at[-1] + len(outs))
    W = lambda j, m: at[j] + m        # noqa: E731 - input m of op j
    O = lambda j, m: o_at[j] - o_at[0] + m    # noqa: E731 - output m of op j (in the outputs list)
    u0, nu = at[10], len(seen[10][0])
    y, bits, sizes = np.empty(n * d, np.float32), np.empty(n * d, np.int32), np.empty(3, np.int32)
    two, three, product_r, product_u, product_o = (n, d), (n, 3 * d), fr_.product, fu_.product, fo_.product
    gates_kernel, concat_kernel = k.gru_gates, k.gru_concat

    def views(outs):
        """The outputs the passes write, as n × d (gates n × 3d) views, and the Concat's sizes output."""
        xr, xu, xo = (shaped(outs[O(0, m)], two) for m in range(3))
        r, u, s, m, o = (shaped(outs[O(j, 0)], two) for j in (1, 2, 4, m_at, f_at))
        dims = outs[O(9, 1)] if len(seen[9][1]) == 2 else sizes
        return xr, xu, xo, r, u, s, m, o, shaped(outs[O(8, 0)], two), shaped(outs[O(9, 0)], three), dims

    def step(xt, hh, w_r, b_r, w_u, b_u, w_o, b_o, v, cell_call):
        """m: the Mul's output, σ(r)·h (the output FC's input) or, with linear_before_reset, σ(r)·o."""
        xr, xu, xo, r, u, s, m, o, os, gates, dims = v
        gates_kernel(xt, product_r(hh, w_r), product_u(hh, w_u), b_r, b_u, hh, xr, xu, xo, r, u, s, m, y, bits,
                     not lbr)
        concat_kernel(product_o(hh if lbr else m, w_o), b_o, xo, r, u, o, os, gates, dims, s, m, lbr)
        cell_call()

    def weights(ins):
        return ins[W(1, 1)], ins[W(1, 2)], ins[W(2, 1)], ins[W(2, 2)], ins[W(f_at, 1)], ins[W(f_at, 2)]

    def run(ins, outs):
        uins, uouts = ins[u0:u0 + nu], [outs[O(10, 0)]]
        step(shaped(ins[0], three), shaped(ins[W(1, 0)], two), *weights(ins), views(outs),
             functools.partial(cell.fn, uins, uouts))

    def prebind(ins, outs, fresh):
        """The step on these arrays; x_t (input 0: a row of the input projection, which the op does not own)
        may be read afresh each call; any other fresh input: None (run is called)."""
        if fresh - {0}:
            return None
        uins, uouts = ins[u0:u0 + nu], [outs[O(10, 0)]]
        cell_call = (cell.prebind(uins, uouts, frozenset()) if cell.prebind is not None else None) or \
            functools.partial(cell.fn, uins, uouts)
        args = (shaped(ins[W(1, 0)], two), *weights(ins), views(outs), cell_call)
        if 0 in fresh:
            return lambda: step(shaped(ins[0], three), *args)
        xt = shaped(ins[0], three)
        return functools.partial(step, xt, *args)

    begins = tuple((j, 1, f.begin) for j, f in ((1, fr_), (2, fu_), (f_at, fo_)) if f.begin is not None)
    if cell.begin is not None:
        begins += ((10, *cell.begin),)
    return Fast(run, prebind=prebind, begins=begins)
