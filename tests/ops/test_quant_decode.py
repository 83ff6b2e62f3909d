"""QuantDecode and QuantDecodeGradient (stepnet/ops/quant_decode.py) against Caffe2's documented example and
float64 loops written from quant_decode_op.h on every device; the gradient against finite differences, the
definition and the op Caffe2's maker emits, built by the backward pass and by compat's AddGradientOperators;
codes out of range, wrong types and shapes refused with one error naming the op (statically too); the blob limit
checked before the output is allocated; broken kernels caught."""
import numpy as np
import pytest

from stepnet import NetDef, Workspace
from stepnet.core.errors import (
    ArgumentError, ArityError, DTypeError, GradientError, ResourceError, ShapeError)
from stepnet.core.limits import Limits
from stepnet.io.proto import DeviceOption
from stepnet.passes.gradients import backward_ops
from stepnet.testing import DEVICES, GPU_MODE, allocates_under, check_gradient, infer_static, make_op, run_op

rng = np.random.default_rng(23)
CODE_TYPES = (np.uint8, np.uint16, np.int32)


def decode_ref(codebook, codes):
    """decoded[k] = codebook[codes[k]] over the flat codebook, element by element, in float64."""
    flat = [float(v) for v in codebook.reshape(-1)]
    return np.array([flat[int(c)] for c in codes.reshape(-1)], np.float64).reshape(codes.shape)


def gradient_ref(codebook, codes_list, grads):
    """dcodebook[j] = the sum of every dY_i[k] whose code codes_i[k] is j, in float64."""
    out = [0.0] * codebook.size
    for codes, grad in zip(codes_list, grads):
        for c, g in zip(codes.reshape(-1), grad.reshape(-1)):
            out[int(c)] += float(g)
    return np.array(out).reshape(codebook.shape)


def codes_of(dtype, shape, n):
    return rng.integers(0, n, size=shape).astype(dtype)


# --------------------------------------------------------------------------------------------- forward
@pytest.mark.parametrize("device", DEVICES)
def test_caffe2_documented_example(device):
    codebook = np.array([1.5, 2.5, 3.5], np.float32)
    out = run_op("QuantDecode", [codebook, np.array([0, 1, 1, 2], np.uint8), np.array([2, 0, 0], np.uint8)], 2,
                 device=device)
    assert [o.dtype for o in out] == [np.float32, np.float32]
    assert out[0].tolist() == [1.5, 2.5, 2.5, 3.5] and out[1].tolist() == [3.5, 1.5, 1.5]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("code_type", CODE_TYPES)
@pytest.mark.parametrize("cb_shape,shapes", [((5,), [(7,)]), ((16,), [(3, 4), (2,), (0,)]), ((2, 3), [(2, 2, 2)]),
                                             ((1,), [()])])
def test_decode_matches_the_definition(device, code_type, cb_shape, shapes):
    codebook = rng.standard_normal(cb_shape).astype(np.float32)
    codes = [codes_of(code_type, s, codebook.size) for s in shapes]
    out = run_op("QuantDecode", [codebook, *codes], len(codes), device=device)
    for got, c in zip(out if len(codes) > 1 else [out], codes):
        assert got.dtype == np.float32 and got.shape == c.shape
        np.testing.assert_array_equal(got, decode_ref(codebook, c))


def test_decode_uses_the_whole_code_range_and_any_float_codebook():
    codebook = np.arange(65536, dtype=np.float64) * 0.5
    codes = np.array([0, 1, 65535, 40000], np.uint16)
    got = run_op("QuantDecode", [codebook, codes])
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, decode_ref(codebook, codes))
    byte_book = rng.standard_normal(256).astype(np.float16)
    all_bytes = np.arange(256, dtype=np.uint8)[::-1].copy()
    np.testing.assert_array_equal(run_op("QuantDecode", [byte_book, all_bytes]), decode_ref(byte_book, all_bytes))


def test_shapes_follow_statically():
    specs = infer_static("QuantDecode", [np.zeros(4, np.float32), np.zeros((2, 3), np.uint8), np.zeros(5, np.int32)],
                         2)
    assert [(s.shape, s.dtype) for s in specs] == [((2, 3), np.float32), ((5,), np.float32)]
    (grad,) = infer_static("QuantDecodeGradient", [np.zeros((2, 2), np.float32), np.zeros(3, np.uint8),
                                                   np.zeros((3, 1), np.float32)])
    assert (grad.shape, grad.dtype) == ((2, 2), np.float32)


