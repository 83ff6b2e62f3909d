"""TT: a fully connected layer whose weight matrix is a tensor train (the cores stepnet.compat.tt_core makes).

Semantics from caffe2/operators/tt_linear_op.{h,cc}. With d = len(inp_sizes) factors, K = prod(inp_sizes) and
N = prod(out_sizes), X (M x K..., at least 2-D) times the TT matrix plus b (N) gives Y (M x N). CORES is one
vector of the d cores, the last factor's first: core k is an (inp_sizes[k] * tt_ranks[k + 1]) x (tt_ranks[k] *
out_sizes[k]) row-major matrix, G_k[i, r', r, o]. Caffe2 multiplies by one core at a time, moving each factor's
output index to the front (so, after the last, the rows are (o_0 .. o_{d-1}) x batch): the same steps here.
Caffe2's final transpose reads that (N x M) result as M x N, which mixes samples when M > 1; here each row of
X gives its own row of Y (for M = 1, as in Caffe2's test, the two agree). tt_ranks has d + 1 entries, the
first and last 1. Caffe2 registers no gradient (GRADIENT_NOT_IMPLEMENTED_YET); its TTLinearGradient does
nothing, and is not registered here.
"""
from __future__ import annotations

import math

from ..core.errors import ArgumentError, ShapeError
from .base import check_float, out_spec, size_of
from .registry import GRADIENT_NOT_IMPLEMENTED, Arg, op

TT_ARGS = {"inp_sizes": Arg("ints"), "out_sizes": Arg("ints"), "tt_ranks": Arg("ints")}


def _check_args(inp_sizes, out_sizes, tt_ranks) -> int:
    """The number of cores d; the arguments checked."""
    d = len(inp_sizes)
    if len(out_sizes) != d:
        raise ArgumentError(f"TT: inp_sizes has {d} entries but out_sizes has {len(out_sizes)}; give one input and "
                            "one output size per core")
    if len(tt_ranks) != d + 1:
        raise ArgumentError(f"TT: tt_ranks must have len(inp_sizes) + 1 = {d + 1} entries, got {len(tt_ranks)}")
    if d == 0 or min([*inp_sizes, *out_sizes, *tt_ranks]) < 1:
        raise ArgumentError(f"TT needs at least one core and sizes and ranks >= 1, got inp_sizes {list(inp_sizes)}, "
                            f"out_sizes {list(out_sizes)}, tt_ranks {list(tt_ranks)}")
    if tt_ranks[0] != 1 or tt_ranks[-1] != 1:
        raise ArgumentError(f"TT: the first and last tt_ranks must be 1, got {list(tt_ranks)}")
    return d


def _check(X, b, cores, inp_sizes, out_sizes, tt_ranks) -> tuple[int, int]:
    """(M, N) of Y; the inputs and arguments checked."""
    d = _check_args(inp_sizes, out_sizes, tt_ranks)
    check_float("TT", X=X, b=b, cores=cores)
    if len(X.shape) < 2:
        raise ShapeError(f"TT: X must have at least 2 dims (batch x input), got shape {tuple(X.shape)}")
    k, n = math.prod(inp_sizes), math.prod(out_sizes)
    if math.prod(X.shape[1:]) != k:
        raise ShapeError(f"TT: X {tuple(X.shape)} has rows of {math.prod(X.shape[1:])} values but inp_sizes "
                         f"{list(inp_sizes)} multiply to {k}")
    if len(b.shape) != 1 or b.shape[0] != n:
        raise ShapeError(f"TT: b must be a vector of prod(out_sizes) = {n} values, got shape {tuple(b.shape)}")
    need = sum(inp_sizes[i] * tt_ranks[i + 1] * tt_ranks[i] * out_sizes[i] for i in range(d))
    if len(cores.shape) != 1 or size_of(cores) < need:
        raise ShapeError(f"TT: cores must be a vector of at least {need} values (the cores of these sizes and "
                         f"ranks), got shape {tuple(cores.shape)}")
    return int(X.shape[0]), n


def _tt_shape(specs, *, inp_sizes, out_sizes, tt_ranks):
    m, n = _check(*specs, inp_sizes, out_sizes, tt_ranks)
    return [out_spec((m, n), specs[0].dtype)]


@op("TT", inputs=3, outputs=1, inplace=(), args=TT_ARGS, shape=_tt_shape, shapes_from_inputs=True, grows="shapes",
    gradient=GRADIENT_NOT_IMPLEMENTED)
def tt(xp, X, b, cores, *, inp_sizes, out_sizes, tt_ranks):
    """X (M x K), b (N), CORES (the TT cores, last first) -> Y (M x N) = X times the TT matrix, plus b."""
    m, n = _check(X, b, cores, inp_sizes, out_sizes, tt_ranks)
    buf, at = X.reshape(-1), 0
    for i in reversed(range(len(inp_sizes))):
        rows, cols = inp_sizes[i] * tt_ranks[i + 1], tt_ranks[i] * out_sizes[i]
        core = cores[at:at + rows * cols].reshape(rows, cols)
        product = buf.reshape(-1, rows) @ core                               # (rest, r_i * o_i)
        buf = xp.ascontiguousarray(product.reshape(-1, out_sizes[i]).T).reshape(-1)   # o_i first
        at += rows * cols
    return xp.ascontiguousarray(buf.reshape(n, m).T) + b
