"""The compiled forms of the step nets' matrix products: the step FC and its input gradient (each the fastest of
stepnet.kernels.fc_forms's forms that give the kernel's bits on this machine, checked and timed once per
signature) and the deferred FC gradient (the input gradient per timestep; the weight gradient's rows gathered
for one GEMM after the loop). Same contract as kernels.py: same sums as the kernels."""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import ShapeError
from ..kernels import jit
from ..kernels.fc_forms import blocks_form, fastest, gradient_fastest, gradient_forms, kernel_form, w_first_form
from ..kernels.fc_forms import forms as fc_forms
from ..kernels.onehot import ONE_HOT_ROWS, gather_fc
from .cell_forms import Fast, bound_args, same_floats, shaped


def fc(bop, ins, outs, parts=None, steps: int = 8):
    """FC in the fastest of the forms that give the FC kernel's bits here (kernels.fc_forms: the kernel's own
    computation, W·Xᵀ then a transposed add, X·Wᵀ into column blocks from a per-run Wᵀ copy; checked and timed
    once per signature on this machine, for runs of `steps` calls). parts picks one: 'kernel', 'w first' or a
    block count."""
    sizes = _fc_sizes(bop, ins, outs)
    if sizes is None:
        return None
    m, k, n = sizes
    dtype, xs, ys = ins[0].dtype, (m, k), (m, n)
    one_hot = m >= ONE_HOT_ROWS and k <= m      # (rows a char-rnn's one-hot input has: gathered, as the kernel does)
    if parts is None and one_hot:
        parts = "kernel"      # (only an X that is not one-hot takes the product: not worth a trial of its size)
    form = _form(m, k, n, dtype, parts, steps)
    biased = form.biased
    begin = None if form.begin is None else (1, form.begin)
    if one_hot:
        def run(ins, outs):
            x, w, b = ins
            x2, out = shaped(x, xs), shaped(outs[0], ys)
            if gather_fc(x2, shaped(w, (n, k)).T, b, out) is None:
                biased(x2, w, b, out)
        return Fast(run, begin=begin)

    def run(ins, outs):
        x, w, b = ins
        biased(shaped(x, xs), w, b, shaped(outs[0], ys))

    def fuse(next_bop, ins, outs):
        """FC bias + the Sum that reads its output, in one pass (see _with_sum)."""
        return _with_sum(bop, next_bop, ins, outs, ys, form.product)
    return Fast(run, begin=begin, fuse=fuse)


def _form(m: int, k: int, n: int, dtype, parts, steps: int):
    """The fc_forms Form that fc() takes: `parts`, or the fastest giving the kernel's bits (parts None)."""
    if parts is None:
        candidates = fc_forms(m, k, n, dtype)
        return candidates[fastest(m, k, n, dtype, candidates, steps)]
    if parts in ("kernel", "w first"):
        return {"kernel": kernel_form, "w first": w_first_form}[parts](m, k, n, dtype)
    return blocks_form(m, k, n, dtype, parts)


def step_product(bop, ins, outs, steps: int = 8):
    """((M, K, N), the Form fc() takes) of a step FC of two or more float32 rows that is never one-hot gathered
    (so its kernel's value is the form's product + b: the FC of one row is fc_row's, a one-hot X's the
    gather's), else None: for a form that adds the bias itself (compiled.gru_step)."""
    sizes = _fc_sizes(bop, ins, outs)
    if sizes is None or ins[0].dtype != np.float32 or sizes[0] < 2 or (
            sizes[0] >= ONE_HOT_ROWS and sizes[1] <= sizes[0]):
        return None
    return sizes, _form(*sizes, ins[0].dtype, None, steps)


