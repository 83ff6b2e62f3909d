"""Dense optimizer updates: MomentumSGD, MomentumSGDUpdate, Adagrad, Adam, RmsProp; and two helpers of
optimizers: Lars (a layer's learning-rate factor) and SparseNormalize (renormalizing the embedding rows a
sparse gradient touched).

Sign conventions (spec §11.8): Caffe2's optimizer builders make the learning-rate blob negative for
Adagrad, Adam and plain SGD (these ops *add* lr·update) and positive for MomentumSGDUpdate (which
*subtracts* its adjusted gradient) and for RmsProp (whose output is fed to MomentumSGDUpdate). The ops
themselves take lr as given. Caffe2 compares element counts, not shapes: every output keeps the shape of the
input it replaces. Arithmetic stays in the parameter's float dtype. No op here is differentiable
(SHOULD_NOT_DO_GRADIENT, as in Caffe2). The helpers at the top are shared with sparse_optim.
"""
from __future__ import annotations

import math

import numpy as np

from ..core import backend
from ..core.errors import ArgumentError, DTypeError, ShapeError
from ..kernels import jit
from .base import check_float, check_int_dtype, like, out_spec, size_of
from .lr import iteration_value
from .registry import SHOULD_NOT_DO_GRADIENT, op

# --------------------------------------------------------------------------------------------- checks


def check_like(op_type: str, ref_name: str, ref, **named) -> None:
    """Each named tensor must have ref's element count and dtype (Caffe2 compares sizes, not shapes)."""
    for name, x in named.items():
        if size_of(x) != size_of(ref):
            raise ShapeError(f"{op_type}: {name} {tuple(x.shape)} must have as many elements as {ref_name} "
                             f"{tuple(ref.shape)}")
        if x.dtype is not None and ref.dtype is not None and x.dtype != ref.dtype:
            raise DTypeError(f"{op_type}: {name} is {x.dtype} but {ref_name} is {ref.dtype}; use one float "
                             "type")


def check_scalar(op_type: str, name: str, x) -> None:
    """A learning rate / weight input: one float element."""
    check_float(op_type, **{name: x})
    if size_of(x) != 1:
        raise ShapeError(f"{op_type}: {name} must hold exactly one element, got shape {tuple(x.shape)}")


def scalar(xp, x, dtype):
    """The one element of x as a 0-D array of `dtype` on x's device."""
    return xp.asarray(x).reshape(()).astype(dtype)


def arrays(xp, *values) -> tuple:
    """values as arrays of their device (numpy turns 0-D results into scalars)."""
    return tuple(xp.asarray(v) for v in values)


def const(dtype, value):
    """A Python number as a scalar of `dtype` (keeps float32 arithmetic float32 on every backend)."""
    return np.dtype(dtype).type(value)


def adam_correction(beta1: float, beta2: float, iteration: int) -> float:
    """sqrt(1 - beta2^t) / (1 - beta1^t) with t = iteration + 1, in double from the float32 betas as Caffe2
    computes it."""
    t = np.float64(iteration + 1)
    b1, b2 = np.float64(np.float32(beta1)), np.float64(np.float32(beta2))
    with np.errstate(all="ignore"):   # betas outside (0, 1) give NaN or inf, as C++'s sqrt and pow do
        return float(np.sqrt(1.0 - b2 ** t) / (1.0 - b1 ** t))


# --------------------------------------------------------------------------------------------- momentum SGD
MOMENTUM_ARGS = {"momentum": 0.0, "nesterov": False}


def momentum_step(xp, g, m, lr, momentum, nesterov):
    """(adjusted gradient, new moment) of one momentum step; lr is a 0-D array of g's dtype."""
    mu = const(g.dtype, momentum)
    if nesterov:
        m_new = mu * m + lr * g
        return (const(g.dtype, 1) + mu) * m_new - mu * m, m_new
    m_new = lr * g + mu * m
    return m_new.copy(), m_new


def _check_momentum(op_type, grad, moment, lr, param=None) -> None:
    check_float(op_type, grad=grad)
    check_like(op_type, "grad", grad, moment=moment, **({} if param is None else {"param": param}))
    check_scalar(op_type, "lr", lr)


