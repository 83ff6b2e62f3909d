"""Static shape and dtype inference over whole nets for the fill, elementwise, activation, math, reduce and
util families (the device copies' specs are tested in ops/test_device.py): every blob's spec of multi-op nets
(hand-written), small integer values followed through shape arithmetic, Glow's real Caffe2 nets inferred and
then run, statically wrong nets refused before anything runs with the op named, and a check that run_op's
cross-check catches a wrong shape function."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

import stepnet
from stepnet import NetDef, Workspace
from stepnet.core.errors import ArgumentError, DTypeError, ShapeError, StepnetError
from stepnet.ops import REGISTRY
from stepnet.core.spec import TensorSpec, spec
from stepnet.passes.shapes import infer_net
from stepnet.testing import DEVICES, make_op, run_op

GLOW = Path(__file__).resolve().parent / "data" / "glow"
FLOAT, INT32, INT64 = 1, 2, 10
rng = np.random.default_rng(3)


def net(name, *ops):
    nd = NetDef(name=name)
    nd.op.extend(ops)
    return nd


def named(opdef, name):
    opdef.name = name
    return opdef


def f32(*shape):
    return rng.uniform(-1, 1, size=shape).astype(np.float32)


def run_all(netdef, feeds):
    """Run netdef once on the CPU after feeding `feeds`; the workspace."""
    ws = Workspace(seed=0)
    for name, value in feeds.items():
        ws.feed(name, value)
    ws.run_net_once(netdef)
    return ws


def agree(specs, ws, names):
    """Every named blob's inferred spec matches what the run produced (the spec must be fully known)."""
    for name in names:
        value = ws.fetch(name)
        s = specs[name]
        got = (tuple(value.shape), value.dtype)
        assert (s.shape, s.dtype) == got, f"{name}: inferred {s}, got {got}"


# --------------------------------------------------------------------------------------------- whole nets
MLP = net(
    "mlp",
    make_op("FC", ["data", "w1", "b1"], ["h1"]),
    make_op("Relu", ["h1"], ["h1"]),
    make_op("FC", ["h1", "w2", "b2"], ["logits"], axis=1),
    make_op("Softmax", ["logits"], ["prob"]),
    make_op("ReduceMean", ["prob"], ["mean"], axes=[1], keepdims=0),
    make_op("Cast", ["label"], ["label_f"], to=FLOAT),
    make_op("Add", ["mean", "label_f"], ["summed"]),
    make_op("GT", ["summed", "half"], ["big"], broadcast=1),
    make_op("SumElements", ["summed"], ["total"], average=1),
    make_op("Scale", ["total"], ["loss"], scale=0.5),
    make_op("ReduceFrontMax", ["data"], ["front"], num_reduce_dim=2),
    make_op("Sigmoid", ["front"], ["front_s"]),
)
MLP_FEEDS = {"data": f32(8, 3, 4, 4), "w1": f32(16, 48), "b1": f32(16), "w2": f32(10, 16), "b2": f32(10),
             "label": rng.integers(0, 10, 8).astype(np.int32), "half": np.float32([0.5])}
MLP_WANT = {"h1": ((8, 16), np.float32), "logits": ((8, 10), np.float32), "prob": ((8, 10), np.float32),
            "mean": ((8,), np.float32), "label_f": ((8,), np.float32), "summed": ((8,), np.float32),
            "big": ((8,), np.bool_), "total": ((), np.float32), "loss": ((), np.float32),
            "front": ((4, 4), np.float32), "front_s": ((4, 4), np.float32)}


def test_mlp_net_specs():
    specs = infer_net(MLP, {n: TensorSpec.of(v) for n, v in MLP_FEEDS.items()})
    for name, (shape, dtype) in MLP_WANT.items():
        assert specs[name].shape == shape and specs[name].dtype == np.dtype(dtype), name
    agree(specs, run_all(MLP, MLP_FEEDS), MLP_WANT)


