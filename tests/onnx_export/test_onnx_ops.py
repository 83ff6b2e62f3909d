"""Every converter against stepnet's own kernel: one-op nets exported, run in onnxruntime, compared (rtol 1e-4),
over the argument forms each op has (orders, legacy pads, broadcast axes, in-place, ...)."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from onnx_check import check_op, compare, one_op  # noqa: E402

from stepnet.export.onnx.table import table  # noqa: E402

R = np.random.default_rng(7)
F = np.float32


def u(*shape, lo=-1.0, hi=1.0):
    return R.uniform(lo, hi, shape).astype(F)


def ints(*shape, hi=5, dtype=np.int32):
    return R.integers(0, hi, shape).astype(dtype)


X4, X3, X2 = u(2, 3, 5, 6), u(2, 3, 4), u(3, 4)
POS = u(2, 3, 4, lo=0.1, hi=2.0)
UNARY = ["Relu", "Sigmoid", "Tanh", "Exp", "Abs", "Negative", "Sign", "Sin", "Cos", "Softsign", "Softplus",
         "Sqr", "Swish", "Cbrt"]
POSITIVE = ["Log", "Sqrt", "Rsqrt", "Reciprocal"]

# (op type, inputs, outputs, constant inputs, arguments)
CASES = [(t, {"x": X3}, 1, (), {}) for t in UNARY] + [(t, {"x": POS}, 1, (), {}) for t in POSITIVE] + [
    ("Elu", {"x": X3}, 1, (), {"alpha": 0.7}), ("LeakyRelu", {"x": X3}, 1, (), {"alpha": 0.2}),
    ("Selu", {"x": X3}, 1, (), {}), ("HardSigmoid", {"x": X3}, 1, (), {"alpha": 0.3, "beta": 0.4}),
    ("Logit", {"x": u(3, 4, lo=0, hi=1)}, 1, (), {"eps": 1e-3}),
    ("Clip", {"x": X3}, 1, (), {"min": -0.5, "max": 0.3}), ("Clip", {"x": X3}, 1, (), {"max": 0.3}),
    ("PRelu", {"x": X4, "s": u(3)}, 1, ("s",), {}),
    ("PRelu", {"x": u(2, 4, 5, 3), "s": u(3)}, 1, (), {"order": "NHWC"}),
    ("PRelu", {"x": X4, "s": u(1)}, 1, (), {}),
    ("Not", {"x": X3 > 0}, 1, (), {}),
    ("Add", {"a": X4, "b": u(3)}, 1, (), {"broadcast": 1, "axis": 1}),
    ("Add", {"a": X4, "b": u(5, 6)}, 1, (), {"broadcast": 1}),
    ("Add", {"a": X4, "b": u(1, 3, 1)}, 1, (), {"broadcast": 1, "axis": 0}),
    ("Sub", {"a": X4, "b": u(3, 5)}, 1, (), {"broadcast": 1, "axis_str": "C"}),
    ("Mul", {"a": X4, "b": u(2, 1, 5, 1)}, 1, (), {}), ("Div", {"a": X4, "b": u(6, lo=1, hi=2)}, 1, (), {}),
    ("Div", {"a": ints(3, 4, hi=50) - 25, "b": ints(3, 4, hi=6) + 1}, 1, (), {}),
    ("Pow", {"a": POS}, 1, (), {"exponent": 1.7}), ("Pow", {"a": POS, "e": u(4)}, 1, (), {}),
    ("EQ", {"a": ints(3, 4), "b": ints(3, 4)}, 1, (), {}), ("NE", {"a": ints(3, 4), "b": ints(4)}, 1, (), {}),
    ("LT", {"a": X2, "b": u(4)}, 1, (), {}), ("LE", {"a": ints(3, 4), "b": ints(3, 4)}, 1, (), {}),
    ("GT", {"a": X4, "b": u(3)}, 1, (), {"broadcast": 1, "axis": 1}), ("GE", {"a": X2, "b": u(3, 4)}, 1, (), {}),
    ("And", {"a": X2 > 0, "b": u(3, 4) > 0}, 1, (), {}), ("Or", {"a": X2 > 0, "b": u(4) > 0}, 1, (), {}),
    ("Xor", {"a": X2 > 0, "b": u(3, 4) > 0}, 1, (), {}),
    ("Sum", {"a": X3}, 1, (), {}), ("Sum", {"a": X3, "b": u(2, 3, 4), "c": u(2, 3, 4)}, 1, (), {}),
    ("SumInt", {"a": ints(3, 4), "b": ints(3, 4), "c": ints(3, 4)}, 1, (), {}),
    ("Max", {"a": X3, "b": u(2, 3, 4)}, 1, (), {}), ("Min", {"a": X3, "b": u(2, 3, 4), "c": u(2, 3, 4)}, 1, (), {}),
    ("Scale", {"x": X3}, 1, (), {"scale": -2.5}),
    ("WeightedSum", {"a": X3, "wa": u(1), "b": u(6, 4), "wb": u(1)}, 1, (), {}),
    ("ElementwiseLinear", {"x": X3, "a": u(12), "b": u(12)}, 1, (), {"axis": 1}),
    ("Cast", {"x": X3 * 10}, 1, (), {"to": 2}), ("Cast", {"x": X3}, 1, (), {"to": "bool"}),
    ("Cast", {"x": ints(3, 4)}, 1, (), {"to": "float"}),
    ("FC", {"x": X2, "w": u(5, 4), "b": u(5)}, 1, ("w", "b"), {}),
    ("FC", {"x": u(5, 2, 4), "w": u(6, 4), "b": u(6)}, 1, (), {"axis": 2}),
    ("FC", {"x": X4, "w": u(7, 1, 1, 30), "b": u(7)}, 1, (), {"axis": 2, "axis_w": 3}),
    ("FCTransposed", {"x": X2, "w": u(4, 5), "b": u(5)}, 1, (), {}),
    ("MatMul", {"a": X2, "b": u(4, 5)}, 1, (), {}), ("MatMul", {"a": u(4, 3), "b": u(5, 4)}, 1, (),
                                                        {"trans_a": 1, "trans_b": 1}),
    ("MatMul", {"a": u(2, 3, 4), "b": u(4, 5)}, 1, (), {"axis_a": 2}),
    ("BatchMatMul", {"a": u(2, 3, 4), "b": u(2, 4, 5)}, 1, (), {}),
    ("BatchMatMul", {"a": u(2, 4, 3), "b": u(2, 5, 4)}, 1, (), {"trans_a": 1, "trans_b": 1}),
    ("BatchMatMul", {"a": u(4), "b": u(4)}, 1, (), {}),
    ("BatchMatMul", {"a": u(2, 3, 4), "b": u(4, 5)}, 1, (), {"broadcast": 1}),
    ("Softmax", {"x": X4}, 1, (), {}), ("Softmax", {"x": X4}, 1, (), {"axis": 3}), ("Softmax", {"x": X2}, 1, (), {}),
    ("ReduceSum", {"x": X4}, 1, (), {"axes": [1, 3], "keepdims": 0}), ("ReduceMean", {"x": X4}, 1, (), {}),
    ("ReduceMax", {"x": X4}, 1, (), {"axes": [-1]}), ("ReduceMin", {"x": X3}, 1, (), {"axes": [0], "keepdims": 0}),
    ("ReduceL1", {"x": X3}, 1, (), {"axes": [2]}), ("ReduceL2", {"x": X3}, 1, (), {"axes": [1, 2]}),
    ("ReduceSum", {"x": ints(3, 4)}, 1, (), {"axes": [1]}),
    ("ReduceFrontSum", {"x": X4}, 1, (), {"num_reduce_dim": 2}), ("ReduceBackMean", {"x": X4}, 1, (), {}),
    ("ReduceFrontMax", {"x": X3}, 1, (), {}), ("ReduceBackMax", {"x": X3}, 1, (), {"num_reduce_dim": 2}),
    ("ReduceFrontMean", {"x": X3}, 1, (), {}), ("ReduceBackSum", {"x": X3}, 1, (), {}),
    ("ReduceBackSum", {"x": X2, "len": np.array([1, 4, 2], np.int32)}, 1, (), {}),
    ("ReduceFrontMax", {"x": X2, "len": np.array([1, 3, 2, 3], np.int32)}, 1, (), {}),
    ("ReduceBackMean", {"x": X2, "len": np.array([1, 4, 2], np.int32)}, 1, (), {}),
    ("SumElements", {"x": X3}, 1, (), {}), ("SumElements", {"x": X3}, 1, (), {"average": 1}),
    ("SumElementsInt", {"x": ints(3, 4)}, 1, (), {}), ("SumSqrElements", {"x": X3}, 1, (), {"average": 1}),
    ("RowwiseMax", {"x": X3}, 1, (), {}), ("ColwiseMax", {"x": X3}, 1, (), {}),
    ("LpNorm", {"x": X3}, 1, (), {"p": 1}), ("LpNorm", {"x": X3}, 1, (), {"p": 2, "average": 1}),
    # image family
    ("Conv", {"x": X4, "w": u(4, 3, 3, 3), "b": u(4)}, 1, ("w", "b"), {"kernel": 3, "pad": 1}),
    ("Conv", {"x": X4, "w": u(4, 3, 2, 3)}, 1, (), {"kernel_h": 2, "kernel_w": 3, "stride": 2,
                                                    "pads": [0, 1, 1, 0]}),
    ("Conv", {"x": u(2, 4, 7, 7), "w": u(6, 2, 3, 3), "b": u(6)}, 1, (), {"group": 2, "dilation": 2}),
    ("Conv", {"x": u(2, 5, 6, 3), "w": u(4, 3, 3, 3), "b": u(4)}, 1, (), {"order": "NHWC", "legacy_pad": 2,
                                                                         "stride": 2}),
    ("Conv1D", {"x": u(2, 3, 9), "w": u(4, 3, 3)}, 1, (), {"legacy_pad": 1}),
    ("Conv", {"x": u(1, 2, 4, 5, 5), "w": u(3, 2, 1, 3, 3)}, 1, (), {}),
    ("ConvTranspose", {"x": X4, "w": u(3, 2, 3, 3), "b": u(2)}, 1, (), {"kernel": 3, "stride": 2, "pad": 1,
                                                                      "adj": 1}),
    ("ConvTranspose", {"x": u(2, 5, 4, 3), "w": u(3, 2, 2, 4)}, 1, (), {"order": "NHWC", "stride": 2}),
    ("MaxPool", {"x": X4}, 1, (), {"kernel": 3, "stride": 2, "legacy_pad": 3}),
    ("MaxPool", {"x": u(1, 2, 7, 7)}, 1, (), {"kernel": 3, "stride": 2, "pad": 1, "legacy_pad": 3}),
    ("MaxPool", {"x": X4}, 1, (), {"kernel": 2, "pad_t": 0, "pad_l": 1, "pad_b": 1, "pad_r": 0}),
    ("AveragePool", {"x": u(1, 2, 7, 7)}, 1, (), {"kernel": 3, "stride": 2, "pad": 1, "legacy_pad": 3}),
    ("AveragePool", {"x": X4}, 1, (), {"kernel": 3, "pad": 1, "count_include_pad": 1}),
    ("AveragePool", {"x": X4}, 1, (), {"global_pooling": 1}),
    ("MaxPool2D", {"x": u(2, 5, 6, 3)}, 1, (), {"kernel": 2, "order": "NHWC", "legacy_pad": 2}),
    ("AveragePool1D", {"x": u(2, 3, 9)}, 1, (), {"kernel": 3, "stride": 2}),
    ("MaxPool", {"x": X4}, 1, (), {"global_pooling": 1, "order": "NHWC"}),
    ("Conv2D", {"x": X4, "w": u(2, 3, 1, 1)}, 1, (), {}), ("Conv3D", {"x": u(1, 2, 3, 4, 4), "w": u(2, 2, 2, 2, 2)},
                                                             1, (), {"pad": 1}),
    ("MaxPool1D", {"x": u(2, 3, 9)}, 1, (), {"kernel": 2}),
    ("MaxPool3D", {"x": u(1, 2, 3, 4, 4)}, 1, (), {"kernel": 2}),
    ("AveragePool2D", {"x": X4}, 1, (), {"kernel": 2}), ("AveragePool3D", {"x": u(1, 2, 3, 4, 4)}, 1, (),
                                                                          {"kernel": 2, "stride": 2}),
    ("LpPool", {"x": X4}, 1, (), {"kernel": 2, "p": 2.0}), ("LpPool", {"x": X4}, 1, (), {"global_pooling": 1}),
    ("LRN", {"x": u(2, 7, 3, 3)}, 1, (), {"size": 5, "alpha": 1e-2, "beta": 0.75, "bias": 1.0}),
    ("LRN", {"x": u(2, 3, 3, 7)}, 1, (), {"size": 3, "alpha": 0.1, "beta": 0.5, "bias": 2.0, "order": "NHWC"}),
    ("SpatialBN", {"x": X4, "s": u(3), "b": u(3), "m": u(3), "v": u(3, lo=0.5, hi=2)}, 1, ("s", "b", "m", "v"),
     {"is_test": 1, "epsilon": 1e-3}),
    ("SpatialBN", {"x": u(2, 5, 6, 3), "s": u(3), "b": u(3), "m": u(3), "v": u(3, lo=0.5, hi=2)}, 1, (),
     {"is_test": 1, "order": "NHWC"}),
    ("InstanceNorm", {"x": X4, "s": u(3), "b": u(3)}, 1, (), {"epsilon": 1e-3}),
    ("InstanceNorm", {"x": u(2, 5, 6, 3), "s": u(3), "b": u(3)}, 1, (), {"order": "NHWC"}),
    ("LayerNorm", {"x": X3}, 3, (), {"axis": 1}), ("LayerNorm", {"x": X4, "g": u(30), "b": u(30)}, 3, (),
                                                       {"axis": 2, "elementwise_affine": 1}),
    ("GroupNorm", {"x": u(2, 4, 3, 3), "g": u(4), "b": u(4)}, 3, (), {"group": 2, "is_test": 0}),
    ("GroupNorm", {"x": u(2, 3, 3, 6), "g": u(6), "b": u(6)}, 1, (), {"group": 3, "order": "NHWC"}),
    ("Dropout", {"x": X3}, 1, (), {"is_test": 1}),
    ("Normalize", {"x": X3}, 1, (), {"axis": 1}), ("NormalizeL1", {"x": X3}, 1, (), {}),
    ("PadImage", {"x": X4}, 1, (), {"pad_t": 1, "pad_l": 2, "pad_b": 0, "pad_r": 1, "mode": "reflect"}),
    ("PadImage", {"x": X4}, 1, (), {"pad": 2, "mode": "edge"}),
    ("PadImage", {"x": u(2, 5, 6, 3)}, 1, (), {"pads": [1, 0, 2, 1], "value": 1.5, "order": "NHWC"}),
    ("ResizeNearest", {"x": X4}, 1, (), {"width_scale": 1.5, "height_scale": 2.0}),
    ("ResizeNearest", {"x": u(1, 5, 7, 2)}, 1, (), {"width_scale": 0.6, "height_scale": 1.3, "order": "NHWC"}),
    ("ChannelShuffle", {"x": u(2, 6, 2, 3)}, 1, (), {"group": 2}),
    ("ChannelShuffle", {"x": u(2, 2, 3, 6)}, 1, (), {"group": 3, "order": "NHWC"}),
    ("BRGNCHWCToPackedInt8BGRAStylizerDeprocess", {"x": u(1, 3, 4, 5, lo=-300, hi=300), "m": u(3, hi=50)}, 1,
     ("m",), {}),
    # layout and shape family
    ("Copy", {"x": X3}, 1, (), {}), ("Alias", {"x": X3}, 1, (), {}), ("StopGradient", {"x": X3}, 1, (), {}),
    ("EnsureDense", {"x": X3}, 1, (), {}), ("CopyCPUToGPU", {"x": X3}, 1, (), {}),
    ("CopyGPUToCPU", {"x": X3}, 1, (), {}), ("CopyFromCPUInput", {"x": X3}, 1, (), {}),
    ("EnsureCPUOutput", {"x": X3}, 1, (), {}), ("CopyOnDeviceLike", {"x": X3, "y": X3}, 1, (), {}),
    ("NanCheck", {"x": X3}, 1, (), {}),
    ("Reshape", {"x": X4}, 2, (), {"shape": [0, -1, 5]}),
    ("Reshape", {"x": X4, "s": np.array([6, 0, -1], np.int64)}, 2, ("s",), {}),
    ("Reshape", {"x": X4, "s": np.array([6, 0, -1], np.int64)}, 2, (), {}),
    ("Flatten", {"x": X4}, 1, (), {"axis": 2}), ("FlattenToVec", {"x": X3}, 1, (), {}),
    ("ResizeLike", {"x": X3, "y": u(4, 6)}, 1, (), {}),
    ("Transpose", {"x": X4}, 1, (), {}), ("Transpose", {"x": X4}, 1, (), {"axes": [0, 2, 3, 1]}),
    ("NCHW2NHWC", {"x": X4}, 1, (), {}), ("NHWC2NCHW", {"x": X4}, 1, (), {}),
    ("Squeeze", {"x": u(2, 1, 3, 1)}, 1, (), {"dims": [1, 3]}), ("ExpandDims", {"x": X2}, 1, (), {"dims": [0, 3]}),
    ("Shape", {"x": X4}, 1, (), {}), ("Shape", {"x": X4}, 1, (), {"axes": [3, 1]}), ("Size", {"x": X4}, 1, (), {}),
    ("Concat", {"a": X4, "b": u(2, 1, 5, 6)}, 2, (), {}), ("Concat", {"a": X3, "b": u(2, 3, 2)}, 2, (), {"axis": -1}),
    ("Concat", {"a": X2, "b": u(3, 4)}, 2, (), {"axis": 1, "add_axis": 1}),
    ("Concat", {"a": u(2, 5, 6, 3), "b": u(2, 5, 6, 2)}, 2, (), {"order": "NHWC"}),
    ("Split", {"x": X4}, 3, (), {"axis": 1}), ("Split", {"x": X4}, 2, (), {"axis": 3, "split": [2, 4]}),
    ("Split", {"x": X4, "s": np.array([1, 4], np.int32)}, 2, ("s",), {"axis": 2}),
    ("Split", {"x": X3}, 3, (), {"axis": 1, "add_axis": 1}),
    ("Slice", {"x": X4}, 1, (), {"starts": [0, 1, 2], "ends": [-1, 3, -2]}),
    ("Slice", {"x": X3, "s": np.array([1, 0], np.int32), "e": np.array([2, -1], np.int32)}, 1, ("s", "e"), {}),
    ("Slice", {"x": X3, "s": np.array([1, 0], np.int64), "e": np.array([-1, 3], np.int64)}, 1, (), {}),
    ("Tile", {"x": X3}, 1, (), {"tiles": 3, "axis": 1}),
    ("Tile", {"x": X3, "t": np.array([2], np.int32), "a": np.array([2], np.int32)}, 1, ("t", "a"), {}),
    ("Gather", {"d": u(6, 3), "i": ints(2, 4, hi=6)}, 1, (), {}),
    ("Gather", {"d": u(6, 3), "i": np.array([-1, 2], np.int64)}, 1, (), {}),
    ("Gather", {"d": X3, "i": ints(5, hi=3)}, 1, (), {"axis": 1}),
    ("BatchGather", {"d": X3, "i": ints(2, 2, hi=3)}, 1, (), {}),
    ("OneHot", {"i": ints(5, hi=6, dtype=np.int64), "n": np.array([6], np.int64)}, 1, ("n",), {}),
    ("BatchOneHot", {"d": ints(3, 2, dtype=np.int64), "l": np.array([2, 3], np.int32),
                     "v": np.array([0, 1, 2, 3, 4], np.int64)}, 1, ("l", "v"), {}),
    ("ArgMax", {"x": X3}, 1, (), {}), ("ArgMin", {"x": X3}, 1, (), {"axis": 1, "keepdims": 0}),
    ("ConstantFill", {"x": X3}, 1, (), {"value": 2.5}),
    ("ConstantFill", {"x": np.array([2, 3], np.int64)}, 1, ("x",), {"input_as_shape": 1, "value": 3, "dtype": 2,
                                                                    "extra_shape": [4]}),
    # losses and metrics
    ("LabelCrossEntropy", {"x": u(4, 5, lo=0, hi=1), "l": ints(4, hi=5)}, 1, (), {}),
    ("CrossEntropy", {"x": u(4, 5, lo=0, hi=1), "l": u(4, 5, lo=0, hi=1)}, 1, (), {}),
    ("AveragedLoss", {"x": X3}, 1, (), {}),
    ("SquaredL2Distance", {"a": X3, "b": u(2, 3, 4)}, 1, (), {}), ("L1Distance", {"a": X3, "b": u(2, 3, 4)}, 1, (), {}),
    ("DotProduct", {"a": X2, "b": u(3, 4)}, 1, (), {}), ("CosineSimilarity", {"a": X3, "b": u(2, 3, 4)}, 1, (), {}),
    ("SigmoidCrossEntropyWithLogits", {"l": X3 * 5, "t": u(2, 3, 4, lo=0, hi=1)}, 1, (), {}),
    ("SigmoidCrossEntropyWithLogits", {"l": X3, "t": u(2, 3, 4, lo=0, hi=1)}, 1, (), {"log_D_trick": 1}),
    ("SigmoidCrossEntropyWithLogits", {"l": X3, "t": u(2, 3, 4, lo=0, hi=1)}, 1, (), {"unjoined_lr_loss": 1}),
    ("WeightedSigmoidCrossEntropyWithLogits", {"l": X3, "t": u(2, 3, 4, lo=0, hi=1), "w": u(2, 3, 4)}, 1, (), {}),
    ("MakeTwoClass", {"x": u(3, 4, lo=0, hi=1)}, 1, (), {}),
    ("SoftmaxWithLoss", {"x": u(4, 5), "l": ints(4, hi=5)}, 2, (), {}),
    ("SoftmaxWithLoss", {"x": u(4, 5), "l": ints(4, hi=5), "w": u(4, lo=0, hi=1)}, 2, (), {"scale": 2.0}),
    ("SoftmaxWithLoss", {"x": u(2, 3, 4), "l": np.full((2, 3, 4), 0.25, F)}, 2, (), {"label_prob": 1, "axis": 2}),
    ("Accuracy", {"x": np.round(u(6, 5), 1), "l": ints(6, hi=5)}, 1, (), {"top_k": 2}),
    ("Accuracy", {"x": u(6, 5), "l": ints(6, hi=5)}, 1, (), {}),
    ("SpatialSoftmaxWithLoss", {"x": u(2, 3, 2, 2), "l": ints(2, 2, 2, hi=4) - 1}, 2, (), {}),
    ("SoftmaxWithLoss", {"x": u(2, 3, 2, 2), "l": ints(2, 2, 2, hi=3), "w": u(2, 2, 2, lo=0, hi=1)}, 2, (),
     {"spatial": 1}),
    ("SumReduceLike", {"a": X4, "b": u(3, 5)}, 1, (), {"axis": 1}),
    ("SumReduceLike", {"a": X4, "b": u(1, 6)}, 1, (), {}),
    ("ClipTensorByScaling", {"x": X3, "v": np.array([3.0], F)}, 1, (), {"threshold": 1.5}),
    ("ClipTensorByScaling", {"x": X3, "v": np.array([3.0], F), "e": np.array([4.0], F)}, 1, (), {"threshold": 1.5}),
    ("RangeFill", {"x": X3}, 1, (), {}),
    # segment reductions (an empty segment included)
    ("LengthsSum", {"d": u(6, 2, 3), "l": np.array([2, 0, 4], np.int32)}, 1, (), {}),
    ("LengthsMean", {"d": u(6, 3), "l": np.array([1, 5, 0], np.int32)}, 1, (), {}),
    ("LengthsMax", {"d": u(6, 3), "l": np.array([3, 0, 3], np.int32)}, 1, (), {}),
    ("SparseLengthsSum", {"d": u(5, 3), "i": ints(7, hi=5), "l": np.array([3, 0, 4], np.int32)}, 1, ("d",), {}),
    ("SparseLengthsMean", {"d": u(5, 3).astype(np.float16), "i": ints(4, hi=5, dtype=np.int64),
                           "l": np.array([1, 3], np.int32)}, 1, (), {}),
    ("SparseLengthsWeightedSum", {"d": u(5, 3), "w": u(7), "i": ints(7, hi=5), "l": np.array([3, 4], np.int32)},
     1, (), {}),
]


def _id(case):
    op_type, inputs, _, consts, args = case
    return f"{op_type}-{'-'.join(f'{k}={v}' for k, v in args.items())}" if args else op_type


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_converter_matches_stepnet(case):
    op_type, inputs, outputs, consts, args = case
    check_op(op_type, inputs, outputs, consts, **args)


@pytest.mark.parametrize("case", CASES[::3], ids=[_id(c) for c in CASES[::3]])
def test_converter_at_the_lowest_opset(case):
    """Every third case at opset 13 (Squeeze, Split, Reduce* take their axes as attributes or inputs by opset);
    a converter needing a newer opset says so."""
    from stepnet.export.onnx import OpsetError
    from stepnet.export.onnx.emit import MIN_OPSET

    op_type, inputs, outputs, consts, args = case
    if table()[op_type].opset > MIN_OPSET:
        with pytest.raises(OpsetError, match=f"needs opset {table()[op_type].opset}"):
            check_op(op_type, inputs, outputs, consts, opset=MIN_OPSET, **args)
    else:
        check_op(op_type, inputs, outputs, consts, opset=MIN_OPSET, **args)


SPECIAL = {"RecurrentNetwork", "LSTMUnit", "GRUUnit"}   # tests/onnx_export/test_onnx_rnn.py


def test_every_converter_has_a_case():
    covered = {c[0] for c in CASES} | SPECIAL
    missing = sorted(set(table()) - covered)
    assert not missing, f"converters without a case in CASES: {missing}"


def test_a_scalar_transpose_exports_as_identity():
    """Transpose of a 0-d tensor: ONNX cannot write an empty perm attribute (onnx.helper raised once), and
    nothing moves: Identity, the same value in onnxruntime."""
    scalar = np.array(1.5, np.float32)
    result, _ = compare(one_op("Transpose", {"s": scalar}), feeds={"s": scalar})
    assert [n.op_type for n in result.model.graph.node] == ["Identity"]


def test_a_folded_op_making_an_int8_tensor_is_refused_cleanly():
    """A constant-foldable op whose output is an Int8 tensor (no ONNX constant of it here): UnsupportedOpError
    naming the op and the output, not the Int8 tensor's TypeError."""
    from stepnet.export.onnx import UnsupportedOpError, export_onnx

    net = one_op("Int8GivenTensorFill", {}, values=b"\x01\x02", shape=[2], Y_scale=1.0, Y_zero_point=0)
    with pytest.raises(UnsupportedOpError, match=r"op #0 \(Int8GivenTensorFill\): output 0 \('out0'\) is a "
                                                 r"Int8Tensor"):
        export_onnx(net, inputs={})