# --------------------------------------------------------------------------------------------- gradient
@pytest.mark.parametrize("device", DEVICES)
def test_gradient_op_matches_the_definition(device):
    codebook = rng.standard_normal((2, 4)).astype(np.float32)
    codes = [codes_of(np.uint8, (5, 3), 8), codes_of(np.int32, (6,), 8), codes_of(np.uint16, (0,), 8)]
    grads = [rng.standard_normal(c.shape).astype(np.float32) for c in codes]
    grads[1] = grads[1].reshape(2, 3)            # Caffe2 pairs codes and gradients by element count
    got = run_op("QuantDecodeGradient", [codebook, *codes, *grads], device=device)
    assert got.shape == codebook.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, gradient_ref(codebook, codes, grads), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("outputs", [1, 2])
def test_gradient_against_finite_differences(outputs):
    codebook = rng.standard_normal(6)
    codes = [codes_of(CODE_TYPES[i], (4, 3), 6) for i in range(outputs)]
    analytic = check_gradient("QuantDecode", [codebook, *codes], outputs=outputs, wrt=[0])
    assert analytic["in0"].shape == (6,)


def test_the_gradient_op_caffe2_emits():
    fwd = make_op("QuantDecode", ["cb", "c0", "c1"], ["d0", "d1"])
    ops, grads = backward_ops([fwd], {"d0": "d0_grad", "d1": "d1_grad"})
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [
        ("QuantDecodeGradient", ["cb", "c0", "c1", "d0_grad", "d1_grad"], ["cb_grad"])]
    assert grads.get("cb") == "cb_grad" and grads.get("c0") is None and grads.get("c1") is None
    with pytest.raises(GradientError, match="d1"):      # Caffe2: "Gradient of output d1 is not provided!"
        backward_ops([fwd], {"d0": "d0_grad"})


def test_gradient_through_a_net_and_a_loss():
    """QuantDecode -> Sqr -> AveragedLoss of each output, gradients by the backward pass: d loss / d codebook[j]
    = 2 codebook[j] (count_0[j] / 8 + count_1[j] / 7), count_i[j] the number of codes_i equal to j."""
    codebook = rng.standard_normal(5).astype(np.float32)
    c0, c1 = codes_of(np.uint8, (4, 2), 5), codes_of(np.int32, (7,), 5)
    fwd = [make_op("QuantDecode", ["cb", "c0", "c1"], ["d0", "d1"])]
    for i in range(2):
        fwd += [make_op("Sqr", [f"d{i}"], [f"s{i}"]), make_op("AveragedLoss", [f"s{i}"], [f"l{i}"])]
    ops, grads = backward_ops(fwd, ["l0", "l1"])
    assert [o.type for o in ops].count("QuantDecodeGradient") == 1
    ws = Workspace(seed=0)
    for name, value in (("cb", codebook), ("c0", c0), ("c1", c1)):
        ws.feed(name, value)
    ws.run_net_once(NetDef(name="quant", op=fwd + ops))
    per_code = [sum(int(c) == j for c in c0.reshape(-1)) / 8 + sum(int(c) == j for c in c1) / 7 for j in range(5)]
    np.testing.assert_allclose(ws.fetch(grads["cb"]), 2 * codebook.astype(np.float64) * per_code, rtol=1e-6)


def test_gradient_through_compat_add_gradient_operators():
    from stepnet.compat import core, workspace
    from stepnet.compat.state import reset

    reset()
    try:
        net = core.Net("quant_decode_loss")
        decoded = net.QuantDecode(["codebook", "codes"], ["decoded"])
        loss = net.AveragedLoss(decoded, "loss")
        grads = net.AddGradientOperators([loss])
        assert grads["codebook"] == "codebook_grad" and "codes" not in grads
        types = [o.type for o in net.Proto().op]
        assert types[-1] == "QuantDecodeGradient"
        codebook = np.array([0.5, -1.0, 2.0, 4.0], np.float32)
        codes = np.array([[3, 3, 0], [1, 3, 0]], np.uint8)
        workspace.FeedBlob("codebook", codebook)
        workspace.FeedBlob("codes", codes)
        workspace.RunNetOnce(net)
        np.testing.assert_allclose(workspace.FetchBlob("decoded"), decode_ref(codebook, codes))
        np.testing.assert_allclose(workspace.FetchBlob("codebook_grad"), np.array([2, 1, 0, 3]) / 6.0, rtol=1e-6)
    finally:
        reset()


