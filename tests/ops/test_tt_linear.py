"""TT (stepnet/ops/tt_linear.py) against the dense matrix its cores stand for, built here by summing the core
products index by index, on every device; Caffe2's own golden output for one sample; each row of a batch
computed on its own; bad arguments and inputs; no gradient; a broken kernel caught."""
import itertools
import math

import numpy as np
import pytest

from stepnet.compat.tt_core import init_tt_cores
from stepnet.core.errors import ArgumentError, GradientError, ShapeError
from stepnet.passes.gradients import backward_ops
from stepnet.testing import DEVICES, infer_static, make_op, run_op

rng = np.random.default_rng(13)


def core_tensors(cores, inp, out, ranks):
    """G[k][i, r_next, r, o]: core k is stored (inp_k * r_{k+1}) x (r_k * out_k), the last core first."""
    d, at, found = len(inp), 0, [None] * len(inp)
    for k in reversed(range(d)):
        size = inp[k] * ranks[k + 1] * ranks[k] * out[k]
        found[k] = np.asarray(cores[at:at + size], np.float64).reshape(inp[k], ranks[k + 1], ranks[k], out[k])
        at += size
    return found


def dense_ref(cores, inp, out, ranks):
    """W (prod inp x prod out): W[i, o] = sum over the inner ranks of prod_k G_k[i_k, r_{k+1}, r_k, o_k]."""
    g = core_tensors(cores, inp, out, ranks)
    w = np.zeros((math.prod(inp), math.prod(out)))
    for row, i in enumerate(itertools.product(*map(range, inp))):
        for col, o in enumerate(itertools.product(*map(range, out))):
            chain = np.ones((1,))
            for k in range(len(inp)):
                chain = chain @ g[k][i[k], :, :, o[k]].T          # (r_k) -> (r_{k+1})
            w[row, col] = chain[0]
    return w


SIZES = [([2, 3], [3, 2], [1, 4, 1]), ([2, 2, 2], [1, 3, 2], [1, 2, 3, 1]), ([5], [4], [1, 1]),
         ([3, 1, 2], [2, 2, 2], [1, 2, 2, 1])]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("inp,out,ranks", SIZES)
def test_tt_is_the_dense_product(inp, out, ranks, device):
    n_cores = sum(inp[k] * ranks[k + 1] * ranks[k] * out[k] for k in range(len(inp)))
    cores = rng.standard_normal(n_cores).astype(np.float32)
    x = rng.standard_normal((4, math.prod(inp))).astype(np.float32)
    b = rng.standard_normal(math.prod(out)).astype(np.float32)
    got = run_op("TT", [x, b, cores], device=device, inp_sizes=inp, out_sizes=out, tt_ranks=ranks)
    assert got.shape == (4, math.prod(out)) and got.dtype == np.float32
    np.testing.assert_allclose(got, x.astype(np.float64) @ dense_ref(cores, inp, out, ranks) + b, rtol=1e-4,
                               atol=1e-5)
    one = run_op("TT", [x[2:3], b, cores], inp_sizes=inp, out_sizes=out, tt_ranks=ranks)
    np.testing.assert_allclose(one, got[2:3], rtol=1e-6, atol=1e-6)       # each row on its own


def test_caffe2_golden_output():
    inp, out, ranks = [2, 2, 2, 2], [2, 2, 2, 2], [1, 3, 3, 3, 1]
    np.random.seed(1234)
    x = np.expand_dims(np.random.rand(16).astype(np.float32), axis=0)
    cores = init_tt_cores(inp, out, ranks)
    golden = [-9.51763490e-07, -1.28442286e-06, -2.86281141e-07, 2.28865644e-07, -1.96180017e-06,
              -1.78920531e-06, 9.31094666e-07, -2.04273989e-07, 1.70017107e-06, 1.64845711e-06, -1.06099132e-06,
              -4.69111137e-07, 6.57552358e-08, -1.28942040e-08, -2.29114004e-07, -1.04262714e-06]
    y = run_op("TT", [x, np.zeros(16, np.float32), cores], inp_sizes=inp, out_sizes=out, tt_ranks=ranks)
    assert np.linalg.norm(y.reshape(16) - golden) < 1e-10


def test_inference_and_bad_inputs():
    args = {"inp_sizes": [2, 3], "out_sizes": [3, 2], "tt_ranks": [1, 4, 1]}
    x, b, cores = np.ones((5, 6), np.float32), np.ones(6, np.float32), np.ones(48, np.float32)
    assert infer_static("TT", [x, b, cores], **args)[0].shape == (5, 6)
    assert run_op("TT", [np.ones((2, 2, 3), np.float32), b, cores], **args).shape == (2, 6)
    for bad, error, match in [({"out_sizes": [3]}, ArgumentError, "inp_sizes has 2 entries but out_sizes has 1"),
                              ({"tt_ranks": [1, 4]}, ArgumentError, "3 entries, got 2"),
                              ({"tt_ranks": [2, 4, 1]}, ArgumentError, "first and last tt_ranks must be 1"),
                              ({"inp_sizes": [0, 3]}, ArgumentError, "sizes and ranks >= 1"),
                              ({"inp_sizes": [2, 2]}, ShapeError, "rows of 6 values but inp_sizes"),
                              ({"tt_ranks": [1, 5, 1]}, ShapeError, "at least 60 values")]:
        with pytest.raises(error, match=match):
            run_op("TT", [x, b, cores], **{**args, **bad})
    with pytest.raises(ShapeError, match="at least 2 dims"):
        run_op("TT", [np.ones(6, np.float32), b, cores], **args)
    with pytest.raises(ShapeError, match="vector of prod\\(out_sizes\\) = 6"):
        run_op("TT", [x, np.ones(5, np.float32), cores], **args)
    with pytest.raises(GradientError, match="no gradient implemented yet"):
        backward_ops([make_op("TT", ["x", "b", "c"], ["y"], **args)], {"y": "y_grad"})


def test_checker_catches_a_broken_kernel(broken):
    def batch_mixed(xp, X, b, cores, *, inp_sizes, out_sizes, tt_ranks):   # Caffe2's last transpose
        buf, at = X.reshape(-1), 0
        for i in reversed(range(len(inp_sizes))):
            rows, cols = inp_sizes[i] * tt_ranks[i + 1], tt_ranks[i] * out_sizes[i]
            product = buf.reshape(-1, rows) @ cores[at:at + rows * cols].reshape(rows, cols)
            buf, at = product.reshape(-1, out_sizes[i]).T.reshape(-1), at + rows * cols
        return buf.reshape(X.shape[0], -1).T.reshape(X.shape[0], -1) + b
    broken("TT", batch_mixed)
    with pytest.raises(AssertionError):
        test_tt_is_the_dense_product(*SIZES[0], "cpu")