def test_unknown_inputs_leave_their_consumers_unknown():
    known = {n: TensorSpec.of(v) for n, v in MLP_FEEDS.items() if n != "w2"}
    specs = infer_net(MLP, known)
    assert specs["h1"].shape == (8, 16)
    for name in ("logits", "prob", "mean", "summed", "big", "total", "loss"):
        assert specs[name].shape is None, name
    assert specs["label_f"].shape == (8,) and specs["front_s"].shape == (4, 4)  # not downstream of w2


def test_unknown_dtypes_stay_unknown():
    """A spec given without a dtype still gets shapes through, and the dtype checks wait for the run."""
    nd = net("nodtype", make_op("FC", ["x", "w", "b"], ["y"]), make_op("Relu", ["y"], ["r"]),
             make_op("ReduceSum", ["r"], ["s"], axes=[0]))
    specs = infer_net(nd, {"x": TensorSpec((5, 6)), "w": TensorSpec((3, 6)), "b": spec((3,))})
    got = [(specs[n].shape, specs[n].dtype) for n in "yrs"]
    assert got == [((5, 3), None), ((5, 3), None), ((1, 3), None)]


SHAPE_MATH = net(
    "shape_math",
    make_op("GivenTensorInt64Fill", [], ["dims"], shape=[2], values=[3, 4]),
    make_op("ConstantFill", [], ["two"], shape=[1], value=2, dtype=INT64),
    make_op("Mul", ["dims", "two"], ["dims2"], broadcast=1),
    make_op("Sub", ["dims2", "two"], ["dims3"], broadcast=1),
    make_op("ConstantFill", ["dims3"], ["ones"], input_as_shape=1, value=1.0, extra_shape=[2]),
    make_op("UniformFill", ["ones"], ["u"], min=-1.0, max=1.0),
    make_op("XavierFill", [], ["w"], shape=[5, 12]),
    make_op("MatMul", ["u", "w"], ["mm"], trans_b=1),
    make_op("GivenTensorIntFill", [], ["lengths"], shape=[3], values=[2, 3, 0]),
    make_op("LengthsRangeFill", ["lengths"], ["ranges"]),
    make_op("Cast", ["ranges"], ["ranges_f"], to=FLOAT),
    make_op("ReduceFrontSum", ["mm"], ["col"]),
    make_op("Add", ["col", "ranges_f"], ["out"]),
    make_op("SumElementsInt", ["lengths"], ["n"]),
)


def test_small_integer_values_are_followed_through_shape_arithmetic():
    specs = infer_net(SHAPE_MATH, {})
    assert specs["dims3"].value.tolist() == [4, 6]  # (3, 4) * 2 - 2, folded without running anything
    assert specs["ones"].shape == (4, 6, 2) and specs["u"].shape == (4, 6, 2)
    assert specs["mm"].shape == (4, 5) and specs["col"].shape == (5,)
    assert specs["ranges"].value.tolist() == [0, 1, 0, 1, 2] and specs["ranges"].dtype == np.int32
    assert specs["out"].shape == (5,) and specs["out"].dtype == np.float32
    assert specs["n"].shape == () and specs["n"].value.tolist() == 5
    assert specs["w"].value is None and specs["ones"].value is None  # float tensors carry no values
    ws = run_all(SHAPE_MATH, {})
    agree(specs, ws, [name for op in SHAPE_MATH.op for name in op.output])
    assert ws.fetch("dims3").tolist() == specs["dims3"].value.tolist()


def test_folded_bad_values_are_caught_statically():
    nd = net("neg", make_op("GivenTensorInt64Fill", [], ["dims"], shape=[2], values=[3, 4]),
             make_op("Negative", ["dims"], ["neg"]),
             make_op("ConstantFill", ["neg"], ["y"], input_as_shape=1))
    with pytest.raises(ArgumentError, match=r"op #2 \(ConstantFill\).*\[-3, -4\] has a negative dimension"):
        infer_net(nd, {})


# --------------------------------------------------------------------------------------------- real files
def load(name):
    return stepnet.load(GLOW / f"{name}.pbtxt", kind="net")