# --------------------------------------------------------------------------------------------- bad input
CB = np.array([1.0, 2.0, 3.0], np.float32)
BAD = [  # (id, op, inputs, outputs, error, match)
    ("code-too-big", "QuantDecode", [CB, np.array([0, 1, 3], np.uint8)], 1, ShapeError,
     r"QuantDecode: codes_0\[2\] = 3 is out of bounds; valid indices: 0\.\.2"),
    ("code-too-big-long", "QuantDecode", [CB, np.array([0] * 99 + [3], np.uint8)], 1, ShapeError,   # (no value
     r"QuantDecode: codes_0\[99\] = 3 is out of bounds"),                                           # in its spec)
    ("code-negative", "QuantDecode", [CB, np.array([1], np.int32), np.array([[0, -1]], np.int32)], 2, ShapeError,
     r"QuantDecode: codes_1\[1\] = -1 is out of bounds"),
    ("code-uint16-big", "QuantDecode", [CB, np.array([60000], np.uint16)], 1, ShapeError, "= 60000"),
    ("empty-codebook", "QuantDecode", [np.zeros(0, np.float32), np.array([0], np.uint8)], 1, ShapeError,
     "codebook is empty|dimension is empty"),
    ("codes-int64", "QuantDecode", [CB, np.array([0], np.int64)], 1, DTypeError,
     "QuantDecode: codes_0 must hold uint8, uint16 or int32 codes, got int64"),
    ("codes-float", "QuantDecode", [CB, np.array([0.0], np.float32)], 1, DTypeError, "codes_0"),
    ("codebook-int", "QuantDecode", [np.array([1, 2], np.int32), np.array([0], np.uint8)], 1, DTypeError,
     "QuantDecode.*codebook must be a float"),
    ("too-few-outputs", "QuantDecode", [CB, np.array([0], np.uint8), np.array([1], np.uint8)], 1, ArityError,
     "2 code tensor.* need 2 output.*got 1"),
    ("grad-even", "QuantDecodeGradient", [CB, np.array([0], np.uint8), np.ones(1, np.float32), CB], 1, ArityError,
     "odd number of inputs"),
    ("grad-size", "QuantDecodeGradient", [CB, np.array([0, 1], np.uint8), np.ones(3, np.float32)], 1, ShapeError,
     "codes_0 .* 2 elements but its gradient dY_0 .* 3"),
    ("grad-type", "QuantDecodeGradient", [CB, np.array([0], np.uint8), np.ones(1, np.float64)], 1, DTypeError,
     "QuantDecodeGradient needs one dtype"),
    ("grad-code-range", "QuantDecodeGradient", [CB, np.array([5], np.int32), np.ones(1, np.float32)], 1, ShapeError,
     r"QuantDecodeGradient: codes_0\[0\] = 5 is out of bounds"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid,op_type,inputs,outputs,err,match", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_one_error_naming_the_op(device, cid, op_type, inputs, outputs, err, match):
    """The kernel's own checks (run_op would also run the shape function, statically, on the same inputs)."""
    ws = Workspace(gpu=GPU_MODE[device])
    names = [f"in{i}" for i in range(len(inputs))]
    do = DeviceOption(device_type=1) if device != "cpu" else None
    for name, value in zip(names, inputs):
        ws.feed(name, value, device_option=do)
    with pytest.raises(err, match=match) as got:
        ws.run_operator_once(make_op(op_type, names, [f"out{i}" for i in range(outputs)], device=device))
    text = str(got.value)
    assert "\n" not in text and op_type in text


# (a shape function is not told the outputs, and the codes' values are known statically only for small tensors)
STATIC = [b for b in BAD if b[0] not in ("too-few-outputs", "code-too-big-long")]


@pytest.mark.parametrize("cid,op_type,inputs,outputs,err,match", STATIC, ids=[b[0] for b in STATIC])
def test_bad_input_found_statically(cid, op_type, inputs, outputs, err, match):
    with pytest.raises(err, match=match):
        infer_static(op_type, inputs, outputs)


def test_in_place_refused_as_in_caffe2():
    with pytest.raises(ArgumentError, match="in place"):
        run_op("QuantDecode", {"cb": CB, "c": np.array([0], np.uint8)}, ["c"])


def test_output_over_the_blob_limit_is_refused_before_the_kernel_allocates():
    ws = Workspace(limits=Limits(max_blob_bytes=1 << 20))
    ws.feed("cb", np.zeros(4, np.float64))
    ws.feed("codes", np.zeros(300_000, np.uint8))            # 300 kB of codes decode to 2.4 MB of float64
    with allocates_under(1 << 20), pytest.raises(ResourceError, match="QuantDecode"):
        ws.run_operator_once(make_op("QuantDecode", ["cb", "codes"], ["out"]))
    ws.feed("codes", np.zeros(100_000, np.uint8))
    ws.run_operator_once(make_op("QuantDecode", ["cb", "codes"], ["out"]))
    assert ws.fetch("out").shape == (100_000,)


def test_a_net_run_many_times_decodes_each_run_and_refuses_bad_codes():
    """Later runs of one input signature run compiled (buffers for the outputs): new codes decode afresh, and a code
    out of range is still refused with the op's message."""
    ws = Workspace(compile_steps=True)
    codebook = rng.standard_normal(8).astype(np.float32)
    ws.feed("cb", codebook)
    net = None
    for _ in range(4):
        a, b = codes_of(np.uint8, (100,), 8), codes_of(np.int32, (3, 30), 8)
        ws.feed("a", a)
        ws.feed("b", b)
        net = net or ws.create_net(NetDef(name="decode", op=[make_op("QuantDecode", ["cb", "a", "b"], ["da", "db"]),
                                                             make_op("Relu", ["da"], ["ra"])]))
        net.run()
        np.testing.assert_array_equal(ws.fetch("ra"), np.maximum(decode_ref(codebook, a), 0))
        np.testing.assert_array_equal(ws.fetch("db"), decode_ref(codebook, b))
    b[2, 29] = 8
    ws.feed("b", b)
    with pytest.raises(ShapeError, match=r"QuantDecode: codes_1\[89\] = 8 is out of bounds"):
        net.run()


# --------------------------------------------------------------------------------------------- the tester
def test_checks_catch_broken_kernels(broken):
    def shifted(ctx, xp, codebook, *codes):          # off by one where the codes allow it
        flat = codebook.reshape(-1)
        return tuple(xp.take(flat, xp.minimum(c.astype(np.int64) + 1, flat.size - 1)) for c in codes)

    def unchecked(ctx, xp, codebook, *codes):        # clips out-of-range codes instead of refusing them
        return tuple(xp.take(codebook.reshape(-1), c, mode="clip") for c in codes)

    def assigned(xp, codebook, *rest):               # the last write wins: repeated codes are not summed
        n = len(rest) // 2
        out = xp.zeros(codebook.size, codebook.dtype)
        for c, g in zip(rest[:n], rest[n:]):
            out[c.reshape(-1).astype(np.int64)] = g.reshape(-1)
        return out.reshape(codebook.shape)

    def first_only(xp, codebook, *rest):             # drops every code tensor but the first
        out = xp.zeros(codebook.size, np.float64)
        np.add.at(out, rest[0].reshape(-1).astype(np.int64), rest[len(rest) // 2].reshape(-1))
        return out.astype(codebook.dtype).reshape(codebook.shape)

    broken("QuantDecode", shifted)
    with pytest.raises(AssertionError):
        test_decode_matches_the_definition("cpu", np.uint8, (5,), [(7,)])
    broken("QuantDecode", unchecked)
    with pytest.raises(pytest.fail.Exception):
        test_bad_input_is_one_error_naming_the_op("cpu", *BAD[1])
    broken("QuantDecodeGradient", assigned)
    with pytest.raises(AssertionError):
        test_gradient_against_finite_differences(1)
    broken("QuantDecodeGradient", first_only)
    with pytest.raises(AssertionError):
        test_gradient_against_finite_differences(2)
    with pytest.raises(AssertionError):
        test_gradient_op_matches_the_definition("cpu")