def _momentum_shape(specs, momentum=0.0, nesterov=False):
    _check_momentum("MomentumSGD", *specs)
    return [like(specs[0]), like(specs[1])]


def _momentum_update_shape(specs, momentum=0.0, nesterov=False):
    _check_momentum("MomentumSGDUpdate", *specs)
    return [like(specs[0]), like(specs[1]), like(specs[3])]


@op("MomentumSGD", inputs=3, outputs=2, inplace=[(0, 0), (1, 1)], args=MOMENTUM_ARGS,
    gradient=SHOULD_NOT_DO_GRADIENT, shape=_momentum_shape)
def momentum_sgd(xp, grad, moment, lr, *, momentum, nesterov):
    """(grad, moment, lr) -> (adjusted grad, moment). Plain: m' = lr·g + μ·m, g' = m'. Nesterov:
    m' = μ·m + lr·g, g' = (1+μ)·m' − μ·m. The caller subtracts g' from the parameter."""
    _check_momentum("MomentumSGD", grad, moment, lr)
    g_new, m_new = momentum_step(xp, grad, moment.reshape(grad.shape), scalar(xp, lr, grad.dtype), momentum,
                                 nesterov)
    return arrays(xp, g_new, m_new.reshape(moment.shape))


@op("MomentumSGDUpdate", inputs=4, outputs=3, inplace=[(0, 0), (1, 1), (3, 2)], args=MOMENTUM_ARGS,
    gradient=SHOULD_NOT_DO_GRADIENT, shape=_momentum_update_shape)
def momentum_sgd_update(xp, grad, moment, lr, param, *, momentum, nesterov):
    """MomentumSGD followed by param' = param − g' (lr positive, as SgdOptimizer builds it with momentum)."""
    _check_momentum("MomentumSGDUpdate", grad, moment, lr, param)
    g_new, m_new = momentum_step(xp, grad, moment.reshape(grad.shape), scalar(xp, lr, grad.dtype), momentum,
                                 nesterov)
    return arrays(xp, g_new, m_new.reshape(moment.shape), param - g_new.reshape(param.shape))


# --------------------------------------------------------------------------------------------- Adagrad
def adagrad_step(xp, w, g, h, lr, epsilon, decay=1.0, weight_decay=0.0):
    """(new param, new moment, effective lr, update): h' = decay·h + g², w' = w + lr·g/(√h' + ε), with g
    first replaced by g + weight_decay·w."""
    dt = w.dtype
    if weight_decay:
        g = g + const(dt, weight_decay) * w
    h_new = const(dt, decay) * h + g * g
    denom = xp.sqrt(h_new) + const(dt, epsilon)
    update = lr * g / denom
    return w + update, h_new, lr / denom, update


def _check_adagrad(param, moment, grad, lr) -> None:
    check_float("Adagrad", param=param)
    check_like("Adagrad", "param", param, moment=moment, grad=grad)
    check_scalar("Adagrad", "lr", lr)


def _adagrad_shape(specs, **_):
    _check_adagrad(*specs)
    return [like(specs[0]), like(specs[1]), like(specs[2]), like(specs[2])]


@op("Adagrad", inputs=4, outputs=(2, 4), inplace=[(0, 0), (1, 1)], gradient=SHOULD_NOT_DO_GRADIENT,
    args={"epsilon": 1e-5, "decay": 1.0, "weight_decay": 0.0}, shape=_adagrad_shape)
def adagrad(xp, param, moment, grad, lr, *, epsilon, decay, weight_decay):
    """(param, moment, grad, lr) -> (param, moment[, effective_lr[, update]]): moment' = decay·moment + g²,
    param' = param + lr·g/(√moment' + ε) (lr negative from the optimizer builder). The optional outputs
    (Caffe2's later additions) are lr/(√moment' + ε) and the added update, shaped like grad."""
    _check_adagrad(param, moment, grad, lr)
    g = grad.reshape(param.shape)
    w, h, eff, update = adagrad_step(xp, param, g, moment.reshape(param.shape), scalar(xp, lr, param.dtype),
                                     epsilon, decay, weight_decay)
    return arrays(xp, w, h.reshape(moment.shape), eff.reshape(grad.shape), update.reshape(grad.shape))