def _fc_sizes(bop, ins, outs) -> tuple | None:
    """(M, K, N) of an FC on float arrays of one dtype that the compiled forms handle, else None."""
    x, w, b = ins
    args = bound_args(bop)
    if not same_floats(x, w, b) or args.get("float16_compute") or b.ndim != 1:
        return None
    a, aw = args["axis"], args["axis_w"]
    a, aw = a + x.ndim if a < 0 else a, aw + w.ndim if aw < 0 else aw
    if not (0 < a < x.ndim and 0 < aw < w.ndim):
        return None
    m, k, n = math.prod(x.shape[:a]), math.prod(x.shape[a:]), math.prod(w.shape[:aw])
    if w.size != n * k or b.size != n or outs[0].size != m * n:
        return None
    return m, k, n


def fc_row(bop, ins, outs):
    """FC of one float32 row with the fused kernels (the FC fused kernel's arithmetic: numba's fc_row, the
    product and the bias in one pass over W), straight into the output; with the Sum after it, fc_row_sum."""
    compiled, sizes = jit.load(), _fc_sizes(bop, ins, outs)
    if compiled is None or sizes is None or sizes[0] != 1 or ins[0].dtype != np.float32 or outs[0].dtype != np.float32:
        return None
    _, k, n = sizes
    ws, row = (n, k), compiled.fc_row

    def run(ins, outs):       # (ravel: x as its k values; the output, contiguous, as a view of its n)
        x, w, b = ins
        row(shaped(w, ws), x.ravel(), b, outs[0].ravel())

    def fuse(next_bop, ins, outs):
        pair = _sum_pair(bop, next_bop, ins, outs, n)
        if pair is None:
            return None
        other, into = pair
        row_sum = compiled.fc_row_sum

        def both(ins, outs):
            y = outs[0].ravel()
            row_sum(shaped(ins[1], ws), ins[0].ravel(), ins[2], ins[3 + other].ravel(), y,
                    y if into else outs[1].ravel())

        def prebind(ins, outs, fresh):
            if fresh & {0, 1, 2}:
                return None
            w, x, b, y, zi = shaped(ins[1], ws), ins[0].ravel(), ins[2], outs[0].ravel(), 3 + other
            s = y if into else outs[1].ravel()
            if zi in fresh:
                return lambda: row_sum(w, x, b, ins[zi].ravel(), y, s)
            z = ins[zi].ravel()
            return lambda: row_sum(w, x, b, z, y, s)
        return Fast(both, prebind=prebind)
    return Fast(run, fuse=fuse)


def _sum_pair(fc_bop, sum_bop, ins, outs, size: int) -> tuple | None:
    """(which Sum input is not the FC's output, whether the Sum writes in place over it) for an FC followed by
    Sum(y, z) -> s (either input order; s may be z or y) that one pass may compute: float32, two inputs of the
    FC output's size, no partial overlap between y, z and s. None otherwise."""
    y = fc_bop.outputs[0]
    if (len(sum_bop.inputs) != 2 or sum(b is y for b in sum_bop.inputs) != 1
            or any(a.dtype != np.float32 for a in (*ins, outs[0])) or any(a.size != size for a in (*ins[3:], outs[0]))):
        return None
    other = 1 if sum_bop.inputs[0] is y else 0
    y_now, z_now, s_now = ins[4 - other], ins[3 + other], outs[0]     # (the values the Sum saw)
    if np.may_share_memory(z_now, y_now) or (s_now is not y_now and s_now is not z_now and any(
            np.may_share_memory(s_now, a) for a in (y_now, z_now))):
        return None      # one pass over overlapping arrays would read values the two ops never see
    return other, sum_bop.outputs[0] is y


