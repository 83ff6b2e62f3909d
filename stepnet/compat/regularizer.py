"""Caffe2's regularizers for LayerModelHelper parameters: L1Norm / L2Norm add `lambda * ||param||_p` to the loss
(ops LpNorm then Scale); MaxNorm / ConstantNorm renormalize the rows a sparse gradient touched after the
optimizer ran (SparseNormalize)."""
from __future__ import annotations

from . import core


class Regularizer:
    """`reg(net, init_net, param, grad=None)` adds the regularization of param to net; a loss regularizer
    returns the blob holding its term."""

    def __init__(self):
        self.apply_after_optimizer = False

    def __call__(self, net, param_init_net, param, grad=None):
        assert isinstance(param, core.BlobReference), f"{param} is not a BlobReference"
        return self._run(net, param_init_net, param, grad)

    def _run(self, net, param_init_net, param, grad):
        raise Exception("Not Impelemented")


class _LpNorm(Regularizer):
    p = 1
    suffix = "_l1_regularization"

    def __init__(self, reg_lambda):
        super().__init__()
        assert reg_lambda >= 0, "factor ahead of regularization should be 0 or positive"
        self.reg_lambda = reg_lambda

    def _run(self, net, param_init_net, param, grad=None):
        out = net.NextScopedBlob(param + self.suffix)
        net.LpNorm([param], [out], p=self.p)
        net.Scale([out], [out], scale=float(self.reg_lambda))   # an int lambda would be an int argument
        return out


class L1Norm(_LpNorm):
    p = 1
    suffix = "_l1_regularization"


class L2Norm(_LpNorm):
    p = 2
    suffix = "_l2_regularization"


class _SparseNorm(Regularizer):
    use_max_norm = True

    def __init__(self, norm=1.0):
        super().__init__()
        self.norm = norm
        self.apply_after_optimizer = True

    def _run(self, net, param_init_net, param, grad):
        assert self.norm > 0, "norm should be bigger than 0."
        if not isinstance(grad, core.GradientSlice):
            raise NotImplementedError(f"{type(self).__name__} is not supported for dense parameters")
        net.SparseNormalize([param, grad.indices, grad.values], [param], use_max_norm=self.use_max_norm,
                            norm=self.norm)


class MaxNorm(_SparseNorm):
    use_max_norm = True


class ConstantNorm(_SparseNorm):
    use_max_norm = False