# --------------------------------------------------------------------------------------------- Adam
ADAM_ARGS = {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-5}


def adam_step(xp, w, g, m1, m2, lr, corr, beta1, beta2, epsilon):
    """(new param, new m1, new m2, effective grad) of one Adam step; corr from adam_correction."""
    w, m1, m2 = w.copy(), m1.copy(), m2.copy()
    return w, m1, m2, adam_step_into(xp, w, g, m1, m2, lr, corr, beta1, beta2, epsilon)


def adam_step_into(xp, w, g, m1, m2, lr, corr, beta1, beta2, epsilon):
    """One Adam step written into w, m1 and m2 (arrays of one shape, none sharing memory with another or with
    g); returns the effective gradient corr·m1/(√m2 + ε). Each operation is rounded in the parameter's dtype,
    in this order (kernels/jitted.py adam does the same operations: the same bits)."""
    dt = w.dtype
    b1, b2, one = const(dt, beta1), const(dt, beta2), const(dt, 1)
    t = g * (one - b1)
    m1 *= b1
    m1 += t
    xp.multiply(g, g, out=t)
    t *= one - b2
    m2 *= b2
    m2 += t
    step = xp.sqrt(m2)
    step += const(dt, epsilon)
    xp.divide(m1, step, out=step)
    step *= const(dt, corr)
    xp.multiply(step, lr, out=t)
    w += t
    return step


def _check_adam(param, m1, m2, grad, lr, iteration) -> None:
    check_float("Adam", param=param)
    check_like("Adam", "param", param, moment_1=m1, moment_2=m2, grad=grad)
    check_scalar("Adam", "lr", lr)
    iteration_value(iteration, "Adam", static=True)


def _adam_shape(specs, **_):
    _check_adam(*specs)
    return [like(specs[0]), like(specs[1]), like(specs[2]), like(specs[3])]


def _apart(*arrays) -> bool:
    """Whether these host arrays may be written in place: each writeable and C-contiguous (its flat view is
    itself), no two sharing memory."""
    if not all(type(a) is np.ndarray and a.flags.writeable and a.flags.c_contiguous for a in arrays):
        return False
    return not any(np.may_share_memory(a, b) for i, a in enumerate(arrays) for b in arrays[i + 1:])


def _adam(xp, param, m1, m2, grad, lr, iteration, beta1, beta2, epsilon, in_place=False, fused=False):
    """Adam's step into param, m1 and m2 themselves when in_place and they may be written there (the results
    are then those three arrays), else into copies (the four outputs); by numba's one pass when fused and the
    arrays are float32 host arrays (the same bits as numpy's operations)."""
    _check_adam(param, m1, m2, grad, lr, iteration)
    corr = adam_correction(beta1, beta2, iteration_value(iteration, "Adam"))
    rate = scalar(xp, lr, param.dtype)
    own = in_place and _apart(param, m1, m2, grad)
    w, a, b = (param, m1, m2) if own else (param.copy(), m1.copy(), m2.copy())
    wf, af, bf, g = (x.reshape(-1) for x in (w, a, b, grad))     # (views of w, a, b: C-contiguous)
    compiled = jit.load() if fused and type(g) is np.ndarray and param.dtype == jit.F32 else None
    if compiled is None:
        eg = adam_step_into(xp, wf, g, af, bf, rate, corr, beta1, beta2, epsilon)
    else:
        eg, f32 = np.empty(0 if own else g.size, jit.F32), np.float32
        compiled.adam(wf, np.ascontiguousarray(g), af, bf, rate[()], f32(corr), f32(beta1), f32(beta2),
                      f32(epsilon), eg, not own)
    return (w, a, b) if own else arrays(xp, w, a, b, eg.reshape(grad.shape))


