"""Static shape inference over whole nets for the shape, index, norm, image, conv and pool families: every
blob's spec is inferred before anything runs (and agrees with a real run), statically wrong nets fail at
inference naming the op, and a wrong shape function is caught by run_op's cross-check."""
import re

import numpy as np
import pytest

from stepnet.core.errors import ArgumentError, ShapeError
from stepnet.ops import REGISTRY
from stepnet.io.proto import NetDef
from stepnet.core.spec import TensorSpec, spec
from stepnet.passes.shapes import infer_net
from stepnet.testing import make_op, run_op
from stepnet.runtime.workspace import Workspace

RNG = np.random.default_rng(11)


def net_of(*ops, name="net"):
    """A NetDef from (type, inputs, outputs, args) tuples."""
    net = NetDef(name=name)
    for op_type, ins, outs, args in ops:
        net.op.append(make_op(op_type, ins, outs, **args))
    return net


def run_net(net, feeds):
    """Run the net for real and return {blob: array} of everything it wrote."""
    ws = Workspace()
    for name, value in feeds.items():
        ws.feed(name, value)
    ws.run_net_once(net)
    return {name: ws.fetch(name) for op in net.op for name in op.output}


def assert_specs(inferred, expected):
    """Every expected blob has exactly the expected (shape, dtype); (None, None) means unknown."""
    for name, (shape, dtype) in expected.items():
        got = inferred[name]
        assert got.shape == shape, f"{name}: inferred shape {got.shape}, expected {shape}"
        assert got.dtype == (None if dtype is None else np.dtype(dtype)), f"{name}: dtype {got.dtype}"


def assert_agrees_with_run(inferred, actual):
    for name, value in actual.items():
        s = inferred[name]
        if s.shape is not None:
            assert s.shape == value.shape and s.dtype == value.dtype, (name, s, value.shape, value.dtype)


# ------------------------------------------------------------------------------------------- whole nets
IMAGE_NET = net_of(
    ("PadImage", ["X"], ["padded"], {"pad": 1, "mode": "edge"}),
    ("SpatialBN", ["padded", "s", "b", "m", "v"], ["bn"], {"is_test": 1}),
    ("ChannelShuffle", ["bn"], ["shuffled"], {"group": 3}),
    ("ResizeNearest", ["shuffled"], ["big"], {"width_scale": 2.0, "height_scale": 0.5}),
    ("NCHW2NHWC", ["big"], ["nhwc"], {}),
    ("Flatten", ["nhwc"], ["flat"], {}),
    ("Normalize", ["flat"], ["unit"], {}),
    ("Dropout", ["unit"], ["dropped", "mask"], {"ratio": 0.25}),
    ("LayerNorm", ["dropped"], ["ln", "ln_mean", "ln_std"], {}),
)


def test_image_net_every_blob():
    x = RNG.standard_normal((2, 6, 5, 4)).astype(np.float32)
    vec = {k: RNG.uniform(0.5, 1.5, 6).astype(np.float32) for k in "sbmv"}
    inferred = infer_net(IMAGE_NET, {"X": TensorSpec.of(x), **{k: TensorSpec.of(v) for k, v in vec.items()}})
    assert_specs(inferred, {
        "padded": ((2, 6, 7, 6), np.float32), "bn": ((2, 6, 7, 6), np.float32),
        "shuffled": ((2, 6, 7, 6), np.float32), "big": ((2, 6, 3, 12), np.float32),
        "nhwc": ((2, 3, 12, 6), np.float32), "flat": ((2, 216), np.float32), "unit": ((2, 216), np.float32),
        "dropped": ((2, 216), np.float32), "mask": ((2, 216), np.bool_), "ln": ((2, 216), np.float32),
        "ln_mean": ((2, 1), np.float32), "ln_std": ((2, 1), np.float32)})
    assert_agrees_with_run(inferred, run_net(IMAGE_NET, {"X": x, **vec}))