GLOW_CASES = [  # (init net, predict net, feeds)
    ("constant_fill_input_as_shape_init", "constant_fill_input_as_shape", {}),
    ("gaussian_fill_input_as_shape_init", "gaussian_fill_input_as_shape", {}),
    (None, "gaussian_fill_use_input_shape_with_extra_shape", {"inputs_0": np.zeros((2, 2), np.float32)}),
    (None, "uniform_fill_input_as_shape", {"inputs_0": np.array([30, 40], np.int64)}),
    ("fc_init_net", "fc_predict_net", {"inputs": f32(2, 3)}),
    ("fcTransposed_init_net", "fcTransposed_predict_net", {"inputs": f32(2, 3)}),
    (None, "elementwise_linear_broadcast_net", {"X": f32(10, 3), "w": f32(3), "b": f32(3)}),
    (None, "reduce_back_sum", {"inputs_0": f32(2, 3, 4)}),
    (None, "matmul_trans_RHS_predict_net", {"inputs_0": f32(3, 4), "inputs_1": f32(5, 4)}),
    (None, "batched_matmul", {"lhs": f32(2, 3, 4), "rhs": f32(2, 4, 5)}),
    (None, "lengths_range_fill_predict_net", {"lengths": np.array([1, 3, 4], np.int32)}),
    (None, "prelu", {"prelu_test_input": f32(2, 3, 4), "slope": f32(3)}),
    (None, "sign", {"input": f32(4, 5)}),
]


@pytest.mark.parametrize("init,predict,feeds", GLOW_CASES, ids=[c[1] for c in GLOW_CASES])
def test_glow_nets_inferred_then_run(init, predict, feeds):
    """Glow's Caffe2 test nets (third-party files): infer init then predict from the fed specs alone, then
    run them; every blob either op writes has exactly the inferred shape and dtype."""
    specs = {n: TensorSpec.of(v) for n, v in feeds.items()}
    nets = [load(n) for n in (init, predict) if n]
    for nd in nets:
        specs = infer_net(nd, specs)
    ws = Workspace(seed=0)
    for name, value in feeds.items():
        ws.feed(name, value)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Glow-only arguments (maxOutputSize) are warned about, not used
        for nd in nets:
            ws.run_net_once(nd)
    written = [name for nd in nets for op in nd.op for name in op.output]
    assert written
    agree(specs, ws, written)


def test_glow_fill_test_net_refused_before_running():
    """Glow's fill_test net compares uint8 tensors with EQ, which Caffe2 does not register for uint8."""
    specs = infer_net(load("fill_test_init_net"), {})
    assert specs["tensor_string_to_uint8_fill"].shape == (2, 2)
    with pytest.raises(DTypeError, match=r"op #3 \(EQ\).*uint8"):
        infer_net(load("fill_test_predict_net"), specs)


# --------------------------------------------------------------------------------------------- wrong nets
def _exploding(xp, *args, **kwargs):
    raise AssertionError("a kernel ran during static inference")


WRONG_NETS = [  # (id, net, input specs, error, match: the op named, then what is wrong)
    ("fc-K-mismatch",
     net("fc_net", make_op("Relu", ["x"], ["x_r"]), named(make_op("FC", ["x_r", "w", "b"], ["y"]), "fc1")),
     {"x": spec((8, 48)), "w": spec((16, 50)), "b": spec((16,))}, ShapeError,
     r"net 'fc_net', op #1 \(FC 'fc1'\): FC: X \(8, 48\).*K = 8 x 48.*W \(16, 50\).*\[inputs: x_r \(8, 48\)"),
    ("add-numpy",
     net("add_net", make_op("Tanh", ["a"], ["t"]), make_op("Add", ["t", "b"], ["c"])),
     {"a": spec((2, 3)), "b": spec((4,))}, ShapeError,
     r"op #1 \(Add\).*A \(2, 3\) and B \(4,\) do not broadcast"),
    ("add-legacy",
     net("add_net", make_op("Add", ["a", "b"], ["c"], broadcast=1, axis=1)),
     {"a": spec((2, 3, 4)), "b": spec((4,))}, ShapeError,
     r"op #0 \(Add\).*B \(4,\) onto A \(2, 3, 4\) at axis 1"),
    ("batch-matmul-K",
     net("bmm", make_op("BatchMatMul", ["a", "b"], ["c"], trans_b=1)),
     {"a": spec((2, 3, 4)), "b": spec((2, 4, 5))}, ShapeError, r"op #0 \(BatchMatMul\).*K = 4.*K = 5"),
    ("sum-shapes",
     net("sums", make_op("Sum", ["a", "b"], ["c"])),
     {"a": spec((2, 3)), "b": spec((3, 2))}, ShapeError, r"op #0 \(Sum\).*does not broadcast"),
    ("softmax-int",
     net("sm", make_op("Cast", ["a"], ["ai"], to=INT32), make_op("Softmax", ["ai"], ["p"])),
     {"a": spec((2, 3))}, DTypeError, r"op #1 \(Softmax\).*floating-point.*int32"),
    ("reduce-axes",
     net("red", make_op("ReduceSum", ["a"], ["s"], axes=[2])),
     {"a": spec((2, 3))}, ArgumentError, r"op #0 \(ReduceSum\).*axes \[2\] out of range"),
    ("prelu-channels",
     net("act", make_op("PRelu", ["x", "slope"], ["y"])),
     {"x": spec((2, 3, 4)), "slope": spec((4,))}, ShapeError, r"op #0 \(PRelu\).*3 channels on axis 1"),
    ("given-values-count",
     net("init", make_op("GivenTensorFill", [], ["w"], shape=[2, 3], values=[1.0] * 5)),
     {}, ArgumentError, r"op #0 \(GivenTensorFill\).*needs 6 values but 'values' holds 5"),
]