def _adam_in_place(fused: bool):
    def kernel(xp, param, m1, m2, grad, lr, iteration, *, beta1, beta2, epsilon):
        """Adam written into param, m1 and m2 (the op's outputs are those inputs, as Caffe2's optimizer
        builders make it), where they may be written (else into new arrays, as the kernel)."""
        return _adam(xp, param, m1, m2, grad, lr, iteration, beta1, beta2, epsilon, in_place=True, fused=fused)
    return kernel


def _fused_adam(regular):
    """Adam's fused_kernel (Workspace.fused_cells): numba's one pass over float32 host arrays (kernels/jitted.py
    adam, numpy's roundings: the same bits); its `inplace` writes into the inputs as Adam's inplace_kernel."""
    def kernel(xp, param, m1, m2, grad, lr, iteration, *, beta1, beta2, epsilon):
        return _adam(xp, param, m1, m2, grad, lr, iteration, beta1, beta2, epsilon, fused=True)
    kernel.__doc__ = "Adam in one fused float32 pass (Workspace.fused_cells)."
    kernel.inplace = _adam_in_place(fused=True)
    return kernel


@op("Adam", inputs=6, outputs=(3, 4), inplace=[(0, 0), (1, 1), (2, 2)], host_inputs=[5], args=ADAM_ARGS,
    gradient=SHOULD_NOT_DO_GRADIENT, shape=_adam_shape, inplace_kernel=_adam_in_place(fused=False),
    fused=_fused_adam)
def adam(xp, param, m1, m2, grad, lr, iteration, *, beta1, beta2, epsilon):
    """(param, m1, m2, grad, lr, iter) -> (param, m1, m2[, effective grad]): t = iter + 1,
    c = √(1−β2^t)/(1−β1^t), m1' = β1·m1 + (1−β1)·g, m2' = β2·m2 + (1−β2)·g², param' = param +
    lr·c·m1'/(√m2' + ε) (lr negative). The optional output is c·m1'/(√m2' + ε), shaped like grad."""
    return _adam(xp, param, m1, m2, grad, lr, iteration, beta1, beta2, epsilon)


# --------------------------------------------------------------------------------------------- RmsProp
def _check_rmsprop(grad, ms, mom, lr) -> None:
    check_float("RmsProp", grad=grad)
    check_like("RmsProp", "grad", grad, mean_squares=ms, mom=mom)
    check_scalar("RmsProp", "lr", lr)


def _rmsprop_shape(specs, **_):
    _check_rmsprop(*specs)
    return [like(specs[0]), like(specs[1]), like(specs[2])]


@op("RmsProp", inputs=4, outputs=3, inplace=[(0, 0), (1, 1), (2, 2)], gradient=SHOULD_NOT_DO_GRADIENT,
    args={"decay": 0.9, "momentum": 0.0, "epsilon": 1e-5}, shape=_rmsprop_shape)
def rms_prop(xp, grad, mean_squares, mom, lr, *, decay, momentum, epsilon):
    """(grad, mean_squares, mom, lr) -> (grad_o, mean_squares_o, mom_o): ms' = ms + (1−decay)·(g² − ms),
    mom' = momentum·mom + lr·g/√(ε + ms'), grad_o = mom'. RmsPropOptimizer passes lr = 1 and subtracts
    alpha·grad_o with MomentumSGDUpdate."""
    _check_rmsprop(grad, mean_squares, mom, lr)
    dt = grad.dtype
    ms = mean_squares.reshape(grad.shape)
    ms_new = ms + (const(dt, 1) - const(dt, decay)) * (grad * grad - ms)
    mom_new = mom.reshape(grad.shape) * const(dt, momentum) + scalar(xp, lr, dt) * grad / xp.sqrt(
        const(dt, epsilon) + ms_new)
    return arrays(xp, mom_new.copy(), ms_new.reshape(mean_squares.shape), mom_new.reshape(mom.shape))


# --------------------------------------------------------------------------------------------- Lars
def _check_lars(X, dX, offset) -> None:
    check_float("Lars", X=X, dX=dX)
    check_like("Lars", "X", X, dX=dX)
    if offset < 0:
        raise ArgumentError(f"Lars argument offset must be >= 0, got {offset}")