EMBEDDING_NET = net_of(
    ("SparseLengthsSum", ["table", "ids", "lengths"], ["bags"], {}),
    ("Gather", ["table", "ids"], ["rows"], {}),
    ("LengthsMean", ["rows", "lengths"], ["means"], {}),
    ("Concat", ["bags", "means"], ["both", "split_info"], {"axis": 1}),
    ("ArgMax", ["both"], ["best"], {"keepdims": False}),
    ("LengthsToSegmentIds", ["lengths"], ["segments"], {}),
    ("LengthsToRanges", ["lengths"], ["ranges"], {}),
    ("LengthsTile", ["both", "lengths"], ["tiled"], {}),
    ("Split", ["tiled"], ["left", "right"], {"axis": 1, "split": [3, 5]}),
    ("OneHot", ["segments", "classes"], ["hot"], {}),
)


def embedding_feeds(lengths):
    return {"table": RNG.standard_normal((10, 4)).astype(np.float32),
            "ids": RNG.integers(0, 10, sum(lengths)).astype(np.int64),
            "lengths": np.array(lengths, np.int32), "classes": np.array([3], np.int64)}


def test_embedding_net_every_blob():
    feeds = embedding_feeds([2, 0, 5])
    inferred = infer_net(EMBEDDING_NET, {k: TensorSpec.of(v) for k, v in feeds.items()})
    assert_specs(inferred, {
        "bags": ((3, 4), np.float32), "rows": ((7, 4), np.float32), "means": ((3, 4), np.float32),
        "both": ((3, 8), np.float32), "split_info": ((2,), np.int32), "best": ((3,), np.int64),
        "segments": ((7,), np.int32), "ranges": ((3, 2), np.int32), "tiled": ((7, 8), np.float32),
        "left": ((7, 3), np.float32), "right": ((7, 5), np.float32), "hot": ((7, 3), np.float32)})
    assert list(inferred["split_info"].value) == [4, 4]
    assert_agrees_with_run(inferred, run_net(EMBEDDING_NET, feeds))


def test_value_dependent_sizes_stay_unknown():
    """Without the lengths' values, only the sizes they decide are unknown (None), and what follows them."""
    feeds = embedding_feeds([2, 0, 5])
    known = {k: TensorSpec.of(v) for k, v in feeds.items()}
    known["lengths"] = spec((3,), np.int32)          # shape known, values not
    inferred = infer_net(EMBEDDING_NET, known)
    assert inferred["bags"].shape == (3, 4) and inferred["both"].shape == (3, 8)
    assert inferred["ranges"].shape == (3, 2)
    assert inferred["segments"].shape == (None,) and inferred["tiled"].shape == (None, 8)
    assert inferred["left"].shape is None and inferred["hot"].shape is None   # inputs not fully known


def test_shape_arithmetic_is_folded():
    """Shape -> Slice -> Concat -> Reshape: the new shape is computed from constants, statically."""
    net = net_of(
        ("Shape", ["X"], ["dims"], {}),
        ("Slice", ["dims"], ["batch"], {"starts": [0], "ends": [1]}),
        ("Gather", ["dims", "last"], ["width"], {}),
        ("Concat", ["batch", "minus_one", "width"], ["target", "_"], {"axis": 0}),
        ("Reshape", ["X", "target"], ["Y", "old"], {}),
        ("Size", ["Y"], ["count"], {}),
        ("ExpandDims", ["Y"], ["Y4"], {"dims": [1]}),
        ("Squeeze", ["Y4"], ["Y3"], {"dims": [1]}),
        ("Transpose", ["Y3"], ["YT"], {"axes": [2, 0, 1]}),
        ("Tile", ["YT", "reps"], ["YT2"], {"axis": 0}),
    )
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    feeds = {"X": x, "last": np.array([3], np.int64), "minus_one": np.array([-1], np.int64),
             "reps": np.array([2], np.int32)}
    inferred = infer_net(net, {k: TensorSpec.of(v) for k, v in feeds.items()})
    assert list(inferred["target"].value) == [2, -1, 5]
    assert_specs(inferred, {
        "dims": ((4,), np.int64), "target": ((3,), np.int64), "Y": ((2, 12, 5), np.float32),
        "old": ((4,), np.int64), "count": ((), np.int64), "Y4": ((2, 1, 12, 5), np.float32),
        "YT": ((5, 2, 12), np.float32), "YT2": ((10, 2, 12), np.float32)})
    assert int(inferred["count"].value) == 120
    assert_agrees_with_run(inferred, run_net(net, feeds))