@pytest.mark.parametrize("cid,nd,known,error,match", WRONG_NETS, ids=[c[0] for c in WRONG_NETS])
def test_wrong_nets_refused_before_anything_runs(cid, nd, known, error, match, broken):
    for op in nd.op:  # every kernel of the net explodes if called: the error must come from inference
        schema = REGISTRY.get(op.type)
        broken(op.type, _exploding)
        assert REGISTRY.get(op.type).shape is schema.shape
    with pytest.raises(error, match=match):
        infer_net(nd, known)


# ------------------------------------------------------------------------------------------- random agreement
POOL_SHAPES = [(2, 3), (3,), (1,), (), (2, 1, 3), (3, 2), (2, 3, 4), (0, 3), (6,)]
POOL_DTYPES = [np.float32, np.float64, np.int32, np.int64, np.bool_]
POOL_ARGS = {"broadcast": [0, 1], "axis": [-1, 0, 1, 2], "axes": [[0], [1], [-1]], "keepdims": [0, 1],
             "num_reduce_dim": [0, 1, 2], "trans_a": [0, 1], "trans_b": [0, 1], "axis_w": [1, 2],
             "to": [1, 2, 10], "exponent": [2.0], "order": ["NCHW", "NHWC"]}
FILL_INPUTS = [np.array([2, 3], np.int64), np.array([2, -1], np.int64), np.zeros((2, 2), np.float32),
               np.float32([0.0]), np.float32([1.0]), np.int32([1]), np.int32([5]), np.zeros(()),
               np.array([1, 0, 2], np.int32)]
FILL_ARGS = {"shape": [[2, 3], [], [6], [2, -1]], "extra_shape": [[2], []], "input_as_shape": [0, 1],
             "value": [1.0, 2, "s"], "dtype": [1, 2, 10, 4, 5], "min": [0.0, 2.0, 0], "max": [1.0, 3],
             "values": [[1.0] * 6, [1, 2, 3, 4, 5, 6], ["a"] * 6, [0, 1, 1, 0, 1, 0], ["abcdef"]],
             "std": [1.0, -1.0]}


def random_case(schema, rng, fill):
    """Random inputs and arguments for one op: often compatible, often not."""
    lo, hi = schema.inputs
    inputs = []
    for i in range(int(rng.integers(lo, min(hi, 3 if fill else 4) + 1))):
        if fill:
            inputs.append(FILL_INPUTS[rng.integers(len(FILL_INPUTS))])
            continue
        same = i and rng.random() < 0.3
        shape = inputs[0].shape if same else POOL_SHAPES[rng.integers(len(POOL_SHAPES))]
        dtype = inputs[0].dtype if i and rng.random() < 0.5 else POOL_DTYPES[rng.integers(len(POOL_DTYPES))]
        inputs.append(rng.integers(-3, 4, size=shape).astype(dtype))
    pool = FILL_ARGS if fill else POOL_ARGS
    args = {k: v[rng.integers(len(v))] for k, v in pool.items() if k in schema.args and rng.random() < 0.5}
    return inputs, args