def _lars_shape(specs, *, offset):
    _check_lars(*specs, offset)
    return [out_spec((1,), specs[0].dtype)]


@op("Lars", inputs=2, outputs=1, inplace=(), args={"offset": 0.5}, gradient=SHOULD_NOT_DO_GRADIENT,
    shape=_lars_shape)
def lars(xp, X, dX, *, offset):
    """Layer-wise adaptive rate scaling (caffe2/sgd/lars_op.h): lr_rescale = 1 / (|dX| / |X| + offset), L2
    norms, as a 1-element tensor; 1 when |X| is 0."""
    _check_lars(X, dX, offset)
    x_norm = xp.sqrt((X * X).reshape(1, -1).sum(axis=1, dtype=X.dtype))       # shape (1,): stays on the device
    dx_norm = xp.sqrt((dX * dX).reshape(1, -1).sum(axis=1, dtype=X.dtype))
    safe = xp.where(x_norm > 0, x_norm, const(X.dtype, 1))
    with np.errstate(divide="ignore"):
        return xp.where(x_norm > 0, const(X.dtype, 1) / (dx_norm / safe + const(X.dtype, offset)),
                        const(X.dtype, 1))


# --------------------------------------------------------------------------------------------- SparseNormalize
NORM_EPS = 1e-12


def _check_sparse_normalize(param, indices, grad, norm) -> None:
    check_float("SparseNormalize", param=param, grad=grad)
    check_int_dtype(indices.dtype, "SparseNormalize indices")
    if norm < 0:
        raise ArgumentError(f"SparseNormalize argument norm must be >= 0, got {norm}")
    k = len(indices.shape)
    if len(param.shape) < 1 or len(grad.shape) < k or \
            size_of(param) // max(param.shape[0], 1) != size_of(grad) // max(math.prod(grad.shape[:k]), 1):
        raise ShapeError(f"SparseNormalize: grad {tuple(grad.shape)} must hold one row of param "
                         f"{tuple(param.shape)} per index (indices {tuple(indices.shape)})")


def _sparse_normalize_shape(specs, *, use_max_norm, norm):
    _check_sparse_normalize(*specs, norm)
    return [like(specs[0])]


@op("SparseNormalize", inputs=3, outputs=1, inplace=[(0, 0)], enforce_inplace=[(0, 0)],
    args={"use_max_norm": True, "norm": 1.0}, gradient=SHOULD_NOT_DO_GRADIENT, shape=_sparse_normalize_shape)
def sparse_normalize(xp, param, indices, grad, *, use_max_norm, norm):
    """The rows of param named by indices scaled to L2 norm `norm` (the norm taken plus 1e-12); with
    use_max_norm (the default) only rows whose norm is above `norm`. grad only gives the row width. A
    repeated index is normalized again (as Caffe2's in-place loop does)."""
    _check_sparse_normalize(param, indices, grad, norm)
    ids = xp.asarray(indices).reshape(-1).astype(np.int64)
    rows = param.shape[0]
    if ids.size and bool(((ids < 0) | (ids >= rows)).any()):
        bad = int(ids[xp.argmax((ids < 0) | (ids >= rows))])
        raise ShapeError(f"SparseNormalize: index {bad} is out of range for param with {rows} rows")
    out = param.copy()
    flat = out.reshape(rows, -1)
    pending = ids
    while pending.size:                                # each pass takes one occurrence of every index
        uniq, first = np.unique(backend.to_host(pending), return_index=True)
        take = xp.asarray(uniq)
        block = flat[take]
        size = xp.sqrt((block * block).sum(axis=1, dtype=out.dtype)) + const(out.dtype, NORM_EPS)
        scale = const(out.dtype, norm) / size
        if use_max_norm:
            scale = xp.where(size < const(out.dtype, norm), const(out.dtype, 1), scale)
        flat[take] = block * scale.reshape(-1, 1)
        keep = np.ones(pending.size, bool)
        keep[first] = False
        pending = pending[xp.asarray(keep)]
    return out