CONV_NET = net_of(
    ("Conv", ["X", "w1", "b1"], ["c1"], {"kernel": 3, "pad": 1, "stride": 2}),
    ("MaxPool", ["c1"], ["p1"], {"kernel": 2, "stride": 2, "legacy_pad": 3}),
    ("ConvTranspose", ["p1", "wt"], ["up"], {"kernel": 3, "stride": 2, "adj": 1, "pads": [1, 0, 1, 0]}),
    ("NCHW2NHWC", ["up"], ["up_nhwc"], {}),
    ("Conv2D", ["up_nhwc", "w2"], ["c2"], {"kernel_h": 1, "kernel_w": 3, "order": "NHWC", "group": 2}),
    ("AveragePool", ["c2"], ["avg"], {"global_pooling": 1, "order": "NHWC"}),
    ("LRN", ["up"], ["lrn", "lrn_scale"], {"size": 3, "alpha": 1e-3, "beta": 0.75}),
    ("LpPool", ["lrn"], ["lp"], {"kernels": [2, 3], "strides": [1, 2], "p": 2.0}),
    ("Conv1D", ["seq", "w3"], ["c3"], {"kernel": 3, "dilation": 2}),
)


def test_conv_net_every_blob():
    feeds = {"X": RNG.standard_normal((2, 3, 11, 9)).astype(np.float32),
             "w1": RNG.standard_normal((8, 3, 3, 3)).astype(np.float32), "b1": np.zeros(8, np.float32),
             "wt": RNG.standard_normal((8, 4, 3, 3)).astype(np.float32),
             "w2": RNG.standard_normal((6, 1, 3, 2)).astype(np.float32),
             "seq": RNG.standard_normal((2, 4, 10)).astype(np.float32),
             "w3": RNG.standard_normal((5, 4, 3)).astype(np.float32)}
    inferred = infer_net(CONV_NET, {k: TensorSpec.of(v) for k, v in feeds.items()})
    # c1: (11 + 2 - 3) // 2 + 1 = 6, (9 + 2 - 3) // 2 + 1 = 5; p1 (Caffe's ceil rule): 3, 3
    # up: (3 - 1) * 2 + 3 + adj 1 - pads (1 + 1 in height, 0 in width) = 6 x 8; c2 (NHWC, 1x3 kernel): 6 x 6
    # lp: (6 - 2) // 1 + 1 = 5, (8 - 3) // 2 + 1 = 3; c3: 10 - (2 * 2 + 1) + 1 = 6
    assert_specs(inferred, {
        "c1": ((2, 8, 6, 5), np.float32), "p1": ((2, 8, 3, 3), np.float32), "up": ((2, 4, 6, 8), np.float32),
        "up_nhwc": ((2, 6, 8, 4), np.float32), "c2": ((2, 6, 6, 6), np.float32),
        "avg": ((2, 1, 1, 6), np.float32), "lrn": ((2, 4, 6, 8), np.float32),
        "lrn_scale": ((2, 4, 6, 8), np.float32), "lp": ((2, 4, 5, 3), np.float32),
        "c3": ((2, 5, 6), np.float32)})
    assert_agrees_with_run(inferred, run_net(CONV_NET, feeds))


# ------------------------------------------------------------------------------------- static mismatches
def _fc_net():
    return net_of(("Flatten", ["X"], ["flat"], {}), ("FC", ["flat", "W", "b"], ["Y"], {}), name="fc")