@pytest.mark.parametrize("family", ["fill", "elementwise", "activation", "math", "reduce"])
def test_shape_functions_agree_with_kernels_on_random_inputs(family):
    """Random (mostly ill-fitting) inputs and arguments: inference raises exactly the error class the kernel
    raises, and otherwise gives exactly the shape and dtype the kernel produces."""
    rng = np.random.default_rng(17)
    schemas = [s for s in REGISTRY.schemas() if s.family == family and not s.context]
    assert schemas
    for schema in schemas:
        for _ in range(25):
            inputs, args = random_case(schema, rng, family == "fill")
            names = [f"in{i}" for i in range(len(inputs))]
            opdef = make_op(schema.type, names, ["out"], **args)
            static = ran = spec_ = None
            try:
                known = {n: TensorSpec.of(v) for n, v in zip(names, inputs, strict=True)}
                spec_ = infer_net(net("random", opdef), known)["out"]
            except StepnetError as e:
                static = type(e)
            ws = Workspace(seed=0)
            for n, v in zip(names, inputs, strict=True):
                ws.feed(n, v)
            try:
                with np.errstate(all="ignore"), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    ws.run_operator_once(opdef)
            except StepnetError as e:
                ran = type(e)
            case = f"{schema.type} {[(v.shape, v.dtype.name) for v in inputs]} {args}"
            assert static == ran, f"{case}: inference raised {static}, the kernel {ran}"
            if ran is None and spec_.shape is not None:
                out = ws.fetch("out")
                assert (spec_.shape, spec_.dtype) == (out.shape, out.dtype), f"{case}: {spec_} vs {out.shape}"


# --------------------------------------------------------------------------------------------- the tester
@pytest.mark.parametrize("device", DEVICES)
def test_run_op_catches_a_wrong_shape_function(device, patched):
    """A shape function that disagrees with the kernel (a dim, the rank or the dtype) fails run_op."""
    x = f32(2, 3)
    assert run_op("Relu", [x], device=device).tolist() == [[max(v, 0.0) for v in row] for row in x.tolist()]
    wrongs = [
        (lambda specs: [spec(specs[0].shape[::-1], specs[0].dtype)],
         r"Relu: shape function says out0 is \(3, 2\)"),
        (lambda specs: [spec(specs[0].shape + (1,), specs[0].dtype)], r"says out0 is \(2, 3, 1\)"),
        (lambda specs: [spec(specs[0].shape, np.float64)],
         "says out0 is float64, the kernel produced float32"),
    ]
    for wrong, match in wrongs:
        patched("Relu", shape=wrong)
        with pytest.raises(AssertionError, match=match):
            run_op("Relu", [x], device=device)


def test_random_agreement_catches_a_lax_shape_function(patched):
    """An Add shape function that skips the dtype and broadcast checks fails the random agreement test."""
    patched("Add", shape=lambda specs, **args: [spec(specs[0].shape, specs[0].dtype)])
    with pytest.raises(AssertionError, match="Add .*inference raised None, the kernel"):
        test_shape_functions_agree_with_kernels_on_random_inputs("elementwise")


def test_run_op_catches_a_wrong_fc_shape_function(patched):
    """An FC shape function giving the 2-D (M, N) result instead of X.shape[:axis] + (N,) is caught on a
    3-D input with axis=2."""
    schema = REGISTRY.get("FC")
    x, w, b = f32(2, 3, 4), f32(5, 4), f32(5)
    assert run_op("FC", [x, w, b], axis=2).shape == (2, 3, 5)

    def flattens(specs, **args):
        (out,) = schema.shape(specs, **args)
        return [spec((int(np.prod(out.shape[:-1])), out.shape[-1]), out.dtype)]

    patched("FC", shape=flattens)
    with pytest.raises(AssertionError, match=r"FC: shape function says out0 is \(6, 5\)"):
        run_op("FC", [x, w, b], axis=2)