def _with_sum(fc_bop, sum_bop, ins, outs, ys, product):
    """The form of FC(x, W, b) -> y followed by Sum(y, z) -> s (either input order; s may be z or y): the
    product as the FC form computes it, then one numba pass (no fast-math: the same float32 additions in the
    same order as the two ops) writes y = product + b and s = y + z. None unless float32, a Sum of two inputs,
    one of them y and the other of y's size, no partial overlap between y, z and s, and numba's kernels load."""
    compiled = jit.load()
    pair = None if compiled is None else _sum_pair(fc_bop, sum_bop, ins, outs, ys[0] * ys[1])
    if pair is None:
        return None
    other, into = pair       # into: Sum in place over y (the LSTM step nets' gates): y = (p + b) + z
    kernel = compiled.bias_sum_into if into else compiled.bias_sum
    xs = (ys[0], ins[0].size // ys[0])

    def run(ins, outs):
        x, w, b, z = ins[0], ins[1], ins[2], shaped(ins[3 + other], ys)
        p = product(shaped(x, xs), w)
        if into:
            kernel(p, b, z, shaped(outs[0], ys))
        else:
            kernel(p, b, z, shaped(outs[0], ys), shaped(outs[1], ys))

    def prebind(ins, outs, fresh):
        if fresh & {0, 1, 2}:
            return None
        x, w, b, zi = shaped(ins[0], xs), ins[1], ins[2], 3 + other
        ys_out = (shaped(outs[0], ys),) if into else (shaped(outs[0], ys), shaped(outs[1], ys))
        if zi in fresh:
            return lambda: kernel(product(x, w), b, shaped(ins[zi], ys), *ys_out)
        z = shaped(ins[zi], ys)
        return lambda: kernel(product(x, w), b, z, *ys_out)
    return Fast(run, prebind=prebind)


def _fc_gradient_dims(bop, x, w) -> tuple[int, int, int]:
    """(M, K, N) of a step FCGradient's X (M x K at axis) and W (N x K at axis_w)."""
    args = bound_args(bop)
    a, aw = args["axis"], args["axis_w"]
    a, aw = a + x.ndim if a < 0 else a, aw + w.ndim if aw < 0 else aw
    return math.prod(x.shape[:a]), math.prod(x.shape[a:]), math.prod(w.shape[:aw])


def _gradient_form(m: int, k: int, n: int, dtype, steps: int):
    """The input-gradient form a compiled step takes for these sizes (kernels.fc_forms.gradient_fastest)."""
    candidates = gradient_forms(m, k, n, dtype)
    return candidates[gradient_fastest(m, k, n, dtype, candidates, steps)]


def fc_input_gradient(bop, ins, outs, steps: int = 8):
    x, w, dy = ins
    m, k, n = _fc_gradient_dims(bop, x, w)
    if not same_floats(x, w, dy) or dy.size != m * n or w.size != n * k or outs[0].size != x.size:
        return None
    x2, y2 = (m, k), (m, n)
    form = _gradient_form(m, k, n, x.dtype, steps)
    product = form.product

    def run(ins, outs):
        _, w, dy = ins
        product(shaped(dy, y2), w, shaped(outs[0], x2))

    def prebind(ins, outs, fresh):
        if fresh & {1, 2}:
            return None
        w, dy, out = ins[1], shaped(ins[2], y2), shaped(outs[0], x2)
        return form.bind(dy, w, out) if form.bind is not None else (lambda: product(dy, w, out))
    return Fast(run, begin=None if form.begin is None else (1, form.begin), prebind=prebind)


def fc_gradient_deferred(bop, ins, outs, steps: int = 8):
    _, sequence, x, w, dy, xs, dys = ins
    m, k, n = _fc_gradient_dims(bop, x, w)
    T = sequence.shape[0]
    if (not same_floats(x, w, dy, xs, dys) or dy.size != m * n or w.size != n * k
            or xs.shape != (T * m, k) or dys.shape != (T * m, n) or outs[0].size != x.size):
        return None
    x2, y2 = (m, k), (m, n)
    form = _gradient_form(m, k, n, x.dtype, steps)
    product = form.product

    def run(ins, outs):
        timestep, _, x, w, dy, xs, dys = ins
        t = int(timestep.flat[0])
        if not 0 <= t < T:
            raise ShapeError(f"timestep {t} is outside the {T} steps of the sequence")
        block = (T - 1 - t) * m
        dy = shaped(dy, y2)
        xs[block:block + m] = shaped(x, x2)
        dys[block:block + m] = dy
        product(dy, w, shaped(outs[0], x2))
    return Fast(run, begin=None if form.begin is None else (3, form.begin), fresh_inputs=(1,))  # (the sequence: its T)