WRONG_NETS = [
    # (id, net, input specs, error, the op named, key words)
    ("fc-k-mismatch", _fc_net(), {"X": spec((2, 3, 4)), "W": spec((5, 10)), "b": spec((5,))},
     ShapeError, r"op #1 \(FC\)", "M x K = 2 x 12"),
    ("add-incompatible", net_of(("Transpose", ["A"], ["At"], {}), ("Add", ["At", "B"], ["C"], {})),
     {"A": spec((2, 3)), "B": spec((2, 3))}, ShapeError, r"op #1 \(Add\)", "do not broadcast"),
    ("concat-mismatch", net_of(("Squeeze", ["A"], ["a"], {"dims": [0]}),
                               ("Concat", ["a", "B"], ["C", "i"], {"axis": 0})),
     {"A": spec((1, 2, 3)), "B": spec((2, 4))}, ShapeError, r"op #1 \(Concat\)",
     r"input 1 has shape \(2, 4\)"),
    ("reshape-count", net_of(("Reshape", ["A"], ["r", "o"], {"shape": [5, -1]})),
     {"A": spec((2, 3, 4))}, ShapeError, r"op #0 \(Reshape\)", "24 elements"),
    ("lengths-sum", net_of(("LengthsSum", ["D", "L"], ["S"], {})),
     {"D": spec((5, 2)), "L": TensorSpec.of(np.array([2, 2], np.int32))}, ShapeError, r"op #0 \(LengthsSum\)",
     "sum to 4 but DATA has 5 rows"),
    ("group-norm-group", net_of(("GroupNorm", ["X", "g", "b"], ["Y"], {"group": 4})),
     {"X": spec((2, 6, 3, 3)), "g": spec((6,)), "b": spec((6,))}, ShapeError, r"op #0 \(GroupNorm\)",
     "group=4 must divide the 6 channels"),
    ("bn-scale", net_of(("SpatialBN", ["X", "s", "b", "m", "v"], ["Y"], {"is_test": 1, "order": "NHWC"})),
     {"X": spec((2, 6, 3, 3)), **{k: spec((6,)) for k in "sbmv"}}, ShapeError, r"op #0 \(SpatialBN\)",
     "scale must hold C = 3 values"),
    ("gather-out-of-range", net_of(("Gather", ["D", "I"], ["G"], {})),
     {"D": spec((4, 2)), "I": TensorSpec.of(np.array([1, 4], np.int64))}, ShapeError, r"op #0 \(Gather\)",
     r"INDICES\[1\] = 4 is out of bounds"),
    ("transpose-axes", net_of(("Transpose", ["A"], ["B"], {"axes": [1, 0]})), {"A": spec((2, 3, 4))},
     ShapeError, r"op #0 \(Transpose\)", "rank 3"),
    ("pad-mode", net_of(("PadImage", ["X"], ["Y"], {"pad": 1, "mode": "wrap"})), {"X": spec((1, 1, 3, 3))},
     ArgumentError, r"op #0 \(PadImage\)", "mode"),
    ("conv-kernel-too-big", net_of(("MaxPool", ["X"], ["p"], {"kernel": 2, "stride": 2}),
                                   ("Conv", ["p", "W"], ["Y"], {"kernel": 5, "pad": 1})),
     {"X": spec((1, 3, 4, 4)), "W": spec((8, 3, 5, 5))}, ShapeError, r"op #1 \(Conv\)",
     r"kernel 5 is larger than the padded input 4"),
    ("conv-group", net_of(("Conv", ["X", "W"], ["Y"], {"kernel": 1, "group": 4})),
     {"X": spec((1, 6, 4, 4)), "W": spec((8, 2, 1, 1))}, ShapeError, r"op #0 \(Conv\)",
     "does not divide the 6 input channels"),
    ("conv-filters-group", net_of(("Conv", ["X", "W"], ["Y"], {"kernel": 1, "group": 3})),
     {"X": spec((1, 6, 4, 4)), "W": spec((8, 2, 1, 1))}, ShapeError, r"op #0 \(Conv\)",
     "group 3 does not divide the 8 filters"),
    ("conv-transpose-channels", net_of(("ConvTranspose", ["X", "W"], ["Y"], {"kernel": 2})),
     {"X": spec((1, 6, 4, 4)), "W": spec((4, 2, 2, 2))}, ShapeError, r"op #0 \(ConvTranspose\)",
     "first dim must equal the 6 input channels"),
    ("pool-pad", net_of(("AveragePool", ["X"], ["Y"], {"kernel": 2, "pad": 2})), {"X": spec((1, 1, 4, 4))},
     ArgumentError, r"op #0 \(AveragePool\)", "smaller than the kernel"),
    ("lrn-size", net_of(("LRN", ["X"], ["Y"], {"size": 0})), {"X": spec((1, 3, 2, 2))}, ArgumentError,
     r"op #0 \(LRN\)", "positive"),
]


