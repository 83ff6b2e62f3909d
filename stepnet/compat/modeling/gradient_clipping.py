"""Caffe2's GradientClipping: a NetModifier that scales each dense gradient of `grad_map` down when its norm
passes `clip_threshold` (ClipTensorByScaling, in place), the norm an L1 norm or an L2 norm (LpNorm's squared
sum, then Pow 0.5), into `<grad>_l<p>_norm` (scoped). With `use_parameter_norm` the threshold is relative to the
parameter's norm, computed the same way (and with `compute_norm_ratio`, gradient norm / parameter norm into
`<param>_norm_ratio`, for debugging). Each param's ops go on its device (`blob_to_device`, else the CPU).
Sparse gradients (GradientSlice) are left alone."""
from __future__ import annotations

from .net_modifier import NetModifier
from ... import caffe2_pb2
from .. import core
from ..optimizer import get_param_device


class GradientClipping(NetModifier):
    """Clips gradients by their norm (see the module)."""

    L1_NORM = "l1_norm"
    L2_NORM = "l2_norm"
    BY_NORM = "by_norm"
    GRAD_CLIP_METHODS = [BY_NORM]
    CLIP_GRADIENT_NORM_TYPES = [L2_NORM, L1_NORM]

    def __init__(self, grad_clip_method, clip_norm_type, clip_threshold, use_parameter_norm=False,
                 compute_norm_ratio=False):
        assert grad_clip_method in self.GRAD_CLIP_METHODS, (
            f"This method of clipping, {clip_norm_type}, has not been implemented.")
        assert clip_norm_type in self.CLIP_GRADIENT_NORM_TYPES, (
            f"This method of clipping, {clip_norm_type}, has not been implemented.")
        self.grad_clip_method = grad_clip_method
        self.clip_norm_type = clip_norm_type
        self.clip_threshold = float(clip_threshold)
        self.use_parameter_norm = use_parameter_norm
        self.compute_norm_ratio = compute_norm_ratio

    @staticmethod
    def _norm(net, blob, p: int):
        """The Lp norm of blob (for p = 2 LpNorm gives the squared sum: its square root is taken)."""
        norm = net.LpNorm([blob], net.NextScopedBlob(prefix=f"{blob}_l{p}_norm"), p=p)
        return net.Pow([norm], exponent=0.5) if p == 2 else norm

    def modify_net(self, net, init_net=None, grad_map=None, blob_to_device=None):
        assert grad_map is not None
        cpu = core.DeviceOption(caffe2_pb2.CPU)
        p = 2 if self.clip_norm_type == self.L2_NORM else 1
        for param, grad in grad_map.items():
            if isinstance(grad, core.GradientSlice):   # sparse gradients are not clipped
                continue
            device = get_param_device(param, grad_map[str(param)], param_to_device=blob_to_device,
                                      default_device=cpu)
            with core.DeviceScope(device):
                grad_norm = self._norm(net, grad, p)
                inputs = [grad, grad_norm]
                if self.use_parameter_norm:
                    param_norm = self._norm(net, param, p)
                    inputs.append(param_norm)
                    if self.compute_norm_ratio:
                        net.Div([grad_norm, param_norm], [net.NextScopedBlob(prefix=f"{param}_norm_ratio")])
                net.ClipTensorByScaling(inputs, [grad], threshold=self.clip_threshold)