@pytest.mark.parametrize("case", WRONG_NETS, ids=[c[0] for c in WRONG_NETS])
def test_static_mismatch_is_found_before_running(case, broken):
    _, net, known, error, op_named, words = case
    calls = []
    for op in net.op:   # a kernel call would mean something ran
        kernel = REGISTRY.get(op.type).kernel
        broken(op.type, lambda *a, _k=kernel, **k: (calls.append(1), _k(*a, **k))[1])
    with pytest.raises(error, match=op_named) as info:
        infer_net(net, known)
    assert re.search(words, str(info.value)), f"{words!r} not in: {info.value}"
    assert not calls


# ------------------------------------------------------------------------------------------ test the tester
@pytest.mark.parametrize("op_type,inputs,args,wrong,complaint", [
    ("Concat", [np.ones((2, 3), np.float32)] * 2, {"axis": 1},   # forgets that the axis grows
     lambda specs, **a: [specs[0], spec((2,), np.int32)], "shape function says out0 is"),
    ("Flatten", [np.ones((2, 3, 4), np.float32)], {},           # right shape, wrong dtype
     lambda specs, **a: [spec((2, 12), np.float64)], "float64"),
    ("LengthsToSegmentIds", [np.array([1, 2], np.int32)], {},   # one id per segment instead of per item
     lambda specs, **a: [spec((2,), np.int32)], r"\(2,\)"),
])
def test_cross_check_catches_a_wrong_shape_function(op_type, inputs, args, wrong, complaint, patched):
    outputs = 2 if op_type == "Concat" else 1
    run_op(op_type, inputs, outputs, **args)            # the real shape function agrees with the kernel
    patched(op_type, shape=wrong)
    with pytest.raises(AssertionError, match=complaint):
        run_op(op_type, inputs, outputs, **args)


# --------------------------------------------------------------------------------------------- escapes
@pytest.mark.parametrize("dims", [[0, 2**62, 2**62], [2**63 - 1, 0], [2**40, 2**40, 0]])
def test_a_fill_shape_numpy_cannot_hold_is_refused_by_the_fill(dims):
    # an empty shape is small enough to carry its value, but numpy refuses dims whose product overflows: the
    # fill's own check says so (before it, the last resort's "static shape inference failed (ValueError ...)")
    from stepnet.core.errors import ArgumentError

    net = net_of(("ConstantFill", [], ["y"], dict(shape=dims)))
    with pytest.raises(ArgumentError, match=r"net 'net', op #0 \(ConstantFill\): 'shape' \[.*\]: its nonzero dims "
                                            r"multiply to more than 576460752303423487, more elements than an "
                                            r"array can have, even with a dim of 0"):
        infer_net(net, {})


@pytest.mark.parametrize("error", [TypeError("unsupported operand"), IndexError("tuple index out of range"),
                                   OverflowError("too big"), MemoryError(), RecursionError("too deep"),
                                   ZeroDivisionError("division by zero")], ids=lambda e: type(e).__name__)
def test_any_failure_of_a_shape_function_names_the_op_and_its_inputs(patched, error):
    def shape(specs, **_):
        raise error
    patched("Relu", shape=shape)
    net = net_of(("Relu", ["x"], ["y"], {}))
    with pytest.raises(ShapeError, match=rf"net 'net', op #0 \(Relu\): static shape inference failed "
                                         rf"\({type(error).__name__}: .*\[inputs: x \(2, 3\) float32\]$"):
        infer_net(net, {"x": spec((2, 3))})


def test_a_shape_functions_own_errors_keep_their_class(patched):
    def shape(specs, **_):
        raise ArgumentError("bad axis")
    patched("Relu", shape=shape)
    with pytest.raises(ArgumentError, match=r"^net 'net', op #0 \(Relu\): bad axis \[inputs: x \(2,\) float32\]$"):
        infer_net(net_of(("Relu", ["x"], ["y"], {})), {"x": spec((2,))})
